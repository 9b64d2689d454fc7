package comm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
)

// Device is a Buffer in a device's memory (package device) together with
// the stream that orders it: a backend issues its transfers of the buffer on
// Stream after the work already issued there, and when a call (or a
// request's Wait) returns, its results are in the buffer for the work issued
// on Stream afterwards; the host sees them after Stream.Synchronize().
//
// Backends that move device memory themselves (NCCL, in package cuda) take
// Device buffers of their GPU; the host backends (comm/local, comm/mpi) take
// them through Staged. A Device buffer in host memory (device.Host) is a
// host buffer like Float32s and works with every backend.
type Device struct {
	Buf    device.Buffer
	Stream device.Stream
}

// OnDevice returns b as a Buffer ordered by stream s.
func OnDevice(b device.Buffer, s device.Stream) Device { return Device{Buf: b, Stream: s} }

// Len returns the number of elements.
func (b Device) Len() int { return b.Buf.Len() }

// DType returns the element type of the device buffer.
func (b Device) DType() DType { return b.Buf.DType() }

// Bytes returns host memory viewed as bytes; it panics for device memory,
// which only a backend that moves device memory (or Staged) can handle.
func (b Device) Bytes() []byte {
	if b.Buf.Len() > 0 && !b.Buf.IsHost() {
		panic(fmt.Sprintf("comm: the host bytes of %v: this communicator does not move device memory (wrap it with comm.Staged)", b.Buf))
	}
	return b.Buf.HostBytes()
}

// Slice returns elements [i, j) (no copy).
func (b Device) Slice(i, j int) Buffer { return Device{Buf: b.Buf.Slice(i, j), Stream: b.Stream} }

// InDeviceMemory returns b as a Device buffer when it is one in device (not
// host) memory and not empty.
func InDeviceMemory(b Buffer) (Device, bool) {
	d, ok := b.(Device)
	return d, ok && d.Buf.Len() > 0 && !d.Buf.IsHost()
}

// PeerDevice is implemented by devices whose memory the in-process ranks
// using them reduce directly (cuda.Device): comm/local's collectives on
// Device buffers all of one such device, or of several that reach each
// other's memory (Reaches: GPUs with peer access), add on the devices, in
// the canonical order, and gather by device-to-device copies; nothing
// crosses the host and the host waits for nothing.
type PeerDevice interface {
	device.Device
	// MaxPeers is the most buffers one PeerSum adds.
	MaxPeers() int
	// Reaches reports whether this device's PeerSum and its streams'
	// copies take memory of device o too (o itself always), enabling that
	// access on the first ask where it needs enabling.
	Reaches(o device.Device) bool
	// PeerSum adds, on stream s (of this device), elements [lo, lo+n) of
	// bufs (memory of devices it Reaches) element by element, left to
	// right in the order given (bit for bit the host's additions in that
	// order), and stores the sums into out[0, n) or, where out is empty,
	// back into elements [lo, lo+n) of every one of bufs.
	PeerSum(s device.Stream, bufs []device.Buffer, lo, n int, out device.Buffer) error
}

// PinnedHost is implemented by devices that allocate page-locked host
// memory (cuda.Device): their streams copy to and from it asynchronously,
// at the bus's speed. Staging through host memory uses it where the
// device has it.
type PinnedHost interface {
	// AllocPinned returns n bytes of page-locked host memory, kept for
	// the life of the process.
	AllocPinned(n int) ([]byte, error)
}

// DeviceMover is implemented by communicators whose calls take Device
// buffers in device memory themselves (comm/local): Staged passes every
// call through.
type DeviceMover interface {
	// MovesDevice reports whether every call takes Device buffers in
	// device memory.
	MovesDevice() bool
}

// Staged returns c, a communicator of host memory, made to take Device
// buffers in device memory too: each call copies them into host memory
// (on their stream, which it then synchronizes), runs c's call on the
// copies, and copies the results back (on the same stream, without
// waiting: the host memory is reused once that copy is done). Sums are
// then c's, bit for bit (the canonical order of the package
// documentation). Host buffers pass through untouched. The host memory is
// page-locked where the buffers' device allocates it (PinnedHost), from a
// pool the process keeps.
//
// This is how device buffers travel over MPI without CUDA-aware transport;
// every byte crosses the host twice. Where c is a DeviceMover (comm/local),
// its calls get the Device buffers themselves.
func Staged(c Communicator) Communicator {
	m, ok := c.(DeviceMover)
	return &staged{c: c, collectives: ok && m.MovesDevice()}
}

