package advise

import (
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// synthHost is a made-up machine and model: two tensors, fixed step and
// selection times, and unions that grow exactly as √P (γ = 1/2).
func synthHost() *Host {
	const rho = 0.01
	lay, _ := layout.New([]string{"a", "b"}, []int{600_000, 400_000})
	return &Host{Model: "synthetic", Layout: lay, Cores: 2,
		Forward: 0.04, Backward: 0.06, Compute: 0.1, Update: 0.01, Other: 0.003,
		Selections: []Selection{
			{"topk", rho, 2, 0.02, 0.002}, {"topka", rho, 2, 0.021, 0.001}, {"cltk", rho, 2, 0.019, 0.0005}, {"randomk", rho, 2, 0.001, 0},
		},
		Unions:      []Union{{Density: rho, TopK: []float64{rho, rho * math.Sqrt(2), rho * math.Sqrt(3), rho * 2}}},
		GradWorkers: 4, HostNets: []HostNet{{2, time.Microsecond, 5e9}}}
}

// The plain reference: the α-β formulas written out for each collective,
// with Auto's choice of the faster algorithm.
func refLg(n int) float64 { return float64(bits.Len(uint(n - 1))) }

func refAllReduce(P int, m, a, b float64) float64 {
	if P == 1 {
		return 0
	}
	ring := 2*float64(P-1)*a + 2*float64(P-1)/float64(P)*m/b
	steps := math.Floor(math.Log2(float64(P)))
	if P&(P-1) != 0 {
		steps += 2
	}
	return math.Min(ring, steps*(a+m/b))
}

func refAllGather(P int, m, a, b float64) float64 { // m bytes per rank
	if P == 1 {
		return 0
	}
	return math.Min(float64(P-1)*a+float64(P-1)*m/b, refLg(P)*a+float64(P-1)*m/b)
}

func refBroadcast(P int, m, a, b float64) float64 {
	if P == 1 {
		return 0
	}
	return math.Min(refLg(P)*(a+m/b), (refLg(P)+float64(P-1))*a+2*float64(P-1)/float64(P)*m/b)
}

// refIter is the reference time per iteration of the four methods of
// synthHost on P workers over (α, β): compute + selection + the method's
// collectives + update + the rest of the step and of the reducer.
func refIter(method string, P int, a, b float64) float64 {
	const N, K = 1_000_000.0, 10_000.0
	base := 0.1 + 0.01 + 0.003 // compute, update, the rest of the step
	switch method {
	case "dense":
		return base + refAllReduce(P, 4*N, a, b)
	case "randomk":
		return base + 0.001 + refAllReduce(P, 4*K, a, b)
	case "cltk":
		return base + 0.019 + 0.0005 + refBroadcast(P, 4*K, a, b) + refAllReduce(P, 4*K, a, b)
	case "topka":
		return base + 0.021 + 0.001 + 2*refAllGather(P, 4*K, a, b)
	case "topk":
		u := math.Min(K*math.Sqrt(float64(P)), N*(1-math.Pow(1-K/N, float64(P))))
		return base + 0.02 + 0.002 + refAllGather(P, 4, a, b) + refAllGather(P, 4*K, a, b) + refAllReduce(P, 4*u, a, b)
	}
	panic(method)
}

// TestRankMatchesReference ranks four methods and dense on a synthetic
// host for awkward worker counts and two networks and compares every
// predicted iteration time, the order and the speedups with the plain
// reference computation, and "dense wins" with the reference's verdict.
func TestRankMatchesReference(t *testing.T) {
	h := synthHost()
	methods := []string{"topk", "topka", "cltk", "randomk", "dense"}
	sawDenseWin, sawSparseWin := false, false
	for _, gbit := range []float64{1, 10, 100, 400} {
		net := netmodel.Network{Latency: 50 * time.Microsecond, Bandwidth: gbit * 1e9 / 8}
		for _, P := range []int{1, 2, 3, 5, 16, 64, 256} {
			name := fmt.Sprintf("%g Gbit/s, P=%d", gbit, P)
			got, skipped, err := Rank(h, Setting{Workers: P, Density: 0.01, Net: net, NoOverlap: true}, methods) // the reference is dense after the backward pass (overlapped dense: TestDDPScheduleMatchesReference)
			if err != nil || len(skipped) > 0 {
				t.Fatalf("%s: %v %v", name, err, skipped)
			}
			type ref struct {
				m    string
				iter float64
			}
			var want []ref
			for _, m := range methods {
				want = append(want, ref{m, refIter(m, P, net.Latency.Seconds(), net.Bandwidth)})
			}
			sort.SliceStable(want, func(i, j int) bool { return want[i].iter < want[j].iter })
			dense := refIter("dense", P, net.Latency.Seconds(), net.Bandwidth)
			if len(got) != len(want) {
				t.Fatalf("%s: %d predictions, want %d", name, len(got), len(want))
			}
			for i := range want {
				g := got[i]
				if g.Method != want[i].m && math.Abs(g.Iter-want[i].iter) > 1e-9 {
					t.Errorf("%s: rank %d is %s (%.6g s), reference says %s (%.6g s)", name, i+1, g.Method, g.Iter, want[i].m, want[i].iter)
				}
				r := refIter(g.Method, P, net.Latency.Seconds(), net.Bandwidth)
				if math.Abs(g.Iter-r) > 1e-9*r+2e-8 { // the model rounds each call to nanoseconds
					t.Errorf("%s: %s iteration %.9g s, reference %.9g s", name, g.Method, g.Iter, r)
				}
				if math.Abs(g.Speedup-dense/r) > 1e-6*dense/r {
					t.Errorf("%s: %s speedup %.6g, reference %.6g", name, g.Method, g.Speedup, dense/r)
				}
			}
			if DenseWins(got) != (want[0].m == "dense") {
				t.Errorf("%s: DenseWins = %v, but the reference's fastest is %s", name, DenseWins(got), want[0].m)
			}
			if want[0].m == "dense" {
				sawDenseWin = true
			} else {
				sawSparseWin = true
			}
		}
	}
	if !sawDenseWin || !sawSparseWin {
		t.Errorf("the synthetic case should have settings where dense wins (%v) and where it loses (%v)", sawDenseWin, sawSparseWin)
	}
}

// TestPredictDensityBuildUp checks the expected actual density: top-k's
// union grows as measured (√P here, capped by independent selections),
// CLT-k's and random-k's stay at ρ, and the build-up caveat appears only
// where the union grows.
func TestPredictDensityBuildUp(t *testing.T) {
	h := synthHost()
	for _, P := range []int{1, 2, 3, 16, 256} {
		for _, m := range []string{"topk", "cltk", "randomk"} {
			p, err := Predict(h, Setting{Method: m, Workers: P, Density: 0.01, Net: netmodel.Ethernet10G})
			if err != nil {
				t.Fatal(err)
			}
			want := 0.01
			if m == "topk" {
				want = math.Min(0.01*math.Sqrt(float64(P)), 1-math.Pow(0.99, float64(P)))
			}
			if math.Abs(p.ActualDensity-want) > 1e-12 {
				t.Errorf("%s P=%d: actual density %.6g, want %.6g", m, P, p.ActualDensity, want)
			}
			hasBuildUp := false
			for _, c := range p.Caveats {
				hasBuildUp = hasBuildUp || containsAll(c, "builds up")
			}
			if hasBuildUp != (want > 0.015) {
				t.Errorf("%s P=%d: build-up caveat %v with actual density %.3g: %q", m, P, hasBuildUp, want, p.Caveats)
			}
		}
	}
}

// TestPredictRefuses checks the errors: unknown method, missing
// measurements, impossible worker counts.
func TestPredictRefuses(t *testing.T) {
	h := synthHost()
	for _, c := range []struct {
		s    Setting
		want string
	}{
		{Setting{Method: "nosuch", Workers: 4, Density: 0.01}, "unknown method"},
		{Setting{Method: "topk", Workers: 0, Density: 0.01}, "want at least 1"},
		{Setting{Method: "topk", Workers: 4, Density: 0.05}, "no union measured at density 0.05"},
		{Setting{Method: "deft", Workers: 4, Density: 0.01}, "no selection time measured"},
		{Setting{Method: "gtopk", Workers: 3, Density: 0.01}, "power"},
		{Setting{Method: "spardl", Workers: 6, Density: 0.01, Params: sparsify.Values{"teams": 4}}, "teams"},
	} {
		_, err := Predict(h, c.s)
		if err == nil || !containsAll(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one saying %q", c.s, err, c.want)
		}
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// TestGrowth checks the union exponent fit on exact power laws and its
// clamping to [0, 1].
func TestGrowth(t *testing.T) {
	for _, g := range []float64{0, 0.3, 0.5, 0.82, 1} {
		u := make([]float64, 8)
		for p := range u {
			u[p] = 0.01 * math.Pow(float64(p+1), g)
		}
		if got := growth(u); math.Abs(got-g) > 1e-12 {
			t.Errorf("γ = %g: fitted %g", g, got)
		}
	}
	if got := growth([]float64{0.1, 0.05}); got != 0 {
		t.Errorf("shrinking union: γ = %g, want 0", got)
	}
	if got := growth([]float64{0.01}); got != 1 {
		t.Errorf("one worker: γ = %g, want 1 (nothing measured: independent)", got)
	}
}

// TestHostNet checks which in-process measurement a worker count uses: its
// own, else the largest below it, else the smallest.
func TestHostNet(t *testing.T) {
	h := &Host{HostNets: []HostNet{{8, 8, 1}, {2, 2, 1}, {4, 4, 1}}}
	for P, want := range map[int]time.Duration{1: 2, 2: 2, 3: 2, 4: 4, 5: 4, 8: 8, 64: 8} {
		if got := h.hostNet(P).Latency; got != want {
			t.Errorf("P=%d: the measurement of %d workers, want %d", P, got, want)
		}
	}
	if n := (&Host{}).hostNet(4); n.Latency != 0 || !math.IsInf(n.Bandwidth, 1) {
		t.Errorf("nothing measured: %+v, want a free network", n)
	}
}

// TestVerdict reads the verdict sentence for the four cases: dense wins,
// dense wins by less than 5 % (it read "the best takes 1.00× as long"), a
// sparsifier barely wins, a sparsifier clearly wins.
func TestVerdict(t *testing.T) {
	dense := Prediction{Method: "dense", Iter: 0.1, Speedup: 1}
	for _, c := range []struct {
		ranked []Prediction
		want   string
	}{
		{[]Prediction{dense, {Method: "topk", Iter: 0.12, Speedup: 0.1 / 0.12}}, "Dense all-reduce wins: no sparsifier is predicted to be faster per iteration here (the best, topk, takes 1.20× as long)"},
		{[]Prediction{dense, {Method: "randomk", Iter: 0.1001, Speedup: 0.1 / 0.1001}}, "Dense all-reduce wins, narrowly: the best sparsifier, randomk, is predicted at 100 ms per iteration against dense's 100 ms (1.001× as long)"},
		{[]Prediction{{Method: "deft", Iter: 0.098, Speedup: 0.1 / 0.098}, dense}, "Sparsifying barely pays off here: the fastest, deft, is only 1.02× dense all-reduce's speed (98 ms vs 100 ms per iteration)"},
		{[]Prediction{{Method: "deft", Iter: 0.025, Speedup: 4}, dense}, "deft is predicted fastest: 4.00× the iterations per second of dense all-reduce (25 ms vs 100 ms per iteration)"},
	} {
		if got := Verdict(c.ranked); !strings.HasPrefix(got, c.want) {
			t.Errorf("verdict %q, want it to start with %q", got, c.want)
		}
	}
}

// TestPredictOkTopkDensity: Ok-Topk gathers about k pairs per call, but
// every 32nd call gathers all the non-zero region sums, the union of the
// workers' local selections (√P·k on synthHost): the expected actual
// density is the average over the 32 calls.
func TestPredictOkTopkDensity(t *testing.T) {
	h := synthHost()
	h.Selections = append(h.Selections, Selection{"oktopk", 0.01, 2, 0.02, 0.001})
	for _, P := range []int{1, 2, 3, 16, 256} {
		p, err := Predict(h, Setting{Method: "oktopk", Workers: P, Density: 0.01, Net: netmodel.Ethernet10G})
		if err != nil {
			t.Fatal(err)
		}
		union := math.Min(0.01*math.Sqrt(float64(P)), 1-math.Pow(0.99, float64(P)))
		if want := (31*0.01 + union) / 32; math.Abs(p.ActualDensity-want) > 1e-12 {
			t.Errorf("P=%d: actual density %.6g, want %.6g", P, p.ActualDensity, want)
		}
	}
}

// TestPredictSimulatedParallelStep: without measurements of simulated
// runs, P simulated workers are extrapolated from one: E = min(P, cores)
// executors run steps at once, so a turn takes the step's CPU time
// (StepCores × the step; unknown StepCores counts as 1) times E/cores, at
// least one step, and the worker whose turn comes last waits ⌈P/E⌉ − 1
// turns; selections and the rest share the cores (× P/cores); rank 0 alone
// updates the shared parameters (the update stays one worker's).
func TestPredictSimulatedParallelStep(t *testing.T) {
	for _, tc := range []struct {
		stepCores   float64
		P           int
		turn, turns float64 // the turn in steps, the turns waited
	}{{2, 2, 2, 0}, {2, 4, 2, 1}, {2, 1, 1, 0}, {1, 2, 1, 0}, {1, 4, 1, 1}, {0, 4, 1, 1}, {1.5, 4, 1.5, 1}, {1, 16, 1, 7}} {
		h := synthHost()
		h.StepCores = tc.stepCores
		p, err := Predict(h, Setting{Method: "dense", Workers: tc.P, Density: 0.01, Simulated: true})
		if err != nil {
			t.Fatal(err)
		}
		if want := h.Compute * tc.turn; math.Abs(p.Compute-want) > 1e-12 {
			t.Errorf("StepCores %v, %d workers: compute %v, want %v (a turn of %v steps)", tc.stepCores, tc.P, p.Compute, want, tc.turn)
		}
		if want := h.Compute * tc.turn * tc.turns; math.Abs(p.Queue-want) > 1e-12 {
			t.Errorf("StepCores %v, %d workers: queue %v, want %v (%v turns)", tc.stepCores, tc.P, p.Queue, want, tc.turns)
		}
		if p.Update != h.Update {
			t.Errorf("StepCores %v, %d workers: update %v, want one worker's %v", tc.stepCores, tc.P, p.Update, h.Update)
		}
		if want := h.Other * max(1, float64(tc.P)/2); math.Abs(p.Other-want) > 1e-12 {
			t.Errorf("StepCores %v, %d workers: other %v, want %v", tc.stepCores, tc.P, p.Other, want)
		}
		// Overlapped dense (the default): only the tail after the turn's
		// backward pass adds to the iteration; -overlap off: the phases
		// add up to it.
		if !p.Overlapped || p.Exposed > p.Comm {
			t.Errorf("StepCores %v, %d workers: overlapped %v, exposed %v of %v", tc.stepCores, tc.P, p.Overlapped, p.Exposed, p.Comm)
		}
		if sum := p.Queue + p.Compute + p.Select + p.Exposed + p.Other + p.Update; math.Abs(p.Iter-sum) > 1e-12 {
			t.Errorf("StepCores %v, %d workers: iteration %v, the phases with the exposed tail add up to %v", tc.stepCores, tc.P, p.Iter, sum)
		}
		off, err := Predict(h, Setting{Method: "dense", Workers: tc.P, Density: 0.01, Simulated: true, NoOverlap: true})
		if err != nil {
			t.Fatal(err)
		}
		if sum := off.Queue + off.Compute + off.Select + off.Comm + off.Other + off.Update; off.Overlapped || math.Abs(off.Iter-sum) > 1e-12 {
			t.Errorf("StepCores %v, %d workers, -overlap off: iteration %v, the phases add up to %v", tc.stepCores, tc.P, off.Iter, sum)
		}
	}
}

// TestPredictSimulatedMeasured: with a sweep's measurements of simulated
// runs at P, the prediction takes each phase from them (numbers worked out
// by hand): the dense run's queue, compute and update (less the lag of its
// barrier behind dense all-reduce, plus the method's), the method's
// reducer on P workers, and the dense run's error feedback (its t_wait less
// dense all-reduce's reducer); on an emulated network communication is at
// least the α-β model's.
func TestPredictSimulatedMeasured(t *testing.T) {
	h := synthHost()
	h.SimSteps = []SimStep{{Workers: 4, Queue: 0.3, Compute: 0.12, Wait: 0.05, Update: 0.02, Iter: 0.49, Steps: 10}}
	h.SimReduces = []SimReduce{
		{Method: "dense", Density: 1, Workers: 4, Comm: 0.03, Other: 0.005, Lag: 0.004},
		{Method: "topk", Density: 0.01, Workers: 4, Select: 0.04, Comm: 0.02, Other: 0.003, Lag: 0.01},
	}
	p, err := Predict(h, Setting{Method: "topk", Workers: 4, Density: 0.01, Simulated: true})
	if err != nil {
		t.Fatal(err)
	}
	// error feedback 0.05 − (0 + 0.03 + 0.005) = 0.015; update 0.02 − 0.004 + 0.01.
	want := Prediction{Queue: 0.3, Compute: 0.12, Select: 0.04, Comm: 0.02, Other: 0.018, Update: 0.026}
	want.Iter = 0.3 + 0.12 + 0.04 + 0.02 + 0.018 + 0.026
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"queue", p.Queue, want.Queue}, {"compute", p.Compute, want.Compute}, {"select", p.Select, want.Select}, {"comm", p.Comm, want.Comm},
		{"other", p.Other, want.Other}, {"update", p.Update, want.Update}, {"iter", p.Iter, want.Iter}} {
		if math.Abs(c.got-c.want) > 1e-12 {
			t.Errorf("%s %v, want %v", c.name, c.got, c.want)
		}
	}
	// On an emulated network the measurements of that network count: the
	// in-process ones do not stand for it.
	slow := netmodel.Network{Latency: time.Millisecond, Bandwidth: 125e3}
	q, err := Predict(h, Setting{Method: "topk", Workers: 4, Density: 0.01, Simulated: true, Net: slow})
	if err != nil {
		t.Fatal(err)
	}
	if q.Queue != (4/2-1)*h.Compute {
		t.Errorf("on a network not measured: queue %v, want the extrapolation's one turn of %v", q.Queue, h.Compute)
	}
	h.SimSteps = append(h.SimSteps, SimStep{Workers: 4, Latency: slow.Latency, Bandwidth: slow.Bandwidth, Queue: 0.4, Compute: 0.12, Wait: 0.9, Update: 0.02, Iter: 1.44})
	h.SimReduces = append(h.SimReduces,
		SimReduce{Method: "dense", Density: 1, Workers: 4, Latency: slow.Latency, Bandwidth: slow.Bandwidth, Comm: 0.85, Other: 0.005, Lag: 0.004},
		SimReduce{Method: "topk", Density: 0.01, Workers: 4, Latency: slow.Latency, Bandwidth: slow.Bandwidth, Select: 0.04, Comm: 0.3, Other: 0.003, Lag: 0.01})
	q, err = Predict(h, Setting{Method: "topk", Workers: 4, Density: 0.01, Simulated: true, Net: slow})
	if err != nil {
		t.Fatal(err)
	}
	// error feedback 0.9 − 0.855 = 0.045 (+ 0.003); update 0.02 − 0.004 + 0.01; spread 0.
	if q.Queue != 0.4 || q.Comm != 0.3 || math.Abs(q.Other-0.048) > 1e-12 || math.Abs(q.Update-0.026) > 1e-12 || math.Abs(q.Iter-(0.4+0.12+0.04+0.3+0.048+0.026)) > 1e-12 {
		t.Errorf("on the measured network: %+v", q)
	}
	// No measurement at 8 workers: extrapolated.
	r, err := Predict(h, Setting{Method: "topk", Workers: 8, Density: 0.01, Simulated: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Queue != (4-1)*h.Compute {
		t.Errorf("8 workers, not measured: queue %v, want 3 turns of %v", r.Queue, h.Compute)
	}
}

// DenseWins reports whether dense all-reduce is predicted to be the
// fastest of ranked (as Rank orders them).
func DenseWins(ranked []Prediction) bool {
	return len(ranked) > 0 && ranked[0].Method == "dense"
}
