package train

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/data"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/recorded"
)

// Dataset is a loaded data set shared read-only by the workers of a process.
type Dataset struct {
	Name  string
	CIFAR struct {
		Kind        data.CIFARKind
		Train, Test *data.CIFAR
	}
	Wiki *data.WikiText
	Rec  *data.Implicit
	// Recording is a replay's recorded gradients.
	Recording *recorded.Recording
}

// downloadName maps -dataset names to data.Download names.
var downloadName = map[string]string{
	"cifar10": "cifar10", "cifar100": "cifar100", "wikitext2": "wikitext2",
	"ml-100k": "ml-100k", "ml-1m": "ml-1m", "ml-20m": "ml-20m",
}

// terminalLog writes the download's progress messages for a person on
// standard error: the message and its fields, without a time or a level.
var terminalLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{
	ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey) {
			return slog.Attr{}
		}
		return a
	},
}))

// LoadDataset reads the configured data set from c.DataDir, downloading it
// first with c.Download.
func LoadDataset(ctx context.Context, c Config) (*Dataset, error) {
	if c.Model == RecordedModel {
		rec, err := recorded.Open(c.Gradients)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		if err := checkReplay(c, rec, false, 0); err != nil {
			return nil, err
		}
		return &Dataset{Name: rec.Manifest.Model, Recording: rec}, nil
	}
	if c.Download {
		if err := os.MkdirAll(c.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("train: creating -data-dir: %w", err)
		}
		src, err := data.LookupSource(downloadName[c.Dataset])
		if err == nil {
			err = data.DownloadSource(ctx, src, c.DataDir, data.DownloadOptions{Logger: terminalLog})
		}
		if err != nil {
			return nil, fmt.Errorf("train: downloading %s into %s: %w", c.Dataset, c.DataDir, err)
		}
	}
	d := &Dataset{Name: c.Dataset}
	hint := func(err error) error {
		if errors.Is(err, fs.ErrNotExist) && !c.Download {
			return &missingDataError{dataset: c.Dataset, dir: c.DataDir, err: err}
		}
		if errors.Is(err, data.ErrNotOfficial) {
			return fmt.Errorf("train: loading %s: %w (-download)", c.Dataset, err)
		}
		return fmt.Errorf("train: loading %s: %w", c.Dataset, err)
	}
	switch c.Dataset {
	case "cifar10", "cifar100":
		kind := data.CIFAR10
		if c.Dataset == "cifar100" {
			kind = data.CIFAR100
		}
		d.CIFAR.Kind = kind
		var err error
		if d.CIFAR.Train, err = data.LoadCIFAR(c.DataDir, kind, data.Train); err != nil {
			return nil, hint(err)
		}
		d.CIFAR.Test, err = data.LoadCIFAR(c.DataDir, kind, data.Test)
		if err != nil && kind == data.CIFAR10 {
			// A partial copy of the test set (e.g. the first 1,000 images).
			for _, p := range []string{filepath.Join(c.DataDir, kind.DirName(), "test_batch.first1000.bin"), filepath.Join(c.DataDir, "test_batch.first1000.bin")} {
				if t, err2 := data.ReadCIFARFile(p, kind); err2 == nil {
					d.CIFAR.Test, err = t, nil
					break
				}
			}
		}
		if err != nil {
			return nil, hint(err)
		}
	case "wikitext2":
		w, err := data.LoadWikiText(c.DataDir)
		if err != nil {
			return nil, hint(err)
		}
		d.Wiki = w
	case "ml-100k", "ml-1m", "ml-20m":
		cfg := data.ImplicitConfig{Seed: c.Seed.Value()}
		if c.Dataset == "ml-20m" {
			cfg.MinRatings = 20
		}
		r, err := data.LoadMovieLens(c.DataDir, c.Dataset, cfg)
		if err != nil {
			return nil, hint(err)
		}
		d.Rec = r
	default:
		return nil, fmt.Errorf("%w: unknown dataset %q", ErrConfig, c.Dataset)
	}
	return d, nil
}

// missingDataError is a data set that is not under -data-dir. Its message
// is the command line's: where it looked and the flag that fixes it; the
// data package's error (which files were tried, and how to download from
// Go) is its Unwrap.
type missingDataError struct {
	dataset, dir string
	err          error
}

func (e *missingDataError) Error() string {
	return fmt.Sprintf("train: data set %s not found in -data-dir %s; add -download to fetch it into that folder (checked by SHA-256), or set -data-dir to the folder that holds it", e.dataset, e.dir)
}

func (e *missingDataError) Unwrap() error { return e.err }

// NewModel builds the model c describes for data set d, initialised from
// seed, running on be (nil: the CPU).
func NewModel(c Config, d *Dataset, seed uint64, be engine.Backend) (models.Model, error) {
	switch c.Model {
	case RecordedModel:
		return newRecordedModel(d, be)
	case "resnet18":
		cfg := models.DefaultResNet18(d.CIFAR.Kind.Classes(), c.Batch.Value())
		cfg.Seed, cfg.Backend, cfg.LabelSmoothing = seed, be, c.LabelSmoothing
		return models.NewResNet(cfg)
	case "lstm":
		var cfg models.LSTMConfig
		if c.Preset == "small" {
			cfg = models.SmallLSTM(d.Wiki.Vocab.Len(), c.Batch.Value())
		} else {
			cfg = models.DefaultLSTM(d.Wiki.Vocab.Len(), c.Batch.Value())
		}
		cfg.Seed, cfg.Backend, cfg.LabelSmoothing = seed, be, c.LabelSmoothing
		return models.NewLSTM(cfg)
	case "ncf":
		var cfg models.NCFConfig
		if c.Preset == "paper" {
			cfg = models.PaperNCF(d.Rec.Users, d.Rec.Items, c.Batch.Value())
		} else {
			cfg = models.DefaultNCF(d.Rec.Users, d.Rec.Items, c.Batch.Value())
		}
		cfg.Seed, cfg.Backend = seed, be
		return models.NewNCF(cfg)
	}
	return nil, fmt.Errorf("%w: unknown model %q", ErrConfig, c.Model)
}

