package sparsify

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
)

func TestNewLayout(t *testing.T) {
	l, err := NewLayout([]string{"a", "b", "c"}, []int{3, 1, 5})
	if err != nil {
		t.Fatal(err)
	}
	if l.N != 9 {
		t.Fatalf("N = %d, want 9", l.N)
	}
	wantOff := []int{0, 3, 4}
	for i, tn := range l.Tensors {
		if tn.Offset != wantOff[i] || tn.Name != []string{"a", "b", "c"}[i] {
			t.Fatalf("tensor %d = %+v, want offset %d", i, tn, wantOff[i])
		}
	}
	for _, bad := range []struct {
		names []string
		sizes []int
		want  string
	}{
		{[]string{"a"}, []int{1, 2}, "1 names but 2 sizes"},
		{[]string{"a", "z"}, []int{1, 0}, `"z"`},
		{[]string{"a"}, []int{-4}, "size -4"},
	} {
		if _, err := NewLayout(bad.names, bad.sizes); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("NewLayout(%v, %v) error %v, want one containing %q", bad.names, bad.sizes, err, bad.want)
		}
	}
	if _, err := FlatLayout(0); err == nil {
		t.Error("FlatLayout(0) accepted")
	}
	if f, err := FlatLayout(7); err != nil || f.N != 7 || len(f.Tensors) != 1 {
		t.Errorf("FlatLayout(7) = %+v, %v", f, err)
	}
}

func TestRandomLayoutCoversN(t *testing.T) {
	rng := harnessRNG(1, 0, 0)
	for _, N := range []int{1, 2, 3, 10, 1000} {
		for range 20 {
			l, err := randomLayout(rng, N)
			if err != nil {
				t.Fatal(err)
			}
			if l.N != N {
				t.Fatalf("randomLayout(%d).N = %d", N, l.N)
			}
			if N >= 3 && l.Tensors[0].Size != 1 {
				t.Fatalf("first tensor has size %d, want 1", l.Tensors[0].Size)
			}
		}
	}
}

func TestBudgetK(t *testing.T) {
	for _, tc := range []struct {
		rho  float64
		n, k int
	}{
		{0.01, 100, 1},
		{0.01, 99, 1},   // ⌊0.99⌋ = 0, clamped to 1
		{1e-12, 1, 1},   // clamp
		{0.5, 7, 3},     // floor
		{1, 5, 5},       // all
		{0.29, 100, 28}, // 0.29·100 = 28.999999999999996 in float64: floor as Python int()
		{0.01, 11173962, 111739},
	} {
		if got := BudgetK(tc.rho, tc.n); got != tc.k {
			t.Errorf("BudgetK(%v, %d) = %d, want %d", tc.rho, tc.n, got, tc.k)
		}
	}
}

