package sparsify

import (
	"context"
	_ "embed"
	"errors"
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
	Register(Method{Name: "lags", Projectable: true, Pipelined: true, New: newLAGS, Advice: lagsAdvice,
		Kernels: []*device.Kernel{rangeFlagKernel, lagsDistinct}, Density: lagsDensity, Check: lagsCheckRun, Notes: lagsNotes,
		Doc: "reference notes 5: per merge group top-k and all-gathers, the groups reduced during the backward pass (pipelined), optional adaptive density (eq. 19 with c_u an upper bound on the compression, as the paper's text says: densities in [1/c_u, 1]; the formula as printed makes it a lower bound). Deviations: a group's elements are taken in layout order (the reference concatenates them in backward order: only tie order differs); when no ratio hides the communication, 1/c_u is used; adjacent groups ready together (every group with -overlap off) share one pair of all-gathers (the same elements and bytes in fewer messages).",
		Params: []options.Option{
			{Key: "merge_size", Kind: options.Int, Default: LAGSDefaultMergeSize, Range: options.Within(1, math.MaxInt32, "[]"),
				Doc: "merge threshold in elements (1: one group per tensor)"},
			{Key: "max_ratio", Kind: options.Float, Default: 0.0, Range: options.AtLeast(1), Zero: "off",
				Doc: "upper bound c_u >= 1 on the compression ratio of the adaptive per-group density (densities in [1/c_u, 1])"},
		}})
}

// LAGSDefaultMergeSize is the default of LAGS' option merge_size, the merge
// threshold in elements (the reference scripts' default).
const LAGSDefaultMergeSize = 8192

// LAGSGroups forms the merge groups of LAGS-SGD: it walks the tensors of l in
// reverse (backward) order accumulating element counts and closes a group at
// the first tensor where the running count reaches mergeSize or more; the last,
// possibly smaller, group is kept. mergeSize <= 1 gives one group per tensor
// (the reference's threshold 0). The groups are returned in the order their
// gradients become final during the backward pass.
func LAGSGroups(l Layout, mergeSize int) []Group {
	return backwardGroups(l, float64(mergeSize), float64(mergeSize))
}

