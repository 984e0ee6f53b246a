/* AVX2 kernels for 2-, 3- and 4-bit affine weights on int8 activations (the avx2 table's
 * quantized weights unless W->x16): the AVX2 counterpart of avx512_vnni.c's int8 path, for CPUs
 * without AVX-512 (Zen 2/3, Intel client cores). Dequantizing in float costs an FMA per 8 weights
 * and input row; here vpmaddubsw multiplies 32 unsigned weight fields by 32 int8 activations per
 * instruction, so decode and verify stay near memory speed on fewer cores. Built again as
 * avx2_vnni.c (NX_I8_VNNI) for CPUs with AVX-VNNI (Alder Lake and later, Zen 5), where one
 * vpdpbusd replaces vpmaddubsw + vpmaddwd + the add.
 *
 * Each input row is rounded per weight group to int8 exactly as the VNNI kernels do (d =
 * max|x|/127, each element within 1/254 of its group's largest), packed in the order the weight
 * fields come out of their bytes, so no shuffle is needed per weight block:
 * - 4-bit, per 64 elements (32 packed bytes): the evens (low nibbles), then the odds;
 * - 2-bit, per 64 elements (16 packed bytes): elements 4k + j for field j = 0..3 in turn;
 * - 3-bit, per 32 elements (12 packed bytes; each field pulled into a 16-bit lane by vpshufb and
 *   brought to bit 0 by a multiply and a shift, the lanes then packed to bytes): elements 0-7,
 *   16-23, 8-15, 24-31.
 * Per 64-element block, two vpmaddubsw give 16-bit sums of at most 4·15·127 (no saturation),
 * vpmaddwd makes them 8 exact int32 sums (AVX-VNNI: two vpdpbusd); per group they become float(Σ)·(s·d) in 8 lanes, after
 * the bias terms b·Σx of 8 groups at a time went into the same lanes; a fixed tree at the end.
 *
 * Numerics contract: a row's integer image depends on that row alone, integer sums are exact
 * and the float epilogue runs in a fixed order, so each output is the same bits whatever T, the
 * row split or the thread count. */
#include <math.h>

#include "kernels/x86_common.h"

#ifndef NX_I8_VNNI
#define NX_I8_VNNI 0
#endif
#if NX_I8_VNNI
#define I8_FN(name) nx_avxvnni_##name
#else
#define I8_FN(name) nx_avx2_##name
#endif

/* The staging of one call's input images in the thread's scratch (the integer kernels' bytes). */
#define I8_XQ_BYTES (384u * 1024u)
#define I8_GROUPS 8192
typedef struct i8_scratch {
    int8_t xq[I8_XQ_BYTES] __attribute__((aligned(64)));
    float dg[I8_GROUPS], Xg[I8_GROUPS];
} i8_scratch;
_Static_assert(sizeof(i8_scratch) <= NX_VNNI_SCRATCH_BYTES, "int8 staging exceeds the kernel scratch");

int I8_FN(int8_takes)(const nx_linear *W) {
    if (W->dtype != NX_DTYPE_U32 || W->x16 || (W->bits != 2 && W->bits != 3 && W->bits != 4)) return 0;
    return W->group % 64 == 0 && W->in % W->group == 0 && W->in <= (int64_t)I8_XQ_BYTES &&
           W->in / W->group <= I8_GROUPS;
}

/* n <= 8 floats from p, zeros after them. */
AI __m256 load_x8_n(const float *p, int64_t n) { return n >= 8 ? _mm256_loadu_ps(p) : load_x8_tail(p, n); }

static float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* The group's Σx (f32 lanes, fixed tree; only the bias term uses it), its scale d and 1/d
 * (nx_act8_scale). */
static void group_scale(const float *xg, int64_t group, float *d, float *inv, float *X) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mx = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < group; j += 8) {
        const __m256 v = _mm256_loadu_ps(xg + j);
        mx = _mm256_max_ps(mx, _mm256_and_ps(v, absm));
        sum = _mm256_add_ps(sum, v);
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    const float amax = hmax8(mx);
    *X = _mm_cvtss_f32(s);
    nx_act8_scale(amax, *X, d, inv);
}

/* 32 elements rounded to int8 at scale 1/inv, in natural order (|x·inv| <= 127: exact
 * narrowing); the lanes come out of the packs interleaved by 64-bit quarters, put back. */
