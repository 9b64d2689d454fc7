package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
// communicator's own stream after the work issued so far on the buffers'
// streams (comm.Device.Stream).
//
// The host does not wait for a transfer: when a call (or a request's
// Wait) returns, the streams of its buffers wait for the transfer on the
// device (cuStreamWaitEvent), so the work issued there afterwards sees its
// results, and the host sees them after synchronising such a stream (as
// comm.Device says). Only a buffer without a stream, and Barrier, make the
// host wait. A watchdog (a goroutine per communicator, from NewNCCL to
// Close) follows the transfers outstanding: when NCCL reports an
// asynchronous error, or the context of a call ends before its transfer
// has completed, it aborts the communicator (ncclCommAbort: the stuck
// transfers return, and so do the waits of the streams behind them), and
// every later call returns the error — never waiting forever on a dead
// peer. Work other streams must finish first is ordered with After.
//
// NCCL has neither tags nor message lengths: Recv receives exactly
// len(buf) elements from the matching Send, and transfers between two ranks
// are matched in the order they were issued.
//
// An NCCL is not safe for concurrent use (its watchdog is its own).
type NCCL struct {
	d          *Device
	h          uintptr
	s          *Stream
	done       uintptr // event recorded after each call
	rank, size int
	scratch    device.Buffer // Barrier's word

	// mu guards what the watchdog shares with the calls: the handle h
	// (which an abort zeroes), the event done and what follows.
	mu sync.Mutex
	// aborted is the error every call returns after an abort.
	aborted error
	// issued counts the transfers issued (done is recorded after the
	// last), complete those known complete; watched are the contexts of
	// calls whose transfers are not.
	issued, complete uint64
	watched          []watchedCall
	// wake tells the watchdog of a transfer issued (buffered: one
	// pending wake is enough); stop ends it, and it closes stopped.
	wake, stop, stopped chan struct{}
}

