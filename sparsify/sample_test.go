package sparsify

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
)

// sampRefMurmur is a plain MurmurHash3 x86_32 written from the algorithm's
// description, byte by byte, as an independent reference.
func sampRefMurmur(data []byte, seed uint32) uint32 {
	rotl := func(x uint32, r uint) uint32 { return x<<r | x>>(32-r) }
	mix := func(k uint32) uint32 {
		k *= 0xcc9e2d51
		k = rotl(k, 15)
		return k * 0x1b873593
	}
	h := seed
	nblocks := len(data) / 4
	for b := 0; b < nblocks; b++ {
		k := uint32(data[4*b]) | uint32(data[4*b+1])<<8 | uint32(data[4*b+2])<<16 | uint32(data[4*b+3])<<24
		h ^= mix(k)
		h = rotl(h, 13)
		h = h*5 + 0xe6546b64
	}
	tail := data[4*nblocks:]
	if len(tail) > 0 {
		var k uint32
		for i := len(tail) - 1; i >= 0; i-- {
			k = k<<8 | uint32(tail[i])
		}
		h ^= mix(k)
	}
	h ^= uint32(len(data))
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

func TestMurmur3Vectors(t *testing.T) {
	// Published MurmurHash3 x86_32 test vectors.
	cases := []struct {
		data string
		seed uint32
		want uint32
	}{
		{"", 0, 0},
		{"", 1, 0x514E28B7},
		{"", 0xffffffff, 0x81F16F39},
		{"\x00\x00\x00\x00", 0, 0x2362F9DE},
		{"\xff\xff\xff\xff", 0, 0x76293B50},
		{"\x21\x43\x65\x87", 0, 0xF55B516B},
		{"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE},
		{"\x21\x43\x65", 0, 0x7E4A8634},
		{"\x21\x43", 0, 0xA0F7B07A},
		{"\x21", 0, 0x72661CF4},
		{"aaaa", 0x9747b28c, 0x5A97808A},
		{"Hello, world!", 0x9747b28c, 0x24884CBA},
		{"The quick brown fox jumps over the lazy dog", 0x9747b28c, 0x2FA826CD},
	}
	for _, c := range cases {
		if got := sampRefMurmur([]byte(c.data), c.seed); got != c.want {
			t.Errorf("test reference murmur(%q, %#x) = %#08x, want %#08x", c.data, c.seed, got, c.want)
		}
	}
}

// TestMurmur3MatchesReference checks DRAGONN's index hash against the
// byte-wise reference (itself checked against the published vectors): the
// hash of the 4-byte little-endian index.
func TestMurmur3MatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	indices := []uint32{0, 1, 2, 255, 256, 1 << 24, 1<<31 - 1, 0xdeadbeef}
	for range 2000 {
		indices = append(indices, r.Uint32())
	}
	for _, i := range indices {
		for _, seed := range []uint32{0, 43, 44, 43 + 99999, r.Uint32()} {
			b := []byte{byte(i), byte(i >> 8), byte(i >> 16), byte(i >> 24)}
			if got, want := murmur3Index(i, seed), sampRefMurmur(b, seed); got != want {
				t.Fatalf("murmur3Index(%d, %d) = %#x, want %#x", i, seed, got, want)
			}
		}
	}
}

// FuzzMurmur3 compares the index hash with the byte-wise reference on any
// index and seed.
func FuzzMurmur3(f *testing.F) {
	f.Add(uint32(0x9747b28c), uint32(0x9747b28c))
	f.Add(uint32(0), uint32(1))
	f.Fuzz(func(t *testing.T, i, seed uint32) {
		b := []byte{byte(i), byte(i >> 8), byte(i >> 16), byte(i >> 24)}
		if got, want := murmur3Index(i, seed), sampRefMurmur(b, seed); got != want {
			t.Fatalf("murmur3Index(%d, %#x) = %#x, want %#x", i, seed, got, want)
		}
	})
}

// sampRefKth is the k-th largest magnitude by sorting.
func sampRefKth(v []float32, k int) float32 {
	m := make([]float64, len(v))
	for i, x := range v {
		m[i] = math.Abs(float64(x))
	}
	sort.Sort(sort.Reverse(sort.Float64Slice(m)))
	return float32(m[k-1])
}

// sampRefAbove is the ascending list of i with |x_i| >= thr.
func sampRefAbove(x []float32, thr float32) []int32 {
	var out []int32
	for i, v := range x {
		if float32(math.Abs(float64(v))) >= thr {
			out = append(out, int32(i))
		}
	}
	return out
}

// dgcRefParams recomputes DGC's constants the way the reference's
// initialisation reads.
func dgcRefParams(numel int, ratio float64) (nsel, numSamples, topSamples, stride int) {
	pct := int(math.Ceil(float64(numel) * 0.01))
	cpr := int(math.Ceil(2 / ratio))
	if numel <= cpr {
		stride, numSamples = 1, numel
	} else {
		stride = int(math.Ceil(float64(numel)/float64(max(pct, cpr))/32))*32 + 1
		numSamples = numel / stride
		for numSamples < max(pct, cpr) {
			stride -= 8
			numSamples = numel / stride
		}
	}
	topSamples = int(math.Ceil(float64(numSamples) * ratio))
	nsel = int(math.Ceil(float64(numel) * ratio))
	return
}

// dgcRefSelect is DGC's double sampling written plainly: sort-based
// thresholds and top-k, linear scans.
func dgcRefSelect(x []float32, ratio float64, start int) ([]int32, float32) {
	numel := len(x)
	nsel, numSamples, topSamples, stride := dgcRefParams(numel, ratio)
	var samples []float32
	for j := range numSamples {
		samples = append(samples, x[start+j*stride])
	}
	thr := sampRefKth(samples, topSamples)
	idx := sampRefAbove(x, thr)
	if numel > numSamples {
		for range 10 {
			if len(idx) > nsel {
				if float64(len(idx)) > 1.3*float64(nsel) {
					vals := make([]float32, len(idx))
					for i, j := range idx {
						vals[i] = x[j]
					}
					pick := selRefTopK(vals, nsel)
					sel := make([]int32, len(pick))
					for i, q := range pick {
						sel[i] = idx[q]
					}
					idx = sel
				}
				break
			}
			if float64(len(idx)) >= 0.8*float64(nsel) {
				break
			}
			thr *= 0.8
			idx = sampRefAbove(x, thr)
		}
	}
	if len(idx) > nsel {
		idx = idx[:nsel]
	}
	return idx, thr
}

func TestDGCParams(t *testing.T) {
	for _, numel := range []int{1, 2, 39, 40, 41, 100, 1000, 4097, 65536, 1 << 20, 2359296, 11173962} {
		for _, ratio := range []float64{1e-9, 0.001, 0.01, 0.05, 0.3, 1} {
			p := dgcParamsFor(numel, ratio)
			nsel, ns, top, stride := dgcRefParams(numel, ratio)
			nsel = max(1, min(nsel, numel))
			if p.nsel != nsel || p.numSamples != ns || p.topSamples != top || p.stride != stride {
				t.Errorf("dgcParamsFor(%d, %g) = %+v, want nsel %d samples %d top %d stride %d", numel, ratio, p, nsel, ns, top, stride)
			}
			if p.stride < 1 || p.numSamples < 1 || p.numSamples*p.stride > numel || p.topSamples < 1 || p.topSamples > p.numSamples {
				t.Errorf("dgcParamsFor(%d, %g) = %+v: samples out of range", numel, ratio, p)
			}
		}
	}
}

func TestDGCSelectMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	v := newVecs(Options{})
	var s dgcScratch
	for _, numel := range []int{1, 2, 3, 41, 97, 1000, 4099, 30011} {
		for _, ratio := range []float64{0.001, 0.01, 0.05, 0.3, 1} {
			for name, gen := range selGen {
				x := gen(r, numel)
				p := dgcParamsFor(numel, ratio)
				start := r.IntN(p.stride)
				cand := make([]int32, numel)
				ms, gthr, err := dgcSelect(&v, &s, device.Host(cand), device.Host(x), []dgcTensor{{0, numel, p, start}}, 0)
				if err != nil {
					t.Fatal(err)
				}
				got := cand[:ms[0]]
				want, wthr := dgcRefSelect(x, ratio, start)
				if !slices.Equal(got, want) || gthr != wthr {
					t.Fatalf("%s numel=%d ratio=%g start=%d: got %d indices thr %v, want %d thr %v (first diff %d)",
						name, numel, ratio, start, len(got), gthr, len(want), wthr, selFirstDiff(got, want))
				}
				if len(got) == 0 || len(got) > p.nsel {
					t.Fatalf("%s numel=%d ratio=%g: %d indices, want 1..%d", name, numel, ratio, len(got), p.nsel)
				}
			}
		}
	}
}

