package sparsify

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/options"
)

func init() {
	Register(Method{Name: "dragonn", Projectable: true, New: newDragonnReducer, Advice: dragonnAdvice, Params: []options.Option{
		{Key: "min_tensor", Kind: options.Int, Default: dragonnDefaultMinTensor, Range: options.Within(0, math.MaxInt32, "[]"), Zero: "every tensor",
			Doc: "compress only tensors with more elements"},
		denseWarmupParam(dragonnDefaultWarmup),
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
//   - Per compressed tensor (dragonnSelectOn): ratio = ρ, forced to 0.01 for
//     tensors of at most 131072 elements; ns = ⌊0.01·numel⌋ samples drawn
//     uniformly with replacement (from Options.Seed, the rank, the iteration
//     and the tensor: identical across runs for a seed); threshold = the
//     ⌈ns·ratio⌉-th largest sampled magnitude; then one pass over the tensor
//     (the paper's mechanism: the threshold test and the hash insert fused,
//     no compaction of the candidates, Ops.HashSelectAbove) hashes every
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
//   - The momentum-corrected error feedback (DGC's, Lin et al. 2017) with
//     which the paper evaluated every method. Here DRAGONN uses plain error
//     feedback and the optimizer's momentum after aggregation; the dgc
//     method has DGC's momentum correction.
//
// With the sum decode it conserves the gradient: Σ_w residual_w + n·out =
// Σ_w acc_w up to float32 rounding (the overwrite decode would not). Stats:
// Selected and SelectedPerWorker count the elements each worker sent (sparse
// pairs plus dense elements), LayerK the elements sent per tensor,
// ActualDensity = (distinct sparse indices + dense elements) / N (1 during
// warm-up), Threshold = the threshold of the largest compressed tensor (NaN
// when none was compressed).
type dragonnReducer struct {
	base      base
	minTensor int
	warmup    int
	params    []dragonnParams
	calls     int // compress calls so far, modulo 100000

	samp  samples
	dIdx  device.Buffer // Int32
	dVal  device.Buffer // Float32
	dense denseParts
}

func newDragonnReducer(o Options) (Reducer, error) {
	r := &dragonnReducer{base: newBase("dragonn", o), minTensor: o.Params.Int("min_tensor"), warmup: o.Params.Int("dense_warmup")}
	for _, tn := range o.Layout.Tensors {
		r.params = append(r.params, dragonnParamsFor(tn.Size, o.Density))
	}
	return r, nil
}

// Name returns "dragonn".
func (r *dragonnReducer) Name() string { return "dragonn" }

// compressed reports whether a tensor of size elements is compressed at the
// current call.
func (r *dragonnReducer) compressed(size int) bool {
	return r.base.iter >= r.warmup && size > r.minTensor
}

// Reduce compresses the large tensors after warm-up, all-gathers their pairs
// and all-reduces the rest.
func (r *dragonnReducer) Reduce(ctx context.Context, acc, out, residual []float32) (Stats, error) {
	return r.base.v.reduceHost(ctx, r, r.base.name, acc, out, residual)
}

// ReduceOn is Reduce on vectors of the reducer's device. The sample
// positions are drawn on the host and copied to the device; the threshold
// and the counts come back.
func (r *dragonnReducer) ReduceOn(ctx context.Context, acc, out, residual device.Buffer) (Stats, error) {
	b := &r.base
	v := &b.v
	return b.call(acc, out, residual, func(st *Stats) error {
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
		selTime, err := b.timed(func() error {
			idx, err := v.scratch(&r.dIdx, device.Int32, total)
			if err != nil {
				return err
			}
			for t, tn := range tensors {
				if !comp[t] {
					layerK[t] = tn.Size
					continue
				}
				x := acc.Slice(tn.Offset, tn.Offset+tn.Size)
				seed := uint32(dragonnSeedBase + r.calls)
				r.calls = (r.calls + 1) % dragonnSeedWrap
				p := r.params[t]
				dst := idx.Slice(pos, pos+p.nslots)
				m, th, err := dragonnSelectOn(v, &r.samp, dst, x, p, sampRNG(b.o.Seed, rank, b.iter, t), seed)
				if err != nil {
					return err
				}
				if largest < 0 || tn.Size > tensors[largest].Size {
					largest, thr = t, float64(th)
				}
				layerK[t] = m
				if err := v.ops.Shift(v.s, dst.Slice(0, m), tn.Offset); err != nil {
					return err
				}
				pos += m // the next tensor's indices follow these
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
		b.iter++
		// The uncompressed tensors, concatenated and all-reduced.
		if _, err := r.dense.reduce(ctx, b, acc, comp); err != nil {
			return err
		}
		idx, val := r.dIdx.Slice(0, pos), r.dVal.Slice(0, pos)
		counts, distinct, err := b.sparseExchangeIfAny(ctx, denseN < b.n, idx, val, out) // some tensor is compressed (the same on every rank)
		if err != nil {
			return err
		}
		if err := b.residualWithout(residual, acc, idx); err != nil {
			return err
		}
		if err := r.dense.write(b, out, residual, comp); err != nil {
			return err
		}
		for w := range counts {
			counts[w] += denseN
		}
		st.SelectTime = selTime
		st.Selected = pos + denseN
		st.SelectedPerWorker = counts
		st.LayerK = layerK
		st.ActualDensity = float64(distinct+denseN) / float64(b.n)
		st.Threshold = thr
		return nil
	})
}

// samples is the scratch of a sampled selection: the positions drawn on
// the host, and the positions and values on the device.
type samples struct {
	pos  []int32
	dPos device.Buffer // Int32
	dVal device.Buffer // Float32
}

// dragonnSelectOn is DRAGONN's selection on one tensor x of the device: thr
// is the ks-th largest magnitude of ns samples x[i] drawn uniformly with
// replacement from rng (on the host); then one pass over x
// (Ops.HashSelectAbove) compares every element with thr and hashes each
// selected index i (|x_i| >= thr, x_i not an exact zero) with MurmurHash3
// x86_32 of its 4-byte index and seed hashSeed into one of nslots slots, a
// collision keeping the highest index. The occupied slots' indices, in slot
// order, are written into out (at least nslots long). It returns how many
// and thr.
//
// This is the paper's mechanism: the threshold test and the hash insert
// are one pass, with no compaction of the candidates (the GPU kernel writes
// straight into the table; only the table, 4·nsel slots, is compacted). It
// selects exactly what a threshold compaction followed by the insertion of
// the candidates in ascending order selects.
//
// Deviations from the GPU kernel of the reference, each a fix: collisions
// resolve deterministically (the highest index wins; there an arbitrary
// thread wins); element 0 can be selected (the reference stores the index
// and reads 0 as "empty", so element 0 is never sent); and exact zeros are
// never selected — the reference tests |x_i| >= thr, so when the sampled
// threshold is 0 (a sparse gradient such as an embedding's: most samples
// are 0) every zero is a candidate and zeros crowd the non-zeros out of the
// slots.
func dragonnSelectOn(v *vecs, sc *samples, out, x device.Buffer, p dragonnParams, rng *rand.Rand, hashSeed uint32) (int, float32, error) {
	sc.pos = sc.pos[:0]
	for range p.ns {
		sc.pos = append(sc.pos, int32(rng.IntN(p.numel)))
	}
	pos, err := v.scratch(&sc.dPos, device.Int32, p.ns)
	if err != nil {
		return 0, 0, err
	}
	val, err := v.scratch(&sc.dVal, device.Float32, p.ns)
	if err != nil {
		return 0, 0, err
	}
	if err := v.upload(pos, sc.pos); err != nil {
		return 0, 0, err
	}
	if err := v.ops.Gather(v.s, val, x, pos); err != nil {
		return 0, 0, err
	}
	thr, err := v.ops.KthLargestAbs(v.s, val, p.ks)
	if err != nil {
		return 0, 0, err
	}
	k, err := v.ops.HashSelectAbove(v.s, out, x, thr, hashSeed, p.nslots)
	return k, thr, err
}

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
