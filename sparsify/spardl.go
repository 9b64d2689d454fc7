package sparsify

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/options"
)

func init() {
	Register(Method{Name: "spardl", NotProjectable: "SparDL's number of communication rounds grows with log₂ of the worker count", New: newSparDL, CheckWorkers: spardlCheckWorkers, Advice: spardlAdvice, Kernels: []*device.Kernel{rangeFlagKernel},
		Doc: "reference notes 4: sparse reduce-scatter within teams, B-SAG or R-SAG across teams, Bruck all-gather, global residual collection. Deviations: the flat vector is blocked in layout order (the reference reverses the parameters); R-SAG keeps 1/2^(s+1) of a value dropped in round s (the paper's half in round 0), which conserves the gradient.", Params: []options.Option{
			{Key: "teams", Kind: options.Int, Default: 1, Range: options.Within(1, math.MaxInt32, "[]"),
				Doc: "number of teams G (must divide the number of workers)"},
			{Key: "sag", Kind: options.String, Default: "bruck", Choices: []string{"bruck", "rsag"},
				Doc: "spar-all-gather across teams: bruck (B-SAG) or rsag (recursive doubling, R-SAG; a power-of-two number of teams)"},
		}})
}

// spardlCheckWorkers refuses team counts that do not divide the workers,
// and R-SAG with a number of teams that is not a power of two.
func spardlCheckWorkers(P int, p Values) error {
	G := p.Int("teams")
	if P%G != 0 {
		return fmt.Errorf("%d teams do not divide %d workers; use teams in %s", G, P, spardlDivisors(P, false))
	}
	if p.Text("sag") == "rsag" && G&(G-1) != 0 {
		return fmt.Errorf("R-SAG needs a power-of-two number of teams, got %d; use sag bruck or teams in %s", G, spardlDivisors(P, true))
	}
	return nil
}

// Message tags of SparDL's point-to-point phases; each message is sent as
// three messages (length, indices, values) with consecutive tags.
const (
	spardlTagSRS   = 0x5D00 // Spar-Reduce-Scatter
	spardlTagSAG   = 0x5D10 // spar-all-gather across teams (B-SAG or R-SAG)
	spardlTagBruck = 0x5D20 // Bruck all-gather within a team
)

// spardlStep is one step of the Spar-Reduce-Scatter schedule of one worker,
// in in-team ranks and block numbers: send block send to rank dst, receive
// block recv from rank src.
type spardlStep struct{ send, recv, dst, src int }

// spardlSchedule is the Spar-Reduce-Scatter schedule of in-team rank r of a
// team of q workers (SparDL's init_send_info): with m = ceil(log2 q), round i
// has a bag of s_0 = q − 2^(m−1), then s_i = 2^(m−1−i) blocks and distance
// gap_i = 2^(m−1−i); r sends blocks (r+gap_i+j) mod q to (r+gap_i) mod q and
// receives blocks (r+j) mod q from (r−gap_i) mod q, j < s_i, one block per
// step. There are q−1 steps; after them r owns the fully reduced block r.
func spardlSchedule(q, r int) []spardlStep {
	if q <= 1 {
		return nil
	}
	m := 0
	for 1<<m < q {
		m++
	}
	steps := make([]spardlStep, 0, q-1)
	for i := 0; i < m; i++ {
		gap := 1 << (m - 1 - i)
		s := gap
		if i == 0 {
			s = q - 1<<(m-1)
		}
		for j := 0; j < s; j++ {
			steps = append(steps, spardlStep{
				send: (r + gap + j) % q,
				recv: (r + j) % q,
				dst:  (r + gap) % q,
				src:  (r - gap + q) % q,
			})
		}
	}
	return steps
}

// spardlBruckStep is one transfer of a Bruck all-gather among q members
// where member r starts with item r: at step s (gap = 2^s, last = min(2·gap,
// q)) the member sends its buffers 0..last−gap−1 to (r−gap) mod q and
// receives buffers gap..last−1 from (r+gap) mod q, where buffer b holds item
// (r+b) mod q. Each transfer moves one buffer.
type spardlBruckStep struct{ sendBuf, recvBuf, dst, src int }

