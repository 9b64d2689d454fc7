package sparsify

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/options"
)

func init() {
	Register(Method{Name: "dragonn", Projectable: true, New: newDragonnReducer, Advice: dragonnAdvice, CorrectsMomentum: true,
		Density: func(ModelKind) float64 { return 0.001 }, Notes: dragonnNotes, Kernels: []*device.Kernel{dragonnHash, dragonnDraw},
		Doc: "reference notes 6: DRAGONN's sampled threshold with the threshold test and the hashed insertion fused into one pass (its kernel dragonnHash; no compaction of the candidates), small tensors dense, dense warm-up (its own: during it every tensor is one of the dense ones). Deviations (fixes): values are summed and divided by the number of workers (the reference overwrites and does not divide); error feedback is always on; element 0 can be selected; exact zeros never are (a zero sampled threshold flooded the slots with zeros); hash collisions resolve deterministically (highest index wins); ns and nsel are at least 1. The momentum-corrected error feedback the paper evaluated every method with (DGC's, with momentum-factor masking; Options.Momentum, the optimizer's, which then applies momentum to weight decay only). Not implemented: the paper's cost model (its eq. 1) for which tensors to compress (a fixed min_tensor cut-off, the reference's).",
		Params: []options.Option{
			{Key: "min_tensor", Kind: options.Int, Default: dragonnDefaultMinTensor, Range: options.Within(0, math.MaxInt32, "[]"), Zero: "every tensor",
				Doc: "compress only tensors with more elements"},
			DenseWarmupParam(dragonnDefaultWarmup),
		}})
}

// Defaults of DRAGONN's options (reference notes 6.1: the README's
// --threshold 204800 and --compress-iter 200).
const (
	dragonnDefaultMinTensor = 204800
	dragonnDefaultWarmup    = 200
)

