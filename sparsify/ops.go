package sparsify

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"

	"github.com/sparsegrad/sparsegrad/device"
)

// Ops are the passes over whole vectors that the reducers make — the O(N)
// part of sparsification — on one device: CPUOps here, a GPU's in package
// cuda (cuda.Sparse), which gives the same results for the same input (the
// same index sets in the same order; the same bits, sums of squares
// included). The reducers' control (budgets, bin packing, thresholds,
// schedules) stays host-side Go; only counts and a few numbers per tensor
// come back from the device.
//
// Buffers are device.Float32 vectors and device.Int32 index lists of the
// Ops' device; a call's work is issued on stream s (on the CPU it is done
// when the call returns; calls that return numbers synchronize s).
type Ops interface {
	// Accumulate adds scale·g to r element-wise and returns the index of
	// the first element of r that became NaN or ±Inf, or −1.
	Accumulate(s device.Stream, r, g device.Buffer, scale float32) (int, error)
	// SegmentSumSquares returns, for each segment [bounds[j], bounds[j+1])
	// of x, SegmentSumSquares of the CPU (see segmentSumSquares): blocks of
	// 4096 elements from the segment's start, each summed in float64 in
	// four interleaved partial sums, added in block order.
	SegmentSumSquares(s device.Stream, x device.Buffer, bounds []int) ([]float64, error)
	// SegmentSumSquaresTo is SegmentSumSquares that leaves the sums where
	// sums is (a Float64 vector of len(bounds)−1 elements, on the device):
	// no host wait; the caller copies them back with a wait it makes
	// anyway, or hands them to a collective first (DEFT's leader
	// broadcasts its fragments' sums).
	SegmentSumSquaresTo(s device.Stream, sums, x device.Buffer, bounds []int) error
	// TopK writes the indices of the k largest-magnitude elements of x into
	// idx[:k] in ascending order (ties to the lowest indices) and, unless
	// val is empty, the elements into val[:k]; k is clamped to [0, len(x)]
	// and returned (see TopK).
	TopK(s device.Stream, idx, val, x device.Buffer, k int) (int, error)
	// KthLargestAbs returns the k-th largest |x[i]| (see KthLargestAbs).
	KthLargestAbs(s device.Stream, x device.Buffer, k int) (float32, error)
	// SelectAbove writes the indices with |x[i]| >= t into idx, ascending,
	// and unless val is empty the elements into val, and returns how many;
	// when a buffer is too short it writes nothing and returns the count
	// with an error (see SelectAbove).
	SelectAbove(s device.Stream, idx, val, x device.Buffer, t float32) (int, error)
	// CountAbove returns the number of elements with |x[i]| >= t (NaN
	// never counted), SelectAbove's count without the indices.
	CountAbove(s device.Stream, x device.Buffer, t float32) (int, error)
	// Gather sets dst[j] = x[idx[j]] for j < len(dst).
	Gather(s device.Stream, dst, x, idx device.Buffer) error
	// GatherIndex is Gather of int32 elements: dst[j] = x[idx[j]].
	GatherIndex(s device.Stream, dst, x, idx device.Buffer) error
	// GatherStrided sets dst[j] = x[start + j·stride] for j < len(dst).
	GatherStrided(s device.Stream, dst, x device.Buffer, start, stride int) error
	// ScatterAdd adds scale·val[j] to dst[idx[j]] for j < len(idx)
	// (distinct indices).
	ScatterAdd(s device.Stream, dst, idx, val device.Buffer, scale float32) error
	// ScatterAccum adds a list into a sparse sum kept densely: for each j,
	// where mark[idx[j]] is 0 it sets dst[idx[j]] = val[j] and the mark to
	// 1, elsewhere it adds val[j] (distinct indices within the list). A
	// list's value is thus kept as it is where no earlier list had one (a
	// −0 stays −0), as a merge of sorted lists keeps it.
	ScatterAccum(s device.Stream, dst, mark, idx, val device.Buffer) error
	// ScatterFill sets dst[idx[j]] = v for j < len(idx).
	ScatterFill(s device.Stream, dst, idx device.Buffer, v float32) error
	// Scatter sets dst[idx[j]] = scale·val[j] for j < len(idx).
	Scatter(s device.Stream, dst, idx, val device.Buffer, scale float32) error
	// Div divides every element of x by d (x[i] / d, not x[i]·(1/d)).
	Div(s device.Stream, x device.Buffer, d float32) error
	// Iota sets idx[j] = start + j.
	Iota(s device.Stream, idx device.Buffer, start int) error
	// CountIn returns, for each segment [bounds[j], bounds[j+1]), how many
	// indices of idx lie in it (bounds ascending; indices outside them are
	// not counted).
	CountIn(s device.Stream, idx device.Buffer, bounds []int) ([]int, error)
	// InRange returns an error naming the first index of idx outside
	// [0, n), if any.
	InRange(s device.Stream, idx device.Buffer, n int) error
	// Shift adds off to every index of idx.
	Shift(s device.Stream, idx device.Buffer, off int) error
	// Union writes the distinct indices of idx, ascending, into out (at
	// least len(idx) long) and returns how many; an index outside [0, n)
	// is an error naming it.
	Union(s device.Stream, out, idx device.Buffer, n int) (int, error)
	// CompactSlots writes x[j] − 1 for every non-zero word x[j] of the
	// Int32 vector x, in order, into idx and returns how many: the
	// occupied slots of a table that stores an index plus one and 0 for
	// "empty" (DRAGONN's hashed selection). When idx is too short it
	// writes nothing and returns the count with an error (ErrCapacity).
	CompactSlots(s device.Stream, idx, x device.Buffer) (int, error)
	// Run runs a method's own kernel k over n elements with args (see
	// device.Kernel): the CPU runs k.Host, a GPU k's CUDA C.
	Run(s device.Stream, k *device.Kernel, n int, args ...any) error
	// TopKSegments is TopK of every segment of x at once: for each j in
	// order, the indices of the ks[j] largest-magnitude elements of
	// x[segs[j][0]:segs[j][1]] (k clamped to the segment, ascending, ties
	// to the lowest), shifted by segs[j][0], written after those of the
	// segments before it in idx. It returns how many it wrote. A GPU
	// selects all segments in a bounded number of launches (DEFT's
	// fragments).
	TopKSegments(s device.Stream, idx, x device.Buffer, segs [][2]int, ks []int) (int, error)
	// TopKSegmentsOn is TopKSegments with the list of segments in the
	// device's memory, as a method's kernel wrote it (DEFT's bin): list is
	// an Int32 vector, its number of segments S <= maxSegs, then lo, hi
	// and k of each (1 + 3·maxSegs words). Their lengths add up to at most
	// maxLen, and idx must hold the sum of their k's (clamped to the
	// segments), which the caller knows without asking the device (the
	// kernel that wrote the list can say it). A GPU sizes its launches by
	// the bounds and reads the list there: no upload, no host wait.
	TopKSegmentsOn(s device.Stream, idx, x, list device.Buffer, maxSegs, maxLen int) error
	// KthLargestAbsSegments sets thr[j] (a Float32 vector of len(segs)
	// elements) to KthLargestAbs of x[segs[j][0]:segs[j][1]] with k =
	// ks[j], 1 <= ks[j] <= the segment's length, for every j at once. The
	// thresholds stay where thr is (no host wait on a GPU), for
	// SelectAboveSegments or a method's kernel to read.
	KthLargestAbsSegments(s device.Stream, thr, x device.Buffer, segs [][2]int, ks []int) error
	// SelectAboveSegments is SelectAbove of every segment of x at once,
	// each at its own threshold thr[j] (a Float32 vector, as
	// KthLargestAbsSegments leaves it): for each j, the indices i of
	// [segs[j][0], segs[j][1]) with |x[i]| >= thr[j] (NaN never selected,
	// a NaN threshold selects nothing), ascending, written at
	// idx[segs[j][0]:], the segment's own place (segments ascending and
	// not overlapping; idx as long as the last one's end), and how many
	// into counts[j] (an Int32 vector of len(segs) elements): on a GPU
	// left there, no host wait.
	SelectAboveSegments(s device.Stream, idx, counts, x, thr device.Buffer, segs [][2]int) error
	// CompactSlotsSegments is CompactSlots of the whole of x into idx (at
	// least len(x) long) that also returns how many of the words of each
	// segment [bounds[j], bounds[j+1]) of x are not zero (bounds
	// ascending, within x): several tables compacted at once, their
	// counts read in one host wait.
	CompactSlotsSegments(s device.Stream, idx, x device.Buffer, bounds []int) ([]int, error)
	// CountInTo is CountIn that leaves the counts where counts is (an
	// Int32 vector of len(bounds)−1 elements, on the device): no host
	// wait; the caller copies them back before a wait it makes anyway.
	CountInTo(s device.Stream, counts, idx device.Buffer, bounds []int) error
}

