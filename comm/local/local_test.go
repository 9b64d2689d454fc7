package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

var dtypes = []comm.DType{comm.Float32, comm.Int32, comm.Int64}

// randBuf returns a buffer of m random elements; float32 values span several
// magnitudes so that the summation order shows in the last bits.
func randBuf(dt comm.DType, m int, rng *rand.Rand) comm.Buffer {
	switch dt {
	case comm.Float32:
		b := make(comm.Float32s, m)
		for i := range b {
			b[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(7)-3)))
		}
		return b
	case comm.Int32:
		b := make(comm.Int32s, m)
		for i := range b {
			b[i] = rng.Int32N(2001) - 1000
		}
		return b
	default:
		b := make(comm.Int64s, m)
		for i := range b {
			b[i] = rng.Int64N(1<<40) - 1<<39
		}
		return b
	}
}

func newBuf(dt comm.DType, m int) comm.Buffer {
	switch dt {
	case comm.Float32:
		return make(comm.Float32s, m)
	case comm.Int32:
		return make(comm.Int32s, m)
	default:
		return make(comm.Int64s, m)
	}
}

func clone(b comm.Buffer) comm.Buffer {
	c := newBuf(b.DType(), b.Len())
	copy(c.Bytes(), b.Bytes())
	return c
}

// refSum is the obviously-correct canonical sum: element i of block j (chunk
// or counts block) is bufs[j+1][i] + bufs[j+2][i] + … + bufs[j][i], left to
// right, in the buffers' own element type.
func refSum(bufs []comm.Buffer, blockOf func(i int) int) comm.Buffer {
	switch bufs[0].(type) {
	case comm.Float32s:
		return comm.Float32s(refSumT[float32](bufs, blockOf))
	case comm.Int32s:
		return comm.Int32s(refSumT[int32](bufs, blockOf))
	default:
		return comm.Int64s(refSumT[int64](bufs, blockOf))
	}
}

func refSumT[E float32 | int32 | int64](bufs []comm.Buffer, blockOf func(i int) int) []E {
	n := len(bufs)
	xs := make([][]E, n)
	for r, b := range bufs {
		switch v := b.(type) {
		case comm.Float32s:
			xs[r] = any([]float32(v)).([]E)
		case comm.Int32s:
			xs[r] = any([]int32(v)).([]E)
		case comm.Int64s:
			xs[r] = any([]int64(v)).([]E)
		}
	}
	out := make([]E, len(xs[0]))
	for i := range out {
		j := blockOf(i)
		s := xs[(j+1)%n][i]
		for k := 2; k <= n; k++ {
			s += xs[(j+k)%n][i]
		}
		out[i] = s
	}
	return out
}

func chunkOf(length, n int) func(int) int {
	return func(i int) int {
		for c := range n {
			if lo, hi := comm.ChunkBounds(length, n, c); i >= lo && i < hi {
				return c
			}
		}
		panic("no chunk")
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func sizesFor(n int) []int {
	s := []int{0, 1, 2, n - 1, n, n + 1, 17, 1001}
	if !testing.Short() {
		s = append(s, 100_003)
	}
	return s
}

func equalBits(t *testing.T, what string, got, want comm.Buffer) {
	t.Helper()
	if got.DType() != want.DType() || got.Len() != want.Len() || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("%s: got %s[%d] differing from the reference %s[%d] (first values %v vs %v)", what, got.DType(), got.Len(), want.DType(), want.Len(), head(got), head(want))
	}
}

func head(b comm.Buffer) any {
	m := min(b.Len(), 6)
	return b.Slice(0, m)
}

func TestAllReduceCanonical(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 16} {
		for _, m := range sizesFor(n) {
			if m < 0 {
				continue
			}
			for _, dt := range dtypes {
				t.Run(fmt.Sprintf("n%d/m%d/%s", n, m, dt), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(n), uint64(m)))
					in := make([]comm.Buffer, n)
					for r := range in {
						in[r] = randBuf(dt, m, rng)
					}
					want := refSum(in, chunkOf(m, n))
					got := make([]comm.Buffer, n)
					for r := range got {
						got[r] = clone(in[r])
					}
					err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
						return c.AllReduce(ctx, got[c.Rank()])
					})
					if err != nil {
						t.Fatal(err)
					}
					for r := range got {
						equalBits(t, fmt.Sprintf("rank %d", r), got[r], want)
					}
				})
			}
		}
	}
}

