package train

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sparsegrad/sparsegrad/rundir"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// note records something a reader of the run's results must know — a
// method that does nothing in this configuration, what an adaptive method
// measured — on rank 0: in the rank's log, on the terminal (unless -quiet)
// and in run.json's notes, which the report shows. A note already recorded
// (a resumed run says it again) is not repeated. Other ranks do nothing.
func (w *worker) note(msg string) error {
	if w.rank != 0 {
		return nil
	}
	w.log.Info("note", "msg", msg)
	info := w.runInfo
	if info == nil || slices.Contains(info.Notes, msg) {
		return nil
	}
	info.Notes = append(info.Notes, msg)
	if err := rundir.WriteRun(w.cfg.Out, info); err != nil {
		return fmt.Errorf("train: writing run.json: %w", err)
	}
	if w.out != nil && w.out.prog != nil {
		fmt.Fprintf(w.out.console, "note: %s\n", msg)
	}
	return nil
}

// methodNotes are the notes of a configuration whose method does nothing,
// or less than its name promises, in a run of total steps (perEpoch per
// epoch) on layout, as the method declares them (sparsify.Method.RunNotes).
func methodNotes(cfg Config, layout sparsify.Layout, total, perEpoch int) []string {
	m, ok := sparsify.Lookup(cfg.Sparsifier)
	if !ok {
		return nil
	}
	return m.RunNotes(methodRun(cfg, layout, total, perEpoch))
}

// methodRun is what the method's checks and notes know of the run.
func methodRun(cfg Config, layout sparsify.Layout, total, perEpoch int) sparsify.Run {
	return sparsify.Run{Params: cfg.MethodOptions, Density: cfg.Density.Value(), Model: cfg.Model, Layout: layout,
		Steps: total, StepsPerEpoch: perEpoch, Replay: cfg.Model == RecordedModel || cfg.Gradients != "",
		Optimizer: cfg.Optimizer, Momentum: cfg.Momentum.Value()}
}

// profile hands the reducer the times of the step just done (the run-wide
// number step) when it profiles the backward pass (sparsify.Profiled:
// LAGS' adaptive density), and records what it notes.
func (w *worker) profile(ctx context.Context, step int) error {
	dp := w.dataPath
	if !dp.reducer.Profiling() {
		return nil
	}
	final := make([]time.Time, len(dp.gradFinal))
	for i, ev := range dp.gradFinal {
		if ev == nil {
			continue
		}
		if err := ev.Synchronize(); err != nil {
			return err
		}
		t, err := ev.Time()
		if err != nil {
			return fmt.Errorf("train: timing the gradients for the profile: %w", err)
		}
		final[i] = t
	}
	note, err := dp.reducer.Profile(ctx, w.communicator, step, final)
	if err != nil || note == "" {
		return err
	}
	return w.note(note)
}
