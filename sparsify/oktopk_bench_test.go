package sparsify

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"

	"github.com/sparsegrad/sparsegrad/comm/local"
)

// okBenchReduce measures one Reduce of method on n in-process workers (run
// concurrently; one op = one call of every worker) on the ResNet-18 layout
// with fixed standard-normal accs, density 0.01 and no warm-up. It reports
// rank 0's bytes sent, actual density, selection and communication time per
// call, averaged over the calls (for oktopk the mix of its 32-call
// schedule).
func okBenchReduce(b *testing.B, method string, n int) {
	l := lagsResNet18Layout(b)
	w := local.New(n)
	reducers := make([]*Reducer, n)
	accs, outs, ress := make([][]float32, n), make([][]float32, n), make([][]float32, n)
	for r := range n {
		red, err := New(method, Options{Density: 0.01, Layout: l, Comm: w.Comm(r), Params: Values{"dense_warmup": 0}})
		if err != nil {
			b.Fatal(err)
		}
		reducers[r] = red
		accs[r] = make([]float32, l.N)
		genNormal(harnessRNG(42, 0, r), accs[r])
		outs[r], ress[r] = make([]float32, l.N), make([]float32, l.N)
	}
	stats := make([]Stats, n)
	ctx := context.Background()
	run := func() {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for r := range n {
			wg.Go(func() { stats[r], errs[r] = reducers[r].Reduce(ctx, accs[r], outs[r], ress[r]) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	run() // the first call allocates the buffers
	var sel, com, sent, dens float64
	calls := 0
	b.SetBytes(int64(4 * l.N))
	b.ResetTimer()
	for b.Loop() {
		run()
		calls++
		sel += stats[0].SelectTime.Seconds()
		com += stats[0].CommTime.Seconds()
		sent += float64(stats[0].BytesSent)
		dens += stats[0].ActualDensity
	}
	c := float64(calls)
	b.ReportMetric(sent/c, "B-sent/op")
	b.ReportMetric(dens/c, "actual-density")
	b.ReportMetric(sel/c*1e3, "select-ms/op")
	b.ReportMetric(com/c*1e3, "comm-ms/op")
}

// BenchmarkOkMethodsReduce: topkdsa and oktopk on 1 and 4 workers, N =
// 11,173,962 (ResNet-18), density 0.01.
func BenchmarkOkMethodsReduce(b *testing.B) {
	for _, m := range []string{"topkdsa", "oktopk"} {
		for _, n := range []int{1, 4} {
			b.Run(fmt.Sprintf("%s/n=%d/N=11173962/rho=0.01", m, n), func(b *testing.B) { okBenchReduce(b, m, n) })
		}
	}
}

// BenchmarkOkTopkLocalSelect is one Ok-Topk worker's local selection on
// N = 11,173,962 standard-normal values at density 0.01: "recompute" is the
// exact threshold (KthLargestAbs) then the strict SelectAbove (every 32nd
// call), "reuse" the count of the reused threshold then SelectAbove (the
// other calls, when no raise is needed), "count" the count alone.
func BenchmarkOkTopkLocalSelect(b *testing.B) {
	x := selBenchData()
	k := BudgetK(0.01, len(x))
	thr := KthLargestAbs(x, k)
	var dst []int32
	b.Run("recompute", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			t := KthLargestAbs(x, k)
			dst = SelectAbove(dst, x, okAbove(t))
		}
	})
	b.Run("reuse", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			_, _ = CPUOps().CountAbove(nil, device.Host(x), okAbove(thr))
			dst = SelectAbove(dst, x, okAbove(thr))
		}
	})
	b.Run("count", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			_, _ = CPUOps().CountAbove(nil, device.Host(x), okAbove(thr))
		}
	})
}
