package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// lstmSizes are the batch and hidden sizes the LSTM tests cover: batch 1,
// hidden 1 and 3, odd sizes, and a batch the CPU kernel splits between
// goroutines.
var lstmSizes = [][2]int{{1, 1}, {1, 3}, {2, 1}, {3, 5}, {5, 7}, {4, 33}, {64, 70}}

// lstmRef is one LSTM step in float64 from the definition: the outputs
// h', c' and, for the loss Σ rh⊙h' + Σ rc⊙c', the gradients of x (= of
// hw) and of c.
func lstmRef(x, hw, c, rh, rc []float64, B, H int) (h, cn, dG, dc []float64) {
	sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	h, cn, dG, dc = make([]float64, B*H), make([]float64, B*H), make([]float64, 4*B*H), make([]float64, B*H)
	for b := 0; b < B; b++ {
		for j := 0; j < H; j++ {
			k, row := b*H+j, b*4*H
			gate := func(q int) float64 { return x[row+q*H+j] + hw[row+q*H+j] }
			i, f, g, o := sig(gate(0)), sig(gate(1)), math.Tanh(gate(2)), sig(gate(3))
			cn[k] = f*c[k] + i*g
			t := math.Tanh(cn[k])
			h[k] = o * t
			dcn := rc[k] + rh[k]*o*(1-t*t)
			dG[row+j] = dcn * g * i * (1 - i)
			dG[row+H+j] = dcn * c[k] * f * (1 - f)
			dG[row+2*H+j] = dcn * i * (1 - g*g)
			dG[row+3*H+j] = rh[k] * t * o * (1 - o)
			dc[k] = dcn * f
		}
	}
	return
}

func to64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// TestLSTMCellMatchesDefinition checks LSTMCell and LSTMCellGrad against
// the step's definition in float64 (within 2e-6 relative: float32
// rounding of a few operations), and the definition's gradient against
// central finite differences of its forward pass (within 1e-7, float64).
func TestLSTMCellMatchesDefinition(t *testing.T) {
	for _, d := range lstmSizes {
		B, H := d[0], d[1]
		r := rand.New(rand.NewPCG(uint64(B), uint64(H)))
		x, hw, c := rnd(r, 4*B*H), rnd(r, 4*B*H), rnd(r, B*H)
		rh, rc := rnd(r, B*H), rnd(r, B*H)
		p := run(t, LSTMCell{}, []Arg{f32(x, B, 4*H), f32(hw, B, 4*H), f32(c, B, H)}, f32(make([]float32, 10*B*H), 10, B, H))
		dp := make([]float32, 10*B*H)
		copy(dp[LSTMPlaneH*B*H:], rh)
		copy(dp[LSTMPlaneC*B*H:], rc)
		for i := 2 * B * H; i < len(dp); i++ {
			dp[i] = float32(math.NaN()) // the planes the gradient must not read
		}
		dd := run(t, LSTMCellGrad{}, []Arg{p, f32(c, B, H), f32(dp, 10, B, H)}, f32(make([]float32, 5*B*H), 5, B, H))

		x64, hw64, c64, rh64, rc64 := to64(x), to64(hw), to64(c), to64(rh), to64(rc)
		h, cn, dG, dc := lstmRef(x64, hw64, c64, rh64, rc64, B, H)
		name := fmt.Sprintf("B=%d H=%d", B, H)
		n := B * H
		close64(t, name+" h'", p.F32[LSTMPlaneH*n:(LSTMPlaneH+1)*n], h, 2e-6)
		close64(t, name+" c'", p.F32[LSTMPlaneC*n:(LSTMPlaneC+1)*n], cn, 2e-6)
		tc := make([]float64, n)
		for k, v := range cn {
			tc[k] = math.Tanh(v)
		}
		close64(t, name+" tanh(c')", p.F32[LSTMPlaneTanhC*n:(LSTMPlaneTanhC+1)*n], tc, 2e-6)
		close64(t, name+" dG", dd.F32[:4*n], dG, 2e-6)
		close64(t, name+" dc", dd.F32[4*n:], dc, 2e-6)

		// The reference gradient against finite differences of the
		// reference loss.
		loss := func(x, c []float64) float64 {
			h, cn, _, _ := lstmRef(x, hw64, c, rh64, rc64, B, H)
			var s float64
			for k := range h {
				s += rh64[k]*h[k] + rc64[k]*cn[k]
			}
			return s
		}
		const eps = 1e-6
		fd := func(v []float64, k int, f func() float64) float64 {
			old := v[k]
			v[k] = old + eps
			up := f()
			v[k] = old - eps
			down := f()
			v[k] = old
			return (up - down) / (2 * eps)
		}
		// Every element of the small cases, 40 random ones of the large.
		pick := func(n int) []int {
			if n <= 160 {
				return r.Perm(n)
			}
			return r.Perm(n)[:40]
		}
		for _, k := range pick(len(x64)) {
			if g := fd(x64, k, func() float64 { return loss(x64, c64) }); math.Abs(g-dG[k]) > 1e-7*math.Max(1, math.Abs(g)) {
				t.Fatalf("%s: dG[%d] = %v, finite difference %v", name, k, dG[k], g)
			}
		}
		for _, k := range pick(len(c64)) {
			if g := fd(c64, k, func() float64 { return loss(x64, c64) }); math.Abs(g-dc[k]) > 1e-7*math.Max(1, math.Abs(g)) {
				t.Fatalf("%s: dc[%d] = %v, finite difference %v", name, k, dc[k], g)
			}
		}
	}
}

