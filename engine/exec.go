package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
)

// Backend is a device's kernel table.
type Backend interface {
	// Device is the device the kernels run on.
	Device() device.Device
	// Stream is the stream programs loaded through this backend run on
	// unless New is given another.
	Stream() device.Stream
	// Kernel prepares instruction in of p for this device, or says why the
	// device cannot run it.
	Kernel(p *Program, in *Instr) (Kernel, error)
}

// Preparer is implemented by backends that look at a whole program before
// preparing its kernels: Prepare returns the backend that prepares p's
// kernels (for one executor). The CPU backend chooses the memory formats of
// oneDNN's values there.
type Preparer interface {
	Prepare(p *Program) (Backend, error)
}

// Kernel runs one instruction of a program on a stream of its device.
type Kernel interface {
	// Workspace is the scratch the kernel needs, in bytes.
	Workspace() int
	// Run computes out from in; ws is Workspace() bytes of scratch (a
	// float32 buffer).
	Run(s device.Stream, in []device.Buffer, out, ws device.Buffer) error
}

// Capturer is implemented by streams that can record the work a function
// issues and replay it with one call (CUDA graphs). An executor runs its
// program kernel by kernel the first time — libraries such as cuBLAS and
// cuDNN plan and allocate on their first call, which a capture must not
// contain — then captures it on the second run (and again when the
// bindings change) and replays it afterwards; the hooks then receive
// events recorded inside the replay.
type Capturer interface {
	Capture(f func() error) (Replay, error)
}

// Replay is captured work.
type Replay interface {
	Launch() error
	Close() error
}

// Holder is implemented by streams that the goroutine issuing a burst of
// work may hold meanwhile (cuda.Stream: its OS thread locked with the
// device's context current, so that each launch costs the driver call
// only); an executor holds its stream while it runs a program.
type Holder interface {
	Hold() (release func())
}

// ErrNoCapture is returned by a Capturer that does not capture (disabled);
// the executor then issues every kernel of every run itself.
var ErrNoCapture = errors.New("engine: capture not available")

// Bindings are the caller-owned vectors a run reads and writes: the
// parameters, the gradient (ignored by forward-only programs) and the
// buffers (BatchNorm's running statistics), each a float32 vector laid out
// as the program's ParamOffsets and BufferOffsets say.
type Bindings struct {
	Params, Grads, Buffers device.Buffer
}

// GradHook is called during a run when parameter param's gradient is
// final: the gradient vector holds it once ready has completed. It runs on
// the goroutine executing the program, so it must return quickly.
type GradHook func(param int, ready device.Event)

// Timing is the duration of a run's two parts.
type Timing struct {
	// Forward covers the instructions of the outputs (the loss), Backward
	// the rest (the gradients).
	Forward, Backward time.Duration
}

// Executor is a program loaded on a device: its kernels, its arena and the
// storage of its inputs, constants and outputs. An executor is not safe for
// concurrent use.
type Executor struct {
	p       *Program
	be      Backend // the backend that prepared the kernels
	dev     device.Device
	stream  device.Stream
	kernels []Kernel
	arena   device.Buffer
	offsets []int // byte offset in the arena of every base value held there
	wsOff   []int // byte offset of each instruction's workspace
	bound   Bindings
	ready   bool // bufs of bound values resolved for bound
	bufs    []device.Buffer
	stage   []device.Buffer // host staging of each input (device executors; lazy)
	fetch   []fetched       // outputs copied to the host after every run
	args    [][]device.Buffer
	wsb     []device.Buffer
	peak    int

	// Captured runs (Capturer streams).
	replay    Replay
	noCapture bool
	warm      bool // one run issued kernel by kernel has completed
	// sizeOnly marks an executor loaded through Sizing: planned, with no
	// arena.
	sizeOnly   bool
	captureErr error
	captured   issued
	eager      issued
	// last is what the last run started issued (captured or eager; nil
	// before any, or after a failed start).
	last *issued
}

// issued is what issuing a program's work recorded: the events of the
// forward/backward boundaries and of the gradients as they become final.
type issued struct {
	start, mid, end device.Event
	finals          []finalEvent
}

type finalEvent struct {
	param int
	ev    device.Event
}

// arenaAlign is the alignment of every value in the arena, in bytes.
const arenaAlign = 256

