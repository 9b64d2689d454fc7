package train

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// TestEveryOptionDeclaredOnce: every key of run.json's configuration
// (train.Config) is declared in package options, and every declared key
// that is not retired is one of Config's, so that the resume rules, the
// flags' names and the reports' headers cover every option.
func TestEveryOptionDeclaredOnce(t *testing.T) {
	ty := reflect.TypeFor[Config]()
	keys := map[string]bool{}
	for i := range ty.NumField() {
		key, _, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ",")
		if key == "" || key == "-" {
			continue
		}
		keys[key] = true
		if _, ok := options.Lookup(key); !ok {
			t.Errorf("train.Config.%s (run.json key %q) is not declared in package options", ty.Field(i).Name, key)
		}
	}
	for _, o := range options.All {
		if o.Retired == "" && !keys[o.Key] {
			t.Errorf("options declares %q, which train.Config does not have (retire it with a reason)", o.Key)
		}
		if o.Retired != "" && keys[o.Key] {
			t.Errorf("options retires %q, which train.Config still has", o.Key)
		}
	}
	if !resumeMayChange("steps") || resumeMayChange("sparsifier") || flagOf("weight_decay") != "wd" || flagOf("max_eval_batches") != "max-eval-batches" {
		t.Error("resume rules or flag names do not follow the declarations")
	}
}

// TestOptionDeclarationsFitConfig: each option's declared kind is its
// Config field's type, its defaults have that type, choices belong to
// string options and ranges to numbers, and every option has a doc (the
// flags' help).
func TestOptionDeclarationsFitConfig(t *testing.T) {
	kinds := map[options.Kind][]any{
		options.String:   {new(string)},
		options.Bool:     {new(bool)},
		options.Int:      {new(int), new(Optional[int])},
		options.Uint:     {new(Optional[uint64])},
		options.Float:    {new(float64), new(Optional[float64])},
		options.Duration: {new(time.Duration)},
		options.IntList:  {new([]int)},
		options.Values:   {new(sparsify.Values)},
	}
	defaults := map[options.Kind]any{options.String: "", options.Int: 0, options.Uint: uint64(0), options.Float: 0.0, options.IntList: []int{}}
	var c Config
	for _, o := range options.All {
		if o.Retired != "" {
			continue
		}
		p := c.Field(o.Key)
		if !slices.ContainsFunc(kinds[o.Kind], func(k any) bool { return reflect.TypeOf(k) == reflect.TypeOf(p) }) {
			t.Errorf("%s: declared %v, Config's field is %T", o.Key, o.Kind, p)
		}
		if o.Doc == "" && o.Kind != options.Values {
			t.Errorf("%s: no Doc (the flag's help)", o.Key)
		}
		ds := []any{o.Default}
		for _, m := range o.ByModel {
			if !slices.Contains(Models, m.Model) && m.Model != RecordedModel {
				t.Errorf("%s: a default for %q, which is no model", o.Key, m.Model)
			}
			ds = append(ds, m.Value)
		}
		for _, d := range ds {
			if d != nil && reflect.TypeOf(d) != reflect.TypeOf(defaults[o.Kind]) {
				t.Errorf("%s: default %v is a %T, not a %v", o.Key, d, d, o.Kind)
			}
		}
		if len(o.Choices) > 0 && o.Kind != options.String {
			t.Errorf("%s: choices for a %v option", o.Key, o.Kind)
		}
		numeric := o.Kind == options.Int || o.Kind == options.Float || o.Kind == options.Duration || o.Kind == options.IntList
		if (o.Range.HasMin || o.Range.HasMax) && !numeric {
			t.Errorf("%s: a range for a %v option", o.Key, o.Kind)
		}
		if k, _, ok := strings.Cut(o.When, "="); o.When != "" && (!ok || c.Field(k) == nil) {
			t.Errorf("%s: When %q names no option", o.Key, o.When)
		}
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
			x *= o.Scale()
			want := "-" + o.FlagName() + " "
			switch p := c.Field(o.Key).(type) {
			case *string:
				*p, want = "bogus", want+`"bogus": use `
			case *int:
				*p = int(x)
			case *float64:
				*p = x
			case *time.Duration:
				*p = time.Duration(x)
			case *[]int:
				*p = []int{int(x)}
			case *Optional[int]:
				*p = Set(int(x))
			case *Optional[float64]:
				*p = Set(x)
			default:
				t.Fatalf("no test for a %T", p)
			}
			err := c.Validate(false)
			if err == nil || !strings.Contains(err.Error(), want) || (len(o.Choices) == 0 && !strings.Contains(err.Error(), "must be "+r.String())) {
				t.Fatalf("error %v, want one naming %q and the range", err, want)
			}
		})
	}
}