// TestAllReduceViewCanonical: all-reducing the views of a random partition
// of a vector one after another (started together, waited in turn) gives
// the bits of the whole vector's canonical sum, whatever the views' cuts
// relative to the chunks.
func TestAllReduceViewCanonical(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 16} {
		for _, m := range sizesFor(n) {
			t.Run(fmt.Sprintf("n%d/m%d", n, m), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), uint64(m)+7))
				in := make([]comm.Buffer, n)
				for r := range in {
					in[r] = randBuf(comm.Float32, m, rng)
				}
				want := refSum(in, chunkOf(m, n))
				cuts := []int{0}
				for cuts[len(cuts)-1] < m {
					cuts = append(cuts, min(m, cuts[len(cuts)-1]+1+rng.IntN(max(1, m/3))))
				}
				got := make([]comm.Buffer, n)
				for r := range got {
					got[r] = clone(in[r])
				}
				err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
					var reqs []comm.Request
					for i := 1; i < len(cuts); i++ {
						r, err := c.IAllReduceView(ctx, got[c.Rank()].Slice(cuts[i-1], cuts[i]), cuts[i-1], m)
						if err != nil {
							return err
						}
						reqs = append(reqs, r)
					}
					for _, r := range reqs {
						if _, err := r.Wait(ctx); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				for r := range got {
					equalBits(t, fmt.Sprintf("rank %d, views cut at %v", r, cuts), got[r], want)
				}
			})
		}
	}
	// A view outside its vector is refused, naming the fix.
	err := Run(testCtx(t), 2, func(ctx context.Context, c comm.Communicator) error {
		_, err := c.IAllReduceView(ctx, comm.Float32s{1, 2}, 3, 4)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "does not lie in a vector of 4") {
		t.Fatalf("a view [3, 5) of 4 elements: %v, want a refusal", err)
	}
}

// TestCanonicalOrderMatters makes sure the bitwise test above can fail: for
// these inputs the canonical sum differs from the plain rank-order sum.
func TestCanonicalOrderMatters(t *testing.T) {
	in := []comm.Buffer{comm.Float32s{1e8, 1e8}, comm.Float32s{1, 1}, comm.Float32s{-1e8, -1e8}}
	got := []comm.Buffer{clone(in[0]), clone(in[1]), clone(in[2])}
	if err := Run(testCtx(t), 3, func(ctx context.Context, c comm.Communicator) error {
		return c.AllReduce(ctx, got[c.Rank()])
	}); err != nil {
		t.Fatal(err)
	}
	// chunk 0 (element 0): order 1, 2, 0: (1 + -1e8) + 1e8 = 0 in float32.
	// chunk 1 (element 1): order 2, 0, 1: (-1e8 + 1e8) + 1 = 1.
	want := comm.Float32s{0, 1}
	equalBits(t, "canonical sum", got[0], want)
	plain := float32(1e8) + 1 - 1e8 // rank order 0, 1, 2
	if plain == want[1] && plain == want[0] {
		t.Fatal("inputs do not distinguish summation orders")
	}
}

