package sparsify

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// dgcRefExpect computes every worker's expected result of one dgc call from
// the accs, with the test's plain dgcRefSelect per tensor.
func dgcRefExpect(l Layout, accs [][]float32, ratio float64, seed uint64, iter int) []sampRefExpect {
	n := len(accs)
	sels := make([][]int32, n)
	thrs := make([]float64, n)
	layerK := make([][]int, n)
	largest := 0
	for t, tn := range l.Tensors {
		if tn.Size > l.Tensors[largest].Size {
			largest = t
		}
	}
	for w := range n {
		for t, tn := range l.Tensors {
			_, _, _, stride := dgcRefParams(tn.Size, ratio)
			start := 0
			if stride > 1 {
				start = sampRNG(seed, w, iter, t).IntN(stride)
			}
			idx, thr := dgcRefSelect(accs[w][tn.Offset:tn.Offset+tn.Size], ratio, start)
			for _, i := range idx {
				sels[w] = append(sels[w], int32(tn.Offset)+i)
			}
			layerK[w] = append(layerK[w], len(idx))
			if t == largest {
				thrs[w] = float64(thr)
			}
		}
	}
	out, distinct := sampRefSparseDecode(l.N, accs, sels)
	counts := make([]int, n)
	for w := range n {
		counts[w] = len(sels[w])
	}
	es := make([]sampRefExpect, n)
	for w := range n {
		res := append([]float32(nil), accs[w]...)
		for _, j := range sels[w] {
			res[j] = 0
		}
		es[w] = sampRefExpect{out: out, residual: res, selected: len(sels[w]), perWorker: counts,
			layerK: layerK[w], density: float64(distinct) / float64(l.N), threshold: thrs[w], calls: sampExchangeCalls(counts)}
	}
	return es
}

func TestDGCMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for ci, c := range standardCases() {
		for _, gen := range []struct {
			name string
			g    harnessGen
		}{{"normal", genNormal}, {"ints", genSmallInts}, {"sparse", genSparse}} {
			l, err := randomLayout(rng, c.N)
			if err != nil {
				t.Fatal(err)
			}
			t.Run(fmt.Sprintf("%v/%s", c, gen.name), func(t *testing.T) {
				cfg := harnessConfig{Method: "dgc", Workers: c.Workers, Layout: l, Density: c.Density, Iters: 2,
					Seed: uint64(ci), Feedback: true, InPlace: ci%2 == 0, Gen: gen.g}
				res := mustRunHarness(t, cfg)
				for it := range cfg.Iters {
					es := dgcRefExpect(l, res.Acc[it], c.Density, cfg.Seed, it)
					for w := range c.Workers {
						sampCheck(t, res, it, w, es[w])
					}
				}
				checkConservation(t, res)
				checkOutputsAgree(t, res)
			})
		}
	}
}

// TestDGCLargeTensor runs the sampled path with adaptation on a tensor large
// enough for the strided sample to matter, and checks the selection size
// stays near the budget.
func TestDGCLargeTensor(t *testing.T) {
	if testing.Short() {
		t.Skip("large tensor")
	}
	l, err := NewLayout([]string{"w", "b"}, []int{200003, 17})
	if err != nil {
		t.Fatal(err)
	}
	for _, rho := range []float64{0.001, 0.01} {
		cfg := harnessConfig{Method: "dgc", Workers: 3, Layout: l, Density: rho, Iters: 2, Seed: 9, Feedback: true}
		res := mustRunHarness(t, cfg)
		for it := range cfg.Iters {
			es := dgcRefExpect(l, res.Acc[it], rho, cfg.Seed, it)
			for w := range cfg.Workers {
				sampCheck(t, res, it, w, es[w])
				nsel := int(math.Ceil(200003 * rho))
				if k := res.Stats[it][w].LayerK[0]; k > nsel || float64(k) < 0.5*float64(nsel) {
					t.Errorf("rho=%g it=%d rank %d: %d selected in the large tensor, budget %d", rho, it, w, k, nsel)
				}
			}
		}
		checkConservation(t, res)
	}
}
