package cuda

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/sparsegrad/sparsegrad/device"
)

// The CUDA driver API, bound at run time. Handles are opaque pointers;
// device addresses are 64-bit integers.

type cuResult int32

// driverTable is the driver's function table.
type driverTable struct {
	cuInit                    func(flags uint32) cuResult
	cuDriverGetVersion        func(v *int32) cuResult
	cuDeviceGetCount          func(n *int32) cuResult
	cuDeviceGet               func(d *int32, ordinal int32) cuResult
	cuDeviceGetName           func(name *byte, n int32, d int32) cuResult
	cuDeviceGetAttribute      func(v *int32, attr int32, d int32) cuResult
	cuDeviceTotalMem          func(bytes *uint64, d int32) cuResult
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, d int32) cuResult
	cuDevicePrimaryCtxRelease func(d int32) cuResult
	cuCtxSetCurrent           func(ctx uintptr) cuResult
	cuCtxSynchronize          func() cuResult
	cuMemAlloc                func(ptr *uint64, bytes uint64) cuResult
	cuMemFree                 func(ptr uint64) cuResult
	cuMemGetInfo              func(free, total *uint64) cuResult
	cuMemAllocHost            func(p *unsafe.Pointer, bytes uint64) cuResult
	cuMemcpyHtoDAsync         func(dst uint64, src unsafe.Pointer, bytes uint64, s uintptr) cuResult
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uint64, bytes uint64, s uintptr) cuResult
	cuMemcpyDtoDAsync         func(dst, src uint64, bytes uint64, s uintptr) cuResult
	cuMemcpyPeerAsync         func(dst uint64, dstCtx uintptr, src uint64, srcCtx uintptr, bytes uint64, s uintptr) cuResult
	cuDeviceCanAccessPeer     func(can *int32, d, peer int32) cuResult
	cuCtxEnablePeerAccess     func(peerCtx uintptr, flags uint32) cuResult
	cuMemsetD8Async           func(dst uint64, v uint8, n uint64, s uintptr) cuResult
	cuMemsetD32Async          func(dst uint64, v uint32, n uint64, s uintptr) cuResult
	cuStreamCreate            func(s *uintptr, flags uint32) cuResult
	cuStreamDestroy           func(s uintptr) cuResult
	cuStreamSynchronize       func(s uintptr) cuResult
	cuStreamWaitEvent         func(s, e uintptr, flags uint32) cuResult
	cuEventCreate             func(e *uintptr, flags uint32) cuResult
	cuEventDestroy            func(e uintptr) cuResult
	cuEventRecord             func(e, s uintptr) cuResult
	cuEventSynchronize        func(e uintptr) cuResult
	cuEventQuery              func(e uintptr) cuResult
	cuEventElapsedTime        func(ms *float32, start, end uintptr) cuResult
	cuModuleLoadData          func(m *uintptr, image unsafe.Pointer) cuResult
	cuModuleUnload            func(m uintptr) cuResult
	cuModuleGetFunction       func(f *uintptr, m uintptr, name *byte) cuResult
	cuLaunchKernel            func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, s uintptr, params unsafe.Pointer, extra unsafe.Pointer) cuResult
	cuEventRecordWithFlags    func(e, s uintptr, flags uint32) cuResult
	cuStreamBeginCapture      func(s uintptr, mode int32) cuResult
	cuStreamEndCapture        func(s uintptr, g *uintptr) cuResult
	cuGraphInstantiate        func(exec *uintptr, g uintptr, flags uint64) cuResult
	cuGraphLaunch             func(exec, s uintptr) cuResult
	cuGraphExecDestroy        func(exec uintptr) cuResult
	cuGraphDestroy            func(g uintptr) cuResult
	cuGetErrorName            func(r cuResult, s **byte) cuResult
	cuGetErrorString          func(r cuResult, s **byte) cuResult
}

