package train

import (
	"fmt"
	"time"

	"github.com/sparsegrad/sparsegrad/rundir"
)

// checkNotComplete refuses the resume of a run that has nothing left to do
// under c (the resumed configuration, defaults applied): its newest
// checkpoint is at its -steps, after its last epoch, or past its -max-time,
// and the evaluation there is recorded. Such a resume used to print
// "resuming from", evaluate again and stop, as if it had trained; the error
// says what ended the run and which flag trains it further. prog is how the
// person ran train (for the example command). Whatever stops a resume
// otherwise (no checkpoint, a damaged one) is left to the resume itself,
// which names it.
func checkNotComplete(c Config, prog string) error {
	dir, err := rundir.Latest(c.Resume)
	if err != nil {
		return nil
	}
	ck, err := rundir.ReadCheckpoint[Config](dir)
	if err != nil {
		return nil
	}
	epochs := c.Epochs.Value()
	var done, further string
	switch {
	case c.Steps > 0 && ck.Step >= c.Steps:
		done = fmt.Sprintf("it has trained its -steps %d", c.Steps)
		further = fmt.Sprintf("give a larger -steps (e.g. %s -resume %s -steps %d), or -steps 0 to train to the end of its %d epochs", prog, c.Resume, 2*c.Steps, epochs)
	case ck.Epoch >= epochs:
		done = fmt.Sprintf("it has trained its %d epochs (step %d)", epochs, ck.Step)
		further = fmt.Sprintf("give a larger -epochs (e.g. %s -resume %s -epochs %d)", prog, c.Resume, 2*epochs)
	case c.MaxTime > 0 && ck.Elapsed >= c.MaxTime:
		done = fmt.Sprintf("it has used up its -max-time %v (it trained %v, to step %d)", c.MaxTime, ck.Elapsed.Round(time.Second), ck.Step)
		further = fmt.Sprintf("give a larger -max-time, which counts the time already trained (e.g. %s -resume %s -max-time %v), or -max-time 0 for no limit", prog, c.Resume, 2*c.MaxTime)
	default:
		return nil
	}
	if !rundir.EvaluatedAt(c.Resume, ck.Step) {
		return nil // its final evaluation was cut short: the resume does it
	}
	if c.LRSchedule == "onecycle" && c.MaxTime == 0 {
		further = "its one-cycle schedule ended with it, so it cannot be made longer: start a new run with -out and a larger -epochs or -steps"
	}
	return fmt.Errorf("%w: -resume %s: the run is complete, nothing to continue: %s; to train further, %s", ErrConfig, c.Resume, done, further)
}

// progOf is how the person ran train, from Options.CommandLine ("train"
// when not given).
func progOf(o Options) string {
	if len(o.CommandLine) > 0 {
		return o.CommandLine[0]
	}
	return "train"
}
