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
