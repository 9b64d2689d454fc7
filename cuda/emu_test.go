package cuda

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// The GPU emulator. On a machine without a GPU, the package's tests run
// the whole GPU path — Open, the backend, the engine, the models — against
// fakes of the driver, cuBLAS and cuDNN whose device memory lives in a
// helper process. That process runs the real kernels.cu, compiled with g++
// against testdata/emu/emu.h, on CPU threads (blocks in turn, the threads
// of a block on real threads), and reference loops for SGEMM (with cuBLAS'
// column-major arguments) and the convolutions (with cuDNN's). What it
// proves: the kernels' indexing and arithmetic, the launch arguments, the
// cuBLAS and cuDNN argument conventions, the memory traffic. What it cannot
// prove: anything about the real driver, cuBLAS, cuDNN, timing or
// concurrency on a GPU.
//
// SPARSEGRAD_CUDA_EMULATOR=off disables it (the GPU tests then skip without
// a GPU).

// emulated reports whether the tests run on the emulator.
var emulated bool

// emuSrv is the emulator in use (nil without it).
var emuSrv *emu

// emuFree is the free memory the emulated GPUs report.
var emuFree uint64 = 7 << 30

// emuNoPeer makes the emulated GPUs answer that they cannot access each
// other's memory (PCIe without peer-to-peer); otherwise they can, as GPUs
// joined by NVLink. Their memory is the emulator's, shared, so it checks
// what the driver would refuse or fault on: a copy between two GPUs
// without peer access both ways, and a PeerSum kernel given another GPU's
// memory without peer access to it.
var emuNoPeer bool

func TestMain(m *testing.M) {
	srv, err := maybeEmulate()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cuda tests:", err)
		os.Exit(2)
	}
	code := m.Run()
	if srv != nil {
		srv.close()
	}
	os.Exit(code)
}

// Emulated tells the external tests whether they run on the emulator.
func Emulated() bool { return emulated }

// maybeEmulate starts the emulator and installs its fakes where there is
// no GPU; it returns the emulator (nil when the tests run without it), for
// TestMain to close after the tests.
func maybeEmulate() (*emu, error) {
	if os.Getenv("SPARSEGRAD_CUDA_EMULATOR") == "off" {
		return nil, nil
	}
	if _, err := Count(); err == nil {
		return nil, nil // a real driver: test the real thing
	}
	if _, _, err := NVRTCVersion(); err != nil {
		return nil, nil // Open needs NVRTC; the GPU tests skip, TestKernelsCompile says why
	}
	srv, err := buildEmulator()
	if err != nil {
		return nil, fmt.Errorf("building the GPU emulator: %w", err)
	}
	installFakes(srv)
	installNCCLFakes(srv)
	emulated, emuSrv = true, srv
	fmt.Fprintln(os.Stderr, "cuda tests: no GPU; running the GPU path on the emulator (kernels.cu compiled with g++, run on CPU threads)")
	return srv, nil
}

// kernelSig is one kernel's parameters' sizes in bytes, in order.
type kernelSig []int

var sigRE = regexp.MustCompile(`extern "C" __global__ void (\w+)\(([^)]*)\)`)

// parseKernels reads every kernel's signature from the source.
func parseKernels(src string) (map[string]kernelSig, map[string][]string, error) {
	sigs, types := map[string]kernelSig{}, map[string][]string{}
	for _, m := range sigRE.FindAllStringSubmatch(src, -1) {
		var sig kernelSig
		var ts []string
		for _, p := range strings.Split(m[2], ",") {
			p = strings.TrimSpace(p)
			i := strings.LastIndexAny(p, " *")
			typ := strings.TrimSpace(p[:i+1])
			switch {
			case strings.Contains(typ, "*"), typ == "i64", typ == "double":
				sig = append(sig, 8)
			case typ == "int", typ == "float":
				sig = append(sig, 4)
			default:
				return nil, nil, fmt.Errorf("kernel %s: parameter type %q", m[1], typ)
			}
			ts = append(ts, typ)
		}
		sigs[m[1]], types[m[1]] = sig, ts
	}
	return sigs, types, nil
}

// ptrArgs says which parameters of each kernel are pointers.
func ptrArgs(types map[string][]string) map[string][]bool {
	out := map[string][]bool{}
	for name, ts := range types {
		for _, t := range ts {
			out[name] = append(out[name], strings.Contains(t, "*"))
		}
	}
	return out
}

