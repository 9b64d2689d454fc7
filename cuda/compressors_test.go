package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// halfEdgeFloats are float32 values at half precision's edges: ties,
// the largest half and the overflow to Inf, the smallest subnormal and
// below, float32 subnormals, Inf and NaN of both signs.
var halfEdgeFloats = []float32{0, float32(math.Copysign(0, -1)), 1, -1, 65504, 65519.99, 65520, -65520, 1e9,
	0x1p-24, 0x1p-25, 0x1.000002p-25, 0x1.8p-24, 0x1p-14, 0x1.ff8p-15, 1e-40, -1e-40, 1 + 0x1p-11, 1 + 0x3p-11,
	float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), -float32(math.NaN())}

// TestFP16KernelMatchesHost runs fp16's kernel (sparsify's
// Method.Kernels) on the GPU and its Host pass on the CPU on random float32
// bit patterns and the edges of half precision, for 1, 3 and 16 workers:
// the halves and the values cast back are the same bits.
func TestFP16KernelMatchesHost(t *testing.T) {
	d := gpu(t)
	m, _ := sparsify.Lookup("fp16")
	if len(m.Kernels) != 1 {
		t.Fatalf("fp16 declares %d kernels, want 1", len(m.Kernels))
	}
	k := m.Kernels[0]
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 35))
	x := slices.Clone(halfEdgeFloats)
	for range 5000 {
		switch rng.IntN(3) {
		case 0: // any bits
			x = append(x, math.Float32frombits(rng.Uint32()))
		case 1: // half's range
			x = append(x, float32(rng.NormFloat64()*math.Pow(2, float64(rng.IntN(40)-25))))
		default: // a half, or the midpoint of two
			h := uint16(rng.IntN(0x7c00))
			v := device.FromFloat16(h)
			if rng.IntN(2) == 0 {
				v = float32((float64(v) + float64(device.FromFloat16(h+1))) / 2)
			}
			x = append(x, v)
		}
	}
	n := len(x)
	ops := d.Sparse()
	for _, nw := range []float32{1, 3, 16} {
		// GPU.
		acc := upload(t, s, x)
		w, err := d.Alloc(device.Float16, n)
		if err != nil {
			t.Fatal(err)
		}
		out, res := upload(t, s, make([]float32, n)), upload(t, s, x)
		for mode := range int32(2) {
			if err := ops.Run(s, k, n, acc, w, out, res, int64(n), nw, mode); err != nil {
				t.Fatal(err)
			}
		}
		gw := make([]uint16, n)
		if err := s.Copy(device.Host(gw), w); err != nil {
			t.Fatal(err)
		}
		gout, gres := download(t, s, out), download(t, s, res)
		// Host.
		hw, hout, hres := make([]uint16, n), make([]float32, n), slices.Clone(x)
		for mode := range int32(2) {
			if err := sparsify.CPUOps().Run(device.CPU.Stream(), k, n, device.Host(slices.Clone(x)), device.Host(hw), device.Host(hout), device.Host(hres), int64(n), nw, mode); err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			if gw[i] != hw[i] {
				t.Fatalf("%v workers: x[%d] = %v (%#x): GPU half %#04x, host %#04x", nw, i, x[i], math.Float32bits(x[i]), gw[i], hw[i])
			}
			if want := device.ToFloat16(device.FromFloat16(device.ToFloat16(x[i])) / nw); hw[i] != want {
				t.Fatalf("%v workers: x[%d] = %v: host half %#04x, want %#04x", nw, i, x[i], hw[i], want)
			}
		}
		if !sameBits(gout, hout) || !sameBits(gres, hres) {
			t.Fatalf("%v workers: the values cast back differ", nw)
		}
		for _, b := range []device.Buffer{acc, w, out, res} {
			if err := d.Free(b); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestPeerSumFloat16 adds halves on the GPU (PeerSum, the staged
// all-reduce's device sum) for 1 to 16 buffers and compares with
// device.AddFloat16 left to right: the same bits.
func TestPeerSumFloat16(t *testing.T) {
	d := gpu(t)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 35))
	const n = 777
	for _, m := range []int{1, 2, 3, 5, 16} {
		hs := make([][]uint16, m)
		bufs := make([]device.Buffer, m)
		for k := range m {
			hs[k] = make([]uint16, n)
			for i := range hs[k] {
				hs[k][i] = uint16(rng.Uint32())
				if i%4 != 0 { // mostly finite, of mixed signs and scales
					hs[k][i] = uint16(rng.IntN(0x7800)) | uint16(rng.IntN(2))<<15
				}
			}
			b, err := d.Alloc(device.Float16, n)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Copy(b, device.Host(hs[k])); err != nil {
				t.Fatal(err)
			}
			bufs[k] = b
		}
		out, err := d.Alloc(device.Float16, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.PeerSum(s, bufs, 0, n, out); err != nil {
			t.Fatal(err)
		}
		got := make([]uint16, n)
		if err := s.Copy(device.Host(got), out); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			want := hs[0][i]
			for k := 1; k < m; k++ {
				want = device.AddFloat16(want, hs[k][i])
			}
			nan := func(h uint16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }
			if got[i] != want && !(nan(got[i]) && nan(want)) {
				t.Fatalf("%d buffers: element %d: GPU %#04x, AddFloat16 %#04x", m, i, got[i], want)
			}
		}
		for _, b := range append(bufs, out) {
			if err := d.Free(b); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// compressorLayout has what the compressors treat apart: 1-D tensors (sent
// dense by efsignsgd and powersgd), a tensor of several 4096-element
// blocks, a tall and a wide matrix, a 4-D tensor, sizes that are not
// multiples of 32, a tensor of unknown shape.
func compressorLayout(t *testing.T) sparsify.Layout {
	t.Helper()
	shapes := [][]int{{7}, {5000, 3}, {33, 2}, {1}, {3, 9001}, {4, 3, 3, 5}, nil, {1, 1}, {130}}
	var ts []layout.Tensor
	for i, s := range shapes {
		size := 1
		for _, d := range s {
			size *= d
		}
		if s == nil {
			size = 777
		}
		ts = append(ts, layout.Tensor{Name: fmt.Sprint("t", i), Shape: s, Size: size})
	}
	l, err := layout.Of(ts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// reduceOnBoth runs method name with options o (Layout, Params, Seed) on n
// in-process workers for calls calls with error feedback, on the CPU and
// on the GPU (each worker on its own stream, comm.Staged), from the same
// random normal gradients, and fails unless out and the residual are the
// same bits on both, and the statistics' threshold and counts the same.
// Worker w runs on devs[w mod len(devs)] (default: the first GPU).
func reduceOnBoth(t *testing.T, name string, o sparsify.Options, n, calls int, devs ...*cuda.Device) {
	t.Helper()
	if len(devs) == 0 {
		devs = []*cuda.Device{gpu(t)}
	}
	N := o.Layout.N
	rng := rand.New(rand.NewPCG(uint64(n), 35))
	grads := make([][][]float32, calls)
	for c := range grads {
		grads[c] = make([][]float32, n)
		for w := range n {
			grads[c][w] = randVec(rng, N, math.Pow(2, float64(rng.IntN(8)-4)))
		}
	}
	run := func(onGPU bool) (outs, ress [][][]float32, sts [][]sparsify.Stats) {
		w := local.New(n)
		outs, ress, sts = make([][][]float32, calls), make([][][]float32, calls), make([][]sparsify.Stats, calls)
		for c := range calls {
			outs[c], ress[c], sts[c] = make([][]float32, n), make([][]float32, n), make([]sparsify.Stats, n)
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		for rank := range n {
			wg.Go(func() {
				errs[rank] = func() error {
					oo := o
					oo.Comm = w.Comm(rank)
					var s device.Stream
					if onGPU {
						d := devs[rank%len(devs)]
						var err error
						if s, err = d.NewStream(); err != nil {
							return err
						}
						oo.Comm, oo.Stream, oo.Ops = comm.Staged(oo.Comm), s, d.Sparse()
					}
					r, err := sparsify.New(name, oo)
					if err != nil {
						return err
					}
					residual := make([]float32, N)
					var res, out device.Buffer
					if onGPU {
						res, out = upload(t, s, residual), upload(t, s, residual)
					}
					for c := range calls {
						for i, g := range grads[c][rank] {
							residual[i] += g
						}
						outH := make([]float32, N)
						var st sparsify.Stats
						if onGPU {
							if err := s.Copy(res, device.Host(residual)); err != nil {
								return err
							}
							if st, err = r.ReduceOn(context.Background(), res, out, res); err != nil {
								return err
							}
							residual, outH = download(t, s, res), download(t, s, out)
						} else if st, err = r.Reduce(context.Background(), residual, outH, residual); err != nil {
							return err
						}
						outs[c][rank], ress[c][rank], sts[c][rank] = outH, slices.Clone(residual), st
					}
					return nil
				}()
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		return outs, ress, sts
	}
	co, cr, cs := run(false)
	gpuO, gr, gs := run(true)
	for c := range calls {
		for w := range n {
			if !sameBits(gpuO[c][w], co[c][w]) {
				t.Fatalf("%s, %d workers, call %d, worker %d: out differs from the CPU's", name, n, c, w)
			}
			if !sameBits(gr[c][w], cr[c][w]) {
				t.Fatalf("%s, %d workers, call %d, worker %d: residual differs from the CPU's", name, n, c, w)
			}
			a, b := gs[c][w], cs[c][w]
			if math.Float64bits(a.Threshold) != math.Float64bits(b.Threshold) || a.Selected != b.Selected || a.BytesSent != b.BytesSent {
				t.Fatalf("%s, %d workers, call %d, worker %d: threshold %v, selected %d, bytes %d; the CPU's %v, %d, %d", name, n, c, w, a.Threshold, a.Selected, a.BytesSent, b.Threshold, b.Selected, b.BytesSent)
			}
		}
	}
}

// TestEFSignSGDOnGPU: EF-SignSGD's kernel on the GPU gives the CPU's bits
// on a layout of 1-D tensors, multi-block tensors and odd sizes, random
// normal gradients, 1, 2, 3 and 5 workers, three calls with error
// feedback.
func TestEFSignSGDOnGPU(t *testing.T) {
	l := compressorLayout(t)
	for _, n := range []int{1, 2, 3, 5} {
		reduceOnBoth(t, "efsignsgd", sparsify.Options{Layout: l, Density: 0.01, Seed: 3}, n, 3)
	}
}

// TestMSTopkOnGPU: MSTopk's search on the GPU (block statistics, the
// rounds' counts, the band read back) selects what the CPU selects: the
// same bits of out and residual on a layout of 43,000 elements (11 blocks),
// random normal gradients, 1, 2, 3 and 5 workers, three calls with error
// feedback, at two densities.
func TestMSTopkOnGPU(t *testing.T) {
	l := compressorLayout(t)
	for _, n := range []int{1, 2, 3, 5} {
		for _, rho := range []float64{0.001, 0.2} {
			reduceOnBoth(t, "mstopk", sparsify.Options{Layout: l, Density: rho, Seed: 9}, n, 3)
		}
	}
}

// TestPowerSGDOnGPU: PowerSGD's kernel on the GPU gives the CPU's bits
// (products in float64 in the same order; Gram–Schmidt on the device) on
// a layout of 1-D tensors, tall, wide and 4-D matrices and one of unknown
// shape, random normal gradients, ranks 1 and 4, 1, 2, 3 and 5 workers,
// three calls (warm start and error feedback).
func TestPowerSGDOnGPU(t *testing.T) {
	l := compressorLayout(t)
	for _, n := range []int{1, 2, 3, 5} {
		for _, rank := range []int{1, 4} {
			reduceOnBoth(t, "powersgd", sparsify.Options{Layout: l, Density: 0.01, Seed: 4, Params: sparsify.Values{"rank": rank}}, n, 3)
		}
	}
}

// TestCompressorsCutOffOnGPU: with -min-compress-size the tensors below it
// are all-reduced dense by the frame and the method runs on the others'
// views of the device vectors: the CPU's bits for every compressor, 2 and
// 3 workers.
func TestCompressorsCutOffOnGPU(t *testing.T) {
	l := compressorLayout(t)
	for _, name := range []string{"fp16", "efsignsgd", "powersgd", "mstopk"} {
		for _, n := range []int{2, 3} {
			reduceOnBoth(t, name, sparsify.Options{Layout: l, Density: 0.05, Seed: 6, Params: sparsify.Values{"min_compress_size": 200}}, n, 2)
		}
	}
}

// TestCompressorsAcrossGPUs: workers on two GPUs, their messages staged
// through host memory (comm.Staged: half precision, packed words, P and Q
// copied out, summed on the host in the canonical order, copied back):
// the CPU's bits for every compressor, 2 and 3 workers.
func TestCompressorsAcrossGPUs(t *testing.T) {
	d0 := gpu(t)
	if !cuda.EmulateGPUs(t, 2) {
		if c, err := cuda.Count(); err != nil || c < 2 {
			t.Skip("one GPU: the staged path between GPUs needs two")
		}
	}
	d1, err := cuda.Open(1, cuda.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l := compressorLayout(t)
	for _, name := range []string{"fp16", "efsignsgd", "powersgd", "mstopk"} {
		for _, n := range []int{2, 3} {
			reduceOnBoth(t, name, sparsify.Options{Layout: l, Density: 0.05, Seed: 8}, n, 2, d0, d1)
		}
	}
}
