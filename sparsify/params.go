package sparsify

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/sparsegrad/sparsegrad/options"
)

// Values are a method's options by key (Method.Params): options.Values,
// whose Int, Float and Text read resolved ones.
type Values = options.Values

// Param returns the method's declaration of the option key.
func (m Method) Param(key string) (options.Option, bool) {
	for _, o := range m.Params {
		if o.Key == key {
			return o, true
		}
	}
	return options.Option{}, false
}

// Applicable returns the options of v the method declares, for callers
// that use one set of options for several methods.
func (m Method) Applicable(v Values) Values {
	out := Values{}
	for k, x := range v {
		if _, ok := m.Param(k); ok {
			out[k] = x
		}
	}
	return out
}

// Defaults returns a copy of given with every option the method declares
// and given lacks set to its default, and every valid given value in its
// resolved type (options.Defaults).
func (m Method) Defaults(given Values) Values { return options.Defaults(m.Params, given) }

// Resolve returns the method's options: given values checked and converted
// to their kinds' Go types, defaults for the absent ones. A given option
// the method does not declare, or an invalid value, is an error naming the
// option.
func (m Method) Resolve(given Values) (Values, error) {
	var errs []error
	for k := range given {
		if _, ok := m.Param(k); !ok {
			errs = append(errs, fmt.Errorf("sparsify: %s: %w", m.Name, unknownParam(m.Name, k)))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	v, err := options.Resolve(m.Params, given)
	if err != nil {
		return nil, fmt.Errorf("sparsify: %s: %w", m.Name, err)
	}
	return v, nil
}

// ErrUnknownParam is wrapped by the errors about an option the method does
// not declare.
var ErrUnknownParam = errors.New("option does not apply")

// unknownParam says which methods declare the option key, if any.
func unknownParam(method, key string) error {
	if ms := MethodsWithParam(key); len(ms) > 0 {
		return fmt.Errorf("%w: %s is an option of %s, not of %s", ErrUnknownParam, key, strings.Join(ms, ", "), method)
	}
	return fmt.Errorf("%w: no method has an option %q", ErrUnknownParam, key)
}

// MethodsWithParam lists, sorted, the registered methods that declare the
// option key.
func MethodsWithParam(key string) []string {
	var out []string
	for _, m := range Methods() {
		if _, ok := m.Param(key); ok {
			out = append(out, m.Name)
		}
	}
	return out
}

// checkParams refuses m's option declarations (Register panics): an
// invalid declaration (options.Option.Validate), a key declared twice, a
// general option's key or flag, or a key that another registered method
// declares otherwise than by its default.
func checkParams(m Method, registered map[string]Method) error {
	seen := map[string]bool{}
	for _, o := range m.Params {
		if err := o.Validate(); err != nil {
			return err
		}
		if o.Kind != options.Int && o.Kind != options.Float && o.Kind != options.String {
			return fmt.Errorf("option %s: a method option is an Int, a Float or a String, not a %v", o.Key, o.Kind)
		}
		if seen[o.Key] {
			return fmt.Errorf("option %s declared twice", o.Key)
		}
		seen[o.Key] = true
		if _, ok := options.Lookup(o.Key); ok {
			return fmt.Errorf("option %s is a general option of a run", o.Key)
		}
		if g, ok := options.ByFlag(o.FlagName()); ok {
			return fmt.Errorf("option %s: its flag -%s is the general option %s's", o.Key, o.FlagName(), g.Key)
		}
		for _, r := range registered {
			for _, q := range r.Params {
				a, b := o, q
				a.Default, b.Default = nil, nil
				if (q.Key == o.Key || q.FlagName() == o.FlagName()) && !reflect.DeepEqual(a, b) {
					return fmt.Errorf("option %s (-%s, %v) clashes with %s's option %s (-%s, %v): one key, one flag, one declaration but for the default", o.Key, o.FlagName(), o.Kind, r.Name, q.Key, q.FlagName(), q.Kind)
				}
			}
		}
	}
	return nil
}
