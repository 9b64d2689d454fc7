package models

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
)

// TestGradHook checks, for every model, that with a hook installed the
// gradients are bitwise the same as without, that the hook fires exactly
// once per parameter tensor when that tensor's part of the gradient is
// already filled, and that the first tensors to become final are the last
// layers (backward order).
func TestGradHook(t *testing.T) {
	ctx := context.Background()
	type tc struct {
		name  string
		build func() (*host, Batch)
	}
	cases := []tc{
		{"ncf", func() (*host, Batch) {
			m, _ := hostOf(NewNCF(NCFConfig{Users: 6, Items: 7, Factors: 3, Layers: []int{4, 3, 2}, BatchSize: 5, Seed: 1}))
			return m, randomPairs(rand.New(rand.NewPCG(1, 1)), 6, 7, 5)
		}},
		{"lstm", func() (*host, Batch) {
			m, _ := hostOf(NewLSTM(LSTMConfig{Vocab: 7, Embed: 4, Hidden: 4, Layers: 2, Tied: true, BPTT: 3, BatchSize: 2, Seed: 1}))
			return m, randomTokens(rand.New(rand.NewPCG(1, 1)), 7, 6)
		}},
		{"resnet", func() (*host, Batch) {
			cfg := tinyResNet(3, 1)
			m, _ := hostOf(NewResNet(cfg))
			return m, randomImages(rand.New(rand.NewPCG(1, 1)), cfg, 3)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, b := c.build()
			m2, _ := c.build()
			want := make([]float32, m.NumParams())
			if _, err := m.TrainStep(ctx, b, want); err != nil {
				t.Fatal(err)
			}
			var order []int
			got := make([]float32, m.NumParams())
			lay := m2.Layout()
			m2.SetGradHook(func(i int, ready device.Event) {
				if err := ready.Synchronize(); err != nil {
					t.Error(err)
				}
				p := lay[i]
				if !slices.Equal(got[p.Offset:p.Offset+p.Size], want[p.Offset:p.Offset+p.Size]) {
					t.Errorf("hook %d (%s): gradient not final when the hook fired", i, p.Name)
				}
				order = append(order, i)
			})
			for step := 0; step < 2; step++ {
				order = order[:0]
				clear(got)
				if _, err := m2.TrainStep(ctx, b, got); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatal("gradients differ with the hook installed")
				}
				seen := make([]int, len(lay))
				for _, i := range order {
					seen[i]++
				}
				for i, n := range seen {
					if n != 1 {
						t.Fatalf("tensor %d (%s) fired %d times", i, lay[i].Name, n)
					}
				}
				if step == 0 {
					// Recompute want for the LSTM (its state moved on) and
					// the ResNet (running statistics do not affect the
					// gradient, but keep both models in lock-step).
					if _, err := m.TrainStep(ctx, b, want); err != nil {
						t.Fatal(err)
					}
				}
			}
			t.Logf("firing order: %v", order)
			last := len(lay) - 1
			if pos := slices.Index(order, last); pos > len(order)/2 {
				t.Errorf("last tensor %s fired at position %d of %d; backward order should finish it early", lay[last].Name, pos, len(order))
			}
			// Removing the hook restores the plain path.
			m2.SetGradHook(nil)
			n := len(order)
			if _, err := m2.TrainStep(ctx, b, got); err != nil {
				t.Fatal(err)
			}
			if len(order) != n {
				t.Fatal("hook fired after removal")
			}
		})
	}
}
