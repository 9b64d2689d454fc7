package local

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

// gate is a one-shot barrier for the n ranks of a slot.
type gate struct {
	count atomic.Int32
	ch    chan struct{}
}

// arrive counts this rank in; the last of n closes the gate.
func (g *gate) arrive(n int) {
	if int(g.count.Add(1)) == n {
		close(g.ch)
	}
}

// entry is what one rank publishes for a collective call.
type entry struct {
	op     comm.Op
	dtype  comm.DType
	send   comm.Buffer // the buffer of AllReduce and Broadcast
	recv   comm.Buffer
	length int // buffer length (AllReduce, Broadcast) or send length (AllGather)
	counts []int
	root   int
	dev    *devCall // the device side of a call on device buffers (nil: none)
}

// slot is the rendezvous of one collective call, shared by all ranks.
type slot struct {
	// end is when the call ends on the emulated network: its modelled
	// time after the last rank joined, or after the network's previous
	// collective ended if that is later (one call on the wire at a time,
	// World.linkFree); written before arrived closes.
	end                   time.Time
	entries               []entry
	arrived, staged, done gate
	left                  atomic.Int32
	joined                []atomic.Bool
	// peer says a call on device buffers runs on the ranks' devices (false:
	// staged through host memory), decided once (device.go).
	peerOnce sync.Once
	peer     bool
}

func (w *World) slot(seq uint64) *slot {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.slots[seq]
	if s == nil {
		s = &slot{entries: make([]entry, w.n), joined: make([]atomic.Bool, w.n)}
		s.arrived.ch = make(chan struct{})
		s.staged.ch = make(chan struct{})
		s.done.ch = make(chan struct{})
		w.slots[seq] = s
	}
	return s
}

func (w *World) leave(seq uint64, s *slot) {
	if int(s.left.Add(1)) == w.n {
		w.mu.Lock()
		delete(w.slots, seq)
		w.mu.Unlock()
	}
}

// describe renders a call for error messages.
func (e *entry) describe() string {
	switch e.op {
	case comm.OpBarrier:
		return "Barrier()"
	case comm.OpBroadcast:
		return fmt.Sprintf("Broadcast(%s[%d], root %d)", e.dtype, e.length, e.root)
	case comm.OpAllGatherV, comm.OpReduceScatter:
		return fmt.Sprintf("%s(%s, counts %v)", opName(e.op), e.dtype, e.counts)
	}
	return fmt.Sprintf("%s(%s[%d])", opName(e.op), e.dtype, e.length)
}

func opName(op comm.Op) string {
	switch op {
	case comm.OpAllReduce:
		return "AllReduce"
	case comm.OpAllGather:
		return "AllGather"
	case comm.OpAllGatherV:
		return "AllGatherV"
	case comm.OpBroadcast:
		return "Broadcast"
	case comm.OpReduceScatter:
		return "ReduceScatter"
	case comm.OpBarrier:
		return "Barrier"
	}
	return op.String()
}

// mismatch checks that every rank made the same call as rank 0.
func (s *slot) mismatch(seq uint64) error {
	e0 := &s.entries[0]
	for r := 1; r < len(s.entries); r++ {
		e := &s.entries[r]
		if e.op != e0.op || e.dtype != e0.dtype || e.length != e0.length || e.root != e0.root || !slices.Equal(e.counts, e0.counts) {
			return fmt.Errorf("local: collective call #%d does not match across ranks: rank 0 called %s but rank %d called %s; every rank must make the same collective calls in the same order, with the same types, sizes, counts and root",
				seq, e0.describe(), r, e.describe())
		}
	}
	return nil
}

// collective runs one collective call of this rank: it publishes e, waits for
// every rank, checks that the calls match, and runs body.
func (c *rankComm) collective(ctx context.Context, seq uint64, e entry, body func(s *slot) error) error {
	what := func() string { return fmt.Sprintf("in %s (collective #%d)", e.describe(), seq) }
	if err := c.check(ctx, what); err != nil {
		return err
	}
	w := c.w
	s := w.slot(seq)
	s.entries[c.rank] = e
	s.joined[c.rank].Store(true)
	if int(s.arrived.count.Add(1)) == w.n {
		if net := w.cfg.net; net != nil {
			cost := net.Cost(e.op, w.n, e.length, e.dtype.Size(), e.counts)
			now := time.Now()
			w.mu.Lock()
			start := now
			if w.linkFree.After(now) {
				start = w.linkFree
			}
			s.end = start.Add(cost)
			w.linkFree = s.end
			w.mu.Unlock()
		}
		close(s.arrived.ch)
	}
	missing := func() int {
		for r := range w.n {
			if w.exited[r].Load() && !s.joined[r].Load() {
				return r
			}
		}
		return -1
	}
	if err := c.waitFor(ctx, s.arrived.ch, what, missing); err != nil {
		return err
	}
	if err := s.mismatch(seq); err != nil {
		w.leave(seq, s)
		return err
	}
	if err := body(s); err != nil {
		return err
	}
	w.leave(seq, s)
	return w.sleepUntil(ctx, s.end)
}

