package train

import (
	"context"
	"fmt"
	"strings"

	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// A workload is one model the trainer trains, declared once in a file of
// its own: workload_resnet18.go, workload_lstm.go, workload_ncf.go, and
// replay.go's recorded gradients. It says which data sets the model trains
// on and how they are read, the model's sizes (-model-size) and kind, how
// the model is built, how a rank's batches and evaluation are cut (its
// task), and what its batches cost in memory. Adding a model is one such
// file, its entry in workloads, and the option defaults where it differs
// from the others (ByModel in package options' declarations).
type workload struct {
	name string
	// datasets are the -dataset values the model trains on; the first is
	// the default. None: a replay, which reads a recording instead.
	datasets []string
	// sizes are -model-size's values; sizeDoc describes them for an error.
	sizes   []string
	sizeDoc string
	// defaultSize is -model-size's default on data set ds.
	defaultSize func(ds string) string
	// kind is what the advisor knows the model as.
	kind sparsify.ModelKind
	// classifier says that the model's loss is a softmax cross-entropy
	// (-label-smoothing applies).
	classifier bool
	// hidden keeps the workload out of -model's list (a replay is chosen
	// with -gradients).
	hidden bool

	// load reads c's data set into d (c.Dataset is one of datasets).
	load func(ctx context.Context, c Config, d *Dataset) error
	// shape fills d with what the model's shape depends on without reading
	// the data, when it can (false: the data must be read).
	shape func(c Config, d *Dataset) bool
	// build builds the model for d, initialised from seed, on be.
	build func(c Config, d *Dataset, seed uint64, be engine.Backend) (models.Model, error)
	// task cuts d for rank of size ranks.
	task func(c Config, d *Dataset, rank, size int) (task, error)
	// evalBatch is an evaluation batch's size as the model sees it, for a
	// worker of size (nil: -eval-batch).
	evalBatch func(c Config, d *Dataset, size int) int
	// loaderBytes is what a worker's loaders hold for a training batch and
	// an evaluation batch of evalN (nil: nothing counted).
	loaderBytes func(c Config, evalN int) int64
	// checkBatch refuses a training batch larger than a worker's share of
	// the training data, before anything is allocated (nil: no check).
	checkBatch func(c Config, d *Dataset, size int) error
}

// workloads are the models the trainer knows.
var workloads = []*workload{resnet18Workload, lstmWorkload, ncfWorkload, replayWorkload}

// lookupWorkload returns the workload of -model name.
func lookupWorkload(name string) (*workload, bool) {
	for _, w := range workloads {
		if w.name == name {
			return w, true
		}
	}
	return nil, false
}

// workloadOf returns c's workload, or an error naming the models.
func workloadOf(c Config) (*workload, error) {
	if w, ok := lookupWorkload(c.Model); ok {
		return w, nil
	}
	return nil, fmt.Errorf("%w: unknown -model %q; use one of %s", ErrConfig, c.Model, strings.Join(Models, ", "))
}

// Models lists the models -model accepts.
var Models = func() []string {
	var names []string
	for _, w := range workloads {
		if !w.hidden {
			names = append(names, w.name)
		}
	}
	return names
}()

// Datasets maps each model to the data sets it trains on, its default
// first.
var Datasets = func() map[string][]string {
	m := map[string][]string{}
	for _, w := range workloads {
		if !w.hidden {
			m[w.name] = w.datasets
		}
	}
	return m
}()

// ModelKind returns the kind of a built-in model (false: not one).
func ModelKind(model string) (sparsify.ModelKind, bool) {
	w, ok := lookupWorkload(model)
	if !ok || w.hidden {
		return "", false
	}
	return w.kind, true
}

// ShapeDataset returns the data set c's model needs to be built for
// counting its parameters: without reading data where the model's shape
// does not depend on it (ResNet-18: the number of classes), else read
// (the LSTM's vocabulary, NCF's users and items).
func ShapeDataset(ctx context.Context, c Config) (*Dataset, error) {
	w, err := workloadOf(c)
	if err != nil {
		return nil, err
	}
	d := &Dataset{Name: c.Dataset}
	if w.shape != nil && w.shape(c, d) {
		return d, nil
	}
	return LoadDataset(ctx, c)
}

// fixedSize is a defaultSize for a model whose default size does not
// depend on the data set.
func fixedSize(s string) func(string) string { return func(string) string { return s } }
