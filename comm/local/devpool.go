package local

import (
	"errors"
	"fmt"
	"sync"

	"github.com/sparsegrad/sparsegrad/device"
)

// devBlock is device memory of a rank holding a message that Send
// sent from device memory: the sender copies its buffer into a block
// on its stream and goes on (the host waits for nothing), the receive
// copies out of the block and gives it back with the event of that copy.
type devBlock struct {
	buf device.Buffer
	// filled is the copy into buf, busy the last copy out of it (nil:
	// none pending): a sender's stream waits for busy before it writes buf
	// again.
	filled, busy device.Event
}

// devPool is a rank's blocks, kept for the world's life (freed when Run
// ends).
// A new block is as large as the largest before it, so that once as many
// messages as ever are in flight at once, of sizes no larger than before,
// messages allocate nothing (a method's message sizes vary from step to
// step).
type devPool struct {
	mu      sync.Mutex
	free    map[device.Device][]*devBlock
	all     []*devBlock
	largest int // bytes of the largest block
}

// get returns a free block of dev of at least n bytes (the smallest that
// fits), else a new one of the next power of two of n bytes, 4 KiB at
// least and no smaller than the largest block.
func (p *devPool) get(dev device.Device, n int) (*devBlock, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	free := p.free[dev]
	best := -1
	for i, b := range free {
		if b.buf.Bytes() >= n && (best < 0 || b.buf.Bytes() < free[best].buf.Bytes()) {
			best = i
		}
	}
	if best >= 0 {
		b := free[best]
		free[best] = free[len(free)-1]
		p.free[dev] = free[:len(free)-1]
		return b, nil
	}
	size := max(4096, p.largest)
	for size < n {
		size *= 2
	}
	p.largest = size
	buf, err := dev.Alloc(device.Float32, size/4)
	if err != nil {
		return nil, fmt.Errorf("local: device memory for a message of %d bytes on %v: %w", n, dev, err)
	}
	b := &devBlock{buf: buf}
	p.all = append(p.all, b)
	return b, nil
}

// put gives b back; busy is the copy still reading it (nil: none).
func (p *devPool) put(b *devBlock, busy device.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b.busy = busy
	if p.free == nil {
		p.free = map[device.Device][]*devBlock{}
	}
	d := b.buf.Device()
	p.free[d] = append(p.free[d], b)
}

// close waits for the copies into and out of every block that are not
// known to be done and frees the blocks.
func (p *devPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, b := range p.all {
		for _, ev := range []device.Event{b.filled, b.busy} {
			if d, ok := ev.(interface{ Done() bool }); ev != nil && (!ok || !d.Done()) {
				errs = append(errs, ev.Synchronize())
			}
		}
		errs = append(errs, b.buf.Device().Free(b.buf))
	}
	p.all, p.free = nil, nil
	return errors.Join(errs...)
}
