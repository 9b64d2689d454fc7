package sparsify

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
)

// microRefRule is the controller written again from the notes (3.3), with
// the constants spelled out.
func microRefRule(thr float64, kPrev, k int) float64 {
	e := float64(kPrev) / float64(k)
	if e > 1.1 {
		return thr * 1.005
	} else if e > 0.909 {
		return thr * 1.00125
	}
	return thr * 0.995
}

// microRefIter is what one MiCRO iteration of all workers must produce.
type microRefIter struct {
	thr      float64
	counts   []int
	union    []int
	out      []float32
	outTol   []float64
	residual [][]float32
}

// microRefStep simulates all workers of iteration t from the previous
// threshold and global count (notes 3.2–3.4; k_prev recorded for n = 1 too).
func microRefStep(t int, accs [][]float32, N int, density float64, prevThr float64, kPrev int) microRefIter {
	n := len(accs)
	k := max(1, int(density*float64(N)))
	var it microRefIter
	if t == 0 {
		it.thr = 1 / (2 * math.Sqrt(float64(k)))
	} else {
		it.thr = microRefRule(prevThr, kPrev, k)
	}
	q, rem := N/n, N%n
	starts := make([]int, n+1)
	for i := 0; i < n; i++ {
		size := q
		if i < rem {
			size++
		}
		starts[i+1] = starts[i] + size
	}
	for w := range n {
		p := (t%n + w) % n
		s, e := starts[p], starts[p+1]
		c := 0
		for i := s; i < e; i++ {
			if math.Abs(float64(accs[w][i])) >= float64(float32(it.thr)) {
				it.union = append(it.union, i)
				c++
			}
		}
		if c == 0 && e > s {
			it.union = append(it.union, s+t%(e-s))
			c = 1
		}
		it.counts = append(it.counts, c)
	}
	it.out = make([]float32, N)
	it.outTol = make([]float64, N)
	for _, j := range it.union {
		var sum, abs float64
		for w := range n {
			sum += float64(accs[w][j])
			abs += math.Abs(float64(accs[w][j]))
		}
		it.out[j] = float32(sum / float64(n))
		it.outTol[j] = sumAbsTol(n, abs)/float64(n) + math.Abs(sum/float64(n))*u32
	}
	for w := range n {
		r := append([]float32(nil), accs[w]...)
		for _, j := range it.union {
			r[j] = 0
		}
		it.residual = append(it.residual, r)
	}
	return it
}

