package reports

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-echarts/go-echarts/v2/charts"
	"github.com/go-echarts/go-echarts/v2/opts"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// seriesSpec is one series of a chart: Points on a value x axis, or Values
// aligned with the chart's categories.
type seriesSpec struct {
	Name    string    `json:"name"`
	Bar     bool      `json:"bar,omitempty"`
	Points  []point   `json:"points,omitempty"`
	Values  []float64 `json:"values,omitempty"`
	Stack   string    `json:"stack,omitempty"`
	Dashed  bool      `json:"dashed,omitempty"`
	Symbols bool      `json:"symbols,omitempty"`
	// Color, when set, draws the series in this colour with a thin line
	// (a reference line beside the data, e.g. a percentile).
	Color string `json:"color,omitempty"`
	// Width, when > 0, is the line's width in pixels (layered).
	Width float64 `json:"width,omitempty"`
}

// layered gives the lines of every chart of cs widths that shrink from the
// first series to the last, so that a series drawn over an equal one (two
// compared runs with the same losses: -workers N and mpirun -np N) leaves
// it showing at the edges.
func layered(cs []chartSpec) []chartSpec {
	for ci := range cs {
		var lines []int
		for j, s := range cs[ci].Series {
			if !s.Bar && s.Color == "" {
				lines = append(lines, j)
			}
		}
		if len(lines) < 2 {
			continue
		}
		for k, j := range lines {
			cs[ci].Series[j].Width = 1.5 + 3*float64(len(lines)-1-k)/float64(len(lines)-1)
		}
	}
	return cs
}

// chartSpec is what one chart shows, before it becomes an ECharts option.
type chartSpec struct {
	ID         string       `json:"id"`
	Title      string       `json:"title"`
	Subtitle   string       `json:"subtitle,omitempty"`
	XName      string       `json:"x_name"`
	YName      string       `json:"y_name"`
	Categories []string     `json:"categories,omitempty"`
	Series     []seriesSpec `json:"series"`
	// Horizontal puts the categories on the y axis, top to bottom (bars
	// grow to the right), every one labelled.
	Horizontal bool `json:"horizontal,omitempty"`
	// AllLabels labels every category (a "\n" in a category breaks its
	// label into lines) instead of as many as fit.
	AllLabels bool `json:"all_labels,omitempty"`
	// YMax, when > 0, is the top of the value axis: what lies above is cut
	// off (the subtitle says what).
	YMax float64 `json:"y_max,omitempty"`
	// Wide makes the chart span the page's width.
	Wide bool `json:"wide,omitempty"`
}

// Layout of a chart, in CSS pixels: the page's grid gives a chart at least
// chartMinWidth; legends wrap onto as many rows as their items need (a
// scrolling legend hid runs behind its arrows).
const (
	chartHeight     = 400
	chartMinWidth   = 600 // the narrowest a chart gets (the page's grid: minmax(620px, 1fr), less padding)
	legendRowPx     = 22
	subtitleLinePx  = 16
	labelLinePx     = 14
	charPx          = 7.0 // average width of a 12 px legend or axis character
	legendItemPx    = 25 + 5 + 10
	horizBandPx     = 16 // height of one category of a horizontal chart
	horizBaseHeight = 120
)

// legendRows is the number of rows a legend of these names takes in a
// chart of the given width (ECharts wraps a plain legend's items).
func legendRows(names []string, width float64) int {
	rows, x := 1, 0.0
	for _, n := range names {
		w := legendItemPx + charPx*float64(utf8.RuneCountInString(n))
		if x > 0 && x+w > width {
			rows++
			x = 0
		}
		x += w
	}
	return rows
}

// labelLines is the most lines of a category label (its "\n"-separated
// lines, each broken to the bar's width).
func (c *chartSpec) labelLines() int {
	n := 1
	if c.AllLabels && !c.Horizontal {
		per := max(1, int(float64(c.bandWidth())/charPx))
		for _, l := range c.Categories {
			lines := 0
			for _, part := range strings.Split(l, "\n") {
				lines += max(1, (utf8.RuneCountInString(part)+per-1)/per)
			}
			n = max(n, lines)
		}
	}
	return n
}

// subtitleCharsPerLine is how many characters of a subtitle fit on a line.
func (c *chartSpec) subtitleCharsPerLine() int { return int((c.width() - 30) / 6.5) }

// subtitleLines returns the subtitle broken into lines that fit the
// chart's width (ECharts does not wrap it).
func (c *chartSpec) subtitleLines() []string {
	if c.Subtitle == "" {
		return nil
	}
	return wrapWords(c.Subtitle, c.subtitleCharsPerLine())
}

