/* AVX-512 kernels (F/BW/VL/DQ). Every output element is one dot product in 16 f32 lanes in a
 * fixed order (float weights: lane l takes elements 16c+l, zero-filled tail; quantized: per
 * group, lane sums of q·x scaled into the lanes), then a fixed horizontal tree. Register
 * blocks of R weight rows × TT input rows only hold more such accumulators, so a row's result
 * is the same whatever T and the row split are. */
#include <math.h>

#include "kernels/avx512_common.h"


/* Stack floats for the per-group sums of x (16 KB). */
#define XSUM_FLOATS 4096

AI __m512 bf16x16_to_f32(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 weights of a float row starting at element i. */
AI __m512 load_w16(nx_dtype dt, const uint8_t *row, int64_t i) {
    if (dt == NX_DTYPE_F32) return _mm512_loadu_ps(row + 4 * i);
    __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * i));
    return dt == NX_DTYPE_F16 ? _mm512_cvtph_ps(h) : bf16x16_to_f32(h);
}

/* The first popcount(m) weights from element i, zeros elsewhere; never reads past them. */
AI __m512 load_w16_tail(nx_dtype dt, const uint8_t *row, int64_t i, __mmask16 m) {
    if (dt == NX_DTYPE_F32) return _mm512_maskz_loadu_ps(m, row + 4 * i);
    __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * i);
    return dt == NX_DTYPE_F16 ? _mm512_cvtph_ps(h) : bf16x16_to_f32(h);
}

/* ------------------------------------------------------------------ float weights */

/* y[tt*ldy + r*ys] for r < R, tt < TT: rows w + r*stride against x + tt*ldx; split: the rows
 * are R split streams (qpf_at_split), stride apart. */
AI void mk_float(nx_dtype dt, const int R, const int TT, const uint8_t *w, size_t stride,
                 const float *x, int64_t ldx, float *y, int64_t ldy, int64_t ys, int64_t in, const qpf_window *pw,
                 int split) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
    int64_t i = 0;
    const size_t esz = dt == NX_DTYPE_F32 ? 4 : 2;
    const qpf_stream ps = split ? (qpf_stream){(uintptr_t)w + QPF_SPLIT, 1, stride} : qpf_stream_of(w, stride, R, 64);
    for (; i + 16 <= in; i += 16) {
        __m512 xv[4];
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) xv[t] = _mm512_loadu_ps(x + t * ldx + i);
        /* Decode streams many rows, more than the hardware prefetchers follow: one hint per
         * line consumed, ahead of the block, within the call's rows and then the next ones
         * (qpf_stream / qpf_window, avx512_common.h). */
        if (((size_t)i * esz) % 64 == 0) {
            size_t rs = ps.rstride;
            const uintptr_t pf = split ? qpf_at_split(pw, &ps, (size_t)i * esz, &rs) : qpf_at(pw, &ps, (size_t)i * esz);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)(pf + (size_t)r * rs), QPF_HINT);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 wv = load_w16(dt, w + r * stride, i);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    if (i < in) {
        __mmask16 m = (__mmask16)((1u << (in - i)) - 1u);
        __m512 xv[4];
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) xv[t] = _mm512_maskz_loadu_ps(m, x + t * ldx + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 wv = load_w16_tail(dt, w + r * stride, i, m);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) y[t * ldy + r * ys] = hsum16(acc[r][t]);
}

/* Rows [r0, r1) of a call as register blocks of R rows, in one function (no call per block);
 * split (decode and verify calls, avx512_matmul_rows), R > 1 blocks take row o of each of
 * R equal parts, rows o + r·q. */
AI void mk_float_rows(const nx_dtype dt, const int R, const int TT, const uint8_t *w, size_t stride,
                      const float *x, int64_t ldx, float *y, int64_t ldy, int64_t in, int64_t r0, int64_t r1,
                      const qpf_window *pw, int split) {
    nx_side_pf *side = pw->side;
    if (R > 1 && split) {
        const int64_t q = (r1 - r0) / R;
        qpf_window sw = *pw;
        sw.end = (uintptr_t)(w + (size_t)(r0 + q) * stride); /* where part 1 begins */
        for (int64_t o = r0; o < r0 + q; o++) {
            nx_side_hint(side, R);
            mk_float(dt, R, TT, w + (size_t)o * stride, (size_t)q * stride, x, ldx, y + o, ldy, q, in, &sw, 1);
        }
        return;
    }
    for (int64_t o = r0; o < r1; o += R) {
        nx_side_hint(side, R);
        mk_float(dt, R, TT, w + (size_t)o * stride, stride, x, ldx, y + o, ldy, 1, in, pw, 0);
    }
}

/* n rows for TT input rows: blocks of FLOAT_R rows, then the remaining rows one at a time. */
#define FLOAT_R 4
#define FLOAT_SHAPE(DT, T_)                                                                    \
    do {                                                                                       \
        mk_float_rows(DT, FLOAT_R, T_, w, stride, x, ldx, y, ldy, in, 0, n - n % FLOAT_R, pw,  \
                      split);                                                                  \
        mk_float_rows(DT, 1, T_, w, stride, x, ldx, y, ldy, in, n - n % FLOAT_R, n, pw, 0);    \
    } while (0)
