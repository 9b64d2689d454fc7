package train

import (
	"strconv"
	"testing"
	"time"
)

// The schedule's rules, each on a small run: 3 epochs of 10 steps, log
// every 2, unless a case says otherwise.
func testSchedule() runSchedule {
	return runSchedule{epochs: 3, perEpoch: 10, logEvery: 2}
}

func TestScheduleAfterStep(t *testing.T) {
	none := done{eval: -1, checkpoint: -1}
	tests := []struct {
		name               string
		edit               func(*runSchedule)
		epoch, batch, step int
		did                done
		want               plan
	}{
		{"a step between logs", nil, 0, 2, 3, none, plan{}},
		{"-log-every", nil, 0, 3, 4, none, plan{log: true}},
		{"an epoch's last step is logged", nil, 1, 9, 19, none, plan{log: true}},
		{"the step that reaches -steps is logged", func(s *runSchedule) { s.maxSteps = 7 }, 0, 6, 7, none, plan{log: true}},
		{"-check-every", func(s *runSchedule) { s.checkEvery = 3 }, 0, 5, 6, none, plan{checkParams: true, log: true}},
		{"-check-every between its steps", func(s *runSchedule) { s.checkEvery = 4 }, 0, 5, 6, none, plan{log: true}},
		{"-eval-every", func(s *runSchedule) { s.evalEvery = 5 }, 0, 4, 5, none, plan{evaluate: true}},
		{"-eval-every skips an epoch's last step (the epoch's end evaluates)", func(s *runSchedule) { s.evalEvery = 5 }, 0, 9, 10, none, plan{log: true}},
		{"-eval-every skips the step that reaches -steps", func(s *runSchedule) { s.evalEvery = 5; s.maxSteps = 15 }, 1, 4, 15, none, plan{log: true}},
		{"-checkpoint-every between its steps", func(s *runSchedule) { s.checkpointEvery = 3 }, 1, 2, 13, none, plan{}},
		{"-checkpoint-every", func(s *runSchedule) { s.checkpointEvery = 4 }, 1, 1, 12, none,
			plan{log: true, checkpoint: true, at: position{epoch: 1, batch: 2, step: 12, evalEpoch: 1}}},
		{"-checkpoint-every with -eval-every: the checkpoint owes the evaluation", func(s *runSchedule) { s.checkpointEvery = 4; s.evalEvery = 6 }, 2, 3, 24, none,
			plan{log: true, checkpoint: true, at: position{epoch: 2, batch: 4, step: 24, evalDue: true, evalEpoch: 2}, evaluate: true}},
		{"-checkpoint-every skips an epoch's last step", func(s *runSchedule) { s.checkpointEvery = 5 }, 0, 9, 10, none, plan{log: true}},
		{"-checkpoint-every skips the step that reaches -steps", func(s *runSchedule) { s.checkpointEvery = 5; s.maxSteps = 15 }, 1, 4, 15, none, plan{log: true}},
		{"resumed mid-epoch: steps count from the checkpoint's", func(s *runSchedule) { s.checkpointEvery = 4; s.evalEvery = 4 }, 1, 7, 16, done{eval: 12, checkpoint: 12},
			plan{log: true, checkpoint: true, at: position{epoch: 1, batch: 8, step: 16, evalDue: true, evalEpoch: 1}, evaluate: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSchedule()
			if tt.edit != nil {
				tt.edit(&s)
			}
			if got := s.afterStep(tt.epoch, tt.batch, tt.step, tt.did); got != tt.want {
				t.Errorf("afterStep(epoch %d, batch %d, step %d, %+v) = %+v, want %+v", tt.epoch, tt.batch, tt.step, tt.did, got, tt.want)
			}
		})
	}
}

