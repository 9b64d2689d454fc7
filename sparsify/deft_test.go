package sparsify

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/device"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
)

// The reference below is written from the notes (section 2) as plainly as
// possible, with quadratic loops where those are the obvious reading, and
// simulates all workers in one process.

type deftRefFragment struct{ lo, hi, tensor int }

// deftRefFragments: tensors with size > N/n (real division) are cut into n
// chunks of q or q+1 elements (the first s mod n get q+1); others stay whole.
func deftRefFragments(l Layout, n int) []deftRefFragment {
	thr := float64(l.N) / float64(n)
	var fr []deftRefFragment
	pos := 0
	for ti, t := range l.Tensors {
		s := t.Size
		if float64(s) > thr {
			q, rem := s/n, s%n
			for i := 0; i < n; i++ {
				c := q
				if i < rem {
					c++
				}
				fr = append(fr, deftRefFragment{pos, pos + c, ti})
				pos += c
			}
		} else {
			fr = append(fr, deftRefFragment{pos, pos + s, ti})
			pos += s
		}
	}
	return fr
}

// deftRefNorms is the L2 norm of acc over each fragment, with the squares
// summed in the documented order of deftNorm (segmentSumSquares).
func deftRefNorms(acc []float32, fr []deftRefFragment) []float64 {
	norms := make([]float64, len(fr))
	for f, x := range fr {
		// Blocks of 4096 elements from the fragment's start; in each, four
		// partial sums (element i of the block into sum i mod 4, the last
		// size mod 4 into sum 0) combined as (s0+s1)+(s2+s3); the block
		// sums added in order from zero.
		var total float64
		for lo := x.lo; lo < x.hi; lo += 4096 {
			var s [4]float64
			size := min(x.hi-lo, 4096)
			for i := 0; i < size; i++ {
				v := float64(acc[lo+i])
				if i < size-size%4 {
					s[i%4] += float64(v * v)
				} else {
					s[0] += float64(v * v)
				}
			}
			total += (s[0] + s[1]) + (s[2] + s[3])
		}
		norms[f] = math.Sqrt(total)
	}
	return norms
}

// deftRefAllocate is the authors' allocation (DeftReducer in the reference
// code), written from its description with exact rationals: fragments in
// descending norm order (ties: the higher fragment number first, the
// reference's reversed ascending argsort where NumPy's sort is stable),
// remain_k = k and remain_norm = Σ norms; each fragment's share is
// trunc(remain_k · norm / remain_norm) (0 when remain_norm is 0), its k_f
// the size if the size is below the share, else max(1, share); then
// remain_k −= k_f, remain_norm −= norm. Empty fragments get 0.
func deftRefAllocate(norms []float64, sizes []int, k int) []int {
	order := make([]int, len(norms))
	for i := range order {
		order[i] = len(order) - 1 - i // ties: higher fragment number first
	}
	sort.SliceStable(order, func(a, b int) bool { return norms[order[a]] > norms[order[b]] })
	remainNorm := new(big.Rat)
	for _, x := range norms {
		remainNorm.Add(remainNorm, new(big.Rat).SetFloat64(x))
	}
	remainK := int64(k)
	kf := make([]int, len(norms))
	for _, f := range order {
		norm := new(big.Rat).SetFloat64(norms[f])
		if sizes[f] == 0 {
			continue
		}
		share := int64(0)
		if remainNorm.Sign() > 0 {
			q := new(big.Rat).Mul(new(big.Rat).SetInt64(remainK), norm)
			q.Quo(q, remainNorm)
			share = new(big.Int).Quo(q.Num(), q.Denom()).Int64() // truncation toward 0, as Python's int()
		}
		if int64(sizes[f]) < share {
			kf[f] = sizes[f]
		} else {
			kf[f] = int(max(1, share))
		}
		remainK -= int64(kf[f])
		remainNorm.Sub(remainNorm, norm)
	}
	return kf
}

