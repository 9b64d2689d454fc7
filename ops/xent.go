package ops

import (
	"fmt"
	"math"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Softmax cross-entropy in three ops:
//
//   - LogSumExp: lse[r] = log Σⱼ exp(z[r][j]) per row of the logits z [N C]
//     (computed as max + log Σ exp(z − max), the exponentials in float32 by
//     exp32 and their sum in float64, the result in float64);
//   - SoftmaxCrossEntropy(z, y, lse): the mean over rows of
//     lse[r] − z[r][y[r]], a float32 scalar (the loss);
//   - SoftmaxCrossEntropyGrad(z, y, lse, g): g·(softmax(z) − onehot(y))/N.
//
// With label smoothing ε (Szegedy et al. 2016; PyTorch's
// CrossEntropyLoss(label_smoothing=ε)) the target distribution is
// (1 − ε)·onehot(y) + ε/C: the loss of a row is
// lse − (1 − ε)·z[y] − ε·mean(z) and its gradient softmax(z) − (1 − ε)·onehot(y) − ε/C.
// ε = 0 computes exactly what the plain loss does.
//
// The log-sum-exp is a node of its own so the gradient reuses it without
// hidden state. Built from Gorgonia's ops the same loss needs LogSoftMax
// (single-threaded, about a tenth of an LSTM step at a 28,869-word
// vocabulary), a reshape copy and a ByIndices gather whose gradient
// allocates another N×C matrix.
type LogSumExp struct{}

// SoftmaxCrossEntropy is the mean cross-entropy loss (see LogSumExp).
type SoftmaxCrossEntropy struct {
	// Smoothing is the label smoothing ε, in [0, 1).
	Smoothing float32
}

// SoftmaxCrossEntropyGrad is the gradient of SoftmaxCrossEntropy with
// respect to the logits (see LogSumExp).
type SoftmaxCrossEntropyGrad struct {
	// Smoothing is the loss's label smoothing ε.
	Smoothing float32
}

// CrossEntropy returns the mean cross-entropy of logits [N C] against
// targets (an integer vector of N class ids), with label smoothing
// smoothing (0: none; at most 1 exclusive).
func CrossEntropy(logits, targets *G.Node, smoothing float64) (*G.Node, error) {
	s := logits.Shape()
	if len(s) != 2 || targets.Shape().TotalSize() != s[0] {
		return nil, fmt.Errorf("ops: cross-entropy of logits %v against %v targets", s, targets.Shape())
	}
	if !(smoothing >= 0 && smoothing < 1) {
		return nil, fmt.Errorf("ops: label smoothing %v; use 0 ≤ ε < 1", smoothing)
	}
	lse, err := applyDiff(LogSumExp{}, logits)
	if err != nil {
		return nil, err
	}
	return applyDiff(SoftmaxCrossEntropy{Smoothing: float32(smoothing)}, logits, targets, lse)
}

func tInt() hm.Type { return G.TensorType{Dims: 1, Of: tensor.Int} }

// Type implements descriptor.
func (LogSumExp) Type() hm.Type { return hm.NewFnType(tensorType(2), typedTensor(1, tensor.Float64)) }

// shape implements descriptor.
func (LogSumExp) shape(s []tensor.Shape) (tensor.Shape, error) {
	if len(s[0]) != 2 {
		return nil, fmt.Errorf("ops: LogSumExp of shape %v, want [N C]", s[0])
	}
	return tensor.Shape{s[0][0]}, nil
}

func (LogSumExp) String() string { return "LogSumExp" }

// DiffWRT implements differentiable: the log-sum-exp is a saved value, not
// differentiated.
func (LogSumExp) DiffWRT(int) []bool { return []bool{false} }

// SymDiff implements differentiable.
func (LogSumExp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("ops: LogSumExp is not differentiated")
}

// OutType implements Typed.
func (LogSumExp) OutType() DType { return Float64 }

// CPU implements Kernel.
func (LogSumExp) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("LogSumExp", in, 1); err != nil {
		return err
	}
	z, c := in[0].F32, in[0].Shape[1]
	parallelFor(in[0].Shape[0], func(r int) {
		row := z[r*c : (r+1)*c]
		mx := rowMax(row)
		out.F64[r] = float64(mx) + math.Log(expSubSum(row, mx))
	})
	return nil
}

func checkTargets(name string, z, y Arg) error {
	n, c := z.Shape[0], z.Shape[1]
	if len(y.I64) != n {
		return fmt.Errorf("ops: %s has %d targets for %d rows", name, len(y.I64), n)
	}
	for i, v := range y.I64 {
		if v < 0 || v >= int64(c) {
			return fmt.Errorf("ops: %s target %d = %d is outside [0, %d)", name, i, v, c)
		}
	}
	return nil
}

