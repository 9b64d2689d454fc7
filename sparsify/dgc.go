package sparsify

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"slices"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/options"
)

func init() {
	Register(Method{Name: "dgc", Projectable: true, New: newDGCReducer, Advice: dgcAdvice, CorrectsMomentum: true, ScaledClip: true,
		Density: func(ModelKind) float64 { return 0.001 }, Notes: dgcNotes, Kernels: []*device.Kernel{dgcMomentum, dgcCount, dgcDecide, dgcTake},
		Doc: "reference notes 7.4: Deep Gradient Compression: per-tensor double sampling of the tensors of more than one dimension (1-D tensors all-reduced dense), momentum correction with momentum-factor masking (Options.Momentum, the optimizer's, which then applies momentum to weight decay only), the density warm-up over the first epochs (Reducer.SetStepsPerEpoch), local clipping scaled by 1/√n (Method.ScaledClip, the trainer's), sparse all-gather. Deviations: the samples' random start is seeded per rank, iteration and tensor; the warm-up is the paper's 0.25^(e+1) (the reference's configuration ramps with ρ^(1/(E+1))).",
		Params: []options.Option{
			{Key: "sparsity_warmup", Kind: options.Int, Default: dgcDefaultWarmup, Range: options.Within(0, 1000, "[]"), Zero: "none",
				Doc: "epochs of DGC's density warm-up, at most 1000: density max(0.25^(e+1), ρ) in epoch e"},
		}})
}

// dgcDefaultWarmup is the default of dgc's option sparsity_warmup: the
// paper's four epochs (sparsity 75 %, 93.75 %, 98.4375 %, 99.6 %, then
// 99.9 %).
const dgcDefaultWarmup = 4

// dgcWarmupBase is the warm-up's density of epoch 0; epoch e has
// dgcWarmupBase^(e+1).
const dgcWarmupBase = 0.25

