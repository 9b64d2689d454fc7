package train

import (
	"context"
	"testing"
)

// BenchmarkTrainNCF is whole trainer iterations: NCF (paper preset) on the
// real ml-100k, 4 in-process workers, DEFT at density 0.01 (ns/op is per
// 20 iterations, including start-up and one small evaluation).
func BenchmarkTrainNCF(b *testing.B) {
	for b.Loop() {
		c := ncfConfig(b, 4, 20)
		c.Sparsifier, c.BLAS = "deft", "auto"
		if err := Run(context.Background(), c, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
