package train

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// ErrConfig is wrapped by every error Validate returns.
var ErrConfig = errors.New("train: invalid configuration")

//go:generate go test -run ^TestConfigGenerated$ -update-config .

// Get returns the value of the general option key (its run.json key, as
// package options declares it) in the Go type of its kind (options.Kind):
// a string, bool, int, uint64, float64, time.Duration, []int or
// options.Values; nil for an unset Optional, a nil list or map, and a key
// Config does not have. The command line's flags, the sweep's command
// lines and the checks of single options read the configuration through
// it.
func (c *Config) Get(key string) any {
	if f, ok := fields[key]; ok {
		return f(c).get()
	}
	return nil
}

// Set sets the general option key to v, a value of its kind's Go type (as
// Get returns them; options.Option's Parse and Check give them); nil
// unsets it. A value of another type is a programming error: Set panics.
func (c *Config) Set(key string, v any) {
	if f, ok := fields[key]; !ok || !f(c).put(v) {
		panic(fmt.Sprintf("train: Config.Set(%q, %v): no option of a %T", key, v, v))
	}
}

// field is a Config field, read and written as the Go type of its
// option's kind: an Optional, or a plain field.
type field interface {
	get() any
	// put sets the field to v (nil: unset, or zero) and reports whether v
	// has the field's type.
	put(v any) bool
}

type plainField[T any] struct{ p *T }

func plain[T any](p *T) field { return plainField[T]{p} }

func (f plainField[T]) get() any {
	switch x := any(*f.p).(type) {
	case []int:
		if x == nil {
			return nil
		}
	case options.Values:
		if x == nil {
			return nil
		}
	}
	return *f.p
}

func (f plainField[T]) put(v any) bool {
	x, ok := v.(T)
	if ok || v == nil {
		*f.p = x
	}
	return ok || v == nil
}

func (o *Optional[T]) get() any {
	if o.set {
		return o.v
	}
	return nil
}

func (o *Optional[T]) put(v any) bool {
	x, ok := v.(T)
	if ok {
		*o = Set(x)
	} else if v == nil {
		*o = Optional[T]{}
	}
	return ok || v == nil
}

// text returns the value of the String option key ("" for other kinds).
func (c *Config) text(key string) string {
	s, _ := c.Get(key).(string)
	return s
}

// Defaults fills the unset fields of c with the model's defaults and
// returns it. Fields the user set are kept, zero included. The defaults
// are declared by each model (its workload, taken from the papers' code
// and adapted to PyTorch's momentum semantics), else by the option in
// package options, with the options they depend on: the optimizer's own values are filled only
// for the optimizer in use (momentum and weight decay for SGD, β1, β2 and
// ε for Adam), the step decay only for the step schedule. What depends on
// more than the model is decided here: the model itself (a replay's, with
// Gradients), the data set (the model's first), the data folder, the
// model size (the model's, by data set), the density (paperDensity) and
// the method options (the sparsifier's, sparsify.Method.Defaults).
func (c Config) Defaults() Config {
	if c.Model == "" {
		c.Model = c.declared("model").(string)
		if c.Gradients != "" {
			c.Model = RecordedModel
		}
	}
	w, known := lookupWorkload(c.Model)
	if c.Dataset == "" && known && len(w.datasets) > 0 {
		c.Dataset = w.datasets[0]
	}
	if c.DataDir == "" {
		c.DataDir = os.Getenv("TRAIN_DATA_DIR")
		if c.DataDir == "" {
			c.DataDir = "./data"
		}
	}
	if c.Preset == "" && known && w.defaultSize != nil {
		c.Preset = w.defaultSize(c.Dataset)
	}
	if c.Sparsifier == "" {
		c.Sparsifier = c.declared("sparsifier").(string)
	}
	c.Density.orDefault(paperDensity(c.Sparsifier, c.Model))
	c.fillDefaults()
	if c.DecayEpochs == nil {
		c.DecayEpochs = []int{} // onecycle: not the model's step decay
	}
	if m, ok := sparsify.Lookup(c.Sparsifier); ok {
		c.MethodOptions = m.Defaults(c.MethodOptions)
	}
	if len(c.MethodOptions) == 0 {
		c.MethodOptions = nil
	}
	return c
}

// paperDensity is the default density: the one the method's paper trains
// the model's kind with where this project follows it, as the method
// declares it (sparsify.Method.Density), and sparsify.DefaultDensity
// otherwise.
func paperDensity(sparsifier, model string) float64 {
	kind, _ := ModelKind(model)
	m, _ := sparsify.Lookup(sparsifier)
	return m.DefaultDensityFor(kind)
}

