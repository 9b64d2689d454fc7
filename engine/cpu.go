package engine

import (
	"fmt"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/ops"
)

// CPU is the host processor's backend: every instruction runs its op's CPU
// kernel on host memory.
var CPU Backend = cpuBackend{}

type cpuBackend struct{}

func (cpuBackend) Device() device.Device { return device.CPU }

func (cpuBackend) Stream() device.Stream { return device.CPU.Stream() }

func (cpuBackend) Kernel(p *Program, in *Instr) (Kernel, error) {
	k := &cpuKernel{op: in.Op, args: make([]ops.Arg, len(in.In)), shapes: make([][]int, len(in.In))}
	for i, id := range in.In {
		k.shapes[i] = p.Values[id].Shape
	}
	k.out = p.Values[in.Out].Shape
	k.ws = 4 * in.Op.Workspace(k.shapes)
	return k, nil
}

type cpuKernel struct {
	op     ops.Kernel
	args   []ops.Arg
	shapes [][]int
	out    []int
	ws     int
}

func (k *cpuKernel) Workspace() int { return k.ws }

func (k *cpuKernel) Run(_ device.Stream, in []device.Buffer, out, ws device.Buffer) error {
	for i, b := range in {
		k.args[i] = hostArg(b, k.shapes[i])
	}
	var w []float32
	if k.ws > 0 {
		w = ws.Float32s()
	}
	return k.op.CPU(k.args, hostArg(out, k.out), w)
}

// hostArg views a host buffer as a kernel argument.
func hostArg(b device.Buffer, shape []int) ops.Arg {
	a := ops.Arg{Shape: shape}
	switch b.DType() {
	case device.Float32:
		a.F32 = b.Float32s()
	case device.Float64:
		a.F64 = b.Float64s()
	case device.Int64:
		a.I64 = b.Int64s()
	default:
		panic(fmt.Sprintf("engine: no CPU argument of type %v", b.DType()))
	}
	return a
}
