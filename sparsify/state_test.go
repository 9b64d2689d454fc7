package sparsify

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
)

// stateCase is one method setting of the resume tests.
type stateCase struct {
	method  string
	workers int
	params  Values
	network netmodel.Network
	// backward, when set, is given to LAGS after the first call (as the
	// trainer does with measured times).
	backward []time.Duration
	// momentum is Options.Momentum (dgc's momentum correction); perEpoch,
	// when set, the calls per epoch of an EpochScheduled method.
	momentum float64
	perEpoch int
}

func (c stateCase) String() string {
	return fmt.Sprintf("%s/n=%d/%v", c.method, c.workers, c.params)
}

// stateCases covers every registered method, with warm-ups short enough
// to be crossed, and the methods' adaptive modes.
func stateCases(t *testing.T, layout Layout) []stateCase {
	var cs []stateCase
	workers := []int{1, 2, 3, 4, 5}
	if testing.Short() {
		workers = []int{2, 3}
	}
	for _, name := range Names() {
		m, _ := Lookup(name)
		p := Values{}
		if _, ok := m.Param("dense_warmup"); ok {
			p["dense_warmup"] = 3
		}
		if name == "dragonn" {
			p["min_tensor"] = 0
		}
		for _, n := range workers {
			if m.CheckWorkers != nil {
				r, _ := m.Resolve(p)
				if m.CheckWorkers(n, r) != nil {
					continue
				}
			}
			cs = append(cs, stateCase{method: name, workers: n, params: p})
		}
	}
	back := make([]time.Duration, len(layout.Tensors))
	for i := range back {
		back[i] = time.Duration(20+7*i) * time.Microsecond
	}
	cs = append(cs,
		stateCase{method: "spardl", workers: 4, params: Values{"teams": 2}},
		stateCase{method: "spardl", workers: 4, params: Values{"teams": 2, "sag": "rsag"}},
		stateCase{method: "lags", workers: 3, params: Values{"max_ratio": 20.0, "merge_size": 40},
			network: netmodel.Network{Latency: time.Microsecond, Bandwidth: 1e9}, backward: back},
		// dgc with momentum correction (its velocity) and a density
		// warm-up of two 3-call epochs.
		stateCase{method: "dgc", workers: 3, params: Values{"sparsity_warmup": 2}, momentum: 0.9, perEpoch: 3},
	)
	return cs
}

