package cuda_test

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// The sparsification primitives on the GPU against package sparsify's CPU
// primitives (and, for what sparsify does not export, plain loops written
// here) on the same inputs: the same index sets in the same order, values
// equal.

// cuda.Sparse is the GPU's sparsify.Ops.
var _ sparsify.Ops = (*cuda.Sparse)(nil)

// sparseInput returns n elements of one of several kinds: normal values,
// values with many ties (a few distinct magnitudes), mostly zeros, and
// normal values with ±Inf and NaN sprinkled in (nan).
func sparseInput(r *rand.Rand, kind string, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch kind {
		case "normal", "nan":
			x[i] = float32(r.NormFloat64())
		case "ties":
			x[i] = float32(r.IntN(7)-3) * 0.25
		case "zeros":
			if r.IntN(50) == 0 {
				x[i] = float32(r.NormFloat64())
			}
		}
	}
	if kind == "nan" && n > 0 {
		for range 1 + n/1000 {
			x[r.IntN(n)] = float32(math.Inf(1 - 2*r.IntN(2)))
			x[r.IntN(n)] = float32(math.NaN())
		}
	}
	return x
}

func allocInt32(t testing.TB, d device.Device, n int) device.Buffer {
	t.Helper()
	b, err := d.Alloc(device.Int32, n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func downloadInt32(t testing.TB, s device.Stream, b device.Buffer) []int32 {
	t.Helper()
	h := make([]int32, b.Len())
	if err := s.Copy(device.Host(h), b); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return h
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// sparseSizes are the lengths tested: empty, tiny, one tile (4096
// elements) and around it, several tiles.
func sparseSizes() []int { return []int{0, 1, 2, 5, 33, 4095, 4096, 4097, 20000} }

func TestGPUTopKMatchesCPU(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	r := rand.New(rand.NewPCG(7, 7))
	for _, n := range sparseSizes() {
		for _, kind := range []string{"normal", "ties", "zeros", "nan"} {
			x := sparseInput(r, kind, n)
			xb := upload(t, s, x)
			idx := allocInt32(t, d, n)
			val := upload(t, s, make([]float32, n))
			ks := []int{0, 1, 2, n / 100, n / 3, n - 1, n, n + 3}
			for _, k := range ks {
				if k < 0 {
					continue
				}
				name := fmt.Sprintf("%s/n=%d/k=%d", kind, n, k)
				want := sparsify.TopK(nil, x, k)
				got, err := sp.TopK(s, idx, val, xb, k)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if got != len(want) {
					t.Fatalf("%s: TopK returned %d, want %d", name, got, len(want))
				}
				gi := downloadInt32(t, s, idx)[:got]
				if !slices.Equal(gi, want) {
					t.Fatalf("%s: indices differ from the CPU's (first GPU %v, CPU %v)", name, head(gi), head(want))
				}
				gv := download(t, s, val)[:got]
				wv := make([]float32, len(want))
				for j, i := range want {
					wv[j] = x[i]
				}
				if !sameBits(gv, wv) {
					t.Fatalf("%s: values differ", name)
				}
				if k >= 1 && k <= n {
					g, err := sp.KthLargestAbs(s, xb, k)
					if err != nil {
						t.Fatal(err)
					}
					if w := sparsify.KthLargestAbs(x, k); math.Float32bits(g) != math.Float32bits(w) {
						t.Fatalf("%s: KthLargestAbs %v, CPU %v", name, g, w)
					}
				}
			}
			// Without values.
			if n > 0 {
				if _, err := sp.TopK(s, idx, device.Buffer{}, xb, 1); err != nil {
					t.Fatal(err)
				}
				if g, w := downloadInt32(t, s, idx)[0], sparsify.TopK(nil, x, 1)[0]; g != w {
					t.Fatalf("%s/n=%d: top-1 without values: %d, CPU %d", kind, n, g, w)
				}
			}
			for _, b := range []device.Buffer{xb, idx, val} {
				d.Free(b)
			}
		}
	}
}

func head(x []int32) []int32 { return x[:min(len(x), 8)] }

func TestGPUSelectAboveMatchesCPU(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	r := rand.New(rand.NewPCG(8, 8))
	for _, n := range sparseSizes() {
		for _, kind := range []string{"normal", "ties", "zeros", "nan"} {
			x := sparseInput(r, kind, n)
			xb := upload(t, s, x)
			idx := allocInt32(t, d, n)
			val := upload(t, s, make([]float32, n))
			nan := float32(math.NaN())
			for _, th := range []float32{0, -1, 0.25, 0.5, 1.5, 3, float32(math.Inf(1)), nan, 1e-30} {
				name := fmt.Sprintf("%s/n=%d/t=%v", kind, n, th)
				want := sparsify.SelectAbove(nil, x, th)
				got, err := sp.SelectAbove(s, idx, val, xb, th)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if got != len(want) {
					t.Fatalf("%s: %d selected, CPU %d", name, got, len(want))
				}
				if gi := downloadInt32(t, s, idx)[:got]; !slices.Equal(gi, want) {
					t.Fatalf("%s: indices differ from the CPU's (first GPU %v, CPU %v)", name, head(gi), head(want))
				}
				wv := make([]float32, len(want))
				for j, i := range want {
					wv[j] = x[i]
				}
				if !sameBits(download(t, s, val)[:got], wv) {
					t.Fatalf("%s: values differ", name)
				}
			}
			if n > 10 && kind == "normal" {
				// Too short an output: the count, ErrCapacity, nothing written.
				want := len(sparsify.SelectAbove(nil, x, 0.5))
				got, err := sp.SelectAbove(s, idx.Slice(0, want-1), device.Buffer{}, xb, 0.5)
				if !errors.Is(err, cuda.ErrCapacity) || got != want {
					t.Fatalf("n=%d: short buffer: %d, %v; want %d and ErrCapacity", n, got, err, want)
				}
			}
			for _, b := range []device.Buffer{xb, idx, val} {
				d.Free(b)
			}
		}
	}
}

func TestGPUAccumulateAndNorms(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	r := rand.New(rand.NewPCG(9, 9))
	for _, n := range sparseSizes() {
		res := randVec(r, n, 1)
		g := randVec(r, n, 3)
		rb, gb := upload(t, s, res), upload(t, s, g)
		const scale = float32(0.37)
		first, err := sp.Accumulate(s, rb, gb, scale)
		if err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(res)
		for i := range want {
			want[i] += scale * g[i]
		}
		if first != -1 || !sameBits(download(t, s, rb), want) {
			t.Fatalf("n=%d: accumulate: first bad %d, or values differ", n, first)
		}
		// Segment sums of squares: empty segments, one segment, many; the
		// same bits as the CPU's, and close to a plain sum.
		// Each twice, the second time of another vector after a CountIn
		// (the segments stay on the device between calls with the same
		// bounds, CountIn's do not disturb them).
		for _, bounds := range [][]int{{0, n}, {0, 0, n / 3, n / 3, n}, {n / 2, n}, segments(r, n)} {
			for rep, xs := range []struct {
				b device.Buffer
				h []float32
			}{{rb, want}, {gb, g}} {
				if rep == 1 {
					if _, err := sp.CountIn(s, allocInt32(t, d, 1).Slice(0, 0), []int{0, 1, 2, 3, 4, 5, 6, 7, 8}); err != nil {
						t.Fatal(err)
					}
				}
				got, err := sp.SegmentSumSquares(s, xs.b, bounds)
				if err != nil {
					t.Fatal(err)
				}
				cpu, err := sparsify.CPUOps().SegmentSumSquares(nil, device.Host(xs.h), bounds)
				if err != nil {
					t.Fatal(err)
				}
				// SegmentSumSquaresTo leaves the same bits on the device.
				nseg := len(bounds) - 1
				sb, err := d.Alloc(device.Float64, nseg+1)
				if err != nil {
					t.Fatal(err)
				}
				if err := sp.SegmentSumSquaresTo(s, sb.Slice(0, nseg), xs.b, bounds); err != nil {
					t.Fatal(err)
				}
				onDev := make([]float64, nseg)
				if err := s.Copy(device.Host(onDev), sb.Slice(0, nseg)); err != nil {
					t.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					t.Fatal(err)
				}
				d.Free(sb)
				if !slices.Equal(onDev, got) {
					t.Fatalf("n=%d call %d %v: SegmentSumSquaresTo left %v, SegmentSumSquares returned %v", n, rep, bounds, onDev, got)
				}
				for j := range len(bounds) - 1 {
					var w float64
					for _, v := range xs.h[bounds[j]:bounds[j+1]] {
						w += float64(v) * float64(v)
					}
					if got[j] != cpu[j] || math.Abs(got[j]-w) > 1e-12*w {
						t.Fatalf("n=%d call %d segment %d %v: Σx² = %v, CPU %v, plain %v", n, rep, j, bounds[j:j+2], got[j], cpu[j], w)
					}
				}
			}
		}
		if n > 3 {
			// A value that overflows, and a NaN after it: the first is named.
			g2 := make([]float32, n)
			g2[n-1] = float32(math.NaN())
			g2[n/2] = 3e38
			res2 := make([]float32, n)
			res2[n/2] = 3e38
			rb2, gb2 := upload(t, s, res2), upload(t, s, g2)
			first, err := sp.Accumulate(s, rb2, gb2, 1)
			if err != nil || first != n/2 {
				t.Fatalf("n=%d: first non-finite %d (%v), want %d", n, first, err, n/2)
			}
			// The next call finds nothing again.
			if first, err := sp.Accumulate(s, rb, gb, 0); err != nil || first != -1 {
				t.Fatalf("n=%d: after a non-finite element, first non-finite %d (%v), want -1", n, first, err)
			}
			d.Free(rb2)
			d.Free(gb2)
		}
		d.Free(rb)
		d.Free(gb)
	}
}

// segments cuts [0, n) at random points.
func segments(r *rand.Rand, n int) []int {
	b := []int{0, n}
	for range 6 {
		b = append(b, r.IntN(n+1))
	}
	slices.Sort(b)
	return b
}

func TestGPUGatherScatter(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	r := rand.New(rand.NewPCG(10, 10))
	n := 5000
	x := randVec(r, n, 1)
	xb := upload(t, s, x)
	idx := sparsify.RandomK(nil, n, 700, 3)
	ib := allocInt32(t, d, len(idx))
	if err := s.Copy(ib, device.Host(idx)); err != nil {
		t.Fatal(err)
	}
	vb := upload(t, s, make([]float32, len(idx)))
	if err := sp.Gather(s, vb, xb, ib); err != nil {
		t.Fatal(err)
	}
	gv := download(t, s, vb)
	for j, i := range idx {
		if gv[j] != x[i] {
			t.Fatalf("gather %d: %v, want %v", j, gv[j], x[i])
		}
	}
	sb := upload(t, s, make([]float32, 40))
	if err := sp.GatherStrided(s, sb, xb, 3, 123); err != nil {
		t.Fatal(err)
	}
	for j, v := range download(t, s, sb) {
		if v != x[3+j*123] {
			t.Fatalf("strided gather %d: %v, want %v", j, v, x[3+j*123])
		}
	}
	if err := sp.GatherStrided(s, sb, xb, 3, 130); err == nil {
		t.Fatal("a strided gather past the end was accepted")
	}
	dst := randVec(r, n, 1)
	db := upload(t, s, dst)
	if err := sp.ScatterAdd(s, db, ib, vb, -0.5); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(dst)
	for j, i := range idx {
		want[i] += -0.5 * gv[j]
	}
	if !sameBits(download(t, s, db), want) {
		t.Fatal("scatter-add differs")
	}
	if err := sp.ScatterFill(s, db, ib, 0); err != nil {
		t.Fatal(err)
	}
	for _, i := range idx {
		want[i] = 0
	}
	if !sameBits(download(t, s, db), want) {
		t.Fatal("scatter-fill differs")
	}
}

// murmur3 is MurmurHash3 x86_32 of the 4-byte little-endian i, written
// from the algorithm's description (the reference for HashSelect).
func murmur3(i, seed uint32) uint32 {
	k := i * 0xcc9e2d51
	k = bits.RotateLeft32(k, 15) * 0x1b873593
	h := bits.RotateLeft32(seed^k, 13)*5 + 0xe6546b64
	h ^= 4
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	return h ^ h>>16
}

// methodKernel returns the kernel named name that method declares
// (sparsify.Method.Kernels).
func methodKernel(t *testing.T, method, name string) *device.Kernel {
	t.Helper()
	m, _ := sparsify.Lookup(method)
	for _, k := range m.Kernels {
		if k.Name == name {
			return k
		}
	}
	t.Fatalf("%s declares no kernel %s", method, name)
	return nil
}

// TestGPUDragonnHash: DRAGONN's one-pass kernel, its table compacted
// (CompactSlots), selects what the algorithm's description gives — every
// index i with |x_i| >= t, never an exact zero or NaN, inserted in
// ascending order at murmur3(i) mod slots, the highest index keeping a
// slot — and what the CPU's one pass selects, for positive and zero
// thresholds, sparse inputs, awkward sizes.
func TestGPUDragonnHash(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	k := methodKernel(t, "dragonn", "k_dragonn_hash")
	// A known value of MurmurHash3 x86_32: "\x00\x00\x00\x00" with seed 0
	// hashes to 0x2362f9de.
	if h := murmur3(0, 0); h != 0x2362f9de {
		t.Fatalf("reference murmur3(0, 0) = %#x", h)
	}
	// run hashes x at threshold th on ops and returns the compacted slots.
	// The threshold is where the kernel reads it: on the GPU for the GPU.
	run := func(ops sparsify.Ops, st device.Stream, x, table, out device.Buffer, th float32, seed uint32, slots int) (int, error) {
		tb := device.Host([]float32{th})
		if st != nil {
			tb = upload(t, st, []float32{th})
			defer d.Free(tb)
		}
		if x.Len() > 0 {
			if err := ops.Run(st, k, x.Len(), x, int64(x.Len()), tb, int32(seed), table, int32(slots), int64(0)); err != nil {
				return 0, err
			}
		}
		return ops.CompactSlots(st, out, table)
	}
	r := rand.New(rand.NewPCG(13, 14))
	for _, tc := range []struct {
		n       int
		density float64 // of the non-zeros
		t       float32
		slots   int
	}{
		{1000, 1, 1.5, 200}, {1000, 1, 0.5, 40}, {100003, 1, 2.5, 4001}, {100003, 0.005, 0, 4001},
		{5000, 0, 0, 64}, {10, 1, 0, 4}, {1, 1, 0.1, 1}, {0, 1, 0, 4}, {4099, 0.3, float32(math.NaN()), 16},
	} {
		x := randVec(r, tc.n, 1)
		for i := range x {
			if r.Float64() >= tc.density {
				x[i] = float32(math.Copysign(0, float64(r.IntN(2)*2-1)))
			}
		}
		table := make([]uint32, tc.slots)
		const seed = 47
		for i, v := range x { // ascending: the highest index wins a slot
			if v != 0 && float32(math.Abs(float64(v))) >= tc.t {
				table[murmur3(uint32(i), seed)%uint32(tc.slots)] = uint32(i) + 1
			}
		}
		var want []int32
		for _, v := range table {
			if v != 0 {
				want = append(want, int32(v-1))
			}
		}
		xb := upload(t, s, append(x, 0)).Slice(0, tc.n)
		ob := allocInt32(t, d, tc.slots)
		tb := allocInt32(t, d, tc.slots)
		if err := d.Math().Fill(s, tb.View(device.Float32, 0, tc.slots), 0); err != nil {
			t.Fatal(err)
		}
		got, err := run(sp, s, xb, tb, ob, tc.t, seed, tc.slots)
		if err != nil {
			t.Fatal(err)
		}
		if gi := downloadInt32(t, s, ob)[:got]; !slices.Equal(gi, want) {
			t.Fatalf("%+v: the kernel %d: %v…, want %d: %v…", tc, got, head(gi), len(want), head(want))
		}
		cpuOut, cpuTable := make([]int32, tc.slots), make([]int32, tc.slots)
		nc, err := run(sparsify.CPUOps(), nil, device.Host(x), device.Host(cpuTable), device.Host(cpuOut), tc.t, seed, tc.slots)
		if err != nil || !slices.Equal(cpuOut[:nc], want) {
			t.Fatalf("%+v: the CPU's pass %v… (%v), want %v…", tc, head(cpuOut[:nc]), err, head(want))
		}
	}
	// A short index buffer: the count and ErrCapacity, from both.
	tb := upload(t, s, []float32{0, 1, 2, 3}).View(device.Int32, 0, 4)
	if n, err := sp.CompactSlots(s, allocInt32(t, d, 1), tb); n != 3 || !errors.Is(err, cuda.ErrCapacity) {
		t.Fatalf("CompactSlots into 1 of 3: %d, %v", n, err)
	}
}

// TestGPUDgcMomentum: DGC's momentum-correction kernel gives the CPU's
// bits (vel = acc, res = acc + m·(acc − old vel)), also in place (res =
// acc).
func TestGPUDgcMomentum(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	k := methodKernel(t, "dgc", "k_dgc_momentum")
	r := rand.New(rand.NewPCG(15, 16))
	for _, n := range []int{0, 1, 1000, 70001} {
		for _, inPlace := range []bool{false, true} {
			vel, acc := randVec(r, n, 1), randVec(r, n, 1)
			const m = float32(0.9)
			cv, ca := slices.Clone(vel), slices.Clone(acc)
			cr := ca
			if !inPlace {
				cr = make([]float32, n)
			}
			if err := sparsify.CPUOps().Run(nil, k, n, device.Host(cv), device.Host(cr), device.Host(ca), int64(n), m); err != nil {
				t.Fatal(err)
			}
			vb, ab := upload(t, s, append(vel, 0)).Slice(0, n), upload(t, s, append(acc, 0)).Slice(0, n)
			rb := ab
			if !inPlace {
				rb = upload(t, s, make([]float32, n+1)).Slice(0, n)
			}
			if err := sp.Run(s, k, n, vb, rb, ab, int64(n), m); err != nil {
				t.Fatal(err)
			}
			if !sameBits(download(t, s, vb), cv) || !sameBits(download(t, s, rb), cr) {
				t.Fatalf("n=%d in place %v: the kernel's velocity or residual differs from the CPU's", n, inPlace)
			}
		}
	}
	if err := sp.Run(s, k, 3, device.Host([]float32{1, 2, 3}), upload(t, s, make([]float32, 3)), upload(t, s, make([]float32, 3)), int64(3), float32(0.9)); err == nil {
		t.Fatal("a host buffer accepted")
	}
	if err := sp.Run(s, k, 3, upload(t, s, make([]float32, 3)), 3); err == nil {
		t.Fatal("an int argument accepted")
	}
}

// TestGPUUnionRefusesOutOfRange: an index outside [0, n) anywhere in the
// lists (its check comes back with the count, in one wait) is an error as
// on the CPU, and leaves no mark behind: the next union is exact.
func TestGPUUnionRefusesOutOfRange(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	cpu := sparsify.CPUOps()
	r := rand.New(rand.NewPCG(12, 12))
	const n = 3000
	for _, bad := range []int32{-1, n, n + 77} {
		for _, at := range []int{0, 1, 999} {
			idx := make([]int32, 1000)
			for j := range idx {
				idx[j] = r.Int32N(n)
			}
			idx[at] = bad
			ib, ob := allocInt32(t, d, len(idx)), allocInt32(t, d, len(idx))
			if err := s.Copy(ib, device.Host(idx)); err != nil {
				t.Fatal(err)
			}
			_, gerr := sp.Union(s, ob, ib, n)
			_, cerr := cpu.Union(nil, device.Host(make([]int32, len(idx))), device.Host(idx), n)
			if gerr == nil || cerr == nil || !strings.Contains(gerr.Error(), fmt.Sprintf("index %d ", bad)) {
				t.Fatalf("index %d at %d: GPU %v, CPU %v", bad, at, gerr, cerr)
			}
			for j := range idx { // others than the refused lists marked
				idx[j] = r.Int32N(50)
			}
			s.Copy(ib, device.Host(idx))
			got, err := sp.Union(s, ob, ib, n)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]int32, len(idx))
			nw, _ := cpu.Union(nil, device.Host(want), device.Host(idx), n)
			if gi := downloadInt32(t, s, ob)[:got]; !slices.Equal(gi, want[:nw]) {
				t.Fatalf("after the refused union: %d indices %v…, CPU %d %v…", got, head(gi), nw, head(want[:nw]))
			}
		}
	}
}

func TestGPUUnionAndScatter(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	cpu := sparsify.CPUOps()
	r := rand.New(rand.NewPCG(11, 11))
	for _, tc := range []struct{ n, m int }{{10, 0}, {10, 1}, {100, 300}, {5000, 2000}, {20000, 20000}} {
		idx := make([]int32, tc.m)
		for j := range idx {
			idx[j] = r.Int32N(int32(tc.n))
		}
		ib := allocInt32(t, d, max(tc.m, 1)).Slice(0, tc.m)
		if err := s.Copy(ib, device.Host(idx)); err != nil {
			t.Fatal(err)
		}
		ob := allocInt32(t, d, max(tc.m, 1))
		for rep := range 2 { // the second call finds the marks cleared
			got, err := sp.Union(s, ob, ib, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]int32, tc.m)
			nw, err := cpu.Union(nil, device.Host(want), device.Host(idx), tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if gi := downloadInt32(t, s, ob)[:got]; got != nw || !slices.Equal(gi, want[:nw]) {
				t.Fatalf("%+v call %d: union of %d: %v…, CPU %v…", tc, rep, got, head(gi), head(want[:nw]))
			}
		}
		// Scatter the union's positions with scaled values.
		if tc.m > 0 {
			u, _ := cpu.Union(nil, device.Host(slices.Clone(idx)), device.Host(idx), tc.n)
			uniq := make([]int32, tc.m)
			cpu.Union(nil, device.Host(uniq), device.Host(idx), tc.n)
			val := randVec(r, u, 1)
			dst := randVec(r, tc.n, 1)
			db, vb := upload(t, s, dst), upload(t, s, val)
			ub := allocInt32(t, d, u)
			s.Copy(ub, device.Host(uniq[:u]))
			if err := sp.Scatter(s, db, ub, vb, -0.25); err != nil {
				t.Fatal(err)
			}
			if err := cpu.Scatter(nil, device.Host(dst), device.Host(uniq[:u]), device.Host(val), -0.25); err != nil {
				t.Fatal(err)
			}
			if !sameBits(download(t, s, db), dst) {
				t.Fatalf("%+v: scatter differs", tc)
			}
		}
	}
	// An index outside [0, n) is named, and later unions are unharmed.
	ib := allocInt32(t, d, 3)
	s.Copy(ib, device.Host([]int32{1, 7, 2}))
	ob := allocInt32(t, d, 3)
	if _, err := sp.Union(s, ob, ib, 5); err == nil || !strings.Contains(err.Error(), "index 7") {
		t.Fatalf("union with index 7 of 5: %v", err)
	}
	s.Copy(ib, device.Host([]int32{3, 1, 3}))
	if got, err := sp.Union(s, ob, ib, 5); err != nil || got != 2 || !slices.Equal(downloadInt32(t, s, ob)[:2], []int32{1, 3}) {
		t.Fatalf("union after an error: %d, %v", got, err)
	}
}

func TestGPUIndexOps(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	cpu := sparsify.CPUOps()
	r := rand.New(rand.NewPCG(12, 12))
	idx := make([]int32, 3000)
	for j := range idx {
		idx[j] = r.Int32N(9000) - 500 // some outside [0, 8000)
	}
	ib := allocInt32(t, d, len(idx))
	s.Copy(ib, device.Host(idx))
	for _, bounds := range [][]int{{0, 8000}, {0, 0, 100, 100, 5000, 8000}, {-500, 8500}, {}} {
		got, err := sp.CountIn(s, ib, bounds)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := cpu.CountIn(nil, device.Host(idx), bounds)
		if !slices.Equal(got, want) {
			t.Fatalf("CountIn %v: %v, CPU %v", bounds, got, want)
		}
	}
	gerr, cerr := sp.InRange(s, ib, 8000), cpu.InRange(nil, device.Host(idx), 8000)
	if gerr == nil || cerr == nil || strings.TrimPrefix(gerr.Error(), "cuda: ") != strings.TrimPrefix(cerr.Error(), "sparsify: ") {
		t.Fatalf("InRange: GPU %v, CPU %v", gerr, cerr)
	}
	if err := sp.InRange(s, ib, 9000); err == nil && slices.Min(idx) < 0 {
		t.Fatal("a negative index passed InRange")
	}
	// After a refused list, one in range passes.
	okb := allocInt32(t, d, 2)
	s.Copy(okb, device.Host([]int32{0, 7}))
	if err := sp.InRange(s, okb, 8); err != nil {
		t.Fatalf("InRange of [0 7] in [0, 8) after a refused list: %v", err)
	}
	if err := sp.Iota(s, ib.Slice(10, 20), 77); err != nil {
		t.Fatal(err)
	}
	if got := downloadInt32(t, s, ib)[10:20]; got[0] != 77 || got[9] != 86 {
		t.Fatalf("Iota: %v", got)
	}
	if err := sp.Shift(s, ib.Slice(10, 20), -7); err != nil {
		t.Fatal(err)
	}
	if got := downloadInt32(t, s, ib)[10:20]; got[0] != 70 || got[9] != 79 {
		t.Fatalf("Shift: %v", got)
	}
}

// TestGPUAccumulateFlag: AccumulateFlag adds like Accumulate (the same
// bits as a plain loop) and leaves in its flag the first element, over
// several calls with their bases, that became non-finite, whether its
// gradient element was, and the value — checked against a plain scan of the
// same inputs with NaN and ±Inf sprinkled in, overflows included.
func TestGPUAccumulateFlag(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	r := rand.New(rand.NewPCG(5, 17))
	flag, err := d.Alloc(device.Int64, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(flag)
	for _, n := range sparseSizes() {
		for _, kind := range []string{"normal", "nan", "overflow"} {
			in := kind
			if kind == "overflow" {
				in = "normal"
			}
			g := sparseInput(r, in, n)
			res := randVec(r, n, 1)
			if kind == "overflow" && n > 0 {
				i := r.IntN(n)
				res[i], g[i] = 3e38, 3e38
			}
			const scale = float32(1)
			want := slices.Clone(res)
			wantAt, wantGrad, wantV := -1, false, float32(0)
			for i := range want {
				want[i] += scale * g[i]
				if wantAt < 0 && (math.IsNaN(float64(want[i])) || math.IsInf(float64(want[i]), 0)) {
					wantAt, wantV = i, want[i]
					if math.IsNaN(float64(g[i])) || math.IsInf(float64(g[i]), 0) {
						wantGrad, wantV = true, g[i]
					}
				}
			}
			rb, gb := upload(t, s, res), upload(t, s, g)
			if err := s.Copy(flag, device.Host([]int64{-1})); err != nil {
				t.Fatal(err)
			}
			// In two calls, the second half first (the pipeline's
			// backward order): the flag keeps the lowest index.
			h := n / 3
			for _, c := range [][2]int{{h, n}, {0, h}} {
				if err := sp.AccumulateFlag(s, rb.Slice(c[0], c[1]), gb.Slice(c[0], c[1]), flag, c[0], scale); err != nil {
					t.Fatal(err)
				}
			}
			got := make([]int64, 1)
			if err := s.Copy(device.Host(got), flag); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if !sameBits(download(t, s, rb), want) {
				t.Fatalf("n=%d %s: values differ from r + scale·g", n, kind)
			}
			ok, at, grad, v := cuda.DecodeFeedbackFlag(uint64(got[0]))
			if ok != (wantAt < 0) || (!ok && (at != wantAt || grad != wantGrad || math.Float32bits(v) != math.Float32bits(wantV))) {
				t.Fatalf("n=%d %s: flag %v at %d (gradient %v) value %v, want at %d (gradient %v) value %v", n, kind, ok, at, grad, v, wantAt, wantGrad, wantV)
			}
			d.Free(rb)
			d.Free(gb)
		}
	}
	// Beyond the flag's indices: refused, naming the fix.
	x, err := d.Alloc(device.Float32, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(x)
	if err := sp.AccumulateFlag(s, x, x, flag, cuda.MaxFlagged-2, 1); err == nil || !strings.Contains(err.Error(), "use Accumulate") {
		t.Fatalf("base past the flag's indices: %v", err)
	}
}

// plainTopKSegments is TopKSegments written plainly: each segment's
// indices sorted by |x| descending (NaN above every number: by the
// magnitude's bits), ties by index, the first k kept, ascending, shifted.
func plainTopKSegments(x []float32, segs [][2]int, ks []int) []int32 {
	var out []int32
	for j, sg := range segs {
		lo, hi := sg[0], sg[1]
		k := max(0, min(ks[j], hi-lo))
		ix := make([]int32, 0, hi-lo)
		for i := lo; i < hi; i++ {
			ix = append(ix, int32(i))
		}
		key := func(i int32) uint32 { return math.Float32bits(x[i]) & 0x7fffffff }
		slices.SortFunc(ix, func(a, b int32) int {
			if ka, kb := key(a), key(b); ka != kb {
				if ka > kb {
					return -1
				}
				return 1
			}
			return int(a - b)
		})
		ix = ix[:k]
		slices.Sort(ix)
		out = append(out, ix...)
	}
	return out
}

// TestGPUTopKSegmentsMatchesCPU: every segment of a list selected at once
// on the GPU gives the index sets of the CPU's TopKSegments (one TopK per
// segment) and of a plain sort, in the list's order: segments out of order,
// empty, of one element, spanning several tiles, with k = 0, 1, the whole
// segment and more; inputs with ties, zeros, NaN and ±Inf.
func TestGPUTopKSegmentsMatchesCPU(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	r := rand.New(rand.NewPCG(3, 32))
	for _, n := range []int{1, 5, 33, 4097, 20000} {
		for _, kind := range []string{"normal", "ties", "zeros", "nan"} {
			x := sparseInput(r, kind, n)
			xb := upload(t, s, x)
			// Random cuts of [0, n) into segments, listed in a random order
			// (a DEFT bin), some left out, plus an empty segment.
			cuts := segments(r, n)
			var segs [][2]int
			var ks []int
			for j := range len(cuts) - 1 {
				if r.IntN(4) == 0 {
					continue
				}
				size := cuts[j+1] - cuts[j]
				k := []int{0, 1, size, size + 3, 1 + r.IntN(max(size, 1)), 1 + size/50}[r.IntN(6)]
				segs = append(segs, [2]int{cuts[j], cuts[j+1]})
				ks = append(ks, k)
			}
			segs = append(segs, [2]int{n / 2, n / 2})
			ks = append(ks, 2)
			r.Shuffle(len(segs), func(a, b int) { segs[a], segs[b] = segs[b], segs[a]; ks[a], ks[b] = ks[b], ks[a] })
			want := plainTopKSegments(x, segs, ks)
			cpuIdx := make([]int32, len(want))
			m, err := sparsify.CPUOps().TopKSegments(nil, device.Host(cpuIdx), device.Host(x), segs, ks)
			if err != nil || m != len(want) || !slices.Equal(cpuIdx, want) {
				t.Fatalf("n=%d %s: CPU wrote %d (%v), plain %d, or they differ", n, kind, m, err, len(want))
			}
			ib := allocInt32(t, d, max(len(want), 1))
			m, err = sp.TopKSegments(s, ib, xb, segs, ks)
			if err != nil || m != len(want) {
				t.Fatalf("n=%d %s: GPU wrote %d (%v), want %d", n, kind, m, err, len(want))
			}
			if got := downloadInt32(t, s, ib)[:m]; !slices.Equal(got, want) {
				t.Fatalf("n=%d %s segments %v ks %v: GPU %v, want %v", n, kind, segs, ks, got, want)
			}
			// The same list written in device memory (TopKSegmentsOn),
			// with bounds above what it holds: the launches sized for
			// more segments and tiles than there are.
			extra := r.IntN(3)
			list := []int32{int32(len(segs))}
			for j, sg := range segs {
				list = append(list, int32(sg[0]), int32(sg[1]), int32(ks[j]))
			}
			list = append(list, make([]int32, 3*extra)...)
			for j := range cpuIdx {
				cpuIdx[j] = -1
			}
			if err := sparsify.CPUOps().TopKSegmentsOn(nil, device.Host(cpuIdx), device.Host(x), device.Host(list), len(segs)+extra, n); err != nil || !slices.Equal(cpuIdx, want) {
				t.Fatalf("n=%d %s: CPU's TopKSegmentsOn: %v, or it differs", n, kind, err)
			}
			lb := allocInt32(t, d, len(list))
			if err := s.Copy(lb, device.Host(list)); err != nil {
				t.Fatal(err)
			}
			ib2 := allocInt32(t, d, max(len(want), 1))
			if err := sp.TopKSegmentsOn(s, ib2, xb, lb, len(segs)+extra, n); err != nil {
				t.Fatal(err)
			}
			if got := downloadInt32(t, s, ib2)[:len(want)]; !slices.Equal(got, want) {
				t.Fatalf("n=%d %s segments %v ks %v: GPU's TopKSegmentsOn %v, want %v", n, kind, segs, ks, got, want)
			}
			d.Free(ib2)
			d.Free(lb)
			d.Free(ib)
			d.Free(xb)
		}
	}
	// A segment outside x, and budgets that do not match: refused.
	xb := upload(t, s, []float32{1, 2, 3})
	defer d.Free(xb)
	ib := allocInt32(t, d, 4)
	defer d.Free(ib)
	if _, err := sp.TopKSegments(s, ib, xb, [][2]int{{1, 4}}, []int{1}); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("segment past x: %v", err)
	}
	if _, err := sp.TopKSegments(s, ib, xb, [][2]int{{0, 3}}, nil); err == nil || !strings.Contains(err.Error(), "budgets") {
		t.Fatalf("no budgets: %v", err)
	}
	// A list longer than announced: refused on the CPU (a GPU reads only
	// the announced bounds).
	if err := sparsify.CPUOps().TopKSegmentsOn(nil, device.Host(make([]int32, 4)), device.Host([]float32{1, 2, 3}), device.Host([]int32{2, 0, 1, 1, 1, 3, 1}), 1, 3); err == nil || !strings.Contains(err.Error(), "at most 1") {
		t.Fatalf("two segments announced as one: %v", err)
	}
}

// TestGPUSegmentedThresholdsMatchCPU: KthLargestAbsSegments,
// SelectAboveSegments and CompactSlotsSegments on the GPU give what the
// CPU's give and what a plain loop gives: segments empty, of one element,
// spanning several tiles, some left out; k = 1, the whole segment and in
// between; thresholds 0, negative, +Inf, NaN, an element's magnitude (ties)
// and the k-th largest; inputs with ties, zeros, NaN and ±Inf.
func TestGPUSegmentedThresholdsMatchCPU(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	cpu := sparsify.CPUOps()
	s := d.Stream()
	r := rand.New(rand.NewPCG(3, 33))
	key := func(v float32) uint32 { return math.Float32bits(v) & 0x7fffffff }
	for _, n := range []int{1, 5, 33, 4097, 20000} {
		for _, kind := range []string{"normal", "ties", "zeros", "nan"} {
			x := sparseInput(r, kind, n)
			xb := upload(t, s, x)
			cuts := segments(r, n)
			var segs [][2]int
			for j := range len(cuts) - 1 {
				if r.IntN(4) != 0 || cuts[j] == cuts[j+1] {
					segs = append(segs, [2]int{cuts[j], cuts[j+1]})
				}
			}
			// The k-th largest magnitudes of the non-empty segments.
			var kseg [][2]int
			var ks []int
			var wantThr []float32
			for _, sg := range segs {
				size := sg[1] - sg[0]
				if size == 0 {
					continue
				}
				k := []int{1, size, 1 + r.IntN(size), 1 + size/100}[r.IntN(4)]
				keys := make([]uint32, 0, size)
				for _, v := range x[sg[0]:sg[1]] {
					keys = append(keys, key(v))
				}
				slices.Sort(keys)
				kseg, ks = append(kseg, sg), append(ks, k)
				wantThr = append(wantThr, math.Float32frombits(keys[size-k]))
			}
			cpuThr := make([]float32, len(kseg))
			if err := cpu.KthLargestAbsSegments(nil, device.Host(cpuThr), device.Host(x), kseg, ks); err != nil || !sameBits(cpuThr, wantThr) {
				t.Fatalf("n=%d %s: CPU thresholds %v (%v), plain %v", n, kind, cpuThr, err, wantThr)
			}
			tb := upload(t, s, make([]float32, max(len(kseg), 1)))
			if err := sp.KthLargestAbsSegments(s, tb, xb, kseg, ks); err != nil {
				t.Fatal(err)
			}
			if got := download(t, s, tb)[:len(kseg)]; !sameBits(got, wantThr) {
				t.Fatalf("n=%d %s segments %v ks %v: GPU thresholds %v, want %v", n, kind, kseg, ks, got, wantThr)
			}
			d.Free(tb)
			// Thresholds of every kind, one a segment (empty ones too).
			thr := make([]float32, len(segs))
			for j, sg := range segs {
				switch r.IntN(6) {
				case 0:
					thr[j] = 0
				case 1:
					thr[j] = -1
				case 2:
					thr[j] = float32(math.Inf(1))
				case 3:
					thr[j] = float32(math.NaN())
				default:
					if sg[1] > sg[0] {
						thr[j] = float32(math.Abs(float64(x[sg[0]+r.IntN(sg[1]-sg[0])])))
					}
				}
			}
			var want []int32
			wantCounts := make([]int, len(segs))
			for j, sg := range segs {
				for i := sg[0]; i < sg[1]; i++ {
					v := x[i]
					if v == v && float32(math.Abs(float64(v))) >= thr[j] {
						want = append(want, int32(i))
						wantCounts[j]++
					}
				}
			}
			gather := func(idx []int32, counts []int) []int32 {
				var out []int32
				for j, sg := range segs {
					out = append(out, idx[sg[0]:sg[0]+counts[j]]...)
				}
				return out
			}
			ints := func(c []int32) []int {
				out := make([]int, len(c))
				for j, v := range c {
					out[j] = int(v)
				}
				return out
			}
			cpuIdx, cpuCounts := make([]int32, n), make([]int32, len(segs))
			err := cpu.SelectAboveSegments(nil, device.Host(cpuIdx), device.Host(cpuCounts), device.Host(x), device.Host(thr), segs)
			counts := ints(cpuCounts)
			if err != nil || !slices.Equal(counts, wantCounts) || !slices.Equal(gather(cpuIdx, counts), want) {
				t.Fatalf("n=%d %s: CPU counts %v (%v), plain %v, or the indices differ", n, kind, counts, err, wantCounts)
			}
			ib := allocInt32(t, d, n)
			thrb := upload(t, s, append(thr, 0))
			// The counts' buffer starts with garbage: every count is written.
			cb := allocInt32(t, d, len(segs)+1)
			if len(segs) > 0 {
				if err := s.Copy(cb, device.Host(slices.Repeat([]int32{-7}, len(segs)+1))); err != nil {
					t.Fatal(err)
				}
			}
			err = sp.SelectAboveSegments(s, ib, cb, xb, thrb, segs)
			if err == nil {
				counts = ints(downloadInt32(t, s, cb)[:len(segs)])
			}
			if err != nil || !slices.Equal(counts, wantCounts) {
				t.Fatalf("n=%d %s segments %v thresholds %v: GPU counts %v (%v), want %v", n, kind, segs, thr, counts, err, wantCounts)
			}
			if got := gather(downloadInt32(t, s, ib), counts); !slices.Equal(got, want) {
				t.Fatalf("n=%d %s segments %v thresholds %v: GPU indices differ", n, kind, segs, thr)
			}
			// Slot tables: the words of x's bits, zeros kept.
			words := make([]int32, n)
			for i, v := range x {
				words[i] = int32(math.Float32bits(v) & 0x7fffffff)
			}
			bounds := []int{0}
			for _, sg := range segs {
				bounds = append(bounds, sg[1])
			}
			bounds[len(bounds)-1] = n
			var wantSlots []int32
			wantNZ := make([]int, len(bounds)-1)
			for j := range wantNZ {
				for _, w := range words[bounds[j]:bounds[j+1]] {
					if w != 0 {
						wantSlots = append(wantSlots, w-1)
						wantNZ[j]++
					}
				}
			}
			cpuIdx = make([]int32, n)
			nz, err := cpu.CompactSlotsSegments(nil, device.Host(cpuIdx), device.Host(words), bounds)
			if err != nil || !slices.Equal(nz, wantNZ) || !slices.Equal(cpuIdx[:len(wantSlots)], wantSlots) {
				t.Fatalf("n=%d %s: CPU slot counts %v (%v), plain %v, or the slots differ", n, kind, nz, err, wantNZ)
			}
			wb := allocInt32(t, d, n)
			if err := s.Copy(wb, device.Host(words)); err != nil {
				t.Fatal(err)
			}
			nz, err = sp.CompactSlotsSegments(s, ib, wb, bounds)
			if err != nil || !slices.Equal(nz, wantNZ) {
				t.Fatalf("n=%d %s bounds %v: GPU slot counts %v (%v), want %v", n, kind, bounds, nz, err, wantNZ)
			}
			if got := downloadInt32(t, s, ib)[:len(wantSlots)]; !slices.Equal(got, wantSlots) {
				t.Fatalf("n=%d %s: GPU slots differ", n, kind)
			}
			for _, b := range []device.Buffer{ib, thrb, wb, xb} {
				d.Free(b)
			}
		}
	}
	// Bad input: refused on both, naming the problem.
	xb := upload(t, s, []float32{1, 2, 3})
	defer d.Free(xb)
	tb := upload(t, s, []float32{0, 0})
	defer d.Free(tb)
	ib := allocInt32(t, d, 4)
	defer d.Free(ib)
	x, th := device.Host([]float32{1, 2, 3}), device.Host([]float32{0, 0})
	for _, ops := range []struct {
		o       sparsify.Ops
		x, t, i device.Buffer
		s       device.Stream
	}{{cpu, x, th, device.Host(make([]int32, 4)), nil}, {sp, xb, tb, ib, s}} {
		if err := ops.o.KthLargestAbsSegments(ops.s, ops.t, ops.x, [][2]int{{0, 2}}, []int{3}); err == nil || !strings.Contains(err.Error(), "must be in [1, 2]") {
			t.Fatalf("%T: k past the segment: %v", ops.o, err)
		}
		if err := ops.o.KthLargestAbsSegments(ops.s, ops.t, ops.x, [][2]int{{1, 4}}, []int{1}); err == nil || !strings.Contains(err.Error(), "outside") {
			t.Fatalf("%T: segment past x: %v", ops.o, err)
		}
		if err := ops.o.SelectAboveSegments(ops.s, ops.i, ops.i, ops.x, ops.t, [][2]int{{1, 3}, {0, 1}}); err == nil || !strings.Contains(err.Error(), "ascending") {
			t.Fatalf("%T: segments out of order: %v", ops.o, err)
		}
	}
}

// TestGPUCountInToMatchesCPU: CountInTo leaves on the GPU the counts
// CountIn reads back, the CPU's and a plain loop's: indices outside the
// bounds (not counted), empty segments, no indices, bounds repeated and
// changed between calls (kept on the device).
func TestGPUCountInToMatchesCPU(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	r := rand.New(rand.NewPCG(3, 34))
	for round := range 30 {
		n := []int{0, 1, 7, 5000}[round%4]
		bounds := segments(r, 1+r.IntN(3000))
		if round%5 == 4 {
			bounds = bounds[:2]
		}
		idx := make([]int32, n)
		for j := range idx {
			idx[j] = int32(r.IntN(3200) - 100)
		}
		want := make([]int, len(bounds)-1)
		for _, i := range idx {
			for q := range want {
				if int(i) >= bounds[q] && int(i) < bounds[q+1] {
					want[q]++
					break
				}
			}
		}
		cpu := make([]int32, len(want))
		if err := sparsify.CPUOps().CountInTo(nil, device.Host(cpu), device.Host(idx), bounds); err != nil {
			t.Fatal(err)
		}
		ib := allocInt32(t, d, max(n, 1))
		if n > 0 {
			if err := s.Copy(ib.Slice(0, n), device.Host(idx)); err != nil {
				t.Fatal(err)
			}
		}
		cb := allocInt32(t, d, len(want))
		if err := sp.CountInTo(s, cb, ib.Slice(0, n), bounds); err != nil {
			t.Fatal(err)
		}
		got := downloadInt32(t, s, cb)
		for q := range want {
			if int(got[q]) != want[q] || int(cpu[q]) != want[q] {
				t.Fatalf("round %d bounds %v: GPU %v, CPU %v, want %v", round, bounds, got, cpu, want)
			}
		}
		d.Free(ib)
		d.Free(cb)
	}
}

// TestGPUTopKHistMatchesPlain: error feedback's accumulation counting the
// first radix round (AccumulateFlagHist) writes r + scale·g and the plain
// histogram of its magnitudes' bits 30..20, and TopKHist from those counts
// selects what a plain sort selects, with the values, leaving the counts
// zero for the next step — for k = 0, 1, a few, all and more, on inputs
// with ties, zeros, NaN and ±Inf, over two steps on the same buffers.
func TestGPUTopKHistMatchesPlain(t *testing.T) {
	d := gpu(t)
	sp := d.Sparse()
	s := d.Stream()
	r := rand.New(rand.NewPCG(11, 29))
	flag, err := d.Alloc(device.Int64, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(flag)
	hist := allocInt32(t, d, cuda.HistLen)
	defer d.Free(hist)
	if err := s.Copy(hist, device.Host(make([]int32, cuda.HistLen))); err != nil {
		t.Fatal(err)
	}
	for _, n := range sparseSizes() {
		for _, kind := range []string{"normal", "ties", "zeros", "nan"} {
			for _, k := range []int{0, 1, 2, n / 100, n / 3, n, n + 3} {
				name := fmt.Sprintf("%s/n=%d/k=%d", kind, n, k)
				// NaN + NaN has no portable payload: NaN and ±Inf enter
				// through the first step's gradient only.
				res := sparseInput(r, kind, n)
				if kind == "nan" {
					res = randVec(r, n, 1)
				}
				rb := upload(t, s, res)
				idx := allocInt32(t, d, n)
				val := upload(t, s, make([]float32, n))
				for step := range 2 {
					gk := kind
					if kind == "nan" && step > 0 {
						gk = "normal"
					}
					g := sparseInput(r, gk, n)
					gb := upload(t, s, g)
					acc := slices.Clone(res)
					wantHist := make([]int32, cuda.HistLen)
					for i := range acc {
						acc[i] += 0.5 * g[i]
						wantHist[(math.Float32bits(acc[i])&0x7fffffff)>>20]++
					}
					if err := s.Copy(flag, device.Host([]int64{-1})); err != nil {
						t.Fatal(err)
					}
					if err := sp.AccumulateFlagHist(s, rb, gb, flag, hist, 0, 0.5); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if !sameBits(download(t, s, rb), acc) {
						t.Fatalf("%s step %d: accumulation differs from r + scale·g", name, step)
					}
					if got := downloadInt32(t, s, hist); !slices.Equal(got, wantHist) {
						t.Fatalf("%s step %d: histogram differs from the plain count of bits 30..20", name, step)
					}
					got, err := sp.TopKHist(s, idx, val, rb, hist, k)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					want := plainTopKSegments(acc, [][2]int{{0, n}}, []int{k})
					if got != len(want) {
						t.Fatalf("%s step %d: TopKHist returned %d, want %d", name, step, got, len(want))
					}
					if gi := downloadInt32(t, s, idx)[:got]; !slices.Equal(gi, want) {
						t.Fatalf("%s step %d: indices differ from a plain sort's (first GPU %v, plain %v)", name, step, head(gi), head(want))
					}
					wv := make([]float32, len(want))
					for j, i := range want {
						wv[j] = acc[i]
					}
					if !sameBits(download(t, s, val)[:got], wv) {
						t.Fatalf("%s step %d: values differ", name, step)
					}
					if h := downloadInt32(t, s, hist); slices.ContainsFunc(h, func(c int32) bool { return c != 0 }) {
						t.Fatalf("%s step %d: the histogram is not zero after the selection", name, step)
					}
					res = acc
					d.Free(gb)
				}
				for _, b := range []device.Buffer{rb, idx, val} {
					d.Free(b)
				}
			}
		}
	}
	// A histogram too short is refused by both, naming it.
	short := allocInt32(t, d, 16)
	defer d.Free(short)
	x := upload(t, s, make([]float32, 8))
	defer d.Free(x)
	if err := sp.AccumulateFlagHist(s, x, x, flag, short, 0, 1); err == nil || !strings.Contains(err.Error(), "hist") {
		t.Fatalf("AccumulateFlagHist with 16 counters: %v", err)
	}
	if _, err := sp.TopKHist(s, short, device.Buffer{}, x, short, 1); err == nil || !strings.Contains(err.Error(), "hist") {
		t.Fatalf("TopKHist with 16 counters: %v", err)
	}
}
