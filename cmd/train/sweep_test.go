package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/sweep"
)

// TestSweepAndAdviseRejectBadInput reads the one-line errors a person gets
// for mistakes on the sweep and advise command lines.
func TestSweepAndAdviseRejectBadInput(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		expect string
	}{
		{[]string{"sweep", "-preset", "nope", "-out", "x"}, `unknown preset "nope"; use one of ` + strings.Join(sweep.PresetNames(), ", ")},
		{[]string{"sweep", "-preset", "deft-buildup"}, "give -out DIR"},
		{[]string{"sweep", "-sparsifiers", "topk", "-workers", "2", "-density", "0.01", "-out", "x"}, "give a budget per run"},
		{[]string{"sweep", "-sparsifiers", "topk", "-workers", "2", "-density", "0,1", "-steps", "5", "-out", "x"}, "want a fraction in (0, 1]"},
		{[]string{"sweep", "-sparsifiers", "topk", "-workers", "0", "-steps", "5", "-out", "x"}, "want a worker count >= 1"},
		{[]string{"sweep", "-sparsifiers", "topq", "-workers", "2", "-density", "0.1", "-steps", "5", "-out", "x"}, `unknown sparsifier "topq"`},
		{[]string{"sweep", "-workers", "2", "-steps", "5", "-out", "x"}, "give -sparsifiers"},
		{[]string{"sweep", "-preset", "deft-buildup", "-out", "x", "extra"}, `unexpected argument "extra"`},
		{[]string{"sweep", "-worker", "2"}, "did you mean -workers?"},
		{[]string{"advise", "-net-bandwidth", "10"}, "give -workers P"},
		{[]string{"advise", "-workers", "16", "-net-bandwidth", "10", "-net-latency", "abc"}, `"abc" is not a duration: write a number and a unit, e.g. 50us`},
		{[]string{"sweep", "-preset", "deft-buildup", "-net-latency", "fast", "-out", "x"}, `"fast" is not a duration`},
		{[]string{"advise", "-workers", "16"}, "give -net-bandwidth B"},
		{[]string{"advise", "-workers", "16", "-net-bandwidth", "-3"}, "want a bandwidth > 0"},
		{[]string{"advise", "-workers", "16", "-net-bandwidth", "10", "-sparsifiers", "topk,nope"}, `unknown sparsifier "nope"`},
		{[]string{"advise", "-workers", "16", "-net-bandwidth", "10", "-device", "cuda"}, "install the NVIDIA driver"}, // no GPU here (CI neither)
		// An unknown model is refused before anything is measured or run.
		{[]string{"advise", "-model", "vgg", "-workers", "16", "-net-bandwidth", "10"}, `unknown -model "vgg"; use one of resnet18, lstm, ncf`},
		{[]string{"sweep", "-model", "vgg", "-sparsifiers", "topk", "-workers", "2", "-density", "0.1", "-steps", "5", "-out", filepath.Join(t.TempDir(), "x")}, `unknown -model "vgg"; use one of resnet18, lstm, ncf`},
		{[]string{"sweep", "-sparsifiers", "topk", "-workers", "2", "-density", "0.1", "-steps", "5", "-lr", "-1", "-out", filepath.Join(t.TempDir(), "x")}, `sweep: topk-w2-d0.1: train: invalid configuration: -lr -1`},
	} {
		var out bytes.Buffer
		err := run(context.Background(), tc.args, &out, &out)
		if err == nil || !strings.Contains(err.Error()+out.String(), tc.expect) {
			t.Errorf("%v: err %v (output %q), want %q", tc.args, err, out.String(), tc.expect)
		}
		if strings.Contains(tc.expect, "unknown -model") && out.Len() > 0 {
			t.Errorf("%v: measured this machine before refusing: %q", tc.args, out.String())
		}
	}
}

// TestSweepPresetList reads train sweep -preset list: every preset with its
// paper, its grid and its full-size command.
func TestSweepPresetList(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"sweep", "-preset", "list"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, name := range sweep.PresetNames() {
		p := sweep.Presets[name]
		for _, want := range []string{name + " — " + p.Paper, "full size: " + p.FullSize, "ncf on ml-100k"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("-preset list lacks %q:\n%s", want, out.String())
			}
		}
	}
}