// microCheckAgainstRef compares a harness result with the reference, every
// iteration and worker, and checks the threshold sequence against the rule
// applied to the counts the workers observed.
func microCheckAgainstRef(t *testing.T, res *harnessResult) {
	t.Helper()
	n, N := res.Cfg.Workers, res.Layout.N
	k := max(1, int(res.Cfg.Density*float64(N)))
	thr, kPrev := 0.0, 0
	for it := range res.Acc {
		ref := microRefStep(it, res.Acc[it], N, res.Cfg.Density, thr, kPrev)
		for w := range n {
			what := fmt.Sprintf("iteration %d worker %d", it, w)
			checkClose(t, what+" out", res.Out[it][w], ref.out, ref.outTol)
			checkClose(t, what+" residual", res.Residual[it][w], ref.residual[w], nil)
			st := res.Stats[it][w]
			if st.Threshold != ref.thr {
				t.Fatalf("%s: Threshold = %v, want %v", what, st.Threshold, ref.thr)
			}
			// The controller applied to the global count the workers
			// themselves reported last iteration.
			if it > 0 {
				observed := 0
				for _, c := range res.Stats[it-1][w].SelectedPerWorker {
					observed += c
				}
				if want := microRefRule(res.Stats[it-1][w].Threshold, observed, k); st.Threshold != want {
					t.Fatalf("%s: Threshold %v does not follow the rule from %v and count %d (want %v)", what, st.Threshold, res.Stats[it-1][w].Threshold, observed, want)
				}
			} else if want := 1 / (2 * math.Sqrt(float64(k))); st.Threshold != want {
				t.Fatalf("%s: initial Threshold %v, want %v", what, st.Threshold, want)
			}
			if st.Selected != ref.counts[w] {
				t.Fatalf("%s: Selected = %d, want %d", what, st.Selected, ref.counts[w])
			}
			if !slices.Equal(st.SelectedPerWorker, ref.counts) {
				t.Fatalf("%s: SelectedPerWorker = %v, want %v", what, st.SelectedPerWorker, ref.counts)
			}
			if want := float64(len(ref.union)) / float64(N); st.ActualDensity != want {
				t.Fatalf("%s: ActualDensity = %v, want %v", what, st.ActualDensity, want)
			}
			if want := norm2(ref.residual[w]); math.Abs(st.ErrorNorm-want) > 1e-12*want {
				t.Fatalf("%s: ErrorNorm = %v, want %v", what, st.ErrorNorm, want)
			}
			if st.LayerK != nil || st.Density != res.Cfg.Density {
				t.Fatalf("%s: LayerK %v Density %v", what, st.LayerK, st.Density)
			}
			sent, recv := deftExpectTraffic(n, w, []deftCall{
				{op: comm.OpAllGather, elems: 1, esize: 4},
				{op: comm.OpAllGatherV, esize: 4, counts: ref.counts},
				{op: comm.OpAllReduce, elems: len(ref.union), esize: 4},
			})
			if st.BytesSent != sent || st.BytesRecv != recv {
				t.Fatalf("%s: bytes sent/received %d/%d, want %d/%d", what, st.BytesSent, st.BytesRecv, sent, recv)
			}
		}
		thr, kPrev = ref.thr, len(ref.union)
	}
}

// microGenAround draws normal values with a standard deviation that puts the
// initial threshold 1/(2√k) near the right magnitude for small k, so that
// selections are neither empty nor full.
func microGenAround(rng *rand.Rand, x []float32) {
	for i := range x {
		x[i] = float32(rng.NormFloat64() * 0.1)
	}
}

// microGenHalves draws from {0, ±0.25, ±0.5, ±1}: with k = 1 the first
// threshold is exactly 0.5, so the >= of the selection is exercised.
func microGenHalves(rng *rand.Rand, x []float32) {
	vals := [...]float32{0, 0.25, -0.25, 0.5, -0.5, 1, -1}
	for i := range x {
		x[i] = vals[rng.IntN(len(vals))]
	}
}

func TestMicroMatchesReference(t *testing.T) {
	gens := []struct {
		name string
		gen  harnessGen
	}{{"normal", genNormal}, {"smallints", genSmallInts}, {"sparse", genSparse}, {"around", microGenAround}, {"halves", microGenHalves}, {"zeros", func(_ *rand.Rand, x []float32) { clear(x) }}}
	for ci, c := range standardCases() {
		for gi, g := range gens {
			if testing.Short() && gi > 1 && c.N > 97 {
				continue
			}
			cfg := harnessConfig{
				Method: "micro", Workers: c.Workers, N: c.N, Density: c.Density,
				Iters: c.Workers + 3, Seed: uint64(ci*10 + gi), Feedback: true, InPlace: (ci+gi)%2 == 1, Gen: g.gen,
			}
			t.Run(c.String()+"/"+g.name, func(t *testing.T) {
				res := mustRunHarness(t, cfg)
				microCheckAgainstRef(t, res)
				checkConservation(t, res)
				checkOutputsAgree(t, res)
			})
		}
	}
}

