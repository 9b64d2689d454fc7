// Package graphcases owns the small Gorgonia graphs that test executors op
// by op: each case uses some ops forward and backward (Gorgonia's built-in
// ops and the project's own), so that one list covers every op kind the
// models use. The engine's tests run each case against Gorgonia's tape
// machine (bit for bit), the cuda tests on the GPU against the CPU.
package graphcases

import (
	"fmt"
	"slices"

	"github.com/sparsegrad/sparsegrad/ops"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Case is a graph built from parameter nodes (shapes Params), integer
// inputs and pairs of running-statistics buffers; Build returns a scalar
// loss and extra outputs.
type Case struct {
	Name   string
	Params [][]int
	// Ints are the integer inputs: {length, bound} (values in [0, bound)).
	Ints [][2]int
	// Bufs is the number of running-statistics pairs (mean, variance) of
	// Channels elements each; Build receives them after the integer inputs.
	Bufs, Channels int
	Build          func(p, in []*G.Node) (loss *G.Node, outs []*G.Node)
}

// Graph is a case built on a fresh graph with unbound inputs.
type Graph struct {
	G                  *G.ExprGraph
	Params, Ints, Bufs []*G.Node
	Loss               *G.Node
	Outs, Grads        []*G.Node
}

// New builds c on a fresh graph: parameters as float32 tensors, integer
// inputs as int vectors, buffers as float32 vectors, and the gradients of
// the loss with respect to every parameter.
func New(c Case) (*Graph, error) {
	g := &Graph{G: G.NewGraph()}
	for i, s := range c.Params {
		g.Params = append(g.Params, G.NewTensor(g.G, tensor.Float32, len(s), G.WithShape(s...), G.WithName(fmt.Sprintf("p%d", i))))
	}
	for i, s := range c.Ints {
		g.Ints = append(g.Ints, G.NewVector(g.G, tensor.Int, G.WithShape(s[0]), G.WithName(fmt.Sprintf("i%d", i))))
	}
	for i := range 2 * c.Bufs {
		g.Bufs = append(g.Bufs, G.NewVector(g.G, tensor.Float32, G.WithShape(c.Channels), G.WithName(fmt.Sprintf("b%d", i))))
	}
	var err error
	if g.Loss, g.Outs, err = c.On(g.Params, append(slices.Clone(g.Ints), g.Bufs...)); err != nil {
		return nil, err
	}
	if g.Grads, err = G.Grad(g.Loss, g.Params...); err != nil {
		return nil, fmt.Errorf("graphcases: %s: gradients: %w", c.Name, err)
	}
	return g, nil
}

// On builds c on nodes the caller made (e.g. bound to values for the tape
// machine): the parameters, then the integer inputs followed by the
// buffers. A panic of the builder becomes an error.
func (c Case) On(params, in []*G.Node) (loss *G.Node, outs []*G.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("graphcases: building %s: %v", c.Name, r)
		}
	}()
	loss, outs = c.Build(params, in)
	return loss, outs, nil
}

// Buffers returns c's running statistics as the tests start them: means
// 0.1·(channel mod 4), variances one more.
func (c Case) Buffers() []float32 {
	b := make([]float32, 2*c.Bufs*c.Channels)
	for i := range b {
		b[i] = 0.1 * float32(i%c.Channels%4)
		if (i/c.Channels)%2 == 1 {
			b[i]++
		}
	}
	return b
}

// Named returns the case called name; it panics if there is none.
func Named(name string) Case {
	for _, c := range Cases() {
		if c.Name == name {
			return c
		}
	}
	panic("graphcases: no case " + name)
}

func must(n *G.Node, err error) *G.Node {
	if err != nil {
		panic(err)
	}
	return n
}

