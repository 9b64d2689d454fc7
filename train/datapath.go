package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// dataPath is one rank's training step and the state it works on: the
// model, the parameters and the gradient on the rank's device, the
// error-feedback residual, the reducer, the optimizer and the streams. Its
// step runs one iteration: forward and backward, [clip], error feedback,
// the reduction (pipelined with the backward pass for a method that
// reduces groups), [clip], the update. The worker (worker.go) owns a data path and decides which steps
// run and what happens between them (schedule.go).
type dataPath struct {
	cfg        Config
	rank, size int
	// sim is the simulation of several workers in one process (nil
	// without): they share the parameters and the optimizer (rank 0
	// updates) and enter the reduction together.
	sim *simulation
	// replay says that the model replays recorded gradients: it has no
	// loss to check.
	replay bool

	model  models.Model
	layout sparsify.Layout

	// compute is the model's stream. commStream is, on a GPU with
	// pipelining, the stream of the pipelined groups' error feedback and
	// reduction beside it: a group waits for its own gradients only, not
	// for the rest of the backward pass (nil otherwise).
	compute, commStream device.Stream

	// The vectors on the device: the parameters; the gradient, which after
	// error feedback also holds the reducer's output (the averaged sparse
	// gradient the optimizer applies); the error-feedback residual. And
	// their host views: the vectors themselves on the CPU, staging copies
	// elsewhere (initial parameters, checkpoints).
	params, grad, residual             device.Buffer
	hostParams, hostGrad, hostResidual []float32

	// reducer is the method, reducing in the memory of the device.
	reducer *sparsify.Reducer
	// feedbackOps are the device's vector operations of error feedback.
	feedbackOps sparsify.Ops
	// On a GPU, error feedback's finiteness check is a flag on the device
	// (cuda.Sparse.AccumulateFlag) that the step reads with its last wait,
	// into flagHost (empty buffer on the CPU, which checks at once).
	flag     device.Buffer
	flagHost []int64
	// opt updates the parameters (nil on simulated workers but rank 0).
	opt Optimizer

	// pipe pipelines the reducer's groups with the backward pass (nil when
	// off).
	pipe *pipeline
	// gradFinal holds, for the step being run, the event at which each
	// tensor's gradient became final (the gradient hook's record; a
	// reducer that profiles the backward pass reads its times from it).
	gradFinal []device.Event

	// recorder records the gradients (-record-gradients; nil without);
	// stepNo is the run-wide number (from 1) of the step being run, or of
	// the last one run.
	recorder *gradRecorder
	stepNo   int
	// pending is the model of a step issued without waiting for its loss
	// (models.Deferred), until the step reads it (nil otherwise).
	pending models.Deferred
	// prevLR is the learning rate of the last step (0 before the first):
	// with -feedback-lr the residual is rescaled when it changes
	// (rescaleResidual).
	prevLR float64
}

// rescaleResidual keeps -feedback-lr's learning-rate-scaled error feedback
// (the papers' a_t = ε_{t−1} + η_t·g_t, θ ← θ − TopK(a_t)/n) in the raw
// form the reducer and the optimizer work with: the residual holds ε/η of
// the last step, so before a step with another learning rate lr it is
// multiplied by η_{t−1}/η_t. The selection (scale-free) and the update
// η_t·TopK(a_t/η_t) are then the papers'. Nothing without the option.
func (dp *dataPath) rescaleResidual(lr float64) error {
	if !dp.cfg.FeedbackLR {
		return nil
	}
	prev := dp.prevLR
	dp.prevLR = lr
	if prev == 0 || lr == prev || lr == 0 {
		return nil
	}
	return dp.compute.Device().Math().Scale(dp.compute, dp.residual, float32(prev/lr))
}

