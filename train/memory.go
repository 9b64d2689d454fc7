package train

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/metrics"
)

// memPart is one part of a run's memory: what it is, its bytes, and the
// flag that makes it smaller.
type memPart struct {
	what  string
	bytes int64
	flag  string
	alt   string // another way to make it smaller (" or -executors")
}

// modelSizes are what the model of a run needs, as engine.Sizing plans
// it: its parameters, its training arena at the run's batch and its
// evaluation arena at the evaluation batch (models.*.EvalBytes).
type modelSizes struct {
	params, arena, eval int
}

// sizesCache holds modelSizes by everything they depend on: building a
// model's graphs costs about a second for the LSTM, and a process that
// runs many trainings (tests, sweeps) sizes each configuration once.
var sizesCache sync.Map

// sizeModel returns the sizes of c's model on ds with evaluation batches
// of evalN, built through engine.Sizing (nothing is allocated).
func sizeModel(c Config, ds *Dataset, evalN int) (modelSizes, error) {
	key := fmt.Sprint(c.Model, c.Preset, c.Dataset, c.Batch.Value(), evalN, ds.CIFAR.Kind, c.Kernels)
	switch {
	case ds.Rec != nil:
		key += fmt.Sprint(" rec ", ds.Rec.Users, ds.Rec.Items)
	case ds.Wiki != nil:
		key += fmt.Sprint(" vocab ", ds.Wiki.Vocab.Len())
	}
	if v, ok := sizesCache.Load(key); ok {
		return v.(modelSizes), nil
	}
	m, err := NewModel(c, ds, c.Seed.Value(), engine.Sizing(engine.CPU))
	if err != nil {
		return modelSizes{}, fmt.Errorf("train: building %s: %w", c.Model, err)
	}
	sz := modelSizes{params: m.NumParams(), arena: m.ArenaBytes()}
	if es, ok := m.(interface{ EvalBytes(int) (int, error) }); ok && evalN > 0 {
		if sz.eval, err = es.EvalBytes(evalN); err != nil {
			return modelSizes{}, fmt.Errorf("train: building %s's evaluation: %w", c.Model, err)
		}
	}
	sizesCache.Store(key, sz)
	return sz, nil
}

// memoryNeed is the memory one process of a run allocates once its data
// set is loaded, part by part: the models' programs (the executor plans
// each arena: activations and scratch at the batch size; the evaluation's
// at its batch), the vectors of the parameters' length (parameters,
// gradients, error-feedback residuals, optimizer state) and the data
// loaders' batches. What the sparsifiers keep beside the residual and the
// checkpoints' buffers are not counted: it is a lower bound. workers is the
// number of workers of this process, models the number of models they run
// on (simulated workers take turns on a few), shared that they share one
// copy of the parameters and optimizer; size is the number of workers of
// the job (which share the evaluation).
func memoryNeed(c Config, ds *Dataset, workers, size, nModels int, shared bool) ([]memPart, error) {
	evalN := evalBatchSize(c, ds, size)
	sz, err := sizeModel(c, ds, evalN)
	if err != nil {
		return nil, err
	}
	arena, evalArena := int64(sz.arena), int64(sz.eval)
	n := int64(sz.params) * 4
	copies := int64(workers) // of the parameters and the optimizer
	if shared {
		copies = 1
	}
	opt := int64(0)
	switch {
	case c.Optimizer == "adam":
		opt = 2 * n
	case c.Momentum.Value() > 0:
		opt = n
	}
	m, w := int64(nModels), int64(workers)
	loaders := int64(0) // a worker's training and evaluation batches
	if wl, ok := lookupWorkload(c.Model); ok && wl.loaderBytes != nil {
		loaders = wl.loaderBytes(c, evalN)
	}
	parts := []memPart{
		{fmt.Sprintf("%s's training program at -batch %s", c.Model, metrics.Thousands(c.Batch.Value())), m * arena, "-batch", ""},
		{fmt.Sprintf("its evaluation at -eval-batch %s", metrics.Thousands(c.EvalBatch.Value())), m * evalArena, "-eval-batch", ""},
		{"parameters, gradients, residuals and optimizer state", w*2*n + copies*(n+opt), "-workers", ""},
		{"the data loaders' batches", w * loaders, "-batch", ""},
	}
	if nModels > 1 {
		parts[0].what += fmt.Sprintf(" (×%d executors)", nModels)
		parts[1].what += fmt.Sprintf(" (×%d executors)", nModels)
		parts[0].alt, parts[1].alt = " or -executors", " or -executors"
	}
	if workers > 1 {
		parts[2].what += fmt.Sprintf(" (%d workers)", workers)
	}
	return parts, nil
}

