package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/advise"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// adviseFlags are the flags of train advise.
type adviseFlags struct {
	gridFlags
	measurements string
	stepTime     time.Duration
	steps        int
	overlap      string
	costProfile  string
	bucketMB     float64
	kind         string
	base         train.Config
	method       sparsify.Values
}

func newAdviseFlags(stderr io.Writer) (*flag.FlagSet, *adviseFlags) {
	fs := flag.NewFlagSet("train advise", flag.ContinueOnError)
	fs.SetOutput(stderr)
	v := &adviseFlags{gridFlags: gridFlags{densities: []float64{0.01}}}
	c := &v.base
	addOptionFlags(fs, c, "model", "dataset", "data_dir", "preset", "batch", "device", "tf32", "blas")
	v.gridFlags.add(fs, gridDocs{
		gradients:   "folder of recorded gradients (python/sparsegrad_record.py, train -record-gradients): advise for that model instead of -model",
		sparsifiers: "methods to rank (default all)",
		workers:     "worker counts P of the cluster, comma-separated, e.g. 16,64,256",
		density:     "densities ρ to rank at, comma-separated",
		bandwidth:   "the cluster network's bandwidth in Gbit/s, comma-separated, e.g. 10,100",
		latency:     "the cluster network's latency per message",
	})
	fs.DurationVar(&v.stepTime, "step-time", 0, "one worker's forward and backward time on the cluster's GPUs, e.g. 85ms (default: measured here, or the recording's measurement)")
	fs.IntVar(&v.steps, "steps", 0, "the horizon: how many steps of the run each method's reducer is run over, with error feedback, to predict what its controller (thresholds, warm-ups, adaptive densities) actually sends (default: a recording's steps; for -model one epoch, on the gradients measured at one step repeated, each reducer stopping once it has settled and the rest of the epoch taken at its settled steps. What cannot be shortened runs step by step: a controller still moving, as MiCRO's threshold does for hundreds of steps, and dense warm-ups (DRAGONN's 200 steps, Ok-Topk's and Top-k DSA's 512, -dense-warmup) with what follows them; on ResNet-18 the default took a 2-core machine 10.5 min, 4 of them MiCRO's threshold and the dense warm-ups (docs/results/advisor-vs-replay.md): a shorter -steps, or -sparsifiers without those methods, advises sooner)")
	fs.StringVar(&v.costProfile, "cost-profile", "", fmt.Sprintf("GPU costs this project measured, kept with their GPU, date and revision, for selection, the update and error feedback when the step time stands for a GPU and this machine has none: %s (a method the profile did not measure is not ranked, GPU cost unknown, unless it calls a measured method's kernel: topka and gtopk take topk's; the header says each cost's source)", strings.Join(advise.CostProfiles(), ", ")))
	fs.StringVar(&v.overlap, "overlap", "on", "on: the baseline is dense as PyTorch DDP runs it, buckets all-reduced during the backward pass; off: dense all-reduce after the backward pass (as DEFT's and MiCRO's released code)")
	fs.StringVar(&v.kind, "kind", "", "kind of model for what is known of each method's accuracy: cnn, rnn, transformer, recommender, mlp or other (default: the model's, or guessed from a recording's parameter names)")
	fs.StringVar(&v.measurements, "measurements", "", "JSON file of this machine's measurements: read if it exists (for the same model), else measured and written there")
	method := addMethodFlags(fs, &v.method)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage:
  train advise -model M -workers P -net-bandwidth B [-net-latency L] [-device cuda] [flags]
  train advise -gradients DIR [-step-time 85ms] -workers P -net-bandwidth B [-device cuda] [flags]

Measures on this machine one training step of the model (or takes -step-time, or a
recording's measured step), each method's selection on the model's real gradients
(on -device) and the in-process collectives, projects every method's time per
iteration at P workers on the network (α-β model), and prints them ranked, saying
plainly when dense all-reduce wins. Only methods whose convergence a paper or this
project has shown for the kind of model are ranked; the others are listed apart,
flagged, with what is known about each method's accuracy (a model of unknown kind
ranks nothing: give -kind). Each method's actual density and bytes come from its
reducer run over -steps steps of the gradients, as its controller moves (default:
one epoch of a -model, each reducer stopping once it has settled; a recording's
steps). Every
speedup is against overlapped dense, as PyTorch DDP runs it (-overlap off: dense
after the backward pass); the header says which.

Flags:
`)
		printFlags(fs.Output(), fs, method)
	}
	return fs, v
}

// runAdvise is train advise.
func runAdvise(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, v := newAdviseFlags(stderr)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("train advise: unexpected argument %q: advise takes only flags", fs.Arg(0))
	}
	if len(v.workers) == 0 {
		return errors.New("train advise: give -workers P, the cluster's worker count (e.g. -workers 16,64)")
	}
	if len(v.gbits) == 0 {
		return errors.New("train advise: give -net-bandwidth B in Gbit/s, the cluster network's (e.g. -net-bandwidth 10)")
	}
	nets, err := advise.ParseNetworks(v.gbits, v.latency)
	if err != nil {
		return fmt.Errorf("train %w", err)
	}
	methods := v.sparsifiers
	if len(methods) == 0 {
		methods = advise.Methods()
	}
	for _, m := range methods {
		if _, ok := sparsify.Lookup(m); !ok {
			return fmt.Errorf("train advise: unknown sparsifier %q in -sparsifiers; use %s", m, strings.Join(sparsify.Names(), ", "))
		}
	}
	if v.kind != "" && !slices.Contains(advise.Kinds, advise.Kind(v.kind)) {
		return fmt.Errorf("train advise: -kind %q: use one of cnn, rnn, transformer, recommender, mlp, other", v.kind)
	}
	if v.overlap != "on" && v.overlap != "off" {
		return fmt.Errorf("train advise: -overlap %q: use on (dense as DDP runs it) or off (dense after the backward pass)", v.overlap)
	}
	// Overlapped dense's bucket cap is dense's own option (-bucket-mb), the
	// trainer's flag: the advisor predicts the run that flag would make.
	v.bucketMB = advise.BucketMB
	if b, ok := v.method["bucket_mb"].(float64); ok {
		if !(b > 0) {
			return fmt.Errorf("train advise: -bucket-mb %v (one bucket after the backward pass) is not what overlapped dense predicts: pass -overlap off for dense after the backward pass, or a bucket size in MiB, e.g. 25 (DDP's)", b)
		}
		v.bucketMB = b
	}
	if v.steps < 0 {
		return fmt.Errorf("train advise: -steps %d: want a horizon of at least 1 step (or 0 for the default)", v.steps)
	}
	if v.stepTime < 0 {
		return fmt.Errorf("train advise: -step-time %v: want a positive duration, e.g. 85ms", v.stepTime)
	}
	if v.stepTime > 0 && v.costProfile == "" && !strings.HasPrefix(v.base.Device, "cuda") {
		return fmt.Errorf("train advise: -step-time %v stands for a GPU, but selection, the update and error feedback would be measured here on the CPU: pass -cost-profile %s (costs this project measured on a GPU) or run on a machine with a GPU with -device cuda", v.stepTime, strings.Join(advise.CostProfiles(), "|"))
	}
	// What a -measurements file must be of, and how this machine is
	// measured: -model's training, or the recording's.
	c, dev := v.base, v.base.Device
	fits := func(h *advise.Host) error {
		def := c.Defaults()
		if h.Model != def.Model || h.Dataset != def.Dataset || h.Device != def.Device || h.Preset != def.Preset || h.Batch != def.Batch.Value() {
			return fmt.Errorf("train advise: %s holds measurements of %s (%s) on %s, batch %d, %s, not of %s (%s) on %s, batch %d, %s; use another -measurements file",
				v.measurements, h.Model, h.Preset, h.Dataset, h.Batch, h.Device, def.Model, def.Preset, def.Dataset, def.Batch.Value(), def.Device)
		}
		return nil
	}
	measure := func() (*advise.Host, error) {
		return advise.Measure(ctx, advise.Config{Train: c, Horizon: v.steps, Densities: v.densities, Methods: methods, Params: v.method, Log: stderr})
	}
	if v.gradients != "" {
		given := givenFlags(fs)
		for _, f := range []string{"model", "dataset", "data-dir", "model-size", "batch", "blas", "tf32"} {
			if given[f] {
				return fmt.Errorf("train advise: -%s with -gradients: the recording is the model; drop -%s", f, f)
			}
		}
		fits = func(h *advise.Host) error {
			if h.Recording != v.gradients || !strings.HasPrefix(h.Device, dev) {
				return fmt.Errorf("train advise: %s holds measurements of %s on %s, not of the recording %s on %s; use another -measurements file", v.measurements, h.Model, h.Device, v.gradients, dev)
			}
			return nil
		}
		measure = func() (*advise.Host, error) {
			return advise.MeasureRecorded(ctx, advise.RecordedConfig{Dir: v.gradients, StepTime: v.stepTime, Device: dev, Kind: advise.Kind(v.kind),
				Steps: v.steps, Densities: v.densities, Methods: methods, Params: v.method, Log: stderr})
		}
	}
	h, saveErr, err := measured(v, stderr, fits, measure)
	if err != nil {
		return err
	}
	if v.stepTime > 0 && h.StepSource != "given" {
		// The cluster's step replaces the one measured here.
		scale := v.stepTime.Seconds() / h.Compute
		h.Compute, h.Forward, h.Backward, h.StepSource = v.stepTime.Seconds(), h.Forward*scale, h.Backward*scale, "given"
	}
	if v.costProfile != "" {
		p, err := advise.LoadCostProfile(v.costProfile)
		if err != nil {
			return fmt.Errorf("train %w", err)
		}
		h.ApplyCostProfile(p)
	}
	if why := h.MixesDevices(); why != "" {
		return fmt.Errorf("train advise: %s", why)
	}
	if v.kind != "" {
		h.Kind = advise.Kind(v.kind)
	}
	for _, d := range v.densities {
		for _, net := range nets {
			for _, P := range v.workers {
				s := advise.Setting{Workers: P, Density: d, Net: net, Params: v.method, NoOverlap: v.overlap == "off", BucketMB: v.bucketMB}
				ranked, skipped, err := advise.Rank(h, s, methods)
				if err != nil {
					return fmt.Errorf("train %w", err)
				}
				if err := advise.WriteTable(stdout, h, s, ranked, skipped); err != nil {
					return err
				}
			}
		}
	}
	// The tables come first: minutes of measuring are not lost with the
	// file.
	return saveErr
}

// measured returns the measurements of -measurements when the file exists
// (fits says whether they are of this advice's model; they must cover
// -density's densities and -steps' horizon), or measures and saves them
// there. The file is
// checked before measuring; when it cannot be written after all (saveErr:
// the disk filled up meanwhile), the measurements still come back, for the
// tables.
func measured(v *adviseFlags, stderr io.Writer, fits func(*advise.Host) error, measure func() (*advise.Host, error)) (h *advise.Host, saveErr, err error) {
	if v.measurements != "" {
		if st, err := os.Stat(v.measurements); err == nil && st.IsDir() {
			return nil, nil, fmt.Errorf("train advise: -measurements %s is a folder; give a file name, e.g. %s", v.measurements, filepath.Join(v.measurements, "measurements.json"))
		}
		h, err := advise.ReadHost(v.measurements)
		switch {
		case err == nil:
			if err := fits(h); err != nil {
				return nil, nil, err
			}
			if v.steps > 0 && h.HorizonSteps != v.steps {
				return nil, nil, fmt.Errorf("train advise: %s holds a horizon of %d steps, not -steps %d; use another -measurements file (or drop -steps)", v.measurements, h.HorizonSteps, v.steps)
			}
			for _, d := range v.densities {
				if !slices.ContainsFunc(h.Unions, func(u advise.Union) bool { return u.Density == d }) {
					return nil, nil, fmt.Errorf("train advise: %s holds no measurements at density %g; use another -measurements file (or delete it to measure again)", v.measurements, d)
				}
			}
			fmt.Fprintf(stderr, "using the measurements in %s\n", v.measurements)
			return h, nil, nil
		case !errors.Is(err, os.ErrNotExist):
			if werr := checkWritable(v.measurements); werr != nil {
				return nil, nil, werr // e.g. a path through a file
			}
			return nil, nil, fmt.Errorf("train %w", err)
		}
		if err := checkWritable(v.measurements); err != nil {
			return nil, nil, err
		}
	}
	h, err = measure()
	if err != nil {
		if strings.HasPrefix(err.Error(), "train:") {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("train %w", err)
	}
	if v.measurements != "" {
		if err := advise.WriteHost(v.measurements, h); err != nil {
			return h, fmt.Errorf("train advise: the measurements were not saved to %s (%v): the tables above are from them; the next call measures again", v.measurements, err), nil
		}
	}
	return h, nil, nil
}

// checkWritable says why the measurements file at path cannot be written,
// before minutes of measuring (nil when it can): it creates and removes a
// file beside it, in the folder where advise.WriteHost writes its
// temporary file.
func checkWritable(path string) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("train advise: -measurements %s cannot be written (%v); give a file in a folder you can write to, or leave -measurements out", path, err)
	}
	f.Close()
	return os.Remove(tmp)
}