// newDataPath builds rank's data path for model on device dev (its
// stream compute): the vectors, the optimizer, the layout and the reducer,
// which communicates over counter with the vector operations reduceOps
// (nil: the CPU's); feedbackOps are those of error feedback.
func newDataPath(cfg Config, rank, size int, sim *simulation, replay bool, model models.Model, dev device.Device, compute device.Stream, counter *comm.Counter, reduceOps, feedbackOps sparsify.Ops) (*dataPath, error) {
	dp := &dataPath{cfg: cfg, rank: rank, size: size, sim: sim, replay: replay, model: model, compute: compute, feedbackOps: feedbackOps}
	if err := dp.allocate(dev); err != nil {
		return nil, err
	}
	var err error
	if dp.layout, err = layout.Of(model.Layout()); err != nil {
		return nil, fmt.Errorf("train: layout of %s: %w", cfg.Model, err)
	}
	if err := dp.buildReducer(dev, counter, reduceOps); err != nil {
		return nil, err
	}
	dp.gradFinal = make([]device.Event, len(dp.layout.Tensors))
	// The hook drives pipelining and measures the per-tensor backward
	// times of a reducer that profiles them.
	if dp.pipe != nil || dp.reducer.Profiling() {
		model.SetGradHook(dp.hook)
	}
	return dp, nil
}

// allocate allocates the parameters (one vector for all simulated
// workers), the gradient and the residual on dev, their host views, and
// the optimizer (one for all simulated workers, rank 0's).
func (dp *dataPath) allocate(dev device.Device) error {
	n := dp.model.NumParams()
	var err error
	if sim := dp.sim; sim != nil {
		var opt Optimizer
		dp.params, opt, err = sim.shared(func() (device.Buffer, Optimizer, error) {
			p, err := dev.Alloc(device.Float32, n)
			if err != nil {
				return device.Buffer{}, nil, fmt.Errorf("train: allocating the parameters: %w", err)
			}
			o, err := dp.newOptimizer()
			return p, o, err
		})
		if err != nil {
			return err
		}
		if dp.rank == 0 {
			dp.opt = opt
		}
	} else {
		if dp.params, err = dev.Alloc(device.Float32, n); err != nil {
			return fmt.Errorf("train: allocating the parameters: %w", err)
		}
		if dp.opt, err = dp.newOptimizer(); err != nil {
			return err
		}
	}
	if dp.grad, err = dev.Alloc(device.Float32, n); err != nil {
		return fmt.Errorf("train: allocating the gradient: %w", err)
	}
	if dp.residual, err = dev.Alloc(device.Float32, n); err != nil {
		return fmt.Errorf("train: allocating the error-feedback residual: %w", err)
	}
	dp.hostParams, dp.hostGrad, dp.hostResidual = hostView(dp.params), hostView(dp.grad), hostView(dp.residual)
	if _, ok := dp.feedbackOps.(*cuda.Sparse); ok && !dp.grad.IsHost() && n <= cuda.MaxFlagged {
		if dp.flag, err = dev.Alloc(device.Int64, 1); err != nil {
			return fmt.Errorf("train: allocating error feedback's finiteness flag: %w", err)
		}
		dp.flagHost = []int64{-1} // cuda.FeedbackFlagClear
		if err := dp.compute.Copy(dp.flag, device.Host(dp.flagHost)); err != nil {
			return err
		}
	}
	return nil
}

// newOptimizer is -optimizer for the model's parameters.
func (dp *dataPath) newOptimizer() (Optimizer, error) {
	cfg, params := dp.cfg, dp.model.Layout()
	switch cfg.Optimizer {
	case "sgd":
		if method, _ := sparsify.Lookup(cfg.Sparsifier); method.CorrectsMomentum {
			// The reducer applies the momentum (DGC's momentum
			// correction); the optimizer the weight decay only.
			return NewDecayOnlySGD(dp.compute, params, cfg.Momentum.Value(), cfg.WeightDecay.Value())
		}
		return NewSGD(dp.compute, params, cfg.Momentum.Value(), cfg.WeightDecay.Value(), cfg.Nesterov)
	case "adam":
		return NewAdam(dp.compute, dp.model.NumParams(), cfg.Beta1.Value(), cfg.Beta2.Value(), cfg.Eps.Value())
	case "none":
		return noUpdate{}, nil
	}
	return nil, fmt.Errorf("%w: unknown -optimizer %q", ErrConfig, cfg.Optimizer)
}

