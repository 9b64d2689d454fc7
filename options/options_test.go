package options

import (
	"fmt"
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
		{Within(1, math.MaxInt32, "[]"), "in [1, 2147483647]", []float64{1, math.MaxInt32}, []float64{0, math.MaxInt32 + 1}},
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
	lr := Option{Key: "lr", Kind: Float, Doc: "learning rate", Range: Above(0), Optional: true}
	mom := Option{Key: "momentum", Kind: Float, Doc: "momentum", Default: 0.0, Optional: true}
	bw := Option{Key: "net_bandwidth", Kind: Float, Doc: "bandwidth", FlagScale: 1e9 / 8, Range: AtLeast(0), Hint: " Gbit/s"}
	dev := Option{Key: "device", Kind: String, Doc: "where", Default: "cpu", Choices: []string{"cpu", "cuda"}}
	steps := Option{Key: "steps", Kind: Int, Doc: "stop after this many steps", Range: AtLeast(0), Zero: "no limit"}
	ratio := Option{Key: "max_ratio", Kind: Float, Doc: "bound", Default: 0.0, Range: AtLeast(1), Zero: "off"}
	warm := Option{Key: "dense_warmup", Kind: Int, Doc: "warm-up", Range: Within(0, math.MaxInt32, "[]"), Zero: "none"}
	models := []Case{{"resnet18", 0.05}, {"lstm", 20.0}}
	for _, tc := range []struct{ got, want string }{
		{lr.Usage(models...), "learning rate (default resnet18 0.05, lstm 20)"},
		{mom.Usage(Case{"resnet18", 0.9}), "momentum (default resnet18 0.9, else 0)"},
		{bw.Usage(), "bandwidth"},
		{dev.Usage(), "where (default cpu)"},
		{steps.Usage(), "stop after this many steps (0: no limit)"},
		{ratio.Usage(), "bound (0: off) (default 0)"},
		{warm.Usage(Case{"dragonn", 200}, Case{"oktopk", 512}), "warm-up (0: none) (default dragonn 200, oktopk 512)"},
		{steps.Valid(), ">= 0 (0: no limit)"},
		{ratio.Valid(), "0 (off) or >= 1"},
		{warm.Valid(), "in [0, 2147483647] (0: none)"},
		{dev.Valid(), "cpu or cuda"},
		{bw.FlagName(), "net-bandwidth"},
		{bw.Format(1.25e9), "10"},
		{Format([]int{}), "none"},
		{Format([]int{45, 80}), "45,80"},
		{Format(30 * time.Minute), "30m0s"},
		{Format(1e-8), "1e-08"},
	} {
		if tc.got != tc.want {
			t.Errorf("%q, want %q", tc.got, tc.want)
		}
	}
	if !(Option{When: "optimizer=sgd"}).Applies(func(k string) string { return map[string]string{"optimizer": "sgd"}[k] }) ||
		(Option{When: "optimizer=sgd"}).Applies(func(string) string { return "adam" }) {
		t.Error("When is not read")
	}
}

