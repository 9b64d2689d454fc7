package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/rundir"
)

// position is where a run stands between steps: the 0-based epoch to
// continue in, the batch of that epoch to continue from, the steps done,
// and whether an evaluation (of 0-based epoch evalEpoch) is due at step
// and not yet done.
type position struct {
	epoch, batch, step int
	evalDue            bool
	evalEpoch          int
}

// checkpointState is a worker's state of checkpoints and resumes.
type checkpointState struct {
	// lastDir is the folder of the newest complete checkpoint ("" none),
	// lastStep its step; prevStep is the step of the one before (-1 none).
	lastDir            string
	lastStep, prevStep int
	// modelState is the model's state of the checkpoint resumed from,
	// given to the model again after the epoch's ResetState.
	modelState []byte
	// evaluated says that metrics.jsonl holds an evaluation at the step
	// resumed from (the end of the run resumed).
	evaluated bool
}

// ckptError is a checkpoint that could not be written; the previous one is
// intact.
type ckptError struct {
	step     int
	prev     string // "" when there is none
	prevStep int    // the step of prev
	msg      string
	err      error
}

func (e *ckptError) Error() string {
	s := fmt.Sprintf("checkpoint of step %d not written: %s; ", e.step, e.msg)
	if e.prev != "" {
		return s + "the previous checkpoint " + e.prev + " is intact"
	}
	return s + "there is no earlier checkpoint"
}

func (e *ckptError) Unwrap() error { return e.err }

// paramHash is a CRC-32C of the parameters' bits (host view, downloaded).
func (dp *dataPath) paramHash() (uint32, error) {
	if err := dp.download(dp.hostParams, dp.params); err != nil {
		return 0, err
	}
	return rundir.Checksum(dp.hostParams), nil // in pieces: many workers of one process hash at once
}

// shard collects this rank's part of a checkpoint.
func (dp *dataPath) shard(step int) (*rundir.Shard, error) {
	if err := dp.download(dp.hostResidual, dp.residual); err != nil { // on a GPU
		return nil, err
	}
	red, err := dp.reducer.State()
	if err != nil {
		return nil, fmt.Errorf("train: the reducer's state: %w", err)
	}
	s := &rundir.Shard{Rank: dp.rank, Workers: dp.size, Step: step, Residual: dp.hostResidual, Reducer: red}
	if i := firstNonFinite(s.Residual); i >= 0 {
		return nil, dp.nonFinite("error-feedback residual", s.Residual, i)
	}
	if nb := sumSizes(dp.model.BufferLayout()); nb > 0 {
		s.Buffers = make([]float32, nb)
		if err := dp.model.StoreBuffers(s.Buffers); err != nil {
			return nil, err
		}
		if i := firstNonFinite(s.Buffers); i >= 0 {
			name, _ := tensorAt(dp.model.BufferLayout(), i)
			return nil, fmt.Errorf("%w: the batch-norm statistics are %v in %s", errNonFinite, s.Buffers[i], name)
		}
	}
	if ms, ok := dp.model.(models.Stateful); ok {
		b, err := ms.SaveState()
		if err != nil {
			return nil, err
		}
		s.Model = b
	}
	return s, nil
}

