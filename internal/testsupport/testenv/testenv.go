// Package testenv decides, in one place, what a test does when something it
// needs from the machine is missing: a tool (mpirun, git, Chromium), a
// library (OpenBLAS, NVRTC, a GPU with NCCL), the ECharts script or the
// project's real data sets. By default such a test skips and says what to
// install. The environment variable SPARSEGRAD_REQUIRE turns those skips
// into failures: it lists the needs that must be met, separated by commas
// (for example SPARSEGRAD_REQUIRE=mpi,data,browser,nvrtc,openblas,smalldisk,
// as .ci/run sets, or SPARSEGRAD_REQUIRE=gpu on a GPU machine), or says "all".
// An unknown name in it fails every test that asks, so that a typo cannot
// turn the switch off.
//
// Long measurements that are not run by default are opted into by
// SPARSEGRAD_RUN, a list of their names in the same form (OptIn).
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode"
)

// Need names something a test needs from the machine.
type Need string

// The needs a test can name. Each one's doc says what meets it.
const (
	// MPI: Open MPI's mpirun on PATH and its libmpi.
	MPI Need = "mpi"
	// Data: the real data sets in the shared data folder.
	Data Need = "data"
	// Browser: headless Chromium and the ECharts script from npm.
	Browser Need = "browser"
	// NVRTC: NVIDIA's run-time compiler (no GPU needed).
	NVRTC Need = "nvrtc"
	// GPU: an NVIDIA GPU with its driver, and NCCL.
	GPU Need = "gpu"
	// OpenBLAS: the OpenBLAS library, loaded at run time.
	OpenBLAS Need = "openblas"
	// OneDNN: oneDNN's library (libdnnl), loaded at run time.
	OneDNN Need = "onednn"
	// Torch: a Python interpreter that imports torch (SPARSEGRAD_PYTHON,
	// /usr/bin/python3 or python3 on PATH).
	Torch Need = "torch"
	// Git: the git tool.
	Git Need = "git"
	// SmallDisk: mounting a small tmpfs, a file system that fills up
	// (internal/testsupport/smalldisk; needs root).
	SmallDisk Need = "smalldisk"
)

// needs lists every need, for the check of SPARSEGRAD_REQUIRE.
var needs = []Need{MPI, Data, Browser, NVRTC, GPU, OpenBLAS, OneDNN, Torch, Git, SmallDisk}

// Env and RunEnv are the switches' environment variables.
const (
	Env    = "SPARSEGRAD_REQUIRE"
	RunEnv = "SPARSEGRAD_RUN"
)

// replaced are the switches SPARSEGRAD_REQUIRE replaced: setting one fails
// the test instead of being ignored.
var replaced = map[string]Need{
	"SPARSEGRAD_DATA":      Data,
	"REPORTS_BROWSER":      Browser,
	"SPARSEGRAD_NVRTC":     NVRTC,
	"SPARSEGRAD_GPU":       GPU,
	"SPARSEGRAD_TORCH":     Torch,
	"SPARSEGRAD_SMALLDISK": SmallDisk,
}

// list parses a comma-separated list of names.
func list(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
}

// settingError returns what is wrong with the environment's switches, or "".
func settingError() string {
	for old, n := range replaced {
		if v := os.Getenv(old); v != "" {
			return fmt.Sprintf("%s=%s is no longer read: set %s=%s instead (a list of needs, or all)", old, v, Env, n)
		}
	}
	for _, s := range list(os.Getenv(Env)) {
		if s != "all" && !slices.Contains(needs, Need(s)) {
			return fmt.Sprintf("%s names %q, which is not a need: use a comma-separated list of %v, or all", Env, s, needs)
		}
	}
	return ""
}

// Required reports whether SPARSEGRAD_REQUIRE makes a missing n a failure.
// A wrong setting of the switches fails t.
func Required(t testing.TB, n Need) bool {
	t.Helper()
	if msg := settingError(); msg != "" {
		t.Fatal(msg)
	}
	return slices.ContainsFunc(list(os.Getenv(Env)), func(s string) bool { return s == "all" || Need(s) == n })
}

// Missing ends t because n is not met: it skips, or fails when
// SPARSEGRAD_REQUIRE names n. why says what is missing and how to install
// it.
func Missing(t testing.TB, n Need, why string) {
	t.Helper()
	if Required(t, n) {
		t.Fatalf("%s (and %s requires %s)", why, Env, n)
	}
	t.Skipf("skipping: %s; set %s=%s to make this a failure", why, Env, n)
}

// Check ends t through Missing when err is not nil; why prefixes err.
func Check(t testing.TB, n Need, err error, why string) {
	t.Helper()
	if err != nil {
		Missing(t, n, fmt.Sprintf("%s: %v", why, err))
	}
}

