package reports

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// SweepRun is one run of a sweep: its directory, its place in the grid and,
// when known, the advisor's prediction of its time per iteration.
type SweepRun struct {
	// Dir is the run directory (run.json, metrics.jsonl).
	Dir string
	// Method, Workers and Density are the run's grid coordinates; Network
	// names its emulated network ("" for none).
	Method  string
	Workers int
	Density float64
	Network string
	// Predicted is the advisor's projection of the run (nil: none).
	Predicted *PredictedIter
}

// PredictedIter is a projected iteration (or a run's measured one,
// phasesOf), in seconds, by the phases of a
// step record (metrics.Step): Queue the wait for a shared executor and the
// other simulated workers' turns, Compute the worker's own forward and
// backward pass, Select and Comm the reducer's selection and communication,
// Other the rest of the reduction (error feedback, copies, decoding),
// Update the optimizer step; and the expected actual density.
type PredictedIter struct {
	Queue, Compute, Select, Comm, Other, Update, Iter float64
	ActualDensity                                     float64
}

// SweepInfo is what a sweep page shows.
type SweepInfo struct {
	// Title heads the page; Notes are paragraphs under it.
	Title string
	Notes []string
	// Runs are the sweep's runs, in grid order.
	Runs []SweepRun
}

// sweepSkip is the number of logged iterations at the start of a run that
// the sweep's per-run figures leave out (start-up: first allocations,
// caches, thresholds far from their target).
const sweepSkip = 5

// sweepPhases name the phases of PredictedIter, in the order of its parts.
var sweepPhases = []string{phaseQueue, phaseCompute, phaseSelect, phaseComm, phaseOther, phaseUpdate}

func (p *PredictedIter) parts() []float64 {
	return []float64{p.Queue, p.Compute, p.Select, p.Comm, p.Other, p.Update}
}

// MedianOf is the median of the finite values of f over steps (NaN if
// none): the statistic of the sweep page and of the presets' claims.
func MedianOf(steps []Step, f func(*Step) float64) float64 {
	v := make([]float64, len(steps))
	for i := range steps {
		v[i] = f(&steps[i])
	}
	return median(v)
}

