package sparsify

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/device"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
)

// Tests of "topkdsa" and "oktopk" (topkdsa.go, oktopk.go, regions.go).
//
// okRef is a plain single-process simulation of all P workers of either
// method, written from the reference notes (7.8) and the reducers' doc
// comments with loops, sorts and maps only: it shares no code with the
// reducers but the harness's refTopK. It adds in the same order as the
// reducers (the owner's sums in step order r, r−1, …; the warm-up in the
// communicator's canonical order), so outputs and residuals must match bit
// for bit, and it predicts every Stats field and the bytes of every call.

// okRef is the state of one simulated world.
type okRef struct {
	method string
	p, n   int // workers, elements
	k      int
	warmup int
	iter   int
	lthr   []float64 // per worker (oktopk)
	gthr   float64   // the same on every worker (oktopk)
	offs   []int     // region bounds, len p+1
}

func newOkRef(method string, p, n int, density float64, warmup int) *okRef {
	r := &okRef{method: method, p: p, n: n, k: BudgetK(density, n), lthr: make([]float64, p), warmup: warmup}
	r.offs = make([]int, p+1)
	for j := 0; j < p; j++ {
		r.offs[j] = j * (n / p)
	}
	r.offs[p] = n
	return r
}

// okRefStep is what the simulation predicts for one call of every worker.
type okRefStep struct {
	out       []float32
	residual  [][]float32
	threshold []float64 // per worker; NaN for none
	selected  []int
	perWorker []int // nil during the warm-up
	density   float64
	calls     [][]harnessCall // per worker
	global    int             // |G| (oktopk) or the number of gathered pairs
}

func okAbs(v float32) float64 { return math.Abs(float64(v)) }

// okRefKth is the k-th largest |x| by sorting.
func okRefKth(x []float32, k int) float32 {
	m := make([]float64, len(x))
	for i, v := range x {
		m[i] = okAbs(v)
	}
	sort.Sort(sort.Reverse(sort.Float64Slice(m)))
	return float32(m[k-1])
}

// okRefAbove lists the indices with |x| > t in ascending order.
func okRefAbove(x []float32, t float32) []int {
	var s []int
	for i, v := range x {
		if okAbs(v) > float64(t) {
			s = append(s, i)
		}
	}
	return s
}