// spardlBruck is the Bruck all-gather schedule of member r of q.
func spardlBruck(q, r int) []spardlBruckStep {
	var steps []spardlBruckStep
	for gap := 1; gap < q; gap *= 2 {
		last := min(2*gap, q)
		for b := 0; b < last-gap; b++ {
			steps = append(steps, spardlBruckStep{sendBuf: b, recvBuf: b + gap, dst: (r - gap + q) % q, src: (r + gap) % q})
		}
	}
	return steps
}

// spardlReducer is SparDL ("spardl", Zhao et al., arXiv 2304.00737), as the
// reference code ZJU-DAILY/SparDL (allreducer.py) implements it, with teams:
//
//   - The P workers form G = teams teams (option teams, default 1; G must divide
//     P) of Q = P/G workers; worker p is in-team rank r = p mod Q of team
//     p div Q. The flat acc is zero-padded to Q·C, C = ceil(N/Q), and cut
//     into Q blocks of C. k = BudgetK(ρ, C) = max(int(C·ρ), 1) pairs per
//     block. The reference concatenates the parameters in reverse order
//     before blocking; we block the flat vector in layout order (no copy in
//     a different order), which changes only which elements share a block.
//   - Spar-Reduce-Scatter within the team (spardlSchedule): Q−1 steps, one
//     block per step; a block is re-sparsified to its top-k right before it
//     is sent, after every partial sum received so far has been added; what
//     it did not send stays in the worker's working copy (in-procedure
//     residual). After the last step the own block r is reduced to its top-h
//     (h = k unless B-SAG adapts it).
//   - G > 1, B-SAG (option sag "bruck", the default): Bruck all-gather of
//     the h-pair final blocks across the teams (same in-team rank), sum in
//     team order (so every team gets bit-identical sums), keep the top-k if
//     more than k distinct indices U result, and adapt h for the next call
//     with the reference's rule: if (U > k) XOR (h_step > 0) the step doubles
//     on the second agreeing call, otherwise it reverses and halves;
//     h = max(h + h_step, int(k/G)), clamped to [1, C]; initially
//     h = int(C·ρ/G), h_step = int((C·ρ − h)/100).
//   - G > 1, R-SAG (option sag "rsag", G a power of two): log2 G rounds of
//     pairwise exchange of the (at most k-pair) final block with the same
//     in-team rank of team (team XOR 2^s), sparse sum, re-top-k to k. The
//     paper keeps half of each dropped value on either side; after round s
//     the same dropped value is held by 2^(s+1) workers, so each keeps
//     1/2^(s+1) of it (the paper's half in round 0), which conserves the
//     gradient. The two rules differ only from G = 8 on: a value dropped in
//     the last round can never be in the final selection, and only dropped
//     values that are finally selected are kept (see the residual below).
//   - Bruck all-gather of the final blocks within the team (spardlBruck).
//   - Output: out at block j's final positions = value/P, zero elsewhere.
//   - Residual (global residual collection): positions not in the final
//     selection get the worker's own acc back; finally selected positions
//     keep what the worker held back in-procedure (0 where it forwarded the
//     value), plus, for R-SAG, its share of values dropped between teams.
//     B-SAG's dropped values only ever land on positions outside the final
//     selection, which are restored to acc, so (as in the reference) they
//     have no effect. Σ_w residual_w + P·out = Σ_w acc_w then holds up to
//     float32 rounding for every G and both SAG variants.
//   - Wire: int32 block-local indices, float32 values and an int32 length per
//     block, point-to-point (SendRecv), one block per transfer.
//
// Stats: Threshold NaN; ActualDensity = distinct positions (< N) in the final
// result / N; Selected = size of this worker's final block; SelectedPerWorker
// = the final block size of every worker's block (all P workers);
// SelectTime = time spent in top-k selections.
//
// Every pass runs through Ops on the reducer's device (ReduceOn; Reduce is
// ReduceOn on host memory); only the list lengths (one int32 per transfer)
// travel in host memory. Sparse sums keep a value that only one list holds
// as it is and add common ones in list order (mergeOn), as the merge of
// sorted lists does.
type spardlReducer struct {
	b       *Env
	P, rank int
	G, Q    int
	team, r int
	N, C, k int
	density float64
	rsag    bool

	h, hStep int
	hInertia bool

	srs   []spardlStep
	bruck []spardlBruckStep

	work   device.Buffer // Q·C: padded working copy of acc (and in-procedure residual)
	endp   device.Buffer // C: R-SAG share of dropped values in the own block
	lenBuf [2]int32

	// Reusable lists on the device: those in flight, the final block of
	// every in-team rank, B-SAG's per-team buffers, a merge's or trim's
	// result, and the scratch of trims, merges and the output.
	cur, in, res spardlList
	final        []spardlList
	sagBufs      []spardlList
	dn           denseScratch
	sel, gidx    device.Buffer // Int32
	drop, tmp    device.Buffer // Float32
	tmp2         device.Buffer // Float32
}