// TestDGCSelectTensorsAtOnce: the tensors of a vector selected at once
// (dgcSelect with several tensors, some left out, of 1 to 30011 elements,
// the reported one chosen at random) give each tensor's selection of the
// plain reference, shifted to the vector's indices, in order, and the
// reported tensor's threshold.
func TestDGCSelectTensorsAtOnce(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 7))
	v := newVecs(Options{})
	var s dgcScratch
	gens := []string{"normal", "ties", "zeros", "onebucket", "wide"}
	for range 40 {
		ratio := []float64{0.001, 0.01, 0.05, 0.3, 1}[r.IntN(5)]
		var x []float32
		var ts []dgcTensor
		var want []int32
		var wantN []int
		var thrs []float32
		for range 1 + r.IntN(6) {
			numel := []int{1, 2, 3, 41, 97, 1000, 4099, 30011}[r.IntN(8)]
			part := selGen[gens[r.IntN(len(gens))]](r, numel)
			lo := len(x)
			x = append(x, part...)
			if r.IntN(4) == 0 {
				continue // not selected
			}
			p := dgcParamsFor(numel, ratio)
			start := r.IntN(p.stride)
			ts = append(ts, dgcTensor{lo, lo + numel, p, start})
			sel, thr := dgcRefSelect(part, ratio, start)
			for _, i := range sel {
				want = append(want, i+int32(lo))
			}
			wantN = append(wantN, len(sel))
			thrs = append(thrs, thr)
		}
		rep := r.IntN(len(ts)+1) - 1
		idx := make([]int32, len(x))
		got, th, err := dgcSelect(&v, &s, device.Host(idx), device.Host(x), ts, rep)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, wantN) || !slices.Equal(idx[:len(want)], want) {
			t.Fatalf("%d tensors at ratio %g: counts %v, want %v (or the indices differ)", len(ts), ratio, got, wantN)
		}
		if (rep < 0 && th == th) || (rep >= 0 && math.Float32bits(th) != math.Float32bits(thrs[rep])) {
			t.Fatalf("%d tensors: threshold of %d is %v, want %v", len(ts), rep, th, thrs)
		}
	}
}

