package train

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/rundir"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// worker is one rank's training: its data path (datapath.go), which runs
// the steps, and the loop that carries out what the run's schedule
// (schedule.go) decides between them — logging, evaluations, checkpoints
// (ckptrun.go), stops (faults.go) — with the run's records and output.
type worker struct {
	runner *runner
	cfg    Config
	// communicator connects the ranks: the run's (in-process or MPI) or,
	// on a GPU, the one for device memory (commOnGPU).
	communicator comm.Communicator
	rank, size   int
	log          *slog.Logger
	// runLog is the rank's log file (see rundir.Log).
	runLog *rundir.Log

	dataPath *dataPath
	task     task
	// opCounts turns the totals of the reducer's counted communicator into
	// each step record's per-operation counts.
	opCounts *opDeltas
	// commName is the backend of device buffers (run.json's comm); nccl
	// is the NCCL communicator to close (nil without).
	commName string
	nccl     *cuda.NCCL

	// out is rank 0's metrics, progress and report (nil on other ranks),
	// runInfo rank 0's run.json (nil on other ranks).
	out     *output
	runInfo *RunInfo
	// start is when the run started: its records' wall times count from
	// it (a resumed run's from before its resume, see restore).
	start time.Time
	// checkpoints is the state of checkpoints and resumes.
	checkpoints checkpointState
	// kept says that the run has something worth keeping: a new run has
	// done a step or written a checkpoint, a resume has been accepted.
	// Until then its log is in memory (runLog), and a new run that fails
	// removes what it wrote (rundir.Discard).
	kept bool
	// sched is the run's schedule and ended why the loop returned without
	// an error (run.json's end, recordEnd).
	sched runSchedule
	ended stopReason
	// lastStepTime is the last step's time, evalPerBatch the last
	// evaluation's time per batch (evalReserve).
	lastStepTime, evalPerBatch time.Duration
}

