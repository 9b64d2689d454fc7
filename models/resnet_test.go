package models

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// fmap is a float64 NCHW activation for the reference implementation.
type fmap struct {
	n, c, h, w int
	d          []float64
}

func (f fmap) at(n, c, y, x int) float64 { return f.d[((n*f.c+c)*f.h+y)*f.w+x] }

func refConv(in fmap, w []float32, out, k, stride int) fmap {
	pad := k / 2
	oh, ow := (in.h+2*pad-k)/stride+1, (in.w+2*pad-k)/stride+1
	o := fmap{in.n, out, oh, ow, make([]float64, in.n*out*oh*ow)}
	for n := 0; n < in.n; n++ {
		for co := 0; co < out; co++ {
			for y := 0; y < oh; y++ {
				for x := 0; x < ow; x++ {
					var s float64
					for ci := 0; ci < in.c; ci++ {
						for ky := 0; ky < k; ky++ {
							for kx := 0; kx < k; kx++ {
								iy, ix := y*stride-pad+ky, x*stride-pad+kx
								if iy < 0 || ix < 0 || iy >= in.h || ix >= in.w {
									continue
								}
								s += in.at(n, ci, iy, ix) * float64(w[((co*in.c+ci)*k+ky)*k+kx])
							}
						}
					}
					o.d[((n*out+co)*oh+y)*ow+x] = s
				}
			}
		}
	}
	return o
}

// refBN normalises with batch statistics (train) or the given running
// statistics, and returns the batch mean and unbiased variance.
func refBN(in fmap, gamma, beta []float32, train bool, rmean, rvar []float32, eps float64) (fmap, []float64, []float64) {
	o := fmap{in.n, in.c, in.h, in.w, make([]float64, len(in.d))}
	bm, bv := make([]float64, in.c), make([]float64, in.c)
	cnt := float64(in.n * in.h * in.w)
	for c := 0; c < in.c; c++ {
		var s, ss float64
		for n := 0; n < in.n; n++ {
			for i := 0; i < in.h*in.w; i++ {
				s += in.d[(n*in.c+c)*in.h*in.w+i]
			}
		}
		mean := s / cnt
		for n := 0; n < in.n; n++ {
			for i := 0; i < in.h*in.w; i++ {
				v := in.d[(n*in.c+c)*in.h*in.w+i] - mean
				ss += v * v
			}
		}
		bm[c], bv[c] = mean, ss/(cnt-1)
		mu, va := mean, ss/cnt
		if !train {
			mu, va = float64(rmean[c]), float64(rvar[c])
		}
		for n := 0; n < in.n; n++ {
			for i := 0; i < in.h*in.w; i++ {
				j := (n*in.c+c)*in.h*in.w + i
				o.d[j] = (in.d[j]-mu)/math.Sqrt(va+eps)*float64(gamma[c]) + float64(beta[c])
			}
		}
	}
	return o, bm, bv
}

func relu(f fmap) fmap {
	for i, v := range f.d {
		f.d[i] = math.Max(v, 0)
	}
	return f
}

// refResNet is the reference forward pass; it returns the logits and, in
// training mode, the expected running statistics after the step.
func refResNet(cfg ResNetConfig, lay, blay []ParamInfo, p, buf []float32, images []float32, B int, train bool) (logits [][]float64, newBuf []float64) {
	k := 0
	next := func() []float32 { k++; i := lay[k-1]; return p[i.Offset : i.Offset+i.Size] }
	bi := 0
	bn := func(x fmap) fmap {
		g, b := next(), next()
		rm, rv := buf[blay[bi].Offset:blay[bi].Offset+blay[bi].Size], buf[blay[bi+1].Offset:blay[bi+1].Offset+blay[bi+1].Size]
		o, bm, bv := refBN(x, g, b, train, rm, rv, cfg.Epsilon)
		for c := range bm {
			newBuf[blay[bi].Offset+c] = (1-cfg.Momentum)*float64(rm[c]) + cfg.Momentum*bm[c]
			newBuf[blay[bi+1].Offset+c] = (1-cfg.Momentum)*float64(rv[c]) + cfg.Momentum*bv[c]
		}
		bi += 2
		return o
	}
	newBuf = make([]float64, len(buf))
	S := cfg.ImageSize
	x := fmap{B, 3, S, S, make([]float64, len(images))}
	for i, v := range images {
		x.d[i] = float64(v)
	}
	h := relu(bn(refConv(x, next(), cfg.Width, 3, 1)))
	in := cfg.Width
	for s := 0; s < 4; s++ {
		out := cfg.Width << s
		for b := 0; b < cfg.Blocks[s]; b++ {
			stride := 1
			if s > 0 && b == 0 {
				stride = 2
			}
			y := relu(bn(refConv(h, next(), out, 3, stride)))
			y = bn(refConv(y, next(), out, 3, 1))
			sc := h
			if stride != 1 || in != out {
				sc = bn(refConv(h, next(), out, 1, stride))
			}
			for i := range y.d {
				y.d[i] += sc.d[i]
			}
			h = relu(y)
			in = out
		}
	}
	w, bias := next(), next()
	C := cfg.Classes
	for n := 0; n < B; n++ {
		pooled := make([]float64, h.c)
		for c := 0; c < h.c; c++ {
			for i := 0; i < h.h*h.w; i++ {
				pooled[c] += h.d[(n*h.c+c)*h.h*h.w+i]
			}
			pooled[c] /= float64(h.h * h.w)
		}
		z := make([]float64, C)
		for j := 0; j < C; j++ {
			z[j] = float64(bias[j])
			for c := 0; c < h.c; c++ {
				z[j] += pooled[c] * float64(w[c*C+j])
			}
		}
		logits = append(logits, z)
	}
	return logits, newBuf
}

