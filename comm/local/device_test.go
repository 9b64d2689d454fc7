package local

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

// fakeDev is a comm.PeerDevice whose "device memory" is host memory the
// host reaches only through addresses, and whose streams run their work
// when it is issued (so events are done when recorded): it checks the
// device path's logic and, under the race detector, its concurrency (the
// cuda package's tests run it on the emulated GPU). Fake devices reach
// each other's memory unless one of them is noPeer; their PeerSum and
// copies refuse memory they do not reach.
type fakeDev struct {
	mu     sync.Mutex
	mem    [][]byte
	peers  int
	noPeer bool
	sums   int // PeerSum calls
}

func (d *fakeDev) Reaches(o device.Device) bool {
	g, ok := o.(*fakeDev)
	return g == d || (ok && !d.noPeer && !g.noPeer)
}

// mine returns b's memory where d reaches it.
func (d *fakeDev) mine(b device.Buffer) ([]byte, error) {
	if b.IsHost() {
		return b.HostBytes(), nil
	}
	if !d.Reaches(b.Device()) {
		return nil, fmt.Errorf("fake device: %v is not memory it reaches", b)
	}
	return b.Device().(*fakeDev).bytes(b), nil
}

func (d *fakeDev) Kind() device.Kind { return device.CUDAKind }
func (d *fakeDev) String() string    { return "fake device" }
func (d *fakeDev) Alloc(dt device.DType, n int) (device.Buffer, error) {
	b := make([]byte, n*dt.Size()+8)
	d.mu.Lock()
	d.mem = append(d.mem, b)
	d.mu.Unlock()
	return device.NewDeviceBuffer(d, dt, n, uintptr(unsafe.Pointer(&b[0]))), nil
}
func (d *fakeDev) Free(device.Buffer) error          { return nil }
func (d *fakeDev) Stream() device.Stream             { return fakeStream{d} }
func (d *fakeDev) NewStream() (device.Stream, error) { return fakeStream{d}, nil }
func (d *fakeDev) Math() device.Math                 { return nil }
func (d *fakeDev) Close() error                      { return nil }
func (d *fakeDev) MaxPeers() int                     { return d.peers }

// bytes is b's memory (found by its address among the allocations).
func (d *fakeDev) bytes(b device.Buffer) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range d.mem {
		base := uintptr(unsafe.Pointer(&m[0]))
		if a := b.Addr(); a >= base && a < base+uintptr(len(m)) {
			off := int(a - base)
			return m[off : off+b.Bytes()]
		}
	}
	panic(fmt.Sprintf("%v is not memory of the fake device", b))
}
func (d *fakeDev) f32s(b device.Buffer) []float32 {
	m := d.bytes(b)
	if len(m) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&m[0])), b.Len())
}
func (d *fakeDev) upload(x []float32) device.Buffer {
	b, _ := d.Alloc(device.Float32, len(x))
	copy(d.f32s(b), x)
	return b
}
func (d *fakeDev) download(b device.Buffer) []float32           { return slices.Clone(d.f32s(b)) }
func (d *fakeDev) buf(x []float32, s device.Stream) comm.Buffer { return comm.OnDevice(d.upload(x), s) }

func (d *fakeDev) PeerSum(_ device.Stream, bufs []device.Buffer, lo, n int, out device.Buffer) error {
	if len(bufs) > d.peers {
		return fmt.Errorf("%d buffers, %d peers", len(bufs), d.peers)
	}
	f32s := func(b device.Buffer) []float32 {
		if _, err := d.mine(b); err != nil {
			panic(err)
		}
		return b.Device().(*fakeDev).f32s(b)
	}
	for _, b := range append(slices.Clip(bufs), out) {
		if _, err := d.mine(b); err != nil && b.Len() > 0 {
			return err
		}
	}
	d.mu.Lock()
	d.sums++
	d.mu.Unlock()
	for i := range n {
		acc := f32s(bufs[0])[lo+i]
		for _, b := range bufs[1:] {
			acc += f32s(b)[lo+i]
		}
		if out.Len() > 0 {
			f32s(out)[i] = acc
		} else {
			for _, b := range bufs {
				f32s(b)[lo+i] = acc
			}
		}
	}
	return nil
}

