package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/ops"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// graphCase builds a graph from parameter nodes and returns a scalar loss
// plus extra outputs; the engine must reproduce Gorgonia's tape machine bit
// for bit on it (loss, outputs and the gradient of every parameter).
type graphCase struct {
	name   string
	params [][]int // shapes
	ints   [][]int // integer inputs: {n, max}
	bufs   int     // running-statistics pairs (4 channels each), appended to the build's ints argument
	build  func(p []*G.Node, ints []*G.Node) (loss *G.Node, outs []*G.Node)
}

func mustN(n *G.Node, err error) *G.Node {
	if err != nil {
		panic(err)
	}
	return n
}

func graphCases() []graphCase {
	sum := func(x *G.Node) *G.Node { return mustN(G.Sum(x)) }
	// weighted makes the loss depend on every element differently, so that
	// gradients are not all ones.
	weighted := func(x *G.Node) *G.Node { return sum(mustN(G.HadamardProd(x, mustN(G.Tanh(x))))) }
	return []graphCase{
		{"elementwise", [][]int{{3, 5}, {3, 5}}, nil, 0, func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			a, b := p[0], p[1]
			s := mustN(G.Add(a, b))
			d := mustN(G.Sub(s, mustN(G.HadamardProd(a, b))))
			q := mustN(G.HadamardDiv(d, mustN(G.Add(mustN(G.HadamardProd(b, b)), G.NewConstant(float32(1))))))
			return weighted(mustN(G.Sigmoid(mustN(G.Neg(q))))), []*G.Node{s}
		}},
		{"scalar-tensor", [][]int{{4, 3}}, nil, 0, func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			one := G.NewConstant(float32(1))
			a := mustN(G.Sub(one, p[0])) // scalar − tensor
			b := mustN(G.HadamardProd(a, G.NewConstant(float32(0.5))))
			c := mustN(G.Div(b, G.NewConstant(float32(3)))) // tensor ÷ scalar
			return weighted(mustN(G.Softplus(c))), nil
		}},
		{"relu-tanh", [][]int{{6, 4}}, nil, 0, func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			return weighted(mustN(G.Tanh(mustN(G.Rectify(p[0]))))), nil
		}},
		{"matmul", [][]int{{3, 4}, {4, 5}, {5, 4}}, nil, 0, func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			ab := mustN(G.Mul(p[0], p[1])) // [3 5]; its gradients are A×Bᵀ and Aᵀ×B
			abc := mustN(G.Mul(ab, p[2]))  // [3 4]
			return weighted(abc), []*G.Node{ab}
		}},
		{"linear-broadcast", [][]int{{5, 3}, {3, 4}, {4}}, nil, 0, func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			xw := mustN(G.Mul(p[0], p[1]))
			b := mustN(G.Reshape(p[2], tensor.Shape{1, 4}))
			y := mustN(G.BroadcastAdd(xw, b, nil, []byte{0}))
			return weighted(y), []*G.Node{y}
		}},
		{"broadcast-axis1", [][]int{{5, 1}, {5, 3}}, nil, 0, func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			return weighted(mustN(G.BroadcastAdd(p[0], p[1], []byte{1}, nil))), nil
		}},
		{"sums-mean", [][]int{{4, 6}, {7, 3}}, nil, 0, func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			a := mustN(G.Sum(p[0], 0))  // first axis
			b := mustN(G.Mean(p[1], 1)) // last axis
			c := mustN(G.Mean(p[0]))    // all axes
			return mustN(G.Add(mustN(G.Add(weighted(a), weighted(b))), c)), []*G.Node{a, b}
		}},
		{"slices-concat", [][]int{{6, 8}}, nil, 0, func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			r := mustN(G.Slice(p[0], G.S(2, 5)))      // rows: a view
			c := mustN(G.Slice(p[0], nil, G.S(3, 7))) // columns: a copy
			one := mustN(G.Slice(p[0], G.S(1, 2)))    // one row: Gorgonia drops the axis
			cat0 := mustN(G.Concat(0, r, r))
			cat1 := mustN(G.Concat(1, c, mustN(G.Slice(p[0], nil, G.S(0, 2)))))
			return mustN(G.Add(mustN(G.Add(weighted(cat0), weighted(cat1))), weighted(one))), []*G.Node{r, cat1}
		}},
		{"gather", [][]int{{9, 4}}, [][]int{{7, 9}}, 0, func(p, ints []*G.Node) (*G.Node, []*G.Node) {
			e := mustN(G.ByIndices(p[0], ints[0], 0))
			return weighted(e), []*G.Node{e}
		}},
		{"project-ops", [][]int{{2, 3, 5, 5}, {4, 3, 3, 3}, {4}, {4}, {4, 3, 3, 3}, {7, 4}}, [][]int{{7, 2}}, 2, func(p, ints []*G.Node) (*G.Node, []*G.Node) {
			y := mustN(ops.Conv(p[0], p[1], 1, 1))
			yb := mustN(ops.BatchNormalize(y, p[2], p[3], ints[1], ints[2], ops.BatchNormConfig{Eps: 1e-5, Momentum: 0.1, ReLU: true, Training: true}))
			y2 := mustN(ops.Conv(p[0], p[4], 2, 1))
			yb2 := mustN(ops.BatchNormalize(y2, p[2], p[3], ints[3], ints[4], ops.BatchNormConfig{Eps: 1e-3, Momentum: 0.5, Training: true}))
			z := mustN(ops.AddRelu(yb, yb))
			flat := mustN(G.Reshape(z, tensor.Shape{2, 100}))
			x7 := mustN(ops.MulT(p[5], mustN(G.Slice(flat, nil, G.S(0, 4)))))
			ce := mustN(ops.CrossEntropy(x7, ints[0]))
			return mustN(G.Add(mustN(G.Add(weighted(flat), ce)), weighted(yb2))), []*G.Node{yb}
		}},
	}
}

