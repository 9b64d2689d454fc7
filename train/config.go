package train

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/sparsify"
)

// ErrConfig is wrapped by every error Validate returns.
var ErrConfig = errors.New("train: invalid configuration")

// Config is the resolved configuration of one run. Zero values select the
// per-model defaults of Defaults.
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
	// Preset selects the model size: "small" or "default" (LSTM), "paper"
	// or "default" (NCF); ResNet-18 has only "default".
	Preset string `json:"preset"`

	// Sparsifier is a sparsify registry name ("dense" for none).
	Sparsifier string `json:"sparsifier"`
	// Density is the setup density ρ.
	Density float64 `json:"density"`
	// Lambda is the hard threshold λ of "threshold" (0: the method's default).
	Lambda float64 `json:"lambda,omitempty"`
	// Teams is SparDL's number of teams.
	Teams int `json:"teams,omitempty"`
	// SAG is SparDL's spar-all-gather ("bruck" or "rsag").
	SAG string `json:"sag,omitempty"`
	// MergeSize is LAGS' merge threshold in elements.
	MergeSize int `json:"merge_size,omitempty"`
	// MaxRatio is LAGS' compression-ratio bound c_u (0: adaptive density off).
	MaxRatio float64 `json:"max_ratio,omitempty"`
	// MinTensor is DRAGONN's size threshold in elements.
	MinTensor int `json:"min_tensor,omitempty"`
	// DragonnWarmup is DRAGONN's number of dense warm-up iterations.
	DragonnWarmup int `json:"dragonn_warmup,omitempty"`
	// Pipeline is "auto", "on" or "off": LAGS pipelining (auto: on for lags
	// unless gradient clipping needs the whole gradient first).
	Pipeline string `json:"pipeline"`

	// Workers is the number of simulated workers in one process (ignored
	// under mpirun, where each process is one worker).
	Workers int `json:"workers"`
	// Epochs is the number of epochs.
	Epochs int `json:"epochs"`
	// Steps stops training after this many iterations (0: no limit).
	Steps int `json:"steps"`
	// MaxTime stops training (with a final evaluation and checkpoint) once
	// this much wall time has passed since the start (0: no limit).
	MaxTime time.Duration `json:"max_time"`
	// Batch is the per-worker batch size.
	Batch int `json:"batch"`
	// EvalBatch is the per-worker evaluation batch size (NCF: users per
	// evaluation batch).
	EvalBatch int `json:"eval_batch"`
	// LR is the base learning rate.
	LR float64 `json:"lr"`
	// Seed seeds initialisation, shuffling, augmentation, negatives, dropout.
	Seed uint64 `json:"seed"`

	// Optimizer is "sgd" or "adam".
	Optimizer string `json:"optimizer"`
	// Momentum is SGD's momentum.
	Momentum float64 `json:"momentum"`
	// Nesterov uses Nesterov momentum (PyTorch's nesterov=True).
	Nesterov bool `json:"nesterov,omitempty"`
	// WeightDecay is SGD's L2 coefficient (not applied to BatchNorm
	// parameters whose name matches ".bnN.", as in the reference harness).
	WeightDecay float64 `json:"weight_decay"`
	// Beta1, Beta2 and Eps are Adam's.
	Beta1 float64 `json:"beta1,omitempty"`
	Beta2 float64 `json:"beta2,omitempty"`
	Eps   float64 `json:"eps,omitempty"`
	// WarmupEpochs is the length of the linear learning-rate warm-up.
	WarmupEpochs float64 `json:"warmup_epochs"`
	// DecayEpochs are the epochs at which the learning rate is multiplied by
	// DecayFactor.
	DecayEpochs []int `json:"decay_epochs"`
	// DecayFactor is the step decay factor.
	DecayFactor float64 `json:"decay_factor"`
	// Clip is the local gradient-norm clipping threshold applied before error
	// feedback (0: off).
	Clip float64 `json:"clip"`
	// NoAugment turns CIFAR augmentation off.
	NoAugment bool `json:"no_augment,omitempty"`

	// Out is the run directory.
	Out string `json:"out"`
	// Resume is a run directory whose last checkpoint is loaded.
	Resume string `json:"resume,omitempty"`
	// Device is "cpu" or "cuda".
	Device string `json:"device"`
	// TF32 lets a GPU use TF32 tensor-core math in matrix products and
	// convolutions (faster; float32 products keep about 10 bits of
	// mantissa).
	TF32 bool `json:"tf32,omitempty"`
	// NetLatency and NetBandwidth (bytes/s) emulate a network (both or
	// neither; in-process workers only).
	NetLatency   time.Duration `json:"net_latency"`
	NetBandwidth float64       `json:"net_bandwidth"`
	// LogEvery writes a step record every this many steps.
	LogEvery int `json:"log_every"`
	// EvalEvery evaluates every this many steps too (0: only every epoch).
	EvalEvery int `json:"eval_every"`
	// MaxEvalBatches bounds the batches (per worker) of one evaluation (0: all).
	MaxEvalBatches int `json:"max_eval_batches,omitempty"`
	// BLAS is "auto", "openblas" or "gonum"; BLASThreads its thread count
	// (0: cores / in-process workers).
	BLAS        string `json:"blas"`
	BLASThreads int    `json:"blas_threads"`
	// Quiet turns progress output off.
	Quiet bool `json:"quiet"`
	// CheckpointEvery writes a checkpoint every this many epochs (default 1).
	CheckpointEvery int `json:"checkpoint_every"`
}

