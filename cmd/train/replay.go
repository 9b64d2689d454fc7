package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/sparsegrad/sparsegrad/train"
)

// replayFlags are the flags of train's own that a replay takes (the rest
// are about a model, its data or its update, which a replay has not: no
// -tf32, no model's math; no -check-every, the parameters never change).
var replayFlags = []string{
	"sparsifier", "density", "pipeline", "workers", "steps", "max-time", "seed", "clip", "clip-at", "momentum", "out", "resume", "device", "comm",
	"net-latency", "net-bandwidth", "log-every", "checkpoint-every", "executors", "quiet", "report-assets",
}

// replayUsage are the flags whose text says otherwise in a replay.
var replayUsage = map[string]string{
	"max-time": "stop after this much wall time, e.g. 30m, with a checkpoint (a replay has no evaluation) (0: no limit)",
}

// runReplay is train replay.
func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	tfs, c, _ := newFlags(stderr)
	fs := flag.NewFlagSet("train replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addOptionFlags(fs, c, "gradients")
	method := map[string]bool{}
	keep := map[string]bool{}
	for _, n := range replayFlags {
		keep[n] = true
	}
	tfs.VisitAll(func(f *flag.Flag) {
		if isMethodFlag(f.Name) {
			method[f.Name] = true
			keep[f.Name] = true
		}
		if keep[f.Name] {
			fs.Var(f.Value, f.Name, cmp.Or(replayUsage[f.Name], f.Usage))
		}
	})
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage:
  train replay -gradients DIR -sparsifier M [-density D] -out RUN_DIR [flags]

Runs the sparsifier with error feedback over recorded gradients (each worker's
recorded gradient stands for its fresh gradient at each step; the residual
evolves as in training) and writes a run directory and report as training
does: actual density, bytes, selection and communication time on this
machine's -device, the error-feedback norm. A replay has no loss, accuracy or
update: it shows what the sparsifier sends, not how the model converges.
-workers defaults to the recording's worker count; -steps to all its steps;
for a recording of train, -clip to its run's and, for dgc (whose momentum
correction is part of the reduction), -momentum to its run's SGD momentum.

Flags:
`)
		printFlags(fs.Output(), fs, method)
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("train replay: unexpected argument %q: replay takes only flags", fs.Arg(0))
	}
	if c.Gradients == "" && c.Resume == "" {
		return errors.New("train replay: give -gradients DIR, the folder of a recording (or -resume RUN_DIR)")
	}
	cfg := *c
	cfg.Model = ""
	if cfg.Gradients != "" {
		cfg.Model = train.RecordedModel
	}
	return trainWithFlags(ctx, cfg, fs, args, stdout, stderr)
}
