package ops

import (
	"fmt"
	"math"

	"github.com/chewxy/math32"
)

// The descriptors below are the normalised forms of the Gorgonia ops the
// models' graphs contain; package engine translates Gorgonia's op types
// into them. Their CPU kernels reproduce Gorgonia v0.9.18's float32
// arithmetic exactly (the same scalar functions, the same summation order).

// BinOp is an elementwise binary operation.
type BinOp uint8

// The binary operations.
const (
	Add BinOp = iota + 1
	Sub
	Mul
	Div
	GreaterEq // 1 where a ≥ b, else 0
	Greater   // 1 where a > b, else 0
)

// String returns the operation's symbol.
func (o BinOp) String() string {
	if s := [...]string{Add: "+", Sub: "-", Mul: "⊙", Div: "÷", GreaterEq: ">=", Greater: ">"}; int(o) < len(s) && s[o] != "" {
		return s[o]
	}
	return fmt.Sprintf("BinOp(%d)", uint8(o))
}

// Apply computes a op b for one pair of elements.
func (o BinOp) Apply(a, b float32) float32 {
	switch o {
	case Add:
		return a + b
	case Sub:
		return a - b
	case Mul:
		return a * b
	case Div:
		return a / b
	case GreaterEq:
		if a >= b {
			return 1
		}
		return 0
	case Greater:
		if a > b {
			return 1
		}
		return 0
	}
	return float32(math.NaN())
}

// Binary is an elementwise binary operation on float32 values of one shape;
// an operand marked Scalar is a single value applied to every element of
// the other.
type Binary struct {
	Op               BinOp
	ScalarA, ScalarB bool
}

// InPlace implements InPlacer: the output may overwrite an operand that is
// not a broadcast scalar.
func (op Binary) InPlace() []int {
	var in []int
	if !op.ScalarA {
		in = append(in, 0)
	}
	if !op.ScalarB {
		in = append(in, 1)
	}
	return in
}

// CPU implements Kernel.
func (op Binary) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("Binary", in, 2); err != nil {
		return err
	}
	a, b, y := in[0].F32, in[1].F32, out.F32
	switch {
	case op.ScalarA && op.ScalarB:
		y[0] = op.Op.Apply(a[0], b[0])
	case op.ScalarA:
		s := a[0]
		chunks(len(y), func(lo, hi int) {
			for i := lo; i < hi; i++ {
				y[i] = op.Op.Apply(s, b[i])
			}
		})
	case op.ScalarB:
		s := b[0]
		chunks(len(y), func(lo, hi int) {
			for i := lo; i < hi; i++ {
				y[i] = op.Op.Apply(a[i], s)
			}
		})
	default:
		if len(a) != len(b) || len(a) != len(y) {
			return fmt.Errorf("ops: %v of %d and %d values into %d", op.Op, len(a), len(b), len(y))
		}
		binaryVV(op.Op, a, b, y)
	}
	return nil
}

// binaryVV is the elementwise operation of two equal-length vectors, with
// one loop per operation (the common ones without a per-element switch).
func binaryVV(o BinOp, a, b, y []float32) {
	chunks(len(y), func(lo, hi int) {
		a, b, y := a[lo:hi], b[lo:hi:hi], y[lo:hi:hi]
		switch o {
		case Add:
			for i := range y {
				y[i] = a[i] + b[i]
			}
		case Sub:
			for i := range y {
				y[i] = a[i] - b[i]
			}
		case Mul:
			for i := range y {
				y[i] = a[i] * b[i]
			}
		default:
			for i := range y {
				y[i] = o.Apply(a[i], b[i])
			}
		}
	})
}

// UnaryFn is an elementwise function.
type UnaryFn uint8

// The elementwise functions.
const (
	Neg UnaryFn = iota + 1
	Sigmoid
	Tanh
	Softplus
)

