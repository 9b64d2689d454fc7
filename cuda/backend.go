package cuda

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/ops"
)

// Backend runs the engine's programs on a GPU: every op of package ops as a
// kernel of the package, a cuBLAS product or a cuDNN convolution. Each
// backend has a stream of its own: workers sharing a GPU each take a
// backend, and their work may overlap.
type Backend struct {
	d *Device
	s *Stream

	descMu sync.Mutex
	descs  []convDescs // the cuDNN descriptors of the convolutions prepared
}

// Close destroys the cuDNN descriptors of the backend's convolutions and
// its stream (with the stream's library handles): the programs prepared
// through it must not run afterwards.
func (b *Backend) Close() error {
	b.descMu.Lock()
	descs := b.descs
	b.descs = nil
	b.descMu.Unlock()
	var errs []error
	if len(descs) > 0 {
		unlock, err := b.d.enter()
		if err != nil {
			return err
		}
		for _, cd := range descs {
			errs = append(errs, cudnnError("cudnnDestroyTensorDescriptor", cudnn.destroyTensor(cd.x)), cudnnError("cudnnDestroyTensorDescriptor", cudnn.destroyTensor(cd.y)),
				cudnnError("cudnnDestroyFilterDescriptor", cudnn.destroyFilter(cd.w)), cudnnError("cudnnDestroyConvolutionDescriptor", cudnn.destroyConv(cd.conv)))
		}
		unlock()
	}
	errs = append(errs, b.s.Close())
	return errors.Join(errs...)
}

var _ engine.Backend = (*Backend)(nil)

// NewBackend returns an engine backend of d with a new stream (and the
// stream's cuBLAS handle: handles are made before any graph capture, which
// must not allocate).
func NewBackend(d *Device) (*Backend, error) {
	s, err := d.newStream()
	if err != nil {
		return nil, err
	}
	unlock, err := d.enter()
	if err != nil {
		return nil, err
	}
	_, err = s.blasHandle()
	unlock()
	if err != nil {
		return nil, err
	}
	return &Backend{d: d, s: s}, nil
}

// Device implements engine.Backend.
func (b *Backend) Device() device.Device { return b.d }

// Stream implements engine.Backend.
func (b *Backend) Stream() device.Stream { return b.s }

// gpuKernel is one prepared instruction.
type gpuKernel struct {
	ws  int
	run func(s *Stream, in []device.Buffer, out, ws device.Buffer) error
}

func (k *gpuKernel) Workspace() int { return k.ws }

func (k *gpuKernel) Run(s device.Stream, in []device.Buffer, out, ws device.Buffer) error {
	cs, ok := s.(*Stream)
	if !ok {
		return fmt.Errorf("cuda: %T is not a CUDA stream", s)
	}
	return k.run(cs, in, out, ws)
}