// TestSweepHelp reads train sweep -help and train advise -help.
func TestSweepHelp(t *testing.T) {
	for sub, flags := range map[string][]string{
		"sweep":  {"-preset", "-sparsifiers", "-workers", "-density", "-net-bandwidth", "-steps", "-max-time", "-out", "-dry-run", "-dense-warmup"},
		"advise": {"-model", "-workers", "-net-bandwidth", "-net-latency", "-device", "-density", "-sparsifiers", "-measurements"},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), []string{sub, "-help"}, &out, &out); err != nil {
			t.Errorf("%s -help: %v", sub, err)
		}
		for _, f := range flags {
			if !strings.Contains(out.String(), f+" ") && !strings.Contains(out.String(), f+"\n") {
				t.Errorf("train %s -help lacks %s:\n%s", sub, f, out.String())
			}
		}
	}
}

// TestSweepDryRun checks that -dry-run prints one mpirun job per point,
// with the preset's values and the flags given overriding them (the data
// folder the sweep would read when -data-dir is not given), writing where
// the sweep looks; it runs nothing and records the jobs (jobs.json) for
// the sweep that builds the page from them.
func TestSweepDryRun(t *testing.T) {
	out := t.TempDir()
	var buf bytes.Buffer
	err := run(context.Background(), []string{"sweep", "-preset", "spardl-scaling", "-workers", "2,3", "-steps", "7", "-data-dir", "/data", "-out", out, "-dry-run"}, &buf, &buf)
	if err != nil {
		t.Fatal(err)
	}
	printed := strings.Split(strings.TrimSpace(buf.String()), "\n")
	// The emulated network's note, 6 methods × 2 worker counts, gtopk and
	// spardl (the preset's 2 teams) not on 3 workers, how to build the page.
	if n := len(printed); n != 14 || !strings.HasPrefix(printed[0], "# under mpirun") || !strings.HasPrefix(printed[n-3], "# not run: gtopk-w3-d0.01:") ||
		!strings.HasPrefix(printed[n-2], "# not run: spardl-w3-d0.01: 2 teams do not divide 3 workers") ||
		!strings.Contains(printed[n-1], "the same command without -dry-run builds "+filepath.Join(out, "sweep.html")) {
		t.Fatalf("dry run printed:\n%s", buf.String())
	}
	root := ""
	if os.Geteuid() == 0 {
		root = "--allow-run-as-root "
	}
	want := "mpirun --oversubscribe " + root + "-np 3 train -model ncf -dataset ml-100k -data-dir /data -sparsifier topkdsa -density 0.01 -epochs 1000 -steps 7 -log-every 1 -eval-every 100 -dense-warmup 0 -out " + filepath.Join(out, "runs", "topkdsa-w3-d0.01")
	if !strings.Contains(buf.String(), want+"\n") {
		t.Errorf("dry run lacks\n%s\nin\n%s", want, buf.String())
	}
	if entries, _ := os.ReadDir(filepath.Join(out, "runs")); len(entries) != 0 {
		t.Errorf("the dry run wrote %d runs", len(entries))
	}
	if _, err := os.Stat(filepath.Join(out, "jobs.json")); err != nil {
		t.Errorf("the dry run did not record its jobs: %v", err)
	}
	// Without -data-dir the jobs carry the folder the sweep would read.
	t.Setenv("TRAIN_DATA_DIR", "")
	buf.Reset()
	if err := run(context.Background(), []string{"sweep", "-preset", "spardl-scaling", "-out", t.TempDir(), "-dry-run"}, &buf, &buf); err != nil {
		t.Fatal(err)
	}
	for _, l := range lines(buf.String()) {
		if !strings.HasPrefix(l, "#") && !strings.Contains(l, " -data-dir ./data ") {
			t.Fatalf("job without the sweep's data folder: %s", l)
		}
	}
}

