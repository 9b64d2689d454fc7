package models

import (
	"math"
	"math/rand/v2"
)

// initRNG is the deterministic generator parameters are initialised from.
// Tensors are filled in parameter order from one stream, so the same seed
// gives the same model.
type initRNG struct{ r *rand.Rand }

func newInitRNG(seed uint64) *initRNG {
	return &initRNG{r: rand.New(rand.NewPCG(seed, 0x6d6f64656c73))} // "models"
}

// uniform fills x with U(-bound, bound).
func (g *initRNG) uniform(x []float32, bound float64) {
	for i := range x {
		x[i] = float32((2*g.r.Float64() - 1) * bound)
	}
}

// normal fills x with N(0, std²).
func (g *initRNG) normal(x []float32, std float64) {
	for i := range x {
		x[i] = float32(g.r.NormFloat64() * std)
	}
}

func fill(x []float32, v float32) {
	for i := range x {
		x[i] = v
	}
}

// torchDefaultBound is the bound of PyTorch's default initialisation of
// nn.Linear / nn.Conv2d weights and biases (kaiming_uniform with a=√5,
// which reduces to U(-1/√fan_in, 1/√fan_in)).
func torchDefaultBound(fanIn int) float64 { return 1 / math.Sqrt(float64(fanIn)) }

// dropoutRNG draws inverted-dropout masks. Masks are inputs of the graph
// (Gorgonia's own Dropout seeds itself from the clock, which would make
// runs irreproducible).
type dropoutRNG struct {
	r   *rand.Rand
	src *rand.PCG // r's source, whose state checkpoints save (stateful.go)
}

func newDropoutRNG(seed uint64) *dropoutRNG {
	src := rand.NewPCG(seed, 0x64726f70) // "drop"
	return &dropoutRNG{r: rand.New(src), src: src}
}

// mask fills m with 0 (probability p) or 1/(1-p).
func (d *dropoutRNG) mask(m []float32, p float64) {
	if p <= 0 {
		fill(m, 1)
		return
	}
	keep := float32(1 / (1 - p))
	for i := range m {
		if d.r.Float64() < p {
			m[i] = 0
		} else {
			m[i] = keep
		}
	}
}
