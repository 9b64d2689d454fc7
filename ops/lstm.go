package ops

import (
	"fmt"
	"slices"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// LSTMCell is one time step of an LSTM layer after its matrix products:
// inputs x [B 4H] (the input's projection, bias included), hw [B 4H] (the
// previous hidden state times the recurrent weight) and c [B H] (the
// previous cell state). The pre-activation gates are G = x + hw, in
// PyTorch's order i, f, g, o along the columns (G[b][k·H + j] is gate k
// of unit j); with i, f, o = σ of their blocks and g = tanh of its block
// the step computes
//
//	c' = f⊙c + i⊙g,  h' = o⊙tanh(c').
//
// The output [10 B H] holds ten planes of B×H values (LSTMPlaneH …
// LSTMPlanePreO): the new state h' and c', then what the gradient
// (LSTMCellGrad) needs — the activated gates i, f, g, o and tanh(c'), as
// PyTorch's fused cell saves them, and the pre-activations of i, f and o,
// from which the gradient takes σ'(x) as σ(x)·σ(−x) (as Gorgonia does; it
// is also accurate where σ saturates, unlike σ(x)·(1 − σ(x))). A plane is
// contiguous, so the executor reads h' and c' as views.
//
// The CPU kernel reproduces, bit for bit, the same step built from
// Gorgonia's ops (Add, Sigmoid, Tanh, HadamardProd, with Gorgonia's
// float32 σ and tanh, see UnaryFn), and LSTMCellGrad Gorgonia's symbolic
// gradient of that composition, except that an exact zero may keep its
// sign where Gorgonia's sums turn −0 into +0. One op replaces the
// composition's four column slices, five activations and five products
// and sums per step (and, in the backward pass, about thirty ops).
type LSTMCell struct{}

// LSTMCellGrad is LSTMCell's gradient: inputs the cell's output P [10 B H],
// its input c [B H] and the gradient dP [10 B H] of the loss with respect
// to P (only planes LSTMPlaneH and LSTMPlaneC are read: the gradients of
// h' and c'). The output [5 B H] holds dG [B 4H] (the gradient of the
// pre-activation gates, so of both x and hw) in its first 4·B·H elements
// in row-major order, then dc [B H].
type LSTMCellGrad struct{}

// The planes of LSTMCell's output.
const (
	LSTMPlaneH = iota
	LSTMPlaneC
	LSTMPlaneI
	LSTMPlaneF
	LSTMPlaneG
	LSTMPlaneO
	LSTMPlaneTanhC
	LSTMPlanePreI
	LSTMPlanePreF
	LSTMPlanePreO
	lstmPlanes
)

// LSTMStep applies LSTMCell to x [B 4H], hw [B 4H] and c [B H] and returns
// the new hidden and cell states, views of the cell's output.
func LSTMStep(x, hw, c *G.Node) (h, cNext *G.Node, err error) {
	if _, _, err := lstmShape(x.Shape(), hw.Shape(), c.Shape()); err != nil {
		return nil, nil, err
	}
	p, err := applyDiff(LSTMCell{}, x, hw, c)
	if err != nil {
		return nil, nil, err
	}
	if h, err = G.Slice(p, G.S(LSTMPlaneH)); err != nil {
		return nil, nil, err
	}
	cNext, err = G.Slice(p, G.S(LSTMPlaneC))
	return h, cNext, err
}

// lstmShape checks LSTMCell's input shapes and returns B and H.
func lstmShape(x, hw, c []int) (B, H int, err error) {
	if len(x) != 2 || len(hw) != 2 || len(c) != 2 || x[0] != hw[0] || x[1] != hw[1] || x[0] != c[0] || x[1] != 4*c[1] || c[1] < 1 {
		return 0, 0, fmt.Errorf("ops: LSTMCell of shapes %v, %v and %v; want [B 4H], [B 4H] and [B H]", x, hw, c)
	}
	return c[0], c[1], nil
}

// Type implements descriptor.
func (LSTMCell) Type() hm.Type {
	return hm.NewFnType(tensorType(2), tensorType(2), tensorType(2), tensorType(3))
}

// shape implements descriptor.
func (LSTMCell) shape(s []tensor.Shape) (tensor.Shape, error) {
	B, H, err := lstmShape(s[0], s[1], s[2])
	if err != nil {
		return nil, err
	}
	return tensor.Shape{lstmPlanes, B, H}, nil
}

func (LSTMCell) String() string { return "LSTMCell" }

// DiffWRT implements differentiable.
func (LSTMCell) DiffWRT(int) []bool { return []bool{true, true, true} }

// SymDiff implements differentiable: x and hw get dG, c gets dc, views of
// one LSTMCellGrad.
func (LSTMCell) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	d, err := apply(LSTMCellGrad{}, output, inputs[2], grad)
	if err != nil {
		return nil, err
	}
	dg, err := G.Slice(d, G.S(0, 4))
	if err != nil {
		return nil, err
	}
	if dg, err = G.Reshape(dg, inputs[0].Shape().Clone()); err != nil {
		return nil, err
	}
	dc, err := G.Slice(d, G.S(4))
	return G.Nodes{dg, dg, dc}, err
}