// dragonnReducer is "dragonn", DRAGONN's hashed sparsifier (Wang et al.,
// ICML'22, zhuangwang93/dragonn compressor atopk with --batching; reference
// notes 6):
//
//   - Efficiency-aware tensor selection: a layout tensor is compressed iff it
//     has more than min_tensor elements (option min_tensor, default 204800;
//     0: every tensor) and the call is at least the dense_warmup-th (option
//     dense_warmup, default 200; 0: from the first call). All other tensors are averaged densely:
//     one AllReduce of their concatenation, divided by n.
//   - Per compressed tensor (dragonnSelect, all of them at once): ratio = ρ, forced to 0.01 for
//     tensors of at most 131072 elements; ns = ⌊0.01·numel⌋ samples drawn
//     uniformly with replacement (from Options.Seed, the rank, the iteration
//     and the tensor: identical across runs for a seed); threshold = the
//     ⌈ns·ratio⌉-th largest sampled magnitude; then one pass over the tensor
//     (the paper's mechanism: the threshold test and the hash insert fused,
//     no compaction of the candidates, dragonnHash) hashes every
//     element with |x| >= thr, not an exact zero, into 4·nsel slots (nsel =
//     ⌊numel·ratio⌋) with MurmurHash3 x86_32 of its 4-byte index, seed 43 +
//     c, where c counts the compress calls (per tensor per iteration, on
//     every rank alike) and wraps to 0 at 100000; a slot keeps the highest
//     index written; the occupied slots are the selection (ns and nsel are
//     raised to at least 1).
//   - Communication (one exchange per call, as with --batching): AllGather of
//     one int32 count per worker, AllGatherV of the int32 flat indices and of
//     the float32 values.
//
// Deliberate deviations from the reference, each a fix:
//
//   - Decode: the reference scatters all workers' pairs with overwrite and
//     does not divide by the number of workers (while it averages the dense
//     tensors), so a duplicated index keeps one arbitrary worker's value and
//     the sparse part is scaled by n relative to the dense part. Here the
//     workers' values are summed (in rank order, bit-identical on every rank)
//     and divided by n, like every other method of the package.
//   - Error feedback: the reference's examples run with --memory none; this
//     project always uses error feedback, so residual = acc minus this
//     worker's own sent values (0 at the sent indices and in dense tensors,
//     acc elsewhere) — the reference's "residual" memory.
//   - Element 0 of a tensor can be selected (the reference's table uses 0 for
//     "empty"), and collisions are resolved deterministically: the highest
//     index wins a slot (an atomic maximum), as inserting the candidates in
//     ascending order would.
//   - Exact zeros are never selected. The reference selects |x| >= thr; when
//     the sampled threshold is 0 (a sparse gradient: the LSTM's embedding,
//     NCF's on ml-20m, where most sampled elements are 0) every zero is a
//     candidate, an all-zero tensor sends 4·nsel zeros and the zeros crowd
//     the non-zeros out of the slots.
//
// What the project does not have of the paper:
//
//   - Its cost model (eq. 1: compress a tensor of d elements only when the
//     compression time is below the communication time saved, T_comp(d) <
//     T_full(d) − T_spr(d), with ring all-reduce and all-gather costs from
//     the workers, the bandwidth and the latency). As the reference code
//     does, the choice is the fixed min_tensor cut-off, whose default
//     204800 was tuned for 16 V100s on 25 Gbit/s; on another cluster (or on
//     this project's models, see the trainer's notes) it may compress too
//     much or nothing.
//
// Momentum-corrected error feedback (momentumCorrection, DGC's, with which
// the paper evaluated every method): with Options.Momentum m > 0 (the
// trainer passes its SGD momentum, Method.CorrectsMomentum) the compressed
// tensors' selection is made on each worker's velocity and the residual is
// v + m·u, the dense tensors (all of them during the dense warm-up) get the
// momentum on their average, and at the warm-up's end the momentum so far
// starts every worker's u. The error norm is ‖v‖. With m = 0 (Adam) it is
// plain error feedback.
//
// Without momentum and with the sum decode it conserves the gradient: Σ_w residual_w + n·out =
// Σ_w acc_w up to float32 rounding (the overwrite decode would not). Stats:
// Selected and SelectedPerWorker count the elements each worker sent (sparse
// pairs plus dense elements), LayerK the elements sent per tensor,
// ActualDensity = (distinct sparse indices + dense elements) / N (1 during
// warm-up), Threshold = the threshold of the largest compressed tensor (NaN
// when none was compressed).
type dragonnReducer struct {
	base      *Env
	minTensor int
	warmup    int
	params    []dragonnParams
	calls     int // compress calls so far, modulo 100000

	samp  samples
	dIdx  device.Buffer // Int32
	dVal  device.Buffer // Float32
	dense denseParts
	// mc is the momentum-corrected error feedback (momentumCorrection).
	mc momentumCorrection
}

func newDragonnReducer(e *Env) (Core, error) {
	o := e.o
	if !(o.Momentum >= 0 && o.Momentum < 1) {
		return nil, fmt.Errorf("Options.Momentum %v is outside [0, 1)", o.Momentum)
	}
	r := &dragonnReducer{base: e, minTensor: o.Params.Int("min_tensor"), warmup: o.Params.Int("dense_warmup"), mc: momentumCorrection{m: float32(o.Momentum)}}
	for _, tn := range o.Layout.Tensors {
		r.params = append(r.params, dragonnParamsFor(tn.Size, o.Density))
	}
	return r, nil
}

// compressed reports whether a tensor of size elements is compressed at the
// current call.
func (r *dragonnReducer) compressed(size int) bool {
	return r.base.calls >= r.warmup && size > r.minTensor
}

