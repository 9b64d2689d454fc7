package models

import (
	"context"
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/ops"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// LSTMConfig configures the LSTM language model.
type LSTMConfig struct {
	// Vocab is the vocabulary size V.
	Vocab int
	// Embed and Hidden are the embedding and LSTM sizes (650 and 650 in the
	// DEFT code). Tied weights need Embed == Hidden.
	Embed, Hidden int
	// Layers is the number of stacked LSTM layers (3).
	Layers int
	// Tied shares the decoder weight with the embedding (true).
	Tied bool
	// Dropout is applied to the embedding output, between LSTM layers and
	// to the last LSTM output (0.4).
	Dropout float64
	// BPTT is the number of time steps per training batch (30).
	BPTT int
	// LabelSmoothing is the training loss's label smoothing ε (0: none);
	// evaluation reports the plain cross-entropy (and its perplexity).
	LabelSmoothing float64
	// BatchSize is the number of parallel sequences (32 per worker).
	BatchSize int
	// Seed seeds the initialisation and the dropout masks.
	Seed uint64
	// Backend runs the model's programs (nil: the CPU).
	Backend engine.Backend `json:"-"`
}

// DefaultLSTM is the DEFT code's configuration: 3 × 650, tied, dropout 0.4,
// BPTT 30.
func DefaultLSTM(vocab, batch int) LSTMConfig {
	return LSTMConfig{Vocab: vocab, Embed: 650, Hidden: 650, Layers: 3, Tied: true, Dropout: 0.4, BPTT: 30, BatchSize: batch, Seed: 1}
}

// SmallLSTM is a preset for quick runs: 2 × 200, tied, dropout 0.2, BPTT 20.
func SmallLSTM(vocab, batch int) LSTMConfig {
	return LSTMConfig{Vocab: vocab, Embed: 200, Hidden: 200, Layers: 2, Tied: true, Dropout: 0.2, BPTT: 20, BatchSize: batch, Seed: 1}
}

func (c LSTMConfig) validate() error {
	switch {
	case c.Vocab < 1:
		return badInput("LSTM: Vocab = %d; use ≥ 1", c.Vocab)
	case c.Embed < 1 || c.Hidden < 1:
		return badInput("LSTM: Embed = %d, Hidden = %d; both must be ≥ 1", c.Embed, c.Hidden)
	case c.Tied && c.Embed != c.Hidden:
		return badInput("LSTM: tied weights need Embed == Hidden (got %d and %d); set Tied=false or equal sizes", c.Embed, c.Hidden)
	case c.Layers < 1:
		return badInput("LSTM: Layers = %d; use ≥ 1", c.Layers)
	case !(c.LabelSmoothing >= 0 && c.LabelSmoothing < 1):
		return badInput("LSTM: LabelSmoothing = %g; use 0 ≤ ε < 1", c.LabelSmoothing)
	case !(c.Dropout >= 0 && c.Dropout < 1):
		return badInput("LSTM: Dropout = %g; use 0 ≤ p < 1", c.Dropout)
	case c.BPTT < 1:
		return badInput("LSTM: BPTT = %d; use ≥ 1", c.BPTT)
	case c.BatchSize < 1:
		return badInput("LSTM: BatchSize = %d; use ≥ 1", c.BatchSize)
	}
	return nil
}

// LSTM is the word-level language model of the DEFT code: Embedding →
// dropout → L-layer LSTM (dropout between layers) → dropout → Linear
// decoder, optionally tied to the embedding. Loss: cross-entropy averaged
// over the BPTT×B tokens. The hidden state (h, c) of every layer is carried
// from one training batch to the next as a constant (detached); ResetState
// zeroes it.
//
// Parameter order (PyTorch names): encoder.weight [V E]; per layer l
// rnn.weight_ih_l{l} [in 4H], rnn.weight_hh_l{l} [H 4H], rnn.bias_ih_l{l}
// [4H], rnn.bias_hh_l{l} [4H]; decoder.weight [H V] (untied only);
// decoder.bias [V]. Gates are ordered i, f, g, o as in PyTorch; LSTM
// weights are stored [in 4H] (the transpose of PyTorch's layout); sizes and
// order are PyTorch's, so the 3×650 tied model on WikiText-2's 28,869-word
// vocabulary has 28,949,319 parameters.
//
// Initialisation as in the reference: encoder (and untied decoder) weights
// U(−0.1, 0.1), decoder bias 0, LSTM weights and biases PyTorch's default
// U(±1/√H).
//
// Batch: Tokens and Labels are time-major (index t*B+b), BPTT×B each for
// training; Evaluate takes Steps×n tokens for any n ≥ 1 and Steps ≥ 1 (set
// Batch.Steps; 0 means BPTT) and carries its own hidden state across
// evaluation batches of the same n.
//
// Dropout masks are drawn on the host from the model's seeded stream (so a
// run is reproducible on every device) and are inputs of the program.
type LSTM struct {
	cfg  LSTMConfig
	drop *dropoutRNG
	net

	nMasks    int
	evalState device.Buffer // h, c of every layer for evaluation batches of evalN sequences
	evalN     int
}

var _ Model = (*LSTM)(nil)

// Input order of the training program: tokens, targets, the 2L state
// tensors (h0, c0 per layer), then the dropout masks.
const lstmTokens, lstmTargets, lstmState = 0, 1, 2

// NewLSTM builds the LSTM language model for cfg and compiles its training
// program.
func NewLSTM(cfg LSTMConfig) (*LSTM, error) {
	defer building()()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &LSTM{cfg: cfg, drop: newDropoutRNG(cfg.Seed)}
	V, E, H := cfg.Vocab, cfg.Embed, cfg.Hidden
	m.params.add("encoder.weight", V, E)
	for l := 0; l < cfg.Layers; l++ {
		in := H
		if l == 0 {
			in = E
		}
		m.params.add(fmt.Sprintf("rnn.weight_ih_l%d", l), in, 4*H)
		m.params.add(fmt.Sprintf("rnn.weight_hh_l%d", l), H, 4*H)
		m.params.add(fmt.Sprintf("rnn.bias_ih_l%d", l), 4*H)
		m.params.add(fmt.Sprintf("rnn.bias_hh_l%d", l), 4*H)
	}
	if !cfg.Tied {
		m.params.add("decoder.weight", H, V)
	}
	m.params.add("decoder.bias", V)
	if err := m.net.init(cfg.Backend); err != nil {
		return nil, err
	}

	T, B := cfg.BPTT, cfg.BatchSize
	g := G.NewGraph()
	params := m.params.nodes(g)
	tok := G.NewVector(g, tensor.Int, G.WithShape(T*B), G.WithName("tokens"))
	tgt := G.NewVector(g, tensor.Int, G.WithShape(T*B), G.WithName("targets"))
	state := stateNodes(g, cfg.Layers, B, H)
	var masks []*G.Node
	if cfg.Dropout > 0 {
		for i := 0; i <= cfg.Layers; i++ {
			w := H
			if i == 0 {
				w = E
			}
			masks = append(masks, G.NewMatrix(g, tensor.Float32, G.WithShape(T*B, w), G.WithName(fmt.Sprintf("dropmask%d", i))))
		}
	}
	m.nMasks = len(masks)
	logits, final, err := m.forward(params, tok, state, masks, T, B)
	if err != nil {
		return nil, err
	}
	loss, err := ops.CrossEntropy(logits, tgt, cfg.LabelSmoothing)
	if err != nil {
		return nil, err
	}
	inputs := append(append([]*G.Node{tok, tgt}, state...), masks...)
	if err := m.compileTrain(g, params, nil, inputs, loss, final...); err != nil {
		return nil, err
	}
	return m, nil
}

// stateNodes returns the inputs h0, c0 of every layer.
func stateNodes(g *G.ExprGraph, layers, b, h int) []*G.Node {
	s := make([]*G.Node, 2*layers)
	for i := range s {
		s[i] = G.NewMatrix(g, tensor.Float32, G.WithShape(b, h), G.WithName(fmt.Sprintf("state%d", i)))
	}
	return s
}

// InitParams implements Model.
func (m *LSTM) InitParams(dst []float32) error { return m.initParams(dst, m.cfg.Seed) }

// initParams writes the initial parameters of a model seeded with seed.
func (m *LSTM) initParams(dst []float32, seed uint64) error {
	if len(dst) != m.NumParams() {
		return badInput("LSTM InitParams: %d values, the model has %d parameters", len(dst), m.NumParams())
	}
	r := newInitRNG(seed)
	k := 0
	r.uniform(m.params.part(dst, k), 0.1)
	k++
	bound := 1 / math.Sqrt(float64(m.cfg.Hidden))
	for l := 0; l < m.cfg.Layers; l++ {
		for j := 0; j < 4; j++ {
			r.uniform(m.params.part(dst, k), bound)
			k++
		}
	}
	if !m.cfg.Tied {
		r.uniform(m.params.part(dst, k), 0.1)
		k++
	}
	fill(m.params.part(dst, k), 0)
	return nil
}

// forward builds the logits (T*B × V) and the final states.
func (m *LSTM) forward(p []*G.Node, tokens *G.Node, state []*G.Node, masks []*G.Node, T, B int) (logits *G.Node, final []*G.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("models: LSTM graph: %v", r)
		}
	}()
	H := m.cfg.Hidden
	x := G.Must(G.ByIndices(p[0], tokens, 0)) // T*B × E
	if masks != nil {
		x = G.Must(G.HadamardProd(x, masks[0]))
	}
	k := 1
	for l := 0; l < m.cfg.Layers; l++ {
		wih, whh, bih, bhh := p[k], p[k+1], p[k+2], p[k+3]
		k += 4
		bias := G.Must(G.Add(bih, bhh))
		xw := G.Must(linear(x, wih, bias)) // T*B × 4H
		h, c := state[2*l], state[2*l+1]
		outs := make([]*G.Node, T)
		for t := 0; t < T; t++ {
			xt := xw
			if T > 1 {
				xt = G.Must(G.Slice(xw, G.S(t*B, (t+1)*B)))
				if B == 1 { // Gorgonia drops an axis sliced to one element
					xt = G.Must(G.Reshape(xt, tensor.Shape{1, 4 * H}))
				}
			}
			// The gates, the new state and, in the backward pass, their
			// gradient: one fused op each per step.
			if h, c, err = ops.LSTMStep(xt, G.Must(G.Mul(h, whh)), c); err != nil {
				return nil, nil, err
			}
			outs[t] = h
		}
		final = append(final, h, c)
		if T > 1 {
			x = G.Must(G.Concat(0, outs...))
		} else {
			x = outs[0]
		}
		if masks != nil {
			x = G.Must(G.HadamardProd(x, masks[l+1]))
		}
	}
	if m.cfg.Tied {
		// x·Eᵀ without materialising the transpose of E [V E].
		xe := G.Must(ops.MulT(x, p[0]))
		b2 := G.Must(G.Reshape(p[k], tensor.Shape{1, m.cfg.Vocab}))
		logits = G.Must(G.BroadcastAdd(xe, b2, nil, []byte{0}))
		return logits, final, nil
	}
	logits = G.Must(linear(x, p[k], p[k+1]))
	return logits, final, nil
}

