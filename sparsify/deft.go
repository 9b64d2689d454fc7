package sparsify

import (
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"math"
	"math/big"
	"slices"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "deft", NotProjectable: "the union of DEFT's selected indices, which every worker all-reduces, grows with the worker count", New: newDeft, Advice: deftAdvice, Kernels: []*device.Kernel{deftPlan, deftCommon},
		Doc: "reference notes 2: DEFT's fragments, norm-proportional per-fragment budgets and LPT bin packing by a rotating leader. The budgets follow the authors' greedy rule (descending norm, each fragment max(1, ⌊remain_k·norm/remain_norm⌋) capped at its size; the total can end a little below or above k). Deviations: that share is computed exactly, where the reference's floating-point remain_norm can floor a share of 3 to 2; empty fragments (N < n² only) get no budget instead of crashing; a NaN or infinite acc is an error; the leader broadcasts its fragments' norms, not its bins, and every worker packs the leader's bins from them (the same bins, one broadcast instead of two). The plan (norms, allocations, bins, this worker's bin) is made on the device where acc lives, by one kernel on a GPU (the shares exact there too), by the same Go code on the CPU; the host reads only its counts."})
}

// deftFrag is one fragment of DEFT's layout: the elements [lo, hi) of the flat
// gradient, which belong to layout tensor number tensor.
type deftFrag struct{ lo, hi, tensor int }

func (f deftFrag) size() int { return f.hi - f.lo }

// deftFragments cuts a layout into DEFT's fragments for n workers: a tensor
// strictly larger than N/n is split into n contiguous near-equal chunks (the
// first size mod n one element larger, as comm.ChunkBounds cuts), every other
// tensor is one fragment. A tensor with fewer than n elements that is still
// larger than N/n (possible only when N < n²) yields some empty chunks; they
// are kept so that fragment numbers match the reference code's.
func deftFragments(l Layout, n int) []deftFrag {
	var fr []deftFrag
	for ti, t := range l.Tensors {
		if int64(t.Size)*int64(n) > int64(l.N) { // s > N/n, strict, without rounding
			for c := range n {
				lo, hi := comm.ChunkBounds(t.Size, n, c)
				fr = append(fr, deftFrag{t.Offset + lo, t.Offset + hi, ti})
			}
			continue
		}
		fr = append(fr, deftFrag{t.Offset, t.Offset + t.Size, ti})
	}
	return fr
}

// deftAllocator computes DEFT's per-fragment budgets (allocate), keeping
// its scratch between calls.
type deftAllocator struct {
	order    []int
	w        []big.Int // the norms as integers with the same ratios
	rem, num big.Int
}

