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

// dgcRefWorker is one worker of the plain DGC reference: its momentum u
// and velocity v over the whole vector (the dense tensors' entries unused).
type dgcRefWorker struct{ u, v []float32 }

// TestDGCMomentumCorrection checks dgc with momentum correction against DGC
// written plainly (synxlin/deep-gradient-compression's DGCSGDMemory with
// momentum masking, and its dense path for 1-D tensors): per worker u ← m·u
// + g, v ← v + u on the compressed tensors, the double-sampling selection
// made on v, v's values averaged over workers, u and v zeroed at the sent
// indices; the 1-D tensors averaged and given momentum, mmt ← m·mmt + avg.
// The gradients are multiples of 1/8 and m = 0.5, so every sum is exact and
// the reducer (which carries v + m·u as its residual and keeps the masked v)
// must agree bit for bit on the residual, and on the selections.
func TestDGCMomentumCorrection(t *testing.T) {
	names := []string{"conv", "bn", "fc", "bias"}
	sizes := []int{3000, 17, 2003, 5}
	dims := []int{4, 1, 2, 1}
	l, err := NewLayout(names, sizes)
	if err != nil {
		t.Fatal(err)
	}
	for i := range l.Tensors {
		l.Tensors[i].Shape = make([]int, dims[i]) // only its number of dimensions matters
	}
	const (
		m     = 0.5
		rho   = 0.01
		steps = 5
		seed  = 3
	)
	for _, n := range []int{1, 2, 3, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			grad := func(w, step int) []float32 {
				r := rand.New(rand.NewPCG(uint64(w), uint64(step)))
				g := make([]float32, l.N)
				for i := range g {
					g[i] = float32(r.IntN(33)-16) / 8
				}
				return g
			}
			outs := make([][][]float32, n)
			ress := make([][][]float32, n)
			norms := make([][]float64, n) // Stats.ErrorNorm per rank and step
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := local.Run(ctx, n, func(ctx context.Context, c comm.Communicator) error {
				w := c.Rank()
				red, err := New("dgc", Options{Density: rho, Layout: l, Comm: c, Seed: seed, Momentum: m, Params: Values{"sparsity_warmup": 0}})
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
			ref := make([]dgcRefWorker, n)
			for w := range ref {
				ref[w] = dgcRefWorker{make([]float32, l.N), make([]float32, l.N)}
			}
			mmt := make([]float32, l.N) // the dense tensors' momentum
			for step := range steps {
				out := make([]float32, l.N)
				sum := make([]float32, l.N)
				for w := range n {
					g := grad(w, step)
					for ti, tn := range l.Tensors {
						lo, hi := tn.Offset, tn.Offset+tn.Size
						if dims[ti] == 1 {
							for i := lo; i < hi; i++ {
								sum[i] += g[i]
							}
							continue
						}
						u, v := ref[w].u, ref[w].v
						for i := lo; i < hi; i++ {
							u[i] = m*u[i] + g[i]
							v[i] += u[i]
						}
						_, _, _, stride := dgcRefParams(tn.Size, rho)
						start := 0
						if stride > 1 {
							start = sampRNG(seed, w, step, ti).IntN(stride)
						}
						sel, _ := dgcRefSelect(v[lo:hi], rho, start)
						for _, j := range sel {
							out[lo+int(j)] += v[lo+int(j)]
							u[lo+int(j)], v[lo+int(j)] = 0, 0
						}
					}
				}
				for ti, tn := range l.Tensors {
					for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
						if dims[ti] == 1 {
							mmt[i] = m*mmt[i] + sum[i]/float32(n)
							out[i] = mmt[i]
						} else {
							out[i] /= float32(n)
						}
					}
				}
				for w := range n {
					want := make([]float32, l.N)
					for ti, tn := range l.Tensors {
						if dims[ti] == 1 {
							continue // residual 0
						}
						for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
							want[i] = ref[w].v[i] + m*ref[w].u[i]
						}
					}
					// The error norm is ‖v‖ over the compressed tensors,
					// what the worker holds back (not the residual's).
					var vsq float64
					for ti, tn := range l.Tensors {
						if dims[ti] != 1 {
							for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
								vsq += float64(ref[w].v[i]) * float64(ref[w].v[i])
							}
						}
					}
					if got, want := norms[w][step], math.Sqrt(vsq); math.Abs(got-want) > 1e-12*(1+want) {
						t.Fatalf("step %d rank %d: ErrorNorm %v, want ‖v‖ = %v", step, w, got, want)
					}
					for i := range want {
						if ress[w][step][i] != want[i] {
							t.Fatalf("step %d rank %d: residual[%d] = %v, DGC's v + m·u = %v", step, w, i, ress[w][step][i], want[i])
						}
					}
					checkClose(t, fmt.Sprintf("step %d rank %d out", step, w), outs[w][step], out, relTol(out, 1e-6))
				}
			}
		})
	}
}

// relTol is a tolerance of rel·(1 + |x|) per element.
func relTol(x []float32, rel float64) []float64 {
	tol := make([]float64, len(x))
	for i, v := range x {
		tol[i] = rel * (1 + math.Abs(float64(v)))
	}
	return tol
}

// TestDGCWarmup: with the calls per epoch known, epoch e of the warm-up
// selects at density max(0.25^(e+1), ρ) (DGC's 75 %, 93.75 %, 98.4 %
// sparsity ...), then at ρ; without them (a library caller that gives none)
// every call is at ρ. The 1-D tensor is sent dense throughout.
func TestDGCWarmup(t *testing.T) {
	l, err := NewLayout([]string{"w", "b"}, []int{100000, 10})
	if err != nil {
		t.Fatal(err)
	}
	l.Tensors[1].Shape = []int{l.Tensors[1].Size}
	const rho, perEpoch, seed = 0.001, 2, 7
	for _, known := range []bool{true, false} {
		c := local.New(1).Comm(0)
		red, err := New("dgc", Options{Density: rho, Layout: l, Comm: c, Seed: seed, Params: Values{"sparsity_warmup": 3}})
		if err != nil {
			t.Fatal(err)
		}
		if known {
			red.SetStepsPerEpoch(perEpoch)
		}
		r := rand.New(rand.NewPCG(1, 2))
		for call := range 8 {
			acc := make([]float32, l.N)
			for i := range acc {
				acc[i] = float32(r.NormFloat64())
			}
			ratio := rho
			if e := call / perEpoch; known && e < 3 {
				ratio = math.Pow(0.25, float64(e+1))
			}
			_, _, _, stride := dgcRefParams(100000, ratio)
			start := 0
			if stride > 1 {
				start = sampRNG(seed, 0, call, 0).IntN(stride)
			}
			want, _ := dgcRefSelect(acc[:100000], ratio, start)
			st, err := red.Reduce(context.Background(), slices.Clone(acc), make([]float32, l.N), make([]float32, l.N))
			if err != nil {
				t.Fatal(err)
			}
			if st.LayerK[0] != len(want) || st.LayerK[1] != 10 {
				t.Fatalf("epochs known %v, call %d: %v selected per tensor, want [%d 10] (density %g)", known, call, st.LayerK, len(want), ratio)
			}
		}
	}
}
