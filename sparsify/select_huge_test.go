package sparsify

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestTopKHugeBoundaryBucket covers inputs whose k-th largest magnitude lies
// in a first-pass bucket holding more than selHugeBucket keys, which
// selFindKth finishes with histogram passes instead of copying the bucket:
// mostly zeros (a sparse embedding gradient), one repeated value, and many
// values that share their top bits but differ in the low ones.
func TestTopKHugeBoundaryBucket(t *testing.T) {
	n := 3*selHugeBucket + 17
	rng := rand.New(rand.NewPCG(11, 3))
	gens := map[string]func(i int) float32{
		"mostly-zeros": func(i int) float32 {
			if i%97 == 0 {
				return float32(rng.NormFloat64())
			}
			return 0
		},
		"one-value": func(i int) float32 {
			if rng.IntN(2) == 0 {
				return -0.25
			}
			return 0.25
		},
		"close-values": func(i int) float32 {
			// 1 + tiny multiples of the float32 spacing: same bits 30..20.
			return math.Float32frombits(math.Float32bits(1) + uint32(rng.IntN(1<<12)))
		},
	}
	for name, gen := range gens {
		x := make([]float32, n)
		for i := range x {
			x[i] = gen(i)
		}
		order := selRefOrder(x)
		for _, k := range []int{1, n / 97, n / 3, n / 2, n - 1} {
			t.Run(fmt.Sprintf("%s/k=%d", name, k), func(t *testing.T) {
				want := selRefTopKOrdered(order, k)
				got := TopK(nil, x, k)
				if !slices.Equal(got, want) {
					t.Fatalf("TopK differs from the reference at position %d", selFirstDiff(got, want))
				}
				wantKth := float32(math.Abs(float64(x[order[k-1]])))
				if kth := KthLargestAbs(x, k); kth != wantKth {
					t.Fatalf("KthLargestAbs = %v, want %v", kth, wantKth)
				}
			})
		}
	}
}
