// The project's CUDA kernels, compiled at run time by NVRTC (package cuda).
// Every kernel is extern "C" (unmangled names) and uses grid-stride loops,
// so any launch size covers any length. Element counts are long long.
// Formulas follow the CPU kernels of package ops; reductions that the CPU
// accumulates in float64 accumulate in double here too.

typedef long long i64;
typedef unsigned int u32;
typedef unsigned long long u64;

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

// ---- elementwise ----------------------------------------------------------

// Binary operations: 1 +, 2 −, 3 ×, 4 ÷, 5 ≥ (1 or 0), 6 > (1 or 0).
__device__ __forceinline__ float binop(int op, float a, float b) {
    switch (op) {
    case 1: return a + b;
    case 2: return a - b;
    case 3: return a * b;
    case 4: return a / b;
    case 5: return a >= b ? 1.0f : 0.0f;
    case 6: return a > b ? 1.0f : 0.0f;
    }
    return __int_as_float(0x7fc00000);
}

// y = a op b; sa (sb) marks a (b) as a scalar applied to every element.
extern "C" __global__ void k_binary(int op, const float* a, const float* b, float* y, i64 n, int sa, int sb) {
    GRID_STRIDE(i, n) {
        float x = sa ? a[0] : a[i];
        float z = sb ? b[0] : b[i];
        y[i] = binop(op, x, z);
    }
}

// σ with Gorgonia's float32 cut-offs, the core evaluated in double.
__device__ __forceinline__ float sigmoidf_g(float v) {
    return v < -88.0f ? 0.0f : (v > 15.0f ? 1.0f : (float)(1.0 / (1.0 + exp(-(double)v))));
}

// Elementwise functions: 1 neg, 2 sigmoid, 3 tanh, 4 softplus (Gorgonia's
// float32 cut-offs, the core evaluated in double).
extern "C" __global__ void k_unary(int fn, const float* x, float* y, i64 n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float r;
        switch (fn) {
        case 1: r = -v; break;
        case 2: r = sigmoidf_g(v); break;
        case 3: r = tanhf(v); break;
        case 4: r = v < -103.0f ? 0.0f : (v > 14.0f ? v : (float)log1p(exp((double)v))); break;
        default: r = __int_as_float(0x7fc00000);
        }
        y[i] = r;
    }
}

extern "C" __global__ void k_add_relu(const float* a, const float* b, float* y, i64 n) {
    GRID_STRIDE(i, n) { y[i] = fmaxf(a[i] + b[i], 0.0f); }
}