// allocate fills kf with DEFT's per-fragment budgets for a global budget
// k from the fragments' norms, by the authors' rule (DeftReducer in the
// reference code): the fragments are visited in descending norm order, and
// each gets
//
//	t_f = ⌊remain_k · norm_f / remain_norm⌋  (0 when remain_norm is 0)
//	k_f = size_f if size_f < t_f, else max(1, t_f)
//
// after which remain_k −= k_f and remain_norm −= norm_f; remain_k starts at
// k and remain_norm at the sum of all norms. The rule is greedy: a fragment
// visited late that is smaller than its share leaves the difference unsent,
// and once remain_k has run out every later fragment still gets 1, so the
// k_f can sum to less or more than k; that is DEFT's allocation, kept.
//
// Ties in the norms are visited higher fragment number first: the reference
// orders by NumPy's argsort(norms)[::-1], which gives that order wherever
// the sort is stable (NumPy's default sort of up to 16 elements; for more,
// NumPy leaves the order of ties unspecified).
//
// The one deviation fixes a floating-point defect: the reference keeps
// remain_norm by repeated subtraction and computes the share in float64, so
// that an exact share of 3 can come out as 2.9999… and be floored to 2 (the
// last fragment's share remain_k·norm_f/norm_f most often). Here
// remain_norm is the exact sum of the norms not yet visited and the share is
// floored exactly, in integers (the float64 norms scaled to big integers
// with the same ratios). Empty fragments (a tensor with fewer elements than
// workers that is still larger than N/n, only when N < n²) get 0 and leave
// remain_k as it is, where the reference would ask top-k for 1 element of
// nothing and crash. Norms must be finite and >= 0.
func (a *deftAllocator) allocate(kf []int, frags []deftFrag, norms []float64, k int) {
	L := len(frags)
	a.order = a.order[:0]
	for f := range L {
		a.order = append(a.order, f)
	}
	slices.SortFunc(a.order, func(x, y int) int {
		if c := cmp.Compare(norms[y], norms[x]); c != 0 {
			return c
		}
		return cmp.Compare(y, x)
	})
	// The norms as integers with the same ratios: norm = mant·2^exp with a
	// 53-bit integer mant; every one is shifted to the smallest exp.
	if cap(a.w) < L {
		a.w = make([]big.Int, L)
	}
	w := a.w[:L]
	emin := math.MaxInt
	for _, nv := range norms[:L] {
		if nv > 0 {
			_, e := math.Frexp(nv)
			emin = min(emin, e-53)
		}
	}
	a.rem.SetInt64(0)
	for f, nv := range norms[:L] {
		if !(nv > 0) {
			w[f].SetInt64(0)
			continue
		}
		fr, e := math.Frexp(nv)
		w[f].SetInt64(int64(math.Ldexp(fr, 53)))
		w[f].Lsh(&w[f], uint(e-53-emin))
		a.rem.Add(&a.rem, &w[f])
	}
	remain := k
	for _, f := range a.order {
		size := frags[f].size()
		if size == 0 {
			kf[f] = 0
			continue // its norm is 0: remain_norm stays
		}
		t := 0
		// A share of remain_k <= 0 is at most 0 (the reference truncates
		// toward 0): the fragment gets 1.
		if remain > 0 && w[f].Sign() > 0 {
			a.num.SetInt64(int64(remain))
			a.num.Mul(&a.num, &w[f])
			a.num.Quo(&a.num, &a.rem) // <= remain: w[f] <= rem
			t = int(a.num.Int64())
		}
		if size < t {
			kf[f] = size
		} else {
			kf[f] = max(1, t)
		}
		remain -= kf[f]
		a.rem.Sub(&a.rem, &w[f])
	}
}

// deftCost is the bin-packing cost of a fragment: size·log2(k_f) if k_f > 1,
// else size (log2 as deftLog2 computes it).
func deftCost(size, kf int) float64 {
	if kf > 1 {
		return float64(float64(size) * deftLog2(float64(kf)))
	}
	return float64(size)
}

// deftLog2 is math.Log2 of x >= 2 written out in plain arithmetic: its
// Frexp, and its Log as Go's pure-Go code computes it (the FreeBSD
// algorithm), every product rounded on its own (no fused multiply-add).
// deft.cu's deft_log2 is the same code, so that the bins packed on a GPU
// and on the CPU are the same; it is meant to give math.Log2's bits
// (TestDeftLog2 checks that it is within one unit in the last place).
func deftLog2(x float64) float64 {
	const (
		ln2Hi = 6.93147180369123816490e-01
		ln2Lo = 1.90821492927058770002e-10
		l1    = 6.666666666666735130e-01
		l2    = 3.999999999940941908e-01
		l3    = 2.857142874366239149e-01
		l4    = 2.222219843214978396e-01
		l5    = 1.818357216161805012e-01
		l6    = 1.531383769920937332e-01
		l7    = 1.479819860511658591e-01
	)
	frac, exp := math.Frexp(x)
	if frac == 0.5 {
		return float64(exp - 1)
	}
	f1, ki := frac, 0
	if f1 < math.Sqrt2/2 {
		f1 *= 2
		ki--
	}
	f := f1 - 1
	k := float64(ki)
	s := f / (2 + f)
	s2 := float64(s * s)
	s4 := float64(s2 * s2)
	t1 := float64(s2 * (l1 + float64(s4*(l3+float64(s4*(l5+float64(s4*l7)))))))
	t2 := float64(s4 * (l2 + float64(s4*(l4+float64(s4*l6)))))
	r := t1 + t2
	hfsq := float64(float64(0.5*f) * f)
	ln := float64(k*ln2Hi) - ((hfsq - (float64(s*(hfsq+r)) + float64(k*ln2Lo))) - f)
	return float64(ln*(1/math.Ln2)) + float64(exp)
}

