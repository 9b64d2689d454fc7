package train

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/recorded"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// A replay (Config.Gradients) runs the trainer on recorded gradients
// (package recorded) instead of a model: its model is models.Recorded,
// whose step writes the gradient recorded for the worker and step into the
// gradient vector, its data serves those gradients one step at a time
// (replayTask), and everything after the backward pass — error feedback,
// the reducer, the metrics, checkpoints and resumes, simulated workers,
// mpirun — is training's own, so the actual density, the bytes, the
// selection time and the error-feedback norm are what training on those
// gradients would give. What a replay cannot give: no update is applied (the
// next gradient is the recorded one, computed from parameters the
// recording's own training reached), there is no loss and no evaluation,
// and the step time is not the model's (t_compute is the copy of the
// recorded gradient; the recording's measured step time is in run.json).

// RecordedModel is the Config.Model of a replay.
const RecordedModel = "recorded"

// A replay of recorded gradients (-gradients DIR). The recording is its
// data; its model holds the recorded parameter layout and computes
// nothing. It makes one pass over the recorded steps with no update.
func init() { register(replayWorkload) }

var replayWorkload = &workload{
	name:     RecordedModel,
	hidden:   true,
	defaults: options.Values{"epochs": 1, "batch": 1, "eval_batch": 1, "lr": 0.0, "optimizer": "none"},
	load: func(_ context.Context, c Config, d *Dataset) error {
		rec, err := recorded.Open(c.Gradients)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		if err := checkReplay(c, rec, false, 0); err != nil {
			return err
		}
		d.Name, d.Recording = rec.Manifest.Model, rec
		return nil
	},
	build: func(_ Config, d *Dataset, _ uint64, be engine.Backend) (models.Model, error) {
		return newRecordedModel(d, be)
	},
	task: func(c Config, d *Dataset, rank, size int) (task, error) {
		if err := checkReplay(c, d.Recording, true, size); err != nil {
			return nil, err
		}
		return newReplayTask(c, d, rank), nil
	},
}

// ReplayCannotShow lists what a replay's report leaves out and why.
const ReplayCannotShow = "no loss, accuracy or other evaluation (the gradients are replayed, not computed: no model runs and no update is applied, so a sparsifier's effect on convergence is not seen); the compute time is the copy of the recorded gradient, not the model's step (the recording's measured step time is given instead); the gradients after step 1 are those the recording's own training produced, not what training with this sparsifier would have produced"

// replayInfo summarises a recording for run.json.
func replayInfo(r *recorded.Recording) *metrics.Replay {
	m := r.Manifest
	return &metrics.Replay{Dir: r.Dir, Model: m.Model, Source: m.Source, Mode: m.Mode, Workers: m.Workers, Steps: m.Steps, Batch: m.Batch,
		StepTime: m.StepTime.Seconds, StepDevice: m.StepTime.Device, Software: m.Software}
}

