// DEFT's plan on the device (deft.go: deftPlan, deftCommon): the
// fragments' budgets by the authors' allocation, computed exactly, the
// leader's bins by LPT, this worker's bin as a list of segments for
// TopKSegmentsOn and the common fragments' indices, with no host in
// between.
//
// plan (int32) is laid out as DEFT_* below for L fragments and nw workers:
// the header (status: 0, or 1 when this worker's sums are not finite, 2
// when the leader's are not; the bin's selected count; the common
// fragments' elements; their number C), this worker's budgets, the
// leader's, a sort's scratch, the leader's bins (deftPack's content: the
// bins' fragments in bin order, then the common list), the bins' lengths,
// the common fragments' starts in the union's common part (C + 1), and the
// list of this worker's bin (its number of segments, then lo, hi and the
// budget of each).
#define DEFT_KF_OWN 4
#define DEFT_KF_LEAD(L) (4 + (L))
#define DEFT_ORDER(L) (4 + 2 * (L))
#define DEFT_CONTENT(L) (4 + 3 * (L))
#define DEFT_LENS(L) (4 + 4 * (L))
#define DEFT_CSTART(L, nw) (4 + 4 * (L) + (nw))
#define DEFT_LIST(L, nw) (5 + 5 * (L) + (nw))

// A norm as an integer: every double is a multiple of 2^-1074, the least
// subnormal, so norm·2^1074 is an integer below 2^2098; the sums of up to
// 2^31 of them times a budget below 2^32 fit in DEFT_LIMBS 32-bit limbs.
#define DEFT_LIMBS 70

// The limbs a call works on are [lo, hi): those the norms that occur span
// and the few above that their sums times a budget reach (deft_span); the
// others stay 0.
__device__ void deft_big_set(u32* a, double v, int lo, int hi) {
    for (int i = lo; i < hi; i++) a[i] = 0u;
    if (!(v > 0.0)) return;
    u64 b = (u64)__double_as_longlong(v);
    u64 e = (b >> 52) & 0x7ffull, m = b & 0xfffffffffffffull;
    int sh = 0;
    if (e != 0) {
        m |= 1ull << 52;
        sh = (int)e - 1;
    }
    int limb = sh / 32, off = sh % 32;
    u64 rest = off ? m >> (32 - off) : m >> 32;
    a[limb] = (u32)(m << off);
    a[limb + 1] = (u32)rest;
    a[limb + 2] = (u32)(rest >> 32);
}

__device__ void deft_big_add(u32* a, const u32* b, int lo, int hi) {
    u64 c = 0;
    for (int i = lo; i < hi; i++) {
        c += (u64)a[i] + b[i];
        a[i] = (u32)c;
        c >>= 32;
    }
}

// a −= b, b <= a.
__device__ void deft_big_sub(u32* a, const u32* b, int lo, int hi) {
    u64 borrow = 0;
    for (int i = lo; i < hi; i++) {
        u64 d = (u64)a[i] - b[i] - borrow;
        a[i] = (u32)d;
        borrow = (d >> 63) & 1ull;
    }
}

// out = a·s.
__device__ void deft_big_mul(u32* out, const u32* a, u32 s, int lo, int hi) {
    u64 c = 0;
    for (int i = lo; i < hi; i++) {
        c += (u64)a[i] * s;
        out[i] = (u32)c;
        c >>= 32;
    }
}

__device__ int deft_big_cmp(const u32* a, const u32* b, int lo, int hi) {
    for (int i = hi - 1; i >= lo; i--) {
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    }
    return 0;
}

// A non-zero a as top·2^(32·(*at − 2)), top its three highest limbs.
__device__ double deft_big_top(const u32* a, int lo, int hi, int* at) {
    int i = hi - 1;
    while (i > lo && a[i] == 0u) i--;
    double t = (double)a[i];
    for (int j = i - 1; j >= i - 2; j--) t = t * 4294967296.0 + (j >= lo ? (double)a[j] : 0.0);
    *at = i;
    return t;
}

