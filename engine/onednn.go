package engine

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/native/dnnl"
	"github.com/sparsegrad/sparsegrad/ops"
)

// dnnProgram is the CPU backend for one executor when oneDNN is configured:
// the program's plan (memory formats, merged instructions) and the oneDNN
// objects of its kernels.
type dnnProgram struct {
	lib     *dnnl.Lib
	threads int
	p       *Program
	plan    *dnnPlan
	res     *dnnResources
	cleanup runtime.Cleanup
	links   map[int]*bnLink // by the instruction that does a merged pair's work
	stats   KernelStats
}

// KernelStats describes the kernels of an executor: how many instructions
// oneDNN runs (and how many of them do a merged pair's work), how many
// values are kept in oneDNN's blocked format, and the format conversions
// (reorders, weights included) one run does.
type KernelStats struct {
	OneDNN, Merged, Blocked int
	Reorders                int
	ReorderBytes            int64
}

// KernelStats describes the executor's kernels (zero with the reference
// kernels).
func (e *Executor) KernelStats() KernelStats {
	if c, ok := e.be.(*dnnProgram); ok {
		return c.stats
	}
	return KernelStats{}
}

// dnnResources are the oneDNN objects an executor's kernels hold.
type dnnResources struct {
	mu     sync.Mutex
	stream *dnnl.Stream
	prims  []*dnnl.Primitive
	mems   []*dnnl.Memory
}

func (r *dnnResources) free() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.prims {
		p.Close()
	}
	for _, m := range r.mems {
		m.Close()
	}
	r.stream.Close()
	r.prims, r.mems, r.stream = nil, nil, nil
}

// bnLink carries what the first instruction of a merged batch
// normalisation pair receives to the kernel that does the work.
type bnLink struct {
	runMean, runVar device.Buffer
}

func newDNNProgram(p *Program, lib *dnnl.Lib, threads int) (*dnnProgram, error) {
	s, err := lib.Stream()
	if err != nil {
		return nil, err
	}
	c := &dnnProgram{lib: lib, threads: threads, p: p, plan: planDNN(p, lib.Block()), res: &dnnResources{stream: s}, links: map[int]*bnLink{}}
	for j, d := range c.plan.dnn {
		if d {
			c.stats.OneDNN++
		}
		if c.plan.merged[j] >= 0 {
			c.stats.Merged++
		}
	}
	for i, b := range c.plan.blocked {
		if b && p.Values[i].Kind != View {
			c.stats.Blocked++
		}
	}
	c.cleanup = runtime.AddCleanup(c, (*dnnResources).free, c.res)
	return c, nil
}

func (c *dnnProgram) Device() device.Device { return device.CPU }

func (c *dnnProgram) Stream() device.Stream { return device.CPU.Stream() }

// Close frees the oneDNN objects (io.Closer; Executor.Close calls it).
func (c *dnnProgram) Close() error {
	c.cleanup.Stop()
	c.res.free()
	return nil
}

// Blocked reports whether value id is stored in oneDNN's blocked format
// (for tests and debugging).
func (c *dnnProgram) Blocked(id ValueID) bool { return c.plan.blocked[id] }

