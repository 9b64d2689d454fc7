package train

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// panickyModel runs the real step (whose gradient hook starts the pipeline's
// groups) and then panics, at step panicAt.
type panickyModel struct {
	models.Model
	steps, panicAt int
}

func (m *panickyModel) TrainStep(ctx context.Context, b models.Batch, params, grad device.Buffer) (models.StepResult, error) {
	res, err := m.Model.TrainStep(ctx, b, params, grad)
	m.steps++
	if m.steps == m.panicAt {
		panic("model exploded")
	}
	return res, err
}

// settledGoroutines waits until at most n goroutines are left and returns
// the count, with every goroutine's stack when more are left.
func settledGoroutines(n int) (int, string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := runtime.NumGoroutine()
		if got <= n || time.Now().After(deadline) {
			if got <= n {
				return got, ""
			}
			buf := make([]byte, 1<<20)
			return got, string(buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPipelinedStepPanicLeavesNoGoroutine: a model whose step panics while
// LAGS pipelining is on fails the run (comm/local turns the panic into an
// error) and leaves no goroutine behind: neither the pipeline's nor the
// report writer's.
func TestPipelinedStepPanicLeavesNoGoroutine(t *testing.T) {
	for _, at := range []int{1, 2} {
		c := ncfConfig(t, 2, 3)
		c.Sparsifier, c.Pipeline = "lags", "on"
		c.MethodOptions = sparsify.Values{"merge_size": 1000}
		before := runtime.NumGoroutine()
		reports := 0
		err := Run(context.Background(), c, Options{
			wrapModel: func(m models.Model) models.Model { return &panickyModel{Model: m, panicAt: at} },
			Report:    func(string) error { reports++; return nil },
		})
		if err == nil || !strings.Contains(err.Error(), "model exploded") {
			t.Fatalf("panic at step %d: Run returned %v, want the panic as an error", at, err)
		}
		if got, stacks := settledGoroutines(before); stacks != "" {
			t.Fatalf("panic at step %d: %d goroutines left, %d before the run:\n%s", at, got, before, stacks)
		}
		if reports != 0 {
			t.Fatalf("panic at step %d: %d reports written while the panic unwound", at, reports)
		}
	}
}

// TestPipeline: groups are handed over in order once all their tensors are
// final, whatever the order of the tensors within them, the groups one
// tensor completes together as one set; after a start
// fails no other group is started and the step keeps the error; a group
// whose tensors are not all reported is not started; a panicking pass
// ends the goroutine.
func TestPipeline(t *testing.T) {
	// Layout tensors 0..4; groups in backward order: {4, 3}, {2}, {1, 0}.
	groups := []sparsify.Group{{Tensors: []int{4, 3}}, {Tensors: []int{2}}, {Tensors: []int{1, 0}}}
	for _, tc := range []struct {
		name        string
		final       []int // tensors reported final, in order
		failAt      int
		panics      bool
		wantStarted [][]int // the sets handed over
		wantErr     string
	}{
		{"backward order", []int{4, 3, 2, 1, 0}, -1, false, [][]int{{0}, {1}, {2}}, ""},
		{"tensors out of order within and across groups", []int{3, 2, 4, 0, 1}, -1, false, [][]int{{0, 1}, {2}}, ""},
		{"the last tensor completes every group", []int{3, 2, 1, 0, 4}, -1, false, [][]int{{0, 1, 2}}, ""},
		{"a group never completes", []int{4, 3, 2, 1}, -1, false, [][]int{{0}, {1}}, ""},
		{"a start fails", []int{4, 3, 2, 1, 0}, 1, false, [][]int{{0}}, "start failed"},
		{"the pass panics", []int{4, 3, 2}, -1, true, [][]int{{0}, {1}}, "pass panicked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipeline(groups, 5)
			var started [][]int
			before := runtime.NumGoroutine()
			err := func() (err error) {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("pass panicked: %v", r)
					}
				}()
				return p.run(func() error {
					for _, idx := range tc.final {
						p.tensorFinal(idx)
					}
					if tc.panics {
						panic("boom")
					}
					return nil
				}, func(gs []int) error {
					p.reducing()
					if slices.Contains(gs, tc.failAt) {
						return errors.New("start failed")
					}
					started = append(started, gs)
					return nil
				})
			}()
			if err == nil {
				err = p.err
			}
			if got, stacks := settledGoroutines(before); stacks != "" {
				t.Fatalf("%d goroutines left, %d before:\n%s", got, before, stacks)
			}
			if fmt.Sprint(started) != fmt.Sprint(tc.wantStarted) {
				t.Fatalf("started %v, want %v", started, tc.wantStarted)
			}
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if p.started.IsZero() {
				t.Fatal("no start time recorded")
			}
		})
	}
}