func newSparDL(e *Env) (Core, error) {
	o := e.o
	P := o.Comm.Size()
	G := o.Params.Int("teams") // divides P (spardlCheckWorkers)
	s := &spardlReducer{
		b:       e,
		P:       P,
		rank:    o.Comm.Rank(),
		G:       G,
		Q:       P / G,
		N:       o.Layout.N,
		density: o.Density,
	}
	s.rsag = o.Params.Text("sag") == "rsag" // with a power-of-two G (spardlCheckWorkers)
	s.team, s.r = s.rank/s.Q, s.rank%s.Q
	s.C = (s.N + s.Q - 1) / s.Q
	s.k = BudgetK(o.Density, s.C)
	s.h = s.k
	if G > 1 && !s.rsag {
		ck := float64(s.C) * o.Density
		s.h = int(ck / float64(G))
		s.hStep = int((ck - float64(s.h)) / 100)
		s.h = max(1, min(s.h, s.C))
	}
	s.srs = spardlSchedule(s.Q, s.r)
	s.bruck = spardlBruck(s.Q, s.r)
	v := &s.b.v
	var err error
	if s.work, err = v.d.Alloc(device.Float32, s.Q*s.C); err != nil {
		return nil, fmt.Errorf("%w", err)
	}
	s.final = make([]spardlList, s.Q)
	if s.rsag {
		if s.endp, err = v.d.Alloc(device.Float32, s.C); err != nil {
			return nil, fmt.Errorf("%w", err)
		}
	} else if G > 1 {
		s.sagBufs = make([]spardlList, G)
	}
	return s, nil
}

// spardlDivisors lists the divisors of p (only the powers of two if pow2)
// for error messages, e.g. "{1, 2, 4}".
func spardlDivisors(p int, pow2 bool) string {
	var d []string
	for i := 1; i <= p; i++ {
		if p%i == 0 && (!pow2 || i&(i-1) == 0) {
			d = append(d, fmt.Sprint(i))
		}
	}
	return "{" + strings.Join(d, ", ") + "}"
}

// Name returns "spardl".
func (s *spardlReducer) Name() string { return "spardl" }

// spardlList is a sparse block in device memory: n ascending block-local
// indices and their values, in buffers of at least n elements.
type spardlList struct {
	idx, vals device.Buffer
	n         int
}

// I and V are the list's indices and values.
func (l spardlList) I() device.Buffer { return l.idx.Slice(0, l.n) }
func (l spardlList) V() device.Buffer { return l.vals.Slice(0, l.n) }

// resize makes l hold n pairs (contents undefined where it grew).
func (l *spardlList) resize(v *vecs, n int) error {
	if _, err := v.scratch(&l.idx, device.Int32, n); err != nil {
		return err
	}
	if _, err := v.scratch(&l.vals, device.Float32, n); err != nil {
		return err
	}
	l.n = n
	return nil
}

