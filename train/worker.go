package train

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// worker is one rank's training loop.
type worker struct {
	r    *runner
	cfg  Config
	c    comm.Communicator
	rank int
	size int
	log  *slog.Logger
	m    models.Model
	task task

	// The reducer, its counted communicator and the error-feedback memory.
	layout sparsify.Layout
	red    sparsify.Reducer
	cnt    *comm.Counter
	ops    *opDeltas
	opt    Optimizer
	// dred is red when it reduces in the memory of the worker's device
	// (every built-in method; for a registered method that reduces host
	// memory only, the error-compensated gradient is copied to the host
	// and back on a GPU).
	dred sparsify.DeviceReducer
	// vops are the vector operations of the worker's device (error
	// feedback's accumulation).
	vops sparsify.Ops
	// resid is the error-feedback residual on the worker's device; mem's
	// Residual is its host view (resid itself on the CPU, a copy made for
	// checkpoints and for a registered method that reduces host memory only).
	resid device.Buffer
	mem   *sparsify.Memory
	// commName is the backend of device buffers (run.json's comm); nccl
	// is the NCCL communicator to close (nil without).
	commName string
	nccl     *cuda.NCCL

	// The worker's vectors on its device: the parameters and the gradient,
	// which after error feedback also holds the reducer's output (the
	// averaged sparse gradient the optimizer applies).
	stream         device.Stream
	params, grad   device.Buffer
	hparams, hgrad []float32 // host views of params and grad (the vectors themselves on the CPU)

	// final holds, for the step being run, the event at which each tensor's
	// gradient became final (the gradient hook's record; LAGS' adaptive
	// density reads the backward times from it).
	final []device.Event
	// pipe pipelines LAGS' groups with the backward pass (nil when off).
	pipe *pipeline
	// xfer is, on a GPU, the communication stream of pipelined groups,
	// beside the compute stream: a group's error feedback and reduction
	// wait for its own gradients only, not for the rest of the backward
	// pass. pgred is the pipelined reducer (on either device).
	xfer  device.Stream
	pgred sparsify.DeviceGroupReducer
	// out is rank 0's metrics, progress and report (nil on other ranks).
	out *output
	// start is when the run started: its records' wall times count from
	// it (a resumed run's from before its resume, see restore).
	start time.Time
	// res is the state of checkpoints and resumes.
	res resilience
	// rec records the gradients (-record-gradients; nil without), and
	// stepNo is the step being run (from 1).
	rec    *gradRecorder
	stepNo int
	// rlog is the rank's log file (see runLog).
	rlog *runLog
	// lags profiles the backward pass for LAGS' adaptive density.
	lags lagsProfile
}

func (r *runner) worker(ctx context.Context, c comm.Communicator) (err error) {
	cfg := r.cfg
	w := &worker{r: r, cfg: cfg, c: c, rank: c.Rank(), size: c.Size(), start: r.start, res: resilience{lastStep: -1, prevStep: -1}}
	// A simulated worker that fails (also in a panic, which the next
	// deferred function turns into err) releases the others waiting for it.
	defer func() {
		if err != nil && r.sim != nil {
			r.sim.bar.abort(err)
		}
	}()
	if err := os.MkdirAll(filepath.Join(cfg.Out, "checkpoints"), 0o755); err != nil {
		return fmt.Errorf("train: creating the run directory: %w", err)
	}
	if w.rank == 0 {
		unlock, err := lockRun(cfg.Out)
		if err != nil {
			return err
		}
		defer unlock()
	}
	rlog, lg := newRunLog(cfg.Out, w.rank)
	defer rlog.Close()
	w.log, w.rlog = lg, rlog
	// A panic of this worker ends the job with an error naming the rank
	// and step (its stack goes to the rank's log, which is then kept).
	defer func() {
		if p := recover(); p != nil {
			w.r.panicked.Store(true)
			w.rlog.keep()
			w.log.Error("panic", "value", p, "stack", string(debug.Stack()))
			err = &jobError{msg: fmt.Sprintf("step %d failed on rank %d: panic: %v (stack in %s); %s", w.r.status.step.Load()+1, w.rank, p,
				filepath.Join(cfg.Out, "logs", fmt.Sprintf("rank-%d.log", w.rank)), w.r.lastCheckpoint("resume with"))}
		}
	}()
	defer func() {
		if err != nil {
			w.log.Error("training failed", "err", err)
		}
	}()
	err = w.setup(ctx)
	if w.nccl != nil {
		defer w.nccl.Close()
	}
	if err != nil {
		return err
	}
	defer w.task.Close()
	// The final report is written when training ends, also after an error
	// or an interruption (its metrics show how far the run got), but not
	// when a panic unwinds the worker, nor for a run that keeps nothing (it
	// failed before its first step, or its resume was refused); the
	// report's goroutine ends either way.
	returned := false
	defer func() {
		if cerr := w.out.close(returned && w.res.kept); cerr != nil && err == nil {
			err = fmt.Errorf("train: closing metrics.jsonl: %w", cerr)
		}
	}()
	err = w.loop(ctx)
	if err == nil {
		err = w.finishRecording(ctx)
	}
	returned = true
	return err
}