func refCE(z []float64, y int) float64 {
	mx := slices.Max(z)
	var s float64
	for _, v := range z {
		s += math.Exp(v - mx)
	}
	return math.Log(s) + mx - z[y]
}

func tinyResNet(B int, seed uint64) ResNetConfig {
	return ResNetConfig{Classes: 3, Width: 2, Blocks: [4]int{1, 1, 1, 1}, ImageSize: 8, BatchSize: B, Momentum: 0.1, Epsilon: 1e-5, Seed: seed}
}

func randomImages(r *rand.Rand, cfg ResNetConfig, B int) Batch {
	S := cfg.ImageSize
	b := Batch{Images: make([]float32, B*3*S*S), Labels: make([]int, B)}
	for i := range b.Images {
		b.Images[i] = float32(r.NormFloat64())
	}
	for i := range b.Labels {
		b.Labels[i] = r.IntN(cfg.Classes)
	}
	return b
}

func TestResNetParamCount(t *testing.T) {
	for _, c := range []struct{ classes, want int }{{10, 11173962}, {100, 11173962 + 512*90 + 90}} {
		m, err := NewResNet(DefaultResNet18(c.classes, 2))
		if err != nil {
			t.Fatal(err)
		}
		if m.NumParams() != c.want {
			t.Errorf("%d classes: NumParams = %d, want %d", c.classes, m.NumParams(), c.want)
		}
		if len(m.Layout()) != 62 || len(m.BufferLayout()) != 40 {
			t.Errorf("%d parameter tensors and %d buffers, want 62 and 40", len(m.Layout()), len(m.BufferLayout()))
		}
		lay := m.Layout()
		for _, want := range []struct {
			i     int
			name  string
			shape []int
		}{
			{0, "conv1.weight", []int{64, 3, 3, 3}},
			{1, "bn1.weight", []int{64}},
			{21, "layer2.0.shortcut.0.weight", []int{128, 64, 1, 1}},
			{60, "linear.weight", []int{512, c.classes}},
			{61, "linear.bias", []int{c.classes}},
		} {
			if lay[want.i].Name != want.name || !slices.Equal(lay[want.i].Shape, want.shape) {
				t.Errorf("tensor %d = %s %v, want %s %v", want.i, lay[want.i].Name, lay[want.i].Shape, want.name, want.shape)
			}
		}
	}
}

