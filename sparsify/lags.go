package sparsify

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/options"
)

func init() {
	Register(Method{Name: "lags", Projectable: true, Pipelined: true, New: newLAGSReducer, Advice: lagsAdvice, Params: []options.Option{
		{Key: "merge_size", Kind: options.Int, Default: LAGSDefaultMergeSize, Range: options.Within(1, math.MaxInt32, "[]"),
			Doc: "merge threshold in elements (1: one group per tensor)"},
		{Key: "max_ratio", Kind: options.Float, Default: 0.0, Range: options.AtLeast(1), Zero: "off",
			Doc: "upper bound c_u >= 1 on the compression ratio of the adaptive per-group density (densities in [1/c_u, 1])"},
	}})
}

// LAGSDefaultMergeSize is the default of LAGS' option merge_size, the merge
// threshold in elements (the reference scripts' default).
const LAGSDefaultMergeSize = 8192

// Group is one merge group of a layout: consecutive tensors whose gradients
// are selected and communicated together.
type Group struct {
	// Tensors are the layout indices of the group's tensors in backward
	// order (descending layout index).
	Tensors []int
	// Lo and Hi delimit the group's elements [Lo, Hi) in the flat vector; the
	// tensors of a group are adjacent in the layout, so this is one range.
	Lo, Hi int
}

// Size is the number of elements of the group.
func (g Group) Size() int { return g.Hi - g.Lo }

// LAGSGroups forms the merge groups of LAGS-SGD: it walks the tensors of l in
// reverse (backward) order accumulating element counts and closes a group at
// the first tensor where the running count reaches mergeSize or more; the last,
// possibly smaller, group is kept. mergeSize <= 1 gives one group per tensor
// (the reference's threshold 0). The groups are returned in the order their
// gradients become final during the backward pass.
func LAGSGroups(l Layout, mergeSize int) []Group {
	var groups []Group
	var cur Group
	count := 0
	for t := len(l.Tensors) - 1; t >= 0; t-- {
		tt := l.Tensors[t]
		if len(cur.Tensors) == 0 {
			cur.Hi = tt.Offset + tt.Size
		}
		cur.Tensors = append(cur.Tensors, t)
		cur.Lo = tt.Offset
		count += tt.Size
		if count >= mergeSize {
			groups = append(groups, cur)
			cur, count = Group{}, 0
		}
	}
	if len(cur.Tensors) > 0 {
		groups = append(groups, cur)
	}
	return groups
}

// GroupStats describes the reduction of one merge group by one worker.
type GroupStats struct {
	// Group is the group's index in Groups().
	Group int
	// K is the number of elements every worker selected in the group.
	K int
	// Distinct is the number of distinct group positions whose values
	// crossed the wire (the union over workers).
	Distinct int
	// ResidualSq is the squared Euclidean norm of this worker's new residual
	// over the group.
	ResidualSq float64
	// TensorK is the number of this worker's selected elements in each tensor
	// of the group, in the order of Group.Tensors.
	TensorK []int
	// BytesSent and BytesRecv are this worker's traffic for the group's two
	// all-gathers, measured by the group's own comm.Counter on the buffers
	// actually handed to the communicator (comm.Traffic's ring convention).
	BytesSent, BytesRecv int64
	// SelectTime is the top-k time; CommTime runs from the start of the
	// all-gathers to the end of Wait.
	SelectTime, CommTime time.Duration
}

// Pending is the reduction of one merge group in flight.
type Pending interface {
	// Wait blocks until the group's communication has completed (or ctx
	// ends), then writes the group's range of out. It may be called once,
	// from any goroutine.
	Wait(ctx context.Context) (GroupStats, error)
}

// GroupReducer is implemented by reducers that can reduce the merge groups of
// a layout one at a time, as their gradients become final during the backward
// pass.
type GroupReducer interface {
	Reducer
	// Groups lists the merge groups in the order their gradients become
	// final (reverse layout order).
	Groups() []Group
	// StartGroup selects group g's elements of acc, writes the group's range
	// of residual, starts the non-blocking communication and returns at once.
	// acc, out and residual are full flat vectors (only the group's range is
	// used); out's range is written by Pending.Wait and must not be touched
	// before. Every rank must start the groups in the same order; several
	// groups may be in flight at once, but not the same group twice.
	StartGroup(ctx context.Context, g int, acc, out, residual []float32) (Pending, error)
}

// DeviceGroupReducer is a GroupReducer that also reduces groups of vectors
// in its device's memory (see DeviceReducer). StartGroupOn and the Waits of
// its Pendings issue work on the reducer's stream and must not run
// concurrently with each other.
type DeviceGroupReducer interface {
	GroupReducer
	DeviceReducer
	// StartGroupOn is StartGroup on vectors of the reducer's device.
	StartGroupOn(ctx context.Context, g int, acc, out, residual device.Buffer) (Pending, error)
}

