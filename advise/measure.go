package advise

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/atomicfile"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/rundir"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// Config says what Measure measures.
type Config struct {
	// Train is the model to measure: model, data set, data folder, size
	// preset, device, batch, BLAS, seed as train.Config has them; the
	// sparsifier, worker count, output folder and budget are Measure's.
	Train train.Config
	// Densities are the densities to measure selections and unions at.
	Densities []float64
	// Methods are the methods whose selection to measure (default: every
	// registered method).
	Methods []string
	// Params are method options, by name; each method takes those it
	// declares (dense_warmup is always 0: the warm-up is not the selection).
	Params sparsify.Values
	// Steps is the number of training steps timed (default 12; the first is
	// not counted).
	Steps int
	// Horizon is how many steps each method's reducer runs, with error
	// feedback, on the measured gradients (those of every step: the
	// gradients of one step repeated) to predict what its controller sends
	// over a run (Host.Horizons). 0: one epoch of the model at the
	// horizon's workers (horizon.go says why that is affordable);
	// negative: none (the steady state only).
	Horizon int
	// GradWorkers is the number of workers whose gradients are measured
	// (default 4).
	GradWorkers int
	// HostWorkers are the numbers of simulated workers whose in-process
	// collectives to measure (default 2; a sweep passes its worker counts).
	HostWorkers []int
	// Simulated also measures, at each of HostWorkers (P >= 2), what
	// simulated runs of P workers on this machine spend: a short run with
	// dense all-reduce (SimStep) and every method's reducer on P in-process
	// workers fed with the model's real gradients (SimReduce), for the
	// predictions of Setting.Simulated (a sweep's). The gradients are then
	// captured from as many workers as the largest of HostWorkers (4 at
	// least, 16 at most), so that unions of many workers are real ones.
	Simulated bool
	// Networks are the emulated networks the simulated runs use (a
	// sweep's; only Latency and Bandwidth count): each is measured apart.
	// Empty: in-process communication only.
	Networks []netmodel.Network
	// Log receives one line per stage (nil: none).
	Log io.Writer
}