// step simulates one call of every worker on accs.
func (w *okRef) step(accs [][]float32) okRefStep {
	p, n, k := w.p, w.n, w.k
	e := okRefStep{out: make([]float32, n), threshold: make([]float64, p), selected: make([]int, p), calls: make([][]harnessCall, p)}
	defer func() { w.iter++ }()
	if w.iter < w.warmup {
		// Canonical all-reduce: chunk c sums ranks c+1, …, p−1, 0, …, c.
		for c := 0; c < p; c++ {
			lo, hi := comm.ChunkBounds(n, p, c)
			for i := lo; i < hi; i++ {
				s := accs[(c+1)%p][i]
				for q := 2; q <= p; q++ {
					s += accs[(c+q)%p][i]
				}
				e.out[i] = s / float32(p)
			}
		}
		for r := 0; r < p; r++ {
			e.residual = append(e.residual, make([]float32, n))
			e.threshold[r] = math.NaN()
			e.selected[r] = n
			e.calls[r] = []harnessCall{{Op: comm.OpAllReduce, Elems: n, ESize: 4}}
		}
		e.density = 1
		return e
	}
	s := w.iter - w.warmup
	sels := make([][]int, p)
	for r := 0; r < p; r++ {
		acc := accs[r]
		switch w.method {
		case "topkdsa":
			for _, j := range refTopK(acc, k) {
				sels[r] = append(sels[r], int(j))
			}
			t := math.Inf(1)
			for _, j := range sels[r] {
				t = math.Min(t, okAbs(acc[j]))
			}
			e.threshold[r] = t
		case "oktopk":
			if s%32 == 0 {
				w.lthr[r] = float64(okRefKth(acc, k))
			} else {
				for raises := 0; raises < 5; raises++ {
					if len(okRefAbove(acc, float32(w.lthr[r]))) <= 4*k/3 {
						break
					}
					w.lthr[r] *= 1.03
				}
			}
			e.threshold[r] = float64(float32(w.lthr[r]))
			sels[r] = okRefAbove(acc, float32(w.lthr[r]))
		}
		e.selected[r] = len(sels[r])
	}
	if w.method == "oktopk" && s%64 == 0 && p > 1 {
		sum := make([]int64, p-1)
		for r := 0; r < p; r++ {
			for i := 1; i < p; i++ {
				if len(sels[r]) == 0 {
					sum[i-1] += int64(i * (n / p))
				} else {
					sum[i-1] += int64(sels[r][len(sels[r])/p*i])
				}
			}
			e.calls[r] = append(e.calls[r], harnessCall{Op: comm.OpAllReduce, Elems: p - 1, ESize: 8})
		}
		for i := 1; i < p; i++ {
			w.offs[i] = int(sum[i-1] / int64(p))
		}
	}
	if w.method == "oktopk" {
		for r := 0; r < p; r++ {
			if c := float64(len(sels[r])); c < 2*float64(k)/3 {
				w.lthr[r] /= 1.012
			} else if c > 5*float64(k)/4 {
				w.lthr[r] *= 1.012
			}
		}
	}
	region := func(j int) int { // owner of flat index j
		for o := 0; o < p; o++ {
			if j >= w.offs[o] && j < w.offs[o+1] {
				return o
			}
		}
		panic("index outside every region")
	}
	// sent[r][o] are r's selected indices in o's region.
	sent := make([][][]int, p)
	for r := range sent {
		sent[r] = make([][]int, p)
		for _, j := range sels[r] {
			o := region(j)
			sent[r][o] = append(sent[r][o], j)
		}
	}
	// Owners sum in step order: own first, then r−1, r−2, …
	sums := make([]map[int]float32, p)
	for o := 0; o < p; o++ {
		sums[o] = map[int]float32{}
		for i := 0; i < p; i++ {
			src := (o - i + p) % p
			for _, j := range sent[src][o] {
				sums[o][j] += accs[src][j]
			}
		}
	}
	// Traffic of the region exchange.
	for r := 0; r < p; r++ {
		for i := 1; i < p; i++ {
			dst, src := (r+i)%p, (r-i+p)%p
			ns, nr := len(sent[r][dst]), len(sent[src][r])
			e.calls[r] = append(e.calls[r],
				harnessCall{Op: comm.OpSend, Elems: 1, ESize: 4}, harnessCall{Op: comm.OpRecv, Elems: 1, ESize: 4},
				harnessCall{Op: comm.OpSend, Elems: ns, ESize: 4}, harnessCall{Op: comm.OpSend, Elems: ns, ESize: 4},
				harnessCall{Op: comm.OpRecv, Elems: nr, ESize: 4}, harnessCall{Op: comm.OpRecv, Elems: nr, ESize: 4})
		}
	}
	// Each owner's gathered pairs.
	gath := make([][]int, p)
	total := 0
	for o := 0; o < p; o++ {
		for j, v := range sums[o] {
			keep := v != 0
			if w.method == "oktopk" && s%32 != 0 {
				keep = okAbs(v) > float64(float32(w.gthr))
			}
			if keep {
				gath[o] = append(gath[o], j)
			}
		}
		slices.Sort(gath[o])
		total += len(gath[o])
		e.perWorker = append(e.perWorker, len(gath[o]))
	}
	counts := slices.Clone(e.perWorker)
	sizes := make([]int, p)
	for o := range sizes {
		sizes[o] = w.offs[o+1] - w.offs[o]
	}
	pf := float32(p)
	inG := map[int]bool{}
	// The pairs travel in one message per owner (its indices, then its
	// values): 2·count 32-bit words.
	words := make([]int, len(counts))
	for o, c := range counts {
		words[o] = 2 * c
	}
	switch w.method {
	case "topkdsa":
		sparse := 2*total < 2*n/3
		for r := 0; r < p; r++ {
			e.calls[r] = append(e.calls[r], harnessCall{Op: comm.OpAllGather, Elems: 1, ESize: 4})
			if sparse {
				e.calls[r] = append(e.calls[r], harnessCall{Op: comm.OpAllGatherV, ESize: 4, Counts: words})
			} else {
				e.calls[r] = append(e.calls[r], harnessCall{Op: comm.OpAllGatherV, ESize: 4, Counts: sizes})
			}
		}
		e.density = 1
		if sparse {
			e.density = float64(total) / float64(n)
			for o := 0; o < p; o++ {
				for _, j := range gath[o] {
					e.out[j] = sums[o][j] / pf
				}
			}
		} else {
			for o := 0; o < p; o++ {
				for j := w.offs[o]; j < w.offs[o+1]; j++ {
					e.out[j] = sums[o][j] / pf // 0 where nothing was sent
				}
			}
		}
		for r := 0; r < p; r++ {
			res := slices.Clone(accs[r])
			for _, j := range sels[r] {
				res[j] = 0
			}
			e.residual = append(e.residual, res)
		}
		e.global = total
	case "oktopk":
		for r := 0; r < p; r++ {
			e.calls[r] = append(e.calls[r], harnessCall{Op: comm.OpAllGather, Elems: 1, ESize: 4},
				harnessCall{Op: comm.OpAllGatherV, ESize: 4, Counts: words})
		}
		var all []int // ascending over owners
		var vals []float32
		for o := 0; o < p; o++ {
			for _, j := range gath[o] {
				all = append(all, j)
				vals = append(vals, sums[o][j])
			}
		}
		if s%32 == 0 {
			kk := min(k, len(all))
			if kk > 0 {
				pick := refTopK(vals, kk)
				t := math.Inf(1)
				for _, q := range pick {
					inG[all[q]] = true
					e.out[all[q]] = vals[q] / pf
					t = math.Min(t, okAbs(vals[q]))
				}
				w.gthr = t
			}
		} else {
			for q, j := range all {
				inG[j] = true
				e.out[j] = vals[q] / pf
			}
			if g := float64(len(all)); g < 2*float64(k)/3 {
				w.gthr /= 1.008
			} else if g > 4*float64(k)/3 {
				w.gthr *= 1.008
			}
		}
		for r := 0; r < p; r++ {
			res := slices.Clone(accs[r])
			for _, j := range sels[r] {
				if inG[j] {
					res[j] = 0
				}
			}
			e.residual = append(e.residual, res)
		}
		e.density = float64(total) / float64(n)
		e.global = len(inG)
	}
	return e
}

