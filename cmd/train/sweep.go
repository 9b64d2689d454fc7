package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sparsegrad/sparsegrad/advise"
	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/reports"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/sweep"
	"github.com/sparsegrad/sparsegrad/train"
)

// listValue is a comma-separated list flag.
type listValue[T any] struct {
	v     *[]T
	parse func(string) (T, error)
}

func (l listValue[T]) Set(s string) error {
	var out []T
	for _, f := range strings.Split(s, ",") {
		x, err := l.parse(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		out = append(out, x)
	}
	*l.v = out
	return nil
}

func (l listValue[T]) String() string {
	if l.v == nil {
		return ""
	}
	s := make([]string, len(*l.v))
	for i, x := range *l.v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

func (l listValue[T]) Type() string { return "list" }

func parseWorkers(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%q: want a worker count >= 1", s)
	}
	return n, nil
}

func parseFraction(s string) (float64, error) {
	x, err := parseFloat(s)
	if err != nil {
		return 0, err
	}
	if !(x > 0 && x <= 1) {
		return 0, fmt.Errorf("%s: want a fraction in (0, 1], e.g. 0.01", s)
	}
	return x, nil
}

func parseGbit(s string) (float64, error) {
	x, err := parseFloat(s)
	if err != nil {
		return 0, err
	}
	if !(x > 0) {
		return 0, fmt.Errorf("%s: want a bandwidth > 0 in Gbit/s, e.g. 10", s)
	}
	return x, nil
}

func parseName(s string) (string, error) {
	if s == "" {
		return "", errors.New("empty name in the list")
	}
	return s, nil
}

// sweepFlags are the flags of train sweep.
type sweepFlags struct {
	gridFlags
	preset    string
	out       string
	dryRun    bool
	noPredict bool
	base      train.Config
	method    sparsify.Values
}

func newSweepFlags(stderr io.Writer) (*flag.FlagSet, *sweepFlags) {
	fs := flag.NewFlagSet("train sweep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	v := &sweepFlags{}
	c := &v.base
	fs.StringVar(&v.preset, "preset", "", "a named sweep (the papers' comparisons, sized for a small machine): "+strings.Join(sweep.PresetNames(), ", ")+"; \"list\" describes them. Flags given too override the preset's values")
	fs.StringVar(&v.out, "out", "", "output folder: one run folder per grid point under runs/, the comparison page sweep.html")
	v.gridFlags.add(fs, gridDocs{
		gradients:   "a folder of recorded gradients instead of -model: every run replays them (train replay); -steps defaults to all recorded steps",
		sparsifiers: "comma-separated sparsifiers",
		workers:     "comma-separated worker counts, e.g. 2,4,8,16 (simulated workers in this process)",
		density:     "comma-separated densities ρ, e.g. 0.01,0.001 (dense runs once)",
		bandwidth:   "comma-separated emulated network bandwidths in Gbit/s (with -net-latency); default none",
		latency:     "latency of the emulated networks",
	})
	addOptionFlags(fs, c, sweepOptions...)
	fs.BoolVar(&v.dryRun, "dry-run", false, "print each run as an mpirun job (one process per worker, the real network instead of emulated ones) and run nothing")
	fs.BoolVar(&v.noPredict, "no-predict", false, "leave the advisor's predictions (and measuring this machine) out of the page")
	addReportAssetsFlag(fs)
	method := addMethodFlags(fs, &v.method)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage:
  train sweep -preset NAME -data-dir DIR -out DIR [flags]
  train sweep -sparsifiers a,b -workers 2,4 -density 0.01 -steps N -out DIR [flags]
  train sweep -gradients REC -sparsifiers a,b -workers 2,4 -density 0.01 -out DIR [flags]
  train sweep -preset list

Runs a grid of trainings (sparsifiers × worker counts × densities × networks) of one
model one after another, skipping runs already complete in -out (an interrupted sweep
continues), and writes -out/sweep.html comparing them.

Flags:
`)
		printFlags(fs.Output(), fs, method)
	}
	return fs, v
}

// sweepOptions are the general options train sweep takes as flags (one
// value for every run of the grid; -workers, -density and the network are
// the grid's lists).
var sweepOptions = []string{"model", "dataset", "data_dir", "preset", "steps", "max_time", "epochs", "batch", "lr", "seed",
	"eval_every", "log_every", "max_eval_batches", "device", "blas", "pipeline"}

// copyOption sets the option key of dst to src's.
func copyOption(dst, src *train.Config, key string) { dst.Set(key, src.Get(key)) }

// spec builds the sweep's grid from the preset and the flags given.
func (v *sweepFlags) spec(fs *flag.FlagSet) (sweep.Spec, *sweep.Preset, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var s sweep.Spec
	var pr *sweep.Preset
	if v.preset != "" {
		p, err := sweep.LookupPreset(v.preset)
		if err != nil {
			return s, nil, err
		}
		s, pr = p.Spec, &p
		s.Base.DataDir = v.base.DataDir
		s.MethodOptions = maps.Clone(s.MethodOptions)
	}
	b, c := &s.Base, &v.base
	// The preset's values, unless given (without a preset, the flags' own).
	for _, k := range sweepOptions {
		if o, _ := options.Lookup(k); set[o.FlagName()] || v.preset == "" {
			copyOption(b, c, k)
		}
	}
	if set["model"] && !set["dataset"] {
		b.Dataset = "" // the model's first, not the preset's
	}
	if set["sparsifiers"] || v.preset == "" {
		s.Sparsifiers = v.sparsifiers
	}
	if set["workers"] || v.preset == "" {
		s.Workers = v.workers
	}
	if set["density"] || v.preset == "" {
		s.Densities = v.densities
	}
	if set["net-bandwidth"] || v.preset == "" {
		nets, err := advise.ParseNetworks(v.gbits, v.latency)
		if err != nil {
			return s, nil, fmt.Errorf("train sweep: %w", err)
		}
		s.Networks = nets
	} else if set["net-latency"] {
		for i := range s.Networks {
			s.Networks[i].Latency = v.latency
		}
	}
	if s.MethodOptions == nil && len(v.method) > 0 {
		s.MethodOptions = sparsify.Values{}
	}
	for k, x := range v.method {
		s.MethodOptions[k] = x
	}
	if v.gradients != "" {
		// Replays of a recording: no model, data, update or evaluation;
		// the options train replay takes carry over.
		r := train.Config{Model: train.RecordedModel, Gradients: v.gradients}
		for _, k := range sweepOptions {
			switch o, _ := options.Lookup(k); {
			case slices.Contains(replayFlags, o.FlagName()):
				copyOption(&r, b, k)
			case set[o.FlagName()]:
				return s, nil, fmt.Errorf("train sweep: -%s with -gradients: a replay has no model, data, update or evaluation; drop -%s", o.FlagName(), o.FlagName())
			}
		}
		*b = r
	}
	if v.preset == "" && v.gradients == "" && b.Steps == 0 && b.MaxTime == 0 && !b.Epochs.IsSet() {
		return s, nil, errors.New("train sweep: give a budget per run: -steps N, -max-time D or -epochs N (or a -preset)")
	}
	if len(s.Sparsifiers) == 0 {
		return s, nil, errors.New("train sweep: give -sparsifiers (e.g. topk,deft) or a -preset")
	}
	if len(s.Workers) == 0 {
		return s, nil, errors.New("train sweep: give -workers (e.g. 2,4,8) or a -preset")
	}
	return s, pr, nil
}

// runSweep is train sweep.
func runSweep(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, v := newSweepFlags(stderr)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("train sweep: unexpected argument %q: the sweep takes only flags", fs.Arg(0))
	}
	if v.preset == "list" {
		return listPresets(stdout)
	}
	s, pr, err := v.spec(fs)
	if err != nil {
		return err
	}
	if v.out == "" {
		return errors.New("train sweep: give -out DIR, the folder of the sweep's runs and page (an existing one continues its sweep)")
	}
	if v.dryRun {
		if s.Base.DataDir == "" && s.Base.Gradients == "" {
			// The jobs carry the data folder this sweep would read.
			s.Base.DataDir = cmp.Or(os.Getenv("TRAIN_DATA_DIR"), "./data")
		}
		if err := printMPIJobs(stdout, s, v.out, progName(), os.Geteuid() == 0); err != nil {
			return err
		}
		if err := sweep.WriteJobs(v.out, s); err != nil {
			return fmt.Errorf("train %w", err)
		}
		fmt.Fprintf(stdout, "# when the jobs have run, the same command without -dry-run builds %s from their runs (listed in %s)\n",
			filepath.Join(v.out, "sweep.html"), filepath.Join(v.out, sweep.JobsFile))
		return nil
	}
	o := sweep.Options{Log: stdout, Report: reports.Options{AssetsURL: reportAssets}, NoPredict: v.noPredict,
		CommandLine: append([]string{"train", "sweep"}, args...)}
	if pr != nil {
		o.Title = "Sweep " + pr.Name + ": " + pr.Paper
		o.Notes = []string{pr.Doc, "Full-size version (for a machine with many cores or GPUs): " + pr.FullSize}
		o.Claims = pr.Claims
	}
	res, err := sweep.Run(ctx, s, v.out, o)
	if err != nil {
		if !strings.HasPrefix(err.Error(), "sweep:") && !strings.HasPrefix(err.Error(), "train") {
			return fmt.Errorf("train sweep: %w", err)
		}
		return fmt.Errorf("train %w", err)
	}
	for _, v := range res.Verdicts {
		fmt.Fprintln(stdout, v)
	}
	fmt.Fprintf(stdout, "%d runs: %d run now, %d already complete; open %s\n", res.Ran+res.Complete, res.Ran, res.Complete, res.Page)
	return nil
}

// printMPIJobs prints the sweep's runs as mpirun jobs that run as printed:
// one process per worker (mpirun -np P, no -workers), without the emulated
// network's flags, which mpirun's real network replaces (so the grid's
// networks make one job per method, worker count and density), with
// --oversubscribe (more processes than cores; harmless otherwise) and, for
// root, --allow-run-as-root. prog is the train command as typed; go run's
// becomes bin/train, built by the first line. Grid points a method cannot
// run are listed as comments.
func printMPIJobs(w io.Writer, s sweep.Spec, out, prog string, root bool) error {
	pts, skipped, err := s.Jobs()
	if err != nil {
		return err
	}
	mpirun := "mpirun --oversubscribe"
	if root {
		mpirun += " --allow-run-as-root"
	}
	if prog == "go run ./cmd/train" {
		fmt.Fprintln(w, "go build -o bin/train ./cmd/train")
		prog = "bin/train"
	}
	if len(s.Networks) > 0 {
		fmt.Fprintln(w, "# under mpirun the processes talk over the real network: the grid's emulated networks (-net-bandwidth, -net-latency) give one job per run")
	}
	for _, p := range pts {
		fmt.Fprintf(w, "%s -np %d %s %s\n", mpirun, p.Workers, prog, strings.Join(trainArgs(p, filepath.Join(out, "runs", p.Name)), " "))
	}
	for _, sk := range skipped {
		fmt.Fprintf(w, "# not run: %s: %v\n", sk.Name, sk.Reason)
	}
	return nil
}

// trainArgs are the train flags of one point as one process of an mpirun
// job, from the options' declarations: every option the point sets but
// -workers (the job's size) and the emulated network, which mpirun's real
// network replaces; values that are every model's default are left out
// (optionArg).
func trainArgs(p sweep.Point, out string) []string {
	c := p.Config
	a := []string{"-model", c.Model}
	if c.Gradients != "" {
		a = []string{"replay", "-gradients", c.Gradients}
	}
	for _, o := range options.All {
		switch o.Key {
		case "model", "gradients", "workers", "net_latency", "net_bandwidth", "out", "resume":
			continue
		}
		if o.Retired != "" || o.Kind == options.ValueMap {
			continue
		}
		if val, ok := optionArg(o, c.Get(o.Key)); ok {
			a = append(a, "-"+o.FlagName())
			if val != "" {
				a = append(a, val)
			}
		}
	}
	m, _ := sparsify.Lookup(c.Sparsifier)
	for _, k := range slices.Sorted(maps.Keys(c.MethodOptions)) {
		if o, ok := m.Param(k); ok {
			a = append(a, "-"+o.FlagName(), o.Format(c.MethodOptions[k]))
		}
	}
	return append(a, "-out", out)
}

// optionArg returns the flag value that gives the option o the value v
// (c.Get's; "" for a switch that is on), and whether the value needs a
// flag: not for unset or zero values (but an Optional's zero and an empty
// list) nor for the default of every model (but the sparsifier, named even
// when it is dense).
func optionArg(o options.Option, v any) (string, bool) {
	switch x := v.(type) {
	case nil:
		return "", false
	case bool:
		return "", x
	}
	text := o.Format(v)
	if o.Optional {
		return text, true
	}
	if _, list := v.([]int); !list && (text == "" || text == "0" || text == "0s") {
		return "", false
	}
	if len(train.ModelDefaults(o.Key)) == 0 && o.Default != nil && text == o.Format(o.Default) && o.Key != "sparsifier" {
		return "", false
	}
	return text, true
}

// listPresets describes the presets.
func listPresets(w io.Writer) error {
	for _, name := range sweep.PresetNames() {
		p := sweep.Presets[name]
		s := p.Spec
		budget := ""
		switch {
		case s.Base.Steps > 0:
			budget = strconv.Itoa(s.Base.Steps) + " iterations"
		case s.Base.MaxTime > 0:
			budget = s.Base.MaxTime.String()
		}
		nets := "in-process"
		if len(s.Networks) > 0 {
			var n []string
			for _, x := range s.Networks {
				n = append(n, strconv.FormatFloat(x.Bandwidth*8/1e9, 'g', 4, 64)+" Gbit/s "+x.Latency.String())
			}
			nets = "emulated " + strings.Join(n, ", ")
		}
		fmt.Fprintf(w, "%s — %s\n  %s\n  grid: %s × workers %v × density %v, %s network, %s per run, %s on %s (about %.0f minutes on 2 cores)\n  full size: %s\n\n",
			p.Name, p.Paper, p.Doc, strings.Join(s.Sparsifiers, ", "), s.Workers, s.Densities, nets, budget, s.Base.Model, s.Base.Dataset,
			math.Ceil(p.Minutes), p.FullSize)
	}
	return nil
}
