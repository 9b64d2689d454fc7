package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/rundir/rundirtest"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// The method of TestNewMethodIsOneFile, declared as any method is, in one
// place: "zz-adaptive", an adaptive threshold. Each worker sends every
// element with |acc| >= its threshold; the union of the workers' selections
// is all-reduced (Env.ReduceSelected). The threshold starts at the k-th
// largest magnitude of the first call's acc and then follows the union's
// size: thr ← thr·(|union|/k)^gain, the same on every rank, so the traffic
// settles near the budget k. The threshold is its state; gain its option;
// its paper's density (a test's) is 0.05 on recommenders.

const adaptiveName = "zz-adaptive"

// adaptiveNotProjectable is its reason not to be projected, which the
// reports print.
const adaptiveNotProjectable = "zz-adaptive: its union of the workers' selections grows with the worker count"

func registerAdaptive() {
	if _, ok := sparsify.Lookup(adaptiveName); ok {
		return // -count > 1
	}
	sparsify.Register(sparsify.Method{Name: adaptiveName, New: newAdaptive, NotProjectable: adaptiveNotProjectable,
		Doc: "an adaptive threshold: |acc| >= thr, the union all-reduced, thr following the union's size (a test's method).",
		Params: []options.Option{{Key: "zz_gain", Kind: options.Float, Default: 0.5, Range: options.Within(0, 1, "[]"),
			Doc: "how fast the threshold follows the union's size"}},
		Density: func(k sparsify.ModelKind) float64 {
			if k == sparsify.Recommender {
				return 0.05
			}
			return 0
		},
		Advice: &sparsify.Advice{
			Plan: func(s sparsify.Shape) ([]sparsify.Call, error) {
				return []sparsify.Call{{Op: comm.OpAllGather, Count: 1, Elems: 1}, {Op: comm.OpAllGatherV, Count: 1, Elems: s.Sel}, {Op: comm.OpAllReduce, Count: 1, Elems: s.Union}}, nil
			},
			Volume: func(s sparsify.Shape, o sparsify.Overlap) (sel, union float64) {
				return float64(s.K), o.TopK(float64(s.K))
			},
			Selection: sparsify.SelectsWhole,
			Evidence:  sparsify.Evidence{Shown: []sparsify.ModelKind{sparsify.Recommender}, Papers: "a test method: no paper shows it"},
		}})
}

// adaptive is the core.
type adaptive struct {
	e    *sparsify.Env
	gain float64
	thr  float64 // 0 until the first call
	sel  device.Buffer
}

func newAdaptive(e *sparsify.Env) (sparsify.Core, error) {
	return &adaptive{e: e, gain: e.Options().Params.Float("zz_gain")}, nil
}

func (a *adaptive) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *sparsify.GroupStats) error {
	e := a.e
	ops, s := e.Ops(), e.Stream()
	sel, err := e.Scratch(&a.sel, device.Int32, e.N())
	if err != nil {
		return err
	}
	m := 0
	if st.SelectTime, err = e.Timed(func() error {
		if a.thr == 0 {
			t, err := ops.KthLargestAbs(s, acc, e.K())
			if err != nil {
				return err
			}
			a.thr = float64(t)
		}
		m, err = ops.SelectAbove(s, sel, device.Buffer{}, acc, float32(a.thr))
		return err
	}); err != nil {
		return err
	}
	st.Threshold = float64(float32(a.thr))
	if err := e.ReduceSelected(ctx, acc, out, residual, sel.Slice(0, m), st); err != nil {
		return err
	}
	a.thr *= math.Pow(float64(max(st.Distinct, 1))/float64(e.K()), a.gain)
	return nil
}

func (a *adaptive) SaveState(w *sparsify.StateWriter) error {
	w.Float(a.thr)
	return nil
}

func (a *adaptive) LoadState(r *sparsify.StateReader) error {
	thr := r.Float("threshold")
	if err := r.Done(); err != nil {
		return err
	}
	if thr < 0 {
		return fmt.Errorf("%s: state: threshold %v is negative", adaptiveName, thr)
	}
	a.thr = thr
	return nil
}

