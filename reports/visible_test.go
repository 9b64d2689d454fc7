package reports

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// equalRun is a run whose series coincide: actual density = setup density
// (DEFT at its budget), bytes sent = received (an all-reduce), and a
// pipelined reduction entirely after the backward pass (t_comm_wall =
// t_wait).
func equalRun() *Run {
	r := &Run{Info: RunInfo{Pipelined: true, Workers: 4, Backend: "local"}}
	r.Info.Config.Density = 0.01
	for i := 1; i <= 30; i++ {
		r.Steps = append(r.Steps, Step{Step: i, Density: 0.01, ActualDensity: 0.01, BytesSent: 4000, BytesRecv: 4000,
			TForward: math.NaN(), TBackward: math.NaN(), TCompute: 0.02, TWait: 0.004, TCommWall: 0.004, TComm: 0.006,
			TUpdate: 0.001, TIter: 0.025, Loss: 1, ErrorNorm: 1, Threshold: math.NaN()})
	}
	return r
}

// TestNoSeriesHidesAnother: where two lines of a chart coincide, the one
// drawn later (on top) is dashed, so that both stay visible: the setup
// density under the actual one, bytes sent under received, t_comm_wall
// under t_wait (each was hidden behind the other).
func TestNoSeriesHidesAnother(t *testing.T) {
	runs := []*Run{equalRun()}
	for _, n := range []string{"deft-4w", "lags-4w", "micro-4w", "ncf-xss", "lstm-topk"} {
		runs = append(runs, mustRead(t, td(n)))
	}
	checked := map[string]bool{}
	for _, r := range runs {
		for _, c := range runCharts(r, DefaultMaxPoints) {
			for j, b := range c.Series {
				for _, a := range c.Series[:j] {
					if a.Bar || b.Bar || len(a.Points) == 0 || !slices.Equal(a.Points, b.Points) {
						continue
					}
					checked[c.ID] = true
					if !b.Dashed {
						t.Errorf("%s: chart %s: %q hides %q (the same values, drawn on top, solid)", r.Dir, c.ID, b.Name, a.Name)
					}
				}
			}
		}
	}
	for _, id := range []string{"density", "bytes", "overlap"} {
		if !checked[id] {
			t.Errorf("chart %s had no coinciding lines to check", id)
		}
	}
	// Compared runs with the same values (in-process and mpirun workers
	// compute the same losses): each later line is thinner than the one it
	// covers.
	a, b := mustRead(t, td("deft-4w")), mustRead(t, td("deft-4w"))
	a.Info.Backend, b.Info.Backend = "local", "mpi"
	labels := runLabels([]*Run{a, b}, differing([]*Run{a, b}))
	n := 0
	for _, c := range compareCharts([]*Run{a, b}, labels, false, DefaultMaxPoints) {
		for j, y := range c.Series {
			for _, x := range c.Series[:j] {
				if x.Bar || y.Bar || len(x.Points) == 0 || !slices.Equal(x.Points, y.Points) {
					continue
				}
				n++
				if !y.Dashed && !(y.Width < x.Width) {
					t.Errorf("comparison chart %s: %q (width %v) hides %q (width %v)", c.ID, y.Name, y.Width, x.Name, x.Width)
				}
			}
		}
	}
	if n < 4 {
		t.Errorf("only %d coinciding lines in the comparison of two equal runs", n)
	}
}

// TestDensityRatioShown: a run's report gives its actual density over the
// setup density, in the header and as a chart per iteration.
func TestDensityRatioShown(t *testing.T) {
	r := mustRead(t, td("deft-4w"))
	var row string
	for _, rw := range runTable(r).Rows {
		if rw[0] == "mean actual density" {
			row = rw[1]
		}
	}
	sum := 0.0
	for _, s := range r.Steps {
		sum += s.ActualDensity / r.Info.Config.Density
	}
	want := fmtRatio(sum / float64(len(r.Steps)))
	if !strings.Contains(row, want+" the setup density") {
		t.Errorf("header: mean actual density %q, want it to say %s the setup density", row, want)
	}
	var ratio *chartSpec
	for _, c := range runCharts(r, DefaultMaxPoints) {
		if c.ID == "density-ratio" {
			ratio = &c
		}
	}
	if ratio == nil {
		t.Fatal("no density-ratio chart")
	}
	for i, p := range ratio.Series[0].Points {
		s := r.Steps[i]
		if math.Abs(p.Y-s.ActualDensity/s.Density) > 1e-12 || p.X != float64(s.Step) {
			t.Fatalf("ratio point %v, want step %d at %v", p, s.Step, s.ActualDensity/s.Density)
		}
	}
}

// TestCompareSaysBackend: runs that differ only in where their workers ran
// (in-process against mpirun) are told apart by it, and the page says
// their times are not comparable.
func TestCompareSaysBackend(t *testing.T) {
	a, b := mustRead(t, td("deft-4w")), mustRead(t, td("deft-4w"))
	a.Info.Backend, b.Info.Backend = "local", "mpi"
	diff := differing([]*Run{a, b})
	if !slices.Equal(diff, []string{"backend"}) {
		t.Fatalf("differing %v, want [backend]", diff)
	}
	labels := runLabels([]*Run{a, b}, diff)
	if labels[0] != "backend=in-process" || labels[1] != "backend=mpirun" {
		t.Errorf("labels %v", labels)
	}
	page, err := ComparePage(t.Context(), []*Run{a, b}, Options{AssetsURL: "echarts.min.js"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"runs differ in: backend", "The runs differ in backend", "not comparable", "<td>mpirun</td>"} {
		if !strings.Contains(string(page), w) {
			t.Errorf("the comparison page lacks %q", w)
		}
	}
}
