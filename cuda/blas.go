package cuda

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/sparsegrad/sparsegrad/device"
)

// cublasTable is cuBLAS' function table.
type cublasTable struct {
	create      func(h *uintptr) int32
	destroy     func(h uintptr) int32
	setStream   func(h, s uintptr) int32
	setMathMode func(h uintptr, mode int32) int32
	getVersion  func(h uintptr, v *int32) int32
	getProperty func(prop int32, v *int32) int32
	sgemm       func(h uintptr, ta, tb int32, m, n, k int32, alpha *float32, a uintptr, lda int32, b uintptr, ldb int32, beta *float32, c uintptr, ldc int32) int32
}

// cublas is cuBLAS' functions.
var cublas cublasTable

// hotCUBLAS rebinds the product every matrix multiplication calls to a
// direct call of the symbol (see hotDriver).
func hotCUBLAS(h uintptr, t *cublasTable) {
	p, err := purego.Dlsym(h, "cublasSgemm_v2")
	if err != nil || p == 0 {
		return
	}
	i := func(v int32) uintptr { return uintptr(uint32(v)) }
	t.sgemm = func(hd uintptr, ta, tb int32, m, n, k int32, alpha *float32, a uintptr, lda int32, b uintptr, ldb int32, beta *float32, c uintptr, ldc int32) int32 {
		v, _, _ := purego.SyscallN(p, hd, i(ta), i(tb), i(m), i(n), i(k), uintptr(unsafe.Pointer(alpha)), a, i(lda), b, i(ldb), uintptr(unsafe.Pointer(beta)), c, i(ldc))
		return int32(v)
	}
}

var (
	cublasOnce sync.Once
	cublasErr  error
)

const (
	cublasOpN = 0
	cublasOpT = 1
	// cublasDefaultMath computes float32 products in float32;
	// cublasTF32Math allows TF32 tensor cores.
	cublasDefaultMath = 0
	cublasTF32Math    = 3
)

func loadCUBLAS() error {
	cublasOnce.Do(func() {
		h, path, err := libCUBLAS.open()
		if err != nil {
			cublasErr = err
			return
		}
		cublasErr = bind(libCUBLAS, path, h, map[string]any{
			"cublasCreate_v2":     &cublas.create,
			"cublasDestroy_v2":    &cublas.destroy,
			"cublasSetStream_v2":  &cublas.setStream,
			"cublasSetMathMode":   &cublas.setMathMode,
			"cublasGetVersion_v2": &cublas.getVersion,
			"cublasSgemm_v2":      &cublas.sgemm,
			"cublasGetProperty":   &cublas.getProperty,
		})
		if cublasErr == nil {
			hotCUBLAS(h, &cublas)
		}
		var v [3]int32 // MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
		if cublasErr == nil && cublas.getProperty(0, &v[0]) == 0 && cublas.getProperty(1, &v[1]) == 0 && cublas.getProperty(2, &v[2]) == 0 {
			setLibraryVersion(libCUBLAS.what, fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]))
		}
	})
	return cublasErr
}

func cublasError(call string, r int32) error {
	if r == 0 {
		return nil
	}
	if r == missingSymbol {
		return missingError(call)
	}
	return fmt.Errorf("cuda: %s: cuBLAS status %d", call, r)
}

// blasHandle returns the stream's cuBLAS handle, bound to the stream (the
// device's context current).
func (s *Stream) blasHandle() (uintptr, error) {
	if s.blas != 0 {
		return s.blas, nil
	}
	if err := loadCUBLAS(); err != nil {
		return 0, err
	}
	var h uintptr
	if err := cublasError("cublasCreate", cublas.create(&h)); err != nil {
		return 0, err
	}
	mode := int32(cublasDefaultMath)
	if s.d.opts.TF32 {
		mode = cublasTF32Math
	}
	err := cublasError("cublasSetStream", cublas.setStream(h, s.h))
	if err == nil {
		err = cublasError("cublasSetMathMode", cublas.setMathMode(h, mode))
	}
	if err != nil { // not kept: destroyed
		return 0, errors.Join(err, cublasError("cublasDestroy", cublas.destroy(h)))
	}
	s.blas = h
	return h, nil
}

// sgemm computes C = op(A)·op(B) for row-major float32 matrices on the
// stream: C is m×n, op(A) m×k, op(B) k×n, with leading dimensions (row
// lengths) lda, ldb, ldc. cuBLAS is column-major, so it computes
// Cᵀ = op(B)ᵀ·op(A)ᵀ, which is the same memory.
func (s *Stream) sgemm(tA, tB bool, m, n, k int, a device.Buffer, lda int, b device.Buffer, ldb int, c device.Buffer, ldc int) error {
	if m == 0 || n == 0 {
		return nil
	}
	unlock, err := s.enter()
	if err != nil {
		return err
	}
	defer unlock()
	h, err := s.blasHandle()
	if err != nil {
		return err
	}
	op := func(t bool) int32 {
		if t {
			return cublasOpT
		}
		return cublasOpN
	}
	alpha, beta := float32(1), float32(0)
	counts.launches.Add(1)
	if err := cublasError("cublasSgemm", cublas.sgemm(h, op(tB), op(tA), int32(n), int32(m), int32(k), &alpha, b.Addr(), int32(ldb), a.Addr(), int32(lda), &beta, c.Addr(), int32(ldc))); err != nil {
		return err
	}
	return s.checkLaunch("cublasSgemm")
}
