package ops

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestConvWorkspaceBounded: the im2col kernels' scratch does not grow with
// the batch, so an evaluation of many images needs no more of it than a
// training batch (issue 26: a 250-image ResNet-18 evaluation needed 660 MB
// of im2col workspace).
func TestConvWorkspaceBounded(t *testing.T) {
	x32, x250 := []int{32, 64, 32, 32}, []int{250, 64, 32, 32}
	w := []int{64, 64, 3, 3}
	op := Conv2d{K: 3, Stride: 1, Pad: 1}
	y32, y250 := []int{32, 64, 32, 32}, []int{250, 64, 32, 32}
	for _, c := range []struct {
		name        string
		ws32, ws250 int
	}{
		{"forward", op.Workspace([][]int{x32, w}), op.Workspace([][]int{x250, w})},
		{"input gradient", Conv2dGradInput{Conv: op, X: [4]int(x32)}.Workspace([][]int{w, y32}), Conv2dGradInput{Conv: op, X: [4]int(x250)}.Workspace([][]int{w, y250})},
		{"filter gradient", Conv2dGradFilter{Conv: op, W: [4]int(w)}.Workspace([][]int{x32, y32}), Conv2dGradFilter{Conv: op, W: [4]int(w)}.Workspace([][]int{x250, y250})},
	} {
		if c.ws250 > c.ws32 || 4*c.ws250 > convWorkspaceBudget {
			t.Errorf("%s: workspace %d MiB at batch 250, %d MiB at batch 32 (budget %d MiB)", c.name, 4*c.ws250>>20, 4*c.ws32>>20, convWorkspaceBudget>>20)
		}
	}
}

// TestConvChunksMatchWholeBatch runs the convolution and its gradients with
// the batch in chunks of one and two images and as a whole: the forward
// pass and the input gradient give the same bits, the filter gradient (one
// partial sum per chunk) the same values within float32 rounding.
func TestConvChunksMatchWholeBatch(t *testing.T) {
	defer func(b int) { convWorkspaceBudget = b }(convWorkspaceBudget)
	for _, c := range []struct{ b, ci, hw, co, k, s, p int }{
		{5, 3, 7, 4, 3, 1, 1}, {3, 2, 6, 5, 3, 2, 1}, {4, 4, 5, 3, 1, 2, 0}, {1, 2, 4, 2, 3, 1, 1},
	} {
		r := rand.New(rand.NewPCG(uint64(c.b), uint64(c.hw)))
		op := Conv2d{K: c.k, Stride: c.s, Pad: c.p}
		xs, ws := []int{c.b, c.ci, c.hw, c.hw}, []int{c.co, c.ci, c.k, c.k}
		ho := op.outSize(c.hw)
		ys := []int{c.b, c.co, ho, ho}
		x, w, dy := rnd(r, c.b*c.ci*c.hw*c.hw), rnd(r, c.co*c.ci*c.k*c.k), rnd(r, c.b*c.co*ho*ho)
		g := op.Geom(xs, ws)
		type result struct{ y, dx, dw []float32 }
		runAll := func(images int) result {
			convWorkspaceBudget = 4 * (g.K + g.Co) * ho * ho * images
			if got := g.Chunk(); got != min(images, c.b) {
				t.Fatalf("chunk of %d images, want %d", got, min(images, c.b))
			}
			y := run(t, op, []Arg{f32(x, xs...), f32(w, ws...)}, f32(make([]float32, len(dy)), ys...))
			dx := run(t, Conv2dGradInput{Conv: op, X: [4]int(xs)}, []Arg{f32(w, ws...), f32(dy, ys...)}, f32(make([]float32, len(x)), xs...))
			dw := run(t, Conv2dGradFilter{Conv: op, W: [4]int(ws)}, []Arg{f32(x, xs...), f32(dy, ys...)}, f32(make([]float32, len(w)), ws...))
			return result{y.F32, dx.F32, dw.F32}
		}
		whole := runAll(c.b)
		for _, images := range []int{1, 2} {
			got := runAll(images)
			if !slices.Equal(got.y, whole.y) || !slices.Equal(got.dx, whole.dx) {
				t.Errorf("%+v in chunks of %d: forward or input gradient differs from the whole batch's", c, images)
			}
			for i := range got.dw {
				if math.Abs(float64(got.dw[i]-whole.dw[i])) > 1e-5*math.Max(1, math.Abs(float64(whole.dw[i]))) {
					t.Errorf("%+v in chunks of %d: dw[%d] = %v, whole batch %v", c, images, i, got.dw[i], whole.dw[i])
				}
			}
		}
	}
}
