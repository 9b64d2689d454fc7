// Package options declares, once, the general options of a training run
// (the keys of run.json's config that are not a sparsifier's own options,
// which the sparsify registry declares): each one's key, its command-line
// flag, the kind of its value, its defaults (per model where they differ),
// its valid values, its doc, whether a resumed run may change it, and
// whether it tells compared runs apart. The trainer's defaults, its
// single-option range checks and resume rules, the command-line flags and
// help of train, train replay, train sweep and train advise, the sweep's
// printed command lines and the reports' page headers and comparisons
// read these declarations instead of keeping lists of their own.
//
// The package is a leaf: it imports nothing of the project.
package options

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Kind is the type of an option's value in train.Config.
type Kind int

const (
	// String options hold a string; with Choices, one of them.
	String Kind = iota + 1
	// Bool options are switches.
	Bool
	// Int options hold an int.
	Int
	// Uint options hold a non-negative integer (the seed).
	Uint
	// Float options hold a finite float64.
	Float
	// Duration options hold a time.Duration.
	Duration
	// IntList options hold a list of ints (a comma-separated flag).
	IntList
	// Values is the sparsifier's own options (each declared by its method,
	// with one flag per option).
	Values
)

// String names the kind as the help text does: "string", "int", ...
func (k Kind) String() string {
	switch k {
	case String:
		return "string"
	case Bool:
		return "bool"
	case Int:
		return "int"
	case Uint:
		return "uint"
	case Float:
		return "float"
	case Duration:
		return "duration"
	case IntList:
		return "list"
	case Values:
		return "values"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Range bounds the values of a numeric option. The zero Range bounds
// nothing.
type Range struct {
	// Min and Max are the bounds; HasMin and HasMax say which exist.
	Min, Max       float64
	HasMin, HasMax bool
	// MinOpen and MaxOpen exclude the bound itself.
	MinOpen, MaxOpen bool
}

// AtLeast is [min, ∞).
func AtLeast(min float64) Range { return Range{Min: min, HasMin: true} }

// Above is (min, ∞).
func Above(min float64) Range { return Range{Min: min, HasMin: true, MinOpen: true} }

// Within is the interval between min and max; bounds is "[]", "[)", "(]"
// or "()", as the interval is written.
func Within(min, max float64, bounds string) Range {
	return Range{Min: min, Max: max, HasMin: true, HasMax: true, MinOpen: bounds[0] == '(', MaxOpen: bounds[1] == ')'}
}

// Contains reports whether x lies in the range (never for NaN).
func (r Range) Contains(x float64) bool {
	if math.IsNaN(x) {
		return false
	}
	if r.HasMin && (x < r.Min || r.MinOpen && x == r.Min) {
		return false
	}
	if r.HasMax && (x > r.Max || r.MaxOpen && x == r.Max) {
		return false
	}
	return true
}

// String writes the range as the messages do: "in [0, 1)", ">= 1", "> 0".
func (r Range) String() string {
	switch {
	case r.HasMin && r.HasMax:
		lo, hi := "[", "]"
		if r.MinOpen {
			lo = "("
		}
		if r.MaxOpen {
			hi = ")"
		}
		return "in " + lo + num(r.Min) + ", " + num(r.Max) + hi
	case r.HasMin && r.MinOpen:
		return "> " + num(r.Min)
	case r.HasMin:
		return ">= " + num(r.Min)
	case r.HasMax && r.MaxOpen:
		return "< " + num(r.Max)
	case r.HasMax:
		return "<= " + num(r.Max)
	}
	return "any number"
}

func num(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// Case is an option's default for one model.
type Case struct {
	Model string
	Value any
}

// Option is one general option.
type Option struct {
	// Key is the option's key in run.json's config (train.Config's JSON
	// name).
	Key string
	// Flag is its command-line flag without the dash; empty: the key with
	// "_" turned into "-".
	Flag string
	// Aliases are older names of the flag that keep working.
	Aliases []string
	// Kind is the type of its value (train.Config's field has it).
	Kind Kind
	// Doc says what the option does, for the help text (which adds the
	// defaults and, for Choices, nothing more: Doc names them).
	Doc string
	// Default is its value when it is not given, for every model without a
	// case of its own in ByModel (nil: the zero value, or decided by the
	// trainer from other options, as Doc says). Values have the Go type of
	// the kind: string, bool, int, uint64, float64, time.Duration, []int.
	Default any
	// ByModel are the defaults that differ per model, in the order the
	// help text lists them.
	ByModel []Case
	// When names another option's value that the option applies to, as
	// "key=value" (e.g. "optimizer=sgd"): its default is filled and its
	// range checked only then.
	When string
	// Range bounds a numeric option's values; Hint follows the range in
	// the message that refuses a value ("(0: no limit)", "; pass e.g.
	// -density 0.01").
	Range Range
	Hint  string
	// Choices are a String option's valid values.
	Choices []string
	// FlagScale converts the flag's value into the configuration's (the
	// configuration holds flag × FlagScale; 0: 1): -net-bandwidth is in
	// Gbit/s, the configuration in bytes/s.
	FlagScale float64
	// Resume tells that a resumed run may set it to another value than the
	// run had (how long it runs, where its data lives, how it reports and
	// checkpoints, what executes it; the learning rate and clipping, with
	// which a run that diverged continues). Every other option decides the
	// training itself and must match.
	Resume bool
	// Incidental tells that the option does not tell compared runs apart
	// (where output goes, how often it reports): a comparison does not list
	// it among the differences.
	Incidental bool
	// WithMethod tells that a page header shows it among the method's
	// options (it qualifies how the method runs).
	WithMethod bool
	// Retired says why an option of earlier versions is no longer set;
	// readers of old runs still know it.
	Retired string
}

// FlagName returns the option's command-line flag, without the dash.
func (o Option) FlagName() string {
	if o.Flag != "" {
		return o.Flag
	}
	return strings.ReplaceAll(o.Key, "_", "-")
}

// Scale is the factor from the flag's value to the configuration's.
func (o Option) Scale() float64 {
	if o.FlagScale == 0 {
		return 1
	}
	return o.FlagScale
}

// DefaultFor returns the option's default for model (ByModel's case, else
// Default; nil: none).
func (o Option) DefaultFor(model string) any {
	for _, c := range o.ByModel {
		if c.Model == model {
			return c.Value
		}
	}
	return o.Default
}

// Applies reports whether the option applies, given the value of the
// option its When names (get returns it as text).
func (o Option) Applies(get func(key string) string) bool {
	if o.When == "" {
		return true
	}
	k, v, _ := strings.Cut(o.When, "=")
	return get(k) == v
}

// CheckNumber returns the message that refuses x, the flag's value
// (shown: as its flag writes it), or "" when x is in the option's range.
func (o Option) CheckNumber(x float64, shown string) string {
	if o.Range.Contains(x) {
		return ""
	}
	return fmt.Sprintf("-%s %s must be %s%s", o.FlagName(), shown, o.Range, o.Hint)
}

// CheckChoice returns the message that refuses s, or "" when s is one of
// the option's Choices (or it has none).
func (o Option) CheckChoice(s string) string {
	if len(o.Choices) == 0 {
		return ""
	}
	for _, c := range o.Choices {
		if c == s {
			return ""
		}
	}
	return fmt.Sprintf("-%s %q: use %s", o.FlagName(), s, orList(o.Choices))
}

// orList writes "a, b or c".
func orList(s []string) string {
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// Usage is the option's help text: its doc and its defaults.
func (o Option) Usage() string {
	u := o.Doc
	if d := o.defaultText(); d != "" {
		u += " (default " + d + ")"
	}
	return u
}

// defaultText writes the defaults: "0.1", "resnet18 0.05, lstm 20, ncf
// 0.001", "resnet18 0.9, else 0"; "" when there is nothing to say (no
// default, false, an empty string).
func (o Option) defaultText() string {
	var parts []string
	for _, c := range o.ByModel {
		if c.Model == "recorded" { // replays: their own help says it
			continue
		}
		parts = append(parts, c.Model+" "+Format(c.Value))
	}
	if o.Default == nil {
		return strings.Join(parts, ", ")
	}
	d := Format(o.Default)
	if o.Kind == Float && o.FlagScale != 0 {
		d = Format(o.Default.(float64) / o.FlagScale)
	}
	switch {
	case len(parts) > 0:
		return strings.Join(parts, ", ") + ", else " + d
	case d == "" || d == "false" || (d == "0" && o.Kind != Float && o.Kind != Uint):
		return ""
	}
	return d
}

// Format writes a value of an option as its flag takes it: "0.05", "42",
// "150,200", "30m0s"; an empty list is "none".
func Format(v any) string {
	switch x := v.(type) {
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case time.Duration:
		return x.String()
	case []int:
		if len(x) == 0 {
			return "none"
		}
		s := make([]string, len(x))
		for i, n := range x {
			s[i] = strconv.Itoa(n)
		}
		return strings.Join(s, ",")
	}
	return fmt.Sprint(v)
}

// The models' names in ByModel.
const (
	resnet18 = "resnet18"
	lstm     = "lstm"
	ncf      = "ncf"
	recorded = "recorded" // a replay of recorded gradients
)

// All are the general options, in run.json's order.
var All = []Option{
	{Key: "model", Kind: String, Default: "ncf", Doc: "model: resnet18, lstm or ncf"},
	{Key: "dataset", Kind: String, Doc: "data set: cifar10|cifar100 (resnet18), wikitext2 (lstm), ml-100k|ml-1m|ml-20m (ncf); default the model's first"},
	{Key: "data_dir", Kind: String, Resume: true, Incidental: true, Doc: "folder holding the data sets (default $TRAIN_DATA_DIR, else ./data)"},
	{Key: "download", Kind: Bool, Resume: true, Incidental: true, Doc: "download the data set into -data-dir first (verified by checksum)"},
	{Key: "preset", Flag: "model-size", Aliases: []string{"preset"}, Kind: String,
		Doc: "model size: resnet18 default; lstm small (2×200) or default (3×650); ncf paper (8 factors) or default (MLPerf, 64 factors; ncf's default on ml-20m, paper on the others)"},
	{Key: "sparsifier", Kind: String, Default: "dense", Doc: "gradient sparsifier (dense: none; each method's own options are listed below)"},
	{Key: "density", Kind: Float, Range: Within(0, 1, "(]"), Hint: "; pass e.g. -density 0.01",
		Doc: "setup density ρ in (0, 1]: fraction of the gradient each worker sends (default: the paper's for lags (0.001 resnet18, 0.004 lstm), dragonn and dgc (0.001); else 0.01)"},
	{Key: "method_options", Kind: Values},
	{Key: "pipeline", Kind: String, Default: "auto", Choices: []string{"auto", "on", "off"}, WithMethod: true,
		Doc: "lags pipelining with the backward pass: auto (on for lags unless -clip-at local), on, off"},
	{Key: "clip_at", Kind: String, Default: "auto", Choices: []string{"auto", "local", "aggregated"},
		Doc: "where -clip clips: local (each worker's gradient before error feedback), aggregated (the averaged gradient; keeps lags pipelining), auto (aggregated for lags, else local)"},
	{Key: "workers", Kind: Int, Default: 1, Range: AtLeast(1), Doc: "simulated workers in this process (under mpirun: one worker per process)"},
	{Key: "epochs", Kind: Int, Resume: true, Range: AtLeast(1), ByModel: []Case{{resnet18, 200}, {lstm, 90}, {ncf, 20}, {recorded, 1}}, Doc: "epochs"},
	{Key: "steps", Kind: Int, Resume: true, Range: AtLeast(0), Hint: " (0: no limit)", Doc: "stop after this many iterations (0: no limit)"},
	{Key: "max_time", Kind: Duration, Resume: true, Range: AtLeast(0), Hint: " (0: no limit)",
		Doc: "stop after this much wall time, e.g. 30m, with a final evaluation and checkpoint (0: no limit)"},
	{Key: "batch", Kind: Int, Range: AtLeast(1), ByModel: []Case{{resnet18, 32}, {lstm, 32}, {ncf, 256}, {recorded, 1}},
		Doc: "per-worker batch size (images, sequences, ratings)"},
	{Key: "eval_batch", Kind: Int, Range: AtLeast(1), ByModel: []Case{{resnet18, 250}, {lstm, 10}, {ncf, 64}, {recorded, 1}},
		Doc: "per-worker evaluation batch (images, sequences, users)"},
	{Key: "lr", Kind: Float, Resume: true, Range: Above(0), ByModel: []Case{{resnet18, 0.05}, {lstm, 20.0}, {ncf, 0.001}, {recorded, 0.0}},
		Doc: "learning rate"},
	{Key: "seed", Kind: Uint, Default: uint64(42), Doc: "random seed, 0 included (initialisation, shuffling, augmentation, negatives, dropout)"},
	{Key: "optimizer", Kind: String, ByModel: []Case{{resnet18, "sgd"}, {lstm, "sgd"}, {ncf, "adam"}, {recorded, "none"}},
		Doc: "sgd (PyTorch semantics: momentum, weight decay) or adam"},
	{Key: "momentum", Kind: Float, When: "optimizer=sgd", Range: Within(0, 1, "[)"), ByModel: []Case{{resnet18, 0.9}}, Default: 0.0,
		Doc: "SGD momentum in [0, 1)"},
	{Key: "nesterov", Kind: Bool, Doc: "SGD with Nesterov momentum (PyTorch's nesterov=True)"},
	{Key: "weight_decay", Flag: "wd", Kind: Float, When: "optimizer=sgd", Range: AtLeast(0), ByModel: []Case{{resnet18, 1e-4}}, Default: 0.0,
		Doc: "SGD weight decay (BatchNorm .bnN. parameters exempt)"},
	{Key: "beta1", Kind: Float, When: "optimizer=adam", Range: Within(0, 1, "[)"), Default: 0.9, Doc: "Adam β1 in [0, 1)"},
	{Key: "beta2", Kind: Float, When: "optimizer=adam", Range: Within(0, 1, "[)"), Default: 0.999, Doc: "Adam β2 in [0, 1)"},
	{Key: "eps", Kind: Float, When: "optimizer=adam", Range: Above(0), Default: 1e-8, Doc: "Adam ε > 0"},
	{Key: "warmup_epochs", Kind: Float, Range: AtLeast(0),
		Doc: "step: linear warm-up length in epochs (default 0); onecycle: length of the rise (default 30% of the run)"},
	{Key: "decay_epochs", Kind: IntList, When: "lr_schedule=step", Range: AtLeast(1), Hint: " (every epoch listed)",
		ByModel: []Case{{resnet18, []int{150}}, {lstm, []int{45, 80}}}, Default: []int{},
		Doc: "comma-separated epochs where the learning rate is multiplied by -decay-factor (\"none\" for none)"},
	{Key: "decay_factor", Kind: Float, When: "lr_schedule=step", Range: Within(0, 1, "(]"), Default: 0.1, Doc: "step decay factor in (0, 1]"},
	{Key: "lr_schedule", Kind: String, Default: "step", Choices: []string{"step", "onecycle"},
		Doc: "step (warm-up, then step decay) or onecycle (one-cycle policy peaking at -lr over the whole run, as PyTorch's OneCycleLR)"},
	{Key: "clip", Kind: Float, Resume: true, Range: AtLeast(0), Hint: " (0: off)", ByModel: []Case{{lstm, 0.4}}, Default: 0.0,
		Doc: "clip the gradient norm (see -clip-at); 0: off"},
	{Key: "no_augment", Kind: Bool, Doc: "turn off CIFAR crops and flips"},
	{Key: "label_smoothing", Kind: Float, Range: Within(0, 1, "[)"), Hint: " (0.1 is usual)",
		Doc: "label smoothing ε in [0, 1) of the training loss (resnet18, lstm; 0: none; evaluations report the plain loss)"},
	{Key: "out", Kind: String, Incidental: true, Doc: "run directory to write (run.json, metrics.jsonl, checkpoints/, report.html)"},
	{Key: "resume", Kind: String, Incidental: true, Doc: "continue the run in this directory from its last checkpoint"},
	{Key: "device", Kind: String, Resume: true, Default: "cpu", Choices: []string{"cpu", "cuda"},
		Doc: "cpu or cuda (NVIDIA GPUs; in-process workers share the GPUs, each with a stream of its own)"},
	{Key: "comm", Kind: String, Resume: true, Default: "auto", Choices: []string{"auto", "local", "mpi", "nccl"},
		Doc: "communication backend: local (in-process workers), mpi (under mpirun), nccl (-device cuda, one GPU per worker), auto (nccl when every worker has a GPU of its own, else local or mpi; on a GPU those stage device buffers through host memory)"},
	{Key: "tf32", Kind: Bool, Resume: true, Doc: "GPU: allow TF32 tensor-core math in matrix products and convolutions (faster, about 10-bit mantissa)"},
	{Key: "deterministic", Kind: Bool, Resume: true,
		Doc: "GPU: only deterministic cuDNN convolution algorithms (bit-reproducible runs, slower); otherwise the fastest measured per shape"},
	{Key: "net_latency", Kind: Duration, Range: AtLeast(0),
		Doc: "emulated network latency per message, e.g. 50us (with -net-bandwidth; simulated workers only)"},
	{Key: "net_bandwidth", Kind: Float, Range: AtLeast(0), FlagScale: 1e9 / 8, Hint: " Gbit/s",
		Doc: "emulated network bandwidth in Gbit/s, e.g. 10 (with -net-latency)"},
	{Key: "log_every", Kind: Int, Resume: true, Incidental: true, Default: 1, Range: AtLeast(1), Doc: "write a step record every this many steps"},
	{Key: "eval_every", Kind: Int, Resume: true, Incidental: true, Range: AtLeast(0), Hint: " (0: every epoch only)",
		Doc: "also evaluate every this many steps (0: every epoch only)"},
	{Key: "max_eval_batches", Kind: Int, Resume: true, Incidental: true, Range: AtLeast(0), Hint: " (0: the whole split)",
		Doc: "evaluate on at most this many batches per worker (0: the whole split)"},
	{Key: "blas", Kind: String, Resume: true, Default: "auto", Choices: []string{"auto", "openblas", "gonum"},
		Doc: "matrix products: auto (OpenBLAS if installed), openblas or gonum"},
	{Key: "blas_threads", Kind: Int, Resume: true, Incidental: true, Range: AtLeast(0), Hint: " (0: cores / simulated workers)",
		Doc: "OpenBLAS and oneDNN threads (0: cores / simulated workers)"},
	{Key: "kernels", Kind: String, Resume: true, Default: "auto", Choices: []string{"auto", "onednn", "im2col"},
		Doc: "CPU convolutions and batch norms: auto (oneDNN if installed), onednn (Debian: apt-get install libdnnl2) or im2col"},
	{Key: "executors", Kind: Int, Resume: true, Incidental: true, Range: AtLeast(0), Hint: " (0: one per core)",
		Doc: "models the simulated workers of this process take turns on, on the CPU (0: one per core, at most -workers); they share one copy of the parameters either way"},
	{Key: "quiet", Kind: Bool, Resume: true, Incidental: true, Doc: "no progress output"},
	{Key: "checkpoint_every", Kind: Int, Resume: true, Incidental: true, Range: AtLeast(0),
		Hint: " (steps between checkpoints; 0: at the end of every epoch only)",
		Doc:  "also write a checkpoint every this many steps (0: at the end of every epoch only, and where the run stops)"},
	{Key: "check_every", Kind: Int, Resume: true, Incidental: true, Range: AtLeast(0), Hint: " (0: off)",
		Doc: "compare a hash of the workers' parameters every this many steps and stop if they differ (0: only at checkpoints)"},
	{Key: "gradients", Kind: String, Doc: "folder of recorded gradients (python/sparsegrad_record.py, or train -record-gradients)"},
	{Key: "record_gradients", Kind: String, Incidental: true,
		Doc: "record every worker's gradient of every step into this folder (safetensors + manifest.json, for train replay); needs -pipeline off with lags"},
	{Key: "phase_times", Incidental: true, Retired: "the phases' times are always recorded now"},
}

var byKey, byFlag = func() (map[string]Option, map[string]Option) {
	keys := make(map[string]Option, len(All))
	flags := make(map[string]Option, len(All))
	for _, o := range All {
		if _, dup := keys[o.Key]; dup {
			panic("options: " + o.Key + " declared twice")
		}
		keys[o.Key] = o
		if o.Retired != "" || o.Kind == Values {
			continue
		}
		for _, f := range append([]string{o.FlagName()}, o.Aliases...) {
			if _, dup := flags[f]; dup {
				panic("options: flag -" + f + " declared twice")
			}
			flags[f] = o
		}
	}
	return keys, flags
}()

// Lookup returns the declaration of the general option key.
func Lookup(key string) (Option, bool) {
	o, ok := byKey[key]
	return o, ok
}

// ByFlag returns the option whose flag (or one of its aliases) is name,
// without the dash.
func ByFlag(name string) (Option, bool) {
	o, ok := byFlag[name]
	return o, ok
}

// General reports whether key is a general option shown apart from the
// method's options (false for a method's own option, or a general option
// shown with them).
func General(key string) bool {
	o, ok := byKey[key]
	return ok && !o.WithMethod
}