// Measure measures on this machine what the predictions need: one worker's
// training step (a short dense run of train.Run on the real data: forward,
// backward and update, the median over Steps−1 steps), the gradients of
// GradWorkers workers after three dense steps (in-process workers, their
// all-reduce buffers copied), each method's selection time on two
// in-process workers fed with those gradients, the union of the workers'
// top-k and threshold selections on them, each method's reducer over the
// horizon (Config.Horizon: one epoch by default, each reducer stopping once
// it has settled; horizon.go) on those gradients repeated, and the
// in-process collectives. It writes only into a temporary folder, which it removes.
func Measure(ctx context.Context, c Config) (*Host, error) {
	if c.Steps == 0 {
		c.Steps = 12
	}
	if c.Steps < 2 {
		return nil, fmt.Errorf("advise: %d timed steps: want at least 2 (the first is not counted)", c.Steps)
	}
	if c.GradWorkers == 0 {
		c.GradWorkers = 4
		if c.Simulated {
			for _, p := range c.HostWorkers {
				c.GradWorkers = max(c.GradWorkers, min(p, 16))
			}
		}
	}
	if c.GradWorkers < 2 {
		return nil, fmt.Errorf("advise: %d gradient workers: want at least 2 to measure unions", c.GradWorkers)
	}
	if len(c.Methods) == 0 {
		c.Methods = Methods()
	}
	for _, d := range c.Densities {
		if !(d > 0 && d <= 1) {
			return nil, fmt.Errorf("advise: density %v: want a fraction in (0, 1]", d)
		}
	}
	logf := func(format string, a ...any) {
		if c.Log != nil {
			fmt.Fprintf(c.Log, format+"\n", a...)
		}
	}
	tmp, err := os.MkdirTemp("", "sparsegrad-advise-")
	if err != nil {
		return nil, fmt.Errorf("advise: %w", err)
	}
	defer os.RemoveAll(tmp)

	base := c.Train
	base.Sparsifier, base.MethodOptions = "dense", nil
	base.Density = train.Optional[float64]{}
	base.Workers = train.Set(1)
	base.Epochs = train.Set(1 << 20)
	base.MaxTime, base.EvalEvery, base.MaxEvalBatches = 0, 0, 1
	base.Quiet, base.Resume = true, ""
	base.LogEvery = train.Set(1)
	base.NetLatency, base.NetBandwidth = 0, 0
	base = base.Defaults()
	vc := base // checked before anything is measured (each measurement sets its own Out)
	vc.Out = tmp
	if err := vc.Validate(false); err != nil {
		return nil, fmt.Errorf("advise: %w", err)
	}

	h := &Host{Model: base.Model, Dataset: base.Dataset, Preset: base.Preset, Device: base.Device, Batch: base.Batch.Value(),
		Cores: runtime.NumCPU(), CPU: cpuName(), GradWorkers: c.GradWorkers, GradStep: 3}

	logf("timing %d training steps of %s on one worker (%s)", c.Steps, base.Model, base.Device)
	tc := base
	tc.Steps = c.Steps
	tc.Out = filepath.Join(tmp, "timing")
	cpu0, wall0 := processCPU(), time.Now()
	if err := train.Run(ctx, tc, train.Options{Stdout: io.Discard, Progress: io.Discard}); err != nil {
		return nil, fmt.Errorf("advise: timing a training step: %w", err)
	}
	if cpu := processCPU() - cpu0; cpu0 > 0 && cpu > 0 {
		// The cores the steps kept busy (the start-up of the run counts too,
		// which matters only where a step takes milliseconds).
		h.StepCores = min(cpu.Seconds()/time.Since(wall0).Seconds(), float64(h.Cores))
	}
	if err := h.readTiming(filepath.Join(tc.Out, "metrics.jsonl")); err != nil {
		return nil, err
	}
	var run struct {
		End *metrics.End `json:"end"`
	}
	if err := rundir.ReadRun(tc.Out, &run); err == nil && run.End != nil {
		h.EpochSteps = run.End.StepsPerEpoch // one worker's epoch
	}

	logf("profiling when each gradient of %s becomes final in the backward pass (%d steps)", base.Model, readySteps)
	if h.Ready, err = train.GradReadyTimes(ctx, base, readySteps); err != nil {
		return nil, fmt.Errorf("advise: profiling the backward pass: %w", err)
	}

	logf("capturing the gradients of %d workers at step %d", c.GradWorkers, h.GradStep)
	grads, lay, err := captureGradients(ctx, base, c.GradWorkers, h.GradStep, filepath.Join(tmp, "grads"))
	if err != nil {
		return nil, err
	}
	h.Layout = lay

	h.NormPass = normPass(grads[0])
	for _, d := range c.Densities {
		h.Unions = append(h.Unions, unions(grads, d))
	}

	if err := h.measureSelections(ctx, device.CPU, nil, c.Methods, c.Densities, c.Params, grads, logf); err != nil {
		return nil, err
	}
	if c.Horizon > 0 || (c.Horizon == 0 && h.EpochSteps > 0) {
		run := horizonRun{P: min(c.GradWorkers, horizonWorkers), Steps: c.Horizon, Seed: base.Seed.Value(), Src: RepeatGrads(grads),
			Momentum: func(string) float64 { return runMomentum(base) }, Stationary: true}
		if h.EpochSteps > 0 {
			run.PerEpoch = (h.EpochSteps + run.P - 1) / run.P // a run of run.P workers, as train gives the reducer
		}
		if c.Horizon == 0 {
			// One epoch at the horizon's workers (the default).
			run.Steps, h.HorizonEpoch = run.PerEpoch, true
		}
		if err := h.measureHorizons(ctx, c.Methods, c.Densities, run, c.Params, logf); err != nil {
			return nil, err
		}
	} else if c.Horizon == 0 {
		return nil, fmt.Errorf("advise: the timing run of %s did not say its steps per epoch, so the default horizon (one epoch) is unknown; give the horizon in steps (train advise -steps)", base.Model)
	}
	hw := c.HostWorkers
	if len(hw) == 0 {
		hw = []int{2}
	}
	for _, p := range hw {
		if p < 2 {
			continue
		}
		logf("in-process collectives of %d workers", p)
		n, err := hostCollectives(ctx, p, h.Layout.N)
		if err != nil {
			return nil, err
		}
		h.HostNets = append(h.HostNets, n)
	}
	if !c.Simulated {
		return h, nil
	}
	methods := append([]string{"dense"}, slices.DeleteFunc(slices.Clone(c.Methods), func(m string) bool { return m == "dense" })...)
	for _, p := range hw {
		if p < 2 {
			continue
		}
		// What runs on p workers: every method (gTop-k's and SparDL's
		// counts aside) at every density, dense once.
		type job struct {
			method string
			d      float64
			params sparsify.Values
		}
		var jobs []job
		for _, m := range methods {
			dens := c.Densities
			if m == "dense" {
				dens = []float64{1}
			}
			params := filterParams(m, c.Params)
			if refusesCutOff(m, h.Layout, params) != nil || !runsOn(m, p, params) {
				continue
			}
			for _, d := range dens {
				jobs = append(jobs, job{m, d, params})
			}
		}
		nets := c.Networks
		if len(nets) == 0 {
			nets = []netmodel.Network{{}}
		}
		for ni, net := range nets {
			net = netmodel.Network{Latency: net.Latency, Bandwidth: net.Bandwidth}
			// Interleaved rounds, so that a burst of load from other jobs
			// of a shared machine hits every measurement a little instead
			// of one entirely; each measurement is the median over all its
			// rounds.
			rounds, stepTime := simRounds(h, p)
			logf("%d simulated workers, %s: %d rounds of a dense run of about %v and every method's reducer", p, NetName(net), rounds, stepTime.Round(time.Second))
			var steps []metrics.Step
			calls := make([][][]callRec, len(jobs))
			for round := range rounds {
				st, err := simStepRecords(ctx, base, p, net, stepTime, filepath.Join(tmp, fmt.Sprintf("sim-%d-%d-%d", p, ni, round)))
				if err != nil {
					return nil, err
				}
				steps = append(steps, st...)
				for j, jb := range jobs {
					rs, err := simReduceCalls(ctx, jb.method, p, jb.d, net, h.Layout, grads, jb.params, simReduceTime/time.Duration(rounds))
					if err != nil {
						return nil, err
					}
					calls[j] = append(calls[j], rs...)
				}
			}
			st, err := simStep(p, steps, stepTime)
			if err != nil {
				return nil, err
			}
			st.Latency, st.Bandwidth = net.Latency, net.Bandwidth
			h.SimSteps = append(h.SimSteps, st)
			for j, jb := range jobs {
				sr := simReduce(jb.method, p, jb.d, calls[j])
				sr.Latency, sr.Bandwidth = net.Latency, net.Bandwidth
				h.SimReduces = append(h.SimReduces, sr)
			}
		}
	}
	return h, nil
}

