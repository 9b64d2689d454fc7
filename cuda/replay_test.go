package cuda_test

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/advise"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/recorded"
	"github.com/sparsegrad/sparsegrad/train"
)

// TestReplayOnGPU replays recorded NCF gradients with -device cuda (two
// workers sharing the GPU, the recorded model's copies on each worker's
// stream, the reducers' GPU kernels; lags pipelined through the recorded
// model's hook) and requires the CPU replay's actual densities and bytes,
// and its error norms to float32 rounding.
func TestReplayOnGPU(t *testing.T) {
	gpu(t)
	dir := ml100k(t)
	grads := filepath.Join(t.TempDir(), "grads")
	c := train.Config{Model: "ncf", Dataset: "ml-100k", DataDir: dir, Workers: train.Set(2), Steps: 3, Out: t.TempDir(), Quiet: true, BLAS: "gonum",
		MaxEvalBatches: 1, RecordGradients: grads}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := train.Run(ctx, c, train.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, sp := range []string{"topk", "deft", "lags"} {
		var recs [2][]stepRec
		for k, dev := range []string{"cpu", "cuda"} {
			out := filepath.Join(t.TempDir(), dev)
			rc := train.Config{Gradients: grads, Sparsifier: sp, Density: train.Set(0.05), Device: dev, Out: out, Quiet: true}
			if err := train.Run(ctx, rc, train.Options{}); err != nil {
				t.Fatalf("%s replay on %s: %v", sp, dev, err)
			}
			recs[k] = readSteps(t, out)
		}
		if len(recs[0]) != 3 || len(recs[1]) != 3 {
			t.Fatalf("%s: %d and %d steps", sp, len(recs[0]), len(recs[1]))
		}
		for i := range recs[0] {
			a, b := recs[0][i], recs[1][i]
			if a.ActualDensity != b.ActualDensity || a.BytesSent != b.BytesSent || math.Abs(a.ErrorNorm-b.ErrorNorm) > 1e-5*a.ErrorNorm {
				t.Errorf("%s step %d: CPU %+v, GPU %+v", sp, i+1, a, b)
			}
		}
	}
}

type stepRec struct {
	Type          string  `json:"type"`
	ActualDensity float64 `json:"actual_density"`
	BytesSent     float64 `json:"bytes_sent"`
	ErrorNorm     float64 `json:"error_norm"`
}

func readSteps(t *testing.T, dir string) []stepRec {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []stepRec
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var r stepRec
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.Type == "step" {
			out = append(out, r)
		}
	}
	return out
}

// TestAdviseRecordedOnGPU: train advise -gradients -device cuda measures
// every method's selection, the update and error feedback on the GPU with
// the reducers' kernels.
func TestAdviseRecordedOnGPU(t *testing.T) {
	gpu(t)
	dir := filepath.Join(t.TempDir(), "rec")
	params := []recorded.Param{{Tensor: layout.Tensor{Name: "enc.self_attn.in_proj_weight", Shape: []int{96, 64}, Size: 6144}}, {Tensor: layout.Tensor{Name: "b", Shape: []int{7}, Size: 7}}, {Tensor: layout.Tensor{Name: "head.weight", Shape: []int{50, 64}, Size: 3200}}}
	w, err := recorded.Create(dir, recorded.Manifest{Model: "toy", Source: "pytorch", Mode: "simulated", Workers: 3, Batch: 4, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for rank := range 3 {
		if err := w.Write(1, rank, randVec(r, 6144+7+3200, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(1, recorded.StepTime{Seconds: 0.02, Device: "cuda:0"}); err != nil {
		t.Fatal(err)
	}
	methods := []string{"dense", "topk", "deft", "micro", "oktopk", "dgc", "spardl", "lags"}
	h, err := advise.MeasureRecorded(context.Background(), advise.RecordedConfig{Dir: dir, Device: "cuda", Densities: []float64{0.01}, Methods: methods})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h.Device, "cuda:") || !(h.Update > 0) || !(h.Other > 0) || len(h.Selections) != len(methods)-1 {
		t.Fatalf("host %+v", h)
	}
	for _, s := range h.Selections {
		if !(s.Seconds > 0) {
			t.Errorf("%s: selection %v s on the GPU", s.Method, s.Seconds)
		}
	}
}
