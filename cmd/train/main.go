// Command train trains one model data-parallel with a gradient sparsifier and
// writes a run directory (run.json, metrics.jsonl, checkpoints/, report.html);
// its subcommands compare runs (report), replay recorded gradients (replay),
// run grids of trainings (sweep) and rank the sparsifiers for a cluster
// (advise). -workers N runs N simulated workers in one process; under mpirun
// each process is one worker (mpirun -np 4 train ... gives the same per-step
// losses as train -workers 4 ... for the same seed). Run `train -help` for the
// synopsis of each and the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/reports"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

func main() {
	// A standard output that closes (train ... | head) must not end the
	// run without a word: with SIGPIPE notified, writes to it fail with
	// EPIPE instead of killing the process, and stdoutWatch says so once
	// on standard error while training goes on.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := context.Background(), func() {}
	if len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-") {
		// The subcommands end on Ctrl-C; training stops after its step
		// with a checkpoint (train.Options.Signals).
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	}
	err := run(ctx, os.Args[1:], &stdoutWatch{w: os.Stdout, stderr: os.Stderr}, os.Stderr)
	stop()
	if train.Reported(err) {
		os.Exit(2) // rank 0 of the mpirun job prints it
	}
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "train:") && !strings.HasPrefix(msg, "train ") { // a subcommand's "train sweep: "
			msg = "train: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(2)
	}
}

// stdoutWatch is standard output that says on stderr, once, when it has
// been closed (its reader ended: train ... | head), and then drops what is
// written to it: the command goes on (training, a sweep) and writes its
// results to its folder as before.
type stdoutWatch struct {
	w      io.Writer
	stderr io.Writer
	closed atomic.Bool
}

func (s *stdoutWatch) Write(b []byte) (int, error) {
	if s.closed.Load() {
		return len(b), nil
	}
	n, err := s.w.Write(b)
	if errors.Is(err, syscall.EPIPE) && !s.closed.Swap(true) {
		fmt.Fprintln(s.stderr, "train: standard output was closed (its reader ended, e.g. | head); the command goes on without printing its progress, and writes its results as usual (a run: to its folder, metrics.jsonl and report.html)")
		return len(b), nil
	}
	return n, err
}

// parseFlags parses args with fs. -help (or -h) prints the usage to
// stdout and returns flag.ErrHelp; any other mistake returns one line that
// names it, suggests the flag that was probably meant and points at -help,
// instead of the flag package's full usage (over a hundred lines, which
// scrolled the error itself off the screen).
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	usage := fs.Usage
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		return err
	}
	if err != nil {
		return fmt.Errorf("%w%s; %s -help lists the flags", err, suggestFlag(fs, err), fs.Name())
	}
	return nil
}

// suggestFlag returns " (did you mean -NAME?)" for an undefined flag whose
// name is close to one of fs's, else "".
func suggestFlag(fs *flag.FlagSet, err error) string {
	const prefix = "flag provided but not defined: -"
	msg := err.Error()
	if !strings.HasPrefix(msg, prefix) {
		return ""
	}
	typed := strings.TrimLeft(strings.TrimPrefix(msg, prefix), "-")
	best, bestD := "", 3 // at most two edits away
	fs.VisitAll(func(f *flag.Flag) {
		d := editDistance(typed, f.Name)
		if strings.HasPrefix(f.Name, typed) && len(typed) >= 3 {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = f.Name, d
		}
	})
	if best == "" {
		return ""
	}
	return " (did you mean -" + best + "?)"
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// run is the command with its arguments (without the program name).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "report":
			return helpIsNoError(runReport(args[1:], stdout))
		case "replay":
			return helpIsNoError(runReplay(ctx, args[1:], stdout, stderr))
		case "sweep":
			return helpIsNoError(runSweep(ctx, args[1:], stdout, stderr))
		case "advise":
			return helpIsNoError(runAdvise(ctx, args[1:], stdout, stderr))
		}
	}
	fs, c, summary := newFlags(stderr)
	if err := parseFlags(fs, args, stdout); err != nil {
		return helpIsNoError(err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: train takes only flags (or the report, replay, sweep and advise subcommands)", fs.Arg(0))
	}
	if *summary {
		return printSummary(ctx, *c, stdout)
	}
	return trainWithFlags(ctx, *c, fs, args, stdout, stderr)
}

// trainWithFlags runs the training cfg configures from the flags args
// parsed by fs (train's or a subcommand's: its name, less "train", follows
// the program in run.json's command line).
func trainWithFlags(ctx context.Context, cfg train.Config, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	cmd := append([]string{progName()}, strings.Fields(fs.Name())[1:]...)
	return train.Run(ctx, cfg, train.Options{Stdout: stdout, Progress: stderr, CommandLine: append(cmd, args...),
		Report: writeReport, Signals: true, Given: givenFlags(fs)})
}

