package models

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	G "gorgonia.org/gorgonia"
)

// buildMu serialises building Gorgonia graphs and differentiating them:
// Gorgonia's graph construction updates package-level state without
// locking (e.g. encoding.NewGroup, reached from Rectify), so models built
// concurrently in several goroutines (in-process workers) would race.
// Running compiled programs needs no lock.
var buildMu sync.Mutex

// building locks buildMu and returns its unlock (use: defer building()()).
// The unlock also collects the garbage the build left: building and
// differentiating a Gorgonia graph allocates far more than the program
// keeps (several hundred MB for ResNet-18's evaluation programs), and in a
// large process the collector would otherwise let that garbage pile up
// before its next cycle, raising the peak resident memory (16 simulated
// ResNet-18 workers: about 0.5 GB at their first evaluation). A build is
// rare and a collection of this heap (mostly pointer-free float32 vectors)
// is quick.
func building() func() {
	buildMu.Lock()
	return func() {
		buildMu.Unlock()
		runtime.GC()
	}
}

// net is what the three models share: the layouts, the buffer vector on
// the device, the compiled training program and the evaluation programs
// (per batch shape).
type net struct {
	be     engine.Backend
	params tensors
	bufs   tensors
	bufVec device.Buffer
	train  *engine.Executor
	hook   GradHook
	evals  evalCache
	f32    []float32 // host copy of the outputs read (readFloat32s)
	// loss is the training program's loss in host memory after each run
	// (engine.Executor.Fetch: copied with the run, no wait of its own; on a
	// GPU there once the stream has completed the step).
	loss device.Buffer
	// profile, when not nil, receives the instruction times of the next
	// training step (ProfileStep).
	profile *[]engine.OpTime
	// started says that the last training step was issued without a wait
	// (startTrain; not a profiled one).
	started bool
}

// init prepares the net for a backend (nil: the CPU).
func (n *net) init(be engine.Backend) error {
	if be == nil {
		be = engine.CPU
	}
	n.be = be
	if nb := n.bufs.size(); nb > 0 {
		b, err := n.be.Device().Alloc(device.Float32, nb)
		if err != nil {
			return fmt.Errorf("models: allocating the buffers: %w", err)
		}
		n.bufVec = b
	}
	return nil
}

// compileTrain differentiates loss with respect to params and compiles the
// training program (outputs: the loss first, then extra).
func (n *net) compileTrain(g *G.ExprGraph, params, buffers, inputs []*G.Node, loss *G.Node, extra ...*G.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("models: building the training graph failed: %v", r)
		}
	}()
	grads, err := G.Grad(loss, params...)
	if err != nil {
		return fmt.Errorf("models: symbolic differentiation failed: %w", err)
	}
	p, err := engine.Compile(g, engine.Spec{Params: params, Grads: grads, Buffers: buffers, Inputs: inputs, Outputs: append([]*G.Node{loss}, extra...)})
	if err != nil {
		return fmt.Errorf("models: compiling the training graph: %w", err)
	}
	n.train, err = engine.New(p, n.be, nil)
	if err != nil {
		return fmt.Errorf("models: loading the training program: %w", err)
	}
	if n.loss, err = n.train.Fetch(0); err != nil {
		return fmt.Errorf("models: %w", err)
	}
	return nil
}

// compileEval compiles a forward-only program.
func (n *net) compileEval(g *G.ExprGraph, params, buffers, inputs, outputs []*G.Node) (e *engine.Executor, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("models: building the evaluation graph failed: %v", r)
		}
	}()
	p, err := engine.Compile(g, engine.Spec{Params: params, Buffers: buffers, Inputs: inputs, Outputs: outputs})
	if err != nil {
		return nil, fmt.Errorf("models: compiling the evaluation graph: %w", err)
	}
	return engine.New(p, n.be, nil)
}

