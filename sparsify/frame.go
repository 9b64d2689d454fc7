package sparsify

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/options"
)

// Core is a method's own work, bound to one worker: it reduces groups of
// the flat gradient on its device (Env). The registry wraps every core in
// the frame every method shares (Reducer): the argument checks, the traffic
// counted once, the residual's error norm, the statistics combined, the
// host adapter, the dense warm-up, the name and the state's header. A core
// that declares no groups (Grouped) reduces the whole gradient as one.
type Core interface {
	// Reduce reduces group g (of Groups; 0, the whole gradient, for a core
	// that declares none): from this worker's error-compensated gradient
	// acc it writes, over the group's range, the gradient averaged over
	// all workers into out and this worker's new residual into residual,
	// and reports what it selected in st. acc, out and residual are the
	// flat vectors on the core's device (checked by the frame: out aliases
	// neither; residual may be acc); only the group's range may be
	// written. Every rank reduces the same groups in the same order.
	Reduce(ctx context.Context, g int, acc, out, residual device.Buffer, st *GroupStats) error
}

// Starter is a Core that can leave a group's communication in flight:
// Start does what Reduce does up to the communication, writes g's range
// of residual, and returns finish, which the frame calls once (from any
// goroutine, before out's range is read) to complete the communication and
// write out's range. Several groups may be in flight at once; the frame
// calls every started group's finish, also after an error.
type Starter interface {
	Core
	Start(ctx context.Context, g int, acc, out, residual device.Buffer, st *GroupStats) (finish func(context.Context) error, err error)
}

// SetStarter is a Starter that can also start several groups at once
// (LAGS: the groups whose gradients became final together), with fewer
// passes and collectives than one Start each. StartSet does what Start
// does for every group of gs (distinct, in the call's order, the same on
// every rank), sts[i] being gs[i]'s statistics, and returns one finish for
// them all. The results are those of Start for each group in turn.
type SetStarter interface {
	Starter
	StartSet(ctx context.Context, gs []int, acc, out, residual device.Buffer, sts []*GroupStats) (finish func(context.Context) error, err error)
}

// Grouped is a Core that reduces the gradient in several groups: the
// trainer starts each group as soon as its gradients are final during the
// backward pass (pipelining, for a method that declares itself Pipelined).
type Grouped interface {
	Core
	// Groups lists the groups in the order their gradients become final
	// (reverse layout order). Their ranges partition [0, N).
	Groups() []Group
}

// Profiled is a Core that adapts to the measured backward pass (LAGS-SGD's
// adaptive density): after a step, the trainer hands it when each tensor's
// gradient became final.
type Profiled interface {
	Core
	// Profiling reports whether the core wants the times of the next step.
	Profiling() bool
	// Profile hands over the times of the run's step number step: when the
	// gradient of each layout tensor became final (the zero time where the
	// model did not say). Every rank calls it after the same steps; c
	// connects them, for combining their measurements. It returns a note
	// for the run's record ("" if none; the frame puts the method's name
	// before it).
	Profile(ctx context.Context, c comm.Communicator, step int, final []time.Time) (note string, err error)
}

// Group is a range of consecutive tensors of a layout that a core reduces
// together.
type Group struct {
	// Tensors are the layout indices of the group's tensors in backward
	// order (descending layout index).
	Tensors []int
	// Lo and Hi delimit the group's elements [Lo, Hi) in the flat vector.
	Lo, Hi int
}

// Size is the number of elements of the group.
func (g Group) Size() int { return g.Hi - g.Lo }

// wholeGroup is the group of the whole gradient of l.
func wholeGroup(l Layout) Group {
	g := Group{Lo: 0, Hi: l.N}
	for t := len(l.Tensors) - 1; t >= 0; t-- {
		g.Tensors = append(g.Tensors, t)
	}
	return g
}

