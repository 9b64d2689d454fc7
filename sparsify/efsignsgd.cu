// EF-SignSGD's passes (the efsignsgd method, efsignKernel), over one tensor
// x of d elements whose message starts at word j of this worker's words
// (send; recv holds every worker's, tw words each):
//   mode 0, n = ⌈d/4096⌉ blocks: part[b] = Σ|x[i]| over block b, in double,
//           in index order;
//   mode 1, n = 1: s = (float)(Σ_b part[b] / d), the blocks in order;
//           send[j] = s's bits;
//   mode 2, n = ⌈d/32⌉ words: send[j+1+w] = the sign bits of x[32w..32w+32)
//           (bit k set when element 32w+k is negative);
//   mode 3, n = d: out[i] = (Σ_p ±s_p, in rank order from 0) · inv, with
//           s_p and the sign from worker p's message; res[i] = x[i] ∓ s,
//           s this worker's scale (res may be x);
//   mode 4, n = d: out[i] = x[i] · inv, res[i] = 0 (a 1-D tensor's sum).
extern "C" __global__ void k_efsign(const float* x, int* send, const int* recv, float* out, float* res, double* part, i64 n, i64 d, int j, int tw, int nw, float inv, int mode) {
    GRID_STRIDE(i, n) {
        if (mode == 0) {
            double s = 0;
            i64 hi = (i + 1) * 4096 < d ? (i + 1) * 4096 : d;
            for (i64 k = i * 4096; k < hi; k++) s += fabs((double)x[k]);
            part[i] = s;
        } else if (mode == 1) {
            double s = 0;
            i64 nb = (d + 4095) / 4096;
            for (i64 b = 0; b < nb; b++) s += part[b];
            float sc = d > 0 ? (float)(s / (double)d) : 0.0f;
            send[j] = (int)__float_as_uint(sc);
        } else if (mode == 2) {
            u32 u = 0;
            i64 lo = 32 * i;
            for (int k = 0; k < 32 && lo + k < d; k++) {
                if (x[lo + k] < 0) u |= 1u << k;
            }
            send[j + 1 + i] = (int)u;
        } else if (mode == 3) {
            float o = 0.0f;
            for (int p = 0; p < nw; p++) {
                const int* msg = recv + (i64)p * tw + j;
                float s = __uint_as_float((u32)msg[0]);
                u32 u = (u32)msg[1 + i / 32];
                o += (u >> (i % 32)) & 1u ? -s : s;
            }
            out[i] = o * inv;
            float s = __uint_as_float((u32)send[j]);
            float a = x[i];
            res[i] = a < 0 ? a + s : a - s;
        } else {
            out[i] = x[i] * inv;
            res[i] = 0.0f;
        }
    }
}
