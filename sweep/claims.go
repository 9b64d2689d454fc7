package sweep

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/sparsegrad/sparsegrad/reports"
)

// A Claim is a statement of a preset's paper that its sweep tests, with the
// rule that tells whether the sweep's runs show it. A preset's page and the
// sweep's last lines state each claim and the verdict on this sweep, so that
// a description never says more than the runs measured.
type Claim struct {
	// Paper is the paper's statement, as this sweep can test it.
	Paper string
	// Check judges the runs.
	Check func(rs Results) Verdict
}

// Verdict is what a sweep's runs say of a Claim.
type Verdict struct {
	// Shown tells that the runs show the claim; Undecided that they cannot
	// tell (a point it needs did not run).
	Shown, Undecided bool
	// Detail gives the numbers the verdict rests on.
	Detail string
}

// String writes the verdict as the page and the terminal show it.
func (v Verdict) String() string {
	switch {
	case v.Undecided:
		return "undecided: " + v.Detail
	case v.Shown:
		return "shown: " + v.Detail
	}
	return "not shown: " + v.Detail
}

// Judge applies every claim to the runs and returns the lines the page and
// the terminal show, one per claim: the paper's statement and this sweep's
// verdict.
func Judge(claims []Claim, rs Results) []string {
	var out []string
	for _, c := range claims {
		out = append(out, "The paper's claim: "+c.Paper+" This sweep: "+c.Check(rs).String()+".")
	}
	return out
}

// Results are a sweep's completed runs, by grid point.
type Results struct {
	Points []Point
	Runs   []*reports.Run // Runs[i] is Points[i]'s run (nil: none)
}

// run returns the run of method at w workers (the first network's), or
// nil.
func (rs Results) run(method string, w int) *reports.Run {
	for i, p := range rs.Points {
		if p.Method == method && p.Workers == w && rs.Runs[i] != nil {
			return rs.Runs[i]
		}
	}
	return nil
}

// workers are the worker counts method ran at, ascending.
func (rs Results) workers(method string) []int {
	var ws []int
	for i, p := range rs.Points {
		if p.Method == method && rs.Runs[i] != nil && !slices.Contains(ws, p.Workers) {
			ws = append(ws, p.Workers)
		}
	}
	slices.Sort(ws)
	return ws
}

// density is the setup density of method's runs (that of the first).
func (rs Results) density(method string) float64 {
	for i, p := range rs.Points {
		if p.Method == method && rs.Runs[i] != nil {
			return p.Density
		}
	}
	return math.NaN()
}

// claimSkip is the number of logged iterations at the start of a run that
// the medians of the claims leave out (start-up: first allocations, caches),
// as the sweep page's figures do.
const claimSkip = 5

// median is the median of f over the run's logged iterations after the
// first claimSkip (all of them when there are fewer), NaN and infinite
// values left out.
func median(r *reports.Run, f func(*reports.Step) float64) float64 {
	steps := r.Steps
	if len(steps) > claimSkip {
		steps = steps[claimSkip:]
	}
	return reports.MedianOf(steps, f)
}

// tail is the mean of f over the last fraction of the run's logged
// iterations (at least one), NaN values left out: where a controller has
// settled.
func tail(r *reports.Run, fraction float64, f func(*reports.Step) float64) float64 {
	n := max(1, int(math.Ceil(fraction*float64(len(r.Steps)))))
	var s float64
	k := 0
	for i := max(0, len(r.Steps)-n); i < len(r.Steps); i++ {
		if x := f(&r.Steps[i]); !math.IsNaN(x) {
			s += x
			k++
		}
	}
	if k == 0 {
		return math.NaN()
	}
	return s / float64(k)
}

func tIter(s *reports.Step) float64   { return s.TIter }
func tSelect(s *reports.Step) float64 { return s.TSelect }
func density(s *reports.Step) float64 { return s.ActualDensity }
func sent(s *reports.Step) float64    { return s.BytesSent }

// ms writes seconds as milliseconds.
func ms(s float64) string { return strconv.FormatFloat(s*1e3, 'f', 2, 64) + " ms" }

// g writes a number with 3 significant digits.
func g(x float64) string { return strconv.FormatFloat(x, 'g', 3, 64) }

// undecided is the verdict of a claim whose runs are missing.
func undecided(format string, a ...any) Verdict {
	return Verdict{Undecided: true, Detail: fmt.Sprintf(format, a...)}
}

