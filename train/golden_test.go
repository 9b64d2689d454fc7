package train

import (
	"encoding/json"
	"math"
	"os"
	"testing"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// The per-step mean losses of short real-data runs, recorded by the trainer
// that ran the models on Gorgonia's tape machine with host-slice optimizers
// (models and train of commit 36ec39a, with comm and sparsify of commit
// 113fd1c), gonum BLAS, the im2col kernels; the DEFT run's losses from
// step 2 on were recorded again when DEFT's allocation returned to the
// authors' rule. The device-neutral trainer must reproduce them bit for
// bit.
// Regenerate only deliberately:
// SPARSEGRAD_WRITE_GOLDEN=1 go test -run TestGoldenRuns ./train
const goldenRunsFile = "testdata/golden-runs.json"

type goldenRun struct {
	Name   string   `json:"name"`
	Losses []uint64 `json:"loss_bits"`
}

func goldenRunConfigs(t *testing.T) []struct {
	name string
	long bool
	cfg  Config
} {
	ncf := func(workers, steps int, sp string) Config {
		c := ncfConfig(t, workers, steps)
		c.Sparsifier, c.Density = sp, Set(0.05)
		return c
	}
	sgdNCF := ncf(3, 12, "dense")
	sgdNCF.Optimizer, sgdNCF.Momentum, sgdNCF.WeightDecay, sgdNCF.LR = "sgd", Set(0.9), Set(1e-4), Set(0.05)
	lstm := Config{Model: "lstm", Dataset: "wikitext2", DataDir: testenv.SharedData(t, "wikitext-2/train.txt"), Preset: "small", Workers: Set(2), Steps: 3,
		Batch: Set(4), Sparsifier: "topk", Density: Set(0.01), Out: t.TempDir(), Quiet: true, BLAS: "gonum", MaxEvalBatches: 1}
	resnet := Config{Model: "resnet18", Dataset: "cifar10", DataDir: testenv.SharedData(t, "cifar-10-batches-bin/data_batch_1.bin"), Workers: Set(2), Steps: 2,
		Batch: Set(4), EvalBatch: Set(8), Sparsifier: "dense", Out: t.TempDir(), Quiet: true, BLAS: "gonum", Kernels: "im2col", MaxEvalBatches: 1}
	return []struct {
		name string
		long bool
		cfg  Config
	}{
		{"ncf-adam-topk-2", false, ncf(2, 15, "topk")},
		{"ncf-adam-deft-4", false, ncf(4, 10, "deft")},
		{"ncf-sgd-dense-3", false, sgdNCF},
		{"lstm-small-topk-2", true, lstm},
		{"resnet18-dense-2", true, resnet},
	}
}

func TestGoldenRuns(t *testing.T) {
	write := os.Getenv("SPARSEGRAD_WRITE_GOLDEN") == "1"
	want := map[string][]uint64{}
	if !write {
		b, err := os.ReadFile(goldenRunsFile)
		if err != nil {
			t.Fatal(err)
		}
		var rs []goldenRun
		if err := json.Unmarshal(b, &rs); err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			want[r.Name] = r.Losses
		}
	}
	var out []goldenRun
	for _, rc := range goldenRunConfigs(t) {
		if rc.long && testing.Short() && !write {
			continue
		}
		losses := runLosses(t, rc.cfg)
		bits := make([]uint64, len(losses))
		for i, l := range losses {
			bits[i] = math.Float64bits(l)
		}
		out = append(out, goldenRun{rc.name, bits})
		if write {
			continue
		}
		w := want[rc.name]
		if len(w) != len(bits) {
			t.Errorf("%s: %d losses, recorded %d", rc.name, len(bits), len(w))
			continue
		}
		for i := range w {
			if w[i] != bits[i] {
				t.Errorf("%s step %d: loss %v, recorded %v", rc.name, i+1, losses[i], math.Float64frombits(w[i]))
			}
		}
	}
	if write {
		b, _ := json.MarshalIndent(out, "", " ")
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenRunsFile, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
