package reports

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// Options change how a page is written. The zero value is the default.
type Options struct {
	// AssetsURL, when set, makes the page load the ECharts script from this
	// URL (the script itself, or a folder holding echarts.min.js) instead of
	// inlining it; such a page needs that URL to be reachable. The default
	// page is self-contained.
	AssetsURL string
	// MaxPoints is the number of points above which a series is downsampled
	// (0: DefaultMaxPoints).
	MaxPoints int
	// Target is the comparison's target value of the primary test metric,
	// in the metric's recorded units (accuracy as a fraction); 0 picks the
	// best value that every compared run reaches.
	Target float64
}

// script returns the inline script or the script URL o asks for.
func (o Options) script(ctx context.Context) ([]byte, string, error) {
	if o.AssetsURL != "" {
		if err := checkAssetsURL(o.AssetsURL); err != nil {
			return nil, "", err
		}
		return nil, assetsScript(o.AssetsURL), nil
	}
	b, err := ECharts(ctx)
	return b, "", err
}

func (o Options) maxPoints() int {
	if o.MaxPoints > 0 {
		return o.MaxPoints
	}
	return DefaultMaxPoints
}

// WriteRunWith is WriteRun with options.
func WriteRunWith(ctx context.Context, runDir string, o Options) error {
	r, err := ReadRun(runDir)
	if err != nil {
		return err
	}
	b, err := RunPage(ctx, r, o)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(runDir, "report.html"), "writing the report", b)
}

// RunPage returns the HTML page of one run.
func RunPage(ctx context.Context, r *Run, o Options) ([]byte, error) {
	script, url, err := o.script(ctx)
	if err != nil {
		return nil, err
	}
	specs := runCharts(r, o.maxPoints())
	var notes []string
	if r.unfinished() {
		notes = append(notes, "This run is unfinished: "+r.endText()+". Its last values are not the final ones.")
	}
	if len(r.Steps) == 0 {
		notes = append(notes, "No iteration has been logged yet.")
	}
	if n := r.sampleNote(); n != "" {
		notes = append(notes, n)
	}
	if n := r.replayNote(); n != "" {
		notes = append(notes, n)
	}
	_, drawn := projectionChart([]*Run{r}, nil)
	if n := projectionNote([]*Run{r}, nil, drawn); n != "" {
		notes = append(notes, n)
	}
	return render(runTitle(r), notes, []table{runTable(r), bytesGlossary()}, specs, script, url)
}

func runTitle(r *Run) string {
	c := r.Info.Config
	workers := strconv.Itoa(r.Info.Workers) + " workers"
	if r.Info.Workers == 1 {
		workers = "1 worker"
	}
	if rp := r.Info.Replay; rp != nil {
		return fmt.Sprintf("Replay of %s's recorded gradients with %s, %s — %s", rp.Model, c.Sparsifier, workers, r.name())
	}
	title := fmt.Sprintf("%s on %s with %s, %s — %s", c.Model, c.Dataset, c.Sparsifier, workers, r.name())
	if r.unfinished() {
		title += " — unfinished: " + r.status() + " " + r.progressText()
	}
	return title
}

// fmtG formats a number for a table ("—" if NaN).
func fmtG(v float64, digits int) string {
	if !isFinite(v) {
		return "—"
	}
	return strconv.FormatFloat(v, 'g', digits, 64)
}

