package sparsify

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/big"
	"slices"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "deft", NotProjectable: "the union of DEFT's selected indices, which every worker all-reduces, grows with the worker count", New: newDeft})
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

// deftAllocate fills kf with DEFT's per-fragment budgets for a global budget
// k from the fragments' norms. The allocation is exact: the k_f sum to the
// budget K = max(k, number of non-empty fragments) — every non-empty fragment
// gets at least 1, as in the reference, which is all that can raise the total
// above k — and 1 <= k_f <= size_f (0 for an empty fragment). The k_f are the
// largest-remainder rounding of the shares
//
//	x_f = clamp(λ·norm_f, 1, size_f),  λ such that Σ_f x_f = K,
//
// that is, proportional to the norms, bounded by the fragments' sizes, a
// share a fragment cannot take going to the others in proportion to their
// norms. Each k_f is ⌊x_f⌋, and the K − Σ⌊x_f⌋ units left (fewer than the
// fragments with a fractional share) go one each to the fragments with the
// largest fractional parts, ties to the larger norm, then the lower fragment
// number. Fragments whose norm is 0 get 1, unless the others cannot take
// K − (their number) even at their full sizes: then they share the rest in
// proportion to their sizes, by the same rule. Norms must be finite and >= 0
// and k at most the fragments' total size (BudgetK guarantees it).
//
// λ, the shares and the remainders are computed exactly, in integers (the
// float64 norms scaled to big integers), so the total cannot lose a unit to
// rounding. The reference code instead visits the fragments in descending
// norm order giving each max(1, ⌊remain_k·norm_f/remain_norm⌋) capped at its
// size: floating-point rounding can floor a last share of 3 to 2, a fragment
// visited late that is smaller than its share loses the difference, and
// fragments visited after the budget ran out still get 1 each, so its total
// can be below or above k.
func deftAllocate(kf []int, frags []deftFrag, norms []float64, k int) {
	var pos, zero []int // non-empty fragments by norm > 0 and norm == 0
	capPos, m := 0, 0
	for f, fr := range frags {
		kf[f] = 0
		if fr.size() == 0 {
			continue
		}
		m++
		if norms[f] > 0 {
			pos = append(pos, f)
			capPos += fr.size()
		} else {
			zero = append(zero, f)
		}
	}
	budget := max(k, m)
	// Descending norm, ties to the lower fragment number: the order of the
	// lower breakpoints and of ties between equal remainders.
	slices.SortStableFunc(pos, func(a, b int) int { return cmp.Compare(norms[b], norms[a]) })
	if budget-len(zero) <= capPos {
		deftShare(kf, frags, pos, deftWeights(pos, norms), budget-len(zero))
		for _, f := range zero {
			kf[f] = 1
		}
		return
	}
	for _, f := range pos {
		kf[f] = frags[f].size()
	}
	sizes := make([]*big.Int, len(zero))
	for i, f := range zero {
		sizes[i] = big.NewInt(int64(frags[f].size()))
	}
	deftShare(kf, frags, zero, sizes, budget-capPos)
}

// deftWeights returns the norms of the fragments idx (all > 0 and finite)
// as big integers with the same ratios: each norm is mant·2^exp with an
// integer mant of 53 bits, and every one is shifted to the smallest exp.
func deftWeights(idx []int, norms []float64) []*big.Int {
	mant := make([]int64, len(idx))
	exp := make([]int, len(idx))
	emin := math.MaxInt
	for i, f := range idx {
		fr, e := math.Frexp(norms[f])
		mant[i], exp[i] = int64(math.Ldexp(fr, 53)), e-53
		emin = min(emin, exp[i])
	}
	w := make([]*big.Int, len(idx))
	for i := range idx {
		w[i] = new(big.Int).Lsh(big.NewInt(mant[i]), uint(exp[i]-emin))
	}
	return w
}

// deftEvent is a breakpoint of the share function: fragment idx[i] leaves its
// lower bound 1 (upper false) or reaches its upper bound size (upper true) at
// λ = bound/w[i].
type deftEvent struct {
	i     int
	bound int64
	upper bool
}

