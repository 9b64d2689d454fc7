package sparsify

import (
	"context"
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "dense", Projectable: true, New: newDenseReducer, Advice: denseAdvice})
}

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
	return r.base.v.reduceHost(ctx, r, r.base.name, acc, out, residual)
}

// ReduceOn is Reduce on vectors of the reducer's device.
func (r *denseReducer) ReduceOn(ctx context.Context, acc, out, residual device.Buffer) (Stats, error) {
	b := &r.base
	v := &b.v
	return b.call(acc, out, residual, func(st *Stats) error {
		if err := v.s.Copy(out, acc); err != nil {
			return err
		}
		if err := b.c.AllReduce(ctx, v.cb(out)); err != nil {
			return fmt.Errorf("all-reducing %d values: %w", out.Len(), err)
		}
		if err := v.m.Scale(v.s, out, 1/float32(b.c.Size())); err != nil {
			return err
		}
		if err := v.m.Fill(v.s, residual, 0); err != nil {
			return err
		}
		st.ActualDensity = 1
		st.Selected = b.n
		st.ErrorNorm = 0
		return nil
	})
}

// denseAdvice: one all-reduce of the whole gradient, nothing selected.
var denseAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) { return []Call{{comm.OpAllReduce, 1, float64(s.N)}}, nil },
	Volume: func(s Shape, _ Overlap) (sel, union float64) {
		return float64(s.N), float64(s.N)
	},
	Selection: NoSelection,
	Evidence:  Evidence{Shown: ModelKinds, Papers: "the baseline: all-reduce of the whole gradient, what data-parallel training does"},
}
