package models

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
)

// Recorded is the model of a replay (train replay): its training step
// writes a recorded gradient — Batch.Gradient, which the replay's data
// serves for each worker and step — into the gradient vector instead of
// computing one, so that everything after the backward pass (error
// feedback, the reducers, the metrics, checkpoints, mpirun) runs as in
// training on gradients of a model the project does not have. Its
// parameters exist only because the trainer keeps a parameter vector; they
// are zero and nothing reads them. A step's loss is NaN (a replay has no
// loss), its Forward zero and its Backward the time of the copy. Several
// workers may share one Recorded (it keeps no state besides the hook; a
// Pool binds each worker's).
type Recorded struct {
	name   string
	batch  int
	params tensors
	be     engine.Backend
	hook   GradHook
}

// NewRecorded returns the recorded model of that name and layout, on be
// (nil: the CPU); batch is the recorded per-worker batch (informative).
func NewRecorded(name string, layout []ParamInfo, batch int, be engine.Backend) (*Recorded, error) {
	if be == nil {
		be = engine.CPU
	}
	m := &Recorded{name: name, batch: batch, be: be}
	for i, p := range layout {
		if p.Size < 0 {
			return nil, badInput("recorded layout: tensor %d (%s) of size %d", i, p.Name, p.Size)
		}
		idx := m.params.add(p.Name, p.Shape...)
		if got := m.params.infos[idx]; got.Size != p.Size || got.Offset != p.Offset {
			return nil, badInput("recorded layout: tensor %s of shape %v has %d elements at offset %d, the layout says %d at %d", p.Name, p.Shape, got.Size, got.Offset, p.Size, p.Offset)
		}
	}
	if len(layout) == 0 {
		return nil, badInput("recorded layout: no tensors")
	}
	return m, nil
}

var _ replica = (*Recorded)(nil)

// Name is the recorded model's name.
func (m *Recorded) Name() string { return m.name }

// BatchSize is the recorded per-worker batch (0: unknown).
func (m *Recorded) BatchSize() int { return m.batch }

// Layout is the recorded model's parameter layout.
func (m *Recorded) Layout() []ParamInfo { return m.params.layout() }

// NumParams is the number of recorded gradient elements.
func (m *Recorded) NumParams() int { return m.params.size() }

// Device is the device the gradient is copied to.
func (m *Recorded) Device() device.Device { return m.be.Device() }

// InitParams writes zeros: a replay's parameters are never read.
func (m *Recorded) InitParams(dst []float32) error { return m.initParams(dst, 0) }

func (m *Recorded) initParams(dst []float32, _ uint64) error {
	if len(dst) != m.NumParams() {
		return badInput("recorded InitParams: %d values, the recording has %d parameters", len(dst), m.NumParams())
	}
	clear(dst)
	return nil
}

// BufferLayout is empty.
func (m *Recorded) BufferLayout() []ParamInfo { return nil }

// Buffers is empty.
func (m *Recorded) Buffers() device.Buffer { return device.Buffer{} }

// LoadBuffers accepts only the empty buffer vector.
func (m *Recorded) LoadBuffers(src []float32) error {
	if len(src) != 0 {
		return badInput("a recorded model has no buffers, got %d values", len(src))
	}
	return nil
}

// StoreBuffers accepts only the empty buffer vector.
func (m *Recorded) StoreBuffers(dst []float32) error { return m.LoadBuffers(dst) }

// TrainStep copies b.Gradient (NumParams values, layout order) into grad.
// With a gradient hook, the tensors are copied in descending layout order
// (as a backward pass finishes them) and the hook runs after each.
func (m *Recorded) TrainStep(ctx context.Context, b Batch, params, grad device.Buffer) (StepResult, error) {
	if err := checkCtx(ctx); err != nil {
		return StepResult{}, err
	}
	n := m.NumParams()
	if len(b.Gradient) != n {
		return StepResult{}, badInput("recorded step: a gradient of %d values, the recording has %d parameters", len(b.Gradient), n)
	}
	if grad.Len() != n {
		return StepResult{}, badInput("recorded step: a gradient vector of %d values, want %d", grad.Len(), n)
	}
	st := m.be.Stream()
	t0 := time.Now()
	if m.hook == nil {
		if err := st.Copy(grad, device.Host(b.Gradient)); err != nil {
			return StepResult{}, fmt.Errorf("models: copying the recorded gradient: %w", err)
		}
	} else {
		for i := len(m.params.infos) - 1; i >= 0; i-- {
			p := m.params.infos[i]
			if err := st.Copy(grad.Slice(p.Offset, p.Offset+p.Size), device.Host(b.Gradient[p.Offset:p.Offset+p.Size])); err != nil {
				return StepResult{}, fmt.Errorf("models: copying the recorded gradient: %w", err)
			}
			ev, err := st.Record()
			if err != nil {
				return StepResult{}, err
			}
			m.hook(i, ev)
		}
	}
	if err := st.Synchronize(); err != nil {
		return StepResult{}, err
	}
	return StepResult{Loss: math.NaN(), Backward: time.Since(t0)}, nil
}

// Evaluate refuses: a recording has no model to evaluate.
func (m *Recorded) Evaluate(ctx context.Context, b Batch, params device.Buffer) (EvalResult, error) {
	return EvalResult{}, badInput("a recorded model (%s) cannot be evaluated: a replay has only the gradients", m.name)
}

// SetGradHook installs the gradient hook.
func (m *Recorded) SetGradHook(h GradHook) { m.hook = h }

// ResetState does nothing.
func (m *Recorded) ResetState() {}

// ArenaBytes is 0.
func (m *Recorded) ArenaBytes() int { return 0 }

// Summary is the layer table.
func (m *Recorded) Summary() string {
	return summaryTable(fmt.Sprintf("%s (recorded gradients)", m.name), m.params.infos, nil)
}

func (m *Recorded) newState(uint64, []float32) (*workerState, error) { return &workerState{}, nil }
func (m *Recorded) bind(ws *workerState) error                       { m.hook = ws.hook; return nil }
func (m *Recorded) unbind(*workerState) error                        { return nil }
