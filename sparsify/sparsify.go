package sparsify

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
)

// Tensor is one parameter tensor of the flat gradient.
type Tensor struct {
	Name   string
	Size   int // number of elements
	Offset int // index of the first element in the flat vector
}

// Layout is the ordered list of tensors that make up the flat gradient, in the
// model's parameter order. N is the total number of elements.
type Layout struct {
	Tensors []Tensor
	N       int
}

// NewLayout builds a Layout from tensor names and sizes in parameter order.
// Every size must be positive.
func NewLayout(names []string, sizes []int) (Layout, error) {
	if len(names) != len(sizes) {
		return Layout{}, fmt.Errorf("sparsify: layout has %d names but %d sizes", len(names), len(sizes))
	}
	l := Layout{Tensors: make([]Tensor, len(sizes))}
	for i, s := range sizes {
		if s <= 0 {
			return Layout{}, fmt.Errorf("sparsify: tensor %d (%q) has size %d; every tensor of a layout must have at least one element", i, names[i], s)
		}
		l.Tensors[i] = Tensor{Name: names[i], Size: s, Offset: l.N}
		l.N += s
	}
	return l, nil
}

// FlatLayout is a layout of one tensor named "flat" with n elements.
func FlatLayout(n int) (Layout, error) { return NewLayout([]string{"flat"}, []int{n}) }

// Stats describes one Reduce call of one worker.
type Stats struct {
	// Density is the setup density ρ the reducer was built with.
	Density float64
	// ActualDensity is the number of distinct indices whose values crossed the
	// wire (the union over workers) divided by N. Dense reduction gives 1.
	ActualDensity float64
	// Selected is the number of indices this worker selected.
	Selected int
	// SelectedPerWorker is the number of indices each rank selected, where the
	// method exchanges that information (nil otherwise).
	SelectedPerWorker []int
	// ErrorNorm is ‖residual‖₂ of this worker after the call.
	ErrorNorm float64
	// Threshold is the magnitude threshold used this call, NaN for methods
	// that have none.
	Threshold float64
	// BytesSent and BytesRecv count this worker's traffic during the call.
	BytesSent, BytesRecv int64
	// SelectTime is the time spent choosing indices, CommTime the time spent
	// in communicator calls.
	SelectTime, CommTime time.Duration
	// LayerK is the number of indices selected per layout tensor, for methods
	// that allocate the budget per tensor or fragment (nil otherwise).
	LayerK []int
}

// Reducer is one sparsification method bound to one worker.
type Reducer interface {
	// Name is the registry name of the method.
	Name() string
	// Reduce takes this worker's error-compensated gradient acc (length N of
	// the layout), writes the gradient averaged over all workers into out
	// (every element is written) and this worker's new residual into residual
	// (every element is written). residual may be the same slice as acc; out
	// must not overlap either. Every rank must call Reduce in lock-step.
	Reduce(ctx context.Context, acc, out, residual []float32) (Stats, error)
}

// Options configure a reducer. Zero values select each method's defaults.
type Options struct {
	// Density is the fraction ρ ∈ (0, 1] of the N elements to send.
	Density float64
	// Layout describes the flat gradient.
	Layout Layout
	// Comm connects the workers.
	Comm comm.Communicator
	// Seed seeds the methods that draw random numbers; it must be the same on
	// every rank.
	Seed uint64
	// Lambda is the hard threshold λ of "threshold" (0: 1/(2√k), recomputed
	// every call, as the MiCRO repository does).
	Lambda float64
	// Teams is SparDL's number of teams G (default 1).
	Teams int
	// SAG selects SparDL's spar-all-gather across teams: "bruck" (default) or
	// "rsag" (recursive doubling; G must be a power of two).
	SAG string
	// MergeSize is LAGS' merge threshold in elements (default 8192).
	MergeSize int
	// MaxRatio is LAGS' compression-ratio upper bound c_u for the adaptive
	// per-layer density (0: adaptive choice off, every layer uses Density).
	MaxRatio float64
	// Network is the network the run declares or emulates (the trainer's
	// -net-latency and -net-bandwidth), which LAGS' adaptive density models.
	// The zero value declares none: LAGS then measures the network it runs
	// on (see LAGS). Every rank must pass the same value.
	Network netmodel.Network
	// MinTensor is DRAGONN's size threshold: only tensors with more elements
	// are compressed (default 204800).
	MinTensor int
	// Warmup is the number of initial dense iterations of dragonn (default
	// 200) and of oktopk and topkdsa (default 512, the Ok-Topk code's); a
	// negative value means none.
	Warmup int
}

// Constructor builds a reducer from options.
type Constructor func(Options) (Reducer, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Constructor{}
)