static __m256i q32(const float *x, __m256 iv) {
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), iv));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), iv));
    const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), iv));
    const __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), iv));
    const __m256i ab = _mm256_packs_epi32(a, b), ce = _mm256_packs_epi32(c, e);
    const __m256i v = _mm256_packs_epi16(ab, ce);
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The 64 elements of n0 (0-31) and n1 (32-63) in the kernel's order for BITS. */
static void order64(int bits, __m256i n0, __m256i n1, int8_t *out) {
    if (bits == 4) { /* evens then odds: per lane, 8 evens then 8 odds, then the lanes' halves joined */
        const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                                            12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        const __m256i a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(n0, eo), 0xd8);
        const __m256i b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(n1, eo), 0xd8);
        _mm256_storeu_si256((__m256i *)out, _mm256_permute2x128_si256(a, b, 0x20));
        _mm256_storeu_si256((__m256i *)(out + 32), _mm256_permute2x128_si256(a, b, 0x31));
        return;
    }
    if (bits == 3) { /* per 32: elements 0-7, 16-23, 8-15, 24-31 (the order vpackuswb leaves them in) */
        _mm256_storeu_si256((__m256i *)out, _mm256_permute4x64_epi64(n0, 0xd8));
        _mm256_storeu_si256((__m256i *)(out + 32), _mm256_permute4x64_epi64(n1, 0xd8));
        return;
    }
    /* 2-bit: per lane, the elements by k mod 4 (4 bytes each), then a 4 x 4 dword transpose */
    const __m256i f = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13,
                                       2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i ix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i p0 = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(n0, f), ix);
    const __m256i p1 = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(n1, f), ix);
    const __m256i lo = _mm256_unpacklo_epi64(p0, p1), hi = _mm256_unpackhi_epi64(p0, p1);
    _mm256_storeu_si256((__m256i *)out, _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 32), _mm256_permute2x128_si256(lo, hi, 0x31));
}

/* One input row's int8 image in the kernel's order, its groups' scales d and sums X. */
static void quantize_row(const float *x, int64_t in, int64_t group, int bits, int8_t *xq, float *d, float *X) {
    for (int64_t g = 0; g < in / group; g++) {
        float inv;
        group_scale(x + g * group, group, &d[g], &inv, &X[g]);
        const __m256 iv = _mm256_set1_ps(inv);
        for (int64_t b = g * group; b < (g + 1) * group; b += 64)
            order64(bits, q32(x + b, iv), q32(x + b + 32, iv), xq + b);
    }
}

/* 8 scales or biases (elements i..i+7 of a stored vector) as f32; lanes past n are 0. */
AI __m256 load_sc8(nx_dtype dt, const uint8_t *p, int64_t i, int64_t n) {
    if (n >= 8) {
        if (dt == NX_DTYPE_F32) return _mm256_loadu_ps((const float *)(p + 4 * i));
        const __m128i h = _mm_loadu_si128((const __m128i *)(p + 2 * i));
        if (dt == NX_DTYPE_F16) return _mm256_cvtph_ps(h);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    uint8_t buf[32] = {0};
    memcpy(buf, p + (size_t)i * nx_dtype_size(dt), (size_t)n * nx_dtype_size(dt));
    return load_sc8(dt, buf, 0, 8);
}

typedef struct i8args {
    const uint8_t *w;       /* first row of the register block */
    size_t wstride;         /* packed bytes between its rows */
    const uint8_t *sc, *bi; /* scales/biases of the first row (bi may be NULL) */
    size_t sstride;
    nx_dtype sdt;
    int64_t in, group;
} i8args;

/* The 32 3-bit fields of 12 packed bytes at p as bytes, elements 0-7, 16-23, 8-15, 24-31: each
 * element's two bytes gathered into a 16-bit lane (the 12 bytes in both 128-bit lanes), shifted
 * so the field sits at bits 7-9 (a multiply by 2^(7 - offset)), then to bit 0 and masked. Reads
 * exactly the 12 bytes. */
AI __m256i unpack3x32(const uint8_t *p) {
    int32_t tail;
    memcpy(&tail, p + 8, 4);
    const __m128i v = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)p), tail, 2);
    const __m256i b = _mm256_broadcastsi128_si256(v);
    /* word lane j of lane L holds element e = 8L + j (vector a) or 16 + 8L + j (vector c): bytes
     * 3e/8 and the next, multiplier 2^(7 - 3e mod 8) */
    const __m256i pa = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 1, 2, 1, 2, 1, 2, 2, 3, 2, 3, 3, 4, 3, 4, 3, 4, 4, 5, 4, 5, 4,
                                        5, 5, 6, 5, 6);
    const __m256i pc = _mm256_setr_epi8(6, 7, 6, 7, 6, 7, 7, 8, 7, 8, 7, 8, 8, 9, 8, 9, 9, 10, 9, 10, 9, 10, 10, 11, 10,
                                        11, 10, 11, 11, 12, 11, 12);
    const __m256i mul = _mm256_setr_epi16(128, 16, 2, 64, 8, 1, 32, 4, 128, 16, 2, 64, 8, 1, 32, 4);
    const __m256i m3 = _mm256_set1_epi16(7);
    const __m256i a = _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(b, pa), mul), 7), m3);
    const __m256i c = _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(b, pc), mul), 7), m3);
    return _mm256_packus_epi16(a, c);
}

