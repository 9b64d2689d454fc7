package cuda

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

// NCCL, loaded at run time like the other NVIDIA libraries (libnccl.so.2,
// also from the pip wheel nvidia-nccl-cu13's nvidia/nccl/lib).

var libNCCL = library{what: "NCCL", names: []string{"libnccl.so.2", "libnccl.so"}, prefix: "libnccl.so",
	install: "install the pip wheel nvidia-nccl-cu13 (pip install nvidia-nccl-cu13; -cu12 for CUDA 12) or NCCL from NVIDIA (Debian/Ubuntu: libnccl2), or set " + EnvLibs}

// The NCCL function table. Device addresses are uint64, handles uintptr.
var nccl struct {
	getVersion        func(v *int32) int32
	getUniqueID       func(id *NCCLID) int32
	commInitRank      func(comm *uintptr, nranks int32, id *NCCLID, rank int32) int32
	commDestroy       func(comm uintptr) int32
	commAbort         func(comm uintptr) int32
	commGetAsyncError func(comm uintptr, r *int32) int32
	getErrorString    func(r int32) *byte
	allReduce         func(send, recv, count uint64, dt, op int32, comm, stream uintptr) int32
	broadcast         func(send, recv, count uint64, dt, root int32, comm, stream uintptr) int32
	allGather         func(send, recv, count uint64, dt int32, comm, stream uintptr) int32
	send              func(buf, count uint64, dt, peer int32, comm, stream uintptr) int32
	recv              func(buf, count uint64, dt, peer int32, comm, stream uintptr) int32
	groupStart        func() int32
	groupEnd          func() int32
}

var (
	ncclOnce sync.Once
	ncclErr  error
)

// loadNCCL loads libnccl and binds its functions, once per process.
func loadNCCL() error {
	ncclOnce.Do(func() {
		h, path, err := libNCCL.open()
		if err != nil {
			ncclErr = err
			return
		}
		ncclErr = bind(libNCCL, path, h, map[string]any{
			"ncclGetVersion":        &nccl.getVersion,
			"ncclGetUniqueId":       &nccl.getUniqueID,
			"ncclCommDestroy":       &nccl.commDestroy,
			"ncclCommAbort":         &nccl.commAbort,
			"ncclCommGetAsyncError": &nccl.commGetAsyncError,
			"ncclGetErrorString":    &nccl.getErrorString,
			"ncclAllReduce":         &nccl.allReduce,
			"ncclBroadcast":         &nccl.broadcast,
			"ncclAllGather":         &nccl.allGather,
			"ncclSend":              &nccl.send,
			"ncclRecv":              &nccl.recv,
			"ncclGroupStart":        &nccl.groupStart,
			"ncclGroupEnd":          &nccl.groupEnd,
		})
		if ncclErr != nil {
			return
		}
		var v int32
		if nccl.getVersion(&v) == ncclSuccess {
			setLibraryVersion(libNCCL.what, fmt.Sprintf("%d.%d.%d", v/10000, v%10000/100, v%100))
		}
		// ncclCommInitRank takes the 128-byte unique id by value: the x86-64
		// System V ABI passes it in memory, in the stack slots that follow
		// the six integer registers, so it is called with the three integer
		// arguments, three unused registers, and the id's 16 words.
		fn, err := purego.Dlsym(h, "ncclCommInitRank")
		if err != nil {
			ncclErr = fmt.Errorf("%w: NCCL lacks ncclCommInitRank: %v", device.ErrUnavailable, err)
			return
		}
		nccl.commInitRank = func(comm *uintptr, nranks int32, id *NCCLID, rank int32) int32 {
			return callWithID(fn, comm, nranks, id, rank)
		}
	})
	return ncclErr
}