// fmtRatio formats a ratio as "1.05×" ("—" when not finite).
func fmtRatio(v float64) string {
	if !isFinite(v) {
		return "—"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + "×"
}

// ratioCell is " (R× the setup density)" for a run with a setup density
// below 1, else "".
func ratioCell(r *Run) string {
	if d := r.Info.Config.Density; !(d > 0 && d < 1) || !isFinite(r.densityRatio()) {
		return ""
	}
	return " (" + fmtRatio(r.densityRatio()) + " the setup density)"
}

// bytesGlossary is the table that says how the pages' byte counts come
// about: modelled from each call's real sizes with its collective's
// traffic rule (comm.Traffic), one row per collective.
func bytesGlossary() table {
	t := table{Caption: "How bytes are counted", Rows: [][]string{{"in general",
		"modelled from each call's real sizes: every buffer a method hands to the communicator is counted, per worker, " +
			"with the traffic of the algorithm its collective is assumed to use (below, n workers), whatever the backend does internally; " +
			"indices travel as int32, values as float32, lists unpadded"}}}
	for _, op := range comm.Ops() {
		if op != comm.OpBarrier {
			t.Rows = append(t.Rows, []string{op.String(), op.Rule()})
		}
	}
	return t
}

func fmtBytes(v float64) string {
	if !isFinite(v) {
		return "—"
	}
	u := bytesUnit(v)
	return strconv.FormatFloat(v/u.div, 'f', 3, 64) + " " + u.name
}

func fmtDur(sec float64) string {
	if !isFinite(sec) {
		return "—"
	}
	return time.Duration(sec * float64(time.Second)).Round(time.Millisecond).String()
}

func fmtMetric(name string, v float64) string {
	if !isFinite(v) {
		return "—"
	}
	mi := metricOf(name)
	s := strconv.FormatFloat(v*mi.scale, 'f', 2, 64)
	if mi.unit != "" {
		s += " " + mi.unit
	}
	return s
}

// fmtMillis formats seconds as milliseconds with digits significant
// digits ("—" if NaN).
func fmtMillis(sec float64, digits int) string {
	if !isFinite(sec) {
		return "—"
	}
	return fmtPlain(sec*1e3, digits) + " ms"
}

// fmtPlain formats v with digits significant digits as a person writes it:
// no exponent ("12,340", not "1.234e+04"; "0.01234"), thousands separated by
// commas.
func fmtPlain(v float64, digits int) string {
	if !isFinite(v) {
		return "—"
	}
	r, err := strconv.ParseFloat(strconv.FormatFloat(v, 'g', digits, 64), 64)
	if err != nil {
		return strconv.FormatFloat(v, 'g', digits, 64)
	}
	return metrics.GroupDigits(strconv.FormatFloat(r, 'f', -1, 64))
}

// fmtEval formats an evaluation's value, saying when it was measured on a
// sample of the split ("—" if e is nil).
func fmtEval(name string, e *Eval) string {
	if e == nil {
		return "—"
	}
	s := fmtMetric(name, e.Value)
	if smp := e.sample(); smp != "" {
		s += " (sample: " + smp + ")"
	}
	return s
}

// cfgString formats a configuration value compactly.
func cfgString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return "null"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func isZero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case float64:
		return x == 0
	case bool:
		return !x
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}

// methodOptions lists the run's method options as k=v: run.json's
// "method_options" (every option of the method, as resolved), the options
// of runs recorded before they were grouped there (top-level keys that are
// no general option, when not zero), and pipeline (-overlap) for the
// methods it applies to (sparsify.Method.Pipelined: dense, LAGS).
func methodOptions(cfg map[string]any) string {
	opts := map[string]any{}
	if mo, ok := cfg["method_options"].(map[string]any); ok {
		maps.Copy(opts, mo)
	}
	for k, v := range cfg {
		if k == "pipeline" && !methodPipelined(cfg["sparsifier"]) {
			continue
		}
		if !options.General(k) && !isZero(v) {
			opts[k] = v
		}
	}
	if v, ok := opts["pipeline"]; ok {
		delete(opts, "pipeline")
		opts["overlap"] = v // the option's flag; run.json keeps the older key
	}
	keys := slices.Sorted(maps.Keys(opts))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + cfgString(opts[k])
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, " ")
}