// deftShare sets kf[idx[i]] for every i to the largest-remainder rounding of
// clamp(λ·w[i], 1, size) with Σ = budget (see deftAllocate), in exact
// integer arithmetic. idx is in tie-break order, every w[i] > 0, and
// len(idx) <= budget <= Σ sizes.
func deftShare(kf []int, frags []deftFrag, idx []int, w []*big.Int, budget int) {
	sumHi := 0
	for _, f := range idx {
		sumHi += frags[f].size()
	}
	switch {
	case budget <= len(idx):
		for _, f := range idx {
			kf[f] = 1
		}
		return
	case budget >= sumHi:
		for _, f := range idx {
			kf[f] = frags[f].size()
		}
		return
	}
	// Breakpoints in ascending λ: a/w[i] < b/w[j] ⇔ a·w[j] < b·w[i]. At
	// equal λ lower events come first, so a fragment of size 1 enters and
	// leaves in that order.
	ev := make([]deftEvent, 0, 2*len(idx))
	for i, f := range idx {
		ev = append(ev, deftEvent{i, 1, false}, deftEvent{i, int64(frags[f].size()), true})
	}
	var x, y big.Int
	slices.SortStableFunc(ev, func(a, b deftEvent) int {
		x.Mul(big.NewInt(a.bound), w[b.i])
		y.Mul(big.NewInt(b.bound), w[a.i])
		if c := x.Cmp(&y); c != 0 {
			return c
		}
		switch {
		case !a.upper && b.upper:
			return -1
		case a.upper && !b.upper:
			return 1
		}
		return 0
	})
	// Sweep: Σ_f clamp(λ·w_f, 1, size_f) = fixed + λ·wsum between
	// breakpoints. Stop at the first breakpoint where it reaches the budget;
	// λ = (budget − fixed)/wsum lies in the interval before it. It is
	// reached at the last breakpoint at the latest (the sum is then sumHi >
	// budget), with wsum > 0 (the sum was below budget at the breakpoint
	// before and grew since).
	state := make([]int8, len(idx)) // 0 lower bound, 1 proportional, 2 upper bound
	fixed := int64(len(idx))
	var wsum, lhs, rhs big.Int
	for _, e := range ev {
		if wsum.Sign() > 0 {
			// fixed + (bound/w_e)·wsum >= budget ⇔ bound·wsum >= (budget − fixed)·w_e
			lhs.Mul(big.NewInt(e.bound), &wsum)
			rhs.Mul(big.NewInt(int64(budget)-fixed), w[e.i])
			if lhs.Cmp(&rhs) >= 0 {
				break
			}
		}
		if e.upper {
			state[e.i] = 2
			fixed += e.bound
			wsum.Sub(&wsum, w[e.i])
		} else {
			state[e.i] = 1
			fixed--
			wsum.Add(&wsum, w[e.i])
		}
	}
	// Shares: x_i = r·w_i/wsum with r = budget − fixed; floor and remainder
	// (over the common denominator wsum) in integers.
	r := big.NewInt(int64(budget) - fixed)
	total := int(fixed)
	rem := make([]*big.Int, len(idx))
	var frac []int // positions with a fractional share
	var q big.Int
	for i, f := range idx {
		switch state[i] {
		case 0:
			kf[f] = 1
		case 2:
			kf[f] = frags[f].size()
		default:
			rem[i] = new(big.Int)
			q.QuoRem(new(big.Int).Mul(r, w[i]), &wsum, rem[i])
			kf[f] = int(q.Int64())
			total += kf[f]
			if rem[i].Sign() > 0 {
				frac = append(frac, i)
			}
		}
	}
	// The units left are Σ fractional parts, an integer below len(frac);
	// each fragment with a fraction has room for one more (x_i <= size).
	slices.SortStableFunc(frac, func(a, b int) int { return rem[b].Cmp(rem[a]) })
	for _, i := range frac[:budget-total] {
		kf[idx[i]]++
	}
}

