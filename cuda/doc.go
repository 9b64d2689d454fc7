// Package cuda owns the NVIDIA GPU runtime of the project: the CUDA driver,
// NVRTC, cuBLAS and cuDNN loaded at run time (purego, no cgo: a plain `go
// build` builds everything and one binary runs on machines with and
// without a GPU), device memory, streams and events (a device.Device), the
// vector math the trainer applies to whole vectors (device.Math), the
// project's CUDA C kernels (embedded in the binary, compiled by NVRTC for
// the GPU found and cached on disk), and the engine backend that runs every
// op of package ops on the GPU (cuBLAS for matrix products, cuDNN for
// convolutions, the project's kernels for the rest); the sparsification
// primitives of the reducers (Sparse, package sparsify's Ops on the GPU:
// exact top-k by radix select, threshold selection, gathers and scatters,
// unions, DRAGONN's hashing — the same index sets and bits as the CPU's);
// NCCL (NewNCCL), a comm.Communicator on GPU memory; and what the
// in-process ranks sharing a GPU, or on GPUs with peer access, need to
// reduce each other's memory (comm.PeerDevice: PeerSum, Reaches),
// page-locked host memory for staging
// (AllocPinned) and the models' dropout masks drawn on the GPU
// (DropoutMask, the CPU's bits).
//
// # Finding the libraries
//
// Each library is looked up, in order: in the directories listed in
// SPARSEGRAD_CUDA_LIBS (colon-separated), by its name on the system's
// library path, in the usual driver and toolkit folders (/usr/local/nvidia,
// /usr/local/cuda), and in the nvidia/*/lib folders of Python environments
// that hold NVIDIA's pip wheels (a virtual environment, Conda, /opt/*/.venv,
// ~/.local): the GPU machines this project runs on have cuBLAS, cuDNN,
// NVRTC and NCCL there, next to PyTorch. A missing GPU or library is an
// error wrapping device.ErrUnavailable that names what is missing and how
// to install it.
//
// # Numerics
//
// Kernels follow the CPU kernels' formulas in float32 (reductions
// accumulate in float64 where the CPU does); the model kernels' sums run in
// a different order than on the CPU, so results agree within float32
// rounding, not bit for bit. The sparsification primitives are exact: they
// add in the CPU's order where they add at all. NCCL adds the ranks'
// contributions in its own order, not package comm's canonical one. TF32
// tensor-core math is off unless Options.TF32 is set.
//
// # Testing without a GPU
//
// On a machine without a GPU the package's tests run against an emulator
// (emu_test.go): the real kernels.cu compiled with g++ and run on CPU
// threads, behind fakes of the driver, cuBLAS, cuDNN and NCCL. It checks
// the kernels, their launch arguments and the libraries' calling
// conventions; it says nothing about speed or real hardware.
//
// # Threads
//
// The CUDA driver keeps the current context per OS thread; every call of
// the package locks its goroutine to its thread and makes the device's
// context current first, so the package is safe to use from any goroutine.
// A goroutine issuing a burst of work on a stream holds it (Stream.Hold:
// a training step, an executor's run, a graph's capture, a reducer's
// group, a collective, an NCCL call), and the stream's calls then skip
// that. A stream must not be used by two goroutines at once.
//
// # What the host pays
//
// Kernels are looked up once: the package's when Open loads the module
// (kernels.go names each once; a launch indexes the module's table), a
// method's own (Sparse.Run) when it is first prepared on the device. The
// driver's and cuBLAS' hot functions are called directly (no reflection).
// Counts returns what the process has asked of its GPUs — launches, graph
// replays, host waits, bytes each way, allocations, context switches —
// so that a test holds a training step to a budget
// (docs/bench/gpu-budget.md).
// SPARSEGRAD_CUDA_SYNC=1 waits after every launch, so that a kernel that
// faults is named in its own launch's error.
package cuda
