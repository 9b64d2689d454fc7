package cuda

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/ops"
)

// convDescs are the cuDNN descriptors of one convolution.
type convDescs struct {
	x, y, w, conv uintptr
	algo          int32
}

// conv prepares a convolution or one of its gradients with cuDNN: the
// descriptors, the algorithm (chooseConvAlgo) and its workspace. FMA math
// (no TF32) unless the device allows TF32.
func (b *Backend) conv(op ops.Kernel, shapes [][]int, out []int) (engine.Kernel, error) {
	if err := loadCUDNN(); err != nil {
		return nil, err
	}
	d := b.d
	unlock, err := d.enter()
	if err != nil {
		return nil, err
	}
	defer unlock()
	h, err := b.s.dnnHandle()
	if err != nil {
		return nil, err
	}
	var c ops.Conv2d
	var xs, ws, ys []int
	switch o := op.(type) {
	case ops.Conv2d:
		c, xs, ws, ys = o, shapes[0], shapes[1], out
	case ops.Conv2dGradInput:
		c, xs, ws, ys = o.Conv, o.X[:], shapes[0], shapes[1]
	case ops.Conv2dGradFilter:
		c, xs, ws, ys = o.Conv, shapes[0], o.W[:], shapes[1]
	}
	var cd convDescs
	tensor := func(s []int) (uintptr, error) {
		var t uintptr
		if err := cudnnError("cudnnCreateTensorDescriptor", cudnn.createTensor(&t)); err != nil {
			return 0, err
		}
		return t, cudnnError("cudnnSetTensor4dDescriptor", cudnn.setTensor4d(t, cudnnNCHW, cudnnFloat, int32(s[0]), int32(s[1]), int32(s[2]), int32(s[3])))
	}
	if cd.x, err = tensor(xs); err != nil {
		return nil, err
	}
	if cd.y, err = tensor(ys); err != nil {
		return nil, err
	}
	if err := cudnnError("cudnnCreateFilterDescriptor", cudnn.createFilter(&cd.w)); err != nil {
		return nil, err
	}
	if err := cudnnError("cudnnSetFilter4dDescriptor", cudnn.setFilter4d(cd.w, cudnnFloat, cudnnNCHW, int32(ws[0]), int32(ws[1]), int32(ws[2]), int32(ws[3]))); err != nil {
		return nil, err
	}
	if err := cudnnError("cudnnCreateConvolutionDescriptor", cudnn.createConv(&cd.conv)); err != nil {
		return nil, err
	}
	if err := cudnnError("cudnnSetConvolution2dDescriptor", cudnn.setConv2d(cd.conv, int32(c.Pad), int32(c.Pad), int32(c.Stride), int32(c.Stride), 1, 1, cudnnCrossCorr, cudnnFloat)); err != nil {
		return nil, err
	}
	math := int32(cudnnFMAMath)
	if d.opts.TF32 {
		math = cudnnDefaultMath
	}
	if err := cudnnError("cudnnSetConvolutionMathType", cudnn.setConvMath(cd.conv, math)); err != nil {
		return nil, err
	}
	alpha, beta := float32(1), float32(0)
	ap, bp := unsafe.Pointer(&alpha), unsafe.Pointer(&beta)
	var run func(s *Stream, h uintptr, in []device.Buffer, out, ws device.Buffer) int32
	var dir int
	var find, heur func(req int32, ret *int32, perf unsafe.Pointer) int32
	var wsSize func(algo int32, size *uint64) int32
	switch op.(type) {
	case ops.Conv2d:
		dir = 0
		find = func(req int32, ret *int32, perf unsafe.Pointer) int32 {
			return cudnn.findFwd(h, cd.x, cd.w, cd.conv, cd.y, req, ret, perf)
		}
		heur = func(req int32, ret *int32, perf unsafe.Pointer) int32 {
			return cudnn.fwdAlgo(h, cd.x, cd.w, cd.conv, cd.y, req, ret, perf)
		}
		wsSize = func(algo int32, size *uint64) int32 {
			return cudnn.fwdWorkspace(h, cd.x, cd.w, cd.conv, cd.y, algo, size)
		}
		run = func(s *Stream, h uintptr, in []device.Buffer, out, ws device.Buffer) int32 {
			return cudnn.forward(h, ap, cd.x, in[0].Addr(), cd.w, in[1].Addr(), cd.conv, cd.algo, ws.Addr(), uint64(ws.Bytes()), bp, cd.y, out.Addr())
		}
	case ops.Conv2dGradInput:
		dir = 1
		find = func(req int32, ret *int32, perf unsafe.Pointer) int32 {
			return cudnn.findBwdData(h, cd.w, cd.y, cd.conv, cd.x, req, ret, perf)
		}
		heur = func(req int32, ret *int32, perf unsafe.Pointer) int32 {
			return cudnn.bwdDataAlgo(h, cd.w, cd.y, cd.conv, cd.x, req, ret, perf)
		}
		wsSize = func(algo int32, size *uint64) int32 {
			return cudnn.bwdDataWorkspace(h, cd.w, cd.y, cd.conv, cd.x, algo, size)
		}
		run = func(s *Stream, h uintptr, in []device.Buffer, out, ws device.Buffer) int32 {
			return cudnn.backwardData(h, ap, cd.w, in[0].Addr(), cd.y, in[1].Addr(), cd.conv, cd.algo, ws.Addr(), uint64(ws.Bytes()), bp, cd.x, out.Addr())
		}
	case ops.Conv2dGradFilter:
		dir = 2
		find = func(req int32, ret *int32, perf unsafe.Pointer) int32 {
			return cudnn.findBwdFilter(h, cd.x, cd.y, cd.conv, cd.w, req, ret, perf)
		}
		heur = func(req int32, ret *int32, perf unsafe.Pointer) int32 {
			return cudnn.bwdFilterAlgo(h, cd.x, cd.y, cd.conv, cd.w, req, ret, perf)
		}
		wsSize = func(algo int32, size *uint64) int32 {
			return cudnn.bwdFilterWorkspace(h, cd.x, cd.y, cd.conv, cd.w, algo, size)
		}
		run = func(s *Stream, h uintptr, in []device.Buffer, out, ws device.Buffer) int32 {
			return cudnn.backwardFilter(h, ap, cd.x, in[0].Addr(), cd.y, in[1].Addr(), cd.conv, cd.algo, ws.Addr(), uint64(ws.Bytes()), bp, cd.w, out.Addr())
		}
	}
	b.descMu.Lock()
	b.descs = append(b.descs, cd) // the handles; Close destroys them
	b.descMu.Unlock()
	what := fmt.Sprintf("%v x%v w%v y%v", op, xs, ws, ys)
	choice, err := d.chooseConvAlgo(what, dir, find, heur)
	if err != nil {
		return nil, err
	}
	cd.algo = choice.Algo
	var size uint64
	if err := cudnnError("cudnnGetConvolutionWorkspaceSize", wsSize(cd.algo, &size)); err != nil {
		return nil, err
	}
	name := fmt.Sprint(op)
	return &gpuKernel{ws: int((size + 3) / 4 * 4), run: func(s *Stream, in []device.Buffer, out, ws device.Buffer) error {
		unlock, err := s.enter()
		if err != nil {
			return err
		}
		defer unlock()
		h, err := s.dnnHandle()
		if err != nil {
			return err
		}
		counts.launches.Add(1)
		if err := cudnnError(name, run(s, h, in, out, ws)); err != nil {
			return err
		}
		return s.checkLaunch(name)
	}}, nil
}

