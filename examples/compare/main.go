// Command compare trains one least-squares model data-parallel on simulated
// in-process workers, once with every sparsification method of package
// sparsify (the sparsifiers and the compressors fp16, efsignsgd and powersgd,
// which send every element in fewer bytes), and prints how each converged
// and what it sent: the quickest way to see the methods side by side before
// training a real model.
//
// Every worker holds its own shard of a synthetic regression problem
// (b = A·x* + noise), computes its gradient, adds its error-feedback
// residual, and the method's reducer produces the averaged sparse gradient.
//
// Options whose defaults are sized for real models would keep a method from
// doing what it is for on this toy, and are changed for it (the table's
// notes say which and why): the dense warm-up of TopkDSA, Ok-Topk and
// DRAGONN (512 and 200 iterations in the papers) would outlast a short run,
// so it is off; DRAGONN compresses only tensors above min_tensor elements
// (204800 by default, more than the toy has), so min_tensor is lowered until
// the compressed tensors hold 7/8 of the parameters. Under the table, each
// method's line says what to look for. A sparse method that still sent
// every element is named there with the reason.
//
//	go run ./examples/compare -workers 4 -density 0.01 -steps 300
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// errUnsupported marks methods that cannot serve this configuration (for
// example gtopk with a worker count that is not a power of two); they are
// reported and skipped.
var errUnsupported = errors.New("not available here")

type config struct {
	workers, dim, rows, steps int
	density, lr               float64
	seed                      uint64
	methods                   []string
}

type result struct {
	method                          string
	loss0, loss                     float64
	actual, errNorm                 float64
	bytesSent                       float64
	selectTime, commTime, totalTime time.Duration
	// dense counts the steps that sent every element.
	dense int
	// notes say which options were changed for the toy, and why.
	notes []string
	err   error
}

// purpose says what each method is for and what to look for in its row.
var purpose = map[string]string{
	"dense":     "the baseline: every element, exact average",
	"topk":      "each worker's own top-k; the union of the workers' selections grows with the workers (actual density above ρ)",
	"topka":     "top-k (index, value) pairs all-gathered (Ok-Topk's TopkA): as topk, the union grows",
	"topkdsa":   "top-k pairs sent to the owners of equal regions, summed there and all-gathered (TopkDSA): the same sums as topka, sent in other messages (compare the KB and comm columns)",
	"oktopk":    "Ok-Topk: thresholds re-estimated every 32 calls, balanced regions; density near ρ once its controllers settle",
	"gtopk":     "gTop-k's tree keeps exactly k global elements: density ρ, more error than topk",
	"cltk":      "a rotating leader's top-k for everyone: density ρ",
	"threshold": "a fixed magnitude threshold: density follows the gradients' size",
	"dgc":       "DGC's sampled threshold per tensor: about ρ per worker, the union above it; its momentum correction and its density warm-up over the first epochs need SGD momentum and epochs, which this toy has not (train -sparsifier dgc -optimizer sgd -momentum 0.9 has both)",
	"randomk":   "k random elements, the same on every worker: density ρ, the most error",
	"deft":      "norm-proportional budgets per fragment, fragments split among the workers: density stays at ρ",
	"micro":     "rotating partitions with a shared threshold: density approaches ρ as the threshold settles",
	"dragonn":   "small tensors dense, large ones by a sampled threshold with hashed insertion",
	"lags":      "layer-wise top-k per merge group (merge groups of 8192 elements: on this toy one group, so it selects as topka); its point, hiding the groups' communication behind the backward pass, needs the trainer (train -sparsifier lags): this toy has no backward pass to overlap",
	"spardl":    "sparse reduce-scatter then all-gather: exactly k per block, density ρ",
	"mstopk":    "MSTopk's approximate top-k (binary search on a threshold, part drawn at random below it), exchanged as topk: compare its select ms with topk's",
	"fp16":      "a compressor, not a sparsifier: every element in half precision (actual density 1, half of dense's KB), no error feedback; loss near dense's",
	"efsignsgd": "a compressor: every element as its sign, 1 bit, scaled per tensor, with error feedback (actual density 1, about 1/32 of dense's KB; all-gathered, so its KB grow with the workers)",
	"powersgd":  "a compressor: each tensor as a rank-1 product P·Qᵀ (-rank; on this toy each tensor is taken as its most nearly square matrix), with error feedback and a warm-started Q (actual density 1, KB of P and Q only)",
}