// overlapNote says, on a comparison page, against which dense the runs
// compare and which runs reduced during the backward pass: when the runs
// differ in that, their iteration times differ by what overlapping hides
// too, not by the method alone; when a dense run is among them, it is the
// baseline, overlapped as PyTorch DDP's (buckets all-reduced as the
// backward pass finishes them) or after the backward pass (-overlap off).
// "" when no run is dense and none overlapped.
func overlapNote(runs []*Run, labels []string) string {
	var on, off, dense []string
	for i, r := range runs {
		if r.isPipelined() {
			on = append(on, labels[i])
		} else {
			off = append(off, labels[i])
		}
		if r.Info.Config.Sparsifier != "dense" {
			continue
		}
		d := "dense run " + labels[i] + " all-reduced after the backward pass (-overlap off; PyTorch DDP users overlap, so speedups over this dense are larger than over theirs)"
		if r.isPipelined() {
			d = "dense run " + labels[i] + " all-reduced its gradient in buckets during the backward pass, as PyTorch DDP does"
			if r.Info.BucketMB != nil {
				d += " (-bucket-mb " + fmtG(*r.Info.BucketMB, 4) + ", the first bucket at most 1 MiB)"
			}
		}
		dense = append(dense, d)
	}
	var parts []string
	if len(dense) > 0 {
		parts = append(parts, "The baseline: "+strings.Join(dense, "; ")+".")
	}
	if len(on) > 0 && len(off) > 0 {
		parts = append(parts, "The runs differ in overlap: "+strings.Join(on, ", ")+" reduced during the backward pass, "+strings.Join(off, ", ")+" after it; their iteration times differ by what overlapping hides as well as by the method.")
	}
	return strings.Join(parts, " ")
}

// methodPipelined reports whether the registered method named method reduces
// layer groups during the backward pass (sparsify.Method.Pipelined).
func methodPipelined(method any) bool {
	name, _ := method.(string)
	m, ok := sparsify.Lookup(name)
	return ok && m.Pipelined
}

// workersCell says how many workers ran, and for simulated workers (in one
// process, sharing one copy of the parameters) how many executors served
// them.
func workersCell(info RunInfo) string {
	w := strconv.Itoa(info.Workers)
	if info.Executors > 0 {
		ex := "executors"
		if info.Executors == 1 {
			ex = "executor"
		}
		return fmt.Sprintf("%s, simulated in one process on %d %s (models taking turns; one shared copy of the parameters)", w, info.Executors, ex)
	}
	return w
}

func runTable(r *Run) table {
	c := r.Info.Config
	rows := [][]string{
		{"run directory", r.Dir},
		{"model", c.Model},
		{"dataset", c.Dataset},
		{"sparsifier", c.Sparsifier},
		{"method options", methodOptions(r.Config)},
		{"workers", workersCell(r.Info)},
		{"setup density", fmtG(c.Density, 4)},
		{"seed", strconv.FormatUint(c.Seed, 10)},
		{"backend", backendName(r.Info.Backend)},
		{"duration", fmtDur(r.duration())},
	}
	if rp := r.Info.Replay; rp != nil {
		rows[1] = []string{"model", rp.Model + " (recorded gradients, replayed)"}
		rows[2] = []string{"recording", fmt.Sprintf("%s: %d workers × %d steps, batch %d per worker, recorded by %s (%s)", rp.Dir, rp.Workers, rp.Steps, rp.Batch, rp.Source, rp.Mode)}
		rows = append(rows, []string{"recorded step time", fmtMillis(rp.StepTime, 4) + " forward and backward of one worker on " + rp.StepDevice + " (measured when recording; the compute times below are the replay's copies of the gradient)"})
	}
	if st := r.endText(); st != "" {
		rows = slices.Insert(rows, 1, []string{"status", st})
	}
	for _, m := range r.metricNames() {
		f, b := r.finalBestEval(m)
		rows = append(rows, []string{r.finalWord() + " " + onSplit(r.split(), m), fmtEval(m, f)}, []string{"best " + onSplit(r.split(), m), fmtEval(m, b)})
	}
	rows = append(rows,
		[]string{"mean actual density", fmtG(r.mean(func(s *Step) float64 { return s.ActualDensity }), 4) + ratioCell(r)},
		[]string{"total bytes sent per worker", fmtBytes(r.totalBytesSent())},
	)
	names, get := phases(r)
	var parts []string
	for i, n := range names {
		parts = append(parts, n+" "+fmtMillis(r.median(get[i]), 4))
	}
	iter := func(s *Step) float64 { return s.TIter }
	var iters []float64
	for i := range r.Steps {
		iters = append(iters, r.Steps[i].TIter)
	}
	rows = append(rows,
		[]string{"time per iteration", "median " + fmtMillis(r.median(iter), 4) + " (10th–90th percentile " + fmtMillis(quantile(iters, 0.1), 4) + "–" +
			fmtMillis(quantile(iters, 0.9), 4) + ", mean " + fmtMillis(r.mean(iter), 4) + ")"},
		[]string{"median time per phase", strings.Join(parts, " · ")},
	)
	if r.isPipelined() {
		rows = append(rows, []string{"reduction (pipelined)", "alongside the backward pass " + fmtMillis(r.median(overlapped), 4) +
			", after it " + fmtMillis(r.median(func(s *Step) float64 { return s.TWait }), 4) + " per iteration (medians); the communicator calls' durations add up to " +
			fmtMillis(r.median(func(s *Step) float64 { return s.TComm }), 4) + " because the layer groups' calls overlap one another"})
	}
	rows = append(rows,
		[]string{"logged iterations", strconv.Itoa(len(r.Steps))},
		[]string{"device", r.device()},
	)
	if k := r.Info.Versions.Kernels; k != "" {
		rows = append(rows, []string{"CPU kernels", k})
	}
	rows = append(rows,
		[]string{"machine", strings.TrimSpace(r.Info.Machine.CPU + " " + r.Info.Machine.GPU)},
		[]string{"command line", strings.Join(r.Info.CommandLine, " ")},
	)
	if !r.Info.Start.IsZero() {
		rows = append(rows, []string{"start", r.Info.Start.UTC().Format(time.RFC3339)})
	}
	var resumes []string
	for _, re := range r.Info.Resumes {
		resumes = append(resumes, "from the checkpoint of iteration "+strconv.Itoa(re.Step)+" at "+re.At.UTC().Format(time.RFC3339)+
			" ("+strings.Join(re.CommandLine, " ")+")")
	}
	if len(resumes) > 0 {
		rows = append(rows, []string{"resumed", strings.Join(resumes, "; ")})
	}
	for _, n := range r.Info.Notes {
		rows = append(rows, []string{"note", n})
	}
	return table{Caption: "Run", Rows: slices.DeleteFunc(rows, func(row []string) bool { return row[1] == "" })}
}

