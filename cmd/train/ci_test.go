package main

import (
	"os"
	"path/filepath"
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
