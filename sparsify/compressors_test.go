package sparsify

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/layout"
)

// Reference tests of the compressors (efsignsgd, powersgd), each a plain
// implementation written from its paper, in float64, compared with the
// reducers on random inputs: 1, 2, 3, 5 workers, odd shapes, several
// iterations with error feedback.

// compressorShapes are odd tensor shapes: 1-D tensors, a 1×1 matrix,
// tall, wide and 4-D tensors, sizes that are not multiples of 32.
var compressorShapes = [][]int{{1}, {5}, {7, 3}, {1, 1}, {3, 33}, {2, 3, 3, 2}, {13}, {40, 1}, {65, 9}, {16, 3, 3}, {20, 30}, nil}

// unknownShapeSize is the size of the tensor of unknown shape (a nil entry
// of compressorShapes): 96 = 8·12.
const unknownShapeSize = 96

// shapedLayout returns a layout of a random subset (at least one) of
// compressorShapes, in random order.
func shapedLayout(t *testing.T, rng *rand.Rand) Layout {
	t.Helper()
	var ts []layout.Tensor
	for len(ts) == 0 {
		for i, s := range compressorShapes {
			if rng.IntN(3) == 0 {
				continue
			}
			size := 1
			for _, d := range s {
				size *= d
			}
			if s == nil {
				size = unknownShapeSize
			}
			ts = append(ts, layout.Tensor{Name: fmt.Sprintf("t%d", i), Shape: s, Size: size})
		}
	}
	rng.Shuffle(len(ts), func(i, j int) { ts[i], ts[j] = ts[j], ts[i] })
	l, err := layout.Of(ts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// refEFSign is EF-SignSGD from the paper, distributed as the mean of the
// workers' compressed tensors: for worker w's acc p_w, per tensor of more
// than one dimension, C(p) = (‖p‖₁/d)·sign(p) (sign(0) = +1: one bit),
// out = (1/n)Σ_w C(p_w), residual_w = p_w − C(p_w); 1-D tensors: out =
// the mean, residual 0.
func refEFSign(l Layout, acc [][]float32) (out []float64, res [][]float64) {
	n := len(acc)
	out = make([]float64, l.N)
	res = make([][]float64, n)
	for w := range res {
		res[w] = make([]float64, l.N)
	}
	for _, tn := range l.Tensors {
		lo, hi := tn.Offset, tn.Offset+tn.Size
		for w := range n {
			if tn.Dims() == 1 {
				for i := lo; i < hi; i++ {
					out[i] += float64(acc[w][i]) / float64(n)
				}
				continue
			}
			l1 := 0.0
			for i := lo; i < hi; i++ {
				l1 += math.Abs(float64(acc[w][i]))
			}
			s := float64(float32(l1 / float64(tn.Size)))
			for i := lo; i < hi; i++ {
				c := s
				if acc[w][i] < 0 {
					c = -s
				}
				out[i] += c / float64(n)
				res[w][i] = float64(acc[w][i]) - c
			}
		}
	}
	return out, res
}

func TestEFSignSGDMatchesReference(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 5} {
		for seed := range uint64(4) {
			rng := rand.New(rand.NewPCG(seed, 35))
			l := shapedLayout(t, rng)
			res := mustRunHarness(t, harnessConfig{Method: "efsignsgd", Workers: workers, Layout: l, Density: 0.01, Iters: 3, Seed: seed, Feedback: true, InPlace: seed%2 == 1})
			// Conservation holds up to the rounding of acc − s·sign and
			// of the mean of ±s, which the reference comparison bounds;
			// checkConservation's bound (Σ|acc|) is too tight where
			// s > |acc|.
			checkOutputsAgree(t, res)
			for it := range res.Acc {
				out, rres := refEFSign(l, res.Acc[it])
				for w := range workers {
					for i := range out {
						if d := math.Abs(float64(res.Out[it][w][i]) - out[i]); d > 1e-6*(1+math.Abs(out[i])) {
							t.Fatalf("n=%d seed %d iteration %d worker %d: out[%d] = %v, reference %v", workers, seed, it, w, i, res.Out[it][w][i], out[i])
						}
						if d := math.Abs(float64(res.Residual[it][w][i]) - rres[w][i]); d > 1e-6*(1+math.Abs(rres[w][i])) {
							t.Fatalf("n=%d seed %d iteration %d worker %d: residual[%d] = %v, reference %v", workers, seed, it, w, i, res.Residual[it][w][i], rres[w][i])
						}
					}
				}
			}
		}
	}
}

// TestEFSignSGDBytes checks the wire format's size: one AllGather of
// 1 + ⌈d/32⌉ words per compressed tensor, one AllReduce of the 1-D ones.
func TestEFSignSGDBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	l := shapedLayout(t, rng)
	for _, workers := range []int{1, 2, 3, 5} {
		res := mustRunHarness(t, harnessConfig{Method: "efsignsgd", Workers: workers, Layout: l, Density: 0.01, Seed: 3})
		words, dense := 0, 0
		for _, tn := range l.Tensors {
			if tn.Dims() == 1 {
				dense += tn.Size
			} else {
				words += 1 + (tn.Size+31)/32
			}
		}
		var calls []harnessCall
		if dense > 0 {
			calls = append(calls, harnessCall{Op: comm.OpAllReduce, Elems: dense, ESize: 4})
		}
		if words > 0 {
			calls = append(calls, harnessCall{Op: comm.OpAllGather, Elems: words, ESize: 4})
		}
		for w := range workers {
			sent, recv := expectTraffic(workers, w, calls)
			st := res.Stats[0][w]
			if st.BytesSent != sent || st.BytesRecv != recv {
				t.Errorf("n=%d worker %d: bytes %d/%d, want %d/%d", workers, w, st.BytesSent, st.BytesRecv, sent, recv)
			}
		}
	}
}

