package train

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
)

// GradReadyTimes runs steps training steps of c's model on one worker (its
// first batches, from the model's initial parameters, which the steps do
// not change) and returns, per layout tensor, when its gradient became
// final in seconds after the backward pass started: the gradient hook's
// events, as the trainer's pipeline sees them (LAGS' groups, overlapped
// dense's buckets), the median over the steps after the first. The
// advisor's overlapped dense schedule reads them.
func GradReadyTimes(ctx context.Context, c Config, steps int) ([]float64, error) {
	if steps < 2 {
		return nil, fmt.Errorf("train: GradReadyTimes of %d steps: want at least 2 (the first is not counted)", steps)
	}
	c = c.Defaults()
	ds, err := LoadDataset(ctx, c)
	if err != nil {
		return nil, err
	}
	m, err := NewModel(c, ds, c.Seed.Value(), nil)
	if err != nil {
		return nil, err
	}
	t, err := newTask(c, ds, 0, 1)
	if err != nil {
		return nil, err
	}
	dev := m.Device()
	n := m.NumParams()
	init := make([]float32, n)
	if err := m.InitParams(init); err != nil {
		return nil, err
	}
	var params, grad device.Buffer
	for _, b := range []*device.Buffer{&params, &grad} {
		if *b, err = dev.Alloc(device.Float32, n); err != nil {
			return nil, err
		}
		defer dev.Free(*b)
	}
	if err := dev.Stream().Copy(params, device.Host(init)); err != nil {
		return nil, err
	}
	if err := dev.Stream().Synchronize(); err != nil {
		return nil, err
	}
	nt := len(m.Layout())
	var mu sync.Mutex
	events := make([]device.Event, nt)
	at := make([]time.Time, nt)
	m.SetGradHook(func(i int, ev device.Event) {
		mu.Lock()
		events[i], at[i] = ev, time.Now()
		mu.Unlock()
	})
	defer m.SetGradHook(nil)
	samples := make([][]float64, nt)
	for s := range steps {
		b, _, err := t.Batch(s % max(t.Len(), 1))
		if err != nil {
			return nil, err
		}
		clear(events)
		clear(at)
		t0 := time.Now()
		res, err := m.TrainStep(ctx, b, params, grad)
		if err != nil {
			return nil, err
		}
		if s == 0 {
			continue
		}
		start := t0.Add(res.Forward)
		for i := range nt {
			done := at[i]
			if ev := events[i]; ev != nil {
				if err := ev.Synchronize(); err != nil {
					return nil, err
				}
				if done, err = ev.Time(); err != nil {
					return nil, err
				}
			}
			samples[i] = append(samples[i], max(0, done.Sub(start).Seconds()))
		}
	}
	out := make([]float64, nt)
	for i, v := range samples {
		slices.Sort(v)
		out[i] = v[len(v)/2]
	}
	return out, nil
}
