// Package options is the one vocabulary of a training run's options: how
// an option is declared (its key, its command-line flag, the kind of its
// value, its default, its valid values, its doc, whether a resumed run may
// change it, whether it tells compared runs apart), how a value is checked,
// read from a flag and written back, and how its help text is written.
//
// The general options of a run are declared here (All); a sparsifier's own
// options are declared in the same terms by the method that has them (the
// sparsify registry's Method.Params), and a model's defaults of general
// options by the model (package train's workloads). train.Config is
// generated from All (go generate ./train); the trainer's defaults,
// single-option checks and resume rules, the command-line flags and help of
// train, train replay, train sweep and train advise, the sweep's printed
// command lines and the reports' page headers and comparisons read these
// declarations instead of keeping lists of their own.
//
// The package is a leaf: it imports nothing of the project.
package options

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Kind is the type of an option's value. Each kind has one Go type, which
// values of the option have once checked (Check, Parse) and which declared
// defaults have: string, bool, int, uint64, float64, time.Duration, []int,
// Values.
type Kind int

const (
	// String options hold a string; with Choices, one of them.
	String Kind = iota + 1
	// Bool options are switches.
	Bool
	// Int options hold an int.
	Int
	// Uint options hold a non-negative integer (the seed).
	Uint
	// Float options hold a finite float64.
	Float
	// Duration options hold a time.Duration.
	Duration
	// IntList options hold a list of ints (a comma-separated flag).
	IntList
	// ValueMap options hold Values: the sparsifier's own options (each
	// declared by its method, with one flag per option).
	ValueMap
)

// kinds are each kind's name in the help text and the Go type of its
// values.
var kinds = [...]struct {
	name string
	typ  reflect.Type
}{
	String:   {"string", reflect.TypeFor[string]()},
	Bool:     {"bool", reflect.TypeFor[bool]()},
	Int:      {"int", reflect.TypeFor[int]()},
	Uint:     {"uint", reflect.TypeFor[uint64]()},
	Float:    {"float", reflect.TypeFor[float64]()},
	Duration: {"duration", reflect.TypeFor[time.Duration]()},
	IntList:  {"list", reflect.TypeFor[[]int]()},
	ValueMap: {"values", reflect.TypeFor[Values]()},
}

// String names the kind as the help text does: "string", "int", ...
func (k Kind) String() string {
	if k < String || k > ValueMap {
		return fmt.Sprintf("Kind(%d)", int(k))
	}
	return kinds[k].name
}

// Typed reports whether v has the Go type of the option's kind.
func (o Option) Typed(v any) bool {
	return o.Kind >= String && o.Kind <= ValueMap && reflect.TypeOf(v) == kinds[o.Kind].typ
}

// numeric reports whether the kind's values are numbers (a Range applies).
func (k Kind) numeric() bool {
	return k == Int || k == Uint || k == Float || k == Duration || k == IntList
}

// Range bounds the values of a numeric option. The zero Range bounds
// nothing.
type Range struct {
	// Min and Max are the bounds; HasMin and HasMax say which exist.
	Min, Max       float64
	HasMin, HasMax bool
	// MinOpen and MaxOpen exclude the bound itself.
	MinOpen, MaxOpen bool
}

// AtLeast is [min, ∞).
func AtLeast(min float64) Range { return Range{Min: min, HasMin: true} }

// Above is (min, ∞).
func Above(min float64) Range { return Range{Min: min, HasMin: true, MinOpen: true} }

// Within is the interval between min and max; bounds is "[]", "[)", "(]"
// or "()", as the interval is written.
func Within(min, max float64, bounds string) Range {
	return Range{Min: min, Max: max, HasMin: true, HasMax: true, MinOpen: bounds[0] == '(', MaxOpen: bounds[1] == ')'}
}

// Contains reports whether x lies in the range (never for NaN).
func (r Range) Contains(x float64) bool {
	if math.IsNaN(x) {
		return false
	}
	if r.HasMin && (x < r.Min || r.MinOpen && x == r.Min) {
		return false
	}
	if r.HasMax && (x > r.Max || r.MaxOpen && x == r.Max) {
		return false
	}
	return true
}

