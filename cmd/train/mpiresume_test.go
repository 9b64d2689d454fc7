package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
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
