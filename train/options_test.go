package train

import (
	"reflect"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/options"
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
