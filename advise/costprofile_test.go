package advise

import (
	"math"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/layout"
)

// TestCostProfile: the stored H200 profile loads with its GPU, date and
// revision; applied to a host it scales each measured method's selection
// per element to the host's gradient, drops the methods it did not
// measure, charges the update and error feedback as copies of the
// gradient, and lifts the refusal to mix a GPU's step time with CPU costs.
func TestCostProfile(t *testing.T) {
	p, err := LoadCostProfile("h200")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.GPU, "H200") || p.Date == "" || p.Revision == "" || len(p.Select) == 0 {
		t.Fatalf("profile %+v", p)
	}
	if _, err := LoadCostProfile("a100"); err == nil || !strings.Contains(err.Error(), "h200") {
		t.Errorf("unknown profile: %v", err)
	}
	lay, err := layout.New([]string{"a", "b"}, []int{p.Elements / 4, p.Elements/2 - p.Elements/4})
	if err != nil {
		t.Fatal(err)
	}
	h := &Host{Layout: lay, Device: "cpu", StepSource: "given", Compute: 0.085, Update: 0.02, Other: 0.01,
		Unions: []Union{{Density: 0.01, TopK: []float64{0.01, 0.02}, Threshold: []float64{0.01, 0.02}}},
		Selections: []Selection{{Method: "topk", Density: 0.01, Workers: 2, Seconds: 0.06}, {Method: "randomk", Density: 0.01, Workers: 2, Seconds: 0.001},
			{Method: "topka", Density: 0.01, Workers: 2, Seconds: 0.07}}}
	if why := h.MixesDevices(); !strings.Contains(why, "-cost-profile h200") {
		t.Errorf("a given step time with CPU costs: %q", why)
	}
	h.ApplyCostProfile(p)
	if why := h.MixesDevices(); why != "" {
		t.Errorf("after the profile: %q", why)
	}
	scale := float64(lay.N) / float64(p.Elements)
	// topka calls topk's kernel: its GPU selection is topk's, and the
	// header says so; randomk's is unknown.
	if len(h.Selections) != 2 || h.Selections[0].Method != "topk" || math.Abs(h.Selections[0].Seconds-p.Select["topk"]*scale) > 1e-15 ||
		h.Selections[1].Method != "topka" || h.Selections[1].Seconds != h.Selections[0].Seconds {
		t.Errorf("selections %+v, want topk's and topka's %v × %v", h.Selections, p.Select["topk"], scale)
	}
	for _, want := range []string{"topka as topk's", "GPU cost unknown (not ranked): randomk", "estimated"} {
		if !strings.Contains(h.CostDetail, want) {
			t.Errorf("cost detail %q does not say %q", h.CostDetail, want)
		}
	}
	var tab strings.Builder
	if err := WriteTable(&tab, h, Setting{Workers: 4, Density: 0.01}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tab.String(), h.CostDetail) || !strings.Contains(tab.String(), p.Revision) {
		t.Errorf("the table's header does not state each cost's source:\n%s", tab.String())
	}
	if math.Abs(h.Update-2.5*p.Copy*scale) > 1e-15 || math.Abs(h.Other-1.5*p.Copy*scale) > 1e-15 || !strings.Contains(h.CostSource, p.Revision) {
		t.Errorf("update %v, other %v, source %q", h.Update, h.Other, h.CostSource)
	}
	if _, err := Predict(h, Setting{Method: "randomk", Workers: 4, Density: 0.01}); err == nil || !strings.Contains(err.Error(), "GPU cost unknown") || !strings.Contains(err.Error(), "-device cuda") {
		t.Errorf("a method the profile lacks: %v", err)
	}
	// A recording made on a GPU refuses CPU costs too; one made on a CPU
	// does not.
	r := &Host{Device: "cpu", StepSource: "recorded", StepDevice: "cuda:0 (NVIDIA H100)"}
	if r.MixesDevices() == "" {
		t.Error("a GPU recording's step with CPU costs is not refused")
	}
	r.StepDevice = "cpu"
	if r.MixesDevices() != "" {
		t.Error("a CPU recording's step with CPU costs is refused")
	}
}
