package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// The flag values of this file keep "not given" apart from zero: a flag
// that is not on the command line leaves its train.Optional unset (the
// model's default applies), and a method option that is not given stays out
// of the method options. Every float flag refuses NaN and ±Inf.

// errNotFinite is the reason a float flag refuses NaN and ±Inf.
var errNotFinite = errors.New("not a finite number")

// typedValue is a flag value that names its type for the help text.
type typedValue interface {
	flag.Value
	Type() string
}

// parseFinite parses a float flag, refusing NaN and ±Inf, and numbers
// beyond float64's range (which would read as ±Inf).
func parseFinite(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if errors.Is(err, strconv.ErrRange) && math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s is beyond ±%.1e, the largest float64: %w", s, math.MaxFloat64, errNotFinite)
	}
	if err != nil {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s is %w", s, errNotFinite)
	}
	return v, nil
}

// finiteFloat is a float64 flag that refuses NaN and ±Inf.
type finiteFloat struct{ p *float64 }

func (f finiteFloat) Set(s string) error {
	v, err := parseFinite(s)
	if err != nil {
		return err
	}
	*f.p = v
	return nil
}

func (f finiteFloat) String() string {
	if f.p == nil || *f.p == 0 {
		return ""
	}
	return strconv.FormatFloat(*f.p, 'g', -1, 64)
}

func (finiteFloat) Type() string { return "float" }

// durationFlag is a time.Duration flag whose error says what a duration
// looks like (the flag package's own says only "parse error").
type durationFlag struct{ p *time.Duration }

func (f durationFlag) Set(s string) error {
	s = strings.TrimSpace(s)
	d, err := time.ParseDuration(s)
	if err == nil {
		*f.p = d
		return nil
	}
	if _, ferr := strconv.ParseFloat(s, 64); ferr == nil {
		return fmt.Errorf("%q has no unit: write e.g. %ss, %sm or %sms (units h, m, s, ms, us, ns)", s, s, s, s)
	}
	return fmt.Errorf("%q is not a duration: write a number and a unit, e.g. 50us, 2ms, 30s, 1h30m (units h, m, s, ms, us, ns)", s)
}

func (f durationFlag) String() string {
	if f.p == nil || *f.p == 0 {
		return ""
	}
	return f.p.String()
}

func (durationFlag) Type() string { return "duration" }

// optFloat is an optional float flag: set only when given.
type optFloat struct{ p *train.Optional[float64] }

func (f optFloat) Set(s string) error {
	v, err := parseFinite(s)
	if err != nil {
		return err
	}
	*f.p = train.Set(v)
	return nil
}

func (f optFloat) String() string {
	if f.p == nil || !f.p.IsSet() {
		return ""
	}
	return strconv.FormatFloat(f.p.Value(), 'g', -1, 64)
}

func (optFloat) Type() string { return "float" }

// optInt is an optional int flag.
type optInt struct{ p *train.Optional[int] }

func (f optInt) Set(s string) error {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not a whole number", s)
	}
	*f.p = train.Set(v)
	return nil
}

func (f optInt) String() string {
	if f.p == nil || !f.p.IsSet() {
		return ""
	}
	return strconv.Itoa(f.p.Value())
}

func (optInt) Type() string { return "int" }

// optUint is an optional non-negative integer flag.
type optUint struct{ p *train.Optional[uint64] }

func (f optUint) Set(s string) error {
	v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return fmt.Errorf("%q: want a non-negative integer", s)
	}
	*f.p = train.Set(v)
	return nil
}

func (f optUint) String() string {
	if f.p == nil || !f.p.IsSet() {
		return ""
	}
	return strconv.FormatUint(f.p.Value(), 10)
}

func (optUint) Type() string { return "uint" }

// methodFlag sets one method option (sparsify.Param) in a set of method
// options; the method's declared range is checked with the rest of the
// configuration (train.Config.Validate), once the sparsifier is known.
type methodFlag struct {
	p   sparsify.SharedParam
	dst *sparsify.Values
}

func (f methodFlag) Set(s string) error {
	var v any
	switch f.p.Kind {
	case sparsify.Int:
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%q is not a whole number", s)
		}
		v = n
	case sparsify.Float:
		x, err := parseFinite(s)
		if err != nil {
			return err
		}
		v = x
	default:
		v = s
	}
	if *f.dst == nil {
		*f.dst = sparsify.Values{}
	}
	(*f.dst)[f.p.Name] = v
	return nil
}

