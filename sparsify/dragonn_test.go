package sparsify

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
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

// TestDragonnMomentumCorrection checks DRAGONN's momentum-corrected error
// feedback against DGC's written plainly, with DRAGONN's selection (the
// test's reference, dragonnRefRun) made on each worker's velocity: per
// worker u ← m·u + g, v ← v + u on the compressed tensors, v's selected
// values averaged, u and v zeroed at the sent indices; the dense tensors
// (all of them during the dense warm-up) averaged and given momentum, mmt
// ← m·mmt + avg; when the warm-up ends, every worker's u starts from mmt
// and v from 0. The gradients are multiples of 1/8 and m = 0.5, so with a
// power of two of workers every sum is exact: the residual (v + m·u) must
// agree bit for bit (closely with 3 and 5), and the error norm is ‖v‖.
func TestDragonnMomentumCorrection(t *testing.T) {
	names := []string{"conv", "bn", "fc", "bias"}
	sizes := []int{3000, 17, 2003, 5}
	l, err := NewLayout(names, sizes)
	if err != nil {
		t.Fatal(err)
	}
	const (
		m      = 0.5
		rho    = 0.01
		steps  = 5
		seed   = 3
		minT   = 100
		warmup = 2
	)
	for _, n := range []int{1, 2, 3, 4, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			grad := func(w, step int) []float32 {
				r := rand.New(rand.NewPCG(uint64(w)+10, uint64(step)))
				g := make([]float32, l.N)
				for i := range g {
					g[i] = float32(r.IntN(33)-16) / 8
				}
				return g
			}
			outs := make([][][]float32, n)
			ress := make([][][]float32, n)
			norms := make([][]float64, n)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := local.Run(ctx, n, func(ctx context.Context, c comm.Communicator) error {
				w := c.Rank()
				red, err := New("dragonn", Options{Density: rho, Layout: l, Comm: c, Seed: seed, Momentum: m, Params: Values{"min_tensor": minT, "dense_warmup": warmup}})
				if err != nil {
					return err
				}
				residual := make([]float32, l.N)
				for step := range steps {
					for i, g := range grad(w, step) {
						residual[i] += g
					}
					out := make([]float32, l.N)
					st, err := red.Reduce(ctx, residual, out, residual)
					if err != nil {
						return err
					}
					outs[w] = append(outs[w], out)
					ress[w] = append(ress[w], slices.Clone(residual))
					norms[w] = append(norms[w], st.ErrorNorm)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			us, vs := make([][]float32, n), make([][]float32, n)
			for w := range n {
				us[w], vs[w] = make([]float32, l.N), make([]float32, l.N)
			}
			mmt := make([]float32, l.N)
			ref := &dragonnRefRun{minTensor: minT, warmup: warmup}
			for step := range steps {
				comp := make([]bool, len(l.Tensors))
				accs := make([][]float32, n)
				for w := range n {
					g := grad(w, step)
					accs[w] = slices.Clone(g) // the dense tensors' acc: the gradient
					for ti, tn := range l.Tensors {
						comp[ti] = step >= warmup && tn.Size > minT
						if !comp[ti] {
							continue
						}
						u, v := us[w], vs[w]
						for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
							if step == warmup {
								u[i], v[i] = mmt[i], 0
							}
							u[i] = float32(m*u[i]) + g[i]
							v[i] += u[i]
							accs[w][i] = v[i]
						}
					}
				}
				es := ref.expect(l, accs, rho, seed, step)
				for w := range n {
					want := make([]float32, l.N)
					var vsq float64
					for ti, tn := range l.Tensors {
						for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
							switch {
							case !comp[ti]:
								if w == 0 {
									mmt[i] = float32(m*mmt[i]) + es[0].out[i]
								}
							case es[w].residual[i] == 0 && vs[w][i] != 0: // sent: masked
								us[w][i], vs[w][i] = 0, 0
								fallthrough
							default:
								want[i] = vs[w][i] + float32(m*us[w][i])
								vsq += float64(vs[w][i]) * float64(vs[w][i])
							}
						}
					}
					if n&(n-1) != 0 {
						// The average of 3 or 5 workers is inexact, and the
						// reducer's u = acc − v rounds otherwise than m·u + g.
						checkClose(t, fmt.Sprintf("step %d rank %d residual", step, w), ress[w][step], want, relTol(want, 1e-5))
					}
					for i := range want {
						if n&(n-1) == 0 && ress[w][step][i] != want[i] {
							t.Fatalf("step %d rank %d: residual[%d] = %v, v + m·u = %v", step, w, i, ress[w][step][i], want[i])
						}
					}
					wantOut := slices.Clone(es[w].out)
					for ti, tn := range l.Tensors {
						if !comp[ti] {
							copy(wantOut[tn.Offset:tn.Offset+tn.Size], mmt[tn.Offset:tn.Offset+tn.Size])
						}
					}
					checkClose(t, fmt.Sprintf("step %d rank %d out", step, w), outs[w][step], wantOut, relTol(wantOut, 1e-6))
					tol := 1e-12
					if n&(n-1) != 0 {
						tol = 1e-6
					}
					if got, want := norms[w][step], math.Sqrt(vsq); math.Abs(got-want) > tol*(1+want) {
						t.Fatalf("step %d rank %d: ErrorNorm %v, want ‖v‖ = %v", step, w, got, want)
					}
				}
			}
		})
	}
}
