/* Shared between the kernel files and the dispatcher: the per-ISA function table, scalar
 * half-precision conversions, and the MLX affine bit-stream decode that every ISA (and the
 * tests) agree on. Not part of the engine's API. */
#ifndef NX_KERNELS_INTERNAL_H
#define NX_KERNELS_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

/* A thread's side prefetch (nx_span): spans as line-aligned [p, end), the current one and the
 * next line's address. */
typedef struct nx_side_pf {
    uintptr_t p[NX_SIDE_SPANS], end[NX_SIDE_SPANS];
    int n, i;
    uintptr_t at;
} nx_side_pf;

/* Bytes of the integer kernels' staging (avx512_vnni.c, which checks its layout fits). */
#define NX_VNNI_SCRATCH_BYTES (464u * 1024u)

struct nx_kscratch {
    nx_side_pf side;
    _Alignas(64) unsigned char vnni[NX_VNNI_SCRATCH_BYTES];
};
_Static_assert(sizeof(struct nx_kscratch) <= NX_POOL_SCRATCH_BYTES, "kernel scratch exceeds the pool's");

/* Sets s's side spans (n 0: none). */
void nx_side_set(nx_side_pf *s, const nx_span *spans, int n);

/* One ISA's implementations. matmul_rows computes rows [o0, o1) of y for all T; it must give
 * each output element the same accumulation order whatever T, o0, o1 are (batch and thread
 * invariance). It returns 0 when it declines the shape (the caller then uses the reference,
 * which is also invariant because the decision depends on W only). `next` (may be NULL) is
 * only a prefetch hint (nx_matmul_rows_then); s is the calling thread's scratch (never NULL).
 * Every entry of the reference table is set; a NULL entry of another table means the
 * reference's. */
typedef struct nx_kernel_table {
    const char *name;
    int (*matmul_rows)(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y,
                       int64_t ldy, int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s);
    /* nx_matmul_blocks, each output the bits matmul_rows gives its block alone; 0 when it
     * declines (the caller then makes those calls; NULL: always) */
    int (*matmul_blocks)(const nx_blocks *B, int64_t k0, int64_t k1, const nx_rows *next, nx_kscratch *s);
    void (*to_f32)(nx_dtype t, const void *src, float *dst, int64_t n);
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*axpy_f32)(float a, const float *x, float *y, int64_t n);
    void (*attn_scores)(const float *q, int64_t g, const void *K, nx_dtype kvt, int64_t stride, int64_t n,
                        int64_t hd, float scale, float *out, int64_t ldo);
    void (*attn_accum)(const float *w, int64_t ldw, int64_t g, const void *V, nx_dtype kvt, int64_t stride,
                       int64_t n, int64_t hd, float *o);
    float (*exp_shift_f32)(float *x, int64_t n, float *mx); /* nx_exp_shift_f32, n >= 1 */
    void (*swiglu_f32)(float *g, const float *u, int64_t n);
    void (*rmsnorm_f32)(const float *x, const float *w, float eps, int64_t n, float *out);
    int64_t (*argmax_f32)(float *x, int64_t n, float *max);
    double (*exp_weights)(const float *x, int64_t n, float m, double inv_t, double *w);
    void (*delta_rule_f32)(const float *src, float *dst, int64_t dk, int64_t dv, const float *k, const float *v,
                           float decay, float beta, const float *q, float *o);
} nx_kernel_table;


extern const nx_kernel_table nx_kernels_ref;
extern const nx_kernel_table nx_kernels_avx2;
extern const nx_kernel_table nx_kernels_avx2vnni; /* avx2 + AVX-VNNI: int8 kernels on vpdpbusd (ymm) */
extern const nx_kernel_table nx_kernels_avx512;
extern const nx_kernel_table nx_kernels_avx512vnni; /* avx512 + VNNI (int8/int16) for 2/4/8-bit weights */
extern const nx_kernel_table nx_kernels_avx512vbmi; /* the same + 3/5/6-bit weights (VBMI, GFNI) */
/* the three AVX-512 tables with ordinary weight prefetches (prefetcht0; avx512_common.h) */
extern const nx_kernel_table nx_kernels_avx512_t0, nx_kernels_avx512vnni_t0, nx_kernels_avx512vbmi_t0;
extern const nx_kernel_table nx_kernels_neon;       /* AArch64 Advanced SIMD */
extern const nx_kernel_table nx_kernels_neondot;    /* + int8 activations on sdot (FEAT_DotProd) */
extern const nx_kernel_table nx_kernels_neoni8mm;   /* + smmla for pairs of rows (FEAT_I8MM) */

/* nx_rmsnorm_f32's scale r from the 8 partial sums of squares of x[0..i) (element j in sum
 * j mod 8): the tail x[i..n) goes into sum 0, then the fixed tree. Every ISA ends here, so the
 * order is written once. */
static inline float nx_rmsnorm_scale(double part[8], const float *x, int64_t i, int64_t n, float eps) {
    for (; i < n; i++) part[0] += (double)x[i] * x[i];
    const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    return (float)(1.0 / sqrt(ss / (double)n + eps));
}

