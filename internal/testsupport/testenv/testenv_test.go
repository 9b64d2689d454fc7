package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// recorder stands for a test: it records how the helper ended it.
type recorder struct {
	testing.TB
	ended string // "fatal", "skip" or ""
	msg   string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatal(args ...any) {
	if r.ended == "" {
		r.ended, r.msg = "fatal", fmt.Sprint(args...)
	}
}
func (r *recorder) Fatalf(f string, args ...any) { r.Fatal(fmt.Sprintf(f, args...)) }
func (r *recorder) Skipf(f string, args ...any) {
	if r.ended == "" {
		r.ended, r.msg = "skip", fmt.Sprintf(f, args...)
	}
}

// TestMissing: a missing need skips, fails when SPARSEGRAD_REQUIRE names it
// (or says all), and any wrong setting fails whatever the need.
func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		env, old string
		need     Need
		want     string // how the test ends
		msg      string // in its message
	}{
		{"", "", MPI, "skip", "SPARSEGRAD_REQUIRE=mpi"},
		{"mpi", "", MPI, "fatal", "requires mpi"},
		{"data, mpi ,browser", "", MPI, "fatal", "requires mpi"},
		{"data,browser", "", MPI, "skip", "no thing"},
		{"all", "", GPU, "fatal", "requires gpu"},
		{"mpi,smalldisk", "", SmallDisk, "fatal", "requires smalldisk"},
		{"mpi,dta", "", MPI, "fatal", `"dta", which is not a need`},
		{"", "require", Data, "fatal", "SPARSEGRAD_DATA=require is no longer read: set SPARSEGRAD_REQUIRE=data"},
	} {
		t.Run(tc.env+"/"+tc.old, func(t *testing.T) {
			t.Setenv(Env, tc.env)
			t.Setenv("SPARSEGRAD_DATA", tc.old)
			r := &recorder{}
			Missing(r, tc.need, "no thing")
			if r.ended != tc.want || !strings.Contains(r.msg, tc.msg) {
				t.Fatalf("ended %q with %q, want %q with %q", r.ended, r.msg, tc.want, tc.msg)
			}
		})
	}
}

// TestToolAndData: a program on PATH and data that exist end nothing;
// missing ones end the test through Missing.
func TestToolAndData(t *testing.T) {
	t.Setenv(Env, "git")
	r := &recorder{}
	if p := Tool(r, Git, "go", "install Go"); p == "" || r.ended != "" {
		t.Fatalf("go: %q, ended %q", p, r.ended)
	}
	Tool(r, Git, "no-such-program-sparsegrad", "install it")
	if r.ended != "fatal" || !strings.Contains(r.msg, "no-such-program-sparsegrad is not on PATH; install it") {
		t.Fatalf("ended %q with %q", r.ended, r.msg)
	}
	r = &recorder{}
	dir := t.TempDir()
	if DataDir(r, dir); r.ended != "" {
		t.Fatalf("no probe: ended %q", r.ended)
	}
	DataDir(r, dir, "ml-100k/u.data")
	if r.ended != "skip" || !strings.Contains(r.msg, "ml-100k/u.data is missing") {
		t.Fatalf("ended %q with %q", r.ended, r.msg)
	}
}

// TestOptIn: a measurement runs only when SPARSEGRAD_RUN names it.
func TestOptIn(t *testing.T) {
	for _, tc := range []struct {
		env  string
		skip bool
	}{{"", true}, {"memory", true}, {"proofs,memory", false}, {"all", false}} {
		t.Setenv(RunEnv, tc.env)
		r := &recorder{}
		OptIn(r, "proofs", "the proof")
		if (r.ended == "skip") != tc.skip || (tc.skip && !strings.Contains(r.msg, "SPARSEGRAD_RUN=proofs")) {
			t.Errorf("%q: ended %q with %q", tc.env, r.ended, r.msg)
		}
	}
}

