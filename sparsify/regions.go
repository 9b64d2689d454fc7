package sparsify

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

// The region machinery that TopkDSA ("topkdsa") and Ok-Topk ("oktopk") share
// (Shigangli/Ok-Topk, VGG/allreducer.py; reference notes 7.8): the flat
// vector is cut into P contiguous regions, region j is owned by rank j, every
// worker sends its selected (index, value) pairs of region j to rank j, the
// owner sums them, and the owners' sparse (or dense) sums are all-gathered.

// Constants of the Ok-Topk code (VGG/allreducer.py, VGG/compression.py).
const (
	// okDefaultWarmup is the number of initial dense all-reduce iterations
	// of every sparse method of the Ok-Topk code.
	okDefaultWarmup = 512
	// okThrottle is the number of destinations whose messages are in flight
	// at once in the region exchange.
	okThrottle = 4

	// Message tags of the region exchange: the counts, then the indices and
	// the values of each destination's pairs.
	okTagCount = 0x6F00
	okTagIdx   = 0x6F01
	okTagVal   = 0x6F02
)

// denseWarmupParam declares the option dense_warmup with a method's
// default: the number of initial calls that all-reduce the gradient densely
// before the method sparsifies. dragonn, oktopk and topkdsa share it (one
// option, one flag, each method with its own default): a run uses one
// method, and the warm-up means the same for all three.
func denseWarmupParam(def int) Param {
	return Param{Name: "dense_warmup", Flag: "dense-warmup", Kind: Int, Default: def, Min: 0, Max: math.MaxInt32,
		Doc: "dense all-reduce iterations before sparsifying (0: none)"}
}

// okEqualSplit sets offs (length p+1) to the Ok-Topk code's equal split of n
// elements into p regions: region j < p−1 is [j·⌊n/p⌋, (j+1)·⌊n/p⌋), the last
// region takes the rest. (The reference gives the last region n mod ⌊n/p⌋
// extra elements instead of n − p·⌊n/p⌋, which is wrong when n mod p >=
// ⌊n/p⌋, and divides by zero when n < p; here the sizes always sum to n,
// and with n < p all but the last region are empty.)
func okEqualSplit(offs []int, n, p int) {
	s := n / p
	for j := range p {
		offs[j] = j * s
	}
	offs[p] = n
}

// okAbove is the smallest float32 t' with |x| >= t' ⟺ |x| > t for every
// finite x: SelectAbove(x, okAbove(t)) selects |x| > t, the reference's strict
// comparison. okAbove(0) selects the non-zero elements.
func okAbove(t float32) float32 { return math.Nextafter32(t, float32(math.Inf(1))) }

// okCountAbove is the number of elements with |x[i]| > t (t >= 0, x finite),
// on all cores for large x.
func okCountAbove(x []float32, t float32) int {
	tb := math.Float32bits(t)
	p := selChunks(len(x))
	counts := make([]int, p)
	selParallel(len(x), p, func(c, lo, hi int) {
		n := 0
		for _, v := range selBits(x[lo:hi]) {
			n += selB2I(v&^(1<<31) > tb)
		}
		counts[c] = n
	})
	total := 0
	for _, n := range counts {
		total += n
	}
	return total
}

// okPending is a non-blocking call of the region exchange: what it moves
// (one of okWhat), with which rank, and for a receive the number of
// elements it must report.
type okPending struct {
	q          comm.Request
	what, peer int
	want       int
}

// okWhat describes the kinds of okPending in errors.
var okWhat = [...]string{"sending the pair count to", "receiving the pair count from", "sending indices to", "receiving indices from", "sending values to", "receiving values from"}