// buildReducer builds -sparsifier over counter, and its pipeline with
// -pipeline. A pipelined reducer works on a communication stream of its
// own on a GPU (its groups start while the compute stream goes on with the
// backward pass); the others on the compute stream.
func (dp *dataPath) buildReducer(dev device.Device, counter *comm.Counter, reduceOps sparsify.Ops) error {
	cfg := dp.cfg
	method, _ := sparsify.Lookup(cfg.Sparsifier)
	var momentum float64
	if method.CorrectsMomentum && (cfg.Optimizer == "sgd" || cfg.Gradients != "") { // a replay's momentum is the recording's
		momentum = cfg.Momentum.Value()
	}
	stream := dp.compute
	if cfg.PipelineOn() && !dp.grad.IsHost() {
		var err error
		if dp.commStream, err = dev.NewStream(); err != nil {
			return fmt.Errorf("train: a communication stream for pipelining: %w", err)
		}
		stream = dp.commStream
	}
	red, err := sparsify.New(cfg.Sparsifier, sparsify.Options{
		Density: cfg.Density.Value(), Layout: dp.layout, Comm: counter, Seed: cfg.Seed.Value(),
		Params:  cfg.MethodOptions,
		Network: netmodel.Network{Latency: cfg.NetLatency, Bandwidth: cfg.NetBandwidth},
		Stream:  stream, Ops: reduceOps,
		Momentum: momentum,
	})
	if err != nil {
		return fmt.Errorf("train: -sparsifier %s: %w", cfg.Sparsifier, err)
	}
	dp.reducer = red
	if cfg.PipelineOn() {
		dp.pipe = newPipeline(red.Groups(), len(dp.layout.Tensors))
	}
	return nil
}

// hostView returns the host memory of a device vector: the vector's own
// memory on the CPU, staging of its size elsewhere (for what only the host
// does: initial parameters, checkpoints).
func hostView(b device.Buffer) []float32 {
	if b.IsHost() {
		return b.Float32s()
	}
	return make([]float32, b.Len())
}

// download copies a device vector into its host view (nothing on the CPU).
func (dp *dataPath) download(h []float32, b device.Buffer) error {
	if b.IsHost() {
		return nil
	}
	if err := dp.compute.Copy(device.Host(h), b); err != nil {
		return err
	}
	return dp.compute.Synchronize()
}

// upload copies a host view into its device vector (nothing on the CPU).
func (dp *dataPath) upload(b device.Buffer, h []float32) error {
	if b.IsHost() {
		return nil
	}
	return dp.compute.Copy(b, device.Host(h))
}

// accumulate adds the gradient's elements [lo, hi) to the error-feedback
// residual on stream st, which then holds the error-compensated gradient;
// a non-finite result is an error naming the tensor.
//
// On a GPU the check is deferred: the flag is read with the step's last
// wait (checkFlag), after the update, when the step fails.
//
// With hist (the reducer's Histogram, on a GPU), the same pass counts the
// first radix round of the reducer's top-k of the accumulated vector.
func (dp *dataPath) accumulate(st device.Stream, lo, hi int, hist device.Buffer) error {
	if dp.flag.Len() > 0 {
		ops := dp.feedbackOps.(*cuda.Sparse)
		var err error
		if hist.Len() > 0 {
			err = ops.AccumulateFlagHist(st, dp.residual.Slice(lo, hi), dp.grad.Slice(lo, hi), dp.flag, hist, lo, 1)
		} else {
			err = ops.AccumulateFlag(st, dp.residual.Slice(lo, hi), dp.grad.Slice(lo, hi), dp.flag, lo, 1)
		}
		if err != nil {
			return fmt.Errorf("train: error feedback: %w", err)
		}
		return nil
	}
	bad, err := dp.feedbackOps.Accumulate(st, dp.residual.Slice(lo, hi), dp.grad.Slice(lo, hi), 1)
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
	if err := dp.download(dp.hostGrad, dp.grad); err != nil {
		return err
	}
	if err := dp.download(dp.hostResidual, dp.residual); err != nil {
		return err
	}
	return dp.accumulateError(fmt.Errorf("element %d of the error-compensated gradient is not finite", lo+bad), lo, hi)
}

// readFlag copies error feedback's finiteness flag to the host on the
// compute stream, after everything the step issued before it (nothing on the
// CPU); the value is there once the stream is synchronised.
func (dp *dataPath) readFlag() error {
	if dp.flag.Len() == 0 {
		return nil
	}
	return dp.compute.Copy(device.Host(dp.flagHost), dp.flag)
}

