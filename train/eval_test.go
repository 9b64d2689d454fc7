package train

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/rundir"
)

func TestEvalBound(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		maxEval, steps, epochs int // epochs: steps per epoch
		want                   int
	}{
		{"whole run: the whole split", 0, 0, 100, 0},
		{"-steps of a whole epoch", 0, 100, 100, 0},
		{"-steps beyond an epoch", 0, 250, 100, 0},
		{"a few steps: the least sample", 0, 5, 2000, ShortRunEvalBatches},
		{"one step", 0, 1, 2000, ShortRunEvalBatches},
		{"more steps: as many batches as steps", 0, 700, 2000, 700},
		{"-max-eval-batches wins", 3, 5, 2000, 3},
		{"-max-eval-batches on a whole run", 7, 0, 100, 7},
	} {
		c := Config{MaxEvalBatches: tc.maxEval, Steps: tc.steps}
		if got := evalBound(c, tc.epochs); got != tc.want {
			t.Errorf("%s: evalBound = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// evalRecords reads the eval records of a run directory.
func evalRecords(t *testing.T, dir string) []metrics.Eval {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []metrics.Eval
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var r metrics.Eval
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.Type == "eval" {
			out = append(out, r)
		}
	}
	return out
}

var evalLineRe = regexp.MustCompile(`(?m)^eval epoch \d+ step \d+ \((.*)\): (.*)$`)

// TestShortLSTMRunEvaluatesALabelledSample: a few LSTM steps are followed
// by an evaluation of a bounded sample of the validation split (not its
// some 600 batches per worker), which metrics.jsonl records with its size
// and the terminal line names as a sample.
func TestShortLSTMRunEvaluatesALabelledSample(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the LSTM and evaluates 100 batches (about 15 s with OpenBLAS)")
	}
	dir := testenv.SharedData(t, filepath.Join("wikitext-2", "valid.txt"))
	const workers = 2
	c := Config{Model: "lstm", DataDir: dir, Workers: Set(workers), Steps: 2, Out: t.TempDir()}
	var out bytes.Buffer
	start := time.Now()
	if err := Run(context.Background(), c, Options{Stdout: &out, Progress: &out}); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	t.Logf("2 steps and the evaluation took %v", time.Since(start).Round(time.Millisecond))
	// What a whole evaluation would cover: the validation tokens cut into
	// eval-batch × workers columns, every row but the last predicted.
	ds, err := LoadDataset(context.Background(), c.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	cols := c.Defaults().EvalBatch.Value() * workers
	total := (len(ds.Wiki.Valid)/cols - 1) * cols
	bptt := models.SmallLSTM(1, 1).BPTT
	evaluated := ShortRunEvalBatches * bptt * cols // each worker's first 50 full windows
	evs := evalRecords(t, c.Out)
	if len(evs) == 0 {
		t.Fatal("no eval record")
	}
	for _, e := range evs {
		if e.Split != "validation" || e.Unit != "tokens" || e.SplitSize != total || e.Evaluated != evaluated {
			t.Errorf("eval record %+v: want split validation, %d of %d tokens", e, evaluated, total)
		}
	}
	m := evalLineRe.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no evaluation line in:\n%s", out.String())
	}
	want := "validation sample: " + metrics.Thousands(evaluated) + " of " + metrics.Thousands(total) + " tokens"
	if !strings.HasPrefix(m[1], want) || !strings.Contains(m[1], "-max-eval-batches") {
		t.Errorf("evaluation line %q: want it to say %q and how to change it", m[0], want)
	}
}

// TestWholeEvaluationIsLabelledWhole: an evaluation of the whole split
// records it so (evaluated = split size) for odd worker counts, and the
// line names the split without calling it a sample; -max-eval-batches
// makes a sample of the size asked for.
func TestWholeEvaluationIsLabelledWhole(t *testing.T) {
	for _, workers := range []int{1, 3, 5} {
		c := ncfConfig(t, workers, 3)
		c.MaxEvalBatches = 0
		c.Quiet = false
		var out bytes.Buffer
		if err := Run(context.Background(), c, Options{Stdout: &out, Progress: &out}); err != nil {
			t.Fatal(err)
		}
		evs := evalRecords(t, c.Out)
		if len(evs) != 2 { // hr10, ndcg10
			t.Fatalf("%d workers: %d eval records", workers, len(evs))
		}
		for _, e := range evs {
			if e.Split != "test" || e.Unit != "users" || e.SplitSize != 943 || e.Evaluated != 943 {
				t.Errorf("%d workers: eval record %+v: want all 943 test users", workers, e)
			}
		}
		if m := evalLineRe.FindStringSubmatch(out.String()); m == nil || m[1] != "test" {
			t.Errorf("%d workers: evaluation line %q, want \"(test)\"", workers, m)
		}

		c = ncfConfig(t, workers, 3) // -max-eval-batches 2, 64 users per batch
		evs = evalRecords(t, runDir(t, c))
		want := 0
		for r := range workers {
			want += min(2*64, (943-r+workers-1)/workers)
		}
		if evs[0].Evaluated != want || evs[0].SplitSize != 943 {
			t.Errorf("%d workers, -max-eval-batches 2: %+v, want %d of 943 users", workers, evs[0], want)
		}
	}
}

// runDir runs c and returns its run directory.
func runDir(t *testing.T, c Config) string {
	t.Helper()
	if err := Run(context.Background(), c, Options{}); err != nil {
		t.Fatal(err)
	}
	return c.Out
}

// cancellingModel cancels the run when its evaluation starts and then
// behaves as an evaluation interrupted by Ctrl-C. Its state is the wrapped
// model's (NCF's dropout masks), so that its checkpoints resume.
type cancellingModel struct {
	models.Model
	cancel context.CancelFunc
}

func (m *cancellingModel) SaveState() ([]byte, error) { return m.Model.(models.Stateful).SaveState() }
func (m *cancellingModel) LoadState(b []byte) error   { return m.Model.(models.Stateful).LoadState(b) }

func (m *cancellingModel) Evaluate(ctx context.Context, b models.Batch, params device.Buffer) (models.EvalResult, error) {
	m.cancel()
	<-ctx.Done()
	return models.EvalResult{}, ctx.Err()
}

// TestInterruptedEvaluationKeepsTheSteps: an interruption during the
// evaluation that follows the last step (here: of -steps 3) leaves the
// checkpoint of those steps and writes the report of the run so far; a
// resume then makes that evaluation.
func TestInterruptedEvaluationKeepsTheSteps(t *testing.T) {
	c := ncfConfig(t, 2, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reports := 0
	err := Run(ctx, c, Options{
		wrapModel: func(m models.Model) models.Model { return &cancellingModel{Model: m, cancel: cancel} },
		Report:    func(string) error { reports++; return nil },
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want the interruption", err)
	}
	ck, err := rundir.Latest(c.Out)
	if err != nil {
		t.Fatalf("no checkpoint after the interrupted evaluation: %v", err)
	}
	if strings.TrimSuffix(filepath.Base(ck), ".ckpt") != fmt.Sprintf("step-%09d", 3) {
		t.Errorf("checkpoint %s, want the one of step 3", ck)
	}
	if reports == 0 {
		t.Error("no report written after the interrupted evaluation")
	}
	if evs := evalRecords(t, c.Out); len(evs) != 0 {
		t.Fatalf("evaluations recorded before the resume: %+v", evs)
	}
	// -resume redoes the evaluation the interruption cut short.
	if err := Run(context.Background(), Config{Resume: c.Out}, Options{}); err != nil {
		t.Fatalf("resuming: %v", err)
	}
	evs := evalRecords(t, c.Out)
	if len(evs) != 2 { // HR@10 and NDCG@10
		t.Fatalf("evaluations after the resume: %+v, want one (two metrics) at step 3", evs)
	}
	for _, e := range evs {
		if e.Step != 3 {
			t.Fatalf("evaluations after the resume: %+v, want one at step 3", evs)
		}
	}
}

// TestEvalProgressBar: on a terminal an evaluation draws a bar of its
// batches (the LSTM's whole validation split is minutes of them), beside
// the epoch's bar, which it leaves alone; elsewhere it draws nothing (and
// counts the batches for the heartbeat).
func TestEvalProgressBar(t *testing.T) {
	var bars, lines bytes.Buffer
	p := &progress{barOut: &bars, out: &lines, term: true}
	p.startEpoch(1, 3, 10)
	epochBar := p.bar
	tick := p.startEval(4)
	if tick == nil {
		t.Fatal("no progress for an evaluation on a terminal")
	}
	for range 4 {
		tick()
	}
	p.endEval()
	if p.bar != epochBar || p.evalBar != nil {
		t.Error("the evaluation's bar replaced the epoch's")
	}
	if !strings.Contains(bars.String(), "evaluating") {
		t.Errorf("bar output %q", bars.String())
	}
	// Without a terminal the evaluation is counted (for the heartbeat's
	// lines), not drawn.
	bars.Reset()
	plain := &progress{barOut: &bars, out: &lines}
	tick = plain.startEval(4)
	tick()
	if plain.evalBar != nil || bars.Len() > 0 || !strings.Contains(plain.status(), "batch 1 of 4 done") {
		t.Errorf("without a terminal: a bar (%q), or the status %q", bars.String(), plain.status())
	}
	plain.endEval()
	if (*progress)(nil).startEval(4) != nil {
		t.Error("a nil progress counts an evaluation")
	}
	(*progress)(nil).endEval()
}