// checkpoint writes a checkpoint of position p (every rank takes part): each
// rank writes its part, the ranks agree that all parts are written and
// that their parameters are identical, and rank 0 then writes the shared
// part, which completes the checkpoint. A rank that cannot write gives a
// *ckptError on every rank (the previous checkpoint stays the newest
// complete one); a non-finite state or parameters that differ between
// ranks are errors of their own, and no checkpoint of them is written.
func (w *worker) checkpoint(ctx context.Context, p position) error {
	dir := rundir.CheckpointDir(w.cfg.Out, p.step)
	var info rundir.ShardInfo
	var werr error
	fatal := false
	s, err := w.dataPath.shard(p.step)
	if err != nil {
		werr, fatal = err, true
	} else if werr = beforeWrite(filepath.Join(dir, rundir.ShardFile(w.rank))); werr == nil {
		info, werr = rundir.WriteShard(w.cfg.Out, s)
	}
	hash, err := w.dataPath.paramHash()
	if err != nil {
		return err
	}
	if w.rank == 0 && werr == nil {
		if i := firstNonFinite(w.dataPath.hostParams); i >= 0 {
			werr, fatal = w.dataPath.nonFinite("parameter", w.dataPath.hostParams, i), true
		}
	}
	flag := int64(0)
	if werr != nil {
		flag = 1
		if fatal {
			flag = 2
		}
	}
	all := make(comm.Int64s, 4*w.size)
	if err := w.communicator.AllGather(ctx, comm.Int64s{flag, info.Bytes, int64(info.CRC), int64(hash)}, all); err != nil {
		return fmt.Errorf("agreeing on the checkpoint of step %d: %w", p.step, err)
	}
	failed := false
	for r := range w.size {
		failed = failed || all[4*r] != 0
	}
	if failed {
		msgs, err := gatherStrings(ctx, w.communicator, errString(werr))
		if err != nil {
			return err
		}
		var parts []string
		fatalAny := false
		for r := range w.size {
			if all[4*r] == 0 {
				continue
			}
			fatalAny = fatalAny || all[4*r] == 2
			if w.size > 1 {
				parts = append(parts, fmt.Sprintf("rank %d: %s", r, msgs[r]))
			} else {
				parts = append(parts, msgs[r])
			}
		}
		rundir.RemoveShard(w.cfg.Out, p.step, w.rank)
		msg := strings.Join(parts, "; ")
		if fatalAny {
			if werr == nil {
				werr = errNonFinite
			}
			return collective(fmt.Errorf("%s (no checkpoint of this state was written): %w", msg, errors.Join(werr, errNonFinite)))
		}
		return collective(&ckptError{step: p.step, prev: w.checkpoints.lastDir, prevStep: w.checkpoints.lastStep, msg: msg, err: werr})
	}
	hashes := make([]int64, w.size)
	for r := range w.size {
		hashes[r] = all[4*r+3]
	}
	if err := diverged(hashes, p.step); err != nil {
		rundir.RemoveShard(w.cfg.Out, p.step, w.rank)
		return collective(err)
	}
	// Every part is written: rank 0 completes the checkpoint.
	var serr error
	if w.rank == 0 {
		serr = w.writeShared(p, all)
	}
	ok := comm.Int64s{0}
	if serr != nil {
		ok[0] = 1
	}
	if err := w.communicator.Broadcast(ctx, ok, 0); err != nil {
		return fmt.Errorf("agreeing on the checkpoint of step %d: %w", p.step, err)
	}
	if ok[0] != 0 {
		m, err := broadcastBytes(ctx, w.communicator, []byte(errString(serr)), 0)
		if err != nil {
			return err
		}
		rundir.RemoveShard(w.cfg.Out, p.step, w.rank)
		return collective(&ckptError{step: p.step, prev: w.checkpoints.lastDir, prevStep: w.checkpoints.lastStep, msg: "rank 0: " + string(m), err: serr})
	}
	prevStep := w.checkpoints.lastStep
	w.checkpoints.lastDir, w.checkpoints.prevStep, w.checkpoints.lastStep = dir, prevStep, p.step
	w.keep()
	w.runner.status.setCheckpoint(dir, p.step)
	w.log.Info("checkpoint written", "dir", dir, "step", p.step)
	rundir.Prune(w.cfg.Out, w.rank, prevStep, w.log)
	return nil
}

