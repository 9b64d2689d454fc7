package engine

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sparsegrad/sparsegrad/ops"
	G "gorgonia.org/gorgonia"
)

// Kind says where a value's storage comes from.
type Kind uint8

// The kinds of values.
const (
	// Temp values live in the executor's arena, planned by liveness.
	Temp Kind = iota + 1
	// Param values are slices of the caller's parameter vector.
	Param
	// Grad values are slices of the caller's gradient vector.
	Grad
	// Buffer values are slices of the caller's buffer vector (BatchNorm's
	// running statistics).
	Buffer
	// Input values are owned by the executor and written by its user before
	// a run (images, labels, tokens, dropout masks, recurrent state).
	Input
	// Const values are owned by the executor and set once when it is
	// created.
	Const
	// View values share the storage of their Base value.
	View
)

func (k Kind) String() string {
	return [...]string{"?", "temp", "param", "grad", "buffer", "input", "const", "view"}[k]
}

// ValueID identifies a value of a program.
type ValueID int

// Value is one tensor of a program.
type Value struct {
	Name  string
	Shape []int
	DType ops.DType
	Kind  Kind
	// Index is the position in Spec.Params (Param, Grad), Spec.Buffers
	// (Buffer) or Spec.Inputs (Input).
	Index int
	// Base and Offset (in elements of Base) locate a View in its base
	// value, which is never itself a view.
	Base   ValueID
	Offset int
	// Persistent values keep their storage for the executor's life
	// (outputs, inputs, constants).
	Persistent bool
	// Def is the instruction that writes the value (−1: none in the main
	// program), LastUse the last instruction that reads it or any view of
	// it (−1: none). For a base value these cover its views too.
	Def, LastUse int
}

// Size is the number of elements.
func (v *Value) Size() int {
	n := 1
	for _, d := range v.Shape {
		n *= d
	}
	return n
}

// Bytes is the size in bytes.
func (v *Value) Bytes() int { return v.Size() * v.DType.Size() }

// Instr is one instruction: Op computes Out from In.
type Instr struct {
	Op  ops.Kernel
	In  []ValueID
	Out ValueID
	// InPlace is the input whose storage Out shares (−1: none); only
	// elementwise ops run in place.
	InPlace int
	// Final lists the parameters whose gradient is complete once this
	// instruction has run.
	Final []int
	// Node is the graph node the instruction computes (for messages).
	Node string
}

// Spec says how a graph's nodes meet the outside world.
type Spec struct {
	// Params are the parameter nodes in layout order; a run binds them to
	// consecutive slices of the parameter vector.
	Params []*G.Node
	// Grads are the gradient nodes of Params, in the same order (nil for a
	// forward-only program); a run writes them to the gradient vector.
	Grads []*G.Node
	// Buffers are non-trainable state nodes (running statistics), bound to
	// consecutive slices of the buffer vector.
	Buffers []*G.Node
	// Inputs are nodes the user writes before each run.
	Inputs []*G.Node
	// Outputs are nodes whose values the user reads after a run; they and
	// the nodes they depend on form the forward part of the program.
	Outputs []*G.Node
}

// Program is a compiled graph: device-independent, shareable by executors.
type Program struct {
	Values []Value
	// Init are the instructions that set constants, run once.
	Init []Instr
	// Instrs run in order on every run; the first Forward of them compute
	// the outputs, the rest the gradients.
	Instrs  []Instr
	Forward int
	// Param and buffer layouts: element offsets of each bound tensor.
	ParamOffsets, BufferOffsets []int
	ParamSize, BufferSize       int
	// InputIDs and OutputIDs are the values of Spec.Inputs and Spec.Outputs.
	InputIDs, OutputIDs []ValueID
	// GradIDs are the values bound to the gradient vector (−1: none).
	GradIDs []ValueID
}

// Root returns the value whose storage v uses and v's element offset in it.
func (p *Program) Root(v ValueID) (ValueID, int) {
	val := &p.Values[v]
	if val.Kind == View {
		return val.Base, val.Offset
	}
	return v, 0
}

