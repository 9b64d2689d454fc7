package sparsify

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// TestEveryMethodAdvises: each registered method declares what the advisor
// asks about it (Method.Advice: its traffic, its volume, how its selection
// scales), so that the advisor never needs the method's name; a method
// that lacks a field fails with its name and the field's. Each declaration
// is then evaluated on awkward shapes (1, 2, 3, 5 and 16 workers, k = 1,
// the whole gradient) and must give finite, non-negative counts: at most N
// elements selected and sent, calls of at least 0 elements.
func TestEveryMethodAdvises(t *testing.T) {
	for _, m := range Methods() {
		if miss := m.Advice.Missing(); len(miss) > 0 {
			t.Errorf("%s does not declare %s (the advisor's facts, beside its reducer)", m.Name, strings.Join(miss, ", "))
			continue
		}
		params, err := m.Resolve(nil)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		sizes := []int{1000, 37, 2500, 130, 7, 1}
		N := 3675
		for _, P := range []int{1, 2, 3, 5, 16} {
			if m.CheckWorkers != nil && m.CheckWorkers(P, params) != nil {
				continue
			}
			for _, rho := range []float64{1e-6, 0.05, 1} {
				s := Shape{Sizes: sizes, N: N, P: P, Density: rho, K: BudgetK(rho, N), Params: params}
				indep := func(sel float64) float64 { return float64(N) * (1 - math.Pow(1-min(sel/float64(N), 1), float64(P))) }
				above := min(2*rho, 1) * float64(N) // λ selecting twice ρ
				s.Sel, s.Union = m.Advice.Volume(s, Overlap{TopK: indep, Above: func() (float64, float64) { return above, indep(above) }})
				name := fmt.Sprintf("%s P=%d ρ=%g", m.Name, P, rho)
				if !(s.Sel >= 0 && s.Sel <= float64(N)) || !(s.Union >= 0 && s.Union <= float64(N)) {
					t.Errorf("%s: Volume gives %v selected, %v sent, want both in [0, %d]", name, s.Sel, s.Union, N)
				}
				calls, err := m.Advice.Plan(s)
				if err != nil {
					t.Errorf("%s: Plan: %v", name, err)
				}
				for _, c := range calls {
					if !(c.Count >= 0 && c.Elems >= 0) || math.IsInf(c.Count, 0) || math.IsInf(c.Elems, 0) {
						t.Errorf("%s: Plan's call %+v", name, c)
					}
				}
				if m.Advice.Caveats != nil {
					for _, c := range m.Advice.Caveats(Conditions{Shape: s, GradWorkers: 4, GradStep: 3}) {
						if c == "" {
							t.Errorf("%s: an empty caveat", name)
						}
					}
				}
			}
		}
	}
}

// TestAdviceMissingNamesTheField makes sure the check above can fail: each
// field left out is named.
func TestAdviceMissingNamesTheField(t *testing.T) {
	full := *topkAdvice
	for _, tc := range []struct {
		edit func(*Advice)
		want string
	}{
		{func(a *Advice) { a.Plan = nil }, "Advice.Plan"},
		{func(a *Advice) { a.Volume = nil }, "Advice.Volume"},
		{func(a *Advice) { a.Selection = 0 }, "Advice.Selection"},
		{func(a *Advice) { a.Selection = NormsThenShare + 1 }, "Advice.Selection"},
		{func(a *Advice) { a.Period = -1 }, "Advice.Period"},
		{func(a *Advice) { a.Evidence.Papers = "" }, "Advice.Evidence.Papers"},
		{func(a *Advice) { a.Evidence.Shown = []ModelKind{CNN, Recommender, "cnns"} }, `Advice.Evidence.Shown ("cnns"`},
		{func(a *Advice) { a.Evidence.At = []ShownAt{{Kind: MLP, Density: 0.1}} }, "Advice.Evidence.At"},
		{func(a *Advice) { a.Evidence.At = []ShownAt{{Kind: Recommender, Density: 0}} }, "Advice.Evidence.At"},
	} {
		a := full
		tc.edit(&a)
		if miss := a.Missing(); len(miss) != 1 || !strings.HasPrefix(miss[0], tc.want) {
			t.Errorf("Missing() = %q, want %s", miss, tc.want)
		}
	}
	if miss := (*Advice)(nil).Missing(); !slices.Equal(miss, []string{"Advice"}) {
		t.Errorf("no Advice: Missing() = %q", miss)
	}
	if miss := full.Missing(); len(miss) > 0 {
		t.Errorf("topk's Advice: Missing() = %q", miss)
	}
}

// TestPipelinedMethodsReduceGroups: a method declares Pipelined exactly
// when its reducer reduces layer groups on its device (DeviceGroupReducer,
// what a trainer's pipeline needs), so the trainer, the reports and the
// advisor can rely on the declaration.
func TestPipelinedMethodsReduceGroups(t *testing.T) {
	l, err := NewLayout([]string{"a", "b", "c"}, []int{300, 20, 500})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range Methods() {
		r, err := New(m.Name, Options{Density: 0.1, Layout: l, Comm: blSingleComm(t)})
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if _, groups := r.core.(Grouped); groups != m.Pipelined {
			t.Errorf("%s: Pipelined = %v, but its core reduces groups: %v", m.Name, m.Pipelined, groups)
		}
	}
}
