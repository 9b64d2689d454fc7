//go:build unix

package conformance

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/comm/mpi"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

const (
	workerEnv = "SPARSEGRAD_MPI_REDUCER_WORKER"
	okMarker  = "REDUCERS-OK"
	iters     = 3
)

// TestReducersUnderMPIRun starts `mpirun -np N <this test binary>
// -test.run=^TestReducersWorker$` for N = 2, 3, 4.
func TestReducersUnderMPIRun(t *testing.T) {
	path := testenv.MPIRun(t)
	nps := []int{2, 3, 4}
	if testing.Short() {
		nps = []int{3}
	}
	for _, np := range nps {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			const timeout = 150 * time.Second
			cmd := testenv.Command(t, timeout, path, "--oversubscribe", "--allow-run-as-root", "-np", strconv.Itoa(np),
				os.Args[0], "-test.run=^TestReducersWorker$", "-test.v", "-test.timeout=140s")
			cmd.Env = append(os.Environ(), workerEnv+"=1")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			err := cmd.Run()
			if testenv.PastLimit(cmd) {
				t.Fatalf("mpirun -np %d did not finish within %v; output:\n%s", np, timeout, out.String())
			}
			if err != nil || strings.Count(out.String(), okMarker) != np {
				t.Fatalf("mpirun -np %d failed (%v); output:\n%s", np, err, out.String())
			}
			for _, line := range strings.Split(out.String(), "\n") {
				if strings.Contains(line, "skipped for") && strings.Contains(line, "rank 0") {
					t.Log(strings.TrimSpace(line))
				}
			}
			t.Logf("np=%d: %v", np, time.Since(start).Round(time.Millisecond))
		})
	}
}

func layout(t *testing.T) sparsify.Layout {
	l, err := sparsify.NewLayout([]string{"conv", "bn", "fc.w", "fc.b", "emb"}, []int{3000, 17, 1200, 10, 4099})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// options are the options of method: every method gets the same ones,
// restricted to those it declares.
func options(method string, l sparsify.Layout, c comm.Communicator) sparsify.Options {
	m, _ := sparsify.Lookup(method)
	return sparsify.Options{Density: 0.02, Layout: l, Comm: c, Seed: 42,
		Params: m.Applicable(sparsify.Values{"min_tensor": 100, "dense_warmup": 1, "merge_size": 2000, "bucket_mb": 0.005})}
}

// grad is rank q's gradient at iteration it; every rank can build every
// rank's.
func grad(q, it, n int) []float32 {
	rng := rand.New(rand.NewPCG(uint64(q)+7, uint64(it)))
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(rng.NormFloat64() * []float64{1e-3, 1e-2, 1, 10}[rng.IntN(4)])
	}
	return g
}

func f32bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return slices.Clone(unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x)))
}

// result is what one rank's reducer produced over the iterations.
type result struct {
	err  error
	outs [][]byte // per iteration: out, then residual
}

// runReducer runs name for iters iterations on c with error feedback.
func runReducer(ctx context.Context, name string, l sparsify.Layout, c comm.Communicator) result {
	r, err := sparsify.New(name, options(name, l, c))
	if err != nil {
		return result{err: err}
	}
	var res result
	residual := make([]float32, l.N)
	out := make([]float32, l.N)
	for it := 0; it < iters; it++ {
		acc := grad(c.Rank(), it, l.N)
		for i := range acc {
			acc[i] += residual[i]
		}
		if _, err := r.Reduce(ctx, acc, out, residual); err != nil {
			return result{err: fmt.Errorf("iteration %d: %w", it, err)}
		}
		res.outs = append(res.outs, f32bytes(out), f32bytes(residual))
	}
	return res
}

// TestReducersWorker runs inside each MPI process.
func TestReducersWorker(t *testing.T) {
	if os.Getenv(workerEnv) == "" {
		t.Skip("runs only under mpirun, started by TestReducersUnderMPIRun")
	}
	ctx := context.Background()
	c, err := mpi.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := layout(t)
	n, rank := c.Size(), c.Rank()
	names := sparsify.Names()
	if len(names) == 0 {
		t.Fatal("no reducer is registered")
	}
	for _, name := range names {
		mres := runReducer(ctx, name, l, c)
		if mres.err != nil {
			// A constructor that rejects this worker count (e.g. gtopk
			// at 3) rejects it on every rank alike, and on the local
			// backend too.
			lerr := local.Run(ctx, n, func(ctx context.Context, lc comm.Communicator) error {
				_, err := sparsify.New(name, options(name, l, lc))
				return err
			})
			if lerr == nil {
				t.Errorf("rank %d: %s failed on MPI but constructs on the local backend: %v", rank, name, mres.err)
			} else {
				fmt.Printf("rank %d: %s skipped for %d workers: %v\n", rank, name, n, mres.err)
			}
			continue
		}
		var lres result
		err := local.Run(ctx, n, func(ctx context.Context, lc comm.Communicator) error {
			r := runReducer(ctx, name, l, lc)
			if lc.Rank() == rank {
				lres = r
			}
			return r.err
		})
		if err != nil {
			t.Errorf("rank %d: %s on the local backend: %v", rank, name, err)
			continue
		}
		nonzero := false
		for i := 0; i < len(mres.outs); i += 2 {
			nonzero = nonzero || slices.ContainsFunc(mres.outs[i], func(b byte) bool { return b != 0 })
		}
		if !nonzero {
			t.Errorf("rank %d: %s: every output is zero, so the comparison proves nothing", rank, name)
		}
		for i := range mres.outs {
			if !bytes.Equal(mres.outs[i], lres.outs[i]) {
				what := []string{"output", "residual"}[i%2]
				t.Errorf("rank %d: %s: iteration %d: %s differs between MPI and the in-process backend", rank, name, i/2, what)
			}
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !t.Failed() {
		fmt.Printf("%s rank %d of %d: %d reducers\n", okMarker, rank, n, len(names))
	}
}
