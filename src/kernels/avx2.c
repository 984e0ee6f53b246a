/* AVX2 + FMA + F16C kernels. Every output element is one dot product in 8 f32 lanes: lane l
 * accumulates elements 8c+l for c = 0, 1, … (zero-filled tail), then a fixed horizontal tree.
 * Register blocks of R weight rows × TT input rows only hold more such accumulators, so a
 * row's result is the same whatever T and the row split are. */
#include <math.h>

#include "kernels/x86_common.h"


AI __m256 bf16x8_to_f32(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 weights of a float row starting at element i. */
AI __m256 load_w8(nx_dtype dt, const uint8_t *row, int64_t i) {
    if (dt == NX_DTYPE_F32) return _mm256_loadu_ps((const float *)(row + 4 * i));
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * i));
    return dt == NX_DTYPE_F16 ? _mm256_cvtph_ps(h) : bf16x8_to_f32(h);
}

/* The n < 8 weights from element i, zeros after them; never reads past them. */
AI __m256 load_w8_tail(nx_dtype dt, const uint8_t *row, int64_t i, int64_t n) {
    uint8_t buf[32] = {0};
    memcpy(buf, row + i * (int64_t)nx_dtype_size(dt), (size_t)n * nx_dtype_size(dt));
    return load_w8(dt, buf, 0);
}

/* ------------------------------------------------------------------ float weights */

AI void mk_float(nx_dtype dt, const int R, const int TT, const uint8_t *w, size_t stride,
                 const float *x, int64_t ldx, float *y, int64_t ldy, int64_t ys, int64_t in) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= in; i += 8) {
        __m256 xv[4];
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) xv[t] = _mm256_loadu_ps(x + t * ldx + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 wv = load_w8(dt, w + r * stride, i);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    if (i < in) {
        __m256 xv[4];
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) xv[t] = load_x8_tail(x + t * ldx + i, in - i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 wv = load_w8_tail(dt, w + r * stride, i, in - i);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) y[t * ldy + r * ys] = hsum8(acc[r][t]);
}

/* 16 ymm registers: 4 rows for 1–2 input rows, 2 rows for 3–4. */
#define RFULL(TT) ((TT) <= 2 ? 4 : 2)

#define FLOAT_KERNEL(NAME, DT)                                                                 \
    static void NAME(int R, int TT, const uint8_t *w, size_t stride, const float *x,          \
                     int64_t ldx, float *y, int64_t ldy, int64_t ys, int64_t in) {             \
        if (R > 1) {                                                                           \
            switch (TT) {                                                                      \
            case 1: mk_float(DT, 4, 1, w, stride, x, ldx, y, ldy, ys, in); break;              \
            case 2: mk_float(DT, 4, 2, w, stride, x, ldx, y, ldy, ys, in); break;              \
            case 3: mk_float(DT, 2, 3, w, stride, x, ldx, y, ldy, ys, in); break;              \
            default: mk_float(DT, 2, 4, w, stride, x, ldx, y, ldy, ys, in); break;             \
            }                                                                                  \
        } else {                                                                               \
            switch (TT) {                                                                      \
            case 1: mk_float(DT, 1, 1, w, stride, x, ldx, y, ldy, ys, in); break;              \
            case 2: mk_float(DT, 1, 2, w, stride, x, ldx, y, ldy, ys, in); break;              \
            case 3: mk_float(DT, 1, 3, w, stride, x, ldx, y, ldy, ys, in); break;              \
            default: mk_float(DT, 1, 4, w, stride, x, ldx, y, ldy, ys, in); break;             \
            }                                                                                  \
        }                                                                                      \
    }

FLOAT_KERNEL(kern_f32, NX_DTYPE_F32)
FLOAT_KERNEL(kern_f16, NX_DTYPE_F16)
FLOAT_KERNEL(kern_bf16, NX_DTYPE_BF16)

/* ------------------------------------------------------------------ quantized weights */

/* Per-lane word index and bit offset of elements 8h+l in a 32-element block, for the widths
 * whose elements straddle words (3, 5, 6). */
typedef struct qlut {
    __m256i idx[4], idx1[4], off[4], coff[4], ldmask;
} qlut;