// deftFloatAllocate is the authors' allocation as their code computes it,
// in float64: remain_norm kept by subtraction, the share
// int(remain_k · (norm / remain_norm)). It differs from deftRefAllocate only
// by rounding (the defect deftAllocator fixes).
func deftFloatAllocate(norms []float64, sizes []int, k int) []int {
	order := make([]int, len(norms))
	for i := range order {
		order[i] = len(order) - 1 - i
	}
	sort.SliceStable(order, func(a, b int) bool { return norms[order[a]] > norms[order[b]] })
	remainNorm := 0.0
	for _, x := range norms {
		remainNorm += x
	}
	remainK := k
	kf := make([]int, len(norms))
	for _, f := range order {
		if sizes[f] == 0 {
			continue
		}
		share := 0
		if remainNorm > 0 {
			share = int(float64(remainK) * (norms[f] / remainNorm))
		}
		if sizes[f] < share {
			kf[f] = sizes[f]
		} else {
			kf[f] = max(1, share)
		}
		remainK -= kf[f]
		remainNorm -= norms[f]
	}
	return kf
}

// deftRefPack is LPT: L times, the unused fragment of largest cost (first on
// ties) and the bin of smallest load (first on ties).
func deftRefPack(sizes, kf []int, n int) (bins [][]int, common []int) {
	L := len(sizes)
	cost := func(f int) float64 {
		if kf[f] > 1 {
			return float64(sizes[f]) * math.Log2(float64(kf[f]))
		}
		return float64(sizes[f])
	}
	used := make([]bool, L)
	loads := make([]float64, n)
	bins = make([][]int, n)
	for range L {
		best := -1
		for f := 0; f < L; f++ {
			if !used[f] && (best < 0 || cost(f) > cost(best)) {
				best = f
			}
		}
		b := 0
		for j := 1; j < n; j++ {
			if loads[j] < loads[b] {
				b = j
			}
		}
		used[best] = true
		if kf[best] == sizes[best] {
			common = append(common, best)
		} else {
			bins[b] = append(bins[b], best)
			loads[b] += cost(best)
		}
	}
	return bins, common
}

// deftRefTopK sorts indices by magnitude, largest first, lower index first on
// ties, keeps k and returns them ascending.
func deftRefTopK(x []float32, k int) []int {
	idx := make([]int, len(x))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return math.Abs(float64(x[idx[a]])) > math.Abs(float64(x[idx[b]])) })
	sel := append([]int(nil), idx[:min(k, len(x))]...)
	sort.Ints(sel)
	return sel
}

// deftRefIter is what one iteration of all workers must produce.
type deftRefIter struct {
	kf       [][]int // per worker
	bins     [][]int
	common   []int
	counts   []int
	union    []int
	out      []float32 // expected average (float64 sum / n)
	outTol   []float64
	residual [][]float32
	layerK   []int
}

func deftRefStep(t int, accs [][]float32, l Layout, density float64) deftRefIter {
	n, N := len(accs), l.N
	k := max(1, min(int(density*float64(N)), N))
	fr := deftRefFragments(l, n)
	sizes := make([]int, len(fr))
	for f, x := range fr {
		sizes[f] = x.hi - x.lo
	}
	var it deftRefIter
	for w := range n {
		kf := deftRefAllocate(deftRefNorms(accs[w], fr), sizes, k)
		it.kf = append(it.kf, kf)
	}
	leader := t % n
	it.bins, it.common = deftRefPack(sizes, it.kf[leader], n)
	for w := range n {
		bin := it.bins[(leader+w)%n]
		c := 0
		for _, f := range bin {
			for _, j := range deftRefTopK(accs[w][fr[f].lo:fr[f].hi], it.kf[w][f]) {
				it.union = append(it.union, fr[f].lo+j)
				c++
			}
		}
		it.counts = append(it.counts, c)
	}
	for _, f := range it.common {
		for j := fr[f].lo; j < fr[f].hi; j++ {
			it.union = append(it.union, j)
		}
	}
	it.out = make([]float32, N)
	it.outTol = make([]float64, N)
	it.layerK = make([]int, len(l.Tensors))
	for _, j := range it.union {
		var s, abs float64
		for w := range n {
			s += float64(accs[w][j])
			abs += math.Abs(float64(accs[w][j]))
		}
		it.out[j] = float32(s / float64(n))
		it.outTol[j] = sumAbsTol(n, abs)/float64(n) + math.Abs(s/float64(n))*u32
		for ti, tn := range l.Tensors {
			if j >= tn.Offset && j < tn.Offset+tn.Size {
				it.layerK[ti]++
			}
		}
	}
	for w := range n {
		r := append([]float32(nil), accs[w]...)
		for _, j := range it.union {
			r[j] = 0
		}
		it.residual = append(it.residual, r)
	}
	return it
}

