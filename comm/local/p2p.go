package local

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

// mailKey identifies a point-to-point channel.
type mailKey struct{ src, dst, tag int }

// message is a sent message waiting for its receive.
type message struct {
	dtype comm.DType
	n     int
	data  []byte
	ready time.Time // with network emulation: when the message has arrived
	// consumed, if not nil, marks a message whose data are the sender's own
	// buffer (no copy): it is closed once the receive copied them out.
	consumed chan struct{}
	// dev, if not nil, is the sender's device memory (a Device buffer:
	// SendRecv's and ISend's own, or the rank's block Send copied it into;
	// data is then nil and consumed set): the receiver copies it itself.
	dev *devMsg
}

// devMsg is the device side of a message sent from device memory: the
// receiver copies buf after ready (device to device where its buffer is
// memory of the same device or of one that reaches it) and sets done to
// the copy's event (nil: complete) before it releases the message. A
// SendRecv's or ISend's buf is the sender's buffer, whose stream waits for
// done before it writes buf again; a Send's is blk's memory, which goes
// back to pool with done.
type devMsg struct {
	buf   device.Buffer
	ready device.Event
	done  device.Event
	blk   *devBlock
	pool  *devPool
}

// recvWait is a receive waiting for its message.
type recvWait struct {
	box   *mailbox
	buf   comm.Buffer
	src   int
	tag   int
	done  chan struct{}
	n     int
	err   error
	ready time.Time
	// msg is a matched message the receiver copies itself (device memory
	// on either side; see take), nil once taken.
	msg *message
	// devReady is the receive buffer's stream event at the call's start
	// (device memory: the copy into it waits for it), and copied the event
	// of that copy, which the receiver's stream waits for (nil: none).
	devReady, copied device.Event
}

// mailbox holds, for one (src, dst, tag), the messages not yet received and
// the receives not yet matched; at most one of the two lists is non-empty.
type mailbox struct {
	key     mailKey
	dead    bool // removed from World.boxes; guarded by mu
	mu      sync.Mutex
	msgs    []message
	waiters []*recvWait
}

// lockBox returns the mailbox of k, locked, creating it if needed.
func (w *World) lockBox(k mailKey) *mailbox {
	for {
		w.mu.Lock()
		b := w.boxes[k]
		if b == nil {
			b = &mailbox{key: k}
			w.boxes[k] = b
		}
		w.mu.Unlock()
		b.mu.Lock()
		if !b.dead {
			return b
		}
		b.mu.Unlock() // removed meanwhile: look it up again
	}
}

// unlockBox unlocks b and forgets it if it is empty, so that channels with
// ever new tags do not accumulate.
func (w *World) unlockBox(b *mailbox) {
	empty := len(b.msgs) == 0 && len(b.waiters) == 0
	b.mu.Unlock()
	if !empty {
		return
	}
	w.mu.Lock()
	b.mu.Lock()
	if len(b.msgs) == 0 && len(b.waiters) == 0 && !b.dead {
		b.dead = true
		delete(w.boxes, b.key)
	}
	b.mu.Unlock()
	w.mu.Unlock()
}

// msgPool recycles the copies of messages sent before their receive was
// posted, so that repeated large messages do not churn the garbage collector.
var msgPool sync.Pool

