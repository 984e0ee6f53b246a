/* Table-lookup (T-MAC style) matrix-vector products against the engine's int8 dot-product
 * kernels, one core, weights held in cache: the compute rate each design reaches, in GB/s of
 * MLX-packed weights consumed, for 2- and 4-bit weights at 1 and 2 input rows.
 *
 * The lookup design: weights repacked into bit planes, 16 rows by 16 rows; for each group of 4
 * activations a table of the 16 sums of its subsets; each plane's 4-bit index picks one sum per
 * (row, group) with vpshufb, 64 at a time, and the planes are added with weights 2^k. Exact
 * here, as the engine's numerics require: the int8 activations' subset sums reach ±508, so each
 * table is kept as a low-byte and a high-byte table and every lookup is two vpshufb and an
 * interleave. The result is checked against the integer sums before it is timed.
 *   lut_rate [--out 512] [--in 1024] [--ms 300] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "kernels/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), noinline))

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

typedef struct prob {
    int64_t out, in;
    int bits;
    uint8_t *q;      /* q[r·in + i], the weights as integers */
    uint32_t *mlx;   /* the same, MLX-packed */
    uint8_t *planes; /* the lookup layout (pack_planes) */
    float *scales, *biases; /* [out, in/64] */
    int8_t *xq[2];          /* two input rows, int8 */
    float *d[2], *X[2];     /* their group scales and sums */
} prob;

/* Rows by 16 (rb), elements by 16 (chunk c: 4 groups of 4), planes by pairs: 64 bytes, byte
 * 16j + r holding row r's index of group j, plane 2p in the low nibble, 2p + 1 in the high. */
static void pack_planes(prob *P) {
    const int64_t nc = P->in / 16, npp = P->bits / 2;
    for (int64_t rb = 0; rb < P->out / 16; rb++)
        for (int64_t c = 0; c < nc; c++)
            for (int64_t p = 0; p < npp; p++) {
                uint8_t *o = P->planes + ((rb * nc + c) * npp + p) * 64;
                for (int j = 0; j < 4; j++)
                    for (int r = 0; r < 16; r++) {
                        const uint8_t *qr = P->q + (rb * 16 + r) * P->in + c * 16 + 4 * j;
                        uint8_t lo = 0, hi = 0;
                        for (int e = 0; e < 4; e++) {
                            lo |= (uint8_t)(((qr[e] >> (2 * p)) & 1) << e);
                            hi |= (uint8_t)(((qr[e] >> (2 * p + 1)) & 1) << e);
                        }
                        o[16 * j + r] = (uint8_t)(lo | hi << 4);
                    }
            }
}

/* The low- and high-byte tables of one input row: per 16 elements, 64 bytes each (lane j: the 16
 * subset sums of group j). */
static void make_tables(const int8_t *x, int64_t in, uint8_t *lo, uint8_t *hi) {
    for (int64_t a = 0; a < in / 4; a++)
        for (int idx = 0; idx < 16; idx++) {
            int s = 0;
            for (int e = 0; e < 4; e++)
                if (idx >> e & 1) s += x[4 * a + e];
            const int64_t at = (a / 4) * 64 + (a % 4) * 16 + idx;
            lo[at] = (uint8_t)(s & 0xff);
            hi[at] = (uint8_t)((s >> 8) & 0xff);
        }
}

/* One lookup of plane indices v (64 lanes) in tables tl/th: the sums as words, rows 0-7 of each
 * group in *a, rows 8-15 in *b. */
#define LOOKUP(v, tl, th, a, b)                                                                    \
    do {                                                                                           \
        const __m512i l_ = _mm512_shuffle_epi8(tl, v), h_ = _mm512_shuffle_epi8(th, v);            \
        a = _mm512_unpacklo_epi8(l_, h_);                                                          \
        b = _mm512_unpackhi_epi8(l_, h_);                                                          \
    } while (0)

