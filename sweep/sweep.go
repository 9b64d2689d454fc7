// Package sweep owns parameter sweeps: a grid of training runs —
// sparsifiers × worker counts × densities (× emulated networks) — of one
// model on one data set with one budget per run (or replays of one
// recording of gradients, train.Config.Gradients, at most its worker
// count), run one after another in
// this process with train.Run, each into a folder of its own under the
// sweep's output folder. A run that completed is never run again, so an
// interrupted sweep continues where it stopped. When the runs are done it
// writes one comparison page (reports.WriteSweep) with the figures the
// papers are built on and the advisor's (package advise) predicted time per
// iteration of every run against the measured one. Named presets
// (Presets) are the papers' main comparisons, sized for a small machine.
// The grid can instead run as mpirun jobs (Spec.Jobs, one process per
// worker on the real network): WriteJobs records the jobs printed, and Run
// then builds the page from their runs once every one has finished.
//
// # The output folder
//
//	OUT/runs/NAME/          one train run directory per grid point (run.json, metrics.jsonl, ...)
//	OUT/runs/NAME/sweep-started.json   written before the run starts
//	OUT/runs/NAME/sweep-complete.json  written when it has completed
//	OUT/measurements.json  the advisor's measurements of this machine (kept, so that
//	                        a continued sweep predicts with the same numbers)
//	OUT/sweep.html          the comparison page
//
// NAME is method-wP-dρ (dense: dense-wP), with -NETWORK appended when the
// grid has networks. A run folder with sweep-started.json but without
// sweep-complete.json was interrupted: it is deleted and run again (runs
// are deterministic for a seed). A run folder without sweep-started.json
// was not made by the sweep and is never touched: the sweep stops and says
// so. A completed run whose recorded configuration differs from what the
// grid now asks for (e.g. a larger budget) stops the sweep too, naming the
// difference: use another output folder, or delete that run.
package sweep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/advise"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/internal/atomicfile"
	"github.com/sparsegrad/sparsegrad/recorded"
	"github.com/sparsegrad/sparsegrad/reports"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// Spec is a grid of runs.
type Spec struct {
	// Base is the configuration every run shares: model, data set, data
	// folder, batch, learning rate, seed, device, logging, and the budget
	// (Steps, MaxTime or Epochs). Its Sparsifier, Density, Workers, network,
	// Out and method options are set per run.
	Base train.Config
	// Sparsifiers, Workers and Densities span the grid (dense runs once per
	// worker count and network, whatever the densities).
	Sparsifiers []string
	Workers     []int
	Densities   []float64
	// Networks are emulated networks (netmodel.Network; only Latency and
	// Bandwidth are used); empty: one, none (in-process communication).
	Networks []netmodel.Network
	// MethodOptions are method options by name; each run takes the ones
	// its method declares.
	MethodOptions sparsify.Values
	// Variants are further runs of a method with other option values
	// (PowerSGD at a second rank), at every worker count, density and
	// network of the grid.
	Variants []Variant
}

// Variant is a method run with Options over the grid's MethodOptions,
// named Label: its points' Method and run folders say Label, their
// Config.Sparsifier the method.
type Variant struct {
	Label, Method string
	Options       sparsify.Values
}

// Point is one run of a grid.
type Point struct {
	// Name is the run's folder name under OUT/runs.
	Name    string
	Method  string
	Workers int
	Density float64
	// Net is the emulated network (zero: none).
	Net netmodel.Network
	// Config is the run's configuration (Out not set).
	Config train.Config
}

// Skipped is a grid point that cannot run, with the reason.
type Skipped struct {
	Name   string
	Reason error
}

// NetLabel names a network in run folder names: 1gbit-50us ("" for none).
func NetLabel(n netmodel.Network) string {
	if n.Bandwidth == 0 {
		return ""
	}
	return strconv.FormatFloat(n.Bandwidth*8/1e9, 'g', 4, 64) + "gbit-" + strings.ReplaceAll(n.Latency.String(), "µ", "u")
}

