package train

// The model file of the model TestNewModelIsTwoFiles adds: a two-layer
// MLP classifier, its Gorgonia graph compiled and run by package engine,
// implementing models.Model outside package models (what models/x.go is
// for a built-in model).

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/ops"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// mlpConfig configures the MLP: Features inputs, one hidden ReLU layer of
// Hidden units, Classes outputs, trained with batches of Batch examples.
type mlpConfig struct {
	Features, Hidden, Classes, Batch int
	LabelSmoothing                   float64
	Seed                             uint64
	Backend                          engine.Backend
}

// mlp is the model: fc1.weight [F H], fc1.bias [H], fc2.weight [H C],
// fc2.bias [C]; the loss is the softmax cross-entropy of the logits.
// Batch.Images holds the B×F features, Batch.Labels the classes.
type mlp struct {
	cfg    mlpConfig
	be     engine.Backend
	layout []models.ParamInfo
	train  *engine.Executor
	evals  map[int]*engine.Executor
	hook   models.GradHook
	host   []float32
}

var _ models.Model = (*mlp)(nil)

// mlpBuild serialises building Gorgonia graphs (its graph construction
// updates package-level state without locking).
var mlpBuild sync.Mutex

func newMLP(cfg mlpConfig) (*mlp, error) {
	if cfg.Features < 1 || cfg.Hidden < 1 || cfg.Classes < 2 || cfg.Batch < 1 {
		return nil, fmt.Errorf("mlp: %+v: every size must be positive, with 2 classes at least", cfg)
	}
	m := &mlp{cfg: cfg, be: cfg.Backend, evals: map[int]*engine.Executor{}}
	if m.be == nil {
		m.be = engine.CPU
	}
	off := 0
	for _, t := range []struct {
		name  string
		shape []int
	}{{"fc1.weight", []int{cfg.Features, cfg.Hidden}}, {"fc1.bias", []int{cfg.Hidden}}, {"fc2.weight", []int{cfg.Hidden, cfg.Classes}}, {"fc2.bias", []int{cfg.Classes}}} {
		size := 1
		for _, d := range t.shape {
			size *= d
		}
		m.layout = append(m.layout, models.ParamInfo{Name: t.name, Shape: t.shape, Offset: off, Size: size})
		off += size
	}
	e, err := m.compile(cfg.Batch, true)
	if err != nil {
		return nil, err
	}
	m.train = e
	return m, nil
}

// compile builds the program of batches of n: training (loss and
// gradients) or evaluation (the logits).
func (m *mlp) compile(n int, train bool) (_ *engine.Executor, err error) {
	mlpBuild.Lock()
	defer mlpBuild.Unlock()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("mlp: building the graph: %v", r)
		}
	}()
	g := G.NewGraph()
	p := make([]*G.Node, len(m.layout))
	for i, t := range m.layout {
		p[i] = G.NewTensor(g, tensor.Float32, len(t.Shape), G.WithShape(t.Shape...), G.WithName(t.Name))
	}
	x := G.NewMatrix(g, tensor.Float32, G.WithShape(n, m.cfg.Features), G.WithName("features"))
	h := G.Must(G.Rectify(dense(x, p[0], p[1])))
	logits := dense(h, p[2], p[3])
	if !train {
		prog, err := engine.Compile(g, engine.Spec{Params: p, Inputs: []*G.Node{x}, Outputs: []*G.Node{logits}})
		if err != nil {
			return nil, err
		}
		return engine.New(prog, m.be, nil)
	}
	y := G.NewVector(g, tensor.Int, G.WithShape(n), G.WithName("labels"))
	loss, err := ops.CrossEntropy(logits, y, m.cfg.LabelSmoothing)
	if err != nil {
		return nil, err
	}
	grads, err := G.Grad(loss, p...)
	if err != nil {
		return nil, err
	}
	prog, err := engine.Compile(g, engine.Spec{Params: p, Grads: grads, Inputs: []*G.Node{x, y}, Outputs: []*G.Node{loss}})
	if err != nil {
		return nil, err
	}
	return engine.New(prog, m.be, nil)
}

// dense is x·w + b.
func dense(x, w, b *G.Node) *G.Node {
	bias := G.Must(G.Reshape(b, tensor.Shape{1, b.Shape()[0]}))
	return G.Must(G.BroadcastAdd(G.Must(G.Mul(x, w)), bias, nil, []byte{0}))
}

func (m *mlp) Name() string                     { return "tinymlp" }
func (m *mlp) BatchSize() int                   { return m.cfg.Batch }
func (m *mlp) Layout() []models.ParamInfo       { return m.layout }
func (m *mlp) Device() device.Device            { return m.be.Device() }
func (m *mlp) BufferLayout() []models.ParamInfo { return nil }
func (m *mlp) Buffers() device.Buffer           { return device.Buffer{} }
func (m *mlp) SetGradHook(h models.GradHook)    { m.hook = h }
func (m *mlp) ResetState()                      {}
func (m *mlp) ArenaBytes() int                  { return m.train.ArenaBytes() }

