package sparsify

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/options"
)

var updateOptionsDoc = flag.Bool("update-options-doc", false, "rewrite the generated list of method options in doc.go")

func mustLookup(t testing.TB, name string) Method {
	t.Helper()
	m, ok := Lookup(name)
	if !ok {
		t.Fatalf("method %q not registered", name)
	}
	return m
}

// TestDeclaredOptionsCheck: the methods' declarations check and read
// values as package options does, with their own ranges.
func TestDeclaredOptionsCheck(t *testing.T) {
	lags := mustLookup(t, "lags")
	merge, _ := lags.Param("merge_size")
	ratio, _ := lags.Param("max_ratio")
	sag, _ := mustLookup(t, "spardl").Param("sag")
	for _, tc := range []struct {
		o       options.Option
		in      string
		want    any
		wantErr string
	}{
		{merge, "1", 1, ""},
		{merge, " 4096 ", 4096, ""},
		{merge, "0", nil, "-merge-size 0 must be in [1, 2147483647]"},
		{merge, "1.5", nil, "not a whole number"},
		{ratio, "0", 0.0, ""},
		{ratio, "1000", 1000.0, ""},
		{ratio, "0.5", nil, "-max-ratio 0.5 must be 0 (off) or >= 1"},
		{ratio, "NaN", nil, "not a finite number"},
		{sag, "rsag", "rsag", ""},
		{sag, "ring", nil, `-sag "ring": use bruck or rsag`},
	} {
		got, err := tc.o.Parse(tc.in)
		if err == nil {
			got, err = tc.o.Check(got)
		}
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s %q: %v, %v; want an error containing %q", tc.o.Key, tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s %q: %v, %v; want %v", tc.o.Key, tc.in, got, err, tc.want)
		}
	}
}

// TestRegisterRefusesBadDeclarations: a declaration that cannot work panics
// at registration, before any run.
func TestRegisterRefusesBadDeclarations(t *testing.T) {
	ok := options.Option{Key: "zz_opt", Kind: options.Int, Default: 1, Optional: true, Range: options.Within(0, 5, "[]"), Doc: "d"}
	edit := func(f func(*options.Option)) []options.Option { o := ok; f(&o); return []options.Option{o} }
	for _, tc := range []struct {
		name   string
		params []options.Option
		want   string
	}{
		{"no doc", edit(func(o *options.Option) { o.Doc = "" }), "needs a Key and a Doc"},
		{"default out of range", edit(func(o *options.Option) { o.Default = 9 }), "default"},
		{"default of another kind", edit(func(o *options.Option) { o.Default = 1.0 }), "not of the option's kind"},
		{"NaN bound", edit(func(o *options.Option) { o.Range.Max = math.NaN() }), "range"},
		{"a list", edit(func(o *options.Option) { o.Kind, o.Default = options.IntList, []int{1} }), "an Int, a Float or a String"},
		{"declared twice", []options.Option{ok, ok}, "declared twice"},
		{"a general option's key", edit(func(o *options.Option) { o.Key = "density" }), "general option"},
		{"a general option's flag", edit(func(o *options.Option) { o.Flag = "wd" }), "general option weight_decay's"},
		{"key of another method's option, another doc", edit(func(o *options.Option) { o.Key = "merge_size" }), "clashes with lags"},
		{"flag of another method's option", edit(func(o *options.Option) { o.Flag = "teams" }), "clashes with spardl"},
		{"shared option of another kind", edit(func(o *options.Option) {
			o.Key, o.Kind, o.Default, o.Range, o.Doc = "teams", options.Float, 1.0, options.Within(1, math.MaxInt32, "[]"), "number of teams G (must divide the number of workers)"
		}), "clashes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), tc.want) {
					t.Fatalf("Register: panic %v, want one containing %q", r, tc.want)
				}
			}()
			Register(Method{Name: "zz-" + tc.name, New: newDense, Params: tc.params})
		})
	}
	if _, ok := Lookup("zz-no flag"); ok {
		t.Fatal("a refused method was registered")
	}
}

