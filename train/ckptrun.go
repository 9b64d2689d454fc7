package train

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/models"
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

// keep marks the run as worth keeping (worker.kept) and writes its log
// from now on; a log that cannot be written is a warning.
func (w *worker) keep() {
	if w.kept {
		return
	}
	w.kept = true
	w.runner.kept.Store(true)
	if err := w.runLog.keep(); err != nil && w.out != nil {
		w.out.warn("no log", err)
	}
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

// errNonFinite is wrapped by the errors of a NaN or infinite loss,
// gradient, parameter or state.
var errNonFinite = errors.New("not finite")

// firstNonFinite returns the index of the first NaN or ±Inf in v, or -1.
func firstNonFinite(v []float32) int {
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return i
		}
	}
	return -1
}

// tensorAt names the layout tensor holding flat element i: its name and
// the element's index within it.
func (dp *dataPath) tensorAt(i int) (string, int) {
	for _, t := range dp.layout.Tensors {
		if i < t.Offset+t.Size {
			return t.Name, i - t.Offset
		}
	}
	return "?", i
}

// nonFinite is the error for v[i] (a vector in layout order) not being
// finite.
func (dp *dataPath) nonFinite(what string, v []float32, i int) error {
	name, j := dp.tensorAt(i)
	return fmt.Errorf("%w: the %s is %v in tensor %s (element %d of it)", errNonFinite, what, v[i], name, j)
}

// paramHash is a CRC-32C of the parameters' bits (host view, downloaded).
func (dp *dataPath) paramHash() (uint32, error) {
	if err := dp.download(dp.hostParams, dp.params); err != nil {
		return 0, err
	}
	// In pieces: many workers of one process hash at once.
	h := crc32.New(castagnoli)
	if err := writeF32(h, dp.hostParams); err != nil {
		return 0, err
	}
	return h.Sum32(), nil
}

