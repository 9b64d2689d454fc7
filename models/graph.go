package models

import (
	"bytes"
	"fmt"
	"log"
	"strconv"
	"sync"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// buildMu serialises building and compiling Gorgonia graphs: Gorgonia's
// graph construction updates package-level state without locking (e.g.
// encoding.NewGroup, reached from Rectify), so models built concurrently in
// several goroutines (in-process workers) would race. Running compiled
// graphs needs no lock.
var buildMu sync.Mutex

// building locks buildMu and returns its unlock (use: defer building()()).
func building() func() {
	buildMu.Lock()
	return buildMu.Unlock
}

// trainGraph is a compiled training graph: parameters bound to a store,
// the symbolic gradients of a scalar loss, and the tape machine(s) that run
// them.
type trainGraph struct {
	g      *G.ExprGraph
	st     *store
	params []*G.Node
	grads  []*G.Node
	loss   *G.Node
	vm     G.VM

	// Gradient hook machinery (see hook.go).
	hook   GradHook
	hookVM G.VM
	tap    *hookTap
}

// newTrainGraph differentiates loss with respect to params (whose i-th entry
// is bound to tensor i of st) and compiles the tape machine.
func newTrainGraph(g *G.ExprGraph, st *store, params []*G.Node, loss *G.Node) (tg *trainGraph, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("models: building the training graph failed: %v", r)
		}
	}()
	grads, err := G.Grad(loss, params...)
	if err != nil {
		return nil, fmt.Errorf("models: symbolic differentiation failed: %w", err)
	}
	tg = &trainGraph{g: g, st: st, params: params, grads: grads, loss: loss}
	tg.vm = G.NewTapeMachine(g)
	return tg, nil
}

// newVM compiles a tape machine for g, turning Gorgonia's compile panics
// into errors.
func newVM(g *G.ExprGraph, opts ...G.VMOpt) (vm G.VM, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("models: compiling the graph failed: %v", r)
		}
	}()
	return G.NewTapeMachine(g, opts...), nil
}

// run executes forward and backward once and copies every gradient into
// grad (length st.flat), firing the hook per tensor when one is installed.
func (tg *trainGraph) run(grad []float32) error {
	if len(grad) != len(tg.st.flat) {
		return badInput("gradient slice has %d values, the model has %d parameters; pass make([]float32, NumParams())", len(grad), len(tg.st.flat))
	}
	vm := tg.vm
	if tg.hook != nil {
		vm = tg.hookVM
		tg.tap.begin(grad)
	}
	err := vm.RunAll()
	vm.Reset()
	if err != nil {
		return fmt.Errorf("models: running the training graph: %w", err)
	}
	if tg.hook != nil {
		// Gradients whose node is not an executed instruction (or that were
		// not seen yet) become final at the end of the program.
		tg.tap.finishAll()
		return tg.tap.err
	}
	for i := range tg.grads {
		if err := tg.copyGrad(i, grad); err != nil {
			return err
		}
	}
	return nil
}

// copyGrad copies the value of gradient node i into its place in grad.
func (tg *trainGraph) copyGrad(i int, grad []float32) error {
	p := tg.st.infos[i]
	dst := grad[p.Offset : p.Offset+p.Size]
	v := tg.grads[i].Value()
	if v == nil {
		return fmt.Errorf("models: gradient of %s has no value after backward", p.Name)
	}
	switch t := v.(type) {
	case *tensor.Dense:
		src, ok := t.Data().([]float32)
		if !ok {
			if f, ok2 := t.Data().(float32); ok2 {
				src = []float32{f}
			} else {
				return fmt.Errorf("models: gradient of %s has dtype %v, want float32", p.Name, t.Dtype())
			}
		}
		if len(src) != len(dst) {
			return fmt.Errorf("models: gradient of %s has %d values, want %d", p.Name, len(src), len(dst))
		}
		copy(dst, src)
	case *G.F32:
		if len(dst) != 1 {
			return fmt.Errorf("models: gradient of %s is a scalar, want %d values", p.Name, len(dst))
		}
		dst[0] = float32(*t)
	default:
		return fmt.Errorf("models: gradient of %s has unexpected type %T", p.Name, v)
	}
	return nil
}

// lossValue reads a scalar node.
func scalarValue(n *G.Node) (float64, error) {
	v := n.Value()
	switch t := v.(type) {
	case *G.F32:
		return float64(*t), nil
	case *G.F64:
		return float64(*t), nil
	case *tensor.Dense:
		switch d := t.Data().(type) {
		case float32:
			return float64(d), nil
		case []float32:
			if len(d) == 1 {
				return float64(d[0]), nil
			}
		}
	}
	return 0, fmt.Errorf("models: node %s is not a float32 scalar (got %T)", n.Name(), v)
}

