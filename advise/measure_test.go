package advise

import (
	"context"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// TestSimReduceOverNetwork times Top-k's reducer on 3 in-process workers
// with and without an emulated network: every call has each rank's times
// (wall at least the selection), the summary takes them from the worker of
// the median selection, and over a network of 2 ms latency its
// communication holds the emulated delays (Top-k's all-gathers and union
// all-reduce: several ms) where in-process it takes far less.
func TestSimReduceOverNetwork(t *testing.T) {
	l, err := layout.New([]string{"a", "b"}, []int{3000, 1000})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	grads := make([][]float32, 3)
	for r := range grads {
		grads[r] = make([]float32, l.N)
		for i := range grads[r] {
			grads[r][i] = float32(rng.NormFloat64())
		}
	}
	ctx := context.Background()
	slow := netmodel.Network{Latency: 20 * time.Millisecond, Bandwidth: 1e9}
	var comm [2]float64
	for i, net := range []netmodel.Network{{}, slow} {
		recs, err := simReduceCalls(ctx, "topk", 3, 0.01, net, l, grads, nil, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) < 5 {
			t.Fatalf("%d calls after the first, want at least 5", len(recs))
		}
		for c, call := range recs {
			if len(call) != 3 {
				t.Fatalf("call %d: %d ranks' times", c, len(call))
			}
			for r, x := range call {
				if x.wall <= 0 || x.sel > x.wall || x.comm < 0 {
					t.Fatalf("call %d rank %d: %+v", c, r, x)
				}
			}
		}
		sr := simReduce("topk", 3, 0.01, recs)
		if sr.Method != "topk" || sr.Workers != 3 || !(sr.Select > 0) || sr.Comm < 0 || sr.Other < 0 || sr.Lag < 0 {
			t.Fatalf("summary %+v", sr)
		}
		comm[i] = sr.Comm
	}
	if comm[1] < 3*slow.Latency.Seconds() {
		t.Errorf("communication %v s over a network of %v latency (%v s in process): the network was not emulated", comm[1], slow.Latency, comm[0])
	}
}

// TestSimRounds: short iterations are measured in three interleaved rounds
// of about 12 iterations' time in all (at least 9 s), long ones in one
// (at most 4 minutes).
func TestSimRounds(t *testing.T) {
	for _, tc := range []struct {
		compute, stepCores float64
		p                  int
		rounds             int
		total              time.Duration
	}{
		{0.001, 1, 4, 3, 9 * time.Second},         // NCF: 12 iterations take milliseconds
		{0.45, 1, 4, 3, 10800 * time.Millisecond}, // 12 × 0.45 s × 4/2
		{3, 2, 2, 1, 72 * time.Second},            // ResNet-18: 12 × 3 s × 2·2/2
		{3, 2, 16, 1, 4 * time.Minute},            // capped
	} {
		h := &Host{Compute: tc.compute, StepCores: tc.stepCores, Cores: 2}
		r, d := simRounds(h, tc.p)
		if r != tc.rounds || (d*time.Duration(r)-tc.total).Abs() > time.Millisecond {
			t.Errorf("step %v s, %d workers: %d rounds of %v, want %d rounds, %v in all", tc.compute, tc.p, r, d, tc.rounds, tc.total)
		}
	}
}

// TestParamsForFitsWorkers is a regression test: the spardl-scaling preset
// (SparDL with -teams 2) failed before its first run, because the advisor
// measured SparDL's work outside selection on one worker with two teams.
// The options that keep a method from running on the measuring workers take
// their defaults; the others stay.
func TestParamsForFitsWorkers(t *testing.T) {
	given := sparsify.Values{"teams": 2, "sag": "rsag"}
	if got := paramsFor("spardl", 2, given); !maps.Equal(got, given) {
		t.Errorf("2 workers: %v, want the options as given %v", got, given)
	}
	got := paramsFor("spardl", 1, given)
	if _, ok := got["teams"]; ok {
		t.Errorf("1 worker: %v keeps 2 teams", got)
	}
	m, _ := sparsify.Lookup("spardl")
	r, err := m.Resolve(got)
	if err != nil || m.CheckWorkers(1, r) != nil {
		t.Errorf("1 worker: %v does not run: %v", got, err)
	}
	if got := paramsFor("topk", 1, nil); got != nil {
		t.Errorf("topk: %v, want nil", got)
	}
}

// TestReadHost: measurements read back as written, and a file of the
// older form (the layout as names and sizes) still reads.
func TestReadHost(t *testing.T) {
	dir := t.TempDir()
	h := synthHost()
	p := filepath.Join(dir, "m.json")
	if err := WriteHost(p, h); err != nil {
		t.Fatal(err)
	}
	got, err := ReadHost(p)
	if err != nil || !reflect.DeepEqual(got, h) {
		t.Fatalf("read back %+v, %v; wrote %+v", got, err, h)
	}
	old := filepath.Join(dir, "old.json")
	os.WriteFile(old, []byte(`{"model": "synthetic", "names": ["a", "b"], "sizes": [600000, 400000], "n": 1000000}`), 0o644)
	if got, err := ReadHost(old); err != nil || !reflect.DeepEqual(got.Layout, h.Layout) {
		t.Fatalf("an older file's layout %+v, %v; want %+v", got.Layout, err, h.Layout)
	}
	os.WriteFile(old, []byte(`{"model": "synthetic"}`), 0o644)
	if _, err := ReadHost(old); err == nil || !strings.Contains(err.Error(), "holds no model layout") {
		t.Fatalf("a file without a layout: %v", err)
	}
}
