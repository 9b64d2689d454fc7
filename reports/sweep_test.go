package reports

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sweepCase is a sweep of four runs of the test data (DEFT on 4 and 8
// workers, MiCRO and LAGS on 4), with made-up predictions for three.
func sweepCase() SweepInfo {
	td := func(n string) string { return filepath.Join("testdata", "runs", n) }
	return SweepInfo{Title: "test sweep", Notes: []string{"a note"}, Runs: []SweepRun{
		{Dir: td("deft-4w"), Method: "deft", Workers: 4, Density: 0.01, Predicted: &PredictedIter{Compute: 0.03, Select: 0.004, Comm: 0.003, Update: 0.001, Other: 0.001, Iter: 0.039, ActualDensity: 0.01}},
		{Dir: td("deft-8w"), Method: "deft", Workers: 8, Density: 0.01, Predicted: &PredictedIter{Iter: 0.05, ActualDensity: 0.01}},
		{Dir: td("micro-4w"), Method: "micro", Workers: 4, Density: 0.01, Predicted: &PredictedIter{Iter: 0.02}},
		{Dir: td("lags-4w"), Method: "lags", Workers: 4, Density: 0.01},
	}}
}

// plainSteps reads the step records of a run's metrics.jsonl with
// encoding/json alone (the reference for the page's numbers).
func plainSteps(t *testing.T, dir string) []map[string]any {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["type"] == "step" {
			out = append(out, m)
		}
	}
	return out
}

