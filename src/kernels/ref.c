/* Scalar reference kernels: the plainest correct version of every kernel, always built, every
 * table entry set. They are the oracle the SIMD kernels are tested against, the NX_ISA=ref path,
 * the fallback for shapes a SIMD kernel declines, and the entries a SIMD table leaves NULL. Each
 * dot product is a left-to-right float sum. */
#include <math.h>

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
                           int64_t ldy, int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s) {
    (void)next;
    (void)s;
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

/* Block by block: the reference's nx_matmul_blocks. */
static int ref_matmul_blocks(const nx_blocks *B, int64_t k0, int64_t k1, const nx_rows *next, nx_kscratch *s) {
    (void)next;
    for (int64_t k = k0; k < k1; k++) {
        const nx_linear Wk = nx_linear_rows(B->W, k * B->rstride, B->rows);
        ref_matmul_rows(&Wk, B->x + k * B->xstep, B->ldx, B->T, B->y + k * B->ystep, B->ldy, 0, B->rows, NULL, s);
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

/* Cached row p of an attention call as f32: the row itself, or (f16) widened into buf. */
static const float *kv_row(const void *base, nx_dtype kvt, int64_t stride, int64_t p, int64_t hd, float *buf) {
    if (kvt != NX_DTYPE_F16) return (const float *)base + p * stride;
    ref_to_f32(NX_DTYPE_F16, (const uint16_t *)base + p * stride, buf, hd);
    return buf;
}

static void ref_attn_scores(const float *q, int64_t g, const void *K, nx_dtype kvt, int64_t stride, int64_t n,
                            int64_t hd, float scale, float *out, int64_t ldo) {
    float buf[NX_ATTN_MAX_HD];
    for (int64_t p = 0; p < n; p++) {
        const float *k = kv_row(K, kvt, stride, p, hd, buf);
        for (int64_t h = 0; h < g; h++) out[h * ldo + p] = ref_dot_f32(q + h * hd, k, hd) * scale;
    }
}

static void ref_attn_accum(const float *w, int64_t ldw, int64_t g, const void *V, nx_dtype kvt, int64_t stride,
                           int64_t n, int64_t hd, float *o) {
    float buf[NX_ATTN_MAX_HD];
    for (int64_t p = 0; p < n; p++) {
        const float *v = kv_row(V, kvt, stride, p, hd, buf);
        for (int64_t h = 0; h < g; h++) ref_axpy_f32(w[h * ldw + p], v, o + h * hd, hd);
    }
}

static float ref_exp_shift_f32(float *x, int64_t n, float *mx_out) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    *mx_out = mx;
    return sum;
}

static void ref_swiglu_f32(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * (u ? u[i] : 1.0f);
}

static void ref_rmsnorm_f32(const float *x, const float *w, float eps, int64_t n, float *out) {
    double part[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) part[l] += (double)x[i + l] * x[i + l];
    const float r = nx_rmsnorm_scale(part, x, i, n, eps);
    for (i = 0; i < n; i++) out[i] = x[i] * r * (w ? w[i] : 1.0f);
}

static int64_t ref_argmax_f32(float *x, int64_t n, float *max) {
    float m = -INFINITY;
    int64_t arg = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) x[i] = -INFINITY;
        if (x[i] > m) {
            m = x[i];
            arg = i;
        }
    }
    *max = m;
    return arg;
}

static double ref_exp_weights(const float *x, int64_t n, float m, double inv_t, double *w) {
    double z = 0.0;
    for (int64_t i = 0; i < n; i++) z += w[i] = exp(((double)x[i] - (double)m) * inv_t);
    return z;
}

static void ref_delta_rule_f32(const float *src, float *dst, int64_t dk, int64_t dv, const float *k, const float *v,
                               float decay, float beta, const float *q, float *o) {
    float kv[NX_ATTN_MAX_HD] = {0}, d[NX_ATTN_MAX_HD];
    for (int64_t i = 0; i < dk; i++)
        for (int64_t j = 0; j < dv; j++) {
            const float t = src[i * dv + j] * decay;
            dst[i * dv + j] = t;
            kv[j] += t * k[i];
        }
    for (int64_t j = 0; j < dv; j++) d[j] = beta * (v[j] - kv[j]);
    if (o)
        for (int64_t j = 0; j < dv; j++) o[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++)
        for (int64_t j = 0; j < dv; j++) {
            const float t = dst[i * dv + j] + k[i] * d[j];
            dst[i * dv + j] = t;
            if (o) o[j] += t * q[i];
        }
}

const nx_kernel_table nx_kernels_ref = {
    .name = "ref",
    .matmul_rows = ref_matmul_rows,
    .matmul_blocks = ref_matmul_blocks,
    .to_f32 = ref_to_f32,
    .dot_f32 = ref_dot_f32,
    .axpy_f32 = ref_axpy_f32,
    .attn_scores = ref_attn_scores,
    .attn_accum = ref_attn_accum,
    .exp_shift_f32 = ref_exp_shift_f32,
    .swiglu_f32 = ref_swiglu_f32,
    .rmsnorm_f32 = ref_rmsnorm_f32,
    .argmax_f32 = ref_argmax_f32,
    .exp_weights = ref_exp_weights,
    .delta_rule_f32 = ref_delta_rule_f32,
};
