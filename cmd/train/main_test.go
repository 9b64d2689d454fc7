package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/native/dnnl"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// mainEnv makes the test binary act as the train command (for mpirun).
const mainEnv = "SPARSEGRAD_TRAIN_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestFlagsRejectBadInput(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		expect string
	}{
		{[]string{"-device", "cuda", "-out", "x"}, "install the NVIDIA driver"}, // this machine has no GPU (CI neither)
		{[]string{"-sparsifier", "topk", "-pipeline", "on", "-out", "x"}, "-overlap on needs -sparsifier dense or lags"},
		{[]string{"-sparsifier", "bogus", "-out", "x"}, "unknown -sparsifier"},
		{[]string{"-workers", "-1", "-out", "x"}, "-workers"},
		{[]string{"-net-latency", "1ms", "-out", "x"}, "give both"},
		{[]string{"-seed", "-3", "-out", "x"}, "-seed"},
		{[]string{"-executors", "-1", "-out", "x"}, "-executors -1 must be >= 0"},
		{[]string{"-kernels", "mkl", "-out", "x"}, `-kernels "mkl": use auto, onednn or im2col`},
		{[]string{"-device", "cuda", "-executors", "2", "-out", "x"}, "workers on GPUs keep a model each"},
		{[]string{"-decay-epochs", "a,b", "-out", "x"}, "-decay-epochs"},
		{[]string{"-model", "lstm", "-dataset", "ml-100k", "-out", "x"}, "cannot train on"},
		{[]string{"-out", "x", "extra"}, "unexpected argument"},
		{[]string{}, "-out DIR"},
		{[]string{"-nosuchflag"}, "not defined"},
		{[]string{"report"}, "at least one run directory"},
		{[]string{"report", "/does/not/exist"}, "/does/not/exist: no such folder"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), tc.args, &out, &out)
		if err == nil || !strings.Contains(err.Error()+out.String(), tc.expect) {
			t.Errorf("%v: err %v (output %q), want %q", tc.args, err, out.String(), tc.expect)
		}
	}
}

func TestHelpListsFlags(t *testing.T) {
	var out bytes.Buffer
	run(context.Background(), []string{"-help"}, &out, &out)
	for _, f := range []string{"-model", "-dataset", "-data-dir", "-download", "-sparsifier", "-density", "-workers", "-epochs", "-steps",
		"-batch", "-lr", "-seed", "-out", "-resume", "-device", "-net-latency", "-net-bandwidth", "-summary", "-quiet",
		"-lambda", "-teams", "-merge-size", "-max-ratio", "-min-tensor", "-dense-warmup", "-log-every", "-eval-every", "-kernels", "train report"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("-help lacks %s", f)
		}
	}
	// Every option a sparsifier declares is a flag whose help comes from the
	// declaration: its kind, the methods, its doc and each method's default.
	for _, m := range sparsify.Methods() {
		for _, o := range m.Params {
			for _, w := range []string{"-" + o.FlagName() + " " + o.Kind.String(), m.Name, o.Doc, o.Format(o.Default)} {
				if !strings.Contains(out.String(), w) {
					t.Errorf("-help lacks %q of %s's option %s:\n%s", w, m.Name, o.Key, out.String())
				}
			}
		}
	}
}

func TestSummary(t *testing.T) {
	d := testenv.SharedData(t, "ml-100k/u.data")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-model", "ncf", "-data-dir", d, "-summary"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "parameters") || !strings.Contains(out.String(), "mf_user_embed.weight") {
		t.Fatalf("summary:\n%s", out.String())
	}
}

