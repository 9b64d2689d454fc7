package cuda

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// TestHotCallsPassTheirArguments calls the direct bindings of the
// driver's and cuBLAS' hot functions (hotDriver, hotCUBLAS: every launch,
// copy, event and wait on a real GPU goes through them, and the emulator
// replaces them) on a fake library of the same C prototypes compiled
// here: each function must receive every argument, in order, and return
// its result.
func TestHotCallsPassTheirArguments(t *testing.T) {
	if runtime.GOARCH != "amd64" || runtime.GOOS != "linux" {
		t.Skip("the fake is built for x86-64 Linux")
	}
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Fatalf("g++ not found (Debian: apt-get install g++): %v", err)
	}
	so := filepath.Join(t.TempDir(), "libfake.so")
	if out, err := testenv.Command(t, 2*time.Minute, gxx, "-shared", "-fPIC", "-O1", "-o", so, "testdata/hotcall/fake.cpp").CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
	h, err := purego.Dlopen(so, purego.RTLD_NOW)
	if err != nil {
		t.Fatal(err)
	}
	argsFn, err := purego.Dlsym(h, "fake_args")
	if err != nil {
		t.Fatal(err)
	}
	var rec [32]uint64
	args := func() []uint64 {
		n, _, _ := purego.SyscallN(argsFn, uintptr(unsafe.Pointer(&rec[0])))
		return slices.Clone(rec[:n])
	}
	var d driverTable
	hotDriver(h, &d)
	var b cublasTable
	hotCUBLAS(h, &b)
	var x [4]byte
	px := uint64(uintptr(unsafe.Pointer(&x[0])))
	var ev uintptr
	alpha, beta := float32(1.5), float32(-2)
	cases := []struct {
		name string
		call func() int64
		want []uint64
	}{
		{"cuLaunchKernel", func() int64 {
			return int64(d.cuLaunchKernel(0xf00, 1, 2, 3, 256, 5, 6, 7, 0x5e, unsafe.Pointer(&x[0]), nil))
		}, []uint64{0xf00, 1, 2, 3, 256, 5, 6, 7, 0x5e, px, 0}},
		{"cuCtxSetCurrent", func() int64 { return int64(d.cuCtxSetCurrent(0xc7)) }, []uint64{0xc7}},
		{"cuMemcpyHtoDAsync_v2", func() int64 { return int64(d.cuMemcpyHtoDAsync(1<<40, unsafe.Pointer(&x[0]), 3<<33, 9)) }, []uint64{1 << 40, px, 3 << 33, 9}},
		{"cuMemcpyDtoHAsync_v2", func() int64 { return int64(d.cuMemcpyDtoHAsync(unsafe.Pointer(&x[0]), 1<<41, 7, 8)) }, []uint64{px, 1 << 41, 7, 8}},
		{"cuMemcpyDtoDAsync_v2", func() int64 { return int64(d.cuMemcpyDtoDAsync(11, 12, 13, 14)) }, []uint64{11, 12, 13, 14}},
		{"cuMemsetD32Async", func() int64 { return int64(d.cuMemsetD32Async(21, 0xffffffff, 23, 24)) }, []uint64{21, 0xffffffff, 23, 24}},
		{"cuEventRecord", func() int64 { return int64(d.cuEventRecord(31, 32)) }, []uint64{31, 32}},
		{"cuEventRecordWithFlags", func() int64 { return int64(d.cuEventRecordWithFlags(33, 34, 1)) }, []uint64{33, 34, 1}},
		{"cuStreamWaitEvent", func() int64 { return int64(d.cuStreamWaitEvent(35, 36, 0)) }, []uint64{35, 36, 0}},
		{"cuEventQuery", func() int64 { return int64(d.cuEventQuery(37)) }, []uint64{37}},
		{"cuGraphLaunch", func() int64 { return int64(d.cuGraphLaunch(38, 39)) }, []uint64{38, 39}},
		{"cuStreamSynchronize", func() int64 { return int64(d.cuStreamSynchronize(40)) }, []uint64{40}},
		{"cuEventSynchronize", func() int64 { return int64(d.cuEventSynchronize(41)) }, []uint64{41}},
		{"cuEventCreate", func() int64 { return int64(d.cuEventCreate(&ev, 2)) }, []uint64{2}},
		{"cuEventDestroy_v2", func() int64 { return int64(d.cuEventDestroy(42)) }, []uint64{42}},
		{"cublasSgemm_v2", func() int64 {
			return int64(b.sgemm(0x4a, 1, 0, 3, 4, 5, &alpha, 0xa, 6, 0xb, 7, &beta, 0xc, 8))
		}, []uint64{0x4a, 1, 0, 3, 4, 5, 1500, 0xa, 6, 0xb, 7, uint64(0xffff_ffff_ffff_f830), 0xc, 8}},
	}
	for i, c := range cases {
		got := c.call()
		if want := int64(101 + i); got != want {
			t.Errorf("%s returned %d, want %d", c.name, got, want)
		}
		if a := args(); !slices.Equal(a, c.want) {
			t.Errorf("%s received %#x, want %#x", c.name, a, c.want)
		}
	}
	if ev != 0xe7e7 {
		t.Errorf("cuEventCreate's event: %#x, want 0xe7e7", ev)
	}
}