// Kernel implements engine.Backend.
func (b *Backend) Kernel(p *engine.Program, in *engine.Instr) (engine.Kernel, error) {
	shapes := make([][]int, len(in.In))
	for i, id := range in.In {
		shapes[i] = p.Values[id].Shape
	}
	oshape := p.Values[in.Out].Shape
	n := ops.Elems(oshape)
	k := func(f func(s *Stream, in []device.Buffer, out, ws device.Buffer) error) (engine.Kernel, error) {
		return &gpuKernel{run: f}, nil
	}
	switch op := in.Op.(type) {
	case ops.Binary:
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().i32(int(op.Op)).buf(x[0]).buf(x[1]).buf(y).i64(n).flag(op.ScalarA).flag(op.ScalarB).runN(kBinary, n)
		})
	case ops.Unary:
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().i32(int(op.Fn)).buf(x[0]).buf(y).i64(n).runN(kUnary, n)
		})
	case ops.AddReLU:
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(x[1]).buf(y).i64(n).runN(kAddRelu, n)
		})
	case ops.ReLUGrad:
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(x[1]).buf(y).i64(n).runN(kReluGrad, n)
		})
	case ops.LSTMCell:
		B, H := shapes[2][0], shapes[2][1]
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(x[1]).buf(x[2]).buf(y).i64(B).i64(H).runN(kLstmCell, B*H)
		})
	case ops.LSTMCellGrad:
		B, H := shapes[1][0], shapes[1][1]
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(x[1]).buf(x[2]).buf(y).i64(B).i64(H).runN(kLstmCellGrad, B*H)
		})
	case ops.MatMul:
		a, bs := shapes[0], shapes[1]
		m, nn, kk := op.Dims(a, bs)
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.sgemm(op.TransA, op.TransB, m, nn, kk, x[0], a[1], x[1], bs[1], y, nn)
		})
	case ops.MatMulT:
		nr, kk, m := shapes[0][0], shapes[0][1], shapes[1][0]
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.sgemm(false, true, nr, m, kk, x[0], kk, x[1], kk, y, m)
		})
	case ops.MatMulTGrad:
		a, d := shapes[0], shapes[1]
		nr, m, kk := d[0], d[1], a[1]
		if op.Which == 0 { // dx [N K] = dy [N M] · w [M K]
			return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
				return s.sgemm(false, false, nr, kk, m, x[1], m, x[0], kk, y, kk)
			})
		}
		// dw [M K] = dyᵀ [M N] · x [N K]
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.sgemm(true, false, m, kk, nr, x[1], m, x[0], kk, y, kk)
		})
	case ops.Broadcast:
		outer, reps, inner := ops.SplitAxis(oshape, op.Axis)
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(y).i64(outer).i64(reps).i64(inner).runN(kBroadcast, n)
		})
	case ops.Sum:
		return b.sum(op, shapes[0])
	case ops.Slice:
		outer, axis, inner := ops.SplitAxis(shapes[0], op.Axis)
		w := (op.End - op.Start) * inner
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(y).i64(outer).i64(axis).i64(inner).i64(op.Start).i64(w).runN(kSlice, outer*w)
		})
	case ops.SliceIncr:
		outer, axis, inner := ops.SplitAxis(oshape, op.Axis)
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(y).i64(outer).i64(axis).i64(inner).i64(op.Start).i64(op.End).runN(kSliceIncr, n)
		})
	case ops.Concat:
		outer, total, inner := ops.SplitAxis(oshape, op.Axis)
		total *= inner
		ws := make([]int, len(shapes))
		for i, sh := range shapes {
			ws[i] = ops.Elems(sh) / max(outer, 1)
		}
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			off := 0
			for i, xi := range x {
				if err := s.args().buf(xi).buf(y).i64(outer).i64(ws[i]).i64(total).i64(off).runN(kConcatPart, outer*ws[i]); err != nil {
					return err
				}
				off += ws[i]
			}
			return nil
		})
	case ops.Gather:
		rows := ops.Elems(shapes[1])
		d := ops.Elems(shapes[0]) / max(shapes[0][0], 1)
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(x[1]).buf(y).i64(rows).i64(d).runN(kGather, rows*d)
		})
	case ops.GatherGrad:
		// Deterministic: the rows sorted by index, each index's rows added
		// in order (see k_gather_grad); the keys in the workspace.
		rows := ops.Elems(shapes[1])
		d := n / max(oshape[0], 1)
		np := 512 // a power of two, at least one tile of k_bitonic_tile
		for np < rows {
			np *= 2
		}
		return &gpuKernel{ws: 8 * np, run: func(s *Stream, x []device.Buffer, y, ws device.Buffer) error {
			if err := s.fill32(y, 0); err != nil {
				return err
			}
			if rows == 0 {
				return nil
			}
			key := ws.View(device.Int64, 0, np)
			if err := s.args().buf(x[1]).buf(key).i64(rows).i64(np).runN(kGgKeys, np); err != nil {
				return err
			}
			if err := s.args().buf(key).i64(0).run(kBitonicTile, np/512); err != nil {
				return err
			}
			for k := 1024; k <= np; k *= 2 {
				for j := k / 2; j >= 512; j /= 2 {
					if err := s.args().buf(key).i64(np).i64(k).i64(j).runN(kBitonicStep, np/2); err != nil {
						return err
					}
				}
				if err := s.args().buf(key).i64(k).run(kBitonicTile, np/512); err != nil {
					return err
				}
			}
			return s.args().buf(x[0]).buf(key).buf(y).i64(rows).i64(d).runN(kGatherGrad, rows*d)
		}}, nil
	case ops.Copy:
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error { return s.Copy(y, x[0]) })
	case ops.Const:
		return k(func(s *Stream, _ []device.Buffer, y, _ device.Buffer) error {
			return s.fill32(y, float32bits(op.Value))
		})
	case ops.Conv2d, ops.Conv2dGradInput, ops.Conv2dGradFilter:
		return b.conv(in.Op, shapes, oshape)
	case ops.BatchNormStats:
		B, C, HW := bnDims(shapes[0])
		P, err := b.bnParts(B, C, HW)
		if err != nil {
			return nil, err
		}
		n := float64(B * HW)
		return &gpuKernel{ws: 8 * C * P, run: func(s *Stream, x []device.Buffer, y, ws device.Buffer) error {
			part := ws.View(device.Float64, 0, C*P)
			if err := s.args().buf(x[0]).buf(device.Buffer{}).buf(part).i32(B).i32(C).i32(HW).i32(P).run(kBnPart, C*P); err != nil {
				return err
			}
			if err := s.args().buf(part).buf(y).i32(C).i32(P).f64(n).runN(kBnMean, C); err != nil {
				return err
			}
			if err := s.args().buf(x[0]).buf(y).buf(part).i32(B).i32(C).i32(HW).i32(P).run(kBnPart, C*P); err != nil {
				return err
			}
			return s.args().buf(part).buf(x[1]).buf(x[2]).buf(y).i32(C).i32(P).f64(n).f64(op.Eps).f64(op.Momentum).runN(kBnVar, C)
		}}, nil
	case ops.BatchNormRunningStats:
		C := ops.Elems(shapes[0])
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(x[1]).buf(y).i32(C).f64(op.Eps).runN(kBnRunningStats, C)
		})
	case ops.BatchNorm:
		B, C, HW := bnDims(shapes[0])
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(x[1]).buf(x[2]).buf(x[3]).buf(y).i32(B).i32(C).i32(HW).flag(op.ReLU).runN(kBnApply, n)
		})
	case ops.BatchNormGradSums:
		B, C, HW := bnDims(shapes[0])
		P, err := b.bnParts(B, C, HW)
		if err != nil {
			return nil, err
		}
		return &gpuKernel{ws: 16 * C * P, run: func(s *Stream, x []device.Buffer, y, ws device.Buffer) error {
			var relu device.Buffer
			if op.ReLU {
				relu = x[3]
			}
			part := ws.View(device.Float64, 0, 2*C*P)
			if err := s.args().buf(x[0]).buf(x[1]).buf(x[2]).buf(relu).buf(part).i32(B).i32(C).i32(HW).i32(P).flag(op.ReLU).run(kBnGradPart, C*P); err != nil {
				return err
			}
			return s.args().buf(part).buf(y).i32(C).i32(P).runN(kBnGradSums, C)
		}}, nil
	case ops.BatchNormGradInput:
		B, C, HW := bnDims(shapes[0])
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			var relu device.Buffer
			if op.ReLU {
				relu = x[5]
			}
			return s.args().buf(x[0]).buf(x[1]).buf(x[2]).buf(x[3]).buf(x[4]).buf(relu).buf(y).i32(B).i32(C).i32(HW).flag(op.ReLU).runN(kBnGradInput, n)
		})
	case ops.BatchNormGradParam:
		C := shapes[0][1]
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(y).i32(C).i32(op.Which).runN(kBnGradParam, C)
		})
	case ops.LogSumExp:
		N, C := shapes[0][0], shapes[0][1]
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(y).i32(N).i32(C).run(kLogsumexp, N)
		})
	case ops.SoftmaxCrossEntropy:
		N, C := shapes[0][0], shapes[0][1]
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(x[1]).buf(x[2]).buf(y).i32(N).i32(C).f32(op.Smoothing).run(kXentLoss, 1)
		})
	case ops.SoftmaxCrossEntropyGrad:
		N, C := shapes[0][0], shapes[0][1]
		return k(func(s *Stream, x []device.Buffer, y, _ device.Buffer) error {
			return s.args().buf(x[0]).buf(x[1]).buf(x[2]).buf(x[3]).buf(y).i32(N).i32(C).f32(op.Smoothing).runN(kXentGrad, N*C)
		})
	}
	return nil, fmt.Errorf("cuda: no GPU kernel for %v (%T)", in.Op, in.Op)
}

