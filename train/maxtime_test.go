package train

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/rundir/rundirtest"
)

// slowModel sleeps stepSleep in every training step and evalSleep in
// every evaluation batch: a model whose phases take long.
type slowModel struct {
	models.Model
	stepSleep, evalSleep time.Duration
}

func (m *slowModel) TrainStep(ctx context.Context, b models.Batch, p, g device.Buffer) (models.StepResult, error) {
	time.Sleep(m.stepSleep)
	return m.Model.TrainStep(ctx, b, p, g)
}

func (m *slowModel) Evaluate(ctx context.Context, b models.Batch, p device.Buffer) (models.EvalResult, error) {
	time.Sleep(m.evalSleep)
	return m.Model.Evaluate(ctx, b, p)
}

func slow(step, eval time.Duration) func(models.Model) models.Model {
	return func(m models.Model) models.Model { return &slowModel{Model: m, stepSleep: step, evalSleep: eval} }
}

// TestMaxTimeBoundsTheWholeRun: -max-time 2s on a model whose whole
// evaluation takes 3 s (15 batches per worker of 200 ms) stops training
// before the limit and ends its final evaluation at the first batch past
// it (at most one batch per worker before it: the time kept for it is at
// most a tenth of the limit), not 3 s later with the whole split;
// metrics.jsonl and the terminal call it a sample cut short by -max-time.
func TestMaxTimeBoundsTheWholeRun(t *testing.T) {
	const users = 64 // per evaluation batch (-eval-batch's default for ncf)
	for _, workers := range []int{1, 2} {
		c := ncfConfig(t, workers, 0)
		c.MaxEvalBatches, c.MaxTime, c.Quiet = 0, 2*time.Second, false
		var out bytes.Buffer
		if err := Run(context.Background(), c, Options{Stdout: &out, Progress: &out, wrapModel: slow(time.Millisecond, 200*time.Millisecond)}); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d workers:\n%s", workers, out.String())
		recs := rundirtest.Records(t, c.Out)
		lastStep := 0.0
		for _, r := range recs {
			if r["type"] == "step" {
				lastStep = r["wall"].(float64)
			}
		}
		evals := evalRecords(t, c.Out)
		if len(evals) == 0 {
			t.Fatalf("%d workers: no evaluation", workers)
		}
		ev := evals[len(evals)-1]
		// The last step started before the limit (it may end after it on
		// a loaded machine).
		if lastStep == 0 || lastStep >= c.MaxTime.Seconds()+2 {
			t.Errorf("%d workers: the last step ended at %.2f s, long after -max-time %v", workers, lastStep, c.MaxTime)
		}
		if ev.Evaluated == 0 || ev.Evaluated > 2*users*workers || ev.SplitSize != 943 {
			t.Errorf("%d workers: the final evaluation covered %d of %d users, want at most 2 batches of %d per worker", workers, ev.Evaluated, ev.SplitSize, users)
		}
		if !regexp.MustCompile(`eval epoch 1 step [1-9]\d* \(test sample: \d+ of 943 users; -max-time left no time for the whole split\)`).MatchString(out.String()) {
			t.Errorf("%d workers: the terminal does not say that -max-time cut the evaluation short", workers)
		}
	}
}

// timedWriter records when each write happened.
type timedWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	times []time.Time
}

func (w *timedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.times = append(w.times, time.Now())
	return w.buf.Write(b)
}

// TestHeartbeatWhenNotATerminal: with its output not a terminal, a run
// whose steps and evaluation batches are slow prints where it stands at
// least every heartbeat (here 150 ms): within an epoch (the step, the
// loss) and during the evaluation (the batch).
func TestHeartbeatWhenNotATerminal(t *testing.T) {
	defer func(h time.Duration) { heartbeat = h }(heartbeat)
	heartbeat = 150 * time.Millisecond
	c := ncfConfig(t, 2, 8)
	c.MaxEvalBatches, c.Quiet = 4, false
	var out timedWriter
	start := time.Now()
	if err := Run(context.Background(), c, Options{Stdout: &out, Progress: &out, wrapModel: slow(100*time.Millisecond, 100*time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	end := time.Now()
	out.mu.Lock()
	defer out.mu.Unlock()
	s := out.buf.String()
	t.Logf("\n%s", s)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^\.\.\. epoch 1/20: step \d of 967 done, mean loss \d\.\d{4}, \d+ samples/s, \d+s so far$`),
		regexp.MustCompile(`(?m)^\.\.\. evaluating, epoch 1/20: batch \d of 4 done, \d+s so far$`),
	} {
		if !want.MatchString(s) {
			t.Errorf("no line matching %s", want)
		}
	}
	// From the first line (after the set-up) to the end, no gap is much
	// longer than a heartbeat (a loaded machine delays the goroutine that
	// prints, by up to 0.8 s under -race with 100 other processes).
	if len(out.times) == 0 {
		t.Fatal("no output")
	}
	prev := out.times[0]
	for _, at := range append(out.times, end) {
		if gap := at.Sub(prev); gap > heartbeat+1500*time.Millisecond {
			t.Errorf("%v without a line (heartbeat %v)", gap, heartbeat)
		}
		prev = at
	}
	if strings.Count(s, "... ") < 4 {
		t.Errorf("%d heartbeat lines in a run of %v with nothing else to say for most of it", strings.Count(s, "... "), end.Sub(start))
	}
}