// checkFlag reads error feedback's finiteness flag (copied by readFlag,
// the compute stream since synchronised): an error naming the tensor of the
// first element of the error-compensated gradient that is not finite, and
// whether the gradient's element was.
func (dp *dataPath) checkFlag() error {
	if dp.flag.Len() == 0 {
		return nil
	}
	ok, i, gradient, v := cuda.DecodeFeedbackFlag(uint64(dp.flagHost[0]))
	if ok {
		return nil
	}
	// Cleared again for a step that follows (the run stops here).
	dp.flagHost[0] = -1
	if err := dp.compute.Copy(dp.flag, device.Host(dp.flagHost)); err != nil {
		return err
	}
	what := "error-compensated gradient (residual + gradient)"
	if gradient {
		what = "gradient"
	}
	return dp.nonFiniteValue(what, v, i)
}

// syncFlag waits for the compute stream and checks the finiteness flag:
// what a failed step does before it reports, so that a non-finite gradient
// is named as such rather than by what it broke later (nothing on the CPU).
func (dp *dataPath) syncFlag() error {
	if dp.flag.Len() == 0 {
		return nil
	}
	if dp.commStream != nil {
		if err := dp.commStream.Synchronize(); err != nil {
			return err
		}
	}
	if err := dp.readFlag(); err != nil {
		return err
	}
	if err := dp.compute.Synchronize(); err != nil {
		return err
	}
	return dp.checkFlag()
}

// flagFirst is err of a step that failed after error feedback, unless
// error feedback's finiteness check failed first, or the loss of a step
// that deferred its read is not finite: then that error (a non-finite
// gradient or loss breaks what follows it).
func (dp *dataPath) flagFirst(err error) error {
	if ferr := dp.syncFlag(); ferr != nil {
		return ferr
	}
	if d := dp.pending; d != nil {
		dp.pending = nil
		if dp.flag.Len() == 0 { // syncFlag waited for nothing
			if serr := dp.compute.Synchronize(); serr != nil {
				return errors.Join(err, serr)
			}
		}
		res, lerr := d.LastStep()
		if lerr == nil {
			lerr = dp.checkLoss(res.Loss)
		}
		if lerr != nil {
			return lerr
		}
	}
	return err
}

// checkLoss is the error of a non-finite loss (nil for a replay, which
// has none).
func (dp *dataPath) checkLoss(loss float64) error {
	if (math.IsNaN(loss) || math.IsInf(loss, 0)) && !dp.replay {
		return fmt.Errorf("%w: the loss is %v", errNonFinite, loss)
	}
	return nil
}

// accumulateError explains a failed error-feedback accumulation of the
// gradient elements [lo, hi): the first non-finite gradient element, by
// tensor, or else the residual that overflowed.
func (dp *dataPath) accumulateError(err error, lo, hi int) error {
	if i := firstNonFinite(dp.hostGrad[lo:hi]); i >= 0 {
		return dp.nonFinite("gradient", dp.hostGrad, lo+i)
	}
	if i := firstNonFinite(dp.hostResidual[lo:hi]); i >= 0 {
		return dp.nonFinite("error-compensated gradient (residual + gradient)", dp.hostResidual, lo+i)
	}
	return fmt.Errorf("error feedback: %w", err)
}

// localClip is the threshold of local clipping: -clip, divided by √n for a
// method that scales it (DGC's local gradient clipping,
// sparsify.Method.ScaledClip).
func (dp *dataPath) localClip() float64 {
	if m, _ := sparsify.Lookup(dp.cfg.Sparsifier); m.ScaledClip {
		return dp.cfg.Clip.Value() / math.Sqrt(float64(dp.size))
	}
	return dp.cfg.Clip.Value()
}

// hook runs on the model's goroutine when tensor idx's gradient is final
// (in the gradient vector once ready has completed).
func (dp *dataPath) hook(idx int, ready device.Event) {
	dp.gradFinal[idx] = ready
	if dp.pipe != nil {
		dp.pipe.tensorFinal(idx)
	}
}