// bnParts is the number of blocks each channel's batch-norm sums are
// spread over: about four blocks per SM in all, each with at least 1024
// elements of its channel (ResNet-18's first layers, 64 channels of 131 K
// elements at batch 128, take 9 each on a 132-SM GPU instead of one).
func (b *Backend) bnParts(B, C, HW int) (int, error) {
	n := B * HW
	if n >= 1<<31 || B*C*HW >= 1<<40 {
		return 0, fmt.Errorf("cuda: batch norm over %d×%d×%d elements: a channel holds 2^31 or more, more than the kernels index", B, C, HW)
	}
	p := (4*b.d.sms + C - 1) / max(C, 1)
	return max(1, min(p, n/1024)), nil
}

func bnDims(s []int) (B, C, HW int) {
	B, C, HW = s[0], s[1], 1
	for _, d := range s[2:] {
		HW *= d
	}
	return
}

func float32bits(v float32) uint32 { return *(*uint32)(unsafe.Pointer(&v)) }

// sumStep is one reduction of a Sum: over the first axis of a [rows cols]
// matrix (first), else over its last.
type sumStep struct {
	first      bool
	rows, cols int
}

// length is the number of elements each of the step's sums adds.
func (st sumStep) length() int {
	if st.first {
		return st.rows
	}
	return st.cols
}