// okCheck compares iteration it of res with the simulation's prediction.
func okCheck(t *testing.T, res *harnessResult, it int, e okRefStep) {
	t.Helper()
	for w := range res.Cfg.Workers {
		pre := fmt.Sprintf("iteration %d rank %d", it, w)
		checkClose(t, pre+" out", res.Out[it][w], e.out, nil)
		checkClose(t, pre+" residual", res.Residual[it][w], e.residual[w], nil)
		st := res.Stats[it][w]
		if st.Selected != e.selected[w] {
			t.Fatalf("%s: Selected = %d, want %d", pre, st.Selected, e.selected[w])
		}
		if !slices.Equal(st.SelectedPerWorker, e.perWorker) || (st.SelectedPerWorker == nil) != (e.perWorker == nil) {
			t.Fatalf("%s: SelectedPerWorker = %v, want %v", pre, st.SelectedPerWorker, e.perWorker)
		}
		if st.ActualDensity != e.density {
			t.Fatalf("%s: ActualDensity = %v, want %v", pre, st.ActualDensity, e.density)
		}
		if st.Density != res.Cfg.Density {
			t.Fatalf("%s: Density = %v, want %v", pre, st.Density, res.Cfg.Density)
		}
		if want := e.threshold[w]; math.IsNaN(want) != math.IsNaN(st.Threshold) || (!math.IsNaN(want) && st.Threshold != want) {
			t.Fatalf("%s: Threshold = %v, want %v", pre, st.Threshold, want)
		}
		if want := blNorm(e.residual[w]); math.Abs(st.ErrorNorm-want) > 1e-9*want {
			t.Fatalf("%s: ErrorNorm = %v, want %v", pre, st.ErrorNorm, want)
		}
		sent, recv := expectTraffic(res.Cfg.Workers, w, e.calls[w])
		if st.BytesSent != sent || st.BytesRecv != recv {
			t.Fatalf("%s: bytes sent/received = %d/%d, want %d/%d", pre, st.BytesSent, st.BytesRecv, sent, recv)
		}
		if st.SelectTime < 0 || st.CommTime < 0 {
			t.Fatalf("%s: negative times %v %v", pre, st.SelectTime, st.CommTime)
		}
	}
}