/* The 16 rows' int32 sums of S (words: lane j, rows 0-7) and S' (rows 8-15). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) static inline __m512i rows16(__m512i S, __m512i S2) {
    const __m512i u = _mm512_add_epi32(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(S)),
                                       _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(S, 1)));
    const __m512i w = _mm512_add_epi32(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(S2)),
                                       _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(S2, 1)));
    const __m512i ia = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i ib = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    return _mm512_add_epi32(_mm512_permutex2var_epi32(u, ia, w), _mm512_permutex2var_epi32(u, ib, w));
}

/* y[t·out + r] for T (1 or 2) input rows, groups of 64, BITS planes: the lookup kernel. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) static inline void lut_matvec(const int BITS, const int T, const prob *P, const uint8_t *tl, const uint8_t *th,
                              float *y) {
    const int64_t nc = P->in / 16, ng = P->in / 64, npp = BITS / 2;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int64_t rb = 0; rb < P->out / 16; rb++) {
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t g = 0; g < ng; g++) {
            __m512i S[2][4][2];
            #pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                #pragma GCC unroll 4
                for (int k = 0; k < BITS; k++) S[t][k][0] = S[t][k][1] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int64_t c = 4 * g; c < 4 * g + 4; c++) {
                const uint8_t *w = P->planes + (rb * nc + c) * npp * 64;
                __m512i v[4];
                #pragma GCC unroll 4
                for (int p = 0; p < npp; p++) {
                    const __m512i b = _mm512_loadu_si512(w + 64 * p);
                    v[2 * p] = _mm512_and_si512(b, m4);
                    v[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
                }
                #pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m512i TL = _mm512_loadu_si512(tl + t * P->in * 4 + c * 64);
                    const __m512i TH = _mm512_loadu_si512(th + t * P->in * 4 + c * 64);
                    #pragma GCC unroll 4
                    for (int k = 0; k < BITS; k++) {
                        __m512i a, b;
                        LOOKUP(v[k], TL, TH, a, b);
                        S[t][k][0] = _mm512_add_epi16(S[t][k][0], a);
                        S[t][k][1] = _mm512_add_epi16(S[t][k][1], b);
                    }
                }
            }
            /* the 16 rows' scales and biases of group g (a repacked layout would hold them together) */
            const __m512i gi = _mm512_add_epi32(_mm512_set1_epi32((int)(rb * 16 * ng + g)),
                                                _mm512_mullo_epi32(_mm512_set1_epi32((int)ng),
                                                                   _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                                     11, 12, 13, 14, 15)));
            const __m512 sc = _mm512_i32gather_ps(gi, P->scales, 4), bi = _mm512_i32gather_ps(gi, P->biases, 4);
            #pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m512i s0 = S[t][0][0], s1 = S[t][0][1];
                #pragma GCC unroll 4
                for (int k = 1; k < BITS; k++) {
                    s0 = _mm512_add_epi16(s0, _mm512_slli_epi16(S[t][k][0], k));
                    s1 = _mm512_add_epi16(s1, _mm512_slli_epi16(S[t][k][1], k));
                }
                const __m512 f = _mm512_cvtepi32_ps(rows16(s0, s1));
                acc[t] = _mm512_fmadd_ps(f, _mm512_mul_ps(sc, _mm512_set1_ps(P->d[t][g])), acc[t]);
                acc[t] = _mm512_fmadd_ps(bi, _mm512_set1_ps(P->X[t][g]), acc[t]);
            }
        }
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++) _mm512_storeu_ps(y + t * P->out + rb * 16, acc[t]);
    }
}

#define LUT_FN(B, TT)                                                                              \
    TARGET static void lut_##B##_##TT(const prob *P, const uint8_t *tl, const uint8_t *th, float *y) { \
        lut_matvec(B, TT, P, tl, th, y);                                                           \
    }
LUT_FN(2, 1)
LUT_FN(2, 2)
LUT_FN(4, 1)
LUT_FN(4, 2)

static void lut_run(const prob *P, int T, const uint8_t *tl, const uint8_t *th, float *y) {
    if (P->bits == 2) T == 1 ? lut_2_1(P, tl, th, y) : lut_2_2(P, tl, th, y);
    else T == 1 ? lut_4_1(P, tl, th, y) : lut_4_2(P, tl, th, y);
}

/* The exact result the lookups must give: per group s·d·Σq·x̂ + b·X. */
static double ref_out(const prob *P, int t, int64_t r) {
    const int64_t ng = P->in / 64;
    double y = 0;
    for (int64_t g = 0; g < ng; g++) {
        long s = 0;
        for (int64_t i = 64 * g; i < 64 * g + 64; i++) s += (long)P->q[r * P->in + i] * P->xq[t][i];
        y += (double)P->scales[r * ng + g] * P->d[t][g] * (double)s + (double)P->biases[r * ng + g] * P->X[t][g];
    }
    return y;
}

