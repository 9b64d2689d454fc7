package reports

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// ParseMetrics reads metrics.jsonl records: "step" and "eval" lines are
// returned in file order, other record types and blank lines are skipped. A
// line that is not a JSON object is an error naming its line number, except
// an unterminated last line (a record being written), which is skipped.
func ParseMetrics(rd io.Reader) ([]Step, []Eval, error) {
	p := metricsParser{}
	_, tail, err := p.parse(rd)
	if err != nil {
		return nil, nil, err
	}
	if tail != nil {
		p.steps = append(p.steps, tail.steps...)
		p.evals = append(p.evals, tail.evals...)
	}
	return p.steps, p.evals, nil
}

var update = flag.Bool("update", false, "rewrite the golden files of testdata/golden")

// offline is the option of tests that need no ECharts script: the page
// refers to it by a relative URL.
var offline = Options{AssetsURL: "echarts.min.js"}

func td(name string) string { return filepath.Join("testdata", "runs", name) }

func mustRead(t testing.TB, dir string) *Run {
	t.Helper()
	r, err := ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// rawLines parses metrics.jsonl the obvious way: every line a map.
func rawLines(t testing.TB, dir string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func rawNum(m map[string]any, k string) float64 {
	if v, ok := m[k].(float64); ok {
		return v
	}
	return math.NaN()
}

func sameFloat(a, b float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b))
}

func TestParseMetrics(t *testing.T) {
	long := `{"type":"step","step":1,"layer_k":[` + strings.Repeat("7,", 40000) + `7]}` + "\n"
	cases := []struct {
		name       string
		in         string
		steps      int
		evals      int
		err        string
		checkFirst func(t *testing.T, s []Step, e []Eval)
	}{
		{name: "empty", in: ""},
		{name: "blank lines", in: "\n\n  \n"},
		{name: "one step, nulls and absent fields are NaN", in: `{"type":"step","epoch":1,"step":3,"loss":null,"density":0.5,"workers":2}` + "\n", steps: 1,
			checkFirst: func(t *testing.T, s []Step, e []Eval) {
				if s[0].Step != 3 || s[0].Epoch != 1 || !math.IsNaN(s[0].Loss) || s[0].Density != 0.5 || !math.IsNaN(s[0].Threshold) || s[0].Workers != 2 || s[0].Ops != nil {
					t.Errorf("got %+v", s[0])
				}
			}},
		{name: "eval and unknown type", in: `{"type":"eval","epoch":2,"step":8,"wall":1.5,"metric":"accuracy","value":0.25}` + "\n" + `{"type":"summary","x":1}` + "\n", evals: 1,
			checkFirst: func(t *testing.T, s []Step, e []Eval) {
				if e[0] != (Eval{Epoch: 2, Step: 8, Wall: 1.5, Metric: "accuracy", Value: 0.25}) {
					t.Errorf("got %+v", e[0])
				}
			}},
		{name: "ops and layer_k", in: `{"type":"step","step":1,"layer_k":[1,2],"ops":{"allgather":{"calls":2,"elements":10,"bytes_sent":40,"bytes_recv":40,"time":0.5}}}`, steps: 1,
			checkFirst: func(t *testing.T, s []Step, e []Eval) {
				if !slices.Equal(s[0].LayerK, []int{1, 2}) || s[0].Ops["allgather"] != (OpCount{Calls: 2, Elements: 10, BytesSent: 40, BytesRecv: 40, Time: 0.5}) {
					t.Errorf("got %+v", s[0])
				}
			}},
		{name: "long line", in: long, steps: 1, checkFirst: func(t *testing.T, s []Step, e []Eval) {
			if len(s[0].LayerK) != 40001 {
				t.Errorf("layer_k has %d entries", len(s[0].LayerK))
			}
		}},
		{name: "unterminated last line being written", in: `{"type":"step","step":1}` + "\n" + `{"type":"step","st`, steps: 1},
		{name: "terminated bad line", in: `{"type":"step","step":1}` + "\n" + `not json` + "\n" + `{"type":"step","step":2}` + "\n", err: "line 2"},
		{name: "eval without metric", in: `{"type":"eval","value":1}` + "\n", err: "without \"metric\""},
		{name: "wrong field type", in: `{"type":"step","step":"one"}` + "\n", err: "line 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, e, err := ParseMetrics(strings.NewReader(c.in))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(s) != c.steps || len(e) != c.evals {
				t.Fatalf("%d steps, %d evals; want %d, %d", len(s), len(e), c.steps, c.evals)
			}
			if c.checkFirst != nil {
				c.checkFirst(t, s, e)
			}
		})
	}
}