// ErrCapacity is wrapped by the error of an Ops call whose output buffer is
// too short; the call returns the count the buffer must hold.
var ErrCapacity = errors.New("sparsify: output buffer too short")

// CPUOps returns the CPU's Ops: package sparsify's own primitives.
func CPUOps() Ops { return cpuOps{} }

type cpuOps struct{}

// f32 and i32 return the host memory of b, checking its type and length.
func f32(op, name string, b device.Buffer, n int) ([]float32, error) {
	if b.Len() == 0 {
		if n > 0 {
			return nil, fmt.Errorf("sparsify: %s: %s is empty, want %d elements", op, name, n)
		}
		return nil, nil
	}
	if !b.IsHost() || b.DType() != device.Float32 || b.Len() < n {
		return nil, fmt.Errorf("sparsify: %s: %s is %v, want host float32 of at least %d elements", op, name, b, n)
	}
	return b.Float32s(), nil
}

func i32(op, name string, b device.Buffer, n int) ([]int32, error) {
	if b.Len() == 0 {
		if n > 0 {
			return nil, fmt.Errorf("sparsify: %s: %s is empty, want %d elements", op, name, n)
		}
		return nil, nil
	}
	if !b.IsHost() || b.DType() != device.Int32 || b.Len() < n {
		return nil, fmt.Errorf("sparsify: %s: %s is %v, want host int32 of at least %d elements", op, name, b, n)
	}
	return b.Int32s(), nil
}