// deftPack is the leader's LPT bin packing. Fragments are taken in
// descending cost order (ties: lower fragment number first); a fragment with
// k_f == size (fully selected) goes to the common list, any other to the
// currently least-loaded of the n bins (ties: lower bin) and adds its cost to
// that bin's load. It returns the encoding the leader broadcasts: lens[b] is
// the length of bin b, and content holds the bins' fragment numbers in bin
// order followed by the common list (len(content) == len(frags)).
func deftPack(frags []deftFrag, kf []int, n int, lens, content []int32) {
	L := len(frags)
	cost := make([]float64, L)
	order := make([]int, L)
	for f := range frags {
		cost[f] = deftCost(frags[f].size(), kf[f])
		order[f] = f
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(cost[b], cost[a]) })
	loads := make([]float64, n)
	bins := make([][]int32, n)
	var common []int32
	for _, f := range order {
		if kf[f] == frags[f].size() {
			common = append(common, int32(f))
			continue
		}
		b := 0
		for j := 1; j < n; j++ {
			if loads[j] < loads[b] {
				b = j
			}
		}
		bins[b] = append(bins[b], int32(f))
		loads[b] += cost[f]
	}
	pos := 0
	for b := range n {
		lens[b] = int32(len(bins[b]))
		pos += copy(content[pos:], bins[b])
	}
	copy(content[pos:], common)
}

// deftReducer is DEFT (Yoon & Oh, ICPP'23): distributed execution of
// fragmented top-k. See the "deft" entry of the package's method list and
// newDeft.
type deftReducer struct {
	b      *Env
	n, r   int // workers, rank
	k      int
	frags  []deftFrag
	starts []int
	segs   []int // the fragments' bounds: fragment f is [segs[f], segs[f+1])

	// The fragments' sums of squares (the worker's, then the leader's),
	// the bounds as int32 (bounds32 on the host, dBounds on the device,
	// uploaded once), the plan's scratch and the plan (deftPlan), and the
	// plan's header read back (status, selected count, common elements).
	dSums, dBounds, dWork, dPlan device.Buffer
	bounds32                     []int32
	hdr                          [3]int32
	ss                           []float64 // the sums read back, on the error path only
}

