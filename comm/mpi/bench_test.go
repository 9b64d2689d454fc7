//go:build unix

package mpi

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
)

// benchLen is the gradient size of the benchmarks: ResNet-18 (CIFAR), the
// size the papers' experiments exchange.
const benchLen = 11173962

var benchComm *Comm

func TestMain(m *testing.M) {
	code := m.Run()
	if benchComm != nil {
		if err := benchComm.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// mpiBench returns the process's communicator for benchmarks, which run only
// under mpirun (scripts/bench-mpi/run.sh) with a fixed iteration count, so
// that every rank makes the same calls.
func mpiBench(b *testing.B) *Comm {
	if _, ok := Detect(); !ok || os.Getenv(scenarioEnv) != "" {
		b.Skip("MPI benchmarks run under mpirun: see scripts/bench-mpi/run.sh")
	}
	if f := flag.Lookup("test.benchtime"); f == nil || !strings.HasSuffix(f.Value.String(), "x") {
		b.Fatal("under mpirun, run benchmarks with -test.benchtime=Nx so that every rank iterates the same number of times")
	}
	if benchComm == nil {
		// SPARSEGRAD_MPI_BENCH_SEGMENT and _WINDOW tune the ring, for
		// experiments.
		var cfg Config
		cfg.SegmentBytes, _ = strconv.Atoi(os.Getenv("SPARSEGRAD_MPI_BENCH_SEGMENT"))
		cfg.Window, _ = strconv.Atoi(os.Getenv("SPARSEGRAD_MPI_BENCH_WINDOW"))
		c, err := OpenConfig(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		benchComm = c
	}
	return benchComm
}

// rawAllReduce is the library's blocking MPI_Allreduce, for comparison (its
// sums are not in the canonical order). The engine goroutine makes the call.
func (c *Comm) rawAllReduce(ctx context.Context, buf comm.Float32s) error {
	bb := buf.Bytes()
	_, err := c.do(ctx, &reqOp{
		what: "raw MPI_Allreduce", nreq: 0, recvIdx: -1, keep: []any{bb},
		post: func(e *engine, reqs []uintptr) int32 {
			return call(e.l.allreduce, 1, bufPtr(bb), uintptr(len(buf)), e.l.tFloat, e.l.opSum, e.coll)
		},
	}, 0)
	return err
}

func BenchmarkAllReduce(b *testing.B) {
	c := mpiBench(b)
	ctx := context.Background()
	x := make(comm.Float32s, benchLen)
	for i := range x {
		x[i] = float32(i%97) * 1e-3
	}
	for _, impl := range []string{"ring", "mpi"} {
		b.Run(fmt.Sprintf("%s/np=%d", impl, c.Size()), func(b *testing.B) {
			b.SetBytes(4 * benchLen)
			if err := c.Barrier(ctx); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var err error
				if impl == "ring" {
					err = c.AllReduce(ctx, x)
				} else {
					err = c.rawAllReduce(ctx, x)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := c.Barrier(ctx); err != nil {
				b.Fatal(err)
			}
		})
	}
}

func BenchmarkAllGatherV(b *testing.B) {
	c := mpiBench(b)
	ctx := context.Background()
	n := c.Size()
	counts := make([]int, n)
	for r := range counts {
		lo, hi := comm.ChunkBounds(benchLen, n, r)
		counts[r] = hi - lo
	}
	send := make(comm.Float32s, counts[c.Rank()])
	recv := make(comm.Float32s, benchLen)
	b.Run(fmt.Sprintf("np=%d", n), func(b *testing.B) {
		b.SetBytes(4 * benchLen)
		if err := c.Barrier(ctx); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := c.AllGatherV(ctx, send, recv, counts); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkMemcpy is the yardstick: one copy of the all-reduce's bytes.
func BenchmarkMemcpy(b *testing.B) {
	src, dst := make(comm.Float32s, benchLen), make(comm.Float32s, benchLen)
	copy(dst, src) // fault the pages in
	b.SetBytes(4 * benchLen)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		copy(dst, src)
	}
}

// BenchmarkAddF32 is the ring's reduction kernel over the benchmark size.
func BenchmarkAddF32(b *testing.B) {
	x, y := make([]float32, benchLen), make([]float32, benchLen)
	addF32(y, x, y)
	b.SetBytes(4 * benchLen)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		addF32(y, x, y)
	}
}

// BenchmarkLatency measures small calls, which sparse reducers make often.
func BenchmarkLatency(b *testing.B) {
	c := mpiBench(b)
	ctx := context.Background()
	n, r := c.Size(), c.Rank()
	x := make(comm.Float32s, 1000)
	y := make(comm.Float32s, 1000)
	idx := make(comm.Int32s, 100)
	all := make(comm.Int32s, 100*n)
	cases := []struct {
		name string
		fn   func() error
	}{
		{"Barrier", func() error { return c.Barrier(ctx) }},
		{"AllReduce1000", func() error { return c.AllReduce(ctx, x) }},
		{"AllGather100", func() error { return c.AllGather(ctx, idx, all) }},
		{"SendRecv1000", func() error { _, err := c.SendRecv(ctx, x, (r+1)%n, y, (r-1+n)%n, 3); return err }},
	}
	for _, tc := range cases {
		b.Run(fmt.Sprintf("%s/np=%d", tc.name, n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if err := tc.fn(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
