package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"reflect"
	"slices"

	"github.com/sparsegrad/sparsegrad/device"
)

// Sparse holds the sparsification primitives on a GPU: the passes over the
// whole gradient that package sparsify's reducers make (accumulation with a
// finiteness check, per-segment norms, exact top-k, threshold selection,
// gathers and scatters, and the methods' own kernels, Run), computed where
// the gradient is. Each gives what sparsify's CPU primitive gives for the same
// input: the same index sets in the same (ascending) order, ties at the k-th
// magnitude to the lowest indices, sums within float32 (norms: float64)
// rounding. Only counts and a few numbers per call come back to the host.
//
// Index buffers are device.Int32. A call's work is issued on the stream it
// is given; calls that return a number synchronize that stream.
type Sparse struct{ d *Device }

// Sparse returns the device's sparsification primitives.
func (d *Device) Sparse() *Sparse { return &Sparse{d: d} }

// ErrCapacity is wrapped by SelectAbove's error when the index (or value)
// buffer is shorter than the selection; the count it returns says how long
// it must be.
var ErrCapacity = errors.New("cuda: output buffer too short")

// selTile is SEL_TILE of kernels.cu: the elements of one block of the
// ordered selections.
const selTile = 256 * 16

// selScratch is a stream's reusable memory for the primitives.
type selScratch struct {
	state, hist, counts, offs, total device.Buffer // Int32, used as u32
	// first is the first bad index of Accumulate and k_mark, kept at
	// noBad between calls (set once, and again only after a call that
	// found one): no upload before each call.
	first device.Buffer // Int64, used as u64
	// pieceSets are SegmentSumSquares' last two sets of segments, kept on
	// the device (a reducer's per-fragment norms and the frame's residual
	// norm alternate); lastSet is the one used last.
	pieceSets         [2]pieceSet
	lastSet           int
	bounds            device.Buffer // Int64: CountIn's segments
	countBounds       []int         // the segments bounds holds (nil: none)
	parts, sums       device.Buffer // Float64
	mark              device.Buffer // Float32: Union's marks, zero between calls
	segState, segHist device.Buffer // Int32, used as u32: TopKSegments' radix states
	segDesc           device.Buffer // Int64: TopKSegmentsOn's description
	// words are the last lists of int64 words the segmented calls
	// described their segments by, kept on the device (a method's
	// segments are the same every step: uploaded once); nextWords is the
	// slot the next new list takes.
	words     [4]wordSlot
	nextWords int
	segTotals device.Buffer // Int32, used as u32: per-segment counts
}

// wordSlot is one list of int64 words kept on the device.
type wordSlot struct {
	words []int64 // nil: none
	buf   device.Buffer
}

// pieceSet is one set of SegmentSumSquares' segments on the device: its
// pieces' bounds and each segment's first piece.
type pieceSet struct {
	bounds []int         // the segments (nil: none yet)
	np     int           // the number of pieces
	pieces device.Buffer // Int64: piece bounds
	first  device.Buffer // Int32: each segment's first piece
}

// minScratch is the fewest elements a scratch buffer of the primitives
// is allocated with (a few KiB: the per-tile counts of a vector of 16 M
// elements), so that the calls of a step, whose sizes vary (DEFT's
// fragments, the selections' counts), find it large enough after the
// first steps instead of reallocating it mid-step.
const minScratch = 4096

// grow returns the first n elements of *b, reallocated on d when shorter:
// to n rounded up to a power of two, at least minScratch, so that a
// buffer grows O(log n) times over a run, in its first steps.
func grow(d *Device, b *device.Buffer, dt device.DType, n int) (device.Buffer, error) {
	if b.Len() >= n && b.Len() > 0 {
		return b.Slice(0, n), nil
	}
	if b.Len() > 0 {
		if err := d.Free(*b); err != nil {
			return device.Buffer{}, err
		}
		*b = device.Buffer{}
	}
	nb, err := d.Alloc(dt, max(minScratch, 1<<bits.Len(uint(max(n, 1)-1))))
	if err != nil {
		return device.Buffer{}, err
	}
	*b = nb
	return nb.Slice(0, n), nil
}

func (o *Sparse) stream(s device.Stream) (*Stream, error) {
	cs, ok := s.(*Stream)
	if !ok || cs.d != o.d {
		return nil, fmt.Errorf("cuda: %T is not a stream of %v", s, o.d)
	}
	if cs.sel == nil {
		cs.sel = &selScratch{}
		sc := cs.sel
		for _, a := range []struct {
			b  *device.Buffer
			dt device.DType
			n  int
		}{{&sc.state, device.Int32, 2}, {&sc.hist, device.Int32, 2048}, {&sc.total, device.Int32, 1}, {&sc.first, device.Int64, 1}} {
			b, err := o.d.Alloc(a.dt, a.n) // whole: used as they are
			if err != nil {
				return nil, err
			}
			*a.b = b
		}
		if err := cs.clearFirst(); err != nil {
			return nil, err
		}
	}
	return cs, nil
}

// noBad is the value of the scratch's first when no bad index was found:
// above every index (k_accumulate and k_mark lower it by an unsigned
// atomicMin).
const noBad = ^uint64(0)

// clearFirst sets the scratch's first back to noBad (a memset: no upload).
func (cs *Stream) clearFirst() error {
	return cs.fill32(cs.sel.first.View(device.Int32, 0, 2), math.MaxUint32)
}

// check that b is a buffer of this GPU of type dt, at least n long.
func (o *Sparse) check(op, name string, b device.Buffer, dt device.DType, n int) error {
	if b.DType() != dt {
		return fmt.Errorf("cuda: %s: %s is %v, want %v", op, name, b.DType(), dt)
	}
	if b.Len() < n {
		return fmt.Errorf("cuda: %s: %s has %d elements, want at least %d", op, name, b.Len(), n)
	}
	if b.Len() > 0 && (b.IsHost() || b.Device() != device.Device(o.d)) {
		return fmt.Errorf("cuda: %s: %s is not memory of %v", op, name, o.d)
	}
	return nil
}

// bufArg is one buffer argument of a primitive and what check requires of
// it: its name in messages, its element type and its least length.
type bufArg struct {
	name string
	b    device.Buffer
	dt   device.DType
	n    int
}

// checkArgs checks each of op's buffer arguments in turn (check).
func (o *Sparse) checkArgs(op string, args ...bufArg) error {
	for _, a := range args {
		if err := o.check(op, a.name, a.b, a.dt, a.n); err != nil {
			return err
		}
	}
	return nil
}

// readU32 copies n 32-bit words of b to the host (synchronizing s).
func readU32(s *Stream, b device.Buffer, n int) ([]int32, error) {
	out := make([]int32, n)
	if err := s.Copy(device.Host(out), b.Slice(0, n)); err != nil {
		return nil, err
	}
	return out, s.Synchronize()
}

