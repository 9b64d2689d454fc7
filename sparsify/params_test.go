package sparsify

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
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

func TestParamCheck(t *testing.T) {
	i := Param{Name: "n", Flag: "n", Kind: Int, Default: 1, Min: 1, Max: 10, Doc: "d"}
	f := Param{Name: "x", Flag: "x", Kind: Float, Default: 0.0, Min: 1, Max: math.Inf(1), Zero: "off", Doc: "d"}
	s := Param{Name: "s", Flag: "s", Kind: String, Default: "a", Choices: []string{"a", "b"}, Doc: "d"}
	for _, tc := range []struct {
		p       Param
		in      any
		want    any
		wantErr string
	}{
		{i, 3, 3, ""},
		{i, 3.0, 3, ""}, // JSON numbers
		{i, int64(10), 10, ""},
		{i, 0, nil, "outside the valid range: [1, 10]"},
		{i, 11, nil, "outside"},
		{i, 2.5, nil, "not a whole number"},
		{i, math.NaN(), nil, "not a finite number"},
		{i, "3", nil, "not a number"},
		{f, 0.0, 0.0, ""},
		{f, 0, 0.0, ""},
		{f, 1.0, 1.0, ""},
		{f, 1e300, 1e300, ""},
		{f, 0.5, nil, "0 (off) or >= 1"},
		{f, -1.0, nil, "outside"},
		{f, math.Inf(1), nil, "not a finite number"},
		{f, math.Inf(-1), nil, "not a finite number"},
		{f, math.NaN(), nil, "not a finite number"},
		{s, "b", "b", ""},
		{s, "c", nil, `"c" is not one of a or b`},
		{s, 1, nil, "not a string"},
	} {
		t.Run(fmt.Sprintf("%s=%v", tc.p.Name, tc.in), func(t *testing.T) {
			got, err := tc.p.Check(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Check(%v) = %v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Check(%v) = %v (%T), %v; want %v (%T)", tc.in, got, got, err, tc.want, tc.want)
			}
		})
	}
}

func TestParamParse(t *testing.T) {
	lags := mustLookup(t, "lags")
	merge, _ := lags.Param("merge_size")
	ratio, _ := lags.Param("max_ratio")
	sag, _ := mustLookup(t, "spardl").Param("sag")
	for _, tc := range []struct {
		p       Param
		in      string
		want    any
		wantErr string
	}{
		{merge, "1", 1, ""},
		{merge, " 4096 ", 4096, ""},
		{merge, "0", nil, "outside"},
		{merge, "1.5", nil, "not a whole number"},
		{merge, "NaN", nil, "not a whole number"},
		{ratio, "0", 0.0, ""},
		{ratio, "1000", 1000.0, ""},
		{ratio, "NaN", nil, "not a finite number"},
		{ratio, "Inf", nil, "not a finite number"},
		{ratio, "-Inf", nil, "not a finite number"},
		{ratio, "infinity", nil, "not a finite number"},
		{ratio, "x", nil, "not a number"},
		{sag, "rsag", "rsag", ""},
		{sag, "ring", nil, "bruck or rsag"},
	} {
		got, err := tc.p.Parse(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s.Parse(%q) = %v, %v; want an error containing %q", tc.p.Name, tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s.Parse(%q) = %v, %v; want %v", tc.p.Name, tc.in, got, err, tc.want)
		}
	}
}

