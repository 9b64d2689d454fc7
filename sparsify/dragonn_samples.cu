// DRAGONN's sample positions drawn on the device (the dragonn method,
// dragonnDraw): math/rand/v2's Rand.IntN over a PCG.

// A 128-bit unsigned integer; arithmetic wraps.
struct dragonn_u128 {
    u64 hi, lo;
};

__device__ __forceinline__ dragonn_u128 dragonn_mul128(dragonn_u128 a, dragonn_u128 b) {
    dragonn_u128 r;
    r.lo = a.lo * b.lo;
    r.hi = __umul64hi(a.lo, b.lo) + a.hi * b.lo + a.lo * b.hi;
    return r;
}

__device__ __forceinline__ dragonn_u128 dragonn_add128(dragonn_u128 a, dragonn_u128 b) {
    dragonn_u128 r;
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo ? 1 : 0);
    return r;
}

// dragonn_jump sets (*A, *C) to the map of n steps of the PCG's LCG
// s <- a*s + c: s <- A*s + C.
__device__ void dragonn_jump(u64 n, dragonn_u128* A, dragonn_u128* C) {
    dragonn_u128 mul = {2549297995355413924ull, 4865540595714422341ull};
    dragonn_u128 inc = {6364136223846793005ull, 1442695040888963407ull};
    dragonn_u128 am = {0, 1}, ai = {0, 0};
    dragonn_u128 one = {0, 1};
    for (; n > 0; n >>= 1) {
        if (n & 1) {
            am = dragonn_mul128(am, mul);
            ai = dragonn_add128(dragonn_mul128(ai, mul), inc);
        }
        inc = dragonn_mul128(dragonn_add128(mul, one), inc);
        mul = dragonn_mul128(mul, mul);
    }
    *A = am;
    *C = ai;
}

// pos[j] = Rand.IntN(numel) of the (j+1)-th output of the PCG from state
// (hi, lo), for j < ns: a power of two masks the output, any other numel
// takes the high word of output·numel (Lemire's method). Where the low
// word falls in the rejected range (-numel mod numel, probability below
// numel/2^64) the CPU would draw again, shifting every later draw: *flag
// is set and the caller draws on the host instead. Each thread jumps to its
// first draw, then strides by the grid.
extern "C" __global__ void k_dragonn_samples(int* pos, i64 ns, i64 hi, i64 lo, i64 numel, int* flag) {
    i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (first >= ns) return;
    dragonn_u128 A, C, SA, SC;
    dragonn_jump((u64)first + 1, &A, &C);
    dragonn_jump((u64)blockDim.x * gridDim.x, &SA, &SC);
    dragonn_u128 s0 = {(u64)hi, (u64)lo};
    dragonn_u128 s = dragonn_add128(dragonn_mul128(A, s0), C);
    u64 n = (u64)numel;
    u64 thresh = (0 - n) % n;
    for (i64 j = first; j < ns; j += (i64)blockDim.x * gridDim.x) {
        u64 x = s.hi; // DXSM output of the advanced state
        x ^= x >> 32;
        x *= 0xda942042e4dd58b5ull;
        x ^= x >> 48;
        x *= (s.lo | 1);
        if ((n & (n - 1)) == 0) {
            pos[j] = (int)(x & (n - 1));
        } else {
            pos[j] = (int)__umul64hi(x, n);
            if (x * n < thresh) *flag = 1;
        }
        s = dragonn_add128(dragonn_mul128(SA, s), SC);
    }
}