// New loads p on a backend: it prepares every kernel, plans the arena by
// liveness (values whose lifetimes do not overlap share memory), allocates
// it on the backend's device, and sets the constants. s is the stream the
// executor runs on (nil: the backend's stream).
func New(p *Program, be Backend, s device.Stream) (_ *Executor, err error) {
	dev := be.Device()
	if s == nil {
		s = be.Stream()
	}
	// A sizing backend prepares the kernels its backend would (oneDNN's
	// formats and scratch included) and frees them again once planned.
	sized, sizeOnly := be.(sizing)
	if sizeOnly {
		be = sized.Backend
	}
	if pr, ok := be.(Preparer); ok {
		b, err := pr.Prepare(p)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		be = b
		if c, ok := b.(io.Closer); ok {
			defer func() {
				if err != nil || sizeOnly {
					c.Close()
				}
			}()
		}
	}
	e := &Executor{p: p, dev: dev, stream: s, be: be}
	e.kernels = make([]Kernel, len(p.Instrs))
	for j := range p.Instrs {
		k, err := be.Kernel(p, &p.Instrs[j])
		if err != nil {
			return nil, fmt.Errorf("engine: %s: %w", p.Instrs[j].Node, err)
		}
		e.kernels[j] = k
	}
	initK := make([]Kernel, len(p.Init))
	for j := range p.Init {
		k, err := be.Kernel(p, &p.Init[j])
		if err != nil {
			return nil, fmt.Errorf("engine: %s: %w", p.Init[j].Node, err)
		}
		initK[j] = k
	}
	size := e.plan()
	if sizeOnly {
		e.sizeOnly = true
		e.bufs = make([]device.Buffer, len(p.Values))
		return e, nil
	}
	arena, err := dev.Alloc(device.Float32, (size+3)/4)
	if err != nil {
		return nil, fmt.Errorf("engine: allocating %d MiB for the program's values: %w", size>>20, err)
	}
	e.arena = arena
	e.bufs = make([]device.Buffer, len(p.Values))
	for i := range p.Values {
		if e.inArena(i) {
			v := &p.Values[i]
			e.bufs[i] = arena.View(v.DType, e.offsets[i], v.Size())
		}
	}
	e.resolveViews(false)
	e.wsb = make([]device.Buffer, len(p.Instrs))
	for j, k := range e.kernels {
		e.wsb[j] = arena.View(device.Float32, e.wsOff[j], k.Workspace()/4)
	}
	for j, in := range p.Init {
		if err := initK[j].Run(s, nil, e.bufs[in.Out], device.Buffer{}); err != nil {
			return nil, fmt.Errorf("engine: setting %s: %w", in.Node, err)
		}
	}
	if err := s.Synchronize(); err != nil {
		return nil, err
	}
	e.args = make([][]device.Buffer, len(p.Instrs))
	for j, in := range p.Instrs {
		e.args[j] = make([]device.Buffer, len(in.In))
	}
	return e, nil
}

// sizing is the backend Sizing returns.
type sizing struct{ Backend }

// Sizing returns a backend that prepares programs as be does but allocates
// no memory for them: New plans the arena and returns an executor whose
// ArenaBytes is the memory New would allocate on be, and which cannot run
// (Run fails; its inputs and outputs are empty). It sizes a model's memory
// before anything is allocated, e.g. to refuse a batch that cannot fit.
func Sizing(be Backend) Backend {
	if s, ok := be.(sizing); ok {
		return s
	}
	return sizing{be}
}

// inArena reports whether value i is a base value stored in the arena.
func (e *Executor) inArena(i int) bool {
	switch e.p.Values[i].Kind {
	case Temp, Input, Const:
		return true
	}
	return false
}

// Close frees the arena and what the kernels hold outside it.
func (e *Executor) Close() error {
	if e.sizeOnly {
		return nil
	}
	if c, ok := e.be.(io.Closer); ok {
		c.Close()
	}
	return e.dev.Free(e.arena)
}

// ArenaBytes is the size of the executor's arena: the peak memory of its
// values and scratch.
func (e *Executor) ArenaBytes() int { return e.peak }

// Program is the executed program.
func (e *Executor) Program() *Program { return e.p }

// Device is the executor's device.
func (e *Executor) Device() device.Device { return e.dev }