// watchedCall is the context of a call whose transfer, the seq-th issued,
// the watchdog follows.
type watchedCall struct {
	seq  uint64
	what string
	ctx  context.Context
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
		c.wake, c.stop, c.stopped = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
		go c.watchdog()
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

// Close waits for the transfers issued (the watchdog still aborting the
// communicator where they fail or a call's context ends), stops the
// watchdog and destroys the communicator (after an abort, only frees it).
func (c *NCCL) Close() error {
	if c.stop == nil {
		return nil // closed before
	}
	c.mu.Lock()
	pending := c.aborted == nil && c.issued > c.complete
	c.mu.Unlock()
	var errs []error
	if pending {
		errs = append(errs, c.s.Synchronize())
	}
	close(c.stop)
	<-c.stopped
	c.stop = nil
	unlock, err := c.d.enter()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer unlock()
	c.mu.Lock()
	if c.h != 0 {
		if c.aborted != nil {
			err = ncclCheck("ncclCommAbort", nccl.commAbort(c.h))
		} else {
			err = ncclCheck("ncclCommDestroy", nccl.commDestroy(c.h))
		}
		c.h = 0
	}
	c.mu.Unlock()
	return errors.Join(append(errs, err, check("cuEventDestroy", drv.cuEventDestroy(c.done)), c.s.Close(), c.d.Free(c.scratch))...)
}

// ncclPoll is the watchdog's pause between two looks at the transfers
// outstanding: an error or the end of a call's context is acted on within
// it (the watchdog is off the path of the calls: nothing waits for its
// pauses).
const ncclPoll = time.Millisecond

// watchdog follows the transfers outstanding until Close: it looks at the
// completion event of the last one issued (they complete in issue order
// on the communicator's stream) and NCCL's asynchronous error, and the
// contexts of the calls not complete; an error or an ended context
// aborts the communicator. Its looks are no waits of the host's calls
// (HostCounts.Syncs does not count them).
func (c *NCCL) watchdog() {
	defer close(c.stopped)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	counts.ctxSets.Add(1)
	ctxErr := check("cuCtxSetCurrent", drv.cuCtxSetCurrent(c.d.ctx))
	for {
		var next <-chan time.Time // nil: nothing outstanding, sleep until a transfer is issued
		if c.look(ctxErr) {
			next = time.After(ncclPoll)
		}
		select {
		case <-c.stop:
			return
		case <-c.wake:
		case <-next:
		}
	}
}

// look is one look of the watchdog, with the device's context current
// (or ctxErr, the error of making it so); it reports whether transfers
// are still outstanding.
func (c *NCCL) look(ctxErr error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted != nil || c.h == 0 {
		c.watched = nil
		return false
	}
	if c.complete == c.issued {
		return false
	}
	what := "the transfers issued"
	if n := len(c.watched); n > 0 {
		what = c.watched[n-1].what
	}
	if ctxErr != nil {
		c.abortLocked(fmt.Errorf("cuda: following %s: %w", what, ctxErr))
		return false
	}
	switch r := drv.cuEventQuery(c.done); {
	case r == 0:
		// Every transfer issued so far is complete.
		c.watched = c.watched[:0]
		c.complete = c.issued
		return false
	case r != errNotReady:
		c.abortLocked(check("cuEventQuery after "+what, r))
		return false
	}
	var async int32
	if st := nccl.commGetAsyncError(c.h, &async); st != ncclSuccess {
		async = st
	}
	if async != ncclSuccess && async != ncclInProgress {
		c.abortLocked(fmt.Errorf("cuda: %s: %w", what, ncclResult(async)))
		return false
	}
	for _, w := range c.watched {
		if err := w.ctx.Err(); err != nil {
			c.abortLocked(fmt.Errorf("cuda: %s: %w", w.what, err))
			return false
		}
	}
	return true
}

// watch has the watchdog follow ctx until the seq-th transfer issued has
// completed (nothing for a context that never ends): one entry per
// context (per Done channel), however many calls share it. Call it with
// c.mu held.
func (c *NCCL) watch(ctx context.Context, seq uint64, what string) {
	if ctx == nil || ctx.Done() == nil || seq <= c.complete || c.aborted != nil {
		return // never ends, or nothing to follow
	}
	for i, w := range c.watched {
		if w.ctx.Done() == ctx.Done() {
			if seq > w.seq {
				c.watched[i] = watchedCall{seq, what, ctx}
			}
			return
		}
	}
	c.watched = append(c.watched, watchedCall{seq, what, ctx})
}

// start issues f and records the completion event after it, the watchdog
// following ctx until it completes; it returns the transfer's number
// among those outstanding. The communicator's methods hold its stream
// (Stream.Hold) for their calls to the driver and NCCL: one context switch
// a call, not one each.
func (c *NCCL) start(ctx context.Context, what string, f func() int32) (uint64, error) {
	unlock, err := c.s.enter() // held by the call issuing it
	if err != nil {
		return 0, err
	}
	defer unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted != nil {
		return 0, c.aborted
	}
	counts.launches.Add(1)
	if err := ncclCheck(what, f()); err != nil {
		return 0, c.abortLocked(err)
	}
	if err := check("cuEventRecord", drv.cuEventRecord(c.done, c.s.h)); err != nil {
		return 0, err
	}
	c.issued++
	c.watch(ctx, c.issued, what)
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return c.issued, nil
}

// abortLocked aborts the communicator for cause (c.mu held, the device's
// context current) and returns the error every later call returns too.
func (c *NCCL) abortLocked(cause error) error {
	if c.aborted == nil {
		c.aborted = fmt.Errorf("%w (rank %d of %d): %w", ErrNCCLAborted, c.rank, c.size, cause)
		if err := ncclCheck("ncclCommAbort", nccl.commAbort(c.h)); err != nil {
			c.aborted = fmt.Errorf("%w (and aborting it: %w)", c.aborted, err)
		}
		c.h = 0
		c.watched = nil
	}
	return c.aborted
}

// err returns the error of an aborted communicator, else nil.
func (c *NCCL) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.aborted
}

// xfer is one transfer, checked and ready to issue: f issues it (the
// device's context current; nil where there is nothing to issue, as for a
// one-rank all-reduce); n is what a request's Wait returns; streams are
// the streams of its buffers other than the communicator's, and host
// whether one of its buffers has no stream (the host then waits for it).
type xfer struct {
	what    string
	f       func() int32
	n       int
	streams []device.Stream
	host    bool
}