// Type implements descriptor.
func (SoftmaxCrossEntropy) Type() hm.Type {
	return hm.NewFnType(tensorType(2), tInt(), typedTensor(1, tensor.Float64), hm.TypeVariable('a'))
}

// shape implements descriptor.
func (SoftmaxCrossEntropy) shape([]tensor.Shape) (tensor.Shape, error) {
	return tensor.ScalarShape(), nil
}

func (SoftmaxCrossEntropy) String() string { return "SoftmaxCrossEntropy" }

// DiffWRT implements differentiable.
func (SoftmaxCrossEntropy) DiffWRT(int) []bool { return []bool{true, false, false} }

// SymDiff implements differentiable.
func (op SoftmaxCrossEntropy) SymDiff(inputs G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	d, err := apply(SoftmaxCrossEntropyGrad{Smoothing: op.Smoothing}, inputs[0], inputs[1], inputs[2], grad)
	return G.Nodes{d, nil, nil}, err
}

// CPU implements Kernel: the per-row losses lse − z[y] (with smoothing
// lse − (1 − ε)·z[y] − ε·mean(z)) are summed in float64 in row order and
// the mean rounded to float32.
func (op SoftmaxCrossEntropy) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("SoftmaxCrossEntropy", in, 3); err != nil {
		return err
	}
	if err := checkTargets("SoftmaxCrossEntropy", in[0], in[1]); err != nil {
		return err
	}
	z, y, lse := in[0].F32, in[1].I64, in[2].F64
	n, c := in[0].Shape[0], in[0].Shape[1]
	var sum float64
	eps := float64(op.Smoothing)
	for r := 0; r < n; r++ {
		l := lse[r] - (1-eps)*float64(z[r*c+int(y[r])]) // (1 − 0)·z is z exactly
		if eps != 0 {
			var zs float64
			for _, v := range z[r*c : (r+1)*c] {
				zs += float64(v)
			}
			l -= eps * zs / float64(c)
		}
		sum += l
	}
	out.F32[0] = float32(sum / float64(n))
	return nil
}

// Type implements descriptor.
func (SoftmaxCrossEntropyGrad) Type() hm.Type {
	return hm.NewFnType(tensorType(2), tInt(), typedTensor(1, tensor.Float64), hm.TypeVariable('a'), tensorType(2))
}

// shape implements descriptor.
func (SoftmaxCrossEntropyGrad) shape(s []tensor.Shape) (tensor.Shape, error) {
	return s[0].Clone(), nil
}

func (SoftmaxCrossEntropyGrad) String() string { return "SoftmaxCrossEntropyGrad" }

// InPlace implements InPlacer: each element of the gradient is computed
// from the logit at its position (the target's element is corrected after
// its row is written).
func (SoftmaxCrossEntropyGrad) InPlace() []int { return []int{0} }

// CPU implements Kernel: out = g·(softmax(z) − (1 − ε)·onehot(y) − ε/C)/N
// with softmax(z)[j] = exp(z[j] − max)·exp(max − lse): the first factor
// in float32 (exp32, fastexp.go), the rest in float64.
func (op SoftmaxCrossEntropyGrad) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("SoftmaxCrossEntropyGrad", in, 4); err != nil {
		return err
	}
	if err := checkTargets("SoftmaxCrossEntropyGrad", in[0], in[1]); err != nil {
		return err
	}
	z, y, lse := in[0].F32, in[1].I64, in[2].F64
	n, c := in[0].Shape[0], in[0].Shape[1]
	if len(in[3].F32) != 1 {
		return fmt.Errorf("ops: cross-entropy gradient input has %d values, want a float32 scalar", in[3].Size())
	}
	k := float64(in[3].F32[0]) / float64(n)
	eps := float64(op.Smoothing)
	spread := eps * k / float64(c)
	parallelFor(n, func(r int) {
		row, o := z[r*c:(r+1)*c], out.F32[r*c:(r+1)*c]
		l := lse[r]
		// e^(v−l) as e^(v−max)·e^(max−l): the exponentials the log-sum-exp
		// summed, scaled in float64 (rounding l to float32 would shift a
		// whole row's probabilities alike, an error that does not cancel in
		// the row's sum).
		mx := rowMax(row)
		expSubScale(o, row, mx, k*math.Exp(float64(mx)-l), spread)
		o[y[r]] -= float32((1 - eps) * k)
	})
	return nil
}

// rowMax is the largest of row's values (row not empty), the shift both
// LogSumExp and its gradient take their exponentials at.
func rowMax(row []float32) float32 {
	mx := row[0]
	for _, v := range row {
		if v > mx {
			mx = v
		}
	}
	return mx
}
