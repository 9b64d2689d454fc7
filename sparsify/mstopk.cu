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
