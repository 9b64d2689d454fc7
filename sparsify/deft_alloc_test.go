package sparsify

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// deftAllocCase is one adversarial input of the allocation: fragment sizes,
// norms and the global budget k.
type deftAllocCase struct {
	name  string
	sizes []int
	norms []float64
	k     int
}

// deftAllocCases are hand-made inputs that broke or strain the allocation:
// float rounding of the last share, fragments smaller than their share,
// ties, zeros, and norm ratios near the limits of float64.
func deftAllocCases() []deftAllocCase {
	return []deftAllocCase{
		// The last fragment's share 7·b/b rounds to 6.999… and floored to 6.
		{"rounding of the last share", []int{100, 100}, []float64{10, 1.1429}, 68},
		{"last fragment smaller than its share", []int{100, 1}, []float64{10, 1}, 50},
		{"all fragments smaller than their share but one", []int{2, 3, 1, 500, 4}, []float64{9, 8, 7, 0.001, 6}, 300},
		{"budget runs out before the minimum of 1 each", []int{50, 50, 50, 50}, []float64{100, 1, 1, 1}, 5},
		{"ties", []int{10, 10, 10, 10, 10, 10, 10}, []float64{1, 1, 1, 1, 1, 1, 1}, 11},
		{"ties and zeros", []int{9, 9, 9, 9, 9}, []float64{0, 2, 0, 2, 2}, 20},
		{"all norms zero", []int{5, 7, 3}, []float64{0, 0, 0}, 10},
		{"zeros absorb what the others cannot", []int{2, 40, 3, 40}, []float64{5, 0, 4, 0}, 60},
		{"huge and tiny ratios", []int{30, 30, 30, 30}, []float64{1e300, 1e-300, 5e-324, 1}, 70},
		{"huge norms", []int{20, 20, 20}, []float64{math.MaxFloat64, math.MaxFloat64, math.MaxFloat64 / 3}, 31},
		{"subnormal norms only", []int{8, 8, 8}, []float64{5e-324, 1e-320, 2e-310}, 13},
		{"k below the number of fragments", []int{4, 4, 4, 4, 4}, []float64{3, 1, 4, 1, 5}, 2},
		{"k equals N", []int{3, 1, 4, 1, 5}, []float64{2, 7, 1, 8, 2}, 14},
		{"empty fragments", []int{0, 6, 0, 6, 0}, []float64{0, 1, 0, 3, 0}, 7},
		{"single fragment", []int{17}, []float64{0.5}, 16},
	}
}

// deftAllocAdversarial draws random inputs built to strain the allocation:
// many ties and zeros, norms spanning the whole float64 range, fragment
// sizes of 0, 1 and 2 next to large ones, budgets from 1 to N.
func deftAllocAdversarial(rng *rand.Rand) deftAllocCase {
	L := 1 + rng.IntN(30)
	c := deftAllocCase{sizes: make([]int, L), norms: make([]float64, L)}
	N := 0
	for f := range L {
		switch rng.IntN(5) {
		case 0:
			c.sizes[f] = rng.IntN(3)
		case 1:
			c.sizes[f] = 1 + rng.IntN(1000)
		default:
			c.sizes[f] = 1 + rng.IntN(20)
		}
		N += c.sizes[f]
		switch rng.IntN(6) {
		case 0:
			c.norms[f] = 0
		case 1:
			c.norms[f] = 1 // ties
		case 2:
			c.norms[f] = math.Ldexp(1+rng.Float64(), rng.IntN(2046)-1074) // anywhere in float64
		case 3:
			c.norms[f] = float64(1 + rng.IntN(3)) // small integers: ties and exact ratios
		default:
			c.norms[f] = rng.ExpFloat64() * math.Pow(10, float64(rng.IntN(12)-6))
		}
		if c.sizes[f] == 0 {
			c.norms[f] = 0
		}
	}
	if N == 0 {
		c.sizes[0], c.norms[0], N = 1, 1, 1
	}
	c.k = 1 + rng.IntN(N)
	if rng.IntN(4) == 0 {
		c.k = N - rng.IntN(min(N, 3))
	}
	return c
}

// TestDeftAllocateSumsToBudget: the allocated k_f always sum to the budget
// exactly — max(k, number of non-empty fragments), the minimum of 1 per
// non-empty fragment being the reference's — with 1 <= k_f <= size for every
// non-empty fragment and 0 for empty ones, on hand-made and random
// adversarial norms.
func TestDeftAllocateSumsToBudget(t *testing.T) {
	cases := deftAllocCases()
	rng := rand.New(rand.NewPCG(41, 42))
	for i := range 5000 {
		c := deftAllocAdversarial(rng)
		c.name = fmt.Sprintf("random %d", i)
		cases = append(cases, c)
	}
	for _, c := range cases {
		L := len(c.sizes)
		frags := make([]deftFrag, L)
		pos, nonEmpty := 0, 0
		for f, s := range c.sizes {
			frags[f] = deftFrag{pos, pos + s, f}
			pos += s
			if s > 0 {
				nonEmpty++
			}
		}
		kf := make([]int, L)
		deftAllocate(kf, frags, c.norms, c.k)
		total := 0
		for f, v := range kf {
			total += v
			if s := c.sizes[f]; s > 0 && (v < 1 || v > s) || s == 0 && v != 0 {
				t.Fatalf("%s: fragment %d of size %d got k_f = %d (sizes %v norms %v k %d)", c.name, f, s, v, c.sizes, c.norms, c.k)
			}
		}
		if want := deftRefAllocate(c.norms, c.sizes, c.k); !slices.Equal(kf, want) {
			t.Fatalf("%s: allocation %v, the exact reference gives %v (sizes %v norms %v k %d)", c.name, kf, want, c.sizes, c.norms, c.k)
		}
		if want := max(c.k, nonEmpty); total != want {
			t.Fatalf("%s: allocation %v sums to %d, want the budget max(k=%d, %d non-empty fragments) = %d (sizes %v norms %v)", c.name, kf, total, c.k, nonEmpty, want, c.sizes, c.norms)
		}
	}
}
