// Package layout owns the one description of a model's parameters laid out
// as a flat vector: each tensor's name, shape, size and offset, in the
// model's parameter order. Package models describes its parameters with it
// (models.ParamInfo), package sparsify partitions and selects by it
// (sparsify.Tensor) and package recorded stores it in a recording's
// manifest (recorded.Param adds the stored element type), so that nothing
// converts one into another by hand. A leaf.
package layout

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
