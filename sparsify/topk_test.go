package sparsify

import (
	"fmt"
	"math"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
)

// blExpect is what a reference simulation of a baseline reducer predicts for
// one iteration of all workers.
type blExpect struct {
	out       []float64   // the average, computed in float64
	outAbs    []float64   // Σ|contributions| at each index (tolerance scale)
	exactOut  []float32   // if set, out must equal it bit for bit
	residual  [][]float32 // per worker, exact
	selected  []int       // Stats.Selected per worker
	perWorker []int       // Stats.SelectedPerWorker (nil: must be nil)
	density   float64     // Stats.ActualDensity
	threshold float64     // Stats.Threshold (NaN: must be NaN)
	calls     func(rank int) []harnessCall
}

// blCheck compares iteration it of res with e for every worker.
func blCheck(t *testing.T, res *harnessResult, it int, e blExpect) {
	t.Helper()
	n := res.Cfg.Workers
	tol := make([]float64, len(e.out))
	want := make([]float32, len(e.out))
	for i := range e.out {
		tol[i] = sumAbsTol(n, e.outAbs[i]) / float64(n)
		want[i] = float32(e.out[i])
	}
	for w := range n {
		pre := fmt.Sprintf("iteration %d rank %d", it, w)
		if e.exactOut != nil {
			checkClose(t, pre+" out", res.Out[it][w], e.exactOut, nil)
		} else {
			checkClose(t, pre+" out", res.Out[it][w], want, tol)
		}
		checkClose(t, pre+" residual", res.Residual[it][w], e.residual[w], nil)
		st := res.Stats[it][w]
		if st.Selected != e.selected[w] {
			t.Fatalf("%s: Selected = %d, want %d", pre, st.Selected, e.selected[w])
		}
		if fmt.Sprint(st.SelectedPerWorker) != fmt.Sprint(e.perWorker) || (st.SelectedPerWorker == nil) != (e.perWorker == nil) {
			t.Fatalf("%s: SelectedPerWorker = %v, want %v", pre, st.SelectedPerWorker, e.perWorker)
		}
		if st.ActualDensity != e.density {
			t.Fatalf("%s: ActualDensity = %v, want %v", pre, st.ActualDensity, e.density)
		}
		if st.Density != res.Cfg.Density {
			t.Fatalf("%s: Density = %v, want %v", pre, st.Density, res.Cfg.Density)
		}
		if math.IsNaN(e.threshold) != math.IsNaN(st.Threshold) || (!math.IsNaN(e.threshold) && st.Threshold != e.threshold) {
			t.Fatalf("%s: Threshold = %v, want %v", pre, st.Threshold, e.threshold)
		}
		wantNorm := blNorm(e.residual[w])
		if math.Abs(st.ErrorNorm-wantNorm) > 1e-9*wantNorm {
			t.Fatalf("%s: ErrorNorm = %v, want %v", pre, st.ErrorNorm, wantNorm)
		}
		sent, recv := expectTraffic(n, w, e.calls(w))
		if st.BytesSent != sent || st.BytesRecv != recv {
			t.Fatalf("%s: bytes sent/received = %d/%d, want %d/%d", pre, st.BytesSent, st.BytesRecv, sent, recv)
		}
		if st.SelectTime < 0 || st.CommTime < 0 {
			t.Fatalf("%s: negative times %v %v", pre, st.SelectTime, st.CommTime)
		}
	}
}

// blNorm is ‖x‖₂ in float64.
func blNorm(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}

// blRefUnion is the shared-union all-reduce of section 1 of the notes:
// out = Σ_w acc_w / n on union, residual_w = acc_w with the union zeroed.
func blRefUnion(accs [][]float32, union map[int32]bool) blExpect {
	n, N := len(accs), len(accs[0])
	e := blExpect{out: make([]float64, N), outAbs: make([]float64, N), threshold: math.NaN()}
	for _, a := range accs {
		r := append([]float32(nil), a...)
		for j := range union {
			e.out[j] += float64(a[j]) / float64(n)
			e.outAbs[j] += math.Abs(float64(a[j]))
			r[j] = 0
		}
		e.residual = append(e.residual, r)
	}
	e.density = float64(len(union)) / float64(N)
	return e
}