// dgcReducer is "dgc", Deep Gradient Compression (Lin et al., ICLR'18) as
// the paper and its reference code (synxlin/deep-gradient-compression,
// reference notes 7.4) define it:
//
//   - Which tensors: those of more than one dimension are compressed; 1-D
//     tensors (biases, batch-norm parameters) are all-reduced densely (the
//     reference's `param.dim() > 1`). Layout.Tensors[i].Dims() tells them
//     apart; a tensor whose Dims() is 0 (shape unknown) is compressed.
//   - Momentum correction (Options.Momentum = m > 0, the optimizer's SGD
//     momentum, which the trainer passes and then applies to weight decay
//     only, as DGC's optimizer does): each worker keeps a momentum u and a
//     velocity v per compressed element, u ← m·u + g, v ← v + u; the
//     selection is made on v and sends v's values; momentum-factor masking
//     then zeroes both u and v at the sent indices. The reducer's contract
//     (acc = residual + gradient) carries this: the residual written for
//     the next call is v + m·u (both masked), so that the next acc is the
//     next v; the reducer keeps the masked v (dgcMomentum), from
//     which u = acc − v. For the dense tensors the momentum is applied to
//     the average, u ← m·u + mean_w(g_w), out = u (the reference's
//     compensate(accumulate=False)); their residual is 0. The output is
//     thus the update direction with momentum applied. With m = 0 (Adam, or
//     no momentum) it is plain error feedback: residual = acc with the sent
//     entries zeroed. The error norm (Stats.ErrorNorm) is ‖v‖ over the
//     compressed tensors, what the worker holds back, as every method's:
//     not ‖v + m·u‖, the residual, which also carries the momentum.
//   - Density warm-up (option sparsity_warmup = E epochs, default 4, the
//     paper's; it needs the calls per epoch, Reducer.SetStepsPerEpoch, which
//     the trainer gives — without them there is no warm-up): epoch e < E uses
//     density max(0.25^(e+1), ρ) — 0.25, 0.0625, 0.0156, 0.0039 — then ρ.
//     (The reference's wm5 configuration ramps with ρ^(1/(E+1)) instead.)
//   - Local gradient clipping is the trainer's (Method.ScaledClip: -clip
//     clips each worker's gradient before error feedback at the threshold
//     divided by √n, the paper's §3.2).
//   - Per compressed tensor, nsel = ⌈numel·ρ_e⌉ (DGC's rounding, at least
//     1), chosen by dgcSelect's double sampling: strided samples of about
//     1 % of the tensor (at least ⌈2/ρ_e⌉; tensors of at most ⌈2/ρ_e⌉
//     elements are sampled whole), a threshold from the top ⌈samples·ρ_e⌉
//     samples, selection of |x| >= thr, then up to 10 adaptation rounds
//     (more than 1.3·nsel candidates: exact top-nsel among them; fewer than
//     0.8·nsel: thr ×= 0.8) and finally the first nsel candidates in index
//     order. The stride's random start is drawn from Options.Seed, the
//     rank, the iteration and the tensor (identical across runs for a
//     seed).
//   - Communication, one exchange per call for all compressed tensors (like
//     Horovod's tensor fusion): an AllGather of one int32 count per worker,
//     then AllGatherV of the int32 flat indices and of the float32 values;
//     out = (Σ_w value_w)/n at every received index (summed in rank order,
//     bit-identical on every rank), 0 elsewhere. The dense tensors: one
//     AllReduce of their concatenation, divided by n.
//
// Without momentum it conserves the gradient: Σ_w residual_w + n·out = Σ_w
// acc_w up to float32 rounding. Stats: Selected = own count (sparse pairs
// plus dense elements), SelectedPerWorker = the gathered counts (plus the
// dense elements), LayerK = own count per tensor, ActualDensity = (distinct
// received indices + dense elements) / N, Threshold = the final threshold
// of the largest compressed tensor (the first of equal size; NaN when none
// is compressed).
type dgcReducer struct {
	base    *Env
	warmup  int // epochs
	comp    []bool
	compN   int // elements of the compressed tensors
	largest int // compressed tensor whose threshold Stats reports, -1 if none
	params  map[float64][]dgcParams
	dense   denseParts
	// mc is the momentum correction (momentumCorrection; off with
	// momentum 0).
	mc   momentumCorrection
	sel  dgcScratch
	dIdx device.Buffer // Int32
	dVal device.Buffer // Float32
}

func newDGCReducer(e *Env) (Core, error) {
	o := e.o
	if !(o.Momentum >= 0 && o.Momentum < 1) {
		return nil, fmt.Errorf("Options.Momentum %v is outside [0, 1)", o.Momentum)
	}
	r := &dgcReducer{base: e, mc: momentumCorrection{m: float32(o.Momentum)}, warmup: o.Params.Int("sparsity_warmup"),
		params: map[float64][]dgcParams{}, largest: -1}
	for t, tn := range o.Layout.Tensors {
		c := tn.Dims() != 1
		r.comp = append(r.comp, c)
		if c {
			r.compN += tn.Size
			if r.largest < 0 || tn.Size > o.Layout.Tensors[r.largest].Size {
				r.largest = t
			}
		}
	}
	return r, nil
}

// ratio is the density of the current call: the warm-up's, then ρ.
func (r *dgcReducer) ratio() float64 {
	rho := r.base.o.Density
	if r.base.perEpoch == 0 {
		return rho
	}
	if e := r.base.calls / r.base.perEpoch; e < r.warmup {
		return max(math.Pow(dgcWarmupBase, float64(e+1)), rho)
	}
	return rho
}

// paramsFor returns the per-tensor sampling constants at density ratio.
func (r *dgcReducer) paramsFor(ratio float64) []dgcParams {
	ps, ok := r.params[ratio]
	if !ok {
		for _, tn := range r.base.o.Layout.Tensors {
			ps = append(ps, dgcParamsFor(tn.Size, ratio))
		}
		r.params[ratio] = ps
	}
	return ps
}