// Reduce compresses the large tensors after warm-up, all-gathers their
// pairs and all-reduces the rest. The compressed tensors are selected at
// once (dragonnSelect): the sample positions drawn and the thresholds kept
// on the device, the tables' counts read back in one wait with the
// largest tensor's threshold and the draws' flag.
func (r *dragonnReducer) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.base
	v := &b.v
	rank := b.c.Rank()
	tensors := b.o.Layout.Tensors
	layerK := make([]int, len(tensors))
	thr := math.NaN()
	largest := -1
	denseN, pos := 0, 0
	comp := make([]bool, len(tensors))
	total := 0
	for t, tn := range tensors {
		comp[t] = r.compressed(tn.Size)
		if comp[t] {
			total += r.params[t].nslots
		} else {
			denseN += tn.Size
		}
	}
	if err := r.mc.ensure(b); err != nil {
		return err
	}
	if r.warmup > 0 && b.calls == r.warmup {
		// The first call after the dense warm-up: the compressed tensors'
		// momentum so far becomes every worker's.
		if err := r.mc.becomeCompressed(b, acc, comp); err != nil {
			return err
		}
	}
	if err := b.reserveLists(total); err != nil {
		return err
	}
	selTime, err := b.selectTimed(func() error {
		idx, err := v.scratch(&r.dIdx, device.Int32, total)
		if err != nil {
			return err
		}
		if _, err := v.scratch(&r.dVal, device.Float32, total); err != nil {
			return err
		}
		// The draws on the device flag a rejected draw in one word, read
		// with the tables' counts (dragonnSelect); where one was
		// (probability below numel/2^64 a draw), the call selects again
		// with the draws on the host.
		var flag device.Buffer
		if !v.onCPU() && slices.Contains(comp, true) {
			if flag, err = v.scratch(&r.samp.dFlag, device.Int32, 1); err != nil {
				return err
			}
			if err := v.m.Fill(v.s, flag.View(device.Float32, 0, 1), 0); err != nil {
				return err
			}
		}
		calls := r.calls
		for {
			r.calls, pos, largest, thr = calls, 0, -1, math.NaN()
			var ts []dragonnTensor
			var of []int // the layout's tensor of each of ts
			want := -1
			for t, tn := range tensors {
				if !comp[t] {
					layerK[t] = tn.Size
					continue
				}
				seed := uint32(dragonnSeedBase + r.calls)
				r.calls = (r.calls + 1) % dragonnSeedWrap
				if largest < 0 || tn.Size > tensors[largest].Size {
					largest, want = t, len(ts)
				}
				ts = append(ts, dragonnTensor{lo: tn.Offset, hi: tn.Offset + tn.Size, p: r.params[t], src: sampPCG(b.o.Seed, rank, b.calls, t), seed: seed})
				of = append(of, t)
			}
			counts, th, err := dragonnSelect(v, &r.samp, idx, acc, flag, ts, want)
			if err != nil {
				return err
			}
			if want >= 0 {
				thr = float64(th)
			}
			for j, t := range of {
				layerK[t] = counts[j]
				pos += counts[j]
			}
			if flag.Len() == 0 || r.samp.flag[0] == 0 {
				break
			}
			flag = device.Buffer{} // on the host
		}
		val, err := v.scratch(&r.dVal, device.Float32, pos)
		if err != nil {
			return err
		}
		return v.ops.Gather(v.s, val, acc, idx.Slice(0, pos))
	})
	if err != nil {
		return err
	}
	// The uncompressed tensors, concatenated and all-reduced.
	if _, err := r.dense.reduce(ctx, b, acc, comp); err != nil {
		return err
	}
	idx, val := r.dIdx.Slice(0, pos), r.dVal.Slice(0, pos)
	counts, distinct, err := b.sparseExchangeIfAny(ctx, denseN < b.n, idx, val, out) // some tensor is compressed (the same on every rank)
	if err != nil {
		return err
	}
	if r.mc.m > 0 {
		if err := r.mc.compressed(b, comp, acc, residual, idx); err != nil {
			return err
		}
	} else if err := b.residualWithout(residual, acc, idx); err != nil {
		return err
	}
	if err := r.dense.write(b, out, residual, comp); err != nil {
		return err
	}
	if r.mc.m > 0 {
		if err := r.mc.dense(b, comp, out); err != nil {
			return err
		}
		if st.ResidualSq, err = r.mc.residualSq(b, comp); err != nil {
			return err
		}
	}
	for w := range counts {
		counts[w] += denseN
	}
	st.SelectTime = selTime
	st.Selected = pos + denseN
	st.SelectedPerWorker = counts
	st.LayerK = layerK
	st.Distinct = distinct + denseN
	st.Threshold = thr
	return nil
}

// SaveState writes the call count (dense warm-up, sampling seeds), the
// hash counter and, with momentum correction, the velocity.
func (r *dragonnReducer) SaveState(w *StateWriter) error {
	w.Int(r.base.calls)
	w.Int(r.calls)
	return r.mc.save(r.base, w)
}

