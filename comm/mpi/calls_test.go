//go:build unix

package mpi

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
)

// check is one call (or group of calls) of the conformance sequence: run makes
// the calls on c, verifies the results against a reference computed here from
// every rank's inputs, and returns this rank's outputs so that the MPI and
// in-process backends can be compared byte for byte.
type check struct {
	name string
	run  func(ctx context.Context, c comm.Communicator) ([]byte, error)
}

var pow10 = []float64{1e-3, 1e-2, 1e-1, 1, 1e1, 1e2, 1e3}

// gen builds rank q's input for a check: every rank can build every rank's.
func genF32(seed uint64, q, n int) comm.Float32s {
	rng := rand.New(rand.NewPCG(seed, uint64(q)))
	x := make(comm.Float32s, n)
	for i := range x {
		// Mixed magnitudes, so that the order of the additions shows in
		// the last bits.
		x[i] = float32(rng.NormFloat64() * pow10[rng.IntN(len(pow10))])
	}
	return x
}

func genI32(seed uint64, q, n int) comm.Int32s {
	rng := rand.New(rand.NewPCG(seed, uint64(q)+1000))
	x := make(comm.Int32s, n)
	for i := range x {
		x[i] = int32(rng.Uint32())
	}
	return x
}

func genI64(seed uint64, q, n int) comm.Int64s {
	rng := rand.New(rand.NewPCG(seed, uint64(q)+2000))
	x := make(comm.Int64s, n)
	for i := range x {
		x[i] = int64(rng.Uint64())
	}
	return x
}

var genCache sync.Map // genKey -> comm.Buffer, read only

type genKey struct {
	dt      comm.DType
	seed    uint64
	q, n    int
	refCase string
}

// gen returns rank q's input; callers must not modify it (clone it).
func gen(dt comm.DType, seed uint64, q, n int) comm.Buffer {
	k := genKey{dt: dt, seed: seed, q: q, n: n}
	if b, ok := genCache.Load(k); ok {
		return b.(comm.Buffer)
	}
	b, _ := genCache.LoadOrStore(k, genNew(dt, seed, q, n))
	return b.(comm.Buffer)
}

func genNew(dt comm.DType, seed uint64, q, n int) comm.Buffer {
	switch dt {
	case comm.Float32:
		return genF32(seed, q, n)
	case comm.Int32:
		return genI32(seed, q, n)
	}
	return genI64(seed, q, n)
}

// reference is the canonical sum over ranks of inputs, block j of the result
// being [bounds[j], bounds[j+1]); it is memoized by key.
func reference(key genKey, in []comm.Buffer, bounds []int) comm.Buffer {
	if b, ok := genCache.Load(key); ok {
		return b.(comm.Buffer)
	}
	n, L := len(in), in[0].Len()
	var out comm.Buffer
	switch in[0].DType() {
	case comm.Float32:
		o := make(comm.Float32s, L)
		for j := 0; j < n; j++ {
			for i := bounds[j]; i < bounds[j+1]; i++ {
				s := in[(j+1)%n].(comm.Float32s)[i]
				for k := 2; k <= n; k++ {
					s += in[(j+k)%n].(comm.Float32s)[i]
				}
				o[i] = s
			}
		}
		out = o
	case comm.Int32:
		o := make(comm.Int32s, L)
		for _, x := range in {
			for i, v := range x.(comm.Int32s) {
				o[i] += v
			}
		}
		out = o
	default:
		o := make(comm.Int64s, L)
		for _, x := range in {
			for i, v := range x.(comm.Int64s) {
				o[i] += v
			}
		}
		out = o
	}
	b, _ := genCache.LoadOrStore(key, out)
	return b.(comm.Buffer)
}

// firstDiff describes the first element where got and want differ, or "".
func firstDiff(got, want comm.Buffer) string {
	if got.Len() != want.Len() {
		return fmt.Sprintf("length %d, want %d", got.Len(), want.Len())
	}
	if bytes.Equal(got.Bytes(), want.Bytes()) {
		return ""
	}
	for i := 0; i < got.Len(); i++ {
		if g, w := elemBits(got, i), elemBits(want, i); g != w {
			return fmt.Sprintf("element %d: got bits %v, want %v", i, g, w)
		}
	}
	return "bytes differ"
}

