package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
)

// TestStagedDeviceBuffers runs every communicator call with GPU buffers
// through comm.Staged over in-process ranks sharing the GPU, each rank on
// its own stream, and the same calls with host buffers: the results are
// bit-identical (Staged sums on the host in the canonical order).
func TestStagedDeviceBuffers(t *testing.T) {
	d := gpu(t)
	for _, n := range []int{1, 2, 3, 5} {
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
				recv = o.mk(make([]float32, counts[r]))
				if err := c.ReduceScatter(ctx, o.mk(xs[r][:total]), recv, counts); err != nil {
					return nil, nil, err
				}
				got = append(got, o.rd(recv))
				// A ring exchange, a non-blocking all-gather and a receive
				// into a longer buffer (only the message is copied back).
				recv = o.mk(make([]float32, 20))
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
				if _, err := req.Wait(ctx); err != nil {
					return nil, nil, err
				}
				return got, o.rdi(ib), c.Barrier(ctx)
			}
			run := func(onGPU bool) ([][][]float32, [][]int32) {
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
						if onGPU {
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
			hostOut, hostInts := run(false)
			devOut, devInts := run(true)
			for r := range n {
				for i := range hostOut[r] {
					if !sameBits(devOut[r][i], hostOut[r][i]) {
						t.Fatalf("rank %d call %d: device buffers %v…, host %v…", r, i, devOut[r][i][:min(3, len(devOut[r][i]))], hostOut[r][i][:min(3, len(hostOut[r][i]))])
					}
				}
				if !slices.Equal(devInts[r], hostInts[r]) {
					t.Fatalf("rank %d: non-blocking int32 all-gather differs", r)
				}
			}
		})
	}
	// A host communicator without Staged refuses device memory clearly.
	w := local.New(1)
	b := comm.OnDevice(upload(t, d.Stream(), make([]float32, 4)), d.Stream())
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "comm.Staged") {
				t.Errorf("an unstaged device buffer: %v", r)
			}
		}()
		w.Comm(0).AllGather(context.Background(), b, comm.OnDevice(upload(t, d.Stream(), make([]float32, 4)), d.Stream()))
	}()
}