// FuzzParseMetrics checks that the parser never panics and, when it
// accepts its input, returns as many records of each type as a plain
// line-by-line decoding into maps finds.
func FuzzParseMetrics(f *testing.F) {
	for _, d := range []string{"micro-4w", "deft-4w", "ncf-xss"} {
		b, err := os.ReadFile(filepath.Join(td(d), "metrics.jsonl"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("{\"type\":\"step\"}\n{\"type\":\"eval\",\"metric\":\"x\"}"))
	f.Add([]byte("\n\n{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		steps, evals, err := ParseMetrics(bytes.NewReader(b))
		if err != nil {
			return
		}
		lines := strings.Split(string(b), "\n")
		ns, ne := 0, 0
		for _, l := range lines {
			l = strings.TrimSpace(l)
			if l == "" {
				continue
			}
			// The record's type, with encoding/json's matching of keys
			// (case-insensitive, the last duplicate wins).
			var m struct {
				Type string `json:"type"`
			}
			if json.Unmarshal([]byte(l), &m) != nil {
				continue // an unterminated last line (else the parser failed)
			}
			switch m.Type {
			case "step":
				ns++
			case "eval":
				ne++
			}
		}
		if len(steps) > ns || len(evals) > ne {
			t.Fatalf("parser found %d steps, %d evals; a plain decoding %d, %d", len(steps), len(evals), ns, ne)
		}
		if len(steps) < ns || len(evals) < ne {
			// Only an unterminated last line may be dropped.
			last := strings.TrimSpace(lines[len(lines)-1])
			if ns+ne-len(steps)-len(evals) > 1 || last == "" {
				t.Fatalf("parser found %d steps, %d evals; a plain decoding %d, %d", len(steps), len(evals), ns, ne)
			}
		}
	})
}

func TestReadRunErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadRun(filepath.Join(dir, "nope")); err == nil || !strings.Contains(err.Error(), "run.json") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing directory: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "run.json"), []byte(`{"config":`), 0o644)
	if _, err := ReadRun(dir); err == nil || !strings.Contains(err.Error(), "run.json is not valid") {
		t.Errorf("bad run.json: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "run.json"), []byte(`{"workers":2}`), 0o644)
	if _, err := ReadRun(dir); err == nil || !strings.Contains(err.Error(), `no "config"`) {
		t.Errorf("run.json without config: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "run.json"), []byte(`{"config":{"model":"ncf","workers":3}}`), 0o644)
	r, err := ReadRun(dir)
	if err != nil || r.Info.Workers != 3 || len(r.Steps) != 0 {
		t.Errorf("run without metrics: %v %+v", err, r)
	}
	// A page of a run that has not logged anything yet.
	if err := WriteRunWith(context.Background(), dir, offline); err != nil {
		t.Errorf("empty run: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte("{\"type\":\"step\"}\n]]\n{}\n"), 0o644)
	if err := WriteRunWith(context.Background(), dir, offline); err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "metrics.jsonl") {
		t.Errorf("corrupt metrics: %v", err)
	}
}

func TestDownsample(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 2, 3, 5, 16, 100, 4999, 5000, 5001, 12345} {
		for _, mx := range []int{1, 2, 3, 5, 16, 5000} {
			pts := make([]point, n)
			for i := range pts {
				pts[i] = point{float64(i), rng.NormFloat64()}
				if rng.IntN(50) == 0 {
					pts[i].Y = pts[max(i-1, 0)].Y // ties
				}
			}
			got := downsample(pts, mx)
			lim := mx
			if lim < 2 {
				lim = 2
			}
			if n <= lim {
				if !slices.Equal(got, pts) {
					t.Fatalf("n=%d mx=%d: short series changed", n, mx)
				}
				continue
			}
			if len(got) > lim {
				t.Fatalf("n=%d mx=%d: %d points", n, mx, len(got))
			}
			// A subsequence (x strictly increasing here).
			for i := 1; i < len(got); i++ {
				if got[i].X <= got[i-1].X {
					t.Fatalf("n=%d mx=%d: not in order at %d", n, mx, i)
				}
			}
			in := map[float64]bool{}
			for _, p := range got {
				if pts[int(p.X)] != p {
					t.Fatalf("n=%d mx=%d: point %v not from the input", n, mx, p)
				}
				in[p.X] = true
			}
			// Every bucket's extremes survive: the bucket of point i is
			// the b with b·n/B ≤ i < (b+1)·n/B.
			B := lim / 2
			for b := 0; b < B; b++ {
				lo, hi := b*n/B, (b+1)*n/B
				bmin, bmax := math.Inf(1), math.Inf(-1)
				for _, p := range pts[lo:hi] {
					bmin, bmax = math.Min(bmin, p.Y), math.Max(bmax, p.Y)
				}
				hasMin, hasMax := false, false
				for _, p := range pts[lo:hi] {
					if in[p.X] {
						hasMin = hasMin || p.Y == bmin
						hasMax = hasMax || p.Y == bmax
					}
				}
				if !hasMin || !hasMax {
					t.Fatalf("n=%d mx=%d bucket %d: min kept %v, max kept %v", n, mx, b, hasMin, hasMax)
				}
			}
		}
	}
}

func TestBucketMeans(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 2, 3, 5, 16, 199, 200, 201, 1000} {
		for _, mx := range []int{1, 3, 200} {
			vals := make([]float64, n)
			for i := range vals {
				vals[i] = rng.Float64()
				if rng.IntN(7) == 0 {
					vals[i] = math.NaN()
				}
			}
			means, ranges := bucketMeans(vals, mx)
			if len(means) != min(n, mx) || len(ranges) != len(means) {
				t.Fatalf("n=%d mx=%d: %d buckets", n, mx, len(means))
			}
			next := 0
			for b, rg := range ranges {
				if rg[0] != next || rg[1] <= rg[0] {
					t.Fatalf("n=%d mx=%d: bucket %d range %v", n, mx, b, rg)
				}
				next = rg[1]
				sum, c := 0.0, 0
				for i := rg[0]; i < rg[1]; i++ {
					if !math.IsNaN(vals[i]) {
						sum += vals[i]
						c++
					}
				}
				want := math.NaN()
				if c > 0 {
					want = sum / float64(c)
				}
				if !sameFloat(means[b], want) {
					t.Fatalf("n=%d mx=%d bucket %d: mean %v want %v", n, mx, b, means[b], want)
				}
			}
			if next != n {
				t.Fatalf("n=%d mx=%d: buckets cover %d", n, mx, next)
			}
		}
	}
}

func TestNumJSON(t *testing.T) {
	for _, c := range []struct {
		x    float64
		want string
	}{{0, "0"}, {3, "3"}, {-2, "-2"}, {0.1234567, "0.123457"}, {1e-7, "1e-07"}, {math.NaN(), "null"}, {math.Inf(1), "null"}, {1e20, "1e+20"}} {
		b, err := json.Marshal(num(c.x))
		if err != nil || string(b) != c.want {
			t.Errorf("num(%v) = %s, %v; want %s", c.x, b, err, c.want)
		}
	}
}

// seriesByName finds a chart and its series.
func findChart(t *testing.T, specs []chartSpec, id string) *chartSpec {
	t.Helper()
	for i := range specs {
		if specs[i].ID == id {
			return &specs[i]
		}
	}
	t.Fatalf("no chart %q", id)
	return nil
}

func findSeries(t *testing.T, c *chartSpec, name string) *seriesSpec {
	t.Helper()
	for i := range c.Series {
		if c.Series[i].Name == name {
			return &c.Series[i]
		}
	}
	t.Fatalf("chart %s has no series %q", c.ID, name)
	return nil
}

// TestRunChartsData checks what the charts of each synthetic run receive
// against values computed here from the raw JSON lines.
func TestRunChartsData(t *testing.T) {
	for _, name := range []string{"micro-4w", "deft-4w", "lstm-topk", "ncf-xss"} {
		t.Run(name, func(t *testing.T) {
			r := mustRead(t, td(name))
			raw := rawLines(t, td(name))
			var steps, evals []map[string]any
			for _, m := range raw {
				switch m["type"] {
				case "step":
					steps = append(steps, m)
				case "eval":
					evals = append(evals, m)
				}
			}
			specs := runCharts(r, DefaultMaxPoints)
			checkLine := func(id, series, field string, scale float64) {
				t.Helper()
				s := findSeries(t, findChart(t, specs, id), series)
				var want []point
				for _, m := range steps {
					if v := rawNum(m, field); !math.IsNaN(v) {
						want = append(want, point{rawNum(m, "step"), v * scale})
					}
				}
				if len(s.Points) != len(want) {
					t.Fatalf("%s/%s: %d points, want %d", id, series, len(s.Points), len(want))
				}
				for i := range want {
					if !sameFloat(s.Points[i].X, want[i].X) || !sameFloat(s.Points[i].Y, want[i].Y) {
						t.Fatalf("%s/%s point %d: %v, want %v", id, series, i, s.Points[i], want[i])
					}
				}
			}
			checkLine("loss", "training loss", "loss", 1)
			checkLine("density", "setup density", "density", 1)
			checkLine("density", "actual density", "actual_density", 1)
			checkLine("error", "error", "error_norm", 1)
			bytesChart := findChart(t, specs, "bytes")
			scale := map[string]float64{"B": 1, "kB": 1e-3, "MB": 1e-6}[strings.Fields(bytesChart.YName)[0]]
			checkLine("bytes", "sent", "bytes_sent", scale)
			checkLine("bytes", "received", "bytes_recv", scale)

			// Threshold: present exactly when the records have one; the
			// scaled error uses Σ threshold / Σ error.
			st, se := 0.0, 0.0
			for _, m := range steps {
				if th := rawNum(m, "threshold"); !math.IsNaN(th) {
					st += th
					se += rawNum(m, "error_norm")
				}
			}
			has := false
			for _, c := range specs {
				has = has || c.ID == "threshold"
			}
			if has != (st > 0) {
				t.Fatalf("threshold chart present %v, records with a threshold %v", has, st > 0)
			}
			if has {
				checkLine("threshold", "threshold", "threshold", 1)
				checkLine("threshold", "scaled error", "error_norm", st/se)
			}

			// Time breakdown: one bar per step (≤ 200 steps), stacked
			// phases in milliseconds.
			tc := findChart(t, specs, "time")
			if len(tc.Categories) != len(steps) {
				t.Fatalf("time chart has %d bars for %d steps", len(tc.Categories), len(steps))
			}
			split := !math.IsNaN(rawNum(steps[0], "t_forward"))
			pipe := rawNum(steps[0], "t_comm_wall") > rawNum(steps[0], "t_wait")
			// Each phase from the record's fields (the fixtures' t_comm
			// fits in t_wait), written out here: forward, backward = the
			// rest of t_compute (less what a pipelined reduction ran
			// alongside); selection, communication and the rest of t_wait,
			// or for a pipelined run the part alongside and the part after
			// the backward pass; update.
			num := func(m map[string]any, f string) float64 {
				if v := rawNum(m, f); !math.IsNaN(v) {
					return v
				}
				return 0
			}
			ov := func(m map[string]any) float64 {
				if !pipe {
					return 0
				}
				return num(m, "t_comm_wall") - num(m, "t_wait")
			}
			fields := map[string]func(map[string]any) float64{
				"update": func(m map[string]any) float64 { return num(m, "t_update") },
			}
			if split {
				fields["forward"] = func(m map[string]any) float64 { return num(m, "t_forward") }
				fields["backward"] = func(m map[string]any) float64 { return num(m, "t_compute") - num(m, "t_forward") - ov(m) }
			} else {
				fields["forward + backward"] = func(m map[string]any) float64 { return num(m, "t_compute") - ov(m) }
			}
			if pipe {
				fields["backward, the reduction running alongside"] = ov
				fields["reduction after the backward pass"] = func(m map[string]any) float64 { return num(m, "t_wait") }
			} else {
				fields["selection"] = func(m map[string]any) float64 { return num(m, "t_select") }
				fields["communication"] = func(m map[string]any) float64 { return num(m, "t_comm") }
				fields["error feedback and the reducer's other work"] = func(m map[string]any) float64 {
					return num(m, "t_wait") - num(m, "t_select") - num(m, "t_comm")
				}
			}
			if len(tc.Series) != len(fields) {
				t.Fatalf("time chart series %d, want %d", len(tc.Series), len(fields))
			}
			sums := make([]float64, len(steps))
			for sname, field := range fields {
				s := findSeries(t, tc, sname)
				if s.Stack != "time" || !s.Bar {
					t.Errorf("%s not a stacked bar", sname)
				}
				for i, m := range steps {
					if want := field(m) * 1e3; math.Abs(s.Values[i]-want) > 1e-9 {
						t.Fatalf("time %s step %d: %v want %v ms", sname, i, s.Values[i], want)
					}
					sums[i] += s.Values[i]
				}
			}
			for i, m := range steps {
				if want := rawNum(m, "t_iter") * 1e3; math.Abs(sums[i]-want) > 1e-9 {
					t.Errorf("step %d: the bar adds up to %v ms, the iteration took %v ms", i, sums[i], want)
				}
			}

			// Metric vs epoch and wall time: the records' values, in %.
			for _, m := range evals {
				metric := m["metric"].(string)
				mi := metricOf(metric)
				found := false
				for _, c := range specs {
					if !strings.HasPrefix(c.ID, "metric-wall-") {
						continue
					}
					for _, s := range c.Series {
						if s.Name != mi.label {
							continue
						}
						for _, p := range s.Points {
							if sameFloat(p.X, rawNum(m, "wall")) && sameFloat(p.Y, rawNum(m, "value")*mi.scale) {
								found = true
							}
						}
					}
				}
				if !found {
					t.Errorf("eval %v not in a metric vs wall chart", m)
				}
			}
		})
	}
}

func TestLayerKChart(t *testing.T) {
	r := mustRead(t, td("deft-4w"))
	c, ok := layerKChart(r)
	if !ok {
		t.Fatal("no per-layer k chart")
	}
	if !slices.Equal(c.Categories, r.Info.LayerNames) {
		t.Errorf("categories %v", c.Categories)
	}
	// Every tensor is named on its own row (not as many as fit).
	if !c.Horizontal {
		t.Error("the per-layer k chart does not list the tensors down the page")
	}
	// 12 steps, 3 samples: steps 1, 6, 12 (index j·11/2).
	var names []string
	for _, s := range c.Series {
		names = append(names, s.Name)
		var step int
		if _, err := fmt.Sscanf(s.Name, "iteration %d", &step); err != nil {
			t.Fatal(err)
		}
		for l, v := range s.Values {
			if int(v) != r.Steps[step-1].LayerK[l] {
				t.Errorf("%s layer %d: %v want %d", s.Name, l, v, r.Steps[step-1].LayerK[l])
			}
		}
	}
	if want := []string{"iteration 1", "iteration 6", "iteration 12"}; !slices.Equal(names, want) {
		t.Errorf("sampled %v, want %v", names, want)
	}
	if _, ok := layerKChart(mustRead(t, td("micro-4w"))); ok {
		t.Error("per-layer k chart for a run without layer_k")
	}
}

// TestProjection checks the projected communication time against the
// network model applied to the per-op counters summed here. The counters are
// micro-4w's, relabelled as a method the projection is valid for.
func TestProjection(t *testing.T) {
	r := mustRead(t, td("micro-4w"))
	r.Info.Config.Sparsifier = "topka"
	raw := rawLines(t, td("micro-4w"))
	stats := map[comm.Op]comm.OpStats{}
	n := 0
	for _, m := range raw {
		ops, ok := m["ops"].(map[string]any)
		if !ok {
			continue
		}
		n++
		for _, op := range comm.Ops() {
			o, ok := ops[op.String()].(map[string]any)
			if !ok {
				continue
			}
			s := stats[op]
			s.Calls += int64(o["calls"].(float64))
			s.Elements += int64(o["elements"].(float64))
			s.BytesSent += int64(o["bytes_sent"].(float64))
			s.BytesRecv += int64(o["bytes_recv"].(float64))
			s.Time += time.Duration(o["time"].(float64) * 1e9)
			stats[op] = s
		}
	}
	c, ok := projectionChart([]*Run{r}, nil)
	if !ok {
		t.Fatal("no projection chart")
	}
	div := map[string]float64{"communication per iteration (ms)": 1e-3, "communication per iteration (µs)": 1e-6}[c.YName]
	if div == 0 {
		t.Fatalf("unexpected y axis %q", c.YName)
	}
	for i, pn := range projNetworks {
		s := c.Series[i]
		if s.Name != pn.name {
			t.Fatalf("series %d is %s", i, s.Name)
		}
		for j, w := range projWorkers {
			p, err := netmodel.Project(stats, 4, w, netmodel.Network{Latency: 50 * time.Microsecond, Bandwidth: pn.gbit * 1e9 / 8})
			if err != nil {
				t.Fatal(err)
			}
			want := p.Total.Seconds() / float64(n) / div
			if !sameFloat(s.Values[j], want) {
				t.Errorf("%s, %d workers: %v want %v", pn.name, w, s.Values[j], want)
			}
		}
	}
	if _, ok := projectionChart([]*Run{mustRead(t, td("lstm-topk"))}, nil); ok {
		t.Error("projection chart for a run without ops")
	}
}

func TestCompare(t *testing.T) {
	ctx := context.Background()
	runs := []*Run{mustRead(t, td("deft-4w")), mustRead(t, td("deft-8w")), mustRead(t, td("micro-4w"))}
	diff := differing(runs)
	if !slices.Equal(diff, []string{"sparsifier", "workers"}) {
		t.Errorf("differing = %v", diff)
	}
	labels := runLabels(runs, diff)
	if want := []string{"sparsifier=deft workers=4", "sparsifier=deft workers=8", "sparsifier=micro workers=4"}; !slices.Equal(labels, want) {
		t.Errorf("labels = %v", labels)
	}
	specs := compareCharts(runs, labels, false, DefaultMaxPoints)
	for _, c := range specs {
		if c.ID == "speedup" {
			t.Error("speedup chart for runs that differ in more than the worker count")
		}
	}
	loss := findChart(t, specs, "loss")
	if len(loss.Series) != 3 || loss.Series[2].Name != labels[2] {
		t.Errorf("loss overlay series %v", loss.Series)
	}
	thr := findChart(t, specs, "threshold")
	if len(thr.Series) != 1 || thr.Series[0].Name != labels[2] {
		t.Errorf("threshold overlay should hold the MiCRO run only: %+v", thr.Series)
	}

	// Mean phase times per run.
	tc := findChart(t, specs, "time")
	sel := findSeries(t, tc, "selection")
	for i, r := range runs {
		sum := 0.0
		for _, s := range r.Steps {
			sum += s.TSelect
		}
		if !sameFloat(sel.Values[i], sum/float64(len(r.Steps))*1e3) {
			t.Errorf("run %d mean selection %v", i, sel.Values[i])
		}
	}

	// Time to target: the accuracy every run reaches = the smallest best.
	if got := autoTarget(runs, "accuracy"); !sameFloat(got, 0.49) {
		t.Errorf("auto target %v, want 0.49 (deft-8w's best)", got)
	}
	rk := timeToTarget(runs, "accuracy", 0.45)
	// deft-4w reaches 0.47 at epoch 2, micro 0.45 at epoch 2 (same wall), deft-8w never (0.44, 0.49 at epoch 3).
	if rk[0].run != 0 || rk[1].run != 2 || rk[2].run != 1 || !rk[0].ok || rk[2].epoch != 3 {
		t.Errorf("ranking %+v", rk)
	}
	rk = timeToTarget(runs, "accuracy", 0.6)
	for _, x := range rk {
		if x.ok {
			t.Errorf("run %d reached an unreached target", x.run)
		}
	}
	b, err := ComparePage(ctx, runs, offline)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte("Time to reach test accuracy 49.00 %")) {
		t.Error("ranking table missing")
	}

	// Runs that differ only in workers get the speedup chart.
	two := runs[:2]
	d2 := differing(two)
	if !slices.Equal(d2, []string{"workers"}) {
		t.Fatalf("differing = %v", d2)
	}
	sp := findChart(t, compareCharts(two, runLabels(two, d2), true, DefaultMaxPoints), "speedup")
	if !slices.Equal(sp.Categories, []string{"4", "8"}) {
		t.Errorf("speedup categories %v", sp.Categories)
	}
	mean := func(r *Run, f func(s Step) float64) float64 {
		sum := 0.0
		for _, s := range r.Steps {
			sum += f(s)
		}
		return sum / float64(len(r.Steps))
	}
	wantSel := mean(two[0], func(s Step) float64 { return s.TSelect }) / mean(two[1], func(s Step) float64 { return s.TSelect })
	wantThru := mean(two[1], func(s Step) float64 { return float64(s.Samples) / s.TIter }) / mean(two[0], func(s Step) float64 { return float64(s.Samples) / s.TIter })
	if s := findSeries(t, sp, "selection"); !sameFloat(s.Values[0], 1) || !sameFloat(s.Values[1], wantSel) {
		t.Errorf("selection speedup %v, want [1 %v]", s.Values, wantSel)
	}
	if s := findSeries(t, sp, "throughput"); !sameFloat(s.Values[1], wantThru) {
		t.Errorf("throughput speedup %v, want %v", s.Values, wantThru)
	}
	if s := findSeries(t, sp, "linear"); !slices.Equal(s.Values, []float64{1, 2}) {
		t.Errorf("linear %v", s.Values)
	}

	// The same run twice: labels by directory, made unique.
	same := []*Run{runs[0], runs[0]}
	if l := runLabels(same, differing(same)); l[0] == l[1] {
		t.Errorf("labels not unique: %v", l)
	}
}

