package train

import (
	"math"
	"reflect"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/options"
)

// fieldIndex maps run.json's configuration keys (Config's JSON names) to
// Config's fields.
var fieldIndex = func() map[string]int {
	m := map[string]int{}
	ty := reflect.TypeFor[Config]()
	for i := range ty.NumField() {
		key, _, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ",")
		if key != "" && key != "-" {
			m[key] = i
		}
	}
	return m
}()

// Field returns a pointer to the field of c that holds the general option
// key (its run.json key, as package options declares it): a *string,
// *bool, *int, *float64, *time.Duration, *[]int, *Optional[int],
// *Optional[float64], *Optional[uint64] or *sparsify.Values, as the
// option's Kind says; nil for a key Config does not have. The command
// line's flags, the sweep's command lines and the checks of single
// options reach the configuration through it.
func (c *Config) Field(key string) any {
	i, ok := fieldIndex[key]
	if !ok {
		return nil
	}
	return reflect.ValueOf(c).Elem().Field(i).Addr().Interface()
}

// optionalValue is an Optional of any Number type.
type optionalValue interface {
	// number returns the value as a float64 and whether it is set.
	number() (float64, bool)
	// fill sets the value to the declared default d (an int, uint64 or
	// float64) when it is unset.
	fill(d any)
}

func (o *Optional[T]) number() (float64, bool) { return float64(o.v), o.set }

func (o *Optional[T]) fill(d any) {
	switch x := d.(type) {
	case int:
		o.orDefault(T(x))
	case uint64:
		o.orDefault(T(x))
	case float64:
		o.orDefault(T(x))
	default:
		panic("train: option default of type " + reflect.TypeOf(d).String())
	}
}

// text returns the value of the String option key ("" for other kinds).
func (c *Config) text(key string) string {
	if p, ok := c.Field(key).(*string); ok {
		return *p
	}
	return ""
}

// fillDefaults sets every unset option that has a declared default for
// c's model (options.Option's Default and ByModel) and applies (its When),
// the options without a condition first, so that a condition reads the
// value of the option it names after that option's default.
func (c *Config) fillDefaults() {
	for _, conditional := range []bool{false, true} {
		for _, o := range options.All {
			d := o.DefaultFor(c.Model)
			if o.Retired != "" || (o.When != "") != conditional || d == nil || !o.Applies(c.text) {
				continue
			}
			switch p := c.Field(o.Key).(type) {
			case *string:
				if *p == "" {
					*p = d.(string)
				}
			case *[]int:
				if *p == nil {
					*p = append([]int{}, d.([]int)...)
				}
			case optionalValue:
				p.fill(d)
			}
		}
	}
}

// checkOptions checks each option on its own, as package options declares
// it: every number finite (then, if one is not, nothing else), every
// option that applies (its When; skip leaves others out) set where
// Defaults sets it (the optimizer's own values may be unset, which reads
// as 0), in its range and one of its choices. Validate adds
// the rules that tie options together.
func (c *Config) checkOptions(skip func(key string) bool, bad func(string, ...any)) {
	finite := true
	for _, o := range options.All {
		var x float64
		switch p := c.Field(o.Key).(type) {
		case *float64:
			x = *p
		case *Optional[float64]:
			x = p.Value()
		default:
			continue
		}
		if math.IsNaN(x) || math.IsInf(x, 0) {
			bad("-%s %v is not a finite number", o.FlagName(), x/o.Scale())
			finite = false
		}
	}
	if !finite {
		return
	}
	for _, o := range options.All {
		if o.Retired != "" || skip(o.Key) || !o.Applies(c.text) {
			continue
		}
		flag := o.FlagName()
		check := func(x float64, shown string) {
			if msg := o.CheckNumber(x, shown); msg != "" {
				bad("%s", msg)
			}
		}
		switch p := c.Field(o.Key).(type) {
		case optionalValue:
			x, set := p.number()
			if !set && !strings.HasPrefix(o.When, "optimizer=") {
				// The optimizer's own values read as 0 when unset.
				bad("-%s is unset; call Config.Defaults before Validate", flag)
				continue
			}
			check(x, options.Format(x))
		case *int:
			check(float64(*p), options.Format(*p))
		case *float64:
			check(*p/o.Scale(), options.Format(*p/o.Scale()))
		case *time.Duration:
			check(float64(*p), options.Format(*p))
		case *[]int:
			for _, e := range *p {
				if !o.Range.Contains(float64(e)) {
					check(float64(e), options.Format(*p))
					break
				}
			}
		case *string:
			if msg := o.CheckChoice(*p); msg != "" {
				bad("%s", msg)
			}
		}
	}
}

// declaredDefault is the declared default of the String option key, for
// every model.
func declaredDefault(key string) string {
	o, _ := options.Lookup(key)
	d, _ := o.Default.(string)
	return d
}
