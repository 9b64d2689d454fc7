package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// optionValue is the flag of one option: a general option of a
// train.Config, a method option in a set of method options, or a number of
// a subcommand's own. It reads its text with the option's parser
// (options.Option.Parse, which refuses NaN and ±Inf for every float) and
// keeps "not given" apart from zero: a flag that is not on the command
// line leaves its option unset (the model's or the method's default
// applies). Each option's range is checked with the rest of the
// configuration (train.Config.Validate), once the model and the method
// are known.
type optionValue struct {
	o   options.Option
	get func() any
	set func(any)
}

func (v optionValue) Set(s string) error {
	x, err := v.o.Parse(s)
	if err != nil {
		return err
	}
	v.set(x)
	return nil
}

func (v optionValue) String() string {
	if v.get == nil {
		return ""
	}
	if x := v.get(); x != nil {
		return v.o.Format(x)
	}
	return ""
}

// Type names the flag's kind in the help ("" for a switch).
func (v optionValue) Type() string {
	if v.o.Kind == options.Bool {
		return ""
	}
	return v.o.Kind.String()
}

// IsBoolFlag makes a Bool option a switch (-quiet, -quiet=false).
func (v optionValue) IsBoolFlag() bool { return v.o.Kind == options.Bool }

// typedValue is a flag value that names its type for the help text.
type typedValue interface {
	flag.Value
	Type() string
}

// bind is the flag of option o held in *p, a variable of its kind's Go
// type.
func bind[T any](o options.Option, p *T) optionValue {
	return optionValue{o, func() any { return *p }, func(x any) { *p = x.(T) }}
}

// configValue is the flag of the general option o of c.
func configValue(o options.Option, c *train.Config) optionValue {
	return optionValue{o, func() any { return c.Get(o.Key) }, func(x any) { c.Set(o.Key, x) }}
}

// parseFloat reads a finite number.
func parseFloat(s string) (float64, error) {
	x, err := options.Option{Kind: options.Float}.Parse(s)
	if err != nil {
		return 0, err
	}
	return x.(float64), nil
}

// addMethodFlags defines one flag per method option that any registered
// sparsifier declares (sparsify.Method.Params), setting it in *dst, and
// returns their names. Its help names the methods that have it and each
// one's default.
func addMethodFlags(fs *flag.FlagSet, dst *options.Values) map[string]bool {
	type shared struct {
		o       options.Option
		methods []string
		cases   []options.Case
	}
	byKey := map[string]*shared{}
	for _, m := range sparsify.Methods() {
		for _, o := range m.Params {
			s := byKey[o.Key]
			if s == nil {
				s = &shared{o: o}
				byKey[o.Key] = s
			}
			s.methods = append(s.methods, m.Name)
			s.cases = append(s.cases, options.Case{Owner: m.Name, Value: o.Default})
		}
	}
	names := map[string]bool{}
	for _, s := range byKey {
		o := s.o
		usage := o.Usage()
		if slices.ContainsFunc(s.cases, func(c options.Case) bool { return o.Format(c.Value) != o.Format(o.Default) }) {
			o.Default = nil
			usage = o.Usage(s.cases...)
		}
		key := o.Key
		fs.Var(optionValue{o, func() any { return (*dst)[key] }, func(x any) {
			if *dst == nil {
				*dst = options.Values{}
			}
			(*dst)[key] = x
		}}, o.FlagName(), strings.Join(s.methods, ", ")+": "+usage)
		names[o.FlagName()] = true
	}
	return names
}

// isMethodFlag reports whether name is the flag of a method option.
func isMethodFlag(name string) bool {
	return slices.ContainsFunc(sparsify.Methods(), func(m sparsify.Method) bool {
		return slices.ContainsFunc(m.Params, func(o options.Option) bool { return o.FlagName() == name })
	})
}

// printFlags writes the flags of fs as flag.PrintDefaults does, with the
// types of the options' values, the method options in a section of their
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

// addOptionFlags defines the flags of the general options keys (every
// option with a flag of its own when keys is empty, but -gradients, which
// only replay, sweep and advise take) on fs, bound to c's fields, from
// their declarations in package options: name, older names, kind, help
// text and defaults (with the models', train.OptionUsage). A string option
// whose default is the same for every model starts with it.
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
		if o.Retired != "" || o.Kind == options.ValueMap || (len(keys) == 0 && o.Key == "gradients") {
			continue
		}
		if o.Kind == options.String && c.Get(o.Key) == "" && len(train.ModelDefaults(o.Key)) == 0 && o.Default != nil {
			c.Set(o.Key, o.Default)
		}
		v := configValue(o, c)
		fs.Var(v, o.FlagName(), train.OptionUsage(o))
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
	fs.Var(listValue[string]{&g.sparsifiers, parseName}, "sparsifiers", doc.sparsifiers+": "+strings.Join(sparsify.Names(), ", "))
	fs.Var(listValue[int]{&g.workers, parseWorkers}, "workers", doc.workers)
	fs.Var(listValue[float64]{&g.densities, parseFraction}, "density", doc.density)
	fs.Var(listValue[float64]{&g.gbits, parseGbit}, "net-bandwidth", doc.bandwidth)
	g.latency = 50 * time.Microsecond
	o, _ := options.Lookup("net_latency")
	fs.Var(bind(o, &g.latency), "net-latency", doc.latency+" (default 50µs)")
}
