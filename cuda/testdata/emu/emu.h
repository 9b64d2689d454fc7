// A CUDA shim for g++: lets the project's kernels.cu compile as C++ and run
// on CPU threads, so that the cuda package's tests exercise the kernels
// (indexing, reductions, launch arguments) on machines without a GPU.
// Blocks run one after another; the threads of a block run on real
// threads, so __syncthreads is a barrier and __shared__ arrays (static
// here) are shared by the block.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <math.h>

struct dim3 {
    unsigned x = 0, y = 0, z = 0;
};

extern thread_local dim3 threadIdx;
extern dim3 blockIdx, blockDim, gridDim;
extern std::barrier<>* emuBarrier;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

inline void __syncthreads() { emuBarrier->arrive_and_wait(); }

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

inline float atomicAdd(float* p, float v) {
    return std::atomic_ref<float>(*p).fetch_add(v);
}

// exp, log, log1p, sqrt (double) and fmaxf, sqrtf, tanhf (float) come
// from <math.h>, as in CUDA device code.
