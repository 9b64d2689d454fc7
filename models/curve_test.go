package models

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/data"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/ops"
)

// curveRun trains a narrow ResNet (the ResNet-18 layout at width 8, one
// block per stage) on the real CIFAR-10 images of ds with SGD (lr 0.05,
// momentum 0.9) for steps batches of 32, drawn in the order seeded by
// order, on the CPU kernels set now, and returns each step's loss.
func curveRun(t *testing.T, ds *data.CIFAR, steps int, order uint64) []float64 {
	t.Helper()
	const batch = 32
	cfg := ResNetConfig{Classes: 10, Width: 8, Blocks: [4]int{1, 1, 1, 1}, ImageSize: 32, BatchSize: batch, Momentum: 0.1, Epsilon: 1e-5, Seed: 1}
	m, err := hostOf(NewResNet(cfg))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(order, 26))
	perm := r.Perm(ds.Len())
	grad, vel := make([]float32, m.NumParams()), make([]float32, m.NumParams())
	b := Batch{Images: make([]float32, batch*data.CIFARPixels), Labels: make([]int, batch)}
	losses := make([]float64, steps)
	for s := range steps {
		for i := range batch {
			k := perm[(s*batch+i)%len(perm)]
			px := ds.Pixels[k*data.CIFARPixels : (k+1)*data.CIFARPixels]
			for j, v := range px {
				b.Images[i*data.CIFARPixels+j] = (float32(v)/255 - 0.5) / 0.25
			}
			b.Labels[i] = int(ds.Labels[k])
		}
		res, err := m.TrainStep(context.Background(), b, grad)
		if err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
		losses[s] = res.Loss
		p := m.Params()
		for j := range p {
			vel[j] = 0.9*vel[j] + grad[j]
			p[j] -= 0.05 * vel[j]
		}
	}
	return losses
}

// windowStats returns the mean and the variance of the mean of the losses
// in [lo, hi).
func windowStats(l []float64, lo, hi int) (mean, varMean float64) {
	n := float64(hi - lo)
	for _, v := range l[lo:hi] {
		mean += v
	}
	mean /= n
	for _, v := range l[lo:hi] {
		varMean += (v - mean) * (v - mean)
	}
	return mean, varMean / (n - 1) / n
}

// TestOneDNNCurveMatchesIm2col: a few hundred training steps on real CIFAR-10
// images give the same loss curve with oneDNN's kernels as with the
// project's im2col kernels, within the noise of the step losses. The two
// runs start from the same weights and see the same batches; their summation
// orders differ, so after a few steps they follow different trajectories,
// and the test compares windows of 50 steps: each window's mean loss must
// agree within three standard errors of the difference of the means (from
// the spread of the step losses inside the windows). The loss must also
// fall (the comparison means nothing on a model that does not learn), and a
// third run with im2col on another batch order is logged as the yardstick of
// what an unrelated run differs by (docs/bench/onednn.md). It runs in the
// pass that requires oneDNN (SPARSEGRAD_TEST_KERNELS=onednn).
func TestOneDNNCurveMatchesIm2col(t *testing.T) {
	if testing.Short() {
		t.Skip("three runs of 300 training steps")
	}
	if testKernels() != engine.KernelsOneDNN {
		// Eight minutes on the shared 2-core machine: once per CI run.
		t.Skip("runs with SPARSEGRAD_TEST_KERNELS=onednn (CI's second pass of the models' tests)")
	}
	dir := testenv.SharedData(t, filepath.Join(data.CIFAR10.DirName(), "data_batch_1.bin"))
	ds, err := data.ReadCIFARFile(filepath.Join(dir, data.CIFAR10.DirName(), "data_batch_1.bin"), data.CIFAR10)
	if err != nil {
		t.Fatal(err)
	}
	const steps, window = 300, 50
	// OpenBLAS where installed (im2col's products; gonum's take 3-4 times
	// as long), the tests' BLAS again afterwards.
	if _, err := ops.ConfigureBLAS(ops.BLASOpenBLAS, 0); err != nil {
		t.Logf("OpenBLAS not installed (%v): im2col runs on gonum", err)
	}
	t.Cleanup(func() { ops.ConfigureBLAS(testBLAS(), 0) })
	engine.ConfigureCPU(engine.KernelsIm2col, 0)
	start := time.Now()
	ref := curveRun(t, ds, steps, 1)
	other := curveRun(t, ds, steps, 2)
	useOneDNN(t)
	mid := time.Now()
	dnn := curveRun(t, ds, steps, 1)
	engine.ConfigureCPU(testKernels(), 0)
	t.Logf("two im2col runs in %v, the oneDNN run in %v", mid.Sub(start).Round(time.Second), time.Since(mid).Round(time.Second))

	if !closeRel(dnn[0], ref[0], 1e-5) {
		t.Errorf("first step: loss %v with oneDNN, %v with im2col (same weights, same batch)", dnn[0], ref[0])
	}
	for lo := 0; lo < steps; lo += window {
		mr, vr := windowStats(ref, lo, lo+window)
		md, vd := windowStats(dnn, lo, lo+window)
		mo, _ := windowStats(other, lo, lo+window)
		se := math.Sqrt(vr + vd)
		t.Logf("steps %3d-%3d: mean loss im2col %.4f, oneDNN %.4f (difference %+.4f, 3 standard errors %.4f); im2col on another batch order %.4f (%+.4f)",
			lo+1, lo+window, mr, md, md-mr, 3*se, mo, mo-mr)
		if math.Abs(md-mr) > 3*se {
			t.Errorf("steps %d-%d: mean loss %.4f with oneDNN, %.4f with im2col: farther apart than 3 standard errors (%.4f)", lo+1, lo+window, md, mr, 3*se)
		}
	}
	first, _ := windowStats(ref, 0, window)
	last, _ := windowStats(ref, steps-window, steps)
	if last > first-0.2 {
		t.Errorf("the model did not learn: mean loss %.4f over the first %d steps, %.4f over the last", first, window, last)
	}
}
