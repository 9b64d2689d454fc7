package train

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// worker is one rank's training loop.
type worker struct {
	r      *runner
	cfg    Config
	c      comm.Communicator
	cnt    *comm.Counter // the reducer's communicator, counted
	prevOp []comm.OpStats
	rank   int
	size   int
	log    *slog.Logger
	m      models.Model
	task   task
	layout sparsify.Layout
	red    sparsify.Reducer
	mem    *sparsify.Memory
	opt    Optimizer

	// The worker's vectors on its device: the parameters and the gradient,
	// which after error feedback also holds the reducer's output (the
	// averaged sparse gradient the optimizer applies).
	stream         device.Stream
	params, grad   device.Buffer
	hparams, hgrad []float32 // host views of params and grad (the vectors themselves on the CPU)

	// Gradient hook state (reset every step).
	finalEv []device.Event

	// LAGS pipelining.
	pipe    bool
	gred    sparsify.GroupReducer
	groups  []sparsify.Group
	groupOf []int
	arrived []int
	next    int
	ready   []bool
	ch      chan int
	pend    []sparsify.Pending
	perr    error
	started time.Time // first group started this step
	setBwd  bool

	metrics *metricsWriter
	prog    *progress
}

// stepLocal is what one rank measured in one step.
type stepLocal struct {
	loss                                    float64
	tf, tb, tsel, tcomm, tupd, titer, twait time.Duration
	tcompute                                time.Duration
	tcommWall                               time.Duration
	sent, recv                              int64
	errNorm, actual, threshold              float64
	layerK                                  []int
	samples                                 int
}

func (r *runner) worker(ctx context.Context, c comm.Communicator) (err error) {
	cfg := r.cfg
	w := &worker{r: r, cfg: cfg, c: c, rank: c.Rank(), size: c.Size()}
	if err := os.MkdirAll(filepath.Join(cfg.Out, "checkpoints"), 0o755); err != nil {
		return fmt.Errorf("train: creating the run directory: %w", err)
	}
	lg, closer, err := rankLogger(cfg.Out, w.rank)
	if err != nil {
		return err
	}
	defer closer.Close()
	w.log = lg
	defer func() {
		if err != nil {
			w.log.Error("training failed", "err", err)
		}
	}()
	if err := w.setup(ctx); err != nil {
		return err
	}
	defer w.task.Close()
	defer w.metrics.close()
	return w.loop(ctx)
}