func (cpuOps) Accumulate(_ device.Stream, r, g device.Buffer, scale float32) (int, error) {
	rr, err := f32("Accumulate", "r", r, 0)
	if err != nil {
		return 0, err
	}
	gg, err := f32("Accumulate", "g", g, len(rr))
	if err != nil {
		return 0, err
	}
	return accumulate(rr, gg, scale), nil
}

// accumulate adds scale·g to r on all cores and returns the first index of r
// that became NaN or ±Inf, or −1.
func accumulate(r, g []float32, scale float32) int {
	p := selChunks(len(r))
	bad := make([]int, p)
	selParallel(len(r), p, func(c, lo, hi int) { bad[c] = selAccumulate(r[lo:hi], g[lo:hi], scale, lo) })
	for _, i := range bad {
		if i >= 0 {
			return i
		}
	}
	return -1
}

func (cpuOps) SegmentSumSquares(_ device.Stream, x device.Buffer, bounds []int) ([]float64, error) {
	xx, err := f32("SegmentSumSquares", "x", x, 0)
	if err != nil {
		return nil, err
	}
	if len(bounds) < 2 {
		return nil, nil
	}
	out := make([]float64, len(bounds)-1)
	for j := range out {
		a, b := bounds[j], bounds[j+1]
		if a < 0 || b < a || b > len(xx) {
			return nil, fmt.Errorf("sparsify: SegmentSumSquares: segment %d is [%d, %d) of %d elements", j, a, b, len(xx))
		}
		out[j] = segmentSumSquares(xx[a:b])
	}
	return out, nil
}

func (c cpuOps) SegmentSumSquaresTo(s device.Stream, sums, x device.Buffer, bounds []int) error {
	got, err := c.SegmentSumSquares(s, x, bounds)
	if err != nil {
		return err
	}
	if len(got) == 0 {
		return nil
	}
	if sums.Len() < len(got) || !sums.IsHost() || sums.DType() != device.Float64 {
		return fmt.Errorf("sparsify: SegmentSumSquaresTo: sums is %v, want host float64 of at least %d elements", sums, len(got))
	}
	copy(sums.Float64s(), got)
	return nil
}

// segBlock is the block of segmentSumSquares.
const segBlock = 4096

