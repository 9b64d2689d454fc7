package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/rundir"
	"github.com/sparsegrad/sparsegrad/train"
)

// TestMPIDenseOverlapBitIdentical: under a real mpirun -np 2 and 3, dense
// overlapped with the backward pass in many buckets (-bucket-mb 0.01,
// cutting the all-reduce's chunks) gives every step's loss and the final
// parameters bit for bit as one all-reduce after the backward pass
// (-overlap off -bucket-mb 0), and as the same workers simulated in one
// process.
func TestMPIDenseOverlapBitIdentical(t *testing.T) {
	mpirun := testenv.MPIRun(t)
	d := testenv.SharedData(t, "ml-100k/u.data")
	const steps = 6
	for _, np := range []int{2, 3} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			common := []string{"-model", "ncf", "-dataset", "ml-100k", "-data-dir", d, "-steps", strconv.Itoa(steps), "-sparsifier", "dense",
				"-quiet", "-max-eval-batches", "1", "-seed", "7", "-blas-threads", "1"}
			viaMPI := func(name string, extra ...string) string {
				out := filepath.Join(t.TempDir(), name)
				args := append([]string{"--oversubscribe", "--allow-run-as-root", "-np", strconv.Itoa(np), os.Args[0]}, append(append(slices.Clone(common), extra...), "-out", out)...)
				cmd := testenv.Command(t, 3*time.Minute, mpirun, args...)
				cmd.Env = append(os.Environ(), mainEnv+"=1")
				b, err := cmd.CombinedOutput()
				if testenv.PastLimit(cmd) {
					t.Fatalf("mpirun did not finish in time:\n%s", b)
				}
				if err != nil {
					t.Fatalf("mpirun %v: %v\n%s", extra, err, b)
				}
				return out
			}
			on := viaMPI("on", "-overlap", "on", "-bucket-mb", "0.01")
			off := viaMPI("off", "-overlap", "off", "-bucket-mb", "0")
			inproc := filepath.Join(t.TempDir(), "inproc")
			var out bytes.Buffer
			if err := run(context.Background(), append(slices.Clone(common), "-workers", strconv.Itoa(np), "-overlap", "on", "-bucket-mb", "0.01", "-out", inproc), &out, &out); err != nil {
				t.Fatalf("in-process: %v\n%s", err, out.String())
			}
			want := losses(t, off)
			if len(want) != steps {
				t.Fatalf("-overlap off: %d losses, want %d", len(want), steps)
			}
			wantP := finalParams(t, off)
			for name, dir := range map[string]string{"mpirun -overlap on": on, "in-process -overlap on": inproc} {
				got := losses(t, dir)
				if len(got) != steps {
					t.Fatalf("%s: %d losses, want %d", name, len(got), steps)
				}
				for s := range got {
					if math.Float64bits(got[s]) != math.Float64bits(want[s]) {
						t.Fatalf("%s, step %d: loss %v, -overlap off %v", name, s+1, got[s], want[s])
					}
				}
				p := finalParams(t, dir)
				if len(p) != len(wantP) {
					t.Fatalf("%s: %d parameters, -overlap off %d", name, len(p), len(wantP))
				}
				for j := range p {
					if math.Float32bits(p[j]) != math.Float32bits(wantP[j]) {
						t.Fatalf("%s: parameter %d is %v, -overlap off %v", name, j, p[j], wantP[j])
					}
				}
			}
		})
	}
}

// finalParams reads the parameters of the run directory's last checkpoint.
func finalParams(t *testing.T, dir string) []float32 {
	t.Helper()
	p, err := rundir.Latest(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := rundir.ReadCheckpoint[train.Config](p)
	if err != nil {
		t.Fatal(err)
	}
	return ck.Params
}
