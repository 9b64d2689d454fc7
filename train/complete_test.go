package train

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/rundir"
)

// TestResumeOfACompleteRun: -resume of a run that has trained its -steps,
// its epochs or its -max-time is refused, naming what ended it and the
// flag that trains it further (it used to say "resuming from", evaluate
// again and stop); with that flag raised it continues; a run whose final
// evaluation was cut short is resumed to do it.
func TestResumeOfACompleteRun(t *testing.T) {
	ctx := context.Background()
	resume := func(c Config) (string, error) {
		var out bytes.Buffer
		err := Run(ctx, c, Options{Stdout: &out, Progress: &out, CommandLine: []string{"bin/train", "-resume", c.Resume}})
		return out.String(), err
	}
	refused := func(what string, c Config, want ...string) {
		t.Helper()
		out, err := resume(c)
		if !errors.Is(err, ErrConfig) {
			t.Fatalf("%s: resume of a complete run: err %v, want a refusal; output:\n%s", what, err, out)
		}
		for _, w := range append(want, "the run is complete", "bin/train -resume "+c.Resume) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", what, err, w)
			}
		}
		if strings.Contains(out, "resuming from") {
			t.Errorf("%s: a refused resume said it was resuming:\n%s", what, out)
		}
	}

	// -steps.
	c := ncfConfig(t, 2, 3)
	if err := Run(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	refused("steps", Config{Resume: c.Out}, "-steps 3", "-steps 6", "-steps 0")
	if out, err := resume(Config{Resume: c.Out, Steps: 5}); err != nil {
		t.Fatalf("resume with a larger -steps: %v\n%s", err, out)
	}

	// Epochs: one epoch of 2 workers with batches of 16384 is a few steps.
	c = ncfConfig(t, 2, 0)
	c.Batch, c.Epochs = Set(16384), Set(1)
	if err := Run(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	refused("epochs", Config{Resume: c.Out}, "its 1 epochs", "-epochs 2")
	// A final evaluation cut short (its records lost) is done by a resume.
	metrics := filepath.Join(c.Out, "metrics.jsonl")
	last := lastStep(t, metrics)
	b, err := os.ReadFile(metrics)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if !strings.Contains(l, `"type":"eval"`) {
			kept = append(kept, l)
		}
	}
	if err := os.WriteFile(metrics, []byte(strings.Join(kept, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := resume(Config{Resume: c.Out}); err != nil || !rundir.EvaluatedAt(c.Out, last) {
		t.Fatalf("resume of a run whose last evaluation is missing: %v (evaluated: %v)\n%s", err, rundir.EvaluatedAt(c.Out, last), out)
	}
	refused("epochs, evaluated again", Config{Resume: c.Out}, "its 1 epochs")
	if out, err := resume(Config{Resume: c.Out, Epochs: Set(2)}); err != nil {
		t.Fatalf("resume with a larger -epochs: %v\n%s", err, out)
	}

	// -max-time.
	c = ncfConfig(t, 2, 0)
	c.MaxTime = time.Nanosecond
	if err := Run(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	refused("max-time", Config{Resume: c.Out}, "-max-time 1ns", "-max-time 0")
}

// lastStep is the step of the last step record in the metrics file at path.
func lastStep(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for _, l := range strings.Split(string(b), "\n") {
		var rec struct {
			Type string `json:"type"`
			Step int    `json:"step"`
		}
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Type == "step" {
			last = rec.Step
		}
	}
	if last < 0 {
		t.Fatal("no step recorded")
	}
	return last
}
