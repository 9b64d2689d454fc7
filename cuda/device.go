package cuda

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
)

// Options configure a device.
type Options struct {
	// TF32 lets cuBLAS and cuDNN use TF32 tensor-core math for float32
	// products and convolutions (faster, about 10 bits of mantissa). Off,
	// float32 products are computed in float32.
	TF32 bool
	// Deterministic restricts cuDNN to convolution algorithms whose
	// results do not vary between runs (bit-reproducible GPU runs, at some
	// cost in speed). Otherwise the fastest algorithm measured for each
	// shape is used, which may add in a varying order.
	Deterministic bool
}

// Device is one NVIDIA GPU: a device.Device whose buffers are GPU memory.
type Device struct {
	ordinal int
	dev     int32
	ctx     uintptr
	name    string
	cc      [2]int
	sms     int
	opts    Options

	mod  *module
	def  *Stream
	math *gpuMath

	anchorMu sync.Mutex
	anchor   *anchor

	convMu    sync.Mutex
	convCache map[string]ConvChoice // the algorithm of each convolution shape
	convLog   []ConvChoice

	closeOnce sync.Once
}

// anchor maps device event times to the host clock: an event known to have
// completed at a host time. Events keep the anchor they were recorded
// against alive; its CUDA event is destroyed when no event uses it.
type anchor struct {
	ev   uintptr
	host time.Time
}

var _ device.Device = (*Device)(nil)

// Count returns the number of GPUs the driver sees (an error wrapping
// device.ErrUnavailable when the driver is missing).
func Count() (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var n int32
	if err := check("cuDeviceGetCount", drv.cuDeviceGetCount(&n)); err != nil {
		return 0, fmt.Errorf("%w: %w", device.ErrUnavailable, err)
	}
	return int(n), nil
}

// Open opens GPU ordinal: it makes its primary context, compiles (or loads
// from the cache) the package's kernels for it, and creates its default
// stream. Errors wrap device.ErrUnavailable when the GPU or a library is
// missing, and say how to fix it.
func Open(ordinal int, opts Options) (*Device, error) {
	n, err := Count()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: %w (the CUDA driver found no device); check nvidia-smi and CUDA_VISIBLE_DEVICES", device.ErrUnavailable, errNoGPU)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("%w: GPU %d does not exist; this machine has %d GPU(s) (0..%d)", device.ErrUnavailable, ordinal, n, n-1)
	}
	d := &Device{ordinal: ordinal, opts: opts}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := check("cuDeviceGet", drv.cuDeviceGet(&d.dev, int32(ordinal))); err != nil {
		return nil, err
	}
	if err := check("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(&d.ctx, d.dev)); err != nil {
		return nil, err
	}
	if err := check("cuCtxSetCurrent", drv.cuCtxSetCurrent(d.ctx)); err != nil {
		return nil, err
	}
	name := make([]byte, 256)
	drv.cuDeviceGetName(&name[0], int32(len(name)), d.dev)
	d.name = goString(&name[0])
	var v int32
	drv.cuDeviceGetAttribute(&v, attrComputeCapabilityMaj, d.dev)
	d.cc[0] = int(v)
	drv.cuDeviceGetAttribute(&v, attrComputeCapabilityMin, d.dev)
	d.cc[1] = int(v)
	drv.cuDeviceGetAttribute(&v, attrMultiprocessorCount, d.dev)
	d.sms = int(v)
	image, _, err := Compile(kernelSource, d.cc[0], d.cc[1])
	if err != nil {
		return nil, errNoCompiler(err)
	}
	if d.mod, err = loadModule(image); err != nil {
		return nil, err
	}
	if d.def, err = d.newStream(); err != nil {
		return nil, err
	}
	d.math = &gpuMath{d: d}
	if err := d.refreshAnchor(); err != nil {
		return nil, err
	}
	return d, nil
}

// enter locks the calling goroutine to its OS thread and makes the
// device's context current there; call the returned function when done.
func (d *Device) enter() func() {
	runtime.LockOSThread()
	drv.cuCtxSetCurrent(d.ctx)
	return runtime.UnlockOSThread
}

// Kind implements device.Device.
func (d *Device) Kind() device.Kind { return device.CUDAKind }

// String implements device.Device.
func (d *Device) String() string {
	return fmt.Sprintf("cuda:%d (%s, compute capability %d.%d, %d SMs)", d.ordinal, d.name, d.cc[0], d.cc[1], d.sms)
}

// Name is the GPU's product name.
func (d *Device) Name() string { return d.name }

