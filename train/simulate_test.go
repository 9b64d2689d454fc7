package train

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/rundir/rundirtest"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// replicaRun runs c as separate runs over one in-process communicator, one
// per worker, each with its own model, parameters and optimizer: the
// replicas of a real cluster (as under mpirun), in one process.
func replicaRun(t *testing.T, c Config) {
	t.Helper()
	err := local.Run(context.Background(), c.Workers.Value(), func(ctx context.Context, cm comm.Communicator) error {
		return Run(ctx, c, Options{Comm: cm})
	})
	if err != nil {
		t.Fatal(err)
	}
}

func runInfoOf(t *testing.T, dir string) RunInfo {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	var info RunInfo
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}
	return info
}

// TestSimulatedEqualsReplicas: simulated workers (one parameter copy and
// optimizer, models shared by fewer executors than workers) end where
// replicas with a model, parameters and optimizer each end, bit for bit:
// parameters, optimizer state, every rank's residual, batch-norm
// statistics, reducer and model state, and the metrics but times; for every
// sparsifier on NCF, and for the LSTM and ResNet-18.
func TestSimulatedEqualsReplicas(t *testing.T) {
	type tc struct {
		name string
		c    Config
	}
	var cases []tc
	for _, name := range sparsify.Names() {
		c := resumeConfigFor(t, name, 7)
		c.Executors, c.BLASThreads, c.CheckpointEvery = 2, 1, 5
		cases = append(cases, tc{"ncf/" + name, c})
	}
	if testing.Short() {
		cases = cases[:0]
		for _, name := range []string{"topk", "deft", "lags"} {
			c := resumeConfigFor(t, name, 7)
			c.Executors, c.BLASThreads = 2, 1
			cases = append(cases, tc{"ncf/" + name, c})
		}
	} else {
		lstm := Config{Model: "lstm", Dataset: "wikitext2", DataDir: testenv.SharedData(t, "wikitext-2/train.txt"), Workers: Set(3), Executors: 2, Steps: 4,
			Batch: Set(4), Sparsifier: "topk", Density: Set(0.01), Quiet: true, BLAS: "gonum", BLASThreads: 1, MaxEvalBatches: 2}
		resnet := Config{Model: "resnet18", Dataset: "cifar10", DataDir: testenv.SharedData(t, "cifar-10-batches-bin/data_batch_1.bin"), Workers: Set(3), Executors: 2, Steps: 3,
			Batch: Set(4), EvalBatch: Set(8), Sparsifier: "deft", Density: Set(0.01), Quiet: true, BLAS: "gonum", BLASThreads: 1, MaxEvalBatches: 1}
		cases = append(cases, tc{"lstm", lstm}, tc{"resnet18", resnet})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sim, rep := tc.c, tc.c
			sim.Out, rep.Out = filepath.Join(t.TempDir(), "sim"), filepath.Join(t.TempDir(), "rep")
			if err := Run(context.Background(), sim, Options{}); err != nil {
				t.Fatal(err)
			}
			replicaRun(t, rep)
			if msg := rundirtest.Diff(rundirtest.Read(t, rep.Out), rundirtest.Read(t, sim.Out)); msg != "" {
				t.Fatalf("simulated workers differ from replicas: %s", msg)
			}
			if got := runInfoOf(t, sim.Out).Executors; got != min(2, sim.Workers.Value()) {
				t.Fatalf("run.json says %d executors, want 2", got)
			}
			if got := runInfoOf(t, rep.Out).Executors; got != 0 {
				t.Fatalf("replicas' run.json says %d executors, want 0 (not simulated)", got)
			}
		})
	}
}

// TestExecutorsFor: one executor per core, at most one per worker, or
// -executors.
func TestExecutorsFor(t *testing.T) {
	for _, tc := range []struct {
		executors, workers, want int
	}{{0, 1, 1}, {1, 16, 1}, {3, 16, 3}, {20, 16, 16}, {5, 2, 2}} {
		if got := executorsFor(Config{Executors: tc.executors}, tc.workers); got != tc.want {
			t.Errorf("-executors %d, %d workers: %d, want %d", tc.executors, tc.workers, got, tc.want)
		}
	}
	if got := executorsFor(Config{}, 1024); got < 1 || got > 1024 {
		t.Errorf("default for 1024 workers: %d", got)
	}
	if simulated(Config{Device: "cpu"}, "local", 1) != nil || simulated(Config{Device: "cpu"}, "mpi", 4) != nil ||
		simulated(Config{Device: "cuda"}, "local", 4) != nil || simulated(Config{Device: "cpu"}, "local", 4) == nil {
		t.Error("simulated: only several in-process workers on the CPU share")
	}
}

// TestBarrier: rounds of n waiters complete together, again and again; an
// abort releases every waiter with comm.ErrAborted, and a cancelled
// context stops a waiter and breaks the barrier for the others.
func TestBarrier(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 16} {
		b := newBarrier(n)
		var mu sync.Mutex
		counts := make([]int, 50)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				for round := range counts {
					mu.Lock()
					counts[round]++
					mu.Unlock()
					if err := b.wait(context.Background()); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if counts[round] != n {
						t.Errorf("n=%d round %d: released with %d of %d arrived", n, round, counts[round], n)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	b := newBarrier(3)
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- b.wait(context.Background()) }()
	}
	time.Sleep(10 * time.Millisecond)
	b.abort(errors.New("rank 2 failed"))
	for range 2 {
		if err := <-errs; !errors.Is(err, comm.ErrAborted) {
			t.Fatalf("waiter after abort: %v", err)
		}
	}
	if err := b.wait(context.Background()); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("wait on a broken barrier: %v", err)
	}
	b = newBarrier(2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if err := b.wait(context.Background()); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("after a cancelled waiter: %v", err)
	}
}

// TestSimulatedTimesAreTheirOwn: simulated workers taking turns on one
// executor record their wait for it and for the others' turns as t_queue;
// the reduction's times stay the reduction's (a worker whose turn came first
// does not wait inside the all-reduce for the last one), and the phases
// still add up to about the iteration.
func TestSimulatedTimesAreTheirOwn(t *testing.T) {
	c := ncfConfig(t, 4, 6)
	c.Executors, c.Batch = 1, Set(16384)
	if err := Run(context.Background(), c, Options{}); err != nil {
		t.Fatal(err)
	}
	var comp, comm, queue, iter, update, sel []float64
	for _, r := range rundirtest.Records(t, c.Out) {
		if r["type"] != "step" || r["step"].(float64) == 1 {
			continue
		}
		comp, comm = append(comp, r["t_compute"].(float64)), append(comm, r["t_comm"].(float64))
		queue, iter = append(queue, r["t_queue"].(float64)), append(iter, r["t_iter"].(float64))
		update, sel = append(update, r["t_update"].(float64)), append(sel, r["t_select"].(float64))
	}
	med := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	if len(comp) < 3 {
		t.Fatalf("%d step records", len(comp))
	}
	if med(queue) < 1.5*med(comp) {
		t.Errorf("t_queue %.3f s with 4 workers on 1 executor, t_compute %.3f s: the slowest worker waits for about 3 turns", med(queue), med(comp))
	}
	if med(comm) > 0.5*med(comp) {
		t.Errorf("t_comm %.3f s, t_compute %.3f s: the all-reduce's time holds waits for other workers' turns", med(comm), med(comp))
	}
	if sum := med(queue) + med(comp) + med(sel) + med(comm) + med(update); sum > 1.3*med(iter) || sum < 0.7*med(iter) {
		t.Errorf("phases add up to %.3f s, the iteration takes %.3f s", sum, med(iter))
	}
}