// runBoth builds c's graph twice and runs it on Gorgonia's tape machine and
// on the engine, returning the loss, outputs and parameter gradients of
// each.
func runBoth(t *testing.T, c graphCase, seed uint64) (tape, eng [][]float32) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	var vals [][]float32
	for _, s := range c.params {
		v := make([]float32, tensor.Shape(s).TotalSize())
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		vals = append(vals, v)
	}
	var ivals [][]int
	for _, s := range c.ints {
		v := make([]int, s[0])
		for i := range v {
			v[i] = r.IntN(s[1])
		}
		ivals = append(ivals, v)
	}
	// The tape machine, on values bound to the nodes.
	{
		g := G.NewGraph()
		var ps, is []*G.Node
		// Parameters are slices of one vector, as on the engine: gonum's
		// vector kernels round differently for differently aligned rows.
		flat := slices.Concat(vals...)
		off := 0
		for i, s := range c.params {
			n := len(vals[i])
			ps = append(ps, G.NodeFromAny(g, tensor.New(tensor.WithShape(s...), tensor.WithBacking(flat[off:off+n:off+n])), G.WithName(fmt.Sprintf("p%d", i))))
			off += n
		}
		for i, v := range ivals {
			is = append(is, G.NodeFromAny(g, tensor.New(tensor.WithShape(len(v)), tensor.WithBacking(slices.Clone(v))), G.WithName(fmt.Sprintf("i%d", i))))
		}
		tapeBufs := initBuffers(c.bufs)
		for i := range 2 * c.bufs {
			is = append(is, G.NodeFromAny(g, tensor.New(tensor.WithShape(4), tensor.WithBacking(tapeBufs[4*i:4*i+4])), G.WithName(fmt.Sprintf("b%d", i))))
		}
		loss, outs := c.build(ps, is)
		grads, err := G.Grad(loss, ps...)
		if err != nil {
			t.Fatal(err)
		}
		// The tape machine may overwrite intermediate values in place after
		// their last use: read the outputs when they are computed.
		read := make([]G.Value, len(outs))
		for i, o := range outs {
			G.Read(o, &read[i])
		}
		vm := G.NewTapeMachine(g)
		if err := vm.RunAll(); err != nil {
			t.Fatal(err)
		}
		tape = append(tape, valueF32(t, loss.Value()))
		for _, v := range read {
			tape = append(tape, valueF32(t, v))
		}
		for _, n := range grads {
			tape = append(tape, valueF32(t, n.Value()))
		}
		tape = append(tape, tapeBufs)
		vm.Close()
	}
	// The engine, parameters bound to one vector.
	{
		p, e := compileCase(t, c)
		nout := len(p.OutputIDs) - 1
		flat := slices.Concat(vals...)
		grad := make([]float32, len(flat))
		for i := range grad {
			grad[i] = float32(math.NaN()) // every element must be written
		}
		for i, v := range ivals {
			in := e.Input(i).Int64s()
			for j, x := range v {
				in[j] = int64(x)
			}
		}
		bufs := initBuffers(c.bufs)
		for run := 0; run < 2; run++ { // a second run reuses the arena
			if run == 1 {
				bufs = initBuffers(c.bufs) // BatchNorm updated them
			}
			if _, err := e.Run(context.Background(), Bindings{Params: device.Host(flat), Grads: device.Host(grad), Buffers: device.Host(bufs)}, nil); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 1 + nout {
			eng = append(eng, slices.Clone(e.Output(i).Float32s()))
		}
		for i := range c.params {
			o := p.ParamOffsets[i]
			eng = append(eng, grad[o:o+len(vals[i])])
		}
		eng = append(eng, bufs)
	}
	return tape, eng
}