// Reduce selects per tensor by double sampling, every compressed tensor at
// once (dgcSelect: the thresholds and the adaptation rounds stay on the
// device, the counts come back in one wait), all-gathers the pairs
// and averages them. Where the reference takes the exact top-nsel of the
// candidates it takes the top-nsel of the tensor, the same set (the
// candidates, more than nsel, hold every element at least as large as the
// nsel-th largest).
func (r *dgcReducer) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.base
	v := &b.v
	if err := r.mc.ensure(b); err != nil {
		return err
	}
	rank := b.c.Rank()
	tensors := b.o.Layout.Tensors
	params := r.paramsFor(r.ratio())
	layerK := make([]int, len(tensors))
	thr := math.NaN()
	pos := 0
	total := 0
	for t := range tensors {
		if r.comp[t] {
			total += params[t].nsel
		}
	}
	if err := b.reserveLists(total); err != nil {
		return err
	}
	selTime, err := b.selectTimed(func() error {
		idx, err := v.scratch(&r.dIdx, device.Int32, total)
		if err != nil {
			return err
		}
		if _, err := v.scratch(&r.dVal, device.Float32, total); err != nil {
			return err
		}
		var ts []dgcTensor
		var of []int // the layout's tensor of each of ts
		want := -1
		for t, tn := range tensors {
			if !r.comp[t] {
				layerK[t] = tn.Size
				continue
			}
			if tn.Size == 0 {
				continue
			}
			p := params[t]
			start := 0
			if p.stride > 1 {
				start = sampRNG(b.o.Seed, rank, b.calls, t).IntN(p.stride)
			}
			if t == r.largest {
				want = len(ts)
			}
			ts = append(ts, dgcTensor{lo: tn.Offset, hi: tn.Offset + tn.Size, p: p, start: start})
			of = append(of, t)
		}
		takes, th, err := dgcSelect(v, &r.sel, idx, acc, ts, want)
		if err != nil {
			return err
		}
		if want >= 0 {
			thr = float64(th)
		}
		for j, t := range of {
			layerK[t] = takes[j]
			pos += takes[j]
		}
		val, err := v.scratch(&r.dVal, device.Float32, pos)
		if err != nil {
			return err
		}
		return v.ops.Gather(v.s, val, acc, idx.Slice(0, pos))
	})
	if err != nil {
		return err
	}
	denseN, err := r.dense.reduce(ctx, b, acc, r.comp)
	if err != nil {
		return err
	}
	idx, val := r.dIdx.Slice(0, pos), r.dVal.Slice(0, pos)
	counts, distinct, err := b.sparseExchangeIfAny(ctx, r.compN > 0, idx, val, out)
	if err != nil {
		return err
	}
	// The residual (and the velocity) of the compressed tensors.
	if r.mc.m > 0 {
		if err := r.mc.compressed(b, r.comp, acc, residual, idx); err != nil {
			return err
		}
	} else if err := b.residualWithout(residual, acc, idx); err != nil {
		return err
	}
	// The dense tensors: out = the average (with momentum: u ← m·u + avg,
	// out = u), residual 0.
	if err := r.dense.write(b, out, residual, r.comp); err != nil {
		return err
	}
	if r.mc.m > 0 {
		if err := r.mc.dense(b, r.comp, out); err != nil {
			return err
		}
		// The error norm is of what the worker holds back, v.
		var err error
		if st.ResidualSq, err = r.mc.residualSq(b, r.comp); err != nil {
			return err
		}
	}
	for w := range counts {
		counts[w] += denseN
	}
	st.SelectTime = selTime
	st.Selected = pos + denseN
	st.SelectedPerWorker = counts
	st.LayerK = layerK
	st.Distinct = distinct + denseN
	st.Threshold = thr
	return nil
}

//go:embed dgc.cu
var dgcCUDA string

// dgcMomentum is DGC's momentum correction, element-wise (dgc.cu's
// k_dgc_momentum; arguments vel, res, acc, n as int64, m as float32): with
// a = acc[i] (the velocity) and p = vel[i] (the previous masked velocity),
// it sets vel[i] = a and res[i] = a + m·(a − p) (the velocity plus m times
// the momentum). res may be acc.
var dgcMomentum = &device.Kernel{Name: "k_dgc_momentum", CUDA: dgcCUDA, Host: func(n int, a ...any) {
	vv, rr, aa, m := a[0].(device.Buffer).Float32s(), a[1].(device.Buffer).Float32s(), a[2].(device.Buffer).Float32s(), a[4].(float32)
	selParallel(n, selChunks(n), func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			a := aa[i]
			u := a - vv[i]
			vv[i] = a
			rr[i] = a + float32(m*u) // no fused multiply-add: the GPU rounds the product too
		}
	})
}}