// blSelSets is every worker's selection as a list and the union as a set.
func blUnion(sels [][]int32) map[int32]bool {
	u := map[int32]bool{}
	for _, s := range sels {
		for _, j := range s {
			u[j] = true
		}
	}
	return u
}

// blRefTopk is the reference of "topk" (notes 7.1).
func blRefTopk(accs [][]float32, k int) blExpect {
	var sels [][]int32
	for _, a := range accs {
		sels = append(sels, refTopK(a, k))
	}
	u := blUnion(sels)
	e := blRefUnion(accs, u)
	for range accs {
		e.selected = append(e.selected, k)
		e.perWorker = append(e.perWorker, k)
	}
	e.calls = func(int) []harnessCall {
		return []harnessCall{
			{Op: comm.OpAllGather, Elems: 1, ESize: 4},
			{Op: comm.OpAllGatherV, ESize: 4, Counts: e.perWorker},
			{Op: comm.OpAllReduce, Elems: len(u), ESize: 4},
		}
	}
	return e
}

// blRefTopka is the reference of "topka" (notes 7.2, 7.8).
func blRefTopka(accs [][]float32, k int) blExpect {
	n, N := len(accs), len(accs[0])
	e := blExpect{out: make([]float64, N), outAbs: make([]float64, N), threshold: math.NaN()}
	var sels [][]int32
	for _, a := range accs {
		sel := refTopK(a, k)
		sels = append(sels, sel)
		r := append([]float32(nil), a...)
		for _, j := range sel {
			e.out[j] += float64(a[j]) / float64(n)
			e.outAbs[j] += math.Abs(float64(a[j]))
			r[j] = 0
		}
		e.residual = append(e.residual, r)
		e.selected = append(e.selected, k)
	}
	e.density = float64(len(blUnion(sels))) / float64(N)
	e.calls = func(int) []harnessCall {
		return []harnessCall{
			{Op: comm.OpAllGather, Elems: k, ESize: 4},
			{Op: comm.OpAllGather, Elems: k, ESize: 4},
		}
	}
	return e
}

// blRef computes the expectation of one iteration of method from the accs
// of all workers (it is the iteration number, Lambda the option).
type blRef func(accs [][]float32, k, it int, o Options) blExpect

// blProperty runs method over the standard cases (several iterations each,
// alternating generators, error feedback and in-place residuals) and
// compares every iteration with ref; conserve adds the conservation check.
func blProperty(t *testing.T, method string, cases []harnessCase, ref blRef, conserve bool, opts func(*Options)) {
	gens := []harnessGen{genNormal, genSmallInts, genSparse}
	for ci, c := range cases {
		t.Run(c.String(), func(t *testing.T) {
			cfg := harnessConfig{
				Method: method, Workers: c.Workers, N: c.N, Density: c.Density,
				Iters: 3, Seed: uint64(1000 + ci), Options: opts,
				Feedback: ci%2 == 0, InPlace: ci%3 == 0, Gen: gens[ci%len(gens)],
			}
			res := mustRunHarness(t, cfg)
			var o Options
			if opts != nil {
				opts(&o)
			}
			k := BudgetK(c.Density, c.N)
			for it := range cfg.Iters {
				blCheck(t, res, it, ref(res.Acc[it], k, it, o))
			}
			checkOutputsAgree(t, res)
			if conserve {
				checkConservation(t, res)
			}
		})
	}
}

func TestTopkMatchesReference(t *testing.T) {
	blProperty(t, "topk", standardCases(), func(accs [][]float32, k, _ int, _ Options) blExpect {
		return blRefTopk(accs, k)
	}, true, nil)
}

func TestTopkaMatchesReference(t *testing.T) {
	blProperty(t, "topka", standardCases(), func(accs [][]float32, k, _ int, _ Options) blExpect {
		return blRefTopka(accs, k)
	}, true, nil)
}

