package device

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// sizes are awkward lengths: empty, one, odd, just above the parallel
// threshold.
var sizes = []int{0, 1, 3, 17, 1000, parallelMin + 3, 4*parallelMin + 1}

// TestSGDMatchesPyTorch runs every SGD variant against torch.optim.SGD's
// formula in float64 for several steps.
func TestSGDMatchesPyTorch(t *testing.T) {
	m := CPU.Math()
	s := CPU.Stream()
	for _, n := range sizes {
		for _, mom := range []float32{0, 0.9} {
			for _, nest := range []bool{false, true} {
				if nest && mom == 0 {
					continue
				}
				for _, wd := range []float32{0, 1e-2} {
					r := rand.New(rand.NewPCG(uint64(n), 3))
					w := randVec(r, n)
					buf := make([]float32, n)
					ref, rbuf := make([]float64, n), make([]float64, n)
					for i := range w {
						ref[i] = float64(w[i])
					}
					for step := 0; step < 4; step++ {
						g := randVec(r, n)
						lr := 0.1 / float32(step+1)
						var b Buffer
						if mom != 0 {
							b = Host(buf)
						}
						if err := m.SGD(s, SGDStep{LR: lr, Momentum: mom, WeightDecay: wd, Nesterov: nest, First: step == 0}, Host(w), Host(g), b); err != nil {
							t.Fatal(err)
						}
						for i := range ref {
							d := float64(g[i]) + float64(wd)*ref[i]
							if mom != 0 {
								if step == 0 {
									rbuf[i] = d
								} else {
									rbuf[i] = float64(mom)*rbuf[i] + d
								}
								if nest {
									d += float64(mom) * rbuf[i]
								} else {
									d = rbuf[i]
								}
							}
							ref[i] -= float64(lr) * d
						}
					}
					for i := range w {
						if math.Abs(float64(w[i])-ref[i]) > 1e-5*(1+math.Abs(ref[i])) {
							t.Fatalf("n=%d m=%v nesterov=%v wd=%v: w[%d] = %v, reference %v", n, mom, nest, wd, i, w[i], ref[i])
						}
					}
				}
			}
		}
	}
}

func TestAdamMatchesPyTorch(t *testing.T) {
	m := CPU.Math()
	for _, n := range sizes {
		r := rand.New(rand.NewPCG(uint64(n), 4))
		w := randVec(r, n)
		mv, vv := make([]float32, n), make([]float32, n)
		ref, rm, rv := make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range w {
			ref[i] = float64(w[i])
		}
		const b1, b2, eps, lr = 0.9, 0.99, 1e-8, 0.01
		for step := 1; step <= 5; step++ {
			g := randVec(r, n)
			bc1, bc2 := 1-math.Pow(b1, float64(step)), 1-math.Pow(b2, float64(step))
			p := AdamStep{StepSize: float32(lr / bc1), Beta1: b1, Beta2: b2, Eps: eps, SqrtBC2: float32(math.Sqrt(bc2))}
			if err := m.Adam(CPU.Stream(), p, Host(w), Host(g), Host(mv), Host(vv)); err != nil {
				t.Fatal(err)
			}
			for i := range ref {
				gi := float64(g[i])
				rm[i] = b1*rm[i] + (1-b1)*gi
				rv[i] = b2*rv[i] + (1-b2)*gi*gi
				ref[i] -= lr * (rm[i] / bc1) / (math.Sqrt(rv[i]/bc2) + eps)
			}
		}
		for i := range w {
			if math.Abs(float64(w[i])-ref[i]) > 1e-4*(1+math.Abs(ref[i])) {
				t.Fatalf("n=%d: w[%d] = %v, reference %v", n, i, w[i], ref[i])
			}
		}
	}
}

func TestVectorOps(t *testing.T) {
	m, s := CPU.Math(), CPU.Stream()
	for _, n := range sizes {
		r := rand.New(rand.NewPCG(uint64(n), 5))
		x, y := randVec(r, n), randVec(r, n)
		var want float64
		for _, v := range x {
			want += float64(v) * float64(v)
		}
		got, err := m.SumSquares(s, Host(x))
		if err != nil || got != want {
			t.Fatalf("n=%d: SumSquares = %v, %v; want %v", n, got, err, want)
		}
		y0 := append([]float32(nil), y...)
		if err := m.Add(s, Host(y), Host(x)); err != nil {
			t.Fatal(err)
		}
		for i := range y {
			if y[i] != y0[i]+x[i] {
				t.Fatalf("n=%d: Add[%d] = %v, want %v", n, i, y[i], y0[i]+x[i])
			}
		}
		x0 := append([]float32(nil), x...)
		if err := m.Scale(s, Host(x), -0.5); err != nil {
			t.Fatal(err)
		}
		for i := range x {
			if x[i] != -0.5*x0[i] {
				t.Fatalf("n=%d: Scale[%d] = %v", n, i, x[i])
			}
		}
		if err := m.Fill(s, Host(x), 7); err != nil {
			t.Fatal(err)
		}
		for i := range x {
			if x[i] != 7 {
				t.Fatalf("n=%d: Fill[%d] = %v", n, i, x[i])
			}
		}
	}
}

