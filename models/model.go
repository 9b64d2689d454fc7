package models

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/layout"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// ParamInfo describes one tensor of a model's flat parameter (or buffer)
// vector.
type ParamInfo = layout.Tensor

// Batch is one mini-batch. Each model reads only its own fields; see the
// model's doc comment for the exact layout.
type Batch struct {
	// Images are NCHW float32 images (ResNet-18), B*3*32*32 values.
	Images []float32
	// Labels are class labels (ResNet-18, B values) or next-token targets
	// (LSTM, T*B values, time-major: index t*B+b).
	Labels []int
	// Tokens are the LSTM input tokens, T*B values, time-major.
	Tokens []int
	// Steps is the number of LSTM time steps T in Tokens (0: the model's
	// BPTT length).
	Steps int
	// Users and Items are the NCF (user, item) pairs, B values each.
	Users, Items []int
	// Targets are the NCF 0/1 labels, B values.
	Targets []float32
	// Gradient is a recorded gradient (Recorded: a replay), NumParams
	// values in layout order.
	Gradient []float32
}

// StepResult is the outcome of one training step.
type StepResult struct {
	// Loss is the mean loss over the batch (the value that was
	// differentiated).
	Loss float64
	// Forward and Backward are the durations of the step's two parts on the
	// model's device.
	Forward, Backward time.Duration
	// Queued is the time the step waited for an executor shared with other
	// workers (a Pool's worker); it is part of neither Forward nor
	// Backward.
	Queued time.Duration
}

// EvalResult is the outcome of one evaluation batch. Results of several
// batches are combined with Add.
type EvalResult struct {
	// LossSum is the summed per-example loss (cross-entropy per image or per
	// token, binary cross-entropy per NCF pair).
	LossSum float64
	// Count is the number of examples the loss is summed over.
	Count int
	// Correct is the number of top-1 correct predictions (ResNet-18 and
	// LSTM).
	Correct int
	// Scores are the per-example outputs that ranking metrics need: NCF
	// logits, one per (user, item) pair, in batch order. Nil otherwise.
	Scores []float32
}

// Add accumulates o into r (Scores are appended).
func (r *EvalResult) Add(o EvalResult) {
	r.LossSum += o.LossSum
	r.Count += o.Count
	r.Correct += o.Correct
	r.Scores = append(r.Scores, o.Scores...)
}

// MeanLoss is LossSum/Count (NaN when Count is 0).
func (r EvalResult) MeanLoss() float64 { return r.LossSum / float64(r.Count) }

// GradHook is called during a training step's backward pass, once per
// parameter tensor, when that tensor's gradient is final: index is the
// tensor's position in the layout, and its part of the gradient vector
// holds the gradient once ready has completed (at once on the CPU). It runs
// on the goroutine executing the step: it must return quickly (hand the
// work off) and must not call back into the model.
type GradHook = engine.GradHook

// Model is one data-parallel worker's instance of a network on a device:
// its compiled programs and the state that belongs to the worker
// (BatchNorm's running statistics, the LSTM's hidden state, the dropout
// stream). The parameters, the gradient and any optimizer state belong to
// the caller, who passes the parameter and gradient vectors (device
// buffers of NumParams float32s on the model's device, in layout order) to
// every step; several models may share one parameter vector. A Model is not
// safe for concurrent use.
type Model interface {
	// Name is the model's name ("resnet18", "lstm", "ncf").
	Name() string
	// BatchSize is the training batch size the model was built for
	// (for the LSTM: the number of sequences; the step covers BPTT×B tokens).
	BatchSize() int
	// Layout lists the parameter tensors in parameter order.
	Layout() []ParamInfo
	// NumParams is the total number of parameters (the flat length).
	NumParams() int
	// Device is the device the model runs on.
	Device() device.Device
	// InitParams writes the initial parameters (a deterministic function of
	// the model's seed) into dst (host memory, NumParams values).
	InitParams(dst []float32) error
	// BufferLayout lists the non-trainable buffers (BatchNorm running means
	// and variances); empty for models without buffers.
	BufferLayout() []ParamInfo
	// Buffers is the live buffer vector on the model's device (empty for
	// models without buffers); training steps update it.
	Buffers() device.Buffer
	// LoadBuffers and StoreBuffers copy the buffer vector from and to host
	// memory.
	LoadBuffers(src []float32) error
	StoreBuffers(dst []float32) error
	// TrainStep runs forward and backward on b in training mode and writes
	// the gradient of the mean loss into grad, in parameter order. It does
	// not change params. ctx is checked before the step starts; a started
	// step runs to completion.
	TrainStep(ctx context.Context, b Batch, params, grad device.Buffer) (StepResult, error)
	// Evaluate runs the forward pass in evaluation mode (no dropout,
	// BatchNorm with running statistics). The batch may have any size ≥ 1.
	Evaluate(ctx context.Context, b Batch, params device.Buffer) (EvalResult, error)
	// SetGradHook installs (or, with nil, removes) the gradient hook.
	SetGradHook(h GradHook)
	// ResetState clears recurrent state carried across batches (the LSTM's
	// hidden state; a no-op for the others). Call it at each epoch start.
	ResetState()
	// ArenaBytes is the device memory of the model's training program
	// (activations, gradients of activations, scratch).
	ArenaBytes() int
	// Summary is a human-readable layer table with the parameter count.
	Summary() string
}

