package sparsify

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Kind is the type of a method option's value.
type Kind int

const (
	// Int options hold an int.
	Int Kind = iota + 1
	// Float options hold a finite float64.
	Float
	// String options hold one of the option's Choices.
	String
)

// String returns "int", "float" or "string".
func (k Kind) String() string {
	switch k {
	case Int:
		return "int"
	case Float:
		return "float"
	case String:
		return "string"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Param declares one option of a method. Each method declares its options
// once, beside its reducer, in its Method (see Register): that declaration
// is what New resolves and checks Options.Params against, what the
// trainer's configuration checks, command-line flags and help text are
// generated from, and what the package documentation lists ("Method
// options").
//
// Several methods may declare an option of the same Name (each with its own
// default and doc): it is then one option, with one flag, for all of them.
type Param struct {
	// Name is the option's key in Values and in a run's run.json, e.g.
	// "merge_size".
	Name string
	// Flag is the trainer's command-line flag for it, without the dash,
	// e.g. "merge-size".
	Flag string
	// Kind is the type of its values.
	Kind Kind
	// Default is its value when it is not given: an int, a float64 or a
	// string, as Kind says.
	Default any
	// Min and Max bound the values of Int and Float options, both included;
	// Max may be +Inf for no upper bound (values are always finite).
	Min, Max float64
	// Zero, when not empty, makes 0 a valid value too, outside [Min, Max],
	// and says what it means (e.g. "off").
	Zero string
	// Choices are the values of a String option.
	Choices []string
	// Doc says in a few words what the option does.
	Doc string
}

// Values are method options by Param.Name. An option that is absent takes
// its declared default. Resolved values (those a constructor sees in
// Options.Params) are int, float64 or string as the option's Kind says;
// Values decoded from JSON may hold float64 for Int options, which Check
// and Resolve accept when they are whole numbers.
type Values map[string]any

// Int returns the Int option name of resolved values. It panics if the
// option is not declared as an Int by the method (a programming error:
// New resolves every declared option before calling the constructor).
func (v Values) Int(name string) int {
	x, ok := v[name].(int)
	if !ok {
		panic(fmt.Sprintf("sparsify: option %q is not a resolved int option (have %T); declare it in the method's Params", name, v[name]))
	}
	return x
}

// Float returns the Float option name of resolved values; it panics like
// Int.
func (v Values) Float(name string) float64 {
	x, ok := v[name].(float64)
	if !ok {
		panic(fmt.Sprintf("sparsify: option %q is not a resolved float option (have %T); declare it in the method's Params", name, v[name]))
	}
	return x
}

// Text returns the String option name of resolved values; it panics like
// Int.
func (v Values) Text(name string) string {
	x, ok := v[name].(string)
	if !ok {
		panic(fmt.Sprintf("sparsify: option %q is not a resolved string option (have %T); declare it in the method's Params", name, v[name]))
	}
	return x
}

// maxExactInt is the largest integer a float64 holds exactly.
const maxExactInt = 1 << 53

// Check returns v as the option's resolved type (an int, float64 or
// string), or an error saying why v is not a valid value: not a finite
// number, not a whole number, outside the range, not one of the choices.
// The error does not name the option; callers say which one it is.
func (p Param) Check(v any) (any, error) {
	switch p.Kind {
	case Int, Float:
		var x float64
		switch n := v.(type) {
		case int:
			x = float64(n)
		case int32:
			x = float64(n)
		case int64:
			x = float64(n)
		case float32:
			x = float64(n)
		case float64:
			x = n
		default:
			return nil, fmt.Errorf("%v is a %T, not a number", v, v)
		}
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("%v is not a finite number", x)
		}
		if p.Kind == Int && (x != math.Trunc(x) || math.Abs(x) > maxExactInt) {
			return nil, fmt.Errorf("%v is not a whole number", x)
		}
		if !(x == 0 && p.Zero != "") && (x < p.Min || x > p.Max) {
			return nil, fmt.Errorf("%v is outside the valid range: %s", x, p.Range())
		}
		if p.Kind == Int {
			return int(x), nil
		}
		return x, nil
	case String:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%v is a %T, not a string", v, v)
		}
		if !slices.Contains(p.Choices, s) {
			return nil, fmt.Errorf("%q is not one of %s", s, p.Range())
		}
		return s, nil
	}
	return nil, fmt.Errorf("option of unknown kind %v", p.Kind)
}