func TestCompareRefusesDifferentModels(t *testing.T) {
	out := filepath.Join(t.TempDir(), "c.html")
	err := CompareWith(context.Background(), out, []string{td("micro-4w"), td("lstm-topk")}, offline)
	if err == nil || !strings.Contains(err.Error(), "different models") || !strings.Contains(err.Error(), `"resnet18"`) || !strings.Contains(err.Error(), `"lstm"`) {
		t.Fatalf("err = %v", err)
	}
	if _, serr := os.Stat(out); serr == nil {
		t.Error("a page was written anyway")
	}
	if err := CompareWith(context.Background(), out, nil, offline); err == nil || !strings.Contains(err.Error(), "no run directory") {
		t.Errorf("no runs: %v", err)
	}
	if err := CompareWith(context.Background(), out, []string{td("micro-4w"), td("deft-4w")}, offline); err != nil {
		t.Fatal(err)
	}
}

// TestEscaping: strings from a run are text, never markup or script.
func TestEscaping(t *testing.T) {
	for _, tc := range []struct {
		name string
		page func() ([]byte, error)
	}{
		{"run", func() ([]byte, error) { return RunPage(context.Background(), mustRead(t, td("ncf-xss")), offline) }},
		{"inline", func() ([]byte, error) {
			return RunPage(context.Background(), mustRead(t, td("ncf-xss")), Options{})
		}},
		{"compare", func() ([]byte, error) {
			return ComparePage(context.Background(), []*Run{mustRead(t, td("ncf-xss")), mustRead(t, td("ncf-xss"))}, offline)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.page()
			if errors.Is(err, ErrNoECharts) {
				testenv.Missing(t, testenv.Browser, err.Error())
			}
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(b, []byte("alert(1)</script>")) || bytes.Contains(b, []byte("<script>alert")) {
				t.Fatal("the run's string appears unescaped")
			}
			if !bytes.Contains(b, []byte("&lt;script&gt;alert(1)&lt;/script&gt;")) {
				t.Error("the run's string is not shown as text in the tables")
			}
			if !bytes.Contains(b, []byte(`\u003cscript\u003ealert(1)\u003c/script\u003e`)) {
				t.Error("the run's string is not in the chart data as escaped JSON")
			}
			// The page's own scripts only: ECharts (or its src), options, init.
			if n := bytes.Count(b, []byte("<script")); n != 3 {
				t.Errorf("%d script elements, want 3", n)
			}
		})
	}
}