// Deferred is a Model whose training step can be issued without a wait for
// the device of its own (the package's models; not a Pool's workers).
// StartStep is TrainStep up to the step's issue on the model's stream (the
// backend's): the gradient, and the loss in host memory, are there once the
// stream has completed the step. LastStep is the result of the last
// StartStep, read once the caller has synchronised that stream (an error
// when the device could not time the step's phases) — a trainer
// that waits for the stream at the end of its step anyway reads the loss
// with that wait (on the CPU the step is done when StartStep returns).
// TrainStep is StartStep, the wait and LastStep.
type Deferred interface {
	Model
	StartStep(ctx context.Context, b Batch, params, grad device.Buffer) error
	LastStep() (StepResult, error)
}

// ErrBadInput wraps every error about a malformed batch or buffer.
var ErrBadInput = errors.New("models: bad input")

func badInput(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
}

// tensors is a list of named tensors laid out one after the other in a
// flat vector (the parameters or the buffers of a model).
type tensors struct {
	infos []ParamInfo
}

func (s *tensors) add(name string, shape ...int) int {
	size := 1
	for _, d := range shape {
		size *= d
	}
	s.infos = append(s.infos, ParamInfo{Name: name, Shape: append([]int(nil), shape...), Size: size, Offset: s.size()})
	return len(s.infos) - 1
}

// size is the length of the flat vector.
func (s *tensors) size() int {
	if n := len(s.infos); n > 0 {
		return s.infos[n-1].Offset + s.infos[n-1].Size
	}
	return 0
}

// part returns tensor i's part of a flat vector.
func (s *tensors) part(flat []float32, i int) []float32 {
	p := s.infos[i]
	return flat[p.Offset : p.Offset+p.Size]
}

func (s *tensors) layout() []ParamInfo {
	out := make([]ParamInfo, len(s.infos))
	for i, p := range s.infos {
		p.Shape = append([]int(nil), p.Shape...)
		out[i] = p
	}
	return out
}

// nodes creates one graph input per tensor, with the tensor's name and
// shape (the engine binds them to the flat vector).
func (s *tensors) nodes(g *G.ExprGraph) []*G.Node {
	ns := make([]*G.Node, len(s.infos))
	for i, p := range s.infos {
		ns[i] = G.NewTensor(g, tensor.Float32, len(p.Shape), G.WithShape(p.Shape...), G.WithName(p.Name))
	}
	return ns
}

// summaryTable renders a layer table.
func summaryTable(title string, infos []ParamInfo, buffers []ParamInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", title)
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "#\tparameter\tshape\tsize")
	total := 0
	for i, p := range infos {
		fmt.Fprintf(w, "%d\t%s\t%v\t%d\n", i, p.Name, p.Shape, p.Size)
		total += p.Size
	}
	w.Flush()
	fmt.Fprintf(&b, "parameters: %d in %d tensors\n", total, len(infos))
	nb := 0
	for _, p := range buffers {
		nb += p.Size
	}
	if len(buffers) > 0 {
		fmt.Fprintf(&b, "buffers: %d in %d tensors\n", nb, len(buffers))
	}
	return b.String()
}

func checkCtx(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("models: %w", err)
	}
	return nil
}

var (
	_ Deferred = (*NCF)(nil)
	_ Deferred = (*LSTM)(nil)
	_ Deferred = (*ResNet)(nil)
)