// median is the median of the finite values of v (NaN if none), the mean
// of the middle two of an even number.
func median(v []float64) float64 {
	s := slices.DeleteFunc(slices.Clone(v), func(x float64) bool { return !isFinite(x) })
	if len(s) == 0 {
		return math.NaN()
	}
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// phasesOf is a run's measured iteration, as the advisor predicts it: the
// medians over the logged iterations after the first sweepSkip (all of
// them if there are fewer) of the time breakdown's phases (Run.Breakdown):
// the wait for an executor and the other workers' turns, the worker's own
// forward and backward pass, and of the part after it (t_wait) selection,
// communication (at most what t_wait leaves) and the rest; for a pipelined
// run the part after the backward pass counts as communication (its
// selection and communication overlap the backward pass and cannot be told
// apart). Its actual density is the mean over the second half of the
// logged iterations (MiCRO's threshold settles first).
func phasesOf(r *Run) PredictedIter {
	steps := r.Steps
	if len(steps) > 2*sweepSkip {
		steps = steps[sweepSkip:]
	}
	pipe := r.isPipelined()
	zero := func(x float64) float64 {
		if isFinite(x) {
			return x
		}
		return 0
	}
	sel := func(s *Step) float64 {
		if pipe {
			return 0
		}
		return min(zero(s.TSelect), zero(s.TWait))
	}
	com := func(s *Step) float64 {
		if pipe {
			return zero(s.TWait)
		}
		return min(zero(s.TComm), minus(zero(s.TWait), sel(s)))
	}
	m := PredictedIter{
		Queue:   MedianOf(steps, func(s *Step) float64 { return zero(s.TQueue) }),
		Compute: MedianOf(steps, func(s *Step) float64 { return s.TCompute }),
		Select:  MedianOf(steps, sel),
		Comm:    MedianOf(steps, com),
		Other:   MedianOf(steps, func(s *Step) float64 { return minus(zero(s.TWait), sel(s)+com(s)) }),
		Update:  MedianOf(steps, func(s *Step) float64 { return s.TUpdate }),
		Iter:    MedianOf(steps, func(s *Step) float64 { return s.TIter }),
	}
	half := &Run{Steps: r.Steps[len(r.Steps)/2:]}
	m.ActualDensity = half.mean(func(s *Step) float64 { return s.ActualDensity })
	return m
}

// sweepKey groups a sweep's runs into one line per method, density and
// network (the worker count is the x axis).
func sweepKey(sr SweepRun, multiDensity, multiNet bool) string {
	k := sr.Method
	if multiDensity && sr.Method != "dense" {
		k += " ρ=" + strconv.FormatFloat(sr.Density, 'g', 4, 64)
	}
	if multiNet {
		if sr.Network == "" {
			k += " (in-process)"
		} else {
			k += " (" + sr.Network + ")"
		}
	}
	return k
}

func sweepLabel(sr SweepRun, multiDensity, multiNet bool) string {
	return sweepKey(sr, multiDensity, multiNet) + " ×" + strconv.Itoa(sr.Workers)
}

// SweepPage returns the comparison page of a sweep: actual density,
// selection time and the time per iteration by phase against the worker
// count, error and threshold against iterations, convergence against
// epochs and wall time, and the advisor's predicted time per iteration
// against the measured one, all from the runs' records.
func SweepPage(ctx context.Context, info SweepInfo, o Options) ([]byte, error) {
	if len(info.Runs) == 0 {
		return nil, errors.New("reports: a sweep page needs at least one run")
	}
	runs := make([]*Run, len(info.Runs))
	for i, sr := range info.Runs {
		r, err := ReadRun(sr.Dir)
		if err != nil {
			return nil, err
		}
		runs[i] = r
	}
	if err := checkSameModel(runs); err != nil {
		return nil, err
	}
	script, url, err := o.script(ctx)
	if err != nil {
		return nil, err
	}
	specs, tables, notes := sweepContent(info, runs, o.maxPoints())
	if n := sweepBaselineNote(runs); n != "" {
		notes = append([]string{n}, notes...)
	}
	title := info.Title
	if title == "" {
		title = fmt.Sprintf("Sweep of %d runs of %s", len(runs), runs[0].Info.Config.Model)
	}
	return render(title, append(slices.Clone(info.Notes), notes...), tables, specs, script, url)
}

// sweepBaselineNote says against which dense the sweep's speedups are
// measured: its dense runs all-reduced in buckets during the backward pass
// (as PyTorch DDP does) or after it (-overlap off), or some each way; ""
// without dense runs.
func sweepBaselineNote(runs []*Run) string {
	on, off := 0, 0
	mbs := map[string]bool{}
	for _, r := range runs {
		if r.Info.Config.Sparsifier != "dense" {
			continue
		}
		if !r.isPipelined() {
			off++
			continue
		}
		on++
		if r.Info.BucketMB != nil {
			mbs[fmtG(*r.Info.BucketMB, 4)] = true
		}
	}
	const ddp = "dense all-reduced its gradient in buckets during the backward pass, as PyTorch DDP does"
	const after = "dense all-reduced after the backward pass (-overlap off; PyTorch DDP users overlap, so these speedups are larger than over their dense)"
	switch {
	case on > 0 && off > 0:
		return fmt.Sprintf("The baseline differs between runs: in %d of the dense runs %s; in %d %s. Compare a method with the dense run of its own setting.", on, ddp, off, after)
	case on > 0:
		note := "Speedups are over dense as users run it: " + ddp
		if len(mbs) > 0 {
			note += " (-bucket-mb " + strings.Join(slices.Sorted(maps.Keys(mbs)), ", ") + ", the first bucket at most 1 MiB)"
		}
		return note + "."
	case off > 0:
		return "Speedups are over " + after + "."
	}
	return ""
}

// WriteSweep writes the sweep page to out.
func WriteSweep(ctx context.Context, out string, info SweepInfo, o Options) error {
	b, err := SweepPage(ctx, info, o)
	if err != nil {
		return err
	}
	return writeAtomic(out, "writing the sweep page", b)
}

// sweepContent builds the charts, tables and notes of a sweep page.
func sweepContent(info SweepInfo, runs []*Run, maxPts int) ([]chartSpec, []table, []string) {
	dens, nets := map[float64]bool{}, map[string]bool{}
	for _, sr := range info.Runs {
		if sr.Method != "dense" {
			dens[sr.Density] = true
		}
		nets[sr.Network] = true
	}
	multiD, multiN := len(dens) > 1, len(nets) > 1
	ph := make([]PredictedIter, len(runs))
	labels := make([]string, len(runs))
	for i, r := range runs {
		ph[i] = phasesOf(r)
		labels[i] = sweepLabel(info.Runs[i], multiD, multiN)
	}
	// Lines against the worker count, one per method (and density, network).
	var keys []string
	byKey := map[string][]int{}
	workerSet := map[int]bool{}
	for i, sr := range info.Runs {
		k := sweepKey(sr, multiD, multiN)
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], i)
		workerSet[sr.Workers] = true
	}
	workers := slices.Sorted(maps.Keys(workerSet))
	var cats []string
	for _, w := range workers {
		cats = append(cats, strconv.Itoa(w))
	}
	against := func(id, title, sub, yName string, f func(i int) float64, scale float64, only func(i int) bool) chartSpec {
		c := chartSpec{ID: id, Title: title, Subtitle: sub, XName: "workers", YName: yName, Categories: cats}
		for _, k := range keys {
			vals := slices.Repeat([]float64{math.NaN()}, len(workers))
			any := false
			for _, i := range byKey[k] {
				if only != nil && !only(i) {
					continue
				}
				j := sort.SearchInts(workers, info.Runs[i].Workers)
				vals[j] = f(i) * scale
				any = any || isFinite(vals[j])
			}
			if any {
				c.Series = append(c.Series, seriesSpec{Name: k, Values: vals, Symbols: true})
			}
		}
		return c
	}
	var specs []chartSpec
	dc := against("sweep-density", "Actual density against workers", "mean over the second half of each run's iterations (DEFT's Fig. 1)",
		"actual density (fraction of the gradient)", func(i int) float64 { return ph[i].ActualDensity }, 1, func(i int) bool { return info.Runs[i].Method != "dense" })
	for _, d := range slices.Sorted(maps.Keys(dens)) {
		dc.Series = append(dc.Series, seriesSpec{Name: "setup ρ=" + strconv.FormatFloat(d, 'g', 4, 64), Values: slices.Repeat([]float64{d}, len(workers)), Dashed: true})
	}
	if len(dc.Series) > len(dens) {
		specs = append(specs, dc)
	}
	maxSel := 0.0
	for i := range ph {
		if isFinite(ph[i].Select) {
			maxSel = max(maxSel, ph[i].Select)
		}
	}
	su := durUnit(maxSel)
	sc := against("sweep-select", "Selection time against workers", "median per iteration, of the worker the others waited for (DEFT, MiCRO)",
		"selection ("+su.name+")", func(i int) float64 { return ph[i].Select }, 1/su.div, func(i int) bool { return info.Runs[i].Method != "dense" })
	if len(sc.Series) > 0 {
		specs = append(specs, sc)
	}
	specs = append(specs, sweepPhaseChart(info, ph, labels, nets))
	errc := chartSpec{ID: "sweep-error", Title: "Error against iterations", XName: "iteration", YName: "mean over workers of ‖residual‖₂", Subtitle: "MiCRO's Fig. 8"}
	thr := chartSpec{ID: "sweep-threshold", Title: "Threshold against iterations", XName: "iteration", YName: "threshold (|gradient element|)"}
	for i, r := range runs {
		if info.Runs[i].Method == "dense" {
			continue
		}
		errc.Series = append(errc.Series, stepSeries(labels[i], r.Steps, func(s *Step) float64 { return s.ErrorNorm }, 1, maxPts))
		if r.hasThreshold() {
			thr.Series = append(thr.Series, stepSeries(labels[i], r.Steps, func(s *Step) float64 { return s.Threshold }, 1, maxPts))
		}
	}
	if len(errc.Series) > 0 {
		specs = append(specs, errc)
	}
	if len(thr.Series) > 0 {
		specs = append(specs, thr)
	}
	specs = append(specs, metricCharts(runs, labels, maxPts)...)
	tables, notes := sweepTables(info, runs, ph, labels)
	if c, ok := predictionChart(info, ph, labels); ok {
		specs = append(specs, c)
	}
	return layered(specs), tables, notes
}

