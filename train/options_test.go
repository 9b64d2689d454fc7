package train

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/options"
)

// sample is a value of kind k made from x, in the kind's Go type.
func sample(k options.Kind, x float64) any {
	switch k {
	case options.String:
		return "bogus"
	case options.Bool:
		return true
	case options.Int:
		return int(x)
	case options.Uint:
		return uint64(x)
	case options.Float:
		return x
	case options.Duration:
		return time.Duration(x)
	case options.IntList:
		return []int{int(x)}
	}
	return options.Values{"k": x}
}

// TestConfigGetSet: every declared option is a field of Config that Set
// and Get reach with a value of its kind's Go type, which run.json records
// under the option's key; an Optional's zero stays apart from unset.
func TestConfigGetSet(t *testing.T) {
	for _, o := range options.All {
		if o.Retired != "" {
			if (&Config{}).Get(o.Key) != nil {
				t.Errorf("retired %s is still a field", o.Key)
			}
			continue
		}
		var c Config
		v := sample(o.Kind, 3)
		c.Set(o.Key, v)
		if got := c.Get(o.Key); !reflect.DeepEqual(got, v) {
			t.Errorf("%s: Set %v (%T), Get %v (%T)", o.Key, v, v, got, got)
		}
		m, err := configMap(c)
		if err != nil || !strings.Contains(fmt.Sprint(m), o.Key) {
			t.Errorf("%s: run.json's config %v (%v) lacks it", o.Key, m, err)
		}
		if o.Optional {
			c.Set(o.Key, sample(o.Kind, 0))
			if c.Get(o.Key) == nil {
				t.Errorf("%s: 0 reads as unset", o.Key)
			}
			c.Set(o.Key, nil)
			if c.Get(o.Key) != nil {
				t.Errorf("%s: not unset", o.Key)
			}
		}
	}
	if !resumeMayChange("steps") || resumeMayChange("sparsifier") || flagOf("weight_decay") != "wd" || flagOf("max_eval_batches") != "max-eval-batches" ||
		flagOf("method_options.merge_size") != "merge-size" {
		t.Error("resume rules or flag names do not follow the declarations")
	}
}

// TestEveryModelDeclaresItsDefaults: every model's defaults make a valid
// configuration (each model declares what has no general default), and
// the help of -model, -dataset, -model-size and the options the models
// default lists every model.
func TestEveryModelDeclaresItsDefaults(t *testing.T) {
	for _, m := range Models() {
		if err := (Config{Model: m, Out: "x"}).Defaults().Validate(false); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
	for _, key := range []string{"model", "dataset", "preset", "epochs", "batch", "eval_batch", "lr", "optimizer"} {
		o, _ := options.Lookup(key)
		u := OptionUsage(o)
		for _, w := range listed() {
			if !strings.Contains(u, w.name) {
				t.Errorf("the help of -%s does not name %s: %q", o.FlagName(), w.name, u)
			}
		}
	}
	lr, _ := options.Lookup("lr")
	if u := OptionUsage(lr); !strings.HasPrefix(u, "learning rate (default resnet18 0.05, lstm 20, ncf 0.001") {
		t.Errorf("-lr: %q", u)
	}
	size, _ := options.Lookup("preset")
	if u := OptionUsage(size); !strings.Contains(u, "lstm small (2×200) or default (3×650), small by default") ||
		!strings.Contains(u, "ncf paper (8 factors) or default (MLPerf, 64 factors), paper by default (default on ml-20m)") {
		t.Errorf("-model-size: %q", u)
	}
}

// TestEveryDeclaredRangeIsChecked: a value just outside an option's
// declared range, or not one of its choices, is refused with an error
// naming the option's flag; the defaults (inside) are accepted.
func TestEveryDeclaredRangeIsChecked(t *testing.T) {
	for _, o := range options.All {
		r := o.Range
		if o.Retired != "" || (!r.HasMin && !r.HasMax && len(o.Choices) == 0) {
			continue
		}
		t.Run(o.Key, func(t *testing.T) {
			c := Config{Model: "resnet18", Out: "x"} // SGD, step decay
			if o.When == "optimizer=adam" {
				c.Model = "ncf"
			}
			c = c.Defaults()
			if err := c.Validate(false); err != nil {
				t.Fatalf("the defaults: %v", err)
			}
			x := r.Min - 1
			switch {
			case r.HasMin && r.MinOpen:
				x = r.Min
			case !r.HasMin:
				x = r.Max + 1
			}
			if o.FlagScale != 0 {
				x *= o.FlagScale
			}
			c.Set(o.Key, sample(o.Kind, x))
			want := "-" + o.FlagName() + " "
			if o.Kind == options.String {
				want += `"bogus": use `
			}
			err := c.Validate(false)
			if err == nil || !strings.Contains(err.Error(), want) || (len(o.Choices) == 0 && !strings.Contains(err.Error(), "must be "+o.Valid())) {
				t.Fatalf("error %v, want one naming %q and the range", err, want)
			}
		})
	}
	// Every float is finite, first.
	c := Config{Model: "resnet18", Out: "x"}.Defaults()
	c.LR, c.NetBandwidth = Set(math.NaN()), math.Inf(1)
	if err := c.Validate(false); err == nil || !strings.Contains(err.Error(), "-lr NaN is not a finite number") || !strings.Contains(err.Error(), "-net-bandwidth +Inf is not a finite number") {
		t.Fatalf("non-finite: %v", err)
	}
}
