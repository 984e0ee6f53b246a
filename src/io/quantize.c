/* The MLX affine quantizer and bit packer used by `nextn convert` / `graft`. It reproduces
 * MLX's CPU `quantize` group by group (f32 arithmetic, edge-exact bias, rint), so a checkpoint
 * converted here holds the same codes mlx-lm would have written for the same float weights. */
#include "io/quantize.h"

#include <math.h>
#include <string.h>

bool nx_quant_supported(int bits, int group) {
    bool b = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
    return b && (group == 32 || group == 64 || group == 128);
}

/* ================================================================ float stores */

uint16_t nx_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

uint16_t nx_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* ≥ 65520 rounds to inf */
    uint32_t e = a >> 23;
    if (e >= 113) { /* normal half: exponent ≥ −14 */
        uint32_t h = ((e - 112) << 10) | ((a & 0x7fffffu) >> 13);
        uint32_t rem = a & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry bumps the exponent */
        return (uint16_t)(sign | h);
    }
    if (e < 102) return sign; /* below half the smallest subnormal: ±0 */
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24: units of 2^-24 */
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

void nx_store_floats(nx_dtype dtype, const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) {
        if (dtype == NX_DTYPE_F32) {
            memcpy(d + 4 * i, &src[i], 4);
        } else {
            uint16_t h = dtype == NX_DTYPE_F16 ? nx_f32_to_f16(src[i]) : nx_f32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
    }
}

static float load_float(nx_dtype dtype, const void *src, int64_t i) {
    float f;
    nx_to_f32(dtype, (const uint8_t *)src + (size_t)i * nx_dtype_size(dtype), &f, 1);
    return f;
}

/* ================================================================ packing */

void nx_quant_pack(const uint8_t *q, int64_t n, int bits, uint32_t *out) {
    int64_t words = n * bits / 32;
    memset(out, 0, (size_t)words * sizeof *out);
    for (int64_t i = 0; i < n; i++) {
        int64_t pos = i * bits;
        int64_t w = pos >> 5;
        int off = (int)(pos & 31);
        uint32_t v = q[i] & ((1u << bits) - 1u);
        out[w] |= v << off;
        if (off + bits > 32) out[w + 1] |= v >> (32 - off);
    }
}

uint8_t nx_quant_unpack(const uint32_t *row, int64_t i, int bits) {
    int64_t pos = i * bits;
    int64_t w = pos >> 5;
    int off = (int)(pos & 31);
    uint32_t v = row[w] >> off;
    if (off + bits > 32) v |= row[w + 1] << (32 - off);
    return (uint8_t)(v & ((1u << bits) - 1u));
}

/* ================================================================ quantize / dequantize */

void nx_quantize_row(const float *w, int64_t n, int bits, int group, nx_dtype sdtype, uint32_t *q_out,
                     void *scales, void *biases) {
    const float n_bins = (float)((1 << bits) - 1);
    const int64_t words_per_group = (int64_t)group * bits / 32;
    uint8_t q[128];
    for (int64_t g = 0; g < n / group; g++) {
        const float *x = w + g * group;
        float wmin = INFINITY, wmax = -INFINITY;
        for (int j = 0; j < group; j++) {
            wmax = fmaxf(wmax, x[j]);
            wmin = fminf(wmin, x[j]);
        }
        /* The extreme of larger magnitude becomes the bias (code 0), so it is reproduced
         * exactly; the scale is negative when that extreme is the maximum. */
        bool min_edge = fabsf(wmin) > fabsf(wmax);
        float scale = fmaxf((wmax - wmin) / n_bins, 1e-7f);
        scale = min_edge ? scale : -scale;
        float edge = min_edge ? wmin : wmax;
        float q0 = rintf(edge / scale);
        float bias = 0.0f;
        if (q0 != 0.0f) {
            scale = edge / q0;
            bias = edge;
        }
        for (int j = 0; j < group; j++) {
            float v = rintf((x[j] - bias) / scale);
            v = v > 0.0f ? (v < n_bins ? v : n_bins) : 0.0f; /* NaN → 0 */
            q[j] = (uint8_t)v;
        }
        nx_quant_pack(q, group, bits, q_out + g * words_per_group);
        nx_store_floats(sdtype, &scale, (uint8_t *)scales + (size_t)g * nx_dtype_size(sdtype), 1);
        nx_store_floats(sdtype, &bias, (uint8_t *)biases + (size_t)g * nx_dtype_size(sdtype), 1);
    }
}

void nx_dequantize_row(const uint32_t *q, const void *scales, const void *biases, nx_dtype sdtype,
                       int64_t n, int bits, int group, float *out) {
    for (int64_t g = 0; g < n / group; g++) {
        float s = load_float(sdtype, scales, g), b = load_float(sdtype, biases, g);
        for (int64_t i = g * group; i < (g + 1) * group; i++)
            out[i] = s * (float)nx_quant_unpack(q, i, bits) + b;
    }
}
