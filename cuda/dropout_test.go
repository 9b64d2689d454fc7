package cuda_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
)

// Package models draws its masks on a device that implements this (its
// maskDrawer); the GPU must.
var _ interface {
	DropoutMask(s device.Stream, dst device.Buffer, hi, lo, threshold uint64, keep float32) error
} = (*cuda.Device)(nil)

// TestGPUDropoutMatchesCPU: the GPU's dropout masks are, bit for bit,
// those math/rand/v2's PCG draws on the CPU (Float64() < p: 0, else
// 1/(1−p)), for lengths around the block and grid sizes and for states
// whose jumps carry across the 64-bit words.
func TestGPUDropoutMatchesCPU(t *testing.T) {
	d := gpu(t)
	s := d.Stream()
	for _, c := range []struct {
		n      int
		hi, lo uint64
		p      float64
	}{
		{1, 1, 0x64726f70, 0.5},
		{255, 42, 0x64726f70, 0.4},
		{256, 7, math.MaxUint64, 0.2},
		{257, math.MaxUint64, math.MaxUint64 - 3, 0.5},
		{1000, 0, 0, 0.1},
		{150001, 12345, 678910, 0.5},
	} {
		want := make([]float32, c.n)
		r := rand.New(rand.NewPCG(c.hi, c.lo))
		keep := float32(1 / (1 - c.p))
		for i := range want {
			if r.Float64() < c.p {
				want[i] = 0
			} else {
				want[i] = keep
			}
		}
		buf, err := d.Alloc(device.Float32, c.n)
		if err != nil {
			t.Fatal(err)
		}
		thr := uint64(math.Ceil(c.p * (1 << 53)))
		if err := d.DropoutMask(s, buf, c.hi, c.lo, thr, keep); err != nil {
			t.Fatal(err)
		}
		got := download(t, s, buf)
		d.Free(buf)
		zeros := 0
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n %d, state (%d, %d), p %v: element %d is %v, the CPU draws %v", c.n, c.hi, c.lo, c.p, i, got[i], want[i])
			}
			if got[i] == 0 {
				zeros++
			}
		}
		if c.n > 1000 && math.Abs(float64(zeros)/float64(c.n)-c.p) > 0.01 {
			t.Errorf("n %d: %d zeros for p %v", c.n, zeros, c.p)
		}
	}
}