// okWaitAll waits for every request, even after one fails (so no buffer is
// left in use), and returns the first error.
func okWaitAll(ctx context.Context, reqs []okPending) error {
	var first error
	for _, r := range reqs {
		n, err := r.q.Wait(ctx)
		if first != nil {
			continue
		}
		switch {
		case err != nil:
			first = fmt.Errorf("%s rank %d: %w", okWhat[r.what], r.peer, err)
		case r.what%2 == 1 && n != r.want:
			first = fmt.Errorf("%s rank %d: got %d elements, announced %d (the workers disagree on the layout or the data is corrupt)", okWhat[r.what], r.peer, n, r.want)
		}
	}
	return first
}

// okRegions is one worker's region state and scratch.
type okRegions struct {
	c    *comm.Counter
	p, r int
	n    int   // elements of the flat vector
	offs []int // region j is [offs[j], offs[j+1])

	// Send side: the pairs for region d are sIdx/sVal[sStart[d]:sStart[d+1]],
	// indices relative to the region's start.
	sStart []int
	sIdx   []int32
	sVal   []float32
	ssize  []int32 // per destination rank
	rsize  []int32 // per source rank
	// Receive side, by step i (source (r−i) mod p): rIdx/rVal[rOff[i]:rOff[i+1]].
	rOff []int
	rIdx []int32
	rVal []float32
	reqs []okPending

	// reduced is the sum of every worker's pairs in the own region.
	reduced []float32

	// Phase 2: every owner's pairs, flat indices, in rank order.
	cnt    []int32
	counts []int
	sizes  []int
	allIdx []int32
	allVal []float32
}

func newOkRegions(c *comm.Counter, n int) okRegions {
	g := okRegions{c: c, p: c.Size(), r: c.Rank(), n: n}
	g.offs = make([]int, g.p+1)
	okEqualSplit(g.offs, n, g.p)
	return g
}

// size is the number of elements of region j.
func (g *okRegions) size(j int) int { return g.offs[j+1] - g.offs[j] }

// regionSizes returns the sizes of all regions (as AllGatherV counts).
func (g *okRegions) regionSizes() []int {
	g.sizes = grow(g.sizes, g.p)
	for j := range g.p {
		g.sizes[j] = g.size(j)
	}
	return g.sizes
}