#define FLOAT_KERNEL(NAME, DT)                                                                 \
    static void NAME(int TT, const uint8_t *w, size_t stride, const float *x, int64_t ldx,     \
                     float *y, int64_t ldy, int64_t in, int64_t n, const qpf_window *pw,        \
                     int split) {                                                              \
        switch (TT) {                                                                          \
        case 1: FLOAT_SHAPE(DT, 1); break;                                                     \
        case 2: FLOAT_SHAPE(DT, 2); break;                                                     \
        case 3: FLOAT_SHAPE(DT, 3); break;                                                     \
        default: FLOAT_SHAPE(DT, 4); break;                                                    \
        }                                                                                      \
    }

FLOAT_KERNEL(kern_f32, NX_DTYPE_F32)
FLOAT_KERNEL(kern_f16, NX_DTYPE_F16)
FLOAT_KERNEL(kern_bf16, NX_DTYPE_BF16)

/* ------------------------------------------------------------------ quantized weights */

/* Per-lane word index and bit offset of elements 16h+l in a 32-element block, for the
 * widths whose elements straddle words (3, 5, 6). */
typedef struct qlut {
    __m512i idx[2], idx1[2], off[2], coff[2];
    __m512i even, odd; /* x deinterleave for 4-bit blocks */
} qlut;

static void qlut_init(qlut *L, int bits) {
    int32_t ev[16], od[16];
    for (int l = 0; l < 16; l++) {
        ev[l] = 2 * l;
        od[l] = 2 * l + 1;
    }
    L->even = _mm512_loadu_si512(ev);
    L->odd = _mm512_loadu_si512(od);
    for (int h = 0; h < 2; h++) {
        int32_t idx[16], off[16], idx1[16], coff[16];
        for (int l = 0; l < 16; l++) {
            int pos = (16 * h + l) * bits;
            idx[l] = pos >> 5;
            idx1[l] = (pos >> 5) + 1;
            off[l] = pos & 31;
            coff[l] = 32 - (pos & 31); /* a shift of 32 gives 0: nothing from the next word */
        }
        L->idx[h] = _mm512_loadu_si512(idx);
        L->idx1[h] = _mm512_loadu_si512(idx1);
        L->off[h] = _mm512_loadu_si512(off);
        L->coff[h] = _mm512_loadu_si512(coff);
    }
}

/* q as an exact float: bits [at, at+BITS) of each lane (`masked`: higher bits may be set). */
AI __m512 qfloat(const int BITS, __m512i v, const int at, const int masked) {
    if (at) v = _mm512_srli_epi32(v, (unsigned)at);
    if (masked) v = _mm512_and_si512(v, _mm512_set1_epi32((1 << BITS) - 1));
    return _mm512_cvtepi32_ps(v);
}

/* Decodes the 32 q values of one block (4·BITS bytes at p) as floats: in natural
 * order, except 4-bit blocks, which come as elements 0,2,…,30 then 1,3,…,31 (the caller
 * deinterleaves x to match; it saves shuffles on every weight row). */
AI void unpack32(const int BITS, const uint8_t *p, const qlut *L, __m512 *f0, __m512 *f1) {
    if (BITS == 8) {
        *f0 = qfloat(8, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)), 0, 0);
        *f1 = qfloat(8, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))), 0, 0);
    } else if (BITS == 4) {
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
        *f0 = qfloat(4, v, 0, 1);
        *f1 = qfloat(4, v, 4, 0);
    } else if (BITS == 2) {
        /* byte k holds elements 4k..4k+3; split into (4k, 4k+2) and (4k+1, 4k+3) nibble
         * pairs, interleave, then split nibbles and interleave 16-bit pairs. */
        __m128i v = _mm_loadl_epi64((const __m128i *)p);
        __m128i m2 = _mm_set1_epi8(0x33), m4 = _mm_set1_epi8(0x0f);
        __m128i a = _mm_and_si128(v, m2), c = _mm_and_si128(_mm_srli_epi16(v, 2), m2);
        __m128i u = _mm_unpacklo_epi8(a, c);
        __m128i lo = _mm_and_si128(u, m4), hi = _mm_and_si128(_mm_srli_epi16(u, 4), m4);
        *f0 = qfloat(2, _mm512_cvtepu8_epi32(_mm_unpacklo_epi16(lo, hi)), 0, 0);
        *f1 = qfloat(2, _mm512_cvtepu8_epi32(_mm_unpackhi_epi16(lo, hi)), 0, 0);
    } else {
        __m512i wv = _mm512_maskz_loadu_epi32((__mmask16)((1u << BITS) - 1u), p);
        for (int h = 0; h < 2; h++) {
            __m512i lo = _mm512_permutexvar_epi32(L->idx[h], wv);
            __m512i hi = _mm512_permutexvar_epi32(L->idx1[h], wv);
            __m512i q = _mm512_or_si512(_mm512_srlv_epi32(lo, L->off[h]),
                                        _mm512_sllv_epi32(hi, L->coff[h]));
            if (h == 0) *f0 = qfloat(BITS, q, 0, 1);
            else *f1 = qfloat(BITS, q, 0, 1);
        }
    }
}

