// LAGS' count of the distinct indices a group received (lagsDistinct):
// each index idx[i] (in bounds: the range check ran before) marks its
// element of mark, which is zero before and cleared after by the caller;
// the first to mark an element counts it, in *count.
extern "C" __global__ void k_lags_distinct(const int* idx, i64 n, u32* mark, u32* count) {
    u32 c = 0u;
    GRID_STRIDE(i, n) {
        if (atomicMax(&mark[idx[i]], 1u) == 0u) c++;
    }
    if (c) atomicAdd(count, c);
}