// replayNote says what a replay of recorded gradients cannot show ("" for
// a training run).
func (r *Run) replayNote() string {
	if r.Info.Replay == nil {
		return ""
	}
	return "A replay of recorded gradients: it shows what the sparsifier selects and sends on them (actual density, bytes, selection time, error feedback), not how training with it converges. It cannot show: " + r.Info.CannotShow + "."
}

// CompareWith is Compare with options.
func CompareWith(ctx context.Context, out string, runDirs []string, o Options) error {
	if len(runDirs) == 0 {
		return errors.New("reports: no run directory to compare; give one or more directories written by train -out")
	}
	runs := make([]*Run, len(runDirs))
	for i, d := range runDirs {
		r, err := ReadRun(d)
		if err != nil {
			return err
		}
		runs[i] = r
	}
	b, err := ComparePage(ctx, runs, o)
	if err != nil {
		return err
	}
	return writeAtomic(out, "writing the comparison", b)
}

// checkSameModel refuses runs of different models.
func checkSameModel(runs []*Run) error {
	for _, r := range runs[1:] {
		if r.Info.Config.Model != runs[0].Info.Config.Model {
			return fmt.Errorf("reports: cannot compare runs of different models: %s trained %q but %s trained %q; compare runs of one model per page",
				runs[0].Dir, runs[0].Info.Config.Model, r.Dir, r.Info.Config.Model)
		}
	}
	return nil
}

// configView is a run's configuration as strings, with the actual worker
// count and the method's options (run.json's "method_options") as keys of
// their own, for telling runs apart.
func configView(r *Run) map[string]string {
	m := map[string]string{}
	for k, v := range r.Config {
		if mo, ok := v.(map[string]any); ok && k == "method_options" {
			for mk, mv := range mo {
				m[mk] = cfgString(mv)
			}
			continue
		}
		if o, _ := options.Lookup(k); !o.Incidental {
			if k == "pipeline" {
				k = "overlap" // the option's flag; run.json keeps the older key
			}
			m[k] = cfgString(v)
		}
	}
	m["workers"] = strconv.Itoa(r.Info.Workers)
	if b := backendName(r.Info.Backend); b != "" {
		m["backend"] = b
	}
	return m
}

