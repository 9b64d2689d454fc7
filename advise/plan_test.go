package advise

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// measured is what each rank's counter saw in one call of a real reducer,
// with the reducer's own statistics of that call.
type measured struct {
	ops   []map[comm.Op]comm.OpStats
	stats []sparsify.Stats
}

// runReducer runs method on P in-process workers for calls iterations on
// gradient-like random data (normal, a different scale per tensor, a
// different draw per worker and call) and returns rank 0's counters of the
// last call, for every rank.
func runReducer(t *testing.T, method string, sizes []int, P int, density float64, params sparsify.Values, calls int) measured {
	t.Helper()
	l, err := layoutOf(sizes)
	if err != nil {
		t.Fatal(err)
	}
	return runReducerOn(t, method, l, P, density, params, calls)
}

// runReducerOn is runReducer on the layout l (its tensors' shapes
// included).
func runReducerOn(t *testing.T, method string, l layout.Layout, P int, density float64, params sparsify.Values, calls int) measured {
	t.Helper()
	sizes := l.Sizes()
	var err error
	res := measured{ops: make([]map[comm.Op]comm.OpStats, P), stats: make([]sparsify.Stats, P)}
	err = local.Run(context.Background(), P, func(ctx context.Context, c comm.Communicator) error {
		cnt := comm.NewCounter(c)
		red, err := sparsify.New(method, sparsify.Options{Density: density, Layout: l, Comm: cnt, Seed: 7, Params: params})
		if err != nil {
			return err
		}
		rng := rand.New(rand.NewPCG(uint64(c.Rank()), 99))
		acc := make([]float32, l.N)
		out := make([]float32, l.N)
		res0 := make([]float32, l.N)
		var st sparsify.Stats
		for i := range calls {
			off := 0
			for ti, sz := range sizes {
				scale := float32(ti+1) * 0.01
				for j := range sz {
					acc[off+j] = res0[off+j] + scale*float32(rng.NormFloat64())
				}
				off += sz
			}
			if i == calls-1 {
				cnt.Reset()
			}
			if method == "lags" {
				// As a pipelined run starts LAGS' groups (the plan's
				// case): each on its own, in order.
				for g := range red.Groups() {
					_ = red.Start(ctx, g, device.Host(acc), device.Host(out), device.Host(res0)) // Finish reports it
				}
				st, err = red.Finish(ctx)
			} else {
				st, err = red.Reduce(ctx, acc, out, res0)
			}
			if err != nil {
				return err
			}
		}
		r := c.Rank()
		res.stats[r] = st
		res.ops[r] = map[comm.Op]comm.OpStats{}
		for _, op := range comm.Ops() {
			if s := cnt.Stats(op); s.Calls > 0 {
				res.ops[r][op] = s
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s on %d workers: %v", method, P, err)
	}
	return res
}

// TestPlanMatchesReducers runs every method's real reducer in-process and
// compares each rank's communicator calls with Plan for that rank
// (Shape.Rank): the number of calls of each op exactly, the elements
// exactly, with the data-dependent sizes (Sel, Union) taken from the
// reducer's statistics. For topkdsa and oktopk, whose
// payloads differ between ranks (each owns a region), the elements are
// compared with the mean over the ranks, and Sel is the mean selection,
// within tol: the plan assumes the selection spreads evenly over the
// regions, so that each worker keeps 1/P of it in its own.
func TestPlanMatchesReducers(t *testing.T) {
	sizes := []int{1000, 37, 2500, 130, 7, 1}
	N := 0
	for _, s := range sizes {
		N += s
	}
	type tc struct {
		method string
		params sparsify.Values
		tol    float64 // > 0: compare the elements with the mean over ranks
	}
	cases := []tc{
		{"dense", nil, 0}, {"topk", nil, 0}, {"topka", nil, 0}, {"threshold", nil, 0},
		{"micro", nil, 0}, {"cltk", nil, 0}, {"randomk", nil, 0}, {"gtopk", nil, 0},
		{"deft", nil, 0}, {"dgc", nil, 0},
		{"dragonn", sparsify.Values{"dense_warmup": 0, "min_tensor": 200}, 0},
		{"dragonn", sparsify.Values{"dense_warmup": 0}, 0},
		{"lags", sparsify.Values{"merge_size": 500}, 0},
		{"spardl", nil, 0},
		{"topkdsa", sparsify.Values{"dense_warmup": 0}, 0.3},
		{"oktopk", sparsify.Values{"dense_warmup": 0}, 0.3},
	}
	for _, c := range cases {
		for _, P := range []int{1, 2, 3, 5, 16} {
			m, _ := sparsify.Lookup(c.method)
			params, err := m.Resolve(c.params)
			if err != nil {
				t.Fatal(err)
			}
			if m.CheckWorkers != nil && m.CheckWorkers(P, params) != nil {
				continue
			}
			for _, density := range []float64{0.05, 1e-6} { // k = 183 and k = 1
				name := fmt.Sprintf("%s/%v/P=%d/rho=%g", c.method, c.params, P, density)
				got := runReducer(t, c.method, sizes, P, density, c.params, 3)
				for r := range P {
					ops, sel := got.ops[r], float64(got.stats[r].Selected)
					if c.tol > 0 {
						if r > 0 {
							break
						}
						ops, sel = meanOps(got.ops), 0
						for _, st := range got.stats {
							sel += float64(st.Selected) / float64(P)
						}
					}
					s := Shape{Sizes: sizes, N: N, P: P, Rank: r, Density: density, K: sparsify.BudgetK(density, N),
						Sel: sel, Union: got.stats[0].ActualDensity * float64(N), Params: params}
					calls, err := Plan(c.method, s)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					for _, e := range compareCalls(calls, ops, c.tol) {
						t.Errorf("%s rank %d: %s", name, r, e)
					}
				}
			}
		}
	}
}

// TestPlanMatchesReducersShaped: on a layout whose tensors have shapes,
// the plans of the methods that treat a tensor by its shape (DGC's and
// EF-SignSGD's 1-D tensors all-reduced dense, PowerSGD's (shape[0], rest)
// matrices) are the real reducers' calls; Top-k, which ignores shapes, as
// a control.
func TestPlanMatchesReducersShaped(t *testing.T) {
	shapes := [][]int{{10, 100}, {37}, {50, 50}, {13, 10}, {7}, {1}, {4, 2, 3}}
	var ts []layout.Tensor
	for i, sh := range shapes {
		n := 1
		for _, d := range sh {
			n *= d
		}
		ts = append(ts, layout.Tensor{Name: fmt.Sprint("t", i), Shape: sh, Size: n})
	}
	l, err := layout.Of(ts)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method string
		params sparsify.Values
	}{{"dgc", nil}, {"efsignsgd", nil}, {"powersgd", nil}, {"powersgd", sparsify.Values{"rank": 4}}, {"topk", nil}} {
		m, _ := sparsify.Lookup(c.method)
		params, err := m.Resolve(c.params)
		if err != nil {
			t.Fatal(err)
		}
		for _, P := range []int{1, 2, 3, 5, 16} {
			for _, density := range []float64{0.05, 1e-6} {
				name := fmt.Sprintf("%s/%v/P=%d/rho=%g", c.method, c.params, P, density)
				got := runReducerOn(t, c.method, l, P, density, params, 3)
				st := got.stats[0]
				s := Shape{Sizes: l.Sizes(), Tensors: l.Tensors, N: l.N, P: P, Density: density, K: sparsify.BudgetK(density, l.N),
					Sel: float64(st.Selected), Union: st.ActualDensity * float64(l.N), Params: params}
				calls, err := Plan(c.method, s)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				for _, e := range compareCalls(calls, got.ops[0], 0) {
					t.Errorf("%s: %s", name, e)
				}
			}
		}
	}
}

// meanOps averages the ranks' counters (calls as rank 0's).
func meanOps(all []map[comm.Op]comm.OpStats) map[comm.Op]comm.OpStats {
	out := map[comm.Op]comm.OpStats{}
	for op, s := range all[0] {
		var e float64
		for _, m := range all {
			e += float64(m[op].Elements)
		}
		s.Elements = int64(math.Round(e / float64(len(all))))
		out[op] = s
	}
	return out
}

// compareCalls lists the differences between a plan and measured counters.
func compareCalls(plan []Call, got map[comm.Op]comm.OpStats, tol float64) []string {
	var errs []string
	want := map[comm.Op][2]float64{}
	for _, c := range plan {
		w := want[c.Op]
		w[0] += math.Floor(c.Count) // calls made every few iterations are not in this one
		w[1] += math.Floor(c.Count) * c.Elems
		want[c.Op] = w
	}
	var ops []comm.Op
	for op := range want {
		ops = append(ops, op)
	}
	for op := range got {
		if _, ok := want[op]; !ok {
			ops = append(ops, op)
		}
	}
	slices.Sort(ops)
	for _, op := range ops {
		w, g := want[op], got[op]
		if w[0] == 0 && g.Calls == 0 {
			continue
		}
		if float64(g.Calls) != w[0] {
			errs = append(errs, fmt.Sprintf("%v: %d calls, plan says %g", op, g.Calls, w[0]))
			continue
		}
		diff := math.Abs(float64(g.Elements) - w[1])
		if diff > tol*max(float64(g.Elements), w[1])+0.5 {
			errs = append(errs, fmt.Sprintf("%v: %d elements, plan says %.1f", op, g.Elements, w[1]))
		}
	}
	return errs
}

// TestPlanDetectsWrongTraffic makes sure the comparison can fail: a plan
// with one call too few, a payload off by one element or an extra op is
// reported.
func TestPlanDetectsWrongTraffic(t *testing.T) {
	got := map[comm.Op]comm.OpStats{comm.OpAllReduce: {Calls: 1, Elements: 100}}
	for _, plan := range [][]Call{
		{{Op: comm.OpAllReduce, Count: 1, Elems: 102}},
		{{Op: comm.OpAllReduce, Count: 2, Elems: 50}},
		{{Op: comm.OpAllReduce, Count: 1, Elems: 100}, {Op: comm.OpBroadcast, Count: 1, Elems: 3}},
	} {
		if e := compareCalls(plan, got, 0); len(e) == 0 {
			t.Errorf("plan %v passed against %v", plan, got)
		}
	}
	if e := compareCalls([]Call{{Op: comm.OpAllReduce, Count: 1, Elems: 100}}, got, 0); len(e) > 0 {
		t.Errorf("the right plan failed: %v", e)
	}
}

// TestBytesMatchesCounters checks PlanBytes, a worker's traffic per
// iteration, against what a replay measures: the reducers' own
// Stats.BytesSent, averaged over the ranks, at worker counts 1, 2, 3, 4, 5,
// 8 and 16 where the method runs; exact for the methods whose payloads are
// fixed by k and N (gTop-k's tree included: its ranks other than 0 send
// their candidates, rank 0 receives), with the mean selection for DEFT,
// whose workers select different counts.
func TestBytesMatchesCounters(t *testing.T) {
	sizes := []int{1000, 37, 2500, 130, 7, 1}
	N := 3675
	for _, method := range []string{"dense", "topka", "cltk", "randomk", "spardl", "topk", "deft", "gtopk"} {
		for _, P := range []int{1, 2, 3, 4, 5, 8, 16} {
			m, _ := sparsify.Lookup(method)
			params, _ := m.Resolve(nil)
			if m.CheckWorkers != nil && m.CheckWorkers(P, params) != nil {
				continue
			}
			got := runReducer(t, method, sizes, P, 0.05, nil, 2)
			var sentSum, countedSum int64
			var sel float64
			for r := range P {
				sentSum += got.stats[r].BytesSent
				for _, s := range got.ops[r] {
					countedSum += s.BytesSent
				}
				sel += float64(got.stats[r].Selected) / float64(P)
			}
			sent, counted := float64(sentSum)/float64(P), float64(countedSum)/float64(P)
			if sentSum != countedSum {
				t.Errorf("%s P=%d: the reducers' Stats.BytesSent %v, their counters %v", method, P, sent, counted)
			}
			b, err := PlanBytes(method, Shape{Sizes: sizes, N: N, P: P, Density: 0.05, K: sparsify.BudgetK(0.05, N),
				Sel: sel, Union: got.stats[0].ActualDensity * float64(N), Params: params}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(b-sent) > 4*float64(P) { // the plan rounds the mean contribution to whole elements
				t.Errorf("%s P=%d: PlanBytes %v, the reducers sent %v on average", method, P, b, sent)
			}
		}
	}
}

// layoutOf is a layout of sizes, its tensors named t0, t1, ...
func layoutOf(sizes []int) (layout.Layout, error) {
	names := make([]string, len(sizes))
	for i := range names {
		names[i] = fmt.Sprint("t", i)
	}
	return layout.New(names, sizes)
}
