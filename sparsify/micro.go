package sparsify

import (
	"context"
	"math"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "micro", Kernels: []*device.Kernel{rangeFlagKernel}, NotProjectable: "each worker selects within its 1/n share of the gradient, so its part of the index all-gather shrinks as the worker count grows", New: newMicro, Advice: microAdvice,
		Doc: "reference notes 3: MiCRO's rotating disjoint partitions with a shared threshold controller. Deviations: with one worker the global count is recorded as with many (the reference's threshold decays every call); empty partitions (N < n) are guarded."})
}

// The constants of MiCRO's threshold controller (kljp/micro, notes 3.3).
const (
	microBandHigh = 1.1     // e above this: too many selected
	microBandLow  = 0.909   // e above this (and <= microBandHigh): in the band
	microUp       = 1.005   // factor when too many were selected
	microInBand   = 1.00125 // factor inside the band (upward, as the reference code does)
	microDown     = 0.995   // factor when too few were selected
)

// microNextThreshold is MiCRO's controller: the threshold of iteration t > 0
// from that of iteration t−1, the global count kPrev of iteration t−1 and the
// global budget k: with e = kPrev/k, ×1.005 if e > 1.1, ×1.00125 if
// 0.909 < e <= 1.1, ×0.995 otherwise.
func microNextThreshold(thr float64, kPrev, k int) float64 {
	e := float64(kPrev) / float64(k)
	switch {
	case e > microBandHigh:
		return thr * microUp
	case e > microBandLow:
		return thr * microInBand
	}
	return thr * microDown
}

// microReducer is MiCRO (Yoon & Oh, HiPC'23); see newMicro.
type microReducer struct {
	b     *Env
	n, r  int // workers, rank
	k     int
	thr   float64 // threshold of the last call
	kPrev int     // global count of the last call
}

// newMicro builds the "micro" reducer, MiCRO as in the authors'
// MicroReducer (kljp/micro, notes section 3), bound to one worker:
//
//   - The flat gradient is cut into n near-equal contiguous partitions
//     (comm.ChunkBounds; layer boundaries are ignored); in iteration t worker
//     r owns partition (t mod n + r) mod n, so the workers' partitions are
//     disjoint and rotate.
//   - The global budget is k = BudgetK(Density, N) = ⌊ρN⌋, clamped to at least
//     1 (the reference divides by zero when it rounds to 0). The threshold is
//     1/(2√k) at t = 0 and then follows microNextThreshold driven by the
//     previous iteration's global count; it is identical on all workers
//     because it depends only on global quantities.
//   - Worker r selects the indices of its partition with |acc| >= threshold
//     (the threshold rounded to float32, as the reference's float32
//     comparison does); if none, the single index s + (t mod (e−s)) of its
//     partition [s, e); a worker with an empty partition (only when N < n)
//     selects nothing (the reference's modulo by zero is guarded).
//   - Counts and indices are all-gathered in the package's wire format
//     (int32 counts, then the int32 lists with AllGatherV; the reference
//     sends int64 counts and int64 lists padded to the largest); the union
//     is their concatenation (disjoint); it is all-reduced with each worker's
//     own values (unionReduce): out is the average on the union, 0 elsewhere,
//     and the residual is acc with the union zeroed. The global count |union|
//     drives the next threshold.
//
// Stats: Threshold is the controller's threshold of this call, Selected this
// worker's count (including a fallback index), SelectedPerWorker the gathered
// counts, ActualDensity = |union|/N, LayerK nil. SelectTime covers the
// threshold update and the selection.
//
// Deviation from the reference code: with one worker the reference never
// records the global count, so its threshold decays by 0.5 % every call;
// here the count is recorded for every worker count, so one worker follows
// the same controller as many.
func newMicro(b *Env) (Core, error) {
	return &microReducer{b: b, n: b.c.Size(), r: b.c.Rank(), k: b.k}, nil
}

// Reduce runs one MiCRO iteration; see newMicro.
func (m *microReducer) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := m.b
	N := b.n
	v := &b.v
	t := b.calls
	s, e := comm.ChunkBounds(N, m.n, (t%m.n+m.r)%m.n)
	// Sized for the largest partition: the partitions rotate.
	mine, err := v.scratch(&b.dSel, device.Int32, max((N+m.n-1)/m.n, e-s, 1))
	if err != nil {
		return err
	}
	mine = mine.Slice(0, max(e-s, 1))
	cnt := 0
	// Timed by events on a GPU (no host wait of its own).
	selTime, err := b.selectTimed(func() error {
		if t == 0 {
			m.thr = 1 / (2 * math.Sqrt(float64(m.k)))
		} else {
			m.thr = microNextThreshold(m.thr, m.kPrev, m.k)
		}
		var err error
		if cnt, err = v.ops.SelectAbove(v.s, mine, device.Buffer{}, acc.Slice(s, e), float32(m.thr)); err != nil {
			return err
		}
		if err := v.ops.Shift(v.s, mine.Slice(0, cnt), s); err != nil {
			return err
		}
		if cnt == 0 && e > s {
			// The fallback index is written on the device (Iota of
			// one element): no upload from host memory in the step.
			cnt = 1
			return v.ops.Iota(v.s, mine.Slice(0, 1), s+t%(e-s))
		}
		return nil
	})
	if err != nil {
		return err
	}
	union, counts, err := b.gatherIndicesOn(ctx, mine.Slice(0, cnt)) // disjoint partitions: no duplicates
	if err != nil {
		return err
	}
	if err := b.unionReduceOn(ctx, acc, out, residual, union); err != nil {
		return err
	}
	m.kPrev = union.Len()

	st.SelectTime = selTime
	st.Distinct = union.Len()
	st.Selected = cnt
	st.SelectedPerWorker = counts
	st.Threshold = m.thr
	return nil
}

// SaveState writes the call count (rotating partitions), the threshold
// and the last global count its controller adapts from.
func (m *microReducer) SaveState(w *StateWriter) error {
	w.Int(m.b.calls)
	w.Float(m.thr)
	w.Int(m.kPrev)
	return nil
}

// LoadState reads them back.
func (m *microReducer) LoadState(d *StateReader) error {
	t := d.Int("call count", 0, maxCount)
	thr := d.Float("threshold")
	kPrev := d.Int("last global count", 0, m.b.n)
	if err := d.Done(); err != nil {
		return err
	}
	m.b.calls, m.thr, m.kPrev = t, thr, kPrev
	return nil
}

// microAdvice: each worker selects about k/P within its partition; the
// index lists all-gathered, their union (about k) all-reduced.
var microAdvice = &Advice{
	Plan: selectedUnionPlan,
	Volume: func(s Shape, _ Overlap) (sel, union float64) {
		return float64(s.K) / float64(s.P), float64(s.K)
	},
	Selection: SelectsShare,
	Caveats: func(Conditions) []string {
		return []string{"its threshold starts at 1/(2√k) and moves about 0.5 % an iteration, so for hundreds of iterations it can send far more or far less than ρ (on ResNet-18 47.8× ρ at step 1); the advisor's horizon columns show what it sends over the run's steps"}
	},
	Evidence: Evidence{Shown: []ModelKind{CNN, Recommender},
		Papers:  "MiCRO paper: ResNet-18, GoogLeNet, SENet-18 on CIFAR-10/100 (CNNs only)",
		Project: "NCF on MovieLens-100K, 4 workers, ρ = 0.1: HR@10 0.637 after 20 epochs (dense 0.665; docs/results/ncf-ml100k.md)",
		At:      []ShownAt{{Kind: Recommender, Density: 0.1, Workers: 4}}},
}