// TestCheck: values are converted to their kind's Go type (JSON's float64
// for an Int option), and refused with one message naming the flag.
func TestCheck(t *testing.T) {
	i := Option{Key: "merge_size", Kind: Int, Range: Within(1, 10, "[]")}
	f := Option{Key: "max_ratio", Kind: Float, Range: AtLeast(1), Zero: "off"}
	s := Option{Key: "sag", Kind: String, Choices: []string{"a", "b"}}
	u := Option{Key: "seed", Kind: Uint}
	bw := Option{Key: "net_bandwidth", Kind: Float, FlagScale: 1e9 / 8, Range: AtLeast(0), Hint: " Gbit/s"}
	l := Option{Key: "decay_epochs", Kind: IntList, Range: AtLeast(1), Hint: " (every epoch listed)"}
	d := Option{Key: "max_time", Kind: Duration, Range: AtLeast(0), Zero: "no limit"}
	for _, tc := range []struct {
		o       Option
		in      any
		want    any
		wantErr string
	}{
		{i, 3, 3, ""},
		{i, 3.0, 3, ""}, // JSON numbers
		{i, int64(10), 10, ""},
		{i, 0, nil, "-merge-size 0 must be in [1, 10]"},
		{i, 11, nil, "-merge-size 11 must be in [1, 10]"},
		{i, 2.5, nil, "-merge-size 2.5 is not a whole number"},
		{i, math.NaN(), nil, "-merge-size NaN is not a finite number"},
		{i, "3", nil, "-merge-size 3 is a string, not a number"},
		{f, 0.0, 0.0, ""},
		{f, 0, 0.0, ""},
		{f, 1e300, 1e300, ""},
		{f, 0.5, nil, "-max-ratio 0.5 must be 0 (off) or >= 1"},
		{f, math.Inf(1), nil, "-max-ratio +Inf is not a finite number"},
		{f, math.Inf(-1), nil, "-max-ratio -Inf is not a finite number"},
		{s, "b", "b", ""},
		{s, "c", nil, `-sag "c": use a or b`},
		{s, 1, nil, "-sag 1 is a int, not a string"},
		{u, uint64(1 << 60), uint64(1 << 60), ""},
		{u, 42.0, uint64(42), ""},
		{u, -1, nil, "-seed -1 is not a non-negative integer"},
		{bw, -1.25e8, nil, "-net-bandwidth -1 must be >= 0 Gbit/s"},
		{bw, math.NaN(), nil, "-net-bandwidth NaN is not a finite number"},
		{l, []int{150, 200}, []int{150, 200}, ""},
		{l, []int{150, 0}, nil, "-decay-epochs 150,0 must be >= 1 (every epoch listed)"},
		{d, -time.Second, nil, "-max-time -1s must be >= 0 (0: no limit)"},
		{d, time.Duration(0), time.Duration(0), ""},
	} {
		t.Run(fmt.Sprintf("%s=%v", tc.o.Key, tc.in), func(t *testing.T) {
			got, err := tc.o.Check(tc.in)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("Check(%v) = %v, %v; want the error %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || fmt.Sprintf("%T %v", got, got) != fmt.Sprintf("%T %v", tc.want, tc.want) {
				t.Fatalf("Check(%v) = %v (%T), %v; want %v (%T)", tc.in, got, got, err, tc.want, tc.want)
			}
		})
	}
}

// TestParse: each kind's flag text, and its errors; a scaled option's
// value is the configuration's.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		o       Option
		in      string
		want    any
		wantErr string
	}{
		{Option{Kind: Int}, " 4096 ", 4096, ""},
		{Option{Kind: Int}, "1.5", nil, `"1.5" is not a whole number`},
		{Option{Kind: Float}, "1000", 1000.0, ""},
		{Option{Kind: Float, FlagScale: 1e9 / 8}, "10", 1.25e9, ""},
		{Option{Kind: Float}, "NaN", nil, "NaN is not a finite number"},
		{Option{Kind: Float}, "-Inf", nil, "-Inf is not a finite number"},
		{Option{Kind: Float}, "infinity", nil, "infinity is not a finite number"},
		{Option{Kind: Float}, "1e400", nil, "beyond ±1.8e+308, the largest float64: not a finite number"},
		{Option{Kind: Float}, "x", nil, `"x" is not a number`},
		{Option{Kind: Uint}, "0", uint64(0), ""},
		{Option{Kind: Uint}, "-1", nil, "want a non-negative integer"},
		{Option{Kind: Bool}, "false", false, ""},
		{Option{Kind: Bool}, "no", nil, "want true or false"},
		{Option{Kind: String, Choices: []string{"a"}}, "z", "z", ""}, // Check refuses it
		{Option{Kind: Duration}, "50us", 50 * time.Microsecond, ""},
		{Option{Kind: Duration}, "5", nil, `"5" has no unit`},
		{Option{Kind: Duration}, "abc", nil, `"abc" is not a duration`},
		{Option{Kind: IntList}, "none", []int{}, ""},
		{Option{Kind: IntList}, "45, 80", []int{45, 80}, ""},
		{Option{Kind: IntList}, "45;80", nil, "want comma-separated whole numbers"},
	} {
		got, err := tc.o.Parse(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v Parse(%q) = %v, %v; want an error containing %q", tc.o.Kind, tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || fmt.Sprintf("%T %v", got, got) != fmt.Sprintf("%T %v", tc.want, tc.want) {
			t.Errorf("%v Parse(%q) = %v (%T), %v; want %v (%T)", tc.o.Kind, tc.in, got, got, err, tc.want, tc.want)
		}
	}
}

