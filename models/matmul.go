package models

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// matMulTOp is y = x·wᵀ for x [N K] and w [M K] (y [N M]), one GEMM with a
// transposed operand. The tied LSTM decoder multiplies by the embedding
// matrix [V E] this way; with Gorgonia's ops it would need an explicit
// transpose copy of the V×E matrix every step and another one of its
// gradient. Gradients: dx = dy·w, dw = dyᵀ·x.
type matMulTOp struct{}

type matMulTGradOp struct{ which int } // 0: dx (inputs w, dy); 1: dw (inputs x, dy)

func matMulT(x, w *G.Node) (*G.Node, error) {
	xs, ws := x.Shape(), w.Shape()
	if len(xs) != 2 || len(ws) != 2 || xs[1] != ws[1] {
		return nil, fmt.Errorf("models: x·wᵀ of shapes %v and %v", xs, ws)
	}
	return G.ApplyOp(matMulTOp{}, x, w)
}

// Arity implements gorgonia.Op.
func (matMulTOp) Arity() int { return 2 }

// Type implements gorgonia.Op.
func (matMulTOp) Type() hm.Type { return hm.NewFnType(t2(), t2(), t2()) }

// InferShape implements gorgonia.Op.
func (matMulTOp) InferShape(ds ...G.DimSizer) (tensor.Shape, error) {
	x, ok1 := ds[0].(tensor.Shape)
	w, ok2 := ds[1].(tensor.Shape)
	if !ok1 || !ok2 || len(x) != 2 || len(w) != 2 {
		return nil, fmt.Errorf("matMulT: bad shapes %v %v", ds[0], ds[1])
	}
	return tensor.Shape{x[0], w[0]}, nil
}

// ReturnsPtr implements gorgonia.Op.
func (matMulTOp) ReturnsPtr() bool { return false }

// CallsExtern implements gorgonia.Op.
func (matMulTOp) CallsExtern() bool { return false }

// OverwritesInput implements gorgonia.Op.
func (matMulTOp) OverwritesInput() int { return -1 }

// WriteHash implements gorgonia.Op.
func (matMulTOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "MatMulT") }

// Hashcode implements gorgonia.Op.
func (matMulTOp) Hashcode() uint32 { return opHash("MatMulT") }

func (matMulTOp) String() string { return "MatMulT" }

// DiffWRT implements gorgonia.SDOp.
func (matMulTOp) DiffWRT(int) []bool { return []bool{true, true} }

// SymDiff implements gorgonia.SDOp.
func (matMulTOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	dx, err := G.ApplyOp(matMulTGradOp{0}, inputs[1], grad)
	if err != nil {
		return nil, err
	}
	dw, err := G.ApplyOp(matMulTGradOp{1}, inputs[0], grad)
	return G.Nodes{dx, dw}, err
}

// DoDiff is not supported (the tape machine uses SymDiff).
func (matMulTOp) DoDiff(G.ExecutionContext, G.Nodes, *G.Node) error {
	return fmt.Errorf("models: matMulT supports symbolic differentiation only")
}

// Do implements gorgonia.Op.
func (matMulTOp) Do(vals ...G.Value) (G.Value, error) {
	x, xs, err := f32s(vals[0])
	if err != nil {
		return nil, err
	}
	w, ws, err := f32s(vals[1])
	if err != nil {
		return nil, err
	}
	n, k, m := xs[0], xs[1], ws[0]
	y := make([]float32, n*m)
	sgemm(false, true, n, m, k, 1, x, k, w, k, 0, y, m)
	return tensor.New(tensor.WithShape(n, m), tensor.WithBacking(y)), nil
}

// Arity implements gorgonia.Op.
func (matMulTGradOp) Arity() int { return 2 }

// Type implements gorgonia.Op.
func (matMulTGradOp) Type() hm.Type { return hm.NewFnType(t2(), t2(), t2()) }

// InferShape implements gorgonia.Op: dx is [N K] from (w [M K], dy [N M]);
// dw is [M K] from (x [N K], dy [N M]).
func (op matMulTGradOp) InferShape(ds ...G.DimSizer) (tensor.Shape, error) {
	a, ok1 := ds[0].(tensor.Shape)
	d, ok2 := ds[1].(tensor.Shape)
	if !ok1 || !ok2 || len(a) != 2 || len(d) != 2 {
		return nil, fmt.Errorf("matMulT gradient: bad shapes %v %v", ds[0], ds[1])
	}
	if op.which == 0 {
		return tensor.Shape{d[0], a[1]}, nil
	}
	return tensor.Shape{d[1], a[1]}, nil
}

// ReturnsPtr implements gorgonia.Op.
func (matMulTGradOp) ReturnsPtr() bool { return false }

// CallsExtern implements gorgonia.Op.
func (matMulTGradOp) CallsExtern() bool { return false }

// OverwritesInput implements gorgonia.Op.
func (matMulTGradOp) OverwritesInput() int { return -1 }

// WriteHash implements gorgonia.Op.
func (op matMulTGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }

// Hashcode implements gorgonia.Op.
func (op matMulTGradOp) Hashcode() uint32 { return opHash(op.String()) }

func (op matMulTGradOp) String() string { return fmt.Sprintf("MatMulTGrad%d", op.which) }

// DiffWRT implements gorgonia.SDOp (no second derivatives).
func (matMulTGradOp) DiffWRT(int) []bool { return []bool{false, false} }

// SymDiff implements gorgonia.SDOp.
func (matMulTGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("models: no second derivative of matMulT")
}

// Do implements gorgonia.Op.
func (op matMulTGradOp) Do(vals ...G.Value) (G.Value, error) {
	a, as, err := f32s(vals[0])
	if err != nil {
		return nil, err
	}
	dy, ds, err := f32s(vals[1])
	if err != nil {
		return nil, err
	}
	n, m, k := ds[0], ds[1], as[1]
	if op.which == 0 { // dx [N K] = dy [N M] · w [M K]
		dx := make([]float32, n*k)
		sgemm(false, false, n, k, m, 1, dy, m, a, k, 0, dx, k)
		return tensor.New(tensor.WithShape(n, k), tensor.WithBacking(dx)), nil
	}
	// dw [M K] = dyᵀ [M N] · x [N K]
	dw := make([]float32, m*k)
	sgemm(true, false, m, k, n, 1, dy, m, a, k, 0, dw, k)
	return tensor.New(tensor.WithShape(m, k), tensor.WithBacking(dw)), nil
}
