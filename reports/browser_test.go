package reports

import (
	"bytes"
	"context"
	"encoding/json"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// The browser test opens generated pages in headless Chromium from file://
// with networking disabled. It skips when no Chromium is installed, unless
// SPARSEGRAD_REQUIRE names browser (as in CI), which makes a missing browser
// or ECharts script a failure (testenv). REPORTS_SCREENSHOTS names a folder
// to keep the screenshots in (default: the test's temporary folder).

func findChromium(t *testing.T) string {
	t.Helper()
	cands := []string{os.Getenv("CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}
	for _, c := range cands {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	testenv.Missing(t, testenv.Browser, "no Chromium found: install Debian's chromium (apt-get install -y chromium) or set CHROMIUM to its path")
	return ""
}

func echartsOrSkip(t *testing.T) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b, err := ECharts(ctx)
	testenv.Check(t, testenv.Browser, err, "the ECharts script is not available")
	return b
}

// chromiumArgs are the flags of every run: headless, no network (every
// request goes to a closed proxy port and no host name resolves), no
// background traffic.
func chromiumArgs(profile string) []string {
	return []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
		"--user-data-dir=" + profile, "--no-first-run", "--no-default-browser-check",
		"--disable-extensions", "--disable-background-networking", "--disable-component-update",
		"--disable-sync", "--disable-default-apps", "--mute-audio",
		"--proxy-server=socks5://127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
		"--host-resolver-rules=MAP * ~NOTFOUND",
		"--enable-logging=stderr", "--v=0",
	}
}

// checkerJS records every console error, uncaught error, failed resource,
// CSP violation and alert, and after load measures each chart's canvas:
// its size, and the number of coloured pixels inside the plot area (series
// are coloured; axes, grid lines and text are grey), then writes the
// result as JSON into <pre id="report-check">.
const checkerJS = `<script>
(function () {
  var errs = [];
  var oe = console.error;
  console.error = function () { errs.push("console.error: " + Array.prototype.join.call(arguments, " ")); oe.apply(console, arguments); };
  window.addEventListener("error", function (e) {
    errs.push("error: " + (e.message || (e.target && (e.target.src || e.target.href)) || "resource failed"));
  }, true);
  window.addEventListener("unhandledrejection", function (e) { errs.push("unhandled rejection: " + e.reason); });
  document.addEventListener("securitypolicyviolation", function (e) { errs.push("CSP violation: " + e.violatedDirective + " " + e.blockedURI); });
  window.alert = function (m) { errs.push("alert: " + m); };
  window.addEventListener("load", function () {
    var loadMs = performance.now();
    setTimeout(function () {
      var res = {errors: errs, charts: [], scriptsLoaded: typeof echarts !== "undefined", loadMs: loadMs};
      document.querySelectorAll(".chart").forEach(function (d) {
        var c = d.querySelector("canvas");
        var r = {id: d.id, canvas: !!c, width: 0, height: 0, coloured: 0, inked: 0};
        if (c) {
          r.width = c.width; r.height = c.height;
          try {
            var s = c.width / d.clientWidth;
            var x0 = Math.floor(80 * s), x1 = Math.floor(c.width - 26 * s), y0 = Math.floor(66 * s), y1 = Math.floor(c.height - 74 * s);
            var px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            for (var y = 0; y < c.height; y++) {
              for (var x = 0; x < c.width; x++) {
                var i = 4 * (y * c.width + x);
                if (px[i + 3] === 0) continue;
                var mx = Math.max(px[i], px[i + 1], px[i + 2]), mn = Math.min(px[i], px[i + 1], px[i + 2]);
                if (mn < 240) r.inked++;
                if (mx - mn > 60 && x >= x0 && x < x1 && y >= y0 && y < y1) r.coloured++;
              }
            }
          } catch (e) { r.error = String(e); }
        }
        // Where ECharts laid out the legend and the plot (internal but
        // stable views of ECharts 5): the legend must lie below the plot
        // and inside the chart, every item drawn.
        try {
          var inst = echarts.getInstanceByDom(d);
          var lm = inst.getModel().getComponent("legend");
          if (lm) {
            var lg = inst.getViewOfComponentModel(lm).group, lr = lg.getBoundingRect();
            r.legendTop = lg.y + lr.y; r.legendBottom = lg.y + lr.y + lr.height;
            r.legendItems = lm.getData().length;
            r.legendType = lm.get("type") || "plain";
          }
          var gm = inst.getModel().getComponent("grid");
          if (gm && gm.coordinateSystem) { var gr = gm.coordinateSystem.getRect(); r.plotBottom = gr.y + gr.height; }
          r.boxHeight = d.clientHeight;
          r.series = inst.getOption().series.length;
        } catch (e) { r.error = "layout: " + e; }
        res.charts.push(r);
      });
      var pre = document.createElement("pre");
      pre.id = "report-check";
      pre.textContent = JSON.stringify(res);
      document.body.appendChild(pre);
    }, 300);
  });
})();
</script>`

type chartCheck struct {
	ID       string `json:"id"`
	Canvas   bool   `json:"canvas"`
	Width    int    `json:"width"`
	Height   int    `json:"height"`
	Coloured int    `json:"coloured"`
	Inked    int    `json:"inked"`
	Error    string `json:"error"`
	// The legend's and the plot's layout, in CSS pixels from the chart's
	// top.
	LegendTop, LegendBottom, PlotBottom float64
	LegendItems, Series, BoxHeight      int
	LegendType                          string
}

type pageCheck struct {
	Errors        []string     `json:"errors"`
	Charts        []chartCheck `json:"charts"`
	ScriptsLoaded bool         `json:"scriptsLoaded"`
	LoadMs        float64      `json:"loadMs"`
	Stderr        string       `json:"-"`
}

var checkRe = regexp.MustCompile(`(?s)<pre id="report-check">(.*?)</pre>`)

// runChecked opens a copy of the page with the checker injected first in
// <head> and returns what it found.
func runChecked(t *testing.T, chromium, pagePath string) pageCheck {
	t.Helper()
	b, err := os.ReadFile(pagePath)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte("<head>"))
	if i < 0 {
		t.Fatal("page has no <head>")
	}
	i += len("<head>")
	checked := append(append(append([]byte{}, b[:i]...), checkerJS...), b[i:]...)
	cp := filepath.Join(filepath.Dir(pagePath), "checked-"+filepath.Base(pagePath))
	if err := os.WriteFile(cp, checked, 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(chromiumArgs(t.TempDir()), "--virtual-time-budget=10000", "--dump-dom", "file://"+cp)
	cmd := testenv.Command(t, 90*time.Second, chromium, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium --dump-dom %s: %v\n%s", cp, err, tail(stderr.String(), 3000))
	}
	m := checkRe.FindSubmatch(stdout.Bytes())
	if m == nil {
		t.Fatalf("%s: the checker wrote no result (did the page load?); chromium said:\n%s", pagePath, tail(stderr.String(), 3000))
	}
	var pc pageCheck
	if err := json.Unmarshal([]byte(html.UnescapeString(string(m[1]))), &pc); err != nil {
		t.Fatalf("%s: checker result: %v", pagePath, err)
	}
	pc.Stderr = stderr.String()
	return pc
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// problems lists what is wrong with a checked page that should have
// rendered the charts want.
func problems(pc pageCheck, want []chartSpec) []string {
	var p []string
	p = append(p, pc.Errors...)
	for _, line := range strings.Split(pc.Stderr, "\n") {
		if strings.Contains(line, "CONSOLE") && (strings.Contains(line, "Uncaught") || strings.Contains(line, "Error")) {
			p = append(p, "chromium log: "+line)
		}
	}
	if !pc.ScriptsLoaded {
		p = append(p, "ECharts did not load")
	}
	if len(pc.Charts) != len(want) {
		p = append(p, "charts in the page: "+itoa(len(pc.Charts))+", want "+itoa(len(want)))
	}
	for i, c := range pc.Charts {
		switch {
		case i < len(want) && c.ID != want[i].ID:
			p = append(p, "chart "+itoa(i)+" is "+c.ID+", want "+want[i].ID)
		case !c.Canvas:
			p = append(p, c.ID+": no canvas")
		case c.Error != "":
			p = append(p, c.ID+": "+c.Error)
		case c.Width < 100 || c.Height < 100:
			p = append(p, c.ID+": canvas "+itoa(c.Width)+"×"+itoa(c.Height))
		case c.Coloured < 30:
			p = append(p, c.ID+": blank plot area ("+itoa(c.Coloured)+" coloured pixels, "+itoa(c.Inked)+" inked)")
		case c.LegendType != "plain" || c.LegendItems != c.Series:
			p = append(p, c.ID+": a "+c.LegendType+" legend of "+itoa(c.LegendItems)+" items for "+itoa(c.Series)+" series")
		case c.LegendBottom > float64(c.BoxHeight)+1:
			p = append(p, c.ID+": the legend ends below the chart ("+ftoa(c.LegendBottom)+" px of "+itoa(c.BoxHeight)+")")
		case c.LegendTop < c.PlotBottom+20:
			p = append(p, c.ID+": the legend ("+ftoa(c.LegendTop)+" px) runs into the plot and its axis labels ("+ftoa(c.PlotBottom)+" px)")
		}
	}
	return p
}

func itoa(i int) string { return strconv.Itoa(i) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', 0, 64) }

// screenshot saves a PNG of the page (not the checked copy).
func screenshot(t *testing.T, chromium, pagePath, name string, height int) string {
	t.Helper()
	dir := os.Getenv("REPORTS_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := filepath.Abs(filepath.Join(dir, name+".png"))
	if err != nil {
		t.Fatal(err)
	}
	args := append(chromiumArgs(t.TempDir()), "--virtual-time-budget=10000", "--window-size=1400,"+strconv.Itoa(height), "--screenshot="+out, "file://"+pagePath)
	cmd := testenv.Command(t, 90*time.Second, chromium, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, tail(stderr.String(), 3000))
	}
	st, err := os.Stat(out)
	if err != nil || st.Size() < 10000 {
		t.Fatalf("screenshot %s missing or tiny (%v)", out, err)
	}
	t.Logf("screenshot of %s: %s", filepath.Base(pagePath), out)
	return out
}

type browserCase struct {
	name    string
	runs    []string // one: a run page; several: a comparison
	opt     Options
	screens bool
}

func writeCase(t *testing.T, dir string, c browserCase) (string, []chartSpec) {
	t.Helper()
	ctx := context.Background()
	var runs []*Run
	for _, d := range c.runs {
		r, err := ReadRun(d)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	var b []byte
	var specs []chartSpec
	var err error
	if len(runs) == 1 {
		b, err = RunPage(ctx, runs[0], c.opt)
		specs = runCharts(runs[0], c.opt.maxPoints())
	} else {
		b, err = ComparePage(ctx, runs, c.opt)
		diff := differing(runs)
		specs = compareCharts(runs, runLabels(runs, diff), len(diff) == 1 && diff[0] == "workers", c.opt.maxPoints())
	}
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, c.name+".html")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, specs
}

func TestBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts headless Chromium a dozen times (about a minute)")
	}
	chromium := findChromium(t)
	echartsOrSkip(t)
	dir := t.TempDir()
	td := func(n string) string { return filepath.Join("testdata", "runs", n) }
	cases := []browserCase{
		{name: "run-micro", runs: []string{td("micro-4w")}, screens: true},
		{name: "run-deft", runs: []string{td("deft-4w")}},
		{name: "run-lstm", runs: []string{td("lstm-topk")}},
		{name: "run-xss", runs: []string{td("ncf-xss")}, screens: true},
		{name: "compare-methods", runs: []string{td("deft-4w"), td("deft-8w"), td("micro-4w")}, screens: true},
		{name: "compare-workers", runs: []string{td("deft-4w"), td("deft-8w")}},
		{name: "run-lags", runs: []string{td("lags-4w")}},
		{name: "compare-lags-deft", runs: []string{td("lags-4w"), td("deft-4w")}},
	}
	cases = append(cases, browserCase{name: "run-100k", runs: []string{bigRun(t)}, screens: true},
		browserCase{name: "compare-many", runs: manyRuns(t, 9), screens: true})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p, specs := writeCase(t, dir, c)
			start := time.Now()
			pc := runChecked(t, chromium, p)
			t.Logf("%s: checked in %v: %d charts, load event (page parsed, charts drawn) after %.0f ms", c.name, time.Since(start).Round(time.Millisecond), len(pc.Charts), pc.LoadMs)
			for _, ch := range pc.Charts {
				t.Logf("  %-16s %4d×%-4d coloured %6d inked %6d", ch.ID, ch.Width, ch.Height, ch.Coloured, ch.Inked)
			}
			if ps := problems(pc, specs); len(ps) > 0 {
				t.Errorf("%s:\n  %s", c.name, strings.Join(ps, "\n  "))
			}
			if c.screens {
				screenshot(t, chromium, p, c.name, 430*((len(specs)+1)/2)+750)
			}
		})
	}
}