func chunkBounds(L, n int) []int {
	b := make([]int, n+1)
	for j := 0; j < n; j++ {
		_, b[j+1] = comm.ChunkBounds(L, n, j)
	}
	return b
}

// equalBits compares element i of got with want bit for bit.
func elemBits(b comm.Buffer, i int) any {
	switch x := b.(type) {
	case comm.Float32s:
		return math.Float32bits(x[i])
	case comm.Int32s:
		return x[i]
	default:
		return b.(comm.Int64s)[i]
	}
}

var dtypes = []comm.DType{comm.Float32, comm.Int32, comm.Int64}

func sizes(dt comm.DType, n int) []int {
	if dt == comm.Float32 {
		return []int{0, 1, 2, n - 1, n, n + 1, 7, 1001, 65537, 1<<20 + 3}
	}
	return []int{0, 1, n + 1, 1001, 65537}
}

func inputs(dt comm.DType, seed uint64, n, L int) []comm.Buffer {
	in := make([]comm.Buffer, n)
	for q := range in {
		in[q] = gen(dt, seed, q, L)
	}
	return in
}

func clone(b comm.Buffer) comm.Buffer {
	switch x := b.(type) {
	case comm.Float32s:
		return slices.Clone(x)
	case comm.Int32s:
		return slices.Clone(x)
	}
	return slices.Clone(b.(comm.Int64s))
}

func newBuf(dt comm.DType, n int) comm.Buffer {
	switch dt {
	case comm.Float32:
		return make(comm.Float32s, n)
	case comm.Int32:
		return make(comm.Int32s, n)
	}
	return make(comm.Int64s, n)
}

