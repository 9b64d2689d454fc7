package advise

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// Host is what Measure found on this machine for one model: the inputs of
// every prediction. Times are in seconds. It is written as JSON (a sweep
// keeps it in its folder, so that its predictions do not change when it is
// continued).
type Host struct {
	Model   string `json:"model"`
	Dataset string `json:"dataset"`
	Preset  string `json:"preset"`
	Device  string `json:"device"`
	// Batch is the per-worker batch of the measured step.
	Batch int `json:"batch"`
	// Layout is the model's layout (its tensors' names and sizes, in
	// parameter order; their shapes unknown) and number of parameters.
	Layout layout.Layout `json:"layout"`
	// Cores and CPU describe the machine.
	Cores int    `json:"cores"`
	CPU   string `json:"cpu"`
	// StepCores is how many cores one worker's training steps kept busy:
	// the process's CPU time over the wall time of the timed steps (the
	// convolutions and matrix products run on every core). 0: unknown.
	StepCores float64 `json:"step_cores,omitempty"`
	// Forward, Backward, Compute and Update are one worker's step times
	// (median over the measured steps): Compute the forward and backward
	// pass, Update the optimizer step (with the copies around the reducer).
	Forward  float64 `json:"forward"`
	Backward float64 `json:"backward"`
	Compute  float64 `json:"compute"`
	Update   float64 `json:"update"`
	// Other is the rest of a dense step outside the phases: error feedback,
	// the copies around the reducer (t_wait − t_select − t_comm).
	Other float64 `json:"other"`
	// Steps is the number of training steps timed.
	Steps int `json:"steps"`
	// Selections are each method's measured selection time per call.
	Selections []Selection `json:"selections"`
	// NormPass is the time of one pass of Σx² over the gradient (DEFT's
	// fragment norms, which every worker computes over all of it).
	NormPass float64 `json:"norm_pass"`
	// Unions are the measured unions of the workers' selections on real
	// gradients, per density.
	Unions []Union `json:"unions"`
	// GradWorkers and GradStep say which gradients were measured: those of
	// GradWorkers workers at training step GradStep (dense training from
	// the model's initialisation).
	GradWorkers int `json:"grad_workers"`
	GradStep    int `json:"grad_step"`
	// SimSteps and SimReduces are what simulated workers of this machine
	// spend, measured at the worker counts of a sweep (Config.Simulated):
	// for Setting.Simulated, they replace the extrapolation from one
	// worker.
	SimSteps   []SimStep   `json:"sim_steps,omitempty"`
	SimReduces []SimReduce `json:"sim_reduces,omitempty"`
	// HostNets are this machine's in-process collectives as α-β networks,
	// fitted to all-reduces among simulated workers: the network of
	// simulated workers without an emulated one, which they are never faster
	// than with one.
	HostNets []HostNet `json:"host_nets"`
	// Kind is the kind of model (what is known about the methods'
	// accuracy depends on it; "" reads as OtherKind).
	Kind Kind `json:"kind,omitempty"`
	// Recording is the folder of the recorded gradients measured (train
	// advise -gradients), "" for a built-in model.
	Recording string `json:"recording,omitempty"`
	// StepSource says where Compute comes from when it was not measured
	// here: "given" (-step-time) or "recorded" (the recording's own
	// measurement, on StepDevice); "" when measured here.
	StepSource string `json:"step_source,omitempty"`
	StepDevice string `json:"step_device,omitempty"`
	// Horizons are the methods' reducers run over the horizon of the run
	// (HorizonSteps steps): what their controllers actually sent, step by
	// step. A prediction takes its actual density and bytes from them.
	Horizons     []Horizon `json:"horizons,omitempty"`
	HorizonSteps int       `json:"horizon_steps,omitempty"`
	// HorizonEpoch says the horizon is the default, one epoch of the
	// model at the horizon's workers: a prediction at P workers takes the
	// mean over one epoch at P, the horizon's first ⌈EpochSteps/P⌉ steps.
	HorizonEpoch bool `json:"horizon_epoch,omitempty"`
	// EpochSteps is one epoch of the model in the steps of one worker of
	// Batch (P workers take EpochSteps/P, rounded up); 0: not known.
	EpochSteps int `json:"epoch_steps,omitempty"`
	// Ready is, per layout tensor, when its gradient became final, in
	// seconds after the backward pass started (the gradient-ready times
	// the trainer's pipeline uses); nil: not profiled (overlapped dense
	// then spreads Backward over the tensors in proportion to their
	// sizes).
	Ready []float64 `json:"ready,omitempty"`
	// CostSource, when set, says where selection, the update and error
	// feedback come from instead of this machine (ApplyCostProfile).
	CostSource  string `json:"cost_source,omitempty"`
	CostProfile string `json:"cost_profile,omitempty"`
	// CostDetail says, cost by cost, where the profile's came from: which
	// methods' selection is the profile's own, which is derived from
	// another's kernel, which is unknown, and how the update and error
	// feedback were estimated.
	CostDetail string `json:"cost_detail,omitempty"`
}

