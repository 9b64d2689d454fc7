package models

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/ops"
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
	// LabelSmoothing is the training loss's label smoothing ε (0: none);
	// evaluation reports the plain cross-entropy.
	LabelSmoothing float64
	// Seed seeds the initialisation.
	Seed uint64
	// Backend runs the model's programs (nil: the CPU).
	Backend engine.Backend `json:"-"`
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
	case !(c.LabelSmoothing >= 0 && c.LabelSmoothing < 1):
		return badInput("ResNet: LabelSmoothing = %g; use 0 ≤ ε < 1 (0.1 is usual)", c.LabelSmoothing)
	case !(c.Momentum > 0 && c.Momentum <= 1) || !(c.Epsilon > 0):
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
// BatchNorm (package ops): training mode normalises with the batch
// statistics (biased variance) and updates running = (1−m)·running +
// m·batch (unbiased variance), m = 0.1; Evaluate uses the running
// statistics.
//
// Batch: Images (B×3×S×S, NCHW) and Labels (B class ids).
type ResNet struct {
	cfg ResNetConfig
	net
}

var _ Model = (*ResNet)(nil)

// NewResNet builds ResNet-18 for cfg and compiles its training program.
func NewResNet(cfg ResNetConfig) (*ResNet, error) {
	defer building()()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &ResNet{cfg: cfg}
	m.layout()
	if err := m.net.init(cfg.Backend); err != nil {
		return nil, err
	}
	B, S := cfg.BatchSize, cfg.ImageSize
	g := G.NewGraph()
	params, buffers := m.params.nodes(g), m.bufs.nodes(g)
	x := G.NewTensor(g, tensor.Float32, 4, G.WithShape(B, 3, S, S), G.WithName("images"))
	y := G.NewVector(g, tensor.Int, G.WithShape(B), G.WithName("labels"))
	logits, err := m.forward(params, buffers, x, true)
	if err != nil {
		return nil, err
	}
	loss, err := ops.CrossEntropy(logits, y, cfg.LabelSmoothing)
	if err != nil {
		return nil, err
	}
	if err := m.compileTrain(g, params, buffers, []*G.Node{x, y}, loss); err != nil {
		return nil, err
	}
	bufs := make([]float32, m.bufs.size())
	for i, p := range m.bufs.infos {
		if strings.HasSuffix(p.Name, "_var") {
			fill(m.bufs.part(bufs, i), 1)
		}
	}
	if err := m.net.LoadBuffers(bufs); err != nil {
		return nil, err
	}
	return m, nil
}

// layout declares every parameter and buffer in PyTorch order.
func (m *ResNet) layout() {
	c := m.cfg
	bn := func(name string, ch int) {
		m.params.add(name+".weight", ch)
		m.params.add(name+".bias", ch)
		m.bufs.add(name+".running_mean", ch)
		m.bufs.add(name+".running_var", ch)
	}
	m.params.add("conv1.weight", c.Width, 3, 3, 3)
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
			m.params.add(p+".conv1.weight", out, in, 3, 3)
			bn(p+".bn1", out)
			m.params.add(p+".conv2.weight", out, out, 3, 3)
			bn(p+".bn2", out)
			if stride != 1 || in != out {
				m.params.add(p+".shortcut.0.weight", out, in, 1, 1)
				bn(p+".shortcut.1", out)
			}
			in = out
		}
	}
	m.params.add("linear.weight", in, c.Classes)
	m.params.add("linear.bias", c.Classes)
}

// InitParams implements Model.
func (m *ResNet) InitParams(dst []float32) error { return m.initParams(dst, m.cfg.Seed) }

