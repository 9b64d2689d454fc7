package train

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/rundir"
)

// snapshot returns every file under dir (relative path: content) and
// every folder (relative path ending in "/").
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			m[rel+"/"] = ""
			return nil
		}
		b, err := os.ReadFile(p)
		m[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// sameSnapshot says how b differs from a ("" when it does not).
func sameSnapshot(a, b map[string]string) string {
	var diffs []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			diffs = append(diffs, "removed "+k)
		} else if v != w {
			diffs = append(diffs, "changed "+k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, "added "+k)
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, ", ")
}

// TestRefusedResumeWritesNothing: a resume refused because its newest
// checkpoint is damaged (the shared part, or one rank's part) changes
// nothing in the run's folder: no resume listed in run.json, no report
// written or announced, no log lines, no lock left.
func TestRefusedResumeWritesNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		workers int
		damage  string // file of the newest checkpoint to damage
	}{
		{"shared part", 1, rundir.SharedFile},
		{"shared part, 2 workers", 2, rundir.SharedFile},
		{"rank 1's part", 2, rundir.ShardFile(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ncfConfig(t, tc.workers, 6)
			c.CheckpointEvery = 2
			if err := Run(context.Background(), c, Options{Report: func(string) error { return nil }}); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(rundir.CheckpointDir(c.Out, 6), tc.damage)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0xff
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, c.Out)
			var out bytes.Buffer
			reports := 0
			err = Run(context.Background(), Config{Resume: c.Out, Steps: 10, Quiet: false}, Options{Stdout: &out, Progress: &out, Given: map[string]bool{"steps": true, "quiet": true},
				Report: func(string) error { reports++; return nil }})
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "step-000000006") {
				t.Fatalf("err %v, want the damaged checkpoint refused", err)
			}
			if d := sameSnapshot(before, snapshot(t, c.Out)); d != "" {
				t.Errorf("the refused resume changed the run's folder: %s", d)
			}
			if reports != 0 || strings.Contains(out.String(), "report") {
				t.Errorf("the refused resume wrote %d reports; output %q", reports, out.String())
			}
		})
	}
}

// stepFails fails every worker's first training step.
func stepFails(m models.Model) models.Model { return &failingModel{Model: m, failAt: 1} }

// TestFailureBeforeTheFirstStepLeavesNothing: a new run that fails before
// its first step is done removes what it wrote: the folder it created, or
// its own files in an empty folder that was there, and says that the same
// command works again, which it does. A folder of other files is refused.
func TestFailureBeforeTheFirstStepLeavesNothing(t *testing.T) {
	for _, workers := range []int{1, 2} {
		c := ncfConfig(t, workers, 2)
		c.Quiet = false
		// A folder the run creates.
		c.Out = filepath.Join(t.TempDir(), "new", "run")
		var out bytes.Buffer
		err := Run(context.Background(), c, Options{Stdout: &out, Progress: &out, wrapModel: stepFails, Report: func(string) error { return nil }})
		if err == nil || !strings.Contains(err.Error(), "worker died") || !strings.HasSuffix(err.Error(), "nothing of the run was kept: run the same command again") {
			t.Fatalf("%d workers: err %v", workers, err)
		}
		if _, serr := os.Stat(c.Out); !errors.Is(serr, os.ErrNotExist) {
			t.Errorf("%d workers: the failed run left %s: %v", workers, c.Out, snapshot(t, c.Out))
		}
		if strings.Contains(out.String(), "report") {
			t.Errorf("%d workers: a report was announced: %q", workers, out.String())
		}
		// An empty folder that was there.
		c.Out = t.TempDir()
		before := snapshot(t, c.Out)
		if err := Run(context.Background(), c, Options{wrapModel: stepFails}); err == nil {
			t.Fatal("the failing run succeeded")
		}
		if d := sameSnapshot(before, snapshot(t, c.Out)); d != "" {
			t.Errorf("%d workers: the failed run changed the folder it was given: %s", workers, d)
		}
		// As the message says, the same command works again.
		if err := Run(context.Background(), c, Options{}); err != nil {
			t.Fatalf("%d workers: the same command again: %v", workers, err)
		}
		// A folder of the user's files is refused before anything is
		// written.
		c.Out = t.TempDir()
		if err := os.WriteFile(filepath.Join(c.Out, "notes.txt"), []byte("mine"), 0o644); err != nil {
			t.Fatal(err)
		}
		before = snapshot(t, c.Out)
		if err := Run(context.Background(), c, Options{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "notes.txt") {
			t.Fatalf("%d workers: a folder of other files as -out: %v", workers, err)
		}
		if d := sameSnapshot(before, snapshot(t, c.Out)); d != "" {
			t.Errorf("%d workers: the refused run changed the folder it was given: %s", workers, d)
		}
	}
}
