package models

import (
	"fmt"
	"hash"
	"math"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Fused softmax cross-entropy as a custom Gorgonia op: loss =
// mean_r(logsumexp(z_r) − z_r[y_r]), gradient (softmax(z) − onehot(y))/N.
// Built from Gorgonia's ops it needs LogSoftMax (single-threaded, about a
// tenth of an LSTM step at vocabulary 28,869), a reshape copy and a
// ByIndices gather whose gradient allocates another N×C matrix (and whose
// 1-D form panics in backward). This op does one parallel pass per
// direction and keeps the per-row log-sum-exp between them.

type xentState struct {
	lse []float64 // per-row log-sum-exp of the last forward
}

type xentOp struct{ s *xentState }

type xentGradOp struct{ s *xentState }

// softmaxCrossEntropy is the mean cross-entropy of logits [N C] against
// targets (an int vector of N class ids).
func softmaxCrossEntropy(logits, targets *G.Node) (*G.Node, error) {
	s := logits.Shape()
	if len(s) != 2 || targets.Shape().TotalSize() != s[0] {
		return nil, fmt.Errorf("models: cross-entropy of logits %v against %v targets", s, targets.Shape())
	}
	return G.ApplyOp(xentOp{&xentState{lse: make([]float64, s[0])}}, logits, targets)
}

func t2() G.TensorType       { return G.TensorType{Dims: 2, Of: hm.TypeVariable('a')} }
func tInt() G.TensorType     { return G.TensorType{Dims: 1, Of: tensor.Int} }
func (op xentOp) Arity() int { return 2 }

// Type implements gorgonia.Op.
func (op xentOp) Type() hm.Type { return hm.NewFnType(t2(), tInt(), hm.TypeVariable('a')) }

// InferShape implements gorgonia.Op.
func (op xentOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return tensor.ScalarShape(), nil }

// ReturnsPtr implements gorgonia.Op.
func (op xentOp) ReturnsPtr() bool { return false }

// CallsExtern implements gorgonia.Op.
func (op xentOp) CallsExtern() bool { return false }

// OverwritesInput implements gorgonia.Op.
func (op xentOp) OverwritesInput() int { return -1 }

// WriteHash implements gorgonia.Op.
func (op xentOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }

// Hashcode implements gorgonia.Op.
func (op xentOp) Hashcode() uint32 { return opHash(op.String()) }

func (op xentOp) String() string { return fmt.Sprintf("SoftmaxCrossEntropy{%p}", op.s) }

// DiffWRT implements gorgonia.SDOp.
func (op xentOp) DiffWRT(int) []bool { return []bool{true, false} }

// SymDiff implements gorgonia.SDOp.
func (op xentOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	d, err := G.ApplyOp(xentGradOp(op), inputs[0], inputs[1], grad)
	return G.Nodes{d, nil}, err
}

// DoDiff is not supported (the tape machine uses SymDiff).
func (op xentOp) DoDiff(G.ExecutionContext, G.Nodes, *G.Node) error {
	return fmt.Errorf("models: cross-entropy supports symbolic differentiation only")
}

func xentInputs(vals []G.Value) (z []float32, n, c int, y []int, err error) {
	z, zs, err := f32s(vals[0])
	if err != nil {
		return nil, 0, 0, nil, err
	}
	t, ok := vals[1].(*tensor.Dense)
	if !ok {
		return nil, 0, 0, nil, fmt.Errorf("models: cross-entropy targets have type %T", vals[1])
	}
	y, ok = t.Data().([]int)
	if !ok {
		return nil, 0, 0, nil, fmt.Errorf("models: cross-entropy targets have dtype %v, want int", t.Dtype())
	}
	n, c = zs[0], zs[1]
	for i, v := range y {
		if v < 0 || v >= c {
			return nil, 0, 0, nil, fmt.Errorf("models: cross-entropy target %d = %d is outside [0, %d)", i, v, c)
		}
	}
	return z, n, c, y, nil
}

// Do implements gorgonia.Op.
func (op xentOp) Do(vals ...G.Value) (G.Value, error) {
	z, n, c, y, err := xentInputs(vals)
	if err != nil {
		return nil, err
	}
	loss := make([]float64, n)
	parallelFor(n, func(r int) {
		row := z[r*c : (r+1)*c]
		mx := row[0]
		for _, v := range row {
			if v > mx {
				mx = v
			}
		}
		var s float64
		for _, v := range row {
			s += math.Exp(float64(v - mx))
		}
		lse := float64(mx) + math.Log(s)
		op.s.lse[r] = lse
		loss[r] = lse - float64(row[y[r]])
	})
	var sum float64
	for _, l := range loss {
		sum += l
	}
	return G.NewF32(float32(sum / float64(n))), nil
}

// Arity implements gorgonia.Op.
func (op xentGradOp) Arity() int { return 3 }

// Type implements gorgonia.Op.
func (op xentGradOp) Type() hm.Type {
	return hm.NewFnType(t2(), tInt(), hm.TypeVariable('a'), t2())
}

// InferShape implements gorgonia.Op.
func (op xentGradOp) InferShape(ds ...G.DimSizer) (tensor.Shape, error) {
	s, ok := ds[0].(tensor.Shape)
	if !ok {
		return nil, fmt.Errorf("cross-entropy gradient: bad shape %v", ds[0])
	}
	return s.Clone(), nil
}

// ReturnsPtr implements gorgonia.Op.
func (op xentGradOp) ReturnsPtr() bool { return false }

// CallsExtern implements gorgonia.Op.
func (op xentGradOp) CallsExtern() bool { return false }

// OverwritesInput implements gorgonia.Op.
func (op xentGradOp) OverwritesInput() int { return -1 }

// WriteHash implements gorgonia.Op.
func (op xentGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }

// Hashcode implements gorgonia.Op.
func (op xentGradOp) Hashcode() uint32 { return opHash(op.String()) }

func (op xentGradOp) String() string { return fmt.Sprintf("SoftmaxCrossEntropyGrad{%p}", op.s) }

// DiffWRT implements gorgonia.SDOp (no second derivatives).
func (op xentGradOp) DiffWRT(int) []bool { return []bool{false, false, false} }

// SymDiff implements gorgonia.SDOp.
func (op xentGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("models: no second derivative of cross-entropy")
}

// Do implements gorgonia.Op: g·(softmax(z) − onehot(y))/N, with g the
// incoming scalar gradient.
func (op xentGradOp) Do(vals ...G.Value) (G.Value, error) {
	z, n, c, y, err := xentInputs(vals[:2])
	if err != nil {
		return nil, err
	}
	var g float64
	switch v := vals[2].(type) {
	case *G.F32:
		g = float64(*v)
	case *tensor.Dense:
		d, ok := v.Data().(float32)
		if !ok {
			if s, ok2 := v.Data().([]float32); ok2 && len(s) == 1 {
				d = s[0]
			} else {
				return nil, fmt.Errorf("models: cross-entropy gradient input is not a float32 scalar")
			}
		}
		g = float64(d)
	default:
		return nil, fmt.Errorf("models: cross-entropy gradient input has type %T", vals[2])
	}
	k := g / float64(n)
	out := make([]float32, n*c)
	parallelFor(n, func(r int) {
		row, o := z[r*c:(r+1)*c], out[r*c:(r+1)*c]
		lse := op.s.lse[r]
		for i, v := range row {
			o[i] = float32(math.Exp(float64(v)-lse) * k)
		}
		o[y[r]] -= float32(k)
	})
	return tensor.New(tensor.WithShape(n, c), tensor.WithBacking(out)), nil
}