func TestMemoryAccumulate(t *testing.T) {
	m := NewMemory(3, false)
	m.Residual[1] = 2
	acc, err := m.Accumulate([]float32{1, 1, 1}, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(acc, []float32{1, 3, 1}) || &acc[0] != &m.Residual[0] {
		t.Fatalf("acc = %v (must be the residual, in place), want [1 3 1]", acc)
	}
	ml := NewMemory(2, true)
	acc, _ = ml.Accumulate([]float32{2, -4}, 0.5)
	if !slices.Equal(acc, []float32{1, -2}) {
		t.Fatalf("lr-scaled acc = %v, want [1 -2]", acc)
	}
	if _, err := m.Accumulate([]float32{1}, 1); err == nil || !strings.Contains(err.Error(), "1 elements, memory 3") {
		t.Fatalf("length mismatch error = %v", err)
	}
	_, err = m.Accumulate([]float32{0, float32(math.Inf(1)), 0}, 1)
	if err == nil || !strings.Contains(err.Error(), "element 1") {
		t.Fatalf("infinite gradient error = %v, want one naming element 1", err)
	}
	m2 := NewMemory(2, false)
	if _, err := m2.Accumulate([]float32{0, float32(math.NaN())}, 1); err == nil || !strings.Contains(err.Error(), "NaN") {
		t.Fatalf("NaN gradient error = %v", err)
	}
}

func TestNorm2(t *testing.T) {
	if got := norm2(nil); got != 0 {
		t.Fatalf("norm2(nil) = %v", got)
	}
	if got := norm2([]float32{3, -4}); got != 5 {
		t.Fatalf("norm2([3 -4]) = %v", got)
	}
	big := []float32{3e30, 4e30} // squares overflow float32 but not float64
	want := math.Hypot(float64(big[0]), float64(big[1]))
	if got := norm2(big); math.Abs(got-want) > 1e-15*want {
		t.Fatalf("norm2(%v) = %v", big, got)
	}
}

// testBase is the frame of a reducer on the CPU over a flat layout of N
// elements, for testing its shared helpers.
func testBase(c comm.Communicator, N int) *Env {
	lay, err := FlatLayout(N)
	if err != nil {
		panic(err)
	}
	return newEnv(Options{Comm: c, Layout: lay, Density: 1})
}

// TestGatherIndices gathers random lists of random lengths (including all
// empty) and checks the lists, counts and bytes (the int32 wire format: an
// all-gather of one count per worker, then an all-gather-v of the lists,
// unpadded, concatenated in rank order).
func TestGatherIndices(t *testing.T) {
	for _, n := range harnessWorkerCounts {
		for trial := range 4 {
			t.Run(fmt.Sprintf("n=%d/%d", n, trial), func(t *testing.T) {
				lists := make([][]int32, n)
				for w := range n {
					rng := harnessRNG(uint64(trial), 0, w)
					if trial > 0 {
						for range rng.IntN(7) {
							lists[w] = append(lists[w], int32(rng.IntN(1<<30)))
						}
					}
				}
				err := local.Run(t.Context(), n, func(ctx context.Context, c comm.Communicator) error {
					b := testBase(c, 1<<30)
					mine := slices.Clone(lists[c.Rank()])
					got, counts, err := b.gatherIndicesOn(ctx, device.Host(mine))
					if err != nil {
						return err
					}
					var want []int32
					for w := range n {
						if counts[w] != len(lists[w]) {
							return fmt.Errorf("rank %d: worker %d count %d, want %d", c.Rank(), w, counts[w], len(lists[w]))
						}
						want = append(want, lists[w]...)
					}
					if !slices.Equal(got.Int32s(), want) {
						return fmt.Errorf("rank %d: gathered %v, want %v", c.Rank(), got.Int32s(), want)
					}
					lens := make([]int, n)
					for w := range n {
						lens[w] = len(lists[w])
					}
					s, r := expectTraffic(n, c.Rank(), []harnessCall{{Op: comm.OpAllGather, Elems: 1, ESize: 4}, {Op: comm.OpAllGatherV, ESize: 4, Counts: lens}})
					if tot := b.c.Totals(); tot.BytesSent != s || tot.BytesRecv != r {
						return fmt.Errorf("rank %d: bytes %d/%d, want %d/%d", c.Rank(), tot.BytesSent, tot.BytesRecv, s, r)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestUnionReduce checks the shared-union all-reduce against its definition,
// with and without residual aliasing acc, and with an empty union.
func TestUnionReduce(t *testing.T) {
	for _, n := range harnessWorkerCounts {
		for _, alias := range []bool{false, true} {
			for _, union := range [][]int32{nil, {0}, {1, 4, 5, 9}} {
				t.Run(fmt.Sprintf("n=%d/alias=%v/u=%v", n, alias, union), func(t *testing.T) {
					const N = 10
					accs := make([][]float32, n)
					for w := range accs {
						accs[w] = make([]float32, N)
						genSmallInts(harnessRNG(5, 0, w), accs[w])
					}
					err := local.Run(t.Context(), n, func(ctx context.Context, c comm.Communicator) error {
						w := c.Rank()
						acc := append([]float32(nil), accs[w]...)
						out := make([]float32, N)
						res := make([]float32, N)
						if alias {
							res = acc
						}
						b := testBase(c, N)
						if err := b.unionReduceOn(ctx, device.Host(acc), device.Host(out), device.Host(res), device.Host(slices.Clone(union))); err != nil {
							return err
						}
						for i := range N {
							wantOut, wantRes := float32(0), accs[w][i]
							if slices.Contains(union, int32(i)) {
								var s float32
								for v := range n {
									s += accs[v][i] // small integers: exact
								}
								wantOut, wantRes = s*(1/float32(n)), 0
							}
							if out[i] != wantOut || res[i] != wantRes {
								return fmt.Errorf("rank %d index %d: out %v residual %v, want %v %v", w, i, out[i], res[i], wantOut, wantRes)
							}
						}
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
}

// TestGatherIndicesRejectsBadCounts is a regression test: a peer that
// announces a negative index count (corrupt data or a different build) made
// the gather slice out of range and panic, and one that announced more
// indices than the gradient has (up to MaxInt32) made it allocate n·count
// elements; both must be an error naming the rank and the count, raised
// before the indices are gathered. Rank 1 plays the peer with a real
// AllGather call.
func TestGatherIndicesRejectsBadCounts(t *testing.T) {
	const N = 10
	for _, bad := range []int32{-5, N + 1, 1 << 20, math.MaxInt32} {
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			var got error
			err := local.Run(context.Background(), 2, func(ctx context.Context, c comm.Communicator) error {
				if c.Rank() == 1 {
					cnt := make([]int32, 2)
					if err := c.AllGather(ctx, comm.Int32s{bad}, comm.Int32s(cnt)); err != nil {
						return err
					}
					return c.Barrier(ctx) // fails with the abort rank 0 causes
				}
				_, _, got = testBase(c, N).gatherIndicesOn(ctx, device.Host([]int32{3}))
				return got
			})
			if err == nil || got == nil {
				t.Fatalf("count %d: Run error %v, gather error %v; want both", bad, err, got)
			}
			if !strings.Contains(got.Error(), "rank 1") || !strings.Contains(got.Error(), fmt.Sprint(bad)) || !strings.Contains(got.Error(), fmt.Sprint(N)) {
				t.Errorf("count %d: error %q does not name rank 1, the count and the gradient length %d", bad, got, N)
			}
		})
	}
}

// TestUnionReduceRejectsBadIndex is a regression test: an index outside the
// gradient in the gathered union (sent by a peer with another layout) made
// the union's all-reduce index out of range and panic; it must be an error
// naming the index and the range. The check costs no wait of its own
// (Env.checkRange): the index is replaced by 0 so the passes stay in
// bounds, and the error comes when the call's checks are read (the frame
// does it with its norm's wait, and the call fails).
func TestUnionReduceRejectsBadIndex(t *testing.T) {
	c := local.New(1).Comm(0)
	for _, j := range []int32{-1, 4, math.MaxInt32} {
		acc := []float32{1, 2, 3, 4}
		out := []float32{9, 9, 9, 9}
		res := make([]float32, 4)
		e := testBase(c, 4)
		if err := e.unionReduceOn(context.Background(), device.Host(acc), device.Host(out), device.Host(res), device.Host([]int32{0, j})); err != nil {
			t.Fatalf("index %d: the call failed before its checks were read: %v", j, err)
		}
		err := e.rangeErr()
		if err == nil || !strings.Contains(err.Error(), fmt.Sprint(j)) || !strings.Contains(err.Error(), "[0, 4)") {
			t.Fatalf("index %d: error %v, want one naming the index and the range", j, err)
		}
		if err := e.rangeErr(); err != nil {
			t.Errorf("index %d: the call's checks were not forgotten once read: %v", j, err)
		}
	}
}

// norm2 is the Euclidean norm of x as the reducers compute their error norm:
// the square root of segmentSumSquares(x).
func norm2(x []float32) float64 { return math.Sqrt(segmentSumSquares(x)) }