// metric is one evaluation result.
type metric struct {
	Name  string
	Value float64
}

// evaluation is the outcome of one evaluation (the same on every rank):
// its metrics, the primary one first, and what they were computed on.
type evaluation struct {
	metrics []metric
	// split is the split evaluated ("test" or "validation"), unit what
	// count and total count ("images", "tokens", "users").
	split, unit string
	// count is what the evaluation covered, total what the whole split
	// holds (over all ranks): count < total is a sample.
	count, total int
	// timeUp says that -max-time cut the evaluation short (a sample).
	timeUp bool
}

// partial reports whether the evaluation covered only a sample of its
// split.
func (e evaluation) partial() bool { return e.count < e.total }

// ShortRunEvalBatches is the least number of batches per worker that a run
// ending within its first epoch evaluates when -max-eval-batches is not
// given (see evalBound).
const ShortRunEvalBatches = 50

// evalBound returns the most batches per worker one evaluation covers (0:
// all). -max-eval-batches N is N. Without it a run that ends within its
// first epoch (-steps below the steps of an epoch) evaluates at most
// max(ShortRunEvalBatches, -steps) batches per worker: an evaluation batch
// costs a fraction of a training step, so the evaluation takes no longer
// than the training it follows, instead of minutes on the whole split
// after a few seconds of training (the LSTM's validation split is some 600
// batches). Such an evaluation is recorded, printed and reported as a
// sample.
func evalBound(c Config, perEpoch int) int {
	if c.MaxEvalBatches > 0 {
		return c.MaxEvalBatches
	}
	if c.Steps > 0 && c.Steps < perEpoch {
		return max(ShortRunEvalBatches, c.Steps)
	}
	return 0
}

// bounded is the number of evaluation batches of a split of n batches
// under the bound limit (0: none).
func bounded(n, limit int) int {
	if limit > 0 && limit < n {
		return limit
	}
	return n
}

// task is one rank's view of the data: training batches and evaluation.
type task interface {
	// Len is the number of training batches per epoch.
	Len() int
	SetEpoch(e int) error
	// Batch returns training batch i of the epoch and its sample count.
	Batch(i int) (models.Batch, int, error)
	// Evaluate evaluates m on this rank's share and combines the shares
	// over c (every rank gets the same result); more, when not nil, is
	// called after each of this rank's batches, and the rank evaluates no
	// further batch once it returns false (the run's time is up).
	Evaluate(ctx context.Context, m models.Model, params device.Buffer, c comm.Communicator, more func() bool) (evaluation, error)
	// EvalBatches is the number of batches of this rank's evaluation.
	EvalBatches() int
	Close()
}

func newTask(c Config, d *Dataset, rank, size int) (task, error) {
	lc := data.LoaderConfig{Batch: c.Batch.Value(), Rank: rank, Size: size, Seed: c.Seed.Value(), Train: true, NoAugment: c.NoAugment}
	switch c.Model {
	case RecordedModel:
		if err := checkReplay(c, d.Recording, true, size); err != nil {
			return nil, err
		}
		return newReplayTask(c, d, rank), nil
	case "resnet18":
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
	case "lstm":
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
	case "ncf":
		tr, err := data.NewRecLoader(d.Rec, lc, ncfNegatives)
		if err != nil {
			return nil, fmt.Errorf("train: MovieLens training loader: %w", err)
		}
		return &recTask{tr: tr, ds: d.Rec, rank: rank, size: size, usersPerBatch: c.EvalBatch.Value(), maxEval: evalBound(c, tr.Len())}, nil
	}
	return nil, fmt.Errorf("%w: unknown model %q", ErrConfig, c.Model)
}

// ncfNegatives is the number of negatives NCF trains with per positive.
const ncfNegatives = 4

func bpttOf(c Config) int {
	if c.Preset == "small" {
		return models.SmallLSTM(1, 1).BPTT
	}
	return models.DefaultLSTM(1, 1).BPTT
}

// sumOver adds every rank's vals element-wise in rank order (the same on
// every rank and every backend).
func sumOver(ctx context.Context, c comm.Communicator, vals []float64) ([]float64, error) {
	n := c.Size()
	send := make(comm.Int64s, len(vals))
	for i, v := range vals {
		send[i] = int64(math.Float64bits(v))
	}
	recv := make(comm.Int64s, n*len(vals))
	if err := c.AllGather(ctx, send, recv); err != nil {
		return nil, fmt.Errorf("train: combining evaluation results: %w", err)
	}
	out := make([]float64, len(vals))
	for r := 0; r < n; r++ {
		for i := range vals {
			out[i] += math.Float64frombits(uint64(recv[r*len(vals)+i]))
		}
	}
	return out, nil
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

func toInts(dst []int, src []int32) []int {
	dst = dst[:0]
	for _, v := range src {
		dst = append(dst, int(v))
	}
	return dst
}