// TestTopkBytesHandComputed checks the byte statistics of topk and topka
// against formulas written out by hand from the ring algorithms.
func TestTopkBytesHandComputed(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		const N, density = 103, 0.05 // k = 5
		k := 5
		for _, method := range []string{"topk", "topka"} {
			t.Run(fmt.Sprintf("%s/n=%d", method, n), func(t *testing.T) {
				res := mustRunHarness(t, harnessConfig{Method: method, Workers: n, N: N, Density: density, Seed: 7})
				u := int(math.Round(res.Stats[0][0].ActualDensity * N))
				for r := range n {
					var wantSent, wantRecv int64
					if n > 1 {
						switch method {
						case "topk":
							// count all-gather: 4 bytes from each of the other n−1 ranks;
							// index all-gather: k int32 from each; ring all-reduce of u
							// float32: reduce-scatter sends every chunk but rank r's and
							// receives every chunk but rank r−1's; the all-gather sends
							// every chunk but rank r+1's and receives every chunk but r's.
							chunk := func(i int) int {
								i = (i + n) % n
								c := u / n
								if i < u%n {
									c++
								}
								return c
							}
							gather := int64(4*(n-1) + 4*k*(n-1))
							wantSent = gather + int64(4*(2*u-chunk(r)-chunk(r+1)))
							wantRecv = gather + int64(4*(2*u-chunk(r-1)-chunk(r)))
						case "topka":
							wantSent = int64(2 * 4 * k * (n - 1))
							wantRecv = wantSent
						}
					}
					st := res.Stats[0][r]
					if st.BytesSent != wantSent || st.BytesRecv != wantRecv {
						t.Fatalf("rank %d: sent/received %d/%d bytes, want %d/%d", r, st.BytesSent, st.BytesRecv, wantSent, wantRecv)
					}
				}
			})
		}
	}
}

// TestTopkUnionGrowsWithWorkers: with independent random accs the union of
// the workers' top-k, and so the actual density, grows with n, while CLT-k
// stays at k/N.
func TestTopkUnionGrowsWithWorkers(t *testing.T) {
	const N, density = 5000, 0.01
	k := BudgetK(density, N)
	prev := 0.0
	for _, n := range []int{1, 2, 4, 8, 16} {
		res := mustRunHarness(t, harnessConfig{Method: "topk", Workers: n, N: N, Density: density, Seed: 3})
		d := res.Stats[0][0].ActualDensity
		if n == 1 && d != float64(k)/N {
			t.Fatalf("n=1: actual density %v, want k/N = %v", d, float64(k)/N)
		}
		if d <= prev {
			t.Fatalf("topk actual density %v at n=%d does not exceed %v at the previous n", d, n, prev)
		}
		prev = d
		cl := mustRunHarness(t, harnessConfig{Method: "cltk", Workers: n, N: N, Density: density, Seed: 3, Iters: 2})
		for it := range cl.Stats {
			for w, st := range cl.Stats[it] {
				if st.ActualDensity > float64(k)/N {
					t.Fatalf("cltk n=%d rank %d: actual density %v exceeds k/N = %v", n, w, st.ActualDensity, float64(k)/N)
				}
			}
		}
	}
}

// TestReducersRejectBadArguments: for every registered method, wrong
// lengths and out aliasing are errors.
func TestReducersRejectBadArguments(t *testing.T) {
	for _, method := range Names() {
		t.Run(method, func(t *testing.T) {
			l, _ := FlatLayout(10)
			c := blSingleComm(t)
			r, err := New(method, Options{Density: 0.2, Layout: l, Comm: c})
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
			if r.Name() != method {
				t.Fatalf("Name() = %q", r.Name())
			}
		})
	}
}

// blSingleComm is rank 0 of a one-rank in-process world.
func blSingleComm(t *testing.T) comm.Communicator {
	t.Helper()
	return local.New(1).Comm(0)
}

// blBenchN is the size of the benchmark gradient: 11,173,962 elements, the
// parameter count of the CIFAR ResNet-18.
const blBenchN = 11173962