// Accumulate adds scale·g to r element-wise (sparsify.Memory.Accumulate's
// pass) and returns the index of the first element of r that became NaN or
// ±Inf, or −1.
func (o *Sparse) Accumulate(s device.Stream, r, g device.Buffer, scale float32) (int, error) {
	cs, err := o.stream(s)
	if err != nil {
		return 0, err
	}
	n := r.Len()
	if err := o.checkArgs("Accumulate", bufArg{"r", r, device.Float32, 0},
		bufArg{"g", g, device.Float32, n}); err != nil {
		return 0, err
	}
	if n == 0 {
		return -1, nil
	}
	first := cs.sel.first // noBad
	if err := cs.args().buf(r).buf(g).i64(n).f32(scale).buf(first).runN(kAccumulate, n); err != nil {
		return 0, err
	}
	var f [1]int64
	if err := cs.Copy(device.Host(f[:]), first); err != nil {
		return 0, err
	}
	if err := cs.Synchronize(); err != nil {
		return 0, err
	}
	if uint64(f[0]) == noBad {
		return -1, nil
	}
	return int(f[0]), cs.clearFirst()
}

// FeedbackFlagClear is the value of a flag of AccumulateFlag before any
// element became non-finite: the caller sets the flag's word to it once.
const FeedbackFlagClear = ^uint64(0)

// MaxFlagged is one more than the largest element index AccumulateFlag's
// flag holds: base + r.Len() must not exceed it.
const MaxFlagged = 1 << 31

// AccumulateFlag is Accumulate without the host's wait: it adds scale·g to
// r element-wise and lowers flag (one Int64 word of this GPU) to the key of
// each element of r that became NaN or ±Inf, which DecodeFeedbackFlag
// reads: base plus the element's index, whether g's element was itself not
// finite, and the value (g's element then, else r's). The host reads the
// flag with a later wait (a copy on s before a synchronisation it makes
// anyway), so error feedback's finiteness check costs no wait of its own.
func (o *Sparse) AccumulateFlag(s device.Stream, r, g, flag device.Buffer, base int, scale float32) error {
	return o.accumulateFlag("AccumulateFlag", s, r, g, flag, device.Buffer{}, base, scale)
}

// HistLen is the length of the histogram of AccumulateFlagHist and
// TopKHist: 2,048 counters (Int32, read as unsigned), one per value of a
// magnitude's bits 30..20.
const HistLen = 2048

// AccumulateFlagHist is AccumulateFlag that also counts the accumulated
// elements of r into hist (HistLen Int32 counters of this GPU, all zero
// beforehand) as the first round of TopK's radix select does, in the same
// pass: TopKHist of r then makes one pass over r fewer. Only the
// accumulation's result is counted: r must be the whole vector the
// selection is of, and nothing may write it in between.
func (o *Sparse) AccumulateFlagHist(s device.Stream, r, g, flag, hist device.Buffer, base int, scale float32) error {
	if err := o.check("AccumulateFlagHist", "hist", hist, device.Int32, HistLen); err != nil {
		return err
	}
	return o.accumulateFlag("AccumulateFlagHist", s, r, g, flag, hist, base, scale)
}

// accumulateFlag is AccumulateFlag, with the histogram of
// AccumulateFlagHist when hist is not empty.
func (o *Sparse) accumulateFlag(op string, s device.Stream, r, g, flag, hist device.Buffer, base int, scale float32) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	n := r.Len()
	if err := o.checkArgs(op, bufArg{"r", r, device.Float32, 0}, bufArg{"g", g, device.Float32, n},
		bufArg{"flag", flag, device.Int64, 1}); err != nil {
		return err
	}
	if base < 0 || base+n > MaxFlagged {
		return fmt.Errorf("cuda: %s: elements [%d, %d) do not fit the flag's %d indices: use Accumulate", op, base, base+n, MaxFlagged)
	}
	if n == 0 {
		return nil
	}
	a := cs.args().buf(r).buf(g).i64(n).f32(scale).i64(base).buf(flag)
	if hist.Len() == 0 {
		return a.runN(kAccumulateFlag, n)
	}
	return a.buf(hist).runN(kAccumulateHist, n)
}

// DecodeFeedbackFlag reads a flag of AccumulateFlag: ok when no element
// became non-finite; otherwise the first such element's index, whether the
// gradient's element was already not finite, and the value (the
// gradient's element then, else the accumulated one).
func DecodeFeedbackFlag(w uint64) (ok bool, index int, gradient bool, value float32) {
	if w == FeedbackFlagClear {
		return true, 0, false, 0
	}
	return false, int(w >> 33), w>>32&1 == 1, math.Float32frombits(uint32(w))
}

// pieceLen is the elements of one block of SegmentSumSquares: the CPU's
// block (sparsify's segBlock).
const pieceLen = 4096

// SegmentSumSquares returns Σ x[i]² in float64 over each segment
// [bounds[j], bounds[j+1]) of x (bounds ascending, within [0, len(x)]),
// bit for bit as package sparsify sums it: blocks of 4096 elements from the
// segment's start (one GPU block each, four interleaved partial sums), the
// block sums added in order.
func (o *Sparse) SegmentSumSquares(s device.Stream, x device.Buffer, bounds []int) ([]float64, error) {
	cs, err := o.stream(s)
	if err != nil {
		return nil, err
	}
	nseg := len(bounds) - 1
	if nseg <= 0 {
		return nil, o.check("SegmentSumSquares", "x", x, device.Float32, 0)
	}
	sums, err := grow(o.d, &cs.sel.sums, device.Float64, nseg)
	if err != nil {
		return nil, err
	}
	if err := o.SegmentSumSquaresTo(s, sums, x, bounds); err != nil {
		return nil, err
	}
	out := make([]float64, nseg)
	if err := cs.Copy(device.Host(out), sums); err != nil {
		return nil, err
	}
	return out, cs.Synchronize()
}

// SegmentSumSquaresTo is SegmentSumSquares that leaves the sums where sums
// is (a Float64 vector of this GPU, len(bounds)−1 elements):
// two launches and no host wait (sparsify.Ops.SegmentSumSquaresTo).
func (o *Sparse) SegmentSumSquaresTo(s device.Stream, sums, x device.Buffer, bounds []int) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	if err := o.check("SegmentSumSquares", "x", x, device.Float32, 0); err != nil {
		return err
	}
	nseg := len(bounds) - 1
	if nseg <= 0 {
		return nil
	}
	if err := o.check("SegmentSumSquares", "sums", sums, device.Float64, nseg); err != nil {
		return err
	}
	sc := cs.sel
	for i := range sc.pieceSets {
		if ps := &sc.pieceSets[i]; ps.bounds != nil && slices.Equal(bounds, ps.bounds) && bounds[nseg] <= x.Len() { // on the device
			sc.lastSet = i
			return o.sumPieces(cs, x, ps, nseg, sums)
		}
	}
	// Pieces of at most pieceLen elements that never straddle a segment.
	var lo []int64
	first := make([]int32, nseg+1)
	for j := range nseg {
		a, b := bounds[j], bounds[j+1]
		if a < 0 || b < a || b > x.Len() {
			return fmt.Errorf("cuda: SegmentSumSquares: segment %d is [%d, %d) of %d elements", j, a, b, x.Len())
		}
		first[j] = int32(len(lo))
		for p := a; p < b; p += pieceLen {
			lo = append(lo, int64(p))
		}
	}
	first[nseg] = int32(len(lo))
	np := len(lo)
	lo = append(lo, int64(bounds[nseg]))
	// The set not used last makes room.
	sc.lastSet = 1 - sc.lastSet
	ps := &sc.pieceSets[sc.lastSet]
	ps.bounds = nil
	pieces, err := grow(o.d, &ps.pieces, device.Int64, np+1)
	if err != nil {
		return err
	}
	pf, err := grow(o.d, &ps.first, device.Int32, nseg+1)
	if err != nil {
		return err
	}
	// Segments are contiguous, so a piece ends where the next one starts
	// (lo[np] is the last segment's end).
	if err := cs.Copy(pieces, device.Host(lo)); err != nil {
		return err
	}
	if err := cs.Copy(pf, device.Host(first)); err != nil {
		return err
	}
	// The next calls with the same segments (every step's) upload nothing.
	ps.bounds, ps.np = slices.Clone(bounds), np
	return o.sumPieces(cs, x, ps, nseg, sums)
}