// sweepOrder is the order of the runs in the per-run charts: grouped by
// method in the grid's order, then by network and density, by worker
// count within.
func sweepOrder(info SweepInfo) []int {
	order := make([]int, len(info.Runs))
	methodAt := map[string]int{} // a method's place in the grid
	for i := range order {
		order[i] = i
		if _, ok := methodAt[info.Runs[i].Method]; !ok {
			methodAt[info.Runs[i].Method] = len(methodAt)
		}
	}
	sort.SliceStable(order, func(a, b int) bool {
		ra, rb := info.Runs[order[a]], info.Runs[order[b]]
		if ra.Method != rb.Method {
			return methodAt[ra.Method] < methodAt[rb.Method]
		}
		if ra.Network != rb.Network {
			return ra.Network < rb.Network
		}
		if ra.Density != rb.Density {
			return ra.Density < rb.Density
		}
		return ra.Workers < rb.Workers
	})
	return order
}

// sweepPhaseChart stacks each run's median phase times, one bar per run
// down the page, every run named, in sweepOrder (SparDL's and LAGS'
// breakdowns).
func sweepPhaseChart(info SweepInfo, ph []PredictedIter, labels []string, nets map[string]bool) chartSpec {
	order := sweepOrder(info)
	mx := 0.0
	for _, p := range ph {
		if isFinite(p.Iter) {
			mx = max(mx, p.Iter)
		}
	}
	du := durUnit(mx)
	var netNames []string
	for n := range nets {
		if n == "" {
			n = "in-process (no emulated network)"
		}
		netNames = append(netNames, n)
	}
	sort.Strings(netNames)
	c := chartSpec{ID: "sweep-phases", Title: "Time per iteration by phase", XName: "run (method ×workers)",
		YName: "time (" + du.name + ", the worker the others waited for, median)", Subtitle: "network: " + strings.Join(netNames, "; "),
		Horizontal: true, Wide: true}
	for _, i := range order {
		c.Categories = append(c.Categories, labels[i])
	}
	for k, n := range sweepPhases {
		vals := make([]float64, len(order))
		for j, i := range order {
			vals[j] = ph[i].parts()[k] / du.div
		}
		c.Series = append(c.Series, seriesSpec{Name: n, Bar: true, Stack: "time", Values: vals})
	}
	return c
}

