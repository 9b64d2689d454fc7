package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWhatCannotFitIsOneLine: a batch larger than the data, a batch whose
// memory no machine has and a density below one gradient element each end
// the command at once with exit status 2 and one line naming the problem
// and the fix, leaving no run folder (the batch of a billion used to end
// in "fatal error: runtime: out of memory", 219 lines of stack and a
// half-made folder).
func TestWhatCannotFitIsOneLine(t *testing.T) {
	d := sharedData(t)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-model", "ncf", "-batch", "1000000000"}, []string{"-batch 1,000,000,000: the worker gets 495,285 training samples per epoch, fewer than one batch; lower -batch (at most 495,285)"}},
		{[]string{"-model", "lstm", "-batch", "1000000"}, []string{"the run needs at least", "of memory (lstm's training program at -batch 1,000,000:", "available (of", "lower -batch (-batch "}},
		{[]string{"-model", "ncf", "-sparsifier", "topk", "-density", "1e-300"}, []string{"-density 1e-300 selects", "less than one; the smallest density is 1/107,761"}},
	} {
		dir := t.TempDir()
		r := trainCmd(t, dir, append(tc.args, "-data-dir", d, "-out", "x")...)
		ls := lines(r.stderr)
		if r.code != 2 || len(ls) != 1 || r.stdout != "" {
			t.Errorf("train %v: want exit 2 and one line on stderr, got\n%v", tc.args, r)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(ls[0], w) {
				t.Errorf("train %v: %q lacks %q", tc.args, ls[0], w)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "x")); err == nil {
			t.Errorf("train %v: a refused command left a run folder", tc.args)
		}
	}
}
