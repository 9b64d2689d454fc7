package advise

import (
	"context"
	"fmt"
	"math"
	"sync"

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
}

// MeanDensity is the mean actual density over the horizon.
func (h Horizon) MeanDensity() float64 { return meanOf(h.Actual) }

// MeanBytes is the mean over the horizon of one worker's bytes sent per
// step (the workers' mean).
func (h Horizon) MeanBytes() float64 { return meanOf(h.Bytes) }

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

// DefaultHorizon is the horizon of a built-in model's prediction: 3
// steps on horizonWorkers workers, not one epoch (hundreds to thousands of
// steps), because each step of the horizon runs every method's reducer on
// this machine: on gradients of ResNet-18's 11,173,962 elements, the 15
// methods' reducers on 4 workers took about 30 s a step on a shared 2-core
// machine (2026-11-29; 0.7 s dense to 9 s the hard threshold). The
// gradients measured at one step stand for every step anyway. The
// controllers that move slowly (MiCRO's threshold, about 0.5 % a step) are
// then shown at their start, where a short run sits; give a longer horizon
// (train advise -steps) for a long run; the table's header says when the
// horizon is shorter than an epoch (EpochNote).
//
// One epoch on a uniform sample of each tensor's elements is not yet the
// default: on NCF's real gradients (107,761 elements, 2 workers, 40 steps,
// ρ = 0.01) a 1/4 sample, scaled by 2 so that 1/(2√k) thresholds keep
// their meaning, kept every method's mean actual density and bytes within
// 3 % of the full run's, except MiCRO (+10 % density, +13 % bytes) and the
// hard threshold (+8 %, +10 %), which select a few dozen elements of the
// sample, and PowerSGD, whose bytes follow the full tensors' shapes (half
// on the sample); taking each method's first step in full and the sample's
// series relative to its own first step fixed PowerSGD but put MiCRO at
// −15 % (2026-11-29, 2-core sandbox). A test on a model large enough for
// the sampled selections to be hundreds of elements is what it lacks.
const DefaultHorizon = 3

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
		}
		return nil
	})
	if err != nil {
		return Horizon{}, fmt.Errorf("advise: simulating %s over %d steps on %d workers: %w", method, steps, p, err)
	}
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
			meth, _ := sparsify.Lookup(m)
			ps := filterParams(m, params)
			if refusesCutOff(m, h.Layout, ps) != nil {
				continue // Predict says why
			}
			if meth.CheckWorkers != nil {
				if r, err := meth.Resolve(ps); err != nil || meth.CheckWorkers(p, r) != nil {
					continue // predicted at its steady state
				}
			}
			logf("%s at density %g over a horizon of %d steps on %d workers", m, d, steps, p)
			hz, err := simulateHorizon(ctx, m, r, d, h.Layout, ps)
			if err != nil {
				return err
			}
			h.Horizons = append(h.Horizons, hz)
		}
	}
	return nil
}
