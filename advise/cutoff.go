package advise

import (
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// minCompress is the option of the size cut-off every method but dense
// takes (sparsify's min_compress_size, train -min-compress-size): the
// tensors of fewer elements are all-reduced dense by the reducer's frame,
// in one all-reduce, and the method sees the layout of the others only.
const minCompress = "min_compress_size"

// cutOff returns the size cut-off of method under its resolved options
// (0: none).
func cutOff(method string, params sparsify.Values) int {
	m, ok := sparsify.Lookup(method)
	if !ok {
		return 0
	}
	if _, ok := m.Param(minCompress); !ok {
		return 0
	}
	if _, ok := params[minCompress]; !ok {
		return 0
	}
	return params.Int(minCompress)
}

// cutSizes splits sizes at the cut-off: the sizes of the tensors the
// method reduces (those of at least cut elements, in order) and the
// elements of the others, which are all-reduced dense.
func cutSizes(sizes []int, cut int) (big []int, dense int) {
	for _, s := range sizes {
		if s < cut {
			dense += s
		} else {
			big = append(big, s)
		}
	}
	return big, dense
}

// cutTensors is the tensors of ts at or above the cut-off, in order.
func cutTensors(ts []layout.Tensor, cut int) []layout.Tensor {
	var big []layout.Tensor
	for _, t := range ts {
		if t.Size >= cut {
			big = append(big, t)
		}
	}
	return big
}

// refusesCutOff says why method cannot run with the options params on the
// layout l, as its reducer says it (nil when it can): a method that
// reduces its own groups during the backward pass (sparsify.Method's
// Pipelined) takes no size cut-off that leaves a tensor below it.
func refusesCutOff(method string, l layout.Layout, params sparsify.Values) error {
	m, ok := sparsify.Lookup(method)
	if !ok || !m.Pipelined {
		return nil
	}
	cut := cutOff(method, params)
	if _, dense := cutSizes(l.Sizes(), cut); dense > 0 {
		return fmt.Errorf("advise: %s: %s=%d: %s reduces its own groups during the backward pass; its tensors cannot be cut by size (use 0)", method, minCompress, cut, method)
	}
	return nil
}

// withDense adds to the calls of the method's reducer over the tensors at
// or above the cut-off the all-reduce of the dense elements below it.
func withDense(calls []Call, dense int) []Call {
	if dense == 0 {
		return calls
	}
	return append(calls, Call{Op: comm.OpAllReduce, Count: 1, Elems: float64(dense)})
}
