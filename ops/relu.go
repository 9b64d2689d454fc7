package ops

import (
	"fmt"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// AddReLU is y = max(a+b, 0) elementwise (a residual block's output); its
// gradient with respect to both inputs is ReLUGrad(y, dy). Gorgonia's ReLU
// is a comparison and a multiplication, each a full pass with a fresh
// output; this is one pass.
type AddReLU struct{}

// ReLUGrad is dx = dy where y > 0, else 0, for inputs (y, dy).
type ReLUGrad struct{}

// AddRelu returns max(a+b, 0).
func AddRelu(a, b *G.Node) (*G.Node, error) {
	if !a.Shape().Eq(b.Shape()) {
		return nil, fmt.Errorf("ops: AddReLU of shapes %v and %v", a.Shape(), b.Shape())
	}
	return applyDiff(AddReLU{}, a, b)
}

func sameAs(name string, s []tensor.Shape) (tensor.Shape, error) {
	if !s[0].Eq(s[1]) {
		return nil, fmt.Errorf("ops: %s of shapes %v and %v", name, s[0], s[1])
	}
	return s[0].Clone(), nil
}

// Type implements descriptor.
func (AddReLU) Type() hm.Type { a := hm.TypeVariable('a'); return hm.NewFnType(a, a, a) }

// shape implements descriptor.
func (AddReLU) shape(s []tensor.Shape) (tensor.Shape, error) { return sameAs("AddReLU", s) }

func (AddReLU) String() string { return "AddReLU" }

// DiffWRT implements differentiable.
func (AddReLU) DiffWRT(int) []bool { return []bool{true, true} }

// SymDiff implements differentiable.
func (AddReLU) SymDiff(_ G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	d, err := apply(ReLUGrad{}, output, grad)
	return G.Nodes{d, d}, err
}

// InPlace implements InPlacer.
func (AddReLU) InPlace() []int { return []int{0, 1} }

// CPU implements Kernel.
func (AddReLU) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("AddReLU", in, 2); err != nil {
		return err
	}
	a, b, y := in[0].F32, in[1].F32, out.F32
	chunks(len(a), func(lo, hi int) {
		bb := b[lo:hi]
		for i, v := range a[lo:hi] {
			y[lo+i] = max(v+bb[i], 0)
		}
	})
	return nil
}

// Type implements descriptor.
func (ReLUGrad) Type() hm.Type { a := hm.TypeVariable('a'); return hm.NewFnType(a, a, a) }

// shape implements descriptor.
func (ReLUGrad) shape(s []tensor.Shape) (tensor.Shape, error) { return sameAs("ReLUGrad", s) }

func (ReLUGrad) String() string { return "ReLUGrad" }

// InPlace implements InPlacer.
func (ReLUGrad) InPlace() []int { return []int{0, 1} }

// CPU implements Kernel.
func (ReLUGrad) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("ReLUGrad", in, 2); err != nil {
		return err
	}
	y, dy, dx := in[0].F32, in[1].F32, out.F32
	chunks(len(y), func(lo, hi int) {
		for i, v := range y[lo:hi] {
			if v > 0 {
				dx[lo+i] = dy[lo+i]
			} else {
				dx[lo+i] = 0
			}
		}
	})
	return nil
}
