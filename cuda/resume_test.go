package cuda_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/rundir/rundirtest"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// TestResumeOnGPU: with -device cuda, where the error-feedback residual
// lives in GPU memory, the checkpoint of a run stopped after step 2 holds
// the residual the GPU had (the CPU run's, to rounding), and the resumed
// run ends bit for bit where the uninterrupted run ends (parameters and
// every rank's residual): the residual, the reducers' and the models'
// state go through the checkpoint as on the CPU. The model is NCF with
// dropout, whose masks the GPU draws: every rank's dropout stream in the
// GPU's checkpoint is the CPU's, bit for bit.
func TestResumeOnGPU(t *testing.T) {
	gpu(t)
	dir := ml100k(t)
	// micro: a threshold carried between steps; lags: pipelined groups
	// reduced on the communication stream; powersgd: its Q in device
	// memory (the warm start), read back into the checkpoint.
	methods := []string{"micro", "lags", "powersgd"}
	if testing.Short() {
		methods = []string{"micro"}
	}
	for _, sp := range methods {
		t.Run(sp, func(t *testing.T) {
			c := train.Config{Model: "ncf", Dataset: "ml-100k", DataDir: dir, Preset: "default", Workers: train.Set(2), Steps: 4, Sparsifier: sp,
				Density: train.Set(0.05), Device: "cuda", Pipeline: "auto", Quiet: true, BLAS: "gonum", MaxEvalBatches: 1,
				MethodOptions: sparsify.Values{}}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			defer cancel()
			straight := c
			straight.Out = t.TempDir()
			if err := train.Run(ctx, straight, train.Options{}); err != nil {
				t.Fatal(err)
			}
			split := c
			split.Out = t.TempDir()
			stop := make(chan struct{})
			var once atomic.Bool
			err := train.Run(ctx, split, train.Options{Stop: stop, LossSink: func(step int, _ float64) {
				if step >= 2 && once.CompareAndSwap(false, true) {
					close(stop)
				}
			}})
			if !errors.Is(err, train.ErrInterrupted) {
				t.Fatalf("stopped run: %v, want an interruption", err)
			}
			// The checkpoint holds the residual the GPU had: the CPU's after
			// the same steps, to float32 rounding (a stale host copy would
			// be zeros or an older step's).
			cpu := c
			cpu.Device, cpu.Steps, cpu.Out = "cpu", 2, t.TempDir()
			if err := train.Run(ctx, cpu, train.Options{}); err != nil {
				t.Fatal(err)
			}
			g, want := rundirtest.Read(t, split.Out), rundirtest.Read(t, cpu.Out)
			for r := range 2 {
				if d := relDiff(g.Residuals[r], want.Residuals[r]); g.Step != 2 || d > 1e-3 {
					t.Fatalf("rank %d's checkpoint at step %d: residual off the CPU's by %.3g (relative): not the GPU's", r, g.Step, d)
				}
				if len(want.Models[r]) == 0 || !bytes.Equal(g.Models[r], want.Models[r]) {
					t.Fatalf("rank %d's model state (the dropout stream) at step 2: GPU %x, CPU %x", r, g.Models[r], want.Models[r])
				}
			}
			if err := train.Run(ctx, train.Config{Resume: split.Out}, train.Options{}); err != nil {
				t.Fatalf("resumed run: %v", err)
			}
			// The end: the GPU path is deterministic (the embeddings'
			// gradients add repeated rows in order, without atomics), so
			// the resumed run ends exactly where the straight one does.
			a, b := rundirtest.Read(t, straight.Out), rundirtest.Read(t, split.Out)
			if a.Step != 4 || b.Step != 4 {
				t.Fatalf("last checkpoints at steps %d and %d, want 4", a.Step, b.Step)
			}
			if d := relDiff(a.Params, b.Params); d != 0 {
				t.Fatalf("parameters off the uninterrupted run's by %.3g (relative)", d)
			}
			for r := range a.Residuals {
				if d := relDiff(a.Residuals[r], b.Residuals[r]); d != 0 {
					t.Fatalf("rank %d's residual off the uninterrupted run's by %.3g (relative)", r, d)
				}
			}
		})
	}
}

// relDiff is ‖a − b‖ / ‖b‖ (+Inf for vectors of other lengths, or b zero
// and a not).
func relDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d2, n2 float64
	for i := range b {
		d := float64(a[i]) - float64(b[i])
		d2 += d * d
		n2 += float64(b[i]) * float64(b[i])
	}
	if n2 == 0 {
		if d2 == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return math.Sqrt(d2 / n2)
}
