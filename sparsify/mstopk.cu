// MSTopk's statistics of |x| (the mstopk method, mstopkKernel): over
// block b of 4096 elements (n = ⌈d/4096⌉ blocks), part[2b] = Σ|x[i]| in
// double, in index order, and part[2b+1] = max |x[i]| (NaN when an element
// is NaN, as Go's max).
extern "C" __global__ void k_mstopk(const float* x, double* part, i64 n, i64 d) {
    GRID_STRIDE(b, n) {
        double s = 0, m = 0;
        i64 hi = (b + 1) * 4096 < d ? (b + 1) * 4096 : d;
        for (i64 i = b * 4096; i < hi; i++) {
            double a = fabs((double)x[i]);
            s += a;
            if (a != a || m != m) {
                m = a != a ? a : m;
            } else if (a > m) {
                m = a;
            }
        }
        part[2 * b] = s;
        part[2 * b + 1] = m;
    }
}

// ---- MSTopk's selection on the device (mstopk.go's selectDevice) -------
//
// The search's state is kept in st (Float64): st[0] the mean, st[1] the
// maximum, then two copies of a round's state S = {l, r, k1, thres1, k2,
// thres2} (S_j at MSTOPK_S + 6·(j mod 2)), st[14] thres1 as reported (NaN
// when k1 is 0) and st[15] the selection's count, which the host reads.
#define MSTOPK_S 2
#define MSTOPK_THRES1 14
#define MSTOPK_COUNT 15
#define MSTOPK_CHUNK 256

// Products and sums in double are rounded one by one (no fused
// multiply-add), as Go computes them.
#ifdef __CUDA_ARCH__
#define MSTOPK_MUL(a, b) __dmul_rn((a), (b))
#define MSTOPK_ADD(a, b) __dadd_rn((a), (b))
#else
#define MSTOPK_MUL(a, b) ((a) * (b))
#define MSTOPK_ADD(a, b) ((a) + (b))
#endif

// The smallest float >= t (atLeast32): for a float a, a >= t exactly when
// a >= mstopk_at_least(t).
__device__ __forceinline__ float mstopk_at_least(double t) {
    float f = (float)t;
    if ((double)f < t) {
        u32 u = __float_as_uint(f);
        if (f == 0.0f) {
            u = 1u;
        } else if (f > 0.0f) {
            u++;
        } else {
            u--;
        }
        f = __uint_as_float(u);
    }
    return f;
}

// A round's threshold from its state (mstopkState.threshold).
__device__ __forceinline__ double mstopk_threshold(const double* s, double mean, double mx) {
    double ratio = MSTOPK_ADD(s[0], MSTOPK_MUL(MSTOPK_ADD(s[1], -s[0]), 0.5));
    return MSTOPK_ADD(mean, MSTOPK_MUL(ratio, MSTOPK_ADD(mx, -mean)));
}

// out = the state after the round of state s counted nnz (mstopkState.update).
__device__ void mstopk_update(double* out, const double* s, double mean, double mx, double nnz, double k) {
    double ratio = MSTOPK_ADD(s[0], MSTOPK_MUL(MSTOPK_ADD(s[1], -s[0]), 0.5));
    double t = MSTOPK_ADD(mean, MSTOPK_MUL(ratio, MSTOPK_ADD(mx, -mean)));
    for (int q = 0; q < 6; q++) out[q] = s[q];
    if (nnz <= k) {
        out[1] = ratio;
        if (nnz > s[2]) {
            out[2] = nnz;
            out[3] = t;
        }
    } else {
        out[0] = ratio;
        if (nnz < s[4]) {
            out[4] = nnz;
            out[5] = t;
        }
    }
}

// The mean and the maximum from the blocks' statistics (k_mstopk's part,
// nb blocks of d elements, added in block order; one thread, n = 1), the
// first round's state and the rounds' counters cnt[0..rounds) zeroed.
extern "C" __global__ void k_mstopk_init(const double* part, double* st, u32* cnt, i64 n, i64 nb, i64 d, int rounds) {
    GRID_STRIDE(g, n) {
        (void)g;
        double sum = 0, mx = 0;
        for (i64 b = 0; b < nb; b++) {
            sum += part[2 * b];
            double m = part[2 * b + 1];
            if (m != m || mx != mx) {
                mx = m != m ? m : mx;
            } else if (m > mx) {
                mx = m;
            }
        }
        st[0] = sum / (double)d;
        st[1] = mx;
        double* s = st + MSTOPK_S;
        s[0] = 0;
        s[1] = 1;
        s[2] = 0;
        s[3] = __longlong_as_double(0x7ff0000000000000ll);
        s[4] = (double)(d + 1);
        s[5] = __longlong_as_double((long long)0xfff0000000000000ull);
        for (int r = 0; r < rounds; r++) cnt[r] = 0u;
    }
}

