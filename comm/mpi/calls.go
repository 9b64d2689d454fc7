package mpi

import (
	"context"
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/comm"
)

const maxCount = math.MaxInt32 // MPI counts are C ints

// largeMessage is the size in bytes above which a point-to-point message is
// polled without pause (its transfer advances only inside MPI calls).
const largeMessage = 256 << 10

// ringMin is the size in bytes from which AllGather(V) and the integer
// AllReduce use the pipelined ring instead of the library's non-blocking
// collectives, which are slow for large buffers (Open MPI's libnbc) but have
// lower latency for small ones.
const ringMin = 64 << 10

func checkBuf(what, name string, b comm.Buffer) error {
	if b == nil {
		return fmt.Errorf("mpi: %s: %s buffer is nil; pass an empty comm.Float32s{} for no data", what, name)
	}
	switch b.DType() {
	case comm.Float32, comm.Int32, comm.Int64, comm.Float16:
	default:
		return fmt.Errorf("mpi: %s: %s has unsupported element type %v; use Float32s, Int32s, Int64s or Float16s", what, name, b.DType())
	}
	if b.Len() > maxCount {
		return fmt.Errorf("mpi: %s: %s has %d elements, more than MPI's limit of %d per call; split the call", what, name, b.Len(), maxCount)
	}
	return nil
}

func sameType(what string, send, recv comm.Buffer) error {
	if send.DType() != recv.DType() {
		return fmt.Errorf("mpi: %s: send is %v but recv is %v; both buffers must have the same element type", what, send.DType(), recv.DType())
	}
	return nil
}

// checkCounts validates per-rank counts and returns their total.
func (c *Comm) checkCounts(what string, counts []int) (int, error) {
	if len(counts) != c.Size() {
		return 0, fmt.Errorf("mpi: %s: %d counts for %d ranks; pass one count per rank", what, len(counts), c.Size())
	}
	total := 0
	for r, n := range counts {
		if n < 0 {
			return 0, fmt.Errorf("mpi: %s: counts[%d] = %d is negative", what, r, n)
		}
		total += n
	}
	if total > maxCount {
		return 0, fmt.Errorf("mpi: %s: counts add up to %d elements, more than MPI's limit of %d per call; split the call", what, total, maxCount)
	}
	return total, nil
}

func (c *Comm) checkPeer(what, role string, peer int) error {
	if peer < 0 || peer >= c.Size() {
		return fmt.Errorf("mpi: %s: %s rank %d is outside [0, %d)", what, role, peer, c.Size())
	}
	return nil
}

func (c *Comm) checkTag(what string, tag int) error {
	if tag < 0 || tag > c.e.tagUB {
		return fmt.Errorf("mpi: %s: tag %d is outside [0, %d], the tags this MPI library accepts (MPI_TAG_UB)", what, tag, c.e.tagUB)
	}
	return nil
}

// ring builds the canonical-order ring all-reduce of buf in place, its
// blocks bounds.
func (c *Comm) ring(what string, buf []byte, dt comm.DType, bounds []int) *ringOp {
	e := c.e
	esz := dt.Size()
	return &ringOp{
		what: what, dt: dt, esz: esz, n: c.Size(), r: c.Rank(), bounds: bounds,
		src: buf, work: buf,
		segElems: max(1, e.segBytes/esz), window: e.window,
	}
}

// chunks are the block offsets of comm.ChunkBounds.
func chunks(L, n int) []int {
	b := make([]int, n+1)
	for j := 0; j < n; j++ {
		_, b[j+1] = comm.ChunkBounds(L, n, j)
	}
	return b
}

// allReduceOp builds the op of AllReduce and of iAllReduce.
func (c *Comm) allReduceOp(buf comm.Buffer) (op, error) {
	if err := checkBuf("AllReduce", "buf", buf); err != nil {
		return nil, err
	}
	n, L, dt := c.Size(), buf.Len(), buf.DType()
	if n == 1 || L == 0 {
		return nil, nil
	}
	what := fmt.Sprintf("AllReduce of %d %v", L, dt)
	// Floating-point sums go round the ring, in the canonical order (MPI
	// has no half type to sum); integers too when they are large.
	if dt == comm.Float32 || dt == comm.Float16 || L*dt.Size() >= ringMin {
		return c.ring(what, buf.Bytes(), dt, chunks(L, n)), nil
	}
	b := buf.Bytes()
	return &reqOp{
		what: what, nreq: 1, n: L, recvIdx: -1, keep: []any{b}, poll: true,
		post: func(e *engine, reqs []uintptr) int32 {
			return call(e.l.iallreduce, 1 /* MPI_IN_PLACE */, bufPtr(b), uintptr(L), e.l.typeOf(dt), e.l.opSum, e.coll, ptr(&reqs[0]))
		},
	}, nil
}