// Cases returns every case. Small cases come first; the wider ones make
// GPU kernels run more than one block and more than one warp.
func Cases() []Case {
	sum := func(x *G.Node) *G.Node { return must(G.Sum(x)) }
	// weighted makes the loss depend on every element differently, so that
	// gradients are not all ones.
	weighted := func(x *G.Node) *G.Node { return sum(must(G.HadamardProd(x, must(G.Tanh(x))))) }
	return []Case{
		{Name: "elementwise", Params: [][]int{{3, 5}, {3, 5}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			a, b := p[0], p[1]
			s := must(G.Add(a, b))
			d := must(G.Sub(s, must(G.HadamardProd(a, b))))
			q := must(G.HadamardDiv(d, must(G.Add(must(G.HadamardProd(b, b)), G.NewConstant(float32(1))))))
			return weighted(must(G.Sigmoid(must(G.Neg(q))))), []*G.Node{s}
		}},
		{Name: "elementwise-wide", Params: [][]int{{3, 50}, {3, 50}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			a, b := p[0], p[1]
			s := must(G.Add(a, b))
			d := must(G.Sub(s, must(G.HadamardProd(a, b))))
			q := must(G.HadamardDiv(d, must(G.Add(must(G.HadamardProd(b, b)), G.NewConstant(float32(1))))))
			r := must(G.Rectify(must(G.Sub(G.NewConstant(float32(0.5)), q))))
			return weighted(must(G.Add(must(G.Sigmoid(must(G.Neg(q)))), must(G.Softplus(r))))), []*G.Node{s}
		}},
		{Name: "scalar-tensor", Params: [][]int{{4, 3}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			one := G.NewConstant(float32(1))
			a := must(G.Sub(one, p[0])) // scalar − tensor
			b := must(G.HadamardProd(a, G.NewConstant(float32(0.5))))
			c := must(G.Div(b, G.NewConstant(float32(3)))) // tensor ÷ scalar
			return weighted(must(G.Softplus(c))), nil
		}},
		{Name: "relu-tanh", Params: [][]int{{6, 4}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			return weighted(must(G.Tanh(must(G.Rectify(p[0]))))), nil
		}},
		{Name: "matmul", Params: [][]int{{3, 4}, {4, 5}, {5, 4}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			ab := must(G.Mul(p[0], p[1])) // [3 5]; its gradients are A×Bᵀ and Aᵀ×B
			abc := must(G.Mul(ab, p[2]))  // [3 4]
			return weighted(abc), []*G.Node{ab}
		}},
		{Name: "linear-broadcast", Params: [][]int{{5, 3}, {3, 4}, {4}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			xw := must(G.Mul(p[0], p[1]))
			b := must(G.Reshape(p[2], tensor.Shape{1, 4}))
			y := must(G.BroadcastAdd(xw, b, nil, []byte{0}))
			return weighted(y), []*G.Node{y}
		}},
		{Name: "linear-wide", Params: [][]int{{7, 33}, {33, 20}, {20}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			xw := must(G.Mul(p[0], p[1]))
			y := must(G.BroadcastAdd(xw, must(G.Reshape(p[2], tensor.Shape{1, 20})), nil, []byte{0}))
			return weighted(y), []*G.Node{y}
		}},
		{Name: "broadcast-axis1", Params: [][]int{{5, 1}, {5, 3}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			return weighted(must(G.BroadcastAdd(p[0], p[1], []byte{1}, nil))), nil
		}},
		{Name: "sums-mean", Params: [][]int{{4, 6}, {7, 3}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			a := must(G.Sum(p[0], 0))  // first axis
			b := must(G.Mean(p[1], 1)) // last axis
			c := must(G.Mean(p[0]))    // all axes
			return must(G.Add(must(G.Add(weighted(a), weighted(b))), c)), []*G.Node{a, b}
		}},
		// Sums of 1,024 elements or more: a GPU adds them in two halves of
		// fixed strides (cuda's k_sum_first_part).
		{Name: "sums-long", Params: [][]int{{2000, 3}, {3, 1500}, {1200, 5, 3}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			a := must(G.Sum(p[0], 0))    // first axis, 2,000 rows
			b := must(G.Mean(p[1], 1))   // last axis, 1,500 columns
			c := must(G.Mean(p[0]))      // all axes, 6,000 elements
			d := must(G.Sum(p[2], 0, 2)) // 1,200 rows, then 3 columns
			return must(G.Add(must(G.Add(must(G.Add(weighted(a), weighted(b))), c)), weighted(d))), []*G.Node{a, b, d}
		}},
		{Name: "slices-concat", Params: [][]int{{6, 8}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			r := must(G.Slice(p[0], G.S(2, 5)))      // rows: a view
			c := must(G.Slice(p[0], nil, G.S(3, 7))) // columns: a copy
			one := must(G.Slice(p[0], G.S(1, 2)))    // one row: Gorgonia drops the axis
			cat0 := must(G.Concat(0, r, r))
			cat1 := must(G.Concat(1, c, must(G.Slice(p[0], nil, G.S(0, 2)))))
			return must(G.Add(must(G.Add(weighted(cat0), weighted(cat1))), weighted(one))), []*G.Node{r, cat1}
		}},
		{Name: "reductions-layout-wide", Params: [][]int{{6, 40}, {8, 5}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			a := must(G.Sum(p[0], 0))
			b := must(G.Mean(p[1], 1))
			rows := must(G.Slice(p[0], G.S(1, 4)))
			cols := must(G.Slice(p[0], nil, G.S(10, 30)))
			cat := must(G.Concat(1, cols, must(G.Slice(p[0], nil, G.S(0, 5)))))
			cat0 := must(G.Concat(0, rows, rows))
			l := must(G.Add(must(G.Add(weighted(a), weighted(b))), must(G.Mean(p[1]))))
			return must(G.Add(must(G.Add(l, weighted(cat))), weighted(cat0))), []*G.Node{cat}
		}},
		{Name: "gather", Params: [][]int{{9, 4}}, Ints: [][2]int{{7, 9}}, Build: func(p, in []*G.Node) (*G.Node, []*G.Node) {
			e := must(G.ByIndices(p[0], in[0], 0))
			return weighted(e), []*G.Node{e}
		}},
		{Name: "gather-wide", Params: [][]int{{50, 8}}, Ints: [][2]int{{30, 50}}, Build: func(p, in []*G.Node) (*G.Node, []*G.Node) {
			return weighted(must(G.ByIndices(p[0], in[0], 0))), nil
		}},
		// 1500 rows of 40 indices: a GPU sorts the rows in several tiles
		// and merges them across tiles before adding each index's rows.
		{Name: "gather-many-rows", Params: [][]int{{40, 3}}, Ints: [][2]int{{1500, 40}}, Build: func(p, in []*G.Node) (*G.Node, []*G.Node) {
			return weighted(must(G.ByIndices(p[0], in[0], 0))), nil
		}},
		{Name: "conv-bn-relu-xent", Params: [][]int{{2, 3, 5, 5}, {4, 3, 3, 3}, {4}, {4}, {4, 3, 3, 3}, {7, 4}}, Ints: [][2]int{{7, 2}}, Bufs: 2, Channels: 4,
			Build: func(p, in []*G.Node) (*G.Node, []*G.Node) {
				y := must(ops.Conv(p[0], p[1], 1, 1))
				yb := must(ops.BatchNormalize(y, p[2], p[3], in[1], in[2], ops.BatchNormConfig{Eps: 1e-5, Momentum: 0.1, ReLU: true, Training: true}))
				y2 := must(ops.Conv(p[0], p[4], 2, 1))
				yb2 := must(ops.BatchNormalize(y2, p[2], p[3], in[3], in[4], ops.BatchNormConfig{Eps: 1e-3, Momentum: 0.5, Training: true}))
				z := must(ops.AddRelu(yb, yb))
				flat := must(G.Reshape(z, tensor.Shape{2, 100}))
				x7 := must(ops.MulT(p[5], must(G.Slice(flat, nil, G.S(0, 4)))))
				ce := must(ops.CrossEntropy(x7, in[0], 0))
				return must(G.Add(must(G.Add(weighted(flat), ce)), weighted(yb2))), []*G.Node{yb}
			}},
		{Name: "conv-bn-relu-xent-wide", Params: [][]int{{4, 3, 9, 9}, {8, 3, 3, 3}, {8}, {8}, {8, 3, 1, 1}, {11, 8}}, Ints: [][2]int{{11, 4}}, Bufs: 2, Channels: 8,
			Build: func(p, in []*G.Node) (*G.Node, []*G.Node) {
				y := must(ops.Conv(p[0], p[1], 1, 1))
				yb := must(ops.BatchNormalize(y, p[2], p[3], in[1], in[2], ops.BatchNormConfig{Eps: 1e-5, Momentum: 0.1, ReLU: true, Training: true}))
				s := must(ops.Conv(p[0], p[4], 2, 0))
				sb := must(ops.BatchNormalize(s, p[2], p[3], in[3], in[4], ops.BatchNormConfig{Eps: 1e-5, Momentum: 0.1, Training: true}))
				z := must(ops.AddRelu(yb, yb))
				flat := must(G.Reshape(z, tensor.Shape{4, 648}))
				x4 := must(G.Slice(flat, nil, G.S(0, 8)))
				logits := must(ops.MulT(p[5], x4))               // [11 4]
				ce := must(ops.CrossEntropy(logits, in[0], 0.1)) // label smoothing
				return must(G.Add(must(G.Add(weighted(flat), ce)), weighted(sb))), []*G.Node{logits, ce}
			}},
		// LSTM layers of fused cells (ops.LSTMStep) over a few time steps,
		// as the LSTM model builds them: batch 1, hidden 1, odd sizes, and
		// one wide enough for several blocks of GPU threads. (Batch 1 with
		// hidden size 1 is not here: Gorgonia's tape machine turns the 1×1
		// states into scalars it cannot multiply; the cuda tests run LSTM
		// cases of that size, GPU against CPU.)
		LSTM("lstm-b1", 1, 3, 3),
		LSTM("lstm-h1", 3, 1, 2),
		LSTM("lstm-wide", 5, 70, 2),
		// Batch norm of 4096 elements per channel: a GPU spreads each
		// channel's sums over several blocks (four on the emulator's two
		// SMs), with and without the fused ReLU.
		{Name: "bn-many-blocks", Params: [][]int{{4, 2, 32, 32}, {2}, {2}}, Bufs: 2, Channels: 2,
			Build: func(p, in []*G.Node) (*G.Node, []*G.Node) {
				y := must(ops.BatchNormalize(p[0], p[1], p[2], in[0], in[1], ops.BatchNormConfig{Eps: 1e-5, Momentum: 0.1, ReLU: true, Training: true}))
				z := must(ops.BatchNormalize(p[0], p[1], p[2], in[2], in[3], ops.BatchNormConfig{Eps: 1e-3, Momentum: 0.5, Training: true}))
				return must(G.Add(weighted(y), weighted(z))), []*G.Node{y}
			}},
	}
}