// phase counts this rank in g and waits for every rank.
func (c *rankComm) phase(ctx context.Context, g *gate) error {
	g.arrive(c.w.n)
	return c.wait(ctx, g.ch, lit("waiting for peers"))
}

func validDType(what string, b comm.Buffer) error {
	if b == nil {
		return fmt.Errorf("local: %s buffer is nil: pass comm.Float32s, comm.Int32s, comm.Int64s or comm.Float16s (possibly empty)", what)
	}
	if b.DType().Size() == 0 {
		return fmt.Errorf("local: %s buffer has unsupported element type %s: use comm.Float32s, comm.Int32s, comm.Int64s or comm.Float16s", what, b.DType())
	}
	return nil
}

func sameDType(send, recv comm.Buffer) error {
	if err := validDType("send", send); err != nil {
		return err
	}
	if err := validDType("receive", recv); err != nil {
		return err
	}
	if send.DType() != recv.DType() {
		return fmt.Errorf("local: send buffer is %s but receive buffer is %s: both must have the same element type", send.DType(), recv.DType())
	}
	return nil
}

func (c *rankComm) checkCounts(counts []int) (int, error) {
	if len(counts) != c.w.n {
		return 0, fmt.Errorf("local: counts has %d entries but the world has %d ranks: pass one count per rank", len(counts), c.w.n)
	}
	total := 0
	for r, v := range counts {
		if v < 0 {
			return 0, fmt.Errorf("local: counts[%d] = %d is negative: counts are element counts >= 0", r, v)
		}
		total += v
	}
	return total, nil
}

// view returns b's elements as a []E (no copy); b must hold E elements.
func view[E float32 | int32 | int64 | uint16](b comm.Buffer) []E {
	bs := b.Bytes()
	if len(bs) == 0 {
		return nil
	}
	return unsafe.Slice((*E)(unsafe.Pointer(&bs[0])), b.Len())
}

// sumTile is the number of elements summed at a time in a stack buffer, small
// enough to stay in L1.
const sumTile = 1024

// sumInto sets out[i] = ((srcs[0][i] + srcs[1][i]) + …) + srcs[m−1][i], left
// to right. out may be the same memory as srcs[m−1] (but no other source).
// Up to four sources are summed in one pass; more go through an L1-sized
// stack tile, three sources at a time, always in the same left-to-right order.
func sumInto[E float32 | int32 | int64](out []E, srcs [][]E) {
	m, n := len(srcs), len(out)
	switch m {
	case 0:
		clear(out)
		return
	case 1:
		copy(out, srcs[0])
		return
	case 2:
		a, b := srcs[0][:n], srcs[1][:n]
		for i := range out {
			out[i] = a[i] + b[i]
		}
		return
	case 3:
		a, b, c := srcs[0][:n], srcs[1][:n], srcs[2][:n]
		for i := range out {
			out[i] = a[i] + b[i] + c[i]
		}
		return
	case 4:
		a, b, c, d := srcs[0][:n], srcs[1][:n], srcs[2][:n], srcs[3][:n]
		for i := range out {
			out[i] = a[i] + b[i] + c[i] + d[i]
		}
		return
	}
	var tmp [sumTile]E
	for lo := 0; lo < n; lo += sumTile {
		hi := min(lo+sumTile, n)
		t := tmp[:hi-lo]
		a, b, c := srcs[0][lo:hi], srcs[1][lo:hi], srcs[2][lo:hi]
		a, b, c = a[:len(t)], b[:len(t)], c[:len(t)]
		for i := range t {
			t[i] = a[i] + b[i] + c[i]
		}
		k := 3
		for ; k+3 < m; k += 3 { // keep the last source for the final pass
			a, b, c := srcs[k][lo:hi], srcs[k+1][lo:hi], srcs[k+2][lo:hi]
			a, b, c = a[:len(t)], b[:len(t)], c[:len(t)]
			for i := range t {
				t[i] = t[i] + a[i] + b[i] + c[i]
			}
		}
		o := out[lo:hi]
		o = o[:len(t)]
		switch m - k {
		case 1:
			z := srcs[k][lo:hi][:len(t)]
			for i := range t {
				o[i] = t[i] + z[i]
			}
		case 2:
			y, z := srcs[k][lo:hi][:len(t)], srcs[k+1][lo:hi][:len(t)]
			for i := range t {
				o[i] = t[i] + y[i] + z[i]
			}
		case 3:
			x, y, z := srcs[k][lo:hi][:len(t)], srcs[k+1][lo:hi][:len(t)], srcs[k+2][lo:hi][:len(t)]
			for i := range t {
				o[i] = t[i] + x[i] + y[i] + z[i]
			}
		}
	}
}