func TestAssetsURL(t *testing.T) {
	for _, c := range []struct {
		in, script string
		ok         bool
	}{
		{"https://cdn.jsdelivr.net/npm/echarts@5.6.0/dist/echarts.min.js", "https://cdn.jsdelivr.net/npm/echarts@5.6.0/dist/echarts.min.js", true},
		{"https://example.org/assets", "https://example.org/assets/echarts.min.js", true},
		{"assets/", "assets/echarts.min.js", true},
		{"file:///opt/echarts.min.js", "file:///opt/echarts.min.js", true},
		{"javascript:alert(1)", "", false},
		{"https://x.org/a.js; script-src *", "", false},
		{`https://x.org/"a.js`, "", false},
	} {
		err := checkAssetsURL(c.in)
		if (err == nil) != c.ok {
			t.Errorf("%q: err = %v", c.in, err)
		}
		if c.ok && assetsScript(c.in) != c.script {
			t.Errorf("%q: script %q", c.in, assetsScript(c.in))
		}
	}
	if _, err := RunPage(context.Background(), mustRead(t, td("micro-4w")), Options{AssetsURL: "ftp://x/e.js"}); err == nil || !strings.Contains(err.Error(), "scheme") {
		t.Errorf("bad scheme: %v", err)
	}
}