func TestBadArguments(t *testing.T) {
	m, s := CPU.Math(), CPU.Stream()
	for name, err := range map[string]error{
		"length": m.Add(s, Host(make([]float32, 3)), Host(make([]float32, 4))),
		"type":   m.Scale(s, Host(make([]int64, 3)), 2),
		"copy":   s.Copy(Host(make([]float32, 3)), Host(make([]float32, 2))),
		"adam":   m.Adam(s, AdamStep{}, Host(make([]float32, 2)), Host(make([]float32, 2)), Host(make([]float32, 1)), Host(make([]float32, 2))),
	} {
		if err == nil {
			t.Errorf("%s mismatch accepted", name)
		}
	}
	if _, err := CPU.Alloc(Float32, -1); err == nil {
		t.Error("negative allocation accepted")
	}
}

func TestBufferViews(t *testing.T) {
	b, err := CPU.Alloc(Float32, 10)
	if err != nil {
		t.Fatal(err)
	}
	x := b.Float32s()
	for i := range x {
		x[i] = float32(i)
	}
	s := b.Slice(3, 7)
	if s.Len() != 4 || s.Float32s()[0] != 3 || !s.IsHost() || s.Device() != CPU {
		t.Fatalf("slice %v = %v", s, s.Float32s())
	}
	v := b.View(Float64, 8, 2) // bytes 8..24 as two float64
	if v.Len() != 2 || v.Bytes() != 16 {
		t.Fatalf("view %v", v)
	}
	v.Float64s()[0] = 1.5
	if x[2] == 2 {
		t.Fatal("a view does not share memory")
	}
	for _, f := range []func(){
		func() { b.Slice(4, 11) },
		func() { b.Slice(5, 4) },
		func() { b.View(Float64, 36, 1) },
		func() { b.Float64s() },
	} {
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Error("an out-of-range or mistyped access did not panic")
				} else if !strings.Contains(fmtAny(r), "device:") {
					t.Errorf("panic %v does not name the package", r)
				}
			}()
			f()
		}()
	}
	var empty Buffer
	if empty.Len() != 0 || empty.Float32s() != nil {
		t.Fatal("the zero buffer is not empty")
	}
}

func fmtAny(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if e, ok := v.(error); ok {
		return e.Error()
	}
	return ""
}

// resnetSize is ResNet-18's parameter count (CIFAR-10).
const resnetSize = 11173962

func BenchmarkSGD(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	w, g, buf := randVec(r, resnetSize), randVec(r, resnetSize), make([]float32, resnetSize)
	m, s := CPU.Math(), CPU.Stream()
	b.SetBytes(4 * resnetSize)
	for b.Loop() {
		m.SGD(s, SGDStep{LR: 1e-9, Momentum: 0.9, WeightDecay: 1e-4}, Host(w), Host(g), Host(buf))
	}
}

func BenchmarkAdam(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	w, g := randVec(r, resnetSize), randVec(r, resnetSize)
	mv, vv := make([]float32, resnetSize), make([]float32, resnetSize)
	m, s := CPU.Math(), CPU.Stream()
	b.SetBytes(4 * resnetSize)
	for b.Loop() {
		m.Adam(s, AdamStep{StepSize: 1e-9, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, SqrtBC2: 1}, Host(w), Host(g), Host(mv), Host(vv))
	}
}

func BenchmarkSumSquares(b *testing.B) {
	g := randVec(rand.New(rand.NewPCG(1, 2)), resnetSize)
	m, s := CPU.Math(), CPU.Stream()
	b.SetBytes(4 * resnetSize)
	for b.Loop() {
		m.SumSquares(s, Host(g))
	}
}

// TestEmptySliceHoldsNoPointer: an empty slice or view at the end of host
// memory must not point one past its end (the garbage collector would see a
// pointer into another object).
func TestEmptySliceHoldsNoPointer(t *testing.T) {
	b := Host(make([]float32, 4))
	for _, e := range []Buffer{b.Slice(4, 4), b.Slice(2, 2), b.View(Int32, 16, 0)} {
		if e.Len() != 0 || e.host != nil || !e.IsHost() || e.HostBytes() != nil {
			t.Fatalf("empty slice %v: host pointer %v", e, e.host)
		}
	}
	if s := b.Slice(1, 3); s.Len() != 2 || &s.Float32s()[0] != &b.Float32s()[1] {
		t.Fatal("a non-empty slice lost its memory")
	}
}

// TestEmptyDeviceBufferReadsAsNil: an empty slice of device memory has no
// memory to read: its host views are nil, not a panic (a communicator of
// host memory is handed such slices when a peer sends nothing).
func TestEmptyDeviceBufferReadsAsNil(t *testing.T) {
	b := NewDeviceBuffer(nil, Float32, 8, 0x1000)
	e := b.Slice(3, 3)
	if e.IsHost() || e.HostBytes() != nil || e.Float32s() != nil {
		t.Fatalf("empty device slice %v", e)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("the host view of 8 device floats did not panic")
		}
	}()
	b.Float32s()
}
