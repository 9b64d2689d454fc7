package data

import (
	"runtime"
	"sync"
)

// pool runs a fixed function over index ranges on persistent goroutines, so
// that assembling a batch in parallel allocates nothing.
type pool struct {
	workers int
	fn      func(lo, hi int)
	jobs    chan [2]int
	wg      sync.WaitGroup
	once    sync.Once
}

// newPool starts workers-1 goroutines (the caller's goroutine does one part);
// workers <= 0 means GOMAXPROCS.
func newPool(workers int, fn func(lo, hi int)) *pool {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	p := &pool{workers: workers, fn: fn, jobs: make(chan [2]int, workers)}
	for w := 1; w < workers; w++ {
		go func() {
			for j := range p.jobs {
				p.fn(j[0], j[1])
				p.wg.Done()
			}
		}()
	}
	return p
}

// run calls fn over [0, n) split into contiguous parts, one per worker, and
// waits for all of them. Small n runs on the caller's goroutine only.
func (p *pool) run(n, minPerWorker int) {
	parts := p.workers
	if minPerWorker > 0 && n/minPerWorker < parts {
		parts = max(n/minPerWorker, 1)
	}
	if parts <= 1 {
		p.fn(0, n)
		return
	}
	p.wg.Add(parts - 1)
	for w := 1; w < parts; w++ {
		p.jobs <- [2]int{w * n / parts, (w + 1) * n / parts}
	}
	p.fn(0, n/parts)
	p.wg.Wait()
}

// close stops the goroutines; run must not be called afterwards.
func (p *pool) close() { p.once.Do(func() { close(p.jobs) }) }