func plainMedian(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// plainPhase is the median of field over the steps after the first 5, and
// plainDensity the mean actual density over the second half.
func plainPhase(steps []map[string]any, field string) float64 {
	var v []float64
	for _, s := range steps[5:] {
		v = append(v, s[field].(float64))
	}
	return plainMedian(v)
}

func plainDensity(steps []map[string]any) float64 {
	sum := 0.0
	half := steps[len(steps)/2:]
	for _, s := range half {
		sum += s["actual_density"].(float64)
	}
	return sum / float64(len(half))
}

// pageOptions extracts the charts' options from a page.
func pageOptions(t *testing.T, page []byte) map[string]map[string]any {
	t.Helper()
	m := regexp.MustCompile(`(?s)<script type="application/json" id="report-options">(.*?)</script>`).FindSubmatch(page)
	if m == nil {
		t.Fatal("the page has no chart options")
	}
	var items []struct {
		ID     string         `json:"id"`
		Option map[string]any `json:"option"`
	}
	if err := json.Unmarshal(m[1], &items); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, it := range items {
		out[it.ID] = it.Option
	}
	return out
}

// seriesValues returns a category chart's series values by name.
func seriesValues(opt map[string]any) map[string][]float64 {
	out := map[string][]float64{}
	for _, s := range opt["series"].([]any) {
		sm := s.(map[string]any)
		var vals []float64
		for _, d := range sm["data"].([]any) {
			v := d.(map[string]any)["value"]
			if v == nil {
				vals = append(vals, math.NaN())
			} else {
				vals = append(vals, v.(float64))
			}
		}
		out[sm["name"].(string)] = vals
	}
	return out
}

func categories(opt map[string]any) []string {
	var c []string
	for _, x := range opt["xAxis"].([]any)[0].(map[string]any)["data"].([]any) {
		c = append(c, x.(string))
	}
	return c
}

// unitScale is the factor from seconds to the unit a chart's y axis
// names.
func unitScale(t *testing.T, opt map[string]any) float64 {
	t.Helper()
	ax := opt["yAxis"].([]any)[0].(map[string]any)
	if ax["type"] == "category" { // a horizontal chart: values along x
		ax = opt["xAxis"].([]any)[0].(map[string]any)
	}
	name := ax["name"].(string)
	for _, u := range []struct {
		s string
		f float64
	}{{"(µs", 1e6}, {"(ms", 1e3}, {"(s", 1}} {
		if strings.Contains(name, u.s) {
			return u.f
		}
	}
	t.Fatalf("y axis %q names no time unit", name)
	return 0
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-5*math.Max(math.Abs(a), math.Abs(b))+1e-12 }

// TestSweepPage checks the sweep page's figures against the runs' records
// read plainly: actual density and selection time against workers, the
// phase breakdown, the predicted against measured chart and the error in
// the table and the note.
func TestSweepPage(t *testing.T) {
	info := sweepCase()
	page, err := SweepPage(context.Background(), info, Options{AssetsURL: "echarts.min.js"})
	if err != nil {
		t.Fatal(err)
	}
	opts := pageOptions(t, page)
	for _, id := range []string{"sweep-density", "sweep-select", "sweep-phases", "sweep-error", "sweep-threshold", "metric-epoch-0", "metric-wall-0", "sweep-predicted"} {
		if opts[id] == nil {
			t.Errorf("the page lacks chart %s", id)
		}
	}
	steps := map[string][]map[string]any{}
	for _, r := range info.Runs {
		steps[filepath.Base(r.Dir)] = plainSteps(t, r.Dir)
	}

	d := opts["sweep-density"]
	if c := categories(d); !slices.Equal(c, []string{"4", "8"}) {
		t.Errorf("density chart's workers %v, want [4 8]", c)
	}
	dv := seriesValues(d)
	for name, want := range map[string][2]float64{
		"deft":  {plainDensity(steps["deft-4w"]), plainDensity(steps["deft-8w"])},
		"micro": {plainDensity(steps["micro-4w"]), math.NaN()},
	} {
		got := dv[name]
		if len(got) != 2 || !near(got[0], want[0]) || (math.IsNaN(want[1]) != math.IsNaN(got[1])) || (!math.IsNaN(want[1]) && !near(got[1], want[1])) {
			t.Errorf("density of %s: %v, want %v", name, got, want)
		}
	}
	if sv := dv["setup ρ=0.01"]; len(sv) != 2 || sv[0] != 0.01 {
		t.Errorf("setup density line %v", sv)
	}

	sel := seriesValues(opts["sweep-select"])
	if got, want := sel["deft"][1]/unitScale(t, opts["sweep-select"]), plainPhase(steps["deft-8w"], "t_select"); !near(got, want) {
		t.Errorf("selection of deft ×8: %v s, want %v", got, want)
	}

	ph := opts["sweep-phases"]
	cats, _ := axisCategories(ph)
	if !slices.Equal(cats, []string{"deft ×4", "deft ×8", "micro ×4", "lags ×4"}) {
		t.Errorf("phase chart's runs %v", cats)
	}
	pv := seriesValues(ph)
	if got, want := pv["forward + backward"][3]/unitScale(t, ph), plainPhase(steps["lags-4w"], "t_compute"); !near(got, want) {
		t.Errorf("compute of lags ×4: %v, want %v", got, want)
	}

	pc := opts["sweep-predicted"]
	if cats, _ := axisCategories(pc); !slices.Equal(cats, []string{"deft ×4", "deft ×8", "micro ×4"}) {
		t.Errorf("prediction chart's runs %v (lags has no prediction)", cats)
	}
	pr := seriesValues(pc)
	measDeft4 := plainPhase(steps["deft-4w"], "t_iter")
	if u := unitScale(t, pc); !near(pr["measured"][0]/u, measDeft4) || !near(pr["predicted"][0]/u, 0.039) {
		t.Errorf("predicted chart: %v", pr)
	}

	// The error in the table: (predicted − measured) / measured, in %.
	txt := string(page)
	errDeft4 := 100 * (0.039 - measDeft4) / measDeft4
	want := strconv.FormatFloat(errDeft4, 'f', 0, 64) + " %"
	if !strings.Contains(txt, "<td>"+want+"</td>") {
		t.Errorf("the page lacks deft ×4's error %s", want)
	}
	if !strings.Contains(txt, "Advisor&#39;s error on the time per iteration over 3 runs") {
		t.Errorf("the page lacks the error summary")
	}
	if !strings.Contains(txt, "a note") || !strings.Contains(txt, "<title>test sweep</title>") {
		t.Errorf("the page lacks the title or the notes")
	}
}

// TestSweepPageRefuses checks the errors: no runs, runs of different
// models, a missing run.
func TestSweepPageRefuses(t *testing.T) {
	ctx := context.Background()
	if _, err := SweepPage(ctx, SweepInfo{}, Options{}); err == nil || !strings.Contains(err.Error(), "at least one run") {
		t.Errorf("no runs: %v", err)
	}
	info := sweepCase()
	info.Runs = append(info.Runs, SweepRun{Dir: filepath.Join("testdata", "runs", "lstm-topk"), Method: "topk", Workers: 2})
	if _, err := SweepPage(ctx, info, Options{AssetsURL: "x.js"}); err == nil || !strings.Contains(err.Error(), "different models") {
		t.Errorf("mixed models: %v", err)
	}
	info = sweepCase()
	info.Runs[0].Dir = filepath.Join(t.TempDir(), "nothing")
	if _, err := SweepPage(ctx, info, Options{AssetsURL: "x.js"}); err == nil || !strings.Contains(err.Error(), "run.json") {
		t.Errorf("missing run: %v", err)
	}
}

// TestBrowserSweep opens the sweep pages (the small case and a 24-run one)
// in headless Chromium (offline) and checks that every chart draws, with
// the browser test's checker.
func TestBrowserSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts headless Chromium")
	}
	chromium := findChromium(t)
	echartsOrSkip(t)
	for _, tc := range []struct {
		name string
		info SweepInfo
	}{{"sweep", sweepCase()}, {"sweep-24-runs", bigSweepCase()}} {
		t.Run(tc.name, func(t *testing.T) {
			info := tc.info
			page, err := SweepPage(context.Background(), info, Options{})
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), "sweep.html")
			if err := os.WriteFile(p, page, 0o644); err != nil {
				t.Fatal(err)
			}
			var runs []*Run
			for _, r := range info.Runs {
				rr, err := ReadRun(r.Dir)
				if err != nil {
					t.Fatal(err)
				}
				runs = append(runs, rr)
			}
			specs, _, _ := sweepContent(info, runs, DefaultMaxPoints)
			start := time.Now()
			pc := runChecked(t, chromium, p)
			t.Logf("sweep page checked in %v: %d charts", time.Since(start).Round(time.Millisecond), len(pc.Charts))
			height := 0
			for i, ch := range pc.Charts {
				t.Logf("  %-16s %4d×%-4d coloured %6d", ch.ID, ch.Width, ch.Height, ch.Coloured)
				if i < len(specs) {
					height += specs[i].height() + 40
				}
			}
			if ps := problems(pc, specs); len(ps) > 0 {
				t.Errorf("sweep page:\n  %s", strings.Join(ps, "\n  "))
			}
			screenshot(t, chromium, p, tc.name, height+1500)
		})
	}
}