func (w *worker) setup(ctx context.Context) error {
	cfg := w.cfg
	be, err := w.r.exec(w.rank)
	if err != nil {
		return err
	}
	// Dropout masks differ per rank; the initial parameters are rank 0's.
	m, err := NewModel(cfg, w.r.ds, cfg.Seed.Value()+uint64(w.rank), be)
	if err != nil {
		return fmt.Errorf("train: building %s: %w", cfg.Model, err)
	}
	w.m = m
	w.stream = be.Stream()
	w.cnt = comm.NewCounter(w.c)
	w.prevOp = make([]comm.OpStats, len(comm.Ops()))
	n := m.NumParams()
	if w.params, err = be.Device().Alloc(device.Float32, n); err != nil {
		return fmt.Errorf("train: allocating the parameters: %w", err)
	}
	if w.grad, err = be.Device().Alloc(device.Float32, n); err != nil {
		return fmt.Errorf("train: allocating the gradient: %w", err)
	}
	w.hparams, w.hgrad = hostView(w.params), hostView(w.grad)
	var names []string
	var sizes []int
	for _, p := range m.Layout() {
		names = append(names, p.Name)
		sizes = append(sizes, p.Size)
	}
	if w.layout, err = sparsify.NewLayout(names, sizes); err != nil {
		return fmt.Errorf("train: layout of %s: %w", cfg.Model, err)
	}
	w.red, err = sparsify.New(cfg.Sparsifier, sparsify.Options{
		Density: cfg.Density.Value(), Layout: w.layout, Comm: w.cnt, Seed: cfg.Seed.Value(),
		Params:  cfg.MethodOptions,
		Network: netmodel.Network{Latency: cfg.NetLatency, Bandwidth: cfg.NetBandwidth},
	})
	if err != nil {
		return fmt.Errorf("train: -sparsifier %s: %w", cfg.Sparsifier, err)
	}
	w.mem = sparsify.NewMemory(n, false)
	switch cfg.Optimizer {
	case "sgd":
		w.opt, err = NewSGD(w.stream, m.Layout(), cfg.Momentum.Value(), cfg.WeightDecay.Value(), cfg.Nesterov)
	case "adam":
		w.opt, err = NewAdam(w.stream, n, cfg.Beta1.Value(), cfg.Beta2.Value(), cfg.Eps.Value())
	}
	if err != nil {
		return err
	}
	w.pipe = cfg.PipelineOn()
	if w.pipe {
		gr, ok := w.red.(sparsify.GroupReducer)
		if !ok {
			return fmt.Errorf("%w: -sparsifier %s cannot be pipelined (no group reduction)", ErrConfig, cfg.Sparsifier)
		}
		w.gred = gr
		w.groups = gr.Groups()
		w.groupOf = make([]int, len(w.layout.Tensors))
		for g, gg := range w.groups {
			for _, t := range gg.Tensors {
				w.groupOf[t] = g
			}
		}
		w.arrived = make([]int, len(w.groups))
		w.ready = make([]bool, len(w.groups))
		w.pend = make([]sparsify.Pending, len(w.groups))
	}
	w.finalEv = make([]device.Event, len(w.layout.Tensors))
	// The hook drives pipelining and measures LAGS' per-tensor backward
	// times.
	if w.pipe || w.lagsAdaptive() {
		m.SetGradHook(w.hook)
	}
	if err := m.InitParams(w.hparams); err != nil {
		return err
	}
	if err := w.c.Broadcast(ctx, comm.Float32s(w.hparams), 0); err != nil {
		return fmt.Errorf("train: broadcasting the initial parameters: %w", err)
	}
	if err := w.upload(w.params, w.hparams); err != nil {
		return err
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
	if w.rank == 0 {
		info := RunInfo{Config: cfg, CommandLine: w.r.opt.CommandLine, Start: w.r.start, Backend: w.r.backend,
			Workers: w.size, Params: n, Tensors: len(w.layout.Tensors), Pipelined: w.pipe,
			Versions: versions(w.r.blas), Machine: machine(), Resumed: cfg.Resume, LayerNames: names, Device: be.Device().String()}
		if be.Device().Kind() == device.CUDAKind {
			info.Machine.GPU = be.Device().String()
		}
		if err := writeJSONAtomic(filepath.Join(cfg.Out, "run.json"), info); err != nil {
			w.task.Close()
			return fmt.Errorf("train: writing run.json: %w", err)
		}
		if w.metrics, err = openMetrics(filepath.Join(cfg.Out, "metrics.jsonl"), cfg.Resume != ""); err != nil {
			w.task.Close()
			return err
		}
		if !cfg.Quiet {
			w.prog = newProgress(w.r.opt.Progress, w.r.opt.Stdout)
		}
	}
	w.log.Info("worker ready", "model", cfg.Model, "params", n, "sparsifier", cfg.Sparsifier, "workers", w.size, "pipelined", w.pipe, "blas", w.r.blas)
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
// memory on the CPU, staging of its size elsewhere (the reducers work on
// host memory until they run on devices; see the package doc).
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

// downloadGroup copies a merge group's gradients to host memory once the
// device has finished them.
func (w *worker) downloadGroup(gg sparsify.Group) error {
	for _, t := range gg.Tensors {
		if err := w.finalEv[t].Synchronize(); err != nil {
			return err
		}
	}
	if err := w.stream.Copy(device.Host(w.hgrad[gg.Lo:gg.Hi]), w.grad.Slice(gg.Lo, gg.Hi)); err != nil {
		return err
	}
	return w.stream.Synchronize()
}

// lagsAdaptive reports whether LAGS chooses per-layer densities from
// measured backward times.
func (w *worker) lagsAdaptive() bool {
	l, ok := w.red.(*sparsify.LAGS)
	return ok && l.Adaptive()
}

// hook runs on the model's goroutine when tensor idx's gradient is final
// (in the gradient vector once ready has completed).
func (w *worker) hook(idx int, ready device.Event) {
	w.finalEv[idx] = ready
	if !w.pipe {
		return
	}
	g := w.groupOf[idx]
	w.arrived[g]++
	if w.arrived[g] == len(w.groups[g].Tensors) {
		w.ready[g] = true
	}
	for w.next < len(w.groups) && w.ready[w.next] {
		w.ch <- w.next
		w.next++
	}
}

// pipeline accumulates and starts every group it receives, in order.
func (w *worker) pipeline(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	for g := range w.ch {
		if w.perr != nil {
			continue
		}
		gg := w.groups[g]
		if !w.grad.IsHost() {
			if err := w.downloadGroup(gg); err != nil {
				w.perr = err
				continue
			}
		}
		mm := sparsify.Memory{Residual: w.mem.Residual[gg.Lo:gg.Hi]}
		if _, err := mm.Accumulate(w.hgrad[gg.Lo:gg.Hi], 1); err != nil {
			w.perr = fmt.Errorf("train: gradient of merge group %d (elements %d..%d): %w", g, gg.Lo, gg.Hi, err)
			continue
		}
		if w.started.IsZero() {
			w.started = time.Now()
		}
		// The reducer's output overwrites the group's gradient, which
		// error feedback has just consumed.
		p, err := w.gred.StartGroup(ctx, g, w.mem.Residual, w.hgrad, w.mem.Residual)
		if err != nil {
			w.perr = fmt.Errorf("train: starting merge group %d: %w", g, err)
			continue
		}
		w.pend[g] = p
	}
}

// step runs one iteration on batch b with learning rate lr.
func (w *worker) step(ctx context.Context, b models.Batch, lr float64) (stepLocal, error) {
	var s stepLocal
	clear(w.finalEv)
	var done chan struct{}
	if w.pipe {
		for i := range w.arrived {
			w.arrived[i], w.ready[i], w.pend[i] = 0, false, nil
		}
		w.next, w.perr, w.started = 0, nil, time.Time{}
		w.ch = make(chan int, len(w.groups))
		done = make(chan struct{})
		go w.pipeline(ctx, done)
	}
	t0 := time.Now()
	res, err := w.trainStep(ctx, b)
	t1 := time.Now()
	if w.pipe {
		close(w.ch)
		<-done
	}
	if err != nil {
		if w.pipe {
			w.drain(ctx)
		}
		return s, fmt.Errorf("train: %s step: %w", w.cfg.Model, err)
	}
	s.loss = res.Loss
	s.tcompute = t1.Sub(t0)
	s.tf, s.tb = res.Forward, res.Backward
	var st sparsify.Stats
	if w.pipe {
		if w.perr != nil {
			w.drain(ctx)
			return s, w.perr
		}
		gs := make([]sparsify.GroupStats, len(w.groups))
		for g, p := range w.pend {
			if p == nil {
				w.drain(ctx)
				return s, fmt.Errorf("train: merge group %d was never started (its gradients were not all reported by the model)", g)
			}
			if gs[g], err = p.Wait(ctx); err != nil {
				w.pend[g] = nil
				w.drain(ctx)
				return s, fmt.Errorf("train: reducing merge group %d: %w", g, err)
			}
			w.pend[g] = nil
		}
		st = sparsify.CombineGroupStats(w.cfg.Density.Value(), w.layout, w.groups, gs)
	} else {
		if w.cfg.Clip.Value() > 0 {
			if _, err := ClipNorm(w.stream, w.grad, w.cfg.Clip.Value()); err != nil {
				return s, err
			}
		}
		if err := w.download(w.hgrad, w.grad); err != nil {
			return s, err
		}
		acc, err := w.mem.Accumulate(w.hgrad, 1)
		if err != nil {
			return s, fmt.Errorf("train: error feedback: %w", err)
		}
		w.started = time.Now()
		// The reducer's output overwrites the gradient, which error
		// feedback has just consumed.
		if st, err = w.red.Reduce(ctx, acc, w.hgrad, acc); err != nil {
			return s, fmt.Errorf("train: reducing with %s: %w", w.cfg.Sparsifier, err)
		}
	}
	if err := w.upload(w.grad, w.hgrad); err != nil {
		return s, err
	}
	t2 := time.Now()
	if !w.started.IsZero() {
		s.tcommWall = t2.Sub(w.started)
	}
	s.twait = t2.Sub(t1)
	if err := w.opt.Step(w.params, w.grad, lr); err != nil {
		return s, err
	}
	if err := w.stream.Synchronize(); err != nil {
		return s, err
	}
	t3 := time.Now()
	s.tupd = t3.Sub(t2)
	s.titer = t3.Sub(t0)
	s.tsel, s.tcomm = st.SelectTime, st.CommTime
	s.sent, s.recv = st.BytesSent, st.BytesRecv
	s.errNorm, s.actual, s.threshold = st.ErrorNorm, st.ActualDensity, st.Threshold
	s.layerK = st.LayerK
	return s, nil
}

// trainStep runs the model's forward and backward pass into the gradient.
func (w *worker) trainStep(ctx context.Context, b models.Batch) (models.StepResult, error) {
	return w.m.TrainStep(ctx, b, w.params, w.grad)
}

// drain waits for the groups still in flight after a failure.
func (w *worker) drain(ctx context.Context) {
	for g, p := range w.pend {
		if p != nil {
			p.Wait(ctx)
			w.pend[g] = nil
		}
	}
}

// setBackwardTimes gives LAGS' adaptive density the per-tensor backward
// times of the first step: the time between consecutive "final" events,
// the maximum over ranks.
func (w *worker) setBackwardTimes(ctx context.Context) error {
	l, ok := w.red.(*sparsify.LAGS)
	if !ok || !l.Adaptive() {
		return nil
	}
	nt := len(w.layout.Tensors)
	send := make(comm.Int64s, nt)
	var prev time.Time
	// Tensors become final in descending layout order; the first to be
	// final is the start of the measured backward pass.
	for i := nt - 1; i >= 0; i-- {
		ev := w.finalEv[i]
		if ev == nil {
			continue
		}
		if err := ev.Synchronize(); err != nil {
			return err
		}
		at := ev.Time()
		if !prev.IsZero() {
			send[i] = max(int64(at.Sub(prev)), 0)
		}
		prev = at
	}
	recv := make(comm.Int64s, nt*w.size)
	if err := w.c.AllGather(ctx, send, recv); err != nil {
		return fmt.Errorf("train: combining backward times: %w", err)
	}
	d := make([]time.Duration, nt)
	for r := 0; r < w.size; r++ {
		for i := range d {
			d[i] = max(d[i], time.Duration(recv[r*nt+i]))
		}
	}
	return l.SetBackwardTimes(d)
}

const nFields = 16

// gather combines the ranks' step measurements into a record (the same on
// every rank).
func (w *worker) gather(ctx context.Context, s stepLocal, epoch, step int, lr float64) (StepRecord, error) {
	v := [nFields]float64{s.loss, s.tf.Seconds(), s.tb.Seconds(), s.tsel.Seconds(), s.tcomm.Seconds(), s.tupd.Seconds(),
		s.titer.Seconds(), float64(s.sent), float64(s.recv), s.errNorm, s.actual, s.threshold, s.twait.Seconds(), float64(s.samples), s.tcompute.Seconds(), s.tcommWall.Seconds()}
	send := make(comm.Int64s, nFields)
	for i, x := range v {
		send[i] = int64(math.Float64bits(x))
	}
	recv := make(comm.Int64s, nFields*w.size)
	if err := w.c.AllGather(ctx, send, recv); err != nil {
		return StepRecord{}, fmt.Errorf("train: combining step statistics: %w", err)
	}
	at := func(r, i int) float64 { return math.Float64frombits(uint64(recv[r*nFields+i])) }
	var sum, mx [nFields]float64
	for r := 0; r < w.size; r++ {
		for i := 0; i < nFields; i++ {
			x := at(r, i)
			sum[i] += x
			if r == 0 || x > mx[i] {
				mx[i] = x
			}
		}
	}
	n := float64(w.size)
	rec := StepRecord{Type: "step", Epoch: epoch + 1, Step: step, Loss: Num(sum[0] / n), LR: Num(lr),
		Density: Num(w.cfg.Density.Value()), ActualDensity: Num(at(0, 10)), ErrorNorm: Num(sum[9] / n),
		BytesSent: Num(sum[7] / n), BytesRecv: Num(sum[8] / n),
		TForward: Num(mx[1]), TBackward: Num(mx[2]), TSelect: Num(mx[3]), TComm: Num(mx[4]), TUpdate: Num(mx[5]),
		TIter: Num(mx[6]), TCompute: Num(mx[14]), TCommWall: Num(mx[15]), TWait: Num(mx[12]), Samples: int(sum[13]), Workers: w.size,
		Wall: Num(time.Since(w.r.start).Seconds())}
	if w.cfg.Sparsifier == "dense" {
		rec.Density = 1
	}
	rec.LayerK = s.layerK
	rec.Ops = map[string]OpCount{}
	for i, op := range comm.Ops() {
		st := w.cnt.Stats(op)
		p := w.prevOp[i]
		if st.Calls != p.Calls {
			rec.Ops[op.String()] = OpCount{Calls: st.Calls - p.Calls, Elements: st.Elements - p.Elements,
				BytesSent: st.BytesSent - p.BytesSent, BytesRecv: st.BytesRecv - p.BytesRecv, Time: Num((st.Time - p.Time).Seconds())}
		}
		w.prevOp[i] = st
	}
	if th := at(0, 11); !math.IsNaN(th) {
		t := Num(th)
		rec.Threshold = &t
	}
	return rec, nil
}

// evaluate runs the evaluation and (rank 0) records it.
func (w *worker) evaluate(ctx context.Context, epoch, step int) ([]metric, error) {
	ms, err := w.task.Evaluate(ctx, w.m, w.params, w.c)
	if err != nil {
		return nil, err
	}
	if w.rank == 0 {
		wall := Num(time.Since(w.r.start).Seconds())
		for _, m := range ms {
			if err := w.metrics.write(EvalRecord{Type: "eval", Epoch: epoch + 1, Step: step, Wall: wall, Metric: m.Name, Value: Num(m.Value)}); err != nil {
				return nil, err
			}
		}
		if w.prog != nil {
			w.prog.eval(epoch+1, step, ms)
		}
	}
	w.log.Info("evaluation", "epoch", epoch+1, "step", step, "results", ms)
	return ms, nil
}

// checkpoint writes rank 0's state (rank 0 only) and refreshes the report.
func (w *worker) checkpoint(epoch, batch, step int) error {
	if w.rank != 0 {
		return nil
	}
	if err := w.download(w.hparams, w.params); err != nil {
		return err
	}
	ck := &Checkpoint{Model: w.cfg.Model, Dataset: w.cfg.Dataset, Epoch: epoch, Batch: batch, Step: step,
		Params: append([]float32(nil), w.hparams...)}
	if nb := sumSizes(w.m.BufferLayout()); nb > 0 {
		ck.Buffers = make([]float32, nb)
		if err := w.m.StoreBuffers(ck.Buffers); err != nil {
			return err
		}
	}
	var err error
	if ck.Opt, ck.OptSteps, err = w.opt.State(); err != nil {
		return err
	}
	path := filepath.Join(w.cfg.Out, "checkpoints", fmt.Sprintf("step-%09d.ckpt", step))
	if err := WriteCheckpoint(path, ck); err != nil {
		return err
	}
	w.log.Info("checkpoint written", "path", path)
	return nil
}

func (w *worker) report() {
	if w.rank != 0 || w.r.opt.Report == nil {
		return
	}
	if err := w.r.opt.Report(w.cfg.Out); err != nil {
		w.log.Warn("report not written", "err", err)
		if w.prog != nil {
			fmt.Fprintf(w.prog.out, "warning: report.html not written: %v\n", err)
		}
	}
}

// resume loads the checkpoint of cfg.Resume and returns where to continue.
func (w *worker) resume() (epoch, batch, step int, err error) {
	path, err := LatestCheckpoint(w.cfg.Resume)
	if err != nil {
		return 0, 0, 0, err
	}
	ck, err := ReadCheckpoint(path)
	if err != nil {
		return 0, 0, 0, err
	}
	if ck.Model != w.cfg.Model || ck.Dataset != w.cfg.Dataset {
		return 0, 0, 0, fmt.Errorf("%w: -resume %s holds a %s/%s checkpoint, not %s/%s; pass the same -model and -dataset", ErrConfig, w.cfg.Resume, ck.Model, ck.Dataset, w.cfg.Model, w.cfg.Dataset)
	}
	if len(ck.Params) != len(w.hparams) {
		return 0, 0, 0, fmt.Errorf("%w: checkpoint %s holds %d parameters, the model has %d (different preset?)", ErrConfig, path, len(ck.Params), len(w.hparams))
	}
	copy(w.hparams, ck.Params)
	if err := w.upload(w.params, w.hparams); err != nil {
		return 0, 0, 0, err
	}
	if len(ck.Buffers) > 0 {
		if err := w.m.LoadBuffers(ck.Buffers); err != nil {
			return 0, 0, 0, fmt.Errorf("train: checkpoint %s: %w", path, err)
		}
	}
	if err := w.opt.SetState(ck.Opt, ck.OptSteps); err != nil {
		return 0, 0, 0, fmt.Errorf("train: checkpoint %s: %w", path, err)
	}
	w.log.Info("resumed", "checkpoint", path, "epoch", ck.Epoch+1, "batch", ck.Batch, "step", ck.Step)
	return ck.Epoch, ck.Batch, ck.Step, nil
}

// timeUp reports, identically on every rank, whether rank 0's clock has
// passed Config.MaxTime.
func (w *worker) timeUp(ctx context.Context) (bool, error) {
	if w.cfg.MaxTime <= 0 {
		return false, nil
	}
	flag := comm.Int32s{0}
	if w.rank == 0 && time.Since(w.r.start) >= w.cfg.MaxTime {
		flag[0] = 1
	}
	if err := w.c.Broadcast(ctx, flag, 0); err != nil {
		return false, fmt.Errorf("train: agreeing on the time limit: %w", err)
	}
	return flag[0] == 1, nil
}

func (w *worker) loop(ctx context.Context) error {
	cfg := w.cfg
	perEpoch := w.task.Len()
	sched := Schedule{Base: cfg.LR.Value(), WarmupIters: int(cfg.WarmupEpochs * float64(perEpoch)), DecayEpochs: cfg.DecayEpochs, Factor: cfg.DecayFactor.Value()}
	startEpoch, startBatch, step := 0, 0, 0
	if cfg.Resume != "" {
		var err error
		if startEpoch, startBatch, step, err = w.resume(); err != nil {
			return err
		}
	}
	lastEval := -1
	for epoch := startEpoch; epoch < cfg.Epochs.Value(); epoch++ {
		if cfg.Steps > 0 && step >= cfg.Steps {
			break
		}
		if err := w.task.SetEpoch(epoch); err != nil {
			return fmt.Errorf("train: epoch %d: %w", epoch+1, err)
		}
		w.m.ResetState()
		if w.prog != nil {
			w.prog.startEpoch(epoch+1, cfg.Epochs.Value(), perEpoch-startBatch)
		}
		var lastLoss float64
		for i := startBatch; i < perEpoch; i++ {
			timeUp, err := w.timeUp(ctx)
			if err != nil {
				return err
			}
			if (cfg.Steps > 0 && step >= cfg.Steps) || timeUp {
				if w.prog != nil {
					w.prog.endEpoch()
				}
				if lastEval != step {
					if _, err := w.evaluate(ctx, epoch, step); err != nil {
						return err
					}
				}
				if err := w.checkpoint(epoch, i, step); err != nil {
					return err
				}
				w.report()
				return nil
			}
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("train: stopped at step %d: %w", step, err)
			}
			lr := sched.At(step, epoch)
			b, ns, err := w.task.Batch(i)
			if err != nil {
				return fmt.Errorf("train: batch %d of epoch %d: %w", i, epoch+1, err)
			}
			s, err := w.step(ctx, b, lr)
			if err != nil {
				return fmt.Errorf("train: step %d (epoch %d): %w", step+1, epoch+1, err)
			}
			s.samples = ns
			step++
			if step == 1 {
				if err := w.setBackwardTimes(ctx); err != nil {
					return err
				}
			}
			lastLoss = s.loss
			last := i == perEpoch-1 || step == cfg.Steps
			if step%cfg.LogEvery.Value() == 0 || last {
				rec, err := w.gather(ctx, s, epoch, step, lr)
				if err != nil {
					return err
				}
				lastLoss = float64(rec.Loss)
				if w.rank == 0 {
					if err := w.metrics.write(rec); err != nil {
						return err
					}
					if w.r.opt.LossSink != nil {
						w.r.opt.LossSink(step, float64(rec.Loss))
					}
				}
			}
			if w.prog != nil {
				w.prog.add(ns*w.size, lastLoss)
			}
			if cfg.EvalEvery > 0 && step%cfg.EvalEvery == 0 && !last {
				if _, err := w.evaluate(ctx, epoch, step); err != nil {
					return err
				}
				lastEval = step
			}
		}
		startBatch = 0
		if w.prog != nil {
			w.prog.endEpoch()
		}
		if _, err := w.evaluate(ctx, epoch, step); err != nil {
			return err
		}
		lastEval = step
		if (epoch+1)%cfg.CheckpointEvery.Value() == 0 || epoch+1 == cfg.Epochs.Value() {
			if err := w.checkpoint(epoch+1, 0, step); err != nil {
				return err
			}
		}
		w.report()
	}
	return nil
}
