package sparsify

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
)

// TestMSTopkDeviceSelectionMatchesHost runs selectDevice's passes (their
// Host code, which mirrors mstopk.cu line for line) on the CPU and checks
// that they select exactly what selectOn selects, with the same thres1:
// sizes around a chunk and a block (1 to 9,000 elements), k = 1, a few,
// half, all but one and all, normal values, small integers (ties),
// mostly zeros, all equal, NaN and ±Inf among them, two calls on the same
// scratch (more than k elements at ±Inf: the first k and the count). cuda's tests check the CUDA C against the CPU's selection.
func TestMSTopkDeviceSelectionMatchesHost(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 33))
	gens := map[string]harnessGen{
		"normal": genNormal, "ints": genSmallInts, "sparse": genSparse,
		"equal": func(_ *rand.Rand, x []float32) {
			for i := range x {
				x[i] = -0.5
			}
		},
		"nan-inf": func(rng *rand.Rand, x []float32) {
			genNormal(rng, x)
			for range 1 + len(x)/50 {
				x[rng.IntN(len(x))] = []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))}[rng.IntN(3)]
			}
		},
	}
	names := []string{"normal", "ints", "sparse", "equal", "nan-inf"}
	for _, n := range []int{1, 2, 3, 255, 256, 257, 4097, 9000} {
		for _, name := range names {
			x := make([]float32, n)
			for _, k := range slices.Compact([]int{1, min(n, 5), max(1, n/2), max(1, n-1), n}) {
				t.Run(fmt.Sprintf("n=%d/%s/k=%d", n, name, k), func(t *testing.T) {
					host, dev, v := &mstopk{}, &mstopk{}, newVecs(Options{})
					dsel := make([]int32, k)
					for call := range 2 {
						gens[name](rng, x)
						seed := uint64(17 + call)
						want, err := host.selectOn(&v, device.Host(x), n, k, seed)
						if err != nil {
							t.Fatal(err)
						}
						if err := dev.selectDevice(&v, device.Host(x), device.Host(dsel), n, k, seed); err != nil {
							t.Fatal(err)
						}
						st := dev.dState.Float64s()
						got, m := st[mstopkThres1Word], int(st[mstopkThres1Word+1])
						if math.Float64bits(got) != math.Float64bits(want) && !(math.IsNaN(got) && math.IsNaN(want)) {
							t.Fatalf("call %d: thres1 %v, the host's %v", call, got, want)
						}
						// More than k elements at +Inf select them all: the
						// device writes the first k and counts the rest.
						if m != len(host.sel) || !slices.Equal(dsel[:min(m, k)], host.sel[:min(m, k)]) {
							t.Fatalf("call %d: selected %d %v, the host %d %v", call, m, dsel[:min(m, k)], len(host.sel), host.sel)
						}
					}
				})
			}
		}
	}
}