// callWithID calls the C function fn(void **comm, int nranks, ncclUniqueId
// id, int rank) — the id by value — as the x86-64 System V ABI wants it:
// the integer arguments in the first registers (comm, nranks, rank; three
// unused), the 128-byte struct in memory, in the stack slots the seventh
// and later integer arguments occupy.
func callWithID(fn uintptr, comm *uintptr, nranks int32, id *NCCLID, rank int32) int32 {
	args := []uintptr{uintptr(unsafe.Pointer(comm)), uintptr(nranks), uintptr(rank), 0, 0, 0}
	for i := 0; i < len(id); i += 8 {
		args = append(args, uintptr(*(*uint64)(unsafe.Pointer(&id[i]))))
	}
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

// ncclResult is an ncclResult_t.
type ncclResult int32

const (
	ncclSuccess    = 0
	ncclInProgress = 7
)

func (r ncclResult) Error() string {
	msg := ""
	if nccl.getErrorString != nil {
		msg = goString(nccl.getErrorString(int32(r)))
	}
	return fmt.Sprintf("NCCL error %d: %s", int32(r), msg)
}

func ncclCheck(call string, r int32) error {
	if r == ncclSuccess {
		return nil
	}
	if r == missingSymbol {
		return missingError(call)
	}
	return fmt.Errorf("cuda: %s: %w", call, ncclResult(r))
}

// NCCL's data types and reduction (ncclDataType_t, ncclRedOp_t).
const (
	ncclInt32   = 2
	ncclInt64   = 4
	ncclFloat16 = 6 // ncclHalf
	ncclFloat32 = 7
	ncclFloat64 = 8
	ncclSum     = 0
)

func ncclType(dt device.DType) (int32, error) {
	switch dt {
	case device.Float32:
		return ncclFloat32, nil
	case device.Float64:
		return ncclFloat64, nil
	case device.Int32:
		return ncclInt32, nil
	case device.Int64:
		return ncclInt64, nil
	case device.Float16:
		return ncclFloat16, nil // its sums in half precision, in NCCL's order
	}
	return 0, fmt.Errorf("cuda: NCCL has no type for %v", dt)
}

// NCCLID is NCCL's unique id of a communicator (ncclUniqueId): one rank
// creates it with NewNCCLID and hands it to the others (over MPI, or in
// memory for ranks of one process).
type NCCLID [128]byte

// NCCLVersion returns NCCL's version code (e.g. 22105 for 2.21.5).
func NCCLVersion() (int, error) {
	if err := loadNCCL(); err != nil {
		return 0, err
	}
	var v int32
	if err := ncclCheck("ncclGetVersion", nccl.getVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// NewNCCLID returns a fresh unique id.
func NewNCCLID() (NCCLID, error) {
	var id NCCLID
	if err := loadNCCL(); err != nil {
		return id, err
	}
	if err := ncclCheck("ncclGetUniqueId", nccl.getUniqueID(&id)); err != nil {
		return id, err
	}
	return id, nil
}

// ErrNCCLAborted is wrapped by the errors of an NCCL communicator that was
// aborted (after a cancelled call, an expired deadline or an error reported
// by NCCL); the communicator cannot be used again.
var ErrNCCLAborted = errors.New("cuda: the NCCL communicator was aborted")

// NCCL is one rank of an NCCL communicator: one GPU per rank, collectives
// and point-to-point transfers on device buffers, issued on the
// communicator's own stream. Each call returns once its transfer has
// completed on the GPU (its results are in the buffers), or with an error
// after aborting the communicator (ncclCommAbort) when ctx is done or NCCL
// reports an asynchronous error — never waiting forever on a dead peer.
// Work other streams must finish first is ordered with After.
//
// NCCL has neither tags nor message lengths: Recv receives exactly
// len(buf) elements from the matching Send, and transfers between two ranks
// are matched in the order they were issued.
//
// An NCCL is not safe for concurrent use.
type NCCL struct {
	d          *Device
	h          uintptr
	s          *Stream
	done       uintptr // event recorded after each call
	rank, size int
	aborted    error
	scratch    device.Buffer // Barrier's word
}

// NewNCCL joins rank rank of the size-rank communicator id on GPU d. Every
// rank must call it (concurrently: it returns when all have joined); a
// GPU may hold only one rank of a communicator. When ctx ends first, it
// returns an error (the joining goes on in the background until NCCL gives
// up or the process ends).
func NewNCCL(ctx context.Context, d *Device, id NCCLID, rank, size int) (*NCCL, error) {
	if err := loadNCCL(); err != nil {
		return nil, err
	}
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("cuda: NCCL rank %d of %d", rank, size)
	}
	c := &NCCL{d: d, rank: rank, size: size}
	s, err := d.newStream()
	if err != nil {
		return nil, err
	}
	c.s = s
	if err := func() error {
		unlock, err := d.enter()
		if err != nil {
			return err
		}
		defer unlock()
		return check("cuEventCreate", drv.cuEventCreate(&c.done, eventNoTiming))
	}(); err != nil {
		return nil, err
	}
	if c.scratch, err = d.Alloc(device.Int32, 1); err != nil {
		return nil, err
	}
	type result struct {
		h   uintptr
		err error
	}
	ch := make(chan result, 1)
	go func() {
		unlock, err := d.enter()
		if err != nil {
			ch <- result{0, err}
			return
		}
		defer unlock()
		var h uintptr
		err = ncclCheck("ncclCommInitRank", nccl.commInitRank(&h, int32(size), &id, int32(rank)))
		ch <- result{h, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("%w (rank %d of %d on %v)", r.err, rank, size, d)
		}
		c.h = r.h
		return c, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("cuda: joining NCCL rank %d of %d on %v: %w (have all ranks started?)", rank, size, d, ctx.Err())
	}
}

// Rank is this rank.
func (c *NCCL) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *NCCL) Size() int { return c.size }

// Stream is the stream the communicator's transfers run on.
func (c *NCCL) Stream() *Stream { return c.s }

// Close destroys the communicator (after an abort, only frees it).
func (c *NCCL) Close() error {
	unlock, err := c.d.enter()
	if err != nil {
		return err
	}
	defer unlock()
	if c.h != 0 {
		if c.aborted != nil {
			err = ncclCheck("ncclCommAbort", nccl.commAbort(c.h))
		} else {
			err = ncclCheck("ncclCommDestroy", nccl.commDestroy(c.h))
		}
		c.h = 0
	}
	return errors.Join(err, check("cuEventDestroy", drv.cuEventDestroy(c.done)), c.s.Close(), c.d.Free(c.scratch))
}

// call issues one transfer (f, with the device's context current) and
// waits for it.
func (c *NCCL) call(ctx context.Context, what string, f func() int32) error {
	if err := c.start(what, f); err != nil {
		return err
	}
	return c.wait(ctx, what)
}

// start issues f and records the completion event after it. The
// communicator's methods hold its stream (Stream.Hold) for their calls to
// the driver and NCCL: one context switch a call, not one each.
func (c *NCCL) start(what string, f func() int32) error {
	if c.aborted != nil {
		return c.aborted
	}
	unlock, err := c.s.enter() // held by the call issuing it
	if err != nil {
		return err
	}
	defer unlock()
	counts.launches.Add(1)
	if err := ncclCheck(what, f()); err != nil {
		return c.abort(err)
	}
	return check("cuEventRecord", drv.cuEventRecord(c.done, c.s.h))
}

// wait waits for the completion event of the last transfer issued.
func (c *NCCL) wait(ctx context.Context, what string) error { return c.waitEvent(ctx, what, c.done) }

// waitEvent polls event ev until the transfers before it are done, ctx
// ends or NCCL reports an error; the last two abort the communicator.
func (c *NCCL) waitEvent(ctx context.Context, what string, ev uintptr) error {
	if c.aborted != nil {
		return c.aborted
	}
	counts.syncs.Add(1)
	pause := 2 * time.Microsecond
	for {
		r, async := c.query(ev)
		switch {
		case r == 0:
			return nil
		case r != errNotReady:
			return c.abort(check("cuEventQuery after "+what, r))
		case async != ncclSuccess && async != ncclInProgress:
			return c.abort(fmt.Errorf("cuda: %s: %w", what, ncclResult(async)))
		}
		select {
		case <-ctx.Done():
			return c.abort(fmt.Errorf("cuda: %s: %w", what, ctx.Err()))
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Millisecond)
	}
}

func (c *NCCL) query(ev uintptr) (cuResult, int32) {
	unlock, err := c.d.enter()
	if err != nil {
		return errContext, ncclSuccess
	}
	defer unlock()
	r := drv.cuEventQuery(ev)
	var async int32
	if r == errNotReady {
		if st := nccl.commGetAsyncError(c.h, &async); st != ncclSuccess {
			async = st
		}
	}
	return r, async
}

// abort aborts the communicator for cause and returns the error every
// later call returns too.
func (c *NCCL) abort(cause error) error {
	if c.aborted == nil {
		c.aborted = fmt.Errorf("%w (rank %d of %d): %w", ErrNCCLAborted, c.rank, c.size, cause)
		unlock, err := c.d.enter()
		if err == nil {
			err = ncclCheck("ncclCommAbort", nccl.commAbort(c.h))
			unlock()
		}
		if err != nil {
			c.aborted = fmt.Errorf("%w (and aborting it: %w)", c.aborted, err)
		}
		c.h = 0
	}
	return c.aborted
}

// xfer is one transfer, checked and ready to issue: f issues it (the
// device's context current; nil where there is nothing to issue, as for a
// one-rank all-reduce); n is what a request's Wait returns.
type xfer struct {
	what string
	f    func() int32
	n    int
}

// bufs returns the device memory of comm.Device buffers of this GPU, of one
// NCCL type, and makes the communicator's stream wait for the work issued on
// their streams so far.
func (c *NCCL) bufs(what string, bs ...comm.Buffer) ([]device.Buffer, int32, error) {
	out := make([]device.Buffer, len(bs))
	var dt device.DType
	for i, b := range bs {
		d, ok := b.(comm.Device)
		if !ok {
			if b != nil && b.Len() > 0 {
				return nil, 0, fmt.Errorf("cuda: NCCL %s: %T is host memory; NCCL moves GPU memory: pass comm.Device buffers (or use -comm mpi, which stages them)", what, b)
			}
			continue
		}
		if d.Buf.Len() == 0 {
			continue
		}
		if d.Buf.IsHost() || d.Buf.Device() != device.Device(c.d) {
			return nil, 0, fmt.Errorf("cuda: NCCL %s: %v is not memory of %v", what, d.Buf, c.d)
		}
		if dt != 0 && d.Buf.DType() != dt {
			return nil, 0, fmt.Errorf("cuda: NCCL %s: buffers of %v and %v", what, dt, d.Buf.DType())
		}
		dt = d.Buf.DType()
		out[i] = d.Buf
		if d.Stream != nil && d.Stream != device.Stream(c.s) {
			ev, err := d.Stream.Record()
			if err != nil {
				return nil, 0, err
			}
			if err := c.s.Wait(ev); err != nil {
				return nil, 0, err
			}
		}
	}
	if dt == 0 {
		dt = device.Float32
	}
	t, err := ncclType(dt)
	return out, t, err
}

func addr(b device.Buffer) uint64 { return uint64(b.Addr()) }

// run issues x and waits for it (nothing for a nil x or one without a
// call).
func (c *NCCL) run(ctx context.Context, x *xfer, err error) error {
	if err != nil || x == nil || x.f == nil {
		return err
	}
	return c.call(ctx, x.what, x.f)
}

// istart issues x and returns its request.
func (c *NCCL) istart(x *xfer, err error) (comm.Request, error) {
	if err != nil {
		return nil, err
	}
	if x == nil || x.f == nil {
		// Nothing issued (an empty buffer, one rank's all-reduce): done,
		// nothing to wait for.
		r := doneRequest(0)
		if x != nil {
			r = doneRequest(x.n)
		}
		return r, nil
	}
	if err := c.start(x.what, x.f); err != nil {
		return nil, err
	}
	ev, err := c.s.Record()
	if err != nil {
		return nil, err
	}
	r := &ncclRequest{c: c, ev: ev.(*Event)}
	if x != nil {
		r.what, r.n = x.what, x.n
	}
	return r, nil
}

// doneRequest is a transfer that issued nothing: its Wait returns its
// elements at once.
type doneRequest int

// Wait returns the elements received.
func (r doneRequest) Wait(context.Context) (int, error) { return int(r), nil }

// ncclRequest is a transfer started by one of the I methods.
type ncclRequest struct {
	c    *NCCL
	what string
	ev   *Event
	n    int
}

// Wait waits for the transfer (aborting the communicator when ctx ends
// first or NCCL fails) and returns the elements received.
func (r *ncclRequest) Wait(ctx context.Context) (int, error) {
	if err := r.c.waitEvent(ctx, r.what, r.ev.h); err != nil {
		return 0, err
	}
	return r.n, nil
}

var _ comm.Communicator = (*NCCL)(nil)

func (c *NCCL) allReduce(buf comm.Buffer) (*xfer, error) {
	b, dt, err := c.bufs("AllReduce", buf)
	if err != nil || b[0].Len() == 0 {
		return nil, err
	}
	if c.size == 1 { // one rank's sum is its buffer: no call
		return &xfer{what: "AllReduce", n: b[0].Len()}, nil
	}
	return &xfer{"ncclAllReduce", func() int32 {
		return nccl.allReduce(addr(b[0]), addr(b[0]), uint64(b[0].Len()), dt, ncclSum, c.h, c.s.h)
	}, b[0].Len()}, nil
}

// AllReduce sums buf over the ranks, in place (NCCL's order of addition,
// not the canonical order of package comm: close to the other backends'
// sums, not bit-identical).
func (c *NCCL) AllReduce(ctx context.Context, buf comm.Buffer) error {
	defer c.s.Hold()()
	x, err := c.allReduce(buf)
	return c.run(ctx, x, err)
}

// IAllReduceView starts the all-reduce of the view (NCCL's order of
// addition, as AllReduce: the view's position does not change it).
func (c *NCCL) IAllReduceView(_ context.Context, buf comm.Buffer, off, total int) (comm.Request, error) {
	defer c.s.Hold()()
	if err := comm.CheckView(off, buf.Len(), total); err != nil {
		return nil, fmt.Errorf("cuda: NCCL IAllReduceView: %w", err)
	}
	return c.istart(c.allReduce(buf))
}

func (c *NCCL) allGather(send, recv comm.Buffer) (*xfer, error) {
	b, dt, err := c.bufs("AllGather", send, recv)
	if err != nil {
		return nil, err
	}
	if recv.Len() != c.size*send.Len() {
		return nil, fmt.Errorf("cuda: NCCL AllGather: recv has %d elements, want %d·%d", recv.Len(), c.size, send.Len())
	}
	if send.Len() == 0 {
		return nil, nil
	}
	return &xfer{"ncclAllGather", func() int32 {
		return nccl.allGather(addr(b[0]), addr(b[1]), uint64(b[0].Len()), dt, c.h, c.s.h)
	}, recv.Len()}, nil
}

// AllGather concatenates every rank's send into recv in rank order.
func (c *NCCL) AllGather(ctx context.Context, send, recv comm.Buffer) error {
	defer c.s.Hold()()
	if done, err := c.oneRank(send, recv); done || err != nil {
		return err
	}
	x, err := c.allGather(send, recv)
	return c.run(ctx, x, err)
}

// IAllGather starts AllGather (of one rank: the copy on the stream, a
// request done at once, nothing to wait for).
func (c *NCCL) IAllGather(_ context.Context, send, recv comm.Buffer) (comm.Request, error) {
	defer c.s.Hold()()
	if done, err := c.oneRank(send, recv); done || err != nil {
		if err != nil {
			return nil, err
		}
		return doneRequest(recv.Len()), nil
	}
	return c.istart(c.allGather(send, recv))
}

func (c *NCCL) allGatherV(send, recv comm.Buffer, counts []int) (*xfer, error) {
	b, dt, err := c.bufs("AllGatherV", send, recv)
	if err != nil {
		return nil, err
	}
	offs, total, err := c.blocks("AllGatherV", counts)
	if err != nil {
		return nil, err
	}
	if send.Len() != counts[c.rank] || recv.Len() != total {
		return nil, fmt.Errorf("cuda: NCCL AllGatherV: send %d and recv %d elements, counts %v", send.Len(), recv.Len(), counts)
	}
	if total == 0 {
		return nil, nil
	}
	counts = slices.Clone(counts)
	es := uint64(b[1].DType().Size())
	return &xfer{"ncclBroadcast (AllGatherV)", func() int32 {
		if r := nccl.groupStart(); r != ncclSuccess {
			return r
		}
		for r, n := range counts {
			if n == 0 {
				continue
			}
			src := uint64(0)
			if r == c.rank {
				src = addr(b[0])
			}
			if res := nccl.broadcast(src, addr(b[1])+uint64(offs[r])*es, uint64(n), dt, int32(r), c.h, c.s.h); res != ncclSuccess {
				nccl.groupEnd()
				return res
			}
		}
		return nccl.groupEnd()
	}, total}, nil
}

// AllGatherV is AllGather with counts[r] elements from rank r: one
// broadcast per rank, grouped.
func (c *NCCL) AllGatherV(ctx context.Context, send, recv comm.Buffer, counts []int) error {
	defer c.s.Hold()()
	if len(counts) == 1 && send != nil && counts[0] != send.Len() {
		return fmt.Errorf("cuda: NCCL AllGatherV: send %d elements, counts %v", send.Len(), counts)
	}
	if done, err := c.oneRank(send, recv); done || err != nil {
		return err
	}
	x, err := c.allGatherV(send, recv, counts)
	return c.run(ctx, x, err)
}

// oneRank does a gather of a one-rank communicator: recv is send, copied
// on the stream of send's comm.Device (and waited for by recv's), with no
// NCCL call and no host wait. It reports false, doing nothing, where the
// communicator has more ranks or a buffer is not device memory with a
// stream (the NCCL call then does it, or says what is wrong).
func (c *NCCL) oneRank(send, recv comm.Buffer) (bool, error) {
	if c.size != 1 || c.aborted != nil {
		return false, nil
	}
	sd, ok1 := send.(comm.Device)
	rd, ok2 := recv.(comm.Device)
	if !ok1 || !ok2 || sd.Stream == nil || rd.Stream == nil || sd.Buf.Len() != rd.Buf.Len() || sd.Buf.DType() != rd.Buf.DType() {
		return false, nil
	}
	if sd.Buf.Len() == 0 {
		return true, nil
	}
	for _, b := range []device.Buffer{sd.Buf, rd.Buf} {
		if b.IsHost() || b.Device() != device.Device(c.d) {
			return false, nil
		}
	}
	if sd.Buf.Addr() == rd.Buf.Addr() {
		return true, nil // in place
	}
	if err := sd.Stream.Copy(rd.Buf, sd.Buf); err != nil {
		return true, err
	}
	if rd.Stream != sd.Stream {
		ev, err := sd.Stream.Record()
		if err != nil {
			return true, err
		}
		return true, rd.Stream.Wait(ev)
	}
	return true, nil
}

// blocks returns the offsets and total of counts (one per rank).
func (c *NCCL) blocks(what string, counts []int) ([]int, int, error) {
	if len(counts) != c.size {
		return nil, 0, fmt.Errorf("cuda: NCCL %s: %d counts for %d ranks", what, len(counts), c.size)
	}
	offs := make([]int, c.size)
	total := 0
	for r, n := range counts {
		if n < 0 {
			return nil, 0, fmt.Errorf("cuda: NCCL %s: count %d of rank %d", what, n, r)
		}
		offs[r] = total
		total += n
	}
	return offs, total, nil
}

// Broadcast copies root's buf into every rank's buf.
func (c *NCCL) Broadcast(ctx context.Context, buf comm.Buffer, root int) error {
	defer c.s.Hold()()
	b, dt, err := c.bufs("Broadcast", buf)
	if err != nil || b[0].Len() == 0 {
		return err
	}
	if root < 0 || root >= c.size {
		return fmt.Errorf("cuda: NCCL Broadcast: root %d of %d ranks", root, c.size)
	}
	if c.size == 1 { // the root's buffer is everyone's: no call, no wait
		return nil
	}
	return c.call(ctx, "ncclBroadcast", func() int32 {
		return nccl.broadcast(addr(b[0]), addr(b[0]), uint64(b[0].Len()), dt, int32(root), c.h, c.s.h)
	})
}

// sendRecv prepares a send to dst and a receive from src, grouped (a
// negative rank or an empty buffer leaves that half out). NCCL has no tags
// and no message lengths: a receive takes exactly len(recv) elements.
func (c *NCCL) sendRecv(send comm.Buffer, dst int, recv comm.Buffer, src int) (*xfer, error) {
	b, dt, err := c.bufs("SendRecv", send, recv)
	if err != nil {
		return nil, err
	}
	for _, p := range []int{dst, src} {
		if p >= c.size {
			return nil, fmt.Errorf("cuda: NCCL SendRecv: rank %d of %d", p, c.size)
		}
	}
	doSend, doRecv := dst >= 0 && b[0].Len() > 0, src >= 0 && b[1].Len() > 0
	if !doSend && !doRecv {
		return nil, nil
	}
	n := 0
	if doRecv {
		n = b[1].Len()
	}
	return &xfer{"ncclSend/ncclRecv", func() int32 {
		if r := nccl.groupStart(); r != ncclSuccess {
			return r
		}
		if doSend {
			if r := nccl.send(addr(b[0]), uint64(b[0].Len()), dt, int32(dst), c.h, c.s.h); r != ncclSuccess {
				nccl.groupEnd()
				return r
			}
		}
		if doRecv {
			if r := nccl.recv(addr(b[1]), uint64(b[1].Len()), dt, int32(src), c.h, c.s.h); r != ncclSuccess {
				nccl.groupEnd()
				return r
			}
		}
		return nccl.groupEnd()
	}, n}, nil
}

// Send sends buf to rank dst (tag ignored: NCCL matches transfers between
// two ranks in issue order).
func (c *NCCL) Send(ctx context.Context, buf comm.Buffer, dst, _ int) error {
	defer c.s.Hold()()
	x, err := c.sendRecv(buf, dst, nil, -1)
	return c.run(ctx, x, err)
}

// Recv receives exactly len(buf) elements from rank src and returns
// len(buf).
func (c *NCCL) Recv(ctx context.Context, buf comm.Buffer, src, _ int) (int, error) {
	defer c.s.Hold()()
	x, err := c.sendRecv(nil, -1, buf, src)
	if err := c.run(ctx, x, err); err != nil {
		return 0, err
	}
	return buf.Len(), nil
}

// SendRecv sends send to dst and receives len(recv) elements from src
// together.
func (c *NCCL) SendRecv(ctx context.Context, send comm.Buffer, dst int, recv comm.Buffer, src, _ int) (int, error) {
	defer c.s.Hold()()
	x, err := c.sendRecv(send, dst, recv, src)
	if err := c.run(ctx, x, err); err != nil {
		return 0, err
	}
	return recv.Len(), nil
}

// ISend starts Send.
func (c *NCCL) ISend(_ context.Context, buf comm.Buffer, dst, _ int) (comm.Request, error) {
	defer c.s.Hold()()
	return c.istart(c.sendRecv(buf, dst, nil, -1))
}

// IRecv starts Recv.
func (c *NCCL) IRecv(_ context.Context, buf comm.Buffer, src, _ int) (comm.Request, error) {
	defer c.s.Hold()()
	return c.istart(c.sendRecv(nil, -1, buf, src))
}

// Barrier returns once every rank has entered it (an all-reduce of one
// word).
func (c *NCCL) Barrier(ctx context.Context) error {
	return c.AllReduce(ctx, comm.OnDevice(c.scratch, c.s))
}
