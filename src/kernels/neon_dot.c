/* AArch64 integer kernels for 2- to 6-bit affine weights: the "neondot" table (FEAT_DotProd,
 * sdot) and, built again as neon_i8mm.c, "neoni8mm" (FEAT_I8MM, smmla on pairs of weight rows ×
 * pairs of input rows). Everything else (float weights, 8-bit weights, weights marked x16, rows
 * wider than the staging takes) goes to neon.c's float-activation kernels.
 *
 * Each input row is first rounded per weight group to int8 at scale d = max|x|/127 (each element
 * within 1/254 of its group's largest, llama.cpp's q8; a power of two for groups below 2^-100, and
 * d = NaN for a group holding a NaN or an infinity), as avx512_vnni.c does on int8. The packed
 * weights are widened to bytes (their q values are below 64, so they are valid signed bytes) and
 * multiplied exactly in int32. Per group, weight row and input row the float epilogue is
 * y = (y + (s·d)·Σq·x̂) + b·Σx, each operation rounded once, Σx the group's f32 sum.
 *
 * Numerics contract: the int8 image of a row depends on that row alone, integer sums are exact
 * whichever instruction formed them (sdot on one row, smmla on a pair), and the epilogue is the
 * same sequence for every output, so a result does not depend on T, the row split, the thread
 * count, or on which table of the two ran. */
#if defined(__aarch64__)
#include <math.h>

#include "kernels/neon_common.h"

#ifndef NX_NEON_I8MM
#define NX_NEON_I8MM 0
#endif

/* The widest rows taken, in elements (wider: the float kernels). */
#define XQ_MAX 32768

/* Whether W's matmul runs on int8 activations here. */
static int takes_int8(const nx_linear *W) {
    return W->dtype == NX_DTYPE_U32 && !W->x16 && W->bits >= 2 && W->bits <= 6 && W->in <= XQ_MAX;
}

/* One staged input row: its int8 image (in bytes, natural order), then per group d and Σx. */
typedef struct xrow {
    const int8_t *q;
    const float *d, *X;
} xrow;

static size_t xrow_bytes(int64_t in, int64_t group) {
    return ((size_t)in + 15u) / 16u * 16u + 8u * (size_t)(in / group);
}

static xrow xrow_at(unsigned char *base, int64_t in, int64_t group, int64_t t) {
    unsigned char *p = base + (size_t)t * xrow_bytes(in, group);
    const size_t qb = ((size_t)in + 15u) / 16u * 16u;
    return (xrow){(const int8_t *)p, (const float *)(p + qb), (const float *)(p + qb) + in / group};
}

/* The int8 image of row x (in elements, groups of `group`, a multiple of 32) into base. */
static void quantize_row(const float *x, int64_t in, int64_t group, unsigned char *base) {
    const size_t qb = ((size_t)in + 15u) / 16u * 16u;
    int8_t *xq = (int8_t *)base;
    float *d = (float *)(base + qb), *X = d + in / group;
    for (int64_t g = 0; g < in / group; g++) {
        const float *xg = x + g * group;
        float32x4_t mx = vdupq_n_f32(0.0f), sum[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
        for (int64_t j = 0; j < group; j += 8) {
            const float32x4_t a = vld1q_f32(xg + j), b = vld1q_f32(xg + j + 4);
            mx = vmaxq_f32(mx, vmaxq_f32(vabsq_f32(a), vabsq_f32(b)));
            sum[0] = vaddq_f32(sum[0], a);
            sum[1] = vaddq_f32(sum[1], b);
        }
        const float amax = vmaxvq_f32(mx); /* NaN if any element is */
        X[g] = f8_hsum((f8){sum[0], sum[1]});
        float inv;
        nx_act8_scale(amax, X[g], &d[g], &inv);
        const float32x4_t iv = vdupq_n_f32(inv);
        for (int64_t j = 0; j < group; j += 16) {
            int16x4_t h[4];
            for (int c = 0; c < 4; c++) /* round to nearest even, as rintf */
                h[c] = vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(vld1q_f32(xg + j + 4 * c), iv)));
            const int8x8_t lo = vqmovn_s16(vcombine_s16(h[0], h[1])), hi = vqmovn_s16(vcombine_s16(h[2], h[3]));
            vst1q_s8(xq + g * group + j, vcombine_s8(lo, hi));
        }
    }
}

typedef struct dargs {
    const uint8_t *w;       /* packed rows */
    size_t wstride;         /* packed bytes per row */
    const uint8_t *sc, *bi; /* scales, biases (bi may be NULL) */
    size_t sstride;         /* scale bytes per row */
    nx_dtype sdt;
    int64_t in, group;
    const nqlut *lut;
} dargs;

/* One group's epilogue for one output: (y + (s·d)·isum) + b·X, each step rounded. */
AI float epilogue(float y, float s, float d, int32_t isum, float b, float X) {
    const float sd = s * d, bx = b * X;
    return (y + sd * (float)isum) + bx;
}