typedef struct qargs {
    const uint8_t *w;      /* first row of the block */
    size_t wstride;        /* packed bytes per row */
    const uint8_t *sc, *bi; /* scales/biases of the first row (bi may be NULL) */
    size_t sstride;        /* scale bytes per row */
    nx_dtype sdt;
    int64_t in, group;
    const qlut *lut;
    qpf_window pf; /* where the weight prefetches may go */
    spf_stream spf; /* and the scale and bias prefetches */
} qargs;

/* dot = Σ_g (s_g·Σ_{j∈g} q_j·x_j + b_g·X_g) with X_g = Σ_{j∈g} x_j precomputed per input row
 * (xsum): one FMA per 16 weights and input row, plus one per group, on the packed data.
 * Lanes accumulate Σ q·x within a group, then are scaled into acc; the bias terms go to a
 * scalar sum added after the horizontal reduction. */
/* 4-bit rows: the 16 possible weights of a group (s·q + b, q = 0..15) form a table in one
 * register, and each packed nibble indexes it (vpermps looks at the low 4 bits of a lane), so a
 * weight costs no int→float conversion and no per-group scale/bias arithmetic on the sums. */
AI void mk_quant4_lut(const int R, const int TT, const qargs *a, const float *x, int64_t ldx,
                      float *y, int64_t ldy) {
    const int64_t ngroups = a->in / a->group, nblk = a->group / 32;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const qpf_stream ps = qpf_stream_of(a->w, a->wstride, R, 16);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ngroups; g++) {
        __m512 lut[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            float sc = load_sc(a->sdt, a->sc + r * a->sstride, g);
            float bi = a->bi ? load_sc(a->sdt, a->bi + r * a->sstride, g) : 0.0f;
            /* multiply then add, two roundings: the same value as the dequantization formula */
            lut[r] = _mm512_add_ps(_mm512_mul_ps(iota, _mm512_set1_ps(sc)), _mm512_set1_ps(bi));
        }
        for (int64_t k = 0; k < nblk; k++) {
            int64_t e0 = g * a->group + k * 32;
            const uint8_t *p = a->w + (size_t)e0 / 2;
            __m512 x0[4], x1[4];
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                __m512 lo = _mm512_loadu_ps(x + t * ldx + e0), hi = _mm512_loadu_ps(x + t * ldx + e0 + 16);
                x0[t] = _mm512_permutex2var_ps(lo, a->lut->even, hi);
                x1[t] = _mm512_permutex2var_ps(lo, a->lut->odd, hi);
            }
            const uintptr_t pf = qpf_at(&a->pf, &ps, (size_t)e0 / 2);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                _mm_prefetch((const char *)(pf + (size_t)r * ps.rstride), QPF_HINT);
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + r * a->wstride)));
                __m512 f0 = _mm512_permutexvar_ps(v, lut[r]);
                __m512 f1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut[r]);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    acc[r][t] = _mm512_fmadd_ps(f0, x0[t], acc[r][t]);
                    acc[r][t] = _mm512_fmadd_ps(f1, x1[t], acc[r][t]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) y[t * ldy + r] = hsum16(acc[r][t]);
}

AI void mk_quant(const int BITS, const int R, const int TT, const qargs *a, const float *x,
                 int64_t ldx, const float *X, float *y, int64_t ldy) {
    if (BITS == 4) {
        (void)X;
        mk_quant4_lut(R, TT, a, x, ldx, y, ldy);
        return;
    }
    const int64_t ngroups = a->in / a->group, nblk = a->group / 32;
    const qpf_stream ps = qpf_stream_of(a->w, a->wstride, R, (size_t)BITS * 4);
    __m512 acc[4][4];
    float bsum[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            acc[r][t] = _mm512_setzero_ps();
            bsum[r][t] = 0.0f;
        }
    for (int64_t g = 0; g < ngroups; g++) {
        __m512 gacc[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) gacc[r][t] = _mm512_setzero_ps();
        for (int64_t k = 0; k < nblk; k++) {
            int64_t e0 = g * a->group + k * 32; /* first element of the block */
            const uint8_t *p = a->w + (size_t)e0 * BITS / 8;
            __m512 x0[4], x1[4];
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                x0[t] = _mm512_loadu_ps(x + t * ldx + e0);
                x1[t] = _mm512_loadu_ps(x + t * ldx + e0 + 16);
                if (BITS == 4) {
                    __m512 ev = _mm512_permutex2var_ps(x0[t], a->lut->even, x1[t]);
                    x1[t] = _mm512_permutex2var_ps(x0[t], a->lut->odd, x1[t]);
                    x0[t] = ev;
                }
            }
            const uintptr_t pf = qpf_at(&a->pf, &ps, (size_t)e0 * BITS / 8);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512 f0, f1;
                _mm_prefetch((const char *)(pf + (size_t)r * ps.rstride), QPF_HINT);
                unpack32(BITS, p + r * a->wstride, a->lut, &f0, &f1);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    gacc[r][t] = _mm512_fmadd_ps(f0, x0[t], gacc[r][t]);
                    gacc[r][t] = _mm512_fmadd_ps(f1, x1[t], gacc[r][t]);
                }
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 sv = _mm512_set1_ps(load_sc(a->sdt, a->sc + r * a->sstride, g));
            float bi = a->bi ? load_sc(a->sdt, a->bi + r * a->sstride, g) : 0.0f;
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                acc[r][t] = _mm512_fmadd_ps(sv, gacc[r][t], acc[r][t]);
                bsum[r][t] += bi * X[t * ngroups + g];
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) y[t * ldy + r] = hsum16(acc[r][t]) + bsum[r][t];
}

