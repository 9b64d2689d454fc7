package device

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"
)

// CPU is the host processor. Its buffers are Go memory, its streams run
// work as it is issued, and its math runs on all cores for long vectors.
var CPU Device = cpuDevice{}

type cpuDevice struct{}

func (cpuDevice) Kind() Kind     { return CPUKind }
func (cpuDevice) String() string { return "cpu" }

func (cpuDevice) Alloc(dt DType, n int) (Buffer, error) {
	if n < 0 {
		return Buffer{}, fmt.Errorf("device: cannot allocate %d elements", n)
	}
	switch dt {
	case Float32:
		return Host(make([]float32, n)), nil
	case Float64:
		return Host(make([]float64, n)), nil
	case Int32:
		return Host(make([]int32, n)), nil
	case Int64:
		return Host(make([]int64, n)), nil
	case Float16:
		return Host(make([]uint16, n)), nil
	}
	return Buffer{}, fmt.Errorf("device: cannot allocate elements of %v", dt)
}

func (cpuDevice) Free(Buffer) error { return nil }

func (cpuDevice) Stream() Stream { return cpuStream{} }

func (cpuDevice) NewStream() (Stream, error) { return cpuStream{}, nil }

func (cpuDevice) Math() Math { return cpuMath{} }

func (cpuDevice) Close() error { return nil }

type cpuStream struct{}

func (cpuStream) Device() Device { return CPU }

func (cpuStream) Copy(dst, src Buffer) error {
	if err := CheckSame("copy", dst, src); err != nil {
		return err
	}
	if !dst.IsHost() || !src.IsHost() {
		return fmt.Errorf("device: the CPU stream cannot copy %v to %v; use the GPU's stream", src, dst)
	}
	copy(dst.HostBytes(), src.HostBytes())
	return nil
}

func (cpuStream) Synchronize() error { return nil }

func (cpuStream) Record() (Event, error) { return cpuEvent(time.Now()), nil }

func (cpuStream) Wait(Event) error { return nil }

// cpuEvent completed when it was recorded.
type cpuEvent time.Time

func (cpuEvent) Synchronize() error { return nil }

func (e cpuEvent) Time() (time.Time, error) { return time.Time(e), nil }

type cpuMath struct{}

func (cpuMath) SGD(_ Stream, p SGDStep, w, g, buf Buffer) error {
	args := []Buffer{w, g}
	if p.Momentum != 0 {
		args = append(args, buf)
	}
	if err := CheckFloat32("SGD", CPU, args...); err != nil {
		return err
	}
	W, G := w.Float32s(), g.Float32s()
	var B []float32
	if p.Momentum != 0 {
		B = buf.Float32s()
	}
	parallel(len(W), func(lo, hi int) {
		var b []float32
		if B != nil {
			b = B[lo:hi:hi]
		}
		sgdSpan(W[lo:hi], G[lo:hi:hi], b, p)
	})
	return nil
}

// sgdSpan is the SGD step on one run of elements; the operation order is
// fixed (and was the trainer's before it moved here), so results are
// reproducible bit for bit.
func sgdSpan(w, g, buf []float32, p SGDStep) {
	l, m, wd := p.LR, p.Momentum, p.WeightDecay
	switch {
	case buf == nil:
		for i := range w {
			w[i] -= l * (g[i] + wd*w[i])
		}
	case p.First && p.Nesterov:
		for i := range w {
			d := g[i] + wd*w[i]
			buf[i] = d
			w[i] -= l * (d + m*d)
		}
	case p.First:
		for i := range w {
			d := g[i] + wd*w[i]
			buf[i] = d
			w[i] -= l * d
		}
	case p.Nesterov:
		for i := range w {
			d := g[i] + wd*w[i]
			b := m*buf[i] + d
			buf[i] = b
			w[i] -= l * (d + m*b)
		}
	default:
		for i := range w {
			b := m*buf[i] + g[i] + wd*w[i]
			buf[i] = b
			w[i] -= l * b
		}
	}
}

func (cpuMath) Adam(_ Stream, p AdamStep, w, g, m, v Buffer) error {
	if err := CheckFloat32("Adam", CPU, w, g, m, v); err != nil {
		return err
	}
	W, G, M, V := w.Float32s(), g.Float32s(), m.Float32s(), v.Float32s()
	b1, b2 := p.Beta1, p.Beta2
	parallel(len(W), func(lo, hi int) {
		w, g, m, v := W[lo:hi], G[lo:hi:hi], M[lo:hi:hi], V[lo:hi:hi]
		for i := range w {
			gi := g[i]
			mi := b1*m[i] + (1-b1)*gi
			vi := b2*v[i] + (1-b2)*gi*gi
			m[i], v[i] = mi, vi
			den := float32(math.Sqrt(float64(vi)))/p.SqrtBC2 + p.Eps
			w[i] -= p.StepSize * mi / den
		}
	})
	return nil
}

func (cpuMath) SumSquares(_ Stream, x Buffer) (float64, error) {
	if err := CheckFloat32("SumSquares", CPU, x); err != nil {
		return 0, err
	}
	var s float64
	for _, v := range x.Float32s() {
		s += float64(v) * float64(v)
	}
	return s, nil
}

func (cpuMath) Scale(_ Stream, x Buffer, a float32) error {
	if err := CheckFloat32("Scale", CPU, x); err != nil {
		return err
	}
	X := x.Float32s()
	parallel(len(X), func(lo, hi int) {
		for i := range X[lo:hi] {
			X[lo+i] *= a
		}
	})
	return nil
}

func (cpuMath) Fill(_ Stream, x Buffer, v float32) error {
	if err := CheckFloat32("Fill", CPU, x); err != nil {
		return err
	}
	X := x.Float32s()
	parallel(len(X), func(lo, hi int) {
		s := X[lo:hi]
		for i := range s {
			s[i] = v
		}
	})
	return nil
}

func (cpuMath) Add(_ Stream, y, x Buffer) error {
	if err := CheckFloat32("Add", CPU, y, x); err != nil {
		return err
	}
	Y, X := y.Float32s(), x.Float32s()
	parallel(len(Y), func(lo, hi int) {
		y, x := Y[lo:hi], X[lo:hi:hi]
		for i := range y {
			y[i] += x[i]
		}
	})
	return nil
}

// parallelMin is the length below which element-wise loops run on one
// goroutine.
const parallelMin = 1 << 16

// parallel calls f on contiguous chunks of [0, n), on all cores for large n.
func parallel(n int, f func(lo, hi int)) {
	p := runtime.GOMAXPROCS(0)
	if n < parallelMin || p == 1 {
		f(0, n)
		return
	}
	p = min(p, n/(parallelMin/4))
	var wg sync.WaitGroup
	for c := 0; c < p; c++ {
		lo, hi := c*n/p, (c+1)*n/p
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
}
