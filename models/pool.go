package models

import (
	"context"
	"fmt"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
)

// Pool lets many data-parallel workers of one process share a few models.
//
// A model is mostly its compiled programs and their arenas (a ResNet-18
// training program at batch 32 holds about 180 MB of activations); what
// belongs to one worker is small: the BatchNorm running statistics, the
// dropout stream, the LSTM's hidden states and the gradient hook. Workers
// that compute on the same cores one after another need not each own the
// programs: a Pool holds a few models (executors, about one per core) and
// gives every worker a Model of its own (Worker) that borrows an idle
// executor for each step or evaluation, with the worker's state bound to
// it for that call. The results are the bits an own model of the worker
// would give: an executor runs the same program on the worker's state.
type Pool struct {
	free     chan replica
	size     int
	proto    replica
	initBufs []float32
}

// replica is a model a Pool can run for any of its workers: the package's
// three models implement it.
type replica interface {
	Model
	// initParams writes the initial parameters of a model seeded with seed.
	initParams(dst []float32, seed uint64) error
	// newState allocates a worker's state: the buffers (set to bufs), the
	// dropout stream of seed and zero hidden states.
	newState(seed uint64, bufs []float32) (*workerState, error)
	// bind makes ws the model's state until unbind, which keeps in ws what
	// the calls in between changed.
	bind(ws *workerState) error
	unbind(ws *workerState) error
}

// workerState is what of a model belongs to one worker.
type workerState struct {
	bufs   device.Buffer // BatchNorm running statistics (empty without)
	hook   GradHook
	drop   *dropoutRNG   // nil for models without dropout
	hidden device.Buffer // LSTM: h, c of every layer of the training batches
	// LSTM: h, c of every layer for evaluation batches of evalN sequences.
	evalState device.Buffer
	evalN     int
}

// NewPool builds size models with build (each must be one of this
// package's models, built with the same configuration on the same device)
// and returns the pool of them.
func NewPool(size int, build func() (Model, error)) (*Pool, error) {
	if size < 1 {
		return nil, badInput("NewPool: %d models; a pool needs at least 1", size)
	}
	p := &Pool{free: make(chan replica, size), size: size}
	for i := range size {
		m, err := build()
		if err != nil {
			return nil, err
		}
		r, ok := m.(replica)
		if !ok {
			return nil, badInput("NewPool: a %T cannot be shared by several workers (only this package's models can)", m)
		}
		if i == 0 {
			p.proto = r
			p.initBufs = make([]float32, sumInfos(r.BufferLayout()))
			if err := r.StoreBuffers(p.initBufs); err != nil {
				return nil, err
			}
		}
		p.free <- r
	}
	return p, nil
}

// Shareable reports whether a Pool can share m among workers: whether it
// is one of this package's models.
func Shareable(m Model) bool {
	_, ok := m.(replica)
	return ok
}

// Size is the number of models (executors) in the pool.
func (p *Pool) Size() int { return p.size }

// Worker returns a model for one worker whose own model would have been
// built with seed (its dropout stream and InitParams follow seed; the rest
// of the configuration is the pool's). It implements Stateful when the
// pool's models do. Each worker's Model is used by one goroutine at a
// time, as any Model; different workers' models may be used concurrently
// (they take turns on the executors).
func (p *Pool) Worker(seed uint64) (Model, error) {
	w := &pooled{p: p, seed: seed}
	if _, err := w.with(context.Background(), func(m replica) error {
		ws, err := m.newState(seed, p.initBufs)
		if err == nil {
			w.ws = ws
		}
		return err
	}); err != nil {
		return nil, err
	}
	if _, ok := p.proto.(Stateful); ok {
		return &pooledStateful{w}, nil
	}
	return w, nil
}

func sumInfos(l []ParamInfo) int {
	n := 0
	for _, p := range l {
		n += p.Size
	}
	return n
}

// pooled is one worker's Model over a Pool.
type pooled struct {
	p    *Pool
	seed uint64
	ws   *workerState
}

var _ Model = (*pooled)(nil)

// with runs f on an idle executor bound to the worker's state and returns
// how long the worker waited for the executor.
func (w *pooled) with(ctx context.Context, f func(m replica) error) (queued time.Duration, err error) {
	t := time.Now()
	var m replica
	select {
	case m = <-w.p.free:
	default:
		select {
		case m = <-w.p.free:
		case <-ctx.Done():
			return time.Since(t), fmt.Errorf("models: waiting for an executor: %w", ctx.Err())
		}
	}
	queued = time.Since(t)
	defer func() { w.p.free <- m }()
	if w.ws != nil {
		if err := m.bind(w.ws); err != nil {
			return queued, err
		}
		defer func() {
			if uerr := m.unbind(w.ws); err == nil {
				err = uerr
			}
		}()
	}
	return queued, f(m)
}

func (w *pooled) do(f func(m replica) error) error {
	_, err := w.with(context.Background(), f)
	return err
}