// TestECharts obtains the script (cache or npm) and checks its pin; a file
// named by SPARSEGRAD_ECHARTS with other content is refused.
func TestECharts(t *testing.T) {
	b, err := ECharts(context.Background())
	testenv.Check(t, testenv.Browser, err, "ECharts is not available")
	if checkECharts(b, "x") != nil || len(b) < 500000 {
		t.Fatalf("script of %d bytes fails its checksum", len(b))
	}
	bad := filepath.Join(t.TempDir(), "echarts.min.js")
	os.WriteFile(bad, []byte("window.echarts = {};"), 0o644)
	t.Setenv(EChartsEnv, bad)
	if _, err := loadECharts(context.Background()); err == nil || !errors.Is(err, ErrNoECharts) || !strings.Contains(err.Error(), "SHA-256") {
		t.Errorf("wrong file accepted: %v", err)
	}
	good := filepath.Join(t.TempDir(), "echarts.min.js")
	os.WriteFile(good, b, 0o644)
	t.Setenv(EChartsEnv, good)
	if got, err := loadECharts(context.Background()); err != nil || !bytes.Equal(got, b) {
		t.Errorf("right file refused: %v", err)
	}
	if _, err := extractECharts([]byte("not a tarball")); err == nil || !strings.Contains(err.Error(), "integrity") {
		t.Errorf("bad tarball: %v", err)
	}
}

