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
// its own that registers it (workload.go says what a workload declares;
// workload_resnet18.go, workload_lstm.go, workload_ncf.go; a replay's
// recorded gradients in replay.go). Adding a model is its graph (a
// models.Model) and one such file; a test declares one in two test files
// and trains it (TestNewModelIsTwoFiles).
//
// # One rank's training
//
// A rank's worker (worker.go) owns its data path (dataPath in datapath.go),
// whose step runs one iteration, and carries out between the steps what
// the run's schedule (schedule.go) decides: checkpoints (ckptrun.go),
// evaluations, the step records (stats.go, output.go); faults.go turns
// errors into the job's and holds the ranks' agreement to stop. Several
// in-process workers on the CPU share parameters, optimizer and models
// (simulate.go); on GPUs (device.go) every worker keeps its own. The
// trainer's place among the packages, its workers, devices and run
// folders are described in docs/design.md.
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
// continue exactly. One is written at the end of every epoch, every
// Config.CheckpointEvery steps, where the run stops (-steps, -max-time) and
// when it is interrupted (schedule.go decides which). Config.Resume
// continues from the newest complete one and, on the CPU, ends bit for bit
// where the uninterrupted run ends, for every sparsifier, in one process
// and under mpirun (docs/results/resume-equivalence.md).
//
// Options.Stop, SIGINT and SIGTERM (Options.Signals) stop the run after
// the current step, with a checkpoint. A failing or panicking worker ends
// the job; a NaN or infinite loss or gradient stops it naming the tensor;
// parameters that differ between the ranks stop it (Config.CheckEvery).
// Every error that ends a started job names the step, the rank where it
// matters, the last checkpoint and the command that resumes (faults.go).
//
// # Replays and recorded gradients
//
// Config.Gradients replays a recording of gradients instead of training a
// model (replay.go); Config.RecordGradients records this trainer's.
// Recording a run's gradients and replaying them with the same sparsifier
// gives the training run's reduction bit for bit
// (TestReplayReproducesLSTM, TestReplayReproducesResNet18).
//
// # Reproducibility
//
// In-process workers and mpirun processes give bit-identical losses when
// every worker uses the same number of BLAS threads (OpenBLAS's results
// depend on it); the default thread count, cores / workers on the machine,
// is the same in both cases on one machine.
package train
