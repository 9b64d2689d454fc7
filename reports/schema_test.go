package reports

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/metrics"
)

// fillDistinct sets every exported field of the struct v points to a value
// no other field has (numbers 1.5, 2.5, ...; Type to typ).
func fillDistinct(t *testing.T, v reflect.Value, typ string) {
	t.Helper()
	next := 1.0
	for i := range v.NumField() {
		f := v.Field(i)
		next++
		switch {
		case v.Type().Field(i).Name == "Type":
			f.SetString(typ)
		case f.Kind() == reflect.String:
			f.SetString("metric-" + strings.Repeat("x", int(next)))
		case f.Kind() == reflect.Int:
			f.SetInt(int64(next))
		case f.Kind() == reflect.Float64:
			f.SetFloat(next + 0.5)
		case f.Kind() == reflect.Pointer && f.Type().Elem().Kind() == reflect.Float64:
			p := reflect.New(f.Type().Elem())
			p.Elem().SetFloat(next + 0.5)
			f.Set(p)
		case f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.Int:
			f.Set(reflect.ValueOf([]int{int(next), int(next) + 1}))
		case f.Type() == reflect.TypeOf(map[string]metrics.OpCount(nil)):
			f.Set(reflect.ValueOf(map[string]metrics.OpCount{"allgatherv": {Calls: 3, Elements: 5, BytesSent: 7, BytesRecv: 11, Time: 0.25}}))
		default:
			t.Fatalf("field %s of %s has type %s, which this test cannot fill: extend it", v.Type().Field(i).Name, v.Type(), f.Type())
		}
	}
}

// checkSameFields asserts that every field of want (a metrics record) but
// Type has a field of the same name in got (what reports made of it) with
// the same value.
func checkSameFields(t *testing.T, want, got reflect.Value) {
	t.Helper()
	for i := range want.NumField() {
		sf := want.Type().Field(i)
		if sf.Name == "Type" {
			continue
		}
		tag := strings.Split(sf.Tag.Get("json"), ",")[0]
		g := got.FieldByName(sf.Name)
		if !g.IsValid() {
			t.Errorf("%s.%s (json %q), which train writes, is not read by reports: add it to %s", want.Type(), sf.Name, tag, got.Type())
			continue
		}
		w := want.Field(i)
		if w.Kind() == reflect.Pointer {
			w = w.Elem()
		}
		switch {
		case w.Kind() == reflect.Float64:
			if g.Kind() != reflect.Float64 || g.Float() != w.Float() {
				t.Errorf("%s (json %q): wrote %v, reports read %v", sf.Name, tag, w.Interface(), g.Interface())
			}
		case !reflect.DeepEqual(w.Interface(), g.Interface()):
			t.Errorf("%s (json %q): wrote %v, reports read %v", sf.Name, tag, w.Interface(), g.Interface())
		}
	}
}

