/* Advanced SIMD (NEON) kernels, the AArch64 baseline. Every output element is one dot product
 * in 8 f32 lanes (two registers): lane l accumulates elements 8c + l for c = 0, 1, … (zero-filled
 * tail), then a fixed horizontal tree. Register blocks of R weight rows × TT input rows only hold
 * more such accumulators, so a row's result is the same whatever T and the row split are.
 * Quantized weights are widened to f32 in registers (w = s·q + b, as the reference rounds it) and
 * never stored. The vector helpers keep the reference's bits where kernels.h says every ISA does
 * (RMSNorm, the delta rule, argmax, the attention helpers against this table's dot/axpy). */
#if defined(__aarch64__)
#include <math.h>

#include "kernels/neon_common.h"

/* ------------------------------------------------------------------ float weights */

AI void mk_float(nx_dtype dt, const int R, const int TT, const uint8_t *w, size_t stride, const float *x,
                 int64_t ldx, float *y, int64_t ldy, int64_t ys, int64_t in) {
    f8 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[r][t] = f8_zero();
    int64_t i = 0;
    for (; i + 8 <= in; i += 8) {
        f8 xv[4];
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) xv[t] = f8_load(x + t * ldx + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const f8 wv = load_w8(dt, w + r * stride, i);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) acc[r][t] = f8_fma(acc[r][t], wv, xv[t]);
        }
    }
    if (i < in) {
        f8 xv[4];
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) xv[t] = load_x8_tail(x + t * ldx + i, in - i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const f8 wv = load_w8_tail(dt, w + r * stride, i, in - i);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) acc[r][t] = f8_fma(acc[r][t], wv, xv[t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) y[t * ldy + r * ys] = f8_hsum(acc[r][t]);
}

/* 32 vector registers: 4 rows for 1-2 input rows, 2 rows for 3-4 (16 accumulator registers
 * either way, the rest for inputs and weights). */
#define RFULL(TT) ((TT) <= 2 ? 4 : 2)

#define FLOAT_KERNEL(NAME, DT)                                                                      \
    static void NAME(int R, int TT, const uint8_t *w, size_t stride, const float *x, int64_t ldx,  \
                     float *y, int64_t ldy, int64_t ys, int64_t in) {                               \
        if (R > 1) {                                                                                \
            switch (TT) {                                                                           \
            case 1: mk_float(DT, 4, 1, w, stride, x, ldx, y, ldy, ys, in); break;                   \
            case 2: mk_float(DT, 4, 2, w, stride, x, ldx, y, ldy, ys, in); break;                   \
            case 3: mk_float(DT, 2, 3, w, stride, x, ldx, y, ldy, ys, in); break;                   \
            default: mk_float(DT, 2, 4, w, stride, x, ldx, y, ldy, ys, in); break;                  \
            }                                                                                       \
        } else {                                                                                    \
            switch (TT) {                                                                           \
            case 1: mk_float(DT, 1, 1, w, stride, x, ldx, y, ldy, ys, in); break;                   \
            case 2: mk_float(DT, 1, 2, w, stride, x, ldx, y, ldy, ys, in); break;                   \
            case 3: mk_float(DT, 1, 3, w, stride, x, ldx, y, ldy, ys, in); break;                   \
            default: mk_float(DT, 1, 4, w, stride, x, ldx, y, ldy, ys, in); break;                  \
            }                                                                                       \
        }                                                                                           \
    }

FLOAT_KERNEL(kern_f32, NX_DTYPE_F32)
FLOAT_KERNEL(kern_f16, NX_DTYPE_F16)
FLOAT_KERNEL(kern_bf16, NX_DTYPE_BF16)

/* ------------------------------------------------------------------ quantized weights */

typedef struct qargs {
    const uint8_t *w;       /* first row of the block */
    size_t wstride;         /* packed bytes between the block's rows */
    const uint8_t *sc, *bi; /* scales/biases of the first row (bi may be NULL) */
    size_t sstride;         /* scale bytes between the block's rows */
    nx_dtype sdt;
    int64_t in, group;
    const nqlut *lut;
} qargs;