// Round r of the search over the d elements of x, n threads: the state
// S_r (from S_{r−1} and its count, which thread 0 writes; S_0 as
// k_mstopk_init left it), its threshold t and cnt[r] += #{|x| >= t}.
extern "C" __global__ void k_mstopk_count(const float* x, double* st, u32* cnt, i64 n, i64 d, int r, i64 k) {
    GRID_STRIDE(g, n) {
        double s[6];
        const double* prev = st + MSTOPK_S + 6 * ((r + 1) % 2);
        if (r == 0) {
            for (int q = 0; q < 6; q++) s[q] = st[MSTOPK_S + q];
        } else {
            mstopk_update(s, prev, st[0], st[1], (double)cnt[r - 1], (double)k);
            if (g == 0) {
                for (int q = 0; q < 6; q++) st[MSTOPK_S + 6 * (r % 2) + q] = s[q];
            }
        }
        float t = mstopk_at_least(mstopk_threshold(s, st[0], st[1]));
        u32 c = 0u;
        for (i64 i = g; i < d; i += n) {
            if (fabsf(x[i]) >= t) c++;
        }
        if (c) atomicAdd(&cnt[r], c);
    }
}

// After the last of rounds rounds (one thread, n = 1): the final state
// S_rounds and thr[0] = atLeast32(thres2), the candidates' bound.
extern "C" __global__ void k_mstopk_final(double* st, const u32* cnt, float* thr, i64 n, int rounds, i64 k) {
    GRID_STRIDE(g, n) {
        (void)g;
        double s[6];
        mstopk_update(s, st + MSTOPK_S + 6 * ((rounds + 1) % 2), st[0], st[1], (double)cnt[rounds - 1], (double)k);
        for (int q = 0; q < 6; q++) st[MSTOPK_S + 6 * (rounds % 2) + q] = s[q];
        thr[0] = mstopk_at_least(s[5]);
    }
}

// c1[c] = the elements of chunk c of list (MSTOPK_CHUNK entries of the
// m[0] indices of x at or above thres2) at or above thres1, S at slot
// (0 or 1), for every chunk c < n.
extern "C" __global__ void k_mstopk_class(const float* x, const int* list, const int* m, const double* st, int slot, int* c1, i64 n) {
    GRID_STRIDE(c, n) {
        i64 lo = c * MSTOPK_CHUNK, hi = lo + MSTOPK_CHUNK < m[0] ? lo + MSTOPK_CHUNK : m[0];
        double t1 = st[MSTOPK_S + 6 * slot + 3];
        int q = 0;
        for (i64 j = lo; j < hi; j++) {
            if ((double)fabsf(x[list[j]]) >= t1) q++;
        }
        if (lo < hi) c1[c] = q;
    }
}

// A 128-bit unsigned integer; arithmetic wraps.
struct mstopk_u128 {
    u64 hi, lo;
};

