package train

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/rundir"
	"github.com/sparsegrad/sparsegrad/rundir/rundirtest"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// resumeConfigFor is the NCF configuration of the resume tests for a
// sparsifier: the default preset (dropout 0.5, so the dropout stream
// matters), warm-ups short enough to be crossed, gtopk on a power of two
// workers.
func resumeConfigFor(t *testing.T, sparsifier string, steps int) Config {
	workers := 3
	if sparsifier == "gtopk" {
		workers = 2
	}
	c := ncfConfig(t, workers, steps)
	c.Preset, c.Sparsifier, c.Density = "default", sparsifier, Set(0.05)
	m, _ := sparsify.Lookup(sparsifier)
	c.MethodOptions = sparsify.Values{}
	if _, ok := m.Param("dense_warmup"); ok {
		c.MethodOptions["dense_warmup"] = 3
	}
	if sparsifier == "dragonn" {
		c.MethodOptions["min_tensor"] = 0
	}
	if m.CorrectsMomentum {
		// DGC's momentum correction: its velocity is part of the state.
		c.Optimizer, c.Momentum, c.LR = "sgd", Set(0.9), Set(0.05)
	}
	return c
}

// stopAt returns options whose Stop is closed once rank 0 has recorded
// step k.
func stopAt(k int) Options {
	stop := make(chan struct{})
	var once atomic.Bool
	return Options{Stop: stop, LossSink: func(step int, _ float64) {
		if step >= k && once.CompareAndSwap(false, true) {
			close(stop)
		}
	}}
}

// straightAndSplit runs c straight, and again stopped after step k and
// resumed, and returns both end states.
func straightAndSplit(t *testing.T, c Config, k int) (rundirtest.End, rundirtest.End) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := Run(ctx, c, Options{}); err != nil {
		t.Fatalf("straight run: %v", err)
	}
	straight := rundirtest.Read(t, c.Out)
	s := c
	s.Out = t.TempDir()
	err := Run(ctx, s, stopAt(k))
	if !errors.Is(err, ErrInterrupted) {
		t.Fatalf("stopped run: %v, want an interruption", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("interrupted after step %d;", k)) || !strings.Contains(err.Error(), "-resume "+s.Out) {
		t.Fatalf("stopped run's message: %v", err)
	}
	if err := Run(ctx, Config{Resume: s.Out}, Options{}); err != nil {
		t.Fatalf("resumed run: %v", err)
	}
	return straight, rundirtest.Read(t, s.Out)
}

// TestResumeIsExact: for every sparsifier, a run stopped after step k and
// resumed ends bit for bit where the uninterrupted run ends: parameters,
// optimizer state, every rank's residual, batch-norm statistics, reducer
// and model state, and every metric but the times. The split falls inside
// an epoch, after the methods' warm-ups have started, and the resumed run
// is given only -resume (its configuration comes from run.json). The full
// suite also resumes MiCRO and Ok-Topk with 1 and 5 workers.
func TestResumeIsExact(t *testing.T) {
	names := sparsify.Names()
	if testing.Short() {
		names = []string{"micro", "dragonn", "oktopk", "lags"}
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			c := resumeConfigFor(t, name, 9)
			straight, split := straightAndSplit(t, c, 4)
			if msg := rundirtest.Diff(straight, split); msg != "" {
				t.Fatalf("resumed run differs from the straight one: %s", msg)
			}
		})
	}
	// Other worker counts: one (no peers), and five (uneven shares).
	if testing.Short() {
		return
	}
	for _, n := range []int{1, 5} {
		for _, name := range []string{"micro", "oktopk"} {
			t.Run(fmt.Sprintf("%s/workers=%d", name, n), func(t *testing.T) {
				c := resumeConfigFor(t, name, 9)
				c.Workers = Set(n)
				straight, split := straightAndSplit(t, c, 4)
				if msg := rundirtest.Diff(straight, split); msg != "" {
					t.Fatalf("resumed run differs from the straight one: %s", msg)
				}
			})
		}
	}
}

