/* Quantizer tests: packing against the spec's reference words (docs/design.md §5.3), the MLX group
 * rule (error ≤ scale/2, the larger-magnitude extreme exact, degenerate groups), float stores
 * with round-to-nearest-even, and agreement with the kernels' reading of the packed result. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "io/quantize.h"
#include "kernels/kernels.h"

static const int BITS[] = {2, 3, 4, 5, 6, 8};
static const int GROUPS[] = {32, 64, 128};
static const nx_dtype SDT[] = {NX_DTYPE_F32, NX_DTYPE_BF16, NX_DTYPE_F16};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rnd_unit(void) { return (float)(rnd() & 0xffffff) / 8388608.0f - 1.0f; } /* [-1,1) */

static float bf16_round(float f) {
    uint32_t u = (uint32_t)nx_f32_to_bf16(f) << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

static float load_s(nx_dtype dt, const void *p, int64_t i) {
    float f;
    nx_to_f32(dt, (const uint8_t *)p + (size_t)i * nx_dtype_size(dt), &f, 1);
    return f;
}

/* Rows of several characters: uniform, one large spike, constant, all zero, positive only. */
static void fill_row(float *w, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case 0: w[i] = rnd_unit() * 0.05f; break;
        case 1: w[i] = (i % 37 == 5) ? 3.0f : rnd_unit() * 0.01f; break;
        case 2: w[i] = -0.25f; break;
        case 3: w[i] = 0.0f; break;
        default: w[i] = 1.0f + rnd_unit() * 0.5f; break;
        }
    }
}

/* ------------------------------------------------------------------ packing */

static void test_reference_words(void **state) {
    (void)state;
    static const struct {
        int bits;
        uint32_t w[8];
    } ref[] = {
        {2, {0xe4e4e4e4, 0xe4e4e4e4}},
        {3, {0x88fac688, 0xc688fac6, 0xfac688fa}},
        {4, {0x76543210, 0xfedcba98, 0x76543210, 0xfedcba98}},
        {5, {0x8a418820, 0xc5a92839, 0xca307b9a, 0x38bdab49, 0xffbbcdeb}},
        {6, {0x440c2040, 0xa2481c61, 0x3ce34c2c, 0x544d2450, 0xa6585d65, 0x7de75c6d}},
        {8, {0x03020100, 0x07060504, 0x0b0a0908, 0x0f0e0d0c, 0x13121110, 0x17161514, 0x1b1a1918,
             0x1f1e1d1c}},
    };
    for (size_t k = 0; k < sizeof ref / sizeof *ref; k++) {
        int b = ref[k].bits;
        uint8_t q[32];
        uint32_t out[8];
        for (int i = 0; i < 32; i++) q[i] = (uint8_t)(i % (1 << b));
        nx_quant_pack(q, 32, b, out);
        for (int w = 0; w < b; w++) {
            if (out[w] != ref[k].w[w]) fprintf(stderr, "bits %d word %d: %08x != %08x\n", b, w, out[w], ref[k].w[w]);
            assert_int_equal(out[w], ref[k].w[w]);
        }
        for (int i = 0; i < 32; i++) assert_int_equal(nx_quant_unpack(out, i, b), q[i]);
    }
}

static void test_pack_roundtrip(void **state) {
    (void)state;
    for (size_t bi = 0; bi < 6; bi++) {
        int b = BITS[bi];
        uint8_t q[256];
        uint32_t out[64];
        for (int i = 0; i < 256; i++) q[i] = (uint8_t)(rnd() & ((1u << b) - 1u));
        nx_quant_pack(q, 256, b, out);
        for (int i = 0; i < 256; i++) assert_int_equal(nx_quant_unpack(out, i, b), q[i]);
    }
}

/* ------------------------------------------------------------------ float stores */