// lowest is a claim that method's median of f is below every other
// method's of the list at each worker count where both ran (what names f in
// the detail), or only at the largest worker count method ran at (atMax).
func lowest(method string, others []string, f func(*reports.Step) float64, what string, atMax bool) func(Results) Verdict {
	return func(rs Results) Verdict {
		ws := rs.workers(method)
		if len(ws) == 0 {
			return undecided("%s did not run", method)
		}
		if atMax {
			ws = ws[len(ws)-1:]
		}
		shown, compared := true, 0
		var parts []string
		for _, w := range ws {
			m := median(rs.run(method, w), f)
			part := fmt.Sprintf("%d workers: %s %s", w, method, ms(m))
			for _, o := range others {
				r := rs.run(o, w)
				if r == nil {
					continue
				}
				x := median(r, f)
				compared++
				part += fmt.Sprintf(", %s %s", o, ms(x))
				if !(m < x) {
					shown = false
				}
			}
			parts = append(parts, part)
		}
		if compared == 0 {
			return undecided("none of %s ran beside %s", strings.Join(others, ", "), method)
		}
		return Verdict{Shown: shown, Detail: "median " + what + " per iteration, " + strings.Join(parts, "; ")}
	}
}

// scales is a claim on how method's f (its mean over the second half of
// each run) changes from the smallest worker count to the largest: it
// grows at least factor times (up), or grows at most factor times (!up).
func scales(method string, f func(*reports.Step) float64, what string, up bool, factor float64) func(Results) Verdict {
	return func(rs Results) Verdict {
		ws := rs.workers(method)
		if len(ws) < 2 {
			return undecided("%s ran at fewer than two worker counts", method)
		}
		lo, hi := tail(rs.run(method, ws[0]), 0.5, f), tail(rs.run(method, ws[len(ws)-1]), 0.5, f)
		shown, need := hi >= factor*lo, "at least "
		if !up {
			shown, need = hi <= factor*lo, "at most "
		}
		return Verdict{Shown: shown, Detail: fmt.Sprintf("%s's %s %s at %d workers, %s at %d (%s×; the claim needs %s%s×)",
			method, what, g(lo), ws[0], g(hi), ws[len(ws)-1], g(hi/lo), need, g(factor))}
	}
}

// falls is a claim that each method's median of f at the largest worker
// count is below that at the smallest.
func falls(methods []string, f func(*reports.Step) float64, what string) func(Results) Verdict {
	return func(rs Results) Verdict {
		shown := true
		var parts []string
		for _, m := range methods {
			ws := rs.workers(m)
			if len(ws) < 2 {
				return undecided("%s ran at fewer than two worker counts", m)
			}
			lo, hi := median(rs.run(m, ws[0]), f), median(rs.run(m, ws[len(ws)-1]), f)
			parts = append(parts, fmt.Sprintf("%s %s at %d workers, %s at %d", m, ms(lo), ws[0], ms(hi), ws[len(ws)-1]))
			if !(hi < lo) {
				shown = false
			}
		}
		return Verdict{Shown: shown, Detail: "median " + what + ": " + strings.Join(parts, "; ")}
	}
}

// nearSetup is a claim that each method's actual density, averaged over
// the last fraction of each run, lies within [lo, hi] × its setup density ρ
// at every worker count.
func nearSetup(methods []string, fraction, lo, hi float64) func(Results) Verdict {
	return func(rs Results) Verdict {
		shown := true
		var parts []string
		for _, m := range methods {
			ws := rs.workers(m)
			if len(ws) == 0 {
				return undecided("%s did not run", m)
			}
			rho := rs.density(m)
			var rs2 []string
			for _, w := range ws {
				x := tail(rs.run(m, w), fraction, density) / rho
				rs2 = append(rs2, g(x)+"ρ at "+strconv.Itoa(w))
				if !(x >= lo && x <= hi) {
					shown = false
				}
			}
			parts = append(parts, m+" "+strings.Join(rs2, ", "))
		}
		return Verdict{Shown: shown, Detail: fmt.Sprintf("actual density over the last %.0f%% of each run (the claim needs %s–%sρ): %s",
			fraction*100, g(lo), g(hi), strings.Join(parts, "; "))}
	}
}

// hides is a claim that most of method's reduction overlaps the backward
// pass: the median share (t_comm_wall − t_wait)/t_comm_wall is above one
// half at every worker count.
func hides(method string) func(Results) Verdict {
	return func(rs Results) Verdict {
		ws := rs.workers(method)
		if len(ws) == 0 {
			return undecided("%s did not run", method)
		}
		shown := true
		var parts []string
		for _, w := range ws {
			h := median(rs.run(method, w), func(s *reports.Step) float64 {
				if !(s.TCommWall > 0) {
					return math.NaN()
				}
				return max(0, s.TCommWall-s.TWait) / s.TCommWall
			})
			parts = append(parts, fmt.Sprintf("%.0f%% at %d workers", h*100, w))
			if !(h > 0.5) {
				shown = false
			}
		}
		return Verdict{Shown: shown, Detail: "median share of " + method + "'s reduction that ran during the backward pass: " + strings.Join(parts, ", ")}
	}
}
