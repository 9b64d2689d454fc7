package models

import (
	"context"
	"fmt"
	"math"
	"strings"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// ResNetConfig configures the CIFAR ResNet-18.
type ResNetConfig struct {
	// Classes is the number of classes (10 for CIFAR-10, 100 for CIFAR-100).
	Classes int
	// Width is the number of channels of the stem and first stage (64); the
	// stages have Width, 2·Width, 4·Width, 8·Width channels.
	Width int
	// Blocks is the number of BasicBlocks per stage ([2 2 2 2]).
	Blocks [4]int
	// ImageSize is the side of the square 3-channel input (32); it must be a
	// multiple of 8.
	ImageSize int
	// BatchSize is the training batch size (32 per worker).
	BatchSize int
	// Momentum and Epsilon are BatchNorm's (0.1 and 1e-5 as in PyTorch).
	Momentum, Epsilon float64
	// Seed seeds the initialisation.
	Seed uint64
}

// DefaultResNet18 is the CIFAR ResNet-18 of the DEFT code (11,173,962
// parameters for 10 classes).
func DefaultResNet18(classes, batch int) ResNetConfig {
	return ResNetConfig{Classes: classes, Width: 64, Blocks: [4]int{2, 2, 2, 2}, ImageSize: 32, BatchSize: batch, Momentum: 0.1, Epsilon: 1e-5, Seed: 1}
}

func (c ResNetConfig) validate() error {
	switch {
	case c.Classes < 1:
		return badInput("ResNet: Classes = %d; use ≥ 1 (10 for CIFAR-10)", c.Classes)
	case c.Width < 1:
		return badInput("ResNet: Width = %d; use ≥ 1 (64 for ResNet-18)", c.Width)
	case c.ImageSize < 8 || c.ImageSize%8 != 0:
		return badInput("ResNet: ImageSize = %d; use a multiple of 8 (32 for CIFAR)", c.ImageSize)
	case c.BatchSize < 1:
		return badInput("ResNet: BatchSize = %d; use ≥ 1", c.BatchSize)
	case c.Momentum <= 0 || c.Momentum > 1 || c.Epsilon <= 0:
		return badInput("ResNet: BatchNorm momentum %g / epsilon %g; use 0 < momentum ≤ 1 and epsilon > 0 (0.1, 1e-5)", c.Momentum, c.Epsilon)
	}
	for i, b := range c.Blocks {
		if b < 1 {
			return badInput("ResNet: Blocks[%d] = %d; every stage needs ≥ 1 block", i, b)
		}
	}
	if s := c.ImageSize / 8; c.BatchSize*s*s < 2 {
		return badInput("ResNet: batch %d with a %d×%d last feature map gives BatchNorm one value per channel; use a batch ≥ 2", c.BatchSize, s, s)
	}
	return nil
}

// ResNet is the CIFAR variant of ResNet-18 from the DEFT code (kuangliu's
// pytorch-cifar): 3×3 stem conv (no max-pool) + BN + ReLU; four stages of
// BasicBlocks (conv3×3–BN–ReLU–conv3×3–BN, plus identity or 1×1-conv+BN
// shortcut, add, ReLU) with strides 1, 2, 2, 2; global average pool (the
// 4×4 average pool of a 32×32 input, built as a differentiable mean over
// the spatial axes, not GlobalAveragePool2D); linear classifier. Loss:
// cross-entropy averaged over the batch.
//
// Parameter order (PyTorch names): conv1.weight [64 3 3 3], bn1.weight,
// bn1.bias; then per block layerS.B.conv1.weight, .bn1.weight, .bn1.bias,
// .conv2.weight, .bn2.weight, .bn2.bias and, for projection shortcuts,
// .shortcut.0.weight [out in 1 1], .shortcut.1.weight, .shortcut.1.bias;
// linear.weight [512 classes] (transposed w.r.t. PyTorch), linear.bias.
// Buffers: every BatchNorm's running_mean then running_var, in the same
// order.
//
// Initialisation as in PyTorch's defaults (the reference code sets none):
// conv and linear weights U(±1/√fan_in), linear bias U(±1/√fan_in), BN
// weight 1 and bias 0, running mean 0 and variance 1.
//
// BatchNorm (the package's fused op, bn.go): training mode normalises with
// the batch statistics (biased variance) and updates running =
// (1−m)·running + m·batch (unbiased variance), m = 0.1; Evaluate uses the
// running statistics.
//
// Batch: Images (B×3×S×S, NCHW) and Labels (B class ids).
type ResNet struct {
	cfg ResNetConfig
	st  store
	bn  store // running means and variances (buffers)

	images *tensor.Dense
	labels *tensor.Dense
	tg     *trainGraph

	evals evalCache
}

var _ Model = (*ResNet)(nil)

// resnetSpec records, per layer of the built graph, which parameters it uses.
type convSpec struct {
	w           int // parameter index of the weight
	gamma, beta int // BN parameters
	stride      int
	k           int // kernel size
}

// NewResNet builds ResNet-18 for cfg.
func NewResNet(cfg ResNetConfig) (*ResNet, error) {
	defer building()()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &ResNet{cfg: cfg}
	m.layout()
	m.st.alloc()
	m.bn.alloc()
	m.init(newInitRNG(cfg.Seed))

	B, S := cfg.BatchSize, cfg.ImageSize
	m.images = tensor.New(tensor.WithShape(B, 3, S, S), tensor.WithBacking(make([]float32, B*3*S*S)))
	m.labels = tensor.New(tensor.WithShape(B), tensor.WithBacking(make([]int, B)))
	g := G.NewGraph()
	params := m.paramNodes(g)
	x := G.NodeFromAny(g, m.images, G.WithName("images"))
	logits, err := m.forward(params, x, true)
	if err != nil {
		return nil, err
	}
	y := G.NodeFromAny(g, m.labels, G.WithName("labels"))
	loss, err := softmaxCrossEntropy(logits, y)
	if err != nil {
		return nil, err
	}
	if m.tg, err = newTrainGraph(g, &m.st, params, loss); err != nil {
		return nil, err
	}
	return m, nil
}

// layout declares every parameter and buffer in PyTorch order.
func (m *ResNet) layout() {
	c := m.cfg
	bn := func(name string, ch int) {
		m.st.add(name+".weight", ch)
		m.st.add(name+".bias", ch)
		m.bn.add(name+".running_mean", ch)
		m.bn.add(name+".running_var", ch)
	}
	m.st.add("conv1.weight", c.Width, 3, 3, 3)
	bn("bn1", c.Width)
	in := c.Width
	for s := 0; s < 4; s++ {
		out := c.Width << s
		for b := 0; b < c.Blocks[s]; b++ {
			stride := 1
			if s > 0 && b == 0 {
				stride = 2
			}
			p := fmt.Sprintf("layer%d.%d", s+1, b)
			m.st.add(p+".conv1.weight", out, in, 3, 3)
			bn(p+".bn1", out)
			m.st.add(p+".conv2.weight", out, out, 3, 3)
			bn(p+".bn2", out)
			if stride != 1 || in != out {
				m.st.add(p+".shortcut.0.weight", out, in, 1, 1)
				bn(p+".shortcut.1", out)
			}
			in = out
		}
	}
	m.st.add("linear.weight", in, c.Classes)
	m.st.add("linear.bias", c.Classes)
}

func (m *ResNet) init(r *initRNG) {
	for i, p := range m.st.infos {
		d := m.st.data(i)
		switch {
		case len(p.Shape) == 4: // conv
			r.uniform(d, torchDefaultBound(p.Shape[1]*p.Shape[2]*p.Shape[3]))
		case p.Name == "linear.weight":
			r.uniform(d, torchDefaultBound(p.Shape[0]))
		case p.Name == "linear.bias":
			r.uniform(d, torchDefaultBound(m.cfg.Width*8))
		case strings.HasSuffix(p.Name, ".weight"): // BN γ
			fill(d, 1)
		default: // BN β
			fill(d, 0)
		}
	}
	for i, p := range m.bn.infos {
		if strings.HasSuffix(p.Name, "_var") {
			fill(m.bn.data(i), 1)
		}
	}
}

func (m *ResNet) paramNodes(g *G.ExprGraph) []*G.Node {
	ps := make([]*G.Node, len(m.st.infos))
	for i := range ps {
		ps[i] = m.st.node(g, i)
	}
	return ps
}

// forward builds the logits (B × classes); training selects BatchNorm's
// mode. The BatchNorm layers update (training) or read (evaluation) the
// running statistics in the buffer store directly.
func (m *ResNet) forward(p []*G.Node, x *G.Node, training bool) (logits *G.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("models: ResNet graph: %v", r)
		}
	}()
	c := m.cfg
	k := 0
	next := func() *G.Node { k++; return p[k-1] }
	conv := func(x *G.Node, w *G.Node, stride int) *G.Node {
		return G.Must(conv2d(x, w, stride))
	}
	nbn := 0
	bnAct := func(x *G.Node, relu bool) *G.Node {
		gamma, beta := next(), next()
		st := &bnState{eps: c.Epsilon, momentum: c.Momentum, training: training, relu: relu, runMean: m.bn.data(2 * nbn), runVar: m.bn.data(2*nbn + 1)}
		nbn++
		return G.Must(batchNorm(x, gamma, beta, st))
	}
	bn := func(x *G.Node) *G.Node { return bnAct(x, false) }
	bnRelu := func(x *G.Node) *G.Node { return bnAct(x, true) } // BN then ReLU, fused
	h := bnRelu(conv(x, next(), 1))
	in := c.Width
	for s := 0; s < 4; s++ {
		out := c.Width << s
		for b := 0; b < c.Blocks[s]; b++ {
			stride := 1
			if s > 0 && b == 0 {
				stride = 2
			}
			y := bnRelu(conv(h, next(), stride))
			y = bn(conv(y, next(), 1))
			sc := h
			if stride != 1 || in != out {
				sc = bn(conv(h, next(), stride))
			}
			h = G.Must(addRelu(y, sc))
			in = out
		}
	}
	// Global average pool as a differentiable mean. Mean(h, 2, 3) hits an
	// index-out-of-range in tensor's reduction when the spatial axes have
	// size 1, so reduce a [B·C, H·W] matrix along its rows instead.
	hs := h.Shape()
	nb, ch, hw := hs[0], hs[1], hs[2]*hs[3]
	var pooled *G.Node
	if hw == 1 {
		pooled = G.Must(G.Reshape(h, tensor.Shape{nb, ch}))
	} else {
		flat := G.Must(G.Reshape(h, tensor.Shape{nb * ch, hw}))
		pooled = G.Must(G.Reshape(G.Must(G.Mean(flat, 1)), tensor.Shape{nb, ch}))
	}
	w, bias := next(), next()
	logits = G.Must(linear(pooled, w, bias))
	return logits, nil
}

