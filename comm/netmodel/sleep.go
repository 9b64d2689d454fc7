package netmodel

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
)

// Go's timers wake up late: up to about a millisecond when the process is
// idle (the runtime's poller sleeps in whole milliseconds), much less when it
// is busy, more on a loaded machine. SleepUntil therefore sleeps on a timer
// only until a tail before the deadline and spins through the tail. The tail
// adapts to the lateness observed: twice its running average, within
// [minTail, maxTail], so a busy process (whose timers are punctual) does not
// burn a core spinning for milliseconds.
const (
	minTail = 100 * time.Microsecond
	maxTail = 3 * time.Millisecond
)

// lateness is the running average (1/8 weight per observation) of how late
// SleepUntil's timers fired, in nanoseconds.
var lateness atomic.Int64

func init() { lateness.Store(int64(time.Millisecond)) }

func spinTail() time.Duration {
	return min(max(2*time.Duration(lateness.Load()), minTail), maxTail)
}

// SleepUntil waits until the wall clock reaches t, precisely: a timer for all
// but a short tail (see above), then a spin that yields the processor. It
// returns early with an error wrapping ctx's error if ctx ends, or with
// abortErr()'s error if abort is closed first (abort and abortErr may be nil).
func SleepUntil(ctx context.Context, t time.Time, abort <-chan struct{}, abortErr func() error) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	if tail := spinTail(); d > tail {
		wake := t.Add(-tail)
		timer := time.NewTimer(d - tail)
		select {
		case <-timer.C:
			late := int64(time.Since(wake))
			old := lateness.Load()
			lateness.CompareAndSwap(old, old+(late-old)/8)
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("netmodel: emulated network delay: %w", ctx.Err())
		case <-abort:
			timer.Stop()
			return abortErr()
		}
	}
	for time.Now().Before(t) {
		runtime.Gosched()
	}
	return nil
}