// start runs o (nil means there is nothing to do) and returns its request.
func (c *Comm) start(ctx context.Context, o op, n int, early bool) (comm.Request, error) {
	if o == nil {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("mpi: call not started: %w", err)
		}
		c.e.mu.Lock()
		closed := c.e.pending == nil
		c.e.mu.Unlock()
		if closed {
			return nil, fmt.Errorf("mpi: the communicator is closed")
		}
		return c.e.doneRequest("no-op", n, nil), nil
	}
	return c.e.run(ctx, o, early)
}

func (c *Comm) do(ctx context.Context, o op, n int) (int, error) {
	r, err := c.start(ctx, o, n, false)
	if err != nil {
		return 0, err
	}
	return r.Wait(ctx)
}

// AllReduce sums buf over all ranks in place, float32 in the canonical order.
func (c *Comm) AllReduce(ctx context.Context, buf comm.Buffer) error {
	r, err := c.iAllReduce(ctx, buf)
	if err != nil {
		return err
	}
	_, err = r.Wait(ctx)
	return err
}

// IAllReduceView starts the all-reduce of a view (comm.Communicator): a
// float32 view is reduced by the ring with the vector's chunks cut to the
// view; the whole vector and integers (whose sums do not depend on the
// order) as AllReduce.
func (c *Comm) IAllReduceView(ctx context.Context, buf comm.Buffer, off, total int) (comm.Request, error) {
	if err := comm.CheckView(off, buf.Len(), total); err != nil {
		return nil, fmt.Errorf("mpi: IAllReduceView: %w", err)
	}
	if err := checkBuf("IAllReduceView", "buf", buf); err != nil {
		return nil, err
	}
	n, L := c.Size(), buf.Len()
	if buf.DType() != comm.Float32 || n == 1 || L == 0 || off == 0 && L == total {
		return c.iAllReduce(ctx, buf)
	}
	b := make([]int, n+1)
	for j := range n {
		_, b[j+1] = comm.ViewChunkBounds(total, off, L, n, j)
	}
	o := c.ring(fmt.Sprintf("AllReduce of %d %v (elements [%d, %d) of %d)", L, buf.DType(), off, off+L, total), buf.Bytes(), buf.DType(), b)
	return c.start(ctx, o, L, false)
}

// iAllReduce starts AllReduce (comm.IAllReduce reaches it through
// IAllReduceView of the whole vector).
func (c *Comm) iAllReduce(ctx context.Context, buf comm.Buffer) (comm.Request, error) {
	o, err := c.allReduceOp(buf)
	if err != nil {
		return nil, err
	}
	return c.start(ctx, o, buf.Len(), false)
}

func (c *Comm) allGatherVOp(what string, send, recv comm.Buffer, counts []int) (op, int, error) {
	if err := checkBuf(what, "send", send); err != nil {
		return nil, 0, err
	}
	if err := checkBuf(what, "recv", recv); err != nil {
		return nil, 0, err
	}
	if err := sameType(what, send, recv); err != nil {
		return nil, 0, err
	}
	total, err := c.checkCounts(what, counts)
	if err != nil {
		return nil, 0, err
	}
	if send.Len() != counts[c.Rank()] {
		return nil, 0, fmt.Errorf("mpi: %s: send has %d elements but counts[%d] = %d", what, send.Len(), c.Rank(), counts[c.Rank()])
	}
	if recv.Len() != total {
		return nil, 0, fmt.Errorf("mpi: %s: recv has %d elements but counts add up to %d", what, recv.Len(), total)
	}
	if c.Size() == 1 || total == 0 {
		copy(recv.Bytes(), send.Bytes())
		return nil, total, nil
	}
	sb, rb := send.Bytes(), recv.Bytes()
	dt := send.DType()
	if total*dt.Size() >= ringMin {
		bounds := make([]int, c.Size()+1)
		for j, k := range counts {
			bounds[j+1] = bounds[j] + k
		}
		copy(rb[bounds[c.Rank()]*dt.Size():], sb)
		o := c.ring(fmt.Sprintf("%s of %d %v", what, total, dt), rb, dt, bounds)
		o.gatherOnly = true
		return o, total, nil
	}
	cnt := make([]int32, len(counts))
	displ := make([]int32, len(counts))
	off := 0
	for r, n := range counts {
		cnt[r], displ[r] = int32(n), int32(off)
		off += n
	}
	return &reqOp{
		what: fmt.Sprintf("%s of %d %v", what, total, dt), nreq: 1, n: total, recvIdx: -1,
		keep: []any{sb, rb, cnt, displ}, poll: true,
		post: func(e *engine, reqs []uintptr) int32 {
			t := e.l.typeOf(dt)
			return call(e.l.iallgatherv, bufPtr(sb), uintptr(len(sb)/dt.Size()), t, bufPtr(rb), ptr(&cnt[0]), ptr(&displ[0]), t, e.coll, ptr(&reqs[0]))
		},
	}, total, nil
}

