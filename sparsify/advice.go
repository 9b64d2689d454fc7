package sparsify

import (
	"fmt"
	"slices"

	"github.com/sparsegrad/sparsegrad/comm"
)

// Advice is what the sparsifier advisor (package advise) asks about a
// method to predict its iteration at any worker count without running it
// there: its traffic, how many elements it selects and sends, how its
// selection cost scales with the workers, where that prediction is weak,
// and what is known of its accuracy. Each method declares it in its Method, beside its reducer, so that
// adding a method touches no other package; the advisor reads only these
// declarations (a method without one is reported as having no traffic
// model). TestEveryMethodAdvises checks that every registered method
// declares each field, and the advisor's TestPlanMatchesReducers checks
// each Plan against the real reducer's communicator calls.
type Advice struct {
	// Plan returns the communicator calls worker s.Rank makes in one
	// iteration after any warm-up, as the method's reducer makes them
	// (non-blocking calls as their blocking op, as comm.Counter counts
	// them), for the shape s with its Sel and Union set by Volume. A method
	// whose workers make the same calls ignores s.Rank; one whose workers
	// differ (gTop-k's tree: rank 0 receives in every round, the others
	// send once) answers for each rank, so that the advisor times the
	// iteration by rank 0's calls and counts the bytes the workers send on
	// average, as a run's step record has them. An error says what the
	// model does not cover (SparDL's teams > 1).
	Plan func(s Shape) ([]Call, error)
	// Volume returns s.Sel and s.Union for the shape s (whose Sel and Union
	// are still unset): the elements one worker selects per iteration, as
	// Stats.Selected reports them, and the distinct indices that cross the
	// wire, the actual density times N, given how the workers' selections
	// overlap on the model's measured gradients.
	Volume func(s Shape, o Overlap) (sel, union float64)
	// Selection says how the selection time measured on a few workers
	// carries over to another worker count.
	Selection Scaling
	// Period, when above 0, is the length of the method's schedule of
	// expensive and cheap calls (Ok-Topk's exact thresholds every 32
	// sparse calls, reused in between): the advisor times whole periods
	// and takes the mean over their calls. 0: every call costs about the
	// same, and the advisor takes the median of a few.
	Period int
	// Caveats, when set, says where the advisor's prediction of the method
	// is weak on the shape c (nil: nowhere beyond what the advisor says of
	// every method).
	Caveats func(c Conditions) []string
	// Evidence is what is known about the method's accuracy: the advisor
	// ranks only the methods shown on the kind of model it advises on.
	Evidence Evidence
}

// Evidence is what is known about a method's accuracy.
type Evidence struct {
	// Shown are the kinds of model on which a paper or the project's own
	// runs showed the method training to about dense training's accuracy.
	Shown []ModelKind
	// Papers says where (models, data sets) and what; every method says
	// something, if only that no paper shows it.
	Papers string
	// Project is the project's own evidence ("" if none).
	Project string
	// Warning is a known accuracy problem ("" if none).
	Warning string
	// At are, where known, the settings of the evidence on a kind of
	// Shown: the lowest density and the worker count it was shown at.
	// The advisor ranks the method on that kind only at that density or
	// above; a kind of Shown without one has its density unrecorded (the
	// advisor says so).
	At []ShownAt
}

// ShownAt is the setting at which a method was shown on a kind of model.
type ShownAt struct {
	Kind    ModelKind
	Density float64
	Workers int
}

// ModelKind is a kind of model, as far as what is known about the methods'
// accuracy goes: the papers and the project's runs show convergence on
// some kinds of model and not on others.
type ModelKind string

// The kinds of model.
const (
	CNN         ModelKind = "cnn"         // convolutional networks (ResNet, VGG, ...)
	RNN         ModelKind = "rnn"         // recurrent networks (LSTM language models, ...)
	Transformer ModelKind = "transformer" // attention models (BERT, ViT, ...)
	Recommender ModelKind = "recommender" // embeddings + MLP recommenders (NCF, ...)
	MLP         ModelKind = "mlp"         // fully connected networks (MLP-Mixer, extreme classification)
	OtherModel  ModelKind = "other"
)

