package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/rundir/rundirtest"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// sameEnds fails the test where the two ends differ.
func sameEnds(t *testing.T, what string, a, b rundirtest.End) {
	t.Helper()
	if d := rundirtest.Diff(a, b); d != "" {
		t.Fatalf("%s: %s", what, d)
	}
}

// startMain starts this test binary as the train command (or mpirun with
// it) in a process group of its own, killed with it after startLimit (the
// callers' waits, waitFor and exitIn, are shorter) or at the test's end.
func startMain(t *testing.T, name string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := testenv.Command(t, startLimit, name, args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return cmd, &out
}

// startLimit bounds a process of startMain.
const startLimit = 5 * time.Minute

// waitFor polls until ok or the deadline.
func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !ok() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stepsRecorded counts the step records of a run directory.
func stepsRecorded(dir string) int {
	b, _ := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	return bytes.Count(b, []byte(`"type":"step"`))
}

// exitIn waits for cmd to end within d and returns its exit code.
func exitIn(t *testing.T, cmd *exec.Cmd, d time.Duration, out *bytes.Buffer) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(d):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatalf("the process did not end within %v:\n%s", d, out.String())
	}
	return cmd.ProcessState.ExitCode(), time.Since(start)
}

// resumeArgs train NCF with MiCRO (whose threshold is state) with
// batches so large that an epoch is some 120 steps of 2 workers (80 of 3):
// the runs cross epoch ends and their evaluations. (The dropout stream's
// state is tested in package train, with -preset default.)
var resumeArgs = []string{"-model", "ncf", "-dataset", "ml-100k", "-sparsifier", "micro", "-density", "0.05",
	"-batch", "2048", "-quiet", "-max-eval-batches", "2", "-seed", "3"}

// TestCtrlCThenResume: Ctrl-C (SIGINT) stops the command after its step
// with a checkpoint and one message naming the step, the checkpoint and the
// command that resumes, and a non-zero exit; that command, given only
// -resume (and a step limit), completes the run bit for bit as an
// uninterrupted one; a second Ctrl-C exits at once.
func TestCtrlCThenResume(t *testing.T) {
	if testing.Short() {
		t.Skip("long; runs in the full suite")
	}
	d := testenv.SharedData(t, "ml-100k/u.data")
	const steps = 300
	straight := filepath.Join(t.TempDir(), "straight")
	var out bytes.Buffer
	if err := run(context.Background(), append(resumeArgs, "-data-dir", d, "-workers", "2", "-steps", strconv.Itoa(steps), "-out", straight), &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	dir := filepath.Join(t.TempDir(), "run")
	cmd, cout := startMain(t, os.Args[0], append(resumeArgs, "-data-dir", d, "-workers", "2", "-out", dir)...)
	waitFor(t, time.Minute, "100 steps", func() bool { return stepsRecorded(dir) >= 100 })
	cmd.Process.Signal(os.Interrupt)
	code, took := exitIn(t, cmd, 30*time.Second, cout)
	msg := cout.String()
	t.Logf("exit %d after %v:\n%s", code, took, msg)
	m := regexp.MustCompile(`train: interrupted after step (\d+); the last checkpoint is (\S+) \(step (\d+)\); resume with: train -resume (\S+)`).FindStringSubmatch(msg)
	if code == 0 || m == nil || m[1] != m[3] || m[4] != dir || m[2] != filepath.Join(dir, "checkpoints", "step-"+strings.Repeat("0", 9-len(m[1]))+m[1]) {
		t.Fatalf("exit %d, output:\n%s\nwant a non-zero exit and the interruption's message", code, msg)
	}
	if n, _ := strconv.Atoi(m[1]); n >= steps {
		t.Fatalf("interrupted after step %d: too late for the test", n)
	}
	// The resume: only -resume, and the step limit of the straight run.
	out.Reset()
	if err := run(context.Background(), []string{"-resume", dir, "-steps", strconv.Itoa(steps)}, &out, &out); err != nil {
		t.Fatalf("resume: %v\n%s", err, out.String())
	}
	sameEnds(t, "interrupted and resumed vs straight", rundirtest.Read(t, straight), rundirtest.Read(t, dir))

	// A second Ctrl-C exits at once, in the middle of a step (the LSTM's
	// take long enough for the second to arrive during the first's).
	dir2 := filepath.Join(t.TempDir(), "twice")
	cmd, cout = startMain(t, os.Args[0], "-model", "lstm", "-data-dir", d, "-quiet", "-out", dir2)
	waitFor(t, 2*time.Minute, "a step", func() bool { return stepsRecorded(dir2) >= 1 })
	cmd.Process.Signal(os.Interrupt)
	waitFor(t, 10*time.Second, "the first Ctrl-C's message", func() bool { return strings.Contains(cout.String(), "Ctrl-C again") })
	cmd.Process.Signal(os.Interrupt)
	code, took = exitIn(t, cmd, 10*time.Second, cout)
	t.Logf("two Ctrl-C: exit %d after %v:\n%s", code, took, cout.String())
	if code != 130 || !strings.Contains(cout.String(), "again: exiting at once") || !strings.Contains(cout.String(), "no checkpoint was written yet") {
		t.Fatalf("two Ctrl-C: exit %d, output:\n%s", code, cout.String())
	}
}

// TestMPIKillThenResume: under a real mpirun, kill -9 of one rank ends the
// whole job within 10 s, naming the rank; mpirun ... train -resume DIR then
// completes the run, and its end (parameters, every rank's residual and
// reducer state, metrics) equals that of a job that was never interrupted.
func TestMPIKillThenResume(t *testing.T) {
	if testing.Short() {
		t.Skip("long; runs in the full suite")
	}
	mpirun := testenv.MPIRun(t)
	d := testenv.SharedData(t, "ml-100k/u.data")
	const np, steps = 3, 300
	mpi := []string{"--oversubscribe", "--allow-run-as-root", "-np", strconv.Itoa(np), os.Args[0]}
	mpiRun := func(args ...string) {
		t.Helper()
		cmd, out := startMain(t, mpirun, append(mpi, args...)...)
		if code, _ := exitIn(t, cmd, 3*time.Minute, out); code != 0 {
			t.Fatalf("mpirun %v: exit %d\n%s", args, code, out.String())
		}
	}
	straight := filepath.Join(t.TempDir(), "straight")
	mpiRun(append(resumeArgs, "-data-dir", d, "-steps", strconv.Itoa(steps), "-out", straight)...)

	dir := filepath.Join(t.TempDir(), "killed")
	cmd, out := startMain(t, mpirun, append(mpi, append(resumeArgs, "-data-dir", d, "-checkpoint-every", "50", "-out", dir)...)...)
	waitFor(t, 2*time.Minute, "the checkpoint of step 100", func() bool {
		_, err := os.Stat(filepath.Join(dir, "checkpoints", "step-000000100", "shared.ckpt"))
		return err == nil
	})
	victim := rankPID(t, cmd.Process.Pid, 1)
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code, took := exitIn(t, cmd, 20*time.Second, out)
	t.Logf("mpirun ended %v after kill -9 of rank 1, exit %d:\n%s", took, code, out.String())
	if code == 0 || took > 10*time.Second {
		t.Fatalf("mpirun exit %d %v after a rank was killed: want non-zero within 10 s", code, took)
	}
	if !regexp.MustCompile(`rank 1\b.*(signal 9|Killed)`).MatchString(out.String()) {
		t.Fatalf("the output does not name the killed rank:\n%s", out.String())
	}
	if n := stepsRecorded(dir); n >= steps {
		t.Fatalf("the killed job recorded %d steps: too late for the test", n)
	}
	mpiRun("-resume", dir, "-steps", strconv.Itoa(steps))
	sameEnds(t, "killed and resumed vs straight (mpirun)", rundirtest.Read(t, straight), rundirtest.Read(t, dir))
}

// rankPID finds the process of MPI rank r among mpirun's descendants.
func rankPID(t *testing.T, mpirunPID, r int) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(env, []byte(mainEnv+"=1")) {
			continue
		}
		if bytes.Contains(env, []byte("\x00OMPI_COMM_WORLD_RANK="+strconv.Itoa(r)+"\x00")) && descends(pid, mpirunPID) {
			return pid
		}
	}
	t.Fatalf("no process of rank %d under mpirun %d", r, mpirunPID)
	return 0
}

