// Package dnnl owns the run-time loading of oneDNN (the oneAPI Deep Neural
// Network Library, formerly DNNL/MKL-DNN): it opens libdnnl.so.2 with dlopen
// through github.com/ebitengine/purego — no cgo, no headers, no link-time
// dependency — and exposes the small part of oneDNN 2.x's C API the CPU
// backend uses: memory descriptors, convolution (forward, backward data,
// backward weights), batch normalisation (forward, backward), ReLU's
// backward, reorders, primitives with user-provided scratchpads, and the
// thread count of oneDNN's OpenMP runtime.
//
// A binary built with plain `go build` therefore runs everywhere and uses
// oneDNN where Debian's libdnnl2 (or any oneDNN 2.x build) is installed.
// oneDNN 3.x (libdnnl.so.3) changed the C API (opaque memory descriptors, no
// operation descriptors) and is not loaded.
//
// The values of the API's enums and the sizes of its structures are those
// of oneDNN 2.x's dnnl_types.h, which oneDNN keeps stable within a major
// version.
package dnnl

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/internal/native/dynlib"
)

// EnvLibrary names an environment variable holding the path (or file name)
// of the oneDNN library to load instead of searching the default names.
const EnvLibrary = "SPARSEGRAD_ONEDNN"

// ErrNotFound is returned (wrapped) when no oneDNN library can be loaded.
var ErrNotFound = errors.New("dnnl: oneDNN shared library (libdnnl.so.2) not found")

// Install is how to install the library, for messages.
const Install = "install it (Debian/Ubuntu: apt-get install libdnnl2)"

// Sizes of oneDNN 2.x structures (bytes), with room to spare for the
// operation descriptors, which the library only ever writes up to their
// size.
const (
	memDescSize = 696
	opDescSize  = 8192
)

// Status codes (dnnl_status_t).
const (
	statusSuccess = 0
)

var statusNames = map[int32]string{
	1: "out of memory", 2: "invalid arguments", 3: "unimplemented", 4: "iterator ends",
	5: "runtime error", 6: "not required", 7: "invalid graph", 8: "invalid graph op",
	9: "invalid shape", 10: "invalid data type",
}

// Status is a oneDNN error status.
type Status int32

func (s Status) Error() string {
	if n, ok := statusNames[int32(s)]; ok {
		return "oneDNN: " + n
	}
	return fmt.Sprintf("oneDNN: status %d", int32(s))
}

func check(what string, st int32) error {
	if st == statusSuccess {
		return nil
	}
	return fmt.Errorf("dnnl: %s: %w", what, Status(st))
}

// Format tags (dnnl_format_tag_t) the package uses.
type Tag int32

// The memory formats of 1-, 2- and 4-D tensors the package uses.
const (
	TagAny    Tag = 1  // let the primitive choose
	TagA      Tag = 2  // 1-D
	TagAB     Tag = 3  // 2-D row-major
	TagNCHW   Tag = 5  // 4-D plain (also OIHW for weights)
	TagNChw16 Tag = 69 // channels blocked by 16 (AVX-512)
	TagNChw8  Tag = 93 // channels blocked by 8 (AVX2)
)

// Propagation kinds (dnnl_prop_kind_t).
const (
	PropForwardTraining  = 64
	PropForwardInference = 96
	PropBackward         = 128
)

// Algorithms (dnnl_alg_kind_t).
const (
	algConvolutionDirect = 1
	algReLUUseDstForBwd  = 0x100
)

// Batch normalisation flags (dnnl_normalization_flags_t).
const (
	BNUseGlobalStats = 1
	BNUseScale       = 8
	BNUseShift       = 16
	BNFuseReLU       = 4
)

// Queries (dnnl_query_t).
const (
	QuerySrc         = 129
	QueryDiffSrc     = 130
	QueryWeights     = 131
	QueryDiffWeights = 132
	QueryDst         = 133
	QueryDiffDst     = 134
	QueryWorkspace   = 135
	QueryScratchpad  = 136
)

