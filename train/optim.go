package train

import (
	"fmt"
	"math"
	"regexp"
	"runtime"
	"sync"

	"github.com/sparsegrad/sparsegrad/models"
)

// Optimizer updates parameters in place from the averaged gradient.
type Optimizer interface {
	// Step applies one update with learning rate lr.
	Step(params, grad []float32, lr float64)
	// State returns the optimizer's state vectors and step count (for
	// checkpoints); the slices are live.
	State() (vecs [][]float32, steps int64)
	// SetState restores what State returned.
	SetState(vecs [][]float32, steps int64) error
}

// bnParam matches the BatchNorm parameters the reference harness exempts
// from weight decay (".bn1.weight", ".bn2.bias", ...).
var bnParam = regexp.MustCompile(`.*\.bn\d+\.(weight|bias)$`)

// SGD is stochastic gradient descent with momentum and weight decay in
// PyTorch's semantics: d = g + wd·w (wd 0 for parameters matching
// `.*\.bn\d+\.(weight|bias)`, as in the DEFT/MiCRO harness); buf = d on the
// first step, buf = m·buf + d afterwards; w −= lr·buf. This is not the
// DEFT/MiCRO harness's "nesterov" (w −= lr·(d + buf)), which doubles the step.
type SGD struct {
	Momentum float64
	decay    []decaySpan // weight decay per run of elements, ascending
	buf      []float32
	steps    int64
}

// decaySpan is a run [lo, hi) of parameters with one weight decay.
type decaySpan struct {
	lo, hi int
	wd     float32
}

// NewSGD returns SGD for the given parameter layout.
func NewSGD(layout []models.ParamInfo, momentum, wd float64) *SGD {
	n := 0
	for _, p := range layout {
		n = max(n, p.Offset+p.Size)
	}
	s := &SGD{Momentum: momentum}
	for _, p := range layout {
		d := float32(wd)
		if bnParam.MatchString(p.Name) {
			d = 0
		}
		if k := len(s.decay); k > 0 && s.decay[k-1].hi == p.Offset && s.decay[k-1].wd == d {
			s.decay[k-1].hi = p.Offset + p.Size
		} else if p.Size > 0 {
			s.decay = append(s.decay, decaySpan{p.Offset, p.Offset + p.Size, d})
		}
	}
	if momentum != 0 {
		s.buf = make([]float32, n)
	}
	return s
}

// Step implements Optimizer.
func (s *SGD) Step(w, g []float32, lr float64) {
	l := float32(lr)
	m := float32(s.Momentum)
	first := s.steps == 0
	s.steps++
	parallel(len(w), func(lo, hi int) {
		for _, sp := range s.decay {
			a, b := max(lo, sp.lo), min(hi, sp.hi)
			if a < b {
				s.span(w[a:b], g[a:b:b], s.bufAt(a, b), sp.wd, l, m, first)
			}
		}
	})
}

func (s *SGD) bufAt(a, b int) []float32 {
	if s.buf == nil {
		return nil
	}
	return s.buf[a:b:b]
}

// span updates one run of parameters with a constant weight decay.
func (s *SGD) span(w, g, buf []float32, wd, l, m float32, first bool) {
	switch {
	case buf == nil:
		for i := range w {
			w[i] -= l * (g[i] + wd*w[i])
		}
	case first:
		for i := range w {
			d := g[i] + wd*w[i]
			buf[i] = d
			w[i] -= l * d
		}
	default:
		for i := range w {
			b := m*buf[i] + g[i] + wd*w[i]
			buf[i] = b
			w[i] -= l * b
		}
	}
}

// State implements Optimizer.
func (s *SGD) State() ([][]float32, int64) {
	if s.buf == nil {
		return nil, s.steps
	}
	return [][]float32{s.buf}, s.steps
}

// SetState implements Optimizer.
func (s *SGD) SetState(v [][]float32, steps int64) error {
	want := 0
	if s.buf != nil {
		want = 1
	}
	if len(v) != want || (want == 1 && len(v[0]) != len(s.buf)) {
		return fmt.Errorf("train: SGD state has %d vectors, want %d of %d values (checkpoint from another model or optimizer?)", len(v), want, len(s.buf))
	}
	if want == 1 {
		copy(s.buf, v[0])
	}
	s.steps = steps
	return nil
}