// runResumed runs c for iters calls per rank with error feedback. With
// split >= 0 every rank replaces its reducer after split calls by a fresh
// one built with the same options, given the old one's state when restore
// is set. It returns every rank's out, residual and threshold per call.
func runResumed(t *testing.T, c stateCase, layout Layout, iters, split int, restore bool) (outs [][][]float32, thr [][]float64, err error) {
	outs = make([][][]float32, c.workers)
	thr = make([][]float64, c.workers)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = local.Run(ctx, c.workers, func(ctx context.Context, cm comm.Communicator) error {
		rank := cm.Rank()
		o := Options{Density: 0.05, Layout: layout, Comm: cm, Seed: 11, Params: c.params, Network: c.network, Momentum: c.momentum}
		build := func() (*Reducer, error) {
			r, err := New(c.method, o)
			if err == nil && c.perEpoch > 0 {
				r.SetStepsPerEpoch(c.perEpoch)
			}
			return r, err
		}
		red, err := build()
		if err != nil {
			return err
		}
		rng := rand.New(rand.NewPCG(uint64(rank), 99))
		residual := make([]float32, layout.N)
		out := make([]float32, layout.N)
		for it := range iters {
			if it == split {
				st, err := red.State()
				if err != nil {
					return err
				}
				fresh, err := build()
				if err != nil {
					return err
				}
				if restore {
					if err := fresh.SetState(st); err != nil {
						return err
					}
				}
				red = fresh
			}
			for i := range residual {
				residual[i] += float32(rng.NormFloat64())
			}
			st, err := red.Reduce(ctx, residual, out, residual)
			if err != nil {
				return fmt.Errorf("call %d: %w", it, err)
			}
			outs[rank] = append(outs[rank], slices.Concat(out, residual))
			thr[rank] = append(thr[rank], st.Threshold)
			if it == 0 && c.backward != nil && split != 0 {
				if err := red.core.(*LAGS).SetBackwardTimes(c.backward); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return outs, thr, err
}

func sameRun(a, b [][][]float32, ta, tb [][]float64) (string, bool) {
	for r := range a {
		for it := range a[r] {
			for i := range a[r][it] {
				if math.Float32bits(a[r][it][i]) != math.Float32bits(b[r][it][i]) {
					return fmt.Sprintf("rank %d call %d element %d: %v vs %v", r, it, i, a[r][it][i], b[r][it][i]), false
				}
			}
			if math.Float64bits(ta[r][it]) != math.Float64bits(tb[r][it]) {
				return fmt.Sprintf("rank %d call %d threshold: %v vs %v", r, it, ta[r][it], tb[r][it]), false
			}
		}
	}
	return "", true
}

// TestResumeStateIsExact: for every method, worker count and split point,
// replacing the reducers after some calls by fresh ones given the old ones'
// state continues bit for bit as the uninterrupted reducers do (outputs,
// residuals, thresholds); and for every method that keeps state, replacing
// them without it changes the result (the state matters, so the test can
// fail).
func TestResumeStateIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	layout, err := randomLayout(rng, 12007)
	if err != nil {
		t.Fatal(err)
	}
	const iters = 75 // past oktopk's re-partition (64) and recompute (32) periods after the warm-up
	splits := []int{1, 3, 4, 37, 70}
	if testing.Short() {
		splits = []int{4, 70}
	}
	matters := map[string]bool{}
	for _, c := range stateCases(t, layout) {
		straight, ts, err := runResumed(t, c, layout, iters, -1, false)
		if err != nil {
			t.Fatalf("%v: %v", c, err)
		}
		for _, s := range splits {
			got, tg, err := runResumed(t, c, layout, iters, s, true)
			if err != nil {
				t.Fatalf("%v split %d: %v", c, s, err)
			}
			if msg, ok := sameRun(straight, got, ts, tg); !ok {
				t.Errorf("%v resumed after %d calls differs from the straight run: %s", c, s, msg)
			}
			fresh, tf, err := runResumed(t, c, layout, iters, s, false)
			if err == nil {
				if _, ok := sameRun(straight, fresh, ts, tf); !ok {
					matters[c.method] = true
				}
			}
		}
	}
	for _, name := range Names() {
		r, err := New(name, Options{Density: 0.05, Layout: layout, Comm: local.New(1).Comm(0), Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, stateful := r.core.(Stateful)
		if stateful && !matters[name] {
			t.Errorf("%s keeps a state, but no case showed that it matters", name)
		}
		if !stateful && matters[name] {
			t.Errorf("%s keeps no state, yet a fresh reducer continues differently: it has state SaveState misses", name)
		}
	}
}

// TestSetStateRefusesBadStates: states of another method, truncated,
// extended or with impossible values are refused, and leave the reducer as
// it was.
func TestSetStateRefusesBadStates(t *testing.T) {
	layout, _ := FlatLayout(100)
	cm := local.New(1).Comm(0)
	mk := func(name string) *Reducer {
		r, err := New(name, Options{Density: 0.1, Layout: layout, Comm: cm, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	micro := mk("micro")
	out := make([]float32, 100)
	acc := make([]float32, 100)
	for i := range acc {
		acc[i] = float32(i%7) - 3
	}
	if _, err := micro.Reduce(context.Background(), acc, out, acc); err != nil {
		t.Fatal(err)
	}
	good := mustSaveState(t, micro)
	for _, tc := range []struct {
		name  string
		state []byte
		want  string
	}{
		{"empty", nil, "empty state"},
		{"other method", mustSaveState(t, mk("deft")), `of method "deft"`},
		{"truncated", good[:len(good)-3], "truncated"},
		{"extended", append(slices.Clone(good), 0), "left over"},
		{"version", func() []byte { b := slices.Clone(good); b[1+len("micro")] = 9; return b }(), "format 9"},
		{"NaN threshold", func() []byte {
			b := slices.Clone(good)
			off := 2 + len("micro") + 8
			copy(b[off:], []byte{0, 0, 0, 0, 0, 0, 0xf8, 0x7f})
			return b
		}(), "threshold is NaN"},
	} {
		m := mk("micro")
		if err := m.SetState(good); err != nil {
			t.Fatal(err)
		}
		err := m.SetState(tc.state)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
		if !slices.Equal(mustSaveState(t, m), good) {
			t.Errorf("%s: a refused state changed the reducer", tc.name)
		}
	}
	if err := mk("topk").SetState(good); err == nil || !strings.Contains(err.Error(), "keeps no state") {
		t.Errorf("a state for a stateless reducer: %v", err)
	}
	if mustSaveState(t, mk("topk")) != nil {
		t.Error("topk returned a state")
	}
}

// FuzzSetState: any bytes given to a reducer's SetState are either a
// valid state, which State returns unchanged, or refused.
func FuzzSetState(f *testing.F) {
	layout, _ := FlatLayout(64)
	cm := local.New(1).Comm(0)
	names := []string{}
	for _, n := range Names() {
		r, err := New(n, Options{Density: 0.1, Layout: layout, Comm: cm, Seed: 1})
		if err == nil {
			if _, ok := r.core.(Stateful); ok {
				names = append(names, n)
				f.Add(uint8(len(names)-1), mustSaveState(f, r))
			}
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		r, err := New(names[int(which)%len(names)], Options{Density: 0.1, Layout: layout, Comm: cm, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		before := mustSaveState(t, r)
		if err := r.SetState(b); err != nil {
			if !slices.Equal(mustSaveState(t, r), before) {
				t.Fatal("a refused state changed the reducer")
			}
			return
		}
		if got := mustSaveState(t, r); !slices.Equal(got, b) {
			t.Fatalf("state %x read back as %x", b, got)
		}
	})
}

// mustSaveState is r.State, failing t on an error.
func mustSaveState(t testing.TB, r *Reducer) []byte {
	t.Helper()
	b, err := r.State()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
