package models

import (
	"fmt"
	"hash"
	"math"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Fused spatial BatchNorm (normalisation + affine γ, β, optionally followed
// by ReLU) and the residual add+ReLU, as custom Gorgonia ops. Gorgonia's
// BatchNorm normalises in one op and then applies γ and β with
// broadcasting ops that materialise repeated copies of γ and β and clone
// their inputs; its ReLU is a comparison plus a multiplication. Together
// those were about a quarter of a ResNet-18 step on the CPU
// (docs/bench/models.md). These ops do each in one parallel pass over
// channels (BatchNorm) or elements (add+ReLU). Their results are checked
// against a float64 reference and by finite differences in resnet_test.go.

// bnState is one BatchNorm layer's state, shared by its forward op and its
// gradient ops. runMean and runVar alias the model's buffer store.
type bnState struct {
	eps, momentum float64
	training      bool
	relu          bool // apply ReLU to the output (BN followed by ReLU)
	runMean       []float32
	runVar        []float32
	mean, invstd  []float32 // batch statistics of the last training forward
}

type bnOp struct{ s *bnState }

// bnGradOp computes one of the gradients of bnOp: which = 0 (input),
// 1 (γ) or 2 (β), from the inputs (x, γ, dy).
type bnGradOp struct {
	s     *bnState
	which int
	shape tensor.Shape
}

func t1() G.TensorType { return G.TensorType{Dims: 1, Of: hm.TypeVariable('a')} }

// batchNorm applies BatchNorm with γ, β ([C] parameter nodes) to x [B C H W].
func batchNorm(x, gamma, beta *G.Node, s *bnState) (*G.Node, error) {
	c := x.Shape()[1]
	if gamma.Shape().TotalSize() != c || beta.Shape().TotalSize() != c || len(s.runMean) != c || len(s.runVar) != c {
		return nil, fmt.Errorf("models: batchNorm over %d channels got γ %v, β %v and %d/%d running statistics", c, gamma.Shape(), beta.Shape(), len(s.runMean), len(s.runVar))
	}
	s.mean, s.invstd = make([]float32, c), make([]float32, c)
	return G.ApplyOp(bnOp{s}, x, gamma, beta)
}

// Arity implements gorgonia.Op.
func (op bnOp) Arity() int { return 3 }

// Type implements gorgonia.Op.
func (op bnOp) Type() hm.Type { return hm.NewFnType(t4(), t1(), t1(), t4()) }

// InferShape implements gorgonia.Op.
func (op bnOp) InferShape(ds ...G.DimSizer) (tensor.Shape, error) {
	s, ok := ds[0].(tensor.Shape)
	if !ok {
		return nil, fmt.Errorf("batchNorm: bad input shape %v", ds[0])
	}
	return s.Clone(), nil
}

// ReturnsPtr implements gorgonia.Op.
func (op bnOp) ReturnsPtr() bool { return false }

// CallsExtern implements gorgonia.Op.
func (op bnOp) CallsExtern() bool { return false }

// OverwritesInput implements gorgonia.Op.
func (op bnOp) OverwritesInput() int { return -1 }

// WriteHash implements gorgonia.Op.
func (op bnOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }

// Hashcode implements gorgonia.Op.
func (op bnOp) Hashcode() uint32 { return opHash(op.String()) }

func (op bnOp) String() string { return fmt.Sprintf("BatchNorm{%p,train=%v}", op.s, op.s.training) }

// DiffWRT implements gorgonia.SDOp.
func (op bnOp) DiffWRT(int) []bool { return []bool{true, true, true} }

// SymDiff implements gorgonia.SDOp.
func (op bnOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	x, gamma := inputs[0], inputs[1]
	out := make(G.Nodes, 3)
	args := G.Nodes{x, gamma, grad}
	if op.s.relu {
		args = append(args, output) // the ReLU mask
	}
	for i := range out {
		shape := x.Shape().Clone()
		if i > 0 {
			shape = inputs[i].Shape().Clone()
		}
		n, err := G.ApplyOp(bnGradOp{s: op.s, which: i, shape: shape}, args...)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

// DoDiff is not supported (the tape machine uses SymDiff).
func (op bnOp) DoDiff(G.ExecutionContext, G.Nodes, *G.Node) error {
	return fmt.Errorf("models: batchNorm supports symbolic differentiation only")
}

// Do implements gorgonia.Op.
func (op bnOp) Do(vals ...G.Value) (G.Value, error) {
	x, xs, err := f32s(vals[0])
	if err != nil {
		return nil, err
	}
	gamma, _, err := f32s(vals[1])
	if err != nil {
		return nil, err
	}
	beta, _, err := f32s(vals[2])
	if err != nil {
		return nil, err
	}
	B, C := xs[0], xs[1]
	HW := len(x) / (B * C)
	n := float64(B * HW)
	s := op.s
	y := make([]float32, len(x))
	parallelFor(C, func(c int) {
		var mean, invstd float64
		if s.training {
			var sum float64
			for b := 0; b < B; b++ {
				for _, v := range x[(b*C+c)*HW : (b*C+c+1)*HW] {
					sum += float64(v)
				}
			}
			mean = sum / n
			var ss float64
			for b := 0; b < B; b++ {
				for _, v := range x[(b*C+c)*HW : (b*C+c+1)*HW] {
					d := float64(v) - mean
					ss += d * d
				}
			}
			variance := ss / n
			invstd = 1 / math.Sqrt(variance+s.eps)
			s.mean[c], s.invstd[c] = float32(mean), float32(invstd)
			m := s.momentum
			s.runMean[c] = float32((1-m)*float64(s.runMean[c]) + m*mean)
			s.runVar[c] = float32((1-m)*float64(s.runVar[c]) + m*ss/(n-1))
		} else {
			mean = float64(s.runMean[c])
			invstd = 1 / math.Sqrt(float64(s.runVar[c])+s.eps)
		}
		scale := float32(float64(gamma[c]) * invstd)
		shift := beta[c] - float32(mean)*scale
		for b := 0; b < B; b++ {
			src := x[(b*C+c)*HW : (b*C+c+1)*HW]
			dst := y[(b*C+c)*HW : (b*C+c+1)*HW]
			if s.relu {
				for i, v := range src {
					dst[i] = max(v*scale+shift, 0)
				}
				continue
			}
			for i, v := range src {
				dst[i] = v*scale + shift
			}
		}
	})
	return tensor.New(tensor.WithShape(xs...), tensor.WithBacking(y)), nil
}

// Arity implements gorgonia.Op: (x, γ, dy), plus the forward output y
// when the layer applies ReLU.
func (op bnGradOp) Arity() int {
	if op.s.relu {
		return 4
	}
	return 3
}

// Type implements gorgonia.Op.
func (op bnGradOp) Type() hm.Type {
	ret := hm.Type(t1())
	if op.which == 0 {
		ret = t4()
	}
	if op.s.relu {
		return hm.NewFnType(t4(), t1(), t4(), t4(), ret)
	}
	return hm.NewFnType(t4(), t1(), t4(), ret)
}

// InferShape implements gorgonia.Op.
func (op bnGradOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.shape.Clone(), nil }

// ReturnsPtr implements gorgonia.Op.
func (op bnGradOp) ReturnsPtr() bool { return false }

// CallsExtern implements gorgonia.Op.
func (op bnGradOp) CallsExtern() bool { return false }

// OverwritesInput implements gorgonia.Op.
func (op bnGradOp) OverwritesInput() int { return -1 }

// WriteHash implements gorgonia.Op.
func (op bnGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }

// Hashcode implements gorgonia.Op.
func (op bnGradOp) Hashcode() uint32 { return opHash(op.String()) }

func (op bnGradOp) String() string { return fmt.Sprintf("BatchNormGrad{%p,%d}", op.s, op.which) }

// DiffWRT implements gorgonia.SDOp (no second derivatives).
func (op bnGradOp) DiffWRT(int) []bool { return []bool{false, false, false} }

// SymDiff implements gorgonia.SDOp.
func (op bnGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("models: no second derivative of batchNorm")
}

// Do implements gorgonia.Op. With x̂ = (x−μ)·invstd and sums over the
// batch and spatial positions of a channel: dβ = Σdy, dγ = Σdy·x̂,
// dx = γ·invstd·(dy − Σdy/n − x̂·Σdy·x̂/n) in training mode
// (γ·invstd·dy in evaluation mode).
func (op bnGradOp) Do(vals ...G.Value) (G.Value, error) {
	x, xs, err := f32s(vals[0])
	if err != nil {
		return nil, err
	}
	gamma, _, err := f32s(vals[1])
	if err != nil {
		return nil, err
	}
	dy, _, err := f32s(vals[2])
	if err != nil {
		return nil, err
	}
	s := op.s
	var y []float32 // forward output when ReLU is fused: dy counts only where y > 0
	if s.relu {
		if y, _, err = f32s(vals[3]); err != nil {
			return nil, err
		}
	}
	B, C := xs[0], xs[1]
	HW := len(x) / (B * C)
	n := float64(B * HW)
	out := make([]float32, op.shape.TotalSize())
	parallelFor(C, func(c int) {
		mean, invstd := s.mean[c], s.invstd[c]
		if !s.training {
			mean = s.runMean[c]
			invstd = float32(1 / math.Sqrt(float64(s.runVar[c])+s.eps))
		}
		k := gamma[c] * invstd
		if op.which == 0 && !s.training {
			for b := 0; b < B; b++ {
				o := (b*C + c) * HW
				for i, g := range dy[o : o+HW] {
					if y != nil && y[o+i] <= 0 {
						g = 0
					}
					out[o+i] = g * k
				}
			}
			return
		}
		var sdy, sdyx float64
		for b := 0; b < B; b++ {
			o := (b*C + c) * HW
			xr := x[o : o+HW]
			for i, g := range dy[o : o+HW] {
				if y != nil && y[o+i] <= 0 {
					continue
				}
				sdy += float64(g)
				sdyx += float64(g) * float64((xr[i]-mean)*invstd)
			}
		}
		switch op.which {
		case 1:
			out[c] = float32(sdyx)
		case 2:
			out[c] = float32(sdy)
		default:
			mdy, mdyx := float32(sdy/n), float32(sdyx/n)
			for b := 0; b < B; b++ {
				o := (b*C + c) * HW
				xr := x[o : o+HW]
				for i, g := range dy[o : o+HW] {
					if y != nil && y[o+i] <= 0 {
						g = 0
					}
					xh := (xr[i] - mean) * invstd
					out[o+i] = k * (g - mdy - xh*mdyx)
				}
			}
		}
	})
	return tensor.New(tensor.WithShape(op.shape...), tensor.WithBacking(out)), nil
}

// reluOp holds the boilerplate shared by the elementwise ops below
// (addReluOp embeds it); reluGradOp(y, dy) is dy where y > 0, else 0.
type reluOp struct{}
type reluGradOp struct{}

// InferShape implements gorgonia.Op.
func (reluOp) InferShape(ds ...G.DimSizer) (tensor.Shape, error) {
	s, ok := ds[0].(tensor.Shape)
	if !ok {
		return nil, fmt.Errorf("relu: bad input shape %v", ds[0])
	}
	return s.Clone(), nil
}

// ReturnsPtr implements gorgonia.Op.
func (reluOp) ReturnsPtr() bool { return false }

// CallsExtern implements gorgonia.Op.
func (reluOp) CallsExtern() bool { return false }

// OverwritesInput implements gorgonia.Op.
func (reluOp) OverwritesInput() int { return -1 }

// chunks splits n elements into parallel pieces of at least 32 Ki.
func chunks(n int, f func(lo, hi int)) {
	const minChunk = 32 << 10
	parts := workers((n + minChunk - 1) / minChunk)
	step := (n + parts - 1) / parts
	parallelFor(parts, func(p int) {
		lo, hi := p*step, min(n, (p+1)*step)
		if lo < hi {
			f(lo, hi)
		}
	})
}

// Arity implements gorgonia.Op.
func (reluGradOp) Arity() int { return 2 }

// Type implements gorgonia.Op.
func (reluGradOp) Type() hm.Type { a := hm.TypeVariable('a'); return hm.NewFnType(a, a, a) }

// InferShape implements gorgonia.Op.
func (reluGradOp) InferShape(ds ...G.DimSizer) (tensor.Shape, error) {
	return reluOp{}.InferShape(ds...)
}

// ReturnsPtr implements gorgonia.Op.
func (reluGradOp) ReturnsPtr() bool { return false }

// CallsExtern implements gorgonia.Op.
func (reluGradOp) CallsExtern() bool { return false }

// OverwritesInput implements gorgonia.Op.
func (reluGradOp) OverwritesInput() int { return -1 }

// WriteHash implements gorgonia.Op.
func (reluGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "ReLUGrad") }

// Hashcode implements gorgonia.Op.
func (reluGradOp) Hashcode() uint32 { return opHash("ReLUGrad") }

func (reluGradOp) String() string { return "ReLUGrad" }

// DiffWRT implements gorgonia.SDOp (no second derivatives).
func (reluGradOp) DiffWRT(int) []bool { return []bool{false, false} }

// SymDiff implements gorgonia.SDOp.
func (reluGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("models: no second derivative of relu")
}

// Do implements gorgonia.Op.
func (reluGradOp) Do(vals ...G.Value) (G.Value, error) {
	y, ys, err := f32s(vals[0])
	if err != nil {
		return nil, err
	}
	dy, _, err := f32s(vals[1])
	if err != nil {
		return nil, err
	}
	dx := make([]float32, len(y))
	chunks(len(y), func(lo, hi int) {
		for i, v := range y[lo:hi] {
			if v > 0 {
				dx[lo+i] = dy[lo+i]
			}
		}
	})
	return tensor.New(tensor.WithShape(ys...), tensor.WithBacking(dx)), nil
}

// addReluOp is max(a+b, 0) (a residual block's output); its gradient with
// respect to both inputs is reluGradOp(output, dy).
type addReluOp struct{ reluOp }

func addRelu(a, b *G.Node) (*G.Node, error) {
	if !a.Shape().Eq(b.Shape()) {
		return nil, fmt.Errorf("models: addRelu of shapes %v and %v", a.Shape(), b.Shape())
	}
	return G.ApplyOp(addReluOp{}, a, b)
}

// Arity implements gorgonia.Op.
func (addReluOp) Arity() int { return 2 }

// Type implements gorgonia.Op.
func (addReluOp) Type() hm.Type { a := hm.TypeVariable('a'); return hm.NewFnType(a, a, a) }

// WriteHash implements gorgonia.Op.
func (addReluOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "AddReLU") }

// Hashcode implements gorgonia.Op.
func (addReluOp) Hashcode() uint32 { return opHash("AddReLU") }

func (addReluOp) String() string { return "AddReLU" }

// DiffWRT implements gorgonia.SDOp.
func (addReluOp) DiffWRT(int) []bool { return []bool{true, true} }

// SymDiff implements gorgonia.SDOp.
func (addReluOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	d, err := G.ApplyOp(reluGradOp{}, output, grad)
	return G.Nodes{d, d}, err
}

// Do implements gorgonia.Op.
func (addReluOp) Do(vals ...G.Value) (G.Value, error) {
	a, as, err := f32s(vals[0])
	if err != nil {
		return nil, err
	}
	b, _, err := f32s(vals[1])
	if err != nil {
		return nil, err
	}
	y := make([]float32, len(a))
	chunks(len(a), func(lo, hi int) {
		bb := b[lo:hi]
		for i, v := range a[lo:hi] {
			y[lo+i] = max(v+bb[i], 0)
		}
	})
	return tensor.New(tensor.WithShape(as...), tensor.WithBacking(y)), nil
}
