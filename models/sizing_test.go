package models

import (
	"context"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/sparsegrad/sparsegrad/engine"
)

// TestSizingMatchesTheRealModel: a model built through engine.Sizing
// reports the training arena the real model allocates, and EvalBytes (on
// either) the arena of the evaluation program the real model compiles for
// that batch (plus the LSTM's carried state), for each model at awkward
// sizes.
func TestSizingMatchesTheRealModel(t *testing.T) {
	tinyRes := ResNetConfig{Classes: 10, Width: 4, Blocks: [4]int{1, 1, 1, 1}, ImageSize: 8, BatchSize: 3, Momentum: 0.1, Epsilon: 1e-5, Seed: 3}
	tinyL := LSTMConfig{Vocab: 37, Embed: 12, Hidden: 12, Layers: 2, Tied: true, Dropout: 0.25, BPTT: 5, BatchSize: 3, Seed: 5}
	tinyN := NCFConfig{Users: 20, Items: 30, Factors: 4, Layers: []int{8, 6, 4}, Dropout: 0.5, BatchSize: 16, Seed: 8}
	for _, tc := range []struct {
		name  string
		build func(be engine.Backend) (Model, error)
		eval  func(r *rand.Rand, m *host) Batch
		n     int // the evaluation batch's size EvalBytes takes
		state int // bytes of state EvalBytes adds to the arena
	}{
		{"resnet-tiny", func(be engine.Backend) (Model, error) { c := tinyRes; c.Backend = be; return NewResNet(c) }, resnetBatch(7), 7, 0},
		{"resnet18-b1", func(be engine.Backend) (Model, error) {
			c := DefaultResNet18(10, 1)
			c.Backend = be
			return NewResNet(c)
		}, resnetBatch(2), 2, 0},
		{"lstm-tiny", func(be engine.Backend) (Model, error) { c := tinyL; c.Backend = be; return NewLSTM(c) }, lstmBatch(5, 4), 4, 4 * 2 * 2 * 4 * 12},
		{"ncf-tiny", func(be engine.Backend) (Model, error) { c := tinyN; c.Backend = be; return NewNCF(c) }, ncfBatch(11), 11, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			real, err := hostOf(tc.build(nil))
			if err != nil {
				t.Fatal(err)
			}
			sized, err := tc.build(engine.Sizing(engine.CPU))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := sized.ArenaBytes(), real.ArenaBytes(); got != want || want <= 0 {
				t.Errorf("training arena through Sizing %d bytes, the real model's %d", got, want)
			}
			if _, err := real.Evaluate(context.Background(), tc.eval(rand.New(rand.NewPCG(1, 2)), real)); err != nil {
				t.Fatal(err)
			}
			var n *net
			switch m := real.Model.(type) {
			case *ResNet:
				n = &m.net
			case *LSTM:
				n = &m.net
			case *NCF:
				n = &m.net
			}
			// ResNet evaluates in chunks of at most its training batch: the
			// largest chunk's program is the one that counts.
			cached := len(n.evals.execs)
			if cached == 0 {
				t.Fatal("no evaluation program cached")
			}
			want := 0
			for _, e := range n.evals.execs {
				want = max(want, e.ArenaBytes()+tc.state)
			}
			type evalSizer interface{ EvalBytes(int) (int, error) }
			for what, m := range map[string]Model{"the real model": real.Model, "the sized model": sized} {
				got, err := m.(evalSizer).EvalBytes(tc.n)
				if err != nil || got != want {
					t.Errorf("EvalBytes(%d) of %s: %d, %v; the real evaluation's %d", tc.n, what, got, err, want)
				}
			}
			if len(n.evals.execs) != cached {
				t.Errorf("EvalBytes cached a program (%d now, %d before)", len(n.evals.execs), cached)
			}
		})
	}
}

// TestSizingAllocatesNothing: ResNet-18 at a batch whose activations need
// terabytes is sized (an arena above 1 TB) with a few megabytes of Go
// memory, and its program refuses to run.
func TestSizingAllocatesNothing(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := DefaultResNet18(10, 1_000_000)
	c.Backend = engine.Sizing(engine.CPU)
	m, err := NewResNet(c)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := m.EvalBytes(1_000_000)
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if m.ArenaBytes() < 1e12 || eb < 1e11 {
		t.Errorf("training arena %d bytes, evaluation %d at a batch of a million images: want terabytes", m.ArenaBytes(), eb)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 200<<20 {
		t.Errorf("sizing allocated %d MB", d>>20)
	}
	if _, err := m.train.Run(context.Background(), engine.Bindings{}, nil); err == nil {
		t.Error("a program loaded through Sizing ran")
	}
}
