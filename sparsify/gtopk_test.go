package sparsify

import (
	"errors"
	"math"
	"sort"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
)

// blGtopkPair is one (index, value) candidate of the gTop-k reference.
type blGtopkPair struct {
	idx int32
	val float32
}

// blRefGtopk simulates Shi's gTop-k tree (notes 7.7) over all workers in one
// process, in float32 as the workers compute it: in round i, rank r (a
// multiple of 2^(i+1)) merges rank r+2^i's candidates into its own (own +
// received at common indices) and keeps the k largest magnitudes, ties to
// lower indices. Rank 0's final set is the global set.
func blRefGtopk(accs [][]float32, k int) blExpect {
	p, N := len(accs), len(accs[0])
	cand := make([]map[int32]float32, p)
	sels := make([][]int32, p)
	for w, a := range accs {
		sels[w] = refTopK(a, k)
		cand[w] = map[int32]float32{}
		for _, j := range sels[w] {
			cand[w][j] = a[j]
		}
	}
	for step := 1; step < p; step *= 2 {
		for r := 0; r < p; r += 2 * step {
			merged := map[int32]float32{}
			for j, v := range cand[r] {
				merged[j] = v
			}
			for j, v := range cand[r+step] {
				if old, ok := merged[j]; ok {
					merged[j] = old + v
				} else {
					merged[j] = v
				}
			}
			var ps []blGtopkPair
			for j, v := range merged {
				ps = append(ps, blGtopkPair{j, v})
			}
			sort.Slice(ps, func(a, b int) bool {
				ma, mb := math.Abs(float64(ps[a].val)), math.Abs(float64(ps[b].val))
				if ma != mb {
					return ma > mb
				}
				return ps[a].idx < ps[b].idx
			})
			cand[r] = map[int32]float32{}
			for _, q := range ps[:k] {
				cand[r][q.idx] = q.val
			}
		}
	}
	e := blExpect{out: make([]float64, N), outAbs: make([]float64, N), exactOut: make([]float32, N), threshold: math.NaN()}
	for j, v := range cand[0] {
		e.exactOut[j] = v / float32(p)
	}
	for w, a := range accs {
		r := append([]float32(nil), a...)
		for _, j := range sels[w] {
			if _, global := cand[0][j]; global {
				r[j] = 0
			}
		}
		e.residual = append(e.residual, r)
		e.selected = append(e.selected, k)
	}
	e.density = float64(k) / float64(N)
	e.calls = func(rank int) []harnessCall {
		var cs []harnessCall
		for step := 1; step < p && rank%step == 0; step *= 2 {
			if (rank/step)%2 == 1 {
				cs = append(cs, harnessCall{Op: comm.OpSend, Elems: k, ESize: 4}, harnessCall{Op: comm.OpSend, Elems: k, ESize: 4})
				break
			}
			cs = append(cs, harnessCall{Op: comm.OpRecv, Elems: k, ESize: 4}, harnessCall{Op: comm.OpRecv, Elems: k, ESize: 4})
		}
		return append(cs,
			harnessCall{Op: comm.OpBroadcast, Elems: k, ESize: 4},
			harnessCall{Op: comm.OpBroadcast, Elems: k, ESize: 4})
	}
	return e
}

func TestGtopkMatchesReference(t *testing.T) {
	cases := restrictToPow2(standardCases())
	// 4 and 8 workers exercise trees of 2 and 3 levels besides 16.
	for _, n := range []int{4, 8} {
		for _, N := range []int{1, n - 1, 7, 97, 1001} {
			for _, d := range []float64{1e-9, 0.05, 0.3} {
				cases = append(cases, harnessCase{n, N, d})
			}
		}
	}
	blProperty(t, "gtopk", cases, func(accs [][]float32, k, _ int, _ Options) blExpect {
		return blRefGtopk(accs, k)
	}, false, nil)
}