// TestValidate: a declaration that cannot work is refused.
func TestValidate(t *testing.T) {
	ok := Option{Key: "zz_opt", Kind: Int, Default: 1, Optional: true, Range: Within(0, 5, "[]"), Doc: "d"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Option)
		want string
	}{
		{"no doc", func(o *Option) { o.Doc = "" }, "needs a Key and a Doc"},
		{"no key", func(o *Option) { o.Key = "" }, "needs a Key and a Doc"},
		{"no kind", func(o *Option) { o.Kind = 0 }, "unknown Kind"},
		{"default out of range", func(o *Option) { o.Default = 9 }, "-zz-opt 9 must be in [0, 5]"},
		{"default of another kind", func(o *Option) { o.Default = 1.0 }, "not of the option's kind"},
		{"NaN bound", func(o *Option) { o.Range.Max = math.NaN() }, "empty"},
		{"empty range", func(o *Option) { o.Range = Within(2, 1, "[]") }, "empty"},
		{"a range for a string", func(o *Option) { o.Kind, o.Default = String, "a" }, "a range for a string"},
		{"choices for a number", func(o *Option) { o.Choices = []string{"a"} }, "choices for a int"},
		{"underscore in the flag", func(o *Option) { o.Flag = "zz_opt" }, "underscore"},
	} {
		o := ok
		o.Default = 0
		tc.edit(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// TestResolve: defaults fill absent options, given ones are checked and
// converted, undeclared ones refused.
func TestResolve(t *testing.T) {
	decls := []Option{{Key: "n", Kind: Int, Default: 8, Range: AtLeast(1)}, {Key: "x", Kind: Float, Default: 0.0}}
	got, err := Resolve(decls, Values{"n": 2.0})
	if err != nil || fmt.Sprintf("%T %v %T %v", got["n"], got["n"], got["x"], got["x"]) != "int 2 float64 0" {
		t.Fatalf("Resolve: %v, %v", got, err)
	}
	if _, err := Resolve(decls, Values{"n": 0, "y": 1}); err == nil || !strings.Contains(err.Error(), "-n 0 must be >= 1") || !strings.Contains(err.Error(), `no option "y"`) {
		t.Fatalf("Resolve: %v", err)
	}
	d := Defaults(decls, Values{"n": 3.0, "x": "bad"})
	if fmt.Sprintf("%T %v %v", d["n"], d["n"], d["x"]) != "int 3 bad" {
		t.Fatalf("Defaults: %v", d)
	}
	if v := (Values{"n": 3}); v.Int("n") != 3 {
		t.Fatal("Values.Int")
	}
}

// TestDeclarations: keys and flags (with their older names) are unique,
// every declaration is valid, and a flag finds its option.
func TestDeclarations(t *testing.T) {
	for _, o := range All {
		if err := o.Validate(); err != nil {
			t.Error(err)
		}
		if o.Retired != "" || o.Kind == ValueMap {
			continue
		}
		for _, f := range append([]string{o.FlagName()}, o.Aliases...) {
			if got, ok := ByFlag(f); !ok || got.Key != o.Key {
				t.Errorf("-%s finds %q, want %q", f, got.Key, o.Key)
			}
		}
	}
	if o, ok := ByFlag("preset"); !ok || o.FlagName() != "model-size" {
		t.Errorf("-preset is %+v, want the older name of -model-size", o)
	}
}
