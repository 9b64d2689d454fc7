package advise

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// Horizon is what one method's reducer actually sent over the steps of a
// run, as its controller made it: MiCRO's moving threshold, DGC's density
// warm-up, LAGS' adaptive density, Ok-Topk's periodic thresholds, a dense
// warm-up. Measured by running the real reducer with error feedback on
// Workers in-process workers fed with the model's gradients (a recording's
// steps in turn, or the measured gradients at every step), as train replay
// runs it.
type Horizon struct {
	Method  string  `json:"method"`
	Density float64 `json:"density"`
	Workers int     `json:"workers"`
	// Steps is the horizon: the number of reducer calls simulated.
	Steps int `json:"steps"`
	// Actual are the actual densities (|U|/N, rank 0's
	// sparsify.Stats.ActualDensity) and Bytes the workers' mean bytes sent
	// (as a run's step record has them), per step.
	Actual []float64 `json:"actual"`
	Bytes  []float64 `json:"bytes"`
	// Settled is the first step (1-based) from which every later step's
	// actual density lies within 10 % of the last step's; Steps when it
	// still moves at the end of the horizon.
	Settled int `json:"settled"`
	// Simulated is how many of the Steps the reducer ran: on a stationary
	// source (the gradients of one step repeated) a method that has
	// settled (settles) stops, and the rest of the horizon repeats its
	// last window of steps. Steps when every step ran.
	Simulated int `json:"simulated"`
}

// MeanDensity is the mean actual density over the horizon.
func (h Horizon) MeanDensity() float64 { return meanOf(h.Actual) }

// MeanBytes is the mean over the horizon of one worker's bytes sent per
// step (the workers' mean).
func (h Horizon) MeanBytes() float64 { return meanOf(h.Bytes) }

// first is the horizon cut to its first n steps (n <= 0 or beyond Steps:
// the whole of it).
func (h Horizon) first(n int) Horizon {
	if n <= 0 || n >= h.Steps {
		return h
	}
	h.Steps, h.Actual, h.Bytes = n, h.Actual[:n], h.Bytes[:n]
	h.Simulated = min(h.Simulated, n)
	h.Settled = settledAt(h.Actual)
	return h
}

// from returns the horizon from step n+1 on (its first n steps dropped).
func (h Horizon) from(n int) Horizon {
	n = min(max(n, 0), h.Steps)
	h.Steps, h.Actual, h.Bytes = h.Steps-n, h.Actual[n:], h.Bytes[n:]
	h.Simulated = max(0, h.Simulated-n)
	h.Settled = settledAt(h.Actual)
	return h
}

// settledAt is Horizon.Settled of the series v.
func settledAt(v []float64) int {
	if len(v) == 0 {
		return 0
	}
	last := v[len(v)-1]
	s := len(v)
	for i := len(v) - 1; i >= 0; i-- {
		if math.Abs(v[i]-last) > 0.1*math.Abs(last) {
			break
		}
		s = i + 1
	}
	return s
}

// The default horizon of a built-in model's prediction is one epoch of
// the model at the horizon's workers (horizonWorkers; Host.EpochSteps of
// one worker over them), which covers one epoch at any larger worker count
// (a prediction at P takes the mean over P's epoch, the first
// ⌈EpochSteps/P⌉ steps). It is affordable because the gradients measured
// at one step stand for every step (RepeatGrads): a method whose state
// does not change what it sends (a fixed k: Top-k, gTop-k, Random-k, ...)
// sends the same from its first steps, so each reducer runs only until it
// has settled (settles) and the rest of the horizon repeats its last
// window (Horizon.Simulated says how many steps ran). The controllers
// that move (MiCRO's threshold, about 0.5 % a step; the threshold method's
// residuals; DGC's density warm-up; Ok-Topk's periodic thresholds after
// its dense warm-up; DRAGONN's and Top-k DSA's dense warm-ups) run step by
// step until they settle, or to the end of the horizon.
//
// A uniform sample of each tensor's elements was tried instead and not
// kept: on NCF's real gradients (107,761 elements, 2 workers, 40 steps,
// ρ = 0.01) a 1/4 sample, scaled by 2 so that 1/(2√k) thresholds keep
// their meaning, kept every method's mean actual density and bytes within
// 3 % of the full run's, except MiCRO (+10 % density, +13 % bytes) and the
// hard threshold (+8 %, +10 %), which select a few dozen elements of the
// sample, and PowerSGD, whose bytes follow the full tensors' shapes (half
// on the sample) (2026-11-29, 2-core sandbox).

// settleWindow is the shortest window of the settle criterion (settles).
const settleWindow = 16

