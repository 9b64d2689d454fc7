package cuda_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// ml100k returns the data folder holding MovieLens-100K: $TRAIN_DATA_DIR
// (the GPU machine's copy, see scripts/gpu-verify.sh) or the shared one.
func ml100k(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("TRAIN_DATA_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared", "data")
	}
	return testenv.DataDir(t, dir, "ml-100k/u.data")
}

// TestTrainOnGPU runs the trainer with -device cuda — two in-process
// workers sharing the GPU, each with its own stream, error feedback and
// the reducer in GPU memory (the collectives in GPU memory too), the
// optimizer on the device — and with -device cpu on the same real data and
// seed: the per-step mean losses agree within float32 rounding.
func TestTrainOnGPU(t *testing.T) {
	gpu(t)
	dir := ml100k(t)
	// Every sparsifier, two workers sharing the GPU (each on its own
	// stream; a subtest each). lags pipelines its merge groups with the backward pass (on
	// the GPU each group's error feedback and reduction run on a
	// communication stream of its own as soon as its gradients are final).
	methods := sparsify.Names()
	if testing.Short() {
		methods = []string{"dense", "topk", "lags", "spardl"}
	}
	for _, sp := range methods {
		t.Run(sp, func(t *testing.T) {
			m, _ := sparsify.Lookup(sp)
			var losses [2][]float64
			for k, dev := range []string{"cpu", "cuda"} {
				out := t.TempDir()
				c := train.Config{Model: "ncf", Dataset: "ml-100k", DataDir: dir, Workers: train.Set(2), Steps: 4, Sparsifier: sp, Density: train.Set(0.05),
					Device: dev, Out: out, Pipeline: "auto", Clip: train.Set(0.0), Quiet: true, BLAS: "gonum", MaxEvalBatches: 1}
				if _, ok := m.Param("dense_warmup"); ok { // sparse from the first step
					c.MethodOptions = sparsify.Values{"dense_warmup": 0}
				}
				if sp == "dragonn" {
					c.MethodOptions = sparsify.Values{"dense_warmup": 0, "min_tensor": 0}
				}
				var stdout bytes.Buffer
				c.Quiet = dev == "cpu"  // on the GPU: the terminal shows the GPU and its libraries
				if m.CorrectsMomentum { // DGC's momentum correction, and the optimizer's momentum on weight decay only
					c.Optimizer, c.Momentum, c.LR = "sgd", train.Set(0.9), train.Set(0.05)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				err := train.Run(ctx, c, train.Options{Stdout: &stdout, LossSink: func(_ int, l float64) { losses[k] = append(losses[k], l) }})
				cancel()
				if err != nil {
					t.Fatalf("%s on %s: %v", sp, dev, err)
				}
				// run.json names where the model ran: the GPU path must not
				// fall back to the CPU unnoticed.
				raw, err := os.ReadFile(filepath.Join(out, "run.json"))
				if err != nil {
					t.Fatal(err)
				}
				var info train.RunInfo
				if err := json.Unmarshal(raw, &info); err != nil {
					t.Fatal(err)
				}
				if got := strings.HasPrefix(info.Device, "cuda:"); got != (dev == "cuda") {
					t.Fatalf("%s on %s: run.json device %q", sp, dev, info.Device)
				}
				// It also records the GPU, its driver and the libraries loaded,
				// with versions, and the terminal says the same.
				if dev == "cuda" {
					if info.CUDA == nil || info.CUDA.GPU == "" || info.CUDA.SMs == 0 {
						t.Fatalf("%s: run.json lacks the GPU: %+v", sp, info.CUDA)
					}
					for _, want := range []string{"CUDA driver", "cuBLAS"} { // NCF has no convolution: cuDNN is not loaded
						i := slices.IndexFunc(info.CUDA.Libraries, func(l cuda.LibraryInfo) bool { return strings.Contains(l.Name, want) })
						if i < 0 || info.CUDA.Libraries[i].Version == "" || info.CUDA.Libraries[i].Path == "" {
							t.Fatalf("%s: run.json's libraries lack %s with its version and file: %+v", sp, want, info.CUDA.Libraries)
						}
					}
					if !strings.Contains(stdout.String(), "GPU 0: "+info.CUDA.GPU) || !strings.Contains(stdout.String(), "cuBLAS") {
						t.Fatalf("%s: the terminal does not show the GPU and its libraries:\n%s", sp, stdout.String())
					}
				} else if info.CUDA != nil {
					t.Fatalf("a CPU run records a GPU: %+v", info.CUDA)
				}
				if info.Pipelined != (sp == "lags" || sp == "dense") {
					t.Fatalf("%s on %s: pipelined %v", sp, dev, info.Pipelined)
				}
				// Every method selects and reduces in GPU memory.
				if info.ReduceIn != "device" {
					t.Fatalf("%s on %s: reduce_in %q, want device", sp, dev, info.ReduceIn)
				}
			}
			if len(losses[0]) != 4 || len(losses[1]) != 4 {
				t.Fatalf("%s: %d and %d losses", sp, len(losses[0]), len(losses[1]))
			}
			for i := range losses[0] {
				if math.Abs(losses[0][i]-losses[1][i]) > 1e-4*math.Abs(losses[0][i]) {
					t.Errorf("%s step %d: CPU loss %v, GPU %v", sp, i+1, losses[0][i], losses[1][i])
				}
			}
			t.Logf("%s: CPU %v, GPU %v", sp, losses[0], losses[1])
		})
	}
}

// TestTrainOverNCCL: -comm nccl, one GPU per worker (on the emulator: two
// emulated GPUs and its NCCL), moves the reducers' device buffers over
// NCCL and everything else over the in-process backend (comm.Route), with
// the losses of -device cpu; with fewer GPUs than workers -comm nccl is
// refused and -comm auto falls back to staging through host memory.
func TestTrainOverNCCL(t *testing.T) {
	gpu(t)
	dir := ml100k(t)
	n, err := cuda.Count()
	if err != nil {
		t.Fatal(err)
	}
	if cuda.EmulateGPUs(t, 2) {
		n = 2
	}
	if _, err := cuda.NCCLVersion(); err != nil {
		testenv.Missing(t, testenv.GPU, fmt.Sprintf("no NCCL: %v", err))
	}
	run := func(sp, dev, cm string, workers int) ([]float64, train.RunInfo, error) {
		out := t.TempDir()
		c := train.Config{Model: "ncf", Dataset: "ml-100k", DataDir: dir, Workers: train.Set(workers), Steps: 3, Sparsifier: sp, Density: train.Set(0.05),
			Device: dev, Comm: cm, Out: out, Clip: train.Set(0.0), Quiet: true, BLAS: "gonum", MaxEvalBatches: 1}
		var losses []float64
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		err := train.Run(ctx, c, train.Options{LossSink: func(_ int, l float64) { losses = append(losses, l) }})
		var info train.RunInfo
		if err == nil {
			raw, rerr := os.ReadFile(filepath.Join(out, "run.json"))
			if rerr != nil {
				t.Fatal(rerr)
			}
			if rerr := json.Unmarshal(raw, &info); rerr != nil {
				t.Fatal(rerr)
			}
		}
		return losses, info, err
	}
	// Collectives (dense, topk), point-to-point (gtopk), host memory
	// beside NCCL (spardl), pipelined groups (lags), half precision
	// (fp16: ncclHalf).
	for _, sp := range []string{"dense", "topk", "gtopk", "spardl", "lags", "fp16"} {
		want, _, err := run(sp, "cpu", "auto", n)
		if err != nil {
			t.Fatal(err)
		}
		got, info, err := run(sp, "cuda", "nccl", n)
		if err != nil {
			t.Fatalf("%s: %v", sp, err)
		}
		if info.Comm != "nccl" {
			t.Fatalf("%s: run.json comm %q, want nccl", sp, info.Comm)
		}
		if len(got) != len(want) || len(got) != 3 {
			t.Fatalf("%s: %d and %d losses", sp, len(want), len(got))
		}
		for i := range want {
			if math.Abs(got[i]-want[i]) > 1e-4*math.Abs(want[i]) {
				t.Errorf("%s step %d: CPU loss %v, GPU over NCCL %v", sp, i+1, want[i], got[i])
			}
		}
		t.Logf("%s over NCCL on %d GPUs: CPU %v, GPU %v", sp, n, want, got)
	}
	// More workers than GPUs.
	if _, _, err := run("topk", "cuda", "nccl", n+1); err == nil || !strings.Contains(err.Error(), "needs a GPU per worker") || !strings.Contains(err.Error(), "-comm local") {
		t.Fatalf("-comm nccl with %d workers on %d GPUs: %v", n+1, n, err)
	}
	if _, info, err := run("topk", "cuda", "auto", n+1); err != nil || info.Comm != "local" {
		t.Fatalf("-comm auto with %d workers on %d GPUs: comm %q, %v", n+1, n, info.Comm, err)
	}
}

// TestTrainRefusesWhatTheGPUCannotHold: a run whose programs and vectors
// need more than the GPU's free memory is refused before anything is
// allocated, with the numbers and the flag to lower, as on the CPU.
func TestTrainRefusesWhatTheGPUCannotHold(t *testing.T) {
	gpu(t)
	if !cuda.EmulateFreeMemory(t, 8<<20) { // 8 MiB free
		t.Skip("sets the emulated GPU's free memory")
	}
	dir := ml100k(t)
	before := cuda.Counts()
	c := train.Config{Model: "ncf", Dataset: "ml-100k", DataDir: dir, Preset: "default", Workers: train.Set(2), Steps: 2, Sparsifier: "dense",
		Device: "cuda", Out: t.TempDir(), Quiet: true, BLAS: "gonum"}
	err := train.Run(context.Background(), c, train.Options{})
	if !errors.Is(err, train.ErrConfig) || !strings.Contains(err.Error(), "GPU memory") || !strings.Contains(err.Error(), "8 MB free") {
		t.Fatalf("a run needing more than the GPU's 8 MiB: %v; want a configuration error with the numbers", err)
	}
	if got := cuda.Counts().Sub(before); got.Allocs != 0 {
		t.Errorf("the refused run allocated %d buffers on the GPU first", got.Allocs)
	}
	t.Log(err)
}

// TestTrainReleasesStreamsAndHandles: a training run on the GPU — two
// in-process workers, each with its program's stream and cuBLAS handle,
// the reducers' and comm/local's streams — destroys every stream and
// library handle it made by the time it returns (the GPUs it opened are
// closed), and frees every device buffer it allocated, although the
// test's own Device of the same GPU keeps the primary context (which would
// otherwise keep them: the emulator grew to the machine's 24 GiB over
// cuda's tests before Close freed them).
func TestTrainReleasesStreamsAndHandles(t *testing.T) {
	gpu(t)
	live, ok := cuda.CountHandles(t)
	before := cuda.Counts()
	c := train.Config{Model: "ncf", Dataset: "ml-100k", DataDir: ml100k(t), Preset: "default", Batch: train.Set(64), Workers: train.Set(2), Steps: 3,
		Sparsifier: "topk", Density: train.Set(0.05), Device: "cuda", Out: t.TempDir(), Quiet: true, BLAS: "gonum", MaxEvalBatches: 1}
	if err := train.Run(context.Background(), c, train.Options{}); err != nil {
		t.Fatal(err)
	}
	if d := cuda.Counts().Sub(before); d.Allocs == 0 || d.Frees != d.Allocs {
		t.Errorf("the run allocated %d device buffers and freed %d", d.Allocs, d.Frees)
	}
	if !ok {
		t.Skip("counts the emulated driver's handles")
	}
	if s, b, d := live(); s != 0 || b != 0 || d != 0 {
		t.Errorf("after the run: %d streams, %d cuBLAS and %d cuDNN handles it made are not destroyed", s, b, d)
	}
}
