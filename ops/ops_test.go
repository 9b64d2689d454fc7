package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func TestMain(m *testing.M) {
	if _, err := ConfigureBLAS(BLASGonum, 0); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

func rnd(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func close64(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Abs(float64(got[i])-want[i]) > tol*math.Max(1, math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

func run(t *testing.T, k Kernel, in []Arg, out Arg) Arg {
	t.Helper()
	shapes := make([][]int, len(in))
	for i, a := range in {
		shapes[i] = a.Shape
	}
	if err := k.CPU(in, out, make([]float32, WorkspaceOf(k, shapes))); err != nil {
		t.Fatal(err)
	}
	return out
}

func f32(x []float32, shape ...int) Arg { return Arg{F32: x, Shape: shape} }

// TestConvMatchesDefinition checks the convolution and both gradients
// against the definition (cross-correlation with zero padding) in float64,
// for awkward sizes, and through Gorgonia's tape machine (the ops' Do).
func TestConvMatchesDefinition(t *testing.T) {
	for _, c := range []struct{ b, ci, hw, co, k, s, p int }{
		{1, 1, 1, 1, 1, 1, 0}, {2, 2, 1, 3, 3, 1, 1}, {3, 2, 5, 4, 3, 2, 1}, {2, 3, 4, 2, 1, 2, 0},
		{5, 1, 7, 2, 3, 1, 1}, {2, 4, 8, 5, 3, 1, 0}, {1, 2, 6, 3, 5, 3, 2},
	} {
		r := rand.New(rand.NewPCG(uint64(c.b*100+c.hw), uint64(c.k)))
		op := Conv2d{K: c.k, Stride: c.s, Pad: c.p}
		x, w := rnd(r, c.b*c.ci*c.hw*c.hw), rnd(r, c.co*c.ci*c.k*c.k)
		ho := op.outSize(c.hw)
		rr := rnd(r, c.b*c.co*ho*ho) // the loss is Σ rr⊙y
		y := make([]float64, len(rr))
		dx, dw := make([]float64, len(x)), make([]float64, len(w))
		for b := 0; b < c.b; b++ {
			for o := 0; o < c.co; o++ {
				for oy := 0; oy < ho; oy++ {
					for ox := 0; ox < ho; ox++ {
						yi := ((b*c.co+o)*ho+oy)*ho + ox
						for ci := 0; ci < c.ci; ci++ {
							for ky := 0; ky < c.k; ky++ {
								for kx := 0; kx < c.k; kx++ {
									iy, ix := oy*c.s-c.p+ky, ox*c.s-c.p+kx
									if iy < 0 || ix < 0 || iy >= c.hw || ix >= c.hw {
										continue
									}
									wi := ((o*c.ci+ci)*c.k+ky)*c.k + kx
									xi := ((b*c.ci+ci)*c.hw+iy)*c.hw + ix
									y[yi] += float64(x[xi]) * float64(w[wi])
									dw[wi] += float64(rr[yi]) * float64(x[xi])
									dx[xi] += float64(rr[yi]) * float64(w[wi])
								}
							}
						}
					}
				}
			}
		}
		xs, ws, ys := []int{c.b, c.ci, c.hw, c.hw}, []int{c.co, c.ci, c.k, c.k}, []int{c.b, c.co, ho, ho}
		got := run(t, op, []Arg{f32(x, xs...), f32(w, ws...)}, f32(make([]float32, len(y)), ys...))
		close64(t, "y", got.F32, y, 1e-4)
		gi := run(t, Conv2dGradInput{Conv: op, X: [4]int(xs)}, []Arg{f32(w, ws...), f32(rr, ys...)}, f32(make([]float32, len(x)), xs...))
		close64(t, "dx", gi.F32, dx, 1e-4)
		gf := run(t, Conv2dGradFilter{Conv: op, W: [4]int(ws)}, []Arg{f32(x, xs...), f32(rr, ys...)}, f32(make([]float32, len(w)), ws...))
		close64(t, "dw", gf.F32, dw, 1e-4)

		// The same through Gorgonia: graph, symbolic gradient, tape machine.
		g := G.NewGraph()
		xn := G.NodeFromAny(g, tensor.New(tensor.WithShape(xs...), tensor.WithBacking(x)), G.WithName("x"))
		wn := G.NodeFromAny(g, tensor.New(tensor.WithShape(ws...), tensor.WithBacking(w)), G.WithName("w"))
		yn, err := Conv(xn, wn, c.s, c.p)
		if err != nil {
			t.Fatal(err)
		}
		rn := G.NodeFromAny(g, tensor.New(tensor.WithShape(ys...), tensor.WithBacking(rr)), G.WithName("r"))
		grads, err := G.Grad(G.Must(G.Sum(G.Must(G.HadamardProd(yn, rn)))), xn, wn)
		if err != nil {
			t.Fatal(err)
		}
		vm := G.NewTapeMachine(g)
		if err := vm.RunAll(); err != nil {
			t.Fatal(err)
		}
		close64(t, "tape dx", grads[0].Value().Data().([]float32), dx, 1e-4)
		close64(t, "tape dw", grads[1].Value().Data().([]float32), dw, 1e-4)
		vm.Close()
	}
}

// TestBatchNormMatchesDefinition checks the BatchNorm family against the
// definitions in float64: forward (batch statistics, biased variance),
// running statistics (unbiased variance), and the gradient of Σ r⊙y with
// respect to x, γ and β, with and without the fused ReLU.
func TestBatchNormMatchesDefinition(t *testing.T) {
	for _, relu := range []bool{false, true} {
		for _, dims := range [][3]int{{1, 1, 2}, {2, 3, 5}, {4, 2, 1}, {3, 5, 7}} {
			B, C, HW := dims[0], dims[1], dims[2]
			r := rand.New(rand.NewPCG(uint64(B*C*HW), 5))
			x, gamma, beta, rr := rnd(r, B*C*HW), rnd(r, C), rnd(r, C), rnd(r, B*C*HW)
			rm, rv := rnd(r, C), make([]float32, C)
			for i := range rv {
				rv[i] = 1 + float32(i)
			}
			rm0, rv0 := append([]float32(nil), rm...), append([]float32(nil), rv...)
			const eps, mom = 1e-3, 0.2
			xs := []int{B, C, HW}
			stats := run(t, BatchNormStats{Eps: eps, Momentum: mom}, []Arg{f32(x, xs...), f32(rm, C), f32(rv, C)}, Arg{F64: make([]float64, 2*C), Shape: []int{2, C}})
			y := run(t, BatchNorm{ReLU: relu, Training: true}, []Arg{f32(x, xs...), f32(gamma, C), f32(beta, C), stats}, f32(make([]float32, len(x)), xs...))
			in := []Arg{f32(x, xs...), f32(rr, xs...), stats}
			if relu {
				in = append(in, y)
			}
			sums := run(t, BatchNormGradSums{ReLU: relu}, in, Arg{F64: make([]float64, 2*C), Shape: []int{2, C}})
			gin := []Arg{f32(x, xs...), f32(gamma, C), f32(rr, xs...), stats, sums}
			if relu {
				gin = append(gin, y)
			}
			dx := run(t, BatchNormGradInput{ReLU: relu}, gin, f32(make([]float32, len(x)), xs...))
			dg := run(t, BatchNormGradParam{Which: 1}, []Arg{sums}, f32(make([]float32, C), C))
			db := run(t, BatchNormGradParam{Which: 0}, []Arg{sums}, f32(make([]float32, C), C))

			n := float64(B * HW)
			wantY, wantDx := make([]float64, len(x)), make([]float64, len(x))
			wantDg, wantDb := make([]float64, C), make([]float64, C)
			for c := 0; c < C; c++ {
				var mean, v float64
				for b := 0; b < B; b++ {
					for i := 0; i < HW; i++ {
						mean += float64(x[(b*C+c)*HW+i])
					}
				}
				mean /= n
				for b := 0; b < B; b++ {
					for i := 0; i < HW; i++ {
						d := float64(x[(b*C+c)*HW+i]) - mean
						v += d * d
					}
				}
				inv := 1 / math.Sqrt(v/n+eps)
				if math.Abs(stats.F64[c]-mean) > 1e-12 || math.Abs(stats.F64[C+c]-inv) > 1e-9*inv {
					t.Fatalf("stats of channel %d: %v %v, want %v %v", c, stats.F64[c], stats.F64[C+c], mean, inv)
				}
				wantRm := (1-mom)*float64(rm0[c]) + mom*mean
				wantRv := (1-mom)*float64(rv0[c]) + mom*v/(n-1)
				if math.Abs(float64(rm[c])-wantRm) > 1e-6 || math.Abs(float64(rv[c])-wantRv) > 1e-5*wantRv {
					t.Fatalf("running stats of channel %d: %v %v, want %v %v", c, rm[c], rv[c], wantRm, wantRv)
				}
				// dL/dŷ = r (masked by the ReLU), then the BatchNorm backward.
				var sg, sgx float64
				g := make([]float64, B*HW)
				for b := 0; b < B; b++ {
					for i := 0; i < HW; i++ {
						o := (b*C+c)*HW + i
						xh := (float64(x[o]) - mean) * inv
						pre := float64(gamma[c])*xh + float64(beta[c])
						wantY[o] = pre
						gg := float64(rr[o])
						if relu && pre <= 0 {
							wantY[o], gg = 0, 0
						}
						g[b*HW+i] = gg
						sg += gg
						sgx += gg * xh
					}
				}
				wantDg[c], wantDb[c] = sgx, sg
				for b := 0; b < B; b++ {
					for i := 0; i < HW; i++ {
						o := (b*C+c)*HW + i
						xh := (float64(x[o]) - mean) * inv
						wantDx[o] = float64(gamma[c]) * inv * (g[b*HW+i] - sg/n - xh*sgx/n)
					}
				}
			}
			close64(t, "y", y.F32, wantY, 1e-4)
			close64(t, "dγ", dg.F32, wantDg, 1e-4)
			close64(t, "dβ", db.F32, wantDb, 1e-4)
			close64(t, "dx", dx.F32, wantDx, 1e-3)
		}
	}
}

// TestCrossEntropyMatchesDefinition compares the loss and its gradient
// with −Σⱼ qⱼ·log softmax(z)ⱼ for the target distribution
// q = (1 − ε)·onehot(y) + ε/C, computed plainly in float64.
func TestCrossEntropyMatchesDefinition(t *testing.T) {
	for _, eps := range []float32{0, 0.1, 0.7} {
		for _, d := range [][2]int{{1, 1}, {1, 5}, {4, 3}, {7, 100}} {
			N, C := d[0], d[1]
			r := rand.New(rand.NewPCG(uint64(N), uint64(C)))
			z := rnd(r, N*C)
			y := make([]int64, N)
			for i := range y {
				y[i] = int64(r.IntN(C))
			}
			lse := run(t, LogSumExp{}, []Arg{f32(z, N, C)}, Arg{F64: make([]float64, N), Shape: []int{N}})
			loss := run(t, SoftmaxCrossEntropy{Smoothing: eps}, []Arg{f32(z, N, C), {I64: y, Shape: []int{N}}, lse}, f32(make([]float32, 1)))
			grad := run(t, SoftmaxCrossEntropyGrad{Smoothing: eps}, []Arg{f32(z, N, C), {I64: y, Shape: []int{N}}, lse, f32([]float32{2})}, f32(make([]float32, N*C), N, C))
			var want float64
			wantG := make([]float64, N*C)
			for i := 0; i < N; i++ {
				var s float64
				for j := 0; j < C; j++ {
					s += math.Exp(float64(z[i*C+j]))
				}
				for j := 0; j < C; j++ {
					q := float64(eps) / float64(C)
					if j == int(y[i]) {
						q += 1 - float64(eps)
					}
					p := math.Exp(float64(z[i*C+j])) / s
					want -= q * math.Log(p)
					wantG[i*C+j] = 2 * (p - q) / float64(N)
				}
			}
			name := fmt.Sprintf("ε=%v N=%d C=%d", eps, N, C)
			close64(t, name+" loss", loss.F32, []float64{want / float64(N)}, 1e-6)
			close64(t, name+" grad", grad.F32, wantG, 1e-6)
		}
	}
	err := SoftmaxCrossEntropy{}.CPU([]Arg{f32([]float32{1, 2}, 1, 2), {I64: []int64{2}, Shape: []int{1}}, {F64: []float64{0}, Shape: []int{1}}}, f32(make([]float32, 1)), nil)
	if err == nil || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("target out of range: %v", err)
	}
}

func TestMatMulT(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, d := range [][3]int{{1, 1, 1}, {3, 4, 5}, {7, 2, 9}} {
		n, k, m := d[0], d[1], d[2]
		x, w, dy := rnd(r, n*k), rnd(r, m*k), rnd(r, n*m)
		y := run(t, MatMulT{}, []Arg{f32(x, n, k), f32(w, m, k)}, f32(make([]float32, n*m), n, m))
		dx := run(t, MatMulTGrad{Which: 0}, []Arg{f32(w, m, k), f32(dy, n, m)}, f32(make([]float32, n*k), n, k))
		dw := run(t, MatMulTGrad{Which: 1}, []Arg{f32(x, n, k), f32(dy, n, m)}, f32(make([]float32, m*k), m, k))
		wy, wdx, wdw := make([]float64, n*m), make([]float64, n*k), make([]float64, m*k)
		for i := 0; i < n; i++ {
			for j := 0; j < m; j++ {
				for l := 0; l < k; l++ {
					wy[i*m+j] += float64(x[i*k+l]) * float64(w[j*k+l])
					wdx[i*k+l] += float64(dy[i*m+j]) * float64(w[j*k+l])
					wdw[j*k+l] += float64(dy[i*m+j]) * float64(x[i*k+l])
				}
			}
		}
		close64(t, "y", y.F32, wy, 1e-5)
		close64(t, "dx", dx.F32, wdx, 1e-5)
		close64(t, "dw", dw.F32, wdw, 1e-5)
	}
}

// TestLayoutOps checks the normalised Gorgonia ops against plain loops.
func TestLayoutOps(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	x := rnd(r, 2*3*4) // [2 3 4]
	at := func(a, b, c int) float32 { return x[(a*3+b)*4+c] }

	s := run(t, Slice{Axis: 1, Start: 1, End: 3}, []Arg{f32(x, 2, 3, 4)}, f32(make([]float32, 16), 2, 2, 4))
	si := run(t, SliceIncr{Axis: 1, Start: 1, End: 3}, []Arg{s}, f32(make([]float32, 24), 2, 3, 4))
	cat := run(t, Concat{Axis: 1}, []Arg{f32(x, 2, 3, 4), s}, f32(make([]float32, 40), 2, 5, 4))
	bc := run(t, Broadcast{Axis: 1}, []Arg{f32(x[:8], 2, 1, 4)}, f32(make([]float32, 24), 2, 3, 4))
	for a := 0; a < 2; a++ {
		for b := 0; b < 5; b++ {
			for c := 0; c < 4; c++ {
				if b < 2 && s.F32[(a*2+b)*4+c] != at(a, b+1, c) {
					t.Fatalf("Slice[%d %d %d]", a, b, c)
				}
				if b < 3 {
					want := float32(0)
					if b >= 1 {
						want = at(a, b, c)
					}
					if si.F32[(a*3+b)*4+c] != want {
						t.Fatalf("SliceIncr[%d %d %d]", a, b, c)
					}
					if bc.F32[(a*3+b)*4+c] != x[a*4+c] {
						t.Fatalf("Broadcast[%d %d %d]", a, b, c)
					}
				}
				want := float32(0)
				if b < 3 {
					want = at(a, b, c)
				} else {
					want = at(a, b-2, c)
				}
				if cat.F32[(a*5+b)*4+c] != want {
					t.Fatalf("Concat[%d %d %d]", a, b, c)
				}
			}
		}
	}
	// Sums in the orders of Gorgonia's tensor engine.
	m := rnd(r, 5*3)
	all := run(t, Sum{Axes: []int{0, 1}}, []Arg{f32(m, 5, 3)}, f32(make([]float32, 1)))
	var seq float32
	for _, v := range m {
		seq += v
	}
	if all.F32[0] != seq {
		t.Fatalf("Sum all = %v, sequential %v", all.F32[0], seq)
	}
	first := run(t, Sum{Axes: []int{0}}, []Arg{f32(m, 5, 3)}, f32(make([]float32, 3), 3))
	last := run(t, Sum{Axes: []int{1}}, []Arg{f32(m, 5, 3)}, f32(make([]float32, 5), 5))
	for j := 0; j < 3; j++ {
		s := m[j]
		for i := 1; i < 5; i++ {
			s += m[i*3+j]
		}
		if first.F32[j] != s {
			t.Fatalf("Sum first axis [%d] = %v, want %v", j, first.F32[j], s)
		}
	}
	for i := 0; i < 5; i++ {
		var s float32
		for j := 0; j < 3; j++ {
			s += m[i*3+j]
		}
		if last.F32[i] != s {
			t.Fatalf("Sum last axis [%d] = %v, want %v", i, last.F32[i], s)
		}
	}
	if err := (Sum{Axes: []int{1}}).Check([]int{2, 3, 4}); err == nil {
		t.Fatal("a middle axis was accepted")
	}
	// Gather and its gradient, repeated indices included.
	tab := rnd(r, 4*3)
	idx := []int64{2, 0, 2, 3, 2}
	gth := run(t, Gather{}, []Arg{f32(tab, 4, 3), {I64: idx, Shape: []int{5}}}, f32(make([]float32, 15), 5, 3))
	g := rnd(r, 15)
	gg := run(t, GatherGrad{}, []Arg{f32(g, 5, 3), {I64: idx, Shape: []int{5}}}, f32(make([]float32, 12), 4, 3))
	want := make([]float32, 12)
	for i, ix := range idx {
		for j := 0; j < 3; j++ {
			if gth.F32[i*3+j] != tab[int(ix)*3+j] {
				t.Fatalf("Gather[%d %d]", i, j)
			}
			want[int(ix)*3+j] += g[i*3+j]
		}
	}
	for i := range want {
		if gg.F32[i] != want[i] {
			t.Fatalf("GatherGrad[%d] = %v, want %v", i, gg.F32[i], want[i])
		}
	}
	if err := (Gather{}).CPU([]Arg{f32(tab, 4, 3), {I64: []int64{4}, Shape: []int{1}}}, f32(make([]float32, 3), 1, 3), nil); err == nil {
		t.Fatal("an index out of range was accepted")
	}
}

func TestElementwise(t *testing.T) {
	a := []float32{-2, -0.5, 0, 0.5, 3, 20}
	b := []float32{1, -1, 2, 0.5, -3, 1}
	for _, op := range []BinOp{Add, Sub, Mul, Div, GreaterEq, Greater} {
		y := run(t, Binary{Op: op}, []Arg{f32(a, 6), f32(b, 6)}, f32(make([]float32, 6), 6))
		ys := run(t, Binary{Op: op, ScalarA: true}, []Arg{f32(a[4:5]), f32(b, 6)}, f32(make([]float32, 6), 6))
		for i := range a {
			if y.F32[i] != op.Apply(a[i], b[i]) || ys.F32[i] != op.Apply(a[4], b[i]) {
				t.Fatalf("%v[%d]", op, i)
			}
		}
	}
	for _, fn := range []UnaryFn{Neg, Sigmoid, Tanh, Softplus} {
		y := run(t, Unary{Fn: fn}, []Arg{f32(a, 6)}, f32(make([]float32, 6), 6))
		for i, v := range a {
			var want float64
			switch fn {
			case Neg:
				want = -float64(v)
			case Sigmoid:
				want = 1 / (1 + math.Exp(-float64(v)))
			case Tanh:
				want = math.Tanh(float64(v))
			case Softplus:
				want = math.Log1p(math.Exp(float64(v)))
			}
			if math.Abs(float64(y.F32[i])-want) > 1e-6*math.Max(1, math.Abs(want)) {
				t.Fatalf("%v(%v) = %v, want %v", fn, v, y.F32[i], want)
			}
		}
	}
}