// scatterReduce sends this worker's pairs (sel, ascending flat indices, with
// their acc values) to the owners of their regions and leaves the sum of
// every worker's pairs in the own region in g.reduced (region-relative).
//
// As the reference: the counts go first (an all-to-all, here p−1 pairs of
// non-blocking sends and receives of one int32), then the pairs travel in
// steps i = 0, …, p−1 (step i sends to rank (r+i) mod p and receives from
// (r−i) mod p; step 0 is the own region, copied), okThrottle steps at a time,
// indices as int32 and values as float32 in two messages. While one group of
// steps is in flight the previous group's pairs are added, in step order, so
// the owner's sums are in the fixed order r, r−1, …, r+1 (mod p) on every
// backend.
func (g *okRegions) scatterReduce(ctx context.Context, acc []float32, sel []int32) error {
	p, r := g.p, g.r
	g.sStart = grow(g.sStart, p+1)
	g.sIdx = grow(g.sIdx, len(sel))
	g.sVal = grow(g.sVal, len(sel))
	j := 0
	for d := range p {
		g.sStart[d] = j
		lo, hi := int32(g.offs[d]), int32(g.offs[d+1])
		for j < len(sel) && sel[j] < hi {
			g.sIdx[j] = sel[j] - lo
			g.sVal[j] = acc[sel[j]]
			j++
		}
	}
	g.sStart[p] = j

	// Counts (all-to-all).
	g.ssize = grow(g.ssize, p)
	g.rsize = grow(g.rsize, p)
	for d := range p {
		g.ssize[d] = int32(g.sStart[d+1] - g.sStart[d])
	}
	g.rsize[r] = g.ssize[r]
	reqs := g.reqs[:0]
	var err error
	for i := 1; i < p && err == nil; i++ {
		src := (r - i + p) % p
		var q comm.Request
		if q, err = g.c.IRecv(ctx, comm.Int32s(g.rsize[src:src+1]), src, okTagCount); err == nil {
			reqs = append(reqs, okPending{q, 1, src, 1})
		}
	}
	for i := 1; i < p && err == nil; i++ {
		dst := (r + i) % p
		var q comm.Request
		if q, err = g.c.ISend(ctx, comm.Int32s(g.ssize[dst:dst+1]), dst, okTagCount); err == nil {
			reqs = append(reqs, okPending{q, 0, dst, 0})
		}
	}
	werr := okWaitAll(ctx, reqs)
	g.reqs = reqs[:0]
	if err != nil {
		return fmt.Errorf("exchanging pair counts: %w", err)
	}
	if werr != nil {
		return fmt.Errorf("exchanging pair counts: %w", werr)
	}
	own := g.size(r)
	g.rOff = grow(g.rOff, p+1)
	g.rOff[0] = 0
	for i := range p {
		src := (r - i + p) % p
		m := int(g.rsize[src])
		if m < 0 || m > own {
			return fmt.Errorf("rank %d announced %d pairs for region %d of %d elements (the workers disagree on the layout or the data is corrupt)", src, m, r, own)
		}
		g.rOff[i+1] = g.rOff[i] + m
	}
	total := g.rOff[p]
	g.rIdx = grow(g.rIdx, total)
	g.rVal = grow(g.rVal, total)
	g.reduced = grow(g.reduced, own)
	clear(g.reduced)

	th := min(okThrottle, p)
	groups := (p + th - 1) / th
	post := func(grp int) error {
		for i := grp * th; i < min(p, (grp+1)*th); i++ {
			ri, rv := g.rIdx[g.rOff[i]:g.rOff[i+1]], g.rVal[g.rOff[i]:g.rOff[i+1]]
			if i == 0 {
				copy(ri, g.sIdx[g.sStart[r]:g.sStart[r+1]])
				copy(rv, g.sVal[g.sStart[r]:g.sStart[r+1]])
				continue
			}
			src, dst := (r-i+p)%p, (r+i)%p
			si, sv := g.sIdx[g.sStart[dst]:g.sStart[dst+1]], g.sVal[g.sStart[dst]:g.sStart[dst+1]]
			q, err := g.c.IRecv(ctx, comm.Int32s(ri), src, okTagIdx)
			if err != nil {
				return err
			}
			g.reqs = append(g.reqs, okPending{q, 3, src, len(ri)})
			if q, err = g.c.IRecv(ctx, comm.Float32s(rv), src, okTagVal); err != nil {
				return err
			}
			g.reqs = append(g.reqs, okPending{q, 5, src, len(rv)})
			if q, err = g.c.ISend(ctx, comm.Int32s(si), dst, okTagIdx); err != nil {
				return err
			}
			g.reqs = append(g.reqs, okPending{q, 2, dst, 0})
			if q, err = g.c.ISend(ctx, comm.Float32s(sv), dst, okTagVal); err != nil {
				return err
			}
			g.reqs = append(g.reqs, okPending{q, 4, dst, 0})
		}
		return nil
	}
	wait := func() error {
		err := okWaitAll(ctx, g.reqs)
		g.reqs = g.reqs[:0]
		return err
	}
	for grp := range groups {
		perr := post(grp)
		if perr == nil && grp > 0 {
			perr = g.addGroup(grp-1, th)
		}
		werr := wait()
		if perr != nil {
			return fmt.Errorf("exchanging pairs (steps %d to %d): %w", grp*th, min(p, (grp+1)*th)-1, perr)
		}
		if werr != nil {
			return fmt.Errorf("exchanging pairs (steps %d to %d): %w", grp*th, min(p, (grp+1)*th)-1, werr)
		}
	}
	return g.addGroup(groups-1, th)
}

