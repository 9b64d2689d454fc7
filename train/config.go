package train

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/sparsify"
)

// ErrConfig is wrapped by every error Validate returns.
var ErrConfig = errors.New("train: invalid configuration")

// Config is the configuration of one run. Unset values (empty strings,
// unset Optionals, a nil DecayEpochs, absent method options) select the
// per-model defaults of Defaults; a value that is set, zero included, is
// kept. After Defaults every Optional is set and MethodOptions holds every
// option of the method, so run.json records the whole configuration and
// reads back into an equal Config.
type Config struct {
	// Model is "resnet18", "lstm" or "ncf".
	Model string `json:"model"`
	// Dataset is "cifar10", "cifar100", "wikitext2", "ml-100k", "ml-1m" or
	// "ml-20m".
	Dataset string `json:"dataset"`
	// DataDir holds the data sets (default $TRAIN_DATA_DIR, else ./data).
	DataDir string `json:"data_dir"`
	// Download fetches a missing data set into DataDir first.
	Download bool `json:"download"`
	// Gradients is a folder of recorded gradients (package recorded) to
	// replay instead of training a model: Model is then "recorded", there
	// is no data set, optimizer or evaluation (see ReplayDefaults).
	Gradients string `json:"gradients,omitempty"`
	// RecordGradients is a folder to record every worker's gradient of
	// every step into (package recorded), for train replay.
	RecordGradients string `json:"record_gradients,omitempty"`
	// Preset selects the model size (flag -model-size, formerly -preset):
	// "small" or "default" (LSTM), "paper" or "default" (NCF); ResNet-18
	// has only "default".
	Preset string `json:"preset"`

	// Sparsifier is a sparsify registry name ("dense" for none).
	Sparsifier string `json:"sparsifier"`
	// Density is the setup density ρ (default: the method's paper's for the
	// model, see paperDensity; else sparsify.DefaultDensity).
	Density Optional[float64] `json:"density,omitzero"`
	// MethodOptions are the sparsifier's own options by name, as the method
	// declares them (sparsify.Method.Params; the command line has one flag
	// per option): absent ones take the method's defaults, options of other
	// methods are refused.
	MethodOptions sparsify.Values `json:"method_options,omitempty"`
	// Pipeline is "auto", "on" or "off": pipelining of a method that
	// declares itself Pipelined, LAGS (auto: on for it unless gradient
	// clipping needs the whole gradient first).
	Pipeline string `json:"pipeline"`
	// ClipAt is where Clip clips: "local" (each worker's gradient, before
	// error feedback, as the DEFT/MiCRO harness clips the LSTM), "aggregated"
	// (the averaged gradient after the reduction, as the LAGS reference
	// clips its LSTM runs; this keeps LAGS pipelining on) or "auto" (the
	// default: aggregated for lags, local otherwise).
	ClipAt string `json:"clip_at"`

	// Workers is the number of simulated workers in one process (default 1;
	// under mpirun each process is one worker and Workers must be 1).
	Workers Optional[int] `json:"workers,omitzero"`
	// Epochs is the number of epochs.
	Epochs Optional[int] `json:"epochs,omitzero"`
	// Steps stops training after this many iterations (0: no limit).
	Steps int `json:"steps"`
	// MaxTime bounds the run's wall time since its data set was loaded,
	// its final evaluation included (0: no limit): training stops (with a
	// checkpoint) early enough to leave the evaluation its estimated time,
	// at most a tenth of MaxTime, and an evaluation still running when the
	// time is up stops there (a sample of the split). A resumed run counts
	// the training time before its resume.
	MaxTime time.Duration `json:"max_time"`
	// Batch is the per-worker batch size.
	Batch Optional[int] `json:"batch,omitzero"`
	// EvalBatch is the per-worker evaluation batch size (NCF: users per
	// evaluation batch).
	EvalBatch Optional[int] `json:"eval_batch,omitzero"`
	// LR is the base learning rate.
	LR Optional[float64] `json:"lr,omitzero"`
	// Seed seeds initialisation, shuffling, augmentation, negatives, dropout
	// (default 42).
	Seed Optional[uint64] `json:"seed,omitzero"`

	// Optimizer is "sgd" or "adam".
	Optimizer string `json:"optimizer"`
	// Momentum is SGD's momentum (SGD only).
	Momentum Optional[float64] `json:"momentum,omitzero"`
	// Nesterov uses Nesterov momentum (PyTorch's nesterov=True).
	Nesterov bool `json:"nesterov,omitempty"`
	// WeightDecay is SGD's L2 coefficient (SGD only; not applied to
	// BatchNorm parameters whose name matches ".bnN.", as in the reference
	// harness).
	WeightDecay Optional[float64] `json:"weight_decay,omitzero"`
	// Beta1, Beta2 and Eps are Adam's (Adam only).
	Beta1 Optional[float64] `json:"beta1,omitzero"`
	Beta2 Optional[float64] `json:"beta2,omitzero"`
	Eps   Optional[float64] `json:"eps,omitzero"`
	// WarmupEpochs is the length of the linear learning-rate warm-up.
	WarmupEpochs float64 `json:"warmup_epochs"`
	// DecayEpochs are the epochs at which the learning rate is multiplied by
	// DecayFactor (nil: the model's; empty: none).
	DecayEpochs []int `json:"decay_epochs"`
	// DecayFactor is the step decay factor (default 0.1).
	DecayFactor Optional[float64] `json:"decay_factor,omitzero"`
	// LRSchedule is "step" (default: WarmupEpochs of linear warm-up, then
	// step decay at DecayEpochs) or "onecycle" (the one-cycle policy with LR
	// as its peak; see Schedule).
	LRSchedule string `json:"lr_schedule"`
	// Clip is the local gradient-norm clipping threshold applied before error
	// feedback (0: off).
	Clip Optional[float64] `json:"clip,omitzero"`
	// NoAugment turns CIFAR augmentation off.
	NoAugment bool `json:"no_augment,omitempty"`
	// LabelSmoothing is the training loss's label smoothing ε in [0, 1)
	// (resnet18 and lstm; 0: none). Evaluations report the plain loss.
	LabelSmoothing float64 `json:"label_smoothing,omitzero"`

	// Out is the run directory.
	Out string `json:"out"`
	// Resume is a run directory whose last checkpoint is loaded.
	Resume string `json:"resume,omitempty"`
	// Device is "cpu" or "cuda".
	Device string `json:"device"`
	// Comm is the communication backend: "auto" (the default), "local"
	// (in-process workers), "mpi" (under mpirun) or "nccl" (-device cuda,
	// one GPU per worker). On a GPU, local and mpi stage device buffers
	// through host memory (any number of workers per GPU); auto picks nccl
	// when every worker has a GPU of its own and NCCL loads, else local or
	// mpi.
	Comm string `json:"comm,omitempty"`
	// TF32 lets a GPU use TF32 tensor-core math in matrix products and
	// convolutions (faster; float32 products keep about 10 bits of
	// mantissa).
	TF32 bool `json:"tf32,omitempty"`
	// Deterministic restricts a GPU's convolutions to deterministic cuDNN
	// algorithms (bit-reproducible runs; otherwise the fastest algorithm
	// measured for each shape, which may add in a varying order).
	Deterministic bool `json:"deterministic,omitempty"`
	// NetLatency and NetBandwidth (bytes/s) emulate a network (both or
	// neither; in-process workers only).
	NetLatency   time.Duration `json:"net_latency"`
	NetBandwidth float64       `json:"net_bandwidth"`
	// LogEvery writes a step record every this many steps (default 1).
	LogEvery Optional[int] `json:"log_every,omitzero"`
	// EvalEvery evaluates every this many steps too (0: only every epoch).
	EvalEvery int `json:"eval_every"`
	// MaxEvalBatches bounds the batches (per worker) of one evaluation (0: all).
	MaxEvalBatches int `json:"max_eval_batches,omitempty"`
	// BLAS is "auto", "openblas" or "gonum"; BLASThreads its thread count
	// and oneDNN's (0: cores / in-process workers).
	BLAS        string `json:"blas"`
	BLASThreads int    `json:"blas_threads"`
	// Kernels are the CPU's convolution and batch-norm kernels: "auto"
	// (oneDNN if installed), "onednn" or "im2col" (engine.ConfigureCPU).
	Kernels string `json:"kernels,omitempty"`
	// Executors is the number of models (executors) the in-process workers
	// share on the CPU (0: one per core, at most Workers). The workers also
	// share one parameter vector and optimizer; see the package doc,
	// "Simulated workers". It does not change the results.
	Executors int `json:"executors,omitempty"`
	// Quiet turns progress output off.
	Quiet bool `json:"quiet"`
	// CheckpointEvery writes a checkpoint every this many steps too (0:
	// only at the end of every epoch, where one is always written, and
	// where the run stops).
	CheckpointEvery int `json:"checkpoint_every"`
	// CheckEvery compares a hash of every worker's parameters every this
	// many steps and stops the run when they differ (0: never; checkpoints
	// always compare them).
	CheckEvery int `json:"check_every,omitempty"`
}

