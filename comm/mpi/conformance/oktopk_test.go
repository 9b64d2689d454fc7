//go:build unix

package conformance

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/comm/mpi"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

const (
	okWorkerEnv = "SPARSEGRAD_MPI_OKTOPK_WORKER"
	okOKMarker  = "OKTOPK-OK"
)

// okRuns are the reducer runs the worker compares: method, density, calls
// (after a 2-call dense warm-up).
var okRuns = []struct {
	method  string
	density float64
	iters   int
}{
	{"oktopk", 0.02, 140},
	{"oktopk", 1e-9, 40}, // k = 1
	{"topkdsa", 0.02, 12},
	{"topkdsa", 0.3, 6}, // the owners' sums travel dense
}

// TestOkMethodsUnderMPIRun starts `mpirun -np N <this test binary>
// -test.run=^TestOkMethodsWorker$` for N = 3 and 5. TestReducersUnderMPIRun
// runs every reducer for 3 calls; the region methods of the Ok-Topk code
// have a schedule (oktopk recomputes its thresholds every 32 calls and
// re-balances its regions every 64) and a point-to-point exchange that runs 4
// destinations at a time, so they get longer runs here, and 5 processes (two
// groups of destinations).
func TestOkMethodsUnderMPIRun(t *testing.T) {
	path := testenv.MPIRun(t)
	nps := []int{3, 5}
	if testing.Short() {
		nps = []int{5}
	}
	for _, np := range nps {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			const timeout = 150 * time.Second
			cmd := testenv.Command(t, timeout, path, "--oversubscribe", "--allow-run-as-root", "-np", strconv.Itoa(np),
				os.Args[0], "-test.run=^TestOkMethodsWorker$", "-test.v", "-test.timeout=140s")
			cmd.Env = append(os.Environ(), okWorkerEnv+"=1")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			err := cmd.Run()
			if testenv.PastLimit(cmd) {
				t.Fatalf("mpirun -np %d did not finish within %v; output:\n%s", np, timeout, out.String())
			}
			if err != nil || strings.Count(out.String(), okOKMarker) != np {
				t.Fatalf("mpirun -np %d failed (%v); output:\n%s", np, err, out.String())
			}
			t.Logf("np=%d: %v", np, time.Since(start).Round(time.Millisecond))
		})
	}
}

// okRun runs method for iters calls on c with error feedback and returns
// out and residual of every call (as bytes) and the last call's Stats.
func okRun(ctx context.Context, method string, density float64, iters int, l sparsify.Layout, c comm.Communicator) ([][]byte, sparsify.Stats, error) {
	o := options(method, l, c)
	o.Density, o.Params["dense_warmup"] = density, 2
	r, err := sparsify.New(method, o)
	if err != nil {
		return nil, sparsify.Stats{}, err
	}
	var outs [][]byte
	var st sparsify.Stats
	residual := make([]float32, l.N)
	out := make([]float32, l.N)
	for it := 0; it < iters; it++ {
		acc := grad(c.Rank(), it, l.N)
		for i := range acc {
			acc[i] += residual[i]
		}
		if st, err = r.Reduce(ctx, acc, out, residual); err != nil {
			return nil, st, fmt.Errorf("iteration %d: %w", it, err)
		}
		outs = append(outs, f32bytes(out), f32bytes(residual))
	}
	return outs, st, nil
}

// TestOkMethodsWorker runs inside each MPI process: every run of okRuns on
// the MPI backend and on the in-process backend must give bit-identical
// outputs and residuals on every call, and the same bytes.
func TestOkMethodsWorker(t *testing.T) {
	if os.Getenv(okWorkerEnv) == "" {
		t.Skip("runs only under mpirun, started by TestOkMethodsUnderMPIRun")
	}
	ctx := context.Background()
	c, err := mpi.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := layout(t)
	n, rank := c.Size(), c.Rank()
	for _, run := range okRuns {
		name := fmt.Sprintf("%s density %g", run.method, run.density)
		mout, mst, err := okRun(ctx, run.method, run.density, run.iters, l, c)
		if err != nil {
			t.Fatalf("rank %d: %s on MPI: %v", rank, name, err)
		}
		var lout [][]byte
		var lst sparsify.Stats
		err = local.Run(ctx, n, func(ctx context.Context, lc comm.Communicator) error {
			o, st, err := okRun(ctx, run.method, run.density, run.iters, l, lc)
			if lc.Rank() == rank {
				lout, lst = o, st
			}
			return err
		})
		if err != nil {
			t.Fatalf("rank %d: %s on the local backend: %v", rank, name, err)
		}
		nonzero := false
		for i := range mout {
			if i%2 == 0 && slices.ContainsFunc(mout[i], func(b byte) bool { return b != 0 }) {
				nonzero = true
			}
			if !bytes.Equal(mout[i], lout[i]) {
				t.Errorf("rank %d: %s: call %d: %s differs between MPI and the in-process backend", rank, name, i/2, []string{"output", "residual"}[i%2])
			}
		}
		if !nonzero {
			t.Errorf("rank %d: %s: every output is zero, so the comparison proves nothing", rank, name)
		}
		if mst.BytesSent != lst.BytesSent || mst.BytesRecv != lst.BytesRecv || mst.ActualDensity != lst.ActualDensity || mst.Selected != lst.Selected {
			t.Errorf("rank %d: %s: last call's stats differ: MPI %+v, in-process %+v", rank, name, mst, lst)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !t.Failed() {
		fmt.Printf("%s rank %d of %d: %d runs\n", okOKMarker, rank, n, len(okRuns))
	}
}