func getBytes(n int) []byte {
	if p, ok := msgPool.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func putBytes(b []byte) {
	if cap(b) > 0 {
		msgPool.Put(&b)
	}
}

// deliver copies message m into the receive r and completes it; a message
// of device memory, or one into device memory, is left to the receiver
// (r.msg; take), and deliver then reports that it did not copy it.
func (r *recvWait) deliver(m message) (copied bool) {
	copied = true
	switch {
	case m.dtype != r.buf.DType():
		r.err = fmt.Errorf("local: message from rank %d with tag %d holds %s but the receive buffer is %s: send and receive must use the same element type", r.src, r.tag, m.dtype, r.buf.DType())
	case m.n > r.buf.Len():
		r.err = fmt.Errorf("local: message from rank %d with tag %d has %d elements but the receive buffer only %d: pass a receive buffer at least as long as the message", r.src, r.tag, m.n, r.buf.Len())
	case m.n > 0 && (m.dev != nil || !hostBuf(r.buf)):
		r.msg, r.n, copied = &m, m.n, false
	default:
		if m.n > 0 {
			copy(r.buf.Bytes(), m.data)
		}
		r.n = m.n
	}
	if copied && m.dev != nil { // nothing of it read: the sender goes on
		m.release()
	}
	r.ready = m.ready
	close(r.done)
	return copied
}

// hostBuf reports whether b's elements are host memory (or b is empty).
func hostBuf(b comm.Buffer) bool {
	_, ok := comm.InDeviceMemory(b)
	return !ok
}

// release gives back the data of a message whose receive has copied them:
// the sender's buffer (consumed closed; a device block back to its pool
// with the copy out of it) or the mailbox's copy.
func (m *message) release() {
	if d := m.dev; d != nil && d.blk != nil {
		d.pool.put(d.blk, d.done)
		d.blk = nil
	}
	if m.consumed != nil {
		close(m.consumed)
	} else {
		putBytes(m.data)
	}
}

func (c *rankComm) checkPeer(what string, peer int) error {
	if peer < 0 || peer >= c.w.n {
		return fmt.Errorf("local: %s rank %d out of range: must be in [0, %d)", what, peer, c.w.n)
	}
	return nil
}

// Send delivers buf to rank dst with tag; the data are copied, so it returns
// without waiting for the receive. Device memory (comm.Device) is copied
// device to device, on the buffer's stream, into memory the rank keeps
// for messages: the host waits for nothing, and the receive copies the
// message out as SendRecv's does.
func (c *rankComm) Send(ctx context.Context, buf comm.Buffer, dst, tag int) error {
	r, err := c.send(ctx, "Send", buf, dst, tag)
	if err != nil {
		return err
	}
	return c.w.sleepUntil(ctx, r.ready)
}

// send is the body of Send and ISend (call): it checks the call, copies
// the message into the mailbox (or a waiting receive) and returns its
// request.
func (c *rankComm) send(ctx context.Context, call string, buf comm.Buffer, dst, tag int) (*sendRequest, error) {
	if err := validDType("send", buf); err != nil {
		return nil, err
	}
	if err := c.checkPeer(call+": destination", dst); err != nil {
		return nil, err
	}
	if err := c.check(ctx, func() string { return fmt.Sprintf("in %s to rank %d with tag %d", call, dst, tag) }); err != nil {
		return nil, err
	}
	var dm *devMsg
	if d, ok := comm.InDeviceMemory(buf); ok {
		var err error
		if dm, err = c.copyOut(d); err != nil {
			err = fmt.Errorf("local: rank %d in %s to rank %d with tag %d: %w", c.rank, call, dst, tag, err)
			c.w.Abort(c.rank, err)
			return nil, err
		}
	}
	ready := c.w.p2pReady(time.Now(), buf)
	c.sendNoWait(buf, dst, tag, ready, false, dm)
	return &sendRequest{c: c, ready: ready, n: buf.Len()}, nil
}

// copyOut copies d into a block of the rank's message memory on d's
// stream (after the block's last copy out) and returns the message of it.
func (c *rankComm) copyOut(d comm.Device) (*devMsg, error) {
	if d.Stream == nil {
		return nil, fmt.Errorf("%v has no stream (comm.OnDevice)", d.Buf)
	}
	pool := &c.dpool
	blk, err := pool.get(d.Buf.Device(), d.Buf.Bytes())
	if err != nil {
		return nil, err
	}
	dm := &devMsg{buf: blk.buf.View(d.Buf.DType(), 0, d.Len()), blk: blk, pool: pool}
	if blk.busy != nil {
		if err := d.Stream.Wait(blk.busy); err != nil {
			pool.put(blk, blk.busy)
			return nil, fmt.Errorf("waiting for the message memory: %w", err)
		}
	}
	if err := d.Stream.Copy(dm.buf, d.Buf); err != nil {
		pool.put(blk, blk.busy)
		return nil, fmt.Errorf("copying the message: %w", err)
	}
	if dm.ready, err = d.Stream.Record(); err != nil {
		// Not known when the copy is done: the memory is not reused.
		return nil, fmt.Errorf("copying the message: %w", err)
	}
	blk.filled = dm.ready
	return dm, nil
}

// post registers a receive: it takes the first waiting message or queues r.
// dc is the device side of the call (nil: none).
func (c *rankComm) post(buf comm.Buffer, src, tag int, dc *devCall) *recvWait {
	b := c.w.lockBox(mailKey{src, c.rank, tag})
	r := &recvWait{box: b, buf: buf, src: src, tag: tag, done: make(chan struct{})}
	if dc != nil {
		r.devReady = dc.ready
	}
	if len(b.msgs) > 0 {
		m := b.msgs[0]
		b.msgs[0] = message{}
		b.msgs = b.msgs[1:]
		if r.deliver(m) && m.dev == nil {
			m.release()
		}
	} else {
		b.waiters = append(b.waiters, r)
	}
	c.w.unlockBox(b)
	return r
}

func (c *rankComm) finishRecv(ctx context.Context, r *recvWait) (int, error) {
	what := func() string { return fmt.Sprintf("in Recv from rank %d with tag %d", r.src, r.tag) }
	missing := func() int {
		if c.w.exited[r.src].Load() {
			return r.src
		}
		return -1
	}
	err := c.waitFor(ctx, r.done, what, missing)
	if err == nil && r.msg != nil {
		err = c.take(r)
	}
	if err != nil {
		// Withdraw the receive so that no late message is copied into a
		// buffer the caller owns again.
		r.box.mu.Lock()
		for i, q := range r.box.waiters {
			if q == r {
				r.box.waiters = append(r.box.waiters[:i], r.box.waiters[i+1:]...)
				break
			}
		}
		if m := r.msg; m != nil { // matched meanwhile: the sender goes on
			r.msg = nil
			m.release()
		}
		r.box.mu.Unlock()
		return 0, err
	}
	if r.err != nil {
		return 0, r.err
	}
	if err := c.w.sleepUntil(ctx, r.ready); err != nil {
		return 0, err
	}
	return r.n, nil
}

func (c *rankComm) checkRecv(buf comm.Buffer, src int) error {
	if err := validDType("receive", buf); err != nil {
		return err
	}
	return c.checkPeer("Recv: source", src)
}

// Recv receives the next message from src with tag into buf. Into device
// memory (comm.Device) the message is copied as in SendRecv: on a stream
// of this rank's after the buffer's start event, which the buffer's stream
// then waits for (device to device without a host wait where the message
// is memory of the same device or of one that reaches it).
func (c *rankComm) Recv(ctx context.Context, buf comm.Buffer, src, tag int) (int, error) {
	if err := c.checkRecv(buf, src); err != nil {
		return 0, err
	}
	if err := c.check(ctx, func() string { return fmt.Sprintf("in Recv from rank %d with tag %d", src, tag) }); err != nil {
		return 0, err
	}
	dc, err := c.devStart(buf)
	if err != nil {
		return 0, err
	}
	return c.recvDone(ctx, c.post(buf, src, tag, dc), dc)
}

// recvDone finishes the receive r (dc: its device side, nil for none): the
// buffer's stream waits for the copy into it.
func (c *rankComm) recvDone(ctx context.Context, r *recvWait, dc *devCall) (int, error) {
	n, err := c.finishRecv(ctx, r)
	if err != nil || dc == nil || r.copied == nil {
		return n, err
	}
	dc.wait = []device.Event{r.copied}
	return n, dc.finish()
}

// SendRecv sends send to dst and receives from src (both with tag).
// Device buffers in device memory (comm.Device) are moved by the device:
// the receiver copies the sender's buffer device to device (through host
// memory only between different devices) on a stream of its own after
// both buffers' start events, and each caller's stream waits for the copy
// into its receive buffer and for the copy out of its send buffer; the
// host waits for no copy. A device send waits for its receive to be
// posted (the rendezvous hands over the buffer itself).
func (c *rankComm) SendRecv(ctx context.Context, send comm.Buffer, dst int, recv comm.Buffer, src, tag int) (int, error) {
	if err := validDType("send", send); err != nil {
		return 0, err
	}
	if err := c.checkPeer("SendRecv: destination", dst); err != nil {
		return 0, err
	}
	if err := validDType("receive", recv); err != nil {
		return 0, err
	}
	if err := c.checkPeer("Recv: source", src); err != nil {
		return 0, err
	}
	if err := c.check(ctx, lit("in SendRecv")); err != nil {
		return 0, err
	}
	dc, err := c.devStart(send, recv)
	if err != nil {
		return 0, err
	}
	// The receive is posted before the send is offered, so the send need not
	// be copied: a peer doing the same can always take it, and two ranks
	// exchanging cannot deadlock.
	start := time.Now() // the send's modelled time overlaps the receive's
	r := c.post(recv, src, tag, dc)
	ready := c.w.p2pReady(start, send)
	var dm *devMsg
	if d, ok := comm.InDeviceMemory(send); ok {
		dm = &devMsg{buf: d.Buf, ready: dc.ready}
	}
	box, sent := c.sendNoWait(send, dst, tag, ready, true, dm)
	n, err := c.finishRecv(ctx, r)
	if err != nil {
		if sent != nil {
			box.withdraw(sent.consumed)
		}
		return 0, err
	}
	if dc != nil && r.copied != nil {
		dc.wait = append(dc.wait, r.copied)
	}
	if sent != nil {
		if sent.dev == nil {
			// Not taken yet: leave a copy behind, as Send would have, so
			// that SendRecv never waits for the destination.
			box.detach(sent.consumed)
		} else if err := c.handedOver(ctx, "SendRecv", box, sent, dc, dst, tag); err != nil {
			return 0, err
		}
	}
	if err := dc.finish(); err != nil {
		return 0, err
	}
	return n, c.w.sleepUntil(ctx, ready)
}

// handedOver waits for rank dst's receive to take sent, a message of device
// memory that sendNoWait handed over by reference (in call, with tag), and
// adds the receive's copy out of it to what dc's stream waits for.
func (c *rankComm) handedOver(ctx context.Context, call string, box *mailbox, sent *message, dc *devCall, dst, tag int) error {
	what := func() string { return fmt.Sprintf("in %s, sending to rank %d with tag %d", call, dst, tag) }
	missing := func() int {
		if c.w.exited[dst].Load() {
			return dst
		}
		return -1
	}
	if err := c.waitFor(ctx, sent.consumed, what, missing); err != nil {
		box.withdraw(sent.consumed)
		return err
	}
	if sent.dev.done != nil {
		dc.wait = append(dc.wait, sent.dev.done)
	}
	return nil
}

// sendNoWait delivers buf to the first waiting receive from this rank to dst
// with tag, or queues it. A queued message is a copy, unless byRef: then it
// refers to buf itself, and the returned mailbox and message (whose
// consumed is closed once the receive copied it out) let the caller wait
// for that or withdraw it. Device memory (dm not nil: buf's device side)
// goes by reference, delivered or queued: the message returned says when
// the receiver has taken it.
func (c *rankComm) sendNoWait(buf comm.Buffer, dst, tag int, ready time.Time, byRef bool, dm *devMsg) (*mailbox, *message) {
	b := c.w.lockBox(mailKey{c.rank, dst, tag})
	defer c.w.unlockBox(b)
	m := message{dtype: buf.DType(), n: buf.Len(), ready: ready, dev: dm}
	if dm != nil {
		m.consumed = make(chan struct{})
	}
	if len(b.waiters) > 0 {
		r := b.waiters[0]
		b.waiters = b.waiters[1:]
		switch {
		case m.dev != nil:
		case hostBuf(r.buf):
			m.data = buf.Bytes() // copied at once
		default:
			// Copied into device memory once the receive takes it, which
			// may be after this call returned: a copy, given back then.
			m.data = getBytes(len(buf.Bytes()))
			copy(m.data, buf.Bytes())
		}
		r.deliver(m)
		if m.dev != nil {
			return b, &m
		}
		return nil, nil
	}
	switch {
	case m.dev != nil:
	case byRef:
		m.data = buf.Bytes()
		m.consumed = make(chan struct{})
	default:
		m.data = getBytes(len(buf.Bytes()))
		copy(m.data, buf.Bytes())
	}
	b.msgs = append(b.msgs, m)
	if m.consumed == nil {
		return b, nil
	}
	return b, &m
}

// detach replaces the data of the by-reference message marked by consumed, if
// it is still queued, by a copy, so that the sender may reuse its buffer.
func (b *mailbox) detach(consumed chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.msgs {
		if m := &b.msgs[i]; m.consumed == consumed {
			data := getBytes(len(m.data))
			copy(data, m.data)
			m.data, m.consumed = data, nil
			return
		}
	}
}

// withdraw removes the by-reference message marked by consumed from b if no
// receive has taken it yet.
func (b *mailbox) withdraw(consumed chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, m := range b.msgs {
		if m.consumed == consumed {
			b.msgs = append(b.msgs[:i], b.msgs[i+1:]...)
			return
		}
	}
}

// ISend starts Send and returns at once. Device memory (comm.Device) is
// handed over by reference, as SendRecv's send is (the buffer is not
// touched until Wait returns): the receiver copies it device to device,
// and Wait waits on the host for the receive to be posted, not for the
// copy, which the buffer's stream waits for.
func (c *rankComm) ISend(ctx context.Context, buf comm.Buffer, dst, tag int) (comm.Request, error) {
	d, ok := comm.InDeviceMemory(buf)
	if !ok {
		r, err := c.send(ctx, "ISend", buf, dst, tag)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
	if err := validDType("send", buf); err != nil {
		return nil, err
	}
	if err := c.checkPeer("ISend: destination", dst); err != nil {
		return nil, err
	}
	if err := c.check(ctx, func() string { return fmt.Sprintf("in ISend to rank %d with tag %d", dst, tag) }); err != nil {
		return nil, err
	}
	dc, err := c.devStart(buf)
	if err != nil {
		return nil, err
	}
	ready := c.w.p2pReady(time.Now(), buf)
	box, sent := c.sendNoWait(buf, dst, tag, ready, true, &devMsg{buf: d.Buf, ready: dc.ready})
	return &devSendRequest{c: c, box: box, sent: sent, dc: dc, dst: dst, tag: tag, ready: ready, n: buf.Len()}, nil
}

// devSendRequest is an ISend of device memory (see ISend).
type devSendRequest struct {
	c        *rankComm
	box      *mailbox
	sent     *message
	dc       *devCall
	dst, tag int
	ready    time.Time
	n        int
}

// Wait returns the message length once the receive has taken the message
// (and the modelled transfer is over); the buffer's stream waits for the
// receive's copy.
func (r *devSendRequest) Wait(ctx context.Context) (int, error) {
	if err := r.c.handedOver(ctx, "ISend", r.box, r.sent, r.dc, r.dst, r.tag); err != nil {
		return 0, err
	}
	if err := r.dc.finish(); err != nil {
		return 0, err
	}
	if err := r.c.w.sleepUntil(ctx, r.ready); err != nil {
		return 0, err
	}
	return r.n, nil
}

// sendRequest is an ISend whose data are already in the mailbox; with network
// emulation its Wait returns once the modelled transfer time has elapsed.
type sendRequest struct {
	c     *rankComm
	ready time.Time
	n     int
}

// Wait returns the message length once the modelled transfer is over.
func (r *sendRequest) Wait(ctx context.Context) (int, error) {
	if err := r.c.check(ctx, lit("waiting for ISend")); err != nil {
		return 0, err
	}
	if err := r.c.w.sleepUntil(ctx, r.ready); err != nil {
		return 0, err
	}
	return r.n, nil
}

// IRecv starts Recv and returns at once; it is matched, in issue order, with
// the sends from src with tag. A device buffer's stream waits for the copy
// into it from the request's Wait on (see Recv).
func (c *rankComm) IRecv(ctx context.Context, buf comm.Buffer, src, tag int) (comm.Request, error) {
	if err := c.checkRecv(buf, src); err != nil {
		return nil, err
	}
	if err := c.check(ctx, func() string { return fmt.Sprintf("in IRecv from rank %d with tag %d", src, tag) }); err != nil {
		return nil, err
	}
	dc, err := c.devStart(buf)
	if err != nil {
		return nil, err
	}
	return &recvRequest{c: c, r: c.post(buf, src, tag, dc), dc: dc}, nil
}

type recvRequest struct {
	c  *rankComm
	r  *recvWait
	dc *devCall
}

// Wait blocks until the message arrived and returns its length.
func (q *recvRequest) Wait(ctx context.Context) (int, error) { return q.c.recvDone(ctx, q.r, q.dc) }
