// FP16 compression (the fp16 method, fp16Kernel): mode 0 packs, w[i] =
// half(half(acc[i]) / nw); mode 1 unpacks, out[i] = float(w[i]) and res[i]
// = 0. Halves are their bits (unsigned short), converted as package
// device's ToFloat16 (ties to even) and FromFloat16 (exact).

// float32 → half, rounded to the nearest, ties to even; NaN → quiet NaN
// with its sign, overflow → ±Inf, float32 subnormals → ±0.
__device__ unsigned short fp16_from_float(float f) {
    u32 x = __float_as_uint(f);
    unsigned short sign = (unsigned short)((x >> 16) & 0x8000u);
    u32 a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);
    }
    if (a < 0x00800000u) {
        return sign;
    }
    int e = (int)(a >> 23) - 127 + 15;
    u32 m = (a & 0x7fffffu) | 0x800000u;
    int shift = 13;
    if (e < 1) {
        shift = 13 + 1 - e;
        if (shift > 24) {
            return sign;
        }
        e = 1;
    }
    u32 h = m >> shift;
    u32 rem = m & ((1u << shift) - 1u);
    u32 halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) {
        h++;
    }
    u32 bits = ((u32)(e - 1) << 10) + h;
    if (bits >= 0x7c00u) {
        return sign | 0x7c00;
    }
    return sign | (unsigned short)bits;
}

// half → float32, exactly.
__device__ float fp16_to_float(unsigned short h) {
    u32 sign = (u32)(h & 0x8000) << 16;
    u32 exp = (h >> 10) & 0x1fu;
    u32 man = h & 0x3ffu;
    if (exp == 0x1fu) {
        return __uint_as_float(sign | 0x7f800000u | (man << 13));
    }
    if (exp == 0) {
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

extern "C" __global__ void k_fp16(const float* acc, unsigned short* w, float* out, float* res, i64 n, float nw, int mode) {
    GRID_STRIDE(i, n) {
        if (mode == 0) {
            w[i] = fp16_from_float(fp16_to_float(fp16_from_float(acc[i])) / nw);
        } else {
            out[i] = fp16_to_float(w[i]);
            res[i] = 0.0f;
        }
    }
}