// startGroups runs on the pipeline's goroutine: the gradients of the
// groups gs (handed over together) are final; it adds them to the
// error-feedback memory and starts the groups' reduction, whose output
// overwrites the groups' gradient (which error feedback has just consumed).
func (dp *dataPath) startGroups(ctx context.Context, gs []int) error {
	st := dp.compute
	if dp.commStream != nil {
		// The pipeline's goroutine is the communication stream's only
		// user while the step's pass runs.
		defer hold(dp.commStream)()
		// On the GPU, on the communication stream, after the groups'
		// gradients.
		st = dp.commStream
		for _, g := range gs {
			for _, t := range dp.pipe.groups[g].Tensors {
				if err := st.Wait(dp.gradFinal[t]); err != nil {
					return err
				}
			}
		}
	}
	// Adjacent groups are accumulated in one pass where the finiteness
	// check is a flag (the first bad element's index: the same whichever
	// pass finds it); on the host each group's, in order, which reports
	// the first bad element of the first group that has one.
	for i := 0; i < len(gs); {
		lo, hi := dp.pipe.groups[gs[i]].Lo, dp.pipe.groups[gs[i]].Hi
		i++
		for dp.flag.Len() > 0 && i < len(gs) && dp.pipe.groups[gs[i]].Hi == lo {
			lo = dp.pipe.groups[gs[i]].Lo
			i++
		}
		if err := dp.accumulate(st, lo, hi, device.Buffer{}); err != nil {
			return err
		}
	}
	dp.pipe.reducing()
	if err := dp.reducer.StartGroups(ctx, gs, dp.residual, dp.grad, dp.residual); err != nil {
		return fmt.Errorf("train: starting groups %v: %w", gs, err)
	}
	return nil
}

// hold holds stream s where it can be held (a GPU stream's Hold: the OS
// thread locked with the device's context current once, instead of once
// per call) until release; only the holding goroutine may use s meanwhile.
func hold(s device.Stream) (release func()) {
	if h, ok := s.(interface{ Hold() (release func()) }); ok {
		return h.Hold()
	}
	return func() {}
}