// dragonnRefSelect is DRAGONN's selection written plainly, with the fixes of
// dragonnSelect (slot value index+1, insertion in index order, exact
// zeros never candidates), from the sample indices drawn by rng exactly as
// the method draws them.
func dragonnRefSelect(x []float32, ratio float64, rng *rand.Rand, hashSeed uint32) ([]int32, float32) {
	numel := len(x)
	if numel <= 131072 {
		ratio = 0.01
	}
	ns := max(1, int(float64(numel)*0.01))
	nsel := max(1, int(float64(numel)*ratio))
	ks := int(math.Ceil(float64(ns) * ratio))
	samples := make([]float32, ns)
	for i := range samples {
		samples[i] = x[rng.IntN(numel)]
	}
	thr := sampRefKth(samples, max(1, ks))
	table := make([]int64, 4*nsel) // -1: empty
	for i := range table {
		table[i] = -1
	}
	for i, v := range x {
		if v != 0 && float32(math.Abs(float64(v))) >= thr {
			b := []byte{byte(i), byte(i >> 8), byte(i >> 16), byte(i >> 24)}
			table[sampRefMurmur(b, hashSeed)%uint32(len(table))] = int64(i)
		}
	}
	var out []int32
	for _, v := range table {
		if v >= 0 {
			out = append(out, int32(v))
		}
	}
	return out, thr
}

func TestDragonnSelectMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	v := newVecs(Options{})
	var s samples
	for _, numel := range []int{1, 2, 3, 99, 100, 101, 1000, 4099, 140000} {
		if testing.Short() && numel > 5000 {
			continue
		}
		for _, ratio := range []float64{0.001, 0.01, 0.3, 1} {
			for name, gen := range selGen {
				x := gen(r, numel)
				seed := uint32(43 + r.IntN(100000))
				p := dragonnParamsFor(numel, ratio)
				out := make([]int32, p.nslots)
				ms, gthr, err := dragonnSelect(&v, &s, device.Host(out), device.Host(x), device.Buffer{}, []dragonnTensor{{0, numel, p, rand.NewPCG(1, uint64(numel)), seed}}, 0)
				if err != nil {
					t.Fatal(err)
				}
				got := out[:ms[0]]
				want, wthr := dragonnRefSelect(x, ratio, rand.New(rand.NewPCG(1, uint64(numel))), seed)
				if !slices.Equal(got, want) || gthr != wthr {
					t.Fatalf("%s numel=%d ratio=%g: got %d indices thr %v, want %d thr %v (first diff %d)",
						name, numel, ratio, len(got), gthr, len(want), wthr, selFirstDiff(got, want))
				}
				if (len(got) == 0 && slices.ContainsFunc(x, func(v float32) bool { return v != 0 })) || len(got) > p.nslots {
					t.Fatalf("%s numel=%d: %d indices, want 1..%d", name, numel, len(got), p.nslots)
				}
			}
		}
	}
}

// TestDragonnSelectTensorsAtOnce: the tensors of a vector selected at
// once (dragonnSelect with several tensors, some left out, of 1 to 4099
// elements, the reported one chosen at random) give each tensor's
// selection of the plain reference, shifted to the vector's indices, in
// order, and the reported tensor's threshold.
func TestDragonnSelectTensorsAtOnce(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	v := newVecs(Options{})
	var s samples
	gens := []string{"normal", "ties", "zeros", "onebucket", "wide"}
	for range 40 {
		ratio := []float64{0.001, 0.01, 0.3, 1}[r.IntN(4)]
		var x []float32
		var ts []dragonnTensor
		var want []int32
		var wantN []int
		var thrs []float32
		slots := 0
		for q := range 1 + r.IntN(6) {
			numel := []int{1, 2, 3, 99, 100, 101, 1000, 4099}[r.IntN(8)]
			part := selGen[gens[r.IntN(len(gens))]](r, numel)
			lo := len(x)
			x = append(x, part...)
			if r.IntN(4) == 0 {
				continue // not selected
			}
			p := dragonnParamsFor(numel, ratio)
			seed := uint32(43 + r.IntN(100000))
			ts = append(ts, dragonnTensor{lo, lo + numel, p, rand.NewPCG(uint64(q), uint64(numel)), seed})
			sel, thr := dragonnRefSelect(part, ratio, rand.New(rand.NewPCG(uint64(q), uint64(numel))), seed)
			for _, i := range sel {
				want = append(want, i+int32(lo))
			}
			wantN = append(wantN, len(sel))
			thrs = append(thrs, thr)
			slots += p.nslots
		}
		rep := r.IntN(len(ts)+1) - 1
		idx := make([]int32, slots)
		got, th, err := dragonnSelect(&v, &s, device.Host(idx), device.Host(x), device.Buffer{}, ts, rep)
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) > 0 && (!slices.Equal(got, wantN) || !slices.Equal(idx[:len(want)], want)) {
			t.Fatalf("%d tensors at ratio %g: counts %v, want %v (or the indices differ)", len(ts), ratio, got, wantN)
		}
		if (rep < 0 && th == th) || (rep >= 0 && math.Float32bits(th) != math.Float32bits(thrs[rep])) {
			t.Fatalf("%d tensors: threshold of %d is %v, want %v", len(ts), rep, th, thrs)
		}
	}
}

