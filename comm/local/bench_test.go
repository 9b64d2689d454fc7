package local

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

// resnet18Params is the number of float32 parameters of the CIFAR ResNet-18.
const resnet18Params = 11_173_962

// memcpyRanks is the yardstick: n goroutines each copy m float32 from their
// own source to their own destination, iters times.
func memcpyRanks(dst, src [][]float32, iters int) {
	var wg sync.WaitGroup
	for r := range dst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range iters {
				copy(dst[r], src[r])
			}
		}()
	}
	wg.Wait()
}

func rankBufs(n, m int) [][]float32 {
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, m)
		for i := range bufs[r] {
			bufs[r][i] = float32(i%1000) * 1e-6
		}
	}
	return bufs
}

// BenchmarkAllReduce all-reduces ResNet-18's gradient size on n in-process
// ranks. Bytes counted per operation: n·m·4, every rank's buffer once — the
// least any all-reduce must touch (read every input, write every output),
// which is also exactly what the memcpy yardstick copies.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		m := resnet18Params
		b.Run(fmt.Sprintf("n=%d/local", n), func(b *testing.B) {
			bufs := rankBufs(n, m)
			b.SetBytes(int64(n * m * 4))
			b.ResetTimer()
			err := Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
				for range b.N {
					if err := c.AllReduce(ctx, comm.Float32s(bufs[c.Rank()])); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
		b.Run(fmt.Sprintf("n=%d/memcpy", n), func(b *testing.B) {
			src, dst := rankBufs(n, m), rankBufs(n, m)
			b.SetBytes(int64(n * m * 4))
			b.ResetTimer()
			memcpyRanks(dst, src, b.N)
		})
	}
}

// BenchmarkAllGatherV gathers ResNet-18's size, split near-evenly over n
// ranks, into every rank. Bytes counted: n·m·4, the bytes written into all
// receive buffers; the yardstick copies the same.
func BenchmarkAllGatherV(b *testing.B) {
	for _, n := range []int{2, 4} {
		m := resnet18Params
		counts := make([]int, n)
		for r := range counts {
			lo, hi := comm.ChunkBounds(m, n, r)
			counts[r] = hi - lo
		}
		b.Run(fmt.Sprintf("n=%d/local", n), func(b *testing.B) {
			recv := rankBufs(n, m)
			send := make([][]float32, n)
			for r := range send {
				send[r] = make([]float32, counts[r])
			}
			b.SetBytes(int64(n * m * 4))
			b.ResetTimer()
			err := Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
				for range b.N {
					if err := c.AllGatherV(ctx, comm.Float32s(send[c.Rank()]), comm.Float32s(recv[c.Rank()]), counts); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
		b.Run(fmt.Sprintf("n=%d/memcpy", n), func(b *testing.B) {
			src, dst := rankBufs(n, m), rankBufs(n, m)
			b.SetBytes(int64(n * m * 4))
			b.ResetTimer()
			memcpyRanks(dst, src, b.N)
		})
	}
}

// BenchmarkSmallAllReduce measures the per-call overhead of the rendezvous.
func BenchmarkSmallAllReduce(b *testing.B) {
	for _, n := range []int{2, 4, 16} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			err := Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
				buf := make(comm.Float32s, 16)
				for range b.N {
					if err := c.AllReduce(ctx, buf); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkSumInto measures the reduction kernel alone on one core: the sum
// of n sources of m float32 (an all-reduce chunk of ResNet-18 on n ranks).
// Bytes counted: the n·m·4 bytes read.
func BenchmarkSumInto(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		m := resnet18Params / n
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			srcs := rankBufs(n, m)
			b.SetBytes(int64(n * m * 4))
			b.ResetTimer()
			for range b.N {
				sumInto(srcs[n-1], srcs)
			}
		})
	}
}

// interleaved times op and the memcpy yardstick alternately, b.N times each,
// so that both see the same machine load, and reports op-GB/s, memcpy-GB/s
// and ratio-% (op bandwidth / memcpy bandwidth) for the given bytes per call.
func interleaved(b *testing.B, n, m int, bytes int64, op func() error) {
	src, dst := rankBufs(n, m), rankBufs(n, m)
	var tOp, tCopy time.Duration
	b.ResetTimer()
	for range b.N {
		t := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		tOp += time.Since(t)
		t = time.Now()
		memcpyRanks(dst, src, 1)
		tCopy += time.Since(t)
	}
	gbs := func(d time.Duration) float64 { return float64(bytes) * float64(b.N) / d.Seconds() / 1e9 }
	b.ReportMetric(gbs(tOp), "op-GB/s")
	b.ReportMetric(gbs(tCopy), "memcpy-GB/s")
	b.ReportMetric(100*gbs(tOp)/gbs(tCopy), "ratio-%")
}

// BenchmarkAllReduceVsMemcpy interleaves all-reduces of ResNet-18's size on
// n ranks with the memcpy yardstick (bytes as in BenchmarkAllReduce).
func BenchmarkAllReduceVsMemcpy(b *testing.B) {
	for _, n := range []int{2, 4} {
		m := resnet18Params
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			bufs := rankBufs(n, m)
			interleaved(b, n, m, int64(n*m*4), func() error {
				return Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
					return c.AllReduce(ctx, comm.Float32s(bufs[c.Rank()]))
				})
			})
		})
	}
}

// BenchmarkAllGatherVVsMemcpy interleaves all-gather-vs of ResNet-18's size
// on n ranks with the memcpy yardstick (bytes as in BenchmarkAllGatherV).
func BenchmarkAllGatherVVsMemcpy(b *testing.B) {
	for _, n := range []int{2, 4} {
		m := resnet18Params
		counts := make([]int, n)
		send := make([][]float32, n)
		for r := range counts {
			lo, hi := comm.ChunkBounds(m, n, r)
			counts[r] = hi - lo
			send[r] = make([]float32, counts[r])
		}
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			recv := rankBufs(n, m)
			interleaved(b, n, m, int64(n*m*4), func() error {
				return Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
					return c.AllGatherV(ctx, comm.Float32s(send[c.Rank()]), comm.Float32s(recv[c.Rank()]), counts)
				})
			})
		})
	}
}

// BenchmarkSendRecv exchanges messages between pairs of ranks (the pattern of
// SparDL's and gTop-k's rounds). Bytes counted: the bytes each rank sends.
func BenchmarkSendRecv(b *testing.B) {
	for _, size := range []int{16, 1 << 18} {
		b.Run(fmt.Sprintf("floats=%d", size), func(b *testing.B) {
			b.SetBytes(int64(size * 4))
			err := Run(context.Background(), 2, func(ctx context.Context, c comm.Communicator) error {
				send, recv := make(comm.Float32s, size), make(comm.Float32s, size)
				peer := 1 - c.Rank()
				for range b.N {
					if _, err := c.SendRecv(ctx, send, peer, recv, peer, 0); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