// evalBatchSize is the size of an evaluation batch as the model sees it,
// for a worker of size (workload.evalBatch; else -eval-batch).
func evalBatchSize(c Config, ds *Dataset, size int) int {
	if w, ok := lookupWorkload(c.Model); ok && w.evalBatch != nil {
		return w.evalBatch(c, ds, size)
	}
	return c.EvalBatch.Value()
}

// ceilDiv is ⌈n/d⌉.
func ceilDiv(n, d int) int { return (n + d - 1) / d }

// machineMemory returns the memory this process may still allocate (the
// kernel's MemAvailable, or less under a cgroup limit) and the machine's
// total, in bytes; ok is false where it cannot be read (not Linux).
func machineMemory() (avail, total int64, ok bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, false
	}
	field := func(name string) int64 {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if rest, found := strings.CutPrefix(sc.Text(), name+":"); found {
				f := strings.Fields(rest)
				if len(f) > 0 {
					v, _ := strconv.ParseInt(f[0], 10, 64)
					return v << 10 // kB
				}
			}
		}
		return -1
	}
	avail, total = field("MemAvailable"), field("MemTotal")
	if avail < 0 || total <= 0 {
		return 0, 0, false
	}
	// A cgroup's limit (a container, a batch system's job).
	for _, f := range [][2]string{{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"}, {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}} {
		lb, err1 := os.ReadFile(f[0])
		ub, err2 := os.ReadFile(f[1])
		if err1 != nil || err2 != nil {
			continue
		}
		limit, err1 := strconv.ParseInt(strings.TrimSpace(string(lb)), 10, 64)
		used, err2 := strconv.ParseInt(strings.TrimSpace(string(ub)), 10, 64)
		if err1 != nil || err2 != nil || limit <= 0 || limit >= total {
			continue // "max", or no lower than the machine
		}
		total, avail = limit, min(avail, max(0, limit-used))
		break
	}
	return avail, total, true
}

// gb formats bytes for a person: "3.1 GB", "850 MB", "1,200 GB".
func gb(b int64) string {
	switch {
	case b >= 100e9:
		return metrics.Thousands(int(b/1e9)) + " GB"
	case b >= 1e9:
		return fmt.Sprintf("%.1f GB", float64(b)/1e9)
	default:
		return fmt.Sprintf("%d MB", max(1, b/1e6))
	}
}