/* Bytes 8h .. 8h + 7 of q (natural order) as 8 f32 lanes. */
AI f8 q8_to_f8(const uint8x16_t q[2], const int h) {
    const uint8x8_t b = (h & 1) ? vget_high_u8(q[h >> 1]) : vget_low_u8(q[h >> 1]);
    const uint16x8_t u = vmovl_u8(b);
    return (f8){vcvtq_f32_u32(vmovl_u16(vget_low_u16(u))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(u)))};
}

AI void mk_quant(const int BITS, const int R, const int TT, const qargs *a, const float *x, int64_t ldx, float *y,
                 int64_t ldy, int64_t ys) {
    f8 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[r][t] = f8_zero();
    const int64_t ngroups = a->in / a->group, nblk = a->group / 32;
    for (int64_t g = 0; g < ngroups; g++) {
        float32x4_t s[4], b[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            s[r] = vdupq_n_f32(load_sc(a->sdt, a->sc + r * a->sstride, g));
            b[r] = vdupq_n_f32(a->bi ? load_sc(a->sdt, a->bi + r * a->sstride, g) : 0.0f);
        }
        for (int64_t k = 0; k < nblk; k++) {
            const int64_t e0 = g * a->group + k * 32; /* first element of the block */
            const uint8_t *p = a->w + (size_t)e0 * BITS / 8;
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                uint8x16_t q[2];
                unpack32(BITS, p + r * a->wstride, a->lut, q);
#pragma GCC unroll 4
                for (int h = 0; h < 4; h++) {
                    const f8 qf = q8_to_f8(q, h);
                    /* s·q + b rounded twice, as the reference dequantizes (a fused step would
                     * differ where b cancels s·q) */
                    const f8 wv = {vaddq_f32(vmulq_f32(qf.a, s[r]), b[r]), vaddq_f32(vmulq_f32(qf.b, s[r]), b[r])};
#pragma GCC unroll 4
                    for (int t = 0; t < TT; t++) acc[r][t] = f8_fma(acc[r][t], wv, f8_load(x + t * ldx + e0 + 8 * h));
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) y[t * ldy + r * ys] = f8_hsum(acc[r][t]);
}

#define QUANT_KERNEL(NAME, BITS)                                                                           \
    static void NAME(int R, int TT, const qargs *a, const float *x, int64_t ldx, float *y, int64_t ldy,   \
                     int64_t ys) {                                                                         \
        if (R > 1) {                                                                                       \
            switch (TT) {                                                                                  \
            case 1: mk_quant(BITS, 4, 1, a, x, ldx, y, ldy, ys); break;                                    \
            case 2: mk_quant(BITS, 4, 2, a, x, ldx, y, ldy, ys); break;                                    \
            case 3: mk_quant(BITS, 2, 3, a, x, ldx, y, ldy, ys); break;                                    \
            default: mk_quant(BITS, 2, 4, a, x, ldx, y, ldy, ys); break;                                   \
            }                                                                                              \
        } else {                                                                                           \
            switch (TT) {                                                                                  \
            case 1: mk_quant(BITS, 1, 1, a, x, ldx, y, ldy, ys); break;                                    \
            case 2: mk_quant(BITS, 1, 2, a, x, ldx, y, ldy, ys); break;                                    \
            case 3: mk_quant(BITS, 1, 3, a, x, ldx, y, ldy, ys); break;                                    \
            default: mk_quant(BITS, 1, 4, a, x, ldx, y, ldy, ys); break;                                   \
            }                                                                                              \
        }                                                                                                  \
    }

QUANT_KERNEL(kern_q2, 2)
QUANT_KERNEL(kern_q3, 3)
QUANT_KERNEL(kern_q4, 4)
QUANT_KERNEL(kern_q5, 5)
QUANT_KERNEL(kern_q6, 6)
QUANT_KERNEL(kern_q8, 8)

/* b's first row: row o of W (a: the call's row geometry). */
static inline void qargs_at(qargs *b, const nx_linear *W, const qargs *a, int64_t o) {
    b->w = (const uint8_t *)W->w + (size_t)o * a->wstride;
    b->sc = (const uint8_t *)W->scales + (size_t)o * a->sstride;
    b->bi = W->biases ? (const uint8_t *)W->biases + (size_t)o * a->sstride : NULL;
}

/* ------------------------------------------------------------------ blocking driver */

static int neon_matmul_quant(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy,
                             int64_t o0, int64_t o1) {
    void (*kern)(int, int, const qargs *, const float *, int64_t, float *, int64_t, int64_t);
    switch (W->bits) {
    case 2: kern = kern_q2; break;
    case 3: kern = kern_q3; break;
    case 4: kern = kern_q4; break;
    case 5: kern = kern_q5; break;
    case 6: kern = kern_q6; break;
    case 8: kern = kern_q8; break;
    default: return 0;
    }
    nqlut lut;
    nqlut_init(&lut, W->bits);
    const int64_t in = W->in;
    qargs a = {.wstride = (size_t)in * (size_t)W->bits / 8,
               .sstride = (size_t)(in / W->group) * nx_dtype_size(W->sdtype),
               .sdt = W->sdtype,
               .in = in,
               .group = W->group,
               .lut = &lut};
    if (T <= 4) { /* split streams: row o of each of R equal parts, then the rest one by one */
        const int R = RFULL(T);
        const int64_t q = (o1 - o0) / R;
        qargs b = a;
        b.wstride *= (size_t)q;
        b.sstride *= (size_t)q;
        for (int64_t o = o0; o < o0 + q; o++) {
            qargs_at(&b, W, &a, o);
            kern(R, (int)T, &b, x, ldx, y + o, ldy, q);
        }
        for (int64_t o = o0 + R * q; o < o1; o++) {
            qargs_at(&a, W, &a, o);
            kern(1, (int)T, &a, x, ldx, y + o, ldy, 1);
        }
        return 1;
    }
    const int64_t ob = nx_rows_per_block(a.wstride);
    for (int64_t b0 = o0; b0 < o1; b0 += ob) {
        const int64_t b1 = b0 + ob < o1 ? b0 + ob : o1;
        for (int64_t t = 0; t < T; t += 4) {
            const int tt = T - t < 4 ? (int)(T - t) : 4;
            for (int64_t o = b0; o < b1;) {
                const int R = o + RFULL(tt) <= b1 ? RFULL(tt) : 1;
                qargs_at(&a, W, &a, o);
                kern(R, tt, &a, x + t * ldx, ldx, y + t * ldy + o, ldy, 1);
                o += R;
            }
        }
    }
    return 1;
}

/* Rows [o0, o1) of W·x on float activations: the whole of this table's matmul, and what the
 * integer tables (neon_dot.c) run for the weights they do not take. */
int nx_neon_matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy,
                        int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s) {
    (void)next; /* no software prefetch: the cores' prefetchers follow the split streams */
    (void)s;
    if (W->dtype == NX_DTYPE_U32) return neon_matmul_quant(W, x, ldx, T, y, ldy, o0, o1);
    void (*kern)(int, int, const uint8_t *, size_t, const float *, int64_t, float *, int64_t, int64_t, int64_t);
    switch (W->dtype) {
    case NX_DTYPE_F32: kern = kern_f32; break;
    case NX_DTYPE_F16: kern = kern_f16; break;
    case NX_DTYPE_BF16: kern = kern_bf16; break;
    default: return 0;
    }
    const int64_t in = W->in;
    const size_t stride = (size_t)in * nx_dtype_size(W->dtype);
    if (T <= 4) {
        const int R = RFULL(T);
        const int64_t q = (o1 - o0) / R;
        for (int64_t o = o0; o < o0 + q; o++)
            kern(R, (int)T, (const uint8_t *)W->w + (size_t)o * stride, (size_t)q * stride, x, ldx, y + o, ldy, q, in);
        for (int64_t o = o0 + R * q; o < o1; o++)
            kern(1, (int)T, (const uint8_t *)W->w + (size_t)o * stride, stride, x, ldx, y + o, ldy, 1, in);
        return 1;
    }
    const int64_t ob = nx_rows_per_block(stride);
    for (int64_t b0 = o0; b0 < o1; b0 += ob) {
        const int64_t b1 = b0 + ob < o1 ? b0 + ob : o1;
        for (int64_t t = 0; t < T; t += 4) {
            const int tt = T - t < 4 ? (int)(T - t) : 4;
            for (int64_t o = b0; o < b1;) {
                const int R = o + RFULL(tt) <= b1 ? RFULL(tt) : 1;
                kern(R, tt, (const uint8_t *)W->w + (size_t)o * stride, stride, x + t * ldx, ldx, y + t * ldy + o,
                     ldy, 1, in);
                o += R;
            }
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ vector helpers */

void nx_neon_to_f32(nx_dtype t, const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    if (t == NX_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) f8_store(dst + i, load_w8(t, s, i));
    if (i < n) {
        float buf[8];
        f8_store(buf, load_w8_tail(t, s, i, n - i));
        memcpy(dst + i, buf, (size_t)(n - i) * 4);
    }
}

float nx_neon_dot_f32(const float *a, const float *b, int64_t n) {
    f8 acc = f8_zero();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = f8_fma(acc, f8_load(a + i), f8_load(b + i));
    if (i < n) acc = f8_fma(acc, load_x8_tail(a + i, n - i), load_x8_tail(b + i, n - i));
    return f8_hsum(acc);
}

void nx_neon_axpy_f32(float a, const float *x, float *y, int64_t n) {
    const float32x4_t av = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), av, vld1q_f32(x + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* Cached row p of an attention call as f32: the row itself, or (f16) widened exactly into buf. */
AI const float *kv_row(const void *base, nx_dtype kvt, int64_t stride, int64_t p, int64_t hd, float *buf) {
    if (kvt != NX_DTYPE_F16) return (const float *)base + p * stride;
    nx_neon_to_f32(NX_DTYPE_F16, (const uint16_t *)base + p * stride, buf, hd);
    return buf;
}

/* Scores: each the bits of nx_neon_dot_f32 on the row (computed by it), the row read once for
 * all g heads. */
void nx_neon_attn_scores(const float *q, int64_t g, const void *K, nx_dtype kvt, int64_t stride, int64_t n,
                         int64_t hd, float scale, float *out, int64_t ldo) {
    float buf[NX_ATTN_MAX_HD];
    for (int64_t p = 0; p < n; p++) {
        const float *k = kv_row(K, kvt, stride, p, hd, buf);
        for (int64_t h = 0; h < g; h++) out[h * ldo + p] = nx_neon_dot_f32(q + h * hd, k, hd) * scale;
    }
}

void nx_neon_attn_accum(const float *w, int64_t ldw, int64_t g, const void *V, nx_dtype kvt, int64_t stride,
                        int64_t n, int64_t hd, float *o) {
    float buf[NX_ATTN_MAX_HD];
    for (int64_t p = 0; p < n; p++) {
        const float *v = kv_row(V, kvt, stride, p, hd, buf);
        for (int64_t h = 0; h < g; h++) nx_neon_axpy_f32(w[h * ldw + p], v, o + h * hd, hd);
    }
}

/* e^x for 4 lanes, step for step the AVX2 kernels' exp8 (Cephes' degree-6 polynomial after an
 * exact k·ln2 reduction; ·2^k as two exact power-of-two factors, the second product rounding
 * once). Within 2 ulp of expf; below about -103 the result is 0; NaN stays NaN. */
AI float32x4_t exp4(float32x4_t x) {
    x = vmaxq_f32(vdupq_n_f32(-104.0f), x); /* NaN propagates through both */
    x = vminq_f32(vdupq_n_f32(88.7f), x);
    const float32x4_t k = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, k, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t ki = vcvtq_s32_f32(k); /* a NaN's lanes: 0, and p is NaN anyway */
    const int32x4_t k1 = vshrq_n_s32(ki, 1), k2 = vsubq_s32(ki, k1), bias = vdupq_n_s32(127);
    const float32x4_t f1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k1, bias), 23));
    const float32x4_t f2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k2, bias), 23));
    return vmulq_f32(vmulq_f32(p, f1), f2);
}

