package train

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/sparsegrad/sparsegrad/models"
)

// resnetSize is ResNet-18's parameter count (CIFAR-10).
const resnetSize = 11173962

func BenchmarkSGDStep(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	w, g := randVec(r, resnetSize), randVec(r, resnetSize)
	s := NewSGD([]models.ParamInfo{{Name: "conv.weight", Size: resnetSize}}, 0.9, 1e-4)
	b.SetBytes(4 * resnetSize)
	b.ResetTimer()
	for b.Loop() {
		s.Step(w, g, 1e-9)
	}
}

func BenchmarkAdamStep(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	w, g := randVec(r, resnetSize), randVec(r, resnetSize)
	a := NewAdam(resnetSize, 0.9, 0.999, 1e-8)
	b.SetBytes(4 * resnetSize)
	b.ResetTimer()
	for b.Loop() {
		a.Step(w, g, 1e-9)
	}
}

func BenchmarkClipNorm(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	g := randVec(r, resnetSize)
	b.SetBytes(4 * resnetSize)
	for b.Loop() {
		ClipNorm(g, 1e9)
	}
}

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
