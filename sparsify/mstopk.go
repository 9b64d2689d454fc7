package sparsify

import (
	"context"
	_ "embed"
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "mstopk", Projectable: true, New: newMSTopk, Advice: mstopkAdvice, Kernels: []*device.Kernel{mstopkKernel, mstopkInitKernel, mstopkCountKernel, mstopkFinalKernel, mstopkClassKernel, mstopkDrawKernel, mstopkWriteKernel},
		Doc: "reference notes 11.3: MSTopk (Shi et al., 2021), DRAGONN's approximate Top-k baseline: the threshold found by 30 rounds of binary search between the mean and the maximum magnitude, counting the elements above each candidate (no sort); the k1 <= k elements above the best threshold not exceeding k, the rest drawn at random from those between it and the lowest threshold above k; then exchanged as topk (index lists all-gathered, the union all-reduced). Deviations: the random draw is seeded by the run's seed, the rank and the call's search (the reference draws with torch.randperm); when no candidate threshold leaves at most k elements, all k are drawn from those above the lowest one tried; the mean summed in float64 by blocks of 4096 elements. On a GPU the whole selection runs there, the same bits (block statistics, one count per round with the round's decision made on the device, the candidates selected and the draw made by one device thread with the CPU's generator): only the selection's count and thres1 come back."})
}

// mstopkRounds is N, the rounds of MSTopk's binary search.
const mstopkRounds = 30

// mstopk is "mstopk", MSTopk's selection (Shi, Zhou, Wang, Tang, Zhao,
// Chu, Li, "Towards scalable distributed training of deep learning on
// public cloud clusters", MLSys 2021, Algorithm 2) with topk's exchange:
//
//   - a = |acc|, mean and max of a (mean summed in float64 by blocks of mstopkBlock); for N = 30
//     rounds, ratio = the middle of [l, r] (initially [0, 1]), thres =
//     mean + ratio·(max − mean), nnz = #{a >= thres}: nnz <= k moves r
//     down to ratio and, if nnz is the largest such count yet (k1), keeps
//     thres1 = thres; nnz > k moves l up and, if nnz is the smallest such
//     count yet (k2), keeps thres2 = thres (thresholds in float64);
//   - the selection is the k1 elements with a >= thres1 (none when no
//     round left at most k) and k − k1 drawn uniformly (RandomK, seeded by
//     Options.Seed, the rank, thres2 and k1: no state) from the others with a >=
//     thres2 (every other element when no round left more than k);
//   - then as topk: every worker's index list all-gathered, the union's
//     values all-reduced, out = sum·(1/n) there and 0 elsewhere, residual =
//     acc with the union zeroed.
//
// It conserves the gradient. Stats: Selected = k, Threshold = thres1 (NaN
// when no round left at most k).
type mstopk struct {
	b            *Env
	sel, tmp     []int32
	cand, list   []int32
	vals         []float32
	part         []float64
	dPart, dList device.Buffer
	dVals        device.Buffer
	// selectDevice's: the search's state (Float64, mstopkStateWords), the
	// rounds' counters and the list's count (Int32), thres2 as a float32,
	// the chunks' counts and offsets, the draw's bits by candidate rank.
	dState, dInts, dThr device.Buffer
	dChunks, dBits      device.Buffer
	hdr                 [2]float64 // thres1 and the count, read back
	segs                [1][2]int  // the one segment [0, n) of SelectAboveSegments
}

func newMSTopk(e *Env) (Core, error) { return &mstopk{b: e}, nil }

// Reduce selects with MSTopk, on the host (selectOn) on the CPU and
// without it (selectDevice) on a GPU, and exchanges as topk.
func (r *mstopk) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	dsel, err := v.scratch(&b.dSel, device.Int32, b.k)
	if err != nil {
		return err
	}
	seed := sampMix(b.o.Seed ^ sampMix(uint64(b.c.Rank())^0x3570))
	thres1, m := math.NaN(), 0
	selTime, err := b.selectTimed(func() error {
		if v.onCPU() {
			var err error
			if thres1, err = r.selectOn(v, acc, b.n, b.k, seed); err != nil {
				return err
			}
			m = len(r.sel)
			return v.upload(dsel, r.sel)
		}
		return r.selectDevice(v, acc, dsel, b.n, b.k, seed)
	})
	if err != nil {
		return err
	}
	if !v.onCPU() && b.n > 0 && b.k > 0 {
		// The selection's count and thres1, in one wait.
		if err := v.s.Copy(device.Host(r.hdr[:]), r.dState.Slice(mstopkThres1Word, mstopkThres1Word+2)); err != nil {
			return err
		}
		if err := v.s.Synchronize(); err != nil {
			return err
		}
		thres1, m = r.hdr[0], int(r.hdr[1])
		if m > b.k {
			return fmt.Errorf("mstopk: %d elements selected, more than k = %d: more than k elements of the gradient are ±Inf (check the loss and the learning rate)", m, b.k)
		}
	}
	if err := b.reduceSelected(ctx, acc, out, residual, dsel.Slice(0, m), st); err != nil {
		return err
	}
	st.SelectTime = selTime
	st.Threshold = thres1
	return nil
}