// HostNet is the in-process collectives of Workers simulated workers as an
// α-β network: Latency makes the all-reduce of one element take its
// measured time (the median of several: with more workers than cores a
// collective waits for the scheduler), Bandwidth (bytes/s) that of the whole
// gradient.
type HostNet struct {
	Workers   int           `json:"workers"`
	Latency   time.Duration `json:"latency"`
	Bandwidth float64       `json:"bandwidth"`
}

// hostNet returns the in-process network measured for P workers, or for
// the largest measured count below P, or the smallest measured (zero cost
// if none was measured).
func (h *Host) hostNet(P int) netmodel.Network {
	best := -1
	for i, n := range h.HostNets {
		if best < 0 {
			best = i
			continue
		}
		b := h.HostNets[best].Workers
		switch {
		case b == P:
		case n.Workers <= P && (b > P || n.Workers > b): // the largest at most P
			best = i
		case b > P && n.Workers < b: // none at most P yet: the smallest
			best = i
		}
	}
	if best < 0 {
		return netmodel.Network{Bandwidth: math.Inf(1)}
	}
	n := h.HostNets[best]
	return netmodel.Network{Latency: n.Latency, Bandwidth: n.Bandwidth}
}

// SimStep is a short run of Workers simulated workers of the model with
// dense all-reduce on this machine, taking turns on its executors: the
// medians of its step records' phases (metrics.Step: the times of the
// worker the others waited for) after the first step, in seconds. Wait is
// the part after the backward pass: error feedback and the dense reducer.
type SimStep struct {
	Workers int `json:"workers"`
	// Latency and Bandwidth are the emulated network of the run (zero:
	// none).
	Latency   time.Duration `json:"latency,omitempty"`
	Bandwidth float64       `json:"bandwidth,omitempty"`
	Queue     float64       `json:"queue"`
	Compute   float64       `json:"compute"`
	Wait      float64       `json:"wait"`
	Update    float64       `json:"update"`
	Iter      float64       `json:"iter"`
	Steps     int           `json:"steps"`
}

// SimReduce is one method's reducer on Workers in-process workers of this
// machine that enter it together, fed with the model's real gradients: the
// selection, communication and other time of the worker the others waited
// for, and Lag, how much later the last worker left the reducer (the
// update's barrier waits for it), in seconds (medians over the calls).
type SimReduce struct {
	// Latency and Bandwidth are the emulated network the reducer's calls
	// took (zero: none).
	Latency   time.Duration `json:"latency,omitempty"`
	Bandwidth float64       `json:"bandwidth,omitempty"`
	Method    string        `json:"method"`
	Density   float64       `json:"density"`
	Workers   int           `json:"workers"`
	Select    float64       `json:"select"`
	Comm      float64       `json:"comm"`
	Other     float64       `json:"other"`
	Lag       float64       `json:"lag"`
}

// SimStep returns the SimStep of P workers on net (emulated; zero: none),
// if measured.
func (h *Host) SimStep(P int, net netmodel.Network) (SimStep, bool) {
	for _, s := range h.SimSteps {
		if s.Workers == P && s.Latency == net.Latency && s.Bandwidth == net.Bandwidth {
			return s, true
		}
	}
	return SimStep{}, false
}

// SimReduce returns the SimReduce of method at density on P workers on net,
// if measured (dense's at any density).
func (h *Host) SimReduce(method string, density float64, P int, net netmodel.Network) (SimReduce, bool) {
	for _, s := range h.SimReduces {
		if s.Method == method && s.Workers == P && (s.Density == density || method == "dense") &&
			s.Latency == net.Latency && s.Bandwidth == net.Bandwidth {
			return s, true
		}
	}
	return SimReduce{}, false
}

