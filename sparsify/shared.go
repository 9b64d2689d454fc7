package sparsify

import (
	"context"
	"fmt"
	"math"
	"runtime"
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

// sumSquares is the sum of x[i]² in float64, accumulated in four interleaved
// partial sums (element i into sum i mod 4, the last len(x) mod 4 elements
// into sum 0) combined as (s0+s1)+(s2+s3): four independent dependency chains
// make it several times faster than one running sum. The explicit conversions
// keep the compiler from fusing multiply and add, so the result is the same on
// every platform.
func sumSquares(x []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(x); i += 4 {
		a, b, c, d := float64(x[i]), float64(x[i+1]), float64(x[i+2]), float64(x[i+3])
		s0 += float64(a * a)
		s1 += float64(b * b)
		s2 += float64(c * c)
		s3 += float64(d * d)
	}
	for ; i < len(x); i++ {
		a := float64(x[i])
		s0 += float64(a * a)
	}
	return (s0 + s1) + (s2 + s3)
}

// norm2Block is the number of elements norm2 sums per block.
const norm2Block = 1 << 16

// norm2 is the Euclidean norm of x. The squares are summed in float64 per
// block of norm2Block elements (four interleaved partial sums, as deftNorm),
// blocks on all cores, and the block sums are added in block order, so the
// result does not depend on the number of cores.
func norm2(x []float32) float64 {
	nb := (len(x) + norm2Block - 1) / norm2Block
	if nb <= 1 {
		return math.Sqrt(sumSquares(x))
	}
	sums := make([]float64, nb)
	selParallel(nb, min(nb, runtime.GOMAXPROCS(0)), func(_, lo, hi int) {
		for b := lo; b < hi; b++ {
			sums[b] = sumSquares(x[b*norm2Block : min(len(x), (b+1)*norm2Block)])
		}
	})
	var s float64
	for _, v := range sums {
		s += v
	}
	return math.Sqrt(s)
}
