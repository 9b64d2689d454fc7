package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/layout"
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
	// between says what the run does after its last step, before the next
	// ("" inside a step): "writing its checkpoint", "evaluating".
	between string
}

// setBetween records what the run does between two steps ("": a step).
func (s *runStatus) setBetween(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.between = what
}

// where says where the run stands, for the messages about a signal:
// "during step 8" inside a step, "after step 2415, evaluating" between
// steps (a run killed during its final evaluation was not in a step 2416).
func (s *runStatus) where() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	step := s.step.Load()
	if s.between != "" {
		return fmt.Sprintf("after step %d, %s", step, s.between)
	}
	return fmt.Sprintf("during step %d", step+1)
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

// lastCheckpoint says where the newest checkpoint is and how to continue
// from it, for messages; how is what precedes the command ("resume with").
func (r *runner) lastCheckpoint(how string) string {
	dir, step := r.status.checkpoint()
	if dir == "" {
		return r.noCheckpoint("")
	}
	return fmt.Sprintf("the last checkpoint is %s (step %d); %s: %s", dir, step, how, r.resumeCommand())
}

// fallback is what is left of the run if it ends now, before the
// checkpoint it is writing: the last complete checkpoint and the command
// that resumes from it, or, before the first, that nothing can be resumed.
func (r *runner) fallback() string {
	if dir, _ := r.status.checkpoint(); dir != "" {
		return r.lastCheckpoint("resume from it with")
	}
	return "no checkpoint exists yet to resume from, and the run must start again with another -out (or its folder " + r.cfg.Out + " deleted)"
}

// noCheckpoint is the advice for a run that stopped before its first
// checkpoint, fix (when not "") first: the same command is refused (its
// -out holds this run), and -resume has nothing to continue from.
func (r *runner) noCheckpoint(fix string) string {
	if fix != "" {
		fix += ", then "
	}
	return fmt.Sprintf("no checkpoint was written yet: %sstart the run again with another -out (or delete %s first)", fix, r.cfg.Out)
}

