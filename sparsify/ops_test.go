package sparsify

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm/local"

	"github.com/sparsegrad/sparsegrad/device"
)

// TestCPUOps checks the CPU's Ops against plain loops written here, and its
// refusals (wrong types, short outputs).
func TestCPUOps(t *testing.T) {
	o := CPUOps()
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 7, 4096, 4097, 9000} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.IntN(9)-4) * 0.5 // ties
		}
		// TopK: the k largest magnitudes, ties to lower indices, by sorting.
		for _, k := range []int{0, 1, n / 3, n, n + 2} {
			idx, val := make([]int32, n), make([]float32, n)
			got, err := o.TopK(nil, device.Host(idx), device.Host(val), device.Host(x), k)
			if err != nil {
				t.Fatal(err)
			}
			order := make([]int32, n)
			for i := range order {
				order[i] = int32(i)
			}
			slices.SortStableFunc(order, func(a, b int32) int {
				return -cmpAbs(x[a], x[b])
			})
			want := slices.Clone(order[:min(k, n)])
			slices.Sort(want)
			if got != len(want) || !slices.Equal(idx[:got], want) {
				t.Fatalf("n=%d k=%d: TopK %v…, want %v…", n, k, idx[:min(got, 5)], want[:min(len(want), 5)])
			}
			for j, i := range want {
				if val[j] != x[i] {
					t.Fatalf("n=%d k=%d: value %d", n, k, j)
				}
			}
		}
		// SelectAbove, and a short output.
		var want []int32
		for i, v := range x {
			if math.Abs(float64(v)) >= 1 {
				want = append(want, int32(i))
			}
		}
		idx := make([]int32, n)
		got, err := o.SelectAbove(nil, device.Host(idx), device.Buffer{}, device.Host(x), 1)
		if err != nil || got != len(want) || !slices.Equal(idx[:got], want) {
			t.Fatalf("n=%d: SelectAbove %d (%v), want %d", n, got, err, len(want))
		}
		if len(want) > 0 {
			got, err := o.SelectAbove(nil, device.Host(idx[:len(want)-1]), device.Buffer{}, device.Host(x), 1)
			if !errors.Is(err, ErrCapacity) || got != len(want) {
				t.Fatalf("n=%d: short output: %d, %v", n, got, err)
			}
		}
		// Gather, scatter, accumulate.
		if n > 0 {
			sel := want
			g := make([]float32, len(sel))
			if err := o.Gather(nil, device.Host(g), device.Host(x), device.Host(sel)); err != nil {
				t.Fatal(err)
			}
			d := slices.Clone(x)
			if err := o.ScatterAdd(nil, device.Host(d), device.Host(sel), device.Host(g), 2); err != nil {
				t.Fatal(err)
			}
			for j, i := range sel {
				if g[j] != x[i] || d[i] != x[i]+2*x[i] {
					t.Fatalf("n=%d: gather/scatter at %d", n, i)
				}
			}
			res := slices.Clone(x)
			grad := slices.Clone(x)
			grad[n-1] = float32(math.Inf(1))
			if bad, err := o.Accumulate(nil, device.Host(res), device.Host(grad), 0.5); err != nil || bad != n-1 {
				t.Fatalf("n=%d: Accumulate's first non-finite %d (%v), want %d", n, bad, err, n-1)
			}
		}
	}
	// Refusals.
	if _, err := o.TopK(nil, device.Host(make([]int64, 3)), device.Buffer{}, device.Host(make([]float32, 3)), 2); err == nil {
		t.Error("TopK wrote indices into int64")
	}
	if _, err := o.TopK(nil, device.Host(make([]int32, 1)), device.Buffer{}, device.Host(make([]float32, 3)), 2); err == nil {
		t.Error("TopK wrote 2 indices into 1 slot")
	}
	if err := o.GatherStrided(nil, device.Host(make([]float32, 3)), device.Host(make([]float32, 10)), 2, 4); err == nil {
		t.Error("a strided gather past the end was accepted")
	}
	if _, err := o.SegmentSumSquares(nil, device.Host(make([]float32, 3)), []int{0, 4}); err == nil {
		t.Error("a segment past the end was accepted")
	}
}

func cmpAbs(a, b float32) int {
	x, y := math.Abs(float64(a)), math.Abs(float64(b))
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// TestSegmentSumSquares: the blocked sum against its definition.
func TestSegmentSumSquares(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 3, 4, 4095, 4096, 4099, 12289} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		var want float64
		for lo := 0; lo < n; lo += 4096 {
			blk := x[lo:min(n, lo+4096)]
			var s [4]float64
			for i, v := range blk {
				if i < len(blk)-len(blk)%4 {
					s[i%4] += float64(v) * float64(v)
				} else {
					s[0] += float64(v) * float64(v)
				}
			}
			want += (s[0] + s[1]) + (s[2] + s[3])
		}
		if got := segmentSumSquares(x); got != want {
			t.Fatalf("n=%d: %v, want %v", n, got, want)
		}
	}
}

// TestDeviceMethodsDocumented: every method reduces in device memory
// (DeviceReducer), as the package documentation's section "Devices" says.
func TestDeviceMethodsDocumented(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join(strings.Fields(strings.ReplaceAll(string(src), "//", " ")), " ")
	if !strings.Contains(doc, "in package comm's canonical order. Every method does.") {
		t.Fatal("doc.go's Devices section no longer says that every method reduces in device memory")
	}
	for _, name := range Names() {
		l, _ := FlatLayout(10)
		if _, err := New(name, Options{Density: 0.5, Layout: l, Comm: local.New(1).Comm(0)}); err != nil {
			t.Fatal(err)
		}
	}
}
