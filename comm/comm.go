// Package comm owns communication between the workers of one data-parallel
// training job: the Communicator interface (modelled on torch.distributed: one
// interface, several backends), typed buffers, byte and time accounting, and the
// backends themselves (in-process goroutines in comm/local, Open MPI in
// comm/mpi, NCCL in cuda/).
//
// # Semantics shared by every backend
//
// All collective calls must be made by every rank of the communicator, in the
// same order, with buffers of matching types and sizes; point-to-point calls
// are matched by (source, destination, tag) in the order they were issued.
// Every call takes a context.Context: a cancelled context or an expired
// deadline makes the call return an error wrapping ctx.Err(). When one rank of
// a job fails, the pending and later calls of every other rank return an error
// that wraps ErrAborted and names the failing rank; nothing waits forever.
//
// # Deterministic sums
//
// Float32 addition is not associative, so the order in which an all-reduce
// adds the ranks' contributions changes the result's last bits.
// Every backend of this package uses the same canonical order, so that N
// simulated workers and N processes under mpirun compute bit-identical sums:
//
//   - The buffer of length L is cut into Size() chunks with ChunkBounds: chunk
//     c has L/n elements, plus one for the first L mod n chunks.
//   - Chunk j is the left-to-right sum of the ranks' values in rank
//     order j+1, j+2, …, n−1, 0, …, j (rank j added last): exactly the order a
//     ring reduce-scatter produces, in which rank j ends owning chunk j.
package comm

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
)

// ErrAborted is wrapped by every error a call returns because another rank of
// the job failed (returned an error, panicked, or died).
var ErrAborted = errors.New("comm: job aborted")

// DType is the element type of a Buffer: the project's one element type,
// device.DType. The communicators move Float32, Int32, Int64 and Float16.
type DType = device.DType

// The element types the communicators move.
const (
	Float32 = device.Float32
	Int32   = device.Int32
	Int64   = device.Int64
	// Float16 is half precision; an all-reduce of it adds in half
	// precision, each addition rounded to the nearest (device.AddFloat16),
	// in the canonical order, as NCCL's and Horovod's float16 sums do.
	Float16 = device.Float16
)

// Buffer is a typed slice handed to a communicator: Float32s, Int32s, Int64s
// or Float16s.
// Converting a slice is free: comm.Float32s(x) shares x's memory.
type Buffer interface {
	// Len is the number of elements.
	Len() int
	// DType is the element type.
	DType() DType
	// Bytes is the buffer's memory viewed as bytes (no copy).
	Bytes() []byte
	// Slice returns elements [i, j) as a Buffer of the same type (no copy).
	Slice(i, j int) Buffer
}

// Float32s is a Buffer of float32 elements.
type Float32s = Elems[float32]

// Int32s is a Buffer of int32 elements.
type Int32s = Elems[int32]

// Int64s is a Buffer of int64 elements.
type Int64s = Elems[int64]

// Float16s is a Buffer of half-precision elements, held as their bits
// (device.ToFloat16 and device.FromFloat16 convert).
type Float16s = Elems[uint16]

// Elems is the Buffer of a Go slice of elements in host memory: Float32s,
// Int32s, Int64s or Float16s.
type Elems[E float32 | int32 | int64 | uint16] []E

// Len returns the number of elements.
func (b Elems[E]) Len() int { return len(b) }

// DType returns the element type: Float32, Int32, Int64, or Float16 for
// Float16s.
func (b Elems[E]) DType() DType {
	switch any(b).(type) {
	case Float32s:
		return Float32
	case Int32s:
		return Int32
	case Int64s:
		return Int64
	}
	return Float16
}

// Bytes returns the elements' memory viewed as bytes (no copy).
func (b Elems[E]) Bytes() []byte { return bytesOf([]E(b)) }

// Slice returns elements [i, j) (no copy).
func (b Elems[E]) Slice(i, j int) Buffer { return b[i:j] }

func bytesOf[E float32 | int32 | int64 | uint16](s []E) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// Request is a non-blocking call in flight. Wait blocks until it completes (or
// ctx ends) and returns the number of elements received: the length of the
// receive buffer for collectives, the message length for a receive. Wait may be
// called once.
type Request interface {
	Wait(ctx context.Context) (int, error)
}

