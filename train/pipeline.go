package train

import (
	"time"

	"github.com/sparsegrad/sparsegrad/sparsify"
)

// pipeline reduces a method's groups during the backward pass, for any
// method whose reducer reduces the gradient in groups and declares itself
// pipelined (sparsify.Method.Pipelined). The model's gradient hook reports
// every tensor whose gradient is final (tensorFinal); once all tensors of
// the next group (in backward order) are final, the group is handed to the
// pipeline's goroutine, which starts its reduction (the start function:
// error feedback, then sparsify.Reducer.StartGroups) while the backward
// pass goes on. The groups one tensor completes (the next group, and the
// later ones whose tensors were already final: the same on every rank, set
// by the model's program) are handed over together, as a set that the
// reducer may start at once. After the pass the trainer finishes the call
// (sparsify.Reducer.Finish), which waits for every started group.
type pipeline struct {
	groups  []sparsify.Group
	groupOf []int // the group of each layout tensor

	// The state of one step (reset by run).
	arrived []int // tensors of each group reported final
	next    int   // the next group to hand over
	ch      chan []int
	// Written by the goroutine, read after it has ended: its first error
	// and the time it started the first group.
	err     error
	started time.Time
}

// newPipeline prepares the pipelining of groups over a layout of nTensors
// tensors.
func newPipeline(groups []sparsify.Group, nTensors int) *pipeline {
	p := &pipeline{groups: groups, groupOf: make([]int, nTensors)}
	for g, gg := range p.groups {
		for _, t := range gg.Tensors {
			p.groupOf[t] = g
		}
	}
	p.arrived = make([]int, len(p.groups))
	return p
}

// tensorFinal records that tensor idx's gradient is final and hands the
// groups whose tensors are now all final to the goroutine, in order, as one
// set. It runs on the model's goroutine, during run's pass.
func (p *pipeline) tensorFinal(idx int) {
	g := p.groupOf[idx]
	p.arrived[g]++
	var set []int
	for p.next < len(p.groups) && p.arrived[p.next] == len(p.groups[p.next].Tensors) {
		set = append(set, p.next)
		p.next++
	}
	if set != nil {
		p.ch <- set // never blocks: the channel holds every group
	}
}

// run runs one step's pass (the model's forward and backward, whose hook
// calls tensorFinal) with the pipeline's goroutine starting each handed-over
// set of groups with start, which calls reducing when the set enters the
// reducer. After a start fails, the goroutine starts no other group and
// keeps the error (err). When run returns, also when pass panics, the
// goroutine has ended.
func (p *pipeline) run(pass func() error, start func(gs []int) error) error {
	clear(p.arrived)
	p.next, p.err, p.started = 0, nil, time.Time{}
	p.ch = make(chan []int, len(p.groups))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for gs := range p.ch {
			if p.err != nil {
				continue // drain the hand-over; the step fails
			}
			p.err = start(gs)
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
