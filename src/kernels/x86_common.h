/* Helpers shared by the x86 SIMD kernel files (avx2.c and the AVX-512 files, all compiled with
 * at least AVX2, FMA and F16C; never include this from a baseline file). */
#ifndef NX_KERNELS_X86_COMMON_H
#define NX_KERNELS_X86_COMMON_H

#include <immintrin.h>

#include "kernels/kernels_internal.h"

#define AI static inline __attribute__((always_inline))

/* Cached rows are prefetched this many bytes ahead by the attention helpers (8 KB: 32 rows of
 * 64 f32 elements). The
 * hardware prefetchers pick up the cache's streams (one per kv head) too late to matter. 4-bit
 * model, 3000-token context, AR decode: 80-84 tok/s with 8 rows (2 KB) ahead, 88-92 with 8 KB,
 * no better at 16 or 32 KB. The first rows of each head are hinted by the caller before the
 * layer's projections (forward.c, kv_prefetch). */
#ifndef ATTN_PF_BYTES
#define ATTN_PF_BYTES 8192
#endif

/* The lines of the cached row `ahead` rows past p, if there is one (hd elements of es bytes at
 * row stride). */
AI void attn_prefetch_row(const void *base, size_t es, int64_t stride, int64_t p, int64_t ahead, int64_t n,
                          int64_t hd) {
    if (p + ahead >= n) return;
    const char *r = (const char *)base + (size_t)((p + ahead) * stride) * es;
    for (int64_t b = 0; b < hd * (int64_t)es; b += 64) _mm_prefetch(r + b, _MM_HINT_T0);
}

/* Rows ahead for ATTN_PF_BYTES at this row stride (at least one). */
AI int64_t attn_pf_rows(size_t es, int64_t stride) {
    const int64_t r = ATTN_PF_BYTES / ((int64_t)es * stride);
    return r > 0 ? r : 1;
}

/* Cached rows the attention helpers take a block at a time (~256 KB of rows, at least 8): every
 * pass over the block (query heads by fours, a slice of a row's elements at a time) finds its
 * rows in L2, so each row comes from memory once rather than once per pass, and the passes'
 * running sums are loaded and stored once per block. */
#ifndef ATTN_BLOCK_BYTES
#define ATTN_BLOCK_BYTES 131072
#endif
AI int64_t attn_block_rows(size_t es, int64_t hd) {
    const int64_t r = ATTN_BLOCK_BYTES / ((int64_t)es * hd);
    return r > 8 ? r : 8;
}

/* The fixed horizontal tree of 8 f32 lanes (the AVX2 kernels' end of every dot product). */
AI float hsum8(__m256 v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* The n < 8 floats from x, zeros after them; never reads past them. */
AI __m256 load_x8_tail(const float *x, int64_t n) {
    float buf[8] = {0};
    memcpy(buf, x, (size_t)n * 4);
    return _mm256_loadu_ps(buf);
}

/* Element i of a scale/bias vector stored as F16, BF16 or F32. */
AI float load_sc(nx_dtype dt, const uint8_t *p, int64_t i) {
    uint16_t h;
    switch (dt) {
    case NX_DTYPE_F16: memcpy(&h, p + 2 * i, 2); return _cvtsh_ss(h);
    case NX_DTYPE_BF16: memcpy(&h, p + 2 * i, 2); return nx_bf16_to_f32(h);
    default: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    }
}

#endif
