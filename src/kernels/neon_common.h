/* Helpers shared by the AArch64 kernel files (neon.c, neon_dot.c, neon_i8mm.c; only built for
 * AArch64, where Advanced SIMD is part of the base architecture). */
#ifndef NX_KERNELS_NEON_COMMON_H
#define NX_KERNELS_NEON_COMMON_H

#include <arm_neon.h>

#include "kernels/kernels_internal.h"

#define AI static inline __attribute__((always_inline))

/* neon.c's kernels, shared by every AArch64 table: the float-activation matmul (what the integer
 * tables run for weights they do not take) and the vector helpers. */
int nx_neon_matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy,
                        int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s);
void nx_neon_to_f32(nx_dtype t, const void *src, float *dst, int64_t n);
float nx_neon_dot_f32(const float *a, const float *b, int64_t n);
void nx_neon_axpy_f32(float a, const float *x, float *y, int64_t n);
void nx_neon_attn_scores(const float *q, int64_t g, const void *K, nx_dtype kvt, int64_t stride, int64_t n,
                         int64_t hd, float scale, float *out, int64_t ldo);
void nx_neon_attn_accum(const float *w, int64_t ldw, int64_t g, const void *V, nx_dtype kvt, int64_t stride,
                        int64_t n, int64_t hd, float *o);
float nx_neon_exp_shift_f32(float *x, int64_t n, float *mx);
void nx_neon_swiglu_f32(float *g, const float *u, int64_t n);
void nx_neon_rmsnorm_f32(const float *x, const float *w, float eps, int64_t n, float *out);
void nx_neon_delta_rule_f32(const float *src, float *dst, int64_t dk, int64_t dv, const float *k, const float *v,
                            float decay, float beta, const float *q, float *o);
int64_t nx_neon_argmax_f32(float *x, int64_t n, float *max);
double nx_neon_exp_weights(const float *x, int64_t n, float m, double inv_t, double *w);

#define NX_NEON_VECTOR_HELPERS                                                                   \
    .to_f32 = nx_neon_to_f32, .dot_f32 = nx_neon_dot_f32, .axpy_f32 = nx_neon_axpy_f32,          \
    .attn_scores = nx_neon_attn_scores, .attn_accum = nx_neon_attn_accum,                        \
    .exp_shift_f32 = nx_neon_exp_shift_f32, .swiglu_f32 = nx_neon_swiglu_f32,                        \
    .rmsnorm_f32 = nx_neon_rmsnorm_f32, .argmax_f32 = nx_neon_argmax_f32,                        \
    .exp_weights = nx_neon_exp_weights, .delta_rule_f32 = nx_neon_delta_rule_f32

/* Eight f32 lanes as two registers: lane l of the pair accumulates elements 8c + l, the same
 * layout as the AVX2 kernels, so the blocking below reads like theirs. */
typedef struct f8 {
    float32x4_t a, b;
} f8;