// evalBytes is the arena of the evaluation program build compiles, planned
// through engine.Sizing: nothing is allocated, nothing cached.
func (n *net) evalBytes(build func() (*engine.Executor, error)) (int, error) {
	defer building()()
	be := n.be
	n.be = engine.Sizing(be)
	defer func() { n.be = be }()
	e, err := build()
	if err != nil {
		return 0, err
	}
	return e.ArenaBytes(), nil
}

// Device implements Model.
func (n *net) Device() device.Device { return n.be.Device() }

// Layout implements Model.
func (n *net) Layout() []ParamInfo { return n.params.layout() }

// NumParams implements Model.
func (n *net) NumParams() int { return n.params.size() }

// BufferLayout implements Model.
func (n *net) BufferLayout() []ParamInfo { return n.bufs.layout() }

// Buffers implements Model.
func (n *net) Buffers() device.Buffer { return n.bufVec }

// SetGradHook implements Model.
func (n *net) SetGradHook(h GradHook) { n.hook = h }

// ArenaBytes implements Model.
func (n *net) ArenaBytes() int { return n.train.ArenaBytes() }

// ResetState implements Model: no state (the LSTM's is its own).
func (n *net) ResetState() {}

// StoreBuffers implements Model.
func (n *net) StoreBuffers(dst []float32) error {
	if len(dst) != n.bufs.size() {
		return badInput("StoreBuffers: destination has %d values, the model has %d buffers; pass a slice of exactly that length", len(dst), n.bufs.size())
	}
	if len(dst) == 0 {
		return nil
	}
	s := n.train.Stream()
	if err := s.Copy(device.Host(dst), n.bufVec); err != nil {
		return err
	}
	return s.Synchronize()
}

// LoadBuffers implements Model: it copies src into the buffer vector
// (NCF and the LSTM have no buffers; the LSTM's hidden state is not
// checkpointed because it is reset every epoch).
func (n *net) LoadBuffers(src []float32) error {
	if len(src) != n.bufs.size() {
		return badInput("LoadBuffers: got %d values, the model has %d buffers; pass a slice of exactly that length", len(src), n.bufs.size())
	}
	if len(src) == 0 {
		return nil
	}
	s := n.train.Stream()
	if err := s.Copy(n.bufVec, device.Host(src)); err != nil {
		return err
	}
	return s.Synchronize()
}

// checkVectors verifies the caller's parameter (and gradient) vectors.
func (n *net) checkVectors(params, grad device.Buffer, withGrad bool) error {
	check := func(what string, b device.Buffer) error {
		if b.Len() != n.params.size() || b.DType() != device.Float32 {
			return badInput("%s vector is %v; pass %d float32s on %v", what, b, n.params.size(), n.Device())
		}
		return nil
	}
	if err := check("parameter", params); err != nil {
		return err
	}
	if withGrad {
		return check("gradient", grad)
	}
	return nil
}

// startTrain issues the training program on the model's stream (a
// profiled step runs at once: ProfileStep); lastStep reads its loss (output
// 0) and times once the stream has completed it, and finishTrain waits for
// that and reads them.
func (n *net) startTrain(ctx context.Context, params, grad device.Buffer) error {
	n.started = false
	if err := n.checkVectors(params, grad, true); err != nil {
		return err
	}
	bind := engine.Bindings{Params: params, Grads: grad, Buffers: n.bufVec}
	var err error
	if n.profile != nil {
		*n.profile, err = n.train.Profile(ctx, bind)
	} else {
		err = n.train.Start(ctx, bind, n.hook)
		n.started = err == nil
	}
	if err != nil {
		return fmt.Errorf("models: training step: %w", err)
	}
	return nil
}

// finishTrain waits for the step startTrain issued and returns its result.
func (n *net) finishTrain() (StepResult, error) {
	if n.started {
		if err := n.train.Wait(); err != nil {
			return StepResult{}, fmt.Errorf("models: training step: %w", err)
		}
	}
	return n.LastStep()
}

// LastStep implements Deferred.
func (n *net) LastStep() (StepResult, error) {
	t, err := n.train.Timing()
	if err != nil {
		return StepResult{}, fmt.Errorf("models: training step: %w", err)
	}
	return StepResult{Loss: float64(n.loss.Float32s()[0]), Forward: t.Forward, Backward: t.Backward}, nil
}