// newDeft builds the "deft" reducer, DEFT as in the authors' DeftReducer
// (kljp/deft, notes section 2), bound to one worker:
//
//   - Fragments are fixed at construction (the reference fixes them at its
//     first call; nothing in between can change them): tensors strictly
//     larger than N/n are cut into n near-equal contiguous chunks, the others
//     are one fragment each.
//   - Each call: the global budget is k = BudgetK(Density, N) (⌊ρN⌋, clamped
//     to at least 1); every worker computes the L2 norms of its own acc per
//     fragment (not synchronised) and splits k by the authors' greedy rule
//     (deftAllocator.allocate: descending norm order, each fragment
//     max(1, ⌊remain_k·norm_f/remain_norm⌋) capped at its size), so the k_f
//     can sum to a little less or more than k, as in the reference. The
//     union over workers is Σ over binned fragments of the owner's k_f plus
//     the sizes of the common fragments: when all workers hold the same acc
//     it equals that total, but because the allocations are local (as in
//     the reference) workers with different accs can together send more.
//   - The leader, rank t mod n, broadcasts its fragments' sums of squares
//     (one broadcast of L float64s, as 2L int32 words); every worker packs
//     the fragments into n bins by LPT (deftPack, cost size·log2 k_f, log2
//     as deftLog2) with the leader's k_f, computed from them, fully
//     selected fragments going to a common list: the bins the reference's
//     leader packs and broadcasts (two int32 broadcasts there), the same on
//     every worker.
//   - Where it runs: the sums of squares, their broadcast, both
//     allocations, the packing and this worker's bin (as a list of
//     segments) are computed where acc lives, with no host in between: on
//     a GPU by one kernel (deftPlan: deft.cu's k_deft_plan, the shares
//     exact in multi-limb integers, giving the Go code's budgets), on the
//     CPU by that kernel's host pass, the Go code itself. The host reads
//     back only the plan's header (12 bytes: whether the norms are finite,
//     its selection's count, the common fragments' length), in the one wait
//     of the plan; the fragments' norms come back only to name a
//     non-finite one in the error.
//   - Worker r takes bin (t mod n + r) mod n and selects the TopK of every
//     fragment of it with its own k_f; counts and index lists are
//     all-gathered in the package's wire format (int32 counts, then the
//     int32 lists with AllGatherV; the reference sends int64 counts and
//     int64 lists padded to the largest); the union is their concatenation plus
//     every index of every common fragment (disjoint by construction); the
//     union is all-reduced with each worker's own values (unionReduce), out is
//     the average on the union and 0 elsewhere, the residual is acc with the
//     union zeroed.
//
// Stats: Selected is this worker's count (the sum of its own k_f over its
// bin; common fragments are not included), SelectedPerWorker the gathered
// counts, ActualDensity = |union|/N, LayerK[i] the number of indices of
// layout tensor i in the union, Threshold NaN. SelectTime covers the norms,
// the plan (allocations and packing) and the top-k selections (not the
// norms' broadcast).
//
// Deviations from the reference code: the allocation's shares are
// computed exactly (see deftAllocator.allocate: the reference's
// floating-point remain_norm can floor an exact share of 3 to 2); empty
// fragments (tensors with fewer than n elements but more than N/n, only when
// N < n²) get k_f = 0 and land in the common list, where the reference would
// ask top-k for more elements than the fragment has and crash; a NaN or
// infinite acc is an error instead of a silent garbage allocation; the
// leader broadcasts its norms instead of its bins (the same bins, one
// broadcast instead of two, 8L bytes instead of 4(n+L)), so that no worker
// waits for the bins: each makes the leader's bins from the leader's norms
// on its device, in the one wait that reads its plan's counts.
func newDeft(b *Env) (Core, error) {
	o := b.o
	n := o.Comm.Size()
	d := &deftReducer{b: b, n: n, r: o.Comm.Rank(), k: b.k}
	d.frags = deftFragments(o.Layout, n)
	// The fragments tile the layout in order.
	for _, fr := range d.frags {
		d.segs = append(d.segs, fr.lo)
		d.bounds32 = append(d.bounds32, int32(fr.lo))
	}
	d.segs = append(d.segs, o.Layout.N)
	d.bounds32 = append(d.bounds32, int32(o.Layout.N))
	d.starts = make([]int, len(o.Layout.Tensors))
	for i, t := range o.Layout.Tensors {
		d.starts[i] = t.Offset
	}
	return d, nil
}