// Tool returns the path of the program name on PATH, or ends t through
// Missing with install, the way to get it.
func Tool(t testing.TB, n Need, name, install string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, n, fmt.Sprintf("%s is not on PATH; %s", name, install))
	}
	return p
}

// MPIRun returns the path of Open MPI's mpirun, or ends t through Missing.
//
// It also gives the mpirun jobs t starts (directly or through a program
// it runs) a session folder of their own for the rest of t, through the
// environment (t.Setenv: t must not be parallel). Open MPI creates its
// session folder (ompi.HOST.UID under the temporary folder) without
// tolerating a concurrent creation: two test binaries that start their
// first mpirun at the same moment on a fresh machine, as go test ./...
// does, fail with "A call to mkdir was unable to create the desired
// directory ... File exists".
func MPIRun(t testing.TB) string {
	t.Helper()
	path := Tool(t, MPI, "mpirun", "install Open MPI (apt-get install openmpi-bin libopenmpi-dev)")
	// A short path: Open MPI puts Unix sockets under it.
	dir, err := os.MkdirTemp("", "ompi")
	if err != nil {
		t.Fatalf("a session folder for mpirun: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	t.Setenv("OMPI_MCA_orte_tmpdir_base", dir) // Open MPI 4
	t.Setenv("PRTE_MCA_prte_tmpdir_base", dir) // Open MPI 5 (PRRTE)
	return path
}

// SharedData returns the absolute path of the project's real data sets,
// the folder shared/data beside the repository (../shared/data from its
// root, found from the test's working directory, its package's folder),
// if every probe (a path relative to it, e.g. "ml-100k/u.data") exists;
// otherwise it ends t through Missing.
func SharedData(t testing.TB, probes ...string) string {
	t.Helper()
	dir, err := os.Getwd()
	for err == nil {
		if _, serr := os.Stat(filepath.Join(dir, "go.mod")); serr == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			err = errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
	if err != nil {
		t.Fatalf("finding the repository's root: %v", err)
	}
	return DataDir(t, filepath.Join(filepath.Dir(dir), "shared", "data"), probes...)
}

// DataDir returns dir, the shared data folder as the caller's package sees
// it, if every probe (a path relative to dir) exists; otherwise it ends t
// through Missing.
func DataDir(t testing.TB, dir string, probes ...string) string {
	t.Helper()
	for _, p := range probes {
		path := filepath.Join(dir, p)
		if _, err := os.Stat(path); err != nil {
			Missing(t, Data, fmt.Sprintf("real data %s is missing (%v): put the data sets in the shared data folder (see data's Download and the README)", path, err))
		}
	}
	return dir
}

// OptIn skips t unless SPARSEGRAD_RUN names name (or says all): for long
// measurements and proofs that are not run by default. what says what the
// test does and how long it takes.
func OptIn(t testing.TB, name, what string) {
	t.Helper()
	for _, s := range list(os.Getenv(RunEnv)) {
		if s == name || s == "all" {
			return
		}
	}
	t.Skipf("skipping %s; run it with %s=%s", what, RunEnv, name)
}

// waitDelay is how long Wait waits, after the child's group was killed,
// for a grandchild that escaped it to let go of the child's output.
const waitDelay = 10 * time.Second

// pastLimit holds the commands of Command that were killed at their limit.
var pastLimit sync.Map // *exec.Cmd → struct{}

// Command is exec.Command for a child process that must not hang its test.
// The child runs in a process group of its own; the group (the child and
// everything it started) is killed when limit passes or the test ends, and
// Wait returns at most ten seconds after that even if a grandchild still
// holds the child's output. A kill at the limit is logged in the test, and
// PastLimit reports it.
func Command(t testing.TB, limit time.Duration, name string, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	t.Cleanup(cancel)
	cmd := CommandContext(ctx, name, args...)
	cmd.Cancel = func() error {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			pastLimit.Store(cmd, struct{}{})
			t.Logf("%s ran past the test's limit of %v: killing it and its process group", filepath.Base(name), limit)
		}
		return killGroup(cmd)
	}
	t.Cleanup(func() { pastLimit.Delete(cmd) })
	return cmd
}

// PastLimit reports whether cmd, made by Command, was killed because it ran
// past its limit.
func PastLimit(cmd *exec.Cmd) bool {
	_, ok := pastLimit.Load(cmd)
	return ok
}

// CommandContext is Command for a child whose life is not one test's: a
// build or a server that TestMain starts for all of a package's tests. The
// child runs in a process group of its own; the group is killed when ctx
// ends, and Wait returns at most ten seconds after that.
func CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return killGroup(cmd) }
	cmd.WaitDelay = waitDelay
	return cmd
}

// killGroup kills cmd's process group.
func killGroup(cmd *exec.Cmd) error {
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing %s's process group: %w (%w)", filepath.Base(cmd.Path), err, os.ErrProcessDone)
	}
	return nil
}