type staged struct {
	c Communicator
	// collectives: c's calls take device buffers themselves (a
	// DeviceMover).
	collectives bool
}

// hostBlock is a block of staging memory.
type hostBlock struct {
	mem []byte
	// busy is the copy that last read mem (nil: none pending).
	busy device.Event
}

// stagePool is the process's staging memory, shared by every Staged
// communicator and comm/local's staging: blocks are taken for one buffer
// of one call and given back with the copy still reading them.
var stagePool struct {
	mu   sync.Mutex
	free []*hostBlock
}

// eventDone reports whether ev has completed, without waiting where the
// event can say so (cuda.Event's Done).
func eventDone(ev device.Event) bool {
	if ev == nil {
		return true
	}
	if q, ok := ev.(interface{ Done() bool }); ok {
		return q.Done()
	}
	return false
}

// getBlock returns a block of at least n bytes: a free one whose copies
// are done where there is one (else the smallest that fits, waited for),
// else a new one, page-locked where dev allocates that.
func getBlock(n int, dev device.Device) (*hostBlock, error) {
	stagePool.mu.Lock()
	best := -1
	for i, b := range stagePool.free {
		if cap(b.mem) < n {
			continue
		}
		if best < 0 || (eventDone(b.busy) && !eventDone(stagePool.free[best].busy)) ||
			(eventDone(b.busy) == eventDone(stagePool.free[best].busy) && cap(b.mem) < cap(stagePool.free[best].mem)) {
			best = i
		}
	}
	if best >= 0 {
		b := stagePool.free[best]
		stagePool.free = slices.Delete(stagePool.free, best, best+1)
		stagePool.mu.Unlock()
		if b.busy != nil {
			if err := b.busy.Synchronize(); err != nil {
				return nil, err
			}
			b.busy = nil
		}
		return b, nil
	}
	stagePool.mu.Unlock()
	size := 4096
	for size < n {
		size *= 2
	}
	if p, ok := dev.(PinnedHost); ok {
		mem, err := p.AllocPinned(size)
		if err != nil {
			return nil, fmt.Errorf("comm: staging memory for %d bytes: %w", n, err)
		}
		return &hostBlock{mem: mem}, nil
	}
	return &hostBlock{mem: make([]byte, size)}, nil
}

// putBlock gives b back; busy is the copy still reading it (nil: none).
func putBlock(b *hostBlock, busy device.Event) {
	if b == nil {
		return
	}
	b.busy = busy
	stagePool.mu.Lock()
	stagePool.free = append(stagePool.free, b)
	stagePool.mu.Unlock()
}

// Stage is a Device buffer staged through host memory for a host
// communicator: Host is its host copy.
type Stage struct {
	dev  Device
	s    device.Stream
	host Buffer
	blk  *hostBlock
}

// StageBuffer stages b, a Device buffer in device memory, for a call of a
// host communicator: its copies run on stream s (nil: b's own stream);
// with load, its contents are copied to the host first (s is then
// synchronized).
func StageBuffer(b Device, s device.Stream, load bool) (*Stage, error) {
	if s == nil {
		s = b.Stream
	}
	if s == nil {
		return nil, fmt.Errorf("comm: staging %v: no stream", b.Buf)
	}
	blk, err := getBlock(b.Buf.Bytes(), b.Buf.Device())
	if err != nil {
		return nil, err
	}
	h, err := HostView(blk.mem, b.DType(), b.Len())
	if err != nil {
		putBlock(blk, nil)
		return nil, err
	}
	st := &Stage{dev: b, s: s, host: h, blk: blk}
	if load {
		if err := s.Copy(AsDevice(h), b.Buf); err != nil {
			st.Release()
			return nil, fmt.Errorf("comm: copying %v to the host: %w", b.Buf, err)
		}
		if err := s.Synchronize(); err != nil {
			st.Release()
			return nil, fmt.Errorf("comm: copying %v to the host: %w", b.Buf, err)
		}
	}
	return st, nil
}

// Host is the staged buffer's host copy.
func (st *Stage) Host() Buffer { return st.host }