// CostAdaptive is implemented by a group reducer that chooses each group's
// density from the model's measured backward times and its own
// sparsification cost (LAGS-SGD's eq. 19; *LAGS). A trainer profiles some
// steps after a warm-up and hands both over once (every rank the same
// values); a trainer needs no other knowledge of the method.
type CostAdaptive interface {
	GroupReducer
	// Adaptive reports whether the densities follow the measurements
	// (false: fixed densities, nothing to profile).
	Adaptive() bool
	// HasBackwardTimes reports whether the times were set (or restored).
	HasBackwardTimes() bool
	// TakeSparCost returns the sparsification time per element measured
	// since the last call and starts a new measurement.
	TakeSparCost() float64
	// SetSparCost and SetBackwardTimes hand over the profile.
	SetSparCost(perElement float64) error
	SetBackwardTimes(perTensor []time.Duration) error
	// GroupK is each group's current k.
	GroupK() []int
}

var _ CostAdaptive = (*LAGS)(nil)

// LAGSModel is the α-β cost model LAGS' adaptive per-group density uses: the
// time of one group's communication with k elements per worker on n workers
// is that of two ring all-gathers (float32 values and int32 indices),
//
//	t_comm(k) = 2·((n−1)·Alpha + (n−1)·4·k·Beta),
//
// and the sparsification overhead (selection and decoding) of a group of
// size m is t_spar = SparPerElement·m.
type LAGSModel struct {
	// Alpha is the latency of one message step, in seconds.
	Alpha float64
	// Beta is the transfer time of one byte, in seconds (1/bandwidth).
	Beta float64
	// SparPerElement is the sparsification cost per group element, in
	// seconds.
	SparPerElement float64
}

// LAGSModelFromNetwork is the LAGSModel of an emulated or projected network
// (Alpha = its latency, Beta = 1/its bandwidth) with the given
// sparsification cost per element in seconds. The model always uses the
// ring all-gather's (n−1)·α latency term, whatever net.AllGather selects.
func LAGSModelFromNetwork(net netmodel.Network, sparPerElement float64) (LAGSModel, error) {
	if err := net.Validate(); err != nil {
		return LAGSModel{}, fmt.Errorf("sparsify: lags: %w", err)
	}
	return LAGSModel{Alpha: net.Latency.Seconds(), Beta: 1 / net.Bandwidth, SparPerElement: sparPerElement}, nil
}

// LAGSDefaultModel is the network of the LAGS/OMGS reference code's
// predictor (utils.py: α = 4·0.436 ms, β = 4·9e-9 s per float32 element, i.e.
// about 1 GbE), with a free sparsifier. LAGS does not use it unless it is
// set with SetModel: it models the run's declared or measured network.
var LAGSDefaultModel = LAGSModel{Alpha: 4 * 0.436e-3, Beta: 9e-9}

// The all-gathers LAGS times to measure the network when none is declared:
// lagsMeasureReps each of 1 and of lagsMeasureElems float32 per rank.
const (
	lagsMeasureElems = 1 << 14
	lagsMeasureReps  = 5
)

// lagsMeasure measures the network under c for LAGSModel: it times
// all-gathers of 1 and lagsMeasureElems float32 per rank (the fastest of
// lagsMeasureReps each), takes the slowest rank's times (all-gathered, so
// every rank computes the same model) and fits the ring all-gather's cost
// (n−1)·(α + m·β) for m bytes per rank: β from the difference of the two
// sizes, α from the small one, both clamped at 0. With one rank there is
// nothing to measure: the zero model. SparPerElement is 0.
func lagsMeasure(ctx context.Context, c comm.Communicator, v *vecs, buf *device.Buffer) (LAGSModel, error) {
	n := c.Size()
	if n == 1 {
		return LAGSModel{}, nil
	}
	mem, err := v.scratch(buf, device.Float32, (n+1)*lagsMeasureElems)
	if err != nil {
		return LAGSModel{}, err
	}
	if err := v.m.Fill(v.s, mem, 0); err != nil {
		return LAGSModel{}, err
	}
	fastest := func(m int) (float64, error) {
		send, recv := v.cb(mem.Slice(0, m)), v.cb(mem.Slice(lagsMeasureElems, lagsMeasureElems+n*m))
		best := math.Inf(1)
		for range lagsMeasureReps {
			t0 := time.Now()
			if err := c.AllGather(ctx, send, recv); err != nil {
				return 0, fmt.Errorf("sparsify: lags: measuring the network with all-gathers of %d elements: %w", m, err)
			}
			best = min(best, time.Since(t0).Seconds())
		}
		return best, nil
	}
	t1, err := fastest(1)
	if err != nil {
		return LAGSModel{}, err
	}
	tm, err := fastest(lagsMeasureElems)
	if err != nil {
		return LAGSModel{}, err
	}
	mine := []float32{float32(t1), float32(tm)}
	if err := v.s.Copy(mem.Slice(0, 2), device.Host(mine)); err != nil {
		return LAGSModel{}, err
	}
	if err := c.AllGather(ctx, v.cb(mem.Slice(0, 2)), v.cb(mem.Slice(2, 2+2*n))); err != nil {
		return LAGSModel{}, fmt.Errorf("sparsify: lags: combining the network measurements: %w", err)
	}
	all := make([]float32, 2*n)
	if err := v.s.Copy(device.Host(all), mem.Slice(2, 2+2*n)); err != nil {
		return LAGSModel{}, err
	}
	if err := v.s.Synchronize(); err != nil {
		return LAGSModel{}, err
	}
	for r := range n {
		t1, tm = max(t1, float64(all[2*r])), max(tm, float64(all[2*r+1]))
	}
	steps := float64(n - 1)
	beta := max(0, (tm-t1)/(steps*4*float64(lagsMeasureElems-1)))
	alpha := max(0, t1/steps-4*beta)
	return LAGSModel{Alpha: alpha, Beta: beta}, nil
}