// Selection is one method's selection cost, measured on the model's layout
// with real gradients on Workers in-process workers (rank 0's
// sparsify.Stats.SelectTime: the median of several calls, for oktopk the mean
// over its 32-call schedule).
type Selection struct {
	Method  string  `json:"method"`
	Density float64 `json:"density"`
	Workers int     `json:"workers"`
	Seconds float64 `json:"seconds"`
	// Other is the reducer's work outside selection and communication
	// (decoding, the residual), measured the same way on one worker.
	Other float64 `json:"other"`
}

// Union is the growth of the union of the workers' selections with the
// number of workers, measured on real gradients at one density.
type Union struct {
	Density float64 `json:"density"`
	// TopK[p−1] is |∪ of the first p workers' top-k| / N; Threshold[p−1]
	// the same for |g| >= 1/(2√k) (the threshold method's default λ).
	TopK      []float64 `json:"topk"`
	Threshold []float64 `json:"threshold"`
}

// Setting is one configuration to predict.
type Setting struct {
	// Method is a sparsify registry name.
	Method string
	// Workers is P.
	Workers int
	// Density is ρ.
	Density float64
	// Params are the method's options (absent ones take their defaults).
	Params sparsify.Values
	// Net is the cluster network. The zero value means the host's
	// in-process collectives (simulated workers without emulation).
	Net netmodel.Network
	// NoOverlap predicts dense all-reduce after the backward pass has
	// ended (train -overlap off; DEFT's and MiCRO's released code).
	// Otherwise dense is predicted as PyTorch DDP runs it: buckets
	// (FirstBucketMB, then BucketMB, or BucketMB below) all-reduced as
	// soon as their gradients are final, during the backward pass.
	NoOverlap bool
	// BucketMB is the bucket cap of overlapped dense in megabytes (0:
	// the package's BucketMB, DDP's 25).
	BucketMB float64
	// Simulated predicts a run of Workers simulated workers on this
	// machine (train -workers P), which take turns on its cores: the
	// phases of the worker the others wait for (Host.simulated). Otherwise
	// every worker has a machine of its own (a cluster).
	Simulated bool
}

// Prediction is the projected iteration of one method. Times are in
// seconds.
type Prediction struct {
	Method  string  `json:"method"`
	Workers int     `json:"workers"`
	Density float64 `json:"density"`
	// Queue is, for simulated workers, the wait for a shared executor and
	// the other workers' turns (t_queue); 0 in a cluster.
	Queue   float64 `json:"queue"`
	Compute float64 `json:"compute"`
	Select  float64 `json:"select"`
	Comm    float64 `json:"comm"`
	Update  float64 `json:"update"`
	// Other is the rest of the step: error feedback, copies, the reducer's
	// decoding.
	Other float64 `json:"other"`
	// Iter is the time per iteration: the sum of the phases, except that
	// pipelined communication (LAGS', overlapped dense's) hides behind the
	// backward pass.
	Iter float64 `json:"iter"`
	// Overlapped says the prediction is of overlapped dense (DDP's
	// buckets), Buckets how many, Exposed the part of Comm not hidden
	// behind the backward pass (the tail after it).
	Overlapped bool    `json:"overlapped,omitempty"`
	Buckets    int     `json:"buckets,omitempty"`
	Exposed    float64 `json:"exposed,omitempty"`
	// Speedup is dense's Iter over this Iter (set by Rank).
	Speedup float64 `json:"speedup,omitempty"`
	// ActualDensity is the expected |U|/N and BytesSent one worker's
	// expected traffic per iteration: the mean over the horizon where the
	// method's reducer was run over it (Host.Horizons), else the method's
	// steady state (sparsify.Advice.Volume).
	ActualDensity float64 `json:"actual_density"`
	BytesSent     float64 `json:"bytes_sent"`
	// StartDensity and StartBytes are those of the horizon's first step,
	// Settled the step from which the actual density stays within 10 % of
	// its last value, HorizonSteps the horizon (0: no horizon simulated;
	// the steady state only).
	StartDensity float64 `json:"start_density,omitempty"`
	StartBytes   float64 `json:"start_bytes,omitempty"`
	Settled      int     `json:"settled,omitempty"`
	HorizonSteps int     `json:"horizon_steps,omitempty"`
	// Simulated is how many of the HorizonSteps the method's reducer ran
	// (Horizon.Simulated): the rest repeat its settled steps.
	Simulated int `json:"simulated,omitempty"`
	// Caveats say where the projection is weak for this method.
	Caveats []string `json:"caveats,omitempty"`
}

