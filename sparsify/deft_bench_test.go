package sparsify

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm/local"
)

// deftResNet18Layout is the layout of the CIFAR ResNet-18 of the DEFT/MiCRO
// code (notes 8.1): its 62 parameter tensors in PyTorch parameters() order,
// 11,173,962 elements.
func deftResNet18Layout() (Layout, error) {
	var names []string
	var sizes []int
	add := func(name string, size int) {
		names = append(names, name)
		sizes = append(sizes, size)
	}
	bn := func(prefix string, c int) {
		add(prefix+".weight", c)
		add(prefix+".bias", c)
	}
	add("conv1.weight", 64*3*3*3)
	bn("bn1", 64)
	in := 64
	for stage, out := range []int{64, 128, 256, 512} {
		for block := range 2 {
			p := fmt.Sprintf("layer%d.%d", stage+1, block)
			cin := out
			if block == 0 {
				cin = in
			}
			add(p+".conv1.weight", out*cin*3*3)
			bn(p+".bn1", out)
			add(p+".conv2.weight", out*out*3*3)
			bn(p+".bn2", out)
			if block == 0 && cin != out {
				add(p+".shortcut.0.weight", out*cin)
				bn(p+".shortcut.1", out)
			}
		}
		in = out
	}
	add("linear.weight", 512*10)
	add("linear.bias", 10)
	return NewLayout(names, sizes)
}

func TestDeftResNet18Layout(t *testing.T) {
	l, err := deftResNet18Layout()
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Tensors) != 62 || l.N != 11_173_962 {
		t.Fatalf("ResNet-18 layout has %d tensors and %d elements, want 62 and 11173962", len(l.Tensors), l.N)
	}
}

// deftBenchGrad is a deterministic stand-in gradient for the layout: normal
// values with a per-tensor scale drawn log-uniformly from [1e-3, 1], so that
// layer norms differ as they do in real training.
func deftBenchGrad(l Layout) []float32 {
	rng := rand.New(rand.NewPCG(2023, 10))
	g := make([]float32, l.N)
	for _, t := range l.Tensors {
		scale := math.Pow(10, -3*rng.Float64())
		for i := t.Offset; i < t.Offset+t.Size; i++ {
			g[i] = float32(rng.NormFloat64() * scale)
		}
	}
	return g
}

// deftBenchBins returns the fragments, one worker's k_f and the bins the
// leader computes for n workers on acc.
func deftBenchBins(l Layout, acc []float32, n int, density float64) ([]deftFrag, []int, [][]int32) {
	frags := deftFragments(l, n)
	L := len(frags)
	norms := make([]float64, L)
	kf := make([]int, L)
	deftNorms(norms, acc, frags)
	deftAllocate(kf, frags, norms, BudgetK(density, l.N), make([]int, L), make([]float64, L))
	lens, content := make([]int32, n), make([]int32, L)
	deftPack(frags, kf, n, lens, content)
	bins := make([][]int32, n)
	pos := 0
	for b := range n {
		bins[b] = content[pos : pos+int(lens[b])]
		pos += int(lens[b])
	}
	return frags, kf, bins
}

// deftBenchSelectBin is one worker's selection over its bin.
func deftBenchSelectBin(acc []float32, frags []deftFrag, kf []int, bin []int32, scratch, mine []int32) ([]int32, []int32) {
	mine = mine[:0]
	for _, f := range bin {
		fr := frags[f]
		scratch = TopK(scratch, acc[fr.lo:fr.hi], kf[f])
		for _, j := range scratch {
			mine = append(mine, j+int32(fr.lo))
		}
	}
	return scratch, mine
}