// okCompare runs cfg and compares every iteration with the simulation.
func okCompare(t *testing.T, cfg harnessConfig, warmup int) []okRefStep {
	t.Helper()
	res := mustRunHarness(t, cfg)
	ref := newOkRef(cfg.Method, cfg.Workers, res.Layout.N, cfg.Density, warmup)
	var steps []okRefStep
	for it := range cfg.Iters {
		e := ref.step(res.Acc[it])
		okCheck(t, res, it, e)
		steps = append(steps, e)
	}
	checkOutputsAgree(t, res)
	checkConservation(t, res)
	return steps
}

// genZero leaves x zero: nothing to select.
func genZero(_ *rand.Rand, x []float32) { clear(x) }

// TestOkMethodsMatchReference: both methods against the simulation over
// the standard cases (n ∈ {1, 2, 3, 5, 16}, N ∈ {1, n−1, 7, 97, 1001, 3001},
// k = 1 and more), with and without a warm-up, error feedback, aliasing
// residual, and value distributions with many ties, zeros, or nothing at
// all.
func TestOkMethodsMatchReference(t *testing.T) {
	gens := []harnessGen{genNormal, genSmallInts, genSparse, genZero}
	for _, method := range []string{"topkdsa", "oktopk"} {
		for ci, c := range standardCases() {
			warmup := []int{0, 1, 2}[ci%3]
			t.Run(fmt.Sprintf("%s/%s/warmup=%d", method, c, warmup), func(t *testing.T) {
				okCompare(t, harnessConfig{
					Method: method, Workers: c.Workers, N: c.N, Density: c.Density,
					Iters: 4, Seed: uint64(2000 + ci), Options: func(o *Options) { o.Params = Values{"dense_warmup": warmup} },
					Feedback: ci%2 == 0, InPlace: ci%3 == 1, Gen: gens[ci%len(gens)],
				}, warmup)
			})
		}
	}
}

// TestOkTopkScheduleMatchesReference runs Ok-Topk for 140 sparse calls, past
// the recomputations at 32, 64, 96, 128 and the re-balancing at 64 and 128,
// against the simulation, with a worker that has nothing to select.
func TestOkTopkScheduleMatchesReference(t *testing.T) {
	cases := []struct {
		n, N    int
		density float64
		fill    func(iter, rank int, x []float32)
	}{
		{2, 1001, 0.05, nil},
		{3, 97, 0.05, nil},
		{5, 3001, 0.01, nil},
		{16, 1001, 0.02, nil},
		{3, 500, 0.05, func(iter, rank int, x []float32) { // rank 1 never selects
			if rank == 1 {
				clear(x)
				return
			}
			genNormal(harnessRNG(9, iter, rank), x)
		}},
	}
	for ci, c := range cases {
		t.Run(fmt.Sprintf("n=%d/N=%d/rho=%g/zero-rank=%v", c.n, c.N, c.density, c.fill != nil), func(t *testing.T) {
			if testing.Short() && c.n == 16 {
				t.Skip("short mode")
			}
			okCompare(t, harnessConfig{
				Method: "oktopk", Workers: c.n, N: c.N, Density: c.density, Iters: 140, Seed: uint64(30 + ci),
				Options: func(o *Options) { o.Params = Values{"dense_warmup": 0} }, Feedback: true, Fill: c.fill,
			}, 0)
		})
	}
}