// copyList makes dst a copy of src in dst's own buffers.
func (s *spardlReducer) copyList(dst *spardlList, src spardlList) error {
	v := &s.b.v
	if err := dst.resize(v, src.n); err != nil {
		return err
	}
	if err := v.s.Copy(dst.I(), src.I()); err != nil {
		return err
	}
	return v.s.Copy(dst.V(), src.V())
}

// global is the global rank of in-team rank r of team t.
func (s *spardlReducer) global(t, r int) int { return t*s.Q + r }

// exchange sends l to global rank dst and receives a list of at most maxLen
// pairs from global rank src into into (grown as needed). Its indices are
// range-checked without a wait (Env.checkRange: the call fails when it
// ends; what where says is the exchange's place in the call).
func (s *spardlReducer) exchange(ctx context.Context, tag int, l spardlList, dst, src, maxLen int, into *spardlList, where func() string) error {
	v := &s.b.v
	s.lenBuf[0] = int32(l.n)
	n, err := s.b.c.SendRecv(ctx, comm.Int32s(s.lenBuf[0:1]), dst, comm.Int32s(s.lenBuf[1:2]), src, tag)
	if err != nil {
		return fmt.Errorf("exchanging lengths with ranks %d/%d: %w", dst, src, err)
	}
	if n != 1 {
		return fmt.Errorf("rank %d sent a length message of %d elements, want 1", src, n)
	}
	m := int(s.lenBuf[1])
	if m < 0 || m > maxLen {
		return fmt.Errorf("rank %d announced %d pairs, outside [0, %d] (ranks disagree on the options or the data is corrupt)", src, m, maxLen)
	}
	if err := into.resize(v, m); err != nil {
		return err
	}
	if n, err = s.b.c.SendRecv(ctx, v.cb(l.I()), dst, v.cb(into.I()), src, tag+1); err != nil {
		return fmt.Errorf("exchanging %d indices with ranks %d/%d: %w", l.n, dst, src, err)
	}
	if n != m {
		return fmt.Errorf("rank %d sent %d indices after announcing %d", src, n, m)
	}
	if n, err = s.b.c.SendRecv(ctx, v.cb(l.V()), dst, v.cb(into.V()), src, tag+2); err != nil {
		return fmt.Errorf("exchanging %d values with ranks %d/%d: %w", l.n, dst, src, err)
	}
	if n != m {
		return fmt.Errorf("rank %d sent %d values after announcing %d", src, n, m)
	}
	return s.b.checkRange(into.I(), s.C, func(err error) error {
		return fmt.Errorf("%s: rank %d sent a block index outside [0, %d) (ranks disagree on the layout or the data is corrupt): %w", where(), src, s.C, err)
	})
}

// selectBlock replaces l with the top-k of block b of the working copy and
// zeroes the selection there (what is sent is no longer held).
func (s *spardlReducer) selectBlock(b, k int, l *spardlList, selTime *time.Duration) error {
	v := &s.b.v
	blk := s.work.Slice(b*s.C, (b+1)*s.C)
	if err := l.resize(v, min(k, s.C)); err != nil {
		return err
	}
	t, err := s.b.selectTimed(func() error {
		var err error
		l.n, err = v.ops.TopK(v.s, l.idx, l.vals, blk, k)
		return err
	})
	if err != nil {
		return err
	}
	*selTime += t
	return v.ops.ScatterFill(v.s, blk, l.I(), 0)
}

