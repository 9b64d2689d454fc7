package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// TestGPUReducersMatchCPU runs every method on the GPU — each in-process worker on its own
// stream, the workers sharing the GPU and talking through comm.Staged — and
// on the CPU, on the same inputs, for 1, 2, 3 and 5 workers and three calls
// in a row: out, residual and the statistics are bit-identical.
func TestGPUReducersMatchCPU(t *testing.T) {
	d := gpu(t)
	names := []string{}
	for _, name := range sparsify.Names() {
		l, _ := sparsify.FlatLayout(10)
		if _, err := sparsify.New(name, sparsify.Options{Density: 0.5, Layout: l, Comm: local.New(1).Comm(0)}); err == nil {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		t.Fatal("no method")
	}
	t.Logf("methods: %v", names)
	layout, err := sparsify.NewLayout([]string{"a", "b", "c"}, []int{1000, 37, 2500})
	if err != nil {
		t.Fatal(err)
	}
	N := layout.N
	dgcLayout := layout
	dgcLayout.Tensors = slices.Clone(layout.Tensors)
	dgcLayout.Tensors[1].Shape = []int{37}
	for _, name := range names {
		ns := []int{1, 2, 3, 5}
		switch name {
		case "gtopk": // a power-of-two tree
			ns = []int{1, 2, 4}
		case "spardl": // one team; and 6 workers in 2 teams (B-SAG), 4 in 2 (R-SAG)
			ns = []int{1, 2, 3, 5, 6, 4}
		}
		for _, n := range ns {
			t.Run(fmt.Sprintf("%s/%d", name, n), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), 21))
				const calls = 4
				accs := make([][][]float32, calls)
				for c := range accs {
					accs[c] = make([][]float32, n)
					for w := range n {
						accs[c][w] = make([]float32, N)
						for i := range accs[c][w] {
							accs[c][w][i] = float32(rng.IntN(41)-20) * 0.125 // many ties
						}
					}
				}
				opts := func(o *sparsify.Options) {
					o.Seed = 5
					switch name {
					case "dragonn": // compress from the second call, every tensor but the smallest
						o.Params = sparsify.Values{"min_tensor": 100, "dense_warmup": 1}
					case "oktopk", "topkdsa": // sparse from the second call
						o.Params = sparsify.Values{"dense_warmup": 1}
					case "dgc": // momentum correction; "b" is 1-D (sent dense)
						o.Momentum, o.Layout = 0.5, dgcLayout
					case "spardl":
						switch n {
						case 6:
							o.Params = sparsify.Values{"teams": 2}
						case 4:
							o.Params = sparsify.Values{"teams": 2, "sag": "rsag"}
						}
					}
				}
				gpuR := sameOnBoth(t, d, name, layout, accs, opts)
				m, _ := sparsify.Lookup(name)
				for c := range calls {
					for rank := range n {
						// The declared top-k of acc selects from error
						// feedback's counts, after a dense warm-up call.
						warm := c == 0 && (name == "topkdsa" || name == "oktopk" || name == "dragonn")
						if want := m.TopKOfAcc && !warm; gpuR[c][rank].hist != want {
							t.Fatalf("call %d rank %d: the accumulation counted the first round: %v, want %v (TopKOfAcc %v)", c, rank, gpuR[c][rank].hist, want, m.TopKOfAcc)
						}
						// Timed by events on the GPU (Env.selectTimed), read when
						// the call's stats are combined.
						if a := gpuR[c][rank].st; (name == "topk" || name == "deft") && a.SelectTime <= 0 {
							t.Fatalf("call %d rank %d: no selection time on the GPU (%v)", c, rank, a.SelectTime)
						}
					}
				}
			})
		}
	}
}

// TestGPUMicroFallbackMatchesCPU: where a MiCRO worker's partition has
// nothing at or above the threshold, it selects the single fallback index
// s + t mod (e−s) of its partition [s, e), written on the device (no
// upload); with N < workers some partitions are empty and select nothing.
// Out, residual and the statistics are the CPU's, bit for bit, for 1, 2, 3
// and 5 workers over calls whose partitions fall back (zeros, values far
// below the threshold) or partly do.
func TestGPUMicroFallbackMatchesCPU(t *testing.T) {
	d := gpu(t)
	for _, N := range []int{37, 3} {
		for _, n := range []int{1, 2, 3, 5} {
			t.Run(fmt.Sprintf("N=%d/workers=%d", N, n), func(t *testing.T) {
				layout, err := sparsify.FlatLayout(N)
				if err != nil {
					t.Fatal(err)
				}
				const calls = 6
				// accs[c][w]: zeros in calls 0 and 3, 1e-6 in call 1 (far below
				// 1/(2√k)), and in calls 2, 4 and 5 a large value at one
				// element per worker, so that the other partitions fall back.
				accs := make([][][]float32, calls)
				for c := range accs {
					accs[c] = make([][]float32, n)
					for w := range n {
						a := make([]float32, N)
						switch c {
						case 1:
							for i := range a {
								a[i] = 1e-6 * float32(i%3-1)
							}
						case 2, 4, 5:
							a[(w*7+c)%N] = float32(c) - 2.5
						}
						accs[c][w] = a
					}
				}
				sameOnBoth(t, d, "micro", layout, accs, nil)
			})
		}
	}
}

