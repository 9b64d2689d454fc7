// LAGS' range check and count of the distinct indices a run of groups
// received (lagsDistinct), in one pass: an index idx[i] outside [0, lim)
// lowers *flag as k_range_flag does (rangeflag.cu) and becomes 0; one in
// range marks its element of mark with this call's epoch (marks only
// grow: an element marked in an earlier call holds a smaller epoch), and
// the first to mark an element counts it in count[j], j its group in the
// run's list (LAGS.runList: the number of groups, then start, end and k
// of each, ascending and adjacent).
extern "C" __global__ void k_lags_distinct(int* idx, i64 n, i64 lim, u64* flag, u32* mark, i64 epoch, u32* count, const int* list) {
    int S = list[0];
    u32 e = (u32)epoch;
    u32 c = 0u;
    int cj = 0;
    GRID_STRIDE(i, n) {
        int v = idx[i];
        if (v < 0 || (i64)v >= lim) {
            atomicMin(flag, ((u64)i << 32) | (u64)(u32)v);
            idx[i] = 0;
            continue;
        }
        if (atomicMax(&mark[v], e) < e) {
            int j = 0;
            while (j + 1 < S && v >= list[1 + 3 * (j + 1)]) j++;
            if (j != cj && c) {
                atomicAdd(&count[cj], c);
                c = 0u;
            }
            cj = j;
            c++;
        }
    }
    if (c) atomicAdd(&count[cj], c);
}
