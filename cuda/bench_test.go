package cuda_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
)

// BenchmarkGPUStep is one training step on the GPU — forward, backward and
// the optimizer's update, all on the device — of each model at the sizes
// docs/bench/gpu.md compares with PyTorch (scripts/gpu-step-torch.py):
//
//	go test -run XXX -bench GPUStep -benchtime 50x ./cuda
//
// Besides the time it reports what a step asked of the host (cuda.Counts):
// graphs/step is 1 where the step replayed as a CUDA graph (0: its kernels
// were launched one by one, SPARSEGRAD_CUDA_GRAPHS=0 or a failed capture),
// launches/step and syncs/step the work issued and the host's waits. On
// the emulator it runs stepCases' small models: the counts hold, the times
// mean nothing.
func BenchmarkGPUStep(b *testing.B) {
	cases := stepCases(b)
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			m, err := c.build()
			if err != nil {
				b.Fatal(err)
			}
			d := m.Device()
			s := d.Stream()
			host := make([]float32, m.NumParams())
			m.InitParams(host)
			params := upload(b, s, host)
			grad, _ := d.Alloc(device.Float32, m.NumParams())
			s1, _ := d.Alloc(device.Float32, m.NumParams())
			s2, _ := d.Alloc(device.Float32, m.NumParams())
			math := d.Math()
			step := func() {
				if _, err := m.TrainStep(context.Background(), c.batch, params, grad); err != nil {
					b.Fatal(err)
				}
				var err error
				if c.adam {
					err = math.Adam(s, device.AdamStep{StepSize: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, SqrtBC2: 1}, params, grad, s1, s2)
				} else {
					err = math.SGD(s, device.SGDStep{LR: 1e-3, Momentum: 0.9, WeightDecay: 1e-4}, params, grad, s1)
				}
				if err == nil {
					err = s.Synchronize()
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			for range 3 { // warm-up: kernels loaded, cuDNN and cuBLAS initialised
				step()
			}
			b.ResetTimer()
			before := cuda.Counts()
			for b.Loop() {
				step()
			}
			n := float64(b.N)
			c := cuda.Counts().Sub(before)
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/n, "ms/step")
			b.ReportMetric(float64(m.ArenaBytes())/(1<<20), "arena-MiB")
			b.ReportMetric(float64(c.Graphs)/n, "graphs/step")
			b.ReportMetric(float64(c.Launches)/n, "launches/step")
			b.ReportMetric(float64(c.Syncs)/n, "syncs/step")
		})
	}
}

// stepCase is one model at one batch, as BenchmarkGPUStep times it.
type stepCase struct {
	name  string
	build func() (models.Model, error)
	batch models.Batch
	adam  bool
}

// stepCases are the models and batches docs/bench/gpu.md compares with
// PyTorch; on the emulator, small ones of the same kinds (NCF's second
// batch still sums over more than 1,024 rows).
func stepCases(tb testing.TB) []stepCase {
	r := rand.New(rand.NewPCG(1, 1))
	if cuda.Emulated() {
		return []stepCase{
			{"resnet18-w8-b4", func() (models.Model, error) {
				c := models.DefaultResNet18(10, 4)
				c.Width, c.Backend = 8, backend(tb)
				return models.NewResNet(c)
			}, models.Batch{Images: randVec(r, 4*3*32*32, 1), Labels: randInts(r, 4, 10)}, false},
			{"lstm-24-b3", func() (models.Model, error) {
				c := models.SmallLSTM(1000, 3)
				c.Hidden, c.Embed, c.Backend = 24, 24, backend(tb)
				return models.NewLSTM(c)
			}, models.Batch{Tokens: randInts(r, 20*3, 1000), Labels: randInts(r, 20*3, 1000)}, false},
			{"ncf-b4096", func() (models.Model, error) {
				c := models.DefaultNCF(500, 700, 4096)
				c.Backend = backend(tb)
				return models.NewNCF(c)
			}, models.Batch{Users: randInts(r, 4096, 500), Items: randInts(r, 4096, 700), Targets: randTargets(r, 4096)}, true},
		}
	}
	return []stepCase{
		{"resnet18-b128", func() (models.Model, error) {
			c := models.DefaultResNet18(10, 128)
			c.Backend = backend(tb)
			return models.NewResNet(c)
		}, models.Batch{Images: randVec(r, 128*3*32*32, 1), Labels: randInts(r, 128, 10)}, false},
		{"lstm-default-b32", func() (models.Model, error) {
			c := models.DefaultLSTM(33278, 32)
			c.Backend = backend(tb)
			return models.NewLSTM(c)
		}, models.Batch{Tokens: randInts(r, 30*32, 33278), Labels: randInts(r, 30*32, 33278)}, false},
		{"ncf-default-b256", func() (models.Model, error) {
			c := models.DefaultNCF(138493, 26744, 256)
			c.Backend = backend(tb)
			return models.NewNCF(c)
		}, models.Batch{Users: randInts(r, 256, 138493), Items: randInts(r, 256, 26744), Targets: randTargets(r, 256)}, true},
		{"ncf-default-b65536", func() (models.Model, error) {
			c := models.DefaultNCF(138493, 26744, 65536)
			c.Backend = backend(tb)
			return models.NewNCF(c)
		}, models.Batch{Users: randInts(r, 65536, 138493), Items: randInts(r, 65536, 26744), Targets: randTargets(r, 65536)}, true},
	}
}