func (w *worker) setup(ctx context.Context) error {
	cfg := w.cfg
	be, err := w.r.exec(w.rank)
	if err != nil {
		return err
	}
	// Dropout masks differ per rank; the initial parameters are rank 0's.
	var m models.Model
	if sim := w.r.sim; sim != nil {
		m, err = sim.model(cfg, w.r.ds, w.rank, be)
	} else {
		m, err = NewModel(cfg, w.r.ds, cfg.Seed.Value()+uint64(w.rank), be)
	}
	if err != nil {
		return fmt.Errorf("train: building %s: %w", cfg.Model, err)
	}
	if w.r.opt.wrapModel != nil {
		m = w.r.opt.wrapModel(m)
	}
	w.m = m
	w.stream = be.Stream()
	dev := be.Device()
	// The reducers' vector operations and the communicator for device
	// memory: on a GPU, its kernels, and device buffers staged through host
	// memory over the run's communicator (in-process or MPI).
	w.vops = sparsify.CPUOps()
	w.commName = w.r.backend
	var redOps sparsify.Ops
	if g, ok := dev.(*cuda.Device); ok {
		w.vops, redOps = g.Sparse(), g.Sparse()
		if w.c, w.commName, w.nccl, err = w.r.commOnGPU(ctx, w.c, g); err != nil {
			return err
		}
	}
	w.cnt = comm.NewCounter(w.c)
	w.ops = newOpDeltas(w.cnt)
	n := m.NumParams()
	method, _ := sparsify.Lookup(cfg.Sparsifier)
	newOpt := func() (Optimizer, error) {
		switch cfg.Optimizer {
		case "sgd":
			if method.CorrectsMomentum {
				// The reducer applies the momentum (DGC's momentum
				// correction); the optimizer to the weight decay only.
				return NewDecayOnlySGD(w.stream, m.Layout(), cfg.Momentum.Value(), cfg.WeightDecay.Value())
			}
			return NewSGD(w.stream, m.Layout(), cfg.Momentum.Value(), cfg.WeightDecay.Value(), cfg.Nesterov)
		case "adam":
			return NewAdam(w.stream, n, cfg.Beta1.Value(), cfg.Beta2.Value(), cfg.Eps.Value())
		case "none":
			return noUpdate{}, nil
		}
		return nil, fmt.Errorf("%w: unknown -optimizer %q", ErrConfig, cfg.Optimizer)
	}
	if sim := w.r.sim; sim != nil {
		// One parameter vector and optimizer for all; rank 0 updates.
		var opt Optimizer
		w.params, opt, err = sim.shared(func() (device.Buffer, Optimizer, error) {
			p, err := dev.Alloc(device.Float32, n)
			if err != nil {
				return device.Buffer{}, nil, fmt.Errorf("train: allocating the parameters: %w", err)
			}
			o, err := newOpt()
			return p, o, err
		})
		if err != nil {
			return err
		}
		if w.rank == 0 {
			w.opt = opt
		}
	} else {
		if w.params, err = dev.Alloc(device.Float32, n); err != nil {
			return fmt.Errorf("train: allocating the parameters: %w", err)
		}
		if w.opt, err = newOpt(); err != nil {
			return err
		}
	}
	if w.grad, err = dev.Alloc(device.Float32, n); err != nil {
		return fmt.Errorf("train: allocating the gradient: %w", err)
	}
	if w.resid, err = dev.Alloc(device.Float32, n); err != nil {
		return fmt.Errorf("train: allocating the error-feedback residual: %w", err)
	}
	w.hparams, w.hgrad = hostView(w.params), hostView(w.grad)
	w.mem = &sparsify.Memory{Residual: hostView(w.resid)}
	var names []string
	var sizes []int
	for _, p := range m.Layout() {
		names = append(names, p.Name)
		sizes = append(sizes, p.Size)
	}
	if w.layout, err = sparsify.NewLayout(names, sizes); err != nil {
		return fmt.Errorf("train: layout of %s: %w", cfg.Model, err)
	}
	for i, p := range m.Layout() {
		w.layout.Tensors[i].Dims = len(p.Shape)
	}
	var momentum float64
	if method.CorrectsMomentum && (cfg.Optimizer == "sgd" || cfg.Gradients != "") { // a replay's momentum is the recording's
		momentum = cfg.Momentum.Value()
	}
	// A pipelined reducer works on the copy stream (its groups start while
	// the compute stream goes on with the backward pass); the others on the
	// compute stream.
	redStream := w.stream
	if cfg.PipelineOn() && !w.grad.IsHost() {
		if w.xfer, err = dev.NewStream(); err != nil {
			return fmt.Errorf("train: a communication stream for pipelining: %w", err)
		}
		redStream = w.xfer
	}
	w.red, err = sparsify.New(cfg.Sparsifier, sparsify.Options{
		Density: cfg.Density.Value(), Layout: w.layout, Comm: w.cnt, Seed: cfg.Seed.Value(),
		Params:  cfg.MethodOptions,
		Network: netmodel.Network{Latency: cfg.NetLatency, Bandwidth: cfg.NetBandwidth},
		Stream:  redStream, Ops: redOps,
		Momentum: momentum,
	})
	if err != nil {
		return fmt.Errorf("train: -sparsifier %s: %w", cfg.Sparsifier, err)
	}
	w.dred, _ = w.red.(sparsify.DeviceReducer)
	if cfg.PipelineOn() {
		gr, ok := w.red.(sparsify.DeviceGroupReducer)
		if !ok {
			return fmt.Errorf("%w: -sparsifier %s cannot be pipelined (no group reduction in device memory)", ErrConfig, cfg.Sparsifier)
		}
		w.pipe, w.pgred = newPipeline(gr, len(w.layout.Tensors)), gr
	}
	w.final = make([]device.Event, len(w.layout.Tensors))
	// The hook drives pipelining and measures LAGS' per-tensor backward
	// times.
	if w.pipe != nil || w.lagsAdaptive() {
		m.SetGradHook(w.hook)
	}
	if sim := w.r.sim; sim != nil {
		// Rank 0 writes the one copy; the others wait for it.
		if w.rank == 0 {
			if err := m.InitParams(w.hparams); err != nil {
				return err
			}
		}
		if err := sim.bar.wait(ctx); err != nil {
			return err
		}
	} else {
		if err := m.InitParams(w.hparams); err != nil {
			return err
		}
		if err := w.c.Broadcast(ctx, comm.Float32s(w.hparams), 0); err != nil {
			return fmt.Errorf("train: broadcasting the initial parameters: %w", err)
		}
		if err := w.upload(w.params, w.hparams); err != nil {
			return err
		}
	}
	if nb := sumSizes(m.BufferLayout()); nb > 0 {
		b := make([]float32, nb)
		if err := m.StoreBuffers(b); err != nil {
			return err
		}
		if err := w.c.Broadcast(ctx, comm.Float32s(b), 0); err != nil {
			return fmt.Errorf("train: broadcasting the initial buffers: %w", err)
		}
		if err := m.LoadBuffers(b); err != nil {
			return err
		}
	}
	if w.task, err = newTask(cfg, w.r.ds, w.rank, w.size); err != nil {
		return err
	}
	if cfg.RecordGradients != "" {
		if w.rec, err = newGradRecorder(cfg, m, w.rank, w.size, w.task.Len(), dev, versions(w.r.blas, w.r.kernels).Revision); err != nil {
			w.task.Close()
			return err
		}
	}
	if e, ok := w.red.(sparsify.EpochScheduled); ok {
		perEpoch := w.task.Len()
		if rec := w.r.ds.Recording; rec != nil {
			// A replay's epochs are the recorded training's (0, not known:
			// no epoch schedule), not its one pass over the recorded steps.
			perEpoch = rec.Manifest.StepsPerEpoch
		}
		e.SetStepsPerEpoch(perEpoch)
	}
	if w.rank == 0 {
		info := RunInfo{Config: cfg, CommandLine: w.r.opt.CommandLine, Start: w.r.start, Backend: w.r.backend,
			Workers: w.size, Params: n, Tensors: len(w.layout.Tensors), Pipelined: w.pipe != nil,
			Versions: versions(w.r.blas, w.r.kernels), Machine: machine(), LayerNames: names, Device: be.Device().String(), ReduceIn: "device", Comm: w.commName}
		if w.r.sim != nil {
			info.Executors = w.r.sim.executors
		}
		if rec := w.r.ds.Recording; rec != nil {
			info.Replay, info.CannotShow = replayInfo(rec), ReplayCannotShow
		}
		if w.dred == nil && !w.grad.IsHost() {
			info.ReduceIn = "host"
		}
		info.Config.Resume = ""
		if prev := w.r.prev; prev != nil {
			// One run across resumes: its start and command, and the
			// resumes so far (restore fills in this one's checkpoint).
			info.Start, info.CommandLine = prev.Start, prev.CommandLine
			info.Resumes = append(slices.Clone(prev.Resumes), ResumeRecord{At: time.Now().UTC(), CommandLine: w.r.opt.CommandLine})
			info.Notes = slices.Clone(prev.Notes)
		}
		w.res.info = &info
		if be.Device().Kind() == device.CUDAKind {
			info.Machine.GPU = be.Device().String()
		}
		if g, ok := be.Device().(*cuda.Device); ok {
			rep := g.Report()
			info.CUDA = &rep
		}
		// A resume writes run.json once its checkpoint is accepted
		// (restore): a refused resume changes nothing.
		if cfg.Resume == "" {
			if err := writeJSONAtomic(filepath.Join(cfg.Out, "run.json"), info); err != nil {
				w.task.Close()
				return fmt.Errorf("train: writing run.json: %w", err)
			}
		}
		mw, err := openMetrics(filepath.Join(cfg.Out, "metrics.jsonl"), cfg.Resume != "")
		if err != nil {
			w.task.Close()
			return err
		}
		w.out = &output{metrics: mw, log: w.log, sink: w.r.opt.LossSink, console: newSyncWriter(w.r.opt.Stdout)}
		if !cfg.Quiet {
			w.out.prog = newProgress(w.r.opt.Progress, w.out.console)
			w.out.stopBeat = w.out.prog.beat(w.out.console)
			if info.CUDA != nil {
				fmt.Fprintln(w.out.console, info.CUDA)
			}
		}
		if report := w.r.opt.Report; report != nil {
			o := w.out
			w.out.rep = newReporter(func() error { return report(cfg.Out) }, o.reportFailed)
			w.out.reportPath = filepath.Join(cfg.Out, "report.html")
			w.out.reportCmd = progOf(w.r.opt) + " report " + cfg.Out
		}
	}
	w.log.Info("worker ready", "model", cfg.Model, "params", n, "sparsifier", cfg.Sparsifier, "workers", w.size, "pipelined", w.pipe != nil, "blas", w.r.blas, "kernels", w.r.kernels)
	return nil
}