// ReplayDefaults fills the configuration of a replay from its recording:
// the model, and unless they are set, the worker count (the recording's;
// not under mpirun, where each process is one worker), the batch (the
// recording's, for the samples count) and, for a recording of train, its
// gradient clipping (-clip) and, for a method that applies the momentum
// itself (DGC's momentum correction), its SGD momentum (-momentum). It
// returns c unchanged when c is not a replay.
func ReplayDefaults(c Config, underMPI bool) (Config, error) {
	if c.Gradients == "" {
		return c, nil
	}
	rec, err := recorded.Open(c.Gradients)
	if err != nil {
		return c, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if c.Model == "" {
		c.Model = RecordedModel
	}
	if !underMPI {
		c.Workers.orDefault(rec.Manifest.Workers)
	}
	// A recording of this trainer holds the gradients before clipping and
	// before the momentum: its run's clipping applies again, and so does
	// its momentum in a method that corrects it.
	var run struct {
		Clip      *float64 `json:"clip"`
		Optimizer string   `json:"optimizer"`
		Momentum  *float64 `json:"momentum"`
	}
	if len(rec.Manifest.Run) > 0 && json.Unmarshal(rec.Manifest.Run, &run) == nil {
		if run.Clip != nil {
			c.Clip.orDefault(*run.Clip)
		}
		if m, _ := sparsify.Lookup(c.Sparsifier); m.CorrectsMomentum && run.Optimizer == "sgd" && run.Momentum != nil {
			c.Momentum.orDefault(*run.Momentum)
		}
	}
	c.Batch.orDefault(max(rec.Manifest.Batch, 1))
	return c, nil
}

// checkReplay checks a replay's configuration against its recording.
func checkReplay(c Config, rec *recorded.Recording, underMPI bool, size int) error {
	m := rec.Manifest
	if !underMPI && c.Workers.Value() > m.Workers {
		return fmt.Errorf("%w: -workers %d: the recording %s holds the gradients of %d workers; replay at most that many", ErrConfig, c.Workers.Value(), rec.Dir, m.Workers)
	}
	if size > m.Workers {
		return fmt.Errorf("%w: %d processes: the recording %s holds the gradients of %d workers; start at most that many", ErrConfig, size, rec.Dir, m.Workers)
	}
	if c.Steps > m.Steps {
		return fmt.Errorf("%w: -steps %d: the recording %s holds %d steps; replay at most that many (leave -steps out for all)", ErrConfig, c.Steps, rec.Dir, m.Steps)
	}
	return nil
}

// newRecordedModel builds the recorded model of d's recording on be.
func newRecordedModel(d *Dataset, be engine.Backend) (models.Model, error) {
	m := d.Recording.Manifest
	layout := make([]models.ParamInfo, len(m.Params))
	for i, p := range m.Params {
		layout[i] = p.Tensor
		layout[i].Shape = slices.Clone(p.Shape)
	}
	return models.NewRecorded(m.Model, layout, m.Batch, be)
}

// replayTask serves one rank's recorded gradients, step i of the epoch
// being recorded step i+1. A replay has one epoch and no evaluation.
type replayTask struct {
	rd    *recorded.Reader
	rank  int
	steps int
	batch int
	buf   []float32
}

func newReplayTask(c Config, d *Dataset, rank int) *replayTask {
	m := d.Recording.Manifest
	return &replayTask{rd: d.Recording.NewReader(), rank: rank, steps: m.Steps, batch: m.Batch, buf: make([]float32, m.N)}
}

func (t *replayTask) Len() int { return t.steps }

func (t *replayTask) SetEpoch(e int) error {
	if e != 0 {
		return fmt.Errorf("train: a replay has one epoch, the recorded steps (epoch %d asked for)", e+1)
	}
	return nil
}

func (t *replayTask) Batch(i int) (models.Batch, int, error) {
	if err := t.rd.Read(i+1, t.rank, t.buf); err != nil {
		return models.Batch{}, 0, err
	}
	return models.Batch{Gradient: t.buf}, t.batch, nil
}

func (t *replayTask) Evaluate(context.Context, models.Model, device.Buffer, comm.Communicator, func() bool) (evaluation, error) {
	return evaluation{}, nil
}

func (t *replayTask) EvalBatches() int { return 0 }
func (t *replayTask) Close()           {}

// noUpdate is a replay's optimizer: the recorded gradients do not depend
// on the parameters, so no update is applied.
type noUpdate struct{}

func (noUpdate) Step(device.Buffer, device.Buffer, float64) error { return nil }
func (noUpdate) State() ([][]float32, int64, error)               { return nil, 0, nil }
func (noUpdate) SetState(v [][]float32, _ int64) error {
	if len(v) != 0 {
		return fmt.Errorf("train: a replay keeps no optimizer state, the checkpoint holds %d vectors", len(v))
	}
	return nil
}

// gradRecorder writes a worker's gradients for -record-gradients (one per
// worker; rank 0's also commits the steps and times the steps).
type gradRecorder struct {
	w     *recorded.Writer
	times []float64 // rank 0: the steps' compute times (seconds)
	dev   string
}

// recordMu serialises the first creation of a recording's folder among
// the in-process workers.
var recordMu sync.Mutex

// newGradRecorder prepares worker rank's recording of m into c's
// RecordGradients folder. Rank 0 refuses a folder that holds another
// recording (a resumed run continues its own).
func newGradRecorder(c Config, m models.Model, rank, size, perEpoch int, dev device.Device, rev string) (*gradRecorder, error) {
	dir := c.RecordGradients
	var params []recorded.Param
	for _, p := range m.Layout() {
		p.Shape = slices.Clone(p.Shape)
		params = append(params, recorded.Param{Tensor: p, DType: recorded.F32})
	}
	run, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	man := recorded.Manifest{Model: c.Model, Source: "sparsegrad", Mode: "train", Workers: size, Batch: c.Batch.Value(), StepsPerEpoch: perEpoch, Params: params,
		Software: map[string]string{"sparsegrad": rev, "go": runtime.Version()}, Created: time.Now().UTC(), Run: run,
		StepTime: recorded.StepTime{Device: dev.String()}}
	var w *recorded.Writer
	if rank == 0 {
		recordMu.Lock()
		defer recordMu.Unlock()
		if _, serr := os.Stat(filepath.Join(dir, recorded.ManifestName)); serr == nil && c.Resume != "" {
			w, err = recorded.OpenWriter(dir)
			if err == nil && (w.Manifest().N != m.NumParams() || w.Manifest().Workers != size) {
				err = fmt.Errorf("%w: -record-gradients %s holds a recording of another model or worker count", ErrConfig, dir)
			}
		} else {
			w, err = recorded.Create(dir, man)
		}
	} else {
		w, err = recorded.NewWriter(dir, man)
	}
	if err != nil {
		return nil, fmt.Errorf("train: -record-gradients: %w", err)
	}
	return &gradRecorder{w: w, dev: dev.String()}, nil
}

// commit records, on rank 0, that every rank has written steps 1..steps.
func (g *gradRecorder) commit(steps int) error {
	if g == nil || steps == 0 {
		return nil
	}
	samples := g.times
	med := samples
	if len(med) > 1 {
		med = med[1:] // the first step warms up
	}
	st := recorded.StepTime{Seconds: medianOf(med), Samples: slices.Clone(samples), Device: g.dev}
	if err := g.w.Commit(steps, st); err != nil {
		return fmt.Errorf("train: -record-gradients: %w", err)
	}
	return nil
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// recordGradient writes the gradient of the step being run (before
// clipping and error feedback) and, on rank 0, its compute time.
func (dp *dataPath) recordGradient() error {
	if err := dp.compute.Synchronize(); err != nil {
		return err
	}
	if err := dp.download(dp.hostGrad, dp.grad); err != nil {
		return err
	}
	if err := dp.recorder.w.Write(dp.stepNo, dp.rank, dp.hostGrad); err != nil {
		return fmt.Errorf("train: -record-gradients: %w", err)
	}
	return nil
}

// finishRecording commits the recording's last steps once every rank has
// written them.
func (w *worker) finishRecording(ctx context.Context) error {
	if w.dataPath.recorder == nil {
		return nil
	}
	if err := w.communicator.Barrier(ctx); err != nil {
		return fmt.Errorf("train: -record-gradients: waiting for every rank's last files: %w", err)
	}
	if w.rank != 0 {
		return nil
	}
	return w.dataPath.recorder.commit(w.dataPath.stepNo)
}