func TestScheduleEndOfEpoch(t *testing.T) {
	tests := []struct {
		name        string
		maxSteps    int
		epoch, step int
		did         done
		want        plan
	}{
		{"an epoch: a checkpoint at the next epoch's start owing the evaluation, then the evaluation", 0, 0, 10, done{-1, -1},
			plan{checkpoint: true, at: position{epoch: 1, batch: 0, step: 10, evalDue: true, evalEpoch: 0}, evaluate: true}},
		{"the last epoch ends the run", 0, 2, 30, done{20, 20},
			plan{checkpoint: true, at: position{epoch: 3, batch: 0, step: 30, evalDue: true, evalEpoch: 2}, evaluate: true, stop: stopEpochs}},
		{"-steps reached at an epoch's end", 20, 1, 20, done{10, 10},
			plan{checkpoint: true, at: position{epoch: 2, batch: 0, step: 20, evalDue: true, evalEpoch: 1}, evaluate: true, stop: stopMaxSteps}},
		{"-steps beyond the epoch", 25, 1, 20, done{10, 10},
			plan{checkpoint: true, at: position{epoch: 2, batch: 0, step: 20, evalDue: true, evalEpoch: 1}, evaluate: true}},
		{"a resumed epoch of one step", 0, 1, 20, done{19, 19},
			plan{checkpoint: true, at: position{epoch: 2, batch: 0, step: 20, evalDue: true, evalEpoch: 1}, evaluate: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSchedule()
			s.maxSteps = tt.maxSteps
			if got := s.endOfEpoch(tt.epoch, tt.step, tt.did); got != tt.want {
				t.Errorf("endOfEpoch(epoch %d, step %d, %+v) = %+v, want %+v", tt.epoch, tt.step, tt.did, got, tt.want)
			}
		})
	}
}

func TestScheduleBeforeStep(t *testing.T) {
	here := position{epoch: 1, batch: 4, step: 14}
	tests := []struct {
		name          string
		maxSteps      int
		here          position
		did           done
		timeUp, asked bool
		want          plan
	}{
		{"nothing stops the run", 0, here, done{10, 10}, false, false, plan{}},
		{"-steps not yet", 15, here, done{10, 10}, false, false, plan{}},
		{"-steps reached: a checkpoint owing the evaluation, then the evaluation", 14, here, done{10, 10}, false, false,
			plan{checkpoint: true, at: position{epoch: 1, batch: 4, step: 14, evalDue: true, evalEpoch: 1}, evaluate: true, stop: stopMaxSteps}},
		{"-max-time: likewise", 0, here, done{10, 10}, true, false,
			plan{checkpoint: true, at: position{epoch: 1, batch: 4, step: 14, evalDue: true, evalEpoch: 1}, evaluate: true, stop: stopMaxTime}},
		{"-max-time after an evaluation and checkpoint of this step: nothing to redo", 0, here, done{14, 14}, true, false,
			plan{at: here, stop: stopMaxTime}},
		{"-max-time after -eval-every's evaluation of this step: the checkpoint owes nothing", 0, here, done{14, 10}, true, false,
			plan{checkpoint: true, at: here, stop: stopMaxTime}},
		{"-max-time after a checkpoint owing the evaluation: the evaluation", 0, here, done{10, 14}, true, false,
			plan{at: position{epoch: 1, batch: 4, step: 14, evalDue: true, evalEpoch: 1}, evaluate: true, stop: stopMaxTime}},
		{"-max-time at an epoch's start, after its end's checkpoint and evaluation", 0, position{epoch: 2, step: 20}, done{20, 20}, true, false,
			plan{at: position{epoch: 2, step: 20}, stop: stopMaxTime}},
		{"-steps and -max-time: -steps is the reason", 14, here, done{10, 10}, true, false,
			plan{checkpoint: true, at: position{epoch: 1, batch: 4, step: 14, evalDue: true, evalEpoch: 1}, evaluate: true, stop: stopMaxSteps}},
		{"a stop asked for: a checkpoint, no evaluation", 0, here, done{10, 10}, false, true,
			plan{checkpoint: true, at: here, stop: stopAsked}},
		{"a stop asked for after this step's checkpoint", 0, here, done{10, 14}, false, true,
			plan{at: here, stop: stopAsked}},
		{"a stop asked for wins over -max-time and -steps", 14, here, done{10, 10}, true, true,
			plan{checkpoint: true, at: here, stop: stopAsked}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSchedule()
			s.maxSteps = tt.maxSteps
			if got := s.beforeStep(tt.here, tt.did, tt.timeUp, tt.asked); got != tt.want {
				t.Errorf("beforeStep(%+v, %+v, timeUp %v, asked %v) = %+v, want %+v", tt.here, tt.did, tt.timeUp, tt.asked, got, tt.want)
			}
		})
	}
}