static void qlut_init(qlut *L, int bits) {
    for (int h = 0; h < 4; h++) {
        int32_t idx[8], off[8], idx1[8], coff[8];
        for (int l = 0; l < 8; l++) {
            int pos = (8 * h + l) * bits;
            idx[l] = pos >> 5;
            idx1[l] = ((pos >> 5) + 1) & 7; /* only used when the element straddles */
            off[l] = pos & 31;
            coff[l] = 32 - (pos & 31); /* a shift of 32 gives 0: nothing from the next word */
        }
        L->idx[h] = _mm256_loadu_si256((const __m256i *)idx);
        L->idx1[h] = _mm256_loadu_si256((const __m256i *)idx1);
        L->off[h] = _mm256_loadu_si256((const __m256i *)off);
        L->coff[h] = _mm256_loadu_si256((const __m256i *)coff);
    }
    int32_t m[8];
    for (int l = 0; l < 8; l++) m[l] = l < bits ? -1 : 0;
    L->ldmask = _mm256_loadu_si256((const __m256i *)m);
}

/* Decodes the 32 q values of one block (4·BITS bytes at p) in natural order, 8 per vector. */
AI void unpack32(const int BITS, const uint8_t *p, const qlut *L, __m256i q[4]) {
    if (BITS == 8) {
        for (int h = 0; h < 4; h++)
            q[h] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * h)));
    } else if (BITS == 4 || BITS == 2) {
        __m128i n0, n1, m4 = _mm_set1_epi8(0x0f);
        if (BITS == 4) {
            __m128i v = _mm_loadu_si128((const __m128i *)p);
            __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
            n0 = _mm_unpacklo_epi8(lo, hi);
            n1 = _mm_unpackhi_epi8(lo, hi);
        } else {
            /* byte k holds elements 4k..4k+3; split into (4k, 4k+2) and (4k+1, 4k+3)
             * nibble pairs, interleave, then split nibbles and interleave 16-bit pairs. */
            __m128i v = _mm_loadl_epi64((const __m128i *)p), m2 = _mm_set1_epi8(0x33);
            __m128i a = _mm_and_si128(v, m2), c = _mm_and_si128(_mm_srli_epi16(v, 2), m2);
            __m128i u = _mm_unpacklo_epi8(a, c);
            __m128i lo = _mm_and_si128(u, m4), hi = _mm_and_si128(_mm_srli_epi16(u, 4), m4);
            n0 = _mm_unpacklo_epi16(lo, hi);
            n1 = _mm_unpackhi_epi16(lo, hi);
        }
        q[0] = _mm256_cvtepu8_epi32(n0);
        q[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(n0, 8));
        q[2] = _mm256_cvtepu8_epi32(n1);
        q[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(n1, 8));
    } else {
        __m256i wv = _mm256_maskload_epi32((const int *)p, L->ldmask);
        __m256i mask = _mm256_set1_epi32((1 << BITS) - 1);
        for (int h = 0; h < 4; h++) {
            __m256i lo = _mm256_permutevar8x32_epi32(wv, L->idx[h]);
            __m256i hi = _mm256_permutevar8x32_epi32(wv, L->idx1[h]);
            __m256i v = _mm256_or_si256(_mm256_srlv_epi32(lo, L->off[h]),
                                        _mm256_sllv_epi32(hi, L->coff[h]));
            q[h] = _mm256_and_si256(v, mask);
        }
    }
}

typedef struct qargs {
    const uint8_t *w;       /* first row of the block */
    size_t wstride;         /* packed bytes per row */
    const uint8_t *sc, *bi; /* scales/biases of the first row (bi may be NULL) */
    size_t sstride;         /* scale bytes per row */
    nx_dtype sdt;
    int64_t in, group;
    const qlut *lut;
} qargs;