// String lists the program (for debugging).
func (p *Program) String() string {
	var b strings.Builder
	for i, in := range p.Instrs {
		if i == p.Forward {
			b.WriteString("-- backward\n")
		}
		fmt.Fprintf(&b, "%4d %-28s %v <- %v", i, fmt.Sprint(in.Op), in.Out, in.In)
		if len(in.Final) > 0 {
			fmt.Fprintf(&b, " final %v", in.Final)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// CompileError is returned for a graph the engine cannot run; it names the
// node.
type CompileError struct {
	Node string
	Err  error
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("engine: node %s: %v", e.Node, e.Err)
}

func (e *CompileError) Unwrap() error { return e.Err }

// Compile translates g into a program. Only the nodes that Spec's outputs
// and gradients depend on are compiled.
func Compile(g *G.ExprGraph, spec Spec) (*Program, error) {
	if len(spec.Grads) != 0 && len(spec.Grads) != len(spec.Params) {
		return nil, fmt.Errorf("engine: %d gradient nodes for %d parameters", len(spec.Grads), len(spec.Params))
	}
	sorted, err := G.Sort(g)
	if err != nil {
		return nil, fmt.Errorf("engine: sorting the graph: %w", err)
	}
	slices.Reverse(sorted) // inputs first
	c := &compiler{p: &Program{}, ids: map[*G.Node]ValueID{}, bound: map[*G.Node]binding{}}
	if err := c.bind(spec); err != nil {
		return nil, err
	}
	needed := ancestors(g, append(append([]*G.Node(nil), spec.Outputs...), spec.Grads...))
	forward := ancestors(g, spec.Outputs)
	var fwd, bwd []Instr
	for _, n := range sorted {
		if !needed[n] {
			continue
		}
		in, err := c.node(g, n)
		if err != nil {
			return nil, &CompileError{Node: nodeName(n), Err: err}
		}
		if in == nil {
			continue
		}
		if forward[n] {
			fwd = append(fwd, *in)
		} else {
			bwd = append(bwd, *in)
		}
	}
	c.p.Forward = len(fwd)
	// The gradients go to the caller's gradient vector (bindGrads): their
	// instructions allocate nothing, so the schedule runs them as soon as
	// they free memory or cost none, which makes each parameter's gradient
	// final early in the backward pass (where a reduction overlapped with
	// it, dense's buckets or LAGS' groups, can start), rather than at its
	// end as if each were a new temporary.
	grads := map[ValueID]bool{}
	for _, gn := range spec.Grads {
		if id, ok := c.ids[gn]; ok {
			r, _ := c.p.Root(id)
			grads[r] = true
		}
	}
	c.p.Instrs = append(c.p.schedule(fwd, nil), c.p.schedule(bwd, grads)...)
	for _, o := range spec.Outputs {
		id, ok := c.ids[o]
		if !ok {
			return nil, fmt.Errorf("engine: output %s was not compiled", o.Name())
		}
		c.p.OutputIDs = append(c.p.OutputIDs, id)
		if r, _ := c.p.Root(id); c.p.Values[r].Kind == Temp {
			c.p.Values[r].Persistent = true
		}
	}
	for _, n := range spec.Inputs {
		c.p.InputIDs = append(c.p.InputIDs, c.ids[n])
	}
	if err := c.bindGrads(spec.Grads); err != nil {
		return nil, err
	}
	c.p.inPlace()
	c.p.liveness()
	return c.p, nil
}

type binding struct {
	kind  Kind
	index int
}

type compiler struct {
	p     *Program
	ids   map[*G.Node]ValueID
	bound map[*G.Node]binding
}

func nodeName(n *G.Node) string {
	if n.Op() == nil {
		return n.Name()
	}
	return fmt.Sprintf("%s (%v)", n.Name(), n.Op())
}

func (c *compiler) bind(spec Spec) error {
	add := func(ns []*G.Node, k Kind) error {
		for i, n := range ns {
			if n == nil {
				return fmt.Errorf("engine: %v %d is nil", k, i)
			}
			if b, ok := c.bound[n]; ok {
				return fmt.Errorf("engine: node %s is both %v %d and %v %d", n.Name(), b.kind, b.index, k, i)
			}
			c.bound[n] = binding{k, i}
		}
		return nil
	}
	if err := add(spec.Params, Param); err != nil {
		return err
	}
	if err := add(spec.Buffers, Buffer); err != nil {
		return err
	}
	if err := add(spec.Inputs, Input); err != nil {
		return err
	}
	off := 0
	for _, n := range spec.Params {
		c.p.ParamOffsets = append(c.p.ParamOffsets, off)
		off += n.Shape().TotalSize()
	}
	c.p.ParamSize = off
	off = 0
	for _, n := range spec.Buffers {
		c.p.BufferOffsets = append(c.p.BufferOffsets, off)
		off += n.Shape().TotalSize()
	}
	c.p.BufferSize = off
	return nil
}

// ancestors returns the nodes roots depend on, roots included.
func ancestors(g *G.ExprGraph, roots []*G.Node) map[*G.Node]bool {
	seen := map[*G.Node]bool{}
	stack := append([]*G.Node(nil), roots...)
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if n == nil || seen[n] {
			continue
		}
		seen[n] = true
		stack = append(stack, children(g, n)...)
	}
	return seen
}

// children returns n's operands in order.
func children(g *G.ExprGraph, n *G.Node) []*G.Node {
	it := g.From(n.ID())
	var out []*G.Node
	for it.Next() {
		out = append(out, it.Node().(*G.Node))
	}
	return out
}

func (c *compiler) newValue(v Value) ValueID {
	v.Def, v.LastUse = -1, -1
	c.p.Values = append(c.p.Values, v)
	return ValueID(len(c.p.Values) - 1)
}

func dtypeOf(n *G.Node) (ops.DType, error) {
	switch n.Dtype().String() {
	case "float32":
		return ops.Float32, nil
	case "float64":
		return ops.Float64, nil
	case "int":
		return ops.Int64, nil
	}
	return 0, fmt.Errorf("element type %v is not supported (float32, float64 and int are)", n.Dtype())
}

// node compiles one node: a bound value, a view, a constant (an Init
// instruction) or an instruction (returned).
func (c *compiler) node(g *G.ExprGraph, n *G.Node) (*Instr, error) {
	dt, err := dtypeOf(n)
	if err != nil {
		return nil, err
	}
	shape := []int(n.Shape().Clone())
	if n.Shape().IsScalar() {
		shape = nil
	}
	val := Value{Name: n.Name(), Shape: shape, DType: dt, Kind: Temp}
	if b, ok := c.bound[n]; ok {
		val.Kind, val.Index = b.kind, b.index
		if b.kind == Input {
			val.Persistent = true
		}
		c.ids[n] = c.newValue(val)
		return nil, nil
	}
	if n.Op() == nil {
		return nil, fmt.Errorf("a graph input that is neither a parameter, a buffer nor an input of the program; list it in the Spec")
	}
	kids := children(g, n)
	tr, err := translate(n, kids)
	if err != nil {
		return nil, err
	}
	switch {
	case tr.view:
		base, off := c.p.Root(c.ids[kids[0]])
		val.Kind, val.Base, val.Offset = View, base, off+tr.offset
		if c.p.Values[base].DType != dt {
			return nil, fmt.Errorf("view of a %v value as %v", c.p.Values[base].DType, dt)
		}
		c.ids[n] = c.newValue(val)
		return nil, nil
	case tr.constant:
		val.Kind, val.Persistent = Const, true
		id := c.newValue(val)
		c.ids[n] = id
		c.p.Init = append(c.p.Init, Instr{Op: tr.op, Out: id, InPlace: -1, Node: nodeName(n)})
		return nil, nil
	}
	if ops.OutTypeOf(tr.op) != dt && tr.op != (ops.Copy{}) {
		return nil, fmt.Errorf("op %v produces %v but the node is %v", tr.op, ops.OutTypeOf(tr.op), dt)
	}
	in := &Instr{Op: tr.op, InPlace: -1, Node: nodeName(n)}
	for _, k := range tr.inputs(kids) {
		id, ok := c.ids[k]
		if !ok {
			return nil, fmt.Errorf("operand %s was not compiled before its use", k.Name())
		}
		in.In = append(in.In, id)
	}
	in.Out = c.newValue(val)
	c.ids[n] = in.Out
	return in, nil
}

// bindGrads places every gradient in the gradient vector: the value (or the
// base value of a full-size view, such as a reshape) becomes a Grad value
// when it is a temporary of its own; otherwise a Copy instruction after its
// definition moves it there.
func (c *compiler) bindGrads(grads []*G.Node) error {
	p := c.p
	p.GradIDs = make([]ValueID, len(grads))
	type insert struct {
		after int
		in    Instr
	}
	var copies []insert
	for i, gn := range grads {
		if gn == nil {
			return fmt.Errorf("engine: parameter %d has no gradient node", i)
		}
		id, ok := c.ids[gn]
		if !ok {
			return fmt.Errorf("engine: gradient of parameter %d (%s) was not compiled", i, gn.Name())
		}
		root, off := p.Root(id)
		rv := &p.Values[root]
		want := p.Values[id].Size()
		if want != c.paramSize(i) {
			return fmt.Errorf("engine: gradient %s has %d elements, parameter %d has %d", gn.Name(), want, i, c.paramSize(i))
		}
		if rv.Kind == Temp && !rv.Persistent && off == 0 && rv.Size() == want && rv.DType == ops.Float32 {
			rv.Kind, rv.Index = Grad, i
			p.GradIDs[i] = root
			continue
		}
		// A copy into a fresh Grad value, right after the source is written.
		dst := c.newValue(Value{Name: gn.Name() + "/grad", Shape: p.Values[id].Shape, DType: ops.Float32, Kind: Grad, Index: i})
		p.GradIDs[i] = dst
		after := -1
		for j, in := range p.Instrs {
			if r, _ := p.Root(in.Out); r == root {
				after = j
			}
		}
		if after < p.Forward-1 {
			after = p.Forward - 1
		}
		copies = append(copies, insert{after, Instr{Op: ops.Copy{}, In: []ValueID{id}, Out: dst, InPlace: -1, Node: "copy of " + gn.Name()}})
	}
	slices.SortStableFunc(copies, func(a, b insert) int { return a.after - b.after })
	for k := len(copies) - 1; k >= 0; k-- {
		at := copies[k].after + 1
		p.Instrs = slices.Insert(p.Instrs, at, copies[k].in)
	}
	return nil
}

func (c *compiler) paramSize(i int) int {
	if i+1 < len(c.p.ParamOffsets) {
		return c.p.ParamOffsets[i+1] - c.p.ParamOffsets[i]
	}
	return c.p.ParamSize - c.p.ParamOffsets[i]
}

// inPlace lets instructions whose op allows it (ops.InPlacer) overwrite an
// input that is not read afterwards: the output becomes a view of the
// input's storage, or, when the output is a gradient in the caller's
// vector, the input is computed there in the first place.
func (p *Program) inPlace() {
	p.liveness()
	for j := range p.Instrs {
		in := &p.Instrs[j]
		ip, ok := in.Op.(ops.InPlacer)
		if !ok {
			continue
		}
		out := &p.Values[in.Out]
		if out.Kind != Temp && out.Kind != Grad {
			continue
		}
		for _, k := range ip.InPlace() {
			// The input's storage: its own, or that of the value it views
			// whole (a reshape).
			id, off := p.Root(in.In[k])
			v := &p.Values[id]
			if off != 0 || v.Kind != Temp || v.Persistent || v.Def < 0 || v.LastUse != j || v.Bytes() != out.Bytes() || v.DType != out.DType {
				continue
			}
			if out.Kind == Temp {
				p.alias(in.Out, id)
			} else {
				p.alias(id, in.Out)
			}
			in.InPlace = k
			p.liveness()
			break
		}
	}
}

// schedule reorders instructions (a valid topological order in) to keep
// little memory alive: it repeatedly runs, among the instructions whose
// operands are computed, the one that frees the most memory net of what it
// allocates (ties: the earliest in the given order). Gorgonia's order sums
// a parameter's gradient contributions at the very end, after all of them
// were computed (an LSTM's 30 per-step contributions to a recurrent
// weight's gradient stay alive together); here each partial sum runs as
// soon as its operands exist. The sums are the same operations in the same
// association, so results do not change. Instructions that share a value an
// op mutates keep their order. The values of grads are written into the
// gradient vector, not allocated.
func (p *Program) schedule(in []Instr, grads map[ValueID]bool) []Instr {
	n := len(in)
	if n < 2 {
		return in
	}
	root := func(id ValueID) ValueID { r, _ := p.Root(id); return r }
	producer := map[ValueID]int{}  // root value → instruction (last writer) in this segment
	deps := make([][]int, n)       // deps[j]: instructions j waits for
	users := map[ValueID][]int{}   // root value → instructions reading it
	lastTouch := map[ValueID]int{} // mutated value → last instruction touching it
	mutated := map[ValueID]bool{}
	for j := range in {
		if m, ok := in[j].Op.(ops.Mutator); ok {
			for _, k := range m.Mutates() {
				mutated[root(in[j].In[k])] = true
			}
		}
	}
	for j := range in {
		seen := map[int]bool{}
		add := func(d int) {
			if d >= 0 && d != j && !seen[d] {
				seen[d] = true
				deps[j] = append(deps[j], d)
			}
		}
		for _, id := range in[j].In {
			r := root(id)
			if d, ok := producer[r]; ok {
				add(d)
			}
			users[r] = append(users[r], j)
			if mutated[r] {
				if d, ok := lastTouch[r]; ok {
					add(d)
				}
				lastTouch[r] = j
			}
		}
		producer[root(in[j].Out)] = j
	}
	rdeps := make([][]int, n)
	pending := make([]int, n)
	for j, ds := range deps {
		pending[j] = len(ds)
		for _, d := range ds {
			rdeps[d] = append(rdeps[d], j)
		}
	}
	remaining := map[ValueID]int{} // root value → reads not yet scheduled
	for r, us := range users {
		remaining[r] = len(us)
	}
	temp := func(r ValueID) bool {
		v := &p.Values[r]
		return v.Kind == Temp && !v.Persistent
	}
	gain := func(j int) int {
		g := 0
		if r := root(in[j].Out); temp(r) && producer[r] == j && !grads[r] {
			g -= p.Values[r].Bytes()
		}
		counted := map[ValueID]bool{}
		for _, id := range in[j].In {
			r := root(id)
			if counted[r] || !temp(r) {
				continue
			}
			counted[r] = true
			reads := 0
			for _, u := range users[r] {
				if u == j {
					reads++
				}
			}
			if remaining[r] == reads {
				g += p.Values[r].Bytes()
			}
		}
		return g
	}
	var ready []int
	for j := range in {
		if pending[j] == 0 {
			ready = append(ready, j)
		}
	}
	out := make([]Instr, 0, n)
	for len(ready) > 0 {
		best := 0
		bg := gain(ready[0])
		for i := 1; i < len(ready); i++ {
			if g := gain(ready[i]); g > bg || (g == bg && ready[i] < ready[best]) {
				best, bg = i, g
			}
		}
		j := ready[best]
		ready = append(ready[:best], ready[best+1:]...)
		out = append(out, in[j])
		for _, id := range in[j].In {
			remaining[root(id)]--
		}
		for _, k := range rdeps[j] {
			if pending[k]--; pending[k] == 0 {
				ready = append(ready, k)
			}
		}
	}
	return out
}

// alias makes value from a view of the whole of value to (a base value of
// the same size), and re-points the views of from to to.
func (p *Program) alias(from, to ValueID) {
	f := &p.Values[from]
	persistent := f.Persistent
	f.Kind, f.Base, f.Offset, f.Persistent = View, to, 0, false
	if persistent {
		p.Values[to].Persistent = true
	}
	for i := range p.Values {
		if p.Values[i].Kind == View && p.Values[i].Base == from {
			p.Values[i].Base = to
		}
	}
}

// liveness computes Def and LastUse of every base value (views count for
// their base) and the Final lists of the instructions.
func (p *Program) liveness() {
	for i := range p.Values {
		p.Values[i].Def, p.Values[i].LastUse = -1, -1
	}
	for j := range p.Instrs {
		in := &p.Instrs[j]
		in.Final = in.Final[:0]
		for _, id := range in.In {
			r, _ := p.Root(id)
			p.Values[r].LastUse = j
		}
		r, _ := p.Root(in.Out)
		if p.Values[r].Def < 0 {
			p.Values[r].Def = j
		}
		p.Values[in.Out].Def = j
	}
	for i, id := range p.GradIDs {
		r, _ := p.Root(id)
		last := -1
		for j := range p.Instrs {
			if o, _ := p.Root(p.Instrs[j].Out); o == r {
				last = j
			}
		}
		if last >= 0 {
			p.Instrs[last].Final = append(p.Instrs[last].Final, i)
		}
	}
}
