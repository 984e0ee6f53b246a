/* Helpers shared by the x86 SIMD kernel files (avx2.c and the AVX-512 files, all compiled with
 * at least AVX2, FMA and F16C; never include this from a baseline file). */
#ifndef NX_KERNELS_X86_COMMON_H
#define NX_KERNELS_X86_COMMON_H

#include <immintrin.h>

#include "kernels/kernels_internal.h"

#define AI static inline __attribute__((always_inline))

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