// Points expands the grid, in the order it runs: by network, method, worker
// count and density. Points a method cannot run (gTop-k on a worker count
// that is not a power of two, SparDL's teams that do not divide it) are
// returned apart. It refuses an empty grid, unknown methods, worker counts
// below 1, densities outside (0, 1], invalid networks, method options
// that apply to no method of the grid and any point whose configuration
// train would refuse (train.Config.Validate), before anything runs.
func (s Spec) Points() ([]Point, []Skipped, error) {
	if len(s.Sparsifiers) == 0 || len(s.Workers) == 0 {
		return nil, nil, errors.New("sweep: the grid is empty: give at least one sparsifier and one worker count")
	}
	hasSparse := slices.ContainsFunc(s.Sparsifiers, func(m string) bool { return m != "dense" })
	if hasSparse && len(s.Densities) == 0 {
		return nil, nil, errors.New("sweep: give at least one density for the sparsifiers")
	}
	for _, w := range s.Workers {
		if w < 1 {
			return nil, nil, fmt.Errorf("sweep: %d workers: every worker count must be at least 1", w)
		}
	}
	for _, d := range s.Densities {
		if !(d > 0 && d <= 1) {
			return nil, nil, fmt.Errorf("sweep: density %v: want a fraction in (0, 1], e.g. 0.01", d)
		}
	}
	nets := s.Networks
	if len(nets) == 0 {
		nets = []netmodel.Network{{}}
	}
	for _, n := range nets {
		if n.Bandwidth == 0 && n.Latency == 0 {
			continue
		}
		if err := (netmodel.Network{Latency: n.Latency, Bandwidth: n.Bandwidth}).Validate(); err != nil {
			return nil, nil, fmt.Errorf("sweep: network: %w", err)
		}
	}
	recWorkers := 0 // a replay's recorded workers
	if s.Base.Gradients != "" {
		rec, err := recorded.Open(s.Base.Gradients)
		if err != nil {
			return nil, nil, fmt.Errorf("sweep: %w", err)
		}
		recWorkers = rec.Manifest.Workers
	}
	used := map[string]bool{}
	for _, m := range s.Sparsifiers {
		meth, ok := sparsify.Lookup(m)
		if !ok {
			return nil, nil, fmt.Errorf("sweep: unknown sparsifier %q; use one of %s", m, strings.Join(sparsify.Names(), ", "))
		}
		for k := range meth.Applicable(s.MethodOptions) {
			used[k] = true
		}
	}
	for k := range s.MethodOptions {
		if !used[k] {
			return nil, nil, fmt.Errorf("sweep: the option %s applies to %s, none of which is in the grid", k, strings.Join(sparsify.MethodsWithParam(k), ", "))
		}
	}
	// The grid's methods, then the variants: label, method, options.
	type entry struct {
		label, method string
		params        sparsify.Values
	}
	var entries []entry
	for _, m := range s.Sparsifiers {
		meth, _ := sparsify.Lookup(m)
		entries = append(entries, entry{m, m, meth.Applicable(s.MethodOptions)})
	}
	for _, v := range s.Variants {
		meth, ok := sparsify.Lookup(v.Method)
		switch {
		case !ok:
			return nil, nil, fmt.Errorf("sweep: variant %q: unknown sparsifier %q; use one of %s", v.Label, v.Method, strings.Join(sparsify.Names(), ", "))
		case v.Label == "" || strings.ContainsAny(v.Label, `/\ `) || slices.ContainsFunc(entries, func(e entry) bool { return e.label == v.Label }) || slices.Contains(sparsify.Names(), v.Label):
			return nil, nil, fmt.Errorf("sweep: variant of %s labelled %q: a label names its runs' folders: give one of its own, without spaces or slashes and not a method's name", v.Method, v.Label)
		}
		params := meth.Applicable(s.MethodOptions)
		for k, x := range v.Options {
			if _, ok := meth.Param(k); !ok {
				return nil, nil, fmt.Errorf("sweep: variant %s: %s has no option %s", v.Label, v.Method, k)
			}
			params[k] = x
		}
		entries = append(entries, entry{v.Label, v.Method, params})
	}
	var pts []Point
	var skipped []Skipped
	for _, n := range nets {
		for _, e := range entries {
			m := e.method
			meth, _ := sparsify.Lookup(m)
			params := e.params
			dens := s.Densities
			if m == "dense" {
				dens = []float64{1}
			}
			for _, w := range s.Workers {
				for _, d := range dens {
					p := Point{Method: e.label, Workers: w, Density: d, Net: netmodel.Network{Latency: n.Latency, Bandwidth: n.Bandwidth}}
					p.Name = e.label + "-w" + strconv.Itoa(w)
					if m != "dense" {
						p.Name += "-d" + strconv.FormatFloat(d, 'g', -1, 64)
					}
					if l := NetLabel(p.Net); l != "" {
						p.Name += "-" + l
					}
					c := s.Base
					c.Sparsifier = m
					c.Workers = train.Set(w)
					c.Density = train.Optional[float64]{}
					if m != "dense" {
						c.Density = train.Set(d)
					}
					c.MethodOptions = params
					c.NetLatency, c.NetBandwidth = p.Net.Latency, p.Net.Bandwidth
					c.Out, c.Resume = "", ""
					p.Config = c
					if recWorkers > 0 && w > recWorkers {
						skipped = append(skipped, Skipped{p.Name, fmt.Errorf("the recording holds the gradients of %d workers", recWorkers)})
						continue
					}
					if meth.CheckWorkers != nil {
						resolved, err := meth.Resolve(params)
						if err != nil {
							return nil, nil, fmt.Errorf("sweep: %s: %w", m, err)
						}
						if err := meth.CheckWorkers(w, resolved); err != nil {
							skipped = append(skipped, Skipped{p.Name, err})
							continue
						}
					}
					vc := c.Defaults() // checked before any run starts
					vc.Out = filepath.Join("runs", p.Name)
					if err := vc.Validate(false); err != nil {
						return nil, nil, fmt.Errorf("sweep: %s: %w", p.Name, err)
					}
					pts = append(pts, p)
				}
			}
		}
	}
	if len(pts) == 0 {
		var why []string
		for _, sk := range skipped {
			why = append(why, sk.Name+": "+sk.Reason.Error())
		}
		return nil, skipped, fmt.Errorf("sweep: no point of the grid can run:\n  %s", strings.Join(why, "\n  "))
	}
	return pts, skipped, nil
}

