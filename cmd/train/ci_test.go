package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestCIRacesTheTrainer: the project's test command runs the race detector
// over the packages whose goroutines race most easily, the trainer's (the
// gradient hook, the LAGS pipeline, the background report writer) among
// them.
func TestCIRacesTheTrainer(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", ".ci", "test"))
	if err != nil {
		t.Fatalf("reading the CI test command: %v", err)
	}
	var race []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[0] == "go" && f[1] == "test" && slices.Contains(f, "-race") {
			race = f
			break
		}
	}
	if race == nil {
		t.Fatal(".ci/test has no `go test -race` line")
	}
	for _, pkg := range []string{"./train", "./cmd/train", "./sparsify/...", "./comm/..."} {
		if !slices.Contains(race, pkg) && !slices.Contains(race, "./...") {
			t.Errorf(".ci/test's race line does not cover %s: %s", pkg, strings.Join(race, " "))
		}
	}
	if !slices.Contains(race, "-short") {
		t.Errorf(".ci/test's race line lacks -short (the long runs take too long under the race detector on 2 cores)")
	}
}

// TestCIFuzzesEveryTarget: every fuzz target of the repository has a line
// `fuzz NAME COUNTx ./PKG` in .ci/test, so a new parser's fuzz target
// cannot be forgotten, every budget is an execution count, and every line
// names a target that exists (go test -fuzz of a missing one only warns).
func TestCIFuzzesEveryTarget(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", ".ci", "test"))
	if err != nil {
		t.Fatalf("reading the CI test command: %v", err)
	}
	listed := map[string]string{} // target -> package
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "fuzz" {
			if !strings.HasSuffix(f[2], "x") {
				t.Errorf(".ci/test: %q: the budget must be an execution count (NNNx)", line)
			}
			listed[f[1]] = f[3]
		}
	}
	root := filepath.Join("..", "..")
	found := 0
	seen := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range fuzzFunc.FindAllStringSubmatch(string(src), -1) {
			found++
			seen[m[1]] = true
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			want := "./" + filepath.ToSlash(rel)
			if got, ok := listed[m[1]]; !ok {
				t.Errorf("%s (%s) is not fuzzed by .ci/test: add `fuzz %s 10000x %s`", m[1], path, m[1], want)
			} else if got != want {
				t.Errorf(".ci/test fuzzes %s in %s; it is in %s", m[1], got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("no fuzz targets found")
	}
	for name, pkg := range listed {
		if !seen[name] {
			t.Errorf(".ci/test fuzzes %s in %s, which has no such fuzz target (go test only warns \"no fuzz tests to fuzz\"): drop the line or restore the target", name, pkg)
		}
	}
}

var fuzzFunc = regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)