// SaveState writes the call count (it seeds the samples' random start and
// counts the warm-up's epochs) and, with momentum correction, the masked
// velocity of the compressed tensors and the momentum of the dense ones (N
// float32, read from the device).
func (r *dgcReducer) SaveState(w *StateWriter) error {
	w.Int(r.base.calls)
	return r.mc.save(r.base, w)
}

// LoadState reads them back (the velocity into device memory).
func (r *dgcReducer) LoadState(d *StateReader) error {
	it := d.Int("call count", 0, maxCount)
	has, vel := r.mc.read(r.base, d)
	if err := d.Done(); err != nil {
		return err
	}
	if err := r.mc.load(r.base, has, vel, it); err != nil {
		return err
	}
	r.base.calls = it
	return nil
}

// dgcNotes: a density warm-up a replay cannot schedule or the run does not
// outlast, and no momentum to correct.
func dgcNotes(r Run) []string {
	var notes []string
	e := r.Params.Int("sparsity_warmup")
	if e > 0 && r.StepsPerEpoch == 0 && r.Replay {
		notes = append(notes, fmt.Sprintf("the recording does not say its steps per epoch, so the replay has no density warm-up (-sparsity-warmup %d epochs): every step selects at -density %g",
			e, r.Density))
	}
	if e > 0 && r.Steps <= e*r.StepsPerEpoch {
		notes = append(notes, fmt.Sprintf("the run's %d steps end within the density warm-up (-sparsity-warmup %d epochs of %d steps): it never reaches -density %g",
			r.Steps, e, r.StepsPerEpoch, r.Density))
	}
	switch {
	case r.Replay && r.Momentum == 0:
		notes = append(notes, "no SGD momentum to correct (the recording's training gives none): plain error feedback, without DGC's momentum correction; pass -momentum 0.9 for a recording of SGD with momentum")
	case !r.Replay && (r.Optimizer != "sgd" || r.Momentum == 0):
		notes = append(notes, fmt.Sprintf("no SGD momentum to correct (-optimizer %s, -momentum %g): plain error feedback, without DGC's momentum correction",
			r.Optimizer, r.Momentum))
	}
	return notes
}

// denseParts is the dense path of the methods that compress only some
// tensors (dgc, dragonn): the other tensors' acc, concatenated, all-reduced
// in one call; reduce before the sparse exchange, write after it.
type denseParts struct {
	buf device.Buffer // Float32: the concatenation, then its sum
	n   int
}

// reduce copies the tensors t with comp[t] false out of acc, in layout
// order, and all-reduces their concatenation (the sum over workers). It
// returns their number of elements.
func (d *denseParts) reduce(ctx context.Context, b *Env, acc device.Buffer, comp []bool) (int, error) {
	v := &b.v
	d.n = 0
	for t, tn := range b.o.Layout.Tensors {
		if !comp[t] {
			d.n += tn.Size
		}
	}
	if d.n == 0 {
		return 0, nil
	}
	dense, err := v.scratch(&d.buf, device.Float32, d.n)
	if err != nil {
		return 0, err
	}
	at := 0
	for _, r := range tensorRuns(b.o.Layout, comp, false) {
		if err := v.s.Copy(dense.Slice(at, at+r[1]-r[0]), acc.Slice(r[0], r[1])); err != nil {
			return 0, err
		}
		at += r[1] - r[0]
	}
	if err := b.c.AllReduce(ctx, v.cb(dense)); err != nil {
		return 0, fmt.Errorf("all-reducing %d values of the uncompressed tensors: %w", d.n, err)
	}
	return d.n, nil
}