// reducerCall is one rank's result of one call: out, the residual after
// it and the statistics.
type reducerCall struct {
	out, res []float32
	st       sparsify.Stats
	// hist: on the GPU, error feedback's accumulation counted the call's
	// first radix round (Reducer.Histogram was not empty).
	hist bool
}

// sameOnBoth runs method on len(accs[0]) in-process workers over the calls
// accs[c][w] (added to each worker's residual, error feedback's acc), at
// density 0.05 on layout with the options opts sets (nil: none), once on
// the CPU and once on the GPU d, and fails unless out, the residual and
// the statistics are the same bits on both. It returns the GPU's results,
// [call][rank].
func sameOnBoth(t *testing.T, d *cuda.Device, method string, layout sparsify.Layout, accs [][][]float32, opts func(*sparsify.Options)) [][]reducerCall {
	t.Helper()
	calls, n, N := len(accs), len(accs[0]), layout.N
	run := func(onGPU bool) [][]reducerCall {
		w := local.New(n)
		results := make([][]reducerCall, calls)
		for c := range results {
			results[c] = make([]reducerCall, n)
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		for rank := range n {
			wg.Go(func() {
				errs[rank] = func() error {
					ctx := context.Background()
					o := sparsify.Options{Density: 0.05, Layout: layout, Comm: w.Comm(rank)}
					if opts != nil {
						opts(&o)
					}
					var s device.Stream
					if onGPU {
						var err error
						if s, err = d.NewStream(); err != nil {
							return err
						}
						o.Comm, o.Stream, o.Ops = comm.Staged(o.Comm), s, d.Sparse()
					}
					r, err := sparsify.New(method, o)
					if err != nil {
						return err
					}
					residual := make([]float32, N)
					var res, out, grad, flag device.Buffer
					if onGPU {
						res, out, grad = upload(t, s, residual), upload(t, s, residual), upload(t, s, residual)
						if flag, err = d.Alloc(device.Int64, 1); err != nil {
							return err
						}
						if err := s.Copy(flag, device.Host([]int64{-1})); err != nil {
							return err
						}
					}
					for c := range calls {
						for i, g := range accs[c][rank] {
							residual[i] += g
						}
						var st sparsify.Stats
						outH := make([]float32, N)
						if onGPU {
							// As the trainer does: the accumulation on the GPU,
							// counting the selection's first round where the
							// reducer has a histogram for it.
							hist, err := r.Histogram()
							if err != nil {
								return err
							}
							results[c][rank].hist = hist.Len() > 0
							if hist.Len() > 0 {
								if err := s.Copy(grad, device.Host(accs[c][rank])); err != nil {
									return err
								}
								if err := d.Sparse().AccumulateFlagHist(s, res, grad, flag, hist, 0, 1); err != nil {
									return err
								}
							} else if err := s.Copy(res, device.Host(residual)); err != nil {
								return err
							}
							if st, err = r.ReduceOn(ctx, res, out, res); err != nil {
								return err
							}
							residual, outH = download(t, s, res), download(t, s, out)
						} else if st, err = r.Reduce(ctx, residual, outH, residual); err != nil {
							return err
						}
						results[c][rank].out, results[c][rank].res, results[c][rank].st = outH, slices.Clone(residual), st
					}
					return nil
				}()
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		return results
	}
	cpu, gpuR := run(false), run(true)
	for c := range calls {
		for rank := range n {
			g, want := gpuR[c][rank], cpu[c][rank]
			if !sameBits(g.out, want.out) {
				t.Fatalf("call %d rank %d: out %v, the CPU's %v", c, rank, g.out, want.out)
			}
			if !sameBits(g.res, want.res) {
				t.Fatalf("call %d rank %d: residual %v, the CPU's %v", c, rank, g.res, want.res)
			}
			a, b := g.st, want.st
			if a.Selected != b.Selected || a.ActualDensity != b.ActualDensity || a.ErrorNorm != b.ErrorNorm ||
				!slices.Equal(a.SelectedPerWorker, b.SelectedPerWorker) || !slices.Equal(a.LayerK, b.LayerK) || a.BytesSent != b.BytesSent || a.BytesRecv != b.BytesRecv ||
				!(a.Threshold == b.Threshold || (a.Threshold != a.Threshold && b.Threshold != b.Threshold)) {
				t.Fatalf("call %d rank %d: stats %+v, CPU %+v", c, rank, a, b)
			}
		}
	}
	return gpuR
}