// CPU implements Kernel.
func (LSTMCell) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("LSTMCell", in, 3); err != nil {
		return err
	}
	B, H, err := lstmShape(in[0].Shape, in[1].Shape, in[2].Shape)
	if err != nil {
		return err
	}
	if len(out.F32) != lstmPlanes*B*H {
		return fmt.Errorf("ops: LSTMCell output holds %d values, want %d", len(out.F32), lstmPlanes*B*H)
	}
	x, hw, c, y := in[0].F32, in[1].F32, in[2].F32, out.F32
	n := B * H
	hp, cp := y[LSTMPlaneH*n:], y[LSTMPlaneC*n:]
	ip, fp, gp, op := y[LSTMPlaneI*n:], y[LSTMPlaneF*n:], y[LSTMPlaneG*n:], y[LSTMPlaneO*n:]
	tp, pi, pf, po := y[LSTMPlaneTanhC*n:], y[LSTMPlanePreI*n:], y[LSTMPlanePreF*n:], y[LSTMPlanePreO*n:]
	lstmRows(B, H, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			xr, hr := x[b*4*H:(b+1)*4*H], hw[b*4*H:(b+1)*4*H]
			for j := 0; j < H; j++ {
				k := b*H + j
				gi, gf, gg, gO := xr[j]+hr[j], xr[H+j]+hr[H+j], xr[2*H+j]+hr[2*H+j], xr[3*H+j]+hr[3*H+j]
				i, f, g, o := Sigmoid.Apply(gi), Sigmoid.Apply(gf), Tanh.Apply(gg), Sigmoid.Apply(gO)
				// Each product is rounded to float32 before it is added
				// (explicit conversions: no fused multiply-add), as the
				// separate ops of the composition round it.
				cn := float32(f*c[k]) + float32(i*g)
				t := Tanh.Apply(cn)
				hp[k], cp[k], ip[k], fp[k], gp[k], op[k], tp[k] = o*t, cn, i, f, g, o, t
				pi[k], pf[k], po[k] = gi, gf, gO
			}
		}
	})
	return nil
}

// lstmRows runs f over pieces of the B rows of an LSTM step, in parallel
// when there are at least lstmMinPiece elements per piece (each element
// costs several exponentials: a smaller piece than the plain elementwise
// kernels' is worth a goroutine).
func lstmRows(B, H int, f func(lo, hi int)) {
	const lstmMinPiece = 2048
	parts := workers(min(B, B*H/lstmMinPiece))
	if parts <= 1 {
		f(0, B)
		return
	}
	step := (B + parts - 1) / parts
	parallelFor(parts, func(p int) {
		if lo, hi := p*step, min(B, (p+1)*step); lo < hi {
			f(lo, hi)
		}
	})
}

// Type implements descriptor.
func (LSTMCellGrad) Type() hm.Type {
	return hm.NewFnType(tensorType(3), tensorType(2), tensorType(3), tensorType(3))
}

// lstmGradShape checks LSTMCellGrad's input shapes and returns B and H.
func lstmGradShape(p, c, dp []int) (B, H int, err error) {
	if len(p) != 3 || p[0] != lstmPlanes || len(c) != 2 || c[0] != p[1] || c[1] != p[2] || !slices.Equal(p, dp) {
		return 0, 0, fmt.Errorf("ops: LSTMCellGrad of shapes %v, %v and %v; want [%d B H], [B H] and [%[4]d B H]", p, c, dp, lstmPlanes)
	}
	return c[0], c[1], nil
}

// shape implements descriptor.
func (LSTMCellGrad) shape(s []tensor.Shape) (tensor.Shape, error) {
	B, H, err := lstmGradShape(s[0], s[1], s[2])
	if err != nil {
		return nil, err
	}
	return tensor.Shape{5, B, H}, nil
}

func (LSTMCellGrad) String() string { return "LSTMCellGrad" }

// CPU implements Kernel: the chain rule through the step in the order and
// association of Gorgonia's symbolic gradient of the composition (σ'(x)·dy
// as (σ(x)·σ(−x))·dy, tanh'(x)·dy as (1 − y·y)·dy with y = tanh(x)).
func (LSTMCellGrad) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("LSTMCellGrad", in, 3); err != nil {
		return err
	}
	B, H, err := lstmGradShape(in[0].Shape, in[1].Shape, in[2].Shape)
	if err != nil {
		return err
	}
	n := B * H
	if len(out.F32) != 5*n {
		return fmt.Errorf("ops: LSTMCellGrad output holds %d values, want %d", len(out.F32), 5*n)
	}
	p, c, dp, d := in[0].F32, in[1].F32, in[2].F32, out.F32
	dG, dc := d[:4*n], d[4*n:]
	lstmRows(B, H, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			row := dG[b*4*H : (b+1)*4*H]
			for j := 0; j < H; j++ {
				k := b*H + j
				i, f, g, o, t := p[LSTMPlaneI*n+k], p[LSTMPlaneF*n+k], p[LSTMPlaneG*n+k], p[LSTMPlaneO*n+k], p[LSTMPlaneTanhC*n+k]
				ni := Sigmoid.Apply(-p[LSTMPlanePreI*n+k])
				nf := Sigmoid.Apply(-p[LSTMPlanePreF*n+k])
				no := Sigmoid.Apply(-p[LSTMPlanePreO*n+k])
				dh := dp[LSTMPlaneH*n+k]
				// dc' = (the gradient of c' from later steps) + (the part
				// through tanh(c') into h'); products rounded before sums.
				dcn := dp[LSTMPlaneC*n+k] + float32(float32(1-float32(t*t))*float32(dh*o))
				row[j] = float32(i*ni) * float32(dcn*g)
				row[H+j] = float32(f*nf) * float32(dcn*c[k])
				row[2*H+j] = (1 - float32(g*g)) * float32(dcn*i)
				row[3*H+j] = float32(o*no) * float32(dh*t)
				dc[k] = dcn * f
			}
		}
	})
	return nil
}
