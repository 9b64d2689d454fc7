package sparsify

import (
	"context"
	"errors"
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
	"github.com/sparsegrad/sparsegrad/device"
)

// lagsRefGroups forms merge groups the obvious way: tensors from last to
// first, a group closes once its element count reaches merge.
func lagsRefGroups(l Layout, merge int) [][]int {
	var groups [][]int
	var cur []int
	count := 0
	for t := len(l.Tensors) - 1; t >= 0; t-- {
		cur = append(cur, t)
		count += l.Tensors[t].Size
		if count >= merge {
			groups = append(groups, cur)
			cur, count = nil, 0
		}
	}
	if cur != nil {
		groups = append(groups, cur)
	}
	return groups
}

// lagsRefResult is what the reference computes for one iteration.
type lagsRefResult struct {
	out      []float32
	res      [][]float32
	distinct int
	layerKW  [][]int // per worker, selections per tensor
}

// lagsRef is LAGS in one process: per group (tensor list) with per-worker k
// ks[g], top-k of each worker's acc over the group, residual = acc with the
// selection zeroed, out = Σ_w (scatter of worker w's values)/n; a group
// with k = m (kept dense) is summed in the all-reduce's canonical order.
func lagsRef(accs [][]float32, l Layout, groups [][]int, ks []int) lagsRefResult {
	n, N := len(accs), l.N
	r := lagsRefResult{out: make([]float32, N), res: make([][]float32, n), layerKW: make([][]int, n)}
	for w := range accs {
		r.res[w] = slices.Clone(accs[w])
		r.layerKW[w] = make([]int, len(l.Tensors))
	}
	touched := make([]bool, N)
	for g, ts := range groups {
		lo, hi := N, 0
		for _, t := range ts {
			lo = min(lo, l.Tensors[t].Offset)
			hi = max(hi, l.Tensors[t].Offset+l.Tensors[t].Size)
		}
		if ks[g] == hi-lo {
			// A group kept dense: the canonical all-reduce of its acc.
			part := make([][]float32, n)
			for w := range accs {
				part[w] = accs[w][lo:hi]
				clear(r.res[w][lo:hi])
				for _, t := range ts {
					r.layerKW[w][t] += l.Tensors[t].Size
				}
			}
			copy(r.out[lo:hi], sampRefCanonicalSum(part))
			for p := lo; p < hi; p++ {
				touched[p] = true
			}
			continue
		}
		for w := range accs {
			for _, j := range refTopK(accs[w][lo:hi], ks[g]) {
				p := lo + int(j)
				r.out[p] += accs[w][p]
				r.res[w][p] = 0
				touched[p] = true
				for t := range l.Tensors {
					if p >= l.Tensors[t].Offset && p < l.Tensors[t].Offset+l.Tensors[t].Size {
						r.layerKW[w][t]++
					}
				}
			}
		}
	}
	for i := range r.out {
		r.out[i] /= float32(n)
		if touched[i] {
			r.distinct++
		}
	}
	return r
}

// lagsUniformK is the non-adaptive k of every group.
func lagsUniformK(l Layout, groups [][]int, density float64) []int {
	ks := make([]int, len(groups))
	for g, ts := range groups {
		m := 0
		for _, t := range ts {
			m += l.Tensors[t].Size
		}
		ks[g] = min(max(int(float64(m)*density), 1), m)
	}
	return ks
}

// lagsCheck compares a harness run with the reference, iteration by
// iteration.
func lagsCheck(t *testing.T, res *harnessResult, merge int, ks func(groups [][]int) []int) {
	t.Helper()
	l := res.Layout
	n := res.Cfg.Workers
	groups := lagsRefGroups(l, merge)
	kk := ks(groups)
	totalK := 0
	for _, k := range kk {
		totalK += k
	}
	// A group sent sparse is two all-gathers of k float32/int32; a group
	// kept dense (k = m) one all-reduce of its m float32.
	bytesOf := func(w int) (sent, recv int64) {
		for g, k := range kk {
			if m := lagsRefSize(l, groups[g]); k == m {
				s, r := comm.Traffic(comm.OpAllReduce, n, w, m, 4, 0, nil)
				sent, recv = sent+s, recv+r
				continue
			}
			sent += 2 * int64(n-1) * int64(k) * 4
			recv += 2 * int64(n-1) * int64(k) * 4
		}
		return sent, recv
	}
	for it := range res.Acc {
		ref := lagsRef(res.Acc[it], l, groups, kk)
		for w := range n {
			sent, recv := bytesOf(w)
			what := fmt.Sprintf("n=%d N=%d merge=%d it=%d rank %d", n, l.N, merge, it, w)
			checkClose(t, what+" out", res.Out[it][w], ref.out, nil)
			checkClose(t, what+" residual", res.Residual[it][w], ref.res[w], nil)
			st := res.Stats[it][w]
			if st.Selected != totalK {
				t.Fatalf("%s: Selected %d, want %d", what, st.Selected, totalK)
			}
			if want := float64(ref.distinct) / float64(l.N); st.ActualDensity != want {
				t.Fatalf("%s: ActualDensity %v, want %v", what, st.ActualDensity, want)
			}
			if !slices.Equal(st.LayerK, ref.layerKW[w]) {
				t.Fatalf("%s: LayerK %v, want %v", what, st.LayerK, ref.layerKW[w])
			}
			if want := norm2(ref.res[w]); math.Abs(st.ErrorNorm-want) > 1e-9*(1+want) {
				t.Fatalf("%s: ErrorNorm %v, want %v", what, st.ErrorNorm, want)
			}
			if !math.IsNaN(st.Threshold) {
				t.Fatalf("%s: Threshold %v, want NaN", what, st.Threshold)
			}
			if st.BytesSent != sent || st.BytesRecv != recv {
				t.Fatalf("%s: bytes sent/recv %d/%d, want %d/%d", what, st.BytesSent, st.BytesRecv, sent, recv)
			}
			if st.Density != res.Cfg.Density {
				t.Fatalf("%s: Density %v, want %v", what, st.Density, res.Cfg.Density)
			}
		}
	}
}