// Stream is the stream the executor runs on.
func (e *Executor) Stream() device.Stream { return e.stream }

// Input returns the storage of input i (Spec.Inputs order), for the caller
// to fill before a run.
func (e *Executor) Input(i int) device.Buffer { return e.bufs[e.p.InputIDs[i]] }

// Staging returns host memory for input i that the caller fills and then
// sends with Upload(i): one buffer per input, kept by the executor, so an
// upload that may still be reading its staging (an asynchronous copy from
// host memory) never shares it with another input's. On a host device it
// is the input itself.
func (e *Executor) Staging(i int) (device.Buffer, error) {
	in := e.Input(i)
	if in.IsHost() {
		return in, nil
	}
	if e.stage == nil {
		e.stage = make([]device.Buffer, len(e.p.InputIDs))
	}
	if e.stage[i].Len() != in.Len() {
		b, err := device.CPU.Alloc(in.DType(), in.Len())
		if err != nil {
			return device.Buffer{}, fmt.Errorf("engine: staging input %d: %w", i, err)
		}
		e.stage[i] = b
	}
	return e.stage[i], nil
}

// Upload sends input i's staging (Staging) to the input on the executor's
// stream; the copy is ordered before the next run. Nothing on a host device.
func (e *Executor) Upload(i int) error {
	in := e.Input(i)
	if in.IsHost() {
		return nil
	}
	st, err := e.Staging(i)
	if err != nil {
		return err
	}
	return e.stream.Copy(in, st)
}

// Output returns the value of output i (Spec.Outputs order) after a run.
func (e *Executor) Output(i int) device.Buffer { return e.bufs[e.p.OutputIDs[i]] }

// fetched is an output copied to the host after every run.
type fetched struct {
	out  int
	host device.Buffer
}

// Fetch makes every later Run, Start (and Profile) copy output i into host
// memory after the program, and returns that memory: it holds the output
// when Run returns, the one wait for the device covering the program and
// the copy (after Start, once the stream has completed the run). On a
// device that allocates page-locked host memory (a GPU) the memory is, so
// that the copy does not wait by itself. On a host device it is the output
// itself.
func (e *Executor) Fetch(i int) (device.Buffer, error) {
	out := e.Output(i)
	if out.IsHost() {
		return out, nil
	}
	for _, f := range e.fetch {
		if f.out == i {
			return f.host, nil
		}
	}
	host, err := hostMemory(e.dev, out.DType(), out.Len())
	if err != nil {
		return device.Buffer{}, fmt.Errorf("engine: host memory for output %d: %w", i, err)
	}
	e.fetch = append(e.fetch, fetched{i, host})
	return host, nil
}

// hostMemory returns n elements of dt in host memory, page-locked where
// dev allocates that (AllocPinned, as cuda.Device does).
func hostMemory(dev device.Device, dt device.DType, n int) (device.Buffer, error) {
	p, ok := dev.(interface{ AllocPinned(n int) ([]byte, error) })
	if !ok || n == 0 {
		return device.CPU.Alloc(dt, n)
	}
	mem, err := p.AllocPinned(n * dt.Size())
	if err != nil {
		return device.Buffer{}, err
	}
	ptr := unsafe.Pointer(&mem[0])
	switch dt {
	case device.Float32:
		return device.Host(unsafe.Slice((*float32)(ptr), n)), nil
	case device.Float64:
		return device.Host(unsafe.Slice((*float64)(ptr), n)), nil
	case device.Int32:
		return device.Host(unsafe.Slice((*int32)(ptr), n)), nil
	case device.Int64:
		return device.Host(unsafe.Slice((*int64)(ptr), n)), nil
	}
	return device.Buffer{}, fmt.Errorf("no host buffers of %v", dt)
}

// fetchOutputs issues the copies of the fetched outputs and waits for the
// stream (the program and the copies); without fetched outputs it waits
// for end only.
func (e *Executor) fetchOutputs(end device.Event) error {
	if len(e.fetch) == 0 {
		return end.Synchronize()
	}
	for _, f := range e.fetch {
		if err := e.stream.Copy(f.host, e.Output(f.out)); err != nil {
			return fmt.Errorf("engine: copying output %d to the host: %w", f.out, err)
		}
	}
	return e.stream.Synchronize()
}

