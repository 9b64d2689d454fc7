package sweep

import (
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/reports"
)

// synth is a run of n logged steps, step i's fields set by f.
func synth(n int, f func(i int, s *reports.Step)) *reports.Run {
	r := &reports.Run{Steps: make([]reports.Step, n)}
	for i := range r.Steps {
		f(i, &r.Steps[i])
	}
	return r
}

// results puts runs at (method, workers, density) points.
func results(pts ...struct {
	m string
	w int
	d float64
	r *reports.Run
}) Results {
	var rs Results
	for _, p := range pts {
		rs.Points = append(rs.Points, Point{Method: p.m, Workers: p.w, Density: p.d})
		rs.Runs = append(rs.Runs, p.r)
	}
	return rs
}

type pt = struct {
	m string
	w int
	d float64
	r *reports.Run
}

func iterRun(t float64) *reports.Run {
	return synth(20, func(i int, s *reports.Step) { s.TIter, s.TSelect = t, t/10 })
}

func densRun(d float64) *reports.Run {
	return synth(20, func(i int, s *reports.Step) { s.ActualDensity, s.BytesSent = d, d*1e6 })
}

// TestClaimRules checks each rule both ways on synthetic runs: a claim must
// be able to fail, and be undecided when its runs are missing.
func TestClaimRules(t *testing.T) {
	cases := []struct {
		name  string
		check func(Results) Verdict
		rs    Results
		shown bool
		undec bool
	}{
		{"lowest holds", lowest("a", []string{"b", "c"}, tIter, "time", false),
			results(pt{"a", 2, .01, iterRun(1)}, pt{"b", 2, .01, iterRun(2)}, pt{"c", 2, .01, iterRun(3)}), true, false},
		{"lowest fails", lowest("a", []string{"b", "c"}, tIter, "time", false),
			results(pt{"a", 2, .01, iterRun(2.5)}, pt{"b", 2, .01, iterRun(2)}, pt{"c", 2, .01, iterRun(3)}), false, false},
		{"lowest at max only", lowest("a", []string{"b"}, tIter, "time", true),
			results(pt{"a", 2, .01, iterRun(5)}, pt{"b", 2, .01, iterRun(2)}, pt{"a", 4, .01, iterRun(1)}, pt{"b", 4, .01, iterRun(2)}), true, false},
		{"lowest without rivals", lowest("a", []string{"b"}, tIter, "time", false),
			results(pt{"a", 2, .01, iterRun(1)}), false, true},
		{"scales up holds", scales("a", density, "density", true, 1.5),
			results(pt{"a", 2, .01, densRun(.01)}, pt{"a", 16, .01, densRun(.03)}), true, false},
		{"scales up fails", scales("a", density, "density", true, 1.5),
			results(pt{"a", 2, .01, densRun(.01)}, pt{"a", 16, .01, densRun(.012)}), false, false},
		{"scales bounded fails", scales("a", sent, "bytes", false, 2),
			results(pt{"a", 2, .01, densRun(.01)}, pt{"a", 16, .01, densRun(.03)}), false, false},
		{"scales one count", scales("a", sent, "bytes", false, 2), results(pt{"a", 2, .01, densRun(.01)}), false, true},
		{"falls holds", falls([]string{"a"}, tSelect, "selection"),
			results(pt{"a", 2, .01, iterRun(2)}, pt{"a", 8, .01, iterRun(1)}), true, false},
		{"falls fails", falls([]string{"a"}, tSelect, "selection"),
			results(pt{"a", 2, .01, iterRun(1)}, pt{"a", 8, .01, iterRun(1)}), false, false},
		{"near setup holds", nearSetup([]string{"a"}, .5, .5, 1.1),
			results(pt{"a", 2, .01, densRun(.0105)}, pt{"a", 4, .01, densRun(.009)}), true, false},
		{"near setup fails", nearSetup([]string{"a"}, .5, .5, 1.1),
			results(pt{"a", 2, .01, densRun(.0105)}, pt{"a", 4, .01, densRun(.02)}), false, false},
		{"near setup settles late", nearSetup([]string{"a"}, .25, .5, 2),
			results(pt{"a", 2, .01, synth(40, func(i int, s *reports.Step) {
				s.ActualDensity = .01
				if i < 20 {
					s.ActualDensity = .5 // far above ρ before the controller settles
				}
			})}), true, false},
		{"hides holds", hides("a"),
			results(pt{"a", 4, .01, synth(20, func(i int, s *reports.Step) { s.TCommWall, s.TWait = 1, .2 })}), true, false},
		{"hides fails", hides("a"),
			results(pt{"a", 4, .01, synth(20, func(i int, s *reports.Step) { s.TCommWall, s.TWait = 1, .8 })}), false, false},
	}
	for _, c := range cases {
		v := c.check(c.rs)
		if v.Shown != c.shown || v.Undecided != c.undec || v.Detail == "" {
			t.Errorf("%s: verdict %+v, want shown %v undecided %v with a detail", c.name, v, c.shown, c.undec)
		}
	}
}

// TestPresetClaimsNameTheirGrid: every preset states at least one claim of
// its paper, and every claim is decided on runs of the preset's whole grid
// (a claim naming a method outside the grid would stay undecided forever).
func TestPresetClaimsNameTheirGrid(t *testing.T) {
	for _, name := range PresetNames() {
		p := Presets[name]
		if len(p.Claims) == 0 {
			t.Errorf("%s: no claim of its paper", name)
		}
		pts, _, err := p.Spec.Points()
		if err != nil {
			t.Fatal(err)
		}
		rs := Results{Points: pts}
		for range pts {
			rs.Runs = append(rs.Runs, synth(20, func(i int, s *reports.Step) {
				s.TIter, s.TSelect, s.ActualDensity, s.BytesSent, s.TCommWall, s.TWait = 1, .1, .01, 1e6, 1, .5
			}))
		}
		for _, line := range Judge(p.Claims, rs) {
			if strings.Contains(line, "undecided") || !strings.HasPrefix(line, "The paper's claim: ") {
				t.Errorf("%s: %s", name, line)
			}
		}
	}
}
