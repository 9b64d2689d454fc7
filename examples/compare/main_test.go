package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/sparsify"
)

// TestEveryMethodDoesItsJob runs the example's toy with every registered
// method and requires every sparse one to send less than the whole
// gradient in most steps and to train differently from dense (TopkDSA,
// Ok-Topk and DRAGONN ran dense for the whole run: their warm-up outlasted
// it, and no toy tensor reached DRAGONN's minimum size), and every method
// to say what it is for.
func TestEveryMethodDoesItsJob(t *testing.T) {
	c := config{workers: 4, dim: 4096, rows: 32, steps: 30, density: 0.01, lr: 0.5, seed: 1}
	if testing.Short() {
		c.steps = 12
	}
	ctx := context.Background()
	dense := train(ctx, c, "dense")
	if dense.err != nil {
		t.Fatal(dense.err)
	}
	for _, m := range sparsify.Names() {
		if m == "dense" {
			continue
		}
		r := train(ctx, c, m)
		if errors.Is(r.err, errUnsupported) {
			t.Logf("%s: %v", m, r.err)
			continue
		}
		if r.err != nil {
			t.Fatalf("%s: %v", m, r.err)
		}
		// A compressor sends every element (actual density 1) in fewer
		// bytes than dense.
		sparse := r.actual <= 0.5 || r.bytesSent < 0.6*dense.bytesSent
		if r.dense > c.steps/4 || !sparse || r.loss == dense.loss {
			t.Errorf("%s sent every element in %d of %d steps (mean actual density %.3f, final loss %v, dense's %v): %s",
				m, r.dense, c.steps, r.actual, r.loss, dense.loss, explain(c, r))
		}
		if purpose[m] == "" || !strings.HasPrefix(explain(c, r), m+": "+purpose[m]) {
			t.Errorf("%s: no line on what it is for: %q", m, explain(c, r))
		}
	}
}