// wrapWords breaks s into lines of at most width characters, at spaces
// (a longer word gets a line of its own).
func wrapWords(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(w) > width:
			lines = append(lines, line)
			line = w
		default:
			line += " " + w
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// title is the chart's title and subtitle, the subtitle broken into lines
// (with a line height, without which ECharts draws them over each other).
func (c *chartSpec) title() opts.Title {
	t := opts.Title{Title: c.Title, Subtitle: strings.Join(c.subtitleLines(), "\n")}
	if len(c.subtitleLines()) > 1 {
		t.SubtitleStyle = &opts.TextStyle{LineHeight: subtitleLinePx}
	}
	return t
}

// extraTop is the room (px) a subtitle of more than one line adds above
// the plot.
func (c *chartSpec) extraTop() int {
	return subtitleLinePx * max(0, len(c.subtitleLines())-1)
}

// width is the chart's width to lay out for.
func (c *chartSpec) width() float64 {
	if c.Wide {
		return 2 * chartMinWidth
	}
	return chartMinWidth
}

// legendNames are the names the legend shows.
func (c *chartSpec) legendNames() []string {
	var ns []string
	for _, s := range c.Series {
		ns = append(ns, s.Name)
	}
	return ns
}

// height is the chart's height: room for every legend row and label line.
func (c *chartSpec) height() int {
	rows := legendRows(c.legendNames(), c.width())
	h := chartHeight + legendRowPx*(rows-1) + labelLinePx*(c.labelLines()-1) + c.extraTop()
	if c.Horizontal {
		h = max(h, horizBaseHeight+legendRowPx*rows+horizBandPx*len(c.Categories))
	}
	return h
}

// option builds the chart's ECharts option with go-echarts.
func (c *chartSpec) option() map[string]any {
	catType, valType := "value", "value"
	if c.Categories != nil {
		catType = "category"
	}
	bars := false
	for _, s := range c.Series {
		bars = bars || s.Bar
	}
	rows := legendRows(c.legendNames(), c.width())
	bottom := 50 + legendRowPx*rows + labelLinePx*(c.labelLines()-1)
	xAxis := opts.XAxis{Type: catType, Name: c.XName, NameLocation: "middle", NameGap: 28 + labelLinePx*(c.labelLines()-1), Scale: opts.Bool(catType == "value")}
	yAxis := opts.YAxis{Type: valType, Name: c.YName, NameLocation: "middle", NameGap: 52, Scale: opts.Bool(!bars)}
	top := strconv.Itoa(64 + c.extraTop())
	grid := opts.Grid{Left: "78", Right: "24", Top: top, Bottom: strconv.Itoa(bottom)}
	if c.AllLabels {
		xAxis.AxisLabel = &opts.AxisLabel{Interval: "0"}
	}
	if c.YMax > 0 {
		yAxis.Max = c.YMax
	}
	if c.Horizontal {
		// Categories down the y axis, in order from the top, every one
		// labelled; the value axis along the bottom.
		xAxis = opts.XAxis{Type: "value", Name: c.YName, NameLocation: "middle", NameGap: 28}
		yAxis = opts.YAxis{Type: "category", Data: c.Categories, Inverse: opts.Bool(true), AxisLabel: &opts.AxisLabel{Interval: "0"}}
		grid = opts.Grid{Left: "16", Right: "32", Top: top, Bottom: strconv.Itoa(bottom), ContainLabel: opts.Bool(true)}
	}
	global := []charts.GlobalOpts{
		charts.WithInitializationOpts(opts.Initialization{ChartID: c.ID}),
		charts.WithTitleOpts(c.title()),
		charts.WithTooltipOpts(opts.Tooltip{Show: opts.Bool(true), Trigger: "axis"}),
		charts.WithLegendOpts(opts.Legend{Show: opts.Bool(true), Type: "plain", Bottom: "0"}),
		charts.WithXAxisOpts(xAxis),
		charts.WithYAxisOpts(yAxis),
		charts.WithGridOpts(grid),
		charts.WithAnimation(false),
	}
	if catType == "value" {
		global = append(global, charts.WithDataZoomOpts(opts.DataZoom{Type: "inside"}))
	}
	if n := c.paletteSeries(); n > len(echartsPalette) {
		global = append(global, charts.WithColorsOpts(palette(n)))
	}
	// Bars and lines share a rectangular chart; Line carries both.
	ch := charts.NewLine()
	ch.SetGlobalOptions(global...)
	if c.Categories != nil && !c.Horizontal {
		ch.SetXAxis(c.Categories)
	}
	for _, s := range c.Series {
		var so []charts.SeriesOpts
		lineType := ""
		if s.Dashed {
			lineType = "dashed"
		}
		switch {
		case s.Color != "":
			so = append(so, charts.WithLineStyleOpts(opts.LineStyle{Color: s.Color, Width: 1, Type: lineType}), charts.WithItemStyleOpts(opts.ItemStyle{Color: s.Color}))
		case s.Dashed || s.Width > 0:
			so = append(so, charts.WithLineStyleOpts(opts.LineStyle{Width: float32(s.Width), Type: lineType}))
		}
		if s.Bar {
			bar := charts.NewBar()
			data := make([]opts.BarData, len(s.Values))
			for i, v := range s.Values {
				data[i] = opts.BarData{Value: num(v)}
			}
			bar.AddSeries(s.Name, data, append(so, charts.WithBarChartOpts(opts.BarChart{Stack: s.Stack}))...)
			ch.Overlap(bar)
			continue
		}
		so = append(so, charts.WithLineChartOpts(opts.LineChart{ShowSymbol: opts.Bool(s.Symbols), Stack: s.Stack}))
		var data []opts.LineData
		// Layered symbols shrink with their lines (an evaluation drawn
		// over an equal one leaves a ring of it).
		sym := 0
		if s.Symbols && s.Width > 0 {
			sym = int(math.Round(2 + 2*s.Width))
		}
		if c.Categories != nil {
			data = make([]opts.LineData, len(s.Values))
			for i, v := range s.Values {
				data[i] = opts.LineData{Value: num(v), SymbolSize: sym}
			}
		} else {
			data = make([]opts.LineData, len(s.Points))
			for i, p := range s.Points {
				data[i] = opts.LineData{Value: [2]num{num(p.X), num(p.Y)}, SymbolSize: sym}
			}
		}
		ch.AddSeries(s.Name, data, so...)
	}
	ch.Validate()
	opt := ch.JSON()
	if c.AllLabels && !c.Horizontal && len(c.Categories) > 0 {
		// Every category labelled, long lines broken to the bar's width
		// (go-echarts has no option for the width and the breaking).
		opt["xAxis"] = patchJSON(opt["xAxis"], func(axes []map[string]any) {
			for _, a := range axes {
				a["axisLabel"] = map[string]any{"interval": 0, "lineHeight": labelLinePx, "width": c.bandWidth(), "overflow": "break"}
			}
		})
	}
	return opt
}

// echartsPalette is ECharts' default palette, which it repeats from the
// tenth series on.
var echartsPalette = []string{"#5470c6", "#91cc75", "#fac858", "#ee6666", "#73c0de", "#3ba272", "#fc8452", "#9a60b4", "#ea7ccc"}

// paletteSeries is the number of the chart's series that take their colour
// from the palette (those without a Color of their own).
func (c *chartSpec) paletteSeries() int {
	n := 0
	for _, s := range c.Series {
		if s.Color == "" {
			n++
		}
	}
	return n
}

// palette returns n distinct colours for a chart with more series than
// ECharts' palette holds (a sweep of 16–32 runs): ECharts' nine first, then
// hues spaced by the golden angle, each at one of three lightnesses in
// turn, so that no two series of a chart share a colour.
func palette(n int) []string {
	out := slices.Clone(echartsPalette)
	for i := 0; len(out) < n; i++ {
		hue := math.Mod(float64(i)*137.50776405, 360)
		light := []float64{0.42, 0.60, 0.30}[i%3]
		if c := hslHex(hue, 0.65, light); !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out[:n]
}

// hslHex writes the colour of hue h (degrees), saturation s and lightness l
// (both in [0, 1]) as #rrggbb.
func hslHex(h, s, l float64) string {
	c := (1 - math.Abs(2*l-1)) * s
	x := c * (1 - math.Abs(math.Mod(h/60, 2)-1))
	m := l - c/2
	var r, g, b float64
	switch {
	case h < 60:
		r, g, b = c, x, 0
	case h < 120:
		r, g, b = x, c, 0
	case h < 180:
		r, g, b = 0, c, x
	case h < 240:
		r, g, b = 0, x, c
	case h < 300:
		r, g, b = x, 0, c
	default:
		r, g, b = c, 0, x
	}
	byte8 := func(v float64) int { return int(math.Round((v + m) * 255)) }
	return fmt.Sprintf("#%02x%02x%02x", byte8(r), byte8(g), byte8(b))
}

// bandWidth is the width (px) a category label may take.
func (c *chartSpec) bandWidth() int {
	return max(40, int(c.width()-110)/max(1, len(c.Categories))-8)
}

// patchJSON converts v to the JSON value it encodes as, lets edit change
// it, and returns the result (v itself if it is not an array of objects).
func patchJSON(v any, edit func([]map[string]any)) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var m []map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return v
	}
	edit(m)
	return m
}

