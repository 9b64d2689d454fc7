package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/sparsify"
)

func TestDefaultsPerModel(t *testing.T) {
	for _, tc := range []struct {
		model, dataset, opt, preset string
		batch                       int
		lr, momentum, clip          float64
	}{
		{"resnet18", "cifar10", "sgd", "default", 32, 0.05, 0.9, 0},
		{"lstm", "wikitext2", "sgd", "small", 32, 20, 0, 0.4},
		{"ncf", "ml-100k", "adam", "paper", 256, 0.001, 0, 0},
	} {
		c := Config{Model: tc.model, Out: "x"}.Defaults()
		if c.Dataset != tc.dataset || c.Optimizer != tc.opt || c.Preset != tc.preset || c.Batch.Value() != tc.batch ||
			c.LR.Value() != tc.lr || c.Momentum.Value() != tc.momentum || c.Clip.Value() != tc.clip {
			t.Errorf("%s defaults: %+v", tc.model, c)
		}
		if err := c.Validate(false); err != nil {
			t.Errorf("%s defaults do not validate: %v", tc.model, err)
		}
	}
	if c := (Config{Model: "ncf", Dataset: "ml-20m"}).Defaults(); c.Preset != "default" {
		t.Errorf("ncf on ml-20m preset %q, want default", c.Preset)
	}
	// Values the user set are kept.
	c := Config{Model: "ncf", LR: Set(0.5), Batch: Set(7), Epochs: Set(3)}.Defaults()
	if c.LR.Value() != 0.5 || c.Batch.Value() != 7 || c.Epochs.Value() != 3 {
		t.Errorf("user values overwritten: %+v", c)
	}
	// The optimizer's values are those of the optimizer in use.
	c = Config{Model: "resnet18", Optimizer: "adam", Out: "x"}.Defaults()
	if c.Momentum.IsSet() || c.WeightDecay.IsSet() || c.Beta1.Value() != 0.9 {
		t.Errorf("resnet18 with adam: %+v", c)
	}
	if err := c.Validate(false); err != nil {
		t.Errorf("resnet18 with adam: %v", err)
	}
}

// TestDefaultsKeepExplicitZero: a value set to 0 stays 0 where the model's
// default is not 0 (and where 0 is valid, it validates).
func TestDefaultsKeepExplicitZero(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		get  func(Config) any
		want any
	}{
		{"resnet18 momentum", Config{Model: "resnet18", Momentum: Set(0.0)}, func(c Config) any { return c.Momentum }, Set(0.0)},
		{"resnet18 weight decay", Config{Model: "resnet18", WeightDecay: Set(0.0)}, func(c Config) any { return c.WeightDecay }, Set(0.0)},
		{"lstm clip", Config{Model: "lstm", Clip: Set(0.0)}, func(c Config) any { return c.Clip }, Set(0.0)},
		{"seed", Config{Seed: Set[uint64](0)}, func(c Config) any { return c.Seed }, Set[uint64](0)},
		{"adam beta1", Config{Beta1: Set(0.0)}, func(c Config) any { return c.Beta1 }, Set(0.0)},
		{"dragonn warm-up", Config{Sparsifier: "dragonn", MethodOptions: sparsify.Values{"dense_warmup": 0}},
			func(c Config) any { return c.MethodOptions["dense_warmup"] }, 0},
		{"oktopk warm-up", Config{Sparsifier: "oktopk", MethodOptions: sparsify.Values{"dense_warmup": 0}},
			func(c Config) any { return c.MethodOptions["dense_warmup"] }, 0},
		{"dragonn min tensor", Config{Sparsifier: "dragonn", MethodOptions: sparsify.Values{"min_tensor": 0}},
			func(c Config) any { return c.MethodOptions["min_tensor"] }, 0},
		{"lags max ratio", Config{Sparsifier: "lags", MethodOptions: sparsify.Values{"max_ratio": 0.0}},
			func(c Config) any { return c.MethodOptions["max_ratio"] }, 0.0},
		{"resnet18 onecycle drops the step decay", Config{Model: "resnet18", LRSchedule: "onecycle"},
			func(c Config) any { return len(c.DecayEpochs) + btoi(c.DecayFactor.IsSet()) }, 0},
		{"lstm lags pipelined with clip 0", Config{Model: "lstm", Sparsifier: "lags", Pipeline: "on", Clip: Set(0.0)},
			func(c Config) any { return c.PipelineOn() }, true},
		// The LAGS reference clips its LSTM's averaged gradient: the
		// LSTM's default clipping keeps lags pipelined.
		{"lstm lags default clip pipelines", Config{Model: "lstm", Sparsifier: "lags"},
			func(c Config) any { return [3]bool{c.PipelineOn(), c.ClipAggregated(), c.ClipLocal()} }, [3]bool{true, true, false}},
		// The papers' densities: LAGS' compression ratios 1000 (CNNs) and
		// 250 (LSTM), DRAGONN's and DGC's 0.001; 0.01 otherwise.
		{"lags resnet18 density", Config{Model: "resnet18", Sparsifier: "lags"}, func(c Config) any { return c.Density.Value() }, 0.001},
		{"lags lstm density", Config{Model: "lstm", Sparsifier: "lags"}, func(c Config) any { return c.Density.Value() }, 0.004},
		{"lags ncf density", Config{Model: "ncf", Sparsifier: "lags"}, func(c Config) any { return c.Density.Value() }, 0.01},
		{"dragonn density", Config{Model: "ncf", Sparsifier: "dragonn"}, func(c Config) any { return c.Density.Value() }, 0.001},
		{"dgc density", Config{Model: "resnet18", Sparsifier: "dgc"}, func(c Config) any { return c.Density.Value() }, 0.001},
		{"topk density", Config{Model: "resnet18", Sparsifier: "topk"}, func(c Config) any { return c.Density.Value() }, 0.01},
		{"lstm topk clips locally", Config{Model: "lstm", Sparsifier: "topk"},
			func(c Config) any { return [3]bool{c.PipelineOn(), c.ClipAggregated(), c.ClipLocal()} }, [3]bool{false, false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Out = "x"
			c := tc.cfg.Defaults()
			if got := tc.get(c); got != tc.want {
				t.Fatalf("after Defaults: %v, want %v", got, tc.want)
			}
			if err := c.Validate(false); err != nil {
				t.Fatalf("does not validate: %v", err)
			}
		})
	}
}

func TestValidateRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		edit   func(*Config)
		mpi    bool
		expect string
	}{
		{"unknown model", func(c *Config) { c.Model = "vgg" }, false, "unknown -model"},
		{"model/dataset", func(c *Config) { c.Dataset = "cifar10" }, false, "cannot train on -dataset"},
		{"unknown sparsifier", func(c *Config) { c.Sparsifier = "nope" }, false, "unknown -sparsifier"},
		{"density 0", func(c *Config) { c.Density = Set(0.0) }, false, "-density 0 must be in (0, 1]; pass e.g. -density 0.01"},
		{"density negative", func(c *Config) { c.Density = Set(-1.0) }, false, "-density"},
		{"density >1", func(c *Config) { c.Density = Set(1.5) }, false, "-density"},
		{"lambda for topk", func(c *Config) { c.Sparsifier = "topk"; c.MethodOptions = sparsify.Values{"lambda": 0.1} }, false, "-lambda applies only to -sparsifier threshold, not topk"},
		{"teams for deft", func(c *Config) { c.Sparsifier = "deft"; c.MethodOptions = sparsify.Values{"teams": 2} }, false, "-teams applies only"},
		{"merge size for topk", func(c *Config) { c.Sparsifier = "topk"; c.MethodOptions = sparsify.Values{"merge_size": 10} }, false, "-merge-size"},
		{"warm-up for topk", func(c *Config) { c.Sparsifier = "topk"; c.MethodOptions = sparsify.Values{"dense_warmup": 10} },
			false, "-dense-warmup applies only to -sparsifier dragonn or oktopk or topkdsa"},
		{"unknown option", func(c *Config) { c.Sparsifier = "topk"; c.MethodOptions = sparsify.Values{"bogus": 1} }, false, `unknown method option "bogus"`},
		{"merge size 0", func(c *Config) { c.Sparsifier = "lags"; c.MethodOptions = sparsify.Values{"merge_size": 0} }, false, "-merge-size 0 must be in [1, 2147483647] (lags: merge threshold"},
		{"max ratio < 1", func(c *Config) { c.Sparsifier = "lags"; c.MethodOptions = sparsify.Values{"max_ratio": 0.5} }, false, "-max-ratio"},
		{"max ratio NaN", func(c *Config) { c.Sparsifier = "lags"; c.MethodOptions = sparsify.Values{"max_ratio": math.NaN()} }, false, "-max-ratio NaN is not a finite number"},
		{"lambda Inf", func(c *Config) { c.Sparsifier = "threshold"; c.MethodOptions = sparsify.Values{"lambda": math.Inf(1)} }, false, "-lambda +Inf is not a finite number"},
		{"warm-up negative", func(c *Config) { c.Sparsifier = "oktopk"; c.MethodOptions = sparsify.Values{"dense_warmup": -1} }, false, "-dense-warmup -1 must be in [0, 2147483647] (0: none)"},
		{"sag", func(c *Config) { c.Sparsifier = "spardl"; c.MethodOptions = sparsify.Values{"sag": "ring"} }, false, "-sag"},
		{"min tensor fraction", func(c *Config) { c.Sparsifier = "dragonn"; c.MethodOptions = sparsify.Values{"min_tensor": 2.5} }, false, "not a whole number"},
		{"pipeline topk", func(c *Config) { c.Sparsifier = "topk"; c.Pipeline = "on" }, false, "-overlap on needs -sparsifier dense or lags"},
		{"pipeline clip", func(c *Config) { c.Sparsifier = "lags"; c.Pipeline = "on"; c.Clip = Set(0.4); c.ClipAt = "local" }, false, "-clip-at local"},
		{"clip at", func(c *Config) { c.ClipAt = "everywhere" }, false, "-clip-at \"everywhere\""},
		{"pipeline bad", func(c *Config) { c.Pipeline = "maybe" }, false, "-overlap \"maybe\": use auto, on or off"},
		{"workers -1", func(c *Config) { c.Workers = Set(-1) }, false, "-workers"},
		{"workers 0", func(c *Config) { c.Workers = Set(0) }, false, "-workers 0 must be >= 1"},
		{"workers under mpi", func(c *Config) { c.Workers = Set(4) }, true, "mpirun -np 4"},
		{"epochs", func(c *Config) { c.Epochs = Set(-2) }, false, "-epochs"},
		{"epochs 0", func(c *Config) { c.Epochs = Set(0) }, false, "-epochs 0"},
		{"steps", func(c *Config) { c.Steps = -1 }, false, "-steps"},
		{"batch", func(c *Config) { c.Batch = Set(-1) }, false, "-batch"},
		{"batch 0", func(c *Config) { c.Batch = Set(0) }, false, "-batch 0"},
		{"log every 0", func(c *Config) { c.LogEvery = Set(0) }, false, "-log-every 0"},
		{"checkpoint every -1", func(c *Config) { c.CheckpointEvery = -1 }, false, "-checkpoint-every -1"},
		{"check every -1", func(c *Config) { c.CheckEvery = -1 }, false, "-check-every -1"},
		{"lr", func(c *Config) { c.LR = Set(-0.1) }, false, "-lr"},
		{"lr 0", func(c *Config) { c.LR = Set(0.0) }, false, "-lr 0 must be > 0"},
		{"eps 0", func(c *Config) { c.Eps = Set(0.0) }, false, "-eps 0 must be > 0"},
		{"momentum with adam", func(c *Config) { c.Momentum = Set(0.9) }, false, "-momentum, -nesterov and -wd apply"},
		{"momentum 0 with adam", func(c *Config) { c.Momentum = Set(0.0) }, false, "-momentum, -nesterov and -wd apply"},
		{"wd with adam", func(c *Config) { c.WeightDecay = Set(1e-4) }, false, "-momentum, -nesterov and -wd apply"},
		{"betas with sgd", func(c *Config) { c.Optimizer = "sgd"; c.Momentum = Set(0.0); c.Beta1 = Set(0.5) }, false, "-beta1, -beta2 and -eps apply to -optimizer adam"},
		{"momentum 1", func(c *Config) {
			c.Optimizer, c.Beta1, c.Beta2, c.Eps, c.Momentum = "sgd", Optional[float64]{}, Optional[float64]{}, Optional[float64]{}, Set(1.0)
		}, false, "-momentum 1 must be in [0, 1)"},
		{"bad optimizer", func(c *Config) { c.Optimizer = "rmsprop" }, false, "-optimizer"},
		{"decay factor", func(c *Config) { c.DecayFactor = Set(2.0) }, false, "-decay-factor"},
		{"decay factor 0", func(c *Config) { c.DecayFactor = Set(0.0) }, false, "-decay-factor 0"},
		{"lr schedule", func(c *Config) { c.LRSchedule = "cosine" }, false, "-lr-schedule \"cosine\": use step or onecycle"},
		{"onecycle with decay epochs", func(c *Config) { c.LRSchedule = "onecycle"; c.DecayEpochs = []int{3} }, false, "apply to -lr-schedule step"},
		{"onecycle with decay factor", func(c *Config) { c.LRSchedule = "onecycle" }, false, "apply to -lr-schedule step"},
		{"onecycle rise too long", func(c *Config) {
			c.LRSchedule, c.DecayFactor, c.WarmupEpochs = "onecycle", Optional[float64]{}, float64(c.Epochs.Value())
		}, false, "the rise must end before the last epoch"},
		{"device", func(c *Config) { c.Device = "tpu" }, false, "-device"},
		{"latency only", func(c *Config) { c.NetLatency = time.Millisecond }, false, "give both"},
		{"latency only under mpi", func(c *Config) { c.NetLatency = time.Millisecond }, true, "give both"},
		{"no out", func(c *Config) { c.Out = "" }, false, "-out DIR"},
		{"blas", func(c *Config) { c.BLAS = "mkl" }, false, "-blas"},
		{"kernels", func(c *Config) { c.Kernels = "mkldnn" }, false, "-kernels \"mkldnn\": use auto, onednn or im2col"},
		{"preset", func(c *Config) { c.Preset = "small" }, false, "\"small\" is not a size of ncf; use paper (8 factors) or default"},
		{"gtopk 3 workers", func(c *Config) { c.Sparsifier, c.MethodOptions = "gtopk", nil; c.Workers = Set(3) }, false, "power-of-two"},
		{"teams divide", func(c *Config) {
			c.Sparsifier, c.Workers, c.MethodOptions = "spardl", Set(3), sparsify.Values{"teams": 2}
		}, false, "2 teams do not divide 3 workers"},
		{"rsag teams", func(c *Config) {
			c.Sparsifier, c.Workers, c.MethodOptions = "spardl", Set(6), sparsify.Values{"teams": 3, "sag": "rsag"}
		}, false, "R-SAG needs a power-of-two number of teams"},
		{"nesterov without momentum", func(c *Config) {
			c.Model, c.Optimizer, c.Momentum, c.Nesterov = "lstm", "sgd", Set(0.0), true
			c.Beta1, c.Beta2, c.Eps = Optional[float64]{}, Optional[float64]{}, Optional[float64]{}
		}, false, "-nesterov"},
		{"unset (no Defaults)", func(c *Config) { c.LR = Optional[float64]{} }, false, "call Config.Defaults"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Model: "ncf", Out: "x"}.Defaults()
			tc.edit(&c)
			err := c.Validate(tc.mpi)
			if err == nil {
				t.Fatalf("accepted %+v", c)
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.expect) {
				t.Fatalf("error %q does not wrap ErrConfig or lacks %q", err, tc.expect)
			}
		})
	}
}

