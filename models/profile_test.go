package models

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
)

// TestProfileStepMatchesTrainStep: a profiled step computes what TrainStep
// computes (the same loss and gradient bits), times every instruction, and
// leaves the next TrainStep unchanged.
func TestProfileStepMatchesTrainStep(t *testing.T) {
	resnet := DefaultResNet18(10, 2)
	resnet.Width = 4
	lstm := SmallLSTM(50, 2)
	lstm.Embed, lstm.Hidden, lstm.BPTT, lstm.Dropout = 8, 8, 3, 0
	ncf := DefaultNCF(40, 30, 16)
	ncf.Dropout = 0
	cases := []struct {
		name  string
		build func() (Model, error)
		batch Batch
		kind  string // an op kind the profile must show
	}{
		{"resnet18", func() (Model, error) { return NewResNet(resnet) },
			Batch{Images: seq(2*3*32*32, 0.01), Labels: []int{3, 7}}, "Conv2d"},
		{"lstm", func() (Model, error) { return NewLSTM(lstm) },
			Batch{Tokens: []int{1, 2, 3, 4, 5, 6}, Labels: []int{2, 3, 4, 5, 6, 7}}, "SoftmaxCrossEntropy"},
		{"ncf", func() (Model, error) { return NewNCF(ncf) },
			Batch{Users: ints(16, 40), Items: ints(16, 30), Targets: targets(16)}, "Gather"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, err := hostOf(c.build())
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			step := func() ([]float32, float64) {
				h.ResetState()
				g := make([]float32, h.NumParams())
				res, err := h.TrainStep(ctx, c.batch, g)
				if err != nil {
					t.Fatal(err)
				}
				return g, res.Loss
			}
			g1, l1 := step()
			h.ResetState()
			g2 := make([]float32, h.NumParams())
			times, res, err := ProfileStep(ctx, h.Model, c.batch, device.Host(h.params), device.Host(g2))
			if err != nil {
				t.Fatal(err)
			}
			if math.Float64bits(res.Loss) != math.Float64bits(l1) || !slices.Equal(g1, g2) {
				t.Fatalf("profiled step: loss %v, want %v; gradients equal: %v", res.Loss, l1, slices.Equal(g1, g2))
			}
			if len(times) < 10 {
				t.Fatalf("%d instructions timed", len(times))
			}
			seen := false
			for _, o := range times {
				if o.Kind == "" || o.Node == "" || o.Time < 0 {
					t.Fatalf("instruction %+v", o)
				}
				seen = seen || o.Kind == c.kind
			}
			if !seen {
				t.Errorf("no %s among the %d instructions timed", c.kind, len(times))
			}
			if g3, l3 := step(); l3 != l1 || !slices.Equal(g3, g1) {
				t.Errorf("the step after the profile differs: loss %v, want %v", l3, l1)
			}
		})
	}
	h, err := hostOf(NewNCF(ncf))
	if err != nil {
		t.Fatal(err)
	}
	h.SetGradHook(func(int, device.Event) {})
	if _, _, err := ProfileStep(context.Background(), h.Model, Batch{Users: ints(16, 40), Items: ints(16, 30), Targets: targets(16)}, device.Host(h.params), device.Host(make([]float32, h.NumParams()))); err == nil {
		t.Error("a model with a gradient hook was profiled")
	}
}

func seq(n int, step float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(i%97)*step - 0.4
	}
	return v
}

func ints(n, bound int) []int {
	v := make([]int, n)
	for i := range v {
		v[i] = (i * 7) % bound
	}
	return v
}

func targets(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(i % 2)
	}
	return v
}
