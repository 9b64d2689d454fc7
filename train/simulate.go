package train

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/models"
)

// simulation is what the in-process workers of a simulated cluster share
// on the CPU: the models they take turns on (a models.Pool of executors),
// one parameter vector and one optimizer. Every worker applies the same
// averaged update in a real cluster, so the replicas' parameters are
// identical after every step; here rank 0 applies it once, to the one
// copy, between two barriers: the first waits until every worker is done
// with the step's parameters (its backward pass and reduction), the
// second until the update is done (before any next forward pass). What is
// per worker stays per worker: the gradient, the error-feedback residual,
// the reducer and its state, the data shard, and the model state the pool
// binds to each step (BatchNorm statistics, dropout stream, LSTM hidden
// state).
type simulation struct {
	workers, executors int

	poolOnce sync.Once
	pool     *models.Pool
	poolErr  error
	own      bool // each worker has a model of its own (not shareable)

	sharedOnce sync.Once
	params     device.Buffer
	opt        Optimizer
	sharedErr  error

	bar *barrier
}

// simulated returns the simulation of an in-process run of several workers
// on the CPU (nil otherwise: under mpirun, for one worker and on GPUs,
// where every worker keeps its own model and parameters).
func simulated(c Config, backend string, workers int) *simulation {
	if backend != "local" || c.Device != "cpu" || workers < 2 {
		return nil
	}
	return &simulation{workers: workers, executors: executorsFor(c, workers), bar: newBarrier(workers)}
}

// executorsFor is the number of executors workers share: -executors, or
// one per core, at most one per worker.
func executorsFor(c Config, workers int) int {
	if c.Executors > 0 {
		return min(c.Executors, workers)
	}
	return max(1, min(workers, runtime.NumCPU()))
}

// model returns rank's model: a worker of the shared pool, built on first
// use; a model of the worker's own, as on GPUs, where the model cannot be
// shared (one defined outside package models, models.Shareable).
func (s *simulation) model(c Config, d *Dataset, rank int, be engine.Backend) (models.Model, error) {
	s.poolOnce.Do(func() {
		first, err := NewModel(c, d, c.Seed.Value(), be)
		if err != nil {
			s.poolErr = err
			return
		}
		if !models.Shareable(first) {
			s.own, s.executors = true, s.workers
			return
		}
		s.pool, s.poolErr = models.NewPool(s.executors, func() (models.Model, error) {
			if m := first; m != nil {
				first = nil
				return m, nil
			}
			return NewModel(c, d, c.Seed.Value(), be)
		})
	})
	if s.poolErr != nil {
		return nil, s.poolErr
	}
	if s.own {
		return NewModel(c, d, c.Seed.Value()+uint64(rank), be)
	}
	return s.pool.Worker(c.Seed.Value() + uint64(rank))
}

// shared returns the one parameter vector and optimizer, made by the first
// worker that asks.
func (s *simulation) shared(make func() (device.Buffer, Optimizer, error)) (device.Buffer, Optimizer, error) {
	s.sharedOnce.Do(func() { s.params, s.opt, s.sharedErr = make() })
	return s.params, s.opt, s.sharedErr
}

// barrier is a reusable barrier of n in-process workers that a failing
// worker breaks (abort), so that no worker waits forever for one that has
// stopped.
type barrier struct {
	mu     sync.Mutex
	n, in  int
	gen    chan struct{} // closed when the current round completes
	broken chan struct{} // closed by abort
	err    error
}

func newBarrier(n int) *barrier {
	return &barrier{n: n, gen: make(chan struct{}), broken: make(chan struct{})}
}

// wait blocks until all n workers have called wait in this round, the
// barrier is broken or ctx ends.
func (b *barrier) wait(ctx context.Context) error {
	b.mu.Lock()
	if b.err != nil {
		b.mu.Unlock()
		return b.err
	}
	b.in++
	gen := b.gen
	if b.in == b.n {
		b.in = 0
		b.gen = make(chan struct{})
		close(gen)
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	select {
	case <-gen:
		return nil
	case <-b.broken:
		select {
		case <-gen: // the round completed before the break
			return nil
		default:
		}
		return b.err
	case <-ctx.Done():
		b.abort(fmt.Errorf("%w: a simulated worker stopped: %w", comm.ErrAborted, ctx.Err()))
		return fmt.Errorf("train: %w", ctx.Err())
	}
}

// abort breaks the barrier: every waiting and later wait returns err (the
// first abort's), wrapped as comm.ErrAborted.
func (b *barrier) abort(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return
	}
	b.err = fmt.Errorf("%w: another simulated worker failed (%v)", comm.ErrAborted, err)
	close(b.broken)
}
