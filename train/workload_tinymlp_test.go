package train

// The workload file of the model TestNewModelIsTwoFiles adds (what
// workload_<model>.go is for a built-in model): its data sets, sizes,
// kind, defaults, build and task, registered as the built-in ones are.
// With tinymlp_model_test.go it is the whole model: no other file names
// it.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// A two-layer MLP classifier on synthetic Gaussian blobs (test accuracy).
func init() { register(tinymlpWorkload) }

var tinymlpWorkload = &workload{
	name: "tinymlp",
	defaults: options.Values{"epochs": 3, "batch": 16, "eval_batch": 64, "lr": 0.1, "optimizer": "sgd", "momentum": 0.5,
		"weight_decay": 1e-3},
	datasets:    []string{"blobs-4", "blobs-10"},
	sizes:       []string{"narrow", "wide"},
	sizeDoc:     "narrow (16 hidden units) or wide (64 hidden units)",
	defaultSize: fixedSize("narrow"),
	kind:        sparsify.MLP,
	classifier:  true,
	// The data set is made, not read: the task draws it.
	load:  func(context.Context, Config, *Dataset) error { return nil },
	shape: func(Config, *Dataset) bool { return true },
	build: func(c Config, _ *Dataset, seed uint64, be engine.Backend) (models.Model, error) {
		hidden := 16
		if c.Preset == "wide" {
			hidden = 64
		}
		return newMLP(mlpConfig{Features: blobsFeatures, Hidden: hidden, Classes: blobsClasses(c.Dataset), Batch: c.Batch.Value(),
			LabelSmoothing: c.LabelSmoothing, Seed: seed, Backend: be})
	},
	task: func(c Config, _ *Dataset, rank, size int) (task, error) {
		b := newBlobs(c.Dataset)
		t := &blobsTask{blobs: b, rank: rank, size: size, batch: c.Batch.Value(), evalBatch: c.EvalBatch.Value(), seed: c.Seed.Value()}
		t.maxEval = evalBound(c, t.Len())
		return t, nil
	},
	checkBatch: func(c Config, _ *Dataset, size int) error {
		if b, share := c.Batch.Value(), blobsTrain/size; b > share {
			return fmt.Errorf("%w: -batch %d: each of %d workers has %d of tinymlp's %d training examples; lower -batch (at most %d)", ErrConfig, b, size, share, blobsTrain, share)
		}
		return nil
	},
}

// The blobs: blobsTrain training and blobsTest test examples of
// blobsFeatures features, in as many classes as the data set's name says.
const (
	blobsFeatures = 8
	blobsTrain    = 1024
	blobsTest     = 256
)

func blobsClasses(name string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "blobs-"))
	return n
}

// blobs is a data set: class centres drawn from N(0, 1) in every
// feature, unit noise around them.
type blobs struct {
	x, tx []float32 // training and test features, example-major
	y, ty []int
}

func newBlobs(name string) *blobs {
	r := rand.New(rand.NewPCG(uint64(blobsClasses(name)), 0xb10b5))
	C := blobsClasses(name)
	centres := make([]float64, C*blobsFeatures)
	for i := range centres {
		centres[i] = r.NormFloat64()
	}
	draw := func(n int) ([]float32, []int) {
		x, y := make([]float32, n*blobsFeatures), make([]int, n)
		for i := range n {
			y[i] = r.IntN(C)
			for f := range blobsFeatures {
				x[i*blobsFeatures+f] = float32(centres[y[i]*blobsFeatures+f] + r.NormFloat64())
			}
		}
		return x, y
	}
	b := &blobs{}
	b.x, b.y = draw(blobsTrain)
	b.tx, b.ty = draw(blobsTest)
	return b
}

// blobsTask is a rank's share: training examples rank, rank+size, ...
// shuffled per epoch with the run's seed; the test examples likewise.
type blobsTask struct {
	*blobs
	rank, size, batch, evalBatch int
	seed                         uint64
	maxEval                      int
	order                        []int
	feat                         []float32
	lab                          []int
}

func (t *blobsTask) share(n int) []int {
	var s []int
	for i := t.rank; i < n; i += t.size {
		s = append(s, i)
	}
	return s
}

func (t *blobsTask) Len() int { return len(t.share(blobsTrain)) / t.batch }
func (t *blobsTask) Close()   {}

func (t *blobsTask) SetEpoch(e int) error {
	t.order = t.share(blobsTrain)
	r := rand.New(rand.NewPCG(t.seed, uint64(e)))
	r.Shuffle(len(t.order), func(i, j int) { t.order[i], t.order[j] = t.order[j], t.order[i] })
	return nil
}

// gather puts the examples idx of (x, y) into the task's batch.
func (t *blobsTask) gather(x []float32, y []int, idx []int) models.Batch {
	t.feat, t.lab = t.feat[:0], t.lab[:0]
	for _, i := range idx {
		t.feat = append(t.feat, x[i*blobsFeatures:(i+1)*blobsFeatures]...)
		t.lab = append(t.lab, y[i])
	}
	return models.Batch{Images: t.feat, Labels: t.lab}
}

func (t *blobsTask) Batch(i int) (models.Batch, int, error) {
	return t.gather(t.x, t.y, t.order[i*t.batch:(i+1)*t.batch]), t.batch, nil
}

func (t *blobsTask) EvalBatches() int {
	return bounded((len(t.share(blobsTest))+t.evalBatch-1)/t.evalBatch, t.maxEval)
}

