package device

import "fmt"

// Math is the vector math of a device, on buffers of that device. Every call
// is issued on the given stream (the CPU runs it before returning); calls
// that return a number wait for the stream.
//
// The formulas are PyTorch's (torch.optim.SGD, torch.optim.Adam,
// clip_grad_norm_); the CPU implementation fixes the order of every
// floating-point operation, so CPU results are reproducible bit for bit.
type Math interface {
	// SGD applies one SGD step to w from the gradient g (see SGDStep); buf
	// is the momentum buffer (the zero Buffer when Momentum is 0).
	SGD(s Stream, p SGDStep, w, g, buf Buffer) error
	// Adam applies one Adam step to w from g with moments m and v (see
	// AdamStep).
	Adam(s Stream, p AdamStep, w, g, m, v Buffer) error
	// SumSquares returns Σx² of a float32 buffer, accumulated in float64.
	SumSquares(s Stream, x Buffer) (float64, error)
	// Scale multiplies a float32 buffer by a.
	Scale(s Stream, x Buffer, a float32) error
	// Fill sets every element of a float32 buffer to v.
	Fill(s Stream, x Buffer, v float32) error
	// Add sets y = y + x elementwise (float32 buffers of equal length).
	Add(s Stream, y, x Buffer) error
}

// SGDStep is one step of stochastic gradient descent in PyTorch's
// semantics, for one run of parameters with one weight decay:
//
//	d = g + WeightDecay·w
//	buf = d                          (first step, First)
//	buf = Momentum·buf + d           (later steps)
//	d = d + Momentum·buf             (Nesterov) or d = buf (otherwise)
//	w = w − LR·d
//
// Without momentum (Momentum 0, no buffer) the step is w = w − LR·d.
type SGDStep struct {
	LR, Momentum, WeightDecay float32
	Nesterov                  bool
	// First marks the first step, which initialises the momentum buffer.
	First bool
}

// AdamStep is one step of Adam (PyTorch's, without weight decay) with
// bias corrections bc1 = 1−β1ᵗ and bc2 = 1−β2ᵗ precomputed:
//
//	m = β1·m + (1−β1)·g
//	v = β2·v + (1−β2)·g²
//	w = w − StepSize·m / (√v/SqrtBC2 + Eps)
//
// with StepSize = lr/bc1 and SqrtBC2 = √bc2.
type AdamStep struct {
	StepSize, Beta1, Beta2, Eps, SqrtBC2 float32
}

// CheckFloat32 returns an error unless every buffer is float32 with the
// length of the first one and lives on dev.
func CheckFloat32(what string, dev Device, bufs ...Buffer) error {
	for i, b := range bufs {
		if b.dt != Float32 && b.n > 0 {
			return fmt.Errorf("device: %s: argument %d is %v, want float32", what, i, b.dt)
		}
		if b.n != bufs[0].n {
			return fmt.Errorf("device: %s: argument %d has %d elements, argument 0 has %d", what, i, b.n, bufs[0].n)
		}
		if b.n > 0 && b.dev != dev && !(dev.Kind() == CPUKind && b.IsHost()) {
			return fmt.Errorf("device: %s: argument %d is on %v, not %v", what, i, b.dev, dev)
		}
	}
	return nil
}