// Execution arguments (DNNL_ARG_*).
const (
	ArgSrc         = 1
	ArgDst         = 17
	ArgWeights     = 33
	ArgWorkspace   = 64
	ArgScratchpad  = 80
	ArgMean        = 49
	ArgVariance    = 50
	ArgScale       = 51
	ArgShift       = 52
	ArgDiffSrc     = 129
	ArgDiffDst     = 145
	ArgDiffWeights = 161
	ArgDiffScale   = 255
	ArgDiffShift   = 256
	ArgFrom        = ArgSrc
	ArgTo          = ArgDst
)

const (
	dtF32              = 3
	engineCPU          = 1
	streamDefault      = 1
	scratchpadUser     = 1
	runtimeOMP         = 2
	maxDims            = 12
	runtimeSequential  = 1
	runtimeTBB         = 4
	runtimeThreadpool  = 8
	versionRuntimeOffs = 24
)

// Lib is the loaded library with its CPU engine. Its methods are safe for
// concurrent use; the objects they return are not, unless said otherwise.
type Lib struct {
	path    string
	version Version
	engine  uintptr
	block   int

	setThreads func(n int32)

	fEngineCreate  func(eng *uintptr, kind int32, index uintptr) int32
	fStreamCreate  func(s *uintptr, eng uintptr, flags uint32) int32
	fStreamWait    func(s uintptr) int32
	fStreamDestroy func(s uintptr) int32
	fMDInitByTag   func(md unsafe.Pointer, ndims int32, dims unsafe.Pointer, dt int32, tag int32) int32
	fMDGetSize     func(md unsafe.Pointer) uintptr
	fMDEqual       func(a, b unsafe.Pointer) int32
	fMemCreate     func(m *uintptr, md unsafe.Pointer, eng uintptr, handle unsafe.Pointer) int32
	fMemSetHandle  func(m uintptr, h unsafe.Pointer) int32
	fMemDestroy    func(m uintptr) int32
	fConvFwd       func(d unsafe.Pointer, prop, alg int32, src, w, bias, dst unsafe.Pointer, strides, padL, padR unsafe.Pointer) int32
	fConvBwdData   func(d unsafe.Pointer, alg int32, diffSrc, w, diffDst unsafe.Pointer, strides, padL, padR unsafe.Pointer) int32
	fConvBwdW      func(d unsafe.Pointer, alg int32, src, diffW, diffBias, diffDst unsafe.Pointer, strides, padL, padR unsafe.Pointer) int32
	fBNFwd         func(d unsafe.Pointer, prop int32, data unsafe.Pointer, eps float32, flags uint32) int32
	fBNBwd         func(d unsafe.Pointer, prop int32, diffData, data unsafe.Pointer, eps float32, flags uint32) int32
	fEltwiseFwd    func(d unsafe.Pointer, prop, alg int32, data unsafe.Pointer, alpha, beta float32) int32
	fEltwiseBwd    func(d unsafe.Pointer, alg int32, diffData, data unsafe.Pointer, alpha, beta float32) int32
	fPDCreate      func(pd *uintptr, op unsafe.Pointer, attr, eng, hint uintptr) int32
	fPDDestroy     func(pd uintptr) int32
	fPDQueryMD     func(pd uintptr, what, index int32) unsafe.Pointer
	fReorderPD     func(pd *uintptr, src unsafe.Pointer, srcEng uintptr, dst unsafe.Pointer, dstEng, attr uintptr) int32
	fPrimCreate    func(p *uintptr, pd uintptr) int32
	fPrimExecute   func(p, s uintptr, nargs int32, args unsafe.Pointer) int32
	fPrimDestroy   func(p uintptr) int32
	fAttrCreate    func(a *uintptr) int32
	fAttrSetSP     func(a uintptr, mode int32) int32
	fAttrDestroy   func(a uintptr) int32
	fVersion       func() unsafe.Pointer

	attr uintptr // user-scratchpad attributes shared by every primitive
}