// Models lists the supported models.
var Models = []string{"resnet18", "lstm", "ncf"}

// Datasets maps each model to the data sets it trains on.
var Datasets = map[string][]string{
	"resnet18": {"cifar10", "cifar100"},
	"lstm":     {"wikitext2"},
	"ncf":      {"ml-100k", "ml-1m", "ml-20m"},
}

// Defaults fills the zero fields of c with the model's defaults (taken from
// the papers' code, adapted to PyTorch's momentum semantics) and returns it.
// Fields the user set are kept.
func (c Config) Defaults() Config {
	if c.Model == "" {
		c.Model = "ncf"
	}
	if c.Dataset == "" {
		if ds := Datasets[c.Model]; len(ds) > 0 {
			c.Dataset = ds[0]
		}
	}
	if c.DataDir == "" {
		c.DataDir = os.Getenv("TRAIN_DATA_DIR")
		if c.DataDir == "" {
			c.DataDir = "./data"
		}
	}
	if c.Sparsifier == "" {
		c.Sparsifier = "dense"
	}
	if c.Density == 0 {
		c.Density = 0.01
	}
	if c.Pipeline == "" {
		c.Pipeline = "auto"
	}
	if c.Workers == 0 {
		c.Workers = 1
	}
	if c.Device == "" {
		c.Device = "cpu"
	}
	if c.LogEvery == 0 {
		c.LogEvery = 1
	}
	if c.BLAS == "" {
		c.BLAS = "auto"
	}
	if c.CheckpointEvery == 0 {
		c.CheckpointEvery = 1
	}
	if c.Seed == 0 {
		c.Seed = 42
	}
	switch c.Model {
	case "resnet18":
		// DEFT run.py: lr 0.05, momentum 0.9, wd 1e-4, batch 32 per worker,
		// 200 epochs, ×0.1 at 150.
		def(&c.Preset, "default")
		defI(&c.Batch, 32)
		defI(&c.EvalBatch, 250)
		defF(&c.LR, 0.05)
		def(&c.Optimizer, "sgd")
		defF(&c.Momentum, 0.9)
		defF(&c.WeightDecay, 1e-4)
		defI(&c.Epochs, 200)
		if c.DecayEpochs == nil {
			c.DecayEpochs = []int{150}
		}
	case "lstm":
		// DEFT: batch 32 per worker, clip 0.4, momentum 0, wd 0, ×0.1 at 45
		// and 80. lr 20 is the PyTorch word-language-model example's rate for
		// undoubled SGD (the DEFT harness's lr 15 is doubled by its quirk).
		def(&c.Preset, "small")
		defI(&c.Batch, 32)
		defI(&c.EvalBatch, 10)
		defF(&c.LR, 20)
		def(&c.Optimizer, "sgd")
		defF(&c.Clip, 0.4)
		defI(&c.Epochs, 90)
		if c.DecayEpochs == nil {
			c.DecayEpochs = []int{45, 80}
		}
	case "ncf":
		// NCF paper preset on the small MovieLens sets, Adam; 4 negatives
		// per positive. The MLPerf/DEFT rate 0.0045 with betas (0.25, 0.5)
		// is for a 2^20 global batch; for per-worker batches of 256 Adam's
		// defaults converge.
		if c.Dataset == "ml-20m" {
			def(&c.Preset, "default")
		} else {
			def(&c.Preset, "paper")
		}
		defI(&c.Batch, 256)
		defI(&c.EvalBatch, 64)
		defF(&c.LR, 0.001)
		def(&c.Optimizer, "adam")
		defF(&c.Beta1, 0.9)
		defF(&c.Beta2, 0.999)
		defF(&c.Eps, 1e-8)
		defI(&c.Epochs, 20)
	}
	if c.DecayFactor == 0 {
		c.DecayFactor = 0.1
	}
	if c.Optimizer == "adam" {
		defF(&c.Beta1, 0.9)
		defF(&c.Beta2, 0.999)
		defF(&c.Eps, 1e-8)
	}
	if c.DecayEpochs == nil {
		c.DecayEpochs = []int{}
	}
	return c
}

