package train

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDefaultsPerModel(t *testing.T) {
	for _, tc := range []struct {
		model, dataset, opt, preset string
		batch                       int
		lr                          float64
	}{
		{"resnet18", "cifar10", "sgd", "default", 32, 0.05},
		{"lstm", "wikitext2", "sgd", "small", 32, 20},
		{"ncf", "ml-100k", "adam", "paper", 256, 0.001},
	} {
		c := Config{Model: tc.model, Out: "x"}.Defaults()
		if c.Dataset != tc.dataset || c.Optimizer != tc.opt || c.Preset != tc.preset || c.Batch != tc.batch || c.LR != tc.lr {
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
	c := Config{Model: "ncf", LR: 0.5, Batch: 7, Epochs: 3}.Defaults()
	if c.LR != 0.5 || c.Batch != 7 || c.Epochs != 3 {
		t.Errorf("user values overwritten: %+v", c)
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
		{"density 0", func(c *Config) { c.Density = -1 }, false, "-density"},
		{"density >1", func(c *Config) { c.Density = 1.5 }, false, "-density"},
		{"lambda for topk", func(c *Config) { c.Sparsifier = "topk"; c.Lambda = 0.1 }, false, "-lambda applies only"},
		{"teams for deft", func(c *Config) { c.Sparsifier = "deft"; c.Teams = 2 }, false, "-teams and -sag"},
		{"merge size for topk", func(c *Config) { c.Sparsifier = "topk"; c.MergeSize = 10 }, false, "-merge-size"},
		{"max ratio < 1", func(c *Config) { c.Sparsifier = "lags"; c.MaxRatio = 0.5 }, false, "-max-ratio"},
		{"dragonn opts for micro", func(c *Config) { c.Sparsifier = "micro"; c.MinTensor = 5 }, false, "-min-tensor"},
		{"pipeline topk", func(c *Config) { c.Sparsifier = "topk"; c.Pipeline = "on" }, false, "-pipeline on needs -sparsifier lags"},
		{"pipeline clip", func(c *Config) { c.Sparsifier = "lags"; c.Pipeline = "on"; c.Clip = 0.4 }, false, "-clip"},
		{"pipeline bad", func(c *Config) { c.Pipeline = "maybe" }, false, "-pipeline"},
		{"workers 0", func(c *Config) { c.Workers = -1 }, false, "-workers"},
		{"workers under mpi", func(c *Config) { c.Workers = 4 }, true, "mpirun -np 4"},
		{"epochs", func(c *Config) { c.Epochs = -2 }, false, "-epochs"},
		{"steps", func(c *Config) { c.Steps = -1 }, false, "-steps"},
		{"batch", func(c *Config) { c.Batch = -1 }, false, "-batch"},
		{"lr", func(c *Config) { c.LR = -0.1 }, false, "-lr"},
		{"momentum with adam", func(c *Config) { c.Momentum = 0.9 }, false, "-momentum and -nesterov apply"},
		{"bad optimizer", func(c *Config) { c.Optimizer = "rmsprop" }, false, "-optimizer"},
		{"decay factor", func(c *Config) { c.DecayFactor = 2 }, false, "-decay-factor"},
		{"device", func(c *Config) { c.Device = "tpu" }, false, "-device"},
		{"tf32 on the cpu", func(c *Config) { c.TF32 = true }, false, "-tf32 applies to -device cuda"},
		{"latency only", func(c *Config) { c.NetLatency = time.Millisecond }, false, "give both"},
		{"net under mpi", func(c *Config) { c.NetLatency = time.Millisecond; c.NetBandwidth = 1e9 }, true, "under mpirun"},
		{"no out", func(c *Config) { c.Out = "" }, false, "-out DIR"},
		{"blas", func(c *Config) { c.BLAS = "mkl" }, false, "-blas"},
		{"preset", func(c *Config) { c.Preset = "small" }, false, "not an NCF preset"},
		{"gtopk 3 workers", func(c *Config) { c.Sparsifier = "gtopk"; c.Workers = 3 }, false, "power-of-two"},
		{"teams divide", func(c *Config) { c.Sparsifier = "spardl"; c.Teams = 2; c.Workers = 3 }, false, "must divide"},
		{"nesterov without momentum", func(c *Config) { c.Model, c.Optimizer, c.Momentum, c.Nesterov = "lstm", "sgd", 0, true }, false, "-nesterov"},
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

func TestPipelineOn(t *testing.T) {
	for _, tc := range []struct {
		sp, mode string
		clip     float64
		want     bool
	}{
		{"lags", "auto", 0, true}, {"lags", "auto", 0.4, false}, {"lags", "off", 0, false},
		{"topk", "auto", 0, false}, {"lags", "on", 0, true},
	} {
		c := Config{Sparsifier: tc.sp, Pipeline: tc.mode, Clip: tc.clip}
		if got := c.PipelineOn(); got != tc.want {
			t.Errorf("%+v: PipelineOn %v, want %v", tc, got, tc.want)
		}
	}
}