func main() {
	var cfg config
	var methods string
	flag.IntVar(&cfg.workers, "workers", 4, "number of simulated workers")
	flag.IntVar(&cfg.dim, "dim", 4096, "number of model parameters")
	flag.IntVar(&cfg.rows, "rows", 256, "training rows per worker")
	flag.IntVar(&cfg.steps, "steps", 300, "training iterations")
	flag.Float64Var(&cfg.density, "density", 0.01, "fraction of the gradient each method sends, in (0, 1]")
	flag.Float64Var(&cfg.lr, "lr", 0.5, "learning rate")
	flag.Uint64Var(&cfg.seed, "seed", 1, "random seed")
	flag.StringVar(&methods, "methods", "", "comma-separated methods (default: every registered method: "+strings.Join(sparsify.Names(), ",")+")")
	flag.Parse()
	if methods == "" {
		cfg.methods = sparsify.Names()
	} else {
		cfg.methods = strings.Split(methods, ",")
	}
	if err := validate(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	fmt.Printf("least squares, %d parameters, %d workers × %d rows, density %g, %d steps\n\n",
		cfg.dim, cfg.workers, cfg.rows, cfg.density, cfg.steps)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "method\tloss start\tloss end\tactual density\t× ρ\t‖residual‖\tKB sent/step\tselect ms/step\tcomm ms/step\ttotal s\t")
	failed := false
	var results []result
	for _, m := range cfg.methods {
		r := train(ctx, cfg, m)
		results = append(results, r)
		if r.err != nil {
			fmt.Fprintf(tw, "%s\t%v\t\t\t\t\t\t\t\t\t\n", m, r.err)
			failed = failed || !errors.Is(r.err, errUnsupported)
			continue
		}
		s := float64(cfg.steps)
		fmt.Fprintf(tw, "%s\t%.4g\t%.4g\t%.4f\t%.2f\t%.3g\t%.1f\t%.2f\t%.2f\t%.2f\t\n", m, r.loss0, r.loss, r.actual, r.actual/cfg.density, r.errNorm,
			r.bytesSent/s/1024, ms(r.selectTime)/s, ms(r.commTime)/s, r.totalTime.Seconds())
	}
	tw.Flush()
	fmt.Println()
	for _, r := range results {
		if r.err == nil {
			fmt.Println(explain(cfg, r))
		}
	}
	if failed {
		os.Exit(1)
	}
}

// explain is a method's line under the table: what it is for, the options
// changed for the toy, and why it sent everything if it did.
func explain(c config, r result) string {
	line := r.method + ": " + purpose[r.method]
	if purpose[r.method] == "" {
		line = r.method + ":"
	}
	for _, n := range r.notes {
		line += "; " + n
	}
	if r.method != "dense" && c.density < 1 && r.dense == c.steps {
		line += "; SENT EVERY ELEMENT in every step: this toy does not exercise it"
	}
	return line
}

