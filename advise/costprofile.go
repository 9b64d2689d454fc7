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

// ApplyCostProfile replaces the costs h measured on this machine's CPU by
// the profile's GPU costs, scaled per element to h's gradient: each
// method's selection (methods the profile did not measure lose theirs, and
// are then not predicted), the update and error feedback. The selection's
// Other (decoding, the residual) is dropped with the CPU's times: the
// profile's t_select covers the selection only, and its error feedback
// charges the residual.
func (h *Host) ApplyCostProfile(p CostProfile) {
	scale := float64(h.Layout.N) / float64(p.Elements)
	var sel []Selection
	for _, s := range h.Selections {
		t, ok := p.Select[s.Method]
		if !ok {
			continue
		}
		sel = append(sel, Selection{Method: s.Method, Density: s.Density, Workers: p.Workers, Seconds: t * scale})
	}
	h.Selections = sel
	h.NormPass = p.Copy * scale / 2 // one read of the gradient
	h.Update = updateCopies * p.Copy * scale
	h.Other = feedbackCopies * p.Copy * scale
	h.CostSource, h.CostProfile = p.Describe(), p.Name
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