// initBuffers returns n pairs of 4-channel running statistics (mean 0.1·i,
// variance 1+0.1·i).
func initBuffers(n int) []float32 {
	b := make([]float32, 8*n)
	for i := range b {
		b[i] = 0.1 * float32(i%4)
		if (i/4)%2 == 1 {
			b[i]++
		}
	}
	return b
}

// compileCase builds c's graph for the engine (parameters bound to one
// vector, integer inputs, running statistics as buffers) and loads it on the
// CPU.
func compileCase(t *testing.T, c graphCase) (*Program, *Executor) {
	t.Helper()
	g := G.NewGraph()
	var ps, is, bs []*G.Node
	for i, s := range c.params {
		ps = append(ps, G.NewTensor(g, tensor.Float32, len(s), G.WithShape(s...), G.WithName(fmt.Sprintf("p%d", i))))
	}
	for i, s := range c.ints {
		is = append(is, G.NewVector(g, tensor.Int, G.WithShape(s[0]), G.WithName(fmt.Sprintf("i%d", i))))
	}
	for i := range 2 * c.bufs {
		bs = append(bs, G.NewVector(g, tensor.Float32, G.WithShape(4), G.WithName(fmt.Sprintf("b%d", i))))
	}
	loss, outs := c.build(ps, append(slices.Clone(is), bs...))
	grads, err := G.Grad(loss, ps...)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(g, Spec{Params: ps, Grads: grads, Buffers: bs, Inputs: is, Outputs: append([]*G.Node{loss}, outs...)})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPlan(p); err != nil {
		t.Fatal(err)
	}
	e, err := New(p, CPU, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, e
}

func valueF32(t *testing.T, v G.Value) []float32 {
	switch x := v.(type) {
	case *G.F32:
		return []float32{float32(*x)}
	case *tensor.Dense:
		if x.IsMaterializable() {
			x = x.Materialize().(*tensor.Dense)
		}
		switch d := x.Data().(type) {
		case []float32:
			return slices.Clone(d)
		case float32:
			return []float32{d}
		}
	}
	t.Fatalf("value of type %T", v)
	return nil
}

func TestEngineMatchesTapeMachine(t *testing.T) {
	for _, c := range graphCases() {
		t.Run(c.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 3; seed++ {
				tape, eng := runBoth(t, c, seed)
				if len(tape) != len(eng) {
					t.Fatalf("%d values from the tape machine, %d from the engine", len(tape), len(eng))
				}
				for i := range tape {
					if len(tape[i]) != len(eng[i]) {
						t.Fatalf("value %d: %d elements on the tape machine, %d on the engine", i, len(tape[i]), len(eng[i]))
					}
					for j := range tape[i] {
						if math.Float32bits(tape[i][j]) != math.Float32bits(eng[i][j]) {
							t.Fatalf("seed %d value %d[%d]: tape machine %v, engine %v", seed, i, j, tape[i][j], eng[i][j])
						}
					}
				}
			}
		})
	}
}