// segmentSumSquares is Σ x[i]² in float64 as every device computes it:
// sumSquares of each block of segBlock elements, the block sums added in
// order from zero. (The fixed blocks let a GPU sum the blocks in parallel
// and still add exactly what the CPU adds.)
func segmentSumSquares(x []float32) float64 {
	nb := (len(x) + segBlock - 1) / segBlock
	var s float64
	if nb < 64 {
		for lo := 0; lo < len(x); lo += segBlock {
			s += sumSquares(x[lo:min(len(x), lo+segBlock)])
		}
		return s
	}
	sums := make([]float64, nb)
	selParallel(nb, min(nb/16, runtime.GOMAXPROCS(0)), func(_, lo, hi int) {
		for b := lo; b < hi; b++ {
			sums[b] = sumSquares(x[b*segBlock : min(len(x), (b+1)*segBlock)])
		}
	})
	for _, v := range sums {
		s += v
	}
	return s
}

func (cpuOps) TopK(_ device.Stream, idx, val, x device.Buffer, k int) (int, error) {
	xx, err := f32("TopK", "x", x, 0)
	if err != nil {
		return 0, err
	}
	k = max(0, min(k, len(xx)))
	ii, err := i32("TopK", "idx", idx, k)
	if err != nil {
		return 0, err
	}
	var vv []float32
	if val.Len() > 0 {
		if vv, err = f32("TopK", "val", val, k); err != nil {
			return 0, err
		}
	}
	sel := TopK(ii[:0:k], xx, k)
	for j, i := range sel {
		if vv != nil {
			vv[j] = xx[i]
		}
	}
	return len(sel), nil
}

func (cpuOps) KthLargestAbs(_ device.Stream, x device.Buffer, k int) (float32, error) {
	xx, err := f32("KthLargestAbs", "x", x, 0)
	if err != nil {
		return 0, err
	}
	if k < 1 || k > len(xx) {
		return 0, fmt.Errorf("sparsify: KthLargestAbs: k = %d must be in [1, %d]", k, len(xx))
	}
	return KthLargestAbs(xx, k), nil
}

func (cpuOps) SelectAbove(_ device.Stream, idx, val, x device.Buffer, t float32) (int, error) {
	xx, err := f32("SelectAbove", "x", x, 0)
	if err != nil {
		return 0, err
	}
	sel := SelectAbove(nil, xx, t)
	if idx.Len() < len(sel) || (val.Len() > 0 && val.Len() < len(sel)) {
		return len(sel), fmt.Errorf("%w: %d elements selected, the index buffer holds %d and the value buffer %d", ErrCapacity, len(sel), idx.Len(), val.Len())
	}
	ii, err := i32("SelectAbove", "idx", idx, len(sel))
	if err != nil {
		return 0, err
	}
	copy(ii, sel)
	if val.Len() > 0 {
		vv, err := f32("SelectAbove", "val", val, len(sel))
		if err != nil {
			return 0, err
		}
		for j, i := range sel {
			vv[j] = xx[i]
		}
	}
	return len(sel), nil
}

func (cpuOps) CountAbove(_ device.Stream, x device.Buffer, t float32) (int, error) {
	xx, err := f32("CountAbove", "x", x, 0)
	if err != nil {
		return 0, err
	}
	if t != t {
		return 0, nil
	}
	key := uint32(0)
	if t > 0 {
		key = math.Float32bits(t)
	}
	p := selChunks(len(xx))
	counts := make([]int, p)
	selParallel(len(xx), p, func(c, lo, hi int) {
		n := 0
		for _, v := range selBits(xx[lo:hi]) {
			k := v &^ (1 << 31)
			n += selB2I(k >= key && k <= 0x7f800000)
		}
		counts[c] = n
	})
	total := 0
	for _, n := range counts {
		total += n
	}
	return total, nil
}

func (cpuOps) Gather(_ device.Stream, dst, x, idx device.Buffer) error {
	d, err := f32("Gather", "dst", dst, 0)
	if err != nil {
		return err
	}
	xx, err := f32("Gather", "x", x, 0)
	if err != nil {
		return err
	}
	ii, err := i32("Gather", "idx", idx, len(d))
	if err != nil {
		return err
	}
	for j := range d {
		d[j] = xx[ii[j]]
	}
	return nil
}

func (cpuOps) GatherIndex(_ device.Stream, dst, x, idx device.Buffer) error {
	d, err := i32("GatherIndex", "dst", dst, 0)
	if err != nil {
		return err
	}
	xx, err := i32("GatherIndex", "x", x, 0)
	if err != nil {
		return err
	}
	ii, err := i32("GatherIndex", "idx", idx, len(d))
	if err != nil {
		return err
	}
	for j := range d {
		d[j] = xx[ii[j]]
	}
	return nil
}

