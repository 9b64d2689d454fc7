package models

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
)

// TestPoolWorkersMatchOwnModels: K workers sharing a pool of P models take
// the steps K models of their own take (losses, gradients, BatchNorm
// statistics, dropout and hidden states, evaluations, saved states, bit for
// bit), for every model, while the pooled workers run concurrently and in
// varying order; the parameters are one vector both sides read.
func TestPoolWorkersMatchOwnModels(t *testing.T) {
	ctx := context.Background()
	type kind struct {
		name  string
		build func(seed uint64) (Model, error)
		batch func(r *rand.Rand) Batch
		eval  func(r *rand.Rand) Batch
	}
	kinds := []kind{
		{"resnet", func(seed uint64) (Model, error) { return NewResNet(tinyResNet(4, seed)) },
			func(r *rand.Rand) Batch { return randomImages(r, tinyResNet(4, 1), 4) },
			func(r *rand.Rand) Batch { return randomImages(r, tinyResNet(4, 1), 5) }},
		{"ncf", func(seed uint64) (Model, error) {
			return NewNCF(NCFConfig{Users: 6, Items: 7, Factors: 3, Layers: []int{8, 6, 4}, Dropout: 0.5, BatchSize: 5, Seed: seed})
		}, func(r *rand.Rand) Batch { return randomPairs(r, 6, 7, 5) },
			func(r *rand.Rand) Batch { return randomPairs(r, 6, 7, 3) }},
		{"lstm", func(seed uint64) (Model, error) {
			return NewLSTM(LSTMConfig{Vocab: 7, Embed: 4, Hidden: 4, Layers: 2, Tied: true, Dropout: 0.2, BPTT: 3, BatchSize: 2, Seed: seed})
		}, func(r *rand.Rand) Batch { return randomTokens(r, 7, 6) },
			func(r *rand.Rand) Batch { return randomTokens(r, 7, 9) }},
	}
	const K, steps = 3, 4
	for _, k := range kinds {
		for _, P := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/pool=%d", k.name, P), func(t *testing.T) {
				own := make([]Model, K)
				for i := range own {
					m, err := k.build(uint64(10 + i))
					if err != nil {
						t.Fatal(err)
					}
					own[i] = m
				}
				pool, err := NewPool(P, func() (Model, error) { return k.build(10) })
				if err != nil {
					t.Fatal(err)
				}
				shared := make([]Model, K)
				for i := range shared {
					if shared[i], err = pool.Worker(uint64(10 + i)); err != nil {
						t.Fatal(err)
					}
				}
				n := own[0].NumParams()
				for i := range K {
					a, b := make([]float32, n), make([]float32, n)
					own[i].InitParams(a)
					shared[i].InitParams(b)
					if !slices.Equal(a, b) {
						t.Fatalf("worker %d: InitParams differs from its own model's", i)
					}
				}
				params := make([]float32, n)
				own[0].InitParams(params)
				type out struct {
					loss float64
					grad []float32
					eval EvalResult
				}
				run := func(m Model, b Batch, e []Batch) out {
					o := out{grad: make([]float32, n)}
					r, err := m.TrainStep(ctx, b, device.Host(params), device.Host(o.grad))
					if err != nil {
						t.Error(err)
						return o
					}
					o.loss = r.Loss
					for _, eb := range e {
						er, err := m.Evaluate(ctx, eb, device.Host(params))
						if err != nil {
							t.Error(err)
						}
						o.eval.Add(er)
					}
					return o
				}
				rng := rand.New(rand.NewPCG(5, 6))
				for step := range steps {
					if step == 2 {
						for i := range K {
							own[i].ResetState()
							shared[i].ResetState()
						}
					}
					batches := make([]Batch, K)
					evals := make([][]Batch, K)
					for i := range K {
						batches[i] = k.batch(rng)
						evals[i] = []Batch{k.eval(rng), k.eval(rng)}
					}
					want := make([]out, K)
					for i := range K {
						want[i] = run(own[i], batches[i], evals[i])
					}
					got := make([]out, K)
					var wg sync.WaitGroup
					for _, i := range rng.Perm(K) {
						wg.Go(func() { got[i] = run(shared[i], batches[i], evals[i]) })
					}
					wg.Wait()
					for i := range K {
						w, g := want[i], got[i]
						if math.Float64bits(w.loss) != math.Float64bits(g.loss) || !slices.Equal(w.grad, g.grad) {
							t.Fatalf("step %d worker %d: loss %v, pooled %v (or the gradients differ)", step, i, w.loss, g.loss)
						}
						if w.eval.LossSum != g.eval.LossSum || w.eval.Correct != g.eval.Correct || !slices.Equal(w.eval.Scores, g.eval.Scores) {
							t.Fatalf("step %d worker %d: evaluation %+v, pooled %+v", step, i, w.eval, g.eval)
						}
						if nb := sumInfos(own[i].BufferLayout()); nb > 0 {
							a, b := make([]float32, nb), make([]float32, nb)
							own[i].StoreBuffers(a)
							shared[i].StoreBuffers(b)
							if !slices.Equal(a, b) {
								t.Fatalf("step %d worker %d: buffers differ", step, i)
							}
						}
						if s, ok := own[i].(Stateful); ok {
							a, _ := s.SaveState()
							b, err := shared[i].(Stateful).SaveState()
							if err != nil || !slices.Equal(a, b) {
								t.Fatalf("step %d worker %d: saved states differ (%v)", step, i, err)
							}
						}
					}
					if step == 0 && k.name != "resnet" && slices.Equal(want[0].grad, want[1].grad) {
						t.Fatal("workers of different seeds take the same step: the test cannot fail")
					}
					// The update every replica applies.
					for j := range params {
						var s float32
						for i := range K {
							s += want[i].grad[j]
						}
						params[j] -= 0.1 * s / K
					}
				}
				// A state loaded into a pooled worker continues it.
				if s, ok := own[0].(Stateful); ok {
					st, _ := s.SaveState()
					if err := shared[2].(Stateful).LoadState(st); err != nil {
						t.Fatal(err)
					}
					b := k.batch(rng)
					w, g := run(own[0], b, nil), run(shared[2], b, nil)
					if w.loss != g.loss || !slices.Equal(w.grad, g.grad) {
						t.Fatal("a loaded state does not continue the saved worker")
					}
				}
			})
		}
	}
}

// TestPoolRefusesForeignModels: only the package's models can be pooled,
// and a pool needs a model.
func TestPoolRefusesForeignModels(t *testing.T) {
	if _, err := NewPool(0, nil); err == nil {
		t.Fatal("a pool of 0 models accepted")
	}
	type foreign struct{ Model }
	if _, err := NewPool(1, func() (Model, error) { return foreign{}, nil }); err == nil {
		t.Fatal("a foreign model accepted")
	}
}

// TestPoolWaitHonoursContext: a worker waiting for a busy executor stops
// when its context ends, and says so.
func TestPoolWaitHonoursContext(t *testing.T) {
	pool, err := NewPool(1, func() (Model, error) { return NewResNet(tinyResNet(2, 1)) })
	if err != nil {
		t.Fatal(err)
	}
	w, err := pool.Worker(1)
	if err != nil {
		t.Fatal(err)
	}
	busy := <-pool.free // every executor busy
	defer func() { pool.free <- busy }()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p := make([]float32, w.NumParams())
	_, err = w.TrainStep(ctx, randomImages(rand.New(rand.NewPCG(1, 1)), tinyResNet(2, 1), 2), device.Host(p), device.Host(make([]float32, len(p))))
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want the context's", err)
	}
}
