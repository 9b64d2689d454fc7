package train

import (
	"context"
	"math"
	"testing"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// TestGradReadyTimes profiles NCF's backward pass on the real MovieLens
// data: one time per layout tensor, none negative or NaN, and the backward
// pass finishes the last layer's gradient before the first layer's (it
// runs the layers in reverse).
func TestGradReadyTimes(t *testing.T) {
	data := testenv.SharedData(t, "ml-100k/u.data")
	c := Config{Model: "ncf", Dataset: "ml-100k", DataDir: data}
	ready, err := GradReadyTimes(context.Background(), c, 3)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := LoadDataset(context.Background(), c.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewModel(c.Defaults(), ds, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ready) != len(m.Layout()) {
		t.Fatalf("%d ready times for %d tensors", len(ready), len(m.Layout()))
	}
	for i, r := range ready {
		if math.IsNaN(r) || r < 0 {
			t.Errorf("tensor %d ready at %v", i, r)
		}
	}
	t.Logf("ready times (s after the backward pass starts): %v", ready)
	if ready[len(ready)-1] > ready[0] {
		t.Errorf("the last layer's gradient final at %v, after the first layer's at %v: %v", ready[len(ready)-1], ready[0], ready)
	}
	if _, err := GradReadyTimes(context.Background(), c, 1); err == nil {
		t.Error("one step profiled (none counted) without an error")
	}
}
