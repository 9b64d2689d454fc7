package train

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// TestNewModelNeedsOnlyItsWorkload declares a model in the test alone (a
// tiny recommender on MovieLens, built from NCF's pieces with 2 factors
// and one MLP layer): the trainer validates, builds, trains and records it
// through its workload, with nothing else changed.
func TestNewModelNeedsOnlyItsWorkload(t *testing.T) {
	w := *ncfWorkload
	w.name, w.datasets, w.sizes, w.sizeDoc = "tinyrec", []string{"ml-100k"}, []string{"tiny"}, "tiny (2 factors)"
	w.defaultSize, w.kind = fixedSize("tiny"), sparsify.MLP
	tiny := func(c Config, d *Dataset) models.NCFConfig {
		return models.NCFConfig{Users: d.Rec.Users, Items: d.Rec.Items, Factors: 2, Layers: []int{4}, BatchSize: c.Batch.Value()}
	}
	w.build = func(c Config, d *Dataset, seed uint64, be engine.Backend) (models.Model, error) {
		cfg := tiny(c, d)
		cfg.Seed, cfg.Backend = seed, be
		return models.NewNCF(cfg)
	}
	saved := workloads
	workloads = append(slices.Clone(workloads), &w)
	t.Cleanup(func() { workloads = saved })

	c := ncfConfig(t, 2, 3)
	c.Model, c.Dataset = "tinyrec", ""
	// The options' defaults that package options declares per model.
	c.Batch, c.EvalBatch, c.LR, c.Optimizer, c.Epochs = Set(64), Set(16), Set(0.01), "adam", Set(1)
	d := c.Defaults()
	if d.Dataset != "ml-100k" || d.Preset != "tiny" {
		t.Fatalf("defaults: dataset %q, size %q; want the workload's ml-100k, tiny", d.Dataset, d.Preset)
	}
	if k, ok := ModelKind("tinyrec"); !ok || k != sparsify.MLP {
		t.Fatalf("ModelKind: %q %v", k, ok)
	}
	for _, bad := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.Dataset = "cifar10" }, `-model tinyrec cannot train on -dataset "cifar10"; use one of ml-100k`},
		{func(c *Config) { c.Preset = "paper" }, `"paper" is not a size of tinyrec; use tiny (2 factors)`},
		{func(c *Config) { c.LabelSmoothing = 0.1 }, "-label-smoothing applies to the classifiers (resnet18, lstm"},
	} {
		b := d
		bad.set(&b)
		if err := b.Validate(false); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Validate: %v; want %q", err, bad.want)
		}
	}

	losses := runLosses(t, c)
	if len(losses) != 3 {
		t.Fatalf("%d losses, want 3", len(losses))
	}
	for _, l := range losses {
		if math.IsNaN(l) || math.IsInf(l, 0) || l <= 0 {
			t.Fatalf("losses %v", losses)
		}
	}
	b, err := os.ReadFile(filepath.Join(c.Out, "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	var run struct {
		Config struct{ Model, Preset string }
		Params int
	}
	if err := json.Unmarshal(b, &run); err != nil {
		t.Fatal(err)
	}
	ds, err := LoadDataset(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.NewNCF(tiny(d, ds))
	if err != nil {
		t.Fatal(err)
	}
	if run.Config.Model != "tinyrec" || run.Config.Preset != "tiny" || run.Params != m.NumParams() {
		t.Fatalf("run.json: model %q size %q, %d parameters; want tinyrec, tiny, %d", run.Config.Model, run.Config.Preset, run.Params, m.NumParams())
	}
}
