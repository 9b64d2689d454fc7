package models

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	iblas "github.com/sparsegrad/sparsegrad/internal/native/blas"
	"github.com/sparsegrad/sparsegrad/ops"
)

// TestMain runs the package's tests with the BLAS named by
// SPARSEGRAD_TEST_BLAS (auto, openblas or gonum; default gonum) and the CPU
// kernels named by SPARSEGRAD_TEST_KERNELS (auto, onednn or im2col; default
// im2col, the reference).
func TestMain(m *testing.M) {
	desc, err := ops.ConfigureBLAS(testBLAS(), 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Fprintln(os.Stderr, "models tests: BLAS =", desc)
	kdesc, err := engine.ConfigureCPU(testKernels(), 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Fprintln(os.Stderr, "models tests: CPU kernels =", kdesc)
	os.Exit(m.Run())
}

// testKernels is the CPU kernel set the tests run with.
func testKernels() string {
	if k := os.Getenv("SPARSEGRAD_TEST_KERNELS"); k != "" {
		return k
	}
	return engine.KernelsIm2col
}

// withBLAS runs f once per available BLAS, restoring the test default.
func withBLAS(b *testing.B, f func(b *testing.B)) {
	for _, mode := range []string{ops.BLASGonum, ops.BLASOpenBLAS} {
		b.Run(mode, func(b *testing.B) {
			desc, err := ops.ConfigureBLAS(mode, 0)
			if errors.Is(err, iblas.ErrNotFound) {
				b.Skip(err)
			}
			if err != nil {
				b.Fatal(err)
			}
			b.Log(desc)
			f(b)
		})
	}
	ops.ConfigureBLAS(testBLAS(), 0)
}

// testBLAS is the BLAS the tests run with.
func testBLAS() string {
	if b := os.Getenv("SPARSEGRAD_TEST_BLAS"); b != "" {
		return b
	}
	return ops.BLASGonum
}

func benchStep(b *testing.B, mm Model, batch Batch, hook bool) {
	m, err := hostOf(mm, nil)
	if err != nil {
		b.Fatal(err)
	}
	grad := make([]float32, m.NumParams())
	if hook {
		m.SetGradHook(func(int, device.Event) {})
	}
	ctx := context.Background()
	if _, err := m.TrainStep(ctx, batch, grad); err != nil { // warm-up
		b.Fatal(err)
	}
	c0 := cpuSeconds()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := m.TrainStep(ctx, batch, grad); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/step")
	// CPU time of the whole process (all goroutines and BLAS threads) per
	// step: on a shared machine it is steadier than wall time.
	b.ReportMetric((cpuSeconds()-c0)/float64(b.N), "cpu-s/step")
}

// BenchmarkResNet18Step is one forward+backward of the full-size CIFAR
// ResNet-18 at batch 32.
func BenchmarkResNet18Step(b *testing.B) {
	withBLAS(b, func(b *testing.B) {
		m, err := NewResNet(DefaultResNet18(10, 32))
		if err != nil {
			b.Fatal(err)
		}
		benchStep(b, m, randomImages(rand.New(rand.NewPCG(1, 1)), m.cfg, 32), false)
	})
}

// BenchmarkLSTMStep is one training step of the DEFT LSTM (3×650, tied,
// WikiText-2 vocabulary 28,869, BPTT 30, batch 32).
func BenchmarkLSTMStep(b *testing.B) {
	withBLAS(b, func(b *testing.B) {
		m, err := NewLSTM(DefaultLSTM(28869, 32))
		if err != nil {
			b.Fatal(err)
		}
		benchStep(b, m, randomTokens(rand.New(rand.NewPCG(1, 1)), 28869, 30*32), false)
	})
}

// BenchmarkNCFStep is one training step of the DEFT NeuMF on ml-20m sizes
// with the per-worker batch of 16 workers (2^20/16 = 65,536 pairs).
func BenchmarkNCFStep(b *testing.B) {
	withBLAS(b, func(b *testing.B) {
		m, err := NewNCF(DefaultNCF(138493, 26744, 65536))
		if err != nil {
			b.Fatal(err)
		}
		benchStep(b, m, randomPairs(rand.New(rand.NewPCG(1, 1)), 138493, 26744, 65536), false)
	})
}

// BenchmarkHookOverhead compares a training step with and without the
// gradient hook (current BLAS), for a small ResNet and the small LSTM.
func BenchmarkHookOverhead(b *testing.B) {
	for _, hook := range []bool{false, true} {
		b.Run(fmt.Sprintf("resnet18-batch8/hook=%v", hook), func(b *testing.B) {
			m, err := NewResNet(DefaultResNet18(10, 8))
			if err != nil {
				b.Fatal(err)
			}
			benchStep(b, m, randomImages(rand.New(rand.NewPCG(1, 1)), m.cfg, 8), hook)
		})
		b.Run(fmt.Sprintf("lstm-small/hook=%v", hook), func(b *testing.B) {
			m, err := NewLSTM(SmallLSTM(10000, 20))
			if err != nil {
				b.Fatal(err)
			}
			benchStep(b, m, randomTokens(rand.New(rand.NewPCG(1, 1)), 10000, 20*20), hook)
		})
	}
}

// cpuSeconds is the process's user+system CPU time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// BenchmarkHookAB alternates steps with and without the hook on one model
// (pairs in the order off,on then on,off), so
// that both see the same machine load and position,
// and reports the CPU time per step of each.
func BenchmarkHookAB(b *testing.B) {
	for _, name := range []string{"resnet18-batch8", "lstm-small"} {
		b.Run(name, func(b *testing.B) {
			var m Model
			var batch Batch
			if name == "lstm-small" {
				l, err := NewLSTM(SmallLSTM(10000, 20))
				if err != nil {
					b.Fatal(err)
				}
				m, batch = l, randomTokens(rand.New(rand.NewPCG(1, 1)), 10000, 20*20)
			} else {
				r, err := NewResNet(DefaultResNet18(10, 8))
				if err != nil {
					b.Fatal(err)
				}
				m, batch = r, randomImages(rand.New(rand.NewPCG(1, 1)), r.cfg, 8)
			}
			h, err := hostOf(m, nil)
			if err != nil {
				b.Fatal(err)
			}
			grad := make([]float32, m.NumParams())
			ctx := context.Background()
			var cpu [2]float64
			for i := 0; i < 2*b.N+2; i++ {
				on := (i%2 == 1) != ((i/2)%2 == 1) // pairs off,on then on,off
				var hook GradHook
				if on {
					hook = func(int, device.Event) {}
				}
				m.SetGradHook(hook)
				c0 := cpuSeconds()
				if _, err := h.TrainStep(ctx, batch, grad); err != nil {
					b.Fatal(err)
				}
				if i >= 2 { // the first pair warms both machines up
					k := 0
					if on {
						k = 1
					}
					cpu[k] += cpuSeconds() - c0
				}
			}
			b.ReportMetric(cpu[0]/float64(b.N), "cpu-s/step-nohook")
			b.ReportMetric(cpu[1]/float64(b.N), "cpu-s/step-hook")
			b.ReportMetric(100*(cpu[1]-cpu[0])/cpu[0], "%overhead")
		})
	}
}

// BenchmarkResNet18BLASAB alternates full-size ResNet-18 steps (batch 32)
// between gonum and OpenBLAS (pairs in the order gonum,OpenBLAS then
// OpenBLAS,gonum, after one warm-up pair), so that both see the same load
// on a shared machine, and reports the wall and CPU time of each and the
// speed-up.
func BenchmarkResNet18BLASAB(b *testing.B) {
	if _, err := iblas.Load(); err != nil {
		b.Skip(err)
	}
	m, err := hostOf(NewResNet(DefaultResNet18(10, 32)))
	if err != nil {
		b.Fatal(err)
	}
	batch := randomImages(rand.New(rand.NewPCG(1, 1)), m.Model.(*ResNet).cfg, 32)
	grad := make([]float32, m.NumParams())
	ctx := context.Background()
	var wall, cpu [2]float64
	defer ops.ConfigureBLAS(ops.BLASGonum, 0)
	for i := 0; i < 2*b.N+2; i++ {
		k := 0
		if (i%2 == 1) != ((i/2)%2 == 1) {
			k = 1
		}
		mode := []string{ops.BLASGonum, ops.BLASOpenBLAS}[k]
		if _, err := ops.ConfigureBLAS(mode, 0); err != nil {
			b.Fatal(err)
		}
		c0, t0 := cpuSeconds(), time.Now()
		if _, err := m.TrainStep(ctx, batch, grad); err != nil {
			b.Fatal(err)
		}
		if i >= 2 {
			wall[k] += time.Since(t0).Seconds()
			cpu[k] += cpuSeconds() - c0
		}
	}
	n := float64(b.N)
	b.ReportMetric(wall[0]/n, "s/step-gonum")
	b.ReportMetric(wall[1]/n, "s/step-openblas")
	b.ReportMetric(cpu[0]/n, "cpu-s/step-gonum")
	b.ReportMetric(cpu[1]/n, "cpu-s/step-openblas")
	b.ReportMetric(wall[0]/wall[1], "speedup-wall")
	b.ReportMetric(cpu[0]/cpu[1], "speedup-cpu")
}
