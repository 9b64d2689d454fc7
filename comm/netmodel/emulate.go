package netmodel

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

// Emulate returns c with every call lasting as long as it would on net, by the
// rule comm/local's WithNetwork applies to in-process ranks, for a
// communicator whose ranks are separate processes (comm/mpi under mpirun):
//
//   - A collective ends its modelled time (Network.Cost) after the last rank
//     joined it, or after the previous collective ended if that is later:
//     collectives in flight at once (non-blocking calls, such as dense's
//     buckets during the backward pass) take turns on the emulated wire.
//     The real call's own time counts towards the modelled time.
//   - A message arrives its modelled time (Network.PointToPoint) after its
//     send started; Send, SendRecv and ISend's Wait return then too.
//
// A call on buffers in device memory (comm.Device, e.g. NCCL's beside the
// host's through comm.Route) joins when the device has reached it: its
// buffers' streams are synchronized first, one host wait per call, so
// that a GPU's queued work does not start the modelled transfer early.
//
// Every rank must wrap its communicator with the same net. To know when the
// last rank joined, each collective is preceded by a small non-blocking
// all-reduce of the ranks' join times, and each message by one of its send
// time (same destination and tag, so matched in order): these extra calls go
// over the real network and are not counted by a comm.Counter wrapped around
// the result. The times are wall-clock times, so the ranks' clocks must
// agree: processes on one machine share one; on several machines, clock
// offsets shift the emulated ends. An invalid net is an error; with one rank
// Emulate returns c (one rank sends nothing).
func Emulate(c comm.Communicator, net Network) (comm.Communicator, error) {
	if err := net.Validate(); err != nil {
		return nil, err
	}
	if c.Size() <= 1 {
		return c, nil
	}
	return &emulated{c: c, net: net}, nil
}

type emulated struct {
	c   comm.Communicator
	net Network

	mu   sync.Mutex // orders the calls' submission and the chain of ends
	last *linkTurn
}

// linkTurn is one collective's turn on the emulated wire: it ends cost after
// the later of the last rank's join time (from the stamps' all-reduce) and
// the previous turn's end.
type linkTurn struct {
	once   sync.Once
	prev   *linkTurn
	stamps comm.Int64s
	req    comm.Request
	cost   time.Duration
	end    time.Time
	err    error
}

func (t *linkTurn) resolve(ctx context.Context) (time.Time, error) {
	t.once.Do(func() {
		var prevEnd time.Time
		if t.prev != nil {
			prevEnd, t.err = t.prev.resolve(ctx)
			t.prev = nil // the chain behind is resolved; let it go
		}
		if _, err := t.req.Wait(ctx); err != nil && t.err == nil {
			t.err = fmt.Errorf("netmodel: emulated network: the ranks' join times: %w", err)
		}
		if t.err != nil {
			return
		}
		start := time.Unix(0, slices.Max(t.stamps))
		if prevEnd.After(start) {
			start = prevEnd
		}
		t.end = start.Add(t.cost)
	})
	return t.end, t.err
}

// reached waits until the device work issued before a call on its buffers
// in device memory is done (their streams synchronized), so that the call
// joins the emulated network when the device reaches it, not when the host
// issued it: a GPU's host runs ahead of its streams (NCCL beside the host's
// communicator, comm.Route), and a join time taken at issue would start the
// modelled transfer before the data exist. Host buffers wait for nothing.
func reached(bufs ...comm.Buffer) error {
	var done []device.Stream
	for _, b := range bufs {
		d, ok := comm.InDeviceMemory(b)
		if !ok || d.Stream == nil || slices.Contains(done, d.Stream) {
			continue
		}
		if err := d.Stream.Synchronize(); err != nil {
			return fmt.Errorf("netmodel: emulated network: waiting for the device to reach the call: %w", err)
		}
		done = append(done, d.Stream)
	}
	return nil
}

func (e *emulated) Rank() int { return e.c.Rank() }
func (e *emulated) Size() int { return e.c.Size() }