// reduceHalf sums [lo, hi) of every rank's Float16 buffer bufs(r) into out,
// each addition in half precision, rounded to the nearest
// (device.AddFloat16), left to right in the canonical order j+1, …, n−1,
// 0, …, j.
func reduceHalf(out []uint16, bufs func(r int) comm.Buffer, n, j, lo, hi int) {
	if hi <= lo {
		return
	}
	srcs := make([][]uint16, n)
	for k := 1; k <= n; k++ {
		srcs[k-1] = view[uint16](bufs((j + k) % n))[lo:hi]
	}
	for i := range hi - lo {
		s := srcs[0][i]
		for _, x := range srcs[1:] {
			s = device.AddFloat16(s, x[i])
		}
		out[i] = s
	}
}

// allTile is the number of elements reduceAll sums at a time before storing
// them into every rank's buffer.
const allTile = 2048

// reduceAll sums chunk [lo, hi) of every rank's buffer bufs(r) in the
// canonical order j+1, …, n−1, 0, …, j and stores the sum into chunk [lo, hi)
// of every rank's buffer. Only rank j touches chunk j of any buffer, so no
// other rank reads or writes that memory meanwhile; each tile is summed
// completely before it is stored.
func reduceAll(dtype comm.DType, bufs func(r int) comm.Buffer, n, j, lo, hi int) {
	switch dtype {
	case comm.Float32:
		reduceAllTyped[float32](bufs, n, j, lo, hi)
	case comm.Int32:
		reduceAllTyped[int32](bufs, n, j, lo, hi)
	case comm.Int64:
		reduceAllTyped[int64](bufs, n, j, lo, hi)
	case comm.Float16:
		sum := make([]uint16, hi-lo)
		reduceHalf(sum, bufs, n, j, lo, hi)
		for r := range n {
			copy(view[uint16](bufs(r))[lo:hi], sum)
		}
	}
}

func reduceAllTyped[E float32 | int32 | int64](bufs func(r int) comm.Buffer, n, j, lo, hi int) {
	if hi <= lo {
		return
	}
	srcs := make([][]E, n) // in summation order
	dsts := make([][]E, n) // in rank order
	part := make([][]E, n)
	for k := 1; k <= n; k++ {
		srcs[k-1] = view[E](bufs((j + k) % n))[lo:hi]
	}
	for r := range n {
		dsts[r] = view[E](bufs(r))[lo:hi]
	}
	var tmp [allTile]E
	for t0 := 0; t0 < hi-lo; t0 += allTile {
		t1 := min(t0+allTile, hi-lo)
		for k := range srcs {
			part[k] = srcs[k][t0:t1]
		}
		t := tmp[:t1-t0]
		sumInto(t, part)
		for _, d := range dsts {
			copy(d[t0:t1], t)
		}
	}
}

// copyElems copies elements [lo, hi) of src into dst at offset at.
func copyElems(dst comm.Buffer, at int, src comm.Buffer, lo, hi int) {
	if hi <= lo {
		return
	}
	es := src.DType().Size()
	copy(dst.Bytes()[at*es:], src.Bytes()[lo*es:hi*es])
}

// AllReduce sums buf over all ranks in place, in the canonical order.
func (c *rankComm) AllReduce(ctx context.Context, buf comm.Buffer) error {
	if err := validDType("all-reduce", buf); err != nil {
		return err
	}
	seq, dc, err := c.begin(buf)
	if err != nil {
		return err
	}
	return dc.after(c.allReduceView(ctx, seq, buf, 0, buf.Len(), dc))
}

