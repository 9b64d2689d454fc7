package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// TestWhatCannotFitIsOneLine: a batch larger than the data, a batch whose
// memory no machine has, a density below one gradient element and an
// ml-100k whose u.data is cut short each end the command at once with exit
// status 2 and one line naming the problem and the fix, leaving no run
// folder (the batch of a billion used to end in "fatal error: runtime: out
// of memory", 219 lines of stack and a half-made folder; the others
// trained).
func TestWhatCannotFitIsOneLine(t *testing.T) {
	d := testenv.SharedData(t, "ml-100k/u.data")
	b, err := os.ReadFile(filepath.Join(d, "ml-100k", "u.data"))
	if err != nil {
		t.Fatal(err)
	}
	cut := t.TempDir()
	if err := os.MkdirAll(filepath.Join(cut, "ml-100k"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cut, "ml-100k", "u.data"), bytes.Join(bytes.SplitAfter(b, []byte("\n"))[:99_000], nil), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-model", "ncf", "-data-dir", d, "-batch", "1000000000"}, []string{"-batch 1,000,000,000: the worker gets 495,285 training samples per epoch, fewer than one batch; lower -batch (at most 495,285)"}},
		{[]string{"-model", "lstm", "-data-dir", d, "-batch", "1000000"}, []string{"the run needs at least", "of memory (lstm's training program at -batch 1,000,000:", "available (of", "lower -batch (-batch "}},
		{[]string{"-model", "ncf", "-data-dir", d, "-sparsifier", "topk", "-density", "1e-300"}, []string{"-density 1e-300 selects", "less than one; the smallest density is 1/107,761"}},
		{[]string{"-model", "ncf", "-data-dir", cut}, []string{"u.data holds 99000 ratings where the official ml-100k file holds 100000", "delete the folder " + filepath.Join(cut, "ml-100k") + " and download the official archive again (-download)"}},
	} {
		oneLine(t, append(tc.args, "-out", "x"), tc.want)
	}
}