// barrierKernels finds the kernels of src that reach __syncthreads, in
// their own body or through the device functions they call: the emulator
// runs their threads as fibers, and the others' threads as plain calls.
func barrierKernels(src string) map[string]bool {
	defs := regexp.MustCompile(`__(?:global|device)__[^;{(]*?(\w+)\(`).FindAllStringSubmatchIndex(src, -1)
	bodies := map[string]string{}
	for _, m := range defs {
		name := src[m[2]:m[3]]
		open := strings.IndexAny(src[m[1]:], "{;")
		if open < 0 || src[m[1]+open] != '{' {
			continue // a declaration
		}
		i, depth := m[1]+open, 0
		for j := i; j < len(src); j++ {
			if src[j] == '{' {
				depth++
			} else if src[j] == '}' {
				if depth--; depth == 0 {
					bodies[name] = src[i : j+1]
					break
				}
			}
		}
	}
	sync := map[string]bool{}
	for name, b := range bodies {
		sync[name] = strings.Contains(b, "__syncthreads")
	}
	for changed := true; changed; {
		changed = false
		for name, b := range bodies {
			if sync[name] {
				continue
			}
			for callee, s := range sync {
				if s && regexp.MustCompile(`\b`+callee+`\s*\(`).MatchString(b) {
					sync[name], changed = true, true
					break
				}
			}
		}
	}
	return sync
}

// emu is the client of the emulator process.
type emu struct {
	mu   sync.Mutex
	w    *bufio.Writer
	r    *bufio.Reader
	sigs map[string]kernelSig

	proc *exec.Cmd          // the emulator process, in a process group of its own
	stop context.CancelFunc // kills proc's group
	dir  string             // the build's folder

	handles uintptr
	fnNames map[uintptr]string
	events  map[uintptr]time.Time
	tensors map[uintptr][4]int32 // cuDNN tensor and filter descriptors
	convs   map[uintptr][2]int32 // pad, stride

	// Graph capture: the work issued on a capturing stream is recorded;
	// graphs and their instances are lists of that work.
	capturing map[uintptr][]func()
	graphs    map[uintptr][]func()
	libStream map[uintptr]uintptr // cuBLAS and cuDNN handles → their stream
	planned   map[[3]uintptr]bool // library calls made once outside a capture
	// Copies from host memory not yet made: a copy reads its source when
	// its stream reaches it (the next work, record or synchronisation on
	// the stream), not when it is issued, as with pinned memory; a host
	// buffer reused before then uploads its new contents.
	uploads map[uintptr][]func()
	// pinned is the page-locked host memory handed out (never freed).
	pinned [][]byte
	// Contexts: each emulated GPU's primary context is its ordinal + 1;
	// current is the context current on each OS thread, peerOn the peer
	// access enabled (from the first context to the second's memory).
	current map[int]uintptr
	peerOn  map[[2]uintptr]bool
	// allocs are the device allocations, by address, with the context
	// each was made in; ptrArgs says which parameters of each kernel are
	// pointers.
	allocs  []emuAlloc
	ptrArgs map[string][]bool

	// Work that completes later (the fake NCCL's transfers): per stream,
	// and what each recorded event waits for.
	pending    map[uintptr][]pending
	eventWaits map[uintptr][]pending
}

// emuAlloc is a device allocation of the emulator: [base, end), made in
// context ctx.
type emuAlloc struct {
	base, end uint64
	ctx       uintptr
}

// ctxOf returns the context device address p was allocated in (0: none
// known). Call it with e.mu held.
func (e *emu) ctxOf(p uint64) uintptr {
	i, _ := slices.BinarySearchFunc(e.allocs, p, func(a emuAlloc, p uint64) int { return cmp.Compare(a.base, p) })
	if i < len(e.allocs) && e.allocs[i].base == p {
		return e.allocs[i].ctx
	}
	if i > 0 && p < e.allocs[i-1].end {
		return e.allocs[i-1].ctx
	}
	return 0
}

// exec runs f now, or records it when stream s is capturing a graph.
// Work posted on s before (an NCCL transfer, or one s waits for) is
// waited for first: the emulator runs a stream's work in its order.
func (e *emu) exec(s uintptr, f func()) {
	e.mu.Lock()
	if ops, ok := e.capturing[s]; ok {
		e.capturing[s] = append(ops, f)
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	e.settle(s)
	e.flush(s)
	f()
}

// settle waits for the work posted on stream s that completes later.
func (e *emu) settle(s uintptr) { waitAll(e.eventPending(s)) }

func (e *emu) isCapturing(s uintptr) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.capturing[s]
	return ok
}