// backwardGroups walks the tensors of l in reverse (backward) order, adding
// each to the current group, and closes the group at the first tensor where
// its element count reaches first (the first group) or rest (the others);
// the last, possibly smaller, group is kept. A tensor is never split. The
// groups are returned in the order their gradients become final during the
// backward pass (LAGS' merge groups, dense's DDP buckets).
func backwardGroups(l Layout, first, rest float64) []Group {
	var groups []Group
	var cur Group
	count, limit := 0, first
	for t := len(l.Tensors) - 1; t >= 0; t-- {
		tt := l.Tensors[t]
		if len(cur.Tensors) == 0 {
			cur.Hi = tt.Offset + tt.Size
		}
		cur.Tensors = append(cur.Tensors, t)
		cur.Lo = tt.Offset
		count += tt.Size
		if float64(count) >= limit {
			groups = append(groups, cur)
			cur, count, limit = Group{}, 0, rest
		}
	}
	if len(cur.Tensors) > 0 {
		groups = append(groups, cur)
	}
	return groups
}

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
		return LAGSModel{}, fmt.Errorf("%w", err)
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
				return 0, fmt.Errorf("measuring the network with all-gathers of %d elements: %w", m, err)
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
		return LAGSModel{}, fmt.Errorf("combining the network measurements: %w", err)
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
//     zeroed; two all-gathers (float32 values, int32 indices, k per
//     worker); out over the group = (Σ_w scatter of worker w's values,
//     added in rank order)/n. Elements are taken in flat (layout) order within
//     a group, where the reference concatenates the group's tensors in
//     backward order: only the order of equal-magnitude ties differs.
//     Adjacent groups started together (StartSet) share the two
//     all-gathers: each rank's values, then its indices (relative to the
//     run's start), of all of them — the same elements and bytes as the
//     reference's pair per group, in fewer messages.
//   - A group kept dense (k = m: density 1, a one-element group, or the
//     adaptive rule's choice) is all-reduced instead (startDense): one
//     all-reduce of its m values, out = sum/n, residual 0, as the authors'
//     cost model assumes of a dense layer, rather than n·m index/value
//     pairs gathered (about n times the bytes).
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
//     residual) and decoding times are recorded per element (TakeSparCost).
//     The backward pass is profiled (Profiled: the trainer hands over when
//     each tensor's gradient became final): lagsProfileSteps steps after
//     lagsProfileWarmup, the mean per-tensor backward times and the
//     sparsification cost, each the maximum over the ranks (all-gathered),
//     go to SetBackwardTimes and SetSparCost, so every rank chooses the
//     same k.
//   - The network of the model is the one the run declares or emulates,
//     Options.Network (the trainer passes -net-latency and -net-bandwidth),
//     with the measured sparsification cost (LAGSModelFromNetwork, SetSparCost). When none is declared
//     (as under mpirun, where the network is real) and the adaptive rule is
//     on, LAGS measures the network it runs on, once, in the first
//     group started after SetBackwardTimes: lagsMeasure times
//     all-gathers on the reducer's communicator, every rank adopting the
//     slowest rank's times so that all compute the same k. Until then every
//     group uses Density. SetModel overrides either. The reference code's
//     built-in 1 GbE constants (LAGSDefaultModel) are not used by default.
//   - Byte accounting: the frame's, over the call's groups (the network
//     measurement's all-gathers included).
//
// Pipelining: LAGS reduces its merge groups (Grouped) and leaves their
// all-gathers in flight (Starter); the trainer starts each group as soon as
// its gradients are final and finishes the call before the optimizer step.
// Groups ready together (the trainer's set of groups one tensor completes,
// every group in ReduceOn) are started at once (SetStarter): each run of
// adjacent sparse groups in one segmented selection, one residual pass,
// one pair of all-gathers (the groups' values and indices concatenated,
// each group's k known to every rank) and one decoding — the same
// selections, outputs and statistics as one group at a time, in fewer
// launches. The call's CommTime is the sum of the runs' from the start of
// their all-gathers to the end of their decoding, which may exceed the wall
// time as runs overlap.
//
// Selection unit: LAGS selects over merge groups, the reference code's way
// (consecutive tensors merged until merge_size elements, one top-k per
// group), not per layer and then merged as the paper's §5 describes (a top-k
// per layer, the sparse results buffered and sent together). merge_size 1
// gives one group per tensor, the paper's per-layer selection (with one
// message per layer).
//
// Memory: the LAGS paper (Algorithm 1, line 6) accumulates
// learning-rate-scaled gradients (a_t = ε_{t−1} + η·g). The trainer
// accumulates raw gradients and applies the learning rate after the
// reduction by default, as the reference code does; -feedback-lr gives the
// paper's form (the residual rescaled by η_{t−1}/η_t when the learning rate
// changes, which is the same selection and update). A library caller can
// also have it with NewMemory(N, true) and Memory.Accumulate(grad, lr) — the
// reduced output is then the update itself (θ ← θ − out, with no further
// multiplication by the learning rate) — and the reducer is unchanged.
type LAGS struct {
	b        *Env
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

	bufs     []lagsBufs
	dMeasure device.Buffer
	// dMark marks the indices a run of groups received (lagsDistinct), each
	// with its call's epoch, dEpoch (from 1; the marks are cleared when it
	// wraps): as long as the largest run.
	dMark  device.Buffer // Int32
	dEpoch uint32
	prof   lagsProfile

	// The sparsification time measured since the last TakeSparCost, and
	// the group elements it covers; on a device, spans still to be read
	// (sparSpans: their events are read once complete, never waited for in
	// a step).
	sparMu    sync.Mutex
	sparTime  time.Duration
	sparElems int64
	sparSpans []sparSpan
}

// sparSpan is a stretch of a group's sparsification on the device between
// two events of its stream, and the group elements it completes (0 for
// all but a group's last span).
type sparSpan struct {
	from, to device.Event
	elems    int
}

// lagsBufs are the reusable device buffers of a run of groups (LAGS.startRun),
// kept by its first group.
type lagsBufs struct {
	sel, allIdx   device.Buffer // Int32
	vals, allVals device.Buffer // Float32
	// counts are the per-tensor counts of a run with a group of several
	// tensors (lagsLayerK), then the distinct indices received in each
	// group (lagsDistinct); hostCounts their copy on the host, read after
	// the frame's wait.
	counts     device.Buffer // Int32
	hostCounts []int32
	// list is the run's list on the device (runList), listHost what it
	// holds.
	list     device.Buffer // Int32
	listHost []int32
}

var (
	_ Starter  = (*LAGS)(nil)
	_ Grouped  = (*LAGS)(nil)
	_ Profiled = (*LAGS)(nil)
	_ Stateful = (*LAGS)(nil)
)

