package train

import (
	"context"
	"fmt"
	"time"

	"github.com/sparsegrad/sparsegrad/sparsify"
)

// pipeline reduces LAGS' merge groups during the backward pass. The model's
// gradient hook reports every tensor whose gradient is final (tensorFinal);
// once all tensors of the next group (in backward order) are final, the
// group is handed to the pipeline's goroutine, which starts its reduction
// (the start function: error feedback, then GroupReducer.StartGroup) while
// the backward pass goes on. After the pass, wait collects every group.
type pipeline struct {
	gred    sparsify.GroupReducer
	groups  []sparsify.Group
	groupOf []int // the group of each layout tensor

	// The state of one step (reset by run).
	arrived []int // tensors of each group reported final
	next    int   // the next group to hand over
	ch      chan int
	pend    []sparsify.Pending
	// Written by the goroutine, read after it has ended: its first error
	// and the time it started the first group.
	err     error
	started time.Time
}

// newPipeline prepares the pipelining of gr's groups over a layout of
// nTensors tensors.
func newPipeline(gr sparsify.GroupReducer, nTensors int) *pipeline {
	p := &pipeline{gred: gr, groups: gr.Groups(), groupOf: make([]int, nTensors)}
	for g, gg := range p.groups {
		for _, t := range gg.Tensors {
			p.groupOf[t] = g
		}
	}
	p.arrived = make([]int, len(p.groups))
	p.pend = make([]sparsify.Pending, len(p.groups))
	return p
}

// tensorFinal records that tensor idx's gradient is final and hands every
// group whose tensors are all final to the goroutine, in order. It runs on
// the model's goroutine, during run's pass.
func (p *pipeline) tensorFinal(idx int) {
	g := p.groupOf[idx]
	p.arrived[g]++
	for p.next < len(p.groups) && p.arrived[p.next] == len(p.groups[p.next].Tensors) {
		p.ch <- p.next // never blocks: the channel holds every group
		p.next++
	}
}

// run runs one step's pass (the model's forward and backward, whose hook
// calls tensorFinal) with the pipeline's goroutine starting each handed-over
// group with start, which calls reducing when the group enters the reducer.
// When run returns, also when pass panics, the goroutine has ended.
func (p *pipeline) run(pass func() error, start func(g int) (sparsify.Pending, error)) error {
	clear(p.arrived)
	clear(p.pend)
	p.next, p.err, p.started = 0, nil, time.Time{}
	p.ch = make(chan int, len(p.groups))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for g := range p.ch {
			if p.err != nil {
				continue // drain the hand-over; the step fails
			}
			pd, err := start(g)
			if err != nil {
				p.err = err
				continue
			}
			p.pend[g] = pd
		}
	}()
	defer func() {
		close(p.ch)
		<-done
	}()
	return pass()
}

// reducing records, on the pipeline's goroutine, that a group enters the
// reducer (the first one starts the step's communication).
func (p *pipeline) reducing() {
	if p.started.IsZero() {
		p.started = time.Now()
	}
}

// wait waits for every group of the step and returns their statistics. On
// a failure (of the goroutine, a group never started, a reduction) it first
// waits for the groups still in flight, so that none outlives the step.
func (p *pipeline) wait(ctx context.Context) ([]sparsify.GroupStats, error) {
	if p.err != nil {
		p.drain(ctx)
		return nil, p.err
	}
	gs := make([]sparsify.GroupStats, len(p.groups))
	for g, pd := range p.pend {
		if pd == nil {
			p.drain(ctx)
			return nil, fmt.Errorf("train: merge group %d was never started (its gradients were not all reported by the model)", g)
		}
		st, err := pd.Wait(ctx)
		p.pend[g] = nil
		if err != nil {
			p.drain(ctx)
			return nil, fmt.Errorf("train: reducing merge group %d: %w", g, err)
		}
		gs[g] = st
	}
	return gs, nil
}

// drain waits for the groups still in flight after a failure.
func (p *pipeline) drain(ctx context.Context) {
	for g, pd := range p.pend {
		if pd != nil {
			pd.Wait(ctx)
			p.pend[g] = nil
		}
	}
}
