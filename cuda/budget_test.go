package cuda_test

import (
	"cmp"
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
	// htod is the bytes to the device beyond the batch (the model's dense
	// step's, batchBytes), dtoh the bytes to the host.
	htod, dtoh int64
	// allocs and frees are device allocations and frees.
	allocs, frees float64
}

// budgetCase is one row of the table: a model, a method, a number of
// in-process workers sharing the GPU, and the step's budget (nil: measured
// only).
type budgetCase struct {
	model, method string
	workers       int
	max           *budget
	// overlap is the run's -overlap ("": auto, the default: dense's
	// buckets overlap the backward pass).
	overlap string
}

// batchBytes is what a step of the model uploads in all: its batch (the
// dense step uploads nothing else; the budgets of the methods count the
// bytes beyond it).
var batchBytes = map[string]int64{"ncf": 1280, "lstm": 640}

// stepBudgets are the budgets per model, method and number of workers,
// the numbers the emulator measures (docs/bench/gpu-budget.md): a method
// is added by a line per model and worker count. The targets are no
// allocation or free inside a step, the batch alone to the device, the
// loss and the selections' counts alone to the host, at most 2 host waits
// for dense and 4 for any method. Dense's 1 is the end of the step, which
// also reads the loss (models.Deferred) and error feedback's finiteness
// flag (both ways, in one bucket or DDP's); topk's 3 add the union's count
// and the residual's norm (the workers' counts are all-gathered in host
// memory), and so do micro's (its union's range check is read with the
// norm's wait, Env.checkRange); deft's fourth reads its plan's header (12 B:
// the finiteness of the fragments' norms, its selection's count and the
// common fragments' length), the plan being made on the device from the
// fragments' sums of squares and, with several workers, the leader's,
// broadcast on the device (k_deft_plan: both allocations, the leader's
// bins, this worker's bin as a list); it selects all fragments of its bin
// at once from that list (Ops.TopKSegmentsOn) and its union's range check
// is read with its counts per tensor. Beyond the batch no method uploads
// anything (deft's list stays on the device, a range check's first bad
// index too). SparDL's 3
// with 4 workers are the blocks' count below N (CountIn), the residual's
// norm, with which the frame reads the range checks of the lists received
// (Env.checkRange), and the end of the step; its 12 SendRecvs are
// device-to-device copies (comm/local's device path).
// lags' 2 are the residual's norm, with whose wait the frame reads each
// sparse group's range check, distinct count and per-tensor counts
// (Env.rangeFlag, Env.afterWait), and the end of the step; the groups one
// tensor completes are started at once (one selection, residual pass, pair
// of all-gathers and decoding per run of adjacent groups: NCF's 7 groups
// in 5 runs, the LSTM's 6 in 4). dgc's and
// dragonn's 4: the selections' counts (dgc decides its adaptation rounds
// on the device, dgcSelect), the union's count, the error norm (every
// tensor's ‖v‖², 8 B a tensor) and the end of the step. (Rows not
// measured again keep their limits in bytes: batchBytes became the batch
// itself, 8 bytes less.) gtopk, oktopk and topkdsa move their
// point-to-point messages device to device (comm/local's Send, ISend,
// Recv and IRecv of device buffers) and allocate nothing after the first
// steps; their host waits are reads of counts the host needs. gtopk's:
// its own list's and every received list's distinct count
// (Env.checkList), each merge's count, the residual's intersection count,
// the norm and the end of the step. topkdsa's: its threshold (the k-th
// magnitude), the pairs per region (CountIn) and those announced to it,
// its region's non-zero sums, the owners' lists' distinct count, the norm
// and the end. oktopk's are topkdsa's less the threshold plus its local
// selection's count, its threshold raises (a count each, up to 5) and the
// intersection count. Their bytes up beyond the batch are the pair counts
// per region (4 B a region), uploaded for the count messages, which travel
// in device memory (NCCL's).
var stepBudgets = []budgetCase{
	{"ncf", "dense", 1, &budget{12, 1, 0, 12, 0, 0}, "off"},
	{"ncf", "dense", 4, &budget{13.25, 1, 0, 12, 0, 0}, "off"},
	{"ncf", "dense", 1, &budget{13, 1, 0, 12, 0, 0}, ""},
	{"ncf", "dense", 4, &budget{14.25, 1, 0, 12, 0, 0}, ""},
	{"ncf", "topk", 1, &budget{28, 3, 0, 32, 0, 0}, ""},
	{"ncf", "topk", 4, &budget{32, 3, 0, 32, 0, 0}, ""},
	{"ncf", "deft", 1, &budget{31, 4, 0, 80, 0, 0}, ""},
	{"ncf", "deft", 4, &budget{35.75, 4, 0, 80, 0, 0}, ""},
	{"ncf", "micro", 1, &budget{19, 3, 0, 32, 0, 0}, ""},
	{"ncf", "micro", 4, &budget{23, 3, 0, 32, 0, 0}, ""},
	{"ncf", "lags", 1, &budget{110, 2, 0, 168, 0, 0}, ""},
	{"ncf", "lags", 4, &budget{155, 2, 0, 168, 0, 0}, ""},
	{"ncf", "dgc", 1, &budget{88, 4, 0, 156, 0, 0}, ""},
	{"ncf", "dgc", 4, &budget{98, 4, 0, 156, 0, 0}, ""},
	{"ncf", "dragonn", 1, &budget{73, 4, 0, 176, 0, 0}, ""},
	{"ncf", "dragonn", 4, &budget{82, 4, 0, 176, 0, 0}, ""},
	{"ncf", "spardl", 1, &budget{27, 2, 0, 20, 0, 0}, ""},
	{"ncf", "spardl", 4, &budget{99, 3, 0, 72, 0, 0}, ""},
	// The other methods. topka, cltk, threshold, randomk and mstopk on NCF
	// only (an LSTM step costs the emulator seconds; their LSTM rows are in
	// docs/bench/gpu-budget.md): topka, cltk and threshold select as topk
	// does (threshold reads its count), randomk uploads its k shared
	// indices, drawn on the host.
	{"ncf", "topka", 1, &budget{29, 3, 0, 32, 0, 0}, ""},
	{"ncf", "topka", 4, &budget{38, 3, 0, 32, 0, 0}, ""},
	{"ncf", "cltk", 1, &budget{29, 3, 0, 40, 0, 0}, ""},
	{"ncf", "cltk", 4, &budget{23.25, 3, 0, 40, 0, 0}, ""},
	{"ncf", "threshold", 1, &budget{23, 4, 0, 36, 0, 0}, ""},
	{"ncf", "threshold", 4, &budget{27, 4, 0, 36, 0, 0}, ""},
	{"ncf", "randomk", 1, &budget{13, 2, 24440, 28, 0, 0}, ""},
	{"ncf", "randomk", 4, &budget{14, 2, 24440, 28, 0, 0}, ""},
	// mstopk's 4: topk's 3 and its selection's count and thres1 (16 B),
	// read back after the search and the draw ran on the device.
	{"ncf", "mstopk", 1, &budget{59, 4, 0, 48, 0, 0}, ""},
	{"ncf", "mstopk", 4, &budget{63, 4, 0, 48, 0, 0}, ""},
	{"ncf", "gtopk", 1, &budget{36, 4, 0, 36, 0, 0}, ""},
	{"ncf", "gtopk", 4, &budget{60.75, 5.5, 0, 48, 0, 0}, ""},
	{"ncf", "oktopk", 1, &budget{55, 9, 4, 72, 0, 0}, ""},
	{"ncf", "oktopk", 4, &budget{95.125, 11.375, 16, 153, 0, 0}, ""},
	{"ncf", "topkdsa", 1, &budget{56, 7, 4, 64, 0, 0}, ""},
	{"ncf", "topkdsa", 4, &budget{78.25, 7, 16, 136, 0, 0}, ""},
	{"lstm", "dense", 1, &budget{16, 1, 0, 12, 0, 0}, "off"},
	{"lstm", "dense", 4, &budget{17.25, 1, 0, 12, 0, 0}, "off"},
	{"lstm", "dense", 1, &budget{17, 1, 0, 12, 0, 0}, ""},
	{"lstm", "dense", 4, &budget{18.25, 1, 0, 12, 0, 0}, ""},
	{"lstm", "topk", 1, &budget{32, 3, 0, 32, 0, 0}, ""},
	{"lstm", "topk", 4, &budget{36, 3, 0, 32, 0, 0}, ""},
	{"lstm", "deft", 1, &budget{35, 4, 0, 72, 0, 0}, ""},
	{"lstm", "deft", 4, &budget{39.75, 4, 0, 72, 0, 0}, ""},
	{"lstm", "micro", 1, &budget{23, 3, 0, 32, 0, 0}, ""},
	{"lstm", "micro", 4, &budget{27, 3, 0, 32, 0, 0}, ""},
	{"lstm", "lags", 1, &budget{95, 2, 0, 148, 0, 0}, ""},
	{"lstm", "lags", 4, &budget{131, 2, 0, 148, 0, 0}, ""},
	{"lstm", "dgc", 1, &budget{73, 4, 0, 128, 0, 0}, ""},
	{"lstm", "dgc", 4, &budget{83, 4, 0, 128, 0, 0}, ""},
	{"lstm", "dragonn", 1, &budget{71, 4, 0, 152, 0, 0}, ""},
	{"lstm", "dragonn", 4, &budget{80, 4, 0, 152, 0, 0}, ""},
	{"lstm", "spardl", 1, &budget{31, 2, 0, 20, 0, 0}, ""},
	{"lstm", "spardl", 4, &budget{103, 3, 0, 72, 0, 0}, ""},
	{"lstm", "gtopk", 1, &budget{40, 4, 0, 36, 0, 0}, ""},
	{"lstm", "gtopk", 4, &budget{64.75, 5.5, 0, 48, 0, 0}, ""},
	{"lstm", "oktopk", 1, &budget{71, 13, 4, 88, 0, 0}, ""},
	{"lstm", "oktopk", 4, &budget{104, 13, 16, 160, 0, 0}, ""},
	{"lstm", "topkdsa", 1, &budget{60, 7, 4, 64, 0, 0}, ""},
	{"lstm", "topkdsa", 4, &budget{90.5, 7, 16, 136, 0, 0}, ""},
	{"resnet18", "dense", 1, nil, ""},
	{"resnet18", "topk", 1, nil, ""},
}