// String returns the function's name.
func (f UnaryFn) String() string {
	if s := [...]string{Neg: "neg", Sigmoid: "sigmoid", Tanh: "tanh", Softplus: "softplus"}; int(f) < len(s) && s[f] != "" {
		return s[f]
	}
	return fmt.Sprintf("UnaryFn(%d)", uint8(f))
}

// Apply evaluates the function at x. Sigmoid and Softplus use Gorgonia's
// float32 formulas (cut-offs included): sigmoid(x) = 0 below −88 and 1
// above 15, else 1/(1+e^−x) in float64; softplus(x) = 0 below −103 and x
// above 14, else log1p(eˣ) in float64. Tanh is math32.Tanh.
func (f UnaryFn) Apply(x float32) float32 {
	switch f {
	case Neg:
		return -x
	case Sigmoid:
		if x < -88 {
			return 0
		}
		if x > 15 {
			return 1
		}
		return float32(1.0 / (1.0 + math.Exp(float64(-x))))
	case Tanh:
		return math32.Tanh(x)
	case Softplus:
		if x < -103 {
			return 0
		}
		if x > 14 {
			return x
		}
		return float32(math.Log1p(math.Exp(float64(x))))
	}
	return float32(math.NaN())
}

// Unary applies Fn to every element.
type Unary struct{ Fn UnaryFn }

// InPlace implements InPlacer.
func (Unary) InPlace() []int { return []int{0} }

// CPU implements Kernel.
func (op Unary) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("Unary", in, 1); err != nil {
		return err
	}
	x, y := in[0].F32, out.F32
	chunks(len(y), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			y[i] = op.Fn.Apply(x[i])
		}
	})
	return nil
}

// MatMul is the matrix product op(A)·op(B) of 2-D float32 values, op
// transposing where TransA or TransB is set: A is [M K] ([K M] with
// TransA), B is [K N] ([N K] with TransB), the output [M N].
type MatMul struct{ TransA, TransB bool }

// Dims returns M, N and K for inputs of shapes a and b.
func (op MatMul) Dims(a, b []int) (m, n, k int) {
	m, k = a[0], a[1]
	if op.TransA {
		m, k = k, m
	}
	n = b[1]
	if op.TransB {
		n = b[0]
	}
	return
}

// CPU implements Kernel: one row-major GEMM with the operands' own leading
// dimensions, as Gorgonia's tensor engine calls it.
func (op MatMul) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("MatMul", in, 2); err != nil {
		return err
	}
	if len(in[0].Shape) != 2 || len(in[1].Shape) != 2 {
		return fmt.Errorf("ops: MatMul of shapes %v and %v; only matrices", in[0].Shape, in[1].Shape)
	}
	m, n, k := op.Dims(in[0].Shape, in[1].Shape)
	sgemm(op.TransA, op.TransB, m, n, k, 1, in[0].F32, in[0].Shape[1], in[1].F32, in[1].Shape[1], 0, out.F32, n)
	return nil
}

// Broadcast repeats its input, which has size 1 along Axis, to the output's
// shape (the other axes equal).
type Broadcast struct{ Axis int }

// CPU implements Kernel.
func (op Broadcast) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("Broadcast", in, 1); err != nil {
		return err
	}
	outer, n, inner := SplitAxis(out.Shape, op.Axis)
	x, y := in[0].F32, out.F32
	if len(x) != outer*inner {
		return fmt.Errorf("ops: broadcast of %v along axis %d to %v", in[0].Shape, op.Axis, out.Shape)
	}
	for o := 0; o < outer; o++ {
		src := x[o*inner : (o+1)*inner]
		for r := 0; r < n; r++ {
			copy(y[(o*n+r)*inner:], src)
		}
	}
	return nil
}

// SplitAxis returns the number of elements before, along and after axis of
// shape s.
func SplitAxis(s []int, axis int) (outer, n, inner int) {
	outer, inner = 1, 1
	for i, d := range s {
		switch {
		case i < axis:
			outer *= d
		case i == axis:
			n = d
		default:
			inner *= d
		}
	}
	return
}

