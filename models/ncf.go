package models

import (
	"context"
	"fmt"
	"math"

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
	case c.Dropout < 0 || c.Dropout >= 1:
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
	st   store
	drop *dropoutRNG

	users, items *tensor.Dense
	targets      *tensor.Dense
	masks        []*tensor.Dense
	tg           *trainGraph

	evals evalCache
}

var _ Model = (*NCF)(nil)

// NewNCF builds NeuMF for cfg.
func NewNCF(cfg NCFConfig) (*NCF, error) {
	defer building()()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Layers = append([]int(nil), cfg.Layers...)
	m := &NCF{cfg: cfg, drop: newDropoutRNG(cfg.Seed)}
	half := cfg.Layers[0] / 2
	m.st.add("mf_user_embed.weight", cfg.Users, cfg.Factors)
	m.st.add("mf_item_embed.weight", cfg.Items, cfg.Factors)
	m.st.add("mlp_user_embed.weight", cfg.Users, half)
	m.st.add("mlp_item_embed.weight", cfg.Items, half)
	for j := 1; j < len(cfg.Layers); j++ {
		m.st.add(fmt.Sprintf("mlp.%d.weight", j-1), cfg.Layers[j-1], cfg.Layers[j])
		m.st.add(fmt.Sprintf("mlp.%d.bias", j-1), cfg.Layers[j])
	}
	last := cfg.Layers[len(cfg.Layers)-1]
	m.st.add("final.weight", cfg.Factors+last, 1)
	m.st.add("final.bias", 1)
	m.st.alloc()
	m.init(newInitRNG(cfg.Seed))

	B := cfg.BatchSize
	m.users = tensor.New(tensor.WithShape(B), tensor.WithBacking(make([]int, B)))
	m.items = tensor.New(tensor.WithShape(B), tensor.WithBacking(make([]int, B)))
	m.targets = tensor.New(tensor.WithShape(B, 1), tensor.WithBacking(make([]float32, B)))
	g := G.NewGraph()
	params := m.paramNodes(g)
	var masks []*G.Node
	if cfg.Dropout > 0 {
		for j := 1; j < len(cfg.Layers); j++ {
			t := tensor.New(tensor.WithShape(B, cfg.Layers[j]), tensor.WithBacking(make([]float32, B*cfg.Layers[j])))
			m.masks = append(m.masks, t)
			masks = append(masks, G.NodeFromAny(g, t, G.WithName(fmt.Sprintf("dropmask%d", j))))
		}
	}
	u := G.NodeFromAny(g, m.users, G.WithName("users"))
	it := G.NodeFromAny(g, m.items, G.WithName("items"))
	logit, err := m.forward(params, u, it, masks)
	if err != nil {
		return nil, err
	}
	y := G.NodeFromAny(g, m.targets, G.WithName("targets"))
	loss, err := bceWithLogits(logit, y)
	if err != nil {
		return nil, err
	}
	if m.tg, err = newTrainGraph(g, &m.st, params, loss); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *NCF) init(r *initRNG) {
	for i := 0; i < 4; i++ {
		r.normal(m.st.data(i), 0.01)
	}
	L := m.cfg.Layers
	k := 4
	for j := 1; j < len(L); j++ {
		r.uniform(m.st.data(k), math.Sqrt(6/float64(L[j-1]+L[j])))
		r.uniform(m.st.data(k+1), torchDefaultBound(L[j-1]))
		k += 2
	}
	in := m.cfg.Factors + L[len(L)-1]
	r.uniform(m.st.data(k), math.Sqrt(3/float64(in)))
	r.uniform(m.st.data(k+1), torchDefaultBound(in))
}

func (m *NCF) paramNodes(g *G.ExprGraph) []*G.Node {
	ps := make([]*G.Node, len(m.st.infos))
	for i := range ps {
		ps[i] = m.st.node(g, i)
	}
	return ps
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

// Layout implements Model.
func (m *NCF) Layout() []ParamInfo { return m.st.layout() }

// NumParams implements Model.
func (m *NCF) NumParams() int { return len(m.st.flat) }

// Params implements Model.
func (m *NCF) Params() []float32 { return m.st.flat }

// LoadParams implements Model.
func (m *NCF) LoadParams(src []float32) error { return m.st.load("NCF LoadParams", src) }

// StoreParams implements Model.
func (m *NCF) StoreParams(dst []float32) error { return m.st.save("NCF StoreParams", dst) }

// BufferLayout implements Model (NCF has no buffers).
func (m *NCF) BufferLayout() []ParamInfo { return nil }

// LoadBuffers implements Model.
func (m *NCF) LoadBuffers(src []float32) error {
	if len(src) != 0 {
		return badInput("NCF has no buffers, got %d values", len(src))
	}
	return nil
}

// StoreBuffers implements Model.
func (m *NCF) StoreBuffers(dst []float32) error { return m.LoadBuffers(dst) }

// ResetState implements Model (no state).
func (m *NCF) ResetState() {}

// SetGradHook implements Model.
func (m *NCF) SetGradHook(h GradHook) error { return m.tg.setHook(h, nil, nil) }

// Summary implements Model.
func (m *NCF) Summary() string {
	c := m.cfg
	return summaryTable(fmt.Sprintf("NeuMF: %d users, %d items, GMF %d, MLP %v, dropout %g, batch %d", c.Users, c.Items, c.Factors, c.Layers, c.Dropout, c.BatchSize), m.st.infos, nil)
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
func (m *NCF) TrainStep(ctx context.Context, b Batch, grad []float32) (StepResult, error) {
	if err := checkCtx(ctx); err != nil {
		return StepResult{}, err
	}
	if err := m.checkPairs(b, m.cfg.BatchSize, true); err != nil {
		return StepResult{}, err
	}
	copy(m.users.Data().([]int), b.Users)
	copy(m.items.Data().([]int), b.Items)
	copy(m.targets.Data().([]float32), b.Targets)
	for _, t := range m.masks {
		m.drop.mask(t.Data().([]float32), m.cfg.Dropout)
	}
	if err := m.tg.run(grad); err != nil {
		return StepResult{}, err
	}
	l, err := scalarValue(m.tg.loss)
	return StepResult{Loss: l}, err
}

// Evaluate implements Model: Scores are the logits, LossSum the summed BCE
// (Targets may be omitted, then LossSum and Count are 0).
func (m *NCF) Evaluate(ctx context.Context, b Batch) (EvalResult, error) {
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
	eg, err := m.evals.get(n, func() (*evalGraph, error) {
		g := G.NewGraph()
		eg := &evalGraph{ints: []*tensor.Dense{
			tensor.New(tensor.WithShape(n), tensor.WithBacking(make([]int, n))),
			tensor.New(tensor.WithShape(n), tensor.WithBacking(make([]int, n))),
		}}
		u := G.NodeFromAny(g, eg.ints[0], G.WithName("users"))
		it := G.NodeFromAny(g, eg.ints[1], G.WithName("items"))
		out, err := m.forward(m.paramNodes(g), u, it, nil)
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
	copy(eg.ints[0].Data().([]int), b.Users)
	copy(eg.ints[1].Data().([]int), b.Items)
	logits, err := eg.run()
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