func (m *mlp) NumParams() int {
	last := m.layout[len(m.layout)-1]
	return last.Offset + last.Size
}

func (m *mlp) Summary() string {
	return fmt.Sprintf("MLP %d→%d→%d, batch %d: %d parameters", m.cfg.Features, m.cfg.Hidden, m.cfg.Classes, m.cfg.Batch, m.NumParams())
}

func (m *mlp) LoadBuffers(src []float32) error  { return m.noBuffers(src) }
func (m *mlp) StoreBuffers(dst []float32) error { return m.noBuffers(dst) }

func (m *mlp) noBuffers(b []float32) error {
	if len(b) != 0 {
		return fmt.Errorf("mlp: %d buffer values; the model has none", len(b))
	}
	return nil
}

// InitParams draws every tensor from U(±1/√fan_in), PyTorch's Linear
// default, with the model's seed.
func (m *mlp) InitParams(dst []float32) error {
	if len(dst) != m.NumParams() {
		return fmt.Errorf("mlp: %d parameters, the model has %d", len(dst), m.NumParams())
	}
	r := rand.New(rand.NewPCG(m.cfg.Seed, 0x6d6c70))
	for i, t := range m.layout {
		fanIn := m.cfg.Features
		if i >= 2 {
			fanIn = m.cfg.Hidden
		}
		bound := 1 / math.Sqrt(float64(fanIn))
		for j := range t.Size {
			dst[t.Offset+j] = float32((2*r.Float64() - 1) * bound)
		}
	}
	return nil
}

// stage writes the batch's features (and labels) into e's inputs.
func (m *mlp) stage(e *engine.Executor, b models.Batch, n int, labels bool) error {
	if len(b.Images) != n*m.cfg.Features || (labels && len(b.Labels) != n) {
		return fmt.Errorf("mlp: a batch of %d features and %d labels; want %d×%d and %d", len(b.Images), len(b.Labels), n, m.cfg.Features, n)
	}
	st, err := e.Staging(0)
	if err != nil {
		return err
	}
	copy(st.Float32s(), b.Images)
	if err := e.Upload(0); err != nil || !labels {
		return err
	}
	if st, err = e.Staging(1); err != nil {
		return err
	}
	for i, l := range b.Labels {
		st.Int64s()[i] = int64(l)
	}
	return e.Upload(1)
}

// read returns output 0 of e in host memory.
func (m *mlp) read(e *engine.Executor) ([]float32, error) {
	b := e.Output(0)
	if b.IsHost() {
		return b.Float32s(), nil
	}
	m.host = append(m.host[:0], make([]float32, b.Len())...)
	s := e.Stream()
	if err := s.Copy(device.Host(m.host), b); err != nil {
		return nil, err
	}
	return m.host, s.Synchronize()
}

func (m *mlp) TrainStep(ctx context.Context, b models.Batch, params, grad device.Buffer) (models.StepResult, error) {
	if err := ctx.Err(); err != nil {
		return models.StepResult{}, err
	}
	if err := m.stage(m.train, b, m.cfg.Batch, true); err != nil {
		return models.StepResult{}, err
	}
	t, err := m.train.Run(ctx, engine.Bindings{Params: params, Grads: grad}, m.hook)
	if err != nil {
		return models.StepResult{}, err
	}
	loss, err := m.read(m.train)
	if err != nil {
		return models.StepResult{}, err
	}
	return models.StepResult{Loss: float64(loss[0]), Forward: t.Forward, Backward: t.Backward}, nil
}

// Evaluate sums the plain cross-entropy and counts the correct top-1
// classes of the batch.
func (m *mlp) Evaluate(ctx context.Context, b models.Batch, params device.Buffer) (models.EvalResult, error) {
	n := len(b.Labels)
	e, ok := m.evals[n]
	if !ok {
		var err error
		if e, err = m.compile(n, false); err != nil {
			return models.EvalResult{}, err
		}
		m.evals[n] = e
	}
	if err := m.stage(e, b, n, false); err != nil {
		return models.EvalResult{}, err
	}
	if _, err := e.Run(ctx, engine.Bindings{Params: params}, nil); err != nil {
		return models.EvalResult{}, err
	}
	logits, err := m.read(e)
	if err != nil {
		return models.EvalResult{}, err
	}
	r := models.EvalResult{Count: n}
	C := m.cfg.Classes
	for i, label := range b.Labels {
		z := logits[i*C : (i+1)*C]
		best, lse := 0, 0.0
		for c := range z {
			if z[c] > z[best] {
				best = c
			}
		}
		for c := range z {
			lse += math.Exp(float64(z[c] - z[best]))
		}
		r.LossSum += math.Log(lse) - float64(z[label]-z[best])
		if best == label {
			r.Correct++
		}
	}
	return r, nil
}
