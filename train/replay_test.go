package train

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/recorded"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// stepRecords reads a run's step records and tells whether it has any
// evaluation record.
func stepRecords(t *testing.T, dir string) ([]metrics.Step, bool) {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []metrics.Step
	evals := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var s metrics.Step
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatal(err)
		}
		switch s.Type {
		case metrics.TypeStep:
			out = append(out, s)
		default:
			evals = true
		}
	}
	return out, evals
}

// replayOf replays rec with c's sparsifier and options into a new folder.
func replayOf(t *testing.T, rec string, c Config) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "replay")
	rc := Config{Gradients: rec, Sparsifier: c.Sparsifier, Density: c.Density, MethodOptions: c.MethodOptions, Out: out, Quiet: true, Seed: c.Seed}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := Run(ctx, rc, Options{}); err != nil {
		t.Fatalf("replay: %v", err)
	}
	return out
}

// sameReduction requires the replay's per-step records to say what the
// training run's said of the reduction: actual density, threshold, bytes,
// the operations and the error-feedback norm, bit for bit (LAGS' calls
// aside: see below).
func sameReduction(t *testing.T, what, trained, replayed string) {
	t.Helper()
	tr, _ := stepRecords(t, trained)
	rp, evals := stepRecords(t, replayed)
	if len(tr) == 0 || len(tr) != len(rp) {
		t.Fatalf("%s: %d training steps, %d replayed", what, len(tr), len(rp))
	}
	if evals {
		t.Errorf("%s: the replay wrote evaluation records", what)
	}
	num := func(p *metrics.Num) float64 {
		if p == nil {
			return math.NaN()
		}
		return float64(*p)
	}
	for i := range tr {
		a, b := tr[i], rp[i]
		for _, f := range []struct {
			name string
			x, y float64
		}{
			{"actual density", float64(a.ActualDensity), float64(b.ActualDensity)},
			{"bytes sent", float64(a.BytesSent), float64(b.BytesSent)},
			{"bytes received", float64(a.BytesRecv), float64(b.BytesRecv)},
			{"error norm", float64(a.ErrorNorm), float64(b.ErrorNorm)},
			{"threshold", num(a.Threshold), num(b.Threshold)},
		} {
			if math.Float64bits(f.x) != math.Float64bits(f.y) && !(math.IsNaN(f.x) && math.IsNaN(f.y)) {
				t.Errorf("%s step %d: %s %v in training, %v replayed", what, a.Step, f.name, f.x, f.y)
			}
		}
		if !math.IsNaN(float64(b.Loss)) {
			t.Errorf("%s step %d: the replay reports a loss (%v)", what, b.Step, b.Loss)
		}
		if len(a.Ops) != len(b.Ops) {
			t.Errorf("%s step %d: operations %v in training, %v replayed", what, a.Step, a.Ops, b.Ops)
		}
		// LAGS makes one pair of all-gathers per run of adjacent groups
		// started together: every group at once unpipelined (as it was
		// recorded), the groups each recorded tensor completes pipelined
		// (as it is replayed), so only its calls may differ.
		sets := strings.HasPrefix(what, "lags")
		for op, x := range a.Ops {
			y := b.Ops[op]
			if (x.Calls != y.Calls && !sets) || x.Elements != y.Elements || x.BytesSent != y.BytesSent || x.BytesRecv != y.BytesRecv {
				t.Errorf("%s step %d: %s %+v in training, %+v replayed", what, a.Step, op, x, y)
			}
		}
	}
}