// The limbs [*lo, *hi) the norms' integers and the products of their sums
// (up to 2^31 of them) by a budget (below 2^32) occupy.
__device__ void deft_span(const double* nrm, int L, int* lo, int* hi) {
    int a = DEFT_LIMBS, b = 0;
    for (int f = 0; f < L; f++) {
        if (!(nrm[f] > 0.0)) continue;
        u64 e = ((u64)__double_as_longlong(nrm[f]) >> 52) & 0x7ffull;
        int sh = e != 0 ? (int)e - 1 : 0;
        a = sh / 32 < a ? sh / 32 : a;
        b = sh / 32 + 3 > b ? sh / 32 + 3 : b;
    }
    if (a > b) a = b = 0; // no positive norm
    *lo = a;
    *hi = b + 2 < DEFT_LIMBS ? b + 2 : DEFT_LIMBS;
}

// order = the fragments in descending norm, ties higher fragment first,
// by rank (the block's threads).
__device__ void deft_rank_norms(const double* nrm, int L, int* order) {
    for (int f = threadIdx.x; f < L; f += blockDim.x) {
        int r = 0;
        double v = nrm[f];
        for (int g = 0; g < L; g++) r += nrm[g] > v || (nrm[g] == v && g > f);
        order[r] = f;
    }
}

// DEFT's budgets kf of the L fragments (bounds) from their norms nrm, in
// order, for a global budget k: deftAllocator.allocate (one thread). The
// share ⌊remain·w_f/rem⌋ is estimated in float64 and corrected by exact
// comparisons of multi-limb integers (rem the exact sum of the norms not
// yet visited).
__device__ void deft_alloc(const double* nrm, const int* bounds, int L, i64 k, const int* order, int* kf) {
    int lo, hi;
    deft_span(nrm, L, &lo, &hi);
    u32 rem[DEFT_LIMBS], w[DEFT_LIMBS], a[DEFT_LIMBS], b[DEFT_LIMBS], c[DEFT_LIMBS];
    for (int i = lo; i < hi; i++) rem[i] = 0u;
    for (int f = 0; f < L; f++) {
        if (nrm[f] > 0.0) {
            deft_big_set(w, nrm[f], lo, hi);
            deft_big_add(rem, w, lo, hi);
        }
    }
    i64 remain = k;
    for (int i = 0; i < L; i++) {
        int f = order[i];
        i64 size = (i64)bounds[f + 1] - bounds[f];
        if (size == 0) {
            kf[f] = 0;
            continue;
        }
        i64 t = 0;
        deft_big_set(w, nrm[f], lo, hi);
        if (remain > 0 && nrm[f] > 0.0) {
            int iw, ir;
            double tw = deft_big_top(w, lo, hi, &iw), tr = deft_big_top(rem, lo, hi, &ir);
            double q = tw / tr;
            for (int d = iw - ir; d < 0 && q > 0.0; d++) q = q * 2.3283064365386963e-10; // 2^-32
            double est = q * (double)remain;
            t = est < 0.0 ? 0 : (est > (double)remain ? remain : (i64)est);
            deft_big_mul(b, w, (u32)remain, lo, hi); // remain·w_f
            deft_big_mul(a, rem, (u32)t, lo, hi);    // t·rem
            while (t > 0 && deft_big_cmp(a, b, lo, hi) > 0) {
                t--;
                deft_big_sub(a, rem, lo, hi);
            }
            while (t < remain) {
                for (int q2 = lo; q2 < hi; q2++) c[q2] = a[q2];
                deft_big_add(c, rem, lo, hi);
                if (deft_big_cmp(c, b, lo, hi) > 0) break;
                t++;
                for (int q2 = lo; q2 < hi; q2++) a[q2] = c[q2];
            }
        }
        i64 v = size < t ? size : (t > 1 ? t : 1);
        kf[f] = (int)v;
        remain -= v;
        deft_big_sub(rem, w, lo, hi);
    }
}