// sumPieces runs SegmentSumSquares' kernels over the pieces of the nseg
// segments of ps, leaving the sums in sums.
func (o *Sparse) sumPieces(cs *Stream, x device.Buffer, ps *pieceSet, nseg int, sums device.Buffer) error {
	np := ps.np
	pieces, pf := ps.pieces.Slice(0, np+1), ps.first.Slice(0, nseg+1)
	parts, err := grow(o.d, &cs.sel.parts, device.Float64, max(np, 1))
	if err != nil {
		return err
	}
	if np > 0 {
		if err := cs.args().buf(x).buf(pieces).buf(parts).run(kPieceSumsq, np); err != nil {
			return err
		}
	}
	return cs.args().buf(parts).buf(pf).buf(sums).i32(nseg).runN(kSegmentSum, nseg)
}

// selectTiles runs the ordered selection of mode over x: per-tile counts,
// their scan and, unless idx is empty (a count only), the write. It returns
// the number selected, read back only when count is set (top-k knows it).
func (o *Sparse) selectTiles(cs *Stream, x device.Buffer, mode int, idx, val device.Buffer, count bool) (int, error) {
	return o.selectTilesChecked(cs, x, mode, idx, val, count, nil)
}

// selectTilesChecked is selectTiles that, where bad is not nil, also
// copies the first bad index a k_mark before it left in the scratch into
// *bad with the count, in the same host wait.
func (o *Sparse) selectTilesChecked(cs *Stream, x device.Buffer, mode int, idx, val device.Buffer, count bool, bad *uint64) (int, error) {
	n := x.Len()
	tiles := (n + selTile - 1) / selTile
	sc := cs.sel
	counts, err := grow(o.d, &sc.counts, device.Int32, 2*tiles)
	if err != nil {
		return 0, err
	}
	offs, err := grow(o.d, &sc.offs, device.Int32, 2*tiles)
	if err != nil {
		return 0, err
	}
	if err := cs.args().buf(x).i64(n).buf(sc.state).i32(mode).buf(counts).run(kSelCount, tiles); err != nil {
		return 0, err
	}
	if err := cs.args().buf(counts).i32(tiles).buf(sc.state).i32(mode).buf(offs).buf(sc.total).run(kSelOffsets, 1); err != nil {
		return 0, err
	}
	total := -1
	if count {
		var t [1]int32
		var b [1]int64
		if err := cs.Copy(device.Host(t[:]), sc.total.Slice(0, 1)); err != nil {
			return 0, err
		}
		if bad != nil {
			if err := cs.Copy(device.Host(b[:]), sc.first); err != nil {
				return 0, err
			}
		}
		if err := cs.Synchronize(); err != nil {
			return 0, err
		}
		if bad != nil {
			*bad = uint64(b[0])
		}
		total = int(uint32(t[0]))
		if idx.Len() == 0 && val.Len() == 0 {
			return total, nil
		}
		if idx.Len() < total || (val.Len() > 0 && val.Len() < total) {
			return total, fmt.Errorf("%w: %d elements selected, the index buffer holds %d and the value buffer %d", ErrCapacity, total, idx.Len(), val.Len())
		}
	}
	var valArg device.Buffer
	if val.Len() > 0 {
		valArg = val
	}
	return total, cs.args().buf(x).i64(n).buf(sc.state).i32(mode).buf(offs).buf(idx).buf(valArg).run(kSelWrite, tiles)
}

// findKth runs the three radix rounds that leave the k-th largest key of x
// in state[0] and the number of its ties to take in state[1].
func (o *Sparse) findKth(cs *Stream, x device.Buffer, k int) error {
	return o.findKthFrom(cs, x, k, device.Buffer{})
}

// findKthFrom is findKth, with the first round's counts already in first
// (AccumulateFlagHist's) when it is not empty: that round only picks, and
// its pick leaves first zero again.
func (o *Sparse) findKthFrom(cs *Stream, x device.Buffer, k int, first device.Buffer) error {
	sc := cs.sel
	if err := cs.args().buf(sc.state).i32(k).buf(sc.hist).run(kSelInit, 1); err != nil {
		return err
	}
	for i, r := range [...]struct{ shift, bits int }{{20, 11}, {10, 10}, {0, 10}} {
		if i == 0 && first.Len() > 0 {
			if err := cs.args().buf(first).i32(r.shift).i32(r.bits).buf(sc.state).run(kSelPick, 1); err != nil {
				return err
			}
			continue
		}
		if err := cs.args().buf(x).i64(x.Len()).i32(r.shift).i32(r.bits).buf(sc.state).buf(sc.hist).runN(kSelHist, x.Len()); err != nil {
			return err
		}
		if err := cs.args().buf(sc.hist).i32(r.shift).i32(r.bits).buf(sc.state).run(kSelPick, 1); err != nil {
			return err
		}
	}
	return nil
}

// TopK writes the indices of the k largest-magnitude elements of x into
// idx[:k], ascending (ties at the k-th magnitude to the lowest indices, NaN
// above every number), and the elements into val[:k] unless val is empty.
// k is clamped to [0, len(x)]; it returns the clamped k (sparsify.TopK).
func (o *Sparse) TopK(s device.Stream, idx, val, x device.Buffer, k int) (int, error) {
	return o.topK("TopK", s, idx, val, x, device.Buffer{}, k)
}

// TopKHist is TopK of x whose first radix round's counts are in hist,
// written by the AccumulateFlagHist that wrote x (nothing having written x
// since): the same selection with one pass over x fewer. hist is zero
// again after it, ready for the next AccumulateFlagHist, also when the
// selection needs no radix select (k = 0 or k ≥ len(x)).
func (o *Sparse) TopKHist(s device.Stream, idx, val, x, hist device.Buffer, k int) (int, error) {
	if err := o.check("TopKHist", "hist", hist, device.Int32, HistLen); err != nil {
		return 0, err
	}
	return o.topK("TopKHist", s, idx, val, x, hist.Slice(0, HistLen), k)
}