func sumSizes(l []models.ParamInfo) int {
	n := 0
	for _, p := range l {
		n += p.Size
	}
	return n
}

// hostView returns the host memory of a device vector: the vector's own
// memory on the CPU, staging of its size elsewhere (for what only the host
// does: initial parameters, checkpoints, a host-only method's reduction).
func hostView(b device.Buffer) []float32 {
	if b.IsHost() {
		return b.Float32s()
	}
	return make([]float32, b.Len())
}

// download copies a device vector into its host view (nothing on the CPU).
func (w *worker) download(h []float32, b device.Buffer) error {
	if b.IsHost() {
		return nil
	}
	if err := w.stream.Copy(device.Host(h), b); err != nil {
		return err
	}
	return w.stream.Synchronize()
}

// upload copies a host view into its device vector (nothing on the CPU).
func (w *worker) upload(b device.Buffer, h []float32) error {
	if b.IsHost() {
		return nil
	}
	return w.stream.Copy(b, device.Host(h))
}

// accumulate adds the gradient's elements [lo, hi) to the error-feedback
// residual on stream st, which then holds the error-compensated gradient;
// a non-finite result is an error naming the tensor.
func (w *worker) accumulate(st device.Stream, lo, hi int) error {
	bad, err := w.vops.Accumulate(st, w.resid.Slice(lo, hi), w.grad.Slice(lo, hi), 1)
	if err != nil {
		return fmt.Errorf("train: error feedback: %w", err)
	}
	if bad < 0 {
		return nil
	}
	// The explanation reads both vectors on the host.
	if err := st.Synchronize(); err != nil {
		return err
	}
	if err := w.download(w.hgrad, w.grad); err != nil {
		return err
	}
	if err := w.download(w.mem.Residual, w.resid); err != nil {
		return err
	}
	return w.accumulateError(fmt.Errorf("element %d of the error-compensated gradient is not finite", lo+bad), lo, hi)
}