// runMomentum is the SGD momentum of the run c, which the methods that
// correct it apply (sparsify.Method.CorrectsMomentum); 0 with Adam.
func runMomentum(c train.Config) float64 {
	if c.Optimizer != "sgd" {
		return 0
	}
	return c.Momentum.Value()
}

// readySteps is the number of training steps whose gradient-ready times
// are profiled (the first is not counted).
const readySteps = 3

// simReduceTime is about how long a method's reducer is timed on P
// simulated workers, in all rounds.
const simReduceTime = 3 * time.Second

// simRounds returns how many interleaved rounds to measure P simulated
// workers in and how long each round's dense run trains: about 12 of
// their iterations in all (as the one worker's measured step
// extrapolates them), at least 9 s, at most 4 minutes; three rounds where
// that leaves each a few seconds, else one.
func simRounds(h *Host, p int) (int, time.Duration) {
	iter := h.Compute*math.Max(1, float64(p)*math.Max(h.StepCores, 1)/float64(max(h.Cores, 1))) + h.Update
	total := time.Duration(min(max(12*iter, 9), 240) * float64(time.Second))
	if iter < 1 {
		return 3, total / 3
	}
	return 1, total
}

// simStepRecords runs base on p simulated workers with dense all-reduce
// over net (emulated; none if zero) for about d (at least a few steps) and
// returns its step records after the first.
func simStepRecords(ctx context.Context, base train.Config, p int, net netmodel.Network, d time.Duration, out string) ([]metrics.Step, error) {
	c := base
	c.Workers = train.Set(p)
	c.NetLatency, c.NetBandwidth = net.Latency, net.Bandwidth
	c.Steps, c.MaxTime, c.Out = 1<<20, d, out
	if err := train.Run(ctx, c, train.Options{Stdout: io.Discard, Progress: io.Discard}); err != nil {
		return nil, fmt.Errorf("advise: timing %d simulated workers: %w", p, err)
	}
	return stepRecords(filepath.Join(out, "metrics.jsonl"))
}

