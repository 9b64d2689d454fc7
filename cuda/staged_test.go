package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
)

// TestStagedDeviceBuffers runs every communicator call with GPU buffers
// through comm.Staged over in-process ranks, each rank on its own stream,
// and the same calls with host buffers: the results are bit-identical. On
// one GPU the collectives run on the device (comm/local's device path: one
// kernel adds each chunk in the canonical order) and so do the
// point-to-point calls (device-to-device copies); so with the ranks on two
// GPUs that reach each other's memory (the emulated ones do;
// TestCollectivesAcrossGPUs also tests GPUs that do not, whose calls
// comm/local stages itself).
func TestStagedDeviceBuffers(t *testing.T) {
	d := gpu(t)
	devs := []*cuda.Device{d}
	if cuda.EmulateGPUs(t, 2) {
		d1, err := cuda.Open(1, cuda.Options{})
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, d1)
	}
	// 17 ranks: more than one kernel adds (cuda's MaxPeers), staged.
	for _, n := range []int{1, 2, 3, 5, 17} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 9))
			const L = 1037
			xs := make([][]float32, n)
			is := make([][]int32, n)
			for r := range n {
				xs[r] = randVec(rng, L, 1)
				is[r] = make([]int32, L)
				for i := range is[r] {
					is[r][i] = rng.Int32N(1 << 20)
				}
			}
			counts := make([]int, n)
			for r := range counts {
				counts[r] = (r*13 + 5) % 17
			}
			total := 0
			for _, c := range counts {
				total += c
			}
			// script runs the calls on one rank with buffers made by mk and
			// read back by rd; it returns everything received, in order.
			type io struct {
				mk  func(x []float32) comm.Buffer
				mki func(x []int32) comm.Buffer
				rd  func(b comm.Buffer) []float32
				rdi func(b comm.Buffer) []int32
			}
			script := func(ctx context.Context, c comm.Communicator, r int, o io) ([][]float32, []int32, error) {
				var got [][]float32
				b := o.mk(xs[r])
				if err := c.AllReduce(ctx, b); err != nil {
					return nil, nil, err
				}
				got = append(got, o.rd(b))
				recv := o.mk(make([]float32, n*10))
				if err := c.AllGather(ctx, o.mk(xs[r][:10]), recv); err != nil {
					return nil, nil, err
				}
				got = append(got, o.rd(recv))
				recv = o.mk(make([]float32, total))
				if err := c.AllGatherV(ctx, o.mk(xs[r][:counts[r]]), recv, counts); err != nil {
					return nil, nil, err
				}
				got = append(got, o.rd(recv))
				b = o.mk(xs[r])
				if err := c.Broadcast(ctx, b, n-1); err != nil {
					return nil, nil, err
				}
				got = append(got, o.rd(b))
				// A ring exchange, a non-blocking all-gather and a receive
				// into a longer buffer (only the message is copied back).
				recv = o.mk(make([]float32, 7+n+3))
				m, err := c.SendRecv(ctx, o.mk(xs[r][:7+r]), (r+1)%n, recv, (r+n-1)%n, 3)
				if err != nil {
					return nil, nil, err
				}
				got = append(got, o.rd(recv)[:m])
				ib := o.mki(make([]int32, n*L))
				req, err := c.IAllGather(ctx, o.mki(is[r]), ib)
				if err != nil {
					return nil, nil, err
				}
				// A non-blocking all-reduce of int32 and one of float32
				// in flight together.
				ir := o.mki(is[r])
				req2, err := comm.IAllReduce(ctx, c, ir)
				if err != nil {
					return nil, nil, err
				}
				fr := o.mk(xs[r][:333])
				req3, err := comm.IAllReduce(ctx, c, fr)
				if err != nil {
					return nil, nil, err
				}
				for _, q := range []comm.Request{req, req2, req3} {
					if _, err := q.Wait(ctx); err != nil {
						return nil, nil, err
					}
				}
				got = append(got, o.rd(fr))
				return got, append(o.rdi(ib), o.rdi(ir)...), c.Barrier(ctx)
			}
			run := func(gpus []*cuda.Device) ([][][]float32, [][]int32) {
				w := local.New(n)
				outs := make([][][]float32, n)
				ints := make([][]int32, n)
				errs := make([]error, n)
				var wg sync.WaitGroup
				for r := range n {
					wg.Go(func() {
						ctx := context.Background()
						c := w.Comm(r)
						o := io{
							mk:  func(x []float32) comm.Buffer { return comm.Float32s(slices.Clone(x)) },
							mki: func(x []int32) comm.Buffer { return comm.Int32s(slices.Clone(x)) },
							rd:  func(b comm.Buffer) []float32 { return slices.Clone([]float32(b.(comm.Float32s))) },
							rdi: func(b comm.Buffer) []int32 { return slices.Clone([]int32(b.(comm.Int32s))) },
						}
						if len(gpus) > 0 {
							d := gpus[r%len(gpus)]
							s, err := d.NewStream()
							if err != nil {
								errs[r] = err
								return
							}
							c = comm.Staged(c)
							o = io{
								mk: func(x []float32) comm.Buffer { return comm.OnDevice(upload(t, s, x), s) },
								mki: func(x []int32) comm.Buffer {
									b := allocInt32(t, d, len(x))
									if err := s.Copy(b, device.Host(x)); err != nil {
										t.Error(err)
									}
									return comm.OnDevice(b, s)
								},
								rd:  func(b comm.Buffer) []float32 { return download(t, s, b.(comm.Device).Buf) },
								rdi: func(b comm.Buffer) []int32 { return downloadInt32(t, s, b.(comm.Device).Buf) },
							}
						}
						outs[r], ints[r], errs[r] = script(ctx, c, r, o)
					})
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				return outs, ints
			}
			hostOut, hostInts := run(nil)
			for k := range devs {
				devOut, devInts := run(devs[:k+1])
				for r := range n {
					for i := range hostOut[r] {
						if !sameBits(devOut[r][i], hostOut[r][i]) {
							t.Fatalf("%d GPU(s), rank %d call %d: device buffers %v…, host %v…", k+1, r, i, devOut[r][i][:min(3, len(devOut[r][i]))], hostOut[r][i][:min(3, len(hostOut[r][i]))])
						}
					}
					if !slices.Equal(devInts[r], hostInts[r]) {
						t.Fatalf("%d GPU(s), rank %d: the non-blocking int32 calls differ", k+1, r)
					}
				}
			}
		})
	}
}

