package ops

import (
	"fmt"
	"sync"

	iblas "github.com/sparsegrad/sparsegrad/internal/native/blas"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	G "gorgonia.org/gorgonia"
)

var (
	blasMu  sync.RWMutex
	blasF32 blas.Float32 = gonum.Implementation{}
)

// UseBLAS makes every matrix product of the package — Gorgonia's MatMul and
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

// BLAS modes accepted by ConfigureBLAS.
const (
	BLASAuto     = "auto"     // OpenBLAS when installed, gonum otherwise
	BLASOpenBLAS = "openblas" // OpenBLAS or an error
	BLASGonum    = "gonum"    // gonum's pure-Go BLAS
)

// ConfigureBLAS selects the BLAS of every matrix product in the process and returns
// a one-line description of the choice (for logs). OpenBLAS is loaded at run
// time (internal/native/blas), so no build flag or library is needed to build; in
// "auto" mode a missing library silently selects gonum. threads > 0 sets
// OpenBLAS's thread count (0 leaves OpenBLAS's default: one per core).
func ConfigureBLAS(mode string, threads int) (string, error) {
	switch mode {
	case BLASGonum:
		UseBLAS(gonum.Implementation{})
		return "gonum (pure Go)", nil
	case BLASAuto, BLASOpenBLAS, "":
		o, err := iblas.Load()
		if err != nil {
			if mode == BLASOpenBLAS {
				return "", fmt.Errorf("ops: %w", err)
			}
			UseBLAS(gonum.Implementation{})
			return "gonum (pure Go; OpenBLAS not found)", nil
		}
		if threads > 0 {
			o.SetThreads(threads)
		}
		UseBLAS(o)
		return fmt.Sprintf("OpenBLAS %s (%s, %d threads)", o.Path(), o.Config(), o.Threads()), nil
	}
	return "", fmt.Errorf("ops: unknown BLAS %q; use %q, %q or %q", mode, BLASAuto, BLASOpenBLAS, BLASGonum)
}