// deftExpectTraffic is the byte count (Traffic convention) of a sequence of
// calls made by rank r of n.
type deftCall struct {
	op     comm.Op
	elems  int
	esize  int
	root   int
	counts []int
}

func deftExpectTraffic(n, r int, calls []deftCall) (sent, recv int64) {
	for _, c := range calls {
		s, rv := comm.Traffic(c.op, n, r, c.elems, c.esize, c.root, c.counts)
		sent += s
		recv += rv
	}
	return sent, recv
}

// deftGenScaled draws normal values scaled by a factor that changes every 37
// elements, so fragment norms differ by orders of magnitude.
func deftGenScaled(rng *rand.Rand, x []float32) {
	for i := range x {
		scale := math.Pow(10, -float64((i/37)%4))
		x[i] = float32(rng.NormFloat64() * scale)
	}
}

// deftGenZeroBlocks is genNormal with some all-zero blocks (zero-norm
// fragments).
func deftGenZeroBlocks(rng *rand.Rand, x []float32) {
	for i := range x {
		x[i] = 0
		if (i/13)%3 != 0 {
			x[i] = float32(rng.NormFloat64())
		}
	}
}

// deftCheckAgainstRef compares a harness result with the reference, every
// iteration and worker.
func deftCheckAgainstRef(t *testing.T, res *harnessResult) {
	t.Helper()
	n, l := res.Cfg.Workers, res.Layout
	frs := deftRefFragments(l, n)
	L := len(frs)
	for it := range res.Acc {
		ref := deftRefStep(it, res.Acc[it], l, res.Cfg.Density)
		for w := range n {
			what := fmt.Sprintf("iteration %d worker %d", it, w)
			checkClose(t, what+" out", res.Out[it][w], ref.out, ref.outTol)
			checkClose(t, what+" residual", res.Residual[it][w], ref.residual[w], nil)
			st := res.Stats[it][w]
			if st.Selected != ref.counts[w] {
				t.Fatalf("%s: Selected = %d, want %d", what, st.Selected, ref.counts[w])
			}
			if !slices.Equal(st.SelectedPerWorker, ref.counts) {
				t.Fatalf("%s: SelectedPerWorker = %v, want %v", what, st.SelectedPerWorker, ref.counts)
			}
			if want := float64(len(ref.union)) / float64(l.N); st.ActualDensity != want {
				t.Fatalf("%s: ActualDensity = %v, want %v", what, st.ActualDensity, want)
			}
			if !slices.Equal(st.LayerK, ref.layerK) {
				t.Fatalf("%s: LayerK = %v, want %v", what, st.LayerK, ref.layerK)
			}
			if !math.IsNaN(st.Threshold) {
				t.Fatalf("%s: Threshold = %v, want NaN", what, st.Threshold)
			}
			if st.Density != res.Cfg.Density {
				t.Fatalf("%s: Density = %v, want %v", what, st.Density, res.Cfg.Density)
			}
			if want := norm2(ref.residual[w]); math.Abs(st.ErrorNorm-want) > 1e-12*want {
				t.Fatalf("%s: ErrorNorm = %v, want %v", what, st.ErrorNorm, want)
			}
			sent, recv := deftExpectTraffic(n, w, []deftCall{
				{op: comm.OpBroadcast, elems: 2 * L, esize: 4, root: it % n}, // the leader's norms, float64 as int32 words
				{op: comm.OpAllGather, elems: 1, esize: 4},
				{op: comm.OpAllGatherV, esize: 4, counts: ref.counts},
				{op: comm.OpAllReduce, elems: len(ref.union), esize: 4},
			})
			if st.BytesSent != sent || st.BytesRecv != recv {
				t.Fatalf("%s: bytes sent/received %d/%d, want %d/%d", what, st.BytesSent, st.BytesRecv, sent, recv)
			}
		}
		// No overlap: the union is the sum of the bin selections plus the
		// common fragments, and has no duplicates.
		u := append([]int(nil), ref.union...)
		sort.Ints(u)
		if len(slices.Compact(u)) != len(ref.union) {
			t.Fatalf("iteration %d: reference union has duplicates", it)
		}
		common := 0
		fr := deftRefFragments(l, n)
		for _, f := range ref.common {
			common += fr[f].hi - fr[f].lo
		}
		sum := 0
		for _, c := range res.Stats[it][0].SelectedPerWorker {
			sum += c
		}
		if got := int(math.Round(res.Stats[it][0].ActualDensity * float64(l.N))); got != sum+common {
			t.Fatalf("iteration %d: union size %d, want bins %d + common %d", it, got, sum, common)
		}
	}
}

