package cuda

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
)

// module is the loaded kernel image of a device.
type module struct {
	h   uintptr
	mu  sync.Mutex
	fns map[string]uintptr
}

// loadModule loads a cubin or PTX image (the device's context current).
func loadModule(image []byte) (*module, error) {
	img := append(append([]byte(nil), image...), 0) // PTX must end with NUL
	m := &module{fns: map[string]uintptr{}}
	if err := check("cuModuleLoadData", drv.cuModuleLoadData(&m.h, unsafe.Pointer(&img[0]))); err != nil {
		return nil, fmt.Errorf("%w (the kernels compiled by NVRTC could not be loaded by the driver; is the driver older than NVRTC?)", err)
	}
	return m, nil
}

// fn returns kernel name (the device's context current).
func (m *module) fn(name string) (uintptr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f, ok := m.fns[name]; ok {
		return f, nil
	}
	var f uintptr
	if err := check("cuModuleGetFunction "+name, drv.cuModuleGetFunction(&f, m.h, cString(name))); err != nil {
		return 0, err
	}
	m.fns[name] = f
	return f, nil
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

// run launches kernel name with grid blocks of blockSize threads.
func (l *launch) run(name string, grid int) error { return l.runIn(l.s.d.mod, name, grid) }

// runIn launches kernel name of module m (the device's, or a method's
// kernel's) with grid blocks of blockSize threads.
func (l *launch) runIn(m *module, name string, grid int) error {
	if l.err != nil {
		return l.err
	}
	s := l.s
	defer s.d.enter()()
	f, err := m.fn(name)
	if err != nil {
		return err
	}
	var pin runtime.Pinner
	pin.Pin(s)
	defer pin.Unpin()
	return check("cuLaunchKernel "+name, drv.cuLaunchKernel(f, uint32(max(grid, 1)), 1, 1, blockSize, 1, 1, 0, s.h, unsafe.Pointer(&s.ptrs[0]), nil))
}

// runN launches kernel name over n elements (grid-stride); nothing for
// n = 0.
func (l *launch) runN(name string, n int) error {
	if n == 0 && l.err == nil {
		return nil
	}
	return l.run(name, l.s.grid(n))
}
