package train

import (
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/sparsegrad/sparsegrad/metrics"
)

// heartbeat is the longest a run whose progress bars do not go to a
// terminal (a log file, a pipe, a batch system) goes without a line on its
// output: a long epoch, evaluation or checkpoint prints where it stands at
// least this often, so that a quiet log never looks like a hung run.
var heartbeat = 30 * time.Second

// progress is rank 0's console output: a progress bar per epoch with the
// loss and samples/s when bars go to a terminal, and one line per epoch and
// evaluation otherwise, with a line at least every heartbeat during a long
// phase.
type progress struct {
	barOut  io.Writer
	out     io.Writer
	term    bool
	bar     *progressbar.ProgressBar
	evalBar *progressbar.ProgressBar // an evaluation's (the epoch's bar is drawn again after it)
	// mu guards what the heartbeat reads (the fields below, which the
	// training goroutine writes).
	mu sync.Mutex
	// inEpoch is set between startEpoch and endEpoch; inEval during an
	// evaluation of evalTotal batches, evalDone of them done since
	// evalStart; phase names what else is going on ("" nothing said).
	inEpoch, inEval     bool
	evalDone, evalTotal int
	evalStart           time.Time
	phase               string
	phaseStart          time.Time
	epoch               int
	epochs              int
	samples             int
	// steps is the number of steps the epoch has left when it starts
	// (all of them, or the rest of an epoch a resumed run continues) and
	// done the number taken so far.
	steps, done int
	start       time.Time
	// last is the latest step's loss; lossSum and lossN add up the losses
	// of the epoch's logged steps (the records of metrics.jsonl, means over
	// the workers), whose mean the epoch line prints.
	last    float64
	lossSum float64
	lossN   int
	// before is the steps of the epoch trained before the run resumed in
	// it (0 otherwise); their logged losses are in lossSum (resumedEpoch).
	before int
	// replay tells that the steps are replays of recorded gradients: no
	// samples pass, so no throughput is printed.
	replay bool
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newProgress(barOut, out io.Writer, replay bool) *progress {
	return &progress{barOut: barOut, out: out, term: isTerminal(barOut), replay: replay}
}

// ratePart is the throughput and sep since start, or nothing in a replay,
// whose steps copy recorded gradients instead of processing samples.
func (p *progress) ratePart(since time.Time, sep string) string {
	if p.replay {
		return ""
	}
	return fmt.Sprintf("%.0f samples/s%s", float64(p.samples)/time.Since(since).Seconds(), sep)
}

func (p *progress) startEpoch(epoch, epochs, steps int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.epoch, p.epochs, p.samples, p.start = epoch, epochs, 0, time.Now()
	p.steps, p.done = steps, 0
	p.last, p.lossSum, p.lossN, p.before = 0, 0, 0, 0
	p.inEpoch = true
	if p.term {
		p.bar = p.newBar(steps, fmt.Sprintf("epoch %d/%d", epoch, epochs))
	}
}

// newBar is a terminal progress bar of n units, described by desc.
func (p *progress) newBar(n int, desc string) *progressbar.ProgressBar {
	return progressbar.NewOptions(n,
		progressbar.OptionSetWriter(p.barOut),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionClearOnFinish(),
	)
}

// resumedEpoch tells that the epoch started resumed after before of its
// steps, whose logged losses (from metrics.jsonl) add up to lossSum over
// lossN records: the epoch's mean loss covers the whole epoch, and its
// line says that the run resumed in it.
func (p *progress) resumedEpoch(before int, lossSum float64, lossN int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.before, p.lossSum, p.lossN = before, lossSum, lossN
}

// logged adds the loss of a logged step (mean over the workers) to the
// epoch's mean.
func (p *progress) logged(loss float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lossSum += loss
	p.lossN++
}

// meanLoss is the mean loss of the epoch's logged steps so far (the latest
// step's loss before any was logged).
func (p *progress) meanLoss() float64 {
	if p.lossN == 0 {
		return p.last
	}
	return p.lossSum / float64(p.lossN)
}

func (p *progress) add(samples int, loss float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.samples += samples
	p.done++
	p.last = loss
	if p.bar != nil {
		p.bar.Describe(strings.TrimSpace(fmt.Sprintf("epoch %d/%d %s%s", p.epoch, p.epochs, p.lossPart(" "), p.ratePart(p.start, ""))))
		p.bar.Add(1)
	}
}

// endEpoch prints the epoch's line: the mean loss of its steps (not the
// last step's, whose batch-to-batch noise made a healthy run look as if it
// diverged), throughput and duration. An epoch the run left before its
// end (-steps, -max-time, an interruption) says so and how far it got, so
// that "epoch 1/90" after 20 steps is not read as a whole epoch; one left
// before its first step prints nothing.
func (p *progress) endEpoch() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inEpoch = false
	if p.bar != nil {
		p.bar.Finish()
		p.bar = nil
	}
	if p.done == 0 && p.steps > 0 {
		return // the run stopped before the epoch's first step: no line
	}
	d := time.Since(p.start)
	what := fmt.Sprintf("epoch %d/%d", p.epoch, p.epochs)
	if p.before > 0 {
		what += fmt.Sprintf(", resumed after %s of it (the mean loss covers the whole epoch)", plural(p.before, "step"))
	}
	if p.done < p.steps {
		what += fmt.Sprintf(", stopped after %s (%s left in the epoch)", plural(p.done, "step"), metrics.Thousands(p.steps-p.done))
	}
	fmt.Fprintf(p.out, "%s: %s%s%v\n", what, p.lossPart(", "), p.ratePart(p.start, ", "), d.Round(time.Millisecond))
}

