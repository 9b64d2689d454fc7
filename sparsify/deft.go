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
	Register(Method{Name: "deft", NotProjectable: "the union of DEFT's selected indices, which every worker all-reduces, grows with the worker count", New: newDeft, Advice: deftAdvice,
		Doc: "reference notes 2: DEFT's fragments, norm-proportional per-fragment budgets and LPT bin packing by a rotating leader. The budgets follow the authors' greedy rule (descending norm, each fragment max(1, ⌊remain_k·norm/remain_norm⌋) capped at its size; the total can end a little below or above k). Deviations: that share is computed exactly, where the reference's floating-point remain_norm can floor a share of 3 to 2; empty fragments (N < n² only) get no budget instead of crashing; a NaN or infinite acc is an error; the leader broadcasts its fragments' norms, not its bins, and every worker packs the leader's bins from them (the same bins, one broadcast instead of two)."})
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
	b      *Env
	n, r   int // workers, rank
	k      int
	frags  []deftFrag
	starts []int
	segs   []int // the fragments' bounds: fragment f is [segs[f], segs[f+1])

	// The fragments' sums of squares (the worker's, then the leader's:
	// dSums on the device, ss on the host), norms and budgets.
	dSums               device.Buffer
	ss                  []float64
	normsOwn, normsLead []float64
	alloc               deftAllocator
	kf, kfLead          []int
	// The leader's bins: lens[b] fragments of content each, then the
	// common list (deftPack).
	lens, content []int32

	// The fragments of this worker's bin and their budgets
	// (Ops.TopKSegments' arguments).
	segs2 [][2]int
	binK  []int
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
//     the fragments into n bins by LPT (deftPack, cost size·log2 k_f) with
//     the leader's k_f, computed from them, fully selected fragments going
//     to a common list: the bins the reference's leader packs and
//     broadcasts (two int32 broadcasts there), the same on every worker.
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
// the allocations, the packing and the top-k selections (not the norms'
// broadcast).
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
// waits for the bins: its own norms and the leader's come back in one wait.
func newDeft(b *Env) (Core, error) {
	o := b.o
	n := o.Comm.Size()
	d := &deftReducer{b: b, n: n, r: o.Comm.Rank(), k: b.k}
	d.frags = deftFragments(o.Layout, n)
	L := len(d.frags)
	d.normsOwn, d.normsLead = make([]float64, L), make([]float64, L)
	d.kf, d.kfLead = make([]int, L), make([]int, L)
	d.lens, d.content = make([]int32, n), make([]int32, L)
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

// Reduce runs one DEFT iteration (see newDeft): every worker's fragment
// norms are summed on the device, where the leader's are broadcast; each
// worker reads its own and the leader's in one wait, allocates its own
// budgets and packs the leader's bins (the leader's allocation, the same on
// every worker); each fragment's top-k is selected on the device.
func (d *deftReducer) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := d.b
	N := b.n
	v := &b.v
	t := b.calls
	L := len(d.frags)
	cycle := t % d.n

	// The fragments' sums of squares: this worker's in sums[:L], the
	// leader's broadcast into sums[L:] (the leader's own on the leader),
	// read back together.
	t0 := time.Now()
	sums, err := v.scratch(&d.dSums, device.Float64, 2*L)
	if err != nil {
		return err
	}
	if err := v.ops.SegmentSumSquaresTo(v.s, sums.Slice(0, L), acc, d.segs); err != nil {
		return err
	}
	read, lead := L, sums.Slice(0, L)
	if d.r != cycle {
		read, lead = 2*L, sums.Slice(L, 2*L)
	}
	// As int32 words, the wire format's type (the bits travel as they
	// are); the time it waits for the leader is not selection time.
	tBcast := time.Now()
	if err := b.c.Broadcast(ctx, v.cb(lead.View(device.Int32, 0, 2*L)), cycle); err != nil {
		return fmt.Errorf("broadcasting the fragments' norms from leader %d: %w", cycle, err)
	}
	commTime := time.Since(tBcast)
	d.ss = grow(d.ss, read)
	if err := v.s.Copy(device.Host(d.ss), sums.Slice(0, read)); err != nil {
		return err
	}
	if err := v.s.Synchronize(); err != nil { // one wait for both
		return err
	}
	if err := d.norms(d.normsOwn, d.ss[:L], "acc holds", "the gradient diverged"); err != nil {
		return err
	}
	d.alloc.allocate(d.kf, d.frags, d.normsOwn, d.k)
	kfLead := d.kf
	if read == 2*L {
		if err := d.norms(d.normsLead, d.ss[L:], fmt.Sprintf("the norms broadcast by leader %d hold", cycle), "the leader's gradient diverged"); err != nil {
			return err
		}
		d.alloc.allocate(d.kfLead, d.frags, d.normsLead, d.k)
		kfLead = d.kfLead
	}
	// Every worker packs the leader's bins from the leader's budgets.
	deftPack(d.frags, kfLead, d.n, d.lens, d.content)
	selTime := time.Since(t0) - commTime

	binStart, total := 0, 0
	myBin := (cycle + d.r) % d.n
	for bb, nv := range d.lens {
		if bb == myBin {
			binStart = total
		}
		total += int(nv)
	}
	bin := d.content[binStart : binStart+int(d.lens[myBin])]
	common := d.content[total:]

	// Top-k of every fragment of my bin, with my own k_f.
	want := 0
	for _, f := range bin {
		want += d.kf[f]
	}
	// Sized for the whole budget: a bin's share varies from call to call
	// (the bins rotate), the buffer need not.
	mine, err := v.scratch(&b.dSel, device.Int32, max(want, d.k))
	if err != nil {
		return err
	}
	mine = mine.Slice(0, want)
	// Every fragment of the bin at once (a bounded number of launches on a
	// GPU, whatever the bin holds).
	d.segs2, d.binK = d.segs2[:0], d.binK[:0]
	for _, f := range bin {
		fr := d.frags[f]
		d.segs2 = append(d.segs2, [2]int{fr.lo, fr.hi})
		d.binK = append(d.binK, d.kf[f])
	}
	pos := 0
	sel, err := b.selectTimed(func() error {
		var err error
		pos, err = v.ops.TopKSegments(v.s, mine, acc, d.segs2, d.binK)
		return err
	})
	if err != nil {
		return err
	}
	selTime += sel

	all, counts, err := b.gatherIndicesOn(ctx, mine.Slice(0, pos))
	if err != nil {
		return err
	}
	// The union: the gathered lists, then every index of every common
	// fragment (disjoint fragments: no duplicates).
	ncommon := 0
	for _, f := range common {
		ncommon += d.frags[f].size()
	}
	union, err := b.listScratch(&b.dUnion, device.Int32, all.Len()+ncommon)
	if err != nil {
		return err
	}
	if err := v.s.Copy(union.Slice(0, all.Len()), all); err != nil {
		return err
	}
	at := all.Len()
	for _, f := range common {
		fr := d.frags[f]
		if err := v.ops.Iota(v.s, union.Slice(at, at+fr.size()), fr.lo); err != nil {
			return err
		}
		at += fr.size()
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
	st.Selected = pos
	st.SelectedPerWorker = counts
	st.Distinct = union.Len()
	return nil
}

// norms sets norms to the square roots of the fragments' sums of squares
// ss, which must be finite: the error says what holds the first that is
// not (what) and why (cause).
func (d *deftReducer) norms(norms, ss []float64, what, cause string) error {
	for f, q := range ss {
		nv := math.Sqrt(q)
		if math.IsNaN(nv) || math.IsInf(nv, 0) {
			fr := d.frags[f]
			return fmt.Errorf("%s NaN or infinite values in fragment %d (tensor %q, elements %d..%d): %s (lower the learning rate or clip gradients)", what, f, d.b.o.Layout.Tensors[fr.tensor].Name, fr.lo, fr.hi, cause)
		}
		norms[f] = nv
	}
	return nil
}

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