// backendName says where a run's workers ran and talked: "in-process" for
// simulated workers (run.json's backend "local"), "mpirun" for processes
// of an mpirun job, "nccl" for GPUs talking over NCCL; "" when not
// recorded.
func backendName(b string) string {
	switch b {
	case "local":
		return "in-process"
	case "mpi":
		return "mpirun"
	}
	return b
}

// densityRatio is the run's mean actual density over its setup density
// (NaN without a setup density).
func (r *Run) densityRatio() float64 {
	return r.mean(func(s *Step) float64 { return s.ActualDensity }) / r.Info.Config.Density
}

// differing returns the configuration keys whose values differ between
// runs, the most telling first.
func differing(runs []*Run) []string {
	views := make([]map[string]string, len(runs))
	keys := map[string]bool{}
	for i, r := range runs {
		views[i] = configView(r)
		for k := range views[i] {
			keys[k] = true
		}
	}
	var diff []string
	for k := range keys {
		v0, ok0 := views[0][k]
		for _, v := range views[1:] {
			if vi, ok := v[k]; ok != ok0 || vi != v0 {
				diff = append(diff, k)
				break
			}
		}
	}
	first := map[string]int{"sparsifier": 0, "density": 1, "workers": 2}
	sort.Slice(diff, func(i, j int) bool {
		pi, oki := first[diff[i]]
		pj, okj := first[diff[j]]
		switch {
		case oki && okj:
			return pi < pj
		case oki != okj:
			return oki
		}
		return diff[i] < diff[j]
	})
	return diff
}

// runLabels names the runs by the options that differ (their directory
// names when none does), made unique. An option a run does not have (that
// of another method) is left out of its label.
func runLabels(runs []*Run, diff []string) []string {
	labels := make([]string, len(runs))
	for i, r := range runs {
		v := configView(r)
		var parts []string
		for _, k := range diff {
			if val, ok := v[k]; ok {
				parts = append(parts, k+"="+val)
			}
		}
		labels[i] = strings.Join(parts, " ")
		if labels[i] == "" {
			labels[i] = r.name()
		}
	}
	count := map[string]int{}
	for _, l := range labels {
		count[l]++
	}
	for i, l := range labels {
		if count[l] > 1 {
			labels[i] = l + " (" + runs[i].name() + " #" + strconv.Itoa(i+1) + ")"
		}
	}
	return labels
}

// reach is when a run first reached the target.
type reach struct {
	run         int
	ok          bool
	wall        float64
	epoch, step int
	best        float64
}

// timeToTarget finds, for each run, its first evaluation of metric at least
// as good as target.
func timeToTarget(runs []*Run, metric string, target float64) []reach {
	higher := metricOf(metric).higher
	out := make([]reach, len(runs))
	for i, r := range runs {
		out[i] = reach{run: i}
		_, out[i].best = r.finalBest(metric)
		for _, e := range r.Evals {
			if e.Metric != metric || !isFinite(e.Value) {
				continue
			}
			if (higher && e.Value >= target) || (!higher && e.Value <= target) {
				out[i].ok, out[i].wall, out[i].epoch, out[i].step = true, e.Wall, e.Epoch, e.Step
				break
			}
		}
	}
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].ok != out[b].ok {
			return out[a].ok
		}
		return out[a].ok && out[a].wall < out[b].wall
	})
	return out
}

// autoTarget is the best value every run with metric reaches: the worst of
// the runs' best values.
func autoTarget(runs []*Run, metric string) float64 {
	higher := metricOf(metric).higher
	t := math.NaN()
	for _, r := range runs {
		_, b := r.finalBest(metric)
		if !isFinite(b) {
			continue
		}
		if !isFinite(t) || (higher && b < t) || (!higher && b > t) {
			t = b
		}
	}
	return t
}

