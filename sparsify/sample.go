package sparsify

import (
	"math"
	"math/bits"
	"math/rand/v2"
)

// Sampling-based selection: DGC's double sampling (reference notes 7.4) and
// DRAGONN's sampled threshold with hashed insertion (reference notes 6.2),
// with the MurmurHash3 they need and the seeded randomness both draw from.

// murmur3Fmix32 is MurmurHash3's finalisation mix.
func murmur3Fmix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// murmur3Index is murmur3Sum32 of the 4-byte little-endian encoding of i:
// the hash DRAGONN applies to an element index.
func murmur3Index(i, seed uint32) uint32 {
	k := i * 0xcc9e2d51
	k = bits.RotateLeft32(k, 15)
	k *= 0x1b873593
	h := seed ^ k
	h = bits.RotateLeft32(h, 13)
	h = h*5 + 0xe6546b64
	return murmur3Fmix32(h ^ 4)
}

// sampRNG is the random stream of one rank's sampling of one tensor at one
// iteration: a PCG generator keyed by the job's seed and a SplitMix64 mix of
// (rank, iteration, tensor). It depends on nothing else, so a run repeats
// exactly for a seed and a resumed run draws what the uninterrupted one would
// have drawn.
func sampRNG(seed uint64, rank, iter, tensor int) *rand.Rand {
	s := sampMix(sampMix(sampMix(uint64(rank))^uint64(iter)) ^ uint64(tensor))
	return rand.New(rand.NewPCG(seed, s))
}

// sampMix is SplitMix64's output function.
func sampMix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// DGC's constants (synxlin/deep-gradient-compression defaults).
const (
	dgcSampleRatio = 0.01 // fraction of a tensor sampled
	dgcUpper       = 1.3  // more than upper·nsel candidates: exact top-nsel among them
	dgcLower       = 0.8  // fewer than lower·nsel: threshold ×= lower and retry
	dgcMaxAdapt    = 10   // adaptation rounds
)

// dgcParams are DGC's per-tensor sampling constants, fixed by the tensor's
// size and the compression ratio.
type dgcParams struct {
	numel      int
	nsel       int // ⌈numel·ratio⌉ indices to send
	numSamples int // strided samples per call
	topSamples int // ⌈numSamples·ratio⌉: the threshold is the smallest of the top samples
	stride     int // sample stride; 1 when the whole tensor is "sampled"
}

// dgcParamsFor computes the constants as the reference's initialisation
// does: pct = ⌈0.01·numel⌉, cpr = ⌈2/ratio⌉; tensors of at most cpr elements
// are sampled whole; otherwise stride = ⌈numel/max(pct,cpr)/32⌉·32 + 1,
// lowered by 8 until numel/stride samples reach max(pct, cpr).
func dgcParamsFor(numel int, ratio float64) dgcParams {
	p := dgcParams{numel: numel, nsel: int(math.Ceil(float64(numel) * ratio))}
	p.nsel = max(1, min(p.nsel, numel))
	pct := int(math.Ceil(float64(numel) * dgcSampleRatio))
	cpr := int(math.Ceil(2 / ratio))
	if numel <= cpr {
		p.stride, p.numSamples = 1, numel
	} else {
		want := max(pct, cpr)
		p.stride = int(math.Ceil(float64(numel)/float64(want)/32))*32 + 1
		p.numSamples = numel / p.stride
		for p.numSamples < want && p.stride > 1 {
			p.stride = max(1, p.stride-8)
			p.numSamples = numel / p.stride
		}
	}
	p.topSamples = max(1, min(p.numSamples, int(math.Ceil(float64(p.numSamples)*ratio))))
	return p
}

// DRAGONN's constants (zhuangwang93/dragonn, compressor atopk).
const (
	dragonnSmallTensor = 131072 // tensors this small use ratio 0.01
	dragonnSmallRatio  = 0.01
	dragonnSampleRatio = 0.01
	dragonnSeedBase    = 43     // hash seed = 43 + call counter
	dragonnSeedWrap    = 100000 // the call counter wraps to 0 here
	dragonnSlotsPerSel = 4      // hash slots per index to select
)

// dragonnParams are DRAGONN's per-tensor constants.
type dragonnParams struct {
	numel  int
	ratio  float64 // compression ratio after the small-tensor rule
	ns     int     // samples (with replacement)
	nsel   int     // target selections
	ks     int     // the threshold is the ks-th largest sampled magnitude
	nslots int     // hash table size, 4·nsel
}

// dragonnParamsFor computes the constants: ratio = 0.01 for tensors of at
// most 131072 elements, ns = ⌊0.01·numel⌋, nsel = ⌊numel·ratio⌋, ks =
// ⌈ns·ratio⌉, 4·nsel slots. Guards the reference lacks: ns and nsel are
// raised to at least 1 (the reference takes a top-k of an empty sample or
// divides by zero slots there).
func dragonnParamsFor(numel int, ratio float64) dragonnParams {
	if numel <= dragonnSmallTensor {
		ratio = dragonnSmallRatio
	}
	p := dragonnParams{numel: numel, ratio: ratio}
	p.ns = max(1, int(float64(numel)*dragonnSampleRatio))
	p.nsel = max(1, int(float64(numel)*ratio))
	p.ks = max(1, min(p.ns, int(math.Ceil(float64(p.ns)*ratio))))
	p.nslots = dragonnSlotsPerSel * p.nsel
	return p
}