// checkPlan verifies, by simulating the program, that no two values whose
// storage the planner could share are live at once unless one is a view
// of the other: it replays liveness and checks the kinds.
func checkPlan(p *Program) error {
	for i, v := range p.Values {
		if v.Kind == View {
			b := p.Values[v.Base]
			if b.Kind == View {
				return fmt.Errorf("value %d (%s) views a view", i, v.Name)
			}
			if v.Offset+v.Size() > b.Size() {
				return fmt.Errorf("value %d (%s) views elements %d..%d of a value of %d", i, v.Name, v.Offset, v.Offset+v.Size(), b.Size())
			}
		}
	}
	for j, in := range p.Instrs {
		if in.InPlace >= 0 {
			r, _ := p.Root(in.Out)
			ri, _ := p.Root(in.In[in.InPlace])
			if r != ri {
				return fmt.Errorf("instruction %d runs in place but its output and input %d have different storage", j, in.InPlace)
			}
		}
	}
	return nil
}

// TestArenaLiveness runs a program whose arena is filled with NaN before
// every run: a value read after its storage was reused, or never written,
// would turn the result into NaN or change it. It also checks that values
// share memory: the arena is smaller than all values together.
func TestArenaLiveness(t *testing.T) {
	c := graphCases()[len(graphCases())-1]
	_, want := runBoth(t, c, 5)
	p, e := compileCase(t, c)
	total := 0
	for i, v := range p.Values {
		if e.inArena(i) {
			total += roundUp(v.Bytes())
		}
	}
	for _, k := range e.kernels {
		total += roundUp(k.Workspace())
	}
	if e.ArenaBytes() >= total {
		t.Errorf("arena %d bytes, all values %d: nothing shared", e.ArenaBytes(), total)
	}
	t.Logf("arena %d bytes for %d bytes of values", e.ArenaBytes(), total)
	r := rand.New(rand.NewPCG(5, 1))
	var flat []float32
	for _, s := range c.params {
		for range tensor.Shape(s).TotalSize() {
			flat = append(flat, float32(r.NormFloat64()))
		}
	}
	idx := make([]int64, c.ints[0][0])
	for j := range idx {
		idx[j] = int64(r.IntN(c.ints[0][1]))
	}
	grad := make([]float32, len(flat))
	for run := 0; run < 3; run++ {
		arena := e.arena.Float32s()
		for i := range arena {
			arena[i] = float32(math.NaN())
		}
		copy(e.Input(0).Int64s(), idx)
		// Constants are set once at load time: restore them.
		for j, in := range p.Init {
			if err := in.Op.CPU(nil, hostArg(e.bufs[in.Out], p.Values[in.Out].Shape), nil); err != nil {
				t.Fatal(j, err)
			}
		}
		bufs := initBuffers(c.bufs)
		if _, err := e.Run(context.Background(), Bindings{Params: device.Host(flat), Grads: device.Host(grad), Buffers: device.Host(bufs)}, nil); err != nil {
			t.Fatal(err)
		}
		if l := e.Output(0).Float32s()[0]; math.IsNaN(float64(l)) || l != want[0][0] {
			t.Fatalf("run %d: loss %v, want %v", run, l, want[0][0])
		}
		for i, g := range grad {
			if math.IsNaN(float64(g)) {
				t.Fatalf("run %d: gradient element %d is NaN", run, i)
			}
		}
	}
}

