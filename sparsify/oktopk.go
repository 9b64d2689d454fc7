package sparsify

import (
	"context"
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/options"
)

func init() {
	Register(Method{Name: "oktopk", NotProjectable: "every worker sends one message to every other worker, so the number of messages grows with the worker count", New: newOkTopk, Advice: okTopkAdvice, DenseWarmup: true,
		Doc:    "reference notes 7.8: Ok-Topk: local threshold exact every 32 sparse calls and otherwise reused and raised, regions re-balanced every 64, owners sum, global threshold exact every 32 and otherwise adapted, residual zeroed only where sent and globally selected; dense warm-up (option dense_warmup, default 512). Deviations (fixes): the schedule counts from the end of the warm-up (the same for the reference's 512); boundary proposals summed as int64 (the reference's int32 overflows once P·N > 2^31); a worker with nothing selected proposes the equal split and an empty global candidate set keeps the global threshold (the reference crashes on both); indices travel as int32, not as float32; layout order as for topkdsa.",
		Params: []options.Option{DenseWarmupParam(okDefaultWarmup)}})
}

// Constants of Ok-Topk's schedule and threshold controllers
// (Shigangli/Ok-Topk, VGG/allreducer.py and VGG/compression.py).
const (
	okLocalRecompute  = 32    // the local threshold is exact every 32 sparse calls
	okGlobalRecompute = 32    // so is the global threshold
	okRepartition     = 64    // the regions are re-balanced every 64 sparse calls
	okRaise           = 1.03  // factor of the reused local threshold while too many are selected
	okMaxRaises       = 5     // at most this many raises per call
	okLocalScale      = 1.012 // local threshold controller
	okGlobalScale     = 1.008 // global threshold controller
)

// okTopkReducer is "oktopk", Ok-Topk (Li and Hoefler, PPoPP'22; the
// reference code Shigangli/Ok-Topk, VGG/allreducer.py branch 'oktopk' with
// the GaussianCompressor helpers of VGG/compression.py; reference notes 7.8),
// on the whole flat vector as one group:
//
//   - Dense warm-up: the first dense_warmup calls (option dense_warmup,
//     default 512, the reference's; 0: none) are a dense all-reduce, out = Σ_w acc_w / P and
//     residual = 0. The periodic schedule below counts the sparse calls
//     s = 0, 1, … after the warm-up.
//   - k = BudgetK(ρ, N). Local threshold: when s mod 32 = 0 it is the exact
//     k-th largest |acc|; otherwise the previous call's threshold is reused
//     and multiplied by 1.03 while more than ⌊4k/3⌋ elements have |acc| >
//     threshold, at most 5 times. The local selection L is every index with
//     |acc| > threshold (strict), the threshold compared as a float32.
//   - Regions: every P−1 region boundaries are re-balanced when s mod 64 = 0:
//     each worker proposes the indices at positions ⌊|L|/P⌋·i (i = 1…P−1)
//     of its ascending L, the proposals are summed over the workers
//     (all-reduce) and divided by P (floor), so each region holds about an
//     equal share of the selected indices. Region j is owned by rank j.
//   - After the regions are used, the local threshold is divided by 1.012 if
//     |L| < 2k/3 and multiplied by 1.012 if |L| > 5k/4.
//   - Every worker sends its pairs of L in region j to rank j, which sums
//     them (the region exchange of okRegions.scatterReduce: counts all-to-all,
//     then point-to-point in groups of 4 destinations).
//   - Global selection: when s mod 32 = 0, every owner all-gathers all the
//     non-zero sums of its region; the global set G is the top-k by magnitude
//     of all gathered pairs (ties to lower indices) and the global threshold
//     becomes the k-th largest gathered magnitude. Otherwise every owner
//     all-gathers its sums with |sum| > global threshold (strict, as float32),
//     G is all of them, and the global threshold is divided by 1.008 if |G| <
//     2k/3 and multiplied by 1.008 if |G| > 4k/3.
//   - out = sum/P on G (a division, as the reference), 0 elsewhere.
//   - residual = acc with the indices in L ∩ G zeroed (the reference keeps the
//     whole acc as residual and zeroes only what was both sent and globally
//     selected).
//
// Wire: the region exchange sends int32 counts, int32 region-relative
// indices and float32 values; the re-balancing all-reduces P−1 int64; the
// final exchange is an AllGather of one int32 count per owner and one
// AllGatherV of each owner's int32 region-relative indices followed by its
// float32 values (one message, as in the reference).
//
// Deliberate deviations from the reference, each a fix or a generalisation:
//
//   - The final all-gather packs the indices as float32 values into the
//     value buffer in the reference, which is exact only below 2^24; here
//     the message is the same one AllGatherV of 32-bit words per owner, its
//     indices as int32 bits followed by its values.
//   - The boundary proposals are summed as int64: the reference's int32 sum
//     overflows once P·N exceeds 2^31 (e.g. 256 workers on ResNet-18).
//   - A worker with an empty L proposes the equal split i·⌊N/P⌋ (the
//     reference indexes an empty array and crashes).
//   - When no owner has a non-zero sum at a recompute call, G is empty and
//     the global threshold is kept (the reference crashes taking the top-0).
//   - The schedule counts sparse calls from the end of the warm-up; with the
//     reference's 512 warm-up calls (a multiple of 64) this is its schedule.
//     (The reference counts all calls, so a warm-up that is not a multiple
//     of 64 would start with unset regions and crash.)
//   - The reference concatenates the parameters in reverse order; here the
//     regions cut the flat vector in layout order, which changes only which
//     elements share a region. Top-k ties go to lower indices; k is at least
//     1 (BudgetK) also in the controllers' bands.
//
// It conserves the gradient: Σ_w residual_w + P·out = Σ_w acc_w up to float32
// rounding (an index of G gets every sender's value in out and none back in
// its residual; every other index stays in every residual).
//
// Stats: Threshold = this call's local threshold (as float32), Selected =
// |L|, SelectedPerWorker = the number of pairs each owner all-gathered,
// ActualDensity = the number of pairs all-gathered / N (at a recompute call
// this is every non-zero sum, of which only the top k enter out), LayerK nil.
// During the warm-up: ActualDensity 1, Selected N, Threshold NaN.
type okTopkReducer struct {
	b      *Env
	warmup int
	reg    okRegions
	lthr   float64 // local threshold (the reference's Python float)
	gthr   float64 // global threshold
	bounds []int64

	sel, gsel, pick, set, inter, prop device.Buffer // Int32
	gval, vals                        device.Buffer // Float32
	dBounds                           device.Buffer // Int64
	dn                                denseScratch
}