// Options are the parts of a sweep that are not the grid.
type Options struct {
	// Log receives the sweep's progress, one line per run (nil: none).
	Log io.Writer
	// Report are the options of the comparison page (ECharts' source).
	Report reports.Options
	// CommandLine is recorded in every run's run.json.
	CommandLine []string
	// NoPredict leaves the advisor's predictions (and its measurements of
	// this machine) out.
	NoPredict bool
	// Title heads the page (default: the sweep's model and size).
	Title string
	// Notes are paragraphs under the page's title (e.g. a preset's
	// description).
	Notes []string
	// Claims are the statements of a preset's paper the runs are judged
	// on (Judge): the page states each with its verdict.
	Claims []Claim
}

// Result says what a sweep did.
type Result struct {
	// Ran counts the runs run now, Complete those found complete.
	Ran, Complete int
	// Unrunnable are the grid points the methods cannot run.
	Unrunnable []Skipped
	// Page is the comparison page's path.
	Page string
	// Verdicts are the claims of Options.Claims with their verdicts on
	// the runs, one line each (Judge).
	Verdicts []string
}

const (
	startedFile  = "sweep-started.json"
	completeFile = "sweep-complete.json"
)

// marker is the content of the started and complete files.
type marker struct {
	Point  string       `json:"point"`
	Config train.Config `json:"config"`
	Time   time.Time    `json:"time"`
}

// comparable is c with its defaults filled (a run a sweep completed before
// an option became one of its flags recorded it unset) and without what
// does not change a run's results: where the data and the output live,
// progress output.
func comparable(c train.Config) train.Config {
	c = c.Defaults()
	c.DataDir, c.Out, c.Resume, c.Quiet, c.Download = "", "", "", false, false
	return c
}

