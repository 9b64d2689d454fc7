package comm

import (
	"context"
	"sync"
	"time"
)

// Op names a kind of communicator call.
type Op uint8

// The calls a Counter tells apart. Non-blocking calls are counted under their
// blocking names.
const (
	OpAllReduce Op = iota
	OpAllGather
	OpAllGatherV
	OpBroadcast
	// OpReduceScatter is a reduce-scatter, which the network model prices
	// (comm/netmodel) though no Communicator method makes one.
	OpReduceScatter
	OpSend
	OpRecv
	OpSendRecv
	OpBarrier
	numOps
)

var opNames = [numOps]string{"allreduce", "allgather", "allgatherv", "broadcast", "reducescatter", "send", "recv", "sendrecv", "barrier"}

// String returns the op's name, e.g. "allreduce".
func (o Op) String() string {
	if o < numOps {
		return opNames[o]
	}
	return "op?"
}

// Ops lists every Op in order.
func Ops() []Op {
	ops := make([]Op, numOps)
	for i := range ops {
		ops[i] = Op(i)
	}
	return ops
}

// OpStats accumulates the calls of one Op.
type OpStats struct {
	Calls int64
	// Elements is the total payload, in elements, this rank handed to the
	// calls (send length for sends and gathers, buffer length for reductions
	// and broadcasts, received length for receives).
	Elements int64
	// BytesSent and BytesRecv are this rank's traffic under the reference
	// algorithm of each call (see Traffic).
	BytesSent, BytesRecv int64
	// Time is the wall time spent in the calls (for non-blocking calls: from
	// the start to the return of Wait).
	Time time.Duration
}

// Totals is the sum over all Ops.
type Totals struct {
	Calls                int64
	BytesSent, BytesRecv int64
	Time                 time.Duration
}

// Sub returns t − u.
func (t Totals) Sub(u Totals) Totals {
	return Totals{t.Calls - u.Calls, t.BytesSent - u.BytesSent, t.BytesRecv - u.BytesRecv, t.Time - u.Time}
}

// Traffic is the number of bytes rank r of n sends and receives in one call of
// op under the bandwidth-optimal algorithm a cluster library would use; it is
// what byte statistics and projections count, whatever the backend does
// internally. elems is the call's buffer length (AllReduce, Broadcast), the
// send length (AllGather), or the message length (Send, Recv); counts are the
// per-rank lengths of AllGatherV and ReduceScatter (one per rank; missing
// entries count as 0, extra ones are ignored, so malformed counts never make
// it panic). esize is the element size in bytes; root is Broadcast's root.
//
//   - AllReduce (ring reduce-scatter then ring all-gather): rank r sends
//     2L − c_r − c_{r+1} and receives 2L − c_{r−1} − c_r bytes, where L is the
//     buffer's size and c_i that of chunk i (ChunkBounds): about 2(n−1)/n of
//     the buffer each way.
//   - AllGather (ring): (n−1)·elems sent and received.
//   - AllGatherV (ring): rank r forwards every block except rank r+1's and
//     receives every block except its own.
//   - ReduceScatter (ring): rank r sends every block except its own and
//     receives every block except rank r−1's.
//   - Broadcast (binomial tree): non-roots receive the buffer once; each rank
//     sends it once per child.
//   - Send, Recv: the message; SendRecv: both; Barrier: nothing.
func Traffic(op Op, n, r, elems, esize, root int, counts []int) (sent, recv int64) {
	b := func(e int) int64 { return int64(e) * int64(esize) }
	if n <= 1 && op != OpSend && op != OpRecv {
		return 0, 0 // a rank alone sends no collective's bytes
	}
	switch op {
	case OpAllReduce:
		// Reduce-scatter: rank r sends every chunk but its own and receives
		// every chunk but rank r−1's; all-gather: it forwards every chunk but
		// rank r+1's and receives every chunk but its own.
		c := func(i int) int64 {
			lo, hi := ChunkBounds(elems, n, (i+n)%n)
			return b(hi - lo)
		}
		all := b(elems)
		return 2*all - c(r) - c(r+1), 2*all - c(r-1) - c(r)
	case OpAllGather:
		return b((n - 1) * elems), b((n - 1) * elems)
	case OpAllGatherV:
		total := countsTotal(counts, n)
		return b(total - countAt(counts, (r+1)%n)), b(total - countAt(counts, r))
	case OpReduceScatter:
		total := countsTotal(counts, n)
		return b(total - countAt(counts, r)), b(total - countAt(counts, (r-1+n)%n))
	case OpBroadcast:
		v := (r - root + n) % n
		children := 0
		for m := 1; m < n; m <<= 1 {
			if v < m && v+m < n {
				children++
			}
		}
		if v != 0 {
			recv = b(elems)
		}
		return int64(children) * b(elems), recv
	case OpSend:
		return b(elems), 0
	case OpRecv:
		return 0, b(elems)
	}
	return 0, 0
}

