package sparsify

import (
	"context"
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "topk", TopKOfAcc: true, NotProjectable: "the union of the workers' top-k indices, which every worker all-reduces, grows with the worker count", New: newTopk, Advice: topkAdvice,
		Doc: "reference notes 7.1: each worker's exact top-k, index lists all-gathered, the union all-reduced. No other deviation."})
	Register(Method{Name: "topka", TopKOfAcc: true, Projectable: true, New: newTopka, Advice: topkaAdvice,
		Doc: "reference notes 7.2, 7.8: TopkA of Ok-Topk, the DEFT/MiCRO code's CLI \"gtopk\": all-gather of k (value, index) pairs per worker. Deviations: indices as int32 (the DEFT/MiCRO copy sends int64); Ok-Topk's dense warm-up is left to the trainer."})
}

// topk is the "topk" baseline of the DEFT/MiCRO code (TopKReducer,
// reference notes 7.1), with its shared-union all-reduce:
//
//   - k = BudgetK(density, N) = ⌊ρN⌋ clamped to [1, N], over the whole flat
//     acc of each worker; the indices are the exact top-k by magnitude (ties
//     to lower indices; the reference leaves tie order unspecified);
//   - the index lists are all-gathered in the package's wire format (one
//     int32 count per worker, then the int32 lists, unpadded, with
//     AllGatherV; the reference sends int64 counts and int64 lists padded to
//     the largest count);
//   - the union U (sorted, distinct) is formed; every worker all-reduces its
//     own acc at every index of U (float32), out = sum/n on U and 0
//     elsewhere, and every worker's residual is acc with all of U zeroed.
//
// Bytes per call and worker (n > 1): 4(n−1) + 4(n−1)k for the two
// all-gathers plus the ring all-reduce of |U| float32 (comm.Traffic).
// ActualDensity = |U|/N grows with n for independent accs. It conserves the
// gradient: Σ_w residual_w + n·out = Σ_w acc_w up to float32 rounding.
type topk struct{ b *Env }

func newTopk(e *Env) (Core, error) { return topk{e}, nil }

// Reduce selects this worker's top-k, gathers every worker's indices and
// all-reduces the union.
func (r topk) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	sel, err := v.scratch(&b.dSel, device.Int32, b.k)
	if err != nil {
		return err
	}
	k := 0
	selTime, err := b.selectTimed(func() error {
		var err error
		k, err = b.topKAcc(sel, device.Buffer{}, acc, b.k)
		return err
	})
	if err != nil {
		return err
	}
	st.SelectTime = selTime
	return b.reduceSelected(ctx, acc, out, residual, sel.Slice(0, k), st)
}

// topka is "topka", the sparse all-gather Top-k (TopkA of Ok-Topk,
// and the CLI name "gtopk" of the DEFT/MiCRO code, GlobalTopKReducer;
// reference notes 7.2 and 7.8):
//
//   - k = BudgetK(density, N) (= max(1, ⌊ρN⌋) as in the reference);
//     exact local top-k of acc (ties to lower indices);
//   - residual = acc with this worker's own selection zeroed;
//   - every worker sends exactly k pairs, so two plain all-gathers carry
//     them: first the k float32 values, then the k indices as int32 (the
//     TopkA/LAGS format; the DEFT/MiCRO copy sends int64 positions);
//   - out = Σ_w (scatter of worker w's values at its indices), added in rank
//     order 0, 1, …, n−1, then multiplied by 1/n.
//
// Bytes per call and worker (n > 1): 8(n−1)k sent and received.
// ActualDensity = |∪_w sel_w|/N. Ok-Topk's 512 dense warm-up iterations are
// not part of this reducer (a trainer can run "dense" first). It conserves
// the gradient: Σ_w residual_w + n·out = Σ_w acc_w up to float32 rounding.
type topka struct{ b *Env }

func newTopka(e *Env) (Core, error) { return topka{e}, nil }

// Reduce selects this worker's top-k and all-gathers (value, index) pairs.
func (r topka) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	sel, err := v.scratch(&b.dSel, device.Int32, b.k)
	if err != nil {
		return err
	}
	vals, err := v.scratch(&b.dVal, device.Float32, b.k)
	if err != nil {
		return err
	}
	k := 0
	selTime, err := b.selectTimed(func() error {
		var err error
		k, err = b.topKAcc(sel, vals, acc, b.k)
		return err
	})
	if err != nil {
		return err
	}
	n := b.c.Size()
	gvals, err := v.scratch(&b.dAllVal, device.Float32, n*k)
	if err != nil {
		return err
	}
	gidx, err := v.scratch(&b.dAll, device.Int32, n*k)
	if err != nil {
		return err
	}
	if err := b.c.AllGather(ctx, v.cb(vals.Slice(0, k)), v.cb(gvals)); err != nil {
		return fmt.Errorf("gathering %d values per worker: %w", k, err)
	}
	if err := b.c.AllGather(ctx, v.cb(sel.Slice(0, k)), v.cb(gidx)); err != nil {
		return fmt.Errorf("gathering %d indices per worker: %w", k, err)
	}
	if err := b.residualWithout(residual, acc, sel.Slice(0, k)); err != nil {
		return err
	}
	distinct, err := b.addMeanOn(out, gidx, gvals, nil, k)
	if err != nil {
		return err
	}
	st.SelectTime = selTime
	st.Selected = k
	st.Distinct = distinct
	return nil
}

// topkAdvice: the workers' index lists all-gathered, their union
// all-reduced.
var topkAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		return unionCalls(float64(s.K), s), nil
	},
	Volume:    topkVolume,
	Selection: SelectsWhole,
	Caveats:   buildUp,
	Evidence: Evidence{Shown: []ModelKind{CNN, RNN, Transformer, Recommender},
		Papers:  "near dense with error feedback on CNNs, LSTMs and Transformers in the papers that use it as their baseline (DEFT, MiCRO, LAGS-SGD, DRAGONN, Ok-Topk: VGG-16, ResNet-18/20/50, LSTM-PTB, WikiText-2, BERT)",
		Project: "NCF on MovieLens-100K, 4 workers, ρ = 0.1: HR@10 0.665 after 20 epochs, as dense's 0.665 (docs/results/ncf-ml100k.md)",
		At:      []ShownAt{{Kind: Recommender, Density: 0.1, Workers: 4}}},
}

// topkaAdvice: k (value, index) pairs all-gathered, the indices and the
// values in one call each.
var topkaAdvice = &Advice{
	Plan:      func(s Shape) ([]Call, error) { return []Call{{comm.OpAllGather, 2, float64(s.K)}}, nil },
	Volume:    topkVolume,
	Selection: SelectsWhole,
	Caveats:   buildUp,
	Evidence:  topkVariantEvidence,
}

// topkVariantEvidence is what is known of the accuracy of topka and
// topkdsa, which select as topk does.
var topkVariantEvidence = Evidence{Shown: []ModelKind{CNN, RNN},
	Papers: "compared in the SparDL paper (VGG-16/19, ResNet-20, LSTM on IMDB): the same selection as Top-k"}