func (t *blobsTask) Evaluate(ctx context.Context, m models.Model, params device.Buffer, c comm.Communicator, more func() bool) (evaluation, error) {
	idx := t.share(blobsTest)
	var r models.EvalResult
	for i := range t.EvalBatches() {
		er, err := m.Evaluate(ctx, t.gather(t.tx, t.ty, idx[i*t.evalBatch:min((i+1)*t.evalBatch, len(idx))]), params)
		if err != nil {
			return evaluation{}, err
		}
		r.Add(er)
		if more != nil && !more() {
			break
		}
	}
	s, err := sumOver(ctx, c, []float64{r.LossSum, float64(r.Count), float64(r.Correct)})
	if err != nil {
		return evaluation{}, err
	}
	return evaluation{metrics: []metric{{"accuracy", s[2] / s[1]}, {"loss", s[0] / s[1]}},
		split: "test", unit: "examples", count: int(s[1]), total: blobsTest}, nil
}

// TestNewModelIsTwoFiles: a model declared in two test files alone — its
// graph and models.Model (tinymlp_model_test.go), its workload with its
// own defaults (workload_tinymlp_test.go) — is listed with its data sets,
// sizes and defaults in the help, takes its defaults, is refused with its
// own messages, trains with 2 workers and records itself in run.json.
func TestNewModelIsTwoFiles(t *testing.T) {
	d := Config{Model: "tinymlp", Out: "x"}.Defaults()
	if d.Dataset != "blobs-4" || d.Preset != "narrow" || d.Epochs.Value() != 3 || d.Batch.Value() != 16 || d.EvalBatch.Value() != 64 ||
		d.LR.Value() != 0.1 || d.Optimizer != "sgd" || d.Momentum.Value() != 0.5 || d.WeightDecay.Value() != 1e-3 || d.Clip.Value() != 0 {
		t.Fatalf("defaults: %+v", d)
	}
	if err := d.Validate(false); err != nil {
		t.Fatal(err)
	}
	smooth := d
	smooth.LabelSmoothing = 0.1 // a classifier
	if err := smooth.Validate(false); err != nil {
		t.Fatalf("-label-smoothing 0.1: %v", err)
	}
	if k, ok := ModelKind("tinymlp"); !ok || k != sparsify.MLP {
		t.Fatalf("ModelKind: %q %v", k, ok)
	}
	for key, want := range map[string]string{
		"model":    "model: resnet18, lstm, ncf or tinymlp (default ncf)",
		"dataset":  "ml-100k|ml-1m|ml-20m (ncf), blobs-4|blobs-10 (tinymlp)",
		"preset":   "; tinymlp narrow (16 hidden units) or wide (64 hidden units), narrow by default",
		"lr":       "learning rate (default resnet18 0.05, lstm 20, ncf 0.001, tinymlp 0.1)",
		"momentum": "(default resnet18 0.9, tinymlp 0.5, else 0)",
		"epochs":   "ncf 20, tinymlp 3)",
	} {
		if o, _ := options.Lookup(key); !strings.Contains(OptionUsage(o), want) {
			t.Errorf("the help of -%s: %q lacks %q", o.FlagName(), OptionUsage(o), want)
		}
	}
	for _, bad := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.Dataset = "cifar10" }, `-model tinymlp cannot train on -dataset "cifar10"; use one of blobs-4, blobs-10`},
		{func(c *Config) { c.Preset = "paper" }, `-model-size "paper" is not a size of tinymlp; use narrow (16 hidden units) or wide (64 hidden units)`},
	} {
		b := d
		bad.set(&b)
		if err := b.Validate(false); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Validate: %v; want %q", err, bad.want)
		}
	}
	big := Config{Model: "tinymlp", Workers: Set(2), Batch: Set(600), Out: t.TempDir(), Quiet: true}
	if err := Run(context.Background(), big, Options{}); err == nil || !strings.Contains(err.Error(), "-batch 600: each of 2 workers has 512 of tinymlp's 1024 training examples") {
		t.Errorf("-batch 600: %v", err)
	}

	c := Config{Model: "tinymlp", Workers: Set(2), Out: t.TempDir(), Quiet: true, BLAS: "gonum", Sparsifier: "topk", Density: Set(0.5)}
	losses := runLosses(t, c)
	if len(losses) != 3*blobsTrain/2/16 {
		t.Fatalf("%d losses, want %d", len(losses), 3*blobsTrain/2/16)
	}
	first, last := 0.0, 0.0
	for i := range 8 {
		first += losses[i] / 8
		last += losses[len(losses)-1-i] / 8
	}
	if math.IsNaN(last) || !(last < first/2) {
		t.Errorf("the loss went from %.3f to %.3f over %d steps; want it halved", first, last, len(losses))
	}
	var acc float64
	for _, r := range evalRecords(t, c.Out) {
		if r.Metric == "accuracy" {
			acc = float64(r.Value)
		}
	}
	t.Logf("loss %.3f → %.3f over %d steps, test accuracy %.3f", first, last, len(losses), acc)
	if acc < 0.8 {
		t.Errorf("test accuracy %.3f, want 0.8 at least (chance 0.25)", acc)
	}
	b, err := os.ReadFile(filepath.Join(c.Out, "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	var run struct {
		Config  Config
		Params  int
		Workers int
	}
	if err := json.Unmarshal(b, &run); err != nil {
		t.Fatal(err)
	}
	const params = blobsFeatures*16 + 16 + 16*4 + 4
	if run.Config.Model != "tinymlp" || run.Config.Dataset != "blobs-4" || run.Config.Preset != "narrow" || run.Config.LR.Value() != 0.1 ||
		run.Params != params || run.Workers != 2 {
		t.Fatalf("run.json: model %q, data set %q, size %q, lr %v, %d parameters, %d workers; want tinymlp, blobs-4, narrow, 0.1, %d, 2",
			run.Config.Model, run.Config.Dataset, run.Config.Preset, run.Config.LR, run.Params, run.Workers, params)
	}
}