// TestReplayReproducesTraining: every sparsifier trained on NCF with 4
// workers records its gradients (-record-gradients), and the replay of
// that recording with the same sparsifier gives the training run's actual
// densities, thresholds, bytes, operations and error norms bit for bit
// (the replay feeds the reducers training's inputs exactly). LAGS is
// replayed pipelined (the recorded model's hook), recorded unpipelined.
// DGC trains with SGD momentum 0.9, which its momentum correction applies
// and the replay takes from the recording.
func TestReplayReproducesTraining(t *testing.T) {
	names := sparsify.Names()
	if testing.Short() {
		names = []string{"topk", "deft", "lags", "threshold", "dgc"}
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			c := ncfConfig(t, 4, 3)
			c.Sparsifier, c.Density = name, Set(0.05)
			m, _ := sparsify.Lookup(name)
			if _, ok := m.Param("dense_warmup"); ok {
				c.MethodOptions = sparsify.Values{"dense_warmup": 0}
			}
			if m.CorrectsMomentum {
				c.Optimizer, c.Momentum, c.LR = "sgd", Set(0.9), Set(0.01)
			}
			c.Pipeline = "off"
			c.RecordGradients = filepath.Join(t.TempDir(), "grads")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if err := Run(ctx, c, Options{}); err != nil {
				t.Fatal(err)
			}
			rec, err := recorded.Open(c.RecordGradients)
			if err != nil {
				t.Fatal(err)
			}
			// ml-100k's ratings less each user's held-out one, each with 4
			// negatives, in batches of 256 on each of 4 workers: about 480
			// steps per epoch.
			if m := rec.Manifest; m.Workers != 4 || m.Steps != 3 || m.Model != "ncf" || m.Batch != 256 || m.Mode != "train" || !(m.StepTime.Seconds > 0) || len(m.StepTime.Samples) != 3 || m.StepsPerEpoch < 300 {
				t.Fatalf("manifest %+v", m)
			}
			out := replayOf(t, c.RecordGradients, c)
			sameReduction(t, name, c.Out, out)
			info, err := readRunInfo(out)
			if err != nil {
				t.Fatal(err)
			}
			if info.Replay == nil || info.Replay.Model != "ncf" || info.Replay.Workers != 4 || info.Config.Model != RecordedModel || info.CannotShow == "" || info.Workers != 4 {
				t.Fatalf("the replay's run.json: %+v", info)
			}
			if name == "lags" && !info.Pipelined {
				t.Errorf("lags was not replayed pipelined")
			}
			if m.CorrectsMomentum && (info.Config.Momentum.Value() != 0.9 || slices.ContainsFunc(info.Notes, func(n string) bool { return strings.Contains(n, "no SGD momentum") })) {
				t.Errorf("%s replayed without the recording's momentum: momentum %v, notes %q", name, info.Config.Momentum, info.Notes)
			}
		})
	}
}