// countAt is counts[i], or 0 when counts has no entry i.
func countAt(counts []int, i int) int {
	if i < 0 || i >= len(counts) {
		return 0
	}
	return counts[i]
}

// countsTotal is the sum of the first n entries of counts.
func countsTotal(counts []int, n int) int {
	total := 0
	for _, c := range counts[:min(n, len(counts))] {
		total += c
	}
	return total
}

// Counter wraps a Communicator and counts, per Op, the calls that succeeded:
// calls, payload, bytes (as Traffic defines them) and time. A call the
// backend fails is not counted; its error is returned unchanged. It is itself
// a Communicator and forwards every method explicitly (it does not embed the
// interface, so a method added to Communicator must be added here, counted,
// before the package compiles). Its statistics may be read from any
// goroutine.
type Counter struct {
	c     Communicator
	mu    sync.Mutex
	stats [numOps]OpStats
}

var _ Communicator = (*Counter)(nil)

// NewCounter wraps c.
func NewCounter(c Communicator) *Counter { return &Counter{c: c} }

// Rank forwards to the wrapped communicator.
func (c *Counter) Rank() int { return c.c.Rank() }

// Size forwards to the wrapped communicator.
func (c *Counter) Size() int { return c.c.Size() }

// Stats returns the statistics of op so far.
func (c *Counter) Stats(op Op) OpStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats[op]
}

// Totals returns the sum of the statistics over all ops.
func (c *Counter) Totals() Totals {
	c.mu.Lock()
	defer c.mu.Unlock()
	var t Totals
	for _, s := range c.stats {
		t.Calls += s.Calls
		t.BytesSent += s.BytesSent
		t.BytesRecv += s.BytesRecv
		t.Time += s.Time
	}
	return t
}

// Reset zeroes the statistics.
func (c *Counter) Reset() {
	c.mu.Lock()
	c.stats = [numOps]OpStats{}
	c.mu.Unlock()
}

func (c *Counter) add(op Op, elems int, sent, recv int64, d time.Duration) {
	c.mu.Lock()
	s := &c.stats[op]
	s.Calls++
	s.Elements += int64(elems)
	s.BytesSent += sent
	s.BytesRecv += recv
	s.Time += d
	c.mu.Unlock()
}

// record counts a call of op that succeeded (err == nil) and does nothing
// otherwise.
func (c *Counter) record(err error, op Op, buf Buffer, elems, root int, counts []int, start time.Time) {
	if err != nil {
		return
	}
	es := 0
	if buf != nil {
		es = buf.DType().Size()
	}
	s, r := Traffic(op, c.Size(), c.Rank(), elems, es, root, counts)
	c.add(op, elems, s, r, time.Since(start))
}

// count runs call, a call of op on buf (elems elements), and counts it if
// it succeeds.
func (c *Counter) count(op Op, buf Buffer, elems, root int, counts []int, call func() error) error {
	t := time.Now()
	err := call()
	c.record(err, op, buf, elems, root, counts, t)
	return err
}

// AllReduce counts and forwards the call.
func (c *Counter) AllReduce(ctx context.Context, buf Buffer) error {
	return c.count(OpAllReduce, buf, buf.Len(), 0, nil, func() error { return c.c.AllReduce(ctx, buf) })
}

