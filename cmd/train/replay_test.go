package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReplayCommand: train -record-gradients, then train replay of the
// recording, as a user runs them: the replay's terminal output has no loss,
// and its report says it is a replay, what it cannot show, the recorded
// step time, and draws no loss chart.
func TestReplayCommand(t *testing.T) {
	data := sharedData(t)
	dir := t.TempDir()
	grads, trained, replayed := filepath.Join(dir, "grads"), filepath.Join(dir, "trained"), filepath.Join(dir, "replayed")
	const cdn = "https://cdn.jsdelivr.net/npm/echarts@5.6.0/dist/echarts.min.js"
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-model", "ncf", "-data-dir", data, "-workers", "2", "-steps", "3", "-sparsifier", "topk", "-density", "0.05",
		"-record-gradients", grads, "-out", trained, "-report-assets", cdn}, &out, &out); err != nil {
		t.Fatalf("train: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"replay", "-gradients", grads, "-sparsifier", "topk", "-density", "0.05", "-out", replayed, "-report-assets", cdn}, &out, &out); err != nil {
		t.Fatalf("train replay: %v\n%s", err, out.String())
	}
	if s := out.String(); strings.Contains(s, "NaN") || strings.Contains(s, "loss") || !strings.Contains(s, "report:") {
		t.Errorf("replay's terminal output:\n%s", s)
	}
	b, err := os.ReadFile(filepath.Join(replayed, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{"Replay of ncf&#39;s recorded gradients", "A replay of recorded gradients", "It cannot show: no loss", "recorded step time", "2 workers × 3 steps"} {
		if !strings.Contains(page, want) {
			t.Errorf("the replay's report lacks %q", want)
		}
	}
	if strings.Contains(page, "Training loss") {
		t.Error("the replay's report draws a loss chart")
	}
	// The replay flags are only those a replay uses.
	out.Reset()
	err = run(context.Background(), []string{"replay", "-gradients", grads, "-lr", "0.1", "-out", filepath.Join(dir, "x")}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "-lr") {
		t.Errorf("train replay -lr: %v", err)
	}
	err = run(context.Background(), []string{"replay", "-sparsifier", "topk", "-out", filepath.Join(dir, "y")}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "give -gradients DIR") {
		t.Errorf("train replay without -gradients: %v", err)
	}
}