// configDiff names the JSON fields (what run.json and the markers hold)
// whose values differ: "" when the configurations are the same.
func configDiff(a, b train.Config) string {
	var ma, mb map[string]any
	ja, _ := json.Marshal(comparable(a))
	jb, _ := json.Marshal(comparable(b))
	json.Unmarshal(ja, &ma)
	json.Unmarshal(jb, &mb)
	var d []string
	for k, v := range ma {
		if w, ok := mb[k]; !ok || fmt.Sprint(v) != fmt.Sprint(w) {
			d = append(d, fmt.Sprintf("%s %v, now %v", k, v, mb[k]))
		}
	}
	for k, w := range mb {
		if _, ok := ma[k]; !ok {
			d = append(d, fmt.Sprintf("%s unset, now %v", k, w))
		}
	}
	slices.Sort(d)
	return strings.Join(d, "; ")
}

func readMarker(path string) (*marker, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m marker
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("sweep: %s is not a sweep marker: %w", path, err)
	}
	return &m, nil
}

// state is what a run folder holds.
type state int

const (
	absent      state = iota
	interrupted       // started by the sweep, not completed
	complete
)

// runState inspects the folder of p.
func runState(dir string, p Point) (state, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return absent, nil
	} else if err != nil {
		return absent, fmt.Errorf("sweep: %w", err)
	}
	if m, err := readMarker(filepath.Join(dir, completeFile)); err == nil {
		if d := configDiff(m.Config, p.Config); d != "" {
			return absent, fmt.Errorf("sweep: %s completed with other settings than this grid asks for (%s); use another -out, or delete that folder to run it again", dir, d)
		}
		return complete, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return absent, err
	}
	if _, err := os.Stat(filepath.Join(dir, startedFile)); err == nil {
		return interrupted, nil
	}
	return absent, fmt.Errorf("sweep: %s exists but was not made by this sweep (no %s); it is left alone: move it away or use another -out", dir, startedFile)
}