// topK is TopK, from the first round's counts in hist when it is not empty
// (TopKHist).
func (o *Sparse) topK(op string, s device.Stream, idx, val, x, hist device.Buffer, k int) (int, error) {
	cs, err := o.stream(s)
	if err != nil {
		return 0, err
	}
	n := x.Len()
	k = max(0, min(k, n))
	if err := o.checkArgs(op, bufArg{"x", x, device.Float32, 0}, bufArg{"idx", idx, device.Int32, k}); err != nil {
		return 0, err
	}
	if val.Len() > 0 {
		if err := o.check(op, "val", val, device.Float32, k); err != nil {
			return 0, err
		}
	}
	if k == 0 || k == n {
		if hist.Len() > 0 { // not consumed by a pick
			if err := cs.fill32(hist, 0); err != nil {
				return 0, err
			}
		}
	}
	if k == 0 {
		return 0, nil
	}
	if k == n {
		if err := cs.args().buf(idx).i64(n).runN(kIota, n); err != nil {
			return 0, err
		}
		if val.Len() > 0 {
			return k, cs.Copy(val.Slice(0, n), x)
		}
		return k, nil
	}
	if err := o.findKthFrom(cs, x, k, hist); err != nil {
		return 0, err
	}
	_, err = o.selectTiles(cs, x, 0, idx, val, false)
	return k, err
}

// segDescWords is SEG_DESC of kernels.cu: the int64 words describing one
// segment of TopKSegments.
const segDescWords = 5

// segHistBlocks is SEG_HIST_BLOCKS of kernels.cu: the blocks per segment
// of a histogram round.
const segHistBlocks = 8

// TopKSegments selects the top-k of every segment of x at once
// (sparsify.Ops.TopKSegments): for each j in order, TopK of
// x[segs[j][0]:segs[j][1]] with k = ks[j] (clamped to the segment), its
// indices shifted by segs[j][0], written after the segments before it in
// idx; it returns how many indices it wrote. Whatever the number of
// segments, it is ten launches and no host wait; the segments' description
// (40 bytes each) is uploaded only when it differs from the last few
// segmented calls'.
func (o *Sparse) TopKSegments(s device.Stream, idx, x device.Buffer, segs [][2]int, ks []int) (int, error) {
	cs, err := o.stream(s)
	if err != nil {
		return 0, err
	}
	if err := o.check("TopKSegments", "x", x, device.Float32, 0); err != nil {
		return 0, err
	}
	if len(ks) != len(segs) {
		return 0, fmt.Errorf("cuda: TopKSegments: %d budgets for %d segments", len(ks), len(segs))
	}
	desc := make([]int64, 2, 2+segDescWords*len(segs))
	out, tiles := 0, 0
	for j, sg := range segs {
		lo, hi := sg[0], sg[1]
		if lo < 0 || hi < lo || hi > x.Len() {
			return 0, fmt.Errorf("cuda: TopKSegments: segment %d is [%d, %d), outside x's %d elements", j, lo, hi, x.Len())
		}
		k := max(0, min(ks[j], hi-lo))
		if k == 0 {
			continue
		}
		desc = append(desc, int64(lo), int64(hi-lo), int64(k), int64(out), int64(tiles))
		out += k
		tiles += (hi - lo + selTile - 1) / selTile
	}
	if err := o.check("TopKSegments", "idx", idx, device.Int32, out); err != nil {
		return 0, err
	}
	S := (len(desc) - 2) / segDescWords
	if S == 0 {
		return 0, nil
	}
	desc[0], desc[1] = int64(S), int64(tiles)
	dd, err := o.deviceWords(cs, desc)
	if err != nil {
		return 0, err
	}
	return out, o.segTopK(cs, idx, x, dd, S, tiles)
}

// TopKSegmentsOn is TopKSegments with the segments' list in device memory
// (sparsify.Ops.TopKSegmentsOn): list is Int32, its number of segments S
// (at most maxSegs) and then lo, hi and k of each, as a method's kernel
// wrote it; their lengths add up to at most maxLen, and idx holds their
// k's (clamped) sum. The launches are sized by the bounds, the blocks past
// the list's segments and tiles return at once: eleven launches, no upload
// and no host wait.
func (o *Sparse) TopKSegmentsOn(s device.Stream, idx, x, list device.Buffer, maxSegs, maxLen int) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	if err := o.checkArgs("TopKSegmentsOn", bufArg{"x", x, device.Float32, 0},
		bufArg{"idx", idx, device.Int32, 0}, bufArg{"list", list, device.Int32, 1 + 3*maxSegs}); err != nil {
		return err
	}
	if maxSegs <= 0 || maxLen <= 0 {
		return nil
	}
	if maxLen > x.Len() {
		return fmt.Errorf("cuda: TopKSegmentsOn: segments of %d elements in all, x has %d", maxLen, x.Len())
	}
	tiles := (maxLen+selTile-1)/selTile + maxSegs // each segment's last tile may be partial
	sc := cs.sel
	dd, err := grow(o.d, &sc.segDesc, device.Int64, 2+segDescWords*maxSegs)
	if err != nil {
		return err
	}
	if err := cs.args().buf(list).i64(1).buf(dd).runN(kSegDescribe, 1); err != nil {
		return err
	}
	return o.segTopK(cs, idx, x, dd, maxSegs, tiles)
}

// segTopK runs the segmented top-k of the segments described by dd
// (kernels.cu's description) with launches for S segments and the given
// tiles: ten launches.
func (o *Sparse) segTopK(cs *Stream, idx, x, dd device.Buffer, S, tiles int) error {
	sc := cs.sel
	state, err := o.segRadix(cs, x, dd, S)
	if err != nil {
		return err
	}
	counts, err := grow(o.d, &sc.counts, device.Int32, 2*tiles)
	if err != nil {
		return err
	}
	offs, err := grow(o.d, &sc.offs, device.Int32, 2*tiles)
	if err != nil {
		return err
	}
	if err := cs.args().buf(x).buf(dd).buf(state).buf(counts).run(kSegCount, tiles); err != nil {
		return err
	}
	if err := cs.args().buf(counts).buf(dd).buf(state).buf(offs).run(kSegOffsets, S); err != nil {
		return err
	}
	return cs.args().buf(x).buf(dd).buf(state).buf(offs).buf(idx).run(kSegWrite, tiles)
}

// segRadix runs the radix select of every segment described by dd with
// launches for S segments (seven launches) and returns the radix states.
func (o *Sparse) segRadix(cs *Stream, x, dd device.Buffer, S int) (device.Buffer, error) {
	sc := cs.sel
	state, err := grow(o.d, &sc.segState, device.Int32, 2*S)
	if err != nil {
		return device.Buffer{}, err
	}
	hist, err := grow(o.d, &sc.segHist, device.Int32, 2048*S)
	if err != nil {
		return device.Buffer{}, err
	}
	if err := cs.args().buf(dd).buf(state).buf(hist).run(kSegInit, S); err != nil {
		return device.Buffer{}, err
	}
	for _, r := range [...]struct{ shift, bits int }{{20, 11}, {10, 10}, {0, 10}} {
		if err := cs.args().buf(x).buf(dd).i32(r.shift).i32(r.bits).buf(state).buf(hist).run(kSegHist, S*segHistBlocks); err != nil {
			return device.Buffer{}, err
		}
		if err := cs.args().buf(dd).buf(hist).i32(r.shift).i32(r.bits).buf(state).run(kSegPick, S); err != nil {
			return device.Buffer{}, err
		}
	}
	return state, nil
}

