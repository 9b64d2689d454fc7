package train

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/rundir"
	"github.com/sparsegrad/sparsegrad/rundir/rundirtest"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// readRunInfo reads the run.json of the run in dir.
func readRunInfo(dir string) (*RunInfo, error) {
	info := &RunInfo{}
	return info, rundir.ReadRun(dir, info)
}

func ncfConfig(t testing.TB, workers, steps int) Config {
	return Config{Model: "ncf", Dataset: "ml-100k", DataDir: testenv.SharedData(t, "ml-100k/u.data"), Workers: Set(workers), Steps: steps,
		Out: t.TempDir(), Quiet: true, BLAS: "gonum", MaxEvalBatches: 2}
}

func runLosses(t *testing.T, c Config) []float64 {
	t.Helper()
	var losses []float64
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := Run(ctx, c, Options{LossSink: func(_ int, l float64) { losses = append(losses, l) }}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return losses
}

// TestDenseMatchesReference compares the trainer (dense reduction, in-process
// workers) with a plain data-parallel loop written here: every worker's
// gradient on its own batch, averaged in float64, one Adam step, the same on
// every worker.
func TestDenseMatchesReference(t *testing.T) {
	ws := []int{1, 2, 3, 5}
	if testing.Short() {
		ws = []int{1, 3}
	}
	const steps = 4
	for _, n := range ws {
		c := ncfConfig(t, n, steps)
		c.LR = Set(0.01)
		got := runLosses(t, c)
		if len(got) != steps {
			t.Fatalf("n=%d: %d losses, want %d", n, len(got), steps)
		}
		c = c.Defaults()
		ds, err := LoadDataset(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		ms := make([]models.Model, n)
		tasks := make([]task, n)
		for r := range ms {
			if ms[r], err = NewModel(c, ds, c.Seed.Value()+uint64(r), nil); err != nil {
				t.Fatal(err)
			}
			if tasks[r], err = newTask(c, ds, r, n); err != nil {
				t.Fatal(err)
			}
			defer tasks[r].Close()
			tasks[r].SetEpoch(0)
		}
		// Every worker steps from the same parameters: rank 0's initial ones.
		np := ms[0].NumParams()
		adam, err := NewAdam(device.CPU.Stream(), np, c.Beta1.Value(), c.Beta2.Value(), c.Eps.Value())
		if err != nil {
			t.Fatal(err)
		}
		params := make([]float32, np)
		if err := ms[0].InitParams(params); err != nil {
			t.Fatal(err)
		}
		grad := make([]float32, np)
		for s := 0; s < steps; s++ {
			sum := make([]float64, np)
			loss := 0.0
			for r := range ms {
				b, _, err := tasks[r].Batch(s)
				if err != nil {
					t.Fatal(err)
				}
				res, err := ms[r].TrainStep(context.Background(), b, device.Host(params), device.Host(grad))
				if err != nil {
					t.Fatal(err)
				}
				loss += res.Loss
				for i, g := range grad {
					sum[i] += float64(g)
				}
			}
			loss /= float64(n)
			if math.Abs(loss-got[s]) > 1e-5*(1+math.Abs(loss)) {
				t.Fatalf("n=%d step %d: trainer loss %v, reference %v", n, s+1, got[s], loss)
			}
			avg := make([]float32, np)
			for i := range avg {
				avg[i] = float32(sum[i] / float64(n))
			}
			if err := adam.Step(device.Host(params), device.Host(avg), c.LR.Value()); err != nil {
				t.Fatal(err)
			}
		}
		// The loss must move: a trainer that never updates would fail above
		// only if the reference moved, so check that it did.
		if got[0] == got[steps-1] {
			t.Fatalf("n=%d: loss did not change over %d steps: %v", n, steps, got)
		}
	}
}

// TestPipelinedEqualsSequential: LAGS reduces the same groups whether they
// are started during the backward pass or after it, so the losses and the
// final parameters are bit-identical.
func TestPipelinedEqualsSequential(t *testing.T) {
	// Clipping the averaged gradient (lags' default -clip-at) keeps the
	// run pipelined and clips the same in both.
	var runs [][]float64
	for _, clip := range []float64{0, 0.05} {
		t.Run(fmt.Sprintf("clip %g", clip), func(t *testing.T) { runs = append(runs, pipelinedEqualsSequential(t, clip)) })
	}
	if len(runs) == 2 && slices.Equal(runs[0], runs[1]) {
		t.Fatalf("clipping at 0.05 left the losses as they were (%v): the averaged gradient was not clipped", runs[0])
	}
}

func pipelinedEqualsSequential(t *testing.T, clip float64) []float64 {
	var losses [2][]float64
	var params [2][]float32
	for i, mode := range []string{"on", "off"} {
		c := ncfConfig(t, 3, 6)
		c.Sparsifier, c.Density, c.Pipeline, c.Clip = "lags", Set(0.05), mode, Set(clip)
		c.MethodOptions = sparsify.Values{"merge_size": 1000}
		if clip > 0 {
			c.Pipeline = map[string]string{"on": "auto", "off": "off"}[mode]
		}
		losses[i] = runLosses(t, c)
		p, err := rundir.Latest(c.Out)
		if err != nil {
			t.Fatal(err)
		}
		ck, err := rundir.ReadCheckpoint[Config](p)
		if err != nil {
			t.Fatal(err)
		}
		params[i] = ck.Params
		var info RunInfo
		b, _ := os.ReadFile(filepath.Join(c.Out, "run.json"))
		if err := json.Unmarshal(b, &info); err != nil {
			t.Fatal(err)
		}
		if info.Pipelined != (mode == "on") {
			t.Fatalf("pipeline %s: run.json says pipelined=%v", mode, info.Pipelined)
		}
	}
	if !slices.Equal(losses[0], losses[1]) {
		t.Fatalf("pipelined losses %v, sequential %v", losses[0], losses[1])
	}
	if !slices.Equal(params[0], params[1]) {
		t.Fatal("pipelined and sequential runs ended with different parameters")
	}
	return losses[0]
}

var stepKeys = []string{"epoch", "step", "loss", "lr", "density", "actual_density", "error_norm", "bytes_sent", "bytes_recv",
	"t_forward", "t_backward", "t_select", "t_comm", "t_update", "t_iter"}

// TestEverySparsifierAwkwardSizes trains a few steps with every registered
// method on awkward worker counts and k = 1, and checks the records.
func TestEverySparsifierAwkwardSizes(t *testing.T) {
	ws := []int{1, 2, 3, 5, 16}
	if testing.Short() {
		ws = []int{3}
	}
	for _, name := range sparsify.Names() {
		for _, n := range ws {
			c := ncfConfig(t, n, 2)
			// k = 1: ncf on ml-100k has 107,761 parameters (a density
			// below 1/N is refused, checkFits).
			c.Sparsifier, c.Density = name, Set(1.0/107761)
			if name == "gtopk" && n&(n-1) != 0 {
				if err := c.Defaults().Validate(false); err == nil || !strings.Contains(err.Error(), "power-of-two") {
					t.Fatalf("gtopk with %d workers: %v", n, err)
				}
				continue
			}
			if name == "dragonn" {
				c.MethodOptions = sparsify.Values{"min_tensor": 1000, "dense_warmup": 1}
			}
			if err := Run(context.Background(), c, Options{}); err != nil {
				t.Fatalf("%s, %d workers: %v", name, n, err)
			}
			recs := rundirtest.Records(t, c.Out)
			steps := 0
			for _, r := range recs {
				if r["type"] != "step" {
					continue
				}
				steps++
				for _, k := range stepKeys {
					if _, ok := r[k]; !ok {
						t.Fatalf("%s/%d: step record lacks %q: %v", name, n, k, r)
					}
				}
				ad, _ := r["actual_density"].(float64)
				// A hard threshold may select nothing; the others send >= k = 1.
				if !(ad >= 0 && ad <= 1) || (ad == 0 && name != "threshold") || (name == "dense" && ad != 1) {
					t.Fatalf("%s/%d: actual density %v", name, n, ad)
				}
				if n == 1 && r["bytes_sent"].(float64) != 0 {
					t.Fatalf("%s: one worker sent %v bytes", name, r["bytes_sent"])
				}
				if w := r["workers"].(float64); int(w) != n {
					t.Fatalf("%s: workers %v, want %d", name, w, n)
				}
			}
			if steps != 2 {
				t.Fatalf("%s/%d: %d step records, want 2", name, n, steps)
			}
		}
	}
}

func TestRunDirectoryAndResume(t *testing.T) {
	c := ncfConfig(t, 2, 5)
	c.Sparsifier, c.Density = "topk", Set(0.1)
	c.LogEvery = Set(2)
	if err := Run(context.Background(), c, Options{CommandLine: []string{"train", "-x"}}); err != nil {
		t.Fatal(err)
	}
	var info RunInfo
	b, err := os.ReadFile(filepath.Join(c.Out, "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}
	if info.Config.Model != "ncf" || info.Workers != 2 || info.Machine.Cores < 1 || info.Params < 1 || info.Versions.Go == "" || info.CommandLine[1] != "-x" {
		t.Fatalf("run.json: %+v", info)
	}
	recs := rundirtest.Records(t, c.Out)
	var steps []float64
	var evals []string
	for _, r := range recs {
		switch r["type"] {
		case "step":
			steps = append(steps, r["step"].(float64))
		case "eval":
			evals = append(evals, r["metric"].(string))
			v := r["value"].(float64)
			if !(v >= 0 && v <= 1) {
				t.Fatalf("eval %v out of [0, 1]", r)
			}
		}
	}
	if !slices.Equal(steps, []float64{2, 4, 5}) || !slices.Equal(evals, []string{"hr10", "ndcg10"}) {
		t.Fatalf("steps %v, evals %v", steps, evals)
	}
	if _, err := os.Stat(filepath.Join(c.Out, "checkpoints", "step-000000005", "shared.ckpt")); err != nil {
		t.Fatal(err)
	}
	// Resume to step 8: the step count continues and metrics are appended.
	r := c
	r.Out, r.Resume, r.Steps = "", c.Out, 8
	if err := Run(context.Background(), r, Options{}); err != nil {
		t.Fatal(err)
	}
	steps = nil
	for _, m := range rundirtest.Records(t, c.Out) {
		if m["type"] == "step" {
			steps = append(steps, m["step"].(float64))
		}
	}
	if !slices.Equal(steps, []float64{2, 4, 5, 6, 8}) {
		t.Fatalf("steps after resume %v", steps)
	}
	// A new run into the same directory is refused before it writes anything.
	before, err := os.ReadFile(filepath.Join(c.Out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if err := Run(context.Background(), c, Options{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "already holds a run") {
		t.Fatalf("a second run into %s: %v, want a refusal", c.Out, err)
	}
	if after, _ := os.ReadFile(filepath.Join(c.Out, "metrics.jsonl")); !bytes.Equal(before, after) {
		t.Fatal("the refused run changed metrics.jsonl")
	}
	// Resuming it as another model is refused, saying what differs.
	bad := ncfConfig(t, 1, 1)
	bad.Model, bad.Dataset, bad.DataDir = "lstm", "wikitext2", testenv.SharedData(t, "wikitext-2/train.txt")
	bad.Resume, bad.Out = c.Out, ""
	if err := Run(context.Background(), bad, Options{}); err == nil || !strings.Contains(err.Error(), "-model lstm: the run has ncf") {
		t.Fatalf("resuming an NCF run as an LSTM: %v", err)
	}
}

func TestMissingDataSaysHowToFix(t *testing.T) {
	c := Config{Model: "ncf", Dataset: "ml-100k", DataDir: t.TempDir(), Out: t.TempDir(), Quiet: true}
	err := Run(context.Background(), c, Options{})
	if err == nil || !strings.Contains(err.Error(), "-download") {
		t.Fatalf("err = %v", err)
	}
}

func TestEvalEveryAndMaxTime(t *testing.T) {
	c := ncfConfig(t, 2, 5)
	c.EvalEvery = 2
	if err := Run(context.Background(), c, Options{}); err != nil {
		t.Fatal(err)
	}
	var at []float64
	for _, r := range rundirtest.Records(t, c.Out) {
		if r["type"] == "eval" && r["metric"] == "hr10" {
			at = append(at, r["step"].(float64))
		}
	}
	if !slices.Equal(at, []float64{2, 4, 5}) {
		t.Fatalf("evaluations at steps %v, want 2, 4, 5", at)
	}
	// A time limit that has passed stops before the first step, still with
	// an evaluation and a checkpoint.
	c = ncfConfig(t, 2, 0)
	c.MaxTime = time.Nanosecond
	if err := Run(context.Background(), c, Options{}); err != nil {
		t.Fatal(err)
	}
	recs := rundirtest.Records(t, c.Out)
	if len(recs) != 2 || recs[0]["type"] != "eval" {
		t.Fatalf("records after a passed time limit: %v", recs)
	}
	if _, err := rundir.Latest(c.Out); err != nil {
		t.Fatal(err)
	}
}

// TestDivergenceIsAnError: a learning rate that overflows the parameters
// makes the next gradient non-finite, which stops the run with an error that
// names the problem instead of training on NaN.
func TestDivergenceIsAnError(t *testing.T) {
	c := ncfConfig(t, 2, 10)
	c.Optimizer, c.LR = "sgd", Set(1e38)
	err := Run(context.Background(), c, Options{})
	if err == nil || !(strings.Contains(err.Error(), "NaN") || strings.Contains(err.Error(), "Inf") || strings.Contains(err.Error(), "infinite")) {
		t.Fatalf("err = %v", err)
	}
	t.Log(err)
}

// TestOneCycleRun trains with -lr-schedule onecycle and -steps 12: the cycle
// spans the 12 steps (not the epochs), starting at lr/25, peaking at lr and
// ending at lr/25/10⁴, as metrics.jsonl records.
func TestOneCycleRun(t *testing.T) {
	const steps, lr = 12, 0.01
	c := ncfConfig(t, 2, steps)
	c.LRSchedule, c.LR, c.LogEvery = "onecycle", Set(lr), Set(1)
	if err := Run(context.Background(), c, Options{}); err != nil {
		t.Fatal(err)
	}
	var lrs []float64
	for _, r := range rundirtest.Records(t, c.Out) {
		if r["type"] == "step" {
			lrs = append(lrs, r["lr"].(float64))
		}
	}
	if len(lrs) != steps {
		t.Fatalf("%d step records, want %d", len(lrs), steps)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) <= 1e-9*want }
	if peak := slices.Max(lrs); !near(lrs[0], lr/25) || !near(lrs[steps-1], lr/25/1e4) || peak > lr || peak < 0.9*lr {
		t.Fatalf("learning rates %v: want lr/25 first, a peak near lr, lr/25/1e4 last", lrs)
	}
}

// TestDenseOverlappedEqualsSequential: dense in many buckets started
// during the backward pass (bucket_mb 0.01: a few thousand elements each,
// cutting the all-reduce's chunks) sums every element in the order of one
// all-reduce of the whole gradient after the backward pass (-pipeline off,
// bucket_mb 0), so the losses and the final parameters are bit-identical,
// on 1, 2, 3 and 5 simulated workers (3 and 5: the order of a three-term
// sum is visible).
func TestDenseOverlappedEqualsSequential(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		var losses [2][]float64
		var params [2][]float32
		for i, mode := range []string{"on", "off"} {
			c := ncfConfig(t, n, 4)
			c.Sparsifier, c.Pipeline = "dense", mode
			c.MethodOptions = sparsify.Values{"bucket_mb": map[string]float64{"on": 0.01, "off": 0}[mode]}
			losses[i] = runLosses(t, c)
			p, err := rundir.Latest(c.Out)
			if err != nil {
				t.Fatal(err)
			}
			ck, err := rundir.ReadCheckpoint[Config](p)
			if err != nil {
				t.Fatal(err)
			}
			params[i] = ck.Params
			var info RunInfo
			b, _ := os.ReadFile(filepath.Join(c.Out, "run.json"))
			if err := json.Unmarshal(b, &info); err != nil {
				t.Fatal(err)
			}
			if info.Pipelined != (mode == "on") || info.Overlap != (mode == "on") {
				t.Fatalf("%d workers, -overlap %s: run.json says pipelined=%v, overlap=%v", n, mode, info.Pipelined, info.Overlap)
			}
			if want := c.MethodOptions["bucket_mb"]; info.BucketMB == nil || *info.BucketMB != want {
				t.Fatalf("%d workers, -overlap %s: run.json says bucket_mb %v, want %v", n, mode, info.BucketMB, want)
			}
		}
		if len(losses[0]) != 4 {
			t.Fatalf("%d workers: %d losses, want 4", n, len(losses[0]))
		}
		for s := range losses[0] {
			if math.Float64bits(losses[0][s]) != math.Float64bits(losses[1][s]) {
				t.Fatalf("%d workers, step %d: overlapped loss %v, sequential %v", n, s+1, losses[0][s], losses[1][s])
			}
		}
		for j := range params[0] {
			if math.Float32bits(params[0][j]) != math.Float32bits(params[1][j]) {
				t.Fatalf("%d workers: parameter %d is %v overlapped, %v sequential", n, j, params[0][j], params[1][j])
			}
		}
	}
}