type fakeStream struct{ d *fakeDev }

func (s fakeStream) Device() device.Device { return s.d }
func (s fakeStream) Copy(dst, src device.Buffer) error {
	if err := device.CheckSame("copy", dst, src); err != nil {
		return err
	}
	to, err := s.d.mine(dst)
	if err != nil {
		return err
	}
	from, err := s.d.mine(src)
	if err != nil {
		return err
	}
	copy(to, from)
	return nil
}
func (s fakeStream) Synchronize() error            { return nil }
func (s fakeStream) Record() (device.Event, error) { return fakeEvent{}, nil }
func (s fakeStream) Wait(device.Event) error       { return nil }

type fakeEvent struct{}

func (fakeEvent) Synchronize() error       { return nil }
func (fakeEvent) Time() (time.Time, error) { return time.Time{}, nil }

// TestDeviceCollectives runs the collectives on device buffers (fake
// comm.PeerDevices: one, or two the ranks take in turn, which reach each
// other's memory or not) and on host buffers: the results are
// bit-identical, on the device path (one PeerSum per rank for the sums,
// each on its rank's device) and where the sums need more peers than the
// device adds at once or the devices do not reach each other (staged
// through host memory).
func TestDeviceCollectives(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		for _, peers := range []int{16, 2} {
			for _, ndev := range []string{"one device", "two devices", "two devices without peer access"} {
				if peers == 2 && ndev != "one device" {
					continue
				}
				t.Run(fmt.Sprintf("n=%d/peers=%d/%s", n, peers, ndev), func(t *testing.T) {
					testDeviceCollectives(t, n, peers, ndev)
				})
			}
		}
	}
}