// String writes the range as the messages do: "in [0, 1)", ">= 1", "> 0".
func (r Range) String() string {
	switch {
	case r.HasMin && r.HasMax:
		lo, hi := "[", "]"
		if r.MinOpen {
			lo = "("
		}
		if r.MaxOpen {
			hi = ")"
		}
		return "in " + lo + num(r.Min) + ", " + num(r.Max) + hi
	case r.HasMin && r.MinOpen:
		return "> " + num(r.Min)
	case r.HasMin:
		return ">= " + num(r.Min)
	case r.HasMax && r.MaxOpen:
		return "< " + num(r.Max)
	case r.HasMax:
		return "<= " + num(r.Max)
	}
	return "any number"
}

// maxExactInt is the largest integer a float64 holds exactly.
const maxExactInt = 1 << 53

// num writes x, whole numbers below 2^53 without an exponent.
func num(x float64) string {
	if x == math.Trunc(x) && math.Abs(x) <= maxExactInt {
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}

// Case is an option's default for one owner that declares its own: a
// model's default of a general option, a method's default of its option.
type Case struct {
	Owner string
	Value any
}

// Option is one option: a general option of a run, or one of a method's
// own options.
type Option struct {
	// Key is the option's key in run.json's config (train.Config's JSON
	// name; a method option's key in method_options).
	Key string
	// Flag is its command-line flag without the dash; empty: the key with
	// "_" turned into "-".
	Flag string
	// Aliases are older names of the flag that keep working.
	Aliases []string
	// Kind is the type of its value.
	Kind Kind
	// Doc says what the option does, for the help text and train.Config's
	// doc comments (the help adds the meaning of 0 and the defaults; for
	// Choices nothing more: Doc names them).
	Doc string
	// Default is its value when it is not given, where its owner (a model,
	// for a general option) declares none (nil: the zero value, or decided
	// by the trainer from other options, as Doc says). It has the Go type
	// of the kind.
	Default any
	// Optional tells that the configuration keeps "not given" apart from
	// zero (a train.Optional), because a default that may not be zero
	// fills it: Default, a model's, or one the trainer decides (density).
	Optional bool
	// When names another option's value that the option applies to, as
	// "key=value" (e.g. "optimizer=sgd"): its default is filled and its
	// range checked only then.
	When string
	// Range bounds a numeric option's values. Zero, when not empty, says
	// what 0 means, and makes 0 valid too where Range excludes it ("off",
	// "no limit"). Hint follows the valid values in the message that
	// refuses a value ("; pass e.g. -density 0.01").
	Range Range
	Zero  string
	Hint  string
	// Choices are a String option's valid values.
	Choices []string
	// FlagScale converts the flag's value into the configuration's (the
	// configuration holds flag × FlagScale; 0: 1): -net-bandwidth is in
	// Gbit/s, the configuration in bytes/s.
	FlagScale float64
	// Resume tells that a resumed run may set it to another value than the
	// run had (how long it runs, where its data lives, how it reports and
	// checkpoints, what executes it; the learning rate and clipping, with
	// which a run that diverged continues). Every other option decides the
	// training itself and must match.
	Resume bool
	// Incidental tells that the option does not tell compared runs apart
	// (where output goes, how often it reports): a comparison does not list
	// it among the differences.
	Incidental bool
	// WithMethod tells that a page header shows it among the method's
	// options (it qualifies how the method runs).
	WithMethod bool
	// Omit tells that run.json leaves the option out while its value is
	// zero (the form run.json has recorded it in since it was added).
	Omit bool
	// Retired says why an option of earlier versions is no longer set;
	// readers of old runs still know it.
	Retired string
}

// FlagName returns the option's command-line flag, without the dash.
func (o Option) FlagName() string {
	if o.Flag != "" {
		return o.Flag
	}
	return strings.ReplaceAll(o.Key, "_", "-")
}

// scale is the factor from the flag's value to the configuration's.
func (o Option) scale() float64 {
	if o.FlagScale == 0 {
		return 1
	}
	return o.FlagScale
}

// Applies reports whether the option applies, given the value of the
// option its When names (get returns it as text).
func (o Option) Applies(get func(key string) string) bool {
	if o.When == "" {
		return true
	}
	k, v, _ := strings.Cut(o.When, "=")
	return get(k) == v
}

// Valid describes the option's valid values as the messages write them:
// "in [0, 1)", ">= 0 (0: no limit)", "0 (off) or >= 1", "cpu or cuda".
func (o Option) Valid() string {
	if len(o.Choices) > 0 {
		return orList(o.Choices)
	}
	r := o.Range.String()
	switch {
	case o.Zero == "":
		return r
	case o.Range.Contains(0):
		return r + " (0: " + o.Zero + ")"
	}
	return "0 (" + o.Zero + ") or " + strings.TrimPrefix(r, "in ")
}

// refuse is the error that refuses a value: it names the flag.
func (o Option) refuse(format string, a ...any) error {
	return fmt.Errorf("-%s %s", o.FlagName(), fmt.Sprintf(format, a...))
}

// Check returns v as a valid value of the option, in its kind's Go type,
// or an error naming the flag and saying why v is not one: not of the
// kind (numbers convert: JSON's float64 for an Int option, an int for a
// Float one), not a finite number, not a whole number, outside the range,
// not one of the choices. Values are the configuration's (a scaled
// option's flag value × FlagScale); messages show the flag's.
func (o Option) Check(v any) (any, error) {
	c, err := o.convert(v)
	if err != nil {
		return nil, err
	}
	if len(o.Choices) > 0 {
		if s := c.(string); !slices.Contains(o.Choices, s) {
			return nil, o.refuse("%q: use %s", s, orList(o.Choices))
		}
		return c, nil
	}
	if !o.Kind.numeric() {
		return c, nil
	}
	in := func(x float64) bool { return (x == 0 && o.Zero != "") || o.Range.Contains(x) }
	var ok bool
	switch x := c.(type) {
	case int:
		ok = in(float64(x))
	case uint64:
		ok = in(float64(x))
	case float64:
		ok = in(x / o.scale())
	case time.Duration:
		ok = in(float64(x))
	case []int:
		ok = true
		for _, e := range x {
			ok = ok && in(float64(e))
		}
	}
	if !ok {
		return nil, o.refuse("%s must be %s%s", o.Format(c), o.Valid(), o.Hint)
	}
	return c, nil
}

// convert returns v in the kind's Go type.
func (o Option) convert(v any) (any, error) {
	switch o.Kind {
	case Int, Uint, Float:
		if n, ok := v.(int); ok && o.Kind == Int {
			return n, nil
		}
		if n, ok := v.(uint64); ok && o.Kind == Uint {
			return n, nil
		}
		var x float64
		switch n := v.(type) {
		case int:
			x = float64(n)
		case int64:
			x = float64(n)
		case uint64:
			x = float64(n)
		case float64:
			x = n
		default:
			return nil, o.refuse("%v is a %T, not a number", v, v)
		}
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, o.refuse("%v is not a finite number", x/o.scale())
		}
		switch {
		case o.Kind == Float:
			return x, nil
		case x != math.Trunc(x) || math.Abs(x) > maxExactInt:
			return nil, o.refuse("%v is not a whole number", x)
		case o.Kind == Uint && x < 0:
			return nil, o.refuse("%v is not a non-negative integer", x)
		case o.Kind == Uint:
			return uint64(x), nil
		}
		return int(x), nil
	}
	if o.Typed(v) {
		return v, nil
	}
	return nil, o.refuse("%v is a %T, not a %v", v, v, o.Kind)
}