// KthLargestAbs returns the k-th largest |x[i]|, 1 <= k <= len(x)
// (sparsify.KthLargestAbs).
func (o *Sparse) KthLargestAbs(s device.Stream, x device.Buffer, k int) (float32, error) {
	cs, err := o.stream(s)
	if err != nil {
		return 0, err
	}
	if err := o.check("KthLargestAbs", "x", x, device.Float32, 0); err != nil {
		return 0, err
	}
	if k < 1 || k > x.Len() {
		return 0, fmt.Errorf("cuda: KthLargestAbs: k = %d must be in [1, %d]", k, x.Len())
	}
	if err := o.findKth(cs, x, k); err != nil {
		return 0, err
	}
	st, err := readU32(cs, cs.sel.state, 1)
	if err != nil {
		return 0, err
	}
	return math.Float32frombits(uint32(st[0])), nil
}

// SelectAbove writes the indices i with |x[i]| >= t into idx, ascending
// (NaN never selected; a NaN t selects nothing), and the elements into val
// unless val is empty, and returns how many. When a buffer is too short it
// writes nothing and returns the count with an error wrapping ErrCapacity
// (sparsify.SelectAbove).
func (o *Sparse) SelectAbove(s device.Stream, idx, val, x device.Buffer, t float32) (int, error) {
	cs, err := o.stream(s)
	if err != nil {
		return 0, err
	}
	if err := o.checkArgs("SelectAbove", bufArg{"x", x, device.Float32, 0},
		bufArg{"idx", idx, device.Int32, 0}); err != nil {
		return 0, err
	}
	if val.Len() > 0 {
		if err := o.check("SelectAbove", "val", val, device.Float32, 0); err != nil {
			return 0, err
		}
	}
	if x.Len() == 0 || t != t {
		return 0, nil
	}
	key := uint32(0) // t <= 0: every number
	if t > 0 {
		key = math.Float32bits(t)
	}
	if err := cs.fill32(cs.sel.state.Slice(0, 1), key); err != nil {
		return 0, err
	}
	n, err := o.selectTiles(cs, x, 1, idx, val, true)
	if err == nil && n > 0 && idx.Len() == 0 {
		err = fmt.Errorf("%w: %d elements selected, the index buffer is empty", ErrCapacity, n)
	}
	return n, err
}

// CountAbove returns the number of elements with |x[i]| >= t (NaN never
// counted): SelectAbove's counting passes without the write.
func (o *Sparse) CountAbove(s device.Stream, x device.Buffer, t float32) (int, error) {
	cs, err := o.stream(s)
	if err != nil {
		return 0, err
	}
	if err := o.check("CountAbove", "x", x, device.Float32, 0); err != nil {
		return 0, err
	}
	if x.Len() == 0 || t != t {
		return 0, nil
	}
	key := uint32(0)
	if t > 0 {
		key = math.Float32bits(t)
	}
	if err := cs.fill32(cs.sel.state.Slice(0, 1), key); err != nil {
		return 0, err
	}
	return o.selectTiles(cs, x, 1, device.Buffer{}, device.Buffer{}, true)
}

// Gather sets dst[j] = x[idx[j]] for j < len(dst).
func (o *Sparse) Gather(s device.Stream, dst, x, idx device.Buffer) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	n := dst.Len()
	if err := o.checkArgs("Gather", bufArg{"dst", dst, device.Float32, 0}, bufArg{"x", x, device.Float32, 0},
		bufArg{"idx", idx, device.Int32, n}); err != nil {
		return err
	}
	return cs.args().buf(dst).buf(x).buf(idx).i64(n).runN(kGatherIdx, n)
}

// GatherIndex sets dst[j] = x[idx[j]] for int32 x.
func (o *Sparse) GatherIndex(s device.Stream, dst, x, idx device.Buffer) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	n := dst.Len()
	if err := o.checkArgs("GatherIndex", bufArg{"dst", dst, device.Int32, 0}, bufArg{"x", x, device.Int32, 0},
		bufArg{"idx", idx, device.Int32, n}); err != nil {
		return err
	}
	return cs.args().buf(dst).buf(x).buf(idx).i64(n).runN(kGatherInt, n)
}

// GatherStrided sets dst[j] = x[start + j·stride] for j < len(dst).
func (o *Sparse) GatherStrided(s device.Stream, dst, x device.Buffer, start, stride int) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	n := dst.Len()
	if err := o.checkArgs("GatherStrided", bufArg{"dst", dst, device.Float32, 0},
		bufArg{"x", x, device.Float32, 0}); err != nil {
		return err
	}
	if n > 0 && (start < 0 || stride < 1 || start+(n-1)*stride >= x.Len()) {
		return fmt.Errorf("cuda: GatherStrided: %d elements from %d by %d leave the %d of x", n, start, stride, x.Len())
	}
	return cs.args().buf(dst).buf(x).i64(start).i64(stride).i64(n).runN(kGatherStrided, n)
}

// ScatterAdd adds scale·val[j] to dst[idx[j]] for j < len(idx); the indices
// must be distinct.
func (o *Sparse) ScatterAdd(s device.Stream, dst, idx, val device.Buffer, scale float32) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	n := idx.Len()
	if err := o.checkArgs("ScatterAdd", bufArg{"dst", dst, device.Float32, 0}, bufArg{"idx", idx, device.Int32, 0},
		bufArg{"val", val, device.Float32, n}); err != nil {
		return err
	}
	return cs.args().buf(dst).buf(idx).buf(val).f32(scale).i64(n).runN(kScatterAdd, n)
}

// ScatterAccum adds a list into a dense sparse sum: where mark[idx[j]] is 0
// it sets dst[idx[j]] = val[j] and the mark, elsewhere it adds val[j].
func (o *Sparse) ScatterAccum(s device.Stream, dst, mark, idx, val device.Buffer) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	n := idx.Len()
	if err := o.checkArgs("ScatterAccum", bufArg{"dst", dst, device.Float32, 0},
		bufArg{"mark", mark, device.Float32, dst.Len()}, bufArg{"idx", idx, device.Int32, 0},
		bufArg{"val", val, device.Float32, n}); err != nil {
		return err
	}
	return cs.args().buf(dst).buf(mark).buf(idx).buf(val).i64(n).runN(kScatterAccum, n)
}

