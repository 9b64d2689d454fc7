package models

import (
	"context"
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// NCFConfig configures NeuMF.
type NCFConfig struct {
	// Users and Items are the numbers of users and items (ids are 0-based).
	Users, Items int
	// Factors is the GMF embedding size (64 in the DEFT code).
	Factors int
	// Layers are the MLP sizes; Layers[0] is the width of the concatenated
	// user and item MLP embeddings (each Layers[0]/2), followed by one
	// Linear+ReLU(+dropout) per further entry. DEFT code: [256 256 128 64].
	Layers []int
	// Dropout is the dropout probability after each MLP ReLU (0.5 in the
	// DEFT code; 0 disables it).
	Dropout float64
	// BatchSize is the training batch size (pairs per step).
	BatchSize int
	// Seed seeds the initialisation and the dropout masks.
	Seed uint64
	// Backend runs the model's programs (nil: the CPU).
	Backend engine.Backend `json:"-"`
}

// DefaultNCF is the DEFT/MLPerf configuration for the given data set sizes
// (138,493 users and 26,744 items on ml-20m give 31,832,577 parameters).
func DefaultNCF(users, items, batch int) NCFConfig {
	return NCFConfig{Users: users, Items: items, Factors: 64, Layers: []int{256, 256, 128, 64}, Dropout: 0.5, BatchSize: batch, Seed: 1}
}

// PaperNCF is the NCF paper's preset for small data (ml-100k, ml-1m):
// 8 factors, MLP [64 32 16 8], no dropout.
func PaperNCF(users, items, batch int) NCFConfig {
	return NCFConfig{Users: users, Items: items, Factors: 8, Layers: []int{64, 32, 16, 8}, Dropout: 0, BatchSize: batch, Seed: 1}
}

func (c NCFConfig) validate() error {
	switch {
	case c.Users < 1 || c.Items < 1:
		return badInput("NCF: %d users and %d items; both must be ≥ 1", c.Users, c.Items)
	case c.Factors < 1:
		return badInput("NCF: Factors = %d; use ≥ 1 (64 in the DEFT code)", c.Factors)
	case len(c.Layers) < 1 || c.Layers[0] < 2 || c.Layers[0]%2 != 0:
		return badInput("NCF: Layers = %v; Layers[0] must be an even number ≥ 2 (e.g. [256 256 128 64])", c.Layers)
	case !(c.Dropout >= 0 && c.Dropout < 1):
		return badInput("NCF: Dropout = %g; use 0 ≤ p < 1", c.Dropout)
	case c.BatchSize < 1:
		return badInput("NCF: BatchSize = %d; use ≥ 1", c.BatchSize)
	}
	for i, l := range c.Layers {
		if l < 1 {
			return badInput("NCF: Layers[%d] = %d; every layer needs ≥ 1 unit", i, l)
		}
	}
	return nil
}

// NCF is NeuMF (He et al. 2017) as in the MLPerf/DEFT code: GMF embeddings
// (users, items) multiplied elementwise; MLP embeddings concatenated and fed
// through Linear+ReLU+dropout layers; the two concatenated into a final
// Linear to one logit; loss = binary cross-entropy with logits, averaged.
//
// Parameter order (PyTorch names): mf_user_embed.weight [U f],
// mf_item_embed.weight [I f], mlp_user_embed.weight [U L0/2],
// mlp_item_embed.weight [I L0/2], then mlp.j.weight [in out], mlp.j.bias
// [out] for each MLP layer, final.weight [f+Llast 1], final.bias [1].
// Linear weights are stored [in out] (the transpose of PyTorch's
// [out in]); sizes and order are PyTorch's.
//
// Initialisation as in the reference: embeddings N(0, 0.01²), MLP weights
// Glorot-uniform, final weight LeCun-uniform, biases PyTorch's default
// U(±1/√fan_in) (the reference leaves them at their default).
//
// Batch: Users, Items (B ids each) and Targets (B values in {0, 1}).
// Evaluate returns the logits in Scores and the summed BCE in LossSum.
type NCF struct {
	cfg  NCFConfig
	drop *dropoutRNG
	net

	nMasks int
}

var _ Model = (*NCF)(nil)

// NewNCF builds NeuMF for cfg and compiles its training program.
func NewNCF(cfg NCFConfig) (*NCF, error) {
	defer building()()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Layers = append([]int(nil), cfg.Layers...)
	m := &NCF{cfg: cfg, drop: newDropoutRNG(cfg.Seed)}
	half := cfg.Layers[0] / 2
	m.params.add("mf_user_embed.weight", cfg.Users, cfg.Factors)
	m.params.add("mf_item_embed.weight", cfg.Items, cfg.Factors)
	m.params.add("mlp_user_embed.weight", cfg.Users, half)
	m.params.add("mlp_item_embed.weight", cfg.Items, half)
	for j := 1; j < len(cfg.Layers); j++ {
		m.params.add(fmt.Sprintf("mlp.%d.weight", j-1), cfg.Layers[j-1], cfg.Layers[j])
		m.params.add(fmt.Sprintf("mlp.%d.bias", j-1), cfg.Layers[j])
	}
	last := cfg.Layers[len(cfg.Layers)-1]
	m.params.add("final.weight", cfg.Factors+last, 1)
	m.params.add("final.bias", 1)
	if err := m.net.init(cfg.Backend); err != nil {
		return nil, err
	}

	B := cfg.BatchSize
	g := G.NewGraph()
	params := m.params.nodes(g)
	var masks []*G.Node
	if cfg.Dropout > 0 {
		for j := 1; j < len(cfg.Layers); j++ {
			masks = append(masks, G.NewMatrix(g, tensor.Float32, G.WithShape(B, cfg.Layers[j]), G.WithName(fmt.Sprintf("dropmask%d", j))))
		}
	}
	m.nMasks = len(masks)
	u := G.NewVector(g, tensor.Int, G.WithShape(B), G.WithName("users"))
	it := G.NewVector(g, tensor.Int, G.WithShape(B), G.WithName("items"))
	y := G.NewMatrix(g, tensor.Float32, G.WithShape(B, 1), G.WithName("targets"))
	logit, err := m.forward(params, u, it, masks)
	if err != nil {
		return nil, err
	}
	loss, err := bceWithLogits(logit, y)
	if err != nil {
		return nil, err
	}
	if err := m.compileTrain(g, params, nil, append([]*G.Node{u, it, y}, masks...), loss); err != nil {
		return nil, err
	}
	return m, nil
}

// InitParams implements Model.
func (m *NCF) InitParams(dst []float32) error { return m.initParams(dst, m.cfg.Seed) }

// initParams writes the initial parameters of a model seeded with seed.
func (m *NCF) initParams(dst []float32, seed uint64) error {
	if len(dst) != m.NumParams() {
		return badInput("NCF InitParams: %d values, the model has %d parameters", len(dst), m.NumParams())
	}
	r := newInitRNG(seed)
	for i := 0; i < 4; i++ {
		r.normal(m.params.part(dst, i), 0.01)
	}
	L := m.cfg.Layers
	k := 4
	for j := 1; j < len(L); j++ {
		r.uniform(m.params.part(dst, k), math.Sqrt(6/float64(L[j-1]+L[j])))
		r.uniform(m.params.part(dst, k+1), torchDefaultBound(L[j-1]))
		k += 2
	}
	in := m.cfg.Factors + L[len(L)-1]
	r.uniform(m.params.part(dst, k), math.Sqrt(3/float64(in)))
	r.uniform(m.params.part(dst, k+1), torchDefaultBound(in))
	return nil
}

// forward builds the logits (B×1); masks may be nil (no dropout).
func (m *NCF) forward(p []*G.Node, users, items *G.Node, masks []*G.Node) (*G.Node, error) {
	gu, err := G.ByIndices(p[0], users, 0)
	if err != nil {
		return nil, fmt.Errorf("models: NCF graph: %w", err)
	}
	gi := G.Must(G.ByIndices(p[1], items, 0))
	gmf := G.Must(G.HadamardProd(gu, gi))
	mu := G.Must(G.ByIndices(p[2], users, 0))
	mi := G.Must(G.ByIndices(p[3], items, 0))
	x := G.Must(G.Concat(1, mu, mi))
	k := 4
	for j := 1; j < len(m.cfg.Layers); j++ {
		x = G.Must(linear(x, p[k], p[k+1]))
		x = G.Must(G.Rectify(x))
		if masks != nil {
			x = G.Must(G.HadamardProd(x, masks[j-1]))
		}
		k += 2
	}
	cat := G.Must(G.Concat(1, gmf, x))
	return linear(cat, p[k], p[k+1])
}

// linear is x·W + b with x [B in], W [in out], b [out].
func linear(x, w, b *G.Node) (*G.Node, error) {
	xw, err := G.Mul(x, w)
	if err != nil {
		return nil, fmt.Errorf("models: linear layer %s: %w", w.Name(), err)
	}
	out := b.Shape()[0]
	b2, err := G.Reshape(b, tensor.Shape{1, out})
	if err != nil {
		return nil, fmt.Errorf("models: linear bias %s: %w", b.Name(), err)
	}
	return G.BroadcastAdd(xw, b2, nil, []byte{0})
}

// bceWithLogits is mean(softplus(z) − y·z), the numerically stable binary
// cross-entropy of logits z against targets y (Gorgonia's Softplus returns
// z for z > 14 and 0 below −103).
func bceWithLogits(z, y *G.Node) (*G.Node, error) {
	sp, err := G.Softplus(z)
	if err != nil {
		return nil, fmt.Errorf("models: BCE loss: %w", err)
	}
	yz := G.Must(G.HadamardProd(y, z))
	return G.Mean(G.Must(G.Sub(sp, yz)))
}

// Name implements Model.
func (m *NCF) Name() string { return "ncf" }

// Config returns the configuration the model was built with.
func (m *NCF) Config() NCFConfig { c := m.cfg; c.Layers = append([]int(nil), c.Layers...); return c }

// BatchSize implements Model.
func (m *NCF) BatchSize() int { return m.cfg.BatchSize }

// Summary implements Model.
func (m *NCF) Summary() string {
	c := m.cfg
	return summaryTable(fmt.Sprintf("NeuMF: %d users, %d items, GMF %d, MLP %v, dropout %g, batch %d", c.Users, c.Items, c.Factors, c.Layers, c.Dropout, c.BatchSize), m.params.infos, nil)
}

func (m *NCF) checkPairs(b Batch, n int, needTargets bool) error {
	if len(b.Users) != n || len(b.Items) != n {
		return badInput("NCF batch has %d users and %d items, want %d of each", len(b.Users), len(b.Items), n)
	}
	if needTargets && len(b.Targets) != n {
		return badInput("NCF batch has %d targets, want %d", len(b.Targets), n)
	}
	for i := 0; i < n; i++ {
		if b.Users[i] < 0 || b.Users[i] >= m.cfg.Users {
			return badInput("NCF batch: user id %d at %d is outside [0, %d)", b.Users[i], i, m.cfg.Users)
		}
		if b.Items[i] < 0 || b.Items[i] >= m.cfg.Items {
			return badInput("NCF batch: item id %d at %d is outside [0, %d)", b.Items[i], i, m.cfg.Items)
		}
	}
	return nil
}

// TrainStep implements Model.
func (m *NCF) TrainStep(ctx context.Context, b Batch, params, grad device.Buffer) (StepResult, error) {
	if err := m.StartStep(ctx, b, params, grad); err != nil {
		return StepResult{}, err
	}
	return m.finishTrain()
}

// StartStep implements Deferred.
func (m *NCF) StartStep(ctx context.Context, b Batch, params, grad device.Buffer) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := m.checkPairs(b, m.cfg.BatchSize, true); err != nil {
		return err
	}
	if err := setInts(m.train, 0, b.Users); err != nil {
		return err
	}
	if err := setInts(m.train, 1, b.Items); err != nil {
		return err
	}
	if err := setFloat32s(m.train, 2, b.Targets); err != nil {
		return err
	}
	for i := 0; i < m.nMasks; i++ {
		if err := m.drop.drawMask(m.train, 3+i, m.cfg.Dropout); err != nil {
			return err
		}
	}
	return m.startTrain(ctx, params, grad)
}