// relErr is (predicted − measured) / measured.
func relErr(pred, meas float64) float64 {
	if !isFinite(pred) || !isFinite(meas) || meas == 0 {
		return math.NaN()
	}
	return (pred - meas) / meas
}

func fmtPct(x float64) string {
	if !isFinite(x) {
		return "—"
	}
	return strconv.FormatFloat(100*x, 'f', 0, 64) + " %"
}

// sweepTables are the runs table and the predicted-against-measured table,
// with a note summarising the prediction error.
func sweepTables(info SweepInfo, runs []*Run, ph []PredictedIter, labels []string) ([]table, []string) {
	metric := ""
	for _, r := range runs {
		if metric = r.primary(); metric != "" {
			break
		}
	}
	mlabel := "test metric"
	if metric != "" {
		mlabel = metricOf(metric).label
	}
	rt := table{Caption: "Runs", Head: []string{"run", "directory", "workers", "setup density", "network", "final " + mlabel,
		"mean actual density (2nd half)", "iteration (median)", "iterations logged", "duration"}}
	head := []string{"run", "iteration meas. / pred.", "error"}
	for _, n := range sweepPhases {
		head = append(head, n+" meas. / pred. (error)")
	}
	pt := table{Caption: "Advisor's prediction against the measurement (time per iteration and its phases)", Head: append(head, "actual density meas. / pred.")}
	var errs []float64
	termErrs := make([][]float64, len(sweepPhases))
	termShares := make([][]float64, len(sweepPhases))
	termWorst := make([]int, len(sweepPhases))
	worst, worstI := 0.0, -1
	for i, r := range runs {
		sr := info.Runs[i]
		f, _ := r.finalBest(metric)
		net := sr.Network
		if net == "" {
			net = "in-process"
		}
		rt.Rows = append(rt.Rows, []string{labels[i], r.Dir, strconv.Itoa(sr.Workers), fmtPlain(sr.Density, 4), net, fmtMetric(metric, f) + r.unfinishedMark(),
			fmtPlain(ph[i].ActualDensity, 4), fmtDur(ph[i].Iter), strconv.Itoa(len(r.Steps)), fmtDur(r.duration())})
		p := sr.Predicted
		if p == nil {
			continue
		}
		e := relErr(p.Iter, ph[i].Iter)
		if isFinite(e) {
			errs = append(errs, math.Abs(e))
			if math.Abs(e) > worst {
				worst, worstI = math.Abs(e), i
			}
		}
		row := []string{labels[i], fmtMillis(ph[i].Iter, 3) + " / " + fmtMillis(p.Iter, 3), fmtPct(e)}
		for k, q := range p.parts() {
			m := ph[i].parts()[k]
			te := relErr(q, m)
			if sh := (q - m) / ph[i].Iter; isFinite(sh) {
				termShares[k] = append(termShares[k], math.Abs(sh))
			}
			if isFinite(te) {
				termErrs[k] = append(termErrs[k], math.Abs(te))
				if len(termErrs[k]) == 1 || math.Abs(te) >= slices.Max(termErrs[k]) {
					termWorst[k] = i
				}
			}
			row = append(row, fmtMillis(m, 3)+" / "+fmtMillis(q, 3)+" ("+fmtPct(te)+")")
		}
		pt.Rows = append(pt.Rows, append(row, fmtPlain(ph[i].ActualDensity, 3)+" / "+fmtPlain(p.ActualDensity, 3)))
	}
	tables := []table{rt}
	var notes []string
	if len(pt.Rows) > 0 {
		tables = append(tables, pt)
		if len(errs) > 0 {
			notes = append(notes, fmt.Sprintf("Advisor's error on the time per iteration over %d runs: mean |error| %s, median %s, worst %s (%s). Measured: the median over each run's logged iterations after the first %d (the phases of the worker the others waited for); predicted: train advise's model for simulated workers sharing this machine's cores, fed with its measurements at the sweep's worker counts (a short dense run, each method's reducer on as many in-process workers with the model's real gradients). The table of errors per phase says which part of the model misses. Timings on a machine shared with other jobs are noisy: the measurements and the runs are minutes apart.",
				len(errs), fmtPct(meanOf(errs)), fmtPct(median(errs)), fmtPct(worst), labels[worstI], sweepSkip))
		}
		et := table{Caption: "Advisor's error per phase, over the runs: |predicted − measured| relative to the phase, and relative to the iteration (the phase's part of the iteration's error)",
			Head: []string{"phase", "runs", "mean |error|", "median |error|", "worst", "mean |error| ÷ iteration"}}
		for k, n := range sweepPhases {
			if len(termErrs[k]) == 0 {
				continue
			}
			et.Rows = append(et.Rows, []string{n, strconv.Itoa(len(termErrs[k])), fmtPct(meanOf(termErrs[k])), fmtPct(median(termErrs[k])),
				fmtPct(slices.Max(termErrs[k])) + " (" + labels[termWorst[k]] + ")", fmtPct(meanOf(termShares[k]))})
		}
		if len(errs) > 0 {
			et.Rows = append(et.Rows, []string{"iteration", strconv.Itoa(len(errs)), fmtPct(meanOf(errs)), fmtPct(median(errs)), fmtPct(worst) + " (" + labels[worstI] + ")", fmtPct(meanOf(errs))})
		}
		tables = append(tables, et)
	}
	return append(tables, bytesGlossary()), notes
}