// refPowerSGD is PowerSGD (Vogels et al. 2019, Algorithm 1) in float64 on
// the n workers' accs M_w, from the shared start q (per tensor index, the
// cols×r row-major Q; updated in place): per tensor of ≥2 dimensions the
// matrix (shape[0], rest) (unknown shape: rows the largest divisor of the
// size at most its square root), compressed with rank min(r, rows, cols)
// when (rows+cols)·rank·2 < rows·cols: P = Σ_w M_w Q, orthonormalized by
// Gram–Schmidt (norm + 1e-8), Q = (1/n) Σ_w M_wᵀ P, out = PQᵀ, residual_w
// = M_w − out; other tensors: out = the mean, residual 0.
func refPowerSGD(l Layout, acc [][]float32, r int, q map[int][]float64) (out []float64, res [][]float64) {
	n := len(acc)
	out = make([]float64, l.N)
	for ti, tn := range l.Tensors {
		rows := 0
		switch {
		case len(tn.Shape) >= 2:
			rows = tn.Shape[0]
		case len(tn.Shape) == 0:
			for d := 1; d*d <= tn.Size; d++ {
				if tn.Size%d == 0 {
					rows = d
				}
			}
		}
		cols, k := 0, 0
		if rows > 0 {
			cols = tn.Size / rows
			k = min(r, rows, cols)
		}
		if rows == 0 || (rows+cols)*k*2 >= rows*cols {
			for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
				for w := range n {
					out[i] += float64(acc[w][i])
				}
				out[i] /= float64(n)
			}
			continue
		}
		M := func(w, i, j int) float64 { return float64(acc[w][tn.Offset+i*cols+j]) }
		Q := q[ti]
		P := make([][]float64, k) // columns
		for c := range k {
			P[c] = make([]float64, rows)
			for i := range rows {
				for w := range n {
					for j := range cols {
						P[c][i] += M(w, i, j) * Q[j*k+c]
					}
				}
			}
		}
		for c := range k {
			norm := 0.0
			for _, x := range P[c] {
				norm += x * x
			}
			norm = math.Sqrt(norm) + 1e-8
			for i := range P[c] {
				P[c][i] /= norm
			}
			for c2 := c + 1; c2 < k; c2++ {
				dot := 0.0
				for i := range rows {
					dot += P[c][i] * P[c2][i]
				}
				for i := range rows {
					P[c2][i] -= dot * P[c][i]
				}
			}
		}
		for j := range cols {
			for c := range k {
				s := 0.0
				for w := range n {
					for i := range rows {
						s += M(w, i, j) * P[c][i]
					}
				}
				Q[j*k+c] = s / float64(n)
			}
		}
		for i := range rows {
			for j := range cols {
				s := 0.0
				for c := range k {
					s += P[c][i] * Q[j*k+c]
				}
				out[tn.Offset+i*cols+j] = s
			}
		}
	}
	res = make([][]float64, n)
	for w := range n {
		res[w] = make([]float64, l.N)
		for _, tn := range l.Tensors {
			for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
				res[w][i] = float64(acc[w][i]) - out[i]
			}
		}
	}
	// The dense tensors' residual is 0, not acc − mean.
	for _, tn := range l.Tensors {
		if len(tn.Shape) == 1 || !refPSGDCompressed(tn, r) {
			for w := range n {
				for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
					res[w][i] = 0
				}
			}
		}
	}
	return out, res
}