// TestLargeRun: a 100,000-step run gives a page under 5 MB whose series
// hold at most DefaultMaxPoints points.
func TestLargeRun(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and reads a 100,000-step run")
	}
	dir := bigRun(t)
	start := time.Now()
	r := mustRead(t, dir)
	read := time.Since(start)
	for _, c := range runCharts(r, DefaultMaxPoints) {
		for _, s := range c.Series {
			if len(s.Points) > DefaultMaxPoints || len(s.Values) > DefaultMaxPoints {
				t.Errorf("%s/%s has %d points", c.ID, s.Name, len(s.Points)+len(s.Values))
			}
		}
	}
	opt := Options{}
	if _, err := ECharts(context.Background()); err != nil {
		opt = offline
	}
	b, err := RunPage(context.Background(), r, opt)
	if err != nil {
		t.Fatal(err)
	}
	size := int64(len(b))
	if opt.AssetsURL != "" {
		size += 1034102 // the script that would be inlined
	}
	t.Logf("100,000 steps: read in %v, page built in %v, %.2f MB", read.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), float64(size)/1e6)
	if size > 5e6 {
		t.Errorf("page of %d bytes, want under 5 MB", size)
	}
}

// TestReadMetricsIncremental grows a metrics file in random pieces (cut
// anywhere, also inside a record), rewrites it, and checks each read against
// a fresh parse of the whole file.
func TestReadMetricsIncremental(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(td("micro-4w"), "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	check := func(content []byte) {
		t.Helper()
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
		ws, we, werr := ParseMetrics(bytes.NewReader(content))
		gs, ge, gerr := readMetrics(path)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("after %d bytes: error %v, fresh parse %v", len(content), gerr, werr)
		}
		if len(gs) != len(ws) || len(ge) != len(we) {
			t.Fatalf("after %d bytes: %d steps %d evals, fresh parse %d %d", len(content), len(gs), len(ge), len(ws), len(we))
		}
		for i := range ws {
			if gs[i].Step != ws[i].Step || !sameFloat(gs[i].Loss, ws[i].Loss) {
				t.Fatalf("step %d differs", i)
			}
		}
	}
	for round := 0; round < 3; round++ {
		for n := 0; n < len(src); n += 1 + rng.IntN(300) {
			check(src[:n])
		}
		check(src)
		// A rewritten file of the same size (a new run in the same
		// directory), then a shorter, corrupt one.
		check(bytes.ReplaceAll(src, []byte(`"step":1,`), []byte(`"step":9,`)))
		check(src[len(src)/2:])
	}
}

