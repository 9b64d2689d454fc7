package cuda

import (
	"errors"
	"fmt"
	"log/slog"
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

	mod *module
	def *Stream
	// dead are the events no longer referenced, destroyed by the next
	// Record (destroyEvent).
	deadMu sync.Mutex
	dead   []uintptr

	// methodKernels are the methods' own kernels compiled for the device
	// (Sparse.Run): *device.Kernel → *methodKernel.
	methodKernels sync.Map
	math          *gpuMath

	anchorMu sync.Mutex
	anchor   *anchor

	convMu    sync.Mutex
	convCache map[string]ConvChoice // the algorithm of each convolution shape
	convLog   []ConvChoice

	streamsMu sync.Mutex
	streams   []*Stream // every stream made, destroyed by Close

	// live holds the addresses of the device memory Alloc made and Free
	// has not freed: Close frees them, because the primary context, which
	// would free them with itself, outlives a Device while another Device
	// of the same GPU in the process holds it. closed says Close has run
	// (a later Free is then a no-op).
	liveMu sync.Mutex
	live   map[uint64]struct{}
	closed bool

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
	if err := check("cuDeviceGetName", drv.cuDeviceGetName(&name[0], int32(len(name)), d.dev)); err != nil {
		return nil, err
	}
	d.name = goString(&name[0])
	for _, a := range []struct {
		attr int32
		to   *int
	}{{attrComputeCapabilityMaj, &d.cc[0]}, {attrComputeCapabilityMin, &d.cc[1]}, {attrMultiprocessorCount, &d.sms}} {
		var v int32
		if err := check("cuDeviceGetAttribute", drv.cuDeviceGetAttribute(&v, a.attr, d.dev)); err != nil {
			return nil, err
		}
		*a.to = int(v)
	}
	image, _, err := Compile(kernelSource, d.cc[0], d.cc[1])
	if err != nil {
		return nil, errNoCompiler(err)
	}
	if d.mod, err = loadModule(image, kernelNames); err != nil {
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
func (d *Device) enter() (unlock func(), err error) {
	runtime.LockOSThread()
	counts.ctxSets.Add(1)
	if err := check("cuCtxSetCurrent", drv.cuCtxSetCurrent(d.ctx)); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("cuda: making the context of %v current: %w", d, err)
	}
	return runtime.UnlockOSThread, nil
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

// FreeMemory returns the free and total memory of GPU ordinal in bytes,
// and its name, without opening it (its primary context is retained for
// the query and released): what a run checks its need against before it
// allocates anything.
func FreeMemory(ordinal int) (free, total uint64, name string, err error) {
	n, err := Count()
	if err != nil {
		return 0, 0, "", err
	}
	if ordinal < 0 || ordinal >= n {
		return 0, 0, "", fmt.Errorf("%w: GPU %d does not exist; this machine has %d GPU(s)", device.ErrUnavailable, ordinal, n)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var dev int32
	var ctx uintptr
	if err := check("cuDeviceGet", drv.cuDeviceGet(&dev, int32(ordinal))); err != nil {
		return 0, 0, "", err
	}
	b := make([]byte, 256)
	if err := check("cuDeviceGetName", drv.cuDeviceGetName(&b[0], int32(len(b)), dev)); err != nil {
		return 0, 0, "", err
	}
	if err := check("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(&ctx, dev)); err != nil {
		return 0, 0, "", err
	}
	err = check("cuCtxSetCurrent", drv.cuCtxSetCurrent(ctx))
	if err == nil {
		err = check("cuMemGetInfo", drv.cuMemGetInfo(&free, &total))
	}
	return free, total, goString(&b[0]), errors.Join(err, check("cuDevicePrimaryCtxRelease", drv.cuDevicePrimaryCtxRelease(dev)))
}

// MemInfo returns the free and total memory of the GPU in bytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	unlock, err := d.enter()
	if err != nil {
		return
	}
	defer unlock()
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
	unlock, err := d.enter()
	if err != nil {
		return device.Buffer{}, err
	}
	defer unlock()
	bytes := uint64(n) * uint64(dt.Size())
	var p uint64
	counts.allocs.Add(1)
	if err := check("cuMemAlloc", drv.cuMemAlloc(&p, bytes)); err != nil {
		free, total, _ := d.memInfoLocked()
		return device.Buffer{}, fmt.Errorf("cuda: allocating %d MiB on %v (%d of %d MiB free): %w", bytes>>20, d, free>>20, total>>20, err)
	}
	d.liveMu.Lock()
	if d.live == nil {
		d.live = map[uint64]struct{}{}
	}
	d.live[p] = struct{}{}
	d.liveMu.Unlock()
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
	p := uint64(b.Addr())
	d.liveMu.Lock()
	closed := d.closed
	delete(d.live, p)
	d.liveMu.Unlock()
	if closed {
		return nil // Close has freed it
	}
	unlock, err := d.enter()
	if err != nil {
		return err
	}
	defer unlock()
	counts.frees.Add(1)
	return check("cuMemFree", drv.cuMemFree(p))
}

// AllocPinned implements comm.PinnedHost: n bytes of page-locked host
// memory, which the GPU's streams copy to and from asynchronously. It is
// never freed: it is for pools the process keeps (staging).
func (d *Device) AllocPinned(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: AllocPinned(%d)", n)
	}
	unlock, err := d.enter()
	if err != nil {
		return nil, err
	}
	defer unlock()
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
	unlock, err := d.enter()
	if err != nil {
		return nil, err
	}
	defer unlock()
	s := &Stream{d: d}
	if err := check("cuStreamCreate", drv.cuStreamCreate(&s.h, streamNonBlocking)); err != nil {
		return nil, err
	}
	s.pin.Pin(s)
	d.streamsMu.Lock()
	d.streams = append(d.streams, s)
	d.streamsMu.Unlock()
	return s, nil
}

// Math implements device.Device.
func (d *Device) Math() device.Math { return d.math }

// Close implements device.Device: once the device's work is done, it
// destroys every stream made on it (with their library handles), frees
// the device memory Alloc made that is not freed yet (a later Free of it
// does nothing), unloads the kernel modules and releases the primary
// context.
func (d *Device) Close() error {
	var errs []error
	d.closeOnce.Do(func() {
		unlock, err := d.enter()
		if err != nil {
			errs = append(errs, err)
			return
		}
		errs = append(errs, check("cuCtxSynchronize", drv.cuCtxSynchronize()))
		unlock()
		d.streamsMu.Lock()
		streams := d.streams
		d.streams = nil
		d.streamsMu.Unlock()
		forgetPeers(d)
		for _, s := range streams {
			errs = append(errs, s.Close())
		}
		if unlock, err = d.enter(); err != nil {
			errs = append(errs, err)
			return
		}
		defer unlock()
		// The memory not freed yet: the primary context may outlive this
		// Device (another Device of the GPU holds it), and it would keep it.
		d.liveMu.Lock()
		d.closed = true
		live := d.live
		d.live = nil
		d.liveMu.Unlock()
		for p := range live {
			counts.frees.Add(1)
			errs = append(errs, check("cuMemFree", drv.cuMemFree(p)))
		}
		d.destroyDeadEvents()
		errs = append(errs, check("cuModuleUnload", drv.cuModuleUnload(d.mod.h)))
		d.methodKernels.Range(func(_, mk any) bool {
			errs = append(errs, check("cuModuleUnload", drv.cuModuleUnload(mk.(*methodKernel).mod.h)))
			return true
		})
		errs = append(errs, check("cuDevicePrimaryCtxRelease", drv.cuDevicePrimaryCtxRelease(d.dev)))
	})
	return errors.Join(errs...)
}

// destroyEvent queues a CUDA event no longer referenced (from a cleanup,
// on the runtime's cleanup goroutine) for destruction by the next Record
// on the device, which has the context current already: destroying it
// here would cost a context switch on another thread per event, a dozen
// a training step.
func (d *Device) destroyEvent(h uintptr) {
	d.deadMu.Lock()
	d.dead = append(d.dead, h)
	d.deadMu.Unlock()
}

// destroyDeadEvents destroys the events destroyEvent queued (the context
// current); a failure is logged (it concerns no caller's work).
func (d *Device) destroyDeadEvents() {
	d.deadMu.Lock()
	dead := d.dead
	d.dead = nil
	d.deadMu.Unlock()
	for _, h := range dead {
		if err := check("cuEventDestroy", drv.cuEventDestroy(h)); err != nil {
			slog.Warn("cuda: destroying an event", "device", d.String(), "err", err)
		}
	}
}

// refreshAnchor records a new anchor event and waits for it, so that
// event times are measured against a recent reference (float32
// milliseconds lose precision over long spans).
func (d *Device) refreshAnchor() error {
	unlock, err := d.enter()
	if err != nil {
		return err
	}
	defer unlock()
	var ev uintptr
	if err := check("cuEventCreate", drv.cuEventCreate(&ev, eventDefault)); err != nil {
		return err
	}
	err = check("cuEventRecord", drv.cuEventRecord(ev, 0))
	if err == nil {
		counts.syncs.Add(1)
		err = check("cuEventSynchronize", drv.cuEventSynchronize(ev))
	}
	if err != nil { // not kept: destroyed
		return errors.Join(err, check("cuEventDestroy", drv.cuEventDestroy(ev)))
	}
	a := &anchor{ev: ev, host: time.Now()}
	runtime.AddCleanup(a, func(ev uintptr) { d.destroyEvent(ev) }, ev)
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
	// pin keeps the stream where it is while it exists: launches hand the
	// driver ptrs, which points into slots.
	pin runtime.Pinner
	// held counts the holds of the goroutine issuing work on the stream
	// (Hold): its OS thread is locked with the context current.
	held   int
	closed bool
}

// enter makes the device's context current on the calling goroutine's OS
// thread, locked to it until the returned function is called; while the
// stream is held (Hold) it already is.
func (s *Stream) enter() (unlock func(), err error) {
	if s.held > 0 {
		return func() {}, nil
	}
	counts.unheld.Add(1)
	return s.d.enter()
}

// Hold locks the calling goroutine to its OS thread with the device's
// context current until release is called, and the stream's calls skip
// doing so each time meanwhile: the goroutine that issues a burst of work
// on the stream (a training step, a program's kernels, a reducer's group,
// a collective on a peer stream, an NCCL call) holds it, so that each call
// costs the driver call only (HostCounts.Unheld counts the calls that
// were not held). Holds nest (an inner one costs nothing). Only the holder
// may use the stream while it is held (as a stream is one goroutine's at
// a time anyway); events (Event) enter by themselves, since any goroutine
// may wait for one.
//
// This is the package's "one locked OS thread per stream": the thread is
// the issuing goroutine's own, locked for the burst. A dedicated OS thread
// per stream that goroutines hand their calls to would cost a channel
// hand-over and a goroutine switch each way per call — more than the
// context switch it saves (a launch's own path costs some 50 ns before
// the driver, BenchmarkLaunch) — and would serialise the issuing
// goroutine behind it.
func (s *Stream) Hold() (release func()) {
	if s.held > 0 {
		// Nested: the holder's thread is locked with the context current.
		s.held++
		return func() { s.held-- }
	}
	unlock, err := s.d.enter()
	if err != nil {
		return func() {} // the stream's calls enter themselves and report it
	}
	s.held++
	return func() {
		s.held--
		unlock()
	}
}

// EnvSync names the environment variable that makes every launch wait
// for its kernel (SPARSEGRAD_CUDA_SYNC=1): a kernel that faults is then
// named in the error, instead of the error surfacing at whichever later
// call waits. It costs a host wait per launch; for debugging.
const EnvSync = "SPARSEGRAD_CUDA_SYNC"

// syncLaunches is EnvSync's setting, read once.
var syncLaunches = os.Getenv(EnvSync) == "1"

// checkLaunch waits for the work just issued when EnvSync asks for it (not
// while capturing a graph, which issues nothing), naming what in the
// error.
func (s *Stream) checkLaunch(what string) error {
	if !syncLaunches || s.capturing {
		return nil
	}
	counts.syncs.Add(1)
	if err := check("cuStreamSynchronize", drv.cuStreamSynchronize(s.h)); err != nil {
		return fmt.Errorf("cuda: %s failed on %v (%s=1: each launch is waited for): %w", what, s.d, EnvSync, err)
	}
	return nil
}

// Close destroys the stream and its cuBLAS and cuDNN handles; the work
// issued on it still completes (the driver releases the stream then). It
// must not be used afterwards.
func (s *Stream) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	unlock, err := s.d.enter()
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	if s.blas != 0 {
		errs = append(errs, cublasError("cublasDestroy", cublas.destroy(s.blas)))
		s.blas = 0
	}
	if s.dnn != 0 {
		errs = append(errs, cudnnError("cudnnDestroy", cudnn.destroy(s.dnn)))
		s.dnn = 0
	}
	if s.part.Len() > 0 {
		errs = append(errs, s.d.Free(s.part))
		s.part = device.Buffer{}
	}
	errs = append(errs, check("cuStreamDestroy", drv.cuStreamDestroy(s.h)))
	s.pin.Unpin()
	return errors.Join(errs...)
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
	// Host memory is copied to or from the stream's GPU's memory only;
	// device memory may also be another GPU's that this one reaches (peer
	// access, Device.Reaches).
	for _, b := range []device.Buffer{dst, src} {
		if !b.IsHost() && b.Device() != device.Device(s.d) && (dh || sh || !s.d.Reaches(b.Device())) {
			return fmt.Errorf("cuda: copy between %v and %v on a stream of %v (another GPU's memory is copied to and from the host on a stream of its own, and to another GPU's only where they have peer access)", src, dst, s.d)
		}
	}
	unlock, err := s.enter()
	if err != nil {
		return err
	}
	defer unlock()
	switch {
	case dh:
		counts.dtoh.Add(int64(n))
		return check("cuMemcpyDtoHAsync", drv.cuMemcpyDtoHAsync(unsafe.Pointer(&dst.HostBytes()[0]), uint64(src.Addr()), n, s.h))
	case sh:
		counts.htod.Add(int64(n))
		return check("cuMemcpyHtoDAsync", drv.cuMemcpyHtoDAsync(uint64(dst.Addr()), unsafe.Pointer(&src.HostBytes()[0]), n, s.h))
	}
	counts.launches.Add(1)
	what := "cuMemcpyDtoDAsync"
	var r cuResult
	if dc, sc := dst.Device().(*Device).ctx, src.Device().(*Device).ctx; dc != sc {
		// Between two GPUs' contexts (over NVLink or PCIe with peer access).
		what = "cuMemcpyPeerAsync"
		r = drv.cuMemcpyPeerAsync(uint64(dst.Addr()), dc, uint64(src.Addr()), sc, n, s.h)
	} else {
		r = drv.cuMemcpyDtoDAsync(uint64(dst.Addr()), uint64(src.Addr()), n, s.h)
	}
	if err := check(what, r); err != nil {
		return err
	}
	return s.checkLaunch(what)
}