// lagsRefSize is the number of elements of the group of tensors ts.
func lagsRefSize(l Layout, ts []int) int {
	m := 0
	for _, t := range ts {
		m += l.Tensors[t].Size
	}
	return m
}

// TestLAGSDenseGroupsAllReduce: in the regime where LAGS keeps groups dense
// (k = m: density 1, or groups of one element), it sends them by one
// all-reduce, as the authors' cost model assumes, not as n·m index/value
// pairs; the result is the reference's, the bytes the all-reduce's, and
// groups sent sparse beside them are unchanged.
func TestLAGSDenseGroupsAllReduce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 3, 5, 16} {
		for _, c := range []struct {
			N       int
			density float64
			merge   int
		}{{97, 1, 5}, {1001, 1, 0}, {40, 0.3, 1}, {3, 0.5, 1}} {
			layout, err := randomLayout(rng, c.N)
			if err != nil {
				t.Fatal(err)
			}
			eff := c.merge
			if eff == 0 {
				eff = LAGSDefaultMergeSize
			}
			ks := lagsUniformK(layout, lagsRefGroups(layout, eff), c.density)
			dense := 0
			for g, ts := range lagsRefGroups(layout, eff) {
				if ks[g] == lagsRefSize(layout, ts) {
					dense++
				}
			}
			if dense == 0 {
				continue // no group is kept dense in this layout
			}
			cfg := harnessConfig{Method: "lags", Workers: n, Layout: layout, Density: c.density, Iters: 2, Seed: uint64(n*100 + c.N), Feedback: true,
				Options: func(o *Options) { o.Params = lagsMerge(c.merge) }}
			t.Run(fmt.Sprintf("n=%d/N=%d/density=%g/merge=%d", n, c.N, c.density, c.merge), func(t *testing.T) {
				res := mustRunHarness(t, cfg)
				lagsCheck(t, res, eff, func(g [][]int) []int { return lagsUniformK(layout, g, c.density) })
				checkOutputsAgree(t, res)
				checkConservation(t, res)
			})
		}
	}
}

// lagsMerge is the option merge_size, absent (the default) for 0.
func lagsMerge(merge int) Values {
	if merge == 0 {
		return nil
	}
	return Values{"merge_size": merge}
}

func TestLAGSMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for ci, c := range standardCases() {
		for _, merge := range []int{0, 1, 5, 50} {
			layout, err := randomLayout(rng, c.N)
			if err != nil {
				t.Fatal(err)
			}
			effMerge := merge
			if merge == 0 {
				effMerge = LAGSDefaultMergeSize
			}
			cfg := harnessConfig{
				Method: "lags", Workers: c.Workers, Layout: layout, Density: c.Density,
				Iters: 2, Seed: uint64(ci*10 + merge), Feedback: true, InPlace: ci%2 == 0,
				Options: func(o *Options) { o.Params = lagsMerge(merge) },
			}
			if ci%3 == 1 {
				cfg.Gen = genSmallInts // many magnitude ties
			}
			t.Run(fmt.Sprintf("%v/merge=%d", c, merge), func(t *testing.T) {
				res := mustRunHarness(t, cfg)
				lagsCheck(t, res, effMerge, func(g [][]int) []int { return lagsUniformK(layout, g, c.Density) })
				checkOutputsAgree(t, res)
				checkConservation(t, res)
			})
		}
	}
}