static void test_float_rounding(void **state) {
    (void)state;
    /* every finite half survives f16 → f32 → f16 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN */
        uint16_t hv = (uint16_t)h;
        float f = load_s(NX_DTYPE_F16, &hv, 0);
        assert_int_equal(nx_f32_to_f16(f), hv);
    }
    /* ties to even, overflow, subnormal ties */
    assert_int_equal(nx_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);         /* tie → even (down) */
    assert_int_equal(nx_f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);         /* tie → even (up) */
    assert_int_equal(nx_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(nx_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(nx_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);             /* tie → 0 */
    assert_int_equal(nx_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);             /* 1.5 units → 2 */
    assert_int_equal(nx_f32_to_f16(-ldexpf(1.0f, -14)), 0x8400);
    assert_int_equal(nx_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);      /* tie → even */
    assert_int_equal(nx_f32_to_bf16(1.0f + ldexpf(3.0f, -8)), 0x3f82);
    assert_int_equal(nx_f32_to_bf16(-2.0f), 0xc000);
    assert_true((nx_f32_to_bf16(NAN) & 0x7f80) == 0x7f80 && (nx_f32_to_bf16(NAN) & 0x7f));
}

/* ------------------------------------------------------------------ the quantizer */

/* A hand-checked group: 0..31 at 4 bits. |max| wins, so scale = 31/−15 and bias = 31. */
static void test_known_group(void **state) {
    (void)state;
    float w[32];
    for (int i = 0; i < 32; i++) w[i] = (float)i;
    uint32_t q[4];
    float s, b;
    nx_quantize_row(w, 32, 4, 32, NX_DTYPE_F32, q, &s, &b);
    assert_true(s == 31.0f / -15.0f);
    assert_true(b == 31.0f);
    assert_int_equal(nx_quant_unpack(q, 31, 4), 0);
    assert_int_equal(nx_quant_unpack(q, 0, 4), 15);
    assert_int_equal(nx_quant_unpack(q, 16, 4), 7); /* (16 − 31)/−2.0667 = 7.26 */
    /* the other sign: |min| wins, positive scale, bias = min */
    for (int i = 0; i < 32; i++) w[i] = -(float)i;
    nx_quantize_row(w, 32, 4, 32, NX_DTYPE_F32, q, &s, &b);
    assert_true(s == -31.0f / -15.0f);
    assert_true(b == -31.0f);
    assert_int_equal(nx_quant_unpack(q, 31, 4), 0);
    assert_int_equal(nx_quant_unpack(q, 0, 4), 15);
}

/* Extremes of the group holding element i (for failure messages). */
static float mn_of(const float *w, int i, int g) {
    float m = INFINITY;
    for (int j = i / g * g; j < (i / g + 1) * g; j++) m = fminf(m, w[j]);
    return m;
}
static float mx_of(const float *w, int i, int g) {
    float m = -INFINITY;
    for (int j = i / g * g; j < (i / g + 1) * g; j++) m = fmaxf(m, w[j]);
    return m;
}

static void test_error_bound(void **state) {
    (void)state;
    enum { N = 256 };
    float w[N], d[N];
    uint32_t q[N];
    float sc[N / 32], bi[N / 32];
    for (size_t bi_ = 0; bi_ < 6; bi_++)
        for (size_t gi = 0; gi < 3; gi++)
            for (int kind = 0; kind < 5; kind++) {
                int b = BITS[bi_], g = GROUPS[gi];
                fill_row(w, N, kind);
                nx_quantize_row(w, N, b, g, NX_DTYPE_F32, q, sc, bi);
                nx_dequantize_row(q, sc, bi, NX_DTYPE_F32, N, b, g, d);
                for (int i = 0; i < N; i++) {
                    float s = fabsf(sc[i / g]);
                    float err = fabsf(w[i] - d[i]);
                    /* Half a step, plus f32 rounding of (w − bias)/scale and of s·q + b. The
                     * scale edge/q0 (which makes 0 and the larger-magnitude extreme exact) can
                     * end the grid up to one step short of the far extreme; values past the
                     * last code are clamped to it: still less than one step off. */
                    float tol = 0.5f * s * (1.0f + 1e-5f) + 4e-7f * fabsf(w[i]) + 1e-7f;
                    int code = nx_quant_unpack(q, i, b);
                    if (code == (1 << b) - 1) tol = s * (1.0f + 1e-5f) + 4e-7f * fabsf(w[i]) + 1e-7f;
                    if (err > tol)
                        fprintf(stderr, "bits %d group %d kind %d i %d: w %g deq %g scale %g bias %g code %d min %g max %g\n", b, g,
                                kind, i, (double)w[i], (double)d[i], (double)sc[i / g], (double)bi[i / g], code,
                                (double)mn_of(w, i, g), (double)mx_of(w, i, g));
                    assert_true(err <= tol);
                }
                /* codes within range, every group uses code 0 for its edge */
                for (int gr = 0; gr < N / g; gr++) {
                    int zero = 0;
                    for (int i = gr * g; i < (gr + 1) * g; i++) zero += nx_quant_unpack(q, i, b) == 0;
                    assert_true(zero > 0);
                }
            }
}

/* bf16 weights with bf16 scales/biases (a bf16 checkpoint): the larger-magnitude extreme of
 * every group comes back exactly, and the rest within half a step of the stored scale plus
 * the scale's own bf16 rounding. */
static void test_edge_exact_bf16(void **state) {
    (void)state;
    enum { N = 512 };
    float w[N], d[N];
    uint32_t q[N];
    uint16_t sc[N / 32], bi[N / 32];
    for (size_t bi_ = 0; bi_ < 6; bi_++)
        for (size_t gi = 0; gi < 3; gi++)
            for (int kind = 0; kind < 5; kind++) {
                int b = BITS[bi_], g = GROUPS[gi];
                fill_row(w, N, kind);
                for (int i = 0; i < N; i++) w[i] = bf16_round(w[i]);
                nx_quantize_row(w, N, b, g, NX_DTYPE_BF16, q, sc, bi);
                nx_dequantize_row(q, sc, bi, NX_DTYPE_BF16, N, b, g, d);
                for (int gr = 0; gr < N / g; gr++) {
                    float mn = INFINITY, mx = -INFINITY;
                    for (int i = gr * g; i < (gr + 1) * g; i++) {
                        mn = fminf(mn, w[i]);
                        mx = fmaxf(mx, w[i]);
                    }
                    float edge = fabsf(mn) > fabsf(mx) ? mn : mx;
                    float s = load_s(NX_DTYPE_BF16, sc, gr);
                    float range = (mx - mn) / (float)((1 << b) - 1);
                    for (int i = gr * g; i < (gr + 1) * g; i++) {
                        if (w[i] == edge && (edge != 0.0f || kind == 3)) assert_true(d[i] == edge);
                        float tol = 0.5f * fabsf(s) + (float)((1 << b) - 1) * fabsf(s) * 0.0079f + 1e-6f;
                        assert_true(fabsf(d[i] - w[i]) <= fmaxf(tol, range));
                    }
                }
            }
}

/* The kernels read the packed result exactly as the dequantization formula says, for every
 * width, group and scale dtype (rows of several groups, several rows). */
static void test_kernel_roundtrip(void **state) {
    (void)state;
    enum { ROWS = 5, IN = 384 };
    float w[ROWS * IN], got[IN], want[IN];
    uint32_t q[ROWS * IN / 4];
    uint8_t sc[ROWS * IN / 32 * 4], bi[ROWS * IN / 32 * 4];
    for (size_t bi_ = 0; bi_ < 6; bi_++)
        for (size_t gi = 0; gi < 3; gi++)
            for (size_t si = 0; si < 3; si++) {
                int b = BITS[bi_], g = GROUPS[gi];
                nx_dtype sd = SDT[si];
                size_t ss = nx_dtype_size(sd);
                for (int r = 0; r < ROWS; r++) fill_row(w + r * IN, IN, r);
                for (int r = 0; r < ROWS; r++)
                    nx_quantize_row(w + r * IN, IN, b, g, sd, q + r * IN * b / 32, sc + (size_t)r * (IN / g) * ss,
                                    bi + (size_t)r * (IN / g) * ss);
                nx_linear L = {.dtype = NX_DTYPE_U32, .out = ROWS, .in = IN, .w = q, .bits = b, .group = g,
                               .sdtype = sd, .scales = sc, .biases = bi};
                for (int r = 0; r < ROWS; r++) {
                    nx_linear_get_row(&L, r, got);
                    nx_dequantize_row(q + r * IN * b / 32, sc + (size_t)r * (IN / g) * ss,
                                      bi + (size_t)r * (IN / g) * ss, sd, IN, b, g, want);
                    assert_memory_equal(got, want, sizeof got);
                }
                /* and a matmul with a one-hot input picks the same column values (int16
                 * activations: their scales are powers of two, so the one-hot input is exact) */
                float x[IN] = {0}, y[ROWS];
                x[IN - 1] = 1.0f;
                L.x16 = true;
                nx_matmul(&L, x, IN, 1, y, ROWS, NULL);
                for (int r = 0; r < ROWS; r++) {
                    nx_linear_get_row(&L, r, got);
                    assert_true(fabsf(y[r] - got[IN - 1]) <= 1e-6f * fabsf(got[IN - 1]) + 1e-30f);
                }
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_words), cmocka_unit_test(test_pack_roundtrip),
        cmocka_unit_test(test_float_rounding),  cmocka_unit_test(test_known_group),
        cmocka_unit_test(test_error_bound),     cmocka_unit_test(test_edge_exact_bf16),
        cmocka_unit_test(test_kernel_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
