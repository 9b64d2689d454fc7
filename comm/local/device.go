package local

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

// devCall is a rank's device side of one collective call.
type devCall struct {
	stream device.Stream // the stream of the caller's buffers
	dev    device.Device
	ready  device.Event // recorded on stream at the call's start
	// done is this rank's device work in the call, published before the
	// call's done phase (nil: none).
	done device.Event
	// wait is what the caller's stream waits for once the call is over.
	wait []device.Event
}

// MovesDevice implements comm.DeviceMover: the collective and the
// point-to-point calls take Device buffers in device memory.
func (c *rankComm) MovesDevice() bool { return true }

// devStart starts the device side of this rank's call on bufs (see
// devCall); an error aborts the world, whose other ranks would wait for
// the call.
func (c *rankComm) devStart(bufs ...comm.Buffer) (*devCall, error) {
	dc, err := devStart(bufs...)
	if err != nil {
		c.w.Abort(c.rank, err)
	}
	return dc, err
}

// devStart starts the device side of a call on bufs: nil when none of them
// is device memory; else the event of the buffers' stream at this point.
func devStart(bufs ...comm.Buffer) (*devCall, error) {
	var dc *devCall
	for _, b := range bufs {
		d, ok := comm.InDeviceMemory(b)
		if !ok {
			continue
		}
		if d.Stream == nil {
			return nil, fmt.Errorf("local: %v has no stream (comm.OnDevice)", d.Buf)
		}
		if dc == nil {
			dc = &devCall{stream: d.Stream, dev: d.Buf.Device()}
		} else if d.Stream != dc.stream {
			return nil, fmt.Errorf("local: the device buffers of one call are ordered by different streams (%v, %v): pass them on one stream", dc.stream, d.Stream)
		}
	}
	if dc == nil {
		return nil, nil
	}
	ev, err := dc.stream.Record()
	if err != nil {
		return nil, fmt.Errorf("local: recording the buffers' event: %w", err)
	}
	dc.ready = ev
	return dc, nil
}

// finish makes the caller's stream wait for the call's device work.
func (dc *devCall) finish() error {
	if dc == nil {
		return nil
	}
	for _, ev := range dc.wait {
		if err := dc.stream.Wait(ev); err != nil {
			return fmt.Errorf("local: waiting for the call's device work: %w", err)
		}
	}
	return nil
}

// devReq is a non-blocking call with device buffers: its Wait makes the
// caller's stream wait for the call's device work.
type devReq struct {
	r  *request
	dc *devCall
}

// devRequest returns r, made to finish dc's device side in Wait.
func devRequest(r *request, dc *devCall) comm.Request {
	if dc == nil {
		return r
	}
	return &devReq{r, dc}
}

// Wait implements comm.Request.
func (q *devReq) Wait(ctx context.Context) (int, error) {
	n, err := q.r.Wait(ctx)
	if err != nil {
		return n, err
	}
	return n, q.dc.finish()
}

// anyDevice reports whether some rank's call has device buffers (then
// every rank runs the call's body through runCall).
func (s *slot) anyDevice() bool {
	for r := range s.entries {
		if s.entries[r].dev != nil {
			return true
		}
	}
	return false
}

// copyOne copies the first n elements of src into dst, the call of a world
// of one rank: on the host, or where device memory is involved on this
// rank's device stream after the call's start.
func (c *rankComm) copyOne(dc *devCall, dst, src comm.Buffer, n int) error {
	if dc == nil {
		copyElems(dst, 0, src, 0, n)
		return nil
	}
	err := c.onPeerStream(dc, []device.Event{dc.ready}, func(p device.Stream) error {
		if n == 0 {
			return nil
		}
		d, s := comm.AsDevice(dst).Slice(0, n), comm.AsDevice(src).Slice(0, n)
		if err := p.Copy(d, s); err != nil {
			return fmt.Errorf("local: copy: %w", err)
		}
		if d.IsHost() { // the caller reads it once the call returns
			return p.Synchronize()
		}
		return nil
	})
	if err != nil {
		return err
	}
	dc.wait = []device.Event{dc.done}
	return nil
}

// hostData reports whether b holds elements in host memory.
func hostData(b comm.Buffer) bool {
	if b == nil || b.Len() == 0 {
		return false
	}
	_, ok := comm.InDeviceMemory(b)
	return !ok
}

// onDevice reports whether the call of s runs on the ranks' devices (see
// Device buffers): every rank's non-empty buffers are memory of
// comm.PeerDevices that all reach each other's memory (one device, or GPUs
// with peer access), and for sums no more ranks than each adds at once.
// It is decided once per call, before any rank stages its buffers (which
// changes its entry).
func (s *slot) onDevice(sums bool) bool {
	s.peerOnce.Do(func() { s.peer = s.findPeerDevices(sums) })
	return s.peer
}

