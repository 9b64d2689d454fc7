package sparsify

import (
	"context"
	"fmt"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

// sumSquares is the sum of x[i]² in float64, accumulated in four interleaved
// partial sums (element i into sum i mod 4, the last len(x) mod 4 elements
// into sum 0) combined as (s0+s1)+(s2+s3): four independent dependency chains
// make it several times faster than one running sum. The explicit conversions
// keep the compiler from fusing multiply and add, so the result is the same on
// every platform.
func sumSquares(x []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(x); i += 4 {
		a, b, c, d := float64(x[i]), float64(x[i+1]), float64(x[i+2]), float64(x[i+3])
		s0 += float64(a * a)
		s1 += float64(b * b)
		s2 += float64(c * c)
		s3 += float64(d * d)
	}
	for ; i < len(x); i++ {
		a := float64(x[i])
		s0 += float64(a * a)
	}
	return (s0 + s1) + (s2 + s3)
}

// reduceSelected is the rest of a call of a method whose workers each
// select their own indices (topk, threshold): every worker's selection
// gathered, the union formed and all-reduced (unionReduceOn), and the
// selection's statistics put in st.
func (b *Env) reduceSelected(ctx context.Context, acc, out, residual, sel device.Buffer, st *GroupStats) error {
	all, counts, err := b.gatherIndicesOn(ctx, sel)
	if err != nil {
		return err
	}
	union, err := b.union(all)
	if err != nil {
		return err
	}
	if err := b.reduceUnionOn(ctx, acc, out, residual, union); err != nil {
		return err
	}
	st.Selected = sel.Len()
	st.SelectedPerWorker = counts
	st.Distinct = union.Len()
	return nil
}

// grow returns s resliced to length n, reallocated when its capacity is too
// small (the contents are unspecified).
func grow[E any](s []E, n int) []E {
	if cap(s) < n {
		return make([]E, n)
	}
	return s[:n]
}

// Env is what the frame gives a method's core on one worker: the options
// (checked, Params resolved), the communicator, counted once (Options.Comm
// when it counts, as the trainer's comm.Counter does; else a Counter of its
// own), the device, the number of calls so far, and the helpers the
// methods share (the exchanges of selected indices, the scratch buffers).
type Env struct {
	o        Options
	c        countedComm
	n        int // elements of the flat gradient
	k        int // BudgetK(o.Density, n)
	calls    int // calls completed (Reducer.Finish)
	perEpoch int // calls per epoch, 0 when unknown (Reducer.SetStepsPerEpoch)

	// Scratch of gatherCountsOn.
	counts []int32

	// The device (Options.Stream) and its scratch.
	v             vecs
	dSel, dAll    device.Buffer // Int32
	dUnion        device.Buffer // Int32
	dVal, dAllVal device.Buffer // Float32

	// selEvents are the start and end of the selections of the call in
	// flight that selectTimed timed on a device (read by Reducer.combine).
	selEvents [][2]device.Event
	// ranges are the call's range checks of received lists (checkRange).
	ranges rangeChecks
	// later are what the call's cores read from copies to the host they
	// issued without a wait (afterWait), run once the frame's wait has
	// brought them back.
	later []func()

	// The first radix round of the call's top-k of acc, counted by error
	// feedback's accumulation (Reducer.Histogram, Env.topKAcc): hist
	// (histLen Int32 counters) is owed to the call's selection from
	// Histogram until topKAcc consumes it, and dirty when it may hold
	// counts no selection consumed.
	hist                device.Buffer
	histOwed, histDirty bool
}

// afterWait runs f when the call's statistics are combined, after the
// frame's wait for the residual's norm (Reducer.combine): f may read what
// the stream copied to the host before, without a wait of its own (a
// count that only the statistics need). A failed call drops it.
func (e *Env) afterWait(f func()) { e.later = append(e.later, f) }

// runLater runs the call's afterWait functions, waiting for the stream
// first unless the frame has waited since they were registered (waited).
func (e *Env) runLater(waited bool) error {
	if len(e.later) == 0 {
		return nil
	}
	if !waited {
		if err := e.v.s.Synchronize(); err != nil {
			return err
		}
	}
	for _, f := range e.later {
		f()
	}
	e.later = e.later[:0]
	return nil
}

// countedComm is a communicator that counts its calls (comm.Counter).
type countedComm interface {
	comm.Communicator
	Totals() comm.Totals
}

func newEnv(o Options) *Env {
	c, ok := o.Comm.(countedComm)
	if !ok {
		c = comm.NewCounter(o.Comm)
	}
	return &Env{o: o, c: c, n: o.Layout.N, k: BudgetK(o.Density, o.Layout.N), v: newVecs(o)}
}

// Options are the worker's options, Params resolved (Options.Comm is the
// caller's communicator; communicate through Comm).
func (e *Env) Options() Options { return e.o }

// Comm is the worker's communicator; its traffic is the call's.
func (e *Env) Comm() comm.Communicator { return e.c }

// N is the number of elements of the flat gradient, K the budget
// BudgetK(Density, N).
func (e *Env) N() int { return e.n }

// K is BudgetK(Density, N).
func (e *Env) K() int { return e.k }

// Calls is the number of calls completed before the current one.
func (e *Env) Calls() int { return e.calls }

// Stream is the stream of the worker's device, Ops its operations on
// whole vectors and Math its vector math.
func (e *Env) Stream() device.Stream { return e.v.s }

// Ops are the operations on whole vectors of the worker's device.
func (e *Env) Ops() Ops { return e.v.ops }

// Math is the vector math of the worker's device.
func (e *Env) Math() device.Math { return e.v.m }

// Scratch returns the first n elements of *b, a buffer of the worker's
// device of type dt, reallocated (contents lost) when shorter than n.
func (e *Env) Scratch(b *device.Buffer, dt device.DType, n int) (device.Buffer, error) {
	return e.v.scratch(b, dt, n)
}

// Buf returns b, a vector of the worker's device, as a communicator buffer
// ordered by the stream.
func (e *Env) Buf(b device.Buffer) comm.Buffer { return e.v.cb(b) }

// Timed runs f and returns how long it took on the device (the stream is
// synchronized): a selection's time.
func (e *Env) Timed(f func() error) (time.Duration, error) { return e.timed(f) }

// ReduceSelected is the rest of a call of a method whose workers each
// select their own indices (sel: an Int32 vector of distinct indices of
// the device, ascending): every worker's selection all-gathered, their
// union all-reduced (out = the sum over the workers / n on the union, 0
// elsewhere; residual = acc with the union zeroed), and Selected,
// SelectedPerWorker and Distinct put in st.
func (e *Env) ReduceSelected(ctx context.Context, acc, out, residual, sel device.Buffer, st *GroupStats) error {
	return e.reduceSelected(ctx, acc, out, residual, sel, st)
}

// gatherCountsOn all-gathers every worker's count (one int32 each, known
// to the host) for a device exchange: in host memory, so that sizing the
// exchange costs the host no wait for the device.
func (b *Env) gatherCountsOn(ctx context.Context, mine int, what string) ([]int, error) {
	n := b.c.Size()
	b.counts = grow(b.counts, n+1)
	b.counts[n] = int32(mine)
	if err := b.c.AllGather(ctx, comm.Int32s(b.counts[n:n+1]), comm.Int32s(b.counts[:n])); err != nil {
		return nil, fmt.Errorf("gathering the %d workers' %s counts: %w", n, what, err)
	}
	counts := make([]int, n)
	for w, c := range b.counts[:n] {
		if c < 0 || int(c) > b.n {
			return nil, fmt.Errorf("rank %d announced %d %s for a gradient of %d elements (outside [0, %d]): the workers disagree on the layout or the data is corrupt", w, c, what, b.n, b.n)
		}
		counts[w] = int(c)
	}
	return counts, nil
}

// gatherIndicesOn is gatherIndices through the device: the counts, then
// every worker's indices (mine: an Int32 vector of the device) concatenated
// in rank order in device memory.
func (b *Env) gatherIndicesOn(ctx context.Context, mine device.Buffer) (device.Buffer, []int, error) {
	counts, err := b.gatherCountsOn(ctx, mine.Len(), "indices")
	if err != nil {
		return device.Buffer{}, nil, err
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	all, err := b.listScratch(&b.dAll, device.Int32, total)
	if err != nil {
		return device.Buffer{}, nil, err
	}
	if err := b.c.AllGatherV(ctx, b.v.cb(mine), b.v.cb(all), counts); err != nil {
		return device.Buffer{}, nil, fmt.Errorf("gathering %d indices: %w", total, err)
	}
	return all, counts, nil
}

// listScratch is vecs.scratch for the lists of a call — every worker's
// selections, their union, its values — whose lengths vary from call to
// call: on a GPU the buffer is allocated for at least min(N, workers·k)
// elements (what Top-k's lists reach), so that it is not reallocated in
// the middle of later steps (on the CPU, as long as the call needs).
func (b *Env) listScratch(buf *device.Buffer, dt device.DType, n int) (device.Buffer, error) {
	if b.v.onCPU() {
		return b.v.scratch(buf, dt, n)
	}
	s, err := b.v.scratch(buf, dt, max(n, min(b.n, b.c.Size()*b.k)))
	if err != nil {
		return device.Buffer{}, err
	}
	return s.Slice(0, n), nil
}

// union returns the sorted distinct indices of idx in device scratch.
func (b *Env) union(idx device.Buffer) (device.Buffer, error) {
	u, err := b.listScratch(&b.dUnion, device.Int32, idx.Len())
	if err != nil {
		return device.Buffer{}, err
	}
	m, err := b.v.ops.Union(b.v.s, u, idx, b.n)
	if err != nil {
		return device.Buffer{}, err
	}
	return u.Slice(0, m), nil
}

// unionReduceOn is unionReduce through the device: every worker's acc at
// union (sorted, distinct, the same on every rank) all-reduced, out =
// sum/n there and 0 elsewhere, residual = acc with union zeroed. The
// union's range check costs no wait of its own (checkRange: a union with
// an index outside [0, N) fails the call when it ends).
func (b *Env) unionReduceOn(ctx context.Context, acc, out, residual, union device.Buffer) error {
	err := b.checkRange(union, b.n, func(err error) error {
		return fmt.Errorf("the union of the selections: %w: the workers disagree on the layout or the data is corrupt", err)
	})
	if err != nil {
		return err
	}
	return b.reduceUnionOn(ctx, acc, out, residual, union)
}

// reduceUnionOn is unionReduceOn of a union that Env.union formed, whose
// indices Ops.Union has checked already (no second check, no host wait).
func (b *Env) reduceUnionOn(ctx context.Context, acc, out, residual, union device.Buffer) error {
	v := &b.v
	vals, err := b.listScratch(&b.dVal, device.Float32, union.Len())
	if err != nil {
		return err
	}
	if err := v.ops.Gather(v.s, vals, acc, union); err != nil {
		return err
	}
	if err := b.c.AllReduce(ctx, v.cb(vals)); err != nil {
		return fmt.Errorf("all-reducing %d selected values: %w", vals.Len(), err)
	}
	if err := v.m.Fill(v.s, out, 0); err != nil {
		return err
	}
	if err := v.ops.Scatter(v.s, out, union, vals, 1/float32(b.c.Size())); err != nil {
		return err
	}
	return b.residualWithout(residual, acc, union)
}

// residualWithout sets residual to acc with the elements at idx zeroed
// (residual may be acc).
func (b *Env) residualWithout(residual, acc, idx device.Buffer) error {
	v := &b.v
	if !sameMemory(residual, acc) {
		if err := v.s.Copy(residual, acc); err != nil {
			return err
		}
	}
	return v.ops.ScatterFill(v.s, residual, idx, 0)
}

// selectTimed runs f, a selection whose time goes to the call's
// Stats.SelectTime only: on the CPU it returns timed's duration; on a
// device it returns 0 and times f by two events on the stream, which the
// frame reads when it combines the call's statistics (Reducer.combine),
// after its own wait, so that timing costs no host wait of its own.
func (b *Env) selectTimed(f func() error) (time.Duration, error) {
	if b.v.onCPU() {
		return b.timed(f)
	}
	e0, err := b.v.s.Record()
	if err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	e1, err := b.v.s.Record()
	if err != nil {
		return 0, err
	}
	b.selEvents = append(b.selEvents, [2]device.Event{e0, e1})
	return 0, nil
}

// selectEventsTime returns the time between the events selectTimed
// recorded, waiting for the last where it has not completed, and forgets
// them.
func (b *Env) selectEventsTime() (time.Duration, error) {
	if len(b.selEvents) == 0 {
		return 0, nil
	}
	defer func() { b.selEvents = b.selEvents[:0] }()
	last := b.selEvents[len(b.selEvents)-1][1]
	if d, ok := last.(interface{ Done() bool }); !ok || !d.Done() {
		if err := last.Synchronize(); err != nil {
			return 0, err
		}
	}
	var sum time.Duration
	for _, e := range b.selEvents {
		d, err := device.Elapsed(e[0], e[1])
		if err != nil {
			return 0, fmt.Errorf("timing the selection: %w", err)
		}
		sum += d
	}
	return sum, nil
}

// timed runs f and returns how long it took on the device (the stream is
// synchronized).
func (b *Env) timed(f func() error) (time.Duration, error) {
	t0 := time.Now()
	if err := f(); err != nil {
		return 0, err
	}
	if !b.v.onCPU() {
		if err := b.v.s.Synchronize(); err != nil {
			return 0, err
		}
	}
	return time.Since(t0), nil
}

// addMeanOn is addMean through the device: out is set to zero, every
// worker's list (counts[w] pairs, or each pairs when counts is nil; indices
// distinct within a list) is added in rank order, and the sum multiplied
// by 1/n. It returns the number of distinct indices; one outside [0, N) is
// an error, raised before anything is written.
func (b *Env) addMeanOn(out, idx, val device.Buffer, counts []int, each int) (int, error) {
	v := &b.v
	u, err := b.union(idx)
	if err != nil {
		return 0, err
	}
	if err := v.m.Fill(v.s, out, 0); err != nil {
		return 0, err
	}
	off := 0
	for w := range b.c.Size() {
		c := each
		if counts != nil {
			c = counts[w]
		}
		if err := v.ops.ScatterAdd(v.s, out, idx.Slice(off, off+c), val.Slice(off, off+c), 1); err != nil {
			return 0, err
		}
		off += c
	}
	return u.Len(), v.m.Scale(v.s, out, 1/float32(b.c.Size()))
}

// sparseExchangeOn is sparseExchange through the device: the counts, then
// every worker's int32 indices and float32 values (AllGatherV), decoded
// into out with addMeanOn (out is overwritten: zero where nothing arrived).
// It returns every worker's count and the number of distinct indices.
func (b *Env) sparseExchangeOn(ctx context.Context, idx, val, out device.Buffer) ([]int, int, error) {
	counts, err := b.gatherCountsOn(ctx, idx.Len(), "pairs")
	if err != nil {
		return nil, 0, err
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	v := &b.v
	allIdx, err := b.listScratch(&b.dAll, device.Int32, total)
	if err != nil {
		return nil, 0, err
	}
	allVal, err := b.listScratch(&b.dAllVal, device.Float32, total)
	if err != nil {
		return nil, 0, err
	}
	if err := b.c.AllGatherV(ctx, v.cb(idx), v.cb(allIdx), counts); err != nil {
		return nil, 0, fmt.Errorf("gathering %d indices: %w", total, err)
	}
	if err := b.c.AllGatherV(ctx, v.cb(val), v.cb(allVal), counts); err != nil {
		return nil, 0, fmt.Errorf("gathering %d values: %w", total, err)
	}
	distinct, err := b.addMeanOn(out, allIdx, allVal, counts, 0)
	return counts, distinct, err
}

// sparseExchangeIfAny is sparseExchangeOn when any tensor is compressed
// (the same on every rank), and otherwise out zeroed with every worker's
// count 0 (for the methods that send some tensors dense: dgc, dragonn).
func (b *Env) sparseExchangeIfAny(ctx context.Context, any bool, idx, val, out device.Buffer) ([]int, int, error) {
	if any {
		return b.sparseExchangeOn(ctx, idx, val, out)
	}
	return make([]int, b.c.Size()), 0, b.v.m.Fill(b.v.s, out, 0)
}

// checkList checks that idx holds k distinct indices within [0, N) (what
// names the list's sender in the error).
func (b *Env) checkList(idx device.Buffer, k int, what string) error {
	u, err := b.union(idx)
	if err != nil {
		return fmt.Errorf("%s indices outside [0, %d): the workers disagree on the layout: %w", what, b.n, err)
	}
	if u.Len() != k {
		return fmt.Errorf("%s %d indices of which %d are distinct: the workers disagree on the layout or the data is corrupt", what, k, u.Len())
	}
	return nil
}
