package sparsify

// Shared reducer test harness (owned by the reducers-baselines helper; other
// reducer tests in this package may use it). Summary:
//
//   - runHarness(t, cfg) runs the registered method cfg.Method on cfg.Workers
//     in-process workers (comm/local.Run) for cfg.Iters iterations and returns
//     every worker's acc (as passed in), out, residual and Stats per iteration.
//     Accs are random and deterministic from cfg.Seed (harnessGen draws each
//     (iteration, rank) from its own PCG stream); cfg.Feedback makes acc of
//     iteration t = residual of t−1 + a fresh random gradient; cfg.Fill
//     supplies hand-made values instead; cfg.InPlace
//     passes acc as residual too (aliasing). It returns the first error of New
//     or Reduce, so it also serves error tests; mustRunHarness fails the test
//     instead.
//   - checkConservation(t, res) asserts, for every iteration and index i,
//     Σ_w residual_w[i] + n·out[i] == Σ_w acc_w[i] within conservationTol;
//     checkOutputsAgree(t, res) asserts every rank got bit-identical out.
//   - checkClose(t, what, got, want, scale) compares float32 vectors with an
//     absolute tolerance scaled per element (use sumAbsTol for sums of n
//     float32 values).
//   - randomLayout(rng, N) builds a layout of several tensors, including
//     tensors of size 1 and sizes that are not multiples of anything.
//   - standardCases() is the table of worker counts {1, 2, 3, 5, 16}, sizes
//     {1, n−1, odd sizes, a few thousand} and densities giving k = 1 and more.
//   - refTopK(x, k) is a plain sort-based top-k (ties to lower indices,
//     result ascending) for references.
//   - harnessCall and expectTraffic compute the bytes a sequence of
//     communicator calls must be counted as (comm.Traffic per call).
//   - Generators: genNormal (default, standard normal), genSmallInts (small
//     integers: many ties, exact float32 sums), genSparse (mostly zeros).

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
)

// harnessGen fills x with the random acc (or, with Feedback, gradient) of
// one rank at one iteration.
type harnessGen func(rng *rand.Rand, x []float32)

// genNormal draws standard normal values.
func genNormal(rng *rand.Rand, x []float32) {
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
}

// genSmallInts draws integers in [-4, 4]: many magnitude ties, and sums of up
// to 2^21 of them are exact in float32.
func genSmallInts(rng *rand.Rand, x []float32) {
	for i := range x {
		x[i] = float32(rng.IntN(9) - 4)
	}
}

// genSparse leaves about 90% of the values zero and draws the rest from a
// normal distribution.
func genSparse(rng *rand.Rand, x []float32) {
	for i := range x {
		x[i] = 0
		if rng.IntN(10) == 0 {
			x[i] = float32(rng.NormFloat64())
		}
	}
}

// harnessConfig describes one harness run.
type harnessConfig struct {
	Method  string
	Workers int
	// Layout of the flat gradient; when it has no tensors, FlatLayout(N) is
	// used.
	Layout  Layout
	N       int
	Density float64
	// Iters is the number of Reduce calls per worker (default 1).
	Iters int
	// Seed seeds the accs and is passed as Options.Seed.
	Seed uint64
	// Options, if set, edits the options after Comm, Layout, Density and
	// Seed are filled in (Params, ...).
	Options func(*Options)
	// Feedback: acc(t) = residual(t−1) + gen() instead of acc(t) = gen().
	Feedback bool
	// InPlace passes the acc slice as residual too.
	InPlace bool
	// Gen generates the random values (default genNormal).
	Gen harnessGen
	// Fill, if set, replaces Gen: it writes the values of rank at iteration
	// iter into x (for hand-made inputs).
	Fill func(iter, rank int, x []float32)
	// Timeout bounds the whole run (default 2 minutes).
	Timeout time.Duration
}

