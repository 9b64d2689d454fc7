package local

import (
	"context"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
)

// p2pReady is when a message of buf sent at start has arrived on the emulated
// network; the zero time without emulation.
func (w *World) p2pReady(start time.Time, buf comm.Buffer) time.Time {
	if w.cfg.net == nil {
		return time.Time{}
	}
	return start.Add(w.cfg.net.PointToPoint(int64(buf.Len() * buf.DType().Size())))
}

// sleepUntil waits until t (precisely), the world is aborted or ctx ends; the
// zero t returns at once.
func (w *World) sleepUntil(ctx context.Context, t time.Time) error {
	if t.IsZero() {
		return nil
	}
	return netmodel.SleepUntil(ctx, t, w.aborted, func() error { return w.abortErr })
}