// writeShared writes shared.ckpt (rank 0), after syncing metrics.jsonl so
// that the records up to the checkpoint survive a crash with it.
func (w *worker) writeShared(p position, all comm.Int64s) error {
	if err := w.out.metrics.Sync(); err != nil {
		return fmt.Errorf("syncing metrics.jsonl: %w", err)
	}
	ck := &rundir.Checkpoint[Config]{Config: w.cfg, Workers: w.size, Epoch: p.epoch, Batch: p.batch, Step: p.step,
		EvalDue: p.evalDue, EvalEpoch: p.evalEpoch, Elapsed: time.Since(w.start), Written: time.Now().UTC(),
		Params: w.dataPath.hostParams}
	ck.Config.Resume = ""
	var err error
	if ck.Opt, ck.OptSteps, err = w.dataPath.opt.State(); err != nil {
		return err
	}
	for r := range w.size {
		ck.Shards = append(ck.Shards, rundir.ShardInfo{Bytes: all[4*r+1], CRC: uint32(all[4*r+2])})
	}
	if err := beforeWrite(filepath.Join(rundir.CheckpointDir(w.cfg.Out, p.step), rundir.SharedFile)); err != nil {
		return err
	}
	return rundir.WriteShared(w.cfg.Out, ck)
}

// ckptWriteHook, when set (tests), is called before every checkpoint file
// is written and can fail it (a full disk).
var ckptWriteHook func(path string) error

// beforeWrite is ckptWriteHook's error for the file at path (nil without
// a hook).
func beforeWrite(path string) error {
	if ckptWriteHook == nil {
		return nil
	}
	return ckptWriteHook(path)
}

