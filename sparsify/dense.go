package sparsify

import (
	"context"
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
)

func init() { Register(Method{Name: "dense", New: newDenseReducer}) }

// denseReducer is the "dense" baseline: a plain all-reduce average of acc.
//
// out = (Σ_w acc_w)/n (the sum in the communicator's canonical order, then
// multiplied by 1/n), residual = 0, ActualDensity = 1, Selected = N,
// Threshold = NaN. It conserves the gradient exactly up to float32 rounding:
// Σ_w residual_w + n·out = Σ_w acc_w.
type denseReducer struct {
	base base
}

func newDenseReducer(o Options) (Reducer, error) {
	return &denseReducer{base: newBase("dense", o)}, nil
}

// Name returns "dense".
func (r *denseReducer) Name() string { return "dense" }

// Reduce all-reduces acc and averages it; the residual is zeroed.
func (r *denseReducer) Reduce(ctx context.Context, acc, out, residual []float32) (Stats, error) {
	b := &r.base
	if err := b.checkArgs(acc, out, residual); err != nil {
		return Stats{}, err
	}
	before := b.c.Totals()
	copy(out, acc)
	if err := b.c.AllReduce(ctx, comm.Float32s(out)); err != nil {
		return Stats{}, fmt.Errorf("sparsify: dense: all-reducing %d values: %w", len(out), err)
	}
	inv := 1 / float32(b.c.Size())
	for i := range out {
		out[i] *= inv
	}
	clear(residual)
	st := b.stats(before, 0)
	st.ActualDensity = 1
	st.Selected = b.n
	st.ErrorNorm = 0
	return st, nil
}