// drv is the driver's functions (the emulator's in the package's tests on
// a machine without a GPU).
var drv driverTable

// Device attributes (CUdevice_attribute).
const (
	attrMaxThreadsPerBlock   = 1
	attrMultiprocessorCount  = 16
	attrComputeCapabilityMaj = 75
	attrComputeCapabilityMin = 76
)

const (
	streamNonBlocking   = 1 // CU_STREAM_NON_BLOCKING
	eventDefault        = 0 // CU_EVENT_DEFAULT: timing enabled
	eventRecordExternal = 1 // CU_EVENT_RECORD_EXTERNAL: a captured record is a node of the graph
	captureRelaxed      = 2 // CU_STREAM_CAPTURE_MODE_RELAXED
	eventNoTiming       = 2 // CU_EVENT_DISABLE_TIMING

	errNotReady cuResult = 600 // CUDA_ERROR_NOT_READY
	// errPeerEnabled is CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: another
	// Device of the GPU (the same primary context) enabled it before.
	errPeerEnabled cuResult = 704
	errContext     cuResult = 201 // CUDA_ERROR_INVALID_CONTEXT
)

// loadDriver loads libcuda and initialises it, once per process.
func loadDriver() error {
	driverOnce.Do(func() {
		h, path, err := libCUDA.open()
		if err != nil {
			driverErr = err
			return
		}
		fns := map[string]any{
			"cuInit":                       &drv.cuInit,
			"cuDriverGetVersion":           &drv.cuDriverGetVersion,
			"cuDeviceGetCount":             &drv.cuDeviceGetCount,
			"cuDeviceGet":                  &drv.cuDeviceGet,
			"cuDeviceGetName":              &drv.cuDeviceGetName,
			"cuDeviceGetAttribute":         &drv.cuDeviceGetAttribute,
			"cuDeviceTotalMem_v2":          &drv.cuDeviceTotalMem,
			"cuDevicePrimaryCtxRetain":     &drv.cuDevicePrimaryCtxRetain,
			"cuDevicePrimaryCtxRelease_v2": &drv.cuDevicePrimaryCtxRelease,
			"cuCtxSetCurrent":              &drv.cuCtxSetCurrent,
			"cuCtxSynchronize":             &drv.cuCtxSynchronize,
			"cuMemAlloc_v2":                &drv.cuMemAlloc,
			"cuMemFree_v2":                 &drv.cuMemFree,
			"cuMemGetInfo_v2":              &drv.cuMemGetInfo,
			"cuMemAllocHost_v2":            &drv.cuMemAllocHost,
			"cuMemcpyHtoDAsync_v2":         &drv.cuMemcpyHtoDAsync,
			"cuMemcpyDtoHAsync_v2":         &drv.cuMemcpyDtoHAsync,
			"cuMemcpyDtoDAsync_v2":         &drv.cuMemcpyDtoDAsync,
			"cuMemcpyPeerAsync":            &drv.cuMemcpyPeerAsync,
			"cuDeviceCanAccessPeer":        &drv.cuDeviceCanAccessPeer,
			"cuCtxEnablePeerAccess":        &drv.cuCtxEnablePeerAccess,
			"cuMemsetD8Async":              &drv.cuMemsetD8Async,
			"cuMemsetD32Async":             &drv.cuMemsetD32Async,
			"cuStreamCreate":               &drv.cuStreamCreate,
			"cuStreamDestroy_v2":           &drv.cuStreamDestroy,
			"cuStreamSynchronize":          &drv.cuStreamSynchronize,
			"cuStreamWaitEvent":            &drv.cuStreamWaitEvent,
			"cuEventCreate":                &drv.cuEventCreate,
			"cuEventDestroy_v2":            &drv.cuEventDestroy,
			"cuEventRecord":                &drv.cuEventRecord,
			"cuEventSynchronize":           &drv.cuEventSynchronize,
			"cuEventQuery":                 &drv.cuEventQuery,
			"cuEventElapsedTime_v2":        &drv.cuEventElapsedTime,
			"cuModuleLoadData":             &drv.cuModuleLoadData,
			"cuModuleUnload":               &drv.cuModuleUnload,
			"cuModuleGetFunction":          &drv.cuModuleGetFunction,
			"cuLaunchKernel":               &drv.cuLaunchKernel,
			"cuEventRecordWithFlags":       &drv.cuEventRecordWithFlags,
			"cuStreamBeginCapture_v2":      &drv.cuStreamBeginCapture,
			"cuStreamEndCapture":           &drv.cuStreamEndCapture,
			"cuGraphInstantiateWithFlags":  &drv.cuGraphInstantiate,
			"cuGraphLaunch":                &drv.cuGraphLaunch,
			"cuGraphExecDestroy":           &drv.cuGraphExecDestroy,
			"cuGraphDestroy":               &drv.cuGraphDestroy,
			"cuGetErrorName":               &drv.cuGetErrorName,
			"cuGetErrorString":             &drv.cuGetErrorString,
		}
		if err := bindDriver(h, path, fns); err != nil {
			driverErr = err
			return
		}
		hotDriver(h, &drv)
		if r := drv.cuInit(0); r != 0 {
			driverErr = fmt.Errorf("%w: the CUDA driver did not initialise: %v; check that the GPU is visible (nvidia-smi) and that the driver matches the kernel module", device.ErrUnavailable, r)
			return
		}
		var v int32
		if drv.cuDriverGetVersion(&v) == 0 {
			setLibraryVersion(libCUDA.what, fmt.Sprintf("CUDA %d.%d", v/1000, v%1000/10))
		}
	})
	return driverErr
}

