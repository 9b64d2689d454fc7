package train

import (
	"fmt"
	"slices"

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
// epoch) on layout: every tensor below DRAGONN's size cut-off, a dense
// warm-up as long as the run, DGC's density warm-up as long as the run or
// no momentum to correct, LAGS' adaptive density never profiled.
func methodNotes(cfg Config, layout sparsify.Layout, total, perEpoch int) []string {
	var notes []string
	opts := cfg.MethodOptions
	m, ok := sparsify.Lookup(cfg.Sparsifier)
	if !ok {
		return nil
	}
	if _, ok := m.Param("dense_warmup"); ok {
		if wu := opts.Int("dense_warmup"); wu >= total {
			notes = append(notes, fmt.Sprintf("%s: -dense-warmup %d is at least the run's %d steps: every step is a dense all-reduce and nothing is sparsified; lower -dense-warmup (the method's default is %v)",
				cfg.Sparsifier, wu, total, defaultOf(m, "dense_warmup")))
		}
	}
	if _, ok := m.Param("min_tensor"); ok {
		mt := opts.Int("min_tensor")
		largest := sparsify.Tensor{}
		compressed := 0
		for _, t := range layout.Tensors {
			if t.Size > mt {
				compressed += t.Size
			}
			if t.Size > largest.Size {
				largest = t
			}
		}
		switch {
		case compressed == 0:
			notes = append(notes, fmt.Sprintf("%s: no tensor of %s has more than -min-tensor %d elements (the largest, %s, has %d): every tensor is all-reduced dense and nothing is sparsified; lower -min-tensor (0 compresses every tensor)",
				cfg.Sparsifier, cfg.Model, mt, largest.Name, largest.Size))
		case compressed < layout.N:
			notes = append(notes, fmt.Sprintf("%s: the tensors of more than -min-tensor %d elements, %.1f %% of the %d parameters, are sparsified; the rest is all-reduced dense",
				cfg.Sparsifier, mt, 100*float64(compressed)/float64(layout.N), layout.N))
		}
	}
	if _, ok := m.Param("sparsity_warmup"); ok {
		e := opts.Int("sparsity_warmup")
		if e > 0 && perEpoch == 0 && cfg.Gradients != "" {
			notes = append(notes, fmt.Sprintf("%s: the recording does not say its steps per epoch, so the replay has no density warm-up (-sparsity-warmup %d epochs): every step selects at -density %g",
				cfg.Sparsifier, e, cfg.Density.Value()))
		}
		if e > 0 && total <= e*perEpoch {
			notes = append(notes, fmt.Sprintf("%s: the run's %d steps end within the density warm-up (-sparsity-warmup %d epochs of %d steps): it never reaches -density %g",
				cfg.Sparsifier, total, e, perEpoch, cfg.Density.Value()))
		}
	}
	switch {
	case m.CorrectsMomentum && cfg.Gradients != "" && cfg.Momentum.Value() == 0:
		notes = append(notes, fmt.Sprintf("%s: no SGD momentum to correct (the recording's training gives none): plain error feedback, without DGC's momentum correction; pass -momentum 0.9 for a recording of SGD with momentum",
			cfg.Sparsifier))
	case m.CorrectsMomentum && cfg.Gradients == "" && (cfg.Optimizer != "sgd" || cfg.Momentum.Value() == 0):
		notes = append(notes, fmt.Sprintf("%s: no SGD momentum to correct (-optimizer %s, -momentum %g): plain error feedback, without DGC's momentum correction",
			cfg.Sparsifier, cfg.Optimizer, cfg.Momentum.Value()))
	}
	if cfg.Sparsifier == "lags" && opts.Float("max_ratio") > 0 && total < lagsProfileWarmup+lagsProfileSteps {
		notes = append(notes, fmt.Sprintf("lags: -max-ratio %g: the run's %d steps end before the backward pass is profiled (steps %d–%d), so every group uses -density %g and the adaptive density never acts",
			opts.Float("max_ratio"), total, lagsProfileWarmup+1, lagsProfileWarmup+lagsProfileSteps, cfg.Density.Value()))
	}
	return notes
}

// defaultOf is the declared default of method m's option name.
func defaultOf(m sparsify.Method, name string) any {
	p, _ := m.Param(name)
	return p.Default
}