// GroupStats is what a core reports of the reduction of one group. The
// frame adds the traffic, the setup density and the residual's error norm
// and combines the groups of a call into the call's Stats: the counts are
// summed, ActualDensity is Σ Distinct / N, ErrorNorm √(Σ ResidualSq), and
// SelectedPerWorker and Threshold are the group's when there is one group
// (nil and NaN otherwise).
type GroupStats struct {
	// Selected is the number of elements this worker selected,
	// SelectedPerWorker every rank's where the method exchanges them.
	Selected          int
	SelectedPerWorker []int
	// Distinct is the number of distinct indices whose values crossed the
	// wire (the union over the workers; the group's size when dense).
	Distinct int
	// Threshold is the magnitude threshold used (NaN, as the frame sets
	// it, for methods that have none).
	Threshold float64
	// LayerK is the number of elements selected in each tensor of the
	// layout (length: the layout's tensors), for methods that allocate per
	// tensor; nil otherwise.
	LayerK []int
	// SelectTime is the time spent choosing indices.
	SelectTime time.Duration
	// CommTime, when not 0, is the wall time of a group's communication
	// left in flight (Starter), from its start to its completion (at the
	// latest the end of finish); 0: the time spent in the communicator's
	// calls, as counted.
	CommTime time.Duration
	// ResidualSq is ‖residual‖² over the group when the core knows it
	// without a pass (0 when it zeroed the residual); NaN, as the frame
	// sets it: the frame computes it.
	ResidualSq float64
}

// Reducer is one method bound to one worker: the method's core in the
// frame every method shares. Every rank calls Reduce (or ReduceOn, or
// Start for every group and then Finish) in lock-step.
type Reducer struct {
	m      Method
	e      *Env
	core   Core
	start  Starter    // core as a Starter, or nil
	set    SetStarter // core as a SetStarter, or nil
	groups []Group
	warmup int // dense calls before the core's first (dense_warmup)

	// The call in flight: begun by its first Start, ended by Finish.
	begun   bool
	acc     device.Buffer // the call's vectors, the same for every group
	out     device.Buffer
	res     device.Buffer
	before  comm.Totals
	st      []GroupStats
	fin     []func(context.Context) error
	started []bool
	err     error // the first error of the call's Starts
}

// newReducer frames the core of method m built on e.
func newReducer(m Method, e *Env, core Core) (*Reducer, error) {
	r := &Reducer{m: m, e: e, core: core}
	r.start, _ = core.(Starter)
	r.set, _ = core.(SetStarter)
	if g, ok := core.(Grouped); ok {
		r.groups = g.Groups()
		if err := checkGroups(r.groups, e.o.Layout); err != nil {
			return nil, fmt.Errorf("sparsify: %s: %w", m.Name, err)
		}
	} else {
		r.groups = []Group{wholeGroup(e.o.Layout)}
	}
	if m.DenseWarmup {
		r.warmup = e.o.Params.Int(denseWarmupName)
	}
	n := len(r.groups)
	r.st, r.fin, r.started = make([]GroupStats, n), make([]func(context.Context) error, n), make([]bool, n)
	return r, nil
}

// checkGroups checks that groups partition the layout's [0, N) and each
// lists its tensors.
func checkGroups(groups []Group, l Layout) error {
	if len(groups) == 0 {
		return errors.New("the core declares no groups")
	}
	covered := make([]bool, l.N+1) // by range end
	total := 0
	for i, g := range groups {
		if g.Lo < 0 || g.Hi > l.N || g.Lo >= g.Hi || len(g.Tensors) == 0 {
			return fmt.Errorf("group %d is [%d, %d) with %d tensors, not a non-empty range of the %d elements", i, g.Lo, g.Hi, len(g.Tensors), l.N)
		}
		if covered[g.Hi] {
			return fmt.Errorf("group %d ends where another does (%d): the groups overlap", i, g.Hi)
		}
		covered[g.Hi] = true
		total += g.Size()
	}
	if total != l.N {
		return fmt.Errorf("the groups hold %d elements, the layout %d: they must partition it", total, l.N)
	}
	return nil
}

// Name is the method's registry name.
func (r *Reducer) Name() string { return r.m.Name }

// Groups lists the groups the reducer reduces, in the order their
// gradients become final (one group, the whole gradient, for most
// methods). The slice must not be modified.
func (r *Reducer) Groups() []Group { return r.groups }

