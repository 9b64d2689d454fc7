package sparsify

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/sparsegrad/sparsegrad/comm"
)

// gatherIndices all-gathers every worker's selected indices in the wire format
// of the DEFT/MiCRO reference code: one int64 count per worker, then every
// worker's list padded to the largest count, as int64. It returns each worker's
// list (slices of one buffer) and the counts.
func gatherIndices(ctx context.Context, c comm.Communicator, mine []int32) ([][]int32, []int, error) {
	n := c.Size()
	cnt := make([]int64, n)
	if err := c.AllGather(ctx, comm.Int64s{int64(len(mine))}, comm.Int64s(cnt)); err != nil {
		return nil, nil, fmt.Errorf("gathering index counts: %w", err)
	}
	maxc := 0
	counts := make([]int, n)
	for i, v := range cnt {
		counts[i] = int(v)
		maxc = max(maxc, int(v))
	}
	send := make([]int64, maxc)
	for i, v := range mine {
		send[i] = int64(v)
	}
	recv := make([]int64, n*maxc)
	if err := c.AllGather(ctx, comm.Int64s(send), comm.Int64s(recv)); err != nil {
		return nil, nil, fmt.Errorf("gathering indices: %w", err)
	}
	flat := make([]int32, 0, n*maxc)
	all := make([][]int32, n)
	for w := range n {
		start := len(flat)
		for _, v := range recv[w*maxc : w*maxc+counts[w]] {
			flat = append(flat, int32(v))
		}
		all[w] = flat[start:len(flat):len(flat)]
	}
	return all, counts, nil
}

// sortedUnion returns the sorted distinct indices of all lists.
func sortedUnion(lists [][]int32) []int32 {
	total := 0
	for _, l := range lists {
		total += len(l)
	}
	u := make([]int32, 0, total)
	for _, l := range lists {
		u = append(u, l...)
	}
	slices.Sort(u)
	return slices.Compact(u)
}

// unionReduce is the shared-union all-reduce of the DEFT/MiCRO reference code:
// every worker contributes its own acc value at every index of union (which
// must be identical on all ranks and free of duplicates), the values are
// summed over workers, out receives sum/n at the union and zero elsewhere, and
// residual becomes acc with the whole union zeroed. residual may alias acc.
func unionReduce(ctx context.Context, c comm.Communicator, acc, out, residual []float32, union []int32) error {
	vals := make([]float32, len(union))
	for i, j := range union {
		vals[i] = acc[j]
	}
	if err := c.AllReduce(ctx, comm.Float32s(vals)); err != nil {
		return fmt.Errorf("all-reducing %d selected values: %w", len(vals), err)
	}
	clear(out)
	inv := 1 / float32(c.Size())
	for i, j := range union {
		out[j] = vals[i] * inv
	}
	if &residual[0] != &acc[0] {
		copy(residual, acc)
	}
	for _, j := range union {
		residual[j] = 0
	}
	return nil
}

// norm2 is the Euclidean norm of x, accumulated in float64.
func norm2(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}
