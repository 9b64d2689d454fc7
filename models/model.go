package models

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// ParamInfo describes one tensor of a model's flat parameter (or buffer)
// vector.
type ParamInfo struct {
	Name   string // PyTorch-style name, e.g. "layer1.0.conv1.weight"
	Shape  []int  // shape as stored (see each model's doc for the convention)
	Size   int    // number of elements
	Offset int    // index of the first element in the flat vector
}

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
}

// StepResult is the outcome of one training step.
type StepResult struct {
	// Loss is the mean loss over the batch (the value that was
	// differentiated).
	Loss float64
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
// parameter tensor, at the moment that tensor's gradient is final. index is
// the tensor's position in the layout; grad is that tensor's part of the
// caller's flat gradient slice, already filled. It runs on the goroutine
// executing the graph: it must return quickly (hand the work off) and must
// not call back into the model.
type GradHook func(index int, grad []float32)

// Model is what the trainer sees of a model. A Model is not safe for
// concurrent use; data-parallel workers each build their own.
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
	// Params returns the live flat parameter vector: writing to it changes
	// the model (the optimizer may update it in place).
	Params() []float32
	// LoadParams copies src (length NumParams) into the parameters.
	LoadParams(src []float32) error
	// StoreParams copies the parameters into dst (length NumParams).
	StoreParams(dst []float32) error
	// BufferLayout lists the non-trainable buffers (BatchNorm running means
	// and variances); empty for models without buffers.
	BufferLayout() []ParamInfo
	// LoadBuffers and StoreBuffers copy the flat buffer vector.
	LoadBuffers(src []float32) error
	StoreBuffers(dst []float32) error
	// TrainStep runs forward and backward on b in training mode and writes
	// the gradient of the mean loss into grad (length NumParams), in
	// parameter order. It does not change the parameters. ctx is checked
	// before the step starts; a started step runs to completion (Gorgonia's
	// tape machine cannot be interrupted).
	TrainStep(ctx context.Context, b Batch, grad []float32) (StepResult, error)
	// Evaluate runs the forward pass in evaluation mode (no dropout,
	// BatchNorm with running statistics). The batch may have any size ≥ 1.
	Evaluate(ctx context.Context, b Batch) (EvalResult, error)
	// SetGradHook installs (or, with nil, removes) the gradient hook.
	SetGradHook(h GradHook) error
	// ResetState clears recurrent state carried across batches (the LSTM's
	// hidden state; a no-op for the others). Call it at each epoch start.
	ResetState()
	// Summary is a human-readable layer table with the parameter count.
	Summary() string
}

// ErrBadInput wraps every error about a malformed batch or buffer.
var ErrBadInput = errors.New("models: bad input")

func badInput(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
}

// store is a flat float32 vector split into named tensors that back
// Gorgonia nodes directly (no copies between the flat view and the graph).
type store struct {
	flat    []float32
	infos   []ParamInfo
	tensors []*tensor.Dense
}

func (s *store) add(name string, shape ...int) int {
	size := 1
	for _, d := range shape {
		size *= d
	}
	off := 0
	if n := len(s.infos); n > 0 {
		off = s.infos[n-1].Offset + s.infos[n-1].Size
	}
	s.infos = append(s.infos, ParamInfo{Name: name, Shape: append([]int(nil), shape...), Size: size, Offset: off})
	return len(s.infos) - 1
}

// alloc allocates the flat vector once every tensor was added.
func (s *store) alloc() {
	n := 0
	if k := len(s.infos); k > 0 {
		n = s.infos[k-1].Offset + s.infos[k-1].Size
	}
	s.flat = make([]float32, n)
	s.tensors = make([]*tensor.Dense, len(s.infos))
	for i, p := range s.infos {
		s.tensors[i] = tensor.New(tensor.WithShape(p.Shape...), tensor.WithBacking(s.flat[p.Offset:p.Offset+p.Size:p.Offset+p.Size]))
	}
}

func (s *store) data(i int) []float32 {
	p := s.infos[i]
	return s.flat[p.Offset : p.Offset+p.Size]
}

func (s *store) load(what string, src []float32) error {
	if len(src) != len(s.flat) {
		return badInput("%s: got %d values, the model has %d; pass a slice of exactly that length", what, len(src), len(s.flat))
	}
	copy(s.flat, src)
	return nil
}

func (s *store) save(what string, dst []float32) error {
	if len(dst) != len(s.flat) {
		return badInput("%s: destination has %d values, the model has %d; pass a slice of exactly that length", what, len(dst), len(s.flat))
	}
	copy(dst, s.flat)
	return nil
}

func (s *store) layout() []ParamInfo {
	out := make([]ParamInfo, len(s.infos))
	for i, p := range s.infos {
		p.Shape = append([]int(nil), p.Shape...)
		out[i] = p
	}
	return out
}

// node creates a graph node bound to tensor i of the store.
func (s *store) node(g *G.ExprGraph, i int) *G.Node {
	p := s.infos[i]
	return G.NodeFromAny(g, s.tensors[i], G.WithName(p.Name))
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
