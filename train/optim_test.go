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

// TestOneCycle compares the one-cycle schedule with PyTorch 1.13's
// OneCycleLR (max_lr 0.4, defaults otherwise, cycle_momentum off), whose
// rates these are, printed by torch for a few cycle lengths and rise
// fractions (pct_start; WarmupIters = pct_start·total).
func TestOneCycle(t *testing.T) {
	for _, tc := range []struct {
		total, warmup int
		want          map[int]float64
	}{
		{100, 0, map[int]float64{0: 0.016000000000000014, 14: 0.19760532955159985, 28: 0.39887448777363704, 42: 0.36691478308565756,
			56: 0.2702754837164093, 70: 0.14679364371614145, 84: 0.04363512897158001, 98: 0.0002029858861903152, 99: 1.6e-06}},
		{7, 0, map[int]float64{0: 0.016000000000000014, 1: 0.3922226509339835, 2: 0.36761775050788426, 3: 0.26907353459221806,
			4: 0.14309551029586282, 5: 0.03971871675730624, 6: 1.6e-06}},
		{1000, 150, map[int]float64{0: 0.016000000000000014, 142: 0.397912598384452, 284: 0.37561634715174114, 426: 0.3040269933554621,
			568: 0.2044356083807191, 710: 0.10365045058259621, 852: 0.028801121073631634, 994: 3.574977178982453e-05, 999: 1.6e-06}},
		{3, 0, map[int]float64{0: 0.39776617418036475, 1: 0.18505484106679002, 2: 1.6e-06}},
	} {
		s := Schedule{Base: 0.4, WarmupIters: tc.warmup, OneCycleIters: tc.total, DecayEpochs: []int{1}, Factor: 0.1}
		for it, want := range tc.want {
			if got := s.At(it, it/10); math.Abs(got-want) > 1e-12*want+1e-15 {
				t.Errorf("cycle %d (rise %d): At(%d) = %v, PyTorch %v", tc.total, tc.warmup, it, got, want)
			}
		}
		if got := s.At(tc.total+5, 99); math.Abs(got-1.6e-6) > 1e-18 {
			t.Errorf("cycle %d: after the cycle At = %v, want the final rate 1.6e-6", tc.total, got)
		}
	}
	if got := (Schedule{Base: 1, OneCycleIters: 1}).At(0, 0); got != 1.0/25/1e4 {
		t.Errorf("one-iteration cycle: %v", got)
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

// TestDecayOnlySGD: with a reducer that applies the momentum itself (DGC's
// momentum correction) SGD applies momentum to the weight decay only, as
// DGC's optimizer does: buf ← m·buf + wd·w (buf = wd·w at first), w ← w −
// lr·(g + buf); batch-norm parameters (no decay) get w ← w − lr·g.
func TestDecayOnlySGD(t *testing.T) {
	layout := []models.ParamInfo{{Name: "conv.weight", Size: 7, Offset: 0}, {Name: "layer1.0.bn1.weight", Size: 3, Offset: 7}, {Name: "fc.weight", Size: 5, Offset: 10}}
	const n, mom, wd = 15, 0.9, 0.01
	o, err := NewDecayOnlySGD(device.CPU.Stream(), layout, mom, wd)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(4, 4))
	w := randVec(r, n)
	ref := make([]float64, n)
	buf := make([]float64, n)
	for i := range w {
		ref[i] = float64(w[i])
	}
	for step := range 4 {
		g := randVec(r, n)
		lr := 0.1
		if err := o.Step(device.Host(w), device.Host(g), lr); err != nil {
			t.Fatal(err)
		}
		for i := range ref {
			d := wd
			if i >= 7 && i < 10 {
				d = 0
			}
			if step == 0 {
				buf[i] = d * ref[i]
			} else {
				buf[i] = mom*buf[i] + d*ref[i]
			}
			ref[i] -= lr * (float64(g[i]) + buf[i])
		}
	}
	for i := range w {
		if !close32(w[i], float32(ref[i]), 1e-5) {
			t.Fatalf("w[%d] = %v, DGC's optimizer gives %v", i, w[i], ref[i])
		}
	}
}
