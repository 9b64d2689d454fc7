package ops

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/sparsegrad/sparsegrad/device"
)

// Arg is one tensor argument of a CPU kernel: its data in host memory (the
// slice of its element type; the others are nil) and its shape (empty for a
// scalar).
type Arg struct {
	F32   []float32
	F64   []float64
	I64   []int64
	Shape []int
}

// Size is the number of elements of the argument's shape.
func (a Arg) Size() int { return Elems(a.Shape) }

// DType is the element type of an op's output (or input): the project's
// one element type, device.DType. Op values are Float32, Float64 or Int64.
type DType = device.DType

// The element types of op values.
const (
	Float32 = device.Float32
	Float64 = device.Float64
	Int64   = device.Int64
)

// Kernel is implemented by every descriptor of the package. A kernel
// that needs scratch memory is also a Scratcher, one whose output is not
// float32 a Typed.
type Kernel interface {
	// CPU computes the output from the inputs into out, whose memory and
	// shape the caller provides (its contents on entry are undefined). ws
	// holds at least WorkspaceOf(input shapes) float32s of scratch.
	CPU(in []Arg, out Arg, ws []float32) error
}

// Scratcher is implemented by the kernels whose CPU needs scratch memory.
type Scratcher interface {
	// Workspace is the number of float32s of scratch CPU needs for inputs
	// of the given shapes.
	Workspace(in [][]int) int
}

// Typed is implemented by the kernels whose output is not float32.
type Typed interface {
	// OutType is the output's element type.
	OutType() DType
}

// WorkspaceOf is the number of float32s of scratch k's CPU needs for
// inputs of the given shapes: none unless k is a Scratcher.
func WorkspaceOf(k Kernel, in [][]int) int {
	if s, ok := k.(Scratcher); ok {
		return s.Workspace(in)
	}
	return 0
}

// OutTypeOf is the element type of k's output: Float32 unless k is a Typed.
func OutTypeOf(k Kernel) DType {
	if t, ok := k.(Typed); ok {
		return t.OutType()
	}
	return Float32
}

// InPlacer is implemented by ops whose output may share the storage of
// some of their inputs: each output element is computed from input elements
// at the same position (and from values fixed before the loop), so
// overwriting an input while computing is harmless. An executor may let the
// output overwrite such an input when nothing reads the input afterwards.
type InPlacer interface {
	InPlace() []int
}

// Mutator is implemented by ops that also write some of their inputs (the
// running statistics BatchNormStats updates). An executor must not let such
// an input share storage with anything else that is live.
type Mutator interface {
	Mutates() []int
}

// Elems is the number of elements of a tensor of shape s (1 for a scalar).
func Elems(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// checkArgs verifies the number of inputs and that every float32 input holds
// as many values as its shape says.
func checkArgs(name string, in []Arg, n int) error {
	if len(in) != n {
		return fmt.Errorf("ops: %s takes %d inputs, got %d", name, n, len(in))
	}
	for i, a := range in {
		l := len(a.F32) + len(a.F64) + len(a.I64)
		if l != a.Size() {
			return fmt.Errorf("ops: %s input %d holds %d values for shape %v", name, i, l, a.Shape)
		}
	}
	return nil
}

// workers is the number of goroutines used for n independent pieces.
func workers(n int) int {
	return max(1, min(runtime.GOMAXPROCS(0), n))
}

// parallelFor runs f(0..n-1) on workers(n) goroutines (strided). Each f(i)
// must touch only its own part of the output, so results do not depend on
// the number of goroutines.
func parallelFor(n int, f func(i int)) {
	nw := workers(n)
	if nw == 1 {
		for i := 0; i < n; i++ {
			f(i)
		}
		return
	}
	var wg sync.WaitGroup
	for wk := 0; wk < nw; wk++ {
		wg.Add(1)
		go func(wk int) {
			defer wg.Done()
			for i := wk; i < n; i += nw {
				f(i)
			}
		}(wk)
	}
	wg.Wait()
}

// chunks splits n elements into parallel pieces of at least 32 Ki.
func chunks(n int, f func(lo, hi int)) {
	const minChunk = 32 << 10
	parts := workers((n + minChunk - 1) / minChunk)
	step := (n + parts - 1) / max(parts, 1)
	if parts <= 1 {
		f(0, n)
		return
	}
	parallelFor(parts, func(p int) {
		lo, hi := p*step, min(n, (p+1)*step)
		if lo < hi {
			f(lo, hi)
		}
	})
}
