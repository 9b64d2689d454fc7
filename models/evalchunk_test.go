package models

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/ops"
)

// TestResNetEvaluationNoBiggerThanTraining: an evaluation of many more
// images than the training batch keeps no more memory than a training step
// (issue 26: a 250-image evaluation of ResNet-18 held 190–220 MB of
// activations, the batch-32 training program 154–163 MB), and gives the
// same result as evaluating the images a few at a time.
func TestResNetEvaluationNoBiggerThanTraining(t *testing.T) {
	cfg := ResNetConfig{Classes: 5, Width: 8, Blocks: [4]int{1, 1, 1, 1}, ImageSize: 16, BatchSize: 4, Momentum: 0.1, Epsilon: 1e-5, Seed: 2}
	m, err := hostOf(NewResNet(cfg))
	if err != nil {
		t.Fatal(err)
	}
	randomizeParams(m, 5, 0.3)
	r := rand.New(rand.NewPCG(3, 4))
	b := randomImages(r, cfg, 50)
	ctx := context.Background()
	all, err := m.Evaluate(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	rn := m.Model.(*ResNet)
	for i, e := range rn.evals.execs {
		if e.ArenaBytes() > rn.train.ArenaBytes() {
			t.Errorf("evaluation program %d (%d images) needs %d bytes, the training program %d", i, rn.evals.keys[i], e.ArenaBytes(), rn.train.ArenaBytes())
		}
	}
	// The same images three at a time.
	var parts EvalResult
	S := cfg.ImageSize
	for lo := 0; lo < 50; lo += 3 {
		hi := min(50, lo+3)
		res, err := m.Evaluate(ctx, Batch{Images: b.Images[lo*3*S*S : hi*3*S*S], Labels: b.Labels[lo:hi]})
		if err != nil {
			t.Fatal(err)
		}
		parts.Add(res)
	}
	// gonum's products and the im2col kernels do not depend on how many
	// images a chunk holds; OpenBLAS and oneDNN block their products by
	// the matrices' sizes, which moves the last bits (float32 rounding).
	tol := 1e-9
	if testBLAS() != ops.BLASGonum || testKernels() != engine.KernelsIm2col {
		tol = 1e-6
	}
	if all.Count != 50 || parts.Count != 50 || all.Correct != parts.Correct || math.Abs(all.LossSum-parts.LossSum) > tol*math.Abs(all.LossSum) {
		t.Errorf("50 images at once: %+v; three at a time: %+v", all, parts)
	}
}