// LAGS is the LAGS-SGD reducer ("lags", Shi et al., ECAI'20), as the
// reference code HKBU-HPML/OMGS-SGD implements it:
//
//   - The layout is cut into merge groups (LAGSGroups with the option
//     merge_size, default LAGSDefaultMergeSize; 1 gives one group per tensor).
//   - Per group of m elements: k = max(int(m·ρ_g), 1), exact top-k (TopK) of
//     the group's acc; the residual is acc with this worker's selection
//     zeroed; two all-gathers (float32 values, int32 group-local indices, k
//     per worker); out over the group = (Σ_w scatter of worker w's values,
//     added in rank order)/n. Elements are taken in flat (layout) order within
//     a group, where the reference concatenates the group's tensors in
//     backward order: only the order of equal-magnitude ties differs.
//   - ρ_g is Options.Density unless the adaptive rule is on (the option
//     max_ratio = c_u > 0). The paper's text calls c_u "an upper bound of
//     the compression ratio (e.g. c_u = 1000)" and picks the compression
//     ratio c = m/k of layer l so that its communication and sparsification
//     hide behind the backward computation of the layers still to come;
//     its eq. 19 writes this c^(l) = max{c_u, min{c | t_comm(c) + t_spar ≤
//     t_comp^(l−1)}}, which read literally makes c_u a lower bound (never
//     less compression than c_u) and contradicts the text, and the
//     convergence bound (Theorem 1) needs c bounded above. We follow the
//     text: c^(l) = min{c_u, min{c | t_comm(c) + t_spar ≤ t_comp^(l−1)}},
//     i.e. in densities ρ_g ∈ [1/c_u, 1]: the largest density whose
//     modelled communication and sparsification (LAGSModel) hide behind the
//     backward time of the next group, never less dense than 1/c_u (k =
//     ⌈m/c_u⌉ at least); where nothing hides (the paper's set is empty) the
//     most compression allowed, 1/c_u. A group with enough backward time
//     behind it is sent dense; the last group (nothing left to hide behind)
//     gets 1/c_u. (The reference code's stub takes max(predicted, ρ) with no
//     cap and returns a constant 0.001; ADAPTIVE_SPARSE is off there.)
//     Until SetBackwardTimes is called every group uses Options.Density,
//     which must therefore be at least 1/c_u. Settings under which the rule
//     cannot act are refused: c_u = 1 (only density 1, i.e. dense) and a
//     layout that forms one merge group (nothing to hide behind).
//   - t_spar is measured, not assumed: every group's selection (top-k and
//     residual) and decoding times are recorded per element
//     (MeasuredSparCost); the trainer hands the maximum over ranks, over the
//     steps it profiles, to SetSparCost together with the backward times.
//   - The network of the model is the one the run declares or emulates,
//     Options.Network (the trainer passes -net-latency and -net-bandwidth),
//     with the measured sparsification cost (LAGSModelFromNetwork, SetSparCost). When none is declared
//     (as under mpirun, where the network is real) and the adaptive rule is
//     on, LAGS measures the network it runs on, once, in the first
//     StartGroup (or Reduce) after SetBackwardTimes: lagsMeasure times
//     all-gathers on the reducer's communicator, every rank adopting the
//     slowest rank's times so that all compute the same k. Until then every
//     group uses Density. SetModel overrides either. The reference code's
//     built-in 1 GbE constants (LAGSDefaultModel) are not used by default.
//   - Byte accounting: each group has its own comm.Counter, so the bytes of
//     a group's two all-gathers are measured on the buffers actually sent
//     (comm.Traffic of their lengths and types), also when several groups
//     are in flight at once; Reduce's bytes are the sum over groups. The
//     network measurement's all-gathers are counted in the group whose
//     StartGroup made them.
//
// Pipelining: LAGS implements GroupReducer; the trainer calls StartGroup for
// each group as soon as its gradients are final and waits for all before the
// optimizer step. Reduce is every group started in order, then all waited
// for; its CommTime is the sum of the requests' durations (from start to
// Wait), which may exceed the wall time as requests overlap.
//
// Selection unit: LAGS selects over merge groups, the reference code's way
// (consecutive tensors merged until merge_size elements, one top-k per
// group), not per layer and then merged as the paper's §5 describes (a top-k
// per layer, the sparse results buffered and sent together). merge_size 1
// gives one group per tensor, the paper's per-layer selection (with one
// message per layer).
//
// Memory: the LAGS paper (Algorithm 1, line 6) accumulates
// learning-rate-scaled gradients (a_t = ε_{t−1} + η·g). The trainer does not
// offer that variant: it accumulates raw gradients and applies the learning
// rate after the reduction, as the reference code does. A library caller
// can have it with NewMemory(N, true) and Memory.Accumulate(grad, lr) — the
// reduced output is then the update itself (θ ← θ − out, with no further
// multiplication by the learning rate) — and the reducer is unchanged.
type LAGS struct {
	gc       []*comm.Counter // one per group: bytes measured per group
	n        int
	layout   Layout
	density  float64
	maxRatio float64
	groups   []Group
	model    LAGSModel
	// haveModel: the model is declared (Options.Network, SetModel) or
	// measured; until then the adaptive rule is off.
	haveModel bool
	backward  []time.Duration // per layout tensor, nil until set
	ks        []int           // current k per group

	mu      sync.Mutex
	pending []bool // per group: started, not yet waited for
	bufs    []lagsBufs

	v        vecs
	dMeasure device.Buffer
	gb       base // device helpers of the selection (timing, residual)

	// The sparsification time measured since the last TakeSparCost, and
	// the group elements it covers.
	sparMu    sync.Mutex
	sparTime  time.Duration
	sparElems int64
}