/* The next `lines` lines of s's spans (kernels call it per register block, a line per row). */
static inline void nx_side_hint(nx_side_pf *s, int lines) {
    if (__builtin_expect(s->i >= s->n, 1)) return;
    for (int k = 0; k < lines; k++) {
        __builtin_prefetch((const void *)s->at, 0, 3);
        s->at += 64;
        if (s->at >= s->end[s->i]) {
            if (++s->i >= s->n) return;
            s->at = s->p[s->i];
        }
    }
}


/* The AVX2 int8-activation kernels (avx2_int8.c; the avx2 and avx512 tables' 2-, 3- and 4-bit
 * weights; avx2_vnni.c, the same on AVX-VNNI for the avx2vnni table): whether they take W
 * (2/3/4-bit, groups a multiple of 64, not x16), and nx_kernel_table's matmul_rows on them (0
 * when they decline). */
int nx_avx2_int8_takes(const nx_linear *W);
int nx_avx2_int8_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy, int64_t o0,
                      int64_t o1, nx_kscratch *s);
int nx_avxvnni_int8_takes(const nx_linear *W);
int nx_avxvnni_int8_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy,
                         int64_t o0, int64_t o1, nx_kscratch *s);

/* The int8 rounding of one weight group of an input row, the rule every integer kernel shares
 * (kernels.h, Activation precision): d = max|x|/127, each element within 1/254 of the largest;
 * below 2^-100, where 127/max|x| could overflow, a power of two putting max|x|/d in [64, 128).
 * A group with a NaN or infinity (amax, or its sum X) gets d = NaN, so the outputs it touches
 * are NaN. Sets d and the inverse inv that scales the elements (both 0 for a zero group). */
static inline void nx_act8_scale(float amax, float X, float *d, float *inv) {
    *d = *inv = 0.0f;
    if (!isfinite(X) || !isfinite(amax)) {
        *d = NAN;
    } else if (amax >= 0x1p-100f) {
        *inv = 127.0f / amax;
        *d = amax / 127.0f;
    } else if (amax > 0.0f) {
        int e;
        frexpf(amax, &e); /* amax < 2^e <= 2·amax */
        const int k = 7 - e > 126 ? 126 : 7 - e;
        *inv = ldexpf(1.0f, k);
        *d = ldexpf(1.0f, -k);
    }
}

/* The reference dequantization of row r of a quantized W into out[in] (also used by
 * nx_linear_get_row on every ISA: embedding lookups are not hot). */
void nx_ref_quant_row(const nx_linear *W, int64_t r, float *out);

/* Weight rows per cache block for the SIMD matmul drivers: as many whole register blocks of 4
 * rows as fit in 256 KB (kept hot in L2 while all T input rows pass over them), at least 4. */
static inline int64_t nx_rows_per_block(size_t row_bytes) {
    int64_t n = (int64_t)((256u * 1024u) / (row_bytes ? row_bytes : 1));
    n &= ~(int64_t)3;
    return n < 4 ? 4 : n;
}

/* ------------------------------------------------------------------ scalar conversions */

static inline float nx_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE half → float, exact for every input (subnormals, inf, NaN). */
static inline float nx_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalize */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t nx_load_u16(const void *p, int64_t i) {
    uint16_t v;
    memcpy(&v, (const uint8_t *)p + 2 * i, 2);
    return v;
}

/* Element i of a stored F32/F16/BF16 vector (unaligned-safe). */
static inline float nx_load_scalar(nx_dtype t, const void *p, int64_t i) {
    switch (t) {
    case NX_DTYPE_F16: return nx_f16_to_f32(nx_load_u16(p, i));
    case NX_DTYPE_BF16: return nx_bf16_to_f32(nx_load_u16(p, i));
    default: {
        float f;
        memcpy(&f, (const uint8_t *)p + 4 * i, 4);
        return f;
    }
    }
}

/* q of element i of a packed row: the row is a little-endian bit stream, element i at bits
 * [i·b, (i+1)·b) (docs/design.md §5.3). Reads byte-wise so rows may be unaligned and the last
 * element never reads past the row. */
static inline uint32_t nx_quant_get(const uint8_t *row, int64_t i, int bits) {
    int64_t bitpos = i * bits;
    const uint8_t *p = row + (bitpos >> 3);
    int off = (int)(bitpos & 7);
    int nbytes = (off + bits + 7) >> 3; /* at most 2 for bits <= 8 */
    uint32_t v = p[0];
    if (nbytes > 1) v |= (uint32_t)p[1] << 8;
    return (v >> off) & ((1u << bits) - 1u);
}

/* Whether a quantized weight has a shape every kernel can run: whole 32-element blocks per
 * group (so groups never straddle words) and a supported bit width. */
static inline int nx_quant_shape_ok(const nx_linear *W) {
    int b = W->bits, g = W->group;
    if (!(b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8)) return 0;
    if (g <= 0 || g % 32 != 0) return 0;
    return W->in % g == 0;
}

#endif
