package main

// Tests of what a person sees in the terminal: each runs the train command
// as a separate process (this test binary acting as main) and reads its
// exit status, standard output and standard error.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// cmdResult is what one command left on the terminal.
type cmdResult struct {
	stdout, stderr string
	code           int
}

func (r cmdResult) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

// trainCmd runs `train args...` in dir (the test's folder when empty).
func trainCmd(t *testing.T, dir string, args ...string) cmdResult {
	t.Helper()
	exe, err := filepath.Abs(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	cmd := testenv.Command(t, 5*time.Minute, exe, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	r := cmdResult{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("train %v: %v", args, err)
	}
	if testenv.PastLimit(cmd) {
		t.Fatalf("train %v did not finish in time:\n%v", args, r)
	}
	return r
}

// lines returns the non-empty lines of s.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// TestHelpExitsZero: asking for help is not an error; the usage goes to
// standard output (so that `train -help | less` works).
func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"-help"}, {"-h"}, {"report", "-help"}} {
		r := trainCmd(t, t.TempDir(), args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage") || r.stderr != "" {
			t.Errorf("train %v:\n%v", args, r)
		}
	}
}

// TestMistakesAreOneLine: a mistyped flag, a flag without its value, an
// unknown model and a missing data set each give exit status 2 and one
// line on standard error that names the mistake and its fix, and nothing
// else (no usage above it, no knock-on errors, no Go function to call).
func TestMistakesAreOneLine(t *testing.T) {
	empty := t.TempDir()
	for _, tc := range []struct {
		args []string
		want []string // in the one line
	}{
		{[]string{"-worker", "4", "-out", "x"}, []string{"-worker", "did you mean -workers?", "train -help"}},
		{[]string{"-sparsfier", "topk", "-out", "x"}, []string{"did you mean -sparsifier?"}},
		{[]string{"-out", "x", "-density"}, []string{"flag needs an argument: -density"}},
		{[]string{"-model", "bogus", "-out", "x"}, []string{`unknown -model "bogus"`, "resnet18, lstm, ncf"}},
		{[]string{"-model", "ncf", "-data-dir", empty, "-out", "x"}, []string{"ml-100k", empty, "-download"}},
		{[]string{"-model", "lstm", "-data-dir", empty, "-out", "x"}, []string{"wikitext2", empty, "-download"}},
		{[]string{"-model", "resnet18", "-data-dir", empty, "-out", "x"}, []string{"cifar10", empty, "-download"}},
		{[]string{"-density", "0", "-out", "x"}, []string{"-density 0", "(0, 1]"}},
		{[]string{"-workers", "0", "-out", "x"}, []string{"-workers 0", ">= 1"}},
		{[]string{"-net-latency", "abc", "-net-bandwidth", "10", "-out", "x"}, []string{"-net-latency", `"abc" is not a duration`, "50us"}},
		{[]string{"-max-time", "5", "-out", "x"}, []string{"-max-time", `"5" has no unit`, "5m"}},
		{[]string{"report", "-x", "runs/a"}, []string{"-x", "train report -help"}},
		{[]string{"report", "runs/a", "runs/b"}, []string{"train report: runs/a: no such folder", "train -out"}},
		{[]string{"advise", "-model", "ncf"}, []string{"train advise: give -workers P"}},
		{[]string{"sweep", "-preset", "nope", "-out", "x"}, []string{`unknown preset "nope"`}},
	} {
		oneLine(t, tc.args, tc.want)
	}
}

