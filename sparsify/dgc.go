package sparsify

import (
	"context"
	"fmt"
	"math"
	"time"
)

func init() { Register(Method{Name: "dgc", New: newDGCReducer}) }

// dgcReducer is "dgc", Deep Gradient Compression's sampled-threshold
// sparsifier as in the reference DGC code (synxlin/deep-gradient-compression,
// reference notes 7.4), with a sparse all-gather and classic error feedback:
//
//   - Every layout tensor is compressed on its own, as DGC compresses each
//     named parameter: nsel = ⌈numel·ρ⌉ (DGC's rounding, not BudgetK's floor;
//     at least 1), chosen by dgcSelect's double sampling: strided samples of
//     about 1 % of the tensor (at least ⌈2/ρ⌉; tensors of at most ⌈2/ρ⌉
//     elements are sampled whole), a threshold from the top ⌈samples·ρ⌉
//     samples, selection of |x| >= thr, then up to 10 adaptation rounds (more
//     than 1.3·nsel candidates: exact top-nsel among them; fewer than
//     0.8·nsel: thr ×= 0.8) and finally the first nsel candidates in index
//     order. The stride's random start is drawn from Options.Seed, the rank,
//     the iteration and the tensor (identical across runs for a seed).
//   - Communication, one exchange per call for all tensors (like Horovod's
//     tensor fusion): an AllGather of one int32 count per worker, then
//     AllGatherV of the int32 flat indices and of the float32 values.
//   - out = (Σ_w value_w)/n at every received index (summed in rank order,
//     bit-identical on every rank), 0 elsewhere.
//   - residual = acc with this worker's own sent entries zeroed (classic
//     error feedback; the reference's DGC momentum correction and masking are
//     optimizer features and are not part of the reducer).
//
// It conserves the gradient: Σ_w residual_w + n·out = Σ_w acc_w up to float32
// rounding. Stats: Selected = own count, SelectedPerWorker = the gathered
// counts, LayerK = own count per tensor, ActualDensity = distinct received
// indices / N, Threshold = the final threshold of the largest tensor (the
// first of equal size).
type dgcReducer struct {
	base    base
	params  []dgcParams
	largest int // tensor whose threshold Stats reports
	scratch dgcScratch
	sel     []int32
	idx     []int32
	val     []float32
}

func newDGCReducer(o Options) (Reducer, error) {
	r := &dgcReducer{base: newBase("dgc", o)}
	for t, tn := range o.Layout.Tensors {
		r.params = append(r.params, dgcParamsFor(tn.Size, o.Density))
		if tn.Size > o.Layout.Tensors[r.largest].Size {
			r.largest = t
		}
	}
	return r, nil
}

// Name returns "dgc".
func (r *dgcReducer) Name() string { return "dgc" }

// Reduce selects per tensor by double sampling, all-gathers the pairs and
// averages them.
func (r *dgcReducer) Reduce(ctx context.Context, acc, out, residual []float32) (Stats, error) {
	b := &r.base
	if err := b.checkArgs(acc, out, residual); err != nil {
		return Stats{}, err
	}
	before := b.c.Totals()
	t0 := time.Now()
	rank := b.c.Rank()
	r.idx, r.val = r.idx[:0], r.val[:0]
	layerK := make([]int, len(r.params))
	thr := math.NaN()
	for t, tn := range b.o.Layout.Tensors {
		p := r.params[t]
		x := acc[tn.Offset : tn.Offset+tn.Size]
		start := 0
		if p.stride > 1 {
			start = sampRNG(b.o.Seed, rank, b.iter, t).IntN(p.stride)
		}
		var th float32
		r.sel, th = dgcSelect(r.sel, x, p, start, &r.scratch)
		if t == r.largest {
			thr = float64(th)
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
	counts, distinct, err := b.sparseExchange(ctx, r.idx, r.val, out)
	if err != nil {
		return Stats{}, fmt.Errorf("sparsify: dgc: %w", err)
	}
	residualWithout(residual, acc, r.idx)
	st := b.stats(before, selTime)
	st.Selected = len(r.idx)
	st.SelectedPerWorker = counts
	st.LayerK = layerK
	st.ActualDensity = float64(distinct) / float64(b.n)
	st.Threshold = thr
	st.ErrorNorm = norm2(residual)
	return st, nil
}