// TestRegisterRefusesBadDeclarations: a declaration that cannot work panics
// at registration, before any run.
func TestRegisterRefusesBadDeclarations(t *testing.T) {
	ok := Param{Name: "zz_opt", Flag: "zz-opt", Kind: Int, Default: 1, Min: 0, Max: 5, Doc: "d"}
	edit := func(f func(*Param)) []Param { p := ok; f(&p); return []Param{p} }
	for _, tc := range []struct {
		name   string
		params []Param
		want   string
	}{
		{"no flag", edit(func(p *Param) { p.Flag = "" }), "needs a Name, a Flag and a Doc"},
		{"no doc", edit(func(p *Param) { p.Doc = "" }), "needs a Name, a Flag and a Doc"},
		{"default out of range", edit(func(p *Param) { p.Default = 9 }), "default"},
		{"default of another kind", edit(func(p *Param) { p.Default = 1.0 }), "not of the option's kind"},
		{"NaN bound", edit(func(p *Param) { p.Max = math.NaN() }), "range"},
		{"string without choices", edit(func(p *Param) { p.Kind, p.Default = String, "a" }), "Choices"},
		{"declared twice", []Param{ok, ok}, "declared twice"},
		{"name of another method's option, other flag", edit(func(p *Param) { p.Name = "merge_size" }), "clashes with lags"},
		{"flag of another method's option", edit(func(p *Param) { p.Flag = "teams" }), "clashes with spardl"},
		{"shared option of another kind", edit(func(p *Param) { p.Name, p.Flag, p.Kind, p.Default = "teams", "teams", Float, 1.0 }), "clashes"},
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
		{"topk", nil, Values{}, nil},
		{"lags", nil, Values{"merge_size": 8192, "max_ratio": 0.0}, nil},
		{"lags", Values{"merge_size": 1.0, "max_ratio": 10}, Values{"merge_size": 1, "max_ratio": 10.0}, nil},
		{"dragonn", Values{"dense_warmup": 0}, Values{"min_tensor": 204800, "dense_warmup": 0}, nil},
		{"oktopk", nil, Values{"dense_warmup": 512}, nil},
		{"topkdsa", Values{"dense_warmup": 7}, Values{"dense_warmup": 7}, nil},
		{"spardl", nil, Values{"teams": 1, "sag": "bruck"}, nil},
		{"topk", Values{"dense_warmup": 3}, nil, []string{"topk", "dense_warmup is an option of dragonn, oktopk, topkdsa"}},
		{"lags", Values{"bogus": 3}, nil, []string{`no method has an option "bogus"`}},
		{"lags", Values{"merge_size": -1, "max_ratio": math.NaN()}, nil, []string{"option max_ratio: NaN is not a finite number", "option merge_size: -1 is outside"}},
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
		for _, p := range m.Params {
			explicit[p.Name] = p.Default
		}
		for _, v := range []Values{nil, explicit} {
			if _, err := New(m.Name, Options{Density: 0.1, Layout: l, Comm: blSingleComm(t), Params: v}); err != nil {
				t.Errorf("%s with %v: %v", m.Name, v, err)
			}
		}
	}
}

// TestSharedWarmup: the three methods with a dense warm-up share one option
// and one flag, each with its own default, and its usage says so.
func TestSharedWarmup(t *testing.T) {
	var found bool
	for _, s := range AllParams() {
		if s.Name != "dense_warmup" {
			continue
		}
		found = true
		var ms []string
		for _, d := range s.Decls {
			ms = append(ms, d.Method)
		}
		if s.Flag != "dense-warmup" || strings.Join(ms, ",") != "dragonn,oktopk,topkdsa" {
			t.Fatalf("dense_warmup: flag %q, methods %v", s.Flag, ms)
		}
		u := s.Usage()
		for _, w := range []string{"dragonn, oktopk, topkdsa:", "dragonn 200", "oktopk 512", "topkdsa 512", "[0, 2147483647]"} {
			if !strings.Contains(u, w) {
				t.Errorf("usage %q lacks %q", u, w)
			}
		}
	}
	if !found {
		t.Fatal("no option dense_warmup")
	}
}

// optionsDoc is the generated list of method options of the package
// documentation.
func optionsDoc() string {
	var b strings.Builder
	for _, m := range Methods() {
		for _, p := range m.Params {
			item := fmt.Sprintf("%s: %s (-%s), %v, %s, default %s: %s.", m.Name, p.Name, p.Flag, p.Kind, p.Range(), p.Format(p.Default), p.Doc)
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