// helpIsNoError turns flag.ErrHelp (the usage was asked for, and printed)
// into success: train -help exits 0.
func helpIsNoError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// newFlags declares train's flags: one per general option (package
// options declares them, with their help text and defaults), one per
// method option (declared beside each method), -report-assets and
// -summary.
func newFlags(out io.Writer) (*flag.FlagSet, *train.Config, *bool) {
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	fs.SetOutput(out)
	c := &train.Config{}
	addOptionFlags(fs, c)
	fs.Lookup("sparsifier").Usage += "; one of " + strings.Join(sparsify.Names(), ", ")
	addReportAssetsFlag(fs)
	summary := fs.Bool("summary", false, "print the model's layer table and parameter count, then exit (NCF and LSTM read the data set for their sizes)")
	method := addMethodFlags(fs, &c.MethodOptions)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage:
  train [flags]                      train one model, write a run directory
  train report [-o FILE] RUN_DIR...  compare runs in one HTML report (train report -help)
  train replay -gradients DIR -sparsifier M -out RUN_DIR  run a sparsifier on recorded gradients (train replay -help)
  train sweep -preset NAME -out DIR  run a grid of trainings, one comparison page (train sweep -help)
  train advise -workers P -net-bandwidth B  rank the sparsifiers for a cluster (train advise -help)

Defaults follow the papers' code per model (PyTorch SGD semantics; see package train);
a flag given as 0 is 0, not the default.
Examples:
  train -model ncf -dataset ml-100k -workers 4 -sparsifier deft -density 0.1 -out runs/ncf-deft
  mpirun -np 4 train -model ncf -sparsifier topk -density 0.1 -out runs/ncf-topk-mpi
    (mpirun needs --oversubscribe for more processes than cores, --allow-run-as-root as root)

Flags:
`)
		printFlags(fs.Output(), fs, method)
	}
	return fs, c, summary
}

func printSummary(ctx context.Context, cfg train.Config, out io.Writer) error {
	cfg = cfg.Defaults()
	if cfg.Out == "" {
		cfg.Out = "-" // not written
	}
	if err := cfg.Validate(false); err != nil {
		return err
	}
	ds, err := train.ShapeDataset(ctx, cfg)
	if err != nil {
		return err
	}
	m, err := train.NewModel(cfg, ds, cfg.Seed.Value(), nil)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, m.Summary())
	fmt.Fprintf(out, "%s: %d parameters in %d tensors\n", m.Name(), m.NumParams(), len(m.Layout()))
	return nil
}

// reportUsage is train report's synopsis.
const reportUsage = "train report [-o FILE] [-target VALUE] RUN_DIR..."

// reportFlags are the flags of train report.
func reportFlags(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("train report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.String("o", "", "HTML file to write (default: compare.html in the folder holding the run directories; RUN_DIR/report.html for one run)")
	addReportAssetsFlag(fs)
	fs.Var(bind(options.Option{Key: "target", Kind: options.Float}, &reportTarget), "target", "metric value for the time-to-target ranking (0: the best value every run reaches)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s\n\nWrites one HTML page comparing the runs; with one run directory, that run's own page\n(RUN_DIR/report.html unless -o names another file). Flags may come before or after the\nrun directories.\n\nFlags:\n", reportUsage)
		printFlags(fs.Output(), fs, nil)
	}
	return fs
}

// parseInterspersed parses flags and positional arguments in any order
// (train report runs/a runs/b -o cmp.html as well as train report -o
// cmp.html runs/a runs/b); after "--" everything is positional.
func parseInterspersed(fs *flag.FlagSet, args []string, stdout io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args, stdout); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// defaultCompareOut is where train report writes without -o: compare.html
// in the folder that holds the run directories (their deepest common
// parent), so that a comparison lands beside the runs, not in whatever
// folder the command was started from.
func defaultCompareOut(runDirs []string) (string, error) {
	var common []string
	for i, d := range runDirs {
		abs, err := filepath.Abs(d)
		if err != nil {
			return "", err
		}
		parts := strings.Split(filepath.Dir(filepath.Clean(abs)), string(filepath.Separator))
		if i == 0 {
			common = parts
			continue
		}
		n := 0
		for n < len(common) && n < len(parts) && common[n] == parts[n] {
			n++
		}
		common = common[:n]
	}
	dir := strings.Join(common, string(filepath.Separator))
	if dir == "" {
		dir = string(filepath.Separator)
	}
	out := filepath.Join(dir, "compare.html")
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(wd, out); err == nil && !strings.HasPrefix(rel, "..") {
			out = rel
		}
	}
	return out, nil
}

func runReport(args []string, stdout io.Writer) error {
	fs := reportFlags(stdout)
	dirs, err := parseInterspersed(fs, args, stdout)
	if err != nil {
		return err
	}
	if len(dirs) == 0 {
		return fmt.Errorf("train report: give at least one run directory (%s)", reportUsage)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("train report: %s: no such folder; give run directories written by train -out", d)
		} else if err != nil {
			return fmt.Errorf("train report: %w", err)
		}
	}
	out := fs.Lookup("o").Value.String()
	if len(dirs) == 1 {
		// One run: its own page, rewritten (e.g. by a newer version).
		if out == "" {
			out = filepath.Join(dirs[0], "report.html")
		}
		if err := runPage(out, dirs[0]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s (the report of %s); open it in a browser\n", out, dirs[0])
		return nil
	}
	if out == "" {
		if out, err = defaultCompareOut(dirs); err != nil {
			return fmt.Errorf("train report: %w", err)
		}
	}
	if err := reports.CompareWith(context.Background(), out, dirs, reports.Options{AssetsURL: reportAssets, Target: reportTarget}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (%d runs); open it in a browser\n", out, len(dirs))
	return nil
}