// LoadState reads them back.
func (r *dragonnReducer) LoadState(d *StateReader) error {
	it := d.Int("call count", 0, maxCount)
	calls := d.Int("hash counter", 0, dragonnSeedWrap-1)
	has, vel := r.mc.read(r.base, d)
	if err := d.Done(); err != nil {
		return err
	}
	if err := r.mc.load(r.base, has, vel, it); err != nil {
		return err
	}
	r.base.calls, r.calls = it, calls
	return nil
}

// samples is the scratch of a sampled selection: the positions drawn on
// the host, and the positions and values on the device (and DRAGONN's hash
// table and the flag of its draws on the device).
type samples struct {
	pos    []int32
	dPos   device.Buffer // Int32
	dVal   device.Buffer // Float32
	dTable device.Buffer // Int32
	dFlag  device.Buffer // Int32
	dThr   device.Buffer // Float32: the thresholds
	flag   [1]int32
	th     [1]float32 // the reported threshold, read with the counts
}

// sampPCG is the source of sampRNG's generator: its samples are
// rand.New(sampPCG(…))'s.
func sampPCG(seed uint64, rank, iter, tensor int) *rand.PCG {
	return rand.NewPCG(seed, sampMix(sampMix(sampMix(uint64(rank))^uint64(iter))^uint64(tensor)))
}

// dragonnSamples draws p.ns positions uniformly from [0, p.numel), as
// rand.New(src).IntN draws them in turn, into pos (a device's Int32
// vector): on the host where flag is empty (and on the CPU); otherwise on
// the device by dragonnDraw, each draw computed from src's state where it
// is (nothing uploaded), a draw that IntN would reject (and draw again,
// shifting every later draw) setting the Int32 word flag to 1. With read,
// flag is copied to sc.flag, which holds it once the stream has reached
// this point (after the caller's next wait).
func dragonnSamples(v *vecs, sc *samples, pos, flag device.Buffer, read bool, p dragonnParams, src *rand.PCG) error {
	if flag.Len() == 0 || v.onCPU() {
		rng := rand.New(src)
		sc.pos = sc.pos[:0]
		for range p.ns {
			sc.pos = append(sc.pos, int32(rng.IntN(p.numel)))
		}
		return v.upload(pos, sc.pos)
	}
	hi, lo := pcgState(src)
	if err := v.ops.Run(v.s, dragonnDraw, p.ns, pos, int64(p.ns), int64(hi), int64(lo), int64(p.numel), flag); err != nil {
		return err
	}
	if !read {
		return nil
	}
	sc.flag[0] = 0
	return v.s.Copy(device.Host(sc.flag[:]), flag)
}

// pcgState returns the state (high and low words) of a PCG.
func pcgState(src *rand.PCG) (hi, lo uint64) {
	b, _ := src.MarshalBinary() // "pcg:", hi, lo big-endian
	b = b[len(b)-16:]
	return binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])
}

//go:embed dragonn_samples.cu
var dragonnSamplesCUDA string

// dragonnDraw is dragonnSamples' draw on a device (dragonn_samples.cu's
// k_dragonn_samples; arguments pos, ns, hi, lo and numel as int64, flag):
// pos[j] is the IntN(numel) that the (j+1)-th output of the PCG from state
// (hi, lo) gives when IntN keeps it; flag[0] is set to 1 where IntN would
// reject it (and draw again).
var dragonnDraw = &device.Kernel{Name: "k_dragonn_samples", CUDA: dragonnSamplesCUDA, Host: func(n int, a ...any) {
	pos, flag := a[0].(device.Buffer).Int32s(), a[5].(device.Buffer).Int32s()
	src := rand.NewPCG(uint64(a[2].(int64)), uint64(a[3].(int64)))
	numel := uint64(a[4].(int64))
	for j := range n {
		v, rejected := lemire(src.Uint64(), numel)
		pos[j] = int32(v)
		if rejected {
			flag[0] = 1
		}
	}
}}

// lemire is math/rand/v2's Rand.IntN(n) of one 64-bit output x: x masked
// for a power of two, otherwise the high word of x·n, rejected (IntN draws
// again) where the low word is below 2^64 mod n.
func lemire(x, n uint64) (uint64, bool) {
	if n&(n-1) == 0 {
		return x & (n - 1), false
	}
	hi, lo := bits.Mul64(x, n)
	return hi, lo < -n%n
}