// newLAGS builds LAGS on e (see LAGS).
func newLAGS(e *Env) (Core, error) {
	o := e.o
	maxRatio := o.Params.Float("max_ratio") // 0 or >= 1 (declared)
	groups := LAGSGroups(o.Layout, o.Params.Int("merge_size"))
	if maxRatio != 0 {
		switch {
		case maxRatio == 1:
			return nil, fmt.Errorf("max_ratio 1 allows only density 1 (every group dense), so the adaptive rule has nothing to choose; use max_ratio > 1 (e.g. 1000, the paper's), 0 for a fixed density, or the dense method")
		case o.Density*maxRatio < 1-1e-9:
			return nil, fmt.Errorf("Density %v compresses more than max_ratio %v allows (the groups use Density until the backward times are measured); use Density >= 1/max_ratio = %v (e.g. %v) or a larger max_ratio", o.Density, maxRatio, 1/maxRatio, 1/maxRatio)
		case len(groups) < 2:
			return nil, fmt.Errorf("merge_size %d makes the %d elements one merge group, which has no later backward computation to hide behind, so max_ratio %v would always give density 1/%v; use a smaller merge_size (1: one group per tensor) or max_ratio 0", o.Params.Int("merge_size"), o.Layout.N, maxRatio, maxRatio)
		}
	}
	l := &LAGS{
		b:        e,
		n:        e.c.Size(),
		layout:   o.Layout,
		density:  o.Density,
		maxRatio: maxRatio,
		groups:   groups,
		model:    LAGSDefaultModel,
	}
	if o.Network != (netmodel.Network{}) {
		m, err := LAGSModelFromNetwork(o.Network, 0)
		if err != nil {
			return nil, fmt.Errorf("Options.Network: %w", err)
		}
		l.model, l.haveModel = m, true
	}
	l.bufs = make([]lagsBufs, len(l.groups))
	l.ks = make([]int, len(l.groups))
	l.recomputeK()
	return l, nil
}

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
			return fmt.Errorf("model %+v has a negative, infinite or NaN parameter; every parameter is a time in seconds >= 0", m)
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
		return fmt.Errorf("sparsification cost %v s per element is negative, infinite or NaN; it is a time >= 0", perElement)
	}
	l.model.SparPerElement = perElement
	l.recomputeK()
	return nil
}

