package cuda

import (
	"fmt"

	"github.com/sparsegrad/sparsegrad/device"
)

// maxPeers is the most buffers one PeerSum adds (the kernels' pointer
// parameters).
const maxPeers = 16

// MaxPeers implements comm.PeerDevice: the most buffers PeerSum adds.
func (d *Device) MaxPeers() int { return maxPeers }

// PeerSum implements comm.PeerDevice: on stream s, one kernel adds
// elements [lo, lo+n) of bufs (buffers of d, of one element type: float32,
// float16, int32 or int64) element by element, left to right in the order given,
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
		if b.DType() != dt || b.Len() < need || b.IsHost() || b.Device() != device.Device(d) {
			return fmt.Errorf("cuda: PeerSum of %d %v elements from %d: %v is not a buffer of %d or more on %v", n, dt, lo, b, need, d)
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
