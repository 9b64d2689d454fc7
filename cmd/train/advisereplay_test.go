package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/advise"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/recorded"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// replayMeans replays dir with method at density (and flags) and returns the mean
// over its steps of the actual density and of the bytes sent per step
// (rank 0's), as metrics.jsonl records them.
func replayMeans(t *testing.T, dir, method string, density float64, out string, flags ...string) (dens, bytesSent float64) {
	t.Helper()
	var log bytes.Buffer
	args := append([]string{"replay", "-gradients", dir, "-sparsifier", method, "-density", fmt.Sprint(density),
		"-out", out, "-log-every", "1", "-quiet", "-report-assets", "https://cdn.jsdelivr.net/npm/echarts@5.6.0/dist/echarts.min.js"}, flags...)
	if err := run(context.Background(), args, &log, &log); err != nil {
		t.Fatalf("replay of %s: %v\n%s", method, err, log.String())
	}
	f, err := os.Open(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n int
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var s metrics.Step
		if json.Unmarshal(sc.Bytes(), &s) != nil || s.Type != "step" {
			continue
		}
		dens += float64(s.ActualDensity)
		bytesSent += float64(s.BytesSent)
		n++
	}
	if n == 0 {
		t.Fatalf("replay of %s recorded no step", method)
	}
	return dens / float64(n), bytesSent / float64(n)
}

// advisorVsReplay predicts every method of methods (nil: every method) on
// the recording dir at its worker count over its steps and replays it, both
// with the method options params (each method takes those it declares):
// the predicted mean actual density and bytes per worker must lie within
// 10 % of the replay's. With steadyState, the prediction is the methods'
// plans' (sparsify.Advice), without the reducers run over the horizon. It
// returns the table of both (markdown rows).
func advisorVsReplay(t *testing.T, dir string, density float64, methods []string, params sparsify.Values, steadyState bool) string {
	rec, err := recorded.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	P := rec.Manifest.Workers
	h, err := advise.MeasureRecorded(context.Background(), advise.RecordedConfig{Dir: dir, StepTime: 30 * time.Millisecond, Densities: []float64{density}, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	var steady *advise.Host // without the horizon: the plans' prediction (steadyState)
	if steadyState {
		c := *h
		c.Horizons = nil
		steady = &c
	}
	var rows strings.Builder
	fmt.Fprintf(&rows, "| method | predicted density | replayed density | predicted bytes/step | replayed bytes/step |\n|---|---|---|---|---|\n")
	if methods == nil {
		methods = sparsify.Names()
	}
	for _, m := range methods {
		pr, err := advise.Predict(h, advise.Setting{Method: m, Workers: P, Density: density, Params: params})
		if err != nil {
			t.Logf("%s: not predicted on %d workers: %v", m, P, err)
			continue
		}
		if steady != nil {
			// The steady state, from the method's plan rather than its
			// reducer run over the horizon.
			sp, err := advise.Predict(steady, advise.Setting{Method: m, Workers: P, Density: density, Params: params})
			if err != nil {
				t.Fatal(err)
			}
			pr.ActualDensity, pr.BytesSent = sp.ActualDensity, sp.BytesSent
		}
		var flags []string
		meth, _ := sparsify.Lookup(m)
		for k, v := range meth.Applicable(params) {
			flags = append(flags, "-"+strings.ReplaceAll(k, "_", "-"), fmt.Sprint(v))
		}
		d, b := replayMeans(t, dir, m, density, filepath.Join(t.TempDir(), m), flags...)
		fmt.Fprintf(&rows, "| %s | %.4g | %.4g | %.0f | %.0f |\n", m, pr.ActualDensity, d, pr.BytesSent, b)
		if math.Abs(pr.ActualDensity-d) > 0.1*d {
			t.Errorf("%s: predicted mean actual density %.4g, replay measured %.4g (more than 10 %% apart)", m, pr.ActualDensity, d)
		}
		if math.Abs(pr.BytesSent-b) > 0.1*b {
			t.Errorf("%s: predicted %.0f bytes per worker and step, replay measured %.0f (more than 10 %% apart)", m, pr.BytesSent, b)
		}
	}
	return rows.String()
}

// TestAdvisorMatchesReplay: the advisor's prediction of what each method
// sends over a recording's steps (its reducer run over the horizon) is what
// train replay of the same recording measures, within 10 %, for every
// method, on the project's own recording (NCF, train -record-gradients)
// and on a PyTorch recording made here (python/sparsegrad_record.py).
func TestAdvisorMatchesReplay(t *testing.T) {
	data := testenv.SharedData(t, "ml-100k/u.data")
	dir := t.TempDir()
	grads := filepath.Join(dir, "ncf")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-model", "ncf", "-data-dir", data, "-workers", "4", "-steps", "4", "-record-gradients", grads,
		"-out", filepath.Join(dir, "trained"), "-quiet"}, &out, &out); err != nil {
		t.Fatalf("train: %v\n%s", err, out.String())
	}
	t.Run("ncf", func(t *testing.T) { t.Log("\n" + advisorVsReplay(t, grads, 0.01, nil, nil, false)) })
	t.Run("ncf/plans", func(t *testing.T) {
		// The plans alone (what a worker count other than the recording's
		// is predicted by) of the methods whose counts do not depend on the
		// data, gTop-k's tree counted over its ranks as the replay counts it.
		t.Log("\n" + advisorVsReplay(t, grads, 0.01, []string{"randomk", "cltk", "spardl", "gtopk"}, nil, true))
	})
	t.Run("ncf/min-compress-size", func(t *testing.T) {
		// NCF's tensors below 1,000 elements (its MLP's biases and output
		// layer) are all-reduced dense in the replay: the prediction over
		// the horizon counts them so, and so do the plans of the methods
		// whose counts do not depend on the data (no reducer run).
		cut := sparsify.Values{"min_compress_size": 1000}
		t.Log("\n" + advisorVsReplay(t, grads, 0.01, []string{"topk", "randomk", "cltk", "gtopk", "dgc", "micro", "threshold", "deft", "spardl", "topka"}, cut, false))
		t.Log("\n" + advisorVsReplay(t, grads, 0.01, []string{"randomk", "cltk", "spardl", "gtopk"}, cut, true))
	})
	t.Run("pytorch", func(t *testing.T) {
		if testing.Short() {
			t.Skip("records with PyTorch (about 10 s); skipped in -short")
		}
		py := "/usr/bin/python3"
		if p := os.Getenv("SPARSEGRAD_PYTHON"); p != "" {
			py = p
		}
		if b, err := testenv.Command(t, time.Minute, py, "-c", "import torch").CombinedOutput(); err != nil {
			testenv.Missing(t, testenv.Torch, fmt.Sprintf("no Python with torch (%s: %v %s); install python3-torch (apt) or set SPARSEGRAD_PYTHON", py, err, b))
		}
		rdir := filepath.Join(dir, "torch")
		cmd := testenv.Command(t, 5*time.Minute, py, "../../recorded/testdata/record_torch.py", "../../python", rdir)
		cmd.Env = append(os.Environ(), fmt.Sprintf("RECORD_TEST_PORT=%d", 20000+time.Now().Nanosecond()%20000))
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("recording with PyTorch: %v\n%s", err, b)
		}
		t.Log("\n" + advisorVsReplay(t, filepath.Join(rdir, "f32"), 0.01, nil, nil, false))
	})
}