// Defaults fills the unset fields of c with the model's defaults and
// returns it. Fields the user set are kept, zero included. The defaults
// are declared in package options (per model where they differ, taken
// from the papers' code and adapted to PyTorch's momentum semantics), with
// the options they depend on: the optimizer's own values are filled only
// for the optimizer in use (momentum and weight decay for SGD, β1, β2 and
// ε for Adam), the step decay only for the step schedule. What depends on
// more than the model is decided here: the model itself (a replay's, with
// Gradients), the data set (the model's first), the data folder, NCF's
// model size (by data set), the density (paperDensity) and the method
// options (the sparsifier's, sparsify.Method.Defaults).
//
// The models' defaults follow their references: ResNet-18 DEFT's run.py
// (lr 0.05, momentum 0.9, wd 1e-4, batch 32 per worker, 200 epochs, ×0.1
// at 150); the LSTM DEFT's (batch 32 per worker, clip 0.4, momentum 0, wd
// 0, ×0.1 at 45 and 80), with lr 20, the PyTorch word-language-model
// example's rate for undoubled SGD (the DEFT harness's lr 15 is doubled
// by its quirk); NCF the paper's preset on the small MovieLens sets with
// Adam and 4 negatives per positive (the MLPerf/DEFT rate 0.0045 with
// betas (0.25, 0.5) is for a 2^20 global batch; for per-worker batches of
// 256 Adam's defaults converge). A replay makes one pass over the
// recorded steps with no update.
func (c Config) Defaults() Config {
	if c.Model == "" {
		c.Model = declaredDefault("model")
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
		c.Sparsifier = declaredDefault("sparsifier")
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

// PipelineOn reports whether the run pipelines the reducer's communication
// with the backward pass (auto: for a method that declares itself
// Pipelined, LAGS, unless its gradient is clipped locally).
func (c Config) PipelineOn() bool {
	switch c.Pipeline {
	case "on":
		return true
	case "auto":
		return pipelined(c.Sparsifier) && !c.ClipLocal()
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
		return fmt.Errorf("%w: unknown -model %q; use one of %s", ErrConfig, c.Model, strings.Join(Models, ", "))
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
		checkMethodRun(c, method, bad)
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
			bad("-pipeline on needs -sparsifier %s (the reducers that reduce layer groups during the backward pass), not %s", strings.Join(ms, " or "), c.Sparsifier)
		}
		if c.ClipLocal() {
			bad("-pipeline on cannot be combined with -clip %v -clip-at local: clipping each worker's gradient needs the whole gradient before error feedback; pass -clip-at aggregated (clip the averaged gradient, as the LAGS reference does), -clip 0 or -pipeline off", c.Clip)
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
	if underMPI && c.NetBandwidth != 0 {
		bad("-net-latency/-net-bandwidth emulate a network between simulated workers; under mpirun the real network is used, drop them")
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
	if c.RecordGradients != "" && c.PipelineOn() {
		bad("-record-gradients records the whole gradient after the backward pass: add -pipeline off (pipelining changes when the reduction starts, not the gradients)")
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
// declarations, and, in one process, the method's worker-count constraints.
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
				bad("-%s applies only to -sparsifier %s, not %s", p.Flag, strings.Join(ms, " or "), m.Name)
			} else {
				bad("unknown method option %q (no sparsifier has it)", name)
			}
			continue
		}
		if _, err := p.Check(v); err != nil {
			valid = false
			bad("-%s: %v (%s: %s)", p.Flag, err, m.Name, p.Doc)
		}
	}
	if !valid || underMPI || m.CheckWorkers == nil {
		return
	}
	resolved, err := m.Resolve(c.MethodOptions)
	if err != nil {
		bad("%v", err)
		return
	}
	if err := m.CheckWorkers(c.Workers.Value(), resolved); err != nil {
		bad("-workers %d: %v", c.Workers.Value(), err)
	}
}