// begin numbers a call (every call takes a number, even one that fails to
// start, as every rank's does) and starts its device side on bufs.
func (c *rankComm) begin(bufs ...comm.Buffer) (uint64, *devCall, error) {
	seq := c.seq
	c.seq++
	dc, err := c.devStart(bufs...)
	return seq, dc, err
}

// after ends a blocking call whose collective returned err: the error, or
// once the call's device work is done, nil.
func (dc *devCall) after(err error) error {
	if err != nil {
		return err
	}
	return dc.finish()
}

// allReduceView all-reduces buf, elements [off, off+buf.Len()) of a vector
// of total elements: rank j sums the view's part of chunk j of the vector.
func (c *rankComm) allReduceView(ctx context.Context, seq uint64, buf comm.Buffer, off, total int, dc *devCall) error {
	n := c.w.n
	if n == 1 {
		return c.check(ctx, lit("in AllReduce"))
	}
	e := entry{op: comm.OpAllReduce, dtype: buf.DType(), send: buf, length: buf.Len(), dev: dc}
	return c.collective(ctx, seq, e, func(s *slot) error {
		lo, hi := comm.ViewChunkBounds(total, off, buf.Len(), n, c.rank)
		host := func(comm.Buffer, comm.Buffer) error {
			reduceAll(e.dtype, func(r int) comm.Buffer { return s.entries[r].send }, n, c.rank, lo, hi)
			return c.phase(ctx, &s.done)
		}
		if !s.anyDevice() {
			return host(nil, nil)
		}
		return c.runCall(ctx, s, dc, true, func(pd comm.PeerDevice, p device.Stream) error {
			if hi <= lo {
				return nil
			}
			bufs := make([]device.Buffer, n) // in summation order
			for k := 1; k <= n; k++ {
				bufs[k-1] = devBuf(s.entries[(c.rank+k)%n].send)
			}
			return pd.PeerSum(p, bufs, lo, hi-lo, device.Buffer{})
		}, host)
	})
}

// AllGather concatenates every rank's send into recv in rank order.
func (c *rankComm) AllGather(ctx context.Context, send, recv comm.Buffer) error {
	if err := c.checkAllGather(send, recv); err != nil {
		return err
	}
	seq, dc, err := c.begin(send, recv)
	if err != nil {
		return err
	}
	return dc.after(c.allGather(ctx, seq, send, recv, dc))
}

func (c *rankComm) checkAllGather(send, recv comm.Buffer) error {
	if err := sameDType(send, recv); err != nil {
		return fmt.Errorf("AllGather: %w", err)
	}
	if recv.Len() != c.w.n*send.Len() {
		return fmt.Errorf("local: AllGather: receive buffer has %d elements but must have Size()*send.Len() = %d*%d = %d", recv.Len(), c.w.n, send.Len(), c.w.n*send.Len())
	}
	return nil
}

// allGather is AllGather's body: allGatherV with every count send.Len().
func (c *rankComm) allGather(ctx context.Context, seq uint64, send, recv comm.Buffer, dc *devCall) error {
	return c.allGatherV(ctx, seq, comm.OpAllGather, send, recv, slices.Repeat([]int{send.Len()}, c.w.n), dc)
}

// AllGatherV concatenates every rank's send (counts[r] elements) into recv.
func (c *rankComm) AllGatherV(ctx context.Context, send, recv comm.Buffer, counts []int) error {
	if err := c.checkAllGatherV(send, recv, counts); err != nil {
		return err
	}
	seq, dc, err := c.begin(send, recv)
	if err != nil {
		return err
	}
	return dc.after(c.allGatherV(ctx, seq, comm.OpAllGatherV, send, recv, counts, dc))
}

func (c *rankComm) checkAllGatherV(send, recv comm.Buffer, counts []int) error {
	if err := sameDType(send, recv); err != nil {
		return fmt.Errorf("AllGatherV: %w", err)
	}
	total, err := c.checkCounts(counts)
	if err != nil {
		return fmt.Errorf("AllGatherV: %w", err)
	}
	if send.Len() != counts[c.rank] {
		return fmt.Errorf("local: AllGatherV: rank %d's send buffer has %d elements but counts[%d] = %d: they must be equal", c.rank, send.Len(), c.rank, counts[c.rank])
	}
	if recv.Len() != total {
		return fmt.Errorf("local: AllGatherV: receive buffer has %d elements but must have sum(counts) = %d", recv.Len(), total)
	}
	return nil
}