func TestLAGSGroupsFormation(t *testing.T) {
	l, err := NewLayout([]string{"a", "b", "c", "d", "e"}, []int{3, 5, 2, 7, 1})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		merge int
		want  [][]int
	}{
		{0, [][]int{{4}, {3}, {2}, {1}, {0}}},
		{1, [][]int{{4}, {3}, {2}, {1}, {0}}},
		{2, [][]int{{4, 3}, {2}, {1}, {0}}},
		{6, [][]int{{4, 3}, {2, 1}, {0}}},
		{8, [][]int{{4, 3}, {2, 1, 0}}},
		{9, [][]int{{4, 3, 2}, {1, 0}}},
		{18, [][]int{{4, 3, 2, 1, 0}}},
		{1000, [][]int{{4, 3, 2, 1, 0}}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.merge), func(t *testing.T) {
			gs := LAGSGroups(l, tc.merge)
			var got [][]int
			for _, g := range gs {
				got = append(got, g.Tensors)
				lo := l.Tensors[g.Tensors[len(g.Tensors)-1]].Offset
				hi := l.Tensors[g.Tensors[0]].Offset + l.Tensors[g.Tensors[0]].Size
				if g.Lo != lo || g.Hi != hi || g.Size() != hi-lo {
					t.Fatalf("group %v: range [%d, %d), want [%d, %d)", g.Tensors, g.Lo, g.Hi, lo, hi)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("groups %v, want %v", got, tc.want)
			}
		})
	}
	// Random layouts against the plain rule.
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		l, err := randomLayout(rng, 1+rng.IntN(300))
		if err != nil {
			t.Fatal(err)
		}
		merge := rng.IntN(120)
		var got [][]int
		prevLo := l.N
		for _, g := range LAGSGroups(l, merge) {
			got = append(got, g.Tensors)
			if g.Hi != prevLo {
				t.Fatalf("case %d: groups not contiguous in backward order", i)
			}
			prevLo = g.Lo
		}
		if prevLo != 0 {
			t.Fatalf("case %d: groups do not cover the layout", i)
		}
		if want := lagsRefGroups(l, merge); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("case %d merge %d: groups %v, want %v", i, merge, got, want)
		}
	}
}

// testLAGS is a LAGS reducer: its core, whose methods it has, and the
// frame, whose Reduce it has.
type testLAGS struct {
	*LAGS
	r *Reducer
}

// Reduce is the frame's.
func (l testLAGS) Reduce(ctx context.Context, acc, out, residual []float32) (Stats, error) {
	return l.r.Reduce(ctx, acc, out, residual)
}

// newTestLAGS builds the "lags" reducer.
func newTestLAGS(o Options) (testLAGS, error) {
	r, err := New("lags", o)
	if err != nil {
		return testLAGS{}, err
	}
	return testLAGS{r.core.(*LAGS), r}, nil
}

// lagsRunWorld runs fn on n in-process workers, each with its own LAGS.
func lagsRunWorld(t *testing.T, n int, o Options, fn func(ctx context.Context, rank int, l testLAGS) error, opts ...local.Option) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := local.Run(ctx, n, func(ctx context.Context, c comm.Communicator) error {
		oo := o
		oo.Comm = c
		l, err := newTestLAGS(oo)
		if err != nil {
			return err
		}
		return fn(ctx, c.Rank(), l)
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
}

func lagsRandom(seed uint64, rank, N int) []float32 {
	x := make([]float32, N)
	genNormal(rand.New(rand.NewPCG(seed, uint64(rank))), x)
	return x
}

func TestLAGSStartGroupInFlight(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 16} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			l, err := NewLayout([]string{"a", "b", "c", "d", "e", "f"}, []int{1, 40, 7, 300, 2, 61})
			if err != nil {
				t.Fatal(err)
			}
			o := Options{Density: 0.05, Layout: l, Params: Values{"merge_size": 1}}
			lagsRunWorld(t, n, o, func(ctx context.Context, rank int, r testLAGS) error {
				acc := lagsRandom(11, rank, l.N)
				out1, res1 := make([]float32, l.N), make([]float32, l.N)
				st1, err := r.Reduce(ctx, acc, out1, res1)
				if err != nil {
					return err
				}
				gs := r.Groups()
				if len(gs) != 6 {
					return fmt.Errorf("%d groups, want 6", len(gs))
				}
				// All groups in flight (started in reverse order, the same
				// on every rank), then finished.
				h := device.Host[float32]
				out2, res2 := make([]float32, l.N), make([]float32, l.N)
				for g := len(gs) - 1; g >= 0; g-- {
					if err := r.r.Start(ctx, g, h(acc), h(out2), h(res2)); err != nil {
						return err
					}
				}
				st2, err := r.r.Finish(ctx)
				if err != nil {
					return err
				}
				// A group started twice fails the call, which leaves no
				// group in flight; the next call is whole again.
				scratch, scratchRes := make([]float32, l.N), make([]float32, l.N)
				for g := range gs {
					if err := r.r.Start(ctx, g, h(acc), h(scratch), h(scratchRes)); err != nil {
						return err
					}
				}
				if err := r.r.Start(ctx, 0, h(acc), h(scratch), h(scratchRes)); err == nil {
					return errors.New("starting a group twice succeeded")
				}
				if _, err := r.r.Finish(ctx); err == nil || !strings.Contains(err.Error(), "started twice") {
					return fmt.Errorf("the call with a group started twice finished with %v", err)
				}
				// So does a set that holds a group twice, or one already
				// started.
				for _, sets := range [][][]int{{{1, 2, 1}}, {{0}, {2, 0}}} {
					var err error
					for _, gs := range sets {
						if err = r.r.StartGroups(ctx, gs, h(acc), h(scratch), h(scratchRes)); err != nil {
							break
						}
					}
					if err == nil {
						return fmt.Errorf("starting the sets %v succeeded", sets)
					}
					if _, err := r.r.Finish(ctx); err == nil || !strings.Contains(err.Error(), "started twice") {
						return fmt.Errorf("the call with the sets %v finished with %v", sets, err)
					}
				}
				// In place, interleaved: 2..5, then 0, 1.
				out3, res3 := make([]float32, l.N), make([]float32, l.N)
				acc3 := slices.Clone(acc) // in place: residual aliases acc
				for _, g := range []int{2, 3, 4, 5, 0, 1} {
					if err := r.r.Start(ctx, g, h(acc3), h(out3), h(acc3)); err != nil {
						return err
					}
				}
				st3, err := r.r.Finish(ctx)
				if err != nil {
					return err
				}
				copy(res3, acc3)
				// Sets started at once (StartGroups), as a trainer hands over
				// the groups one tensor completes: adjacent sparse groups (3
				// and 4) with a group kept dense (5: one element), groups not
				// adjacent (0 and 2).
				out4, res4 := make([]float32, l.N), make([]float32, l.N)
				for _, gs := range [][]int{{3, 4, 5}, {0, 2}, {1}} {
					if err := r.r.StartGroups(ctx, gs, h(acc), h(out4), h(res4)); err != nil {
						return err
					}
				}
				st4, err := r.r.Finish(ctx)
				if err != nil {
					return err
				}
				for _, v := range [][2][]float32{{out2, out1}, {res2, res1}, {out3, out1}, {res3, res1}, {out4, out1}, {res4, res1}} {
					for i := range v[0] {
						if math.Float32bits(v[0][i]) != math.Float32bits(v[1][i]) {
							return fmt.Errorf("rank %d: pipelined result differs from Reduce at %d: %v vs %v", rank, i, v[0][i], v[1][i])
						}
					}
				}
				for _, st := range []Stats{st2, st3, st4} {
					if st.Selected != st1.Selected || st.ActualDensity != st1.ActualDensity || !slices.Equal(st.LayerK, st1.LayerK) ||
						st.BytesSent != st1.BytesSent || st.BytesRecv != st1.BytesRecv || st.ErrorNorm != st1.ErrorNorm {
						return fmt.Errorf("rank %d: the pipelined call's stats %+v differ from Reduce's %+v", rank, st, st1)
					}
				}
				return nil
			})
		})
	}
}