// Sum adds its input along Axes (ascending). As Gorgonia's tensor engine
// does, all axes at once add the elements in memory order starting from
// zero; otherwise the axes are reduced one at a time, the first axis by
// adding its slices in order to a copy of slice 0, the last axis by adding
// each row's elements in order starting from zero. Other axes are not
// supported. The output keeps no reduced axis (a scalar for all axes).
type Sum struct{ Axes []int }

// Workspace implements Scratcher: the intermediate of a two-step reduction.
func (op Sum) Workspace(in [][]int) int {
	if op.all(len(in[0])) || len(op.Axes) <= 1 {
		return 0
	}
	return Elems(in[0])
}

func (op Sum) all(dims int) bool {
	if len(op.Axes) != dims {
		return false
	}
	for i, a := range op.Axes {
		if a != i {
			return false
		}
	}
	return true
}

// Check returns an error unless the engine can reduce input shape s along
// op.Axes.
func (op Sum) Check(s []int) error {
	if op.all(len(s)) {
		return nil
	}
	dims := len(s)
	for i, a := range op.Axes {
		a -= i
		if a != 0 && a != dims-1 {
			return fmt.Errorf("ops: Sum of %v along %v reduces a middle axis; only the first, the last or all axes are supported", s, op.Axes)
		}
		dims--
	}
	return nil
}

// CPU implements Kernel.
func (op Sum) CPU(in []Arg, out Arg, ws []float32) error {
	if err := checkArgs("Sum", in, 1); err != nil {
		return err
	}
	x, s := in[0].F32, in[0].Shape
	if err := op.Check(s); err != nil {
		return err
	}
	if op.all(len(s)) {
		var t float32
		for _, v := range x {
			t += v
		}
		out.F32[0] = t
		return nil
	}
	shape := append([]int(nil), s...)
	src := x
	for i, a := range op.Axes {
		a -= i
		dst := out.F32
		if i < len(op.Axes)-1 {
			dst = ws[:len(src)/shape[a]]
		}
		if a == 0 && len(shape) > 1 {
			split := len(src) / shape[0]
			copy(dst[:split], src[:split])
			for r := 1; r < shape[0]; r++ {
				row := src[r*split : (r+1)*split]
				for j, v := range row {
					dst[j] += v
				}
			}
		} else {
			d := shape[a]
			for r := 0; r < len(src)/d; r++ {
				var t float32
				for _, v := range src[r*d : (r+1)*d] {
					t += v
				}
				dst[r] = t
			}
		}
		shape = append(shape[:a], shape[a+1:]...)
		src = dst
	}
	return nil
}

// Slice copies elements [Start, End) along Axis of its input (step 1).
type Slice struct{ Axis, Start, End int }

// CPU implements Kernel.
func (op Slice) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("Slice", in, 1); err != nil {
		return err
	}
	outer, n, inner := SplitAxis(in[0].Shape, op.Axis)
	if op.Start < 0 || op.End > n || op.Start > op.End {
		return fmt.Errorf("ops: slice [%d:%d] of axis %d of %v", op.Start, op.End, op.Axis, in[0].Shape)
	}
	w := (op.End - op.Start) * inner
	x, y := in[0].F32, out.F32
	for o := 0; o < outer; o++ {
		copy(y[o*w:(o+1)*w], x[(o*n+op.Start)*inner:])
	}
	return nil
}

// SliceIncr is the gradient of Slice: input g; the output has the sliced
// value's shape, zero except g in elements [Start, End) along Axis
// (Gorgonia adds g to a fresh zero tensor; 0 + g = g exactly).
type SliceIncr struct{ Axis, Start, End int }