/* Weights are dequantized in registers (w = s·q + b, one FMA) and never stored. */
AI void mk_quant(const int BITS, const int R, const int TT, const qargs *a, const float *x,
                 int64_t ldx, float *y, int64_t ldy, int64_t ys) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    const int64_t ngroups = a->in / a->group, nblk = a->group / 32;
    for (int64_t g = 0; g < ngroups; g++) {
        __m256 s[4], b[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            s[r] = _mm256_set1_ps(load_sc(a->sdt, a->sc + r * a->sstride, g));
            b[r] = a->bi ? _mm256_set1_ps(load_sc(a->sdt, a->bi + r * a->sstride, g))
                         : _mm256_setzero_ps();
        }
        for (int64_t k = 0; k < nblk; k++) {
            int64_t e0 = g * a->group + k * 32; /* first element of the block */
            const uint8_t *p = a->w + (size_t)e0 * BITS / 8;
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i q[4];
                unpack32(BITS, p + r * a->wstride, a->lut, q);
#pragma GCC unroll 4
                for (int h = 0; h < 4; h++) {
                    __m256 wv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[h]), s[r], b[r]);
#pragma GCC unroll 4
                    for (int t = 0; t < TT; t++)
                        acc[r][t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + t * ldx + e0 + 8 * h),
                                                    acc[r][t]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) y[t * ldy + r * ys] = hsum8(acc[r][t]);
}