// Name implements Model.
func (m *ResNet) Name() string { return "resnet18" }

// Config returns the configuration the model was built with.
func (m *ResNet) Config() ResNetConfig { return m.cfg }

// BatchSize implements Model.
func (m *ResNet) BatchSize() int { return m.cfg.BatchSize }

// Layout implements Model.
func (m *ResNet) Layout() []ParamInfo { return m.st.layout() }

// NumParams implements Model.
func (m *ResNet) NumParams() int { return len(m.st.flat) }

// Params implements Model.
func (m *ResNet) Params() []float32 { return m.st.flat }

// LoadParams implements Model.
func (m *ResNet) LoadParams(src []float32) error { return m.st.load("ResNet LoadParams", src) }

// StoreParams implements Model.
func (m *ResNet) StoreParams(dst []float32) error { return m.st.save("ResNet StoreParams", dst) }

// BufferLayout implements Model: running_mean and running_var of every
// BatchNorm.
func (m *ResNet) BufferLayout() []ParamInfo { return m.bn.layout() }

// LoadBuffers implements Model. Running variances must be ≥ 0 and no
// value may be NaN.
func (m *ResNet) LoadBuffers(src []float32) error {
	if len(src) == len(m.bn.flat) {
		for j, p := range m.bn.infos {
			isVar := strings.HasSuffix(p.Name, "_var")
			for i, v := range src[p.Offset : p.Offset+p.Size] {
				if math.IsNaN(float64(v)) || (isVar && v < 0) {
					return badInput("ResNet LoadBuffers: %s[%d] = %v is not a valid BatchNorm statistic (tensor %d)", p.Name, i, v, j)
				}
			}
		}
	}
	return m.bn.load("ResNet LoadBuffers", src)
}

