package netmodel

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// spinTail is how long before a deadline SleepUntil stops trusting the
// timer and spins. Go's timers wake up to about a millisecond late (the
// runtime's poller waits in whole milliseconds), more on a loaded machine,
// while modelled message times go down to tens of microseconds.
const spinTail = 2 * time.Millisecond

// SleepUntil waits until the wall clock reaches t, precisely: a timer for all
// but the last spinTail, then a spin that yields the processor. It returns
// early with an error wrapping ctx's error if ctx ends, or with abortErr()'s
// error if abort is closed first (abort and abortErr may be nil).
func SleepUntil(ctx context.Context, t time.Time, abort <-chan struct{}, abortErr func() error) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	if d > spinTail {
		timer := time.NewTimer(d - spinTail)
		select {
		case <-timer.C:
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