// resumeCommand is the command that continues the run.
func (r *runner) resumeCommand() string {
	cmd := progOf(r.opt) + " -resume " + r.cfg.Out
	if r.backend == "mpi" {
		cmd = mpiLauncher(r.size) + " " + cmd
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

// stepError is an error of training step n (1-based) of 0-based epoch.
type stepError struct {
	n, epoch int
	err      error
}

func (e *stepError) Error() string {
	return fmt.Sprintf("step %d (epoch %d): %v", e.n, e.epoch+1, e.err)
}
func (e *stepError) Unwrap() error { return e.err }

// failed turns an error of the training loop after step steps into the
// job's error: what happened (on which rank, where that matters), at which
// step, the last checkpoint and the command that resumes.
func (w *worker) failed(err error, step int) error {
	var je *jobError
	if err == nil || errors.As(err, &je) {
		return err
	}
	if errors.Is(err, comm.ErrAborted) {
		return err // another rank failed; its error is the job's
	}
	rank := ""
	if w.size > 1 && !errors.Is(err, ErrInterrupted) && !errors.Is(err, ErrDiverged) && !errors.Is(err, ErrConfig) {
		var ce collectiveError
		if !errors.As(err, &ce) {
			rank = fmt.Sprintf(" on rank %d", w.rank)
		}
	}
	how := "resume with"
	last, fix := "", ""
	replayNaN := errors.Is(err, errNonFinite) && w.cfg.Gradients != ""
	switch {
	case replayNaN:
		// A replay changes no gradient: neither the learning rate nor
		// clipping is its to set.
		last = "a replay cannot change the recorded gradients: record the job again (with its gradients clipped, or ending before they diverge), " +
			"or replay this recording with another -sparsifier or a higher -density into a new -out"
	case errors.Is(err, errNonFinite):
		how = "lower -lr or clip gradients (-clip), then resume with"
		fix = "lower -lr or clip gradients (-clip)"
		if dir, _ := w.runner.status.checkpoint(); dir == "" {
			last = w.runner.noCheckpoint(fix)
		}
	}
	if !w.kept && w.cfg.Resume == "" && !replayNaN {
		// Nothing of the run is kept (worker): the command works again.
		last = "nothing of the run was kept: "
		if fix != "" {
			last += fix + ", then "
		}
		last += "run the same command again"
	}
	if last == "" {
		last = w.runner.lastCheckpoint(how)
	}
	var se *stepError
	var ce *ckptError
	var what string
	switch {
	case errors.Is(err, ErrInterrupted) && errors.As(err, &ce):
		what = fmt.Sprintf("interrupted after step %d, but the %v", step, onePrefix(ce))
		if ce.prev != "" {
			last = "resume with: " + w.runner.resumeCommand()
		} else {
			last = ""
		}
	case errors.Is(err, ErrInterrupted):
		what = fmt.Sprintf("interrupted after step %d", step)
	case errors.As(err, &ce):
		// What the failed checkpoint loses, and from where to go on.
		what = fmt.Sprintf("stopped after step %d: its checkpoint was not written: %s", step, ce.msg)
		if ce.prev != "" {
			lost := fmt.Sprintf("steps %d to %d are lost", ce.prevStep+1, step)
			if step == ce.prevStep+1 {
				lost = fmt.Sprintf("step %d is lost", step)
			}
			last = fmt.Sprintf("%s; the last checkpoint is %s (step %d); make room on the disk (or fix the folder), then resume with: %s",
				lost, ce.prev, ce.prevStep, w.runner.resumeCommand())
		} else {
			last = fmt.Sprintf("its %s are lost: no checkpoint was written; make room on the disk (or fix the folder), then start the run again with another -out (or delete %s first)",
				plural(step, "step"), w.cfg.Out)
		}
	case errors.As(err, &se):
		what = fmt.Sprintf("step %d (epoch %d) failed%s: %s", se.n, se.epoch+1, rank, onePrefix(se.err))
	case errors.Is(err, ErrConfig):
		return &jobError{msg: onePrefix(err), err: err}
	default:
		what = fmt.Sprintf("failed after step %d%s: %s", step, rank, onePrefix(err))
	}
	if last != "" {
		what += "; " + last
	}
	return &jobError{msg: what, err: err}
}

// agree returns, identically on every rank, whether rank 0's clock has
// passed Config.MaxTime, less the time kept for the final evaluation
// (evalReserve), and whether any rank was asked to stop.
func (w *worker) agree(ctx context.Context) (timeUp, stop bool, err error) {
	flags := comm.Int32s{0, 0}
	if w.rank == 0 && timeIsUp(w.cfg.MaxTime, time.Since(w.start), w.evalReserve()) {
		flags[0] = 1
	}
	if w.runner.stopRequested() {
		flags[1] = 1
	}
	if err := w.communicator.AllReduce(ctx, flags); err != nil {
		return false, false, fmt.Errorf("agreeing on the time limit and stop requests: %w", err)
	}
	return flags[0] > 0, flags[1] > 0, nil
}

// checkParams compares a hash of every rank's parameters (every
// Config.CheckEvery steps) and stops the run when they differ.
func (w *worker) checkParams(ctx context.Context, step int) error {
	h, err := w.dataPath.paramHash()
	if err != nil {
		return err
	}
	all := make(comm.Int64s, w.size)
	if err := w.communicator.AllGather(ctx, comm.Int64s{int64(h)}, all); err != nil {
		return fmt.Errorf("comparing the workers' parameters: %w", err)
	}
	return collective(diverged(all, step))
}

// diverged returns, when the ranks' parameter hashes are not all equal,
// the error that names the ranks whose parameters differ from the most
// common ones (from rank 0's on a tie), and nil otherwise.
func diverged(hashes []int64, step int) error {
	count := map[int64]int{}
	for _, h := range hashes {
		count[h]++
	}
	if len(count) <= 1 {
		return nil
	}
	ref := hashes[0]
	for _, h := range hashes { // in rank order: the lowest rank wins a tie
		if count[h] > count[ref] {
			ref = h
		}
	}
	var differ, agree []string
	for r, h := range hashes {
		if h == ref {
			agree = append(agree, fmt.Sprint(r))
		} else {
			differ = append(differ, fmt.Sprint(r))
		}
	}
	ranks := func(l []string) string {
		if len(l) == 1 {
			return "rank " + l[0]
		}
		return "ranks " + strings.Join(l, ", ")
	}
	verb := "differs"
	if len(differ) > 1 {
		verb = "differ"
	}
	return fmt.Errorf("%w after step %d: %s %s from %s (a nondeterministic reduction, a bug or a hardware fault)", ErrDiverged, step, ranks(differ), verb, ranks(agree))
}

// stopRequested reports whether a stop was asked for (Options.Stop or a
// signal).
func (r *runner) stopRequested() bool {
	select {
	case <-r.stop:
		return true
	case <-r.opt.Stop: // never ready when nil
		return true
	default:
		return false
	}
}

// handleSignals makes SIGINT, SIGTERM and SIGUSR1 stop the run after the
// current step with a checkpoint (it closes stop), and a second one end the
// process at once. Only rank 0 (every process under mpirun gets the
// signals) prints. It returns a function that undoes it.
//
// Under mpirun, Ctrl-C makes mpirun send SIGTERM to every rank and kill
// them a few seconds later, and so does a rank that dies; SIGUSR1 sent to
// mpirun is forwarded to every rank and stops the job without that limit.
func (r *runner) handleSignals(stop chan struct{}, console io.Writer, rank0 bool) func() {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGUSR1)
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
		where := r.status.where()
		if r.backend == "mpi" && s == syscall.SIGTERM {
			// mpirun kills the ranks a few seconds after its SIGTERM: say
			// what happens if the checkpoint is written, and what is left
			// if it is not, without contradicting the message that follows
			// the checkpoint.
			say("\ntrain: terminated (SIGTERM) by mpirun %s: a rank died or the job was interrupted; if every rank is alive the job stops with a checkpoint and names the command that resumes it; if mpirun kills it before, %s\n",
				where, r.fallback())
		} else {
			again := "Ctrl-C again exits at once"
			if s != os.Interrupt {
				again = "a second signal exits at once"
			}
			say("\ntrain: %s %s: stopping with a checkpoint (%s)\n", sigName(s), where, again)
		}
		r.stopOnce.Do(func() { close(stop) })
		select {
		case s = <-sigs:
		case <-done:
			return
		}
		say("train: %s again: exiting at once %s; %s\n", sigName(s), r.status.where(), r.lastCheckpoint("resume with"))
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
	case syscall.SIGUSR1:
		return "asked to stop (SIGUSR1)"
	}
	return s.String()
}