/* The max, e^(x - max) by exp4 summed in 4 lanes (tail lanes 0). */
float nx_neon_exp_shift_f32(float *x, int64_t n, float *mx_out) {
    const int64_t full = n & ~(int64_t)3, tail = n - full;
    float32x4_t mx = vdupq_n_f32(-INFINITY);
    for (int64_t i = 0; i < full; i += 4) mx = vmaxq_f32(vld1q_f32(x + i), mx);
    float m = vmaxvq_f32(mx);
    for (int64_t i = full; i < n; i++) m = isnan(x[i]) || isnan(m) ? NAN : x[i] > m ? x[i] : m;
    *mx_out = m;
    const float32x4_t mv = vdupq_n_f32(m);
    float32x4_t sum = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < full; i += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), mv));
        vst1q_f32(x + i, e);
        sum = vaddq_f32(sum, e);
    }
    if (tail) {
        float b[4] = {0};
        memcpy(b, x + full, (size_t)tail * 4);
        vst1q_f32(b, exp4(vsubq_f32(vld1q_f32(b), mv)));
        for (int64_t l = tail; l < 4; l++) b[l] = 0.0f;
        memcpy(x + full, b, (size_t)tail * 4);
        sum = vaddq_f32(sum, vld1q_f32(b));
    }
    const float32x2_t h = vadd_f32(vget_low_f32(sum), vget_high_f32(sum));
    return vget_lane_f32(vpadd_f32(h, h), 0);
}

