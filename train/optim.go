package train

import (
	"fmt"
	"math"
	"regexp"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
)

// Optimizer updates a parameter vector in place from the averaged
// gradient; both are device vectors, and the update runs on their device's
// stream with the device's math (Go loops on the CPU, kernels on a GPU).
type Optimizer interface {
	// Step applies one update with learning rate lr.
	Step(params, grad device.Buffer, lr float64) error
	// State copies the optimizer's state vectors to host memory (for
	// checkpoints) and returns them with the step count.
	State() (vecs [][]float32, steps int64, err error)
	// SetState restores what State returned.
	SetState(vecs [][]float32, steps int64) error
}

// bnParam matches the BatchNorm parameters the reference harness exempts
// from weight decay (".bn1.weight", ".bn2.bias", ...).
var bnParam = regexp.MustCompile(`.*\.bn\d+\.(weight|bias)$`)

// SGD is stochastic gradient descent with momentum, optional Nesterov
// momentum and weight decay in PyTorch's semantics (device.SGDStep): weight
// decay 0 for parameters matching `.*\.bn\d+\.(weight|bias)`, as in the
// DEFT/MiCRO harness. This is not the DEFT/MiCRO harness's "nesterov"
// (w −= lr·(d + buf) without the momentum factor), which doubles the step.
//
// With DecayOnly (a sparsifier that applies the momentum itself, DGC's
// momentum correction: sparsify.Method.CorrectsMomentum) the momentum is
// applied to the weight decay only, as DGC's optimizer does: buf ← m·buf +
// wd·w, w ← w − lr·(g + buf).
type SGD struct {
	Momentum float64
	Nesterov bool
	// DecayOnly applies the momentum to the weight decay only (see SGD).
	DecayOnly bool
	s         device.Stream
	decay     []decaySpan // weight decay per run of elements, ascending
	buf       device.Buffer
	zeros     device.Buffer // DecayOnly: a zero gradient for the decay's step
	steps     int64
}

// decaySpan is a run [lo, hi) of parameters with one weight decay.
type decaySpan struct {
	lo, hi int
	wd     float32
}

// NewSGD returns SGD for the given parameter layout, with its momentum
// buffer on the stream's device.
func NewSGD(s device.Stream, layout []models.ParamInfo, momentum, wd float64, nesterov bool) (*SGD, error) {
	n := 0
	for _, p := range layout {
		n = max(n, p.Offset+p.Size)
	}
	o := &SGD{Momentum: momentum, Nesterov: nesterov, s: s}
	for _, p := range layout {
		d := float32(wd)
		if bnParam.MatchString(p.Name) {
			d = 0
		}
		if k := len(o.decay); k > 0 && o.decay[k-1].hi == p.Offset && o.decay[k-1].wd == d {
			o.decay[k-1].hi = p.Offset + p.Size
		} else if p.Size > 0 {
			o.decay = append(o.decay, decaySpan{p.Offset, p.Offset + p.Size, d})
		}
	}
	if momentum != 0 {
		b, err := s.Device().Alloc(device.Float32, n)
		if err != nil {
			return nil, fmt.Errorf("train: SGD momentum buffer: %w", err)
		}
		o.buf = b
	}
	return o, nil
}

// NewDecayOnlySGD is NewSGD with the momentum applied to the weight decay
// only (SGD.DecayOnly; no Nesterov).
func NewDecayOnlySGD(s device.Stream, layout []models.ParamInfo, momentum, wd float64) (*SGD, error) {
	o, err := NewSGD(s, layout, momentum, wd, false)
	if err != nil || momentum == 0 {
		return o, err
	}
	o.DecayOnly = true
	if o.zeros, err = s.Device().Alloc(device.Float32, o.buf.Len()); err != nil {
		return nil, fmt.Errorf("train: SGD: %w", err)
	}
	if err := s.Device().Math().Fill(s, o.zeros, 0); err != nil {
		return nil, err
	}
	return o, nil
}

