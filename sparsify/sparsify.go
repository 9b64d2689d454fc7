package sparsify

import (
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
	"github.com/sparsegrad/sparsegrad/options"
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
	// Density is the setup density ρ the reducer was built with, for
	// every method and every call: a method's own schedule (DGC's density
	// warm-up, LAGS' per-group densities, a dense warm-up) shows in
	// Selected and ActualDensity, not here.
	Density float64
	// ActualDensity is the number of distinct indices whose values crossed
	// the wire (the union over workers of what the call's exchanges
	// carried) divided by N, for every method. What is sent dense counts
	// whole: dense reduction and a dense warm-up give 1, and DGC's and
	// DRAGONN's dense tensors and LAGS' groups with k = m count every
	// element; Ok-Topk and TopkDSA count the indices of the reduced region
	// sums they gather (N when TopkDSA gathers them densely), SparDL the
	// indices of its final exchange's result, gTop-k the k of its global
	// result and CLT-k the leader's k, which every worker sends.
	ActualDensity float64
	// Selected is the number of indices this worker selected.
	Selected int
	// SelectedPerWorker is the number of indices each rank selected, where the
	// method exchanges that information (nil otherwise).
	SelectedPerWorker []int
	// ErrorNorm is the norm of what this worker holds back after the call
	// (its error-feedback memory): ‖residual‖₂ for every method but DGC
	// with momentum correction, whose residual also carries the momentum
	// m·u; its ErrorNorm is ‖v‖₂, the masked velocity alone.
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

// Options configure a reducer.
type Options struct {
	// Density is the fraction ρ ∈ (0, 1] of the N elements to send.
	Density float64
	// Layout describes the flat gradient.
	Layout Layout
	// Comm connects the workers. When it counts its calls (a
	// comm.Counter, as the trainer's), the reducer's traffic is read from
	// it; otherwise the reducer counts through a Counter of its own.
	Comm comm.Communicator
	// Seed seeds the methods that draw random numbers; it must be the same on
	// every rank.
	Seed uint64
	// Network is the network the run declares or emulates (the trainer's
	// -net-latency and -net-bandwidth), which LAGS' adaptive density models.
	// The zero value declares none: LAGS then measures the network it runs
	// on (see LAGS). Every rank must pass the same value.
	Network netmodel.Network
	// Stream is the stream of the device whose memory the reducer's
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

// Method declares one method for the registry: everything known about it,
// in one place, its file. The trainer's flags, checks, defaults and notes,
// the reports and the advisor read the declarations; none of them names a
// method.
type Method struct {
	// Name is the registry name ("topk", "lags", ...).
	Name string
	// New builds the method's core for one worker. New (the package
	// function) calls it after the checks every method shares (see New),
	// with Env.Options' Params resolved: every declared option present,
	// valid and of its Kind's type. The frame (Reducer) wraps the core.
	New func(e *Env) (Core, error)
	// Doc says in a paragraph what the method is, after which paper and
	// code, and how it deviates from them (the package documentation's
	// list of methods is generated from it).
	Doc string
	// Params declare the method's options (in package options' terms; the
	// flag is the key with "_" turned into "-"), in the order documentation
	// lists them. Methods that declare an option of the same key (each with
	// its own default) share it: one option, one flag, for all of them.
	Params []options.Option
	// DenseWarmup makes the frame all-reduce the whole gradient densely for
	// the first dense_warmup calls (an option the method declares with
	// DenseWarmupParam; PyTorch DDP's allreduce_first_k_steps, Ok-Topk's 512
	// iterations) before its core's first call: out = the sum divided by
	// the number of workers, residual 0. The core counts its own calls from
	// Env.Calls, which counts the warm-up's too.
	DenseWarmup bool
	// CheckWorkers, when set, refuses worker counts the method cannot run
	// on with the resolved options p (gTop-k's power of two, SparDL's teams
	// that must divide the workers). New runs it with the communicator's
	// size; a trainer can run it before starting any worker.
	CheckWorkers func(n int, p Values) error
	// Check, when set, refuses runs the method cannot serve beyond its
	// options and worker counts (LAGS' adaptive density in a replay, which
	// runs no backward pass to profile). The trainer runs it before
	// starting any worker, with the Run's Layout and steps unknown.
	Check func(r Run) error
	// Density, when set, is the density the method's paper trains a kind
	// of model with, where the project follows it (0: DefaultDensity). The
	// trainer's default -density.
	Density func(k ModelKind) float64
	// Notes, when set, says what a reader of a run's results must know
	// about the method in that run: that it does nothing, or less than its
	// name promises (every tensor below a size cut-off, a warm-up as long
	// as the run, no momentum to correct). The trainer records them, each
	// after the method's name (RunNotes).
	Notes func(r Run) []string
	// CorrectsMomentum tells that the method applies SGD momentum itself
	// before selecting (DGC's momentum correction, Options.Momentum): its
	// output already has the momentum applied, so a trainer passes its
	// momentum in Options.Momentum and applies momentum to the weight
	// decay only.
	CorrectsMomentum bool
	// ScaledClip tells that the method's local gradient clipping divides
	// the threshold by √n for n workers (DGC's §3.2: each worker's share of
	// the global threshold if all had the same gradient distribution).
	ScaledClip bool
	// Projectable tells that the method's measured traffic can be carried
	// to other worker counts and networks: every worker's payload per call
	// and the number of calls per iteration do not depend on the worker
	// count, which is what comm/netmodel's Project assumes. When it is
	// false, NotProjectable says why (the reports print it beside the
	// projection chart that leaves the method out).
	Projectable    bool
	NotProjectable string
	// TopKOfAcc tells that the core's first work on acc in every call
	// after a dense warm-up is the top-k of the whole of it, through
	// Env.topKAcc, before anything writes acc: on a GPU a trainer may then
	// have error feedback's accumulation count the selection's first radix
	// round (Reducer.Histogram), one pass over acc fewer. A core that
	// declares it and does not select so fails the call.
	TopKOfAcc bool
	// Pipelined tells that the method's core reduces the gradient in
	// groups (Grouped) whose reduction can start while the backward pass
	// still runs: a trainer pipelines it by default, and the advisor hides
	// its selection and communication behind the backward pass.
	Pipelined bool
	// Kernels are the method's own GPU operations (device.Kernel: CUDA C
	// and the same pass in Go), run through Ops.Run; listed so that tests
	// compile and emulate every declared kernel.
	Kernels []*device.Kernel
	// Advice is what the advisor (package advise) needs to predict the
	// method's iteration; nil: the advisor has no model of it and says so.
	Advice *Advice
}

// DefaultDensity is the density of a method that declares none for a kind
// of model.
const DefaultDensity = 0.01

// DefaultDensityFor is the method's default density for a kind of model:
// its paper's (Method.Density) or DefaultDensity.
func (m Method) DefaultDensityFor(k ModelKind) float64 {
	if m.Density != nil {
		if d := m.Density(k); d > 0 {
			return d
		}
	}
	return DefaultDensity
}

// Run is what a method's checks and notes know of the run it is
// configured for (Method.Check, Method.Notes, Method.RunNotes).
type Run struct {
	// Params are the method's resolved options, Density the setup density.
	Params  Values
	Density float64
	// Model names the model and Layout its parameters (empty in Check,
	// before the model is built).
	Model  string
	Layout Layout
	// Steps is the run's number of steps and StepsPerEpoch an epoch's (0:
	// not known; both 0 in Check).
	Steps, StepsPerEpoch int
	// Replay tells that the gradients are a recording's, replayed: no
	// backward pass runs and nothing is updated.
	Replay bool
	// Optimizer is the trainer's optimizer ("sgd", "adam", "none") and
	// Momentum the SGD momentum the method may correct (a replay's: the
	// recorded training's, 0 when it had none).
	Optimizer string
	Momentum  float64
}

// RunNotes are the notes of the method in run r: the frame's (a dense
// warm-up as long as the run) and the method's own (Notes).
func (m Method) RunNotes(r Run) []string {
	var notes []string
	if p, ok := m.Param(denseWarmupName); ok {
		if wu := r.Params.Int(denseWarmupName); wu >= r.Steps {
			notes = append(notes, fmt.Sprintf("%s: -%s %d is at least the run's %d steps: every step is a dense all-reduce and nothing is sparsified; lower -%s (the method's default is %v)",
				m.Name, p.FlagName(), wu, r.Steps, p.FlagName(), p.Default))
		}
	}
	if m.Notes != nil {
		for _, n := range m.Notes(r) {
			notes = append(notes, m.Name+": "+n)
		}
	}
	return notes
}

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
	if _, ok := m.Param(denseWarmupName); m.DenseWarmup && !ok {
		panic(fmt.Sprintf("sparsify: Register %s: DenseWarmup without the option %s (DenseWarmupParam)", m.Name, denseWarmupName))
	}
	m.Params = slices.Clone(m.Params)
	if _, ok := m.Param(minCompressName); !ok && m.Name != "dense" {
		m.Params = append(m.Params, minCompressParam) // every method's (cutoff.go)
	}
	if err := checkParams(m, registry); err != nil {
		panic(fmt.Sprintf("sparsify: Register %s: %v", m.Name, err))
	}
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

// New builds the reducer registered under name: it checks the options
// every method shares (a communicator of at least one rank, a density in
// (0, 1], a non-empty layout of positive tensor sizes and at most
// math.MaxInt32 elements, as indices travel as int32), resolves
// Options.Params against the method's declarations (Method.Resolve), runs
// the method's worker-count check, builds the method's core (Method.New)
// and frames it (Reducer). The cores rely on these checks.
func New(name string, o Options) (*Reducer, error) {
	m, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("%w %q; valid names: %s", ErrUnknownMethod, name, strings.Join(Names(), ", "))
	}
	if err := checkOptions(m.Name, o); err != nil {
		return nil, err
	}
	p, err := m.Resolve(o.Params)
	if err != nil {
		return nil, err
	}
	o.Params = p
	if m.CheckWorkers != nil {
		if err := m.CheckWorkers(o.Comm.Size(), p); err != nil {
			return nil, fmt.Errorf("sparsify: %s: %w", m.Name, err)
		}
	}
	e := newEnv(o)
	core, err := withCutoff(m, e, m.New)
	if err != nil {
		return nil, fmt.Errorf("sparsify: %s: %w", m.Name, err)
	}
	return newReducer(m, e, core)
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
