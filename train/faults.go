package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

// ErrInterrupted is wrapped by the error of a run stopped by Options.Stop
// or, with Options.Signals, by SIGINT or SIGTERM: it stopped after a step,
// wrote a checkpoint and can be resumed.
var ErrInterrupted = errors.New("interrupted")

// ErrDiverged is wrapped by the error of a run whose workers' parameters
// differ (Config.CheckEvery).
var ErrDiverged = errors.New("the workers' parameters differ")

// runStatus is what the signal handler and the final message know of a
// running job: the steps done and the newest complete checkpoint (rank 0's
// view; in one process every worker's).
type runStatus struct {
	step     atomic.Int64
	mu       sync.Mutex
	ckpt     string
	ckptStep int
}

func (s *runStatus) setCheckpoint(dir string, step int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if step >= s.ckptStep || s.ckpt == "" {
		s.ckpt, s.ckptStep = dir, step
	}
}

func (s *runStatus) checkpoint() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ckpt, s.ckptStep
}

// lastCheckpoint says where the newest checkpoint is, for messages.
func (r *runner) lastCheckpoint() string {
	dir, step := r.status.checkpoint()
	if dir == "" {
		return "no checkpoint was written yet"
	}
	return fmt.Sprintf("the last checkpoint is %s (step %d)", dir, step)
}

// resumeCommand is the command that continues the run.
func (r *runner) resumeCommand() string {
	prog := "train"
	if len(r.opt.CommandLine) > 0 {
		prog = r.opt.CommandLine[0]
	}
	cmd := prog + " -resume " + r.cfg.Out
	if r.backend == "mpi" {
		cmd = fmt.Sprintf("mpirun -np %d %s", r.size, cmd)
	}
	return cmd
}

// jobError is the error of a job that started training: one message that
// says what happened, where, the last checkpoint and how to go on.
type jobError struct {
	msg string
	err error
}

func (e *jobError) Error() string { return "train: " + e.msg }
func (e *jobError) Unwrap() error { return e.err }

// trainPrefix matches the "train: " prefixes of wrapped errors.
var trainPrefix = regexp.MustCompile(`(^|: )(train: )+`)

// onePrefix returns err's message without the "train: " prefixes of the
// errors it wraps.
func onePrefix(err error) string {
	return trainPrefix.ReplaceAllString(err.Error(), "$1")
}

// failed turns an error of the training loop at position p into the job's
// error: what happened (on which rank, where that matters), at which step,
// the last checkpoint and the command that resumes.
func (w *worker) failed(err error, step int) error {
	var je *jobError
	if err == nil || errors.As(err, &je) {
		return err
	}
	if errors.Is(err, comm.ErrAborted) {
		return err // another rank failed; its error is the job's
	}
	msg := onePrefix(err)
	where := fmt.Sprintf("at step %d", step)
	if w.size > 1 && !errors.Is(err, ErrInterrupted) && !errors.Is(err, ErrDiverged) && !errors.Is(err, ErrConfig) {
		where += fmt.Sprintf(" on rank %d", w.rank)
	}
	var next string
	switch {
	case errors.Is(err, ErrInterrupted):
		return &jobError{msg: fmt.Sprintf("%s at step %d: %s; resume with: %s", msg, step, w.r.lastCheckpoint(), w.r.resumeCommand()), err: err}
	case errors.Is(err, errNonFinite):
		next = fmt.Sprintf("%s; lower -lr or clip gradients (-clip) before resuming with %s", w.r.lastCheckpoint(), w.r.resumeCommand())
	case errors.Is(err, ErrConfig):
		return &jobError{msg: msg, err: err}
	default:
		next = fmt.Sprintf("%s; resume with: %s", w.r.lastCheckpoint(), w.r.resumeCommand())
	}
	return &jobError{msg: fmt.Sprintf("%s %s: %s. %s", where, "failed", msg, next), err: err}
}

// agree returns, identically on every rank, whether rank 0's clock has
// passed Config.MaxTime and whether any rank was asked to stop.
func (w *worker) agree(ctx context.Context) (timeUp, stop bool, err error) {
	flags := comm.Int32s{0, 0}
	if w.rank == 0 && w.cfg.MaxTime > 0 && time.Since(w.start) >= w.cfg.MaxTime {
		flags[0] = 1
	}
	if w.r.stopRequested() {
		flags[1] = 1
	}
	if err := w.c.AllReduce(ctx, flags); err != nil {
		return false, false, fmt.Errorf("agreeing on the time limit and stop requests: %w", err)
	}
	return flags[0] > 0, flags[1] > 0, nil
}