// Reduce runs one DEFT iteration (see newDeft): every worker's fragment
// sums of squares are computed on the device, where the leader's are
// broadcast; the plan — both allocations, the leader's bins, this
// worker's bin as TopKSegmentsOn's list, the common fragments — is made
// there too (deftPlan, one thread), and the host reads only its header
// (the finiteness status, the selection's count and the common part's
// length: 12 bytes) in one wait. Each fragment's top-k is selected on the
// device from the list, and the common fragments' indices are written
// there (deftCommon).
func (d *deftReducer) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := d.b
	N := b.n
	v := &b.v
	t := b.calls
	L := len(d.frags)
	cycle := t % d.n

	// The fragments' sums of squares: this worker's in sums[:L], the
	// leader's broadcast into sums[L:] (the leader's own on the leader).
	t0 := time.Now()
	sums, err := v.scratch(&d.dSums, device.Float64, 2*L)
	if err != nil {
		return err
	}
	if err := v.ops.SegmentSumSquaresTo(v.s, sums.Slice(0, L), acc, d.segs); err != nil {
		return err
	}
	lead, leadSums := int32(0), sums.Slice(0, L)
	if d.r != cycle {
		lead, leadSums = 1, sums.Slice(L, 2*L)
	}
	// As int32 words, the wire format's type (the bits travel as they
	// are); the time it waits for the leader is not selection time.
	tBcast := time.Now()
	if err := b.c.Broadcast(ctx, v.cb(leadSums.View(device.Int32, 0, 2*L)), cycle); err != nil {
		return fmt.Errorf("broadcasting the fragments' norms from leader %d: %w", cycle, err)
	}
	commTime := time.Since(tBcast)
	if d.dBounds.Len() == 0 {
		bounds, err := v.scratch(&d.dBounds, device.Int32, L+1)
		if err != nil {
			return err
		}
		if err := v.s.Copy(bounds, device.Host(d.bounds32)); err != nil {
			return err
		}
	}
	bounds := d.dBounds.Slice(0, L+1)
	work, err := v.scratch(&d.dWork, device.Float64, 3*L+d.n)
	if err != nil {
		return err
	}
	plan, err := v.scratch(&d.dPlan, device.Int32, deftPlanWords(L, d.n))
	if err != nil {
		return err
	}
	if err := v.ops.Run(v.s, deftPlan, 1, sums, bounds, int64(1), int32(L), int64(d.k), int32(d.n), int32(d.r), int32(cycle), lead, int32(1), work, plan); err != nil {
		return err
	}
	if err := v.s.Copy(device.Host(d.hdr[:]), plan.Slice(0, len(d.hdr))); err != nil {
		return err
	}
	if err := v.s.Synchronize(); err != nil { // the one wait
		return err
	}
	if d.hdr[0] != 0 {
		return d.notFinite(sums, int(lead), cycle)
	}
	count, ncommon := int(d.hdr[1]), int(d.hdr[2])
	selTime := time.Since(t0) - commTime

	// Top-k of every fragment of my bin, with my own k_f. Sized for the
	// whole budget: a bin's share varies from call to call (the bins
	// rotate), the buffer need not.
	mine, err := v.scratch(&b.dSel, device.Int32, max(count, d.k))
	if err != nil {
		return err
	}
	mine = mine.Slice(0, count)
	list := plan.Slice(deftListAt(L, d.n), deftListAt(L, d.n)+1+3*L)
	sel, err := b.selectTimed(func() error {
		return v.ops.TopKSegmentsOn(v.s, mine, acc, list, L, N)
	})
	if err != nil {
		return err
	}
	selTime += sel

	all, counts, err := b.gatherIndicesOn(ctx, mine)
	if err != nil {
		return err
	}
	// The union: the gathered lists, then every index of every common
	// fragment (disjoint fragments: no duplicates).
	union, err := b.listScratch(&b.dUnion, device.Int32, all.Len()+ncommon)
	if err != nil {
		return err
	}
	if err := v.s.Copy(union.Slice(0, all.Len()), all); err != nil {
		return err
	}
	if err := v.ops.Run(v.s, deftCommon, ncommon, plan, bounds, int64(ncommon), int32(L), int32(d.n), union.Slice(all.Len(), union.Len())); err != nil {
		return err
	}
	// The union's indices per tensor, which are also its range check: the
	// tensors tile [0, N), so every index is in range exactly when the
	// counts add up to the union's length (one read for both).
	tb := append(append([]int(nil), d.starts...), N)
	if st.LayerK, err = v.ops.CountIn(v.s, union, tb); err != nil {
		return err
	}
	in := 0
	for _, c := range st.LayerK {
		in += c
	}
	if in != union.Len() || (len(tb) > 1 && tb[0] != 0) {
		if err := v.ops.InRange(v.s, union, N); err != nil {
			return err
		}
		return fmt.Errorf("%d of the union's %d indices are in no tensor", union.Len()-in, union.Len())
	}
	if err := b.reduceUnionOn(ctx, acc, out, residual, union); err != nil {
		return err
	}

	st.SelectTime = selTime
	st.Selected = count
	st.SelectedPerWorker = counts
	st.Distinct = union.Len()
	return nil
}