// localClip is the threshold of local clipping: -clip, divided by √n for a
// method that scales it (DGC's local gradient clipping,
// sparsify.Method.ScaledClip).
func (w *worker) localClip() float64 {
	if m, _ := sparsify.Lookup(w.cfg.Sparsifier); m.ScaledClip {
		return w.cfg.Clip.Value() / math.Sqrt(float64(w.size))
	}
	return w.cfg.Clip.Value()
}

// lagsAdaptive reports whether the method chooses per-group densities from
// measured backward times (LAGS-SGD's adaptive rule).
func (w *worker) lagsAdaptive() bool {
	l, ok := w.red.(sparsify.CostAdaptive)
	return ok && l.Adaptive()
}

// hook runs on the model's goroutine when tensor idx's gradient is final
// (in the gradient vector once ready has completed).
func (w *worker) hook(idx int, ready device.Event) {
	w.final[idx] = ready
	if w.pipe != nil {
		w.pipe.tensorFinal(idx)
	}
}

// startGroup runs on the pipeline's goroutine: merge group g's gradients
// are final; it adds them to the error-feedback memory and starts the
// group's reduction, whose output overwrites the group's gradient (which
// error feedback has just consumed).
func (w *worker) startGroup(ctx context.Context, g int) (sparsify.Pending, error) {
	gg := w.pipe.groups[g]
	st := w.stream
	if w.xfer != nil {
		// On the GPU, on the communication stream, after the group's
		// gradients.
		st = w.xfer
		for _, t := range gg.Tensors {
			if err := st.Wait(w.final[t]); err != nil {
				return nil, err
			}
		}
	}
	if err := w.accumulate(st, gg.Lo, gg.Hi); err != nil {
		return nil, err
	}
	w.pipe.reducing()
	p, err := w.pgred.StartGroupOn(ctx, g, w.resid, w.grad, w.resid)
	if err != nil {
		return nil, fmt.Errorf("train: starting merge group %d: %w", g, err)
	}
	return p, nil
}