// Reduce takes this worker's error-compensated gradient acc (length N of
// the layout), writes the gradient averaged over all workers into out
// (every element is written) and this worker's new residual into residual
// (every element is written). residual may be the same slice as acc; out
// must not overlap either. It is ReduceOn over host memory, for a reducer
// built for the CPU.
func (r *Reducer) Reduce(ctx context.Context, acc, out, residual []float32) (Stats, error) {
	if !r.e.v.onCPU() {
		return Stats{}, fmt.Errorf("sparsify: %s: the reducer works on %v; call ReduceOn with vectors there, not Reduce with host slices", r.m.Name, r.e.v.d)
	}
	return r.ReduceOn(ctx, device.Host(acc), device.Host(out), device.Host(residual))
}

// ReduceOn is Reduce on vectors of the reducer's device (Options.Stream's,
// the CPU's by default), issued on Options.Stream: when it returns, out and
// residual are written for the work issued on that stream afterwards.
// Every group is started at once (StartGroups: all are ready together),
// then the call finished.
func (r *Reducer) ReduceOn(ctx context.Context, acc, out, residual device.Buffer) (Stats, error) {
	gs := make([]int, len(r.groups))
	for g := range gs {
		gs[g] = g
	}
	_ = r.StartGroups(ctx, gs, acc, out, residual) // Finish reports an error, after the started groups
	return r.Finish(ctx)
}

// Start reduces group g of a call, or starts it (a core that leaves its
// communication in flight): its range of residual is written when Start
// returns, its range of out once Finish has returned. acc, out and
// residual are the call's vectors on the reducer's device, the same for
// every group of a call (only g's range is used). Every rank must start
// the groups of a call in the same order, each once; Start and Finish must
// not run concurrently. An error is also Finish's.
func (r *Reducer) Start(ctx context.Context, g int, acc, out, residual device.Buffer) error {
	defer r.e.v.hold()()
	err := r.startGroup(ctx, g, acc, out, residual)
	if err != nil && r.err == nil {
		r.err = err
	}
	return err
}

// StartGroups is Start of every group of gs, in order, for groups that are
// ready together (their gradients final at the same moment): a core that
// can (SetStarter: LAGS) starts them at once, in fewer passes and
// collectives, with the same results. Every rank must start the same sets
// of a call in the same order.
func (r *Reducer) StartGroups(ctx context.Context, gs []int, acc, out, residual device.Buffer) error {
	if len(gs) == 1 || r.set == nil || r.e.calls < r.warmup {
		for _, g := range gs {
			if err := r.Start(ctx, g, acc, out, residual); err != nil {
				return err
			}
		}
		return nil
	}
	err := r.startSet(ctx, gs, acc, out, residual)
	if err != nil && r.err == nil {
		r.err = err
	}
	return err
}

func (r *Reducer) startSet(ctx context.Context, gs []int, acc, out, residual device.Buffer) error {
	sts := make([]*GroupStats, len(gs))
	for i, g := range gs {
		if err := r.checkStart(g, acc, out, residual); err != nil {
			return err
		}
		for _, h := range gs[:i] {
			if h == g {
				return fmt.Errorf("sparsify: %s: group %d started twice in one call; call Finish first", r.m.Name, g)
			}
		}
		sts[i] = &r.st[g]
	}
	for i, g := range gs {
		r.started[g] = true
		*sts[i] = GroupStats{Threshold: math.NaN(), ResidualSq: math.NaN()}
	}
	fin, err := r.set.StartSet(ctx, gs, acc, out, residual, sts)
	if err != nil {
		return fmt.Errorf("sparsify: %s: groups %v: %w", r.m.Name, gs, err)
	}
	r.fin[gs[0]] = fin // the set's finish, called once
	return nil
}

// checkStart checks that group g may start in the call, on the call's
// vectors (and begins the call with its first group).
func (r *Reducer) checkStart(g int, acc, out, residual device.Buffer) error {
	name := r.m.Name
	if g < 0 || g >= len(r.groups) {
		return fmt.Errorf("sparsify: %s: group %d does not exist; the reducer has groups 0..%d", name, g, len(r.groups)-1)
	}
	if r.started[g] {
		return fmt.Errorf("sparsify: %s: group %d started twice in one call; call Finish first", name, g)
	}
	if !r.begun {
		if err := r.e.v.checkOn(name, r.e.n, acc, out, residual); err != nil {
			return err
		}
		r.begun, r.acc, r.out, r.res = true, acc, out, residual
		r.before = r.e.c.Totals()
	} else if !sameVector(acc, r.acc) || !sameVector(out, r.out) || !sameVector(residual, r.res) {
		return fmt.Errorf("sparsify: %s: group %d started on other vectors than the call's first group; pass the same acc, out and residual to every group of a call", name, g)
	}
	return nil
}

