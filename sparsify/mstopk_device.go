package sparsify

import (
	"math"

	"github.com/sparsegrad/sparsegrad/device"
)

// The words of selectDevice's state (mstopk.cu's st): the mean and the
// maximum, two copies of a round's mstopkState, thres1 as reported and
// the selection's count.
const (
	mstopkSlotWord   = 2  // MSTOPK_S
	mstopkThres1Word = 14 // MSTOPK_THRES1; the count follows
	mstopkStateWords = 16
	mstopkChunk      = 256 // MSTOPK_CHUNK: the list's entries per thread of the draw's passes
	mstopkLanes      = 1 << 16
)

// selectDevice is selectOn without the host, on a GPU (the same bits): the
// blocks' statistics (mstopkKernel), then mean, maximum and the first
// round's state (mstopkInitKernel), each round's count with the decision
// of the round before (mstopkCountKernel, state and counts on the device),
// the last decision and thres2 (mstopkFinalKernel), the elements at or
// above thres2 (Ops.SelectAboveSegments at that device threshold, count
// left on the device), those at or above thres1 counted by chunks of the
// list (mstopkClassKernel), the draw among the others (mstopkDrawKernel:
// one thread, RandomK's algorithm and generator) and the selection written
// ascending into dsel (mstopkWriteKernel). It launches a fixed number of
// kernels whatever the data, reads nothing back and uploads nothing; the
// count and thres1 (NaN when none) are left at mstopkThres1Word of
// r.dState. n and k are at least 1.
func (r *mstopk) selectDevice(v *vecs, acc, dsel device.Buffer, n, k int, seed uint64) error {
	if n == 0 || k <= 0 {
		return nil
	}
	nb, nch := mstopkBlocks(n), (n+mstopkChunk-1)/mstopkChunk
	// Everything allocated before the first launch.
	dp, err := v.scratch(&r.dPart, device.Float64, 2*nb)
	if err != nil {
		return err
	}
	st, err := v.scratch(&r.dState, device.Float64, mstopkStateWords)
	if err != nil {
		return err
	}
	ints, err := v.scratch(&r.dInts, device.Int32, mstopkRounds+1)
	if err != nil {
		return err
	}
	thr, err := v.scratch(&r.dThr, device.Float32, 1)
	if err != nil {
		return err
	}
	list, err := v.scratch(&r.dList, device.Int32, n)
	if err != nil {
		return err
	}
	chunks, err := v.scratch(&r.dChunks, device.Int32, 2*nch)
	if err != nil {
		return err
	}
	bits, err := v.scratch(&r.dBits, device.Int32, n/32+1)
	if err != nil {
		return err
	}
	cnt, m, c1, off := ints.Slice(0, mstopkRounds), ints.Slice(mstopkRounds, mstopkRounds+1), chunks.Slice(0, nch), chunks.Slice(nch, 2*nch)
	slot := int32(mstopkRounds % 2)
	if err := v.ops.Run(v.s, mstopkKernel, nb, acc, dp, int64(nb), int64(n)); err != nil {
		return err
	}
	if err := v.ops.Run(v.s, mstopkInitKernel, 1, dp, st, cnt, int64(1), int64(nb), int64(n), int32(mstopkRounds)); err != nil {
		return err
	}
	lanes := min(n, mstopkLanes)
	for round := range mstopkRounds {
		if err := v.ops.Run(v.s, mstopkCountKernel, lanes, acc, st, cnt, int64(lanes), int64(n), int32(round), int64(k)); err != nil {
			return err
		}
	}
	if err := v.ops.Run(v.s, mstopkFinalKernel, 1, st, cnt, thr, int64(1), int32(mstopkRounds), int64(k)); err != nil {
		return err
	}
	r.segs[0] = [2]int{0, n}
	if err := v.ops.SelectAboveSegments(v.s, list, m, acc, thr, r.segs[:]); err != nil {
		return err
	}
	if err := v.ops.Run(v.s, mstopkClassKernel, nch, acc, list, m, st, slot, c1, int64(nch)); err != nil {
		return err
	}
	if err := v.ops.Run(v.s, mstopkDrawKernel, 1, st, slot, m, c1, off, bits, int64(1), int64(k), int64(seed)); err != nil {
		return err
	}
	return v.ops.Run(v.s, mstopkWriteKernel, nch, acc, list, m, st, slot, c1, off, bits, dsel, int64(nch), int64(dsel.Len()))
}

