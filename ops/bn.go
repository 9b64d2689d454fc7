package ops

import (
	"fmt"
	"math"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Spatial batch normalisation of x [B C H W] with per-channel γ and β,
// optionally followed by ReLU, as a family of ops whose values are all
// nodes of the graph:
//
//	stats = BatchNormStats(x, runMean, runVar)   training: batch statistics, running statistics updated
//	stats = BatchNormRunningStats(runMean, runVar) evaluation: the running statistics
//	y     = BatchNorm(x, γ, β, stats)
//
// stats is a float64 [2 C] value: the mean of each channel, then 1/√(var+ε).
// The gradient of BatchNorm (training mode) is
//
//	sums = BatchNormGradSums(x, dy, stats[, y])  float64 [2 C]: Σdy, Σdy·x̂ per channel
//	dx   = BatchNormGradInput(x, γ, dy, stats, sums[, y])
//	dβ   = BatchNormGradParam{Which: 0}(sums),  dγ = BatchNormGradParam{Which: 1}(sums)
//
// with x̂ = (x − mean)·invstd and, when ReLU is fused, dy counted only where
// y > 0. Training mode normalises with the batch statistics (biased
// variance) and updates running = (1−m)·running + m·batch (unbiased
// variance), as PyTorch's BatchNorm2d does. Gorgonia's BatchNorm applies γ
// and β with broadcasting ops that copy them and their inputs; these ops do
// each step in one parallel pass over channels.

// BatchNormStats computes a training batch's statistics (inputs x, runMean,
// runVar) and updates the running statistics in place (Mutates).
type BatchNormStats struct {
	Eps, Momentum float64
}

// BatchNormRunningStats turns the running statistics (inputs runMean,
// runVar) into the stats value BatchNorm reads (evaluation mode).
type BatchNormRunningStats struct {
	Eps float64
}

// BatchNorm normalises x with stats and applies γ and β (and ReLU); inputs
// x, γ, β, stats. Training tells whether stats are batch statistics
// (training mode, differentiable) or running statistics.
type BatchNorm struct {
	ReLU, Training bool
}

// BatchNormGradSums computes the per-channel sums of BatchNorm's gradient;
// inputs x, dy, stats and, with ReLU, the forward output y.
type BatchNormGradSums struct {
	ReLU bool
}

// BatchNormGradInput is BatchNorm's gradient with respect to x; inputs x,
// γ, dy, stats, sums and, with ReLU, y.
type BatchNormGradInput struct {
	ReLU bool
}

// BatchNormGradParam is BatchNorm's gradient with respect to β (Which 0)
// or γ (Which 1): the sums rounded to float32.
type BatchNormGradParam struct {
	Which int
}

// BatchNormConfig configures one BatchNorm layer.
type BatchNormConfig struct {
	Eps, Momentum float64
	// ReLU applies ReLU to the output (a BatchNorm followed by ReLU, fused).
	ReLU bool
	// Training uses (and updates) batch statistics; otherwise the running
	// statistics are used as they are.
	Training bool
}

// BatchNormalize applies batch normalisation to x [B C H W] with γ and β
// ([C] parameter nodes) and the running statistics runMean, runVar ([C]
// nodes bound to the model's buffers).
func BatchNormalize(x, gamma, beta, runMean, runVar *G.Node, c BatchNormConfig) (*G.Node, error) {
	xs := x.Shape()
	if len(xs) != 4 {
		return nil, fmt.Errorf("ops: BatchNorm of shape %v, want [B C H W]", xs)
	}
	ch := xs[1]
	for _, n := range []*G.Node{gamma, beta, runMean, runVar} {
		if n.Shape().TotalSize() != ch {
			return nil, fmt.Errorf("ops: BatchNorm over %d channels got %s of shape %v", ch, n.Name(), n.Shape())
		}
	}
	var stats *G.Node
	var err error
	if c.Training {
		stats, err = applyDiff(BatchNormStats{Eps: c.Eps, Momentum: c.Momentum}, x, runMean, runVar)
	} else {
		stats, err = applyDiff(BatchNormRunningStats{Eps: c.Eps}, runMean, runVar)
	}
	if err != nil {
		return nil, err
	}
	return applyDiff(BatchNorm{ReLU: c.ReLU, Training: c.Training}, x, gamma, beta, stats)
}

func statsType() hm.Type { return typedTensor(2, tensor.Float64) }

// bnDims returns B, C and H·W of an NCHW shape.
func bnDims(s []int) (B, C, HW int) {
	B, C = s[0], s[1]
	HW = 1
	for _, d := range s[2:] {
		HW *= d
	}
	return
}

// Type implements descriptor.
func (BatchNormStats) Type() hm.Type {
	return hm.NewFnType(tensorType(4), tensorType(1), tensorType(1), statsType())
}

// shape implements descriptor.
func (BatchNormStats) shape(s []tensor.Shape) (tensor.Shape, error) {
	return tensor.Shape{2, s[0][1]}, nil
}

func (op BatchNormStats) String() string {
	return fmt.Sprintf("BatchNormStats{eps=%g,m=%g}", op.Eps, op.Momentum)
}

// DiffWRT implements differentiable: statistics are not differentiated
// (BatchNorm's gradient accounts for them).
func (BatchNormStats) DiffWRT(int) []bool { return []bool{false, false, false} }

// SymDiff implements differentiable.
func (BatchNormStats) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("ops: BatchNormStats is not differentiated")
}