// shard collects this rank's part of a checkpoint.
func (dp *dataPath) shard(step int) (*Shard, error) {
	if err := dp.download(dp.hostResidual, dp.residual); err != nil { // on a GPU
		return nil, err
	}
	red, err := dp.reducer.State()
	if err != nil {
		return nil, fmt.Errorf("train: the reducer's state: %w", err)
	}
	s := &Shard{Rank: dp.rank, Workers: dp.size, Step: step, Residual: dp.hostResidual, Reducer: red}
	if i := firstNonFinite(s.Residual); i >= 0 {
		return nil, dp.nonFinite("error-feedback residual", s.Residual, i)
	}
	if nb := sumSizes(dp.model.BufferLayout()); nb > 0 {
		s.Buffers = make([]float32, nb)
		if err := dp.model.StoreBuffers(s.Buffers); err != nil {
			return nil, err
		}
		if i := firstNonFinite(s.Buffers); i >= 0 {
			name := "?"
			for _, b := range dp.model.BufferLayout() {
				if i < b.Offset+b.Size {
					name = b.Name
					break
				}
			}
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
	dir := stepDir(w.cfg.Out, p.step)
	part := filepath.Join(dir, shardName(w.rank))
	var info ShardInfo
	var werr error
	fatal := false
	s, err := w.dataPath.shard(p.step)
	if err != nil {
		werr, fatal = err, true
	} else {
		names, data := shardSections(s)
		var f *ckptFile
		if f, werr = layoutFile("rank", s, names, data); werr == nil {
			if werr = os.MkdirAll(dir, 0o755); werr == nil {
				info, werr = writeCkptFile(part, f)
			}
		}
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
		os.Remove(part)
		os.Remove(dir) // only if empty
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
		os.Remove(part)
		os.Remove(dir)
		return collective(err)
	}
	// Every part is written: rank 0 completes the checkpoint.
	var serr error
	if w.rank == 0 {
		serr = w.writeShared(ctx, p, dir, all)
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
		os.Remove(part)
		os.Remove(dir)
		return collective(&ckptError{step: p.step, prev: w.checkpoints.lastDir, prevStep: w.checkpoints.lastStep, msg: "rank 0: " + string(m), err: serr})
	}
	prevStep := w.checkpoints.lastStep
	w.checkpoints.lastDir, w.checkpoints.prevStep, w.checkpoints.lastStep = dir, prevStep, p.step
	w.keep()
	w.runner.status.setCheckpoint(dir, p.step)
	w.log.Info("checkpoint written", "dir", dir, "step", p.step)
	w.prune(prevStep)
	return nil
}

// writeShared writes shared.ckpt (rank 0), after syncing metrics.jsonl so
// that the records up to the checkpoint survive a crash with it.
func (w *worker) writeShared(ctx context.Context, p position, dir string, all comm.Int64s) error {
	if err := w.out.sync(); err != nil {
		return fmt.Errorf("syncing metrics.jsonl: %w", err)
	}
	ck := &Checkpoint{Config: w.cfg, Workers: w.size, Epoch: p.epoch, Batch: p.batch, Step: p.step,
		EvalDue: p.evalDue, EvalEpoch: p.evalEpoch, Elapsed: time.Since(w.start), Written: time.Now().UTC(),
		Params: w.dataPath.hostParams}
	ck.Config.Resume = ""
	var err error
	if ck.Opt, ck.OptSteps, err = w.dataPath.opt.State(); err != nil {
		return err
	}
	for r := range w.size {
		ck.Shards = append(ck.Shards, ShardInfo{Bytes: all[4*r+1], CRC: uint32(all[4*r+2])})
	}
	names, data := sharedSections(ck)
	f, err := layoutFile("shared", ck, names, data)
	if err != nil {
		return err
	}
	_, err = writeCkptFile(filepath.Join(dir, ckptSharedName), f)
	return err
}

// prune removes this rank's files of the checkpoints older than keep (the
// one before the newest; the newest two stay); rank 0 first removes
// their shared parts, so they are never taken for complete. Failures are
// logged, not returned.
func (w *worker) prune(keep int) {
	if keep < 0 {
		return
	}
	steps, err := checkpointSteps(w.cfg.Out)
	if err != nil {
		w.log.Warn("listing old checkpoints", "err", err)
		return
	}
	for _, s := range steps {
		if s >= keep {
			continue
		}
		w.removeCheckpoint(s)
	}
}

// removeCheckpoint removes this rank's files of the checkpoint at step
// (rank 0: the shared part first, then the folder).
func (w *worker) removeCheckpoint(step int) {
	d := stepDir(w.cfg.Out, step)
	if w.rank == 0 {
		if err := os.Remove(filepath.Join(d, ckptSharedName)); err != nil && !errors.Is(err, os.ErrNotExist) {
			w.log.Warn("removing an old checkpoint", "err", err)
			return
		}
	}
	os.Remove(filepath.Join(d, shardName(w.rank)))
	if w.rank == 0 {
		os.RemoveAll(d)
	} else {
		os.Remove(d)
	}
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
	ck, err := parseShared(raw, ckptSharedName)
	if err != nil {
		return position{}, collective(err)
	}
	dir := stepDir(w.cfg.Out, ck.Step)
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
			return position{}, collective(fmt.Errorf("%w: the checkpoint %s cannot be resumed: %s; %s", ErrConfig, dir, strings.Join(parts, "; "), fallBack(w.cfg.Out, dir)))
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
	if steps, err := checkpointSteps(w.cfg.Out); err == nil {
		for _, s := range steps {
			if s > ck.Step {
				w.removeCheckpoint(s)
			}
		}
	}
	// The record continues from the checkpoint: metrics.jsonl loses what
	// was recorded after it, and the wall time goes on from the later of
	// the checkpoint's and the last kept record's.
	e := comm.Int64s{int64(ck.Elapsed), 0}
	if w.rank == 0 {
		maxWall, evaluated, err := w.out.truncateAfter(ck.Step, ck.EvalDue)
		if err != nil {
			return position{}, err
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
		if err := writeJSONAtomic(filepath.Join(w.cfg.Out, "run.json"), info); err != nil {
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
	dir, err := LatestCheckpoint(w.cfg.Resume)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if old, _ := filepath.Glob(filepath.Join(w.cfg.Resume, "checkpoints", "step-*.ckpt")); len(old) > 0 {
				return nil, fmt.Errorf("%w: -resume %s: its checkpoints (%s, ...) are of an older version that kept only rank 0's parameters and optimizer state; they cannot continue the run exactly: start it again with -out", ErrConfig, w.cfg.Resume, filepath.Base(old[0]))
			}
			return nil, fmt.Errorf("%w: -resume %s: the run has no complete checkpoint to continue from (it stopped before its first one); start it again with -out", ErrConfig, w.cfg.Resume)
		}
		return nil, err
	}
	p := filepath.Join(dir, ckptSharedName)
	raw, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("reading checkpoint: %w", err)
	}
	ck, err := parseShared(raw, p)
	if err != nil {
		return nil, fmt.Errorf("%w: %v; %s", ErrConfig, err, fallBack(w.cfg.Resume, dir))
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

// fallBack says how to resume runDir when its checkpoint in folder bad,
// the newest complete one, cannot be used: from the complete one before it,
// if there is one (on this machine).
func fallBack(runDir, bad string) string {
	steps, _ := checkpointSteps(runDir)
	seen := false
	for _, s := range steps { // newest first
		d := stepDir(runDir, s)
		if !seen {
			seen = d == bad
			continue
		}
		if _, err := os.Stat(filepath.Join(d, ckptSharedName)); err == nil {
			return fmt.Sprintf("move %s away to resume from the one before it, %s (step %d)", bad, d, s)
		}
	}
	return "there is no earlier complete checkpoint: start the run again with another -out"
}

// loadShard reads, checks and loads this rank's part of checkpoint ck in
// dir: the residual, the batch-norm statistics, the reducer's and the
// model's state, which it returns (nil for a model without). On an error nothing the run uses has changed except,
// possibly, the reducer's or model's state, and the run stops.
func (dp *dataPath) loadShard(ck *Checkpoint, dir string) (modelState []byte, err error) {
	p := filepath.Join(dir, shardName(dp.rank))
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("reading this rank's part: %w", err)
	}
	if want := ck.Shards[dp.rank]; int64(len(b)) != want.Bytes || crc32.Checksum(b, castagnoli) != want.CRC {
		return nil, fmt.Errorf("%s is not the part the checkpoint lists (%d bytes, CRC-32C %08x; the checkpoint says %d bytes, %08x): it is of another checkpoint, or damaged", p, len(b), crc32.Checksum(b, castagnoli), want.Bytes, want.CRC)
	}
	s, err := parseShard(b, p)
	if err != nil {
		return nil, err
	}
	if s.Rank != dp.rank || s.Workers != dp.size || s.Step != ck.Step {
		return nil, fmt.Errorf("%s is rank %d of %d at step %d, not rank %d of %d at step %d", p, s.Rank, s.Workers, s.Step, dp.rank, dp.size, ck.Step)
	}
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