// dragonnTensor is one tensor of a DRAGONN selection: its range [lo, hi)
// of the vector selected from, its constants, the source of its samples'
// positions and its hash seed.
type dragonnTensor struct {
	lo, hi int
	p      dragonnParams
	src    *rand.PCG
	seed   uint32
}

// dragonnSelect is DRAGONN's selection of every tensor ts[j] of x at once
// (the tensors in order, not overlapping): a tensor's threshold is the
// ks-th largest magnitude of ns samples of it drawn uniformly with
// replacement as rand.New(src).IntN draws them (dragonnSamples: on the
// device unless flag is empty; the last tensor's draws read flag); then
// one pass over the tensor (dragonnHash) compares every element with the
// threshold and hashes each selected index i (|x_i| >= thr, x_i not an
// exact zero) with MurmurHash3 x86_32 of its 4-byte index in the tensor
// and the tensor's seed into one of its nslots slots, a collision keeping
// the highest index. The occupied slots, tensor after tensor in slot
// order, are written into idx (at least Σ nslots long) as indices of x. It
// returns how many each tensor has and the threshold of tensor want (NaN
// when want < 0).
//
// This is the paper's mechanism: the threshold test and the hash insert
// are one pass, with no compaction of the candidates (the GPU kernel writes
// straight into the table; only the tables, 4·nsel slots each, are
// compacted). It selects exactly what a threshold compaction followed by
// the insertion of the candidates in ascending order selects. On a device
// the thresholds stay there (Ops.KthLargestAbsSegments, read by the hash
// kernel) and the tables are compacted at once (Ops.CompactSlotsSegments):
// one host wait for all tensors, which also brings back want's threshold
// and the flag.
//
// Deviations from the GPU kernel of the reference, each a fix: collisions
// resolve deterministically (the highest index wins; there an arbitrary
// thread wins); element 0 can be selected (the reference stores the index
// and reads 0 as "empty", so element 0 is never sent); and exact zeros are
// never selected — the reference tests |x_i| >= thr, so when the sampled
// threshold is 0 (a sparse gradient such as an embedding's: most samples
// are 0) every zero is a candidate and zeros crowd the non-zeros out of the
// slots.
func dragonnSelect(v *vecs, sc *samples, idx, x, flag device.Buffer, ts []dragonnTensor, want int) ([]int, float32, error) {
	if len(ts) == 0 {
		return nil, float32(math.NaN()), nil
	}
	if x.Len() > math.MaxInt32 {
		return nil, 0, fmt.Errorf("%d elements; indices are int32", x.Len())
	}
	ns, slots := 0, 0
	nss := make([]int, len(ts))
	ks := make([]int, len(ts))
	bounds := []int{0}
	for j, t := range ts {
		if t.p.nslots < 1 || t.p.nslots > math.MaxInt32 {
			return nil, 0, fmt.Errorf("tensor %d: %d slots", j, t.p.nslots)
		}
		nss[j], ks[j] = t.p.ns, t.p.ks
		ns += t.p.ns
		slots += t.p.nslots
		bounds = append(bounds, slots)
	}
	pos, err := v.scratch(&sc.dPos, device.Int32, ns)
	if err != nil {
		return nil, 0, err
	}
	tb, err := v.scratch(&sc.dTable, device.Int32, slots)
	if err != nil {
		return nil, 0, err
	}
	if err := v.m.Fill(v.s, tb.View(device.Float32, 0, slots), 0); err != nil {
		return nil, 0, err
	}
	// want's threshold is read with the counts: CompactSlotsSegments
	// waits (the tables are not empty).
	at := 0
	thr, err := sampleThresholds(v, &sc.dVal, &sc.dThr, nss, ks, want, sc.th[:], func(j int, dst device.Buffer) error {
		t := ts[j]
		p := pos.Slice(at, at+t.p.ns)
		at += t.p.ns
		if err := dragonnSamples(v, sc, p, flag, j == len(ts)-1, t.p, t.src); err != nil {
			return err
		}
		return v.ops.Gather(v.s, dst, x.Slice(t.lo, t.hi), p)
	})
	if err != nil {
		return nil, 0, err
	}
	for j, t := range ts {
		if t.hi == t.lo {
			continue
		}
		if err := v.ops.Run(v.s, dragonnHash, t.hi-t.lo, x.Slice(t.lo, t.hi), int64(t.hi-t.lo), thr.Slice(j, j+1), int32(t.seed),
			tb.Slice(bounds[j], bounds[j+1]), int32(t.p.nslots), int64(t.lo)); err != nil {
			return nil, 0, err
		}
	}
	counts, err := v.ops.CompactSlotsSegments(v.s, idx, tb, bounds)
	if err != nil {
		return nil, 0, err
	}
	th := float32(math.NaN())
	if want >= 0 {
		th = sc.th[0]
	}
	return counts, th, nil
}