func (s *slot) findPeerDevices(sums bool) bool {
	var pds []comm.PeerDevice
	for r := range s.entries {
		e := &s.entries[r]
		if hostData(e.send) || hostData(e.recv) {
			return false
		}
		if e.dev == nil {
			continue // nothing of its own to move
		}
		p, ok := e.dev.dev.(comm.PeerDevice)
		if !ok {
			return false
		}
		if !slices.Contains(pds, p) {
			pds = append(pds, p)
		}
	}
	for i, p := range pds {
		if sums && len(s.entries) > p.MaxPeers() {
			return false
		}
		for _, q := range pds[i+1:] {
			if !p.Reaches(q) || !q.Reaches(p) {
				return false
			}
		}
	}
	return len(pds) > 0
}

// reach reports whether a's streams copy b's memory and the reverse: one
// device, or two comm.PeerDevices reaching each other.
func reach(a, b device.Device) bool {
	if a == b {
		return true
	}
	p, ok := a.(comm.PeerDevice)
	q, ok2 := b.(comm.PeerDevice)
	return ok && ok2 && p.Reaches(b) && q.Reaches(a)
}

// peerStream returns this rank's stream of device d, created on first use,
// with the lock that makes it this goroutine's until unlock (non-blocking
// calls run on goroutines of their own).
func (c *rankComm) peerStream(d device.Device) (device.Stream, func(), error) {
	c.pmu.Lock()
	if s, ok := c.pstreams[d]; ok {
		return s, c.pmu.Unlock, nil
	}
	s, err := d.NewStream()
	if err != nil {
		c.pmu.Unlock()
		return nil, nil, fmt.Errorf("local: a stream for rank %d's device work: %w", c.rank, err)
	}
	if c.pstreams == nil {
		c.pstreams = map[device.Device]device.Stream{}
	}
	c.pstreams[d] = s
	return s, c.pmu.Unlock, nil
}

// closeStreams releases the ranks' streams (at the end of Run).
func (w *World) closeStreams() {
	for _, c := range w.comms {
		c.pmu.Lock()
		for d, s := range c.pstreams {
			if cl, ok := s.(io.Closer); ok {
				cl.Close()
			}
			delete(c.pstreams, d)
		}
		c.pmu.Unlock()
	}
}

// onPeerStream runs f on this rank's stream of dc's device after the
// events waitFor (the call's start events: every rank's or its own), and
// publishes the event after f's work as dc.done.
func (c *rankComm) onPeerStream(dc *devCall, waitFor []device.Event, f func(p device.Stream) error) error {
	return c.onStream(dc.dev, waitFor, func(p device.Stream) (err error) {
		if err = f(p); err == nil {
			dc.done, err = p.Record()
		}
		return err
	})
}

// readyEvents are every rank's start events (nil for ranks without device
// buffers).
func (s *slot) readyEvents() []device.Event {
	evs := make([]device.Event, len(s.entries))
	for r := range s.entries {
		if d := s.entries[r].dev; d != nil {
			evs[r] = d.ready
		}
	}
	return evs
}

// doneEvents are every rank's published device work.
func (s *slot) doneEvents() []device.Event {
	var evs []device.Event
	for r := range s.entries {
		if d := s.entries[r].dev; d != nil && d.done != nil {
			evs = append(evs, d.done)
		}
	}
	return evs
}

// devBuf is b's device buffer (b is device memory or empty).
func devBuf(b comm.Buffer) device.Buffer {
	if d, ok := b.(comm.Device); ok {
		return d.Buf
	}
	return device.Buffer{}
}

// runCall runs the body of a collective call that has device buffers
// somewhere (see Device buffers): onDev on this rank's device (a
// comm.PeerDevice) where the call can run on the ranks' devices (sums: it
// adds), else host on host copies of this rank's device buffers (send
// loaded, recv copied back; the copies of the peers' are in their
// entries), published before host runs. Both end with the call's done
// phase.
func (c *rankComm) runCall(ctx context.Context, s *slot, dc *devCall, sums bool, onDev func(pd comm.PeerDevice, p device.Stream) error, host func(send, recv comm.Buffer) error) error {
	me := &s.entries[c.rank]
	if s.onDevice(sums) {
		if dc != nil {
			pd := dc.dev.(comm.PeerDevice) // onDevice checked every rank's
			if err := c.onPeerStream(dc, s.readyEvents(), func(p device.Stream) error { return onDev(pd, p) }); err != nil {
				c.w.Abort(c.rank, err)
				return err
			}
		}
		if err := c.phase(ctx, &s.done); err != nil {
			return err
		}
		if dc != nil {
			dc.wait = s.doneEvents()
		}
		return nil
	}
	send, recv := me.send, me.recv
	var stages [2]*comm.Stage
	if dc != nil {
		err := c.onPeerStream(dc, []device.Event{dc.ready}, func(p device.Stream) error {
			for i, b := range []*comm.Buffer{&send, &recv} {
				d, ok := comm.InDeviceMemory(*b)
				if !ok {
					continue
				}
				st, err := comm.StageBuffer(d, p, i == 0)
				if err != nil {
					return err
				}
				stages[i], *b = st, st.Host()
			}
			return nil
		})
		if err != nil {
			stages[0].Release()
			stages[1].Release()
			c.w.Abort(c.rank, err)
			return err
		}
	}
	me.send, me.recv = send, recv
	if err := c.phase(ctx, &s.staged); err != nil {
		return err
	}
	if err := host(send, recv); err != nil {
		return err
	}
	if dc == nil {
		return nil
	}
	// The result back: an all-reduce's or a broadcast's in place (send),
	// the others' into recv.
	res, other := stages[1], stages[0]
	if op := me.op; op == comm.OpAllReduce || op == comm.OpBroadcast {
		res, other = other, res
	}
	other.Release()
	if res == nil {
		return nil
	}
	err := c.onPeerStream(dc, nil, func(device.Stream) error {
		_, err := res.CopyBack(res.Host().Len())
		return err
	})
	if err != nil {
		c.w.Abort(c.rank, err)
		return err
	}
	dc.wait = []device.Event{dc.done}
	return nil
}

