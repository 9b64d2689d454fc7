//go:build unix

package mpi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// The tests in this file run this test binary under a real mpirun. The
// launcher tests (TestMPIRun*) start `mpirun -np N <test binary>
// -test.run=^TestMPIWorker$` with the scenario in the environment;
// TestMPIWorker, which skips unless it was started that way, does the checks
// inside each MPI process. The reducers' conformance under mpirun (every
// registered method bit-identical to in-process workers) is in package
// comm/mpi/conformance (TestReducersUnderMPIRun), so that the backend's own
// tests do not depend on the reducers.

const (
	scenarioEnv = "SPARSEGRAD_MPI_TEST_SCENARIO"
	segEnv      = "SPARSEGRAD_MPI_TEST_SEGMENT"
	okMarker    = "MPI-WORKER-OK"
)

// mpirun runs the worker scenario on np processes and returns the combined
// output, the exit error and the wall time.
func mpirun(t *testing.T, np int, scenario string, timeout time.Duration, env ...string) (string, error, time.Duration) {
	t.Helper()
	path := testenv.MPIRun(t)
	args := []string{"--oversubscribe", "--allow-run-as-root", "-np", strconv.Itoa(np),
		os.Args[0], "-test.run=^TestMPIWorker$", "-test.v", "-test.timeout=" + (timeout - 5*time.Second).String()}
	// mpirun's children die with it (its process group) at the timeout.
	cmd := testenv.Command(t, timeout, path, args...)
	cmd.Env = append(os.Environ(), append(env, scenarioEnv+"="+scenario)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if testenv.PastLimit(cmd) {
		t.Fatalf("mpirun -np %d (%s) did not finish within %v; output:\n%s", np, scenario, timeout, out.String())
	}
	return out.String(), err, d
}

func TestMPIRunCalls(t *testing.T) {
	nps := []int{1, 2, 3, 4}
	if testing.Short() {
		nps = []int{2}
	}
	for _, np := range nps {
		// Small segments make many pipelined messages per block.
		segs := map[int][]string{3: {"", "16384"}, 4: {"", "65536"}}[np]
		if segs == nil {
			segs = []string{""}
		}
		for _, seg := range segs {
			t.Run(fmt.Sprintf("np=%d/segment=%s", np, seg), func(t *testing.T) {
				out, err, d := mpirun(t, np, "calls", 150*time.Second, segEnv+"="+seg)
				if err != nil || strings.Count(out, okMarker) != np || strings.Contains(out, "--- FAIL") {
					t.Fatalf("mpirun -np %d failed (%v) after %v; output:\n%s", np, err, d, out)
				}
				t.Logf("np=%d: %v", np, d.Round(time.Millisecond))
			})
		}
	}
}

func TestMPIRunDeadPeer(t *testing.T) {
	for _, sc := range []string{"exit", "kill"} {
		t.Run(sc, func(t *testing.T) {
			if testing.Short() && sc == "kill" {
				t.Skip("short mode")
			}
			out, err, d := mpirun(t, 3, "dead-"+sc, 60*time.Second)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("mpirun returned %v, want a non-zero exit; output:\n%s", err, out)
			}
			if d > 30*time.Second {
				t.Errorf("the job took %v to end after a peer died, want < 30s", d)
			}
			if strings.Contains(out, "SURVIVOR-SUCCESS") {
				t.Errorf("a survivor reported success although its peer died; output:\n%s", out)
			}
			t.Logf("mpirun exit code %d after %v", ee.ExitCode(), d.Round(time.Millisecond))
		})
	}
}

func TestMPIRunAbort(t *testing.T) {
	tests := []struct {
		scenario string
		want     []string
	}{
		{"go-error", []string{"rank 1 of 3 failed", "injected failure"}},
		{"panic", []string{"rank 2 of 3 failed", "panic: injected panic"}},
		{"ctx-timeout", []string{"rank 0 of 3", "context deadline exceeded", "aborted"}},
	}
	for _, tc := range tests {
		t.Run(tc.scenario, func(t *testing.T) {
			if testing.Short() && tc.scenario != "go-error" {
				t.Skip("short mode")
			}
			out, err, d := mpirun(t, 3, tc.scenario, 60*time.Second)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("mpirun returned %v, want a non-zero exit; output:\n%s", err, out)
			}
			if d > 30*time.Second {
				t.Errorf("the job took %v to end, want < 30s", d)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not contain %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "SURVIVOR-SUCCESS") {
				t.Errorf("a survivor reported success; output:\n%s", out)
			}
		})
	}
}

// TestMPIWorker is the body of the launcher tests; it runs only inside
// mpirun.
func TestMPIWorker(t *testing.T) {
	scenario := os.Getenv(scenarioEnv)
	if scenario == "" {
		t.Skip("runs only under mpirun, started by the TestMPIRun* tests")
	}
	if _, ok := Detect(); !ok {
		t.Fatal("started for an MPI scenario but Detect finds no launcher")
	}
	ctx := context.Background()
	switch scenario {
	case "calls":
		workerCalls(t)
	case "go-error", "panic":
		_ = Run(ctx, func(ctx context.Context, c comm.Communicator) error {
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			if scenario == "go-error" && c.Rank() == 1 {
				return errors.New("injected failure")
			}
			if scenario == "panic" && c.Rank() == 2 {
				panic("injected panic")
			}
			err := c.AllReduce(ctx, make(comm.Float32s, 1000))
			fmt.Println("SURVIVOR-SUCCESS", c.Rank(), err)
			return err
		})
	case "dead-exit", "dead-kill", "ctx-timeout":
		c, err := Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
		switch {
		case scenario == "dead-exit" && c.Rank() == 1:
			os.Exit(3)
		case scenario == "dead-kill" && c.Rank() == 1:
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		case scenario == "ctx-timeout" && c.Rank() == 0:
			tctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err := c.Recv(tctx, make(comm.Float32s, 4), 1, 7) // never sent
			t.Logf("Recv returned %v", err)
			time.Sleep(20 * time.Second) // the abort must end the process first
			fmt.Println("SURVIVOR-SUCCESS", c.Rank())
			return
		}
		err = c.AllReduce(ctx, make(comm.Float32s, 1000))
		fmt.Println("SURVIVOR-SUCCESS", c.Rank(), err)
	default:
		t.Fatalf("unknown scenario %q", scenario)
	}
}

// TestMPIRunWithoutCgo builds a program with CGO_ENABLED=0 and runs it under
// mpirun: the backend must not need cgo.
func TestMPIRunWithoutCgo(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: builds a program")
	}
	mpirunPath := testenv.MPIRun(t)
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is not on PATH (it runs this test): %v", err)
	}
	bin := t.TempDir() + "/nocgo"
	build := testenv.Command(t, 5*time.Minute, goTool, "build", "-o", bin, "./testdata/nocgo")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
	out, err := testenv.Command(t, 60*time.Second, mpirunPath, "--oversubscribe", "--allow-run-as-root", "-np", "3", bin).CombinedOutput()
	if err != nil || strings.Count(string(out), "NOCGO-OK") != 3 {
		t.Fatalf("mpirun of the CGO_ENABLED=0 binary: %v\n%s", err, out)
	}
}
