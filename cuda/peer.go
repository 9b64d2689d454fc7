package cuda

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/sparsegrad/sparsegrad/device"
)

// maxPeers is the most buffers one PeerSum adds (the kernels' pointer
// parameters).
const maxPeers = 16

// MaxPeers implements comm.PeerDevice: the most buffers PeerSum adds.
func (d *Device) MaxPeers() int { return maxPeers }

// peerAccess is what Reaches has found, per ordered pair of Devices (both
// directions are asked and enabled together).
var peerAccess struct {
	mu    sync.Mutex
	known map[[2]*Device]bool
}

// Reaches implements comm.PeerDevice: whether d's kernels and copies read
// and write o's memory by its (unified) addresses. A Device of the same GPU
// shares its primary context and does; another GPU of the process does
// where each can access the other's memory (cuDeviceCanAccessPeer both
// ways: NVLink, or PCIe with peer-to-peer). Peer access is enabled both
// ways on the first ask (cuCtxEnablePeerAccess; already enabled, by
// another Device of the GPU, is fine) and the answer kept. Where the GPUs
// cannot, the log says so once: their in-process collectives are then
// staged through host memory.
func (d *Device) Reaches(o device.Device) bool {
	g, ok := o.(*Device)
	if !ok {
		return false
	}
	if g == d || g.dev == d.dev {
		return true
	}
	peerAccess.mu.Lock()
	defer peerAccess.mu.Unlock()
	if can, ok := peerAccess.known[[2]*Device{d, g}]; ok {
		return can
	}
	err := d.enablePeer(g)
	if err == nil {
		err = g.enablePeer(d)
	}
	if err != nil {
		slog.Info("cuda: these GPUs cannot access each other's memory; the collectives of in-process workers on both are staged through page-locked host memory",
			"gpus", fmt.Sprintf("%d, %d", d.ordinal, g.ordinal), "why", err)
	}
	if peerAccess.known == nil {
		peerAccess.known = map[[2]*Device]bool{}
	}
	peerAccess.known[[2]*Device{d, g}] = err == nil
	peerAccess.known[[2]*Device{g, d}] = err == nil
	return err == nil
}

// forgetPeers drops what Reaches found for d (closed: a Device opened
// later asks again), so that a process opening GPUs run after run keeps
// no closed Device.
func forgetPeers(d *Device) {
	peerAccess.mu.Lock()
	defer peerAccess.mu.Unlock()
	for k := range peerAccess.known {
		if k[0] == d || k[1] == d {
			delete(peerAccess.known, k)
		}
	}
}

// enablePeer lets d's context access g's memory, where the hardware can.
func (d *Device) enablePeer(g *Device) error {
	var can int32
	if err := check("cuDeviceCanAccessPeer", drv.cuDeviceCanAccessPeer(&can, d.dev, g.dev)); err != nil {
		return err
	}
	if can == 0 {
		return fmt.Errorf("cuda: GPU %d cannot access GPU %d's memory (cuDeviceCanAccessPeer: no peer-to-peer path; nvidia-smi topo -p2p r shows it)", d.ordinal, g.ordinal)
	}
	unlock, err := d.enter()
	if err != nil {
		return err
	}
	defer unlock()
	if r := drv.cuCtxEnablePeerAccess(g.ctx, 0); r != 0 && r != errPeerEnabled {
		return fmt.Errorf("cuda: enabling GPU %d's access to GPU %d's memory: %w", d.ordinal, g.ordinal, check("cuCtxEnablePeerAccess", r))
	}
	return nil
}

// reachable reports whether b is memory d's kernels and copies reach (d's
// own, or of a GPU it Reaches).
func (d *Device) reachable(b device.Buffer) bool {
	return !b.IsHost() && (b.Device() == device.Device(d) || d.Reaches(b.Device()))
}

// PeerSum implements comm.PeerDevice: on stream s, one kernel adds
// elements [lo, lo+n) of bufs (buffers of d or of GPUs d Reaches, of one
// element type: float32, float16, int32 or int64) element by element, left
// to right in the order given,
// and stores the sums into out[0, n), or where out is empty back into
// elements [lo, lo+n) of every one of bufs. The additions are the host's
// in the same order (comm/local's), so the bits are too.
func (d *Device) PeerSum(s device.Stream, bufs []device.Buffer, lo, n int, out device.Buffer) error {
	cs, err := d.math.stream(s)
	if err != nil {
		return err
	}
	if len(bufs) == 0 || len(bufs) > maxPeers {
		return fmt.Errorf("cuda: PeerSum of %d buffers: 1 to %d can be added in one launch", len(bufs), maxPeers)
	}
	dt := bufs[0].DType()
	var name kernelRef
	switch dt {
	case device.Float32:
		name = kPeerSumF32
	case device.Int32:
		name = kPeerSumI32
	case device.Int64:
		name = kPeerSumI64
	case device.Float16: // each addition rounded to half, as device.AddFloat16
		name = kPeerSumF16
	default:
		return fmt.Errorf("cuda: PeerSum of %v: float32, float16, int32 and int64 can be added", dt)
	}
	if n == 0 {
		return nil
	}
	check := func(b device.Buffer, need int) error {
		if b.DType() != dt || b.Len() < need || !d.reachable(b) {
			return fmt.Errorf("cuda: PeerSum of %d %v elements from %d: %v is not a buffer of %d or more on %v or a GPU it reaches (Reaches)", n, dt, lo, b, need, d)
		}
		return nil
	}
	for _, b := range bufs {
		if err := check(b, lo+n); err != nil {
			return err
		}
	}
	l := cs.args()
	if out.Len() > 0 {
		if err := check(out, n); err != nil {
			return err
		}
		l.buf(out)
	} else {
		l.slot(0)
	}
	l.i64(lo).i64(n).i32(len(bufs))
	for i := range maxPeers {
		if i < len(bufs) {
			l.buf(bufs[i])
		} else {
			l.slot(0)
		}
	}
	return l.runN(name, n)
}