// StoreBuffers implements Model.
func (m *ResNet) StoreBuffers(dst []float32) error { return m.bn.save("ResNet StoreBuffers", dst) }

// ResetState implements Model (no recurrent state).
func (m *ResNet) ResetState() {}

// SetGradHook implements Model.
func (m *ResNet) SetGradHook(h GradHook) error {
	return m.tg.setHook(h, nil, nil)
}

// Summary implements Model.
func (m *ResNet) Summary() string {
	c := m.cfg
	return summaryTable(fmt.Sprintf("ResNet-18 (CIFAR): %d classes, width %d, blocks %v, %d×%d input, batch %d", c.Classes, c.Width, c.Blocks, c.ImageSize, c.ImageSize, c.BatchSize), m.st.infos, m.bn.infos)
}

func (m *ResNet) checkBatch(b Batch, n int) error {
	S := m.cfg.ImageSize
	if len(b.Images) != n*3*S*S {
		return badInput("ResNet batch has %d image values, want %d (%d×3×%d×%d NCHW)", len(b.Images), n*3*S*S, n, S, S)
	}
	if len(b.Labels) != n {
		return badInput("ResNet batch has %d labels, want %d", len(b.Labels), n)
	}
	for i, y := range b.Labels {
		if y < 0 || y >= m.cfg.Classes {
			return badInput("ResNet batch: label %d at %d is outside [0, %d)", y, i, m.cfg.Classes)
		}
	}
	return nil
}