// selection returns the measured selection cost of method at density.
func (h *Host) selection(method string, density float64) (Selection, bool) {
	for _, s := range h.Selections {
		if s.Method == method && s.Density == density {
			return s, true
		}
	}
	return Selection{}, false
}

func (h *Host) union(density float64) (Union, bool) {
	for _, u := range h.Unions {
		if u.Density == density {
			return u, true
		}
	}
	return Union{}, false
}

// growth fits u(p)/u(1) = p^γ to the measured unions (least squares of the
// logarithms through the origin) and returns γ (1 when nothing was
// measured beyond one worker: independent selections).
func growth(u []float64) float64 {
	var num, den float64
	for p := 2; p <= len(u); p++ {
		if u[0] <= 0 || u[p-1] <= 0 {
			continue
		}
		lp := math.Log(float64(p))
		num += math.Log(u[p-1]/u[0]) * lp
		den += lp * lp
	}
	if den == 0 {
		return 1
	}
	return min(max(num/den, 0), 1)
}

// unionAt extrapolates the union of P workers' selections of sel elements
// each (out of N) with growth exponent γ: sel·P^γ, at most what P
// independent selections would give, N·(1 − (1 − sel/N)^P).
func unionAt(sel float64, N, P int, gamma float64) float64 {
	if sel <= 0 {
		return 0
	}
	f := min(sel/float64(N), 1)
	indep := float64(N) * (1 - math.Pow(1-f, float64(P)))
	return max(min(sel*math.Pow(float64(P), gamma), indep), min(sel, float64(N)))
}

// simulated turns pr, a worker's iteration on a machine of its own, into
// that of the worker the others wait for among s.Workers simulated workers
// taking turns on this machine's cores (train -workers P), by its step
// record's phases (metrics.Step):
//
//   - measured at P on the run's network (SimStep, SimReduce: a sweep's
//     measurements): the wait
//     for an executor and the others' turns, the worker's own forward and
//     backward pass and the update as a short dense run of P workers had
//     them, the update less how long that run's barrier waited for the
//     last worker out of dense all-reduce plus how long it waits for the
//     method's; the method's selection, communication and other work as
//     its reducer took them on P in-process workers with the model's real
//     gradients, plus the error feedback of the dense run (its t_wait less
//     its reducer), all over the run's emulated network.
//   - otherwise extrapolated from one worker: E = min(P, cores) executors
//     run steps at once, each on 1/E of the cores and as many BLAS threads
//     as the trainer gives P workers, so a turn takes the step's CPU time
//     times E/cores (at least the step) and the last worker waits
//     ⌈P/E⌉ − 1 turns; P selections and error feedbacks share the cores
//     (× P/cores); rank 0 alone updates the shared parameters;
//     communication is at least the in-process collectives'.
func (h *Host) simulated(pr *Prediction, s Setting, calls []Call) {
	P := s.Workers
	net := netmodel.Network{Latency: s.Net.Latency, Bandwidth: s.Net.Bandwidth}
	st, okS := h.SimStep(P, net)
	sr, okR := h.SimReduce(s.Method, s.Density, P, net)
	dr, okD := h.SimReduce("dense", 1, P, net)
	if okS && okR && okD {
		pr.Queue, pr.Compute = st.Queue, st.Compute
		ef := max(0, st.Wait-(dr.Select+dr.Comm+dr.Other))
		pr.Select, pr.Other = sr.Select, ef+sr.Other
		pr.Comm = sr.Comm
		pr.Update = max(0, st.Update-dr.Lag) + sr.Lag
		return
	}
	C := float64(max(h.Cores, 1))
	E := min(float64(P), C)
	turn := pr.Compute * max(1, max(h.StepCores, 1)*E/C)
	pr.Queue = (math.Ceil(float64(P)/E) - 1) * turn
	pr.Compute = turn
	share := max(1, float64(P)/C)
	pr.Select *= share
	pr.Other *= share
	pr.Comm = max(pr.Comm, CommTime(calls, P, h.hostNet(P)).Seconds())
}