// Mutates implements Mutator: the running mean and variance.
func (BatchNormStats) Mutates() []int { return []int{1, 2} }

// OutType implements Typed.
func (BatchNormStats) OutType() DType { return Float64 }

// CPU implements Kernel: per channel, the mean and the biased variance in
// float64 (two passes), and the running statistics' update.
func (op BatchNormStats) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("BatchNormStats", in, 3); err != nil {
		return err
	}
	x, rm, rv := in[0].F32, in[1].F32, in[2].F32
	B, C, HW := bnDims(in[0].Shape)
	n := float64(B * HW)
	m := op.Momentum
	parallelFor(C, func(c int) {
		var sum float64
		for b := 0; b < B; b++ {
			for _, v := range x[(b*C+c)*HW : (b*C+c+1)*HW] {
				sum += float64(v)
			}
		}
		mean := sum / n
		var ss float64
		for b := 0; b < B; b++ {
			for _, v := range x[(b*C+c)*HW : (b*C+c+1)*HW] {
				d := float64(v) - mean
				ss += d * d
			}
		}
		out.F64[c] = mean
		out.F64[C+c] = 1 / math.Sqrt(ss/n+op.Eps)
		rm[c] = float32((1-m)*float64(rm[c]) + m*mean)
		rv[c] = float32((1-m)*float64(rv[c]) + m*ss/(n-1))
	})
	return nil
}

// Type implements descriptor.
func (BatchNormRunningStats) Type() hm.Type {
	return hm.NewFnType(tensorType(1), tensorType(1), statsType())
}

// shape implements descriptor.
func (BatchNormRunningStats) shape(s []tensor.Shape) (tensor.Shape, error) {
	return tensor.Shape{2, s[0].TotalSize()}, nil
}

func (op BatchNormRunningStats) String() string {
	return fmt.Sprintf("BatchNormRunningStats{eps=%g}", op.Eps)
}

// DiffWRT implements differentiable.
func (BatchNormRunningStats) DiffWRT(int) []bool { return []bool{false, false} }

// SymDiff implements differentiable.
func (BatchNormRunningStats) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("ops: BatchNormRunningStats is not differentiated")
}

// OutType implements Typed.
func (BatchNormRunningStats) OutType() DType { return Float64 }

// CPU implements Kernel.
func (op BatchNormRunningStats) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("BatchNormRunningStats", in, 2); err != nil {
		return err
	}
	C := len(in[0].F32)
	for c := 0; c < C; c++ {
		out.F64[c] = float64(in[0].F32[c])
		out.F64[C+c] = 1 / math.Sqrt(float64(in[1].F32[c])+op.Eps)
	}
	return nil
}