// TestDeviceCollectivesStayOnDevice: in-process ranks sharing a GPU reduce
// and gather their device buffers, and exchange them by SendRecv, without
// the host: no byte crosses, the host waits for nothing, an all-reduce is
// one launch per rank (its chunk's kernel), a SendRecv and an ISend/IRecv
// pair one copy, a Send/Recv pair two (Send copies into the world's
// message memory, allocated by a first Send before the counts).
func TestDeviceCollectivesStayOnDevice(t *testing.T) {
	d := gpu(t)
	const n, L = 4, 100003
	rng := rand.New(rand.NewPCG(3, 3))
	ctx := context.Background()
	w := local.New(n)
	bufs := make([]device.Buffer, n)
	recvs := make([]device.Buffer, n)
	streams := make([]device.Stream, n)
	want := make([]float32, L)
	for r := range n {
		s, err := d.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		x := randVec(rng, L, 1)
		streams[r], bufs[r] = s, upload(t, s, x)
		recvs[r] = upload(t, s, make([]float32, n*100))
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
	}
	// The host's sums, in the canonical order.
	hosts := make([]comm.Buffer, n)
	for r := range n {
		hosts[r] = comm.Float32s(download(t, streams[r], bufs[r]))
	}
	hw := local.New(n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			if err := hw.Comm(r).AllReduce(ctx, hosts[r]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	copy(want, hosts[0].(comm.Float32s))
	p2p, p2pI, p2pS := make([]device.Buffer, n), make([]device.Buffer, n), make([]device.Buffer, n)
	for r := range n {
		p2p[r] = upload(t, streams[r], make([]float32, 60))
		p2pI[r] = upload(t, streams[r], make([]float32, 60))
		p2pS[r] = upload(t, streams[r], make([]float32, 60))
		if err := streams[r].Synchronize(); err != nil {
			t.Fatal(err)
		}
	}
	// sendRing: rank r Sends its elements [10r+2, 10r+32) to rank r+1 and
	// Receives rank r−1's into p2pS.
	sendRing := func(c comm.Communicator, r int) {
		if err := c.Send(ctx, comm.OnDevice(bufs[r].Slice(10*r+2, 10*r+32), streams[r]), (r+1)%n, 7); err != nil {
			t.Errorf("rank %d's Send: %v", r, err)
		}
		if m, err := c.Recv(ctx, comm.OnDevice(p2pS[r], streams[r]), (r+n-1)%n, 7); err != nil || m != 30 {
			t.Errorf("rank %d's Recv: %d elements, %v", r, m, err)
		}
	}
	for r := range n {
		wg.Go(func() { sendRing(w.Comm(r), r) })
	}
	wg.Wait()
	before := cuda.Counts()
	for r := range n {
		wg.Go(func() {
			c := comm.Staged(w.Comm(r))
			if err := c.AllReduce(ctx, comm.OnDevice(bufs[r], streams[r])); err != nil {
				t.Error(err)
			}
			if err := c.AllGather(ctx, comm.OnDevice(bufs[r].Slice(0, 100), streams[r]), comm.OnDevice(recvs[r], streams[r])); err != nil {
				t.Error(err)
			}
			// A ring of SendRecvs after the all-reduce: rank r sends its
			// elements [10r, 10r+50).
			m, err := c.SendRecv(ctx, comm.OnDevice(bufs[r].Slice(10*r, 10*r+50), streams[r]), (r+1)%n, comm.OnDevice(p2p[r], streams[r]), (r+n-1)%n, 5)
			if err != nil || m != 50 {
				t.Errorf("rank %d's SendRecv: %d elements, %v", r, m, err)
			}
			// A ring of ISend/IRecv pairs (elements [10r+1, 10r+41)) and
			// one of Sends and Recvs.
			qr, err := c.IRecv(ctx, comm.OnDevice(p2pI[r], streams[r]), (r+n-1)%n, 6)
			if err != nil {
				t.Error(err)
				return
			}
			qs, err := c.ISend(ctx, comm.OnDevice(bufs[r].Slice(10*r+1, 10*r+41), streams[r]), (r+1)%n, 6)
			if err != nil {
				t.Error(err)
				return
			}
			if m, err := qr.Wait(ctx); err != nil || m != 40 {
				t.Errorf("rank %d's IRecv: %d elements, %v", r, m, err)
			}
			if _, err := qs.Wait(ctx); err != nil {
				t.Errorf("rank %d's ISend: %v", r, err)
			}
			sendRing(c, r)
		})
	}
	wg.Wait()
	got := cuda.Counts().Sub(before)
	if got.Syncs != 0 || got.HtoD != 0 || got.DtoH != 0 || got.Allocs != 0 || got.Launches != n*(5+n) {
		t.Errorf("4 ranks' all-reduce, all-gather, SendRecv, ISend/IRecv and Send/Recv on the device: %v; want no sync, no byte and %d launches (a kernel and %d copies per rank, a copy for the SendRecv and the ISend, two for the Send)", got, n*(5+n), n)
	}
	for r := range n {
		src := (r + n - 1) % n
		if g := download(t, streams[r], p2p[r]); !sameBits(g[:50], want[10*src:10*src+50]) || !sameBits(g[50:], make([]float32, 10)) {
			t.Fatalf("rank %d received %v…, want rank %d's elements from %d", r, g[:3], src, 10*src)
		}
		if g := download(t, streams[r], p2pI[r]); !sameBits(g[:40], want[10*src+1:10*src+41]) || !sameBits(g[40:], make([]float32, 20)) {
			t.Fatalf("rank %d's IRecv received %v…, want rank %d's elements from %d", r, g[:3], src, 10*src+1)
		}
		if g := download(t, streams[r], p2pS[r]); !sameBits(g[:30], want[10*src+2:10*src+32]) || !sameBits(g[30:], make([]float32, 30)) {
			t.Fatalf("rank %d's Recv received %v…, want rank %d's elements from %d", r, g[:3], src, 10*src+2)
		}
	}
	for r := range n {
		if g := download(t, streams[r], bufs[r]); !sameBits(g, want) {
			t.Fatalf("rank %d: the device all-reduce differs from the host's", r)
		}
		g := download(t, streams[r], recvs[r])
		for q := range n {
			if !sameBits(g[q*100:(q+1)*100], want[:100]) {
				t.Fatalf("rank %d: the all-gather's block %d differs", r, q)
			}
		}
	}
}
