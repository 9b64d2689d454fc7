package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// TestReplayCommand: train -record-gradients, then train replay of the
// recording, as a user runs them: the replay's terminal output has no loss,
// and its report says it is a replay, what it cannot show, the recorded
// step time, and draws no loss chart.
func TestReplayCommand(t *testing.T) {
	data := testenv.SharedData(t, "ml-100k/u.data")
	dir := t.TempDir()
	grads, trained, replayed := filepath.Join(dir, "grads"), filepath.Join(dir, "trained"), filepath.Join(dir, "replayed")
	const cdn = "https://cdn.jsdelivr.net/npm/echarts@5.6.0/dist/echarts.min.js"
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-model", "ncf", "-data-dir", data, "-workers", "2", "-steps", "3", "-sparsifier", "topk", "-density", "0.05",
		"-record-gradients", grads, "-out", trained, "-report-assets", cdn}, &out, &out); err != nil {
		t.Fatalf("train: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"replay", "-gradients", grads, "-sparsifier", "topk", "-density", "0.05", "-out", replayed, "-report-assets", cdn}, &out, &out); err != nil {
		t.Fatalf("train replay: %v\n%s", err, out.String())
	}
	if s := out.String(); strings.Contains(s, "NaN") || strings.Contains(s, "loss") || strings.Contains(s, "samples/s") || !strings.Contains(s, "report:") {
		t.Errorf("replay's terminal output:\n%s", s)
	}
	b, err := os.ReadFile(filepath.Join(replayed, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{"Replay of ncf&#39;s recorded gradients", "A replay of recorded gradients", "It cannot show: no loss", "recorded step time", "2 workers × 3 steps"} {
		if !strings.Contains(page, want) {
			t.Errorf("the replay's report lacks %q", want)
		}
	}
	if strings.Contains(page, "Training loss") {
		t.Error("the replay's report draws a loss chart")
	}
	// The replay flags are only those a replay uses.
	out.Reset()
	err = run(context.Background(), []string{"replay", "-gradients", grads, "-lr", "0.1", "-out", filepath.Join(dir, "x")}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "-lr") {
		t.Errorf("train replay -lr: %v", err)
	}
	err = run(context.Background(), []string{"replay", "-sparsifier", "topk", "-out", filepath.Join(dir, "y")}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "give -gradients DIR") {
		t.Errorf("train replay without -gradients: %v", err)
	}
}

// TestSweepAndAdviseOfRecording: train sweep -gradients replays a
// recording at each point of the grid (points beyond its workers are not
// run, and say why), -dry-run prints train replay commands, and train
// advise -gradients ranks the methods for the recorded model with a given
// step time; flags about a model are refused beside -gradients.
func TestSweepAndAdviseOfRecording(t *testing.T) {
	data := testenv.SharedData(t, "ml-100k/u.data")
	dir := t.TempDir()
	grads := filepath.Join(dir, "grads")
	const cdn = "https://cdn.jsdelivr.net/npm/echarts@5.6.0/dist/echarts.min.js"
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-model", "ncf", "-data-dir", data, "-workers", "3", "-steps", "2", "-record-gradients", grads,
		"-out", filepath.Join(dir, "trained"), "-quiet"}, &out, &out); err != nil {
		t.Fatalf("train: %v\n%s", err, out.String())
	}
	out.Reset()
	sw := filepath.Join(dir, "sweep")
	if err := run(context.Background(), []string{"sweep", "-gradients", grads, "-sparsifiers", "topk,deft", "-workers", "2,3,4", "-density", "0.05",
		"-out", sw, "-report-assets", cdn}, &out, &out); err != nil {
		t.Fatalf("sweep: %v\n%s", err, out.String())
	}
	if s := out.String(); !strings.Contains(s, "4 runs: 4 run now") || !strings.Contains(s, "skip topk-w4-d0.05: the recording holds the gradients of 3 workers") {
		t.Errorf("sweep output:\n%s", s)
	}
	for _, name := range []string{"topk-w2-d0.05", "deft-w3-d0.05"} {
		b, err := os.ReadFile(filepath.Join(sw, "runs", name, "run.json"))
		if err != nil || !strings.Contains(string(b), `"replay"`) {
			t.Errorf("%s is not a replay: %v", name, err)
		}
	}
	page, err := os.ReadFile(filepath.Join(sw, "sweep.html"))
	if err != nil || !strings.Contains(string(page), "Replays of the recorded gradients") {
		t.Errorf("the sweep page does not say it replays: %v", err)
	}
	out.Reset()
	x := filepath.Join(t.TempDir(), "x")
	if err := run(context.Background(), []string{"sweep", "-gradients", grads, "-sparsifiers", "topk", "-workers", "2", "-density", "0.05", "-out", x, "-dry-run"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	// One mpirun job per point, as printed for a model's sweep (the
	// replay under mpirun: TestReplayUnderMPI), and how to build the page.
	job, after, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
	if !strings.HasPrefix(after, "# when the jobs have run") {
		t.Errorf("dry run's last line: %q", after)
	}
	if want := " -np 2 train replay -gradients " + grads + " -sparsifier topk -density 0.05 -out " + filepath.Join(x, "runs", "topk-w2-d0.05"); !strings.HasPrefix(job, "mpirun --oversubscribe") || !strings.HasSuffix(job, want) || strings.Contains(job, "\n") {
		t.Errorf("dry run:\n%s\nwant one line: mpirun --oversubscribe …%s", job, want)
	}
	out.Reset()
	// A GPU's step time with this CPU's costs is refused, saying what to
	// pass; with a GPU cost profile the header says where each cost came
	// from, and the methods the profile lacks are not predicted.
	err = run(context.Background(), []string{"advise", "-gradients", grads, "-step-time", "30ms", "-workers", "16", "-net-bandwidth", "10"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "-cost-profile h200") || !strings.Contains(err.Error(), "-device cuda") {
		t.Errorf("advise -step-time on the CPU: %v; want a refusal naming -cost-profile h200 and -device cuda", err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"advise", "-gradients", grads, "-step-time", "30ms", "-cost-profile", "h200", "-workers", "16,64", "-net-bandwidth", "10",
		"-sparsifiers", "dense,topk,deft,micro,randomk"}, &out, &out); err != nil {
		t.Fatalf("advise: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"ncf on recorded gradients, 16 workers", "ncf on recorded gradients, 64 workers", "one step 30 ms (forward+backward, given with -step-time)",
		"costs from the cost profile h200: NVIDIA H200", "revision 602ca45", "GPU cost unknown (not ranked): randomk", "update and error feedback: estimated",
		"randomk: advise: randomk: GPU cost unknown: the cost profile h200 holds no GPU selection time for it",
		"speedups are against overlapped dense as PyTorch DDP runs it", "over a horizon of 2 steps",
		"kind of model: recommender", "what is known about accuracy"} {
		if !strings.Contains(s, want) {
			t.Errorf("advise output lacks %q:\n%s", want, s)
		}
	}
	// Measurements kept for one horizon are not used for another.
	meas := filepath.Join(dir, "m.json")
	for i, steps := range []string{"2", "4"} {
		out.Reset()
		err := run(context.Background(), []string{"advise", "-gradients", grads, "-cost-profile", "h200", "-step-time", "30ms", "-workers", "16", "-net-bandwidth", "10",
			"-sparsifiers", "dense,topk", "-steps", steps, "-measurements", meas}, &out, &out)
		if i == 0 && (err != nil || !strings.Contains(out.String(), "over a horizon of 2 steps")) {
			t.Errorf("advise -steps 2: %v\n%s", err, out.String())
		}
		if i == 1 && (err == nil || !strings.Contains(err.Error(), "holds a horizon of 2 steps, not -steps 4")) {
			t.Errorf("advise -steps 4 with measurements of 2: %v", err)
		}
	}
	// The new user's case: every point wants more workers than the
	// recording holds; each skipped point is printed with its reason.
	out.Reset()
	err = run(context.Background(), []string{"sweep", "-gradients", grads, "-sparsifiers", "topk,deft", "-workers", "16", "-density", "0.05", "-out", filepath.Join(dir, "none")}, &out, &out)
	for _, want := range []string{"no point of the grid can run", "topk-w16-d0.05: the recording holds the gradients of 3 workers", "deft-w16-d0.05: the recording holds the gradients of 3 workers"} {
		if err == nil || !strings.Contains(err.Error()+out.String(), want) {
			t.Errorf("sweep -workers 16 of a 3-worker recording: %v\n%s\nwant it to say %q", err, out.String(), want)
		}
	}
	for _, args := range [][]string{
		{"advise", "-gradients", grads, "-model", "ncf", "-workers", "16", "-net-bandwidth", "10"},
		{"sweep", "-gradients", grads, "-lr", "0.1", "-sparsifiers", "topk", "-workers", "2", "-density", "0.1", "-out", "x"},
	} {
		err := run(context.Background(), args, &out, &out)
		if err == nil || !strings.Contains(err.Error(), "with -gradients") {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestReplayUnderMPI: mpirun -np 3 train replay gives the in-process
// replay's reduction (each process reads its own rank's files; the worker
// count is mpirun's, not the recording's), and a resumed replay ends where
// the uninterrupted one does.
func TestReplayUnderMPI(t *testing.T) {
	mpirun := testenv.MPIRun(t)
	data := testenv.SharedData(t, "ml-100k/u.data")
	dir := t.TempDir()
	grads := filepath.Join(dir, "grads")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-model", "ncf", "-data-dir", data, "-workers", "3", "-steps", "4", "-record-gradients", grads,
		"-sparsifier", "deft", "-density", "0.05", "-out", filepath.Join(dir, "trained"), "-quiet"}, &out, &out); err != nil {
		t.Fatalf("train: %v\n%s", err, out.String())
	}
	common := []string{"replay", "-gradients", grads, "-sparsifier", "deft", "-density", "0.05", "-quiet"}
	inproc := filepath.Join(dir, "inproc")
	if err := run(context.Background(), append(slices.Clone(common), "-out", inproc), &out, &out); err != nil {
		t.Fatalf("replay: %v\n%s", err, out.String())
	}
	viaMPI := filepath.Join(dir, "mpi")
	cmd := testenv.Command(t, 3*time.Minute, mpirun, append([]string{"--oversubscribe", "--allow-run-as-root", "-np", "3", os.Args[0]}, append(common, "-out", viaMPI)...)...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mpirun train replay: %v\n%s", err, b)
	}
	// Stopped after 2 steps and resumed.
	resumed := filepath.Join(dir, "resumed")
	if err := run(context.Background(), append(slices.Clone(common), "-steps", "2", "-out", resumed), &out, &out); err != nil {
		t.Fatalf("replay -steps 2: %v\n%s", err, out.String())
	}
	if err := run(context.Background(), []string{"replay", "-resume", resumed, "-steps", "4", "-quiet"}, &out, &out); err != nil {
		t.Fatalf("replay -resume: %v\n%s", err, out.String())
	}
	want := reductions(t, inproc)
	if len(want) != 4 {
		t.Fatalf("%d replayed steps, want 4", len(want))
	}
	for name, d := range map[string]string{"mpirun": viaMPI, "resumed": resumed} {
		if got := reductions(t, d); !slices.Equal(got, want) {
			t.Errorf("%s: %v, in-process %v", name, got, want)
		}
	}
}

// reductions reads each step's actual density, bytes sent and error norm.
func reductions(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			Type          string  `json:"type"`
			Step          int     `json:"step"`
			ActualDensity float64 `json:"actual_density"`
			BytesSent     float64 `json:"bytes_sent"`
			ErrorNorm     float64 `json:"error_norm"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		if r.Type == "step" {
			out = append(out, fmt.Sprint(r.Step, r.ActualDensity, r.BytesSent, r.ErrorNorm))
		}
	}
	return out
}

// TestReplayHelpListsWhatAReplayHonours: train replay -help leaves out the
// flags a replay ignores (-tf32: no model's math; -check-every: its
// parameters never change) and says what -max-time does in a replay (no
// final evaluation); such a flag given is refused.
func TestReplayHelpListsWhatAReplayHonours(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"replay", "-help"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	for _, bad := range []string{"-tf32", "-check-every", "final evaluation"} {
		if strings.Contains(help, bad) {
			t.Errorf("replay -help lists %q:\n%s", bad, help)
		}
	}
	for _, good := range []string{"-max-time", "-sparsifier", "-checkpoint-every", "a replay has no evaluation"} {
		if !strings.Contains(help, good) {
			t.Errorf("replay -help lacks %q", good)
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"replay", "-gradients", t.TempDir(), "-tf32", "-out", t.TempDir()}, &out, &out); err == nil || !strings.Contains(err.Error()+out.String(), "tf32") {
		t.Errorf("replay -tf32: %v\n%s", err, out.String())
	}
}