static void build(prob *P, int64_t out, int64_t in, int bits) {
    const int64_t ng = in / 64;
    P->out = out;
    P->in = in;
    P->bits = bits;
    P->q = malloc((size_t)(out * in));
    P->mlx = calloc((size_t)(out * in * bits / 32), 4);
    P->planes = aligned_alloc(64, (size_t)(out * in * bits / 8));
    P->scales = malloc(sizeof(float) * (size_t)(out * ng));
    P->biases = malloc(sizeof(float) * (size_t)(out * ng));
    for (int64_t i = 0; i < out * in; i++) {
        P->q[i] = (uint8_t)(rnd() & ((1u << bits) - 1));
        P->mlx[i * bits / 32] |= (uint32_t)P->q[i] << (i * bits % 32);
    }
    for (int64_t i = 0; i < out * ng; i++) {
        P->scales[i] = (float)(rnd() % 1000) / 1e4f + 0.01f;
        P->biases[i] = -(float)(rnd() % 1000) / 1e3f;
    }
    for (int t = 0; t < 2; t++) {
        P->xq[t] = malloc((size_t)in);
        P->d[t] = malloc(sizeof(float) * (size_t)ng);
        P->X[t] = malloc(sizeof(float) * (size_t)ng);
        for (int64_t i = 0; i < in; i++) P->xq[t][i] = (int8_t)((int)(rnd() % 255) - 127);
        for (int64_t g = 0; g < ng; g++) {
            P->d[t][g] = 0.01f;
            long s = 0;
            for (int64_t i = 64 * g; i < 64 * g + 64; i++) s += P->xq[t][i];
            P->X[t][g] = 0.01f * (float)s;
        }
    }
    pack_planes(P);
}

/* Best seconds per call of f over budget_ms. */
#define BEST_OF(budget_ms, call)                                                                   \
    ({                                                                                             \
        double best_ = 1e9, start_ = nx_now_s();                                                   \
        while ((nx_now_s() - start_) * 1e3 < (budget_ms)) {                                         \
            const double t0_ = nx_now_s();                                                         \
            for (int rep_ = 0; rep_ < 8; rep_++) call;                                             \
            const double dt_ = (nx_now_s() - t0_) / 8;                                             \
            if (dt_ < best_) best_ = dt_;                                                          \
        }                                                                                          \
        best_;                                                                                     \
    })

int main(int argc, char **argv) {
    int64_t out = 512, in = 1024;
    double budget_ms = 300;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--out")) out = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--in")) in = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--ms")) budget_ms = atof(argv[i + 1]);
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bw") || out % 16 || in % 64) {
        printf("lut_rate: needs AVX-512 BW, --out a multiple of 16 and --in of 64\n");
        return 0;
    }
    nx_kscratch *s = nx_kscratch_new();
    float *y = malloc(sizeof(float) * (size_t)(2 * out)), *x = malloc(sizeof(float) * (size_t)(2 * in));
    for (int64_t i = 0; i < 2 * in; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    for (int bits = 2; bits <= 4; bits += 2) {
        prob P;
        build(&P, out, in, bits);
        uint8_t *tl = aligned_alloc(64, (size_t)(8 * in)), *th = aligned_alloc(64, (size_t)(8 * in));
        for (int t = 0; t < 2; t++) make_tables(P.xq[t], in, tl + t * in * 4, th + t * in * 4);
        const nx_linear W = {.dtype = NX_DTYPE_U32, .out = out, .in = in, .w = P.mlx, .bits = bits, .group = 64,
                             .sdtype = NX_DTYPE_F32, .scales = P.scales, .biases = P.biases};
        const double bytes = (double)nx_linear_bytes(&W);
        for (int T = 1; T <= 2; T++) {
            lut_run(&P, T, tl, th, y);
            double err = 0;
            for (int t = 0; t < T; t++)
                for (int64_t r = 0; r < out; r++) {
                    const double e = y[t * out + r] - ref_out(&P, t, r);
                    err = e * e > err ? e * e : err;
                }
            /* tables are built per call: their cost belongs to the call */
            const double t_lut = BEST_OF(budget_ms, ({
                for (int t = 0; t < T; t++) make_tables(P.xq[t], in, tl + t * in * 4, th + t * in * 4);
                lut_run(&P, T, tl, th, y);
            }));
            const double t_lut_only = BEST_OF(budget_ms, lut_run(&P, T, tl, th, y));
            const double t_dot = BEST_OF(budget_ms, nx_matmul_rows(&W, x, in, T, y, out, 0, out, s));
            printf("lut_rate bits=%d T=%d out=%lld in=%lld isa=%s dot_gbs=%.1f lut_gbs=%.1f lut_no_tables_gbs=%.1f "
                   "lut_max_err=%.2g\n",
                   bits, T, (long long)out, (long long)in, nx_kernels_isa(), bytes / t_dot / 1e9, bytes / t_lut / 1e9,
                   bytes / t_lut_only / 1e9, err > 0 ? __builtin_sqrt(err) : 0.0);
        }
    }
    return 0;
}
#else
int main(void) {
    printf("lut_rate: x86-64 only\n");
    return 0;
}
#endif
