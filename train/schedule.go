package train

import "time"

// This file decides what happens between two training steps: whether to
// log the step, compare the ranks' parameters, write a checkpoint,
// evaluate, and whether and why the run stops. The decisions are pure
// functions of the configuration and the run's counters (tested in
// schedule_test.go); the worker's loop (worker.go) carries them out, and
// the data path (datapath.go) runs the steps themselves.
//
// A run goes: atStart (a resumed run may owe an evaluation); then, for
// every batch, beforeStep (with the ranks' agreed time-up and stop flags),
// the step, afterStep; and after an epoch's last batch endOfEpoch.

// runSchedule is the part of a run's configuration that decides what
// happens between steps (the learning rate's schedule is Schedule).
type runSchedule struct {
	epochs          int // Config.Epochs
	perEpoch        int // steps (batches) of an epoch
	maxSteps        int // Config.Steps (0: no limit)
	logEvery        int // Config.LogEvery
	evalEvery       int // Config.EvalEvery (0: at the end of every epoch only)
	checkpointEvery int // Config.CheckpointEvery (0: at the end of every epoch only)
	checkEvery      int // Config.CheckEvery (0: the parameters are compared at checkpoints only)
}

func newRunSchedule(cfg Config, perEpoch int) runSchedule {
	return runSchedule{
		epochs: cfg.Epochs.Value(), perEpoch: perEpoch, maxSteps: cfg.Steps,
		logEvery: cfg.LogEvery.Value(), evalEvery: cfg.EvalEvery,
		checkpointEvery: cfg.CheckpointEvery, checkEvery: cfg.CheckEvery,
	}
}

// totalSteps is the run's length in steps when -max-time does not cut it
// short: -epochs, or -steps when it ends the run earlier.
func (s runSchedule) totalSteps() int {
	total := s.epochs * s.perEpoch
	if s.maxSteps > 0 {
		total = min(total, s.maxSteps)
	}
	return total
}

// stepsReached reports whether -steps ends the run after step steps.
func (s runSchedule) stepsReached(step int) bool {
	return s.maxSteps > 0 && step >= s.maxSteps
}

// stopReason says whether the run stops, and why.
type stopReason int

const (
	goOn         stopReason = iota
	stopAsked               // Options.Stop or a signal: a checkpoint, then ErrInterrupted
	stopMaxSteps            // -steps reached
	stopMaxTime             // -max-time reached, less the final evaluation's reserve
	stopEpochs              // the last epoch is done
)

func (r stopReason) String() string {
	return [...]string{"go on", "stop asked", "-steps reached", "-max-time reached", "-epochs done"}[r]
}

// done is what the run has done so far: the steps of its last evaluation
// and of its last checkpoint (-1: none).
type done struct {
	eval, checkpoint int
}

// plan is what the loop does at one point between steps, in this order:
// compare the ranks' parameters, log the step, write a checkpoint of
// position at, evaluate, stop.
type plan struct {
	checkParams bool
	log         bool
	checkpoint  bool
	at          position // the checkpoint's position (when checkpoint)
	evaluate    bool
	stop        stopReason
}

// atStart is the plan before the first step of a run that starts at pos
// (resumed: from a checkpoint there, with an evaluation at pos.step in
// metrics.jsonl when evaluated), and what the run has done at that point.
// A checkpoint written before its evaluation owes the evaluation, which
// comes first; a resumed run whose -epochs or -steps are done stops.
func (s runSchedule) atStart(pos position, resumed, evaluated bool) (plan, done) {
	d := done{eval: -1, checkpoint: -1}
	if resumed {
		d.checkpoint = pos.step
		if evaluated {
			d.eval = pos.step
		}
	}
	p := plan{evaluate: pos.evalDue}
	switch {
	case pos.epoch >= s.epochs:
		p.stop = stopEpochs
	case s.stepsReached(pos.step):
		p.stop = stopMaxSteps
	}
	return p, d
}

