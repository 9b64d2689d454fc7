package local

import (
	"context"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

// p2pReady is when a message of buf sent at start has arrived on the emulated
// network; the zero time without emulation.
func (w *World) p2pReady(start time.Time, buf comm.Buffer) time.Time {
	return time.Time{}
}

// sleepUntil waits until t (precisely), the world is aborted or ctx ends.
func (w *World) sleepUntil(ctx context.Context, t time.Time) error {
	return nil
}
