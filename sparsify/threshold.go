package sparsify

import (
	"context"
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/options"
)

func init() {
	Register(Method{Name: "threshold", NotProjectable: "the union of the workers' selections, which every worker all-reduces, grows with the worker count", New: newThreshold, Advice: thresholdAdvice,
		Doc: "reference notes 7.5: |acc| >= λ (default 1/(2√k)), union all-reduced. Deviation: λ is rounded to float32 once and reported as such.", Params: []options.Option{{
			Key: "lambda", Kind: options.Float, Default: 0.0, Range: options.Within(0, math.MaxFloat32, "[]"),
			Zero: "1/(2√k), recomputed every call",
			Doc:  "hard threshold λ: every element with |acc| >= λ is sent",
		}}})
}

// threshold is "threshold", the hard-threshold baseline of the
// DEFT/MiCRO code (ThreshReducer, reference notes 7.5):
//
//   - λ = the option lambda, or, when it is 0, λ = 1/(2√k) with k =
//     BudgetK(density, N) = ⌊ρN⌋ clamped to [1, N], recomputed every call as
//     the MiCRO repository does (the clamp avoids its division by zero);
//     λ is rounded to float32 once and that value is used and reported as
//     Stats.Threshold;
//   - each worker selects every index with |acc| >= λ over the flat vector;
//   - counts and index lists are all-gathered in the package's wire format
//     (int32 counts, then the int32 lists with AllGatherV; the reference
//     sends int64 counts and int64 lists padded to the largest count);
//   - the union U (sorted, distinct) is formed; every worker all-reduces its
//     own acc at U (float32); out = sum/n on U, 0 elsewhere; every worker's
//     residual is acc with U zeroed. If no worker selects anything, out = 0
//     and residual = acc.
//
// Stats: Selected = this worker's count, SelectedPerWorker = every worker's
// count, ActualDensity = |U|/N, Threshold = λ. It conserves the gradient:
// Σ_w residual_w + n·out = Σ_w acc_w up to float32 rounding.
type threshold struct {
	b      *Env
	lambda float64 // 0: default
}

func newThreshold(e *Env) (Core, error) {
	lambda := e.o.Params.Float("lambda") // in [0, MaxFloat32] (declared)
	if lambda > 0 && float32(lambda) == 0 {
		return nil, fmt.Errorf("lambda %v is invalid; use a value that is > 0 as a float32 (between 1.4e-45 and 3.4e38), or 0 for the default 1/(2√k)", lambda)
	}
	return threshold{b: e, lambda: lambda}, nil
}

// Reduce selects |acc| >= λ, gathers every worker's indices and all-reduces
// the union.
func (r threshold) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	lam := r.lambda
	if lam == 0 {
		lam = 1 / (2 * math.Sqrt(float64(b.k)))
	}
	lam32 := float32(lam)
	sel, err := v.scratch(&b.dSel, device.Int32, b.n)
	if err != nil {
		return err
	}
	m := 0
	selTime, err := b.selectTimed(func() error {
		var err error
		m, err = v.ops.SelectAbove(v.s, sel, device.Buffer{}, acc, lam32)
		return err
	})
	if err != nil {
		return err
	}
	st.SelectTime = selTime
	st.Threshold = float64(lam32)
	return b.reduceSelected(ctx, acc, out, residual, sel.Slice(0, m), st)
}

// thresholdAdvice: as topk's traffic, with as many elements as λ selects.
var thresholdAdvice = &Advice{
	Plan:      selectedUnionPlan,
	Volume:    func(_ Shape, o Overlap) (sel, union float64) { return o.Above() },
	Selection: SelectsWhole,
	Caveats: func(c Conditions) []string {
		return append(buildUp(c), fmt.Sprintf("λ = 1/(2√k) is fixed: its density follows the gradients' magnitude (one worker: %.2g× ρ on the measured gradients of step %d)", c.Sel/float64(c.K), c.GradStep))
	},
	Evidence: Evidence{
		Papers:  "compared in MiCRO's paper (CNNs), where its fixed λ gave an excessively high actual density in every experiment",
		Warning: "a fixed λ sends whatever the gradients' magnitude makes it send: its density and accuracy are not controlled"},
}