// checkParams compares a hash of every rank's parameters (every
// Config.CheckEvery steps) and stops the run when they differ.
func (w *worker) checkParams(ctx context.Context, step int) error {
	h, err := w.paramHash()
	if err != nil {
		return err
	}
	all := make(comm.Int64s, w.size)
	if err := w.c.AllGather(ctx, comm.Int64s{int64(h)}, all); err != nil {
		return fmt.Errorf("comparing the workers' parameters: %w", err)
	}
	var differ []string
	for r := 1; r < w.size; r++ {
		if all[r] != all[0] {
			differ = append(differ, fmt.Sprint(r))
		}
	}
	if len(differ) > 0 {
		return divergedError(differ, step)
	}
	return nil
}

func divergedError(differ []string, step int) error {
	ranks := "rank " + differ[0]
	if len(differ) > 1 {
		ranks = "ranks " + strings.Join(differ, ", ")
	}
	return fmt.Errorf("%w after step %d: %s differ from rank 0 (a nondeterministic reduction, a bug or a hardware fault)", ErrDiverged, step, ranks)
}

// stopRequested reports whether a stop was asked for (Options.Stop or a
// signal).
func (r *runner) stopRequested() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

// handleSignals makes SIGINT and SIGTERM stop the run after the current
// step with a checkpoint (it closes stop), and a second one end the process
// at once. Only rank 0 (every process under mpirun gets the signals)
// prints. It returns a function that undoes it.
func (r *runner) handleSignals(stop chan struct{}, console io.Writer, rank0 bool) func() {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	say := func(format string, a ...any) {
		if rank0 {
			fmt.Fprintf(console, format, a...)
		}
	}
	go func() {
		var s os.Signal
		select {
		case s = <-sigs:
		case <-done:
			return
		}
		from := ""
		if r.backend == "mpi" && s == syscall.SIGTERM {
			from = " (mpirun sends it when the job is interrupted or a rank has died)"
		}
		again := "Ctrl-C again exits at once"
		if s == syscall.SIGTERM {
			again = "a second SIGTERM exits at once"
		}
		say("\ntrain: %v%s during step %d: finishing the step, then writing a checkpoint and stopping (%s)\n",
			sigName(s), from, r.status.step.Load()+1, again)
		r.stopOnce.Do(func() { close(stop) })
		select {
		case s = <-sigs:
		case <-done:
			return
		}
		say("train: %v again: exiting at once during step %d; %s; resume with: %s\n", sigName(s), r.status.step.Load()+1, r.lastCheckpoint(), r.resumeCommand())
		code := 130
		if s == syscall.SIGTERM {
			code = 143
		}
		os.Exit(code)
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
	}
}

func sigName(s os.Signal) string {
	switch s {
	case os.Interrupt:
		return "interrupted (SIGINT)"
	case syscall.SIGTERM:
		return "terminated (SIGTERM)"
	}
	return s.String()
}

// accumulateError explains a failed error-feedback accumulation of the
// gradient elements [lo, hi): the first non-finite gradient element, by
// tensor, or else the residual that overflowed.
func (w *worker) accumulateError(err error, lo, hi int) error {
	if i := firstNonFinite(w.hgrad[lo:hi]); i >= 0 {
		return w.nonFinite("gradient", w.hgrad, lo+i)
	}
	if i := firstNonFinite(w.mem.Residual[lo:hi]); i >= 0 {
		return w.nonFinite("error-compensated gradient (residual + gradient)", w.mem.Residual, lo+i)
	}
	return fmt.Errorf("error feedback: %w", err)
}

// collectiveError marks an error every rank returns at the same point (an
// agreed stop, a failed checkpoint, a divergence): under mpirun the ranks
// then end normally instead of aborting the job.
type collectiveError struct{ error }

func (e collectiveError) Unwrap() error { return e.error }

// collective marks err as one every rank returns (nil stays nil).
func collective(err error) error {
	if err == nil {
		return nil
	}
	return collectiveError{err}
}
