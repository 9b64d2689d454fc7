package ops

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestExp32Accuracy compares exp32 with math.Exp over its whole range
// (every 1/4096 and random points): relative error below 1.5e-7; clamped
// below expLo and above expHi; NaN stays NaN.
func TestExp32Accuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	worst, at := 0.0, float32(0)
	check := func(x float32) {
		got, want := float64(exp32(x)), math.Exp(float64(x))
		if e := math.Abs(got-want) / want; e > worst {
			worst, at = e, x
		}
	}
	for x := float32(expLo); x <= expHi; x += 1.0 / 4096 {
		check(x)
	}
	for range 1_000_000 {
		check(float32(expLo + r.Float64()*(expHi-expLo)))
	}
	if worst > 1.5e-7 {
		t.Fatalf("relative error %.3g at x = %v, want below 1.5e-7", worst, at)
	}
	t.Logf("largest relative error %.3g (at x = %v)", worst, at)
	if lo, hi := exp32(-1000), exp32(expLo); lo != hi || lo <= 0 {
		t.Errorf("exp32(-1000) = %v, exp32(expLo) = %v: want the same positive value", lo, hi)
	}
	if v := exp32(float32(math.NaN())); !math.IsNaN(float64(v)) {
		t.Errorf("exp32(NaN) = %v", v)
	}
	if v := exp32(0); v != 1 {
		t.Errorf("exp32(0) = %v, want 1", v)
	}
}

// TestExp32AVX2MatchesGo: the eight-lane assembly and the Go code give the
// same bits for sums and scaled exponentials, at awkward lengths, in place
// too, NaN kept.
func TestExp32AVX2MatchesGo(t *testing.T) {
	if !useAVX2 {
		t.Skip("skipping: this CPU has no AVX2; the Go code is what runs")
	}
	defer func() { useAVX2 = true }()
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 64, 1001, 28869} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 30)
		}
		if n > 20 {
			x[3], x[11] = -200, 150 // clamped, both ends
		}
		sub := float32(r.NormFloat64())
		k, spread := r.Float64(), r.Float64()*1e-3
		var sums [2]float64
		var scaled [2][]float32
		for i, avx := range []bool{true, false} {
			useAVX2 = avx
			sums[i] = expSubSum(x, sub)
			scaled[i] = make([]float32, n)
			expSubScale(scaled[i], x, sub, k, spread)
		}
		if math.Float64bits(sums[0]) != math.Float64bits(sums[1]) {
			t.Errorf("n=%d: sum %v with AVX2, %v in Go", n, sums[0], sums[1])
		}
		for i := range scaled[0] {
			if math.Float32bits(scaled[0][i]) != math.Float32bits(scaled[1][i]) {
				t.Fatalf("n=%d: element %d: %v with AVX2, %v in Go", n, i, scaled[0][i], scaled[1][i])
			}
		}
		useAVX2 = true
		in := append([]float32(nil), x...)
		expSubScale(in, in, sub, k, spread)
		for i := range in {
			if math.Float32bits(in[i]) != math.Float32bits(scaled[1][i]) {
				t.Fatalf("n=%d in place: element %d: %v, want %v", n, i, in[i], scaled[1][i])
			}
		}
	}
	x := []float32{1, 2, float32(math.NaN()), 4, 5, 6, 7, 8}
	if s := expSubSum(x, 0); !math.IsNaN(s) {
		t.Errorf("a NaN among the lanes summed to %v", s)
	}
}

func BenchmarkExpSubSum(b *testing.B) {
	x := make([]float32, 28869)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range x {
		x[i] = float32(r.NormFloat64() * 3)
	}
	b.Run("exp32", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			expSubSum(x, 5)
		}
	})
	b.Run("math.Exp", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			var s float64
			for _, v := range x {
				s += math.Exp(float64(v - 5))
			}
			_ = s
		}
	})
}