// TestOkMethodsHandComputed pins small cases worked out by hand.
func TestOkMethodsHandComputed(t *testing.T) {
	cases := []struct {
		name      string
		method    string
		density   float64
		accs      [][]float32
		out       []float32
		residual  [][]float32
		perWorker []int
		selected  []int
		density2  float64 // ActualDensity
		threshold []float64
	}{
		{
			// k = 1: each worker's maximum lies in region 1 (elements 6 to
			// 11), whose owner adds its own −4 and then rank 0's 9. The
			// reference sends only |acc| > the k-th largest and so nothing.
			name: "topkdsa k=1 sparse", method: "topkdsa", density: 1.0 / 12,
			accs: [][]float32{
				{0, 1, 0, -2, 0, 0, 0, 9, 0, 0, 3, 0},
				{1, 0, 0, 0, 0, 2, 0, -4, 0, 0, 0, 0},
			},
			out: []float32{0, 0, 0, 0, 0, 0, 0, 2.5, 0, 0, 0, 0},
			residual: [][]float32{
				{0, 1, 0, -2, 0, 0, 0, 0, 0, 0, 3, 0},
				{1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0},
			},
			perWorker: []int{0, 1}, selected: []int{1, 1}, density2: 1.0 / 12, threshold: []float64{9, 4},
		},
		{
			// Two non-zero sums of N = 4: 2·2 >= ⌊8/3⌋, so the regions
			// travel dense.
			name: "topkdsa dense gather", method: "topkdsa", density: 0.25,
			accs:      [][]float32{{1, -5, 2, 0}, {3, 0, 0, 4}},
			out:       []float32{0, -2.5, 0, 2},
			residual:  [][]float32{{1, 0, 2, 0}, {3, 0, 0, 0}},
			perWorker: []int{1, 1}, selected: []int{1, 1}, density2: 1, threshold: []float64{5, 4},
		},
		{
			// k = 5. Rank 0 selects L0 = {1, 3, 5, 7} (|acc| > 1), rank 1
			// L1 = {0, 8}. Boundary proposals L0[2] = 5 and L1[1] = 8
			// average to 6: regions [0, 6) and [6, 10) (the equal split
			// would cut at 5). The six non-zero sums are gathered; the top 5
			// (21, 20, 13, 12, 11) form G, and 10 at index 1 stays in rank
			// 0's residual.
			name: "oktopk re-balanced regions and global top-k", method: "oktopk", density: 0.5,
			accs: [][]float32{
				{0.5, 10, 0.5, 11, 0.5, 12, 1, 13, 0.5, 0.5},
				{20, 1, 1, 1, 1, 1, 1, 1, 21, 1},
			},
			out: []float32{10, 0, 0, 5.5, 0, 6, 0, 6.5, 10.5, 0},
			residual: [][]float32{
				{0.5, 10, 0.5, 0, 0.5, 0, 1, 0, 0.5, 0.5},
				{0, 1, 1, 1, 1, 1, 1, 1, 0, 1},
			},
			perWorker: []int{4, 2}, selected: []int{4, 2}, density2: 0.6, threshold: []float64{1, 1},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, N := len(tc.accs), len(tc.accs[0])
			res := mustRunHarness(t, harnessConfig{
				Method: tc.method, Workers: n, N: N, Density: tc.density,
				Options: func(o *Options) { o.Params = Values{"dense_warmup": 0} },
				Fill:    func(_, rank int, x []float32) { copy(x, tc.accs[rank]) },
			})
			for w := range n {
				pre := fmt.Sprintf("rank %d", w)
				checkClose(t, pre+" out", res.Out[0][w], tc.out, nil)
				checkClose(t, pre+" residual", res.Residual[0][w], tc.residual[w], nil)
				st := res.Stats[0][w]
				if !slices.Equal(st.SelectedPerWorker, tc.perWorker) || st.Selected != tc.selected[w] ||
					st.ActualDensity != tc.density2 || st.Threshold != tc.threshold[w] {
					t.Fatalf("%s: stats %+v; want SelectedPerWorker %v, Selected %d, ActualDensity %v, Threshold %v",
						pre, st, tc.perWorker, tc.selected[w], tc.density2, tc.threshold[w])
				}
			}
		})
	}
}