// checkFits sizes the run before anything of it is allocated (rank 0 of
// this process's workers; nothing is written either) and refuses what
// cannot work: a density below one gradient element, a batch larger than
// a worker's share of the data, and a run whose memory (memoryNeed, on
// the CPU) exceeds what this machine has available. workers is the number
// of workers of this process, local the processes of the job on this
// machine (mpirun), size the workers of the job, sim the simulation (nil
// when the workers do not share models).
func checkFits(c Config, ds *Dataset, workers, local, size int, sim *simulation) error {
	if w, ok := lookupWorkload(c.Model); ok && w.checkBatch != nil {
		if err := w.checkBatch(c, ds, size); err != nil {
			return err
		}
	}
	sz, err := sizeModel(c, ds, evalBatchSize(c, ds, size))
	if err != nil {
		return err
	}
	if err := checkDensity(c, sz.params); err != nil {
		return err
	}
	if c.Device == "cuda" {
		return checkGPUFits(c, ds, workers*local, size)
	}
	if c.Device != "cpu" {
		return nil // the device's allocator says what does not fit
	}
	avail, total, ok := machineMemory()
	if !ok {
		return nil
	}
	nModels, shared := workers, false
	if sim != nil {
		nModels, shared = sim.executors, true
	}
	parts, err := memoryNeed(c, ds, workers, size, nModels, shared)
	if err != nil {
		return err
	}
	need := totalBytes(parts) * int64(local)
	if need <= avail {
		return nil
	}
	list := largestFirst(parts, need/int64(local))
	procs := ""
	if local > 1 {
		procs = fmt.Sprintf(" for its %d processes on this machine", local)
	}
	fix := "lower " + parts[0].flag
	if parts[0].flag == "-workers" {
		fix = "use fewer -workers, or more machines under mpirun"
	}
	if parts[0].flag == "-batch" {
		if b := fittingBatch(c, ds, workers, local, size, nModels, shared, avail); b > 0 {
			fix += fmt.Sprintf(" (-batch %s would fit)", metrics.Thousands(b))
		} else {
			fix = "even -batch 1 does not fit: use a machine with more memory"
		}
	}
	fix += parts[0].alt
	return fmt.Errorf("%w: the run needs at least %s of memory%s (%s), and this machine has %s available (of %s); %s",
		ErrConfig, gb(need), procs, list, gb(avail), gb(total), fix)
}

// totalBytes is the memory of parts.
func totalBytes(parts []memPart) (n int64) {
	for _, p := range parts {
		n += p.bytes
	}
	return n
}

// largestFirst sorts parts, the largest first, and lists those of at least
// a hundredth of total ("what: 3.1 GB; ...").
func largestFirst(parts []memPart, total int64) string {
	slices.SortStableFunc(parts, func(a, b memPart) int { return int(b.bytes>>20 - a.bytes>>20) })
	var list []string
	for _, p := range parts {
		if p.bytes >= total/100 {
			list = append(list, p.what+": "+gb(p.bytes))
		}
	}
	return strings.Join(list, "; ")
}

// fittingBatch is the largest batch size whose memory (memoryNeed, linear
// in the batch between batch 1 and the run's) fits in avail, or 0 when
// even batch 1 does not.
func fittingBatch(c Config, ds *Dataset, workers, local, size, nModels int, shared bool, avail int64) int {
	total := func(batch int) (int64, bool) {
		cb := c
		cb.Batch = Set(batch)
		parts, err := memoryNeed(cb, ds, workers, size, nModels, shared)
		return totalBytes(parts) * int64(local), err == nil
	}
	b := c.Batch.Value()
	one, ok1 := total(1)
	all, ok2 := total(b)
	if !ok1 || !ok2 || one > avail {
		return 0
	}
	if b <= 1 || all <= one {
		return b
	}
	perSample := float64(all-one) / float64(b-1)
	return 1 + int(float64(avail-one)/perSample)
}

// checkShare refuses c's training batch when a worker's share of the
// training samples of an epoch, share, is smaller (size workers).
func checkShare(c Config, share, size int) error {
	b := c.Batch.Value()
	if b <= share {
		return nil
	}
	who, fix := "the worker gets", ""
	if size > 1 {
		who, fix = fmt.Sprintf("each of %d workers gets", size), " or -workers"
	}
	return fmt.Errorf("%w: -batch %s: %s %s training samples per epoch, fewer than one batch; lower -batch (at most %s)%s",
		ErrConfig, metrics.Thousands(b), who, metrics.Thousands(share), metrics.Thousands(share), fix)
}

// checkDensity refuses a density that selects less than one of the n
// gradient elements: every sparsifier would send one element (k is at
// least 1), which is not the density asked for.
func checkDensity(c Config, n int) error {
	if c.Sparsifier == "dense" || n <= 0 {
		return nil
	}
	d := c.Density.Value()
	if d*float64(n) >= 1-1e-9 {
		return nil
	}
	return fmt.Errorf("%w: -density %g selects %.3g of the %s gradient elements of %s, less than one; the smallest density is 1/%s = %.3g (k = 1)",
		ErrConfig, d, d*float64(n), metrics.Thousands(n), c.Model, metrics.Thousands(n), 1/float64(n))
}