func (r *Reducer) startGroup(ctx context.Context, g int, acc, out, residual device.Buffer) error {
	if err := r.checkStart(g, acc, out, residual); err != nil {
		return err
	}
	r.started[g] = true
	st := &r.st[g]
	*st = GroupStats{Threshold: math.NaN(), ResidualSq: math.NaN()}
	var err error
	switch {
	case r.e.calls < r.warmup:
		err = r.denseGroup(ctx, r.groups[g], acc, out, residual, st)
	case r.start != nil:
		r.fin[g], err = r.start.Start(ctx, g, acc, out, residual, st)
	default:
		err = r.core.Reduce(ctx, g, acc, out, residual, st)
	}
	if err == nil {
		err = r.e.checkHistConsumed()
	}
	if err != nil {
		return r.wrap(g, err)
	}
	return nil
}

// wrap prefixes a core's error with the method and, when there are
// several, the group.
func (r *Reducer) wrap(g int, err error) error {
	if len(r.groups) > 1 {
		return fmt.Errorf("sparsify: %s: group %d: %w", r.m.Name, g, err)
	}
	return fmt.Errorf("sparsify: %s: %w", r.m.Name, err)
}

// sameVector reports whether a and b are the same vector.
func sameVector(a, b device.Buffer) bool {
	return a.Len() == b.Len() && (a.Len() == 0 || sameMemory(a, b))
}

// Finish completes the call: it finishes every started group's
// communication, and returns the call's statistics. A group not started,
// or an error of a Start or a finish, is the call's error; every started
// group is finished first, so that none outlives the call.
func (r *Reducer) Finish(ctx context.Context) (Stats, error) {
	defer r.e.v.hold()()
	defer r.reset()
	err := r.err
	if err == nil && !r.begun {
		err = fmt.Errorf("sparsify: %s: Finish without a group started", r.m.Name)
	}
	for g, f := range r.fin {
		if f == nil {
			continue
		}
		if e := f(ctx); e != nil && err == nil {
			err = r.wrap(g, e)
		}
	}
	if err == nil {
		for g, s := range r.started {
			if !s {
				err = fmt.Errorf("sparsify: %s: group %d was never started (every group of a call must be)", r.m.Name, g)
				break
			}
		}
	}
	if err != nil {
		if rerr := r.e.rangeErr(); rerr != nil { // what failed used a list that failed its range check
			return Stats{}, fmt.Errorf("sparsify: %s: %w", r.m.Name, rerr)
		}
		return Stats{}, err
	}
	st, err := r.combine()
	if rerr := r.e.rangeErr(); rerr != nil { // read with the norm's wait
		return Stats{}, fmt.Errorf("sparsify: %s: %w", r.m.Name, rerr)
	}
	if err != nil {
		return Stats{}, fmt.Errorf("sparsify: %s: the residual's norm: %w", r.m.Name, err)
	}
	r.e.calls++
	return st, nil
}

// reset ends the call in flight.
func (r *Reducer) reset() {
	r.begun, r.err = false, nil
	r.acc, r.out, r.res = device.Buffer{}, device.Buffer{}, device.Buffer{}
	clear(r.fin)
	clear(r.started)
	if r.e.histOwed { // a failed call's counts, not consumed
		r.e.histOwed, r.e.histDirty = false, true
	}
	r.e.selEvents = r.e.selEvents[:0] // a failed call's are not read
	r.e.later = r.e.later[:0]
	r.e.forgetRanges()
}

