package cuda

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
)

// module is a loaded kernel image of a device with its kernels looked up
// once, when it is loaded (read-only afterwards): fns[i] is the i-th of the
// names loadModule was given (for the package's module, kernelRef i).
type module struct {
	h   uintptr
	fns []uintptr
}

// loadModule loads a cubin or PTX image (the device's context current)
// and looks up the kernels called names: one that the image lacks is an
// error naming it, so a misspelt or missing kernel fails when the device
// is opened (or a method's kernel first prepared), not mid-step.
func loadModule(image []byte, names []string) (*module, error) {
	img := append(append([]byte(nil), image...), 0) // PTX must end with NUL
	m := &module{fns: make([]uintptr, len(names))}
	if err := check("cuModuleLoadData", drv.cuModuleLoadData(&m.h, unsafe.Pointer(&img[0]))); err != nil {
		return nil, fmt.Errorf("%w (the kernels compiled by NVRTC could not be loaded by the driver; is the driver older than NVRTC?)", err)
	}
	for i, name := range names {
		if err := check("cuModuleGetFunction "+name, drv.cuModuleGetFunction(&m.fns[i], m.h, cString(name))); err != nil {
			return nil, errors.Join(fmt.Errorf("cuda: the kernel %s is not in the compiled source (a kernel the Go code names must be defined there, extern \"C\" __global__): %w", name, err),
				check("cuModuleUnload", drv.cuModuleUnload(m.h)))
		}
	}
	return m, nil
}

// kernelRef is a kernel of kernels.cu that the package launches: declared
// once at package level (kernels.go, newKernelRef), looked up when a
// device loads its module, and launched by indexing the module's table —
// no name is looked up on the launch path.
type kernelRef int

// kernelNames are the names of the kernelRefs, in order.
var kernelNames []string

// newKernelRef registers the kernel called name (package initialisation
// only).
func newKernelRef(name string) kernelRef {
	kernelNames = append(kernelNames, name)
	return kernelRef(len(kernelNames) - 1)
}

// kernel is a kernel looked up in a loaded module, with its name for
// errors.
type kernel struct {
	f    uintptr
	name string
}

// launch is a kernel launch being prepared on a stream: its arguments are
// written into the stream's parameter slots (no allocation), each slot
// holding one kernel parameter in the parameter's own width.
type launch struct {
	s   *Stream
	n   int
	err error
}

// args starts a launch on s.
func (s *Stream) args() *launch { return &launch{s: s} }

func (l *launch) slot(v uint64) *launch {
	if l.n == len(l.s.slots) {
		l.err = fmt.Errorf("cuda: more than %d kernel arguments", len(l.s.slots))
		return l
	}
	l.s.slots[l.n] = v
	l.s.ptrs[l.n] = unsafe.Pointer(&l.s.slots[l.n])
	l.n++
	return l
}

// buf adds a device buffer's address (a T* parameter). Host buffers are an
// error.
func (l *launch) buf(b device.Buffer) *launch {
	if b.Len() > 0 && b.Addr() == 0 {
		l.err = fmt.Errorf("cuda: %v is not GPU memory", b)
	}
	return l.slot(uint64(b.Addr()))
}

// i64 adds a long long parameter.
func (l *launch) i64(v int) *launch { return l.slot(uint64(int64(v))) }

// i32 adds an int parameter.
func (l *launch) i32(v int) *launch { return l.slot(uint64(uint32(int32(v)))) }

// flag adds an int parameter that is 1 or 0.
func (l *launch) flag(b bool) *launch {
	if b {
		return l.i32(1)
	}
	return l.i32(0)
}

// f32 adds a float parameter.
func (l *launch) f32(v float32) *launch { return l.slot(uint64(math.Float32bits(v))) }

// f64 adds a double parameter.
func (l *launch) f64(v float64) *launch { return l.slot(math.Float64bits(v)) }

// blockSize is the block of every launch (a power of two: the block
// reductions need one).
const blockSize = 256

// grid returns the blocks of a grid-stride launch over n elements.
func (s *Stream) grid(n int) int {
	g := (n + blockSize - 1) / blockSize
	return max(1, min(g, 32*s.d.sms))
}

// run launches the package's kernel k with grid blocks of blockSize
// threads.
func (l *launch) run(k kernelRef, grid int) error {
	return l.launch(kernel{l.s.d.mod.fns[k], kernelNames[k]}, grid)
}

// runN launches the package's kernel k over n elements (grid-stride);
// nothing for n = 0.
func (l *launch) runN(k kernelRef, n int) error {
	if n == 0 && l.err == nil {
		return nil
	}
	return l.run(k, l.s.grid(n))
}

// launch launches k with grid blocks of blockSize threads.
func (l *launch) launch(k kernel, grid int) error {
	if l.err != nil {
		return l.err
	}
	s := l.s
	unlock, err := s.enter()
	if err != nil {
		return err
	}
	defer unlock()
	counts.launches.Add(1)
	// The kernel's name joins the call's only on failure: a launch
	// allocates nothing.
	if r := drv.cuLaunchKernel(k.f, uint32(max(grid, 1)), 1, 1, blockSize, 1, 1, 0, s.h, unsafe.Pointer(&s.ptrs[0]), nil); r != 0 {
		return check("cuLaunchKernel "+k.name, r)
	}
	return s.checkLaunch(k.name)
}