// deftLog2 of deft.go: Go's math.Log2 of a number >= 2 written out in
// plain arithmetic (its Frexp, and its Log as Go's pure-Go code computes
// it), so that both sides compute the same bits.
__device__ double deft_frexp(double x, int* e) {
    u64 b = (u64)__double_as_longlong(x);
    *e = (int)((b >> 52) & 0x7ffull) - 1022;
    return __longlong_as_double((long long)((b & 0x800fffffffffffffull) | (1022ull << 52)));
}

__device__ double deft_log2(double x) {
    int exp;
    double frac = deft_frexp(x, &exp);
    if (frac == 0.5) return (double)(exp - 1);
    double f1 = frac;
    int ki = 0;
    if (f1 < 0.70710678118654757) {
        f1 *= 2.0;
        ki--;
    }
    double f = f1 - 1.0, kk = (double)ki;
    double s = f / (2.0 + f);
    double s2 = s * s;
    double s4 = s2 * s2;
    double t1 = s2 * (6.666666666666735130e-01 + s4 * (2.857142874366239149e-01 + s4 * (1.818357216161805012e-01 + s4 * 1.479819860511658591e-01)));
    double t2 = s4 * (3.999999999940941908e-01 + s4 * (2.222219843214978396e-01 + s4 * 1.531383769920937332e-01));
    double R = t1 + t2;
    double hfsq = 0.5 * f * f;
    double ln = kk * 6.93147180369123816490e-01 - ((hfsq - (s * (hfsq + R) + kk * 1.90821492927058770002e-10)) - f);
    return ln * 1.4426950408889634 + (double)exp;
}

// The LPT packing of deftPack from the leader's budgets kf: costs and
// their descending order (stable) by the block's threads, then one thread
// fills the bins, content and lens. order and bin are L ints of scratch.
__device__ void deft_pack(const int* bounds, const int* kf, int L, int nw, int* order, int* bin, double* cost, double* loads, int* content, int* lens) {
    for (int f = threadIdx.x; f < L; f += blockDim.x) {
        i64 size = (i64)bounds[f + 1] - bounds[f];
        cost[f] = kf[f] > 1 ? (double)size * deft_log2((double)kf[f]) : (double)size;
    }
    __syncthreads();
    for (int f = threadIdx.x; f < L; f += blockDim.x) {
        int r = 0;
        double v = cost[f];
        for (int g = 0; g < L; g++) r += cost[g] > v || (cost[g] == v && g < f);
        order[r] = f;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int b = 0; b < nw; b++) {
        loads[b] = 0.0;
        lens[b] = 0;
    }
    int C = 0;
    for (int i = 0; i < L; i++) { // each fragment's bin, −1 for common
        int f = order[i];
        if (kf[f] == bounds[f + 1] - bounds[f]) {
            bin[f] = -1;
            C++;
            continue;
        }
        int b = 0;
        for (int j = 1; j < nw; j++) {
            if (loads[j] < loads[b]) b = j;
        }
        bin[f] = b;
        lens[b]++;
        loads[b] = loads[b] + cost[f];
    }
    // The bins in order, then the common list, each in LPT order: lens
    // become the bins' cursors in loads' storage.
    int* at = (int*)loads;
    int pos = 0;
    for (int b = 0; b < nw; b++) {
        at[b] = pos;
        pos += lens[b];
    }
    for (int i = 0; i < L; i++) {
        int f = order[i];
        content[bin[f] < 0 ? pos++ : at[bin[f]]++] = f;
    }
}