// Parse reads a value of the option from text (a command-line flag) and
// checks it.
func (p Param) Parse(s string) (any, error) {
	switch p.Kind {
	case Int:
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a whole number", s)
		}
		return p.Check(n)
	case Float:
		x, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", s)
		}
		return p.Check(x)
	}
	return p.Check(s)
}

// Range describes the valid values: "[1, 2147483647]", ">= 0", "0 (off) or
// >= 1", "bruck or rsag".
func (p Param) Range() string {
	if p.Kind == String {
		switch len(p.Choices) {
		case 0:
			return "(no valid value)"
		case 1:
			return p.Choices[0]
		}
		return strings.Join(p.Choices[:len(p.Choices)-1], ", ") + " or " + p.Choices[len(p.Choices)-1]
	}
	var r string
	if math.IsInf(p.Max, 1) {
		r = ">= " + fmtNum(p.Min)
	} else {
		r = "[" + fmtNum(p.Min) + ", " + fmtNum(p.Max) + "]"
	}
	switch {
	case p.Zero == "":
	case 0 < p.Min || 0 > p.Max:
		r = "0 (" + p.Zero + ") or " + r
	default:
		r += " (0: " + p.Zero + ")"
	}
	return r
}

// Format writes a value of the option as text.
func (p Param) Format(v any) string {
	switch x := v.(type) {
	case float64:
		return fmtNum(x)
	case string:
		return x
	}
	return fmt.Sprint(v)
}