// losses reads the per-step losses of a run directory.
func losses(t *testing.T, dir string) []float64 {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ls []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			Type string  `json:"type"`
			Loss float64 `json:"loss"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.Type == "step" {
			ls = append(ls, r.Loss)
		}
	}
	return ls
}

// TestMPIMatchesInProcess runs the command under a real mpirun -np N and
// with -workers N in one process, and requires identical per-step losses
// (ResNet-18 with both CPU kernel sets: oneDNN's results depend on its
// thread count, which depends only on the workers per machine).
func TestMPIMatchesInProcess(t *testing.T) {
	mpirun := testenv.MPIRun(t)
	d := testenv.SharedData(t, "ml-100k/u.data")
	// In-process workers share one parameter copy and take turns on
	// fewer executors than workers (-executors 2 and, for 16 workers, the
	// default); mpirun's processes each have their own.
	cases := []struct {
		np         int
		sparsifier string
		model      []string
		extra      []string
	}{{4, "deft", nil, nil}, {3, "topk", nil, nil}, {2, "lags", nil, nil}, {16, "topk", nil, nil},
		{3, "efsignsgd", nil, nil}, {2, "powersgd", nil, nil}, {5, "mstopk", nil, nil}, {3, "fp16", nil, nil},
		{2, "topk", nil, []string{"-min-compress-size", "5000"}},
		// LAGS with one group per tensor: the size-1 bias is a group kept
		// dense (k = m), all-reduced beside the others' all-gathers.
		{3, "lags", nil, []string{"-merge-size", "1"}},
		{3, "deft", []string{"-model", "resnet18", "-dataset", "cifar10", "-batch", "4", "-eval-batch", "8", "-kernels", "im2col"}, nil},
		{3, "deft", []string{"-model", "resnet18", "-dataset", "cifar10", "-batch", "4", "-eval-batch", "8", "-kernels", "onednn"}, nil},
		{3, "micro", []string{"-model", "lstm", "-dataset", "wikitext2", "-preset", "small", "-batch", "4"}, nil}}
	if testing.Short() {
		cases = cases[:1]
	}
	for _, tc := range cases {
		model := tc.model
		if model == nil {
			model = []string{"-model", "ncf", "-dataset", "ml-100k"}
		}
		steps := 12
		if tc.model != nil {
			steps = 4
		}
		name := fmt.Sprintf("np=%d/%s/%s", tc.np, model[1], tc.sparsifier)
		if tc.extra != nil {
			name += "/" + strings.TrimLeft(strings.Join(tc.extra, "="), "-")
		}
		if i := slices.Index(model, "-kernels"); i >= 0 {
			name += "/" + model[i+1]
		}
		t.Run(name, func(t *testing.T) {
			if slices.Contains(model, "onednn") {
				skipWithoutOneDNN(t)
			}
			common := append(slices.Clone(model), "-data-dir", d, "-steps", strconv.Itoa(steps), "-sparsifier", tc.sparsifier,
				"-density", "0.05", "-quiet", "-max-eval-batches", "1", "-seed", "7", "-blas-threads", "1")
			common = append(common, tc.extra...)
			inproc := filepath.Join(t.TempDir(), "inproc")
			var out bytes.Buffer
			inArgs := append(slices.Clone(common), "-workers", strconv.Itoa(tc.np), "-out", inproc)
			if tc.np < 16 {
				inArgs = append(inArgs, "-executors", "2")
			}
			if err := run(context.Background(), inArgs, &out, &out); err != nil {
				t.Fatalf("in-process: %v\n%s", err, out.String())
			}
			viaMPI := filepath.Join(t.TempDir(), "mpi")
			args := append([]string{"--oversubscribe", "--allow-run-as-root", "-np", strconv.Itoa(tc.np), os.Args[0]}, append(common, "-out", viaMPI)...)
			cmd := testenv.Command(t, 3*time.Minute, mpirun, args...)
			cmd.Env = append(os.Environ(), mainEnv+"=1")
			b, err := cmd.CombinedOutput()
			if testenv.PastLimit(cmd) {
				t.Fatalf("mpirun did not finish in time:\n%s", b)
			}
			if err != nil {
				t.Fatalf("mpirun: %v\n%s", err, b)
			}
			a, m := losses(t, inproc), losses(t, viaMPI)
			if len(a) != steps || !slices.Equal(a, m) {
				t.Fatalf("losses differ:\nin-process %v\nmpirun     %v", a, m)
			}
			var info struct {
				Backend string `json:"backend"`
				Workers int    `json:"workers"`
			}
			rb, _ := os.ReadFile(filepath.Join(viaMPI, "run.json"))
			json.Unmarshal(rb, &info)
			if info.Backend != "mpi" || info.Workers != tc.np {
				t.Fatalf("run.json of the mpirun job: %+v", info)
			}
			rb, _ = os.ReadFile(filepath.Join(inproc, "run.json"))
			var sim struct {
				Executors int `json:"executors"`
			}
			json.Unmarshal(rb, &sim)
			want := 2
			if tc.np == 16 {
				want = min(16, runtime.NumCPU())
			}
			if sim.Executors != want {
				t.Fatalf("run.json of the in-process run: %d executors", sim.Executors)
			}
		})
	}
}

// TestMPIRejectsWorkers: -workers with mpirun is refused before training.
func TestMPIRejectsWorkers(t *testing.T) {
	mpirun := testenv.MPIRun(t)
	cmd := testenv.Command(t, time.Minute, mpirun, "--oversubscribe", "--allow-run-as-root", "-np", "2", os.Args[0], "-workers", "2", "-out", t.TempDir())
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "mpirun -np 2") {
		t.Fatalf("err %v, output:\n%s", err, b)
	}
}

// TestRunWritesReportAndCompare trains a few steps (report.html is written
// after the run) and compares two runs with the report subcommand.
func TestRunWritesReportAndCompare(t *testing.T) {
	d := testenv.SharedData(t, "ml-100k/u.data")
	base := t.TempDir()
	var dirs []string
	for _, s := range []string{"dense", "topk"} {
		dir := filepath.Join(base, s)
		var out bytes.Buffer
		if err := run(context.Background(), []string{"-model", "ncf", "-data-dir", d, "-workers", "2", "-steps", "3", "-sparsifier", s,
			"-density", "0.1", "-max-eval-batches", "1", "-out", dir}, &out, &out); err != nil {
			t.Fatalf("%s: %v\n%s", s, err, out.String())
		}
		if strings.Contains(out.String(), "report.html not written") {
			if strings.Contains(out.String(), "ECharts") {
				testenv.Missing(t, testenv.Browser, "the reports package cannot obtain ECharts here:\n"+out.String())
			}
			t.Fatalf("report not written:\n%s", out.String())
		}
		if _, err := os.Stat(filepath.Join(dir, "report.html")); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	}
	html := filepath.Join(base, "cmp.html")
	var out bytes.Buffer
	if err := run(context.Background(), append([]string{"report", "-o", html}, dirs...), &out, &out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(html)
	if err != nil || !strings.Contains(string(b), "<html") {
		t.Fatalf("comparison page: %v, %d bytes", err, len(b))
	}
	// -report-assets makes the page load ECharts from the given URL instead
	// of inlining it.
	const cdn = "https://cdn.example.org/echarts.min.js"
	small := filepath.Join(base, "cdn.html")
	if err := run(context.Background(), append([]string{"report", "-o", small, "-report-assets", cdn, "-target", "0.3"}, dirs...), &out, &out); err != nil {
		t.Fatal(err)
	}
	c, err := os.ReadFile(small)
	if err != nil || !strings.Contains(string(c), cdn) || len(c) >= len(b)/2 {
		t.Fatalf("page with -report-assets: %v, %d bytes (inline page %d bytes), URL present: %v", err, len(c), len(b), strings.Contains(string(c), cdn))
	}
}

// TestSummaryResNetNeedsNoData checks that ResNet-18's summary is printed
// without a data set (its shape depends only on the number of classes), with
// the parameter counts of the reference code.
func TestSummaryResNetNeedsNoData(t *testing.T) {
	for _, tc := range []struct{ dataset, want string }{
		{"cifar10", "resnet18: 11173962 parameters"},
		{"cifar100", "resnet18: 11220132 parameters"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), []string{"-model", "resnet18", "-dataset", tc.dataset, "-data-dir", t.TempDir(), "-summary"}, &out, &out)
		if err != nil || !strings.Contains(out.String(), tc.want) {
			t.Fatalf("%s: err %v, output:\n%s", tc.dataset, err, out.String())
		}
	}
}

// skipWithoutOneDNN skips a test that needs oneDNN where it is not
// installed, unless SPARSEGRAD_TEST_KERNELS=onednn (CI) requires it.
func skipWithoutOneDNN(t *testing.T) {
	t.Helper()
	if _, err := dnnl.Load(); err != nil && os.Getenv("SPARSEGRAD_TEST_KERNELS") != "onednn" {
		testenv.Missing(t, testenv.OneDNN, fmt.Sprintf("oneDNN is not installed (apt-get install libdnnl2): %v", err))
	}
}
