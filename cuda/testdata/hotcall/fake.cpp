// A fake of the driver's and cuBLAS' hot functions with their C
// prototypes: each records its arguments, as the C ABI delivers them, and
// returns its own code. TestHotCallsPassTheirArguments builds it with g++
// and calls it through the package's direct bindings (hotDriver,
// hotCUBLAS), which no emulated run exercises.
#include <cstddef>
#include <cstdint>

typedef uint64_t u64;
static u64 rec[32];
static int nrec;
static void put(u64 v) { rec[nrec++] = v; }

extern "C" {
int fake_args(u64* out) {
    int n = nrec;
    for (int i = 0; i < n; i++) out[i] = rec[i];
    nrec = 0;
    return n;
}
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, void* s, void** params, void** extra) {
    put((u64)f); put(gx); put(gy); put(gz); put(bx); put(by); put(bz); put(sh); put((u64)s); put((u64)params); put((u64)extra);
    return 101;
}
int cuCtxSetCurrent(void* ctx) { put((u64)ctx); return 102; }
int cuMemcpyHtoDAsync_v2(u64 dst, const void* src, size_t n, void* s) { put(dst); put((u64)src); put(n); put((u64)s); return 103; }
int cuMemcpyDtoHAsync_v2(void* dst, u64 src, size_t n, void* s) { put((u64)dst); put(src); put(n); put((u64)s); return 104; }
int cuMemcpyDtoDAsync_v2(u64 dst, u64 src, size_t n, void* s) { put(dst); put(src); put(n); put((u64)s); return 105; }
int cuMemsetD32Async(u64 dst, unsigned v, size_t n, void* s) { put(dst); put(v); put(n); put((u64)s); return 106; }
int cuEventRecord(void* e, void* s) { put((u64)e); put((u64)s); return 107; }
int cuEventRecordWithFlags(void* e, void* s, unsigned flags) { put((u64)e); put((u64)s); put(flags); return 108; }
int cuStreamWaitEvent(void* s, void* e, unsigned flags) { put((u64)s); put((u64)e); put(flags); return 109; }
int cuEventQuery(void* e) { put((u64)e); return 110; }
int cuGraphLaunch(void* g, void* s) { put((u64)g); put((u64)s); return 111; }
int cuStreamSynchronize(void* s) { put((u64)s); return 112; }
int cuEventSynchronize(void* e) { put((u64)e); return 113; }
int cuEventCreate(void** e, unsigned flags) { *e = (void*)0xe7e7; put(flags); return 114; }
int cuEventDestroy_v2(void* e) { put((u64)e); return 115; }
int cublasSgemm_v2(void* h, int ta, int tb, int m, int n, int k, const float* alpha, const float* a, int lda, const float* b, int ldb, const float* beta, float* c, int ldc) {
    put((u64)h); put((u64)(int64_t)ta); put((u64)(int64_t)tb); put(m); put(n); put(k); put((u64)(int64_t)(*alpha * 1000)); put((u64)a); put(lda);
    put((u64)b); put(ldb); put((u64)(int64_t)(*beta * 1000)); put((u64)c); put(ldc);
    return 116;
}
}