// step runs one iteration on batch b with learning rate lr.
func (w *worker) step(ctx context.Context, b models.Batch, lr float64) (stepStats, error) {
	var s stepStats
	clear(w.final)
	var res models.StepResult
	var t1 time.Time
	pass := func() error {
		var err error
		res, err = w.m.TrainStep(ctx, b, w.params, w.grad)
		t1 = time.Now()
		return err
	}
	t0 := time.Now()
	var err error
	if w.pipe != nil {
		err = w.pipe.run(pass, func(g int) (sparsify.Pending, error) { return w.startGroup(ctx, g) })
	} else {
		err = pass()
	}
	if err != nil {
		if w.pipe != nil {
			w.pipe.drain(ctx)
		}
		return s, fmt.Errorf("train: %s step: %w", w.cfg.Model, err)
	}
	s.Loss = res.Loss
	// The time waiting for a shared executor is not computing.
	s.Compute, s.Queued = t1.Sub(t0)-res.Queued, res.Queued
	if w.rec != nil {
		if w.rank == 0 {
			w.rec.times = append(w.rec.times, s.Compute.Seconds())
		}
		// Recording is not part of the step's times.
		tr := time.Now()
		if err := w.recordGradient(); err != nil {
			return s, err
		}
		d := time.Since(tr)
		t0, t1 = t0.Add(d), t1.Add(d)
	}
	if sim := w.r.sim; sim != nil && w.pipe == nil {
		// Simulated workers compute one after another but enter the
		// reduction together, as a cluster's do: the reducer's times are
		// then its own, not waits for the workers whose turn came later.
		// The wait counts as queued. (Pipelined groups start during the
		// backward pass; their calls wait for the other workers' turns.)
		ta := time.Now()
		if err := sim.bar.wait(ctx); err != nil {
			return s, err
		}
		aligned := time.Since(ta)
		s.Queued += aligned
		t1 = t1.Add(aligned)
	}
	s.Forward, s.Backward = res.Forward, res.Backward
	var st sparsify.Stats
	var started time.Time
	if w.pipe != nil {
		gs, err := w.pipe.wait(ctx)
		if err != nil {
			return s, err
		}
		st = sparsify.CombineGroupStats(w.cfg.Density.Value(), w.layout, w.pipe.groups, gs)
		started = w.pipe.started
		if w.xfer != nil {
			// The update waits for the groups' outputs.
			ev, err := w.xfer.Record()
			if err == nil {
				err = w.stream.Wait(ev)
			}
			if err != nil {
				return s, err
			}
		}
	} else {
		if w.cfg.ClipLocal() {
			if _, err := ClipNorm(w.stream, w.grad, w.localClip()); err != nil {
				return s, err
			}
		}
		if err := w.accumulate(w.stream, 0, w.grad.Len()); err != nil {
			return s, err
		}
		started = time.Now()
		// The reducer's output overwrites the gradient, which error
		// feedback has just consumed.
		if st, err = w.reduce(ctx); err != nil {
			return s, fmt.Errorf("train: reducing with %s: %w", w.cfg.Sparsifier, err)
		}
	}
	if (math.IsNaN(s.Loss) || math.IsInf(s.Loss, 0)) && w.r.ds.Recording == nil { // a replay has no loss
		return s, fmt.Errorf("%w: the loss is %v", errNonFinite, s.Loss)
	}
	if w.cfg.ClipAggregated() {
		// The averaged gradient, the same on every worker.
		if _, err := ClipNorm(w.stream, w.grad, w.cfg.Clip.Value()); err != nil {
			return s, err
		}
	}
	t2 := time.Now()
	if !started.IsZero() {
		s.CommWall = t2.Sub(started)
	}
	s.Wait = t2.Sub(t1)
	if err := w.update(ctx, lr); err != nil {
		return s, err
	}
	if err := w.stream.Synchronize(); err != nil {
		return s, err
	}
	t3 := time.Now()
	s.Update = t3.Sub(t2)
	s.Iter = t3.Sub(t0)
	s.Select, s.Comm = st.SelectTime, st.CommTime
	s.Sent, s.Recv = float64(st.BytesSent), float64(st.BytesRecv)
	s.ErrorNorm, s.ActualDensity, s.Threshold = st.ErrorNorm, st.ActualDensity, st.Threshold
	s.LayerK = st.LayerK
	return s, nil
}