// Ordinal is the GPU's index.
func (d *Device) Ordinal() int { return d.ordinal }

// Options returns the options the device was opened with.
func (d *Device) Options() Options { return d.opts }

// Report describes a GPU and the NVIDIA software the process runs on it:
// what run.json records and train prints for -device cuda.
type Report struct {
	GPU               string `json:"gpu"`
	Ordinal           int    `json:"ordinal"`
	ComputeCapability string `json:"compute_capability"`
	SMs               int    `json:"sms"`
	MemoryMiB         int    `json:"memory_mib"`
	// Driver is the kernel module's version (/proc/driver/nvidia/version),
	// empty where it cannot be read.
	Driver string `json:"driver,omitempty"`
	TF32   bool   `json:"tf32"`
	// Deterministic is Options.Deterministic.
	Deterministic bool `json:"deterministic,omitempty"`
	// Convolutions are the cuDNN algorithms chosen so far.
	Convolutions []ConvChoice `json:"convolutions,omitempty"`
	// Libraries are the libraries the package loaded, with their versions
	// (the driver's is the CUDA version it supports).
	Libraries []LibraryInfo `json:"libraries"`
	// Files are the NVIDIA library files mapped into the process.
	Files []string `json:"files"`
}

// Report describes d and the libraries loaded so far (call it once the
// models are built: cuDNN and NCCL load on first use).
func (d *Device) Report() Report {
	r := Report{GPU: d.name, Ordinal: d.ordinal, ComputeCapability: fmt.Sprintf("%d.%d", d.cc[0], d.cc[1]), SMs: d.sms, TF32: d.opts.TF32,
		Deterministic: d.opts.Deterministic, Convolutions: d.ConvChoices()}
	if _, total, err := d.MemInfo(); err == nil {
		r.MemoryMiB = int(total >> 20)
	}
	if b, err := os.ReadFile("/proc/driver/nvidia/version"); err == nil {
		r.Driver = moduleVersion(string(b))
	}
	r.Libraries, r.Files = Libraries()
	return r
}

// moduleVersion returns the kernel module's version from
// /proc/driver/nvidia/version: the first word after "Module" made of
// digits and dots ("NVRM version: NVIDIA UNIX x86_64 Kernel Module
// 580.65.06 …", and for the open modules "… Open Kernel Module for x86_64
// 580.159.04 …"), empty if there is none.
func moduleVersion(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	_, after, ok := strings.Cut(line, "Module")
	if !ok {
		return ""
	}
	for _, w := range strings.Fields(after) {
		if w[0] >= '0' && w[0] <= '9' && strings.Trim(w, "0123456789.") == "" {
			return w
		}
	}
	return ""
}

// String is the report in a few lines, for the terminal.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "GPU %d: %s (compute capability %s, %d SMs, %d MiB)", r.Ordinal, r.GPU, r.ComputeCapability, r.SMs, r.MemoryMiB)
	if r.Driver != "" {
		fmt.Fprintf(&b, ", driver %s", r.Driver)
	}
	if r.TF32 {
		b.WriteString(", TF32 on")
	}
	if r.Deterministic {
		b.WriteString(", deterministic convolutions")
	}
	for _, l := range r.Libraries {
		fmt.Fprintf(&b, "\n  %s %s: %s", l.Name, l.Version, l.Path)
		if len(l.Missing) > 0 {
			fmt.Fprintf(&b, " (lacks %s)", strings.Join(l.Missing, ", "))
		}
	}
	return b.String()
}

// MemInfo returns the free and total memory of the GPU in bytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	defer d.enter()()
	err = check("cuMemGetInfo", drv.cuMemGetInfo(&free, &total))
	return
}

// Alloc implements device.Device: zeroed GPU memory.
func (d *Device) Alloc(dt device.DType, n int) (device.Buffer, error) {
	if n < 0 || dt.Size() == 0 {
		return device.Buffer{}, fmt.Errorf("cuda: cannot allocate %d elements of %v", n, dt)
	}
	if n == 0 {
		return device.NewDeviceBuffer(d, dt, 0, 0), nil
	}
	defer d.enter()()
	bytes := uint64(n) * uint64(dt.Size())
	var p uint64
	counts.allocs.Add(1)
	if err := check("cuMemAlloc", drv.cuMemAlloc(&p, bytes)); err != nil {
		free, total, _ := d.memInfoLocked()
		return device.Buffer{}, fmt.Errorf("cuda: allocating %d MiB on %v (%d of %d MiB free): %w", bytes>>20, d, free>>20, total>>20, err)
	}
	if err := check("cuMemsetD8Async", drv.cuMemsetD8Async(p, 0, bytes, 0)); err != nil {
		return device.Buffer{}, err
	}
	counts.syncs.Add(1)
	if err := check("cuStreamSynchronize", drv.cuStreamSynchronize(0)); err != nil {
		return device.Buffer{}, err
	}
	return device.NewDeviceBuffer(d, dt, n, uintptr(p)), nil
}