// TestResumeWithoutStateDiffers is the check that TestResumeIsExact can
// fail: with the reducers' and models' state left out of the checkpoint,
// the resumed run ends elsewhere.
func TestResumeWithoutStateDiffers(t *testing.T) {
	c := resumeConfigFor(t, "micro", 9)
	ctx := context.Background()
	if err := Run(ctx, c, Options{}); err != nil {
		t.Fatal(err)
	}
	straight := rundirtest.Read(t, c.Out)
	s := c
	s.Out = t.TempDir()
	if err := Run(ctx, s, stopAt(4)); !errors.Is(err, ErrInterrupted) {
		t.Fatal(err)
	}
	// Drop MiCRO's state from every rank's part, as a checkpoint of model
	// weights alone would.
	ckd, _ := rundir.Latest(s.Out)
	ck, _ := rundir.ReadCheckpoint[Config](ckd)
	for r := range ck.Workers {
		sh, err := ck.ReadShard(ckd, r)
		if err != nil {
			t.Fatal(err)
		}
		fresh, _ := sparsify.New("micro", sparsify.Options{Density: 0.05, Layout: mustFlat(t, len(sh.Residual)), Comm: oneRank(), Seed: 1})
		if sh.Reducer, err = fresh.State(); err != nil {
			t.Fatal(err)
		}
		if ck.Shards[r], err = rundir.WriteShard(s.Out, sh); err != nil {
			t.Fatal(err)
		}
	}
	if err := rundir.WriteShared(s.Out, ck); err != nil {
		t.Fatal(err)
	}
	if err := Run(ctx, Config{Resume: s.Out}, Options{}); err != nil {
		t.Fatal(err)
	}
	if rundirtest.Diff(straight, rundirtest.Read(t, s.Out)) == "" {
		t.Fatal("a resume without the reducers' state ends where the straight run does: the equivalence test cannot fail")
	}
}

// failingModel fails its training step at a given step on one rank, as a
// worker that dies does.
type failingModel struct {
	models.Model
	failAt, steps int
	panics        bool
	// at is set to when the step failed.
	at *atomic.Pointer[time.Time]
}

func (m *failingModel) SaveState() ([]byte, error) { return m.Model.(models.Stateful).SaveState() }
func (m *failingModel) LoadState(b []byte) error   { return m.Model.(models.Stateful).LoadState(b) }

func (m *failingModel) TrainStep(ctx context.Context, b models.Batch, p, g device.Buffer) (models.StepResult, error) {
	m.steps++
	if m.steps == m.failAt {
		if m.at != nil {
			now := time.Now()
			m.at.Store(&now)
		}
		if m.panics {
			panic("worker died")
		}
		return models.StepResult{}, errors.New("worker died")
	}
	return m.Model.TrainStep(ctx, b, p, g)
}

// TestDeadWorkerThenResume: a worker that fails or panics mid-run ends the
// whole job at once with an error naming its rank, the step and the last
// checkpoint (-checkpoint-every); -resume then completes the run, whose
// end (parameters, every rank's state, metrics without duplicates) equals
// an uninterrupted run's.
func TestDeadWorkerThenResume(t *testing.T) {
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panic=%v", panics), func(t *testing.T) {
			if testing.Short() && panics {
				t.Skip("long; runs in the full suite")
			}
			c := resumeConfigFor(t, "dgc", 10)
			c.CheckpointEvery, c.EvalEvery = 3, 3
			ctx := context.Background()
			if err := Run(ctx, c, Options{}); err != nil {
				t.Fatal(err)
			}
			straight := rundirtest.Read(t, c.Out)
			s := c
			s.Out = t.TempDir()
			var rank atomic.Int32
			var failedAt atomic.Pointer[time.Time]
			err := Run(ctx, s, Options{wrapModel: func(m models.Model) models.Model {
				if rank.Add(1) == 2 { // the second worker built
					return &failingModel{Model: m, failAt: 8, panics: panics, at: &failedAt}
				}
				return m
			}})
			if err == nil {
				t.Fatal("the job went on without a worker")
			}
			if at := failedAt.Load(); at == nil {
				t.Fatal("the worker did not fail")
			} else if d := time.Since(*at); d > 10*time.Second {
				t.Fatalf("the job took %v to end after the worker failed", d)
			} else {
				t.Logf("the job ended %v after the worker failed", d)
			}
			msg := err.Error()
			t.Log(msg)
			for _, want := range []string{"rank ", "step 8", "step-000000006", "resume with: train -resume " + s.Out} {
				if !strings.Contains(msg, want) {
					t.Errorf("message %q lacks %q", msg, want)
				}
			}
			if strings.Count(msg, "train:") != 1 || strings.Count(msg, "rank ") != 1 {
				t.Errorf("message %q: want one train: prefix and the rank named once", msg)
			}
			// The dead run recorded step 7 (after its checkpoint at 6); the
			// resumed run records it once.
			if err := Run(ctx, Config{Resume: s.Out}, Options{}); err != nil {
				t.Fatal(err)
			}
			if d := rundirtest.Diff(straight, rundirtest.Read(t, s.Out)); d != "" {
				t.Fatalf("resumed after a dead worker: %s", d)
			}
		})
	}
}