// microRun runs MiCRO for iters iterations on n workers with fresh
// identically distributed accs (stationary input, no feedback) and returns
// the global count and the threshold of every iteration (from rank 0).
func microRun(t *testing.T, n, N int, density, sigma float64, iters int) (counts []int, thrs []float64) {
	t.Helper()
	l, err := FlatLayout(N)
	if err != nil {
		t.Fatal(err)
	}
	counts, thrs = make([]int, iters), make([]float64, iters)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = local.Run(ctx, n, func(ctx context.Context, c comm.Communicator) error {
		r, err := New("micro", Options{Density: density, Layout: l, Comm: c})
		if err != nil {
			return err
		}
		rng := rand.New(rand.NewPCG(uint64(c.Rank()), 1234))
		acc, out := make([]float32, N), make([]float32, N)
		for it := range iters {
			for i := range acc {
				acc[i] = float32(rng.NormFloat64() * sigma)
			}
			st, err := r.Reduce(ctx, acc, out, acc)
			if err != nil {
				return err
			}
			if c.Rank() == 0 {
				counts[it] = int(math.Round(st.ActualDensity * float64(N)))
				thrs[it] = st.Threshold
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return counts, thrs
}

// TestMicroSettles: on stationary random input the controller brings the
// global count into the band and keeps it there: the count never exceeds
// 1.1·k and oscillates just around the band's lower edge 0.909·k (the
// in-band step is upward, as in the reference).
func TestMicroSettles(t *testing.T) {
	iters, N := 160, 100_000
	if testing.Short() {
		iters, N = 120, 40_000
	}
	const density = 0.01
	k := BudgetK(density, N)
	// The threshold for density ρ of N(0, σ²) is 2.5758σ; start 30 % off.
	sigma := 1 / (2 * math.Sqrt(float64(k))) * 1.3 / 2.5758
	for _, n := range []int{1, 3, 5} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			counts, thrs := microRun(t, n, N, density, sigma, iters)
			for it := 1; it < iters; it++ {
				if want := microRefRule(thrs[it-1], counts[it-1], k); thrs[it] != want {
					t.Fatalf("iteration %d: threshold %v, rule gives %v", it, thrs[it], want)
				}
			}
			var sum float64
			tail := counts[iters-50:]
			for i, c := range tail {
				e := float64(c) / float64(k)
				sum += e
				if e > 1.1 || e < 0.8 {
					t.Fatalf("iteration %d: global count %d is %.3f·k, outside [0.8, 1.1]·k after settling (counts %v)", iters-50+i, c, e, tail)
				}
			}
			if mean := sum / float64(len(tail)); mean < 0.85 || mean > 1.0 {
				t.Fatalf("mean count ratio %.3f after settling, want within [0.85, 1.0]", mean)
			}
		})
	}
}

func TestMicroNextThreshold(t *testing.T) {
	tests := []struct {
		kPrev, k int
		factor   float64
	}{
		{0, 100, 0.995}, {90, 100, 0.995}, {91, 100, 1.00125}, {100, 100, 1.00125},
		{110, 100, 1.00125}, {111, 100, 1.005}, {5000, 100, 1.005}, {1, 1, 1.00125}, {2, 1, 1.005},
	}
	for _, tc := range tests {
		if got := microNextThreshold(2, tc.kPrev, tc.k); got != 2*tc.factor {
			t.Errorf("kPrev %d k %d: %v, want %v", tc.kPrev, tc.k, got, 2*tc.factor)
		}
	}
}

func TestMicroErrors(t *testing.T) {
	l, _ := FlatLayout(8)
	w := local.New(1)
	c := w.Comm(0)
	if _, err := New("micro", Options{Density: 1.5, Layout: l, Comm: c}); err == nil {
		t.Error("density 1.5 accepted")
	}
	if _, err := New("micro", Options{Density: 0.5, Layout: l}); err == nil {
		t.Error("missing communicator accepted")
	}
	if _, err := New("micro", Options{Density: 0.5, Comm: c}); err == nil {
		t.Error("empty layout accepted")
	}
	r, err := New("micro", Options{Density: 0.5, Layout: l, Comm: c})
	if err != nil {
		t.Fatal(err)
	}
	if r.Name() != "micro" {
		t.Errorf("Name() = %q", r.Name())
	}
	ctx := context.Background()
	acc, out := make([]float32, 8), make([]float32, 8)
	if _, err := r.Reduce(ctx, acc, out[:3], acc); err == nil {
		t.Error("short out accepted")
	}
	if _, err := r.Reduce(ctx, acc, acc, make([]float32, 8)); err == nil {
		t.Error("out aliasing acc accepted")
	}
}