// write sets out to the average (the sum times 1/n) and residual to 0 over
// the tensors reduce all-reduced.
func (d *denseParts) write(b *Env, out, residual device.Buffer, comp []bool) error {
	if d.n == 0 {
		return nil
	}
	v := &b.v
	inv := 1 / float32(b.c.Size())
	at := 0
	for _, r := range tensorRuns(b.o.Layout, comp, false) {
		o := out.Slice(r[0], r[1])
		if err := v.s.Copy(o, d.buf.Slice(at, at+r[1]-r[0])); err != nil {
			return err
		}
		if err := v.m.Scale(v.s, o, inv); err != nil {
			return err
		}
		if err := v.m.Fill(v.s, residual.Slice(r[0], r[1]), 0); err != nil {
			return err
		}
		at += r[1] - r[0]
	}
	return nil
}

// reserveLists sizes the call's list scratch on a device — this worker's
// values, every worker's pairs and their union — for each worker sending
// up to most pairs (dgc's and dragonn's selections exceed the workers·k
// that Env.listScratch allows for), so that the exchange allocates nothing
// in later steps (a buffer grows only when the bound does: a larger
// density, during DGC's warm-up).
func (b *Env) reserveLists(most int) error {
	if b.v.onCPU() {
		return nil
	}
	all := min(b.c.Size()*most, b.c.Size()*b.n)
	for _, l := range []struct {
		buf *device.Buffer
		dt  device.DType
	}{{&b.dAll, device.Int32}, {&b.dAllVal, device.Float32}, {&b.dUnion, device.Int32}} {
		if _, err := b.listScratch(l.buf, l.dt, all); err != nil {
			return err
		}
	}
	return nil
}

// dgcTensor is one tensor of a DGC selection: its range [lo, hi) of the
// vector selected from, its sampling constants and its samples' random
// start in [0, p.stride).
type dgcTensor struct {
	lo, hi int
	p      dgcParams
	start  int
}

// dgcScratch is the device memory of dgcSelect.
type dgcScratch struct {
	smp, thr  device.Buffer // Float32: the samples, the thresholds
	cand, top device.Buffer // Int32: the candidates (in their tensors' places), the exact top-nsel
	hist, res device.Buffer // Int32: the counts per level (dgcCount), the decisions (dgcDecide) and the selection's counts
	par       device.Buffer // Int32: the tensors' description (dgcCount), uploaded when it changes
	parHost   []int32       // what par holds
	takes     []int32       // the counts per tensor, read in the one wait
	th        [1]float32    // the reported tensor's threshold, read with them
}

// dgcParWords is DGC_PAR of dgc.cu: the words describing one tensor (its
// range lo, hi, nsel, 1 when sampled whole, where its top-nsel starts).
const dgcParWords = 5

// dgcLevels is DGC_LEVELS of dgc.cu: the sampled threshold and one per
// adaptation round.
const dgcLevels = dgcMaxAdapt + 1

// dgcLanes is the threads per tensor of dgcCount.
const dgcLanes = 2048

