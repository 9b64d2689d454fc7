package options

// All are the general options, in run.json's order (train.Config's fields
// are generated from them: go generate ./train). The models' own defaults
// (epochs, batch, learning rate, optimizer, ...) are declared by each
// model (package train's workloads); the lists of models, data sets and
// sizes in the help of -model, -dataset and -model-size derive from them.
var All = []Option{
	{Key: "model", Kind: String, Default: "ncf", Doc: "model"},
	{Key: "dataset", Kind: String, Doc: "data set (the model's first by default)"},
	{Key: "data_dir", Kind: String, Resume: true, Incidental: true, Doc: "folder holding the data sets (default $TRAIN_DATA_DIR, else ./data)"},
	{Key: "download", Kind: Bool, Resume: true, Incidental: true, Doc: "download the data set into -data-dir first (verified by checksum)"},
	{Key: "gradients", Kind: String, Omit: true, Doc: "folder of recorded gradients (python/sparsegrad_record.py, or train -record-gradients)"},
	{Key: "record_gradients", Kind: String, Omit: true, Incidental: true,
		Doc: "record every worker's gradient of every step into this folder (safetensors + manifest.json, for train replay); the reduction then starts after the backward pass (-overlap auto is off)"},
	{Key: "preset", Flag: "model-size", Aliases: []string{"preset"}, Kind: String, Doc: "model size"},
	{Key: "sparsifier", Kind: String, Default: "dense", Doc: "gradient sparsifier (dense: none; each method's own options are listed below)"},
	{Key: "density", Kind: Float, Optional: true, Range: Within(0, 1, "(]"), Hint: "; pass e.g. -density 0.01",
		Doc: "setup density ρ in (0, 1]: fraction of the gradient each worker sends (default: the paper's for lags (0.001 resnet18, 0.004 lstm), dragonn and dgc (0.001); else 0.01)"},
	{Key: "method_options", Kind: ValueMap, Omit: true},
	{Key: "pipeline", Flag: "overlap", Aliases: []string{"pipeline"}, Kind: String, Default: "auto", Choices: []string{"auto", "on", "off"}, WithMethod: true,
		Doc: "overlap the reduction with the backward pass: start each group as soon as its gradients are final (dense: DDP's buckets, -bucket-mb; lags: its merge groups; the other methods select over the whole gradient and cannot start before the backward pass ends): auto (on for dense and lags unless -clip-at local or -record-gradients), on, off (after the backward pass; the same losses)"},
	{Key: "clip_at", Kind: String, Default: "auto", Choices: []string{"auto", "local", "aggregated"},
		Doc: "where -clip clips: local (each worker's gradient before error feedback), aggregated (the averaged gradient; keeps lags pipelining), auto (aggregated for the methods that overlap, dense and lags, as DDP users and the LAGS reference clip; else local)"},
	{Key: "workers", Kind: Int, Optional: true, Default: 1, Range: AtLeast(1), Doc: "simulated workers in this process (under mpirun: one worker per process)"},
	{Key: "epochs", Kind: Int, Optional: true, Resume: true, Range: AtLeast(1), Doc: "epochs"},
	{Key: "steps", Kind: Int, Resume: true, Range: AtLeast(0), Zero: "no limit", Doc: "stop after this many iterations"},
	{Key: "max_time", Kind: Duration, Resume: true, Range: AtLeast(0), Zero: "no limit",
		Doc: "stop after this much wall time, e.g. 30m, with a final evaluation and checkpoint"},
	{Key: "batch", Kind: Int, Optional: true, Range: AtLeast(1), Doc: "per-worker batch size (images, sequences, ratings)"},
	{Key: "eval_batch", Kind: Int, Optional: true, Range: AtLeast(1), Doc: "per-worker evaluation batch (images, sequences, users)"},
	{Key: "lr", Kind: Float, Optional: true, Resume: true, Range: Above(0), Doc: "learning rate"},
	{Key: "seed", Kind: Uint, Optional: true, Default: uint64(42), Doc: "random seed, 0 included (initialisation, shuffling, augmentation, negatives, dropout)"},
	{Key: "optimizer", Kind: String, Doc: "sgd (PyTorch semantics: momentum, weight decay) or adam"},
	{Key: "momentum", Kind: Float, Optional: true, When: "optimizer=sgd", Range: Within(0, 1, "[)"), Default: 0.0, Doc: "SGD momentum in [0, 1)"},
	{Key: "nesterov", Kind: Bool, Omit: true, Doc: "SGD with Nesterov momentum (PyTorch's nesterov=True)"},
	{Key: "weight_decay", Flag: "wd", Kind: Float, Optional: true, When: "optimizer=sgd", Range: AtLeast(0), Default: 0.0,
		Doc: "SGD weight decay (BatchNorm .bnN. parameters exempt)"},
	{Key: "beta1", Kind: Float, Optional: true, When: "optimizer=adam", Range: Within(0, 1, "[)"), Default: 0.9, Doc: "Adam β1 in [0, 1)"},
	{Key: "beta2", Kind: Float, Optional: true, When: "optimizer=adam", Range: Within(0, 1, "[)"), Default: 0.999, Doc: "Adam β2 in [0, 1)"},
	{Key: "eps", Kind: Float, Optional: true, When: "optimizer=adam", Range: Above(0), Default: 1e-8, Doc: "Adam ε > 0"},
	{Key: "warmup_epochs", Kind: Float, Range: AtLeast(0),
		Doc: "step: linear warm-up length in epochs (default 0); onecycle: length of the rise (default 30% of the run)"},
	{Key: "decay_epochs", Kind: IntList, When: "lr_schedule=step", Range: AtLeast(1), Hint: " (every epoch listed)", Default: []int{},
		Doc: "comma-separated epochs where the learning rate is multiplied by -decay-factor (\"none\" for none)"},
	{Key: "decay_factor", Kind: Float, Optional: true, When: "lr_schedule=step", Range: Within(0, 1, "(]"), Default: 0.1, Doc: "step decay factor in (0, 1]"},
	{Key: "lr_schedule", Kind: String, Default: "step", Choices: []string{"step", "onecycle"},
		Doc: "step (warm-up, then step decay) or onecycle (one-cycle policy peaking at -lr over the whole run, as PyTorch's OneCycleLR)"},
	{Key: "clip", Kind: Float, Optional: true, Resume: true, Range: AtLeast(0), Zero: "off", Default: 0.0, Doc: "clip the gradient norm (see -clip-at)"},
	{Key: "feedback_lr", Kind: Bool, Omit: true,
		Doc: "error feedback keeps learning-rate-scaled gradients (DEFT's, MiCRO's and LAGS' Algorithm 1: what was held back keeps its weight when the learning rate changes) instead of raw ones (the default, as the authors' code does)"},
	{Key: "no_augment", Kind: Bool, Omit: true, Doc: "turn off CIFAR crops and flips"},
	{Key: "label_smoothing", Kind: Float, Omit: true, Range: Within(0, 1, "[)"), Zero: "none", Hint: " (0.1 is usual)",
		Doc: "label smoothing ε in [0, 1) of a classifier's training loss (evaluations report the plain loss)"},
	{Key: "out", Kind: String, Incidental: true, Doc: "run directory to write (run.json, metrics.jsonl, checkpoints/, report.html)"},
	{Key: "resume", Kind: String, Omit: true, Incidental: true, Doc: "continue the run in this directory from its last checkpoint"},
	{Key: "device", Kind: String, Resume: true, Default: "cpu", Choices: []string{"cpu", "cuda"},
		Doc: "cpu or cuda (NVIDIA GPUs; in-process workers share the GPUs, each with a stream of its own)"},
	{Key: "comm", Kind: String, Omit: true, Resume: true, Default: "auto", Choices: []string{"auto", "local", "mpi", "nccl"},
		Doc: "communication backend: local (in-process workers), mpi (under mpirun), nccl (-device cuda, one GPU per worker), auto (nccl when every worker has a GPU of its own, else local or mpi; on a GPU, local reduces in device memory where the workers share one GPU, and mpi, or local across GPUs, stages device buffers through host memory)"},
	{Key: "tf32", Kind: Bool, Omit: true, Resume: true, Doc: "GPU: allow TF32 tensor-core math in matrix products and convolutions (faster, about 10-bit mantissa)"},
	{Key: "deterministic", Kind: Bool, Omit: true, Resume: true,
		Doc: "GPU: only deterministic cuDNN convolution algorithms (bit-reproducible runs, slower); otherwise the fastest measured per shape"},
	{Key: "net_latency", Kind: Duration, Range: AtLeast(0),
		Doc: "emulated network latency per message, e.g. 50us (with -net-bandwidth; between simulated workers, mpirun's processes on one machine, or GPUs over NCCL)"},
	{Key: "net_bandwidth", Kind: Float, Range: AtLeast(0), FlagScale: 1e9 / 8, Hint: " Gbit/s",
		Doc: "emulated network bandwidth in Gbit/s, e.g. 10 (with -net-latency)"},
	{Key: "log_every", Kind: Int, Optional: true, Resume: true, Incidental: true, Default: 1, Range: AtLeast(1), Doc: "write a step record every this many steps"},
	{Key: "eval_every", Kind: Int, Resume: true, Incidental: true, Range: AtLeast(0), Zero: "every epoch only", Doc: "also evaluate every this many steps"},
	{Key: "max_eval_batches", Kind: Int, Omit: true, Resume: true, Incidental: true, Range: AtLeast(0), Zero: "the whole split",
		Doc: "evaluate on at most this many batches per worker"},
	{Key: "blas", Kind: String, Resume: true, Default: "auto", Choices: []string{"auto", "openblas", "gonum"},
		Doc: "matrix products: auto (OpenBLAS if installed), openblas or gonum"},
	{Key: "blas_threads", Kind: Int, Resume: true, Incidental: true, Range: AtLeast(0), Zero: "cores / simulated workers", Doc: "OpenBLAS and oneDNN threads"},
	{Key: "kernels", Kind: String, Omit: true, Resume: true, Default: "auto", Choices: []string{"auto", "onednn", "im2col"},
		Doc: "CPU convolutions and batch norms: auto (oneDNN if installed), onednn (Debian: apt-get install libdnnl2) or im2col"},
	{Key: "executors", Kind: Int, Omit: true, Resume: true, Incidental: true, Range: AtLeast(0), Zero: "one per core, at most -workers",
		Doc: "models the simulated workers of this process take turns on, on the CPU; they share one copy of the parameters either way"},
	{Key: "quiet", Kind: Bool, Resume: true, Incidental: true, Doc: "no progress output"},
	{Key: "checkpoint_every", Kind: Int, Resume: true, Incidental: true, Range: AtLeast(0), Zero: "at the end of every epoch only, and where the run stops",
		Doc: "also write a checkpoint every this many steps"},
	{Key: "check_every", Kind: Int, Omit: true, Resume: true, Incidental: true, Range: AtLeast(0), Zero: "only at checkpoints",
		Doc: "compare a hash of the workers' parameters every this many steps and stop if they differ"},
	{Key: "phase_times", Incidental: true, Retired: "the phases' times are always recorded now"},
}

var byKey, byFlag = func() (map[string]Option, map[string]Option) {
	keys := make(map[string]Option, len(All))
	flags := make(map[string]Option, len(All))
	for _, o := range All {
		if err := o.Validate(); err != nil {
			panic("options: " + err.Error())
		}
		if !o.Optional && o.Kind.numeric() && o.Kind != IntList && o.Default != nil && o.Format(o.Default) != "0" {
			// train.Config's zero would read as given.
			panic("options: " + o.Key + ": a default of " + o.Format(o.Default) + " needs Optional")
		}
		if _, dup := keys[o.Key]; dup {
			panic("options: " + o.Key + " declared twice")
		}
		keys[o.Key] = o
		if o.Retired != "" || o.Kind == ValueMap {
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

// ByFlag returns the general option whose flag (or one of its aliases) is
// name, without the dash.
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