// TestSweepDryRunUnderMPI runs every job train sweep -dry-run prints, as
// printed, under the real mpirun: each must train and record an mpi run of
// as many workers as its -np. The grid has two emulated networks (one job
// per run under mpirun) and a point gTop-k cannot run. The train command
// is this test binary under the name bin/train (it acts as train with
// SPARSEGRAD_TRAIN_AS_MAIN=1 in the environment, which mpirun's processes
// inherit).
func TestSweepDryRunUnderMPI(t *testing.T) {
	testenv.MPIRun(t)
	data := testenv.SharedData(t, "ml-100k/u.data")
	dir := t.TempDir()
	exe, err := filepath.Abs(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, filepath.Join(dir, "bin", "train")); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), mainEnv+"=1")
	sh := func(line string) string {
		t.Helper()
		c := testenv.Command(t, 3*time.Minute, "bash", "-c", line)
		c.Dir, c.Env = dir, env
		b, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, b)
		}
		return string(b)
	}
	sweepCmd := "bin/train sweep -sparsifiers topk,gtopk -workers 2,3 -density 0.05 -steps 2 -max-eval-batches 1 -net-bandwidth 1,10 -data-dir " + data + " -out sw -dry-run"
	printed := sh(sweepCmd)
	var jobs []string
	for _, l := range lines(printed) {
		if !strings.HasPrefix(l, "#") {
			jobs = append(jobs, l)
		}
	}
	if len(jobs) != 3 || !strings.Contains(printed, "# not run: gtopk-w3-d0.05:") || strings.Count(printed, "# not run") != 1 {
		t.Fatalf("want the jobs topk ×2, topk ×3, gtopk ×2 and gtopk ×3 not run; printed:\n%s", printed)
	}
	np := regexp.MustCompile(`^mpirun --oversubscribe (--allow-run-as-root )?-np (\d+) bin/train .* -out (\S+)$`)
	for _, j := range jobs {
		m := np.FindStringSubmatch(j)
		if m == nil || (m[1] != "") != (os.Geteuid() == 0) {
			t.Fatalf("job %q is not mpirun [--allow-run-as-root as root] -np N bin/train ... -out DIR", j)
		}
		if strings.Contains(j, "-workers") || strings.Contains(j, "-net-") {
			t.Fatalf("job %q has a flag mpirun's processes refuse", j)
		}
		sh(j)
		var info struct {
			Backend string `json:"backend"`
			Workers int    `json:"workers"`
		}
		b, err := os.ReadFile(filepath.Join(dir, m[3], "run.json"))
		if err == nil {
			err = json.Unmarshal(b, &info)
		}
		if err != nil || info.Backend != "mpi" || strconv.Itoa(info.Workers) != m[2] {
			t.Fatalf("job %q recorded %+v (%v), want %s workers over mpi", j, info, err, m[2])
		}
		if j == jobs[0] {
			// The page needs every job: the sweep refuses, naming the rest.
			c := testenv.Command(t, 3*time.Minute, "bash", "-c", strings.Replace(sweepCmd, " -dry-run", "", 1))
			c.Dir, c.Env = dir, env
			b, err := c.CombinedOutput()
			if err == nil || !strings.Contains(string(b), "have not all finished") || !strings.Contains(string(b), "topk-w3-d0.05 (no run there yet)") {
				t.Fatalf("the sweep with 1 of 3 jobs run: %v\n%s", err, b)
			}
		}
	}
	// The same command without -dry-run builds the page from the jobs' runs.
	built := sh(strings.Replace(sweepCmd, " -dry-run", "", 1))
	if !strings.Contains(built, "building the page from the 3 mpirun jobs") || !strings.Contains(built, "3 runs: 0 run now, 3 already complete") {
		t.Fatalf("the sweep after the jobs printed:\n%s", built)
	}
	page, err := os.ReadFile(filepath.Join(dir, "sw", "sweep.html"))
	if err != nil || !strings.Contains(string(page), "real (mpirun)") {
		t.Fatalf("sweep.html (%v) does not show the jobs' runs on the real network", err)
	}
}

