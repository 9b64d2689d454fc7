package comm

import (
	"context"
	"fmt"
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

// DType returns the element type (0 for a type comm does not move).
func (b Device) DType() DType {
	switch b.Buf.DType() {
	case device.Float32:
		return Float32
	case device.Int32:
		return Int32
	case device.Int64:
		return Int64
	}
	return 0
}

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

// onDevice reports whether b is a Device buffer in device (not host) memory.
func onDevice(b Buffer) (Device, bool) {
	d, ok := b.(Device)
	return d, ok && d.Buf.Len() > 0 && !d.Buf.IsHost()
}

// Staged returns c, a communicator of host memory, made to take Device
// buffers in device memory too: each call copies them into host memory
// (on their stream, which it then synchronizes), runs c's call on the
// copies, and copies the results back (on the same stream). Sums are then
// c's, bit for bit (the canonical order of the package documentation).
// Host buffers pass through untouched.
//
// This is how device buffers travel over MPI (and in-process) when NCCL
// cannot be used; every byte crosses the host twice.
func Staged(c Communicator) Communicator { return &staged{c: c} }

type staged struct {
	c    Communicator
	mu   sync.Mutex
	pool [][]byte
}

// stage is one buffer argument of a call.
type stage struct {
	dev  Device
	host Buffer // what the inner communicator gets
	mem  []byte // pooled host memory of host (nil when b needed none)
}

func (s *staged) get(n int) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, b := range s.pool {
		if cap(b) >= n {
			s.pool = append(s.pool[:i], s.pool[i+1:]...)
			return b[:n]
		}
	}
	return make([]byte, n)
}

func (s *staged) put(b []byte) {
	if b == nil {
		return
	}
	s.mu.Lock()
	s.pool = append(s.pool, b)
	s.mu.Unlock()
}

// hostView returns mem as a host Buffer of dt with n elements.
func hostView(mem []byte, dt DType, n int) (Buffer, error) {
	switch dt {
	case Float32:
		return Float32s(viewAs[float32](mem, n)), nil
	case Int32:
		return Int32s(viewAs[int32](mem, n)), nil
	case Int64:
		return Int64s(viewAs[int64](mem, n)), nil
	}
	return nil, fmt.Errorf("comm: Staged: element type %v cannot be moved (float32, int32 and int64 can)", dt)
}

// viewAs views the first n elements of mem as E (no copy).
func viewAs[E float32 | int32 | int64](mem []byte, n int) []E {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*E)(unsafe.Pointer(&mem[0])), n)
}

// asDevice returns a host Buffer as a device.Buffer (for stream copies).
func asDevice(b Buffer) device.Buffer {
	switch v := b.(type) {
	case Float32s:
		return device.Host([]float32(v))
	case Int32s:
		return device.Host([]int32(v))
	case Int64s:
		return device.Host([]int64(v))
	}
	return b.(Device).Buf
}

// in stages b; with load its contents are copied to the host first.
func (s *staged) in(b Buffer, load bool) (stage, error) {
	d, ok := onDevice(b)
	if !ok {
		return stage{host: b}, nil
	}
	if d.Stream == nil {
		return stage{}, fmt.Errorf("comm: Staged: %v has no stream", d.Buf)
	}
	mem := s.get(d.Buf.Bytes())
	h, err := hostView(mem, d.DType(), d.Len())
	if err != nil {
		s.put(mem)
		return stage{}, err
	}
	st := stage{dev: d, host: h, mem: mem}
	if load {
		if err := d.Stream.Copy(asDevice(h), d.Buf); err != nil {
			s.put(mem)
			return stage{}, fmt.Errorf("comm: Staged: copying %v to the host: %w", d.Buf, err)
		}
		if err := d.Stream.Synchronize(); err != nil {
			s.put(mem)
			return stage{}, fmt.Errorf("comm: Staged: copying %v to the host: %w", d.Buf, err)
		}
	}
	return st, nil
}

// out copies the first n elements of a staged result back and releases
// the memory.
func (s *staged) out(st stage, n int) error {
	if st.mem == nil {
		return nil
	}
	defer s.put(st.mem)
	if n == 0 {
		return nil
	}
	if err := st.dev.Stream.Copy(st.dev.Buf.Slice(0, n), asDevice(st.host).Slice(0, n)); err != nil {
		return fmt.Errorf("comm: Staged: copying the result to %v: %w", st.dev.Buf, err)
	}
	// The copy may read the host memory after it is issued: the memory
	// goes back to the pool (and to the next call) only once it is done.
	if err := st.dev.Stream.Synchronize(); err != nil {
		return fmt.Errorf("comm: Staged: copying the result to %v: %w", st.dev.Buf, err)
	}
	return nil
}

// release returns staged memory without copying anything back.
func (s *staged) release(sts ...stage) {
	for _, st := range sts {
		s.put(st.mem)
	}
}

func (s *staged) Rank() int { return s.c.Rank() }
func (s *staged) Size() int { return s.c.Size() }

// inOut runs f on buf staged in and out (in-place calls).
func (s *staged) inOut(buf Buffer, f func(Buffer) error) error {
	st, err := s.in(buf, true)
	if err != nil {
		return err
	}
	if err := f(st.host); err != nil {
		s.release(st)
		return err
	}
	return s.out(st, buf.Len())
}