func TestAllGather(t *testing.T) {
	for n := 1; n <= 8; n++ {
		for _, m := range sizesFor(n) {
			for _, dt := range dtypes {
				t.Run(fmt.Sprintf("n%d/m%d/%s", n, m, dt), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(n), uint64(m)+7))
					in := make([]comm.Buffer, n)
					want := newBuf(dt, 0).Bytes()
					for r := range in {
						in[r] = randBuf(dt, m, rng)
						want = append(want, in[r].Bytes()...)
					}
					out := make([]comm.Buffer, n)
					for r := range out {
						out[r] = newBuf(dt, n*m)
					}
					err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
						return c.AllGather(ctx, in[c.Rank()], out[c.Rank()])
					})
					if err != nil {
						t.Fatal(err)
					}
					for r := range out {
						if !bytes.Equal(out[r].Bytes(), want) {
							t.Fatalf("rank %d: gathered data differ from the concatenation of the inputs", r)
						}
					}
				})
			}
		}
	}
}

func randCounts(n, maxc int, rng *rand.Rand) []int {
	counts := make([]int, n)
	for r := range counts {
		switch rng.IntN(4) {
		case 0:
			counts[r] = 0
		case 1:
			counts[r] = 1
		default:
			counts[r] = rng.IntN(maxc + 1)
		}
	}
	return counts
}

func TestAllGatherV(t *testing.T) {
	for n := 1; n <= 8; n++ {
		for _, maxc := range []int{0, 1, 5, 300, 20_000} {
			for _, dt := range dtypes {
				t.Run(fmt.Sprintf("n%d/max%d/%s", n, maxc, dt), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(n), uint64(maxc)+11))
					counts := randCounts(n, maxc, rng)
					total := 0
					var want []byte
					in := make([]comm.Buffer, n)
					for r := range in {
						in[r] = randBuf(dt, counts[r], rng)
						want = append(want, in[r].Bytes()...)
						total += counts[r]
					}
					out := make([]comm.Buffer, n)
					for r := range out {
						out[r] = newBuf(dt, total)
					}
					err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
						return c.AllGatherV(ctx, in[c.Rank()], out[c.Rank()], append([]int(nil), counts...))
					})
					if err != nil {
						t.Fatal(err)
					}
					for r := range out {
						if !bytes.Equal(out[r].Bytes(), want) {
							t.Fatalf("rank %d: counts %v: gathered data differ from the concatenation", r, counts)
						}
					}
				})
			}
		}
	}
}

func TestBroadcast(t *testing.T) {
	for n := 1; n <= 8; n++ {
		for _, m := range []int{0, 1, 13, 4099} {
			for _, dt := range dtypes {
				for root := range n {
					t.Run(fmt.Sprintf("n%d/m%d/%s/root%d", n, m, dt, root), func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(n), uint64(m)+uint64(root)))
						bufs := make([]comm.Buffer, n)
						for r := range bufs {
							bufs[r] = randBuf(dt, m, rng)
						}
						want := clone(bufs[root])
						err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
							return c.Broadcast(ctx, bufs[c.Rank()], root)
						})
						if err != nil {
							t.Fatal(err)
						}
						for r := range bufs {
							equalBits(t, fmt.Sprintf("rank %d", r), bufs[r], want)
						}
					})
				}
			}
		}
	}
}