func (cpuOps) GatherStrided(_ device.Stream, dst, x device.Buffer, start, stride int) error {
	d, err := f32("GatherStrided", "dst", dst, 0)
	if err != nil {
		return err
	}
	xx, err := f32("GatherStrided", "x", x, 0)
	if err != nil {
		return err
	}
	if len(d) > 0 && (start < 0 || stride < 1 || start+(len(d)-1)*stride >= len(xx)) {
		return fmt.Errorf("sparsify: GatherStrided: %d elements from %d by %d leave the %d of x", len(d), start, stride, len(xx))
	}
	for j := range d {
		d[j] = xx[start+j*stride]
	}
	return nil
}

func (cpuOps) ScatterAdd(_ device.Stream, dst, idx, val device.Buffer, scale float32) error {
	d, err := f32("ScatterAdd", "dst", dst, 0)
	if err != nil {
		return err
	}
	ii, err := i32("ScatterAdd", "idx", idx, 0)
	if err != nil {
		return err
	}
	vv, err := f32("ScatterAdd", "val", val, len(ii))
	if err != nil {
		return err
	}
	for j, i := range ii {
		d[i] += scale * vv[j]
	}
	return nil
}

func (cpuOps) ScatterAccum(_ device.Stream, dst, mark, idx, val device.Buffer) error {
	d, err := f32("ScatterAccum", "dst", dst, 0)
	if err != nil {
		return err
	}
	mk, err := f32("ScatterAccum", "mark", mark, len(d))
	if err != nil {
		return err
	}
	ii, err := i32("ScatterAccum", "idx", idx, 0)
	if err != nil {
		return err
	}
	vv, err := f32("ScatterAccum", "val", val, len(ii))
	if err != nil {
		return err
	}
	for j, i := range ii {
		if mk[i] == 0 {
			d[i], mk[i] = vv[j], 1
		} else {
			d[i] += vv[j]
		}
	}
	return nil
}

func (cpuOps) ScatterFill(_ device.Stream, dst, idx device.Buffer, v float32) error {
	d, err := f32("ScatterFill", "dst", dst, 0)
	if err != nil {
		return err
	}
	ii, err := i32("ScatterFill", "idx", idx, 0)
	if err != nil {
		return err
	}
	for _, i := range ii {
		d[i] = v
	}
	return nil
}

func (cpuOps) Scatter(_ device.Stream, dst, idx, val device.Buffer, scale float32) error {
	d, err := f32("Scatter", "dst", dst, 0)
	if err != nil {
		return err
	}
	ii, err := i32("Scatter", "idx", idx, 0)
	if err != nil {
		return err
	}
	vv, err := f32("Scatter", "val", val, len(ii))
	if err != nil {
		return err
	}
	for j, i := range ii {
		d[i] = vv[j] * scale
	}
	return nil
}

func (cpuOps) Div(_ device.Stream, x device.Buffer, d float32) error {
	xx, err := f32("Div", "x", x, 0)
	if err != nil {
		return err
	}
	for i := range xx {
		xx[i] /= d
	}
	return nil
}

func (cpuOps) Iota(_ device.Stream, idx device.Buffer, start int) error {
	ii, err := i32("Iota", "idx", idx, 0)
	if err != nil {
		return err
	}
	for j := range ii {
		ii[j] = int32(start + j)
	}
	return nil
}

func (cpuOps) CountIn(_ device.Stream, idx device.Buffer, bounds []int) ([]int, error) {
	ii, err := i32("CountIn", "idx", idx, 0)
	if err != nil {
		return nil, err
	}
	if len(bounds) < 2 {
		return nil, nil
	}
	out := make([]int, len(bounds)-1)
	for _, i := range ii {
		if j := sort.SearchInts(bounds, int(i)+1) - 1; j >= 0 && j < len(out) {
			out[j]++
		}
	}
	return out, nil
}

func (cpuOps) InRange(_ device.Stream, idx device.Buffer, n int) error {
	ii, err := i32("InRange", "idx", idx, 0)
	if err != nil {
		return err
	}
	for j, i := range ii {
		if i < 0 || int(i) >= n {
			return indexError(i, j, n)
		}
	}
	return nil
}

// indexError is the error of an index i (element j of a list) outside
// [0, n).
func indexError(i int32, j, n int) error {
	return fmt.Errorf("sparsify: index %d (element %d of the lists) is outside [0, %d): the workers disagree on the layout or the data is corrupt", i, j, n)
}

