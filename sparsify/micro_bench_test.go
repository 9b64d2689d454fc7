//go:build unix

package sparsify

import (
	"fmt"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
)

// BenchmarkMicroSelect is one MiCRO worker's selection at n = 16 on the
// ResNet-18 layout: SelectAbove over its partition of N/16 elements with the
// threshold that gives density ρ (the k-th largest magnitude of the
// partition), next to SelectAbove over all N.
func BenchmarkMicroSelect(b *testing.B) {
	l, err := deftResNet18Layout()
	if err != nil {
		b.Fatal(err)
	}
	acc := deftBenchGrad(l)
	const n = 16
	lo, hi := comm.ChunkBounds(l.N, n, 0)
	part := acc[lo:hi]
	for _, density := range []float64{0.01, 0.001} {
		thr := KthLargestAbs(part, BudgetK(density, len(part)))
		var dst []int32
		b.Run(fmt.Sprintf("rho=%g/partition", density), func(b *testing.B) {
			b.SetBytes(int64(4 * len(part)))
			deftBenchLoop(b, func() { dst = SelectAbove(dst, part, thr) })
		})
		b.Run(fmt.Sprintf("rho=%g/full", density), func(b *testing.B) {
			b.SetBytes(int64(4 * len(acc)))
			deftBenchLoop(b, func() { dst = SelectAbove(dst, acc, thr) })
		})
	}
}

// BenchmarkMicroReduce is a whole MiCRO iteration on the ResNet-18 layout
// with 2 in-process workers (ns/op is one iteration of both).
func BenchmarkMicroReduce(b *testing.B) {
	deftBenchReduce(b, "micro", 2, 0.01)
}
