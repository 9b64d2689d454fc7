package sparsify

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

func init() { Register("dense", newDenseReducer) }

// denseReducer is the "dense" baseline: a plain all-reduce average of acc.
//
// out = (Σ_w acc_w)/n (the sum in the communicator's canonical order, then
// multiplied by 1/n), residual = 0, ActualDensity = 1, Selected = N,
// Threshold = NaN. It conserves the gradient exactly up to float32 rounding:
// Σ_w residual_w + n·out = Σ_w acc_w.
type denseReducer struct {
	base baselineBase
}

func newDenseReducer(o Options) (Reducer, error) {
	return &denseReducer{base: newBaselineBase("dense", o)}, nil
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

// baselineBase is the state every baseline reducer shares: its name, the
// counting communicator and the sizes.
type baselineBase struct {
	name    string
	c       *comm.Counter
	n       int // elements of the flat gradient
	k       int // BudgetK(density, n)
	density float64
}

func newBaselineBase(name string, o Options) baselineBase {
	return baselineBase{
		name:    name,
		c:       comm.NewCounter(o.Comm),
		n:       o.Layout.N,
		k:       BudgetK(o.Density, o.Layout.N),
		density: o.Density,
	}
}

// checkArgs validates the lengths and the aliasing of Reduce's arguments.
func (b *baselineBase) checkArgs(acc, out, residual []float32) error {
	if len(acc) != b.n || len(out) != b.n || len(residual) != b.n {
		return fmt.Errorf("sparsify: %s: acc, out and residual have %d, %d and %d elements; the layout has %d",
			b.name, len(acc), len(out), len(residual), b.n)
	}
	if &out[0] == &acc[0] || &out[0] == &residual[0] {
		return fmt.Errorf("sparsify: %s: out must not be the same slice as acc or residual (only residual may alias acc)", b.name)
	}
	return nil
}

// stats returns the Stats common part of a call that started when the
// counter showed before and spent sel choosing indices.
func (b *baselineBase) stats(before comm.Totals, sel time.Duration) Stats {
	d := b.c.Totals().Sub(before)
	return Stats{
		Density:    b.density,
		Threshold:  math.NaN(),
		BytesSent:  d.BytesSent,
		BytesRecv:  d.BytesRecv,
		CommTime:   d.Time,
		SelectTime: sel,
	}
}