// sums is the number of sums the step makes (its output's length).
func (st sumStep) sums() int {
	if st.first {
		return st.cols
	}
	return st.rows
}

// longSum is the length from which a reduction is split in two (see
// k_sum_first_part); shorter ones add in the CPU's order.
const longSum = 1024

// sumStrides is the number of partial sums a reduction of n ≥ longSum
// elements is split into: about √n, so that both halves are short.
func sumStrides(n int) int {
	return min(1024, int(math.Ceil(math.Sqrt(float64(n)))))
}

// sum reduces along the op's axes: all axes as one sequence; otherwise one
// axis at a time (first axis: the rows added in order to row 0; last axis:
// each row's elements in order from zero), intermediate results in the
// workspace. Sequences shorter than longSum add in the CPU's order; longer
// ones in two halves of fixed strides (k_sum_first_part), the same bits
// on every run.
func (b *Backend) sum(op ops.Sum, in []int) (engine.Kernel, error) {
	if err := op.Check(in); err != nil {
		return nil, err
	}
	total := ops.Elems(in)
	all := len(op.Axes) == len(in)
	for i, a := range op.Axes {
		all = all && a == i
	}
	var steps []sumStep
	if all {
		steps = []sumStep{{false, 1, total}}
	} else {
		shape := append([]int(nil), in...)
		size := total
		for i, a := range op.Axes {
			a -= i
			if a == 0 && len(shape) > 1 {
				steps = append(steps, sumStep{true, shape[0], size / shape[0]})
			} else {
				steps = append(steps, sumStep{false, size / shape[a], shape[a]})
			}
			size /= shape[a]
			shape = append(shape[:a], shape[a+1:]...)
		}
	}
	if len(steps) > 2 {
		return nil, fmt.Errorf("cuda: Sum of %v along %v needs more than two reductions; not supported on the GPU", in, op.Axes)
	}
	inter, parts := 0, 0 // workspace elements: intermediate result, partial sums
	if len(steps) > 1 {
		inter = total
	}
	for _, st := range steps {
		if n := st.length(); n >= longSum {
			parts = max(parts, sumStrides(n)*st.sums())
		}
	}
	return &gpuKernel{ws: 4 * (inter + parts), run: func(s *Stream, x []device.Buffer, y, w device.Buffer) error {
		src := x[0]
		for i, st := range steps {
			dst := y
			if i < len(steps)-1 {
				dst = w.Slice(0, st.sums())
			}
			rows, cols := st.rows, st.cols
			if n := st.length(); n >= longSum {
				P := sumStrides(n)
				part := w.Slice(inter, inter+P*st.sums())
				var err error
				if st.first {
					err = s.args().buf(src).buf(part).i64(rows).i64(cols).i64(P).runN(kSumFirstPart, P*cols)
					rows = P
				} else {
					err = s.args().buf(src).buf(part).i64(rows).i64(cols).i64(P).runN(kSumLastPart, rows*P)
					cols = P
				}
				if err != nil {
					return err
				}
				src = part
			}
			var err error
			if st.first {
				err = s.args().buf(src).buf(dst).i64(rows).i64(cols).runN(kSumFirst, cols)
			} else {
				err = s.args().buf(src).buf(dst).i64(rows).i64(cols).runN(kSumLast, rows)
			}
			if err != nil {
				return err
			}
			src = dst
		}
		return nil
	}}, nil
}