/* g / (1 + e^-g) · u, 4 lanes at a time (the tail through a zero-padded buffer). */
AI float32x4_t swiglu4(float32x4_t g, float32x4_t u) {
    const float32x4_t e = exp4(vnegq_f32(g));
    return vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e)), u);
}

void nx_neon_swiglu_f32(float *g, const float *u, int64_t n) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(g + i, swiglu4(vld1q_f32(g + i), u ? vld1q_f32(u + i) : one));
    if (i < n) {
        float bg[4] = {0}, bu[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        memcpy(bg, g + i, (size_t)(n - i) * 4);
        if (u) memcpy(bu, u + i, (size_t)(n - i) * 4);
        vst1q_f32(bg, swiglu4(vld1q_f32(bg), vld1q_f32(bu)));
        memcpy(g + i, bg, (size_t)(n - i) * 4);
    }
}

/* nx_rmsnorm_f32: the 8 partial sums of squares are 8 double lanes in four registers (multiply
 * then add, no fused step), so the bits are the reference's. */
void nx_neon_rmsnorm_f32(const float *x, const float *w, float eps, int64_t n, float *out) {
    float64x2_t acc[4] = {vdupq_n_f64(0.0), vdupq_n_f64(0.0), vdupq_n_f64(0.0), vdupq_n_f64(0.0)};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 4; l++) {
            const float64x2_t v = vcvt_f64_f32(vld1_f32(x + i + 2 * l));
            acc[l] = vaddq_f64(acc[l], vmulq_f64(v, v));
        }
    double part[8];
    for (int l = 0; l < 4; l++) vst1q_f64(part + 2 * l, acc[l]);
    const float r = nx_rmsnorm_scale(part, x, i, n, eps);
    const float32x4_t rv = vdupq_n_f32(r);
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t v = vmulq_f32(vld1q_f32(x + i), rv);
        if (w) v = vmulq_f32(v, vld1q_f32(w + i));
        vst1q_f32(out + i, v);
    }
    for (; i < n; i++) out[i] = x[i] * r * (w ? w[i] : 1.0f);
}

