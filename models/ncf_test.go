package models

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
)

// refNCFLogits is a plain re-implementation of NeuMF's forward pass
// (no dropout) straight from the definition, in float64.
func refNCFLogits(cfg NCFConfig, lay []ParamInfo, p []float32, users, items []int) []float64 {
	get := func(i int) []float32 { return p[lay[i].Offset : lay[i].Offset+lay[i].Size] }
	f, half := cfg.Factors, cfg.Layers[0]/2
	out := make([]float64, len(users))
	for n := range users {
		u, it := users[n], items[n]
		gmf := make([]float64, f)
		for j := 0; j < f; j++ {
			gmf[j] = float64(get(0)[u*f+j]) * float64(get(1)[it*f+j])
		}
		x := make([]float64, 0, 2*half)
		for j := 0; j < half; j++ {
			x = append(x, float64(get(2)[u*half+j]))
		}
		for j := 0; j < half; j++ {
			x = append(x, float64(get(3)[it*half+j]))
		}
		k := 4
		for l := 1; l < len(cfg.Layers); l++ {
			in, o := cfg.Layers[l-1], cfg.Layers[l]
			w, b := get(k), get(k+1)
			y := make([]float64, o)
			for c := 0; c < o; c++ {
				s := float64(b[c])
				for r := 0; r < in; r++ {
					s += x[r] * float64(w[r*o+c])
				}
				y[c] = math.Max(s, 0)
			}
			x = y
			k += 2
		}
		cat := append(gmf, x...)
		w, b := get(k), get(k+1)
		s := float64(b[0])
		for r, v := range cat {
			s += v * float64(w[r])
		}
		out[n] = s
	}
	return out
}

func randomPairs(r *rand.Rand, users, items, n int) Batch {
	b := Batch{Users: make([]int, n), Items: make([]int, n), Targets: make([]float32, n)}
	for i := 0; i < n; i++ {
		b.Users[i] = r.IntN(users)
		b.Items[i] = r.IntN(items)
		if r.IntN(2) == 0 {
			b.Targets[i] = 1
		}
	}
	return b
}

func TestNCFParamCount(t *testing.T) {
	cases := []struct {
		name string
		cfg  NCFConfig
		want int
	}{
		{"deft-ml20m", DefaultNCF(138493, 26744, 4), 31832577},
		// (943+1682)·8 + (943+1682)·32 + 64·32+32 + 32·16+16 + 16·8+8 + 16+1.
		{"paper-ml100k", PaperNCF(943, 1682, 4), 2625*8 + 2625*32 + 64*32 + 32 + 32*16 + 16 + 16*8 + 8 + 16 + 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := NewNCF(c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if m.NumParams() != c.want {
				t.Fatalf("NumParams = %d, want %d", m.NumParams(), c.want)
			}
			sum := 0
			for i, p := range m.Layout() {
				if p.Offset != sum {
					t.Fatalf("tensor %d offset %d, want %d", i, p.Offset, sum)
				}
				sum += p.Size
			}
			if sum != c.want {
				t.Fatalf("layout sums to %d", sum)
			}
		})
	}
}