// ScatterFill sets dst[idx[j]] = v for j < len(idx).
func (o *Sparse) ScatterFill(s device.Stream, dst, idx device.Buffer, v float32) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	n := idx.Len()
	if err := o.checkArgs("ScatterFill", bufArg{"dst", dst, device.Float32, 0},
		bufArg{"idx", idx, device.Int32, 0}); err != nil {
		return err
	}
	return cs.args().buf(dst).buf(idx).f32(v).i64(n).runN(kScatterFill, n)
}

// Scatter sets dst[idx[j]] = val[j]·scale for j < len(idx).
func (o *Sparse) Scatter(s device.Stream, dst, idx, val device.Buffer, scale float32) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	n := idx.Len()
	if err := o.checkArgs("Scatter", bufArg{"dst", dst, device.Float32, 0}, bufArg{"idx", idx, device.Int32, 0},
		bufArg{"val", val, device.Float32, n}); err != nil {
		return err
	}
	return cs.args().buf(dst).buf(idx).buf(val).f32(scale).i64(n).runN(kScatter, n)
}

// Div divides every element of x by d.
func (o *Sparse) Div(s device.Stream, x device.Buffer, d float32) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	if err := o.check("Div", "x", x, device.Float32, 0); err != nil {
		return err
	}
	return cs.args().buf(x).f32(d).i64(x.Len()).runN(kDiv, x.Len())
}

// Iota sets idx[j] = start + j.
func (o *Sparse) Iota(s device.Stream, idx device.Buffer, start int) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	if err := o.check("Iota", "idx", idx, device.Int32, 0); err != nil {
		return err
	}
	return cs.args().buf(idx).i32(start).i64(idx.Len()).runN(kIotaFrom, idx.Len())
}

// CountIn returns, for each segment [bounds[j], bounds[j+1]), how many
// indices of idx lie in it.
func (o *Sparse) CountIn(s device.Stream, idx device.Buffer, bounds []int) ([]int, error) {
	cs, err := o.stream(s)
	if err != nil {
		return nil, err
	}
	if err := o.check("CountIn", "idx", idx, device.Int32, 0); err != nil {
		return nil, err
	}
	nseg := len(bounds) - 1
	if nseg <= 0 {
		return nil, nil
	}
	sc := cs.sel
	bb := make([]int64, len(bounds))
	for j, v := range bounds {
		bb[j] = int64(v)
	}
	db, err := grow(o.d, &sc.bounds, device.Int64, len(bb))
	if err != nil {
		return nil, err
	}
	cnt, err := grow(o.d, &sc.counts, device.Int32, nseg)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(bounds, sc.countBounds) { // the same bounds as the last call's: on the device
		sc.countBounds = nil
		if err := cs.Copy(db, device.Host(bb)); err != nil {
			return nil, err
		}
		sc.countBounds = slices.Clone(bounds)
	}
	if err := cs.fill32(cnt, 0); err != nil {
		return nil, err
	}
	if idx.Len() > 0 {
		if err := cs.args().buf(idx).i64(idx.Len()).buf(db).i32(nseg).buf(cnt).runN(kCountIn, idx.Len()); err != nil {
			return nil, err
		}
	}
	h, err := readU32(cs, cnt, nseg)
	if err != nil {
		return nil, err
	}
	out := make([]int, nseg)
	for j, v := range h {
		out[j] = int(uint32(v))
	}
	return out, nil
}

// InRange returns an error naming the first index of idx outside [0, n),
// if any.
func (o *Sparse) InRange(s device.Stream, idx device.Buffer, n int) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	if err := o.check("InRange", "idx", idx, device.Int32, 0); err != nil {
		return err
	}
	return o.rangeCheck(cs, device.Buffer{}, idx, n)
}

// rangeCheck runs k_mark over idx (marking mark unless it is empty) and
// returns an error naming the first index outside [0, n).
func (o *Sparse) rangeCheck(cs *Stream, mark, idx device.Buffer, n int) error {
	m := idx.Len()
	if m == 0 {
		return nil
	}
	if err := o.markRange(cs, mark, idx, n); err != nil {
		return err
	}
	var bad [1]int64
	if err := cs.Copy(device.Host(bad[:]), cs.sel.first); err != nil {
		return err
	}
	if err := cs.Synchronize(); err != nil {
		return err
	}
	return o.rangeError(cs, mark, idx, n, uint64(bad[0]))
}

// markRange issues k_mark over idx (marking mark unless it is empty),
// which leaves the first index outside [0, n) in the scratch's first
// (noBad when there is none), without waiting.
func (o *Sparse) markRange(cs *Stream, mark, idx device.Buffer, n int) error {
	m := idx.Len()
	return cs.args().buf(mark).buf(idx).i64(m).i64(n).buf(cs.sel.first).runN(kMark, m)
}

// rangeError returns nil where bad, the first bad element markRange found,
// is noBad, and otherwise sets the scratch's first back to noBad, clears
// mark (unless it is empty) and returns the error naming the index.
func (o *Sparse) rangeError(cs *Stream, mark, idx device.Buffer, n int, bad uint64) error {
	if bad == noBad {
		return nil
	}
	if err := cs.clearFirst(); err != nil {
		return err
	}
	if mark.Len() > 0 { // some marks may be set: clear them all
		if err := cs.fill32(mark, 0); err != nil {
			return err
		}
	}
	var v [1]int32
	cs.Copy(device.Host(v[:]), idx.Slice(int(bad), int(bad)+1))
	cs.Synchronize()
	return fmt.Errorf("cuda: index %d (element %d of the lists) is outside [0, %d): the workers disagree on the layout or the data is corrupt", v[0], bad, n)
}

// Shift adds off to every index of idx.
func (o *Sparse) Shift(s device.Stream, idx device.Buffer, off int) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	if err := o.check("Shift", "idx", idx, device.Int32, 0); err != nil {
		return err
	}
	return cs.args().buf(idx).i32(off).i64(idx.Len()).runN(kShift, idx.Len())
}

// Union writes the distinct indices of idx, ascending, into out and
// returns how many: each index marks its element of an n-element vector
// (kept zero between calls), the marks are selected in order and cleared
// again. An index outside [0, n) is an error naming it.
func (o *Sparse) Union(s device.Stream, out, idx device.Buffer, n int) (int, error) {
	cs, err := o.stream(s)
	if err != nil {
		return 0, err
	}
	m := idx.Len()
	if err := o.checkArgs("Union", bufArg{"idx", idx, device.Int32, 0},
		bufArg{"out", out, device.Int32, m}); err != nil {
		return 0, err
	}
	if m == 0 {
		return 0, nil
	}
	sc := cs.sel
	if sc.mark.Len() < n {
		if sc.mark.Len() > 0 {
			o.d.Free(sc.mark)
		}
		if sc.mark, err = o.d.Alloc(device.Float32, n); err != nil { // zeroed
			return 0, err
		}
	}
	mark := sc.mark.Slice(0, n)
	// The range check's bad index comes back with the count, in one wait
	// (an index outside [0, n) marks nothing).
	if err := o.markRange(cs, mark, idx, n); err != nil {
		return 0, err
	}
	if err := cs.fill32(sc.state.Slice(0, 1), math.Float32bits(0.5)); err != nil {
		return 0, err
	}
	bad := noBad
	u, err := o.selectTilesChecked(cs, mark, 1, out, device.Buffer{}, true, &bad)
	if bad != noBad {
		return 0, o.rangeError(cs, mark, idx, n, bad) // clears the marks written
	}
	if err != nil {
		return u, err
	}
	return u, o.ScatterFill(s, mark, out.Slice(0, u), 0)
}