// restore loads the newest complete checkpoint of the run being resumed
// (every rank takes part): rank 0 finds it, reads its shared part, checks
// it against this run's configuration and broadcasts it; every rank then
// reads and checks its own part. Any problem on any rank is an error on
// every rank, and nothing is loaded unless every rank's part is good.
func (w *worker) restore(ctx context.Context) (position, error) {
	var raw []byte
	var rerr error
	if w.rank == 0 {
		raw, rerr = w.findCheckpoint()
	}
	st := comm.Int64s{0}
	if rerr != nil {
		st[0] = 1
		if errors.Is(rerr, ErrConfig) {
			st[0] = 2
		}
		raw = []byte(errString(rerr))
	}
	if err := w.communicator.Broadcast(ctx, st, 0); err != nil {
		return position{}, fmt.Errorf("resuming: %w", err)
	}
	raw, err := broadcastBytes(ctx, w.communicator, raw, 0)
	if err != nil {
		return position{}, fmt.Errorf("resuming: %w", err)
	}
	// From here to the agreement on every rank's part, every rank returns
	// the same errors at the same point (collective).
	switch st[0] {
	case 1:
		return position{}, collective(errors.New(string(raw)))
	case 2:
		return position{}, collective(fmt.Errorf("%w: %s", ErrConfig, strings.TrimPrefix(string(raw), ErrConfig.Error()+": ")))
	}
	ck, err := rundir.ParseCheckpoint[Config](raw, rundir.SharedFile)
	if err != nil {
		return position{}, collective(err)
	}
	dir := rundir.CheckpointDir(w.cfg.Out, ck.Step)
	modelState, perr := w.dataPath.loadShard(ck, dir)
	w.checkpoints.modelState = modelState
	flags := make(comm.Int64s, w.size)
	f := comm.Int64s{0}
	if perr != nil {
		f[0] = 1
	}
	if err := w.communicator.AllGather(ctx, f, flags); err != nil {
		return position{}, fmt.Errorf("resuming: %w", err)
	}
	for _, v := range flags {
		if v != 0 {
			msgs, err := gatherStrings(ctx, w.communicator, errString(perr))
			if err != nil {
				return position{}, err
			}
			var parts []string
			for r, v := range flags {
				if v != 0 {
					parts = append(parts, fmt.Sprintf("rank %d: %s", r, msgs[r]))
				}
			}
			return position{}, collective(fmt.Errorf("%w: the checkpoint %s cannot be resumed: %s; %s", ErrConfig, dir, strings.Join(parts, "; "), rundir.FallBack(w.cfg.Out, dir)))
		}
	}
	// Every part checks out: load the shared state (simulated workers
	// share it: rank 0 loads it, the others wait).
	if w.dataPath.opt != nil {
		copy(w.dataPath.hostParams, ck.Params)
		if err := w.dataPath.upload(w.dataPath.params, w.dataPath.hostParams); err != nil {
			return position{}, err
		}
		if err := w.dataPath.opt.SetState(ck.Opt, ck.OptSteps); err != nil {
			return position{}, fmt.Errorf("checkpoint %s: %w", dir, err)
		}
	}
	if sim := w.runner.sim; sim != nil {
		if err := sim.bar.wait(ctx); err != nil {
			return position{}, err
		}
	}
	w.checkpoints.lastDir, w.checkpoints.lastStep, w.checkpoints.prevStep = dir, ck.Step, -1
	w.runner.status.setCheckpoint(dir, ck.Step)
	// Parts of newer, incomplete checkpoints (a crash while writing) go.
	rundir.RemoveAfter(w.cfg.Out, ck.Step, w.rank, w.log)
	// The record continues from the checkpoint: metrics.jsonl loses what
	// was recorded after it, and the wall time goes on from the later of
	// the checkpoint's and the last kept record's.
	e := comm.Int64s{int64(ck.Elapsed), 0}
	if w.rank == 0 {
		if err := w.out.metrics.Check(ck.Step, maxLogEvery(w.cfg, w.runner.prev)); err != nil {
			return position{}, configError(err)
		}
		maxWall, evaluated, dropped, err := w.out.metrics.TruncateAfter(ck.Step, ck.EvalDue)
		if err != nil {
			return position{}, err
		}
		if dropped > 0 {
			w.log.Info("metrics.jsonl: records after the checkpoint removed", "records", dropped, "step", ck.Step)
		}
		e[0] = int64(max(ck.Elapsed, time.Duration(maxWall*float64(time.Second))))
		if evaluated {
			e[1] = 1
		}
	}
	if err := w.communicator.Broadcast(ctx, e, 0); err != nil {
		return position{}, fmt.Errorf("resuming: %w", err)
	}
	w.start = time.Now().Add(-time.Duration(e[0]))
	w.checkpoints.evaluated = e[1] == 1
	w.keep()
	if info := w.runInfo; info != nil && len(info.Resumes) > 0 {
		r := &info.Resumes[len(info.Resumes)-1]
		r.Step, r.Checkpoint = ck.Step, dir
		if err := rundir.WriteRun(w.cfg.Out, info); err != nil {
			return position{}, fmt.Errorf("writing run.json: %w", err)
		}
	}
	w.log.Info("resumed", "checkpoint", dir, "epoch", ck.Epoch+1, "batch", ck.Batch, "step", ck.Step)
	if w.rank == 0 && w.out != nil && !w.cfg.Quiet {
		fmt.Fprintf(w.out.console, "resuming from %s (step %d, epoch %d)\n", dir, ck.Step, ck.Epoch+1)
	}
	return position{epoch: ck.Epoch, batch: ck.Batch, step: ck.Step, evalDue: ck.EvalDue, evalEpoch: ck.EvalEpoch}, nil
}

// findCheckpoint (rank 0) returns the shared part of the newest complete
// checkpoint, checked against this run.
func (w *worker) findCheckpoint() ([]byte, error) {
	dir, raw, ck, err := rundir.ReadLatest[Config](w.cfg.Resume)
	if err != nil {
		return nil, configError(err)
	}
	if len(ck.Params) != len(w.dataPath.hostParams) {
		return nil, fmt.Errorf("%w: checkpoint %s holds %d parameters, the model has %d (another model or preset)", ErrConfig, dir, len(ck.Params), len(w.dataPath.hostParams))
	}
	diffs, err := checkpointMismatch(ck, w.cfg, w.size)
	if err != nil {
		return nil, err
	}
	if len(diffs) > 0 {
		return nil, fmt.Errorf("%w: checkpoint %s is of another configuration:\n  %s", ErrConfig, dir, strings.Join(diffs, "\n  "))
	}
	return raw, nil
}