// notFinite reads the fragments' sums of squares back after the plan
// found one that is not finite (this worker's in sums[:L], the leader's in
// sums[L:] when lead is 1) and says which fragment holds what.
func (d *deftReducer) notFinite(sums device.Buffer, lead, cycle int) error {
	L := len(d.frags)
	read := L * (1 + lead)
	d.ss = grow(d.ss, read)
	v := &d.b.v
	if err := v.s.Copy(device.Host(d.ss[:read]), sums.Slice(0, read)); err != nil {
		return err
	}
	if err := v.s.Synchronize(); err != nil {
		return err
	}
	if err := d.norms(d.ss[:L], "acc holds", "the gradient diverged"); err != nil {
		return err
	}
	if lead == 1 {
		if err := d.norms(d.ss[L:read], fmt.Sprintf("the norms broadcast by leader %d hold", cycle), "the leader's gradient diverged"); err != nil {
			return err
		}
	}
	return fmt.Errorf("sparsify: deft: the plan found a sum of squares that is not finite, the host none (a device fault? rerun with SPARSEGRAD_CUDA_SYNC=1)")
}

// norms checks that the square roots of the fragments' sums of squares
// ss are finite: the error says what holds the first that is not (what)
// and why (cause).
func (d *deftReducer) norms(ss []float64, what, cause string) error {
	for f, q := range ss {
		nv := math.Sqrt(q)
		if math.IsNaN(nv) || math.IsInf(nv, 0) {
			fr := d.frags[f]
			return fmt.Errorf("%s NaN or infinite values in fragment %d (tensor %q, elements %d..%d): %s (lower the learning rate or clip gradients)", what, f, d.b.o.Layout.Tensors[fr.tensor].Name, fr.lo, fr.hi, cause)
		}
	}
	return nil
}

//go:embed deft.cu
var deftCUDA string

// deftPlanWords is the length of deftPlan's plan for L fragments and n
// workers (deft.cu's layout): the header, both budgets, a sort's scratch,
// the bins, their lengths, the common fragments' starts and the list.
func deftPlanWords(L, n int) int { return deftListAt(L, n) + 1 + 3*L }

// deftListAt is where the list of this worker's bin starts in the plan
// (DEFT_LIST).
func deftListAt(L, n int) int { return 5 + 5*L + n }

// deftPlan is deft.cu's k_deft_plan (arguments ss (Float64, 2L), bounds
// (Int32, L+1), n = 1 as int64, L, k as int64, the workers, the rank, the
// cycle, lead and sq as int32, the scratch (Float64, 3L + workers) and the
// plan (Int32, deftPlanWords)): the budgets by deftAllocator.allocate
// (this worker's from ss[:L], the leader's from ss[L:] when lead is 1,
// else the same), the leader's bins by deftPack, this worker's bin, bin
// (cycle + rank) mod workers, as TopKSegmentsOn's list, and the common
// fragments' starts. ss holds the sums of squares when sq is 1 (the norms
// are their square roots), the norms themselves when it is 0. The host
// pass is the Go code; the CUDA C computes the same integers (the shares
// exactly, in multi-limb integers over the span of limbs the norms
// occupy; the costs with deftLog2's arithmetic). On a GPU it is one block
// (n = 1): its threads rank the fragments by norm and by cost, and one
// runs the greedy allocation and packing.
var deftPlan = &device.Kernel{Name: "k_deft_plan", CUDA: deftCUDA, Host: func(_ int, a ...any) {
	ss, bounds := a[0].(device.Buffer).Float64s(), a[1].(device.Buffer).Int32s()
	L, k, nw := int(a[3].(int32)), int(a[4].(int64)), int(a[5].(int32))
	rank, cycle, lead, sq := int(a[6].(int32)), int(a[7].(int32)), a[8].(int32) != 0, a[9].(int32) != 0
	plan := a[11].(device.Buffer).Int32s()
	deftPlanHost(plan, ss, bounds, L, k, nw, rank, cycle, lead, sq)
}}