// TestDragonnSelectsIndexZero checks the fix of the reference's bug: element
// 0 must be selectable (the reference reads slot value 0 as "empty"). With
// one element, the sample is that element, it is the only candidate, and
// nothing can collide with it.
func TestDragonnSelectsIndexZero(t *testing.T) {
	x := []float32{-5}
	p := dragonnParamsFor(len(x), 0.01)
	v := newVecs(Options{})
	out := make([]int32, p.nslots)
	m, thr, err := dragonnSelect(&v, &samples{}, device.Host(out), device.Host(x), device.Buffer{}, []dragonnTensor{{0, 1, p, rand.NewPCG(1, 1), 43}}, 0)
	if err != nil || out[0] != 0 || m[0] != 1 || thr != 5 {
		t.Fatalf("dragonnSelect([-5]) = %v of %v (thr %v, %v), want [0] (thr 5)", m, out, thr, err)
	}
}

// TestDragonnOnePassMatchesTwoPass: the one-pass selection (threshold test
// and hash insert fused, dragonnHash) selects exactly what the
// two-pass selection did before it — a threshold compaction of the
// candidates (SelectAbove), then their insertion in ascending order — for
// positive thresholds, on awkward sizes and slot counts, whatever the
// parallel chunks' timing (run it with -race and -count).
func TestDragonnOnePassMatchesTwoPass(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	v := newVecs(Options{})
	for _, numel := range []int{1, 2, 7, 1000, 4099, selParallelMin + 3, 300007} {
		if testing.Short() && numel > 100000 {
			continue
		}
		for name, gen := range selGen {
			x := gen(r, numel)
			for _, q := range []int{1, 2, 10, numel / 100, numel/2 + 1} {
				q = max(1, min(q, numel))
				thr := KthLargestAbs(x, q)
				if !(thr > 0) {
					continue // the two-pass selection took zeros; see TestDragonnNeverSelectsZeros
				}
				for _, slots := range []int{1, 3, 4 * q, 4*q + 1} {
					seed := uint32(43 + r.IntN(100000))
					// The two-pass selection, as dragonnSelect made it before.
					cand := SelectAbove(nil, x, thr)
					table := make([]uint32, slots)
					for _, i := range cand {
						table[murmur3Index(uint32(i), seed)%uint32(slots)] = uint32(i) + 1
					}
					var want []int32
					for _, v := range table {
						if v != 0 {
							want = append(want, int32(v-1))
						}
					}
					out, table32 := make([]int32, slots), make([]int32, slots)
					if err := v.ops.Run(v.s, dragonnHash, numel, device.Host(x), int64(numel), device.Host([]float32{thr}), int32(seed), device.Host(table32), int32(slots), int64(0)); err != nil {
						t.Fatal(err)
					}
					m, err := v.ops.CompactSlots(v.s, device.Host(out), device.Host(table32))
					if err != nil {
						t.Fatal(err)
					}
					if got := out[:m]; !slices.Equal(got, want) {
						t.Fatalf("%s numel=%d thr=%v slots=%d: one pass %d indices, two passes %d (first diff %d)", name, numel, thr, slots, len(got), len(want), selFirstDiff(got, want))
					}
				}
			}
		}
	}
}

// TestDragonnNeverSelectsZeros: an exact zero is never selected, also when
// the sampled threshold is 0 (a sparse gradient, e.g. an embedding's rows
// of the words not in the batch). Before the fix every zero was a
// candidate: an all-zero tensor sent about 4× its budget of zeros, and a
// tensor with 0.5 % non-zeros kept most of its squared mass in the residual
// (the zeros took the slots).
func TestDragonnNeverSelectsZeros(t *testing.T) {
	const numel = 300000 // above the default 204800 cut-off
	l, err := NewLayout([]string{"emb"}, []int{numel})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		nonZero int
	}{{"all zero", 0}, {"0.5 % non-zeros", numel / 200}} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(8, uint64(tc.nonZero)))
			const n = 2
			accs := make([][]float32, n)
			for w := range accs {
				accs[w] = make([]float32, numel)
				for _, i := range RandomK(nil, numel, tc.nonZero, uint64(w+1)) {
					accs[w][i] = float32(r.NormFloat64())
				}
			}
			stats := make([]Stats, n)
			ress := make([][]float32, n)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := local.Run(ctx, n, func(ctx context.Context, c comm.Communicator) error {
				w := c.Rank()
				red, err := New("dragonn", Options{Density: 0.01, Layout: l, Comm: c, Seed: 5, Params: Values{"dense_warmup": 0}})
				if err != nil {
					return err
				}
				acc := slices.Clone(accs[w])
				out := make([]float32, numel)
				stats[w], err = red.Reduce(ctx, acc, out, acc)
				ress[w] = acc
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			for w := range n {
				if !(stats[w].Threshold == 0) {
					t.Fatalf("test setup: rank %d's sampled threshold is %v, want 0", w, stats[w].Threshold)
				}
				if stats[w].Selected > tc.nonZero {
					t.Fatalf("rank %d sent %d elements of a tensor with %d non-zeros: zeros were selected", w, stats[w].Selected, tc.nonZero)
				}
				var all, kept float64
				for i, v := range accs[w] {
					all += float64(v) * float64(v)
					kept += float64(ress[w][i]) * float64(ress[w][i])
				}
				if tc.nonZero > 0 && kept > 0.25*all {
					t.Fatalf("rank %d kept %.0f %% of its squared mass in the residual; the non-zeros, fewer than the slots, should nearly all be sent", w, 100*kept/all)
				}
			}
		})
	}
}

