package models

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestStateContinuesExactly: a model saved after some steps and a freshly
// built one given that state take the same next steps (losses and
// gradients bit for bit), for the models that keep state between steps;
// without the state they differ (dropout masks, LSTM hidden state), so the
// test can fail.
func TestStateContinuesExactly(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		build func() (*host, error)
		batch func(i int) Batch
	}{
		{"ncf", func() (*host, error) {
			return hostOf(NewNCF(NCFConfig{Users: 6, Items: 7, Factors: 3, Layers: []int{8, 6, 5, 4, 3, 2}, Dropout: 0.5, BatchSize: 5, Seed: 1}))
		}, func(i int) Batch { return randomPairs(rand.New(rand.NewPCG(uint64(i), 1)), 6, 7, 5) }},
		{"lstm", func() (*host, error) {
			return hostOf(NewLSTM(LSTMConfig{Vocab: 7, Embed: 4, Hidden: 4, Layers: 2, Tied: true, Dropout: 0.2, BPTT: 3, BatchSize: 2, Seed: 1}))
		}, func(i int) Batch { return randomTokens(rand.New(rand.NewPCG(uint64(i), 1)), 7, 6) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := tc.build()
			if err != nil {
				t.Fatal(err)
			}
			grad := make([]float32, a.NumParams())
			for i := range 3 {
				if _, err := a.TrainStep(ctx, tc.batch(i), grad); err != nil {
					t.Fatal(err)
				}
			}
			st, err := a.Model.(Stateful).SaveState()
			if err != nil {
				t.Fatal(err)
			}
			step := func(m *host) (float64, []float32) {
				g := make([]float32, m.NumParams())
				r, err := m.TrainStep(ctx, tc.batch(3), g)
				if err != nil {
					t.Fatal(err)
				}
				return r.Loss, g
			}
			fresh, _ := tc.build()
			lf, gf := step(fresh)
			b, _ := tc.build()
			if err := b.Model.(Stateful).LoadState(st); err != nil {
				t.Fatal(err)
			}
			la, ga := step(a)
			lb, gb := step(b)
			if math.Float64bits(la) != math.Float64bits(lb) || !slices.Equal(ga, gb) {
				t.Fatalf("restored model's step differs: loss %v vs %v", la, lb)
			}
			if la == lf && slices.Equal(ga, gf) {
				t.Fatal("a fresh model without the state takes the same step: the test cannot fail")
			}
			// Refused states change nothing.
			c, _ := tc.build()
			before, _ := c.Model.(Stateful).SaveState()
			for _, bad := range [][]byte{nil, st[:len(st)-1], append(slices.Clone(st), 1)} {
				if err := c.Model.(Stateful).LoadState(bad); err == nil {
					t.Fatalf("state of %d bytes accepted", len(bad))
				} else if !strings.Contains(err.Error(), "models:") {
					t.Fatalf("error without the package: %v", err)
				}
				if now, _ := c.Model.(Stateful).SaveState(); !slices.Equal(now, before) {
					t.Fatal("a refused state changed the model")
				}
			}
		})
	}
}