func (c *Comm) allGatherOp(send, recv comm.Buffer) (op, int, error) {
	const what = "AllGather"
	if err := checkBuf(what, "send", send); err != nil {
		return nil, 0, err
	}
	if err := checkBuf(what, "recv", recv); err != nil {
		return nil, 0, err
	}
	if recv.Len() != c.Size()*send.Len() {
		return nil, 0, fmt.Errorf("mpi: %s: recv has %d elements, want Size()*send.Len() = %d*%d", what, recv.Len(), c.Size(), send.Len())
	}
	counts := make([]int, c.Size())
	for i := range counts {
		counts[i] = send.Len()
	}
	return c.allGatherVOp(what, send, recv, counts)
}

// AllGather concatenates every rank's send into recv in rank order.
func (c *Comm) AllGather(ctx context.Context, send, recv comm.Buffer) error {
	o, n, err := c.allGatherOp(send, recv)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, o, n)
	return err
}

// IAllGather starts AllGather.
func (c *Comm) IAllGather(ctx context.Context, send, recv comm.Buffer) (comm.Request, error) {
	o, n, err := c.allGatherOp(send, recv)
	if err != nil {
		return nil, err
	}
	return c.start(ctx, o, n, false)
}

// AllGatherV concatenates every rank's send (counts[r] elements from rank r)
// into recv in rank order.
func (c *Comm) AllGatherV(ctx context.Context, send, recv comm.Buffer, counts []int) error {
	o, n, err := c.allGatherVOp("AllGatherV", send, recv, counts)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, o, n)
	return err
}

// Broadcast copies root's buf into every rank's buf.
func (c *Comm) Broadcast(ctx context.Context, buf comm.Buffer, root int) error {
	const what = "Broadcast"
	if err := checkBuf(what, "buf", buf); err != nil {
		return err
	}
	if err := c.checkPeer(what, "root", root); err != nil {
		return err
	}
	if c.Size() == 1 || buf.Len() == 0 {
		_, err := c.do(ctx, nil, 0)
		return err
	}
	b, dt := buf.Bytes(), buf.DType()
	_, err := c.do(ctx, &reqOp{
		what: fmt.Sprintf("Broadcast of %d %v from rank %d", buf.Len(), dt, root), nreq: 1, n: buf.Len(), recvIdx: -1, keep: []any{b}, poll: true,
		post: func(e *engine, reqs []uintptr) int32 {
			return call(e.l.ibcast, bufPtr(b), uintptr(len(b)/dt.Size()), e.l.typeOf(dt), uintptr(root), e.coll, ptr(&reqs[0]))
		},
	}, buf.Len())
	return err
}

// Barrier returns once every rank has entered it.
func (c *Comm) Barrier(ctx context.Context) error {
	if c.Size() == 1 {
		_, err := c.do(ctx, nil, 0)
		return err
	}
	_, err := c.do(ctx, &reqOp{
		what: "Barrier", nreq: 1, recvIdx: -1,
		post: func(e *engine, reqs []uintptr) int32 { return call(e.l.ibarrier, e.coll, ptr(&reqs[0])) },
	}, 0)
	return err
}