// flush makes the copies from host memory issued on stream s.
func (e *emu) flush(s uintptr) {
	e.mu.Lock()
	ups := e.uploads[s]
	delete(e.uploads, s)
	e.mu.Unlock()
	for _, u := range ups {
		u()
	}
}

// plan models a library's first call with one configuration (a cuBLAS
// handle; a cuDNN handle, convolution and direction): cuBLAS and cuDNN
// choose and load kernels, and may allocate, on that call, which a stream
// capture must not contain. It reports false when the first call comes
// inside a capture.
func (e *emu) plan(s uintptr, key [3]uintptr) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.planned[key] {
		return true
	}
	if _, capturing := e.capturing[s]; capturing {
		return false
	}
	e.planned[key] = true
	return true
}

func (e *emu) streamOf(h uintptr) uintptr {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.libStream[h]
}

// emuBuildLimit bounds the emulator's build with g++.
const emuBuildLimit = 5 * time.Minute

func buildEmulator() (*emu, error) {
	gxx, err := exec.LookPath("g++")
	if err != nil {
		return nil, fmt.Errorf("g++ not found (Debian: apt-get install g++): %w", err)
	}
	source := emulatedSource()
	sigs, types, err := parseKernels(source)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sparsegrad-emu")
	if err != nil {
		return nil, err
	}
	// server.cpp includes kernels.cu: the build's, with the methods'
	// kernels after the package's (dir is searched first).
	if err := os.WriteFile(filepath.Join(dir, "kernels.cu"), []byte(source), 0o644); err != nil {
		return nil, err
	}
	barriers := barrierKernels(source)
	var inc strings.Builder
	inc.WriteString("static void registerKernels() {\n")
	for name, ts := range types {
		fmt.Fprintf(&inc, "  kernels[%q] = {%v, [](Params& p) -> std::function<void()> {\n", name, barriers[name])
		var args []string
		for i, t := range ts {
			fmt.Fprintf(&inc, "    auto a%d = p.next<%s>();\n", i, t)
			args = append(args, fmt.Sprintf("a%d", i))
		}
		fmt.Fprintf(&inc, "    return [=] { %s(%s); };\n  }};\n", name, strings.Join(args, ", "))
	}
	inc.WriteString("}\n")
	if err := os.WriteFile(filepath.Join(dir, "dispatch.inc"), []byte(inc.String()), 0o644); err != nil {
		return nil, err
	}
	src, _ := filepath.Abs("testdata/emu")
	pkg, _ := filepath.Abs(".")
	bin := filepath.Join(dir, "emu")
	// The build and the emulator run for the whole of TestMain, not for one
	// test: testenv.CommandContext kills each with its process group when
	// its context ends (the build's at its limit, the emulator's at close).
	ctx, cancel := context.WithTimeout(context.Background(), emuBuildLimit)
	defer cancel()
	cmd := testenv.CommandContext(ctx, gxx, "-std=c++20", "-O2", "-pthread", "-I", src, "-I", dir, "-I", pkg, "-o", bin, filepath.Join(src, "server.cpp"))
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("g++ ran past its limit of %v and was killed: %w\n%s", emuBuildLimit, err, out)
		}
		return nil, fmt.Errorf("g++: %w\n%s", err, out)
	}
	life, stop := context.WithCancel(context.Background())
	proc := testenv.CommandContext(life, bin)
	stdin, err := proc.StdinPipe()
	if err != nil {
		stop()
		return nil, err
	}
	stdout, err := proc.StdoutPipe()
	if err != nil {
		stop()
		return nil, err
	}
	proc.Stderr = os.Stderr
	if err := proc.Start(); err != nil {
		stop()
		return nil, err
	}
	return &emu{proc: proc, stop: stop, dir: dir, w: bufio.NewWriter(stdin), r: bufio.NewReader(stdout), sigs: sigs, fnNames: map[uintptr]string{},
		events: map[uintptr]time.Time{}, tensors: map[uintptr][4]int32{}, convs: map[uintptr][2]int32{}, handles: 100,
		capturing: map[uintptr][]func(){}, graphs: map[uintptr][]func(){}, libStream: map[uintptr]uintptr{}, planned: map[[3]uintptr]bool{}, uploads: map[uintptr][]func(){},
		pending: map[uintptr][]pending{}, eventWaits: map[uintptr][]pending{}, current: map[int]uintptr{}, peerOn: map[[2]uintptr]bool{}, ptrArgs: ptrArgs(types)}, nil
}