func (d *Device) memInfoLocked() (free, total uint64, err error) {
	err = check("cuMemGetInfo", drv.cuMemGetInfo(&free, &total))
	return
}

// Free implements device.Device.
func (d *Device) Free(b device.Buffer) error {
	if b.Addr() == 0 {
		return nil
	}
	if b.Device() != device.Device(d) {
		return fmt.Errorf("cuda: freeing %v on %v", b, d)
	}
	defer d.enter()()
	counts.frees.Add(1)
	return check("cuMemFree", drv.cuMemFree(uint64(b.Addr())))
}

// AllocPinned implements comm.PinnedHost: n bytes of page-locked host
// memory, which the GPU's streams copy to and from asynchronously. It is
// never freed: it is for pools the process keeps (staging).
func (d *Device) AllocPinned(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: AllocPinned(%d)", n)
	}
	defer d.enter()()
	var p unsafe.Pointer
	counts.pinned.Add(1)
	if err := check("cuMemAllocHost", drv.cuMemAllocHost(&p, uint64(n))); err != nil {
		return nil, fmt.Errorf("cuda: %d MiB of page-locked host memory: %w", n>>20, err)
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// Stream implements device.Device.
func (d *Device) Stream() device.Stream { return d.def }

// NewStream implements device.Device.
func (d *Device) NewStream() (device.Stream, error) { return d.newStream() }

func (d *Device) newStream() (*Stream, error) {
	defer d.enter()()
	s := &Stream{d: d}
	if err := check("cuStreamCreate", drv.cuStreamCreate(&s.h, streamNonBlocking)); err != nil {
		return nil, err
	}
	return s, nil
}

// Math implements device.Device.
func (d *Device) Math() device.Math { return d.math }

// Close implements device.Device: it releases the primary context.
func (d *Device) Close() error {
	var err error
	d.closeOnce.Do(func() {
		defer d.enter()()
		drv.cuCtxSynchronize()
		err = check("cuDevicePrimaryCtxRelease", drv.cuDevicePrimaryCtxRelease(d.dev))
	})
	return err
}

// refreshAnchor records a new anchor event and waits for it, so that
// event times are measured against a recent reference (float32
// milliseconds lose precision over long spans).
func (d *Device) refreshAnchor() error {
	defer d.enter()()
	var ev uintptr
	if err := check("cuEventCreate", drv.cuEventCreate(&ev, eventDefault)); err != nil {
		return err
	}
	if err := check("cuEventRecord", drv.cuEventRecord(ev, 0)); err != nil {
		return err
	}
	counts.syncs.Add(1)
	if err := check("cuEventSynchronize", drv.cuEventSynchronize(ev)); err != nil {
		return err
	}
	a := &anchor{ev: ev, host: time.Now()}
	runtime.AddCleanup(a, func(ev uintptr) {
		defer d.enter()()
		drv.cuEventDestroy(ev)
	}, ev)
	d.anchorMu.Lock()
	d.anchor = a
	d.anchorMu.Unlock()
	return nil
}

// anchorAge is the age from which an anchor is refreshed (one host wait):
// float32 milliseconds keep about a microsecond over 10 s.
var anchorAge = 10 * time.Second

// currentAnchor returns the anchor, refreshing it when it is old.
func (d *Device) currentAnchor() *anchor {
	d.anchorMu.Lock()
	a := d.anchor
	d.anchorMu.Unlock()
	if time.Since(a.host) > anchorAge && d.refreshAnchor() == nil {
		d.anchorMu.Lock()
		a = d.anchor
		d.anchorMu.Unlock()
	}
	return a
}

// Stream is a CUDA stream of one device (non-blocking with respect to the
// legacy default stream). It is not safe for concurrent use.
type Stream struct {
	d     *Device
	h     uintptr
	blas  uintptr // cuBLAS handle bound to the stream (lazy)
	dnn   uintptr // cuDNN handle bound to the stream (lazy)
	slots [32]uint64
	ptrs  [32]unsafe.Pointer
	part  device.Buffer // scratch of reductions (lazy)
	sel   *selScratch   // scratch of the sparsification primitives (lazy)
	// capturing is set while work is captured into a graph (Capture).
	capturing bool
}

var _ device.Stream = (*Stream)(nil)

// Device implements device.Stream.
func (s *Stream) Device() device.Device { return s.d }

// Copy implements device.Stream.
func (s *Stream) Copy(dst, src device.Buffer) error {
	if err := device.CheckSame("copy", dst, src); err != nil {
		return err
	}
	n := uint64(dst.Bytes())
	if n == 0 {
		return nil
	}
	dh, sh := dst.IsHost(), src.IsHost()
	if dh && sh {
		copy(dst.HostBytes(), src.HostBytes())
		return nil
	}
	for _, b := range []device.Buffer{dst, src} {
		if !b.IsHost() && b.Device() != device.Device(s.d) {
			return fmt.Errorf("cuda: copy between %v and %v on a stream of %v", src, dst, s.d)
		}
	}
	defer s.d.enter()()
	switch {
	case dh:
		counts.dtoh.Add(int64(n))
		return check("cuMemcpyDtoHAsync", drv.cuMemcpyDtoHAsync(unsafe.Pointer(&dst.HostBytes()[0]), uint64(src.Addr()), n, s.h))
	case sh:
		counts.htod.Add(int64(n))
		return check("cuMemcpyHtoDAsync", drv.cuMemcpyHtoDAsync(uint64(dst.Addr()), unsafe.Pointer(&src.HostBytes()[0]), n, s.h))
	}
	counts.launches.Add(1)
	return check("cuMemcpyDtoDAsync", drv.cuMemcpyDtoDAsync(uint64(dst.Addr()), uint64(src.Addr()), n, s.h))
}

// Synchronize implements device.Stream.
func (s *Stream) Synchronize() error {
	defer s.d.enter()()
	counts.syncs.Add(1)
	return check("cuStreamSynchronize", drv.cuStreamSynchronize(s.h))
}

// Record implements device.Stream.
func (s *Stream) Record() (device.Event, error) {
	var a *anchor
	if s.capturing { // no synchronisation while capturing
		s.d.anchorMu.Lock()
		a = s.d.anchor
		s.d.anchorMu.Unlock()
	} else {
		a = s.d.currentAnchor()
	}
	defer s.d.enter()()
	e := &Event{d: s.d, anchor: a}
	if err := check("cuEventCreate", drv.cuEventCreate(&e.h, eventDefault)); err != nil {
		return nil, err
	}
	var r cuResult
	if s.capturing {
		// In a graph, the record is a node that runs on every replay.
		r = drv.cuEventRecordWithFlags(e.h, s.h, eventRecordExternal)
	} else {
		r = drv.cuEventRecord(e.h, s.h)
	}
	if err := check("cuEventRecord", r); err != nil {
		drv.cuEventDestroy(e.h)
		return nil, err
	}
	runtime.AddCleanup(e, func(h uintptr) {
		defer s.d.enter()()
		drv.cuEventDestroy(h)
	}, e.h)
	return e, nil
}

// Wait implements device.Stream.
func (s *Stream) Wait(ev device.Event) error {
	e, ok := ev.(*Event)
	if !ok {
		// A host event (completed) needs no waiting.
		return ev.Synchronize()
	}
	defer s.d.enter()()
	return check("cuStreamWaitEvent", drv.cuStreamWaitEvent(s.h, e.h, 0))
}

// Event is a CUDA event. An event recorded while a graph was captured is
// recorded again by every replay of the graph; it then stands for the most
// recent replay.
type Event struct {
	d      *Device
	h      uintptr
	anchor *anchor
}

// Synchronize implements device.Event.
func (e *Event) Synchronize() error {
	defer e.d.enter()()
	counts.syncs.Add(1)
	return check("cuEventSynchronize", drv.cuEventSynchronize(e.h))
}

// Done reports whether the work before the event has completed, without
// waiting (an error counts as done: the next wait reports it).
func (e *Event) Done() bool {
	defer e.d.enter()()
	return drv.cuEventQuery(e.h) != errNotReady
}

// Time implements device.Event: the anchor's host time plus the device
// time elapsed from the anchor to the event.
func (e *Event) Time() time.Time {
	defer e.d.enter()()
	var ms float32
	if r := drv.cuEventElapsedTime(&ms, e.anchor.ev, e.h); r != 0 {
		return time.Time{}
	}
	return e.anchor.host.Add(time.Duration(float64(ms) * float64(time.Millisecond)))
}