// settleTol is the settle criterion's tolerance: the most by which the
// trend of the last windows, carried on to the end of the horizon, may
// move the horizon's mean.
const settleTol = 0.02

// settles is the settle criterion, deterministic: after s of a horizon of
// steps steps on a stationary source, a method has settled when, for its
// actual density and for its bytes, the means m1 and m2 of two
// consecutive windows of W steps ending at s differ so little that the
// trend (m2 − m1)/W carried on over the steps not run would move the
// horizon's mean by at most settleTol of m2:
//
//	|m2 − m1|/|m2| · (steps − s)² / (2·W·steps) <= settleTol
//
// Both windows lie after every change the method's schedule announces
// (quiet: the steps up to its last such change) and grow with the steps
// run since (W = w·max(1, ⌊(s − quiet)/(4w)⌋), so that noise averages
// out; w is settleWindow, or for a method with a schedule of period p,
// sparsify.Advice.Period, the smallest multiple of 2p at least
// settleWindow, so that each window holds whole periods). A method that
// sends the same at every step settles after 2w steps; one that still
// drifts runs on.
func settles(actual, bytes []float64, s, steps, w, quiet int) bool {
	if s-2*w < quiet {
		return false
	}
	W := w * max(1, (s-quiet)/(4*w))
	rest := float64(steps - s)
	ok := func(v []float64) bool {
		m1, m2 := meanOf(v[s-2*W:s-W]), meanOf(v[s-W:s])
		if m1 == m2 {
			return true
		}
		return math.Abs(m2-m1)*rest*rest/(2*float64(W)*float64(steps)) <= settleTol*math.Abs(m2)
	}
	return ok(actual) && ok(bytes)
}

// settleWindowOf is w of settles for method.
func settleWindowOf(method string) int {
	w := settleWindow
	if p := periodOf(method); p > 0 {
		w = 2 * p * ((settleWindow + 2*p - 1) / (2 * p))
	}
	return w
}

// quietFrom is the step after which method's schedule announces no
// change within a horizon of steps: the end of its dense warm-up (the
// option dense_warmup, where the method has it) and the last epoch
// boundary within the horizon (perEpoch > 0: a method may change what it
// sends per epoch, as DGC's density warm-up does).
func quietFrom(params sparsify.Values, steps, perEpoch int) int {
	q := 0
	if _, ok := params["dense_warmup"]; ok {
		q = params.Int("dense_warmup")
	}
	if perEpoch > 0 && steps > perEpoch {
		q = max(q, (steps-1)/perEpoch*perEpoch)
	}
	return min(q, steps)
}

// horizonWorkers bounds the workers a built-in model's horizon runs on;
// other worker counts are carried from it (Predict).
const horizonWorkers = 2

// GradSource fills dst with worker rank's gradient at step (1-based) of the
// horizon.
type GradSource func(step, rank int, dst []float32) error

// RepeatGrads is the GradSource of gradients measured at one step: worker
// r's gradient is grads[r mod len(grads)] at every step.
func RepeatGrads(grads [][]float32) GradSource {
	return func(_, rank int, dst []float32) error {
		copy(dst, grads[rank%len(grads)])
		return nil
	}
}

// horizonRun is the run a horizon simulates: P in-process workers fed
// with Src for Steps steps, and what the run gives its reducer besides the
// gradients.
type horizonRun struct {
	P, Steps int
	// PerEpoch, when above 0, is the run's steps per epoch
	// (sparsify.Reducer.SetStepsPerEpoch: DGC's density warm-up is
	// scheduled in epochs), as a replay of a recording that says it gives
	// it.
	PerEpoch int
	// Seed is the run's seed (sparsify.Options.Seed: DGC's samples and
	// Random-k's indices are drawn from it), Momentum the SGD momentum a
	// method that corrects it applies (sparsify.Options.Momentum, for
	// sparsify.Method.CorrectsMomentum; 0: none), as the run or the
	// replay has them.
	Seed     uint64
	Momentum func(method string) float64
	Src      GradSource
	// Stationary says Src gives the same gradients at every step
	// (RepeatGrads): a method that has settled (settles) may then stop,
	// the rest of the horizon taken at its last window.
	Stationary bool
}