// refPSGDCompressed reports whether refPowerSGD compresses tn.
func refPSGDCompressed(tn Tensor, r int) bool {
	rows := 0
	switch {
	case len(tn.Shape) >= 2:
		rows = tn.Shape[0]
	case len(tn.Shape) == 0:
		for d := 1; d*d <= tn.Size; d++ {
			if tn.Size%d == 0 {
				rows = d
			}
		}
	}
	if rows == 0 {
		return false
	}
	cols := tn.Size / rows
	k := min(r, rows, cols)
	return (rows+cols)*k*2 < rows*cols
}

// refPSGDStart is the shared start of Q the paper prescribes (the same
// standard normal draw on every worker), drawn as the run's seed defines
// it: per tensor index t, PCG(seed, t<<8|0x9c), cols×rank values.
func refPSGDStart(l Layout, r int, seed uint64) map[int][]float64 {
	q := map[int][]float64{}
	for t, tn := range l.Tensors {
		if !refPSGDCompressed(tn, r) {
			continue
		}
		rows := tn.Size
		if len(tn.Shape) >= 2 {
			rows = tn.Shape[0]
		} else {
			for d := 1; d*d <= tn.Size; d++ {
				if tn.Size%d == 0 {
					rows = d
				}
			}
		}
		cols := tn.Size / rows
		k := min(r, rows, cols)
		rng := rand.New(rand.NewPCG(seed, uint64(t)<<8|0x9c))
		v := make([]float64, cols*k)
		for i := range v {
			v[i] = float64(float32(rng.NormFloat64()))
		}
		q[t] = v
	}
	return q
}

func TestPowerSGDMatchesReference(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 5} {
		for _, rank := range []int{1, 2, 4} {
			for seed := range uint64(3) {
				rng := rand.New(rand.NewPCG(seed, 36))
				l := shapedLayout(t, rng)
				res := mustRunHarness(t, harnessConfig{Method: "powersgd", Workers: workers, Layout: l, Density: 0.01, Iters: 3, Seed: seed, Feedback: true, InPlace: seed%2 == 1,
					Options: func(o *Options) { o.Params = Values{"rank": rank} }})
				checkOutputsAgree(t, res)
				q := refPSGDStart(l, rank, seed)
				for it := range res.Acc {
					out, rres := refPowerSGD(l, res.Acc[it], rank, q)
					for _, tn := range l.Tensors {
						scale := 1e-30
						for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
							scale = max(scale, math.Abs(out[i]))
						}
						for w := range workers {
							for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
								if d := math.Abs(float64(res.Out[it][w][i]) - out[i]); d > 1e-4*scale {
									t.Fatalf("n=%d rank %d seed %d iteration %d worker %d tensor %v: out[%d] = %v, reference %v", workers, rank, seed, it, w, tn.Shape, i, res.Out[it][w][i], out[i])
								}
								if d := math.Abs(float64(res.Residual[it][w][i]) - rres[w][i]); d > 1e-4*(scale+math.Abs(float64(res.Acc[it][w][i]))) {
									t.Fatalf("n=%d rank %d seed %d iteration %d worker %d tensor %v: residual[%d] = %v, reference %v", workers, rank, seed, it, w, tn.Shape, i, res.Residual[it][w][i], rres[w][i])
								}
							}
						}
					}
				}
			}
		}
	}
}

