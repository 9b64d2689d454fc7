package cuda

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// TestKernelsCompile compiles every kernel with the real NVRTC for the
// architectures the project runs on (no GPU needed). CI installs NVRTC and
// sets SPARSEGRAD_REQUIRE=nvrtc, so a missing compiler fails there instead
// of skipping.
func TestKernelsCompile(t *testing.T) {
	maj, min, err := NVRTCVersion()
	if errors.Is(err, device.ErrUnavailable) {
		testenv.Missing(t, testenv.NVRTC, fmt.Sprintf("NVRTC is not installed (%v)", err))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NVRTC %d.%d from %s", maj, min, nvrtc.path)
	for _, arch := range [][2]int{{8, 0}, {9, 0}} {
		img, cubin, err := Compile(kernelSource, arch[0], arch[1])
		if err != nil {
			t.Fatalf("sm_%d%d: %v", arch[0], arch[1], err)
		}
		if len(img) == 0 {
			t.Fatalf("sm_%d%d: empty image", arch[0], arch[1])
		}
		t.Logf("sm_%d%d: %d bytes (cubin %v)", arch[0], arch[1], len(img), cubin)
	}
	// A kernel that does not compile is reported with NVRTC's log.
	_, _, err = compileOnceForTest("extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }")
	if err == nil || !strings.Contains(err.Error(), "undefined_name") {
		t.Fatalf("a broken kernel: %v", err)
	}
}

func compileOnceForTest(src string) ([]byte, bool, error) {
	img, err := compileOnce(src, []string{"-arch=compute_80"}, false)
	return img, false, err
}
