package reports

import (
	"fmt"

	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/rundir"
)

// status is how the run stands, from run.json's status and end: a run
// whose run.json says it is running while no process holds its folder's
// lock was killed (metrics.StatusKilled). Empty for a record written
// before the status was kept.
func (r *Run) status() string {
	s := r.Info.Status
	if s == metrics.StatusRunning && !rundir.Held(r.Dir) {
		return metrics.StatusKilled
	}
	return s
}

// unfinished reports whether the run ended before its last step: its
// last values are not the final ones.
func (r *Run) unfinished() bool {
	switch r.status() {
	case metrics.StatusRunning, metrics.StatusKilled, metrics.StatusInterrupted, metrics.StatusFailed:
		return true
	}
	return false
}

// lastStep is the step the run reached (run.json's end, else its last
// step record) and, when known, the steps it planned and per epoch.
func (r *Run) lastStep() (step, total, perEpoch int) {
	if e := r.Info.End; e != nil && r.Info.Status != metrics.StatusRunning {
		return e.Step, e.TotalSteps, e.StepsPerEpoch
	}
	if n := len(r.Steps); n > 0 {
		step = r.Steps[n-1].Step
	}
	return step, 0, 0
}

// progressText says how far the run got: "after step 1,108 of 2,415 (2 of
// 5 epochs done)", or "after step 1,108" when the plan is not known.
func (r *Run) progressText() string {
	step, total, perEpoch := r.lastStep()
	s := "after step " + metrics.Thousands(step)
	if total > 0 {
		s += " of " + metrics.Thousands(total)
	}
	if epochs := r.Info.Config.Epochs; perEpoch > 0 && epochs > 0 {
		s += fmt.Sprintf(" (%d of %d epochs done)", step/perEpoch, epochs)
	}
	return s
}

// endText says how the run ended, for the run table's status row and the
// headline of an unfinished run: "interrupted after step 1,108 of 2,415
// (2 of 5 epochs done); last checkpoint …". Empty when run.json does not
// say (an older record).
func (r *Run) endText() string {
	st := r.status()
	e := r.Info.End
	var s string
	switch st {
	case "":
		return ""
	case metrics.StatusRunning:
		return "running (" + r.progressText() + " when this page was written)"
	case metrics.StatusKilled:
		s = "killed (its run.json says running, but no process trains it) " + r.progressText() + " (the last step logged)"
	case metrics.StatusCompleted:
		s = "completed " + r.progressText()
	default:
		s = st + " " + r.progressText()
		if e != nil && e.Reason != "" {
			s += ": " + e.Reason
		}
	}
	if r.unfinished() {
		if e != nil && e.Checkpoint != "" && st != metrics.StatusKilled {
			s += fmt.Sprintf("; last checkpoint %s (step %s)", e.Checkpoint, metrics.Thousands(e.CheckpointStep))
		}
		s += "; continue it with train -resume " + r.Dir
	}
	return s
}

// finalWord names the last evaluation: "final", or for an unfinished run
// "last (unfinished run)".
func (r *Run) finalWord() string {
	if r.unfinished() {
		return "last (unfinished run)"
	}
	return "final"
}

// unfinishedMark is what follows an unfinished run's last value in a
// table of several runs (" (interrupted after step 1,108 of 2,415 …)"),
// else "".
func (r *Run) unfinishedMark() string {
	if !r.unfinished() {
		return ""
	}
	return " (unfinished: " + r.status() + " " + r.progressText() + ")"
}
