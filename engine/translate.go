package engine

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/sparsegrad/sparsegrad/ops"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// translation is what one graph node becomes.
type translation struct {
	op       ops.Kernel
	view     bool // the node views its first operand's storage at offset
	offset   int
	constant bool // op is a Const, run once
	// operands selects and orders the node's operands for op (nil: all).
	operands []int
}

func (t translation) inputs(kids []*G.Node) []*G.Node {
	if t.operands == nil {
		return kids
	}
	out := make([]*G.Node, len(t.operands))
	for i, k := range t.operands {
		out[i] = kids[k]
	}
	return out
}

// translate maps a node's op to the package ops vocabulary. The project's
// own ops carry their descriptors; Gorgonia's op types are unexported, so
// they are recognised by type name and read through reflection (the
// Gorgonia version is pinned in go.mod; the engine's tests run every
// translated op against Gorgonia's own implementation).
func translate(n *G.Node, kids []*G.Node) (translation, error) {
	op := n.Op()
	if d, ok := op.(interface{ Descriptor() ops.Kernel }); ok {
		return translation{op: d.Descriptor()}, nil
	}
	rv := reflect.ValueOf(op)
	if rv.Kind() == reflect.Pointer {
		rv = rv.Elem()
	}
	name := rv.Type().String()
	switch name {
	case "gorgonia.elemBinOp":
		return translateBinary(op, kids)
	case "gorgonia.elemUnaryOp":
		fn, ok := unaryFns[fmt.Sprint(op)]
		if !ok {
			return translation{}, fmt.Errorf("the elementwise function %q is not supported by the engine (neg, sigmoid, tanh and softplus are)", fmt.Sprint(op))
		}
		return translation{op: ops.Unary{Fn: fn}}, nil
	case "gorgonia.linAlgBinOp":
		if !strings.Contains(fmt.Sprint(op), "×") || len(kids) != 2 || kids[0].Dims() != 2 || kids[1].Dims() != 2 {
			return translation{}, fmt.Errorf("the linear-algebra op %v is not supported by the engine (matrix × matrix is)", op)
		}
		return translation{op: ops.MatMul{TransA: rv.FieldByName("transA").Bool(), TransB: rv.FieldByName("transB").Bool()}}, nil
	case "gorgonia.repeatOp":
		axis := int(rv.FieldByName("along").Int())
		in, out := kids[0].Shape(), n.Shape()
		if in.TotalSize() == out.TotalSize() {
			return translation{view: true}, nil
		}
		if len(in) != len(out) || axis >= len(in) || in[axis] != 1 {
			return translation{}, fmt.Errorf("repeating %v to %v along axis %d is not supported by the engine (only broadcasting an axis of size 1)", in, out, axis)
		}
		return translation{op: ops.Broadcast{Axis: axis}, operands: []int{0}}, nil
	case "gorgonia.sumOp":
		along := rv.FieldByName("along")
		axes := make([]int, along.Len())
		for i := range axes {
			axes[i] = int(along.Index(i).Int())
		}
		s := ops.Sum{Axes: axes}
		if err := s.Check(kids[0].Shape()); err != nil {
			return translation{}, err
		}
		return translation{op: s}, nil
	case "gorgonia.sizeOp":
		axis := int(rv.FieldByName("axis").Int())
		s := kids[0].Shape()
		if axis >= len(s) {
			return translation{}, fmt.Errorf("size of axis %d of %v", axis, s)
		}
		return translation{op: ops.Const{Value: float32(s[axis])}, constant: true}, nil
	case "gorgonia.constantScalar":
		v, err := scalarOf(n.Value())
		if err != nil {
			return translation{}, err
		}
		return translation{op: ops.Const{Value: v}, constant: true}, nil
	case "gorgonia.reshapeOp":
		return translation{view: true}, nil
	case "gorgonia.sliceOp":
		return translateSlice(rv, kids[0].Shape(), false)
	case "gorgonia.sliceIncrOp":
		return translateSlice(rv.Field(0).Elem(), kids[0].Shape(), true)
	case "gorgonia.concatOp":
		return translation{op: ops.Concat{Axis: int(rv.FieldByName("axis").Int())}}, nil
	case "gorgonia.byIndicesOp":
		if a := rv.FieldByName("axis").Int(); a != 0 {
			return translation{}, fmt.Errorf("ByIndices along axis %d is not supported by the engine (axis 0 is)", a)
		}
		return translation{op: ops.Gather{}}, nil
	case "gorgonia.byIndicesOpDiffOp":
		if a := rv.Field(0).Elem().FieldByName("axis").Int(); a != 0 {
			return translation{}, fmt.Errorf("ByIndices along axis %d is not supported by the engine (axis 0 is)", a)
		}
		return translation{op: ops.GatherGrad{}, operands: []int{1, 2}}, nil
	}
	return translation{}, fmt.Errorf("op %v (%s) is not supported by the engine", op, name)
}