// TestDragonnParamsGuards checks the guards against ns = 0 and nsel = 0.
func TestDragonnParamsGuards(t *testing.T) {
	for _, numel := range []int{1, 50, 99, 100, 131072, 131073, 204801} {
		for _, ratio := range []float64{1e-9, 0.001, 0.01, 0.5, 1} {
			p := dragonnParamsFor(numel, ratio)
			if p.ns < 1 || p.nsel < 1 || p.ks < 1 || p.ks > p.ns || p.nslots != 4*p.nsel {
				t.Errorf("dragonnParamsFor(%d, %g) = %+v", numel, ratio, p)
			}
			if numel <= 131072 && p.ratio != 0.01 {
				t.Errorf("dragonnParamsFor(%d, %g): ratio %g, want 0.01 for small tensors", numel, ratio, p.ratio)
			}
		}
	}
}

// sampRefCanonicalSum is the element-wise sum over ranks of vals (one slice
// per rank) in the communicator's documented canonical order: the buffer is
// cut into n chunks by comm.ChunkBounds and chunk j is summed left to right
// in rank order j+1, …, n−1, 0, …, j.
func sampRefCanonicalSum(vals [][]float32) []float32 {
	n := len(vals)
	L := len(vals[0])
	sum := make([]float32, L)
	for j := range n {
		q, rem := L/n, L%n
		lo := j*q + min(j, rem)
		hi := lo + q
		if j < rem {
			hi++
		}
		for i := lo; i < hi; i++ {
			s := vals[(j+1)%n][i]
			for d := 2; d <= n; d++ {
				s += vals[(j+d)%n][i]
			}
			sum[i] = s
		}
	}
	return sum
}

// sampRefSparseDecode is the decode of a sparse all-gather written plainly:
// for each rank in order, add its values at its indices, then multiply every
// touched element by 1/n. It returns out (zero elsewhere) and the number of
// distinct indices.
func sampRefSparseDecode(N int, accs [][]float32, sels [][]int32) ([]float32, int) {
	out := make([]float32, N)
	touched := map[int32]bool{}
	for w, sel := range sels {
		for _, j := range sel {
			out[j] += accs[w][j]
			touched[j] = true
		}
	}
	inv := 1 / float32(len(sels))
	for j := range touched {
		out[j] *= inv
	}
	return out, len(touched)
}

// sampRefExpect is what one worker's Reduce must return.
type sampRefExpect struct {
	out, residual []float32
	selected      int
	perWorker     []int
	layerK        []int
	density       float64
	threshold     float64 // NaN: must be NaN
	calls         []harnessCall
}