// combine makes the call's Stats from its groups' (see GroupStats).
func (r *Reducer) combine() (Stats, error) {
	e := r.e
	d := e.c.Totals().Sub(r.before)
	st := Stats{Density: e.o.Density, Threshold: math.NaN(), BytesSent: d.BytesSent, BytesRecv: d.BytesRecv}
	// The range checks' flags come back with the norm's wait.
	if err := e.readRanges(); err != nil {
		return Stats{}, err
	}
	var sq []float64
	for _, s := range r.st {
		if math.IsNaN(s.ResidualSq) {
			var err error
			if sq, err = r.groupSq(); err != nil {
				return Stats{}, err
			}
			break
		}
	}
	// What the cores left to read after this wait (groupSq's; a wait of
	// its own where there was none).
	if err := e.runLater(sq != nil); err != nil {
		return Stats{}, err
	}
	if len(r.st) == 1 {
		g := r.st[0]
		st.SelectedPerWorker, st.Threshold, st.LayerK = g.SelectedPerWorker, g.Threshold, g.LayerK
	}
	distinct := 0
	var ct time.Duration
	for _, s := range r.st {
		st.Selected += s.Selected
		distinct += s.Distinct
		st.SelectTime += s.SelectTime
		ct += s.CommTime
		if len(r.st) > 1 && s.LayerK != nil {
			if st.LayerK == nil {
				st.LayerK = make([]int, len(e.o.Layout.Tensors))
			}
			for t, k := range s.LayerK {
				st.LayerK[t] += k
			}
		}
	}
	st.ActualDensity = float64(distinct) / float64(e.n)
	st.CommTime = d.Time
	if ct > 0 {
		st.CommTime = ct
	}
	var sum float64
	for g, s := range r.st {
		if math.IsNaN(s.ResidualSq) {
			sum += sq[g]
		} else {
			sum += s.ResidualSq
		}
	}
	st.ErrorNorm = math.Sqrt(sum)
	sel, err := e.selectEventsTime()
	if err != nil {
		return Stats{}, err
	}
	st.SelectTime += sel
	return st, nil
}

// groupSq is ‖residual‖² over each group, in one pass (Ops.SegmentSumSquares
// of the groups' ranges, which sums each from its start).
func (r *Reducer) groupSq() ([]float64, error) {
	n := len(r.groups)
	order := make([]int, n) // groups by ascending range
	for g := range order {
		order[g] = g
	}
	if n > 1 {
		slices.SortFunc(order, func(a, b int) int { return r.groups[a].Lo - r.groups[b].Lo })
	}
	bounds := make([]int, 0, n+1)
	for _, g := range order {
		bounds = append(bounds, r.groups[g].Lo)
	}
	bounds = append(bounds, r.e.n)
	v := &r.e.v
	ss, err := v.ops.SegmentSumSquares(v.s, r.res, bounds)
	if err != nil {
		return nil, err
	}
	sq := make([]float64, n)
	for j, g := range order {
		sq[g] = ss[j]
	}
	return sq, nil
}

// denseGroup is the dense warm-up of a method that declares one
// (Method.DenseWarmup, DDP's allreduce_first_k_steps): group g's acc
// all-reduced, out = the sum divided by the number of workers (a division,
// as the Ok-Topk code's warm-up), residual 0.
func (r *Reducer) denseGroup(ctx context.Context, g Group, acc, out, residual device.Buffer, st *GroupStats) error {
	e := r.e
	v := &e.v
	a, o, res := acc.Slice(g.Lo, g.Hi), out.Slice(g.Lo, g.Hi), residual.Slice(g.Lo, g.Hi)
	if err := v.s.Copy(o, a); err != nil {
		return err
	}
	if err := e.c.AllReduce(ctx, v.cb(o)); err != nil {
		return fmt.Errorf("dense warm-up iteration %d: all-reducing %d values: %w", e.calls, o.Len(), err)
	}
	if err := v.ops.Div(v.s, o, float32(e.c.Size())); err != nil {
		return err
	}
	if err := v.m.Fill(v.s, res, 0); err != nil {
		return err
	}
	st.Distinct, st.Selected, st.ResidualSq = g.Size(), g.Size(), 0
	return nil
}

// SetStepsPerEpoch gives the reducer the number of calls per epoch, for
// methods whose schedule counts epochs (dgc's density warm-up); without it
// such a schedule is off. Call it before the first call.
func (r *Reducer) SetStepsPerEpoch(n int) { r.e.perEpoch = max(n, 0) }

