package cuda

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// methodKernels lists the kernels the registered methods declare beside
// their cores (sparsify.Method.Kernels), each once (methods may share one).
func methodKernels() []*device.Kernel {
	var ks []*device.Kernel
	for _, m := range sparsify.Methods() {
		for _, k := range m.Kernels {
			if !slices.Contains(ks, k) {
				ks = append(ks, k)
			}
		}
	}
	return ks
}

// emulatedSource is the CUDA C the emulator compiles: kernels.cu, then
// every method's kernel (which may use kernels.cu's types and
// GRID_STRIDE, the prelude Run compiles them with on a GPU), each source
// once (the kernels of one file share it).
func emulatedSource() string {
	var b strings.Builder
	b.WriteString(kernelSource)
	var seen []string
	for _, k := range methodKernels() {
		if slices.Contains(seen, k.CUDA) {
			continue
		}
		seen = append(seen, k.CUDA)
		fmt.Fprintf(&b, "\n// ---- %s (a method's kernel) ----\n%s", k.Name, k.CUDA)
	}
	return b.String()
}

// TestMethodKernelsCompile compiles every method's kernel as Run compiles
// it (the prelude, then its CUDA C) with the real NVRTC, and checks that
// the prelude is what kernels.cu begins with and that each kernel defines
// the function it names.
func TestMethodKernelsCompile(t *testing.T) {
	if !strings.Contains(kernelSource, kernelPrelude) {
		t.Fatal("kernels.cu does not begin with the methods' kernel prelude (types and GRID_STRIDE)")
	}
	ks := methodKernels()
	if len(ks) < 2 {
		t.Fatalf("%d method kernels registered, want dgc's and dragonn's at least", len(ks))
	}
	for _, k := range ks {
		if !strings.Contains(k.CUDA, `extern "C" __global__ void `+k.Name+"(") || k.Host == nil {
			t.Errorf("kernel %s: its CUDA C does not define it, or it has no Host pass", k.Name)
		}
	}
	if _, _, err := NVRTCVersion(); errors.Is(err, device.ErrUnavailable) {
		testenv.Missing(t, testenv.NVRTC, fmt.Sprintf("NVRTC is not installed (%v)", err))
	}
	for _, k := range ks {
		for _, arch := range [][2]int{{8, 0}, {9, 0}} {
			if img, _, err := Compile(kernelPrelude+k.CUDA, arch[0], arch[1]); err != nil || len(img) == 0 {
				t.Fatalf("%s for sm_%d%d: %v", k.Name, arch[0], arch[1], err)
			}
		}
	}
}