// allGatherV is the body of AllGatherV and (op OpAllGather, equal counts)
// of AllGather.
func (c *rankComm) allGatherV(ctx context.Context, seq uint64, op comm.Op, send, recv comm.Buffer, counts []int, dc *devCall) error {
	n := c.w.n
	if n == 1 {
		if err := c.copyOne(dc, recv, send, send.Len()); err != nil {
			return err
		}
		return c.check(ctx, func() string { return "in " + opName(op) })
	}
	e := entry{op: op, dtype: send.DType(), send: send, recv: recv, dev: dc}
	if op == comm.OpAllGather {
		e.length = send.Len()
	} else {
		e.counts = slices.Clone(counts)
	}
	return c.collective(ctx, seq, e, func(s *slot) error {
		host := func(_, recv comm.Buffer) error {
			off := 0
			for r := range n {
				copyElems(recv, off, s.entries[r].send, 0, counts[r])
				off += counts[r]
			}
			return c.phase(ctx, &s.done)
		}
		if !s.anyDevice() {
			return host(send, recv)
		}
		return c.runCall(ctx, s, dc, false, func(_ comm.PeerDevice, p device.Stream) error {
			out, off := devBuf(recv), 0
			for r := range n {
				if k := counts[r]; k > 0 {
					if err := devCopy(p, out.Slice(off, off+k), devBuf(s.entries[r].send)); err != nil {
						return err
					}
				}
				off += counts[r]
			}
			return nil
		}, host)
	})
}

// Broadcast copies root's buf into every rank's buf.
func (c *rankComm) Broadcast(ctx context.Context, buf comm.Buffer, root int) error {
	if err := validDType("broadcast", buf); err != nil {
		return err
	}
	if root < 0 || root >= c.w.n {
		return fmt.Errorf("local: Broadcast: root %d out of range: must be in [0, %d)", root, c.w.n)
	}
	seq := c.seq
	c.seq++
	n := c.w.n
	if n == 1 {
		return c.check(ctx, lit("in Broadcast"))
	}
	dc, err := c.devStart(buf)
	if err != nil {
		return err
	}
	e := entry{op: comm.OpBroadcast, dtype: buf.DType(), send: buf, length: buf.Len(), root: root, dev: dc}
	err = c.collective(ctx, seq, e, func(s *slot) error {
		host := func(buf, _ comm.Buffer) error {
			if c.rank != root {
				copyElems(buf, 0, s.entries[root].send, 0, buf.Len())
			}
			return c.phase(ctx, &s.done)
		}
		if !s.anyDevice() {
			return host(buf, nil)
		}
		return c.runCall(ctx, s, dc, false, func(_ comm.PeerDevice, p device.Stream) error {
			if c.rank == root {
				return nil
			}
			return devCopy(p, devBuf(buf), devBuf(s.entries[root].send))
		}, host)
	})
	return dc.after(err)
}

// Barrier returns once every rank has entered it.
func (c *rankComm) Barrier(ctx context.Context) error {
	seq := c.seq
	c.seq++
	if c.w.n == 1 {
		return c.check(ctx, lit("in Barrier"))
	}
	return c.collective(ctx, seq, entry{op: comm.OpBarrier}, func(*slot) error { return nil })
}

// IAllReduceView starts the all-reduce of a view (comm.Communicator).
func (c *rankComm) IAllReduceView(ctx context.Context, buf comm.Buffer, off, total int) (comm.Request, error) {
	if err := validDType("all-reduce", buf); err != nil {
		return nil, err
	}
	if err := comm.CheckView(off, buf.Len(), total); err != nil {
		return nil, fmt.Errorf("local: IAllReduceView: %w", err)
	}
	seq, dc, err := c.begin(buf)
	if err != nil {
		return nil, err
	}
	return devRequest(c.async("IAllReduceView", func() (int, error) { return buf.Len(), c.allReduceView(ctx, seq, buf, off, total, dc) }), dc), nil
}

// IAllGather starts AllGather and returns at once.
func (c *rankComm) IAllGather(ctx context.Context, send, recv comm.Buffer) (comm.Request, error) {
	if err := c.checkAllGather(send, recv); err != nil {
		return nil, err
	}
	seq, dc, err := c.begin(send, recv)
	if err != nil {
		return nil, err
	}
	return devRequest(c.async("IAllGather", func() (int, error) { return recv.Len(), c.allGather(ctx, seq, send, recv, dc) }), dc), nil
}
