// A CUDA shim for g++: lets the project's kernels.cu compile as C++ and run
// on CPU threads, so that the cuda package's tests exercise the kernels
// (indexing, reductions, launch arguments) on machines without a GPU.
// The blocks of a launch are shared out among a few worker threads. The
// threads of a block run on their worker: one after another when the
// kernel never reaches __syncthreads, else as fibers (cooperative, each
// with its own stack) that run in turn up to the next barrier, so
// __syncthreads is a barrier. __shared__ arrays are thread_local statics:
// one per worker, shared by the block it runs.
#pragma once
#include <atomic>
#include <cmath>
#include <cstring>
#include <math.h>

struct dim3 {
    unsigned x = 0, y = 0, z = 0;
};

extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
void emuSyncThreads();

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static thread_local

inline void __syncthreads() { emuSyncThreads(); }

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline long long __double_as_longlong(double d) {
    long long u;
    std::memcpy(&u, &d, 8);
    return u;
}

inline double __longlong_as_double(long long u) {
    double d;
    std::memcpy(&d, &u, 8);
    return d;
}

inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

inline float atomicAdd(float* p, float v) {
    return std::atomic_ref<float>(*p).fetch_add(v);
}

inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return std::atomic_ref<unsigned>(*p).fetch_add(v);
}

inline unsigned atomicMax(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}

inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
    std::atomic_ref<unsigned long long> a(*p);
    unsigned long long old = a.load();
    while (old > v && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}

// exp, log, log1p, sqrt (double) and fmaxf, sqrtf, tanhf (float) come
// from <math.h>, as in CUDA device code.
