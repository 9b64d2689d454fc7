package sparsify

import (
	"math"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
)

// blRefThreshold is the reference of "threshold" (notes 7.5): select
// |acc| >= λ (λ = lambda, or 1/(2√k) when lambda is 0), shared-union reduce.
func blRefThreshold(accs [][]float32, k int, lambda float64) blExpect {
	if lambda == 0 {
		lambda = 1 / (2 * math.Sqrt(float64(k)))
	}
	lam := float32(lambda)
	var sels [][]int32
	var counts []int
	for _, a := range accs {
		var s []int32
		for i, v := range a {
			if v >= lam || -v >= lam {
				s = append(s, int32(i))
			}
		}
		sels = append(sels, s)
		counts = append(counts, len(s))
	}
	u := blUnion(sels)
	e := blRefUnion(accs, u)
	e.selected = counts
	e.perWorker = counts
	e.threshold = float64(lam)
	e.calls = func(int) []harnessCall {
		return []harnessCall{
			{Op: comm.OpAllGather, Elems: 1, ESize: 4},
			{Op: comm.OpAllGatherV, ESize: 4, Counts: counts},
			{Op: comm.OpAllReduce, Elems: len(u), ESize: 4},
		}
	}
	return e
}

func TestThresholdMatchesReferenceDefaultLambda(t *testing.T) {
	blProperty(t, "threshold", standardCases(), func(accs [][]float32, k, _ int, _ Options) blExpect {
		return blRefThreshold(accs, k, 0)
	}, true, nil)
}

func TestThresholdMatchesReferenceGivenLambda(t *testing.T) {
	// λ = 2 selects a few percent of normal values, 1.5 and 3 of the small
	// integers (exact ties at the threshold), and λ = 1e9 selects nothing.
	for _, lam := range []float64{2, 1.5, 3, 1e9} {
		t.Run("", func(t *testing.T) {
			blProperty(t, "threshold", standardCases(), func(accs [][]float32, k, _ int, o Options) blExpect {
				return blRefThreshold(accs, k, o.Params["lambda"].(float64))
			}, true, func(o *Options) { o.Params = Values{"lambda": lam} })
		})
	}
}

func TestThresholdRejectsBadLambda(t *testing.T) {
	l, _ := FlatLayout(10)
	for _, lam := range []float64{-1, math.NaN(), math.Inf(1), 1e39} {
		_, err := New("threshold", Options{Density: 0.1, Layout: l, Comm: blSingleComm(t), Params: Values{"lambda": lam}})
		if err == nil || !strings.Contains(err.Error(), "lambda") {
			t.Fatalf("lambda %v: error %v, want one naming lambda", lam, err)
		}
	}
}
