package models

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
)

// TestConcurrentModels builds, trains and evaluates several models of each
// kind at once in separate goroutines (as in-process workers do) and checks
// that every worker gets the same gradients as a model run alone; under
// -race it also checks that no Gorgonia global state is shared unguarded.
func TestConcurrentModels(t *testing.T) {
	build := []func() (*host, Batch, Batch, error){
		func() (*host, Batch, Batch, error) {
			m, err := hostOf(NewNCF(NCFConfig{Users: 6, Items: 7, Factors: 3, Layers: []int{8, 6, 5, 4, 3, 2}, Dropout: 0.5, BatchSize: 5, Seed: 1}))
			b := randomPairs(rand.New(rand.NewPCG(1, 1)), 6, 7, 5)
			return m, b, Batch{Users: b.Users[:2], Items: b.Items[:2]}, err
		},
		func() (*host, Batch, Batch, error) {
			m, err := hostOf(NewLSTM(LSTMConfig{Vocab: 7, Embed: 4, Hidden: 4, Layers: 2, Tied: true, Dropout: 0.2, BPTT: 3, BatchSize: 2, Seed: 1}))
			b := randomTokens(rand.New(rand.NewPCG(1, 1)), 7, 6)
			e := b
			e.Steps = 1
			return m, b, e, err
		},
		func() (*host, Batch, Batch, error) {
			cfg := tinyResNet(2, 1)
			m, err := hostOf(NewResNet(cfg))
			b := randomImages(rand.New(rand.NewPCG(1, 1)), cfg, 2)
			return m, b, randomImages(rand.New(rand.NewPCG(2, 2)), cfg, 1), err
		},
	}
	ctx := context.Background()
	for k, f := range build {
		m, b, _, err := f()
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float32, m.NumParams())
		if _, err := m.TrainStep(ctx, b, want); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				m, b, e, err := f()
				if err != nil {
					errs[w] = err
					return
				}
				if w%2 == 1 {
					m.SetGradHook(func(int, device.Event) {})
				}
				got := make([]float32, m.NumParams())
				if _, err := m.TrainStep(ctx, b, got); err != nil {
					errs[w] = err
					return
				}
				if !slices.Equal(got, want) {
					t.Errorf("model %d worker %d: gradient differs from a lone model's", k, w)
				}
				if _, err := m.Evaluate(ctx, e); err != nil {
					errs[w] = err
				}
			}(w)
		}
		wg.Wait()
		for w, err := range errs {
			if err != nil {
				t.Fatalf("model %d worker %d: %v", k, w, err)
			}
		}
	}
}