// TestSyncNamesFaultingKernel: with SPARSEGRAD_CUDA_SYNC=1 every launch
// waits for its kernel, so a kernel that faults is named in the error of
// its own launch (here the emulated driver reports an illegal address at
// the wait after k_scale).
func TestSyncNamesFaultingKernel(t *testing.T) {
	if !emulated {
		t.Skip("injects a fault into the emulated driver")
	}
	d := openDevice(t)
	x, err := d.Alloc(device.Float32, 10)
	if err != nil {
		t.Fatal(err)
	}
	s := d.Stream()
	sync, old := drv.cuStreamSynchronize, syncLaunches
	t.Cleanup(func() { drv.cuStreamSynchronize, syncLaunches = sync, old })
	drv.cuStreamSynchronize = func(uintptr) cuResult { return 700 } // CUDA_ERROR_ILLEGAL_ADDRESS
	syncLaunches = false
	if err := d.Math().Scale(s, x, 2); err != nil {
		t.Fatalf("without %s the launch returns before its kernel runs: %v", EnvSync, err)
	}
	syncLaunches = true
	err = d.Math().Scale(s, x, 2)
	if err == nil || !strings.Contains(err.Error(), "k_scale") || !strings.Contains(err.Error(), EnvSync) {
		t.Fatalf("a faulting k_scale with %s=1: %v; want an error naming the kernel", EnvSync, err)
	}
	t.Log(err)
}

// TestLaunchesAllocateNothing: a kernel launch (the package's and a
// method's, whose arguments come boxed), a memset and a device copy
// — the calls a step issues by the hundred — allocate nothing on the Go
// heap on their way to the driver (whose calls are replaced here by ones
// that do nothing, so that only the package's path is counted).
func TestLaunchesAllocateNothing(t *testing.T) {
	d := openDevice(t)
	idx, err := d.Alloc(device.Int32, 10)
	if err != nil {
		t.Fatal(err)
	}
	x, err := d.Alloc(device.Float32, 10)
	if err != nil {
		t.Fatal(err)
	}
	y, err := d.Alloc(device.Float32, 10)
	if err != nil {
		t.Fatal(err)
	}
	launch, copyDD, memset := drv.cuLaunchKernel, drv.cuMemcpyDtoDAsync, drv.cuMemsetD32Async
	t.Cleanup(func() { drv.cuLaunchKernel, drv.cuMemcpyDtoDAsync, drv.cuMemsetD32Async = launch, copyDD, memset })
	drv.cuLaunchKernel = func(uintptr, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uintptr, unsafe.Pointer, unsafe.Pointer) cuResult {
		return 0
	}
	drv.cuMemcpyDtoDAsync = func(uint64, uint64, uint64, uintptr) cuResult { return 0 }
	drv.cuMemsetD32Async = func(uint64, uint32, uint64, uintptr) cuResult { return 0 }
	s, sp, m := d.Stream(), d.Sparse(), d.Math()
	mk := methodKernels()[0]
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Shift (a kernel)", func() error { return sp.Shift(s, idx, 1) }},
		{"Iota (a kernel)", func() error { return sp.Iota(s, idx, 3) }},
		{"Scale (a kernel)", func() error { return m.Scale(s, x, 2) }},
		{"Add (a kernel)", func() error { return m.Add(s, y, x) }},
		{"Run (a method's kernel, its arguments boxed)", func() error { return sp.Run(s, mk, x.Len(), x, int64(x.Len()), float32(0.5)) }},
		{"Fill (a memset)", func() error { return m.Fill(s, x, 1) }},
		{"Copy (device to device)", func() error { return s.Copy(y, x) }},
	} {
		if n := testing.AllocsPerRun(50, func() {
			if err := c.call(); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("%s: %v allocations a call", c.name, n)
		}
	}
}