// lstmLayer builds T steps of an LSTM layer as the LSTM model does: xw
// [T·B 4H] holds every step's input projection, h0 and c0 [B H] the
// initial state, whh [H 4H] the recurrent weight; the step is LSTMStep
// (fused) or the composition of Gorgonia's ops it replaces. It returns
// the concatenated hidden states [T·B H] and the last cell state.
func lstmLayer(fused bool, xw, h0, c0, whh *G.Node, T, B, H int) (out, c *G.Node) {
	h, c := h0, c0
	outs := make([]*G.Node, T)
	for t := 0; t < T; t++ {
		xt := G.Must(G.Slice(xw, G.S(t*B, (t+1)*B)))
		if B == 1 { // Gorgonia drops an axis sliced to one element
			xt = G.Must(G.Reshape(xt, tensor.Shape{1, 4 * H}))
		}
		hw := G.Must(G.Mul(h, whh))
		if fused {
			var err error
			if h, c, err = LSTMStep(xt, hw, c); err != nil {
				panic(err)
			}
		} else {
			gates := G.Must(G.Add(xt, hw))
			col := func(q int) *G.Node {
				s := G.Must(G.Slice(gates, nil, G.S(q*H, (q+1)*H)))
				if s.Dims() < 2 { // a slice of width one loses its axis too
					s = G.Must(G.Reshape(s, tensor.Shape{B, H}))
				}
				return s
			}
			ig, fg, gg, og := G.Must(G.Sigmoid(col(0))), G.Must(G.Sigmoid(col(1))), G.Must(G.Tanh(col(2))), G.Must(G.Sigmoid(col(3)))
			c = G.Must(G.Add(G.Must(G.HadamardProd(fg, c)), G.Must(G.HadamardProd(ig, gg))))
			h = G.Must(G.HadamardProd(og, G.Must(G.Tanh(c))))
		}
		outs[t] = h
	}
	if T == 1 {
		return outs[0], c
	}
	return G.Must(G.Concat(0, outs...)), c
}