// CompactSlots writes x[j] − 1 for every non-zero word of the Int32
// vector x, in order, into idx and returns how many (sparsify's
// Ops.CompactSlots): the occupied slots of a table of index + 1 entries.
// The count comes back to the host; a short idx is an error with it.
func (o *Sparse) CompactSlots(s device.Stream, idx, x device.Buffer) (int, error) {
	cs, err := o.stream(s)
	if err != nil {
		return 0, err
	}
	if err := o.checkArgs("CompactSlots", bufArg{"x", x, device.Int32, 0},
		bufArg{"idx", idx, device.Int32, 0}); err != nil {
		return 0, err
	}
	// The words read as float bits: mode 2 writes each non-zero word minus
	// one.
	return o.selectTiles(cs, x.View(device.Float32, 0, x.Len()), 2, idx, device.Buffer{}, true)
}

// Run runs a method's own kernel (sparsify's Ops.Run; device.Kernel): its
// CUDA C is compiled for this GPU the first time (with the types and
// GRID_STRIDE of kernels.cu before it; cached on disk as Compile caches)
// and launched grid-stride over n elements, the arguments in order:
// buffers of this GPU as pointers, int32 and uint32 as int, int64 as long
// long, float32 as float, float64 as double.
func (o *Sparse) Run(s device.Stream, k *device.Kernel, n int, args ...any) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	l := cs.args()
	for i, a := range args {
		switch v := a.(type) {
		case device.Buffer:
			if v.Len() > 0 && (v.IsHost() || v.Device() != device.Device(o.d)) {
				return fmt.Errorf("cuda: %s: argument %d is %v, not memory of %v", k.Name, i, v, o.d)
			}
			l.buf(v)
		case int32:
			l.i32(int(v))
		case uint32:
			l.i32(int(int32(v)))
		case int64:
			l.i64(int(v))
		case float32:
			l.f32(v)
		case float64:
			l.f64(v)
		default:
			return fmt.Errorf("cuda: %s: argument %d is a %s; kernels take device buffers, int32, uint32, int64, float32 and float64", k.Name, i, reflect.TypeOf(a))
		}
	}
	if n == 0 {
		return nil
	}
	mk, err := o.d.methodKernel(k)
	if err != nil {
		return err
	}
	return l.launch(mk.k, cs.grid(n))
}

// kernelPrelude is what a method's kernel may use without defining it
// (device.Kernel): kernels.cu's integer types and grid-stride loop, which
// kernels.cu begins with.
const kernelPrelude = `typedef long long i64;
typedef unsigned int u32;
typedef unsigned long long u64;

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)
`

// methodKernel is a method's kernel compiled for a device, loaded and
// looked up (Device.methodKernels).
type methodKernel struct {
	mod *module
	k   kernel
}

// methodKernel returns k on d, compiling, loading and looking it up the
// first time: later launches find it by k's address (no name is looked
// up, nothing is allocated).
func (d *Device) methodKernel(k *device.Kernel) (*methodKernel, error) {
	if mk, ok := d.methodKernels.Load(k); ok {
		return mk.(*methodKernel), nil
	}
	src := kernelPrelude + k.CUDA
	image, _, err := Compile(src, d.cc[0], d.cc[1])
	if err != nil {
		return nil, fmt.Errorf("cuda: compiling the kernel %s: %w", k.Name, err)
	}
	unlock, err := d.enter()
	if err != nil {
		return nil, err
	}
	defer unlock()
	m, err := loadModule(image, []string{k.Name})
	if err != nil {
		return nil, err
	}
	mk := &methodKernel{mod: m, k: kernel{m.fns[0], k.Name}}
	if actual, loaded := d.methodKernels.LoadOrStore(k, mk); loaded {
		// Another goroutine loaded it meanwhile: keep one.
		return actual.(*methodKernel), check("cuModuleUnload", drv.cuModuleUnload(m.h))
	}
	return mk, nil
}

// deviceWords returns w on the device: a copy kept from an earlier call
// when one holds the same words, else uploaded into the least recently
// filled of the stream's slots (on cs, ordered after the calls that read
// the slot before).
func (o *Sparse) deviceWords(cs *Stream, w []int64) (device.Buffer, error) {
	sc := cs.sel
	if sc.words[0].buf.Len() == 0 {
		// Every slot at once, with the first list: a method whose lists
		// change every step (DEFT's bins) then allocates nothing later.
		for i := range sc.words {
			if _, err := grow(o.d, &sc.words[i].buf, device.Int64, len(w)); err != nil {
				return device.Buffer{}, err
			}
		}
	}
	for i := range sc.words {
		if sl := &sc.words[i]; sl.words != nil && slices.Equal(sl.words, w) {
			return sl.buf.Slice(0, len(w)), nil
		}
	}
	sl := &sc.words[sc.nextWords]
	sc.nextWords = (sc.nextWords + 1) % len(sc.words)
	sl.words = nil
	b, err := grow(o.d, &sl.buf, device.Int64, len(w))
	if err != nil {
		return device.Buffer{}, err
	}
	kept := slices.Clone(w)
	if err := cs.Copy(b, device.Host(kept)); err != nil {
		return device.Buffer{}, err
	}
	sl.words = kept
	return b, nil
}

// KthLargestAbsSegments sets thr[j] to the ks[j]-th largest magnitude of
// x[segs[j][0]:segs[j][1]] for every j (sparsify.Ops.KthLargestAbsSegments):
// the radix select of TopKSegments for all segments side by side, the
// thresholds left on the device. Eight launches, no host wait; the
// segments' description is uploaded only when it differs from the last
// few calls'.
func (o *Sparse) KthLargestAbsSegments(s device.Stream, thr, x device.Buffer, segs [][2]int, ks []int) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	if err := o.checkArgs("KthLargestAbsSegments", bufArg{"x", x, device.Float32, 0},
		bufArg{"thr", thr, device.Float32, len(segs)}); err != nil {
		return err
	}
	if len(ks) != len(segs) {
		return fmt.Errorf("cuda: KthLargestAbsSegments: %d ranks for %d segments", len(ks), len(segs))
	}
	S := len(segs)
	if S == 0 {
		return nil
	}
	desc := make([]int64, 2, 2+segDescWords*S)
	desc[0] = int64(S) // no tiles
	for j, sg := range segs {
		lo, hi := sg[0], sg[1]
		if lo < 0 || hi < lo || hi > x.Len() {
			return fmt.Errorf("cuda: KthLargestAbsSegments: segment %d is [%d, %d), outside x's %d elements", j, lo, hi, x.Len())
		}
		if ks[j] < 1 || ks[j] > hi-lo {
			return fmt.Errorf("cuda: KthLargestAbsSegments: k = %d of segment %d must be in [1, %d]", ks[j], j, hi-lo)
		}
		desc = append(desc, int64(lo), int64(hi-lo), int64(ks[j]), 0, 0)
	}
	dd, err := o.deviceWords(cs, desc)
	if err != nil {
		return err
	}
	state, err := o.segRadix(cs, x, dd, S)
	if err != nil {
		return err
	}
	return cs.args().buf(state).i64(S).buf(thr).runN(kSegKth, S)
}

