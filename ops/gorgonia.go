package ops

import (
	"fmt"
	"hash"
	"hash/fnv"
	"strings"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// descriptor is what each of the package's own ops declares for Gorgonia;
// graphOp adds what is the same for all of them.
type descriptor interface {
	Kernel
	// Type is the op's Gorgonia type: a function of its inputs, in order.
	Type() hm.Type
	// shape is the output's shape for inputs of shapes in (as many as
	// Type has).
	shape(in []tensor.Shape) (tensor.Shape, error)
	String() string
}

// differentiable is a descriptor that Gorgonia's symbolic Grad
// differentiates (gorgonia.SDOp).
type differentiable interface {
	descriptor
	DiffWRT(inputs int) []bool
	SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error)
}

// graphOp is the descriptor k as a node's op in a Gorgonia graph: a
// gorgonia.Op that hashes k's type and fields and whose Do runs k's CPU
// kernel. Outputs are fresh values, no op calls external code or
// overwrites an input as Gorgonia understands it (BatchNormStats' update
// of the running statistics is a side effect on bound values, see
// Mutator). The gradient ops (Conv2dGradInput, BatchNormGradSums,
// ReLUGrad, …) are graphOps alone: they only appear in backward passes,
// which nothing differentiates again; the others are diffOps.
type graphOp[K descriptor] struct{ k K }

// diffOp is a graphOp that is also a gorgonia.SDOp.
type diffOp[K differentiable] struct{ graphOp[K] }

// apply and applyDiff add the node of k applied to args to their graph.
func apply[K descriptor](k K, args ...*G.Node) (*G.Node, error) {
	return G.ApplyOp(graphOp[K]{k}, args...)
}

func applyDiff[K differentiable](k K, args ...*G.Node) (*G.Node, error) {
	return G.ApplyOp(diffOp[K]{graphOp[K]{k}}, args...)
}

// Descriptor is the op's descriptor: package engine translates a graph's
// nodes into descriptors.
func (o graphOp[K]) Descriptor() Kernel { return o.k }

// Arity implements gorgonia.Op: the number of inputs of k's Type.
func (o graphOp[K]) Arity() int { return len(o.k.Type().(*hm.FunctionType).FlatTypes()) - 1 }

// Type implements gorgonia.Op.
func (o graphOp[K]) Type() hm.Type { return o.k.Type() }

// InferShape implements gorgonia.Op: k's shape of the inputs' shapes.
func (o graphOp[K]) InferShape(ds ...G.DimSizer) (tensor.Shape, error) {
	name, n := strings.TrimPrefix(fmt.Sprintf("%T", o.k), "ops."), o.Arity()
	if len(ds) != n {
		return nil, fmt.Errorf("ops: %s takes %d inputs, got %d shapes", name, n, len(ds))
	}
	in := make([]tensor.Shape, n)
	for i, d := range ds {
		s, ok := d.(tensor.Shape)
		if !ok {
			return nil, fmt.Errorf("ops: %s input %d has no shape (%v)", name, i, d)
		}
		in[i] = s
	}
	return o.k.shape(in)
}

// Do implements gorgonia.Op with the CPU kernel.
func (o graphOp[K]) Do(vals ...G.Value) (G.Value, error) { return doCPU(o, vals) }

// ReturnsPtr implements gorgonia.Op.
func (graphOp[K]) ReturnsPtr() bool { return false }

// CallsExtern implements gorgonia.Op.
func (graphOp[K]) CallsExtern() bool { return false }

// OverwritesInput implements gorgonia.Op.
func (graphOp[K]) OverwritesInput() int { return -1 }

// WriteHash implements gorgonia.Op.
func (o graphOp[K]) WriteHash(h hash.Hash) { fmt.Fprint(h, describe(o.k)) }

// Hashcode implements gorgonia.Op.
func (o graphOp[K]) Hashcode() uint32 {
	h := fnv.New32a()
	h.Write([]byte(describe(o.k)))
	return h.Sum32()
}