// simulateHorizon runs method's reducer at density d on r.P in-process
// workers for r.Steps calls with error feedback (acc = residual + gradient,
// the residual kept across calls), worker w fed with r.Src(step, w), and
// returns what they sent.
func simulateHorizon(ctx context.Context, method string, r horizonRun, d float64, l layout.Layout, params sparsify.Values) (Horizon, error) {
	p, steps, src := r.P, r.Steps, r.Src
	var mom float64
	if m, ok := sparsify.Lookup(method); ok && m.CorrectsMomentum && r.Momentum != nil {
		mom = r.Momentum(method)
	}
	if steps < 1 {
		return Horizon{}, fmt.Errorf("advise: a horizon of %d steps: want at least 1 (-steps)", steps)
	}
	hz := Horizon{Method: method, Density: d, Workers: p, Steps: steps, Actual: make([]float64, steps), Bytes: make([]float64, steps)}
	w, quiet := settleWindowOf(method), steps
	if r.Stationary {
		rp := params
		if m, ok := sparsify.Lookup(method); ok {
			if v, err := m.Resolve(params); err == nil {
				rp = v
			}
		}
		quiet = quietFrom(rp, steps, r.PerEpoch)
	}
	ran := steps
	var mu sync.Mutex
	err := local.Run(ctx, p, func(ctx context.Context, c comm.Communicator) error {
		red, err := sparsify.New(method, sparsify.Options{Density: d, Layout: l, Comm: c, Seed: r.Seed, Momentum: mom, Params: params})
		if err != nil {
			return err
		}
		red.SetStepsPerEpoch(r.PerEpoch)
		mem := sparsify.NewMemory(l.N, false)
		g := make([]float32, l.N)
		out := make([]float32, l.N)
		for s := range steps {
			mu.Lock() // one reader at a time: a recording's reader is not shared safely
			err := src(s+1, c.Rank(), g)
			mu.Unlock()
			if err != nil {
				return err
			}
			acc, err := mem.Accumulate(g, 1)
			if err != nil {
				return fmt.Errorf("step %d: %w", s+1, err)
			}
			st, err := red.Reduce(ctx, acc, out, mem.Residual)
			if err != nil {
				return fmt.Errorf("step %d: %w", s+1, err)
			}
			mu.Lock()
			hz.Bytes[s] += float64(st.BytesSent) / float64(p)
			if c.Rank() == 0 {
				hz.Actual[s] = st.ActualDensity
			}
			mu.Unlock()
			if !r.Stationary || s+1 < quiet+2*w || s+1 == steps {
				continue
			}
			// Every rank's step s is in once all have passed the
			// barrier; each then reads the same series and stops at
			// the same step.
			if err := c.Barrier(ctx); err != nil {
				return fmt.Errorf("step %d: %w", s+1, err)
			}
			mu.Lock()
			done := settles(hz.Actual, hz.Bytes, s+1, steps, w, quiet)
			mu.Unlock()
			if done {
				if c.Rank() == 0 {
					ran = s + 1
				}
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return Horizon{}, fmt.Errorf("advise: simulating %s over %d steps on %d workers: %w", method, steps, p, err)
	}
	// The steps not run repeat the last w steps run.
	for i := ran; i < steps; i++ {
		j := ran - w + (i-ran)%w
		hz.Actual[i], hz.Bytes[i] = hz.Actual[j], hz.Bytes[j]
	}
	hz.Simulated = ran
	hz.Settled = settledAt(hz.Actual)
	return hz, nil
}

// horizon returns the horizon measured for method at density, preferring
// one of P workers (else the one of the most workers).
func (h *Host) horizon(method string, density float64, P int) (Horizon, bool) {
	best := -1
	for i, z := range h.Horizons {
		if z.Method != method || z.Density != density {
			continue
		}
		if best < 0 || z.Workers == P || (h.Horizons[best].Workers != P && z.Workers > h.Horizons[best].Workers) {
			best = i
		}
	}
	if best < 0 {
		return Horizon{}, false
	}
	return h.Horizons[best], true
}

// measureHorizons runs every method of methods that selects (and can run
// on r.P workers) at every density over the run r, and records them in h.
func (h *Host) measureHorizons(ctx context.Context, methods []string, densities []float64, r horizonRun, params sparsify.Values, logf func(string, ...any)) error {
	p, steps := r.P, r.Steps
	h.HorizonSteps = steps
	for _, d := range densities {
		for _, m := range methods {
			if !selects(m) {
				continue
			}
			ps := filterParams(m, params)
			if refusesCutOff(m, h.Layout, ps) != nil || !runsOn(m, p, ps) {
				continue // Predict says why; predicted at its steady state
			}
			logf("%s at density %g over a horizon of %d steps on %d workers", m, d, steps, p)
			t0 := time.Now()
			hz, err := simulateHorizon(ctx, m, r, d, h.Layout, ps)
			if err != nil {
				return err
			}
			logf("  %s ran %d of %d steps in %s", m, hz.Simulated, steps, time.Since(t0).Round(time.Millisecond))
			h.Horizons = append(h.Horizons, hz)
		}
	}
	return nil
}