// Communicator connects the Size() ranks of one job. Its methods may be called
// from one goroutine at a time per rank, except that non-blocking requests may
// be waited on from any goroutine. Buffers must not be touched between the start
// of a non-blocking call and the return of its Wait.
type Communicator interface {
	// Rank is this worker's rank in [0, Size()).
	Rank() int
	// Size is the number of ranks.
	Size() int

	// AllReduce sums buf element-wise over all ranks, in place, in the
	// canonical order of the package documentation. Float32s, Int32s,
	// Int64s and Float16s are accepted.
	AllReduce(ctx context.Context, buf Buffer) error
	// AllGather concatenates every rank's send (all of the same length) into
	// recv, in rank order; recv.Len() must be Size()*send.Len().
	AllGather(ctx context.Context, send, recv Buffer) error
	// AllGatherV is AllGather with per-rank lengths: rank r contributes
	// counts[r] elements (send.Len() must equal counts[Rank()]) and recv, of
	// length sum(counts), receives them concatenated in rank order. Every rank
	// passes the same counts.
	AllGatherV(ctx context.Context, send, recv Buffer, counts []int) error
	// Broadcast copies root's buf into every rank's buf.
	Broadcast(ctx context.Context, buf Buffer, root int) error
	// Send delivers buf to rank dst with the given tag. It may return before
	// the message is received (the data has then been copied).
	Send(ctx context.Context, buf Buffer, dst, tag int) error
	// Recv receives a message from rank src with the given tag into buf and
	// returns its length; a message longer than buf is an error.
	Recv(ctx context.Context, buf Buffer, src, tag int) (int, error)
	// SendRecv sends send to dst and receives from src at the same time (both
	// with tag), and returns the received length; it cannot deadlock when
	// pairs of ranks exchange with each other.
	SendRecv(ctx context.Context, send Buffer, dst int, recv Buffer, src, tag int) (int, error)
	// Barrier returns once every rank has entered it.
	Barrier(ctx context.Context) error

	// IAllReduceView starts the all-reduce of a view: buf holds elements
	// [off, off+buf.Len()) of a vector of total elements, and each of its
	// elements is summed in the order AllReduce of the whole vector sums it
	// (ViewChunkBounds). Reducing the views of a partition of a vector one
	// by one gives the bits of one AllReduce of the vector (bucketed
	// all-reduce during the backward pass, as dense overlapped does). Every
	// rank passes the same off and total.
	IAllReduceView(ctx context.Context, buf Buffer, off, total int) (Request, error)
	// IAllGather starts AllGather and returns at once.
	IAllGather(ctx context.Context, send, recv Buffer) (Request, error)
	// ISend starts Send and returns at once.
	ISend(ctx context.Context, buf Buffer, dst, tag int) (Request, error)
	// IRecv starts Recv and returns at once.
	IRecv(ctx context.Context, buf Buffer, src, tag int) (Request, error)
}

// IAllReduce starts AllReduce of buf on c and returns at once: the
// all-reduce of the view that is the whole vector (IAllReduceView), so that
// backends and wrappers implement the non-blocking all-reduce once.
func IAllReduce(ctx context.Context, c Communicator, buf Buffer) (Request, error) {
	if buf == nil {
		return nil, errors.New("comm: IAllReduce: the buffer is nil; pass a Buffer such as comm.Float32s")
	}
	return c.IAllReduceView(ctx, buf, 0, buf.Len())
}

// ViewChunkBounds returns chunk c (ChunkBounds of total elements cut into
// n) restricted to the view of elements [off, off+length), as a range of the
// view: empty (lo == hi) where the chunk misses the view.
func ViewChunkBounds(total, off, length, n, c int) (lo, hi int) {
	lo, hi = ChunkBounds(total, n, c)
	lo = min(max(lo-off, 0), length)
	hi = min(max(hi-off, 0), length)
	return lo, max(lo, hi)
}

// CheckView checks the view arguments of IAllReduceView: the view
// [off, off+length) must lie in a vector of total elements.
func CheckView(off, length, total int) error {
	if off < 0 || length < 0 || off+length > total {
		return fmt.Errorf("the view [%d, %d) does not lie in a vector of %d elements; pass the view's offset and the whole vector's length", off, off+length, total)
	}
	return nil
}

// ChunkBounds returns the half-open range [lo, hi) of chunk c when length
// elements are cut into n near-equal chunks: the first length mod n chunks have
// one element more than the others.
func ChunkBounds(length, n, c int) (lo, hi int) {
	q, rem := length/n, length%n
	lo = c*q + min(c, rem)
	hi = lo + q
	if c < rem {
		hi++
	}
	return lo, hi
}
