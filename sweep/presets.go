package sweep

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// Preset is one of the papers' main comparisons as a sweep.
type Preset struct {
	// Name is what train sweep -preset takes.
	Name string
	// Paper names the paper and figures it reproduces; Doc says what the
	// sweep measures (not what it finds: Claims say that).
	Paper, Doc string
	// Claims are the paper's statements the sweep tests; its page and last
	// lines give each one's verdict on the runs (Judge).
	Claims []Claim
	// Spec is the grid, sized to run in minutes on a 2-core machine with
	// NCF on MovieLens-100K (the data folder is set by the caller).
	Spec Spec
	// FullSize is the command of the paper-sized sweep, for a machine with
	// many cores or GPUs; on a cluster of separate machines run each point
	// of its -dry-run under mpirun instead.
	FullSize string
	// Minutes is about how long Spec takes on a 2-core machine shared with
	// a light load (docs/results/sweep-presets-ncf.md: 304, 141 and 204 s).
	Minutes float64
}

// The measured durations of the presets added for LAGS and DRAGONN
// (docs/results/sweep-presets-ncf.md).
const (
	lagsMinutes    = 1
	dragonnMinutes = 1
)

// ncfBase is the presets' common configuration: NeuMF (paper size) on the
// real MovieLens-100K, its default optimizer (Adam, lr 0.001) and batch
// (256 per worker), an evaluation (HR@10, NDCG@10 on all 943 test users)
// every 100 iterations.
func ncfBase(steps, logEvery int) train.Config {
	return train.Config{Model: "ncf", Dataset: "ml-100k", Steps: steps, Epochs: train.Set(1000),
		EvalEvery: 100, LogEvery: train.Set(logEvery)}
}