/* Weight row o against TT staged input rows xr[0..TT): y[t·ldy] for each. */
AI void mk_dot(const int BITS, const int TT, const dargs *a, int64_t o, const xrow *xr, float *y, int64_t ldy) {
    const uint8_t *w = a->w + (size_t)o * a->wstride, *sc = a->sc + (size_t)o * a->sstride;
    const uint8_t *bi = a->bi ? a->bi + (size_t)o * a->sstride : NULL;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int64_t ngroups = a->in / a->group, nblk = a->group / 32;
    for (int64_t g = 0; g < ngroups; g++) {
        int32x4_t ia[4];
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) ia[t] = vdupq_n_s32(0);
        for (int64_t k = 0; k < nblk; k++) {
            const int64_t e0 = g * a->group + k * 32;
            uint8x16_t q[2];
            unpack32(BITS, w + (size_t)e0 * BITS / 8, a->lut, q);
            const int8x16_t q0 = vreinterpretq_s8_u8(q[0]), q1 = vreinterpretq_s8_u8(q[1]);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                ia[t] = vdotq_s32(ia[t], q0, vld1q_s8(xr[t].q + e0));
                ia[t] = vdotq_s32(ia[t], q1, vld1q_s8(xr[t].q + e0 + 16));
            }
        }
        const float s = load_sc(a->sdt, sc, g), b = bi ? load_sc(a->sdt, bi, g) : 0.0f;
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[t] = epilogue(acc[t], s, xr[t].d[g], vaddvq_s32(ia[t]), b, xr[t].X[g]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) y[t * ldy] = acc[t];
}

#define DOT_KERNEL(NAME, BITS)                                                                        \
    static void NAME(int TT, const dargs *a, int64_t o, const xrow *xr, float *y, int64_t ldy) {     \
        switch (TT) {                                                                                 \
        case 1: mk_dot(BITS, 1, a, o, xr, y, ldy); break;                                             \
        case 2: mk_dot(BITS, 2, a, o, xr, y, ldy); break;                                             \
        case 3: mk_dot(BITS, 3, a, o, xr, y, ldy); break;                                             \
        default: mk_dot(BITS, 4, a, o, xr, y, ldy); break;                                            \
        }                                                                                             \
    }

DOT_KERNEL(dot_q2, 2)
DOT_KERNEL(dot_q3, 3)
DOT_KERNEL(dot_q4, 4)
DOT_KERNEL(dot_q5, 5)
DOT_KERNEL(dot_q6, 6)

typedef void (*dot_fn)(int, const dargs *, int64_t, const xrow *, float *, int64_t);
typedef void (*mm_fn)(const dargs *, int64_t, const xrow *, float *, int64_t);

#if NX_NEON_I8MM
/* Weight rows o, o + 1 against staged input rows xr[0], xr[1] by smmla: per 8 elements, the 2×2
 * block of products [o·t0, o·t1, o+1·t0, o+1·t1] in one instruction; the same integer sums and
 * the same epilogue as mk_dot, lane by lane. */
AI void mk_mm(const int BITS, const dargs *a, int64_t o, const xrow *xr, float *y, int64_t ldy) {
    const uint8_t *w0 = a->w + (size_t)o * a->wstride, *w1 = w0 + a->wstride;
    const uint8_t *sc = a->sc + (size_t)o * a->sstride, *bi = a->bi ? a->bi + (size_t)o * a->sstride : NULL;
    float32x4_t acc = vdupq_n_f32(0.0f);
    const int64_t ngroups = a->in / a->group, nblk = a->group / 32;
    for (int64_t g = 0; g < ngroups; g++) {
        int32x4_t ia = vdupq_n_s32(0);
        for (int64_t k = 0; k < nblk; k++) {
            const int64_t e0 = g * a->group + k * 32;
            uint8x16_t p[2], r[2];
            unpack32(BITS, w0 + (size_t)e0 * BITS / 8, a->lut, p);
            unpack32(BITS, w1 + (size_t)e0 * BITS / 8, a->lut, r);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const uint64x2_t wa = vreinterpretq_u64_u8(p[h]), wb = vreinterpretq_u64_u8(r[h]);
                const uint64x2_t xa = vreinterpretq_u64_s8(vld1q_s8(xr[0].q + e0 + 16 * h));
                const uint64x2_t xb = vreinterpretq_u64_s8(vld1q_s8(xr[1].q + e0 + 16 * h));
                ia = vmmlaq_s32(ia, vreinterpretq_s8_u64(vzip1q_u64(wa, wb)), vreinterpretq_s8_u64(vzip1q_u64(xa, xb)));
                ia = vmmlaq_s32(ia, vreinterpretq_s8_u64(vzip2q_u64(wa, wb)), vreinterpretq_s8_u64(vzip2q_u64(xa, xb)));
            }
        }
        const float s0 = load_sc(a->sdt, sc, g), s1 = load_sc(a->sdt, sc + a->sstride, g);
        const float b0 = bi ? load_sc(a->sdt, bi, g) : 0.0f, b1 = bi ? load_sc(a->sdt, bi + a->sstride, g) : 0.0f;
        const float32x4_t s = {s0, s0, s1, s1}, b = {b0, b0, b1, b1};
        const float32x4_t d = {xr[0].d[g], xr[1].d[g], xr[0].d[g], xr[1].d[g]};
        const float32x4_t X = {xr[0].X[g], xr[1].X[g], xr[0].X[g], xr[1].X[g]};
        const float32x4_t sd = vmulq_f32(s, d), bx = vmulq_f32(b, X);
        acc = vaddq_f32(vaddq_f32(acc, vmulq_f32(sd, vcvtq_f32_s32(ia))), bx);
    }
    y[0] = vgetq_lane_f32(acc, 0);
    y[ldy] = vgetq_lane_f32(acc, 1);
    y[1] = vgetq_lane_f32(acc, 2);
    y[ldy + 1] = vgetq_lane_f32(acc, 3);
}