// selectOn is MSTopk's selection of k of the n elements of acc, on the
// device of v: the mean and maximum of |acc| by blocks (mstopkKernel, read
// back), each round's count a CountAbove, then the elements at or above
// thres2 (SelectAbove, read back: about k of them) split and drawn from on
// the host (mstopkDraw). It leaves the indices, ascending, in r.sel and
// returns thres1 (NaN when none). Reduce uses it on the CPU; a GPU selects
// the same indices with selectDevice, without the host.
func (r *mstopk) selectOn(v *vecs, acc device.Buffer, n, k int, seed uint64) (float64, error) {
	r.sel = r.sel[:0]
	if n == 0 || k <= 0 {
		return math.NaN(), nil
	}
	nb := mstopkBlocks(n)
	dp, err := v.scratch(&r.dPart, device.Float64, 2*nb)
	if err != nil {
		return 0, err
	}
	if err := v.ops.Run(v.s, mstopkKernel, nb, acc, dp, int64(nb), int64(n)); err != nil {
		return 0, err
	}
	r.part = grow(r.part, 2*nb)
	if err := v.s.Copy(device.Host(r.part), dp); err != nil {
		return 0, err
	}
	if err := v.s.Synchronize(); err != nil {
		return 0, err
	}
	mean, mx := mstopkStats(r.part, n)
	var countErr error
	k1, t1, t2, k2 := mstopkSearch(mean, mx, n, k, func(t float64) int {
		c, err := v.ops.CountAbove(v.s, acc, atLeast32(t))
		if err != nil && countErr == nil {
			countErr = err
		}
		return c
	})
	if countErr != nil {
		return 0, countErr
	}
	// The elements at or above thres2: k2 of them (every one not NaN
	// when no round left more than k).
	if math.IsInf(t2, -1) {
		if k2, err = v.ops.CountAbove(v.s, acc, float32(math.Inf(-1))); err != nil {
			return 0, err
		}
	}
	li, err := v.scratch(&r.dList, device.Int32, k2)
	if err != nil {
		return 0, err
	}
	lv, err := v.scratch(&r.dVals, device.Float32, k2)
	if err != nil {
		return 0, err
	}
	m, err := v.ops.SelectAbove(v.s, li, lv, acc, atLeast32(t2))
	if err != nil {
		return 0, err
	}
	r.list, r.vals = grow(r.list, m), grow(r.vals, m)
	if err := v.s.Copy(device.Host(r.vals), lv.Slice(0, m)); err != nil {
		return 0, err
	}
	if err := v.download(r.list, li); err != nil {
		return 0, err
	}
	var thres1 float64
	r.sel, r.cand, r.tmp, thres1 = mstopkDraw(r.sel, r.cand, r.tmp, r.list, r.vals, k, k1, t1, t2, seed)
	return thres1, nil
}

// atLeast32 is the smallest float32 >= t: for a float32 a, a >= t exactly
// when a >= atLeast32(t).
func atLeast32(t float64) float32 {
	f := float32(t)
	if float64(f) < t {
		f = math.Nextafter32(f, float32(math.Inf(1)))
	}
	return f
}

// mstopkBlock is the elements of a block of MSTopk's sum of |x|.
const mstopkBlock = 4096

func mstopkBlocks(n int) int { return (n + mstopkBlock - 1) / mstopkBlock }

//go:embed mstopk.cu
var mstopkCUDA string

// mstopkKernel is MSTopk's statistics by blocks (mstopk.cu's k_mstopk;
// arguments x, part (Float64, two per block), the blocks n and the
// elements d as int64): part[2b] = Σ|x| over block b in float64, in index
// order, part[2b+1] = its largest |x| (NaN where one is NaN).
var mstopkKernel = &device.Kernel{Name: "k_mstopk", CUDA: mstopkCUDA, Host: func(n int, a ...any) {
	x, part, d := a[0].(device.Buffer).Float32s(), a[1].(device.Buffer).Float64s(), int(a[3].(int64))
	mstopkBlockStats(part, x[:d], n)
}}

// mstopkBlockStats writes the sum and the maximum of |x| of each of the
// first nb blocks into part.
func mstopkBlockStats(part []float64, x []float32, nb int) {
	for b := range nb {
		var s, m float64
		for _, v := range x[b*mstopkBlock : min((b+1)*mstopkBlock, len(x))] {
			a := math.Abs(float64(v))
			s += a
			m = max(m, a)
		}
		part[2*b], part[2*b+1] = s, m
	}
}

// mstopkStats returns the mean and the maximum of |x| from its blocks'
// statistics (the sums added in block order).
func mstopkStats(part []float64, n int) (mean, mx float64) {
	var sum float64
	for b := 0; b < len(part); b += 2 {
		sum += part[b]
		mx = max(mx, part[b+1])
	}
	return sum / float64(n), mx
}

