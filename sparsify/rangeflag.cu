// A range check without a wait (Env.checkRange, rangeFlagKernel): an index
// idx[i] outside [0, lim) lowers *flag to (i << 32 | its bits) — the first
// such i wins — and becomes 0, so that the passes over the list that
// follow stay in bounds until the flag is read (the call then fails).
extern "C" __global__ void k_range_flag(int* idx, i64 n, i64 lim, u64* flag) {
    GRID_STRIDE(i, n) {
        int v = idx[i];
        if (v < 0 || (i64)v >= lim) {
            atomicMin(flag, ((u64)i << 32) | (u64)(u32)v);
            idx[i] = 0;
        }
    }
}