// Predict projects one setting from the host's measurements and what the
// method's registry entry declares for the advisor (sparsify.Advice: its
// traffic, its selected and sent elements, how its selection scales, its
// caveats; sparsify.Method.Pipelined). It returns an error if the method
// cannot run on that many workers (gTop-k's powers of two, SparDL's teams),
// declares no model for the advisor, or if the host lacks a measurement
// the method needs.
func Predict(h *Host, s Setting) (Prediction, error) {
	m, ok := sparsify.Lookup(s.Method)
	if !ok {
		return Prediction{}, fmt.Errorf("advise: unknown method %q; use one of %v", s.Method, sparsify.Names())
	}
	params, err := m.Resolve(s.Params)
	if err != nil {
		return Prediction{}, fmt.Errorf("advise: %s: %w", s.Method, err)
	}
	P := s.Workers
	if P < 1 {
		return Prediction{}, fmt.Errorf("advise: %d workers: want at least 1", P)
	}
	if m.CheckWorkers != nil {
		if err := m.CheckWorkers(P, params); err != nil {
			return Prediction{}, err
		}
	}
	adv, err := advice(s.Method)
	if err != nil {
		return Prediction{}, err
	}
	if err := refusesCutOff(s.Method, h.Layout, params); err != nil {
		return Prediction{}, err
	}
	// The tensors below the size cut-off (-min-compress-size) are
	// all-reduced dense by the frame; the method reduces the others, a
	// layout of Nb elements, as the run's reducer does.
	N := h.Layout.N
	cut := cutOff(s.Method, params)
	big, dense := cutSizes(h.Layout.Sizes(), cut)
	Nb := N - dense
	pr := Prediction{Method: s.Method, Workers: P, Density: s.Density, Compute: h.Compute, Update: h.Update, Other: h.Other}
	sh := Shape{Sizes: big, N: Nb, Tensors: cutTensors(h.Layout.Tensors, cut), P: P, Density: s.Density, K: sparsify.BudgetK(s.Density, Nb), Params: params}
	var uTop, uThr []float64
	if adv.Selection != sparsify.NoSelection {
		u, ok := h.union(s.Density)
		if !ok {
			return Prediction{}, fmt.Errorf("advise: %s: no union measured at density %g; measure that density (Measure's densities)", s.Method, s.Density)
		}
		uTop, uThr = u.TopK, u.Threshold
		sel, ok := h.selection(s.Method, s.Density)
		if !ok && h.CostProfile != "" {
			return Prediction{}, fmt.Errorf("advise: %s: GPU cost unknown: the cost profile %s holds no GPU selection time for it, nor for a method whose kernel it calls; measure it with -device cuda on a GPU, or add it to the profile (advise/costprofiles/%s.json)", s.Method, h.CostProfile, h.CostProfile)
		}
		if !ok {
			return Prediction{}, fmt.Errorf("advise: %s: no selection time measured at density %g", s.Method, s.Density)
		}
		pr.Select = selectTime(adv.Selection, sel, P, h.NormPass)
		pr.Other += sel.Other
	}
	// overlap is how the workers' selections overlap on p workers, as
	// the measured unions extrapolate it.
	overlap := func(p int) sparsify.Overlap {
		return sparsify.Overlap{
			TopK: func(sel float64) float64 { return unionAt(sel, Nb, p, growth(uTop)) },
			Above: func() (sel, union float64) {
				sel = uThr[0] * float64(Nb)
				return sel, unionAt(sel, Nb, p, growth(uThr))
			},
		}
	}
	if Nb > 0 {
		sh.Sel, sh.Union = adv.Volume(sh, overlap(P))
	}
	hz, haveHz := h.horizon(s.Method, s.Density, P)
	hz = hz.first(h.HorizonAt(P))
	// A dense warm-up (dense_warmup: the frame's, DRAGONN's) all-reduces
	// the whole gradient for its first calls: those steps of the horizon
	// are dense all-reduce at P, whatever the method's plan would give
	// for a union of the whole gradient; the method's plan stands for the
	// steps after it only (sp), both mixed below by their share of the
	// horizon.
	warm := 0
	if _, ok := params["dense_warmup"]; ok && haveHz {
		warm = min(params.Int("dense_warmup"), hz.Steps)
	}
	sp := hz.from(warm)
	if haveHz && sp.Steps > 0 && Nb > 0 {
		// The controller's mean over the horizon (less the dense tensors
		// below the cut-off, which it counts), carried to P workers by its
		// ratio to the steady state at the horizon's worker count.
		at := sh
		at.P = hz.Workers
		_, steady := adv.Volume(at, overlap(hz.Workers))
		hzUnion := max(sp.MeanDensity()*float64(N)-float64(dense), 0)
		if steady > 0 {
			r := hzUnion / steady
			sh.Sel, sh.Union = min(sh.Sel*r, float64(Nb)), min(sh.Union*r, float64(Nb))
		}
		if hz.Workers == P {
			sh.Union = hzUnion
		}
	}
	var calls []Call
	if Nb > 0 {
		if calls, err = Plan(s.Method, sh); err != nil {
			return Prediction{}, err
		}
	}
	calls = withDense(calls, dense)
	hostNet := h.hostNet(P)
	net := s.Net
	if net.Bandwidth == 0 {
		net = hostNet
	}
	pr.Comm = CommTime(calls, P, net).Seconds()
	if s.Simulated {
		h.simulated(&pr, s, calls)
	}
	pr.ActualDensity = (sh.Union + float64(dense)) / float64(N)
	if pr.BytesSent, err = PlanBytes(s.Method, sh, dense); err != nil {
		return Prediction{}, err
	}
	if haveHz {
		if hz.Workers == P && sp.Steps > 0 {
			pr.BytesSent = sp.MeanBytes()
		}
		pr.HorizonSteps, pr.Settled, pr.Simulated = hz.Steps, hz.Settled, hz.Simulated
		if m := sp.MeanDensity(); m > 0 {
			pr.StartDensity = sp.Actual[0] / m * pr.ActualDensity
		}
		if m := sp.MeanBytes(); m > 0 {
			pr.StartBytes = sp.Bytes[0] / m * pr.BytesSent
		}
	}
	if warm > 0 {
		// The warm-up's steps: the whole gradient all-reduced after the
		// backward pass, no selection.
		dBytes, err := PlanBytes(s.Method, Shape{P: P}, N)
		if err != nil {
			return Prediction{}, err
		}
		f := float64(warm) / float64(hz.Steps)
		if !s.Simulated {
			pr.Comm = f*CommTime(withDense(nil, N), P, net).Seconds() + (1-f)*pr.Comm
			pr.Select *= 1 - f
		}
		pr.ActualDensity = f + (1-f)*pr.ActualDensity
		pr.BytesSent = f*dBytes + (1-f)*pr.BytesSent
		pr.StartDensity, pr.StartBytes = 1, dBytes
		if hz.Workers == P {
			pr.ActualDensity, pr.BytesSent = hz.MeanDensity(), hz.MeanBytes()
			pr.StartDensity, pr.StartBytes = hz.Actual[0], hz.Bytes[0]
		}
	}
	pr.Iter = pr.Queue + pr.Compute + pr.Select + pr.Comm + pr.Update + pr.Other
	if m.Pipelined && s.Method != "dense" {
		// The groups' selection and communication run alongside the
		// backward pass (its share of the worker's own pass). Dense's
		// buckets overlap too, each all-reduced from its ready time:
		// that schedule is below (ddpSchedule).
		bw := pr.Compute
		if h.Backward > 0 && h.Compute > 0 {
			bw *= min(1, h.Backward/h.Compute)
		}
		pr.Iter = pr.Queue + pr.Compute + max(0, pr.Select+pr.Comm-bw) + pr.Update + pr.Other
	}
	if s.Method == "dense" && !s.NoOverlap {
		// DDP: each bucket's all-reduce starts when its last gradient is
		// final; what ends after the backward pass is exposed. Simulated
		// workers overlap the same way (the emulated network's clock runs
		// during the turn of the worker the others wait for), over a
		// backward pass as long as that worker's turn makes it.
		capMB := s.BucketMB
		if capMB <= 0 {
			capMB = BucketMB
		}
		ready, _ := h.readyTimes()
		backward := h.backward()
		if s.Simulated && h.Compute > 0 {
			f := pr.Compute / h.Compute
			backward *= f
			ready = slices.Clone(ready)
			for i := range ready {
				ready[i] *= f
			}
		}
		var floors []netmodel.Network
		if s.Simulated {
			floors = append(floors, hostNet) // the in-process sums
		}
		bs := ddpSchedule(h.Layout, ready, P, net, FirstBucketMB, capMB, floors...)
		var total float64
		for _, b := range bs {
			total += b.End - b.Start
		}
		pr.Overlapped, pr.Buckets, pr.Comm = true, len(bs), total
		if len(bs) > 0 {
			pr.Exposed = max(0, bs[len(bs)-1].End-backward)
		}
		pr.Iter = pr.Queue + pr.Compute + pr.Exposed + pr.Update + pr.Other
	}
	if Nb > 0 {
		pr.Caveats = caveats(h, adv, sh)
	}
	if dense > 0 {
		pr.Caveats = append(pr.Caveats, fmt.Sprintf("the %d elements of the tensors below %s = %d are all-reduced dense, outside the method (-min-compress-size)", dense, minCompress, cut))
	}
	return pr, nil
}

