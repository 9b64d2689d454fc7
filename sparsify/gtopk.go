package sparsify

import (
	"context"
	"fmt"
	"math/bits"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "gtopk", TopKOfAcc: true, NotProjectable: "gTop-k's tree has log₂(workers) rounds", New: newGtopk, CheckWorkers: gtopkCheckWorkers, Advice: gtopkAdvice,
		Doc: "reference notes 7.7: Shi et al.'s gTop-k tree merge, power-of-two worker counts. Deviations: indices and values as two messages (int32, float32) instead of indices packed as float32 (exact only below 2^24); merged candidates have distinct indices."})
}

// gtopkTag is the point-to-point tag of gTop-k's tree messages (the values
// travel with gtopkTag+1).
const gtopkTag = 0x67746b00

// gtopk is "gtopk", Shi et al.'s gTop-k (hclhkbu/gtopkssgd,
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
type gtopk struct {
	b *Env
	// Device scratch: own selection, current candidates, received ones,
	// merged ones, the merge's dense scratch.
	sel, cur, recv, merged, pick, inter device.Buffer // Int32
	selVal, curVal, recvVal, mergedVal  device.Buffer // Float32
	dn                                  denseScratch
}

func newGtopk(e *Env) (Core, error) { return &gtopk{b: e}, nil }

