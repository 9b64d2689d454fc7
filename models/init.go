package models

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
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

// maskDrawer is implemented by devices that draw dropout masks in their
// own memory (cuda.Device): DropoutMask fills dst, on stream s, with the
// mask mask would draw from the PCG state (hi, lo) — element i is 0 where
// the low 53 bits of the stream's (i+1)-th output are below threshold,
// else keep — and leaves the state to the caller.
type maskDrawer interface {
	DropoutMask(s device.Stream, dst device.Buffer, hi, lo, threshold uint64, keep float32) error
}

// drawMask fills input i of e with the stream's next mask of dropout
// probability p: on the device where it draws masks (the same bits as
// mask, with the stream advanced past them on the host), else on the host
// and uploaded.
func (d *dropoutRNG) drawMask(e *engine.Executor, i int, p float64) error {
	md, ok := e.Device().(maskDrawer)
	if !ok || p <= 0 {
		return fillFloat32s(e, i, func(dst []float32) { d.mask(dst, p) })
	}
	dst := e.Input(i)
	hi, lo := d.state()
	if err := md.DropoutMask(e.Stream(), dst, hi, lo, dropThreshold(p), float32(1/(1-p))); err != nil {
		return fmt.Errorf("models: drawing a dropout mask on %v: %w", e.Device(), err)
	}
	d.skip(uint64(dst.Len()))
	return nil
}

// dropThreshold is the integer form of mask's test: Float64() < p, with
// Float64() = x/2⁵³ for x the low 53 bits of a draw, holds exactly when
// x < ⌈p·2⁵³⌉ (p·2⁵³ is exact in float64, 0 < p < 1).
func dropThreshold(p float64) uint64 { return uint64(math.Ceil(p * (1 << 53))) }

// state returns the PCG's state (high and low words).
func (d *dropoutRNG) state() (hi, lo uint64) {
	b, _ := d.src.MarshalBinary() // "pcg:", hi, lo big-endian
	return binary.BigEndian.Uint64(b[4:]), binary.BigEndian.Uint64(b[12:])
}

// skip advances the stream past n draws, as n calls of Float64 do.
func (d *dropoutRNG) skip(n uint64) {
	hi, lo := d.state()
	hi, lo = pcgJump(hi, lo, n)
	b := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte("pcg:"), hi), lo)
	if err := d.src.UnmarshalBinary(b); err != nil {
		panic(err) // the encoding above is the PCG's own
	}
}

// pcgJump returns the state of math/rand/v2's PCG with state (hi, lo)
// after n steps, in O(log n): the generator is the 128-bit LCG
// s ← a·s + c, and n steps are s ← A·s + C with A = aⁿ and
// C = c·(aⁿ⁻¹ + … + a + 1), built by squaring (F. Brown, "Random number
// generation with arbitrary strides", 1994). The GPU's dropout kernel jumps
// the same way to its first element.
func pcgJump(hi, lo, n uint64) (uint64, uint64) {
	mul := u128{2549297995355413924, 4865540595714422341}
	inc := u128{6364136223846793005, 1442695040888963407}
	accMul, accInc := u128{0, 1}, u128{}
	for ; n > 0; n >>= 1 {
		if n&1 == 1 {
			accMul = accMul.mul(mul)
			accInc = accInc.mul(mul).add(inc)
		}
		inc = mul.add(u128{0, 1}).mul(inc)
		mul = mul.mul(mul)
	}
	s := accMul.mul(u128{hi, lo}).add(accInc)
	return s.hi, s.lo
}

// u128 is an unsigned 128-bit integer; arithmetic wraps.
type u128 struct{ hi, lo uint64 }

func (a u128) mul(b u128) u128 {
	hi, lo := bits.Mul64(a.lo, b.lo)
	return u128{hi + a.hi*b.lo + a.lo*b.hi, lo}
}

func (a u128) add(b u128) u128 {
	lo, c := bits.Add64(a.lo, b.lo, 0)
	hi, _ := bits.Add64(a.hi, b.hi, c)
	return u128{hi, lo}
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
