package blas

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

func mustLoad(t testing.TB) *OpenBLAS {
	t.Helper()
	o, err := Load()
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			testenv.Missing(t, testenv.OpenBLAS, fmt.Sprintf("OpenBLAS is not installed (apt-get install libopenblas0-pthread): %v", err))
		}
		t.Fatal(err)
	}
	return o
}

// refGemm is C = alpha·op(A)·op(B) + beta·C from the definition, in float64.
func refGemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) []float64 {
	out := make([]float64, len(c))
	for i := range c {
		out[i] = float64(c[i])
	}
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				var av, bv float32
				if tA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if tB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += float64(av) * float64(bv)
			}
			out[i*ldc+j] = float64(alpha)*s + float64(beta)*float64(c[i*ldc+j])
		}
	}
	return out
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func TestSgemmMatchesReference(t *testing.T) {
	o := mustLoad(t)
	t.Logf("loaded %s (%s), %d threads", o.Path(), o.Config(), o.Threads())
	r := rand.New(rand.NewPCG(1, 2))
	sizes := []int{1, 2, 3, 5, 16, 17, 64}
	for _, m := range sizes {
		for _, n := range sizes {
			for _, k := range []int{1, 3, 16, 33} {
				for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
					tA, tB := tr[0], tr[1]
					ar, ac := m, k
					if tA {
						ar, ac = k, m
					}
					br, bc := k, n
					if tB {
						br, bc = n, k
					}
					lda, ldb, ldc := ac+1, bc+2, n+3 // padded leading dimensions
					a := randSlice(r, lda*(ar-1)+ac)
					b := randSlice(r, ldb*(br-1)+bc)
					c := randSlice(r, ldc*(m-1)+n)
					alpha, beta := float32(0.7), float32(-0.3)
					want := refGemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
					ta, tb := blas.NoTrans, blas.NoTrans
					if tA {
						ta = blas.Trans
					}
					if tB {
						tb = blas.Trans
					}
					o.Sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
					for i := range c {
						if math.Abs(float64(c[i])-want[i]) > 1e-4*math.Max(1, math.Abs(want[i]))*math.Sqrt(float64(k)) {
							t.Fatalf("m=%d n=%d k=%d tA=%v tB=%v: c[%d] = %v, want %v", m, n, k, tA, tB, i, c[i], want[i])
						}
					}
				}
			}
		}
	}
}

func TestSgemvMatchesGonum(t *testing.T) {
	o := mustLoad(t)
	r := rand.New(rand.NewPCG(3, 4))
	for _, m := range []int{1, 2, 5, 16, 40} {
		for _, n := range []int{1, 3, 16, 41} {
			for _, tA := range []blas.Transpose{blas.NoTrans, blas.Trans} {
				for _, inc := range []int{1, 2} {
					lx, ly := n, m
					if tA == blas.Trans {
						lx, ly = m, n
					}
					a := randSlice(r, m*(n+1))
					x := randSlice(r, 1+(lx-1)*inc)
					y := randSlice(r, 1+(ly-1)*inc)
					y2 := append([]float32(nil), y...)
					o.Sgemv(tA, m, n, 1.5, a, n+1, x, inc, 0.5, y, inc)
					gonum.Implementation{}.Sgemv(tA, m, n, 1.5, a, n+1, x, inc, 0.5, y2, inc)
					for i := range y {
						if math.Abs(float64(y[i]-y2[i])) > 1e-4*math.Max(1, math.Abs(float64(y2[i]))) {
							t.Fatalf("m=%d n=%d %v inc=%d: y[%d] = %v, gonum %v", m, n, tA, inc, i, y[i], y2[i])
						}
					}
				}
			}
		}
	}
}

func TestSgemmBadArgsPanicLikeGonum(t *testing.T) {
	o := mustLoad(t)
	defer func() {
		if recover() == nil {
			t.Fatal("short C slice did not panic")
		}
	}()
	a := make([]float32, 64*64)
	o.Sgemm(blas.NoTrans, blas.NoTrans, 64, 64, 64, 1, a, 64, a, 64, 0, make([]float32, 10), 64)
}

func TestLoadBadPath(t *testing.T) {
	// A fresh load with a path that does not exist must fail cleanly.
	t.Setenv(EnvLibrary, "/nonexistent/libopenblas.so.0")
	_, err := load0()
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
}

func load0() (*OpenBLAS, error) { return load() }

func BenchmarkSgemm(b *testing.B) {
	o := mustLoad(b)
	for _, n := range []int{64, 256, 1024} {
		r := rand.New(rand.NewPCG(5, 6))
		a, bb, c := randSlice(r, n*n), randSlice(r, n*n), make([]float32, n*n)
		for _, impl := range []struct {
			name string
			f    func()
		}{
			{"gonum", func() { gonum.Implementation{}.Sgemm(blas.NoTrans, blas.NoTrans, n, n, n, 1, a, n, bb, n, 0, c, n) }},
			{"openblas", func() { o.Sgemm(blas.NoTrans, blas.NoTrans, n, n, n, 1, a, n, bb, n, 0, c, n) }},
		} {
			b.Run(fmt.Sprintf("%s/%d", impl.name, n), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					impl.f()
				}
				b.ReportMetric(2*float64(n*n*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
