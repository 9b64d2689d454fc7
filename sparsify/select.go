package sparsify

import (
	"math"
	"math/rand/v2"
	"slices"
)

// absBits is the IEEE-754 bit pattern of |v|. For non-NaN values it is
// monotone in |v|, so comparing absBits compares magnitudes. A NaN maps above
// +Inf and therefore ranks as the largest magnitude; callers must reject NaN
// upstream (Memory.Accumulate does).
func absBits(v float32) uint32 { return math.Float32bits(v) &^ (1 << 31) }

// TopK returns dst[:0] extended with the indices of the k largest-magnitude
// elements of x, in ascending index order; ties at the k-th magnitude go to
// lower indices. k is clamped to [0, len(x)]. NaN elements rank above every
// number (see absBits); reject them before calling.
func TopK(dst []int32, x []float32, k int) []int32 {
	dst = dst[:0]
	k = max(0, min(k, len(x)))
	if k == 0 {
		return dst
	}
	idx := make([]int32, len(x))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(a, b int32) int {
		ba, bb := absBits(x[a]), absBits(x[b])
		switch {
		case ba > bb:
			return -1
		case ba < bb:
			return 1
		}
		return 0
	})
	dst = append(dst, idx[:k]...)
	slices.Sort(dst)
	return dst
}

// KthLargestAbs returns the k-th largest |x[i]|, 1 <= k <= len(x). It panics
// for k outside that range.
func KthLargestAbs(x []float32, k int) float32 {
	if k < 1 || k > len(x) {
		panic("sparsify: KthLargestAbs: k out of range")
	}
	b := make([]uint32, len(x))
	for i, v := range x {
		b[i] = absBits(v)
	}
	slices.Sort(b)
	return math.Float32frombits(b[len(b)-k])
}

// SelectAbove returns dst[:0] extended with the indices i with |x[i]| >= t,
// ascending.
func SelectAbove(dst []int32, x []float32, t float32) []int32 {
	dst = dst[:0]
	for i, v := range x {
		if float32(math.Abs(float64(v))) >= t {
			dst = append(dst, int32(i))
		}
	}
	return dst
}

// RandomK returns dst[:0] extended with k distinct indices of [0, n),
// ascending, drawn from seed (identical on all ranks for equal arguments).
// k is clamped to [0, n].
func RandomK(dst []int32, n, k int, seed uint64) []int32 {
	dst = dst[:0]
	k = max(0, min(k, n))
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	seen := make(map[int32]struct{}, k)
	for len(dst) < k {
		j := int32(r.IntN(n))
		if _, ok := seen[j]; ok {
			continue
		}
		seen[j] = struct{}{}
		dst = append(dst, j)
	}
	slices.Sort(dst)
	return dst
}
