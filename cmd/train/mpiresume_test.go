package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// TestMPIResumeCommandRunsAsPrinted: a job started with mpirun
// --oversubscribe --allow-run-as-root -np 3 (more ranks than this
// machine's two cores, and CI runs as root) prints resume commands with
// those flags, and the command it prints runs as printed (the job's
// -resume of a completed run names one to continue it).
func TestMPIResumeCommandRunsAsPrinted(t *testing.T) {
	if testing.Short() {
		t.Skip("runs mpirun three times")
	}
	mpirun := testenv.MPIRun(t)
	d := testenv.SharedData(t, "ml-100k/u.data")
	// The test binary acts as train (mainEnv); named train, the commands
	// it prints name it by its path.
	dir := t.TempDir()
	prog := filepath.Join(dir, "train")
	copyFile(t, os.Args[0], prog)
	run := filepath.Join(dir, "run")
	launch := []string{"--oversubscribe", "--allow-run-as-root", "-np", "3", prog}
	mpi := func(args ...string) (int, string) {
		cmd, out := startMain(t, mpirun, append(launch, args...)...)
		code, _ := exitIn(t, cmd, 3*time.Minute, out)
		return code, out.String()
	}
	if code, out := mpi("-model", "ncf", "-data-dir", d, "-steps", "2", "-max-eval-batches", "1", "-out", run); code != 0 {
		t.Fatalf("the first job: exit %d\n%s", code, out)
	}
	code, out := mpi("-resume", run, "-steps", "2")
	m := regexp.MustCompile(`give a larger -steps \(e\.g\. (.*?)\), or -steps 0`).FindStringSubmatch(out)
	if code == 0 || m == nil {
		t.Fatalf("the resume of a complete run: exit %d\n%s", code, out)
	}
	want := mpirun + " --oversubscribe --allow-run-as-root -np 3 " + prog + " -resume " + run + " -steps 4"
	if m[1] != want {
		t.Fatalf("the printed command\n%s\nwant\n%s", m[1], want)
	}
	sh := testenv.Command(t, 3*time.Minute, "sh", "-c", m[1])
	sh.Env = append(os.Environ(), mainEnv+"=1")
	if b, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("the printed command %q: %v\n%s", m[1], err, b)
	}
	if got := stepsRecorded(run); got != 4 {
		t.Fatalf("after the printed command the run recorded %d steps, want 4", got)
	}
}

// copyFile copies an executable.
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestMPICtrlCSaysOneThing is a regression test: Ctrl-C on an mpirun job
// (SIGINT to the terminal's whole process group: mpirun and its ranks; then
// mpirun's own SIGTERM to the ranks) printed first "no checkpoint was
// written yet: start the run again with another -out (or delete DIR
// first)", then "the last checkpoint is DIR/checkpoints/step-… resume
// with: mpirun …": the stale first message told the user to delete a
// resumable run. Whatever the job prints must agree: if it names a
// checkpoint to resume from, nothing it printed says to delete the run or
// that no checkpoint exists; and the checkpoint it names exists.
func TestMPICtrlCSaysOneThing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs mpirun")
	}
	mpirun := testenv.MPIRun(t)
	d := testenv.SharedData(t, "ml-100k/u.data")
	dir := filepath.Join(t.TempDir(), "run")
	cmd, out := startMain(t, mpirun, append([]string{"--oversubscribe", "--allow-run-as-root", "-np", "2", os.Args[0]},
		append(resumeArgs, "-data-dir", d, "-batch", "32", "-out", dir)...)...)
	// In the first epoch (about 7,700 steps), before any checkpoint.
	waitFor(t, 2*time.Minute, "20 steps", func() bool { return stepsRecorded(dir) >= 20 })
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil { // a terminal's Ctrl-C
		t.Fatal(err)
	}
	code, _ := exitIn(t, cmd, time.Minute, out)
	msg := out.String()
	t.Logf("exit %d:\n%s", code, msg)
	if code == 0 {
		t.Fatal("an interrupted job exited 0")
	}
	m := regexp.MustCompile(`the last checkpoint is (\S+) \(step (\d+)\); resume with: (.*)`).FindStringSubmatch(msg)
	if m == nil {
		if !strings.Contains(msg, "no checkpoint") {
			t.Fatal("the job names neither a checkpoint to resume from nor that there is none")
		}
		return // killed before its checkpoint: then "none" is the truth
	}
	if _, err := os.Stat(filepath.Join(m[1], "shared.ckpt")); err != nil {
		t.Errorf("the named checkpoint %s is not complete: %v", m[1], err)
	}
	for _, bad := range []string{"no checkpoint was written yet", "delete " + dir, "no checkpoint exists yet to resume from\n"} {
		if strings.Contains(msg, bad) {
			t.Errorf("the job names checkpoint %s to resume from but also printed %q", m[1], bad)
		}
	}
}
