package sparsify

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// TestNorm2Large checks the blocked, parallel norm against a plain float64
// sum, and that it does not depend on the number of cores.
func TestNorm2Large(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{segBlock - 1, segBlock, segBlock + 1, 64 * segBlock, 300*segBlock + 123} {
		x := make([]float32, n)
		var want float64
		for i := range x {
			x[i] = float32(rng.NormFloat64())
			want += float64(x[i]) * float64(x[i])
		}
		want = math.Sqrt(want)
		got := norm2(x)
		if math.Abs(got-want) > 1e-12*want {
			t.Errorf("n=%d: norm2 = %v, plain sum %v", n, got, want)
		}
		old := runtime.GOMAXPROCS(1)
		one := norm2(x)
		runtime.GOMAXPROCS(old)
		if one != got {
			t.Errorf("n=%d: norm2 on one core %v differs from all cores %v", n, one, got)
		}
	}
}

func BenchmarkNorm2(b *testing.B) {
	x := make([]float32, 11_173_962)
	for i := range x {
		x[i] = float32(i%1000) * 1e-3
	}
	b.SetBytes(int64(4 * len(x)))
	for b.Loop() {
		norm2(x)
	}
}
