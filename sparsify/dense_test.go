package sparsify

import (
	"math"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
)

// blRefDense is the reference of "dense": out = Σ_w acc_w / n, residual 0.
func blRefDense(accs [][]float32) blExpect {
	n, N := len(accs), len(accs[0])
	e := blExpect{out: make([]float64, N), outAbs: make([]float64, N), threshold: math.NaN(), density: 1}
	for _, a := range accs {
		for i, v := range a {
			e.out[i] += float64(v) / float64(n)
			e.outAbs[i] += math.Abs(float64(v))
		}
		e.residual = append(e.residual, make([]float32, N))
		e.selected = append(e.selected, N)
	}
	e.calls = func(int) []harnessCall {
		return []harnessCall{{Op: comm.OpAllReduce, Elems: N, ESize: 4}}
	}
	return e
}

func TestDenseMatchesReference(t *testing.T) {
	blProperty(t, "dense", standardCases(), func(accs [][]float32, _, _ int, _ Options) blExpect {
		return blRefDense(accs)
	}, true, nil)
}

// TestDenseMultiTensorLayout runs dense on a random multi-tensor layout: the
// reducer works on the flat vector, whatever the tensor boundaries.
func TestDenseMultiTensorLayout(t *testing.T) {
	rng := harnessRNG(11, 0, 0)
	for _, n := range harnessWorkerCounts {
		l, err := randomLayout(rng, 257)
		if err != nil {
			t.Fatal(err)
		}
		res := mustRunHarness(t, harnessConfig{Method: "dense", Workers: n, Layout: l, Density: 1, Seed: 5, Iters: 2, Feedback: true})
		for it := range 2 {
			blCheck(t, res, it, blRefDense(res.Acc[it]))
		}
		checkConservation(t, res)
	}
}