// devCopy copies src into dst (device buffers of devices that reach each
// other) on p.
func devCopy(p device.Stream, dst, src device.Buffer) error {
	if dst.Len() == 0 {
		return nil
	}
	if err := p.Copy(dst, src); err != nil {
		return fmt.Errorf("local: device copy: %w", err)
	}
	return nil
}

// take copies the message the receive r was matched with, which involves
// device memory, into r's buffer and gives the message back (the sender's
// buffer is then free once r.copied, or the message's done, has
// completed):
//   - device to device memory of the same device, or of devices that reach
//     each other (GPUs with peer access): on this rank's stream of the
//     receiving device, after the sender's start event and r's, without a
//     wait;
//   - device to host memory: on this rank's stream of the sender's device,
//     waited for (the caller reads the host memory next);
//   - host to device memory, or between devices without peer access:
//     through host memory, waited for (the host memory is given back).
func (c *rankComm) take(r *recvWait) (err error) {
	m := r.msg
	r.msg = nil
	var done device.Event
	defer func() {
		if m.dev != nil {
			m.dev.done = done
		}
		m.release()
	}()
	dst := comm.AsDevice(r.buf).Slice(0, m.n)
	if m.dev == nil { // host memory into device memory
		return c.onStream(dst.Device(), []device.Event{r.devReady}, func(p device.Stream) error {
			h, err := comm.HostView(m.data, dst.DType(), m.n)
			if err != nil {
				return err
			}
			if err := p.Copy(dst, comm.AsDevice(h)); err != nil {
				return err
			}
			return p.Synchronize()
		})
	}
	src := m.dev.buf.Slice(0, m.n)
	if !dst.IsHost() && reach(dst.Device(), src.Device()) {
		return c.onStream(dst.Device(), []device.Event{m.dev.ready, r.devReady}, func(p device.Stream) error {
			if err := p.Copy(dst, src); err != nil {
				return err
			}
			done, err = p.Record()
			r.copied = done
			return err
		})
	}
	if dst.IsHost() {
		return c.onStream(src.Device(), []device.Event{m.dev.ready}, func(p device.Stream) error {
			if err := p.Copy(dst, src); err != nil {
				return err
			}
			return p.Synchronize()
		})
	}
	// Between devices: through this rank's host memory.
	var st *comm.Stage
	defer func() { st.Release() }()
	err = c.onStream(src.Device(), []device.Event{m.dev.ready}, func(p device.Stream) error {
		var err error
		st, err = comm.StageBuffer(comm.OnDevice(src, p), p, true)
		return err
	})
	if err != nil {
		return err
	}
	return c.onStream(dst.Device(), []device.Event{r.devReady}, func(p device.Stream) error {
		if err := p.Copy(dst, comm.AsDevice(st.Host())); err != nil {
			return err
		}
		return p.Synchronize()
	})
}

// onStream runs f on this rank's stream of device d after the events
// waitFor (nil ones skipped).
func (c *rankComm) onStream(d device.Device, waitFor []device.Event, f func(p device.Stream) error) error {
	p, unlock, err := c.peerStream(d)
	if err != nil {
		return err
	}
	defer unlock()
	// This rank's peer stream is this call's alone until unlock: held, its
	// calls pay one context switch, not one each (cuda.Stream.Hold).
	if h, ok := p.(interface{ Hold() (release func()) }); ok {
		defer h.Hold()()
	}
	for _, ev := range waitFor {
		if ev == nil {
			continue
		}
		if err := p.Wait(ev); err != nil {
			return fmt.Errorf("local: rank %d waiting for the call's buffers: %w", c.rank, err)
		}
	}
	if err := f(p); err != nil {
		return fmt.Errorf("local: rank %d's device work: %w", c.rank, err)
	}
	return nil
}