// Version is the library's version and CPU threading runtime.
type Version struct {
	Major, Minor, Patch int
	Hash                string
	// Runtime is the CPU threading runtime: "OpenMP", "TBB", "sequential",
	// "threadpool".
	Runtime string
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

var (
	loadOnce sync.Once
	loaded   *Lib
	loadErr  error
)

// candidates are the library names tried, in order, when EnvLibrary is
// unset.
func candidates() []string {
	switch runtime.GOOS {
	case "darwin":
		return []string{"libdnnl.2.dylib", "/opt/homebrew/lib/libdnnl.2.dylib", "/usr/local/lib/libdnnl.2.dylib"}
	default:
		return []string{"libdnnl.so.2"}
	}
}

// Load opens oneDNN once per process and returns it. The error wraps
// ErrNotFound when the library is not installed and says how to install
// it.
func Load() (*Lib, error) {
	loadOnce.Do(func() { loaded, loadErr = load() })
	return loaded, loadErr
}

func load() (*Lib, error) {
	var l *Lib
	// A refused library stays open: it may have started threads.
	_, err := dynlib.Library{Candidates: candidates(), Env: EnvLibrary, NotFound: ErrNotFound, Install: Install,
		KeepOnFailure: true}.Open(func(path string, h uintptr) error {
		l = &Lib{path: path}
		if err := l.bind(h); err != nil {
			return err
		}
		return l.init()
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Lib) bind(h uintptr) error {
	syms := []dynlib.Symbol{
		{Name: "dnnl_engine_create", Fn: &l.fEngineCreate},
		{Name: "dnnl_stream_create", Fn: &l.fStreamCreate},
		{Name: "dnnl_stream_wait", Fn: &l.fStreamWait},
		{Name: "dnnl_stream_destroy", Fn: &l.fStreamDestroy},
		{Name: "dnnl_memory_desc_init_by_tag", Fn: &l.fMDInitByTag},
		{Name: "dnnl_memory_desc_get_size", Fn: &l.fMDGetSize},
		{Name: "dnnl_memory_desc_equal", Fn: &l.fMDEqual},
		{Name: "dnnl_memory_create", Fn: &l.fMemCreate},
		{Name: "dnnl_memory_set_data_handle", Fn: &l.fMemSetHandle},
		{Name: "dnnl_memory_destroy", Fn: &l.fMemDestroy},
		{Name: "dnnl_convolution_forward_desc_init", Fn: &l.fConvFwd},
		{Name: "dnnl_convolution_backward_data_desc_init", Fn: &l.fConvBwdData},
		{Name: "dnnl_convolution_backward_weights_desc_init", Fn: &l.fConvBwdW},
		{Name: "dnnl_batch_normalization_forward_desc_init", Fn: &l.fBNFwd},
		{Name: "dnnl_batch_normalization_backward_desc_init", Fn: &l.fBNBwd},
		{Name: "dnnl_eltwise_forward_desc_init", Fn: &l.fEltwiseFwd},
		{Name: "dnnl_eltwise_backward_desc_init", Fn: &l.fEltwiseBwd},
		{Name: "dnnl_primitive_desc_create", Fn: &l.fPDCreate},
		{Name: "dnnl_primitive_desc_destroy", Fn: &l.fPDDestroy},
		{Name: "dnnl_primitive_desc_query_md", Fn: &l.fPDQueryMD},
		{Name: "dnnl_reorder_primitive_desc_create", Fn: &l.fReorderPD},
		{Name: "dnnl_primitive_create", Fn: &l.fPrimCreate},
		{Name: "dnnl_primitive_execute", Fn: &l.fPrimExecute},
		{Name: "dnnl_primitive_destroy", Fn: &l.fPrimDestroy},
		{Name: "dnnl_primitive_attr_create", Fn: &l.fAttrCreate},
		{Name: "dnnl_primitive_attr_set_scratchpad_mode", Fn: &l.fAttrSetSP},
		{Name: "dnnl_primitive_attr_destroy", Fn: &l.fAttrDestroy},
		{Name: "dnnl_version", Fn: &l.fVersion},
	}
	if err := dynlib.Bind(h, syms...); err != nil {
		return fmt.Errorf("%w (not oneDNN 2.x?)", err)
	}
	// The OpenMP runtime oneDNN was linked with (found through the
	// library's dependencies).
	_ = dynlib.Bind(h, dynlib.Symbol{Name: "omp_set_num_threads", Fn: &l.setThreads})
	return nil
}

func (l *Lib) init() error {
	v := l.fVersion()
	if v == nil {
		return errors.New("dnnl_version returned nothing")
	}
	l.version = Version{
		Major: int(*(*int32)(v)), Minor: int(*(*int32)(unsafe.Add(v, 4))), Patch: int(*(*int32)(unsafe.Add(v, 8))),
		Hash: cString(*(*unsafe.Pointer)(unsafe.Add(v, 16))),
	}
	switch *(*uint32)(unsafe.Add(v, versionRuntimeOffs)) {
	case runtimeOMP:
		l.version.Runtime = "OpenMP"
	case runtimeTBB:
		l.version.Runtime = "TBB"
	case runtimeSequential:
		l.version.Runtime = "sequential"
	case runtimeThreadpool:
		l.version.Runtime = "threadpool"
	default:
		l.version.Runtime = "unknown"
	}
	if l.version.Major != 2 {
		return fmt.Errorf("oneDNN %s: this program uses oneDNN 2.x's C API", l.version)
	}
	if l.version.Runtime == "threadpool" {
		return errors.New("oneDNN built for a user threadpool, which this program does not provide; use an OpenMP build (Debian's libdnnl2)")
	}
	if l.version.Runtime == "OpenMP" && l.setThreads == nil {
		return errors.New("oneDNN uses OpenMP but omp_set_num_threads was not found")
	}
	var eng uintptr
	if err := check("creating the CPU engine", l.fEngineCreate(&eng, engineCPU, 0)); err != nil {
		return err
	}
	l.engine = eng
	var a uintptr
	if err := check("creating primitive attributes", l.fAttrCreate(&a)); err != nil {
		return err
	}
	if err := check("setting the user scratchpad", l.fAttrSetSP(a, scratchpadUser)); err != nil {
		return err
	}
	l.attr = a
	l.block = l.probeBlock()
	return nil
}

// probeBlock asks oneDNN which channel block its convolutions prefer on
// this CPU (16 with AVX-512, 8 with AVX2; 0: none of those).
func (l *Lib) probeBlock() int {
	var b int
	l.WithThreads(1, func() error {
		src, _ := l.Desc([]int{2, 64, 8, 8}, TagAny)
		w, _ := l.Desc([]int{64, 64, 3, 3}, TagAny)
		pd, err := l.ConvForward(PropForwardTraining, src, w, src, [2]int{1, 1}, [2]int{1, 1})
		if err != nil {
			return err
		}
		defer pd.Close()
		got := pd.Query(QuerySrc, 0)
		for _, c := range []struct {
			tag Tag
			b   int
		}{{TagNChw16, 16}, {TagNChw8, 8}} {
			if d, err := l.Desc([]int{2, 64, 8, 8}, c.tag); err == nil && l.Equal(d, got) {
				b = c.b
			}
		}
		return nil
	})
	return b
}

func cString(p unsafe.Pointer) string {
	if p == nil {
		return ""
	}
	var b []byte
	for q := p; *(*byte)(q) != 0 && len(b) < 1024; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}

// Path is the library name or path that was loaded.
func (l *Lib) Path() string { return l.path }

// Version is the loaded library's version.
func (l *Lib) Version() Version { return l.version }

// Block is the channel block of the memory format oneDNN's convolutions
// prefer on this CPU (8 or 16), 0 when they prefer none of nChw8c and
// nChw16c.
func (l *Lib) Block() int { return l.block }

// BlockTag is the format tag of Block.
func (l *Lib) BlockTag() Tag {
	switch l.block {
	case 16:
		return TagNChw16
	case 8:
		return TagNChw8
	}
	return TagNCHW
}

// WithThreads runs f with oneDNN's OpenMP runtime set to n threads on the
// calling OS thread (OpenMP's thread count is a per-thread setting: f runs
// locked to one OS thread). oneDNN sizes its kernels for the thread count
// in force when a primitive is created, so create and execute a primitive
// under the same count. With a runtime other than OpenMP n is ignored.
func (l *Lib) WithThreads(n int, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if l.setThreads != nil && n >= 1 {
		l.setThreads(int32(n))
	}
	return f()
}

// MemDesc is a memory descriptor (dnnl_memory_desc_t): shape, element type
// and memory format of a tensor.
type MemDesc struct {
	b [memDescSize / 8]uint64
}

func (d *MemDesc) ptr() unsafe.Pointer {
	if d == nil {
		return nil
	}
	return unsafe.Pointer(&d.b[0])
}

// Desc returns a float32 descriptor of shape dims in format tag.
func (l *Lib) Desc(dims []int, tag Tag) (*MemDesc, error) {
	if len(dims) < 1 || len(dims) > maxDims {
		return nil, fmt.Errorf("dnnl: %d dimensions", len(dims))
	}
	var ds [maxDims]int64
	for i, v := range dims {
		ds[i] = int64(v)
	}
	d := new(MemDesc)
	if err := check(fmt.Sprintf("memory descriptor %v (format %d)", dims, tag), l.fMDInitByTag(d.ptr(), int32(len(dims)), unsafe.Pointer(&ds[0]), dtF32, int32(tag))); err != nil {
		return nil, err
	}
	return d, nil
}

// Size is the number of bytes a tensor of d occupies.
func (l *Lib) Size(d *MemDesc) int { return int(l.fMDGetSize(d.ptr())) }

// Equal reports whether a and b describe the same memory layout.
func (l *Lib) Equal(a, b *MemDesc) bool { return l.fMDEqual(a.ptr(), b.ptr()) != 0 }

// PrimDesc is a primitive descriptor: an operation with its
// implementation chosen.
type PrimDesc struct {
	l  *Lib
	pd uintptr
}

func (l *Lib) primDesc(what string, op unsafe.Pointer, hint *PrimDesc) (*PrimDesc, error) {
	var h uintptr
	if hint != nil {
		h = hint.pd
	}
	var pd uintptr
	if err := check(what, l.fPDCreate(&pd, op, l.attr, l.engine, h)); err != nil {
		return nil, err
	}
	return &PrimDesc{l: l, pd: pd}, nil
}

func dims2(v [2]int) *[maxDims]int64 {
	var d [maxDims]int64
	d[0], d[1] = int64(v[0]), int64(v[1])
	return &d
}

// ConvForward describes a 2-D convolution without bias (src [B Ci H W],
// weights [Co Ci K K], dst [B Co Ho Wo]) with the given strides and
// symmetric zero padding.
func (l *Lib) ConvForward(prop int, src, w, dst *MemDesc, stride, pad [2]int) (*PrimDesc, error) {
	op := make([]byte, opDescSize)
	s, p := dims2(stride), dims2(pad)
	if err := check("convolution forward descriptor", l.fConvFwd(unsafe.Pointer(&op[0]), int32(prop), algConvolutionDirect, src.ptr(), w.ptr(), nil, dst.ptr(), unsafe.Pointer(s), unsafe.Pointer(p), unsafe.Pointer(p))); err != nil {
		return nil, err
	}
	return l.primDesc("convolution forward", unsafe.Pointer(&op[0]), nil)
}

// ConvBackwardData describes the convolution's gradient with respect to
// its input; hint is the forward primitive descriptor.
func (l *Lib) ConvBackwardData(diffSrc, w, diffDst *MemDesc, stride, pad [2]int, hint *PrimDesc) (*PrimDesc, error) {
	op := make([]byte, opDescSize)
	s, p := dims2(stride), dims2(pad)
	if err := check("convolution backward-data descriptor", l.fConvBwdData(unsafe.Pointer(&op[0]), algConvolutionDirect, diffSrc.ptr(), w.ptr(), diffDst.ptr(), unsafe.Pointer(s), unsafe.Pointer(p), unsafe.Pointer(p))); err != nil {
		return nil, err
	}
	return l.primDesc("convolution backward data", unsafe.Pointer(&op[0]), hint)
}

// ConvBackwardWeights describes the convolution's gradient with respect to
// its weights (no bias); hint is the forward primitive descriptor.
func (l *Lib) ConvBackwardWeights(src, diffW, diffDst *MemDesc, stride, pad [2]int, hint *PrimDesc) (*PrimDesc, error) {
	op := make([]byte, opDescSize)
	s, p := dims2(stride), dims2(pad)
	if err := check("convolution backward-weights descriptor", l.fConvBwdW(unsafe.Pointer(&op[0]), algConvolutionDirect, src.ptr(), diffW.ptr(), nil, diffDst.ptr(), unsafe.Pointer(s), unsafe.Pointer(p), unsafe.Pointer(p))); err != nil {
		return nil, err
	}
	return l.primDesc("convolution backward weights", unsafe.Pointer(&op[0]), hint)
}

// BatchNormForward describes batch normalisation of data (flags BN*).
func (l *Lib) BatchNormForward(prop int, data *MemDesc, eps float32, flags uint32) (*PrimDesc, error) {
	op := make([]byte, opDescSize)
	if err := check("batch normalisation forward descriptor", l.fBNFwd(unsafe.Pointer(&op[0]), int32(prop), data.ptr(), eps, flags)); err != nil {
		return nil, err
	}
	return l.primDesc("batch normalisation forward", unsafe.Pointer(&op[0]), nil)
}

// BatchNormBackward describes batch normalisation's gradient (prop
// PropBackward: also the scale's and shift's); hint is a forward
// (training) primitive descriptor of the same data and flags.
func (l *Lib) BatchNormBackward(prop int, diff, data *MemDesc, eps float32, flags uint32, hint *PrimDesc) (*PrimDesc, error) {
	op := make([]byte, opDescSize)
	if err := check("batch normalisation backward descriptor", l.fBNBwd(unsafe.Pointer(&op[0]), int32(prop), diff.ptr(), data.ptr(), eps, flags)); err != nil {
		return nil, err
	}
	return l.primDesc("batch normalisation backward", unsafe.Pointer(&op[0]), hint)
}

// ReLUBackwardFromDst describes ReLU's gradient computed from ReLU's output:
// diff_src = diff_dst where dst > 0, else 0.
func (l *Lib) ReLUBackwardFromDst(diff, dst *MemDesc) (*PrimDesc, error) {
	op := make([]byte, opDescSize)
	if err := check("ReLU backward descriptor", l.fEltwiseBwd(unsafe.Pointer(&op[0]), algReLUUseDstForBwd, diff.ptr(), dst.ptr(), 0, 0)); err != nil {
		return nil, err
	}
	// An eltwise backward primitive needs a forward hint.
	fwd := make([]byte, opDescSize)
	if err := check("ReLU forward descriptor", l.fEltwiseFwd(unsafe.Pointer(&fwd[0]), PropForwardTraining, algReLUUseDstForBwd, dst.ptr(), 0, 0)); err != nil {
		return nil, err
	}
	hint, err := l.primDesc("ReLU forward", unsafe.Pointer(&fwd[0]), nil)
	if err != nil {
		return nil, err
	}
	defer hint.Close()
	return l.primDesc("ReLU backward", unsafe.Pointer(&op[0]), hint)
}

// Reorder describes a copy of a tensor from one memory format to another.
func (l *Lib) Reorder(src, dst *MemDesc) (*PrimDesc, error) {
	var pd uintptr
	if err := check("reorder", l.fReorderPD(&pd, src.ptr(), l.engine, dst.ptr(), l.engine, l.attr)); err != nil {
		return nil, err
	}
	return &PrimDesc{l: l, pd: pd}, nil
}

// Query returns a copy of the descriptor of an argument (Query* and the
// argument's index), nil when the primitive has none.
func (p *PrimDesc) Query(what, index int) *MemDesc {
	m := p.l.fPDQueryMD(p.pd, int32(what), int32(index))
	if m == nil {
		return nil
	}
	d := new(MemDesc)
	copy(unsafe.Slice((*byte)(d.ptr()), memDescSize), unsafe.Slice((*byte)(m), memDescSize))
	if *(*int32)(d.ptr()) == 0 {
		return nil // a zero descriptor: no such argument
	}
	return d
}

// Scratchpad is the number of bytes of scratch the primitive needs.
func (p *PrimDesc) Scratchpad() int {
	d := p.Query(QueryScratchpad, 0)
	if d == nil {
		return 0
	}
	return p.l.Size(d)
}

// Close frees the descriptor.
func (p *PrimDesc) Close() {
	if p != nil && p.pd != 0 {
		p.l.fPDDestroy(p.pd)
		p.pd = 0
	}
}

// Primitive is an executable operation.
type Primitive struct {
	l *Lib
	p uintptr
}

// Create makes the primitive of p (oneDNN compiles its kernels here).
func (p *PrimDesc) Create() (*Primitive, error) {
	var h uintptr
	if err := check("creating a primitive", p.l.fPrimCreate(&h, p.pd)); err != nil {
		return nil, err
	}
	return &Primitive{l: p.l, p: h}, nil
}

// Close frees the primitive.
func (p *Primitive) Close() {
	if p != nil && p.p != 0 {
		p.l.fPrimDestroy(p.p)
		p.p = 0
	}
}

// Memory is a oneDNN memory object: a descriptor and a pointer to data the
// caller owns (set before each execution).
type Memory struct {
	l *Lib
	m uintptr
}

// Memory returns a memory object of d with no data yet.
func (l *Lib) Memory(d *MemDesc) (*Memory, error) {
	var m uintptr
	if err := check("creating a memory object", l.fMemCreate(&m, d.ptr(), l.engine, nil)); err != nil {
		return nil, err
	}
	return &Memory{l: l, m: m}, nil
}

// Set points the memory object at data (which must hold the descriptor's
// size and stay alive until the execution that uses it returns).
func (m *Memory) Set(data unsafe.Pointer) error {
	return check("setting a memory object's data", m.l.fMemSetHandle(m.m, data))
}

// Close frees the memory object (not the data).
func (m *Memory) Close() {
	if m != nil && m.m != 0 {
		m.l.fMemDestroy(m.m)
		m.m = 0
	}
}

// Arg is one execution argument: an ArgXxx and its memory.
type Arg struct {
	arg int32
	_   int32
	mem uintptr
}

// NewArg pairs an argument kind with its memory.
func NewArg(kind int, m *Memory) Arg { return Arg{arg: int32(kind), mem: m.m} }

// Stream is an execution stream of the CPU engine (one per goroutine that
// executes).
type Stream struct {
	l *Lib
	s uintptr
}

// Stream returns a new stream.
func (l *Lib) Stream() (*Stream, error) {
	var s uintptr
	if err := check("creating a stream", l.fStreamCreate(&s, l.engine, streamDefault)); err != nil {
		return nil, err
	}
	return &Stream{l: l, s: s}, nil
}

// Close frees the stream.
func (s *Stream) Close() {
	if s != nil && s.s != 0 {
		s.l.fStreamDestroy(s.s)
		s.s = 0
	}
}

// Execute runs p with args on s and waits for it.
func (s *Stream) Execute(p *Primitive, args []Arg) error {
	var a unsafe.Pointer
	if len(args) > 0 {
		a = unsafe.Pointer(&args[0])
	}
	if err := check("executing a primitive", s.l.fPrimExecute(p.p, s.s, int32(len(args)), a)); err != nil {
		return err
	}
	runtime.KeepAlive(args)
	return check("waiting for a stream", s.l.fStreamWait(s.s))
}