// update applies the reduced gradient to the parameters. Simulated
// workers share the parameters: rank 0 updates them once every worker is
// done with this step's, and no worker goes on before the update is done.
func (w *worker) update(ctx context.Context, lr float64) error {
	sim := w.r.sim
	if sim == nil {
		return w.opt.Step(w.params, w.grad, lr)
	}
	if err := sim.bar.wait(ctx); err != nil {
		return err
	}
	if w.rank == 0 {
		if err := w.opt.Step(w.params, w.grad, lr); err != nil {
			sim.bar.abort(err)
			return err
		}
	}
	return sim.bar.wait(ctx)
}

// reduce reduces the error-compensated gradient (the residual) into the
// gradient and the new residual: in the device's memory, or for a reducer
// of host memory only through host copies of both.
func (w *worker) reduce(ctx context.Context) (sparsify.Stats, error) {
	if w.dred != nil {
		return w.dred.ReduceOn(ctx, w.resid, w.grad, w.resid)
	}
	if err := w.download(w.mem.Residual, w.resid); err != nil {
		return sparsify.Stats{}, err
	}
	st, err := w.red.Reduce(ctx, w.mem.Residual, w.hgrad, w.mem.Residual)
	if err != nil {
		return st, err
	}
	if err := w.upload(w.grad, w.hgrad); err != nil {
		return st, err
	}
	return st, w.upload(w.resid, w.mem.Residual)
}

// gather combines the ranks' step statistics into a record (the same on
// every rank).
func (w *worker) gather(ctx context.Context, s stepStats, epoch, step int, lr float64) (StepRecord, error) {
	all, err := gatherStats(ctx, w.c, s)
	if err != nil {
		return StepRecord{}, err
	}
	density := w.cfg.Density.Value()
	if w.cfg.Sparsifier == "dense" {
		density = 1
	}
	rec := stepRecord(all, epoch, step, w.size, lr, density, time.Since(w.start))
	rec.Ops = w.ops.next()
	return rec, nil
}

