package reports

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/sparsify"
)

// TestNewMethodNeedsNoReportChange: what the reports say of a method comes
// from its registry entry, so a method registered in a test is drawn or
// left out of the projection chart, with its own reason, and its header
// lists the pipeline option exactly when it declares itself pipelined,
// without any change to package reports. The run is the recorded LAGS run
// relabelled with the new methods' names.
func TestNewMethodNeedsNoReportChange(t *testing.T) {
	const why = "zz-rounds: its number of rounds grows with the worker count"
	// The reports read the declarations only: the methods are never run.
	lags := func(*sparsify.Env) (sparsify.Core, error) { return nil, errors.New("not run") }
	for _, m := range []sparsify.Method{
		{Name: "zz-grouped", Projectable: true, Pipelined: true, New: lags},
		{Name: "zz-rounds", NotProjectable: why, New: lags},
	} {
		if _, ok := sparsify.Lookup(m.Name); !ok {
			sparsify.Register(m)
		}
	}
	for _, tc := range []struct {
		method    string
		projected bool
		pipeline  bool
	}{{"zz-grouped", true, true}, {"zz-rounds", false, false}, {"lags", true, true}, {"topk", false, false}} {
		r := mustRead(t, td("lags-4w"))
		r.Info.Config.Sparsifier = tc.method
		r.Config["sparsifier"] = tc.method
		drawn := false
		for _, c := range runCharts(r, DefaultMaxPoints) {
			drawn = drawn || c.ID == "projection"
		}
		if drawn != tc.projected {
			t.Errorf("%s: projection chart drawn: %v, want %v", tc.method, drawn, tc.projected)
		}
		page, err := RunPage(context.Background(), r, offline)
		if err != nil {
			t.Fatal(err)
		}
		if tc.method == "zz-rounds" && !strings.Contains(string(page), why) {
			t.Errorf("%s: the page does not give the method's reason it is not projected (%q)", tc.method, why)
		}
		var opts string
		for _, row := range runTable(r).Rows {
			if row[0] == "method options" {
				opts = row[1]
			}
		}
		if strings.Contains(opts, "overlap=on") != tc.pipeline {
			t.Errorf("%s: method options %q, want overlap=on listed: %v", tc.method, opts, tc.pipeline)
		}
	}
}