/* nx_delta_rule_f32 on U vectors (4U columns) of the state at a time, each lane running the
 * reference's loop for its column (products and sums rounded separately); the last dv mod 4
 * columns as it does. U independent sums per pass rather than one: the add latency bound the
 * single-vector version. The first pass hints the block DR_PF rows ahead (past the end: the next
 * head's state, which follows): a state comes cold from memory every token. */
#define DR_PF 16
AI void delta_cols(const int U, const float *src, float *dst, int64_t dk, int64_t dv, int64_t j, const float *k,
                   const float *v, float decay, float beta, const float *q, float *o) {
    const float32x4_t dc = vdupq_n_f32(decay);
    float32x4_t kv[8], d[8], acc[8];
    for (int u = 0; u < U; u++) kv[u] = acc[u] = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < dk; i++) {
        const float32x4_t ki = vdupq_n_f32(k[i]);
        const float *s = src + i * dv + j;
        __builtin_prefetch(s + DR_PF * dv);
        for (int u = 0; u < U; u++) kv[u] = vaddq_f32(kv[u], vmulq_f32(vmulq_f32(vld1q_f32(s + 4 * u), dc), ki));
    }
    for (int u = 0; u < U; u++) d[u] = vmulq_f32(vdupq_n_f32(beta), vsubq_f32(vld1q_f32(v + j + 4 * u), kv[u]));
    for (int64_t i = 0; i < dk; i++) {
        const float32x4_t ki = vdupq_n_f32(k[i]), qi = vdupq_n_f32(o ? q[i] : 0.0f);
        const float *s = src + i * dv + j;
        float *w = dst + i * dv + j;
        for (int u = 0; u < U; u++) {
            const float32x4_t t = vaddq_f32(vmulq_f32(vld1q_f32(s + 4 * u), dc), vmulq_f32(ki, d[u]));
            vst1q_f32(w + 4 * u, t);
            acc[u] = vaddq_f32(acc[u], vmulq_f32(t, qi));
        }
    }
    if (o)
        for (int u = 0; u < U; u++) vst1q_f32(o + j + 4 * u, acc[u]);
}