// lagsBufs are one group's reusable device buffers.
type lagsBufs struct {
	sel, allIdx, union device.Buffer // Int32
	vals, allVals      device.Buffer // Float32
}

var _ DeviceGroupReducer = (*LAGS)(nil)

func newLAGSReducer(o Options) (Reducer, error) { return newLAGS(o) }

// NewLAGS builds the LAGS reducer from o (see LAGS) after New's checks. It
// is what New("lags", o) returns, typed, for callers that need
// SetBackwardTimes or SetModel.
func NewLAGS(o Options) (*LAGS, error) {
	m, _ := Lookup("lags")
	o, err := prepare(m, o)
	if err != nil {
		return nil, err
	}
	return newLAGS(o)
}

// newLAGS builds LAGS from prepared options (see prepare).
func newLAGS(o Options) (*LAGS, error) {
	maxRatio := o.Params.Float("max_ratio") // 0 or >= 1 (declared)
	groups := LAGSGroups(o.Layout, o.Params.Int("merge_size"))
	if maxRatio != 0 {
		switch {
		case maxRatio == 1:
			return nil, fmt.Errorf("sparsify: lags: max_ratio 1 allows only density 1 (every group dense), so the adaptive rule has nothing to choose; use max_ratio > 1 (e.g. 1000, the paper's), 0 for a fixed density, or the dense method")
		case o.Density*maxRatio < 1-1e-9:
			return nil, fmt.Errorf("sparsify: lags: Density %v compresses more than max_ratio %v allows (the groups use Density until the backward times are measured); use Density >= 1/max_ratio = %v (e.g. %v) or a larger max_ratio", o.Density, maxRatio, 1/maxRatio, 1/maxRatio)
		case len(groups) < 2:
			return nil, fmt.Errorf("sparsify: lags: merge_size %d makes the %d elements one merge group, which has no later backward computation to hide behind, so max_ratio %v would always give density 1/%v; use a smaller merge_size (1: one group per tensor) or max_ratio 0", o.Params.Int("merge_size"), o.Layout.N, maxRatio, maxRatio)
		}
	}
	l := &LAGS{
		n:        o.Comm.Size(),
		layout:   o.Layout,
		density:  o.Density,
		maxRatio: maxRatio,
		groups:   groups,
		model:    LAGSDefaultModel,
		v:        newVecs(o),
	}
	l.gb = newBase("lags", o)
	if o.Network != (netmodel.Network{}) {
		m, err := LAGSModelFromNetwork(o.Network, 0)
		if err != nil {
			return nil, fmt.Errorf("sparsify: lags: Options.Network: %w", err)
		}
		l.model, l.haveModel = m, true
	}
	l.pending = make([]bool, len(l.groups))
	l.gc = make([]*comm.Counter, len(l.groups))
	for g := range l.gc {
		l.gc[g] = comm.NewCounter(o.Comm)
	}
	l.bufs = make([]lagsBufs, len(l.groups))
	l.ks = make([]int, len(l.groups))
	l.recomputeK()
	return l, nil
}