// TestOutputsSurvive: a value that is an output keeps its contents after
// the run even when an elementwise op consumes it last (it must not be
// overwritten in place), and gradients land in their parameter's slice.
func TestOutputsSurvive(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float32, G.WithShape(2, 3), G.WithName("x"))
	m := G.NewMatrix(g, tensor.Float32, G.WithShape(2, 3), G.WithName("mask"))
	y := mustN(G.Tanh(x))
	z := mustN(G.HadamardProd(y, m)) // y's last use: in place unless y is an output
	loss := mustN(G.Sum(z))
	grads, err := G.Grad(loss, x)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(g, Spec{Params: []*G.Node{x}, Grads: grads, Inputs: []*G.Node{m}, Outputs: []*G.Node{loss, y}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(p, CPU, nil)
	if err != nil {
		t.Fatal(err)
	}
	xs := []float32{-1, -0.5, 0, 0.5, 1, 2}
	copy(e.Input(0).Float32s(), []float32{0, 1, 0, 1, 0, 1})
	grad := make([]float32, 6)
	var fired []int
	if _, err := e.Run(context.Background(), Bindings{Params: device.Host(xs), Grads: device.Host(grad)}, func(i int, ev device.Event) {
		fired = append(fired, i)
	}); err != nil {
		t.Fatal(err)
	}
	for i, v := range e.Output(1).Float32s() {
		if want := ops.Tanh.Apply(xs[i]); v != want {
			t.Fatalf("output y[%d] = %v, want tanh(%v) = %v", i, v, xs[i], want)
		}
	}
	for i, gv := range grad {
		th := float64(ops.Tanh.Apply(xs[i]))
		want := (1 - th*th) * float64(i%2)
		if math.Abs(float64(gv)-want) > 1e-6 {
			t.Fatalf("grad[%d] = %v, want %v", i, gv, want)
		}
	}
	if !slices.Equal(fired, []int{0}) {
		t.Fatalf("hook fired for %v, want [0]", fired)
	}
}

func TestCompileErrors(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float32, G.WithShape(2, 3), G.WithName("x"))
	free := G.NewMatrix(g, tensor.Float32, G.WithShape(2, 3), G.WithName("unbound"))
	y := mustN(G.Add(x, free))
	if _, err := Compile(g, Spec{Params: []*G.Node{x}, Outputs: []*G.Node{y}}); err == nil || !strings.Contains(err.Error(), "unbound") {
		t.Errorf("unbound input: %v", err)
	}
	var ce *CompileError
	g2 := G.NewGraph()
	a := G.NewMatrix(g2, tensor.Float32, G.WithShape(2, 2), G.WithName("a"))
	e := mustN(G.Exp(a)) // not in the engine's vocabulary
	if _, err := Compile(g2, Spec{Params: []*G.Node{a}, Outputs: []*G.Node{e}}); !errors.As(err, &ce) || !strings.Contains(err.Error(), "exp") {
		t.Errorf("unsupported op: %v", err)
	}
	if _, err := Compile(g2, Spec{Params: []*G.Node{a, a}, Outputs: []*G.Node{a}}); err == nil {
		t.Error("a node bound twice was accepted")
	}
	// Bindings of the wrong size are refused at run time.
	g3 := G.NewGraph()
	b := G.NewMatrix(g3, tensor.Float32, G.WithShape(2, 2), G.WithName("b"))
	s := mustN(G.Sum(mustN(G.Tanh(b))))
	gr, _ := G.Grad(s, b)
	p, err := Compile(g3, Spec{Params: []*G.Node{b}, Grads: gr, Outputs: []*G.Node{s}})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := New(p, CPU, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Run(context.Background(), Bindings{Params: device.Host(make([]float32, 3)), Grads: device.Host(make([]float32, 4))}, nil); err == nil || !strings.Contains(err.Error(), "parameter vector") {
		t.Errorf("short parameter vector: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ex.Run(ctx, Bindings{Params: device.Host(make([]float32, 4)), Grads: device.Host(make([]float32, 4))}, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}

// TestRunAllocatesNoBuffers: a run allocates no tensors (only what the
// CPU kernels' goroutines need), far less than the arena.
func TestRunAllocatesNoBuffers(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float32, G.WithShape(512, 512), G.WithName("x"))
	w := G.NewMatrix(g, tensor.Float32, G.WithShape(512, 512), G.WithName("w"))
	y := mustN(G.HadamardProd(mustN(G.Tanh(x)), x))
	z := mustN(G.Mul(y, w))
	loss := mustN(G.Sum(mustN(G.HadamardProd(z, mustN(G.Sigmoid(z))))))
	grads, err := G.Grad(loss, x, w)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(g, Spec{Params: []*G.Node{x, w}, Grads: grads, Outputs: []*G.Node{loss}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(p, CPU, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := Bindings{Params: device.Host(make([]float32, p.ParamSize)), Grads: device.Host(make([]float32, p.ParamSize))}
	e.Run(context.Background(), b, nil)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	const runs = 10
	for range runs {
		if _, err := e.Run(context.Background(), b, func(int, device.Event) {}); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&m1)
	perRun := int(m1.TotalAlloc-m0.TotalAlloc) / runs
	t.Logf("%d bytes allocated per run (goroutines of the parallel kernels), arena %d bytes", perRun, e.ArenaBytes())
	if perRun > e.ArenaBytes()/100 {
		t.Fatalf("a run allocates %d bytes, the arena is %d: values are being allocated per run", perRun, e.ArenaBytes())
	}
}

// TestMain makes Gorgonia's tape machine and the ops package use the same
// BLAS (gonum's), so that their matrix products round alike.
func TestMain(m *testing.M) {
	if _, err := ops.ConfigureBLAS(ops.BLASGonum, 0); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}
