package engine

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/native/dnnl"
	"github.com/sparsegrad/sparsegrad/ops"
)

// CPU is the host processor's backend. With the im2col kernels (the
// default, and the fallback) every instruction runs its op's CPU kernel,
// the numerical reference; with oneDNN (ConfigureCPU) convolutions and
// batch normalisation run through oneDNN, on memory formats the backend
// chooses for the whole program (Prepare), and every other op runs its
// reference kernel.
var CPU Backend = cpuBackend{}

// The CPU kernel sets ConfigureCPU accepts.
const (
	KernelsAuto   = "auto"   // oneDNN when installed, im2col otherwise
	KernelsOneDNN = "onednn" // oneDNN, or an error naming the package to install
	KernelsIm2col = "im2col" // the ops' reference kernels (convolution as im2col and GEMM)
)

// ErrOneDNNNotFound is wrapped by ConfigureCPU's error when oneDNN was asked
// for and is not installed.
var ErrOneDNNNotFound = dnnl.ErrNotFound

var (
	cpuMu      sync.RWMutex
	cpuLib     *dnnl.Lib // nil: im2col
	cpuThreads = 1
)

// ConfigureCPU selects the kernels of the executors the CPU backend loads
// from now on and returns a one-line description of the choice (for logs,
// run.json and reports). mode is KernelsAuto, KernelsOneDNN or
// KernelsIm2col; in auto mode a missing oneDNN silently selects im2col.
// threads is oneDNN's thread count (0: one per core); results of oneDNN's
// batch normalisation and weight gradients depend on it, so runs that must
// agree bit for bit use the same count. It is process-wide; executors
// already loaded keep their kernels.
func ConfigureCPU(mode string, threads int) (string, error) {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	var lib *dnnl.Lib
	var why string
	switch mode {
	case KernelsIm2col:
	case KernelsAuto, KernelsOneDNN, "":
		l, err := dnnl.Load()
		if err != nil {
			if mode == KernelsOneDNN {
				return "", fmt.Errorf("engine: -kernels onednn: %w", err)
			}
			if !errors.Is(err, dnnl.ErrNotFound) {
				why = fmt.Sprintf("; oneDNN unusable: %v", err)
			} else {
				why = "; oneDNN not found"
			}
			break
		}
		if l.Version().Major == 2 && l.Version().Minor < 3 {
			err := fmt.Errorf("engine: oneDNN %s is too old (batch normalisation needs 2.3 or newer); %s", l.Version(), dnnl.Install)
			if mode == KernelsOneDNN {
				return "", err
			}
			why = "; " + err.Error()
			break
		}
		lib = l
	default:
		return "", fmt.Errorf("engine: unknown CPU kernels %q; use %q, %q or %q", mode, KernelsAuto, KernelsOneDNN, KernelsIm2col)
	}
	cpuMu.Lock()
	cpuLib, cpuThreads = lib, threads
	cpuMu.Unlock()
	if lib == nil {
		return "im2col (convolutions as im2col + GEMM" + why + ")", nil
	}
	v := lib.Version()
	return fmt.Sprintf("oneDNN %s (%s, %s runtime, %d threads, activations in %s)", v, lib.Path(), v.Runtime, threads, blockName(lib.Block())), nil
}

func blockName(b int) string {
	if b == 0 {
		return "NCHW"
	}
	return fmt.Sprintf("nChw%dc", b)
}

// CPUKernels is the kernel set executors loaded now get: KernelsOneDNN or
// KernelsIm2col.
func CPUKernels() string {
	cpuMu.RLock()
	defer cpuMu.RUnlock()
	if cpuLib != nil {
		return KernelsOneDNN
	}
	return KernelsIm2col
}

type cpuBackend struct{}

func (cpuBackend) Device() device.Device { return device.CPU }

func (cpuBackend) Stream() device.Stream { return device.CPU.Stream() }

func (cpuBackend) Kernel(p *Program, in *Instr) (Kernel, error) { return refKernel(p, in), nil }

// Prepare implements Preparer: with oneDNN configured, the program's
// kernels come from a plan of its memory formats.
func (cpuBackend) Prepare(p *Program) (Backend, error) {
	cpuMu.RLock()
	lib, threads := cpuLib, cpuThreads
	cpuMu.RUnlock()
	if lib == nil {
		return cpuBackend{}, nil
	}
	return newDNNProgram(p, lib, threads)
}

// refKernel prepares the op's reference CPU kernel.
func refKernel(p *Program, in *Instr) *cpuKernel {
	k := &cpuKernel{op: in.Op, args: make([]ops.Arg, len(in.In)), shapes: make([][]int, len(in.In))}
	for i, id := range in.In {
		k.shapes[i] = p.Values[id].Shape
	}
	k.out = p.Values[in.Out].Shape
	k.ws = 4 * ops.WorkspaceOf(in.Op, k.shapes)
	return k
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