func mustFlat(t *testing.T, n int) sparsify.Layout {
	l, err := sparsify.FlatLayout(n)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func oneRank() comm.Communicator { return local.New(1).Comm(0) }

// TestResumeAcrossEpochs: stops at an epoch's end (after its checkpoint
// and evaluation), inside the next epoch and right after an -eval-every
// evaluation resume exactly; so does a run whose worker died during the
// evaluation at an epoch's end (the resumed run redoes it).
func TestResumeAcrossEpochs(t *testing.T) {
	base := func() Config {
		c := resumeConfigFor(t, "micro", 40)
		// The paper's small NCF, 3 workers: about 20 steps an epoch.
		c.Preset, c.Batch, c.EvalEvery = "paper", Set(8192), 7
		return c
	}
	perEpoch := 0
	{
		c := base()
		ds, err := LoadDataset(context.Background(), c.Defaults())
		if err != nil {
			t.Fatal(err)
		}
		tk, err := newTask(c.Defaults(), ds, 0, 3)
		if err != nil {
			t.Fatal(err)
		}
		perEpoch = tk.Len()
		tk.Close()
	}
	ks := []int{perEpoch, perEpoch + 3, 21}
	if testing.Short() {
		ks = ks[1:2]
	}
	for _, k := range ks {
		t.Run(fmt.Sprint("stop after ", k), func(t *testing.T) {
			straight, split := straightAndSplit(t, base(), k)
			if msg := rundirtest.Diff(straight, split); msg != "" {
				t.Fatalf("stopped after step %d (%d steps an epoch) and resumed: %s", k, perEpoch, msg)
			}
		})
	}
	t.Run("died during the evaluation", func(t *testing.T) {
		if testing.Short() {
			t.Skip("long; runs in the full suite")
		}
		c := base()
		ctx := context.Background()
		if err := Run(ctx, c, Options{}); err != nil {
			t.Fatal(err)
		}
		straight := rundirtest.Read(t, c.Out)
		s := c
		s.Out = t.TempDir()
		var built atomic.Int32
		err := Run(ctx, s, Options{wrapModel: func(m models.Model) models.Model {
			if built.Add(1) == 1 {
				return &failingEval{failingModel: failingModel{Model: m}, failAt: 3} // evaluations: steps 7, 14, epoch end
			}
			return m
		}})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("failed after step %d", perEpoch)) {
			t.Fatalf("err %v, want a failure after step %d", err, perEpoch)
		}
		if err := Run(ctx, Config{Resume: s.Out}, Options{}); err != nil {
			t.Fatal(err)
		}
		if msg := rundirtest.Diff(straight, rundirtest.Read(t, s.Out)); msg != "" {
			t.Fatalf("resumed after a failed evaluation: %s", msg)
		}
	})
}

// failingEval fails its failAt-th evaluation (its first batch).
type failingEval struct {
	failingModel
	failAt, evals int
	last          int
}

func (m *failingEval) Evaluate(ctx context.Context, b models.Batch, p device.Buffer) (models.EvalResult, error) {
	if m.steps != m.last {
		m.last = m.steps
		m.evals++
	}
	if m.evals == m.failAt {
		return models.EvalResult{}, errors.New("evaluation died")
	}
	return m.Model.Evaluate(ctx, b, p)
}

