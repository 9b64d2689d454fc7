package models

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// host is a model driven with host vectors, as the tests do: it owns the
// parameters (initialised by the model) and passes them to every step.
type host struct {
	Model
	params []float32
}

// hostOf wraps a freshly built model.
func hostOf(m Model, err error) (*host, error) {
	if err != nil {
		return nil, err
	}
	p := make([]float32, m.NumParams())
	if err := m.InitParams(p); err != nil {
		return nil, err
	}
	return &host{Model: m, params: p}, nil
}

// Params returns the live host parameters.
func (h *host) Params() []float32 { return h.params }

// TrainStep runs a training step with the host parameters into grad.
func (h *host) TrainStep(ctx context.Context, b Batch, grad []float32) (StepResult, error) {
	return h.Model.TrainStep(ctx, b, device.Host(h.params), device.Host(grad))
}

// Evaluate evaluates with the host parameters.
func (h *host) Evaluate(ctx context.Context, b Batch) (EvalResult, error) {
	return h.Model.Evaluate(ctx, b, device.Host(h.params))
}

// randomizeParams overwrites the parameters with N(0, std²) values so that
// gradients are well away from zero in finite-difference checks.
func randomizeParams(m *host, seed uint64, std float64) {
	r := rand.New(rand.NewPCG(seed, 99))
	p := m.Params()
	for i := range p {
		p[i] = float32(r.NormFloat64() * std)
	}
}

// gradCheck compares TrainStep's gradient with central finite differences
// of TrainStep's loss for up to samples entries of every parameter tensor
// (half of them chosen among entries with a non-zero analytic gradient).
//
// The graph runs in float32, so the loss carries a rounding error of about
// 1e-7·|loss|; with a step eps the difference quotient has an absolute
// error of about 1e-7·|loss|/eps plus the truncation error O(eps²·f”'). With
// eps = 1e-2 and losses of order 1 both stay near 1e-4..1e-3 of typical
// gradient magnitudes, so a tensor passes when
// ‖g_num − g_ana‖₂ ≤ tol·max(‖g_num‖₂, ‖g_ana‖₂) + atol on its sample.
// ReLU kinks crossed by a ±eps step would break this; random inputs make
// that rare, and the per-tensor norm keeps one unlucky entry from failing a
// correct tensor.
func gradCheck(t *testing.T, m *host, b Batch, samples int, eps, tol, atol float64) {
	t.Helper()
	gradCheckWith(t, m, b, samples, eps, tol, atol, nil)
}

// gradCheckWith is gradCheck with the finite differences taken of ref (the
// loss at the model's current parameters, e.g. a float64 reference
// implementation) instead of the model's own float32 loss.
func gradCheckWith(t *testing.T, m *host, b Batch, samples int, eps, tol, atol float64, ref func() float64) {
	t.Helper()
	ctx := context.Background()
	n := m.NumParams()
	grad := make([]float32, n)
	if _, err := m.TrainStep(ctx, b, grad); err != nil {
		t.Fatalf("TrainStep: %v", err)
	}
	scratch := make([]float32, n)
	lossAt := func() float64 {
		if ref != nil {
			return ref()
		}
		r, err := m.TrainStep(ctx, b, scratch)
		if err != nil {
			t.Fatalf("TrainStep: %v", err)
		}
		return r.Loss
	}
	p := m.Params()
	r := rand.New(rand.NewPCG(7, 7))
	for ti, info := range m.Layout() {
		var idx []int
		var nz []int
		for j := 0; j < info.Size; j++ {
			if grad[info.Offset+j] != 0 {
				nz = append(nz, j)
			}
		}
		for k := 0; k < samples/2 && len(nz) > 0; k++ {
			idx = append(idx, nz[r.IntN(len(nz))])
		}
		for len(idx) < samples && len(idx) < info.Size {
			idx = append(idx, r.IntN(info.Size))
		}
		var dn, na, nn float64
		for _, j := range idx {
			o := info.Offset + j
			old := p[o]
			p[o] = old + float32(eps)
			lp := lossAt()
			p[o] = old - float32(eps)
			lm := lossAt()
			p[o] = old
			h := float64(old+float32(eps)) - float64(old-float32(eps))
			num := (lp - lm) / h
			ana := float64(grad[o])
			dn += (num - ana) * (num - ana)
			na += ana * ana
			nn += num * num
		}
		diff, scale := math.Sqrt(dn), math.Max(math.Sqrt(na), math.Sqrt(nn))
		if diff > tol*scale+atol {
			t.Errorf("tensor %d %s: ‖num−ana‖ = %.3g, ‖ana‖ = %.3g, ‖num‖ = %.3g (tol %.3g·scale + %.3g)", ti, info.Name, diff, math.Sqrt(na), math.Sqrt(nn), tol, atol)
		} else {
			t.Logf("tensor %d %s: rel err %.2e (|g| %.3g)", ti, info.Name, diff/math.Max(scale, 1e-30), scale)
		}
	}
}

// sgd runs steps plain SGD steps on a fixed batch and returns the first and
// last losses.
func sgd(t *testing.T, m *host, b Batch, lr float32, steps int) (first, last float64) {
	t.Helper()
	grad := make([]float32, m.NumParams())
	for s := 0; s < steps; s++ {
		r, err := m.TrainStep(context.Background(), b, grad)
		if err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
		if math.IsNaN(r.Loss) {
			t.Fatalf("step %d: loss is NaN", s)
		}
		if s == 0 {
			first = r.Loss
		}
		last = r.Loss
		p := m.Params()
		for i := range p {
			p[i] -= lr * grad[i]
		}
	}
	return first, last
}

func closeRel(a, b, tol float64) bool {
	return math.Abs(a-b) <= tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// useOneDNN switches the CPU kernels to oneDNN for the rest of the test
// (restoring the package's test kernels afterwards); a missing oneDNN skips
// the test unless SPARSEGRAD_TEST_KERNELS=onednn requires it.
func useOneDNN(t *testing.T) {
	t.Helper()
	if _, err := engine.ConfigureCPU(engine.KernelsOneDNN, 0); err != nil {
		if errors.Is(err, engine.ErrOneDNNNotFound) && testKernels() != engine.KernelsOneDNN {
			testenv.Missing(t, testenv.OneDNN, fmt.Sprintf("oneDNN is not installed (apt-get install libdnnl2): %v", err))
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { engine.ConfigureCPU(testKernels(), 0) })
}