void nx_neon_delta_rule_f32(const float *src, float *dst, int64_t dk, int64_t dv, const float *k, const float *v,
                            float decay, float beta, const float *q, float *o) {
    int64_t j = 0;
    for (; j + 32 <= dv; j += 32) delta_cols(8, src, dst, dk, dv, j, k, v, decay, beta, q, o);
    for (; j + 4 <= dv; j += 4) delta_cols(1, src, dst, dk, dv, j, k, v, decay, beta, q, o);
    for (; j < dv; j++) { /* the reference's loops on one column */
        float kv = 0.0f;
        for (int64_t i = 0; i < dk; i++) {
            const float t = src[i * dv + j] * decay;
            dst[i * dv + j] = t;
            kv += t * k[i];
        }
        const float d = beta * (v[j] - kv);
        float acc = 0.0f;
        for (int64_t i = 0; i < dk; i++) {
            const float t = dst[i * dv + j] + k[i] * d;
            dst[i * dv + j] = t;
            if (o) acc += t * q[i];
        }
        if (o) o[j] = acc;
    }
}

/* Each of 4 lanes keeps its first largest element (strictly greater replaces); the lanes holding
 * the overall largest give their smallest index; the tail then replaces only if strictly
 * greater. NaN becomes -inf in place first. */