// harnessResult holds everything the workers saw and produced, indexed
// [iteration][rank].
type harnessResult struct {
	Cfg      harnessConfig
	Layout   Layout
	Acc      [][][]float32 // copy of acc as passed to Reduce
	Out      [][][]float32
	Residual [][][]float32
	Stats    [][]Stats
}

// harnessSeed is the PCG stream of one rank at one iteration.
func harnessRNG(seed uint64, iter, rank int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, uint64(iter)<<32|uint64(rank)+0x5eed))
}

// runHarness runs cfg and returns the result or the first error of any rank
// (from New or Reduce).
func runHarness(t testing.TB, cfg harnessConfig) (*harnessResult, error) {
	t.Helper()
	if cfg.Iters <= 0 {
		cfg.Iters = 1
	}
	if cfg.Gen == nil {
		cfg.Gen = genNormal
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	layout := cfg.Layout
	if len(layout.Tensors) == 0 && cfg.N > 0 {
		var err error
		if layout, err = FlatLayout(cfg.N); err != nil {
			return nil, err
		}
	}
	n, N, iters := cfg.Workers, layout.N, cfg.Iters
	res := &harnessResult{Cfg: cfg, Layout: layout}
	alloc := func() [][][]float32 {
		a := make([][][]float32, iters)
		for it := range a {
			a[it] = make([][]float32, n)
		}
		return a
	}
	if n > 0 {
		res.Acc, res.Out, res.Residual = alloc(), alloc(), alloc()
		res.Stats = make([][]Stats, iters)
		for it := range res.Stats {
			res.Stats[it] = make([]Stats, n)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	err := local.Run(ctx, n, func(ctx context.Context, c comm.Communicator) error {
		o := Options{Density: cfg.Density, Layout: layout, Comm: c, Seed: cfg.Seed}
		if cfg.Options != nil {
			cfg.Options(&o)
		}
		r, err := New(cfg.Method, o)
		if err != nil {
			return err
		}
		rank := c.Rank()
		prev := make([]float32, N)
		for it := range iters {
			acc := make([]float32, N)
			if cfg.Fill != nil {
				cfg.Fill(it, rank, acc)
			} else {
				cfg.Gen(harnessRNG(cfg.Seed, it, rank), acc)
			}
			if cfg.Feedback {
				for i := range acc {
					acc[i] += prev[i]
				}
			}
			res.Acc[it][rank] = append([]float32(nil), acc...)
			out := make([]float32, N)
			residual := acc
			if !cfg.InPlace {
				residual = make([]float32, N)
			}
			// Poison out and a separate residual so that unwritten elements
			// show up.
			for i := range out {
				out[i] = float32(math.NaN())
			}
			if !cfg.InPlace {
				for i := range residual {
					residual[i] = float32(math.NaN())
				}
			}
			st, err := r.Reduce(ctx, acc, out, residual)
			if err != nil {
				return fmt.Errorf("rank %d iteration %d: %w", rank, it, err)
			}
			res.Out[it][rank] = out
			res.Residual[it][rank] = residual
			res.Stats[it][rank] = st
			prev = residual
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// mustRunHarness is runHarness that fails the test on error.
func mustRunHarness(t testing.TB, cfg harnessConfig) *harnessResult {
	t.Helper()
	res, err := runHarness(t, cfg)
	if err != nil {
		t.Fatalf("%s on %d workers, N=%d, density %v: %v", cfg.Method, cfg.Workers, cfg.N, cfg.Density, err)
	}
	return res
}

// u32 is the unit roundoff of float32.
const u32 = 1.0 / (1 << 24)

// sumAbsTol is the tolerance of a float32 sum of n terms, divided by n and
// multiplied back, whose absolute values sum to sumAbs: a recursive float32
// sum of n terms errs by at most (n−1)·u·Σ|a| (u = 2⁻²⁴), the rounding of 1/n
// and of the product add 2u more, so (n+1)·u·Σ|a| bounds it; the factor 2 is
// a margin for the division being done as a multiplication or the other way
// round. The tiny floor allows for subnormal results.
func sumAbsTol(n int, sumAbs float64) float64 {
	return 2*float64(n+1)*u32*sumAbs + 1e-37
}

// checkConservation asserts that nothing is lost or created: for every
// iteration and index, Σ_w residual_w + n·out == Σ_w acc_w within sumAbsTol.
func checkConservation(t testing.TB, res *harnessResult) {
	t.Helper()
	n := res.Cfg.Workers
	for it := range res.Acc {
		for i := range res.Layout.N {
			var lhs, rhs, abs float64
			for w := range n {
				a := float64(res.Acc[it][w][i])
				rhs += a
				abs += math.Abs(a)
				lhs += float64(res.Residual[it][w][i])
			}
			lhs += float64(n) * float64(res.Out[it][0][i])
			if d := math.Abs(lhs - rhs); !(d <= sumAbsTol(n, abs)) {
				t.Fatalf("%s n=%d N=%d iteration %d index %d: Σresidual + n·out = %g but Σacc = %g (diff %g)",
					res.Cfg.Method, n, res.Layout.N, it, i, lhs, rhs, d)
			}
		}
	}
}

// checkOutputsAgree asserts every rank's out is bit-identical to rank 0's.
func checkOutputsAgree(t testing.TB, res *harnessResult) {
	t.Helper()
	for it := range res.Out {
		for w := 1; w < res.Cfg.Workers; w++ {
			for i, v := range res.Out[it][w] {
				if math.Float32bits(v) != math.Float32bits(res.Out[it][0][i]) {
					t.Fatalf("%s n=%d iteration %d: rank %d out[%d] = %v but rank 0 has %v",
						res.Cfg.Method, res.Cfg.Workers, it, w, i, v, res.Out[it][0][i])
				}
			}
		}
	}
}

// checkClose asserts |got[i] − want[i]| <= tol[i] for every i (tol nil:
// exact equality, NaN never matches). what names the vector in messages.
func checkClose(t testing.TB, what string, got, want []float32, tol []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: length %d, want %d", what, len(got), len(want))
	}
	for i := range got {
		g, w := float64(got[i]), float64(want[i])
		var tl float64
		if tol != nil {
			tl = tol[i]
		}
		if !(math.Abs(g-w) <= tl) {
			t.Fatalf("%s[%d] = %v, want %v (tolerance %g)", what, i, got[i], want[i], tl)
		}
	}
}

// randomLayout splits N elements into 1 to 8 tensors of random positive
// sizes; with N >= 3 the first tensor has size 1.
func randomLayout(rng *rand.Rand, N int) (Layout, error) {
	var sizes []int
	left := N
	if N >= 3 {
		sizes = append(sizes, 1)
		left--
	}
	parts := 1 + rng.IntN(8)
	for left > 0 {
		s := left
		if len(sizes) < parts-1 && left > 1 {
			s = 1 + rng.IntN(left)
		}
		sizes = append(sizes, s)
		left -= s
	}
	names := make([]string, len(sizes))
	for i := range names {
		names[i] = fmt.Sprintf("t%d", i)
	}
	return NewLayout(names, sizes)
}

// harnessCase is one row of the standard table.
type harnessCase struct {
	Workers int
	N       int
	Density float64
}

func (c harnessCase) String() string {
	return fmt.Sprintf("n=%d/N=%d/rho=%g/k=%d", c.Workers, c.N, c.Density, BudgetK(c.Density, c.N))
}

// harnessWorkerCounts are the worker counts every reducer is tested with.
var harnessWorkerCounts = []int{1, 2, 3, 5, 16}

// standardCases returns worker counts {1, 2, 3, 5, 16} × sizes {1, n−1, 7,
// 97, 1001, 3001} × densities {1e-9 (k = 1), 0.05, 0.3}, without duplicates.
// Under -short the sizes above 1001 are dropped.
func standardCases() []harnessCase {
	var cs []harnessCase
	seen := map[harnessCase]bool{}
	for _, n := range harnessWorkerCounts {
		sizes := []int{1, n - 1, 7, 97, 1001}
		if !testing.Short() {
			sizes = append(sizes, 3001)
		}
		for _, N := range sizes {
			if N < 1 {
				continue
			}
			for _, d := range []float64{1e-9, 0.05, 0.3} {
				c := harnessCase{n, N, d}
				if !seen[c] {
					seen[c] = true
					cs = append(cs, c)
				}
			}
		}
	}
	return cs
}

// restrictToPow2 keeps the cases whose worker count is a power of two.
func restrictToPow2(cs []harnessCase) []harnessCase {
	var out []harnessCase
	for _, c := range cs {
		if c.Workers&(c.Workers-1) == 0 {
			out = append(out, c)
		}
	}
	return out
}

// refTopK returns the indices of the k largest |x[i]| (k clamped to
// [0, len(x)]), ties to lower indices, in ascending order, by sorting.
func refTopK(x []float32, k int) []int32 {
	k = max(0, min(k, len(x)))
	idx := make([]int32, len(x))
	for i := range idx {
		idx[i] = int32(i)
	}
	sort.SliceStable(idx, func(a, b int) bool {
		return math.Abs(float64(x[idx[a]])) > math.Abs(float64(x[idx[b]]))
	})
	sel := idx[:k]
	sort.Slice(sel, func(a, b int) bool { return sel[a] < sel[b] })
	return sel
}

// harnessCall is one communicator call as comm.Traffic sees it.
type harnessCall struct {
	Op     comm.Op
	Elems  int // buffer, send or message length
	ESize  int // bytes per element
	Root   int
	Counts []int
}

// expectTraffic sums comm.Traffic over calls for rank r of n. SendRecv is
// not supported (the Counter counts it directly as send + receive).
func expectTraffic(n, r int, calls []harnessCall) (sent, recv int64) {
	for _, c := range calls {
		s, v := comm.Traffic(c.Op, n, r, c.Elems, c.ESize, c.Root, c.Counts)
		sent += s
		recv += v
	}
	return sent, recv
}

// harnessRecorder is a testing.TB that records Fatalf instead of stopping,
// to test that the checkers can fail.
type harnessRecorder struct {
	testing.TB
	failed string
}

func (r *harnessRecorder) Helper() {}
func (r *harnessRecorder) Fatalf(format string, args ...any) {
	if r.failed == "" {
		r.failed = fmt.Sprintf(format, args...)
	}
}

// TestHarnessCheckersCanFail: the checkers accept a correct run and reject
// one with a changed residual or a rank whose out differs; runs are
// deterministic in the seed.
func TestHarnessCheckersCanFail(t *testing.T) {
	cfg := harnessConfig{Method: "dense", Workers: 3, N: 20, Density: 1, Seed: 4, Iters: 2, Feedback: true}
	res := mustRunHarness(t, cfg)
	again := mustRunHarness(t, cfg)
	checkClose(t, "deterministic acc", again.Acc[1][2], res.Acc[1][2], nil)
	rec := &harnessRecorder{TB: t}
	checkConservation(rec, res)
	checkOutputsAgree(rec, res)
	if rec.failed != "" {
		t.Fatalf("correct run rejected: %s", rec.failed)
	}
	res.Residual[1][2][7] += 1e-3
	checkConservation(rec, res)
	if rec.failed == "" {
		t.Fatal("checkConservation accepted a changed residual")
	}
	rec.failed = ""
	res.Out[0][1][3] = math.Nextafter32(res.Out[0][1][3], 10)
	checkOutputsAgree(rec, res)
	if rec.failed == "" {
		t.Fatal("checkOutputsAgree accepted differing outputs")
	}
	rec.failed = ""
	checkClose(rec, "x", []float32{1, 2}, []float32{1, 2.1}, []float64{0.01, 0.01})
	if rec.failed == "" {
		t.Fatal("checkClose accepted 2 for 2.1 with tolerance 0.01")
	}
}
