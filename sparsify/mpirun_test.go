//go:build unix

package sparsify

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/comm/mpi"
)

// mpiWorkerEnv makes TestReducersMPIWorker run: TestReducersUnderMPI starts
// this test binary under mpirun with it set to a directory, where each rank
// writes its lines to rank-R.txt (the processes' standard outputs would
// interleave mid-line).
const mpiWorkerEnv = "SPARSEGRAD_SPARSIFY_MPI_WORKER"

// conformanceLayout is the layout every method reduces in the MPI
// conformance test: tensors of awkward sizes, one large enough for DRAGONN's
// sampling and DEFT's splitting.
func conformanceLayout() (Layout, error) {
	return NewLayout([]string{"a", "b", "c", "d", "e"}, []int{1, 700, 45, 2001, 300})
}

// conformanceDigests runs method for three iterations on rank c.Rank() of
// c (error feedback: acc = residual + a fresh deterministic gradient) and
// returns one line per iteration: a digest of the bits of out and of the
// residual and the statistics that do not depend on timing. A method that
// cannot be built for c.Size() ranks gives one line with its error.
func conformanceDigests(ctx context.Context, c comm.Communicator, method string) ([]string, error) {
	l, err := conformanceLayout()
	if err != nil {
		return nil, err
	}
	r, err := New(method, Options{Density: 0.05, Layout: l, Comm: c, Seed: 11, MinTensor: -1, Warmup: -1, MergeSize: 500})
	if err != nil {
		return []string{fmt.Sprintf("%s rank %d: not built: %v", method, c.Rank(), err)}, nil
	}
	var lines []string
	res := make([]float32, l.N)
	for it := range 3 {
		acc := make([]float32, l.N)
		genNormal(harnessRNG(99, it, c.Rank()), acc)
		for i := range acc {
			acc[i] += res[i]
		}
		out := make([]float32, l.N)
		st, err := r.Reduce(ctx, acc, out, res)
		if err != nil {
			return nil, fmt.Errorf("%s rank %d iteration %d: %w", method, c.Rank(), it, err)
		}
		h := sha256.New()
		for _, v := range [][]float32{out, res} {
			for _, x := range v {
				binary.Write(h, binary.LittleEndian, math.Float32bits(x))
			}
		}
		lines = append(lines, fmt.Sprintf("%s rank %d iteration %d: %x selected %d per-worker %v actual %v error %v threshold %v bytes %d/%d layer-k %v",
			method, c.Rank(), it, h.Sum(nil)[:12], st.Selected, st.SelectedPerWorker, st.ActualDensity, st.ErrorNorm, st.Threshold, st.BytesSent, st.BytesRecv, st.LayerK))
	}
	return lines, nil
}

// TestReducersUnderMPI is the conformance of every registered method under
// a real mpirun: N processes over Open MPI must produce, rank by rank and
// iteration by iteration, bit-identical outputs, residuals and statistics
// to N in-process workers (comm/local) given the same inputs, for an odd and
// an even N. It skips where mpirun is not installed.
func TestReducersUnderMPI(t *testing.T) {
	path, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("skipping: mpirun not found in PATH; install Open MPI (apt-get install openmpi-bin libopenmpi-dev) to run the MPI tests")
	}
	nps := []int{3, 4}
	if testing.Short() {
		nps = []int{3}
	}
	for _, np := range nps {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			// The in-process reference.
			want := map[string]bool{}
			var mu sync.Mutex
			err := local.Run(context.Background(), np, func(ctx context.Context, c comm.Communicator) error {
				for _, m := range Names() {
					lines, err := conformanceDigests(ctx, c, m)
					if err != nil {
						return err
					}
					mu.Lock()
					for _, l := range lines {
						want[l] = true
					}
					mu.Unlock()
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, path, "--oversubscribe", "--allow-run-as-root", "-np", strconv.Itoa(np),
				os.Args[0], "-test.run=^TestReducersMPIWorker$", "-test.v", "-test.timeout=170s")
			dir := t.TempDir()
			cmd.Env = append(os.Environ(), mpiWorkerEnv+"="+dir)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("mpirun -np %d did not finish in time; output:\n%s", np, out)
			}
			if err != nil || bytes.Contains(out, []byte("--- FAIL")) {
				t.Fatalf("mpirun -np %d: %v; output:\n%s", np, err, out)
			}
			got := map[string]bool{}
			for r := range np {
				b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.txt", r)))
				if err != nil {
					t.Fatalf("rank %d wrote no results (%v); mpirun output:\n%s", r, err, out)
				}
				for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
					got[l] = true
				}
			}
			var missing, extra []string
			for l := range want {
				if !got[l] {
					missing = append(missing, l)
				}
			}
			for l := range got {
				if !want[l] {
					extra = append(extra, l)
				}
			}
			slices.Sort(missing)
			slices.Sort(extra)
			if len(missing)+len(extra) > 0 {
				t.Fatalf("mpirun -np %d differs from %d in-process workers:\nin-process only:\n  %s\nmpirun only:\n  %s",
					np, np, strings.Join(missing, "\n  "), strings.Join(extra, "\n  "))
			}
			t.Logf("np=%d: %d lines identical (%d methods)", np, len(want), len(Names()))
		})
	}
}

// TestReducersMPIWorker is the body of TestReducersUnderMPI inside each MPI
// process; it skips unless started by it.
func TestReducersMPIWorker(t *testing.T) {
	dir := os.Getenv(mpiWorkerEnv)
	if dir == "" {
		t.Skip("runs only under mpirun, started by TestReducersUnderMPI")
	}
	if _, ok := mpi.Detect(); !ok {
		t.Fatal("started for the MPI conformance but no MPI launcher is detected")
	}
	err := mpi.Run(context.Background(), func(ctx context.Context, c comm.Communicator) error {
		var all []string
		for _, m := range Names() {
			lines, err := conformanceDigests(ctx, c, m)
			if err != nil {
				return err
			}
			all = append(all, lines...)
		}
		return os.WriteFile(filepath.Join(dir, fmt.Sprintf("rank-%d.txt", c.Rank())), []byte(strings.Join(all, "\n")+"\n"), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