// TestOkMethodsWarmup: without the option dense_warmup the reference's 512
// calls are dense, with it that many (0: none); dense calls average and
// leave no residual.
func TestOkMethodsWarmup(t *testing.T) {
	for _, method := range []string{"topkdsa", "oktopk"} {
		for _, tc := range []struct {
			opt   Values
			dense int
		}{{nil, 512}, {Values{"dense_warmup": 3}, 3}, {Values{"dense_warmup": 0}, 0}} {
			t.Run(fmt.Sprintf("%s/%v", method, tc.opt), func(t *testing.T) {
				res := mustRunHarness(t, harnessConfig{
					Method: method, Workers: 2, N: 40, Density: 0.1, Iters: tc.dense + 2, Seed: 5, Feedback: true,
					Options: func(o *Options) { o.Params = tc.opt },
				})
				for it, sts := range res.Stats {
					for w, st := range sts {
						dense := st.Selected == 40 && st.ActualDensity == 1 && math.IsNaN(st.Threshold) && st.ErrorNorm == 0
						if dense != (it < tc.dense) {
							t.Fatalf("iteration %d rank %d: dense = %v, want %v (stats %+v)", it, w, dense, it < tc.dense, st)
						}
					}
				}
				checkConservation(t, res)
			})
		}
	}
}

// TestTopkDSABudget: every worker selects exactly k elements, zeroes
// exactly those in its residual, and out has at most min(N, P·k) non-zeros.
func TestTopkDSABudget(t *testing.T) {
	for _, c := range []harnessCase{{1, 500, 0.01}, {3, 500, 0.05}, {5, 1001, 0.02}, {16, 3001, 0.01}} {
		t.Run(c.String(), func(t *testing.T) {
			k := BudgetK(c.Density, c.N)
			res := mustRunHarness(t, harnessConfig{Method: "topkdsa", Workers: c.Workers, N: c.N, Density: c.Density,
				Iters: 5, Seed: 11, Feedback: true, Options: func(o *Options) { o.Params = Values{"dense_warmup": 0} }})
			for it := range res.Stats {
				nz := 0
				for _, v := range res.Out[it][0] {
					if v != 0 {
						nz++
					}
				}
				if nz > min(c.N, c.Workers*k) {
					t.Fatalf("iteration %d: %d non-zeros in out, more than min(N, P·k) = %d", it, nz, min(c.N, c.Workers*k))
				}
				for w, st := range res.Stats[it] {
					zeroed := 0
					for i, v := range res.Residual[it][w] {
						if v == 0 && res.Acc[it][w][i] != 0 {
							zeroed++
						}
					}
					if st.Selected != k || zeroed != k {
						t.Fatalf("iteration %d rank %d: Selected %d, %d residual elements zeroed; want k = %d", it, w, st.Selected, zeroed, k)
					}
				}
			}
		})
	}
}