// loadShard reads, checks and loads this rank's part of checkpoint ck in
// dir: the residual, the batch-norm statistics, the reducer's and the
// model's state, which it returns (nil for a model without). On an error
// nothing the run uses has changed except, possibly, the reducer's or
// model's state, and the run stops.
func (dp *dataPath) loadShard(ck *rundir.Checkpoint[Config], dir string) (modelState []byte, err error) {
	s, err := ck.ReadShard(dir, dp.rank)
	if err != nil {
		return nil, err
	}
	p := filepath.Join(dir, rundir.ShardFile(dp.rank))
	if len(s.Residual) != len(dp.hostResidual) {
		return nil, fmt.Errorf("%s holds a residual of %d values, the model has %d parameters", p, len(s.Residual), len(dp.hostResidual))
	}
	if nb := sumSizes(dp.model.BufferLayout()); len(s.Buffers) != nb {
		return nil, fmt.Errorf("%s holds %d batch-norm statistics, the model has %d", p, len(s.Buffers), nb)
	}
	if err := dp.reducer.SetState(s.Reducer); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if ms, ok := dp.model.(models.Stateful); ok {
		if err := ms.LoadState(s.Model); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		modelState = s.Model
	} else if len(s.Model) > 0 {
		return nil, fmt.Errorf("%s holds a model state, but %s keeps none", p, dp.cfg.Model)
	}
	if len(s.Buffers) > 0 {
		if err := dp.model.LoadBuffers(s.Buffers); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	copy(dp.hostResidual, s.Residual)
	return modelState, dp.upload(dp.residual, dp.hostResidual) // on a GPU
}

// configError makes a refusal of the run folder (rundir.ErrRefused) a
// configuration error (ErrConfig).
func configError(err error) error {
	if errors.Is(err, rundir.ErrRefused) {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return err
}

// errString is err's message ("" for nil).
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// broadcastBytes sends root's b to every rank and returns it there.
func broadcastBytes(ctx context.Context, c comm.Communicator, b []byte, root int) ([]byte, error) {
	n := comm.Int64s{int64(len(b))}
	if err := c.Broadcast(ctx, n, root); err != nil {
		return nil, err
	}
	if n[0] < 0 || n[0] > math.MaxInt32*4 {
		return nil, fmt.Errorf("broadcast of %d bytes", n[0])
	}
	buf := make(comm.Int32s, (n[0]+3)/4)
	raw := buf.Bytes()
	if c.Rank() == root {
		copy(raw, b)
	}
	if len(buf) > 0 {
		if err := c.Broadcast(ctx, buf, root); err != nil {
			return nil, err
		}
	}
	return raw[:n[0]], nil
}

// gatherStrings all-gathers every rank's s.
func gatherStrings(ctx context.Context, c comm.Communicator, s string) ([]string, error) {
	n := c.Size()
	lens := make(comm.Int64s, n)
	if err := c.AllGather(ctx, comm.Int64s{int64(len(s))}, lens); err != nil {
		return nil, err
	}
	counts := make([]int, n)
	total := 0
	for r, l := range lens {
		counts[r] = int((l + 3) / 4)
		total += counts[r]
	}
	send := make(comm.Int32s, counts[c.Rank()])
	copy(send.Bytes(), s)
	recv := make(comm.Int32s, total)
	if total > 0 {
		if err := c.AllGatherV(ctx, send, recv, counts); err != nil {
			return nil, err
		}
	}
	raw := recv.Bytes()
	out := make([]string, n)
	off := 0
	for r := range n {
		out[r] = string(raw[4*off : 4*off+int(lens[r])])
		off += counts[r]
	}
	return out, nil
}
