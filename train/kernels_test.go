package train

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/engine"
)

// TestRunRecordsKernels: run.json says which CPU kernels ran (oneDNN or
// im2col), as -kernels chose them; -kernels onednn without the library is
// refused with the package to install.
func TestRunRecordsKernels(t *testing.T) {
	defer engine.ConfigureCPU(engine.KernelsIm2col, 0)
	for _, k := range []string{"im2col", "onednn"} {
		c := ncfConfig(t, 1, 2)
		c.Kernels = k
		err := Run(context.Background(), c, Options{})
		if k == "onednn" && errors.Is(err, engine.ErrOneDNNNotFound) {
			if os.Getenv("SPARSEGRAD_TEST_KERNELS") == "onednn" {
				t.Fatal(err)
			}
			if !strings.Contains(err.Error(), "libdnnl2") || !strings.Contains(err.Error(), "-kernels onednn") {
				t.Fatalf("-kernels onednn without oneDNN: %v", err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var info RunInfo
		b, err := os.ReadFile(filepath.Join(c.Out, "run.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &info); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"im2col": "im2col", "onednn": "oneDNN 2."}[k]
		if !strings.HasPrefix(info.Versions.Kernels, want) || info.Config.Kernels != k {
			t.Errorf("-kernels %s: run.json says %q (config %q)", k, info.Versions.Kernels, info.Config.Kernels)
		}
	}
}
