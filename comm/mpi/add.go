package mpi

import (
	"unsafe"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

// add sets dst[i] = a[i] + b[i] for byte slices holding elements of type dt
// (dst may be b). The three slices have the same length.
func add(dt comm.DType, dst, a, b []byte) {
	if len(dst) == 0 {
		return
	}
	switch dt {
	case comm.Float32:
		addF32(view[float32](dst), view[float32](a), view[float32](b))
	case comm.Int32:
		addInt(view[int32](dst), view[int32](a), view[int32](b))
	case comm.Int64:
		addInt(view[int64](dst), view[int64](a), view[int64](b))
	case comm.Float16:
		d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
		for i := range d {
			d[i] = device.AddFloat16(x[i], y[i])
		}
	}
}

func view[E float32 | int32 | int64 | uint16](b []byte) []E {
	var z E
	return unsafe.Slice((*E)(unsafe.Pointer(&b[0])), len(b)/int(unsafe.Sizeof(z)))
}

// addF32 is dst = a + b, unrolled by eight.
func addF32(dst, a, b []float32) {
	n := len(dst)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		d := dst[i : i+8 : i+8]
		x := a[i : i+8 : i+8]
		y := b[i : i+8 : i+8]
		d[0] = x[0] + y[0]
		d[1] = x[1] + y[1]
		d[2] = x[2] + y[2]
		d[3] = x[3] + y[3]
		d[4] = x[4] + y[4]
		d[5] = x[5] + y[5]
		d[6] = x[6] + y[6]
		d[7] = x[7] + y[7]
	}
	for ; i < n; i++ {
		dst[i] = a[i] + b[i]
	}
}

func addInt[E int32 | int64](dst, a, b []E) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}