// LSTM is T steps of an LSTM layer of batch B and hidden size H:
// parameters the input projection of every step [T·B 4H], the initial
// state h0 and c0 [B H] and the recurrent weight [H 4H]; the loss weighs
// every hidden state and the last cell state, so gradients flow through
// both parts of the state.
func LSTM(name string, B, H, T int) Case {
	return Case{Name: name, Params: [][]int{{T * B, 4 * H}, {B, H}, {B, H}, {H, 4 * H}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
		h, c := p[1], p[2]
		outs := make([]*G.Node, T)
		for t := range T {
			xt := must(G.Slice(p[0], G.S(t*B, (t+1)*B)))
			if B == 1 { // Gorgonia drops an axis sliced to one element
				xt = must(G.Reshape(xt, tensor.Shape{1, 4 * H}))
			}
			var err error
			if h, c, err = ops.LSTMStep(xt, must(G.Mul(h, p[3])), c); err != nil {
				panic(err)
			}
			outs[t] = h
		}
		hs := outs[0]
		if T > 1 {
			hs = must(G.Concat(0, outs...))
		}
		sum := func(x *G.Node) *G.Node { return must(G.Sum(x)) }
		return must(G.Add(sum(must(G.HadamardProd(hs, must(G.Tanh(hs))))), sum(must(G.HadamardProd(c, must(G.Tanh(c))))))), []*G.Node{hs, c}
	}}
}