func TestEpochX(t *testing.T) {
	// Epoch 1 logs steps 1..4, epoch 2 steps 5..8 (every other step logged).
	r := &Run{Steps: []Step{{Epoch: 1, Step: 2}, {Epoch: 1, Step: 4}, {Epoch: 2, Step: 6}, {Epoch: 2, Step: 8}}}
	ex := epochX(r)
	for _, c := range []struct {
		epoch, step int
		want        float64
	}{
		{1, 4, 1},    // end of epoch 1
		{1, 2, 0.5},  // half-way through epoch 1
		{2, 6, 1.5},  // half-way through epoch 2
		{2, 8, 2},    // end of epoch 2
		{2, 9, 2},    // past the last logged step: the epoch
		{3, 10, 3},   // an epoch without logged steps
		{1, 0, 1},    // before any step
		{2, 4, 2},    // a step of the previous epoch: the epoch
		{0, 0, 0},    // nonsense stays put
		{2, 7, 1.75}, // three quarters through epoch 2
	} {
		if got := ex(c.epoch, c.step); !sameFloat(got, c.want) {
			t.Errorf("epochX(%d, %d) = %v, want %v", c.epoch, c.step, got, c.want)
		}
	}
}

func TestCompareWithoutEvaluations(t *testing.T) {
	dir := t.TempDir()
	var dirs []string
	for i, w := range []int{1, 2, 3, 5, 16} {
		d := filepath.Join(dir, "r"+string(rune('a'+i)))
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "run.json"), []byte(`{"config":{"model":"ncf","sparsifier":"topk","workers":`+fmt.Sprint(w)+`},"workers":`+fmt.Sprint(w)+`}`), 0o644)
		os.WriteFile(filepath.Join(d, "metrics.jsonl"), []byte(`{"type":"step","epoch":1,"step":1,"loss":1,"t_select":0.001,"t_iter":0.01,"samples":`+fmt.Sprint(8*w)+`,"workers":`+fmt.Sprint(w)+`}`+"\n"), 0o644)
		dirs = append(dirs, d)
	}
	out := filepath.Join(dir, "c.html")
	if err := CompareWith(context.Background(), out, dirs, offline); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out)
	if !bytes.Contains(b, []byte("final test metric")) || bytes.Contains(b, []byte("Time to reach")) {
		t.Error("a comparison without evaluations should have no ranking")
	}
	if !bytes.Contains(b, []byte(`id="speedup"`)) {
		t.Error("runs that differ only in workers lack the speedup chart")
	}
}