// Name returns "lags".
func (l *LAGS) Name() string { return "lags" }

// Groups returns the merge groups in backward order. The slice must not be
// modified.
func (l *LAGS) Groups() []Group { return l.groups }

// GroupK returns the number of elements each worker selects in each group
// (in Groups() order) under the current model and backward times.
func (l *LAGS) GroupK() []int { return append([]int(nil), l.ks...) }

// SetModel sets the network and sparsification cost model of the adaptive
// density, replacing the declared (Options.Network) or measured one. Every
// rank must set the same model. It must not be called while groups are in
// flight.
func (l *LAGS) SetModel(m LAGSModel) error {
	for _, v := range []float64{m.Alpha, m.Beta, m.SparPerElement} {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("sparsify: lags: model %+v has a negative, infinite or NaN parameter; every parameter is a time in seconds >= 0", m)
		}
	}
	l.model, l.haveModel = m, true
	l.recomputeK()
	return nil
}

// SetSparCost sets t_spar of the cost model, the sparsification time per
// group element in seconds (selection, residual and decoding, as
// TakeSparCost measures it), keeping the network. Every rank must set the
// same value (e.g. the maximum over ranks). It must not be called while
// groups are in flight.
func (l *LAGS) SetSparCost(perElement float64) error {
	if !(perElement >= 0) || math.IsInf(perElement, 0) {
		return fmt.Errorf("sparsify: lags: sparsification cost %v s per element is negative, infinite or NaN; it is a time >= 0", perElement)
	}
	l.model.SparPerElement = perElement
	l.recomputeK()
	return nil
}

// TakeSparCost returns the sparsification time per group element measured
// since the last call — every group's top-k selection and residual (in
// StartGroup) and its decoding (in Wait), summed and divided by the sizes
// of the groups reduced — and starts a new measurement. It returns 0 when
// no group was reduced.
func (l *LAGS) TakeSparCost() float64 {
	l.sparMu.Lock()
	defer l.sparMu.Unlock()
	c := 0.0
	if l.sparElems > 0 {
		c = l.sparTime.Seconds() / float64(l.sparElems)
	}
	l.sparTime, l.sparElems = 0, 0
	return c
}

// recordSpar adds one group's sparsification time d over m elements.
func (l *LAGS) recordSpar(d time.Duration, m int) {
	l.sparMu.Lock()
	l.sparTime += d
	l.sparElems += int64(m)
	l.sparMu.Unlock()
}

// SetBackwardTimes gives the measured or declared backward (gradient
// computation) time of every layout tensor, in layout order; the adaptive
// density uses them from the next group started. Every rank must pass the
// same values (e.g. all-reduced maxima or rank 0's broadcast), since the
// per-group k sets the all-gather lengths. It must not be called while groups
// are in flight.
func (l *LAGS) SetBackwardTimes(perTensor []time.Duration) error {
	if len(perTensor) != len(l.layout.Tensors) {
		return fmt.Errorf("sparsify: lags: %d backward times for a layout of %d tensors; give one per tensor, in layout order", len(perTensor), len(l.layout.Tensors))
	}
	for i, d := range perTensor {
		if d < 0 {
			return fmt.Errorf("sparsify: lags: backward time %v of tensor %d (%q) is negative", d, i, l.layout.Tensors[i].Name)
		}
	}
	l.backward = append(l.backward[:0], perTensor...)
	l.recomputeK()
	return nil
}

// HasBackwardTimes reports whether SetBackwardTimes was called (or a state
// with backward times restored).
func (l *LAGS) HasBackwardTimes() bool { return l.backward != nil }

// Adaptive reports whether the adaptive per-group density is on (the option
// max_ratio is not 0): only then do the backward times of SetBackwardTimes
// matter.
func (l *LAGS) Adaptive() bool { return l.maxRatio > 0 }

// recomputeK sets l.ks from the options, the model and the backward times.
func (l *LAGS) recomputeK() {
	for g, gr := range l.groups {
		l.ks[g] = lagsGroupK(gr.Size(), l.density, l.maxRatio, l.n, l.model, l.hideTime(g), l.backward != nil && l.haveModel)
	}
}

// needsMeasurement reports whether the adaptive rule waits for a measured
// network: it is on, the backward times are known, and no model is.
func (l *LAGS) needsMeasurement() bool {
	return l.maxRatio > 0 && l.backward != nil && !l.haveModel
}

