package train

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/data"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// ResNet-18 on CIFAR-10 or CIFAR-100 (test accuracy), with the defaults of
// DEFT's run.py: lr 0.05, momentum 0.9, weight decay 1e-4, batch 32 per
// worker, 200 epochs, ×0.1 at epoch 150.
func init() { register(resnet18Workload) }

var resnet18Workload = &workload{
	name: "resnet18",
	defaults: options.Values{"epochs": 200, "batch": 32, "eval_batch": 250, "lr": 0.05, "optimizer": "sgd", "momentum": 0.9,
		"weight_decay": 1e-4, "decay_epochs": []int{150}},
	datasets:    []string{"cifar10", "cifar100"},
	sizes:       []string{"default"},
	sizeDoc:     "default",
	defaultSize: fixedSize("default"),
	kind:        sparsify.CNN,
	classifier:  true,
	load:        loadCIFAR,
	shape: func(c Config, d *Dataset) bool {
		d.CIFAR.Kind = cifarKind(c.Dataset)
		return true
	},
	build: func(c Config, d *Dataset, seed uint64, be engine.Backend) (models.Model, error) {
		cfg := models.DefaultResNet18(d.CIFAR.Kind.Classes(), c.Batch.Value())
		cfg.Seed, cfg.Backend, cfg.LabelSmoothing = seed, be, c.LabelSmoothing
		return models.NewResNet(cfg)
	},
	task: func(c Config, d *Dataset, rank, size int) (task, error) {
		lc := loaderConfig(c, rank, size)
		// On a GPU the CPU waits for each step: it assembles (decodes,
		// augments) the next batch meanwhile.
		lc.Prefetch = c.Device == "cuda"
		tr, err := data.NewCIFARLoader(d.CIFAR.Train, lc)
		if err != nil {
			return nil, fmt.Errorf("train: CIFAR training loader: %w", err)
		}
		ec := lc
		ec.Train, ec.Batch = false, c.EvalBatch.Value()
		te, err := data.NewCIFARLoader(d.CIFAR.Test, ec)
		if err != nil {
			tr.Close()
			return nil, fmt.Errorf("train: CIFAR test loader: %w", err)
		}
		return &cifarTask{tr: tr, te: te, maxEval: evalBound(c, tr.Len()), total: d.CIFAR.Test.Len()}, nil
	},
	// At most the worker's share of the test split.
	evalBatch: func(c Config, d *Dataset, size int) int {
		b := c.EvalBatch.Value()
		if d.CIFAR.Test != nil {
			b = min(b, ceilDiv(d.CIFAR.Test.Len(), size))
		}
		return b
	},
	loaderBytes: func(c Config, evalN int) int64 {
		return int64(c.Batch.Value()+evalN) * (4*data.CIFARPixels + 3*4)
	},
	checkBatch: func(c Config, d *Dataset, size int) error {
		if d.CIFAR.Train == nil {
			return nil
		}
		return checkShare(c, d.CIFAR.Train.Len()/size, size)
	},
}

// cifarKind is the CIFAR data set named ds.
func cifarKind(ds string) data.CIFARKind {
	if ds == "cifar100" {
		return data.CIFAR100
	}
	return data.CIFAR10
}

// loadCIFAR reads c's CIFAR data set; of CIFAR-10's test split, a partial
// copy (e.g. the first 1,000 images) when the whole one is missing.
func loadCIFAR(_ context.Context, c Config, d *Dataset) error {
	kind := cifarKind(c.Dataset)
	d.CIFAR.Kind = kind
	var err error
	if d.CIFAR.Train, err = data.LoadCIFAR(c.DataDir, kind, data.Train); err != nil {
		return err
	}
	d.CIFAR.Test, err = data.LoadCIFAR(c.DataDir, kind, data.Test)
	if err != nil && kind == data.CIFAR10 {
		for _, p := range []string{filepath.Join(c.DataDir, kind.DirName(), "test_batch.first1000.bin"), filepath.Join(c.DataDir, "test_batch.first1000.bin")} {
			if t, err2 := data.ReadCIFARFile(p, kind); err2 == nil {
				d.CIFAR.Test = t
				return nil
			}
		}
	}
	return err
}

type cifarTask struct {
	tr, te  *data.CIFARLoader
	maxEval int
	total   int // test images
	labels  []int
}

func (t *cifarTask) Len() int             { return t.tr.Len() }
func (t *cifarTask) SetEpoch(e int) error { return t.tr.SetEpoch(e) }
func (t *cifarTask) Close()               { t.tr.Close(); t.te.Close() }

func (t *cifarTask) Batch(i int) (models.Batch, int, error) {
	b, err := t.tr.Batch(i)
	if err != nil {
		return models.Batch{}, 0, err
	}
	t.labels = toInts(t.labels, b.Labels)
	return models.Batch{Images: b.X, Labels: t.labels}, b.N, nil
}

func (t *cifarTask) EvalBatches() int { return bounded(t.te.Len(), t.maxEval) }

func (t *cifarTask) Evaluate(ctx context.Context, m models.Model, params device.Buffer, c comm.Communicator, more func() bool) (evaluation, error) {
	var r models.EvalResult
	var labels []int
	for i := range t.EvalBatches() {
		b, err := t.te.Batch(i)
		if err != nil {
			return evaluation{}, err
		}
		labels = toInts(labels, b.Labels)
		er, err := m.Evaluate(ctx, models.Batch{Images: b.X[:b.N*data.CIFARPixels], Labels: labels}, params)
		if err != nil {
			return evaluation{}, fmt.Errorf("train: evaluating: %w", err)
		}
		r.Add(er)
		if more != nil && !more() {
			break
		}
	}
	s, err := sumOver(ctx, c, []float64{float64(r.Correct), float64(r.Count), r.LossSum})
	if err != nil {
		return evaluation{}, err
	}
	return evaluation{metrics: []metric{{"accuracy", s[0] / s[1]}, {"loss", s[2] / s[1]}},
		split: "test", unit: "images", count: int(s[1]), total: t.total}, nil
}