int64_t nx_neon_argmax_f32(float *x, int64_t n, float *max) {
    float32x4_t best = vdupq_n_f32(-INFINITY);
    uint32x4_t at = vdupq_n_u32(0), idx = {0, 1, 2, 3};
    const uint32x4_t step = vdupq_n_u32(4);
    const int64_t full = n & ~(int64_t)3;
    for (int64_t i = 0; i < full; i += 4, idx = vaddq_u32(idx, step)) {
        float32x4_t v = vld1q_f32(x + i);
        const uint32x4_t ok = vceqq_f32(v, v);
        if (vminvq_u32(ok) == 0) {
            v = vbslq_f32(ok, v, vdupq_n_f32(-INFINITY));
            vst1q_f32(x + i, v);
        }
        const uint32x4_t gt = vcgtq_f32(v, best);
        best = vbslq_f32(gt, v, best);
        at = vbslq_u32(gt, idx, at);
    }
    float m = vmaxvq_f32(best);
    int64_t arg = 0;
    if (m != -INFINITY) {
        const uint32x4_t hit = vceqq_f32(best, vdupq_n_f32(m));
        arg = vminvq_u32(vbslq_u32(hit, at, vdupq_n_u32(UINT32_MAX)));
    }
    for (int64_t i = full; i < n; i++) {
        if (isnan(x[i])) x[i] = -INFINITY;
        if (x[i] > m) {
            m = x[i];
            arg = i;
        }
    }
    *max = m;
    return arg;
}

/* nx_exp_weights on 2 doubles: y = (x - m)·inv_t = k·ln2 + r with k = round(y/ln2), |r| <= ln2/2
 * (ln2 in two parts), e^r by its Taylor polynomial to r^12, then ·2^k as two exact power-of-two
 * factors (the second product rounds once, subnormal results included); y below -746, and -inf,
 * give 0. The sum runs in 2 lanes, added at the end. */
AI float64x2_t exp_w2(float64x2_t y) {
    static const double c[13] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040,
                                 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600};
    const float64x2_t lo = vdupq_n_f64(-746.0);
    const uint64x2_t live = vcgtq_f64(y, lo);
    const float64x2_t yc = vmaxq_f64(y, lo);
    const float64x2_t k = vrndnq_f64(vmulq_f64(yc, vdupq_n_f64(1.4426950408889634)));
    const float64x2_t r = vfmsq_f64(vfmsq_f64(yc, k, vdupq_n_f64(6.93147180369123816490e-01)), k,
                                    vdupq_n_f64(1.90821492927058770002e-10));
    float64x2_t p = vdupq_n_f64(c[12]);
    for (int j = 11; j >= 0; j--) p = vfmaq_f64(vdupq_n_f64(c[j]), p, r);
    const int64x2_t ki = vcvtq_s64_f64(k);
    const int64x2_t k1 = vshrq_n_s64(ki, 1), k2 = vsubq_s64(ki, k1), bias = vdupq_n_s64(1023);
    const float64x2_t f1 = vreinterpretq_f64_s64(vshlq_n_s64(vaddq_s64(k1, bias), 52));
    const float64x2_t f2 = vreinterpretq_f64_s64(vshlq_n_s64(vaddq_s64(k2, bias), 52));
    const float64x2_t e = vmulq_f64(vmulq_f64(p, f1), f2);
    return vreinterpretq_f64_u64(vandq_u64(vreinterpretq_u64_f64(e), live));
}

double nx_neon_exp_weights(const float *x, int64_t n, float m, double inv_t, double *w) {
    const float64x2_t vm = vdupq_n_f64((double)m), vt = vdupq_n_f64(inv_t);
    float64x2_t sum = vdupq_n_f64(0.0);
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
        const float64x2_t e = exp_w2(vmulq_f64(vsubq_f64(vcvt_f64_f32(vld1_f32(x + i)), vm), vt));
        vst1q_f64(w + i, e);
        sum = vaddq_f64(sum, e);
    }
    if (i < n) { /* the last element in lane 0, lane 1 zero */
        const float64x2_t y = vmulq_f64(vsubq_f64(vdupq_n_f64((double)x[i]), vm), vt);
        const float64x2_t e = vsetq_lane_f64(0.0, exp_w2(y), 1);
        w[i] = vgetq_lane_f64(e, 0);
        sum = vaddq_f64(sum, e);
    }
    return vgetq_lane_f64(sum, 0) + vgetq_lane_f64(sum, 1);
}

const nx_kernel_table nx_kernels_neon = {
    .name = "neon",
    .matmul_rows = nx_neon_matmul_rows,
    NX_NEON_VECTOR_HELPERS,
};

#endif
