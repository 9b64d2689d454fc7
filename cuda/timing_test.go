package cuda_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
)

// TestFailedEventTimeReachesStep: when the driver cannot time the step's
// events (cuEventElapsedTime fails), the training step returns the error
// naming the phase and the driver call — on the first steps, which issue
// every kernel, and on the replays of the captured step — instead of a
// zero or negative forward/backward time; once the driver times again, so
// does the step.
func TestFailedEventTimeReachesStep(t *testing.T) {
	d := gpu(t)
	if !cuda.Emulated() {
		t.Skip("makes the emulated driver fail to time events")
	}
	const batch = 64
	c := models.DefaultNCF(50, 70, batch)
	c.Backend = backend(t)
	m, err := models.NewNCF(c)
	if err != nil {
		t.Fatal(err)
	}
	s := d.Stream()
	host := make([]float32, m.NumParams())
	m.InitParams(host)
	params := upload(t, s, host)
	grad, err := d.Alloc(device.Float32, m.NumParams())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(params); d.Free(grad) })
	r := rand.New(rand.NewPCG(3, 3))
	b := models.Batch{Users: randInts(r, batch, 50), Items: randInts(r, batch, 70), Targets: randTargets(r, batch)}
	step := func() (models.StepResult, error) {
		return m.TrainStep(context.Background(), b, params, grad)
	}
	for i := range 5 {
		fail := i == 0 || i == 3 // the first step, and a replayed one
		var stop func()
		if fail {
			stop, _ = cuda.FailEventTimes(t)
		}
		res, err := step()
		if fail {
			stop()
			if err == nil {
				t.Fatalf("step %d with the event times failing: no error (forward %v, backward %v)", i+1, res.Forward, res.Backward)
			}
			for _, want := range []string{"cuEventElapsedTime", "forward pass"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("step %d: %v; want an error naming %q", i+1, err, want)
				}
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
		if res.Forward <= 0 || res.Backward <= 0 {
			t.Errorf("step %d: forward %v, backward %v; want both > 0", i+1, res.Forward, res.Backward)
		}
	}
}
