// Package blas owns the run-time loading of OpenBLAS: it opens
// libopenblas with dlopen (through github.com/ebitengine/purego, so no cgo,
// no headers and no link-time dependency) and exposes it as a gonum BLAS
// whose level-3/level-2 float32 routines (Sgemm, Sgemv) call OpenBLAS while
// every other routine falls back to gonum's pure-Go implementation. A
// binary built with plain `go build` therefore runs everywhere, and uses
// OpenBLAS where the shared library is installed.
package blas

import (
	"errors"
	"runtime"
	"sync"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/internal/native/dynlib"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// EnvLibrary names an environment variable holding the path of the OpenBLAS
// shared library to load instead of searching the default names.
const EnvLibrary = "SPARSEGRAD_OPENBLAS"

// ErrNotFound is returned (wrapped) when no OpenBLAS library can be loaded.
var ErrNotFound = errors.New("blas: OpenBLAS shared library not found")

// CBLAS enums (cblas.h).
const (
	cblasRowMajor = 101
	cblasNoTrans  = 111
	cblasTrans    = 112
)

// minGemmWork is the m·n·k below which Sgemm stays in Go: a dynamic call
// costs about a microsecond, more than gonum needs for such a product.
const minGemmWork = 8 * 8 * 8

// OpenBLAS is a gonum blas.Float32/Float64/Complex64/Complex128
// implementation (it embeds gonum's) whose Sgemm and Sgemv call OpenBLAS.
// It is safe for concurrent use.
type OpenBLAS struct {
	gonum.Implementation

	path    string
	sgemm   func(order, ta, tb, m, n, k int32, alpha float32, a unsafe.Pointer, lda int32, b unsafe.Pointer, ldb int32, beta float32, c unsafe.Pointer, ldc int32)
	sgemv   func(order, ta, m, n int32, alpha float32, a unsafe.Pointer, lda int32, x unsafe.Pointer, incx int32, beta float32, y unsafe.Pointer, incy int32)
	setThr  func(n int32)
	getThr  func() int32
	getConf func() *byte
}

var (
	loadOnce sync.Once
	loaded   *OpenBLAS
	loadErr  error
)

// candidates are the library names tried, in order, when EnvLibrary is unset.
func candidates() []string {
	switch runtime.GOOS {
	case "darwin":
		return []string{"libopenblas.dylib", "/opt/homebrew/opt/openblas/lib/libopenblas.dylib", "/usr/local/opt/openblas/lib/libopenblas.dylib"}
	default:
		return []string{"libopenblas.so.0", "libopenblas.so", "libopenblasp.so.0", "libopenblaso.so.0"}
	}
}

// Load opens OpenBLAS once per process and returns it. The error wraps
// ErrNotFound when the library is not installed and says how to install it.
func Load() (*OpenBLAS, error) {
	loadOnce.Do(func() { loaded, loadErr = load() })
	return loaded, loadErr
}

func load() (*OpenBLAS, error) {
	var o *OpenBLAS
	_, err := dynlib.Library{Candidates: candidates(), Env: EnvLibrary, NotFound: ErrNotFound,
		Install: "install it (Debian/Ubuntu: apt-get install libopenblas0-pthread)"}.Open(func(path string, h uintptr) error {
		o = &OpenBLAS{path: path}
		return o.bind(h)
	})
	if err != nil {
		return nil, err
	}
	return o, nil
}

func (o *OpenBLAS) bind(h uintptr) error {
	if err := dynlib.Bind(h, dynlib.Symbol{Name: "cblas_sgemm", Fn: &o.sgemm}, dynlib.Symbol{Name: "cblas_sgemv", Fn: &o.sgemv}); err != nil {
		return err
	}
	// Optional: older or other builds lack them.
	_ = dynlib.Bind(h, dynlib.Symbol{Name: "openblas_set_num_threads", Fn: &o.setThr}, dynlib.Symbol{Name: "openblas_get_num_threads", Fn: &o.getThr})
	_ = dynlib.Bind(h, dynlib.Symbol{Name: "openblas_get_config", Fn: &o.getConf})
	return nil
}

// Path is the library name or path that was loaded.
func (o *OpenBLAS) Path() string { return o.path }

// Config is OpenBLAS's build description (version, core, threading), or
// "" when the library does not export it.
func (o *OpenBLAS) Config() string {
	if o.getConf == nil {
		return ""
	}
	p := o.getConf()
	if p == nil {
		return ""
	}
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0 && len(b) < 512; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}

// SetThreads sets OpenBLAS's thread count (no-op if unsupported).
func (o *OpenBLAS) SetThreads(n int) {
	if o.setThr != nil && n >= 1 {
		o.setThr(int32(n))
	}
}

// Threads is OpenBLAS's thread count (1 if unknown).
func (o *OpenBLAS) Threads() int {
	if o.getThr == nil {
		return 1
	}
	return int(o.getThr())
}

func trans(t blas.Transpose) (int32, bool) {
	switch t {
	case blas.NoTrans:
		return cblasNoTrans, true
	case blas.Trans, blas.ConjTrans:
		return cblasTrans, true
	}
	return 0, false
}

const maxInt32 = 1<<31 - 1

// Sgemm computes C = alpha·op(A)·op(B) + beta·C (row-major) with OpenBLAS.
// Arguments that are invalid, tiny or too large for 32-bit BLAS integers
// are handed to gonum, which also reports invalid ones exactly as gonum
// always does (by panicking).
func (o *OpenBLAS) Sgemm(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	ta, ok1 := trans(tA)
	tb, ok2 := trans(tB)
	if !ok1 || !ok2 || m <= 0 || n <= 0 || k <= 0 || m*n*k < minGemmWork ||
		m > maxInt32 || n > maxInt32 || k > maxInt32 || lda > maxInt32 || ldb > maxInt32 || ldc > maxInt32 ||
		!gemmSizesOK(tA, tB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc) {
		o.Implementation.Sgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	o.sgemm(cblasRowMajor, ta, tb, int32(m), int32(n), int32(k), alpha, unsafe.Pointer(&a[0]), int32(lda), unsafe.Pointer(&b[0]), int32(ldb), beta, unsafe.Pointer(&c[0]), int32(ldc))
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(c)
}

// gemmSizesOK checks the leading dimensions and slice lengths the way
// gonum does, so that OpenBLAS never reads or writes out of bounds.
func gemmSizesOK(tA, tB blas.Transpose, m, n, k, la, lda, lb, ldb, lc, ldc int) bool {
	ar, ac := m, k
	if tA != blas.NoTrans {
		ar, ac = k, m
	}
	br, bc := k, n
	if tB != blas.NoTrans {
		br, bc = n, k
	}
	if lda < max(1, ac) || ldb < max(1, bc) || ldc < max(1, n) {
		return false
	}
	return la >= lda*(ar-1)+ac && lb >= ldb*(br-1)+bc && lc >= ldc*(m-1)+n
}

// Sgemv computes y = alpha·op(A)·x + beta·y (row-major) with OpenBLAS,
// handing invalid, tiny or unusual (non-positive increments) calls to gonum.
func (o *OpenBLAS) Sgemv(tA blas.Transpose, m, n int, alpha float32, a []float32, lda int, x []float32, incX int, beta float32, y []float32, incY int) {
	ta, ok := trans(tA)
	lx, ly := n, m
	if tA != blas.NoTrans {
		lx, ly = m, n
	}
	if !ok || m <= 0 || n <= 0 || m*n < minGemmWork || incX <= 0 || incY <= 0 ||
		m > maxInt32 || n > maxInt32 || lda > maxInt32 || incX > maxInt32 || incY > maxInt32 ||
		lda < max(1, n) || len(a) < lda*(m-1)+n || len(x) < 1+(lx-1)*incX || len(y) < 1+(ly-1)*incY {
		o.Implementation.Sgemv(tA, m, n, alpha, a, lda, x, incX, beta, y, incY)
		return
	}
	o.sgemv(cblasRowMajor, ta, int32(m), int32(n), alpha, unsafe.Pointer(&a[0]), int32(lda), unsafe.Pointer(&x[0]), int32(incX), beta, unsafe.Pointer(&y[0]), int32(incY))
	runtime.KeepAlive(a)
	runtime.KeepAlive(x)
	runtime.KeepAlive(y)
}