// CopyBack copies the first n elements of the host copy back into the
// device buffer, on the stage's stream, and releases the host memory once
// that copy is done (the host does not wait). It returns the event of the
// copy (nil for n = 0).
func (st *Stage) CopyBack(n int) (device.Event, error) {
	if n == 0 {
		st.Release()
		return nil, nil
	}
	if err := st.s.Copy(st.dev.Buf.Slice(0, n), AsDevice(st.host).Slice(0, n)); err != nil {
		st.Release()
		return nil, fmt.Errorf("comm: copying the result to %v: %w", st.dev.Buf, err)
	}
	ev, err := st.s.Record()
	if err != nil {
		// Without an event the memory goes back only once the copy is
		// known to be done.
		err = errors.Join(err, st.s.Synchronize())
		st.Release()
		return nil, fmt.Errorf("comm: copying the result to %v: %w", st.dev.Buf, err)
	}
	putBlock(st.blk, ev)
	st.blk = nil
	return ev, nil
}

// Release gives the host memory back without copying anything (no copy of
// it may be pending).
func (st *Stage) Release() {
	if st != nil && st.blk != nil {
		putBlock(st.blk, nil)
		st.blk = nil
	}
}

// HostView returns the first n elements of type dt in mem as a host
// Buffer (no copy).
func HostView(mem []byte, dt DType, n int) (Buffer, error) {
	switch dt {
	case Float32:
		return Float32s(viewAs[float32](mem, n)), nil
	case Int32:
		return Int32s(viewAs[int32](mem, n)), nil
	case Int64:
		return Int64s(viewAs[int64](mem, n)), nil
	case Float16:
		return Float16s(viewAs[uint16](mem, n)), nil
	}
	return nil, fmt.Errorf("comm: element type %v cannot be moved (float32, int32, int64 and float16 can)", dt)
}

// viewAs views the first n elements of mem as E (no copy).
func viewAs[E float32 | int32 | int64 | uint16](mem []byte, n int) []E {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*E)(unsafe.Pointer(&mem[0])), n)
}

// AsDevice returns b as a device.Buffer, for stream copies: a Device
// buffer's own, host memory for the host buffers (the zero Buffer for
// another type).
func AsDevice(b Buffer) device.Buffer {
	switch v := b.(type) {
	case Device:
		return v.Buf
	case Float32s:
		return device.Host([]float32(v))
	case Int32s:
		return device.Host([]int32(v))
	case Int64s:
		return device.Host([]int64(v))
	case Float16s:
		return device.Host([]uint16(v))
	}
	return device.Buffer{}
}

// stage is one buffer argument of a call.
type stage struct {
	host Buffer // what the inner communicator gets
	st   *Stage // nil when the buffer needed none
}

// in stages b; with load its contents are copied to the host first.
func (s *staged) in(b Buffer, load bool) (stage, error) {
	d, ok := InDeviceMemory(b)
	if !ok {
		return stage{host: b}, nil
	}
	st, err := StageBuffer(d, nil, load)
	if err != nil {
		return stage{}, fmt.Errorf("comm: Staged: %w", err)
	}
	return stage{host: st.Host(), st: st}, nil
}

// out copies the first n elements of a staged result back and releases
// the memory (once the copy is done).
func (s *staged) out(st stage, n int) error {
	if st.st == nil {
		return nil
	}
	_, err := st.st.CopyBack(n)
	if err != nil {
		return fmt.Errorf("comm: Staged: %w", err)
	}
	return nil
}

// release returns staged memory without copying anything back.
func (s *staged) release(sts ...stage) {
	for _, st := range sts {
		st.st.Release()
	}
}

func (s *staged) Rank() int { return s.c.Rank() }
func (s *staged) Size() int { return s.c.Size() }

// call runs f on the host copies of its buffers: in, loaded and released
// after the call, and out, loaded where load and copied back after it (f
// returns how many of its elements). Either may be nil.
func (s *staged) call(in, out Buffer, load bool, f func(in, out Buffer) (int, error)) (int, error) {
	a, err := s.in(in, true)
	if err != nil {
		return 0, err
	}
	b, err := s.in(out, load)
	if err != nil {
		s.release(a)
		return 0, err
	}
	n, err := f(a.host, b.host)
	s.release(a)
	if err != nil {
		s.release(b)
		return 0, err
	}
	return n, s.out(b, n)
}

func (s *staged) AllReduce(ctx context.Context, buf Buffer) error {
	if s.collectives {
		return s.c.AllReduce(ctx, buf)
	}
	_, err := s.call(nil, buf, true, func(_, b Buffer) (int, error) { return buf.Len(), s.c.AllReduce(ctx, b) })
	return err
}

func (s *staged) AllGather(ctx context.Context, send, recv Buffer) error {
	if s.collectives {
		return s.c.AllGather(ctx, send, recv)
	}
	_, err := s.call(send, recv, false, func(a, b Buffer) (int, error) { return recv.Len(), s.c.AllGather(ctx, a, b) })
	return err
}