// plan assigns arena offsets and returns the arena size in bytes. Every
// block — a base value held in the arena, or an instruction's workspace —
// has a lifetime: from the instruction that first writes it to the last
// that reads it (persistent values: always; a workspace: its instruction).
// Blocks are placed largest first, each at the lowest offset where it
// overlaps no already placed block whose lifetime overlaps its own
// ("greedy by size", as offline memory planners for inference do), which
// packs far tighter than allocating in program order.
func (e *Executor) plan() int {
	p := e.p
	e.offsets = make([]int, len(p.Values))
	e.wsOff = make([]int, len(p.Instrs))
	type block struct {
		size, first, last int
		value, instr      int // the value or the instruction (workspace), the other −1
	}
	const forever = 1 << 30
	var blocks []block
	for i := range p.Values {
		v := &p.Values[i]
		if !e.inArena(i) || v.Bytes() == 0 {
			continue
		}
		b := block{size: roundUp(v.Bytes()), first: -1, last: forever, value: i, instr: -1}
		if v.Kind == Temp && !v.Persistent {
			if v.Def < 0 {
				continue // never written: never read either
			}
			b.first, b.last = v.Def, max(v.LastUse, v.Def)
		}
		blocks = append(blocks, b)
	}
	for j, k := range e.kernels {
		if ws := k.Workspace(); ws > 0 {
			blocks = append(blocks, block{size: roundUp(ws), first: j, last: j, value: -1, instr: j})
		}
	}
	sort.SliceStable(blocks, func(a, b int) bool {
		if blocks[a].size != blocks[b].size {
			return blocks[a].size > blocks[b].size
		}
		return blocks[a].first < blocks[b].first
	})
	type placed struct{ off, end, first, last int }
	var done []placed
	var conflicts []placed
	top := 0
	for _, b := range blocks {
		conflicts = conflicts[:0]
		for _, d := range done {
			if d.first <= b.last && b.first <= d.last {
				conflicts = append(conflicts, d)
			}
		}
		sort.Slice(conflicts, func(x, y int) bool { return conflicts[x].off < conflicts[y].off })
		off := 0
		for _, c := range conflicts {
			if c.off >= off+b.size {
				break
			}
			off = max(off, c.end)
		}
		done = append(done, placed{off, off + b.size, b.first, b.last})
		top = max(top, off+b.size)
		if b.value >= 0 {
			e.offsets[b.value] = off
		} else {
			e.wsOff[b.instr] = off
		}
	}
	e.peak = top
	return top
}

func roundUp(n int) int { return (n + arenaAlign - 1) / arenaAlign * arenaAlign }

// resolveViews sets the buffers of views (of arena values, or, when bound
// is set, of every value).
func (e *Executor) resolveViews(bound bool) {
	for i := range e.p.Values {
		v := &e.p.Values[i]
		if v.Kind != View {
			continue
		}
		if !bound && !e.inArena(int(v.Base)) {
			continue
		}
		base := e.bufs[v.Base]
		e.bufs[i] = base.Slice(v.Offset, v.Offset+v.Size())
	}
}

// bind resolves the values bound to b.
func (e *Executor) bind(b Bindings) error {
	p := e.p
	check := func(what string, buf device.Buffer, n int) error {
		if n == 0 {
			return nil
		}
		if buf.Len() != n || buf.DType() != device.Float32 {
			return fmt.Errorf("engine: the %s vector is %v, the program needs %d float32s", what, buf, n)
		}
		return nil
	}
	if err := check("parameter", b.Params, p.ParamSize); err != nil {
		return err
	}
	if len(p.GradIDs) > 0 {
		if err := check("gradient", b.Grads, p.ParamSize); err != nil {
			return err
		}
	}
	if err := check("buffer", b.Buffers, p.BufferSize); err != nil {
		return err
	}
	for i := range p.Values {
		v := &p.Values[i]
		switch v.Kind {
		case Param:
			o := p.ParamOffsets[v.Index]
			e.bufs[i] = b.Params.Slice(o, o+v.Size())
		case Grad:
			o := p.ParamOffsets[v.Index]
			e.bufs[i] = b.Grads.Slice(o, o+v.Size())
		case Buffer:
			o := p.BufferOffsets[v.Index]
			e.bufs[i] = b.Buffers.Slice(o, o+v.Size())
		}
	}
	e.resolveViews(true)
	for j, in := range p.Instrs {
		for k, id := range in.In {
			e.args[j][k] = e.bufs[id]
		}
	}
	e.bound, e.ready = b, true
	return nil
}