// deftCost is the bin-packing cost of a fragment: size·log2(k_f) if k_f > 1,
// else size.
func deftCost(size, kf int) float64 {
	if kf > 1 {
		return float64(size) * math.Log2(float64(kf))
	}
	return float64(size)
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
	o      Options
	c      *comm.Counter
	b      base // device helpers (c is b.c)
	n, r   int
	k      int
	frags  []deftFrag
	t      int // iteration counter, 0 at the first call
	starts []int
	segs   []int // the fragments' bounds: fragment f is [segs[f], segs[f+1])

	norms   []float64
	kf      []int
	lens    []int32
	content []int32
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
//     fragment (not synchronised) and splits k in proportion to them
//     (deftAllocate: minimum 1, cap at the fragment size, what a capped
//     fragment cannot take going to the others, largest-remainder rounding
//     in exact integer arithmetic). The k_f sum to exactly k, or to the
//     number of non-empty fragments when that is larger (the minimum of 1).
//     The union over workers is Σ over binned fragments of the owner's k_f
//     plus the sizes of the common fragments: when all workers hold the same
//     acc it equals that total, but because the allocations are local (as in
//     the reference) workers with different accs can together send more.
//   - The leader, rank t mod n, packs the fragments into n bins by LPT
//     (deftPack, cost size·log2 k_f) using its own k_f, fully selected
//     fragments going to a common list, and broadcasts the bin lengths and
//     contents (two int32 broadcasts, as in the reference).
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
// the allocation, the packing (on the leader) and the top-k selections.
//
// Deviations from the reference code: the allocation is exact (see
// deftAllocate: the reference's sequential greedy floors each share of the
// remaining budget in floating point, so its total can fall short of k by
// rounding or by fragments visited late that are smaller than their share,
// or exceed it when the budget runs out before every fragment got its
// minimum of 1); empty fragments
// (tensors with fewer than n elements but more than N/n, only when N < n²) get
// k_f = 0 and land in the common list, where the reference would ask top-k for
// more elements than the fragment has and crash; a NaN or infinite acc is an
// error instead of a silent garbage allocation.
func newDeft(o Options) (Reducer, error) {
	n := o.Comm.Size()
	b := newBase("deft", o)
	d := &deftReducer{o: o, c: b.c, b: b, n: n, r: o.Comm.Rank(), k: BudgetK(o.Density, o.Layout.N)}
	d.frags = deftFragments(o.Layout, n)
	L := len(d.frags)
	d.norms = make([]float64, L)
	d.kf = make([]int, L)
	d.lens = make([]int32, n)
	d.content = make([]int32, L)
	// The fragments tile the layout in order.
	for _, fr := range d.frags {
		d.segs = append(d.segs, fr.lo)
	}
	d.segs = append(d.segs, o.Layout.N)
	d.starts = make([]int, len(o.Layout.Tensors))
	for i, t := range o.Layout.Tensors {
		d.starts[i] = t.Offset
	}
	return d, nil
}

// Name returns "deft".
func (d *deftReducer) Name() string { return "deft" }

// Reduce runs one DEFT iteration; see newDeft.
func (d *deftReducer) Reduce(ctx context.Context, acc, out, residual []float32) (Stats, error) {
	return d.b.v.reduceHost(ctx, d, "deft", acc, out, residual)
}

// ReduceOn is Reduce on vectors of the reducer's device: the fragment norms
// come back to the host, which allocates and packs; the bins travel through
// device memory; each fragment's top-k is selected on the device.
func (d *deftReducer) ReduceOn(ctx context.Context, acc, out, residual device.Buffer) (Stats, error) {
	N := d.o.Layout.N
	b := &d.b
	v := &b.v
	if err := v.checkOn("deft", N, acc, out, residual); err != nil {
		return Stats{}, err
	}
	t := d.t
	d.t++
	before := d.c.Totals()

	// Norms and the local allocation.
	t0 := time.Now()
	ss, err := v.ops.SegmentSumSquares(v.s, acc, d.segs)
	if err != nil {
		return Stats{}, fmt.Errorf("sparsify: deft: %w", err)
	}
	for f := range d.frags {
		d.norms[f] = math.Sqrt(ss[f])
	}
	for f, nv := range d.norms {
		if math.IsNaN(nv) || math.IsInf(nv, 0) {
			fr := d.frags[f]
			return Stats{}, fmt.Errorf("sparsify: deft: acc holds NaN or infinite values in fragment %d (tensor %q, elements %d..%d): the gradient diverged (lower the learning rate or clip gradients)", f, d.o.Layout.Tensors[fr.tensor].Name, fr.lo, fr.hi)
		}
	}
	deftAllocate(d.kf, d.frags, d.norms, d.k)
	cycle := t % d.n
	if d.r == cycle {
		deftPack(d.frags, d.kf, d.n, d.lens, d.content)
	}
	selTime := time.Since(t0)

	// The leader's bins, through device memory.
	L := len(d.frags)
	wire, err := v.scratch(&b.dCounts, device.Int32, d.n+L)
	if err != nil {
		return Stats{}, err
	}
	if d.r == cycle {
		if err := v.upload(wire, append(append([]int32(nil), d.lens...), d.content...)); err != nil {
			return Stats{}, err
		}
	}
	if err := d.c.Broadcast(ctx, v.cb(wire.Slice(0, d.n)), cycle); err != nil {
		return Stats{}, fmt.Errorf("sparsify: deft: broadcasting bin lengths from leader %d: %w", cycle, err)
	}
	if err := d.c.Broadcast(ctx, v.cb(wire.Slice(d.n, d.n+L)), cycle); err != nil {
		return Stats{}, fmt.Errorf("sparsify: deft: broadcasting bins from leader %d: %w", cycle, err)
	}
	if err := v.download(d.lens, wire); err != nil {
		return Stats{}, err
	}
	if err := v.download(d.content, wire.Slice(d.n, d.n+L)); err != nil {
		return Stats{}, err
	}
	binStart, total := 0, 0
	myBin := (cycle + d.r) % d.n
	for bb, nv := range d.lens {
		if nv < 0 || total+int(nv) > L {
			return Stats{}, fmt.Errorf("sparsify: deft: corrupt bins from leader %d (bin %d has length %d, %d fragments in all)", cycle, bb, nv, L)
		}
		if bb == myBin {
			binStart = total
		}
		total += int(nv)
	}
	for _, f := range d.content {
		if f < 0 || int(f) >= L {
			return Stats{}, fmt.Errorf("sparsify: deft: corrupt bins from leader %d (fragment id %d of %d)", cycle, f, L)
		}
	}
	bin := d.content[binStart : binStart+int(d.lens[myBin])]
	common := d.content[total:]

	// Top-k of every fragment of my bin, with my own k_f.
	want := 0
	for _, f := range bin {
		want += d.kf[f]
	}
	mine, err := v.scratch(&b.dSel, device.Int32, want)
	if err != nil {
		return Stats{}, err
	}
	pos := 0
	sel, err := b.timed(func() error {
		for _, f := range bin {
			fr := d.frags[f]
			dst := mine.Slice(pos, pos+d.kf[f])
			m, err := v.ops.TopK(v.s, dst, device.Buffer{}, acc.Slice(fr.lo, fr.hi), d.kf[f])
			if err != nil {
				return err
			}
			if err := v.ops.Shift(v.s, dst.Slice(0, m), fr.lo); err != nil {
				return err
			}
			pos += m
		}
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("sparsify: deft: %w", err)
	}
	selTime += sel

	all, counts, err := b.gatherIndicesOn(ctx, mine.Slice(0, pos))
	if err != nil {
		return Stats{}, fmt.Errorf("sparsify: deft: %w", err)
	}
	// The union: the gathered lists, then every index of every common
	// fragment (disjoint fragments: no duplicates).
	ncommon := 0
	for _, f := range common {
		ncommon += d.frags[f].size()
	}
	union, err := v.scratch(&b.dUnion, device.Int32, all.Len()+ncommon)
	if err != nil {
		return Stats{}, err
	}
	if err := v.s.Copy(union.Slice(0, all.Len()), all); err != nil {
		return Stats{}, err
	}
	at := all.Len()
	for _, f := range common {
		fr := d.frags[f]
		if err := v.ops.Iota(v.s, union.Slice(at, at+fr.size()), fr.lo); err != nil {
			return Stats{}, err
		}
		at += fr.size()
	}
	if err := b.unionReduceOn(ctx, acc, out, residual, union); err != nil {
		return Stats{}, fmt.Errorf("sparsify: deft: %w", err)
	}

	st, err := b.finish(before, selTime, residual)
	st.Density = d.o.Density
	st.Selected = pos
	st.SelectedPerWorker = counts
	st.ActualDensity = float64(union.Len()) / float64(N)
	tb := append(append([]int(nil), d.starts...), N)
	if st.LayerK, err = v.ops.CountIn(v.s, union, tb); err != nil {
		return Stats{}, err
	}
	return st, nil
}