// simStep is the SimStep of p workers from their runs' step records: the
// medians of each phase.
func simStep(p int, recs []metrics.Step, d time.Duration) (SimStep, error) {
	var q, cp, w, up, it []float64
	for _, s := range recs {
		q, cp, w = append(q, float64(s.TQueue)), append(cp, float64(s.TCompute)), append(w, float64(s.TWait))
		up, it = append(up, float64(s.TUpdate)), append(it, float64(s.TIter))
	}
	if len(it) == 0 {
		return SimStep{}, fmt.Errorf("advise: the runs of %d simulated workers logged no step after the first (a step took longer than %v)", p, d)
	}
	return SimStep{Workers: p, Queue: median(q), Compute: median(cp), Wait: median(w), Update: median(up), Iter: median(it), Steps: len(it)}, nil
}

// stepRecords reads the step records of a run's metrics after the first.
func stepRecords(path string) ([]metrics.Step, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("advise: reading a timing run: %w", err)
	}
	defer f.Close()
	var out []metrics.Step
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<26)
	for sc.Scan() {
		var s metrics.Step
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil || s.Type != metrics.TypeStep || s.Step < 2 {
			continue
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("advise: reading a timing run: %w", err)
	}
	return out, nil
}

// simReduceCalls times method's reducer on p in-process workers, worker r
// fed with gradient r mod len(grads) (a fresh copy every call, all workers
// starting together after a barrier, as simulated workers enter the
// reduction), for about d (6 to 40 calls; a method with a schedule of
// expensive and cheap calls, sparsify.Advice.Period, one period of it),
// and returns the calls after the first (of a period: every call), per
// rank.
func simReduceCalls(ctx context.Context, method string, p int, d float64, net netmodel.Network, l layout.Layout, grads [][]float32, params sparsify.Values, budget time.Duration) ([][]callRec, error) {
	params, _, _ = selectionSchedule(method, params) // the dense warm-up off
	var opts []local.Option
	if net.Bandwidth > 0 {
		opts = append(opts, local.WithNetwork(net))
	}
	period := periodOf(method)
	recs, err := timeReducer(ctx, device.CPU, nil, method, p, d, l, grads, params, func(first time.Duration) int {
		if period > 0 {
			return period
		}
		return min(40, max(6, int(budget/max(first, time.Microsecond))))
	}, opts...)
	if err != nil {
		return nil, fmt.Errorf("advise: timing %s on %d simulated workers: %w", method, p, err)
	}
	if period > 0 {
		return recs, nil // its schedule: every call counts
	}
	return recs[1:], nil
}

// selects reports whether method selects anything (its registry entry's
// sparsify.Advice.Selection is not NoSelection): only then is a selection
// time measured.
func selects(method string) bool {
	m, ok := sparsify.Lookup(method)
	return !ok || m.Advice == nil || m.Advice.Selection != sparsify.NoSelection
}

// periodOf is the length of method's schedule of expensive and cheap calls
// as its registry entry declares it (sparsify.Advice.Period; 0: none).
func periodOf(method string) int {
	if m, ok := sparsify.Lookup(method); ok && m.Advice != nil {
		return m.Advice.Period
	}
	return 0
}

// simReduce is the SimReduce of method on p workers from its timed calls:
// per call the times of the worker of the median selection time (in a
// simulated run the worker the others wait for is the one whose turn came
// last, whose reducer is any worker's and whose communication holds the
// wait for slower selections) and how much later the last worker left the
// reducer; the median of each over the calls (a method with a period: the
// mean over its periods).
func simReduce(method string, p int, d float64, recs [][]callRec) SimReduce {
	var sel, cm, other, lag []float64
	for _, call := range recs {
		order := make([]int, p)
		var last time.Duration
		for r, x := range call {
			order[r] = r
			last = max(last, x.wall)
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(call[a].sel, call[b].sel) })
		x := call[order[p/2]]
		c := min(x.comm, x.wall-x.sel)
		sel, cm = append(sel, x.sel.Seconds()), append(cm, c.Seconds())
		other, lag = append(other, (x.wall-x.sel-c).Seconds()), append(lag, (last-x.wall).Seconds())
	}
	sum := median
	if periodOf(method) > 0 {
		sum = meanOf
	}
	return SimReduce{Method: method, Density: d, Workers: p, Select: sum(sel), Comm: sum(cm), Other: sum(other), Lag: sum(lag)}
}

func meanOf(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x / float64(len(v))
	}
	return s
}