/* X[g] = Σ of x over group g, in a fixed order (16 lanes, then hsum16): every call computes
 * the same sums for the same row. */
static void xsum_row(const float *x, int64_t in, int64_t group, float *X) {
    for (int64_t g = 0; g < in / group; g++) {
        __m512 s = _mm512_setzero_ps();
        for (int64_t j = 0; j < group; j += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + g * group + j));
        X[g] = hsum16(s);
    }
}

/* Rows [r0, r1) of a call as register blocks of R rows, in one function (no call per block). */
AI void mk_quant_rows(const int BITS, const int R, const int TT, const qargs *a, const float *x, int64_t ldx,
                      const float *X, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    qargs b = *a;
    nx_side_pf *side = a->pf.side;
    for (int64_t o = r0; o < r1; o += R) {
        b.w = a->w + (size_t)o * a->wstride;
        b.sc = a->sc + (size_t)o * a->sstride;
        b.bi = a->bi ? a->bi + (size_t)o * a->sstride : NULL;
        spf_hint(&b.spf, b.sc, (size_t)R * a->sstride);
        nx_side_hint(side, R);
        mk_quant(BITS, R, TT, &b, x, ldx, X, y + o, ldy);
    }
}

/* n rows for TT input rows: blocks of 4 rows for 1–2 input rows, 2 for 3–4 (32 zmm registers
 * hold acc and gacc), then the remaining rows one at a time. */
#define QUANT_SHAPE(BITS, RR, T_)                                                              \
    do {                                                                                       \
        mk_quant_rows(BITS, RR, T_, a, x, ldx, X, y, ldy, 0, n - n % (RR));                    \
        mk_quant_rows(BITS, 1, T_, a, x, ldx, X, y, ldy, n - n % (RR), n);                     \
    } while (0)
#define QUANT_KERNEL(NAME, BITS)                                                               \
    static void NAME(int TT, const qargs *a, int64_t n, const float *x, int64_t ldx,          \
                     const float *X, float *y, int64_t ldy) {                                  \
        switch (TT) {                                                                          \
        case 1: QUANT_SHAPE(BITS, 4, 1); break;                                                \
        case 2: QUANT_SHAPE(BITS, 4, 2); break;                                                \
        case 3: QUANT_SHAPE(BITS, 2, 3); break;                                                \
        default: QUANT_SHAPE(BITS, 2, 4); break;                                               \
        }                                                                                      \
    }

QUANT_KERNEL(kern_q2, 2)
QUANT_KERNEL(kern_q3, 3)
QUANT_KERNEL(kern_q4, 4)
QUANT_KERNEL(kern_q5, 5)
QUANT_KERNEL(kern_q6, 6)
QUANT_KERNEL(kern_q8, 8)

/* ------------------------------------------------------------------ blocking driver */