// SplitMix64's output function (sampMix).
__device__ __forceinline__ u64 mstopk_mix(u64 z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// math/rand/v2's PCG.Uint64: the state advanced, its DXSM output.
__device__ __forceinline__ u64 mstopk_pcg(mstopk_u128* p) {
    const u64 mulHi = 2549297995355413924ull, mulLo = 4865540595714422341ull;
    const u64 incHi = 6364136223846793005ull, incLo = 1442695040888963407ull;
    u64 lo = p->lo * mulLo;
    u64 hi = __umul64hi(p->lo, mulLo) + p->hi * mulLo + p->lo * mulHi;
    u64 l2 = lo + incLo;
    hi = hi + incHi + (l2 < lo ? 1 : 0);
    p->lo = l2;
    p->hi = hi;
    hi ^= hi >> 32;
    hi *= 0xda942042e4dd58b5ull;
    hi ^= hi >> 48;
    hi *= (l2 | 1);
    return hi;
}

// math/rand/v2's Rand.IntN(n) over the PCG p (n > 0).
__device__ __forceinline__ u64 mstopk_intn(mstopk_u128* p, u64 n) {
    if ((n & (n - 1)) == 0) return mstopk_pcg(p) & (n - 1);
    u64 x = mstopk_pcg(p);
    u64 hi = __umul64hi(x, n), lo = x * n;
    if (lo < n) {
        u64 thresh = (0 - n) % n;
        while (lo < thresh) {
            x = mstopk_pcg(p);
            hi = __umul64hi(x, n);
            lo = x * n;
        }
    }
    return hi;
}

// The draw (mstopkDraw; one thread, n = 1): with K1 = Σ c1 the list's
// elements at or above thres1 and M2 = m[0] − K1 the candidates, RandomK's
// k − K1 of M2 (Floyd's algorithm on the PCG seeded as mstopkDraw seeds it)
// marked in bits by candidate rank; c1 becomes its exclusive prefix sums
// and off[c] is where chunk c's selected indices start. st gets thres1 as
// reported and the count, K1 plus the draws.
extern "C" __global__ void k_mstopk_draw(double* st, int slot, const int* m, int* c1, int* off, u32* bits, i64 n, i64 k, i64 seed) {
    GRID_STRIDE(g, n) {
        (void)g;
        const double* s = st + MSTOPK_S + 6 * slot;
        i64 mm = m[0], nc = (mm + MSTOPK_CHUNK - 1) / MSTOPK_CHUNK, K1 = 0;
        for (i64 c = 0; c < nc; c++) {
            int q = c1[c];
            c1[c] = (int)K1;
            K1 += q;
        }
        i64 M2 = mm - K1, kk = k - K1;
        kk = kk < 0 ? 0 : (kk > M2 ? M2 : kk);
        i64 words = (M2 + 31) / 32;
        for (i64 w = 0; w < words; w++) bits[w] = kk == M2 ? 0xffffffffu : 0u;
        if (kk > 0 && kk < M2) {
            u64 z = (u64)seed ^ (u64)__double_as_longlong(s[5]) ^ ((u64)s[2] << 40);
            mstopk_u128 p = {mstopk_mix(z), 0x9e3779b97f4a7c15ull};
            for (i64 j = M2 - kk; j < M2; j++) {
                i64 t = (i64)mstopk_intn(&p, (u64)(j + 1));
                if (bits[t >> 5] & (1u << (t & 31))) t = j;
                bits[t >> 5] |= 1u << (t & 31);
            }
        }
        i64 o = 0;
        for (i64 c = 0; c < nc; c++) {
            off[c] = (int)o;
            i64 lo = c * MSTOPK_CHUNK, hi = lo + MSTOPK_CHUNK < mm ? lo + MSTOPK_CHUNK : mm;
            i64 p1 = c1[c], p2 = c + 1 < nc ? c1[c + 1] : K1;
            o += p2 - p1;
            for (i64 q = lo - p1; q < hi - p2; q++) {
                if (bits[q >> 5] & (1u << (q & 31))) o++;
            }
        }
        st[MSTOPK_THRES1] = s[2] == 0 ? __longlong_as_double(0x7ff8000000000000ll) : s[3];
        st[MSTOPK_COUNT] = (double)o;
    }
}

// The selection, ascending, into sel (at most capacity indices): chunk c
// of the list (n chunks) writes from off[c] its elements at or above
// thres1 and its candidates marked in bits.
extern "C" __global__ void k_mstopk_write(const float* x, const int* list, const int* m, const double* st, int slot, const int* c1, const int* off, const u32* bits, int* sel, i64 n, i64 capacity) {
    GRID_STRIDE(c, n) {
        i64 lo = c * MSTOPK_CHUNK, hi = lo + MSTOPK_CHUNK < m[0] ? lo + MSTOPK_CHUNK : m[0];
        if (lo >= hi) continue;
        double t1 = st[MSTOPK_S + 6 * slot + 3];
        i64 p1 = c1[c], o = off[c];
        for (i64 j = lo; j < hi; j++) {
            int i = list[j];
            bool take;
            if ((double)fabsf(x[i]) >= t1) {
                take = true;
                p1++;
            } else {
                i64 q = j - p1;
                take = (bits[q >> 5] & (1u << (q & 31))) != 0;
            }
            if (take) {
                if (o < capacity) sel[o] = i;
                o++;
            }
        }
    }
}