/* The exact int32 sums (8 lanes) of one 64-element block of one weight row against TT images. */
AI void block_sums(const int BITS, const int TT, const uint8_t *p, const int8_t *xq, int64_t ldq, int64_t e0,
                   __m256i is[4]) {
    __m256i w0, w1;
    if (BITS == 3) {
        w0 = unpack3x32(p);
        w1 = unpack3x32(p + 12);
    } else if (BITS == 4) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)p), m4 = _mm256_set1_epi8(0x0f);
        w0 = _mm256_and_si256(v, m4);
        w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    } else {
        const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
        const __m256i m2 = _mm256_set1_epi8(0x03);
        w0 = _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 2, 2)), m2);
        w1 = _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(4, 4, 6, 6)), m2);
    }
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) {
        const int8_t *xr = xq + t * ldq + e0;
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)xr), x1 = _mm256_loadu_si256((const __m256i *)(xr + 32));
#if NX_I8_VNNI
        is[t] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(is[t], w0, x0), w1, x1);
#else
        const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(w0, x0), _mm256_maddubs_epi16(w1, x1));
        is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(s, _mm256_set1_epi16(1)));
#endif
    }
}

/* R weight rows × TT input rows: y[t·ldy + r·ys]. */
AI void mk_i8(const int BITS, const int R, const int TT, const i8args *a, const int8_t *xq, int64_t ldq,
              const float *d, const float *X, int64_t ldg, float *y, int64_t ldy, int64_t ys) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    const int64_t ng = a->in / a->group, nb = a->group / 64;
    for (int64_t g0 = 0; g0 < ng; g0 += 8) {
        const int64_t gn = ng - g0 < 8 ? ng - g0 : 8;
        float sd[4][4][8] __attribute__((aligned(32)));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m256 s = load_sc8(a->sdt, a->sc + r * a->sstride, g0, gn);
            const __m256 b = a->bi ? load_sc8(a->sdt, a->bi + r * a->sstride, g0, gn) : _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const __m256 dv = load_x8_n(d + t * ldg + g0, gn), Xv = load_x8_n(X + t * ldg + g0, gn);
                _mm256_store_ps(sd[r][t], _mm256_mul_ps(s, dv));
                acc[r][t] = _mm256_fmadd_ps(b, Xv, acc[r][t]);
            }
        }
        for (int64_t gi = 0; gi < gn; gi++) {
            const int64_t e0 = (g0 + gi) * a->group;
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i is[4];
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) is[t] = _mm256_setzero_si256();
                for (int64_t k = 0; k < nb; k++)
                    block_sums(BITS, TT, a->w + r * a->wstride + (size_t)(e0 + 64 * k) * BITS / 8, xq, ldq,
                               e0 + 64 * k, is);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++)
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_broadcast_ss(&sd[r][t][gi]),
                                                acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) y[t * ldy + r * ys] = hsum8(acc[r][t]);
}

/* Register blocks: rows × input rows within the 16 ymm registers. */
#define I8_R(TT) ((TT) == 1 ? 4 : (TT) == 2 ? 2 : 1)

#define I8_KERNEL(NAME, BITS)                                                                    \
    static void NAME(int R, int TT, const i8args *a, const int8_t *xq, int64_t ldq, const float *d, const float *X, \
                     int64_t ldg, float *y, int64_t ldy, int64_t ys) {                           \
        if (R > 1) {                                                                             \
            if (TT == 1) mk_i8(BITS, 4, 1, a, xq, ldq, d, X, ldg, y, ldy, ys);                   \
            else mk_i8(BITS, 2, 2, a, xq, ldq, d, X, ldg, y, ldy, ys);                           \
        } else {                                                                                 \
            switch (TT) {                                                                        \
            case 1: mk_i8(BITS, 1, 1, a, xq, ldq, d, X, ldg, y, ldy, ys); break;                 \
            case 2: mk_i8(BITS, 1, 2, a, xq, ldq, d, X, ldg, y, ldy, ys); break;                 \
            case 3: mk_i8(BITS, 1, 3, a, xq, ldq, d, X, ldg, y, ldy, ys); break;                 \
            default: mk_i8(BITS, 1, 4, a, xq, ldq, d, X, ldg, y, ldy, ys); break;                \
            }                                                                                    \
        }                                                                                        \
    }