// Type implements descriptor.
func (BatchNorm) Type() hm.Type {
	return hm.NewFnType(tensorType(4), tensorType(1), tensorType(1), statsType(), tensorType(4))
}

// shape implements descriptor.
func (BatchNorm) shape(s []tensor.Shape) (tensor.Shape, error) {
	return s[0].Clone(), nil
}

func (op BatchNorm) String() string {
	return fmt.Sprintf("BatchNorm{relu=%v,train=%v}", op.ReLU, op.Training)
}

// DiffWRT implements differentiable.
func (BatchNorm) DiffWRT(int) []bool { return []bool{true, true, true, false} }

// SymDiff implements differentiable (training mode only).
func (op BatchNorm) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if !op.Training {
		return nil, fmt.Errorf("ops: BatchNorm in evaluation mode is not differentiated; build the training graph with Training set")
	}
	x, gamma, stats := inputs[0], inputs[1], inputs[3]
	sumArgs := G.Nodes{x, grad, stats}
	if op.ReLU {
		sumArgs = append(sumArgs, output)
	}
	sums, err := apply(BatchNormGradSums{ReLU: op.ReLU}, sumArgs...)
	if err != nil {
		return nil, err
	}
	dxArgs := G.Nodes{x, gamma, grad, stats, sums}
	if op.ReLU {
		dxArgs = append(dxArgs, output)
	}
	dx, err := apply(BatchNormGradInput{ReLU: op.ReLU}, dxArgs...)
	if err != nil {
		return nil, err
	}
	dgamma, err := apply(BatchNormGradParam{Which: 1}, sums)
	if err != nil {
		return nil, err
	}
	dbeta, err := apply(BatchNormGradParam{Which: 0}, sums)
	if err != nil {
		return nil, err
	}
	return G.Nodes{dx, dgamma, dbeta, nil}, nil
}

// InPlace implements InPlacer: y may overwrite x.
func (BatchNorm) InPlace() []int { return []int{0} }

// CPU implements Kernel: y = x·scale + shift per channel with
// scale = float32(γ·invstd) (in float64) and shift = β − float32(mean)·scale.
func (op BatchNorm) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("BatchNorm", in, 4); err != nil {
		return err
	}
	x, gamma, beta, st, y := in[0].F32, in[1].F32, in[2].F32, in[3].F64, out.F32
	B, C, HW := bnDims(in[0].Shape)
	parallelFor(C, func(c int) {
		scale := float32(float64(gamma[c]) * st[C+c])
		shift := beta[c] - float32(st[c])*scale
		for b := 0; b < B; b++ {
			src := x[(b*C+c)*HW : (b*C+c+1)*HW]
			dst := y[(b*C+c)*HW : (b*C+c+1)*HW]
			if op.ReLU {
				for i, v := range src {
					dst[i] = max(v*scale+shift, 0)
				}
				continue
			}
			for i, v := range src {
				dst[i] = v*scale + shift
			}
		}
	})
	return nil
}

func reluArity(relu bool, n int) int {
	if relu {
		return n + 1
	}
	return n
}

// Type implements descriptor.
func (op BatchNormGradSums) Type() hm.Type {
	ts := []hm.Type{tensorType(4), tensorType(4), statsType()}
	if op.ReLU {
		ts = append(ts, tensorType(4))
	}
	return hm.NewFnType(append(ts, statsType())...)
}

// shape implements descriptor.
func (op BatchNormGradSums) shape(s []tensor.Shape) (tensor.Shape, error) {
	return tensor.Shape{2, s[0][1]}, nil
}

func (op BatchNormGradSums) String() string {
	return fmt.Sprintf("BatchNormGradSums{relu=%v}", op.ReLU)
}

// OutType implements Typed.
func (BatchNormGradSums) OutType() DType { return Float64 }