// TestOkTopkBudget: at every recomputation the global set has exactly k
// elements, and in between the controllers keep the local and global
// counts near k: within 25 % on average for a stationary input (fresh
// values each call), and, with error feedback (whose residuals grow at
// first, so the global count overshoots for the first two periods while the
// ×1.008 controller catches up), within a factor 2 over the last period.
func TestOkTopkBudget(t *testing.T) {
	const n, N, density, iters = 4, 20000, 0.01, 130
	k := BudgetK(density, N)
	for _, tc := range []struct {
		feedback bool
		from     int     // average over iterations from..iters-1
		tol      float64 // allowed factor
	}{{false, 0, 1.25}, {true, iters - 32, 2}} {
		t.Run(fmt.Sprintf("feedback=%v", tc.feedback), func(t *testing.T) {
			res := mustRunHarness(t, harnessConfig{Method: "oktopk", Workers: n, N: N, Density: density, Iters: iters, Seed: 12,
				Feedback: tc.feedback, Options: func(o *Options) { o.Params = Values{"dense_warmup": 0} }})
			var local, global float64
			for it := range iters {
				g := 0
				for _, v := range res.Out[it][0] {
					if v != 0 {
						g++
					}
				}
				if it%32 == 0 && g != k {
					t.Fatalf("recompute iteration %d: |G| = %d, want k = %d", it, g, k)
				}
				if it < tc.from {
					continue
				}
				global += float64(g)
				for _, st := range res.Stats[it] {
					local += float64(st.Selected)
				}
			}
			m := float64(iters - tc.from)
			local /= m * n
			global /= m
			t.Logf("k = %d: mean local count %.1f, mean |G| %.1f", k, local, global)
			lo, hi := float64(k)/tc.tol, float64(k)*tc.tol
			if local < lo || local > hi || global < lo || global > hi {
				t.Fatalf("mean local count %.1f or mean |G| %.1f is not within [%.0f, %.0f] (k = %d)", local, global, lo, hi, k)
			}
		})
	}
}

// TestOkMethodsIgnoreTensorBoundaries: both work on the flat vector, so a
// multi-tensor layout gives the flat layout's results bit for bit.
func TestOkMethodsIgnoreTensorBoundaries(t *testing.T) {
	rng := harnessRNG(22, 0, 0)
	for _, m := range []string{"topkdsa", "oktopk"} {
		for _, n := range []int{1, 3, 5} {
			l, err := randomLayout(rng, 301)
			if err != nil {
				t.Fatal(err)
			}
			cfg := harnessConfig{Method: m, Workers: n, N: 301, Density: 0.05, Seed: 8, Iters: 3, Feedback: true,
				Options: func(o *Options) { o.Params = Values{"dense_warmup": 1} }}
			flat := mustRunHarness(t, cfg)
			cfg.Layout = l
			multi := mustRunHarness(t, cfg)
			for it := range cfg.Iters {
				for w := range n {
					checkClose(t, fmt.Sprintf("%s n=%d it=%d rank %d out", m, n, it, w), multi.Out[it][w], flat.Out[it][w], nil)
					checkClose(t, fmt.Sprintf("%s n=%d it=%d rank %d residual", m, n, it, w), multi.Residual[it][w], flat.Residual[it][w], nil)
				}
			}
		}
	}
}