// hideTime is t_comp for group g: the backward time of group g+1 (0 for the
// last group or when no times are known).
func (l *LAGS) hideTime(g int) float64 {
	if l.backward == nil || g+1 >= len(l.groups) {
		return 0
	}
	var s time.Duration
	for _, t := range l.groups[g+1].Tensors {
		s += l.backward[t]
	}
	return s.Seconds()
}

// lagsGroupK is the per-worker k of a group of m elements (see LAGS). In
// the fixed mode (maxRatio 0), and in the adaptive mode until the backward
// times are known (haveTimes false), it is max(int(m·density), 1). In the
// adaptive mode it is eq. 19 with c_u = maxRatio an upper bound on the
// compression: the largest k whose modelled communication and
// sparsification fit in tComp seconds (the least compression that hides),
// clamped to [⌈m/c_u⌉, m]; when nothing hides (the paper's empty set) it is
// ⌈m/c_u⌉, the most compression c_u allows.
func lagsGroupK(m int, density, maxRatio float64, n int, model LAGSModel, tComp float64, haveTimes bool) int {
	if maxRatio == 0 || !haveTimes {
		return min(max(int(float64(m)*density), 1), m)
	}
	kmin := min(max(int(math.Ceil(float64(m)/maxRatio)), 1), m)
	// t_comm(k) + t_spar = fixed + perK·k must fit in tComp.
	fixed := float64(2*(n-1))*model.Alpha + model.SparPerElement*float64(m)
	perK := float64(8*(n-1)) * model.Beta
	budget := tComp - fixed
	if budget < 0 {
		return kmin // no ratio hides: the paper's set is empty
	}
	if perK == 0 || budget/perK >= float64(m) {
		return m
	}
	return max(int(budget/perK), kmin)
}

// Reduce reduces every group: all started in backward order, then all waited
// for.
func (l *LAGS) Reduce(ctx context.Context, acc, out, residual []float32) (Stats, error) {
	return l.v.reduceHost(ctx, l, "lags", acc, out, residual)
}

// ReduceOn is Reduce on vectors of the reducer's device.
func (l *LAGS) ReduceOn(ctx context.Context, acc, out, residual device.Buffer) (Stats, error) {
	if err := l.v.checkOn("lags", l.layout.N, acc, out, residual); err != nil {
		return Stats{}, err
	}
	before := l.totals()
	ps := make([]Pending, len(l.groups))
	var firstErr error
	for g := range l.groups {
		p, err := l.StartGroupOn(ctx, g, acc, out, residual)
		if err != nil {
			firstErr = err
			break
		}
		ps[g] = p
	}
	gs := make([]GroupStats, 0, len(l.groups))
	for _, p := range ps {
		if p == nil {
			continue
		}
		s, err := p.Wait(ctx)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		gs = append(gs, s)
	}
	if firstErr != nil {
		return Stats{}, firstErr
	}
	st := CombineGroupStats(l.density, l.layout, l.groups, gs)
	d := l.totals().Sub(before)
	st.BytesSent, st.BytesRecv, st.CommTime = d.BytesSent, d.BytesRecv, d.Time
	return st, nil
}

// totals sums the statistics of every group's counter.
func (l *LAGS) totals() comm.Totals {
	var t comm.Totals
	for _, c := range l.gc {
		u := c.Totals()
		t.Calls += u.Calls
		t.BytesSent += u.BytesSent
		t.BytesRecv += u.BytesRecv
		t.Time += u.Time
	}
	return t
}

// CombineGroupStats sums the GroupStats of one iteration's groups (groups as
// returned by LAGSGroups or Groups()) into the Stats of the iteration: Selected
// and LayerK from the per-group selections, ActualDensity = Σ Distinct / N,
// ErrorNorm = sqrt(Σ ResidualSq), bytes and times summed, Threshold NaN.
func CombineGroupStats(density float64, l Layout, groups []Group, gs []GroupStats) Stats {
	st := Stats{Density: density, Threshold: math.NaN(), LayerK: make([]int, len(l.Tensors))}
	distinct := 0
	var sq float64
	for _, s := range gs {
		st.Selected += s.K
		distinct += s.Distinct
		sq += s.ResidualSq
		st.BytesSent += s.BytesSent
		st.BytesRecv += s.BytesRecv
		st.SelectTime += s.SelectTime
		st.CommTime += s.CommTime
		if s.Group >= 0 && s.Group < len(groups) {
			for i, t := range groups[s.Group].Tensors {
				if i < len(s.TensorK) && t < len(st.LayerK) {
					st.LayerK[t] += s.TensorK[i]
				}
			}
		}
	}
	if l.N > 0 {
		st.ActualDensity = float64(distinct) / float64(l.N)
	}
	st.ErrorNorm = math.Sqrt(sq)
	return st
}