// collectiveError marks an error every rank returns at the same point (an
// agreed stop, a failed checkpoint, a divergence): under mpirun the ranks
// then end normally instead of aborting the job.
type collectiveError struct{ error }

func (e collectiveError) Unwrap() error { return e.error }

// interruptedBut is the error of an interruption whose checkpoint failed
// with err: collective when err is.
func interruptedBut(err error) error {
	j := errors.Join(ErrInterrupted, err)
	var ce collectiveError
	if errors.As(err, &ce) {
		return collective(j)
	}
	return j
}

// collective marks err as one every rank returns (nil stays nil).
func collective(err error) error {
	if err == nil {
		return nil
	}
	return collectiveError{err}
}

// errNonFinite is wrapped by the errors of a NaN or infinite loss,
// gradient, parameter or state.
var errNonFinite = errors.New("not finite")

// firstNonFinite returns the index of the first NaN or ±Inf in v, or -1.
func firstNonFinite(v []float32) int {
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return i
		}
	}
	return -1
}

// tensorAt names the tensor of ts holding flat element i: its name and
// the element's index within it.
func tensorAt(ts []layout.Tensor, i int) (string, int) {
	for _, t := range ts {
		if i < t.Offset+t.Size {
			return t.Name, i - t.Offset
		}
	}
	return "?", i
}

// nonFinite is the error for v[i] (a vector in layout order) not being
// finite.
func (dp *dataPath) nonFinite(what string, v []float32, i int) error {
	return dp.nonFiniteValue(what, v[i], i)
}

// nonFiniteValue is nonFinite of element i, of value x.
func (dp *dataPath) nonFiniteValue(what string, x float32, i int) error {
	name, j := tensorAt(dp.layout.Tensors, i)
	return fmt.Errorf("%w: the %s is %v in tensor %s (element %d of it)", errNonFinite, what, x, name, j)
}
