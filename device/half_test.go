package device

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// TestFloat16RoundTrip: every half value survives FromFloat16 then
// ToFloat16 (NaNs stay NaNs).
func TestFloat16RoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		f := FromFloat16(uint16(h))
		g := ToFloat16(f)
		if math.IsNaN(float64(f)) {
			if g&0x7c00 != 0x7c00 || g&0x3ff == 0 {
				t.Fatalf("NaN %#04x became %#04x", h, g)
			}
			continue
		}
		if g != uint16(h) {
			t.Fatalf("%#04x → %v → %#04x", h, f, g)
		}
	}
}

// TestToFloat16Nearest compares ToFloat16 with a search of the sorted
// non-negative halves for the nearest, ties to the even bit pattern, on
// random float32 bit patterns and on the midpoints between halves.
func TestToFloat16Nearest(t *testing.T) {
	// The non-negative finite halves and +Inf (as 65536: the value
	// ties to it from 65520 on), ascending with their bits.
	var vals []float64
	var bits []uint16
	for h := uint16(0); h <= 0x7c00; h++ {
		v := float64(FromFloat16(h))
		if h == 0x7c00 {
			v = 65536
		}
		vals, bits = append(vals, v), append(bits, h)
	}
	ref := func(x float32) uint16 {
		a := math.Abs(float64(x))
		var sign uint16
		if math.Signbit(float64(x)) {
			sign = 0x8000
		}
		if a >= 65536 {
			return sign | 0x7c00
		}
		i := sort.SearchFloat64s(vals, a) // vals[i] >= a
		if vals[i] == a {
			return sign | bits[i]
		}
		lo, hi := i-1, i
		dl, dh := a-vals[lo], vals[hi]-a
		switch {
		case dl < dh:
			return sign | bits[lo]
		case dh < dl:
			return sign | bits[hi]
		case bits[lo]&1 == 0:
			return sign | bits[lo]
		}
		return sign | bits[hi]
	}
	rng := rand.New(rand.NewPCG(1, 16))
	check := func(x float32) {
		if math.IsNaN(float64(x)) {
			return
		}
		if got, want := ToFloat16(x), ref(x); got != want {
			t.Fatalf("ToFloat16(%v) = %#04x, want %#04x", x, got, want)
		}
	}
	for range 200000 {
		check(math.Float32frombits(rng.Uint32()))
		check(float32(rng.NormFloat64() * math.Pow(2, float64(rng.IntN(40)-25))))
	}
	for i := 0; i+1 < len(vals); i++ {
		check(float32((vals[i] + vals[i+1]) / 2)) // the ties
		check(-float32((vals[i] + vals[i+1]) / 2))
	}
}

// TestAddFloat16 compares the sum with the nearest half of the exact sum
// (computed in float64, exact for two halves) for random halves.
func TestAddFloat16(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 16))
	for range 200000 {
		a, b := uint16(rng.Uint32()), uint16(rng.Uint32())
		fa, fb := FromFloat16(a), FromFloat16(b)
		if math.IsNaN(float64(fa)) || math.IsNaN(float64(fb)) || math.IsInf(float64(fa), 0) || math.IsInf(float64(fb), 0) {
			continue
		}
		s := float64(fa) + float64(fb)
		got := FromFloat16(AddFloat16(a, b))
		// The result must be a half nearest to s: no half lies strictly
		// closer (checked against the neighbours of the result).
		g := AddFloat16(a, b)
		d := math.Abs(float64(got) - s)
		for _, nb := range []uint16{g + 1, g - 1} {
			v := float64(FromFloat16(nb))
			if nb&0x7c00 == 0x7c00 || math.IsInf(float64(got), 0) {
				continue
			}
			if math.Abs(v-s) < d {
				t.Fatalf("%v + %v = %v, but %v is nearer to %v", fa, fb, got, v, s)
			}
		}
	}
}

func BenchmarkAddFloat16(b *testing.B) {
	x := make([]uint16, 4096)
	for i := range x {
		x[i] = ToFloat16(float32(i) * 0.01)
	}
	b.ResetTimer()
	var s uint16
	for i := 0; i < b.N; i++ {
		s = AddFloat16(s&0x3fff, x[i%len(x)])
	}
	_ = s
}
