package sparsify

import (
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
)

// blRefCltk is the reference of "cltk" (notes 7.3) at iteration it: the
// leader it mod n chooses its own top-k, every worker reduces at it.
func blRefCltk(accs [][]float32, k, it int) blExpect {
	n := len(accs)
	leader := it % n
	sel := refTopK(accs[leader], k)
	u := map[int32]bool{}
	for _, j := range sel {
		u[j] = true
	}
	e := blRefUnion(accs, u)
	for range accs {
		e.selected = append(e.selected, k)
	}
	e.calls = func(int) []harnessCall {
		return []harnessCall{
			{Op: comm.OpBroadcast, Elems: k, ESize: 4, Root: leader},
			{Op: comm.OpAllReduce, Elems: k, ESize: 4},
		}
	}
	return e
}

func TestCltkMatchesReference(t *testing.T) {
	blProperty(t, "cltk", standardCases(), func(accs [][]float32, k, it int, _ Options) blExpect {
		return blRefCltk(accs, k, it)
	}, true, nil)
}

// TestCltkLeaderRotates runs more iterations than workers so every rank
// leads at least once, in order, and the leader counter survives calls.
func TestCltkLeaderRotates(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		res := mustRunHarness(t, harnessConfig{Method: "cltk", Workers: n, N: 50, Density: 0.1, Iters: 2*n + 1, Seed: 9, Feedback: true})
		for it := range res.Cfg.Iters {
			blCheck(t, res, it, blRefCltk(res.Acc[it], 5, it))
		}
		checkConservation(t, res)
	}
}