func testDeviceCollectives(t *testing.T, n, peers int, ndev string) {
	devs := []*fakeDev{{peers: peers}}
	if ndev != "one device" {
		noPeer := ndev == "two devices without peer access"
		devs = []*fakeDev{{peers: peers, noPeer: noPeer}, {peers: peers, noPeer: noPeer}}
	}
	rng := rand.New(rand.NewPCG(uint64(n), uint64(peers)))
	const L = 257
	xs := make([][]float32, n)
	for r := range xs {
		xs[r] = make([]float32, L)
		for i := range xs[r] {
			xs[r][i] = float32(rng.NormFloat64())
		}
	}
	counts := make([]int, n)
	total := 0
	for r := range counts {
		counts[r] = (r*7 + 3) % 11
		total += counts[r]
	}
	type io struct {
		mk func(x []float32) comm.Buffer
		rd func(b comm.Buffer) []float32
	}
	script := func(ctx context.Context, c comm.Communicator, r int, o io) ([][]float32, error) {
		var got [][]float32
		b := o.mk(xs[r])
		if err := c.AllReduce(ctx, b); err != nil {
			return nil, err
		}
		got = append(got, o.rd(b))
		recv := o.mk(make([]float32, n*5))
		if err := c.AllGather(ctx, o.mk(xs[r][:5]), recv); err != nil {
			return nil, err
		}
		got = append(got, o.rd(recv))
		recv = o.mk(make([]float32, total))
		if err := c.AllGatherV(ctx, o.mk(xs[r][1:1+counts[r]]), recv, counts); err != nil {
			return nil, err
		}
		got = append(got, o.rd(recv))
		b = o.mk(xs[r])
		if err := c.Broadcast(ctx, b, n-1); err != nil {
			return nil, err
		}
		got = append(got, o.rd(b))
		b, b2 := o.mk(xs[r][:100]), o.mk(xs[r][100:])
		q, err := comm.IAllReduce(ctx, c, b)
		if err != nil {
			return nil, err
		}
		q2, err := comm.IAllReduce(ctx, c, b2)
		if err != nil {
			return nil, err
		}
		if _, err := q2.Wait(ctx); err != nil {
			return nil, err
		}
		if _, err := q.Wait(ctx); err != nil {
			return nil, err
		}
		return append(got, o.rd(b), o.rd(b2)), nil
	}
	run := func(dev bool) [][][]float32 {
		out := make([][][]float32, n)
		err := Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
			o := io{mk: func(x []float32) comm.Buffer { return comm.Float32s(slices.Clone(x)) }, rd: func(b comm.Buffer) []float32 { return slices.Clone([]float32(b.(comm.Float32s))) }}
			if dev {
				d := devs[c.Rank()%len(devs)]
				s, _ := d.NewStream()
				o = io{mk: func(x []float32) comm.Buffer { return d.buf(x, s) }, rd: func(b comm.Buffer) []float32 {
					if b.Len() == 0 {
						return nil
					}
					return d.download(b.(comm.Device).Buf)
				}}
			}
			var err error
			out[c.Rank()], err = script(ctx, c, c.Rank(), o)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	host, dev := run(false), run(true)
	for r := range n {
		for i := range host[r] {
			if !slices.Equal(dev[r][i], host[r][i]) && len(dev[r][i])+len(host[r][i]) > 0 {
				t.Fatalf("rank %d call %d: device %v, host %v", r, i, dev[r][i], host[r][i])
			}
		}
	}
	// The sums on the device: three all-reduces, one PeerSum
	// per rank and call on its rank's device (ranks with an
	// empty chunk launch none).
	sums := 0
	for _, d := range devs {
		sums += d.sums
		if peers >= n && !d.noPeer && d.sums == 0 {
			t.Errorf("%s: no PeerSum on one of the devices", ndev)
		}
	}
	if peers >= n && !devs[0].noPeer && (sums == 0 || sums > 3*n) {
		t.Errorf("%d PeerSums on the device path, want 1 to %d", sums, 3*n)
	}
	if peers < n && sums != 0 {
		t.Errorf("%d PeerSums with more ranks than the device adds at once; want them staged", sums)
	}
	if devs[0].noPeer && sums != 0 {
		t.Errorf("%d PeerSums on devices that do not reach each other; want them staged", sums)
	}
}

// p2pMessages returns rank r's message of the point-to-point tests for n
// ranks: (5r+2) mod 7 normal values (2, 0, 5, 3, 1, …: empty ones
// included), drawn with seed.
func p2pMessages(n int, seed uint64) [][]float32 {
	rng := rand.New(rand.NewPCG(uint64(n), seed))
	msg := make([][]float32, n)
	for r := range msg {
		msg[r] = make([]float32, (r*5+2)%7)
		for i := range msg[r] {
			msg[r][i] = float32(rng.NormFloat64())
		}
	}
	return msg
}

// p2pBuffers returns rank r's device for a point-to-point test mode
// ("host", "device", "two devices", "two devices without peer access":
// rank r on devs[r%2], "device to host", "host to device"), and the makers
// of its send and receive buffers: host copies, or device buffers on a
// stream of the rank's own.
func p2pBuffers(mode string, devs []*fakeDev, r int) (d *fakeDev, mkSend, mkRecv func([]float32) comm.Buffer) {
	d = devs[0]
	if strings.HasPrefix(mode, "two devices") {
		d = devs[r%2]
	}
	s, _ := d.NewStream()
	host := func(x []float32) comm.Buffer { return comm.Float32s(slices.Clone(x)) }
	dev := func(x []float32) comm.Buffer { return d.buf(x, s) }
	mkSend, mkRecv = host, host
	switch mode {
	case "device", "two devices", "two devices without peer access":
		mkSend, mkRecv = dev, dev
	case "device to host":
		mkSend = dev
	case "host to device":
		mkRecv = dev
	}
	return d, mkSend, mkRecv
}

// TestDeviceSendRecv: SendRecv of device buffers (one fake device, or two:
// reaching each other's memory, copied device to device, or not, copied
// through host memory), of host buffers, and mixed
// (a device send into a host receive and the reverse) gives what it gives
// on host buffers: a ring in both directions and pairwise exchanges, with
// messages of different lengths (empty ones included) into longer receive
// buffers, for 1, 2, 3 and 5 ranks.
func TestDeviceSendRecv(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		for _, mode := range []string{"host", "device", "two devices", "two devices without peer access", "device to host", "host to device"} {
			t.Run(fmt.Sprintf("n=%d/%s", n, mode), func(t *testing.T) {
				noPeer := mode == "two devices without peer access"
				devs := []*fakeDev{{peers: 16, noPeer: noPeer}, {peers: 16, noPeer: noPeer}}
				msg := p2pMessages(n, 7)
				// Rank r's step s: send to (r+s)%n, receive from (r−s)%n; in
				// the last step partners pair up (r^1 where it exists).
				peers := func(r, s int) (dst, src int) {
					if s == n {
						if p := r ^ 1; p < n {
							return p, p
						}
						return r, r
					}
					return (r + s) % n, (r - s + n) % n
				}
				run := func(mode string) [][]float32 {
					out := make([][]float32, n)
					err := Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
						r := c.Rank()
						d, mkSend, mkRecv := p2pBuffers(mode, devs, r)
						for step := 0; step <= n; step++ {
							dst, src := peers(r, step)
							recv := mkRecv(make([]float32, 8))
							got, err := c.SendRecv(ctx, mkSend(msg[r]), dst, recv, src, step)
							if err != nil {
								return err
							}
							var v []float32
							if h, ok := recv.(comm.Float32s); ok {
								v = []float32(h)
							} else {
								v = d.download(recv.(comm.Device).Buf)
							}
							out[r] = append(append(out[r], float32(got)), v[:got]...)
						}
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
					return out
				}
				want, got := run("host"), run(mode)
				for r := range n {
					if !slices.Equal(got[r], want[r]) {
						t.Fatalf("rank %d received %v, on the host %v", r, got[r], want[r])
					}
					if len(want[r]) == 0 {
						t.Fatalf("rank %d received nothing", r)
					}
				}
				// The host's: what each source sent.
				for r := range n {
					var exp []float32
					for step := 0; step <= n; step++ {
						_, src := peers(r, step)
						exp = append(append(exp, float32(len(msg[src]))), msg[src]...)
					}
					if !slices.Equal(want[r], exp) {
						t.Fatalf("rank %d received %v, want %v", r, want[r], exp)
					}
				}
			})
		}
	}
}

