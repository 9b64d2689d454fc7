package dnnl

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// mustLoad returns the library or skips the test when it is not installed;
// with SPARSEGRAD_TEST_KERNELS=onednn (CI's oneDNN pass) a missing library
// fails instead.
func mustLoad(t testing.TB) *Lib {
	t.Helper()
	l, err := Load()
	if err != nil {
		if errors.Is(err, ErrNotFound) && os.Getenv("SPARSEGRAD_TEST_KERNELS") != "onednn" {
			testenv.Missing(t, testenv.OneDNN, fmt.Sprintf("oneDNN is not installed (apt-get install libdnnl2): %v", err))
		}
		t.Fatal(err)
	}
	return l
}

func TestLoadReportsVersion(t *testing.T) {
	l := mustLoad(t)
	v := l.Version()
	if v.Major != 2 {
		t.Fatalf("version %v", v)
	}
	if l.Block() != 8 && l.Block() != 16 {
		t.Errorf("preferred channel block %d, want 8 (AVX2) or 16 (AVX-512)", l.Block())
	}
	t.Logf("oneDNN %s (%s runtime) from %s, channel block %d", v, v.Runtime, l.Path(), l.Block())
}

func TestMissingLibraryNamesThePackage(t *testing.T) {
	t.Setenv(EnvLibrary, "/nonexistent/libdnnl.so.2")
	_, err := load()
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("error %v does not wrap ErrNotFound", err)
	}
	for _, want := range []string{"libdnnl2", EnvLibrary, "/nonexistent/libdnnl.so.2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestNotOneDNNIsRefused(t *testing.T) {
	// A library that exists but is not oneDNN: libc.
	t.Setenv(EnvLibrary, "libc.so.6")
	_, err := load()
	if err == nil || !strings.Contains(err.Error(), "dnnl_engine_create") {
		t.Fatalf("loading libc as oneDNN: %v", err)
	}
}

// refConv is a 2-D convolution from the definition, in float64.
func refConv(x, w []float32, B, Ci, H, W, Co, K, stride, pad int) ([]float64, int, int) {
	Ho, Wo := (H+2*pad-K)/stride+1, (W+2*pad-K)/stride+1
	y := make([]float64, B*Co*Ho*Wo)
	for b := 0; b < B; b++ {
		for co := 0; co < Co; co++ {
			for oy := 0; oy < Ho; oy++ {
				for ox := 0; ox < Wo; ox++ {
					var s float64
					for ci := 0; ci < Ci; ci++ {
						for ky := 0; ky < K; ky++ {
							for kx := 0; kx < K; kx++ {
								iy, ix := oy*stride-pad+ky, ox*stride-pad+kx
								if iy < 0 || iy >= H || ix < 0 || ix >= W {
									continue
								}
								s += float64(x[((b*Ci+ci)*H+iy)*W+ix]) * float64(w[((co*Ci+ci)*K+ky)*K+kx])
							}
						}
					}
					y[((b*Co+co)*Ho+oy)*Wo+ox] = s
				}
			}
		}
	}
	return y, Ho, Wo
}

func randF32(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// exec runs one primitive on plain host slices, with its scratchpad.
func exec(t *testing.T, l *Lib, pd *PrimDesc, args map[int][]float32) {
	t.Helper()
	p, err := pd.Create()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, err := l.Stream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n := pd.Scratchpad(); n > 0 {
		args[ArgScratchpad] = make([]float32, (n+3)/4)
	}
	var list []Arg
	for kind, data := range args {
		var md *MemDesc
		switch kind {
		case ArgSrc, ArgDiffSrc:
			md = pd.Query(QuerySrc, 0)
			if kind == ArgDiffSrc {
				md = pd.Query(QueryDiffSrc, 0)
			}
		case ArgDst:
			md = pd.Query(QueryDst, 0)
		case ArgDiffDst:
			md = pd.Query(QueryDiffDst, 0)
		case ArgWeights:
			md = pd.Query(QueryWeights, 0)
		case ArgDiffWeights:
			md = pd.Query(QueryDiffWeights, 0)
		case ArgScratchpad:
			md = pd.Query(QueryScratchpad, 0)
		}
		if md == nil {
			t.Fatalf("argument %d: no descriptor", kind)
		}
		if l.Size(md) > 4*len(data) {
			t.Fatalf("argument %d needs %d bytes, have %d", kind, l.Size(md), 4*len(data))
		}
		m, err := l.Memory(md)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := m.Set(unsafe.Pointer(&data[0])); err != nil {
			t.Fatal(err)
		}
		list = append(list, NewArg(kind, m))
	}
	if err := l.WithThreads(2, func() error { return s.Execute(p, list) }); err != nil {
		t.Fatal(err)
	}
}

func TestConvForwardMatchesDefinition(t *testing.T) {
	l := mustLoad(t)
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ B, Ci, H, W, Co, K, stride, pad int }{
		{1, 1, 1, 1, 1, 1, 1, 0},
		{2, 3, 7, 5, 5, 3, 1, 1},
		{3, 5, 9, 9, 7, 3, 2, 1},
		{2, 16, 6, 6, 8, 1, 2, 0},
	} {
		x := randF32(r, c.B*c.Ci*c.H*c.W)
		w := randF32(r, c.Co*c.Ci*c.K*c.K)
		want, Ho, Wo := refConv(x, w, c.B, c.Ci, c.H, c.W, c.Co, c.K, c.stride, c.pad)
		src, err := l.Desc([]int{c.B, c.Ci, c.H, c.W}, TagNCHW)
		if err != nil {
			t.Fatal(err)
		}
		wd, _ := l.Desc([]int{c.Co, c.Ci, c.K, c.K}, TagNCHW)
		dst, _ := l.Desc([]int{c.B, c.Co, Ho, Wo}, TagNCHW)
		var pd *PrimDesc
		err = l.WithThreads(2, func() (err error) {
			pd, err = l.ConvForward(PropForwardTraining, src, wd, dst, [2]int{c.stride, c.stride}, [2]int{c.pad, c.pad})
			return err
		})
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		y := make([]float32, len(want))
		exec(t, l, pd, map[int][]float32{ArgSrc: x, ArgWeights: w, ArgDst: y})
		pd.Close()
		for i := range want {
			if d := math.Abs(float64(y[i]) - want[i]); d > 1e-5*float64(c.Ci*c.K*c.K) {
				t.Fatalf("%+v: y[%d] = %v, want %v", c, i, y[i], want[i])
			}
		}
	}
}