func (f methodFlag) String() string {
	if f.dst == nil || *f.dst == nil {
		return ""
	}
	if v, ok := (*f.dst)[f.p.Name]; ok {
		return fmt.Sprint(v)
	}
	return ""
}

func (f methodFlag) Type() string { return f.p.Kind.String() }

// addMethodFlags defines one flag per method option that any registered
// sparsifier declares, from the declarations (sparsify.AllParams), and
// returns their names.
func addMethodFlags(fs *flag.FlagSet, dst *sparsify.Values) map[string]bool {
	names := map[string]bool{}
	for _, p := range sparsify.AllParams() {
		fs.Var(methodFlag{p: p, dst: dst}, p.Flag, p.Usage())
		names[p.Flag] = true
	}
	return names
}

// printFlags writes the flags of fs as flag.PrintDefaults does, with the
// types of this file's values, the method options in a section of their
// own.
func printFlags(out io.Writer, fs *flag.FlagSet, method map[string]bool) {
	show := func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		if tv, ok := f.Value.(typedValue); ok {
			name = tv.Type()
		}
		line := "  -" + f.Name
		if name != "" {
			line += " " + name
		}
		usage = strings.ReplaceAll(usage, "\n", "\n    \t")
		fmt.Fprintf(out, "%s\n    \t%s", line, usage)
		if _, typed := f.Value.(typedValue); !typed && f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			if name == "string" {
				fmt.Fprintf(out, " (default %q)", f.DefValue)
			} else {
				fmt.Fprintf(out, " (default %v)", f.DefValue)
			}
		}
		fmt.Fprintln(out)
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !method[f.Name] {
			show(f)
		}
	})
	if len(method) == 0 {
		return
	}
	fmt.Fprintln(out, "\nSparsifier options (each applies to the sparsifiers named; declared beside each method, see go doc ./sparsify):")
	fs.VisitAll(func(f *flag.Flag) {
		if method[f.Name] {
			show(f)
		}
	})
}

// textFlag is a string flag.
type textFlag struct{ p *string }

func (f textFlag) Set(s string) error { *f.p = s; return nil }
func (f textFlag) String() string {
	if f.p == nil {
		return ""
	}
	return *f.p
}
func (textFlag) Type() string { return "string" }

// switchFlag is a boolean flag (-quiet, -quiet=false).
type switchFlag struct{ p *bool }

func (f switchFlag) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q: want true or false", s)
	}
	*f.p = v
	return nil
}
func (f switchFlag) String() string { return strconv.FormatBool(f.p != nil && *f.p) }
func (switchFlag) IsBoolFlag() bool { return true }
func (switchFlag) Type() string     { return "" }

// wholeFlag is an int flag.
type wholeFlag struct{ p *int }

func (f wholeFlag) Set(s string) error {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not a whole number", s)
	}
	*f.p = v
	return nil
}
func (f wholeFlag) String() string {
	if f.p == nil || *f.p == 0 {
		return ""
	}
	return strconv.Itoa(*f.p)
}
func (wholeFlag) Type() string { return "int" }

// scaledFloat is a finite float flag whose configuration value is the
// flag's times scale (-net-bandwidth: Gbit/s on the command line, bytes/s
// in the configuration).
type scaledFloat struct {
	p     *float64
	scale float64
}

func (f scaledFloat) Set(s string) error {
	v, err := parseFinite(s)
	if err != nil {
		return err
	}
	*f.p = v * f.scale
	return nil
}
func (f scaledFloat) String() string {
	if f.p == nil || *f.p == 0 {
		return ""
	}
	return strconv.FormatFloat(*f.p/f.scale, 'g', -1, 64)
}
func (scaledFloat) Type() string { return "float" }

// epochList is a comma-separated list of epochs; "none" is the empty list
// (the flag not given leaves it nil: the model's).
type epochList struct{ p *[]int }