AI f8 f8_zero(void) { return (f8){vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
AI f8 f8_load(const float *p) { return (f8){vld1q_f32(p), vld1q_f32(p + 4)}; }
AI void f8_store(float *p, f8 v) {
    vst1q_f32(p, v.a);
    vst1q_f32(p + 4, v.b);
}
/* acc + a·b, fused */
AI f8 f8_fma(f8 acc, f8 a, f8 b) { return (f8){vfmaq_f32(acc.a, a.a, b.a), vfmaq_f32(acc.b, a.b, b.b)}; }

/* The fixed horizontal tree of an 8-lane sum: lanes l and l + 4, then pairs, then the two. */
AI float f8_hsum(f8 v) {
    const float32x4_t s = vaddq_f32(v.a, v.b);
    const float32x2_t h = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(vpadd_f32(h, h), 0);
}

AI float32x4_t bf16x4_to_f32(uint16x4_t h) { return vreinterpretq_f32_u32(vshll_n_u16(h, 16)); }
AI float32x4_t f16x4_to_f32(uint16x4_t h) { return vcvt_f32_f16(vreinterpret_f16_u16(h)); }

/* 8 weights of a float row from element i (exact widening of f16 and bf16). Weights may sit at
 * any byte address: loaded as bytes. */
AI f8 load_w8(nx_dtype dt, const uint8_t *row, int64_t i) {
    if (dt == NX_DTYPE_F32) {
        const uint8_t *p = row + 4 * i;
        return (f8){vreinterpretq_f32_u8(vld1q_u8(p)), vreinterpretq_f32_u8(vld1q_u8(p + 16))};
    }
    const uint16x8_t h = vreinterpretq_u16_u8(vld1q_u8(row + 2 * i));
    if (dt == NX_DTYPE_F16) return (f8){f16x4_to_f32(vget_low_u16(h)), f16x4_to_f32(vget_high_u16(h))};
    return (f8){bf16x4_to_f32(vget_low_u16(h)), bf16x4_to_f32(vget_high_u16(h))};
}

/* The n < 8 weights from element i, zeros after them; never reads past them. */
AI f8 load_w8_tail(nx_dtype dt, const uint8_t *row, int64_t i, int64_t n) {
    uint8_t buf[32] = {0};
    memcpy(buf, row + i * (int64_t)nx_dtype_size(dt), (size_t)n * nx_dtype_size(dt));
    return load_w8(dt, buf, 0);
}

AI f8 load_x8_tail(const float *x, int64_t n) {
    float buf[8] = {0};
    memcpy(buf, x, (size_t)n * 4);
    return f8_load(buf);
}

/* Element i of a scale/bias vector stored as F16, BF16 or F32. */
AI float load_sc(nx_dtype dt, const uint8_t *p, int64_t i) {
    return nx_load_scalar(dt, p, i);
}

/* Per-lane byte picks and shifts that pull the 32 elements of a 3-, 5- or 6-bit block (4·bits
 * bytes) into 16-bit lanes: lane j of vector h holds bytes (pick, pick + 1) of element 8h + j,
 * shifted right by its bit offset. Picks past the block read as 0 (table lookups of 255). */
typedef struct nqlut {
    uint8x16_t pick[4];
    int16x8_t shift[4];
    uint16x8_t mask;
} nqlut;

static inline void nqlut_init(nqlut *L, int bits) {
    const int nbytes = 4 * bits;
    for (int h = 0; h < 4; h++) {
        uint8_t pk[16];
        int16_t sh[8];
        for (int j = 0; j < 8; j++) {
            const int pos = (8 * h + j) * bits, byte = pos >> 3;
            /* the block sits in two registers: bytes [0, 16) and its last 16 (nbytes - 16 ..) */
            for (int k = 0; k < 2; k++) {
                const int b = byte + k;
                pk[2 * j + k] = (uint8_t)(b >= nbytes ? 255 : b < 16 ? b : 16 + b - (nbytes - 16));
            }
            sh[j] = (int16_t)-(pos & 7);
        }
        L->pick[h] = vld1q_u8(pk);
        L->shift[h] = vld1q_s16(sh);
    }
    L->mask = vdupq_n_u16((uint16_t)((1u << bits) - 1u));
}

/* The 32 q values of one block (4·BITS bytes at p, never read past) in natural order as bytes:
 * elements 0-15 in q[0], 16-31 in q[1]. */
AI void unpack32(const int BITS, const uint8_t *p, const nqlut *L, uint8x16_t q[2]) {
    if (BITS == 8) {
        q[0] = vld1q_u8(p);
        q[1] = vld1q_u8(p + 16);
    } else if (BITS == 4) { /* byte k: elements 2k (low nibble) and 2k + 1 */
        const uint8x16_t v = vld1q_u8(p), lo = vandq_u8(v, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(v, 4);
        q[0] = vzip1q_u8(lo, hi);
        q[1] = vzip2q_u8(lo, hi);
    } else if (BITS == 2) { /* byte k: elements 4k .. 4k + 3 from the low bits up */
        const uint8x16_t v = vcombine_u8(vld1_u8(p), vdup_n_u8(0)), m = vdupq_n_u8(3);
        const uint8x16_t a0 = vandq_u8(v, m), a1 = vandq_u8(vshrq_n_u8(v, 2), m);
        const uint8x16_t a2 = vandq_u8(vshrq_n_u8(v, 4), m), a3 = vshrq_n_u8(v, 6);
        const uint8x16_t a02 = vzip1q_u8(a0, a2), a13 = vzip1q_u8(a1, a3);
        q[0] = vzip1q_u8(a02, a13);
        q[1] = vzip2q_u8(a02, a13);
    } else {
        const int nb = 4 * BITS; /* 12, 20 or 24 bytes */
        uint8x16x2_t t;
        if (BITS == 3) { /* 12 bytes: 8, then 4 at byte 8 */
            uint32_t w;
            memcpy(&w, p + 8, 4);
            t.val[0] = vcombine_u8(vld1_u8(p), vreinterpret_u8_u32(vdup_n_u32(w)));
            t.val[1] = t.val[0]; /* picks never reach it: the last 16 bytes are the first 12's */
        } else {
            t.val[0] = vld1q_u8(p);
            t.val[1] = vld1q_u8(p + nb - 16);
        }
        uint16x8_t u[4];
        for (int h = 0; h < 4; h++) {
            const uint16x8_t v = vreinterpretq_u16_u8(vqtbl2q_u8(t, L->pick[h]));
            u[h] = vandq_u16(vshlq_u16(v, L->shift[h]), L->mask);
        }
        q[0] = vcombine_u8(vmovn_u16(u[0]), vmovn_u16(u[1]));
        q[1] = vcombine_u8(vmovn_u16(u[2]), vmovn_u16(u[3]));
    }
}

#endif