// dgcSelect is DGC's double sampling (reference notes 7.4,
// synxlin/deep-gradient-compression) of every tensor ts[j] of x at once
// (the tensors ascending, not overlapping, none empty): the samples are
// x[lo + start + i·stride] for i < numSamples; thr is the smallest
// magnitude of the top topSamples samples; the candidates are {i : |x_i| >=
// thr}. Unless the tensor was sampled whole, up to dgcMaxAdapt rounds
// follow: more than 1.3·nsel candidates → keep the exact top-nsel of them
// by magnitude (ties to lower indices) and stop; fewer than 0.8·nsel → thr
// ×= 0.8 and select again; otherwise stop. Finally the first nsel
// candidates in index order are kept. It writes the indices of x, each
// tensor's ascending, the tensors in order, into idx (at least Σ nsel
// long), and returns how many each tensor has and the final threshold of
// tensor want (NaN when want < 0). The top-nsel of the candidates is taken
// as the top-nsel of the tensor: the same set, since the candidates, more
// than nsel, hold every element at least as large as the nsel-th largest.
//
// The rounds are decided where the counts are, without reading them
// back: a round's threshold is the last one's times 0.8 (in float32), so
// every round's count is known after one pass that counts each element at
// the first of the dgcLevels thresholds it reaches (dgcCount); dgcDecide
// then replays the rounds on those counts, and the candidates are selected
// once, at the final thresholds (Ops.SelectAboveSegments), the exact
// top-nsel of every tensor (Ops.TopKSegments) taken only where dgcDecide
// chose it (dgcTake). On a device: a bounded number of launches and one
// host wait, for the counts and want's threshold.
func dgcSelect(v *vecs, sc *dgcScratch, idx, x device.Buffer, ts []dgcTensor, want int) ([]int, float32, error) {
	S := len(ts)
	takes := make([]int, S)
	if S == 0 {
		return takes, float32(math.NaN()), nil
	}
	if x.Len() > math.MaxInt32 {
		return nil, 0, fmt.Errorf("%d elements; indices are int32", x.Len())
	}
	ns, ks, nsels := make([]int, S), make([]int, S), make([]int, S)
	segs := make([][2]int, S)
	par := make([]int32, 0, dgcParWords*S)
	nsel, active := 0, false
	for j, t := range ts {
		ns[j], ks[j], nsels[j] = t.p.numSamples, t.p.topSamples, t.p.nsel
		segs[j] = [2]int{t.lo, t.hi}
		whole := t.p.numel <= t.p.numSamples
		active = active || !whole
		par = append(par, int32(t.lo), int32(t.hi), int32(t.p.nsel), int32(selB2I(whole)), int32(nsel))
		nsel += t.p.nsel
	}
	// Everything allocated before the first launch (not mid-run).
	cand, err := v.scratch(&sc.cand, device.Int32, ts[S-1].hi)
	if err != nil {
		return nil, 0, err
	}
	tk, err := v.scratch(&sc.top, device.Int32, nsel)
	if err != nil {
		return nil, 0, err
	}
	hist, err := v.scratch(&sc.hist, device.Int32, dgcLevels*S)
	if err != nil {
		return nil, 0, err
	}
	res, err := v.scratch(&sc.res, device.Int32, 4*S)
	if err != nil {
		return nil, 0, err
	}
	dpar, err := v.scratch(&sc.par, device.Int32, len(par))
	if err != nil {
		return nil, 0, err
	}
	if !slices.Equal(sc.parHost, par) {
		if err := v.s.Copy(dpar, device.Host(par)); err != nil {
			return nil, 0, err
		}
		sc.parHost = par
	}
	thr, err := sampleThresholds(v, &sc.smp, &sc.thr, ns, ks, -1, nil, func(j int, dst device.Buffer) error {
		t := ts[j]
		return v.ops.GatherStrided(v.s, dst, x.Slice(t.lo, t.hi), t.start, t.p.stride)
	})
	if err != nil {
		return nil, 0, err
	}
	if err := v.m.Fill(v.s, hist.View(device.Float32, 0, hist.Len()), 0); err != nil {
		return nil, 0, err
	}
	if err := v.ops.Run(v.s, dgcCount, S*dgcLanes, x, dpar, thr, int64(S*dgcLanes), int32(dgcLanes), hist); err != nil {
		return nil, 0, err
	}
	if err := v.ops.Run(v.s, dgcDecide, 1, hist, dpar, thr, int64(1), int64(S), res); err != nil {
		return nil, 0, err
	}
	if err := v.ops.SelectAboveSegments(v.s, cand, res.Slice(3*S, 4*S), x, thr, segs); err != nil {
		return nil, 0, err
	}
	if active && v.onCPU() {
		// The decisions are on the host already: no top-nsel where no
		// tensor takes it.
		active = slices.Contains(res.Int32s()[2*S:3*S], 1)
	}
	if active {
		// The exact top-nsel of every tensor at once (the same segments
		// and budgets every call), each after the tensors before it.
		if _, err := v.ops.TopKSegments(v.s, tk, x, segs, nsels); err != nil {
			return nil, 0, err
		}
	}
	if err := v.ops.Run(v.s, dgcTake, nsel, cand, tk, dpar, res, int64(S), int64(nsel), idx); err != nil {
		return nil, 0, err
	}
	if len(sc.takes) < S {
		sc.takes = make([]int32, S)
	}
	if err := v.s.Copy(device.Host(sc.takes[:S]), res.Slice(0, S)); err != nil {
		return nil, 0, err
	}
	th := float32(math.NaN())
	if want >= 0 {
		if err := v.s.Copy(device.Host(sc.th[:]), thr.Slice(want, want+1)); err != nil {
			return nil, 0, err
		}
	}
	if err := v.s.Synchronize(); err != nil {
		return nil, 0, err
	}
	if want >= 0 {
		th = sc.th[0]
	}
	for j := range takes {
		takes[j] = int(sc.takes[j])
	}
	return takes, th, nil
}