// manyRuns writes n copies of deft-4w whose configurations differ in their
// density and in a method option with a long name, so that a comparison's
// labels are long and its legends many.
func manyRuns(t *testing.T, n int) []string {
	t.Helper()
	base := t.TempDir()
	var dirs []string
	for i := range n {
		dir := filepath.Join(base, "deft-"+itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join("testdata", "runs", "deft-4w", "run.json"))
		if err != nil {
			t.Fatal(err)
		}
		var info map[string]any
		if err := json.Unmarshal(b, &info); err != nil {
			t.Fatal(err)
		}
		cfg := info["config"].(map[string]any)
		cfg["density"] = 0.001 * float64(i+1)
		cfg["method_options"] = map[string]any{"a_rather_long_method_option_name": i}
		if b, err = json.Marshal(info); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := os.ReadFile(filepath.Join("testdata", "runs", "deft-4w", "metrics.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), m, 0o644); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	}
	return dirs
}

// TestBrowserDetects makes sure the browser check can fail: a page that
// loads ECharts from the network (which the test browser has not) must be
// reported, and so must a chart whose option ECharts rejects.
func TestBrowserDetects(t *testing.T) {
	if testing.Short() {
		t.Skip("starts headless Chromium")
	}
	chromium := findChromium(t)
	echartsOrSkip(t)
	dir := t.TempDir()
	c := browserCase{name: "cdn", runs: []string{filepath.Join("testdata", "runs", "micro-4w")},
		opt: Options{AssetsURL: "https://cdn.jsdelivr.net/npm/echarts@" + EChartsVersion + "/dist/echarts.min.js"}}
	p, specs := writeCase(t, dir, c)
	if ps := problems(runChecked(t, chromium, p), specs); len(ps) == 0 {
		t.Error("a page whose script needs the network passed the offline check")
	} else {
		t.Logf("network page rejected as it should: %v", ps[0])
	}

	// A page whose init throws: option JSON replaced by something invalid.
	c.opt = Options{}
	p, specs = writeCase(t, dir, c)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?s)(<script type="application/json" id="report-options">).*?(</script>)`)
	b = re.ReplaceAll(b, []byte(`${1}[{"id":"loss","option":{"series":[{"type":"nosuchtype"}]}}]${2}`))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if ps := problems(runChecked(t, chromium, p), specs); len(ps) == 0 {
		t.Error("a page with a broken chart passed the check")
	} else {
		t.Logf("broken page rejected as it should: %v", ps[0])
	}
}