// CPU implements Kernel: Σdy and Σdy·x̂ per channel, accumulated in float64
// in (image, position) order, with x̂ = (x − mean)·invstd in float32.
func (op BatchNormGradSums) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("BatchNormGradSums", in, reluArity(op.ReLU, 3)); err != nil {
		return err
	}
	x, dy, st := in[0].F32, in[1].F32, in[2].F64
	var y []float32
	if op.ReLU {
		y = in[3].F32
	}
	B, C, HW := bnDims(in[0].Shape)
	parallelFor(C, func(c int) {
		mean, invstd := float32(st[c]), float32(st[C+c])
		var sdy, sdyx float64
		for b := 0; b < B; b++ {
			o := (b*C + c) * HW
			xr := x[o : o+HW]
			for i, g := range dy[o : o+HW] {
				if y != nil && y[o+i] <= 0 {
					continue
				}
				sdy += float64(g)
				sdyx += float64(g) * float64((xr[i]-mean)*invstd)
			}
		}
		out.F64[c], out.F64[C+c] = sdy, sdyx
	})
	return nil
}

// Type implements descriptor.
func (op BatchNormGradInput) Type() hm.Type {
	ts := []hm.Type{tensorType(4), tensorType(1), tensorType(4), statsType(), statsType()}
	if op.ReLU {
		ts = append(ts, tensorType(4))
	}
	return hm.NewFnType(append(ts, tensorType(4))...)
}

// shape implements descriptor.
func (op BatchNormGradInput) shape(s []tensor.Shape) (tensor.Shape, error) {
	return s[0].Clone(), nil
}

func (op BatchNormGradInput) String() string {
	return fmt.Sprintf("BatchNormGradInput{relu=%v}", op.ReLU)
}

// InPlace implements InPlacer: dx may overwrite dy.
func (BatchNormGradInput) InPlace() []int { return []int{2} }

// CPU implements Kernel: dx = γ·invstd·(dy − Σdy/n − x̂·Σdy·x̂/n), the means
// rounded to float32, dy zero where the fused ReLU clipped.
func (op BatchNormGradInput) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("BatchNormGradInput", in, reluArity(op.ReLU, 5)); err != nil {
		return err
	}
	x, gamma, dy, st, sums, dx := in[0].F32, in[1].F32, in[2].F32, in[3].F64, in[4].F64, out.F32
	var y []float32
	if op.ReLU {
		y = in[5].F32
	}
	B, C, HW := bnDims(in[0].Shape)
	n := float64(B * HW)
	parallelFor(C, func(c int) {
		mean, invstd := float32(st[c]), float32(st[C+c])
		k := gamma[c] * invstd
		mdy, mdyx := float32(sums[c]/n), float32(sums[C+c]/n)
		for b := 0; b < B; b++ {
			o := (b*C + c) * HW
			xr := x[o : o+HW]
			for i, g := range dy[o : o+HW] {
				if y != nil && y[o+i] <= 0 {
					g = 0
				}
				xh := (xr[i] - mean) * invstd
				dx[o+i] = k * (g - mdy - xh*mdyx)
			}
		}
	})
	return nil
}

// Type implements descriptor.
func (BatchNormGradParam) Type() hm.Type {
	return hm.NewFnType(statsType(), typedTensor(1, tensor.Float32))
}

// shape implements descriptor.
func (BatchNormGradParam) shape(s []tensor.Shape) (tensor.Shape, error) {
	return tensor.Shape{s[0][1]}, nil
}

func (op BatchNormGradParam) String() string { return fmt.Sprintf("BatchNormGradParam{%d}", op.Which) }

// CPU implements Kernel.
func (op BatchNormGradParam) CPU(in []Arg, out Arg, _ []float32) error {
	if err := checkArgs("BatchNormGradParam", in, 1); err != nil {
		return err
	}
	C := in[0].Shape[1]
	for c := 0; c < C; c++ {
		out.F32[c] = float32(in[0].F64[op.Which*C+c])
	}
	return nil
}
