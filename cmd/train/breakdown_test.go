package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/reports"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// checkBreakdown reads a run's time breakdown, as its report stacks it, and
// requires every logged iteration's phases to add up to the iteration (to
// 1 µs) and to be >= 0. A run of one worker sends nothing: its
// communication phase (if any) must stay below 1 % of the iteration or
// 0.5 ms (a loaded machine's scheduler delayed a one-worker MiCRO's
// bookkeeping by 0.06 ms of a 3 ms NCF step under mpirun), and it waits
// for no other worker's turn.
func checkBreakdown(t *testing.T, what, dir string) {
	t.Helper()
	r, err := reports.ReadRun(dir)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if len(r.Steps) == 0 {
		t.Fatalf("%s: no step records", what)
	}
	for i, s := range r.Steps {
		sum := 0.0
		var parts []string
		for _, p := range r.Breakdown(i) {
			if !(p.Seconds >= 0) {
				t.Fatalf("%s: step %d: phase %q is %v", what, s.Step, p.Name, p.Seconds)
			}
			sum += p.Seconds
			parts = append(parts, p.Name+" "+strconv.FormatFloat(p.Seconds*1e3, 'f', 3, 64))
			if r.Info.Workers == 1 && (p.Name == "communication" && p.Seconds > max(0.01*s.TIter, 0.5e-3) || strings.Contains(p.Name, "turns")) {
				t.Errorf("%s: step %d: one worker shows %q %.3f ms", what, s.Step, p.Name, p.Seconds*1e3)
			}
		}
		if math.Abs(sum-s.TIter) > 1e-6 {
			t.Errorf("%s: step %d: phases add up to %.3f ms, the iteration took %.3f ms (%s)", what, s.Step, sum*1e3, s.TIter*1e3, strings.Join(parts, ", "))
		}
	}
}

// breakdownCases are the runs of TestBreakdownAddsUp: every sparsifier on 4
// workers (dense and LAGS overlapped), dense and LAGS not overlapped, dense
// in many small buckets, and dense and LAGS overlapped on one worker (the
// reduction runs alongside the backward pass with nothing to send).
func breakdownCases() [][]string {
	var cases [][]string
	for _, m := range sparsify.Names() {
		c := []string{"-sparsifier", m, "-workers", "4"}
		if meth, _ := sparsify.Lookup(m); m != "dense" {
			c = append(c, "-density", "0.05")
			if _, ok := meth.Param("dense_warmup"); ok {
				c = append(c, "-dense-warmup", "0") // sparse from the first step
			}
		}
		cases = append(cases, c)
	}
	return append(cases,
		[]string{"-sparsifier", "lags", "-workers", "4", "-density", "0.05", "-overlap", "off"},
		[]string{"-sparsifier", "dense", "-workers", "4", "-overlap", "off"},
		[]string{"-sparsifier", "dense", "-workers", "4", "-bucket-mb", "0.01"},
		[]string{"-sparsifier", "dense", "-workers", "1", "-overlap", "on"},
		[]string{"-sparsifier", "lags", "-workers", "1", "-density", "0.05", "-overlap", "on"},
		[]string{"-sparsifier", "micro", "-workers", "1", "-density", "0.05"})
}

// TestBreakdownAddsUp: the phases of every logged iteration add up to it,
// for every sparsifier, pipelined and not, for simulated workers taking
// turns on one executor and, without -short, for the same runs as mpirun
// jobs of as many processes (a record holds the times of one worker, the
// one the others waited for: the largest phases of different workers
// added up to 43 s for a 23.6 s iteration of simulated ResNet-18 LAGS).
func TestBreakdownAddsUp(t *testing.T) {
	data := testenv.SharedData(t, "ml-100k/u.data")
	common := []string{"-model", "ncf", "-dataset", "ml-100k", "-data-dir", data, "-steps", "6", "-quiet", "-max-eval-batches", "1"}
	for _, c := range breakdownCases() {
		name := strings.Join(c, " ")
		t.Run("simulated "+name, func(t *testing.T) {
			args := append(slices.Clone(common), c...)
			if c[1] != "lags" || c[3] != "1" {
				args = append(args, "-executors", "1")
			}
			args = append(args, "-out", filepath.Join(t.TempDir(), "run"))
			var out bytes.Buffer
			if err := run(context.Background(), args, &out, &out); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			checkBreakdown(t, name, args[len(args)-1])
		})
	}
	if testing.Short() {
		return
	}
	mpirun := testenv.MPIRun(t)
	for _, c := range breakdownCases() {
		name := strings.Join(c, " ")
		t.Run("mpirun "+name, func(t *testing.T) {
			np := c[3]
			dir := filepath.Join(t.TempDir(), "run")
			args := append([]string{"--oversubscribe", "--allow-run-as-root", "-np", np, os.Args[0]}, common...)
			args = append(append(args, c[:2]...), c[4:]...)
			args = append(args, "-out", dir)
			cmd := testenv.Command(t, 3*time.Minute, mpirun, args...)
			cmd.Env = append(os.Environ(), mainEnv+"=1")
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("mpirun %s: %v\n%s", strings.Join(args, " "), err, b)
			}
			checkBreakdown(t, name+" under mpirun", dir)
		})
	}
}