// sendOp copies buf (so the caller may reuse it at once) and sends the copy.
func (c *Comm) sendOp(what string, buf comm.Buffer, dst, tag int) (op, error) {
	if err := checkBuf(what, "buf", buf); err != nil {
		return nil, err
	}
	if err := c.checkPeer(what, "destination", dst); err != nil {
		return nil, err
	}
	if err := c.checkTag(what, tag); err != nil {
		return nil, err
	}
	b := append([]byte(nil), buf.Bytes()...)
	dt := buf.DType()
	return &reqOp{
		what: fmt.Sprintf("%s of %d %v to rank %d tag %d", what, buf.Len(), dt, dst, tag), nreq: 1, n: buf.Len(), recvIdx: -1, keep: []any{b},
		poll: len(b) > largeMessage,
		post: func(e *engine, reqs []uintptr) int32 {
			return call(e.l.isend, bufPtr(b), uintptr(len(b)/dt.Size()), e.l.typeOf(dt), uintptr(dst), uintptr(tag), e.p2p, ptr(&reqs[0]))
		},
	}, nil
}

// Send delivers buf to rank dst. The message is copied, so Send returns as
// soon as it is handed to MPI, and pairs of ranks sending to each other before
// receiving cannot deadlock.
func (c *Comm) Send(ctx context.Context, buf comm.Buffer, dst, tag int) error {
	o, err := c.sendOp("Send", buf, dst, tag)
	if err != nil {
		return err
	}
	r, err := c.e.run(ctx, o, true)
	if err != nil {
		return err
	}
	_, err = r.Wait(ctx)
	return err
}

// ISend starts Send; like Send, it copies the message, so the request
// completes as soon as the message is handed to MPI.
func (c *Comm) ISend(ctx context.Context, buf comm.Buffer, dst, tag int) (comm.Request, error) {
	o, err := c.sendOp("ISend", buf, dst, tag)
	if err != nil {
		return nil, err
	}
	return c.e.run(ctx, o, true)
}

func (c *Comm) recvOp(what string, buf comm.Buffer, src, tag int) (*reqOp, error) {
	if err := checkBuf(what, "buf", buf); err != nil {
		return nil, err
	}
	if err := c.checkPeer(what, "source", src); err != nil {
		return nil, err
	}
	if err := c.checkTag(what, tag); err != nil {
		return nil, err
	}
	b, dt := buf.Bytes(), buf.DType()
	return &reqOp{
		what: fmt.Sprintf("%s of up to %d %v from rank %d tag %d", what, buf.Len(), dt, src, tag), nreq: 1,
		recvIdx: 0, recvT: dt, recvCap: buf.Len(), peer: src, keep: []any{b}, poll: len(b) > largeMessage,
		post: func(e *engine, reqs []uintptr) int32 {
			return call(e.l.irecv, bufPtr(b), uintptr(buf.Len()), e.l.typeOf(dt), uintptr(src), uintptr(tag), e.p2p, ptr(&reqs[0]))
		},
	}, nil
}

// Recv receives a message from rank src into buf and returns its length.
func (c *Comm) Recv(ctx context.Context, buf comm.Buffer, src, tag int) (int, error) {
	o, err := c.recvOp("Recv", buf, src, tag)
	if err != nil {
		return 0, err
	}
	return c.do(ctx, o, 0)
}

// IRecv starts Recv.
func (c *Comm) IRecv(ctx context.Context, buf comm.Buffer, src, tag int) (comm.Request, error) {
	o, err := c.recvOp("IRecv", buf, src, tag)
	if err != nil {
		return nil, err
	}
	return c.start(ctx, o, 0, false)
}

// SendRecv sends send to dst and receives from src, both with tag, and
// returns the received length.
func (c *Comm) SendRecv(ctx context.Context, send comm.Buffer, dst int, recv comm.Buffer, src, tag int) (int, error) {
	const what = "SendRecv"
	so, err := c.sendOp(what, send, dst, tag)
	if err != nil {
		return 0, err
	}
	ro, err := c.recvOp(what, recv, src, tag)
	if err != nil {
		return 0, err
	}
	s := so.(*reqOp)
	o := &reqOp{
		what:    fmt.Sprintf("SendRecv of %d %v to rank %d and up to %d from rank %d, tag %d", send.Len(), send.DType(), dst, recv.Len(), src, tag),
		nreq:    2,
		recvIdx: 0, recvT: ro.recvT, recvCap: ro.recvCap, peer: src, keep: []any{s.keep, ro.keep}, poll: s.poll || ro.poll,
		post: func(e *engine, reqs []uintptr) int32 {
			if rc := ro.post(e, reqs[0:1]); rc != mpiSuccess {
				return rc
			}
			return s.post(e, reqs[1:2])
		},
	}
	return c.do(ctx, o, 0)
}
