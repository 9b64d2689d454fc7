package train

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"

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
// first with c.Download (a replay opens its recording).
func LoadDataset(ctx context.Context, c Config) (*Dataset, error) {
	w, err := workloadOf(c)
	if err != nil {
		return nil, err
	}
	d := &Dataset{Name: c.Dataset}
	if len(w.datasets) == 0 {
		return d, w.load(ctx, c, d)
	}
	if !slices.Contains(w.datasets, c.Dataset) {
		return nil, fmt.Errorf("%w: -model %s cannot train on -dataset %q; use one of %s", ErrConfig, c.Model, c.Dataset, strings.Join(w.datasets, ", "))
	}
	if c.Download {
		if err := os.MkdirAll(c.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("train: creating -data-dir: %w", err)
		}
		src, err := data.LookupSource(c.Dataset)
		if err == nil {
			err = data.DownloadSource(ctx, src, c.DataDir, data.DownloadOptions{Logger: terminalLog})
		}
		if err != nil {
			return nil, fmt.Errorf("train: downloading %s into %s: %w", c.Dataset, c.DataDir, err)
		}
	}
	if err := w.load(ctx, c, d); err != nil {
		if errors.Is(err, fs.ErrNotExist) && !c.Download {
			return nil, &missingDataError{dataset: c.Dataset, dir: c.DataDir, err: err}
		}
		if errors.Is(err, data.ErrNotOfficial) {
			return nil, fmt.Errorf("train: loading %s: %w (-download)", c.Dataset, err)
		}
		return nil, fmt.Errorf("train: loading %s: %w", c.Dataset, err)
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
	w, err := workloadOf(c)
	if err != nil {
		return nil, err
	}
	return w.build(c, d, seed, be)
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

// newTask cuts d for rank of size ranks, as c's workload does.
func newTask(c Config, d *Dataset, rank, size int) (task, error) {
	w, err := workloadOf(c)
	if err != nil {
		return nil, err
	}
	return w.task(c, d, rank, size)
}

// loaderConfig is the training loader's configuration of rank.
func loaderConfig(c Config, rank, size int) data.LoaderConfig {
	return data.LoaderConfig{Batch: c.Batch.Value(), Rank: rank, Size: size, Seed: c.Seed.Value(), Train: true, NoAugment: c.NoAugment}
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

func toInts(dst []int, src []int32) []int {
	dst = dst[:0]
	for _, v := range src {
		dst = append(dst, int(v))
	}
	return dst
}
