package cuda_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// TestGPULAGSSparCost checks that LAGS' adaptive density measures the
// sparsification time on the GPU, where it is read from events (no host
// wait in a step): after its profiled steps the cost it reports is a
// positive time per element, well below a millisecond.
func TestGPULAGSSparCost(t *testing.T) {
	d := gpu(t)
	layout, err := sparsify.NewLayout([]string{"a", "b", "c"}, []int{3000, 37, 5000})
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	c := comm.Staged(local.New(1).Comm(0))
	r, err := sparsify.New("lags", sparsify.Options{Density: 0.01, Layout: layout, Comm: c, Stream: s, Ops: d.Sparse(),
		Params: sparsify.Values{"merge_size": 1, "max_ratio": 100.0}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	acc := make([]float32, layout.N)
	res, out := upload(t, s, acc), upload(t, s, acc)
	var note string
	for step := 0; r.Profiling(); step++ {
		if step > 100 {
			t.Fatal("still profiling after 100 steps")
		}
		for i := range acc {
			acc[i] = float32(rng.NormFloat64())
		}
		if err := s.Copy(res, device.Host(acc)); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ReduceOn(ctx, res, out, res); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		final := []time.Time{now.Add(2 * time.Millisecond), now.Add(time.Millisecond), now}
		if note, err = r.Profile(ctx, c, step, final); err != nil {
			t.Fatal(err)
		}
	}
	_, after, ok := strings.Cut(note, "sparsification ")
	var ns float64
	if ok {
		_, err = fmt.Sscanf(after, "%g ns per element", &ns)
	}
	if !ok || err != nil {
		t.Fatalf("profiling ended with %q, want its sparsification cost", note)
	}
	if !(ns > 0 && ns < 1e6) {
		t.Errorf("sparsification %g ns per element, want a positive time below 1 ms", ns)
	}
	t.Log(note)
}

// TestGPULAGSGroupsAtOnceMatchCPU: a call's groups, ready together
// (ReduceOn), are started at once: each run of adjacent sparse groups
// selected by one segmented top-k, its residual written in one pass and
// its values and indices all-gathered in one pair of calls, a group kept
// dense (one element) all-reduced on its own. On the GPU out, the residual
// and the statistics (LayerK, the distinct count per group) are the CPU's
// bit for bit, for 1, 2, 3 and 5 workers, one group per tensor and groups
// of several tensors (merge_size 50), with many ties.
func TestGPULAGSGroupsAtOnceMatchCPU(t *testing.T) {
	d := gpu(t)
	layout, err := sparsify.NewLayout([]string{"a", "b", "c", "d", "e", "f", "g"}, []int{1, 40, 7, 300, 2, 61, 3000})
	if err != nil {
		t.Fatal(err)
	}
	for _, merge := range []int{1, 50} {
		for _, n := range []int{1, 2, 3, 5} {
			t.Run(fmt.Sprintf("merge=%d/workers=%d", merge, n), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), uint64(merge)))
				const calls = 3
				accs := make([][][]float32, calls)
				for c := range accs {
					accs[c] = make([][]float32, n)
					for w := range n {
						accs[c][w] = make([]float32, layout.N)
						for i := range accs[c][w] {
							accs[c][w][i] = float32(rng.IntN(41)-20) * 0.125 // many ties
						}
					}
				}
				sameOnBoth(t, d, "lags", layout, accs, func(o *sparsify.Options) {
					o.Params = sparsify.Values{"merge_size": merge}
				})
			})
		}
	}
}
