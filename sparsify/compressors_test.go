package sparsify

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/layout"
)

// Reference tests of the compressors (efsignsgd, powersgd), each a plain
// implementation written from its paper, in float64, compared with the
// reducers on random inputs: 1, 2, 3, 5 workers, odd shapes, several
// iterations with error feedback.

// compressorShapes are odd tensor shapes: 1-D tensors, a 1×1 matrix,
// tall, wide and 4-D tensors, sizes that are not multiples of 32.
var compressorShapes = [][]int{{1}, {5}, {7, 3}, {1, 1}, {3, 33}, {2, 3, 3, 2}, {13}, {40, 1}, {65, 9}}

// shapedLayout returns a layout of a random subset (at least one) of
// compressorShapes, in random order.
func shapedLayout(t *testing.T, rng *rand.Rand) Layout {
	t.Helper()
	var ts []layout.Tensor
	for len(ts) == 0 {
		for i, s := range compressorShapes {
			if rng.IntN(3) == 0 {
				continue
			}
			size := 1
			for _, d := range s {
				size *= d
			}
			ts = append(ts, layout.Tensor{Name: fmt.Sprintf("t%d", i), Shape: s, Size: size})
		}
	}
	rng.Shuffle(len(ts), func(i, j int) { ts[i], ts[j] = ts[j], ts[i] })
	l, err := layout.Of(ts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// refEFSign is EF-SignSGD from the paper, distributed as the mean of the
// workers' compressed tensors: for worker w's acc p_w, per tensor of more
// than one dimension, C(p) = (‖p‖₁/d)·sign(p) (sign(0) = +1: one bit),
// out = (1/n)Σ_w C(p_w), residual_w = p_w − C(p_w); 1-D tensors: out =
// the mean, residual 0.
func refEFSign(l Layout, acc [][]float32) (out []float64, res [][]float64) {
	n := len(acc)
	out = make([]float64, l.N)
	res = make([][]float64, n)
	for w := range res {
		res[w] = make([]float64, l.N)
	}
	for _, tn := range l.Tensors {
		lo, hi := tn.Offset, tn.Offset+tn.Size
		for w := range n {
			if tn.Dims() == 1 {
				for i := lo; i < hi; i++ {
					out[i] += float64(acc[w][i]) / float64(n)
				}
				continue
			}
			l1 := 0.0
			for i := lo; i < hi; i++ {
				l1 += math.Abs(float64(acc[w][i]))
			}
			s := float64(float32(l1 / float64(tn.Size)))
			for i := lo; i < hi; i++ {
				c := s
				if acc[w][i] < 0 {
					c = -s
				}
				out[i] += c / float64(n)
				res[w][i] = float64(acc[w][i]) - c
			}
		}
	}
	return out, res
}

func TestEFSignSGDMatchesReference(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 5} {
		for seed := range uint64(4) {
			rng := rand.New(rand.NewPCG(seed, 35))
			l := shapedLayout(t, rng)
			res := mustRunHarness(t, harnessConfig{Method: "efsignsgd", Workers: workers, Layout: l, Density: 0.01, Iters: 3, Seed: seed, Feedback: true, InPlace: seed%2 == 1})
			// Conservation holds up to the rounding of acc − s·sign and
			// of the mean of ±s, which the reference comparison bounds;
			// checkConservation's bound (Σ|acc|) is too tight where
			// s > |acc|.
			checkOutputsAgree(t, res)
			for it := range res.Acc {
				out, rres := refEFSign(l, res.Acc[it])
				for w := range workers {
					for i := range out {
						if d := math.Abs(float64(res.Out[it][w][i]) - out[i]); d > 1e-6*(1+math.Abs(out[i])) {
							t.Fatalf("n=%d seed %d iteration %d worker %d: out[%d] = %v, reference %v", workers, seed, it, w, i, res.Out[it][w][i], out[i])
						}
						if d := math.Abs(float64(res.Residual[it][w][i]) - rres[w][i]); d > 1e-6*(1+math.Abs(rres[w][i])) {
							t.Fatalf("n=%d seed %d iteration %d worker %d: residual[%d] = %v, reference %v", workers, seed, it, w, i, res.Residual[it][w][i], rres[w][i])
						}
					}
				}
			}
		}
	}
}

// TestEFSignSGDBytes checks the wire format's size: one AllGather of
// 1 + ⌈d/32⌉ words per compressed tensor, one AllReduce of the 1-D ones.
func TestEFSignSGDBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	l := shapedLayout(t, rng)
	for _, workers := range []int{1, 2, 3, 5} {
		res := mustRunHarness(t, harnessConfig{Method: "efsignsgd", Workers: workers, Layout: l, Density: 0.01, Seed: 3})
		words, dense := 0, 0
		for _, tn := range l.Tensors {
			if tn.Dims() == 1 {
				dense += tn.Size
			} else {
				words += 1 + (tn.Size+31)/32
			}
		}
		var calls []harnessCall
		if dense > 0 {
			calls = append(calls, harnessCall{Op: comm.OpAllReduce, Elems: dense, ESize: 4})
		}
		if words > 0 {
			calls = append(calls, harnessCall{Op: comm.OpAllGather, Elems: words, ESize: 4})
		}
		for w := range workers {
			sent, recv := expectTraffic(workers, w, calls)
			st := res.Stats[0][w]
			if st.BytesSent != sent || st.BytesRecv != recv {
				t.Errorf("n=%d worker %d: bytes %d/%d, want %d/%d", workers, w, st.BytesSent, st.BytesRecv, sent, recv)
			}
		}
	}
}