// Profiling reports whether the reducer wants the times of the next
// step's backward pass (Profiled; LAGS' adaptive density).
func (r *Reducer) Profiling() bool {
	p, ok := r.core.(Profiled)
	return ok && p.Profiling()
}

// Profile hands the core the times of a step's backward pass (see
// Profiled); a reducer that does not want them ignores them.
func (r *Reducer) Profile(ctx context.Context, c comm.Communicator, step int, final []time.Time) (string, error) {
	p, ok := r.core.(Profiled)
	if !ok || !p.Profiling() {
		return "", nil
	}
	if len(final) != len(r.e.o.Layout.Tensors) {
		return "", fmt.Errorf("sparsify: %s: %d backward times for a layout of %d tensors", r.m.Name, len(final), len(r.e.o.Layout.Tensors))
	}
	note, err := p.Profile(ctx, c, step, final)
	if err != nil {
		return "", fmt.Errorf("sparsify: %s: %w", r.m.Name, err)
	}
	if note != "" {
		note = r.m.Name + ": " + note
	}
	return note, nil
}

// State encodes what the reducer carries from one call to the next (nil
// for a method that keeps nothing): the method's name, the format version,
// then the core's values (Stateful). A state held partly in device memory
// (dgc's velocity) is read back, which can fail. A checkpoint saves it on
// every rank; a resumed run builds the reducer again with the same Options
// on the same rank and calls SetState before its first call, after which
// the reducer continues exactly as the saved one would have (bit for bit).
func (r *Reducer) State() ([]byte, error) {
	s, ok := r.core.(Stateful)
	if !ok {
		return nil, nil
	}
	if r.begun {
		return nil, fmt.Errorf("sparsify: %s: State while a call is in flight", r.m.Name)
	}
	w := newStateWriter(r.m.Name)
	if err := s.SaveState(w); err != nil {
		return nil, fmt.Errorf("sparsify: %s: state: %w", r.m.Name, err)
	}
	return w.b, nil
}

// SetState restores what State returned on the same rank of a reducer
// built with the same Options. A state of another method, of another
// format or with impossible values is an error, and the reducer is
// unchanged; a method that keeps no state accepts only an empty one. It
// must not be called while a call is in flight.
func (r *Reducer) SetState(b []byte) error {
	s, ok := r.core.(Stateful)
	if !ok {
		if len(b) > 0 {
			return fmt.Errorf("sparsify: %s keeps no state between calls, but a state of %d bytes was given (a checkpoint of another method?)", r.m.Name, len(b))
		}
		return nil
	}
	if r.begun {
		return fmt.Errorf("sparsify: %s: SetState while a call is in flight", r.m.Name)
	}
	d := newStateReader(b, r.m.Name)
	if d.err != nil {
		return d.err
	}
	if err := s.LoadState(d); err != nil {
		return fmt.Errorf("sparsify: %s: %w", r.m.Name, err)
	}
	return nil
}

// Stateful is a Core whose output depends on the calls before it:
// counters that seed random draws or rotate a leader, thresholds that adapt
// from call to call, re-balanced regions, LAGS' backward times and network
// model. The frame writes the state's header (the method's name and the
// format version) and reads it back (Reducer.State, SetState).
type Stateful interface {
	Core
	// SaveState writes the state's values.
	SaveState(w *StateWriter) error
	// LoadState reads them back (StateReader.Done says whether they were
	// all valid), and changes nothing when they are not.
	LoadState(r *StateReader) error
}

// denseWarmupName is the name of the option of the frame's dense warm-up
// (Method.DenseWarmup).
const denseWarmupName = "dense_warmup"

// DenseWarmupParam declares the option dense_warmup with a method's
// default: the number of initial calls that all-reduce the gradient densely
// before the method sparsifies (the frame's, Method.DenseWarmup; dragonn
// runs its own). dragonn, oktopk and topkdsa share it (one option, one
// flag, each method with its own default): a run uses one method, and the
// warm-up means the same for all three.
func DenseWarmupParam(def int) options.Option {
	return options.Option{Key: denseWarmupName, Kind: options.Int, Default: def, Range: options.Within(0, math.MaxInt32, "[]"), Zero: "none",
		Doc: "dense all-reduce iterations before sparsifying"}
}