func (w *pooled) Name() string              { return w.p.proto.Name() }
func (w *pooled) BatchSize() int            { return w.p.proto.BatchSize() }
func (w *pooled) Layout() []ParamInfo       { return w.p.proto.Layout() }
func (w *pooled) NumParams() int            { return w.p.proto.NumParams() }
func (w *pooled) Device() device.Device     { return w.p.proto.Device() }
func (w *pooled) BufferLayout() []ParamInfo { return w.p.proto.BufferLayout() }
func (w *pooled) ArenaBytes() int           { return w.p.proto.ArenaBytes() }
func (w *pooled) Summary() string           { return w.p.proto.Summary() }
func (w *pooled) Buffers() device.Buffer    { return w.ws.bufs }
func (w *pooled) SetGradHook(h GradHook)    { w.ws.hook = h }
func (w *pooled) LoadBuffers(s []float32) error {
	return w.do(func(m replica) error { return m.LoadBuffers(s) })
}
func (w *pooled) StoreBuffers(d []float32) error {
	return w.do(func(m replica) error { return m.StoreBuffers(d) })
}

// InitParams implements Model: the parameters a model seeded with the
// worker's seed starts from.
func (w *pooled) InitParams(dst []float32) error {
	return w.do(func(m replica) error { return m.initParams(dst, w.seed) })
}

// TrainStep implements Model; StepResult.Queued is the time it waited for
// an executor.
func (w *pooled) TrainStep(ctx context.Context, b Batch, params, grad device.Buffer) (StepResult, error) {
	var res StepResult
	q, err := w.with(ctx, func(m replica) error {
		var err error
		res, err = m.TrainStep(ctx, b, params, grad)
		return err
	})
	res.Queued = q
	return res, err
}

// Evaluate implements Model.
func (w *pooled) Evaluate(ctx context.Context, b Batch, params device.Buffer) (EvalResult, error) {
	var res EvalResult
	_, err := w.with(ctx, func(m replica) error {
		var err error
		res, err = m.Evaluate(ctx, b, params)
		return err
	})
	return res, err
}

// ResetState implements Model.
func (w *pooled) ResetState() {
	w.do(func(m replica) error { m.ResetState(); return nil })
}

// pooledStateful is a pooled model of a Stateful kind.
type pooledStateful struct{ *pooled }

var _ Stateful = pooledStateful{}

// SaveState implements Stateful (the format of the pool's models).
func (w pooledStateful) SaveState() ([]byte, error) {
	var b []byte
	err := w.do(func(m replica) error {
		var err error
		b, err = m.(Stateful).SaveState()
		return err
	})
	return b, err
}

// LoadState implements Stateful.
func (w pooledStateful) LoadState(b []byte) error {
	return w.do(func(m replica) error { return m.(Stateful).LoadState(b) })
}

// newState allocates the state every model has: the buffers, set to bufs
// (ResNet-18's whole state; NCF and the LSTM add theirs).
func (n *net) newState(_ uint64, bufs []float32) (*workerState, error) {
	ws := &workerState{}
	if len(bufs) == 0 {
		return ws, nil
	}
	b, err := n.be.Device().Alloc(device.Float32, len(bufs))
	if err != nil {
		return nil, fmt.Errorf("models: allocating a worker's buffers: %w", err)
	}
	s := n.train.Stream()
	if err := s.Copy(b, device.Host(bufs)); err != nil {
		return nil, err
	}
	ws.bufs = b
	return ws, s.Synchronize()
}

// bind and unbind swap the state every model has.
func (n *net) bind(ws *workerState) error {
	n.bufVec, n.hook = ws.bufs, ws.hook
	return nil
}

func (n *net) unbind(*workerState) error { return nil }

func (m *NCF) newState(seed uint64, bufs []float32) (*workerState, error) {
	ws, err := m.net.newState(seed, bufs)
	if err != nil {
		return nil, err
	}
	ws.drop = newDropoutRNG(seed)
	return ws, nil
}
func (m *NCF) bind(ws *workerState) error { m.drop = ws.drop; return m.net.bind(ws) }

func (m *LSTM) newState(seed uint64, bufs []float32) (*workerState, error) {
	ws, err := m.net.newState(seed, bufs)
	if err != nil {
		return nil, err
	}
	ws.drop = newDropoutRNG(seed)
	n := 0
	for i := 0; i < 2*m.cfg.Layers; i++ {
		n += m.train.Input(lstmState + i).Len()
	}
	if ws.hidden, err = m.Device().Alloc(device.Float32, n); err != nil {
		return nil, fmt.Errorf("models: allocating a worker's LSTM state: %w", err)
	}
	s := m.train.Stream()
	if err := m.Device().Math().Fill(s, ws.hidden, 0); err != nil {
		return nil, err
	}
	return ws, s.Synchronize()
}

// hiddenCopy copies the worker's training hidden state into the training
// program's state inputs (in) or back (!in).
func (m *LSTM) hiddenCopy(ws *workerState, in bool) error {
	s := m.train.Stream()
	off := 0
	for i := 0; i < 2*m.cfg.Layers; i++ {
		x := m.train.Input(lstmState + i)
		h := ws.hidden.Slice(off, off+x.Len())
		off += x.Len()
		var err error
		if in {
			err = s.Copy(x, h)
		} else {
			err = s.Copy(h, x)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (m *LSTM) bind(ws *workerState) error {
	m.net.bind(ws)
	m.drop, m.evalState, m.evalN = ws.drop, ws.evalState, ws.evalN
	return m.hiddenCopy(ws, true)
}

func (m *LSTM) unbind(ws *workerState) error {
	// Evaluate may have replaced the evaluation state (another batch
	// size).
	ws.evalState, ws.evalN = m.evalState, m.evalN
	m.evalState, m.evalN = device.Buffer{}, 0
	if err := m.hiddenCopy(ws, false); err != nil {
		return err
	}
	return m.train.Stream().Synchronize()
}
