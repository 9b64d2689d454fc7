package train

import (
	"context"
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/data"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// Neural collaborative filtering on MovieLens (HR@10 and NDCG@10 of
// leave-one-out ranking): the paper's size on the small sets, with Adam
// and 4 negatives per positive (the MLPerf/DEFT rate 0.0045 with betas
// (0.25, 0.5) is for a 2^20 global batch; for per-worker batches of 256
// Adam's defaults converge).
func init() { register(ncfWorkload) }

var ncfWorkload = &workload{
	name:     "ncf",
	defaults: options.Values{"epochs": 20, "batch": 256, "eval_batch": 64, "lr": 0.001, "optimizer": "adam"},
	datasets: []string{"ml-100k", "ml-1m", "ml-20m"},
	sizes:    []string{"paper", "default"},
	sizeDoc:  "paper (8 factors) or default (MLPerf, 64 factors)",
	// MLPerf's model on ml-20m, the paper's on the small sets.
	defaultSize: func(ds string) string {
		if ds == "ml-20m" {
			return "default"
		}
		return "paper"
	},
	kind: sparsify.Recommender,
	load: func(_ context.Context, c Config, d *Dataset) error {
		cfg := data.ImplicitConfig{Seed: c.Seed.Value()}
		if c.Dataset == "ml-20m" {
			cfg.MinRatings = 20
		}
		r, err := data.LoadMovieLens(c.DataDir, c.Dataset, cfg)
		d.Rec = r
		return err
	},
	build: func(c Config, d *Dataset, seed uint64, be engine.Backend) (models.Model, error) {
		var cfg models.NCFConfig
		if c.Preset == "paper" {
			cfg = models.PaperNCF(d.Rec.Users, d.Rec.Items, c.Batch.Value())
		} else {
			cfg = models.DefaultNCF(d.Rec.Users, d.Rec.Items, c.Batch.Value())
		}
		cfg.Seed, cfg.Backend = seed, be
		return models.NewNCF(cfg)
	},
	task: func(c Config, d *Dataset, rank, size int) (task, error) {
		tr, err := data.NewRecLoader(d.Rec, loaderConfig(c, rank, size), ncfNegatives)
		if err != nil {
			return nil, fmt.Errorf("train: MovieLens training loader: %w", err)
		}
		return &recTask{tr: tr, ds: d.Rec, rank: rank, size: size, usersPerBatch: c.EvalBatch.Value(), maxEval: evalBound(c, tr.Len())}, nil
	},
	// Each of the worker's share of users' candidates.
	evalBatch: func(c Config, d *Dataset, size int) int {
		b := c.EvalBatch.Value()
		if d.Rec != nil && d.Rec.Users > 0 {
			b = min(b, ceilDiv(d.Rec.Users, size)) * len(d.Rec.Candidates(0))
		}
		return b
	},
	loaderBytes: func(c Config, evalN int) int64 {
		return int64(c.Batch.Value())*(3*4+8) + int64(evalN)*2*8
	},
	checkBatch: func(c Config, d *Dataset, size int) error {
		if d.Rec == nil {
			return nil
		}
		return checkShare(c, len(d.Rec.TrainUser)*(1+ncfNegatives)/size, size)
	},
}

// ncfNegatives is the number of negatives NCF trains with per positive.
const ncfNegatives = 4

type recTask struct {
	tr            *data.RecLoader
	ds            *data.Implicit
	rank, size    int
	usersPerBatch int
	maxEval       int
	users, items  []int
	targets       []float32
}

func (t *recTask) Len() int             { return t.tr.Len() }
func (t *recTask) SetEpoch(e int) error { return t.tr.SetEpoch(e) }
func (t *recTask) Close()               { t.tr.Close() }

func (t *recTask) Batch(i int) (models.Batch, int, error) {
	b, err := t.tr.Batch(i)
	if err != nil {
		return models.Batch{}, 0, err
	}
	t.users = toInts(t.users, b.Users)
	t.items = toInts(t.items, b.Items)
	t.targets = append(t.targets[:0], b.Labels...)
	return models.Batch{Users: t.users, Items: t.items, Targets: t.targets}, b.N, nil
}

func (t *recTask) EvalBatches() int {
	users := 0
	if t.rank < t.ds.Users {
		users = (t.ds.Users - t.rank + t.size - 1) / t.size
	}
	return bounded((users+t.usersPerBatch-1)/t.usersPerBatch, t.maxEval)
}

// Evaluate ranks each of this rank's users' candidates (users rank,
// rank+size, ...) with the test positive last, as models.RankHit expects.
func (t *recTask) Evaluate(ctx context.Context, m models.Model, params device.Buffer, c comm.Communicator, more func() bool) (evaluation, error) {
	var hits, ndcg, count float64
	var users, items []int
	var spans [][]int
	batches := 0
	stopped := false
	flush := func() error {
		if len(users) == 0 {
			return nil
		}
		er, err := m.Evaluate(ctx, models.Batch{Users: users, Items: items}, params)
		if err != nil {
			return fmt.Errorf("train: evaluating: %w", err)
		}
		off := 0
		for _, cand := range spans {
			h, nd, err := models.RankHit(cand, er.Scores[off:off+len(cand)], 10)
			if err != nil {
				return fmt.Errorf("train: ranking: %w", err)
			}
			hits += h
			ndcg += nd
			count++
			off += len(cand)
		}
		users, items, spans = users[:0], items[:0], spans[:0]
		batches++
		if more != nil && !more() {
			stopped = true
		}
		return nil
	}
	for u := t.rank; u < t.ds.Users; u += t.size {
		if (t.maxEval > 0 && batches >= t.maxEval) || stopped {
			break
		}
		cand := t.ds.Candidates(u)
		// Negatives first, the positive last.
		span := make([]int, 0, len(cand))
		for _, it := range cand[1:] {
			span = append(span, int(it))
		}
		span = append(span, int(cand[0]))
		for _, it := range span {
			users = append(users, u)
			items = append(items, it)
		}
		spans = append(spans, span)
		if len(spans) == t.usersPerBatch {
			if err := flush(); err != nil {
				return evaluation{}, err
			}
		}
	}
	if (t.maxEval == 0 || batches < t.maxEval) && !stopped {
		if err := flush(); err != nil {
			return evaluation{}, err
		}
	}
	s, err := sumOver(ctx, c, []float64{hits, ndcg, count})
	if err != nil {
		return evaluation{}, err
	}
	return evaluation{metrics: []metric{{"hr10", s[0] / s[2]}, {"ndcg10", s[1] / s[2]}},
		split: "test", unit: "users", count: int(s[2]), total: t.ds.Users}, nil
}
