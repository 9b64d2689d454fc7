package cuda_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// The first checks of a GPU machine (scripts/gpu-verify.sh runs them
// first): what was loaded from where, and the selections at the size of
// a real gradient.

// TestGPUProbe builds ResNet-18 at batch 128 on the GPU (the emulator: a
// narrow one at batch 2), runs two training steps, and reports the GPU,
// the driver, every NVIDIA library and file loaded, and the cuDNN
// algorithm chosen for each convolution, as JSON in the log. cuBLAS and
// cuDNN must be among the libraries, with versions, and every convolution
// must have an algorithm.
func TestGPUProbe(t *testing.T) {
	d := gpu(t)
	c := models.DefaultResNet18(10, 128)
	if cuda.Emulated() {
		c.Width, c.BatchSize = 4, 2
	}
	c.Backend = backend(t)
	m, err := models.NewResNet(c)
	if err != nil {
		t.Fatal(err)
	}
	s := d.Stream()
	host := make([]float32, m.NumParams())
	m.InitParams(host)
	params := upload(t, s, host)
	grad, err := d.Alloc(device.Float32, m.NumParams())
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(5, 5))
	batch := models.Batch{Images: randVec(r, c.BatchSize*3*32*32, 1), Labels: randInts(r, c.BatchSize, 10)}
	for step := range 2 {
		start := time.Now()
		res, err := m.TrainStep(context.Background(), batch, params, grad)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("ResNet-18 batch %d step %d: loss %.5f in %v (forward %v, backward %v)", c.BatchSize, step+1, res.Loss, time.Since(start), res.Forward, res.Backward)
	}
	rep := d.Report()
	js, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("%v\n%s", d, js)
	for _, want := range []string{"cuBLAS", "cuDNN"} {
		i := slices.IndexFunc(rep.Libraries, func(l cuda.LibraryInfo) bool { return strings.HasPrefix(l.Name, want) })
		if i < 0 || rep.Libraries[i].Version == "" {
			t.Errorf("%s is not reported with its version: %+v", want, rep.Libraries)
		}
	}
	if len(rep.Convolutions) == 0 {
		t.Error("no convolution algorithm reported")
	}
	for _, ch := range rep.Convolutions {
		if !ch.Timed && !cuda.Emulated() {
			t.Errorf("%s: the algorithm was not timed (cuDNN's Find is missing or failed): %+v", ch.Op, ch)
		}
	}
}

// gradientSize is ResNet-18's parameter count: the gradient the
// selections run on in training.
const gradientSize = 11173962

// TestGPUSelectLarge selects on a gradient of ResNet-18's size (the
// emulator: 300,007 elements, still many tiles and grid-stride rounds):
// exact top-k at ρ = 0.01 and 0.001 and the threshold selection at their
// k-th magnitudes, the index sets and values equal to the CPU's.
func TestGPUSelectLarge(t *testing.T) {
	d := gpu(t)
	n := gradientSize
	if cuda.Emulated() {
		n = 300007
	}
	sp := d.Sparse()
	s := d.Stream()
	r := rand.New(rand.NewPCG(9, 9))
	x := randVec(r, n, 1)
	// Ties at the k-th magnitudes (normal tails above 2.6 and 3.4 hold
	// 0.93 % and 0.067 % of the elements): the top-k takes the lowest
	// indices of the tied magnitude, as the CPU does.
	for i := range n / 500 {
		x[r.IntN(n)] = 2.6 * float32(1-2*(i%2))
	}
	for range n / 2000 {
		x[r.IntN(n)] = 3.4
	}
	xb := upload(t, s, x)
	defer d.Free(xb)
	idx := allocInt32(t, d, n)
	defer d.Free(idx)
	val, err := d.Alloc(device.Float32, n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(val)
	check := func(name string, got int, want []int32) {
		t.Helper()
		if got != len(want) {
			t.Fatalf("%s: %d selected, CPU %d", name, got, len(want))
		}
		gi := downloadInt32(t, s, idx)[:got]
		if !slices.Equal(gi, want) {
			i := 0
			for i < len(gi) && gi[i] == want[i] {
				i++
			}
			t.Fatalf("%s: index sets differ from the CPU's from position %d (GPU %v, CPU %v)", name, i, gi[i:min(i+4, len(gi))], want[i:min(i+4, len(want))])
		}
		wv := make([]float32, len(want))
		for j, i := range want {
			wv[j] = x[i]
		}
		if !sameBits(download(t, s, val)[:got], wv) {
			t.Fatalf("%s: values differ", name)
		}
	}
	for _, rho := range []float64{0.01, 0.001} {
		k := int(rho * float64(n))
		got, err := sp.TopK(s, idx, val, xb, k)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("top-k n=%d ρ=%g", n, rho), got, sparsify.TopK(nil, x, k))
		th := sparsify.KthLargestAbs(x, k)
		if g, err := sp.KthLargestAbs(s, xb, k); err != nil || g != th {
			t.Fatalf("k-th magnitude n=%d ρ=%g: GPU %v (%v), CPU %v", n, rho, g, err, th)
		}
		got, err = sp.SelectAbove(s, idx, val, xb, th)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("threshold n=%d ρ=%g", n, rho), got, sparsify.SelectAbove(nil, x, th))
		t.Logf("n=%d ρ=%g: top-%d and the %d elements at or above %v equal the CPU's", n, rho, k, got, th)
	}
}