// ComparePage returns the HTML page comparing runs (of one model).
func ComparePage(ctx context.Context, runs []*Run, o Options) ([]byte, error) {
	if len(runs) == 0 {
		return nil, errors.New("reports: no run to compare")
	}
	if err := checkSameModel(runs); err != nil {
		return nil, err
	}
	script, url, err := o.script(ctx)
	if err != nil {
		return nil, err
	}
	diff := differing(runs)
	labels := runLabels(runs, diff)
	onlyWorkers := len(diff) == 1 && diff[0] == "workers"
	specs := compareCharts(runs, labels, onlyWorkers, o.maxPoints())

	metric := ""
	for _, r := range runs {
		if metric = r.primary(); metric != "" {
			break
		}
	}
	split := splitOf(runs)
	mlabel := split + " metric"
	if metric != "" {
		mlabel = onSplit(split, metric)
	}
	runsTab := table{Caption: "Runs", Head: []string{"run", "directory", "sparsifier", "workers", "backend", "setup density", "final " + mlabel,
		"best " + mlabel, "mean actual density", "actual ÷ setup density", "bytes sent per worker", "mean iteration", "duration"}}
	for i, r := range runs {
		f, b := r.finalBestEval(metric)
		runsTab.Rows = append(runsTab.Rows, []string{labels[i], r.Dir, r.Info.Config.Sparsifier, strconv.Itoa(r.Info.Workers), backendName(r.Info.Backend),
			fmtG(r.Info.Config.Density, 4), fmtEval(metric, f) + r.unfinishedMark(), fmtEval(metric, b),
			fmtG(r.mean(func(s *Step) float64 { return s.ActualDensity }), 4), fmtRatio(r.densityRatio()), fmtBytes(r.totalBytesSent()),
			fmtDur(r.mean(func(s *Step) float64 { return s.TIter })), fmtDur(r.duration())})
	}
	tables := []table{runsTab}
	notes := []string{"Model " + runs[0].Info.Config.Model + "; runs differ in: " + strings.Join(diff, ", ") + "."}
	if len(diff) == 0 {
		notes[0] = "Model " + runs[0].Info.Config.Model + "; the runs have the same options (named by directory)."
	}
	for _, r := range runs {
		if n := r.replayNote(); n != "" {
			notes = append(notes, "Recorded gradients of "+r.Info.Replay.Model+". "+n)
			break
		}
	}
	if slices.Contains(diff, "backend") {
		notes = append(notes, "The runs differ in backend: simulated workers in one process share its cores and talk through memory, mpirun's processes each have a core's share and talk through MPI, so their times per iteration are not comparable; their losses and densities are (-workers N and mpirun -np N compute the same).")
	}
	if n := overlapNote(runs, labels); n != "" {
		notes = append(notes, n)
	}
	for i, r := range runs {
		if e := r.partialEval(); e != nil {
			notes = append(notes, "Run "+labels[i]+": the "+split+" metrics are measured on a sample of the split ("+e.sample()+"); they are estimates, noisier than an evaluation of the whole split.")
		}
	}
	_, drawn := projectionChart(runs, labels)
	if n := projectionNote(runs, labels, drawn); n != "" {
		notes = append(notes, n)
	}
	if metric != "" {
		target := o.Target
		if target == 0 {
			target = autoTarget(runs, metric)
		}
		rank := table{Caption: "Time to reach " + onSplit(split, metric) + " " + fmtMetric(metric, target),
			Head: []string{"rank", "run", "wall time", "epoch", "iteration", "best"}}
		for i, re := range timeToTarget(runs, metric, target) {
			row := []string{strconv.Itoa(i + 1), labels[re.run], "not reached", "—", "—", fmtMetric(metric, re.best)}
			if re.ok {
				row[2], row[3], row[4] = fmtDur(re.wall), strconv.Itoa(re.epoch), strconv.Itoa(re.step)
			}
			rank.Rows = append(rank.Rows, row)
		}
		tables = append(tables, rank)
	}
	title := fmt.Sprintf("Comparison of %d runs of %s", len(runs), runs[0].Info.Config.Model)
	return render(title, notes, append(tables, bytesGlossary()), specs, script, url)
}
