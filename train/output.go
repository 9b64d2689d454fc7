package train

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/rundir"
)

// output is what rank 0 writes besides checkpoints: the metrics file, the
// console progress and the HTML report. The other ranks have none (a nil
// *output, whose methods do nothing).
type output struct {
	metrics *rundir.Metrics
	prog    *progress // nil with Config.Quiet
	rep     *reporter // nil without Options.Report
	// reportPath is where rep writes the report, printed when the run ends;
	// reportCmd the command that writes it again.
	reportPath, reportCmd string
	log                   *slog.Logger
	sink                  func(step int, loss float64)
	// console is the progress lines' writer, shared with the report's
	// warnings (written from the report's goroutine).
	console *syncWriter
	// stopBeat ends the progress's heartbeat (nil without one).
	stopBeat func()
}

// openOutput (rank 0) writes run.json (a new run's, info; a resume writes
// it once its checkpoint is accepted, in restore, so that a refused resume
// changes nothing) and opens metrics.jsonl, the progress output and the
// report of the run configured by cfg and opt, logging to log.
func openOutput(cfg Config, opt Options, info *RunInfo, log *slog.Logger) (*output, error) {
	if cfg.Resume == "" {
		if err := rundir.WriteRun(cfg.Out, info); err != nil {
			return nil, fmt.Errorf("train: writing run.json: %w", err)
		}
	}
	mw, err := rundir.OpenMetrics(cfg.Out, cfg.Resume != "")
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	o := &output{metrics: mw, log: log, sink: opt.LossSink, console: newSyncWriter(opt.Stdout)}
	if !cfg.Quiet {
		o.prog = newProgress(opt.Progress, o.console, cfg.Gradients != "")
		o.stopBeat = o.prog.beat(o.console)
		if info.CUDA != nil {
			fmt.Fprintln(o.console, info.CUDA)
		}
	}
	if report := opt.Report; report != nil {
		o.rep = newReporter(func() error { return report(cfg.Out) }, o.reportFailed)
		o.reportPath = filepath.Join(cfg.Out, rundir.ReportFile)
		o.reportCmd = progOf(opt) + " report " + cfg.Out
	}
	return o, nil
}

// step records a step.
func (o *output) step(rec metrics.Step) error {
	if o == nil {
		return nil
	}
	if err := o.metrics.Write(rec); err != nil {
		return err
	}
	if o.prog != nil {
		o.prog.logged(float64(rec.Loss))
	}
	if o.sink != nil {
		o.sink(rec.Step, float64(rec.Loss))
	}
	return nil
}

// eval records an evaluation.
func (o *output) eval(epoch, step int, wall metrics.Num, ev evaluation) error {
	if o == nil {
		return nil
	}
	for _, m := range ev.metrics {
		if err := o.metrics.Write(metrics.Eval{Type: "eval", Epoch: epoch + 1, Step: step, Wall: wall, Metric: m.Name, Value: metrics.Num(m.Value),
			Split: ev.split, Evaluated: ev.count, SplitSize: ev.total, Unit: ev.unit}); err != nil {
			return err
		}
	}
	if o.prog != nil {
		o.prog.eval(epoch+1, step, ev)
	}
	return nil
}

// progress returns the console progress (nil when there is none).
func (o *output) progress() *progress {
	if o == nil {
		return nil
	}
	return o.prog
}

// refreshReport asks for a report of the run so far, without waiting.
func (o *output) refreshReport() {
	if o != nil {
		o.rep.refresh()
	}
}

// close closes the metrics file and, when final, writes the final report
// (after any refresh still running) and prints where it is; either way no
// report goroutine is left.
func (o *output) close(final bool) error {
	if o == nil {
		return nil
	}
	if o.stopBeat != nil {
		o.stopBeat()
	}
	err := o.metrics.Close()
	if o.rep.finish(final) && o.prog != nil {
		fmt.Fprintf(o.console, "report: %s (open it in a browser)\n", o.reportPath)
	}
	return err
}

// warn reports a problem that does not stop training: in the rank's log and
// on the console.
func (o *output) warn(msg string, err error) {
	o.log.Warn(msg, "err", err)
	if o.prog != nil {
		fmt.Fprintf(o.console, "warning: %s: %v\n", msg, err)
	}
}

// reportFailed warns that report.html could not be written, and removes
// the one there: it shows an earlier state of the run, and must not pass
// for the report of the run as it is now.
func (o *output) reportFailed(err error) {
	if os.Remove(o.reportPath) == nil {
		err = fmt.Errorf("%w; the earlier report.html, of an older state of the run, was removed", err)
	}
	o.warn("report.html not written", fmt.Errorf("%w; once fixed, write it with: %s", err, o.reportCmd))
}

// syncWriter serialises writes of several goroutines and remembers when
// the last one was.
type syncWriter struct {
	mu   sync.Mutex
	w    io.Writer
	last time.Time
}

func newSyncWriter(w io.Writer) *syncWriter { return &syncWriter{w: w, last: time.Now()} }

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = time.Now()
	return s.w.Write(b)
}

// lastWrite is when the last write was (or the writer was made).
func (s *syncWriter) lastWrite() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// reporter writes report.html off the training critical path. refresh asks
// for a report and returns at once; one goroutine writes the reports, one
// at a time, and a refresh asked for while one is being written is
// coalesced into one more; finish waits for that goroutine to end and then
// writes the final report itself. So training never waits for a report
// (which may fetch ECharts with npm) until the run has ended, and two
// writers never touch report.html at once. Errors are reported to warn.
type reporter struct {
	write func() error
	warn  func(error)
	req   chan struct{} // holds at most one pending refresh
	done  chan struct{} // closed when the goroutine has ended
}

// newReporter starts the reporter's goroutine.
func newReporter(write func() error, warn func(error)) *reporter {
	r := &reporter{write: write, warn: warn, req: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for range r.req {
			r.writeOne()
		}
	}()
	return r
}

// writeOne writes a report and reports whether it was written.
func (r *reporter) writeOne() bool {
	if err := r.write(); err != nil {
		r.warn(err)
		return false
	}
	return true
}

// refresh asks for a report of the run so far and returns at once.
func (r *reporter) refresh() {
	if r == nil {
		return
	}
	select {
	case r.req <- struct{}{}:
	default: // one is pending already: it will see the same or newer data
	}
}

// finish ends the goroutine (a refresh being written completes, a pending
// one is dropped) and then, when final, writes the final report; it
// reports whether the final report was written. It must be called once.
func (r *reporter) finish(final bool) bool {
	if r == nil {
		return false
	}
	select {
	case <-r.req:
	default:
	}
	close(r.req)
	<-r.done
	return final && r.writeOne()
}
