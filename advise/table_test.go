package advise

import (
	"bytes"
	"strings"
	"testing"
)

// TestWriteTableDensityRatio reads the actual-density column: the ratio to
// ρ keeps two significant digits when the method sends less than ρ (the
// hard threshold's 0.027× read "0.0× ρ"), one decimal from 1× up and none
// from 10× up.
func TestWriteTableDensityRatio(t *testing.T) {
	h := synthHost()
	ranked := []Prediction{
		{Method: "threshold", Density: 0.01, ActualDensity: 0.000269, Iter: 0.1, Speedup: 1.2},
		{Method: "topk", Density: 0.01, ActualDensity: 0.0954, Iter: 0.11, Speedup: 1.1},
		{Method: "deft", Density: 0.01, ActualDensity: 0.00999, Iter: 0.115, Speedup: 1.05},
		{Method: "dragonn", Density: 0.01, ActualDensity: 1, Iter: 0.12, Speedup: 1.01},
		{Method: "dense", Density: 0.01, ActualDensity: 1, Iter: 0.121, Speedup: 1},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, h, Setting{Workers: 16, Density: 0.01}, ranked, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"0.000269 (0.027× ρ)", "0.0954 (9.5× ρ)", "0.00999 (1.0× ρ)", "1 (100× ρ)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestWriteTableEpoch: the header compares the horizon with one epoch of
// the model at the table's worker count (one worker's epoch over P,
// rounded up), and says plainly when the horizon is shorter.
func TestWriteTableEpoch(t *testing.T) {
	for _, c := range []struct {
		epoch, horizon, P int
		want              string
	}{
		{391, 3, 16, "SHORTER than one epoch at 16 workers, 25 steps"},
		{391, 3, 1, "pass -steps 391 for the epoch"},
		{391, 25, 16, "at least one epoch at 16 workers, 25 steps"},
		{5, 3, 2, "at least one epoch at 2 workers, 3 steps"},
		{0, 3, 16, "over a horizon of 3 steps on"},
		{0, 3, 16, "runs only until it has settled"},
	} {
		h := synthHost()
		h.EpochSteps, h.HorizonSteps = c.epoch, c.horizon
		var b bytes.Buffer
		if err := WriteTable(&b, h, Setting{Workers: c.P, Density: 0.01}, nil, nil); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("epoch %d, horizon %d, %d workers: the header lacks %q:\n%s", c.epoch, c.horizon, c.P, c.want, b.String())
		}
	}
}

// TestWriteTableSimulated: a method whose reducer stopped once it had
// settled says how many of the horizon's steps ran; one that ran them all
// says nothing more.
func TestWriteTableSimulated(t *testing.T) {
	h := synthHost()
	h.HorizonSteps = 781
	ranked := []Prediction{
		{Method: "topk", Density: 0.01, ActualDensity: 0.02, Iter: 0.1, Speedup: 1.2, HorizonSteps: 781, Simulated: 36, Settled: 1},
		{Method: "micro", Density: 0.01, ActualDensity: 0.05, Iter: 0.11, Speedup: 1.1, HorizonSteps: 781, Simulated: 781, Settled: 600},
		{Method: "dense", Density: 0.01, ActualDensity: 1, Iter: 0.121, Speedup: 1},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, h, Setting{Workers: 2, Density: 0.01}, ranked, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "step 1 (simulated 36 of 781)") || strings.Contains(b.String(), "simulated 781") || !strings.Contains(b.String(), "step 600 ") {
		t.Errorf("the settles column:\n%s", b.String())
	}
}