// CaptureError is why the executor runs its kernels one by one on a stream
// that can capture (nil when it replays captured runs, or never tried).
func (e *Executor) CaptureError() error { return e.captureErr }

// Replaying reports whether the executor replays a captured run.
func (e *Executor) Replaying() bool { return e.replay != nil }

// Run executes the program once with the caller's vectors: it fills the
// gradient (for a training program), updates the buffers where the program
// does, and leaves the outputs readable. hook, when not nil, is called as
// each parameter's gradient becomes final, in program order (on a stream
// that replays captured runs, right after the replay is launched, with
// events that complete when the gradient does). On a stream that can
// capture, the first run issues every kernel itself and the second
// captures the program and replays it. Run returns after the device has
// finished the work and copied the outputs Fetch asks for.
func (e *Executor) Run(ctx context.Context, b Bindings, hook GradHook) (Timing, error) {
	if err := e.Start(ctx, b, hook); err != nil {
		return Timing{}, err
	}
	if err := e.Wait(); err != nil {
		return Timing{}, err
	}
	return e.Timing()
}

// Start is Run without the wait: it issues the program and the copies of
// the outputs Fetch asks for on the executor's stream and returns. The
// gradient, the buffers and the fetched outputs hold the run's values
// once the stream has completed it — after Wait, or any synchronisation of
// the stream the caller makes anyway (a trainer's at the end of its step:
// the loss then costs no wait of its own) — and Timing gives its times
// from then on. On a host device the run is done when Start returns.
func (e *Executor) Start(ctx context.Context, b Bindings, hook GradHook) error {
	if err := e.prepare(ctx, b); err != nil {
		return err
	}
	if h, ok := e.stream.(Holder); ok {
		defer h.Hold()()
	}
	e.last = nil
	is := &e.eager
	if c, ok := e.stream.(Capturer); ok && !e.noCapture {
		if e.replay == nil && e.warm {
			var rec issued
			rep, err := c.Capture(func() error { return e.issue(&rec, nil) })
			if err != nil {
				// Run kernel by kernel from now on.
				e.noCapture = true
				if !errors.Is(err, ErrNoCapture) {
					e.captureErr = err
				}
			} else {
				e.replay, e.captured = rep, rec
			}
		}
		if e.replay != nil {
			if err := e.replay.Launch(); err != nil {
				return fmt.Errorf("engine: replaying the program: %w", err)
			}
			is = &e.captured
			if hook != nil {
				for _, f := range is.finals {
					hook(f.param, f.ev)
				}
			}
		}
	}
	if e.replay == nil {
		if err := e.issue(is, hook); err != nil {
			return err
		}
	}
	for _, f := range e.fetch {
		if err := e.stream.Copy(f.host, e.Output(f.out)); err != nil {
			return fmt.Errorf("engine: copying output %d to the host: %w", f.out, err)
		}
	}
	e.last = is
	e.warm = true
	return nil
}

// Wait waits for the run Start issued: the program and the copies of the
// fetched outputs (the stream's work up to its end).
func (e *Executor) Wait() error {
	if e.last == nil {
		return errors.New("engine: Wait without a run started")
	}
	if len(e.fetch) == 0 {
		return e.last.end.Synchronize()
	}
	return e.stream.Synchronize()
}

// Timing is the times of the last run, read from its events: valid once
// the run has completed (after Run, Wait, or a synchronisation of the
// stream after Start); zero before any run. An event the device could not
// time is the error.
func (e *Executor) Timing() (Timing, error) {
	is := e.last
	if is == nil {
		return Timing{}, nil
	}
	fwd, err := device.Elapsed(is.start, is.mid)
	if err != nil {
		return Timing{}, fmt.Errorf("engine: timing the forward pass: %w", err)
	}
	bwd, err := device.Elapsed(is.mid, is.end)
	if err != nil {
		return Timing{}, fmt.Errorf("engine: timing the backward pass: %w", err)
	}
	return Timing{Forward: fwd, Backward: bwd}, nil
}

