package sparsify

import (
	"context"
	"math"

	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "mstopk", Projectable: true, New: newMSTopk, Advice: mstopkAdvice,
		Doc: "reference notes 11.3: MSTopk (Shi et al., 2021), DRAGONN's approximate Top-k baseline: the threshold found by 30 rounds of binary search between the mean and the maximum magnitude, counting the elements above each candidate (no sort); the k1 <= k elements above the best threshold not exceeding k, the rest drawn at random from those between it and the lowest threshold above k; then exchanged as topk (index lists all-gathered, the union all-reduced). Deviations: the random draw is seeded by the run's seed, the rank and the call's search (the reference draws with torch.randperm); when no candidate threshold leaves at most k elements, all k are drawn from those above the lowest one tried; computed on the host (a GPU's acc is copied there)."})
}

// mstopkRounds is N, the rounds of MSTopk's binary search.
const mstopkRounds = 30

// mstopk is "mstopk", MSTopk's selection (Shi, Zhou, Wang, Tang, Zhao,
// Chu, Li, "Towards scalable distributed training of deep learning on
// public cloud clusters", MLSys 2021, Algorithm 2) with topk's exchange:
//
//   - a = |acc|, mean and max of a (mean summed in float64); for N = 30
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
	b        *Env
	h        hostVecs
	sel, tmp []int32
	cand     []int32
}

func newMSTopk(e *Env) (Core, error) { return &mstopk{b: e}, nil }

// Reduce selects with MSTopk and exchanges as topk.
func (r *mstopk) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	if err := b.hostIn(&r.h, acc, out, residual); err != nil {
		return err
	}
	dsel, err := v.scratch(&b.dSel, device.Int32, b.k)
	if err != nil {
		return err
	}
	var thres1 float64
	selTime, err := b.timed(func() error {
		seed := sampMix(b.o.Seed ^ sampMix(uint64(b.c.Rank())^0x3570))
		r.sel, r.cand, r.tmp, thres1 = mstopkSelect(r.sel, r.cand, r.tmp, r.h.acc, b.k, seed)
		return v.upload(dsel, r.sel)
	})
	if err != nil {
		return err
	}
	if err := b.reduceSelected(ctx, acc, out, residual, dsel.Slice(0, len(r.sel)), st); err != nil {
		return err
	}
	st.SelectTime = selTime
	st.Threshold = thres1
	return nil
}

// mstopkSelect returns MSTopk's k indices of x, ascending, in sel (cand
// and tmp are scratch), and thres1 (NaN when none).
func mstopkSelect(sel, cand, tmp []int32, x []float32, k int, seed uint64) ([]int32, []int32, []int32, float64) {
	sel, cand = sel[:0], cand[:0]
	if len(x) == 0 || k <= 0 {
		return sel, cand, tmp, math.NaN()
	}
	var sum, mx float64
	for _, v := range x {
		a := math.Abs(float64(v))
		sum += a
		mx = max(mx, a)
	}
	mean := sum / float64(len(x))
	l, r := 0.0, 1.0
	k1, k2 := 0, len(x)+1
	thres1, thres2 := math.Inf(1), math.Inf(-1)
	for range mstopkRounds {
		ratio := l + (r-l)/2
		t := mean + ratio*(mx-mean)
		nnz := 0
		for _, v := range x {
			if math.Abs(float64(v)) >= t {
				nnz++
			}
		}
		if nnz <= k {
			r = ratio
			if nnz > k1 {
				k1, thres1 = nnz, t
			}
		} else {
			l = ratio
			if nnz < k2 {
				k2, thres2 = nnz, t
			}
		}
	}
	for i, v := range x {
		a := math.Abs(float64(v))
		if a >= thres1 {
			sel = append(sel, int32(i))
		} else if a >= thres2 {
			cand = append(cand, int32(i))
		}
	}
	// The draw's seed: the run's and the rank's (seed), and this call's
	// search, so that it changes from call to call and needs no state.
	tmp = RandomK(tmp, len(cand), k-len(sel), sampMix(seed^math.Float64bits(thres2)^uint64(k1)<<40))
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