// TestGPUProfileSteps times every instruction of one training step of each
// of stepCases' models (after two warm-up steps) and prints where the time
// goes: the op kinds' totals and the slowest instructions with their input
// shapes. It checks only that the profile covers the step (every
// instruction, times not negative); the numbers are for docs/bench/gpu.md
// (scripts/gpu-verify.sh proof runs it with the step times).
func TestGPUProfileSteps(t *testing.T) {
	for _, c := range stepCases(t) {
		t.Run(c.name, func(t *testing.T) {
			m, err := c.build()
			if err != nil {
				t.Fatal(err)
			}
			d := m.Device()
			s := d.Stream()
			host := make([]float32, m.NumParams())
			m.InitParams(host)
			params := upload(t, s, host)
			grad, _ := d.Alloc(device.Float32, m.NumParams())
			for range 2 {
				if _, err := m.TrainStep(context.Background(), c.batch, params, grad); err != nil {
					t.Fatal(err)
				}
			}
			times, _, err := models.ProfileStep(context.Background(), m, c.batch, params, grad)
			if err != nil {
				t.Fatal(err)
			}
			var total time.Duration
			kinds := map[string]time.Duration{}
			counts := map[string]int{}
			for _, o := range times {
				if o.Time < 0 {
					t.Fatalf("%s (%s): negative time %v", o.Node, o.Op, o.Time)
				}
				total += o.Time
				kinds[o.Kind] += o.Time
				counts[o.Kind]++
			}
			var names []string
			for k := range kinds {
				names = append(names, k)
			}
			sort.Slice(names, func(i, j int) bool { return kinds[names[i]] > kinds[names[j]] })
			var b strings.Builder
			fmt.Fprintf(&b, "%s: %d instructions, %.3f ms in all\n  by op kind:", c.name, len(times), ms(total))
			for _, k := range names[:min(10, len(names))] {
				fmt.Fprintf(&b, "\n    %-26s %9.3f ms %5.1f %%  %5d instructions", k, ms(kinds[k]), 100*kinds[k].Seconds()/total.Seconds(), counts[k])
			}
			slow := slices.Clone(times)
			sort.SliceStable(slow, func(i, j int) bool { return slow[i].Time > slow[j].Time })
			b.WriteString("\n  slowest instructions:")
			for _, o := range slow[:min(12, len(slow))] {
				fmt.Fprintf(&b, "\n    %9.3f ms  %-22s %v  %s", ms(o.Time), o.Kind, o.Shapes, o.Node)
			}
			t.Log(b.String())
		})
	}
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// BenchmarkGPUSelect times the sparsification primitives on a ResNet-18
// sized gradient (11,173,962 float32, normal values) against the bandwidth
// floor, for docs/bench/gpu.md (PyTorch's side:
// scripts/gpu-select-torch.py, timed the same way):
//
//	go test -run XXX -bench GPUSelect -benchtime 200x ./cuda
//
// copy-d2d is the device-to-device copy of the gradient (its bytes read +
// written per second are the bandwidth the threshold selection is measured
// against); topk-ρ is the exact top-k with values at density ρ;
// select-above-ρ is the threshold selection with the threshold of density ρ;
// feedback+topk-ρ is error feedback's accumulation and then topk-ρ, as a
// step of the topk method runs them, and feedback-counting+topk-ρ the same
// with the selection's first radix round counted by the accumulation
// (AccumulateFlagHist, TopKHist: one pass over the gradient fewer).
//
// Each call is synchronised before the next (the time is the call's until
// its results are on the device, as a reducer sees it), and the calls
// rotate over four gradients (179 MB, more than any GPU's L2 cache), so
// that no call finds its input in the cache the previous call filled. The
// first GPU run (2026-11-26) timed calls without waiting for them and
// always the same gradient: its copy ran "at 12 TB/s", the launch alone.
func BenchmarkGPUSelect(b *testing.B) {
	if cuda.Emulated() {
		b.Skip("the emulator's speed means nothing")
	}
	const n, sets = 11173962, 4
	d := gpu(b)
	s := d.Stream()
	sp := d.Sparse()
	r := rand.New(rand.NewPCG(2, 2))
	var xs [sets]device.Buffer
	for i := range xs {
		xs[i] = upload(b, s, randVec(r, n, 1))
	}
	y, _ := d.Alloc(device.Float32, n)
	idx, _ := d.Alloc(device.Int32, n)
	val, _ := d.Alloc(device.Float32, n)
	flag, _ := d.Alloc(device.Int64, 1)
	hist, _ := d.Alloc(device.Int32, cuda.HistLen)
	if err := s.Copy(hist, device.Host(make([]int32, cuda.HistLen))); err != nil {
		b.Fatal(err)
	}
	sync := func() {
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	bench := func(name string, bytes float64, f func(set int) error) {
		b.Run(name, func(b *testing.B) {
			for i := range 2 * sets {
				if err := f(i % sets); err != nil {
					b.Fatal(err)
				}
			}
			sync()
			i := 0
			for b.Loop() {
				if err := f(i % sets); err != nil {
					b.Fatal(err)
				}
				sync()
				i++
			}
			per := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(per*1e6, "µs/op")
			if bytes > 0 {
				b.ReportMetric(bytes/per/1e9, "GB/s")
			}
		})
	}
	bench("copy-d2d", 8*n, func(set int) error { return s.Copy(y, xs[set]) })
	for _, rho := range []float64{0.01, 0.001} {
		k := int(rho * n)
		bench(fmt.Sprintf("topk-%g", rho), 0, func(set int) error {
			_, err := sp.TopK(s, idx, val, xs[set], k)
			return err
		})
		// Error feedback's accumulation and then the selection, as a step
		// of topk runs them: separately, and with the first radix round
		// counted by the accumulation (scale 0: every call reads the
		// gradient and writes acc, whose values stay those of the set).
		bench(fmt.Sprintf("feedback+topk-%g", rho), 0, func(set int) error {
			if err := sp.AccumulateFlag(s, xs[set], xs[(set+1)%sets], flag, 0, 0); err != nil {
				return err
			}
			_, err := sp.TopK(s, idx, val, xs[set], k)
			return err
		})
		bench(fmt.Sprintf("feedback-counting+topk-%g", rho), 0, func(set int) error {
			if err := sp.AccumulateFlagHist(s, xs[set], xs[(set+1)%sets], flag, hist, 0, 0); err != nil {
				return err
			}
			_, err := sp.TopKHist(s, idx, val, xs[set], hist, k)
			return err
		})
		var ts [sets]float32
		for i, x := range xs {
			t, err := sp.KthLargestAbs(s, x, k)
			if err != nil {
				b.Fatal(err)
			}
			ts[i] = t
		}
		// Bytes: x read twice (count, write), indices and values written.
		bench(fmt.Sprintf("select-above-%g", rho), 8*n+8*float64(k), func(set int) error {
			_, err := sp.SelectAbove(s, idx, val, xs[set], ts[set])
			return err
		})
	}
}