// trimTopK keeps the k largest-magnitude entries of l (ties to lower index);
// with share != 0 it adds share × every removed value to endp at its index.
func (s *spardlReducer) trimTopK(l *spardlList, k int, selTime *time.Duration, share float32) error {
	if l.n <= k {
		return nil
	}
	v := &s.b.v
	sel, err := v.scratch(&s.sel, device.Int32, k)
	if err != nil {
		return err
	}
	t, err := s.b.selectTimed(func() error {
		var err error
		k, err = v.ops.TopK(v.s, sel, device.Buffer{}, l.V(), k)
		return err
	})
	if err != nil {
		return err
	}
	*selTime += t
	sel = sel.Slice(0, k)
	if share != 0 {
		// The removed values: the list's with the kept ones zeroed (adding
		// share·0 leaves endp as it is).
		drop, err := v.scratch(&s.drop, device.Float32, l.n)
		if err != nil {
			return err
		}
		if err := v.s.Copy(drop, l.V()); err != nil {
			return err
		}
		if err := v.ops.ScatterFill(v.s, drop, sel, 0); err != nil {
			return err
		}
		if err := v.ops.ScatterAdd(v.s, s.endp, l.I(), drop, share); err != nil {
			return err
		}
	}
	if err := s.res.resize(v, k); err != nil {
		return err
	}
	if err := v.ops.GatherIndex(v.s, s.res.I(), l.I(), sel); err != nil {
		return err
	}
	if err := v.ops.Gather(v.s, s.res.V(), l.V(), sel); err != nil {
		return err
	}
	return s.copyList(l, s.res)
}

// Reduce is SparDL's core: Spar-Reduce-Scatter, the spar-all-gather
// across teams, the Bruck all-gather within the team, then the output and
// the global residual.
func (s *spardlReducer) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	v := &s.b.v
	selTime := &st.SelectTime
	C, k := s.C, s.k
	if err := v.s.Copy(s.work.Slice(0, s.N), acc); err != nil {
		return err
	}
	if s.N < s.work.Len() {
		if err := v.m.Fill(v.s, s.work.Slice(s.N, s.work.Len()), 0); err != nil {
			return err
		}
	}

	// Spar-Reduce-Scatter.
	cur, in, final := &s.cur, &s.in, s.final
	first, firstK := s.r, s.h
	if len(s.srs) > 0 {
		first, firstK = s.srs[0].send, k
	}
	if err := s.selectBlock(first, firstK, cur, selTime); err != nil {
		return err
	}
	for i, st := range s.srs {
		if err := s.exchange(ctx, spardlTagSRS, *cur, s.global(s.team, st.dst), s.global(s.team, st.src), k, in, func() string { return fmt.Sprintf("reduce-scatter step %d", i) }); err != nil {
			return fmt.Errorf("reduce-scatter step %d: %w", i, err)
		}
		if err := v.ops.ScatterAdd(v.s, s.work.Slice(st.recv*C, (st.recv+1)*C), in.I(), in.V(), 1); err != nil {
			return err
		}
		next, nextK := st.recv, s.h // st.recv == s.r after the last step
		if i+1 < len(s.srs) {
			next, nextK = s.srs[i+1].send, k
		}
		if err := s.selectBlock(next, nextK, cur, selTime); err != nil {
			return err
		}
	}

	// Spar-all-gather across teams.
	if s.G > 1 {
		var err error
		if s.rsag {
			err = s.rsagExchange(ctx, cur, selTime)
		} else {
			err = s.bsagExchange(ctx, cur, selTime)
		}
		if err != nil {
			return fmt.Errorf("spar-all-gather across %d teams: %w", s.G, err)
		}
	}
	final[s.r] = *cur

	// Bruck all-gather of the final blocks within the team.
	for i, st := range s.bruck {
		sb, rb := (s.r+st.sendBuf)%s.Q, (s.r+st.recvBuf)%s.Q
		if err := s.exchange(ctx, spardlTagBruck, final[sb], s.global(s.team, st.dst), s.global(s.team, st.src), k, &final[rb], func() string { return fmt.Sprintf("all-gather transfer %d", i) }); err != nil {
			return fmt.Errorf("all-gather transfer %d: %w", i, err)
		}
	}

	// Output and global residual collection.
	if err := v.m.Fill(v.s, out, 0); err != nil {
		return err
	}
	if !sameMemory(residual, acc) {
		if err := v.s.Copy(residual, acc); err != nil {
			return err
		}
	}
	distinct := 0
	for j, l := range final {
		base := j * C
		// The block's positions below N (past it: the padding).
		m := l.n
		if base+C > s.N {
			cnt, err := v.ops.CountIn(v.s, l.I(), []int{0, max(s.N-base, 0)})
			if err != nil {
				return err
			}
			m = cnt[0]
		}
		if m == 0 {
			continue
		}
		distinct += m
		gi, err := v.scratch(&s.gidx, device.Int32, m)
		if err != nil {
			return err
		}
		if err := v.s.Copy(gi, l.idx.Slice(0, m)); err != nil {
			return err
		}
		if err := v.ops.Shift(v.s, gi, base); err != nil {
			return err
		}
		if err := v.ops.Scatter(v.s, out, gi, l.vals.Slice(0, m), 1); err != nil {
			return err
		}
		held, err := v.scratch(&s.tmp, device.Float32, m)
		if err != nil {
			return err
		}
		if err := v.ops.Gather(v.s, held, s.work, gi); err != nil {
			return err
		}
		if j == s.r && s.rsag && s.G > 1 {
			share, err := v.scratch(&s.tmp2, device.Float32, m)
			if err != nil {
				return err
			}
			if err := v.ops.Gather(v.s, share, s.endp, l.idx.Slice(0, m)); err != nil {
				return err
			}
			if _, err := v.ops.Accumulate(v.s, held, share, 1); err != nil {
				return err
			}
		}
		if err := v.ops.Scatter(v.s, residual, gi, held, 1); err != nil {
			return err
		}
	}
	if err := v.ops.Div(v.s, out, float32(s.P)); err != nil {
		return err
	}
	st.Distinct = distinct
	st.Selected = final[s.r].n
	st.SelectedPerWorker = make([]int, s.P)
	for w := range st.SelectedPerWorker {
		st.SelectedPerWorker[w] = final[w%s.Q].n
	}
	return nil
}