// TestBarrier checks that no rank leaves a barrier before every rank entered it.
func TestBarrier(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 16} {
		var mu sync.Mutex
		entered := 0
		err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
			for round := 1; round <= 20; round++ {
				mu.Lock()
				entered++
				mu.Unlock()
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				mu.Lock()
				e := entered
				mu.Unlock()
				if e < round*n {
					return fmt.Errorf("round %d: left the barrier after only %d of %d entries", round, e, round*n)
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
	}
}

// TestNonBlockingOrder starts three collectives in the same order on every
// rank and waits for them in a rank-dependent order.
func TestNonBlockingOrder(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 16} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 99))
			const m = 1003
			a := make([]comm.Buffer, n)
			b := make([]comm.Buffer, n)
			const k = 7
			total := k * n
			v := make([]comm.Buffer, n)
			var wantG, wantV []byte
			for r := range n {
				a[r] = randBuf(comm.Float32, m, rng)
				b[r] = randBuf(comm.Int64, 3, rng)
				v[r] = randBuf(comm.Int32, k, rng)
				wantG = append(wantG, b[r].Bytes()...)
				wantV = append(wantV, v[r].Bytes()...)
			}
			wantA := refSum(a, chunkOf(m, n))
			outG := make([]comm.Buffer, n)
			outV := make([]comm.Buffer, n)
			err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
				r := c.Rank()
				outG[r] = newBuf(comm.Int64, 3*n)
				outV[r] = newBuf(comm.Int32, total)
				q1, err := comm.IAllReduce(ctx, c, a[r])
				if err != nil {
					return err
				}
				q2, err := c.IAllGather(ctx, b[r], outG[r])
				if err != nil {
					return err
				}
				q3, err := c.IAllGather(ctx, v[r], outV[r])
				if err != nil {
					return err
				}
				qs := []comm.Request{q1, q2, q3}
				wantN := []int{m, 3 * n, total}
				order := []int{2, 0, 1}
				if r%2 == 1 {
					order = []int{1, 2, 0}
				}
				for _, i := range order {
					got, err := qs[i].Wait(ctx)
					if err != nil {
						return err
					}
					if got != wantN[i] {
						return fmt.Errorf("request %d: Wait returned %d elements, want %d", i, got, wantN[i])
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for r := range n {
				equalBits(t, "IAllReduce", a[r], wantA)
				if !bytes.Equal(outG[r].Bytes(), wantG) || !bytes.Equal(outV[r].Bytes(), wantV) {
					t.Fatalf("rank %d: non-blocking gathers differ from the reference", r)
				}
			}
		})
	}
}

func TestSendRecvRing(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 16} {
		for _, m := range []int{0, 1, 1000} {
			err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
				r := c.Rank()
				send := make(comm.Int64s, m)
				for i := range send {
					send[i] = int64(r*1_000_000 + i)
				}
				recv := make(comm.Int64s, m+5)
				got, err := c.SendRecv(ctx, send, (r+1)%n, recv, (r-1+n)%n, 7)
				if err != nil {
					return err
				}
				if got != m {
					return fmt.Errorf("received %d elements, want %d", got, m)
				}
				from := (r - 1 + n) % n
				for i := range m {
					if recv[i] != int64(from*1_000_000+i) {
						return fmt.Errorf("element %d = %d, want %d", i, recv[i], from*1_000_000+i)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatalf("n=%d m=%d: %v", n, m, err)
			}
		}
	}
}