// TestSweepCommand runs a small sweep with the command (two methods × two
// worker counts of NCF on the real MovieLens-100K, with the advisor's
// predictions) and reads what it prints and the page's predicted against
// measured table; a second call skips every run.
func TestSweepCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("trains NCF four times and measures this machine (about 15 s)")
	}
	data := testenv.SharedData(t, "ml-100k/u.data")
	out := filepath.Join(t.TempDir(), "sw")
	args := []string{"sweep", "-sparsifiers", "topk,deft", "-workers", "2,4", "-density", "0.05", "-steps", "40", "-eval-every", "20",
		"-max-eval-batches", "2", "-data-dir", data, "-out", out}
	var buf bytes.Buffer
	if err := run(context.Background(), args, &buf, &buf); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	page := filepath.Join(out, "sweep.html")
	if !strings.Contains(buf.String(), "4 runs: 4 run now, 0 already complete; open "+page) {
		t.Errorf("output:\n%s", buf.String())
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	// Every run has its measured / predicted time per iteration and an error.
	row := regexp.MustCompile(`<tr><td>(topk|deft) ×(2|4)</td><td>[0-9.]+ (µs|ms|s) / [0-9.]+ (µs|ms|s)</td><td>-?[0-9]+ %</td>`)
	if n := len(row.FindAll(b, -1)); n != 4 {
		t.Errorf("the page has %d predicted-against-measured rows, want 4", n)
	}
	buf.Reset()
	if err := run(context.Background(), args, &buf, &buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "4 runs: 0 run now, 4 already complete") || !strings.Contains(buf.String(), "using the measurements of this machine") {
		t.Errorf("second call:\n%s", buf.String())
	}
}

// TestAdviseCommand ranks the methods for NCF at 16 and 64 workers on
// 1 and 100 Gbit/s and reads the tables: every method ranked or said why not,
// dense's speedup 1.00×, and a verdict for each setting.
func TestAdviseCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("measures this machine (about 8 s)")
	}
	data := testenv.SharedData(t, "ml-100k/u.data")
	meas := filepath.Join(t.TempDir(), "m.json")
	args := []string{"advise", "-model", "ncf", "-data-dir", data, "-workers", "16,64", "-net-bandwidth", "1,100", "-measurements", meas}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	txt := out.String()
	tables := strings.Count(txt, "ncf on ml-100k, ")
	if tables != 4 {
		t.Fatalf("%d tables, want 4:\n%s", tables, txt)
	}
	if n := strings.Count(txt, "Dense all-reduce wins") + strings.Count(txt, "is predicted fastest") + strings.Count(txt, "barely pays off"); n != 4 {
		t.Errorf("%d verdicts, want 4:\n%s", n, txt)
	}
	if n := len(regexp.MustCompile(`(?m)^\d+ +dense +.* 1\.00× `).FindAllString(txt, -1)); n != 4 {
		t.Errorf("dense rows with speedup 1.00×: %d, want 4:\n%s", n, txt)
	}
	if !strings.Contains(txt, "gtopk") && !strings.Contains(txt, "not ranked") {
		t.Errorf("gtopk neither ranked nor excused:\n%s", txt)
	}
	if !strings.Contains(txt, "builds up with the workers") {
		t.Errorf("no density build-up caveat for top-k at 64 workers:\n%s", txt)
	}
	// The measurements are kept: a second call does not measure again.
	var out2, err2 bytes.Buffer
	if err := run(context.Background(), args, &out2, &err2); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(err2.String(), "using the measurements in "+meas) || out2.String() != txt {
		t.Errorf("second call measured again or printed other tables:\n%s", err2.String())
	}
}