func TestResNetMatchesReference(t *testing.T) {
	for _, B := range []int{2, 3, 5} {
		cfg := tinyResNet(B, uint64(B))
		if B == 5 {
			cfg.Blocks = [4]int{2, 1, 1, 2} // identity shortcuts in stage 1 and 4
			cfg.Classes = 1
		}
		m, err := hostOf(NewResNet(cfg))
		if err != nil {
			t.Fatal(err)
		}
		randomizeParams(m, uint64(B), 0.5)
		r := rand.New(rand.NewPCG(uint64(B), 4))
		b := randomImages(r, cfg, B)
		buf := make([]float32, m.Buffers().Len())
		m.StoreBuffers(buf)
		want, wantBuf := refResNet(cfg, m.Layout(), m.BufferLayout(), m.Params(), buf, b.Images, B, true)
		var wantLoss float64
		for i, z := range want {
			wantLoss += refCE(z, b.Labels[i])
		}
		wantLoss /= float64(B)
		grad := make([]float32, m.NumParams())
		got, err := m.TrainStep(context.Background(), b, grad)
		if err != nil {
			t.Fatal(err)
		}
		if !closeRel(got.Loss, wantLoss, 1e-4) {
			t.Errorf("B=%d: train loss %v, reference %v", B, got.Loss, wantLoss)
		}
		m.StoreBuffers(buf)
		for i, v := range buf {
			if !closeRel(float64(v), wantBuf[i], 1e-4) {
				t.Fatalf("B=%d: buffer %d = %v, reference %v", B, i, v, wantBuf[i])
			}
		}
		// Evaluation uses the running statistics, on another batch size.
		eb := randomImages(r, cfg, 1)
		wantE, _ := refResNet(cfg, m.Layout(), m.BufferLayout(), m.Params(), buf, eb.Images, 1, false)
		ev, err := m.Evaluate(context.Background(), eb)
		if err != nil {
			t.Fatal(err)
		}
		if wl := refCE(wantE[0], eb.Labels[0]); !closeRel(ev.LossSum, wl, 1e-4) || ev.Count != 1 {
			t.Errorf("B=%d: eval loss %v, reference %v", B, ev.LossSum, wl)
		}
		// Buffers round-trip through Load/Store and change evaluation.
		buf2 := slices.Clone(buf)
		for i := range buf2 {
			buf2[i] *= 2
		}
		if err := m.LoadBuffers(buf2); err != nil {
			t.Fatal(err)
		}
		wantE2, _ := refResNet(cfg, m.Layout(), m.BufferLayout(), m.Params(), buf2, eb.Images, 1, false)
		ev2, _ := m.Evaluate(context.Background(), eb)
		if wl := refCE(wantE2[0], eb.Labels[0]); !closeRel(ev2.LossSum, wl, 1e-4) {
			t.Errorf("B=%d: eval after LoadBuffers %v, reference %v", B, ev2.LossSum, wl)
		}
	}
}

func TestResNetGradCheck(t *testing.T) {
	for _, B := range []int{2, 3} {
		cfg := tinyResNet(B, 7)
		m, err := hostOf(NewResNet(cfg))
		if err != nil {
			t.Fatal(err)
		}
		randomizeParams(m, 3+uint64(B), 0.5)
		b := randomImages(rand.New(rand.NewPCG(uint64(B), 8)), cfg, B)
		buf := make([]float32, m.Buffers().Len())
		m.StoreBuffers(buf)
		ref := func() float64 {
			z, _ := refResNet(cfg, m.Layout(), m.BufferLayout(), m.Params(), buf, b.Images, B, true)
			var l float64
			for i := range z {
				l += refCE(z[i], b.Labels[i])
			}
			return l / float64(B)
		}
		// Float64 reference loss: a small step is exact enough, and it
		// keeps the differences away from BatchNorm's strong curvature
		// when a channel's batch variance is small.
		gradCheckWith(t, m, b, 6, 1e-4, 5e-3, 1e-5, ref)
	}
}

func TestResNetOverfit(t *testing.T) {
	cfg := tinyResNet(8, 3)
	cfg.Width = 4
	cfg.Classes = 4
	m, err := hostOf(NewResNet(cfg))
	if err != nil {
		t.Fatal(err)
	}
	b := randomImages(rand.New(rand.NewPCG(5, 5)), cfg, 8)
	first, last := sgd(t, m, b, 0.1, 60)
	t.Logf("loss %.4f → %.4f", first, last)
	if !(last < 0.3*first) {
		t.Fatalf("loss did not drop enough: %.4f → %.4f", first, last)
	}
}

func TestResNetBadInput(t *testing.T) {
	if _, err := NewResNet(ResNetConfig{Classes: 10, Width: 4, Blocks: [4]int{1, 1, 1, 1}, ImageSize: 12, BatchSize: 2, Momentum: 0.1, Epsilon: 1e-5}); !errors.Is(err, ErrBadInput) {
		t.Errorf("image size 12: err = %v", err)
	}
	if _, err := NewResNet(tinyResNet(1, 1)); !errors.Is(err, ErrBadInput) {
		t.Errorf("batch 1 with a 1×1 last map: err = %v", err)
	}
	cfg := tinyResNet(2, 1)
	m, err := hostOf(NewResNet(cfg))
	if err != nil {
		t.Fatal(err)
	}
	grad := make([]float32, m.NumParams())
	b := randomImages(rand.New(rand.NewPCG(1, 1)), cfg, 2)
	b.Labels[1] = 3
	if _, err := m.TrainStep(context.Background(), b, grad); !errors.Is(err, ErrBadInput) {
		t.Errorf("label out of range: err = %v", err)
	}
	b.Labels[1] = 0
	b.Images = b.Images[1:]
	if _, err := m.TrainStep(context.Background(), b, grad); !errors.Is(err, ErrBadInput) {
		t.Errorf("short images: err = %v", err)
	}
	buf := make([]float32, m.Buffers().Len())
	m.StoreBuffers(buf)
	buf[m.BufferLayout()[1].Offset] = -1
	if err := m.LoadBuffers(buf); !errors.Is(err, ErrBadInput) {
		t.Errorf("negative running variance: err = %v", err)
	}
}