// TestPointToPointOrder checks matching by (src, dst, tag) in issue order,
// with receives posted before and after the sends.
func TestPointToPointOrder(t *testing.T) {
	err := Run(testCtx(t), 3, func(ctx context.Context, c comm.Communicator) error {
		switch c.Rank() {
		case 0:
			for i := range 5 {
				if err := c.Send(ctx, comm.Float32s{float32(i), float32(i)}, 2, 1); err != nil {
					return err
				}
				if err := c.Send(ctx, comm.Float32s{float32(100 + i)}, 2, 2); err != nil {
					return err
				}
			}
		case 1:
			q, err := c.ISend(ctx, comm.Int32s{42, 43, 44}, 2, 1)
			if err != nil {
				return err
			}
			if _, err := q.Wait(ctx); err != nil {
				return err
			}
		case 2:
			// IRecv posted early, from rank 1.
			buf1 := make(comm.Int32s, 10)
			q, err := c.IRecv(ctx, buf1, 1, 1)
			if err != nil {
				return err
			}
			for i := range 5 {
				b := make(comm.Float32s, 1)
				if n, err := c.Recv(ctx, b, 0, 2); err != nil || n != 1 || b[0] != float32(100+i) {
					return fmt.Errorf("tag 2 message %d: got %v (n=%d, err=%v)", i, b, n, err)
				}
			}
			for i := range 5 {
				b := make(comm.Float32s, 4)
				if n, err := c.Recv(ctx, b, 0, 1); err != nil || n != 2 || b[0] != float32(i) {
					return fmt.Errorf("tag 1 message %d: got %v (n=%d, err=%v)", i, b, n, err)
				}
			}
			n, err := q.Wait(ctx)
			if err != nil || n != 3 || buf1[0] != 42 || buf1[2] != 44 {
				return fmt.Errorf("IRecv: got %v (n=%d, err=%v)", buf1, n, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestRecvErrors(t *testing.T) {
	err := Run(testCtx(t), 2, func(ctx context.Context, c comm.Communicator) error {
		if c.Rank() == 0 {
			if err := c.Send(ctx, comm.Float32s{1, 2, 3}, 1, 0); err != nil {
				return err
			}
			return c.Send(ctx, comm.Int32s{1}, 1, 0)
		}
		_, err := c.Recv(ctx, make(comm.Float32s, 2), 0, 0)
		if err == nil || !strings.Contains(err.Error(), "has 3 elements but the receive buffer only 2") {
			return fmt.Errorf("too-long message: got error %v", err)
		}
		_, err = c.Recv(ctx, make(comm.Float32s, 2), 0, 0)
		if err == nil || !strings.Contains(err.Error(), "same element type") {
			return fmt.Errorf("dtype mismatch: got error %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestArgumentErrors checks that bad arguments give a clear error at once.
func TestArgumentErrors(t *testing.T) {
	w := New(3)
	c := w.Comm(1)
	ctx := testCtx(t)
	f := func(m int) comm.Float32s { return make(comm.Float32s, m) }
	cases := []struct {
		name string
		call func() error
		want string
	}{
		{"allreduce nil", func() error { return c.AllReduce(ctx, nil) }, "nil"},
		{"allgather recv length", func() error { return c.AllGather(ctx, f(2), f(5)) }, "must have Size()*send.Len()"},
		{"allgather dtype", func() error { return c.AllGather(ctx, f(2), make(comm.Int32s, 6)) }, "same element type"},
		{"allgatherv counts length", func() error { return c.AllGatherV(ctx, f(1), f(2), []int{1, 1}) }, "one count per rank"},
		{"allgatherv negative", func() error { return c.AllGatherV(ctx, f(1), f(1), []int{1, 1, -1}) }, "negative"},
		{"allgatherv send length", func() error { return c.AllGatherV(ctx, f(2), f(3), []int{1, 1, 1}) }, "counts[1] = 1"},
		{"allgatherv recv length", func() error { return c.AllGatherV(ctx, f(1), f(4), []int{1, 1, 1}) }, "sum(counts) = 3"},
		{"broadcast root", func() error { return c.Broadcast(ctx, f(1), 3) }, "root 3 out of range"},
		{"broadcast negative root", func() error { return c.Broadcast(ctx, f(1), -1) }, "root -1 out of range"},
		{"send dst", func() error { return c.Send(ctx, f(1), 3, 0) }, "destination rank 3 out of range"},
		{"recv src", func() error { _, err := c.Recv(ctx, f(1), -1, 0); return err }, "source rank -1 out of range"},
		{"sendrecv src", func() error { _, err := c.SendRecv(ctx, f(1), 0, f(1), 9, 0); return err }, "source rank 9 out of range"},
		{"isend dst", func() error { _, err := c.ISend(ctx, f(1), 5, 0); return err }, "out of range"},
		{"irecv src", func() error { _, err := c.IRecv(ctx, f(1), 5, 0); return err }, "out of range"},
		{"iallreduce nil", func() error { _, err := comm.IAllReduce(ctx, c, nil); return err }, "nil"},
		{"iallgather length", func() error { _, err := c.IAllGather(ctx, f(1), f(1)); return err }, "Size()*send.Len()"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got error %v, want one containing %q", err, tc.want)
			}
		})
	}
	if err := w.Err(); err != nil {
		t.Fatalf("argument errors must not abort the world: %v", err)
	}
}

func TestMismatchedCollectives(t *testing.T) {
	cases := []struct {
		name string
		call func(ctx context.Context, c comm.Communicator) error
	}{
		{"sizes", func(ctx context.Context, c comm.Communicator) error {
			return c.AllReduce(ctx, make(comm.Float32s, 5+c.Rank()))
		}},
		{"dtypes", func(ctx context.Context, c comm.Communicator) error {
			if c.Rank() == 1 {
				return c.AllReduce(ctx, make(comm.Int32s, 5))
			}
			return c.AllReduce(ctx, make(comm.Float32s, 5))
		}},
		{"ops", func(ctx context.Context, c comm.Communicator) error {
			if c.Rank() == 2 {
				return c.Broadcast(ctx, make(comm.Float32s, 5), 0)
			}
			return c.AllReduce(ctx, make(comm.Float32s, 5))
		}},
		{"roots", func(ctx context.Context, c comm.Communicator) error {
			return c.Broadcast(ctx, make(comm.Float32s, 5), c.Rank()%2)
		}},
		{"counts", func(ctx context.Context, c comm.Communicator) error {
			counts := []int{1, 1, 1}
			counts[0] += c.Rank()
			return c.AllGatherV(ctx, make(comm.Float32s, counts[c.Rank()]), make(comm.Float32s, 3+c.Rank()), counts)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := make([]error, 3)
			err := Run(testCtx(t), 3, func(ctx context.Context, c comm.Communicator) error {
				errs[c.Rank()] = tc.call(ctx, c)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), "does not match across ranks") {
					t.Fatalf("rank %d: got %v, want a mismatch error", r, err)
				}
			}
		})
	}
}

// TestFailurePropagation checks that one failing rank releases every other
// rank, blocked in a collective, a receive or a non-blocking wait, with an
// error wrapping comm.ErrAborted that names the failing rank.
func TestFailurePropagation(t *testing.T) {
	boom := errors.New("boom")
	cases := []struct {
		name  string
		fail  func(ctx context.Context, c comm.Communicator, cancel context.CancelFunc) error
		cause string
	}{
		{"error", func(context.Context, comm.Communicator, context.CancelFunc) error { return boom }, "boom"},
		{"panic", func(context.Context, comm.Communicator, context.CancelFunc) error { panic("kaputt") }, "kaputt"},
		{"abort", func(ctx context.Context, c comm.Communicator, _ context.CancelFunc) error {
			c.(interface{ Abort(error) }).Abort(boom)
			time.Sleep(10 * time.Millisecond)
			return nil
		}, "boom"},
		{"cancel", func(ctx context.Context, c comm.Communicator, cancel context.CancelFunc) error {
			cancel()
			return c.Barrier(ctx)
		}, "context canceled"},
	}
	for _, tc := range cases {
		for _, n := range []int{2, 3, 5, 16} {
			t.Run(fmt.Sprintf("%s/n%d", tc.name, n), func(t *testing.T) {
				const bad = 1
				start := time.Now()
				errs := make([]error, n)
				ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
				defer stop()
				err := Run(ctx, n, func(ctx context.Context, c comm.Communicator) error {
					r := c.Rank()
					if r == bad {
						rctx, cancel := context.WithCancel(ctx)
						defer cancel()
						time.Sleep(20 * time.Millisecond) // let the others block
						return tc.fail(rctx, c, cancel)
					}
					switch r % 3 {
					case 0:
						errs[r] = c.AllReduce(ctx, make(comm.Float32s, 100))
					case 1:
						_, errs[r] = c.Recv(ctx, make(comm.Float32s, 1), bad, 0)
					case 2:
						q, err := c.IAllGather(ctx, comm.Int32s{1}, make(comm.Int32s, n))
						if err == nil {
							_, err = q.Wait(ctx)
						}
						errs[r] = err
					}
					// Later calls fail too.
					if err := c.Barrier(ctx); !errors.Is(err, comm.ErrAborted) {
						return fmt.Errorf("later call: got %v, want ErrAborted", err)
					}
					return errs[r]
				})
				if d := time.Since(start); d > 5*time.Second {
					t.Fatalf("failure took %v to propagate", d)
				}
				if err == nil || !strings.Contains(err.Error(), tc.cause) || !strings.Contains(err.Error(), fmt.Sprintf("rank %d", bad)) {
					t.Fatalf("Run returned %v, want the failing rank %d's error %q", err, bad, tc.cause)
				}
				if errors.Is(err, comm.ErrAborted) && tc.name != "abort" {
					t.Fatalf("Run returned a consequence instead of the cause: %v", err)
				}
				for r, e := range errs {
					if r == bad {
						continue
					}
					if !errors.Is(e, comm.ErrAborted) || !strings.Contains(e.Error(), fmt.Sprintf("rank %d failed", bad)) || !strings.Contains(e.Error(), tc.cause) {
						t.Fatalf("rank %d: got %v, want ErrAborted naming rank %d and %q", r, e, bad, tc.cause)
					}
				}
			})
		}
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	for range 5 {
		_ = Run(testCtx(t), 4, func(ctx context.Context, c comm.Communicator) error {
			// A request never waited for and a receive never matched.
			if _, err := comm.IAllReduce(ctx, c, make(comm.Float32s, 10)); err != nil {
				return err
			}
			if c.Rank() == 0 {
				if _, err := c.IRecv(ctx, make(comm.Float32s, 1), 1, 0); err != nil {
					return err
				}
				return errors.New("leaving early")
			}
			return nil
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > before {
		t.Fatalf("%d goroutines before, %d after Run", before, g)
	}
}

func TestRunArguments(t *testing.T) {
	if err := Run(context.Background(), 0, func(context.Context, comm.Communicator) error { return nil }); err == nil || !strings.Contains(err.Error(), "at least 1") {
		t.Fatalf("n=0: got %v", err)
	}
	if err := Run(context.Background(), 2, nil); err == nil {
		t.Fatal("nil fn accepted")
	}
}

// TestManyCollectives stresses slot reuse: many small calls back to back.
func TestManyCollectives(t *testing.T) {
	const n, rounds = 5, 2000
	err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
		for i := range rounds {
			b := comm.Int64s{int64(c.Rank() + i)}
			if err := c.AllReduce(ctx, b); err != nil {
				return err
			}
			if want := int64(n*i + n*(n-1)/2); b[0] != want {
				return fmt.Errorf("round %d: sum %d, want %d", i, b[0], want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEarlyReturn checks that a rank whose worker returns without making a
// call its peers wait for makes them fail instead of hang, while messages it
// sent before returning are still delivered.
func TestEarlyReturn(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		errs := make([]error, n)
		err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
			r := c.Rank()
			if r == 1 {
				if err := c.Send(ctx, comm.Int32s{7}, 0, 3); err != nil {
					return err
				}
				q, err := comm.IAllReduce(ctx, c, make(comm.Int32s, 4)) // joined, never waited
				if err != nil {
					return err
				}
				_ = q
				return nil
			}
			if err := c.AllReduce(ctx, make(comm.Int32s, 4)); err != nil {
				return fmt.Errorf("first all-reduce: %w", err)
			}
			if r == 0 {
				time.Sleep(10 * time.Millisecond)
				b := make(comm.Int32s, 1)
				if _, err := c.Recv(ctx, b, 1, 3); err != nil || b[0] != 7 {
					return fmt.Errorf("message sent before the return: %v %v", b, err)
				}
				_, errs[r] = c.Recv(ctx, b, 1, 3)
				return nil
			}
			errs[r] = c.Barrier(ctx)
			return nil
		})
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		for r, e := range errs {
			if r != 1 && (e == nil || !strings.Contains(e.Error(), "rank 1 has returned")) {
				t.Fatalf("n=%d rank %d: got %v, want an error saying rank 1 returned", n, r, e)
			}
		}
	}
}

func TestTimeout(t *testing.T) {
	start := time.Now()
	err := Run(testCtx(t), 3, func(ctx context.Context, c comm.Communicator) error {
		if c.Rank() == 2 {
			time.Sleep(300 * time.Millisecond) // stuck, but not returned
			return c.Barrier(ctx)
		}
		return c.Barrier(ctx)
	}, WithTimeout(50*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "no progress for 50ms") {
		t.Fatalf("got %v, want a timeout error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
	if err := Run(context.Background(), 2, func(context.Context, comm.Communicator) error { return nil }, WithTimeout(-1)); err == nil {
		t.Fatal("negative timeout accepted")
	}
}

// TestSendRecvUnreceived checks that SendRecv, like Send, does not wait for
// its message to be received, and that the message it leaves behind is a
// copy: the sender may overwrite its buffer at once.
func TestSendRecvUnreceived(t *testing.T) {
	err := Run(testCtx(t), 2, func(ctx context.Context, c comm.Communicator) error {
		if c.Rank() == 1 {
			if err := c.Send(ctx, comm.Float32s{1}, 0, 0); err != nil {
				return err
			}
			time.Sleep(20 * time.Millisecond) // rank 0's SendRecv returns meanwhile
			b := make(comm.Float32s, 2)
			if _, err := c.Recv(ctx, b, 0, 0); err != nil || b[0] != 2 || b[1] != 3 {
				return fmt.Errorf("got %v (%v), want the values before they were overwritten", b, err)
			}
			return nil
		}
		send := comm.Float32s{2, 3}
		if _, err := c.SendRecv(ctx, send, 1, make(comm.Float32s, 1), 1, 0); err != nil {
			return err
		}
		send[0], send[1] = -1, -1
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMailboxesForgotten checks that channels with ever new tags do not
// accumulate mailboxes once their messages are received.
func TestMailboxesForgotten(t *testing.T) {
	w := New(2)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := w.Comm(r)
			for tag := range 1000 {
				if r == 0 {
					if err := c.Send(ctx, comm.Int32s{int32(tag)}, 1, tag); err != nil {
						errs[r] = err
						return
					}
					continue
				}
				b := make(comm.Int32s, 1)
				if _, err := c.Recv(ctx, b, 0, tag); err != nil || b[0] != int32(tag) {
					errs[r] = fmt.Errorf("tag %d: %v %v", tag, b, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	left := len(w.boxes)
	w.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d mailboxes left after all messages were received", left)
	}
}

// TestManyRanks runs 64 ranks through an all-reduce and an all-gather-v
// (more ranks than elements, so most chunks are empty).
func TestManyRanks(t *testing.T) {
	const n, m = 64, 37
	rng := rand.New(rand.NewPCG(64, 37))
	in := make([]comm.Buffer, n)
	got := make([]comm.Buffer, n)
	for r := range in {
		in[r] = randBuf(comm.Float32, m, rng)
		got[r] = clone(in[r])
	}
	want := refSum(in, chunkOf(m, n))
	counts := randCounts(n, 3, rng)
	total := 0
	var wantV []byte
	for r, c := range counts {
		total += c
		wantV = append(wantV, in[r].Slice(0, c).Bytes()...)
	}
	outV := make([]comm.Buffer, n)
	err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
		r := c.Rank()
		outV[r] = newBuf(comm.Float32, total)
		if err := c.AllGatherV(ctx, in[r].Slice(0, counts[r]), outV[r], counts); err != nil {
			return err
		}
		return c.AllReduce(ctx, got[r])
	})
	if err != nil {
		t.Fatal(err)
	}
	for r := range n {
		equalBits(t, fmt.Sprintf("rank %d", r), got[r], want)
		if !bytes.Equal(outV[r].Bytes(), wantV) {
			t.Fatalf("rank %d: all-gather-v differs", r)
		}
	}
}