// AllGather counts and forwards the call.
func (c *Counter) AllGather(ctx context.Context, send, recv Buffer) error {
	return c.count(OpAllGather, send, send.Len(), 0, nil, func() error { return c.c.AllGather(ctx, send, recv) })
}

// AllGatherV counts and forwards the call.
func (c *Counter) AllGatherV(ctx context.Context, send, recv Buffer, counts []int) error {
	return c.count(OpAllGatherV, send, send.Len(), 0, counts, func() error { return c.c.AllGatherV(ctx, send, recv, counts) })
}

// Broadcast counts and forwards the call.
func (c *Counter) Broadcast(ctx context.Context, buf Buffer, root int) error {
	return c.count(OpBroadcast, buf, buf.Len(), root, nil, func() error { return c.c.Broadcast(ctx, buf, root) })
}

// Send counts and forwards the call.
func (c *Counter) Send(ctx context.Context, buf Buffer, dst, tag int) error {
	return c.count(OpSend, buf, buf.Len(), 0, nil, func() error { return c.c.Send(ctx, buf, dst, tag) })
}

// Recv counts and forwards the call; the received length is counted.
func (c *Counter) Recv(ctx context.Context, buf Buffer, src, tag int) (int, error) {
	t := time.Now()
	n, err := c.c.Recv(ctx, buf, src, tag)
	c.record(err, OpRecv, buf, n, 0, nil, t)
	return n, err
}

// SendRecv counts and forwards the call.
func (c *Counter) SendRecv(ctx context.Context, send Buffer, dst int, recv Buffer, src, tag int) (int, error) {
	t := time.Now()
	n, err := c.c.SendRecv(ctx, send, dst, recv, src, tag)
	if err == nil {
		c.add(OpSendRecv, send.Len(), int64(send.Len()*send.DType().Size()), int64(n*recv.DType().Size()), time.Since(t))
	}
	return n, err
}

// Barrier counts and forwards the call.
func (c *Counter) Barrier(ctx context.Context) error {
	return c.count(OpBarrier, nil, 0, 0, nil, func() error { return c.c.Barrier(ctx) })
}

// countedRequest is a non-blocking request whose Wait records the call in a
// Counter.
type countedRequest struct {
	req  Request
	done func(err error, n int)
}

// Wait waits for the request and, if it succeeded, records its traffic.
func (r countedRequest) Wait(ctx context.Context) (int, error) {
	n, err := r.req.Wait(ctx)
	r.done(err, n)
	return n, err
}

func (c *Counter) wrap(req Request, err error, done func(err error, n int)) (Request, error) {
	if err != nil {
		return nil, err
	}
	return countedRequest{req, done}, nil
}

// IAllReduceView counts the call as an all-reduce of the view's elements
// and forwards it; its time runs until Wait returns.
func (c *Counter) IAllReduceView(ctx context.Context, buf Buffer, off, total int) (Request, error) {
	t := time.Now()
	req, err := c.c.IAllReduceView(ctx, buf, off, total)
	return c.wrap(req, err, func(err error, _ int) { c.record(err, OpAllReduce, buf, buf.Len(), 0, nil, t) })
}

// IAllGather counts and forwards the call.
func (c *Counter) IAllGather(ctx context.Context, send, recv Buffer) (Request, error) {
	t := time.Now()
	req, err := c.c.IAllGather(ctx, send, recv)
	return c.wrap(req, err, func(err error, _ int) { c.record(err, OpAllGather, send, send.Len(), 0, nil, t) })
}

// ISend counts and forwards the call.
func (c *Counter) ISend(ctx context.Context, buf Buffer, dst, tag int) (Request, error) {
	t := time.Now()
	req, err := c.c.ISend(ctx, buf, dst, tag)
	return c.wrap(req, err, func(err error, _ int) { c.record(err, OpSend, buf, buf.Len(), 0, nil, t) })
}

// IRecv counts and forwards the call.
func (c *Counter) IRecv(ctx context.Context, buf Buffer, src, tag int) (Request, error) {
	t := time.Now()
	req, err := c.c.IRecv(ctx, buf, src, tag)
	return c.wrap(req, err, func(err error, n int) { c.record(err, OpRecv, buf, n, 0, nil, t) })
}