#define QUANT_KERNEL(NAME, BITS)                                                               \
    static void NAME(int R, int TT, const qargs *a, const float *x, int64_t ldx, float *y,    \
                     int64_t ldy, int64_t ys) {                                                \
        if (R > 1) {                                                                           \
            switch (TT) {                                                                      \
            case 1: mk_quant(BITS, 4, 1, a, x, ldx, y, ldy, ys); break;                        \
            case 2: mk_quant(BITS, 4, 2, a, x, ldx, y, ldy, ys); break;                        \
            case 3: mk_quant(BITS, 2, 3, a, x, ldx, y, ldy, ys); break;                        \
            default: mk_quant(BITS, 2, 4, a, x, ldx, y, ldy, ys); break;                       \
            }                                                                                  \
        } else {                                                                               \
            switch (TT) {                                                                      \
            case 1: mk_quant(BITS, 1, 1, a, x, ldx, y, ldy, ys); break;                        \
            case 2: mk_quant(BITS, 1, 2, a, x, ldx, y, ldy, ys); break;                        \
            case 3: mk_quant(BITS, 1, 3, a, x, ldx, y, ldy, ys); break;                        \
            default: mk_quant(BITS, 1, 4, a, x, ldx, y, ldy, ys); break;                       \
            }                                                                                  \
        }                                                                                      \
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

static int avx2_matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T,
                            float *y, int64_t ldy, int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s) {
    (void)next; /* no software prefetch here */
    const int64_t in = W->in;
    if (nx_avx2_int8_rows(W, x, ldx, T, y, ldy, o0, o1, s)) return 1;
    if (W->dtype == NX_DTYPE_U32) {
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
        qlut lut;
        qlut_init(&lut, W->bits);
        size_t ssz = nx_dtype_size(W->sdtype);
        qargs a = {.wstride = (size_t)in * (size_t)W->bits / 8,
                   .sstride = (size_t)(in / W->group) * ssz,
                   .sdt = W->sdtype,
                   .in = in,
                   .group = W->group,
                   .lut = &lut};
        if (T <= 4) { /* split streams, as for float weights below: row o of each of R parts, then the rest */
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
        int64_t ob = nx_rows_per_block(a.wstride);
        for (int64_t b0 = o0; b0 < o1; b0 += ob) {
            int64_t b1 = b0 + ob < o1 ? b0 + ob : o1;
            for (int64_t t = 0; t < T; t += 4) {
                int tt = T - t < 4 ? (int)(T - t) : 4;
                for (int64_t o = b0; o < b1;) {
                    int R = o + RFULL(tt) <= b1 ? RFULL(tt) : 1;
                    qargs_at(&a, W, &a, o);
                    kern(R, tt, &a, x + t * ldx, ldx, y + t * ldy + o, ldy, 1);
                    o += R;
                }
            }
        }
        return 1;
    }
    void (*kern)(int, int, const uint8_t *, size_t, const float *, int64_t, float *, int64_t,
                 int64_t, int64_t);
    switch (W->dtype) {
    case NX_DTYPE_F32: kern = kern_f32; break;
    case NX_DTYPE_F16: kern = kern_f16; break;
    case NX_DTYPE_BF16: kern = kern_bf16; break;
    default: return 0;
    }
    size_t stride = (size_t)in * nx_dtype_size(W->dtype);
    /* Split streams: a decode or verify call (one pass of every input row) takes its register
     * blocks as row o of each of R equal parts of its rows (rows o + r·q), so each part is one
     * sequential stream, which the hardware prefetchers follow; R consecutive rows a row apart
     * they did not. */
    if (T <= 4) {
        const int R = RFULL(T);
        const int64_t q = (o1 - o0) / R;
        for (int64_t o = o0; o < o0 + q; o++)
            kern(R, (int)T, (const uint8_t *)W->w + (size_t)o * stride, (size_t)q * stride, x, ldx, y + o, ldy, q, in);
        for (int64_t o = o0 + R * q; o < o1; o++)
            kern(1, (int)T, (const uint8_t *)W->w + (size_t)o * stride, stride, x, ldx, y + o, ldy, 1, in);
        return 1;
    }
    int64_t ob = nx_rows_per_block(stride);
    for (int64_t b0 = o0; b0 < o1; b0 += ob) {
        int64_t b1 = b0 + ob < o1 ? b0 + ob : o1;
        for (int64_t t = 0; t < T; t += 4) {
            int tt = T - t < 4 ? (int)(T - t) : 4;
            for (int64_t o = b0; o < b1;) {
                int R = o + RFULL(tt) <= b1 ? RFULL(tt) : 1;
                kern(R, tt, (const uint8_t *)W->w + (size_t)o * stride, stride, x + t * ldx, ldx,
                     y + t * ldy + o, ldy, 1, in);
                o += R;
            }
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ vector helpers */

static void avx2_to_f32(nx_dtype t, const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    if (t == NX_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_w8(t, s, i));
    if (i < n) {
        float buf[8];
        _mm256_storeu_ps(buf, load_w8_tail(t, s, i, n - i));
        memcpy(dst + i, buf, (size_t)(n - i) * 4);
    }
}

static float avx2_dot_f32(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    if (i < n) acc = _mm256_fmadd_ps(load_x8_tail(a + i, n - i), load_x8_tail(b + i, n - i), acc);
    return hsum8(acc);
}

static void avx2_axpy_f32(float a, const float *x, float *y, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* ------------------------------------------------------------------ attention over the cache */

/* Lanes [0, n) of 8: none for n <= 0, all from 8 on (n within int). */
AI __m256i lanes8(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 elements of a cached row from element i, lanes past mask mk 0 (FULL: all 8), widened from
 * f16 (exact) when F16: the values avx2_dot_f32 / avx2_axpy_f32 see on the rows nx_attn_*
 * widens for them (their tails zero-padded alike). */
AI __m256 kv8(const int F16, const int FULL, const void *row, int64_t i, int64_t n, __m256i mk) {
    if (F16) {
        if (FULL) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
        uint16_t b[8] = {0};
        memcpy(b, (const uint16_t *)row + i, (size_t)n * 2);
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
    }
    return FULL ? _mm256_loadu_ps((const float *)row + i) : _mm256_maskload_ps((const float *)row + i, mk);
}

/* Scores of G heads (q, q + hd, ...) against row k, each accumulated and reduced exactly as
 * avx2_dot_f32 does it. */
AI void dots_g(const int F16, const int G, const float *q, int64_t hd, const void *k, float *v) {
    __m256 a[4];
#pragma GCC unroll 4
    for (int h = 0; h < G; h++) a[h] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= hd; i += 8) {
        const __m256 kv = kv8(F16, 1, k, i, 8, _mm256_setzero_si256());
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) a[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * hd + i), kv, a[h]);
    }
    if (i < hd) {
        const __m256i mk = lanes8(hd - i);
        const __m256 kv = kv8(F16, 0, k, i, hd - i, mk);
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) a[h] = _mm256_fmadd_ps(_mm256_maskload_ps(q + h * hd + i, mk), kv, a[h]);
    }
#pragma GCC unroll 4
    for (int h = 0; h < G; h++) v[h] = hsum8(a[h]);
}

AI void scores_rows(const int F16, const int G, const float *q, const void *K, int64_t stride, int64_t p0,
                    int64_t p1, int64_t n, int64_t hd, int pf, float scale, float *out, int64_t ldo) {
    const size_t es = F16 ? 2 : 4;
    const int64_t ahead = attn_pf_rows(es, stride);
    for (int64_t p = p0; p < p1; p++) {
        if (pf) attn_prefetch_row(K, es, stride, p, ahead, n, hd);
        float v[4];
        dots_g(F16, G, q, hd, (const char *)K + (size_t)(p * stride) * es, v);
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) out[h * ldo + p] = v[h] * scale;
    }
}

AI void scores8(const int F16, const float *q, int64_t g, const void *K, int64_t stride, int64_t n, int64_t hd,
                float scale, float *out, int64_t ldo) {
    const int64_t pb = attn_block_rows(F16 ? 2 : 4, hd);
    for (int64_t p0 = 0; p0 < n; p0 += pb) {
        const int64_t p1 = n - p0 < pb ? n : p0 + pb;
        for (int64_t h0 = 0; h0 < g; h0 += 4) {
            const float *qh = q + h0 * hd;
            float *oh = out + h0 * ldo;
            switch (g - h0 < 4 ? g - h0 : 4) {
            case 1: scores_rows(F16, 1, qh, K, stride, p0, p1, n, hd, h0 == 0, scale, oh, ldo); break;
            case 2: scores_rows(F16, 2, qh, K, stride, p0, p1, n, hd, h0 == 0, scale, oh, ldo); break;
            case 3: scores_rows(F16, 3, qh, K, stride, p0, p1, n, hd, h0 == 0, scale, oh, ldo); break;
            default: scores_rows(F16, 4, qh, K, stride, p0, p1, n, hd, h0 == 0, scale, oh, ldo); break;
            }
        }
    }
}

static void avx2_attn_scores(const float *q, int64_t g, const void *K, nx_dtype kvt, int64_t stride, int64_t n,
                             int64_t hd, float scale, float *out, int64_t ldo) {
    if (kvt == NX_DTYPE_F16) scores8(1, q, g, K, stride, n, hd, scale, out, ldo);
    else scores8(0, q, g, K, stride, n, hd, scale, out, ldo);
}

/* o_h[c0, c0 + 16) (FULL; else the row's last hd - c0 < 16 elements) += Σ_p w_h[p]·V_p over
 * rows [p0, p1) for G heads, the sums in registers: per element the fused multiply-adds
 * avx2_axpy_f32 would do, in row order (its scalar tail's fmaf rounds once, as a lane does). */
AI void accum16(const int F16, const int FULL, const int G, const float *w, int64_t ldw, const void *V,
                int64_t stride, int64_t p0, int64_t p1, int64_t n, int64_t hd, int64_t c0, int pf, float *o) {
    const size_t es = F16 ? 2 : 4;
    const int64_t ahead = attn_pf_rows(es, stride);
    const int64_t len = FULL ? 16 : hd - c0, n0 = len < 8 ? len : 8, n1 = len - n0;
    const __m256i m0 = lanes8(n0), m1 = lanes8(n1);
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int h = 0; h < G; h++) {
        acc[h][0] = FULL ? _mm256_loadu_ps(o + h * hd + c0) : _mm256_maskload_ps(o + h * hd + c0, m0);
        acc[h][1] = FULL ? _mm256_loadu_ps(o + h * hd + c0 + 8) : _mm256_maskload_ps(o + h * hd + c0 + 8, m1);
    }
    for (int64_t p = p0; p < p1; p++) {
        if (pf) attn_prefetch_row(V, es, stride, p, ahead, n, hd);
        const void *vp = (const char *)V + (size_t)(p * stride) * es;
        const __m256 x0 = kv8(F16, FULL, vp, c0, n0, m0);
        const __m256 x1 = FULL || n1 > 0 ? kv8(F16, FULL, vp, c0 + 8, n1, m1) : _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) {
            const __m256 wv = _mm256_set1_ps(w[h * ldw + p]);
            acc[h][0] = _mm256_fmadd_ps(wv, x0, acc[h][0]);
            acc[h][1] = _mm256_fmadd_ps(wv, x1, acc[h][1]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < G; h++) {
        if (FULL) {
            _mm256_storeu_ps(o + h * hd + c0, acc[h][0]);
            _mm256_storeu_ps(o + h * hd + c0 + 8, acc[h][1]);
        } else {
            _mm256_maskstore_ps(o + h * hd + c0, m0, acc[h][0]);
            _mm256_maskstore_ps(o + h * hd + c0 + 8, m1, acc[h][1]);
        }
    }
}

AI void accum_g(const int F16, const int G, const float *w, int64_t ldw, const void *V, int64_t stride,
                int64_t p0, int64_t p1, int64_t n, int64_t hd, int pf, float *o) {
    int64_t c0 = 0;
    for (; c0 + 16 <= hd; c0 += 16) accum16(F16, 1, G, w, ldw, V, stride, p0, p1, n, hd, c0, pf && c0 == 0, o);
    if (c0 < hd) accum16(F16, 0, G, w, ldw, V, stride, p0, p1, n, hd, c0, pf && c0 == 0, o);
}

AI void accum8(const int F16, const float *w, int64_t ldw, int64_t g, const void *V, int64_t stride, int64_t n,
               int64_t hd, float *o) {
    const int64_t pb = attn_block_rows(F16 ? 2 : 4, hd);
    for (int64_t p0 = 0; p0 < n; p0 += pb) {
        const int64_t p1 = n - p0 < pb ? n : p0 + pb;
        for (int64_t h0 = 0; h0 < g; h0 += 4) {
            const float *wh = w + h0 * ldw;
            float *oh = o + h0 * hd;
            switch (g - h0 < 4 ? g - h0 : 4) {
            case 1: accum_g(F16, 1, wh, ldw, V, stride, p0, p1, n, hd, h0 == 0, oh); break;
            case 2: accum_g(F16, 2, wh, ldw, V, stride, p0, p1, n, hd, h0 == 0, oh); break;
            case 3: accum_g(F16, 3, wh, ldw, V, stride, p0, p1, n, hd, h0 == 0, oh); break;
            default: accum_g(F16, 4, wh, ldw, V, stride, p0, p1, n, hd, h0 == 0, oh); break;
            }
        }
    }
}

static void avx2_attn_accum(const float *w, int64_t ldw, int64_t g, const void *V, nx_dtype kvt, int64_t stride,
                            int64_t n, int64_t hd, float *o) {
    if (kvt == NX_DTYPE_F16) accum8(1, w, ldw, g, V, stride, n, hd, o);
    else accum8(0, w, ldw, g, V, stride, n, hd, o);
}

/* e^x for 8 lanes: avx512.c's exp16 step for step (within 2 ulp of expf; below about -103 the
 * result is 0, NaN stays NaN), with its ·2^k as two exact power-of-two factors (each half of k
 * in the normal range) in place of vscalefps: the second product rounds once, as vscalefps does. */
AI __m256 exp8(__m256 x) {
    /* clamp; a NaN passes (max/min return their second operand when either is NaN) */
    x = _mm256_max_ps(_mm256_set1_ps(-104.0f), x);
    x = _mm256_min_ps(_mm256_set1_ps(88.7f), x);
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i ki = _mm256_cvtps_epi32(k); /* a NaN's lanes: garbage, and p is NaN anyway */
    const __m256i k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
    const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

/* As avx512.c's: the max, e^(x - max) by exp8 summed in 8 lanes. */
static float avx2_exp_shift_f32(float *x, int64_t n, float *mx_out) {
    const int64_t full = n & ~(int64_t)7;
    const __m256i mk = lanes8(n - full);
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i < full; i += 8) mx = _mm256_max_ps(_mm256_loadu_ps(x + i), mx);
    if (i < n) mx = _mm256_blendv_ps(mx, _mm256_max_ps(_mm256_maskload_ps(x + i, mk), mx), _mm256_castsi256_ps(mk));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    *mx_out = _mm_cvtss_f32(m4);
    const __m256 mv = _mm256_set1_ps(*mx_out);
    __m256 sum = _mm256_setzero_ps();
    for (i = 0; i < full; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(x + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (i < n) {
        const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, mk), mv)), _mm256_castsi256_ps(mk));
        _mm256_maskstore_ps(x + i, mk, e);
        sum = _mm256_add_ps(sum, e);
    }
    return hsum8(sum);
}