func meanOf(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x / float64(len(v))
	}
	return s
}

// predictionChart shows the predicted and the measured time per iteration
// of every run with a prediction, one pair of bars per run down the page,
// in sweepOrder (as the phase chart).
func predictionChart(info SweepInfo, ph []PredictedIter, labels []string) (chartSpec, bool) {
	var cats []string
	var meas, pred []float64
	mx := 0.0
	for _, i := range sweepOrder(info) {
		sr := info.Runs[i]
		if sr.Predicted == nil {
			continue
		}
		cats = append(cats, labels[i])
		meas = append(meas, ph[i].Iter)
		pred = append(pred, sr.Predicted.Iter)
		if isFinite(ph[i].Iter) {
			mx = max(mx, ph[i].Iter)
		}
		if isFinite(sr.Predicted.Iter) {
			mx = max(mx, sr.Predicted.Iter)
		}
	}
	if len(cats) == 0 {
		return chartSpec{}, false
	}
	du := durUnit(mx)
	for i := range meas {
		meas[i] /= du.div
		pred[i] /= du.div
	}
	return chartSpec{ID: "sweep-predicted", Title: "Predicted against measured time per iteration", XName: "run (method ×workers)",
		YName: "time per iteration (" + du.name + ")", Subtitle: "train advise's model for simulated workers on this machine", Categories: cats,
		Series:     []seriesSpec{{Name: "measured", Bar: true, Values: meas}, {Name: "predicted", Bar: true, Values: pred}},
		Horizontal: true, Wide: true}, true
}
