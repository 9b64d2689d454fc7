package ops

import (
	"fmt"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// MatMulT is y = x·wᵀ for x [N K] and w [M K] (y [N M]): one GEMM with a
// transposed operand. The tied LSTM decoder multiplies by the embedding
// matrix [V E] this way; with Gorgonia's ops it would need an explicit
// transpose copy of the V×E matrix every step and another one of its
// gradient. Gradients: dx = dy·w (MatMulTGrad{Which: 0}, inputs w, dy) and
// dw = dyᵀ·x (MatMulTGrad{Which: 1}, inputs x, dy).
type MatMulT struct{}

// MatMulTGrad is a gradient of MatMulT (see there).
type MatMulTGrad struct {
	Which int
}

// MulT returns x·wᵀ.
func MulT(x, w *G.Node) (*G.Node, error) {
	xs, ws := x.Shape(), w.Shape()
	if len(xs) != 2 || len(ws) != 2 || xs[1] != ws[1] {
		return nil, fmt.Errorf("ops: x·wᵀ of shapes %v and %v", xs, ws)
	}
	return applyDiff(MatMulT{}, x, w)
}

// Type implements descriptor.
func (MatMulT) Type() hm.Type { return hm.NewFnType(tensorType(2), tensorType(2), tensorType(2)) }

// shape implements descriptor.
func (MatMulT) shape(s []tensor.Shape) (tensor.Shape, error) {
	if len(s[0]) != 2 || len(s[1]) != 2 || s[0][1] != s[1][1] {
		return nil, fmt.Errorf("ops: MatMulT of shapes %v and %v", s[0], s[1])
	}
	return tensor.Shape{s[0][0], s[1][0]}, nil
}

func (MatMulT) String() string { return "MatMulT" }

// DiffWRT implements differentiable.
func (MatMulT) DiffWRT(int) []bool { return []bool{true, true} }

// SymDiff implements differentiable.
func (MatMulT) SymDiff(inputs G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	dx, err := apply(MatMulTGrad{Which: 0}, inputs[1], grad)
	if err != nil {
		return nil, err
	}
	dw, err := apply(MatMulTGrad{Which: 1}, inputs[0], grad)
	return G.Nodes{dx, dw}, err
}

// CPU implements Kernel.
func (MatMulT) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("MatMulT", in, 2); err != nil {
		return err
	}
	n, k, m := in[0].Shape[0], in[0].Shape[1], in[1].Shape[0]
	sgemm(false, true, n, m, k, 1, in[0].F32, k, in[1].F32, k, 0, out.F32, m)
	return nil
}

// Type implements descriptor.
func (MatMulTGrad) Type() hm.Type {
	return hm.NewFnType(tensorType(2), tensorType(2), tensorType(2))
}

// shape implements descriptor: dx is [N K] from (w [M K], dy [N M]);
// dw is [M K] from (x [N K], dy [N M]).
func (op MatMulTGrad) shape(s []tensor.Shape) (tensor.Shape, error) {
	a, d := s[0], s[1]
	if len(a) != 2 || len(d) != 2 {
		return nil, fmt.Errorf("ops: MatMulT gradient of shapes %v and %v", a, d)
	}
	if op.Which == 0 {
		return tensor.Shape{d[0], a[1]}, nil
	}
	return tensor.Shape{d[1], a[1]}, nil
}

func (op MatMulTGrad) String() string { return fmt.Sprintf("MatMulTGrad%d", op.Which) }

// CPU implements Kernel.
func (op MatMulTGrad) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("MatMulTGrad", in, 2); err != nil {
		return err
	}
	a, dy := in[0], in[1]
	n, m, k := dy.Shape[0], dy.Shape[1], a.Shape[1]
	if op.Which == 0 { // dx [N K] = dy [N M] · w [M K]
		sgemm(false, false, n, k, m, 1, dy.F32, m, a.F32, k, 0, out.F32, k)
		return nil
	}
	// dw [M K] = dyᵀ [M N] · x [N K]
	sgemm(true, false, m, k, n, 1, dy.F32, m, a.F32, k, 0, out.F32, k)
	return nil
}