//go:embed dragonn.cu
var dragonnCUDA string

// dragonnHash is DRAGONN's one-pass selection of a tensor (dragonn.cu's
// k_dragonn_hash; arguments x, n as int64, the threshold (a Float32 buffer
// of one element, on the device), the seed as int32, the table (Int32,
// slots words), slots as int32 and off as int64): each element with |x_i|
// >= the threshold (hashAboveKey) has off + i + 1 put in its slot, a slot
// keeping the largest (an atomic maximum on the GPU).
var dragonnHash = &device.Kernel{Name: "k_dragonn_hash", CUDA: dragonnCUDA, Host: func(n int, a ...any) {
	x, t, seed, table, off := a[0].(device.Buffer).Float32s(), a[2].(device.Buffer).Float32s()[0], uint32(a[3].(int32)), a[4].(device.Buffer).Int32s(), uint32(a[6].(int64))
	hashInsert(x[:n], hashAboveKey(t), seed, off, table)
}}

// dragonnAdvice: the small tensors all-reduced densely, each larger one's
// selection of about ρ of it (at least one element) all-gathered as
// indices and values.
var dragonnAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		dense, compressed := dragonnSplit(s)
		var out []Call
		if dense > 0 {
			out = append(out, Call{comm.OpAllReduce, 1, float64(dense)})
		}
		if compressed > 0 {
			out = append(out, gatherCalls(s.Sel-float64(dense), 2)...) // Selected counts the dense tensors too
		}
		return out, nil
	},
	Volume: func(s Shape, o Overlap) (sel, union float64) {
		dense, _ := dragonnSplit(s)
		sparse := 0.0
		for _, sz := range s.Sizes {
			if sz > s.Params.Int("min_tensor") {
				sparse += float64(max(int(float64(sz)*s.Density), 1))
			}
		}
		return float64(dense) + sparse, float64(dense) + o.TopK(sparse)
	},
	Selection: SelectsWhole,
	Caveats: func(c Conditions) []string {
		if dense, _ := dragonnSplit(c.Shape); dense == c.N {
			return []string{fmt.Sprintf("no tensor has more than min_tensor = %d elements: DRAGONN averages every one densely (-min-tensor)", c.Params.Int("min_tensor"))}
		}
		return buildUp(c)
	},
	Evidence: Evidence{Shown: []ModelKind{CNN, Transformer, MLP},
		Papers: "DRAGONN paper: ResNet-50 on ImageNet, ViT, MLP-Mixer, extreme classification on Wiki10-31K"},
}

// dragonnSplit returns the elements DRAGONN all-reduces densely (tensors of
// at most min_tensor elements) and those it compresses.
func dragonnSplit(s Shape) (dense, compressed int) {
	minT := s.Params.Int("min_tensor")
	for _, sz := range s.Sizes {
		if sz > minT {
			compressed += sz
		} else {
			dense += sz
		}
	}
	return dense, compressed
}

// hashTables are the CPU's extra hash tables of dragonnHash, reused.
var hashTables = sync.Pool{New: func() any { return new([]uint32) }}

// hashAboveKey is the smallest magnitude key (float32 bits without the
// sign) dragonnHash selects at threshold t: the key of t, but at least 1,
// so that exact zeros (keys 0) are never selected; NaN selects nothing.
func hashAboveKey(t float32) uint32 {
	if t != t {
		return math.MaxUint32
	}
	return max(math.Float32bits(t)&0x7fffffff, 1)
}

