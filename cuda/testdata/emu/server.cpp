// The emulator process: device memory is this process's memory, kernels
// are kernels.cu compiled with emu.h, and cuBLAS' SGEMM and cuDNN's
// convolutions are plain reference loops. The Go test talks to it over
// stdin/stdout (little-endian binary requests, see emu_test.go).
#include "emu.h"

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

thread_local dim3 threadIdx;
dim3 blockIdx, blockDim, gridDim;
std::barrier<>* emuBarrier;

#include "kernels.cu"

// Params unpacks one launch's parameters (each in its own width).
struct Params {
    std::vector<std::vector<uint8_t>> p;
    size_t i = 0;
    template <class T> T next() {
        T v{};
        std::memcpy(&v, p.at(i++).data(), sizeof(T));
        return v;
    }
};

using Kernel = std::function<void(Params&)>;
std::map<std::string, Kernel> kernels;
#include "dispatch.inc"

// Pool is blockDim persistent threads that run every launch of that block
// size: each thread walks the blocks in order, the blocks separated by
// barrier phases (the same barrier __syncthreads uses, so the kernels' own
// phases fit in between).
struct Pool {
    unsigned n;
    std::barrier<> bar, done;
    std::mutex mu;
    std::condition_variable cv;
    uint64_t gen = 0;
    unsigned grid = 0;
    const std::function<void()>* body = nullptr;
    std::vector<std::thread> ts;

    explicit Pool(unsigned n) : n(n), bar(n), done(n + 1) {
        for (unsigned t = 0; t < n; t++) {
            ts.emplace_back([this, t] {
                threadIdx = {t, 0, 0};
                uint64_t seen = 0;
                for (;;) {
                    {
                        std::unique_lock<std::mutex> l(mu);
                        cv.wait(l, [&] { return gen != seen; });
                        seen = gen;
                    }
                    for (unsigned b = 0; b < grid; b++) {
                        bar.arrive_and_wait();  // every thread is done with the previous block
                        if (threadIdx.x == 0) blockIdx = {b, 0, 0};
                        bar.arrive_and_wait();  // blockIdx is set
                        (*body)();
                    }
                    done.arrive_and_wait();
                }
            });
        }
    }

    void run(unsigned g, const std::function<void()>& f) {
        emuBarrier = &bar;
        {
            std::lock_guard<std::mutex> l(mu);
            grid = g;
            body = &f;
            gen++;
        }
        cv.notify_all();
        done.arrive_and_wait();
    }
};

static std::map<unsigned, Pool*> pools;

// Runs body once per thread of every block.
static void launch(unsigned grid, unsigned block, const std::function<void()>& body) {
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    Pool*& p = pools[block];
    if (!p) p = new Pool(block);
    p->run(grid, body);
}

static void readAll(void* p, size_t n) {
    if (n && fread(p, 1, n, stdin) != n) exit(0);
}
template <class T> static T rd() {
    T v;
    readAll(&v, sizeof v);
    return v;
}
static void reply(uint8_t status, const void* p = nullptr, size_t n = 0) {
    fwrite(&status, 1, 1, stdout);
    if (n) fwrite(p, 1, n, stdout);
    fflush(stdout);
}

// Column-major SGEMM with cuBLAS' arguments.
static void gemm(int ta, int tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int l = 0; l < k; l++) {
                double a = ta ? A[l + (size_t)i * lda] : A[i + (size_t)l * lda];
                double b = tb ? B[j + (size_t)l * ldb] : B[l + (size_t)j * ldb];
                s += a * b;
            }
            float& c = C[i + (size_t)j * ldc];
            c = (float)(alpha * s + (beta == 0 ? 0.0 : beta * c));
        }
}

// NCHW cross-correlation and its gradients with cuDNN's semantics (y, dx,
// dw overwritten: beta 0).
static void conv(int which, int N, int C, int H, int W, int K, int R, int pad, int stride, float* x, float* w, float* y) {
    int Ho = (H + 2 * pad - R) / stride + 1, Wo = (W + 2 * pad - R) / stride + 1;
    if (which == 0) std::memset(y, 0, sizeof(float) * N * K * Ho * Wo);
    if (which == 1) std::memset(x, 0, sizeof(float) * N * C * H * W);
    if (which == 2) std::memset(w, 0, sizeof(float) * K * C * R * R);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int oy = 0; oy < Ho; oy++)
                for (int ox = 0; ox < Wo; ox++) {
                    float& yv = y[((size_t)(n * K + k) * Ho + oy) * Wo + ox];
                    for (int c = 0; c < C; c++)
                        for (int ky = 0; ky < R; ky++)
                            for (int kx = 0; kx < R; kx++) {
                                int iy = oy * stride - pad + ky, ix = ox * stride - pad + kx;
                                if (iy < 0 || ix < 0 || iy >= H || ix >= W) continue;
                                float& xv = x[((size_t)(n * C + c) * H + iy) * W + ix];
                                float& wv = w[((size_t)(k * C + c) * R + ky) * R + kx];
                                if (which == 0) yv += xv * wv;
                                if (which == 1) xv += yv * wv;
                                if (which == 2) wv += yv * xv;
                            }
                }
}

