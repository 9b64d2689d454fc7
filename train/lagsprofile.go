package train

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// LAGS' adaptive density (-max-ratio) needs the backward time of every
// tensor and the sparsification time per element. The first steps hold
// allocation, compilation and cold caches, so they are not measured: the
// trainer profiles lagsProfileSteps steps after lagsProfileWarmup steps of
// this process (the reference profiles 50 steps after 5; CPU steps are
// slow, and the mean of 10 is already steady), then hands LAGS the mean
// per-tensor backward times and the measured sparsification cost, each the
// maximum over ranks, so that every rank chooses the same k.
const (
	lagsProfileWarmup = 5
	lagsProfileSteps  = 10
)

// lagsProfile accumulates the profiled steps.
type lagsProfile struct {
	seen  int     // steps of this process while profiling
	from  int     // the first profiled step (run-wide number)
	sum   []int64 // per tensor, the backward nanoseconds summed
	steps int     // steps summed
}

// profileLAGS runs after every step (step is the run-wide number of the
// step just done): it profiles the steps after the warm-up and, after the
// last one, sets LAGS' backward times and sparsification cost. It does
// nothing for other methods, for a fixed density, and once the times are
// set (also by a resumed checkpoint).
func (w *worker) profileLAGS(ctx context.Context, step int) error {
	l, ok := w.dataPath.reducer.(sparsify.CostAdaptive)
	if !ok || !l.Adaptive() || l.HasBackwardTimes() {
		return nil
	}
	p := &w.lags
	p.seen++
	if p.seen <= lagsProfileWarmup {
		if p.seen == lagsProfileWarmup {
			l.TakeSparCost() // the measurement starts with the next step
			p.from = step + 1
		}
		return nil
	}
	nt := len(w.dataPath.layout.Tensors)
	if p.sum == nil {
		p.sum = make([]int64, nt)
	}
	var prev time.Time
	// Tensors become final in descending layout order; the first to be
	// final is the start of the measured backward pass.
	for i := nt - 1; i >= 0; i-- {
		ev := w.dataPath.gradFinal[i]
		if ev == nil {
			continue
		}
		if err := ev.Synchronize(); err != nil {
			return err
		}
		at := ev.Time()
		if !prev.IsZero() {
			p.sum[i] += max(int64(at.Sub(prev)), 0)
		}
		prev = at
	}
	p.steps++
	if p.steps < lagsProfileSteps {
		return nil
	}
	// The means and the cost (in femtoseconds per element), maxima over
	// the ranks.
	send := make(comm.Int64s, nt+1)
	for i, s := range p.sum {
		send[i] = s / int64(p.steps)
	}
	spar := l.TakeSparCost()
	send[nt] = int64(math.Round(spar * 1e15))
	recv := make(comm.Int64s, (nt+1)*w.size)
	if err := w.communicator.AllGather(ctx, send, recv); err != nil {
		return fmt.Errorf("train: combining the profiled backward times: %w", err)
	}
	d := make([]time.Duration, nt)
	var sparFs int64
	for r := 0; r < w.size; r++ {
		row := recv[r*(nt+1) : (r+1)*(nt+1)]
		for i := range d {
			d[i] = max(d[i], time.Duration(row[i]))
		}
		sparFs = max(sparFs, row[nt])
	}
	if err := l.SetSparCost(float64(sparFs) * 1e-15); err != nil {
		return err
	}
	if err := l.SetBackwardTimes(d); err != nil {
		return err
	}
	var back time.Duration
	for _, t := range d {
		back += t
	}
	lo, hi := math.Inf(1), 0.0
	groups := l.Groups()
	for g, k := range l.GroupK() {
		r := float64(k) / float64(groups[g].Size())
		lo, hi = min(lo, r), max(hi, r)
	}
	return w.note(fmt.Sprintf("lags: adaptive density from steps %d–%d (after %d warm-up steps): backward pass %v, sparsification %.3g ns per element; the %d groups' densities now range over [%.3g, %.3g] (c_u = %g)",
		p.from, step, lagsProfileWarmup, back.Round(time.Microsecond), float64(sparFs)*1e-6, len(groups), lo, hi, w.cfg.MethodOptions.Float("max_ratio")))
}