// Step implements Optimizer.
func (o *SGD) Step(w, g device.Buffer, lr float64) error {
	p := device.SGDStep{LR: float32(lr), Momentum: float32(o.Momentum), Nesterov: o.Nesterov, First: o.steps == 0}
	o.steps++
	m := o.s.Device().Math()
	if o.DecayOnly {
		// Two steps per run: the decay's with its momentum (a zero
		// gradient: buf ← m·buf + wd·w, w ← w − lr·buf), then the
		// gradient's without (w ← w − lr·g).
		for _, sp := range o.decay {
			ws := w.Slice(sp.lo, sp.hi)
			if sp.wd != 0 {
				p.WeightDecay = sp.wd
				if err := m.SGD(o.s, p, ws, o.zeros.Slice(sp.lo, sp.hi), o.buf.Slice(sp.lo, sp.hi)); err != nil {
					return fmt.Errorf("train: SGD step: %w", err)
				}
			}
			if err := m.SGD(o.s, device.SGDStep{LR: p.LR}, ws, g.Slice(sp.lo, sp.hi), device.Buffer{}); err != nil {
				return fmt.Errorf("train: SGD step: %w", err)
			}
		}
		return nil
	}
	for _, sp := range o.decay {
		p.WeightDecay = sp.wd
		var buf device.Buffer
		if o.Momentum != 0 {
			buf = o.buf.Slice(sp.lo, sp.hi)
		}
		if err := m.SGD(o.s, p, w.Slice(sp.lo, sp.hi), g.Slice(sp.lo, sp.hi), buf); err != nil {
			return fmt.Errorf("train: SGD step: %w", err)
		}
	}
	return nil
}

// State implements Optimizer.
func (o *SGD) State() ([][]float32, int64, error) {
	if o.Momentum == 0 {
		return nil, o.steps, nil
	}
	v, err := toHost(o.s, o.buf)
	return [][]float32{v}, o.steps, err
}

// SetState implements Optimizer.
func (o *SGD) SetState(v [][]float32, steps int64) error {
	want := 0
	if o.Momentum != 0 {
		want = 1
	}
	if len(v) != want || (want == 1 && len(v[0]) != o.buf.Len()) {
		return fmt.Errorf("train: SGD state has %d vectors, want %d of %d values (checkpoint from another model or optimizer?)", len(v), want, o.buf.Len())
	}
	if want == 1 {
		if err := fromHost(o.s, o.buf, v[0]); err != nil {
			return err
		}
	}
	o.steps = steps
	return nil
}

// Adam is PyTorch's Adam without weight decay (device.AdamStep).
type Adam struct {
	Beta1, Beta2, Eps float64
	s                 device.Stream
	m, v              device.Buffer
	steps             int64
}

// NewAdam returns Adam for n parameters, its moments on the stream's
// device.
func NewAdam(s device.Stream, n int, beta1, beta2, eps float64) (*Adam, error) {
	a := &Adam{Beta1: beta1, Beta2: beta2, Eps: eps, s: s}
	var err error
	if a.m, err = s.Device().Alloc(device.Float32, n); err != nil {
		return nil, fmt.Errorf("train: Adam moments: %w", err)
	}
	if a.v, err = s.Device().Alloc(device.Float32, n); err != nil {
		return nil, fmt.Errorf("train: Adam moments: %w", err)
	}
	return a, nil
}

// Step implements Optimizer.
func (a *Adam) Step(w, g device.Buffer, lr float64) error {
	a.steps++
	t := float64(a.steps)
	bc1 := 1 - math.Pow(a.Beta1, t)
	bc2 := 1 - math.Pow(a.Beta2, t)
	p := device.AdamStep{StepSize: float32(lr / bc1), Beta1: float32(a.Beta1), Beta2: float32(a.Beta2), Eps: float32(a.Eps), SqrtBC2: float32(math.Sqrt(bc2))}
	if err := a.s.Device().Math().Adam(a.s, p, w, g, a.m, a.v); err != nil {
		return fmt.Errorf("train: Adam step: %w", err)
	}
	return nil
}

// State implements Optimizer.
func (a *Adam) State() ([][]float32, int64, error) {
	m, err := toHost(a.s, a.m)
	if err != nil {
		return nil, 0, err
	}
	v, err := toHost(a.s, a.v)
	return [][]float32{m, v}, a.steps, err
}

