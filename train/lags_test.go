package train

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/rundir/rundirtest"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// TestLAGSProfilesAfterWarmup: LAGS' adaptive density is set from the
// backward times of steps 6–15 (after 5 warm-up steps), not from step 1:
// every group keeps -density's k through step 15 and moves from step 16
// on; the run says which steps in run.json's notes.
func TestLAGSProfilesAfterWarmup(t *testing.T) {
	// LAGS' profile (sparsify/lags.go): 10 steps after 5.
	const lagsProfileWarmup, lagsProfileSteps = 5, 10
	const steps = lagsProfileWarmup + lagsProfileSteps + 2
	c := ncfConfig(t, 2, steps)
	c.Sparsifier, c.Density = "lags", Set(0.01)
	c.MethodOptions = sparsify.Values{"merge_size": 1, "max_ratio": 1000.0}
	// A declared network: every rank models the same one.
	c.NetLatency, c.NetBandwidth = time.Microsecond, 1e12
	runLosses(t, c)
	var ks [][]int
	for _, r := range rundirtest.Records(t, c.Out) {
		if r["type"] != "step" {
			continue
		}
		var k []int
		for _, v := range r["layer_k"].([]any) {
			k = append(k, int(v.(float64)))
		}
		ks = append(ks, k)
	}
	if len(ks) != steps {
		t.Fatalf("%d step records, want %d", len(ks), steps)
	}
	last := lagsProfileWarmup + lagsProfileSteps
	for s := 1; s < last; s++ {
		if !slices.Equal(ks[s], ks[0]) {
			t.Fatalf("step %d selected %v per tensor, step 1 %v: the density must not move before the profiled steps end (step %d)", s+1, ks[s], ks[0], last)
		}
	}
	if slices.Equal(ks[last], ks[last-1]) {
		t.Fatalf("step %d selected %v, as before: the adaptive density did not act after the profiled steps", last+1, ks[last])
	}
	info, err := readRunInfo(c.Out)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("lags: adaptive density from steps %d–%d (after %d warm-up steps)", lagsProfileWarmup+1, last, lagsProfileWarmup)
	if !slices.ContainsFunc(info.Notes, func(n string) bool { return strings.HasPrefix(n, want) }) {
		t.Fatalf("run.json notes %q, want one starting %q", info.Notes, want)
	}
}

// TestMethodNotes: a run whose method does nothing says so.
func TestMethodNotes(t *testing.T) {
	l, err := sparsify.NewLayout([]string{"a", "b"}, []int{1000, 300000})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		c     Config
		total int
		want  []string
	}{
		{"dragonn below the cut-off", Config{Sparsifier: "dragonn", MethodOptions: sparsify.Values{"min_tensor": 400000, "dense_warmup": 0}}, 100,
			[]string{"dragonn: no tensor of  has more than -min-tensor 400000 elements (the largest, b, has 300000): every tensor is all-reduced dense"}},
		{"dragonn partly", Config{Sparsifier: "dragonn", Optimizer: "sgd", Momentum: Set(0.9), MethodOptions: sparsify.Values{"min_tensor": 204800, "dense_warmup": 0}}, 100,
			[]string{"dragonn: the tensors of more than -min-tensor 204800 elements, 99.7 % of the 301000 parameters, are sparsified"}},
		{"dragonn with adam", Config{Sparsifier: "dragonn", Optimizer: "adam", MethodOptions: sparsify.Values{"min_tensor": 0, "dense_warmup": 0}}, 100,
			[]string{"dragonn: no SGD momentum to correct (-optimizer adam"}},
		{"warm-up as long as the run", Config{Sparsifier: "oktopk", MethodOptions: sparsify.Values{"dense_warmup": 512}}, 512,
			[]string{"oktopk: -dense-warmup 512 is at least the run's 512 steps: every step is a dense all-reduce"}},
		{"warm-up shorter", Config{Sparsifier: "topkdsa", MethodOptions: sparsify.Values{"dense_warmup": 512}}, 513, nil},
		{"lags never profiled", Config{Sparsifier: "lags", Density: Set(0.01), MethodOptions: sparsify.Values{"max_ratio": 100.0}}, 10,
			[]string{"lags: -max-ratio 100: the run's 10 steps end before the backward pass is profiled (steps 6–15)"}},
		{"lags fixed", Config{Sparsifier: "lags", Density: Set(0.01), MethodOptions: sparsify.Values{"max_ratio": 0.0}}, 10, nil},
		{"topk", Config{Sparsifier: "topk"}, 1, nil},
		{"dgc within its warm-up", Config{Sparsifier: "dgc", Optimizer: "sgd", Momentum: Set(0.9), Density: Set(0.001), MethodOptions: sparsify.Values{"sparsity_warmup": 4}}, 400,
			[]string{"dgc: the run's 400 steps end within the density warm-up (-sparsity-warmup 4 epochs of 100 steps)"}},
		{"dgc after its warm-up", Config{Sparsifier: "dgc", Optimizer: "sgd", Momentum: Set(0.9), Density: Set(0.001), MethodOptions: sparsify.Values{"sparsity_warmup": 4}}, 401, nil},
		{"dgc with adam", Config{Sparsifier: "dgc", Optimizer: "adam", MethodOptions: sparsify.Values{"sparsity_warmup": 0}}, 401,
			[]string{"dgc: no SGD momentum to correct (-optimizer adam"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := methodNotes(tc.c, l, tc.total, 100)
			if len(got) != len(tc.want) {
				t.Fatalf("notes %q, want %d starting %q", got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Fatalf("note %q, want it to start %q", got[i], tc.want[i])
				}
			}
		})
	}
}