func scalarOf(v G.Value) (float32, error) {
	switch t := v.(type) {
	case *G.F32:
		return float32(*t), nil
	case *G.F64:
		return float32(*t), nil
	case *tensor.Dense:
		if f, ok := t.Data().(float32); ok {
			return f, nil
		}
	}
	return 0, fmt.Errorf("constant of type %T is not supported by the engine (float32 scalars are)", v)
}

// unaryFns and binOps are the Gorgonia elementwise functions and
// operations the engine runs, by the names Gorgonia prints.
var (
	unaryFns = map[string]ops.UnaryFn{"neg": ops.Neg, "sigmoid": ops.Sigmoid, "tanh": ops.Tanh, "softplus": ops.Softplus}
	binOps   = map[string]ops.BinOp{"+": ops.Add, "-": ops.Sub, "⊙": ops.Mul, "÷": ops.Div, ">=": ops.GreaterEq, ">": ops.Greater}
)

func translateBinary(op G.Op, kids []*G.Node) (translation, error) {
	f := strings.Fields(fmt.Sprint(op))
	if len(f) != 2 {
		return translation{}, fmt.Errorf("unexpected elementwise op %q", fmt.Sprint(op))
	}
	b, ok := binOps[f[0]]
	if !ok {
		return translation{}, fmt.Errorf("the elementwise operation %q is not supported by the engine", f[0])
	}
	if (b == ops.GreaterEq || b == ops.Greater) && f[1] != "true" {
		return translation{}, fmt.Errorf("comparison %q with a boolean result is not supported by the engine (use retSame)", f[0])
	}
	a, c := kids[0].Shape(), kids[1].Shape()
	sa, sc := a.IsScalar() || (a.TotalSize() == 1 && c.TotalSize() > 1), c.IsScalar() || (c.TotalSize() == 1 && a.TotalSize() > 1)
	if !sa && !sc && a.TotalSize() != c.TotalSize() {
		return translation{}, fmt.Errorf("elementwise %s of shapes %v and %v", f[0], a, c)
	}
	return translation{op: ops.Binary{Op: b, ScalarA: sa, ScalarB: sc}}, nil
}

// translateSlice reads a Gorgonia slice op: the axis, start and end; the
// slice is a view when it is contiguous in memory.
func translateSlice(rv reflect.Value, in tensor.Shape, incr bool) (translation, error) {
	axis := int(rv.FieldByName("along").Int())
	s := rv.FieldByName("Slice")
	start, end := 0, in[axis]
	if !s.IsNil() {
		sl := s.Interface().(tensor.Slice)
		if sl.Step() > 1 {
			return translation{}, fmt.Errorf("slices with step %d are not supported by the engine", sl.Step())
		}
		start, end = sl.Start(), sl.End()
	}
	if axis >= len(in) || start < 0 || end > in[axis] || start > end {
		return translation{}, fmt.Errorf("slice [%d:%d] of axis %d of %v", start, end, axis, in)
	}
	if incr {
		return translation{op: ops.SliceIncr{Axis: axis, Start: start, End: end}, operands: []int{1}}, nil
	}
	outer, _, inner := 1, 0, 1
	for i, d := range in {
		if i < axis {
			outer *= d
		} else if i > axis {
			inner *= d
		}
	}
	if outer == 1 {
		return translation{view: true, offset: start * inner}, nil
	}
	return translation{op: ops.Slice{Axis: axis, Start: start, End: end}}, nil
}