func TestLAGSGroupK(t *testing.T) {
	m := LAGSModel{Alpha: 1e-3, Beta: 1e-9}
	// n = 4: fixed 6 ms, 24 ns per k. A group of 100000 elements; c_u = 100
	// bounds the compression: k >= 1000.
	tests := []struct {
		name    string
		n       int
		model   LAGSModel
		tComp   float64
		times   bool
		ratio   float64
		density float64
		want    int
	}{
		{"fixed density", 4, m, 10, true, 0, 0.001, 100},
		{"no times yet: the density", 4, m, 10, false, 100, 0.01, 1000},
		{"much time: dense", 4, m, 10, true, 100, 0.01, 100000},
		{"no time: the most compression c_u allows", 4, m, 0, true, 100, 0.01, 1000},
		{"latency alone does not hide", 4, m, 5e-3, true, 100, 0.01, 1000},
		{"between", 4, m, 6e-3 + 24e-9*5000.4, true, 100, 0.01, 5000},
		{"would compress more than c_u", 4, m, 6e-3 + 24e-9*500, true, 100, 0.01, 1000},
		{"sparsification cost counts", 4, LAGSModel{Alpha: 1e-3, Beta: 1e-9, SparPerElement: 1e-8}, 6e-3 + 1e-3 + 24e-9*5000.4, true, 100, 0.01, 5000},
		{"sparsification cost alone does not hide", 4, LAGSModel{Alpha: 1e-3, Beta: 1e-9, SparPerElement: 1e-8}, 6.5e-3, true, 100, 0.01, 1000},
		{"one worker: everything hides", 1, m, 0, true, 100, 0.01, 100000},
		{"free bandwidth", 4, LAGSModel{Alpha: 1e-3}, 7e-3, true, 100, 0.01, 100000},
		{"free bandwidth, latency does not hide", 4, LAGSModel{Alpha: 1e-3}, 5e-3, true, 100, 0.01, 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := lagsGroupK(100000, tc.density, tc.ratio, tc.n, tc.model, tc.tComp, tc.times); got != tc.want {
				t.Fatalf("k = %d, want %d", got, tc.want)
			}
		})
	}
	// Never less dense than 1/c_u: k >= ⌈m/c_u⌉.
	if got := lagsGroupK(100001, 0.01, 100, 4, m, 0, true); got != 1001 {
		t.Fatalf("k = %d for 100001 elements at c_u 100, want ⌈100001/100⌉ = 1001", got)
	}
}

