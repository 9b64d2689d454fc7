package models

import (
	"sync"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	G "gorgonia.org/gorgonia"
)

var (
	blasMu  sync.RWMutex
	blasF32 blas.Float32 = gonum.Implementation{}
)

// UseBLAS makes every matrix product of the models — Gorgonia's MatMul and
// MatVecMul (through tensor's standard engine, which Gorgonia's Use also
// switches) and this package's convolution — use b. The default is gonum's
// pure-Go implementation. It is process-wide; call it before building or
// running models.
func UseBLAS(b G.BLAS) {
	blasMu.Lock()
	defer blasMu.Unlock()
	G.Use(b)
	blasF32 = b
}

// CurrentBLAS returns the BLAS the models use.
func CurrentBLAS() G.BLAS { return G.WhichBLAS() }

func sgemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	ta, tb := blas.NoTrans, blas.NoTrans
	if tA {
		ta = blas.Trans
	}
	if tB {
		tb = blas.Trans
	}
	blasMu.RLock()
	impl := blasF32
	blasMu.RUnlock()
	impl.Sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}