// PipelineOn reports whether the run overlaps the reducer's communication
// with the backward pass, -overlap (auto: for a method that declares itself
// Pipelined, dense and LAGS, unless its gradient is clipped locally or
// recorded, which need the whole gradient first).
func (c Config) PipelineOn() bool {
	switch c.Pipeline {
	case "on":
		return true
	case "auto":
		return pipelined(c.Sparsifier) && !c.ClipLocal() && c.RecordGradients == ""
	}
	return false
}

// ClipLocal reports whether the run clips each worker's gradient before
// error feedback (Clip > 0 and ClipAt local, or auto with a method that is
// not pipelined: a pipelined one, LAGS, clips the averaged gradient, as the
// LAGS reference does), which needs the whole gradient before the
// reduction starts.
func (c Config) ClipLocal() bool {
	return c.Clip.Value() > 0 && (c.ClipAt == "local" || (c.ClipAt != "aggregated" && !pipelined(c.Sparsifier)))
}

// pipelined reports whether the method named name reduces layer groups
// during the backward pass (sparsify.Method.Pipelined).
func pipelined(name string) bool {
	m, ok := sparsify.Lookup(name)
	return ok && m.Pipelined
}

// ClipAggregated reports whether the run clips the averaged gradient after
// the reduction (Clip > 0 and not ClipLocal).
func (c Config) ClipAggregated() bool { return c.Clip.Value() > 0 && !c.ClipLocal() }

