package reports

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/train"
)

// pageText renders r's page (the script from a URL, so that the page is
// small) and returns its HTML.
func pageText(t *testing.T, runs ...*Run) string {
	t.Helper()
	o := Options{AssetsURL: "echarts.min.js"}
	var b []byte
	var err error
	if len(runs) == 1 {
		b, err = RunPage(context.Background(), runs[0], o)
	} else {
		b, err = ComparePage(context.Background(), runs, o)
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// chartTexts returns every title, subtitle and axis name of specs.
func chartTexts(specs []chartSpec) string {
	var b strings.Builder
	for _, c := range specs {
		fmt.Fprintf(&b, "%s\n%s\n%s\n%s\n", c.Title, c.Subtitle, c.XName, c.YName)
	}
	return b.String()
}

// TestSplitIsNamed: the LSTM is evaluated on WikiText-2's validation split
// and its page says "validation", never "test"; runs recorded before the
// split was (lstm-topk) are named from their data set; NCF and ResNet-18
// evaluate test splits.
func TestSplitIsNamed(t *testing.T) {
	lstm := mustRead(t, td("lstm-topk"))
	for _, e := range lstm.Evals {
		if e.Split != "" {
			t.Fatal("lstm-topk is meant to be an old record without splits")
		}
	}
	page := pageText(t, lstm)
	texts := chartTexts(runCharts(lstm, DefaultMaxPoints))
	for _, s := range []string{page, texts} {
		if strings.Contains(s, "test perplexity") || strings.Contains(s, "test metric") || strings.Contains(s, "test loss") {
			t.Errorf("the LSTM's page calls its validation metrics test metrics")
		}
	}
	if !strings.Contains(page, "final validation perplexity") || !strings.Contains(texts, "validation perplexity vs epoch") {
		t.Errorf("the LSTM's page does not name the validation split:\n%s", texts)
	}
	// A recorded split wins over the guess from the data set.
	lstm.Evals[0].Split = "test"
	if got := lstm.split(); got != "test" {
		t.Errorf("recorded split ignored: %q", got)
	}
	if page := pageText(t, mustRead(t, td("deft-4w"))); !strings.Contains(page, "final test accuracy") {
		t.Error("ResNet-18's page does not name its test split")
	}
}

// sampledRun is an LSTM run whose second evaluation covered a sample of
// the validation split.
func sampledRun(t *testing.T) *Run {
	r := mustRead(t, td("lstm-topk"))
	for i := range r.Evals {
		r.Evals[i].Split, r.Evals[i].Unit, r.Evals[i].SplitSize, r.Evals[i].Evaluated = "validation", "tokens", 217646, 217646
	}
	last := r.Evals[len(r.Evals)-1].Step
	for i := range r.Evals {
		if r.Evals[i].Step == last {
			r.Evals[i].Evaluated = 35000
		}
	}
	return r
}

// TestPartialEvaluationIsLabelled: an evaluation of a sample of the split
// says so beside its value, in a note and on the metric charts, on the
// run's page and on a comparison; a run evaluated on the whole split has
// none of it.
func TestPartialEvaluationIsLabelled(t *testing.T) {
	r := sampledRun(t)
	const sample = "35,000 of 217,646 tokens"
	var final string
	for _, row := range runTable(r).Rows {
		if row[0] == "final validation perplexity" {
			final = row[1]
		}
	}
	if !strings.Contains(final, "(sample: "+sample+")") {
		t.Errorf("final value %q does not say it is a sample", final)
	}
	page := pageText(t, r)
	if !strings.Contains(page, "sample of the validation split ("+sample) {
		t.Error("the run's page has no note on the sample")
	}
	for _, c := range runCharts(r, DefaultMaxPoints) {
		if strings.HasPrefix(c.ID, "metric-") && !strings.Contains(c.Subtitle, sample) {
			t.Errorf("chart %s: subtitle %q does not say the metric is measured on a sample", c.ID, c.Subtitle)
		}
	}
	whole := mustRead(t, td("lstm-topk"))
	cmp := pageText(t, r, whole)
	if !strings.Contains(cmp, "(sample: "+sample+")") || strings.Count(cmp, "measured on a sample") != 1 {
		t.Error("the comparison does not label exactly the one sampled run")
	}
	if strings.Contains(pageText(t, whole), "sample") {
		t.Error("a run without sampled evaluations is labelled as sampled")
	}
}

// TestLegendsNeverPage: no chart's legend scrolls (paging hid runs behind
// arrows); each chart is tall enough for its legend's rows, however many
// runs a comparison has and however long their labels.
func TestLegendsNeverPage(t *testing.T) {
	var runs []*Run
	for i := range 9 {
		r := mustRead(t, td("deft-4w"))
		r.Config = map[string]any{"model": "resnet18", "sparsifier": "deft", "density": 0.001 * float64(i+1), "seed": 7,
			"method_options": map[string]any{"a_rather_long_method_option_name": i}}
		runs = append(runs, r)
	}
	labels := runLabels(runs, differing(runs))
	if len(labels[0]) < 40 {
		t.Fatalf("labels %q are meant to be long", labels)
	}
	specs := compareCharts(runs, labels, false, DefaultMaxPoints)
	for _, c := range specs {
		lg, err := json.Marshal(c.option()["legend"])
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(lg), "scroll") {
			t.Errorf("chart %s: scrolling legend %s", c.ID, string(lg))
		}
		rows := legendRows(c.legendNames(), c.width())
		if len(c.Series) > 6 && rows < 2 {
			t.Errorf("chart %s: %d long legend items on one row", c.ID, len(c.Series))
		}
		if c.height() < chartHeight+legendRowPx*(rows-1) {
			t.Errorf("chart %s: height %d for %d legend rows", c.ID, c.height(), rows)
		}
	}
	// The estimate itself: 10 items of 40 characters need several rows of
	// 600 px; 2 short ones fit on one.
	if n := legendRows(strings.Split(strings.Repeat(strings.Repeat("x", 40)+",", 10), ",")[:10], 600); n < 5 {
		t.Errorf("legendRows of ten 40-character items = %d, want ≥ 5", n)
	}
	if n := legendRows([]string{"sent", "received"}, 600); n != 1 {
		t.Errorf("legendRows of two short items = %d", n)
	}
}

// TestCompareTimeChartLabelsEveryRun: the stacked time chart of a
// comparison names every run under its bar (one line per differing
// option), not as many as fit.
func TestCompareTimeChartLabelsEveryRun(t *testing.T) {
	runs := []*Run{mustRead(t, td("deft-4w")), mustRead(t, td("deft-8w")), mustRead(t, td("micro-4w")), mustRead(t, td("lags-4w"))}
	labels := runLabels(runs, differing(runs))
	c := compareTimeChart(runs, labels)
	if !c.AllLabels || len(c.Categories) != len(runs) {
		t.Fatalf("categories %q, all labels %v", c.Categories, c.AllLabels)
	}
	for i, cat := range c.Categories {
		if strings.ReplaceAll(cat, "\n", " ") != labels[i] {
			t.Errorf("bar %d is labelled %q, want %q", i, cat, labels[i])
		}
	}
	b, err := json.Marshal(c.option()["xAxis"])
	if err != nil {
		t.Fatal(err)
	}
	if x := string(b); !strings.Contains(x, `"interval":0`) || !strings.Contains(x, `"overflow":"break"`) {
		t.Errorf("the x axis may skip labels: %s", x)
	}
}

// timedRun is a run of n steps of 10 ms (4 forward, 4 backward, 1
// communication, 1 update) with the steps of slow taking 5 s.
func timedRun(n int, slow ...int) *Run {
	r := &Run{}
	for i := 1; i <= n; i++ {
		s := Step{Step: i, TForward: 0.004, TBackward: 0.004, TSelect: 0, TComm: 0.001, TUpdate: 0.001, TIter: 0.01,
			TWait: 0.001, TCompute: 0.008, TCommWall: math.NaN()}
		for _, k := range slow {
			if k == i {
				s.TBackward, s.TCompute, s.TIter = 4.994, 4.998, 5
			}
		}
		r.Steps = append(r.Steps, s)
	}
	return r
}

// TestTimeBreakdownResistsOutliers: one iteration of 5 s among 10 ms ones
// neither moves the bar it shares with others (medians) nor flattens the
// chart (the axis stops above the typical bars, and the subtitle names the
// one it cut off); the header gives medians too.
func TestTimeBreakdownResistsOutliers(t *testing.T) {
	// 1,000 steps in 200 bars of 5: the slow step shares its bar.
	c := timeChart(timedRun(1000, 333), DefaultMaxPoints)
	for _, s := range c.Series {
		if s.Name != phaseBackward {
			continue
		}
		for i, v := range s.Values {
			if math.Abs(v-4) > 1e-9 { // ms
				t.Errorf("bar %s: backward %v ms, want the median 4 ms", c.Categories[i], v)
			}
		}
	}
	if !strings.Contains(c.Subtitle, "median") || !strings.Contains(c.Subtitle, "percentile") {
		t.Errorf("subtitle %q does not say what the bars and lines are", c.Subtitle)
	}
	// 100 steps, one bar each: the slow step's bar is cut off.
	c = timeChart(timedRun(100, 1), DefaultMaxPoints)
	if !(c.YMax > 10 && c.YMax < 100) {
		t.Errorf("axis top %v ms, want it just above the 10 ms bars", c.YMax)
	}
	if !strings.Contains(c.Subtitle, "cut off") || !strings.Contains(c.Subtitle, "iteration 1: 5,000 ms") {
		t.Errorf("subtitle %q does not name the bar it cut off", c.Subtitle)
	}
	// No outlier, no cut.
	if c := timeChart(timedRun(100), DefaultMaxPoints); c.YMax != 0 || strings.Contains(c.Subtitle, "cut off") {
		t.Errorf("uniform run: axis top %v, subtitle %q", c.YMax, c.Subtitle)
	}
	// A loaded machine: one slow iteration in each of 30 of the 200 bars.
	// Their medians stay 10 ms but their 90th percentiles reach seconds;
	// the axis stays sized for the typical bar (it stopped at 5 s, where
	// the 10 ms bars were a sliver), and the subtitle names what it cuts.
	var slow []int
	for b := 0; b < 30; b++ {
		slow = append(slow, 5*6*b+3)
	}
	c = timeChart(timedRun(1000, slow...), DefaultMaxPoints)
	if !(c.YMax >= 10 && c.YMax <= 25) {
		t.Errorf("30 bars with a slow iteration each: axis top %v ms, want it just above the 10 ms bars", c.YMax)
	}
	if !strings.Contains(c.Subtitle, "cut off") || !strings.Contains(c.Subtitle, "and 28 more") {
		t.Errorf("subtitle %q does not name the percentiles it cut off", c.Subtitle)
	}
	var perIter string
	for _, row := range runTable(timedRun(100, 1)).Rows {
		if row[0] == "time per iteration" {
			perIter = row[1]
		}
	}
	if !strings.HasPrefix(perIter, "median 10 ms") {
		t.Errorf("time per iteration %q, want the median first", perIter)
	}
}

// TestPipelinedHeader: a pipelined LAGS run's header gives the exposed and
// the overlapped communication apart, and its per-phase times add up to
// about an iteration instead of counting overlapping calls several times.
func TestPipelinedHeader(t *testing.T) {
	r := mustRead(t, td("lags-4w"))
	r.Info.Pipelined = true
	var comm, perPhase string
	for _, row := range runTable(r).Rows {
		switch row[0] {
		case "reduction (pipelined)":
			comm = row[1]
		case "median time per phase":
			perPhase = row[1]
		}
	}
	for _, w := range []string{"alongside the backward pass", "after it", "calls' durations add up to"} {
		if !strings.Contains(comm, w) {
			t.Errorf("pipelined communication %q lacks %q", comm, w)
		}
	}
	if !strings.Contains(perPhase, phaseAlongside) || !strings.Contains(perPhase, phaseAfter) || strings.Contains(perPhase, "selection") {
		t.Errorf("median time per phase %q", perPhase)
	}
	names, get := phases(r)
	sum, iter := 0.0, r.median(func(s *Step) float64 { return s.TIter })
	for i := range names {
		sum += r.median(get[i])
	}
	if sum > 1.3*iter {
		t.Errorf("the phases' medians add up to %v s, the iteration's is %v s", sum, iter)
	}
}

// TestResumedRunSaysSo: the header of a resumed run lists its resumes.
func TestResumedRunSaysSo(t *testing.T) {
	r := mustRead(t, td("micro-4w"))
	var resumed string
	for _, row := range runTable(r).Rows {
		if row[0] == "resumed" {
			t.Fatalf("a run never resumed has a resumed row: %q", row[1])
		}
	}
	r.Info.Resumes = append(r.Info.Resumes, metrics.Resume{At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Step: 788,
		CommandLine: []string{"train", "-resume", "runs/x"}})
	for _, row := range runTable(r).Rows {
		if row[0] == "resumed" {
			resumed = row[1]
		}
	}
	if !strings.Contains(resumed, "iteration 788") || !strings.Contains(resumed, "2026-01-02T03:04:05Z") || !strings.Contains(resumed, "train -resume runs/x") {
		t.Errorf("resumed row %q", resumed)
	}
}

// TestRunNotes: the notes a run recorded in run.json (a method that does
// nothing, what an adaptive method measured) are rows of the header.
func TestRunNotes(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"run.json", "metrics.jsonl"} {
		b, err := os.ReadFile(filepath.Join(td("micro-4w"), f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "run.json" {
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			m["notes"] = []string{"dragonn: nothing is sparsified", "lags: adaptive density from steps 6–15"}
			if b, err = json.Marshal(m); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var notes []string
	for _, row := range runTable(mustRead(t, dir)).Rows {
		if row[0] == "note" {
			notes = append(notes, row[1])
		}
	}
	if want := []string{"dragonn: nothing is sparsified", "lags: adaptive density from steps 6–15"}; !slices.Equal(notes, want) {
		t.Fatalf("note rows %q, want %q", notes, want)
	}
}

// TestFmtPlain: numbers a person reads on a page have no exponent
// ("5e+04 µs" and "1.234e+04 ms" were printed) and keep their significant
// digits.
func TestFmtPlain(t *testing.T) {
	for _, tc := range []struct {
		v      float64
		digits int
		want   string
	}{
		{50000, 3, "50,000"},
		{54423.7, 3, "54,400"},
		{12345.6, 4, "12,350"},
		{2563.2, 4, "2,563"},
		{999.96, 4, "1,000"},
		{4.2724, 4, "4.272"},
		{0.00012345, 3, "0.000123"},
		{0, 3, "0"},
		{-1234567, 3, "-1,230,000"},
		{math.NaN(), 3, "—"},
	} {
		if got := fmtPlain(tc.v, tc.digits); got != tc.want {
			t.Errorf("fmtPlain(%v, %d) = %q, want %q", tc.v, tc.digits, got, tc.want)
		}
	}
	if got := fmtMillis(12.3456, 4); got != "12,350 ms" {
		t.Errorf("fmtMillis(12.3456 s, 4) = %q, want 12,350 ms", got)
	}
}

// TestSimulatedRunSaysSo: the header of a run of simulated workers says
// they were simulated and on how many executors, and the time breakdown
// shows their wait for an executor first, so that the phases still add up
// to the iteration; a run of workers with their own models shows neither.
func TestSimulatedRunSaysSo(t *testing.T) {
	r := timedRun(20)
	row := func(r *Run, name string) string {
		for _, row := range runTable(r).Rows {
			if row[0] == name {
				return row[1]
			}
		}
		return ""
	}
	r.Info.Workers = 16
	if w := row(r, "workers"); w != "16" {
		t.Fatalf("workers of an ordinary run: %q", w)
	}
	if names, _ := phases(r); slices.Contains(names, phaseQueue) {
		t.Fatal("a run without waits shows a wait for an executor")
	}
	r.Info.Executors = 2
	for i := range r.Steps {
		r.Steps[i].TQueue, r.Steps[i].TIter = 0.07, 0.08
	}
	if w := row(r, "workers"); !strings.Contains(w, "16, simulated in one process on 2 executors") {
		t.Fatalf("workers of a simulated run: %q", w)
	}
	names, get := phases(r)
	if names[0] != phaseQueue || get[0](&r.Steps[0]) != 0.07 {
		t.Fatalf("phases %v: the wait for an executor should come first", names)
	}
	sum := 0.0
	for i := range names {
		sum += r.median(get[i])
	}
	if math.Abs(sum-0.08) > 1e-9 {
		t.Fatalf("phases add up to %v, the iteration is 0.08", sum)
	}
	if c := timeChart(r, DefaultMaxPoints); c.Series[0].Name != phaseQueue {
		t.Fatalf("time breakdown's first series %q", c.Series[0].Name)
	}
}

// TestEveryConfigKeyIsKnown: every key of train's run.json configuration is
// a general option of the run, or pipeline (LAGS' option), so that the
// header's method options list only the method's (comm=auto was listed as
// one).
func TestEveryConfigKeyIsKnown(t *testing.T) {
	ty := reflect.TypeFor[train.Config]()
	for i := range ty.NumField() {
		key, _, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ",")
		if key == "" || key == "-" || key == "pipeline" {
			continue
		}
		if !options.General(key) {
			t.Errorf("run.json key %q (train.Config.%s) is not a general key: reports would list it as a method option", key, ty.Field(i).Name)
		}
	}
	if got := methodOptions(map[string]any{"sparsifier": "topk", "comm": "auto", "executors": 2.0, "check_every": 5.0}); got != "(none)" {
		t.Errorf("method options %q", got)
	}
}

// TestRunSaysWhichKernelsRan: the run table names the CPU kernels run.json
// records (oneDNN or im2col), and has no such row when none are recorded.
func TestRunSaysWhichKernelsRan(t *testing.T) {
	r := timedRun(5)
	row := func() (string, bool) {
		for _, row := range runTable(r).Rows {
			if row[0] == "CPU kernels" {
				return row[1], true
			}
		}
		return "", false
	}
	if v, ok := row(); ok {
		t.Fatalf("a run without kernels recorded shows %q", v)
	}
	r.Info.Versions.Kernels = "oneDNN 2.6.3 (libdnnl.so.2, OpenMP runtime, 2 threads, activations in nChw8c)"
	if v, _ := row(); v != r.Info.Versions.Kernels {
		t.Fatalf("CPU kernels row %q", v)
	}
}

// TestManySeriesDistinctColours is a regression test: a sweep chart of 16 to
// 32 runs took ECharts' nine-colour palette round and round (Top-k twice and
// CLT-k four times in the same blue). Every chart's palette must now hold a
// colour of its own for each series that has none set.
func TestManySeriesDistinctColours(t *testing.T) {
	for _, n := range []int{1, 9, 10, 16, 32, 64} {
		c := chartSpec{ID: "c", Title: "many", XName: "x", YName: "y"}
		for i := range n {
			c.Series = append(c.Series, seriesSpec{Name: fmt.Sprintf("run %d", i), Points: []point{{X: 0, Y: float64(i)}}})
		}
		c.Series = append(c.Series, seriesSpec{Name: "reference", Color: "#555555", Points: []point{{X: 0, Y: 0}}})
		b, err := json.Marshal(c.option()["color"])
		if err != nil {
			t.Fatal(err)
		}
		var colours []string
		if err := json.Unmarshal(b, &colours); err != nil {
			t.Fatalf("%d series: palette %s: %v", n, b, err)
		}
		if len(colours) < n {
			t.Fatalf("%d series: palette of %d colours %v: series share colours", n, len(colours), colours)
		}
		seen := map[string]bool{}
		for _, col := range colours[:n] {
			if seen[col] || !regexp.MustCompile(`^#[0-9a-f]{6}$`).MatchString(col) {
				t.Fatalf("%d series: palette %v repeats or malforms %s", n, colours, col)
			}
			seen[col] = true
		}
	}
}

// TestPagesStateHowBytesAreCounted: every page that shows bytes states the
// traffic rule of each collective, so that a reader knows the counts are
// modelled from the calls' real sizes, not measured on the wire.
func TestPagesStateHowBytesAreCounted(t *testing.T) {
	g := bytesGlossary()
	if len(g.Rows) != len(comm.Ops()) { // "in general" plus every op but the barrier
		t.Fatalf("glossary has %d rows, want %d", len(g.Rows), len(comm.Ops()))
	}
	for _, row := range g.Rows[1:] {
		if row[1] == "" {
			t.Errorf("collective %s has no rule", row[0])
		}
	}
	page, err := RunPage(context.Background(), mustRead(t, td("micro-4w")), offline)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"How bytes are counted", "modelled from each call&#39;s real sizes", "2L − c(r) − c(r&#43;1)"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("run page lacks %q", want)
		}
	}
}

// TestOverlapNote: a comparison with a dense run names which dense it is
// (overlapped with its bucket size, or after the backward pass), and runs
// that differ in overlap are said to.
func TestOverlapNote(t *testing.T) {
	lags := mustRead(t, td("lags-4w"))
	lags.Info.Pipelined = true
	dense := mustRead(t, td("deft-4w"))
	dense.Info.Config.Sparsifier, dense.Info.Pipelined = "dense", false
	note := overlapNote([]*Run{lags, dense}, []string{"L", "D"})
	for _, w := range []string{"dense run D all-reduced after the backward pass (-overlap off", "differ in overlap: L reduced during the backward pass, D after it"} {
		if !strings.Contains(note, w) {
			t.Errorf("note %q lacks %q", note, w)
		}
	}
	mb := 25.0
	dense.Info.Pipelined, dense.Info.BucketMB = true, &mb
	note = overlapNote([]*Run{lags, dense}, []string{"L", "D"})
	if !strings.Contains(note, "dense run D all-reduced its gradient in buckets during the backward pass, as PyTorch DDP does (-bucket-mb 25") || strings.Contains(note, "differ in overlap") {
		t.Errorf("both overlapped: note %q", note)
	}
	deft := mustRead(t, td("deft-4w"))
	if n := overlapNote([]*Run{deft, deft}, []string{"a", "b"}); n != "" {
		t.Errorf("no dense, no overlap: note %q, want none", n)
	}
}

// TestSweepBaselineNote: a sweep page says against which dense its
// speedups are measured, and when its dense runs differ in that.
func TestSweepBaselineNote(t *testing.T) {
	mk := func(pipelined bool) *Run {
		r := mustRead(t, td("deft-4w"))
		r.Info.Config.Sparsifier, r.Info.Pipelined = "dense", pipelined
		if pipelined {
			mb := 25.0
			r.Info.BucketMB = &mb
		}
		return r
	}
	deft := mustRead(t, td("deft-4w"))
	for _, tc := range []struct {
		runs []*Run
		want string
	}{
		{[]*Run{deft, mk(true)}, "Speedups are over dense as users run it: dense all-reduced its gradient in buckets during the backward pass, as PyTorch DDP does (-bucket-mb 25"},
		{[]*Run{deft, mk(false)}, "Speedups are over dense all-reduced after the backward pass (-overlap off"},
		{[]*Run{mk(true), mk(false)}, "The baseline differs between runs: in 1 of the dense runs"},
		{[]*Run{deft}, ""},
	} {
		got := sweepBaselineNote(tc.runs)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("note %q, want it to hold %q", got, tc.want)
		}
	}
}