// TestResumeTakesRunJSON: -resume DIR alone continues the run as run.json
// configures it; given flags that contradict it are refused naming each
// difference (nothing is written); flags that only say how long or how to
// run may change; a mistyped folder is refused without creating it; the
// resumed run's record is one run (its start and command kept, the resume
// listed, wall times never going back).
func TestResumeTakesRunJSON(t *testing.T) {
	c := resumeConfigFor(t, "deft", 6)
	c.CheckpointEvery = 3
	ctx := context.Background()
	if err := Run(ctx, c, Options{CommandLine: []string{"train", "-first"}}); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(c.Out, "metrics.jsonl"))
	for _, tc := range []struct {
		given Config
		set   []string
		want  []string
	}{
		{Config{Sparsifier: "topk", Density: Set(0.2), Workers: Set(5)}, []string{"sparsifier", "density", "workers"},
			[]string{"-sparsifier topk: the run has deft", "-density 0.2: the run has 0.05", "-workers 5: the run has 3 workers"}},
		{Config{Model: "lstm", Seed: Set(uint64(9))}, nil, []string{"-model lstm: the run has ncf", "-seed 9: the run has 42"}},
		{Config{Out: t.TempDir()}, []string{"out"}, []string{"a resumed run continues in its own folder"}},
	} {
		tc.given.Resume = c.Out
		o := Options{}
		if tc.set != nil {
			o.Given = map[string]bool{"resume": true}
			for _, s := range tc.set {
				o.Given[s] = true
			}
		}
		err := Run(ctx, tc.given, o)
		if !errors.Is(err, ErrConfig) {
			t.Fatalf("%+v: err %v, want a refusal", tc.given, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("refusal %q lacks %q", err, w)
			}
		}
	}
	if after, _ := os.ReadFile(filepath.Join(c.Out, "metrics.jsonl")); !bytes.Equal(before, after) {
		t.Fatal("a refused resume changed metrics.jsonl")
	}
	// A mistyped folder: refused, and not created.
	typo := filepath.Join(t.TempDir(), "no-such-run")
	if err := Run(ctx, Config{Resume: typo}, Options{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "no such folder") {
		t.Fatalf("typo: %v", err)
	}
	if _, err := os.Stat(typo); err == nil {
		t.Fatal("a mistyped -resume created the folder")
	}
	empty := t.TempDir()
	if err := Run(ctx, Config{Resume: empty}, Options{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "no run.json") {
		t.Fatalf("a folder without a run: %v", err)
	}
	if ents, _ := os.ReadDir(empty); len(ents) != 0 {
		t.Fatalf("a refused resume wrote %v", ents)
	}
	// -resume with a longer run and a lower learning rate (what the
	// message of a divergence advises): allowed.
	var first RunInfo
	b, _ := os.ReadFile(filepath.Join(c.Out, "run.json"))
	json.Unmarshal(b, &first)
	lower := first.Config.LR.Value() / 2
	if err := Run(ctx, Config{Resume: c.Out, Steps: 9, LR: Set(lower)}, Options{CommandLine: []string{"train", "-resume", c.Out, "-steps", "9"}}); err != nil {
		t.Fatal(err)
	}
	var info RunInfo
	b, _ = os.ReadFile(filepath.Join(c.Out, "run.json"))
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}
	if !info.Start.Equal(first.Start) || info.CommandLine[1] != "-first" || len(info.Resumes) != 1 || info.Resumes[0].Step != 6 ||
		info.Resumes[0].Checkpoint != rundir.CheckpointDir(c.Out, 6) || info.Resumes[0].CommandLine[1] != "-resume" || info.Config.Steps != 9 ||
		info.Config.Sparsifier != "deft" || info.Workers != 3 || info.Config.LR.Value() != lower {
		t.Fatalf("run.json after the resume: %+v", info)
	}
	var steps []float64
	wall := -1.0
	for _, r := range rundirtest.Records(t, c.Out) {
		w := r["wall"].(float64)
		if w < wall {
			t.Fatalf("wall time goes back to %v after %v: %v", w, wall, r)
		}
		wall = w
		if r["type"] == "step" {
			steps = append(steps, r["step"].(float64))
		}
	}
	if len(steps) != 9 || steps[8] != 9 {
		t.Fatalf("steps %v", steps)
	}
}

// TestResumeIsExactOtherModels: the LSTM (dropout stream and hidden state
// carried across batches) and ResNet-18 (every rank's batch-norm
// statistics) resume exactly too.
func TestResumeIsExactOtherModels(t *testing.T) {
	if testing.Short() {
		t.Skip("long; runs in the full suite")
	}
	lstm := Config{Model: "lstm", Dataset: "wikitext2", DataDir: testenv.SharedData(t, "wikitext-2/train.txt"), Workers: Set(2), Steps: 6,
		Batch: Set(4), Sparsifier: "randomk", Density: Set(0.01), Quiet: true, BLAS: "gonum", MaxEvalBatches: 2, Out: t.TempDir()}
	resnet := Config{Model: "resnet18", Dataset: "cifar10", DataDir: testenv.SharedData(t, "cifar-10-batches-bin/data_batch_1.bin"), Workers: Set(2), Steps: 4,
		Batch: Set(4), EvalBatch: Set(8), Sparsifier: "micro", Density: Set(0.01), Quiet: true, BLAS: "gonum", MaxEvalBatches: 1, Out: t.TempDir()}
	for _, tc := range []struct {
		c Config
		k int
	}{{lstm, 3}, {resnet, 2}} {
		t.Run(tc.c.Model, func(t *testing.T) {
			straight, split := straightAndSplit(t, tc.c, tc.k)
			if msg := rundirtest.Diff(straight, split); msg != "" {
				t.Fatalf("resumed run differs from the straight one: %s", msg)
			}
		})
	}
}