// bigSweepCase is a sweep the size of the spardl-scaling preset: six
// methods × four worker counts, in grid order (not alphabetical), every
// run with a prediction (the test runs' records stand in for each).
func bigSweepCase() SweepInfo {
	dirs := []string{"deft-4w", "deft-8w", "micro-4w", "lags-4w"}
	info := SweepInfo{Title: "big sweep"}
	for mi, m := range []string{"dense", "topka", "topkdsa", "oktopk", "gtopk", "spardl"} {
		for wi, w := range []int{2, 4, 8, 16} {
			info.Runs = append(info.Runs, SweepRun{Dir: filepath.Join("testdata", "runs", dirs[(mi+wi)%len(dirs)]), Method: m, Workers: w, Density: 0.01,
				Network: "1 Gbit/s, 50µs latency", Predicted: &PredictedIter{Iter: 0.001 * float64(1+mi+wi)}})
		}
	}
	return info
}

// axisCategories returns a chart's category axis (x or y) and its label
// interval ("" when ECharts chooses how many labels fit).
func axisCategories(opt map[string]any) ([]string, string) {
	for _, ax := range []string{"xAxis", "yAxis"} {
		for _, a := range opt[ax].([]any) {
			am := a.(map[string]any)
			if am["type"] != "category" {
				continue
			}
			var c []string
			for _, x := range am["data"].([]any) {
				c = append(c, x.(string))
			}
			iv := ""
			if l, ok := am["axisLabel"].(map[string]any); ok && l["interval"] != nil {
				iv = fmt.Sprint(l["interval"])
			}
			return c, iv
		}
	}
	return nil, ""
}

// TestSweepPageLabelsEveryRun: in a sweep of 24 runs the phase breakdown
// and the predicted-against-measured chart name every run on their axis
// (ECharts showed every fifth label of 24 bars), in the same order (the
// grid's, method by method), so that a bar can be told from its neighbours
// and found in the other chart.
func TestSweepPageLabelsEveryRun(t *testing.T) {
	info := bigSweepCase()
	page, err := SweepPage(context.Background(), info, Options{AssetsURL: "echarts.min.js"})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, r := range info.Runs {
		want = append(want, r.Method+" ×"+strconv.Itoa(r.Workers))
	}
	opts := pageOptions(t, page)
	for _, id := range []string{"sweep-phases", "sweep-predicted"} {
		cats, interval := axisCategories(opts[id])
		if !slices.Equal(cats, want) {
			t.Errorf("%s: runs %v, want the grid's order %v", id, cats, want)
		}
		if interval != "0" {
			t.Errorf("%s: the category axis labels every %q run, want every one (interval 0)", id, interval)
		}
	}
}