// The Host passes of selectDevice's kernels (mstopk.cu), for a CPU device.

// mstopkInitKernel is k_mstopk_init: arguments part, st, cnt, n, nb, d,
// rounds.
var mstopkInitKernel = &device.Kernel{Name: "k_mstopk_init", CUDA: mstopkCUDA, Host: func(_ int, a ...any) {
	part, st, cnt := a[0].(device.Buffer).Float64s(), a[1].(device.Buffer).Float64s(), a[2].(device.Buffer).Int32s()
	nb, d, rounds := int(a[4].(int64)), int(a[5].(int64)), int(a[6].(int32))
	st[0], st[1] = mstopkStats(part[:2*nb], d)
	mstopkStore(st, 0, mstopkStart(d))
	clear(cnt[:rounds])
}}

// mstopkCountKernel is k_mstopk_count: arguments x, st, cnt, n, d, the
// round r and k.
var mstopkCountKernel = &device.Kernel{Name: "k_mstopk_count", CUDA: mstopkCUDA, Host: func(_ int, a ...any) {
	x, st, cnt := a[0].(device.Buffer).Float32s(), a[1].(device.Buffer).Float64s(), a[2].(device.Buffer).Int32s()
	d, r, k := int(a[4].(int64)), int(a[5].(int32)), int(a[6].(int64))
	s := mstopkLoad(st, 0)
	if r > 0 {
		s = mstopkLoad(st, (r+1)%2).next(st[0], st[1], int(uint32(cnt[r-1])), k)
		mstopkStore(st, r%2, s)
	}
	t := atLeast32(s.threshold(st[0], st[1]))
	c := 0
	for _, v := range x[:d] {
		if float32(math.Abs(float64(v))) >= t {
			c++
		}
	}
	cnt[r] += int32(c)
}}

// mstopkFinalKernel is k_mstopk_final: arguments st, cnt, thr, n, rounds,
// k.
var mstopkFinalKernel = &device.Kernel{Name: "k_mstopk_final", CUDA: mstopkCUDA, Host: func(_ int, a ...any) {
	st, cnt, thr := a[0].(device.Buffer).Float64s(), a[1].(device.Buffer).Int32s(), a[2].(device.Buffer).Float32s()
	rounds, k := int(a[4].(int32)), int(a[5].(int64))
	s := mstopkLoad(st, (rounds+1)%2).next(st[0], st[1], int(uint32(cnt[rounds-1])), k)
	mstopkStore(st, rounds%2, s)
	thr[0] = atLeast32(s.thres2)
}}

// mstopkClassKernel is k_mstopk_class: arguments x, list, m, st, slot,
// c1, n (the chunks).
var mstopkClassKernel = &device.Kernel{Name: "k_mstopk_class", CUDA: mstopkCUDA, Host: func(_ int, a ...any) {
	x, list, m := a[0].(device.Buffer).Float32s(), a[1].(device.Buffer).Int32s(), int(a[2].(device.Buffer).Int32s()[0])
	t1 := mstopkLoad(a[3].(device.Buffer).Float64s(), int(a[4].(int32))).thres1
	c1 := a[5].(device.Buffer).Int32s()
	for c := 0; c*mstopkChunk < m; c++ {
		q := 0
		for _, i := range list[c*mstopkChunk : min((c+1)*mstopkChunk, m)] {
			if math.Abs(float64(x[i])) >= t1 {
				q++
			}
		}
		c1[c] = int32(q)
	}
}}