func (r *runner) worker(ctx context.Context, c comm.Communicator) (err error) {
	cfg := r.cfg
	w := &worker{runner: r, cfg: cfg, communicator: c, rank: c.Rank(), size: c.Size(), start: r.start, checkpoints: checkpointState{lastStep: -1, prevStep: -1}}
	// A simulated worker that fails (also in a panic, which the next
	// deferred function turns into err) releases the others waiting for it.
	defer func() {
		if err != nil && r.sim != nil {
			r.sim.bar.abort(err)
		}
	}()
	if err := rundir.Create(cfg.Out); err != nil {
		return fmt.Errorf("train: creating the run directory: %w", err)
	}
	if w.rank == 0 {
		unlock, err := rundir.Lock(cfg.Out)
		if err != nil {
			return configError(err)
		}
		defer unlock()
	}
	rlog, lg := rundir.NewLog(cfg.Out, w.rank)
	defer rlog.Close()
	w.log, w.runLog = lg, rlog
	// A panic of this worker ends the job with an error naming the rank
	// and step (its stack goes to the rank's log, which is then kept).
	defer func() {
		if p := recover(); p != nil {
			w.runner.panicked.Store(true)
			w.runLog.Keep()
			w.log.Error("panic", "value", p, "stack", string(debug.Stack()))
			err = &jobError{msg: fmt.Sprintf("step %d failed on rank %d: panic: %v (stack in %s); %s", w.runner.status.step.Load()+1, w.rank, p,
				rundir.LogPath(cfg.Out, w.rank), w.runner.lastCheckpoint("resume with"))}
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
		if w.kept {
			if eerr := w.recordEnd(err, returned); eerr != nil && err == nil {
				err = eerr
			}
		}
		if cerr := w.out.close(returned && w.kept); cerr != nil && err == nil {
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

// keep marks the run as worth keeping (worker.kept) and writes its log
// from now on; a log that cannot be written is a warning.
func (w *worker) keep() {
	if w.kept {
		return
	}
	w.kept = true
	w.runner.kept.Store(true)
	if err := w.runLog.Keep(); err != nil && w.out != nil {
		w.out.warn("no log", err)
	}
}

// setup builds what the rank trains with, in this order: the model, the
// communicator of its device, the data path, the initial parameters (rank
// 0's, the same on every rank), the data, and on rank 0 run.json and the
// output.
func (w *worker) setup(ctx context.Context) error {
	be, err := w.runner.exec(w.rank)
	if err != nil {
		return err
	}
	model, err := w.buildModel(be)
	if err != nil {
		return err
	}
	// Communication for device memory. On a GPU: its kernels, and device
	// buffers moved by the run's communicator (comm/local in the GPU's
	// memory where the workers share one, else staged through host
	// memory), or NCCL (commOnGPU).
	var reduceOps sparsify.Ops // nil: the CPU's
	feedbackOps := sparsify.CPUOps()
	w.commName = w.runner.backend
	if g, ok := be.Device().(*cuda.Device); ok {
		feedbackOps, reduceOps = g.Sparse(), g.Sparse()
		if w.communicator, w.commName, w.nccl, err = w.runner.commOnGPU(ctx, w.communicator, g); err != nil {
			return err
		}
	}
	counter := comm.NewCounter(w.communicator)
	w.opCounts = newOpDeltas(counter)
	w.dataPath, err = newDataPath(w.cfg, w.rank, w.size, w.runner.sim, w.runner.ds.Recording != nil, model, be.Device(), be.Stream(), counter, reduceOps, feedbackOps)
	if err != nil {
		return err
	}
	if err := w.initParams(ctx); err != nil {
		return err
	}
	if err := w.prepareData(be.Device()); err != nil {
		return err
	}
	if w.rank == 0 {
		w.runInfo = w.newRunInfo(be.Device())
		if w.out, err = openOutput(w.cfg, w.runner.opt, w.runInfo, w.log); err != nil {
			w.task.Close()
			return err
		}
	}
	w.log.Info("worker ready", "model", w.cfg.Model, "params", model.NumParams(), "sparsifier", w.cfg.Sparsifier, "workers", w.size, "pipelined", w.dataPath.pipe != nil, "blas", w.runner.blas, "kernels", w.runner.kernels)
	return nil
}

// buildModel builds the rank's model on be. Dropout masks differ per rank;
// the initial parameters are rank 0's (initParams).
func (w *worker) buildModel(be engine.Backend) (models.Model, error) {
	var model models.Model
	var err error
	if sim := w.runner.sim; sim != nil {
		model, err = sim.model(w.cfg, w.runner.ds, w.rank, be)
	} else {
		model, err = NewModel(w.cfg, w.runner.ds, w.cfg.Seed.Value()+uint64(w.rank), be)
	}
	if err != nil {
		return nil, fmt.Errorf("train: building %s: %w", w.cfg.Model, err)
	}
	if w.runner.opt.wrapModel != nil {
		model = w.runner.opt.wrapModel(model)
	}
	return model, nil
}

// initParams gives every rank rank 0's initial parameters and batch-norm
// statistics. Simulated workers share the parameters: rank 0 writes them,
// the others wait.
func (w *worker) initParams(ctx context.Context) error {
	dp := w.dataPath
	if sim := w.runner.sim; sim != nil {
		if w.rank == 0 {
			if err := dp.model.InitParams(dp.hostParams); err != nil {
				return err
			}
		}
		if err := sim.bar.wait(ctx); err != nil {
			return err
		}
	} else {
		if err := dp.model.InitParams(dp.hostParams); err != nil {
			return err
		}
		if err := w.communicator.Broadcast(ctx, comm.Float32s(dp.hostParams), 0); err != nil {
			return fmt.Errorf("train: broadcasting the initial parameters: %w", err)
		}
		if err := dp.upload(dp.params, dp.hostParams); err != nil {
			return err
		}
	}
	if nb := sumSizes(dp.model.BufferLayout()); nb > 0 {
		b := make([]float32, nb)
		if err := dp.model.StoreBuffers(b); err != nil {
			return err
		}
		if err := w.communicator.Broadcast(ctx, comm.Float32s(b), 0); err != nil {
			return fmt.Errorf("train: broadcasting the initial buffers: %w", err)
		}
		if err := dp.model.LoadBuffers(b); err != nil {
			return err
		}
	}
	return nil
}

// prepareData opens the rank's shard of the data (its task), the gradient
// recorder (-record-gradients) and tells an epoch-scheduled reducer the
// epoch's length. On an error, nothing stays open.
func (w *worker) prepareData(dev device.Device) error {
	var err error
	if w.task, err = newTask(w.cfg, w.runner.ds, w.rank, w.size); err != nil {
		return err
	}
	dp := w.dataPath
	if w.cfg.RecordGradients != "" {
		if dp.recorder, err = newGradRecorder(w.cfg, dp.model, w.rank, w.size, w.task.Len(), dev, versions(w.runner.blas, w.runner.kernels).Revision); err != nil {
			w.task.Close()
			return err
		}
	}
	perEpoch := w.task.Len()
	if rec := w.runner.ds.Recording; rec != nil {
		// A replay's epochs are the recorded training's (0, not known: no
		// epoch schedule), not its one pass over the recorded steps.
		perEpoch = rec.Manifest.StepsPerEpoch
	}
	dp.reducer.SetStepsPerEpoch(perEpoch)
	return nil
}

// newRunInfo is rank 0's run.json of the run on dev.
func (w *worker) newRunInfo(dev device.Device) *RunInfo {
	r, dp := w.runner, w.dataPath
	info := RunInfo{Config: w.cfg, CommandLine: r.opt.CommandLine, Start: r.start, Backend: r.backend,
		Workers: w.size, Params: dp.model.NumParams(), Tensors: len(dp.layout.Tensors), Pipelined: dp.pipe != nil, Overlap: dp.pipe != nil,
		Versions: versions(r.blas, r.kernels), Machine: machine(), LayerNames: dp.layout.Names(), Device: dev.String(), ReduceIn: "device", Comm: w.commName}
	if r.sim != nil {
		info.Executors = r.sim.executors
	}
	if v, ok := w.cfg.MethodOptions["bucket_mb"].(float64); ok && w.cfg.Sparsifier == "dense" {
		info.BucketMB = &v
	}
	if rec := r.ds.Recording; rec != nil {
		info.Replay, info.CannotShow = replayInfo(rec), ReplayCannotShow
	}
	info.Config.Resume = ""
	info.Status = metrics.StatusRunning
	if prev := r.prev; prev != nil {
		// One run across resumes: its start and command, and the
		// resumes so far (restore fills in this one's checkpoint).
		info.Start, info.CommandLine = prev.Start, prev.CommandLine
		// This process holds the run's lock: a run.json that says the
		// run is running belongs to a process that was killed.
		after := prev.Status
		if after == metrics.StatusRunning {
			after = metrics.StatusKilled
		}
		info.Resumes = append(slices.Clone(prev.Resumes), metrics.Resume{At: time.Now().UTC(), CommandLine: r.opt.CommandLine, After: after})
		info.Notes = slices.Clone(prev.Notes)
	}
	if dev.Kind() == device.CUDAKind {
		info.Machine.GPU = dev.String()
	}
	if g, ok := dev.(*cuda.Device); ok {
		rep := g.Report()
		info.CUDA = &rep
	}
	return &info
}

// machine describes the computer of this process (run.json's).
func machine() metrics.Machine {
	m := metrics.Machine{OS: runtime.GOOS, Arch: runtime.GOARCH, Cores: runtime.NumCPU()}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if i := strings.IndexByte(l, ':'); i >= 0 {
					m.CPU = strings.TrimSpace(l[i+1:])
				}
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Sscan(string(b), &m.Load1)
	}
	return m
}

// versions are the software versions of this build (run.json's).
func versions(blas, kernels string) metrics.Versions {
	v := metrics.Versions{Go: runtime.Version(), BLAS: blas, Kernels: kernels}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v.Module = bi.Main.Path + "@" + bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v.Revision = s.Value
			}
		}
	}
	return v
}