// bufs returns the device memory of comm.Device buffers of this GPU, of one
// NCCL type, and makes the communicator's stream wait for the work issued on
// their streams so far; x (when not nil) gets the buffers' streams.
func (c *NCCL) bufs(x *xfer, what string, bs ...comm.Buffer) ([]device.Buffer, int32, error) {
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
		switch {
		case d.Stream == nil:
			x.host = true
		case d.Stream != device.Stream(c.s) && !slices.Contains(x.streams, d.Stream):
			x.streams = append(x.streams, d.Stream)
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

// run issues x and orders its buffers' streams after it (nothing for a nil
// x or one without a call).
func (c *NCCL) run(ctx context.Context, x *xfer, err error) error {
	if err != nil || x == nil || x.f == nil {
		return err
	}
	seq, err := c.start(ctx, x.what, x.f)
	if err != nil {
		return err
	}
	return c.after(ctx, x, seq, &Event{d: c.d, h: c.done})
}

// after makes the streams of x's buffers wait on the device for ev, the
// completion of x's transfer; where a buffer has no stream, the host waits
// for it (the watchdog aborting the communicator if it fails or ctx ends
// first).
func (c *NCCL) after(ctx context.Context, x *xfer, seq uint64, ev *Event) error {
	for _, s := range x.streams {
		if err := s.Wait(ev); err != nil {
			return err
		}
	}
	if !x.host {
		return nil
	}
	// The host waits: the watchdog follows ctx meanwhile and aborts the
	// communicator when the transfer fails or ctx ends, which completes
	// the event.
	c.mu.Lock()
	c.watch(ctx, seq, x.what)
	c.mu.Unlock()
	if err := ev.Synchronize(); err != nil {
		if a := c.err(); a != nil {
			return a
		}
		return fmt.Errorf("cuda: waiting for %s: %w", x.what, err)
	}
	return c.err()
}

// istart issues x and returns its request.
func (c *NCCL) istart(ctx context.Context, x *xfer, err error) (comm.Request, error) {
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
	seq, err := c.start(ctx, x.what, x.f)
	if err != nil {
		return nil, err
	}
	ev, err := c.s.Record()
	if err != nil {
		return nil, err
	}
	return &ncclRequest{c: c, x: x, seq: seq, ev: ev.(*Event)}, nil
}

// doneRequest is a transfer that issued nothing: its Wait returns its
// elements at once.
type doneRequest int

// Wait returns the elements received.
func (r doneRequest) Wait(context.Context) (int, error) { return int(r), nil }

// ncclRequest is a transfer started by one of the I methods, the seq-th
// issued, complete at event ev.
type ncclRequest struct {
	c   *NCCL
	x   *xfer
	seq uint64
	ev  *Event
}

// Wait orders the streams of the transfer's buffers after it (without
// waiting on the host, except for a buffer without a stream) and returns
// the elements received; the watchdog aborts the communicator when the
// transfer fails or ctx ends before it completes.
func (r *ncclRequest) Wait(ctx context.Context) (int, error) {
	c := r.c
	c.mu.Lock()
	err := c.aborted
	c.watch(ctx, r.seq, r.x.what)
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if err := c.after(ctx, r.x, r.seq, r.ev); err != nil {
		return 0, err
	}
	return r.x.n, nil
}

var _ comm.Communicator = (*NCCL)(nil)

func (c *NCCL) allReduce(buf comm.Buffer) (*xfer, error) {
	x := &xfer{what: "ncclAllReduce"}
	b, dt, err := c.bufs(x, "AllReduce", buf)
	if err != nil || b[0].Len() == 0 {
		return nil, err
	}
	x.n = b[0].Len()
	if c.size == 1 { // one rank's sum is its buffer: no call
		return x, nil
	}
	x.f = func() int32 {
		return nccl.allReduce(addr(b[0]), addr(b[0]), uint64(b[0].Len()), dt, ncclSum, c.h, c.s.h)
	}
	return x, nil
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
func (c *NCCL) IAllReduceView(ctx context.Context, buf comm.Buffer, off, total int) (comm.Request, error) {
	defer c.s.Hold()()
	if err := comm.CheckView(off, buf.Len(), total); err != nil {
		return nil, fmt.Errorf("cuda: NCCL IAllReduceView: %w", err)
	}
	x, err := c.allReduce(buf)
	return c.istart(ctx, x, err)
}

func (c *NCCL) allGather(send, recv comm.Buffer) (*xfer, error) {
	x := &xfer{what: "ncclAllGather"}
	b, dt, err := c.bufs(x, "AllGather", send, recv)
	if err != nil {
		return nil, err
	}
	if recv.Len() != c.size*send.Len() {
		return nil, fmt.Errorf("cuda: NCCL AllGather: recv has %d elements, want %d·%d", recv.Len(), c.size, send.Len())
	}
	if send.Len() == 0 {
		return nil, nil
	}
	x.n = recv.Len()
	x.f = func() int32 {
		return nccl.allGather(addr(b[0]), addr(b[1]), uint64(b[0].Len()), dt, c.h, c.s.h)
	}
	return x, nil
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
func (c *NCCL) IAllGather(ctx context.Context, send, recv comm.Buffer) (comm.Request, error) {
	defer c.s.Hold()()
	if done, err := c.oneRank(send, recv); done || err != nil {
		if err != nil {
			return nil, err
		}
		return doneRequest(recv.Len()), nil
	}
	x, err := c.allGather(send, recv)
	return c.istart(ctx, x, err)
}

func (c *NCCL) allGatherV(send, recv comm.Buffer, counts []int) (*xfer, error) {
	x := &xfer{what: "ncclBroadcast (AllGatherV)"}
	b, dt, err := c.bufs(x, "AllGatherV", send, recv)
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
	x.n = total
	x.f = func() int32 {
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
	}
	return x, nil
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
	if c.size != 1 || c.err() != nil {
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
	x := &xfer{what: "ncclBroadcast"}
	b, dt, err := c.bufs(x, "Broadcast", buf)
	if err != nil || b[0].Len() == 0 {
		return err
	}
	if root < 0 || root >= c.size {
		return fmt.Errorf("cuda: NCCL Broadcast: root %d of %d ranks", root, c.size)
	}
	if c.size == 1 { // the root's buffer is everyone's: no call, no wait
		return nil
	}
	x.f = func() int32 {
		return nccl.broadcast(addr(b[0]), addr(b[0]), uint64(b[0].Len()), dt, int32(root), c.h, c.s.h)
	}
	return c.run(ctx, x, nil)
}

// sendRecv prepares a send to dst and a receive from src, grouped (a
// negative rank or an empty buffer leaves that half out). NCCL has no tags
// and no message lengths: a receive takes exactly len(recv) elements.
func (c *NCCL) sendRecv(send comm.Buffer, dst int, recv comm.Buffer, src int) (*xfer, error) {
	x := &xfer{what: "ncclSend/ncclRecv"}
	b, dt, err := c.bufs(x, "SendRecv", send, recv)
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
	if doRecv {
		x.n = b[1].Len()
	}
	x.f = func() int32 {
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
	}
	return x, nil
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
func (c *NCCL) ISend(ctx context.Context, buf comm.Buffer, dst, _ int) (comm.Request, error) {
	defer c.s.Hold()()
	x, err := c.sendRecv(buf, dst, nil, -1)
	return c.istart(ctx, x, err)
}

// IRecv starts Recv.
func (c *NCCL) IRecv(ctx context.Context, buf comm.Buffer, src, _ int) (comm.Request, error) {
	defer c.s.Hold()()
	x, err := c.sendRecv(nil, -1, buf, src)
	return c.istart(ctx, x, err)
}

// Barrier returns once every rank has entered it: an all-reduce of one
// word, which the host waits for (a buffer without a stream).
func (c *NCCL) Barrier(ctx context.Context) error {
	return c.AllReduce(ctx, comm.OnDevice(c.scratch, nil))
}