// ProfileStep runs one training step of m as TrainStep does, with each
// instruction of its program timed on the device (engine.Executor.Profile):
// where the step's time goes. The step's result has no forward/backward
// split; a model with a gradient hook is refused (the hook would not be
// called).
func ProfileStep(ctx context.Context, m Model, b Batch, params, grad device.Buffer) ([]engine.OpTime, StepResult, error) {
	p, ok := m.(interface{ profiled() *net })
	if !ok {
		return nil, StepResult{}, fmt.Errorf("models: %T cannot be profiled", m)
	}
	n := p.profiled()
	if n.hook != nil {
		return nil, StepResult{}, errors.New("models: ProfileStep of a model with a gradient hook; remove the hook first")
	}
	var times []engine.OpTime
	n.profile = &times
	defer func() { n.profile = nil }()
	res, err := m.TrainStep(ctx, b, params, grad)
	return times, res, err
}

func (n *net) profiled() *net { return n }

// runEval runs an evaluation program.
func (n *net) runEval(ctx context.Context, e *engine.Executor, params device.Buffer) error {
	if err := n.checkVectors(params, device.Buffer{}, false); err != nil {
		return err
	}
	if _, err := e.Run(ctx, engine.Bindings{Params: params, Buffers: n.bufVec}, nil); err != nil {
		return fmt.Errorf("models: evaluation: %w", err)
	}
	return nil
}

// readFloat32s returns a float32 value of e in host memory (the value
// itself on the CPU, a copy otherwise; valid until the next read).
func (n *net) readFloat32s(e *engine.Executor, b device.Buffer) ([]float32, error) {
	if b.IsHost() {
		return b.Float32s(), nil
	}
	if cap(n.f32) < b.Len() {
		n.f32 = make([]float32, b.Len())
	}
	h := n.f32[:b.Len()]
	s := e.Stream()
	if err := s.Copy(device.Host(h), b); err != nil {
		return nil, err
	}
	return h, s.Synchronize()
}

// setFloat32s writes host values into input i of e (through the input's
// own staging on a device: src may be reused as soon as this returns).
func setFloat32s(e *engine.Executor, i int, src []float32) error {
	return stageInput(e, i, func(dst device.Buffer) { copy(dst.Float32s(), src) })
}

// setInts writes host ints into integer input i of e.
func setInts(e *engine.Executor, i int, src []int) error {
	return stageInput(e, i, func(dst device.Buffer) {
		d := dst.Int64s()
		for j, v := range src {
			d[j] = int64(v)
		}
	})
}

// fillFloat32s writes input i of e through f, which receives a host slice
// of the input's length.
func fillFloat32s(e *engine.Executor, i int, f func(dst []float32)) error {
	return stageInput(e, i, func(dst device.Buffer) { f(dst.Float32s()) })
}

// stageInput writes input i of e through f: into the input itself on the CPU,
// else into the input's staging, which is then uploaded. Every input has
// its own staging, so an upload still reading one (an asynchronous copy
// from host memory) is never overwritten by the next input's values.
func stageInput(e *engine.Executor, i int, f func(dst device.Buffer)) error {
	st, err := e.Staging(i)
	if err != nil {
		return err
	}
	f(st)
	return e.Upload(i)
}

// evalCache keeps the evaluation programs of the two most recently used
// batch shapes.
type evalCache struct {
	keys  []int
	execs []*engine.Executor
}

func (c *evalCache) get(key int, build func() (*engine.Executor, error)) (*engine.Executor, error) {
	for i, k := range c.keys {
		if k == key {
			return c.execs[i], nil
		}
	}
	unlock := building()
	e, err := build()
	unlock()
	if err != nil {
		return nil, err
	}
	if len(c.keys) == 2 {
		c.execs[0].Close()
		c.keys, c.execs = c.keys[1:], c.execs[1:]
	}
	c.keys = append(c.keys, key)
	c.execs = append(c.execs, e)
	return e, nil
}