func (o graphOp[K]) String() string { return o.k.String() }

// DiffWRT implements gorgonia.SDOp.
func (o diffOp[K]) DiffWRT(inputs int) []bool { return o.k.DiffWRT(inputs) }

// SymDiff implements gorgonia.SDOp.
func (o diffOp[K]) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	return o.k.SymDiff(inputs, output, grad)
}

// describe is the text every op hashes: its type and all its fields, so two
// ops hash alike exactly when they are the same descriptor.
func describe(op any) string { return fmt.Sprintf("%T%+v", op, op) }

func tensorType(dims int) hm.Type {
	if dims == 0 {
		return hm.TypeVariable('a')
	}
	return G.TensorType{Dims: dims, Of: hm.TypeVariable('a')}
}

func typedTensor(dims int, dt tensor.Dtype) hm.Type {
	if dims == 0 {
		return dt
	}
	return G.TensorType{Dims: dims, Of: dt}
}

// doCPU runs k's CPU kernel on Gorgonia values (the ops' Do): it converts
// the inputs to Args (views are materialised, Go ints become int64),
// allocates the output and scratch, and wraps the result as a Gorgonia
// value. Inputs that the op mutates must be plain dense tensors, which
// Args alias.
func doCPU[K descriptor](o graphOp[K], vals []G.Value) (G.Value, error) {
	k := o.k
	args := make([]Arg, len(vals))
	ds := make([]G.DimSizer, len(vals))
	for i, v := range vals {
		a, err := argOf(v)
		if err != nil {
			return nil, fmt.Errorf("ops: %v input %d: %w", k, i, err)
		}
		args[i] = a
		ds[i] = tensor.Shape(a.Shape)
	}
	shape, err := o.InferShape(ds...)
	if err != nil {
		return nil, err
	}
	out := Arg{Shape: []int(shape)}
	n := shape.TotalSize()
	switch OutTypeOf(k) {
	case Float32:
		out.F32 = make([]float32, n)
	case Float64:
		out.F64 = make([]float64, n)
	default:
		return nil, fmt.Errorf("ops: %v has output type %v, which Do cannot produce", k, OutTypeOf(k))
	}
	shapes := make([][]int, len(args))
	for i, a := range args {
		shapes[i] = a.Shape
	}
	ws := make([]float32, WorkspaceOf(k, shapes))
	if err := k.CPU(args, out, ws); err != nil {
		return nil, err
	}
	if shape.IsScalar() {
		if out.F32 != nil {
			return G.NewF32(out.F32[0]), nil
		}
		return G.NewF64(out.F64[0]), nil
	}
	if out.F32 != nil {
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(out.F32)), nil
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(out.F64)), nil
}

// argOf views a Gorgonia value as a kernel argument.
func argOf(v G.Value) (Arg, error) {
	switch t := v.(type) {
	case *G.F32:
		return Arg{F32: []float32{float32(*t)}}, nil
	case *G.F64:
		return Arg{F64: []float64{float64(*t)}}, nil
	case *tensor.Dense:
		if t.IsMaterializable() {
			t = t.Materialize().(*tensor.Dense)
		}
		a := Arg{Shape: []int(t.Shape().Clone())}
		if t.Shape().IsScalar() {
			a.Shape = nil
		}
		switch d := t.Data().(type) {
		case []float32:
			a.F32 = d
		case float32:
			a.F32 = []float32{d}
		case []float64:
			a.F64 = d
		case float64:
			a.F64 = []float64{d}
		case []int:
			a.I64 = make([]int64, len(d))
			for i, x := range d {
				a.I64[i] = int64(x)
			}
		default:
			return Arg{}, fmt.Errorf("unsupported element type %T", d)
		}
		return a, nil
	}
	return Arg{}, fmt.Errorf("unsupported value type %T", v)
}