// step runs the run's step n (from 1) on batch b with learning rate lr.
func (dp *dataPath) step(ctx context.Context, n int, b models.Batch, lr float64) (stepStats, error) {
	// The step's calls on the compute stream are issued from this
	// goroutine, with the stream held: none pays a context switch. (A
	// pipeline without a stream of its own, on the CPU, shares it.)
	if dp.pipe == nil || dp.commStream != nil {
		defer hold(dp.compute)()
	}
	dp.stepNo = n
	var s stepStats
	if err := dp.rescaleResidual(lr); err != nil {
		return s, fmt.Errorf("train: -feedback-lr: %w", err)
	}
	clear(dp.gradFinal)
	var result models.StepResult
	var t1 time.Time
	// A model that can defer its loss (models.Deferred) has it read with
	// the step's last wait rather than a wait of its own; a recorded
	// step's time is needed at once.
	deferred, _ := dp.model.(models.Deferred)
	if dp.recorder != nil {
		deferred = nil
	}
	dp.pending = nil
	pass := func() error {
		var err error
		if deferred != nil {
			if err = deferred.StartStep(ctx, b, dp.params, dp.grad); err == nil {
				dp.pending = deferred
			}
		} else {
			result, err = dp.model.TrainStep(ctx, b, dp.params, dp.grad)
		}
		t1 = time.Now()
		return err
	}
	t0 := time.Now()
	var err error
	if dp.pipe != nil {
		err = dp.pipe.run(pass, func(gs []int) error { return dp.startGroups(ctx, gs) })
		if dp.commStream != nil {
			// The pipeline's goroutine has ended: the rest of the step
			// (Finish) issues on the communication stream from here.
			defer hold(dp.commStream)()
		}
	} else {
		err = pass()
	}
	if err != nil {
		if dp.pipe != nil {
			dp.reducer.Finish(ctx) // waits for the groups started; the step fails
		}
		return s, fmt.Errorf("train: %s step: %w", dp.cfg.Model, err)
	}
	s.Loss = result.Loss
	// The time waiting for a shared executor is not computing.
	s.Compute, s.Queued = t1.Sub(t0)-result.Queued, result.Queued
	if dp.recorder != nil {
		if dp.rank == 0 {
			dp.recorder.times = append(dp.recorder.times, s.Compute.Seconds())
		}
		// Recording is not part of the step's times.
		tr := time.Now()
		if err := dp.recordGradient(); err != nil {
			return s, err
		}
		d := time.Since(tr)
		t0, t1 = t0.Add(d), t1.Add(d)
	}
	if sim := dp.sim; sim != nil && dp.pipe == nil {
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
	s.Forward, s.Backward = result.Forward, result.Backward
	var st sparsify.Stats
	var started time.Time
	if dp.pipe != nil {
		var err error
		st, err = dp.reducer.Finish(ctx)
		if dp.pipe.err != nil {
			return s, dp.flagFirst(dp.pipe.err)
		}
		if err != nil {
			return s, dp.flagFirst(fmt.Errorf("train: reducing with %s: %w", dp.cfg.Sparsifier, err))
		}
		started = dp.pipe.started
		if dp.commStream != nil {
			// The update waits for the groups' outputs.
			ev, err := dp.commStream.Record()
			if err == nil {
				err = dp.compute.Wait(ev)
			}
			if err != nil {
				return s, err
			}
		}
	} else {
		if dp.cfg.ClipLocal() {
			if _, err := ClipNorm(dp.compute, dp.grad, dp.localClip()); err != nil {
				return s, err
			}
		}
		// On a GPU error feedback's pass also counts the first radix round
		// of a method's top-k of the accumulated gradient, whose selection
		// then skips that pass (the reducer works on the compute stream).
		var hist device.Buffer
		if dp.flag.Len() > 0 {
			if hist, err = dp.reducer.Histogram(); err != nil {
				return s, err
			}
		}
		if err := dp.accumulate(dp.compute, 0, dp.grad.Len(), hist); err != nil {
			return s, err
		}
		started = time.Now()
		// The reducer's output overwrites the gradient, which error
		// feedback has just consumed.
		if st, err = dp.reducer.ReduceOn(ctx, dp.residual, dp.grad, dp.residual); err != nil {
			return s, dp.flagFirst(fmt.Errorf("train: reducing with %s: %w", dp.cfg.Sparsifier, err))
		}
	}
	if dp.pending == nil {
		if err := dp.checkLoss(s.Loss); err != nil {
			return s, dp.flagFirst(err)
		}
	}
	if dp.cfg.ClipAggregated() {
		// The averaged gradient, the same on every worker.
		if _, err := ClipNorm(dp.compute, dp.grad, dp.cfg.Clip.Value()); err != nil {
			return s, err
		}
	}
	t2 := time.Now()
	// The reduced gradient's time on the device, when the step does not
	// wait for it (read after the step's last wait).
	var reduced device.Event
	if dp.pending != nil && !dp.grad.IsHost() {
		var err error
		if reduced, err = dp.compute.Record(); err != nil {
			return s, err
		}
	}
	if err := dp.update(ctx, lr); err != nil {
		return s, dp.flagFirst(err)
	}
	// Error feedback's finiteness check, and a deferred step's loss, are
	// read with the step's last wait; a non-finite gradient or loss fails
	// the step (its update is not kept: the run stops, and no checkpoint
	// holds it).
	if err := dp.readFlag(); err != nil {
		return s, err
	}
	if err := dp.compute.Synchronize(); err != nil {
		return s, err
	}
	if err := dp.checkFlag(); err != nil {
		return s, err
	}
	t3 := time.Now()
	if d := dp.pending; d != nil {
		dp.pending = nil
		if result, err = d.LastStep(); err != nil {
			return s, err
		}
		s.Loss, s.Forward, s.Backward = result.Loss, result.Forward, result.Backward
		if err := dp.checkLoss(s.Loss); err != nil {
			return s, err
		}
		// The pass ended on the device, not when it was issued; the
		// reduced gradient was there when both host and device were done
		// with it.
		if end := t0.Add(result.Queued + result.Forward + result.Backward); end.After(t1) && end.Before(t3) {
			t1 = end
		}
		s.Compute = t1.Sub(t0) - result.Queued
		if reduced != nil {
			at, err := reduced.Time()
			if err != nil {
				return s, fmt.Errorf("train: timing the reduced gradient: %w", err)
			}
			if at.After(t2) && at.Before(t3) {
				t2 = at
			}
		}
		if t2.Before(t1) {
			t2 = t1
		}
	}
	if !started.IsZero() {
		s.CommWall = t2.Sub(started)
	}
	s.Wait = t2.Sub(t1)
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
func (dp *dataPath) update(ctx context.Context, lr float64) error {
	sim := dp.sim
	if sim == nil {
		return dp.opt.Step(dp.params, dp.grad, lr)
	}
	if err := sim.bar.wait(ctx); err != nil {
		return err
	}
	if dp.rank == 0 {
		if err := dp.opt.Step(dp.params, dp.grad, lr); err != nil {
			sim.bar.abort(err)
			return err
		}
	}
	return sim.bar.wait(ctx)
}
