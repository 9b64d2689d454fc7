package advise

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// strided is the core of the method the test below registers: every
// worker all-reduces the k elements at the fixed stride ⌊N/k⌋ (no
// selection), out is their average, the residual acc with them zeroed.
// It works on host memory (the CPU's).
type strided struct{ e *sparsify.Env }

func (r strided) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *sparsify.GroupStats) error {
	a, o, res := acc.Float32s(), out.Float32s(), residual.Float32s()
	N, k := r.e.N(), r.e.K()
	stride := N / k
	t0 := time.Now()
	buf := make(comm.Float32s, k)
	for i := range buf {
		buf[i] = a[i*stride]
	}
	sel := time.Since(t0)
	if err := r.e.Comm().AllReduce(ctx, buf); err != nil {
		return err
	}
	copy(res, a)
	clear(o)
	for i, v := range buf {
		o[i*stride] = v / float32(r.e.Comm().Size())
		res[i*stride] = 0
	}
	st.Selected, st.Distinct, st.SelectTime = k, k, sel
	return nil
}

func newStrided(e *sparsify.Env) (sparsify.Core, error) { return strided{e}, nil }

// stridedCaveat is the caveat the new method declares.
const stridedCaveat = "zz-strided: a stride ignores the gradients' magnitudes"

// registerStrided registers zz-strided once (tests may run more than once
// in one process), with its advisor facts declared as any method's are,
// beside its reducer.
func registerStrided() {
	if _, ok := sparsify.Lookup("zz-strided"); ok {
		return
	}
	sparsify.Register(sparsify.Method{Name: "zz-strided", Projectable: true,
		New: newStrided,
		Advice: &sparsify.Advice{
			Plan: func(s sparsify.Shape) ([]sparsify.Call, error) {
				return []sparsify.Call{{Op: comm.OpAllReduce, Count: 1, Elems: float64(s.K)}}, nil
			},
			Volume:    func(s sparsify.Shape, _ sparsify.Overlap) (sel, union float64) { return float64(s.K), float64(s.K) },
			Selection: sparsify.SelectsWhole,
			Caveats:   func(sparsify.Conditions) []string { return []string{stridedCaveat} },
			Evidence:  sparsify.Evidence{Papers: "a test method: no paper shows it"},
		}})
}

// TestNewMethodNeedsNoAdvisorChange: a method registered with its advisor
// facts (sparsify.Advice) beside its reducer is planned, measured,
// predicted, ranked and tabled without any change to package advise: its
// declared traffic matches its real reducer's counters, its selection is
// measured on in-process workers, and its predicted iteration is the plain
// reference's (compute, selection, one all-reduce of k elements, update,
// the rest) with its declared caveat.
func TestNewMethodNeedsNoAdvisorChange(t *testing.T) {
	registerStrided()
	sizes := []int{1000, 37, 2500, 130, 7, 1}
	N := 3675
	for _, P := range []int{1, 2, 3, 5, 16} {
		for _, rho := range []float64{0.05, 1e-6} {
			got := runReducer(t, "zz-strided", sizes, P, rho, nil, 2)
			s := Shape{Sizes: sizes, N: N, P: P, Density: rho, K: sparsify.BudgetK(rho, N),
				Sel: float64(got.stats[0].Selected), Union: got.stats[0].ActualDensity * float64(N), Params: sparsify.Values{}}
			calls, err := Plan("zz-strided", s)
			if err != nil {
				t.Fatalf("P=%d ρ=%g: %v", P, rho, err)
			}
			for _, e := range compareCalls(calls, got.ops[0], 0) {
				t.Errorf("P=%d ρ=%g: %s", P, rho, e)
			}
		}
	}

	// Measured like every method: its selection on in-process workers.
	l, err := layoutOf(sizes)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	grads := make([][]float32, 2)
	for r := range grads {
		grads[r] = make([]float32, N)
		for i := range grads[r] {
			grads[r][i] = float32(rng.NormFloat64())
		}
	}
	sel, err := measureSelection(context.Background(), device.CPU, nil, "zz-strided", 0.05, l, grads, nil)
	if err != nil || sel.Method != "zz-strided" || sel.Workers != selectionWorkers || !(sel.Seconds >= 0) {
		t.Fatalf("measuring the new method's selection: %+v, %v", sel, err)
	}

	h := synthHost()
	h.Selections = append(h.Selections, Selection{"zz-strided", 0.01, 2, 0.005, 0.0007})
	const K = 10_000.0
	for _, P := range []int{1, 3, 16, 64} {
		net := netmodel.Network{Latency: 50 * time.Microsecond, Bandwidth: 10e9 / 8}
		ranked, skipped, err := Rank(h, Setting{Workers: P, Density: 0.01, Net: net}, []string{"zz-strided", "topk", "dense"})
		if err != nil || len(skipped) > 0 {
			t.Fatalf("P=%d: %v %v", P, err, skipped)
		}
		var p *Prediction
		for i := range ranked {
			if ranked[i].Method == "zz-strided" {
				p = &ranked[i]
			}
		}
		if p == nil {
			t.Fatalf("P=%d: the new method is not ranked: %+v", P, ranked)
		}
		want := 0.1 + 0.01 + 0.003 + 0.005 + 0.0007 + refAllReduce(P, 4*K, net.Latency.Seconds(), net.Bandwidth)
		if math.Abs(p.Iter-want) > 1e-9*want+2e-8 {
			t.Errorf("P=%d: iteration %.9g s, reference %.9g s", P, p.Iter, want)
		}
		if p.ActualDensity != 0.01 {
			t.Errorf("P=%d: actual density %v, want ρ = 0.01", P, p.ActualDensity)
		}
		if len(p.Caveats) != 1 || p.Caveats[0] != stridedCaveat {
			t.Errorf("P=%d: caveats %q, want the declared one", P, p.Caveats)
		}
		var b bytes.Buffer
		if err := WriteTable(&b, h, Setting{Workers: P, Density: 0.01, Net: net}, ranked, skipped); err != nil {
			t.Fatal(err)
		}
		for _, w := range []string{"zz-strided *", "zz-strided: " + stridedCaveat, fmt.Sprintf("%d workers", P), "zz-strided: a test method: no paper shows it"} {
			if !strings.Contains(b.String(), w) {
				t.Errorf("P=%d: the table lacks %q:\n%s", P, w, b.String())
			}
		}
	}
}

// TestMethodWithoutAdviceIsRefused: a method registered without advisor
// facts is not predicted, and the error says which facts it lacks.
func TestMethodWithoutAdviceIsRefused(t *testing.T) {
	if _, ok := sparsify.Lookup("zz-mute"); !ok {
		sparsify.Register(sparsify.Method{Name: "zz-mute", Projectable: true,
			New: newStrided})
	}
	_, err := Predict(synthHost(), Setting{Method: "zz-mute", Workers: 4, Density: 0.01})
	if err == nil || !containsAll(err.Error(), "no traffic model", "zz-mute", "Advice") {
		t.Errorf("error %v, want one saying zz-mute declares no Advice", err)
	}
}