// TakeSparCost returns the sparsification time per group element measured
// since the last call (on a device, while Profiling) — every group's top-k
// selection and residual (in Start) and its decoding (in its finish),
// summed and divided by the sizes of the groups reduced — and starts a new
// measurement. It returns 0 when no group was reduced.
func (l *LAGS) TakeSparCost() float64 {
	l.sparMu.Lock()
	defer l.sparMu.Unlock()
	l.foldSpans(true)
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

// span runs f, a part of a group's sparsification that completes elems
// group elements (0: more of the group follows), and counts its time: on
// the CPU at once (recordSpar); on a device between two events of the
// stream, read when they have completed (foldSpans), so that measuring
// costs no host wait; there only while the cost is profiled (Profiling:
// nothing else reads it). from, when not nil, is an event already recorded
// where the span starts.
func (l *LAGS) span(from device.Event, elems int, f func() error) error {
	v := &l.b.v
	if !v.onCPU() && !l.Profiling() {
		return f()
	}
	if v.onCPU() {
		d, err := l.b.timed(f)
		if err != nil {
			return err
		}
		l.recordSpar(d, elems)
		return nil
	}
	if from == nil {
		var err error
		if from, err = v.s.Record(); err != nil {
			return err
		}
	}
	if err := f(); err != nil {
		return err
	}
	to, err := v.s.Record()
	if err != nil {
		return err
	}
	l.sparMu.Lock()
	l.sparSpans = append(l.sparSpans, sparSpan{from, to, elems})
	l.sparMu.Unlock()
	return nil
}

// foldSpans adds the spans whose events have completed to the measured
// time, in order, stopping at the first that has not (wait: waiting for
// it and every later one). l.sparMu is held.
func (l *LAGS) foldSpans(wait bool) {
	done := 0
	for _, sp := range l.sparSpans {
		if d, ok := sp.to.(interface{ Done() bool }); ok && !d.Done() {
			if !wait {
				break
			}
			if err := sp.to.Synchronize(); err != nil {
				break // the stream's error surfaces in its next call
			}
		}
		// A span the device could not time is left out of the measurement
		// (counted as zero it would make the selection look free).
		if d, err := device.Elapsed(sp.from, sp.to); err == nil {
			l.sparTime += max(d, 0)
			l.sparElems += int64(sp.elems)
		}
		done++
	}
	l.sparSpans = append(l.sparSpans[:0], l.sparSpans[done:]...)
}

// SetBackwardTimes gives the measured or declared backward (gradient
// computation) time of every layout tensor, in layout order; the adaptive
// density uses them from the next group started. Every rank must pass the
// same values (e.g. all-reduced maxima or rank 0's broadcast), since the
// per-group k sets the all-gather lengths. It must not be called while groups
// are in flight.
func (l *LAGS) SetBackwardTimes(perTensor []time.Duration) error {
	if len(perTensor) != len(l.layout.Tensors) {
		return fmt.Errorf("%d backward times for a layout of %d tensors; give one per tensor, in layout order", len(perTensor), len(l.layout.Tensors))
	}
	for i, d := range perTensor {
		if d < 0 {
			return fmt.Errorf("backward time %v of tensor %d (%q) is negative", d, i, l.layout.Tensors[i].Name)
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

// Reduce reduces group g: Start, then its finish.
func (l *LAGS) Reduce(ctx context.Context, g int, acc, out, residual device.Buffer, st *GroupStats) error {
	finish, err := l.Start(ctx, g, acc, out, residual, st)
	if err != nil {
		return err
	}
	return finish(ctx)
}

// Start selects group g's top-k, writes the group's residual and starts
// its two all-gathers; finish waits for them and decodes the group's out.
func (l *LAGS) Start(ctx context.Context, g int, acc, out, residual device.Buffer, st *GroupStats) (func(context.Context) error, error) {
	return l.StartSet(ctx, []int{g}, acc, out, residual, []*GroupStats{st})
}

// StartSet starts the groups gs, ready together (SetStarter): each group
// kept dense is all-reduced on its own (startDense); the sparse ones are
// started in runs of groups adjacent in the flat vector (startRun), each
// run's groups selected at once (one segmented top-k, each group with its
// own k), their residual written in one pass and their values and indices
// all-gathered in one pair of calls. The selections, residuals, outputs
// and statistics are those of Start for each group.
func (l *LAGS) StartSet(ctx context.Context, gs []int, acc, out, residual device.Buffer, sts []*GroupStats) (func(context.Context) error, error) {
	e := l.b
	v := &e.v
	if l.needsMeasurement() {
		m, err := lagsMeasure(ctx, e.c, v, &l.dMeasure)
		if err != nil {
			return nil, err
		}
		m.SparPerElement = l.model.SparPerElement // measured apart (SetSparCost)
		l.model, l.haveModel = m, true
		l.recomputeK()
	}
	var fins []func(context.Context) error
	finish := func(ctx context.Context) error {
		var first error
		for _, f := range fins {
			if err := f(ctx); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	fail := func(err error) (func(context.Context) error, error) {
		_ = finish(ctx) // the collectives started; the call fails with err
		return nil, err
	}
	stOf := make(map[int]*GroupStats, len(gs))
	var sparse []int
	for i, g := range gs {
		stOf[g] = sts[i]
		gr := l.groups[g]
		if l.ks[g] < gr.Size() {
			sparse = append(sparse, g)
			continue
		}
		f, err := l.startDense(ctx, gr, acc.Slice(gr.Lo, gr.Hi), out.Slice(gr.Lo, gr.Hi), residual.Slice(gr.Lo, gr.Hi), sts[i])
		if err != nil {
			return fail(err)
		}
		fins = append(fins, f)
	}
	slices.SortFunc(sparse, func(a, b int) int { return l.groups[a].Lo - l.groups[b].Lo })
	for len(sparse) > 0 {
		n := 1
		for n < len(sparse) && l.groups[sparse[n]].Lo == l.groups[sparse[n-1]].Hi {
			n++
		}
		f, err := l.startRun(ctx, sparse[:n], acc, out, residual, stOf)
		if err != nil {
			return fail(err)
		}
		fins = append(fins, f)
		sparse = sparse[n:]
	}
	return finish, nil
}

// startRun starts the sparse groups run, adjacent in the flat vector and
// in ascending order: it selects every group's top-k of acc at once
// (TopKSegmentsOn of the run's list, runList; TopK for a run of one
// group), writes the run's residual in one pass and starts two
// all-gathers of the run's values and indices (relative to the run's
// start, each rank's groups in ascending order: k of each, known to every
// rank); finish waits for them and decodes the run's out.
func (l *LAGS) startRun(ctx context.Context, run []int, acc, out, residual device.Buffer, stOf map[int]*GroupStats) (func(context.Context) error, error) {
	e := l.b
	v := &e.v
	lo, hi := l.groups[run[0]].Lo, l.groups[run[len(run)-1]].Hi
	a, res, o := acc.Slice(lo, hi), residual.Slice(lo, hi), out.Slice(lo, hi)
	b := &l.bufs[run[0]]
	k := 0
	for _, g := range run {
		k += l.ks[g]
	}
	list, err := l.runList(b, run, lo)
	if err != nil {
		return nil, err
	}
	sel, err := v.scratch(&b.sel, device.Int32, k)
	if err != nil {
		return nil, err
	}
	vals, err := v.scratch(&b.vals, device.Float32, k)
	if err != nil {
		return nil, err
	}
	l.sparMu.Lock()
	l.foldSpans(false) // the earlier calls' (complete by now)
	l.sparMu.Unlock()
	selTime, err := e.selectTimed(func() error {
		if len(run) == 1 {
			_, err := v.ops.TopK(v.s, sel, vals, a, k)
			return err
		}
		if err := v.ops.TopKSegmentsOn(v.s, sel, a, list, len(run), hi-lo); err != nil {
			return err
		}
		return v.ops.Gather(v.s, vals, a, sel)
	})
	if err != nil {
		return nil, err
	}
	// The selection and the residual are the first span of the run's
	// sparsification: from the selection's start (its event on a device,
	// selTime on the CPU).
	var from device.Event
	if n := len(e.selEvents); n > 0 && !v.onCPU() {
		from = e.selEvents[n-1][0]
	} else {
		l.recordSpar(selTime, 0)
	}
	if err := l.span(from, 0, func() error { return e.residualWithout(res, a, sel) }); err != nil {
		return nil, err
	}
	layerK, order, of, err := lagsLayerK(v, l.layout, l.groups, run, l.ks, sel, b)
	if err != nil {
		return nil, err
	}
	allVals, err := v.scratch(&b.allVals, device.Float32, l.n*k)
	if err != nil {
		return nil, err
	}
	allIdx, err := v.scratch(&b.allIdx, device.Int32, l.n*k)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	rv, err := e.c.IAllGather(ctx, v.cb(vals), v.cb(allVals))
	var ri comm.Request
	if err == nil {
		ri, err = e.c.IAllGather(ctx, v.cb(sel), v.cb(allIdx))
	}
	if err != nil {
		if rv != nil {
			// Release the started request; its error, if any, is the abort.
			_, _ = rv.Wait(ctx)
		}
		return nil, fmt.Errorf("starting all-gathers of %d elements: %w", k, err)
	}
	for i, g := range run {
		st := stOf[g]
		st.Selected, st.LayerK = l.ks[g], layerK[i]
	}
	first := stOf[run[0]] // the run's times, once
	first.SelectTime = selTime
	what := fmt.Sprintf("group %d", run[0])
	if len(run) > 1 {
		what = fmt.Sprintf("groups %v", run)
	}
	return func(ctx context.Context) error {
		_, errV := rv.Wait(ctx)
		_, errI := ri.Wait(ctx)
		if errV != nil {
			return fmt.Errorf("all-gathering %d values: %w", k, errV)
		}
		if errI != nil {
			return fmt.Errorf("all-gathering %d indices: %w", k, errI)
		}
		first.CommTime = time.Since(start)
		// The decode: the run's range of out, Σ_w of every worker's
		// values in rank order, divided by n. The indices are
		// range-checked and their distinct ones counted per group on the
		// device, both read after the frame's wait (Env.checkRange,
		// lagsDistinct): no wait here.
		return l.span(nil, hi-lo, func() error {
			nt := len(order)
			if err := l.countDistinct(b, allIdx, list, len(run), nt, hi-lo, func(err error) error {
				return fmt.Errorf("%s: a rank sent an index outside the %d elements (ranks disagree on the layout or the data is corrupt): %w", what, hi-lo, err)
			}); err != nil {
				return err
			}
			e.afterWait(func() {
				for j, t := range order {
					layerK[of[j]][t] = int(b.hostCounts[j])
				}
				for i, g := range run {
					stOf[g].Distinct = int(b.hostCounts[nt+i])
				}
			})
			if err := v.m.Fill(v.s, o, 0); err != nil {
				return err
			}
			for w := 0; w < l.n; w++ {
				if err := v.ops.ScatterAdd(v.s, o, allIdx.Slice(w*k, (w+1)*k), allVals.Slice(w*k, (w+1)*k), 1); err != nil {
					return err
				}
			}
			return v.ops.Div(v.s, o, float32(l.n))
		})
	}, nil
}

// runList returns the run's list on the device, as TopKSegmentsOn and
// lagsDistinct read it: the number of groups S, then each group's start,
// end (relative to lo, the run's start) and k; uploaded only when it
// differs from the last one of the run's first group (the runs and their
// k are the same every step but where the adaptive density changes).
func (l *LAGS) runList(b *lagsBufs, run []int, lo int) (device.Buffer, error) {
	w := make([]int32, 0, 1+3*len(run))
	w = append(w, int32(len(run)))
	for _, g := range run {
		gr := l.groups[g]
		w = append(w, int32(gr.Lo-lo), int32(gr.Hi-lo), int32(l.ks[g]))
	}
	grown := b.list.Len() < len(w) // a new buffer: uploaded again
	list, err := l.b.v.scratch(&b.list, device.Int32, len(w))
	if err != nil {
		return device.Buffer{}, err
	}
	if !grown && slices.Equal(w, b.listHost) {
		return list, nil
	}
	// w is not written again: the copy may read it after Copy returns.
	if err := l.b.v.s.Copy(list, device.Host(w)); err != nil {
		return device.Buffer{}, err
	}
	b.listHost = w
	return list, nil
}

// startDense starts the reduction of a group LAGS keeps dense (k = m, a
// density of 1 or the adaptive rule's choice): its acc a all-reduced, as
// the authors' cost model assumes of a dense layer, rather than all-gathered
// as n·m index/value pairs; finish divides the sum by n. The residual is
// zero; every element is selected and distinct.
func (l *LAGS) startDense(ctx context.Context, gr Group, a, o, res device.Buffer, st *GroupStats) (func(context.Context) error, error) {
	e := l.b
	v := &e.v
	if err := v.s.Copy(o, a); err != nil {
		return nil, err
	}
	if err := l.span(nil, 0, func() error { return v.m.Fill(v.s, res, 0) }); err != nil {
		return nil, err
	}
	st.LayerK = make([]int, len(l.layout.Tensors))
	for _, t := range gr.Tensors {
		st.LayerK[t] = l.layout.Tensors[t].Size
	}
	start := time.Now()
	r, err := comm.IAllReduce(ctx, e.c, v.cb(o))
	if err != nil {
		return nil, fmt.Errorf("starting the all-reduce of a dense group of %d elements: %w", gr.Size(), err)
	}
	m := gr.Size()
	st.Selected, st.Distinct, st.ResidualSq = m, m, 0
	return func(ctx context.Context) error {
		if _, err := r.Wait(ctx); err != nil {
			return fmt.Errorf("all-reducing a dense group of %d elements: %w", m, err)
		}
		st.CommTime = time.Since(start)
		return l.span(nil, m, func() error { return v.ops.Div(v.s, o, float32(l.n)) })
	}, nil
}

// lagsLayerK counts the selected indices sel of the run's groups
// (relative to the run's start) per tensor, into a vector over the
// layout's tensors for each group of the run. A run of groups of one
// tensor each has each group's k; otherwise the run's tensors are counted
// on the device (Ops.CountInTo, into b.counts[:nt], in the order of
// order) for countDistinct to copy to b.hostCounts, and the vectors are
// filled from them after the frame's wait (order[j]'s group is
// run[of[j]]). It returns the vectors, order and of (nil, and nt 0, when
// nothing is counted).
func lagsLayerK(v *vecs, lay Layout, groups []Group, run, ks []int, sel device.Buffer, b *lagsBufs) (lk [][]int, order, of []int, err error) {
	lk = make([][]int, len(run))
	several := false
	for i, g := range run {
		lk[i] = make([]int, len(lay.Tensors))
		if ts := groups[g].Tensors; len(ts) == 1 {
			lk[i][ts[0]] = ks[g]
		} else {
			several = true
		}
	}
	if !several { // all of each group's k (no count to read back)
		return lk, nil, nil, nil
	}
	for i, g := range run {
		for _, t := range groups[g].Tensors {
			order, of = append(order, t), append(of, i)
			lk[i][t] = 0
		}
	}
	// The groups are in ascending order; their tensors, by offset.
	idx := make([]int, len(order))
	for j := range idx {
		idx[j] = j
	}
	slices.SortStableFunc(idx, func(a, b int) int { return lay.Tensors[order[a]].Offset - lay.Tensors[order[b]].Offset })
	sorted, sortedOf := make([]int, len(order)), make([]int, len(order))
	for j, x := range idx {
		sorted[j], sortedOf[j] = order[x], of[x]
	}
	order, of = sorted, sortedOf
	lo := groups[run[0]].Lo
	bounds := make([]int, 0, len(order)+1)
	for _, t := range order {
		bounds = append(bounds, lay.Tensors[t].Offset-lo)
	}
	last := lay.Tensors[order[len(order)-1]]
	bounds = append(bounds, last.Offset+last.Size-lo)
	counts, err := v.scratch(&b.counts, device.Int32, len(order)+len(run))
	if err != nil {
		return nil, nil, nil, err
	}
	if err := v.ops.CountInTo(v.s, counts.Slice(0, len(order)), sel, bounds); err != nil {
		return nil, nil, nil, err
	}
	return lk, order, of, nil
}

// countDistinct range-checks idx (relative to the run's start) against
// the run's size as Env.checkRange does (wrap explains a failure), and
// counts its distinct indices per group of the run's list (S groups) into
// b.counts[nt:nt+S] on the device (lagsDistinct over l.dMark), in one
// pass; it issues the copy of b.counts[:nt+S] to b.hostCounts, which hold
// them after the stream's next wait.
func (l *LAGS) countDistinct(b *lagsBufs, idx, list device.Buffer, S, nt, size int, wrap func(error) error) error {
	v := &l.b.v
	flag, err := l.b.rangeFlag(size, wrap)
	if err != nil {
		return err
	}
	l.dEpoch++
	if l.dMark.Len() < size || l.dEpoch == 0 { // marks of no epoch
		if _, err := v.scratch(&l.dMark, device.Int32, size); err != nil {
			return err
		}
		if err := v.m.Fill(v.s, l.dMark.View(device.Float32, 0, l.dMark.Len()), 0); err != nil {
			return err
		}
		l.dEpoch = 1
	}
	counts, err := v.scratch(&b.counts, device.Int32, nt+S)
	if err != nil {
		return err
	}
	c := counts.Slice(nt, nt+S)
	if err := v.m.Fill(v.s, c.View(device.Float32, 0, S), 0); err != nil {
		return err
	}
	if idx.Len() > 0 {
		if err := v.ops.Run(v.s, lagsDistinct, idx.Len(), idx, int64(idx.Len()), int64(size), flag, l.dMark, int64(l.dEpoch), c, list); err != nil {
			return err
		}
	}
	if len(b.hostCounts) < nt+S {
		b.hostCounts = make([]int32, nt+S)
	}
	return v.s.Copy(device.Host(b.hostCounts[:nt+S]), counts)
}

//go:embed lags.cu
var lagsCUDA string

// lagsDistinct is lags.cu's k_lags_distinct (arguments idx (Int32), n
// and lim as int64, flag (one Int64, Env.rangeFlag's), mark (Int32, no
// element at epoch or above), epoch as int64, count (an Int32 per group)
// and list (a run's list, LAGS.runList)): it range-checks idx as
// rangeFlagKernel does, marks every index's element with epoch and adds
// the number of distinct indices in each group's range to the group's
// count.
var lagsDistinct = &device.Kernel{Name: "k_lags_distinct", CUDA: lagsCUDA, Host: func(n int, a ...any) {
	idx, lim, flag := a[0].(device.Buffer).Int32s(), a[2].(int64), a[3].(device.Buffer).Int64s()
	mark, epoch, count, list := a[4].(device.Buffer).Int32s(), uint32(a[5].(int64)), a[6].(device.Buffer).Int32s(), a[7].(device.Buffer).Int32s()
	for i, v := range idx[:n] {
		if v < 0 || int64(v) >= lim {
			if f := uint64(i)<<32 | uint64(uint32(v)); f < uint64(flag[0]) {
				flag[0] = int64(f)
			}
			idx[i] = 0
			continue
		}
		if uint32(mark[v]) < epoch {
			mark[v] = int32(epoch)
			j := 0
			for j+1 < int(list[0]) && v >= list[1+3*(j+1)] {
				j++
			}
			count[j]++
		}
	}
}}

// lagsAdvice: each layer group's top ρ (at least one element) all-gathered
// as indices and values, a group kept dense all-reduced (the model's groups at its merge_size; the
// adaptive density of max_ratio is not modelled). The groups are taken
// as a pipelined run (the default) starts them: each on its own, as the
// backward pass makes it ready. Groups ready together (-overlap off, or a
// model that finishes several groups' tensors at once) are started
// together (StartSet) and send one pair per run of adjacent sparse groups:
// the same elements and bytes in fewer messages.
var lagsAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		l, err := s.layout()
		if err != nil {
			return nil, err
		}
		var out []Call
		for _, g := range LAGSGroups(l, s.Params.Int("merge_size")) {
			k := min(max(int(float64(g.Size())*s.Density), 1), g.Size())
			if k == g.Size() {
				out = append(out, Call{comm.OpAllReduce, 1, float64(k)}) // kept dense
				continue
			}
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

// LAGS' adaptive density (max_ratio) needs the backward time of every
// tensor and the sparsification time per element. The first steps hold
// allocation, compilation and cold caches, so they are not measured: LAGS
// profiles lagsProfileSteps steps after lagsProfileWarmup steps of its
// process (the reference profiles 50 steps after 5; CPU steps are slow,
// and the mean of 10 is already steady).
const (
	lagsProfileWarmup = 5
	lagsProfileSteps  = 10
)

// lagsProfile accumulates the profiled steps.
type lagsProfile struct {
	seen  int     // steps of this process while profiling
	from  int     // the first profiled step (run-wide number)
	sum   []int64 // per tensor, the backward nanoseconds summed
	steps int     // steps summed
}

// Profiling reports whether LAGS profiles the backward pass: the adaptive
// density is on and its times are not set (nor restored).
func (l *LAGS) Profiling() bool { return l.Adaptive() && !l.HasBackwardTimes() }

// Profile takes one step's backward times (Profiled): it profiles the
// steps after the warm-up and, after the last one, sets the backward
// times and the sparsification cost, each the maximum over the ranks.
func (l *LAGS) Profile(ctx context.Context, c comm.Communicator, step int, final []time.Time) (string, error) {
	p := &l.prof
	p.seen++
	if p.seen <= lagsProfileWarmup {
		if p.seen == lagsProfileWarmup {
			l.TakeSparCost() // the measurement starts with the next step
			p.from = step + 1
		}
		return "", nil
	}
	nt := len(final)
	if p.sum == nil {
		p.sum = make([]int64, nt)
	}
	// Tensors become final in descending layout order; the first to be
	// final is the start of the measured backward pass.
	var prev time.Time
	for i := nt - 1; i >= 0; i-- {
		at := final[i]
		if at.IsZero() {
			continue
		}
		if !prev.IsZero() {
			p.sum[i] += max(int64(at.Sub(prev)), 0)
		}
		prev = at
	}
	p.steps++
	if p.steps < lagsProfileSteps {
		return "", nil
	}
	// The means and the cost (in femtoseconds per element), maxima over
	// the ranks.
	send := make(comm.Int64s, nt+1)
	for i, s := range p.sum {
		send[i] = s / int64(p.steps)
	}
	send[nt] = int64(math.Round(l.TakeSparCost() * 1e15))
	size := c.Size()
	recv := make(comm.Int64s, (nt+1)*size)
	if err := c.AllGather(ctx, send, recv); err != nil {
		return "", fmt.Errorf("combining the profiled backward times: %w", err)
	}
	d := make([]time.Duration, nt)
	var sparFs int64
	for r := range size {
		row := recv[r*(nt+1) : (r+1)*(nt+1)]
		for i := range d {
			d[i] = max(d[i], time.Duration(row[i]))
		}
		sparFs = max(sparFs, row[nt])
	}
	if err := l.SetSparCost(float64(sparFs) * 1e-15); err != nil {
		return "", err
	}
	if err := l.SetBackwardTimes(d); err != nil {
		return "", err
	}
	var back time.Duration
	for _, t := range d {
		back += t
	}
	lo, hi := math.Inf(1), 0.0
	for g, k := range l.ks {
		r := float64(k) / float64(l.groups[g].Size())
		lo, hi = min(lo, r), max(hi, r)
	}
	return fmt.Sprintf("adaptive density from steps %d–%d (after %d warm-up steps): backward pass %v, sparsification %.3g ns per element; the %d groups' densities now range over [%.3g, %.3g] (c_u = %g)",
		p.from, step, lagsProfileWarmup, back.Round(time.Microsecond), float64(sparFs)*1e-6, len(l.groups), lo, hi, l.maxRatio), nil
}

// SaveState writes the backward times and the network model of the
// adaptive density (measured ones cannot be measured again identically);
// the per-group k follow from them.
func (l *LAGS) SaveState(w *StateWriter) error {
	w.Bool(l.backward != nil)
	for _, d := range l.backward {
		w.Int(int(d))
	}
	w.Bool(l.haveModel)
	w.Float(l.model.Alpha)
	w.Float(l.model.Beta)
	w.Float(l.model.SparPerElement)
	return nil
}

// LoadState reads them back.
func (l *LAGS) LoadState(d *StateReader) error {
	var backward []time.Duration
	if d.Bool("backward times present") {
		backward = make([]time.Duration, len(l.layout.Tensors))
		for i := range backward {
			backward[i] = time.Duration(d.Int("backward time", 0, math.MaxInt64))
		}
	}
	have := d.Bool("model present")
	m := LAGSModel{Alpha: d.Float("latency"), Beta: d.Float("byte time"), SparPerElement: d.Float("sparsification cost")}
	if err := d.Done(); err != nil {
		return err
	}
	if m.Alpha < 0 || m.Beta < 0 || m.SparPerElement < 0 {
		return errors.New("state: a negative network model parameter")
	}
	l.backward, l.haveModel, l.model = backward, have, m
	l.recomputeK()
	return nil
}

// lagsDensity is the density of the LAGS-SGD paper where the project
// follows it: compression ratios 1000 for CNNs and 250 for its LSTM.
func lagsDensity(k ModelKind) float64 {
	switch k {
	case RNN:
		return 0.004
	case CNN:
		return 0.001
	}
	return 0
}

// lagsCheckRun refuses the adaptive density in a replay, which runs no
// backward pass to profile.
func lagsCheckRun(r Run) error {
	if r.Replay && r.Params.Float("max_ratio") > 0 {
		return fmt.Errorf("-max-ratio %g: LAGS' adaptive density is chosen from the measured backward pass, which a replay does not run (its compute is a copy of the recorded gradient); leave -max-ratio out for a fixed density", r.Params.Float("max_ratio"))
	}
	return nil
}

// lagsNotes: an adaptive density the run ends before profiling.
func lagsNotes(r Run) []string {
	if ratio := r.Params.Float("max_ratio"); ratio > 0 && r.Steps < lagsProfileWarmup+lagsProfileSteps {
		return []string{fmt.Sprintf("-max-ratio %g: the run's %d steps end before the backward pass is profiled (steps %d–%d), so every group uses -density %g and the adaptive density never acts",
			ratio, r.Steps, lagsProfileWarmup+1, lagsProfileWarmup+lagsProfileSteps, r.Density)}
	}
	return nil
}
