// Package cuda owns the NVIDIA GPU runtime of the project: the CUDA driver,
// NVRTC, cuBLAS and cuDNN loaded at run time (purego, no cgo: a plain `go
// build` builds everything and one binary runs on machines with and
// without a GPU), device memory, streams and events (a device.Device), the
// vector math the trainer applies to whole vectors (device.Math), the
// project's CUDA C kernels (embedded in the binary, compiled by NVRTC for
// the GPU found and cached on disk), and the engine backend that runs every
// op of package ops on the GPU (cuBLAS for matrix products, cuDNN for
// convolutions, the project's kernels for the rest).
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
// accumulate in float64 where the CPU does); sums run in a different order
// than on the CPU, so results agree within float32 rounding, not bit for
// bit. TF32 tensor-core math is off unless Options.TF32 is set.
//
// # Threads
//
// The CUDA driver keeps the current context per OS thread; every call of
// the package locks its goroutine to its thread and makes the device's
// context current first, so the package is safe to use from any goroutine.
// A stream must not be used by two goroutines at once.
package cuda
