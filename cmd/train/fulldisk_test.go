//go:build linux

package main

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/smalldisk"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// TestFullDiskFails resumes a finished run (one epoch, its report written)
// for a second epoch on a disk that has since filled up (a 4 MiB tmpfs,
// topped up to 256 KiB of room): the checkpoint at the end of the epoch
// cannot be written, and the command exits non-zero with one line naming
// the steps lost and the checkpoint to resume from; the report of the
// first epoch, which the new one could not replace, is removed instead of
// passing for the run's.
func TestFullDiskFails(t *testing.T) {
	d := testenv.SharedData(t, "ml-100k/u.data")
	disk := smalldisk.Mount(t, 4<<20)
	run := filepath.Join(disk, "run")
	report := filepath.Join(run, "report.html")
	r := trainCmd(t, disk, "-model", "ncf", "-dataset", "ml-100k", "-data-dir", d, "-batch", "4096", "-epochs", "1", "-out", run)
	if r.code != 0 {
		t.Fatalf("the first epoch:\n%v", r)
	}
	if _, err := os.Stat(report); err != nil {
		t.Fatalf("the first epoch wrote no report: %v", err)
	}
	filler := smalldisk.Fill(t, disk)
	st, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filler, st.Size()-256<<10); err != nil {
		t.Fatal(err)
	}
	r = trainCmd(t, disk, "-resume", run, "-epochs", "2")
	t.Logf("the resume on the full disk:\n%v", r)
	ls := lines(r.stderr)
	if r.code == 0 || len(ls) != 1 {
		t.Fatalf("want a non-zero exit and one line on stderr")
	}
	for _, want := range []string{
		"stopped after step 240: its checkpoint was not written:", "no space left on device",
		"steps 121 to 240 are lost; the last checkpoint is " + filepath.Join(run, "checkpoints", "step-000000120") + " (step 120)",
		"-resume " + run,
	} {
		if !strings.Contains(ls[0], want) {
			t.Errorf("the error lacks %q", want)
		}
	}
	if !strings.Contains(r.stdout, "warning: report.html not written:") || !strings.Contains(r.stdout, "the earlier report.html, of an older state of the run, was removed") {
		t.Errorf("the output does not say that the report was not written and the old one removed")
	}
	if regexp.MustCompile(`(?m)^report: `).MatchString(r.stdout) {
		t.Errorf("the output announces a report")
	}
	if _, err := os.Stat(report); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the first epoch's report.html is still there (stat: %v), as if it were the run's", err)
	}
}
