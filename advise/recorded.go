package advise

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/recorded"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// RecordedConfig says what MeasureRecorded measures.
type RecordedConfig struct {
	// Dir is the recording (package recorded).
	Dir string
	// StepTime is one worker's forward and backward time on the cluster's
	// GPUs (0: the recording's measured one).
	StepTime time.Duration
	// Device is where selection, the update and error feedback are
	// measured: "cpu" or "cuda" (the GPU the cluster would run them on).
	Device string
	// Kind is the kind of model ("": guessed from the parameter names).
	Kind Kind
	// Step is the recorded step whose gradients are measured (0: the
	// last).
	Step int
	// Steps is the horizon: how many steps each method's reducer runs over
	// the recording's steps in turn, as train replay runs it (0: the
	// recording's steps).
	Steps int
	// Densities, Methods and Params are Config's.
	Densities []float64
	Methods   []string
	Params    sparsify.Values
	// Log receives one line per stage (nil: none).
	Log io.Writer
}

// maxGradWorkers bounds the recorded workers whose gradients are held for
// the unions (more are extrapolated from them).
const maxGradWorkers = 16

// MeasureRecorded is Measure for a model the project does not have: the
// gradients are a recording's (of the step cfg.Step, up to 16 of its
// workers), the step time is given or the recording's own, and what runs
// beside the model — each method's selection, the optimizer's update (SGD
// with momentum over the parameters), error feedback's accumulation — is
// measured here on cfg.Device, through the same reducers and vector
// operations training uses on that device. The forward pass is taken as a
// third of the step, the backward pass as two thirds (LAGS' overlap reads
// it).
func MeasureRecorded(ctx context.Context, cfg RecordedConfig) (*Host, error) {
	logf := func(format string, a ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", a...)
		}
	}
	rec, err := recorded.Open(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("advise: %w", err)
	}
	m := rec.Manifest
	lay, err := measuredLayout(m.Layout().Tensors)
	if err != nil {
		return nil, fmt.Errorf("advise: the recording's layout: %w", err)
	}
	h := &Host{Model: m.Model, Dataset: "recorded gradients", Device: cfg.Device, Batch: m.Batch, Layout: lay,
		Cores: runtime.NumCPU(), CPU: cpuName(), Recording: rec.Dir, Kind: cfg.Kind}
	if h.Device == "" {
		h.Device = "cpu"
	}
	if h.Kind == "" {
		h.Kind = KindOf(m.Model, h.Layout.Names())
	}
	switch {
	case cfg.StepTime > 0:
		h.Compute, h.StepSource = cfg.StepTime.Seconds(), "given"
	case m.StepTime.Seconds > 0:
		h.Compute, h.StepSource, h.StepDevice = m.StepTime.Seconds, "recorded", m.StepTime.Device
	default:
		return nil, fmt.Errorf("advise: the recording %s has no measured step time; give -step-time, one worker's forward and backward time on your GPUs (e.g. -step-time 85ms)", rec.Dir)
	}
	h.Forward, h.Backward = h.Compute/3, 2*h.Compute/3
	h.GradStep = cfg.Step
	if h.GradStep == 0 {
		h.GradStep = m.Steps
	}
	if h.GradStep < 1 || h.GradStep > m.Steps {
		return nil, fmt.Errorf("advise: step %d: the recording %s holds steps 1 to %d", cfg.Step, rec.Dir, m.Steps)
	}
	h.GradWorkers = min(m.Workers, maxGradWorkers)
	h.EpochSteps = m.StepsPerEpoch * m.Workers // one worker's epoch (0: not recorded)
	if len(cfg.Methods) == 0 {
		cfg.Methods = Methods()
	}
	logf("reading the gradients of %d workers at step %d of %s", h.GradWorkers, h.GradStep, rec.Dir)
	grads := make([][]float32, h.GradWorkers)
	rd := rec.NewReader()
	for r := range grads {
		grads[r] = make([]float32, m.N)
		if err := rd.Read(h.GradStep, r, grads[r]); err != nil {
			return nil, fmt.Errorf("advise: %w", err)
		}
	}
	dev, ops, closeDev, err := openDevice(h.Device)
	if err != nil {
		return nil, err
	}
	defer closeDev()
	h.Device = dev.String()
	h.NormPass = normPass(grads[0])
	for _, d := range cfg.Densities {
		if !(d > 0 && d <= 1) {
			return nil, fmt.Errorf("advise: density %v: want a fraction in (0, 1]", d)
		}
		h.Unions = append(h.Unions, unions(grads, d))
	}
	logf("timing the update and error feedback over %d parameters on %s", m.N, h.Device)
	if h.Update, h.Other, err = vectorTimes(dev, ops, m.N); err != nil {
		return nil, err
	}
	if err := h.measureSelections(ctx, dev, ops, cfg.Methods, cfg.Densities, cfg.Params, grads, logf); err != nil {
		return nil, err
	}
	steps := cfg.Steps
	if steps == 0 {
		steps = m.Steps
	}
	src := func(step, rank int, dst []float32) error {
		return rd.Read((step-1)%m.Steps+1, rank, dst)
	}
	// The run a replay of the recording makes: the trainer's default seed,
	// and a recording of train's own run's SGD momentum for the methods
	// that correct it (train.ReplayDefaults).
	run := horizonRun{P: min(m.Workers, maxGradWorkers), Steps: steps, PerEpoch: m.StepsPerEpoch, Src: src,
		Seed: train.Config{}.Defaults().Seed.Value(),
		Momentum: func(method string) float64 {
			c, err := train.ReplayDefaults(train.Config{Gradients: rec.Dir, Sparsifier: method}, false)
			if err != nil {
				return 0
			}
			return c.Momentum.Value()
		}}
	if err := h.measureHorizons(ctx, cfg.Methods, cfg.Densities, run, cfg.Params, logf); err != nil {
		return nil, err
	}
	logf("in-process collectives of %d workers", 2)
	n, err := hostCollectives(ctx, 2, h.Layout.N)
	if err != nil {
		return nil, err
	}
	h.HostNets = append(h.HostNets, n)
	return h, nil
}