// TestLSTMStepMatchesComposition runs T steps of a layer, fused and as the
// composition of Gorgonia's ops, on Gorgonia's tape machine with the loss
// Σ r⊙hidden states + Σ q⊙last cell state: the loss and the gradients of
// the input projection, the initial state and the recurrent weight agree
// bit for bit (tolerance 0; −0 and +0 count as equal). Batch 1 with
// hidden size 1 is left out: the composition's 1×1 column slices are
// scalars there, which Gorgonia's tape machine cannot reshape back.
func TestLSTMStepMatchesComposition(t *testing.T) {
	for _, d := range lstmSizes[1:] {
		for _, T := range []int{1, 3} {
			B, H := d[0], d[1]
			r := rand.New(rand.NewPCG(uint64(B*100+H), uint64(T)))
			vals := [][]float32{rnd(r, T*B*4*H), rnd(r, B*H), rnd(r, B*H), rnd(r, H*4*H), rnd(r, T*B*H), rnd(r, B*H)}
			shapes := [][]int{{T * B, 4 * H}, {B, H}, {B, H}, {H, 4 * H}, {T * B, H}, {B, H}}
			var losses []float32
			var grads [][][]float32
			for _, fused := range []bool{false, true} {
				g := G.NewGraph()
				var n []*G.Node
				for i, v := range vals {
					n = append(n, G.NodeFromAny(g, tensor.New(tensor.WithShape(shapes[i]...), tensor.WithBacking(append([]float32(nil), v...))), G.WithName(fmt.Sprintf("v%d", i))))
				}
				out, c := lstmLayer(fused, n[0], n[1], n[2], n[3], T, B, H)
				loss := G.Must(G.Add(G.Must(G.Sum(G.Must(G.HadamardProd(out, n[4])))), G.Must(G.Sum(G.Must(G.HadamardProd(c, n[5]))))))
				gs, err := G.Grad(loss, n[:4]...)
				if err != nil {
					t.Fatal(err)
				}
				vm := G.NewTapeMachine(g)
				if err := vm.RunAll(); err != nil {
					t.Fatal(err)
				}
				losses = append(losses, loss.Value().Data().(float32))
				var gv [][]float32
				for _, gn := range gs {
					gv = append(gv, append([]float32(nil), gn.Value().Data().([]float32)...))
				}
				grads = append(grads, gv)
				vm.Close()
			}
			name := fmt.Sprintf("B=%d H=%d T=%d", B, H, T)
			if losses[0] != losses[1] {
				t.Fatalf("%s: loss %v fused, %v composed", name, losses[1], losses[0])
			}
			for i, what := range []string{"xw", "h0", "c0", "whh"} {
				for k, v := range grads[0][i] {
					if grads[1][i][k] != v {
						t.Fatalf("%s: gradient of %s[%d] = %v fused, %v composed", name, what, k, grads[1][i][k], v)
					}
				}
			}
		}
	}
}

func TestLSTMCellShapes(t *testing.T) {
	g := G.NewGraph()
	m := func(r, c int) *G.Node { return G.NewMatrix(g, tensor.Float32, G.WithShape(r, c)) }
	for _, c := range [][3]*G.Node{
		{m(2, 8), m(2, 8), m(2, 3)}, // 4H ≠ 8
		{m(2, 8), m(3, 8), m(2, 2)}, // batches differ
		{m(2, 8), m(2, 4), m(2, 2)}, // hw narrower than x
	} {
		if _, _, err := LSTMStep(c[0], c[1], c[2]); err == nil || !strings.Contains(err.Error(), "want [B 4H]") {
			t.Errorf("shapes %v %v %v: %v", c[0].Shape(), c[1].Shape(), c[2].Shape(), err)
		}
	}
	err := LSTMCellGrad{}.CPU([]Arg{f32(make([]float32, 10*2), 10, 2, 1), f32(make([]float32, 2), 2, 1), f32(make([]float32, 10*2), 10, 1, 2)}, f32(make([]float32, 10), 5, 2, 1), nil)
	if err == nil || !strings.Contains(err.Error(), "LSTMCellGrad of shapes") {
		t.Errorf("mismatched gradient shapes: %v", err)
	}
}