// TestDevicePointToPoint: Send, ISend, Recv and IRecv of device memory
// (fake devices: one, two that reach each other or not, a device send into
// a host receive and the reverse) give what they give on host buffers, in
// a ring in both directions with messages of different lengths (empty ones
// included) into longer receive buffers, sent before and after their
// receive is posted, for 1, 2, 3 and 5 ranks. The sender writes its
// buffer again as soon as Send returns (the message is a copy) or ISend's
// Wait does, and the device memory of Send's messages is reused: all
// rounds allocate no more blocks than two rounds' messages.
func TestDevicePointToPoint(t *testing.T) {
	const rounds = 3
	for _, n := range []int{1, 2, 3, 5} {
		for _, mode := range []string{"host", "device", "two devices", "two devices without peer access", "device to host", "host to device"} {
			t.Run(fmt.Sprintf("n=%d/%s", n, mode), func(t *testing.T) {
				noPeer := mode == "two devices without peer access"
				devs := []*fakeDev{{peers: 16, noPeer: noPeer}, {peers: 16, noPeer: noPeer}}
				msg := p2pMessages(n, 9)
				allocs := func() int {
					devs[0].mu.Lock()
					devs[1].mu.Lock()
					defer devs[0].mu.Unlock()
					defer devs[1].mu.Unlock()
					return len(devs[0].mem) + len(devs[1].mem)
				}
				run := func(mode string) [][]float32 {
					out := make([][]float32, n)
					var before int
					err := Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
						r := c.Rank()
						d, mkSend, mkRecv := p2pBuffers(mode, devs, r)
						// Step s (1..n) of a round: send to (r+s)%n, receive
						// from (r−s)%n; tags: round, step and call.
						sends, recvs := make([]comm.Buffer, n+1), make([]comm.Buffer, n+1)
						for step := 1; step <= n; step++ {
							sends[step], recvs[step] = mkSend(msg[r]), mkRecv(make([]float32, 8))
						}
						// overwrite writes the sender's buffer again.
						overwrite := func(b comm.Buffer) {
							v, ok := b.(comm.Float32s)
							if !ok {
								v = d.f32s(b.(comm.Device).Buf)
							}
							for i := range v {
								v[i] = -1e9
							}
						}
						restore := func(b comm.Buffer) {
							if v, ok := b.(comm.Float32s); ok {
								copy(v, msg[r])
							} else {
								copy(d.f32s(b.(comm.Device).Buf), msg[r])
							}
						}
						read := func(b comm.Buffer, got int) {
							var v []float32
							if h, ok := b.(comm.Float32s); ok {
								v = []float32(h)
							} else {
								v = d.download(b.(comm.Device).Buf)
							}
							out[r] = append(append(out[r], float32(got)), v[:got]...)
						}
						if err := c.Barrier(ctx); err != nil {
							return err
						}
						if r == 0 {
							before = allocs()
						}
						for round := range rounds {
							// Blocking: every send before every receive.
							for step := 1; step <= n; step++ {
								restore(sends[step])
								if err := c.Send(ctx, sends[step], (r+step)%n, 100*round+step); err != nil {
									return err
								}
								overwrite(sends[step])
							}
							for step := 1; step <= n; step++ {
								got, err := c.Recv(ctx, recvs[step], (r-step+n)%n, 100*round+step)
								if err != nil {
									return err
								}
								read(recvs[step], got)
							}
							// Non-blocking: receives posted first, waited for last.
							var reqs []comm.Request
							for step := 1; step <= n; step++ {
								q, err := c.IRecv(ctx, recvs[step], (r-step+n)%n, 100*round+50+step)
								if err != nil {
									return err
								}
								reqs = append(reqs, q)
							}
							for step := 1; step <= n; step++ {
								restore(sends[step])
								q, err := c.ISend(ctx, sends[step], (r+step)%n, 100*round+50+step)
								if err != nil {
									return err
								}
								reqs = append(reqs, q)
							}
							for i, q := range reqs {
								got, err := q.Wait(ctx)
								if err != nil {
									return err
								}
								if i < n {
									read(recvs[i+1], got)
								} else {
									overwrite(sends[i-n+1]) // its own again
								}
							}
							if err := c.Barrier(ctx); err != nil {
								return err
							}
						}
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
					if a := allocs() - before; a > 2*n*n {
						t.Errorf("%d allocations for %d messages, want at most %d (the messages of two rounds)", a, 2*rounds*n*n, 2*n*n)
					}
					return out
				}
				want, got := run("host"), run(mode)
				for r := range n {
					if !slices.Equal(got[r], want[r]) {
						t.Fatalf("rank %d received %v, on the host %v", r, got[r], want[r])
					}
				}
				// The host's: what each source sent.
				for r := range n {
					var exp []float32
					for range rounds {
						for range 2 {
							for step := 1; step <= n; step++ {
								src := (r - step + n) % n
								exp = append(append(exp, float32(len(msg[src]))), msg[src]...)
							}
						}
					}
					if !slices.Equal(want[r], exp) {
						t.Fatalf("rank %d received %v, want %v", r, want[r], exp)
					}
				}
			})
		}
	}
}

// TestDeviceISendToExitedRank: an ISend of device memory, handed over by
// reference, waits for its receive; a destination that returns without
// receiving makes Wait fail, saying so, instead of hanging.
func TestDeviceISendToExitedRank(t *testing.T) {
	d := &fakeDev{peers: 4}
	var got error
	err := Run(context.Background(), 2, func(ctx context.Context, c comm.Communicator) error {
		if c.Rank() == 1 {
			return nil
		}
		s, _ := d.NewStream()
		q, err := c.ISend(ctx, d.buf([]float32{1, 2, 3}, s), 1, 7)
		if err != nil {
			return err
		}
		_, got = q.Wait(ctx)
		return got
	})
	if err == nil || got == nil || !strings.Contains(got.Error(), "rank 1 has returned from its worker function") {
		t.Fatalf("Run: %v; Wait: %v; want Wait to fail naming rank 1's return", err, got)
	}
}
