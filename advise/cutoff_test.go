package advise

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// TestCutOffMatchesReducers: with a size cut-off (min_compress_size), the
// calls the advisor predicts for each rank (the method's plan over the
// tensors at or above it, plus one all-reduce of those below) are those the
// real reducer makes on that rank, and the actual density counts the dense tensors; a cut-off
// that leaves nothing to the method is one all-reduce.
func TestCutOffMatchesReducers(t *testing.T) {
	sizes := []int{1000, 37, 2500, 130, 7, 1}
	N := 0
	for _, s := range sizes {
		N += s
	}
	for _, method := range []string{"topk", "topka", "randomk", "cltk", "gtopk", "micro", "deft", "dgc", "threshold", "spardl"} {
		for _, cut := range []int{200, 1, 5000} {
			for _, P := range []int{1, 2, 3, 5, 16} {
				m, _ := sparsify.Lookup(method)
				params, err := m.Resolve(sparsify.Values{minCompress: cut})
				if err != nil {
					t.Fatal(err)
				}
				if m.CheckWorkers != nil && m.CheckWorkers(P, params) != nil {
					continue
				}
				density := 0.05
				name := fmt.Sprintf("%s/cut=%d/P=%d", method, cut, P)
				got := runReducer(t, method, sizes, P, density, params, 3)
				big, dense := cutSizes(sizes, cutOff(method, params))
				Nb := N - dense
				st := got.stats[0]
				for r := range P {
					var calls []Call
					if Nb > 0 {
						sh := Shape{Sizes: big, N: Nb, P: P, Rank: r, Density: density, K: sparsify.BudgetK(density, Nb),
							Sel: float64(got.stats[r].Selected - dense), Union: st.ActualDensity*float64(N) - float64(dense), Params: params}
						if calls, err = Plan(method, sh); err != nil {
							t.Fatalf("%s: %v", name, err)
						}
					}
					calls = withDense(calls, dense)
					for _, e := range compareCalls(calls, got.ops[r], 0) {
						t.Errorf("%s rank %d: %s", name, r, e)
					}
				}
				if Nb == 0 && st.ActualDensity != 1 {
					t.Errorf("%s: every tensor below the cut-off, actual density %v, want 1", name, st.ActualDensity)
				}
			}
		}
	}
}

// TestCutOffPredicted: Predict counts the tensors below the cut-off as
// dense (the actual density at least their share, a caveat saying so), and
// a method that reduces its own groups during the backward pass refuses a
// cut-off that leaves a tensor below it, in the advisor as in its reducer,
// naming the option.
func TestCutOffPredicted(t *testing.T) {
	h := synthHost() // tensors of 600,000 and 400,000 elements
	cut := sparsify.Values{minCompress: 500_000}
	plain, err := Predict(h, Setting{Method: "randomk", Workers: 4, Density: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := Predict(h, Setting{Method: "randomk", Workers: 4, Density: 0.01, Params: cut})
	if err != nil {
		t.Fatal(err)
	}
	if pr.ActualDensity < 0.4 || pr.BytesSent < plain.BytesSent+Bytes([]Call{{Op: comm.OpAllReduce, Count: 1, Elems: 400_000}}, 4)*0.99 {
		t.Errorf("randomk with the 400,000-element tensor below the cut-off: actual density %v, %v bytes (without: %v bytes); want at least 0.4 and the tensor's all-reduce more", pr.ActualDensity, pr.BytesSent, plain.BytesSent)
	}
	if !slices.ContainsFunc(pr.Caveats, func(c string) bool { return strings.Contains(c, minCompress) }) {
		t.Errorf("caveats %q do not say the small tensors are dense", pr.Caveats)
	}
	if _, err := Predict(h, Setting{Method: "lags", Workers: 4, Density: 0.01, Params: cut}); err == nil || !strings.Contains(err.Error(), minCompress) {
		t.Fatalf("lags with %s: err %v, want a refusal naming the option", minCompress, err)
	}
}

// Bytes is the number of bytes a worker sends per iteration under the
// calls, on average over the workers, each making the same calls
// (comm.Traffic's accounting, equal contributions; a broadcast's root sends
// more than the others). PlanBytes takes each worker's own calls.
func Bytes(calls []Call, P int) float64 {
	var sum float64
	for r := range P {
		sum += rankBytes(calls, P, r)
	}
	return sum / float64(max(P, 1))
}
