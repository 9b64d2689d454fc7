package sparsify

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
)

// randomkRefExpect is randomk written plainly: the shared indices, their
// values summed in the canonical all-reduce order, scaled by 1/n.
func randomkRefExpect(N int, accs [][]float32, density float64, seed uint64, iter int) []sampRefExpect {
	n := len(accs)
	k := max(1, min(int(density*float64(N)), N))
	sel := RandomK(nil, N, k, randomkSeed(seed, iter))
	vals := make([][]float32, n)
	for w := range n {
		for _, j := range sel {
			vals[w] = append(vals[w], accs[w][j])
		}
	}
	sum := sampRefCanonicalSum(vals)
	out := make([]float32, N)
	for i, j := range sel {
		out[j] = sum[i] * (1 / float32(n))
	}
	es := make([]sampRefExpect, n)
	for w := range n {
		res := append([]float32(nil), accs[w]...)
		for _, j := range sel {
			res[j] = 0
		}
		es[w] = sampRefExpect{out: out, residual: res, selected: k, density: float64(k) / float64(N), threshold: math.NaN(),
			calls: []harnessCall{{Op: comm.OpAllReduce, Elems: k, ESize: 4}}}
	}
	return es
}

func TestRandomkMatchesReference(t *testing.T) {
	for ci, c := range standardCases() {
		t.Run(c.String(), func(t *testing.T) {
			cfg := harnessConfig{Method: "randomk", Workers: c.Workers, N: c.N, Density: c.Density, Iters: 3,
				Seed: uint64(ci), Feedback: true, InPlace: ci%2 == 1}
			res := mustRunHarness(t, cfg)
			for it := range cfg.Iters {
				es := randomkRefExpect(c.N, res.Acc[it], c.Density, cfg.Seed, it)
				for w := range c.Workers {
					sampCheck(t, res, it, w, es[w])
				}
			}
			checkConservation(t, res)
			checkOutputsAgree(t, res)
		})
	}
}

// TestRandomkIndicesChange checks that the index set changes from call to
// call and with the seed.
func TestRandomkIndicesChange(t *testing.T) {
	const N, k = 1000, 10
	a := RandomK(nil, N, k, randomkSeed(1, 0))
	for _, s := range []struct {
		seed uint64
		iter int
	}{{1, 1}, {2, 0}, {1, 2}} {
		if b := RandomK(nil, N, k, randomkSeed(s.seed, s.iter)); slices.Equal(a, b) {
			t.Errorf("seed %d iteration %d draws the same indices as seed 1 iteration 0: %v", s.seed, s.iter, fmt.Sprint(b))
		}
	}
}