func newOkTopk(e *Env) (Core, error) {
	r := &okTopkReducer{b: e, warmup: e.o.Params.Int("dense_warmup")}
	r.reg = newOkRegions(e)
	return r, nil
}

// raiseThreshold is Ok-Topk's reuse of the previous local threshold thr:
// multiplied by 1.03 while more than ⌊4k/3⌋ elements of acc have |acc| > thr
// (compared as float32), at most okMaxRaises times.
func (r *okTopkReducer) raiseThreshold(acc device.Buffer, thr float64, k int) (float64, error) {
	v := &r.b.v
	limit := 4 * k / 3
	for range okMaxRaises {
		n, err := v.ops.CountAbove(v.s, acc, okAbove(float32(thr)))
		if err != nil {
			return 0, err
		}
		if n <= limit {
			break
		}
		thr *= okRaise
	}
	return thr, nil
}

// Reduce runs one Ok-Topk iteration after the warm-up (see
// okTopkReducer).
func (r *okTopkReducer) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	s := b.calls - r.warmup
	k := b.k
	sel, err := v.scratch(&r.sel, device.Int32, b.n)
	if err != nil {
		return err
	}

	// Local threshold and selection L.
	var thr float32
	nsel := 0
	selTime, err := b.selectTimed(func() error {
		if s%okLocalRecompute == 0 {
			t, err := v.ops.KthLargestAbs(v.s, acc, k)
			if err != nil {
				return err
			}
			r.lthr = float64(t)
		} else {
			var err error
			if r.lthr, err = r.raiseThreshold(acc, r.lthr, k); err != nil {
				return err
			}
		}
		thr = float32(r.lthr)
		var err error
		nsel, err = v.ops.SelectAbove(v.s, sel, device.Buffer{}, acc, okAbove(thr))
		return err
	})
	if err != nil {
		return err
	}
	sel = sel.Slice(0, nsel)

	if s%okRepartition == 0 {
		if err := r.rebalance(ctx, sel); err != nil {
			return fmt.Errorf("re-balancing the regions: %w", err)
		}
	}
	if nl := float64(nsel); nl < 2*float64(k)/3 {
		r.lthr /= okLocalScale
	} else if nl > 5*float64(k)/4 {
		r.lthr *= okLocalScale
	}

	if err := r.reg.scatterReduce(ctx, acc, sel); err != nil {
		return err
	}

	// Global selection.
	recompute := s%okGlobalRecompute == 0
	red := r.reg.reduced
	m := 0
	t1, err := b.selectTimed(func() error {
		t := okAbove(0)
		if !recompute {
			t = okAbove(float32(r.gthr))
		}
		var err error
		m, err = v.compactAbove(&r.gsel, &r.gval, red, t)
		return err
	})
	if err != nil {
		return err
	}
	selTime += t1
	total, err := r.reg.gatherCounts(ctx, m)
	if err == nil {
		err = r.reg.gatherPairs(ctx, r.gsel.Slice(0, m), r.gval.Slice(0, m), total)
	}
	if err != nil {
		return err
	}
	allIdx, allVal := r.reg.allIdx.Slice(0, total), r.reg.allVal.Slice(0, total)
	if err := v.m.Fill(v.s, out, 0); err != nil {
		return err
	}
	var set device.Buffer
	if recompute {
		t2, err := b.selectTimed(func() error {
			kk := min(total, k)
			pick, err := v.bounded(&r.pick, device.Int32, kk, k)
			if err != nil {
				return err
			}
			if set, err = v.bounded(&r.set, device.Int32, kk, k); err != nil {
				return err
			}
			vals, err := v.bounded(&r.vals, device.Float32, kk, k)
			if err != nil {
				return err
			}
			if kk > 0 {
				if _, err := v.ops.TopK(v.s, pick, vals, allVal, kk); err != nil {
					return err
				}
				g, err := v.ops.KthLargestAbs(v.s, vals, kk) // the smallest kept magnitude
				if err != nil {
					return err
				}
				r.gthr = float64(g)
			}
			if err := v.ops.GatherIndex(v.s, set, allIdx, pick); err != nil {
				return err
			}
			return v.ops.Scatter(v.s, out, set, vals, 1)
		})
		if err != nil {
			return err
		}
		selTime += t2
	} else {
		if err := v.ops.Scatter(v.s, out, allIdx, allVal, 1); err != nil {
			return err
		}
		set = allIdx
		if g := float64(total); g < 2*float64(k)/3 {
			r.gthr /= okGlobalScale
		} else if g > 4*float64(k)/3 {
			r.gthr *= okGlobalScale
		}
	}
	if err := v.ops.Div(v.s, out, float32(b.c.Size())); err != nil {
		return err
	}

	// residual = acc with L ∩ G zeroed.
	inter, err := v.bounded(&r.inter, device.Int32, nsel, b.n)
	if err != nil {
		return err
	}
	ni, err := v.intersectOn(&r.dn, b.n, set, sel, inter)
	if err != nil {
		return err
	}
	if err := b.residualWithout(residual, acc, inter.Slice(0, ni)); err != nil {
		return err
	}

	st.SelectTime = selTime
	st.Threshold = float64(thr)
	st.Selected = nsel
	st.SelectedPerWorker = append([]int(nil), r.reg.counts...)
	st.Distinct = total
	return nil
}