// Presets are the named sweeps of train sweep -preset.
var Presets = map[string]Preset{
	"deft-buildup": {
		Name:  "deft-buildup",
		Paper: "DEFT (Yoon & Oh, ICPP'23), Fig. 1 and the selection-time scaling",
		Doc: "Actual density and selection time against the number of workers, for Top-k (each worker selects over the whole gradient; " +
			"the union of the selections is sent), DEFT and CLT-k (the workers share the selection), and MiCRO (a threshold on the worker's partition).",
		Claims: []Claim{
			{"Top-k's actual density builds up with the number of workers (the union of their selections).", scales("topk", density, "actual density", true, 1.5)},
			{"DEFT's and CLT-k's actual density stays at the setup density whatever the number of workers.", nearSetup([]string{"deft", "cltk"}, 0.5, 0.5, 1.1)},
			{"MiCRO's actual density stays near the setup density.", nearSetup([]string{"micro"}, 0.5, 0.5, 1.5)},
			{"DEFT's and MiCRO's selection time falls as the workers share the gradient.", falls([]string{"deft", "micro"}, tSelect, "selection time")},
		},
		Spec: Spec{Base: ncfBase(1000, 2), Sparsifiers: []string{"topk", "deft", "cltk", "micro"},
			Workers: []int{2, 4, 8, 16}, Densities: []float64{0.01}},
		FullSize: "train sweep -preset deft-buildup -model resnet18 -dataset cifar10 -workers 2,4,8,16,32 -density 0.01 -steps 0 -epochs 200 -eval-every 0 -log-every 10 -device cuda -out sweeps/deft-buildup-resnet18",
		Minutes:  5,
	},
	"spardl-scaling": {
		Name:  "spardl-scaling",
		Paper: "SparDL (Zhao et al.), the time-per-iteration breakdowns against TopkA, TopkDSA, Ok-Topk and gTop-k",
		Doc: "Time per iteration by phase and bytes per worker against the number of workers on an emulated 1 Gbit/s, 50 µs network, " +
			"for dense all-reduce and the sparse all-gather methods. SparDL runs the paper's headline configuration, " +
			"R-SAG over 2 teams (-teams 2 -sag rsag; the released code's default is one team with B-SAG). " +
			"The dense warm-up of TopkDSA and Ok-Topk is off so that the short runs sparsify from the first step.",
		Claims: []Claim{
			{"SparDL's iteration is the shortest of the sparse all-gather methods (TopkA, TopkDSA, Ok-Topk, gTop-k) at the largest worker count.",
				lowest("spardl", []string{"topka", "topkdsa", "oktopk", "gtopk"}, tIter, "time", true)},
			{"SparDL's bytes per worker stay bounded as the workers grow (at most 2× from the smallest worker count to the largest).", scales("spardl", sent, "bytes sent per worker", false, 2)},
		},
		Spec: Spec{Base: ncfBase(200, 1), Sparsifiers: []string{"dense", "topka", "topkdsa", "oktopk", "gtopk", "spardl"},
			Workers: []int{2, 4, 8, 16}, Densities: []float64{0.01},
			Networks:      []netmodel.Network{{Latency: 50 * time.Microsecond, Bandwidth: 1e9 / 8}},
			MethodOptions: sparsify.Values{"dense_warmup": 0, "teams": 2, "sag": "rsag"}},
		// The paper's own setting: 4 to 6 workers on Gigabit Ethernet, ρ
		// = 0.01, batch 16 per worker, SparDL with R-SAG over 2 teams (its
		// headline configuration; 5 workers do not split into 2 teams).
		FullSize: "train sweep -preset spardl-scaling -model resnet18 -dataset cifar10 -workers 4,6 -density 0.01 -batch 16 -teams 2 -sag rsag -net-bandwidth 1 -net-latency 50us -dense-warmup 512 -steps 2000 -eval-every 0 -device cuda -out sweeps/spardl-scaling-resnet18",
		Minutes:  2.5,
	},
	"lags-pipelining": {
		Name:  "lags-pipelining",
		Paper: "LAGS-SGD (Shi et al., ECAI'20), Table 2 (LAGS against single-layer sparsification and dense S-SGD) and the adaptive density of eq. 19",
		Doc: "Time per iteration by phase on an emulated 10 Gbit/s, 50 µs network: LAGS pipelines its layer groups' all-gathers " +
			"with the backward pass, TopkA exchanges the whole vector's selection after " +
			"the backward pass, dense all-reduces everything; LAGS chooses per-group densities in [ρ, 1] (c_u = 1/ρ = 100) from the " +
			"backward times it profiles after 5 warm-up steps (the run's notes say which steps).",
		Claims: []Claim{
			{"LAGS-SGD's iteration is shorter than single-layer sparsification's (TopkA) and dense S-SGD's.", lowest("lags", []string{"topka", "dense"}, tIter, "time", false)},
			{"Most of LAGS' communication is hidden behind the backward pass.", hides("lags")},
		},
		Spec: Spec{Base: ncfBase(300, 1), Sparsifiers: []string{"dense", "topka", "lags"},
			Workers: []int{4, 8}, Densities: []float64{0.01},
			Networks:      []netmodel.Network{{Latency: 50 * time.Microsecond, Bandwidth: 10e9 / 8}},
			MethodOptions: sparsify.Values{"max_ratio": 100.0}},
		// The paper's: CNNs at compression 1000 (ρ = 0.001) on 16 GPUs
		// over 10 Gbit/s Ethernet.
		FullSize: "train sweep -preset lags-pipelining -model resnet18 -dataset cifar10 -workers 4,8,16 -density 0.001 -max-ratio 1000 -net-bandwidth 10 -net-latency 50us -steps 2000 -eval-every 0 -device cuda -out sweeps/lags-pipelining-resnet18",
		Minutes:  lagsMinutes,
	},
	"dragonn-selection": {
		Name:  "dragonn-selection",
		Paper: "DRAGONN (Wang et al., ICML'22), Fig. 3 (training speed against DGC and Top-k) and Fig. 5(a) (selection time)",
		Doc: "Selection time and time per iteration of DRAGONN's one-pass hashed selection against DGC's double sampling " +
			"and TopkA's exact top-k, on an emulated 25 Gbit/s, 50 µs network, at the paper's " +
			"ρ = 0.001. No NCF tensor reaches DRAGONN's 204,800-element cut-off, so this grid compresses every tensor " +
			"(-min-tensor 0) and sparsifies from the first step (-dense-warmup 0, -sparsity-warmup 0); NCF trains with Adam, so DGC has no " +
			"SGD momentum to correct here. The full-size command keeps the paper's cut-off and warm-ups, and ResNet-18's SGD momentum.",
		Claims: []Claim{
			{"DRAGONN's selection is faster than DGC's double sampling and exact top-k's (Fig. 5(a)).", lowest("dragonn", []string{"dgc", "topka"}, tSelect, "selection time", false)},
			{"DRAGONN's iteration is shorter than DGC's and Top-k's (Fig. 3).", lowest("dragonn", []string{"dgc", "topka"}, tIter, "time", false)},
		},
		Spec: Spec{Base: ncfBase(300, 1), Sparsifiers: []string{"dense", "topka", "dgc", "dragonn"},
			Workers: []int{4, 8}, Densities: []float64{0.001},
			Networks:      []netmodel.Network{{Latency: 50 * time.Microsecond, Bandwidth: 25e9 / 8}},
			MethodOptions: sparsify.Values{"min_tensor": 0, "dense_warmup": 0, "sparsity_warmup": 0}},
		// The paper's: ρ = 0.001, its 204,800-element cut-off and 200
		// dense iterations, DGC's 4-epoch warm-up, 16 GPUs on 25 Gbit/s.
		FullSize: "train sweep -preset dragonn-selection -model resnet18 -dataset cifar10 -workers 4,8,16 -density 0.001 -min-tensor 204800 -dense-warmup 200 -sparsity-warmup 4 -net-bandwidth 25 -net-latency 50us -steps 2000 -eval-every 0 -device cuda -out sweeps/dragonn-selection-resnet18",
		Minutes:  dragonnMinutes,
	},
	"micro-threshold": {
		Name:  "micro-threshold",
		Paper: "MiCRO (Yoon & Oh, HiPC'23), Fig. 8 (threshold and error) and the density it reaches",
		Doc: "Error, threshold and actual density against iterations: MiCRO's threshold controller against the hard threshold, " +
			"which keeps λ = 1/(2√k) and sends what exceeds it, and Top-k and DEFT, which have no threshold.",
		Claims: []Claim{
			{"MiCRO's threshold controller brings its actual density to the setup density (over the last quarter of each run, within 0.5–2ρ).", nearSetup([]string{"micro"}, 0.25, 0.5, 2)},
			{"MiCRO's threshold selection is cheaper than Top-k's exact selection.", lowest("micro", []string{"topk"}, tSelect, "selection time", false)},
		},
		Spec: Spec{Base: ncfBase(1500, 5), Sparsifiers: []string{"micro", "threshold", "topk", "deft"},
			Workers: []int{4, 8}, Densities: []float64{0.01}},
		FullSize: "train sweep -preset micro-threshold -model lstm -dataset wikitext2 -workers 4,8,16 -density 0.001 -steps 0 -epochs 90 -eval-every 0 -log-every 10 -device cuda -out sweeps/micro-threshold-lstm",
		Minutes:  3.5,
	},
}

// PresetNames lists the presets by name.
func PresetNames() []string { return slices.Sorted(maps.Keys(Presets)) }

// LookupPreset returns the preset of a name, or an error listing them.
func LookupPreset(name string) (Preset, error) {
	p, ok := Presets[name]
	if !ok {
		return Preset{}, fmt.Errorf("sweep: unknown preset %q; use one of %s (train sweep -preset list describes them)", name, strings.Join(PresetNames(), ", "))
	}
	return p, nil
}