/* g / (1 + e^-g) · u, 8 lanes at a time, as avx512.c's swiglu16. */
AI __m256 swiglu8(__m256 g, __m256 u) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static void avx2_swiglu_f32(float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, swiglu8(_mm256_loadu_ps(g + i), u ? _mm256_loadu_ps(u + i) : one));
    if (i < n) {
        const __m256i mk = lanes8(n - i);
        _mm256_maskstore_ps(g + i, mk, swiglu8(_mm256_maskload_ps(g + i, mk), u ? _mm256_maskload_ps(u + i, mk) : one));
    }
}

/* nx_delta_rule_f32 on blocks of 4 vectors (32 columns; lanes past dv masked), each lane running
 * the reference's loop for its column, products and sums rounded separately as it does: 4
 * independent sums per block, and the first pass hints the block's rows DR_PF ahead (past the
 * end: the next head's state, which follows), as avx512.c's kernel does. The second pass
 * recomputes decay·S from src (the same bits) rather than storing it twice. */
#define DR_V 4
#define DR_PF 16
static void avx2_delta_rule_f32(const float *src, float *dst, int64_t dk, int64_t dv, const float *k, const float *v,
                                float decay, float beta, const float *q, float *o) {
    const __m256 dc = _mm256_set1_ps(decay), bt = _mm256_set1_ps(beta);
    for (int64_t j = 0; j < dv; j += 8 * DR_V) {
        __m256i m[DR_V];
        __m256 kv[DR_V], d[DR_V], acc[DR_V];
        for (int u = 0; u < DR_V; u++) m[u] = lanes8(dv - j - 8 * u), kv[u] = acc[u] = _mm256_setzero_ps();
        for (int64_t i = 0; i < dk; i++) {
            const __m256 ki = _mm256_set1_ps(k[i]);
            const float *s = src + i * dv + j;
            _mm_prefetch((const char *)(s + DR_PF * dv), _MM_HINT_T0);
            _mm_prefetch((const char *)(s + DR_PF * dv + 16), _MM_HINT_T0);
            for (int u = 0; u < DR_V; u++)
                kv[u] = _mm256_add_ps(kv[u], _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(s + 8 * u, m[u]), dc), ki));
        }
        for (int u = 0; u < DR_V; u++)
            d[u] = _mm256_mul_ps(bt, _mm256_sub_ps(_mm256_maskload_ps(v + j + 8 * u, m[u]), kv[u]));
        for (int64_t i = 0; i < dk; i++) {
            const __m256 ki = _mm256_set1_ps(k[i]), qi = _mm256_set1_ps(q ? q[i] : 0.0f);
            const float *s = src + i * dv + j;
            float *w = dst + i * dv + j;
            for (int u = 0; u < DR_V; u++) {
                const __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_maskload_ps(s + 8 * u, m[u]), dc),
                                               _mm256_mul_ps(ki, d[u]));
                _mm256_maskstore_ps(w + 8 * u, m[u], t);
                acc[u] = _mm256_add_ps(acc[u], _mm256_mul_ps(t, qi));
            }
        }
        if (o)
            for (int u = 0; u < DR_V; u++) _mm256_maskstore_ps(o + j + 8 * u, m[u], acc[u]);
    }
}

