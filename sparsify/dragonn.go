package sparsify

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

func init() {
	Register(Method{Name: "dragonn", New: newDragonnReducer, Params: []Param{
		{Name: "min_tensor", Flag: "min-tensor", Kind: Int, Default: dragonnDefaultMinTensor, Min: 0, Max: math.MaxInt32,
			Doc: "compress only tensors with more elements (0: every tensor)"},
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
//   - Per compressed tensor (dragonnSelect): ratio = ρ, forced to 0.01 for
//     tensors of at most 131072 elements; ns = ⌊0.01·numel⌋ samples drawn
//     uniformly with replacement (from Options.Seed, the rank, the iteration
//     and the tensor: identical across runs for a seed); threshold = the
//     ⌈ns·ratio⌉-th largest sampled magnitude; every element with |x| >= thr
//     is hashed into 4·nsel slots (nsel = ⌊numel·ratio⌋) with MurmurHash3
//     x86_32 of its 4-byte index, seed 43 + c, where c counts the compress
//     calls (per tensor per iteration, on every rank alike) and wraps to 0 at
//     100000; a slot keeps the last index written; the occupied slots are the
//     selection (ns and nsel are raised to at least 1).
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
//     "empty"), and collisions are resolved deterministically: candidates are
//     inserted in ascending index order, so the highest index wins.
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
	scratch   dragonnScratch
	sel       []int32
	idx       []int32
	val       []float32
	dense     []float32
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
	b := &r.base
	if err := b.checkArgs(acc, out, residual); err != nil {
		return Stats{}, err
	}
	before := b.c.Totals()
	t0 := time.Now()
	rank := b.c.Rank()
	tensors := b.o.Layout.Tensors
	r.idx, r.val, r.dense = r.idx[:0], r.val[:0], r.dense[:0]
	layerK := make([]int, len(tensors))
	thr := math.NaN()
	largest := -1
	denseN := 0
	comp := make([]bool, len(tensors))
	for t, tn := range tensors {
		comp[t] = r.compressed(tn.Size)
	}
	for t, tn := range tensors {
		x := acc[tn.Offset : tn.Offset+tn.Size]
		if !comp[t] {
			r.dense = append(r.dense, x...)
			layerK[t] = tn.Size
			denseN += tn.Size
			continue
		}
		seed := uint32(dragonnSeedBase + r.calls)
		r.calls = (r.calls + 1) % dragonnSeedWrap
		var th float32
		r.sel, th = dragonnSelect(r.sel, x, r.params[t], sampRNG(b.o.Seed, rank, b.iter, t), seed, &r.scratch)
		if largest < 0 || tn.Size > tensors[largest].Size {
			largest, thr = t, float64(th)
		}
		layerK[t] = len(r.sel)
		for _, i := range r.sel {
			r.idx = append(r.idx, int32(tn.Offset)+i)
		}
	}
	r.val = valuesAt(r.val, acc, r.idx)
	selTime := time.Since(t0)
	b.iter++
	clear(out)
	if len(r.dense) > 0 {
		if err := b.c.AllReduce(ctx, comm.Float32s(r.dense)); err != nil {
			return Stats{}, fmt.Errorf("sparsify: dragonn: all-reducing %d values of the uncompressed tensors: %w", len(r.dense), err)
		}
	}
	var counts []int
	distinct := 0
	if denseN < b.n { // some tensor is compressed (the same on every rank)
		var err error
		if counts, distinct, err = b.sparseExchange(ctx, r.idx, r.val, out); err != nil {
			return Stats{}, fmt.Errorf("sparsify: dragonn: %w", err)
		}
	} else {
		counts = make([]int, b.c.Size())
	}
	inv := 1 / float32(b.c.Size())
	residualWithout(residual, acc, r.idx)
	d := 0
	for t, tn := range tensors {
		if comp[t] {
			continue
		}
		for i := range tn.Size {
			out[tn.Offset+i] = r.dense[d+i] * inv
		}
		clear(residual[tn.Offset : tn.Offset+tn.Size])
		d += tn.Size
	}
	for w := range counts {
		counts[w] += denseN
	}
	st := b.stats(before, selTime)
	st.Selected = len(r.idx) + denseN
	st.SelectedPerWorker = counts
	st.LayerK = layerK
	st.ActualDensity = float64(distinct+denseN) / float64(b.n)
	st.Threshold = thr
	st.ErrorNorm = norm2(residual)
	return st, nil
}