static int avx512_matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T,
                              float *y, int64_t ldy, int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s) {
    const int64_t in = W->in;
    /* 2- and 4-bit weights on int8 activations: AVX2's integer kernels, faster than dequantizing
     * in 512-bit float (CPUs with AVX-512 but no VNNI) */
    if (nx_avx2_int8_rows(W, x, ldx, T, y, ldy, o0, o1, s)) return 1;
    const qpf_window pw = qpf_window_of(W, o1, next, &s->side);
    if (W->dtype == NX_DTYPE_U32) {
        void (*kern)(int, const qargs *, int64_t, const float *, int64_t, const float *, float *, int64_t);
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
        const int64_t ngroups = in / W->group;
        qargs a = {.wstride = (size_t)in * (size_t)W->bits / 8,
                   .sstride = (size_t)ngroups * ssz,
                   .sdt = W->sdtype,
                   .in = in,
                   .group = W->group,
                   .lut = &lut,
                   .pf = pw};
        a.spf = spf_stream_of(W, a.wstride, a.sstride);
        qpf_next_scales(next);
        /* Group sums of x live on the stack, so T is taken in chunks that fit; each chunk is
         * an independent matmul (rows never interact). */
        float X[XSUM_FLOATS];
        int64_t tc = XSUM_FLOATS / ngroups;
        if (tc < 1) return 0; /* > 64K groups per row: leave it to the reference */
        int64_t ob = nx_rows_per_block(a.wstride);
        for (int64_t c0 = 0; c0 < T; c0 += tc) {
            int64_t c1 = c0 + tc < T ? c0 + tc : T;
            for (int64_t t = c0; t < c1; t++) xsum_row(x + t * ldx, in, W->group, X + (t - c0) * ngroups);
            for (int64_t b0 = o0; b0 < o1; b0 += ob) {
                int64_t b1 = b0 + ob < o1 ? b0 + ob : o1;
                for (int64_t t = c0; t < c1; t += 4) {
                    int tt = c1 - t < 4 ? (int)(c1 - t) : 4;
                    a.w = (const uint8_t *)W->w + (size_t)b0 * a.wstride;
                    a.sc = (const uint8_t *)W->scales + (size_t)b0 * a.sstride;
                    a.bi = W->biases ? (const uint8_t *)W->biases + (size_t)b0 * a.sstride : NULL;
                    kern(tt, &a, b1 - b0, x + t * ldx, ldx, X + (t - c0) * ngroups, y + t * ldy + b0, ldy);
                }
            }
        }
        return 1;
    }
    void (*kern)(int, const uint8_t *, size_t, const float *, int64_t, float *, int64_t, int64_t, int64_t,
                 const qpf_window *, int);
    switch (W->dtype) {
    case NX_DTYPE_F32: kern = kern_f32; break;
    case NX_DTYPE_F16: kern = kern_f16; break;
    case NX_DTYPE_BF16: kern = kern_bf16; break;
    default: return 0;
    }
    size_t stride = (size_t)in * nx_dtype_size(W->dtype);
    /* decode and verify (one pass of every input row) read split streams (avx512_vnni.c) */
    const int split = T <= 4;
    qpf_window sw = pw;
    if (split) qpf_split_next(&sw, next, FLOAT_R);
    int64_t ob = split ? o1 - o0 : nx_rows_per_block(stride);
    for (int64_t b0 = o0; b0 < o1; b0 += ob) {
        int64_t b1 = b0 + ob < o1 ? b0 + ob : o1;
        for (int64_t t = 0; t < T; t += 4) {
            int tt = T - t < 4 ? (int)(T - t) : 4;
            kern(tt, (const uint8_t *)W->w + (size_t)b0 * stride, stride, x + t * ldx, ldx, y + t * ldy + b0, ldy,
                 in, b1 - b0, &sw, split);
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ vector helpers */

void nx_avx512_to_f32(nx_dtype t, const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    if (t == NX_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_w16(t, s, i));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, load_w16_tail(t, s, i, m));
    }
}

float nx_avx512_dot_f32(const float *a, const float *b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                              acc);
    }
    return hsum16(acc);
}

void nx_avx512_axpy_f32(float a, const float *x, float *y, int64_t n) {
    __m512 av = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m512 r = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

/* 16 elements of a cached row from element i (lanes past the mask 0), widened from f16 (exact)
 * when F16. */
AI __m512 kv_load(const int F16, const void *row, int64_t i, __mmask16 m) {
    if (F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i));
    return _mm512_maskz_loadu_ps(m, (const float *)row + i);
}

/* Scores of up to 4 heads (q, q + hd, ...) against R consecutive rows from k (R <= 4): each
 * accumulated exactly as nx_avx512_dot_f32 does it, then reduced in hsum16's order (four heads
 * at once). R x G independent chains; each q slice is loaded once for the R rows and each row
 * slice once for the G heads, so a 4 x 4 tile takes 8 loads per 16 multiply-adds. */
AI void dots_tile(const int F16, const int R, const int G, const float *q, const void *k, size_t rstride,
                  int64_t hd, int64_t full, __mmask16 m, __m128 s[4]) {
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) a[r][h] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i < full; i += 16) {
        __m512 kv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) kv[r] = kv_load(F16, (const char *)k + r * rstride, i, (__mmask16)0xffff);
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) {
            const __m512 qv = _mm512_loadu_ps(q + h * hd + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) a[r][h] = _mm512_fmadd_ps(qv, kv[r], a[r][h]);
        }
    }
    if (i < hd) {
        __m512 kv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) kv[r] = kv_load(F16, (const char *)k + r * rstride, i, m);
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) {
            const __m512 qv = _mm512_maskz_loadu_ps(m, q + h * hd + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) a[r][h] = _mm512_fmadd_ps(qv, kv[r], a[r][h]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) s[r] = hsum16x4(a[r][0], a[r][1], a[r][2], a[r][3]);
}

/* Rows [p, p + R) of scores for G heads. */
AI void scores_tile(const int F16, const int R, const int G, const float *qh, const void *K, int64_t stride,
                    size_t es, int64_t p, int64_t hd, int64_t full, __mmask16 m, __m128 sc, float *oh, int64_t ldo) {
    __m128 s[4];
    dots_tile(F16, R, G, qh, (const char *)K + (size_t)(p * stride) * es, (size_t)stride * es, hd, full, m, s);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float v[4];
        _mm_storeu_ps(v, _mm_mul_ps(s[r], sc));
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) oh[h * ldo + p + r] = v[h];
    }
}