// StartGroup selects and starts the communication of group g (see
// GroupReducer).
func (l *LAGS) StartGroup(ctx context.Context, g int, acc, out, residual []float32) (Pending, error) {
	a, o, res, err := l.v.hostArgs("lags", acc, out, residual)
	if err != nil {
		return nil, err
	}
	return l.StartGroupOn(ctx, g, a, o, res)
}

// StartGroupOn is StartGroup on vectors of the reducer's device.
func (l *LAGS) StartGroupOn(ctx context.Context, g int, acc, out, residual device.Buffer) (Pending, error) {
	if g < 0 || g >= len(l.groups) {
		return nil, fmt.Errorf("sparsify: lags: group %d does not exist; the layout has groups 0..%d", g, len(l.groups)-1)
	}
	if err := l.v.checkOn("lags", l.layout.N, acc, out, residual); err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.pending[g] {
		l.mu.Unlock()
		return nil, fmt.Errorf("sparsify: lags: group %d started again before Wait; wait for its Pending first", g)
	}
	l.pending[g] = true
	l.mu.Unlock()

	before := l.gc[g].Totals()
	if l.needsMeasurement() {
		m, err := lagsMeasure(ctx, l.gc[g], &l.v, &l.dMeasure)
		if err != nil {
			l.done(g)
			return nil, err
		}
		m.SparPerElement = l.model.SparPerElement // measured apart (SetSparCost)
		l.model, l.haveModel = m, true
		l.recomputeK()
	}
	gr := l.groups[g]
	k := l.ks[g]
	b := &l.bufs[g]
	v := &l.v
	a := acc.Slice(gr.Lo, gr.Hi)
	res := residual.Slice(gr.Lo, gr.Hi)
	fail := func(err error) (Pending, error) {
		l.done(g)
		return nil, fmt.Errorf("sparsify: lags: group %d: %w", g, err)
	}
	sel, err := v.scratch(&b.sel, device.Int32, k)
	if err != nil {
		return fail(err)
	}
	vals, err := v.scratch(&b.vals, device.Float32, k)
	if err != nil {
		return fail(err)
	}
	selTime, err := l.gb.timed(func() error {
		var err error
		k, err = v.ops.TopK(v.s, sel, vals, a, k)
		return err
	})
	if err != nil {
		return fail(err)
	}
	resTime, err := l.gb.timed(func() error { return l.gb.residualWithout(res, a, sel.Slice(0, k)) })
	if err != nil {
		return fail(err)
	}
	p := &lagsPending{l: l, g: g, k: k, out: out.Slice(gr.Lo, gr.Hi), res: res, selTime: selTime, sparTime: selTime + resTime, before: before, start: time.Now()}
	if p.tensorK, err = lagsTensorK(v, l.layout, gr, sel); err != nil {
		return fail(err)
	}
	allVals, err := v.scratch(&b.allVals, device.Float32, l.n*k)
	if err != nil {
		return fail(err)
	}
	allIdx, err := v.scratch(&b.allIdx, device.Int32, l.n*k)
	if err != nil {
		return fail(err)
	}
	p.rv, err = l.gc[g].IAllGather(ctx, v.cb(vals), v.cb(allVals))
	if err == nil {
		p.ri, err = l.gc[g].IAllGather(ctx, v.cb(sel), v.cb(allIdx))
	}
	if err != nil {
		if p.rv != nil {
			// Release the started request; its error, if any, is the abort.
			_, _ = p.rv.Wait(ctx)
		}
		l.done(g)
		return nil, fmt.Errorf("sparsify: lags: group %d: starting all-gathers of %d elements: %w", g, k, err)
	}
	return p, nil
}

func (l *LAGS) done(g int) {
	l.mu.Lock()
	l.pending[g] = false
	l.mu.Unlock()
}

// lagsTensorK counts the selected group-local indices sel per tensor of
// the group, in Group.Tensors order (which may be backward order; the
// tensors are contiguous in the layout).
func lagsTensorK(v *vecs, lay Layout, gr Group, sel device.Buffer) ([]int, error) {
	order := slices.Clone(gr.Tensors)
	slices.SortFunc(order, func(a, b int) int { return lay.Tensors[a].Offset - lay.Tensors[b].Offset })
	bounds := make([]int, 0, len(order)+1)
	for _, t := range order {
		bounds = append(bounds, lay.Tensors[t].Offset-gr.Lo)
	}
	last := lay.Tensors[order[len(order)-1]]
	bounds = append(bounds, last.Offset+last.Size-gr.Lo)
	counts, err := v.ops.CountIn(v.s, sel, bounds)
	if err != nil {
		return nil, err
	}
	byTensor := make(map[int]int, len(order))
	for i, t := range order {
		byTensor[t] = counts[i]
	}
	tk := make([]int, len(gr.Tensors))
	for i, t := range gr.Tensors {
		tk[i] = byTensor[t]
	}
	return tk, nil
}

