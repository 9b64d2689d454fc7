package train

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
)

// TestEpochLineSaysWhenCut: an epoch's line gives the mean loss of the
// steps taken; an epoch the run left early says how many steps it took and
// how many the epoch had left (not a bare "epoch 1/90" after 20 steps); an
// epoch left before its first step prints nothing.
func TestEpochLineSaysWhenCut(t *testing.T) {
	for _, tc := range []struct {
		steps  int
		losses []float64
		want   string // the line, up to the throughput
	}{
		{10, []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, "epoch 2/5: mean loss 5.5000, "},
		{10, []float64{4, 2}, "epoch 2/5, stopped after 2 steps (8 left in the epoch): mean loss 3.0000, "},
		{2500, []float64{1}, "epoch 2/5, stopped after 1 step (2,499 left in the epoch): mean loss 1.0000, "},
		{10, nil, ""},
	} {
		var out bytes.Buffer
		p := newProgress(&bytes.Buffer{}, &out, false)
		p.startEpoch(2, 5, tc.steps)
		for _, l := range tc.losses {
			p.add(32, l)
			p.logged(l)
		}
		p.endEpoch()
		if tc.want == "" {
			if out.Len() != 0 {
				t.Errorf("an epoch left before its first step printed %q", out.String())
			}
			continue
		}
		if !strings.HasPrefix(out.String(), tc.want) {
			t.Errorf("%d of %d steps: printed %q, want it to start %q", len(tc.losses), tc.steps, out.String(), tc.want)
		}
	}
}

// TestShortRunSaysItsEpochWasCut: NCF on ml-100k with -steps 5 (an epoch
// is hundreds of steps of 2 workers of 512) prints that its first epoch
// stopped after 5 steps, and how many it had left.
func TestShortRunSaysItsEpochWasCut(t *testing.T) {
	c := ncfConfig(t, 2, 5)
	c.Quiet = false
	c.Batch = Set(512)
	var out bytes.Buffer
	if err := Run(context.Background(), c, Options{Stdout: &out, Progress: &bytes.Buffer{}}); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^epoch 1/20, stopped after 5 steps \(([0-9,]+) left in the epoch\): mean loss `).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no line saying the epoch stopped after 5 steps:\n%s", out.String())
	}
	if m[1] == "0" {
		t.Errorf("0 steps left in an epoch cut short:\n%s", out.String())
	}
}