// prepare readies a run with bindings b (Run, Profile): the context still
// live, an executor with memory, b bound (a replay captured with other
// bindings dropped).
func (e *Executor) prepare(ctx context.Context, b Bindings) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if e.sizeOnly {
		return errors.New("engine: a program loaded through Sizing has no memory and cannot run")
	}
	if !e.ready || b != e.bound {
		if err := e.bind(b); err != nil {
			return err
		}
		if e.replay != nil {
			e.replay.Close()
			e.replay = nil
		}
	}
	return nil
}

// OpTime is one instruction's share of a profiled run (Executor.Profile).
type OpTime struct {
	// Node is the graph node the instruction computes, Op the op with its
	// attributes and Kind the op's type name (e.g. "Sum").
	Node, Op, Kind string
	// Shapes are the instruction's input shapes.
	Shapes [][]int
	// Time is the span between the events recorded before and after it.
	Time time.Duration
}

// Profile runs the program once kernel by kernel with an event after every
// instruction, and returns each instruction's time, in program order: where
// a step's time goes on a device (on a GPU, kernels run back to back on the
// stream, so the span between two events is the kernel's time plus any
// gap before it). It neither captures nor replays, and leaves the outputs
// readable as Run does; a later Run is unaffected.
func (e *Executor) Profile(ctx context.Context, b Bindings) ([]OpTime, error) {
	if err := e.prepare(ctx, b); err != nil {
		return nil, err
	}
	p, s := e.p, e.stream
	if h, ok := s.(Holder); ok {
		defer h.Hold()()
	}
	evs := make([]device.Event, len(e.kernels)+1)
	var err error
	if evs[0], err = s.Record(); err != nil {
		return nil, err
	}
	for j, k := range e.kernels {
		in := &p.Instrs[j]
		if err := k.Run(s, e.args[j], e.bufs[in.Out], e.wsb[j]); err != nil {
			return nil, fmt.Errorf("engine: %s: %w", in.Node, err)
		}
		if evs[j+1], err = s.Record(); err != nil {
			return nil, err
		}
	}
	if err := e.fetchOutputs(evs[len(evs)-1]); err != nil {
		return nil, err
	}
	e.warm, e.last = true, nil
	out := make([]OpTime, len(e.kernels))
	for j := range out {
		in := &p.Instrs[j]
		shapes := make([][]int, len(in.In))
		for i, v := range in.In {
			shapes[i] = p.Values[v].Shape
		}
		kind := fmt.Sprintf("%T", in.Op)
		if i := strings.LastIndexByte(kind, '.'); i >= 0 {
			kind = kind[i+1:]
		}
		t, err := device.Elapsed(evs[j], evs[j+1])
		if err != nil {
			return nil, fmt.Errorf("engine: timing %s: %w", in.Node, err)
		}
		out[j] = OpTime{Node: in.Node, Op: fmt.Sprint(in.Op), Kind: kind, Shapes: shapes, Time: t}
	}
	return out, nil
}

// issue issues every instruction on the executor's stream with events at
// the start, at the forward/backward boundary, at the end and after every
// instruction that finishes a gradient; hook, when not nil, is called with
// each gradient's event as it is issued.
func (e *Executor) issue(is *issued, hook GradHook) error {
	p, s := e.p, e.stream
	var err error
	if is.start, err = s.Record(); err != nil {
		return err
	}
	is.mid = is.start
	is.finals = is.finals[:0]
	for j, k := range e.kernels {
		if j == p.Forward && j > 0 {
			if is.mid, err = s.Record(); err != nil {
				return err
			}
		}
		in := &p.Instrs[j]
		if err := k.Run(s, e.args[j], e.bufs[in.Out], e.wsb[j]); err != nil {
			return fmt.Errorf("engine: %s: %w", in.Node, err)
		}
		if len(in.Final) > 0 {
			ev, err := s.Record()
			if err != nil {
				return err
			}
			for _, q := range in.Final {
				is.finals = append(is.finals, finalEvent{q, ev})
				if hook != nil {
					hook(q, ev)
				}
			}
		}
	}
	if is.end, err = s.Record(); err != nil {
		return err
	}
	if len(p.Instrs) == p.Forward {
		is.mid = is.end
	}
	return nil
}