// deftPlanHost is deftPlan's host pass.
func deftPlanHost(plan []int32, ss []float64, bounds []int32, L, k, nw, rank, cycle int, lead, sq bool) {
	clear(plan[:4])
	list := plan[deftListAt(L, nw):]
	list[0] = 0
	m := L
	if lead {
		m = 2 * L
	}
	norms := make([]float64, m)
	for f := range m {
		nv := ss[f]
		if sq {
			nv = math.Sqrt(nv)
		}
		if math.IsNaN(nv) || math.IsInf(nv, 0) {
			plan[0] = 1 + int32(f/L)
			return
		}
		norms[f] = nv
	}
	frags := make([]deftFrag, L)
	for f := range frags {
		frags[f] = deftFrag{int(bounds[f]), int(bounds[f+1]), 0}
	}
	var al deftAllocator
	kf, kfLead := make([]int, L), make([]int, L)
	al.allocate(kf, frags, norms[:L], k)
	if lead {
		al.allocate(kfLead, frags, norms[L:], k)
	} else {
		copy(kfLead, kf)
	}
	content, lens := plan[4+3*L:4+4*L], plan[4+4*L:4+4*L+nw]
	deftPack(frags, kfLead, nw, lens, content)
	for f := range L {
		plan[4+f], plan[4+L+f] = int32(kf[f]), int32(kfLead[f])
	}
	mine, start, total := (cycle+rank)%nw, 0, 0
	for b, n := range lens {
		if b == mine {
			start = total
		}
		total += int(n)
	}
	count := 0
	list[0] = lens[mine]
	for j, f := range content[start : start+int(lens[mine])] {
		list[1+3*j], list[2+3*j], list[3+3*j] = bounds[f], bounds[f+1], int32(kf[f])
		count += kf[f]
	}
	cs := plan[4+4*L+nw:]
	pre := int32(0)
	for j, f := range content[total:] {
		cs[j] = pre
		pre += bounds[f+1] - bounds[f]
	}
	cs[L-total] = pre
	plan[1], plan[2], plan[3] = int32(count), pre, int32(L-total)
}

// deftCommon is deft.cu's k_deft_common (arguments the plan, bounds, n
// (the common fragments' elements, the plan's third word) as int64, L and
// the workers as int32, idx (Int32, n)): every index of every common
// fragment, in the common list's order.
var deftCommon = &device.Kernel{Name: "k_deft_common", CUDA: deftCUDA, Host: func(_ int, a ...any) {
	plan, bounds := a[0].(device.Buffer).Int32s(), a[1].(device.Buffer).Int32s()
	L, idx := int(a[3].(int32)), a[5].(device.Buffer).Int32s()
	C := int(plan[3])
	pos := 0
	for _, f := range plan[4+4*L-C : 4+4*L] {
		for e := bounds[f]; e < bounds[f+1]; e++ {
			idx[pos] = e
			pos++
		}
	}
}}

// SaveState writes the call count, which rotates the leader that packs the
// bins.
func (d *deftReducer) SaveState(w *StateWriter) error {
	w.Int(d.b.calls)
	return nil
}

// LoadState reads the call count back.
func (d *deftReducer) LoadState(r *StateReader) error {
	t := r.Int("call count", 0, maxCount)
	if err := r.Done(); err != nil {
		return err
	}
	d.b.calls = t
	return nil
}

// deftAdvice: the leader's fragments' sums of squares broadcast (a float64,
// two int32 words, per fragment: a tensor of more than N/P elements is cut
// into P), then topk's exchange with each worker's selection of about k/P
// in its bin; their union is about k.
var deftAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		frags := 0
		for _, sz := range s.Sizes {
			if int64(sz)*int64(s.P) > int64(s.N) {
				frags += s.P
			} else {
				frags++
			}
		}
		return append([]Call{{comm.OpBroadcast, 1, float64(2 * frags)}},
			unionCalls(s.Sel, s)...), nil
	},
	Volume: func(s Shape, _ Overlap) (sel, union float64) {
		return float64(s.K) / float64(s.P), float64(s.K)
	},
	Selection: NormsThenShare,
	Evidence: Evidence{Shown: []ModelKind{CNN, RNN, Recommender},
		Papers:  "DEFT paper: ResNet-18 on CIFAR-10, LSTM on WikiText-2, NCF on MovieLens-20M, accuracy comparable to dense",
		Project: "NCF on MovieLens-100K, 4 workers, ρ = 0.1: HR@10 0.673 after 20 epochs (dense 0.665; docs/results/ncf-ml100k.md)"},
}