// ModelKinds lists the kinds of model.
var ModelKinds = []ModelKind{CNN, RNN, Transformer, Recommender, MLP, OtherModel}

// Missing names the fields of a that are not declared or not valid (a nil
// Advice lacks every one): those of Model, then the Evidence's Papers
// (every method says something about its accuracy) and kinds.
func (a *Advice) Missing() []string {
	out := a.MissingModel()
	if a == nil {
		return out
	}
	if a.Evidence.Papers == "" {
		out = append(out, "Advice.Evidence.Papers")
	}
	for _, k := range a.Evidence.Shown {
		if !slices.Contains(ModelKinds, k) {
			out = append(out, fmt.Sprintf("Advice.Evidence.Shown (%q is no ModelKind)", k))
		}
	}
	for _, at := range a.Evidence.At {
		if !slices.Contains(a.Evidence.Shown, at.Kind) || !(at.Density > 0 && at.Density <= 1) || at.Workers < 0 {
			out = append(out, fmt.Sprintf("Advice.Evidence.At (%+v: a kind of Shown, a density in (0, 1], workers >= 0)", at))
		}
	}
	return out
}

// MissingModel names the fields of a that a prediction needs and that are
// not declared or not valid: Plan, Volume, Selection, Period (which may
// be 0). Caveats may be left unset.
func (a *Advice) MissingModel() []string {
	if a == nil {
		return []string{"Advice"}
	}
	var out []string
	if a.Plan == nil {
		out = append(out, "Advice.Plan")
	}
	if a.Volume == nil {
		out = append(out, "Advice.Volume")
	}
	if a.Selection < NoSelection || a.Selection > NormsThenShare {
		out = append(out, "Advice.Selection")
	}
	if a.Period < 0 {
		out = append(out, "Advice.Period (negative)")
	}
	return out
}

// Scaling is how a method's selection time depends on the worker count.
type Scaling int

const (
	// NoSelection: the method selects nothing (dense); the advisor
	// measures neither a selection time nor the workers' unions for it.
	NoSelection Scaling = iota + 1
	// SelectsWhole: every worker selects over the whole gradient; the
	// time does not depend on the worker count.
	SelectsWhole
	// SelectsShare: every worker selects within its 1/P share of the
	// gradient (MiCRO's partitions); the time scales as 1/P.
	SelectsShare
	// NormsThenShare: every worker computes a norm pass over the whole
	// gradient and then selects within about 1/P of it (DEFT's fragment
	// norms, then the top-k of its bin); the pass stays, the rest scales
	// as 1/P.
	NormsThenShare
)

// Shape is what a method's traffic depends on: the gradient, the worker
// count, the budget and the sizes that depend on the data.
type Shape struct {
	// Sizes are the layout's tensor sizes, in layout order; N their sum.
	Sizes []int
	N     int
	// Tensors are the layout's tensors with their shapes, beside Sizes
	// (nil: the shapes are unknown, and each tensor is taken as a reducer
	// takes a tensor of unknown shape; see Tensor).
	Tensors []Tensor
	// P is the number of workers; Rank, in [0, P), the worker whose calls
	// Advice.Plan returns.
	P, Rank int
	// Density is the setup density ρ; K = BudgetK(ρ, N).
	Density float64
	K       int
	// Sel is the number of elements one worker selects per iteration for
	// the methods whose count depends on the data (threshold, micro, deft,
	// dgc, dragonn, oktopk's local selection): what Stats.Selected reports
	// (for dragonn including its densely averaged tensors).
	Sel float64
	// Union is the number of distinct indices that cross the wire, |U| (the
	// actual density times N).
	Union float64
	// Params are the method's resolved options (Method.Resolve).
	Params Values
}