func (cpuOps) Shift(_ device.Stream, idx device.Buffer, off int) error {
	ii, err := i32("Shift", "idx", idx, 0)
	if err != nil {
		return err
	}
	for j := range ii {
		ii[j] += int32(off)
	}
	return nil
}

func (c cpuOps) TopKSegments(s device.Stream, idx, x device.Buffer, segs [][2]int, ks []int) (int, error) {
	if len(ks) != len(segs) {
		return 0, fmt.Errorf("sparsify: TopKSegments: %d budgets for %d segments", len(ks), len(segs))
	}
	pos := 0
	for j, sg := range segs {
		lo, hi := sg[0], sg[1]
		if lo < 0 || hi < lo || hi > x.Len() {
			return 0, fmt.Errorf("sparsify: TopKSegments: segment %d is [%d, %d), outside x's %d elements", j, lo, hi, x.Len())
		}
		k := max(0, min(ks[j], hi-lo))
		if pos+k > idx.Len() {
			return 0, fmt.Errorf("sparsify: TopKSegments: idx holds %d indices, segment %d needs %d after %d", idx.Len(), j, k, pos)
		}
		dst := idx.Slice(pos, pos+k)
		m, err := c.TopK(s, dst, device.Buffer{}, x.Slice(lo, hi), k)
		if err != nil {
			return 0, err
		}
		if err := c.Shift(s, dst.Slice(0, m), lo); err != nil {
			return 0, err
		}
		pos += m
	}
	return pos, nil
}

func (c cpuOps) TopKSegmentsOn(s device.Stream, idx, x, list device.Buffer, maxSegs, maxLen int) error {
	ll, err := i32("TopKSegmentsOn", "list", list, 1+3*maxSegs)
	if err != nil {
		return err
	}
	S := int(ll[0])
	if S < 0 || S > maxSegs {
		return fmt.Errorf("sparsify: TopKSegmentsOn: the list holds %d segments, at most %d were announced", S, maxSegs)
	}
	segs, ks := make([][2]int, S), make([]int, S)
	sum := 0
	for j := range S {
		e := ll[1+3*j:]
		segs[j], ks[j] = [2]int{int(e[0]), int(e[1])}, int(e[2])
		sum += max(0, int(e[1])-int(e[0]))
	}
	if sum > maxLen {
		return fmt.Errorf("sparsify: TopKSegmentsOn: the list's segments hold %d elements, at most %d were announced", sum, maxLen)
	}
	_, err = c.TopKSegments(s, idx, x, segs, ks)
	return err
}

func (cpuOps) Union(_ device.Stream, out, idx device.Buffer, n int) (int, error) {
	ii, err := i32("Union", "idx", idx, 0)
	if err != nil {
		return 0, err
	}
	oo, err := i32("Union", "out", out, len(ii))
	if err != nil {
		return 0, err
	}
	for j, i := range ii {
		if i < 0 || int(i) >= n {
			return 0, indexError(i, j, n)
		}
	}
	u := append(oo[:0], ii...)
	slices.Sort(u)
	return len(slices.Compact(u)), nil
}

func (cpuOps) CompactSlots(_ device.Stream, idx, x device.Buffer) (int, error) {
	xx, err := i32("CompactSlots", "x", x, 0)
	if err != nil {
		return 0, err
	}
	m := 0
	for _, w := range xx {
		if w != 0 {
			m++
		}
	}
	if idx.Len() < m {
		return m, fmt.Errorf("%w: %d slots occupied, the index buffer holds %d", ErrCapacity, m, idx.Len())
	}
	ii, err := i32("CompactSlots", "idx", idx, m)
	if err != nil {
		return 0, err
	}
	j := 0
	for _, w := range xx {
		if w != 0 {
			ii[j] = w - 1
			j++
		}
	}
	return m, nil
}

func (cpuOps) Run(_ device.Stream, k *device.Kernel, n int, args ...any) error {
	for i, a := range args {
		if b, ok := a.(device.Buffer); ok && b.Len() > 0 && !b.IsHost() {
			return fmt.Errorf("sparsify: %s: argument %d is %v, not host memory", k.Name, i, b)
		}
	}
	k.Host(n, args...)
	return nil
}