// close ends the emulator process and removes its build: the process
// group is killed, and Wait returns once it is gone (or, with a grandchild
// holding its output, ten seconds later).
func (e *emu) close() {
	e.stop()
	e.proc.Wait() // the error is the kill's
	os.RemoveAll(e.dir)
}

// call sends one request and reads the status and n bytes of reply.
func (e *emu) call(op byte, n int, fields ...any) ([]byte, error) {
	e.w.WriteByte(op)
	for _, f := range fields {
		switch v := f.(type) {
		case []byte:
			e.w.Write(v)
		default:
			binary.Write(e.w, binary.LittleEndian, v)
		}
	}
	if err := e.w.Flush(); err != nil {
		return nil, err
	}
	st, err := e.r.ReadByte()
	if err != nil {
		return nil, err
	}
	if st != 0 {
		return nil, fmt.Errorf("emulator: request %d failed with status %d", op, st)
	}
	out := make([]byte, n)
	_, err = io.ReadFull(e.r, out)
	return out, err
}

func (e *emu) must(op byte, n int, fields ...any) []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	out, err := e.call(op, n, fields...)
	if err != nil {
		panic(err)
	}
	return out
}

func (e *emu) handle() uintptr {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.handles++
	return e.handles
}

// installFakes points the driver, cuBLAS and cuDNN tables at the emulator.
func installFakes(e *emu) {
	ok := cuResult(0)
	// maybeEmulate tried the real driver first.
	driverOnce, driverErr = sync.Once{}, nil
	driverOnce.Do(func() {
		for _, l := range []struct{ what, version string }{{libCUDA.what, "CUDA 13.0"}, {libCUBLAS.what, "13.0.0"}, {libCUDNN.what, "9.10.2"}} {
			recordLibrary(l.what, "emulator", nil)
			setLibraryVersion(l.what, l.version)
		}
		drv.cuInit = func(uint32) cuResult { return ok }
		drv.cuDriverGetVersion = func(v *int32) cuResult { *v = 13000; return ok }
		drv.cuDeviceGetCount = func(n *int32) cuResult { *n = int32(emuGPUs); return ok }
		drv.cuDeviceGet = func(d *int32, o int32) cuResult { *d = o; return ok }
		drv.cuDeviceGetName = func(name *byte, n int32, _ int32) cuResult {
			b := unsafe.Slice(name, n)
			copy(b, "Emulated GPU (kernels on CPU threads)\x00")
			return ok
		}
		drv.cuDeviceGetAttribute = func(v *int32, attr int32, _ int32) cuResult {
			switch attr {
			case attrComputeCapabilityMaj:
				*v = 9
			case attrComputeCapabilityMin:
				*v = 0
			case attrMultiprocessorCount:
				*v = 2
			default:
				*v = 1024
			}
			return ok
		}
		drv.cuDeviceTotalMem = func(b *uint64, _ int32) cuResult { *b = 8 << 30; return ok }
		drv.cuDevicePrimaryCtxRetain = func(c *uintptr, d int32) cuResult { *c = uintptr(d) + 1; return ok }
		drv.cuDevicePrimaryCtxRelease = func(int32) cuResult { return ok }
		drv.cuCtxSetCurrent = func(c uintptr) cuResult {
			e.mu.Lock()
			e.current[syscall.Gettid()] = c
			e.mu.Unlock()
			return ok
		}
		drv.cuDeviceCanAccessPeer = func(can *int32, d, peer int32) cuResult {
			*can = 0
			if !emuNoPeer && d != peer {
				*can = 1
			}
			return ok
		}
		drv.cuCtxEnablePeerAccess = func(peer uintptr, flags uint32) cuResult {
			e.mu.Lock()
			defer e.mu.Unlock()
			cur := e.current[syscall.Gettid()]
			switch {
			case cur == 0 || peer == cur || peer == 0 || peer > uintptr(emuGPUs) || flags != 0:
				return 1 // CUDA_ERROR_INVALID_VALUE
			case emuNoPeer:
				return 217 // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
			case e.peerOn[[2]uintptr{cur, peer}]:
				return errPeerEnabled
			}
			e.peerOn[[2]uintptr{cur, peer}] = true
			return ok
		}
		// Stricter than the driver, which would copy through host memory
		// without peer access: the package copies between GPUs only where
		// Device.Reaches has enabled it both ways.
		drv.cuMemcpyPeerAsync = func(dst uint64, dctx uintptr, src uint64, sctx uintptr, n uint64, s uintptr) cuResult {
			e.mu.Lock()
			on := e.peerOn[[2]uintptr{dctx, sctx}] && e.peerOn[[2]uintptr{sctx, dctx}]
			e.mu.Unlock()
			if !on {
				return 1
			}
			e.exec(s, func() { e.must(5, 0, dst, src, n) })
			return ok
		}
		drv.cuCtxSynchronize = func() cuResult {
			e.mu.Lock()
			var streams []uintptr
			for s := range e.uploads {
				streams = append(streams, s)
			}
			e.mu.Unlock()
			for _, s := range streams {
				e.flush(s)
			}
			return ok
		}
		drv.cuMemAlloc = func(p *uint64, n uint64) cuResult {
			*p = binary.LittleEndian.Uint64(e.must(1, 8, n))
			e.mu.Lock()
			a := emuAlloc{base: *p, end: *p + n, ctx: e.current[syscall.Gettid()]}
			i, _ := slices.BinarySearchFunc(e.allocs, a.base, func(a emuAlloc, p uint64) int { return cmp.Compare(a.base, p) })
			e.allocs = slices.Insert(e.allocs, i, a)
			e.mu.Unlock()
			return ok
		}
		drv.cuMemFree = func(p uint64) cuResult {
			e.must(2, 0, p)
			e.mu.Lock()
			if i, found := slices.BinarySearchFunc(e.allocs, p, func(a emuAlloc, p uint64) int { return cmp.Compare(a.base, p) }); found {
				e.allocs = slices.Delete(e.allocs, i, i+1)
			}
			e.mu.Unlock()
			return ok
		}
		drv.cuMemAllocHost = func(p *unsafe.Pointer, n uint64) cuResult {
			b := make([]byte, n)
			e.mu.Lock()
			e.pinned = append(e.pinned, b) // kept, as page-locked memory is
			e.mu.Unlock()
			*p = unsafe.Pointer(&b[0])
			return ok
		}
		drv.cuMemGetInfo = func(f, t *uint64) cuResult { *f, *t = emuFree, 8<<30; return ok }
		// Copies from or to pageable host memory cannot be captured.
		drv.cuMemcpyHtoDAsync = func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) cuResult {
			if e.isCapturing(s) {
				return 900 // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
			}
			e.mu.Lock()
			e.uploads[s] = append(e.uploads[s], func() { e.must(3, 0, dst, n, unsafe.Slice((*byte)(src), n)) })
			e.mu.Unlock()
			return ok
		}
		drv.cuMemcpyDtoHAsync = func(dst unsafe.Pointer, src uint64, n uint64, s uintptr) cuResult {
			if e.isCapturing(s) {
				return 900
			}
			e.settle(s)
			e.flush(s)
			copy(unsafe.Slice((*byte)(dst), n), e.must(4, int(n), src, n))
			return ok
		}
		drv.cuMemcpyDtoDAsync = func(dst, src, n uint64, s uintptr) cuResult {
			e.exec(s, func() { e.must(5, 0, dst, src, n) })
			return ok
		}
		drv.cuMemsetD8Async = func(dst uint64, v uint8, n uint64, s uintptr) cuResult {
			e.settle(s)
			// Whole words, then the bytes after them (a buffer of an odd
			// number of halves).
			if n >= 4 {
				e.must(6, 0, dst, uint32(v)*0x01010101, n/4)
			}
			if tail := n % 4; tail != 0 {
				b := make([]byte, tail)
				for i := range b {
					b[i] = v
				}
				e.must(3, 0, dst+n-tail, tail, b)
			}
			return ok
		}
		drv.cuMemsetD32Async = func(dst uint64, v uint32, n uint64, s uintptr) cuResult {
			e.exec(s, func() { e.must(6, 0, dst, v, n) })
			return ok
		}
		drv.cuStreamCreate = func(s *uintptr, _ uint32) cuResult { *s = e.handle(); return ok }
		drv.cuStreamDestroy = func(uintptr) cuResult { return ok }
		drv.cuStreamSynchronize = func(s uintptr) cuResult { e.settle(s); e.flush(s); return ok }
		drv.cuStreamWaitEvent = func(s, h uintptr, _ uint32) cuResult {
			e.mu.Lock()
			e.pending[s] = append(e.pending[s], e.eventWaits[h]...)
			e.mu.Unlock()
			return ok
		}
		drv.cuEventCreate = func(ev *uintptr, _ uint32) cuResult { *ev = e.handle(); return ok }
		drv.cuEventDestroy = func(h uintptr) cuResult {
			e.mu.Lock()
			delete(e.events, h)
			delete(e.eventWaits, h)
			e.mu.Unlock()
			return ok
		}
		record := func(h uintptr) {
			e.mu.Lock()
			e.events[h] = time.Now()
			e.mu.Unlock()
		}
		drv.cuEventRecord = func(h, s uintptr) cuResult {
			if e.isCapturing(s) {
				return 900 // a plain record is not a node of the graph
			}
			e.flush(s)
			record(h)
			w := e.eventPending(s)
			e.mu.Lock()
			e.eventWaits[h] = w
			e.mu.Unlock()
			return ok
		}
		drv.cuEventQuery = func(h uintptr) cuResult {
			e.mu.Lock()
			w := e.eventWaits[h]
			e.mu.Unlock()
			if !allDone(w) {
				return errNotReady
			}
			return ok
		}
		drv.cuEventRecordWithFlags = func(h, s uintptr, flags uint32) cuResult {
			if flags != eventRecordExternal {
				return 1
			}
			e.exec(s, func() { record(h) })
			return ok
		}
		drv.cuStreamBeginCapture = func(s uintptr, mode int32) cuResult {
			e.mu.Lock()
			defer e.mu.Unlock()
			if _, ok := e.capturing[s]; ok || mode != captureRelaxed {
				return 1
			}
			e.capturing[s] = []func(){}
			return ok
		}
		drv.cuStreamEndCapture = func(s uintptr, g *uintptr) cuResult {
			e.mu.Lock()
			ops, found := e.capturing[s]
			delete(e.capturing, s)
			e.mu.Unlock()
			if !found {
				return 1
			}
			h := e.handle()
			e.mu.Lock()
			e.graphs[h] = ops
			e.mu.Unlock()
			*g = h
			return ok
		}
		drv.cuGraphInstantiate = func(exec *uintptr, g uintptr, _ uint64) cuResult { *exec = g; return ok }
		drv.cuGraphLaunch = func(exec, s uintptr) cuResult {
			e.mu.Lock()
			ops := e.graphs[exec]
			e.mu.Unlock()
			e.exec(s, func() {
				for _, f := range ops {
					f()
				}
			})
			return ok
		}
		drv.cuGraphExecDestroy = func(uintptr) cuResult { return ok }
		drv.cuGraphDestroy = func(g uintptr) cuResult {
			e.mu.Lock()
			delete(e.graphs, g)
			e.mu.Unlock()
			return ok
		}
		drv.cuEventSynchronize = func(h uintptr) cuResult {
			e.mu.Lock()
			w := e.eventWaits[h]
			e.mu.Unlock()
			waitAll(w)
			return ok
		}
		drv.cuEventElapsedTime = func(ms *float32, a, b uintptr) cuResult {
			e.mu.Lock()
			defer e.mu.Unlock()
			ta, oka := e.events[a]
			tb, okb := e.events[b]
			if !oka || !okb {
				return 600 // CUDA_ERROR_NOT_READY
			}
			*ms = float32(tb.Sub(ta).Seconds() * 1e3)
			return ok
		}
		drv.cuModuleLoadData = func(m *uintptr, _ unsafe.Pointer) cuResult { *m = 1; return ok }
		drv.cuModuleUnload = func(uintptr) cuResult { return ok }
		drv.cuModuleGetFunction = func(f *uintptr, _ uintptr, name *byte) cuResult {
			n := goString(name)
			if _, found := e.sigs[n]; !found {
				return 500 // CUDA_ERROR_NOT_FOUND
			}
			h := e.handle()
			e.mu.Lock()
			e.fnNames[h] = n
			e.mu.Unlock()
			*f = h
			return ok
		}
		drv.cuLaunchKernel = func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, s uintptr, params, _ unsafe.Pointer) cuResult {
			e.mu.Lock()
			name := e.fnNames[f]
			e.mu.Unlock()
			if gy != 1 || gz != 1 || by != 1 || bz != 1 || shared != 0 || gx == 0 || bx == 0 || bx > 1024 {
				return 1 // CUDA_ERROR_INVALID_VALUE
			}
			sig := e.sigs[name]
			ptrs := unsafe.Slice((*unsafe.Pointer)(params), len(sig))
			if strings.HasPrefix(name, "k_peer_sum") && !e.peersReached(name, ptrs) {
				return 1 // the driver would fault reading another GPU's memory
			}
			fields := []any{uint32(len(name)), []byte(name), gx, bx, uint32(len(sig))}
			for i, n := range sig {
				fields = append(fields, uint32(n), append([]byte(nil), unsafe.Slice((*byte)(ptrs[i]), n)...))
			}
			e.exec(s, func() { e.must(7, 0, fields...) })
			return ok
		}
		drv.cuGetErrorName = func(cuResult, **byte) cuResult { return ok }
		drv.cuGetErrorString = func(cuResult, **byte) cuResult { return ok }
	})
	cublasOnce.Do(func() {
		cublas.create = func(h *uintptr) int32 { *h = e.handle(); return 0 }
		cublas.destroy = func(uintptr) int32 { return 0 }
		cublas.setStream = func(h, s uintptr) int32 {
			e.mu.Lock()
			e.libStream[h] = s
			e.mu.Unlock()
			return 0
		}
		cublas.setMathMode = func(uintptr, int32) int32 { return 0 }
		cublas.getVersion = func(_ uintptr, v *int32) int32 { *v = 130000; return 0 }
		cublas.sgemm = func(h uintptr, ta, tb int32, m, n, k int32, alpha *float32, a uintptr, lda int32, b uintptr, ldb int32, beta *float32, c uintptr, ldc int32) int32 {
			al, be := *alpha, *beta
			if !e.plan(e.streamOf(h), [3]uintptr{h}) {
				return 14 // CUBLAS_STATUS_INTERNAL_ERROR: cuBLAS' first call on a handle, inside a capture
			}
			e.exec(e.streamOf(h), func() { e.must(8, 0, ta, tb, m, n, k, al, uint64(a), lda, uint64(b), ldb, be, uint64(c), ldc) })
			return 0
		}
	})
	cudnnOnce.Do(func() {
		cudnn.create = func(h *uintptr) int32 { *h = e.handle(); return 0 }
		cudnn.destroy = func(uintptr) int32 { return 0 }
		noDesc := func(uintptr) int32 { return 0 }
		cudnn.destroyTensor, cudnn.destroyFilter, cudnn.destroyConv = noDesc, noDesc, noDesc
		cudnn.setStream = func(h, s uintptr) int32 {
			e.mu.Lock()
			e.libStream[h] = s
			e.mu.Unlock()
			return 0
		}
		cudnn.getVersion = func() uint64 { return 90100 }
		cudnn.getErrorString = func(int32) *byte { return nil }
		newDesc := func(d *uintptr) int32 { *d = e.handle(); return 0 }
		cudnn.createTensor, cudnn.createFilter, cudnn.createConv = newDesc, newDesc, newDesc
		cudnn.setTensor4d = func(d uintptr, format, dtype, n, c, h, w int32) int32 {
			if format != cudnnNCHW || dtype != cudnnFloat {
				return 3 // CUDNN_STATUS_BAD_PARAM
			}
			e.mu.Lock()
			e.tensors[d] = [4]int32{n, c, h, w}
			e.mu.Unlock()
			return 0
		}
		cudnn.setFilter4d = func(d uintptr, dtype, format, k, c, h, w int32) int32 {
			if format != cudnnNCHW || dtype != cudnnFloat || h != w {
				return 3
			}
			e.mu.Lock()
			e.tensors[d] = [4]int32{k, c, h, w}
			e.mu.Unlock()
			return 0
		}
		cudnn.setConv2d = func(d uintptr, padH, padW, u, v, dilH, dilW, mode, dtype int32) int32 {
			if padH != padW || u != v || dilH != 1 || dilW != 1 || mode != cudnnCrossCorr || dtype != cudnnFloat {
				return 3
			}
			e.mu.Lock()
			e.convs[d] = [2]int32{padH, u}
			e.mu.Unlock()
			return 0
		}
		cudnn.setConvMath = func(uintptr, int32) int32 { return 0 }
		algo := func(ret *int32, perf unsafe.Pointer) int32 {
			p := (*algoPerf)(perf)
			*p = algoPerf{algo: 0, status: 0, determinism: cudnnDeterministic}
			*ret = 1
			return 0
		}
		cudnn.fwdAlgo = func(_, _, _, _, _ uintptr, _ int32, ret *int32, perf unsafe.Pointer) int32 { return algo(ret, perf) }
		// Find ranks by time: the fastest needs 2 GiB of scratch (over the
		// limit), the next is not deterministic, a failed one, then a
		// deterministic one (the emulator's convolution is the same for
		// every algorithm).
		find := func(_, _, _, _, _ uintptr, req int32, ret *int32, perf unsafe.Pointer) int32 {
			ps := unsafe.Slice((*algoPerf)(perf), req)
			list := []algoPerf{
				{algo: 5, time: 0.1, memory: 2 << 30, determinism: cudnnDeterministic},
				{algo: 1, time: 0.2, memory: 1 << 20},
				{algo: 3, status: 9},
				{algo: 0, time: 0.5, determinism: cudnnDeterministic},
			}
			*ret = int32(copy(ps, list))
			return 0
		}
		cudnn.findFwd, cudnn.findBwdData, cudnn.findBwdFilter = find, find, find
		cudnn.bwdDataAlgo, cudnn.bwdFilterAlgo = cudnn.fwdAlgo, cudnn.fwdAlgo
		noWS := func(_, _, _, _, _ uintptr, _ int32, size *uint64) int32 { *size = 0; return 0 }
		cudnn.fwdWorkspace, cudnn.bwdDataWorkspace, cudnn.bwdFilterWorkspace = noWS, noWS, noWS
		// conv runs one convolution: the shapes of x (N C H W) and of the
		// filter (K C R R), the convolution's padding and stride.
		conv := func(h uintptr, which int32, xd, wd, cd uintptr, x, w, y uintptr) int32 {
			e.mu.Lock()
			xs, ws, cs := e.tensors[xd], e.tensors[wd], e.convs[cd]
			e.mu.Unlock()
			if xs[1] != ws[1] {
				return 3
			}
			if !e.plan(e.streamOf(h), [3]uintptr{h, cd, uintptr(which) + 1}) {
				return 8 // CUDNN_STATUS_EXECUTION_FAILED: planned inside a capture
			}
			e.exec(e.streamOf(h), func() {
				e.must(9, 0, which, xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], cs[0], cs[1], uint64(x), uint64(w), uint64(y))
			})
			return 0
		}
		cudnn.forward = func(h uintptr, alpha unsafe.Pointer, xd, x, wd, w, cd uintptr, _ int32, _ uintptr, _ uint64, beta unsafe.Pointer, _, y uintptr) int32 {
			if *(*float32)(alpha) != 1 || *(*float32)(beta) != 0 {
				return 3
			}
			return conv(h, 0, xd, wd, cd, x, w, y)
		}
		cudnn.backwardData = func(h uintptr, alpha unsafe.Pointer, wd, w, _, dy, cd uintptr, _ int32, _ uintptr, _ uint64, beta unsafe.Pointer, dxd, dx uintptr) int32 {
			if *(*float32)(alpha) != 1 || *(*float32)(beta) != 0 {
				return 3
			}
			return conv(h, 1, dxd, wd, cd, dx, w, dy)
		}
		cudnn.backwardFilter = func(h uintptr, alpha unsafe.Pointer, xd, x, _, dy, cd uintptr, _ int32, _ uintptr, _ uint64, beta unsafe.Pointer, dwd, dw uintptr) int32 {
			if *(*float32)(alpha) != 1 || *(*float32)(beta) != 0 {
				return 3
			}
			return conv(h, 2, xd, dwd, cd, x, dw, dy)
		}
	})
}