// TrainStep implements Model. It also updates the BatchNorm running
// statistics.
func (m *ResNet) TrainStep(ctx context.Context, b Batch, grad []float32) (StepResult, error) {
	if err := checkCtx(ctx); err != nil {
		return StepResult{}, err
	}
	if err := m.checkBatch(b, m.cfg.BatchSize); err != nil {
		return StepResult{}, err
	}
	copy(m.images.Data().([]float32), b.Images)
	copy(m.labels.Data().([]int), b.Labels)
	if err := m.tg.run(grad); err != nil {
		return StepResult{}, err
	}
	l, err := scalarValue(m.tg.loss)
	return StepResult{Loss: l}, err
}

// Evaluate implements Model: BatchNorm uses the running statistics.
func (m *ResNet) Evaluate(ctx context.Context, b Batch) (EvalResult, error) {
	if err := checkCtx(ctx); err != nil {
		return EvalResult{}, err
	}
	n := len(b.Labels)
	if n == 0 {
		return EvalResult{}, badInput("ResNet Evaluate: empty batch")
	}
	if err := m.checkBatch(b, n); err != nil {
		return EvalResult{}, err
	}
	S := m.cfg.ImageSize
	eg, err := m.evals.get(n, func() (*evalGraph, error) {
		g := G.NewGraph()
		eg := &evalGraph{floats: []*tensor.Dense{tensor.New(tensor.WithShape(n, 3, S, S), tensor.WithBacking(make([]float32, n*3*S*S)))}}
		x := G.NodeFromAny(g, eg.floats[0], G.WithName("images"))
		out, err := m.forward(m.paramNodes(g), x, false)
		if err != nil {
			return nil, err
		}
		eg.out = out
		eg.vm, err = newVM(g, G.EvalMode())
		return eg, err
	})
	if err != nil {
		return EvalResult{}, err
	}
	copy(eg.floats[0].Data().([]float32), b.Images)
	logits, err := eg.run()
	if err != nil {
		return EvalResult{}, err
	}
	res := EvalResult{Count: n}
	C := m.cfg.Classes
	for i := 0; i < n; i++ {
		l, hit := softmaxCE(logits[i*C:(i+1)*C], b.Labels[i])
		res.LossSum += l
		if hit {
			res.Correct++
		}
	}
	return res, nil
}