// refMSTopkBands is MSTopk's binary search from the paper in float64: the
// elements surely selected (|x| >= thres1, at most k of them) and the band
// from which the rest is drawn (thres2 <= |x| < thres1).
func refMSTopkBands(x []float32, k int) (sure, band map[int]bool, thres1 float64) {
	a := make([]float64, len(x))
	mean, mx := 0.0, 0.0
	for i, v := range x {
		a[i] = math.Abs(float64(v))
		mean += a[i]
		mx = math.Max(mx, a[i])
	}
	mean /= float64(len(x))
	lo, hi := 0.0, 1.0
	best1, best2 := -1, len(x)+1
	t1, t2 := math.Inf(1), math.Inf(-1)
	for range 30 {
		ratio := (lo + hi) / 2
		t := mean + ratio*(mx-mean)
		c := 0
		for _, v := range a {
			if v >= t {
				c++
			}
		}
		if c <= k {
			hi = ratio
			if c > best1 && c > 0 {
				best1, t1 = c, t
			}
		} else {
			lo = ratio
			if c < best2 {
				best2, t2 = c, t
			}
		}
	}
	sure, band = map[int]bool{}, map[int]bool{}
	for i, v := range a {
		if v >= t1 {
			sure[i] = true
		} else if v >= t2 {
			band[i] = true
		}
	}
	if best1 < 0 {
		t1 = math.NaN()
	}
	return sure, band, t1
}

func TestMSTopkSelectionMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 35))
	for trial := range 300 {
		n := 1 + rng.IntN(300)
		x := make([]float32, n)
		gen := []harnessGen{genNormal, genSmallInts, genSparse}[trial%3]
		gen(rng, x)
		k := 1 + rng.IntN(n)
		if trial%4 == 0 {
			k = 1
		}
		r, v := &mstopk{}, newVecs(Options{})
		th, err := r.selectOn(&v, device.Host(x), n, k, uint64(trial))
		if err != nil {
			t.Fatal(err)
		}
		sel := r.sel
		sure, band, t1 := refMSTopkBands(x, k)
		if th != t1 && !(math.IsNaN(th) && math.IsNaN(t1)) {
			t.Fatalf("trial %d: N=%d k=%d: thres1 %v, reference %v", trial, n, k, th, t1)
		}
		if len(sel) != k {
			t.Fatalf("trial %d: N=%d k=%d: %d selected", trial, n, k, len(sel))
		}
		got := map[int]bool{}
		for i, j := range sel {
			if i > 0 && sel[i-1] >= j {
				t.Fatalf("trial %d: selection not ascending and distinct: %v", trial, sel)
			}
			got[int(j)] = true
			if !sure[int(j)] && !band[int(j)] {
				t.Fatalf("trial %d: N=%d k=%d: index %d (|x| = %v) is neither above thres1 nor in the band", trial, n, k, j, x[j])
			}
		}
		for i := range sure {
			if !got[i] {
				t.Fatalf("trial %d: N=%d k=%d: index %d above thres1 not selected", trial, n, k, i)
			}
		}
	}
}

