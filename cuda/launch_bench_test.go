package cuda

import (
	"testing"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
)

// BenchmarkLaunch is the host's cost of one kernel launch on its way to
// the driver, whose cuLaunchKernel is replaced by one that does nothing
// (so that only the package's path is timed, on the emulator as on a GPU):
//
//	go test -run XXX -bench Launch -benchmem ./cuda
//
// package: a kernel of kernels.cu (Math.Scale); package-held: the same
// with the stream held (Stream.Hold), as a step's bursts are; method: a
// method's own kernel (Sparse.Run, sparsify's kernels); method-held: held.
// allocs/op must stay 0 for every one (TestLaunchesAllocateNothing).
func BenchmarkLaunch(b *testing.B) {
	d := openDevice(b)
	x, err := d.Alloc(device.Float32, 1000)
	if err != nil {
		b.Fatal(err)
	}
	ks := methodKernels()
	if len(ks) == 0 {
		b.Fatal("no method kernel registered")
	}
	k := ks[0]
	s, m, sp := d.Stream(), d.Math(), d.Sparse()
	// The method's kernel compiled and loaded before the timing.
	if _, err := d.methodKernel(k); err != nil {
		b.Fatal(err)
	}
	launch := drv.cuLaunchKernel
	b.Cleanup(func() { drv.cuLaunchKernel = launch })
	drv.cuLaunchKernel = func(uintptr, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uintptr, unsafe.Pointer, unsafe.Pointer) cuResult {
		return 0
	}
	for _, c := range []struct {
		name string
		held bool
		call func() error
	}{
		{"package", false, func() error { return m.Scale(s, x, 2) }},
		{"package-held", true, func() error { return m.Scale(s, x, 2) }},
		{"method", false, func() error { return sp.Run(s, k, x.Len(), x, int64(x.Len())) }},
		{"method-held", true, func() error { return sp.Run(s, k, x.Len(), x, int64(x.Len())) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			if c.held {
				defer s.(*Stream).Hold()()
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := c.call(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