// hashInsert is dragonnHash on the CPU: one pass over x in chunks on all
// cores, each element compared with the key lo and, when selected (key in
// [lo, +Inf's]), hashed straight into its slot murmur3Index(i, seed) mod
// len(table), a slot keeping the largest index + 1 (the GPU's atomic
// maximum). Each chunk inserts into a table of its own (the first into
// table itself), in ascending order, so its last write is its highest
// index; the tables are then merged slot by slot by their maximum — the
// result of inserting every candidate in ascending order. Nothing is
// compacted.
func hashInsert(x []float32, lo, seed, off uint32, table []int32) {
	if lo > 0x7f800000 {
		return
	}
	m := uint32(len(table))
	p := selChunks(len(x))
	tables := make([][]uint32, p)
	var extra []*[]uint32
	for c := 1; c < p; c++ {
		tp := hashTables.Get().(*[]uint32)
		if cap(*tp) < len(table) {
			*tp = make([]uint32, len(table))
		}
		tables[c] = (*tp)[:len(table)]
		clear(tables[c])
		extra = append(extra, tp)
	}
	own := unsafeUint32s(table)
	// lo <= key <= +Inf as one unsigned comparison: key − lo wraps around
	// below lo.
	span := uint32(0x7f800000) - lo
	selParallel(len(x), p, func(c, a, b int) {
		tb := tables[c]
		put := func(e uint32) { tb[murmur3Index(e, seed)%m] = off + e + 1 }
		if c == 0 {
			put = func(e uint32) {
				s := murmur3Index(e, seed) % m
				own[s] = max(own[s], off+e+1)
			}
		}
		y := x[a:b]
		i := 0
		for ; i+4 <= len(y); i += 4 {
			k0 := math.Float32bits(y[i])&0x7fffffff - lo
			k1 := math.Float32bits(y[i+1])&0x7fffffff - lo
			k2 := math.Float32bits(y[i+2])&0x7fffffff - lo
			k3 := math.Float32bits(y[i+3])&0x7fffffff - lo
			if min(k0, k1, k2, k3) > span {
				continue
			}
			for j, k := range [4]uint32{k0, k1, k2, k3} {
				if k <= span {
					put(uint32(a + i + j))
				}
			}
		}
		for ; i < len(y); i++ {
			if math.Float32bits(y[i])&0x7fffffff-lo <= span {
				put(uint32(a + i))
			}
		}
	})
	for _, tb := range tables[1:] {
		for s, e := range tb {
			own[s] = max(own[s], e)
		}
	}
	for _, tp := range extra {
		hashTables.Put(tp)
	}
}

// unsafeUint32s views int32s as uint32s.
func unsafeUint32s(x []int32) []uint32 {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&x[0])), len(x))
}

// dragonnNotes: every tensor, or some, below the size cut-off.
func dragonnNotes(r Run) []string {
	mt := r.Params.Int("min_tensor")
	largest := Tensor{}
	compressed := 0
	for _, t := range r.Layout.Tensors {
		if t.Size > mt {
			compressed += t.Size
		}
		if t.Size > largest.Size {
			largest = t
		}
	}
	var notes []string
	switch {
	case compressed == 0:
		return []string{fmt.Sprintf("no tensor of %s has more than -min-tensor %d elements (the largest, %s, has %d): every tensor is all-reduced dense and nothing is sparsified; lower -min-tensor (0 compresses every tensor)",
			r.Model, mt, largest.Name, largest.Size)}
	case compressed < r.Layout.N:
		notes = append(notes, fmt.Sprintf("the tensors of more than -min-tensor %d elements, %.1f %% of the %d parameters, are sparsified; the rest is all-reduced dense",
			mt, 100*float64(compressed)/float64(r.Layout.N), r.Layout.N))
	}
	switch {
	case r.Replay && r.Momentum == 0:
		notes = append(notes, "no SGD momentum to correct (the recording's training gives none): plain error feedback, without the momentum-corrected error feedback of DRAGONN's experiments; pass -momentum 0.9 for a recording of SGD with momentum")
	case !r.Replay && (r.Optimizer != "sgd" || r.Momentum == 0):
		notes = append(notes, fmt.Sprintf("no SGD momentum to correct (-optimizer %s, -momentum %g): plain error feedback, without the momentum-corrected error feedback of DRAGONN's experiments",
			r.Optimizer, r.Momentum))
	}
	return notes
}