// bsagExchange is B-SAG: Bruck all-gather of the h-pair final blocks of the
// same in-team rank across teams, sum in team order, top-k, h adaptation.
func (s *spardlReducer) bsagExchange(ctx context.Context, cur *spardlList, selTime *time.Duration) error {
	v := &s.b.v
	G := s.G
	bufs := s.sagBufs // buffer b holds team (team+b) mod G
	bufs[0] = *cur
	for i, st := range spardlBruck(G, s.team) {
		if err := s.exchange(ctx, spardlTagSAG, bufs[st.sendBuf], s.global(st.dst, s.r), s.global(st.src, s.r), s.C, &bufs[st.recvBuf], func() string { return fmt.Sprintf("spar-all-gather across %d teams: transfer %d", G, i) }); err != nil {
			return fmt.Errorf("transfer %d: %w", i, err)
		}
	}
	// Coalesce in team order 0..G−1 (bit-identical on every team).
	lists := make([][2]device.Buffer, G)
	total := 0
	for t := range G {
		b := bufs[(t-s.team+G)%G]
		lists[t] = [2]device.Buffer{b.I(), b.V()}
		total += b.n
	}
	if err := s.res.resize(v, total); err != nil {
		return err
	}
	U, err := v.mergeOn(&s.dn, s.C, lists, s.res.idx, s.res.vals)
	if err != nil {
		return err
	}
	s.res.n = U
	// Values dropped here only land outside the final selection, where the
	// residual is restored to acc: no end-procedure bookkeeping is needed.
	if err := s.copyList(&s.in, s.res); err != nil {
		return err
	}
	if err := s.trimTopK(&s.in, s.k, selTime, 0); err != nil {
		return err
	}
	if err := s.copyList(cur, s.in); err != nil {
		return err
	}

	// Adapt h for the next call (the reference's rule).
	if (U > s.k) != (s.hStep > 0) {
		if s.hInertia {
			s.hStep *= 2
			s.hInertia = false
		} else {
			s.hInertia = true
		}
	} else {
		if s.hStep > 1 || s.hStep < -1 {
			s.hStep = int(-0.5 * float64(s.hStep))
		} else {
			s.hStep = -s.hStep
		}
		s.hInertia = false
	}
	s.h = max(s.h+s.hStep, s.k/G)
	s.h = max(1, min(s.h, s.C))
	return nil
}