// evalProgram returns the function that compiles the evaluation program
// of batches of n (user, item) pairs.
func (m *NCF) evalProgram(n int) func() (*engine.Executor, error) {
	return func() (*engine.Executor, error) {
		g := G.NewGraph()
		params := m.params.nodes(g)
		u := G.NewVector(g, tensor.Int, G.WithShape(n), G.WithName("users"))
		it := G.NewVector(g, tensor.Int, G.WithShape(n), G.WithName("items"))
		out, err := m.forward(params, u, it, nil)
		if err != nil {
			return nil, err
		}
		return m.compileEval(g, params, nil, []*G.Node{u, it}, []*G.Node{out})
	}
}

// EvalBytes is the device memory of the evaluation of batches of n
// (user, item) pairs (the program's arena), computed without allocating it.
func (m *NCF) EvalBytes(n int) (int, error) { return m.evalBytes(m.evalProgram(n)) }

// Evaluate implements Model: Scores are the logits, LossSum the summed BCE
// (Targets may be omitted, then LossSum and Count are 0).
func (m *NCF) Evaluate(ctx context.Context, b Batch, params device.Buffer) (EvalResult, error) {
	if err := checkCtx(ctx); err != nil {
		return EvalResult{}, err
	}
	n := len(b.Users)
	if n == 0 {
		return EvalResult{}, badInput("NCF Evaluate: empty batch")
	}
	if err := m.checkPairs(b, n, len(b.Targets) > 0); err != nil {
		return EvalResult{}, err
	}
	e, err := m.evals.get(n, m.evalProgram(n))
	if err != nil {
		return EvalResult{}, err
	}
	if err := setInts(e, 0, b.Users); err != nil {
		return EvalResult{}, err
	}
	if err := setInts(e, 1, b.Items); err != nil {
		return EvalResult{}, err
	}
	if err := m.runEval(ctx, e, params); err != nil {
		return EvalResult{}, err
	}
	logits, err := m.readFloat32s(e, e.Output(0))
	if err != nil {
		return EvalResult{}, err
	}
	res := EvalResult{Scores: append([]float32(nil), logits...)}
	if len(b.Targets) > 0 {
		for i, z := range logits {
			res.LossSum += bce(float64(z), float64(b.Targets[i]))
		}
		res.Count = n
	}
	return res, nil
}

// bce is softplus(z) − y·z in float64.
func bce(z, y float64) float64 {
	sp := math.Max(z, 0) + math.Log1p(math.Exp(-math.Abs(z)))
	return sp - y*z
}
