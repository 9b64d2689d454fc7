package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/smalldisk"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// TestAdviseUnwritableMeasurements: a -measurements file that cannot be
// written (a folder that is a file, /proc, a folder) is refused at once,
// before anything is measured; one the disk cannot take after the
// measuring (the disk filled up) still gets the tables printed, then the
// error.
func TestAdviseUnwritableMeasurements(t *testing.T) {
	data := testenv.SharedData(t, "ml-100k/u.data")
	file := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(file, []byte("a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		filepath.Join(file, "m.json"): "cannot be written (open " + filepath.Join(file, "m.json.tmp") + ": not a directory)",
		t.TempDir():                   "is a folder; give a file name",
	}
	if runtime.GOOS == "linux" {
		cases["/proc/x.json"] = "-measurements /proc/x.json cannot be written"
	}
	for path, want := range cases {
		var out, errOut bytes.Buffer
		t0 := time.Now()
		err := run(context.Background(), []string{"advise", "-model", "ncf", "-data-dir", data, "-workers", "16", "-net-bandwidth", "1", "-measurements", path}, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want %q", path, err, want)
		}
		if errOut.Len() > 0 || out.Len() > 0 || time.Since(t0) > 2*time.Second {
			t.Errorf("%s: measured before refusing (%v): %q %q", path, time.Since(t0), errOut.String(), out.String())
		}
	}
	if testing.Short() || runtime.GOOS != "linux" {
		return // the rest measures this machine (about 8 s)
	}
	disk := smalldisk.Mount(t, 64<<10)
	smalldisk.Fill(t, disk)
	path := filepath.Join(disk, "m.json")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"advise", "-model", "ncf", "-data-dir", data, "-workers", "16", "-net-bandwidth", "1", "-measurements", path}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "the measurements were not saved to "+path) || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(out.String(), "ncf on ml-100k, ") || !strings.Contains(out.String(), "dense") {
		t.Errorf("no table printed when the file could not be saved:\n%s", out.String())
	}
	if left, _ := filepath.Glob(filepath.Join(disk, "*tmp*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
