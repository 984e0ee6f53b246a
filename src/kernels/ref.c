/* Scalar reference kernels: the plainest correct version of every kernel, always built. They
 * are the oracle the SIMD kernels are tested against, the NX_ISA=ref path, and the fallback
 * for shapes a SIMD kernel declines. Each dot product is a left-to-right float sum. */
#include "kernels/kernels_internal.h"

/* W[o, i] as f32, from any stored dtype. */
static float ref_weight(const nx_linear *W, int64_t o, int64_t i) {
    if (W->dtype == NX_DTYPE_U32) {
        int64_t ngroups = W->in / W->group;
        const uint8_t *row = (const uint8_t *)W->w + (size_t)o * (size_t)(W->in * W->bits / 8);
        int64_t g = i / W->group;
        float s = nx_load_scalar(W->sdtype, W->scales, o * ngroups + g);
        float b = W->biases ? nx_load_scalar(W->sdtype, W->biases, o * ngroups + g) : 0.0f;
        return s * (float)nx_quant_get(row, i, W->bits) + b;
    }
    return nx_load_scalar(W->dtype, W->w, o * W->in + i);
}

void nx_ref_quant_row(const nx_linear *W, int64_t r, float *out) {
    for (int64_t i = 0; i < W->in; i++) out[i] = ref_weight(W, r, i);
}

static int ref_matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y,
                           int64_t ldy, int64_t o0, int64_t o1, const nx_rows *next) {
    (void)next;
    for (int64_t o = o0; o < o1; o++) {
        for (int64_t t = 0; t < T; t++) {
            const float *xt = x + t * ldx;
            float acc = 0.0f;
            for (int64_t i = 0; i < W->in; i++) acc += ref_weight(W, o, i) * xt[i];
            y[t * ldy + o] = acc;
        }
    }
    return 1;
}

static void ref_to_f32(nx_dtype t, const void *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = nx_load_scalar(t, src, i);
}

static float ref_dot_f32(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void ref_axpy_f32(float a, const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

const nx_kernel_table nx_kernels_ref = {
    .name = "ref",
    .matmul_rows = ref_matmul_rows,
    .to_f32 = ref_to_f32,
    .dot_f32 = ref_dot_f32,
    .axpy_f32 = ref_axpy_f32,
};
