package sparsify

import (
	"context"
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/device"
)

func init() { Register(Method{Name: "dgc", New: newDGCReducer}) }

// dgcReducer is "dgc", Deep Gradient Compression's sampled-threshold
// sparsifier as in the reference DGC code (synxlin/deep-gradient-compression,
// reference notes 7.4), with a sparse all-gather and classic error feedback:
//
//   - Every layout tensor is compressed on its own, as DGC compresses each
//     named parameter: nsel = ⌈numel·ρ⌉ (DGC's rounding, not BudgetK's floor;
//     at least 1), chosen by dgcSelectOn's double sampling: strided samples of
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

	samp        samples
	dIdx, dCand device.Buffer // Int32
	dVal        device.Buffer // Float32
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
	a, o, res, err := r.base.v.hostArgs(r.base.name, acc, out, residual)
	if err != nil {
		return Stats{}, err
	}
	return r.ReduceOn(ctx, a, o, res)
}

// ReduceOn is Reduce on vectors of the reducer's device. The sampling's
// threshold and the adaptation rounds' counts come back to the host; where
// the reference takes the exact top-nsel of the candidates it takes the
// top-nsel of the tensor, the same set (the candidates, more than nsel,
// hold every element at least as large as the nsel-th largest).
func (r *dgcReducer) ReduceOn(ctx context.Context, acc, out, residual device.Buffer) (Stats, error) {
	b := &r.base
	v := &b.v
	if err := v.checkOn(b.name, b.n, acc, out, residual); err != nil {
		return Stats{}, err
	}
	before := b.c.Totals()
	rank := b.c.Rank()
	layerK := make([]int, len(r.params))
	thr := math.NaN()
	pos := 0
	selTime, err := b.timed(func() error {
		maxSize, total := 0, 0
		for t, tn := range b.o.Layout.Tensors {
			maxSize = max(maxSize, tn.Size)
			total += r.params[t].nsel
		}
		idx, err := v.scratch(&r.dIdx, device.Int32, total)
		if err != nil {
			return err
		}
		cand, err := v.scratch(&r.dCand, device.Int32, maxSize)
		if err != nil {
			return err
		}
		for t, tn := range b.o.Layout.Tensors {
			p := r.params[t]
			x := acc.Slice(tn.Offset, tn.Offset+tn.Size)
			start := 0
			if p.stride > 1 {
				start = sampRNG(b.o.Seed, rank, b.iter, t).IntN(p.stride)
			}
			take, th, err := dgcSelectOn(v, &r.samp, cand, x, p, start)
			if err != nil {
				return err
			}
			if t == r.largest {
				thr = float64(th)
			}
			layerK[t] = take
			dst := idx.Slice(pos, pos+take)
			if err := v.s.Copy(dst, cand.Slice(0, take)); err != nil {
				return err
			}
			if err := v.ops.Shift(v.s, dst, tn.Offset); err != nil {
				return err
			}
			pos += take
		}
		val, err := v.scratch(&r.dVal, device.Float32, pos)
		if err != nil {
			return err
		}
		return v.ops.Gather(v.s, val, acc, idx.Slice(0, pos))
	})
	if err != nil {
		return Stats{}, fmt.Errorf("sparsify: dgc: %w", err)
	}
	b.iter++
	idx, val := r.dIdx.Slice(0, pos), r.dVal.Slice(0, pos)
	counts, distinct, err := b.sparseExchangeOn(ctx, idx, val, out)
	if err != nil {
		return Stats{}, fmt.Errorf("sparsify: dgc: %w", err)
	}
	if err := b.residualWithout(residual, acc, idx); err != nil {
		return Stats{}, err
	}
	st, err := b.finish(before, selTime, residual)
	st.Selected = pos
	st.SelectedPerWorker = counts
	st.LayerK = layerK
	st.ActualDensity = float64(distinct) / float64(b.n)
	st.Threshold = thr
	return st, err
}

// dgcSelectOn is DGC's double sampling on one tensor x of the device
// (reference notes 7.4, synxlin/deep-gradient-compression): the samples are
// x[start + j·stride] for j < numSamples (start in [0, stride)); thr is the
// smallest magnitude of the top topSamples samples; the candidates are
// {i : |x_i| >= thr}. Unless the tensor was sampled whole, up to
// dgcMaxAdapt rounds follow: more than 1.3·nsel candidates → keep the exact
// top-nsel of them by magnitude (ties to lower indices) and stop; fewer than
// 0.8·nsel → thr ×= 0.8 and select again; otherwise stop. Finally the first
// nsel candidates in index order are kept. It writes the selected indices of
// x, ascending, into cand (at least len(x) long) and returns how many and
// the final threshold. The top-nsel of the candidates is taken as the
// top-nsel of x: the same set, since the candidates, more than nsel, hold
// every element at least as large as the nsel-th largest.
func dgcSelectOn(v *vecs, sc *samples, cand, x device.Buffer, p dgcParams, start int) (int, float32, error) {
	smp, err := v.scratch(&sc.dVal, device.Float32, p.numSamples)
	if err != nil {
		return 0, 0, err
	}
	if err := v.ops.GatherStrided(v.s, smp, x, start, p.stride); err != nil {
		return 0, 0, err
	}
	th, err := v.ops.KthLargestAbs(v.s, smp, p.topSamples)
	if err != nil {
		return 0, 0, err
	}
	m, err := v.ops.SelectAbove(v.s, cand, device.Buffer{}, x, th)
	if err != nil {
		return 0, 0, err
	}
	if p.numel > p.numSamples {
		for range dgcMaxAdapt {
			if m > p.nsel {
				if float64(m) > dgcUpper*float64(p.nsel) {
					if m, err = v.ops.TopK(v.s, cand, device.Buffer{}, x, p.nsel); err != nil {
						return 0, 0, err
					}
				}
				break
			}
			if float64(m) >= dgcLower*float64(p.nsel) {
				break
			}
			th *= dgcLower
			if m, err = v.ops.SelectAbove(v.s, cand, device.Buffer{}, x, th); err != nil {
				return 0, 0, err
			}
		}
	}
	return min(p.nsel, m), th, nil
}