// hookTap implements the gradient hook without forking Gorgonia: it is the
// io.Writer of the tape machine's logger. The tape machine logs "PC n" at
// the start of every instruction and "Executing … Node is: <hex id>" at the
// start of every operation, on the goroutine running the program. When the
// next instruction starts, the previous operation has finished and its
// value is bound to its node; if that node is a parameter gradient (each
// gradient node is written by exactly one operation), the gradient is final.
type hookTap struct {
	tg      *trainGraph
	byNode  map[int64][]int // gradient node id → parameter indices
	pending int64           // id of the operation in progress, -1 if none
	grad    []float32
	fired   []bool
	err     error
}

func newHookTap(tg *trainGraph) *hookTap {
	t := &hookTap{tg: tg, byNode: map[int64][]int{}, pending: -1, fired: make([]bool, len(tg.grads))}
	for i, gn := range tg.grads {
		id := int64(gn.ID())
		t.byNode[id] = append(t.byNode[id], i)
	}
	return t
}

func (t *hookTap) begin(grad []float32) {
	t.grad = grad
	t.pending = -1
	t.err = nil
	for i := range t.fired {
		t.fired[i] = false
	}
}

var (
	pcPrefix   = []byte("PC ")
	execPrefix = []byte("Executing ")
	nodeIs     = []byte("Node is: ")
)

// Write receives one log line per call.
func (t *hookTap) Write(p []byte) (int, error) {
	s := bytes.TrimLeft(p, "\t")
	switch {
	case bytes.HasPrefix(s, pcPrefix):
		t.finishPending()
	case bytes.HasPrefix(s, execPrefix):
		if i := bytes.LastIndex(s, nodeIs); i >= 0 {
			hex := bytes.TrimSpace(s[i+len(nodeIs):])
			if id, err := strconv.ParseInt(string(hex), 16, 64); err == nil {
				t.pending = id
			}
		}
	}
	return len(p), nil
}

func (t *hookTap) finishPending() {
	if t.pending < 0 {
		return
	}
	idx := t.byNode[t.pending]
	t.pending = -1
	for _, i := range idx {
		t.fire(i)
	}
}

func (t *hookTap) fire(i int) {
	if t.fired[i] {
		return
	}
	t.fired[i] = true
	if err := t.tg.copyGrad(i, t.grad); err != nil {
		if t.err == nil {
			t.err = err
		}
		return
	}
	p := t.tg.st.infos[i]
	t.tg.hook(i, t.grad[p.Offset:p.Offset+p.Size])
}

func (t *hookTap) finishAll() {
	t.finishPending()
	for i := range t.fired {
		t.fire(i)
	}
}

// setHook installs the hook, compiling the logging tape machine on first
// use. restore is called after compiling (a new tape machine resets
// BatchNorm statistics; the caller puts them back).
func (tg *trainGraph) setHook(h GradHook, save func() []float32, restore func([]float32)) error {
	tg.hook = h
	if h == nil || tg.hookVM != nil {
		return nil
	}
	defer building()()
	tg.tap = newHookTap(tg)
	var saved []float32
	if save != nil {
		saved = save()
	}
	vm, err := newVM(tg.g, G.WithLogger(log.New(tg.tap, "", 0)))
	if restore != nil {
		restore(saved)
	}
	if err != nil {
		tg.hook = nil
		return err
	}
	tg.hookVM = vm
	return nil
}

// evalGraph is a forward-only graph for one evaluation batch size. Its
// parameter nodes are bound to the same store as the training graph.
type evalGraph struct {
	vm     G.VM
	out    *G.Node
	ints   []*tensor.Dense // integer inputs (ids, tokens)
	floats []*tensor.Dense // float inputs (images, state)
	extra  []*G.Node       // further outputs a model reads (LSTM state)
}

// run executes the graph and returns the output values (the slice is only
// valid until the next run).
func (e *evalGraph) run() ([]float32, error) {
	err := e.vm.RunAll()
	e.vm.Reset()
	if err != nil {
		return nil, fmt.Errorf("models: running the evaluation graph: %w", err)
	}
	t, ok := e.out.Value().(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("models: evaluation output has type %T", e.out.Value())
	}
	d, ok := t.Data().([]float32)
	if !ok {
		return nil, fmt.Errorf("models: evaluation output has dtype %v", t.Dtype())
	}
	return d, nil
}

// evalCache keeps the evaluation graphs of the two most recently used
// batch sizes.
type evalCache struct {
	sizes  []int
	graphs []*evalGraph
}

func (c *evalCache) get(n int, build func() (*evalGraph, error)) (*evalGraph, error) {
	for i, s := range c.sizes {
		if s == n {
			return c.graphs[i], nil
		}
	}
	unlock := building()
	eg, err := build()
	unlock()
	if err != nil {
		return nil, err
	}
	if len(c.sizes) == 2 {
		c.sizes, c.graphs = c.sizes[1:], c.graphs[1:]
	}
	c.sizes = append(c.sizes, n)
	c.graphs = append(c.graphs, eg)
	return eg, nil
}