// Run runs the grid into out, skipping the runs already complete there,
// then writes out/sweep.html. It returns when every run is done or ctx is
// cancelled (the run in progress is then left for the next call to start
// again).
func Run(ctx context.Context, s Spec, out string, o Options) (Result, error) {
	pts, unrunnable, err := s.Points()
	res := Result{Unrunnable: unrunnable}
	if err != nil {
		return res, err
	}
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", a...)
		}
	}
	jobs, jobsUnrunnable, fromJobs, err := jobPoints(s, out)
	if err != nil {
		return res, err
	}
	if fromJobs {
		pts, unrunnable = jobs, jobsUnrunnable
		res.Unrunnable = unrunnable
		o.NoPredict = true
		o.Notes = append(o.Notes, "The runs are the mpirun jobs that train sweep -dry-run printed (one process per worker, on the real network: the grid's emulated networks do not apply); the advisor's predictions, of simulated workers, are left out.")
		logf("building the page from the %d mpirun jobs listed in %s", len(pts), filepath.Join(out, JobsFile))
	}
	for _, sk := range unrunnable {
		logf("skip %s: %v", sk.Name, sk.Reason)
	}
	runsDir := filepath.Join(out, "runs")
	if err := os.MkdirAll(runsDir, 0o755); err != nil {
		return res, fmt.Errorf("sweep: creating %s: %w", runsDir, err)
	}
	// Check every folder first, so that a conflict stops the sweep before
	// anything runs.
	states := make([]state, len(pts))
	for i, p := range pts {
		if fromJobs {
			states[i] = complete // jobPoints checked them
			continue
		}
		if states[i], err = runState(filepath.Join(runsDir, p.Name), p); err != nil {
			return res, err
		}
	}
	var host *advise.Host
	if s.Base.Gradients != "" && !o.NoPredict {
		// A replay's iteration is not the model's (its compute is a copy):
		// predictions of simulated runs would compare nothing.
		o.NoPredict = true
		o.Notes = append(o.Notes, "Replays of the recorded gradients in "+s.Base.Gradients+": no loss or accuracy, and the time per iteration is not the model's (the compute is a copy of the recorded gradient); the advisor's predictions are left out (train advise -gradients predicts a cluster's iteration).")
	}
	if !o.NoPredict {
		if host, err = measurements(ctx, s, filepath.Join(out, "measurements.json"), logf); err != nil {
			return res, err
		}
	}
	for i, p := range pts {
		dir := filepath.Join(runsDir, p.Name)
		tag := fmt.Sprintf("[%d/%d] %s", i+1, len(pts), p.Name)
		switch states[i] {
		case complete:
			res.Complete++
			logf("%s: complete, skipped", tag)
			continue
		case interrupted:
			logf("%s: interrupted earlier; starting it again", tag)
			if err := os.RemoveAll(dir); err != nil {
				return res, fmt.Errorf("sweep: removing the interrupted run %s: %w", dir, err)
			}
		}
		if err := ctx.Err(); err != nil {
			return res, interruptedErr(err, res, len(pts))
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return res, fmt.Errorf("sweep: %w", err)
		}
		if err := atomicfile.WriteJSON(filepath.Join(dir, startedFile), marker{Point: p.Name, Config: p.Config, Time: time.Now().UTC()}); err != nil {
			return res, fmt.Errorf("sweep: %w", err)
		}
		c := p.Config
		c.Out = dir
		c.Quiet = true
		logf("%s: running", tag)
		t0 := time.Now()
		err := train.Run(ctx, c, train.Options{Stdout: io.Discard, Progress: io.Discard, CommandLine: o.CommandLine})
		if ctx.Err() != nil { // an interrupted run may end without an error
			return res, interruptedErr(ctx.Err(), res, len(pts))
		}
		if err != nil {
			return res, fmt.Errorf("sweep: run %s: %w", p.Name, err)
		}
		if err := atomicfile.WriteJSON(filepath.Join(dir, completeFile), marker{Point: p.Name, Config: p.Config, Time: time.Now().UTC()}); err != nil {
			return res, fmt.Errorf("sweep: %w", err)
		}
		res.Ran++
		logf("%s: done in %v", tag, time.Since(t0).Round(time.Millisecond))
	}
	res.Page = filepath.Join(out, "sweep.html")
	if len(o.Claims) > 0 {
		rs := Results{Points: pts, Runs: make([]*reports.Run, len(pts))}
		for i, p := range pts {
			r, err := reports.ReadRun(filepath.Join(runsDir, p.Name))
			if err != nil {
				return res, fmt.Errorf("sweep: reading run %s to judge the paper's claims: %w", p.Name, err)
			}
			rs.Runs[i] = r
		}
		res.Verdicts = Judge(o.Claims, rs)
	}
	info := reports.SweepInfo{Title: o.Title, Notes: append(slices.Clone(o.Notes), res.Verdicts...)}
	for _, p := range pts {
		sr := reports.SweepRun{Dir: filepath.Join(runsDir, p.Name), Method: p.Method, Workers: p.Workers, Density: p.Density}
		if p.Net.Bandwidth > 0 {
			sr.Network = advise.NetName(p.Net)
		}
		if fromJobs {
			sr.Network = "real (mpirun)"
		}
		if host != nil {
			pr, err := advise.Predict(host, advise.Setting{Method: p.Config.Sparsifier, Workers: p.Workers, Density: p.Density,
				Params: p.Config.MethodOptions, Net: p.Net, Simulated: true, NoOverlap: !p.Config.PipelineOn()})
			if err != nil {
				logf("no prediction for %s: %v", p.Name, err)
			} else {
				sr.Predicted = &reports.PredictedIter{Queue: pr.Queue, Compute: pr.Compute, Select: pr.Select, Comm: pr.Comm, Update: pr.Update, Other: pr.Other,
					Iter: pr.Iter, ActualDensity: pr.ActualDensity}
				if p.Config.PipelineOn() {
					// The page measures a pipelined run's part after the
					// backward pass as its communication (what overlaps
					// the pass cannot be told apart): predict the same
					// part, the exposed tail, not the whole all-reduce.
					sr.Predicted.Select, sr.Predicted.Other = 0, 0
					sr.Predicted.Comm = max(0, pr.Iter-pr.Queue-pr.Compute-pr.Update)
				}
			}
		}
		info.Runs = append(info.Runs, sr)
	}
	if len(unrunnable) > 0 {
		var names []string
		for _, sk := range unrunnable {
			names = append(names, sk.Name+" ("+sk.Reason.Error()+")")
		}
		info.Notes = append(info.Notes, "Not run: "+strings.Join(names, "; ")+".")
	}
	if err := reports.WriteSweep(ctx, res.Page, info, o.Report); err != nil {
		return res, err
	}
	return res, nil
}