int main() {
    registerKernels();
    for (;;) {
        uint8_t op;
        if (fread(&op, 1, 1, stdin) != 1) return 0;
        switch (op) {
        case 1: {  // alloc size -> addr
            uint64_t n = rd<uint64_t>();
            void* p = std::calloc(n ? n : 1, 1);
            uint64_t a = (uint64_t)(uintptr_t)p;
            reply(0, &a, 8);
            break;
        }
        case 2: {  // free addr
            std::free((void*)(uintptr_t)rd<uint64_t>());
            reply(0);
            break;
        }
        case 3: {  // write addr n bytes
            uint64_t a = rd<uint64_t>(), n = rd<uint64_t>();
            readAll((void*)(uintptr_t)a, n);
            reply(0);
            break;
        }
        case 4: {  // read addr n -> bytes
            uint64_t a = rd<uint64_t>(), n = rd<uint64_t>();
            reply(0, (void*)(uintptr_t)a, n);
            break;
        }
        case 5: {  // copy dst src n
            uint64_t d = rd<uint64_t>(), s = rd<uint64_t>(), n = rd<uint64_t>();
            std::memmove((void*)(uintptr_t)d, (void*)(uintptr_t)s, n);
            reply(0);
            break;
        }
        case 6: {  // memset32 addr value count
            uint64_t a = rd<uint64_t>();
            uint32_t v = rd<uint32_t>();
            uint64_t n = rd<uint64_t>();
            uint32_t* p = (uint32_t*)(uintptr_t)a;
            for (uint64_t i = 0; i < n; i++) p[i] = v;
            reply(0);
            break;
        }
        case 7: {  // launch name grid block params
            uint32_t nl = rd<uint32_t>();
            std::string name(nl, 0);
            readAll(name.data(), nl);
            uint32_t grid = rd<uint32_t>(), block = rd<uint32_t>(), np = rd<uint32_t>();
            Params ps;
            ps.p.resize(np);
            for (auto& p : ps.p) {
                p.resize(rd<uint32_t>());
                readAll(p.data(), p.size());
            }
            auto it = kernels.find(name);
            if (it == kernels.end()) {
                reply(1);
                break;
            }
            launch(grid, block, [&] {
                Params local = ps;
                it->second(local);
            });
            reply(0);
            break;
        }
        case 8: {  // gemm
            int ta = rd<int32_t>(), tb = rd<int32_t>(), m = rd<int32_t>(), n = rd<int32_t>(), k = rd<int32_t>();
            float alpha = rd<float>();
            uint64_t A = rd<uint64_t>();
            int lda = rd<int32_t>();
            uint64_t B = rd<uint64_t>();
            int ldb = rd<int32_t>();
            float beta = rd<float>();
            uint64_t Cp = rd<uint64_t>();
            int ldc = rd<int32_t>();
            gemm(ta, tb, m, n, k, alpha, (float*)(uintptr_t)A, lda, (float*)(uintptr_t)B, ldb, beta, (float*)(uintptr_t)Cp, ldc);
            reply(0);
            break;
        }
        case 9: {  // conv which N C H W K R pad stride x w y
            int which = rd<int32_t>(), N = rd<int32_t>(), C = rd<int32_t>(), H = rd<int32_t>(), W = rd<int32_t>();
            int K = rd<int32_t>(), R = rd<int32_t>(), pad = rd<int32_t>(), stride = rd<int32_t>();
            uint64_t x = rd<uint64_t>(), w = rd<uint64_t>(), y = rd<uint64_t>();
            conv(which, N, C, H, W, K, R, pad, stride, (float*)(uintptr_t)x, (float*)(uintptr_t)w, (float*)(uintptr_t)y);
            reply(0);
            break;
        }
        default:
            reply(2);
        }
    }
}