// TestSweepTablesWithoutExponents: a run of seconds per iteration (a
// ResNet-18 step on a CPU) and one of microseconds read as plain numbers
// in the sweep's tables ('1.17e+04 ms' before).
func TestSweepTablesWithoutExponents(t *testing.T) {
	info := sweepCase()
	info.Runs[0].Predicted = &PredictedIter{Compute: 11.4, Select: 2e-6, Comm: 0.0749, Update: 0.0493, Other: 0.0216, Iter: 11.658, ActualDensity: 1.2e-5}
	page, err := SweepPage(context.Background(), info, Options{AssetsURL: "echarts.min.js"})
	if err != nil {
		t.Fatal(err)
	}
	txt := string(page)
	for _, want := range []string{"/ 11,700 ms</td>", "11,400 ms", "0.002 ms", "0.000012"} {
		if !strings.Contains(txt, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if m := regexp.MustCompile(`<td>[^<]*[0-9]e(&#43;|[+-])[0-9][^<]*</td>`).FindString(txt); m != "" {
		t.Errorf("a table cell with an exponent: %s", m)
	}
}

// TestSweepErrorPerPhase: the sweep page gives each phase's measured and
// predicted time and error per run, and the mean error of each phase over
// the runs, computed here from the records with encoding/json alone: the
// phases of the time breakdown (t_queue, t_compute, t_select, t_comm at
// most what t_wait leaves, the rest of t_wait, t_update).
func TestSweepErrorPerPhase(t *testing.T) {
	info := sweepCase()
	info.Runs[0].Predicted = &PredictedIter{Queue: 0.002, Compute: 0.03, Select: 0.004, Comm: 0.003, Other: 0.001, Update: 0.001, Iter: 0.041, ActualDensity: 0.01}
	info.Runs[1].Predicted = &PredictedIter{Queue: 0.004, Compute: 0.02, Select: 0.001, Comm: 0.01, Other: 0.002, Update: 0.003, Iter: 0.04, ActualDensity: 0.01}
	info.Runs[2].Predicted = nil
	page, err := SweepPage(context.Background(), info, Options{AssetsURL: "echarts.min.js"})
	if err != nil {
		t.Fatal(err)
	}
	txt := string(page)
	type phase struct {
		name string
		meas func(s map[string]any) float64
		pred func(p *PredictedIter) float64
	}
	f := func(s map[string]any, k string) float64 {
		if v, ok := s[k].(float64); ok {
			return v
		}
		return 0
	}
	sel := func(s map[string]any) float64 { return math.Min(f(s, "t_select"), f(s, "t_wait")) }
	com := func(s map[string]any) float64 { return math.Min(f(s, "t_comm"), f(s, "t_wait")-sel(s)) }
	phases := []phase{
		{"forward + backward", func(s map[string]any) float64 { return f(s, "t_compute") }, func(p *PredictedIter) float64 { return p.Compute }},
		{"selection", sel, func(p *PredictedIter) float64 { return p.Select }},
		{"communication", com, func(p *PredictedIter) float64 { return p.Comm }},
		{"error feedback and the reducer's other work", func(s map[string]any) float64 { return f(s, "t_wait") - sel(s) - com(s) }, func(p *PredictedIter) float64 { return p.Other }},
		{"update", func(s map[string]any) float64 { return f(s, "t_update") }, func(p *PredictedIter) float64 { return p.Update }},
	}
	for _, ph := range phases {
		var errs []float64
		for _, r := range info.Runs[:2] {
			var v []float64
			for _, s := range plainSteps(t, r.Dir)[5:] {
				v = append(v, ph.meas(s))
			}
			m, p := plainMedian(v), ph.pred(r.Predicted)
			e := (p - m) / m
			errs = append(errs, math.Abs(e))
			cell := fmtMillis(m, 3) + " / " + fmtMillis(p, 3) + " (" + strconv.FormatFloat(100*e, 'f', 0, 64) + " %)"
			if !strings.Contains(txt, "<td>"+cell+"</td>") {
				t.Errorf("%s of %s: the page lacks the cell %q", ph.name, r.Dir, cell)
			}
		}
		mean := strconv.FormatFloat(100*(errs[0]+errs[1])/2, 'f', 0, 64) + " %"
		row := regexp.MustCompile(`<tr><td>` + regexp.QuoteMeta(strings.NewReplacer("'", "&#39;", "+", "&#43;").Replace(ph.name)) + `</td><td>(\d+)</td><td>([^<]*)</td>`).FindStringSubmatch(txt)
		if row == nil || row[1] != "2" || row[2] != mean {
			t.Errorf("%s: error per phase row %v, want 2 runs, mean |error| %s", ph.name, row, mean)
		}
	}
}
