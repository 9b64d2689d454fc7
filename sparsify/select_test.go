package sparsify

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
)

// selRefTopK is the obvious top-k: sort all indices by decreasing |x| (ties:
// lower index first), keep k, sort ascending.
func selRefTopK(x []float32, k int) []int32 {
	return selRefTopKOrdered(selRefOrder(x), k)
}

// selRefOrder is every index of x by decreasing |x|, ties by lower index.
func selRefOrder(x []float32) []int32 {
	idx := make([]int32, len(x))
	for i := range idx {
		idx[i] = int32(i)
	}
	sort.SliceStable(idx, func(a, b int) bool {
		return math.Abs(float64(x[idx[a]])) > math.Abs(float64(x[idx[b]]))
	})
	return idx
}

// selRefTopKOrdered takes the first k of order, sorted ascending.
func selRefTopKOrdered(order []int32, k int) []int32 {
	k = max(0, min(k, len(order)))
	out := slices.Clone(order[:k])
	slices.Sort(out)
	return out
}

// selRefAbove is a linear scan.
func selRefAbove(x []float32, t float32) []int32 {
	out := []int32{}
	for i, v := range x {
		if float32(math.Abs(float64(v))) >= t {
			out = append(out, int32(i))
		}
	}
	return out
}

// selGen makes test vectors of several shapes.
var selGen = map[string]func(r *rand.Rand, n int) []float32{
	"normal": func(r *rand.Rand, n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	},
	"ties": func(r *rand.Rand, n int) []float32 { // few distinct values, both signs, zeros
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.IntN(5) - 2)
		}
		return x
	},
	"zeros": func(r *rand.Rand, n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			if r.IntN(10) == 0 {
				x[i] = float32(r.NormFloat64())
			} else if r.IntN(2) == 0 {
				x[i] = float32(math.Copysign(0, -1))
			}
		}
		return x
	},
	"onebucket": func(r *rand.Rand, n int) []float32 { // all keys share the top radix bucket
		x := make([]float32, n)
		for i := range x {
			v := 1 + float32(r.IntN(1<<16))/(1<<20)
			if r.IntN(2) == 0 {
				v = -v
			}
			x[i] = v
		}
		return x
	},
	"wide": func(r *rand.Rand, n int) []float32 { // magnitudes across many octaves, subnormals too
		x := make([]float32, n)
		for i := range x {
			x[i] = math.Float32frombits(r.Uint32()&^(0xff<<23) | uint32(r.IntN(255))<<23)
		}
		return x
	},
}

var selSizes = []int{0, 1, 2, 3, 7, 64, 65, 1000, selParallelMin - 1, selParallelMin, selParallelMin + 1, 3*selParallelMin + 7}

func selKs(n int) []int {
	ks := []int{-1, 0, 1, 2, n / 1000, n / 100, n / 7, n / 2, n - 1, n, n + 1}
	return ks
}

func TestSelectPrimitives(t *testing.T) {
	procs := []int{runtime.GOMAXPROCS(0)}
	if !testing.Short() {
		procs = append(procs, 1, 3, 5) // exercise other chunk counts
	}
	for _, gp := range procs {
		prev := runtime.GOMAXPROCS(gp)
		for name, gen := range selGen {
			for _, n := range selSizes {
				if testing.Short() && n > selParallelMin+1 {
					continue
				}
				r := rand.New(rand.NewPCG(uint64(n), uint64(len(name))))
				x := gen(r, n)
				t.Run(fmt.Sprintf("procs%d/%s/n%d", gp, name, n), func(t *testing.T) {
					order := selRefOrder(x)
					for _, k := range selKs(n) {
						got := TopK(nil, x, k)
						want := selRefTopKOrdered(order, k)
						if !slices.Equal(got, want) {
							t.Fatalf("TopK(k=%d): got %d indices, want %d; first diff at %d", k, len(got), len(want), selFirstDiff(got, want))
						}
						if k >= 1 && k <= n {
							thr := float32(math.Abs(float64(x[order[k-1]])))
							if g, w := KthLargestAbs(x, k), thr; g != w {
								t.Fatalf("KthLargestAbs(k=%d) = %v, want %v", k, g, w)
							}
							// The threshold at the k-th magnitude selects a superset of the top-k.
							if got, want := SelectAbove(nil, x, thr), selRefAbove(x, thr); !slices.Equal(got, want) {
								t.Fatalf("SelectAbove(%v): got %d indices, want %d", thr, len(got), len(want))
							}
						}
					}
					for _, thr := range []float32{0, 0.5, 1, 3, float32(math.Inf(1)), -1} {
						if got, want := SelectAbove(nil, x, thr), selRefAbove(x, thr); !slices.Equal(got, want) {
							t.Fatalf("SelectAbove(%v): got %d indices, want %d", thr, len(got), len(want))
						}
					}
				})
			}
		}
		runtime.GOMAXPROCS(prev)
	}
}

