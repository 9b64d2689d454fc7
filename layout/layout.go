// Package layout owns the one description of a model's parameters laid out
// as a flat vector: each tensor's name, shape, size and offset, in the
// model's parameter order (Tensor), and the whole vector (Layout). Package
// models describes its parameters with it (models.ParamInfo), package
// sparsify partitions and selects by it (sparsify.Tensor, sparsify.Layout),
// package recorded stores it in a recording's manifest (recorded.Param adds
// the stored element type) and package advise models a machine's
// measurements on it, so that nothing converts one into another by hand. A
// leaf.
package layout

import "fmt"

// Tensor is one parameter tensor of a flat vector.
type Tensor struct {
	// Name is PyTorch's name of the parameter, e.g. "layer1.0.conv1.weight".
	Name string `json:"name"`
	// Shape is the tensor's shape as its model stores it; nil when unknown
	// (a layout built from names and sizes alone).
	Shape []int `json:"shape"`
	// Offset is the index of the tensor's first element in the flat vector.
	Offset int `json:"offset"`
	// Size is its number of elements.
	Size int `json:"size"`
}

// Dims is the tensor's number of dimensions (1 for a bias or a batch-norm
// parameter), 0 when its shape is unknown.
func (t Tensor) Dims() int { return len(t.Shape) }

// Layout is the ordered list of tensors that make up a flat vector, in the
// model's parameter order: each tensor's elements follow the previous
// one's. N is the total number of elements.
type Layout struct {
	Tensors []Tensor `json:"tensors"`
	N       int      `json:"n"`
}

// Of lays out the tensors ts one after another: their names, shapes and
// sizes are kept and their offsets set. Every size must be positive.
func Of(ts []Tensor) (Layout, error) {
	l := Layout{Tensors: make([]Tensor, len(ts))}
	for i, t := range ts {
		if t.Size <= 0 {
			return Layout{}, fmt.Errorf("layout: tensor %d (%q) has size %d; every tensor of a layout must have at least one element", i, t.Name, t.Size)
		}
		t.Offset = l.N
		l.Tensors[i] = t
		l.N += t.Size
	}
	return l, nil
}

// New lays out tensors of the given names and sizes (their shapes unknown)
// one after another. Every size must be positive.
func New(names []string, sizes []int) (Layout, error) {
	if len(names) != len(sizes) {
		return Layout{}, fmt.Errorf("layout: %d names but %d sizes", len(names), len(sizes))
	}
	ts := make([]Tensor, len(sizes))
	for i, s := range sizes {
		ts[i] = Tensor{Name: names[i], Size: s}
	}
	return Of(ts)
}

// Flat is a layout of one tensor named "flat" with n elements.
func Flat(n int) (Layout, error) { return New([]string{"flat"}, []int{n}) }

// Names are the tensors' names, in order.
func (l Layout) Names() []string {
	out := make([]string, len(l.Tensors))
	for i, t := range l.Tensors {
		out[i] = t.Name
	}
	return out
}

// Sizes are the tensors' sizes, in order.
func (l Layout) Sizes() []int {
	out := make([]int, len(l.Tensors))
	for i, t := range l.Tensors {
		out[i] = t.Size
	}
	return out
}