// evaluate runs the evaluation (rank 0: with a progress bar) and (rank 0)
// records it. With -max-time it ends when the run's time is up, after the
// batch that reached it (every rank evaluates at least one): an
// evaluation the time cut short is recorded and printed as a sample of
// the split, so that -max-time bounds the whole run.
func (w *worker) evaluate(ctx context.Context, epoch, step int) ([]metric, error) {
	if w.r.ds.Recording != nil {
		return nil, nil // a replay has nothing to evaluate
	}
	tick := w.out.progress().startEval(w.task.EvalBatches())
	var deadline time.Time
	if w.cfg.MaxTime > 0 {
		deadline = w.start.Add(w.cfg.MaxTime)
	}
	cut, n, t0 := false, 0, time.Now()
	more := func() bool {
		n++
		if tick != nil {
			tick()
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			cut = true
			return false
		}
		return true
	}
	ev, err := w.task.Evaluate(ctx, w.m, w.params, w.c, more)
	w.out.progress().endEval()
	if err != nil {
		return nil, err
	}
	if n > 0 {
		w.res.evalPerBatch = time.Since(t0) / time.Duration(n)
	}
	if w.cfg.MaxTime > 0 {
		// Whether any rank's time ran out (every rank evaluates here).
		f := comm.Int32s{0}
		if cut {
			f[0] = 1
		}
		if err := w.c.AllReduce(ctx, f); err != nil {
			return nil, fmt.Errorf("train: combining evaluation results: %w", err)
		}
		ev.timeUp = f[0] > 0
	}
	if err := w.out.eval(epoch, step, Num(time.Since(w.start).Seconds()), ev); err != nil {
		return nil, err
	}
	w.log.Info("evaluation", "epoch", epoch+1, "step", step, "results", ev.metrics, "split", ev.split, "evaluated", ev.count, "of", ev.total, "time_up", ev.timeUp)
	return ev.metrics, nil
}

// evalReserve is the time -max-time keeps for the final evaluation (rank
// 0): training stops that long before the limit. It is the evaluation's
// estimated duration, from the last evaluation's time per batch or, before
// any, from the last step's time (an evaluation batch costs about a third
// of a training step's time per sample: a forward pass only), and at most
// a tenth of -max-time; an evaluation that takes longer is cut short
// (evaluate).
func (w *worker) evalReserve() time.Duration {
	per := w.res.evalPerBatch
	if per == 0 {
		per = time.Duration(float64(w.res.stepTime) * float64(evalBatchSize(w.cfg, w.r.ds, w.size)) / float64(3*w.cfg.Batch.Value()))
	}
	return min(per*time.Duration(w.task.EvalBatches()), w.cfg.MaxTime/10)
}