// TestLAGSEq19 checks the adaptive density on a modelled network against
// eq. 19 solved by brute force — c^(l) = min{c_u, min{c = m/k | t_comm(k) +
// t_spar <= t_comp}}, c_u an upper bound on the compression — for groups
// whose backward time behind them grows: the chosen densities stay within
// [1/c_u, 1], grow with t_comp, reach 1 and 1/c_u at the ends, and every
// rank chooses the same.
func TestLAGSEq19(t *testing.T) {
	const (
		n    = 3
		size = 4000
		cu   = 400.0
	)
	var names []string
	var sizes []int
	for i := range 12 {
		names = append(names, fmt.Sprintf("t%d", i))
		sizes = append(sizes, size+37*i)
	}
	l, err := NewLayout(names, sizes)
	if err != nil {
		t.Fatal(err)
	}
	model := LAGSModel{Alpha: 50e-6, Beta: 1e-8, SparPerElement: 2e-9}
	rng := rand.New(rand.NewPCG(3, 5))
	// Backward times growing towards the input layers (the groups that
	// become final first hide behind the most), 0 to 2 ms.
	times := make([]time.Duration, len(sizes))
	for i := range times {
		times[i] = time.Duration(float64(len(sizes)-1-i) * (180e3 + 20e3*rng.Float64()))
	}
	o := Options{Density: 1 / cu, Layout: l, Params: Values{"merge_size": 1, "max_ratio": cu}}
	got := make([][]int, n)
	lagsRunWorld(t, n, o, func(ctx context.Context, rank int, r testLAGS) error {
		if err := r.SetModel(model); err != nil {
			return err
		}
		if err := r.SetBackwardTimes(times); err != nil {
			return err
		}
		got[rank] = r.GroupK()
		return nil
	})
	groups := LAGSGroups(l, 1)
	prevComp, prevDensity := -1.0, 0.0
	dense, bound := false, false
	// Walk the groups from the one with the least time behind it.
	for g := len(groups) - 1; g >= 0; g-- {
		m := groups[g].Size()
		tComp := 0.0
		if g+1 < len(groups) {
			tComp = times[groups[g+1].Tensors[0]].Seconds()
		}
		// Brute force: the least compression c = m/k that hides, i.e. the
		// largest k; none hides: the set is empty and c = c_u.
		want := 0
		for k := m; k >= 1; k-- {
			if 2*(n-1)*(model.Alpha+4*float64(k)*model.Beta)+model.SparPerElement*float64(m) <= tComp {
				want = k
				break
			}
		}
		if c := float64(m) / float64(max(want, 1)); want == 0 || c > cu {
			want = int(math.Ceil(float64(m) / cu))
		}
		for rank := range n {
			if got[rank][g] != want {
				t.Fatalf("rank %d, group %d (%d elements, t_comp %v s): k = %d, eq. 19 gives %d", rank, g, m, tComp, got[rank][g], want)
			}
		}
		d := float64(want) / float64(m)
		if d < 1/cu-1e-12 || d > 1 {
			t.Fatalf("group %d: density %v outside [1/c_u, 1] = [%v, 1]", g, d, 1/cu)
		}
		if tComp > prevComp && d < prevDensity {
			t.Fatalf("group %d: density %v with t_comp %v s, below %v with less time %v s", g, d, tComp, prevDensity, prevComp)
		}
		prevComp, prevDensity = tComp, d
		dense = dense || want == m
		bound = bound || want == int(math.Ceil(float64(m)/cu))
	}
	if !dense || !bound {
		t.Fatalf("test setup: the times should make some group dense (%v) and some group compress at c_u (%v): %v", dense, bound, got[0])
	}
	// Intermediate densities exist, too (the rule moves k, not just
	// between the two ends).
	between := 0
	for g, k := range got[0] {
		if m := groups[g].Size(); k > int(math.Ceil(float64(m)/cu)) && k < m {
			between++
		}
	}
	if between < 3 {
		t.Fatalf("only %d groups between the ends: %v", between, got[0])
	}
}

func TestLAGSAdaptiveReduce(t *testing.T) {
	l, err := NewLayout([]string{"first", "mid", "last"}, []int{1000, 1000, 1000})
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	o := Options{Density: 0.01, Layout: l, Params: Values{"merge_size": 1, "max_ratio": 100.0}}
	model := LAGSModel{Alpha: 1e-3, Beta: 1e-9}
	// Groups in backward order: [last], [mid], [first]. Group 0 hides behind
	// mid's backward time (1 s: dense), group 1 behind first's (k = 50),
	// group 2 behind nothing (1/c_u: k = 10).
	times := []time.Duration{time.Duration(6001210), time.Second, 0}
	wantK := []int{1000, 50, 10}
	accs := make([][]float32, n)
	outs := make([][]float32, n)
	ress := make([][]float32, n)
	stats := make([]Stats, n)
	lagsRunWorld(t, n, o, func(ctx context.Context, rank int, r testLAGS) error {
		if err := r.SetModel(model); err != nil {
			return err
		}
		if err := r.SetBackwardTimes(times); err != nil {
			return err
		}
		if got := r.GroupK(); !slices.Equal(got, wantK) {
			return fmt.Errorf("GroupK %v, want %v", got, wantK)
		}
		accs[rank] = lagsRandom(5, rank, l.N)
		outs[rank], ress[rank] = make([]float32, l.N), make([]float32, l.N)
		var err error
		stats[rank], err = r.Reduce(ctx, accs[rank], outs[rank], ress[rank])
		return err
	})
	ref := lagsRef(accs, l, [][]int{{2}, {1}, {0}}, wantK)
	for w := range n {
		checkClose(t, "out", outs[w], ref.out, nil)
		checkClose(t, "residual", ress[w], ref.res[w], nil)
		if want := []int{10, 50, 1000}; !slices.Equal(stats[w].LayerK, want) {
			t.Fatalf("LayerK %v, want %v", stats[w].LayerK, want)
		}
	}
}

