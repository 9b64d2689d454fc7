package train

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/rundir"
	"github.com/sparsegrad/sparsegrad/rundir/rundirtest"
)

// readInfo reads the run.json of dir.
func readInfo(t *testing.T, dir string) *RunInfo {
	t.Helper()
	info := &RunInfo{}
	if err := rundir.ReadRun(dir, info); err != nil {
		t.Fatal(err)
	}
	return info
}

// TestRunJSONSaysHowTheRunEnded: run.json records how a run ended — an
// interruption at its step with its checkpoint, a run stopped by -steps, a
// completed one — and a resume says how the run had ended before it
// (killed: run.json said running while nobody held the lock) and records
// the new end.
func TestRunJSONSaysHowTheRunEnded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// One epoch of 2 workers with batches of 16384 is a few steps.
	c := ncfConfig(t, 2, 0)
	c.Batch, c.Epochs = Set(16384), Set(1)
	if err := Run(ctx, c, stopAt(2)); !errors.Is(err, ErrInterrupted) {
		t.Fatalf("stopped run: %v, want an interruption", err)
	}
	info := readInfo(t, c.Out)
	if info.Status != metrics.StatusInterrupted || info.End == nil {
		t.Fatalf("interrupted run: status %q, end %+v", info.Status, info.End)
	}
	e := info.End
	if e.Step != 2 || e.CheckpointStep != 2 || e.Checkpoint == "" || e.StepsPerEpoch <= 2 || e.TotalSteps != e.StepsPerEpoch || e.Time.Before(info.Start) {
		t.Errorf("interrupted after step 2 of one epoch: end %+v", e)
	}
	if rundir.Held(c.Out) {
		t.Error("the lock is held after the run returned")
	}

	// A killed process leaves run.json saying running.
	info.Status, info.End = metrics.StatusRunning, nil
	if err := rundir.WriteRun(c.Out, info); err != nil {
		t.Fatal(err)
	}
	if err := Run(ctx, Config{Resume: c.Out, Quiet: true}, Options{}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	info = readInfo(t, c.Out)
	if info.Status != metrics.StatusCompleted || info.End == nil || info.End.Step != info.End.TotalSteps {
		t.Fatalf("completed run: status %q, end %+v", info.Status, info.End)
	}
	if len(info.Resumes) != 1 || info.Resumes[0].After != metrics.StatusKilled {
		t.Errorf("the resume's record of how the run had ended: %+v, want %q", info.Resumes, metrics.StatusKilled)
	}

	// -steps.
	c = ncfConfig(t, 3, 3)
	if err := Run(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	info = readInfo(t, c.Out)
	if info.Status != metrics.StatusStopped || info.End == nil || info.End.Step != 3 || info.End.Reason != fmt.Sprint(stopMaxSteps) {
		t.Fatalf("run stopped by -steps: status %q, end %+v", info.Status, info.End)
	}
	if err := Run(ctx, Config{Resume: c.Out, Steps: 4, Quiet: true}, Options{}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	info = readInfo(t, c.Out)
	if info.Status != metrics.StatusStopped || info.End.Step != 4 || len(info.Resumes) != 1 || info.Resumes[0].After != metrics.StatusStopped {
		t.Fatalf("resumed to -steps 4: status %q, end %+v, resumes %+v", info.Status, info.End, info.Resumes)
	}
}

// TestResumeChecksTheRecord: a resume over a damaged metrics.jsonl — a
// line that does not parse, a hole in the step records — is refused,
// naming the line and the fix, and changes nothing; a last line cut short
// by a crash is dropped and the resume goes on; step records -log-every
// apart are no hole.
func TestResumeChecksTheRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := ncfConfig(t, 2, 6)
	c.LogEvery = Set(2)
	if err := Run(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(c.Out, rundir.MetricsFile)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(orig), "\n")
	lines = lines[:len(lines)-1] // the empty string after the last newline
	stepLine := func(step int) int {
		for i, l := range lines {
			if strings.Contains(l, `"type":"step"`) && strings.Contains(l, fmt.Sprintf(`"step":%d,`, step)) {
				return i
			}
		}
		t.Fatalf("no record of step %d in\n%s", step, orig)
		return -1
	}
	runJSON, err := os.ReadFile(filepath.Join(c.Out, rundir.RunFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		edit  func() []string
		wants []string
	}{
		{"garbage", func() []string {
			i := stepLine(4)
			return append(slices.Clone(lines[:i]), append([]string{"{\"type\":\"step\",\"ste\x00\n"}, lines[i:]...)...)
		}, []string{fmt.Sprintf("line %d does not parse", stepLine(4)+1), "another -out"}},
		{"hole", func() []string {
			i := stepLine(4)
			return append(slices.Clone(lines[:i]), lines[i+1:]...)
		}, []string{fmt.Sprintf("line %d records step 6 after step 2: the records of steps 3–5 are missing", stepLine(4)+1)}},
		{"repeated", func() []string {
			l := slices.Clone(lines)
			l[stepLine(4)] = l[stepLine(2)]
			return l
		}, []string{fmt.Sprintf("line %d records step 2 after step 2 (line %d)", stepLine(4)+1, stepLine(2)+1), "out of order"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Join(tc.edit(), "")
			if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
				t.Fatal(err)
			}
			err := Run(ctx, Config{Resume: c.Out, Steps: 8, Quiet: true}, Options{})
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("resume over a damaged record: %v, want a refusal", err)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q does not say %q", err, w)
				}
			}
			if b, _ := os.ReadFile(path); string(b) != bad {
				t.Error("the refused resume changed metrics.jsonl")
			}
			if b, _ := os.ReadFile(filepath.Join(c.Out, rundir.RunFile)); string(b) != string(runJSON) {
				t.Error("the refused resume changed run.json")
			}
		})
	}
	// A last line cut short (a crash while writing it) is no damage.
	cut := string(orig[:len(orig)-1])
	cut = cut[:strings.LastIndexByte(cut, '\n')+1] + `{"type":"step","step":7,"lo`
	if err := os.WriteFile(path, []byte(cut), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Run(ctx, Config{Resume: c.Out, Steps: 8, Quiet: true}, Options{}); err != nil {
		t.Fatalf("resume after a cut last line: %v", err)
	}
	if b, _ := os.ReadFile(path); strings.Contains(string(b), `"lo`+"\n") || !strings.Contains(string(b), `"step":8,`) {
		t.Errorf("the resumed record:\n%s", b)
	}
}