// Parse reads a value of the option from its flag's text, in the kind's
// Go type (a scaled option's: × FlagScale). It checks the syntax, and
// that a number is finite, not the range: Check does.
func (o Option) Parse(s string) (any, error) {
	t := strings.TrimSpace(s)
	switch o.Kind {
	case String:
		return s, nil
	case Bool:
		v, err := strconv.ParseBool(s)
		if err != nil {
			return nil, fmt.Errorf("%q: want true or false", s)
		}
		return v, nil
	case Int:
		v, err := strconv.Atoi(t)
		if err != nil {
			return nil, fmt.Errorf("%q is not a whole number", s)
		}
		return v, nil
	case Uint:
		v, err := strconv.ParseUint(t, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: want a non-negative integer", s)
		}
		return v, nil
	case Float:
		v, err := strconv.ParseFloat(t, 64)
		switch {
		case errors.Is(err, strconv.ErrRange) && math.IsInf(v, 0):
			return nil, fmt.Errorf("%s is beyond ±%.1e, the largest float64: not a finite number", s, math.MaxFloat64)
		case err != nil:
			return nil, fmt.Errorf("%q is not a number", s)
		case math.IsNaN(v) || math.IsInf(v, 0):
			return nil, fmt.Errorf("%s is not a finite number", s)
		}
		return v * o.scale(), nil
	case Duration:
		d, err := time.ParseDuration(t)
		if err == nil {
			return d, nil
		}
		if _, ferr := strconv.ParseFloat(t, 64); ferr == nil {
			return nil, fmt.Errorf("%q has no unit: write e.g. %ss, %sm or %sms (units h, m, s, ms, us, ns)", t, t, t, t)
		}
		return nil, fmt.Errorf("%q is not a duration: write a number and a unit, e.g. 50us, 2ms, 30s, 1h30m (units h, m, s, ms, us, ns)", t)
	case IntList:
		if t == "none" {
			return []int{}, nil
		}
		var out []int
		for _, x := range strings.Split(s, ",") {
			e, err := strconv.Atoi(strings.TrimSpace(x))
			if err != nil {
				return nil, fmt.Errorf("%q: want comma-separated whole numbers, e.g. 150,200 (or none)", s)
			}
			out = append(out, e)
		}
		return out, nil
	}
	return nil, fmt.Errorf("-%s takes no value on the command line", o.FlagName())
}