// gtopkCheckWorkers refuses worker counts that are not powers of two.
func gtopkCheckWorkers(p int, _ Values) error {
	if p < 1 || p&(p-1) != 0 {
		return fmt.Errorf("%d workers; gTop-k's tree needs a power-of-two number of workers (1, 2, 4, 8, 16, ...): use %d or %d workers, or another method", p, gtopkPrevPow2(p), 2*gtopkPrevPow2(p))
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

// Reduce runs the gTop-k tree reduction and the final broadcast: the
// tree's messages are device buffers, the merges are dense sums on the
// device (mergeOn), a received or broadcast list is checked to hold k
// distinct indices within [0, N).
func (r *gtopk) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	bufs := []struct {
		b  *device.Buffer
		dt device.DType
		n  int
	}{{&r.sel, device.Int32, b.k}, {&r.cur, device.Int32, b.k}, {&r.recv, device.Int32, b.k}, {&r.merged, device.Int32, 2 * b.k},
		{&r.pick, device.Int32, b.k}, {&r.inter, device.Int32, b.k}, {&r.selVal, device.Float32, b.k}, {&r.curVal, device.Float32, b.k},
		{&r.recvVal, device.Float32, b.k}, {&r.mergedVal, device.Float32, 2 * b.k}}
	for _, bb := range bufs {
		if _, err := v.scratch(bb.b, bb.dt, bb.n); err != nil {
			return err
		}
	}
	k := 0
	selTime, err := b.selectTimed(func() error {
		var err error
		k, err = b.topKAcc(r.sel, r.selVal, acc, b.k)
		return err
	})
	if err != nil {
		return err
	}
	sel, cur, curVal := r.sel.Slice(0, k), r.cur.Slice(0, k), r.curVal.Slice(0, k)
	if err := v.s.Copy(cur, sel); err != nil {
		return err
	}
	if err := v.s.Copy(curVal, r.selVal.Slice(0, k)); err != nil {
		return err
	}
	rank, p := b.c.Rank(), b.c.Size()
	for step := 1; step < p; step *= 2 {
		if rank%step != 0 {
			break // dropped out in an earlier round
		}
		if (rank/step)%2 == 1 {
			dst := rank - step
			if err := b.c.Send(ctx, v.cb(cur), dst, gtopkTag); err != nil {
				return fmt.Errorf("sending %d indices to rank %d: %w", k, dst, err)
			}
			if err := b.c.Send(ctx, v.cb(curVal), dst, gtopkTag+1); err != nil {
				return fmt.Errorf("sending %d values to rank %d: %w", k, dst, err)
			}
			break
		}
		src := rank + step
		ridx, rval := r.recv.Slice(0, k), r.recvVal.Slice(0, k)
		if err := r.recvFrom(ctx, src, ridx, rval); err != nil {
			return err
		}
		// Merge: values at common indices added (own + received), then the
		// k largest magnitudes kept (ties to lower indices).
		t1, err := b.selectTimed(func() error {
			m, err := v.mergeOn(&r.dn, b.n, [][2]device.Buffer{{cur, curVal}, {ridx, rval}}, r.merged, r.mergedVal)
			if err != nil {
				return err
			}
			pick := r.pick.Slice(0, k)
			if _, err := v.ops.TopK(v.s, pick, device.Buffer{}, r.mergedVal.Slice(0, m), k); err != nil {
				return err
			}
			if err := v.ops.GatherIndex(v.s, cur, r.merged, pick); err != nil {
				return err
			}
			return v.ops.Gather(v.s, curVal, r.mergedVal, pick)
		})
		if err != nil {
			return err
		}
		selTime += t1
	}
	if err := b.c.Broadcast(ctx, v.cb(cur), 0); err != nil {
		return fmt.Errorf("broadcasting the %d global indices: %w", k, err)
	}
	if err := b.c.Broadcast(ctx, v.cb(curVal), 0); err != nil {
		return fmt.Errorf("broadcasting the %d global values: %w", k, err)
	}
	if err := b.checkList(cur, k, "rank 0 broadcast"); err != nil {
		return err
	}
	if err := v.m.Fill(v.s, out, 0); err != nil {
		return err
	}
	if err := v.ops.Scatter(v.s, out, cur, curVal, 1/float32(p)); err != nil {
		return err
	}
	// The residual: acc with own selection ∩ global set zeroed.
	m, err := v.intersectOn(&r.dn, b.n, cur, sel, r.inter)
	if err != nil {
		return err
	}
	if err := b.residualWithout(residual, acc, r.inter.Slice(0, m)); err != nil {
		return err
	}
	st.SelectTime = selTime
	st.Selected = k
	st.Distinct = k
	return nil
}

// recvFrom receives k candidates from rank src into idx and val and checks
// them.
func (r *gtopk) recvFrom(ctx context.Context, src int, idx, val device.Buffer) error {
	b := r.b
	k := idx.Len()
	m, err := b.c.Recv(ctx, b.v.cb(idx), src, gtopkTag)
	if err != nil {
		return fmt.Errorf("receiving indices from rank %d: %w", src, err)
	}
	if m != k {
		return fmt.Errorf("rank %d sent %d indices, want %d: the workers disagree on the layout or density", src, m, k)
	}
	m, err = b.c.Recv(ctx, b.v.cb(val), src, gtopkTag+1)
	if err != nil {
		return fmt.Errorf("receiving values from rank %d: %w", src, err)
	}
	if m != k {
		return fmt.Errorf("rank %d sent %d values, want %d: the workers disagree on the layout or density", src, m, k)
	}
	return b.checkList(idx, k, fmt.Sprintf("rank %d sent", src))
}

// gtopkAdvice: rank s.Rank's part of the tree (rank 0 receives k indices
// and k values in each of the log₂ P rounds; rank r > 0 receives in the
// rounds before its position turns odd, as many as the trailing zeros of
// r, and then sends its candidates once), then the result's indices and
// values broadcast.
var gtopkAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		rounds := 0
		if s.P > 1 {
			rounds = bits.Len(uint(s.P - 1))
		}
		recvs, sends := rounds, 0
		if s.Rank > 0 {
			recvs, sends = bits.TrailingZeros(uint(s.Rank)), 1
		}
		K := float64(s.K)
		calls := []Call{{comm.OpRecv, float64(2 * recvs), K}}
		if sends > 0 {
			calls = append(calls, Call{comm.OpSend, float64(2 * sends), K})
		}
		return append(calls, Call{comm.OpBroadcast, 2, K}), nil
	},
	Volume:    budgetVolume,
	Selection: SelectsWhole,
	Caveats: func(Conditions) []string {
		return []string{"the tree's merges at the root are counted as at 2 workers"}
	},
	Evidence: Evidence{Shown: []ModelKind{CNN, RNN},
		Papers: "gTop-k paper: VGG-16, ResNet-20 on CIFAR-10, ResNet-50 on ImageNet, LSTM-PTB; similar accuracy in SparDL's comparisons (VGG, ResNet-20, LSTM on IMDB)"},
}
