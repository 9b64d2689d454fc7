package cuda_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/realdata"
	"github.com/sparsegrad/sparsegrad/train"
)

// TestTrainOnGPU runs the trainer with -device cuda — two in-process
// workers sharing the GPU, each with its own stream, the gradient staged
// through host memory for the reducer, the optimizer on the device — and
// with -device cpu on the same real data and seed: the per-step mean
// losses agree within float32 rounding.
func TestTrainOnGPU(t *testing.T) {
	gpu(t)
	dir := os.Getenv("TRAIN_DATA_DIR") // the GPU machine's copy (scripts/gpu-verify.sh)
	if dir == "" {
		dir = filepath.Join("..", "..", "shared", "data")
	}
	dir = realdata.Dir(t, dir, "ml-100k/u.data")
	// lags pipelines its merge groups with the backward pass (on the GPU
	// each group is copied to host memory on a stream of its own).
	for _, sp := range []string{"dense", "topk", "lags"} {
		var losses [2][]float64
		for k, dev := range []string{"cpu", "cuda"} {
			out := t.TempDir()
			c := train.Config{Model: "ncf", Dataset: "ml-100k", DataDir: dir, Workers: train.Set(2), Steps: 4, Sparsifier: sp, Density: train.Set(0.05),
				Device: dev, Out: out, Pipeline: "auto", Clip: train.Set(0.0), Quiet: true, BLAS: "gonum", MaxEvalBatches: 1}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			err := train.Run(ctx, c, train.Options{LossSink: func(_ int, l float64) { losses[k] = append(losses[k], l) }})
			cancel()
			if err != nil {
				t.Fatalf("%s on %s: %v", sp, dev, err)
			}
			// run.json names where the model ran: the GPU path must not
			// fall back to the CPU unnoticed.
			raw, err := os.ReadFile(filepath.Join(out, "run.json"))
			if err != nil {
				t.Fatal(err)
			}
			var info train.RunInfo
			if err := json.Unmarshal(raw, &info); err != nil {
				t.Fatal(err)
			}
			if got := strings.HasPrefix(info.Device, "cuda:"); got != (dev == "cuda") {
				t.Fatalf("%s on %s: run.json device %q", sp, dev, info.Device)
			}
			if info.Pipelined != (sp == "lags") {
				t.Fatalf("%s on %s: pipelined %v", sp, dev, info.Pipelined)
			}
		}
		if len(losses[0]) != 4 || len(losses[1]) != 4 {
			t.Fatalf("%s: %d and %d losses", sp, len(losses[0]), len(losses[1]))
		}
		for i := range losses[0] {
			if math.Abs(losses[0][i]-losses[1][i]) > 1e-4*math.Abs(losses[0][i]) {
				t.Errorf("%s step %d: CPU loss %v, GPU %v", sp, i+1, losses[0][i], losses[1][i])
			}
		}
		t.Logf("%s: CPU %v, GPU %v", sp, losses[0], losses[1])
	}
}
