// DGC's momentum correction (the dgc method, dgcMomentum): with a = acc[i]
// (the velocity) and p = vel[i] (the previous masked velocity), vel[i] = a
// and res[i] = a + m·(a − p). res may be acc.
extern "C" __global__ void k_dgc_momentum(float* vel, float* res, const float* acc, i64 n, float m) {
    GRID_STRIDE(i, n) {
        float a = acc[i];
        float u = a - vel[i];
        vel[i] = a;
        res[i] = a + m * u;
    }
}

// DGC's selection decided on the device (dgcSelect). par holds 5 words per
// tensor (DGC_PAR): its range [lo, hi) of x, nsel, 1 when it was sampled
// whole (no adaptation round), and where its exact top-nsel starts. The
// thresholds of a tensor are t_0 = thr[j] (the sampled one) and t_{r+1} =
// t_r·0.8 (in float32, as the host's rounds made them), r < DGC_LEVELS.
#define DGC_PAR 5
#define DGC_LEVELS 11

// A threshold's magnitude key: NaN selects nothing, t <= 0 every number.
__device__ __forceinline__ u32 dgc_key(float t) { return t != t ? 0xffffffffu : (t > 0.0f ? __float_as_uint(t) : 0u); }

// hist[DGC_LEVELS·j + r] += the elements of tensor j whose magnitude is
// at least t_r and below t_q for every q < r (NaN: none): lanes threads
// per tensor, n = tensors·lanes.
extern "C" __global__ void k_dgc_count(const float* x, const int* par, const float* thr, i64 n, int lanes, u32* hist) {
    GRID_STRIDE(i, n) {
        i64 j = i / lanes;
        const int* p = par + DGC_PAR * j;
        u32 key[DGC_LEVELS], c[DGC_LEVELS];
        float t = thr[j];
        for (int r = 0; r < DGC_LEVELS; r++) {
            key[r] = dgc_key(t);
            c[r] = 0u;
            t = t * 0.8f;
        }
        const u32* u = (const u32*)x;
        for (i64 e = p[0] + i % lanes; e < p[1]; e += lanes) {
            u32 k = u[e] & 0x7fffffffu;
            if (k > 0x7f800000u || k < key[DGC_LEVELS - 1]) continue;
            int r = 0;
            while (k < key[r]) r++;
            c[r]++;
        }
        for (int r = 0; r < DGC_LEVELS; r++) {
            if (c[r]) atomicAdd(&hist[DGC_LEVELS * j + r], c[r]);
        }
    }
}

// The adaptation rounds of every tensor from its counts at each level (one
// thread, n = 1): from r = 0, the count m_r of |x| >= t_r; more than
// 1.3·nsel → its exact top-nsel, stop; more than nsel or at least 0.8·nsel
// → stop; otherwise the next level, up to DGC_LEVELS − 1 (a tensor sampled
// whole: level 0). thr[j] = the final threshold; res[j] = min(nsel, m),
// res[S + j] = where its indices start in the output, res[2S + j] = 1 for
// the exact top-nsel.
extern "C" __global__ void k_dgc_decide(const u32* hist, const int* par, float* thr, i64 n, i64 S, int* res) {
    GRID_STRIDE(g, n) {
        (void)g;
        int pos = 0;
        for (i64 j = 0; j < S; j++) {
            const int* p = par + DGC_PAR * j;
            u32 nsel = (u32)p[2];
            int last = p[3] ? 0 : DGC_LEVELS - 1, top = 0;
            float t = thr[j];
            u32 c = 0u;
            for (int r = 0;; r++) {
                c += hist[DGC_LEVELS * j + r];
                if (r == last) break;
                if (c > nsel) {
                    top = (double)c > 1.3 * (double)nsel;
                    break;
                }
                if (!((double)c < 0.8 * (double)nsel)) break;
                t = t * 0.8f;
            }
            thr[j] = t;
            int take = c < nsel ? (int)c : (int)nsel;
            res[j] = take;
            res[S + j] = pos;
            res[2 * S + j] = top;
            pos += take;
        }
    }
}

// idx[res[S + j] + e] = tensor j's e-th index, e < res[j]: its exact
// top-nsel's (top, from par's start) or its candidates' (cand, from lo),
// over n = Σ nsel (q: the tensor whose top-nsel holds slot q).
extern "C" __global__ void k_dgc_take(const int* cand, const int* top, const int* par, const int* res, i64 S, i64 n, int* idx) {
    GRID_STRIDE(q, n) {
        i64 lo = 0, hi = S - 1;
        while (lo < hi) {
            i64 mid = (lo + hi + 1) / 2;
            if (par[DGC_PAR * mid + 4] <= q) lo = mid; else hi = mid - 1;
        }
        const int* p = par + DGC_PAR * lo;
        i64 e = q - p[4];
        if (e < res[lo]) idx[res[S + lo] + e] = res[2 * S + lo] ? top[p[4] + e] : cand[p[0] + e];
    }
}
