package sparsify

import (
	"context"
	"fmt"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

func init() { Register(Method{Name: "cltk", New: newCltkReducer}) }

// cltkReducer is "cltk", CLT-k of the DEFT/MiCRO code (CLTKReducer,
// reference notes 7.3):
//
//   - the leader of call t (counting from 0 on each reducer) is rank t mod n;
//     it selects the exact top-k of its own acc, k = BudgetK(density, N) =
//     ⌊ρN⌋ clamped to [1, N] (ties to lower indices);
//   - the leader broadcasts the k indices as int32 (the package's wire format;
//     the reference sends int64);
//   - every worker all-reduces its own acc at those indices (float32); out =
//     sum/n there and 0 elsewhere; every worker's residual is acc with those
//     indices zeroed.
//
// Stats: Selected = k on every rank (every rank sends its values at the k
// leader-chosen indices; only the leader spends SelectTime),
// SelectedPerWorker = nil, ActualDensity = k/N, which never exceeds the
// budget whatever n is. Bytes: the binomial-tree broadcast of 4k bytes plus
// the ring all-reduce of k float32 (comm.Traffic). It conserves the gradient:
// Σ_w residual_w + n·out = Σ_w acc_w up to float32 rounding.
type cltkReducer struct {
	base base
	t    int
	sel  []int32
	wire []int32
}

func newCltkReducer(o Options) (Reducer, error) {
	return &cltkReducer{base: newBase("cltk", o)}, nil
}

// Name returns "cltk".
func (r *cltkReducer) Name() string { return "cltk" }

// Reduce lets this call's leader choose the indices and all-reduces every
// worker's acc at them.
func (r *cltkReducer) Reduce(ctx context.Context, acc, out, residual []float32) (Stats, error) {
	b := &r.base
	if err := b.checkArgs(acc, out, residual); err != nil {
		return Stats{}, err
	}
	n := b.c.Size()
	leader := r.t % n
	r.t++
	before := b.c.Totals()
	var selTime time.Duration
	r.wire = grow(r.wire, b.k)
	if b.c.Rank() == leader {
		t0 := time.Now()
		r.sel = TopK(r.sel, acc, b.k)
		selTime = time.Since(t0)
		copy(r.wire, r.sel)
	}
	if err := b.c.Broadcast(ctx, comm.Int32s(r.wire), leader); err != nil {
		return Stats{}, fmt.Errorf("sparsify: cltk: broadcasting %d indices from leader %d: %w", b.k, leader, err)
	}
	r.sel = grow(r.sel, b.k)
	for i, v := range r.wire {
		if v < 0 || int(v) >= b.n || (i > 0 && v <= r.wire[i-1]) {
			return Stats{}, fmt.Errorf("sparsify: cltk: leader %d sent index %d at position %d, not ascending within [0, %d): the workers disagree on the layout or density", leader, v, i, b.n)
		}
		r.sel[i] = v
	}
	if err := unionReduce(ctx, b.c, acc, out, residual, r.sel); err != nil {
		return Stats{}, fmt.Errorf("sparsify: cltk: %w", err)
	}
	st := b.stats(before, selTime)
	st.Selected = b.k
	st.ActualDensity = float64(b.k) / float64(b.n)
	st.ErrorNorm = norm2(residual)
	return st, nil
}
