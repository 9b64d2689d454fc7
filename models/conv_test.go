package models

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sparsegrad/sparsegrad/ops"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// refConvGrads are the gradients of Σ r⊙conv(x, w) computed from the
// definition: dW[co,ci,ky,kx] = Σ r[b,co,oy,ox]·x[b,ci,iy,ix] and
// dX[b,ci,iy,ix] = Σ r[b,co,oy,ox]·w[co,ci,ky,kx] with iy = oy·s−p+ky.
func refConvGrads(x fmap, w []float32, r []float64, co, k, s int) (dx, dw []float64) {
	p := k / 2
	oh, ow := (x.h+2*p-k)/s+1, (x.w+2*p-k)/s+1
	dx = make([]float64, len(x.d))
	dw = make([]float64, len(w))
	for b := 0; b < x.n; b++ {
		for o := 0; o < co; o++ {
			for oy := 0; oy < oh; oy++ {
				for ox := 0; ox < ow; ox++ {
					rv := r[((b*co+o)*oh+oy)*ow+ox]
					for ci := 0; ci < x.c; ci++ {
						for ky := 0; ky < k; ky++ {
							for kx := 0; kx < k; kx++ {
								iy, ix := oy*s-p+ky, ox*s-p+kx
								if iy < 0 || ix < 0 || iy >= x.h || ix >= x.w {
									continue
								}
								wi := ((o*x.c+ci)*k+ky)*k + kx
								xi := ((b*x.c+ci)*x.h+iy)*x.w + ix
								dw[wi] += rv * x.d[xi]
								dx[xi] += rv * float64(w[wi])
							}
						}
					}
				}
			}
		}
	}
	return dx, dw
}

func TestConvMatchesReference(t *testing.T) {
	cases := []struct{ b, ci, hw, co, k, s int }{
		{1, 1, 1, 1, 1, 1}, {2, 2, 1, 3, 3, 1}, {3, 2, 5, 4, 3, 2}, {2, 3, 4, 2, 1, 2},
		{5, 1, 7, 2, 3, 1}, {16, 2, 3, 1, 3, 2}, {2, 4, 8, 5, 3, 1}, {3, 2, 6, 3, 3, 2},
	}
	for _, c := range cases {
		r := rand.New(rand.NewPCG(uint64(c.b*100+c.hw), uint64(c.k)))
		x := fmap{c.b, c.ci, c.hw, c.hw, make([]float64, c.b*c.ci*c.hw*c.hw)}
		xs := make([]float32, len(x.d))
		for i := range xs {
			xs[i] = float32(r.NormFloat64())
			x.d[i] = float64(xs[i])
		}
		ws := make([]float32, c.co*c.ci*c.k*c.k)
		for i := range ws {
			ws[i] = float32(r.NormFloat64())
		}
		want := refConv(x, ws, c.co, c.k, c.s)
		rs := make([]float32, len(want.d))
		rr := make([]float64, len(rs))
		for i := range rs {
			rs[i] = float32(r.NormFloat64())
			rr[i] = float64(rs[i])
		}
		wantDx, wantDw := refConvGrads(x, ws, rr, c.co, c.k, c.s)

		g := G.NewGraph()
		xn := G.NodeFromAny(g, tensor.New(tensor.WithShape(c.b, c.ci, c.hw, c.hw), tensor.WithBacking(xs)), G.WithName("x"))
		wn := G.NodeFromAny(g, tensor.New(tensor.WithShape(c.co, c.ci, c.k, c.k), tensor.WithBacking(ws)), G.WithName("w"))
		y, err := ops.Conv(xn, wn, c.s, c.k/2)
		if err != nil {
			t.Fatal(err)
		}
		rn := G.NodeFromAny(g, tensor.New(tensor.WithShape(y.Shape()...), tensor.WithBacking(rs)), G.WithName("r"))
		loss := G.Must(G.Sum(G.Must(G.HadamardProd(y, rn))))
		grads, err := G.Grad(loss, xn, wn)
		if err != nil {
			t.Fatal(err)
		}
		vm := G.NewTapeMachine(g)
		if err := vm.RunAll(); err != nil {
			t.Fatal(err)
		}
		check := func(name string, got []float32, want []float64) {
			t.Helper()
			if len(got) != len(want) {
				t.Fatalf("%+v %s: %d values, want %d", c, name, len(got), len(want))
			}
			for i := range got {
				if math.Abs(float64(got[i])-want[i]) > 1e-4*math.Max(1, math.Abs(want[i])) {
					t.Fatalf("%+v %s[%d] = %v, want %v", c, name, i, got[i], want[i])
				}
			}
		}
		check("y", y.Value().Data().([]float32), want.d)
		check("dx", grads[0].Value().Data().([]float32), wantDx)
		check("dw", grads[1].Value().Data().([]float32), wantDw)
		vm.Close()
	}
}