func TestScheduleAtStart(t *testing.T) {
	tests := []struct {
		name      string
		maxSteps  int
		pos       position
		resumed   bool
		evaluated bool
		want      plan
		wantDone  done
	}{
		{"a new run", 0, position{}, false, false, plan{}, done{-1, -1}},
		{"resumed mid-epoch", 0, position{epoch: 1, batch: 3, step: 13}, true, false, plan{}, done{-1, 13}},
		{"resumed mid-epoch owing an evaluation: it comes first", 0, position{epoch: 1, batch: 3, step: 13, evalDue: true, evalEpoch: 1}, true, false,
			plan{evaluate: true}, done{-1, 13}},
		{"resumed at the end of a run that evaluated", 0, position{epoch: 1, batch: 3, step: 13}, true, true, plan{}, done{13, 13}},
		{"resumed at an epoch's start owing its evaluation", 0, position{epoch: 2, step: 20, evalDue: true, evalEpoch: 1}, true, false,
			plan{evaluate: true}, done{-1, 20}},
		{"resumed after the last epoch: the evaluation, then the end", 0, position{epoch: 3, step: 30, evalDue: true, evalEpoch: 2}, true, false,
			plan{evaluate: true, stop: stopEpochs}, done{-1, 30}},
		{"resumed at -steps", 13, position{epoch: 1, batch: 3, step: 13}, true, true, plan{stop: stopMaxSteps}, done{13, 13}},
		{"resumed beyond -steps (a smaller -steps)", 10, position{epoch: 1, batch: 3, step: 13}, true, true, plan{stop: stopMaxSteps}, done{13, 13}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSchedule()
			s.maxSteps = tt.maxSteps
			got, gotDone := s.atStart(tt.pos, tt.resumed, tt.evaluated)
			if got != tt.want || gotDone != tt.wantDone {
				t.Errorf("atStart(%+v, resumed %v, evaluated %v) = %+v, %+v, want %+v, %+v", tt.pos, tt.resumed, tt.evaluated, got, gotDone, tt.want, tt.wantDone)
			}
		})
	}
}

// A whole run, step by step: where it checkpoints, evaluates and stops.
func TestScheduleWholeRun(t *testing.T) {
	tests := []struct {
		name                string
		s                   runSchedule
		timeUpAt            int // the step before which -max-time is up (0: never)
		ckpts, evals, stops string
	}{
		{"2 epochs of 3", runSchedule{epochs: 2, perEpoch: 3, logEvery: 1}, 0,
			"3 6", "3 6", "-epochs done at 6"},
		{"-eval-every 2 and -checkpoint-every 2", runSchedule{epochs: 2, perEpoch: 3, logEvery: 1, evalEvery: 2, checkpointEvery: 2}, 0,
			"2 3 4 6", "2 3 4 6", "-epochs done at 6"},
		{"-steps 4", runSchedule{epochs: 2, perEpoch: 3, logEvery: 1, maxSteps: 4}, 0,
			"3 4", "3 4", "-steps reached at 4"},
		{"-steps 3 at an epoch's end", runSchedule{epochs: 2, perEpoch: 3, logEvery: 1, maxSteps: 3}, 0,
			"3", "3", "-steps reached at 3"},
		{"-max-time before step 5", runSchedule{epochs: 2, perEpoch: 3, logEvery: 1, evalEvery: 4}, 5,
			"3 4", "3 4", "-max-time reached at 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ckpts, evals []int
			stop := ""
			p, did := tt.s.atStart(position{}, false, false)
			follow := func(p plan, step int) {
				if p.checkpoint {
					ckpts = append(ckpts, p.at.step)
					did.checkpoint = p.at.step
				}
				if p.evaluate {
					evals = append(evals, step)
					did.eval = step
				}
				if p.stop != goOn {
					stop = p.stop.String() + " at " + strconv.Itoa(step)
				}
			}
			follow(p, 0)
			step := 0
		run:
			for epoch := 0; stop == ""; epoch++ {
				for b := range tt.s.perEpoch {
					p := tt.s.beforeStep(position{epoch: epoch, batch: b, step: step}, did, tt.timeUpAt > 0 && step+1 >= tt.timeUpAt, false)
					if follow(p, step); stop != "" {
						break run
					}
					step++
					follow(tt.s.afterStep(epoch, b, step, did), step)
				}
				follow(tt.s.endOfEpoch(epoch, step, did), step)
			}
			if got := joinInts(ckpts); got != tt.ckpts {
				t.Errorf("checkpoints at steps %q, want %q", got, tt.ckpts)
			}
			if got := joinInts(evals); got != tt.evals {
				t.Errorf("evaluations at steps %q, want %q", got, tt.evals)
			}
			if stop != tt.stops {
				t.Errorf("stop: %q, want %q", stop, tt.stops)
			}
		})
	}
}

