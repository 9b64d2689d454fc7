package advise

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

//go:embed costprofiles/*.json
var costFiles embed.FS

// CostProfile is what this project measured on one GPU, kept as data with
// the GPU, date and revision it came from: each method's selection time on
// a gradient of Elements elements at Density on Workers workers, and the
// time of one device-to-device copy of that gradient, from which the
// update and error feedback are charged as the vectors they read and write.
type CostProfile struct {
	Name     string  `json:"name"`
	GPU      string  `json:"gpu"`
	Date     string  `json:"date"`
	Revision string  `json:"revision"`
	Source   string  `json:"source"`
	Elements int     `json:"elements"`
	Workers  int     `json:"workers"`
	Density  float64 `json:"density"`
	// Select is each measured method's selection time per call.
	Select map[string]float64 `json:"select_seconds"`
	// Copy is one copy of the gradient (a read and a write of it).
	Copy float64 `json:"copy_seconds"`
}

// The vector passes charged per element on a GPU, in copies of the
// gradient (a copy reads one vector and writes one): SGD with momentum
// reads the parameters, the gradient and the momentum and writes the
// parameters and the momentum (2.5 copies); error feedback reads the
// residual and the gradient and writes the residual (1.5 copies).
const (
	updateCopies   = 2.5
	feedbackCopies = 1.5
)

// CostProfiles lists the names of the stored cost profiles.
func CostProfiles() []string {
	ents, _ := fs.ReadDir(costFiles, "costprofiles")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".json"))
	}
	slices.Sort(out)
	return out
}

// LoadCostProfile returns the stored cost profile of that name.
func LoadCostProfile(name string) (CostProfile, error) {
	b, err := costFiles.ReadFile("costprofiles/" + name + ".json")
	if err != nil {
		return CostProfile{}, fmt.Errorf("advise: no cost profile %q; use one of %s", name, strings.Join(CostProfiles(), ", "))
	}
	var p CostProfile
	if err := json.Unmarshal(b, &p); err != nil {
		return CostProfile{}, fmt.Errorf("advise: cost profile %s: %w", name, err)
	}
	if p.Elements <= 0 || p.Workers < 1 || !(p.Copy > 0) {
		return CostProfile{}, fmt.Errorf("advise: cost profile %s lacks its elements, workers or copy time", name)
	}
	return p, nil
}

// Describe says where the profile's costs came from, for a table's header.
func (p CostProfile) Describe() string {
	return fmt.Sprintf("cost profile %s: %s, measured %s at revision %s (%s)", p.Name, p.GPU, p.Date, p.Revision, p.Source)
}

// sameSelection are the methods whose timed selection is, kernel for
// kernel, that of a method a profile may hold: one device TopK of k over
// the whole gradient (topk's), which Top-k with values and gTop-k call with
// the k values gathered beside the indices (topka.Reduce and
// gtopk.Reduce: the same ops.TopK call, its value output set). Their GPU
// selection is taken as that method's where the profile lacks their own;
// no other method's is derived (their selections are other kernels or
// schedules: CLT-k selects on one leader a round, Top-k DSA and Ok-Topk add
// their own passes).
var sameSelection = map[string]string{"topka": "topk", "gtopk": "topk"}

// ApplyCostProfile replaces the costs h measured on this machine's CPU by
// the profile's GPU costs, scaled per element to h's gradient: each
// method's selection (the profile's, or that of the method whose kernel
// it calls, sameSelection; methods neither covers lose theirs, and are
// then not predicted: their GPU cost is unknown), the update and error
// feedback. The selection's Other (decoding, the residual) is dropped with
// the CPU's times: the profile's t_select covers the selection only, and
// its error feedback charges the residual. h.CostDetail says where each
// cost came from.
func (h *Host) ApplyCostProfile(p CostProfile) {
	scale := float64(h.Layout.N) / float64(p.Elements)
	var sel []Selection
	var own, derived, unknown []string
	for _, s := range h.Selections {
		t, ok := p.Select[s.Method]
		switch {
		case ok:
			own = append(own, s.Method)
		case p.Select[sameSelection[s.Method]] > 0:
			t = p.Select[sameSelection[s.Method]]
			derived = append(derived, fmt.Sprintf("%s as %s's (the same TopK kernel)", s.Method, sameSelection[s.Method]))
		default:
			unknown = append(unknown, s.Method)
			continue
		}
		sel = append(sel, Selection{Method: s.Method, Density: s.Density, Workers: p.Workers, Seconds: t * scale})
	}
	h.Selections = sel
	h.NormPass = p.Copy * scale / 2 // one read of the gradient
	h.Update = updateCopies * p.Copy * scale
	h.Other = feedbackCopies * p.Copy * scale
	h.CostSource, h.CostProfile = p.Describe(), p.Name
	d := fmt.Sprintf("selection: the profile's t_select at %d workers, scaled per element from %d to %d parameters, for %s",
		p.Workers, p.Elements, h.Layout.N, strings.Join(uniq(own), ", "))
	if len(derived) > 0 {
		d += "; " + strings.Join(uniq(derived), ", ")
	}
	if len(unknown) > 0 {
		d += "; GPU cost unknown (not ranked): " + strings.Join(uniq(unknown), ", ")
	}
	d += fmt.Sprintf("; update and error feedback: estimated, not measured, as %g and %g copies of the gradient at the profile's measured copy time (%s per copy here): SGD with momentum reads 3 vectors and writes 2, error feedback reads 2 and writes 1", updateCopies, feedbackCopies, FormatSeconds(p.Copy*scale))
	h.CostDetail = d
}

// uniq returns the distinct strings of v, in their first order.
func uniq(v []string) []string {
	var out []string
	for _, s := range v {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// MixesDevices says why h's costs cannot be added up, or "": its step time
// stands for a GPU (given with -step-time, or recorded on a GPU) while
// selection, the update and error feedback were measured on this machine's
// CPU and no GPU cost profile replaced them.
func (h *Host) MixesDevices() string {
	if h.CostSource != "" || strings.HasPrefix(h.Device, "cuda") {
		return ""
	}
	gpu := ""
	switch {
	case h.StepSource == "given":
		gpu = "the step time given with -step-time stands for a GPU"
	case h.StepSource == "recorded" && strings.HasPrefix(h.StepDevice, "cuda"):
		gpu = "the recording's step time was measured on " + h.StepDevice
	default:
		return ""
	}
	return fmt.Sprintf("%s, but selection, the update and error feedback were measured here on %s: pass -cost-profile %s (costs this project measured on a GPU) or run on a machine with a GPU with -device cuda", gpu, h.Device, strings.Join(CostProfiles(), "|"))
}