AI void scores_rows(const int F16, const int R, int G, const float *qh, const void *K, int64_t stride, size_t es,
                    int64_t p, int64_t hd, int64_t full, __mmask16 m, __m128 sc, float *oh, int64_t ldo) {
    switch (G) {
    case 1: scores_tile(F16, R, 1, qh, K, stride, es, p, hd, full, m, sc, oh, ldo); break;
    case 2: scores_tile(F16, R, 2, qh, K, stride, es, p, hd, full, m, sc, oh, ldo); break;
    case 3: scores_tile(F16, R, 3, qh, K, stride, es, p, hd, full, m, sc, oh, ldo); break;
    default: scores_tile(F16, R, 4, qh, K, stride, es, p, hd, full, m, sc, oh, ldo); break;
    }
}

/* Each cached row is loaded once for up to 4 heads at a time, four rows at a time, a block of
 * rows at a time. */
AI void scores(const int F16, const float *q, int64_t g, const void *K, int64_t stride, int64_t n, int64_t hd,
               float scale, float *out, int64_t ldo) {
    const size_t es = F16 ? 2 : 4;
    const int64_t ahead = attn_pf_rows(es, stride);
    const int64_t full = hd & ~(int64_t)15;
    const __mmask16 m = (__mmask16)((1u << (hd - full)) - 1u);
    const __m128 sc = _mm_set1_ps(scale);
    const int64_t pb = attn_block_rows(es, hd);
    for (int64_t p0 = 0; p0 < n; p0 += pb) {
        const int64_t p1 = n - p0 < pb ? n : p0 + pb;
        for (int64_t h0 = 0; h0 < g; h0 += 4) {
            const int G = g - h0 < 4 ? (int)(g - h0) : 4;
            const float *qh = q + h0 * hd;
            float *oh = out + h0 * ldo;
            int64_t p = p0;
            for (; p + 4 <= p1; p += 4) {
                if (h0 == 0)
                    for (int r = 0; r < 4; r++) attn_prefetch_row(K, es, stride, p + r, ahead, n, hd);
                scores_rows(F16, 4, G, qh, K, stride, es, p, hd, full, m, sc, oh, ldo);
            }
            if (h0 == 0)
                for (int64_t r = p; r < p1; r++) attn_prefetch_row(K, es, stride, r, ahead, n, hd);
            switch (p1 - p) {
            case 1: scores_rows(F16, 1, G, qh, K, stride, es, p, hd, full, m, sc, oh, ldo); break;
            case 2: scores_rows(F16, 2, G, qh, K, stride, es, p, hd, full, m, sc, oh, ldo); break;
            case 3: scores_rows(F16, 3, G, qh, K, stride, es, p, hd, full, m, sc, oh, ldo); break;
            default: break;
            }
        }
    }
}

void nx_avx512_attn_scores(const float *q, int64_t g, const void *K, nx_dtype kvt, int64_t stride, int64_t n,
                           int64_t hd, float scale, float *out, int64_t ldo) {
    if (kvt == NX_DTYPE_F16) scores(1, q, g, K, stride, n, hd, scale, out, ldo);
    else scores(0, q, g, K, stride, n, hd, scale, out, ldo);
}

/* The first `left` lanes of 16 (none for left <= 0, all from 16 on). */
AI __mmask16 lanes16(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
}

/* o_h += Σ_p w_h[p]·V_p for up to 4 heads and 64 elements of o at a time, kept in registers
 * while all rows pass: each row's slice is loaded once for the heads, and each element takes the
 * same fused multiply-adds in the same order as nx_avx512_axpy_f32 calls would. All four
 * vectors are always computed (lanes past hd load and store nothing, their sums are unused):
 * with a run-time vector count the compiler kept the sums on the stack, a store-to-load
 * round trip per row that made this 3-4x slower. */