I8_KERNEL(kern_i8q2, 2)
I8_KERNEL(kern_i8q3, 3)
I8_KERNEL(kern_i8q4, 4)

typedef void i8_kern(int R, int TT, const i8args *a, const int8_t *xq, int64_t ldq, const float *d, const float *X,
                     int64_t ldg, float *y, int64_t ldy, int64_t ys);

/* a's rows from row o of W. */
static void i8_at(i8args *a, const nx_linear *W, size_t wrow, size_t srow, int64_t o) {
    a->w = (const uint8_t *)W->w + (size_t)o * wrow;
    a->sc = (const uint8_t *)W->scales + (size_t)o * srow;
    a->bi = W->biases ? (const uint8_t *)W->biases + (size_t)o * srow : NULL;
}

/* Rows [o0, o1) for input rows [0, T) whose images are staged (xq, d, X; ldq, ldg apart). */
/* Each register block hints a line of the thread's side spans per weight row (nx_span). */
static void i8_rows(i8_kern *kern, const nx_linear *W, int64_t T, const int8_t *xq, int64_t ldq, const float *d,
                    const float *X, int64_t ldg, float *y, int64_t ldy, int64_t o0, int64_t o1, nx_side_pf *side) {
    const size_t wrow = (size_t)W->in * (size_t)W->bits / 8, srow = (size_t)(W->in / W->group) * nx_dtype_size(W->sdtype);
    i8args a = {.wstride = wrow, .sstride = srow, .sdt = W->sdtype, .in = W->in, .group = W->group};
    if (T <= 4) { /* split streams (avx2.c): row o of each of R equal parts, then the rest */
        const int R = I8_R(T);
        const int64_t q = (o1 - o0) / R;
        i8args b = a;
        b.wstride = (size_t)q * wrow;
        b.sstride = (size_t)q * srow;
        for (int64_t o = o0; R > 1 && o < o0 + q; o++) {
            i8_at(&b, W, wrow, srow, o);
            nx_side_hint(side, R);
            kern(R, (int)T, &b, xq, ldq, d, X, ldg, y + o, ldy, q);
        }
        for (int64_t o = R > 1 ? o0 + R * q : o0; o < o1; o++) {
            i8_at(&a, W, wrow, srow, o);
            nx_side_hint(side, 1);
            kern(1, (int)T, &a, xq, ldq, d, X, ldg, y + o, ldy, 1);
        }
        return;
    }
    const int64_t ob = nx_rows_per_block(wrow);
    for (int64_t b0 = o0; b0 < o1; b0 += ob) {
        const int64_t b1 = b0 + ob < o1 ? b0 + ob : o1;
        for (int64_t t = 0; t < T; t += 4) {
            const int tt = T - t < 4 ? (int)(T - t) : 4;
            const int R = I8_R(tt);
            for (int64_t o = b0; o < b1;) {
                const int r = o + R <= b1 ? R : 1;
                i8_at(&a, W, wrow, srow, o);
                if (t == 0) nx_side_hint(side, r);
                kern(r, tt, &a, xq + t * ldq, ldq, d + t * ldg, X + t * ldg, ldg, y + t * ldy + o, ldy, 1);
                o += r;
            }
        }
    }
}

int I8_FN(int8_rows)(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy, int64_t o0,
                      int64_t o1, nx_kscratch *s) {
    if (!I8_FN(int8_takes)(W)) return 0;
    i8_scratch *st = (i8_scratch *)(void *)s->vnni;
    i8_kern *kern = W->bits == 4 ? kern_i8q4 : W->bits == 3 ? kern_i8q3 : kern_i8q2;
    const int64_t in = W->in, ng = in / W->group;
    int64_t tc = (int64_t)I8_XQ_BYTES / in; /* input rows per staging */
    if (tc > I8_GROUPS / ng) tc = I8_GROUPS / ng;
    for (int64_t c0 = 0; c0 < T; c0 += tc) {
        const int64_t c1 = c0 + tc < T ? c0 + tc : T;
        for (int64_t t = c0; t < c1; t++)
            quantize_row(x + t * ldx, in, W->group, W->bits, st->xq + (t - c0) * in, st->dg + (t - c0) * ng,
                         st->Xg + (t - c0) * ng);
        i8_rows(kern, W, c1 - c0, st->xq, in, st->dg, st->Xg, ng, y + c0 * ldy, ldy, o0, o1, &s->side);
    }
    return 1;
}