// Validate checks c (after Defaults) and returns an error wrapping ErrConfig
// that says what is wrong and how to fix it. underMPI tells whether the run
// is a process of an mpirun job. Each option's own range and choices are
// declared in package options (checkOptions); Validate adds the rules that
// tie options together.
func (c Config) Validate(underMPI bool) error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...))
	}
	replay := c.Model == RecordedModel || c.Gradients != ""
	if replay {
		c.checkReplay(bad)
	}
	// An unknown model has no defaults: say only that, not what its missing
	// defaults would make wrong.
	w, err := workloadOf(c)
	if !replay && (err != nil || w.hidden) {
		return fmt.Errorf("%w: unknown -model %q; use one of %s", ErrConfig, c.Model, strings.Join(Models(), ", "))
	}
	// Each option on its own first (finite, set, in its range, one of its
	// choices, as package options declares it): the rules below, which tie
	// options together, read the values. A replay's learning rate is 0
	// (checkReplay).
	c.checkOptions(func(key string) bool { return replay && key == "lr" }, bad)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if !replay {
		if !slices.Contains(w.datasets, c.Dataset) {
			bad("-model %s cannot train on -dataset %q; use one of %s", c.Model, c.Dataset, strings.Join(w.datasets, ", "))
		}
		if !slices.Contains(w.sizes, c.Preset) {
			bad("-%s %q is not a size of %s; use %s", flagOf("preset"), c.Preset, c.Model, w.sizeDoc)
		}
	}
	method, known := sparsify.Lookup(c.Sparsifier)
	if !known {
		bad("unknown -sparsifier %q; use one of %s", c.Sparsifier, strings.Join(sparsify.Names(), ", "))
	} else {
		c.validateMethodOptions(method, underMPI, bad)
		if method.CorrectsMomentum && c.Optimizer == "sgd" && c.Nesterov {
			bad("-sparsifier %s applies the momentum itself (DGC's momentum correction, with plain momentum); drop -nesterov", c.Sparsifier)
		}
	}
	if c.Pipeline == "on" {
		if !pipelined(c.Sparsifier) {
			var ms []string
			for _, m := range sparsify.Methods() {
				if m.Pipelined {
					ms = append(ms, m.Name)
				}
			}
			bad("-overlap on needs -sparsifier %s (the methods that reduce groups of layers, which can start during the backward pass), not %s: it selects over the whole gradient, which is complete only when the backward pass ends; drop -overlap on", strings.Join(ms, " or "), c.Sparsifier)
		}
		if c.ClipLocal() {
			bad("-overlap on cannot be combined with -clip %v -clip-at local: clipping each worker's gradient needs the whole gradient before error feedback; pass -clip-at aggregated (clip the averaged gradient, as the LAGS reference and DDP users do), -clip 0 or -overlap off", c.Clip)
		}
	}

	workers := c.Workers.Value()
	if workers > 1024 {
		bad("-workers %d is more than 1024 simulated workers; use mpirun for large jobs", workers)
	}
	if underMPI && workers > 1 {
		bad("-workers %d under mpirun: each mpirun process is one worker; use mpirun -np %d instead", workers, workers)
	}
	if c.LabelSmoothing > 0 && !replay && !w.classifier {
		var cls []string
		for _, w := range workloads {
			if w.classifier {
				cls = append(cls, w.name)
			}
		}
		bad("-label-smoothing applies to the classifiers (%s), whose loss is a softmax cross-entropy; %s's is not", strings.Join(cls, ", "), c.Model)
	}
	switch c.Optimizer {
	case "sgd":
		if c.Nesterov && c.Momentum.Value() == 0 {
			bad("-nesterov needs a momentum; pass -momentum 0.9 (or leave out -nesterov)")
		}
		if c.Beta1.IsSet() || c.Beta2.IsSet() || c.Eps.IsSet() {
			bad("-beta1, -beta2 and -eps apply to -optimizer adam only; SGD uses -momentum")
		}
	case "none":
		if !replay {
			bad("-optimizer none applies only to replays of recorded gradients (train replay); use sgd or adam")
		}
	case "adam":
		if c.Momentum.IsSet() || c.Nesterov || c.WeightDecay.IsSet() {
			bad("-momentum, -nesterov and -wd apply to -optimizer sgd only; Adam uses -beta1 (and has no weight decay)")
		}
	default:
		bad("-optimizer %q: use sgd or adam", c.Optimizer)
	}
	if c.LRSchedule == "onecycle" {
		if len(c.DecayEpochs) > 0 || c.DecayFactor.IsSet() {
			bad("-decay-epochs and -decay-factor apply to -lr-schedule step; onecycle anneals by itself (drop them)")
		}
		if c.WarmupEpochs >= float64(c.Epochs.Value()) {
			bad("-warmup-epochs %v: with -lr-schedule onecycle the rise must end before the last epoch (-epochs %d)", c.WarmupEpochs, c.Epochs.Value())
		}
	}
	if c.Device == "cpu" {
		if c.TF32 {
			bad("-tf32 applies to -device cuda only")
		}
		if c.Deterministic {
			bad("-deterministic applies to -device cuda only (CPU runs are deterministic)")
		}
	}
	switch c.Comm {
	case "local":
		if underMPI {
			bad("-comm local runs workers in one process; under mpirun use -comm mpi (or nccl with -device cuda)")
		}
	case "mpi":
		if !underMPI {
			bad("-comm mpi needs the job started by mpirun (mpirun -np N train ...); in one process use -comm local")
		}
	case "nccl":
		if c.Device != "cuda" {
			bad("-comm nccl moves GPU memory; it needs -device cuda")
		}
	}
	if (c.NetLatency != 0) != (c.NetBandwidth != 0) {
		bad("-net-latency and -net-bandwidth emulate a network together; give both (e.g. -net-latency 50us -net-bandwidth 10) or neither")
	}
	if c.Device == "cuda" && c.Executors > 0 {
		bad("-executors %d with -device cuda: workers on GPUs keep a model each (on streams of their own); drop -executors", c.Executors)
	}
	if underMPI && c.Executors > 1 {
		bad("-executors %d under mpirun: each mpirun process is one worker with one executor; drop -executors", c.Executors)
	}
	if c.Out == "" && c.Resume == "" {
		bad("no run directory: pass -out DIR (or -resume DIR to continue a run)")
	}
	if c.RecordGradients != "" && c.Pipeline == "on" {
		bad("-record-gradients records the whole gradient after the backward pass: add -overlap off (overlapping changes when the reduction starts, not the gradients)")
	}
	return errors.Join(errs...)
}

// checkReplay checks what only a replay (Config.Gradients) requires.
func (c Config) checkReplay(bad func(string, ...any)) {
	switch {
	case c.Gradients == "":
		bad("-model %s replays recorded gradients: give their folder (-gradients DIR)", RecordedModel)
	case c.Model != RecordedModel:
		bad("-gradients replays recorded gradients, not -model %s: leave -model out", c.Model)
	}
	if c.Dataset != "" || c.Preset != "" {
		bad("a replay reads no data set and has no model size (-dataset %q, -%s %q): the recording is its data", c.Dataset, flagOf("preset"), c.Preset)
	}
	m, _ := sparsify.Lookup(c.Sparsifier)
	if c.Optimizer != "none" || (c.Momentum.IsSet() && !m.CorrectsMomentum) || c.WeightDecay.IsSet() || c.Beta1.IsSet() || c.Beta2.IsSet() || c.Eps.IsSet() || c.Nesterov || c.LR.Value() != 0 {
		bad("a replay applies no update: drop -optimizer, -lr, -momentum (kept only for a method that applies the momentum itself, dgc), -wd, -nesterov and Adam's flags")
	}
	if v := c.Momentum.Value(); c.Momentum.IsSet() && !(v >= 0 && v < 1) {
		bad("-momentum %v must be in [0, 1)", v)
	}
	if c.Epochs.Value() != 1 {
		bad("-epochs %d: a replay makes one pass over the recorded steps (use -steps for fewer)", c.Epochs.Value())
	}
	if c.EvalEvery != 0 || c.MaxEvalBatches != 0 {
		bad("a replay has no evaluation: drop -eval-every and -max-eval-batches")
	}
	if c.RecordGradients != "" {
		bad("-record-gradients in a replay would copy the recording; copy its folder instead")
	}
}