// mstopkSearch is the binary search: N rounds between mean and mx over
// n elements, count(t) the elements with |x| >= t. It returns k1 and
// thres1 (the largest count at most k and its threshold; 0 and +Inf when
// none) and thres2 and k2 (the smallest count above k and its threshold;
// −Inf and n+1 when none).
func mstopkSearch(mean, mx float64, n, k int, count func(t float64) int) (k1 int, thres1, thres2 float64, k2 int) {
	s := mstopkStart(n)
	for range mstopkRounds {
		s = s.next(mean, mx, count(s.threshold(mean, mx)), k)
	}
	return int(s.k1), s.thres1, s.thres2, int(s.k2)
}

// mstopkState is the search's state before a round: the ratios' interval
// [l, r], the largest count at most k and its threshold (k1, thres1), the
// smallest count above k and its threshold (k2, thres2). On a device it
// is 6 words of mstopk.cu's st, in this order: l, r, k1, thres1, k2, thres2.
type mstopkState struct {
	l, r, k1, thres1, k2, thres2 float64
}

// mstopkStart is the state before the first round over n elements.
func mstopkStart(n int) mstopkState {
	return mstopkState{r: 1, k2: float64(n + 1), thres1: math.Inf(1), thres2: math.Inf(-1)}
}

// threshold is the round's threshold mean + ratio·(mx − mean), ratio the
// middle of [l, r] (the product rounded before the sum, as mstopk.cu
// computes it).
func (s mstopkState) threshold(mean, mx float64) float64 {
	ratio := s.l + (s.r-s.l)/2
	return mean + float64(ratio*(mx-mean))
}

// next is the state after the round counted nnz elements at or above its
// threshold.
func (s mstopkState) next(mean, mx float64, nnz, k int) mstopkState {
	ratio, t, c := s.l+(s.r-s.l)/2, s.threshold(mean, mx), float64(nnz)
	if nnz <= k {
		s.r = ratio
		if c > s.k1 {
			s.k1, s.thres1 = c, t
		}
	} else {
		s.l = ratio
		if c < s.k2 {
			s.k2, s.thres2 = c, t
		}
	}
	return s
}

// mstopkDrawSeed is the draw's seed: the run's and the rank's (seed), and
// the call's search, so that it changes from call to call and needs no
// state.
func mstopkDrawSeed(seed uint64, thres2 float64, k1 int) uint64 {
	return sampMix(seed ^ math.Float64bits(thres2) ^ uint64(k1)<<40)
}

// mstopkDraw splits list (the indices, ascending, of the elements vals
// with |x| >= thres2) into those at or above thres1, all selected, and the
// candidates, of which k − k1 are drawn at random; it returns the
// selection, ascending, and thres1 (NaN when k1 is 0).
func mstopkDraw(sel, cand, tmp, list []int32, vals []float32, k, k1 int, thres1, thres2 float64, seed uint64) ([]int32, []int32, []int32, float64) {
	sel, cand = sel[:0], cand[:0]
	for j, i := range list {
		a := math.Abs(float64(vals[j]))
		if a >= thres1 {
			sel = append(sel, i)
		} else if a >= thres2 {
			cand = append(cand, i)
		}
	}
	tmp = RandomK(tmp, len(cand), k-len(sel), mstopkDrawSeed(seed, thres2, k1))
	n1 := len(sel)
	for _, j := range tmp {
		sel = append(sel, cand[j])
	}
	mergeSorted(sel, n1)
	if k1 == 0 {
		thres1 = math.NaN()
	}
	return sel, cand, tmp, thres1
}

// mergeSorted sorts s, whose [0, m) and [m, len) are each ascending, in
// place.
func mergeSorted(s []int32, m int) {
	a := append([]int32(nil), s[:m]...)
	i, j, o := 0, m, 0
	for i < len(a) && j < len(s) {
		if a[i] <= s[j] {
			s[o] = a[i]
			i++
		} else {
			s[o] = s[j]
			j++
		}
		o++
	}
	for i < len(a) {
		s[o] = a[i]
		i++
		o++
	}
}

// mstopkAdvice: as topk (k indices per worker all-gathered, the union
// all-reduced); its selection is N = 30 counting passes.
var mstopkAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		return unionCalls(float64(s.K), s), nil
	},
	Volume:    topkVolume,
	Selection: SelectsWhole,
	Caveats: func(c Conditions) []string {
		return append(buildUp(c), "MSTopk's k − k1 elements drawn at random below the threshold overlap less across workers than exact top-k's, so the union may be larger than predicted")
	},
	Evidence: Evidence{Shown: []ModelKind{CNN},
		Papers:  "Shi et al. 2021: MSTopk-SGD reaches the accuracy of dense SGD on ResNet-50 and VGG-16 (ImageNet, CIFAR-10) at ρ = 0.001 on 32 cloud GPUs; DRAGONN's evaluation uses it as its approximate Top-k baseline",
		Warning: "approximate: part of each selection is random below the threshold; no paper here shows it on RNNs, Transformers or recommenders"},
}
