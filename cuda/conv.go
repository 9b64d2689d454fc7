package cuda

import (
	"fmt"
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
// descriptors, the algorithm (cuDNN's ranking, a deterministic one
// preferred) and its workspace. FMA math (no TF32) unless the device
// allows TF32.
func (b *Backend) conv(op ops.Kernel, shapes [][]int, out []int) (engine.Kernel, error) {
	if err := loadCUDNN(); err != nil {
		return nil, err
	}
	d := b.d
	defer d.enter()()
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
	var perf [16]algoPerf
	var got int32
	var size uint64
	alpha, beta := float32(1), float32(0)
	ap, bp := unsafe.Pointer(&alpha), unsafe.Pointer(&beta)
	var run func(s *Stream, h uintptr, in []device.Buffer, out, ws device.Buffer) int32
	switch op.(type) {
	case ops.Conv2d:
		if err := cudnnError("cudnnGetConvolutionForwardAlgorithm_v7", cudnn.fwdAlgo(h, cd.x, cd.w, cd.conv, cd.y, int32(len(perf)), &got, unsafe.Pointer(&perf[0]))); err != nil {
			return nil, err
		}
		algo, ok := pickAlgo(perf[:], got)
		if !ok {
			return nil, fmt.Errorf("cuda: cuDNN has no forward algorithm for %v on %v", c, xs)
		}
		cd.algo = algo
		if err := cudnnError("cudnnGetConvolutionForwardWorkspaceSize", cudnn.fwdWorkspace(h, cd.x, cd.w, cd.conv, cd.y, algo, &size)); err != nil {
			return nil, err
		}
		run = func(s *Stream, h uintptr, in []device.Buffer, out, ws device.Buffer) int32 {
			return cudnn.forward(h, ap, cd.x, in[0].Addr(), cd.w, in[1].Addr(), cd.conv, cd.algo, ws.Addr(), uint64(ws.Bytes()), bp, cd.y, out.Addr())
		}
	case ops.Conv2dGradInput:
		if err := cudnnError("cudnnGetConvolutionBackwardDataAlgorithm_v7", cudnn.bwdDataAlgo(h, cd.w, cd.y, cd.conv, cd.x, int32(len(perf)), &got, unsafe.Pointer(&perf[0]))); err != nil {
			return nil, err
		}
		algo, ok := pickAlgo(perf[:], got)
		if !ok {
			return nil, fmt.Errorf("cuda: cuDNN has no backward-data algorithm for %v on %v", c, xs)
		}
		cd.algo = algo
		if err := cudnnError("cudnnGetConvolutionBackwardDataWorkspaceSize", cudnn.bwdDataWorkspace(h, cd.w, cd.y, cd.conv, cd.x, algo, &size)); err != nil {
			return nil, err
		}
		run = func(s *Stream, h uintptr, in []device.Buffer, out, ws device.Buffer) int32 {
			return cudnn.backwardData(h, ap, cd.w, in[0].Addr(), cd.y, in[1].Addr(), cd.conv, cd.algo, ws.Addr(), uint64(ws.Bytes()), bp, cd.x, out.Addr())
		}
	case ops.Conv2dGradFilter:
		if err := cudnnError("cudnnGetConvolutionBackwardFilterAlgorithm_v7", cudnn.bwdFilterAlgo(h, cd.x, cd.y, cd.conv, cd.w, int32(len(perf)), &got, unsafe.Pointer(&perf[0]))); err != nil {
			return nil, err
		}
		algo, ok := pickAlgo(perf[:], got)
		if !ok {
			return nil, fmt.Errorf("cuda: cuDNN has no backward-filter algorithm for %v on %v", c, xs)
		}
		cd.algo = algo
		if err := cudnnError("cudnnGetConvolutionBackwardFilterWorkspaceSize", cudnn.bwdFilterWorkspace(h, cd.x, cd.y, cd.conv, cd.w, algo, &size)); err != nil {
			return nil, err
		}
		run = func(s *Stream, h uintptr, in []device.Buffer, out, ws device.Buffer) int32 {
			return cudnn.backwardFilter(h, ap, cd.x, in[0].Addr(), cd.y, in[1].Addr(), cd.conv, cd.algo, ws.Addr(), uint64(ws.Bytes()), bp, cd.w, out.Addr())
		}
	}
	name := fmt.Sprint(op)
	return &gpuKernel{ws: int((size + 3) / 4 * 4), run: func(s *Stream, in []device.Buffer, out, ws device.Buffer) error {
		defer s.d.enter()()
		h, err := s.dnnHandle()
		if err != nil {
			return err
		}
		return cudnnError(name, run(s, h, in, out, ws))
	}}, nil
}
