package train

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/rundir"
)

// readInfo reads the run.json of dir.
func readInfo(t *testing.T, dir string) *RunInfo {
	t.Helper()
	info := &RunInfo{}
	if err := rundir.ReadRun(dir, info); err != nil {
		t.Fatal(err)
	}
	return info
}

// TestRunJSONSaysHowTheRunEnded: run.json records how a run ended — an
// interruption at its step with its checkpoint, a run stopped by -steps, a
// completed one — and a resume says how the run had ended before it
// (killed: run.json said running while nobody held the lock) and records
// the new end.
func TestRunJSONSaysHowTheRunEnded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// One epoch of 2 workers with batches of 16384 is a few steps.
	c := ncfConfig(t, 2, 0)
	c.Batch, c.Epochs = Set(16384), Set(1)
	if err := Run(ctx, c, stopAt(2)); !errors.Is(err, ErrInterrupted) {
		t.Fatalf("stopped run: %v, want an interruption", err)
	}
	info := readInfo(t, c.Out)
	if info.Status != metrics.StatusInterrupted || info.End == nil {
		t.Fatalf("interrupted run: status %q, end %+v", info.Status, info.End)
	}
	e := info.End
	if e.Step != 2 || e.CheckpointStep != 2 || e.Checkpoint == "" || e.StepsPerEpoch <= 2 || e.TotalSteps != e.StepsPerEpoch || e.Time.Before(info.Start) {
		t.Errorf("interrupted after step 2 of one epoch: end %+v", e)
	}
	if rundir.Held(c.Out) {
		t.Error("the lock is held after the run returned")
	}

	// A killed process leaves run.json saying running.
	info.Status, info.End = metrics.StatusRunning, nil
	if err := rundir.WriteRun(c.Out, info); err != nil {
		t.Fatal(err)
	}
	if err := Run(ctx, Config{Resume: c.Out, Quiet: true}, Options{}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	info = readInfo(t, c.Out)
	if info.Status != metrics.StatusCompleted || info.End == nil || info.End.Step != info.End.TotalSteps {
		t.Fatalf("completed run: status %q, end %+v", info.Status, info.End)
	}
	if len(info.Resumes) != 1 || info.Resumes[0].After != metrics.StatusKilled {
		t.Errorf("the resume's record of how the run had ended: %+v, want %q", info.Resumes, metrics.StatusKilled)
	}

	// -steps.
	c = ncfConfig(t, 3, 3)
	if err := Run(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	info = readInfo(t, c.Out)
	if info.Status != metrics.StatusStopped || info.End == nil || info.End.Step != 3 || info.End.Reason != fmt.Sprint(stopMaxSteps) {
		t.Fatalf("run stopped by -steps: status %q, end %+v", info.Status, info.End)
	}
	if err := Run(ctx, Config{Resume: c.Out, Steps: 4, Quiet: true}, Options{}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	info = readInfo(t, c.Out)
	if info.Status != metrics.StatusStopped || info.End.Step != 4 || len(info.Resumes) != 1 || info.Resumes[0].After != metrics.StatusStopped {
		t.Fatalf("resumed to -steps 4: status %q, end %+v, resumes %+v", info.Status, info.End, info.Resumes)
	}
}