func sumSizes(l []models.ParamInfo) int {
	n := 0
	for _, p := range l {
		n += p.Size
	}
	return n
}

// gather combines the ranks' step statistics into a record (the same on
// every rank).
func (w *worker) gather(ctx context.Context, s stepStats, epoch, step int, lr float64) (metrics.Step, error) {
	all, err := gatherStats(ctx, w.communicator, s)
	if err != nil {
		return metrics.Step{}, err
	}
	density := w.cfg.Density.Value()
	if w.cfg.Sparsifier == "dense" {
		density = 1
	}
	rec := stepRecord(all, epoch, step, w.size, lr, density, time.Since(w.start))
	rec.Ops = w.opCounts.next()
	return rec, nil
}

// evaluate runs the evaluation (rank 0: with a progress bar) and (rank 0)
// records it. With -max-time it ends when the run's time is up, after the
// batch that reached it (every rank evaluates at least one): an
// evaluation the time cut short is recorded and printed as a sample of
// the split, so that -max-time bounds the whole run.
func (w *worker) evaluate(ctx context.Context, epoch, step int) ([]metric, error) {
	if w.runner.ds.Recording != nil {
		return nil, nil // a replay has nothing to evaluate
	}
	tick := w.out.progress().startEval(w.task.EvalBatches())
	cut, n, t0 := false, 0, time.Now()
	more := func() bool {
		n++
		if tick != nil {
			tick()
		}
		if evalCut(w.cfg.MaxTime, time.Since(w.start)) {
			cut = true
			return false
		}
		return true
	}
	ev, err := w.task.Evaluate(ctx, w.dataPath.model, w.dataPath.params, w.communicator, more)
	w.out.progress().endEval()
	if err != nil {
		return nil, err
	}
	if n > 0 {
		w.evalPerBatch = time.Since(t0) / time.Duration(n)
	}
	if w.cfg.MaxTime > 0 {
		// Whether any rank's time ran out (every rank evaluates here).
		f := comm.Int32s{0}
		if cut {
			f[0] = 1
		}
		if err := w.communicator.AllReduce(ctx, f); err != nil {
			return nil, fmt.Errorf("train: combining evaluation results: %w", err)
		}
		ev.timeUp = f[0] > 0
	}
	if err := w.out.eval(epoch, step, metrics.Num(time.Since(w.start).Seconds()), ev); err != nil {
		return nil, err
	}
	w.log.Info("evaluation", "epoch", epoch+1, "step", step, "results", ev.metrics, "split", ev.split, "evaluated", ev.count, "of", ev.total, "time_up", ev.timeUp)
	return ev.metrics, nil
}