// chooseConvAlgo returns the algorithm of one convolution (what names it
// and its shapes; dir: 0 forward, 1 backward data, 2 backward filter), as
// PyTorch's cudnn.benchmark does: cuDNN times every algorithm on the GPU
// (find) and the fastest that fits maxConvWorkspace is kept, once per
// shape and device (the choice is cached). With Options.Deterministic
// only deterministic algorithms qualify (bit-reproducible runs). Where
// the timing call is missing or fails, cuDNN's heuristic ranking (heur)
// decides, preferring a deterministic algorithm. Every choice is recorded
// (Device.ConvChoices).
func (d *Device) chooseConvAlgo(what string, dir int, find, heur func(req int32, ret *int32, perf unsafe.Pointer) int32) (ConvChoice, error) {
	d.convMu.Lock()
	defer d.convMu.Unlock()
	if c, ok := d.convCache[what]; ok {
		return c, nil
	}
	var perf [16]algoPerf
	var got int32
	choice := ConvChoice{Op: what, Timed: true}
	p, ok := algoPerf{}, false
	if find(int32(len(perf)), &got, unsafe.Pointer(&perf[0])) == 0 {
		p, ok = pickAlgo(perf[:], got, d.opts.Deterministic)
	}
	if !ok {
		choice.Timed = false
		if err := cudnnError("cudnnGetConvolutionAlgorithm_v7 ("+what+")", heur(int32(len(perf)), &got, unsafe.Pointer(&perf[0]))); err != nil {
			return ConvChoice{}, err
		}
		if p, ok = pickAlgo(perf[:], got, true); !ok && !d.opts.Deterministic {
			p, ok = pickAlgo(perf[:], got, false)
		}
		if !ok {
			return ConvChoice{}, fmt.Errorf("cuda: cuDNN has no usable algorithm for %s (deterministic only: %v)", what, d.opts.Deterministic)
		}
	}
	choice.Algo, choice.AlgoName, choice.WorkspaceBytes = p.algo, convAlgoName(dir, p.algo), p.memory
	choice.Deterministic, choice.Candidates = p.determinism == cudnnDeterministic, int(got)
	if choice.Timed {
		choice.Ms = p.time
	}
	if d.convCache == nil {
		d.convCache = map[string]ConvChoice{}
	}
	d.convCache[what] = choice
	d.convLog = append(d.convLog, choice)
	return choice, nil
}

// ConvChoices returns the convolution algorithms chosen on the device so
// far, in the order they were first needed.
func (d *Device) ConvChoices() []ConvChoice {
	d.convMu.Lock()
	defer d.convMu.Unlock()
	return slices.Clone(d.convLog)
}
