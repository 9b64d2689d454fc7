package advise

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/recorded"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// writeCNNRecording writes a recording of p workers × s steps over a
// torchvision-ResNet-like layout (its parameter names; smaller tensors),
// Gaussian gradients of standard deviation sigma.
func writeCNNRecording(t *testing.T, p, s int, sigma float64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rec")
	var params []recorded.Param
	for _, x := range []struct {
		name  string
		shape []int
	}{{"conv1.weight", []int{64, 3, 7, 7}}, {"bn1.weight", []int{64}}, {"bn1.bias", []int{64}}, {"layer1.0.conv1.weight", []int{64, 64, 3, 3}}, {"fc.weight", []int{10, 512}}, {"fc.bias", []int{10}}} {
		n := 1
		for _, d := range x.shape {
			n *= d
		}
		params = append(params, recorded.Param{Tensor: layout.Tensor{Name: x.name, Shape: x.shape, Size: n}})
	}
	w, err := recorded.Create(dir, recorded.Manifest{Model: "ResNet", Source: "pytorch", Mode: "simulated", Workers: p, Batch: 32, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	N := 0
	for _, x := range params {
		N += x.Size
	}
	rng := rand.New(rand.NewPCG(5, 6))
	g := make([]float32, N)
	for st := 1; st <= s; st++ {
		for r := range p {
			for i := range g {
				g[i] = float32(sigma * rng.NormFloat64())
			}
			if err := w.Write(st, r, g); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Commit(s, recorded.StepTime{Seconds: 0.085, Device: "cuda:0 (NVIDIA H200)"}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestMicroOverTheHorizon is the new user's torchvision case: MiCRO's
// threshold starts at 1/(2√k) and moves about 0.5 % a step, so over a run
// of 3 steps on gradients of which about 12 % exceed that threshold (as
// ResNet-18's did, 0.118–0.131 of the gradient sent at ρ = 0.01) it sends
// far more than ρ. The advisor must predict what those 3 steps send, not
// the controller's end point ρ.
func TestMicroOverTheHorizon(t *testing.T) {
	const rho = 0.01
	N := 64*3*49 + 64 + 64 + 64*64*9 + 5120 + 10
	thr := 1 / (2 * math.Sqrt(float64(sparsify.BudgetK(rho, N))))
	sigma := thr / 1.555 // P(|g| > thr) ≈ 0.12 for a Gaussian
	dir := writeCNNRecording(t, 8, 3, sigma)
	h, err := MeasureRecorded(context.Background(), RecordedConfig{Dir: dir, Densities: []float64{rho}, Methods: []string{"dense", "micro", "topk"}})
	if err != nil {
		t.Fatal(err)
	}
	if h.HorizonSteps != 3 {
		t.Errorf("horizon %d steps, want the recording's 3", h.HorizonSteps)
	}
	for _, P := range []int{8, 16} {
		pr, err := Predict(h, Setting{Method: "micro", Workers: P, Density: rho})
		if err != nil {
			t.Fatal(err)
		}
		if pr.ActualDensity < 5*rho || pr.StartDensity < 5*rho {
			t.Errorf("%d workers: MiCRO predicted at %.4f (start %.4f) over 3 steps; want at least 5× ρ = %g", P, pr.ActualDensity, pr.StartDensity, 5*rho)
		}
		if pr.HorizonSteps != 3 || pr.Settled < 1 || pr.Settled > 3 {
			t.Errorf("%d workers: horizon %d settled %d", P, pr.HorizonSteps, pr.Settled)
		}
		// Top-k's budget is fixed: its horizon is its steady state.
		tk, err := Predict(h, Setting{Method: "topk", Workers: P, Density: rho})
		if err != nil {
			t.Fatal(err)
		}
		if tk.ActualDensity > float64(P)*rho*1.01 || tk.ActualDensity < rho {
			t.Errorf("%d workers: Top-k at %.4f, want between ρ and P·ρ", P, tk.ActualDensity)
		}
	}
}

func TestSettledAt(t *testing.T) {
	for _, c := range []struct {
		v    []float64
		want int
	}{
		{nil, 0},
		{[]float64{1}, 1},
		{[]float64{5, 3, 1.05, 1}, 3},
		{[]float64{1, 1, 1}, 1},
		{[]float64{1, 1, 2}, 3},
	} {
		if got := settledAt(c.v); got != c.want {
			t.Errorf("settledAt(%v) = %d, want %d", c.v, got, c.want)
		}
	}
}