// optionJSON is the chart's option as JSON with <, > and & escaped, safe
// inside an HTML script element.
func (c *chartSpec) optionJSON() ([]byte, error) {
	b, err := json.Marshal(c.option())
	if err != nil {
		return nil, fmt.Errorf("reports: encoding chart %s: %w", c.ID, err)
	}
	return b, nil
}

// stepSeries is the line of f × scale over the step records.
func stepSeries(name string, steps []Step, f func(*Step) float64, scale float64, maxPts int) seriesSpec {
	pts := make([]point, 0, len(steps))
	for i := range steps {
		pts = append(pts, point{float64(steps[i].Step), f(&steps[i]) * scale})
	}
	return seriesSpec{Name: name, Points: downsample(finite(pts), maxPts)}
}

// epochX returns the x position of an evaluation on an epoch axis: epoch e
// spans (e−1, e], and an evaluation within it is placed by its step between
// the last logged steps of epochs e−1 and e.
func epochX(r *Run) func(epoch, step int) float64 {
	last := map[int]int{}
	for _, s := range r.Steps {
		if s.Step > last[s.Epoch] {
			last[s.Epoch] = s.Step
		}
	}
	return func(epoch, step int) float64 {
		hi, ok := last[epoch]
		lo := last[epoch-1]
		if !ok || step >= hi || hi <= lo || step <= lo {
			return float64(epoch)
		}
		return float64(epoch-1) + float64(step-lo)/float64(hi-lo)
	}
}

// metricGroups returns r's metric names grouped by chart, primary first.
func metricGroups(names []string) (groups []string, members map[string][]string) {
	members = map[string][]string{}
	for _, n := range names {
		g := metricOf(n).group
		if _, ok := members[g]; !ok {
			groups = append(groups, g)
		}
		members[g] = append(members[g], n)
	}
	return groups, members
}

