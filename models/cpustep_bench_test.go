package models

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/ops"
)

// BenchmarkCPUStep is one worker's training step — forward, backward and
// an SGD update with momentum and weight decay, as PyTorch's step in
// scripts/cpu-step-torch.py — of the case SPARSEGRAD_BENCH_CASE names
// (resnet18-b32, resnet18-b128, lstm-default-b32, lstm-small-b32,
// ncf-default-ml20m-b256; default resnet18-b32) on random data, with
// SPARSEGRAD_BENCH_THREADS threads (GOMAXPROCS, OpenBLAS, oneDNN; default
// GOMAXPROCS) and the kernels of SPARSEGRAD_TEST_KERNELS (OpenBLAS when
// installed). Each iteration is one step after a warm-up step; it reports
// the median step and the process's CPU time per step, and prints one JSON
// line (STEP {...}) for scripts/bench-cpu-step, which runs it interleaved
// with PyTorch.
func BenchmarkCPUStep(b *testing.B) {
	name := os.Getenv("SPARSEGRAD_BENCH_CASE")
	if name == "" {
		name = "resnet18-b32"
	}
	threads := runtime.GOMAXPROCS(0)
	if v, err := strconv.Atoi(os.Getenv("SPARSEGRAD_BENCH_THREADS")); err == nil && v > 0 {
		threads = v
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(v))
	}
	blasDesc, err := ops.ConfigureBLAS(ops.BLASAuto, threads)
	if err != nil {
		b.Fatal(err)
	}
	defer ops.ConfigureBLAS(ops.BLASGonum, 0)
	kernDesc, err := engine.ConfigureCPU(testKernels(), threads)
	if err != nil {
		b.Fatal(err)
	}
	defer engine.ConfigureCPU(testKernels(), 0)
	cases := append(memoryCases(), memoryCase{"resnet18-b128", func() (Model, error) { return NewResNet(DefaultResNet18(10, 128)) }, resnetBatch(128), false})
	i := slices.IndexFunc(cases, func(c memoryCase) bool { return c.name == name })
	if i < 0 {
		b.Fatalf("unknown SPARSEGRAD_BENCH_CASE %q", name)
	}
	c := cases[i]
	// Go runs a benchmark once with b.N = 1 before the requested count:
	// the model is built once per process.
	if benchModel == nil || benchModel.name != name {
		m, err := hostOf(c.build())
		if err != nil {
			b.Fatal(err)
		}
		n := m.NumParams()
		benchModel = &benchState{name: name, m: m, grad: make([]float32, n), mom: make([]float32, n), batch: c.batch(rand.New(rand.NewPCG(1, 2)), m)}
	}
	m, grad, mom, batch := benchModel.m, benchModel.grad, benchModel.mom, benchModel.batch
	ctx := context.Background()
	step := func() {
		if _, err := m.TrainStep(ctx, batch, grad); err != nil {
			b.Fatal(err)
		}
		// SGD with momentum 0.9 and weight decay 1e-4, as PyTorch's.
		p := m.Params()
		for j := range p {
			g := grad[j] + 1e-4*p[j]
			mom[j] = 0.9*mom[j] + g
			p[j] -= 0.05 * mom[j]
		}
	}
	if !benchModel.warm {
		step() // warm-up: oneDNN compiles its kernels, the arena is touched
		benchModel.warm = true
	}
	var times []float64
	c0 := cpuSeconds()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		step()
		times = append(times, time.Since(t0).Seconds())
	}
	b.StopTimer()
	cpu := (cpuSeconds() - c0) / float64(b.N)
	slices.Sort(times)
	med := times[len(times)/2]
	b.ReportMetric(1e3*med, "ms/step-median")
	b.ReportMetric(cpu, "cpu-s/step")
	line, _ := json.Marshal(map[string]any{"impl": "go", "case": name, "threads": threads, "steps": b.N, "median_ms": 1e3 * med,
		"cpu_s_per_step": cpu, "times_s": times, "kernels": kernDesc, "blas": blasDesc, "kernel_stats": m.trainStats()})
	fmt.Printf("STEP %s\n", line)
}

type benchState struct {
	name      string
	m         *host
	grad, mom []float32
	batch     Batch
	warm      bool
}

var benchModel *benchState

// trainStats describes the kernels of the model's training program.
func (h *host) trainStats() engine.KernelStats {
	switch m := h.Model.(type) {
	case *ResNet:
		return m.train.KernelStats()
	case *LSTM:
		return m.train.KernelStats()
	case *NCF:
		return m.train.KernelStats()
	}
	return engine.KernelStats{}
}
