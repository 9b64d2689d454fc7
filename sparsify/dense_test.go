package sparsify

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
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

// TestDenseAveragesEachBucketOnCompletion: in host memory each bucket is
// averaged as soon as its all-reduce completes, before Finish (DDP divides
// a bucket when its all-reduce is done, not after the backward pass): every
// rank starts the buckets one by one and waits for each to be averaged
// before the next, then finishes. The output is the bits of one all-reduce
// of the whole gradient scaled by 1/n (bucket_mb 0), and within rounding of
// the plain average.
func TestDenseAveragesEachBucketOnCompletion(t *testing.T) {
	rng := harnessRNG(31, 0, 0)
	for _, n := range harnessWorkerCounts {
		// 12 tensors of 1 to 150 elements (one of 1, one of 150).
		names, sizes := make([]string, 12), make([]int, 12)
		for i := range sizes {
			names[i], sizes[i] = fmt.Sprint("t", i), 1+rng.IntN(150)
		}
		sizes[rng.IntN(6)], sizes[6+rng.IntN(6)] = 1, 150
		l, err := NewLayout(names, sizes)
		if err != nil {
			t.Fatal(err)
		}
		accs := make([][]float32, n)
		for w := range accs {
			accs[w] = make([]float32, l.N)
			genNormal(harnessRNG(32, n, w), accs[w])
		}
		outs, whole := make([][]float32, n), make([][]float32, n)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		err = local.Run(ctx, n, func(ctx context.Context, c comm.Communicator) error {
			w := c.Rank()
			o := func(mb float64) Options {
				return Options{Density: 1, Layout: l, Comm: c, Params: Values{"bucket_mb": mb}}
			}
			// 400 bytes: buckets of about 100 elements.
			r, err := New("dense", o(400.0/(1<<20)))
			if err != nil {
				return err
			}
			if len(r.Groups()) < 3 {
				return fmt.Errorf("%d buckets of %d elements: the test wants several", len(r.Groups()), l.N)
			}
			averaged := make(chan int, len(r.Groups()))
			r.core.(*dense).averaged = func(g int) { averaged <- g }
			h := device.Host[float32]
			acc, res := slices.Clone(accs[w]), make([]float32, l.N)
			outs[w] = make([]float32, l.N)
			for g := range r.Groups() {
				if err := r.Start(ctx, g, h(acc), h(outs[w]), h(res)); err != nil {
					return err
				}
				select {
				case got := <-averaged:
					if got != g {
						return fmt.Errorf("bucket %d averaged after starting bucket %d", got, g)
					}
				case <-ctx.Done():
					return fmt.Errorf("bucket %d of %d not averaged before Finish: %w", g, len(r.Groups()), ctx.Err())
				}
			}
			if _, err := r.Finish(ctx); err != nil {
				return err
			}
			one, err := New("dense", o(0))
			if err != nil {
				return err
			}
			whole[w] = make([]float32, l.N)
			_, err = one.Reduce(ctx, slices.Clone(accs[w]), whole[w], make([]float32, l.N))
			return err
		})
		cancel()
		if err != nil {
			t.Fatalf("%d workers: %v", n, err)
		}
		ref := blRefDense(accs)
		for w := range n {
			for i, v := range outs[w] {
				if math.Float32bits(v) != math.Float32bits(whole[w][i]) {
					t.Fatalf("%d workers, rank %d: element %d is %v bucketed, %v in one all-reduce", n, w, i, v, whole[w][i])
				}
				if d := math.Abs(float64(v) - ref.out[i]); !(d <= sumAbsTol(n, ref.outAbs[i])) {
					t.Fatalf("%d workers, rank %d: element %d is %v, the average %v", n, w, i, v, ref.out[i])
				}
			}
		}
	}
}
