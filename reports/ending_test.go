package reports

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/rundir"
)

// runWithStatus copies the micro-4w run into a new folder with run.json's
// status and end set, and returns the folder.
func runWithStatus(t *testing.T, status string, end *metrics.End) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"run.json", "metrics.jsonl"} {
		b, err := os.ReadFile(filepath.Join(td("micro-4w"), f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "run.json" {
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			m["status"], m["end"] = status, end
			if b, err = json.Marshal(m); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestReportSaysHowTheRunEnded: an interrupted, killed or failed run's page
// says in its headline that the run is unfinished and how far it got, and
// calls its last evaluation "last", not "final"; a run that is training
// now reads as running; a completed run's page reads as before, and a
// comparison marks the unfinished run's value.
func TestReportSaysHowTheRunEnded(t *testing.T) {
	page := func(dir string) string {
		t.Helper()
		b, err := RunPage(context.Background(), mustRead(t, dir), offline)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	title := func(p string) string {
		_, rest, _ := strings.Cut(p, "<title>")
		s, _, _ := strings.Cut(rest, "</title>")
		return s
	}
	r := mustRead(t, td("micro-4w"))
	last := r.Steps[len(r.Steps)-1].Step
	epochs := r.Info.Config.Epochs
	perEpoch := max(1, last/2) // two epochs done, or the last one too
	total := perEpoch * epochs
	ck := filepath.Join("runs", "x", "checkpoints", "step-000000002")
	end := &metrics.End{Time: time.Now(), Step: last, TotalSteps: total, StepsPerEpoch: perEpoch, Checkpoint: ck, CheckpointStep: 2}
	done := last / perEpoch

	p := page(runWithStatus(t, metrics.StatusInterrupted, end))
	want := "unfinished: interrupted after step " + metrics.Thousands(last) + " of " + metrics.Thousands(total)
	if !strings.Contains(title(p), want) || !strings.Contains(title(p), fmt.Sprintf("(%d of %d epochs done)", done, epochs)) {
		t.Errorf("interrupted run's title %q, want it to contain %q and the epochs done (%d of %d)", title(p), want, done, epochs)
	}
	if strings.Contains(p, "<td>final ") || !strings.Contains(p, "last (unfinished run)") || !strings.Contains(p, ck) {
		t.Error("interrupted run's page calls its last evaluation final, or does not name its last checkpoint")
	}

	// Killed: run.json says running, nobody holds the lock.
	killed := runWithStatus(t, metrics.StatusRunning, nil)
	if p := page(killed); !strings.Contains(title(p), "unfinished: killed after step "+metrics.Thousands(last)) {
		t.Errorf("killed run's title %q", title(p))
	}
	// Running: a process holds the lock.
	unlock, err := rundir.Lock(killed)
	if err != nil {
		t.Fatal(err)
	}
	if p := page(killed); !strings.Contains(title(p), "unfinished: running") || !strings.Contains(p, "when this page was written") {
		t.Errorf("running run's title %q", title(p))
	}
	unlock()

	failed := runWithStatus(t, metrics.StatusFailed, &metrics.End{Step: last, Reason: "step 9 failed on rank 2: boom"})
	if p := page(failed); !strings.Contains(title(p), "unfinished: failed after step") || !strings.Contains(p, "boom") {
		t.Errorf("failed run's title %q, or its reason missing", title(p))
	}

	end.Step, end.Checkpoint = total, ""
	completed := runWithStatus(t, metrics.StatusCompleted, end)
	if p := page(completed); strings.Contains(p, "unfinished") || !strings.Contains(p, "<td>final ") || !strings.Contains(p, "completed after step") {
		t.Error("completed run's page reads as unfinished, or lacks its final value and status")
	}
	// An older run.json without a status reads as before.
	if p := page(td("micro-4w")); strings.Contains(p, "unfinished") || strings.Contains(p, "<td>status</td>") {
		t.Error("a run.json without a status is given one")
	}

	b, err := ComparePage(context.Background(), []*Run{mustRead(t, completed), mustRead(t, failed)}, offline)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(b), "(unfinished: failed after step") != 1 {
		t.Error("the comparison does not mark the unfinished run's value once")
	}
}