func (w *worker) loop(ctx context.Context) error {
	cfg := w.cfg
	perEpoch := w.task.Len()
	sched := Schedule{Base: cfg.LR.Value(), WarmupIters: int(cfg.WarmupEpochs * float64(perEpoch)), DecayEpochs: cfg.DecayEpochs, Factor: cfg.DecayFactor.Value()}
	if cfg.LRSchedule == "onecycle" {
		// One cycle over the whole run: -epochs, or -steps when it ends
		// the run earlier (-max-time cannot be foreseen).
		sched.OneCycleIters = cfg.Epochs.Value() * perEpoch
		if cfg.Steps > 0 {
			sched.OneCycleIters = min(sched.OneCycleIters, cfg.Steps)
		}
	}
	pos := position{}
	if cfg.Resume != "" {
		var err error
		if pos, err = w.restore(ctx); err != nil {
			return err
		}
	}
	step := pos.step
	w.r.status.step.Store(int64(step))
	total := cfg.Epochs.Value() * perEpoch
	if cfg.Steps > 0 {
		total = min(total, cfg.Steps)
	}
	notesEpoch := perEpoch
	if rec := w.r.ds.Recording; rec != nil {
		notesEpoch = rec.Manifest.StepsPerEpoch // the recorded training's epochs
	}
	for _, n := range methodNotes(cfg, w.layout, total, notesEpoch) {
		if err := w.note(n); err != nil {
			return err
		}
	}
	lastEval, lastCkpt := -1, -1
	if cfg.Resume != "" {
		lastCkpt = step
		if w.res.evaluated {
			lastEval = step
		}
	}
	// save writes a checkpoint of p unless one of this step exists. A
	// checkpoint that cannot be written (a full disk) stops the run: the
	// previous one is intact, and training on would only add steps that
	// cannot be kept.
	save := func(p position) error {
		if lastCkpt == p.step {
			return nil
		}
		done := w.out.progress().during(fmt.Sprintf("writing the checkpoint of step %d", p.step))
		err := w.checkpoint(ctx, p)
		done()
		if err == nil {
			lastCkpt = p.step
		}
		return err
	}
	// An evaluation due at the checkpoint resumed from comes first.
	if pos.evalDue {
		if _, err := w.evaluate(ctx, pos.evalEpoch, step); err != nil {
			return w.failed(err, step)
		}
		lastEval = step
	}
	startBatch := pos.batch
	for epoch := pos.epoch; epoch < cfg.Epochs.Value(); epoch++ {
		if cfg.Steps > 0 && step >= cfg.Steps {
			break
		}
		if err := w.task.SetEpoch(epoch); err != nil {
			return fmt.Errorf("epoch %d: %w", epoch+1, err)
		}
		w.m.ResetState()
		if w.res.modelState != nil {
			// The resumed epoch continues the checkpoint's model state.
			if err := w.m.(models.Stateful).LoadState(w.res.modelState); err != nil {
				return err
			}
			w.res.modelState = nil
		}
		prog := w.out.progress()
		if prog != nil {
			prog.startEpoch(epoch+1, cfg.Epochs.Value(), perEpoch-startBatch)
		}
		var lastLoss float64
		for i := startBatch; i < perEpoch; i++ {
			here := position{epoch: epoch, batch: i, step: step}
			timeUp, stop, err := w.agree(ctx)
			if err != nil {
				return w.failed(err, step)
			}
			if w.rank == 0 {
				// Every rank has written the steps done (they have all
				// agreed to go on after them).
				if err := w.rec.commit(step); err != nil {
					return w.failed(err, step)
				}
			}
			if stop {
				if prog != nil {
					prog.endEpoch()
				}
				if err := save(here); err != nil {
					return w.failed(interruptedBut(err), step)
				}
				return w.failed(collective(ErrInterrupted), step)
			}
			if (cfg.Steps > 0 && step >= cfg.Steps) || timeUp {
				if prog != nil {
					prog.endEpoch()
				}
				// The checkpoint first: an interrupted evaluation must
				// not lose the steps done, and a resume then redoes it.
				if lastEval != step {
					here.evalDue, here.evalEpoch = true, epoch
				}
				if err := save(here); err != nil {
					return w.failed(err, step)
				}
				if lastEval != step {
					if _, err := w.evaluate(ctx, epoch, step); err != nil {
						return w.failed(err, step)
					}
				}
				return nil
			}
			if err := ctx.Err(); err != nil {
				return w.failed(fmt.Errorf("stopped: %w", err), step)
			}
			lr := sched.At(step, epoch)
			b, ns, err := w.task.Batch(i)
			if err != nil {
				return w.failed(&stepError{step + 1, epoch, fmt.Errorf("batch %d of the epoch: %w", i, err)}, step)
			}
			w.stepNo = step + 1
			s, err := w.step(ctx, b, lr)
			if err != nil {
				return w.failed(&stepError{step + 1, epoch, err}, step)
			}
			s.Samples = ns
			w.res.stepTime = s.Iter
			step++
			w.r.status.step.Store(int64(step))
			w.keep()
			if err := w.profileLAGS(ctx, step); err != nil {
				return w.failed(err, step)
			}
			if cfg.CheckEvery > 0 && step%cfg.CheckEvery == 0 {
				if err := w.checkParams(ctx, step); err != nil {
					return w.failed(err, step)
				}
			}
			lastLoss = s.Loss
			last := i == perEpoch-1 || step == cfg.Steps
			if step%cfg.LogEvery.Value() == 0 || last {
				rec, err := w.gather(ctx, s, epoch, step, lr)
				if err != nil {
					return w.failed(err, step)
				}
				lastLoss = float64(rec.Loss)
				if err := w.out.step(rec); err != nil {
					return w.failed(err, step)
				}
			}
			if prog != nil {
				prog.add(ns*w.size, lastLoss)
			}
			evalNow := cfg.EvalEvery > 0 && step%cfg.EvalEvery == 0 && !last
			if cfg.CheckpointEvery > 0 && step%cfg.CheckpointEvery == 0 && !last {
				// Before the evaluation, which a resumed run then redoes.
				if err := save(position{epoch: epoch, batch: i + 1, step: step, evalDue: evalNow, evalEpoch: epoch}); err != nil {
					return w.failed(err, step)
				}
			}
			if evalNow {
				if _, err := w.evaluate(ctx, epoch, step); err != nil {
					return w.failed(err, step)
				}
				lastEval = step
			}
		}
		startBatch = 0
		if prog != nil {
			prog.endEpoch()
		}
		// The checkpoint before the evaluation, which an interruption
		// may cut short (a resumed run then evaluates first).
		if err := save(position{epoch: epoch + 1, batch: 0, step: step, evalDue: true, evalEpoch: epoch}); err != nil {
			return w.failed(err, step)
		}
		if _, err := w.evaluate(ctx, epoch, step); err != nil {
			return w.failed(err, step)
		}
		lastEval = step
		// The report of the epochs so far is written in the background;
		// the final one when the worker returns.
		w.out.refreshReport()
	}
	return nil
}
