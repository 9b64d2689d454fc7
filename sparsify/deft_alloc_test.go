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

// deftAllocCases are hand-made inputs that strain the allocation: float
// rounding of a share, fragments smaller than their share, the budget
// running out, ties, zeros, and norm ratios near the limits of float64.
func deftAllocCases() []deftAllocCase {
	return []deftAllocCase{
		// The reference's float64 remain_norm after the first fragment is
		// 7.335 − 5.235 = 2.1000000000000005: the last share of exactly 18
		// comes out as 17.99… and is floored to 17.
		{"rounding of the last share", []int{100, 100}, []float64{5.235, 2.1}, 62},
		{"rounding of a middle share", []int{100, 100, 100}, []float64{7.703, 2.423, 0.5}, 22},
		{"last fragment smaller than its share", []int{100, 1}, []float64{10, 1}, 50},
		{"all fragments smaller than their share but one", []int{2, 3, 1, 500, 4}, []float64{9, 8, 7, 0.001, 6}, 300},
		{"budget runs out before the minimum of 1 each", []int{50, 50, 50, 50}, []float64{100, 1, 1, 1}, 5},
		{"ties", []int{10, 10, 10, 10, 10, 10, 10}, []float64{1, 1, 1, 1, 1, 1, 1}, 11},
		{"three ties share 200", []int{100, 100, 100}, []float64{2, 2, 2}, 200},
		{"ties and zeros", []int{9, 9, 9, 9, 9}, []float64{0, 2, 0, 2, 2}, 20},
		{"all norms zero", []int{5, 7, 3}, []float64{0, 0, 0}, 10},
		{"zeros after the budget is spent", []int{2, 40, 3, 40}, []float64{5, 0, 4, 0}, 60},
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

// deftAllocCheck runs deftAllocator.allocate on c and compares it with the
// plain reference of the authors' rule (deftRefAllocate), and checks the
// bounds every k_f keeps: 1 <= k_f <= size, 0 for an empty fragment.
func deftAllocCheck(t *testing.T, a *deftAllocator, c deftAllocCase) []int {
	t.Helper()
	L := len(c.sizes)
	frags := make([]deftFrag, L)
	pos := 0
	for f, s := range c.sizes {
		frags[f] = deftFrag{pos, pos + s, f}
		pos += s
	}
	kf := make([]int, L)
	for f := range kf {
		kf[f] = -7 // stale values must be overwritten
	}
	a.allocate(kf, frags, c.norms, c.k)
	for f, v := range kf {
		if s := c.sizes[f]; s > 0 && (v < 1 || v > s) || s == 0 && v != 0 {
			t.Fatalf("%s: fragment %d of size %d got k_f = %d (sizes %v norms %v k %d)", c.name, f, s, v, c.sizes, c.norms, c.k)
		}
	}
	if want := deftRefAllocate(c.norms, c.sizes, c.k); !slices.Equal(kf, want) {
		t.Fatalf("%s: allocation %v, the authors' rule gives %v (sizes %v norms %v k %d)", c.name, kf, want, c.sizes, c.norms, c.k)
	}
	return kf
}

// TestDeftAllocateIsTheAuthorsRule: the allocation is the authors' greedy
// rule, with exact shares, on hand-made and random adversarial norms (ties,
// zeros, fragments smaller than their share, norms across the whole float64
// range), one allocator reused across all of them.
func TestDeftAllocateIsTheAuthorsRule(t *testing.T) {
	cases := deftAllocCases()
	rng := rand.New(rand.NewPCG(41, 42))
	for i := range 5000 {
		c := deftAllocAdversarial(rng)
		c.name = fmt.Sprintf("random %d", i)
		cases = append(cases, c)
	}
	var a deftAllocator
	for _, c := range cases {
		deftAllocCheck(t, &a, c)
	}
}

// TestDeftAllocateHandMade pins the hand-made cases' allocations, worked
// out by hand from the rule (not from either implementation).
func TestDeftAllocateHandMade(t *testing.T) {
	want := map[string][]int{
		// 62·5.235/7.335 = 44.2…: 44; then 18·2.1/2.1 = 18.
		"rounding of the last share": {44, 18},
		// 22·7.703/10.626 = 15.9…: 15; 7·2.423/2.923 = 5.8…: 5; 2·0.5/0.5 = 2.
		"rounding of a middle share": {15, 5, 2},
		// Ties, the higher fragment first: 200/3 = 66.6…: 66; 134/2 = 67; 67.
		"three ties share 200": {67, 67, 66},
		// 50·10/11 = 45.4…: 45; 5·1/1 = 5 > size 1: 1 (4 units unsent).
		"last fragment smaller than its share": {45, 1},
		// 5·100/103 = 4.8…: 4; remain 1: 1·1/3 = 0.3…: 1; remain 0: 1; 1 (total 7 > 5).
		"budget runs out before the minimum of 1 each": {4, 1, 1, 1},
		// 60·5/9 = 33.3… > size 2: 2; 58·4/4 = 58 > 3: 3; zeros: 1 each (55 unsent).
		"zeros after the budget is spent": {2, 1, 3, 1},
		// Fragment 0 has size 0: 0; 7·3/4 = 5.25: 5; 2·1/1 = 2.
		"empty fragments": {0, 2, 0, 5, 0},
	}
	var a deftAllocator
	for _, c := range deftAllocCases() {
		w, ok := want[c.name]
		if !ok {
			continue
		}
		if got := deftAllocCheck(t, &a, c); !slices.Equal(got, w) {
			t.Errorf("%s: allocation %v, want %v", c.name, got, w)
		}
		delete(want, c.name)
	}
	if len(want) > 0 {
		t.Fatalf("cases not found: %v", want)
	}
}

// TestDeftAllocateFixesFloatRounding: the reference code's float64 shares
// (deftFloatAllocate) floor exact integer shares on some inputs; the
// allocation does not. The hand-made rounding cases are such inputs, and
// random ones are found too.
func TestDeftAllocateFixesFloatRounding(t *testing.T) {
	var a deftAllocator
	for _, c := range deftAllocCases()[:2] {
		exact := deftAllocCheck(t, &a, c)
		if fl := deftFloatAllocate(c.norms, c.sizes, c.k); slices.Equal(fl, exact) {
			t.Fatalf("%s: the float64 rule gives %v too: the case no longer shows the defect", c.name, fl)
		}
	}
	rng := rand.New(rand.NewPCG(8, 9))
	differ := 0
	for range 20000 {
		L := 2 + rng.IntN(3)
		c := deftAllocCase{name: "random", sizes: make([]int, L), norms: make([]float64, L), k: 1 + rng.IntN(100)}
		for f := range L {
			c.sizes[f] = 100
			c.norms[f] = math.Round((0.1+9.9*rng.Float64())*1000) / 1000 // decimals: inexact in binary
		}
		exact := deftAllocCheck(t, &a, c)
		if !slices.Equal(deftFloatAllocate(c.norms, c.sizes, c.k), exact) {
			differ++
		}
	}
	if differ == 0 {
		t.Fatal("the float64 rule never differed from the exact one on 20000 random inputs")
	}
	t.Logf("the float64 rule floored a share on %d of 20000 random inputs", differ)
}

// TestDeftAllocateOnWorkerCounts runs the allocation on DEFT's own
// fragments of random layouts cut for 1, 2, 3, 5 and 16 workers, with
// random norms (ties and zeros among them), against the authors' rule.
func TestDeftAllocateOnWorkerCounts(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 16))
	var a deftAllocator
	for _, n := range harnessWorkerCounts {
		for trial := range 300 {
			l, err := randomLayout(rng, 1+rng.IntN(3000))
			if err != nil {
				t.Fatal(err)
			}
			frags := deftFragments(l, n)
			c := deftAllocCase{name: fmt.Sprintf("n=%d trial %d", n, trial), sizes: make([]int, len(frags)), norms: make([]float64, len(frags))}
			for f, fr := range frags {
				c.sizes[f] = fr.size()
				switch rng.IntN(5) {
				case 0:
					c.norms[f] = 0
				case 1:
					c.norms[f] = 0.5 // ties
				default:
					c.norms[f] = rng.ExpFloat64() * math.Pow(10, float64(rng.IntN(8)-4))
				}
				if c.sizes[f] == 0 {
					c.norms[f] = 0
				}
			}
			c.k = BudgetK([]float64{1e-9, 0.001, 0.01, 0.1, 0.5, 1}[rng.IntN(6)], l.N)
			deftAllocCheck(t, &a, c)
		}
	}
}

// TestDeftLog2: the packing's log2 (deftLog2, which deft.cu computes the
// same way) is exact on powers of two and within one unit in the last
// place of math.Log2 on every budget up to 2^20 and on random ones up to
// 2^31 (on amd64 it gives math.Log2's bits on all of them).
func TestDeftLog2(t *testing.T) {
	check := func(i int) {
		got, want := deftLog2(float64(i)), math.Log2(float64(i))
		if d := math.Float64bits(got) - math.Float64bits(want); got != want && d+1 > 2 {
			t.Fatalf("deftLog2(%d) = %v, math.Log2 %v", i, got, want)
		}
	}
	for e := 1; e < 31; e++ {
		if got := deftLog2(math.Ldexp(1, e)); got != float64(e) {
			t.Fatalf("deftLog2(2^%d) = %v", e, got)
		}
	}
	for i := 2; i <= 1<<20; i++ {
		check(i)
	}
	r := rand.New(rand.NewPCG(2, 31))
	for range 1 << 18 {
		check(2 + r.IntN(1<<31-2))
	}
}