// validateMethodOptions checks MethodOptions against the method's
// declarations, then, when they are valid, the method's worker-count
// constraints (in one process) and its own check of the run
// (sparsify.Method.Check).
func (c Config) validateMethodOptions(m sparsify.Method, underMPI bool, bad func(string, ...any)) {
	valid := true
	for _, name := range slices.Sorted(maps.Keys(c.MethodOptions)) {
		v := c.MethodOptions[name]
		p, ok := m.Param(name)
		if !ok {
			valid = false
			if ms := sparsify.MethodsWithParam(name); len(ms) > 0 {
				q, _ := sparsify.Lookup(ms[0])
				p, _ := q.Param(name)
				bad("-%s applies only to -sparsifier %s, not %s", p.FlagName(), strings.Join(ms, " or "), m.Name)
			} else {
				bad("unknown method option %q (no sparsifier has it)", name)
			}
			continue
		}
		if _, err := p.Check(v); err != nil {
			valid = false
			bad("%v (%s: %s)", err, m.Name, p.Doc)
		}
	}
	if !valid {
		return
	}
	resolved, _ := m.Resolve(c.MethodOptions) // every option is checked
	if !underMPI && m.CheckWorkers != nil {
		if err := m.CheckWorkers(c.Workers.Value(), resolved); err != nil {
			bad("-workers %d: %v", c.Workers.Value(), err)
		}
	}
	if m.Check != nil {
		c.MethodOptions = resolved
		if err := m.Check(methodRun(c, sparsify.Layout{}, 0, 0)); err != nil {
			bad("%v", err)
		}
	}
}

// declared is the default of the option key for c's model: the model's
// (its workload's defaults), else the declaration's (options.Option's
// Default; nil: none).
func (c *Config) declared(key string) any {
	if w, ok := lookupWorkload(c.Model); ok {
		if d, ok := w.defaults[key]; ok {
			return d
		}
	}
	o, _ := options.Lookup(key)
	return o.Default
}

// fillDefaults sets every unset option that has a default for c's model
// (declared) and applies (its When), the options without a condition
// first, so that a condition reads the value of the option it names after
// that option's default.
func (c *Config) fillDefaults() {
	for _, conditional := range []bool{false, true} {
		for _, o := range options.All {
			if o.Retired != "" || (o.When != "") != conditional || !o.Applies(c.text) {
				continue
			}
			if v := c.Get(o.Key); v != nil && v != "" {
				continue
			}
			switch d := c.declared(o.Key).(type) {
			case nil:
			case []int:
				c.Set(o.Key, slices.Clone(d))
			default:
				c.Set(o.Key, d)
			}
		}
	}
}

// checkOptions checks each option on its own, as package options declares
// it (options.Option.Check): every number finite (then, if one is not,
// nothing else), every option that applies (its When; skip leaves others
// out) set where Defaults sets it (the optimizer's own values may be
// unset), valid. Validate adds the rules that tie options together.
func (c *Config) checkOptions(skip func(key string) bool, bad func(string, ...any)) {
	finite := true
	for _, o := range options.All {
		if x, ok := c.Get(o.Key).(float64); ok && (math.IsNaN(x) || math.IsInf(x, 0)) {
			_, err := o.Check(x)
			bad("%v", err)
			finite = false
		}
	}
	if !finite {
		return
	}
	for _, o := range options.All {
		if o.Retired != "" || skip(o.Key) || !o.Applies(c.text) {
			continue
		}
		v := c.Get(o.Key)
		if v == nil {
			if o.Optional && !strings.HasPrefix(o.When, "optimizer=") {
				bad("-%s is unset; call Config.Defaults before Validate", o.FlagName())
			}
			continue
		}
		if _, err := o.Check(v); err != nil {
			bad("%v", err)
		}
	}
}
