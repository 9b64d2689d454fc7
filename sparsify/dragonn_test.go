package sparsify

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
)

// dragonnRefRun tracks the hash-seed counter across calls, as the test's
// plain version of the reducer.
type dragonnRefRun struct {
	minTensor, warmup int // already resolved (no defaults)
	calls             int
}

// expect computes every worker's expected result of call iter.
func (d *dragonnRefRun) expect(l Layout, accs [][]float32, ratio float64, seed uint64, iter int) []sampRefExpect {
	n := len(accs)
	sels := make([][]int32, n)
	layerK := make([][]int, n)
	thrs := make([]float64, n)
	comp := make([]bool, len(l.Tensors))
	largest := -1
	for t, tn := range l.Tensors {
		comp[t] = iter >= d.warmup && tn.Size > d.minTensor
		if comp[t] && (largest < 0 || tn.Size > l.Tensors[largest].Size) {
			largest = t
		}
	}
	for w := range n {
		thrs[w] = math.NaN()
		c := d.calls
		for t, tn := range l.Tensors {
			if !comp[t] {
				layerK[w] = append(layerK[w], tn.Size)
				continue
			}
			idx, thr := dragonnRefSelect(accs[w][tn.Offset:tn.Offset+tn.Size], ratio, sampRNG(seed, w, iter, t), uint32(43+c))
			c = (c + 1) % 100000
			for _, i := range idx {
				sels[w] = append(sels[w], int32(tn.Offset)+i)
			}
			layerK[w] = append(layerK[w], len(idx))
			if t == largest {
				thrs[w] = float64(thr)
			}
		}
		if w == n-1 {
			d.calls = c
		}
	}
	out, distinct := sampRefSparseDecode(l.N, accs, sels)
	// Dense tensors: the canonical all-reduce of their concatenation.
	dense := make([][]float32, n)
	denseN := 0
	for t, tn := range l.Tensors {
		if !comp[t] {
			denseN += tn.Size
			for w := range n {
				dense[w] = append(dense[w], accs[w][tn.Offset:tn.Offset+tn.Size]...)
			}
		}
	}
	var calls []harnessCall
	if denseN > 0 {
		sum := sampRefCanonicalSum(dense)
		q := 0
		for t, tn := range l.Tensors {
			if !comp[t] {
				for i := range tn.Size {
					out[tn.Offset+i] = sum[q] * (1 / float32(n))
					q++
				}
			}
		}
		calls = append(calls, harnessCall{Op: comm.OpAllReduce, Elems: denseN, ESize: 4})
	}
	counts := make([]int, n)
	per := make([]int, n)
	for w := range n {
		counts[w] = len(sels[w])
		per[w] = counts[w] + denseN
	}
	if denseN < l.N {
		calls = append(calls, sampExchangeCalls(counts)...)
	}
	es := make([]sampRefExpect, n)
	for w := range n {
		res := append([]float32(nil), accs[w]...)
		for _, j := range sels[w] {
			res[j] = 0
		}
		for t, tn := range l.Tensors {
			if !comp[t] {
				clear(res[tn.Offset : tn.Offset+tn.Size])
			}
		}
		es[w] = sampRefExpect{out: out, residual: res, selected: len(sels[w]) + denseN, perWorker: per, layerK: layerK[w],
			density: float64(distinct+denseN) / float64(l.N), threshold: thrs[w], calls: calls}
	}
	return es
}

func TestDragonnMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	type variant struct {
		name            string
		opts            Values // Options.Params
		resMin, resWarm int    // resolved
	}
	variants := []variant{
		{"all-compressed", Values{"min_tensor": 0, "dense_warmup": 0}, 0, 0},
		{"mixed-warmup1", Values{"min_tensor": 40, "dense_warmup": 1}, 40, 1},
		{"defaults-dense", nil, 204800, 200},
	}
	for ci, c := range standardCases() {
		for _, v := range variants {
			l, err := randomLayout(rng, c.N)
			if err != nil {
				t.Fatal(err)
			}
			t.Run(fmt.Sprintf("%v/%s", c, v.name), func(t *testing.T) {
				cfg := harnessConfig{Method: "dragonn", Workers: c.Workers, Layout: l, Density: c.Density, Iters: 3,
					Seed: uint64(ci), Feedback: true, InPlace: ci%2 == 0, Gen: genNormal,
					Options: func(o *Options) { o.Params = v.opts }}
				if ci%3 == 0 {
					cfg.Gen = genSmallInts
				}
				res := mustRunHarness(t, cfg)
				ref := &dragonnRefRun{minTensor: v.resMin, warmup: v.resWarm}
				for it := range cfg.Iters {
					es := ref.expect(l, res.Acc[it], c.Density, cfg.Seed, it)
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

// TestDragonnHashSeedWraps checks that the hash-seed counter wraps at 100000
// compress calls: after 99999 calls of a one-tensor layout the next seeds
// are 43 + 99999 and then 43 again.
func TestDragonnHashSeedWraps(t *testing.T) {
	l, err := FlatLayout(500)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New("dragonn", Options{Density: 0.05, Layout: l, Comm: sampSingleComm(), Params: Values{"min_tensor": 0, "dense_warmup": 0}})
	if err != nil {
		t.Fatal(err)
	}
	d := r.core.(*dragonnReducer)
	d.calls = 99999
	d.base.calls = 7
	rng := rand.New(rand.NewPCG(1, 2))
	for step, seed := range []uint32{43 + 99999, 43} {
		acc := make([]float32, 500)
		genNormal(rng, acc)
		accCopy := append([]float32(nil), acc...)
		out := make([]float32, 500)
		if _, err := r.Reduce(t.Context(), acc, out, make([]float32, 500)); err != nil {
			t.Fatal(err)
		}
		want, _ := dragonnRefSelect(accCopy, 0.05, sampRNG(0, 0, 7+step, 0), seed)
		wantOut, _ := sampRefSparseDecode(500, [][]float32{accCopy}, [][]int32{want})
		checkClose(t, fmt.Sprintf("call with seed %d", seed), out, wantOut, nil)
	}
	if d.calls != 1 {
		t.Fatalf("counter after the wrap = %d, want 1", d.calls)
	}
}

// TestDragonnWarmupIsDense checks that during warm-up everything is averaged
// densely: ActualDensity 1 and a zero residual.
func TestDragonnWarmupIsDense(t *testing.T) {
	l, err := NewLayout([]string{"a", "b"}, []int{300, 5})
	if err != nil {
		t.Fatal(err)
	}
	cfg := harnessConfig{Method: "dragonn", Workers: 3, Layout: l, Density: 0.01, Iters: 3, Seed: 1,
		Options: func(o *Options) { o.Params = Values{"min_tensor": 100, "dense_warmup": 2} }}
	res := mustRunHarness(t, cfg)
	for it := range 3 {
		for w := range 3 {
			st := res.Stats[it][w]
			if dense := it < 2; dense != (st.ActualDensity == 1) || dense != (st.ErrorNorm == 0) || dense != math.IsNaN(st.Threshold) {
				t.Errorf("iteration %d rank %d: ActualDensity %v, ErrorNorm %v, Threshold %v; warm-up lasts 2 calls", it, w, st.ActualDensity, st.ErrorNorm, st.Threshold)
			}
		}
	}
}