// BenchmarkDeftSelect compares, on the ResNet-18 layout with n = 16, the
// selection time of DEFT's slowest worker (its bin as the real algorithm
// packs it) with TopK over the whole vector with k = ρN:
//
//   - topk-full: TopK over all N elements (what every Top-k worker does);
//   - bin-max: top-k of every fragment of the bin that takes longest;
//   - bins-all: all 16 bins one after the other (ns/op ÷ 16 = mean bin);
//   - worker-max: bin-max plus the work every DEFT worker does besides
//     (fragment norms over all N, allocation, and the leader's packing).
func BenchmarkDeftSelect(b *testing.B) {
	l, err := deftResNet18Layout()
	if err != nil {
		b.Fatal(err)
	}
	acc := deftBenchGrad(l)
	const n = 16
	for _, density := range []float64{0.01, 0.001} {
		frags, kf, bins := deftBenchBins(l, acc, n, density)
		k := BudgetK(density, l.N)
		var scratch, mine []int32
		// Find the slowest bin (minimum of 5 timings per bin).
		slow, slowT := 0, time.Duration(0)
		for bi, bin := range bins {
			best := time.Duration(math.MaxInt64)
			for range 5 {
				t0 := time.Now()
				scratch, mine = deftBenchSelectBin(acc, frags, kf, bin, scratch, mine)
				best = min(best, time.Since(t0))
			}
			if best > slowT {
				slow, slowT = bi, best
			}
		}
		elems := 0
		for _, f := range bins[slow] {
			elems += frags[f].size()
		}
		b.Run(fmt.Sprintf("rho=%g/topk-full", density), func(b *testing.B) {
			var dst []int32
			for b.Loop() {
				dst = TopK(dst, acc, k)
			}
		})
		b.Run(fmt.Sprintf("rho=%g/bin-max", density), func(b *testing.B) {
			for b.Loop() {
				scratch, mine = deftBenchSelectBin(acc, frags, kf, bins[slow], scratch, mine)
			}
			b.ReportMetric(float64(elems), "elems")
			b.ReportMetric(float64(len(bins[slow])), "frags")
		})
		b.Run(fmt.Sprintf("rho=%g/bins-all", density), func(b *testing.B) {
			for b.Loop() {
				for _, bin := range bins {
					scratch, mine = deftBenchSelectBin(acc, frags, kf, bin, scratch, mine)
				}
			}
		})
		b.Run(fmt.Sprintf("rho=%g/worker-max", density), func(b *testing.B) {
			L := len(frags)
			norms, kf2 := make([]float64, L), make([]int, L)
			order, suffix := make([]int, L), make([]float64, L)
			lens, content := make([]int32, n), make([]int32, L)
			for b.Loop() {
				deftNorms(norms, acc, frags)
				deftAllocate(kf2, frags, norms, k, order, suffix)
				deftPack(frags, kf2, n, lens, content)
				scratch, mine = deftBenchSelectBin(acc, frags, kf2, bins[slow], scratch, mine)
			}
		})
	}
}

// BenchmarkDeftNorms is the per-fragment norm pass every DEFT worker makes
// over all N elements each iteration.
func BenchmarkDeftNorms(b *testing.B) {
	l, err := deftResNet18Layout()
	if err != nil {
		b.Fatal(err)
	}
	acc := deftBenchGrad(l)
	frags := deftFragments(l, 16)
	norms := make([]float64, len(frags))
	b.SetBytes(int64(4 * l.N))
	for b.Loop() {
		deftNorms(norms, acc, frags)
	}
}

// BenchmarkDeftReduce is a whole DEFT iteration on the ResNet-18 layout with
// 2 in-process workers (ns/op is one iteration of both, including adding the
// gradient to the residual as error feedback does).
func BenchmarkDeftReduce(b *testing.B) {
	deftBenchReduce(b, "deft", 2, 0.01)
}

// deftBenchReduce times iterations of method on n in-process workers over the
// ResNet-18 layout.
func deftBenchReduce(b *testing.B, method string, n int, density float64) {
	l, err := deftResNet18Layout()
	if err != nil {
		b.Fatal(err)
	}
	grad := deftBenchGrad(l)
	w := local.New(n)
	reducers := make([]Reducer, n)
	accs, outs := make([][]float32, n), make([][]float32, n)
	for r := range n {
		if reducers[r], err = New(method, Options{Density: density, Layout: l, Comm: w.Comm(r)}); err != nil {
			b.Fatal(err)
		}
		accs[r] = append([]float32(nil), grad...)
		outs[r] = make([]float32, l.N)
	}
	ctx := context.Background()
	errs := make(chan error, n)
	b.ResetTimer()
	for b.Loop() {
		for r := range n {
			go func() {
				for i, g := range grad {
					accs[r][i] += g
				}
				_, err := reducers[r].Reduce(ctx, accs[r], outs[r], accs[r])
				if err != nil {
					w.Abort(r, err)
				}
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
	}
}
