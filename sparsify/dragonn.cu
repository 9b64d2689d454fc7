// DRAGONN's one-pass selection (the dragonn method, dragonnHash).

// MurmurHash3 x86_32 of the 4-byte little-endian index i (package
// sparsify's murmur3Index).
__device__ __forceinline__ u32 dragonn_rotl32(u32 x, int r) { return (x << r) | (x >> (32 - r)); }
__device__ u32 dragonn_murmur3(u32 i, u32 seed) {
    u32 k = i * 0xcc9e2d51u;
    k = dragonn_rotl32(k, 15);
    k *= 0x1b873593u;
    u32 h = seed ^ k;
    h = dragonn_rotl32(h, 13);
    h = h * 5u + 0xe6546b64u;
    h ^= 4u;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

// Every element of x whose magnitude key (its bits without the sign) is in
// [lo, +Inf's key] — |x_i| >= the threshold thr[0] and not NaN; lo is the
// threshold's key but at least 1, which keeps exact zeros out, and a NaN
// threshold selects nothing — goes, in the same pass, to slot murmur3(i,
// seed) mod m, which keeps the highest off + i + 1 (so a collision resolves
// as an insertion in ascending order does; off places the tensor in the
// vector its indices are of). The threshold is read where it is, on the
// device. No compaction of the candidates: the table is the only output.
extern "C" __global__ void k_dragonn_hash(const float* x, i64 n, const float* thr, int seed, u32* table, int m, i64 off) {
    float t = thr[0];
    u32 tk = __float_as_uint(t) & 0x7fffffffu;
    u32 lo = t != t ? 0xffffffffu : (tk > 1u ? tk : 1u);
    if (lo > 0x7f800000u) return;
    const u32* u = (const u32*)x;
    GRID_STRIDE(i, n) {
        u32 key = u[i] & 0x7fffffffu;
        if (key >= lo && key <= 0x7f800000u) {
            atomicMax(&table[dragonn_murmur3((u32)i, (u32)seed) % (u32)m], (u32)(off + i) + 1u);
        }
    }
}
