package ops

import (
	"fmt"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Conv2d is a 2-D convolution without bias: inputs x [B Ci H W] and w
// [Co Ci K K], output y [B Co Ho Wo] with Ho = (H + 2·Pad − K)/Stride + 1
// (likewise Wo), zero padding.
//
// Why not Gorgonia's Conv2d: its filter gradient is wrong in float32 on
// small inputs (for a 2×2×1×1 input and a 3×2×3×3 filter it gives 1.3158
// where the exact value is 1.3108), and its layout (im2col to NHWC patches,
// GEMM, transpose back to NCHW) spends most of a ResNet step in
// single-threaded copies. The CPU kernel unfolds all images side by side
// into one K·K·Ci × B·Ho·Wo patch matrix and computes one large product
// with the package BLAS, so that a multi-threaded BLAS uses every core.
type Conv2d struct {
	K, Stride, Pad int
}

// Conv2dGradInput is Conv2d's gradient with respect to x: inputs w and dy,
// output dx with shape X.
type Conv2dGradInput struct {
	Conv Conv2d
	X    [4]int
}

// Conv2dGradFilter is Conv2d's gradient with respect to w: inputs x and
// dy, output dw with shape W.
type Conv2dGradFilter struct {
	Conv Conv2d
	W    [4]int
}

// Conv applies a k×k convolution with the given stride and padding to x
// [B Ci H W] with filter w [Co Ci k k].
func Conv(x, w *G.Node, stride, pad int) (*G.Node, error) {
	ws, xs := w.Shape(), x.Shape()
	if len(ws) != 4 || ws[2] != ws[3] {
		return nil, fmt.Errorf("ops: conv filter %s has shape %v, want [Co Ci k k]", w.Name(), ws)
	}
	if len(xs) != 4 || xs[1] != ws[1] {
		return nil, fmt.Errorf("ops: conv input shape %v does not match filter %v", xs, ws)
	}
	op := Conv2d{K: ws[2], Stride: stride, Pad: pad}
	if stride < 1 || pad < 0 || op.outSize(xs[2]) < 1 || op.outSize(xs[3]) < 1 {
		return nil, fmt.Errorf("ops: conv of %v with a %d×%d filter, stride %d, padding %d has no output", xs, ws[2], ws[3], stride, pad)
	}
	return applyDiff(op, x, w)
}

func (op Conv2d) outSize(h int) int { return (h+2*op.Pad-op.K)/op.Stride + 1 }

// ConvGeom is the geometry of one convolution: batch, channels, spatial
// sizes, and K = Ci·k·k, the length of one patch.
type ConvGeom struct {
	B, Ci, H, W, Co, Ho, Wo, K int
}

// Geom returns the geometry for input shape x and filter shape w.
func (op Conv2d) Geom(x, w []int) ConvGeom {
	g := ConvGeom{B: x[0], Ci: x[1], H: x[2], W: x[3], Co: w[0]}
	g.Ho, g.Wo = op.outSize(g.H), op.outSize(g.W)
	g.K = g.Ci * op.K * op.K
	return g
}

// Type implements descriptor.
func (Conv2d) Type() hm.Type { return hm.NewFnType(tensorType(4), tensorType(4), tensorType(4)) }

// shape implements descriptor.
func (op Conv2d) shape(s []tensor.Shape) (tensor.Shape, error) {
	x, w := s[0], s[1]
	if len(x) != 4 || len(w) != 4 {
		return nil, fmt.Errorf("ops: Conv2d wants 4-D input and filter shapes, got %v and %v", x, w)
	}
	return tensor.Shape{x[0], w[0], op.outSize(x[2]), op.outSize(x[3])}, nil
}

func (op Conv2d) String() string {
	return fmt.Sprintf("Conv2d{k=%d,s=%d,p=%d}", op.K, op.Stride, op.Pad)
}

// DiffWRT implements differentiable.
func (Conv2d) DiffWRT(int) []bool { return []bool{true, true} }

// SymDiff implements differentiable.
func (op Conv2d) SymDiff(inputs G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	x, w := inputs[0], inputs[1]
	var xs, ws [4]int
	copy(xs[:], x.Shape())
	copy(ws[:], w.Shape())
	dx, err := apply(Conv2dGradInput{Conv: op, X: xs}, w, grad)
	if err != nil {
		return nil, err
	}
	dw, err := apply(Conv2dGradFilter{Conv: op, W: ws}, x, grad)
	if err != nil {
		return nil, err
	}
	return G.Nodes{dx, dw}, nil
}

// Workspace implements Scratcher: the patch matrix and the product before
// its permutation to NCHW, for one chunk of images (ConvGeom.Chunk).
func (op Conv2d) Workspace(in [][]int) int {
	g := op.Geom(in[0], in[1])
	return (g.K + g.Co) * g.Chunk() * g.Ho * g.Wo
}

// convWorkspaceBudget bounds the scratch of the im2col kernels (bytes).
var convWorkspaceBudget = 32 << 20

// Chunk is the number of images the im2col kernels process at once: as
// many as keep the patch matrix and the product within 32 MiB (at least
// one), so that the workspace does not grow with the batch — an evaluation
// of 250 images needs no more scratch than a training batch of 32. Chunks
// change nothing in the forward pass and the input gradient (every output
// column is its own dot products), and split the filter gradient's sum over
// the batch into one partial sum per chunk.
func (g ConvGeom) Chunk() int {
	per := 4 * (g.K + g.Co) * g.Ho * g.Wo
	return max(1, min(g.B, convWorkspaceBudget/max(per, 1)))
}

// CPU implements Kernel. The images of a chunk are unfolded side by side
// into one K×(b·N) patch matrix (in parallel), one GEMM computes
// Yᵗ = W·COL (Co×(b·N)), and a parallel permutation writes it out as NCHW.
func (op Conv2d) CPU(in []Arg, out Arg, ws []float32) error {
	if err := checkArgs("Conv2d", in, 2); err != nil {
		return err
	}
	g := op.Geom(in[0].Shape, in[1].Shape)
	x, w, y := in[0].F32, in[1].F32, out.F32
	N := g.Ho * g.Wo
	img := g.Ci * g.H * g.W
	cb := g.Chunk()
	for b0 := 0; b0 < g.B; b0 += cb {
		nb := min(cb, g.B-b0)
		BN := nb * N
		col, yt := ws[:g.K*BN], ws[g.K*BN:(g.K+g.Co)*BN]
		xc := x[b0*img:]
		parallelFor(nb, func(b int) { op.im2col(xc[b*img:(b+1)*img], g, col[b*N:], BN) })
		sgemm(false, false, g.Co, BN, g.K, 1, w, g.K, col, BN, 0, yt, BN)
		permuteOut(yt, y[b0*g.Co*N:], nb, g.Co, N)
	}
	return nil
}

// permuteOut writes Yᵗ [Co B·N] as Y [B Co N].
func permuteOut(yt, y []float32, B, Co, N int) {
	BN := B * N
	parallelFor(B, func(b int) {
		for co := 0; co < Co; co++ {
			copy(y[(b*Co+co)*N:(b*Co+co+1)*N], yt[co*BN+b*N:co*BN+(b+1)*N])
		}
	})
}

// transposeDY writes dY [B Co N] as dYᵗ [Co B·N].
func transposeDY(dy, dyt []float32, B, Co, N int) {
	BN := B * N
	parallelFor(B, func(b int) {
		for co := 0; co < Co; co++ {
			copy(dyt[co*BN+b*N:co*BN+(b+1)*N], dy[(b*Co+co)*N:(b*Co+co+1)*N])
		}
	})
}

// Type implements descriptor.
func (Conv2dGradInput) Type() hm.Type {
	return hm.NewFnType(tensorType(4), tensorType(4), tensorType(4))
}

// shape implements descriptor.
func (op Conv2dGradInput) shape([]tensor.Shape) (tensor.Shape, error) {
	return tensor.Shape(op.X[:]).Clone(), nil
}

func (op Conv2dGradInput) String() string { return "Conv2dGradInput" + op.Conv.String()[6:] }

// Workspace implements Scratcher: dYᵗ and the patch-matrix gradient of one
// chunk of images.
func (op Conv2dGradInput) Workspace(in [][]int) int {
	g := op.Conv.Geom(op.X[:], in[0])
	return (g.K + g.Co) * g.Chunk() * g.Ho * g.Wo
}

// CPU implements Kernel: dX = col2im(Wᵀ·dYᵗ), one GEMM per chunk of
// images, col2im in parallel over images.
func (op Conv2dGradInput) CPU(in []Arg, out Arg, ws []float32) error {
	if err := checkArgs("Conv2dGradInput", in, 2); err != nil {
		return err
	}
	g := op.Conv.Geom(op.X[:], in[0].Shape)
	w, dy, dx := in[0].F32, in[1].F32, out.F32
	N := g.Ho * g.Wo
	img := g.Ci * g.H * g.W
	cb := g.Chunk()
	for b0 := 0; b0 < g.B; b0 += cb {
		nb := min(cb, g.B-b0)
		BN := nb * N
		dyt, col := ws[:g.Co*BN], ws[g.Co*BN:(g.Co+g.K)*BN]
		transposeDY(dy[b0*g.Co*N:], dyt, nb, g.Co, N)
		// COL (K×BN) = Wᵀ (K×Co) · dYᵗ (Co×BN)
		sgemm(true, false, g.K, BN, g.Co, 1, w, g.K, dyt, BN, 0, col, BN)
		dxc := dx[b0*img:]
		parallelFor(nb, func(b int) { op.Conv.col2im(col[b*N:], BN, g, dxc[b*img:(b+1)*img]) })
	}
	return nil
}

// Type implements descriptor.
func (Conv2dGradFilter) Type() hm.Type {
	return hm.NewFnType(tensorType(4), tensorType(4), tensorType(4))
}

// shape implements descriptor.
func (op Conv2dGradFilter) shape([]tensor.Shape) (tensor.Shape, error) {
	return tensor.Shape(op.W[:]).Clone(), nil
}

func (op Conv2dGradFilter) String() string { return "Conv2dGradFilter" + op.Conv.String()[6:] }

// Workspace implements Scratcher: the patch matrix and dYᵗ of one chunk of
// images.
func (op Conv2dGradFilter) Workspace(in [][]int) int {
	g := op.Conv.Geom(in[0], op.W[:])
	return (g.K + g.Co) * g.Chunk() * g.Ho * g.Wo
}

// CPU implements Kernel: dW = dYᵗ·COLᵀ, one GEMM per chunk of images, each
// chunk's product added to the previous chunks'.
func (op Conv2dGradFilter) CPU(in []Arg, out Arg, ws []float32) error {
	if err := checkArgs("Conv2dGradFilter", in, 2); err != nil {
		return err
	}
	g := op.Conv.Geom(in[0].Shape, op.W[:])
	x, dy, dw := in[0].F32, in[1].F32, out.F32
	N := g.Ho * g.Wo
	img := g.Ci * g.H * g.W
	cb := g.Chunk()
	for b0 := 0; b0 < g.B; b0 += cb {
		nb := min(cb, g.B-b0)
		BN := nb * N
		col, dyt := ws[:g.K*BN], ws[g.K*BN:(g.K+g.Co)*BN]
		xc := x[b0*img:]
		parallelFor(nb, func(b int) { op.Conv.im2col(xc[b*img:(b+1)*img], g, col[b*N:], BN) })
		transposeDY(dy[b0*g.Co*N:], dyt, nb, g.Co, N)
		beta := float32(1)
		if b0 == 0 {
			beta = 0
		}
		// dW (Co×K) (+)= dYᵗ (Co×BN) · COLᵀ (BN×K)
		sgemm(false, true, g.Co, g.K, BN, 1, dyt, BN, col, BN, beta, dw, g.K)
	}
	return nil
}

// im2col writes the K×N patch matrix of one image into col, whose rows
// are ld apart: row (c, ky, kx), column (oy, ox); padded positions are 0.
func (op Conv2d) im2col(x []float32, g ConvGeom, col []float32, ld int) {
	k, s, p := op.K, op.Stride, op.Pad
	N := g.Ho * g.Wo
	for c := 0; c < g.Ci; c++ {
		xc := x[c*g.H*g.W : (c+1)*g.H*g.W]
		for ky := 0; ky < k; ky++ {
			for kx := 0; kx < k; kx++ {
				r := ((c*k+ky)*k + kx) * ld
				row := col[r : r+N]
				for oy := 0; oy < g.Ho; oy++ {
					iy := oy*s - p + ky
					dst := row[oy*g.Wo : (oy+1)*g.Wo]
					if iy < 0 || iy >= g.H {
						clear(dst)
						continue
					}
					src := xc[iy*g.W : (iy+1)*g.W]
					if s == 1 {
						// A contiguous run with zero borders: ox such that
						// 0 ≤ ox−p+kx < W.
						lo, hi := max(p-kx, 0), min(g.W+p-kx, g.Wo)
						if lo >= hi {
							clear(dst)
							continue
						}
						clear(dst[:lo])
						copy(dst[lo:hi], src[lo-p+kx:hi-p+kx])
						clear(dst[hi:])
						continue
					}
					for ox := range dst {
						ix := ox*s - p + kx
						if ix < 0 || ix >= g.W {
							dst[ox] = 0
						} else {
							dst[ox] = src[ix]
						}
					}
				}
			}
		}
	}
}

// col2im accumulates the K×N patch matrix of one image (rows ld apart)
// into its gradient dx (which it zeroes first).
func (op Conv2d) col2im(col []float32, ld int, g ConvGeom, dx []float32) {
	clear(dx)
	k, s, p := op.K, op.Stride, op.Pad
	N := g.Ho * g.Wo
	for c := 0; c < g.Ci; c++ {
		xc := dx[c*g.H*g.W : (c+1)*g.H*g.W]
		for ky := 0; ky < k; ky++ {
			for kx := 0; kx < k; kx++ {
				r := ((c*k+ky)*k + kx) * ld
				row := col[r : r+N]
				for oy := 0; oy < g.Ho; oy++ {
					iy := oy*s - p + ky
					if iy < 0 || iy >= g.H {
						continue
					}
					dst := xc[iy*g.W : (iy+1)*g.W]
					src := row[oy*g.Wo : (oy+1)*g.Wo]
					for ox, v := range src {
						ix := ox*s - p + kx
						if ix >= 0 && ix < g.W {
							dst[ix] += v
						}
					}
				}
			}
		}
	}
}
