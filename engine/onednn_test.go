package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine/graphcases"
	"github.com/sparsegrad/sparsegrad/internal/native/dnnl"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/ops"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// useKernels configures the CPU backend for the rest of the test (restoring
// the reference kernels afterwards). oneDNN missing skips the test, unless
// SPARSEGRAD_TEST_KERNELS=onednn (CI's oneDNN pass) requires it.
func useKernels(t *testing.T, mode string, threads int) {
	t.Helper()
	if _, err := ConfigureCPU(mode, threads); err != nil {
		if errors.Is(err, ErrOneDNNNotFound) && os.Getenv("SPARSEGRAD_TEST_KERNELS") != KernelsOneDNN {
			testenv.Missing(t, testenv.OneDNN, fmt.Sprintf("oneDNN is not installed (apt-get install libdnnl2): %v", err))
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { ConfigureCPU(KernelsIm2col, 0) })
}

// resnetCases are graphs shaped like ResNet blocks with 16 and 32
// channels, so that oneDNN keeps activations in its blocked format between
// layers (and converts at the reshape into a plain matrix), plus a
// batch normalisation in evaluation mode.
func resnetCases() []graphcases.Case {
	must := func(n *G.Node, err error) *G.Node {
		if err != nil {
			panic(err)
		}
		return n
	}
	weighted := func(x *G.Node) *G.Node { return must(G.Sum(must(G.HadamardProd(x, must(G.Tanh(x)))))) }
	bn := func(x, g, b, rm, rv *G.Node, relu, train bool) *G.Node {
		return must(ops.BatchNormalize(x, g, b, rm, rv, ops.BatchNormConfig{Eps: 1e-5, Momentum: 0.1, ReLU: relu, Training: train}))
	}
	return []graphcases.Case{
		{Name: "resnet-blocks", Params: [][]int{{3, 5, 6, 6}, {16, 5, 3, 3}, {16, 16, 3, 3}, {16, 16, 3, 3}, {32, 16, 3, 3}, {32, 16, 1, 1}, {16}, {16}, {32}, {32}},
			Bufs: 5, Channels: 16,
			Build: func(p, in []*G.Node) (*G.Node, []*G.Node) {
				// in: five (mean, var) pairs of 16 channels; the
				// evaluation-mode layer's 32 are two of them side by side.
				h0 := bn(must(ops.Conv(p[0], p[1], 1, 1)), p[6], p[7], in[0], in[1], true, true)
				y := bn(must(ops.Conv(h0, p[2], 1, 1)), p[6], p[7], in[2], in[3], true, true)
				y = bn(must(ops.Conv(y, p[3], 1, 1)), p[6], p[7], in[4], in[5], false, true)
				h1 := must(ops.AddRelu(y, h0))
				z := must(ops.Conv(h1, p[4], 2, 1))
				s := must(ops.Conv(h1, p[5], 2, 0))
				g2 := must(G.Concat(0, in[6], in[7]))
				b2 := must(G.Concat(0, in[8], in[9]))
				zb := bn(z, p[8], p[9], g2, b2, false, false) // evaluation mode, an output only
				h2 := must(ops.AddRelu(s, z))
				flat := must(G.Reshape(h2, tensor.Shape{3, 32 * 9}))
				// γ and β of the evaluation-mode layer get a gradient of their own.
				return must(G.Add(weighted(flat), must(G.Add(weighted(p[8]), weighted(p[9]))))), []*G.Node{zb}
			}},
		// Weights computed from a parameter and shared by two convolutions
		// (their gradient is a sum of two filter gradients), on 16 channels.
		{Name: "shared-computed-weights", Params: [][]int{{2, 16, 5, 5}, {16, 16, 3, 3}}, Build: func(p, _ []*G.Node) (*G.Node, []*G.Node) {
			w := must(G.HadamardProd(p[1], G.NewConstant(float32(0.5))))
			y := must(ops.Conv(p[0], w, 1, 1))
			z := must(ops.Conv(must(ops.AddRelu(y, p[0])), w, 1, 1))
			return weighted(z), []*G.Node{w}
		}},
	}
}

// TestOneDNNMatchesReference runs every graph case (and ResNet-shaped
// ones) with oneDNN and with the reference kernels: the loss, outputs,
// gradients and running statistics agree within float32 rounding — every
// value within 1e-5 of the largest magnitude of the reference's value.
func TestOneDNNMatchesReference(t *testing.T) {
	useKernels(t, KernelsOneDNN, 2)
	for _, c := range append(graphcases.Cases(), resnetCases()...) {
		t.Run(c.Name, func(t *testing.T) {
			for seed := uint64(1); seed <= 2; seed++ {
				ConfigureCPU(KernelsIm2col, 0)
				_, ref := runBoth(t, c, seed)
				ConfigureCPU(KernelsOneDNN, 2)
				_, got := runBoth(t, c, seed)
				compareValues(t, ref, got, 1e-5)
			}
		})
	}
}

func compareValues(t *testing.T, ref, got [][]float32, tol float64) {
	t.Helper()
	for i := range ref {
		if len(ref[i]) != len(got[i]) {
			t.Fatalf("value %d: %d elements, reference %d", i, len(got[i]), len(ref[i]))
		}
		var scale float64
		for _, v := range ref[i] {
			scale = max(scale, math.Abs(float64(v)))
		}
		for j := range ref[i] {
			if d := math.Abs(float64(got[i][j] - ref[i][j])); !(d <= tol*max(scale, 1e-30)) {
				t.Fatalf("value %d[%d] = %v, reference %v (largest magnitude %.3g)", i, j, got[i][j], ref[i][j], scale)
			}
		}
	}
}

// TestOneDNNKeepsBlockedFormats: in ResNet-shaped graphs the activations
// between oneDNN's ops stay in the blocked format, batch normalisation's
// halves run as one kernel each, and the only format conversions are the
// weights', their gradients' and those at the borders of plain values.
func TestOneDNNKeepsBlockedFormats(t *testing.T) {
	useKernels(t, KernelsOneDNN, 1)
	lib, _ := dnnl.Load()
	c := resnetCases()[0]
	p, e := compileCase(t, c)
	st := e.KernelStats()
	t.Logf("%+v", st)
	if lib.Block() == 0 {
		t.Skip("oneDNN prefers no blocked format on this CPU")
	}
	cp := e.be.(*dnnProgram)
	var convs, bns, blockedConvOut int
	for j, in := range p.Instrs {
		switch in.Op.(type) {
		case ops.Conv2d:
			convs++
			if cp.Blocked(in.Out) {
				blockedConvOut++
			}
		case ops.BatchNormStats, ops.BatchNormGradSums:
			bns++
			if cp.plan.merged[j] < 0 {
				t.Errorf("instruction %d (%v) is not merged with its second half", j, in.Op)
			}
		case ops.Binary, ops.AddReLU, ops.ReLUGrad:
			for _, id := range in.In {
				if len(p.Values[id].Shape) == 4 && cp.Blocked(id) != cp.Blocked(in.Out) {
					t.Errorf("instruction %d (%v) reads and writes different formats", j, in.Op)
				}
			}
		}
	}
	// The 16-channel convolutions' outputs are blocked; the 32-channel ones
	// feed the reshape and the evaluation-mode output, so they are plain.
	if blockedConvOut != 3 || st.Merged != bns {
		t.Errorf("%d of %d convolution outputs blocked (want 3), %d of %d batch-norm pairs merged", blockedConvOut, convs, st.Merged, bns)
	}
	for _, id := range p.OutputIDs {
		if cp.Blocked(id) {
			t.Errorf("output %s is blocked", p.Values[id].Name)
		}
	}
}

// TestOneDNNDeterministic: two executors with the same thread count give
// the same bits; with another thread count the results agree within
// rounding (oneDNN's reductions — batch statistics, weight gradients — are
// split among the threads).
func TestOneDNNDeterministic(t *testing.T) {
	useKernels(t, KernelsOneDNN, 2)
	c := resnetCases()[0]
	_, a := runBoth(t, c, 5)
	_, b := runBoth(t, c, 5)
	for i := range a {
		if !slices.Equal(a[i], b[i]) {
			t.Fatalf("value %d differs between two runs with 2 threads", i)
		}
	}
	ConfigureCPU(KernelsOneDNN, 1)
	_, one := runBoth(t, c, 5)
	same := true
	for i := range a {
		same = same && slices.Equal(a[i], one[i])
	}
	t.Logf("1 and 2 threads give the same bits: %v", same)
	compareValues(t, a, one, 1e-5)
}

// TestConfigureCPU: unknown kernel sets are refused; with oneDNN missing
// (SPARSEGRAD_ONEDNN pointing nowhere, in a child process: the library is
// loaded once per process) -kernels onednn says which package to install
// and auto falls back to im2col.
func TestConfigureCPU(t *testing.T) {
	if os.Getenv("ENGINE_TEST_MISSING_ONEDNN") == "1" {
		_, err := ConfigureCPU(KernelsOneDNN, 1)
		if err == nil || !errors.Is(err, ErrOneDNNNotFound) {
			t.Fatalf("ConfigureCPU(onednn) without the library: %v", err)
		}
		for _, want := range []string{"libdnnl2", dnnl.EnvLibrary} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %s", err, want)
			}
		}
		desc, err := ConfigureCPU(KernelsAuto, 1)
		if err != nil || !strings.HasPrefix(desc, "im2col") || CPUKernels() != KernelsIm2col {
			t.Errorf("auto without oneDNN: %q, %v (kernels %s)", desc, err, CPUKernels())
		}
		return
	}
	if _, err := ConfigureCPU("mkldnn", 0); err == nil || !strings.Contains(err.Error(), "im2col") {
		t.Errorf("unknown kernels: %v", err)
	}
	cmd := testenv.Command(t, 2*time.Minute, os.Args[0], "-test.run=^TestConfigureCPU$", "-test.v")
	cmd.Env = append(os.Environ(), "ENGINE_TEST_MISSING_ONEDNN=1", dnnl.EnvLibrary+"=/nonexistent/libdnnl.so.2")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestConfigureCPU") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// TestOneDNNRunAllocatesLittle: a run with oneDNN's kernels allocates no
// values on the Go heap, only the small bookkeeping of the calls into the
// library (about 150 bytes per instruction; 300 under the race detector).
func TestOneDNNRunAllocatesLittle(t *testing.T) {
	useKernels(t, KernelsOneDNN, 1)
	c := resnetCases()[0]
	p, e := compileCase(t, c)
	b := Bindings{Params: device.Host(make([]float32, p.ParamSize)), Grads: device.Host(make([]float32, p.ParamSize)), Buffers: device.Host(c.Buffers())}
	if _, err := e.Run(context.Background(), b, nil); err != nil {
		t.Fatal(err)
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	const runs = 10
	for range runs {
		if _, err := e.Run(context.Background(), b, nil); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&m1)
	perRun := int(m1.TotalAlloc-m0.TotalAlloc) / runs
	t.Logf("%d bytes allocated per run, arena %d bytes, %d instructions", perRun, e.ArenaBytes(), len(p.Instrs))
	if perRun > 1024*len(p.Instrs) {
		t.Fatalf("a run allocates %d bytes for %d instructions", perRun, len(p.Instrs))
	}
}