// peersReached reports whether the pointer arguments of a launch of
// kernel name are memory of the current context or of contexts it has
// peer access to.
func (e *emu) peersReached(name string, args []unsafe.Pointer) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	cur := e.current[syscall.Gettid()]
	for i, isPtr := range e.ptrArgs[name] {
		if !isPtr {
			continue
		}
		if c := e.ctxOf(*(*uint64)(args[i])); c != 0 && c != cur && !e.peerOn[[2]uintptr{cur, c}] {
			return false
		}
	}
	return true
}

// TestEmulatorKernelsParse checks that every kernel's signature is
// understood (the emulator and its launch marshalling depend on it).
func TestEmulatorKernelsParse(t *testing.T) {
	sigs, _, err := parseKernels(emulatedSource())
	if err != nil {
		t.Fatal(err)
	}
	if len(sigs) < 25 {
		t.Fatalf("found %d kernels", len(sigs))
	}
	// The emulator runs the threads of kernels with barriers as fibers:
	// every kernel is classified, and barriers reached through device
	// functions count (block_sum, scan256x2).
	sync := barrierKernels(emulatedSource())
	for name := range sigs {
		if _, ok := sync[name]; !ok {
			t.Errorf("kernel %s: its body was not found", name)
		}
	}
	for name, want := range map[string]bool{"k_binary": false, "k_gather": false, "k_sel_count": true, "k_sel_pick": true, "k_bn_part": true, "k_sum_partials": true, "k_iota": false} {
		if sync[name] != want {
			t.Errorf("kernel %s: reaches __syncthreads = %v, want %v", name, sync[name], want)
		}
	}
	if !emulated {
		t.Skip("a real GPU or no NVRTC: the emulator is not in use")
	}
	_ = math.Pi
	_ = device.CPU
}