// TestReadsEveryMetricsField is the contract between the writer and the
// reader of metrics.jsonl: a step and an eval record with every field of
// package metrics' schema set are encoded as train encodes them, parsed by
// ParseMetrics, and every field must arrive.
func TestReadsEveryMetricsField(t *testing.T) {
	var step metrics.Step
	fillDistinct(t, reflect.ValueOf(&step).Elem(), metrics.TypeStep)
	var eval metrics.Eval
	fillDistinct(t, reflect.ValueOf(&eval).Elem(), metrics.TypeEval)
	var buf bytes.Buffer
	for _, rec := range []any{step, eval} {
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(append(b, '\n'))
	}
	steps, evals, err := ParseMetrics(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 1 || len(evals) != 1 {
		t.Fatalf("%d steps and %d evals, want one each", len(steps), len(evals))
	}
	checkSameFields(t, reflect.ValueOf(step), reflect.ValueOf(steps[0]))
	checkSameFields(t, reflect.ValueOf(eval), reflect.ValueOf(evals[0]))
	// An absent threshold (methods without one) reads as NaN.
	step.Threshold = nil
	b, _ := json.Marshal(step)
	steps, _, err = ParseMetrics(bytes.NewReader(append(b, '\n')))
	if err != nil || len(steps) != 1 || !math.IsNaN(steps[0].Threshold) {
		t.Fatalf("without a threshold: %v, %+v", err, steps)
	}
}

// TestProjectionOnlyWhereValid: the projected communication time is drawn
// only for methods whose traffic per worker and call count do not depend on
// the worker count; for the others (SparDL's and gTop-k's log₂ n rounds,
// unions and per-worker shares that change with n, one message per peer) the
// chart leaves the run out and the page says why.
func TestProjectionOnlyWhereValid(t *testing.T) {
	cases := []struct {
		method string
		valid  bool
		why    string // part of the page's note when not valid
	}{
		{"dense", true, ""},
		{"topka", true, ""},
		{"randomk", true, ""},
		{"cltk", true, ""},
		{"dgc", true, ""},
		{"dragonn", true, ""},
		{"lags", true, ""},
		{"spardl", false, "rounds"},
		{"gtopk", false, "rounds"},
		{"deft", false, "union"},
		{"topk", false, "union"},
		{"threshold", false, "union"},
		{"micro", false, "share"},
		{"topkdsa", false, "message"},
		{"oktopk", false, "message"},
		{"newmethod", false, "not known"},
	}
	for _, tc := range cases {
		t.Run(tc.method, func(t *testing.T) {
			r := mustRead(t, td("micro-4w"))
			r.Info.Config.Sparsifier = tc.method
			has := false
			for _, c := range runCharts(r, DefaultMaxPoints) {
				has = has || c.ID == "projection"
			}
			if has != tc.valid {
				t.Fatalf("projection chart drawn: %v, want %v", has, tc.valid)
			}
			page, err := RunPage(context.Background(), r, offline)
			if err != nil {
				t.Fatal(err)
			}
			// One run left out has no chart: its page says none is drawn
			// and why, not what a chart it lacks leaves out.
			note := strings.Contains(string(page), "No projected communication time at other worker counts is drawn")
			if note == tc.valid || !tc.valid && !strings.Contains(string(page), tc.why) {
				t.Errorf("note about the projection present: %v (want %v, naming %q)", note, !tc.valid, tc.why)
			}
			if strings.Contains(string(page), "leaves out") {
				t.Errorf("the page of one run speaks of what a projection chart leaves out")
			}
		})
	}
	// A comparison keeps the valid runs' lines and names the others.
	a, b := mustRead(t, td("micro-4w")), mustRead(t, td("deft-4w"))
	a.Info.Config.Sparsifier = "topka"
	c, ok := projectionChart([]*Run{a, b}, []string{"topka", "deft"})
	if !ok || len(c.Series) != 1 || c.Series[0].Name != "topka" {
		t.Fatalf("comparison projection %v %+v, want only the topka line", ok, c.Series)
	}
	if n := projectionNote([]*Run{a, b}, []string{"topka", "deft"}, true); !strings.Contains(n, "leaves out") || !strings.Contains(n, "deft") || strings.Contains(n, "topka") {
		t.Errorf("comparison note %q, want it to name deft only", n)
	}
}

// TestCommWallCharts: t_comm_wall is used where it belongs. A pipelined run
// (run.json's "pipelined", or, for older records, a step whose reduction
// outlasted its exposed part: t_comm_wall > t_wait) reduces during the
// backward pass with overlapping calls, so its time breakdown shows the
// communication overlapped with the backward pass (taken out of the
// compute time) and the exposed rest (t_wait), which add up to the
// iteration, instead of the calls' summed durations (t_comm, which count
// overlapping time several times); a sequential run keeps t_select and
// t_comm. The overlap chart shows t_comm_wall against t_wait and t_comm.
func TestCommWallCharts(t *testing.T) {
	nan := math.NaN()
	seq := Step{Step: 1, TCompute: 0.5, TSelect: 0.1, TComm: 0.2, TUpdate: 0.05, TWait: 0.32, TCommWall: 0.31, TIter: 0.87,
		TForward: nan, TBackward: nan}
	pipe := Step{Step: 2, TCompute: 0.6, TSelect: 0.1, TComm: 0.9, TUpdate: 0.05, TWait: 0.05, TCommWall: 0.4, TIter: 0.7,
		TForward: nan, TBackward: nan}
	late := Step{Step: 3, TCompute: 0.6, TSelect: 0.1, TComm: 0.9, TUpdate: 0.05, TWait: 0.3, TCommWall: 0.29, TIter: 0.95,
		TForward: nan, TBackward: nan} // a pipelined step whose groups all started after the backward pass
	old := Step{Step: 4, TCompute: 0.5, TSelect: 0.1, TComm: 0.2, TUpdate: 0.05, TWait: 0.3, TCommWall: nan, TIter: 0.85,
		TForward: nan, TBackward: nan}
	split := Step{Step: 5, TForward: 0.2, TBackward: 0.4, TCompute: 0.6, TSelect: 0.1, TComm: 0.9, TUpdate: 0.05, TWait: 0.05, TCommWall: 0.4, TIter: 0.7}
	for _, tc := range []struct {
		name string
		run  *Run
		want map[string][]float64 // per phase, per step
		sums bool                 // the phases add up to t_iter
	}{
		{"sequential", &Run{Steps: []Step{seq, old}}, map[string][]float64{
			phaseCompute: {0.5, 0.5}, phaseSelect: {0.1, 0.1}, phaseComm: {0.2, 0.2}, phaseOther: {0.02, 0}, phaseUpdate: {0.05, 0.05}}, true},
		// TopkDSA's messages to every peer in flight together: t_comm
		// (0.9) exceeds what t_wait leaves (0.3), which is all that shows.
		{"sequential, overlapping calls", &Run{Steps: []Step{{Step: 1, TCompute: 0.5, TSelect: 0.1, TComm: 0.9, TUpdate: 0.05, TWait: 0.4,
			TCommWall: 0.35, TIter: 0.95, TForward: nan, TBackward: nan}}}, map[string][]float64{
			phaseCompute: {0.5}, phaseSelect: {0.1}, phaseComm: {0.3}, phaseOther: {0}, phaseUpdate: {0.05}}, true},
		{"simulated", &Run{Steps: []Step{{Step: 1, TQueue: 0.7, TForward: 0.1, TBackward: 0.25, TCompute: 0.4, TSelect: 0.1, TComm: 0.2, TUpdate: 0.05,
			TWait: 0.35, TCommWall: 0.3, TIter: 1.5}}}, map[string][]float64{
			phaseQueue: {0.7}, phaseForward: {0.1}, phaseBackward: {0.3}, phaseSelect: {0.1}, phaseComm: {0.2}, phaseOther: {0.05}, phaseUpdate: {0.05}}, true},
		{"pipelined, from run.json", &Run{Info: RunInfo{Pipelined: true}, Steps: []Step{pipe, late, old}}, map[string][]float64{
			phaseCompute: {0.25, 0.6, 0.5}, phaseAlongside: {0.35, 0, 0}, phaseAfter: {0.05, 0.3, 0.3}, phaseUpdate: {0.05, 0.05, 0.05}}, true},
		{"pipelined, older record", &Run{Steps: []Step{pipe, late}}, map[string][]float64{
			phaseCompute: {0.25, 0.6}, phaseAlongside: {0.35, 0}, phaseAfter: {0.05, 0.3}, phaseUpdate: {0.05, 0.05}}, true},
		{"pipelined, forward and backward", &Run{Info: RunInfo{Pipelined: true}, Steps: []Step{split}}, map[string][]float64{
			phaseForward: {0.2}, phaseBackward: {0.05}, phaseAlongside: {0.35}, phaseAfter: {0.05}, phaseUpdate: {0.05}}, true},
	} {
		names, get := phases(tc.run)
		if len(names) != len(tc.want) {
			t.Fatalf("%s: phases %v, want %d", tc.name, names, len(tc.want))
		}
		for j := range tc.run.Steps {
			sum := 0.0
			for i, n := range names {
				w, ok := tc.want[n]
				if !ok {
					t.Fatalf("%s: unexpected phase %q", tc.name, n)
				}
				got := get[i](&tc.run.Steps[j])
				if !sameFloat(got, w[j]) && math.Abs(got-w[j]) > 1e-12 {
					t.Errorf("%s: step %d phase %s = %v, want %v", tc.name, tc.run.Steps[j].Step, n, got, w[j])
				}
				sum += got
			}
			if tc.sums && math.Abs(sum-tc.run.Steps[j].TIter) > 1e-12 {
				t.Errorf("%s: step %d: the phases add up to %v, the iteration took %v", tc.name, tc.run.Steps[j].Step, sum, tc.run.Steps[j].TIter)
			}
		}
	}
	r := &Run{Steps: []Step{seq, pipe, old}}
	var overlap *chartSpec
	for _, c := range runCharts(r, DefaultMaxPoints) {
		if c.ID == "overlap" {
			overlap = &c
		}
	}
	if overlap == nil {
		t.Fatal("no overlap chart for steps with t_comm_wall")
	}
	series := map[string][]point{}
	for _, s := range overlap.Series {
		series[s.Name] = s.Points
	}
	check := func(name string, want []point) {
		t.Helper()
		if got := series[name]; len(got) != len(want) || !slices.Equal(got, want) {
			t.Errorf("overlap series %q = %v, want %v", name, got, want)
		}
	}
	check("reduction's wall time (t_comm_wall)", []point{{1, 310}, {2, 400}})
	check("after the backward pass (t_wait)", []point{{1, 320}, {2, 50}, {4, 300}})
	check("sum of the communicator calls' durations (t_comm)", []point{{1, 200}, {2, 900}, {4, 200}})
	// A run that did not pipeline has no such chart: its t_wait is not a
	// wait for communication (one LSTM worker's error feedback and
	// selection took 30-140 ms there with nothing sent).
	for _, r := range []*Run{{Steps: []Step{old}}, {Steps: []Step{seq, old}}, {Info: RunInfo{Pipelined: true}, Steps: []Step{old}}} {
		for _, c := range runCharts(r, DefaultMaxPoints) {
			if c.ID == "overlap" {
				t.Errorf("overlap chart for a run of steps %d…: not pipelined or without t_comm_wall", r.Steps[0].Step)
			}
		}
	}
}