func (c *dnnProgram) Kernel(p *Program, in *Instr) (Kernel, error) {
	j := -1
	for i := range p.Instrs {
		if &p.Instrs[i] == in {
			j = i
			break
		}
	}
	if j < 0 || !c.plan.dnn[j] {
		return refKernel(p, in), nil
	}
	var k Kernel
	err := c.lib.WithThreads(c.threads, func() (err error) {
		k, err = c.kernel(j, in)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("oneDNN: %w (run with -kernels im2col to use the reference kernels)", err)
	}
	return k, nil
}

// Where a memory object's data is: an input of the instruction (≥ 0), its
// output, a place in its workspace, or the shared scratchpad region.
const (
	atOut     = -1
	atWS      = -2
	atScratch = -3
)

type memRef struct {
	mem  *dnnl.Memory
	at   int
	off  int
	last unsafe.Pointer // the data the memory object points at
}

// step is one primitive execution or one Go function.
type step struct {
	prim *dnnl.Primitive
	args []dnnl.Arg
	refs []*memRef
	fn   func(r *dnnRun) error
}

// dnnRun is what a kernel's steps see during one run.
type dnnRun struct {
	in      []device.Buffer
	out, ws device.Buffer
}

func (r *dnnRun) f32(off, n int) []float32 { return r.ws.View(device.Float32, off, n).Float32s() }

// dnnKernel is one instruction run as a sequence of oneDNN primitives
// (reorders included) and small Go steps.
type dnnKernel struct {
	c          *dnnProgram
	steps      []step
	ws         int // workspace bytes: reorder targets and small arrays, then the scratchpad
	scratch    int // scratchpad bytes (the largest of the steps')
	scratchOff int
	run        dnnRun
}

func (k *dnnKernel) Workspace() int { return k.ws }

func bufPtr(b device.Buffer) unsafe.Pointer {
	h := b.HostBytes()
	if len(h) == 0 {
		return nil
	}
	return unsafe.Pointer(&h[0])
}

func (k *dnnKernel) Run(_ device.Stream, in []device.Buffer, out, ws device.Buffer) error {
	r := &k.run
	r.in, r.out, r.ws = in, out, ws
	err := k.c.lib.WithThreads(k.c.threads, func() error {
		for i := range k.steps {
			s := &k.steps[i]
			if s.fn != nil {
				if err := s.fn(r); err != nil {
					return err
				}
				continue
			}
			for _, m := range s.refs {
				var p unsafe.Pointer
				switch {
				case m.at >= 0:
					p = bufPtr(in[m.at])
				case m.at == atOut:
					p = bufPtr(out)
				case m.at == atWS:
					p = unsafe.Add(bufPtr(ws), m.off)
				default:
					p = unsafe.Add(bufPtr(ws), k.scratchOff)
				}
				if p != m.last {
					if err := m.mem.Set(p); err != nil {
						return err
					}
					m.last = p
				}
			}
			k.c.res.mu.Lock()
			err := k.c.res.stream.Execute(s.prim, s.args)
			k.c.res.mu.Unlock()
			if err != nil {
				return err
			}
		}
		return nil
	})
	runtime.KeepAlive(in)
	runtime.KeepAlive(out)
	runtime.KeepAlive(ws)
	r.in, r.out, r.ws = nil, device.Buffer{}, device.Buffer{}
	return err
}

// kb builds a dnnKernel. Its first error sticks: the calls after it do
// nothing (exec still closes its primitive descriptor), and finish
// returns it.
type kb struct {
	c   *dnnProgram
	k   *dnnKernel
	err error
}

// keep makes err the builder's error unless it has one.
func (b *kb) keep(err error) {
	if b.err == nil {
		b.err = err
	}
}

func (c *dnnProgram) builder() *kb { return &kb{c: c, k: &dnnKernel{c: c}} }

func (b *kb) alloc(bytes int) int {
	off := b.k.ws
	b.k.ws += (bytes + 63) &^ 63
	return off
}

func (b *kb) mem(d *dnnl.MemDesc, at, off int) *memRef {
	if b.err != nil {
		return nil
	}
	m, err := b.c.lib.Memory(d)
	if err != nil {
		b.err = err
		return nil
	}
	b.c.res.mems = append(b.c.res.mems, m)
	return &memRef{mem: m, at: at, off: off}
}

// exec appends an execution of pd with args (argument kind → memory) and
// the scratchpad.
func (b *kb) exec(pd *dnnl.PrimDesc, args map[int]*memRef) {
	defer pd.Close()
	if b.err != nil {
		return
	}
	p, err := pd.Create()
	if err != nil {
		b.err = err
		return
	}
	b.c.res.prims = append(b.c.res.prims, p)
	if n := pd.Scratchpad(); n > 0 {
		if args[dnnl.ArgScratchpad] = b.mem(pd.Query(dnnl.QueryScratchpad, 0), atScratch, 0); b.err != nil {
			return
		}
		b.k.scratch = max(b.k.scratch, n)
	}
	s := step{prim: p}
	for kind, m := range args {
		s.args = append(s.args, dnnl.NewArg(kind, m.mem))
		s.refs = append(s.refs, m)
	}
	b.k.steps = append(b.k.steps, s)
}

func (b *kb) goStep(f func(r *dnnRun) error) { b.k.steps = append(b.k.steps, step{fn: f}) }

// reorder appends a copy from one memory object to another.
func (b *kb) reorder(from *memRef, fromD *dnnl.MemDesc, to *memRef, toD *dnnl.MemDesc) {
	if b.err != nil {
		return
	}
	pd, err := b.c.lib.Reorder(fromD, toD)
	if err != nil {
		b.err = err
		return
	}
	b.c.stats.Reorders++
	b.c.stats.ReorderBytes += int64(b.c.lib.Size(toD))
	b.exec(pd, map[int]*memRef{dnnl.ArgFrom: from, dnnl.ArgTo: to})
}

// input returns the memory a primitive reads an operand from: the operand
// itself (stored as user) when the primitive wants that format, or a copy
// reordered into want in the workspace.
func (b *kb) input(at int, user, want *dnnl.MemDesc) *memRef {
	src := b.mem(user, at, 0)
	if b.err != nil || b.c.lib.Equal(user, want) {
		return src
	}
	dst := b.mem(want, atWS, b.alloc(b.c.lib.Size(want)))
	b.reorder(src, user, dst, want)
	return dst
}

// output returns the memory a primitive writes a result to — the result
// itself (stored as user, at at) or a place in the workspace in format want
// — and the step that reorders it into place afterwards (nil: none).
func (b *kb) output(at int, user, want *dnnl.MemDesc) (*memRef, func()) {
	dst := b.mem(user, at, 0)
	if b.err != nil || b.c.lib.Equal(user, want) {
		return dst, nil
	}
	tmp := b.mem(want, atWS, b.alloc(b.c.lib.Size(want)))
	return tmp, func() { b.reorder(tmp, want, dst, user) }
}

// finish returns the kernel built, or the builder's error.
func (b *kb) finish() (Kernel, error) {
	if b.err != nil {
		return nil, b.err
	}
	b.k.scratchOff = b.alloc(0)
	b.k.ws += (b.k.scratch + 63) &^ 63
	return b.k, nil
}

// userDesc is the descriptor of value id as stored: blocked or NCHW (and
// the plain layout of tensors of other ranks).
func (c *dnnProgram) userDesc(id ValueID) (*dnnl.MemDesc, error) {
	s := c.p.Values[id].Shape
	return c.descOf(s, c.plan.blocked[id], false)
}

// primDesc is what a primitive is told about value id: its blocked format,
// or "any" (the primitive chooses; a reorder converts) for NCHW values.
func (c *dnnProgram) primDesc(id ValueID) (*dnnl.MemDesc, error) {
	return c.descOf(c.p.Values[id].Shape, c.plan.blocked[id], true)
}

func (c *dnnProgram) descOf(s []int, blocked, any bool) (*dnnl.MemDesc, error) {
	switch {
	case blocked:
		return c.lib.Desc(s, c.lib.BlockTag())
	case any:
		return c.lib.Desc(s, dnnl.TagAny)
	case len(s) == 4:
		return c.lib.Desc(s, dnnl.TagNCHW)
	case len(s) == 2:
		return c.lib.Desc(s, dnnl.TagAB)
	}
	return c.lib.Desc([]int{ops.Elems(s)}, dnnl.TagA)
}

func (c *dnnProgram) kernel(j int, in *Instr) (Kernel, error) {
	switch op := in.Op.(type) {
	case ops.Conv2d:
		x, w, y := in.In[0], in.In[1], in.Out
		ws := c.p.Values[w].Shape
		pd, err := c.convDesc(op, x, y, ws, nil)
		if err != nil {
			return nil, err
		}
		return c.twoToOne(pd, dnnArg{id: x, query: dnnl.QuerySrc, arg: dnnl.ArgSrc},
			dnnArg{weights: ws, query: dnnl.QueryWeights, arg: dnnl.ArgWeights},
			dnnArg{id: y, query: dnnl.QueryDst, arg: dnnl.ArgDst})
	case ops.Conv2dGradInput:
		w, dy, dx := in.In[0], in.In[1], in.Out
		ws := c.p.Values[w].Shape
		pd, err := c.convDesc(op.Conv, dx, dy, ws, c.lib.ConvBackwardData)
		if err != nil {
			return nil, err
		}
		return c.twoToOne(pd, dnnArg{weights: ws, query: dnnl.QueryWeights, arg: dnnl.ArgWeights},
			dnnArg{id: dy, query: dnnl.QueryDiffDst, arg: dnnl.ArgDiffDst},
			dnnArg{id: dx, query: dnnl.QueryDiffSrc, arg: dnnl.ArgDiffSrc})
	case ops.Conv2dGradFilter:
		x, dy, dw := in.In[0], in.In[1], in.Out
		ws := c.p.Values[dw].Shape
		pd, err := c.convDesc(op.Conv, x, dy, ws, c.lib.ConvBackwardWeights)
		if err != nil {
			return nil, err
		}
		return c.twoToOne(pd, dnnArg{id: x, query: dnnl.QuerySrc, arg: dnnl.ArgSrc},
			dnnArg{id: dy, query: dnnl.QueryDiffDst, arg: dnnl.ArgDiffDst},
			dnnArg{weights: ws, query: dnnl.QueryDiffWeights, arg: dnnl.ArgDiffWeights})
	case ops.BatchNormStats:
		if k := c.plan.merged[j]; k >= 0 {
			l := &bnLink{}
			c.links[k] = l
			return &recordKernel{link: l}, nil
		}
		return c.bnForward(j, in, nil)
	case ops.BatchNorm:
		return c.bnForward(j, in, c.mergedFrom(j))
	case ops.BatchNormGradSums:
		if c.plan.merged[j] >= 0 {
			return nopKernel{}, nil
		}
		return c.bnBackward(in, -1)
	case ops.BatchNormGradInput:
		first := -1
		if i := c.mergedFrom(j); i != nil {
			first = *i
		}
		return c.bnBackward(in, first)
	}
	return nil, fmt.Errorf("no oneDNN kernel for %v", in.Op)
}

// mergedFrom is the instruction whose work instruction k also does (nil:
// none).
func (c *dnnProgram) mergedFrom(k int) *int {
	for j, m := range c.plan.merged {
		if m == k {
			return &j
		}
	}
	return nil
}

// recordKernel is the first half of a merged BatchNormStats/BatchNorm pair:
// it hands the running statistics' buffers to the kernel that does the
// work.
type recordKernel struct{ link *bnLink }

func (*recordKernel) Workspace() int { return 0 }

func (k *recordKernel) Run(_ device.Stream, in []device.Buffer, _, _ device.Buffer) error {
	k.link.runMean, k.link.runVar = in[1], in[2]
	return nil
}

// nopKernel is the first half of a merged gradient pair.
type nopKernel struct{}

func (nopKernel) Workspace() int { return 0 }

func (nopKernel) Run(device.Stream, []device.Buffer, device.Buffer, device.Buffer) error { return nil }

// convDesc describes the forward convolution op of x into y with weights
// of shape ws, the formats left to oneDNN. With backward, it is instead the
// backward primitive backward makes of the same descriptors from x (the
// input or the input's gradient) to y (the output's gradient), hinted by
// the forward one.
func (c *dnnProgram) convDesc(op ops.Conv2d, x, y ValueID, ws []int,
	backward func(x, w, dy *dnnl.MemDesc, stride, pad [2]int, hint *dnnl.PrimDesc) (*dnnl.PrimDesc, error)) (*dnnl.PrimDesc, error) {
	xd, err := c.primDesc(x)
	if err != nil {
		return nil, err
	}
	yd, err := c.primDesc(y)
	if err != nil {
		return nil, err
	}
	wd, err := c.lib.Desc(ws, dnnl.TagAny)
	if err != nil {
		return nil, err
	}
	st, pad := [2]int{op.Stride, op.Stride}, [2]int{op.Pad, op.Pad}
	pd, err := c.lib.ConvForward(dnnl.PropForwardTraining, xd, wd, yd, st, pad)
	if err != nil || backward == nil {
		return pd, err
	}
	defer pd.Close()
	return backward(xd, wd, yd, st, pad, pd)
}

// plainWeights is the descriptor of weights as the parameter vector holds
// them (OIHW).
func (c *dnnProgram) plainWeights(s []int) (*dnnl.MemDesc, error) { return c.lib.Desc(s, dnnl.TagNCHW) }

// dnnArg is one argument of a convolution primitive: the program's value
// (or, for weights and their gradient, the shape of the plain OIHW
// parameter they always are), what the primitive is asked for its format,
// and oneDNN's argument index.
type dnnArg struct {
	id         ValueID
	weights    []int
	query, arg int
}

func (c *dnnProgram) argDesc(a dnnArg) (*dnnl.MemDesc, error) {
	if a.weights != nil {
		return c.plainWeights(a.weights)
	}
	return c.userDesc(a.id)
}

// twoToOne builds the kernel of pd reading the instruction's inputs 0 and
// 1 (in0, in1) and writing its output, with the conversions their formats
// need.
func (c *dnnProgram) twoToOne(pd *dnnl.PrimDesc, in0, in1, out dnnArg) (Kernel, error) {
	b := c.builder()
	args := map[int]*memRef{}
	for i, a := range []dnnArg{in0, in1} {
		u, err := c.argDesc(a)
		b.keep(err)
		args[a.arg] = b.input(i, u, pd.Query(a.query, 0))
	}
	u, err := c.argDesc(out)
	b.keep(err)
	m, post := b.output(atOut, u, pd.Query(out.query, 0))
	args[out.arg] = m
	b.exec(pd, args)
	if post != nil {
		post()
	}
	return b.finish()
}

// bnDims is B, C and H·W of a 4-D shape.
func bnDims(s []int) (B, C, HW int) { return s[0], s[1], s[2] * s[3] }

// statsFromDNN writes the stats value (mean, 1/√(var+ε) in float64, as
// ops.BatchNormStats does) from oneDNN's float32 batch mean and biased
// variance, and updates the running statistics as PyTorch does (unbiased
// variance).
func statsFromDNN(st []float64, mean, vari []float32, runMean, runVar []float32, n int, eps, m float64) {
	C := len(mean)
	for c := 0; c < C; c++ {
		mu, v := float64(mean[c]), float64(vari[c])
		st[c] = mu
		st[C+c] = 1 / math.Sqrt(v+eps)
		if runMean != nil {
			runMean[c] = float32((1-m)*float64(runMean[c]) + m*mu)
			runVar[c] = float32((1-m)*float64(runVar[c]) + m*v*float64(n)/float64(n-1))
		}
	}
}

// dnnFromStats writes the float32 mean and variance oneDNN normalises with
// (ε = 0) from a stats value: 1/√variance is the stats' 1/√(var+ε).
func dnnFromStats(st []float64, mean, vari []float32) {
	C := len(mean)
	for c := 0; c < C; c++ {
		mean[c] = float32(st[c])
		is := st[C+c]
		vari[c] = float32(1 / (is * is))
	}
}

// bnForward is BatchNorm's kernel (with BatchNormStats's work when first
// is set), or a standalone BatchNormStats (the instruction is one).
func (c *dnnProgram) bnForward(j int, in *Instr, first *int) (Kernel, error) {
	x := in.In[0]
	B, C, HW := bnDims(c.p.Values[x].Shape)
	data, err := c.userDesc(x)
	if err != nil {
		return nil, err
	}
	vec, err := c.lib.Desc([]int{C}, dnnl.TagA)
	if err != nil {
		return nil, err
	}
	b := c.builder()
	meanOff, varOff := b.alloc(4*C), b.alloc(4*C)
	args := map[int]*memRef{dnnl.ArgMean: b.mem(vec, atWS, meanOff), dnnl.ArgVariance: b.mem(vec, atWS, varOff), dnnl.ArgSrc: b.mem(data, 0, 0)}
	stOp, standaloneStats := in.Op.(ops.BatchNormStats)
	if first != nil {
		stOp = c.p.Instrs[*first].Op.(ops.BatchNormStats)
	}
	computeStats := standaloneStats || first != nil
	var flags uint32
	var pd *dnnl.PrimDesc
	if bn, ok := in.Op.(ops.BatchNorm); ok {
		flags = dnnl.BNUseScale | dnnl.BNUseShift
		if bn.ReLU {
			flags |= dnnl.BNFuseReLU
		}
		args[dnnl.ArgDst], args[dnnl.ArgScale], args[dnnl.ArgShift] = b.mem(data, atOut, 0), b.mem(vec, 1, 0), b.mem(vec, 2, 0)
	} else {
		// A standalone BatchNormStats: the normalised output is not kept.
		args[dnnl.ArgDst] = b.mem(data, atWS, b.alloc(c.lib.Size(data)))
	}
	if computeStats {
		pd, err = c.lib.BatchNormForward(dnnl.PropForwardTraining, data, float32(stOp.Eps), flags)
		if err != nil {
			return nil, err
		}
		if wd := pd.Query(dnnl.QueryWorkspace, 0); wd != nil {
			args[dnnl.ArgWorkspace] = b.mem(wd, atWS, b.alloc(c.lib.Size(wd)))
		}
	} else {
		pd, err = c.lib.BatchNormForward(dnnl.PropForwardInference, data, 0, flags|dnnl.BNUseGlobalStats)
		if err != nil {
			return nil, err
		}
		b.goStep(func(r *dnnRun) error {
			dnnFromStats(r.in[3].Float64s(), r.f32(meanOff, C), r.f32(varOff, C))
			return nil
		})
	}
	b.exec(pd, args)
	if computeStats {
		eps, mom, n := stOp.Eps, stOp.Momentum, B*HW
		link := c.links[j]
		b.goStep(func(r *dnnRun) error {
			var rm, rv []float32
			var stats []float64
			if link != nil { // merged: stats is BatchNorm's input 3
				stats, rm, rv = r.in[3].Float64s(), link.runMean.Float32s(), link.runVar.Float32s()
			} else { // standalone BatchNormStats
				stats, rm, rv = r.out.Float64s(), r.in[1].Float32s(), r.in[2].Float32s()
			}
			statsFromDNN(stats, r.f32(meanOff, C), r.f32(varOff, C), rm, rv, n, eps, mom)
			return nil
		})
	}
	return b.finish()
}

// bnBackward is BatchNormGradInput's kernel (also computing the sums when
// first ≥ 0, the merged BatchNormGradSums), or a standalone
// BatchNormGradSums.
func (c *dnnProgram) bnBackward(in *Instr, first int) (Kernel, error) {
	x := in.In[0]
	_, C, _ := bnDims(c.p.Values[x].Shape)
	data, err := c.userDesc(x)
	if err != nil {
		return nil, err
	}
	vec, err := c.lib.Desc([]int{C}, dnnl.TagA)
	if err != nil {
		return nil, err
	}
	b := c.builder()
	meanOff, varOff := b.alloc(4*C), b.alloc(4*C)
	dScaleOff, dShiftOff, shiftOff := b.alloc(4*C), b.alloc(4*C), b.alloc(4*C)
	gi, isInput := in.Op.(ops.BatchNormGradInput)
	var relu bool
	var dyAt, statsAt, yAt, gammaAt int
	if isInput { // x, γ, dy, stats, sums[, y]
		relu, dyAt, statsAt, yAt, gammaAt = gi.ReLU, 2, 3, 5, 1
	} else { // x, dy, stats[, y]
		relu, dyAt, statsAt, yAt, gammaAt = in.Op.(ops.BatchNormGradSums).ReLU, 1, 2, 3, -1
	}
	b.goStep(func(r *dnnRun) error {
		dnnFromStats(r.in[statsAt].Float64s(), r.f32(meanOff, C), r.f32(varOff, C))
		return nil
	})
	dy := b.mem(data, dyAt, 0)
	if relu {
		// dy where y > 0, else 0: in place when dx overwrites dy anyway.
		mpd, err := c.lib.ReLUBackwardFromDst(data, data)
		if err != nil {
			return nil, err
		}
		ym := b.mem(data, yAt, 0)
		var masked *memRef
		if isInput && in.InPlace == dyAt {
			masked = b.mem(data, atOut, 0)
		} else {
			masked = b.mem(data, atWS, b.alloc(c.lib.Size(data)))
		}
		b.exec(mpd, map[int]*memRef{dnnl.ArgDst: ym, dnnl.ArgDiffDst: dy, dnnl.ArgDiffSrc: masked})
		dy = masked
	}
	flags := uint32(dnnl.BNUseScale | dnnl.BNUseShift)
	hint, err := c.lib.BatchNormForward(dnnl.PropForwardTraining, data, 0, flags)
	if err != nil {
		return nil, err
	}
	defer hint.Close()
	pd, err := c.lib.BatchNormBackward(dnnl.PropBackward, data, data, 0, flags, hint)
	if err != nil {
		return nil, err
	}
	xm := b.mem(data, 0, 0)
	var gm, dx *memRef
	if isInput {
		gm, dx = b.mem(vec, gammaAt, 0), b.mem(data, atOut, 0)
	} else {
		// The sums do not depend on γ; the input gradient is not kept.
		onesOff := b.alloc(4 * C)
		b.goStep(func(r *dnnRun) error {
			for i := range r.f32(onesOff, C) {
				r.f32(onesOff, C)[i] = 1
			}
			return nil
		})
		gm, dx = b.mem(vec, atWS, onesOff), b.mem(data, atWS, b.alloc(c.lib.Size(data)))
	}
	meanM, varM := b.mem(vec, atWS, meanOff), b.mem(vec, atWS, varOff)
	dsc, dsh := b.mem(vec, atWS, dScaleOff), b.mem(vec, atWS, dShiftOff)
	// oneDNN 2.x wants the shift passed to a backward primitive that
	// computes its gradient, though it does not read it.
	sh := b.mem(vec, atWS, shiftOff)
	b.exec(pd, map[int]*memRef{dnnl.ArgSrc: xm, dnnl.ArgMean: meanM, dnnl.ArgVariance: varM, dnnl.ArgDiffDst: dy,
		dnnl.ArgScale: gm, dnnl.ArgShift: sh, dnnl.ArgDiffSrc: dx, dnnl.ArgDiffScale: dsc, dnnl.ArgDiffShift: dsh})
	if !isInput || first >= 0 {
		b.goStep(func(r *dnnRun) error {
			var sums []float64
			if isInput {
				sums = r.in[4].Float64s()
			} else {
				sums = r.out.Float64s()
			}
			for i, v := range r.f32(dShiftOff, C) {
				sums[i] = float64(v)
			}
			for i, v := range r.f32(dScaleOff, C) {
				sums[C+i] = float64(v)
			}
			return nil
		})
	}
	return b.finish()
}
