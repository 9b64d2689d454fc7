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
#include <atomic>
#include <vector>

thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

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

// Kernel is one kernel of kernels.cu: prepare unpacks a launch's
// parameters into the call one thread makes; sync says whether the kernel
// reaches __syncthreads (found in the source by the Go side).
struct Kernel {
    bool sync;
    std::function<std::function<void()>(Params&)> prepare;
};
std::map<std::string, Kernel> kernels;
#include "dispatch.inc"

// Fibers: a minimal x86-64 context switch (the System V callee-saved
// registers and the stack pointer; no signal mask, which glibc's
// swapcontext saves with a system call per switch). emu_switch saves the
// running context's stack pointer in *save and resumes the one at to.
extern "C" void emu_switch(void** save, void* to);
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
.section .note.GNU-stack,"",@progbits
.text
)");

static const size_t fiberStack = 256 << 10;

// Worker runs blocks: the threads of a block in turn, as fibers when the
// kernel has barriers.
struct Worker {
    std::vector<char*> stacks;
    std::vector<void*> sp;
    std::vector<char> done;
    void* sched = nullptr;
    unsigned cur = 0;
    bool fibers = false;
    const std::function<void()>* body = nullptr;
};
static thread_local Worker* me;

static void fiberEntry() {
    Worker* w = me;
    (*w->body)();
    w->done[w->cur] = 1;
    emu_switch(&w->sp[w->cur], w->sched);
    std::abort();  // a finished fiber is never resumed
}

void emuSyncThreads() {
    Worker* w = me;
    if (!w->fibers) {
        std::fprintf(stderr, "emulator: __syncthreads reached by a kernel that the Go side found to have no barrier\n");
        std::abort();
    }
    emu_switch(&w->sp[w->cur], w->sched);
}

static void runBlock(Worker* w, unsigned b, bool sync, const std::function<void()>& body) {
    unsigned n = blockDim.x;
    blockIdx = {b, 0, 0};
    me = w;
    w->body = &body;
    w->fibers = sync;
    if (!sync) {
        for (unsigned t = 0; t < n; t++) {
            threadIdx = {t, 0, 0};
            body();
        }
        return;
    }
    while (w->stacks.size() < n) w->stacks.push_back(static_cast<char*>(std::aligned_alloc(16, fiberStack)));
    w->sp.resize(n);
    w->done.assign(n, 0);
    for (unsigned t = 0; t < n; t++) {
        void** top = reinterpret_cast<void**>(w->stacks[t] + fiberStack);
        void** sp = top - 8;  // six registers, the entry as return address, a slot above it
        for (int i = 0; i < 8; i++) sp[i] = nullptr;
        sp[6] = reinterpret_cast<void*>(&fiberEntry);
        w->sp[t] = sp;
    }
    // Each round resumes every live thread once: it runs to its next
    // barrier or to its end, so a round is one barrier phase.
    for (unsigned live = n; live > 0;) {
        for (unsigned t = 0; t < n; t++) {
            if (w->done[t]) continue;
            threadIdx = {t, 0, 0};
            w->cur = t;
            emu_switch(&w->sched, w->sp[t]);
            if (w->done[t]) live--;
        }
    }
}

// The workers: the server's thread and helpers, which take the blocks of
// a launch in turn from a shared counter (so blocks run concurrently, as
// on a GPU, and the integer atomics matter).
struct Pool {
    std::vector<Worker> ws;
    std::vector<std::thread> ts;
    std::mutex mu;
    std::condition_variable cv, fin;
    uint64_t gen = 0;
    unsigned busy = 0;
    std::atomic<unsigned> next{0};
    unsigned grid = 0;
    bool sync = false;
    const std::function<void()>* body = nullptr;

    explicit Pool(unsigned n) : ws(n) {
        for (unsigned i = 1; i < n; i++) {
            ts.emplace_back([this, i] {
                uint64_t seen = 0;
                for (;;) {
                    {
                        std::unique_lock<std::mutex> l(mu);
                        cv.wait(l, [&] { return gen != seen; });
                        seen = gen;
                    }
                    work(&ws[i]);
                    std::lock_guard<std::mutex> l(mu);
                    if (--busy == 0) fin.notify_all();
                }
            });
        }
    }

    void work(Worker* w) {
        for (unsigned b; (b = next.fetch_add(1)) < grid;) runBlock(w, b, sync, *body);
    }

    void run(unsigned g, bool s, const std::function<void()>& f) {
        grid = g;
        sync = s;
        body = &f;
        next = 0;
        bool helpers = g > 1 && !ts.empty();
        if (helpers) {
            std::lock_guard<std::mutex> l(mu);
            busy = ts.size();
            gen++;
            cv.notify_all();
        }
        work(&ws[0]);
        if (helpers) {
            std::unique_lock<std::mutex> l(mu);
            fin.wait(l, [&] { return busy == 0; });
        }
    }
};

static Pool* pool;

// Runs body once per thread of every block.
static void launch(unsigned grid, unsigned block, bool sync, const std::function<void()>& body) {
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    pool->run(grid, sync, body);
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
    unsigned workers = std::thread::hardware_concurrency();
    if (const char* v = std::getenv("SPARSEGRAD_EMU_WORKERS")) workers = std::atoi(v);
    pool = new Pool(workers < 1 ? 1 : workers > 4 ? 4 : workers);
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
            std::function<void()> call = it->second.prepare(ps);
            launch(grid, block, it->second.sync, call);
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