// SetState implements Optimizer.
func (a *Adam) SetState(v [][]float32, steps int64) error {
	if len(v) != 2 || len(v[0]) != a.m.Len() || len(v[1]) != a.v.Len() {
		return fmt.Errorf("train: Adam state has %d vectors, want 2 of %d values (checkpoint from another model or optimizer?)", len(v), a.m.Len())
	}
	if err := fromHost(a.s, a.m, v[0]); err != nil {
		return err
	}
	if err := fromHost(a.s, a.v, v[1]); err != nil {
		return err
	}
	a.steps = steps
	return nil
}

// toHost returns a copy of a device vector in host memory.
func toHost(s device.Stream, b device.Buffer) ([]float32, error) {
	h := make([]float32, b.Len())
	if err := s.Copy(device.Host(h), b); err != nil {
		return nil, err
	}
	return h, s.Synchronize()
}

// fromHost copies host values into a device vector.
func fromHost(s device.Stream, b device.Buffer, h []float32) error {
	if err := s.Copy(b, device.Host(h)); err != nil {
		return err
	}
	return s.Synchronize()
}

// Schedule is a learning-rate schedule. By default it is linear warm-up over
// WarmupIters iterations (iteration i uses base·(i+1)/WarmupIters), then
// step decay: the rate is multiplied by Factor at the start of every epoch in
// DecayEpochs.
//
// With OneCycleIters > 0 it is the one-cycle policy (Smith & Topin, "Super-
// Convergence", 2019) over that many iterations, as PyTorch's OneCycleLR
// with its defaults: the rate rises from Base/25 to Base over the first
// WarmupIters iterations (30 % of the cycle when WarmupIters is 0), then
// falls to Base/25/10⁴ at the cycle's last iteration, both halves on a
// cosine; later iterations keep the final rate. Unlike OneCycleLR it leaves
// the momentum constant.
type Schedule struct {
	Base          float64
	WarmupIters   int
	DecayEpochs   []int
	Factor        float64
	OneCycleIters int
}

// At returns the learning rate of global iteration it (0-based) in epoch
// (0-based).
func (s Schedule) At(it, epoch int) float64 {
	if s.OneCycleIters > 0 {
		return s.oneCycle(it)
	}
	lr := s.Base
	for _, e := range s.DecayEpochs {
		if epoch >= e {
			lr *= s.Factor
		}
	}
	if it < s.WarmupIters {
		lr *= float64(it+1) / float64(s.WarmupIters)
	}
	return lr
}

// oneCycle is At for the one-cycle policy. As in OneCycleLR, the rise ends
// at iteration up and the fall at the cycle's last iteration, each a cosine
// between its end points.
func (s Schedule) oneCycle(it int) float64 {
	initial := s.Base / 25
	final := initial / 1e4
	last := float64(s.OneCycleIters - 1)
	up := float64(s.WarmupIters) - 1
	if s.WarmupIters == 0 {
		up = 0.3*float64(s.OneCycleIters) - 1
	}
	anneal := func(from, to, pct float64) float64 {
		pct = min(max(pct, 0), 1)
		return to + (from-to)/2*(math.Cos(math.Pi*pct)+1)
	}
	x := float64(it)
	if x <= up {
		if up <= 0 {
			return s.Base
		}
		return anneal(initial, s.Base, x/up)
	}
	if last <= up {
		return final
	}
	return anneal(s.Base, final, (x-up)/(last-up))
}

// ClipNorm scales the gradient g so that its Euclidean norm is at most
// maxNorm, as torch.nn.utils.clip_grad_norm_ does (factor
// maxNorm/(norm+1e-6) when the norm exceeds maxNorm), and returns the norm
// before clipping.
func ClipNorm(s device.Stream, g device.Buffer, maxNorm float64) (float64, error) {
	m := s.Device().Math()
	ss, err := m.SumSquares(s, g)
	if err != nil {
		return 0, fmt.Errorf("train: gradient norm: %w", err)
	}
	norm := math.Sqrt(ss)
	if norm > maxNorm {
		if err := m.Scale(s, g, float32(maxNorm/(norm+1e-6))); err != nil {
			return 0, fmt.Errorf("train: clipping: %w", err)
		}
	}
	return norm, nil
}