func TestDeftMatchesReference(t *testing.T) {
	gens := []struct {
		name string
		gen  harnessGen
	}{{"normal", genNormal}, {"smallints", genSmallInts}, {"sparse", genSparse}, {"scaled", deftGenScaled}, {"zeroblocks", deftGenZeroBlocks}}
	rng := rand.New(rand.NewPCG(7, 7))
	for ci, c := range standardCases() {
		for gi, g := range gens {
			if testing.Short() && gi > 1 && c.N > 97 {
				continue
			}
			layout, err := randomLayout(rng, c.N)
			if err != nil {
				t.Fatal(err)
			}
			cfg := harnessConfig{
				Method: "deft", Workers: c.Workers, Layout: layout, Density: c.Density,
				Iters: c.Workers + 2, Seed: uint64(ci*10 + gi), Feedback: true, InPlace: (ci+gi)%2 == 0, Gen: g.gen,
			}
			t.Run(c.String()+"/"+g.name, func(t *testing.T) {
				res := mustRunHarness(t, cfg)
				deftCheckAgainstRef(t, res)
				checkConservation(t, res)
				checkOutputsAgree(t, res)
			})
		}
	}
}

// TestDeftTwoBigTensors uses a hand-made layout where several tensors are
// larger than N/n, with sizes not divisible by n.
func TestDeftTwoBigTensors(t *testing.T) {
	names := []string{"conv", "bias", "fc", "b2", "emb"}
	sizes := []int{523, 3, 977, 1, 1301}
	l, err := NewLayout(names, sizes)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range harnessWorkerCounts {
		for _, d := range []float64{1e-9, 0.001, 0.02, 0.5, 1} {
			t.Run(fmt.Sprintf("n=%d/rho=%g", n, d), func(t *testing.T) {
				res := mustRunHarness(t, harnessConfig{Method: "deft", Workers: n, Layout: l, Density: d, Iters: n + 1, Seed: uint64(n), Feedback: true, Gen: deftGenScaled})
				deftCheckAgainstRef(t, res)
				checkConservation(t, res)
			})
		}
	}
}

func TestDeftFragments(t *testing.T) {
	tests := []struct {
		sizes []int
		n     int
		want  [][2]int
	}{
		{[]int{10}, 1, [][2]int{{0, 10}}},
		{[]int{10}, 3, [][2]int{{0, 4}, {4, 7}, {7, 10}}},
		{[]int{2, 8}, 2, [][2]int{{0, 2}, {2, 6}, {6, 10}}},
		{[]int{5, 5}, 2, [][2]int{{0, 5}, {5, 10}}}, // 5 is not > 10/2
		{[]int{1}, 3, [][2]int{{0, 1}, {1, 1}, {1, 1}}},
		// N = 4 < n: both tensors exceed N/n = 0.8 and are cut into 5.
		{[]int{1, 3}, 5, [][2]int{{0, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 4}, {4, 4}}},
		{[]int{3, 9, 4}, 4, [][2]int{{0, 3}, {3, 6}, {6, 8}, {8, 10}, {10, 12}, {12, 16}}},
	}
	for _, tc := range tests {
		names := make([]string, len(tc.sizes))
		l, err := NewLayout(names, tc.sizes)
		if err != nil {
			t.Fatal(err)
		}
		got := deftFragments(l, tc.n)
		var g [][2]int
		for _, f := range got {
			g = append(g, [2]int{f.lo, f.hi})
		}
		if !slices.Equal(g, tc.want) {
			t.Errorf("sizes %v n=%d: fragments %v, want %v", tc.sizes, tc.n, g, tc.want)
		}
	}
	// Random layouts against the reference.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		l, err := randomLayout(rng, 1+rng.IntN(300))
		if err != nil {
			t.Fatal(err)
		}
		n := 1 + rng.IntN(20)
		got, want := deftFragments(l, n), deftRefFragments(l, n)
		if len(got) != len(want) {
			t.Fatalf("%d fragments, want %d", len(got), len(want))
		}
		for f := range got {
			if got[f].lo != want[f].lo || got[f].hi != want[f].hi || got[f].tensor != want[f].tensor {
				t.Fatalf("fragment %d = %+v, want %+v", f, got[f], want[f])
			}
		}
	}
}

func TestDeftPackMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 2000 {
		L := 1 + rng.IntN(30)
		n := 1 + rng.IntN(17)
		frags := make([]deftFrag, L)
		sizes := make([]int, L)
		kf := make([]int, L)
		pos := 0
		for f := range frags {
			s := rng.IntN(20)
			frags[f] = deftFrag{pos, pos + s, 0}
			pos += s
			sizes[f] = s
			switch {
			case s == 0:
				kf[f] = 0
			case rng.IntN(4) == 0:
				kf[f] = s
			default:
				kf[f] = 1 + rng.IntN(s)
			}
		}
		lens := make([]int32, n)
		content := make([]int32, L)
		deftPack(frags, kf, n, lens, content)
		bins, common := deftRefPack(sizes, kf, n)
		pos = 0
		for b := range n {
			got := make([]int, lens[b])
			for i := range got {
				got[i] = int(content[pos+i])
			}
			pos += int(lens[b])
			if !slices.Equal(got, bins[b]) && !(len(got) == 0 && len(bins[b]) == 0) {
				t.Fatalf("trial %d: bin %d = %v, want %v", trial, b, got, bins[b])
			}
		}
		gotCommon := make([]int, 0, L-pos)
		for _, f := range content[pos:] {
			gotCommon = append(gotCommon, int(f))
		}
		if !slices.Equal(gotCommon, common) && !(len(gotCommon) == 0 && len(common) == 0) {
			t.Fatalf("trial %d: common = %v, want %v", trial, gotCommon, common)
		}
	}
}

