package train

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/rundir"
)

// recordEnd (rank 0) writes into run.json how the run ended — its status,
// the last step, the last checkpoint and why — before the final report is
// written from it. err is what the worker returns; returned is false while
// a panic unwinds it. Other ranks do nothing.
func (w *worker) recordEnd(err error, returned bool) error {
	info := w.runInfo
	if w.rank != 0 || info == nil {
		return nil
	}
	end := &metrics.End{Time: time.Now().UTC(), Step: int(w.runner.status.step.Load()),
		TotalSteps: w.sched.totalSteps(), StepsPerEpoch: w.sched.perEpoch}
	end.Checkpoint, end.CheckpointStep = w.runner.status.checkpoint()
	switch {
	case !returned:
		info.Status, end.Reason = metrics.StatusFailed, fmt.Sprintf("a panic (its stack is in %s)", rundir.LogPath(w.cfg.Out, w.rank))
	case err == nil && (w.ended == stopMaxSteps || w.ended == stopMaxTime):
		info.Status, end.Reason = metrics.StatusStopped, w.ended.String()
	case err == nil:
		info.Status = metrics.StatusCompleted
	case errors.Is(err, ErrInterrupted):
		info.Status, end.Reason = metrics.StatusInterrupted, err.Error()
	default:
		info.Status, end.Reason = metrics.StatusFailed, err.Error()
	}
	info.End = end
	if err := rundir.WriteRun(w.cfg.Out, info); err != nil {
		return fmt.Errorf("train: writing run.json: %w", err)
	}
	return nil
}

// maxLogEvery is the largest -log-every the run resumed with cfg has had:
// this resume's, its run.json's (prev) and any its command lines gave.
// Step records are never further apart than that.
func maxLogEvery(cfg Config, prev *RunInfo) int {
	m := cfg.LogEvery.Value()
	if prev == nil {
		return m
	}
	m = max(m, prev.Config.LogEvery.Value())
	lines := [][]string{prev.CommandLine}
	for _, r := range prev.Resumes {
		lines = append(lines, r.CommandLine)
	}
	for _, args := range lines {
		for i, a := range args {
			name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if name != "log-every" || !strings.HasPrefix(a, "-") {
				continue
			}
			if !hasVal && i+1 < len(args) {
				val = args[i+1]
			}
			if n, err := strconv.Atoi(val); err == nil {
				m = max(m, n)
			}
		}
	}
	return m
}

// runNotes are the notes of a configuration that asks for something the
// run cannot do, without being wrong (a sweep may include such points): an
// emulated network with one worker, which sends nothing.
func runNotes(cfg Config, workers int) []string {
	if workers == 1 && cfg.NetBandwidth != 0 {
		return []string{"-net-bandwidth and -net-latency with one worker: nothing is sent, so the emulated network changes nothing (give -workers 2 or more to see its effect)"}
	}
	return nil
}
