package main

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// TestClosedStdoutSaysSoAndGoesOn: train ... | head -1 (standard output
// closed after the first line) used to end the run at its next line,
// killed by SIGPIPE without a word. Now it says once on standard error
// that its output was closed, trains to the end and writes its folder,
// and exits 0.
func TestClosedStdoutSaysSoAndGoesOn(t *testing.T) {
	d := testenv.SharedData(t, "ml-100k/u.data")
	out := filepath.Join(t.TempDir(), "run")
	cmd := testenv.Command(t, 10*time.Minute, os.Args[0], "-model", "ncf", "-data-dir", d, "-batch", "4096", "-epochs", "3", "-max-eval-batches", "2", "-out", out)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The first line: the first epoch's, or where it stands after 30 s.
	first, err := bufio.NewReader(pipe).ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "epoch 1/3") && !strings.HasPrefix(first, "... epoch 1/3") {
		t.Fatalf("first line %q: %v", first, err)
	}
	pipe.Close() // as head -1 does
	if err := cmd.Wait(); err != nil {
		t.Fatalf("train with its output closed: %v\nstderr:\n%s", err, stderr.String())
	}
	if n := strings.Count(stderr.String(), "train: standard output was closed"); n != 1 {
		t.Errorf("%d words about the closed output on stderr:\n%s", n, stderr.String())
	}
	if got := stepsRecorded(out); got == 0 {
		t.Error("no steps recorded")
	}
	recs, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil || strings.Count(string(recs), `"type":"eval"`) < 3*2 {
		t.Errorf("the run did not evaluate its 3 epochs (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(out, "report.html")); err != nil {
		t.Errorf("no report: %v", err)
	}
}