AI void accum4(const int F16, const float *w, int64_t ldw, const int G, const void *V, int64_t stride, int64_t p0,
               int64_t p1, int64_t n, int64_t hd, int64_t c0, int pf, float *o) {
    const size_t es = F16 ? 2 : 4;
    const int64_t ahead = attn_pf_rows(es, stride);
    const int64_t len = hd - c0 < 64 ? hd - c0 : 64;
    __mmask16 mk[4];
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const int64_t left = len - 16 * v;
        mk[v] = lanes16(left);
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) acc[h][v] = _mm512_maskz_loadu_ps(mk[v], o + h * hd + c0 + 16 * v);
    }
    for (int64_t p = p0; p < p1; p++) {
        if (pf) attn_prefetch_row(V, es, stride, p, ahead, n, hd);
        const void *vp = (const char *)V + (size_t)(p * stride + c0) * es;
        __m512 x[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) x[v] = kv_load(F16, vp, 16 * v, mk[v]);
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) {
            const __m512 wv = _mm512_set1_ps(w[h * ldw + p]);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                acc[h][v] = _mm512_fmadd_ps(wv, x[v], acc[h][v]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < G; h++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(o + h * hd + c0 + 16 * v, mk[v], acc[h][v]);
}

AI void accum(const int F16, const float *w, int64_t ldw, int64_t g, const void *V, int64_t stride, int64_t n,
              int64_t hd, float *o) {
    const int64_t pb = attn_block_rows(F16 ? 2 : 4, hd);
    for (int64_t p0 = 0; p0 < n; p0 += pb) {
        const int64_t p1 = n - p0 < pb ? n : p0 + pb;
        for (int64_t h0 = 0; h0 < g; h0 += 4) {
            const int G = g - h0 < 4 ? (int)(g - h0) : 4;
            for (int64_t c0 = 0; c0 < hd; c0 += 64) {
                const float *wh = w + h0 * ldw;
                float *oh = o + h0 * hd;
                const int pf = h0 == 0 && c0 == 0;
                switch (G) {
                case 1: accum4(F16, wh, ldw, 1, V, stride, p0, p1, n, hd, c0, pf, oh); break;
                case 2: accum4(F16, wh, ldw, 2, V, stride, p0, p1, n, hd, c0, pf, oh); break;
                case 3: accum4(F16, wh, ldw, 3, V, stride, p0, p1, n, hd, c0, pf, oh); break;
                default: accum4(F16, wh, ldw, 4, V, stride, p0, p1, n, hd, c0, pf, oh); break;
                }
            }
        }
    }
}

void nx_avx512_attn_accum(const float *w, int64_t ldw, int64_t g, const void *V, nx_dtype kvt, int64_t stride,
                          int64_t n, int64_t hd, float *o) {
    if (kvt == NX_DTYPE_F16) accum(1, w, ldw, g, V, stride, n, hd, o);
    else accum(0, w, ldw, g, V, stride, n, hd, o);
}

/* e^x for 16 lanes: x = k·ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact k·ln2),
 * a degree-6 polynomial for e^r (Cephes expf's coefficients), then ·2^k. Within 2 ulp of expf;
 * below about -103 the result is 0, NaN stays NaN. */
AI __m512 exp16(__m512 x) {
    /* clamp; a NaN passes (max/min return their second operand when either is NaN) */
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(88.7f), x);
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, k);
}

float nx_avx512_exp_shift_f32(float *x, int64_t n, float *mx_out) {
    const int64_t full = n & ~(int64_t)15;
    const __mmask16 m = (__mmask16)((1u << (n - full)) - 1u);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i < full; i += 16) mx = _mm512_max_ps(_mm512_loadu_ps(x + i), mx);
    if (i < n) mx = _mm512_mask_max_ps(mx, m, _mm512_maskz_loadu_ps(m, x + i), mx);
    *mx_out = _mm512_reduce_max_ps(mx);
    const __m512 mv = _mm512_set1_ps(*mx_out);
    __m512 sum = _mm512_setzero_ps();
    for (i = 0; i < full; i += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        _mm512_storeu_ps(x + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (i < n) {
        const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mv)));
        _mm512_mask_storeu_ps(x + i, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    return hsum16(sum);
}

/* g / (1 + e^-g) · u, 16 lanes at a time (e^-g past exp16's clamp is huge or 0: the silu
 * goes to -0 or g, as with expf). */
AI __m512 swiglu16(__m512 g, __m512 u) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

void nx_avx512_swiglu_f32(float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(g + i, swiglu16(_mm512_loadu_ps(g + i), u ? _mm512_loadu_ps(u + i) : one));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(g + i, m, swiglu16(_mm512_maskz_loadu_ps(m, g + i), u ? _mm512_maskz_loadu_ps(m, u + i) : one));
    }
}

/* nx_delta_rule_f32 on blocks of 8 vectors (128 columns; lanes past dv masked), each lane
 * running the reference's loop for its column, products and sums rounded separately as it does.
 * A block's rows are read whole, in order, and its 8 sums are independent chains, so neither the
 * add latency nor strided reads bound it; the second pass recomputes decay·S from src (the same
 * bits) rather than storing it twice. The first pass hints the block DR_PF rows ahead (past the
 * end: the next head's state, which follows): a state comes cold from memory every token, and
 * the hardware's streams restart at every 4 KB page. */
#define DR_V 8
#define DR_PF 16

void nx_avx512_delta_rule_f32(const float *src, float *dst, int64_t dk, int64_t dv, const float *k, const float *v,
                              float decay, float beta, const float *q, float *o) {
    const __m512 dc = _mm512_set1_ps(decay), bt = _mm512_set1_ps(beta);
    for (int64_t j = 0; j < dv; j += 16 * DR_V) {
        __mmask16 m[DR_V];
        __m512 kv[DR_V], d[DR_V], acc[DR_V];
        for (int u = 0; u < DR_V; u++) m[u] = lanes16(dv - j - 16 * u), kv[u] = acc[u] = _mm512_setzero_ps();
        for (int64_t i = 0; i < dk; i++) {
            const __m512 ki = _mm512_set1_ps(k[i]);
            const float *s = src + i * dv + j;
            for (int u = 0; u < DR_V; u++) _mm_prefetch((const char *)(s + DR_PF * dv + 16 * u), _MM_HINT_T0);
            for (int u = 0; u < DR_V; u++)
                kv[u] = _mm512_add_ps(kv[u], _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m[u], s + 16 * u), dc), ki));
        }
        for (int u = 0; u < DR_V; u++) d[u] = _mm512_mul_ps(bt, _mm512_sub_ps(_mm512_maskz_loadu_ps(m[u], v + j + 16 * u), kv[u]));
        for (int64_t i = 0; i < dk; i++) {
            const __m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q ? q[i] : 0.0f);
            const float *s = src + i * dv + j;
            float *w = dst + i * dv + j;
            for (int u = 0; u < DR_V; u++) {
                const __m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m[u], s + 16 * u), dc), _mm512_mul_ps(ki, d[u]));
                _mm512_mask_storeu_ps(w + 16 * u, m[u], t);
                acc[u] = _mm512_add_ps(acc[u], _mm512_mul_ps(t, qi));
            }
        }
        if (o)
            for (int u = 0; u < DR_V; u++) _mm512_mask_storeu_ps(o + j + 16 * u, m[u], acc[u]);
    }
}