// addGroup adds the received pairs of the steps of group grp to g.reduced,
// in step order.
func (g *okRegions) addGroup(grp, th int) error {
	own := int32(len(g.reduced))
	for i := grp * th; i < min(g.p, (grp+1)*th); i++ {
		idx, val := g.rIdx[g.rOff[i]:g.rOff[i+1]], g.rVal[g.rOff[i]:g.rOff[i+1]]
		for t, j := range idx {
			if j < 0 || j >= own {
				return fmt.Errorf("rank %d sent index %d outside its region of %d elements (the workers disagree on the layout or the data is corrupt)", (g.r-i+g.p)%g.p, j, own)
			}
			g.reduced[j] += val[t]
		}
	}
	return nil
}

// gatherCounts all-gathers every owner's number of pairs (one int32 each)
// into g.counts and returns their sum; an owner's count above its region's
// size is an error.
func (g *okRegions) gatherCounts(ctx context.Context, mine int) (int, error) {
	g.cnt = grow(g.cnt, g.p)
	if err := g.c.AllGather(ctx, comm.Int32s{int32(mine)}, comm.Int32s(g.cnt)); err != nil {
		return 0, fmt.Errorf("gathering the owners' pair counts: %w", err)
	}
	g.counts = grow(g.counts, g.p)
	total := 0
	for w, v := range g.cnt {
		if v < 0 || int(v) > g.size(w) {
			return 0, fmt.Errorf("rank %d announced %d pairs for its region of %d elements (the workers disagree on the layout or the data is corrupt)", w, v, g.size(w))
		}
		g.counts[w] = int(v)
		total += int(v)
	}
	return total, nil
}

// gatherPairs all-gathers every owner's pairs (idx region-relative and
// strictly ascending, val; g.counts from gatherCounts) with AllGatherV, the
// indices as int32 and the values as float32, into g.allIdx (flat indices,
// ascending over all owners) and g.allVal.
func (g *okRegions) gatherPairs(ctx context.Context, idx []int32, val []float32, total int) error {
	g.allIdx = grow(g.allIdx, total)
	g.allVal = grow(g.allVal, total)
	if err := g.c.AllGatherV(ctx, comm.Int32s(idx), comm.Int32s(g.allIdx), g.counts); err != nil {
		return fmt.Errorf("gathering %d indices: %w", total, err)
	}
	if err := g.c.AllGatherV(ctx, comm.Float32s(val), comm.Float32s(g.allVal), g.counts); err != nil {
		return fmt.Errorf("gathering %d values: %w", total, err)
	}
	at := 0
	for w, m := range g.counts {
		lo, size := int32(g.offs[w]), int32(g.size(w))
		prev := int32(-1)
		for i := at; i < at+m; i++ {
			j := g.allIdx[i]
			if j <= prev || j >= size {
				return fmt.Errorf("rank %d sent index %d (pair %d), not ascending within its region of %d elements (the workers disagree on the layout or the data is corrupt)", w, j, i-at, size)
			}
			prev = j
			g.allIdx[i] = j + lo
		}
		at += m
	}
	return nil
}

// okDenseReduce is the dense warm-up iteration of the Ok-Topk code: out =
// (Σ_w acc_w)/P (all-reduce in the communicator's canonical order, then a
// division, as the reference), residual = 0.
func okDenseReduce(ctx context.Context, b *base, acc, out, residual []float32) (Stats, error) {
	before := b.c.Totals()
	copy(out, acc)
	if err := b.c.AllReduce(ctx, comm.Float32s(out)); err != nil {
		return Stats{}, fmt.Errorf("sparsify: %s: dense warm-up iteration %d: all-reducing %d values: %w", b.name, b.iter, len(out), err)
	}
	pf := float32(b.c.Size())
	for i := range out {
		out[i] /= pf
	}
	clear(residual)
	st := b.stats(before, 0)
	st.ActualDensity = 1
	st.Selected = b.n
	return st, nil
}

// okSince adds the time since t0 to *d.
func okSince(d *time.Duration, t0 time.Time) { *d += time.Since(t0) }