// collective issues, once the device has reached the call (reached), the
// join-time all-reduce, then the real call (call) of op on bufs, in one
// order on every rank, and returns the call's turn. The call's size is its
// first buffer's, as comm.Traffic counts it.
func (e *emulated) collective(ctx context.Context, op comm.Op, counts []int, call func() error, bufs ...comm.Buffer) (*linkTurn, error) {
	if err := reached(bufs...); err != nil {
		return nil, err
	}
	elems, es := 0, 0
	if len(bufs) > 0 {
		elems, es = blen(bufs[0]), esize(bufs[0])
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t := &linkTurn{stamps: make(comm.Int64s, e.c.Size()), cost: e.net.Cost(op, e.c.Size(), elems, es, counts)}
	t.stamps[e.c.Rank()] = time.Now().UnixNano()
	var err error
	if t.req, err = comm.IAllReduce(ctx, e.c, t.stamps); err != nil {
		return nil, fmt.Errorf("netmodel: emulated network: the ranks' join times: %w", err)
	}
	t.prev, e.last = e.last, t
	if err := call(); err != nil {
		return nil, err
	}
	return t, nil
}

func (e *emulated) finish(ctx context.Context, t *linkTurn) error {
	end, err := t.resolve(ctx)
	if err != nil {
		return err
	}
	return SleepUntil(ctx, end, nil, nil)
}

func (e *emulated) blocking(ctx context.Context, op comm.Op, counts []int, call func() error, bufs ...comm.Buffer) error {
	t, err := e.collective(ctx, op, counts, call, bufs...)
	if err != nil {
		return err
	}
	return e.finish(ctx, t)
}

type turnRequest struct {
	e    *emulated
	t    *linkTurn
	real comm.Request
}

func (r *turnRequest) Wait(ctx context.Context) (int, error) {
	n, err := r.real.Wait(ctx)
	if err != nil {
		return n, err
	}
	return n, r.e.finish(ctx, r.t)
}

func (e *emulated) nonBlocking(ctx context.Context, op comm.Op, call func() (comm.Request, error), bufs ...comm.Buffer) (comm.Request, error) {
	var real comm.Request
	t, err := e.collective(ctx, op, nil, func() (err error) { real, err = call(); return err }, bufs...)
	if err != nil {
		return nil, err
	}
	return &turnRequest{e: e, t: t, real: real}, nil
}

func esize(b comm.Buffer) int {
	if b == nil {
		return 0
	}
	return b.DType().Size()
}

func blen(b comm.Buffer) int {
	if b == nil {
		return 0
	}
	return b.Len()
}

func (e *emulated) AllReduce(ctx context.Context, buf comm.Buffer) error {
	return e.blocking(ctx, comm.OpAllReduce, nil, func() error { return e.c.AllReduce(ctx, buf) }, buf)
}

func (e *emulated) AllGather(ctx context.Context, send, recv comm.Buffer) error {
	return e.blocking(ctx, comm.OpAllGather, nil, func() error { return e.c.AllGather(ctx, send, recv) }, send, recv)
}

func (e *emulated) AllGatherV(ctx context.Context, send, recv comm.Buffer, counts []int) error {
	return e.blocking(ctx, comm.OpAllGatherV, counts, func() error { return e.c.AllGatherV(ctx, send, recv, counts) }, send, recv)
}

func (e *emulated) Broadcast(ctx context.Context, buf comm.Buffer, root int) error {
	return e.blocking(ctx, comm.OpBroadcast, nil, func() error { return e.c.Broadcast(ctx, buf, root) }, buf)
}

func (e *emulated) Barrier(ctx context.Context) error {
	return e.blocking(ctx, comm.OpBarrier, nil, func() error { return e.c.Barrier(ctx) })
}

func (e *emulated) IAllReduceView(ctx context.Context, buf comm.Buffer, off, total int) (comm.Request, error) {
	return e.nonBlocking(ctx, comm.OpAllReduce, func() (comm.Request, error) { return e.c.IAllReduceView(ctx, buf, off, total) }, buf)
}

func (e *emulated) IAllGather(ctx context.Context, send, recv comm.Buffer) (comm.Request, error) {
	return e.nonBlocking(ctx, comm.OpAllGather, func() (comm.Request, error) { return e.c.IAllGather(ctx, send, recv) }, send, recv)
}

// Point-to-point: each message is preceded by its send time, a one-element
// message of the same destination and tag.

func (e *emulated) p2p(b comm.Buffer, n int) time.Duration {
	return e.net.PointToPoint(int64(n) * int64(esize(b)))
}

func (e *emulated) Send(ctx context.Context, buf comm.Buffer, dst, tag int) error {
	if err := reached(buf); err != nil {
		return err
	}
	start := time.Now()
	if err := e.c.Send(ctx, comm.Int64s{start.UnixNano()}, dst, tag); err != nil {
		return err
	}
	if err := e.c.Send(ctx, buf, dst, tag); err != nil {
		return err
	}
	return SleepUntil(ctx, start.Add(e.p2p(buf, blen(buf))), nil, nil)
}

func (e *emulated) Recv(ctx context.Context, buf comm.Buffer, src, tag int) (int, error) {
	st := comm.Int64s{0}
	if _, err := e.c.Recv(ctx, st, src, tag); err != nil {
		return 0, err
	}
	n, err := e.c.Recv(ctx, buf, src, tag)
	if err != nil {
		return n, err
	}
	return n, SleepUntil(ctx, time.Unix(0, st[0]).Add(e.p2p(buf, n)), nil, nil)
}

func (e *emulated) SendRecv(ctx context.Context, send comm.Buffer, dst int, recv comm.Buffer, src, tag int) (int, error) {
	if err := reached(send, recv); err != nil {
		return 0, err
	}
	start := time.Now()
	st := comm.Int64s{0}
	if _, err := e.c.SendRecv(ctx, comm.Int64s{start.UnixNano()}, dst, st, src, tag); err != nil {
		return 0, err
	}
	n, err := e.c.SendRecv(ctx, send, dst, recv, src, tag)
	if err != nil {
		return n, err
	}
	end := start.Add(e.p2p(send, blen(send)))
	if arrived := time.Unix(0, st[0]).Add(e.p2p(recv, n)); arrived.After(end) {
		end = arrived
	}
	return n, SleepUntil(ctx, end, nil, nil)
}

// p2pRequest waits for a message's stamp and the message, then until the
// modelled end: the send's start plus its time (stamp nil: the local send's
// start is known).
type p2pRequest struct {
	e         *emulated
	stampReq  comm.Request
	real      comm.Request
	buf       comm.Buffer
	stamp     comm.Int64s
	send      bool
	sendStart time.Time
}

func (r *p2pRequest) Wait(ctx context.Context) (int, error) {
	if _, err := r.stampReq.Wait(ctx); err != nil {
		return 0, err
	}
	n, err := r.real.Wait(ctx)
	if err != nil {
		return n, err
	}
	start := r.sendStart
	if !r.send {
		start = time.Unix(0, r.stamp[0])
	}
	return n, SleepUntil(ctx, start.Add(r.e.p2p(r.buf, n)), nil, nil)
}

func (e *emulated) ISend(ctx context.Context, buf comm.Buffer, dst, tag int) (comm.Request, error) {
	if err := reached(buf); err != nil {
		return nil, err
	}
	start := time.Now()
	st := comm.Int64s{start.UnixNano()}
	sq, err := e.c.ISend(ctx, st, dst, tag)
	if err != nil {
		return nil, err
	}
	q, err := e.c.ISend(ctx, buf, dst, tag)
	if err != nil {
		return nil, err
	}
	return &p2pRequest{e: e, stampReq: sq, real: q, buf: buf, stamp: st, send: true, sendStart: start}, nil
}

func (e *emulated) IRecv(ctx context.Context, buf comm.Buffer, src, tag int) (comm.Request, error) {
	st := comm.Int64s{0}
	sq, err := e.c.IRecv(ctx, st, src, tag)
	if err != nil {
		return nil, err
	}
	q, err := e.c.IRecv(ctx, buf, src, tag)
	if err != nil {
		return nil, err
	}
	return &p2pRequest{e: e, stampReq: sq, real: q, buf: buf, stamp: st}, nil
}