func def(p *string, v string) {
	if *p == "" {
		*p = v
	}
}

func defI(p *int, v int) {
	if *p == 0 {
		*p = v
	}
}

func defF(p *float64, v float64) {
	if *p == 0 {
		*p = v
	}
}

// PipelineOn reports whether the run pipelines LAGS' communication with the
// backward pass.
func (c Config) PipelineOn() bool {
	switch c.Pipeline {
	case "on":
		return true
	case "auto":
		return c.Sparsifier == "lags" && c.Clip == 0
	}
	return false
}

// Validate checks c (after Defaults) and returns an error wrapping ErrConfig
// that says what is wrong and how to fix it. underMPI tells whether the run
// is a process of an mpirun job.
func (c Config) Validate(underMPI bool) error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...))
	}
	if !slices.Contains(Models, c.Model) {
		bad("unknown -model %q; use one of %s", c.Model, strings.Join(Models, ", "))
	} else if !slices.Contains(Datasets[c.Model], c.Dataset) {
		bad("-model %s cannot train on -dataset %q; use one of %s", c.Model, c.Dataset, strings.Join(Datasets[c.Model], ", "))
	}
	switch c.Model {
	case "lstm":
		if c.Preset != "small" && c.Preset != "default" {
			bad("-preset %q is not an LSTM preset; use small (2×200) or default (3×650)", c.Preset)
		}
	case "ncf":
		if c.Preset != "paper" && c.Preset != "default" {
			bad("-preset %q is not an NCF preset; use paper (8 factors) or default (MLPerf, 64 factors)", c.Preset)
		}
	case "resnet18":
		if c.Preset != "default" {
			bad("-preset %q is not a ResNet-18 preset; use default", c.Preset)
		}
	}
	if !slices.Contains(sparsify.Names(), c.Sparsifier) {
		bad("unknown -sparsifier %q; use one of %s", c.Sparsifier, strings.Join(sparsify.Names(), ", "))
	}
	if !(c.Density > 0 && c.Density <= 1) {
		bad("-density %v is outside (0, 1]; pass e.g. -density 0.01", c.Density)
	}
	if c.Lambda < 0 || math.IsNaN(c.Lambda) {
		bad("-lambda %v must be >= 0 (0: the method's default 1/(2√k))", c.Lambda)
	}
	if c.Lambda != 0 && c.Sparsifier != "threshold" {
		bad("-lambda applies only to -sparsifier threshold, not %s", c.Sparsifier)
	}
	if (c.Teams != 0 || c.SAG != "") && c.Sparsifier != "spardl" {
		bad("-teams and -sag apply only to -sparsifier spardl, not %s", c.Sparsifier)
	}
	if c.Teams < 0 {
		bad("-teams %d must be >= 1", c.Teams)
	}
	if c.SAG != "" && c.SAG != "bruck" && c.SAG != "rsag" {
		bad("-sag %q: use bruck or rsag", c.SAG)
	}
	if (c.MergeSize != 0 || c.MaxRatio != 0) && c.Sparsifier != "lags" {
		bad("-merge-size and -max-ratio apply only to -sparsifier lags, not %s", c.Sparsifier)
	}
	if c.MergeSize < 0 {
		bad("-merge-size %d must be >= 0", c.MergeSize)
	}
	if c.MaxRatio != 0 && c.MaxRatio < 1 {
		bad("-max-ratio %v is a compression ratio c_u = m/k and must be >= 1 (or 0 for off)", c.MaxRatio)
	}
	if (c.MinTensor != 0 || c.DragonnWarmup != 0) && c.Sparsifier != "dragonn" {
		bad("-min-tensor and -dragonn-warmup apply only to -sparsifier dragonn, not %s", c.Sparsifier)
	}
	if c.MinTensor < 0 || c.DragonnWarmup < 0 {
		bad("-min-tensor and -dragonn-warmup must be >= 0")
	}
	switch c.Pipeline {
	case "auto", "off":
	case "on":
		if c.Sparsifier != "lags" {
			bad("-pipeline on needs -sparsifier lags (the only reducer that reduces layer groups during the backward pass), not %s", c.Sparsifier)
		}
		if c.Clip > 0 {
			bad("-pipeline on cannot be combined with -clip %v: clipping needs the whole gradient before error feedback; pass -clip 0 or -pipeline off", c.Clip)
		}
	default:
		bad("-pipeline %q: use auto, on or off", c.Pipeline)
	}

	if c.Workers < 1 {
		bad("-workers %d must be >= 1", c.Workers)
	}
	if c.Workers > 1024 {
		bad("-workers %d is more than 1024 simulated workers; use mpirun for large jobs", c.Workers)
	}
	if !underMPI && c.Sparsifier == "gtopk" && c.Workers&(c.Workers-1) != 0 {
		bad("-sparsifier gtopk needs a power-of-two number of workers (its reduction tree pairs them), not -workers %d", c.Workers)
	}
	if !underMPI && c.Teams > 1 && c.Workers%c.Teams != 0 {
		bad("-teams %d must divide the number of workers %d (SparDL's teams are equal)", c.Teams, c.Workers)
	}
	if underMPI && c.Workers > 1 {
		bad("-workers %d under mpirun: each mpirun process is one worker; use mpirun -np %d instead", c.Workers, c.Workers)
	}
	if c.Epochs < 1 {
		bad("-epochs %d must be >= 1", c.Epochs)
	}
	if c.MaxTime < 0 {
		bad("-max-time %v must be >= 0 (0: no limit)", c.MaxTime)
	}
	if c.Steps < 0 {
		bad("-steps %d must be >= 0 (0: no limit)", c.Steps)
	}
	if c.Batch < 1 {
		bad("-batch %d must be >= 1", c.Batch)
	}
	if c.EvalBatch < 1 {
		bad("-eval-batch %d must be >= 1", c.EvalBatch)
	}
	if !(c.LR > 0) || math.IsInf(c.LR, 0) {
		bad("-lr %v must be a positive number", c.LR)
	}
	switch c.Optimizer {
	case "sgd":
		if c.Momentum < 0 || c.Momentum >= 1 {
			bad("-momentum %v must be in [0, 1)", c.Momentum)
		}
		if c.Nesterov && c.Momentum == 0 {
			bad("-nesterov needs a momentum; pass -momentum 0.9 (or leave out -nesterov)")
		}
	case "adam":
		if c.Beta1 < 0 || c.Beta1 >= 1 || c.Beta2 < 0 || c.Beta2 >= 1 {
			bad("-beta1 %v and -beta2 %v must be in [0, 1)", c.Beta1, c.Beta2)
		}
		if !(c.Eps > 0) {
			bad("-eps %v must be > 0", c.Eps)
		}
		if c.Momentum != 0 || c.Nesterov {
			bad("-momentum and -nesterov apply to -optimizer sgd only; Adam uses -beta1")
		}
	default:
		bad("-optimizer %q: use sgd or adam", c.Optimizer)
	}
	if c.WeightDecay < 0 {
		bad("-wd %v must be >= 0", c.WeightDecay)
	}
	if c.WarmupEpochs < 0 {
		bad("-warmup-epochs %v must be >= 0", c.WarmupEpochs)
	}
	for _, e := range c.DecayEpochs {
		if e < 1 {
			bad("-decay-epochs %v: epochs must be >= 1", c.DecayEpochs)
			break
		}
	}
	if !(c.DecayFactor > 0 && c.DecayFactor <= 1) {
		bad("-decay-factor %v must be in (0, 1]", c.DecayFactor)
	}
	if c.Clip < 0 {
		bad("-clip %v must be >= 0 (0: off)", c.Clip)
	}
	switch c.Device {
	case "cpu":
		if c.TF32 {
			bad("-tf32 applies to -device cuda only")
		}
	case "cuda":
	default:
		bad("-device %q: use cpu or cuda", c.Device)
	}
	if (c.NetLatency != 0) != (c.NetBandwidth != 0) {
		bad("-net-latency and -net-bandwidth emulate a network together; give both (e.g. -net-latency 50us -net-bandwidth 10) or neither")
	}
	if c.NetLatency < 0 || c.NetBandwidth < 0 || math.IsInf(c.NetBandwidth, 0) || math.IsNaN(c.NetBandwidth) {
		bad("-net-latency and -net-bandwidth must be positive")
	}
	if underMPI && c.NetBandwidth != 0 {
		bad("-net-latency/-net-bandwidth emulate a network between simulated workers; under mpirun the real network is used, drop them")
	}
	if c.LogEvery < 1 {
		bad("-log-every %d must be >= 1", c.LogEvery)
	}
	if c.EvalEvery < 0 || c.MaxEvalBatches < 0 {
		bad("-eval-every and -max-eval-batches must be >= 0")
	}
	if c.CheckpointEvery < 1 {
		bad("-checkpoint-every %d must be >= 1", c.CheckpointEvery)
	}
	switch c.BLAS {
	case "auto", "openblas", "gonum":
	default:
		bad("-blas %q: use auto, openblas or gonum", c.BLAS)
	}
	if c.BLASThreads < 0 {
		bad("-blas-threads %d must be >= 0", c.BLASThreads)
	}
	if c.Out == "" && c.Resume == "" {
		bad("no run directory: pass -out DIR (or -resume DIR to continue a run)")
	}
	return errors.Join(errs...)
}