// initParams writes the initial parameters of a model seeded with seed.
func (m *ResNet) initParams(dst []float32, seed uint64) error {
	if len(dst) != m.NumParams() {
		return badInput("ResNet InitParams: %d values, the model has %d parameters", len(dst), m.NumParams())
	}
	r := newInitRNG(seed)
	for i, p := range m.params.infos {
		d := m.params.part(dst, i)
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
	return nil
}

// forward builds the logits (B × classes); training selects BatchNorm's
// mode (batch statistics, running statistics updated) or evaluation mode
// (running statistics).
func (m *ResNet) forward(p, bufs []*G.Node, x *G.Node, training bool) (logits *G.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("models: ResNet graph: %v", r)
		}
	}()
	c := m.cfg
	k := 0
	next := func() *G.Node { k++; return p[k-1] }
	conv := func(x *G.Node, w *G.Node, stride int) *G.Node {
		return G.Must(ops.Conv(x, w, stride, w.Shape()[2]/2))
	}
	nbn := 0
	bnAct := func(x *G.Node, relu bool) *G.Node {
		gamma, beta := next(), next()
		rm, rv := bufs[2*nbn], bufs[2*nbn+1]
		nbn++
		return G.Must(ops.BatchNormalize(x, gamma, beta, rm, rv, ops.BatchNormConfig{Eps: c.Epsilon, Momentum: c.Momentum, ReLU: relu, Training: training}))
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
			h = G.Must(ops.AddRelu(y, sc))
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

// LoadBuffers implements Model. Running variances must be ≥ 0 and no
// value may be NaN.
func (m *ResNet) LoadBuffers(src []float32) error {
	if len(src) == m.bufs.size() {
		for j, p := range m.bufs.infos {
			isVar := strings.HasSuffix(p.Name, "_var")
			for i, v := range m.bufs.part(src, j) {
				if math.IsNaN(float64(v)) || (isVar && v < 0) {
					return badInput("ResNet LoadBuffers: %s[%d] = %v is not a valid BatchNorm statistic (tensor %d)", p.Name, i, v, j)
				}
			}
		}
	}
	return m.net.LoadBuffers(src)
}

// Summary implements Model.
func (m *ResNet) Summary() string {
	c := m.cfg
	return summaryTable(fmt.Sprintf("ResNet-18 (CIFAR): %d classes, width %d, blocks %v, %d×%d input, batch %d", c.Classes, c.Width, c.Blocks, c.ImageSize, c.ImageSize, c.BatchSize), m.params.infos, m.bufs.infos)
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
func (m *ResNet) TrainStep(ctx context.Context, b Batch, params, grad device.Buffer) (StepResult, error) {
	if err := m.StartStep(ctx, b, params, grad); err != nil {
		return StepResult{}, err
	}
	return m.finishTrain()
}

// StartStep implements Deferred.
func (m *ResNet) StartStep(ctx context.Context, b Batch, params, grad device.Buffer) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := m.checkBatch(b, m.cfg.BatchSize); err != nil {
		return err
	}
	if err := setFloat32s(m.train, 0, b.Images); err != nil {
		return err
	}
	if err := setInts(m.train, 1, b.Labels); err != nil {
		return err
	}
	return m.startTrain(ctx, params, grad)
}

// EvalBytes is the device memory of the evaluation of batches of n images
// (the program's arena, at most a training batch of them: Evaluate's
// chunks), computed without allocating it.
func (m *ResNet) EvalBytes(n int) (int, error) {
	return m.evalBytes(m.evalCompile(min(n, m.cfg.BatchSize)))
}

// Evaluate implements Model: BatchNorm uses the running statistics. The
// images go through in chunks of at most the training batch, so that an
// evaluation of any size needs no more memory than a training step (a
// forward pass of 250 images kept 190–220 MB of activations alive; the
// training program at batch 32 holds 154–163 MB). Each image's logits do
// not depend on the others in the chunk, and the losses are summed in image
// order, so the result does not depend on the chunking.
func (m *ResNet) Evaluate(ctx context.Context, b Batch, params device.Buffer) (EvalResult, error) {
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
	S, C := m.cfg.ImageSize, m.cfg.Classes
	img := 3 * S * S
	res := EvalResult{Count: n}
	for lo := 0; lo < n; lo += m.cfg.BatchSize {
		hi := min(n, lo+m.cfg.BatchSize)
		e, err := m.evalProgram(hi - lo)
		if err != nil {
			return EvalResult{}, err
		}
		if err := setFloat32s(e, 0, b.Images[lo*img:hi*img]); err != nil {
			return EvalResult{}, err
		}
		if err := m.runEval(ctx, e, params); err != nil {
			return EvalResult{}, err
		}
		logits, err := m.readFloat32s(e, e.Output(0))
		if err != nil {
			return EvalResult{}, err
		}
		for i := 0; i < hi-lo; i++ {
			l, hit := softmaxCE(logits[i*C:(i+1)*C], b.Labels[lo+i])
			res.LossSum += l
			if hit {
				res.Correct++
			}
		}
	}
	return res, nil
}

// evalProgram is the evaluation program of n images (cached).
func (m *ResNet) evalProgram(n int) (*engine.Executor, error) {
	return m.evals.get(n, m.evalCompile(n))
}

// evalCompile returns the function that compiles the evaluation program of
// n images.
func (m *ResNet) evalCompile(n int) func() (*engine.Executor, error) {
	return func() (*engine.Executor, error) {
		S := m.cfg.ImageSize
		g := G.NewGraph()
		params, buffers := m.params.nodes(g), m.bufs.nodes(g)
		x := G.NewTensor(g, tensor.Float32, 4, G.WithShape(n, 3, S, S), G.WithName("images"))
		out, err := m.forward(params, buffers, x, false)
		if err != nil {
			return nil, err
		}
		return m.compileEval(g, params, buffers, []*G.Node{x}, []*G.Node{out})
	}
}