// TestValidateNetUnderMPI: an emulated network is accepted under mpirun
// too (each process's calls are delayed: netmodel.Emulate).
func TestValidateNetUnderMPI(t *testing.T) {
	c := Config{Model: "ncf", Out: "x"}.Defaults()
	c.NetLatency, c.NetBandwidth = time.Millisecond, 1e9
	for _, mpi := range []bool{false, true} {
		if err := c.Validate(mpi); err != nil {
			t.Errorf("under mpirun %v: %v", mpi, err)
		}
	}
}

// TestValidateRejectsNonFinite: NaN and ±Inf are refused for every float
// field of the configuration, with the flag's name (range checks written as
// x < lo || x > hi let NaN through).
func TestValidateRejectsNonFinite(t *testing.T) {
	fields := []struct {
		flag string
		set  func(*Config, float64)
	}{
		{"density", func(c *Config, v float64) { c.Density = Set(v) }},
		{"lr", func(c *Config, v float64) { c.LR = Set(v) }},
		{"momentum", func(c *Config, v float64) { c.Momentum = Set(v) }},
		{"wd", func(c *Config, v float64) { c.WeightDecay = Set(v) }},
		{"beta1", func(c *Config, v float64) { c.Beta1 = Set(v) }},
		{"beta2", func(c *Config, v float64) { c.Beta2 = Set(v) }},
		{"eps", func(c *Config, v float64) { c.Eps = Set(v) }},
		{"warmup-epochs", func(c *Config, v float64) { c.WarmupEpochs = v }},
		{"decay-factor", func(c *Config, v float64) { c.DecayFactor = Set(v) }},
		{"clip", func(c *Config, v float64) { c.Clip = Set(v) }},
		{"net-bandwidth", func(c *Config, v float64) { c.NetBandwidth = v; c.NetLatency = time.Microsecond }},
	}
	for _, f := range fields {
		for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
			t.Run(fmt.Sprintf("%s=%v", f.flag, v), func(t *testing.T) {
				for _, opt := range []string{"sgd", "adam"} {
					c := Config{Model: "ncf", Optimizer: opt, Out: "x"}.Defaults()
					f.set(&c, v)
					err := c.Validate(false)
					if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "-"+f.flag+" ") || !strings.Contains(err.Error(), "finite") {
						t.Fatalf("%s: error %v, want one naming -%s as not finite", opt, err, f.flag)
					}
				}
			})
		}
	}
}