#define MM_KERNEL(NAME, BITS)                                                                   \
    static void NAME(const dargs *a, int64_t o, const xrow *xr, float *y, int64_t ldy) {       \
        mk_mm(BITS, a, o, xr, y, ldy);                                                          \
    }

MM_KERNEL(mm_q2, 2)
MM_KERNEL(mm_q3, 3)
MM_KERNEL(mm_q4, 4)
MM_KERNEL(mm_q5, 5)
MM_KERNEL(mm_q6, 6)
#endif

/* Rows [b0, b1) of y against staged rows xr[0..tn) (y: their first output row). */
static void rows_staged(dot_fn dot, mm_fn mm, const dargs *a, int64_t b0, int64_t b1, const xrow *xr,
                        int64_t tn, float *y, int64_t ldy) {
    int64_t t = 0;
    if (mm)
        for (; t + 2 <= tn; t += 2) {
            int64_t o = b0;
            for (; o + 2 <= b1; o += 2) mm(a, o, xr + t, y + t * ldy + o, ldy);
            for (; o < b1; o++) dot(2, a, o, xr + t, y + t * ldy + o, ldy);
        }
    for (; t < tn; t += 4) {
        const int tt = tn - t < 4 ? (int)(tn - t) : 4;
        for (int64_t o = b0; o < b1; o++) dot(tt, a, o, xr + t, y + t * ldy + o, ldy);
    }
}

static int dot_matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy,
                           int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s) {
    if (!takes_int8(W)) return nx_neon_matmul_rows(W, x, ldx, T, y, ldy, o0, o1, next, s);
    dot_fn dot;
    mm_fn mm = NULL;
    switch (W->bits) {
    case 2: dot = dot_q2; break;
    case 3: dot = dot_q3; break;
    case 4: dot = dot_q4; break;
    case 5: dot = dot_q5; break;
    default: dot = dot_q6; break;
    }
#if NX_NEON_I8MM
    switch (W->bits) {
    case 2: mm = mm_q2; break;
    case 3: mm = mm_q3; break;
    case 4: mm = mm_q4; break;
    case 5: mm = mm_q5; break;
    default: mm = mm_q6; break;
    }
#endif
    nqlut lut;
    nqlut_init(&lut, W->bits);
    const int64_t in = W->in, group = W->group;
    const dargs a = {.w = W->w,
                     .wstride = (size_t)in * (size_t)W->bits / 8,
                     .sc = W->scales,
                     .bi = W->biases,
                     .sstride = (size_t)(in / group) * nx_dtype_size(W->sdtype),
                     .sdt = W->sdtype,
                     .in = in,
                     .group = group,
                     .lut = &lut};
    int64_t fit = (int64_t)(NX_VNNI_SCRATCH_BYTES / xrow_bytes(in, group));
    if (fit > 64) fit = 64;
    const int64_t ob = nx_rows_per_block(a.wstride);
    for (int64_t t0 = 0; t0 < T; t0 += fit) { /* input rows staged fit at a time */
        const int64_t tn = T - t0 < fit ? T - t0 : fit;
        xrow xr[64];
        for (int64_t t = 0; t < tn; t++) {
            quantize_row(x + (t0 + t) * ldx, in, group, s->vnni + (size_t)t * xrow_bytes(in, group));
            xr[t] = xrow_at(s->vnni, in, group, t);
        }
        for (int64_t b0 = o0; b0 < o1; b0 += ob) /* weight rows kept in L2 while the inputs pass */
            rows_staged(dot, mm, &a, b0, b0 + ob < o1 ? b0 + ob : o1, xr, tn, y + t0 * ldy, ldy);
    }
    return 1;
}

#if NX_NEON_I8MM
const nx_kernel_table nx_kernels_neoni8mm = {
    .name = "neoni8mm",
#else
const nx_kernel_table nx_kernels_neondot = {
    .name = "neondot",
#endif
    .matmul_rows = dot_matmul_rows,
    NX_NEON_VECTOR_HELPERS,
};

#endif