// SaveState writes the call count (the warm-up's and the recompute
// schedule's), the local and global thresholds and the region boundaries.
func (r *okTopkReducer) SaveState(w *StateWriter) error {
	w.Int(r.b.calls)
	w.Float(r.lthr)
	w.Float(r.gthr)
	w.Ints(r.reg.offs)
	return nil
}

// LoadState reads them back.
func (r *okTopkReducer) LoadState(d *StateReader) error {
	it := d.Int("call count", 0, maxCount)
	lthr := d.Float("local threshold")
	gthr := d.Float("global threshold")
	offs := d.Ints("region boundaries", len(r.reg.offs), 0, r.reg.n)
	if err := d.Done(); err != nil {
		return err
	}
	if offs[0] != 0 || offs[len(offs)-1] != r.reg.n {
		return fmt.Errorf("state: regions span [%d, %d), not the %d elements", offs[0], offs[len(offs)-1], r.reg.n)
	}
	for i := 1; i < len(offs); i++ {
		if offs[i] < offs[i-1] {
			return fmt.Errorf("state: region boundary %d (%d) is below the one before it (%d)", i, offs[i], offs[i-1])
		}
	}
	r.b.calls, r.lthr, r.gthr = it, lthr, gthr
	copy(r.reg.offs, offs)
	return nil
}

