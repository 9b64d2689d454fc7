package sweep

import (
	"testing"

	"github.com/sparsegrad/sparsegrad/reports"
)

// TestCompressorClaimRules checks the compressors preset's rules both
// ways: a claim must be able to fail, and be undecided without dense.
func TestCompressorClaimRules(t *testing.T) {
	bytesRun := func(b float64) *reports.Run {
		return synth(20, func(i int, s *reports.Step) { s.BytesSent = b })
	}
	lossRun := func(l float64) *reports.Run {
		return synth(20, func(i int, s *reports.Step) { s.Loss = l })
	}
	half := bytesAtMost("a", func(int) float64 { return 0.5 }, "1/2")
	perN := bytesAtMost("a", func(n int) float64 { return float64(n) / 60 }, "n/60")
	near := lossNear([]string{"a"}, 0.05)
	cases := []struct {
		name         string
		check        func(Results) Verdict
		rs           Results
		shown, undec bool
	}{
		{"half holds", half, results(pt{"a", 4, .1, bytesRun(500)}, pt{"dense", 4, .1, bytesRun(1000)}), true, false},
		{"half fails", half, results(pt{"a", 4, .1, bytesRun(600)}, pt{"dense", 4, .1, bytesRun(1000)}), false, false},
		{"n/60 holds", perN, results(pt{"a", 4, .1, bytesRun(66)}, pt{"dense", 4, .1, bytesRun(1000)}), true, false},
		{"n/60 fails", perN, results(pt{"a", 2, .1, bytesRun(66)}, pt{"dense", 2, .1, bytesRun(1000)}), false, false},
		{"bytes without dense", half, results(pt{"a", 4, .1, bytesRun(1)}), false, true},
		{"loss holds", near, results(pt{"a", 4, .1, lossRun(1.04)}, pt{"dense", 4, .1, lossRun(1)}), true, false},
		{"loss fails", near, results(pt{"a", 4, .1, lossRun(1.2)}, pt{"dense", 4, .1, lossRun(1)}), false, false},
		{"loss without dense", near, results(pt{"a", 4, .1, lossRun(1)}), false, true},
	}
	for _, c := range cases {
		v := c.check(c.rs)
		if v.Shown != c.shown || v.Undecided != c.undec || v.Detail == "" {
			t.Errorf("%s: verdict %+v, want shown %v undecided %v with a detail", c.name, v, c.shown, c.undec)
		}
	}
}