// metricCharts are the test metric vs epoch and vs wall time charts, one pair
// per group of metrics; each run in runs gives one series per metric.
func metricCharts(runs []*Run, labels []string, maxPts int) []chartSpec {
	var names []string
	seen := map[string]bool{}
	for _, r := range runs {
		for _, n := range r.metricNames() {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	groups, members := metricGroups(names)
	maxWall := 0.0
	for _, r := range runs {
		for _, e := range r.Evals {
			if isFinite(e.Wall) && e.Wall > maxWall {
				maxWall = e.Wall
			}
		}
	}
	tu := timeUnit(maxWall)
	split := splitOf(runs)
	// A subtitle for evaluations of a sample of the split.
	var sampled []string
	for ri, r := range runs {
		if e := r.partialEval(); e != nil {
			s := e.sample()
			if labels != nil {
				s = labels[ri] + ": " + s
			}
			sampled = append(sampled, s)
		}
	}
	sub := ""
	if len(sampled) > 0 {
		sub = "on a sample of the " + split + " split: " + strings.Join(sampled, "; ")
	}
	var out []chartSpec
	for gi, g := range groups {
		ms := members[g]
		info := metricOf(ms[0])
		yName := onSplit(split, ms[0])
		if len(ms) > 1 {
			yName = split + " metric"
		}
		if info.unit != "" {
			yName += " (" + info.unit + ")"
		}
		t := split + " " + title(ms)
		ep := chartSpec{ID: "metric-epoch-" + strconv.Itoa(gi), Title: t + " vs epoch", Subtitle: sub, XName: "epoch", YName: yName}
		wall := chartSpec{ID: "metric-wall-" + strconv.Itoa(gi), Title: t + " vs wall time", Subtitle: sub, XName: "wall time (" + tu.name + ")", YName: yName}
		for ri, r := range runs {
			ex := epochX(r)
			for _, m := range ms {
				mi := metricOf(m)
				var pe, pw []point
				for _, e := range r.Evals {
					if e.Metric != m {
						continue
					}
					pe = append(pe, point{ex(e.Epoch, e.Step), e.Value * mi.scale})
					pw = append(pw, point{e.Wall / tu.div, e.Value * mi.scale})
				}
				if len(pe) == 0 {
					continue
				}
				name := mi.label
				if labels != nil {
					name = labels[ri]
					if len(ms) > 1 {
						name += " " + mi.label
					}
				}
				ep.Series = append(ep.Series, seriesSpec{Name: name, Points: downsample(finite(pe), maxPts), Symbols: true})
				wall.Series = append(wall.Series, seriesSpec{Name: name, Points: downsample(finite(pw), maxPts), Symbols: true})
			}
		}
		out = append(out, ep, wall)
	}
	return out
}

func title(metrics []string) string {
	labels := make([]string, len(metrics))
	for i, m := range metrics {
		labels[i] = metricOf(m).label
	}
	return strings.Join(labels, ", ")
}

// runCharts are the charts of one run's report.
func runCharts(r *Run, maxPts int) []chartSpec {
	out := metricCharts([]*Run{r}, nil, maxPts)
	if len(r.Steps) == 0 {
		return out
	}
	if r.Info.Replay == nil { // a replay has no loss
		out = append(out, chartSpec{ID: "loss", Title: "Training loss", XName: "iteration", YName: "loss (mean over workers)",
			Series: []seriesSpec{stepSeries("training loss", r.Steps, func(s *Step) float64 { return s.Loss }, 1, maxPts)}})
	}
	// The setup density is drawn last and dashed: on top of an actual
	// density equal to it, both stay visible.
	out = append(out, chartSpec{ID: "density", Title: "Setup vs actual density", XName: "iteration", YName: "density (fraction of gradient elements)",
		Subtitle: "actual = |union of the indices sent| / N; dashed: setup density",
		Series: []seriesSpec{
			stepSeries("actual density", r.Steps, func(s *Step) float64 { return s.ActualDensity }, 1, maxPts),
			dashed(stepSeries("setup density", r.Steps, func(s *Step) float64 { return s.Density }, 1, maxPts)),
		}})
	if c, ok := ratioChart(r, maxPts); ok {
		out = append(out, c)
	}
	out = append(out, chartSpec{ID: "error", Title: "Error (mean residual norm)", XName: "iteration", YName: "mean over workers of ‖residual‖₂",
		Series: []seriesSpec{stepSeries("error", r.Steps, func(s *Step) float64 { return s.ErrorNorm }, 1, maxPts)}})
	if r.hasThreshold() {
		out = append(out, thresholdChart(r, maxPts))
	}
	out = append(out, timeChart(r, maxPts))
	if c, ok := overlapChart(r, maxPts); ok {
		out = append(out, c)
	}
	out = append(out, bytesChart([]*Run{r}, nil, maxPts))
	if c, ok := layerKChart(r); ok {
		out = append(out, c)
	}
	if c, ok := projectionChart([]*Run{r}, nil); ok {
		out = append(out, c)
	}
	return out
}

// ratioChart is the actual density over the setup density per iteration
// (what the papers plot: DEFT's Fig. 1 build-up), with 1 dashed; absent for
// a run without a setup density below 1 (dense).
func ratioChart(r *Run, maxPts int) (chartSpec, bool) {
	if d := r.Info.Config.Density; !(d > 0 && d < 1) {
		return chartSpec{}, false
	}
	ratio := stepSeries("actual ÷ setup density", r.Steps, func(s *Step) float64 { return s.ActualDensity / s.Density }, 1, maxPts)
	one := dashed(stepSeries("1 (the setup density)", r.Steps, func(s *Step) float64 { return 1 }, 1, maxPts))
	return chartSpec{ID: "density-ratio", Title: "Actual density ÷ setup density", XName: "iteration", YName: "actual ÷ setup density",
		Subtitle: "mean " + fmtRatio(r.densityRatio()) + "; above 1: the workers' selections together send more than ρ",
		Series:   []seriesSpec{ratio, one}}, true
}

// errorScale is the MiCRO paper's Fig. 8 scaling factor: Σ threshold / Σ
// error over the steps that have both (NaN if none).
func errorScale(steps []Step) float64 {
	st, se := 0.0, 0.0
	for _, s := range steps {
		if isFinite(s.Threshold) && isFinite(s.ErrorNorm) {
			st += s.Threshold
			se += s.ErrorNorm
		}
	}
	if se == 0 {
		return math.NaN()
	}
	return st / se
}

func thresholdChart(r *Run, maxPts int) chartSpec {
	k := errorScale(r.Steps)
	c := chartSpec{ID: "threshold", Title: "Threshold and scaled error", XName: "iteration", YName: "threshold (|gradient element|)",
		Series: []seriesSpec{stepSeries("threshold", r.Steps, func(s *Step) float64 { return s.Threshold }, 1, maxPts)}}
	if isFinite(k) {
		c.Subtitle = "error × " + strconv.FormatFloat(k, 'g', 4, 64) + " (Σ threshold / Σ error, as MiCRO's Fig. 8)"
		c.Series = append(c.Series, stepSeries("scaled error", r.Steps, func(s *Step) float64 { return s.ErrorNorm }, k, maxPts))
	}
	return c
}

// timeBars is the most bars of the time breakdown chart.
const timeBars = 200

// pipelined reports whether step s's reduction started during the backward
// pass (LAGS pipelining): its wall time (t_comm_wall) then exceeds the part
// left exposed after the backward pass (t_wait). Records without
// t_comm_wall are taken as sequential.
func pipelined(s *Step) bool {
	return isFinite(s.TCommWall) && isFinite(s.TWait) && s.TCommWall > s.TWait
}

// isPipelined reports whether r reduced its gradient during the backward
// pass (LAGS pipelining): run.json says so, or, for runs recorded before
// it did, a step's reduction outlasted its exposed part.
func (r *Run) isPipelined() bool {
	return r.Info.Pipelined || slices.ContainsFunc(r.Steps, func(s Step) bool { return pipelined(&s) })
}

// overlapped is the part of step s's backward pass that a pipelined
// reduction ran alongside: its wall time less the part after the backward
// pass, at most the forward and backward time (0 when the reduction started
// after the pass or t_comm_wall was not recorded).
func overlapped(s *Step) float64 {
	if !isFinite(s.TCommWall) || !isFinite(s.TWait) {
		return 0
	}
	return min(max(0, s.TCommWall-s.TWait), max(0, s.TCompute))
}

// dashed returns s drawn dashed (on top of an equal series before it, both
// stay visible).
func dashed(s seriesSpec) seriesSpec {
	s.Dashed = true
	return s
}

// minus is a − b, at least 0, and a when b is NaN.
func minus(a, b float64) float64 {
	if !isFinite(b) {
		return a
	}
	return max(0, a-b)
}

// The phases of the time breakdown.
const (
	phaseQueue     = "waiting for an executor and the other workers' turns"
	phaseForward   = "forward"
	phaseBackward  = "backward"
	phaseCompute   = "forward + backward"
	phaseAlongside = "backward, the reduction running alongside"
	phaseSelect    = "selection"
	phaseComm      = "communication"
	phaseOther     = "error feedback and the reducer's other work"
	phaseAfter     = "reduction after the backward pass"
	phaseUpdate    = "update"
)

// phaseOrder is the order of the phases in a chart (the data path's).
var phaseOrder = []string{phaseQueue, phaseForward, phaseBackward, phaseCompute, phaseAlongside, phaseSelect, phaseComm, phaseOther, phaseAfter, phaseUpdate}

// Phase is one part of an iteration in a run's time breakdown.
type Phase struct {
	Name    string
	Seconds float64
}

// Breakdown returns the phases of the run's i-th step record as its report's
// time breakdown stacks them; they add up to the step's t_iter (a record
// holds one worker's times: metrics.Step).
func (r *Run) Breakdown(i int) []Phase {
	names, get := phases(r)
	out := make([]Phase, len(names))
	for j, n := range names {
		out[j] = Phase{n, get[j](&r.Steps[i])}
	}
	return out
}

// phases returns the time breakdown's phases for r, which add up to an
// iteration (t_iter = t_queue + t_compute + t_wait + t_update, one worker's
// times): simulated workers' wait for a shared executor and the other
// workers' turns (t_queue) when there is any; forward and backward
// separately when measured (backward then holds the rest of t_compute),
// else their sum; then, for a sequential reduction, its parts within
// t_wait: selection (t_select), communication (t_comm, at most what t_wait
// leaves: calls in flight together sum to more than the time they took) and
// the rest, error feedback and the reducer's other work (decoding, the
// residual, copies); and the update (t_update). A pipelined run
// (isPipelined) reduces its layer groups during the backward pass,
// concurrently, so its selection and communication cannot be told apart
// in time: its reduction shows as the part of the backward pass it ran
// alongside (taken out of the backward time) and the part after the
// backward pass (t_wait). Nothing shows as communication that was not a
// communicator call.
func phases(r *Run) (names []string, get []func(*Step) float64) {
	split := slices.ContainsFunc(r.Steps, func(s Step) bool { return isFinite(s.TForward) })
	pipe := r.isPipelined()
	ov := func(s *Step) float64 { return 0 }
	if pipe {
		ov = overlapped
	}
	if slices.ContainsFunc(r.Steps, func(s Step) bool { return s.TQueue > 0 }) {
		names = append(names, phaseQueue)
		get = append(get, func(s *Step) float64 { return s.TQueue })
	}
	if split {
		fw := func(s *Step) float64 { return min(s.TForward, s.TCompute) }
		names = append(names, phaseForward, phaseBackward)
		get = append(get, fw, func(s *Step) float64 { return minus(s.TCompute, fw(s)+ov(s)) })
	} else {
		names = append(names, phaseCompute)
		get = append(get, func(s *Step) float64 { return minus(s.TCompute, ov(s)) })
	}
	if pipe {
		names = append(names, phaseAlongside, phaseAfter, phaseUpdate)
		get = append(get, overlapped, func(s *Step) float64 { return s.TWait }, func(s *Step) float64 { return s.TUpdate })
		return names, get
	}
	sel := func(s *Step) float64 { return min(s.TSelect, s.TWait) }
	com := func(s *Step) float64 { return min(s.TComm, minus(s.TWait, sel(s))) }
	names = append(names, phaseSelect, phaseComm, phaseOther, phaseUpdate)
	get = append(get, sel, com, func(s *Step) float64 { return minus(s.TWait, sel(s)+com(s)) }, func(s *Step) float64 { return s.TUpdate })
	return names, get
}

// overlapChart shows, per iteration of a pipelined run, the reduction's
// wall time (t_comm_wall: from the first layer group entering the reducer
// during the backward pass until the averaged gradient was complete), the
// part of it after the backward pass (t_wait) and the sum of the
// communicator calls' durations (t_comm, which overlapping calls inflate):
// what LAGS pipelining hides. It is absent for a run that did not pipeline
// (its reduction all comes after the backward pass: the time breakdown
// shows its parts) or did not record t_comm_wall.
func overlapChart(r *Run, maxPts int) (chartSpec, bool) {
	if !r.isPipelined() || !slices.ContainsFunc(r.Steps, func(s Step) bool { return isFinite(s.TCommWall) }) {
		return chartSpec{}, false
	}
	du := durUnit(r.median(func(s *Step) float64 { return max(s.TCommWall, s.TWait, s.TComm) }))
	scale := 1 / du.div
	sub := "wall time from the first layer group entering the reducer during the backward pass; dashed: after it"
	if r.Info.Workers == 1 {
		sub += "; one worker: no communication, the reduction is selection and error feedback"
	}
	c := chartSpec{ID: "overlap", Title: "Pipelined reduction: wall time and after backward", XName: "iteration",
		YName:    "time (" + du.name + ")",
		Subtitle: sub,
		Series: []seriesSpec{
			stepSeries("reduction's wall time (t_comm_wall)", r.Steps, func(s *Step) float64 { return s.TCommWall }, scale, maxPts),
			dashed(stepSeries("after the backward pass (t_wait)", r.Steps, func(s *Step) float64 { return s.TWait }, scale, maxPts)),
			stepSeries("sum of the communicator calls' durations (t_comm)", r.Steps, func(s *Step) float64 { return s.TComm }, scale, maxPts),
		}}
	return c, true
}

// timeChart stacks, per bar, the median of each phase over the iterations
// the bar stands for (one slow iteration does not move it), with the 10th
// and 90th percentiles of the iteration time as lines when bars stand for
// several iterations. When a few bars tower over the rest (the first
// iteration, a pause), or the 90th percentile of a few bars does (a loaded
// machine's slow iterations), the value axis stops above the 95th
// percentile of the bars and the median of the 90th percentiles, and the
// subtitle names what it cut off, so that the typical iteration stays
// readable.
func timeChart(r *Run, maxPts int) chartSpec {
	names, get := phases(r)
	iter := func(s *Step) float64 { return s.TIter }
	du := durUnit(r.median(iter))
	c := chartSpec{ID: "time", Title: "Time breakdown per iteration", XName: "iteration", YName: "time (" + du.name + ", the worker the others waited for)"}
	col := func(f func(*Step) float64) []float64 {
		vals := make([]float64, len(r.Steps))
		for j := range r.Steps {
			vals[j] = f(&r.Steps[j]) / du.div
		}
		return vals
	}
	var ranges [][2]int
	var totals []float64
	for i, n := range names {
		meds, rg := bucketQuantiles(col(get[i]), timeBars, 0.5)
		ranges = rg
		if totals == nil {
			totals = make([]float64, len(meds))
		}
		for b, v := range meds {
			if isFinite(v) {
				totals[b] += v
			}
		}
		c.Series = append(c.Series, seriesSpec{Name: n, Bar: true, Stack: "time", Values: meds})
	}
	for _, rg := range ranges {
		a, b := r.Steps[rg[0]].Step, r.Steps[rg[1]-1].Step
		if a == b {
			c.Categories = append(c.Categories, strconv.Itoa(a))
		} else {
			c.Categories = append(c.Categories, strconv.Itoa(a)+"–"+strconv.Itoa(b))
		}
	}
	var notes []string
	// The axis is sized for the typical bar and the typical 90th
	// percentile; what rises above that (a bar, or the percentile line of
	// a bar holding a few slow iterations) is cut off and named.
	tops, level := totals, quantile(totals, 0.95)
	if len(ranges) < len(r.Steps) {
		lo, _ := bucketQuantiles(col(iter), timeBars, 0.1)
		hi, _ := bucketQuantiles(col(iter), timeBars, 0.9)
		c.Series = append(c.Series,
			seriesSpec{Name: "iteration, 90th percentile", Values: hi, Dashed: true, Color: "#555555"},
			seriesSpec{Name: "iteration, 10th percentile", Values: lo, Dashed: true, Color: "#aaaaaa"})
		notes = append(notes, "bars: median of each phase over the iterations of a bar; dashed: 10th and 90th percentile of the iteration time")
		tops = make([]float64, len(hi))
		for i := range hi {
			tops[i] = max(totals[i], hi[i])
		}
		level = max(level, quantile(hi, 0.5))
	}
	if r.isPipelined() {
		notes = append(notes, "pipelined: the part of the backward pass the reduction ran alongside is shown apart, then the reduction after it")
	}
	if cut, what := cutOff(tops, level, c.Categories, du); cut > 0 {
		c.YMax = cut
		notes = append(notes, what)
	}
	c.Subtitle = strings.Join(notes, "; ")
	return c
}

// cutOff returns where the value axis of a chart whose bars reach tops
// should stop so that a few towering bars do not flatten the others (a
// little above level, the typical height), and a note naming the bars cut
// off; 0 when no bar towers (or there are too few bars to tell).
func cutOff(tops []float64, level float64, cats []string, du unit) (float64, string) {
	if len(tops) < 20 {
		return 0, ""
	}
	cut := niceCeil(1.25 * level)
	var over []string
	for i, v := range tops {
		if isFinite(v) && v > cut {
			over = append(over, cats[i]+": "+fmtPlain(v, 3)+" "+du.name)
		}
	}
	if len(over) == 0 || !(cut > 0) {
		return 0, ""
	}
	more := ""
	if len(over) > 2 {
		more = " and " + strconv.Itoa(len(over)-2) + " more"
		over = over[:2]
	}
	return cut, "cut off at " + fmtPlain(cut, 3) + " " + du.name + ": iteration " + strings.Join(over, ", ") + more
}

// niceCeil rounds x > 0 up to 1, 2, 2.5 or 5 times a power of ten.
func niceCeil(x float64) float64 {
	if !(x > 0) || !isFinite(x) {
		return x
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= x*(1-1e-12) {
			return m * p
		}
	}
	return 10 * p
}

func bytesChart(runs []*Run, labels []string, maxPts int) chartSpec {
	mx := 0.0
	for _, r := range runs {
		for _, s := range r.Steps {
			if isFinite(s.BytesSent) && s.BytesSent > mx {
				mx = s.BytesSent
			}
			if isFinite(s.BytesRecv) && s.BytesRecv > mx {
				mx = s.BytesRecv
			}
		}
	}
	u := bytesUnit(mx)
	c := chartSpec{ID: "bytes", Title: "Bytes per iteration", XName: "iteration", YName: u.name + " per worker per iteration"}
	for i, r := range runs {
		if labels == nil {
			// Received is drawn dashed on top: where a collective sends
			// what it receives, both lines stay visible.
			recv := dashed(stepSeries("received", r.Steps, func(s *Step) float64 { return s.BytesRecv }, 1/u.div, maxPts))
			c.Series = append(c.Series, stepSeries("sent", r.Steps, func(s *Step) float64 { return s.BytesSent }, 1/u.div, maxPts), recv)
			c.Subtitle = "dashed: received"
		} else {
			c.Series = append(c.Series, stepSeries(labels[i]+" sent", r.Steps, func(s *Step) float64 { return s.BytesSent }, 1/u.div, maxPts))
		}
	}
	return c
}

// layerKSamples is the number of steps DEFT's per-layer k chart shows.
const layerKSamples = 3

func layerKChart(r *Run) (chartSpec, bool) {
	var with []int
	layers := 0
	for i, s := range r.Steps {
		if len(s.LayerK) > 0 {
			with = append(with, i)
			if len(s.LayerK) > layers {
				layers = len(s.LayerK)
			}
		}
	}
	if len(with) == 0 {
		return chartSpec{}, false
	}
	// One bar group per tensor, named, down the page in layout order.
	c := chartSpec{ID: "layerk", Title: "Per-layer k: elements selected per tensor", YName: "elements selected (rank 0)",
		Subtitle: "tensors in layout order; bars: sampled iterations", Horizontal: true, Wide: true}
	for l := 0; l < layers; l++ {
		name := "tensor " + strconv.Itoa(l)
		if l < len(r.Info.LayerNames) && r.Info.LayerNames[l] != "" {
			name = r.Info.LayerNames[l]
		}
		c.Categories = append(c.Categories, name)
	}
	n := min(layerKSamples, len(with))
	prev := -1
	for j := 0; j < n; j++ {
		idx := 0
		if n > 1 {
			idx = j * (len(with) - 1) / (n - 1)
		}
		if idx == prev {
			continue
		}
		prev = idx
		s := r.Steps[with[idx]]
		vals := slices.Repeat([]float64{math.NaN()}, layers)
		for l, k := range s.LayerK {
			vals[l] = float64(k)
		}
		c.Series = append(c.Series, seriesSpec{Name: "iteration " + strconv.Itoa(s.Step), Bar: true, Values: vals})
	}
	return c, true
}

// Projection settings: the worker counts and networks of the projected
// communication time chart.
var (
	projWorkers  = []int{2, 4, 8, 16, 32, 64, 128, 256}
	projNetworks = []struct {
		name string
		gbit float64
	}{{"1 Gbit/s", 1}, {"10 Gbit/s", 10}, {"25 Gbit/s", 25}, {"100 Gbit/s", 100}}
	projLatency = 50 * time.Microsecond
)

// projectionCaveat returns whether the projection is valid for method
// and, if not, why: the method's registry entry says (sparsify.Method's
// Projectable and NotProjectable); a method this program does not know is
// not projected.
func projectionCaveat(method string) (why string, ok bool) {
	m, known := sparsify.Lookup(method)
	switch {
	case known && m.Projectable:
		return "", true
	case known && m.NotProjectable != "":
		return m.NotProjectable, false
	}
	return "the projection is not known to be valid for " + strconv.Quote(method) + " (its traffic may depend on the worker count)", false
}

// projectionNote is the page note naming the runs that have per-operation
// counters but are left out of the projection chart, and why; "" if none.
// labels name the runs of a comparison (nil for one run). drawn says
// whether the page has the chart: a page without one (every run left out,
// e.g. the page of one DEFT run) says only that none is drawn and why, not
// what a chart the reader cannot see leaves out.
func projectionNote(runs []*Run, labels []string, drawn bool) string {
	// The runs left out, by method (in the order first met).
	var methods []string
	left := map[string][]string{}
	for i, r := range runs {
		if _, n := opStats(r); n == 0 {
			continue
		}
		m := r.Info.Config.Sparsifier
		if _, ok := projectionCaveat(m); ok {
			continue
		}
		if _, seen := left[m]; !seen {
			methods = append(methods, m)
		}
		name := m
		if labels != nil {
			name = labels[i]
		}
		left[m] = append(left[m], name)
	}
	var out []string
	for _, m := range methods {
		why, _ := projectionCaveat(m)
		names := left[m]
		switch {
		case len(names) > 2:
			out = append(out, "the "+strconv.Itoa(len(names))+" "+m+" runs: "+why)
		case names[0] == m && len(names) == 1:
			out = append(out, m+": "+why)
		default:
			out = append(out, strings.Join(names, " and ")+" ("+m+"): "+why)
		}
	}
	if len(out) == 0 {
		return ""
	}
	if !drawn {
		return "No projected communication time at other worker counts is drawn (" + strings.Join(out, "; ") +
			"); measure it at the worker counts of interest instead."
	}
	return "The projected communication time leaves out " + strings.Join(out, "; ") +
		". The projection replays each operation's recorded calls with each worker's recorded payload (comm/netmodel.Project), which is wrong for such methods: measure them at the worker counts of interest instead."
}

// opStats sums the "ops" counters of r's step records; n is the number of
// records that had them.
func opStats(r *Run) (stats map[comm.Op]comm.OpStats, n int) {
	byName := map[string]comm.Op{}
	for _, op := range comm.Ops() {
		byName[op.String()] = op
	}
	stats = map[comm.Op]comm.OpStats{}
	for _, s := range r.Steps {
		if s.Ops == nil {
			continue
		}
		n++
		for name, c := range s.Ops {
			op, ok := byName[name]
			if !ok {
				continue
			}
			st := stats[op]
			st.Calls += c.Calls
			st.Elements += c.Elements
			st.BytesSent += c.BytesSent
			st.BytesRecv += c.BytesRecv
			if t := float64(c.Time); isFinite(t) { // null (NaN) when not measured
				st.Time += time.Duration(t * float64(time.Second))
			}
			stats[op] = st
		}
	}
	return stats, n
}

// projectPerStep is the projected communication time of one logged step of
// r on `to` workers over net, in seconds.
func projectPerStep(r *Run, stats map[comm.Op]comm.OpStats, n, to int, net netmodel.Network) (float64, error) {
	from := r.Info.Workers
	if from < 1 && len(r.Steps) > 0 {
		from = r.Steps[0].Workers
	}
	p, err := netmodel.Project(stats, from, to, net)
	if err != nil {
		return math.NaN(), err
	}
	return p.Total.Seconds() / float64(n), nil
}

// projectionChart projects the runs' communication to other worker counts
// and bandwidths; with one run, one series per network, with several, one
// series per run at 10 Gbit/s. Runs of methods the projection is not valid
// for (projectionCaveat) are left out (projectionNote says so on the page).
// It is absent when no run is left with "ops".
func projectionChart(runs []*Run, labels []string) (chartSpec, bool) {
	c := chartSpec{ID: "projection", Title: "Projected communication time", XName: "workers"}
	for _, w := range projWorkers {
		c.Categories = append(c.Categories, strconv.Itoa(w))
	}
	type line struct {
		name string
		vals []float64
	}
	var lines []line
	mx := 0.0
	for ri, r := range runs {
		if _, ok := projectionCaveat(r.Info.Config.Sparsifier); !ok {
			continue
		}
		stats, n := opStats(r)
		if n == 0 {
			continue
		}
		nets := projNetworks
		if labels != nil {
			nets = projNetworks[1:2]
		}
		for _, pn := range nets {
			net := netmodel.Network{Latency: projLatency, Bandwidth: pn.gbit * 1e9 / 8}
			l := line{name: pn.name}
			if labels != nil {
				l.name = labels[ri]
			}
			for _, w := range projWorkers {
				v, err := projectPerStep(r, stats, n, w, net)
				if err != nil {
					v = math.NaN()
				}
				if isFinite(v) && v > mx {
					mx = v
				}
				l.vals = append(l.vals, v)
			}
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return chartSpec{}, false
	}
	du := durUnit(mx)
	c.YName = "communication per iteration (" + du.name + ")"
	c.Subtitle = "α-β model (comm/netmodel), α = 50 µs, from the per-operation counters of the logged iterations"
	if labels != nil {
		c.Subtitle += "; 10 Gbit/s"
	}
	for _, l := range lines {
		vals := make([]float64, len(l.vals))
		for i, v := range l.vals {
			vals[i] = v / du.div
		}
		c.Series = append(c.Series, seriesSpec{Name: l.name, Values: vals, Symbols: true})
	}
	return c, true
}

// compareCharts are the overlays of a comparison page.
func compareCharts(runs []*Run, labels []string, onlyWorkers bool, maxPts int) []chartSpec {
	out := metricCharts(runs, labels, maxPts)
	loss := chartSpec{ID: "loss", Title: "Training loss", XName: "iteration", YName: "loss (mean over workers)"}
	dens := chartSpec{ID: "density", Title: "Setup vs actual density", XName: "iteration", YName: "density (fraction of gradient elements)", Subtitle: "dashed: setup density"}
	errc := chartSpec{ID: "error", Title: "Error (mean residual norm)", XName: "iteration", YName: "mean over workers of ‖residual‖₂"}
	thr := chartSpec{ID: "threshold", Title: "Threshold", XName: "iteration", YName: "threshold (|gradient element|)"}
	for i, r := range runs {
		loss.Series = append(loss.Series, stepSeries(labels[i], r.Steps, func(s *Step) float64 { return s.Loss }, 1, maxPts))
		dens.Series = append(dens.Series, stepSeries(labels[i], r.Steps, func(s *Step) float64 { return s.ActualDensity }, 1, maxPts))
		dens.Series = append(dens.Series, dashed(stepSeries(labels[i]+" (setup)", r.Steps, func(s *Step) float64 { return s.Density }, 1, maxPts)))
		errc.Series = append(errc.Series, stepSeries(labels[i], r.Steps, func(s *Step) float64 { return s.ErrorNorm }, 1, maxPts))
		if r.hasThreshold() {
			thr.Series = append(thr.Series, stepSeries(labels[i], r.Steps, func(s *Step) float64 { return s.Threshold }, 1, maxPts))
		}
	}
	out = append(out, loss, dens, errc)
	if len(thr.Series) > 0 {
		out = append(out, thr)
	}
	out = append(out, compareTimeChart(runs, labels), bytesChart(runs, labels, maxPts))
	if c, ok := projectionChart(runs, labels); ok {
		out = append(out, c)
	}
	if onlyWorkers {
		if c, ok := speedupChart(runs); ok {
			out = append(out, c)
		}
	}
	return layered(out)
}

// compareTimeChart stacks each run's median phase times (phases), one bar
// per run, every bar labelled with its run (one line per option that
// differs).
func compareTimeChart(runs []*Run, labels []string) chartSpec {
	mx := 0.0
	for _, r := range runs {
		if v := r.median(func(s *Step) float64 { return s.TIter }); isFinite(v) && v > mx {
			mx = v
		}
	}
	du := durUnit(mx)
	cats := make([]string, len(labels))
	for i, l := range labels {
		cats[i] = strings.ReplaceAll(l, " ", "\n")
	}
	c := chartSpec{ID: "time", Title: "Time breakdown per iteration", Subtitle: "median of each phase over the logged iterations",
		XName: "run", YName: "time (" + du.name + ", the worker the others waited for)", Categories: cats, AllLabels: true}
	vals := map[string][]float64{}
	pipe := false
	for ri, r := range runs {
		pipe = pipe || r.isPipelined()
		names, get := phases(r)
		for i, n := range names {
			if vals[n] == nil {
				vals[n] = slices.Repeat([]float64{math.NaN()}, len(runs))
			}
			vals[n][ri] = r.median(get[i]) / du.div
		}
	}
	for _, n := range phaseOrder {
		if v, ok := vals[n]; ok {
			c.Series = append(c.Series, seriesSpec{Name: n, Bar: true, Stack: "time", Values: v})
		}
	}
	if pipe {
		c.Subtitle += "; pipelined runs: the backward pass the reduction ran alongside, and the reduction after it"
	}
	return c
}

// speedupChart is the DEFT paper's Fig. 9 for runs that differ only in
// their worker count: the speedup of selection and of throughput over the
// run with the fewest workers, with linear speedup for reference.
func speedupChart(runs []*Run) (chartSpec, bool) {
	type pt struct {
		w         int
		sel, thru float64
	}
	var pts []pt
	for _, r := range runs {
		sel := r.mean(func(s *Step) float64 { return s.TSelect })
		thru := r.mean(func(s *Step) float64 {
			if s.TIter > 0 {
				return float64(s.Samples) / s.TIter
			}
			return math.NaN()
		})
		pts = append(pts, pt{r.Info.Workers, sel, thru})
	}
	sort.SliceStable(pts, func(i, j int) bool { return pts[i].w < pts[j].w })
	if len(pts) < 2 || pts[0].w < 1 || pts[0].w == pts[len(pts)-1].w {
		return chartSpec{}, false
	}
	b := pts[0]
	c := chartSpec{ID: "speedup", Title: "Speedup by scale-out", XName: "workers", YName: "speedup over " + strconv.Itoa(b.w) + " worker(s)",
		Subtitle: "selection: mean t_select ratio (DEFT's Fig. 9); throughput: samples/s ratio"}
	var sel, thru, lin []float64
	for _, p := range pts {
		c.Categories = append(c.Categories, strconv.Itoa(p.w))
		sel = append(sel, b.sel/p.sel)
		thru = append(thru, p.thru/b.thru)
		lin = append(lin, float64(p.w)/float64(b.w))
	}
	c.Series = []seriesSpec{
		{Name: "selection", Values: sel, Symbols: true},
		{Name: "throughput", Values: thru, Symbols: true},
		{Name: "linear", Values: lin, Dashed: true},
	}
	return c, true
}