func (s *staged) AllGatherV(ctx context.Context, send, recv Buffer, counts []int) error {
	if s.collectives {
		return s.c.AllGatherV(ctx, send, recv, counts)
	}
	_, err := s.call(send, recv, false, func(a, b Buffer) (int, error) { return recv.Len(), s.c.AllGatherV(ctx, a, b, counts) })
	return err
}

func (s *staged) Broadcast(ctx context.Context, buf Buffer, root int) error {
	if s.collectives {
		return s.c.Broadcast(ctx, buf, root)
	}
	_, err := s.call(nil, buf, true, func(_, b Buffer) (int, error) { return buf.Len(), s.c.Broadcast(ctx, b, root) })
	return err
}

func (s *staged) Send(ctx context.Context, buf Buffer, dst, tag int) error {
	if s.collectives {
		return s.c.Send(ctx, buf, dst, tag)
	}
	_, err := s.call(buf, nil, false, func(a, _ Buffer) (int, error) { return 0, s.c.Send(ctx, a, dst, tag) })
	return err
}

func (s *staged) Recv(ctx context.Context, buf Buffer, src, tag int) (int, error) {
	if s.collectives {
		return s.c.Recv(ctx, buf, src, tag)
	}
	return s.call(nil, buf, false, func(_, b Buffer) (int, error) { return s.c.Recv(ctx, b, src, tag) })
}

func (s *staged) SendRecv(ctx context.Context, send Buffer, dst int, recv Buffer, src, tag int) (int, error) {
	if s.collectives {
		return s.c.SendRecv(ctx, send, dst, recv, src, tag)
	}
	return s.call(send, recv, false, func(a, b Buffer) (int, error) { return s.c.SendRecv(ctx, a, dst, b, src, tag) })
}

func (s *staged) Barrier(ctx context.Context) error { return s.c.Barrier(ctx) }

// stagedRequest finishes a non-blocking call: it waits for the inner
// request, releases the in buffer's copy and copies the out buffer's back.
type stagedRequest struct {
	s       *staged
	r       Request
	in, out stage
}

func (r *stagedRequest) Wait(ctx context.Context) (int, error) {
	n, err := r.r.Wait(ctx)
	r.s.release(r.in)
	if err != nil {
		r.s.release(r.out)
		return 0, err
	}
	if r.out.st != nil {
		if err := r.s.out(r.out, min(n, r.out.host.Len())); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// istart is call for a non-blocking call: the out buffer is copied back
// when its request's Wait returns.
func (s *staged) istart(in, out Buffer, load bool, start func(in, out Buffer) (Request, error)) (Request, error) {
	a, err := s.in(in, true)
	if err != nil {
		return nil, err
	}
	b, err := s.in(out, load)
	if err != nil {
		s.release(a)
		return nil, err
	}
	r, err := start(a.host, b.host)
	if err != nil {
		s.release(a, b)
		return nil, err
	}
	return &stagedRequest{s: s, r: r, in: a, out: b}, nil
}

func (s *staged) IAllReduceView(ctx context.Context, buf Buffer, off, total int) (Request, error) {
	if s.collectives {
		return s.c.IAllReduceView(ctx, buf, off, total)
	}
	return s.istart(nil, buf, true, func(_, b Buffer) (Request, error) { return s.c.IAllReduceView(ctx, b, off, total) })
}

func (s *staged) IAllGather(ctx context.Context, send, recv Buffer) (Request, error) {
	if s.collectives {
		return s.c.IAllGather(ctx, send, recv)
	}
	return s.istart(send, recv, false, func(a, b Buffer) (Request, error) { return s.c.IAllGather(ctx, a, b) })
}

func (s *staged) ISend(ctx context.Context, buf Buffer, dst, tag int) (Request, error) {
	if s.collectives {
		return s.c.ISend(ctx, buf, dst, tag)
	}
	return s.istart(buf, nil, false, func(a, _ Buffer) (Request, error) { return s.c.ISend(ctx, a, dst, tag) })
}

func (s *staged) IRecv(ctx context.Context, buf Buffer, src, tag int) (Request, error) {
	if s.collectives {
		return s.c.IRecv(ctx, buf, src, tag)
	}
	return s.istart(nil, buf, false, func(_, b Buffer) (Request, error) { return s.c.IRecv(ctx, b, src, tag) })
}
