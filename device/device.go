// Package device owns memory and execution on a compute device: typed
// buffers that live in host memory or on a GPU, streams and events that
// order work on a device, copies between devices, and the vector math the
// trainer applies to whole parameter vectors (optimizer steps, norms,
// scaling, clipping).
//
// The CPU implementation is in this package (CPU); buffers of the CPU are
// Go slices viewed without copies, its streams run work as it is issued and
// its events are complete when recorded. Package cuda implements the same
// interfaces for NVIDIA GPUs. The trainer, the models' executor and the
// reducers are written against these interfaces only, so that one data path
// runs on both devices (docs/design.md, "Workers: simulated, processes,
// GPUs").
//
// Buffers are values: a Buffer names a typed range of one device's memory
// (like a slice), and Slice makes sub-ranges without copying. Whoever
// allocates a buffer frees it (Device.Free); CPU buffers are Go memory and
// need no freeing.
package device

import (
	"errors"
	"fmt"
	"time"
	"unsafe"
)

// Kind is the kind of a device.
type Kind uint8

// The device kinds.
const (
	CPUKind Kind = iota + 1
	CUDAKind
)

// String returns "cpu" or "cuda".
func (k Kind) String() string {
	switch k {
	case CPUKind:
		return "cpu"
	case CUDAKind:
		return "cuda"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// DType is the element type of a Buffer.
type DType uint8

// The element types of buffers. Int64 holds Go ints (indices, labels,
// tokens) on 64-bit platforms.
const (
	Float32 DType = iota + 1
	Float64
	Int32
	Int64
	// Float16 is IEEE 754 half precision (binary16), held as its bits in
	// uint16 (Go has no half type; see ToFloat16 and FromFloat16): what
	// the communicators move for FP16 compression.
	Float16
)

// dtypes are the element types' names and sizes in bytes.
var dtypes = [...]struct {
	name string
	size int
}{Float32: {"float32", 4}, Float64: {"float64", 8}, Int32: {"int32", 4}, Int64: {"int64", 8}, Float16: {"float16", 2}}

// Size is the size of one element in bytes (0 for an unknown type).
func (d DType) Size() int {
	if int(d) < len(dtypes) {
		return dtypes[d].size
	}
	return 0
}

// String returns the type's name.
func (d DType) String() string {
	if int(d) < len(dtypes) && dtypes[d].name != "" {
		return dtypes[d].name
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// ErrUnavailable is wrapped by every error that says a device or one of its
// libraries cannot be used on this machine.
var ErrUnavailable = errors.New("device: unavailable")

// Device is a place where buffers live and work runs.
type Device interface {
	// Kind is CPUKind or CUDAKind.
	Kind() Kind
	// String describes the device, e.g. "cpu" or "cuda:0 (NVIDIA H100)".
	String() string
	// Alloc returns n zeroed elements of type dt.
	Alloc(dt DType, n int) (Buffer, error)
	// Free releases a buffer Alloc returned (not a slice of one).
	Free(b Buffer) error
	// Stream is the device's default stream.
	Stream() Stream
	// NewStream returns an additional stream; work on different streams
	// may overlap unless ordered with events.
	NewStream() (Stream, error)
	// Math is the device's vector math.
	Math() Math
	// Close releases the device's resources; buffers and streams become
	// invalid.
	Close() error
}

// Stream orders work on one device: operations issued on a stream run in
// issue order; on a GPU they run asynchronously to the host.
type Stream interface {
	// Device is the stream's device.
	Device() Device
	// Copy copies src into dst (same type and length); either may be a
	// host (CPU) buffer or a buffer of the stream's device. When src is
	// host memory, Copy returns once src may be reused; when dst is host
	// memory, dst holds the data once the stream is synchronized.
	Copy(dst, src Buffer) error
	// Synchronize waits until all work issued on the stream has completed.
	Synchronize() error
	// Record returns an event that completes when the work issued so far
	// has completed.
	Record() (Event, error)
	// Wait makes later work on this stream wait for e (without blocking
	// the host).
	Wait(e Event) error
}

// Event marks a point in a stream's work.
type Event interface {
	// Synchronize blocks until the event has completed.
	Synchronize() error
	// Time is when the event completed, on the host's clock, after
	// Synchronize; devices measure it with their own timers and map it to
	// the host clock, so differences between events of one device are
	// accurate. A time the device cannot read (its timer failed, the event
	// has not completed) is an error, never a zero time that would turn
	// into a bogus duration.
	Time() (time.Time, error)
}

// Elapsed is the time from event from to event to (both completed, of one
// device), or the error of reading either.
func Elapsed(from, to Event) (time.Duration, error) {
	t0, err := from.Time()
	if err != nil {
		return 0, err
	}
	t1, err := to.Time()
	if err != nil {
		return 0, err
	}
	return t1.Sub(t0), nil
}

// Buffer is n elements of one type in one device's memory. The zero Buffer
// is empty and belongs to no device.
type Buffer struct {
	dev  Device
	dt   DType
	n    int
	host unsafe.Pointer // first element, for host memory
	addr uintptr        // first element's device address, for device memory
}

// Len is the number of elements.
func (b Buffer) Len() int { return b.n }

// DType is the element type.
func (b Buffer) DType() DType { return b.dt }

// Device is the buffer's device (nil for the zero Buffer).
func (b Buffer) Device() Device { return b.dev }

// Bytes is the buffer's size in bytes.
func (b Buffer) Bytes() int { return b.n * b.dt.Size() }

// IsHost reports whether the buffer is host memory that Go code may read
// and write directly (always true on the CPU device).
func (b Buffer) IsHost() bool { return b.host != nil || (b.n == 0 && b.addr == 0) }

// Addr is the device address of the first element (0 for host memory).
func (b Buffer) Addr() uintptr { return b.addr }

// Slice returns elements [i, j) without copying. It panics if the range is
// out of bounds, as slicing a Go slice does.
func (b Buffer) Slice(i, j int) Buffer {
	if i < 0 || j < i || j > b.n {
		panic(fmt.Sprintf("device: slice [%d:%d] of a buffer of %d elements", i, j, b.n))
	}
	s := b
	s.n = j - i
	off := uintptr(i * b.dt.Size())
	if b.host != nil {
		// An empty slice holds no pointer: one past the end of host memory
		// would point into another object (or free memory) as far as the
		// garbage collector can tell.
		s.host = nil
		if s.n > 0 {
			s.host = unsafe.Add(b.host, off)
		}
	} else if b.addr != 0 {
		s.addr = b.addr + off
	}
	return s
}

// String describes the buffer.
func (b Buffer) String() string {
	where := "host"
	if b.dev != nil {
		where = b.dev.String()
	}
	return fmt.Sprintf("%d×%v on %s", b.n, b.dt, where)
}

// hostSlice is the elements of host buffer b, of type dt, as a slice
// that aliases it (nil for an empty buffer, wherever it is); it panics for
// another type and for device memory.
func hostSlice[E any](b Buffer, dt DType) []E {
	if b.n == 0 { // an empty buffer holds no memory to read
		return nil
	}
	if b.dt != dt {
		panic(fmt.Sprintf("device: %v buffer used as %v", b.dt, dt))
	}
	if !b.IsHost() {
		panic(fmt.Sprintf("device: %v is not host memory", b))
	}
	return unsafe.Slice((*E)(b.host), b.n)
}

// Float32s returns the elements of a host float32 buffer as a slice that
// aliases it. It panics for other types and for device memory (an empty
// buffer gives nil wherever it is).
func (b Buffer) Float32s() []float32 { return hostSlice[float32](b, Float32) }

// Float64s is Float32s for float64 buffers.
func (b Buffer) Float64s() []float64 { return hostSlice[float64](b, Float64) }

// Int32s is Float32s for int32 buffers.
func (b Buffer) Int32s() []int32 { return hostSlice[int32](b, Int32) }

// Int64s is Float32s for int64 buffers.
func (b Buffer) Int64s() []int64 { return hostSlice[int64](b, Int64) }

// Float16s is Float32s for float16 buffers: the elements' bits.
func (b Buffer) Float16s() []uint16 { return hostSlice[uint16](b, Float16) }

// HostBytes returns a host buffer's memory as bytes (no copy).
func (b Buffer) HostBytes() []byte {
	if b.n == 0 { // an empty buffer holds no memory, wherever it is
		return nil
	}
	if !b.IsHost() {
		panic(fmt.Sprintf("device: %v is not host memory", b))
	}
	return unsafe.Slice((*byte)(b.host), b.Bytes())
}

// Host wraps a Go slice as a CPU buffer without copying; a []uint16 is
// float16 (the bits of half-precision values).
func Host[E float32 | float64 | int32 | int64 | uint16](x []E) Buffer {
	var dt DType
	switch any(x).(type) {
	case []float32:
		dt = Float32
	case []float64:
		dt = Float64
	case []int32:
		dt = Int32
	case []int64:
		dt = Int64
	case []uint16:
		dt = Float16
	}
	b := Buffer{dev: CPU, dt: dt, n: len(x)}
	if len(x) > 0 {
		b.host = unsafe.Pointer(&x[0])
	}
	return b
}

// NewDeviceBuffer describes device memory at addr (for device
// implementations outside this package, such as package cuda).
func NewDeviceBuffer(dev Device, dt DType, n int, addr uintptr) Buffer {
	return Buffer{dev: dev, dt: dt, n: n, addr: addr}
}

// CheckSame returns an error unless a and b have the same type and length.
func CheckSame(what string, a, b Buffer) error {
	if a.dt != b.dt || a.n != b.n {
		return fmt.Errorf("device: %s: %v and %v differ in type or length", what, a, b)
	}
	return nil
}

// View returns n elements of type dt starting byteOffset bytes into b,
// sharing b's memory (an executor carves its values out of one arena this
// way). It panics if the view does not fit in b.
func (b Buffer) View(dt DType, byteOffset, n int) Buffer {
	if byteOffset < 0 || n < 0 || byteOffset+n*dt.Size() > b.Bytes() {
		panic(fmt.Sprintf("device: view of %d×%v at byte %d of %v", n, dt, byteOffset, b))
	}
	v := Buffer{dev: b.dev, dt: dt, n: n}
	if b.host != nil {
		if n > 0 { // no pointer past the end (see Slice)
			v.host = unsafe.Add(b.host, byteOffset)
		}
	} else if b.addr != 0 {
		v.addr = b.addr + uintptr(byteOffset)
	}
	return v
}