// TestFailedSetUpsLeakNothing: a cuBLAS or cuDNN handle whose binding to
// its stream fails, and an anchor event whose wait fails, are destroyed
// with the error, not left behind.
func TestFailedSetUpsLeakNothing(t *testing.T) {
	if !emulated {
		t.Skip("injects failures into the emulated driver and libraries")
	}
	d := openDevice(t)
	if err := loadCUDNN(); err != nil {
		t.Fatal(err)
	}
	live, _ := CountHandles(t)
	s, err := d.newStream()
	if err != nil {
		t.Fatal(err)
	}
	blasSet, dnnSet := cublas.setStream, cudnn.setStream
	cublas.setStream = func(uintptr, uintptr) int32 { return 14 }
	cudnn.setStream = func(uintptr, uintptr) int32 { return 4 }
	_, errBLAS := s.blasHandle()
	_, errDNN := s.dnnHandle()
	cublas.setStream, cudnn.setStream = blasSet, dnnSet
	if errBLAS == nil || errDNN == nil {
		t.Fatalf("failed bindings: cuBLAS %v, cuDNN %v; want errors", errBLAS, errDNN)
	}
	var mu sync.Mutex
	events := map[uintptr]bool{}
	create, destroy, wait := drv.cuEventCreate, drv.cuEventDestroy, drv.cuEventSynchronize
	t.Cleanup(func() { drv.cuEventCreate, drv.cuEventDestroy, drv.cuEventSynchronize = create, destroy, wait })
	drv.cuEventCreate = func(e *uintptr, flags uint32) cuResult {
		r := create(e, flags)
		mu.Lock()
		events[*e] = true
		mu.Unlock()
		return r
	}
	drv.cuEventDestroy = func(e uintptr) cuResult {
		mu.Lock()
		delete(events, e)
		mu.Unlock()
		return destroy(e)
	}
	drv.cuEventSynchronize = func(uintptr) cuResult { return 700 }
	errAnchor := d.refreshAnchor()
	drv.cuEventSynchronize = wait
	if errAnchor == nil {
		t.Fatal("an anchor whose wait failed: no error")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	leftEvents := len(events)
	mu.Unlock()
	if st, b, n := live(); st != 0 || b != 0 || n != 0 || leftEvents != 0 {
		t.Errorf("after the failures and the stream's Close: %d streams, %d cuBLAS and %d cuDNN handles, %d events left", st, b, n, leftEvents)
	}
}

// TestOpenNamesMissingKernel: a kernel the package declares (newKernelRef)
// that the compiled source lacks fails Open, naming it — not the first
// launch of it, mid-step.
func TestOpenNamesMissingKernel(t *testing.T) {
	if !emulated {
		t.Skip("declares a kernel the emulated driver lacks")
	}
	names := kernelNames
	t.Cleanup(func() { kernelNames = names })
	kernelNames = append(slices.Clip(names), "k_no_such_kernel")
	d, err := Open(0, Options{})
	if err == nil {
		d.Close()
		t.Fatal("Open succeeded with a declared kernel the source lacks")
	}
	if !strings.Contains(err.Error(), "k_no_such_kernel") {
		t.Fatalf("Open: %v; want an error naming k_no_such_kernel", err)
	}
	t.Log(err)
}

// TestHoldSwitchesContextOnce: a burst of calls on a held stream makes the
// context current once (nested holds add nothing); a call on a stream not
// held makes it current itself and is counted as unheld.
func TestHoldSwitchesContextOnce(t *testing.T) {
	d := openDevice(t)
	x, err := d.Alloc(device.Float32, 10)
	if err != nil {
		t.Fatal(err)
	}
	s, m := d.def, d.Math()
	c0 := Counts()
	release := s.Hold()
	for range 3 {
		if err := m.Scale(s, x, 2); err != nil {
			t.Fatal(err)
		}
	}
	inner := s.Hold()
	if err := m.Add(s, x, x); err != nil {
		t.Fatal(err)
	}
	inner()
	if err := m.Fill(s, x, 1); err != nil {
		t.Fatal(err)
	}
	release()
	if c := Counts().Sub(c0); c.CtxSets != 1 || c.Unheld != 0 || c.Launches != 5 {
		t.Errorf("a held burst of 5 calls: %v; want 5 launches, 1 context switch, 0 unheld calls", c)
	}
	c1 := Counts()
	if err := m.Scale(s, x, 2); err != nil {
		t.Fatal(err)
	}
	if c := Counts().Sub(c1); c.CtxSets != 1 || c.Unheld != 1 {
		t.Errorf("a call on a stream not held: %v; want 1 context switch, 1 unheld call", c)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// openDevice opens GPU 0 (the emulator's where there is no GPU) for a test
// or benchmark of the package's internals, closed when tb ends.
func openDevice(tb testing.TB) *Device {
	tb.Helper()
	d, err := Open(0, Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}
