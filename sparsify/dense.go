package sparsify

import (
	"context"
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "dense", Projectable: true, New: newDense, Advice: denseAdvice,
		Doc: "all-reduce average of acc; residual 0. No deviation."})
}

// dense is the "dense" baseline: a plain all-reduce average of acc.
//
// out = (Σ_w acc_w)/n (the sum in the communicator's canonical order, then
// multiplied by 1/n), residual = 0, ActualDensity = 1, Selected = N,
// Threshold = NaN. It conserves the gradient exactly up to float32 rounding:
// Σ_w residual_w + n·out = Σ_w acc_w.
type dense struct{ b *Env }

func newDense(e *Env) (Core, error) { return dense{e}, nil }

// Reduce all-reduces acc and averages it; the residual is zeroed.
func (r dense) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	o := out
	if err := v.s.Copy(o, acc); err != nil {
		return err
	}
	if err := b.c.AllReduce(ctx, v.cb(o)); err != nil {
		return fmt.Errorf("all-reducing %d values: %w", o.Len(), err)
	}
	if err := v.m.Scale(v.s, o, 1/float32(b.c.Size())); err != nil {
		return err
	}
	if err := v.m.Fill(v.s, residual, 0); err != nil {
		return err
	}
	st.Distinct, st.Selected, st.ResidualSq = b.n, b.n, 0
	return nil
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
