// PowerSGD's passes (the powersgd method, psgdKernel) over one matrix M
// (rows×cols, row-major) with P (rows×r) and Q (cols×r), row-major; every
// product in double (a float's product is exact there), summed in index
// order and rounded once:
//   mode 0, n = rows·r: P = MQ;
//   mode 1, n = 1: Gram–Schmidt on P's columns, as epfml's orthogonalize
//           (col /= (float)‖col‖ + 1e-8; its projection, rounded to float,
//           removed from the later columns);
//   mode 2, n = cols·r: Q = MᵀP;
//   mode 3, n = rows·cols: out = PQᵀ, res = M − out (res may be M);
//   mode 4, n: out = M·inv, res = 0 (an uncompressed tensor's sum in M);
//   mode 5, n: Q = Q·inv.
extern "C" __global__ void k_psgd(const float* M, float* P, float* Q, float* out, float* res, i64 n, int rows, int cols, int r, float inv, int mode) {
    GRID_STRIDE(e, n) {
        if (mode == 0) {
            i64 i = e / r, c = e % r;
            double s = 0;
            for (i64 j = 0; j < cols; j++) s += (double)M[i * cols + j] * (double)Q[j * r + c];
            P[e] = (float)s;
        } else if (mode == 1) {
            for (int c = 0; c < r; c++) {
                double s = 0;
                for (int i = 0; i < rows; i++) {
                    double x = (double)P[(i64)i * r + c];
                    s += x * x;
                }
                float d = (float)sqrt(s) + 1e-8f;
                for (int i = 0; i < rows; i++) P[(i64)i * r + c] /= d;
                for (int c2 = c + 1; c2 < r; c2++) {
                    double dot = 0;
                    for (int i = 0; i < rows; i++) dot += (double)P[(i64)i * r + c] * (double)P[(i64)i * r + c2];
                    float fd = (float)dot;
                    for (int i = 0; i < rows; i++) {
                        float p = fd * P[(i64)i * r + c];
                        P[(i64)i * r + c2] = P[(i64)i * r + c2] - p;
                    }
                }
            }
        } else if (mode == 2) {
            i64 j = e / r, c = e % r;
            double s = 0;
            for (i64 i = 0; i < rows; i++) s += (double)M[i * cols + j] * (double)P[i * r + c];
            Q[e] = (float)s;
        } else if (mode == 3) {
            i64 i = e / cols, j = e % cols;
            double s = 0;
            for (int c = 0; c < r; c++) s += (double)P[i * r + c] * (double)Q[j * r + c];
            float o = (float)s;
            float a = M[e];
            out[e] = o;
            res[e] = a - o;
        } else if (mode == 4) {
            out[e] = M[e] * inv;
            res[e] = 0.0f;
        } else {
            Q[e] = Q[e] * inv;
        }
    }
}