// sampleThresholds is what DGC's and DRAGONN's selections share: every
// tensor's samples gathered into one vector (gather(j, dst) writes the
// ns[j] samples of tensor j into dst), the ks[j]-th largest magnitude of
// each tensor's samples left in a vector of thresholds on the device
// (Ops.KthLargestAbsSegments), which it returns, and the threshold of
// tensor want copied into th[0], which holds it after the stream's next
// wait (none when want < 0). smp and thr are the caller's scratch.
func sampleThresholds(v *vecs, smp, thr *device.Buffer, ns, ks []int, want int, th []float32, gather func(j int, dst device.Buffer) error) (device.Buffer, error) {
	total := 0
	segs := make([][2]int, len(ns))
	for j, n := range ns {
		segs[j] = [2]int{total, total + n}
		total += n
	}
	sb, err := v.scratch(smp, device.Float32, total)
	if err != nil {
		return device.Buffer{}, err
	}
	tb, err := v.scratch(thr, device.Float32, len(ns))
	if err != nil {
		return device.Buffer{}, err
	}
	for j, sg := range segs {
		if err := gather(j, sb.Slice(sg[0], sg[1])); err != nil {
			return device.Buffer{}, err
		}
	}
	if err := v.ops.KthLargestAbsSegments(v.s, tb, sb, segs, ks); err != nil {
		return device.Buffer{}, err
	}
	if want >= 0 {
		if err := v.s.Copy(device.Host(th[:1]), tb.Slice(want, want+1)); err != nil {
			return device.Buffer{}, err
		}
	}
	return tb, nil
}

// dgcKey is dgc.cu's dgc_key: a threshold's magnitude key (NaN selects
// nothing, t <= 0 every number).
func dgcKey(t float32) uint32 {
	switch {
	case t != t:
		return math.MaxUint32
	case t > 0:
		return math.Float32bits(t)
	}
	return 0
}

// dgcCount is dgc.cu's k_dgc_count (arguments x, par, thr, n as int64,
// lanes as int32, hist (Int32, dgcLevels per tensor, zero before)): the
// elements of every tensor counted at the first of its dgcLevels
// thresholds they reach.
var dgcCount = &device.Kernel{Name: "k_dgc_count", CUDA: dgcCUDA, Host: func(n int, a ...any) {
	x, par, thr, lanes, hist := a[0].(device.Buffer).Float32s(), a[1].(device.Buffer).Int32s(), a[2].(device.Buffer).Float32s(), int(a[4].(int32)), a[5].(device.Buffer).Int32s()
	for j := range n / lanes {
		var key [dgcLevels]uint32
		t := thr[j]
		for r := range key {
			key[r] = dgcKey(t)
			t *= dgcLower
		}
		p := par[dgcParWords*j:]
		for _, v := range x[p[0]:p[1]] {
			k := math.Float32bits(v) & 0x7fffffff
			if k > 0x7f800000 || k < key[dgcLevels-1] {
				continue
			}
			r := 0
			for k < key[r] {
				r++
			}
			hist[dgcLevels*j+r]++
		}
	}
}}