// Register adds a method under name. It panics if the name is taken, like
// database/sql.Register.
func Register(name string, c Constructor) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[name]; dup {
		panic("sparsify: Register called twice for " + name)
	}
	registry[name] = c
}

// Names lists the registered methods in sorted order.
func Names() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ErrUnknownMethod is wrapped by New's error for a name that is not registered.
var ErrUnknownMethod = errors.New("sparsify: unknown method")

// New builds the reducer registered under name after checking the options
// every method shares: a communicator of at least one rank, a density in
// (0, 1], a non-empty layout of positive tensor sizes and at most
// math.MaxInt32 elements (indices travel as int32). The constructors rely on
// these checks.
func New(name string, o Options) (Reducer, error) {
	registryMu.RLock()
	c, ok := registry[name]
	registryMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %q; valid names: %s", ErrUnknownMethod, name, strings.Join(Names(), ", "))
	}
	if err := checkOptions(name, o); err != nil {
		return nil, err
	}
	return c(o)
}

// checkOptions checks the options every method shares (see New).
func checkOptions(name string, o Options) error {
	if o.Comm == nil {
		return fmt.Errorf("sparsify: %s: no communicator given", name)
	}
	if o.Comm.Size() < 1 {
		return fmt.Errorf("sparsify: %s: communicator has %d ranks; every method needs at least 1", name, o.Comm.Size())
	}
	if !(o.Density > 0 && o.Density <= 1) { // also rejects NaN
		return fmt.Errorf("sparsify: %s: density %v is outside (0, 1]", name, o.Density)
	}
	if o.Layout.N <= 0 || len(o.Layout.Tensors) == 0 {
		return fmt.Errorf("sparsify: %s: empty layout; build it with NewLayout from the model's parameters", name)
	}
	if o.Layout.N > math.MaxInt32 {
		return fmt.Errorf("sparsify: %s: layout has %d elements but indices travel as int32: at most %d elements are supported (shard the model)", name, o.Layout.N, math.MaxInt32)
	}
	end := 0
	for _, t := range o.Layout.Tensors {
		if t.Size <= 0 {
			return fmt.Errorf("sparsify: %s: tensor %q has size %d; every tensor must have at least one element", name, t.Name, t.Size)
		}
		if t.Offset != end {
			return fmt.Errorf("sparsify: %s: tensor %q starts at element %d but the tensors before it end at %d; build the layout with NewLayout", name, t.Name, t.Offset, end)
		}
		end += t.Size
	}
	if end != o.Layout.N {
		return fmt.Errorf("sparsify: %s: the layout's tensors have %d elements but its N is %d; build the layout with NewLayout", name, end, o.Layout.N)
	}
	return nil
}

// BudgetK is the number of elements a density ρ gives over n elements:
// ⌊ρ·n⌋ as in the reference code, clamped to at least 1 (the reference code
// crashes or sends nothing when it rounds to 0) and at most n.
func BudgetK(density float64, n int) int {
	k := int(density * float64(n))
	return max(1, min(k, n))
}

// Memory is one worker's error-feedback memory: the residual of what earlier
// reductions did not send.
type Memory struct {
	// Residual has the layout's length; Accumulate turns it into acc in place
	// and the reducer overwrites it with the new residual.
	Residual []float32
	// LRScaled selects the LAGS-paper variant that accumulates
	// learning-rate-scaled gradients (acc = residual + lr·grad); the reduced
	// output is then an update to subtract from the parameters as it is,
	// without multiplying by the learning rate again.
	LRScaled bool
}

// NewMemory returns a zero memory for n elements.
func NewMemory(n int, lrScaled bool) *Memory {
	return &Memory{Residual: make([]float32, n), LRScaled: lrScaled}
}

// Accumulate adds grad (times lr when LRScaled) to the residual in place and
// returns it: this is acc, to be passed to Reduce as both acc and residual.
// A NaN or infinite gradient is an error naming the first bad index.
func (m *Memory) Accumulate(grad []float32, lr float32) ([]float32, error) {
	if len(grad) != len(m.Residual) {
		return nil, fmt.Errorf("sparsify: gradient has %d elements, memory %d", len(grad), len(m.Residual))
	}
	scale := float32(1)
	if m.LRScaled {
		scale = lr
	}
	// One fused pass (add and check), split over all cores for large
	// vectors; each chunk reports its first non-finite element.
	r := m.Residual
	p := selChunks(len(r))
	bad := make([]int, p)
	selParallel(len(r), p, func(c, lo, hi int) { bad[c] = selAccumulate(r[lo:hi], grad[lo:hi], scale, lo) })
	for _, i := range bad {
		if i >= 0 {
			v := r[i]
			return nil, fmt.Errorf("sparsify: error-compensated gradient element %d is %v: the gradient diverged (lower the learning rate or clip gradients)", i, v)
		}
	}
	return r, nil
}