func selFirstDiff(a, b []int32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestTopKReusesDst(t *testing.T) {
	x := []float32{3, -1, 4, -1, 5, -9, 2, 6}
	dst := make([]int32, 1, 100)
	dst[0] = 77
	got := TopK(dst, x, 3)
	if want := []int32{4, 5, 7}; !slices.Equal(got, want) {
		t.Fatalf("TopK = %v, want %v", got, want)
	}
	if &got[0] != &dst[:1][0] {
		t.Fatal("TopK did not reuse dst's storage")
	}
	if got := SelectAbove(dst, x, 4); !slices.Equal(got, []int32{2, 4, 5, 7}) {
		t.Fatalf("SelectAbove = %v", got)
	}
}

func TestTopKTieRule(t *testing.T) {
	x := []float32{1, -2, 2, 0, -2, 2, 1}
	for k, want := range [][]int32{{}, {1}, {1, 2}, {1, 2, 4}, {1, 2, 4, 5}, {0, 1, 2, 4, 5}} {
		if got := TopK(nil, x, k); !slices.Equal(got, want) {
			t.Errorf("TopK(k=%d) = %v, want %v", k, got, want)
		}
	}
}

func TestSelectNaN(t *testing.T) {
	nan := float32(math.NaN())
	x := []float32{1, nan, 3, 2}
	if got := TopK(nil, x, 1); !slices.Equal(got, []int32{1}) {
		t.Errorf("TopK with NaN = %v, want [1] (NaN ranks largest, as documented)", got)
	}
	if got := SelectAbove(nil, x, 0); !slices.Equal(got, []int32{0, 2, 3}) {
		t.Errorf("SelectAbove with NaN = %v, want [0 2 3]", got)
	}
	if got := SelectAbove(nil, x, nan); len(got) != 0 {
		t.Errorf("SelectAbove(NaN) = %v, want none", got)
	}
}

func TestKthLargestAbsPanics(t *testing.T) {
	for _, k := range []int{0, 4} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("KthLargestAbs(k=%d) of 3 elements did not panic", k)
				}
			}()
			KthLargestAbs([]float32{1, 2, 3}, k)
		}()
	}
}

func TestRandomK(t *testing.T) {
	for _, n := range []int{0, 1, 2, 5, 64, 100, 1000, 100003} {
		for _, k := range []int{-1, 0, 1, 2, n / 100, n / 512, n/512 + 1, n / 2, n - 1, n, n + 3} {
			for seed := range uint64(3) {
				got := RandomK(nil, n, k, seed)
				wantLen := max(0, min(k, n))
				if len(got) != wantLen {
					t.Fatalf("RandomK(n=%d, k=%d): %d indices, want %d", n, k, len(got), wantLen)
				}
				for i, v := range got {
					if v < 0 || int(v) >= n || (i > 0 && got[i-1] >= v) {
						t.Fatalf("RandomK(n=%d, k=%d): not distinct ascending in range at %d: %v", n, k, i, got[max(0, i-1):i+1])
					}
				}
				if again := RandomK(make([]int32, 5), n, k, seed); !slices.Equal(got, again) {
					t.Fatalf("RandomK(n=%d, k=%d, seed=%d) differs between calls", n, k, seed)
				}
			}
			if k > 2 && k < n-2 && slices.Equal(RandomK(nil, n, k, 1), RandomK(nil, n, k, 2)) {
				t.Errorf("RandomK(n=%d, k=%d) gives the same set for seeds 1 and 2", n, k)
			}
		}
	}
}

// TestRandomKUniform checks, by a chi-squared test over many seeds, that every
// index is drawn equally often, for both the sparse and the dense code path.
func TestRandomKUniform(t *testing.T) {
	const n, trials = 200, 4000
	for _, k := range []int{2, 3, 50, 150} {
		counts := make([]float64, n)
		for s := range uint64(trials) {
			for _, v := range RandomK(nil, n, k, s) {
				counts[v]++
			}
		}
		exp := float64(trials*k) / n
		var chi float64
		for _, c := range counts {
			chi += (c - exp) * (c - exp) / exp
		}
		// Without replacement the variance shrinks by (n-k)/(n-1); correct for it.
		chi /= float64(n-k) / float64(n-1)
		// 199 degrees of freedom: mean 199, sd ≈ 20; 300 is a > 4.5 sd excursion.
		if chi > 300 {
			t.Errorf("RandomK(n=%d, k=%d): chi-squared %.1f over %d seeds, indices not uniform", n, k, chi, trials)
		}
	}
}

// TestAccumulateParallel compares the fused parallel Memory.Accumulate with a
// plain loop, and checks that the first non-finite element is named, for
// sizes on both sides of the parallel cutoff.
func TestAccumulateParallel(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, n := range []int{1, 5, selParallelMin - 1, selParallelMin, 3*selParallelMin + 5} {
		for _, lrScaled := range []bool{false, true} {
			m := NewMemory(n, lrScaled)
			g := make([]float32, n)
			for i := range g {
				m.Residual[i] = float32(r.NormFloat64())
				g[i] = float32(r.NormFloat64())
			}
			want := slices.Clone(m.Residual)
			scale := float32(1)
			if lrScaled {
				scale = 0.1
			}
			for i := range want {
				want[i] += scale * g[i]
			}
			acc, err := m.Accumulate(g, 0.1)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(acc, want) {
				t.Fatalf("n=%d lrScaled=%v: Accumulate differs from the plain loop", n, lrScaled)
			}
			// Two bad elements, the later one in an earlier position of its
			// chunk: the error must name the first.
			bad1, bad2 := n-1, n/2
			if n > 1 {
				bad1, bad2 = n/2+n/4, n/2
			}
			g2 := make([]float32, n)
			g2[bad1] = float32(math.Inf(-1))
			g2[bad2] = float32(math.NaN())
			_, err = m.Accumulate(g2, 1)
			if first := min(bad1, bad2); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("element %d ", first)) {
				t.Fatalf("n=%d: error %v, want one naming element %d", n, err, first)
			}
		}
	}
}