// rebalance sets the region boundaries from the workers' selections L
// (sel, ascending): each proposes the indices at positions ⌊|L|/P⌋·i of L
// (the equal split i·⌊N/P⌋ when L is empty), the proposals are summed over
// the workers as int64 and divided by P.
func (r *okTopkReducer) rebalance(ctx context.Context, sel device.Buffer) error {
	g := &r.reg
	v := &r.b.v
	p, n := g.p, g.n
	if p == 1 {
		g.offs[0], g.offs[1] = 0, n
		return nil
	}
	r.bounds = grow(r.bounds, p-1)
	m := sel.Len()
	if m == 0 {
		for i := 1; i < p; i++ {
			r.bounds[i-1] = int64(i * (n / p))
		}
	} else {
		pos := make([]int32, p-1)
		for i := 1; i < p; i++ {
			pos[i-1] = int32((m / p) * i)
		}
		dp, err := v.scratch(&r.prop, device.Int32, 2*(p-1))
		if err != nil {
			return err
		}
		if err := v.upload(dp, pos); err != nil {
			return err
		}
		if err := v.ops.GatherIndex(v.s, dp.Slice(p-1, 2*(p-1)), sel, dp.Slice(0, p-1)); err != nil {
			return err
		}
		at := make([]int32, p-1)
		if err := v.download(at, dp.Slice(p-1, 2*(p-1))); err != nil {
			return err
		}
		for i, j := range at {
			r.bounds[i] = int64(j)
		}
	}
	db, err := v.scratch(&r.dBounds, device.Int64, p-1)
	if err != nil {
		return err
	}
	if err := v.s.Copy(db, device.Host(r.bounds)); err != nil {
		return err
	}
	if err := g.c.AllReduce(ctx, v.cb(db)); err != nil {
		return fmt.Errorf("all-reducing %d boundary proposals: %w", p-1, err)
	}
	if err := v.s.Copy(device.Host(r.bounds), db); err != nil {
		return err
	}
	if err := v.s.Synchronize(); err != nil {
		return err
	}
	g.offs[0] = 0
	for i := 1; i < p; i++ {
		v := r.bounds[i-1] / int64(p)
		if v < int64(g.offs[i-1]) || v > int64(n) {
			return fmt.Errorf("boundary %d averages to %d, outside [%d, %d] (the workers disagree on the layout or the data is corrupt)", i, v, g.offs[i-1], n)
		}
		g.offs[i] = int(v)
	}
	g.offs[p] = n
	return nil
}

// okTopkAdvice: topkdsa's region exchange of the local selection, the
// owners' pairs in one message each, and the re-balancing's P−1 int64
// boundaries every okRepartition calls. Its controllers keep the local and
// the global selection near k, but every okGlobalRecompute-th call gathers
// every non-zero region sum: the union of the workers' local selections.
// Its schedule (exact thresholds every okLocalRecompute = okGlobalRecompute
// calls) is the period the advisor times.
var okTopkAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		if s.P <= 1 {
			return regionAlone(s), nil
		}
		P := float64(s.P)
		return append(regionExchange(s, s.Sel),
			Call{comm.OpAllGatherV, 1, 2 * s.Union / P},
			Call{comm.OpAllReduce, 1.0 / okRepartition, 2 * (P - 1)}), nil
	},
	Volume: func(s Shape, o Overlap) (sel, union float64) {
		k := float64(s.K)
		return k, ((okGlobalRecompute-1)*k + o.TopK(k)) / okGlobalRecompute
	},
	Selection: SelectsWhole,
	Period:    okLocalRecompute,
	Caveats: func(Conditions) []string {
		return []string{fmt.Sprintf("its thresholds are exact every %d sparse calls and reused in between, and its controllers keep its selections near k: what it sends after its dense warm-up is its reducer's over the horizon (start, mean, settled), its exact calls' gathers included", okLocalRecompute), congested}
	},
	Evidence: Evidence{Shown: []ModelKind{CNN, RNN, Transformer},
		Papers: "Ok-Topk paper: VGG-16 on CIFAR-10, LSTM on AN4, BERT; similar accuracy in SparDL's comparisons"},
}