// The plan (n = 1: one block): the norms (square roots of ss when sq is
// 1, ss itself when 0), this worker's budgets from ss[0, L), the leader's
// from ss[L, 2L) when lead is 1 (else this worker's are the leader's), the
// leader's bins, bin (cycle + rank) mod nw as the list, the common
// fragments' starts, and the header. wk is 3L + nw doubles of scratch. The
// block's threads rank and compute costs; one runs the greedy parts.
extern "C" __global__ void k_deft_plan(const double* ss, const int* bounds, i64 n, int L, i64 k, int nw, int rank, int cycle, int lead, int sq, double* wk, int* plan) {
    (void)n;
    if (blockIdx.x != 0) return;
    __shared__ int deft_bad[2];
    int* list = plan + DEFT_LIST(L, nw);
    if (threadIdx.x == 0) deft_bad[0] = deft_bad[1] = 0;
    __syncthreads();
    double* nrm = wk;
    for (int f = threadIdx.x; f < (lead ? 2 * L : L); f += blockDim.x) {
        double v = sq ? sqrt(ss[f]) : ss[f];
        if (v != v || v - v != 0.0) deft_bad[f < L ? 0 : 1] = 1;
        nrm[f] = v;
    }
    __syncthreads();
    if (deft_bad[0] || deft_bad[1]) {
        if (threadIdx.x == 0) {
            plan[0] = deft_bad[0] ? 1 : 2;
            plan[1] = plan[2] = plan[3] = 0;
            list[0] = 0;
        }
        return;
    }
    int* kfo = plan + DEFT_KF_OWN;
    int* kfl = plan + DEFT_KF_LEAD(L);
    int* order = plan + DEFT_ORDER(L);
    int* content = plan + DEFT_CONTENT(L);
    int* lens = plan + DEFT_LENS(L);
    int* cs = plan + DEFT_CSTART(L, nw);
    deft_rank_norms(nrm, L, order);
    __syncthreads();
    if (threadIdx.x == 0) deft_alloc(nrm, bounds, L, k, order, kfo);
    __syncthreads();
    if (lead) {
        deft_rank_norms(nrm + L, L, order);
        __syncthreads();
        if (threadIdx.x == 0) deft_alloc(nrm + L, bounds, L, k, order, kfl);
    } else {
        for (int f = threadIdx.x; f < L; f += blockDim.x) kfl[f] = kfo[f];
    }
    __syncthreads();
    // The bins of each fragment in the list's storage (3L words, free
    // until the list is written).
    deft_pack(bounds, kfl, L, nw, order, list + 1, wk + 2 * L, wk + 3 * L, content, lens);
    if (threadIdx.x != 0) return;
    int mine = (cycle + rank) % nw, start = 0, total = 0;
    for (int b = 0; b < nw; b++) {
        if (b == mine) start = total;
        total += lens[b];
    }
    int count = 0;
    list[0] = lens[mine];
    for (int j = 0; j < lens[mine]; j++) {
        int f = content[start + j];
        list[1 + 3 * j] = bounds[f];
        list[2 + 3 * j] = bounds[f + 1];
        list[3 + 3 * j] = kfo[f];
        count += kfo[f];
    }
    int pre = 0;
    for (int j = 0; j < L - total; j++) {
        int f = content[total + j];
        cs[j] = pre;
        pre += bounds[f + 1] - bounds[f];
    }
    cs[L - total] = pre;
    plan[0] = 0;
    plan[1] = count;
    plan[2] = pre;
    plan[3] = L - total;
}

// The common fragments' indices (n = their elements, plan[2]): idx[i] =
// the i-th, the fragments in the common list's order.
extern "C" __global__ void k_deft_common(const int* plan, const int* bounds, i64 n, int L, int nw, int* idx) {
    GRID_STRIDE(i, n) {
        int C = plan[3];
        const int* cs = plan + DEFT_CSTART(L, nw);
        const int* common = plan + DEFT_CONTENT(L) + (L - C);
        int lo = 0, hi = C - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (cs[mid] <= i) lo = mid; else hi = mid - 1;
        }
        idx[i] = bounds[common[lo]] + (int)(i - cs[lo]);
    }
}