// readTiming sets the step times from a run's metrics: the medians over
// the steps after the first.
func (h *Host) readTiming(path string) error {
	recs, err := stepRecords(path)
	if err != nil {
		return err
	}
	var fw, bw, cp, up, ot []float64
	for _, s := range recs {
		fw = append(fw, float64(s.TForward))
		bw = append(bw, float64(s.TBackward))
		cp = append(cp, float64(s.TCompute))
		up = append(up, float64(s.TUpdate))
		ot = append(ot, max(float64(s.TWait)-float64(s.TSelect)-float64(s.TComm), 0))
	}
	if len(cp) == 0 {
		return errors.New("advise: the timing run logged no step after the first")
	}
	h.Forward, h.Backward, h.Compute, h.Update, h.Other, h.Steps = median(fw), median(bw), median(cp), median(up), median(ot), len(cp)+1
	return nil
}

// median of the finite values (NaN if none).
func median(v []float64) float64 {
	var f []float64
	for _, x := range v {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			f = append(f, x)
		}
	}
	if len(f) == 0 {
		return math.NaN()
	}
	slices.Sort(f)
	if len(f)%2 == 1 {
		return f[len(f)/2]
	}
	return (f[len(f)/2-1] + f[len(f)/2]) / 2
}

// capture is one worker's communicator that keeps a copy of the last
// all-reduced gradient (the dense reducer's): of the float32 buffers in
// host memory (comm.Float32s, or comm.Device buffers there) of more than
// one element that it all-reduces.
type capture struct {
	comm.Communicator
	mu   sync.Mutex
	last []float32
}

// AllReduce copies the buffer before reducing it.
func (c *capture) AllReduce(ctx context.Context, buf comm.Buffer) error {
	c.keep(buf, 0, buf.Len())
	return c.Communicator.AllReduce(ctx, buf)
}

// IAllReduceView copies the view into its place in the gradient of total
// elements before reducing it (dense's buckets).
func (c *capture) IAllReduceView(ctx context.Context, buf comm.Buffer, off, total int) (comm.Request, error) {
	c.keep(buf, off, total)
	return c.Communicator.IAllReduceView(ctx, buf, off, total)
}

// keep copies buf, elements [off, off+buf.Len()) of a vector of total
// elements, into its place in last.
func (c *capture) keep(buf comm.Buffer, off, total int) {
	b := comm.AsDevice(buf)
	if b.DType() != comm.Float32 || !b.IsHost() || total <= 1 || off < 0 || off+b.Len() > total {
		return
	}
	c.mu.Lock()
	if len(c.last) != total {
		c.last = make([]float32, total)
	}
	copy(c.last[off:], b.Float32s())
	c.mu.Unlock()
}

