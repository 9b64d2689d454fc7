package sparsify

import (
	"errors"
	"fmt"

	"github.com/sparsegrad/sparsegrad/device"
)

// histLen is the length of a first radix round's histogram
// (cuda.HistLen).
const histLen = 2048

// histTopK is Ops whose top-k can start from the first radix round's
// counts of x, written by the pass that wrote x (a GPU's
// cuda.Sparse.TopKHist, after its AccumulateFlagHist); the counts are zero
// again after it.
type histTopK interface {
	TopKHist(s device.Stream, idx, val, x, hist device.Buffer, k int) (int, error)
}

// Histogram returns the buffer into which error feedback's accumulation of
// the next call's acc may count the first radix round of the call's top-k
// (on a GPU, cuda.Sparse.AccumulateFlagHist), so that the selection makes
// one pass over acc fewer; the results are the same (the counts are
// integers). It returns an empty buffer where there is no such selection
// to serve: a method that does not declare TopKOfAcc, a call of the dense
// warm-up, a device whose Ops cannot start from the counts (the CPU's).
//
// A caller that gets a buffer must, before the next call, write it with the
// accumulation that produces the whole of that call's acc, on the
// reducer's stream, and let nothing write acc between the two; the call
// consumes the counts. The buffer holds zeros when Histogram returns, also
// after a call that failed before its selection.
func (r *Reducer) Histogram() (device.Buffer, error) {
	e := r.e
	if r.begun {
		return device.Buffer{}, fmt.Errorf("sparsify: %s: Histogram during a call; ask before the call's first Start", r.m.Name)
	}
	if _, ok := e.v.ops.(histTopK); !ok || !r.m.TopKOfAcc || e.calls < r.warmup || len(r.groups) != 1 {
		return device.Buffer{}, nil
	}
	if e.hist.Len() == 0 {
		h, err := e.v.d.Alloc(device.Int32, histLen)
		if err != nil {
			return device.Buffer{}, fmt.Errorf("sparsify: %s: the selection's histogram: %w", r.m.Name, err)
		}
		e.hist, e.histDirty = h, true
	}
	if e.histOwed || e.histDirty { // counts no selection consumed
		if err := e.v.m.Fill(e.v.s, e.hist.View(device.Float32, 0, histLen), 0); err != nil {
			return device.Buffer{}, fmt.Errorf("sparsify: %s: clearing the selection's histogram: %w", r.m.Name, err)
		}
		e.histDirty = false
	}
	e.histOwed = true
	return e.hist, nil
}

// topKAcc is Ops.TopK of the whole of the call's acc, by the first work
// of a core that declares TopKOfAcc: from the counts error feedback's
// accumulation left in the histogram when the call was promised them
// (Histogram).
func (e *Env) topKAcc(idx, val, acc device.Buffer, k int) (int, error) {
	if !e.histOwed {
		return e.v.ops.TopK(e.v.s, idx, val, acc, k)
	}
	e.histOwed = false
	if acc.Len() != e.n {
		e.histDirty = true
		return 0, fmt.Errorf("the top-k of %d elements of acc, whose %d the accumulation counted: a method declaring TopKOfAcc selects the whole of acc", acc.Len(), e.n)
	}
	k, err := e.v.ops.(histTopK).TopKHist(e.v.s, idx, val, acc, e.hist, k)
	if err != nil {
		e.histDirty = true
	}
	return k, err
}

// errHistNotConsumed fails a call of a core that declares TopKOfAcc and
// did not select through topKAcc.
var errHistNotConsumed = errors.New("the core declares TopKOfAcc but did not select the top-k of acc first (Env.topKAcc), so the accumulation's counts went unused")

// checkHistConsumed is what the frame checks after a core's call:
// counts promised to the call and not consumed are an error, and dirty.
func (e *Env) checkHistConsumed() error {
	if !e.histOwed {
		return nil
	}
	e.histOwed, e.histDirty = false, true
	return errHistNotConsumed
}
