package sparsify

import (
	"context"
	"fmt"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

func init() {
	Register(Method{Name: "gtopk", New: newGtopkReducer, CheckWorkers: gtopkCheckWorkers})
}

// gtopkTag is the point-to-point tag of gTop-k's tree messages (the values
// travel with gtopkTag+1).
const gtopkTag = 0x67746b00

// gtopkReducer is "gtopk", Shi et al.'s gTop-k (hclhkbu/gtopkssgd,
// gtopk_sparse_allreduce; reference notes 7.7). The number of workers P must
// be a power of two (1, 2, 4, 8, ...).
//
//   - k = BudgetK(density, N) = ⌊ρN⌋ clamped to [1, N]; each worker takes the
//     exact top-k of its acc (ties to lower indices) as its k candidates.
//   - log2(P) rounds: in round i the participants are the ranks divisible by
//     2^i; a participant at an odd position (rank/2^i odd) sends its k
//     candidates to rank − 2^i and drops out; one at an even position
//     receives k candidates from rank + 2^i, adds the received values to its
//     own at common indices, and keeps the top-k by magnitude of the merged
//     candidates (ties to lower indices).
//   - Rank 0 broadcasts the final k pairs; out = value/P at those indices
//     and 0 elsewhere.
//   - residual = acc with the indices that are both in this worker's own
//     selection and in the global set zeroed (the reference zeroes its own
//     selection and adds back the selected values whose index is not in the
//     global set, which is the same).
//
// Wire format (a documented deviation): the reference packs the k indices as
// float32 into one buffer of 2k floats, which is exact only for indices below
// 2^24; here every message is two messages of k elements, the indices as
// int32 (tag gtopkTag) and the values as float32 (tag gtopkTag+1), so the
// byte count, 8k per message, is the reference's. The final broadcast is
// likewise k int32 then k float32. A second deviation: at common indices the
// reference leaves a zero-valued duplicate in the received copy among the 2k
// candidates; here the candidates are merged into distinct indices, which
// differs only when fewer than k candidates have a non-zero magnitude (the
// reference could then return a duplicate index).
//
// Conservation does not hold in general, as in the reference: a worker's
// value at an index that its subtree dropped during a merge but that reached
// the global set through another subtree is neither in out nor in that
// worker's residual. It holds when no index is dropped in one subtree and
// kept by another, e.g. for P = 1 or when all workers select the same
// indices.
//
// Stats: Selected = k, ActualDensity = k/N (the global set, which is what the
// broadcast carries; tree messages carry k indices each), Threshold = NaN.
type gtopkReducer struct {
	base base
	sel  []int32
	idx  []int32 // current candidates (ascending indices)
	val  []float32
	ridx []int32 // received candidates
	rval []float32
	midx []int32 // merged candidates
	mval []float32
	pick []int32
}

func newGtopkReducer(o Options) (Reducer, error) {
	return &gtopkReducer{base: newBase("gtopk", o)}, nil
}

// gtopkCheckWorkers refuses worker counts that are not powers of two.
func gtopkCheckWorkers(p int, _ Values) error {
	if p < 1 || p&(p-1) != 0 {
		return fmt.Errorf("sparsify: gtopk: %d workers; gTop-k's tree needs a power-of-two number of workers (1, 2, 4, 8, 16, ...): use %d or %d workers, or another method", p, gtopkPrevPow2(p), 2*gtopkPrevPow2(p))
	}
	return nil
}

// gtopkPrevPow2 is the largest power of two <= p (1 for p < 1).
func gtopkPrevPow2(p int) int {
	q := 1
	for q*2 <= p {
		q *= 2
	}
	return q
}

// Name returns "gtopk".
func (r *gtopkReducer) Name() string { return "gtopk" }

// Reduce runs the gTop-k tree reduction and the final broadcast.
func (r *gtopkReducer) Reduce(ctx context.Context, acc, out, residual []float32) (Stats, error) {
	b := &r.base
	if err := b.checkArgs(acc, out, residual); err != nil {
		return Stats{}, err
	}
	before := b.c.Totals()
	t0 := time.Now()
	r.sel = TopK(r.sel, acc, b.k)
	selTime := time.Since(t0)
	k := len(r.sel)
	r.idx = append(r.idx[:0], r.sel...)
	r.val = valuesAt(r.val, acc, r.sel)
	r.ridx = grow(r.ridx, k)
	r.rval = grow(r.rval, k)
	rank, p := b.c.Rank(), b.c.Size()
	for step := 1; step < p; step *= 2 {
		if rank%step != 0 {
			break // dropped out in an earlier round
		}
		if (rank/step)%2 == 1 {
			dst := rank - step
			if err := b.c.Send(ctx, comm.Int32s(r.idx), dst, gtopkTag); err != nil {
				return Stats{}, fmt.Errorf("sparsify: gtopk: sending %d indices to rank %d: %w", k, dst, err)
			}
			if err := b.c.Send(ctx, comm.Float32s(r.val), dst, gtopkTag+1); err != nil {
				return Stats{}, fmt.Errorf("sparsify: gtopk: sending %d values to rank %d: %w", k, dst, err)
			}
			break
		}
		src := rank + step
		if err := r.recv(ctx, src, k); err != nil {
			return Stats{}, err
		}
		t1 := time.Now()
		r.merge(k)
		selTime += time.Since(t1)
	}
	if err := b.c.Broadcast(ctx, comm.Int32s(r.idx), 0); err != nil {
		return Stats{}, fmt.Errorf("sparsify: gtopk: broadcasting the %d global indices: %w", k, err)
	}
	if err := b.c.Broadcast(ctx, comm.Float32s(r.val), 0); err != nil {
		return Stats{}, fmt.Errorf("sparsify: gtopk: broadcasting the %d global values: %w", k, err)
	}
	clear(out)
	inv := 1 / float32(p)
	for i, j := range r.idx {
		if j < 0 || int(j) >= b.n || (i > 0 && j <= r.idx[i-1]) {
			return Stats{}, fmt.Errorf("sparsify: gtopk: rank 0 broadcast index %d at position %d, not ascending within [0, %d): the workers disagree on the layout", j, i, b.n)
		}
		out[j] = r.val[i] * inv
	}
	if &residual[0] != &acc[0] {
		copy(residual, acc)
	}
	// Zero the residual at own selection ∩ global set; both are ascending.
	g := 0
	for _, j := range r.sel {
		for g < len(r.idx) && r.idx[g] < j {
			g++
		}
		if g < len(r.idx) && r.idx[g] == j {
			residual[j] = 0
		}
	}
	st := b.stats(before, selTime)
	st.Selected = k
	st.ActualDensity = float64(k) / float64(b.n)
	st.ErrorNorm = norm2(residual)
	return st, nil
}

// recv receives k candidates from rank src into ridx, rval.
func (r *gtopkReducer) recv(ctx context.Context, src, k int) error {
	c := r.base.c
	m, err := c.Recv(ctx, comm.Int32s(r.ridx), src, gtopkTag)
	if err != nil {
		return fmt.Errorf("sparsify: gtopk: receiving indices from rank %d: %w", src, err)
	}
	if m != k {
		return fmt.Errorf("sparsify: gtopk: rank %d sent %d indices, want %d: the workers disagree on the layout or density", src, m, k)
	}
	m, err = c.Recv(ctx, comm.Float32s(r.rval), src, gtopkTag+1)
	if err != nil {
		return fmt.Errorf("sparsify: gtopk: receiving values from rank %d: %w", src, err)
	}
	if m != k {
		return fmt.Errorf("sparsify: gtopk: rank %d sent %d values, want %d: the workers disagree on the layout or density", src, m, k)
	}
	for i, j := range r.ridx {
		if j < 0 || int(j) >= r.base.n || (i > 0 && j <= r.ridx[i-1]) {
			return fmt.Errorf("sparsify: gtopk: rank %d sent index %d at position %d, not ascending within [0, %d): the workers disagree on the layout", src, j, i, r.base.n)
		}
	}
	return nil
}

// merge merges the received candidates into the own ones (both ascending by
// index): values at common indices are added (own + received), then the k
// largest magnitudes are kept, ties to lower indices.
func (r *gtopkReducer) merge(k int) {
	r.midx, r.mval = mergeSum(r.midx[:0], r.mval[:0], r.idx, r.val, r.ridx, r.rval)
	r.pick = TopK(r.pick, r.mval, k)
	r.idx, r.val = r.idx[:0], r.val[:0]
	for _, q := range r.pick {
		r.idx = append(r.idx, r.midx[q])
		r.val = append(r.val, r.mval[q])
	}
}