func TestPipelineOn(t *testing.T) {
	for _, tc := range []struct {
		sp, mode string
		clip     float64
		at       string
		want     bool
	}{
		{"lags", "auto", 0, "auto", true}, {"lags", "auto", 0.4, "local", false}, {"lags", "off", 0, "auto", false},
		{"topk", "auto", 0, "auto", false}, {"lags", "on", 0, "auto", true},
		// The LSTM's default clipping clips the averaged gradient for lags
		// (the LAGS reference's way): pipelining stays on.
		{"lags", "auto", 0.4, "auto", true}, {"lags", "auto", 0.4, "aggregated", true},
	} {
		c := Config{Sparsifier: tc.sp, Pipeline: tc.mode, Clip: Set(tc.clip), ClipAt: tc.at}
		if got := c.PipelineOn(); got != tc.want {
			t.Errorf("%+v: PipelineOn %v, want %v", tc, got, tc.want)
		}
	}
}

// TestConfigJSONRoundTrip: the resolved configuration that run.json records
// reads back into an equal Config that needs no defaults (explicit zeros
// and method options included), and reads as plain numbers.
func TestConfigJSONRoundTrip(t *testing.T) {
	for _, c := range []Config{
		{Model: "resnet18", Momentum: Set(0.0), WeightDecay: Set(0.0), Seed: Set[uint64](0)},
		{Model: "lstm", Clip: Set(0.0), Sparsifier: "lags", MethodOptions: sparsify.Values{"merge_size": 1}},
		{Model: "ncf", Sparsifier: "dragonn", MethodOptions: sparsify.Values{"dense_warmup": 0}},
		{Model: "ncf", Sparsifier: "oktopk"},
		{Model: "ncf", Sparsifier: "spardl", Workers: Set(4), MethodOptions: sparsify.Values{"teams": 2, "sag": "rsag"}},
		{Model: "ncf", Sparsifier: "threshold", MethodOptions: sparsify.Values{"lambda": 0.25}},
		{Model: "ncf", Optimizer: "sgd"},
	} {
		c.Out = "x"
		c = c.Defaults()
		if err := c.Validate(false); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var back Config
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if again := back.Defaults(); !reflect.DeepEqual(again, c) {
			t.Fatalf("round trip:\n%+v\nbecame\n%+v\n(JSON %s)", c, again, b)
		}
		var m map[string]any
		json.Unmarshal(b, &m)
		if _, ok := m["lr"].(float64); !ok {
			t.Fatalf("lr is not a number in %s", b)
		}
		if m, ok := sparsify.Lookup(c.Sparsifier); ok && len(m.Params) > 0 && !strings.Contains(string(b), `"method_options":{`) {
			t.Fatalf("no method_options in %s", b)
		}
	}
	// Explicit zeros are recorded as zeros.
	b, _ := json.Marshal(Config{Model: "resnet18", Momentum: Set(0.0), Out: "x"}.Defaults())
	if !strings.Contains(string(b), `"momentum":0,`) {
		t.Fatalf("momentum 0 not recorded: %s", b)
	}
}

func TestOptionalJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Optional[float64]
	}{
		{"null", Optional[float64]{}}, {"0", Set(0.0)}, {"1.5", Set(1.5)},
	} {
		var o Optional[float64]
		if err := json.Unmarshal([]byte(tc.in), &o); err != nil || o != tc.want {
			t.Errorf("%s: %v, %v", tc.in, o, err)
		}
		b, _ := json.Marshal(o)
		if string(b) != tc.in {
			t.Errorf("%v marshals to %s, want %s", o, b, tc.in)
		}
	}
	var o Optional[int]
	if err := json.Unmarshal([]byte(`"x"`), &o); err == nil {
		t.Error("a string unmarshalled into Optional[int]")
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestDefaultsWhole: the whole configuration Defaults gives each model
// (and a replay), every field, against the papers' values written out
// here: the defaults are declared per option in package options and
// filled from there.
func TestDefaultsWhole(t *testing.T) {
	t.Setenv("TRAIN_DATA_DIR", "")
	common := Config{DataDir: "./data", Sparsifier: "dense", Density: Set(0.01), MethodOptions: sparsify.Values{"bucket_mb": 25.0}, Pipeline: "auto", ClipAt: "auto", Workers: Set(1),
		Device: "cpu", Comm: "auto", LogEvery: Set(1), BLAS: "auto", Kernels: "auto", Seed: Set[uint64](42), LRSchedule: "step",
		DecayFactor: Set(0.1), DecayEpochs: []int{}}
	with := func(edit func(c *Config)) Config {
		c := common
		edit(&c)
		return c
	}
	for _, tc := range []struct {
		in, want Config
	}{
		{Config{Model: "resnet18"}, with(func(c *Config) {
			c.Model, c.Dataset, c.Preset, c.Batch, c.EvalBatch, c.LR, c.Optimizer = "resnet18", "cifar10", "default", Set(32), Set(250), Set(0.05), "sgd"
			c.Momentum, c.WeightDecay, c.Epochs, c.DecayEpochs, c.Clip = Set(0.9), Set(1e-4), Set(200), []int{150}, Set(0.0)
		})},
		{Config{Model: "lstm"}, with(func(c *Config) {
			c.Model, c.Dataset, c.Preset, c.Batch, c.EvalBatch, c.LR, c.Optimizer = "lstm", "wikitext2", "small", Set(32), Set(10), Set(20.0), "sgd"
			c.Momentum, c.WeightDecay, c.Epochs, c.DecayEpochs, c.Clip = Set(0.0), Set(0.0), Set(90), []int{45, 80}, Set(0.4)
		})},
		{Config{}, with(func(c *Config) {
			c.Model, c.Dataset, c.Preset, c.Batch, c.EvalBatch, c.LR, c.Optimizer = "ncf", "ml-100k", "paper", Set(256), Set(64), Set(0.001), "adam"
			c.Beta1, c.Beta2, c.Eps, c.Epochs, c.Clip = Set(0.9), Set(0.999), Set(1e-8), Set(20), Set(0.0)
		})},
		{Config{Model: "ncf", Dataset: "ml-20m", Optimizer: "sgd", LRSchedule: "onecycle"}, with(func(c *Config) {
			c.Model, c.Dataset, c.Preset, c.Batch, c.EvalBatch, c.LR, c.Optimizer = "ncf", "ml-20m", "default", Set(256), Set(64), Set(0.001), "sgd"
			c.Momentum, c.WeightDecay, c.Epochs, c.Clip, c.LRSchedule, c.DecayFactor = Set(0.0), Set(0.0), Set(20), Set(0.0), "onecycle", Optional[float64]{}
		})},
		{Config{Gradients: "rec"}, with(func(c *Config) {
			c.Model, c.Gradients, c.Batch, c.EvalBatch, c.LR, c.Optimizer, c.Epochs, c.Clip = RecordedModel, "rec", Set(1), Set(1), Set(0.0), "none", Set(1), Set(0.0)
		})},
	} {
		got := tc.in.Defaults()
		if !reflect.DeepEqual(got, tc.want) {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(tc.want)
			t.Errorf("%+v.Defaults():\n got %s\nwant %s", tc.in, g, w)
		}
	}
}