// descends reports whether pid is a descendant of anc.
func descends(pid, anc int) bool {
	for pid > 1 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 2 {
			return false
		}
		pid, _ = strconv.Atoi(f[1])
		if pid == anc {
			return true
		}
	}
	return false
}

// builtinSparsifiers are the methods the train binary registers itself,
// read before any test registers one of its own (a method a test registers
// exists in this process only, not in the ranks mpirun starts).
var builtinSparsifiers = sparsify.Names()

// TestMPIResumeEverySparsifier: for every sparsifier, mpirun -np 3 (gtopk:
// 2) train -steps 4, then mpirun ... train -resume DIR -steps 8, ends bit for
// bit where 8 uninterrupted steps of in-process workers end (parameters,
// optimizer state, every rank's part, every metric but the times; the
// first job's final evaluation at step 4 is the one extra record).
func TestMPIResumeEverySparsifier(t *testing.T) {
	if testing.Short() {
		t.Skip("long; runs in the full suite")
	}
	mpirun := testenv.MPIRun(t)
	d := testenv.SharedData(t, "ml-100k/u.data")
	for _, name := range builtinSparsifiers {
		t.Run(name, func(t *testing.T) {
			np := "3"
			if name == "gtopk" {
				np = "2"
			}
			args := []string{"-model", "ncf", "-dataset", "ml-100k", "-data-dir", d, "-sparsifier", name, "-density", "0.05",
				"-quiet", "-max-eval-batches", "2", "-seed", "5"}
			if m, _ := sparsify.Lookup(name); m.Params != nil {
				if _, ok := m.Param("dense_warmup"); ok {
					args = append(args, "-dense-warmup", "3") // the warm-up ends before the stop
				}
			}
			if name == "dragonn" {
				args = append(args, "-min-tensor", "0")
			}
			straight := filepath.Join(t.TempDir(), "straight")
			var out bytes.Buffer
			if err := run(context.Background(), append(args, "-workers", np, "-steps", "8", "-out", straight), &out, &out); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			dir := filepath.Join(t.TempDir(), "mpi")
			mpi := []string{"--oversubscribe", "--allow-run-as-root", "-np", np, os.Args[0]}
			for _, a := range [][]string{append(args, "-steps", "4", "-out", dir), {"-resume", dir, "-steps", "8"}} {
				cmd, out := startMain(t, mpirun, append(mpi, a...)...)
				if code, _ := exitIn(t, cmd, 2*time.Minute, out); code != 0 {
					t.Fatalf("mpirun %v: exit %d\n%s", a, code, out.String())
				}
			}
			got := rundirtest.Read(t, dir)
			var recs []map[string]any
			for _, r := range got.Records {
				if !(r["type"] == "eval" && r["step"] == 4.0) {
					recs = append(recs, r)
				}
			}
			if len(recs) == len(got.Records) {
				t.Fatal("no evaluation at step 4 in the stopped job's record")
			}
			got.Records = recs
			sameEnds(t, "mpirun 4 steps + resume vs 8 in-process steps", rundirtest.Read(t, straight), got)
		})
	}
}