// shortCases are the cases -short measures: NCF's dense, topk and deft
// (a step of the LSTM or ResNet-18 takes seconds on the emulator).
var shortCases = []string{"ncf-dense", "ncf-topk", "ncf-deft"}

// budgetConfig is the training run of a case: a small batch of real data,
// steps steps.
func budgetConfig(t *testing.T, c budgetCase, steps int) train.Config {
	cfg := train.Config{Model: c.model, Workers: train.Set(c.workers), Steps: steps, Sparsifier: c.method, Density: train.Set(0.01),
		Device: "cuda", Out: t.TempDir(), Pipeline: cmp.Or(c.overlap, "auto"), Clip: train.Set(0.0), Quiet: true, BLAS: "gonum", MaxEvalBatches: 1}
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

// stepCounts is what steps 3 to 2+k of a run over -comm comm ("": auto)
// cost the host: the counts
// of a run of 2+k steps less those of a run of 2 (the runs are the same up
// to their last step, and end the same way: a final evaluation of one
// batch and a checkpoint).
func stepCounts(t *testing.T, c budgetCase, k int, comm string) cuda.HostCounts {
	run := func(steps int) cuda.HostCounts {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		before := cuda.Counts()
		cfg := budgetConfig(t, c, steps)
		cfg.Comm = comm
		if err := train.Run(ctx, cfg, train.Options{}); err != nil {
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
	allocs, frees           float64
	// ctxSets are the context switches (cuCtxSetCurrent), unheld the
	// stream calls that paid one each (HostCounts.Unheld).
	ctxSets, unheld float64
}

// perWorkerStep is all, counted over steps worker-steps, per worker-step
// (the bytes in whole bytes).
func perWorkerStep(all cuda.HostCounts, steps int) perStep {
	n := int64(steps)
	per := func(v int64) float64 { return float64(v) / float64(n) }
	return perStep{launches: per(all.Launches), syncs: per(all.Syncs), graphs: per(all.Graphs),
		htod: all.HtoD / n, dtoh: all.DtoH / n, allocs: per(all.Allocs), frees: per(all.Frees),
		ctxSets: per(all.CtxSets), unheld: per(all.Unheld)}
}

func (p perStep) row(c budgetCase) string {
	method := c.method
	if c.overlap != "" {
		method += " (-overlap " + c.overlap + ")"
	}
	return fmt.Sprintf("| %s | %s | %d | %.2f | %.2f | %d | %d | %.2f | %.2f | %.1f | %.2f | %.2f |", c.model, method, c.workers, p.launches, p.syncs, p.htod, p.dtoh, p.allocs, p.frees, p.graphs, p.ctxSets, p.unheld)
}

// TestStepBudgets measures what a training step costs the host on the
// GPU path — kernel launches, host synchronisations, bytes each way,
// device allocations and frees — per worker and step after the first two,
// and holds each model and method to its budget. The table it logs is
// docs/bench/gpu-budget.md's. -short measures shortCases only.
// SPARSEGRAD_BUDGET_METHODS=a,b adds methods (measured only, every model)
// and SPARSEGRAD_BUDGET_MODELS=ncf,… keeps the cases of those models.
func TestStepBudgets(t *testing.T) {
	gpu(t)
	cuda.KeepAnchor(t)
	cases := slices.Clone(stepBudgets)
	if env := os.Getenv("SPARSEGRAD_BUDGET_METHODS"); env != "" {
		for _, m := range strings.Split(env, ",") {
			for _, model := range []string{"ncf", "lstm", "resnet18"} {
				for _, w := range []int{1, 4} {
					if !slices.ContainsFunc(cases, func(c budgetCase) bool { return c.model == model && c.method == m && c.workers == w }) {
						cases = append(cases, budgetCase{model: model, method: m, workers: w})
					}
				}
			}
		}
	}
	if env := os.Getenv("SPARSEGRAD_BUDGET_MODELS"); env != "" {
		cases = slices.DeleteFunc(cases, func(c budgetCase) bool { return !slices.Contains(strings.Split(env, ","), c.model) })
	}
	var rows []string
	for _, c := range cases {
		if testing.Short() && !slices.Contains(shortCases, c.model+"-"+c.method) {
			continue
		}
		name := fmt.Sprintf("%s-%s-%d", c.model, c.method, c.workers)
		if c.overlap != "" {
			name += "-overlap-" + c.overlap
		}
		t.Run(name, func(t *testing.T) {
			k := 2
			if c.model == "resnet18" {
				k = 1
			}
			all := stepCounts(t, c, k, "")
			p := perWorkerStep(all, k*c.workers)
			rows = append(rows, p.row(c))
			t.Log(p.row(c))
			if c.max == nil {
				return // measured only
			}
			batch, ok := batchBytes[c.model]
			if !ok {
				t.Fatalf("no batch size for %s in batchBytes", c.model)
			}
			check := func(what string, got, limit float64) {
				if got > limit {
					t.Errorf("%s per worker and step: %g, over the budget of %g", what, got, limit)
				}
			}
			check("launches", p.launches, c.max.launches)
			check("host synchronisations", p.syncs, c.max.syncs)
			check("bytes to the device beyond the batch", float64(p.htod-batch), float64(c.max.htod))
			check("bytes to the host", float64(p.dtoh), float64(c.max.dtoh))
			check("device allocations", p.allocs, c.max.allocs)
			check("device frees", p.frees, c.max.frees)
			// Every call of the step is issued with its stream held
			// (Stream.Hold): no launch pays a context switch of its own.
			check("calls on streams not held", p.unheld, 0)
		})
	}
	t.Logf("per worker and step:\n| model | method | workers | launches | syncs | host→device B | device→host B | allocs | frees | graph launches | context switches | unheld calls |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n%s", strings.Join(rows, "\n"))
}

// ncclBudgets are the host waits of a step over -comm nccl, one GPU per
// worker (on the emulator: two emulated GPUs and its NCCL), per worker and
// step after the first two: those of the in-process rows of stepBudgets,
// NCCL's transfers adding none (before the streams waited for them on the
// device, every blocking collective was one more: dense 3, topk 5, deft 7,
// lags 12, dgc 7, spardl 7). gtopk's are its own (measured only).
var ncclBudgets = []budgetCase{
	{model: "ncf", method: "dense", workers: 2, max: &budget{syncs: 1}},
	{model: "ncf", method: "dense", workers: 2, max: &budget{syncs: 1}, overlap: "off"},
	{model: "ncf", method: "topk", workers: 2, max: &budget{syncs: 3}},
	{model: "ncf", method: "deft", workers: 2, max: &budget{syncs: 4}},
	{model: "ncf", method: "gtopk", workers: 2},
	{model: "ncf", method: "lags", workers: 2, max: &budget{syncs: 2}},
	{model: "ncf", method: "dgc", workers: 2, max: &budget{syncs: 4}},
	{model: "ncf", method: "spardl", workers: 2, max: &budget{syncs: 3}},
}

// TestNCCLStepBudgets holds a training step over NCCL to the host waits
// of the in-process one (TestStepBudgets, ncclBudgets): NCCL's transfers
// are ordered on the device before the work that reads their results, and
// the host does not wait for them. -short measures shortCases only.
func TestNCCLStepBudgets(t *testing.T) {
	gpu(t)
	cuda.KeepAnchor(t)
	twoGPUsWithNCCL(t)
	var rows []string
	for _, c := range ncclBudgets {
		if testing.Short() && !slices.Contains(shortCases, c.model+"-"+c.method) {
			continue
		}
		name := c.model + "-" + c.method
		if c.overlap != "" {
			name += "-overlap-" + c.overlap
		}
		t.Run(name, func(t *testing.T) {
			const k = 2
			all := stepCounts(t, c, k, "nccl")
			p := perWorkerStep(all, k*c.workers)
			rows = append(rows, p.row(c))
			t.Log(p.row(c))
			if c.max != nil && p.syncs > c.max.syncs {
				t.Errorf("host synchronisations per worker and step over NCCL: %g, over the budget of %g", p.syncs, c.max.syncs)
			}
		})
	}
	t.Logf("per worker and step over NCCL:\n| model | method | workers | launches | syncs | host→device B | device→host B | allocs | frees | graph launches | context switches | unheld calls |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n%s", strings.Join(rows, "\n"))
}

// twoGPUsWithNCCL makes sure two GPUs and NCCL are there for a -comm nccl
// run of two workers (on the emulator: two emulated GPUs and its NCCL);
// where they are not, the test says what is missing.
func twoGPUsWithNCCL(t *testing.T) {
	t.Helper()
	n, err := cuda.Count()
	if err != nil {
		t.Fatal(err)
	}
	if cuda.EmulateGPUs(t, 2) {
		n = 2
	}
	if n < 2 {
		testenv.Missing(t, testenv.GPU, fmt.Sprintf("-comm nccl between two workers needs two GPUs; this machine has %d", n))
	}
	if _, err := cuda.NCCLVersion(); err != nil {
		testenv.Missing(t, testenv.GPU, fmt.Sprintf("no NCCL: %v", err))
	}
}
