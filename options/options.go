// Package options declares, once, the general options of a training run
// (the keys of run.json's config that are not a sparsifier's own options,
// which the sparsify registry declares): each one's key, its command-line
// flag, whether a resumed run may change it, and whether it tells compared
// runs apart. The trainer's resume rules and the reports' page headers and
// comparisons read these declarations instead of keeping lists of their
// own.
//
// The package is a leaf: it imports nothing of the project.
package options

import "strings"

// Option is one general option.
type Option struct {
	// Key is the option's key in run.json's config (train.Config's JSON
	// name).
	Key string
	// Flag is its command-line flag without the dash; empty: the key with
	// "_" turned into "-".
	Flag string
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

// All are the general options, in run.json's order.
var All = []Option{
	{Key: "model"},
	{Key: "dataset"},
	{Key: "data_dir", Resume: true, Incidental: true},
	{Key: "download", Resume: true, Incidental: true},
	{Key: "preset"},
	{Key: "sparsifier"},
	{Key: "density"},
	{Key: "method_options"},
	{Key: "pipeline", WithMethod: true},
	{Key: "clip_at"},
	{Key: "workers"},
	{Key: "epochs", Resume: true},
	{Key: "steps", Resume: true},
	{Key: "max_time", Resume: true},
	{Key: "batch"},
	{Key: "eval_batch"},
	{Key: "lr", Resume: true},
	{Key: "seed"},
	{Key: "optimizer"},
	{Key: "momentum"},
	{Key: "nesterov"},
	{Key: "weight_decay", Flag: "wd"},
	{Key: "beta1"},
	{Key: "beta2"},
	{Key: "eps"},
	{Key: "warmup_epochs"},
	{Key: "decay_epochs"},
	{Key: "decay_factor"},
	{Key: "lr_schedule"},
	{Key: "clip", Resume: true},
	{Key: "no_augment"},
	{Key: "label_smoothing"},
	{Key: "out", Incidental: true},
	{Key: "resume", Incidental: true},
	{Key: "device", Resume: true},
	{Key: "comm", Resume: true},
	{Key: "tf32", Resume: true},
	{Key: "deterministic", Resume: true},
	{Key: "net_latency"},
	{Key: "net_bandwidth"},
	{Key: "log_every", Resume: true, Incidental: true},
	{Key: "eval_every", Resume: true, Incidental: true},
	{Key: "max_eval_batches", Resume: true, Incidental: true},
	{Key: "blas", Resume: true},
	{Key: "blas_threads", Resume: true, Incidental: true},
	{Key: "kernels", Resume: true},
	{Key: "executors", Resume: true, Incidental: true},
	{Key: "quiet", Resume: true, Incidental: true},
	{Key: "checkpoint_every", Resume: true, Incidental: true},
	{Key: "check_every", Resume: true, Incidental: true},
	{Key: "gradients"},
	{Key: "record_gradients", Incidental: true},
	{Key: "phase_times", Incidental: true, Retired: "the phases' times are always recorded now"},
}

var byKey = func() map[string]Option {
	m := make(map[string]Option, len(All))
	for _, o := range All {
		if _, dup := m[o.Key]; dup {
			panic("options: " + o.Key + " declared twice")
		}
		m[o.Key] = o
	}
	return m
}()

// Lookup returns the declaration of the general option key.
func Lookup(key string) (Option, bool) {
	o, ok := byKey[key]
	return o, ok
}

// General reports whether key is a general option shown apart from the
// method's options (false for a method's own option, or a general option
// shown with them).
func General(key string) bool {
	o, ok := byKey[key]
	return ok && !o.WithMethod
}