// TestDeftIdenticalAccBudget: when every worker has the same acc (so all
// allocations agree), the union is exactly the allocation's total.
func TestDeftIdenticalAccBudget(t *testing.T) {
	l, err := NewLayout([]string{"a", "b", "c", "d"}, []int{1, 700, 45, 2001})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range harnessWorkerCounts {
		for _, d := range []float64{1e-9, 0.003, 0.05, 0.4} {
			k := BudgetK(d, l.N)
			fr := deftRefFragments(l, n)
			sizes := make([]int, len(fr))
			for f, x := range fr {
				sizes[f] = x.hi - x.lo
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			err := local.Run(ctx, n, func(ctx context.Context, c comm.Communicator) error {
				r, err := New("deft", Options{Density: d, Layout: l, Comm: c})
				if err != nil {
					return err
				}
				rng := rand.New(rand.NewPCG(uint64(n), 99)) // same stream on every rank
				acc := make([]float32, l.N)
				out := make([]float32, l.N)
				for it := range n + 2 {
					for i := range acc {
						acc[i] += float32(rng.NormFloat64() * math.Pow(10, -float64((i/100)%3)))
					}
					kf := deftRefAllocate(deftRefNorms(acc, fr), sizes, k)
					total := 0
					for _, v := range kf {
						total += v
					}
					st, err := r.Reduce(ctx, acc, out, acc)
					if err != nil {
						return err
					}
					u := int(math.Round(st.ActualDensity * float64(l.N)))
					if u != total {
						return fmt.Errorf("iteration %d: union %d, want the allocation's total %d", it, u, total)
					}
				}
				return nil
			})
			cancel()
			if err != nil {
				t.Fatalf("n=%d rho=%g: %v", n, d, err)
			}
		}
	}
}

func TestDeftErrors(t *testing.T) {
	l, _ := NewLayout([]string{"a", "b"}, []int{3, 5})
	w := local.New(1)
	c := w.Comm(0)
	if _, err := New("deft", Options{Density: 0, Layout: l, Comm: c}); err == nil {
		t.Error("density 0 accepted")
	}
	if _, err := New("deft", Options{Density: 0.5, Layout: l}); err == nil {
		t.Error("missing communicator accepted")
	}
	if _, err := New("deft", Options{Density: 0.5, Comm: c}); err == nil {
		t.Error("empty layout accepted")
	}
	r, err := New("deft", Options{Density: 0.5, Layout: l, Comm: c})
	if err != nil {
		t.Fatal(err)
	}
	if r.Name() != "deft" {
		t.Errorf("Name() = %q", r.Name())
	}
	ctx := context.Background()
	acc, out := make([]float32, 8), make([]float32, 8)
	if _, err := r.Reduce(ctx, acc[:7], out, acc); err == nil {
		t.Error("short acc accepted")
	}
	if _, err := r.Reduce(ctx, acc, acc, make([]float32, 8)); err == nil {
		t.Error("out aliasing acc accepted")
	}
	acc[4] = float32(math.Inf(1))
	if _, err := r.Reduce(ctx, acc, out, acc); err == nil {
		t.Error("infinite acc accepted")
	}
	acc[4] = float32(math.NaN())
	if _, err := r.Reduce(ctx, acc, out, acc); err == nil {
		t.Error("NaN acc accepted")
	}
}

// TestDeftPeerMissing: a worker whose peer never calls gets a context error,
// not a hang.
func TestDeftPeerMissing(t *testing.T) {
	l, _ := FlatLayout(100)
	w := local.New(2)
	r, err := New("deft", Options{Density: 0.1, Layout: l, Comm: w.Comm(0)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	acc, out := make([]float32, 100), make([]float32, 100)
	_, err = r.Reduce(ctx, acc, out, acc)
	if err == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, comm.ErrAborted)) {
		t.Fatalf("Reduce without peer: %v, want a deadline or abort error", err)
	}
}

// TestDeftNorms: deftNorms (sequential and parallel paths) is bit-identical
// to the documented summation order, and close to the plain norm.
func TestDeftNorms(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, N := range []int{1, 2, 3, 5, 7, 1000, 300_001} {
		l, err := randomLayout(rng, N)
		if err != nil {
			t.Fatal(err)
		}
		acc := make([]float32, N)
		deftGenScaled(rng, acc)
		for _, n := range []int{1, 3, 16} {
			frags := deftFragments(l, n)
			got := make([]float64, len(frags))
			deftNorms(got, acc, frags)
			want := deftRefNorms(acc, deftRefFragments(l, n))
			for f := range got {
				if got[f] != want[f] {
					t.Fatalf("N=%d n=%d fragment %d: norm %v, want %v", N, n, f, got[f], want[f])
				}
				if plain := norm2(acc[frags[f].lo:frags[f].hi]); math.Abs(got[f]-plain) > 1e-12*plain {
					t.Fatalf("N=%d n=%d fragment %d: norm %v, plain norm %v", N, n, f, got[f], plain)
				}
			}
		}
	}
}

// deftResNet18Layout is the layout of the CIFAR ResNet-18 of the DEFT/MiCRO
// code (notes 8.1): its 62 parameter tensors in PyTorch parameters() order,
// 11,173,962 elements.
func deftResNet18Layout() (Layout, error) {
	var names []string
	var sizes []int
	add := func(name string, size int) {
		names = append(names, name)
		sizes = append(sizes, size)
	}
	bn := func(prefix string, c int) {
		add(prefix+".weight", c)
		add(prefix+".bias", c)
	}
	add("conv1.weight", 64*3*3*3)
	bn("bn1", 64)
	in := 64
	for stage, out := range []int{64, 128, 256, 512} {
		for block := range 2 {
			p := fmt.Sprintf("layer%d.%d", stage+1, block)
			cin := out
			if block == 0 {
				cin = in
			}
			add(p+".conv1.weight", out*cin*3*3)
			bn(p+".bn1", out)
			add(p+".conv2.weight", out*out*3*3)
			bn(p+".bn2", out)
			if block == 0 && cin != out {
				add(p+".shortcut.0.weight", out*cin)
				bn(p+".shortcut.1", out)
			}
		}
		in = out
	}
	add("linear.weight", 512*10)
	add("linear.bias", 10)
	return NewLayout(names, sizes)
}

func TestDeftResNet18Layout(t *testing.T) {
	l, err := deftResNet18Layout()
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Tensors) != 62 || l.N != 11_173_962 {
		t.Fatalf("ResNet-18 layout has %d tensors and %d elements, want 62 and 11173962", len(l.Tensors), l.N)
	}
}

// deftNorms writes the L2 norm of acc over each fragment into norms, as the
// reducer computes them (Ops.SegmentSumSquares over the fragments, which
// tile the layout in order).
func deftNorms(norms []float64, acc []float32, frags []deftFrag) {
	segs := make([]int, 0, len(frags)+1)
	for _, fr := range frags {
		segs = append(segs, fr.lo)
	}
	segs = append(segs, len(acc))
	ss, err := CPUOps().SegmentSumSquares(nil, device.Host(acc), segs)
	if err != nil {
		panic(err)
	}
	for f := range frags {
		norms[f] = math.Sqrt(ss[f])
	}
}