func TestLAGSErrors(t *testing.T) {
	l, err := NewLayout([]string{"a", "b"}, []int{10, 20})
	if err != nil {
		t.Fatal(err)
	}
	w := local.New(1)
	c := w.Comm(0)
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"negative merge", Options{Density: 0.1, Layout: l, Comm: c, Params: Values{"merge_size": -1}}},
		{"merge 0", Options{Density: 0.1, Layout: l, Comm: c, Params: Values{"merge_size": 0}}},
		{"ratio below 1", Options{Density: 0.1, Layout: l, Comm: c, Params: Values{"max_ratio": 0.5}}},
		{"ratio NaN", Options{Density: 0.1, Layout: l, Comm: c, Params: Values{"max_ratio": math.NaN()}}},
		{"ratio Inf", Options{Density: 0.1, Layout: l, Comm: c, Params: Values{"max_ratio": math.Inf(1)}}},
		{"density compresses more than c_u", Options{Density: 0.001, Layout: l, Comm: c, Params: Values{"max_ratio": 100.0}}},
		{"c_u 1: only dense", Options{Density: 0.1, Layout: l, Comm: c, Params: Values{"max_ratio": 1.0}}},
		{"one group: nothing to hide behind", Options{Density: 0.1, Layout: l, Comm: c, Params: Values{"max_ratio": 10.0, "merge_size": 30}}},
		{"option of another method", Options{Density: 0.1, Layout: l, Comm: c, Params: Values{"teams": 2}}},
		{"no comm", Options{Density: 0.1, Layout: l}},
		{"bad density", Options{Density: 0, Layout: l, Comm: c}},
		{"empty layout", Options{Density: 0.1, Comm: c}},
	} {
		if _, err := newTestLAGS(tc.o); err == nil {
			t.Errorf("%s: no error", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	r, err := newTestLAGS(Options{Density: 0.1, Layout: l, Comm: c})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	buf := func(n int) []float32 { return make([]float32, n) }
	if _, err := r.Reduce(ctx, buf(29), buf(30), buf(30)); err == nil {
		t.Error("short acc accepted")
	}
	a := buf(30)
	if _, err := r.Reduce(ctx, a, a, buf(30)); err == nil {
		t.Error("out aliasing acc accepted")
	}
	if err := r.r.Start(ctx, 5, device.Host(buf(30)), device.Host(buf(30)), device.Host(buf(30))); err == nil {
		t.Error("group 5 accepted")
	}
	if _, err := r.r.Finish(ctx); err == nil {
		t.Error("a call whose group 5 was refused finished")
	}
	if err := r.SetBackwardTimes([]time.Duration{1}); err == nil {
		t.Error("one backward time for two tensors accepted")
	}
	if err := r.SetBackwardTimes([]time.Duration{1, -1}); err == nil {
		t.Error("negative backward time accepted")
	}
	if err := r.SetModel(LAGSModel{Alpha: -1}); err == nil {
		t.Error("negative alpha accepted")
	}
}

// TestLAGSPeerFails checks that a worker that fails makes the others' Wait
// return an error instead of hanging.
func TestLAGSPeerFails(t *testing.T) {
	l, err := FlatLayout(1000)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	boom := errors.New("boom")
	err = local.Run(ctx, 3, func(ctx context.Context, c comm.Communicator) error {
		r, err := New("lags", Options{Density: 0.01, Layout: l, Comm: c})
		if err != nil {
			return err
		}
		if c.Rank() == 1 {
			return boom
		}
		acc := make([]float32, l.N)
		_, err = r.Reduce(ctx, acc, make([]float32, l.N), acc)
		if !errors.Is(err, comm.ErrAborted) {
			return fmt.Errorf("rank %d: Reduce returned %v, want an ErrAborted error", c.Rank(), err)
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Run returned %v, want boom", err)
	}
}

func TestLAGSModelFromNetwork(t *testing.T) {
	m, err := LAGSModelFromNetwork(netmodel.Network{Latency: 50 * time.Microsecond, Bandwidth: 1.25e9}, 1e-9)
	if err != nil {
		t.Fatal(err)
	}
	if want := (LAGSModel{Alpha: 50e-6, Beta: 1 / 1.25e9, SparPerElement: 1e-9}); math.Abs(m.Alpha-want.Alpha) > 1e-15 || m.Beta != want.Beta || m.SparPerElement != want.SparPerElement {
		t.Fatalf("model %+v, want %+v", m, want)
	}
	if _, err := LAGSModelFromNetwork(netmodel.Network{Latency: time.Microsecond}, 0); err == nil {
		t.Fatal("zero bandwidth accepted")
	}
}

// TestLAGSPipelineEmulatedNetwork runs groups in flight on an emulated
// network (non-blocking calls then complete in the background, later) and
// checks the result against the reference.
func TestLAGSPipelineEmulatedNetwork(t *testing.T) {
	l, err := NewLayout([]string{"a", "b", "c", "d"}, []int{500, 3, 1200, 77})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	o := Options{Density: 0.02, Layout: l, Params: Values{"merge_size": 1}}
	net := netmodel.Network{Latency: 2 * time.Millisecond, Bandwidth: 1e8}
	accs, outs, ress := make([][]float32, n), make([][]float32, n), make([][]float32, n)
	lagsRunWorld(t, n, o, func(ctx context.Context, rank int, r testLAGS) error {
		accs[rank] = lagsRandom(21, rank, l.N)
		acc := slices.Clone(accs[rank])
		out := make([]float32, l.N)
		for g := range r.Groups() {
			if err := r.r.Start(ctx, g, device.Host(acc), device.Host(out), device.Host(acc)); err != nil {
				return err
			}
			time.Sleep(time.Millisecond) // the next group's backward pass
		}
		if _, err := r.r.Finish(ctx); err != nil {
			return err
		}
		outs[rank], ress[rank] = out, acc
		return nil
	}, local.WithNetwork(net))
	ref := lagsRef(accs, l, lagsRefGroups(l, 1), lagsUniformK(l, lagsRefGroups(l, 1), o.Density))
	for w := range n {
		checkClose(t, "out", outs[w], ref.out, nil)
		checkClose(t, "residual", ress[w], ref.res[w], nil)
	}
}

// TestLAGSNetworkOfTheRun: the adaptive density models the network the run
// declares (Options.Network, what the trainer also emulates) or, when none
// is declared, the network LAGS measures on its communicator — never the
// reference code's built-in 1 GbE constants. The measured case runs on an
// emulated slow network (2 ms, 4 MB/s) that the reducer is not told about.
func TestLAGSNetworkOfTheRun(t *testing.T) {
	const n = 2
	l, err := NewLayout([]string{"t0", "t1", "t2"}, []int{50000, 50000, 50000})
	if err != nil {
		t.Fatal(err)
	}
	net := netmodel.Network{Latency: 2 * time.Millisecond, Bandwidth: 4e6}
	// Groups in backward order: [t2] hides behind t1's backward time, [t1]
	// behind t0's, [t0] behind nothing. On net, per k: 8(n−1)/4e6 = 2 µs,
	// fixed 2(n−1)·2 ms = 4 ms: k = 20000 and 10000, and 50 (1/c_u =
	// 0.001). The 1 GbE constants would send both dense.
	times := []time.Duration{24 * time.Millisecond, 44 * time.Millisecond, 0}
	model, err := LAGSModelFromNetwork(net, 0)
	if err != nil {
		t.Fatal(err)
	}
	const density, ratio = 0.001, 1000.0
	var want []int
	for g, tc := range []float64{0.044, 0.024, 0} {
		want = append(want, lagsGroupK(50000, density, ratio, n, model, tc, true))
		if g < 2 && want[g] >= 50000 {
			t.Fatalf("test setup: group %d is dense on net", g)
		}
	}
	for _, tc := range []struct {
		name     string
		declared bool
		tol      float64 // relative tolerance on each group's k
	}{
		{"declared", true, 0},
		// Measuring on a shared machine can only find the network slower
		// than emulated, so k only smaller; 30 % is 3 ms of extra latency.
		{"measured", false, 0.3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Density: density, Layout: l, Params: Values{"merge_size": 1, "max_ratio": ratio}}
			if tc.declared {
				o.Network = net
			}
			got := make([][]int, n)
			lagsRunWorld(t, n, o, func(ctx context.Context, rank int, r testLAGS) error {
				if err := r.SetBackwardTimes(times); err != nil {
					return err
				}
				acc := lagsRandom(3, rank, l.N)
				if _, err := r.Reduce(ctx, acc, make([]float32, l.N), make([]float32, l.N)); err != nil {
					return err
				}
				got[rank] = r.GroupK()
				return nil
			}, local.WithNetwork(net))
			for rank := range n {
				if !slices.Equal(got[rank], got[0]) {
					t.Fatalf("rank %d has per-group k %v, rank 0 %v: every rank must agree", rank, got[rank], got[0])
				}
			}
			t.Logf("per-group k %v, the emulated network's %v", got[0], want)
			for g := range want {
				if d := math.Abs(float64(got[0][g]-want[g])) / float64(want[g]); d > tc.tol {
					t.Fatalf("per-group k %v, want %v (the emulated network's) within %g", got[0], want, tc.tol)
				}
			}
		})
	}
}

// TestLAGSSparCost checks that t_spar is measured (TakeSparCost covers the
// groups reduced since the last call) and used (SetSparCost moves k).
func TestLAGSSparCost(t *testing.T) {
	l, err := NewLayout([]string{"a", "b"}, []int{20000, 20000})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Density: 0.01, Layout: l, Params: Values{"merge_size": 1, "max_ratio": 100.0}}
	lagsRunWorld(t, 2, o, func(ctx context.Context, rank int, r testLAGS) error {
		if c := r.TakeSparCost(); c != 0 {
			return fmt.Errorf("cost %v before any reduction", c)
		}
		acc := lagsRandom(4, rank, l.N)
		if _, err := r.Reduce(ctx, acc, make([]float32, l.N), acc); err != nil {
			return err
		}
		c := r.TakeSparCost()
		if !(c > 0 && c < 1e-3) {
			return fmt.Errorf("measured %v s per element, want a positive time below 1 ms", c)
		}
		if c := r.TakeSparCost(); c != 0 {
			return fmt.Errorf("cost %v after TakeSparCost, want a new measurement (0)", c)
		}
		// Group 0 hides behind 5 ms: dense with a free sparsifier, 1/c_u
		// when selecting costs more than the time there is.
		if err := r.SetModel(LAGSModel{Alpha: 1e-6, Beta: 1e-9}); err != nil {
			return err
		}
		if err := r.SetBackwardTimes([]time.Duration{5 * time.Millisecond, 0}); err != nil {
			return err
		}
		if k := r.GroupK()[0]; k != 20000 {
			return fmt.Errorf("free sparsifier: k = %d, want 20000", k)
		}
		if err := r.SetSparCost(1e-6); err != nil { // 20 ms for the group
			return err
		}
		if k := r.GroupK()[0]; k != 200 {
			return fmt.Errorf("t_spar 20 ms behind 5 ms: k = %d, want 200 (1/c_u)", k)
		}
		for _, bad := range []float64{-1, math.NaN(), math.Inf(1)} {
			if err := r.SetSparCost(bad); err == nil {
				return fmt.Errorf("SetSparCost(%v) accepted", bad)
			}
		}
		return nil
	})
}

// corruptGather is a communicator whose first all-gather of indices
// (int32) received has element at replaced by bad once it completes.
type corruptGather struct {
	comm.Communicator
	armed bool
	at    int
	bad   int32
}

type corruptRequest struct {
	comm.Request
	recv []int32
	at   int
	bad  int32
}

func (r corruptRequest) Wait(ctx context.Context) (int, error) {
	n, err := r.Request.Wait(ctx)
	if err == nil {
		r.recv[r.at] = r.bad
	}
	return n, err
}

func (c *corruptGather) IAllGather(ctx context.Context, send, recv comm.Buffer) (comm.Request, error) {
	req, err := c.Communicator.IAllGather(ctx, send, recv)
	var b []int32
	switch r := recv.(type) {
	case comm.Int32s:
		b = r
	case comm.Device:
		if r.Buf.DType() == device.Int32 {
			b = r.Buf.Int32s()
		}
	}
	if b != nil && err == nil && c.armed {
		c.armed = false
		return corruptRequest{req, b, c.at, c.bad}, nil
	}
	return req, err
}

// TestLAGSCorruptIndex: an index outside the groups it was sent for,
// received in a run of groups started at once, fails that rank's call
// (range-checked in the pass that counts the distinct indices, read with
// the call's last wait) naming the groups, the index and its place in the
// list; the other ranks' calls complete, and every rank's next call works.
func TestLAGSCorruptIndex(t *testing.T) {
	const n = 3
	l, err := NewLayout([]string{"a", "b"}, []int{60, 40})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []int32{105, 100, -2} {
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			errs := make([][2]error, n)
			err := local.Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
				r := c.Rank()
				if r == 1 {
					c = &corruptGather{Communicator: c, armed: true, at: 7, bad: bad}
				}
				red, err := New("lags", Options{Density: 0.1, Layout: l, Comm: c, Params: Values{"merge_size": 1}})
				if err != nil {
					return err
				}
				rng := rand.New(rand.NewPCG(uint64(r), 5))
				for call := range 2 {
					acc := make([]float32, l.N)
					for i := range acc {
						acc[i] = float32(rng.NormFloat64())
					}
					_, errs[r][call] = red.Reduce(ctx, acc, make([]float32, l.N), make([]float32, l.N))
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			want := "groups [1 0]: a rank sent an index outside the 100 elements"
			if e := errs[1][0]; e == nil || !strings.Contains(e.Error(), want) || !strings.Contains(e.Error(), fmt.Sprintf("index %d (element 7 ", bad)) {
				t.Fatalf("rank 1's call with a corrupt index: %v; want it to say %q and name index %d", e, want, bad)
			}
			for r := range n {
				for call := range 2 {
					if (r != 1 || call == 1) && errs[r][call] != nil {
						t.Errorf("rank %d call %d: %v", r, call, errs[r][call])
					}
				}
			}
		})
	}
}