// TestGtopkConservation: gTop-k loses nothing when every worker selects the
// same indices (and with one worker), and does lose a value when an index
// dropped in one subtree reaches the global set through another.
func TestGtopkConservation(t *testing.T) {
	t.Run("same selection", func(t *testing.T) {
		for _, n := range []int{1, 2, 4, 16} {
			res := mustRunHarness(t, harnessConfig{Method: "gtopk", Workers: n, N: 40, Density: 0.1, Iters: 2,
				Fill: func(it, rank int, x []float32) {
					for i := range x {
						x[i] = float32(i%7) * 0.01 // below the selected ones
					}
					for j := 0; j < 4; j++ {
						x[10*j+3] = float32(10 + j + rank + it) // the same 4 indices on every rank
					}
				}})
			checkConservation(t, res)
		}
	})
	t.Run("lost value", func(t *testing.T) {
		// k = 1, N = 3. Round 0: ranks 0+1 keep index 1 (6 beats 5),
		// dropping rank 0's index 0; ranks 2+3 keep index 0 (4+4 = 8).
		// Round 1: index 0 (8) beats index 1 (6). Rank 0's 5 at index 0 is
		// then neither in out nor in its residual.
		accs := [][]float32{{5, 0, 0}, {0, 6, 0}, {4, 0, 0}, {4, 0, 0}}
		res := mustRunHarness(t, harnessConfig{Method: "gtopk", Workers: 4, N: 3, Density: 0.34,
			Fill: func(_, rank int, x []float32) { copy(x, accs[rank]) }})
		if got := res.Out[0][0]; got[0] != 2 || got[1] != 0 || got[2] != 0 {
			t.Fatalf("out = %v, want [2 0 0]", got)
		}
		if r := res.Residual[0][0]; r[0] != 0 {
			t.Fatalf("rank 0 residual = %v, want index 0 zeroed", r)
		}
		if r := res.Residual[0][1]; r[1] != 6 {
			t.Fatalf("rank 1 residual = %v, want its dropped 6 kept", r)
		}
		var lhs, rhs float32
		for w := range 4 {
			lhs += res.Residual[0][w][0]
			rhs += accs[w][0]
		}
		lhs += 4 * res.Out[0][0][0]
		if lhs != 8 || rhs != 13 {
			t.Fatalf("Σresidual + n·out = %v and Σacc = %v at index 0, want 8 and 13 (5 lost)", lhs, rhs)
		}
		blCheck(t, res, 0, blRefGtopk(res.Acc[0], 1))
	})
}

func TestGtopkRejectsNonPowerOfTwo(t *testing.T) {
	for _, n := range []int{3, 5, 6, 12} {
		_, err := runHarness(t, harnessConfig{Method: "gtopk", Workers: n, N: 10, Density: 0.1})
		if err == nil {
			t.Fatalf("%d workers accepted", n)
		}
		if !strings.Contains(err.Error(), "power-of-two") {
			t.Fatalf("%d workers: error %q does not say what is valid", n, err)
		}
		if errors.Is(err, ErrUnknownMethod) {
			t.Fatal("wrong error kind")
		}
	}
}

// FuzzBaselinesMatchReference runs one baseline on fuzzed small-integer accs
// (data[i] mod 9 − 4, filled rank after rank) and compares it with its
// reference. The seed corpus runs in every go test.
func FuzzBaselinesMatchReference(f *testing.F) {
	f.Add(uint8(0), uint8(2), uint16(5), uint8(1), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add(uint8(4), uint8(4), uint16(3), uint8(50), []byte{8, 0, 0, 8, 4, 4, 4, 4, 0, 0, 4, 4})
	f.Add(uint8(3), uint8(3), uint16(1), uint8(100), []byte{})
	f.Add(uint8(5), uint8(5), uint16(30), uint8(20), []byte("the quick brown fox jumps over the lazy dog"))
	methods := []string{"topk", "topka", "cltk", "threshold", "dense", "gtopk"}
	f.Fuzz(func(t *testing.T, mi, nw uint8, size uint16, pct uint8, data []byte) {
		m := methods[int(mi)%len(methods)]
		n := 1 + int(nw)%8
		if m == "gtopk" {
			n = gtopkPrevPow2(n)
		}
		N := 1 + int(size)%200
		density := float64(1+int(pct)%100) / 100
		res := mustRunHarness(t, harnessConfig{Method: m, Workers: n, N: N, Density: density, Iters: 2, Feedback: true,
			Fill: func(it, rank int, x []float32) {
				for i := range x {
					v := 0
					if len(data) > 0 {
						v = int(data[((it*n+rank)*N+i)%len(data)])%9 - 4
					}
					x[i] = float32(v)
				}
			}})
		k := BudgetK(density, N)
		for it := range 2 {
			var e blExpect
			switch m {
			case "topk":
				e = blRefTopk(res.Acc[it], k)
			case "topka":
				e = blRefTopka(res.Acc[it], k)
			case "cltk":
				e = blRefCltk(res.Acc[it], k, it)
			case "threshold":
				e = blRefThreshold(res.Acc[it], k, 0)
			case "dense":
				e = blRefDense(res.Acc[it])
			case "gtopk":
				e = blRefGtopk(res.Acc[it], k)
			}
			blCheck(t, res, it, e)
		}
		if m != "gtopk" {
			checkConservation(t, res)
		}
	})
}