func checksFor(n int) []check {
	var cs []check
	seed := uint64(100)
	for _, dt := range dtypes {
		for _, L := range sizes(dt, n) {
			if L < 0 {
				continue
			}
			seed++
			s := seed
			for _, nonBlocking := range []bool{false, true} {
				if nonBlocking && dt != comm.Float32 && L != 1001 {
					continue
				}
				cs = append(cs, check{fmt.Sprintf("AllReduce/%v/%d/nb=%v", dt, L, nonBlocking), func(ctx context.Context, c comm.Communicator) ([]byte, error) {
					in := inputs(dt, s, n, L)
					buf := clone(in[c.Rank()])
					if nonBlocking {
						r, err := comm.IAllReduce(ctx, c, buf)
						if err != nil {
							return nil, err
						}
						if got, err := r.Wait(ctx); err != nil || got != L {
							return nil, fmt.Errorf("Wait = %d, %v; want %d", got, err, L)
						}
					} else if err := c.AllReduce(ctx, buf); err != nil {
						return nil, err
					}
					want := reference(genKey{dt: dt, seed: s, n: L, refCase: "allreduce"}, in, chunkBounds(L, n))
					if d := firstDiff(buf, want); d != "" {
						return nil, fmt.Errorf("%s", d)
					}
					if dt == comm.Float32 && n >= 3 && L > 1000 {
						// The check is sensitive to the order: summing in
						// plain rank order gives different bits.
						plain := make(comm.Float32s, L)
						for _, x := range in {
							for i, v := range x.(comm.Float32s) {
								plain[i] += v
							}
						}
						if firstDiff(plain, want) == "" {
							return nil, fmt.Errorf("inputs too tame: rank-order and canonical sums agree")
						}
					}
					return slices.Clone(buf.Bytes()), nil
				}})
			}
		}
		// Per-rank counts with zeros and odd sizes.
		for v, pat := range [][]int{{0}, {1}, {0, 3}, {5, 0, 7}, {1000, 1, 0, 33}, {70001, 3}} {
			seed++
			s := seed
			counts := make([]int, n)
			for r := range counts {
				counts[r] = pat[r%len(pat)]
			}
			cs = append(cs, check{fmt.Sprintf("AllGatherV/%v/v%d", dt, v), func(ctx context.Context, c comm.Communicator) ([]byte, error) {
				total := 0
				for _, k := range counts {
					total += k
				}
				want := newBuf(dt, 0).Bytes()
				for q := 0; q < n; q++ {
					want = append(want, gen(dt, s, q, counts[q]).Bytes()...)
				}
				recv := newBuf(dt, total)
				send := gen(dt, s, c.Rank(), counts[c.Rank()])
				if err := c.AllGatherV(ctx, send, recv, counts); err != nil {
					return nil, err
				}
				if !bytes.Equal(recv.Bytes(), want) {
					return nil, fmt.Errorf("gathered data differs from the concatenation of the inputs")
				}
				return slices.Clone(recv.Bytes()), nil
			}})
		}
		for _, L := range []int{0, 1, 5, 10007} {
			seed++
			s := seed
			for _, nb := range []bool{false, true} {
				cs = append(cs, check{fmt.Sprintf("AllGather/%v/%d/nb=%v", dt, L, nb), func(ctx context.Context, c comm.Communicator) ([]byte, error) {
					var want []byte
					for q := 0; q < n; q++ {
						want = append(want, gen(dt, s, q, L).Bytes()...)
					}
					recv := newBuf(dt, n*L)
					send := gen(dt, s, c.Rank(), L)
					if nb {
						r, err := c.IAllGather(ctx, send, recv)
						if err != nil {
							return nil, err
						}
						if _, err := r.Wait(ctx); err != nil {
							return nil, err
						}
					} else if err := c.AllGather(ctx, send, recv); err != nil {
						return nil, err
					}
					if !bytes.Equal(recv.Bytes(), want) {
						return nil, fmt.Errorf("gathered data differs")
					}
					return slices.Clone(recv.Bytes()), nil
				}})
			}
			for root := 0; root < n; root += max(1, n-1) {
				cs = append(cs, check{fmt.Sprintf("Broadcast/%v/%d/root=%d", dt, L, root), func(ctx context.Context, c comm.Communicator) ([]byte, error) {
					buf := clone(gen(dt, s+uint64(c.Rank()), c.Rank(), L)) // differs per rank
					if err := c.Broadcast(ctx, buf, root); err != nil {
						return nil, err
					}
					if !bytes.Equal(buf.Bytes(), gen(dt, s+uint64(root), root, L).Bytes()) {
						return nil, fmt.Errorf("buffer differs from root's")
					}
					return slices.Clone(buf.Bytes()), nil
				}})
			}
		}
	}
	cs = append(cs, check{"Barrier", func(ctx context.Context, c comm.Communicator) ([]byte, error) {
		return nil, c.Barrier(ctx)
	}})
	// Point-to-point: a shifted ring of messages of several lengths.
	for _, L := range []int{0, 1, 1001, 1<<19 + 1} {
		for _, shift := range []int{1, n - 1} {
			seed++
			s := seed
			cs = append(cs, check{fmt.Sprintf("SendRecv/%d/shift=%d", L, shift), func(ctx context.Context, c comm.Communicator) ([]byte, error) {
				r := c.Rank()
				dst, src := (r+shift)%n, (r-shift%n+n)%n
				recv := make(comm.Float32s, L+3) // longer than the message
				got, err := c.SendRecv(ctx, genF32(s, r, L), dst, recv, src, 5)
				if err != nil {
					return nil, err
				}
				if got != L || !slices.Equal(recv[:L], genF32(s, src, L)) {
					return nil, fmt.Errorf("received %d elements from %d, want its %d", got, src, L)
				}
				return slices.Clone(recv.Bytes()), nil
			}})
			cs = append(cs, check{fmt.Sprintf("SendThenRecv/%d/shift=%d", L, shift), func(ctx context.Context, c comm.Communicator) ([]byte, error) {
				// Every rank sends before it receives: Send must not wait
				// for the receiver.
				r := c.Rank()
				dst, src := (r+shift)%n, (r-shift%n+n)%n
				if err := c.Send(ctx, genI64(s, r, L), dst, 9); err != nil {
					return nil, err
				}
				recv := make(comm.Int64s, L)
				got, err := c.Recv(ctx, recv, src, 9)
				if err != nil {
					return nil, err
				}
				if got != L || !slices.Equal(recv, genI64(s, src, L)) {
					return nil, fmt.Errorf("received %d elements from %d, want its %d", got, src, L)
				}
				return slices.Clone(recv.Bytes()), nil
			}})
		}
	}
	cs = append(cs, check{"ISendIRecv/tags", func(ctx context.Context, c comm.Communicator) ([]byte, error) {
		// Post receives of three tags from every rank, send in the
		// opposite tag order, wait in yet another order.
		r := c.Rank()
		var reqs []comm.Request
		var bufs []comm.Int32s
		for q := 0; q < n; q++ {
			for tag := 0; tag < 3; tag++ {
				b := make(comm.Int32s, 20)
				req, err := c.IRecv(ctx, b, q, tag)
				if err != nil {
					return nil, err
				}
				reqs, bufs = append(reqs, req), append(bufs, b)
			}
		}
		var sends []comm.Request
		for q := 0; q < n; q++ {
			for tag := 2; tag >= 0; tag-- {
				msg := comm.Int32s{int32(r), int32(q), int32(tag)}[:1+tag]
				req, err := c.ISend(ctx, msg, q, tag)
				if err != nil {
					return nil, err
				}
				sends = append(sends, req)
			}
		}
		var out []byte
		for i := len(reqs) - 1; i >= 0; i-- {
			got, err := reqs[i].Wait(ctx)
			if err != nil {
				return nil, err
			}
			q, tag := i/3, i%3
			want := comm.Int32s{int32(q), int32(r), int32(tag)}[:1+tag]
			if got != len(want) || !slices.Equal(bufs[i][:got], want) {
				return nil, fmt.Errorf("message from %d tag %d: got %v, want %v", q, tag, bufs[i][:got], want)
			}
			out = append(out, bufs[i].Bytes()...)
		}
		for _, s := range sends {
			if _, err := s.Wait(ctx); err != nil {
				return nil, err
			}
		}
		return out, nil
	}})
	cs = append(cs, check{"Overlapped/IAllReduce+IAllGather", func(ctx context.Context, c comm.Communicator) ([]byte, error) {
		// Several non-blocking collectives in flight at once, waited for
		// in reverse order.
		const L = 300007
		type job struct {
			buf comm.Buffer
			req comm.Request
		}
		var jobs []job
		var refs []comm.Buffer
		for k := 0; k < 4; k++ {
			in := inputs(comm.Float32, uint64(900+k), n, L+k)
			buf := clone(in[c.Rank()])
			req, err := comm.IAllReduce(ctx, c, buf)
			if err != nil {
				return nil, err
			}
			want := reference(genKey{dt: comm.Float32, seed: uint64(900 + k), n: L + k, refCase: "allreduce"}, in, chunkBounds(L+k, n))
			jobs, refs = append(jobs, job{buf, req}), append(refs, want)
			m := 1000 + 17*k
			var wantG comm.Int64s
			for q := 0; q < n; q++ {
				wantG = append(wantG, genI64(uint64(k), q, m)...)
			}
			recv := make(comm.Int64s, len(wantG))
			req, err = c.IAllGather(ctx, genI64(uint64(k), c.Rank(), m), recv)
			if err != nil {
				return nil, err
			}
			jobs, refs = append(jobs, job{recv, req}), append(refs, wantG)
		}
		var out []byte
		for i := len(jobs) - 1; i >= 0; i-- {
			if _, err := jobs[i].req.Wait(ctx); err != nil {
				return nil, err
			}
			if !bytes.Equal(jobs[i].buf.Bytes(), refs[i].Bytes()) {
				return nil, fmt.Errorf("job %d: result differs from the reference", i)
			}
			out = append(out, jobs[i].buf.Bytes()...)
		}
		return out, nil
	}})
	return cs
}

