package sparsify

import (
	"context"
	"fmt"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "cltk", Kernels: []*device.Kernel{rangeFlagKernel}, Projectable: true, New: newCltk, Advice: cltkAdvice,
		Doc: "reference notes 7.3: CLT-k, a rotating leader's top-k indices broadcast, every worker's values there all-reduced. No other deviation."})
}

// cltk is "cltk", CLT-k of the DEFT/MiCRO code (CLTKReducer,
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
type cltk struct{ b *Env }

func newCltk(e *Env) (Core, error) { return cltk{e}, nil }

// Reduce lets this call's leader choose the indices and all-reduces every
// worker's acc at them.
func (r cltk) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	n := b.c.Size()
	leader := b.calls % n
	wire, err := v.scratch(&b.dSel, device.Int32, b.k)
	if err != nil {
		return err
	}
	var selTime time.Duration
	if b.c.Rank() == leader {
		if selTime, err = b.selectTimed(func() error {
			_, err := v.ops.TopK(v.s, wire, device.Buffer{}, acc, b.k)
			return err
		}); err != nil {
			return err
		}
	}
	if err := b.c.Broadcast(ctx, v.cb(wire), leader); err != nil {
		return fmt.Errorf("broadcasting %d indices from leader %d: %w", b.k, leader, err)
	}
	// The leader's list, checked: distinct indices within [0, N).
	sel, err := b.union(wire)
	if err != nil || sel.Len() != b.k {
		return fmt.Errorf("leader %d sent %d indices of which %d are distinct within [0, %d) (%v): the workers disagree on the layout or density", leader, b.k, sel.Len(), b.n, err)
	}
	if err := b.unionReduceOn(ctx, acc, out, residual, sel); err != nil {
		return err
	}
	st.SelectTime = selTime
	st.Selected = b.k
	st.Distinct = b.k
	return nil
}

// SaveState writes the call count, which rotates the leader.
func (r cltk) SaveState(w *StateWriter) error {
	w.Int(r.b.calls)
	return nil
}

// LoadState reads the call count back.
func (r cltk) LoadState(d *StateReader) error {
	t := d.Int("call count", 0, maxCount)
	if err := d.Done(); err != nil {
		return err
	}
	r.b.calls = t
	return nil
}

// cltkAdvice: the leader's k indices broadcast, their values all-reduced.
var cltkAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		return []Call{{comm.OpBroadcast, 1, float64(s.K)}, {comm.OpAllReduce, 1, float64(s.K)}}, nil
	},
	Volume:    budgetVolume,
	Selection: SelectsWhole,
	Evidence: Evidence{Shown: []ModelKind{CNN, RNN, Transformer},
		Papers: "ScaleCom (CLT-k): ResNets on CIFAR-10 and ImageNet, LSTM speech, Transformer on WMT14; the slowest to converge of MiCRO's CNN comparisons"},
}
