// Package realdata lets tests find the project's real data sets (the shared
// data folder, ../shared/data next to the repository) and decides what a
// missing file means. By default a test that needs missing data skips; with
// the environment variable SPARSEGRAD_DATA=require (CI sets it, as
// REPORTS_BROWSER=require for the browser) it fails instead, so that no
// end-to-end test or recorded proof passes silently without its data.
package realdata

import (
	"os"
	"path/filepath"
	"testing"
)

// Env is the environment variable of the switch; Require its value that
// makes missing data fail.
const (
	Env     = "SPARSEGRAD_DATA"
	Require = "require"
)

// Dir returns dir, the data folder as the caller's package sees it, if every
// probe (a path relative to dir) exists. Otherwise the test skips, or fails
// when SPARSEGRAD_DATA=require; any other non-empty value of SPARSEGRAD_DATA
// fails the test, so that a typo does not turn the switch off.
func Dir(t testing.TB, dir string, probes ...string) string {
	t.Helper()
	switch v := os.Getenv(Env); v {
	case "", Require:
	default:
		t.Fatalf("%s=%q is not a valid setting: use %s=%s to make missing real data fail, or leave it unset to skip", Env, v, Env, Require)
		return dir
	}
	for _, p := range probes {
		path := filepath.Join(dir, p)
		if _, err := os.Stat(path); err != nil {
			if os.Getenv(Env) == Require {
				t.Fatalf("real data %s is missing (%v) and %s=%s: put the data sets in the shared data folder (see data's Download and the README), or unset %s to skip", path, err, Env, Require, Env)
				return dir
			}
			t.Skipf("skipping: real data %s not found (%v); set %s=%s to make this a failure", path, err, Env, Require)
			return dir
		}
	}
	return dir
}