/* The avx2 table with AVX-VNNI's integer kernels in front. */
static int avx2vnni_matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy,
                                int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s) {
    return nx_avxvnni_int8_rows(W, x, ldx, T, y, ldy, o0, o1, s) ||
           avx2_matmul_rows(W, x, ldx, T, y, ldy, o0, o1, next, s);
}

#define AVX2_VECTOR_HELPERS                                                                    \
    .to_f32 = avx2_to_f32, .dot_f32 = avx2_dot_f32, .axpy_f32 = avx2_axpy_f32,                 \
    .attn_scores = avx2_attn_scores, .attn_accum = avx2_attn_accum, .exp_shift_f32 = avx2_exp_shift_f32, \
    .swiglu_f32 = avx2_swiglu_f32, .delta_rule_f32 = avx2_delta_rule_f32

const nx_kernel_table nx_kernels_avx2vnni = {
    .name = "avx2vnni",
    .matmul_rows = avx2vnni_matmul_rows,
    AVX2_VECTOR_HELPERS,
};

const nx_kernel_table nx_kernels_avx2 = {
    .name = "avx2",
    .matmul_rows = avx2_matmul_rows,
    .to_f32 = avx2_to_f32,
    .dot_f32 = avx2_dot_f32,
    .axpy_f32 = avx2_axpy_f32,
    .attn_scores = avx2_attn_scores,
    .attn_accum = avx2_attn_accum,
    .exp_shift_f32 = avx2_exp_shift_f32,
    .swiglu_f32 = avx2_swiglu_f32,
    .delta_rule_f32 = avx2_delta_rule_f32,
};
