/* Helpers shared by the x86 SIMD kernel files (avx2.c and the AVX-512 files, all compiled with
 * at least AVX2, FMA and F16C; never include this from a baseline file). */
#ifndef NX_KERNELS_X86_COMMON_H
#define NX_KERNELS_X86_COMMON_H

#include <immintrin.h>

#include "kernels/kernels_internal.h"

#define AI static inline __attribute__((always_inline))

/* Cached rows the attention helpers take a block at a time (~16 KB of rows of hd elements of
 * es bytes): every pass over the block (query heads by fours, a slice of a row's elements at a
 * time) finds its rows in L1 or L2, so each row comes from memory once rather than once per
 * pass (twice or four times for 8 heads of 128 on AVX-512, more on AVX2). */
AI int64_t attn_block_rows(size_t es, int64_t hd) {
    const int64_t r = 16384 / ((int64_t)es * hd);
    return r > 8 ? r : 8;
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
