package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
)

// resolved parses args as the train command does and returns the resolved
// configuration (defaults applied) as run.json's "config" object.
func resolved(t *testing.T, args ...string) map[string]any {
	t.Helper()
	var out bytes.Buffer
	fs, v, _ := newFlags(&out)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out.String())
	}
	c := *v
	b, err := json.Marshal(c.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestExplicitZeroIsKept: a flag given as 0 is 0, not "use the default"
// (momentum, weight decay, clipping, seed, a method's dense warm-up), and a
// flag not given still takes the model's default.
func TestExplicitZeroIsKept(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		key  string // in run.json's config; "a.b" is key b of object a
		want float64
	}{
		{"resnet momentum 0", []string{"-model", "resnet18", "-momentum", "0"}, "momentum", 0},
		{"resnet momentum default", []string{"-model", "resnet18"}, "momentum", 0.9},
		{"resnet wd 0", []string{"-model", "resnet18", "-wd", "0"}, "weight_decay", 0},
		{"resnet wd default", []string{"-model", "resnet18"}, "weight_decay", 1e-4},
		{"lstm clip 0", []string{"-model", "lstm", "-clip", "0"}, "clip", 0},
		{"lstm clip default", []string{"-model", "lstm"}, "clip", 0.4},
		{"seed 0", []string{"-seed", "0"}, "seed", 0},
		{"seed default", nil, "seed", 42},
		{"adam beta1 0", []string{"-beta1", "0"}, "beta1", 0},
		{"dragonn warm-up 0", []string{"-sparsifier", "dragonn", "-dense-warmup", "0"}, "method_options.dense_warmup", 0},
		{"dragonn warm-up default", []string{"-sparsifier", "dragonn"}, "method_options.dense_warmup", 200},
		{"oktopk warm-up 0", []string{"-sparsifier", "oktopk", "-dense-warmup", "0"}, "method_options.dense_warmup", 0},
		{"oktopk warm-up default", []string{"-sparsifier", "oktopk"}, "method_options.dense_warmup", 512},
		{"dragonn min tensor 0", []string{"-sparsifier", "dragonn", "-min-tensor", "0"}, "method_options.min_tensor", 0},
		{"lags lstm density: the paper's", []string{"-model", "lstm", "-sparsifier", "lags"}, "density", 0.004},
		{"dragonn density: the paper's", []string{"-sparsifier", "dragonn"}, "density", 0.001},
		{"dgc warm-up default", []string{"-sparsifier", "dgc"}, "method_options.sparsity_warmup", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := resolved(t, append(tc.args, "-out", "x")...)
			var v any = m
			for _, k := range strings.Split(tc.key, ".") {
				o, ok := v.(map[string]any)
				if !ok {
					t.Fatalf("config has no %s: %v", tc.key, m)
				}
				v = o[k]
			}
			if f, ok := v.(float64); !ok || f != tc.want {
				t.Fatalf("%s = %v, want %v (config %v)", tc.key, v, tc.want, m)
			}
		})
	}
}

// TestZeroAdvisedByAnErrorWorks: the error that refuses local clipping
// (-clip-at local) with LAGS pipelining advises -clip 0, which must then be
// accepted for the LSTM (whose default clip is 0.4).
func TestZeroAdvisedByAnErrorWorks(t *testing.T) {
	var out bytes.Buffer
	args := []string{"-model", "lstm", "-sparsifier", "lags", "-pipeline", "on", "-clip-at", "local", "-out", "x"}
	err := run(context.Background(), args, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "-clip 0") {
		t.Fatalf("lstm with -pipeline on: %v, want advice to pass -clip 0", err)
	}
	fs, v, _ := newFlags(&out)
	if err := fs.Parse(append(args, "-clip", "0")); err != nil {
		t.Fatal(err)
	}
	if err := v.Defaults().Validate(false); err != nil {
		t.Fatalf("with -clip 0: %v", err)
	}
}

// floatFlags are the float flags of train.
var floatFlags = []string{"density", "lr", "momentum", "wd", "label-smoothing", "beta1", "beta2", "eps", "warmup-epochs", "decay-factor", "clip",
	"net-bandwidth", "lambda", "max-ratio", "bucket-mb"}

// TestFloatFlagsRejectNonFinite: every float flag refuses NaN and ±Inf with
// a message that names the flag.
func TestFloatFlagsRejectNonFinite(t *testing.T) {
	for _, f := range floatFlags {
		for _, bad := range []string{"NaN", "nan", "Inf", "+Inf", "-Inf", "infinity"} {
			var out bytes.Buffer
			err := run(context.Background(), []string{"-" + f, bad, "-out", "x", "-summary"}, &out, &out)
			if err == nil || !strings.Contains(err.Error(), "-"+f) || !strings.Contains(err.Error(), "finite") {
				t.Errorf("-%s %s: err %v, want an error naming -%s and saying it is not finite", f, bad, err, f)
			}
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"report", "-target", "NaN", "x"}, &out, &out); err == nil || !strings.Contains(err.Error(), "-target") || !strings.Contains(err.Error(), "finite") {
		t.Errorf("report -target NaN: %v", err)
	}
}

// TestEveryFloatFlagRefusesNonFinite: every flag of train, train report,
// train sweep and train advise that takes a fractional number (a float, or a
// list of them; recognised by accepting 0.5 and refusing a word, so a flag
// added later is covered) refuses NaN, ±Inf and numbers beyond float64's
// range, saying that the value is not finite.
func TestEveryFloatFlagRefusesNonFinite(t *testing.T) {
	trainFlags, _, _ := newFlags(io.Discard)
	sweepFlags, _ := newSweepFlags(io.Discard)
	adviseFlags, _ := newAdviseFlags(io.Discard)
	for _, set := range []*flag.FlagSet{trainFlags, reportFlags(io.Discard), sweepFlags, adviseFlags} {
		found := 0
		set.VisitAll(func(f *flag.Flag) {
			if f.Value.Set("0.5") != nil || f.Value.Set("half") == nil {
				return // not a fractional number
			}
			found++
			for _, bad := range []string{"NaN", "nan", "Inf", "-Inf", "+infinity", "1e400", "-1e400", "0x1p2000"} {
				if err := f.Value.Set(bad); err == nil || !strings.Contains(err.Error(), "not a finite number") {
					t.Errorf("%s -%s %s: %v, want an error saying it is not a finite number", set.Name(), f.Name, bad, err)
				}
			}
		})
		if found == 0 {
			t.Errorf("%s: no float flag found (the test's recognition is broken)", set.Name())
		}
	}
}

// TestNoUncheckedFloatFlag: no flag of train or train report is a plain
// flag.Float64 (which accepts NaN and ±Inf); TestFloatFlagsRejectNonFinite
// lists every float flag.
func TestNoUncheckedFloatFlag(t *testing.T) {
	fs, _, _ := newFlags(io.Discard)
	rs := reportFlags(io.Discard)
	tested := map[string]bool{}
	for _, f := range floatFlags {
		tested[f] = true
	}
	for _, set := range []*flag.FlagSet{fs, rs} {
		set.VisitAll(func(f *flag.Flag) {
			if fmt.Sprintf("%T", f.Value) == "*flag.float64Value" {
				t.Errorf("-%s is a plain float flag; use an optionValue (bind, configValue)", f.Name)
			}
			if tv, ok := f.Value.(typedValue); ok && tv.Type() == "float" && !tested[f.Name] && f.Name != "target" {
				t.Errorf("float flag -%s is missing from TestFloatFlagsRejectNonFinite", f.Name)
			}
		})
	}
}
