package train

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// A workload is one model the trainer trains, declared once in a file of
// its own that registers it (register): workload_resnet18.go,
// workload_lstm.go, workload_ncf.go, and replay.go's recorded gradients. It
// says which data sets the model trains on and how they are read, the
// model's sizes (-model-size) and kind, its defaults of the general
// options, how the model is built, how a rank's batches and evaluation are
// cut (its task), and what its batches cost in memory. Adding a model is
// its graph (package models) and one such file.
type workload struct {
	name string
	// defaults are the model's defaults of general options by key (their
	// declarations in package options say the rest): the values train
	// -help lists per model.
	defaults options.Values
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

// workloads are the models the trainer knows, in the order -model lists
// them: by kind (sparsify.ModelKinds' order), then by name.
var workloads []*workload

// register adds w to the models the trainer knows; each workload's file
// registers its own. It panics on a name taken, or a default that is not a
// valid value of a general option a model may default (Optional ones,
// strings and lists; a hidden workload's need not be in range).
func register(w *workload) {
	if _, dup := lookupWorkload(w.name); dup || w.name == "" {
		panic(fmt.Sprintf("train: model %q registered twice (or without a name)", w.name))
	}
	for k, d := range w.defaults {
		o, ok := options.Lookup(k)
		if !ok || !(o.Optional || o.Kind == options.String || o.Kind == options.IntList) || !o.Typed(d) {
			panic(fmt.Sprintf("train: model %s: a default %v (%T) for %q, which is no option a model defaults with a value of that type", w.name, d, d, k))
		}
		if _, err := o.Check(d); err != nil && !w.hidden {
			panic(fmt.Sprintf("train: model %s: default: %v", w.name, err))
		}
	}
	workloads = append(workloads, w)
	rank := func(w *workload) int { return slices.Index(sparsify.ModelKinds, w.kind) }
	slices.SortStableFunc(workloads, func(a, b *workload) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), strings.Compare(a.name, b.name))
	})
}

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
	return nil, fmt.Errorf("%w: unknown -model %q; use one of %s", ErrConfig, c.Model, strings.Join(Models(), ", "))
}

// Models lists the models -model accepts.
func Models() []string {
	var names []string
	for _, w := range listed() {
		names = append(names, w.name)
	}
	return names
}

// listed are the workloads -model lists (not a replay's).
func listed() []*workload {
	return slices.DeleteFunc(slices.Clone(workloads), func(w *workload) bool { return w.hidden })
}

// OptionUsage is the help text of the general option o: its declaration's
// (options.Option.Usage) with the defaults the models declare, and for
// -model, -dataset and -model-size the models, their data sets and sizes.
func OptionUsage(o options.Option) string {
	var parts []string
	for _, w := range listed() {
		switch o.Key {
		case "model":
			parts = append(parts, w.name)
		case "dataset":
			parts = append(parts, strings.Join(w.datasets, "|")+" ("+w.name+")")
		case "preset":
			parts = append(parts, w.name+" "+sizeHelp(w))
		}
	}
	switch o.Key {
	case "model":
		o.Doc += ": " + strings.Join(parts[:len(parts)-1], ", ") + " or " + parts[len(parts)-1]
	case "dataset":
		o.Doc += ": " + strings.Join(parts, ", ")
	case "preset":
		o.Doc += ": " + strings.Join(parts, "; ")
	}
	return o.Usage(ModelDefaults(o.Key)...)
}

// ModelDefaults are the defaults that the models -model lists declare for
// the general option key, in their order.
func ModelDefaults(key string) []options.Case {
	var cases []options.Case
	for _, w := range listed() {
		if d, ok := w.defaults[key]; ok {
			cases = append(cases, options.Case{Owner: w.name, Value: d})
		}
	}
	return cases
}

// sizeHelp describes w's sizes and which one is its default: "small
// (2×200) or default (3×650), small by default".
func sizeHelp(w *workload) string {
	if len(w.sizes) < 2 {
		return w.sizeDoc
	}
	on := map[string][]string{}
	main := ""
	for _, ds := range w.datasets {
		s := w.defaultSize(ds)
		on[s] = append(on[s], ds)
		if len(on[s]) > len(on[main]) {
			main = s
		}
	}
	var others []string
	for _, s := range w.sizes {
		if s != main && len(on[s]) > 0 {
			others = append(others, s+" on "+strings.Join(on[s], ", "))
		}
	}
	h := w.sizeDoc + ", " + main + " by default"
	if len(others) > 0 {
		h += " (" + strings.Join(others, "; ") + ")"
	}
	return h
}

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