// captureGradients trains base densely on p in-process workers for steps
// steps (one train.Run per worker over a shared comm/local world) and
// returns each worker's gradient of the last step and the model's layout.
func captureGradients(ctx context.Context, base train.Config, p, steps int, out string) ([][]float32, layout.Layout, error) {
	w := local.New(p)
	caps := make([]*capture, p)
	errs := make([]error, p)
	var wg sync.WaitGroup
	cfg := base
	cfg.Steps = steps
	cfg.Out = out
	cfg.BLASThreads = max(1, runtime.NumCPU()/p)
	for r := range p {
		caps[r] = &capture{Communicator: w.Comm(r)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = train.Run(ctx, cfg, train.Options{Stdout: io.Discard, Progress: io.Discard, Comm: caps[r]})
			if errs[r] != nil {
				w.Abort(r, errs[r])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, layout.Layout{}, fmt.Errorf("advise: measuring gradients on %d workers: %w", p, err)
	}
	lay, err := modelLayout(ctx, base)
	if err != nil {
		return nil, layout.Layout{}, err
	}
	grads := make([][]float32, p)
	for r, c := range caps {
		if len(c.last) != lay.N {
			return nil, layout.Layout{}, fmt.Errorf("advise: worker %d all-reduced no gradient of %d elements (got %d): the dense reducer changed how it communicates", r, lay.N, len(c.last))
		}
		grads[r] = c.last
	}
	return grads, lay, nil
}

// modelLayout is the layout of c's model that the advisor measures on
// (measuredLayout).
func modelLayout(ctx context.Context, c train.Config) (layout.Layout, error) {
	ds, err := train.LoadDataset(ctx, c)
	if err != nil {
		return layout.Layout{}, fmt.Errorf("advise: %w", err)
	}
	m, err := train.NewModel(c, ds, c.Seed.Value(), nil)
	if err != nil {
		return layout.Layout{}, fmt.Errorf("advise: building %s: %w", c.Model, err)
	}
	lay, err := measuredLayout(m.Layout())
	if err != nil {
		return layout.Layout{}, fmt.Errorf("advise: the model's layout: %w", err)
	}
	return lay, nil
}

// measuredLayout is the layout of tensors ts that the advisor measures
// the methods on: their names, shapes and sizes, as the run's (the methods
// whose work depends on a tensor's shape — PowerSGD's matrices, DGC's and
// DRAGONN's rules for 1-D tensors — send what the run would send).
func measuredLayout(ts []layout.Tensor) (layout.Layout, error) {
	plain := make([]layout.Tensor, len(ts))
	for i, t := range ts {
		plain[i] = layout.Tensor{Name: t.Name, Shape: t.Shape, Size: t.Size}
	}
	return layout.Of(plain)
}

// normPass times one pass of Σx² over g (the fastest of three).
func normPass(g []float32) float64 {
	best := math.Inf(1)
	var sink float64
	for range 3 {
		t0 := time.Now()
		var s0, s1, s2, s3 float64
		i := 0
		for ; i+4 <= len(g); i += 4 {
			s0 += float64(g[i]) * float64(g[i])
			s1 += float64(g[i+1]) * float64(g[i+1])
			s2 += float64(g[i+2]) * float64(g[i+2])
			s3 += float64(g[i+3]) * float64(g[i+3])
		}
		for ; i < len(g); i++ {
			s0 += float64(g[i]) * float64(g[i])
		}
		sink += s0 + s1 + s2 + s3
		best = min(best, time.Since(t0).Seconds())
	}
	_ = sink
	return best
}

// unions measures the growth of the union of the workers' top-k and
// threshold selections at density d.
func unions(grads [][]float32, d float64) Union {
	N := len(grads[0])
	k := sparsify.BudgetK(d, N)
	lam := float32(1 / (2 * math.Sqrt(float64(k))))
	u := Union{Density: d}
	seenTop := make([]bool, N)
	seenThr := make([]bool, N)
	nTop, nThr := 0, 0
	var sel []int32
	for _, g := range grads {
		sel = sparsify.TopK(sel, g, k)
		for _, j := range sel {
			if !seenTop[j] {
				seenTop[j] = true
				nTop++
			}
		}
		sel = sparsify.SelectAbove(sel, g, lam)
		for _, j := range sel {
			if !seenThr[j] {
				seenThr[j] = true
				nThr++
			}
		}
		u.TopK = append(u.TopK, float64(nTop)/float64(N))
		u.Threshold = append(u.Threshold, float64(nThr)/float64(N))
	}
	return u
}

// selectionWorkers is the number of in-process workers selections are
// measured on.
const selectionWorkers = 2

// selectionSchedule returns how a method's selection is timed: its options
// with the dense warm-up off (the warm-up is not the selection), the
// number of calls, and what of the calls' times counts (the median after
// the first; a method with a period, sparsify.Advice.Period: the mean over
// one period, as Ok-Topk's 32 calls of one exact threshold and reused
// ones).
func selectionSchedule(method string, params sparsify.Values) (sparsify.Values, int, func([]float64) float64) {
	m, _ := sparsify.Lookup(method)
	params = maps.Clone(params)
	if params == nil {
		params = sparsify.Values{}
	}
	if _, ok := m.Param("dense_warmup"); ok {
		params["dense_warmup"] = 0
	}
	if period := periodOf(method); period > 0 {
		return params, period, meanOf
	}
	return params, 6, func(v []float64) float64 { return median(v[1:]) }
}

// measureSelections measures the selection of every method of methods
// that selects (and takes its options on h's layout) at every density on
// dev (measureSelection), and records them in h.
func (h *Host) measureSelections(ctx context.Context, dev device.Device, ops sparsify.Ops, methods []string, densities []float64, params sparsify.Values, grads [][]float32, logf func(string, ...any)) error {
	for _, d := range densities {
		for _, m := range methods {
			ps := filterParams(m, params)
			if !selects(m) || refusesCutOff(m, h.Layout, ps) != nil {
				continue // Predict says why
			}
			logf("selection of %s at density %g on %s", m, d, dev)
			s, err := measureSelection(ctx, dev, ops, m, d, h.Layout, grads, ps)
			if err != nil {
				return err
			}
			h.Selections = append(h.Selections, s)
		}
	}
	return nil
}

// measureSelection measures method's selection on dev (its operations
// ops; nil on the CPU) on selectionWorkers in-process workers, each fed
// with a measured gradient (a fresh copy every call): the slowest rank's
// selection time (CLT-k's leader, DEFT's packer), the median of 5 calls
// after one, or for a method with a period the mean over one (Ok-Topk's 32
// calls: one exact threshold, 31 reused). Other, the reducer's work outside
// selection and communication (decoding, the residual), is measured the
// same way on one worker, as the call's time outside selection: there the
// communication is nothing, where with several workers it cannot be told
// apart (LAGS' requests overlap, so their summed time exceeds the wall time
// they took).
func measureSelection(ctx context.Context, dev device.Device, ops sparsify.Ops, method string, d float64, l layout.Layout, grads [][]float32, params sparsify.Values) (Selection, error) {
	params, calls, summary := selectionSchedule(method, params)
	// slowest is, per call on p workers, the slowest rank's selection time
	// and time outside selection.
	slowest := func(p int) (sel, other []float64, err error) {
		recs, err := timeReducer(ctx, dev, ops, method, p, d, l, grads, paramsFor(method, p, params), func(time.Duration) int { return calls })
		if err != nil {
			return nil, nil, fmt.Errorf("advise: measuring the selection of %s on %d workers on %s: %w", method, p, dev, err)
		}
		for _, call := range recs {
			var s, o time.Duration
			for _, x := range call {
				s, o = max(s, x.sel), max(o, x.wall-x.sel)
			}
			sel, other = append(sel, s.Seconds()), append(other, o.Seconds())
		}
		return sel, other, nil
	}
	sel, _, err := slowest(selectionWorkers)
	if err != nil {
		return Selection{}, err
	}
	_, other, err := slowest(1)
	if err != nil {
		return Selection{}, err
	}
	return Selection{Method: method, Density: d, Workers: selectionWorkers, Seconds: summary(sel), Other: summary(other)}, nil
}

// paramsFor returns the options to measure method with on p workers:
// params when the method runs on p workers with them, else params without
// those that keep it from running there, which take their defaults
// (SparDL's teams, which must divide the workers, on the one worker that
// measures the reducer's other work).
func paramsFor(method string, p int, params sparsify.Values) sparsify.Values {
	if runsOn(method, p, params) {
		return params
	}
	out := maps.Clone(params)
	for _, k := range slices.Sorted(maps.Keys(params)) {
		delete(out, k)
		if runsOn(method, p, out) {
			return out
		}
	}
	return out
}

// runsOn reports whether method runs on p workers with the options params
// (sparsify.Method.CheckWorkers: gTop-k's powers of two, SparDL's teams).
func runsOn(method string, p int, params sparsify.Values) bool {
	m, ok := sparsify.Lookup(method)
	if !ok || m.CheckWorkers == nil {
		return true
	}
	r, err := m.Resolve(params)
	return err == nil && m.CheckWorkers(p, r) == nil
}

// callRec is one rank's times of one Reduce call.
type callRec struct{ sel, comm, wall time.Duration }

// timeReducer runs method's reducer on dev (its operations ops; nil on
// the CPU) on p in-process workers, worker r fed with gradient r mod
// len(grads) (a fresh copy every call, every worker starting the call
// after a barrier; on a GPU each worker has a stream of its own and its
// buffers are staged through host memory, as train stages them), over a
// comm/local world made with opts, and returns each call's times per
// rank. calls says how many calls to make in all from the first call's
// wall time on rank 0 (the ranks agree on rank 0's choice).
func timeReducer(ctx context.Context, dev device.Device, ops sparsify.Ops, method string, p int, d float64, l layout.Layout, grads [][]float32, params sparsify.Values, calls func(first time.Duration) int, opts ...local.Option) ([][]callRec, error) {
	var recs [][]callRec // per call, per rank
	var mu sync.Mutex
	err := local.Run(ctx, p, func(ctx context.Context, c comm.Communicator) error {
		st := dev.Stream()
		if dev.Kind() != device.CPUKind {
			var err error
			if st, err = dev.NewStream(); err != nil {
				return err
			}
			c = comm.Staged(c)
		}
		red, err := sparsify.New(method, sparsify.Options{Density: d, Layout: l, Comm: c, Seed: 1, Params: params, Stream: st, Ops: ops})
		if err != nil {
			return err
		}
		var acc, out, res device.Buffer
		for _, b := range []*device.Buffer{&acc, &out, &res} {
			if *b, err = dev.Alloc(device.Float32, l.N); err != nil {
				return err
			}
			defer dev.Free(*b)
		}
		g := device.Host(grads[c.Rank()%len(grads)])
		n := 1
		for i := 0; i < n; i++ {
			if err := st.Copy(acc, g); err != nil {
				return err
			}
			if err := st.Synchronize(); err != nil {
				return err
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			t0 := time.Now()
			s, err := red.ReduceOn(ctx, acc, out, res)
			if err == nil {
				err = st.Synchronize()
			}
			if err != nil {
				return err
			}
			r := callRec{s.SelectTime, s.CommTime, time.Since(t0)}
			if c.Rank() == 0 {
				mu.Lock()
				recs = append(recs, make([]callRec, p))
				mu.Unlock()
			}
			if err := c.Barrier(ctx); err != nil { // rank 0 has made the call's row
				return err
			}
			mu.Lock()
			recs[i][c.Rank()] = r
			mu.Unlock()
			if i == 0 {
				k := comm.Int64s{0}
				if c.Rank() == 0 {
					k[0] = int64(max(1, calls(r.wall)))
				}
				if err := c.Broadcast(ctx, k, 0); err != nil {
					return err
				}
				n = int(k[0])
			}
		}
		return nil
	}, opts...)
	return recs, err
}

// hostCollectives fits an α-β network to p in-process workers'
// all-reduces of one element and of the whole gradient (n elements, at
// least 64k): α such that the modelled one-element all-reduce takes its
// measured time, β such that the gradient's does. Each time is the median
// of several calls, each started after a barrier.
func hostCollectives(ctx context.Context, p, n int) (HostNet, error) {
	m := max(n, 1<<16)
	var t1, tn float64
	err := local.Run(ctx, p, func(ctx context.Context, c comm.Communicator) error {
		timed := func(m, reps int) (float64, error) {
			buf := make(comm.Float32s, m)
			var ts []float64
			for range reps {
				if err := c.Barrier(ctx); err != nil {
					return 0, err
				}
				t0 := time.Now()
				if err := c.AllReduce(ctx, buf); err != nil {
					return 0, err
				}
				ts = append(ts, time.Since(t0).Seconds())
			}
			return median(ts), nil
		}
		a, err := timed(1, 31)
		if err != nil {
			return err
		}
		b, err := timed(m, 7)
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			t1, tn = a, b
		}
		return nil
	})
	if err != nil {
		return HostNet{}, fmt.Errorf("advise: measuring the in-process collectives of %d workers: %w", p, err)
	}
	// Small messages take recursive doubling: steps·α.
	steps := float64(bits.Len(uint(p)) - 1)
	if p&(p-1) != 0 {
		steps += 2
	}
	alpha := t1 / steps
	// Large ones the ring: 2(p−1)α + 2(p−1)/p·m/β, or recursive doubling
	// if that is faster (p = 2).
	bytes := 4 * float64(m)
	ringBW := 2 * float64(p-1) / float64(p) * bytes / max(tn-2*float64(p-1)*alpha, 1e-9)
	rdBW := steps * bytes / max(tn-steps*alpha, 1e-9)
	net := netmodel.Network{Latency: time.Duration(alpha * 1e9), Bandwidth: min(ringBW, rdBW)}
	return HostNet{Workers: p, Latency: net.Latency, Bandwidth: net.Bandwidth}, nil
}

func cpuName() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			if i := strings.IndexByte(l, ':'); i >= 0 {
				return strings.TrimSpace(l[i+1:])
			}
		}
	}
	return runtime.GOARCH
}

// WriteHost writes h as JSON to path (replaced atomically).
func WriteHost(path string, h *Host) error {
	if err := atomicfile.WriteJSON(path, h); err != nil {
		return fmt.Errorf("advise: %w", err)
	}
	return nil
}

// ReadHost reads what WriteHost wrote.
func ReadHost(path string) (*Host, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("advise: %w", err)
	}
	var h Host
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("advise: %s is not a measurement file: %w", path, err)
	}
	if h.Layout.N == 0 {
		// Written before the layout was one field: its names and sizes.
		var old struct {
			Names []string `json:"names"`
			Sizes []int    `json:"sizes"`
		}
		json.Unmarshal(b, &old)
		if len(old.Sizes) > 0 {
			if h.Layout, err = layout.New(old.Names, old.Sizes); err != nil {
				return nil, fmt.Errorf("advise: %s: %w", path, err)
			}
		}
	}
	if h.Layout.N == 0 || len(h.Layout.Tensors) == 0 {
		return nil, fmt.Errorf("advise: %s holds no model layout; delete it to measure again", path)
	}
	return &h, nil
}
