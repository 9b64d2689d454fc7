package sparsify

import (
	"context"
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
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

// okRegions is one worker's region state and scratch (on the reducer's
// device).
type okRegions struct {
	c    comm.Communicator
	v    *vecs
	p, r int
	n    int   // elements of the flat vector
	offs []int // region j is [offs[j], offs[j+1])

	// Send side: the pairs for region d are sIdx/sVal[sStart[d]:sStart[d+1]],
	// indices relative to the region's start.
	sStart []int
	sIdx   device.Buffer // Int32
	sVal   device.Buffer // Float32
	ssize  []int32       // per destination rank
	rsize  []int32       // per source rank
	dsize  device.Buffer // Int32: ssize then rsize, for the messages
	// Receive side, by step i (source (r−i) mod p): rIdx/rVal[rOff[i]:rOff[i+1]].
	rOff []int
	rIdx device.Buffer // Int32
	rVal device.Buffer // Float32
	reqs []okPending

	// reduced is the sum of every worker's pairs in the own region.
	reduced device.Buffer // Float32

	// Phase 2: every owner's pairs, flat indices, in rank order.
	counts  []int
	counts2 []int // 2·counts: the words of each owner's pairs
	sizes   []int
	allIdx  device.Buffer // Int32
	allVal  device.Buffer // Float32
	pairs   device.Buffer // Float32: the pairs sent, then those received
	b       *Env          // gatherCountsOn, checkList

	// mem is the device memory of the lists above (each a view of its
	// own), grown once to what a call can need (vecs.bounded).
	mem struct{ sIdx, sVal, rIdx, rVal, reduced, allIdx, allVal, pairs device.Buffer }
}

func newOkRegions(b *Env) okRegions {
	c := b.c
	g := okRegions{c: c, v: &b.v, b: b, p: c.Size(), r: c.Rank(), n: b.n}
	g.offs = make([]int, g.p+1)
	okEqualSplit(g.offs, b.n, g.p)
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
func (g *okRegions) scatterReduce(ctx context.Context, acc, sel device.Buffer) error {
	p, r, v := g.p, g.r, g.v
	counts, err := v.ops.CountIn(v.s, sel, g.offs)
	if err != nil {
		return err
	}
	g.sStart = grow(g.sStart, p+1)
	j := 0
	for d := range p {
		g.sStart[d] = j
		j += counts[d]
	}
	g.sStart[p] = j
	if g.sIdx, err = v.bounded(&g.mem.sIdx, device.Int32, sel.Len(), g.n); err != nil {
		return err
	}
	if g.sVal, err = v.bounded(&g.mem.sVal, device.Float32, sel.Len(), g.n); err != nil {
		return err
	}
	sIdx, sVal := g.sIdx.Slice(0, sel.Len()), g.sVal.Slice(0, sel.Len())
	if err := v.s.Copy(sIdx, sel); err != nil {
		return err
	}
	if err := v.ops.Gather(v.s, sVal, acc, sel); err != nil {
		return err
	}
	for d := range p {
		if err := v.ops.Shift(v.s, sIdx.Slice(g.sStart[d], g.sStart[d+1]), -g.offs[d]); err != nil {
			return err
		}
	}

	// Counts (all-to-all), through device memory.
	g.ssize = grow(g.ssize, p)
	g.rsize = grow(g.rsize, p)
	for d := range p {
		g.ssize[d] = int32(g.sStart[d+1] - g.sStart[d])
	}
	dsize, err := v.scratch(&g.dsize, device.Int32, 2*p)
	if err != nil {
		return err
	}
	if err := v.upload(dsize, g.ssize); err != nil {
		return err
	}
	rsz := dsize.Slice(p, 2*p)
	reqs := g.reqs[:0]
	for i := 1; i < p && err == nil; i++ {
		src := (r - i + p) % p
		var q comm.Request
		if q, err = g.c.IRecv(ctx, v.cb(rsz.Slice(src, src+1)), src, okTagCount); err == nil {
			reqs = append(reqs, okPending{q, 1, src, 1})
		}
	}
	for i := 1; i < p && err == nil; i++ {
		dst := (r + i) % p
		var q comm.Request
		if q, err = g.c.ISend(ctx, v.cb(dsize.Slice(dst, dst+1)), dst, okTagCount); err == nil {
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
	if err := v.download(g.rsize, rsz); err != nil {
		return err
	}
	g.rsize[r] = g.ssize[r]
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
	if g.rIdx, err = v.bounded(&g.mem.rIdx, device.Int32, total, p*own); err != nil {
		return err
	}
	if g.rVal, err = v.bounded(&g.mem.rVal, device.Float32, total, p*own); err != nil {
		return err
	}
	if g.reduced, err = v.scratch(&g.mem.reduced, device.Float32, own); err != nil {
		return err
	}
	if err := v.m.Fill(v.s, g.reduced, 0); err != nil {
		return err
	}

	th := min(okThrottle, p)
	groups := (p + th - 1) / th
	post := func(grp int) error {
		for i := grp * th; i < min(p, (grp+1)*th); i++ {
			ri, rv := g.rIdx.Slice(g.rOff[i], g.rOff[i+1]), g.rVal.Slice(g.rOff[i], g.rOff[i+1])
			if i == 0 {
				if err := v.s.Copy(ri, sIdx.Slice(g.sStart[r], g.sStart[r+1])); err != nil {
					return err
				}
				if err := v.s.Copy(rv, sVal.Slice(g.sStart[r], g.sStart[r+1])); err != nil {
					return err
				}
				continue
			}
			src, dst := (r-i+p)%p, (r+i)%p
			si, sv := sIdx.Slice(g.sStart[dst], g.sStart[dst+1]), sVal.Slice(g.sStart[dst], g.sStart[dst+1])
			q, err := g.c.IRecv(ctx, v.cb(ri), src, okTagIdx)
			if err != nil {
				return err
			}
			g.reqs = append(g.reqs, okPending{q, 3, src, ri.Len()})
			if q, err = g.c.IRecv(ctx, v.cb(rv), src, okTagVal); err != nil {
				return err
			}
			g.reqs = append(g.reqs, okPending{q, 5, src, rv.Len()})
			if q, err = g.c.ISend(ctx, v.cb(si), dst, okTagIdx); err != nil {
				return err
			}
			g.reqs = append(g.reqs, okPending{q, 2, dst, 0})
			if q, err = g.c.ISend(ctx, v.cb(sv), dst, okTagVal); err != nil {
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
// in step order. The indices' range checks cost no wait (Env.checkRange: an
// index outside the region fails the call when it ends).
func (g *okRegions) addGroup(grp, th int) error {
	v := g.v
	own := g.reduced.Len()
	for i := grp * th; i < min(g.p, (grp+1)*th); i++ {
		idx, val := g.rIdx.Slice(g.rOff[i], g.rOff[i+1]), g.rVal.Slice(g.rOff[i], g.rOff[i+1])
		src := (g.r - i + g.p) % g.p
		err := g.b.checkRange(idx, own, func(err error) error {
			return fmt.Errorf("rank %d sent an index outside its region of %d elements (the workers disagree on the layout or the data is corrupt): %w", src, own, err)
		})
		if err != nil {
			return err
		}
		if err := v.ops.ScatterAdd(v.s, g.reduced, idx, val, 1); err != nil {
			return err
		}
	}
	return nil
}

// gatherCounts all-gathers every owner's number of pairs (one int32 each)
// into g.counts and returns their sum; an owner's count above its region's
// size is an error.
func (g *okRegions) gatherCounts(ctx context.Context, mine int) (int, error) {
	counts, err := g.b.gatherCountsOn(ctx, mine, "pairs")
	if err != nil {
		return 0, fmt.Errorf("gathering the owners' pair counts: %w", err)
	}
	g.counts = counts
	total := 0
	for w, c := range counts {
		if c > g.size(w) {
			return 0, fmt.Errorf("rank %d announced %d pairs for its region of %d elements (the workers disagree on the layout or the data is corrupt)", w, c, g.size(w))
		}
		total += c
	}
	return total, nil
}

// gatherPairs all-gathers every owner's pairs (idx region-relative and
// distinct, val; g.counts from gatherCounts) in one AllGatherV, as the
// reference does: each owner's message is its m indices (int32 bits) then
// its m values (float32), 2·m 32-bit words. They land in g.allIdx (flat
// indices, by owner) and g.allVal. Each owner's indices are range-checked
// against its region without a wait (Env.checkRange), and all of them
// checked distinct with one count (Ops.Union), the one host wait.
func (g *okRegions) gatherPairs(ctx context.Context, idx, val device.Buffer, total int) error {
	v := g.v
	var err error
	if g.allIdx, err = v.bounded(&g.mem.allIdx, device.Int32, total, g.n); err != nil {
		return err
	}
	if g.allVal, err = v.bounded(&g.mem.allVal, device.Float32, total, g.n); err != nil {
		return err
	}
	m := idx.Len()
	if g.pairs, err = v.bounded(&g.mem.pairs, device.Float32, 2*(m+total), 2*(g.size(g.r)+g.n)); err != nil {
		return err
	}
	send, recv := g.pairs.Slice(0, 2*m), g.pairs.Slice(2*m, 2*(m+total))
	if err := v.s.Copy(send.View(device.Int32, 0, m), idx); err != nil {
		return err
	}
	if err := v.s.Copy(send.Slice(m, 2*m), val); err != nil {
		return err
	}
	g.counts2 = grow(g.counts2, len(g.counts))
	for w, c := range g.counts {
		g.counts2[w] = 2 * c
	}
	if err := g.c.AllGatherV(ctx, v.cb(send), v.cb(recv), g.counts2); err != nil {
		return fmt.Errorf("gathering %d index-value pairs: %w", total, err)
	}
	at := 0
	for _, m := range g.counts {
		if err := v.s.Copy(g.allIdx.Slice(at, at+m), recv.View(device.Int32, 4*2*at, m)); err != nil {
			return err
		}
		if err := v.s.Copy(g.allVal.Slice(at, at+m), recv.Slice(2*at+m, 2*at+2*m)); err != nil {
			return err
		}
		at += m
	}
	at = 0
	for w, m := range g.counts {
		list := g.allIdx.Slice(at, at+m)
		err := g.b.checkRange(list, g.size(w), func(err error) error {
			return fmt.Errorf("rank %d sent an index outside its region of %d elements (the workers disagree on the layout or the data is corrupt): %w", w, g.size(w), err)
		})
		if err != nil {
			return err
		}
		if err := v.ops.Shift(v.s, list, g.offs[w]); err != nil {
			return err
		}
		at += m
	}
	// In their regions, the owners' lists are distinct from each other.
	u, err := v.bounded(&g.b.dUnion, device.Int32, total, g.n)
	if err != nil {
		return err
	}
	d, err := v.ops.Union(v.s, u, g.allIdx.Slice(0, total), g.n)
	if err != nil || d != total {
		return fmt.Errorf("the owners sent %d indices of which %d are distinct (the workers disagree on the layout or the data is corrupt; %v)", total, d, err)
	}
	return nil
}