// toyOptions returns the method options m needs on this toy to do what it
// is for, and a note for each change.
func toyOptions(m sparsify.Method, c config, lay sparsify.Layout) (sparsify.Values, []string) {
	v := sparsify.Values{}
	var notes []string
	if p, ok := m.Param("dense_warmup"); ok {
		if d, _ := p.Default.(int); d > 0 {
			v["dense_warmup"] = 0
			notes = append(notes, fmt.Sprintf("dense warm-up off (its default, %d dense iterations, is for real training runs)", d))
		}
	}
	if p, ok := m.Param("min_tensor"); ok {
		sizes := make([]int, len(lay.Tensors))
		largest := 0
		for i, t := range lay.Tensors {
			sizes[i] = t.Size
			largest = max(largest, t.Size)
		}
		if d, _ := p.Default.(int); d >= largest {
			// The largest threshold below which the compressed tensors
			// hold at least 7/8 of the parameters.
			slices.SortFunc(sizes, func(a, b int) int { return b - a })
			held, min := 0, 0
			for _, s := range sizes {
				held += s
				min = s - 1
				if 8*held >= 7*lay.N {
					break
				}
			}
			v["min_tensor"] = min
			notes = append(notes, fmt.Sprintf("min_tensor %d (its default, %d elements, is above this toy's largest tensor of %d: every tensor would go dense)", min, d, largest))
		}
	}
	return v, notes
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func validate(c config) error {
	switch {
	case c.workers < 1:
		return fmt.Errorf("-workers %d: need at least 1", c.workers)
	case c.dim < 1 || c.rows < 1 || c.steps < 1:
		return fmt.Errorf("-dim, -rows and -steps must be positive")
	case !(c.density > 0 && c.density <= 1):
		return fmt.Errorf("-density %v: must be in (0, 1]", c.density)
	case !(c.lr > 0):
		return fmt.Errorf("-lr %v: must be positive", c.lr)
	}
	return nil
}

// layout cuts the parameters into tensors of decreasing size, like a model's
// layers, so that layer-wise methods have something to work with.
func layout(dim int) (sparsify.Layout, error) {
	var names []string
	var sizes []int
	rest := dim
	for i := 0; rest > 0; i++ {
		s := max(rest/2, 1)
		if rest <= 16 {
			s = rest
		}
		names = append(names, fmt.Sprintf("layer%d.weight", i))
		sizes = append(sizes, s)
		rest -= s
	}
	return sparsify.NewLayout(names, sizes)
}

// shard is one worker's rows of the regression problem, row-major.
type shard struct {
	a    []float32
	b    []float32
	rows int
}

func makeShards(c config) []shard {
	rng := rand.New(rand.NewPCG(c.seed, 0x5eed))
	truth := make([]float32, c.dim)
	for i := range truth {
		truth[i] = float32(rng.NormFloat64())
	}
	scale := float32(1 / math.Sqrt(float64(c.dim)))
	shards := make([]shard, c.workers)
	for w := range shards {
		s := shard{a: make([]float32, c.rows*c.dim), b: make([]float32, c.rows), rows: c.rows}
		for r := range c.rows {
			row := s.a[r*c.dim : (r+1)*c.dim]
			var dot float32
			for j := range row {
				row[j] = float32(rng.NormFloat64()) * scale
				dot += row[j] * truth[j]
			}
			s.b[r] = dot + 0.01*float32(rng.NormFloat64())
		}
		shards[w] = s
	}
	return shards
}

// lossGrad returns 0.5·mean((A x − b)²) over the shard and writes its gradient.
func (s shard) lossGrad(x, grad []float32) float64 {
	clear(grad)
	dim := len(x)
	var loss float64
	for r := range s.rows {
		row := s.a[r*dim : (r+1)*dim]
		var pred float32
		for j, v := range row {
			pred += v * x[j]
		}
		e := pred - s.b[r]
		loss += 0.5 * float64(e) * float64(e)
		g := e / float32(s.rows)
		for j, v := range row {
			grad[j] += g * v
		}
	}
	return loss / float64(s.rows)
}

func train(ctx context.Context, c config, method string) result {
	res := result{method: method}
	lay, err := layout(c.dim)
	if err != nil {
		res.err = err
		return res
	}
	meth, ok := sparsify.Lookup(method)
	if !ok {
		res.err = fmt.Errorf("unknown method %q; use one of %s", method, strings.Join(sparsify.Names(), ", "))
		return res
	}
	params, notes := toyOptions(meth, c, lay)
	res.notes = notes
	shards := makeShards(c)
	losses := make([][2]float64, c.workers)
	denseSteps := make([]int, c.workers)
	// What a dense all-reduce of the whole gradient sends per worker (a
	// ring's 2(n−1)/n times the float32 bytes).
	denseBytes := float64(lay.N) * 4 * 2 * float64(c.workers-1) / float64(c.workers)
	stats := make([]sparsify.Stats, c.workers)
	sums := make([]sparsify.Stats, c.workers)
	start := time.Now()
	res.err = local.Run(ctx, c.workers, func(ctx context.Context, cm comm.Communicator) error {
		red, err := sparsify.New(method, sparsify.Options{Density: c.density, Layout: lay, Comm: cm, Seed: c.seed, Params: meth.Applicable(params)})
		if err != nil {
			return fmt.Errorf("%w: %w", errUnsupported, err)
		}
		r := cm.Rank()
		mem := sparsify.NewMemory(c.dim, false)
		x := make([]float32, c.dim)
		grad := make([]float32, c.dim)
		out := make([]float32, c.dim)
		for step := range c.steps {
			l := shards[r].lossGrad(x, grad)
			if step == 0 {
				losses[r][0] = l
			}
			acc, err := mem.Accumulate(grad, float32(c.lr))
			if err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
			st, err := red.Reduce(ctx, acc, out, mem.Residual)
			if err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
			for i, v := range out {
				x[i] -= float32(c.lr) * v
			}
			stats[r] = st
			// A step sent everything when every element crossed the
			// wire at full size: a compressor's (fp16, efsignsgd,
			// powersgd) crosses it compressed.
			if st.ActualDensity >= 1 && float64(st.BytesSent) >= 0.9*denseBytes {
				denseSteps[r]++
			}
			sums[r].ActualDensity += st.ActualDensity
			sums[r].BytesSent += st.BytesSent
			sums[r].SelectTime += st.SelectTime
			sums[r].CommTime += st.CommTime
		}
		losses[r][1] = shards[r].lossGrad(x, grad)
		return nil
	})
	res.totalTime = time.Since(start)
	if res.err != nil {
		slog.Debug("method failed", "method", method, "err", res.err)
		return res
	}
	n := float64(c.workers)
	for w := range c.workers {
		res.loss0 += losses[w][0] / n
		res.loss += losses[w][1] / n
		res.actual += sums[w].ActualDensity / n / float64(c.steps)
		res.errNorm += stats[w].ErrorNorm / n
		res.bytesSent += float64(sums[w].BytesSent) / n
		res.selectTime = max(res.selectTime, sums[w].SelectTime)
		res.commTime = max(res.commTime, sums[w].CommTime)
	}
	res.dense = denseSteps[0]
	return res
}