// rsagExchange is R-SAG: recursive doubling across teams with a re-top-k to
// k after each sparse sum; each worker keeps 1/2^(s+1) of the values dropped
// in round s.
func (s *spardlReducer) rsagExchange(ctx context.Context, cur *spardlList, selTime *time.Duration) error {
	v := &s.b.v
	if err := v.m.Fill(v.s, s.endp, 0); err != nil {
		return err
	}
	for round, gap := 0, 1; gap < s.G; round, gap = round+1, gap*2 {
		peer := s.global(s.team^gap, s.r)
		if err := s.exchange(ctx, spardlTagSAG, *cur, peer, peer, s.k, &s.in, func() string { return fmt.Sprintf("spar-all-gather across %d teams: round %d", s.G, round) }); err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		// The sparse sum of own and received (commutative, so both
		// partners compute the same), re-sparsified.
		if err := s.res.resize(v, cur.n+s.in.n); err != nil {
			return err
		}
		m, err := v.mergeOn(&s.dn, s.C, [][2]device.Buffer{{cur.I(), cur.V()}, {s.in.I(), s.in.V()}}, s.res.idx, s.res.vals)
		if err != nil {
			return err
		}
		s.res.n = m
		if err := s.copyList(cur, s.res); err != nil {
			return err
		}
		if err := s.trimTopK(cur, s.k, selTime, 1/float32(2*gap)); err != nil {
			return err
		}
	}
	return nil
}

// spardlAdvice (one team): P−1 reduce-scatter steps and P−1 Bruck
// transfers, each a length, then the indices and the values of a block's
// k_b = BudgetK(ρ, ⌈N/P⌉) elements (SendRecv); every worker ends with P
// blocks' selections.
var spardlAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		if G := s.Params.Int("teams"); G != 1 {
			return nil, fmt.Errorf("%d teams are not modelled; the advisor models teams = 1", G)
		}
		if s.P <= 1 {
			return nil, nil
		}
		P := float64(s.P)
		kb := float64(BudgetK(s.Density, (s.N+s.P-1)/s.P))
		steps := 2 * (P - 1)
		return []Call{{comm.OpSendRecv, steps, 1}, {comm.OpSendRecv, 2 * steps, kb}}, nil
	},
	Volume: func(s Shape, _ Overlap) (sel, union float64) {
		C := (s.N + s.P - 1) / s.P
		return float64(s.K), min(float64(s.P*BudgetK(s.Density, C)), float64(s.N))
	},
	Selection: SelectsWhole,
	Caveats: func(c Conditions) []string {
		return []string{fmt.Sprintf("%d point-to-point exchanges one after another: latency grows linearly with the workers", 2*(c.P-1))}
	},
	Evidence: Evidence{Shown: []ModelKind{CNN, RNN},
		Papers: "SparDL paper: VGG-16/19, ResNet-20 on CIFAR, LSTM on IMDB, similar accuracy to dense"},
}

// SaveState writes B-SAG's adaptive per-team budget h, its step and
// inertia.
func (s *spardlReducer) SaveState(w *StateWriter) error {
	w.Int(s.h)
	w.Int(s.hStep)
	w.Bool(s.hInertia)
	return nil
}

// LoadState reads them back.
func (s *spardlReducer) LoadState(d *StateReader) error {
	h := d.Int("budget h", 1, max(1, s.C))
	step := d.Int("budget step", math.MinInt64, math.MaxInt64)
	inertia := d.Bool("budget inertia")
	if err := d.Done(); err != nil {
		return err
	}
	s.h, s.hStep, s.hInertia = h, step, inertia
	return nil
}
