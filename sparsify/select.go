package sparsify

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/comm"
)

// Selection primitives: exact top-k by magnitude, the k-th largest magnitude,
// threshold selection and seeded random-k.
//
// Magnitudes are compared through absBits, the IEEE-754 bit pattern of |v|
// with the sign bit cleared: for every non-NaN float32 it is monotone in |v|,
// so an exact radix select on those 31-bit keys replaces sorting. The top-k
// algorithm reads x three times, each pass split over all cores for large
// inputs:
//
//  1. per-chunk histograms of the key's top selHiBits bits; merged, they give
//     the boundary bucket holding the k-th largest key;
//  2. the keys of the boundary bucket are copied out per chunk;
//  3. the exact k-th largest key T is found among those candidates (two more
//     small radix rounds), the number of ties at T each chunk may take is
//     fixed by prefix sums (ties go to the lowest indices), and every chunk
//     writes its indices, in ascending order, straight to its offset in dst.
//
// NaN: a NaN's key lies above that of +Inf, so TopK and KthLargestAbs rank
// NaN as the largest magnitude (it is selected first), while SelectAbove
// never selects NaN (|NaN| >= t is false). NaN and Inf gradients are rejected
// upstream by Memory.Accumulate; these primitives do not check.

const (
	// selParallelMin is the input length from which the passes are split
	// over goroutines; shorter inputs run on the calling goroutine.
	selParallelMin = 1 << 16
	// selHiBits is the number of key bits the first radix pass histograms.
	selHiBits  = 11
	selHiShift = 31 - selHiBits // key >> selHiShift is the first-pass bucket
	selBuckets = 1 << selHiBits
)

// selBits views x's memory as IEEE-754 bit patterns (no copy), so that the
// passes load integers directly instead of moving floats between register
// files.
func selBits(x []float32) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(x))), len(x))
}

// selChunks is the number of chunks the passes over n elements use.
func selChunks(n int) int {
	if n < selParallelMin {
		return 1
	}
	return max(1, min(runtime.GOMAXPROCS(0), n/(selParallelMin/2)))
}