// blBenchReduce measures one Reduce call of every one of n in-process
// workers (run concurrently, as in training) per benchmark iteration, on
// fixed random accs of blBenchN elements.
func blBenchReduce(b *testing.B, method string, n int, density float64, lambda float64) {
	l, err := FlatLayout(blBenchN)
	if err != nil {
		b.Fatal(err)
	}
	world := local.New(n)
	rs := make([]*Reducer, n)
	accs, outs, resids := make([][]float32, n), make([][]float32, n), make([][]float32, n)
	params := Values{}
	if lambda != 0 {
		params["lambda"] = lambda
	}
	for w := range n {
		if rs[w], err = New(method, Options{Density: density, Layout: l, Comm: world.Comm(w), Params: params}); err != nil {
			b.Fatal(err)
		}
		accs[w] = make([]float32, blBenchN)
		genNormal(harnessRNG(42, 0, w), accs[w])
		outs[w], resids[w] = make([]float32, blBenchN), make([]float32, blBenchN)
	}
	stats := make([]Stats, n)
	run := func() {
		errs := make(chan error, n)
		for w := range n {
			go func() {
				var err error
				stats[w], err = rs[w].Reduce(b.Context(), accs[w], outs[w], resids[w])
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
	}
	run() // warm up buffers
	b.ResetTimer()
	var sel, com float64
	for range b.N {
		run()
		sel += stats[0].SelectTime.Seconds()
		com += stats[0].CommTime.Seconds()
	}
	b.ReportMetric(float64(stats[0].BytesSent), "B-sent/op")
	b.ReportMetric(stats[0].ActualDensity, "actual-density")
	b.ReportMetric(sel/float64(b.N)*1e3, "select-ms/op")
	b.ReportMetric(com/float64(b.N)*1e3, "comm-ms/op")
}

// BenchmarkBaselineReduce: 4 workers, N = 11,173,962, density 0.01, standard
// normal accs. threshold runs with λ = 2.5758, which selects 1% of standard
// normal values (the default 1/(2√k) ≈ 0.0015 would select almost all).
func BenchmarkBaselineReduce(b *testing.B) {
	for _, m := range []string{"topk", "topka", "dense", "cltk", "gtopk", "threshold"} {
		lambda := 0.0
		if m == "threshold" {
			lambda = 2.5758
		}
		b.Run(m+"/n=4/N=11173962/rho=0.01", func(b *testing.B) { blBenchReduce(b, m, 4, 0.01, lambda) })
	}
	// One worker: the local computation alone (no traffic), which is what
	// each rank pays per call besides communication.
	for _, m := range []string{"topk", "topka"} {
		b.Run(m+"/n=1/N=11173962/rho=0.01", func(b *testing.B) { blBenchReduce(b, m, 1, 0.01, 0) })
	}
}

// TestBaselinesIgnoreTensorBoundaries: the baselines work on the flat vector,
// so a multi-tensor layout (with size-1 tensors) gives bit-identical results
// to the flat layout of the same size.
func TestBaselinesIgnoreTensorBoundaries(t *testing.T) {
	rng := harnessRNG(21, 0, 0)
	for _, m := range []string{"dense", "topk", "topka", "gtopk", "cltk", "threshold"} {
		for _, n := range []int{1, 2, 4} {
			l, err := randomLayout(rng, 301)
			if err != nil {
				t.Fatal(err)
			}
			cfg := harnessConfig{Method: m, Workers: n, N: 301, Density: 0.05, Seed: 8, Iters: 2, Feedback: true}
			flat := mustRunHarness(t, cfg)
			cfg.Layout = l
			multi := mustRunHarness(t, cfg)
			for it := range 2 {
				for w := range n {
					checkClose(t, fmt.Sprintf("%s n=%d it=%d rank %d out", m, n, it, w), multi.Out[it][w], flat.Out[it][w], nil)
					checkClose(t, fmt.Sprintf("%s n=%d it=%d rank %d residual", m, n, it, w), multi.Residual[it][w], flat.Residual[it][w], nil)
				}
			}
		}
	}
}
