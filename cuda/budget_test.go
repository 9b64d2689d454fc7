package cuda_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// budget is what one training step may cost the host per worker, on
// average over the steps after the first two (the first runs kernel by
// kernel and the second captures the CUDA graph; both allocate what the
// run keeps).
type budget struct {
	// launches and syncs are kernel launches (library calls, memsets,
	// device copies and graph launches included) and host waits.
	launches, syncs float64
	// htod and dtoh are the bytes each way, allocs and frees the device
	// allocations and frees.
	htod, dtoh    int64
	allocs, frees int64
}

// budgetCase is one row of the table: a model, a method, a number of
// in-process workers sharing the GPU, and the step's budget.
type budgetCase struct {
	model, method string
	workers       int
	max           budget
}

// stepBudgets are the budgets per model, method and number of workers: a
// method is added by a line per model and worker count. (The methods whose
// selection still runs per layer fragment or tensor — deft, micro, lags,
// dgc, dragonn, spardl — get theirs with the segmented selection; until
// then SPARSEGRAD_BUDGET_METHODS=deft,lags,… measures them without a
// budget.)
var stepBudgets = []budgetCase{
	{"ncf", "dense", 1, budget{}},
	{"ncf", "dense", 4, budget{}},
	{"ncf", "topk", 1, budget{}},
	{"ncf", "topk", 4, budget{}},
	{"lstm", "dense", 1, budget{}},
	{"lstm", "dense", 4, budget{}},
	{"lstm", "topk", 1, budget{}},
	{"lstm", "topk", 4, budget{}},
	{"resnet18", "dense", 1, budget{}},
	{"resnet18", "dense", 4, budget{}},
	{"resnet18", "topk", 1, budget{}},
	{"resnet18", "topk", 4, budget{}},
}

// budgetConfig is the training run of a case: a small batch of real data,
// steps steps.
func budgetConfig(t *testing.T, c budgetCase, steps int) train.Config {
	cfg := train.Config{Model: c.model, Workers: train.Set(c.workers), Steps: steps, Sparsifier: c.method, Density: train.Set(0.01),
		Device: "cuda", Out: t.TempDir(), Pipeline: "auto", Clip: train.Set(0.0), Quiet: true, BLAS: "gonum", MaxEvalBatches: 1}
	switch c.model {
	case "ncf":
		cfg.Dataset, cfg.DataDir, cfg.Preset, cfg.Batch = "ml-100k", ml100k(t), "default", train.Set(64)
	case "lstm":
		cfg.Dataset, cfg.Preset, cfg.Batch = "wikitext2", "small", train.Set(2)
		cfg.DataDir = dataDir(t, "wikitext-2/train.txt")
	case "resnet18":
		cfg.Dataset, cfg.Batch, cfg.EvalBatch = "cifar10", train.Set(2), train.Set(2)
		cfg.DataDir = dataDir(t, "cifar-10-batches-bin/data_batch_1.bin")
	}
	// Sparse from the first step, every tensor.
	if m, ok := sparsify.Lookup(c.method); ok {
		if _, ok := m.Param("dense_warmup"); ok {
			cfg.MethodOptions = sparsify.Values{"dense_warmup": 0}
		}
		if c.method == "dragonn" {
			cfg.MethodOptions["min_tensor"] = 0
		}
		if m.CorrectsMomentum {
			cfg.Optimizer, cfg.Momentum = "sgd", train.Set(0.9)
		}
	}
	return cfg
}

// dataDir returns the data folder holding file: $TRAIN_DATA_DIR or the
// shared one.
func dataDir(t *testing.T, file string) string {
	t.Helper()
	dir := os.Getenv("TRAIN_DATA_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared", "data")
	}
	return testenv.DataDir(t, dir, file)
}

// stepCounts is what steps 3 to 2+k of a run cost the host: the counts
// of a run of 2+k steps less those of a run of 2 (the runs are the same up
// to their last step, and end the same way: a final evaluation of one
// batch and a checkpoint).
func stepCounts(t *testing.T, c budgetCase, k int) cuda.HostCounts {
	run := func(steps int) cuda.HostCounts {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		before := cuda.Counts()
		if err := train.Run(ctx, budgetConfig(t, c, steps), train.Options{}); err != nil {
			t.Fatalf("%s %s ×%d, %d steps: %v", c.model, c.method, c.workers, steps, err)
		}
		return cuda.Counts().Sub(before)
	}
	short := run(2)
	return run(2 + k).Sub(short)
}

// perStep is a row of counts per worker and step.
type perStep struct {
	launches, syncs, graphs float64
	htod, dtoh              int64
	allocs, frees           int64
}

func (p perStep) row(c budgetCase) string {
	return fmt.Sprintf("| %s | %s | %d | %.1f | %.1f | %d | %d | %d | %d | %.1f |", c.model, c.method, c.workers, p.launches, p.syncs, p.htod, p.dtoh, p.allocs, p.frees, p.graphs)
}

// TestStepBudgets measures what a training step costs the host on the
// GPU path — kernel launches, host synchronisations, bytes each way,
// device allocations and frees — per worker and step after the first two,
// and holds each model and method to its budget. The table it logs is
// docs/bench/gpu-budget.md's. -short measures NCF only (a step of the
// LSTM or ResNet-18 takes seconds on the emulator).
func TestStepBudgets(t *testing.T) {
	gpu(t)
	cuda.KeepAnchor(t)
	cases := slices.Clone(stepBudgets)
	if env := os.Getenv("SPARSEGRAD_BUDGET_METHODS"); env != "" {
		for _, m := range strings.Split(env, ",") {
			for _, model := range []string{"ncf", "lstm", "resnet18"} {
				for _, w := range []int{1, 4} {
					cases = append(cases, budgetCase{model: model, method: m, workers: w})
				}
			}
		}
	}
	if env := os.Getenv("SPARSEGRAD_BUDGET_MODELS"); env != "" {
		cases = slices.DeleteFunc(cases, func(c budgetCase) bool { return !slices.Contains(strings.Split(env, ","), c.model) })
	}
	var rows []string
	for _, c := range cases {
		if testing.Short() && c.model != "ncf" {
			continue
		}
		t.Run(fmt.Sprintf("%s-%s-%d", c.model, c.method, c.workers), func(t *testing.T) {
			k := 2
			if c.model == "resnet18" {
				k = 1
			}
			all := stepCounts(t, c, k)
			n := int64(k * c.workers)
			p := perStep{launches: float64(all.Launches) / float64(n), syncs: float64(all.Syncs) / float64(n), graphs: float64(all.Graphs) / float64(n),
				htod: all.HtoD / n, dtoh: all.DtoH / n, allocs: all.Allocs / n, frees: all.Frees / n}
			rows = append(rows, p.row(c))
			t.Log(p.row(c))
			if c.max == (budget{}) {
				return // measured only
			}
			check := func(what string, got, limit float64) {
				if got > limit {
					t.Errorf("%s per worker and step: %g, over the budget of %g", what, got, limit)
				}
			}
			check("launches", p.launches, c.max.launches)
			check("host synchronisations", p.syncs, c.max.syncs)
			check("bytes to the device", float64(p.htod), float64(c.max.htod))
			check("bytes to the host", float64(p.dtoh), float64(c.max.dtoh))
			check("device allocations", float64(all.Allocs), float64(c.max.allocs))
			check("device frees", float64(all.Frees), float64(c.max.frees))
		})
	}
	t.Logf("per worker and step:\n| model | method | workers | launches | syncs | host→device B | device→host B | allocs | frees | graph launches |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n%s", strings.Join(rows, "\n"))
}