// dgcDecide is dgc.cu's k_dgc_decide (arguments hist, par, thr, n = 1 and
// the tensors S as int64, res (Int32, 3·S)): the adaptation rounds of
// every tensor replayed on its counts per level; thr becomes the final
// thresholds, res the counts taken, where they start, and which tensors
// take their exact top-nsel.
var dgcDecide = &device.Kernel{Name: "k_dgc_decide", CUDA: dgcCUDA, Host: func(_ int, a ...any) {
	hist, par, thr, S, res := a[0].(device.Buffer).Int32s(), a[1].(device.Buffer).Int32s(), a[2].(device.Buffer).Float32s(), int(a[4].(int64)), a[5].(device.Buffer).Int32s()
	pos := int32(0)
	for j := range S {
		p := par[dgcParWords*j:]
		nsel, last, top := uint32(p[2]), dgcLevels-1, int32(0)
		if p[3] != 0 {
			last = 0
		}
		t := thr[j]
		c := uint32(0)
		for r := 0; ; r++ {
			c += uint32(hist[dgcLevels*j+r])
			if r == last {
				break
			}
			if c > nsel {
				if float64(c) > dgcUpper*float64(nsel) {
					top = 1
				}
				break
			}
			if !(float64(c) < dgcLower*float64(nsel)) {
				break
			}
			t *= dgcLower
		}
		thr[j] = t
		take := int32(min(c, nsel))
		res[j], res[S+j], res[2*S+j] = take, pos, top
		pos += take
	}
}}

// dgcTake is dgc.cu's k_dgc_take (arguments cand, top, par, res, S and n =
// Σ nsel as int64, idx): every tensor's taken indices, from its exact
// top-nsel or its candidates, written one tensor after the other.
var dgcTake = &device.Kernel{Name: "k_dgc_take", CUDA: dgcCUDA, Host: func(_ int, a ...any) {
	cand, top, par, res, S, idx := a[0].(device.Buffer).Int32s(), a[1].(device.Buffer).Int32s(), a[2].(device.Buffer).Int32s(), a[3].(device.Buffer).Int32s(), int(a[4].(int64)), a[6].(device.Buffer).Int32s()
	for j := range S {
		p := par[dgcParWords*j:]
		src := cand[p[0]:]
		if res[2*S+j] != 0 {
			src = top[p[4]:]
		}
		copy(idx[res[S+j]:res[S+j]+res[j]], src[:res[j]])
	}
}}

// dgcDenseElems is the elements of the shape's 1-D tensors, which DGC
// all-reduces dense (Shape.Tensor: a tensor of unknown shape is
// compressed, as the reducer does).
func dgcDenseElems(s Shape) int {
	n := 0
	for i, sz := range s.Sizes {
		if s.Tensor(i).Dims() == 1 {
			n += sz
		}
	}
	return n
}

// dgcAdvice: each worker selects about ρ of every tensor of more than one
// dimension (at least one element each) and all-gathers its indices and
// its values; the 1-D tensors are one all-reduce.
var dgcAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		dense := dgcDenseElems(s)
		var calls []Call
		if dense < s.N {
			calls = gatherCalls(s.Sel-float64(dense), 2)
		}
		if dense > 0 {
			calls = append(calls, Call{comm.OpAllReduce, 1, float64(dense)})
		}
		return calls, nil
	},
	Volume: func(s Shape, o Overlap) (sel, union float64) {
		for i, sz := range s.Sizes {
			if s.Tensor(i).Dims() != 1 {
				sel += math.Max(1, math.Ceil(float64(sz)*s.Density))
			}
		}
		dense := float64(dgcDenseElems(s))
		return sel + dense, o.TopK(sel) + dense
	},
	Selection: SelectsWhole,
	Caveats: func(c Conditions) []string {
		return append(buildUp(c), "the momentum correction, where the run has SGD momentum, changes which elements are selected; the horizon's reducer runs with the run's momentum, the steady state is predicted without it")
	},
	Evidence: Evidence{Shown: []ModelKind{CNN, RNN},
		Papers: "DGC paper: ResNets on CIFAR-10 and ImageNet, LSTM on PTB and speech, no loss at 99.9 % sparsity with momentum correction and warm-up"},
}
