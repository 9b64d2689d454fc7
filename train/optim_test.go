package train

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
)

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func close32(a, b float32, tol float64) bool {
	return math.Abs(float64(a)-float64(b)) <= tol*(1+math.Abs(float64(b)))
}

// TestSGDMatchesPyTorchFormula runs SGD against the formula of torch.optim.SGD
// written out in float64 for several steps.
func TestSGDMatchesPyTorchFormula(t *testing.T) {
	for _, n := range []int{0, 1, 3, 17, 1000, 1<<18 + 3} {
		for _, mom := range []float64{0, 0.9} {
			for _, wd := range []float64{0, 1e-2} {
				r := rand.New(rand.NewPCG(uint64(n), 7))
				layout := []models.ParamInfo{{Name: "layer1.0.bn1.weight", Offset: 0, Size: n / 2}, {Name: "conv1.weight", Offset: n / 2, Size: n - n/2}}
				s, err := NewSGD(device.CPU.Stream(), layout, mom, wd, false)
				if err != nil {
					t.Fatal(err)
				}
				w := randVec(r, n)
				ref := make([]float64, n)
				buf := make([]float64, n)
				for i := range w {
					ref[i] = float64(w[i])
				}
				for step := 0; step < 5; step++ {
					g := randVec(r, n)
					lr := 0.1 / float64(step+1)
					if err := s.Step(device.Host(w), device.Host(g), lr); err != nil {
						t.Fatal(err)
					}
					for i := range ref {
						d := float64(g[i])
						if i >= n/2 { // the BN half is exempt from weight decay
							d += wd * ref[i]
						}
						if mom != 0 {
							if step == 0 {
								buf[i] = d
							} else {
								buf[i] = mom*buf[i] + d
							}
							d = buf[i]
						}
						ref[i] -= lr * d
					}
				}
				for i := range w {
					if !close32(w[i], float32(ref[i]), 1e-5) {
						t.Fatalf("n=%d mom=%v wd=%v: w[%d] = %v, reference %v", n, mom, wd, i, w[i], ref[i])
					}
				}
			}
		}
	}
}

func TestAdamMatchesPyTorchFormula(t *testing.T) {
	for _, n := range []int{0, 1, 5, 333, 1<<17 + 1} {
		r := rand.New(rand.NewPCG(uint64(n), 9))
		a, err := NewAdam(device.CPU.Stream(), n, 0.25, 0.5, 1e-8)
		if err != nil {
			t.Fatal(err)
		}
		w := randVec(r, n)
		ref := make([]float64, n)
		m := make([]float64, n)
		v := make([]float64, n)
		for i := range w {
			ref[i] = float64(w[i])
		}
		for step := 1; step <= 6; step++ {
			g := randVec(r, n)
			lr := 0.01
			if err := a.Step(device.Host(w), device.Host(g), lr); err != nil {
				t.Fatal(err)
			}
			for i := range ref {
				gi := float64(g[i])
				m[i] = 0.25*m[i] + 0.75*gi
				v[i] = 0.5*v[i] + 0.5*gi*gi
				mh := m[i] / (1 - math.Pow(0.25, float64(step)))
				vh := v[i] / (1 - math.Pow(0.5, float64(step)))
				ref[i] -= lr * mh / (math.Sqrt(vh) + 1e-8)
			}
		}
		for i := range w {
			if !close32(w[i], float32(ref[i]), 1e-4) {
				t.Fatalf("n=%d: w[%d] = %v, reference %v", n, i, w[i], ref[i])
			}
		}
	}
}

func TestOptimizerStateRoundTrip(t *testing.T) {
	layout := []models.ParamInfo{{Name: "a", Size: 4}}
	st := device.CPU.Stream()
	s, _ := NewSGD(st, layout, 0.9, 0, false)
	s.Step(device.Host(make([]float32, 4)), device.Host([]float32{1, 2, 3, 4}), 0.1)
	v, n, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := NewSGD(st, layout, 0.9, 0, false)
	if err := s2.SetState(v, n); err != nil {
		t.Fatal(err)
	}
	if v2, n2, _ := s2.State(); !slices.Equal(v2[0], v[0]) || n2 != n || v[0][3] != 4 {
		t.Fatalf("SGD state %v/%d after a round trip of %v/%d", v2, n2, v, n)
	}
	if err := s2.SetState(nil, 0); err == nil {
		t.Fatal("SGD accepted a state without its momentum buffer")
	}
	a, _ := NewAdam(st, 4, 0.9, 0.999, 1e-8)
	if err := a.SetState([][]float32{{1}}, 1); err == nil {
		t.Fatal("Adam accepted a state of the wrong size")
	}
}

func TestSchedule(t *testing.T) {
	s := Schedule{Base: 1, WarmupIters: 4, DecayEpochs: []int{2, 3}, Factor: 0.1}
	for _, tc := range []struct {
		it, epoch int
		want      float64
	}{
		{0, 0, 0.25}, {1, 0, 0.5}, {3, 0, 1}, {4, 0, 1}, {100, 1, 1}, {100, 2, 0.1}, {100, 3, 0.01}, {100, 9, 0.01},
	} {
		if got := s.At(tc.it, tc.epoch); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("At(%d, %d) = %v, want %v", tc.it, tc.epoch, got, tc.want)
		}
	}
}

func TestClipNorm(t *testing.T) {
	g := []float32{3, 4}
	clip := func(g []float32, max float64) float64 {
		n, err := ClipNorm(device.CPU.Stream(), device.Host(g), max)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := clip(g, 10); n != 5 || g[0] != 3 {
		t.Fatalf("no-op clip changed the gradient: %v %v", n, g)
	}
	if n := clip(g, 1); n != 5 || !close32(g[0], 0.6, 1e-5) || !close32(g[1], 0.8, 1e-5) {
		t.Fatalf("clip to 1: norm %v, g %v", n, g)
	}
	if n := clip(nil, 1); n != 0 {
		t.Fatalf("empty: %v", n)
	}
}