// Name implements Model.
func (m *LSTM) Name() string { return "lstm" }

// Config returns the configuration the model was built with.
func (m *LSTM) Config() LSTMConfig { return m.cfg }

// BatchSize implements Model.
func (m *LSTM) BatchSize() int { return m.cfg.BatchSize }

// ResetState implements Model: zeroes the training and evaluation hidden
// states.
func (m *LSTM) ResetState() {
	dev := m.Device()
	s := m.train.Stream()
	for i := 0; i < 2*m.cfg.Layers; i++ {
		dev.Math().Fill(s, m.train.Input(lstmState+i), 0)
	}
	if m.evalState.Len() > 0 {
		dev.Math().Fill(s, m.evalState, 0)
	}
}

// Summary implements Model.
func (m *LSTM) Summary() string {
	c := m.cfg
	return summaryTable(fmt.Sprintf("LSTM LM: vocab %d, embed %d, %d × %d, tied %v, dropout %g, BPTT %d, batch %d", c.Vocab, c.Embed, c.Layers, c.Hidden, c.Tied, c.Dropout, c.BPTT, c.BatchSize), m.params.infos, nil)
}

func (m *LSTM) checkTokens(name string, x []int, n int) error {
	if len(x) != n {
		return badInput("LSTM batch has %d %s, want %d (time-major steps × sequences)", len(x), name, n)
	}
	for i, v := range x {
		if v < 0 || v >= m.cfg.Vocab {
			return badInput("LSTM batch: %s[%d] = %d is outside the vocabulary [0, %d)", name, i, v, m.cfg.Vocab)
		}
	}
	return nil
}