// TestOkMethodsBadArgumentsAndFailures: wrong lengths and out aliasing are
// errors; when one worker fails, the others' Reduce returns an error wrapping
// comm.ErrAborted instead of waiting in the region exchange forever; a
// cancelled context is an error wrapping context.Canceled.
func TestOkMethodsBadArgumentsAndFailures(t *testing.T) {
	boom := errors.New("rank 1 gave up")
	for _, m := range []string{"topkdsa", "oktopk"} {
		t.Run(m+"/arguments", func(t *testing.T) {
			l, _ := FlatLayout(10)
			r, err := New(m, Options{Density: 0.2, Layout: l, Comm: blSingleComm(t)})
			if err != nil {
				t.Fatal(err)
			}
			acc, out := make([]float32, 10), make([]float32, 10)
			if _, err := r.Reduce(t.Context(), acc[:9], out, acc[:9]); err == nil {
				t.Fatal("short acc accepted")
			}
			if _, err := r.Reduce(t.Context(), acc, acc, out); err == nil {
				t.Fatal("out aliasing acc accepted")
			}
			if r.Name() != m {
				t.Fatalf("Name() = %q", r.Name())
			}
		})
		for _, warmup := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/dead-peer/warmup=%d", m, warmup), func(t *testing.T) {
				l, _ := FlatLayout(100)
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				var aborted atomic.Int32
				err := local.Run(ctx, 5, func(ctx context.Context, c comm.Communicator) error {
					r, err := New(m, Options{Density: 0.1, Layout: l, Comm: c, Params: Values{"dense_warmup": warmup}})
					if err != nil {
						return err
					}
					acc, out := make([]float32, 100), make([]float32, 100)
					for it := 0; it < 3; it++ {
						if c.Rank() == 1 && it == 1 {
							return boom
						}
						genNormal(harnessRNG(1, it, c.Rank()), acc)
						if _, err = r.Reduce(ctx, acc, out, acc); err != nil {
							if errors.Is(err, comm.ErrAborted) {
								aborted.Add(1)
							}
							return err
						}
					}
					return nil
				})
				if !errors.Is(err, boom) {
					t.Fatalf("Run returned %v, want rank 1's error", err)
				}
				if aborted.Load() == 0 {
					t.Fatal("no other rank saw comm.ErrAborted")
				}
			})
		}
		t.Run(m+"/cancelled", func(t *testing.T) {
			l, _ := FlatLayout(10)
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			r, err := New(m, Options{Density: 0.1, Layout: l, Comm: local.New(2).Comm(0), Params: Values{"dense_warmup": 0}})
			if err != nil {
				t.Fatal(err)
			}
			acc, out := make([]float32, 10), make([]float32, 10)
			acc[3] = 1
			if _, err := r.Reduce(ctx, acc, out, acc); !errors.Is(err, context.Canceled) {
				t.Fatalf("Reduce with a cancelled context: %v, want context.Canceled", err)
			}
		})
	}
}

// TestOkHelpers checks the small helpers against direct definitions.
func TestOkHelpers(t *testing.T) {
	for _, tc := range []struct{ n, p int }{{10, 3}, {5, 4}, {3, 5}, {1, 16}, {7, 7}, {3001, 16}} {
		offs := make([]int, tc.p+1)
		okEqualSplit(offs, tc.n, tc.p)
		for j := 0; j < tc.p; j++ {
			want := tc.n / tc.p
			if j == tc.p-1 {
				want = tc.n - (tc.p-1)*(tc.n/tc.p)
			}
			if offs[j] != j*(tc.n/tc.p) || offs[j+1]-offs[j] != want {
				t.Fatalf("okEqualSplit(%d, %d) = %v", tc.n, tc.p, offs)
			}
		}
	}
	x := []float32{0, -0.5, 0.5, 1, -2, float32(math.SmallestNonzeroFloat32), 3}
	for _, thr := range []float32{0, 0.5, 1, 2.5, 3} {
		var want []int32
		for i, v := range x {
			if okAbs(v) > float64(thr) {
				want = append(want, int32(i))
			}
		}
		if got := SelectAbove(nil, x, okAbove(thr)); !slices.Equal(got, want) {
			t.Fatalf("SelectAbove(okAbove(%v)) = %v, want %v", thr, got, want)
		}
		if got, _ := CPUOps().CountAbove(nil, device.Host(x), okAbove(thr)); got != len(want) {
			t.Fatalf("CountAbove(okAbove(%v)) = %d, want %d", thr, got, len(want))
		}
	}
	big := make([]float32, 1<<18)
	genNormal(harnessRNG(3, 0, 0), big)
	if got, _ := CPUOps().CountAbove(nil, device.Host(big), okAbove(1)); got != len(okRefAbove(big, 1)) {
		t.Fatalf("CountAbove on %d elements = %d, want %d", len(big), got, len(okRefAbove(big, 1)))
	}
	for _, m := range []string{"oktopk", "topkdsa"} {
		if p, _ := mustLookup(t, m).Param("dense_warmup"); p.Default != 512 {
			t.Fatalf("%s: default warm-up %v, want 512", m, p.Default)
		}
	}
}
