package cuda_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
)

// BenchmarkGPUStep is one training step on the GPU — forward, backward and
// the optimizer's update, all on the device — of each model at the sizes
// docs/bench/gpu.md compares with PyTorch (scripts/gpu-step-torch.py):
//
//	go test -run XXX -bench GPUStep -benchtime 50x ./cuda
func BenchmarkGPUStep(b *testing.B) {
	if cuda.Emulated() {
		b.Skip("the emulator's speed means nothing")
	}
	r := rand.New(rand.NewPCG(1, 1))
	cases := []struct {
		name  string
		build func() (models.Model, error)
		batch models.Batch
		adam  bool
	}{
		{"resnet18-b128", func() (models.Model, error) {
			c := models.DefaultResNet18(10, 128)
			c.Backend = backend(b)
			return models.NewResNet(c)
		}, models.Batch{Images: randVec(r, 128*3*32*32, 1), Labels: randInts(r, 128, 10)}, false},
		{"lstm-default-b32", func() (models.Model, error) {
			c := models.DefaultLSTM(33278, 32)
			c.Backend = backend(b)
			return models.NewLSTM(c)
		}, models.Batch{Tokens: randInts(r, 30*32, 33278), Labels: randInts(r, 30*32, 33278)}, false},
		{"ncf-default-b256", func() (models.Model, error) {
			c := models.DefaultNCF(138493, 26744, 256)
			c.Backend = backend(b)
			return models.NewNCF(c)
		}, models.Batch{Users: randInts(r, 256, 138493), Items: randInts(r, 256, 26744), Targets: randTargets(r, 256)}, true},
		{"ncf-default-b65536", func() (models.Model, error) {
			c := models.DefaultNCF(138493, 26744, 65536)
			c.Backend = backend(b)
			return models.NewNCF(c)
		}, models.Batch{Users: randInts(r, 65536, 138493), Items: randInts(r, 65536, 26744), Targets: randTargets(r, 65536)}, true},
	}
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
			for b.Loop() {
				step()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N), "ms/step")
			b.ReportMetric(float64(m.ArenaBytes())/(1<<20), "arena-MiB")
		})
	}
}

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
// select-above-ρ is the threshold selection with the threshold of density ρ.
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