// TrainStep implements Model. The final hidden state becomes the initial
// state of the next step.
func (m *LSTM) TrainStep(ctx context.Context, b Batch, params, grad device.Buffer) (StepResult, error) {
	if err := m.StartStep(ctx, b, params, grad); err != nil {
		return StepResult{}, err
	}
	return m.finishTrain()
}

// StartStep implements Deferred.
func (m *LSTM) StartStep(ctx context.Context, b Batch, params, grad device.Buffer) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if b.Steps != 0 && b.Steps != m.cfg.BPTT {
		return badInput("LSTM TrainStep: batch has %d steps, the model was built for BPTT %d", b.Steps, m.cfg.BPTT)
	}
	n := m.cfg.BPTT * m.cfg.BatchSize
	if err := m.checkTokens("tokens", b.Tokens, n); err != nil {
		return err
	}
	if err := m.checkTokens("labels", b.Labels, n); err != nil {
		return err
	}
	if err := setInts(m.train, lstmTokens, b.Tokens); err != nil {
		return err
	}
	if err := setInts(m.train, lstmTargets, b.Labels); err != nil {
		return err
	}
	for i := 0; i < m.nMasks; i++ {
		if err := m.drop.drawMask(m.train, lstmState+2*m.cfg.Layers+i, m.cfg.Dropout); err != nil {
			return err
		}
	}
	if err := m.startTrain(ctx, params, grad); err != nil {
		return err
	}
	s := m.train.Stream()
	for i := 0; i < 2*m.cfg.Layers; i++ {
		if err := s.Copy(m.train.Input(lstmState+i), m.train.Output(1+i)); err != nil {
			return err
		}
	}
	return nil
}