// Synchronize implements device.Stream.
func (s *Stream) Synchronize() error {
	unlock, err := s.enter()
	if err != nil {
		return err
	}
	defer unlock()
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
	unlock, err := s.enter()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !s.capturing { // nothing but the capture's calls meanwhile
		s.d.destroyDeadEvents()
	}
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
		return nil, errors.Join(err, check("cuEventDestroy", drv.cuEventDestroy(e.h)))
	}
	runtime.AddCleanup(e, func(h uintptr) { s.d.destroyEvent(h) }, e.h)
	return e, nil
}

// Wait implements device.Stream.
func (s *Stream) Wait(ev device.Event) error {
	e, ok := ev.(*Event)
	if !ok {
		// A host event (completed) needs no waiting.
		return ev.Synchronize()
	}
	unlock, err := s.enter()
	if err != nil {
		return err
	}
	defer unlock()
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
	unlock, err := e.d.enter()
	if err != nil {
		return err
	}
	defer unlock()
	counts.syncs.Add(1)
	return check("cuEventSynchronize", drv.cuEventSynchronize(e.h))
}

// Done reports whether the work before the event has completed, without
// waiting (an error counts as done: the next wait reports it).
func (e *Event) Done() bool {
	unlock, err := e.d.enter()
	if err != nil {
		return true
	}
	defer unlock()
	return drv.cuEventQuery(e.h) != errNotReady
}

// Time implements device.Event: the anchor's host time plus the device
// time elapsed from the anchor to the event. The driver's failure to
// measure it (cuEventElapsedTime: the event not completed, or recorded
// without timing) is the error.
func (e *Event) Time() (time.Time, error) {
	unlock, err := e.d.enter()
	if err != nil {
		return time.Time{}, err
	}
	defer unlock()
	var ms float32
	if err := check("cuEventElapsedTime", drv.cuEventElapsedTime(&ms, e.anchor.ev, e.h)); err != nil {
		return time.Time{}, fmt.Errorf("cuda: timing an event on %v (synchronize the event before reading its time): %w", e.d, err)
	}
	return e.anchor.host.Add(time.Duration(float64(ms) * float64(time.Millisecond))), nil
}