// TestResolve: defaults fill absent options, given ones are checked and
// converted, and options of other methods are refused with the methods that
// have them.
func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		method  string
		given   Values
		want    Values
		wantErr []string
	}{
		{"dense", nil, Values{"bucket_mb": 25.0}, nil},
		{"topk", nil, Values{"min_compress_size": 0}, nil},
		{"topk", Values{"min_compress_size": 100.0}, Values{"min_compress_size": 100}, nil},
		{"lags", nil, Values{"merge_size": 8192, "max_ratio": 0.0, "min_compress_size": 0}, nil},
		{"lags", Values{"merge_size": 1.0, "max_ratio": 10}, Values{"merge_size": 1, "max_ratio": 10.0, "min_compress_size": 0}, nil},
		{"dragonn", Values{"dense_warmup": 0}, Values{"min_tensor": 204800, "dense_warmup": 0, "min_compress_size": 0}, nil},
		{"oktopk", nil, Values{"dense_warmup": 512, "min_compress_size": 0}, nil},
		{"topkdsa", Values{"dense_warmup": 7}, Values{"dense_warmup": 7, "min_compress_size": 0}, nil},
		{"spardl", nil, Values{"teams": 1, "sag": "bruck", "min_compress_size": 0}, nil},
		{"dense", Values{"min_compress_size": 3}, nil, []string{"dense", "min_compress_size is an option of"}},
		{"topk", Values{"dense_warmup": 3}, nil, []string{"topk", "dense_warmup is an option of dragonn, oktopk, topkdsa"}},
		{"lags", Values{"bogus": 3}, nil, []string{`no method has an option "bogus"`}},
		{"lags", Values{"merge_size": -1, "max_ratio": math.NaN()}, nil, []string{"lags: -max-ratio NaN is not a finite number", "-merge-size -1 must be in [1, 2147483647]"}},
	} {
		t.Run(fmt.Sprintf("%s/%v", tc.method, tc.given), func(t *testing.T) {
			got, err := mustLookup(t, tc.method).Resolve(tc.given)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("Resolve = %v, want an error", got)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				if strings.Contains(err.Error(), "does not apply") != errors.Is(err, ErrUnknownParam) {
					t.Errorf("error %q: errors.Is(ErrUnknownParam) = %v", err, errors.Is(err, ErrUnknownParam))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("Resolve(%v) = %v, want %v", tc.given, got, tc.want)
			}
			for k, v := range got {
				if fmt.Sprintf("%T", v) != fmt.Sprintf("%T", tc.want[k]) {
					t.Errorf("%s: %T, want %T", k, v, tc.want[k])
				}
			}
		})
	}
}

// TestEveryMethodBuildsWithDeclaredDefaults: every registered method builds
// with its defaults, and with every option set to its default explicitly.
func TestEveryMethodBuildsWithDeclaredDefaults(t *testing.T) {
	l, _ := FlatLayout(100)
	for _, m := range Methods() {
		explicit := Values{}
		for _, o := range m.Params {
			explicit[o.Key] = o.Default
		}
		for _, v := range []Values{nil, explicit} {
			if _, err := New(m.Name, Options{Density: 0.1, Layout: l, Comm: blSingleComm(t), Params: v}); err != nil {
				t.Errorf("%s with %v: %v", m.Name, v, err)
			}
		}
	}
}

// TestSharedWarmup: the three methods with a dense warm-up share one
// option, declared alike but for each method's default.
func TestSharedWarmup(t *testing.T) {
	ms := MethodsWithParam("dense_warmup")
	if strings.Join(ms, ",") != "dragonn,oktopk,topkdsa" {
		t.Fatalf("dense_warmup: methods %v", ms)
	}
	var defaults []any
	for _, name := range ms {
		o, _ := mustLookup(t, name).Param("dense_warmup")
		if o.FlagName() != "dense-warmup" || o.Doc != "dense all-reduce iterations before sparsifying" {
			t.Errorf("%s: %+v", name, o)
		}
		defaults = append(defaults, o.Default)
	}
	if fmt.Sprint(defaults) != "[200 512 512]" {
		t.Errorf("defaults %v", defaults)
	}
}

// optionsDoc is the generated list of method options of the package
// documentation.
func optionsDoc() string {
	var b strings.Builder
	for _, m := range Methods() {
		for _, o := range m.Params {
			item := fmt.Sprintf("%s: %s (-%s), %v, %s, default %s: %s.", m.Name, o.Key, o.FlagName(), o.Kind, o.Valid(), o.Format(o.Default), o.Doc)
			b.WriteString(wrapComment("//   - ", "//     ", item, 78))
		}
	}
	return b.String()
}

// wrapComment wraps text into comment lines of at most width columns (a
// longer word stays whole).
func wrapComment(first, rest, text string, width int) string {
	var b strings.Builder
	line := first
	empty := true
	for _, w := range strings.Fields(text) {
		if !empty && len([]rune(line))+1+len([]rune(w)) > width {
			b.WriteString(line + "\n")
			line, empty = rest, true
		}
		if !empty {
			line += " "
		}
		line += w
		empty = false
	}
	b.WriteString(line + "\n")
	return b.String()
}

// TestOptionsDoc: the package documentation lists every declared option as
// the declarations say (go generate ./sparsify rewrites the list).
func TestOptionsDoc(t *testing.T) {
	const marker = "// method: name (trainer flag), kind, valid values, default, meaning.\n"
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, marker)
	j := strings.Index(doc, "package sparsify\n")
	if i < 0 || j < i {
		t.Fatalf("doc.go lacks the line %q before the package clause", marker)
	}
	want := doc[:i+len(marker)] + "//\n" + optionsDoc() + doc[j:]
	if want == doc {
		return
	}
	if *updateOptionsDoc {
		if err := os.WriteFile("doc.go", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("doc.go's list of method options is out of date; run go generate ./sparsify. Want:\n%s", optionsDoc())
}