// selParallel runs f(c, lo, hi) for each of p chunks of n elements (cut by
// comm.ChunkBounds), on p goroutines when p > 1, and returns when all are
// done.
func selParallel(n, p int, f func(c, lo, hi int)) {
	if p == 1 {
		f(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	for c := range p {
		lo, hi := comm.ChunkBounds(n, p, c)
		wg.Go(func() { f(c, lo, hi) })
	}
	wg.Wait()
}

// TopK returns dst[:0] extended with the indices of the k largest-magnitude
// elements of x, in ascending index order; ties at the k-th magnitude go to
// lower indices. k is clamped to [0, len(x)]. It runs in O(len(x)) time
// (radix select, no sorting) on all cores for large x. NaN ranks above every
// number (see the package's selection notes); reject NaN before calling.
func TopK(dst []int32, x []float32, k int) []int32 {
	n := len(x)
	k = max(0, min(k, n))
	dst = slices.Grow(dst[:0], k)[:k]
	if k == 0 {
		return dst
	}
	if k == n {
		for i := range dst {
			dst[i] = int32(i)
		}
		return dst
	}
	p := selChunks(n)
	s := selFindKth(x, k, p)

	gt, eq := s.gt, s.eq
	ties := k
	for c := range p {
		ties -= gt[c]
	}
	off := make([]int, p)
	allow := make([]int, p)
	o := 0
	for c := range p {
		allow[c] = min(eq[c], ties)
		ties -= allow[c]
		off[c] = o
		o += gt[c] + allow[c]
	}
	t := s.kth
	selParallel(n, p, func(c, lo, hi int) {
		out := dst[off[c] : off[c]+gt[c]+allow[c]]
		if len(out) == 0 {
			return
		}
		// Branch-free: write every index, advance only over selected ones,
		// and stop as soon as the chunk's share is complete (so the
		// speculative write never leaves out). A chunk that takes all or
		// none of its ties selects key >= t or key >= t+1.
		if allow[c] == eq[c] || allow[c] == 0 {
			tt := t
			if allow[c] == 0 {
				tt++ // t < 2^31, no overflow
			}
			selWriteAtLeast(out, selBits(x[lo:hi]), lo, tt)
			return
		}
		j, a := 0, allow[c]
		for i, v := range selBits(x[lo:hi]) {
			key := v &^ (1 << 31)
			out[j] = int32(lo + i)
			tie := selB2I(key == t) & selB2I(a > 0)
			j += selB2I(key > t) | tie
			a -= tie
			if j == len(out) {
				break
			}
		}
	})
	return dst
}

// KthLargestAbs returns the k-th largest |x[i]|, 1 <= k <= len(x), in O(len(x))
// time on all cores for large x. It panics for k outside that range. NaN
// ranks above every number.
func KthLargestAbs(x []float32, k int) float32 {
	if k < 1 || k > len(x) {
		panic("sparsify: KthLargestAbs: k must be in [1, len(x)]")
	}
	return math.Float32frombits(selFindKth(x, k, selChunks(len(x))).kth)
}

// selKth is the outcome of the selection passes: the k-th largest key and,
// per chunk, how many keys lie above it and how many equal it.
type selKth struct {
	kth    uint32
	gt, eq []int
}

// selFindKth finds the k-th largest key of x (1 <= k <= len(x)) over p chunks.
// After the first histogram pass, a boundary bucket of moderate size is copied
// out and finished by radix rounds over the copy; a huge one (many equal or
// nearly equal magnitudes, e.g. the zeros of an embedding gradient) is
// finished by two more histogram passes over x instead, which allocate
// nothing in proportion to the input.
func selFindKth(x []float32, k, p int) selKth {
	n := len(x)
	hists := make([][selBuckets]uint32, p)
	selParallel(n, p, func(c, lo, hi int) { selHistogram(&hists[c], x[lo:hi]) })
	var total [selBuckets]int
	for c := range p {
		for b, v := range hists[c] {
			total[b] += int(v)
		}
	}
	need := k // rank of the k-th largest inside the boundary bucket, from the top
	b := selBuckets - 1
	for ; b > 0 && total[b] < need; b-- {
		need -= total[b]
	}
	s := selKth{gt: make([]int, p), eq: make([]int, p)}
	for c := range p {
		for bb := b + 1; bb < selBuckets; bb++ {
			s.gt[c] += int(hists[c][bb])
		}
	}
	if total[b] > max(selHugeBucket, n/16) {
		selFinishByHistograms(&s, x, p, uint32(b), need)
		return s
	}
	candOff := make([]int, p+1)
	for c := range p {
		candOff[c+1] = candOff[c] + int(hists[c][b])
	}
	cand := make([]uint32, candOff[p])
	ub := uint32(b)
	selParallel(n, p, func(c, lo, hi int) {
		out := cand[candOff[c]:candOff[c+1]]
		if len(out) == 0 {
			return
		}
		selCollectBucket(out, selBits(x[lo:hi]), ub)
	})
	s.kth = selKthOfKeys(slices.Clone(cand), need)
	for c := range p {
		for _, key := range cand[candOff[c]:candOff[c+1]] {
			if key > s.kth {
				s.gt[c]++
			} else if key == s.kth {
				s.eq[c]++
			}
		}
	}
	return s
}

// selHugeBucket is the smallest boundary-bucket size for which selFindKth
// uses histogram passes instead of copying the bucket's keys.
const selHugeBucket = 1 << 18

// selFinishByHistograms completes selFindKth for a huge boundary bucket ub
// (whose keys' bits 30..20 are fixed) with two histogram passes over x: key
// bits 19..9 of the keys in ub, then bits 8..0 of the keys that also match
// the chosen middle bits. It adds to s.gt and sets s.eq and s.kth.
func selFinishByHistograms(s *selKth, x []float32, p int, ub uint32, need int) {
	const (
		midShift, midBits = 9, 11
		lowBits           = 9
	)
	n := len(x)
	mid := make([][1 << midBits]uint32, p)
	selParallel(n, p, func(c, lo, hi int) {
		h := &mid[c]
		for _, v := range selBits(x[lo:hi]) {
			key := v &^ (1 << 31)
			if key>>selHiShift == ub {
				h[key>>midShift&(1<<midBits-1)]++
			}
		}
	})
	var tmid [1 << midBits]int
	for c := range p {
		for m, v := range mid[c] {
			tmid[m] += int(v)
		}
	}
	m := 1<<midBits - 1
	for ; m > 0 && tmid[m] < need; m-- {
		need -= tmid[m]
	}
	for c := range p {
		for mm := m + 1; mm < 1<<midBits; mm++ {
			s.gt[c] += int(mid[c][mm])
		}
	}
	prefix := ub<<selHiShift | uint32(m)<<midShift // bits 30..9 of the k-th key
	low := make([][1 << lowBits]uint32, p)
	selParallel(n, p, func(c, lo, hi int) {
		h := &low[c]
		for _, v := range selBits(x[lo:hi]) {
			key := v &^ (1 << 31)
			if key>>midShift == prefix>>midShift {
				h[key&(1<<lowBits-1)]++
			}
		}
	})
	var tlow [1 << lowBits]int
	for c := range p {
		for l, v := range low[c] {
			tlow[l] += int(v)
		}
	}
	l := 1<<lowBits - 1
	for ; l > 0 && tlow[l] < need; l-- {
		need -= tlow[l]
	}
	for c := range p {
		for ll := l + 1; ll < 1<<lowBits; ll++ {
			s.gt[c] += int(low[c][ll])
		}
		s.eq[c] = int(low[c][l])
	}
	s.kth = prefix | uint32(l)
}

// selHistogram counts the first-pass buckets of x into h. Four interleaved
// sub-histograms break the store-to-load dependency between equal buckets.
func selHistogram(h *[selBuckets]uint32, x []float32) {
	var sub [4][selBuckets]uint32
	u := selBits(x)
	i := 0
	for ; i+4 <= len(u); i += 4 {
		q := u[i : i+4 : i+4]
		sub[0][q[0]<<1>>(selHiShift+1)]++
		sub[1][q[1]<<1>>(selHiShift+1)]++
		sub[2][q[2]<<1>>(selHiShift+1)]++
		sub[3][q[3]<<1>>(selHiShift+1)]++
	}
	for ; i < len(u); i++ {
		sub[0][u[i]<<1>>(selHiShift+1)]++
	}
	for b := range h {
		h[b] = sub[0][b] + sub[1][b] + sub[2][b] + sub[3][b]
	}
}

// selCollectBucket copies into out, in order, the keys u[i] &^ signbit whose
// first-pass bucket is ub; out must have exactly as many slots as there are
// such keys. Branch-free like selWriteAtLeast.
func selCollectBucket(out []uint32, u []uint32, ub uint32) {
	j, i := 0, 0
	for ; i+4 <= len(u) && j+4 <= len(out); i += 4 {
		q := u[i : i+4 : i+4]
		k0, k1, k2, k3 := q[0]&^(1<<31), q[1]&^(1<<31), q[2]&^(1<<31), q[3]&^(1<<31)
		out[j] = k0
		j += selB2I(k0>>selHiShift == ub)
		out[j] = k1
		j += selB2I(k1>>selHiShift == ub)
		out[j] = k2
		j += selB2I(k2>>selHiShift == ub)
		out[j] = k3
		j += selB2I(k3>>selHiShift == ub)
	}
	for ; i < len(u) && j < len(out); i++ {
		k := u[i] &^ (1 << 31)
		out[j] = k
		j += selB2I(k>>selHiShift == ub)
	}
}

// selWriteAtLeast writes, in ascending order, base+i for every i whose key
// u[i] &^ signbit is >= t into out, which must have exactly as many slots as
// there are such i. Branch-free: every index is written, the position
// advances only over selected ones, and the loop stops when out is full.
func selWriteAtLeast(out []int32, u []uint32, base int, t uint32) {
	if len(out) == 0 {
		return
	}
	j := 0
	idx := int32(base)
	i := 0
	// Four at a time while at least four slots are left.
	for ; i+4 <= len(u) && j+4 <= len(out); i += 4 {
		q := u[i : i+4 : i+4]
		out[j] = idx
		j += selB2I(q[0]&^(1<<31) >= t)
		out[j] = idx + 1
		j += selB2I(q[1]&^(1<<31) >= t)
		out[j] = idx + 2
		j += selB2I(q[2]&^(1<<31) >= t)
		out[j] = idx + 3
		j += selB2I(q[3]&^(1<<31) >= t)
		idx += 4
	}
	for ; i < len(u) && j < len(out); i++ {
		out[j] = idx
		idx++
		j += selB2I(u[i]&^(1<<31) >= t)
	}
}

// selKthOfKeys returns the need-th largest of keys (1 <= need <= len(keys)),
// which all share their top selHiBits bits, by radix rounds over the lower
// bits; keys is reordered.
func selKthOfKeys(keys []uint32, need int) uint32 {
	// Rounds over bits [shift, shift+width) from the high end down.
	rounds := 0
	for _, r := range [...]struct{ shift, width uint }{{9, 11}, {0, 9}} {
		if len(keys) <= 64 {
			break
		}
		rounds++
		var h [1 << 11]int
		mask := uint32(1)<<r.width - 1
		for _, key := range keys {
			h[key>>r.shift&mask]++
		}
		b := int(mask)
		for ; b > 0 && h[b] < need; b-- {
			need -= h[b]
		}
		j := 0
		for _, key := range keys {
			if int(key>>r.shift&mask) == b {
				keys[j] = key
				j++
			}
		}
		keys = keys[:j]
	}
	if rounds == 2 {
		// Both rounds ran, so every bit of the remaining keys is fixed: they
		// are all equal (many ties, e.g. zeros). Sorting them would cost
		// O(m log m) for nothing.
		return keys[0]
	}
	slices.Sort(keys)
	return keys[len(keys)-need]
}

// SelectAbove returns dst[:0] extended with the indices i with |x[i]| >= t,
// ascending, in one pass over x on all cores for large x. NaN elements are
// never selected; a NaN t selects nothing.
func SelectAbove(dst []int32, x []float32, t float32) []int32 {
	n := len(x)
	p := selChunks(n)
	if p == 1 {
		return selAboveRange(dst[:0], x, 0, t)
	}
	// Each chunk appends to its own buffer; the buffers are then copied to
	// dst in chunk order, so the result is ascending without sorting.
	parts := make([][]int32, p)
	selParallel(n, p, func(c, lo, hi int) {
		var buf []int32
		if c == 0 {
			buf = dst[:0] // chunk 0 writes in place
		} else if cap(dst) > 0 {
			// dst's capacity (from earlier calls) estimates the output.
			buf = make([]int32, 0, cap(dst)/p+selAboveBlock)
		}
		parts[c] = selAboveRange(buf, x[lo:hi], lo, t)
	})
	total := 0
	for _, b := range parts {
		total += len(b)
	}
	dst = slices.Grow(parts[0], total-len(parts[0]))
	for _, b := range parts[1:] {
		dst = append(dst, b...)
	}
	return dst
}

// selAboveBlock is the number of elements SelectAbove scans between capacity
// checks.
const selAboveBlock = 1024

// selAboveRange appends base+i for every i with |x[i]| >= t to dst, branch
// free: within a block of selAboveBlock elements every index is written and
// only the selected ones are kept.
func selAboveRange(dst []int32, x []float32, base int, t float32) []int32 {
	if t != t { // NaN selects nothing
		return dst
	}
	// |v| >= t  ⟺  tb <= key(v) <= key(+Inf) for non-NaN v, with tb = bits(t)
	// for t > 0 and 0 otherwise; NaN keys lie above key(+Inf). One unsigned
	// comparison tests both bounds.
	tb := uint32(0)
	if t > 0 {
		tb = math.Float32bits(t)
	}
	span := uint32(0x7f800000) - tb
	u := selBits(x)
	for lo := 0; lo < len(u); lo += selAboveBlock {
		blk := u[lo:min(lo+selAboveBlock, len(u))]
		j := len(dst)
		dst = slices.Grow(dst, len(blk)+4)
		buf := dst[:j+len(blk)+4]
		idx := int32(base + lo)
		i := 0
		for ; i+4 <= len(blk); i += 4 {
			q := blk[i : i+4 : i+4]
			buf[j] = idx
			j += selB2I(q[0]&^(1<<31)-tb <= span)
			buf[j] = idx + 1
			j += selB2I(q[1]&^(1<<31)-tb <= span)
			buf[j] = idx + 2
			j += selB2I(q[2]&^(1<<31)-tb <= span)
			buf[j] = idx + 3
			j += selB2I(q[3]&^(1<<31)-tb <= span)
			idx += 4
		}
		for ; i < len(blk); i++ {
			buf[j] = idx
			idx++
			j += selB2I(blk[i]&^(1<<31)-tb <= span)
		}
		dst = buf[:j]
	}
	return dst
}

// selB2I is 1 for true and 0 for false; the compiler emits it without a
// branch.
func selB2I(b bool) int {
	if b {
		return 1
	}
	return 0
}

// RandomK returns dst[:0] extended with k distinct indices of [0, n),
// ascending, drawn uniformly (every k-subset equally likely) from seed: equal
// arguments give equal results on every rank and every run. k is clamped to
// [0, n]. It uses Floyd's sampling algorithm on a PCG generator, O(k) draws.
func RandomK(dst []int32, n, k int, seed uint64) []int32 {
	dst = dst[:0]
	k = max(0, min(k, n))
	if k == 0 {
		return dst
	}
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	if k == n {
		for i := range n {
			dst = append(dst, int32(i))
		}
		return dst
	}
	if k < n/512 {
		// Sparse: membership in a map, then sort.
		seen := make(map[int32]struct{}, k)
		for j := n - k; j < n; j++ {
			t := int32(r.IntN(j + 1))
			if _, ok := seen[t]; ok {
				t = int32(j)
			}
			seen[t] = struct{}{}
			dst = append(dst, t)
		}
		slices.Sort(dst)
		return dst
	}
	// Dense: membership in a bitmap, read out in ascending order.
	bm := make([]uint64, (n+63)/64)
	for j := n - k; j < n; j++ {
		t := r.IntN(j + 1)
		if bm[t>>6]&(1<<(t&63)) != 0 {
			t = j
		}
		bm[t>>6] |= 1 << (t & 63)
	}
	dst = slices.Grow(dst, k)
	for w, word := range bm {
		for word != 0 {
			dst = append(dst, int32(w<<6+bits.TrailingZeros64(word)))
			word &= word - 1
		}
	}
	return dst
}

// selAccumulate adds scale·g to r element-wise (Memory.Accumulate's pass over
// one chunk) and returns base plus the index of the first element of r that
// became NaN or ±Inf, or −1 if all are finite.
func selAccumulate(r, g []float32, scale float32, base int) int {
	g = g[:len(r)]
	first := -1
	for i := range r {
		v := r[i] + scale*g[i]
		r[i] = v
		// All exponent bits set: NaN or infinite.
		if math.Float32bits(v)&0x7f800000 == 0x7f800000 && first < 0 {
			first = base + i
		}
	}
	return first
}