// SelectAboveSegments selects every segment of x at its own threshold
// thr[j] at once (sparsify.Ops.SelectAboveSegments): each segment's indices
// with |x[i]| >= thr[j], ascending, at idx[segs[j][0]:], and their numbers
// in counts[j], left on the device. Four launches (and a fill of counts
// where a segment is empty), no host wait; the segments' description is
// uploaded only when it differs from the last few calls'.
func (o *Sparse) SelectAboveSegments(s device.Stream, idx, counts, x, thr device.Buffer, segs [][2]int) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	if err := o.checkArgs("SelectAboveSegments", bufArg{"x", x, device.Float32, 0},
		bufArg{"thr", thr, device.Float32, len(segs)}, bufArg{"counts", counts, device.Int32, len(segs)}); err != nil {
		return err
	}
	desc := make([]int64, 2, 2+segDescWords*len(segs))
	end, tiles := 0, 0
	for j, sg := range segs {
		lo, hi := sg[0], sg[1]
		if lo < 0 || hi < lo || hi > x.Len() {
			return fmt.Errorf("cuda: SelectAboveSegments: segment %d is [%d, %d), outside x's %d elements", j, lo, hi, x.Len())
		}
		if j > 0 && lo < segs[j-1][1] {
			return fmt.Errorf("cuda: SelectAboveSegments: segment %d [%d, %d) starts before segment %d ends (%d): list them ascending, not overlapping", j, lo, hi, j-1, segs[j-1][1])
		}
		end = hi
		if hi == lo {
			continue
		}
		desc = append(desc, int64(lo), int64(hi-lo), int64(j), int64(lo), int64(tiles))
		tiles += (hi - lo + selTile - 1) / selTile
	}
	if err := o.check("SelectAboveSegments", "idx", idx, device.Int32, end); err != nil {
		return err
	}
	S := (len(desc) - 2) / segDescWords
	if S < len(segs) { // the empty segments' counts
		if err := cs.fill32(counts.Slice(0, len(segs)), 0); err != nil {
			return err
		}
	}
	if S == 0 {
		return nil
	}
	desc[0], desc[1] = int64(S), int64(tiles)
	dd, err := o.deviceWords(cs, desc)
	if err != nil {
		return err
	}
	sc := cs.sel
	state, err := grow(o.d, &sc.segState, device.Int32, 2*S)
	if err != nil {
		return err
	}
	tc, err := grow(o.d, &sc.counts, device.Int32, 2*tiles)
	if err != nil {
		return err
	}
	offs, err := grow(o.d, &sc.offs, device.Int32, 2*tiles)
	if err != nil {
		return err
	}
	if err := cs.args().buf(thr).buf(dd).i64(S).buf(state).runN(kSegtInit, S); err != nil {
		return err
	}
	if err := cs.args().buf(x).buf(dd).buf(state).buf(tc).run(kSegtCount, tiles); err != nil {
		return err
	}
	if err := cs.args().buf(tc).buf(dd).buf(offs).buf(counts).run(kSegtOffsets, S); err != nil {
		return err
	}
	return cs.args().buf(x).buf(dd).buf(state).buf(offs).buf(idx).run(kSegtWrite, tiles)
}

// CompactSlotsSegments is CompactSlots of the whole of x into idx (at least
// len(x) long) with the number of non-zero words of each segment
// [bounds[j], bounds[j+1]) of x (sparsify.Ops.CompactSlotsSegments): four
// launches and one host wait for the counts; the bounds are uploaded only
// when they differ from the last few calls' words.
func (o *Sparse) CompactSlotsSegments(s device.Stream, idx, x device.Buffer, bounds []int) ([]int, error) {
	cs, err := o.stream(s)
	if err != nil {
		return nil, err
	}
	if err := o.checkArgs("CompactSlotsSegments", bufArg{"x", x, device.Int32, 0},
		bufArg{"idx", idx, device.Int32, x.Len()}); err != nil {
		return nil, err
	}
	nseg := max(len(bounds)-1, 0)
	for j := range nseg {
		if bounds[j] < 0 || bounds[j+1] < bounds[j] || bounds[j+1] > x.Len() {
			return nil, fmt.Errorf("cuda: CompactSlotsSegments: segment %d is [%d, %d), outside x's %d words", j, bounds[j], bounds[j+1], x.Len())
		}
	}
	counts := make([]int, nseg)
	if x.Len() == 0 {
		return counts, nil
	}
	if _, err := o.selectTiles(cs, x.View(device.Float32, 0, x.Len()), 2, idx, device.Buffer{}, false); err != nil {
		return nil, err
	}
	if nseg == 0 {
		return counts, nil
	}
	bb := make([]int64, len(bounds))
	for j, v := range bounds {
		bb[j] = int64(v)
	}
	db, err := o.deviceWords(cs, bb)
	if err != nil {
		return nil, err
	}
	cnt, err := grow(o.d, &cs.sel.segTotals, device.Int32, nseg)
	if err != nil {
		return nil, err
	}
	if err := cs.args().buf(x).buf(db).buf(cnt).run(kSegNonzero, nseg); err != nil {
		return nil, err
	}
	h, err := readU32(cs, cnt, nseg)
	if err != nil {
		return nil, err
	}
	for j, v := range h {
		counts[j] = int(uint32(v))
	}
	return counts, nil
}

// CountInTo counts the indices of idx in each segment [bounds[j],
// bounds[j+1]) into counts (Int32, len(bounds)−1 elements) on the device
// (sparsify.Ops.CountInTo): two launches, no host wait; the bounds are
// uploaded only when they differ from the last few segmented calls'.
func (o *Sparse) CountInTo(s device.Stream, counts, idx device.Buffer, bounds []int) error {
	cs, err := o.stream(s)
	if err != nil {
		return err
	}
	nseg := len(bounds) - 1
	if nseg <= 0 {
		return nil
	}
	if err := o.checkArgs("CountInTo", bufArg{"idx", idx, device.Int32, 0},
		bufArg{"counts", counts, device.Int32, nseg}); err != nil {
		return err
	}
	bb := make([]int64, len(bounds))
	for j, v := range bounds {
		bb[j] = int64(v)
	}
	db, err := o.deviceWords(cs, bb)
	if err != nil {
		return err
	}
	cnt := counts.Slice(0, nseg)
	if err := cs.fill32(cnt, 0); err != nil {
		return err
	}
	if idx.Len() == 0 {
		return nil
	}
	return cs.args().buf(idx).i64(idx.Len()).buf(db).i32(nseg).buf(cnt).runN(kCountIn, idx.Len())
}
