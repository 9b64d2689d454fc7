package advise

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// Kind is a kind of model, as far as what is known about the methods'
// accuracy goes (sparsify.ModelKind: each method's registry entry says on
// which kinds it was shown to converge).
type Kind = sparsify.ModelKind

// The kinds of model.
const (
	CNN         = sparsify.CNN
	RNN         = sparsify.RNN
	Transformer = sparsify.Transformer
	Recommender = sparsify.Recommender
	MLP         = sparsify.MLP
	OtherKind   = sparsify.OtherModel
)

// Kinds lists the kinds, for flags.
var Kinds = sparsify.ModelKinds

// KindOf returns the kind of a built-in model, or guesses a recorded
// model's from its parameter names: attention projections make a
// Transformer, convolutions a CNN, recurrent weights an RNN, embeddings
// beside an MLP a recommender, linear layers alone an MLP.
func KindOf(model string, names []string) Kind {
	if k, ok := train.ModelKind(model); ok {
		return k
	}
	has := func(subs ...string) bool {
		for _, n := range names {
			l := strings.ToLower(n)
			for _, s := range subs {
				if strings.Contains(l, s) {
					return true
				}
			}
		}
		return false
	}
	switch {
	case has("attn", "attention", "in_proj", "q_proj", "query"):
		return Transformer
	case has("conv", "downsample"):
		return CNN
	case has("lstm", "gru", "rnn", "weight_hh"):
		return RNN
	case has("embed", "emb.") && has("mlp", "fc", "linear"):
		return Recommender
	case has("linear", "fc", "mlp", "dense"):
		return MLP
	}
	return OtherKind
}

// Knowledge is what is known about one method's accuracy, as its
// registry entry declares it (sparsify.Advice.Evidence).
type Knowledge = sparsify.Evidence

// Known returns what is known about method's accuracy.
func Known(method string) Knowledge {
	m, ok := sparsify.Lookup(method)
	if !ok || m.Advice == nil || m.Advice.Evidence.Papers == "" {
		return Knowledge{Papers: "nothing recorded in the advisor about this method's accuracy"}
	}
	return m.Advice.Evidence
}

// ShownFor reports whether method's convergence has been shown for models
// of kind k at density (0: any): the kind is among its evidence's Shown
// and, where the evidence records the density it was shown at on that kind
// (sparsify.Evidence.At), density is not below it. No evidence covers
// OtherKind (a model of unknown kind): there it is false for every method,
// and the advisor ranks nothing.
func ShownFor(method string, k Kind, density float64) bool {
	if k == OtherKind || k == "" {
		return false
	}
	kn := Known(method)
	if !slices.Contains(kn.Shown, k) {
		return false
	}
	at, ok := shownAt(kn, k)
	return !ok || density == 0 || density >= at.Density
}

// shownAt returns the setting the evidence records for kind k, if any.
func shownAt(kn Knowledge, k Kind) (sparsify.ShownAt, bool) {
	for _, a := range kn.At {
		if a.Kind == k {
			return a, true
		}
	}
	return sparsify.ShownAt{}, false
}

// AccuracyCell is the table's short statement of what is known at
// density.
func AccuracyCell(method string, k Kind, density float64) string {
	kn := Known(method)
	switch {
	case method == "dense":
		return "baseline"
	case len(kn.Shown) == 0:
		return "NOT SHOWN"
	case k == OtherKind || k == "":
		return "kind unknown"
	case !slices.Contains(kn.Shown, k):
		return "not shown for " + string(k)
	}
	at, ok := shownAt(kn, k)
	switch {
	case !ok:
		return "shown for " + string(k) + " (density not recorded)"
	case !ShownFor(method, k, density):
		return fmt.Sprintf("shown for %s only at ρ ≥ %g", k, at.Density)
	}
	return fmt.Sprintf("shown for %s at ρ = %g, %d workers", k, at.Density, at.Workers)
}