// fmtNum writes whole numbers below 2^53 without an exponent.
func fmtNum(x float64) string {
	if x == math.Trunc(x) && math.Abs(x) <= maxExactInt {
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}

// validate checks a declaration (Register panics on a bad one).
func (p Param) validate() error {
	if p.Name == "" || p.Flag == "" || p.Doc == "" {
		return fmt.Errorf("option %+v needs a Name, a Flag and a Doc", p)
	}
	switch p.Kind {
	case Int, Float:
		if math.IsNaN(p.Min) || math.IsInf(p.Min, 0) || math.IsNaN(p.Max) || p.Min > p.Max {
			return fmt.Errorf("option %s: range [%v, %v] is not valid", p.Name, p.Min, p.Max)
		}
	case String:
		if len(p.Choices) == 0 {
			return fmt.Errorf("option %s: a String option needs Choices", p.Name)
		}
	default:
		return fmt.Errorf("option %s: unknown Kind %v", p.Name, p.Kind)
	}
	d, err := p.Check(p.Default)
	if err != nil {
		return fmt.Errorf("option %s: default: %w", p.Name, err)
	}
	if d != p.Default {
		return fmt.Errorf("option %s: default %v (%T) is not of the option's kind %v", p.Name, p.Default, p.Default, p.Kind)
	}
	return nil
}

// Param returns the method's declaration of the option name.
func (m Method) Param(name string) (Param, bool) {
	for _, p := range m.Params {
		if p.Name == name {
			return p, true
		}
	}
	return Param{}, false
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
// resolved type. Invalid values and options the method does not declare are
// copied as they are (Resolve reports them).
func (m Method) Defaults(given Values) Values {
	out := Values{}
	for k, v := range given {
		out[k] = v
	}
	for _, p := range m.Params {
		v, ok := given[p.Name]
		if !ok {
			out[p.Name] = p.Default
		} else if r, err := p.Check(v); err == nil {
			out[p.Name] = r
		}
	}
	return out
}

// Resolve returns the method's options: given values checked and converted
// to their resolved types, defaults for the absent ones. A given option the
// method does not declare, or an invalid value, is an error naming the
// option.
func (m Method) Resolve(given Values) (Values, error) {
	var errs []error
	for _, name := range sortedKeys(given) {
		p, ok := m.Param(name)
		if !ok {
			errs = append(errs, fmt.Errorf("sparsify: %s: %w", m.Name, unknownParam(m.Name, name)))
			continue
		}
		if _, err := p.Check(given[name]); err != nil {
			errs = append(errs, fmt.Errorf("sparsify: %s: option %s: %w", m.Name, name, err))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return m.Defaults(given), nil
}

// ErrUnknownParam is wrapped by the errors about an option the method does
// not declare.
var ErrUnknownParam = errors.New("option does not apply")

// unknownParam says which methods declare the option name, if any.
func unknownParam(method, name string) error {
	if ms := MethodsWithParam(name); len(ms) > 0 {
		return fmt.Errorf("%w: %s is an option of %s, not of %s", ErrUnknownParam, name, strings.Join(ms, ", "), method)
	}
	return fmt.Errorf("%w: no method has an option %q", ErrUnknownParam, name)
}

// MethodsWithParam lists, sorted, the registered methods that declare the
// option name.
func MethodsWithParam(name string) []string {
	var out []string
	for _, m := range Methods() {
		if _, ok := m.Param(name); ok {
			out = append(out, m.Name)
		}
	}
	return out
}

// SharedParam is one option as every method that declares it sees it: the
// unit of the trainer's flags.
type SharedParam struct {
	// Name, Flag and Kind are the same in every declaration.
	Name, Flag string
	Kind       Kind
	// Decls are the declarations, by method name, in method order.
	Decls []MethodParam
}

// MethodParam is one method's declaration of an option.
type MethodParam struct {
	Method string
	Param
}

// AllParams lists every declared option once, sorted by flag, with the
// declarations of every method that has it. Register guarantees that the
// declarations of one name agree on Flag and Kind.
func AllParams() []SharedParam {
	byName := map[string]*SharedParam{}
	for _, m := range Methods() {
		for _, p := range m.Params {
			s := byName[p.Name]
			if s == nil {
				s = &SharedParam{Name: p.Name, Flag: p.Flag, Kind: p.Kind}
				byName[p.Name] = s
			}
			s.Decls = append(s.Decls, MethodParam{m.Name, p})
		}
	}
	out := make([]SharedParam, 0, len(byName))
	for _, s := range byName {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Flag < out[j].Flag })
	return out
}

// Usage is a one-paragraph help text of the option for every method that
// declares it, e.g. "lags: merge threshold in elements, [1, 2147483647]
// (default 8192)"; declarations with the same doc and range are listed
// together.
func (s SharedParam) Usage() string {
	type group struct {
		methods, defaults []string
		doc, rng          string
	}
	var gs []*group
	for _, d := range s.Decls {
		var g *group
		for _, h := range gs {
			if h.doc == d.Doc && h.rng == d.Range() {
				g = h
			}
		}
		if g == nil {
			g = &group{doc: d.Doc, rng: d.Range()}
			gs = append(gs, g)
		}
		g.methods = append(g.methods, d.Method)
		g.defaults = append(g.defaults, d.Method+" "+d.Format(d.Default))
	}
	parts := make([]string, len(gs))
	for i, g := range gs {
		def := "default " + g.defaults[0][len(g.methods[0])+1:]
		if len(g.methods) > 1 {
			def = "default " + strings.Join(g.defaults, ", ")
		}
		parts[i] = fmt.Sprintf("%s: %s; %s (%s)", strings.Join(g.methods, ", "), g.doc, g.rng, def)
	}
	return strings.Join(parts, ". ")
}

func sortedKeys(v Values) []string {
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