// beforeStep is the plan before the step at position here, with the flags
// every rank agreed on: rank 0's -max-time is up (timeUp), a stop was asked
// for. A stop asked for writes a checkpoint (unless one of this step
// exists) and ends the run interrupted. -steps or -max-time reached write
// a checkpoint and then evaluate, unless already done at this step: the
// checkpoint comes first, so that an interrupted evaluation loses no step
// (a resumed run redoes it: evalDue).
func (s runSchedule) beforeStep(here position, d done, timeUp, stopRequested bool) plan {
	var p plan
	switch {
	case stopRequested:
		p.stop = stopAsked
	case s.stepsReached(here.step):
		p.stop = stopMaxSteps
	case timeUp:
		p.stop = stopMaxTime
	default:
		return p
	}
	p.at = here
	if p.stop != stopAsked && d.eval != here.step {
		p.evaluate = true
		p.at.evalDue, p.at.evalEpoch = true, here.epoch
	}
	p.checkpoint = d.checkpoint != here.step
	return p
}

// afterStep is the plan after the step of batch of epoch, the run's step
// step. The last step of an epoch and the step that reaches -steps are
// always logged, and -eval-every and -checkpoint-every skip them (the end
// of the epoch or the run evaluates and checkpoints them). A checkpoint
// comes before the evaluation, which a run resumed from it then redoes.
func (s runSchedule) afterStep(epoch, batch, step int, d done) plan {
	last := batch == s.perEpoch-1 || step == s.maxSteps
	p := plan{
		checkParams: s.checkEvery > 0 && step%s.checkEvery == 0,
		log:         step%s.logEvery == 0 || last,
		evaluate:    s.evalEvery > 0 && step%s.evalEvery == 0 && !last,
	}
	if s.checkpointEvery > 0 && step%s.checkpointEvery == 0 && !last && d.checkpoint != step {
		p.checkpoint = true
		p.at = position{epoch: epoch, batch: batch + 1, step: step, evalDue: p.evaluate, evalEpoch: epoch}
	}
	return p
}

// endOfEpoch is the plan after the last batch of epoch, at step step: a
// checkpoint at the start of the next epoch that owes this epoch's
// evaluation, then the evaluation; the run stops after the last epoch or
// when -steps is reached.
func (s runSchedule) endOfEpoch(epoch, step int, d done) plan {
	p := plan{
		checkpoint: d.checkpoint != step,
		at:         position{epoch: epoch + 1, batch: 0, step: step, evalDue: true, evalEpoch: epoch},
		evaluate:   true,
	}
	switch {
	case epoch+1 >= s.epochs:
		p.stop = stopEpochs
	case s.stepsReached(step):
		p.stop = stopMaxSteps
	}
	return p
}

// timeIsUp is rank 0's part of the decision to stop for -max-time before a
// step: whether the time since the run started (elapsed) and the time kept
// for the final evaluation (reserve, see evalReserve) reach maxTime (0: no
// limit).
func timeIsUp(maxTime, elapsed, reserve time.Duration) bool {
	return maxTime > 0 && elapsed+reserve >= maxTime
}

// evalReserve is the time -max-time keeps for the final evaluation:
// training stops that long before the limit. It is the evaluation's
// estimated duration, evalBatches batches at the last evaluation's time
// per batch (perBatch) or, before any, at a third of the last training
// step's time (stepTime) per sample (a forward pass only) for batches of
// evalBatch samples against trainBatch; and at most a tenth of maxTime. An
// evaluation that takes longer is cut short (evalCut).
func evalReserve(maxTime, perBatch, stepTime time.Duration, evalBatches, evalBatch, trainBatch int) time.Duration {
	if perBatch == 0 {
		perBatch = time.Duration(float64(stepTime) * float64(evalBatch) / float64(3*trainBatch))
	}
	return min(perBatch*time.Duration(evalBatches), maxTime/10)
}

// evalCut reports whether an evaluation under -max-time (maxTime, 0: no
// limit) stops after a batch that ended elapsed after the run's start: the
// evaluation is then recorded as a sample of its split, so that -max-time
// bounds the whole run (every rank evaluates at least one batch).
func evalCut(maxTime, elapsed time.Duration) bool {
	return maxTime > 0 && elapsed >= maxTime
}