// TestOneSwitch: no file of the repository reads a replaced switch or looks
// up mpirun itself, so that SPARSEGRAD_REQUIRE reaches every test that
// needs something.
func TestOneSwitch(t *testing.T) {
	var bad []string
	for path, b := range repoFiles(t) {
		for old := range replaced {
			if bytes.Contains(b, []byte(old+"=")) || bytes.Contains(b, []byte(`"`+old+`"`)) {
				bad = append(bad, path+": "+old)
			}
		}
		for _, s := range []string{`LookPath("mpirun")`, `"SPARSEGRAD_PROOFS"`, `"SPARSEGRAD_MEMORY"`} {
			if bytes.Contains(b, []byte(s)) {
				bad = append(bad, path+": "+s)
			}
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		t.Fatalf("use internal/testsupport/testenv instead of:\n%s", strings.Join(bad, "\n"))
	}
}

// TestChildrenUseCommand: no test starts a child process with os/exec
// itself, so that none can hang on a child (or a grandchild holding its
// output): Command or CommandContext kill the child with its process group.
func TestChildrenUseCommand(t *testing.T) {
	var bad []string
	for path, b := range repoFiles(t) {
		if !strings.HasSuffix(path, "_test.go") {
			continue
		}
		for _, s := range []string{"exec.Command(", "exec.CommandContext("} {
			if bytes.Contains(b, []byte(s)) {
				bad = append(bad, path+": "+s)
			}
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		t.Fatalf("start a test's child process with testenv.Command (or testenv.CommandContext in TestMain), not:\n%s", strings.Join(bad, "\n"))
	}
}

// repoFiles reads the repository's Go, shell, Markdown and extensionless
// files, by path, outside this package, .git, node_modules and hidden
// folders.
func repoFiles(t *testing.T) map[string][]byte {
	t.Helper()
	root := filepath.Join("..", "..")
	files := map[string][]byte{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == ".git" || n == "testenv" || n == "node_modules" || (strings.HasPrefix(n, ".") && path != root) {
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(path)
		if ext != ".go" && ext != ".sh" && ext != "" && ext != ".md" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files[path] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestCommandKillsAtLimit runs a shell whose child keeps the output open:
// at the limit the whole group dies and CombinedOutput returns promptly with
// an error, while a command that ends in time gives its output.
func TestCommandKillsAtLimit(t *testing.T) {
	for _, c := range []struct {
		name    string
		script  string
		limit   time.Duration
		wantErr bool
		want    string
	}{
		{"in time", "echo done", 30 * time.Second, false, "done\n"},
		{"hangs with a grandchild", "echo started; sleep 60 & sleep 60", 500 * time.Millisecond, true, "started\n"},
		{"fails", "echo bad; exit 3", 30 * time.Second, true, "bad\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			cmd := Command(t, c.limit, "sh", "-c", c.script)
			out, err := cmd.CombinedOutput()
			if took := time.Since(start); took > c.limit+5*time.Second {
				t.Fatalf("returned after %v, limit %v", took, c.limit)
			}
			if (err != nil) != c.wantErr || string(out) != c.want {
				t.Fatalf("output %q, error %v; want %q, an error: %v", out, err, c.want, c.wantErr)
			}
			if past := c.limit < time.Second; PastLimit(cmd) != past {
				t.Fatalf("PastLimit: %v, want %v", PastLimit(cmd), past)
			}
		})
	}
}

// TestCommandContextKillsAtEnd: when its context ends, a child of
// CommandContext dies with the grandchild that holds its output, and Wait
// returns promptly.
func TestCommandContextKillsAtEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	out, err := CommandContext(ctx, "sh", "-c", "echo started; sleep 60 & sleep 60").CombinedOutput()
	if took := time.Since(start); took > 5*time.Second || err == nil || string(out) != "started\n" {
		t.Fatalf("returned after %v with output %q, error %v; want the first line and an error within 5 s", took, out, err)
	}
}