// HorizonAt is the number of steps a prediction at P workers takes the
// mean over: one epoch at P where the horizon is the default epoch
// (HorizonEpoch), else the whole horizon.
func (h *Host) HorizonAt(P int) int {
	if h.HorizonEpoch && h.EpochSteps > 0 && P > 0 {
		return min((h.EpochSteps+P-1)/P, h.HorizonSteps)
	}
	return h.HorizonSteps
}

// selectTime carries the selection time measured on sel.Workers workers to
// P workers, as the method's selection scales.
func selectTime(sc sparsify.Scaling, sel Selection, P int, normPass float64) float64 {
	switch sc {
	case sparsify.SelectsShare:
		return sel.Seconds * float64(sel.Workers) / float64(P)
	case sparsify.NormsThenShare:
		// Every worker computes the norms of the whole gradient; the
		// top-k runs over its share, about N/P elements.
		return normPass + max(sel.Seconds-normPass, 0)*float64(sel.Workers)/float64(P)
	}
	return sel.Seconds
}

// caveats says where the projection of the shape sh is weak: the method's
// own caveats, then those of options every method may have.
func caveats(h *Host, adv *sparsify.Advice, sh Shape) []string {
	var c []string
	if adv.Caveats != nil {
		c = adv.Caveats(sparsify.Conditions{Shape: sh, GradWorkers: h.GradWorkers, GradStep: h.GradStep})
	}
	for _, p := range []string{"dense_warmup"} {
		if v, ok := sh.Params[p]; ok && sh.Params.Int(p) > 0 {
			c = append(c, fmt.Sprintf("the first %v iterations are dense all-reduce (-dense-warmup): the horizon's steps within them are predicted as dense all-reduce after the backward pass, the others by the method", v))
		}
	}
	return c
}

// Rank predicts every method of methods for the other settings of base
// (Method is ignored) and returns the predictions fastest first, with
// each one's speedup over dense (dense is always predicted, listed or not,
// to compute it), and the methods that cannot run there with the reason.
func Rank(h *Host, base Setting, methods []string) ([]Prediction, map[string]error, error) {
	s := base
	s.Method = "dense"
	s.Params = nil
	dense, err := Predict(h, s)
	if err != nil {
		return nil, nil, err
	}
	var out []Prediction
	skipped := map[string]error{}
	for _, m := range methods {
		s := base
		s.Method = m
		s.Params = filterParams(m, base.Params)
		p := dense
		if m != "dense" {
			if p, err = Predict(h, s); err != nil {
				skipped[m] = err
				continue
			}
		}
		p.Speedup = dense.Iter / p.Iter
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Iter < out[j].Iter })
	return out, skipped, nil
}

// filterParams keeps the options of v that method declares.
func filterParams(method string, v sparsify.Values) sparsify.Values {
	m, ok := sparsify.Lookup(method)
	if !ok || v == nil {
		return nil
	}
	return m.Applicable(v)
}

// Methods are the methods the advisor ranks by default: every registered
// method.
func Methods() []string {
	return slices.Clone(sparsify.Names())
}
