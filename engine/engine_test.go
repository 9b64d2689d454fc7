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
	"github.com/sparsegrad/sparsegrad/engine/graphcases"
	"github.com/sparsegrad/sparsegrad/ops"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func mustN(n *G.Node, err error) *G.Node {
	if err != nil {
		panic(err)
	}
	return n
}

// runBoth builds c's graph twice and runs it on Gorgonia's tape machine and
// on the engine, returning the loss, outputs and parameter gradients of
// each.
func runBoth(t *testing.T, c graphcases.Case, seed uint64) (tape, eng [][]float32) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	var vals [][]float32
	for _, s := range c.Params {
		v := make([]float32, tensor.Shape(s).TotalSize())
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		vals = append(vals, v)
	}
	var ivals [][]int
	for _, s := range c.Ints {
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
		for i, s := range c.Params {
			n := len(vals[i])
			ps = append(ps, G.NodeFromAny(g, tensor.New(tensor.WithShape(s...), tensor.WithBacking(flat[off:off+n:off+n])), G.WithName(fmt.Sprintf("p%d", i))))
			off += n
		}
		for i, v := range ivals {
			is = append(is, G.NodeFromAny(g, tensor.New(tensor.WithShape(len(v)), tensor.WithBacking(slices.Clone(v))), G.WithName(fmt.Sprintf("i%d", i))))
		}
		tapeBufs := c.Buffers()
		for i := range 2 * c.Bufs {
			ch := c.Channels
			is = append(is, G.NodeFromAny(g, tensor.New(tensor.WithShape(ch), tensor.WithBacking(tapeBufs[ch*i:ch*(i+1)])), G.WithName(fmt.Sprintf("b%d", i))))
		}
		loss, outs, err := c.On(ps, is)
		if err != nil {
			t.Fatal(err)
		}
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
		bufs := c.Buffers()
		for run := 0; run < 2; run++ { // a second run reuses the arena
			if run == 1 {
				bufs = c.Buffers() // BatchNorm updated them
			}
			if _, err := e.Run(context.Background(), Bindings{Params: device.Host(flat), Grads: device.Host(grad), Buffers: device.Host(bufs)}, nil); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 1 + nout {
			eng = append(eng, slices.Clone(e.Output(i).Float32s()))
		}
		for i := range c.Params {
			o := p.ParamOffsets[i]
			eng = append(eng, grad[o:o+len(vals[i])])
		}
		eng = append(eng, bufs)
	}
	return tape, eng
}

// compileCase builds c's graph for the engine (parameters bound to one
// vector, integer inputs, running statistics as buffers) and loads it on the
// CPU.
func compileCase(t *testing.T, c graphcases.Case) (*Program, *Executor) {
	t.Helper()
	g, err := graphcases.New(c)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(g.G, Spec{Params: g.Params, Grads: g.Grads, Buffers: g.Bufs, Inputs: g.Ints, Outputs: append([]*G.Node{g.Loss}, g.Outs...)})
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
	for _, c := range graphcases.Cases() {
		t.Run(c.Name, func(t *testing.T) {
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
	c := graphcases.Named("conv-bn-relu-xent")
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
	for _, s := range c.Params {
		for range tensor.Shape(s).TotalSize() {
			flat = append(flat, float32(r.NormFloat64()))
		}
	}
	idx := make([]int64, c.Ints[0][0])
	for j := range idx {
		idx[j] = int64(r.IntN(c.Ints[0][1]))
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
		bufs := c.Buffers()
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

// capturing is a CPU stream that can "capture": it counts what the
// executor asks of it. Capture issues f (on the CPU the work runs at once,
// where a GPU would record it), a replay issues it again.
type capturing struct {
	device.Stream
	captures, launches int
}

func (c *capturing) Capture(f func() error) (Replay, error) {
	c.captures++
	return &cpuReplay{c: c, f: f}, f()
}

type cpuReplay struct {
	c *capturing
	f func() error
}

func (r *cpuReplay) Launch() error {
	r.c.launches++
	return r.f()
}

func (r *cpuReplay) Close() error { return nil }

// TestCaptureOnSecondRun: an executor on a stream that can capture runs
// its first run kernel by kernel (libraries plan on their first call,
// which a capture must not hold), captures on the second and replays from
// then on; new bindings are captured again at once, and the hook sees
// every gradient on every run, replayed or not.
func TestCaptureOnSecondRun(t *testing.T) {
	p, _ := compileCase(t, graphcases.Cases()[0])
	s := &capturing{Stream: device.CPU.Stream()}
	e, err := New(p, CPU, s)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	bind := func() Bindings {
		params := make([]float32, p.ParamSize)
		for i := range params {
			params[i] = float32(i%7) * 0.1
		}
		return Bindings{Params: device.Host(params), Grads: device.Host(make([]float32, p.ParamSize)), Buffers: device.Host(make([]float32, p.BufferSize))}
	}
	b := bind()
	var want []float32
	for run, c := range []struct{ captures, launches int }{{0, 0}, {1, 1}, {1, 2}} {
		hooked := 0
		if _, err := e.Run(context.Background(), b, func(int, device.Event) { hooked++ }); err != nil {
			t.Fatal(err)
		}
		if s.captures != c.captures || s.launches != c.launches || e.Replaying() != (run > 0) {
			t.Fatalf("run %d: %d captures, %d launches, replaying %v; want %d, %d, %v", run+1, s.captures, s.launches, e.Replaying(), c.captures, c.launches, run > 0)
		}
		if hooked != len(p.ParamOffsets) {
			t.Fatalf("run %d: the hook saw %d gradients of %d", run+1, hooked, len(p.ParamOffsets))
		}
		got := slices.Clone(b.Grads.Float32s())
		if run == 0 {
			want = got
		} else if !slices.Equal(got, want) {
			t.Fatalf("run %d: the gradient differs from the first run's", run+1)
		}
	}
	if _, err := e.Run(context.Background(), bind(), nil); err != nil {
		t.Fatal(err)
	}
	if s.captures != 2 || s.launches != 3 {
		t.Fatalf("after new bindings: %d captures, %d launches; want the program captured again at once (2, 3)", s.captures, s.launches)
	}
}