// Adam is PyTorch's Adam without weight decay: m = β1·m + (1−β1)·g,
// v = β2·v + (1−β2)·g², w −= lr·(m/(1−β1^t)) / (√(v/(1−β2^t)) + ε).
type Adam struct {
	Beta1, Beta2, Eps float64
	m, v              []float32
	steps             int64
}

// NewAdam returns Adam for n parameters.
func NewAdam(n int, beta1, beta2, eps float64) *Adam {
	return &Adam{Beta1: beta1, Beta2: beta2, Eps: eps, m: make([]float32, n), v: make([]float32, n)}
}

// Step implements Optimizer.
func (a *Adam) Step(w, g []float32, lr float64) {
	a.steps++
	t := float64(a.steps)
	bc1 := 1 - math.Pow(a.Beta1, t)
	bc2 := 1 - math.Pow(a.Beta2, t)
	b1, b2 := float32(a.Beta1), float32(a.Beta2)
	step := float32(lr / bc1)
	sq := float32(math.Sqrt(bc2))
	eps := float32(a.Eps)
	parallel(len(w), func(lo, hi int) {
		w, g, m, v := w[lo:hi], g[lo:hi:hi], a.m[lo:hi:hi], a.v[lo:hi:hi]
		for i := range w {
			gi := g[i]
			mi := b1*m[i] + (1-b1)*gi
			vi := b2*v[i] + (1-b2)*gi*gi
			m[i], v[i] = mi, vi
			den := float32(math.Sqrt(float64(vi)))/sq + eps
			w[i] -= step * mi / den
		}
	})
}

// State implements Optimizer.
func (a *Adam) State() ([][]float32, int64) { return [][]float32{a.m, a.v}, a.steps }

// SetState implements Optimizer.
func (a *Adam) SetState(v [][]float32, steps int64) error {
	if len(v) != 2 || len(v[0]) != len(a.m) || len(v[1]) != len(a.v) {
		return fmt.Errorf("train: Adam state has %d vectors, want 2 of %d values (checkpoint from another model or optimizer?)", len(v), len(a.m))
	}
	copy(a.m, v[0])
	copy(a.v, v[1])
	a.steps = steps
	return nil
}

// Schedule is a learning-rate schedule: linear warm-up over WarmupIters
// iterations (iteration i uses base·(i+1)/WarmupIters), then step decay: the
// rate is multiplied by Factor at the start of every epoch in DecayEpochs.
type Schedule struct {
	Base        float64
	WarmupIters int
	DecayEpochs []int
	Factor      float64
}

// At returns the learning rate of global iteration it (0-based) in epoch
// (0-based).
func (s Schedule) At(it, epoch int) float64 {
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

// ClipNorm scales g so that its Euclidean norm is at most maxNorm, as
// torch.nn.utils.clip_grad_norm_ does (factor maxNorm/(norm+1e-6) when the
// norm exceeds maxNorm), and returns the norm before clipping.
func ClipNorm(g []float32, maxNorm float64) float64 {
	var s float64
	for _, x := range g {
		s += float64(x) * float64(x)
	}
	norm := math.Sqrt(s)
	if norm > maxNorm {
		f := float32(maxNorm / (norm + 1e-6))
		for i := range g {
			g[i] *= f
		}
	}
	return norm
}

// parallelMin is the length below which element-wise loops run on one
// goroutine.
const parallelMin = 1 << 16

// parallel calls f on contiguous chunks of [0, n), on all cores for large n.
func parallel(n int, f func(lo, hi int)) {
	p := runtime.GOMAXPROCS(0)
	if n < parallelMin || p == 1 {
		f(0, n)
		return
	}
	p = min(p, n/(parallelMin/4))
	var wg sync.WaitGroup
	for c := 0; c < p; c++ {
		lo, hi := c*n/p, (c+1)*n/p
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
}