// lagsPending is one group's reduction in flight.
type lagsPending struct {
	l       *LAGS
	g, k    int
	out     device.Buffer // the group's range
	res     device.Buffer // the group's range
	rv, ri  comm.Request
	tensorK []int
	selTime time.Duration
	// sparTime is the selection's and the residual's time, to which Wait
	// adds the decoding's (TakeSparCost).
	sparTime time.Duration
	before   comm.Totals // the group's counter at the start of StartGroup
	start    time.Time
	once     sync.Once
}

// Wait completes the group's all-gathers and decodes them into out.
func (p *lagsPending) Wait(ctx context.Context) (GroupStats, error) {
	var st GroupStats
	var err error
	called := false
	p.once.Do(func() { called = true; st, err = p.wait(ctx) })
	if !called {
		return GroupStats{}, fmt.Errorf("sparsify: lags: Wait called twice for group %d", p.g)
	}
	return st, err
}

func (p *lagsPending) wait(ctx context.Context) (GroupStats, error) {
	l := p.l
	defer l.done(p.g)
	_, errV := p.rv.Wait(ctx)
	_, errI := p.ri.Wait(ctx)
	if errV != nil {
		return GroupStats{}, fmt.Errorf("sparsify: lags: group %d: all-gathering %d values: %w", p.g, p.k, errV)
	}
	if errI != nil {
		return GroupStats{}, fmt.Errorf("sparsify: lags: group %d: all-gathering %d indices: %w", p.g, p.k, errI)
	}
	commTime := time.Since(p.start)
	b := &l.bufs[p.g]
	gr := l.groups[p.g]
	v := &l.v
	allIdx, allVals := b.allIdx.Slice(0, l.n*p.k), b.allVals.Slice(0, l.n*p.k)
	// The decode: the group's range of out, Σ_w of every worker's values in
	// rank order, divided by n. The union (with the range check) counts the
	// distinct indices.
	// The union's scratch is the group's own: groups are waited for
	// concurrently.
	u, err := v.scratch(&b.union, device.Int32, allIdx.Len())
	if err != nil {
		return GroupStats{}, err
	}
	var distinct int
	decTime, err := l.gb.timed(func() error {
		var err error
		distinct, err = v.ops.Union(v.s, u, allIdx, gr.Size())
		if err != nil {
			return fmt.Errorf("sparsify: lags: group %d: a rank sent an index outside the group's %d elements (ranks disagree on the layout or the data is corrupt): %w", p.g, gr.Size(), err)
		}
		if err := v.m.Fill(v.s, p.out, 0); err != nil {
			return err
		}
		for w := 0; w < l.n; w++ {
			if err := v.ops.ScatterAdd(v.s, p.out, allIdx.Slice(w*p.k, (w+1)*p.k), allVals.Slice(w*p.k, (w+1)*p.k), 1); err != nil {
				return err
			}
		}
		return v.ops.Div(v.s, p.out, float32(l.n))
	})
	if err != nil {
		return GroupStats{}, err
	}
	l.recordSpar(p.sparTime+decTime, gr.Size())
	moved := l.gc[p.g].Totals().Sub(p.before)
	sq, err := v.ops.SegmentSumSquares(v.s, p.res, []int{0, p.res.Len()})
	if err != nil {
		return GroupStats{}, err
	}
	return GroupStats{
		Group:      p.g,
		K:          p.k,
		Distinct:   distinct,
		ResidualSq: sq[0],
		TensorK:    p.tensorK,
		BytesSent:  moved.BytesSent,
		BytesRecv:  moved.BytesRecv,
		SelectTime: p.selTime,
		CommTime:   commTime,
	}, nil
}

// lagsAdvice: each layer group's top ρ (at least one element) all-gathered
// as indices and values (the model's groups at its merge_size; the
// adaptive density of max_ratio is not modelled).
var lagsAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		l, err := s.layout()
		if err != nil {
			return nil, err
		}
		var out []Call
		for _, g := range LAGSGroups(l, s.Params.Int("merge_size")) {
			k := min(max(int(float64(g.Size())*s.Density), 1), g.Size())
			out = append(out, Call{comm.OpAllGather, 2, float64(k)})
		}
		return out, nil
	},
	Volume:    topkVolume,
	Selection: SelectsWhole,
	Caveats: func(c Conditions) []string {
		return append(buildUp(c), "assumes the pipeline hides the communication behind the backward pass")
	},
	Evidence: Evidence{Shown: []ModelKind{CNN, RNN},
		Papers: "LAGS-SGD paper: ResNet-20, VGG-16 (CIFAR-10), ResNet-50 (ImageNet), LSTM-PTB; slight losses (ResNet-20 90.2 % vs 90.9 %, LSTM perplexity 109 vs 107)"},
}