func joinInts(v []int) string {
	s := ""
	for i, n := range v {
		if i > 0 {
			s += " "
		}
		s += strconv.Itoa(n)
	}
	return s
}

func TestScheduleMaxTime(t *testing.T) {
	const s = time.Second
	t.Run("timeIsUp", func(t *testing.T) {
		tests := []struct {
			maxTime, elapsed, reserve time.Duration
			want                      bool
		}{
			{0, 100 * s, 0, false}, // no limit
			{60 * s, 50 * s, 5 * s, false},
			{60 * s, 55 * s, 5 * s, true}, // the reserve reaches the limit
			{60 * s, 61 * s, 0, true},
		}
		for _, tt := range tests {
			if got := timeIsUp(tt.maxTime, tt.elapsed, tt.reserve); got != tt.want {
				t.Errorf("timeIsUp(%v, %v, %v) = %v, want %v", tt.maxTime, tt.elapsed, tt.reserve, got, tt.want)
			}
		}
	})
	t.Run("evalReserve", func(t *testing.T) {
		tests := []struct {
			name                               string
			maxTime, perBatch, stepTime        time.Duration
			evalBatches, evalBatch, trainBatch int
			want                               time.Duration
		}{
			{"the last evaluation's time per batch", 600 * s, 100 * time.Millisecond, 9 * s, 20, 64, 32, 2 * s},
			{"before any: a third of a step per sample", 600 * s, 0, 300 * time.Millisecond, 20, 64, 32, 4 * s},
			{"at most a tenth of -max-time", 30 * s, 0, 300 * time.Millisecond, 20, 64, 32, 3 * s},
			{"before any step", 600 * s, 0, 0, 20, 64, 32, 0},
		}
		for _, tt := range tests {
			if got := evalReserve(tt.maxTime, tt.perBatch, tt.stepTime, tt.evalBatches, tt.evalBatch, tt.trainBatch); got != tt.want {
				t.Errorf("%s: evalReserve = %v, want %v", tt.name, got, tt.want)
			}
		}
	})
	t.Run("evalCut", func(t *testing.T) {
		tests := []struct {
			maxTime, elapsed time.Duration
			want             bool
		}{
			{0, 1000 * s, false}, // no limit: the whole split
			{60 * s, 59 * s, false},
			{60 * s, 60 * s, true}, // the final evaluation samples its split
			{60 * s, 70 * s, true},
		}
		for _, tt := range tests {
			if got := evalCut(tt.maxTime, tt.elapsed); got != tt.want {
				t.Errorf("evalCut(%v, %v) = %v, want %v", tt.maxTime, tt.elapsed, got, tt.want)
			}
		}
	})
}
