package options

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestRange(t *testing.T) {
	for _, tc := range []struct {
		r    Range
		text string
		in   []float64
		out  []float64
	}{
		{Within(0, 1, "(]"), "in (0, 1]", []float64{1e-300, 0.5, 1}, []float64{0, -1, 1.0000001, math.NaN(), math.Inf(1)}},
		{Within(0, 1, "[)"), "in [0, 1)", []float64{0, 0.999}, []float64{1, -1e-9, math.NaN()}},
		{AtLeast(1), ">= 1", []float64{1, 1e9, math.Inf(1)}, []float64{0.999, 0, math.Inf(-1), math.NaN()}},
		{Above(0), "> 0", []float64{1e-300}, []float64{0, -1}},
		{Range{}, "any number", []float64{-1, 0, 1}, []float64{math.NaN()}},
	} {
		if got := tc.r.String(); got != tc.text {
			t.Errorf("%+v: %q, want %q", tc.r, got, tc.text)
		}
		for _, x := range tc.in {
			if !tc.r.Contains(x) {
				t.Errorf("%s does not contain %v", tc.text, x)
			}
		}
		for _, x := range tc.out {
			if tc.r.Contains(x) {
				t.Errorf("%s contains %v", tc.text, x)
			}
		}
	}
}

func TestUsageAndMessages(t *testing.T) {
	lr := Option{Key: "lr", Kind: Float, Doc: "learning rate", Range: Above(0), ByModel: []Case{{"resnet18", 0.05}, {"lstm", 20.0}, {"recorded", 0.0}}}
	mom := Option{Key: "momentum", Kind: Float, Doc: "momentum", ByModel: []Case{{"resnet18", 0.9}}, Default: 0.0}
	bw := Option{Key: "net_bandwidth", Kind: Float, Doc: "bandwidth", FlagScale: 1e9 / 8, Range: AtLeast(0)}
	dev := Option{Key: "device", Kind: String, Doc: "where", Default: "cpu", Choices: []string{"cpu", "cuda"}}
	for _, tc := range []struct{ got, want string }{
		{lr.Usage(), "learning rate (default resnet18 0.05, lstm 20)"},
		{mom.Usage(), "momentum (default resnet18 0.9, else 0)"},
		{bw.Usage(), "bandwidth"},
		{dev.Usage(), "where (default cpu)"},
		{lr.CheckNumber(0, "0"), "-lr 0 must be > 0"},
		{lr.CheckNumber(0.1, "0.1"), ""},
		{dev.CheckChoice("tpu"), `-device "tpu": use cpu or cuda`},
		{dev.CheckChoice("cuda"), ""},
		{bw.FlagName(), "net-bandwidth"},
		{Format([]int{}), "none"},
		{Format([]int{45, 80}), "45,80"},
		{Format(30 * time.Minute), "30m0s"},
		{Format(1e-8), "1e-08"},
	} {
		if tc.got != tc.want {
			t.Errorf("%q, want %q", tc.got, tc.want)
		}
	}
	if d := lr.DefaultFor("lstm"); d != 20.0 {
		t.Errorf("lr's lstm default %v", d)
	}
	if d := mom.DefaultFor("ncf"); d != 0.0 {
		t.Errorf("momentum's ncf default %v", d)
	}
	if !(Option{When: "optimizer=sgd"}).Applies(func(k string) string { return map[string]string{"optimizer": "sgd"}[k] }) ||
		(Option{When: "optimizer=sgd"}).Applies(func(string) string { return "adam" }) {
		t.Error("When is not read")
	}
}

// TestDeclarations: keys and flags (with their older names) are unique,
// and a flag finds its option.
func TestDeclarations(t *testing.T) {
	for _, o := range All {
		if o.Retired != "" || o.Kind == Values {
			continue
		}
		for _, f := range append([]string{o.FlagName()}, o.Aliases...) {
			if got, ok := ByFlag(f); !ok || got.Key != o.Key {
				t.Errorf("-%s finds %q, want %q", f, got.Key, o.Key)
			}
		}
		if strings.Contains(o.FlagName(), "_") {
			t.Errorf("%s: flag -%s has an underscore", o.Key, o.FlagName())
		}
	}
	if o, ok := ByFlag("preset"); !ok || o.FlagName() != "model-size" {
		t.Errorf("-preset is %+v, want the older name of -model-size", o)
	}
}
