package models

import (
	"math/rand/v2"
	"testing"
)

// TestDropoutSkipMatchesDraws checks the jump a device's dropout uses: the
// stream skipped past n draws is the stream that drew them.
func TestDropoutSkipMatchesDraws(t *testing.T) {
	for _, n := range []uint64{0, 1, 2, 3, 7, 64, 1000, 4097, 65536 + 5} {
		a, b := newDropoutRNG(uint64(n)+3), newDropoutRNG(uint64(n)+3)
		for range n {
			a.r.Float64()
		}
		b.skip(n)
		if a.r.Uint64() != b.r.Uint64() {
			t.Fatalf("after %d draws the skipped stream differs", n)
		}
	}
	// A jump of 2⁶⁴ + 5 is 2⁶⁴ steps then 5 more (the jump composes).
	hi, lo := pcgJump(1, 2, 1<<63)
	hi, lo = pcgJump(hi, lo, 1<<63)
	hi, lo = pcgJump(hi, lo, 5)
	h2, l2 := pcgJump(1, 2, 5)
	for range 2 {
		h2, l2 = pcgJump(h2, l2, 1<<63)
	}
	if hi != h2 || lo != l2 {
		t.Fatal("jumps do not compose")
	}
}

// TestDropoutThreshold checks the integer test a device's dropout makes
// against mask's Float64() < p, on random draws and at the edges.
func TestDropoutThreshold(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, p := range []float64{0.5, 0.4, 0.2, 0.1, 1e-9, 0.999999, 1.0 / 3} {
		thr := dropThreshold(p)
		for _, x := range []uint64{0, 1, thr - 1, thr, thr + 1, 1<<53 - 1} {
			x &= 1<<53 - 1
			if got, want := x < thr, float64(x)/(1<<53) < p; got != want {
				t.Errorf("p %v, x %d: integer test %v, Float64 test %v", p, x, got, want)
			}
		}
		for range 100000 {
			x := r.Uint64() & (1<<53 - 1)
			if got, want := x < thr, float64(x)/(1<<53) < p; got != want {
				t.Fatalf("p %v, x %d: integer test %v, Float64 test %v", p, x, got, want)
			}
		}
	}
}
