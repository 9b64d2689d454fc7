package sparsify

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/layout"
)

// Tensor is one parameter tensor of the flat gradient.
// Methods that treat 1-D tensors apart (dgc sends them dense) take an
// unknown shape (Dims 0) as more than one dimension.
type Tensor = layout.Tensor

// Layout is the ordered list of tensors that make up the flat gradient, in
// the model's parameter order (package layout's).
type Layout = layout.Layout

// NewLayout is layout.New: a layout of tensors of the given names and
// sizes, in parameter order.
func NewLayout(names []string, sizes []int) (Layout, error) { return layout.New(names, sizes) }

// FlatLayout is layout.Flat: one tensor named "flat" with n elements.
func FlatLayout(n int) (Layout, error) { return layout.Flat(n) }

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

// Options configure a reducer.
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
	// Network is the network the run declares or emulates (the trainer's
	// -net-latency and -net-bandwidth), which LAGS' adaptive density models.
	// The zero value declares none: LAGS then measures the network it runs
	// on (see LAGS). Every rank must pass the same value.
	Network netmodel.Network
	// Stream is the stream of the device whose memory a DeviceReducer's
	// ReduceOn works in (nil: the CPU's), and Ops that device's vector
	// operations (nil: CPUOps; a GPU's come from package cuda, cuda.Sparse).
	// The communicator must then take comm.Device buffers of that device.
	Stream device.Stream
	Ops    Ops
	// Momentum is the optimizer's SGD momentum, for the methods that apply
	// it themselves before selecting (Method.CorrectsMomentum: dgc's
	// momentum correction); the caller then applies momentum to weight
	// decay only. 0: none (plain error feedback). Every rank must pass the
	// same value.
	Momentum float64
	// Params are the method's own options, by name, as the method declares
	// them (Method.Params; listed in the package documentation under
	// "Method options"). An absent option takes its declared default; an
	// option the method does not declare, or a value outside its declared
	// range, makes New fail. Every rank must pass the same values.
	Params Values
}

// EpochScheduled is implemented by reducers whose schedule counts epochs
// (dgc's density warm-up). The trainer gives the number of calls per epoch
// before the first call; without it such a schedule is off.
type EpochScheduled interface {
	Reducer
	SetStepsPerEpoch(n int)
}

// Constructor builds a reducer from options.
type Constructor func(Options) (Reducer, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Method{}
)

// Register adds a method. It panics, like database/sql.Register, if the
// name is taken, the method has no constructor, or an option declaration is
// invalid (see checkParams: no key or doc; a default outside its range or
// of another kind; a key another method declares otherwise).
func Register(m Method) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[m.Name]; dup {
		panic("sparsify: Register called twice for " + m.Name)
	}
	if m.Name == "" || m.New == nil {
		panic(fmt.Sprintf("sparsify: Register: method %q needs a name and a constructor", m.Name))
	}
	if m.Projectable && m.NotProjectable != "" {
		panic(fmt.Sprintf("sparsify: Register %s: Projectable with a reason it is not (NotProjectable)", m.Name))
	}
	if err := checkParams(m, registry); err != nil {
		panic(fmt.Sprintf("sparsify: Register %s: %v", m.Name, err))
	}
	m.Params = slices.Clone(m.Params)
	registry[m.Name] = m
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

// Methods lists the registered methods' declarations, sorted by name.
func Methods() []Method {
	registryMu.RLock()
	defer registryMu.RUnlock()
	ms := make([]Method, 0, len(registry))
	for _, m := range registry {
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
	return ms
}

// Lookup returns the declaration of the method registered under name.
func Lookup(name string) (Method, bool) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	m, ok := registry[name]
	return m, ok
}

// ErrUnknownMethod is wrapped by New's error for a name that is not registered.
var ErrUnknownMethod = errors.New("sparsify: unknown method")

// New builds the reducer registered under name after checking the options
// every method shares: a communicator of at least one rank, a density in
// (0, 1], a non-empty layout of positive tensor sizes and at most
// math.MaxInt32 elements (indices travel as int32); then it resolves
// Options.Params against the method's declarations (Method.Resolve) and runs
// the method's worker-count check. The constructors rely on these checks.
func New(name string, o Options) (Reducer, error) {
	m, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("%w %q; valid names: %s", ErrUnknownMethod, name, strings.Join(Names(), ", "))
	}
	o, err := prepare(m, o)
	if err != nil {
		return nil, err
	}
	return m.New(o)
}

// prepare runs New's checks and returns o with its Params resolved.
func prepare(m Method, o Options) (Options, error) {
	if err := checkOptions(m.Name, o); err != nil {
		return o, err
	}
	p, err := m.Resolve(o.Params)
	if err != nil {
		return o, err
	}
	o.Params = p
	if m.CheckWorkers != nil {
		if err := m.CheckWorkers(o.Comm.Size(), p); err != nil {
			return o, err
		}
	}
	return o, nil
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
	if o.Stream != nil && o.Stream.Device().Kind() != device.CPUKind && o.Ops == nil {
		return fmt.Errorf("sparsify: %s: Options.Stream is on %v but no Ops of that device were given (Options.Ops; cuda.Device.Sparse for a GPU)", name, o.Stream.Device())
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
	// vectors.
	r := m.Residual
	if i := accumulate(r, grad, scale); i >= 0 {
		return nil, fmt.Errorf("sparsify: error-compensated gradient element %d is %v: the gradient diverged (lower the learning rate or clip gradients)", i, r[i])
	}
	return r, nil
}