// CPU implements Kernel.
func (op SliceIncr) CPU(in []Arg, out Arg, _ []float32) error {
	if len(in) != 1 {
		return fmt.Errorf("ops: SliceIncr takes 1 input, got %d", len(in))
	}
	outer, n, inner := SplitAxis(out.Shape, op.Axis)
	w := (op.End - op.Start) * inner
	g, y := in[0].F32, out.F32
	if len(g) != outer*w {
		return fmt.Errorf("ops: SliceIncr of %d values into [%d:%d] of axis %d of %v", len(g), op.Start, op.End, op.Axis, out.Shape)
	}
	for o := 0; o < outer; o++ {
		base := o * n * inner
		clear(y[base : base+op.Start*inner])
		copy(y[base+op.Start*inner:], g[o*w:(o+1)*w])
		clear(y[base+op.End*inner : base+n*inner])
	}
	return nil
}

// Concat joins its inputs along Axis.
type Concat struct{ Axis int }

// CPU implements Kernel.
func (op Concat) CPU(in []Arg, out Arg, _ []float32) error {
	outer, _, _ := SplitAxis(out.Shape, op.Axis)
	y, at := out.F32, 0
	for o := 0; o < outer; o++ {
		for _, a := range in {
			w := len(a.F32) / outer
			copy(y[at:at+w], a.F32[o*w:(o+1)*w])
			at += w
		}
	}
	if at != len(y) {
		return fmt.Errorf("ops: concat of %d inputs along axis %d fills %d of %d values", len(in), op.Axis, at, len(y))
	}
	return nil
}

// Gather selects rows: inputs x [R D…] and indices [n] (int64), output
// [n D…] with row i = x[indices[i]] (an embedding lookup).
type Gather struct{}

// CPU implements Kernel.
func (Gather) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("Gather", in, 2); err != nil {
		return err
	}
	x, idx := in[0], in[1].I64
	rows := x.Shape[0]
	d := len(x.F32) / max(rows, 1)
	for i, r := range idx {
		if r < 0 || r >= int64(rows) {
			return fmt.Errorf("ops: gather index %d = %d is outside [0, %d)", i, r, rows)
		}
		copy(out.F32[i*d:(i+1)*d], x.F32[int(r)*d:])
	}
	return nil
}

// GatherGrad is the gradient of Gather: inputs g [n D…] and indices; the
// output has the gathered value's shape [R D…], zero except that row
// indices[i] accumulates g's row i, in order of i.
type GatherGrad struct{}

// CPU implements Kernel.
func (GatherGrad) CPU(in []Arg, out Arg, _ []float32) error {
	if len(in) != 2 {
		return fmt.Errorf("ops: GatherGrad takes 2 inputs, got %d", len(in))
	}
	g, idx, y := in[0].F32, in[1].I64, out.F32
	rows := out.Shape[0]
	d := len(y) / max(rows, 1)
	clear(y)
	for i, r := range idx {
		if r < 0 || r >= int64(rows) {
			return fmt.Errorf("ops: gather gradient index %d = %d is outside [0, %d)", i, r, rows)
		}
		dst, src := y[int(r)*d:int(r+1)*d], g[i*d:(i+1)*d]
		for j, v := range src {
			dst[j] += v
		}
	}
	return nil
}

// Copy copies its input (an executor's move of a value into a bound
// output).
type Copy struct{}

// CPU implements Kernel.
func (Copy) CPU(in []Arg, out Arg, _ []float32) error {
	if len(in) != 1 {
		return fmt.Errorf("ops: Copy takes 1 input, got %d", len(in))
	}
	switch {
	case out.F32 != nil:
		copy(out.F32, in[0].F32)
	case out.F64 != nil:
		copy(out.F64, in[0].F64)
	case out.I64 != nil:
		copy(out.I64, in[0].I64)
	}
	return nil
}

// Const fills its output with Value (Gorgonia's constants and the sizes
// SizeOf reports).
type Const struct{ Value float32 }

// CPU implements Kernel.
func (op Const) CPU(_ []Arg, out Arg, _ []float32) error {
	for i := range out.F32 {
		out.F32[i] = op.Value
	}
	return nil
}