// oneLine runs train args (with -out x, when they have it, relative to a
// folder of its own) and checks that it exits 2 with one line on stderr
// that holds every want, carries one prefix and no Go names, and leaves no
// run folder x.
func oneLine(t *testing.T, args, want []string) {
	t.Helper()
	dir := t.TempDir()
	r := trainCmd(t, dir, args...)
	ls := lines(r.stderr)
	if r.code != 2 || len(ls) != 1 || r.stdout != "" {
		t.Errorf("train %v: want exit 2 and one line on stderr, got\n%v", args, r)
		return
	}
	for _, w := range want {
		if !strings.Contains(ls[0], w) {
			t.Errorf("train %v: %q lacks %q", args, ls[0], w)
		}
	}
	if n := strings.Count(ls[0], "train: ") + strings.Count(ls[0], "train report: ") + strings.Count(ls[0], "train advise: ") + strings.Count(ls[0], "train sweep: "); n != 1 {
		t.Errorf("train %v: %q does not carry exactly one prefix", args, ls[0])
	}
	for _, bad := range []string{"data.Download", "ctx", "Config.Defaults", "unset", "stat "} {
		if strings.Contains(ls[0], bad) {
			t.Errorf("train %v: %q mentions %q, which means nothing on the command line", args, ls[0], bad)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); err == nil {
		t.Errorf("train %v: a refused command left a run folder", args)
	}
}

// stepLosses returns the step records' losses of a run directory by epoch.
func stepLosses(t *testing.T, dir string) map[int][]float64 {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[int][]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			Type  string  `json:"type"`
			Epoch int     `json:"epoch"`
			Loss  float64 `json:"loss"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.Type == "step" {
			out[r.Epoch] = append(out[r.Epoch], r.Loss)
		}
	}
	return out
}

var epochLine = regexp.MustCompile(`(?m)^epoch (\d+)/\d+: mean loss ([0-9.]+),`)

// TestRunTellsTheTruth trains NCF on ml-100k for two short epochs (a large
// batch) and reads the terminal: each epoch's line
// gives the mean loss of the epoch's steps as metrics.jsonl records them
// (not the last step's), and the last line says where the report is.
func TestRunTellsTheTruth(t *testing.T) {
	d := testenv.SharedData(t, "ml-100k/u.data")
	base := t.TempDir()
	// 99,057 training ratings × 5 samples per rating / (2 workers × 8192):
	// about 30 steps per epoch.
	r := trainCmd(t, base, "-model", "ncf", "-dataset", "ml-100k", "-data-dir", d, "-workers", "2", "-batch", "8192",
		"-epochs", "2", "-sparsifier", "topk", "-density", "0.1", "-out", "run")
	if r.code != 0 {
		t.Fatalf("training failed:\n%v", r)
	}
	if strings.Contains(r.stdout, "report.html not written") && strings.Contains(r.stdout, "ECharts") {
		testenv.Missing(t, testenv.Browser, fmt.Sprintf("the reports package cannot obtain ECharts here:\n%v", r))
	}
	byEpoch := stepLosses(t, filepath.Join(base, "run"))
	ms := epochLine.FindAllStringSubmatch(r.stdout, -1)
	if len(ms) != 2 {
		t.Fatalf("want two epoch lines, got:\n%v", r)
	}
	for _, m := range ms {
		e, _ := strconv.Atoi(m[1])
		printed, _ := strconv.ParseFloat(m[2], 64)
		ls := byEpoch[e]
		if len(ls) < 10 {
			t.Fatalf("epoch %d has %d step records", e, len(ls))
		}
		sum := 0.0
		for _, l := range ls {
			sum += l
		}
		mean, last := sum/float64(len(ls)), ls[len(ls)-1]
		if math.Abs(printed-mean) > 0.00006 {
			t.Errorf("epoch %d: printed loss %v, but the mean of its %d steps is %.5f (last step %.5f)", e, printed, len(ls), mean, last)
		}
		if math.Abs(mean-last) < 0.0002 {
			t.Logf("epoch %d: the mean and the last loss nearly coincide (%.5f, %.5f); the check above cannot tell them apart", e, mean, last)
		}
	}
	ls := lines(r.stdout)
	want := "report: " + filepath.Join("run", "report.html")
	if len(ls) == 0 || !strings.HasPrefix(ls[len(ls)-1], want) {
		t.Fatalf("the last line does not say where the report is (want %q):\n%v", want, r)
	}
	if _, err := os.Stat(filepath.Join(base, "run", "report.html")); err != nil {
		t.Fatal(err)
	}
}

// TestReportCommand: train report takes its flags before or after the run
// directories, prints the page it wrote, and without -o writes
// compare.html beside the runs, not into the folder it was started from;
// given one run, it rewrites that run's page.
func TestReportCommand(t *testing.T) {
	d := testenv.SharedData(t, "ml-100k/u.data")
	base := t.TempDir()
	runs := filepath.Join(base, "runs")
	for _, s := range []string{"dense", "topk"} {
		r := trainCmd(t, base, "-model", "ncf", "-data-dir", d, "-workers", "2", "-steps", "3", "-sparsifier", s,
			"-density", "0.1", "-max-eval-batches", "1", "-quiet", "-out", filepath.Join("runs", s))
		if r.code != 0 {
			t.Fatalf("%s:\n%v", s, r)
		}
	}
	a, b := filepath.Join(runs, "dense"), filepath.Join(runs, "topk")
	for _, args := range [][]string{
		{"report", "-o", "flags-first.html", a, b},
		{"report", a, b, "-o", "flags-last.html"},
		{"report", a, "-o", "flags-between.html", b},
	} {
		out := args[slices.Index(args, "-o")+1]
		r := trainCmd(t, base, args...)
		if r.code != 0 {
			t.Fatalf("train %v:\n%v", args, r)
		}
		if got := strings.TrimSpace(r.stdout); !strings.HasPrefix(got, "wrote "+out) {
			t.Errorf("train %v printed %q, want it to name %s", args, got, out)
		}
		page, err := os.ReadFile(filepath.Join(base, out))
		if err != nil {
			t.Fatalf("train %v: %v", args, err)
		}
		// Both runs are on the page (the directories appear in its table).
		if !bytes.Contains(page, []byte(a)) || !bytes.Contains(page, []byte(b)) {
			t.Errorf("train %v: the page lacks one of the runs", args)
		}
	}
	// One run: its own page, rewritten in place.
	page := filepath.Join(a, "report.html")
	if err := os.Remove(page); err != nil {
		t.Fatal(err)
	}
	if r := trainCmd(t, base, "report", a); r.code != 0 || !strings.Contains(r.stdout, "wrote "+page) {
		t.Errorf("train report with one run:\n%v", r)
	}
	if _, err := os.Stat(page); err != nil {
		t.Errorf("train report with one run did not rewrite its page: %v", err)
	}
	elsewhere := t.TempDir()
	r := trainCmd(t, elsewhere, "report", a, b)
	if r.code != 0 {
		t.Fatalf("train report without -o:\n%v", r)
	}
	want := filepath.Join(runs, "compare.html")
	if !strings.Contains(r.stdout, "wrote "+want) {
		t.Errorf("train report without -o printed %q, want it to name %s", r.stdout, want)
	}
	if _, err := os.Stat(want); err != nil {
		t.Errorf("no comparison beside the runs: %v", err)
	}
	if es, _ := os.ReadDir(elsewhere); len(es) != 0 {
		t.Errorf("train report without -o wrote into the folder it was started from: %v", es)
	}
}

// TestProgNameOf: the command a message tells a person to type starts as
// they started train.
func TestProgNameOf(t *testing.T) {
	repo := func(p string) bool { return p == filepath.Join("cmd", "train") }
	none := func(string) bool { return false }
	for _, tc := range []struct {
		arg0  string
		isDir func(string) bool
		want  string
	}{
		{"bin/train", none, "bin/train"},
		{"./train", none, "./train"},
		{"train", none, "train"},
		{"/usr/local/bin/train", none, "/usr/local/bin/train"},
		{"/tmp/go-build123/b001/exe/train", repo, "go run ./cmd/train"},
		{"/tmp/go-build123/b001/exe/train", none, "train"},
		{"/tmp/go-build9/b001/train.test", repo, "train"},
		{"bin/mytrainer", none, "train"},
	} {
		if got := progNameOf(tc.arg0, tc.isDir); got != tc.want {
			t.Errorf("progNameOf(%q) = %q, want %q", tc.arg0, got, tc.want)
		}
	}
}

// TestResumeCommandAsTyped: a person who ran bin/train is told to resume
// with bin/train (a bare "train" is not on their PATH), and run.json
// records the command as they typed it.
func TestResumeCommandAsTyped(t *testing.T) {
	d := testenv.SharedData(t, "ml-100k/u.data")
	base := t.TempDir()
	exe, err := filepath.Abs(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(base, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, filepath.Join(base, "bin", "train")); err != nil {
		t.Fatal(err)
	}
	cmd := testenv.Command(t, 5*time.Minute, filepath.Join("bin", "train"), "-model", "ncf", "-dataset", "ml-100k", "-data-dir", d, "-workers", "2",
		"-sparsifier", "topk", "-density", "0.1", "-batch", "64", "-quiet", "-out", "run")
	cmd.Dir = base
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	dir := filepath.Join(base, "run")
	waitFor(t, 2*time.Minute, "a few steps", func() bool { return stepsRecorded(dir) >= 3 })
	cmd.Process.Signal(os.Interrupt)
	code, _ := exitIn(t, cmd, time.Minute, &out)
	if want := "resume with: bin/train -resume run"; code == 0 || !strings.Contains(out.String(), want) {
		t.Fatalf("exit %d, want a non-zero exit and %q in:\n%s", code, want, out.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		CommandLine []string `json:"command_line"`
	}
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}
	if len(info.CommandLine) == 0 || info.CommandLine[0] != "bin/train" {
		t.Errorf("run.json records the command line %q, want it to start with bin/train", info.CommandLine)
	}
}
