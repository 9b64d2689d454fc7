package sweep

import (
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/reports"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// The preset "compressors": the compressors users of PyTorch DDP and
// Horovod put beside sparsification (FP16, EF-SignSGD, PowerSGD) against
// dense, Top-k, DEFT and MiCRO. Its claim rules are here, apart from the
// other presets'.
func init() {
	Presets["compressors"] = Preset{
		Name: "compressors",
		Paper: "the compressors of PyTorch DDP and Horovod (FP16: fp16_compress_hook, Compression.fp16), EF-SignSGD (Karimireddy et al., ICML'19) " +
			"and PowerSGD (Vogels et al., NeurIPS'19) beside Top-k, DEFT and MiCRO",
		Doc: "Bytes per worker and training loss of dense all-reduce, FP16 (half precision), EF-SignSGD (1 bit per element, all-gathered), " +
			"PowerSGD rank 4 and rank 1 (its P and Q; powersgd and powersgd-rank1) and the sparsifiers Top-k, DEFT and MiCRO at ρ = 0.1; by default on NCF with 4 workers (flags such as -model, -workers and -density override it). " +
			"The compressors ignore the density: they send every element, compressed.",
		Claims: []Claim{
			{"FP16 sends half of dense's bytes per worker.", bytesAtMost("fp16", func(int) float64 { return 0.5 }, "1/2")},
			{"EF-SignSGD sends 1 bit per element: with n workers at most n/60 of dense's bytes per worker (its all-gather grows with n; 1/32 at 2 workers).",
				bytesAtMost("efsignsgd", func(n int) float64 { return float64(n) / 60 }, "n/60")},
			{"PowerSGD rank 4 sends under 1/3 of dense's bytes per worker on NCF (its matrices are small: the traffic falls with their size).",
				bytesAtMost("powersgd", func(int) float64 { return 1.0 / 3 }, "1/3")},
			{"FP16 and PowerSGD train as dense does: their training loss over the last quarter of each run within 5% of dense's.",
				lossNear([]string{"fp16", "powersgd"}, 0.05)},
		},
		Spec: Spec{Base: ncfBase(1000, 5), Sparsifiers: []string{"dense", "fp16", "efsignsgd", "powersgd", "topk", "deft", "micro"},
			Workers: []int{4}, Densities: []float64{0.1}, MethodOptions: sparsify.Values{"rank": 4},
			Variants: []Variant{{Label: "powersgd-rank1", Method: "powersgd", Options: sparsify.Values{"rank": 1}}}},
		// A short ResNet-18 run: rank 4 and, as the preset's variant, rank 1.
		FullSize: "train sweep -preset compressors -model resnet18 -dataset cifar10 -workers 2,4 -density 0.01 -rank 4 -steps 500 -eval-every 100 -device cuda -out sweeps/compressors-resnet18",
		Minutes:  2.5,
	}
}

func loss(s *reports.Step) float64 { return s.Loss }

// bytesAtMost is a claim that method's median bytes sent per worker are at
// most frac(n) of dense's at every worker count n both ran at (within
// 0.1% for a format's headers).
func bytesAtMost(method string, frac func(n int) float64, what string) func(Results) Verdict {
	return func(rs Results) Verdict {
		shown, compared := true, 0
		detail := ""
		for _, w := range rs.workers(method) {
			d := rs.run("dense", w)
			if d == nil {
				continue
			}
			m, x := median(rs.run(method, w), sent), median(d, sent)
			compared++
			r := m / x
			if !(r <= frac(w)*1.001) {
				shown = false
			}
			detail += fmt.Sprintf("%s%d workers: %s %s bytes, dense %s (1/%s; the claim needs at most %s = %s)", sep(detail), w, method, g(m), g(x), g(1/r), what, g(frac(w)))
		}
		if compared == 0 {
			return undecided("%s did not run beside dense", method)
		}
		return Verdict{Shown: shown, Detail: "median bytes sent per worker per iteration, " + detail}
	}
}

// lossNear is a claim that each method's mean loss over the last quarter
// of its run is within tol (relative) of dense's at every worker count.
func lossNear(methods []string, tol float64) func(Results) Verdict {
	return func(rs Results) Verdict {
		shown, compared := true, 0
		detail := ""
		for _, m := range methods {
			for _, w := range rs.workers(m) {
				d := rs.run("dense", w)
				if d == nil {
					continue
				}
				a, b := tail(rs.run(m, w), 0.25, loss), tail(d, 0.25, loss)
				compared++
				if !(math.Abs(a-b) <= tol*math.Abs(b)) {
					shown = false
				}
				detail += fmt.Sprintf("%s%s %s, dense %s at %d workers", sep(detail), m, g(a), g(b), w)
			}
		}
		if compared == 0 {
			return undecided("none of the methods ran beside dense")
		}
		return Verdict{Shown: shown, Detail: fmt.Sprintf("mean loss over the last quarter (tolerance %s%%): %s", g(tol*100), detail)}
	}
}

func sep(s string) string {
	if s == "" {
		return ""
	}
	return "; "
}