// evalReserve is the time -max-time keeps for the final evaluation (rank
// 0; see the pure evalReserve).
func (w *worker) evalReserve() time.Duration {
	return evalReserve(w.cfg.MaxTime, w.evalPerBatch, w.lastStepTime, w.task.EvalBatches(), evalBatchSize(w.cfg, w.runner.ds, w.size), w.cfg.Batch.Value())
}

// lrSchedule is the learning rate's schedule of a run with perEpoch steps
// per epoch.
func lrSchedule(cfg Config, perEpoch int) Schedule {
	sched := Schedule{Base: cfg.LR.Value(), WarmupIters: int(cfg.WarmupEpochs * float64(perEpoch)), DecayEpochs: cfg.DecayEpochs, Factor: cfg.DecayFactor.Value()}
	if cfg.LRSchedule == "onecycle" {
		// One cycle over the whole run: -epochs, or -steps when it ends
		// the run earlier (-max-time cannot be foreseen).
		sched.OneCycleIters = cfg.Epochs.Value() * perEpoch
		if cfg.Steps > 0 {
			sched.OneCycleIters = min(sched.OneCycleIters, cfg.Steps)
		}
	}
	return sched
}

// loop trains from the start or the checkpoint resumed, carrying out what
// the run's schedule (schedule.go) decides between the steps.
func (w *worker) loop(ctx context.Context) error {
	cfg := w.cfg
	perEpoch := w.task.Len()
	lrs := lrSchedule(cfg, perEpoch)
	sched := newRunSchedule(cfg, perEpoch)
	w.sched = sched
	pos := position{}
	if cfg.Resume != "" {
		var err error
		if pos, err = w.restore(ctx); err != nil {
			return err
		}
	}
	step := pos.step
	w.runner.status.step.Store(int64(step))
	if step > 0 {
		// The learning rate of the step before the checkpoint
		// (-feedback-lr rescales the residual from it).
		w.dataPath.prevLR = lrs.At(step-1, (step-1)/perEpoch)
	}
	notesEpoch := perEpoch
	if rec := w.runner.ds.Recording; rec != nil {
		notesEpoch = rec.Manifest.StepsPerEpoch // the recorded training's epochs
	}
	for _, n := range append(methodNotes(cfg, w.dataPath.layout, sched.totalSteps(), notesEpoch), runNotes(cfg, w.size)...) {
		if err := w.note(n); err != nil {
			return err
		}
	}
	// did is what the run has done: its last evaluation and checkpoint.
	first, did := sched.atStart(pos, cfg.Resume != "", w.checkpoints.evaluated)
	if err := w.follow(ctx, first, pos.evalEpoch, step, &did); err != nil {
		return w.failed(err, step)
	}
	if first.stop != goOn {
		w.ended = first.stop
		return nil
	}
	startBatch := pos.batch
	for epoch := pos.epoch; ; epoch++ {
		if err := w.task.SetEpoch(epoch); err != nil {
			return fmt.Errorf("epoch %d: %w", epoch+1, err)
		}
		w.dataPath.model.ResetState()
		if w.checkpoints.modelState != nil {
			// The resumed epoch continues the checkpoint's model state.
			if err := w.dataPath.model.(models.Stateful).LoadState(w.checkpoints.modelState); err != nil {
				return err
			}
			w.checkpoints.modelState = nil
		}
		prog := w.out.progress()
		if prog != nil {
			prog.startEpoch(epoch+1, cfg.Epochs.Value(), perEpoch-startBatch)
			if startBatch > 0 {
				sum, n := rundir.StepLosses(cfg.Out, epoch+1, step)
				prog.resumedEpoch(startBatch, sum, n)
			}
		}
		var lastLoss float64
		for i := startBatch; i < perEpoch; i++ {
			timeUp, stop, err := w.agree(ctx)
			if err != nil {
				return w.failed(err, step)
			}
			if w.rank == 0 {
				// Every rank has written the steps done (they have all
				// agreed to go on after them).
				if err := w.dataPath.recorder.commit(step); err != nil {
					return w.failed(err, step)
				}
			}
			if before := sched.beforeStep(position{epoch: epoch, batch: i, step: step}, did, timeUp, stop); before.stop != goOn {
				if prog != nil {
					prog.endEpoch()
				}
				err := w.follow(ctx, before, epoch, step, &did)
				if before.stop == stopAsked {
					if err != nil {
						return w.failed(interruptedBut(err), step)
					}
					return w.failed(collective(ErrInterrupted), step)
				}
				w.ended = before.stop
				return w.failed(err, step)
			}
			if err := ctx.Err(); err != nil {
				return w.failed(fmt.Errorf("stopped: %w", err), step)
			}
			lr := lrs.At(step, epoch)
			batch, samples, err := w.task.Batch(i)
			if err != nil {
				return w.failed(&stepError{step + 1, epoch, fmt.Errorf("batch %d of the epoch: %w", i, err)}, step)
			}
			stats, err := w.dataPath.step(ctx, step+1, batch, lr)
			if err != nil {
				return w.failed(&stepError{step + 1, epoch, err}, step)
			}
			stats.Samples = samples
			w.lastStepTime = stats.Iter
			step++
			w.runner.status.step.Store(int64(step))
			w.keep()
			if err := w.profile(ctx, step); err != nil {
				return w.failed(err, step)
			}
			after := sched.afterStep(epoch, i, step, did)
			if after.checkParams {
				if err := w.checkParams(ctx, step); err != nil {
					return w.failed(err, step)
				}
			}
			lastLoss = stats.Loss
			if after.log {
				rec, err := w.gather(ctx, stats, epoch, step, lr)
				if err != nil {
					return w.failed(err, step)
				}
				lastLoss = float64(rec.Loss)
				if err := w.out.step(rec); err != nil {
					return w.failed(err, step)
				}
			}
			if prog != nil {
				prog.add(samples*w.size, lastLoss)
			}
			if err := w.follow(ctx, after, epoch, step, &did); err != nil {
				return w.failed(err, step)
			}
		}
		startBatch = 0
		if prog != nil {
			prog.endEpoch()
		}
		end := sched.endOfEpoch(epoch, step, did)
		if err := w.follow(ctx, end, epoch, step, &did); err != nil {
			return w.failed(err, step)
		}
		// The report of the epochs so far is written in the background;
		// the final one when the worker returns.
		w.out.refreshReport()
		if end.stop != goOn {
			w.ended = end.stop
			return nil
		}
	}
}

// follow carries out plan p's checkpoint and evaluation (of 0-based epoch
// evalEpoch) at step, recording them in did. A checkpoint that cannot be
// written (a full disk) stops the run: the previous one is intact, and
// training on would only add steps that cannot be kept.
func (w *worker) follow(ctx context.Context, p plan, evalEpoch, step int, did *done) error {
	defer w.runner.status.setBetween("")
	if p.checkpoint {
		w.runner.status.setBetween("writing its checkpoint")
		end := w.out.progress().during(fmt.Sprintf("writing the checkpoint of step %d", p.at.step))
		err := w.checkpoint(ctx, p.at)
		end()
		if err != nil {
			return err
		}
		did.checkpoint = p.at.step
	}
	if p.evaluate {
		w.runner.status.setBetween("evaluating")
		if _, err := w.evaluate(ctx, evalEpoch, step); err != nil {
			return err
		}
		did.eval = step
	}
	return nil
}
