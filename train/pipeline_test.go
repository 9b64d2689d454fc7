package train

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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

// fakeGroups is a GroupReducer with fixed groups whose StartGroup records
// the order and can fail.
type fakeGroups struct {
	sparsify.Reducer
	groups  []sparsify.Group
	failAt  int // StartGroup of this group fails (-1: none)
	started []int
	waited  int
}

type fakePending struct {
	f *fakeGroups
	g int
}

func (p fakePending) Wait(context.Context) (sparsify.GroupStats, error) {
	p.f.waited++
	return sparsify.GroupStats{Group: p.g}, nil
}

func (f *fakeGroups) Groups() []sparsify.Group { return f.groups }

func (f *fakeGroups) StartGroup(_ context.Context, g int, _, _, _ []float32) (sparsify.Pending, error) {
	if g == f.failAt {
		return nil, errors.New("start failed")
	}
	f.started = append(f.started, g)
	return fakePending{f, g}, nil
}

// TestPipeline: groups are handed over in order once all their tensors are
// final, whatever the order of the tensors within them; a start failure, a
// group never completed, or a panicking pass end the step with every started
// group waited for and the goroutine ended.
func TestPipeline(t *testing.T) {
	// Layout tensors 0..4; groups in backward order: {4, 3}, {2}, {1, 0}.
	groups := []sparsify.Group{{Tensors: []int{4, 3}}, {Tensors: []int{2}}, {Tensors: []int{1, 0}}}
	for _, tc := range []struct {
		name        string
		final       []int // tensors reported final, in order
		failAt      int
		panics      bool
		wantStarted []int
		wantErr     string
	}{
		{"backward order", []int{4, 3, 2, 1, 0}, -1, false, []int{0, 1, 2}, ""},
		{"tensors out of order within and across groups", []int{3, 2, 4, 0, 1}, -1, false, []int{0, 1, 2}, ""},
		{"a group never completes", []int{4, 3, 2, 1}, -1, false, []int{0, 1}, "merge group 2 was never started"},
		{"a start fails", []int{4, 3, 2, 1, 0}, 1, false, []int{0}, "start failed"},
		{"the pass panics", []int{4, 3, 2}, -1, true, []int{0, 1}, "pass panicked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeGroups{groups: groups, failAt: tc.failAt}
			p := newPipeline(f, 5)
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
				}, func(g int) (sparsify.Pending, error) {
					p.reducing()
					return f.StartGroup(context.Background(), g, nil, nil, nil)
				})
			}()
			if err == nil {
				_, err = p.wait(context.Background())
			} else {
				p.drain(context.Background())
			}
			if got, stacks := settledGoroutines(before); stacks != "" {
				t.Fatalf("%d goroutines left, %d before:\n%s", got, before, stacks)
			}
			if fmt.Sprint(f.started) != fmt.Sprint(tc.wantStarted) || f.waited != len(f.started) {
				t.Fatalf("started %v, want %v; %d waited for", f.started, tc.wantStarted, f.waited)
			}
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if len(f.started) > 0 && p.started.IsZero() {
				t.Fatal("no start time recorded")
			}
		})
	}
}