const nx_kernel_table nx_kernels_avx512 = {
    .name = "avx512" NX_QPF_SUFFIX,
    .matmul_rows = avx512_matmul_rows,
    NX_AVX512_VECTOR_HELPERS,
};

/* nx_rmsnorm_f32: the 8 partial sums of squares are the 8 double lanes (mul then add, no fused
 * step, as the scalar reference compiles without contraction), so the bits match it. */
void nx_avx512_rmsnorm_f32(const float *x, const float *w, float eps, int64_t n, float *out) {
    __m512d acc = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        acc = _mm512_add_pd(acc, _mm512_mul_pd(v, v));
    }
    double part[8];
    _mm512_storeu_pd(part, acc);
    const __m512 rv = _mm512_set1_ps(nx_rmsnorm_scale(part, x, i, n, eps));
    for (i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), rv);
        if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(out + i, m, v);
    }
}

/* nx_exp_weights on 8 doubles: y = (x - m)·inv_t = k·ln2 + r with k = round(y/ln2), |r| <= ln2/2
 * (ln2 in two parts, so r is exact to ~2^-60), e^r by its Taylor polynomial to r^12 (truncation
 * below 2e-16 relative), then ·2^k (vscalefpd: underflows to 0 as exp does); y below -746, and
 * -inf, give 0. The sum runs in 8 lanes, added in a fixed tree at the end. */
double nx_avx512_exp_weights(const float *x, int64_t n, float m, double inv_t, double *w) {
    static const double c[13] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040,
                                 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600};
    const __m512d vm = _mm512_set1_pd((double)m), vt = _mm512_set1_pd(inv_t), lo = _mm512_set1_pd(-746.0);
    const __m512d log2e = _mm512_set1_pd(1.4426950408889634), ln2hi = _mm512_set1_pd(6.93147180369123816490e-01),
                  ln2lo = _mm512_set1_pd(1.90821492927058770002e-10);
    __m512d sum = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 8) {
        const __mmask8 k8 = n - i >= 8 ? (__mmask8)0xff : (__mmask8)((1u << (n - i)) - 1u);
        const __m512d xd = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k8, x + i));
        const __m512d y = _mm512_mul_pd(_mm512_sub_pd(xd, vm), vt);
        const __mmask8 live = _mm512_mask_cmp_pd_mask(k8, y, lo, _CMP_GT_OQ);
        const __m512d yc = _mm512_max_pd(y, lo); /* -inf and NaN-free for the reduction */
        const __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(yc, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512d r = _mm512_fnmadd_pd(k, ln2lo, _mm512_fnmadd_pd(k, ln2hi, yc));
        __m512d p = _mm512_set1_pd(c[12]);
        for (int j = 11; j >= 0; j--) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(c[j]));
        const __m512d e = _mm512_maskz_mov_pd(live, _mm512_scalef_pd(p, k));
        _mm512_mask_storeu_pd(w + i, k8, e);
        sum = _mm512_add_pd(sum, e);
    }
    const __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(sum), _mm512_extractf64x4_pd(sum, 1));
    const __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    return _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)));
}

/* nx_argmax_f32 on 16 lanes: each lane keeps its first largest element (strictly greater
 * replaces), then the lanes holding the overall largest give their smallest index. */
int64_t nx_avx512_argmax_f32(float *x, int64_t n, float *max) {
    __m512 best = _mm512_set1_ps(-INFINITY);
    __m512i at = _mm512_setzero_si512(), idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    int64_t i = 0;
    for (; i < n; i += 16, idx = _mm512_add_epi32(idx, step)) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, x + i);
        const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        if (nan) {
            v = _mm512_mask_blend_ps(nan, v, _mm512_set1_ps(-INFINITY));
            _mm512_mask_storeu_ps(x + i, (__mmask16)(nan & m), v);
        }
        const __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
        best = _mm512_mask_blend_ps(gt, best, v);
        at = _mm512_mask_blend_epi32(gt, at, idx);
    }
    const float mx = _mm512_reduce_max_ps(best);
    *max = mx;
    if (mx == -INFINITY) return 0;
    const __mmask16 hit = _mm512_cmp_ps_mask(best, _mm512_set1_ps(mx), _CMP_EQ_OQ);
    return (int64_t)_mm512_mask_reduce_min_epi32(hit, at);
}
