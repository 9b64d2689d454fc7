package advise

import (
	"slices"
	"strings"
)

// Kind is a kind of model, as far as what is known about the methods'
// accuracy goes: the papers and the project's runs show convergence on
// some kinds of model and not on others.
type Kind string

// The kinds of model.
const (
	CNN         Kind = "cnn"         // convolutional networks (ResNet, VGG, ...)
	RNN         Kind = "rnn"         // recurrent networks (LSTM language models, ...)
	Transformer Kind = "transformer" // attention models (BERT, ViT, ...)
	Recommender Kind = "recommender" // embeddings + MLP recommenders (NCF, ...)
	MLP         Kind = "mlp"         // fully connected networks (MLP-Mixer, extreme classification)
	OtherKind   Kind = "other"
)

// Kinds lists the kinds, for flags.
var Kinds = []Kind{CNN, RNN, Transformer, Recommender, MLP, OtherKind}

// KindOf returns the kind of a built-in model, or guesses a recorded
// model's from its parameter names: attention projections make a
// Transformer, convolutions a CNN, recurrent weights an RNN, embeddings
// beside an MLP a recommender, linear layers alone an MLP.
func KindOf(model string, names []string) Kind {
	switch model {
	case "resnet18":
		return CNN
	case "lstm":
		return RNN
	case "ncf":
		return Recommender
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

// Knowledge is what is known about one method's accuracy.
type Knowledge struct {
	// Shown are the kinds of model on which a paper or the project's own
	// runs showed the method training to about dense training's accuracy.
	Shown []Kind
	// Papers says where (models, data sets) and what.
	Papers string
	// Project is the project's own evidence ("" if none).
	Project string
	// Warning is a known accuracy problem ("" if none).
	Warning string
}

// knowledge is the evidence per method. The papers' models are those they
// trained to (near) dense accuracy; the project's runs are in docs/results.
var knowledge = map[string]Knowledge{
	"dense": {Shown: []Kind{CNN, RNN, Transformer, Recommender, MLP, OtherKind}, Papers: "the baseline: all-reduce of the whole gradient, what data-parallel training does"},
	"topk": {Shown: []Kind{CNN, RNN, Transformer, Recommender},
		Papers:  "near dense with error feedback on CNNs, LSTMs and Transformers in the papers that use it as their baseline (DEFT, MiCRO, LAGS-SGD, DRAGONN, Ok-Topk: VGG-16, ResNet-18/20/50, LSTM-PTB, WikiText-2, BERT)",
		Project: "NCF on MovieLens-100K, 4 workers, ρ = 0.1: HR@10 0.665 after 20 epochs, as dense's 0.665 (docs/results/ncf-ml100k.md)"},
	"deft": {Shown: []Kind{CNN, RNN, Recommender},
		Papers:  "DEFT paper: ResNet-18 on CIFAR-10, LSTM on WikiText-2, NCF on MovieLens-20M, accuracy comparable to dense",
		Project: "NCF on MovieLens-100K, 4 workers, ρ = 0.1: HR@10 0.673 after 20 epochs (dense 0.665; docs/results/ncf-ml100k.md)"},
	"micro": {Shown: []Kind{CNN, Recommender},
		Papers:  "MiCRO paper: ResNet-18, GoogLeNet, SENet-18 on CIFAR-10/100 (CNNs only)",
		Project: "NCF on MovieLens-100K, 4 workers, ρ = 0.1: HR@10 0.637 after 20 epochs (dense 0.665; docs/results/ncf-ml100k.md)"},
	"cltk": {Shown: []Kind{CNN, RNN, Transformer},
		Papers: "ScaleCom (CLT-k): ResNets on CIFAR-10 and ImageNet, LSTM speech, Transformer on WMT14; the slowest to converge of MiCRO's CNN comparisons"},
	"gtopk": {Shown: []Kind{CNN, RNN},
		Papers: "gTop-k paper: VGG-16, ResNet-20 on CIFAR-10, ResNet-50 on ImageNet, LSTM-PTB; similar accuracy in SparDL's comparisons (VGG, ResNet-20, LSTM on IMDB)"},
	"dgc": {Shown: []Kind{CNN, RNN},
		Papers: "DGC paper: ResNets on CIFAR-10 and ImageNet, LSTM on PTB and speech, no loss at 99.9 % sparsity with momentum correction and warm-up"},
	"dragonn": {Shown: []Kind{CNN, Transformer, MLP},
		Papers: "DRAGONN paper: ResNet-50 on ImageNet, ViT, MLP-Mixer, extreme classification on Wiki10-31K"},
	"lags": {Shown: []Kind{CNN, RNN},
		Papers: "LAGS-SGD paper: ResNet-20, VGG-16 (CIFAR-10), ResNet-50 (ImageNet), LSTM-PTB; slight losses (ResNet-20 90.2 % vs 90.9 %, LSTM perplexity 109 vs 107)"},
	"spardl": {Shown: []Kind{CNN, RNN},
		Papers: "SparDL paper: VGG-16/19, ResNet-20 on CIFAR, LSTM on IMDB, similar accuracy to dense"},
	"oktopk": {Shown: []Kind{CNN, RNN, Transformer},
		Papers: "Ok-Topk paper: VGG-16 on CIFAR-10, LSTM on AN4, BERT; similar accuracy in SparDL's comparisons"},
	"topka": {Shown: []Kind{CNN, RNN},
		Papers: "compared in the SparDL paper (VGG-16/19, ResNet-20, LSTM on IMDB): the same selection as Top-k"},
	"topkdsa": {Shown: []Kind{CNN, RNN},
		Papers: "compared in the SparDL paper (VGG-16/19, ResNet-20, LSTM on IMDB): the same selection as Top-k"},
	"randomk": {
		Papers:  "no paper here shows it at dense accuracy",
		Warning: "random sampling needed 15.1× the iterations to converge in DRAGONN's comparison (Wiki10-31K); its fast selection does not make up for that"},
	"threshold": {
		Papers:  "compared in MiCRO's paper (CNNs), where its fixed λ gave an excessively high actual density in every experiment",
		Warning: "a fixed λ sends whatever the gradients' magnitude makes it send: its density and accuracy are not controlled"},
}

// Known returns what is known about method's accuracy.
func Known(method string) Knowledge {
	k, ok := knowledge[method]
	if !ok {
		return Knowledge{Papers: "nothing recorded in the advisor about this method's accuracy"}
	}
	return k
}

// ShownFor reports whether method's convergence has been shown for models
// of kind k. For OtherKind, which no evidence covers, every method with
// evidence on some kind counts (only those without any are flagged).
func ShownFor(method string, k Kind) bool {
	shown := Known(method).Shown
	if k == OtherKind || k == "" {
		return len(shown) > 0
	}
	return slices.Contains(shown, k)
}

// AccuracyCell is the table's short statement of what is known.
func AccuracyCell(method string, k Kind) string {
	kn := Known(method)
	switch {
	case method == "dense":
		return "baseline"
	case len(kn.Shown) == 0:
		return "NOT SHOWN"
	case !ShownFor(method, k):
		return "not shown for " + string(k)
	}
	var ks []string
	for _, s := range kn.Shown {
		ks = append(ks, string(s))
	}
	return "shown: " + strings.Join(ks, ", ")
}