extern "C" __global__ void k_relu_grad(const float* y, const float* dy, float* dx, i64 n) {
    GRID_STRIDE(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

// ---- LSTM cell (ops.LSTMCell, ops.LSTMCellGrad) ------------------------------
// One thread per element (b, j) of the B×H state reads the four gates of
// its unit: G[b][q·H + j] = x + hw for q = i, f, g, o. p holds ten planes
// of B×H values: h', c', i, f, g, o, tanh(c'), and the pre-activations of
// i, f and o.

extern "C" __global__ void k_lstm_cell(const float* x, const float* hw, const float* c, float* p, i64 B, i64 H) {
    i64 n = B * H;
    GRID_STRIDE(k, n) {
        i64 b = k / H, j = k % H, row = b * 4 * H + j;
        float gi = x[row] + hw[row], gf = x[row + H] + hw[row + H];
        float gg = x[row + 2 * H] + hw[row + 2 * H], go = x[row + 3 * H] + hw[row + 3 * H];
        float i = sigmoidf_g(gi), f = sigmoidf_g(gf), g = tanhf(gg), o = sigmoidf_g(go);
        float cn = f * c[k] + i * g;
        float t = tanhf(cn);
        p[k] = o * t;
        p[n + k] = cn;
        p[2 * n + k] = i;
        p[3 * n + k] = f;
        p[4 * n + k] = g;
        p[5 * n + k] = o;
        p[6 * n + k] = t;
        p[7 * n + k] = gi;
        p[8 * n + k] = gf;
        p[9 * n + k] = go;
    }
}

// The gradient: from p, the cell's input c and dp (planes 0 and 1: the
// gradients of h' and c'), d holds dG [B 4H] and then dc [B H]. σ'(x) is
// σ(x)·σ(−x), tanh'(x) is 1 − tanh(x)², as on the CPU.
extern "C" __global__ void k_lstm_cell_grad(const float* p, const float* c, const float* dp, float* d, i64 B, i64 H) {
    i64 n = B * H;
    GRID_STRIDE(k, n) {
        i64 b = k / H, j = k % H, row = b * 4 * H + j;
        float i = p[2 * n + k], f = p[3 * n + k], g = p[4 * n + k], o = p[5 * n + k], t = p[6 * n + k];
        float dh = dp[k];
        float dcn = dp[n + k] + (1.0f - t * t) * (dh * o);
        d[row] = (i * sigmoidf_g(-p[7 * n + k])) * (dcn * g);
        d[row + H] = (f * sigmoidf_g(-p[8 * n + k])) * (dcn * c[k]);
        d[row + 2 * H] = (1.0f - g * g) * (dcn * i);
        d[row + 3 * H] = (o * sigmoidf_g(-p[9 * n + k])) * (dh * t);
        d[4 * n + k] = dcn * f;
    }
}

// ---- layout ---------------------------------------------------------------

// y[o][r][i] = x[o][i] for r < reps (broadcasting an axis of size 1).
extern "C" __global__ void k_broadcast(const float* x, float* y, i64 outer, i64 reps, i64 inner) {
    i64 n = outer * reps * inner;
    GRID_STRIDE(t, n) {
        i64 i = t % inner;
        i64 o = t / (reps * inner);
        y[t] = x[o * inner + i];
    }
}

// y[o][j] = x[o][start*inner + j] for j < w (a slice along an axis).
extern "C" __global__ void k_slice(const float* x, float* y, i64 outer, i64 axis, i64 inner, i64 start, i64 w) {
    i64 n = outer * w;
    GRID_STRIDE(t, n) {
        i64 o = t / w, j = t % w;
        y[t] = x[o * axis * inner + start * inner + j];
    }
}

// y zero except y[o][start*inner + j] = g[o][j] (a slice's gradient).
extern "C" __global__ void k_slice_incr(const float* g, float* y, i64 outer, i64 axis, i64 inner, i64 start, i64 end) {
    i64 n = outer * axis * inner;
    GRID_STRIDE(t, n) {
        i64 o = t / (axis * inner), r = t % (axis * inner);
        i64 a = r / inner;
        float v = 0.0f;
        if (a >= start && a < end) {
            v = g[o * (end - start) * inner + (r - start * inner)];
        }
        y[t] = v;
    }
}

// One input of a concatenation: y[o][off + j] = x[o][j], rows of total.
extern "C" __global__ void k_concat_part(const float* x, float* y, i64 outer, i64 w, i64 total, i64 off) {
    i64 n = outer * w;
    GRID_STRIDE(t, n) {
        i64 o = t / w, j = t % w;
        y[o * total + off + j] = x[t];
    }
}

// Rows of x by index: y[i][j] = x[idx[i]][j].
extern "C" __global__ void k_gather(const float* x, const i64* idx, float* y, i64 rows, i64 d) {
    i64 n = rows * d;
    GRID_STRIDE(t, n) {
        i64 i = t / d, j = t % d;
        y[t] = x[idx[i] * d + j];
    }
}

// The gradient of a gather, deterministic (no atomics): the rows are
// sorted by (index, row) — a bitonic sort of the keys index<<32 | row —
// and each run of equal indices is added in row order from zero, as the
// CPU does (bit-identical). O(rows·log² rows) work, not a scan of every
// earlier row per row.

// key[i] = idx[i] << 32 | i for the rows, the largest key (sorting last)
// up to n, a power of two.
extern "C" __global__ void k_gg_keys(const i64* idx, u64* key, i64 rows, i64 n) {
    GRID_STRIDE(i, n) { key[i] = i < rows ? ((u64)idx[i] << 32) | (u64)i : ~0ull; }
}

// One step of a bitonic sort of key[0..n), n a power of two: stage k,
// distance j (each thread one compare-exchange).
extern "C" __global__ void k_bitonic_step(u64* key, i64 n, i64 k, i64 j) {
    GRID_STRIDE(t, n / 2) {
        i64 a = (t / j) * 2 * j + t % j, b = a + j;
        bool up = (a & k) == 0;
        u64 x = key[a], y = key[b];
        if ((x > y) == up) {
            key[a] = y;
            key[b] = x;
        }
    }
}

// Bitonic steps inside tiles of 512 keys (one block of 256 threads each),
// in shared memory: with k0 = 0 the stages 2..512 whole, else the steps of
// stage k0 at distances 256..1.
extern "C" __global__ void k_bitonic_tile(u64* key, i64 k0) {
    __shared__ u64 sk[512];
    i64 base = (i64)blockIdx.x * 512;
    int t = threadIdx.x;
    sk[t] = key[base + t];
    sk[t + 256] = key[base + t + 256];
    __syncthreads();
    i64 k = k0 ? k0 : 2, last = k0 ? k0 : 512;
    for (; k <= last; k <<= 1) {
        for (int j = k0 ? 256 : (int)(k / 2); j > 0; j >>= 1) {
            int a = (t / j) * 2 * j + t % j, b = a + j;
            bool up = ((base + a) & k) == 0;
            u64 x = sk[a], y = sk[b];
            if ((x > y) == up) {
                sk[a] = y;
                sk[b] = x;
            }
            __syncthreads();
        }
    }
    key[base + t] = sk[t];
    key[base + t + 256] = sk[t + 256];
}

// y[v][j] (zeroed by the caller) = Σ of g's rows with index v, in row
// order from zero: one thread per column of the first key of each run of
// equal indices in the sorted keys.
extern "C" __global__ void k_gather_grad(const float* g, const u64* key, float* y, i64 rows, i64 d) {
    i64 n = rows * d;
    GRID_STRIDE(t, n) {
        i64 q = t / d, j = t % d;
        u64 v = key[q] >> 32;
        if (q > 0 && (key[q - 1] >> 32) == v) continue;
        float s = 0.0f;
        for (i64 r = q; r < rows && (key[r] >> 32) == v; r++) s += g[(i64)(key[r] & 0xffffffffull) * d + j];
        y[(i64)v * d + j] = s;
    }
}

// ---- reductions -----------------------------------------------------------

// Σ over the first axis: y[j] = x[0][j] + x[1][j] + … in row order (the
// CPU's order: one thread per column).
extern "C" __global__ void k_sum_first(const float* x, float* y, i64 rows, i64 cols) {
    GRID_STRIDE(j, cols) {
        float s = x[j];
        for (i64 r = 1; r < rows; r++) s += x[r * cols + j];
        y[j] = s;
    }
}

// Σ over the last axis: y[r] = 0 + x[r][0] + x[r][1] + … in order.
extern "C" __global__ void k_sum_last(const float* x, float* y, i64 rows, i64 cols) {
    GRID_STRIDE(r, rows) {
        float s = 0.0f;
        for (i64 j = 0; j < cols; j++) s += x[r * cols + j];
        y[r] = s;
    }
}

// The first half of a long sum in two (the host picks it for sums over
// 1,024 or more elements): with P strides, part[p][j] = Σ of the rows
// p, p + P, p + 2P, … of column j in that order, and k_sum_first over the
// P partials finishes it. One thread per column of all the rows would
// wait on each load in turn (NCF's bias gradients at batch 65,536 took
// tens of milliseconds each); the strides keep neighbouring threads on
// neighbouring rows. The order is fixed by the shape: the same bits on
// every run (not the CPU's order).
extern "C" __global__ void k_sum_first_part(const float* x, float* part, i64 rows, i64 cols, i64 P) {
    GRID_STRIDE(t, P * cols) {
        i64 p = t / cols, j = t % cols;
        float s = 0.0f;
        for (i64 r = p; r < rows; r += P) s += x[r * cols + j];
        part[t] = s;
    }
}

// The same over the last axis: part[r][p] = Σ of x[r][p], x[r][p + P], …
// in that order; k_sum_last over the partials finishes it.
extern "C" __global__ void k_sum_last_part(const float* x, float* part, i64 rows, i64 cols, i64 P) {
    GRID_STRIDE(t, rows * P) {
        i64 r = t / P, p = t % P;
        float s = 0.0f;
        for (i64 j = p; j < cols; j += P) s += x[r * cols + j];
        part[t] = s;
    }
}

// Block-wide sum of a double (blockDim.x a power of two, at most 1024).
__device__ double block_sum(double v) {
    __shared__ double part[1024];
    part[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    double r = part[0];
    __syncthreads();
    return r;
}

__device__ float block_max(float v) {
    __shared__ float part[1024];
    part[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
        __syncthreads();
    }
    float r = part[0];
    __syncthreads();
    return r;
}

// Partial Σx² of a float vector in double: one partial per block.
extern "C" __global__ void k_sumsq_partial(const float* x, i64 n, double* part) {
    double s = 0.0;
    GRID_STRIDE(i, n) { double v = x[i]; s += v * v; }
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// Σ of the partials (one block).
extern "C" __global__ void k_sum_partials(const double* part, int n, double* out) {
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += part[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] = s;
}

// ---- BatchNorm ------------------------------------------------------------
//
// The per-channel sums spread each channel over P blocks (P chosen by the
// host so that the grid fills the GPU): block c·P + p sums part p of
// channel c's n = B·HW elements (a contiguous range of them) into
// part[c·P + p], and a second kernel adds each channel's P partials in
// order. Every level adds in a fixed order, so the results are the same
// bits on every run. Element offsets use 32-bit division (the host checks
// n < 2^31).

// The channel, part and element range [lo, hi) of this block.
__device__ __forceinline__ void bn_block(int B, int HW, int P, int* c, unsigned* lo, unsigned* hi) {
    unsigned n = (unsigned)B * (unsigned)HW;
    int p = blockIdx.x % P;
    *c = blockIdx.x / P;
    *lo = (unsigned)((u64)n * p / P);
    *hi = (unsigned)((u64)n * (p + 1) / P);
}

// The offset in x [B C HW] of element t of channel c.
__device__ __forceinline__ i64 bn_at(unsigned t, int c, int C, int HW) {
    unsigned b = t / (unsigned)HW, i = t - b * (unsigned)HW;
    return ((i64)b * C + c) * HW + i;
}

// part[c·P + p] = Σ x over part p of channel c of x [B C HW]; with mean
// (not null), Σ (x − mean[c])² instead.
extern "C" __global__ void k_bn_part(const float* x, const double* mean, double* part, int B, int C, int HW, int P) {
    int c;
    unsigned lo, hi;
    bn_block(B, HW, P, &c, &lo, &hi);
    double m = mean ? mean[c] : 0.0;
    double s = 0.0;
    for (unsigned t = lo + threadIdx.x; t < hi; t += blockDim.x) {
        double v = (double)x[bn_at(t, c, C, HW)];
        if (mean) {
            v -= m;
            v *= v;
        }
        s += v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// stats[c] = (Σ_p part[c·P + p]) / n: each channel's mean.
extern "C" __global__ void k_bn_mean(const double* part, double* stats, int C, int P, double n) {
    GRID_STRIDE(c, C) {
        double s = 0.0;
        for (int p = 0; p < P; p++) s += part[c * P + p];
        stats[c] = s / n;
    }
}

// From each channel's partial Σ(x − mean)²: stats[C+c] = 1/√(var+eps)
// (biased variance) and the running statistics' update (unbiased).
extern "C" __global__ void k_bn_var(const double* part, float* rm, float* rv, double* stats, int C, int P, double n, double eps, double mom) {
    GRID_STRIDE(c, C) {
        double ss = 0.0;
        for (int p = 0; p < P; p++) ss += part[c * P + p];
        double mean = stats[c];
        stats[C + c] = 1.0 / sqrt(ss / n + eps);
        rm[c] = (float)((1.0 - mom) * (double)rm[c] + mom * mean);
        rv[c] = (float)((1.0 - mom) * (double)rv[c] + mom * ss / (n - 1.0));
    }
}

extern "C" __global__ void k_bn_running_stats(const float* rm, const float* rv, double* stats, int C, double eps) {
    GRID_STRIDE(c, C) {
        stats[c] = (double)rm[c];
        stats[C + c] = 1.0 / sqrt((double)rv[c] + eps);
    }
}

// y = x·scale + shift per channel, scale = float(γ·invstd), shift =
// β − float(mean)·scale; ReLU when relu.
extern "C" __global__ void k_bn_apply(const float* x, const float* gamma, const float* beta, const double* stats, float* y, int B, int C, int HW, int relu) {
    i64 n = (i64)B * C * HW;
    GRID_STRIDE(t, n) {
        int c = (int)((t / HW) % C);
        float scale = (float)((double)gamma[c] * stats[C + c]);
        float shift = beta[c] - (float)stats[c] * scale;
        float v = x[t] * scale + shift;
        y[t] = relu ? fmaxf(v, 0.0f) : v;
    }
}

// part[2(c·P+p)] = Σdy, part[2(c·P+p)+1] = Σdy·x̂ over part p of channel
// c (dy zero where y ≤ 0 when relu), x̂ = (x − mean)·invstd in float.
extern "C" __global__ void k_bn_grad_part(const float* x, const float* dy, const double* stats, const float* y, double* part, int B, int C, int HW, int P, int relu) {
    int c;
    unsigned lo, hi;
    bn_block(B, HW, P, &c, &lo, &hi);
    float mean = (float)stats[c], invstd = (float)stats[C + c];
    double sdy = 0.0, sdyx = 0.0;
    for (unsigned t = lo + threadIdx.x; t < hi; t += blockDim.x) {
        i64 o = bn_at(t, c, C, HW);
        if (relu && y[o] <= 0.0f) continue;
        double g = dy[o];
        sdy += g;
        sdyx += g * (double)((x[o] - mean) * invstd);
    }
    sdy = block_sum(sdy);
    sdyx = block_sum(sdyx);
    if (threadIdx.x == 0) {
        part[2 * blockIdx.x] = sdy;
        part[2 * blockIdx.x + 1] = sdyx;
    }
}

// sums[c] = Σdy, sums[C+c] = Σdy·x̂: each channel's partials in order.
extern "C" __global__ void k_bn_grad_sums(const double* part, double* sums, int C, int P) {
    GRID_STRIDE(c, C) {
        double a = 0.0, b = 0.0;
        for (int p = 0; p < P; p++) {
            a += part[2 * (c * P + p)];
            b += part[2 * (c * P + p) + 1];
        }
        sums[c] = a;
        sums[C + c] = b;
    }
}

// dx = γ·invstd·(dy − Σdy/n − x̂·Σdy·x̂/n), dy zero where y ≤ 0 when relu.
extern "C" __global__ void k_bn_grad_input(const float* x, const float* gamma, const float* dy, const double* stats, const double* sums, const float* y, float* dx, int B, int C, int HW, int relu) {
    i64 n = (i64)B * C * HW;
    double cnt = (double)B * HW;
    GRID_STRIDE(t, n) {
        int c = (int)((t / HW) % C);
        float mean = (float)stats[c], invstd = (float)stats[C + c];
        float k = gamma[c] * invstd;
        float mdy = (float)(sums[c] / cnt), mdyx = (float)(sums[C + c] / cnt);
        float g = dy[t];
        if (relu && y[t] <= 0.0f) g = 0.0f;
        float xh = (x[t] - mean) * invstd;
        dx[t] = k * (g - mdy - xh * mdyx);
    }
}

extern "C" __global__ void k_bn_grad_param(const double* sums, float* out, int C, int which) {
    GRID_STRIDE(c, C) { out[c] = (float)sums[which * C + c]; }
}

// ---- softmax cross-entropy (one block per row for the row reductions) -----

extern "C" __global__ void k_logsumexp(const float* z, double* lse, int N, int C) {
    int r = blockIdx.x;
    const float* row = z + (i64)r * C;
    float m = __int_as_float(0xff800000); // -inf
    for (int j = threadIdx.x; j < C; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m);
    double s = 0.0;
    for (int j = threadIdx.x; j < C; j += blockDim.x) s += exp((double)(row[j] - m));
    s = block_sum(s);
    if (threadIdx.x == 0) lse[r] = (double)m + log(s);
}

// The mean over rows of lse − z[y] (one block); with label smoothing eps,
// of lse − (1 − eps)·z[y] − eps·mean(z) (ops.SoftmaxCrossEntropy): the
// smoothing term of all rows is one sum over the whole [N C] matrix, read
// by the block's threads side by side.
extern "C" __global__ void k_xent_loss(const float* z, const i64* y, const double* lse, float* loss, int N, int C, float eps) {
    double e = (double)eps, s = 0.0;
    for (int r = threadIdx.x; r < N; r += blockDim.x) s += lse[r] - (1.0 - e) * (double)z[(i64)r * C + y[r]];
    if (eps != 0.0f) {
        double zs = 0.0;
        for (i64 t = threadIdx.x; t < (i64)N * C; t += blockDim.x) zs += (double)z[t];
        s -= e * zs / (double)C;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) loss[0] = (float)(s / (double)N);
}

// out = g·(softmax(z) − (1 − eps)·onehot(y) − eps/C)/N, rounded as the CPU
// does; may run in place over z.
extern "C" __global__ void k_xent_grad(const float* z, const i64* y, const double* lse, const float* g, float* out, int N, int C, float eps) {
    double k = (double)g[0] / (double)N;
    double spread = (double)eps * k / (double)C;
    i64 n = (i64)N * C;
    GRID_STRIDE(t, n) {
        int r = (int)(t / C), j = (int)(t % C);
        float v = (float)(exp((double)z[t] - lse[r]) * k - spread);
        if ((i64)j == y[r]) v -= (float)((1.0 - (double)eps) * k);
        out[t] = v;
    }
}

// ---- optimizers and vector math -------------------------------------------

// One SGD step (device.SGDStep); buf may be null when momentum is 0.
extern "C" __global__ void k_sgd(float* w, const float* g, float* buf, i64 n, float lr, float mom, float wd, int nesterov, int first) {
    GRID_STRIDE(i, n) {
        float d = g[i] + wd * w[i];
        if (buf == 0) {
            w[i] -= lr * d;
        } else if (first) {
            buf[i] = d;
            w[i] -= lr * (nesterov ? d + mom * d : d);
        } else if (nesterov) {
            float b = mom * buf[i] + d;
            buf[i] = b;
            w[i] -= lr * (d + mom * b);
        } else {
            float b = mom * buf[i] + g[i] + wd * w[i];
            buf[i] = b;
            w[i] -= lr * b;
        }
    }
}

// One Adam step (device.AdamStep).
extern "C" __global__ void k_adam(float* w, const float* g, float* m, float* v, i64 n, float step, float b1, float b2, float eps, float sqbc2) {
    GRID_STRIDE(i, n) {
        float gi = g[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float den = sqrtf(vi) / sqbc2 + eps;
        w[i] -= step * mi / den;
    }
}

extern "C" __global__ void k_scale(float* x, i64 n, float a) {
    GRID_STRIDE(i, n) { x[i] *= a; }
}

extern "C" __global__ void k_add(float* y, const float* x, i64 n) {
    GRID_STRIDE(i, n) { y[i] += x[i]; }
}

// ---- in-process collectives (comm/local's device path) -------------------

// peer_sum adds chunk [lo, lo+n) of the m buffers p[0..m) element by
// element, left to right in the order given (comm's canonical order, the
// order comm/local adds in on the host: the same bits), and stores the sum
// into out[0..n) or, where out is null, back into every one of the m
// buffers (an all-reduce's chunk, in place: each element is read from all
// of them before it is written).
template <typename T>
__device__ void peer_sum(T* out, i64 lo, i64 n, int m, T* const* p) {
    GRID_STRIDE(i, n) {
        T acc = p[0][lo + i];
        for (int k = 1; k < m; k++) acc += p[k][lo + i];
        if (out) {
            out[i] = acc;
        } else {
            for (int k = 0; k < m; k++) p[k][lo + i] = acc;
        }
    }
}

extern "C" __global__ void k_peer_sum_f32(float* out, i64 lo, i64 n, int m, float* p0, float* p1, float* p2, float* p3, float* p4, float* p5, float* p6, float* p7, float* p8, float* p9, float* p10, float* p11, float* p12, float* p13, float* p14, float* p15) {
    float* p[16] = {p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15};
    peer_sum(out, lo, n, m, p);
}

extern "C" __global__ void k_peer_sum_i32(int* out, i64 lo, i64 n, int m, int* p0, int* p1, int* p2, int* p3, int* p4, int* p5, int* p6, int* p7, int* p8, int* p9, int* p10, int* p11, int* p12, int* p13, int* p14, int* p15) {
    int* p[16] = {p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15};
    peer_sum(out, lo, n, m, p);
}

extern "C" __global__ void k_peer_sum_i64(i64* out, i64 lo, i64 n, int m, i64* p0, i64* p1, i64* p2, i64* p3, i64* p4, i64* p5, i64* p6, i64* p7, i64* p8, i64* p9, i64* p10, i64* p11, i64* p12, i64* p13, i64* p14, i64* p15) {
    i64* p[16] = {p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15};
    peer_sum(out, lo, n, m, p);
}

// Half precision (device.Float16, its bits as unsigned short): f16_value
// is a half's value (exact), f16_round rounds a double to the nearest half,
// ties to even (package device's float16Of), so a sum of two halves added
// in double is rounded once (device.AddFloat16).
__device__ __forceinline__ float f16_value(unsigned short h) {
    u32 sign = (u32)(h & 0x8000) << 16;
    u32 exp = (h >> 10) & 0x1fu;
    u32 man = h & 0x3ffu;
    if (exp == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

__device__ unsigned short f16_round(double x) {
    u64 u = (u64)__double_as_longlong(x);
    unsigned short sign = (unsigned short)((u >> 48) & 0x8000u);
    int exp = (int)((u >> 52) & 0x7ffu);
    u64 man = u & ((1ull << 52) - 1);
    if (exp == 0x7ff) return sign | (man ? 0x7e00 : 0x7c00);
    if (exp == 0) return sign;
    int e = exp - 1023 + 15;
    u64 m = man | (1ull << 52);
    int shift = 42;
    if (e < 1) {
        shift = 42 + 1 - e;
        if (shift > 53) return sign;
        e = 1;
    }
    u64 h = m >> shift;
    u64 rem = m & ((1ull << shift) - 1);
    u64 halfway = 1ull << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1))) h++;
    u64 bits = ((u64)(e - 1) << 10) + h;
    if (bits >= 0x7c00u) return sign | 0x7c00;
    return sign | (unsigned short)bits;
}

// peer_sum of halves: each addition in double (exact), rounded to half.
extern "C" __global__ void k_peer_sum_f16(unsigned short* out, i64 lo, i64 n, int m, unsigned short* p0, unsigned short* p1, unsigned short* p2, unsigned short* p3, unsigned short* p4, unsigned short* p5, unsigned short* p6, unsigned short* p7, unsigned short* p8, unsigned short* p9, unsigned short* p10, unsigned short* p11, unsigned short* p12, unsigned short* p13, unsigned short* p14, unsigned short* p15) {
    unsigned short* p[16] = {p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15};
    GRID_STRIDE(i, n) {
        unsigned short acc = p[0][lo + i];
        for (int k = 1; k < m; k++) acc = f16_round((double)f16_value(acc) + (double)f16_value(p[k][lo + i]));
        if (out) {
            out[i] = acc;
        } else {
            for (int k = 0; k < m; k++) p[k][lo + i] = acc;
        }
    }
}

// ---- dropout masks (math/rand/v2's PCG, as package models draws them) ------

// A 128-bit unsigned integer; arithmetic wraps.
struct u128 {
    u64 hi, lo;
};

__device__ __forceinline__ u128 mul128(u128 a, u128 b) {
    u128 r;
    r.lo = a.lo * b.lo;
    r.hi = __umul64hi(a.lo, b.lo) + a.hi * b.lo + a.lo * b.hi;
    return r;
}

__device__ __forceinline__ u128 add128(u128 a, u128 b) {
    u128 r;
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo ? 1 : 0);
    return r;
}

// pcg_jump sets (*A, *C) to the map of n steps of the PCG's LCG
// s <- a*s + c: s <- A*s + C (models.pcgJump).
__device__ void pcg_jump(u64 n, u128* A, u128* C) {
    u128 mul = {2549297995355413924ull, 4865540595714422341ull};
    u128 inc = {6364136223846793005ull, 1442695040888963407ull};
    u128 am = {0, 1}, ai = {0, 0};
    u128 one = {0, 1};
    for (; n > 0; n >>= 1) {
        if (n & 1) {
            am = mul128(am, mul);
            ai = add128(mul128(ai, mul), inc);
        }
        inc = mul128(add128(mul, one), inc);
        mul = mul128(mul, mul);
    }
    *A = am;
    *C = ai;
}

// m[i] = 0 where the low 53 bits of the PCG's (i+1)-th output from state
// (hi, lo) are below thr, else keep: the mask models.dropoutRNG.mask
// draws on the CPU (Float64() < p, in integers). Each thread jumps to its
// first element, then strides by the grid.
extern "C" __global__ void k_dropout(float* m, i64 n, i64 hi, i64 lo, i64 thr, float keep) {
    i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (first >= n) return;
    u128 A, C, SA, SC;
    pcg_jump((u64)first + 1, &A, &C);
    pcg_jump((u64)blockDim.x * gridDim.x, &SA, &SC);
    u128 s0 = {(u64)hi, (u64)lo};
    u128 s = add128(mul128(A, s0), C);
    for (i64 i = first; i < n; i += (i64)blockDim.x * gridDim.x) {
        u64 x = s.hi; // DXSM output of the advanced state
        x ^= x >> 32;
        x *= 0xda942042e4dd58b5ull;
        x ^= x >> 48;
        x *= (s.lo | 1);
        m[i] = (x & ((1ull << 53) - 1)) < (u64)thr ? 0.0f : keep;
        s = add128(mul128(SA, s), SC);
    }
}

// ---- sparsification -------------------------------------------------------
//
// Selection by magnitude works on keys: the IEEE-754 bits of |v| (the sign
// bit cleared), monotone in |v| for every non-NaN float; NaN keys lie above
// +Inf's. These kernels follow package sparsify's CPU primitives exactly:
// the same k-th largest key by radix select (bits 30..20, 19..10, 9..0), the
// same ties (the lowest indices), the same ascending output, so that a GPU
// and a CPU pick the same index sets.
//
// Selections that write index lists in order work on tiles of SEL_TILE
// consecutive elements, one block (of 256 threads, 16 consecutive elements
// each) per tile: count per tile, scan the counts (one block), write.

#define SEL_ITEMS 16
#define SEL_TILE (256 * SEL_ITEMS)
#define KEY_INF 0x7f800000u

__device__ __forceinline__ u32 abs_key(u32 bits) { return bits & 0x7fffffffu; }

// Inclusive scans of a[0..255] and b[0..255] in shared memory (256 threads).
__device__ void scan256x2(u32* a, u32* b) {
    for (int off = 1; off < 256; off <<= 1) {
        u32 va = threadIdx.x >= (unsigned)off ? a[threadIdx.x - off] : 0;
        u32 vb = threadIdx.x >= (unsigned)off ? b[threadIdx.x - off] : 0;
        __syncthreads();
        a[threadIdx.x] += va;
        b[threadIdx.x] += vb;
        __syncthreads();
    }
}

// Starts a radix select for the k-th largest key: state = {prefix 0, need k},
// hist (2048 counters) zeroed.
extern "C" __global__ void k_sel_init(u32* state, int k, u32* hist) {
    for (int b = threadIdx.x; b < 2048; b += blockDim.x) hist[b] = 0;
    if (threadIdx.x == 0) {
        state[0] = 0;
        state[1] = (u32)k;
    }
}

// One radix round's counts of elements [from, n) of x, every step-th
// (a block's share, its threads striding by 256): h[(key >> shift) &
// (2^nbits − 1)] counts the keys whose bits above shift+nbits equal those
// of want (the bits fixed by the earlier rounds); h (shared, 2^nbits
// counters) is zeroed first and added into hist at the end.
__device__ void sel_hist(const float* x, i64 n, i64 from, i64 step, int shift, int nbits, const u32* state, u32* hist) {
    __shared__ u32 h[2048];
    int nb = 1 << nbits;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) h[b] = 0;
    __syncthreads();
    int hi = shift + nbits;
    u32 want = hi >= 31 ? 0u : state[0] >> hi;
    u32 mask = (u32)nb - 1u;
    const u32* u = (const u32*)x;
    for (i64 i = from + threadIdx.x; i < n; i += step) {
        u32 key = abs_key(u[i]);
        if (hi >= 31 || (key >> hi) == want) atomicAdd(&h[(key >> shift) & mask], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < nb; b += blockDim.x)
        if (h[b]) atomicAdd(&hist[b], h[b]);
}

// One radix round: hist[(key >> shift) & (2^nbits − 1)] counts the keys
// whose bits above shift+nbits equal those of state[0] (the bits fixed by the
// earlier rounds).
extern "C" __global__ void k_sel_hist(const float* x, i64 n, int shift, int nbits, const u32* state, u32* hist) {
    sel_hist(x, n, (i64)blockIdx.x * blockDim.x, (i64)blockDim.x * gridDim.x, shift, nbits, state, hist);
}

// Picks the round's bucket (one block): the highest bucket b with
// Σ_{b' >= b} hist[b'] >= need; state[0] gains b << shift, state[1] becomes the
// rank of the k-th key inside b; hist is zeroed for the next round.
__device__ void sel_pick(u32* hist, int shift, int nbits, u32* state) {
    __shared__ u32 suf[256], dummy[256];
    int nb = 1 << nbits;
    int per = nb / 256; // buckets per thread, from the top: thread t owns [nb-(t+1)·per, nb-t·per)
    int top = nb - threadIdx.x * per;
    u32 s = 0;
    for (int b = top - 1; b >= top - per; b--) s += hist[b];
    suf[threadIdx.x] = s;
    dummy[threadIdx.x] = 0;
    __syncthreads();
    scan256x2(suf, dummy); // suf[t] = keys in the buckets of threads 0..t (from the top)
    u32 need = state[1];
    u32 before = threadIdx.x == 0 ? 0u : suf[threadIdx.x - 1];
    __syncthreads();
    if (before < need && suf[threadIdx.x] >= need) {
        u32 r = need - before;
        int b = top - 1;
        for (; b > top - per && hist[b] < r; b--) r -= hist[b];
        state[0] |= (u32)b << shift;
        state[1] = r;
    }
    __syncthreads();
    for (int b = threadIdx.x; b < nb; b += blockDim.x) hist[b] = 0;
}

extern "C" __global__ void k_sel_pick(u32* hist, int shift, int nbits, u32* state) { sel_pick(hist, shift, nbits, state); }

// Counts of one tile of lim elements u (one block): mode 0 (top-k) counts
// keys above and equal to the k-th key t; mode 1 (threshold) counts keys in
// [t, KEY_INF] (|x| >= t, never NaN); mode 2 counts non-zero words.
// counts[0] = above (or selected), counts[1] = equal.
__device__ void sel_count(const u32* u, i64 lim, u32 t, int mode, u32* counts) {
    __shared__ u32 c[2];
    if (threadIdx.x < 2) c[threadIdx.x] = 0;
    __syncthreads();
    u32 gt = 0, eq = 0;
    for (i64 j = threadIdx.x; j < lim; j += blockDim.x) {
        u32 w = u[j];
        u32 key = abs_key(w);
        if (mode == 0) {
            gt += key > t;
            eq += key == t;
        } else if (mode == 1) {
            gt += key >= t && key <= KEY_INF;
        } else {
            gt += w != 0;
        }
    }
    if (gt) atomicAdd(&c[0], gt);
    if (eq) atomicAdd(&c[1], eq);
    __syncthreads();
    if (threadIdx.x < 2) counts[threadIdx.x] = c[threadIdx.x];
}

// Per-tile counts (one block per tile) of sel_count, the k-th key or
// threshold in state[0]: counts[2t] = above (or selected), counts[2t+1] =
// equal.
extern "C" __global__ void k_sel_count(const float* x, i64 n, const u32* state, int mode, u32* counts) {
    i64 base = (i64)blockIdx.x * SEL_TILE;
    i64 lim = n - base < SEL_TILE ? n - base : SEL_TILE;
    sel_count((const u32*)x + base, lim, state[0], mode, counts + 2 * blockIdx.x);
}

// Scans the counts of tiles tiles (one block): offs[2t] is where tile t
// writes, from out, offs[2t+1] how many of its ties it takes (the k-th key's
// ties go to the lowest indices: need − (ties in earlier tiles), clamped);
// total[0] (when total is not null) is the number of elements selected.
__device__ void sel_offsets(const u32* counts, int tiles, u32 need, u32 out, u32* offs, u32* total) {
    __shared__ u32 sg[256], se[256];
    int per = (tiles + 255) / 256;
    int lo = threadIdx.x * per, hi = lo + per < tiles ? lo + per : tiles;
    u32 g = 0, e = 0;
    for (int t = lo; t < hi; t++) {
        g += counts[2 * t];
        e += counts[2 * t + 1];
    }
    sg[threadIdx.x] = g;
    se[threadIdx.x] = e;
    __syncthreads();
    scan256x2(sg, se);
    u32 gb = sg[threadIdx.x] - g, eb = se[threadIdx.x] - e; // exclusive
    for (int t = lo; t < hi; t++) {
        u32 tg = counts[2 * t], te = counts[2 * t + 1];
        u32 take = need > eb ? need - eb : 0u;
        offs[2 * t] = out + gb + (eb < need ? eb : need);
        offs[2 * t + 1] = take < te ? take : te;
        gb += tg;
        eb += te;
    }
    if (total && threadIdx.x == 255) {
        u32 te = se[255];
        total[0] = sg[255] + (te < need ? te : need);
    }
}

// Scans the tile counts (one block): sel_offsets, need state[1] in mode 0.
extern "C" __global__ void k_sel_offsets(const u32* counts, int tiles, const u32* state, int mode, u32* offs, u32* total) {
    sel_offsets(counts, tiles, mode == 0 ? state[1] : 0u, 0u, offs, total);
}

// Writes the selection of one tile of lim elements u (one block), element j
// of index base + j, at offs[0] (taking offs[1] of the ties), in ascending
// index order: idx gets the indices (mode 2: the non-zero words minus one,
// Sparse.CompactSlots), val (when not null) the elements.
__device__ void sel_write(const u32* u, i64 base, int lim, u32 t, int mode, const u32* offs, int* idx, float* val) {
    __shared__ u32 w[SEL_TILE + SEL_TILE / SEL_ITEMS]; // one pad word per thread's run: no bank conflicts
    __shared__ u32 sg[256], se[256];
    for (int j = threadIdx.x; j < lim; j += blockDim.x) w[j + j / SEL_ITEMS] = u[j];
    __syncthreads();
    int j0 = threadIdx.x * SEL_ITEMS;
    int j1 = j0 + SEL_ITEMS < lim ? j0 + SEL_ITEMS : lim;
    u32 g = 0, e = 0;
    for (int j = j0; j < j1; j++) {
        u32 v = w[j + j / SEL_ITEMS];
        u32 key = abs_key(v);
        if (mode == 0) {
            g += key > t;
            e += key == t;
        } else if (mode == 1) {
            g += key >= t && key <= KEY_INF;
        } else {
            g += v != 0;
        }
    }
    sg[threadIdx.x] = g;
    se[threadIdx.x] = e;
    __syncthreads();
    scan256x2(sg, se);
    u32 off = offs[0], allow = offs[1];
    u32 gb = sg[threadIdx.x] - g, eb = se[threadIdx.x] - e;
    u32 mine = allow > eb ? allow - eb : 0u; // ties this thread takes
    if (mine > e) mine = e;
    u32 pos = off + gb + (eb < allow ? eb : allow);
    for (int j = j0; j < j1; j++) {
        u32 v = w[j + j / SEL_ITEMS];
        u32 key = abs_key(v);
        int sel;
        if (mode == 0) {
            sel = key > t || (key == t && mine > 0);
            if (key == t && mine > 0) mine--;
        } else if (mode == 1) {
            sel = key >= t && key <= KEY_INF;
        } else {
            sel = v != 0;
        }
        if (sel) {
            idx[pos] = mode == 2 ? (int)(v - 1u) : (int)(base + j);
            if (val) val[pos] = __uint_as_float(v);
            pos++;
        }
    }
}

// Writes the selection of each tile (one block per tile) at its offset:
// sel_write.
extern "C" __global__ void k_sel_write(const float* x, i64 n, const u32* state, int mode, const u32* offs, int* idx, float* val) {
    i64 base = (i64)blockIdx.x * SEL_TILE;
    int lim = n - base < SEL_TILE ? (int)(n - base) : SEL_TILE;
    sel_write((const u32*)x + base, base, lim, state[0], mode, offs + 2 * blockIdx.x, idx, val);
}

// ---- segmented top-k: every segment of a list selected at once ----------
//
// A list of segments is described by int64 words: desc[0] is the number of
// segments S, desc[1] the number of tiles in all, and segment s is
// SEG_DESC words at SEG_AT(desc, s): its start lo in x, its length n, its k
// (1 <= k <= n), where its indices go in idx (out), and its first tile
// (tile0). The launches may have more blocks than the list needs (a list
// written on the device, Sparse.TopKSegmentsOn): a block past the S
// segments or the tiles returns at once. Each has its own radix state (state[2s],
// state[2s+1]) and histogram (hist + 2048·s); its indices are written as lo
// + the index in the segment, ascending, at idx[out..out+k), the same as
// TopK of the segment shifted by lo.

#define SEG_DESC 5
#define SEG_AT(desc, s) ((desc) + 2 + SEG_DESC * (s))
#define SEG_HIST_BLOCKS 8 // blocks per segment of a histogram round

// The segment of tile t: the last s with tile0(s) <= t (S small: a scan).
__device__ int seg_of_tile(const i64* desc, i64 t) {
    int s = 0, S = (int)desc[0];
    while (s + 1 < S && SEG_AT(desc, s + 1)[4] <= t) s++;
    return s;
}

// The end of segment s's tiles.
__device__ i64 seg_tiles_end(const i64* desc, int s) {
    return s + 1 == desc[0] ? desc[1] : SEG_AT(desc, s + 1)[4];
}

// Starts every segment's radix select (one block per segment).
extern "C" __global__ void k_seg_init(const i64* desc, u32* state, u32* hist) {
    int s = blockIdx.x;
    if (s >= desc[0]) return;
    for (int b = threadIdx.x; b < 2048; b += blockDim.x) hist[2048 * s + b] = 0;
    if (threadIdx.x == 0) {
        state[2 * s] = 0;
        state[2 * s + 1] = (u32)SEG_AT(desc, s)[2];
    }
}

// One radix round of every segment: SEG_HIST_BLOCKS blocks per segment.
extern "C" __global__ void k_seg_hist(const float* x, const i64* desc, int shift, int nbits, const u32* state, u32* hist) {
    int s = blockIdx.x / SEG_HIST_BLOCKS, b = blockIdx.x % SEG_HIST_BLOCKS;
    if (s >= desc[0]) return;
    const i64* d = SEG_AT(desc, s);
    sel_hist(x + d[0], d[1], (i64)b * blockDim.x, (i64)blockDim.x * SEG_HIST_BLOCKS, shift, nbits, state + 2 * s, hist + 2048 * s);
}

// Picks every segment's bucket of the round (one block per segment).
extern "C" __global__ void k_seg_pick(const i64* desc, u32* hist, int shift, int nbits, u32* state) {
    if (blockIdx.x >= desc[0]) return;
    sel_pick(hist + 2048 * blockIdx.x, shift, nbits, state + 2 * blockIdx.x);
}

// Per-tile counts of every segment (one block per tile of all).
extern "C" __global__ void k_seg_count(const float* x, const i64* desc, const u32* state, u32* counts) {
    if (blockIdx.x >= desc[1]) return;
    int s = seg_of_tile(desc, blockIdx.x);
    const i64* d = SEG_AT(desc, s);
    i64 base = (blockIdx.x - d[4]) * (i64)SEL_TILE;
    i64 lim = d[1] - base < SEL_TILE ? d[1] - base : SEL_TILE;
    sel_count((const u32*)(x + d[0]) + base, lim, state[2 * s], 0, counts + 2 * blockIdx.x);
}

// Each segment's tile offsets (one block per segment), from its out.
extern "C" __global__ void k_seg_offsets(const u32* counts, const i64* desc, const u32* state, u32* offs) {
    int s = blockIdx.x;
    if (s >= desc[0]) return;
    const i64* d = SEG_AT(desc, s);
    i64 t0 = d[4], t1 = seg_tiles_end(desc, s);
    sel_offsets(counts + 2 * t0, (int)(t1 - t0), state[2 * s + 1], (u32)d[3], offs + 2 * t0, 0);
}

// Writes every segment's selection (one block per tile of all).
extern "C" __global__ void k_seg_write(const float* x, const i64* desc, const u32* state, const u32* offs, int* idx) {
    if (blockIdx.x >= desc[1]) return;
    int s = seg_of_tile(desc, blockIdx.x);
    const i64* d = SEG_AT(desc, s);
    i64 base = (blockIdx.x - d[4]) * (i64)SEL_TILE;
    int lim = d[1] - base < SEL_TILE ? (int)(d[1] - base) : SEL_TILE;
    sel_write((const u32*)(x + d[0]) + base, d[0] + base, lim, state[2 * s], 0, offs + 2 * blockIdx.x, idx, 0);
}

// The description of a list written on the device (one thread): from
// list (int32: its number of segments S, then lo, hi and k of each), the
// segments with k > 0 (k clamped to the segment), their outputs one after
// the other and their tiles, in desc's form.
extern "C" __global__ void k_seg_describe(const int* list, i64 n, i64* desc) {
    GRID_STRIDE(g, n) {
        (void)g;
        int S = list[0], m = 0;
        i64 out = 0, tiles = 0;
        for (int j = 0; j < S; j++) {
            const int* e = list + 1 + 3 * j;
            i64 len = (i64)e[1] - e[0], k = e[2] < len ? e[2] : len;
            if (k <= 0) continue;
            i64* d = SEG_AT(desc, m);
            d[0] = e[0];
            d[1] = len;
            d[2] = k;
            d[3] = out;
            d[4] = tiles;
            out += k;
            tiles += (len + SEL_TILE - 1) / SEL_TILE;
            m++;
        }
        desc[0] = m;
        desc[1] = tiles;
    }
}

// ---- segmented thresholds and threshold selections ------------------------
//
// KthLargestAbsSegments runs k_seg_init and the radix rounds of the
// segmented top-k, then k_seg_kth; SelectAboveSegments describes its
// segments as the segmented top-k does, with SEG_AT(desc, s)[2] the
// segment's place in the caller's list (its threshold's index) and out its
// own start.

// thr[s] = the k-th largest magnitude of segment s (its radix state).
extern "C" __global__ void k_seg_kth(const u32* state, i64 S, float* thr) {
    GRID_STRIDE(s, S) { thr[s] = __uint_as_float(state[2 * s]); }
}

// Starts every segment's threshold selection: state[2s] = the key of its
// threshold (<= 0: every number; NaN: nothing), state[2s+1] = 0.
extern "C" __global__ void k_segt_init(const float* thr, const i64* desc, i64 S, u32* state) {
    GRID_STRIDE(s, S) {
        float t = thr[SEG_AT(desc, s)[2]];
        state[2 * s] = t != t ? 0xffffffffu : (t > 0.0f ? __float_as_uint(t) : 0u);
        state[2 * s + 1] = 0u;
    }
}

// Per-tile counts of every segment's threshold selection (one block per
// tile of all).
extern "C" __global__ void k_segt_count(const float* x, const i64* desc, const u32* state, u32* counts) {
    if (blockIdx.x >= desc[1]) return;
    int s = seg_of_tile(desc, blockIdx.x);
    const i64* d = SEG_AT(desc, s);
    i64 base = (blockIdx.x - d[4]) * (i64)SEL_TILE;
    i64 lim = d[1] - base < SEL_TILE ? d[1] - base : SEL_TILE;
    sel_count((const u32*)(x + d[0]) + base, lim, state[2 * s], 1, counts + 2 * blockIdx.x);
}

// Each segment's tile offsets from its out, and its count in totals at
// its place in the caller's list, d[2] (one block per segment).
extern "C" __global__ void k_segt_offsets(const u32* counts, const i64* desc, u32* offs, u32* totals) {
    int s = blockIdx.x;
    if (s >= desc[0]) return;
    const i64* d = SEG_AT(desc, s);
    i64 t0 = d[4], t1 = seg_tiles_end(desc, s);
    sel_offsets(counts + 2 * t0, (int)(t1 - t0), 0u, (u32)d[3], offs + 2 * t0, totals + d[2]);
}

// Writes every segment's threshold selection (one block per tile of all).
extern "C" __global__ void k_segt_write(const float* x, const i64* desc, const u32* state, const u32* offs, int* idx) {
    if (blockIdx.x >= desc[1]) return;
    int s = seg_of_tile(desc, blockIdx.x);
    const i64* d = SEG_AT(desc, s);
    i64 base = (blockIdx.x - d[4]) * (i64)SEL_TILE;
    int lim = d[1] - base < SEL_TILE ? (int)(d[1] - base) : SEL_TILE;
    sel_write((const u32*)(x + d[0]) + base, d[0] + base, lim, state[2 * s], 1, offs + 2 * blockIdx.x, idx, 0);
}

// counts[s] = the non-zero words of x[b[s], b[s+1]) (one block per
// segment): CompactSlotsSegments' counts.
extern "C" __global__ void k_seg_nonzero(const u32* x, const i64* b, u32* counts) {
    __shared__ u32 c;
    if (threadIdx.x == 0) c = 0u;
    __syncthreads();
    u32 n = 0;
    for (i64 i = b[blockIdx.x] + threadIdx.x; i < b[blockIdx.x + 1]; i += blockDim.x) n += x[i] != 0u;
    if (n) atomicAdd(&c, n);
    __syncthreads();
    if (threadIdx.x == 0) counts[blockIdx.x] = c;
}

// r += scale·g; first[0] = min(first[0], i) for every r[i] that becomes NaN
// or ±Inf (the caller sets first[0] to n beforehand).
extern "C" __global__ void k_accumulate(float* r, const float* g, i64 n, float scale, u64* first) {
    GRID_STRIDE(i, n) {
        float v = r[i] + scale * g[i];
        r[i] = v;
        if ((__float_as_uint(v) & KEY_INF) == KEY_INF) atomicMin(first, (u64)i);
    }
}

// k_accumulate without the host's read: r += scale·g, and for every r[i]
// that becomes NaN or ±Inf flag[0] = min(flag[0], key), key = (base+i)<<33
// | (g[i] not finite)<<32 | the bits of g[i] when it is not finite, else
// of r[i] — the first such element of the whole vector, whether its
// gradient was already non-finite, and the value, in one word the host
// reads with a later wait (the caller sets flag[0] to ~0 once).
__device__ __forceinline__ unsigned accumulate_flag(float* r, const float* g, i64 i, float scale, i64 base, u64* flag) {
    float v = r[i] + scale * g[i];
    r[i] = v;
    unsigned vb = __float_as_uint(v);
    if ((vb & KEY_INF) == KEY_INF) {
        unsigned gb = __float_as_uint(g[i]);
        u64 gbad = (gb & KEY_INF) == KEY_INF;
        atomicMin(flag, ((u64)(base + i) << 33) | (gbad << 32) | (u64)(gbad ? gb : vb));
    }
    return vb;
}

extern "C" __global__ void k_accumulate_flag(float* r, const float* g, i64 n, float scale, i64 base, u64* flag) {
    GRID_STRIDE(i, n) accumulate_flag(r, g, i, scale, base, flag);
}

// k_accumulate_flag that also counts the accumulated values for the first
// round of a top-k's radix select (k_sel_hist's with shift 20 and 11 bits,
// no bits fixed yet): hist[abs_key(r[i]) >> 20] += 1, added into hist (2048
// counters, zero beforehand), so that the selection that follows skips
// that round's pass over r (Sparse.TopKHist).
extern "C" __global__ void k_accumulate_flag_hist(float* r, const float* g, i64 n, float scale, i64 base, u64* flag, u32* hist) {
    __shared__ u32 h[2048];
    for (int b = threadIdx.x; b < 2048; b += blockDim.x) h[b] = 0;
    __syncthreads();
    GRID_STRIDE(i, n) atomicAdd(&h[abs_key(accumulate_flag(r, g, i, scale, base, flag)) >> 20], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < 2048; b += blockDim.x)
        if (h[b]) atomicAdd(&hist[b], h[b]);
}

// Σx² in double of pieces [lo[p], lo[p+1]) of x (at most 4096 elements,
// never straddling a segment), one block per piece, added exactly as the
// CPU does (package sparsify's sumSquares): element i of the piece into
// partial sum i mod 4, the last (len mod 4) elements into sum 0, combined
// as (s0+s1)+(s2+s3). All 256 threads load; four run the chains.
extern "C" __global__ void k_piece_sumsq(const float* x, const i64* lo, double* part) {
    // Every thread loads and squares one element of each tile of 256 (a
    // multiple of 4, so element i of the piece stays in chain i mod 4);
    // the four chains then add their tile's squares in order from shared
    // memory: the CPU's additions, with the loads coalesced.
    __shared__ double sq[256];
    __shared__ double s[4];
    i64 a = lo[blockIdx.x], b = lo[blockIdx.x + 1];
    i64 len = b - a, main = len - len % 4;
    int t = threadIdx.x;
    double acc = 0.0;
    for (i64 base = 0; base < main; base += 256) {
        i64 i = base + t;
        double v = i < main ? (double)x[a + i] : 0.0;
        sq[t] = v * v;
        __syncthreads();
        if (t < 4) {
            int m = (int)(main - base < 256 ? main - base : 256);
            for (int k = t; k < m; k += 4) acc += sq[k];
        }
        __syncthreads();
    }
    if (t == 0) {
        for (i64 i = main; i < len; i++) {
            double v = x[a + i];
            acc += v * v;
        }
    }
    if (t < 4) s[t] = acc;
    __syncthreads();
    if (t == 0) part[blockIdx.x] = (s[0] + s[1]) + (s[2] + s[3]);
}

// out[s] = the partials of segment s's pieces [first[s], first[s+1]) added
// in order from zero (one thread per segment, as the CPU adds them).
extern "C" __global__ void k_segment_sum(const double* part, const int* first, double* out, int nseg) {
    GRID_STRIDE(sg, nseg) {
        double s = 0.0;
        for (int p = first[sg]; p < first[sg + 1]; p++) s += part[p];
        out[sg] = s;
    }
}

// dst[j] = x[idx[j]].
extern "C" __global__ void k_gather_idx(float* dst, const float* x, const int* idx, i64 n) {
    GRID_STRIDE(j, n) { dst[j] = x[idx[j]]; }
}

// dst[j] = x[start + j·stride].
extern "C" __global__ void k_gather_strided(float* dst, const float* x, i64 start, i64 stride, i64 n) {
    GRID_STRIDE(j, n) { dst[j] = x[start + j * stride]; }
}

// dst[idx[j]] += scale·val[j] for distinct indices (one list).
extern "C" __global__ void k_scatter_add(float* dst, const int* idx, const float* val, float scale, i64 n) {
    GRID_STRIDE(j, n) { dst[idx[j]] += scale * val[j]; }
}

// dst[idx[j]] = v.
extern "C" __global__ void k_scatter_fill(float* dst, const int* idx, float v, i64 n) {
    GRID_STRIDE(j, n) { dst[idx[j]] = v; }
}

// idx[i] = i.
extern "C" __global__ void k_iota(int* idx, i64 n) {
    GRID_STRIDE(i, n) { idx[i] = (int)i; }
}

// dst[idx[j]] = val[j]·scale.
extern "C" __global__ void k_scatter(float* dst, const int* idx, const float* val, float scale, i64 n) {
    GRID_STRIDE(j, n) { dst[idx[j]] = val[j] * scale; }
}

// mark[idx[j]] = 1 for the indices in [0, lim); bad[0] = min(bad[0], j) for
// the others (the caller sets bad[0] to n beforehand).
extern "C" __global__ void k_mark(float* mark, const int* idx, i64 n, i64 lim, u64* bad) {
    GRID_STRIDE(j, n) {
        int i = idx[j];
        if (i < 0 || (i64)i >= lim) atomicMin(bad, (u64)j);
        else if (mark) mark[i] = 1.0f;
    }
}

// idx[j] += off.
extern "C" __global__ void k_shift(int* idx, int off, i64 n) {
    GRID_STRIDE(j, n) { idx[j] += off; }
}

// idx[j] = start + j.
extern "C" __global__ void k_iota_from(int* idx, int start, i64 n) {
    GRID_STRIDE(j, n) { idx[j] = start + (int)j; }
}

// counts[s] += the indices in [bounds[s], bounds[s+1]) (binary search over
// the nseg+1 ascending bounds).
extern "C" __global__ void k_count_in(const int* idx, i64 n, const i64* bounds, int nseg, u32* counts) {
    GRID_STRIDE(j, n) {
        i64 i = idx[j];
        if (i < bounds[0] || i >= bounds[nseg]) continue;
        int lo = 0, hi = nseg; // bounds[lo] <= i < bounds[hi]
        while (hi - lo > 1) {
            int mid = (lo + hi) / 2;
            if (bounds[mid] <= i) lo = mid;
            else hi = mid;
        }
        atomicAdd(&counts[lo], 1u);
    }
}

// x[i] /= d.
extern "C" __global__ void k_div(float* x, float d, i64 n) {
    GRID_STRIDE(i, n) { x[i] = x[i] / d; }
}

// dst[j] = x[idx[j]] (int32 elements).
extern "C" __global__ void k_gather_int(int* dst, const int* x, const int* idx, i64 n) {
    GRID_STRIDE(j, n) { dst[j] = x[idx[j]]; }
}

// A list into a dense sparse sum: first value at an index assigned (mark
// set), later ones added. The list's indices are distinct.
extern "C" __global__ void k_scatter_accum(float* dst, float* mark, const int* idx, const float* val, i64 n) {
    GRID_STRIDE(j, n) {
        int i = idx[j];
        if (mark[i] == 0.0f) {
            dst[i] = val[j];
            mark[i] = 1.0f;
        } else {
            dst[i] += val[j];
        }
    }
}