func TestNCFMatchesReference(t *testing.T) {
	for _, B := range []int{1, 2, 3, 5, 16} {
		cfg := NCFConfig{Users: 7, Items: 11, Factors: 3, Layers: []int{6, 5, 2}, BatchSize: B, Seed: uint64(B)}
		m, err := hostOf(NewNCF(cfg))
		if err != nil {
			t.Fatal(err)
		}
		randomizeParams(m, uint64(B), 0.7)
		b := randomPairs(rand.New(rand.NewPCG(uint64(B), 1)), 7, 11, B)
		ref := refNCFLogits(cfg, m.Layout(), m.Params(), b.Users, b.Items)
		var wantLoss float64
		for i, z := range ref {
			wantLoss += bce(z, float64(b.Targets[i]))
		}
		grad := make([]float32, m.NumParams())
		r, err := m.TrainStep(context.Background(), b, grad)
		if err != nil {
			t.Fatal(err)
		}
		if !closeRel(r.Loss, wantLoss/float64(B), 1e-5) {
			t.Errorf("B=%d: train loss %v, reference %v", B, r.Loss, wantLoss/float64(B))
		}
		ev, err := m.Evaluate(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ref {
			if !closeRel(float64(ev.Scores[i]), ref[i], 1e-5) {
				t.Errorf("B=%d: logit %d = %v, reference %v", B, i, ev.Scores[i], ref[i])
			}
		}
		if !closeRel(ev.LossSum, wantLoss, 1e-5) || ev.Count != B {
			t.Errorf("B=%d: eval loss %v/%d, reference %v/%d", B, ev.LossSum, ev.Count, wantLoss, B)
		}
		// Evaluate with a different batch size than training.
		ev1, err := m.Evaluate(context.Background(), Batch{Users: b.Users[:1], Items: b.Items[:1]})
		if err != nil {
			t.Fatal(err)
		}
		if !closeRel(float64(ev1.Scores[0]), ref[0], 1e-5) {
			t.Errorf("B=%d: single-pair logit %v, reference %v", B, ev1.Scores[0], ref[0])
		}
	}
}

func TestNCFGradCheck(t *testing.T) {
	for _, B := range []int{1, 3, 8} {
		cfg := NCFConfig{Users: 5, Items: 7, Factors: 3, Layers: []int{4, 6, 3}, BatchSize: B, Seed: 3}
		m, err := hostOf(NewNCF(cfg))
		if err != nil {
			t.Fatal(err)
		}
		randomizeParams(m, 11+uint64(B), 0.8)
		b := randomPairs(rand.New(rand.NewPCG(uint64(B), 2)), 5, 7, B)
		gradCheck(t, m, b, 8, 1e-2, 5e-3, 1e-4)
	}
}

func TestNCFTrainStepKeepsParams(t *testing.T) {
	m, err := hostOf(NewNCF(NCFConfig{Users: 9, Items: 9, Factors: 4, Layers: []int{8, 4}, Dropout: 0.5, BatchSize: 6, Seed: 5}))
	if err != nil {
		t.Fatal(err)
	}
	before := slices.Clone(m.Params())
	b := randomPairs(rand.New(rand.NewPCG(1, 1)), 9, 9, 6)
	g1 := make([]float32, m.NumParams())
	if _, err := m.TrainStep(context.Background(), b, g1); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(before, m.Params()) {
		t.Fatal("TrainStep changed the parameters")
	}
	// Same seed → same initial parameters; different seed → different.
	m2, _ := hostOf(NewNCF(NCFConfig{Users: 9, Items: 9, Factors: 4, Layers: []int{8, 4}, Dropout: 0.5, BatchSize: 6, Seed: 5}))
	m3, _ := hostOf(NewNCF(NCFConfig{Users: 9, Items: 9, Factors: 4, Layers: []int{8, 4}, Dropout: 0.5, BatchSize: 6, Seed: 6}))
	if !slices.Equal(before, m2.Params()) || slices.Equal(before, m3.Params()) {
		t.Fatal("initialisation is not a function of the seed")
	}
	// Dropout changes the training loss between steps but not evaluation.
	g2 := make([]float32, m.NumParams())
	m2.TrainStep(context.Background(), b, g2)
	if !slices.Equal(g1, g2) {
		t.Fatal("same seed, same batch: gradients differ")
	}
}

func TestNCFOverfit(t *testing.T) {
	cfg := PaperNCF(30, 40, 64)
	cfg.Seed = 2
	m, err := hostOf(NewNCF(cfg))
	if err != nil {
		t.Fatal(err)
	}
	b := randomPairs(rand.New(rand.NewPCG(3, 3)), 30, 40, 64)
	first, last := sgd(t, m, b, 2, 300)
	t.Logf("loss %.4f → %.4f", first, last)
	if !(last < 0.3*first) {
		t.Fatalf("loss did not drop enough on a fixed batch: %.4f → %.4f", first, last)
	}
}

func TestNCFBadInput(t *testing.T) {
	if _, err := NewNCF(NCFConfig{Users: 0, Items: 3, Factors: 2, Layers: []int{4}, BatchSize: 1}); !errors.Is(err, ErrBadInput) {
		t.Errorf("zero users: err = %v", err)
	}
	if _, err := NewNCF(NCFConfig{Users: 3, Items: 3, Factors: 2, Layers: []int{5}, BatchSize: 1}); !errors.Is(err, ErrBadInput) {
		t.Errorf("odd Layers[0]: err = %v", err)
	}
	m, err := hostOf(NewNCF(NCFConfig{Users: 3, Items: 3, Factors: 2, Layers: []int{4, 2}, BatchSize: 2}))
	if err != nil {
		t.Fatal(err)
	}
	grad := make([]float32, m.NumParams())
	bad := []Batch{
		{Users: []int{0}, Items: []int{0}, Targets: []float32{1}},
		{Users: []int{0, 3}, Items: []int{0, 1}, Targets: []float32{1, 0}},
		{Users: []int{0, 1}, Items: []int{0, -1}, Targets: []float32{1, 0}},
		{Users: []int{0, 1}, Items: []int{0, 1}},
	}
	for i, b := range bad {
		if _, err := m.TrainStep(context.Background(), b, grad); !errors.Is(err, ErrBadInput) {
			t.Errorf("bad batch %d: err = %v", i, err)
		}
	}
	ok := Batch{Users: []int{0, 1}, Items: []int{0, 1}, Targets: []float32{1, 0}}
	if _, err := m.TrainStep(context.Background(), ok, grad[:3]); !errors.Is(err, ErrBadInput) {
		t.Errorf("short grad: err = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.TrainStep(ctx, ok, grad); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: err = %v", err)
	}
	if _, err := m.Evaluate(context.Background(), Batch{}); !errors.Is(err, ErrBadInput) {
		t.Errorf("empty eval batch: err = %v", err)
	}
	if err := m.InitParams(make([]float32, 2)); !errors.Is(err, ErrBadInput) {
		t.Errorf("short InitParams: err = %v", err)
	}
	if _, err := m.Model.Evaluate(context.Background(), ok, device.Host(make([]float32, 5))); !errors.Is(err, ErrBadInput) {
		t.Errorf("short parameter vector: err = %v", err)
	}
}