// TestPresetFullSizeCommands runs each preset's documented full-size
// command (train sweep -preset list, docs/results) with -dry-run: it must
// parse and expand to runs of the model, device and density it names
// (over the preset's NCF values).
func TestPresetFullSizeCommands(t *testing.T) {
	for _, name := range sweep.PresetNames() {
		p := sweep.Presets[name]
		args := strings.Fields(p.FullSize)
		if args[0] != "train" || args[1] != "sweep" {
			t.Fatalf("%s: full-size command %q does not start with train sweep", name, p.FullSize)
		}
		for i, a := range args {
			if a == "-out" {
				args[i+1] = filepath.Join(t.TempDir(), "sw")
			}
		}
		var out bytes.Buffer
		if err := run(context.Background(), append(args[1:], "-dry-run"), &out, &out); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		model := args[slices.Index(args, "-model")+1]
		for _, l := range lines {
			if strings.HasPrefix(l, "#") {
				continue
			}
			if !strings.Contains(l, " -model "+model+" ") || !strings.Contains(l, " -device cuda ") {
				t.Errorf("%s: run %q is not the full-size one", name, l)
			}
			if d := args[slices.Index(args, "-density")+1]; !strings.Contains(l, "-sparsifier dense ") && !strings.Contains(l, " -density "+d+" ") {
				t.Errorf("%s: run %q lacks -density %s", name, l, d)
			}
		}
		if len(lines) < 4 {
			t.Errorf("%s: %d runs:\n%s", name, len(lines), out.String())
		}
	}
}

// TestSweepDryRunFromGoRun: run with go run (whose binary is gone when the
// jobs start), the dry run builds bin/train first and its jobs run that.
func TestSweepDryRunFromGoRun(t *testing.T) {
	s := sweep.Spec{Sparsifiers: []string{"topk"}, Workers: []int{4}, Densities: []float64{0.1}}
	s.Base.Model, s.Base.Steps = "ncf", 3
	var b bytes.Buffer
	if err := printMPIJobs(&b, s, "o", "go run ./cmd/train", false); err != nil {
		t.Fatal(err)
	}
	want := "go build -o bin/train ./cmd/train\nmpirun --oversubscribe -np 4 bin/train -model ncf -sparsifier topk -density 0.1 -steps 3 -out " + filepath.Join("o", "runs", "topk-w4-d0.1") + "\n"
	if b.String() != want {
		t.Fatalf("printed\n%s\nwant\n%s", b.String(), want)
	}
}

// TestSweepOverNetworksOverlapOff sweeps dense on two emulated networks
// with -overlap off (the baseline of DEFT's and MiCRO's papers): the
// advisor measures the simulated workers on each network in a folder of
// its own (the second network's measurement once failed on the first's
// folder), every run records the overlap it ran with, and the page says
// against which dense the speedups are.
func TestSweepOverNetworksOverlapOff(t *testing.T) {
	if testing.Short() {
		t.Skip("trains NCF twice and measures this machine on two networks (about 40 s)")
	}
	data := testenv.SharedData(t, "ml-100k/u.data")
	out := filepath.Join(t.TempDir(), "sw")
	args := []string{"sweep", "-sparsifiers", "dense", "-workers", "2", "-net-bandwidth", "1,10", "-net-latency", "50us",
		"-overlap", "off", "-steps", "30", "-eval-every", "30", "-max-eval-batches", "1", "-data-dir", data, "-out", out}
	var buf bytes.Buffer
	if err := run(context.Background(), args, &buf, &buf); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	if !strings.Contains(buf.String(), "2 runs: 2 run now, 0 already complete") {
		t.Errorf("output:\n%s", buf.String())
	}
	runs, err := filepath.Glob(filepath.Join(out, "runs", "*", "run.json"))
	if err != nil || len(runs) != 2 {
		t.Fatalf("run.json files %v (%v), want 2", runs, err)
	}
	for _, r := range runs {
		b, err := os.ReadFile(r)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), `"pipeline": "off"`) {
			t.Errorf("%s does not record -overlap off:\n%s", r, b)
		}
	}
	page, err := os.ReadFile(filepath.Join(out, "sweep.html"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "Speedups are over dense all-reduced after the backward pass (-overlap off") {
		t.Errorf("the page does not say that its dense ran after the backward pass")
	}
	row := regexp.MustCompile(`<tr><td>dense \((1|10) Gbit/s, 50µs latency\) ×2</td><td>[0-9.,]+ (µs|ms|s) / [0-9.,]+ (µs|ms|s)</td><td>-?[0-9]+ %</td>`)
	if n := len(row.FindAll(page, -1)); n != 2 {
		t.Errorf("the page has %d predicted-against-measured rows, want 2 (one per network)", n)
	}
}