// mstopkDrawKernel is k_mstopk_draw: arguments st, slot, m, c1, off,
// bits, n, k, seed. Its Host pass draws with RandomK itself.
var mstopkDrawKernel = &device.Kernel{Name: "k_mstopk_draw", CUDA: mstopkCUDA, Host: func(_ int, a ...any) {
	st, m := a[0].(device.Buffer).Float64s(), int(a[2].(device.Buffer).Int32s()[0])
	s := mstopkLoad(st, int(a[1].(int32)))
	c1, off, bits := a[3].(device.Buffer).Int32s(), a[4].(device.Buffer).Int32s(), a[5].(device.Buffer).Int32s()
	k, seed := int(a[7].(int64)), uint64(a[8].(int64))
	nc, k1 := (m+mstopkChunk-1)/mstopkChunk, 0
	for c := range nc {
		c1[c], k1 = int32(k1), k1+int(c1[c])
	}
	m2 := m - k1
	clear(bits[:(m2+31)/32])
	for _, t := range RandomK(nil, m2, k-k1, mstopkDrawSeed(seed, s.thres2, int(s.k1))) {
		bits[t>>5] |= int32(uint32(1) << (t & 31))
	}
	o := 0
	for c := range nc {
		off[c] = int32(o)
		lo, hi := c*mstopkChunk, min((c+1)*mstopkChunk, m)
		p1, p2 := int(c1[c]), k1
		if c+1 < nc {
			p2 = int(c1[c+1])
		}
		o += p2 - p1
		for q := lo - p1; q < hi-p2; q++ {
			o += int(uint32(bits[q>>5]) >> (q & 31) & 1)
		}
	}
	st[mstopkThres1Word], st[mstopkThres1Word+1] = s.thres1, float64(o)
	if s.k1 == 0 {
		st[mstopkThres1Word] = math.NaN()
	}
}}

// mstopkWriteKernel is k_mstopk_write: arguments x, list, m, st, slot,
// c1, off, bits, sel, n, capacity.
var mstopkWriteKernel = &device.Kernel{Name: "k_mstopk_write", CUDA: mstopkCUDA, Host: func(_ int, a ...any) {
	x, list, m := a[0].(device.Buffer).Float32s(), a[1].(device.Buffer).Int32s(), int(a[2].(device.Buffer).Int32s()[0])
	t1 := mstopkLoad(a[3].(device.Buffer).Float64s(), int(a[4].(int32))).thres1
	c1, off, bits, sel := a[5].(device.Buffer).Int32s(), a[6].(device.Buffer).Int32s(), a[7].(device.Buffer).Int32s(), a[8].(device.Buffer).Int32s()
	capacity := int(a[10].(int64))
	for c := 0; c*mstopkChunk < m; c++ {
		p1, o := int(c1[c]), int(off[c])
		for j := c * mstopkChunk; j < min((c+1)*mstopkChunk, m); j++ {
			take := math.Abs(float64(x[list[j]])) >= t1
			if take {
				p1++
			} else {
				q := j - p1
				take = uint32(bits[q>>5])>>(q&31)&1 != 0
			}
			if take {
				if o < capacity {
					sel[o] = list[j]
				}
				o++
			}
		}
	}
}}

// mstopkLoad returns the state in slot (0 or 1) of st.
func mstopkLoad(st []float64, slot int) mstopkState {
	w := st[mstopkSlotWord+6*slot:]
	return mstopkState{l: w[0], r: w[1], k1: w[2], thres1: w[3], k2: w[4], thres2: w[5]}
}

// mstopkStore writes s into slot (0 or 1) of st.
func mstopkStore(st []float64, slot int, s mstopkState) {
	copy(st[mstopkSlotWord+6*slot:], []float64{s.l, s.r, s.k1, s.thres1, s.k2, s.thres2})
}