// openDevice opens the device selections are measured on, with its vector
// operations for the reducers (nil on the CPU: the reducers' own).
func openDevice(name string) (device.Device, sparsify.Ops, func(), error) {
	switch name {
	case "cpu":
		return device.CPU, nil, func() {}, nil
	case "cuda":
		g, err := cuda.Open(0, cuda.Options{})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("advise: -device cuda: %w", err)
		}
		return g, g.Sparse(), func() { g.Close() }, nil
	}
	return nil, nil, nil, fmt.Errorf("advise: -device %q: use cpu or cuda", name)
}

// vectorTimes times, on dev, one SGD step with momentum and weight decay
// over n parameters and one error-feedback accumulation (the medians of 7
// after one).
func vectorTimes(dev device.Device, ops sparsify.Ops, n int) (update, feedback float64, err error) {
	if ops == nil {
		ops = sparsify.CPUOps()
	}
	var bufs [3]device.Buffer
	for i := range bufs {
		if bufs[i], err = dev.Alloc(device.Float32, n); err != nil {
			return 0, 0, fmt.Errorf("advise: allocating %d floats on %s: %w", n, dev, err)
		}
		defer dev.Free(bufs[i])
	}
	st := dev.Stream()
	timed := func(f func(first bool) error) (float64, error) {
		var ts []float64
		for i := range 8 {
			if err := st.Synchronize(); err != nil {
				return 0, err
			}
			t0 := time.Now()
			if err := f(i == 0); err != nil {
				return 0, err
			}
			if err := st.Synchronize(); err != nil {
				return 0, err
			}
			if i > 0 {
				ts = append(ts, time.Since(t0).Seconds())
			}
		}
		return median(ts), nil
	}
	if update, err = timed(func(first bool) error {
		return dev.Math().SGD(st, device.SGDStep{LR: 1e-9, Momentum: 0.9, WeightDecay: 1e-4, First: first}, bufs[0], bufs[1], bufs[2])
	}); err != nil {
		return 0, 0, fmt.Errorf("advise: timing the update: %w", err)
	}
	if feedback, err = timed(func(bool) error {
		_, err := ops.Accumulate(st, bufs[1], bufs[2], 1)
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("advise: timing error feedback: %w", err)
	}
	return update, feedback, nil
}