// Format writes a value of the option as its flag takes it (a scaled
// option's: ÷ FlagScale).
func (o Option) Format(v any) string {
	if x, ok := v.(float64); ok {
		v = x / o.scale()
	}
	return Format(v)
}

// Format writes a value as a flag takes it: "0.05", "42", "150,200",
// "30m0s"; an empty list is "none".
func Format(v any) string {
	switch x := v.(type) {
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case time.Duration:
		return x.String()
	case []int:
		if len(x) == 0 {
			return "none"
		}
		s := make([]string, len(x))
		for i, n := range x {
			s[i] = strconv.Itoa(n)
		}
		return strings.Join(s, ",")
	}
	return fmt.Sprint(v)
}

// Usage is the option's help text: its doc, what 0 means, its defaults —
// the owners' own cases first, then Default ("resnet18 0.05, lstm 20, ncf
// 0.001"; "resnet18 0.9, else 0"; "0.1").
func (o Option) Usage(cases ...Case) string {
	u := o.Doc
	if o.Zero != "" {
		u += " (0: " + o.Zero + ")"
	}
	if d := o.defaultText(cases); d != "" {
		u += " (default " + d + ")"
	}
	return u
}

// defaultText writes the defaults; "" when there is nothing to say (no
// default, false, an empty string).
func (o Option) defaultText(cases []Case) string {
	var parts []string
	for _, c := range cases {
		parts = append(parts, c.Owner+" "+o.Format(c.Value))
	}
	if o.Default == nil {
		return strings.Join(parts, ", ")
	}
	d := o.Format(o.Default)
	switch {
	case len(parts) > 0:
		return strings.Join(parts, ", ") + ", else " + d
	case d == "" || d == "false" || (d == "0" && o.Kind != Float && o.Kind != Uint):
		return ""
	}
	return d
}