// runChecks runs the sequence on c and returns each check's output.
func runChecks(ctx context.Context, c comm.Communicator, cs []check, fail func(name string, err error)) [][]byte {
	outs := make([][]byte, len(cs))
	for i, ck := range cs {
		out, err := ck.run(ctx, c)
		if err != nil {
			fail(ck.name, err)
		}
		outs[i] = out
	}
	return outs
}

func workerCalls(t *testing.T) {
	ctx := context.Background()
	cfg := Config{}
	if s := os.Getenv(segEnv); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		cfg.SegmentBytes, cfg.Window = v, 3
	}
	c, err := OpenConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, rank := c.Size(), c.Rank()
	cs := checksFor(n)
	t0 := time.Now()
	mpiOut := runChecks(ctx, c, cs, func(name string, err error) { t.Errorf("rank %d: %s on MPI: %v", rank, name, err) })

	t.Logf("rank %d: %d checks on MPI in %v", rank, len(cs), time.Since(t0))
	// Errors that never reach MPI (identical on every rank).
	errCases := []struct {
		name string
		err  error
		want string
	}{
		{"AllGather length", c.AllGather(ctx, make(comm.Float32s, 2), make(comm.Float32s, 2*n+1)), "want Size()*send.Len()"},
		{"AllGatherV counts", c.AllGatherV(ctx, make(comm.Float32s, 1), make(comm.Float32s, 1), make([]int, n+1)), "counts for"},
		{"Broadcast root", c.Broadcast(ctx, make(comm.Float32s, 1), n), "outside"},
		{"Send tag", c.Send(ctx, make(comm.Float32s, 1), 0, -1), "tag"},
		{"nil buffer", c.AllReduce(ctx, nil), "nil"},
	}
	for _, ec := range errCases {
		if ec.err == nil || !strings.Contains(ec.err.Error(), ec.want) {
			t.Errorf("%s: err = %v, want one containing %q", ec.name, ec.err, ec.want)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.AllReduce(cctx, make(comm.Float32s, 10)); err == nil || !strings.Contains(err.Error(), "canceled") {
		t.Errorf("AllReduce with a cancelled context: err = %v", err)
	}
	// A message longer than the receive buffer is an error that names it.
	if n > 1 {
		peer := rank ^ 1
		if peer < n {
			if err := c.Send(ctx, make(comm.Float32s, 10), peer, 11); err != nil {
				t.Fatal(err)
			}
			_, err := c.Recv(ctx, make(comm.Float32s, 4), peer, 11)
			if err == nil || !strings.Contains(err.Error(), "longer than the receive buffer") {
				t.Errorf("truncated Recv: err = %v", err)
			}
		}
	}

	// The same sequence on the in-process backend must give identical bytes.
	var localOut [][]byte
	t0 = time.Now()
	err = local.Run(ctx, n, func(ctx context.Context, lc comm.Communicator) error {
		outs := runChecks(ctx, lc, cs, func(name string, err error) {
			if lc.Rank() == rank {
				t.Errorf("rank %d: %s on the local backend: %v", rank, name, err)
			}
		})
		if lc.Rank() == rank {
			localOut = outs
		}
		return nil
	})
	if err != nil {
		t.Fatalf("local.Run: %v", err)
	}
	t.Logf("rank %d: the same checks on the local backend in %v", rank, time.Since(t0))
	for i, ck := range cs {
		if !bytes.Equal(mpiOut[i], localOut[i]) {
			t.Errorf("rank %d: %s: MPI and in-process results differ", rank, ck.name)
		}
	}
	if err := c.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Barrier(ctx); err == nil {
		t.Error("Barrier after Close succeeded")
	}
	if !t.Failed() {
		fmt.Printf("%s rank %d of %d, %d checks\n", okMarker, rank, n, len(cs))
	}
}