// sendRecv runs f on send staged in and recv staged out.
func (s *staged) sendRecv(send, recv Buffer, f func(send, recv Buffer) error) error {
	a, err := s.in(send, true)
	if err != nil {
		return err
	}
	b, err := s.in(recv, false)
	if err != nil {
		s.release(a)
		return err
	}
	if err := f(a.host, b.host); err != nil {
		s.release(a, b)
		return err
	}
	s.release(a)
	return s.out(b, recv.Len())
}

func (s *staged) AllReduce(ctx context.Context, buf Buffer) error {
	return s.inOut(buf, func(b Buffer) error { return s.c.AllReduce(ctx, b) })
}

func (s *staged) AllGather(ctx context.Context, send, recv Buffer) error {
	return s.sendRecv(send, recv, func(a, b Buffer) error { return s.c.AllGather(ctx, a, b) })
}

func (s *staged) AllGatherV(ctx context.Context, send, recv Buffer, counts []int) error {
	return s.sendRecv(send, recv, func(a, b Buffer) error { return s.c.AllGatherV(ctx, a, b, counts) })
}

func (s *staged) Broadcast(ctx context.Context, buf Buffer, root int) error {
	return s.inOut(buf, func(b Buffer) error { return s.c.Broadcast(ctx, b, root) })
}

func (s *staged) ReduceScatter(ctx context.Context, send, recv Buffer, counts []int) error {
	return s.sendRecv(send, recv, func(a, b Buffer) error { return s.c.ReduceScatter(ctx, a, b, counts) })
}

func (s *staged) Send(ctx context.Context, buf Buffer, dst, tag int) error {
	st, err := s.in(buf, true)
	if err != nil {
		return err
	}
	defer s.release(st)
	return s.c.Send(ctx, st.host, dst, tag)
}

func (s *staged) Recv(ctx context.Context, buf Buffer, src, tag int) (int, error) {
	st, err := s.in(buf, false)
	if err != nil {
		return 0, err
	}
	n, err := s.c.Recv(ctx, st.host, src, tag)
	if err != nil {
		s.release(st)
		return 0, err
	}
	return n, s.out(st, n)
}

func (s *staged) SendRecv(ctx context.Context, send Buffer, dst int, recv Buffer, src, tag int) (int, error) {
	a, err := s.in(send, true)
	if err != nil {
		return 0, err
	}
	b, err := s.in(recv, false)
	if err != nil {
		s.release(a)
		return 0, err
	}
	n, err := s.c.SendRecv(ctx, a.host, dst, b.host, src, tag)
	s.release(a)
	if err != nil {
		s.release(b)
		return 0, err
	}
	return n, s.out(b, n)
}

func (s *staged) Barrier(ctx context.Context) error { return s.c.Barrier(ctx) }

// stagedRequest finishes a non-blocking call: it waits for the inner
// request, then copies the results back.
type stagedRequest struct {
	s       *staged
	r       Request
	keep    []stage // released after the call
	results []stage // copied back, then released
}

func (r *stagedRequest) Wait(ctx context.Context) (int, error) {
	n, err := r.r.Wait(ctx)
	r.s.release(r.keep...)
	if err != nil {
		r.s.release(r.results...)
		return 0, err
	}
	for _, st := range r.results {
		if err := r.s.out(st, min(n, st.host.Len())); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func (s *staged) IAllReduce(ctx context.Context, buf Buffer) (Request, error) {
	st, err := s.in(buf, true)
	if err != nil {
		return nil, err
	}
	r, err := s.c.IAllReduce(ctx, st.host)
	if err != nil {
		s.release(st)
		return nil, err
	}
	return &stagedRequest{s: s, r: r, results: []stage{st}}, nil
}

// istart stages send and recv of a non-blocking call.
func (s *staged) istart(send, recv Buffer, start func(a, b Buffer) (Request, error)) (Request, error) {
	a, err := s.in(send, true)
	if err != nil {
		return nil, err
	}
	b, err := s.in(recv, false)
	if err != nil {
		s.release(a)
		return nil, err
	}
	r, err := start(a.host, b.host)
	if err != nil {
		s.release(a, b)
		return nil, err
	}
	return &stagedRequest{s: s, r: r, keep: []stage{a}, results: []stage{b}}, nil
}

func (s *staged) IAllGather(ctx context.Context, send, recv Buffer) (Request, error) {
	return s.istart(send, recv, func(a, b Buffer) (Request, error) { return s.c.IAllGather(ctx, a, b) })
}

func (s *staged) IAllGatherV(ctx context.Context, send, recv Buffer, counts []int) (Request, error) {
	return s.istart(send, recv, func(a, b Buffer) (Request, error) { return s.c.IAllGatherV(ctx, a, b, counts) })
}

func (s *staged) ISend(ctx context.Context, buf Buffer, dst, tag int) (Request, error) {
	st, err := s.in(buf, true)
	if err != nil {
		return nil, err
	}
	r, err := s.c.ISend(ctx, st.host, dst, tag)
	if err != nil {
		s.release(st)
		return nil, err
	}
	return &stagedRequest{s: s, r: r, keep: []stage{st}}, nil
}

func (s *staged) IRecv(ctx context.Context, buf Buffer, src, tag int) (Request, error) {
	st, err := s.in(buf, false)
	if err != nil {
		return nil, err
	}
	r, err := s.c.IRecv(ctx, st.host, src, tag)
	if err != nil {
		s.release(st)
		return nil, err
	}
	return &stagedRequest{s: s, r: r, results: []stage{st}}, nil
}