// runnable reports whether method can run on w workers with the options
// given (gTop-k's powers of two, SparDL's teams).
func runnable(method string, w int, opts sparsify.Values) bool {
	m, ok := sparsify.Lookup(method)
	if !ok || m.CheckWorkers == nil {
		return ok
	}
	r, err := m.Resolve(m.Applicable(opts))
	return err == nil && m.CheckWorkers(w, r) == nil
}

func interruptedErr(err error, res Result, total int) error {
	return fmt.Errorf("sweep: interrupted (%w) with %d of %d runs complete; run the same command again to continue", err, res.Ran+res.Complete, total)
}

// measurements returns the advisor's measurements of this machine for the
// sweep's model: those of an earlier call if path holds them for the same
// model and covers the grid's densities, else new ones (written to path).
func measurements(ctx context.Context, s Spec, path string, logf func(string, ...any)) (*advise.Host, error) {
	base := s.Base.Defaults()
	if h, err := advise.ReadHost(path); err == nil {
		ok := h.Model == base.Model && h.Dataset == base.Dataset && h.Device == base.Device && h.Preset == base.Preset && h.Batch == base.Batch.Value()
		// A sweep of a step budget predicts over those steps (the runs it
		// compares with); others over the default horizon, one epoch.
		ok = ok && (s.Base.Steps == 0 && h.HorizonEpoch || s.Base.Steps > 0 && h.HorizonSteps == s.Base.Steps)
		nets := s.Networks
		if len(nets) == 0 {
			nets = []netmodel.Network{{}}
		}
		for _, w := range s.Workers {
			ok = ok && (w < 2 || slices.ContainsFunc(h.HostNets, func(n advise.HostNet) bool { return n.Workers == w }))
			for _, n := range nets {
				_, has := h.SimStep(w, n)
				ok = ok && (w < 2 || has)
			}
		}
		// Every method's reducer on every worker count it can run on
		// (gTop-k's and SparDL's counts aside), on every network.
		for _, m := range append([]string{"dense"}, s.Sparsifiers...) {
			for _, w := range s.Workers {
				for _, d := range s.Densities {
					for _, n := range nets {
						if w >= 2 && runnable(m, w, s.MethodOptions) {
							_, has := h.SimReduce(m, d, w, n)
							ok = ok && has
						}
					}
				}
			}
		}
		for _, d := range s.Densities {
			ok = ok && slices.ContainsFunc(h.Unions, func(u advise.Union) bool { return u.Density == d })
		}
		for _, m := range s.Sparsifiers {
			for _, d := range s.Densities {
				ok = ok && (m == "dense" || slices.ContainsFunc(h.Selections, func(x advise.Selection) bool { return x.Method == m && x.Density == d }))
			}
		}
		if ok {
			logf("using the measurements of this machine in %s", path)
			return h, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	logf("measuring this machine for the advisor's predictions (one step of %s, selections, collectives)", base.Model)
	methods := []string{"dense"} // none to measure but dense (not the default: all)
	for _, m := range s.Sparsifiers {
		if m != "dense" {
			methods = append(methods, m)
		}
	}
	h, err := advise.Measure(ctx, advise.Config{Train: s.Base, Horizon: s.Base.Steps, Densities: s.Densities, Methods: methods, Params: s.MethodOptions, HostWorkers: s.Workers, Simulated: true, Networks: s.Networks})
	if err != nil {
		return nil, err
	}
	if err := advise.WriteHost(path, h); err != nil {
		return nil, err
	}
	return h, nil
}