// bindDriver binds the driver's functions; cuEventElapsedTime_v2 exists
// only in CUDA 12.8 and later, so the plain name is the fallback.
func bindDriver(h uintptr, path string, fns map[string]any) error {
	elapsed := fns["cuEventElapsedTime_v2"]
	if _, err := purego.Dlsym(h, "cuEventElapsedTime_v2"); err != nil {
		delete(fns, "cuEventElapsedTime_v2")
		fns["cuEventElapsedTime"] = elapsed
	}
	return bind(libCUDA, path, h, fns)
}

// hotDriver rebinds the functions of t that every launch, copy, event and
// wait calls to direct calls of the library's symbols (purego.SyscallN):
// the functions purego.RegisterLibFunc makes call through reflection,
// about 0.8 µs and 13 allocations a call, against 0.2 µs and one. A symbol
// the library lacks keeps its binding (a stub that says so).
func hotDriver(h uintptr, t *driverTable) {
	sym := func(name string) (uintptr, bool) {
		p, err := purego.Dlsym(h, name)
		return p, err == nil && p != 0
	}
	r := func(v uintptr) cuResult { return cuResult(int32(v)) }
	if p, ok := sym("cuLaunchKernel"); ok {
		t.cuLaunchKernel = func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, s uintptr, params, extra unsafe.Pointer) cuResult {
			v, _, _ := purego.SyscallN(p, f, uintptr(gx), uintptr(gy), uintptr(gz), uintptr(bx), uintptr(by), uintptr(bz), uintptr(shared), s, uintptr(params), uintptr(extra))
			return r(v)
		}
	}
	if p, ok := sym("cuCtxSetCurrent"); ok {
		t.cuCtxSetCurrent = func(ctx uintptr) cuResult { v, _, _ := purego.SyscallN(p, ctx); return r(v) }
	}
	if p, ok := sym("cuMemcpyHtoDAsync_v2"); ok {
		t.cuMemcpyHtoDAsync = func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) cuResult {
			v, _, _ := purego.SyscallN(p, uintptr(dst), uintptr(src), uintptr(n), s)
			return r(v)
		}
	}
	if p, ok := sym("cuMemcpyDtoHAsync_v2"); ok {
		t.cuMemcpyDtoHAsync = func(dst unsafe.Pointer, src uint64, n uint64, s uintptr) cuResult {
			v, _, _ := purego.SyscallN(p, uintptr(dst), uintptr(src), uintptr(n), s)
			return r(v)
		}
	}
	if p, ok := sym("cuMemcpyDtoDAsync_v2"); ok {
		t.cuMemcpyDtoDAsync = func(dst, src, n uint64, s uintptr) cuResult {
			v, _, _ := purego.SyscallN(p, uintptr(dst), uintptr(src), uintptr(n), s)
			return r(v)
		}
	}
	if p, ok := sym("cuMemsetD32Async"); ok {
		t.cuMemsetD32Async = func(dst uint64, x uint32, n uint64, s uintptr) cuResult {
			v, _, _ := purego.SyscallN(p, uintptr(dst), uintptr(x), uintptr(n), s)
			return r(v)
		}
	}
	if p, ok := sym("cuEventRecord"); ok {
		t.cuEventRecord = func(e, s uintptr) cuResult { v, _, _ := purego.SyscallN(p, e, s); return r(v) }
	}
	if p, ok := sym("cuEventRecordWithFlags"); ok {
		t.cuEventRecordWithFlags = func(e, s uintptr, flags uint32) cuResult {
			v, _, _ := purego.SyscallN(p, e, s, uintptr(flags))
			return r(v)
		}
	}
	if p, ok := sym("cuStreamWaitEvent"); ok {
		t.cuStreamWaitEvent = func(s, e uintptr, flags uint32) cuResult {
			v, _, _ := purego.SyscallN(p, s, e, uintptr(flags))
			return r(v)
		}
	}
	if p, ok := sym("cuEventQuery"); ok {
		t.cuEventQuery = func(e uintptr) cuResult { v, _, _ := purego.SyscallN(p, e); return r(v) }
	}
	if p, ok := sym("cuGraphLaunch"); ok {
		t.cuGraphLaunch = func(exec, s uintptr) cuResult { v, _, _ := purego.SyscallN(p, exec, s); return r(v) }
	}
	if p, ok := sym("cuStreamSynchronize"); ok {
		t.cuStreamSynchronize = func(s uintptr) cuResult { v, _, _ := purego.SyscallN(p, s); return r(v) }
	}
	if p, ok := sym("cuEventSynchronize"); ok {
		t.cuEventSynchronize = func(e uintptr) cuResult { v, _, _ := purego.SyscallN(p, e); return r(v) }
	}
	if p, ok := sym("cuEventCreate"); ok {
		t.cuEventCreate = func(e *uintptr, flags uint32) cuResult {
			v, _, _ := purego.SyscallN(p, uintptr(unsafe.Pointer(e)), uintptr(flags))
			return r(v)
		}
	}
	if p, ok := sym("cuEventDestroy_v2"); ok {
		t.cuEventDestroy = func(e uintptr) cuResult { v, _, _ := purego.SyscallN(p, e); return r(v) }
	}
}

// cString returns a NUL-terminated copy of s.
func cString(s string) *byte {
	b := append([]byte(s), 0)
	return &b[0]
}

// goString reads a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}

func (r cuResult) String() string {
	if r == missingSymbol {
		return "not in the loaded CUDA driver (too old a driver?)"
	}
	var name, desc *byte
	if drv.cuGetErrorName != nil {
		drv.cuGetErrorName(r, &name)
		drv.cuGetErrorString(r, &desc)
	}
	if name == nil {
		return fmt.Sprintf("CUDA error %d", int32(r))
	}
	return fmt.Sprintf("%s (%d): %s", goString(name), int32(r), goString(desc))
}

// check turns a driver result into an error naming the call.
func check(call string, r cuResult) error {
	if r == 0 {
		return nil
	}
	return fmt.Errorf("cuda: %s: %v", call, r)
}