// TestOneWorkerNetworkNote: an emulated network with one worker is
// accepted (a sweep's 1-worker points) and noted in one line, in run.json
// and on the terminal; with two workers there is no such note.
func TestOneWorkerNetworkNote(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, n := range []int{1, 2} {
		c := ncfConfig(t, n, 2)
		c.NetLatency, c.NetBandwidth = 50*time.Microsecond, 10e9/8 // 10 Gbit/s, in bytes per second
		c.Quiet = false
		var out strings.Builder
		if err := Run(ctx, c, Options{Stdout: &out, Progress: &out}); err != nil {
			t.Fatal(err)
		}
		noted := 0
		for _, s := range readInfo(t, c.Out).Notes {
			if strings.Contains(s, "with one worker: nothing is sent") {
				noted++
			}
		}
		printed := strings.Count(out.String(), "note: -net-bandwidth and -net-latency with one worker")
		if want := map[int]int{1: 1, 2: 0}[n]; noted != want || printed != want {
			t.Errorf("%d workers: %d notes in run.json, %d printed, want %d\n%s", n, noted, printed, want, out.String())
		}
	}
}

// TestResumedEpochMeanLoss: the epoch line of an epoch the run resumed in
// says so, and its mean loss covers the whole epoch: the same as the
// uninterrupted run's.
func TestResumedEpochMeanLoss(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := ncfConfig(t, 2, 0)
	c.Batch, c.Epochs, c.Quiet = Set(16384), Set(1), false
	epochLine := func(out string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "epoch 1/1") {
				return l
			}
		}
		t.Fatalf("no epoch line in\n%s", out)
		return ""
	}
	meanLoss := func(line string) string {
		_, rest, ok := strings.Cut(line, ": mean loss ")
		if !ok {
			t.Fatalf("no mean loss in %q", line)
		}
		return strings.Fields(rest)[0]
	}
	var straight strings.Builder
	if err := Run(ctx, c, Options{Stdout: &straight, Progress: &straight}); err != nil {
		t.Fatal(err)
	}
	s := c
	s.Out = t.TempDir()
	var first, resumed strings.Builder
	o := stopAt(3)
	o.Stdout, o.Progress = &first, &first
	if err := Run(ctx, s, o); !errors.Is(err, ErrInterrupted) {
		t.Fatalf("stopped run: %v", err)
	}
	if err := Run(ctx, Config{Resume: s.Out}, Options{Stdout: &resumed, Progress: &resumed}); err != nil {
		t.Fatal(err)
	}
	want, got := epochLine(straight.String()), epochLine(resumed.String())
	if !strings.Contains(got, "resumed after 3 steps of it") || meanLoss(got) != meanLoss(want) {
		t.Errorf("resumed epoch's line %q (mean loss %q), want the mean loss of the straight run's %q (%q) and that it resumed after 3 steps", got, meanLoss(got), want, meanLoss(want))
	}
}

// TestFeedbackLR: -feedback-lr (learning-rate-scaled error feedback) is the
// default's raw form while the learning rate holds (the same losses), takes
// another course when it changes (the one-cycle schedule over the run
// changes it every step), and resumes bit for bit.
func TestFeedbackLR(t *testing.T) {
	cfg := func(scaled, onecycle bool) Config {
		c := ncfConfig(t, 2, 8)
		c.Sparsifier, c.Density, c.Optimizer, c.LR = "topk", Set(0.05), "sgd", Set(0.5)
		c.FeedbackLR = scaled
		if onecycle {
			c.LRSchedule = "onecycle"
		}
		return c
	}
	if a, b := runLosses(t, cfg(false, false)), runLosses(t, cfg(true, false)); !slices.Equal(a, b) {
		t.Errorf("constant learning rate: losses %v without -feedback-lr, %v with", a, b)
	}
	if a, b := runLosses(t, cfg(false, true)), runLosses(t, cfg(true, true)); slices.Equal(a[2:], b[2:]) {
		t.Errorf("one-cycle: the same losses %v with and without -feedback-lr", a)
	}
	straight, split := straightAndSplit(t, cfg(true, true), 4)
	if msg := rundirtest.Diff(straight, split); msg != "" {
		t.Fatalf("-feedback-lr resumed differs from the straight run: %s", msg)
	}
}