// TestReplayReproducesResNet18 is the proof on the project's ResNet-18:
// two workers train three steps of CIFAR-10 with Top-k and with DEFT,
// recording their gradients; the replays give the same densities and
// bytes.
func TestReplayReproducesResNet18(t *testing.T) {
	if testing.Short() {
		t.Skip("trains ResNet-18 (about a minute); skipped in -short")
	}
	dir := testenv.SharedData(t, "cifar-10-batches-bin/data_batch_1.bin")
	for _, name := range []string{"topk", "deft"} {
		c := Config{Model: "resnet18", DataDir: dir, Workers: Set(2), Steps: 3, Batch: Set(8), Out: t.TempDir(), Quiet: true,
			MaxEvalBatches: 1, EvalBatch: Set(8), Sparsifier: name, Density: Set(0.01), RecordGradients: filepath.Join(t.TempDir(), "grads")}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		err := Run(ctx, c, Options{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		sameReduction(t, "resnet18 "+name, c.Out, replayOf(t, c.RecordGradients, c))
	}
}

// TestReplayReproducesLSTM: the LSTM clips each worker's gradient (-clip
// 0.4 by default) after it is recorded; the replay, told nothing, clips
// them again (the recording's run) and gives the training run's
// densities, bytes and error norms.
func TestReplayReproducesLSTM(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the LSTM on WikiText-2; skipped in -short")
	}
	c := Config{Model: "lstm", DataDir: testenv.SharedData(t, "wikitext-2/train.txt"), Workers: Set(2), Steps: 3, Batch: Set(4), Out: t.TempDir(), Quiet: true,
		MaxEvalBatches: 1, Sparsifier: "topk", Density: Set(0.01), RecordGradients: filepath.Join(t.TempDir(), "grads")}
	if err := Run(context.Background(), c, Options{}); err != nil {
		t.Fatal(err)
	}
	sameReduction(t, "lstm topk", c.Out, replayOf(t, c.RecordGradients, c))
}

// TestReplayRefusals: a replay's impossible requests are one-line errors
// naming the fix.
func TestReplayRefusals(t *testing.T) {
	c := ncfConfig(t, 2, 2)
	c.RecordGradients = filepath.Join(t.TempDir(), "grads")
	if err := Run(context.Background(), c, Options{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Workers = Set(3) }, "holds the gradients of 2 workers"},
		{func(c *Config) { c.Steps = 5 }, "holds 2 steps"},
		{func(c *Config) { c.LR = Set(0.1) }, "applies no update"},
		{func(c *Config) { c.Optimizer = "sgd" }, "applies no update"},
		{func(c *Config) { c.Dataset = "ml-100k" }, "reads no data set"},
		{func(c *Config) { c.Epochs = Set(2) }, "one pass"},
		{func(c *Config) { c.EvalEvery = 1 }, "no evaluation"},
		{func(c *Config) { c.RecordGradients = "x" }, "copy its folder"},
		{func(c *Config) { c.Sparsifier, c.MethodOptions = "lags", sparsify.Values{"max_ratio": 100.0} }, "backward pass, which a replay does not run"},
		{func(rc *Config) { rc.Gradients = filepath.Join(c.Out, "nope") }, "no such folder"},
		{func(rc *Config) { rc.Gradients = c.Out }, "not a recording"},
	} {
		rc := Config{Gradients: c.RecordGradients, Sparsifier: "topk", Out: filepath.Join(t.TempDir(), "r"), Quiet: true}
		tc.edit(&rc)
		err := Run(context.Background(), rc, Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want an error saying %q", rc, err, tc.want)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("error of several lines: %q", err)
		}
	}
	// Recording into a folder that holds a recording is refused; so is
	// recording pipelined.
	c2 := ncfConfig(t, 2, 1)
	c2.RecordGradients = c.RecordGradients
	if err := Run(context.Background(), c2, Options{}); err == nil || !strings.Contains(err.Error(), "already holds a recording") {
		t.Errorf("recording over a recording: %v", err)
	}
	c3 := ncfConfig(t, 2, 1)
	c3.Sparsifier, c3.Pipeline, c3.RecordGradients = "lags", "on", filepath.Join(t.TempDir(), "g")
	if err := Run(context.Background(), c3, Options{}); err == nil || !strings.Contains(err.Error(), "-overlap off") {
		t.Errorf("recording pipelined: %v", err)
	}
}

// TestReplayNonFiniteNamesWhatAReplayCanChange is a regression test: the
// replay of a recording that holds a NaN said "lower -lr or clip gradients
// (-clip)", which a replay cannot do. It must name what a replay can change
// (the recording, the method, the density) and nothing it cannot.
func TestReplayNonFiniteNamesWhatAReplayCanChange(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rec")
	params := []recorded.Param{{Tensor: layout.Tensor{Name: "w", Shape: []int{8, 4}, Size: 32}}, {Tensor: layout.Tensor{Name: "b", Shape: []int{4}, Size: 4}}}
	w, err := recorded.Create(dir, recorded.Manifest{Model: "toy", Source: "pytorch", Mode: "simulated", Workers: 2, Batch: 4, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	g := make([]float32, 36)
	for st := 1; st <= 3; st++ {
		for r := range 2 {
			for i := range g {
				g[i] = float32(st + r + i)
			}
			if st == 2 && r == 1 {
				g[5] = float32(math.NaN())
			}
			if err := w.Write(st, r, g); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Commit(3, recorded.StepTime{}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "replay")
	err = Run(context.Background(), Config{Gradients: dir, Sparsifier: "topk", Density: Set(0.1), Out: out, Quiet: true}, Options{})
	if err == nil {
		t.Fatal("a replay of a recording holding a NaN succeeded")
	}
	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{"not finite", "a replay cannot change the recorded gradients", "record the job again", "-sparsifier", "-density"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q: %s", want, msg)
		}
	}
	for _, bad := range []string{"-lr", "-clip", "resume"} {
		if strings.Contains(msg, bad) {
			t.Errorf("error names %q, which a replay cannot use: %s", bad, msg)
		}
	}
}