// TestMSTopkExchange checks the exchange on 1, 2, 3, 5 and 16 workers:
// the union's values averaged, the rest kept in the residual, every
// worker's sure elements in the union.
func TestMSTopkExchange(t *testing.T) {
	for _, c := range standardCases() {
		res := mustRunHarness(t, harnessConfig{Method: "mstopk", Workers: c.Workers, N: c.N, Density: c.Density, Iters: 2, Seed: 11, Feedback: true})
		checkConservation(t, res)
		checkOutputsAgree(t, res)
		k := BudgetK(c.Density, c.N)
		for it := range res.Acc {
			inU := make([]bool, c.N)
			for i := range inU {
				inU[i] = res.Residual[it][0][i] == 0
			}
			for w := range c.Workers {
				sure, _, _ := refMSTopkBands(res.Acc[it][w], k)
				for i := range sure {
					if !inU[i] {
						t.Fatalf("%v iteration %d: worker %d's index %d above thres1 not sent", c, it, w, i)
					}
				}
				if st := res.Stats[it][w]; st.Selected != k {
					t.Fatalf("%v: worker %d selected %d, want %d", c, w, st.Selected, k)
				}
			}
			for i, u := range inU {
				want := 0.0
				for w := range c.Workers {
					want += float64(res.Acc[it][w][i])
				}
				want /= float64(c.Workers)
				if !u {
					want = 0
				}
				if d := math.Abs(float64(res.Out[it][0][i]) - want); d > 1e-5*(1+math.Abs(want)) {
					t.Fatalf("%v iteration %d: out[%d] = %v, want %v", c, it, i, res.Out[it][0][i], want)
				}
			}
		}
	}
}

// TestFP16MatchesReference: DDP's fp16_compress_hook written out: every
// worker's acc cast to half, divided by n (in float32, rounded to half),
// the halves summed in half precision in the canonical order (chunk c of
// comm.ChunkBounds added in rank order c+1, …, n−1, 0, …, c), cast back;
// bit-identical, residual 0, the bytes those of a ring all-reduce of 2-byte
// elements.
func TestFP16MatchesReference(t *testing.T) {
	for _, c := range standardCases() {
		if c.Density != 0.05 {
			continue
		}
		for _, gen := range []harnessGen{genNormal, genSmallInts} {
			res := mustRunHarness(t, harnessConfig{Method: "fp16", Workers: c.Workers, N: c.N, Density: c.Density, Iters: 2, Seed: 5, Gen: gen, Feedback: true})
			n := c.Workers
			for it := range res.Acc {
				want := make([]uint16, c.N)
				for ch := range n {
					lo, hi := comm.ChunkBounds(c.N, n, ch)
					for i := lo; i < hi; i++ {
						var s uint16
						for k := 1; k <= n; k++ {
							w := (ch + k) % n
							x := device.ToFloat16(device.FromFloat16(device.ToFloat16(res.Acc[it][w][i])) / float32(n))
							if k == 1 {
								s = x
							} else {
								s = device.AddFloat16(s, x) // the correctly rounded half sum (tested in device)
							}
						}
						want[i] = s
					}
				}
				for w := range n {
					for i := range want {
						if g := res.Out[it][w][i]; math.Float32bits(g) != math.Float32bits(device.FromFloat16(want[i])) {
							t.Fatalf("%v iteration %d worker %d: out[%d] = %v, reference %v", c, it, w, i, g, device.FromFloat16(want[i]))
						}
						if res.Residual[it][w][i] != 0 {
							t.Fatalf("%v: residual[%d] = %v, want 0", c, i, res.Residual[it][w][i])
						}
					}
					sent, recv := expectTraffic(n, w, []harnessCall{{Op: comm.OpAllReduce, Elems: c.N, ESize: 2}})
					if st := res.Stats[it][w]; st.BytesSent != sent || st.BytesRecv != recv {
						t.Fatalf("%v worker %d: bytes %d/%d, want %d/%d", c, w, st.BytesSent, st.BytesRecv, sent, recv)
					}
				}
			}
		}
	}
}