// evalProgram returns the function that compiles the evaluation program
// of windows of T steps of n sequences.
func (m *LSTM) evalProgram(T, n int) func() (*engine.Executor, error) {
	return func() (*engine.Executor, error) {
		g := G.NewGraph()
		params := m.params.nodes(g)
		tok := G.NewVector(g, tensor.Int, G.WithShape(T*n), G.WithName("tokens"))
		state := stateNodes(g, m.cfg.Layers, n, m.cfg.Hidden)
		out, final, err := m.forward(params, tok, state, nil, T, n)
		if err != nil {
			return nil, err
		}
		return m.compileEval(g, params, nil, append([]*G.Node{tok}, state...), append([]*G.Node{out}, final...))
	}
}

// EvalBytes is the device memory of the evaluation of windows of BPTT
// steps of n sequences (the program's arena and the hidden state carried
// between windows), computed without allocating it.
func (m *LSTM) EvalBytes(n int) (int, error) {
	b, err := m.evalBytes(m.evalProgram(m.cfg.BPTT, n))
	return b + 4*2*m.cfg.Layers*n*m.cfg.Hidden, err
}

// Evaluate implements Model: LossSum is the summed cross-entropy over the
// Steps×n tokens, Correct the number of top-1 hits.
func (m *LSTM) Evaluate(ctx context.Context, b Batch, params device.Buffer) (EvalResult, error) {
	if err := checkCtx(ctx); err != nil {
		return EvalResult{}, err
	}
	T := b.Steps
	if T == 0 {
		T = m.cfg.BPTT
	}
	if T < 0 || len(b.Tokens) == 0 || len(b.Tokens)%T != 0 {
		return EvalResult{}, badInput("LSTM Evaluate: %d tokens is not a positive multiple of %d steps", len(b.Tokens), T)
	}
	n := len(b.Tokens) / T
	if err := m.checkTokens("tokens", b.Tokens, T*n); err != nil {
		return EvalResult{}, err
	}
	if err := m.checkTokens("labels", b.Labels, T*n); err != nil {
		return EvalResult{}, err
	}
	L, H := m.cfg.Layers, m.cfg.Hidden
	if n != m.evalN {
		m.Device().Free(m.evalState)
		st, err := m.Device().Alloc(device.Float32, 2*L*n*H)
		if err != nil {
			return EvalResult{}, fmt.Errorf("models: LSTM evaluation state: %w", err)
		}
		m.evalState, m.evalN = st, n
	}
	e, err := m.evals.get(T<<32|n, m.evalProgram(T, n))
	if err != nil {
		return EvalResult{}, err
	}
	if err := setInts(e, 0, b.Tokens); err != nil {
		return EvalResult{}, err
	}
	s := e.Stream()
	for i := 0; i < 2*L; i++ {
		if err := s.Copy(e.Input(1+i), m.evalState.Slice(i*n*H, (i+1)*n*H)); err != nil {
			return EvalResult{}, err
		}
	}
	if err := m.runEval(ctx, e, params); err != nil {
		return EvalResult{}, err
	}
	for i := 0; i < 2*L; i++ {
		if err := s.Copy(m.evalState.Slice(i*n*H, (i+1)*n*H), e.Output(1+i)); err != nil {
			return EvalResult{}, err
		}
	}
	logits, err := m.readFloat32s(e, e.Output(0))
	if err != nil {
		return EvalResult{}, err
	}
	res := EvalResult{Count: T * n}
	V := m.cfg.Vocab
	for r := 0; r < T*n; r++ {
		l, hit := softmaxCE(logits[r*V:(r+1)*V], b.Labels[r])
		res.LossSum += l
		if hit {
			res.Correct++
		}
	}
	return res, nil
}

// softmaxCE returns −log softmax(z)[y] in float64 and whether y is the
// arg-max (first maximum).
func softmaxCE(z []float32, y int) (float64, bool) {
	mx, arg := z[0], 0
	for i, v := range z {
		if v > mx {
			mx, arg = v, i
		}
	}
	var s float64
	for _, v := range z {
		s += math.Exp(float64(v - mx))
	}
	return math.Log(s) - float64(z[y]-mx), arg == y
}