// checkSegments checks that segs lie within n elements and, with
// ordered, that they are ascending and do not overlap.
func checkSegments(op string, segs [][2]int, n int, ordered bool) error {
	for j, sg := range segs {
		if sg[0] < 0 || sg[1] < sg[0] || sg[1] > n {
			return fmt.Errorf("sparsify: %s: segment %d is [%d, %d), outside x's %d elements", op, j, sg[0], sg[1], n)
		}
		if ordered && j > 0 && sg[0] < segs[j-1][1] {
			return fmt.Errorf("sparsify: %s: segment %d [%d, %d) starts before segment %d ends (%d): list them ascending, not overlapping", op, j, sg[0], sg[1], j-1, segs[j-1][1])
		}
	}
	return nil
}

func (cpuOps) KthLargestAbsSegments(_ device.Stream, thr, x device.Buffer, segs [][2]int, ks []int) error {
	xx, err := f32("KthLargestAbsSegments", "x", x, 0)
	if err != nil {
		return err
	}
	tt, err := f32("KthLargestAbsSegments", "thr", thr, len(segs))
	if err != nil {
		return err
	}
	if len(ks) != len(segs) {
		return fmt.Errorf("sparsify: KthLargestAbsSegments: %d ranks for %d segments", len(ks), len(segs))
	}
	if err := checkSegments("KthLargestAbsSegments", segs, len(xx), false); err != nil {
		return err
	}
	for j, sg := range segs {
		if ks[j] < 1 || ks[j] > sg[1]-sg[0] {
			return fmt.Errorf("sparsify: KthLargestAbsSegments: k = %d of segment %d must be in [1, %d]", ks[j], j, sg[1]-sg[0])
		}
	}
	for j, sg := range segs {
		tt[j] = KthLargestAbs(xx[sg[0]:sg[1]], ks[j])
	}
	return nil
}

func (cpuOps) SelectAboveSegments(_ device.Stream, idx, counts, x, thr device.Buffer, segs [][2]int) error {
	xx, err := f32("SelectAboveSegments", "x", x, 0)
	if err != nil {
		return err
	}
	tt, err := f32("SelectAboveSegments", "thr", thr, len(segs))
	if err != nil {
		return err
	}
	cc, err := i32("SelectAboveSegments", "counts", counts, len(segs))
	if err != nil {
		return err
	}
	if err := checkSegments("SelectAboveSegments", segs, len(xx), true); err != nil {
		return err
	}
	end := 0
	if len(segs) > 0 {
		end = segs[len(segs)-1][1]
	}
	ii, err := i32("SelectAboveSegments", "idx", idx, end)
	if err != nil {
		return err
	}
	for j, sg := range segs {
		lo, hi := sg[0], sg[1]
		sel := SelectAbove(ii[lo:lo:hi], xx[lo:hi], tt[j])
		copy(ii[lo:hi], sel) // in place already, as SelectAbove writes into a dst that holds the selection
		for q := lo; q < lo+len(sel); q++ {
			ii[q] += int32(lo)
		}
		cc[j] = int32(len(sel))
	}
	return nil
}

func (c cpuOps) CompactSlotsSegments(s device.Stream, idx, x device.Buffer, bounds []int) ([]int, error) {
	xx, err := i32("CompactSlotsSegments", "x", x, 0)
	if err != nil {
		return nil, err
	}
	if _, err := i32("CompactSlotsSegments", "idx", idx, len(xx)); err != nil {
		return nil, err
	}
	for j := 1; j < len(bounds); j++ {
		if bounds[j-1] < 0 || bounds[j] < bounds[j-1] || bounds[j] > len(xx) {
			return nil, fmt.Errorf("sparsify: CompactSlotsSegments: segment %d is [%d, %d), outside x's %d words", j-1, bounds[j-1], bounds[j], len(xx))
		}
	}
	if _, err := c.CompactSlots(s, idx, x); err != nil {
		return nil, err
	}
	counts := make([]int, max(len(bounds)-1, 0))
	for j := range counts {
		for _, w := range xx[bounds[j]:bounds[j+1]] {
			counts[j] += selB2I(w != 0)
		}
	}
	return counts, nil
}

func (c cpuOps) CountInTo(s device.Stream, counts, idx device.Buffer, bounds []int) error {
	got, err := c.CountIn(s, idx, bounds)
	if err != nil {
		return err
	}
	cc, err := i32("CountInTo", "counts", counts, len(got))
	if err != nil {
		return err
	}
	for j, n := range got {
		cc[j] = int32(n)
	}
	return nil
}