// TestMinCompressSize: with min_compress_size M, the tensors below M
// elements come out as their plain average (residual 0) and the others
// exactly as the method gives them on a layout of those tensors alone;
// the bytes are the method's plus one all-reduce of the small tensors.
func TestMinCompressSize(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 35))
	l := shapedLayout(t, rng)
	const M = 30
	var big []layout.Tensor
	small := 0
	for _, tn := range l.Tensors {
		if tn.Size >= M {
			tn.Offset = 0
			big = append(big, tn)
		} else {
			small += tn.Size
		}
	}
	if len(big) == 0 || small == 0 {
		t.Fatalf("layout %v has no tensors on one side of %d", l, M)
	}
	bl, err := layout.Of(big)
	if err != nil {
		t.Fatal(err)
	}
	for _, method := range []string{"topk", "deft", "randomk", "efsignsgd", "powersgd", "fp16", "mstopk", "micro"} {
		for _, workers := range []int{1, 2, 3, 5} {
			name := fmt.Sprintf("%s/n=%d", method, workers)
			res := mustRunHarness(t, harnessConfig{Method: method, Workers: workers, Layout: l, Density: 0.1, Iters: 3, Seed: 9, Feedback: true,
				Options: func(o *Options) { o.Params = Values{minCompressName: M} }})
			// The reference: the same accs, cut in two.
			ref := mustRunHarness(t, harnessConfig{Method: method, Workers: workers, Layout: bl, Density: 0.1, Iters: 3, Seed: 9,
				Fill: func(it, rank int, x []float32) {
					j := 0
					for _, tn := range l.Tensors {
						if tn.Size >= M {
							j += copy(x[j:], res.Acc[it][rank][tn.Offset:tn.Offset+tn.Size])
						}
					}
				}})
			for it := range res.Acc {
				for w := range workers {
					j := 0
					for _, tn := range l.Tensors {
						for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
							got, gotRes := res.Out[it][w][i], res.Residual[it][w][i]
							var want, wantRes float32
							if tn.Size >= M {
								want, wantRes = ref.Out[it][w][j], ref.Residual[it][w][j]
								j++
							} else {
								var s float32
								for p := range workers {
									s += res.Acc[it][(i%workers+1+p)%workers][i] // any order: compared with a tolerance
								}
								want = s / float32(workers)
								if d := math.Abs(float64(got - want)); d <= 1e-5*(1+math.Abs(float64(want))) {
									want = got
								}
							}
							if math.Float32bits(got) != math.Float32bits(want) || math.Float32bits(gotRes) != math.Float32bits(wantRes) {
								t.Fatalf("%s iteration %d worker %d: element %d of %s (size %d): out %v residual %v, want %v %v", name, it, w, i, tn.Name, tn.Size, got, gotRes, want, wantRes)
							}
						}
					}
					st, rs := res.Stats[it][w], ref.Stats[it][w]
					sent, recv := expectTraffic(workers, w, []harnessCall{{Op: comm.OpAllReduce, Elems: small, ESize: 4}})
					if st.BytesSent != rs.BytesSent+sent || st.BytesRecv != rs.BytesRecv+recv {
						t.Fatalf("%s worker %d: bytes %d/%d, want the method's %d/%d plus the small tensors' %d/%d", name, w, st.BytesSent, st.BytesRecv, rs.BytesSent, rs.BytesRecv, sent, recv)
					}
					if st.Selected != rs.Selected+small {
						t.Fatalf("%s worker %d: selected %d, want %d + %d", name, w, st.Selected, rs.Selected, small)
					}
				}
			}
		}
	}
	// A method that reduces groups of its own refuses a cut-off that cuts.
	if _, err := runHarness(t, harnessConfig{Method: "lags", Workers: 1, Layout: l, Density: 0.1, Options: func(o *Options) { o.Params = Values{minCompressName: M} }}); err == nil || !strings.Contains(err.Error(), minCompressName) {
		t.Fatalf("lags with %s: err %v, want a refusal naming the option", minCompressName, err)
	}
}