// sampCheck compares one worker's result at one iteration with e.
func sampCheck(t *testing.T, res *harnessResult, it, w int, e sampRefExpect) {
	t.Helper()
	what := fmt.Sprintf("%s n=%d N=%d it=%d rank %d", res.Cfg.Method, res.Cfg.Workers, res.Layout.N, it, w)
	checkClose(t, what+" out", res.Out[it][w], e.out, nil)
	checkClose(t, what+" residual", res.Residual[it][w], e.residual, nil)
	st := res.Stats[it][w]
	if st.Selected != e.selected {
		t.Fatalf("%s: Selected = %d, want %d", what, st.Selected, e.selected)
	}
	if !slices.Equal(st.SelectedPerWorker, e.perWorker) {
		t.Fatalf("%s: SelectedPerWorker = %v, want %v", what, st.SelectedPerWorker, e.perWorker)
	}
	if !slices.Equal(st.LayerK, e.layerK) {
		t.Fatalf("%s: LayerK = %v, want %v", what, st.LayerK, e.layerK)
	}
	if st.ActualDensity != e.density {
		t.Fatalf("%s: ActualDensity = %v, want %v", what, st.ActualDensity, e.density)
	}
	if st.Density != res.Cfg.Density {
		t.Fatalf("%s: Density = %v, want %v", what, st.Density, res.Cfg.Density)
	}
	if math.IsNaN(e.threshold) != math.IsNaN(st.Threshold) || (!math.IsNaN(e.threshold) && st.Threshold != e.threshold) {
		t.Fatalf("%s: Threshold = %v, want %v", what, st.Threshold, e.threshold)
	}
	var en float64
	for _, v := range e.residual {
		en += float64(v) * float64(v)
	}
	if d := math.Abs(st.ErrorNorm - math.Sqrt(en)); d > 1e-9*(1+math.Sqrt(en)) {
		t.Fatalf("%s: ErrorNorm = %v, want %v", what, st.ErrorNorm, math.Sqrt(en))
	}
	sent, recv := expectTraffic(res.Cfg.Workers, w, e.calls)
	if st.BytesSent != sent || st.BytesRecv != recv {
		t.Fatalf("%s: bytes sent/received %d/%d, want %d/%d", what, st.BytesSent, st.BytesRecv, sent, recv)
	}
	if st.SelectTime < 0 || st.CommTime < 0 {
		t.Fatalf("%s: negative times %v %v", what, st.SelectTime, st.CommTime)
	}
}

// sampExchangeCalls are the calls of base.sparseExchange.
func sampExchangeCalls(counts []int) []harnessCall {
	return []harnessCall{
		{Op: comm.OpAllGather, Elems: 1, ESize: 4},
		{Op: comm.OpAllGatherV, ESize: 4, Counts: counts},
		{Op: comm.OpAllGatherV, ESize: 4, Counts: counts},
	}
}

// sampSingleComm is a one-rank communicator for argument checks.
func sampSingleComm() comm.Communicator { return local.New(1).Comm(0) }

func TestSamplingReducersRejectBadArguments(t *testing.T) {
	for _, m := range []string{"dgc", "dragonn", "randomk"} {
		l, _ := FlatLayout(10)
		r, err := New(m, Options{Density: 0.3, Layout: l, Comm: sampSingleComm()})
		if err != nil {
			t.Fatalf("New(%s): %v", m, err)
		}
		acc := make([]float32, 10)
		if _, err := r.Reduce(context.Background(), acc, acc, make([]float32, 10)); err == nil {
			t.Errorf("%s: Reduce with out == acc did not fail", m)
		}
		if _, err := r.Reduce(context.Background(), acc, make([]float32, 9), acc); err == nil || !strings.Contains(err.Error(), "layout has 10") {
			t.Errorf("%s: Reduce with a short out: error %v, want one naming the layout's length", m, err)
		}
	}
}

// TestSamplingReducersRejectHugeLayouts checks the int32 index limit: a
// layout of 2^31 elements is refused with an error naming the limit (the
// layout is only described, never allocated).
func TestSamplingReducersRejectHugeLayouts(t *testing.T) {
	l := Layout{Tensors: []Tensor{{Name: "huge", Size: 1 << 31}}, N: 1 << 31}
	for _, m := range []string{"dgc", "dragonn", "randomk"} {
		_, err := New(m, Options{Density: 0.01, Layout: l, Comm: sampSingleComm()})
		if err == nil || !strings.Contains(err.Error(), "int32") {
			t.Errorf("%s: New with 2^31 elements: error %v, want one naming the int32 limit", m, err)
		}
	}
}
