package train

import (
	"context"
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/data"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// The LSTM language model on WikiText-2 (validation perplexity), with
// DEFT's defaults (batch 32 per worker, clip 0.4, momentum 0, weight decay
// 0, ×0.1 at epochs 45 and 80) and lr 20, the PyTorch word-language-model
// example's rate for undoubled SGD (the DEFT harness's lr 15 is doubled by
// its quirk).
func init() { register(lstmWorkload) }

var lstmWorkload = &workload{
	name: "lstm",
	defaults: options.Values{"epochs": 90, "batch": 32, "eval_batch": 10, "lr": 20.0, "optimizer": "sgd", "decay_epochs": []int{45, 80},
		"clip": 0.4},
	datasets:    []string{"wikitext2"},
	sizes:       []string{"small", "default"},
	sizeDoc:     "small (2×200) or default (3×650)",
	defaultSize: fixedSize("small"),
	kind:        sparsify.RNN,
	classifier:  true,
	load: func(_ context.Context, c Config, d *Dataset) error {
		w, err := data.LoadWikiText(c.DataDir)
		d.Wiki = w
		return err
	},
	build: func(c Config, d *Dataset, seed uint64, be engine.Backend) (models.Model, error) {
		cfg := lstmConfig(c, d.Wiki.Vocab.Len())
		cfg.Seed, cfg.Backend, cfg.LabelSmoothing = seed, be, c.LabelSmoothing
		return models.NewLSTM(cfg)
	},
	task: func(c Config, d *Dataset, rank, size int) (task, error) {
		tr, err := data.NewBPTTLoader(d.Wiki.Train, data.BPTTConfig{Batch: c.Batch.Value(), BPTT: bpttOf(c), Rank: rank, Size: size})
		if err != nil {
			return nil, fmt.Errorf("train: WikiText-2 training loader: %w", err)
		}
		va, err := data.NewBPTTLoader(d.Wiki.Valid, data.BPTTConfig{Batch: c.EvalBatch.Value(), BPTT: bpttOf(c), Rank: rank, Size: size})
		if err != nil {
			return nil, fmt.Errorf("train: WikiText-2 validation loader: %w", err)
		}
		full := (tr.Rows() - 1) / bpttOf(c) // the model trains on full windows only
		if full < 1 {
			return nil, fmt.Errorf("train: WikiText-2 training split too short for %d workers × batch %d with BPTT %d", size, c.Batch.Value(), bpttOf(c))
		}
		// A whole evaluation predicts the next token of every row but the
		// last, in every rank's columns.
		total := (va.Rows() - 1) * c.EvalBatch.Value() * size
		return &lmTask{tr: tr, va: va, full: full, maxEval: evalBound(c, full), total: total}, nil
	},
	loaderBytes: func(c Config, evalN int) int64 {
		return int64(bpttOf(c)) * int64(c.Batch.Value()+evalN) * 2 * 4
	},
	// A worker's columns need two rows at least (data.NewBPTTLoader).
	checkBatch: func(c Config, d *Dataset, size int) error {
		b := c.Batch.Value()
		if d.Wiki == nil || len(d.Wiki.Train)/(b*size) >= 2 {
			return nil
		}
		return fmt.Errorf("%w: -batch %s: %d workers × %s sequences leave fewer than 2 tokens per sequence of the %s training tokens; lower -batch (at most %s)",
			ErrConfig, metrics.Thousands(b), size, metrics.Thousands(b), metrics.Thousands(len(d.Wiki.Train)), metrics.Thousands(len(d.Wiki.Train)/(2*size)))
	},
}

// lstmConfig is the LSTM of c's size for a vocabulary of vocab words.
func lstmConfig(c Config, vocab int) models.LSTMConfig {
	if c.Preset == "small" {
		return models.SmallLSTM(vocab, c.Batch.Value())
	}
	return models.DefaultLSTM(vocab, c.Batch.Value())
}

// bpttOf is the LSTM's unrolled length (BPTT window) at c's size.
func bpttOf(c Config) int { return lstmConfig(c, 1).BPTT }

type lmTask struct {
	tr, va         *data.BPTTLoader
	full           int
	maxEval        int
	total          int // tokens a whole evaluation predicts
	tokens, labels []int
}

func (t *lmTask) Len() int           { return t.full }
func (t *lmTask) SetEpoch(int) error { return nil }
func (t *lmTask) Close()             {}

func (t *lmTask) Batch(i int) (models.Batch, int, error) {
	b, err := t.tr.Batch(i)
	if err != nil {
		return models.Batch{}, 0, err
	}
	t.tokens = toInts(t.tokens, b.Input)
	t.labels = toInts(t.labels, b.Target)
	return models.Batch{Tokens: t.tokens, Labels: t.labels, Steps: b.Steps}, b.Steps * b.Batch, nil
}

func (t *lmTask) EvalBatches() int { return bounded(t.va.Len(), t.maxEval) }

func (t *lmTask) Evaluate(ctx context.Context, m models.Model, params device.Buffer, c comm.Communicator, more func() bool) (evaluation, error) {
	m.ResetState()
	var r models.EvalResult
	var tok, lab []int
	for i := range t.EvalBatches() {
		b, err := t.va.Batch(i)
		if err != nil {
			return evaluation{}, err
		}
		tok = toInts(tok, b.Input)
		lab = toInts(lab, b.Target)
		er, err := m.Evaluate(ctx, models.Batch{Tokens: tok, Labels: lab, Steps: b.Steps}, params)
		if err != nil {
			return evaluation{}, fmt.Errorf("train: evaluating: %w", err)
		}
		r.Add(er)
		if more != nil && !more() {
			break
		}
	}
	m.ResetState()
	s, err := sumOver(ctx, c, []float64{r.LossSum, float64(r.Count), float64(r.Correct)})
	if err != nil {
		return evaluation{}, err
	}
	return evaluation{metrics: []metric{{"perplexity", models.Perplexity(s[0], int(s[1]))}, {"loss", s[0] / s[1]}, {"accuracy", s[2] / s[1]}},
		split: "validation", unit: "tokens", count: int(s[1]), total: t.total}, nil
}
