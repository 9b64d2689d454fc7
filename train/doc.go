// Package train owns the trainer: the run configuration and its validation,
// the per-worker data-parallel loop (forward → backward → error feedback →
// reducer → optimizer), the optimizers (SGD with momentum and weight decay in
// PyTorch's semantics, Adam), learning-rate schedules, gradient clipping,
// pipelining through the models' gradient hook, evaluation, the metrics
// of a run (run.json, metrics.jsonl), checkpoints and progress bars.
//
// The same loop runs N simulated workers in one process over comm/local
// (Config.Workers) or one worker per process under mpirun (comm/mpi): for the
// same seed both give the same per-step losses, because every rank builds
// its data shard, dropout seed and reducer the same way and every sum goes
// through the communicators' canonical order.
//
// # Models
//
// Each model the trainer trains is declared once, as a workload in a file of
// its own that registers it (workload_resnet18.go, workload_lstm.go,
// workload_ncf.go; a replay's recorded gradients in replay.go): the data
// sets it trains on and how they are read, its sizes (-model-size) and
// kind, its defaults of the general options (epochs, batch, learning rate,
// optimizer, ...; package options declares the options), how it is built,
// how a rank's batches and evaluation are cut (its task), and what its
// batches cost in memory. LoadDataset, NewModel, the tasks, Defaults,
// Validate, the memory check and the help of -model, -dataset, -model-size
// and the options the models default (OptionUsage) read the registered
// workloads. Adding a model is its graph (a models.Model; package models
// for the built-in ones) and one such file; a test declares one in two test
// files and trains it (TestNewModelIsTwoFiles).
//
// # One rank's training
//
// A rank's worker (worker.go) has two parts:
//
//   - Its data path (dataPath in datapath.go): the model, the parameters,
//     gradient and error-feedback residual on the rank's device (with
//     their host views), the reducer, the optimizer and the streams. Its
//     one method step runs an iteration: forward and backward, [clip],
//     error feedback, the reduction (overlapped with the backward pass for
//     a method whose reducer reduces groups, dense and lags, pipeline.go), [clip], the
//     update. newDataPath builds it.
//   - Its schedule (runSchedule in schedule.go): pure functions of the
//     configuration and the step and epoch counters that decide, before
//     and after every step and at an epoch's end, whether to log the step,
//     compare the ranks' parameters, write a checkpoint (of which
//     position), evaluate, and whether and why the run stops (-steps,
//     -epochs, -max-time, a stop asked for). -max-time's reserve for the
//     final evaluation and its cut are there too (evalReserve, evalCut).
//
// The worker's loop (worker.loop) runs the steps of the data path and
// carries out the schedule's plans: checkpoints (ckptrun.go), evaluations
// (worker.evaluate), the step records (stats.go, output.go); faults.go
// turns errors into the job's and holds the ranks' agreement to stop.
// worker.setup builds a rank in named steps: buildModel, commOn,
// newDataPath, initParams, prepareData, newRunInfo and openOutput
// (output.go).
//
// # Simulated workers
//
// Several in-process workers on the CPU simulate a cluster within one
// machine's memory (simulation in simulate.go): the replicas' parameters
// are identical after every step, so the workers keep one parameter vector
// and one optimizer, which rank 0 updates once per step between two
// barriers (after every worker is done with the step's parameters; before
// any worker's next forward pass), and they take turns on a few models
// (a models.Pool of Config.Executors executors, by default one per core).
// Per worker stay the gradient, the error-feedback residual, the reducer
// and its state, the data shard, and the model state the pool binds to
// each of its steps (BatchNorm statistics, dropout stream, LSTM hidden
// states). Results are bit-identical to workers with models and
// parameters of their own (and to mpirun -np N). A step's t_queue is its
// wait for an executor and the other workers' turns; t_forward, t_backward
// and t_compute are its own turn's. A step record holds the times of the
// worker the others waited for (the largest t_queue + t_compute +
// t_select), which add up to its iteration (metrics.Step). run.json
// records the executors; the report says the run was simulated. 16
// ResNet-18 workers at batch 32 peak at about 3.1 GB, 4.0 GB with Top-k's
// selection scratch (docs/results/simulated-workers.md). GPUs keep a model
// and parameters per worker (each on a stream of its own), and so does
// every mpirun process; so do simulated workers of a model defined outside
// package models, which a pool cannot share (models.Shareable).
//
// # Devices
//
// Config.Device "cuda" runs each worker's model on an NVIDIA GPU (package
// cuda): in-process worker r uses GPU r mod the GPUs found, with a stream
// of its own; under mpirun a process uses the GPU of its local rank. The
// parameters, the gradient, the optimizer state and gradient clipping stay
// on the device, and so do error feedback (the residual is a device
// vector) and the reducers (sparsify.Reducer.ReduceOn, with the GPU's
// kernels, cuda.Device.Sparse). With pipelining (a method that reduces
// groups, LAGS' merge groups) each group's error feedback and reduction
// run on a communication stream of the worker as soon as the group's
// gradients are final, beside the backward pass.
//
// Config.Comm picks the backend of the reducers' device buffers: NCCL
// (package cuda) when every worker has a GPU of its own, the others' calls
// (host buffers) on the in-process or MPI backend (comm.Route); or the
// in-process or MPI backend with device buffers staged through host memory
// (comm.Staged), for any number of workers per GPU. Staged, a run adds in
// the communicators' canonical order, so -workers N and mpirun -np N give
// the same bits on the GPU as each other; NCCL sums in an order of its own
// (close, not bit-identical).
//
// # Deviations from the reference code (on purpose)
//
//   - Momentum: PyTorch's SGD (buf = m·buf + g + wd·w; w −= lr·buf), not the
//     DEFT/MiCRO harness's "nesterov" (g + buf, which doubles the first step
//     and, with momentum 0, every step). With momentum 0 the harness's steps
//     are twice PyTorch's for the same learning rate (with momentum 0.9 about
//     1.1× in the steady state); Config.Defaults is chosen for PyTorch's
//     semantics.
//   - Initial parameters are rank 0's, broadcast to all ranks (as PyTorch's
//     DistributedDataParallel does); every rank seeds its dropout masks with
//     seed+rank.
//   - The learning-rate warm-up is linear per iteration from lr/warm-up
//     iterations to lr (the reference code starts at lr/P or scales lr up).
//   - The LSTM's hidden state is reset before and after every evaluation
//     (also the training state when -eval-every evaluates mid-epoch); the
//     reference resets it only at epoch starts.
//   - Evaluation covers every rank's share of the split (CIFAR test images,
//     WikiText-2 validation columns, MovieLens users) and combines the
//     ranks' sums, so the metric is the whole split's, not rank 0's. A run
//     that ends within its first epoch (-steps) evaluates a sample, at most
//     max(50, -steps) batches per rank unless -max-eval-batches says
//     otherwise; every eval record gives its split and how much of it was
//     evaluated.
//   - Gradient clipping (-clip, the LSTM's default 0.4) clips where the
//     method's reference code does (-clip-at auto): each worker's gradient
//     before error feedback (the DEFT/MiCRO harness), but for lags the
//     averaged gradient after the reduction, as the LAGS reference clips its
//     LSTM runs, and for dense too, as PyTorch DDP users clip the averaged
//     gradient after the backward pass — which keeps both overlapped. Local
//     clipping needs the whole gradient before error feedback, so -clip-at
//     local turns overlap off (-overlap auto) or is refused (-overlap on).
//   - Dense overlaps its all-reduce with the backward pass by default, as
//     PyTorch DDP does: DDP's buckets (-bucket-mb) started as the backward
//     pass finishes them, each element summed in the order of one
//     all-reduce of the whole gradient, so -overlap off (one all-reduce
//     after the backward pass, the DEFT/MiCRO code's baseline) gives the
//     same bits. -record-gradients turns overlap off (-overlap auto).
//   - LAGS' adaptive density (-max-ratio) profiles the backward pass and
//     its own sparsification over steps 6–15 of the process (after 5
//     warm-up steps that hold allocation and cold caches; the reference
//     profiles 50 after 5) and uses the maxima over ranks from step 16 on;
//     the run says which steps in a note (terminal, run.json, report).
//   - A configuration whose method does nothing (DRAGONN with every tensor
//     at most -min-tensor elements, a dense warm-up as long as the run) or
//     whose adaptive part never acts says so in a note.
//
// # Checkpoints, resumes and faults
//
// A checkpoint (its files are package rundir's; ckptrun.go makes the ranks
// agree on writing and reading one) holds everything a run needs to
// continue exactly: rank 0's shared part (parameters, optimizer state, position,
// wall time, configuration) and every rank's own part (error-feedback
// residual, batch-norm statistics, the reducer's state through
// sparsify.Reducer.State, the model's dropout stream and LSTM hidden state
// through models.Stateful). One is written at the end of every epoch, every
// Config.CheckpointEvery steps, where the run stops (-steps, -max-time) and
// when it is interrupted (schedule.go decides which); the newest two are
// kept. Config.Resume continues from the newest complete one: on the CPU,
// a run stopped after step k and resumed ends bit for bit where the
// uninterrupted run ends (parameters, every rank's state, every metric but
// the times), for every sparsifier, in one process and under mpirun
// (docs/results/resume-equivalence.md). On a GPU the residual is read
// from device memory for the checkpoint and written back on resume. A
// damaged or foreign checkpoint is refused naming the earlier one to
// resume from once it is moved away; one of another configuration, naming
// each difference; a refused resume changes nothing
// in the run's folder (run.json, logs and report are written once the
// checkpoint is accepted). A checkpoint that cannot be written (a full
// disk) stops the run, naming the steps lost and the previous checkpoint,
// which stays intact; a new run that fails before its first step removes
// what it wrote.
// metrics.jsonl loses the records written after the checkpoint (a run
// that died wrote them; the resumed run writes them again), and the wall
// time goes on from the checkpoint's, so the record is one run.
//
// Options.Stop, SIGINT and SIGTERM (Options.Signals) stop the run after
// the current step, with a checkpoint; the ranks agree on the step to stop
// at with one small all-reduce per step, which also carries -max-time. A
// failing or panicking worker ends the job; a NaN or infinite loss or
// gradient stops it naming the tensor; parameters that differ between the
// ranks stop it at the next Config.CheckEvery step or checkpoint, naming
// the ranks that differ from the most common parameters (no checkpoint of
// such a state is written). Every error that ends a started
// job names the step, the rank where it matters, the last checkpoint and
// the command that resumes.
//
// # Replays and recorded gradients
//
// Config.Gradients replays a recording of gradients (package recorded:
// from any PyTorch training, or from this trainer's Config.RecordGradients)
// instead of training a model: the model is models.Recorded, whose step
// writes the recorded gradient of the worker and step into the gradient
// vector, and the data serves the recorded steps (replay.go); error
// feedback, the reducers, the metrics, checkpoints, simulated workers and
// mpirun are training's own. A replay applies no update, has no loss and
// no evaluation, and its compute time is the copy of the gradient; run.json
// says so ("replay", "cannot_show") and the report shows it. Recording this
// trainer's gradients and replaying them with the same sparsifier gives the
// training run's reduction bit for bit (TestReplayReproducesTraining).
//
// # Reproducibility
//
// In-process workers and mpirun processes give bit-identical losses when
// every worker uses the same number of BLAS threads (OpenBLAS's results
// depend on it); the default thread count, cores / workers on the machine,
// is the same in both cases on one machine.
package train
