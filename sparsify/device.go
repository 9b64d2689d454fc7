package sparsify

import (
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

// Reduction in device memory. Every core keeps its logic in one place for
// every device: its passes over whole vectors go through the Ops of its
// device (Options.Ops) on its stream (Options.Stream), its messages are
// comm.Device buffers of that device, and only counts and a few numbers per
// call come back to the host. The frame's Reduce of host slices is ReduceOn
// over host memory with the CPU's Ops, so the CPU path and the GPU path are
// the same code, and give the same index sets and the same bits wherever the
// communicator adds in the canonical order (package comm; NCCL adds in its
// own order, see comm).
//
// On a GPU, the communicator must take device buffers: NCCL (package cuda),
// or comm.Staged over comm/local or comm/mpi.

// vecs is a reducer's device: its stream, Ops and math, and its scratch
// buffers there.
type vecs struct {
	s   device.Stream
	d   device.Device
	ops Ops
	m   device.Math
}

// newVecs returns the device of options o (the CPU's when o.Stream is nil).
func newVecs(o Options) vecs {
	s := o.Stream
	if s == nil {
		s = device.CPU.Stream()
	}
	ops := o.Ops
	if ops == nil {
		ops = CPUOps()
	}
	return vecs{s: s, d: s.Device(), ops: ops, m: s.Device().Math()}
}

// onCPU reports whether the vectors live in host memory.
func (v *vecs) onCPU() bool { return v.d.Kind() == device.CPUKind }

// hold holds the reducer's stream for a burst of its calls where the
// stream can be held (a GPU's: Stream.Hold locks the OS thread with the
// device's context current once for the burst, not once per launch);
// call release when the burst is issued.
func (v *vecs) hold() (release func()) {
	if h, ok := v.s.(interface{ Hold() (release func()) }); ok {
		return h.Hold()
	}
	return func() {}
}

// scratch returns the first n elements of *b, a buffer of the device
// reallocated (contents lost) when shorter than n.
func (v *vecs) scratch(b *device.Buffer, dt device.DType, n int) (device.Buffer, error) {
	if b.Len() >= n && b.DType() == dt && b.Len() > 0 {
		return b.Slice(0, n), nil
	}
	if b.Len() > 0 {
		if err := v.d.Free(*b); err != nil {
			return device.Buffer{}, err
		}
		*b = device.Buffer{}
	}
	nb, err := v.d.Alloc(dt, max(n, 1, b.Len()*3/2))
	if err != nil {
		return device.Buffer{}, fmt.Errorf("allocating %d scratch elements on %v: %w", n, v.d, err)
	}
	*b = nb
	return nb.Slice(0, n), nil
}

// bounded is scratch's first n elements of *b where a call needs n of at
// most bound: on a device *b holds bound elements, allocated at once so
// that the calls after it allocate nothing (the lengths they need vary);
// on the CPU n.
func (v *vecs) bounded(b *device.Buffer, dt device.DType, n, bound int) (device.Buffer, error) {
	if v.onCPU() {
		return v.scratch(b, dt, n)
	}
	s, err := v.scratch(b, dt, max(n, bound))
	if err != nil {
		return device.Buffer{}, err
	}
	return s.Slice(0, n), nil
}

// compactAbove writes the positions of x's elements whose magnitude exceeds
// t, ascending, into *sel and their values into *val (scratch buffers,
// grown as needed) and returns how many there are.
func (v *vecs) compactAbove(sel, val *device.Buffer, x device.Buffer, t float32) (int, error) {
	s, err := v.scratch(sel, device.Int32, x.Len())
	if err != nil {
		return 0, err
	}
	m, err := v.ops.SelectAbove(v.s, s, device.Buffer{}, x, t)
	if err != nil {
		return 0, err
	}
	vv, err := v.bounded(val, device.Float32, m, x.Len())
	if err != nil {
		return 0, err
	}
	return m, v.ops.Gather(v.s, vv, x, s.Slice(0, m))
}

// cb returns b as a communicator buffer ordered by the stream.
func (v *vecs) cb(b device.Buffer) comm.Buffer { return comm.OnDevice(b, v.s) }

// upload copies host values into b (a buffer of the device).
func (v *vecs) upload(b device.Buffer, h []int32) error {
	if len(h) == 0 {
		return nil
	}
	return v.s.Copy(b.Slice(0, len(h)), device.Host(h))
}

// download copies the first len(h) elements of b to the host (the stream
// is synchronized).
func (v *vecs) download(h []int32, b device.Buffer) error {
	if len(h) == 0 {
		return nil
	}
	if err := v.s.Copy(device.Host(h), b.Slice(0, len(h))); err != nil {
		return err
	}
	return v.s.Synchronize()
}

// checkOn validates ReduceOn's arguments: vectors of the layout's length on
// the reducer's device, out not aliasing acc or residual.
func (v *vecs) checkOn(name string, n int, acc, out, residual device.Buffer) error {
	for _, a := range []struct {
		what string
		b    device.Buffer
	}{{"acc", acc}, {"out", out}, {"residual", residual}} {
		if a.b.Len() != n || a.b.DType() != device.Float32 {
			return fmt.Errorf("sparsify: %s: %s is %v; the layout has %d float32 elements: pass vectors of the layout's length", name, a.what, a.b, n)
		}
		if a.b.IsHost() != v.onCPU() || (!a.b.IsHost() && a.b.Device() != v.d) {
			return fmt.Errorf("sparsify: %s: %s is %v, not memory of the reducer's device %v (Options.Stream)", name, a.what, a.b, v.d)
		}
	}
	if sameMemory(out, acc) || sameMemory(out, residual) {
		return fmt.Errorf("sparsify: %s: out must not be the same vector as acc or residual (only residual may alias acc); give it its own buffer", name)
	}
	return nil
}

// sameMemory reports whether two vectors start at the same element.
func sameMemory(a, b device.Buffer) bool {
	if a.Len() == 0 || b.Len() == 0 || a.IsHost() != b.IsHost() {
		return false
	}
	if a.IsHost() {
		return &a.HostBytes()[0] == &b.HostBytes()[0]
	}
	return a.Addr() == b.Addr()
}

// denseScratch is the scratch of mergeOn and intersectOn on one device: a dense
// vector of sums and one of marks, N elements each, zero between calls (a
// fresh allocation is zero; every call clears what it set).
type denseScratch struct {
	sum, mark device.Buffer // Float32
	g         device.Buffer // Float32
	pos       device.Buffer // Int32
}

// mergeOn writes the sparse sum of lists — pairs of an Int32 index vector
// (distinct indices in [0, n)) and a Float32 value vector — into idx and
// val, indices ascending, and returns its length: where several lists have
// an index their values are added in list order, a lone value is kept as it
// is (package sparsify's mergeSum, for any number of lists). idx and val
// must hold the total length of the lists.
func (v *vecs) mergeOn(sc *denseScratch, n int, lists [][2]device.Buffer, idx, val device.Buffer) (int, error) {
	sum, err := v.scratch(&sc.sum, device.Float32, n)
	if err != nil {
		return 0, err
	}
	mark, err := v.scratch(&sc.mark, device.Float32, n)
	if err != nil {
		return 0, err
	}
	for _, l := range lists {
		if err := v.ops.ScatterAccum(v.s, sum, mark, l[0], l[1]); err != nil {
			return 0, err
		}
	}
	m, err := v.ops.SelectAbove(v.s, idx, device.Buffer{}, mark, 0.5)
	if err != nil {
		return 0, err
	}
	u := idx.Slice(0, m)
	if err := v.ops.Gather(v.s, val.Slice(0, m), sum, u); err != nil {
		return 0, err
	}
	if err := v.ops.ScatterFill(v.s, sum, u, 0); err != nil {
		return 0, err
	}
	return m, v.ops.ScatterFill(v.s, mark, u, 0)
}

// intersectOn writes the indices of b that are also in a (both Int32
// vectors of distinct indices in [0, n)) into out, in b's order, and
// returns how many; out must hold len(b).
func (v *vecs) intersectOn(sc *denseScratch, n int, a, b, out device.Buffer) (int, error) {
	mark, err := v.scratch(&sc.mark, device.Float32, n)
	if err != nil {
		return 0, err
	}
	g, err := v.bounded(&sc.g, device.Float32, b.Len(), n)
	if err != nil {
		return 0, err
	}
	pos, err := v.bounded(&sc.pos, device.Int32, b.Len(), n)
	if err != nil {
		return 0, err
	}
	if err := v.ops.ScatterFill(v.s, mark, a, 1); err != nil {
		return 0, err
	}
	if err := v.ops.Gather(v.s, g, mark, b); err != nil {
		return 0, err
	}
	m, err := v.ops.SelectAbove(v.s, pos, device.Buffer{}, g, 0.5)
	if err != nil {
		return 0, err
	}
	if err := v.ops.GatherIndex(v.s, out.Slice(0, m), b, pos.Slice(0, m)); err != nil {
		return 0, err
	}
	return m, v.ops.ScatterFill(v.s, mark, a, 0)
}
