package metrics

import "time"

// Run is the content of run.json, which train writes into a run directory
// when the run starts (and again when it is resumed) and which resumes,
// the reports and the advisor read. C is the type of its configuration
// ("config"; train.Config, whose keys package options declares: a reader
// that needs only some of them decodes it into a type of its own); G is
// the type of the GPU's report ("cuda"; cuda.Report: a reader that does
// not show it takes json.RawMessage).
type Run[C, G any] struct {
	Config      C         `json:"config"`
	CommandLine []string  `json:"command_line"`
	Start       time.Time `json:"start"`
	Backend     string    `json:"backend"`
	Workers     int       `json:"workers"`
	Params      int       `json:"params"`
	Tensors     int       `json:"tensors"`
	// Pipelined tells that the method reduced the gradient's groups during
	// the backward pass (dense's buckets, LAGS' merge groups); Overlap is
	// the same under the option's name (-overlap).
	Pipelined bool `json:"pipelined"`
	Overlap   bool `json:"overlap"`
	// BucketMB is dense's bucket cap in MiB (-bucket-mb; 0: one bucket,
	// the whole gradient); absent for the other methods.
	BucketMB *float64 `json:"bucket_mb,omitempty"`
	// Device is where rank 0's model ran ("cpu", or the GPU, e.g.
	// "cuda:0 (NVIDIA H100 80GB HBM3, …)").
	Device string `json:"device"`
	// ReduceIn is where the sparsifier selects and reduces: "device" (the
	// memory of Device, GPU kernels on a GPU; every built-in method) or
	// "host" (a method that reduces host memory only, on a GPU: the
	// error-compensated gradient is copied to host memory and back).
	ReduceIn string `json:"reduce_in"`
	// Comm is the backend that moved the sparsifier's messages: "local",
	// "mpi" or "given" (on a GPU: device buffers staged through host
	// memory), or "nccl" (device memory).
	Comm string `json:"comm"`
	// Executors is the number of models (executors) the workers took
	// turns on when they were simulated (several in-process workers on
	// the CPU, sharing one copy of the parameters); 0 when every worker
	// had its own model and parameters.
	Executors int      `json:"executors,omitempty"`
	Versions  Versions `json:"versions"`
	// CUDA describes rank 0's GPU, its driver and every NVIDIA library
	// file the process loaded, with versions (-device cuda).
	CUDA    *G      `json:"cuda,omitempty"`
	Machine Machine `json:"machine"`
	// Resumes lists the times the run was resumed, oldest first.
	Resumes []Resume `json:"resumes,omitempty"`
	// LayerNames are the layout's tensor names, in order.
	LayerNames []string `json:"layer_names"`
	// Replay describes the recording a replay of recorded gradients
	// (train replay) replayed (nil for a training run), and CannotShow
	// what such a run's metrics leave out.
	Replay     *Replay `json:"replay,omitempty"`
	CannotShow string  `json:"cannot_show,omitempty"`
	// Notes are what the run said about itself on the terminal that a
	// reader of its results must know (a method that does nothing in this
	// configuration, what an adaptive method measured), oldest first.
	Notes []string `json:"notes,omitempty"`
	// Status is how the run stands: StatusRunning while a process trains
	// it (from its start, and again from each resume), then how it ended.
	// A run.json that says StatusRunning while no process holds the run
	// folder's lock was killed (rundir.Held tells). Empty in records
	// written before the status was kept.
	Status string `json:"status,omitempty"`
	// End describes the end of the run when Status is not StatusRunning
	// (nil while running).
	End *End `json:"end,omitempty"`
}

// The values of Run.Status.
const (
	StatusRunning     = "running"
	StatusCompleted   = "completed"   // every epoch trained
	StatusStopped     = "stopped"     // -steps or -max-time ended it early (End.Reason)
	StatusInterrupted = "interrupted" // a signal or a stop request, after a checkpoint
	StatusFailed      = "failed"      // an error (End.Reason)
	// StatusKilled is never written: it is what a reader calls a run whose
	// run.json says StatusRunning while no process trains it.
	StatusKilled = "killed"
)

// End is how a run ended.
type End struct {
	// Time is when it ended.
	Time time.Time `json:"time"`
	// Step is the last step trained, of TotalSteps planned (-epochs, or
	// -steps when that is less); StepsPerEpoch tells the epochs.
	Step          int `json:"step"`
	TotalSteps    int `json:"total_steps"`
	StepsPerEpoch int `json:"steps_per_epoch"`
	// Checkpoint is the last checkpoint's folder ("" when none was
	// written) and CheckpointStep its step.
	Checkpoint     string `json:"checkpoint,omitempty"`
	CheckpointStep int    `json:"checkpoint_step,omitempty"`
	// Reason says why a run stopped early or failed (the error).
	Reason string `json:"reason,omitempty"`
}

// Versions are the software versions of a run.
type Versions struct {
	Go       string `json:"go"`
	Module   string `json:"module"`
	Revision string `json:"revision,omitempty"`
	BLAS     string `json:"blas"`
	// Kernels are the CPU kernels that ran the convolutions and batch
	// norms: oneDNN (version, library, threads, memory format) or im2col
	// (empty on GPUs and in older runs).
	Kernels string `json:"kernels,omitempty"`
}

// Machine describes the computer of rank 0.
type Machine struct {
	Hostname string  `json:"hostname"`
	OS       string  `json:"os"`
	Arch     string  `json:"arch"`
	Cores    int     `json:"cores"`
	CPU      string  `json:"cpu"`
	GPU      string  `json:"gpu"`
	Load1    float64 `json:"load1,omitempty"`
}

// Resume is one resume of a run, as run.json lists them.
type Resume struct {
	// At is when the resumed run started.
	At time.Time `json:"at"`
	// Step is the step of the checkpoint it continued from.
	Step int `json:"step"`
	// Checkpoint is that checkpoint's folder.
	Checkpoint string `json:"checkpoint"`
	// CommandLine is the resuming command.
	CommandLine []string `json:"command_line"`
	// After is how the run had ended before this resume (Run.Status, with
	// StatusKilled for a run that was killed; empty in older records).
	After string `json:"after,omitempty"`
}