// Call is one kind of communicator call one worker makes per iteration:
// Count calls (a fraction for calls made every few iterations) of Elems
// elements of 4 bytes each, counted as comm.OpStats.Elements counts them
// (the buffer of AllReduce and Broadcast, this worker's contribution to
// AllGather and AllGatherV, the message of Send, Recv and SendRecv).
type Call struct {
	Op    comm.Op
	Count float64
	Elems float64
}

// Overlap is how the workers' selections overlap, as the advisor measured
// it on the model's real gradients and extrapolated to the shape's worker
// count.
type Overlap struct {
	// TopK returns the expected number of distinct indices among the
	// shape's P workers' selections of the sel largest magnitudes each.
	TopK func(sel float64) float64
	// Above returns the elements one worker selects with |g| >= 1/(2√k)
	// (the threshold method's default λ) and the union of P workers'.
	Above func() (sel, union float64)
}

// Conditions are what a method's caveats depend on: the shape predicted
// (Sel and Union set) and the gradients the overlap was measured on, those
// of GradWorkers workers at training step GradStep.
type Conditions struct {
	Shape
	GradWorkers, GradStep int
}

// gatherCalls are the calls of gatherIndices and sparseExchange: one int32
// count per worker, then lists AllGatherV calls of mine elements.
func gatherCalls(mine float64, lists int) []Call {
	out := []Call{{comm.OpAllGather, 1, 1}}
	for range lists {
		out = append(out, Call{comm.OpAllGatherV, 1, mine})
	}
	return out
}

// unionCalls are the calls of the methods that all-gather the workers'
// index lists of sel elements each and all-reduce the values of their
// union (gatherIndices, then unionReduce).
func unionCalls(sel float64, s Shape) []Call {
	return append(gatherCalls(sel, 1), Call{comm.OpAllReduce, 1, s.Union})
}

// selectedUnionPlan is the Plan of the methods whose workers select a
// number of elements that depends on the data (Shape.Sel) and then
// exchange as unionCalls.
func selectedUnionPlan(s Shape) ([]Call, error) { return unionCalls(s.Sel, s), nil }

// budgetVolume is the volume of the methods that select k elements and
// send k: one set of indices for all the workers (CLT-k's leader, random-k's
// shared seed, gTop-k's tree).
func budgetVolume(s Shape, _ Overlap) (sel, union float64) {
	return float64(s.K), float64(s.K)
}

// topkVolume is the volume of the methods whose workers each select their
// own top k: the union of their selections crosses the wire.
func topkVolume(s Shape, o Overlap) (sel, union float64) {
	return float64(s.K), o.TopK(float64(s.K))
}

// buildUp is the caveat of the methods whose workers select independently
// and send the union of their selections: it grows with the workers.
func buildUp(c Conditions) []string {
	if ratio := c.Union / float64(c.N) / c.Density; c.P > 1 && ratio > 1.5 {
		return []string{fmt.Sprintf("actual density builds up with the workers: about %.1f× ρ here (the union of the workers' selections: its growth with the workers measured on %d workers' real gradients)", ratio, c.GradWorkers)}
	}
	return nil
}

// congested is the caveat of the methods that send one message to every
// peer.
const congested = "one message to every peer, charged one after another (the α-β model knows no congestion)"

// Tensor returns the shape's tensor i: with its shape where Tensors has
// it, else of unknown shape (Dims() 0), as a reducer sees a tensor of a
// layout without shapes.
func (s Shape) Tensor(i int) Tensor {
	if len(s.Tensors) == len(s.Sizes) {
		return s.Tensors[i]
	}
	return Tensor{Size: s.Sizes[i]}
}

// layout is a layout of the shape's sizes, its tensors named t0, t1, ...
func (s Shape) layout() (Layout, error) {
	names := make([]string, len(s.Sizes))
	for i := range names {
		names[i] = fmt.Sprint("t", i)
	}
	return NewLayout(names, s.Sizes)
}