// lossPart is "mean loss L" and sep, or nothing in a run without a loss
// (a replay of recorded gradients).
func (p *progress) lossPart(sep string) string {
	l := p.meanLoss()
	if math.IsNaN(l) {
		return ""
	}
	return fmt.Sprintf("mean loss %.4f%s", l, sep)
}

// startEval starts an evaluation of batches batches (its progress bar on
// a terminal) and returns the function to call after each batch (nil for
// a nil progress).
func (p *progress) startEval(batches int) func() {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inEval, p.evalDone, p.evalTotal, p.evalStart = true, 0, batches, time.Now()
	var bar *progressbar.ProgressBar
	if p.term {
		p.evalBar = p.newBar(batches, fmt.Sprintf("evaluating, epoch %d/%d", p.epoch, p.epochs))
		bar = p.evalBar
	}
	return func() {
		p.mu.Lock()
		p.evalDone++
		p.mu.Unlock()
		if bar != nil {
			bar.Add(1)
		}
	}
}

// endEval ends the evaluation (removes its progress bar).
func (p *progress) endEval() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inEval = false
	if p.evalBar != nil {
		p.evalBar.Finish()
		p.evalBar = nil
	}
}

// during says that the run is busy with what (e.g. "writing the
// checkpoint of step 200") until the returned function is called; the
// heartbeat names it.
func (p *progress) during(what string) func() {
	if p == nil {
		return func() {}
	}
	p.mu.Lock()
	p.phase, p.phaseStart = what, time.Now()
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		p.phase = ""
		p.mu.Unlock()
	}
}

// status is the heartbeat's line: where the run stands.
func (p *progress) status() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	so := func(t time.Time) string { return time.Since(t).Round(time.Second).String() + " so far" }
	switch {
	case p.phase != "":
		return fmt.Sprintf("%s, %s", p.phase, so(p.phaseStart))
	case p.inEval:
		return fmt.Sprintf("evaluating, epoch %d/%d: batch %s of %s done, %s", p.epoch, p.epochs, metrics.Thousands(p.evalDone), metrics.Thousands(p.evalTotal), so(p.evalStart))
	case p.inEpoch:
		return fmt.Sprintf("epoch %d/%d: step %s of %s done, %s%s%s", p.epoch, p.epochs, metrics.Thousands(p.done), metrics.Thousands(p.steps),
			p.lossPart(", "), p.ratePart(p.start, ", "), so(p.start))
	}
	return "working"
}

// beat prints status on console whenever heartbeat has passed since its
// last line, when the bars do not go to a terminal (where they show the
// progress), until the returned function is called.
func (p *progress) beat(console *syncWriter) func() {
	if p == nil || p.term {
		return func() {}
	}
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			wait := heartbeat - time.Since(console.lastWrite())
			if wait <= 0 {
				fmt.Fprintf(console, "... %s\n", p.status())
				continue
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-done:
				t.Stop()
				return
			}
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}

// eval prints an evaluation's line: the metrics, the split, and, for an
// evaluation of a sample of the split, how much of it was covered.
func (p *progress) eval(epoch, step int, ev evaluation) {
	var parts []string
	for _, m := range ev.metrics {
		parts = append(parts, fmt.Sprintf("%s %.4f", m.Name, m.Value))
	}
	on := ev.split
	if ev.partial() {
		why := "-max-eval-batches sets the size"
		if ev.timeUp {
			why = "-max-time left no time for the whole split"
		}
		on = fmt.Sprintf("%s sample: %s of %s %s; %s", ev.split, metrics.Thousands(ev.count), metrics.Thousands(ev.total), ev.unit, why)
	}
	fmt.Fprintf(p.out, "eval epoch %d step %d (%s): %s\n", epoch, step, on, strings.Join(parts, ", "))
}

// plural is "1 step", "2 steps", "1,000 steps".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return metrics.Thousands(n) + " " + what + "s"
}
