package sparsify

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm/local"
)

// lagsResNet18Layout is the parameter layout of the CIFAR ResNet-18
// (11,173,962 elements) in parameter order, for benchmarks.
func lagsResNet18Layout(tb testing.TB) Layout {
	tb.Helper()
	var names []string
	var sizes []int
	add := func(name string, size int) { names = append(names, name); sizes = append(sizes, size) }
	bn := func(name string, c int) { add(name+".weight", c); add(name+".bias", c) }
	add("conv1.weight", 3*64*9)
	bn("bn1", 64)
	in := 64
	for li, out := range []int{64, 128, 256, 512} {
		for b := range 2 {
			p := fmt.Sprintf("layer%d.%d.", li+1, b)
			cin := in
			if b == 1 {
				cin = out
			}
			add(p+"conv1.weight", cin*out*9)
			bn(p+"bn1", out)
			add(p+"conv2.weight", out*out*9)
			bn(p+"bn2", out)
			if b == 0 && cin != out {
				add(p+"shortcut.0.weight", cin*out)
				bn(p+"shortcut.1", out)
			}
		}
		in = out
	}
	add("linear.weight", 512*10)
	add("linear.bias", 10)
	l, err := NewLayout(names, sizes)
	if err != nil {
		tb.Fatal(err)
	}
	if l.N != 11173962 {
		tb.Fatalf("ResNet-18 layout has %d elements, want 11173962", l.N)
	}
	return l
}

// lagsBenchReduce measures one Reduce of method on n in-process workers (all
// workers reduce concurrently; one op = one iteration of the whole world).
func lagsBenchReduce(b *testing.B, method string, n int, l Layout, edit func(*Options)) {
	w := local.New(n)
	reducers := make([]*Reducer, n)
	accs := make([][]float32, n)
	outs := make([][]float32, n)
	ress := make([][]float32, n)
	for r := range n {
		o := Options{Density: 0.01, Layout: l, Comm: w.Comm(r)}
		if edit != nil {
			edit(&o)
		}
		red, err := New(method, o)
		if err != nil {
			b.Fatal(err)
		}
		reducers[r] = red
		accs[r] = make([]float32, l.N)
		genNormal(rand.New(rand.NewPCG(uint64(r), 1)), accs[r])
		outs[r], ress[r] = make([]float32, l.N), make([]float32, l.N)
	}
	ctx := context.Background()
	b.SetBytes(int64(4 * l.N))
	b.ResetTimer()
	for b.Loop() {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for r := range n {
			wg.Go(func() { _, errs[r] = reducers[r].Reduce(ctx, accs[r], outs[r], ress[r]) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkLAGSReduce(b *testing.B) {
	l := lagsResNet18Layout(b)
	for _, n := range []int{1, 4} {
		for _, merge := range []int{0, 1} {
			b.Run(fmt.Sprintf("workers=%d/N=%d/merge=%d", n, l.N, merge), func(b *testing.B) {
				lagsBenchReduce(b, "lags", n, l, func(o *Options) { o.Params = lagsMerge(merge) })
			})
		}
	}
}
