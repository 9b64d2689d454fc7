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