// TestNewMethodIsOneFile: the method declared above, in this file only,
// is in -help, validated, defaulted (its density, its option) and recorded
// in run.json; it trains on 2 workers, its threshold adapting; a run
// stopped after step 3 and resumed ends bit for bit where the straight run
// ends (its state in the checkpoint); the report names it and its reason
// not to be projected; the advisor measures, predicts and ranks it.
func TestNewMethodIsOneFile(t *testing.T) {
	registerAdaptive()
	var help bytes.Buffer
	run(context.Background(), []string{"-help"}, &help, &help)
	for _, w := range []string{adaptiveName, "-zz-gain float\n    \tzz-adaptive: how fast the threshold follows the union's size (default 0.5)"} {
		if !strings.Contains(help.String(), w) {
			t.Errorf("-help lacks %q:\n%s", w, help.String())
		}
	}
	m := resolved(t, "-model", "ncf", "-sparsifier", adaptiveName, "-out", "x")
	if m["density"] != 0.05 || fmt.Sprint(m["method_options"]) != "map[min_compress_size:0 zz_gain:0.5]" {
		t.Errorf("resolved density %v and options %v, want the declared 0.05 and zz_gain 0.5", m["density"], m["method_options"])
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-sparsifier", adaptiveName, "-zz-gain", "2", "-out", "x"}, &out, &out); err == nil ||
		!strings.Contains(err.Error(), "-zz-gain 2 must be in [0, 1] (zz-adaptive: how fast the threshold follows the union's size)") {
		t.Errorf("-zz-gain 2: %v", err)
	}
	if err := run(context.Background(), []string{"-sparsifier", "topk", "-zz-gain", "0.1", "-out", "x"}, &out, &out); err == nil ||
		!strings.Contains(err.Error(), "-zz-gain applies only to -sparsifier zz-adaptive, not topk") {
		t.Errorf("-zz-gain with topk: %v", err)
	}

	// Straight, and stopped after step 3 and resumed.
	data := testenv.SharedData(t, "ml-100k/u.data")
	base := t.TempDir()
	args := []string{"-model", "ncf", "-data-dir", data, "-workers", "2", "-steps", "8", "-sparsifier", adaptiveName, "-zz-gain", "0.8",
		"-max-eval-batches", "1", "-quiet"}
	straight, split := filepath.Join(base, "straight"), filepath.Join(base, "split")
	trainWith(t, append(args, "-out", straight), train.Options{Report: writeReport})
	var stopped atomic.Bool
	stop := make(chan struct{})
	err := trainWith(t, append(args, "-out", split), train.Options{Stop: stop, LossSink: func(step int, _ float64) {
		if step >= 3 && stopped.CompareAndSwap(false, true) {
			close(stop)
		}
	}})
	if !errors.Is(err, train.ErrInterrupted) {
		t.Fatalf("the stopped run: %v, want an interruption", err)
	}
	if err := trainWith(t, []string{"-resume", split}, train.Options{}); err != nil {
		t.Fatalf("the resumed run: %v", err)
	}
	sameEnds(t, "resumed "+adaptiveName, rundirtest.Read(t, straight), rundirtest.Read(t, split))

	// Its threshold adapted (the state matters), and the record says what
	// ran.
	thresholds := map[float64]bool{}
	for _, r := range rundirtest.Read(t, straight).Records {
		if r["type"] == "step" {
			thr, _ := r["threshold"].(float64)
			thresholds[thr] = thr > 0
		}
	}
	if len(thresholds) < 3 || thresholds[0] {
		t.Errorf("thresholds %v: want a positive threshold that adapts", thresholds)
	}
	b, err := os.ReadFile(filepath.Join(straight, "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Config struct {
			Sparsifier    string         `json:"sparsifier"`
			Density       float64        `json:"density"`
			MethodOptions map[string]any `json:"method_options"`
		} `json:"config"`
	}
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}
	if c := info.Config; c.Sparsifier != adaptiveName || c.Density != 0.05 || c.MethodOptions["zz_gain"] != 0.8 {
		t.Errorf("run.json's configuration %+v, want %s at density 0.05 with zz_gain 0.8", c, adaptiveName)
	}

	// The report.
	page, err := os.ReadFile(filepath.Join(straight, "report.html"))
	if err != nil {
		t.Fatalf("no report: %v", err)
	}
	for _, w := range []string{adaptiveName, adaptiveNotProjectable} {
		if !strings.Contains(html.UnescapeString(string(page)), w) {
			t.Errorf("the report lacks %q", w)
		}
	}

	// The advisor: its selection measured on the model's gradients, its
	// iteration predicted from its declared traffic, ranked on NCF (a
	// recommender, where it declares evidence).
	var advice, errOut bytes.Buffer
	if err := run(context.Background(), []string{"advise", "-model", "ncf", "-data-dir", data, "-workers", "4", "-net-bandwidth", "10",
		"-sparsifiers", "dense," + adaptiveName, "-measurements", filepath.Join(base, "m.json")}, &advice, &errOut); err != nil {
		t.Fatalf("advise: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(advice.String(), adaptiveName+" ") || !strings.Contains(advice.String(), adaptiveName+": a test method: no paper shows it") {
		t.Errorf("the advisor's table does not rank %s:\n%s", adaptiveName, advice.String())
	}
}

// trainWith runs the train command with args (its flags, as run parses
// them) and the trainer options o.
func trainWith(t *testing.T, args []string, o train.Options) error {
	t.Helper()
	fs, c, _ := newFlags(&bytes.Buffer{})
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	o.Given = givenFlags(fs)
	err := train.Run(ctx, *c, o)
	if err != nil && o.Stop == nil && len(args) > 0 && args[0] != "-resume" {
		t.Fatalf("train %v: %v", args, err)
	}
	return err
}