// Validate checks a declaration: a key, a doc, a known kind, a range only
// for numbers and choices only for strings, a default of the kind's type
// that Check accepts.
func (o Option) Validate() error {
	switch {
	case o.Retired != "":
		return nil
	case o.Key == "" || (o.Doc == "" && o.Kind != ValueMap):
		return fmt.Errorf("option %+v needs a Key and a Doc", o)
	case o.Kind < String || o.Kind > ValueMap:
		return fmt.Errorf("option %s: unknown Kind %v", o.Key, o.Kind)
	case (o.Range != Range{} || o.Zero != "") && !o.Kind.numeric():
		return fmt.Errorf("option %s: a range for a %v option", o.Key, o.Kind)
	case math.IsNaN(o.Range.Min) || math.IsNaN(o.Range.Max) || (o.Range.HasMin && o.Range.HasMax && o.Range.Min > o.Range.Max):
		return fmt.Errorf("option %s: the range %v is empty", o.Key, o.Range)
	case len(o.Choices) > 0 && o.Kind != String:
		return fmt.Errorf("option %s: choices for a %v option", o.Key, o.Kind)
	case strings.Contains(o.FlagName(), "_"):
		return fmt.Errorf("option %s: flag -%s has an underscore", o.Key, o.FlagName())
	}
	if o.Default == nil {
		return nil
	}
	if !o.Typed(o.Default) {
		return fmt.Errorf("option %s: default %v is a %T, not of the option's kind %v", o.Key, o.Default, o.Default, o.Kind)
	}
	if _, err := o.Check(o.Default); err != nil {
		return fmt.Errorf("option %s: default: %w", o.Key, err)
	}
	return nil
}

// Values are the options of one owner by key (a method's options in
// run.json's method_options and sparsify.Options.Params), in their kinds'
// Go types once resolved; decoded from JSON, an Int option's value may be
// a float64, which Check converts.
type Values map[string]any

// Int returns the Int option key of resolved values. It panics if the
// option is not a resolved int (a programming error: the owner resolves
// every option it declares before reading them).
func (v Values) Int(key string) int { return resolved[int](v, key, "int") }

// Float returns the Float option key of resolved values; it panics like
// Int.
func (v Values) Float(key string) float64 { return resolved[float64](v, key, "float") }

// Text returns the String option key of resolved values; it panics like
// Int.
func (v Values) Text(key string) string { return resolved[string](v, key, "string") }

func resolved[T any](v Values, key, kind string) T {
	x, ok := v[key].(T)
	if !ok {
		panic(fmt.Sprintf("options: option %q is not a resolved %s option (have %T); declare it", key, kind, v[key]))
	}
	return x
}

// Resolve returns the values of the options decls declares: given ones
// checked and in their kinds' Go types, defaults for the absent ones. A
// given key decls does not declare, or an invalid value, is an error (all
// of them, joined, by key).
func Resolve(decls []Option, given Values) (Values, error) {
	var errs []error
	out := make(Values, len(decls))
	for _, k := range slices.Sorted(maps.Keys(given)) {
		i := slices.IndexFunc(decls, func(o Option) bool { return o.Key == k })
		if i < 0 {
			errs = append(errs, fmt.Errorf("no option %q", k))
			continue
		}
		v, err := decls[i].Check(given[k])
		if err != nil {
			errs = append(errs, err)
		}
		out[k] = v
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for _, o := range decls {
		if _, ok := out[o.Key]; !ok {
			out[o.Key] = o.Default
		}
	}
	return out, nil
}

// Defaults returns a copy of given with every option decls declares and
// given lacks set to its default, and every valid given value in its
// kind's Go type. Invalid values and undeclared keys are copied as they
// are (Resolve refuses them).
func Defaults(decls []Option, given Values) Values {
	out := Values{}
	maps.Copy(out, given)
	for _, o := range decls {
		if v, ok := given[o.Key]; !ok {
			out[o.Key] = o.Default
		} else if c, err := o.Check(v); err == nil {
			out[o.Key] = c
		}
	}
	return out
}

// orList writes "a, b or c".
func orList(s []string) string {
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}
