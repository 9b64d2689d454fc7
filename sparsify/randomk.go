package sparsify

import (
	"context"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "randomk", Kernels: []*device.Kernel{rangeFlagKernel}, Projectable: true, New: newRandomk, Advice: randomkAdvice,
		Doc: "k random indices shared by all ranks (seeded), no indices on the wire. Baseline without a reference."})
}

// randomk is "randomk", the random-k baseline with a shared index set:
//
//   - k = BudgetK(density, N) = ⌊ρN⌋ clamped to [1, N] indices of the flat
//     gradient are drawn with RandomK from a seed that mixes Options.Seed and
//     the call number, so every rank draws the same k indices (and a run
//     repeats exactly for a seed); no indices cross the wire;
//   - every worker all-reduces its own acc at those k indices (one AllReduce
//     of k float32, the canonical summation order), out = sum/n there and 0
//     elsewhere;
//   - residual = acc with the k indices zeroed.
//
// It conserves the gradient: Σ_w residual_w + n·out = Σ_w acc_w up to float32
// rounding. Stats: Selected = k, ActualDensity = k/N, Threshold = NaN,
// SelectedPerWorker = nil (no counts are exchanged), SelectTime = the time to
// draw the indices.
type randomk struct {
	b   *Env
	sel []int32
}

func newRandomk(e *Env) (Core, error) { return &randomk{b: e}, nil }

// randomkSeed is the seed of the index draw at call iter.
func randomkSeed(seed uint64, iter int) uint64 { return sampMix(seed ^ sampMix(uint64(iter))) }

// Reduce draws the shared indices and all-reduces acc there. The k
// indices are drawn on the host (every rank draws the same) and copied to
// the device.
func (r *randomk) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	sel, err := v.scratch(&b.dSel, device.Int32, b.k)
	if err != nil {
		return err
	}
	selTime, err := b.selectTimed(func() error {
		r.sel = RandomK(r.sel, b.n, b.k, randomkSeed(b.o.Seed, b.calls))
		return v.upload(sel, r.sel)
	})
	if err != nil {
		return err
	}
	if err := b.unionReduceOn(ctx, acc, out, residual, sel.Slice(0, len(r.sel))); err != nil {
		return err
	}
	st.SelectTime = selTime
	st.Selected = len(r.sel)
	st.Distinct = len(r.sel)
	return nil
}

// SaveState writes the call count, which seeds the index draw.
func (r *randomk) SaveState(w *StateWriter) error {
	w.Int(r.b.calls)
	return nil
}

// LoadState reads the call count back.
func (r *randomk) LoadState(d *StateReader) error {
	it := d.Int("call count", 0, maxCount)
	if err := d.Done(); err != nil {
		return err
	}
	r.b.calls = it
	return nil
}

// randomkAdvice: the k values at the shared seed's indices all-reduced.
var randomkAdvice = &Advice{
	Plan:      func(s Shape) ([]Call, error) { return []Call{{comm.OpAllReduce, 1, float64(s.K)}}, nil },
	Volume:    budgetVolume,
	Selection: SelectsWhole,
	Evidence: Evidence{
		Papers:  "no paper here shows it at dense accuracy",
		Warning: "random sampling needed 15.1× the iterations to converge in DRAGONN's comparison (Wiki10-31K); its fast selection does not make up for that"},
}