func (f epochList) Set(s string) error {
	if strings.TrimSpace(s) == "none" {
		*f.p = []int{}
		return nil
	}
	var out []int
	for _, x := range strings.Split(s, ",") {
		e, err := strconv.Atoi(strings.TrimSpace(x))
		if err != nil {
			return fmt.Errorf("%q: want comma-separated epoch numbers, e.g. 150,200 (or none)", s)
		}
		out = append(out, e)
	}
	*f.p = out
	return nil
}
func (f epochList) String() string {
	if f.p == nil || *f.p == nil {
		return ""
	}
	return options.Format(*f.p)
}
func (epochList) Type() string { return "list" }

// optionFlag returns the flag value bound to the configuration field p of
// the option o.
func optionFlag(o options.Option, p any) flag.Value {
	switch p := p.(type) {
	case *string:
		return textFlag{p}
	case *bool:
		return switchFlag{p}
	case *int:
		return wholeFlag{p}
	case *float64:
		if o.FlagScale != 0 {
			return scaledFloat{p, o.FlagScale}
		}
		return finiteFloat{p}
	case *time.Duration:
		return durationFlag{p}
	case *[]int:
		return epochList{p}
	case *train.Optional[int]:
		return optInt{p}
	case *train.Optional[float64]:
		return optFloat{p}
	case *train.Optional[uint64]:
		return optUint{p}
	}
	panic(fmt.Sprintf("train: option %s has a field of type %T, which no flag reads", o.Key, p))
}

// addOptionFlags defines the flags of the general options keys (every
// option with a flag of its own when keys is empty, but -gradients, which
// only replay, sweep and advise take) on fs, bound to c's fields, from
// their declarations in package options: name, older names, kind, help
// text and defaults. A string option whose default is the same for every
// model starts with it.
func addOptionFlags(fs *flag.FlagSet, c *train.Config, keys ...string) {
	opts := options.All
	if len(keys) > 0 {
		opts = nil
		for _, k := range keys {
			o, ok := options.Lookup(k)
			if !ok {
				panic("train: no option " + k)
			}
			opts = append(opts, o)
		}
	}
	for _, o := range opts {
		if o.Retired != "" || o.Kind == options.Values || (len(keys) == 0 && o.Key == "gradients") {
			continue
		}
		p := c.Field(o.Key)
		if s, ok := p.(*string); ok && *s == "" && len(o.ByModel) == 0 && o.Default != nil {
			*s = o.Default.(string)
		}
		v := optionFlag(o, p)
		fs.Var(v, o.FlagName(), o.Usage())
		for _, a := range o.Aliases {
			if fs.Lookup(a) == nil {
				fs.Var(v, a, "the older name of -"+o.FlagName())
			}
		}
	}
}

// givenFlags names the flags given on fs's command line, an option's
// older name as its flag.
func givenFlags(fs *flag.FlagSet) map[string]bool {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		if o, ok := options.ByFlag(f.Name); ok {
			given[o.FlagName()] = true
		} else {
			given[f.Name] = true
		}
	})
	return given
}

// gridFlags are the lists train sweep runs and train advise ranks over:
// the sparsifiers, the worker counts, the densities and the networks
// (bandwidths, with one latency), and recorded gradients instead of a
// model. Both commands declare them here (add), each with its own words.
type gridFlags struct {
	sparsifiers []string
	workers     []int
	densities   []float64
	gbits       []float64
	latency     time.Duration
	gradients   string
}

// gridDocs say what each of gridFlags means to a command.
type gridDocs struct {
	gradients, sparsifiers, workers, density, bandwidth, latency string
}

// add declares g's flags on fs, the latency's default 50µs.
func (g *gridFlags) add(fs *flag.FlagSet, doc gridDocs) {
	fs.StringVar(&g.gradients, "gradients", "", doc.gradients)
	fs.Var(listValue[string]{&g.sparsifiers, parseName, "list"}, "sparsifiers", doc.sparsifiers+": "+strings.Join(sparsify.Names(), ", "))
	fs.Var(listValue[int]{&g.workers, parseWorkers, "list"}, "workers", doc.workers)
	fs.Var(listValue[float64]{&g.densities, parseFraction, "list"}, "density", doc.density)
	fs.Var(listValue[float64]{&g.gbits, parseGbit, "list"}, "net-bandwidth", doc.bandwidth)
	g.latency = 50 * time.Microsecond
	fs.Var(durationFlag{&g.latency}, "net-latency", doc.latency+" (default 50µs)")
}
