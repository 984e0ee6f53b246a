/* Kernel tests: the MLX bit packing against the spec's reference words, every SIMD matmul
 * against the scalar reference on awkward shapes for every dtype / bit width / group / scale
 * dtype, and the numerics contract (bit-identical rows whatever T, row split, thread count or
 * pointer alignment). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/pool.h"
#include "kernels/kernels_internal.h"
#include "io/quantize.h"

/* ------------------------------------------------------------------ test data */

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rnd_unit(void) { return (float)(rnd() & 0xffffff) / 8388608.0f - 1.0f; } /* [-1,1) */

/* Random finite half / bfloat16 bit patterns of magnitude about 2^-5 .. 2^2. */
static uint16_t rnd_f16(void) {
    return (uint16_t)((rnd() & 1) << 15 | (uint32_t)(10 + rnd() % 8) << 10 | (rnd() & 0x3ff));
}
static uint16_t rnd_bf16(void) {
    return (uint16_t)((rnd() & 1) << 15 | (uint32_t)(122 + rnd() % 8) << 7 | (rnd() & 0x7f));
}

static void fill_float(nx_dtype dt, void *dst, int64_t n, float mag) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == NX_DTYPE_F32) {
            float f = rnd_unit() * mag;
            memcpy((uint8_t *)dst + 4 * i, &f, 4);
        } else {
            uint16_t h = dt == NX_DTYPE_F16 ? rnd_f16() : rnd_bf16();
            memcpy((uint8_t *)dst + 2 * i, &h, 2);
        }
    }
}

/* MLX's CPU packer, transcribed independently of the engine's decoder: values are packed
 * `pack` at a time into a uint64 (w << k·bits) whose low `bytes` bytes are emitted. */
static void mlx_pack_row(const uint8_t *q, int64_t n, int bits, uint8_t *out) {
    int pack = (bits == 3 || bits == 5) ? 8 : bits == 6 ? 4 : 32 / bits;
    int bytes = (bits == 3 || bits == 6) ? 3 : bits == 5 ? 5 : 4;
    for (int64_t i = 0; i < n / pack; i++) {
        uint64_t v = 0;
        for (int k = 0; k < pack; k++) v |= (uint64_t)q[i * pack + k] << (k * bits);
        for (int k = 0; k < bytes; k++) out[i * bytes + k] = (uint8_t)(v >> (8 * k));
    }
}

/* A weight with its own storage; `misalign` shifts every array off its allocation. */
typedef struct tw {
    nx_linear L;
    uint8_t *wbuf, *sbuf, *bbuf;
    uint8_t *q; /* quantized: the raw q values [out, in] */
} tw;

static size_t es(nx_dtype t) { return t == NX_DTYPE_F32 ? 4 : 2; }

static void tw_make(tw *t, nx_dtype dt, int64_t out, int64_t in, int bits, int group, nx_dtype sdt,
                    int misalign) {
    memset(t, 0, sizeof *t);
    t->L.dtype = dt;
    t->L.out = out;
    t->L.in = in;
    if (dt == NX_DTYPE_U32) {
        t->L.bits = bits;
        t->L.group = group;
        t->L.sdtype = sdt;
        size_t rowb = (size_t)in * bits / 8, ns = (size_t)(out * (in / group));
        t->wbuf = malloc(rowb * out + 4);
        t->sbuf = malloc(ns * es(sdt) + 4);
        t->bbuf = malloc(ns * es(sdt) + 4);
        t->q = malloc((size_t)(out * in));
        assert_non_null(t->wbuf);
        assert_non_null(t->q);
        for (int64_t i = 0; i < out * in; i++) t->q[i] = (uint8_t)(rnd() & ((1u << bits) - 1));
        for (int64_t r = 0; r < out; r++)
            mlx_pack_row(t->q + r * in, in, bits, t->wbuf + misalign + r * rowb);
        fill_float(sdt, t->sbuf + misalign, (int64_t)ns, 0.05f);
        fill_float(sdt, t->bbuf + misalign, (int64_t)ns, 0.5f);
        if (sdt != NX_DTYPE_F32) { /* keep half scales small: value·q stays O(1) */
            for (size_t i = 0; i < ns; i++) {
                uint8_t *p = t->sbuf + misalign + 2 * i;
                uint16_t h;
                memcpy(&h, p, 2);
                h = sdt == NX_DTYPE_F16 ? (uint16_t)((h & 0x83ff) | (uint32_t)(8 + (h >> 10) % 4) << 10)
                                        : (uint16_t)((h & 0x807f) | (uint32_t)(118 + (h >> 7) % 4) << 7);
                memcpy(p, &h, 2);
            }
        }
        t->L.w = t->wbuf + misalign;
        t->L.scales = t->sbuf + misalign;
        t->L.biases = t->bbuf + misalign;
    } else {
        t->wbuf = malloc((size_t)(out * in) * es(dt) + 4);
        assert_non_null(t->wbuf);
        fill_float(dt, t->wbuf + misalign, out * in, 1.0f);
        t->L.w = t->wbuf + misalign;
    }
}

/* A copy of t's data at another misalignment (same values). */
static void tw_copy(tw *d, const tw *s, int misalign) {
    *d = *s;
    const nx_linear *L = &s->L;
    size_t wb = nx_linear_bytes(L);
    if (L->dtype == NX_DTYPE_U32) {
        size_t ns = (size_t)(L->out * (L->in / L->group)) * es(L->sdtype);
        wb = (size_t)L->out * (size_t)L->in * L->bits / 8;
        d->sbuf = malloc(ns + 4);
        d->bbuf = malloc(ns + 4);
        memcpy(d->sbuf + misalign, L->scales, ns);
        memcpy(d->bbuf + misalign, L->biases, ns);
        d->L.scales = d->sbuf + misalign;
        d->L.biases = d->bbuf + misalign;
        d->q = NULL;
    }
    d->wbuf = malloc(wb + 4);
    memcpy(d->wbuf + misalign, L->w, wb);
    d->L.w = d->wbuf + misalign;
}

static void tw_free(tw *t) {
    free(t->wbuf);
    free(t->sbuf);
    free(t->bbuf);
    free(t->q);
}

static float *rnd_vec(int64_t n) {
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = rnd_unit();
    return v;
}

/* Kernel variants this CPU can run, ref first: an ISA name (quantized weights marked x16, so
 * the integer kernels run on int16 activations), or "ISA+act8" for the same ISA on weights
 * without the mark (int8 activations where the shape allows). */
static const char *isas[24];
static int n_isas;
static const char *default_isa;

static int is_act8(const char *variant) { return strstr(variant, "+act8") != NULL; }

/* The variant's name without a "-t0" (a table's twin with other prefetch hints, the same
 * kernels) into buf. */
static const char *kernels_of(const char *variant, char buf[40]) {
    const char *dash = strstr(variant, "-t0");
    if (!dash) return variant;
    snprintf(buf, 40, "%.*s%s", (int)(dash - variant), variant, dash + 3);
    return buf;
}

static int use_isa(const char *name) {
    const char *plus = strchr(name, '+');
    char base[32];
    snprintf(base, sizeof base, "%.*s", plus ? (int)(plus - name) : (int)strlen(name), name);
    return nx_kernels_force(base);
}

/* W as variant `isa` runs it: x16 unless the variant is an act8 one. */
static nx_linear as_variant(const char *isa, const nx_linear *W) {
    nx_linear v = *W;
    v.x16 = W->x16 || !is_act8(isa);
    return v;
}

static int setup(void **state) {
    (void)state;
    default_isa = nx_kernels_isa();
    /* the "-t0" tables are the AVX-512 ones with ordinary weight prefetches: the same bits */
    const char *all[] = {"ref",          "avx2",          "avx2+act8",          "avx2vnni",
                         "avx2vnni+act8", "avx512",       "avx512+act8",        "avx512vnni",
                         "avx512vbmi",   "avx512vnni+act8", "avx512vbmi+act8",  "avx512-t0",
                         "avx512-t0+act8", "avx512vnni-t0", "avx512vnni-t0+act8", "avx512vbmi-t0",
                         "avx512vbmi-t0+act8", "neon",     "neondot",           "neoni8mm",
                         "neondot+act8", "neoni8mm+act8"};
    n_isas = 0;
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (use_isa(all[i]) == 0) isas[n_isas++] = all[i];
    use_isa(default_isa);
    return 0;
}

/* ------------------------------------------------------------------ packing */

static void test_pack_reference_words(void **state) {
    (void)state;
    static const struct {
        int bits;
        int n;
        uint32_t w[8];
    } ref[] = {
        {2, 2, {0xe4e4e4e4, 0xe4e4e4e4}},
        {3, 3, {0x88fac688, 0xc688fac6, 0xfac688fa}},
        {4, 4, {0x76543210, 0xfedcba98, 0x76543210, 0xfedcba98}},
        {5, 5, {0x8a418820, 0xc5a92839, 0xca307b9a, 0x38bdab49, 0xffbbcdeb}},
        {6, 6, {0x440c2040, 0xa2481c61, 0x3ce34c2c, 0x544d2450, 0xa6585d65, 0x7de75c6d}},
        {8, 8, {0x03020100, 0x07060504, 0x0b0a0908, 0x0f0e0d0c, 0x13121110, 0x17161514,
                0x1b1a1918, 0x1f1e1d1c}},
    };
    for (size_t c = 0; c < sizeof ref / sizeof ref[0]; c++) {
        int b = ref[c].bits;
        uint8_t q[32], packed[32];
        for (int i = 0; i < 32; i++) q[i] = (uint8_t)(i & ((1 << b) - 1));
        mlx_pack_row(q, 32, b, packed);
        for (int k = 0; k < ref[c].n; k++) {
            uint32_t w = (uint32_t)packed[4 * k] | (uint32_t)packed[4 * k + 1] << 8 |
                         (uint32_t)packed[4 * k + 2] << 16 | (uint32_t)packed[4 * k + 3] << 24;
            if (w != ref[c].w[k]) fail_msg("bits %d word %d: %08x != %08x", b, k, w, ref[c].w[k]);
        }
        /* and the engine decodes them back: w = 1·q + 0 */
        float one = 1.0f, zero = 0.0f, row[32];
        float ss[1] = {one}, bb[1] = {zero};
        nx_linear L = {.dtype = NX_DTYPE_U32, .out = 1, .in = 32, .w = packed, .bits = b,
                       .group = 32, .sdtype = NX_DTYPE_F32, .scales = ss, .biases = bb};
        nx_linear_get_row(&L, 0, row);
        for (int i = 0; i < 32; i++) assert_true(row[i] == (float)q[i]);
    }
}

/* ------------------------------------------------------------------ conversions */

static void test_to_f32(void **state) {
    (void)state;
    static const struct {
        uint16_t h;
        float f;
    } f16[] = {{0x0000, 0.0f}, {0x3c00, 1.0f}, {0xc000, -2.0f}, {0x0001, 5.9604645e-8f},
               {0x03ff, 6.0975552e-5f}, {0x0400, 6.1035156e-5f}, {0x7bff, 65504.0f},
               {0xfbff, -65504.0f}, {0x3555, 0.33325195f}};
    for (int k = 0; k < n_isas; k++) {
        assert_int_equal(use_isa(isas[k]), 0);
        for (size_t i = 0; i < sizeof f16 / sizeof f16[0]; i++) {
            float out;
            nx_to_f32(NX_DTYPE_F16, &f16[i].h, &out, 1);
            assert_true(out == f16[i].f);
        }
        uint16_t inf = 0x7c00;
        float out;
        nx_to_f32(NX_DTYPE_F16, &inf, &out, 1);
        assert_true(isinf(out) && out > 0);
        /* every length against the reference conversion */
        for (int64_t n = 1; n < 40; n++) {
            uint16_t h[40], b[40];
            for (int64_t i = 0; i < n; i++) {
                h[i] = rnd_f16();
                b[i] = rnd_bf16();
            }
            float got[41], want[41];
            got[n] = want[n] = 12345.0f; /* canary */
            nx_to_f32(NX_DTYPE_F16, h, got, n);
            assert_int_equal(nx_kernels_force("ref"), 0);
            nx_to_f32(NX_DTYPE_F16, h, want, n);
            assert_memory_equal(got, want, (size_t)(n + 1) * 4);
            nx_to_f32(NX_DTYPE_BF16, b, want, n);
            assert_int_equal(use_isa(isas[k]), 0);
            nx_to_f32(NX_DTYPE_BF16, b, got, n);
            assert_memory_equal(got, want, (size_t)(n + 1) * 4);
        }
    }
    use_isa(default_isa);
}

static void test_dot_axpy(void **state) {
    (void)state;
    for (int k = 0; k < n_isas; k++) {
        for (int64_t n = 0; n < 70; n++) {
            float *a = rnd_vec(n), *b = rnd_vec(n), *y1 = rnd_vec(n + 1), *y2 = malloc((size_t)(n + 1) * 4);
            memcpy(y2, y1, (size_t)(n + 1) * 4);
            double exact = 0, mag = 0;
            for (int64_t i = 0; i < n; i++) {
                exact += (double)a[i] * b[i];
                mag += fabs((double)a[i] * b[i]);
            }
            assert_int_equal(use_isa(isas[k]), 0);
            float d = nx_dot_f32(a, b, n);
            nx_axpy_f32(0.75f, a, y1, n);
            assert_true(fabs(d - exact) <= 1e-6 * (mag + 1) * (double)(n + 1));
            for (int64_t i = 0; i < n; i++) y2[i] += 0.75f * a[i];
            for (int64_t i = 0; i < n; i++) assert_true(fabsf(y1[i] - y2[i]) <= 1e-6f);
            assert_true(y1[n] == y2[n]); /* past the end untouched */
            free(a);
            free(b);
            free(y1);
            free(y2);
        }
    }
    use_isa(default_isa);
}

/* The attention helpers give the bits of the dot/axpy loops they replace, on every ISA, for
 * any number of heads sharing the rows; on an f16 cache, the bits those loops give on the rows
 * widened to f32. */
static void test_attn_helpers(void **state) {
    (void)state;
    const int64_t hds[] = {1, 15, 16, 17, 64, 100, 128, 130, 200, 256, 576};
    const int64_t gs[] = {1, 3, 4, 6, 10};
    const nx_dtype kvts[] = {NX_DTYPE_F32, NX_DTYPE_F16};
    for (int k = 0; k < n_isas; k++) {
        assert_int_equal(use_isa(isas[k]), 0);
        for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++)
            for (size_t gi = 0; gi < sizeof gs / sizeof gs[0]; gi++)
                for (int ni = 0; ni < 5; ni++) /* row counts of every remainder by 4; 300 rows of 256 or
                                                   576 values: several of the kernels' row blocks */
                    for (int kt = 0; kt < 2; kt++) {
                        const int64_t n = (int64_t[]){1, 6, 11, 70, 300}[ni];
                        const int64_t hd = hds[h], g = gs[gi], stride = hd + 7, ld = n + 2;
                        const nx_dtype kvt = kvts[kt];
                        float *q = rnd_vec(g * hd), *K = rnd_vec(n * stride), *w = rnd_vec(g * ld);
                        /* the cache as stored (K itself, or its f16 image) and K as the kernels see it */
                        uint16_t *K16 = malloc((size_t)(n * stride) * sizeof *K16);
                        for (int64_t i = 0; i < n * stride; i++) K16[i] = nx_f32_to_f16(K[i]);
                        if (kvt == NX_DTYPE_F16) nx_to_f32(NX_DTYPE_F16, K16, K, n * stride);
                        const void *stored = kvt == NX_DTYPE_F16 ? (const void *)K16 : (const void *)K;
                        float *got = malloc((size_t)(g * ld) * sizeof *got), *want = malloc((size_t)(g * ld) * sizeof *want);
                        for (int64_t i = 0; i < g * ld; i++) got[i] = want[i] = 12345.0f; /* canaries past n */
                        nx_attn_scores(q, g, stored, kvt, stride, n, hd, 0.125f, got, ld);
                        for (int64_t hh = 0; hh < g; hh++)
                            for (int64_t p = 0; p < n; p++) want[hh * ld + p] = nx_dot_f32(q + hh * hd, K + p * stride, hd) * 0.125f;
                        if (memcmp(got, want, (size_t)(g * ld) * 4) != 0)
                            fail_msg("%s: attn_scores (%s) hd %lld g %lld n %lld differs from dot", isas[k],
                                     kt ? "f16" : "f32", (long long)hd, (long long)g, (long long)n);
                        float *o1 = rnd_vec(g * hd + 1), *o2 = malloc((size_t)(g * hd + 1) * sizeof *o2);
                        memcpy(o2, o1, (size_t)(g * hd + 1) * 4);
                        nx_attn_accum(w, ld, g, stored, kvt, stride, n, hd, o1);
                        for (int64_t hh = 0; hh < g; hh++)
                            for (int64_t p = 0; p < n; p++) nx_axpy_f32(w[hh * ld + p], K + p * stride, o2 + hh * hd, hd);
                        if (memcmp(o1, o2, (size_t)(g * hd + 1) * 4) != 0)
                            fail_msg("%s: attn_accum (%s) hd %lld g %lld n %lld differs from axpy", isas[k],
                                     kt ? "f16" : "f32", (long long)hd, (long long)g, (long long)n);
                        free(q);
                        free(K);
                        free(K16);
                        free(w);
                        free(got);
                        free(want);
                        free(o1);
                        free(o2);
                    }
    }
    use_isa(default_isa);
}

/* Softmax on every ISA against a double-precision one: each probability within a few ulp
 * (plus what rounding x - max to float costs, and 1e-37 absolute for those that underflow),
 * whatever the length, and exactly its unnormalised form (nx_exp_shift_f32: max, e^(x - max)
 * and their sum, checked the same way) times 1/sum; a NaN input makes the row NaN. */
static void test_softmax(void **state) {
    (void)state;
    for (int k = 0; k < n_isas; k++) {
        assert_int_equal(use_isa(isas[k]), 0);
        for (int64_t n = 1; n <= 70; n++) {
            float *x = rnd_vec(n + 1);
            for (int64_t i = 0; i < n; i++) x[i] *= 40.0f; /* scores in [-40, 40] */
            if (n > 3) x[2] = -300.0f;                        /* underflows */
            x[n] = 777.0f;                                    /* canary */
            double mx = -INFINITY, sum = 0, *e = malloc((size_t)n * sizeof *e);
            double *d = malloc((size_t)n * sizeof *d);
            for (int64_t i = 0; i < n; i++) mx = fmax(mx, x[i]);
            for (int64_t i = 0; i < n; i++) {
                d[i] = fabs((double)x[i] - mx);
                sum += e[i] = exp((double)x[i] - mx);
            }
            /* the unnormalised form: the max exactly, each e^(x - max) and their sum as close */
            float *u = malloc((size_t)n * sizeof *u), umx = 0.0f;
            memcpy(u, x, (size_t)n * sizeof *u);
            const float usum = nx_exp_shift_f32(u, n, &umx);
            if (umx != (float)mx) fail_msg("%s n %lld: max %.9g, want %.9g", isas[k], (long long)n, umx, mx);
            if (!(fabs(usum - sum) <= 2e-6 * sum))
                fail_msg("%s n %lld: sum %.9g, want %.9g", isas[k], (long long)n, usum, sum);
            for (int64_t i = 0; i < n; i++)
                if (!(fabs(u[i] - e[i]) <= (2e-6 + 1.2e-7 * d[i]) * e[i] + 1e-37))
                    fail_msg("%s n %lld: e[%lld] = %.9g, want %.9g", isas[k], (long long)n, (long long)i, u[i], e[i]);
            nx_softmax_f32(x, n);
            for (int64_t i = 0; i < n; i++) {
                /* the softmax is that, times 1/sum: the same bits */
                if (x[i] != u[i] * (1.0f / usum))
                    fail_msg("%s n %lld: p[%lld] = %.9g, not e·(1/sum) %.9g", isas[k], (long long)n, (long long)i, x[i],
                             u[i] * (1.0f / usum));
                double want = e[i] / sum;
                /* x - max is rounded to float first: a relative error up to |x - max|·2^-24 */
                if (!(fabs(x[i] - want) <= (2e-6 + 1.2e-7 * d[i]) * want + 1e-37))
                    fail_msg("%s n %lld: p[%lld] = %.9g, want %.9g", isas[k], (long long)n, (long long)i, x[i], want);
            }
            assert_true(x[n] == 777.0f);
            free(u);
            free(d);
            free(e);
            free(x);
        }
        float y[20];
        for (int i = 0; i < 20; i++) y[i] = (float)i;
        y[7] = NAN;
        nx_softmax_f32(y, 20);
        for (int i = 0; i < 20; i++)
            if (!isnan(y[i])) fail_msg("%s: NaN input, p[%d] = %g", isas[k], i, y[i]);
    }
    use_isa(default_isa);
}

/* silu(g)·u (u NULL: silu(g)) against double precision on every ISA: lengths around the vector
 * width, gates from -100 to 100 (exp past its clamp), the canary after the end untouched; a NaN
 * gate or input gives NaN, an infinite gate infinity (silu(+inf) = +inf). */
static void test_swiglu(void **state) {
    (void)state;
    for (int k = 0; k < n_isas; k++) {
        assert_int_equal(use_isa(isas[k]), 0);
        for (int64_t n = 1; n <= 80; n++) {
            const bool alone = n > 40; /* silu alone */
            float *g = rnd_vec(n + 1), *u = rnd_vec(n);
            for (int64_t i = 0; i < n; i++) g[i] *= i % 5 == 0 ? 100.0f : 8.0f;
            g[n] = 777.0f;
            double *want = malloc((size_t)n * sizeof *want);
            for (int64_t i = 0; i < n; i++) want[i] = (double)g[i] / (1.0 + exp(-(double)g[i])) * (alone ? 1.0 : u[i]);
            nx_swiglu_f32(g, alone ? NULL : u, n);
            for (int64_t i = 0; i < n; i++)
                if (!(fabs(g[i] - want[i]) <= 1e-6 * fabs(want[i]) + 1e-30))
                    fail_msg("%s n %lld: g[%lld] = %.9g, want %.9g", isas[k], (long long)n, (long long)i, g[i], want[i]);
            assert_true(g[n] == 777.0f);
            free(want);
            free(u);
            free(g);
        }
        float g[3] = {NAN, INFINITY, 2.0f}, u[3] = {1.0f, 2.0f, NAN};
        nx_swiglu_f32(g, u, 3);
        if (!isnan(g[0]) || g[1] != INFINITY || !isnan(g[2]))
            fail_msg("%s: non-finite SwiGLU gave %g %g %g", isas[k], g[0], g[1], g[2]);
    }
    use_isa(default_isa);
}

/* RMSNorm: every ISA gives the bits of the definition in nx_rmsnorm_f32's contract (8 partial
 * double sums of squares, the tail in sum 0, a fixed tree; (x·r)·w in float), computed here
 * separately, for lengths around the vector widths, with and without weights, in place; and it
 * is within 1e-6 of the exact RMSNorm in long double. */
static void test_rmsnorm(void **state) {
    (void)state;
    for (int k = 0; k < n_isas; k++) {
        assert_int_equal(use_isa(isas[k]), 0);
        for (int64_t n = 1; n <= 70; n++)
            for (int weighted = 0; weighted < 2; weighted++) {
                float *x = rnd_vec(n), *w = weighted ? rnd_vec(n) : NULL, *out = rnd_vec(n + 1);
                for (int64_t i = 0; i < n; i++) x[i] *= i % 3 == 0 ? 40.0f : 1.0f;
                out[n] = 777.0f;
                double part[8] = {0};
                for (int64_t i = 0; i < n; i++) part[i < n - n % 8 ? i % 8 : 0] += (double)x[i] * (double)x[i];
                const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
                const float r = (float)(1.0 / sqrt(ss / (double)n + 1e-6));
                long double exact = 0;
                for (int64_t i = 0; i < n; i++) exact += (long double)x[i] * x[i];
                const long double re = 1.0L / sqrtl(exact / n + 1e-6L);
                nx_rmsnorm_f32(x, w, 1e-6f, n, out);
                for (int64_t i = 0; i < n; i++) {
                    float want = x[i] * r;
                    if (w) want *= w[i];
                    if (memcmp(&out[i], &want, sizeof want) != 0)
                        fail_msg("%s n %lld w %d: out[%lld] = %.9g, want %.9g", isas[k], (long long)n, weighted,
                                 (long long)i, out[i], want);
                    const long double e = (long double)x[i] * re * (w ? w[i] : 1.0f);
                    assert_true(fabsl(out[i] - e) <= 1e-6L * fabsl(e) + 1e-30L);
                }
                assert_true(out[n] == 777.0f);
                nx_rmsnorm_f32(x, w, 1e-6f, n, x); /* in place */
                assert_memory_equal(x, out, (size_t)n * sizeof *x);
                free(out);
                free(w);
                free(x);
            }
    }
    use_isa(default_isa);
}

/* The gated delta rule: every ISA gives the bits of its definition (computed here, element by
 * element: products rounded before each add, sums over the key dim in order), in place and into a
 * second buffer alike, with and without the output; and the state and output are within 1e-5 of
 * the rule in long double. Shapes around the vector width. */
static void test_delta_rule(void **state) {
    (void)state;
    static const int64_t dks[] = {1, 3, 16, 24}, dvs[] = {1, 7, 16, 17, 32, 45, 128, 131, 272};
    for (int k = 0; k < n_isas; k++) {
        assert_int_equal(use_isa(isas[k]), 0);
        for (size_t a = 0; a < sizeof dks / sizeof *dks; a++)
            for (size_t b = 0; b < sizeof dvs / sizeof *dvs; b++) {
                const int64_t dk = dks[a], dv = dvs[b], n = dk * dv;
                float *S = rnd_vec(n), *kk = rnd_vec(dk), *v = rnd_vec(dv), *q = rnd_vec(dk);
                float *want = malloc(sizeof(float) * (size_t)n), *wo = calloc((size_t)dv, sizeof(float));
                float *out = malloc(sizeof(float) * (size_t)(n + 1)), *o = malloc(sizeof(float) * (size_t)(dv + 1));
                const float decay = 0.8125f, beta = 0.625f;
                float kv[272] = {0}, d[272];
                long double Se[24 * 272], ke[272] = {0}, oe[272] = {0};
                for (int64_t i = 0; i < dk; i++)
                    for (int64_t j = 0; j < dv; j++) {
                        want[i * dv + j] = S[i * dv + j] * decay;
                        kv[j] += want[i * dv + j] * kk[i];
                        Se[i * dv + j] = (long double)S[i * dv + j] * decay;
                        ke[j] += Se[i * dv + j] * kk[i];
                    }
                for (int64_t j = 0; j < dv; j++) d[j] = beta * (v[j] - kv[j]);
                for (int64_t i = 0; i < dk; i++)
                    for (int64_t j = 0; j < dv; j++) {
                        want[i * dv + j] = want[i * dv + j] + kk[i] * d[j];
                        wo[j] += want[i * dv + j] * q[i];
                        Se[i * dv + j] += kk[i] * (long double)beta * ((long double)v[j] - ke[j]);
                        oe[j] += Se[i * dv + j] * q[i];
                    }
                out[n] = o[dv] = 777.0f;
                nx_delta_rule_f32(S, out, dk, dv, kk, v, decay, beta, q, o);
                if (memcmp(out, want, sizeof(float) * (size_t)n) != 0 || memcmp(o, wo, sizeof(float) * (size_t)dv) != 0)
                    fail_msg("%s: delta rule dk %lld dv %lld differs from its definition", isas[k], (long long)dk,
                             (long long)dv);
                assert_true(out[n] == 777.0f && o[dv] == 777.0f);
                for (int64_t i = 0; i < n; i++) assert_true(fabsl(out[i] - Se[i]) <= 1e-5L);
                for (int64_t j = 0; j < dv; j++) assert_true(fabsl(o[j] - oe[j]) <= 1e-5L * (1 + fabsl(oe[j])));
                nx_delta_rule_f32(S, S, dk, dv, kk, v, decay, beta, NULL, NULL); /* in place, state only */
                assert_memory_equal(S, want, sizeof(float) * (size_t)n);
                free(S), free(kk), free(v), free(q), free(want), free(wo), free(out), free(o);
            }
    }
    use_isa(default_isa);
}

/* Argmax: every ISA returns the reference's index and maximum and leaves the same array (NaN
 * turned to -inf), over lengths around the vector width, ties (the first wins), NaNs, -inf,
 * an all -inf row (index 0) and a long row. */
static void test_argmax(void **state) {
    (void)state;
    for (int64_t n = 1; n <= 600; n += n < 70 ? 1 : 53) {
        for (int kind = 0; kind < 4; kind++) {
            float *x = rnd_vec(n), *got = malloc((size_t)n * sizeof *got);
            assert_non_null(got);
            for (int64_t i = 0; i < n; i++) {
                if (kind == 1) x[i] = floorf(x[i] * 3.0f); /* many ties */
                if (kind == 2 && i % 7 == 3) x[i] = NAN;
                if (kind == 2 && i % 11 == 5) x[i] = -INFINITY;
                if (kind == 3) x[i] = i % 5 == 0 ? NAN : -INFINITY; /* nothing but -inf once cleaned */
            }
            /* the definition, written here: NaN → -inf, then the first strict maximum */
            int64_t want = 0;
            float wmax = -INFINITY;
            for (int64_t i = 0; i < n; i++) {
                const float v = isnan(x[i]) ? -INFINITY : x[i];
                if (v > wmax) wmax = v, want = i;
            }
            for (int k = 0; k < n_isas; k++) {
                assert_int_equal(use_isa(isas[k]), 0);
                memcpy(got, x, (size_t)n * sizeof *x);
                float mx = 0.0f;
                const int64_t arg = nx_argmax_f32(got, n, &mx);
                if (arg != want || !(mx == wmax))
                    fail_msg("%s n %lld kind %d: %lld (%g), want %lld (%g)", isas[k], (long long)n, kind, (long long)arg,
                             mx, (long long)want, wmax);
                for (int64_t i = 0; i < n; i++) {
                    const float v = isnan(x[i]) ? -INFINITY : x[i];
                    assert_true(memcmp(&got[i], &v, sizeof v) == 0);
                }
            }
            free(got);
            free(x);
        }
    }
    use_isa(default_isa);
}

/* ------------------------------------------------------------------ matmul vs reference */

/* Runs W·x on `isa` with padded leading dimensions; checks y's padding is untouched. */
static float *run_matmul(const char *isa, const nx_linear *W0, const float *x, int64_t ldx,
                         int64_t T, int64_t ldy, nx_pool *pool) {
    assert_int_equal(use_isa(isa), 0);
    const nx_linear Wv = as_variant(isa, W0), *W = &Wv;
    size_t n = (size_t)(T * ldy);
    float *y = malloc(n * sizeof *y);
    assert_non_null(y);
    for (size_t i = 0; i < n; i++) y[i] = -777.0f;
    nx_matmul(W, x, ldx, T, y, ldy, pool);
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = W->out; o < ldy; o++) assert_true(y[t * ldy + o] == -777.0f);
    return y;
}

/* How far the variant `isa` may move each input element of W's matmul, relative to the
 * largest |x| of its weight group: 0 (float kernels), 1/32768 (half an int16 step: max/2^14 at
 * most) or 1/254 (half an int8 step, max/127). */
static double x_half_step(const char *variant, const nx_linear *W) {
    char buf[40];
    const char *isa = kernels_of(variant, buf);
    /* AArch64's integer tables: int8 for 2- to 6-bit weights on rows up to 32768 wide, else the
     * float kernels */
    if (strncmp(isa, "neondot", 7) == 0 || strncmp(isa, "neoni8mm", 8) == 0)
        return is_act8(isa) && !W->x16 && W->dtype == NX_DTYPE_U32 && W->bits <= 6 && W->in <= 32768 ? 1.0 / 254.0
                                                                                                      : 0;
    const int vbmi = strncmp(isa, "avx512vbmi", 10) == 0, act8 = is_act8(isa) && !W->x16;
    /* avx2, avx2vnni and avx512 (avx2_int8.c): 2-, 3- and 4-bit weights in groups a multiple of 64
     * on int8, the rest in float */
    const int i8 = act8 && W->dtype == NX_DTYPE_U32 && W->bits >= 2 && W->bits <= 4 && W->group % 64 == 0;
    if (strncmp(isa, "avx2", 4) == 0 || (strncmp(isa, "avx512", 6) == 0 && (isa[6] == 0 || isa[6] == '+')))
        return i8 ? 1.0 / 254.0 : 0;
    if ((strncmp(isa, "avx512vnni", 10) != 0 && !vbmi) || W->dtype != NX_DTYPE_U32) return 0;
    int q = 0;
    if (W->bits == 4 || W->bits == 8 || (vbmi && W->bits != 2)) q = W->group % 64 == 0;
    else q = W->bits == 2 && (W->group % 128 == 0 || (W->group == 64 && W->in % 128 == 0));
    /* shapes the integer tables decline go to the avx512 table: avx2_int8.c's where it takes them */
    if (!q) return i8 ? 1.0 / 254.0 : 0;
    /* int8 for 4-bit in whole 128-element blocks (groups of 64: a last block of 64 too) and
     * 2-bit in whole 256-element blocks, without a group straddling a block except at a lane
     * boundary, and (VBMI) 3/5/6-bit */
    const int by8 = (W->bits == 4 && (W->group == 64 || (W->in % 128 == 0 && W->group % 128 == 0))) ||
                    (W->bits == 2 && W->in % 256 == 0 && (W->group == 64 || W->group == 128 || W->group % 256 == 0)) ||
                    (vbmi && W->bits != 2 && W->bits != 4 && W->bits != 8);
    return act8 && by8 ? 1.0 / 254.0 : 1.0 / 32768.0;
}

/* What an integer kernel computes for W (raw q values in tw0->q) on x, by its numerics contract
 * (avx512_vnni.c), worked out here in double: each group of each input row rounded to integers
 * at scale d, d = max|x|/127 on int8 (a power of two below 2^-100), a power of two with max|x|/d
 * in [2^14, 2^15) on int16 (saturating), then Σ_g s_g·d_g·Σ q·x̂ + b_g·Σ x. A kernel that reads
 * the wrong weights or activations for a group misses this by far more than rounding; the
 * bound against the float reference (half a step per element) is too loose to see that. Also
 * returns Σ_g |s_g·d_g|·Σ |q·x̂| + |b_g·Σ x| per output in mag: the size of the terms the
 * kernel's float epilogue adds (per lane, then across lanes), which a dot product that happens
 * to cancel does not show. */
static void emulate_int(const tw *tw0, const float *x, int64_t ldx, int64_t T, int act, double *ye, double *mag) {
    const nx_linear *W = &tw0->L;
    const int64_t ng = W->in / W->group;
    float s[512], b[512];
    assert_true(ng <= 512);
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < W->out; o++) {
            nx_to_f32(W->sdtype, (const uint8_t *)W->scales + (size_t)(o * ng) * es(W->sdtype), s, ng);
            nx_to_f32(W->sdtype, (const uint8_t *)W->biases + (size_t)(o * ng) * es(W->sdtype), b, ng);
            double y = 0, m = 0;
            for (int64_t g = 0; g < ng; g++) {
                const float *xg = x + t * ldx + g * W->group;
                float amax = 0.0f;
                double X = 0;
                for (int64_t i = 0; i < W->group; i++) {
                    amax = fmaxf(amax, fabsf(xg[i]));
                    X += xg[i];
                }
                float inv = 0.0f, d = 0.0f;
                if (act == 8 && amax >= 0x1p-100f) {
                    inv = 127.0f / amax;
                    d = amax / 127.0f;
                } else if (amax > 0.0f) {
                    int e;
                    frexpf(amax, &e);
                    int k = (act == 8 ? 7 : 15) - e;
                    if (k > 126) k = 126;
                    inv = ldexpf(1.0f, k);
                    d = ldexpf(1.0f, -k);
                }
                double dot = 0, adot = 0;
                for (int64_t i = 0; i < W->group; i++) {
                    float v = rintf(xg[i] * inv);
                    v = v > 32767.0f ? 32767.0f : v < -32768.0f ? -32768.0f : v;
                    dot += (double)tw0->q[o * W->in + g * W->group + i] * v;
                    adot += fabs((double)tw0->q[o * W->in + g * W->group + i] * v);
                }
                y += (double)s[g] * d * dot + (double)b[g] * X;
                m += fabs((double)s[g] * d) * adot + fabs((double)b[g] * X);
            }
            ye[t * W->out + o] = y;
            mag[t * W->out + o] = m;
        }
}

/* Compares every ISA against the reference within a bound scaled by Σ|w·x|, and checks the
 * reference itself against the dequantization formula on raw q (quantized weights). Kernels
 * that round x per group may add up to half a step per element (x_half_step of max_g|x|):
 * Σ_g h·max_g|x| · Σ_{j∈g}|w_j|. `x` may be given (NULL: random in [-1, 1)). */
static void check_against_ref_x(const tw *tw0, int64_t T, const float *xin) {
    const nx_linear *W = &tw0->L;
    int64_t ldx = W->in + 3, ldy = W->out + 2;
    float *x = rnd_vec(T * ldx);
    if (xin)
        for (int64_t t = 0; t < T; t++) memcpy(x + t * ldx, xin + t * W->in, (size_t)W->in * 4);
    float *wrow = malloc((size_t)W->in * sizeof *wrow);
    float *yr = run_matmul("ref", W, x, ldx, T, ldy, NULL);
    double *mag = calloc((size_t)(T * W->out), sizeof *mag);
    double *xq = calloc((size_t)(T * W->out), sizeof *xq);
    for (int64_t o = 0; o < W->out; o++) {
        nx_linear_get_row(W, o, wrow);
        if (tw0->q) { /* the stored format means what the spec says */
            int64_t ng = W->in / W->group;
            float s[512], b[512];
            assert_true(ng <= 512);
            nx_to_f32(W->sdtype, (const uint8_t *)W->scales + (size_t)(o * ng) * es(W->sdtype), s, ng);
            nx_to_f32(W->sdtype, (const uint8_t *)W->biases + (size_t)(o * ng) * es(W->sdtype), b, ng);
            for (int64_t i = 0; i < W->in; i++)
                assert_true(wrow[i] == s[i / W->group] * (float)tw0->q[o * W->in + i] + b[i / W->group]);
        }
        for (int64_t t = 0; t < T; t++) {
            double m = 0;
            for (int64_t i = 0; i < W->in; i++) m += fabs((double)wrow[i] * x[t * ldx + i]);
            mag[t * W->out + o] = m;
            if (W->dtype != NX_DTYPE_U32) continue;
            double e = 0;
            for (int64_t g0 = 0; g0 < W->in; g0 += W->group) {
                double amax = 0, wsum = 0;
                for (int64_t i = g0; i < g0 + W->group; i++) {
                    amax = fmax(amax, fabs((double)x[t * ldx + i]));
                    wsum += fabs((double)wrow[i]);
                }
                e += amax * wsum;
            }
            xq[t * W->out + o] = e * 1.001;
        }
    }
    double *ye = calloc((size_t)(T * W->out), sizeof *ye), *emag = calloc((size_t)(T * W->out), sizeof *emag);
    for (int k = 1; k < n_isas; k++) {
        float *ys = run_matmul(isas[k], W, x, ldx, T, ldy, NULL);
        const double h = x_half_step(isas[k], W);
        if (h > 0 && tw0->q) { /* an integer kernel: what its contract says, to rounding */
            emulate_int(tw0, x, ldx, T, h > 1e-3 ? 8 : 16, ye, emag);
            for (int64_t t = 0; t < T; t++)
                for (int64_t o = 0; o < W->out; o++) {
                    const double a = ye[t * W->out + o], b = ys[t * ldy + o];
                    const double tol = 2.5e-7 * (double)(W->in / W->group + 16) * emag[t * W->out + o] + 1e-30;
                    if (!(fabs(a - b) <= tol))
                        fail_msg("%s bits %d group %d out %lld in %lld T %lld: y[%lld,%lld] by the integer "
                                 "contract %.9g, kernel %.9g", isas[k], W->bits, W->group, (long long)W->out,
                                 (long long)W->in, (long long)T, (long long)t, (long long)o, a, b);
                }
        }
        for (int64_t t = 0; t < T; t++)
            for (int64_t o = 0; o < W->out; o++) {
                double a = yr[t * ldy + o], b = ys[t * ldy + o];
                double tol = 2.5e-7 * (double)(W->in + 16) * mag[t * W->out + o] + 1e-30;
                tol += x_half_step(isas[k], W) * xq[t * W->out + o];
                if (!(fabs(a - b) <= tol))
                    fail_msg("%s dtype %d bits %d group %d sdt %d out %lld in %lld T %lld: "
                             "y[%lld,%lld] ref %.9g simd %.9g", isas[k], W->dtype, W->bits,
                             W->group, W->sdtype, (long long)W->out, (long long)W->in,
                             (long long)T, (long long)t, (long long)o, a, b);
            }
        free(ys);
    }
    free(ye);
    free(emag);
    free(yr);
    free(mag);
    free(xq);
    free(wrow);
    free(x);
}

static void check_against_ref(const tw *tw0, int64_t T) { check_against_ref_x(tw0, T, NULL); }

static const int64_t odd_sizes[] = {1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129};
#define N_ODD (int)(sizeof odd_sizes / sizeof odd_sizes[0])

static void test_matmul_float_vs_ref(void **state) {
    (void)state;
    const nx_dtype dts[3] = {NX_DTYPE_F32, NX_DTYPE_F16, NX_DTYPE_BF16};
    const int64_t Ts[] = {1, 2, 3, 5, 9};
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < N_ODD; i++)
            for (int o = 0; o < N_ODD; o += 2) {
                tw t;
                tw_make(&t, dts[d], odd_sizes[o], odd_sizes[i], 0, 0, NX_DTYPE_F32, (i + o) % 4);
                check_against_ref(&t, Ts[(i + o + d) % 5]);
                if (i % 5 == 0) check_against_ref(&t, 9);
                tw_free(&t);
            }
    use_isa(default_isa);
}

/* Side spans: results are the same bits with side spans set, on every ISA; the AVX-512 kernels
 * take a line per weight row, span after span, from the scratch they are given. */
static void test_side_prefetch(void **state) {
    (void)state;
    static uint8_t side[3][4096] __attribute__((aligned(64)));
    const nx_span spans[3] = {{side[0] + 5, 1000}, {side[1], 64}, {side[2], 4096}}; /* 16, 1, 64 lines */
    const nx_dtype dts[2] = {NX_DTYPE_U32, NX_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        tw t;
        tw_make(&t, dts[d], 32, 128, dts[d] == NX_DTYPE_U32 ? 4 : 0, 64, NX_DTYPE_BF16, 0);
        float *x = rnd_vec(128), y0[32], y1[32];
        nx_kscratch *ks = nx_kscratch_new();
        assert_non_null(ks);
        for (int k = 0; k < n_isas; k++) {
            assert_int_equal(use_isa(isas[k]), 0);
            const nx_linear W = as_variant(isas[k], &t.L);
            nx_matmul_rows(&W, x, 128, 1, y0, 32, 0, 32, ks);
            nx_side_set(&ks->side, spans, 3);
            nx_matmul_rows(&W, x, 128, 1, y1, 32, 0, 32, ks);
            assert_memory_equal(y0, y1, sizeof y0);
            const nx_side_pf *sp = &ks->side;
            if (strncmp(isas[k], "avx512", 6) == 0) {
                /* 32 rows, so 32 lines: the first span's 16, the second's 1, 15 of the third */
                assert_int_equal(sp->i, 2);
                assert_int_equal(sp->at - (uintptr_t)side[2], 15 * 64);
            }
            nx_side_set(&ks->side, NULL, 0);
            assert_int_equal(ks->side.n, 0);
        }
        nx_kscratch_free(ks);
        free(x);
        tw_free(&t);
    }
    use_isa(default_isa);
}

static void test_matmul_quant_vs_ref(void **state) {
    (void)state;
    const int bits[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
    const nx_dtype sdts[3] = {NX_DTYPE_F32, NX_DTYPE_F16, NX_DTYPE_BF16};
    const int64_t outs[] = {1, 3, 5, 8, 17, 33};
    int c = 0;
    for (int b = 0; b < 6; b++)
        for (int g = 0; g < 3; g++)
            for (int s = 0; s < 3; s++)
                for (int64_t mult = 1; mult <= 3; mult++, c++) {
                    tw t;
                    tw_make(&t, NX_DTYPE_U32, outs[c % 6], groups[g] * mult, bits[b], groups[g],
                            sdts[s], c % 4);
                    check_against_ref(&t, 1 + c % 5);
                    tw_free(&t);
                }
    use_isa(default_isa);
}

/* Activations with a massive outlier channel (as LLM hidden states have): groups without the
 * outlier keep their own precision, groups with it stay within half an int16 step of its size;
 * and rows long enough that the int16 image is staged in several chunks, or not at all. */
static void test_matmul_quant_activations(void **state) {
    (void)state;
    const int bits[] = {2, 3, 4, 5, 6, 8};
    for (int b = 0; b < 6; b++) {
        tw t;
        tw_make(&t, NX_DTYPE_U32, 19, 64 * 6, bits[b], 64, NX_DTYPE_BF16, 1);
        const int64_t T = 3, in = t.L.in;
        float *x = rnd_vec(T * in);
        x[5] = 3.0e4f;           /* row 0, group 0 */
        x[in + 130] = -7.5e3f;   /* row 1, group 2 */
        for (int64_t i = 2 * in; i < 3 * in; i++) x[i] *= 1e-30f; /* row 2: tiny values */
        check_against_ref_x(&t, T, x);
        free(x);
        tw_free(&t);
    }
    /* 300 groups of 64: 19200 elements per row, so a T=14 call is staged in chunks of input
     * rows (int16 six rows at a time; int8 thirteen, then one), each row in column chunks */
    tw big;
    tw_make(&big, NX_DTYPE_U32, 5, 64 * 300, 4, 64, NX_DTYPE_F16, 0);
    check_against_ref(&big, 14);
    tw_free(&big);
    /* 2- and 4-bit groups of 256: two 128-element blocks per group (one 256-element block on
     * int8); 2-bit groups of 64 on rows of whole 256-element blocks (four groups per block on
     * int8), and of 512 (two blocks per group) */
    for (int b = 2; b <= 4; b += 2) {
        tw g256;
        tw_make(&g256, NX_DTYPE_U32, 7, 256 * 3, b, 256, NX_DTYPE_BF16, 1);
        check_against_ref(&g256, 3);
        tw_free(&g256);
    }
    /* 3- to 6-bit groups of 64 and 4-bit groups of 128 on rows of whole 256-element blocks (on
     * int8: four groups per block at 3 and 4 bits, two at 4 bits in groups of 128, two per 128
     * elements at 5 and 6), every input-row count the kernels block for */
    const int blk_bits[5] = {3, 4, 5, 6, 4}, blk_group[5] = {64, 64, 64, 64, 128};
    for (int i = 0; i < 5; i++)
        for (int64_t T = 1; T <= 5; T++) {
            tw qb;
            tw_make(&qb, NX_DTYPE_U32, 7 + T, 256 * (1 + T % 3), blk_bits[i], blk_group[i],
                    T % 2 ? NX_DTYPE_BF16 : NX_DTYPE_F16, (int)(T + blk_bits[i]) % 4);
            check_against_ref(&qb, T);
            tw_free(&qb);
        }
    /* 4-bit groups of 64 on rows of an odd number of groups (a latent attention's 192-wide
     * query absorption): a last 64-element block after the 128-element ones, on int8; every
     * input-row count the kernels block for, and output counts off the register blocks */
    const int64_t odd_in[4] = {64, 192, 320, 64 * 15};
    for (int i = 0; i < 4; i++)
        for (int64_t T = 1; T <= 5; T++) {
            tw q4;
            tw_make(&q4, NX_DTYPE_U32, 3 + 4 * T + i, odd_in[i], 4, 64, T % 2 ? NX_DTYPE_BF16 : NX_DTYPE_F16,
                    (int)(T + i) % 4);
            check_against_ref(&q4, T);
            tw_free(&q4);
        }
    const int64_t q2_in[2] = {64 * 8, 512 * 2}, q2_group[2] = {64, 512};
    for (int i = 0; i < 2; i++) {
        tw q2;
        tw_make(&q2, NX_DTYPE_U32, 9, q2_in[i], 2, (int)q2_group[i], NX_DTYPE_F16, i);
        check_against_ref(&q2, 5);
        tw_free(&q2);
    }
    /* a row too long to stage at all goes to the float kernel */
    tw huge;
    tw_make(&huge, NX_DTYPE_U32, 2, 128 * 260, 8, 128, NX_DTYPE_BF16, 2);
    check_against_ref(&huge, 2);
    tw_free(&huge);
    use_isa(default_isa);
}

/* A NaN or an infinity in the input makes every output it meets non-finite, on every ISA (an
 * int16 image of such a group must not silently read as zeros). */
static void test_matmul_quant_nonfinite(void **state) {
    (void)state;
    const int bits[] = {2, 3, 4, 5, 6, 8};
    for (int b = 0; b < 6; b++) {
        tw t;
        tw_make(&t, NX_DTYPE_U32, 9, 64 * 4, bits[b], 64, NX_DTYPE_BF16, 0);
        const int64_t T = 3, in = t.L.in;
        float *x = rnd_vec(T * in);
        x[70] = NAN;
        x[in + 200] = INFINITY;
        for (int k = 0; k < n_isas; k++) {
            float *y = run_matmul(isas[k], &t.L, x, in, T, t.L.out, NULL);
            for (int64_t o = 0; o < t.L.out; o++) {
                if (!isnan(y[o])) fail_msg("%s bits %d: NaN input, y[0,%lld] = %g", isas[k], bits[b], (long long)o, y[o]);
                if (isfinite(y[t.L.out + o]))
                    fail_msg("%s bits %d: inf input, y[1,%lld] = %g", isas[k], bits[b], (long long)o, y[t.L.out + o]);
                if (!isfinite(y[2 * t.L.out + o])) fail_msg("%s: finite row 2 became %g", isas[k], y[2 * t.L.out + o]);
            }
            free(y);
        }
        free(x);
        tw_free(&t);
    }
    use_isa(default_isa);
}

/* ------------------------------------------------------------------ numerics contract */

/* Row t of a T-row call == the same row computed alone, or in any sub-batch, or over any
 * split of output rows; for every ISA. */
static void check_batch_invariance(const nx_linear *W0) {
    const int64_t T = 9, ldx = W0->in + 1, ldy = W0->out + 5;
    float *x = rnd_vec(T * ldx);
    nx_kscratch *ks = nx_kscratch_new();
    assert_non_null(ks);
    for (int k = 0; k < n_isas; k++) {
        const nx_linear Wv = as_variant(isas[k], W0), *W = &Wv;
        float *yfull = run_matmul(isas[k], W, x, ldx, T, ldy, NULL);
        float *y1 = malloc((size_t)(T * ldy) * sizeof *y1);
        /* each row alone */
        for (int64_t t = 0; t < T; t++) {
            nx_matmul(W, x + t * ldx, ldx, 1, y1, ldy, NULL);
            if (memcmp(y1, yfull + t * ldy, (size_t)W->out * 4) != 0)
                fail_msg("%s dtype %d bits %d: row %lld alone differs from T=9", isas[k],
                         W->dtype, W->bits, (long long)t);
        }
        /* sub-batches [a, a+n) */
        for (int64_t a = 0; a < T; a += 2)
            for (int64_t n = 1; a + n <= T; n += 3) {
                nx_matmul(W, x + a * ldx, ldx, n, y1, ldy, NULL);
                for (int64_t t = 0; t < n; t++)
                    if (memcmp(y1 + t * ldy, yfull + (a + t) * ldy, (size_t)W->out * 4) != 0)
                        fail_msg("%s dtype %d: sub-batch [%lld,+%lld) row %lld differs", isas[k],
                                 W->dtype, (long long)a, (long long)n, (long long)t);
            }
        /* ragged row splits on the calling thread; with prefetch hints naming the next split
         * (past the last row at the end), rows out of range, or no weight: the hint never
         * changes a result */
        const int64_t cuts[] = {1, 3, 7, 13};
        for (int hint = 0; hint < 4; hint++)
            for (int c = 0; c < 4; c++) {
                int64_t step = cuts[c];
                memset(y1, 0, (size_t)(T * ldy) * 4);
                for (int64_t o = 0; o < W->out; o += step) {
                    const nx_rows next[4] = {{W, o + step, o + 2 * step}, {W, -5, W->out + 100}, {NULL, 0, 4}, {W, 3, 2}};
                    /* a scratch for each call, or one kept across them (its reuse cache hit) */
                    if (hint == 0) nx_matmul_rows(W, x, ldx, T, y1, ldy, o, o + step, c & 1 ? ks : NULL);
                    else nx_matmul_rows_then(W, x, ldx, T, y1, ldy, o, o + step, &next[hint - 1], ks);
                }
                for (int64_t t = 0; t < T; t++)
                    if (memcmp(y1 + t * ldy, yfull + t * ldy, (size_t)W->out * 4) != 0)
                        fail_msg("%s dtype %d: row split by %lld (hint %d) differs", isas[k], W->dtype,
                                 (long long)step, hint);
            }
        free(y1);
        free(yfull);
    }
    nx_kscratch_free(ks);
    free(x);
    use_isa(default_isa);
}

static void test_batch_invariance(void **state) {
    (void)state;
    const nx_dtype dts[3] = {NX_DTYPE_F32, NX_DTYPE_F16, NX_DTYPE_BF16};
    for (int d = 0; d < 3; d++) {
        tw t;
        tw_make(&t, dts[d], 75, 4099, 0, 0, NX_DTYPE_F32, 0); /* > 1 L2 block of rows */
        check_batch_invariance(&t.L);
        tw_free(&t);
    }
    const int bits[] = {2, 3, 4, 5, 6, 8};
    for (int b = 0; b < 6; b++) {
        tw t;
        tw_make(&t, NX_DTYPE_U32, 70, 64 * 20, bits[b], 64, NX_DTYPE_BF16, 1);
        check_batch_invariance(&t.L);
        tw_free(&t);
    }
    /* 4-bit rows of three groups of 64 (int8, a last 64-element block) */
    tw odd;
    tw_make(&odd, NX_DTYPE_U32, 70, 192, 4, 64, NX_DTYPE_BF16, 1);
    check_batch_invariance(&odd.L);
    tw_free(&odd);
    /* rows as wide as a dense down projection (13312): at T=9 each register block goes through
     * them in column chunks, its sums carried between them; every sub-batch (whole rows at up
     * to 4 input rows) the same bits */
    tw wide;
    tw_make(&wide, NX_DTYPE_U32, 20, 13312, 4, 64, NX_DTYPE_BF16, 1);
    check_batch_invariance(&wide.L);
    tw_free(&wide);
}

/* An AVX-512 table and its "-t0" twin differ in their weight prefetch hints alone: the same
 * bits for float and quantized weights, decode to prefill row counts, int16 and int8
 * activations (where this CPU has both). */
static void test_prefetch_twins(void **state) {
    (void)state;
    tw ws[5];
    tw_make(&ws[0], NX_DTYPE_BF16, 75, 4099, 0, 0, NX_DTYPE_F32, 0);
    tw_make(&ws[1], NX_DTYPE_U32, 70, 64 * 20, 4, 64, NX_DTYPE_BF16, 1);
    tw_make(&ws[2], NX_DTYPE_U32, 33, 64 * 12, 3, 64, NX_DTYPE_F16, 0);
    tw_make(&ws[3], NX_DTYPE_U32, 40, 256 * 3, 2, 64, NX_DTYPE_BF16, 2);
    tw_make(&ws[4], NX_DTYPE_U32, 20, 13312, 4, 64, NX_DTYPE_BF16, 1);
    int pairs = 0;
    for (int k = 0; k < n_isas; k++) {
        char buf[40];
        const char *twin = kernels_of(isas[k], buf);
        if (twin == isas[k]) continue;
        assert_int_equal(use_isa(twin), 0);
        pairs++;
        for (int w = 0; w < 5; w++)
            for (int64_t T = 1; T <= 9; T += 2) {
                const nx_linear *W = &ws[w].L;
                const int64_t ldx = W->in + 3, ldy = W->out + 1;
                float *x = rnd_vec(T * ldx);
                float *a = run_matmul(twin, W, x, ldx, T, ldy, NULL), *b = run_matmul(isas[k], W, x, ldx, T, ldy, NULL);
                if (memcmp(a, b, (size_t)(T * ldy) * 4) != 0)
                    fail_msg("%s and %s differ: weight %d, T %lld", twin, isas[k], w, (long long)T);
                free(a);
                free(b);
                free(x);
            }
    }
    /* every AVX-512 table this CPU runs has its twin */
    int avx512 = 0;
    for (int k = 0; k < n_isas; k++) {
        char buf[40];
        avx512 += strncmp(isas[k], "avx512", 6) == 0 && kernels_of(isas[k], buf) == isas[k];
    }
    assert_int_equal(pairs, avx512);
    for (int w = 0; w < 5; w++) tw_free(&ws[w]);
    use_isa(default_isa);
}

static void test_thread_invariance(void **state) {
    (void)state;
    nx_pool *pools[3] = {nx_pool_new(1), nx_pool_new(2), nx_pool_new(3)};
    for (int i = 0; i < 3; i++) assert_non_null(pools[i]);
    tw ws[3];
    tw_make(&ws[0], NX_DTYPE_BF16, 301, 1000, 0, 0, NX_DTYPE_F32, 0);
    tw_make(&ws[1], NX_DTYPE_U32, 333, 512, 4, 64, NX_DTYPE_F16, 2);
    tw_make(&ws[2], NX_DTYPE_F32, 250, 257, 0, 0, NX_DTYPE_F32, 0);
    for (int w = 0; w < 3; w++) {
        const nx_linear *W = &ws[w].L;
        const int64_t T = 5, ldx = W->in, ldy = W->out;
        float *x = rnd_vec(T * ldx);
        for (int k = 0; k < n_isas; k++) {
            float *y0 = run_matmul(isas[k], W, x, ldx, T, ldy, NULL);
            for (int p = 0; p < 3; p++) {
                float *yp = run_matmul(isas[k], W, x, ldx, T, ldy, pools[p]);
                if (memcmp(y0, yp, (size_t)(T * ldy) * 4) != 0)
                    fail_msg("%s: pool of %d threads changes the result", isas[k], p + 1);
                free(yp);
            }
            free(y0);
        }
        free(x);
        tw_free(&ws[w]);
    }
    for (int i = 0; i < 3; i++) nx_pool_free(pools[i]);
    use_isa(default_isa);
}

/* Block-diagonal products (nx_matmul_blocks): every output the same bits as a call on its
 * block's rows alone, on every ISA; blocks outside [k0, k1) and rows between blocks untouched.
 * Shapes: a latent attention's absorption (rows of three groups of 64) and output, blocks not a
 * whole number of register blocks, 2-, 3- and 8-bit, blocks with rows between them (declined
 * by the integer kernels), more input rows than a single pass takes, and bf16 weights. */
static void test_matmul_blocks(void **state) {
    (void)state;
    const struct {
        nx_dtype dt;
        int bits;
        int64_t in, rows, rstride, nblk, T;
    } cs[] = {{NX_DTYPE_U32, 4, 192, 12, 12, 5, 1}, {NX_DTYPE_U32, 4, 192, 16, 16, 4, 2},
              {NX_DTYPE_U32, 4, 512, 8, 8, 4, 3},   {NX_DTYPE_U32, 4, 128, 7, 7, 5, 4},
              {NX_DTYPE_U32, 2, 256, 9, 9, 3, 1},   {NX_DTYPE_U32, 3, 192, 6, 6, 4, 2},
              {NX_DTYPE_U32, 8, 128, 5, 5, 3, 1},   {NX_DTYPE_U32, 4, 192, 12, 20, 4, 1},
              {NX_DTYPE_U32, 4, 256, 8, 8, 3, 6},   {NX_DTYPE_BF16, 0, 96, 6, 6, 3, 2}};
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int64_t in = cs[c].in, rows = cs[c].rows, rs = cs[c].rstride, nb = cs[c].nblk, T = cs[c].T;
        tw t;
        tw_make(&t, cs[c].dt, (nb - 1) * rs + rows, in, cs[c].bits, 64, NX_DTYPE_BF16, (int)c % 4);
        const int64_t xstep = in + 5, ldx = nb * xstep, ystep = rows + 3, ldy = nb * ystep;
        float *x = rnd_vec(T * ldx), *y = malloc(sizeof(float) * (size_t)(T * ldy));
        float *w = malloc(sizeof(float) * (size_t)(T * ldy));
        assert_non_null(y);
        assert_non_null(w);
        for (int k = 0; k < n_isas; k++) {
            assert_int_equal(use_isa(isas[k]), 0);
            const nx_linear W = as_variant(isas[k], &t.L);
            for (int64_t i = 0; i < T * ldy; i++) y[i] = w[i] = -777.0f;
            for (int64_t b = 1; b < nb; b++) {
                const nx_linear Wb = nx_linear_rows(&W, b * rs, rows);
                nx_matmul_rows(&Wb, x + b * xstep, ldx, T, w + b * ystep, ldy, 0, rows, NULL);
            }
            const nx_blocks B = {&W, rs, rows, x, xstep, ldx, T, y, ystep, ldy};
            const nx_rows next = {&W, 0, rows};
            nx_matmul_blocks(&B, 1, nb, c % 2 ? &next : NULL, NULL);
            if (memcmp(y, w, sizeof(float) * (size_t)(T * ldy)) != 0)
                fail_msg("%s case %zu: blocks differ from their calls alone", isas[k], c);
            for (int64_t i = 0; i < T * ldy; i++)
                if ((i % ldy < ystep || i % ystep >= rows) && y[i] != -777.0f)
                    fail_msg("%s case %zu: output %lld outside the blocks written", isas[k], c, (long long)i);
        }
        free(w);
        free(y);
        free(x);
        tw_free(&t);
    }
    use_isa(default_isa);
}

/* Several matmuls in one job give exactly what separate calls give, whatever the pool: as pool
 * shares (up to NX_SHARE_MAX_T input rows, claimed piece by piece) and as one split (more). */
static void test_matmul_many(void **state) {
    (void)state;
    tw ws[3];
    tw_make(&ws[0], NX_DTYPE_BF16, 37, 129, 0, 0, NX_DTYPE_F32, 0);
    tw_make(&ws[1], NX_DTYPE_U32, 300, 256, 3, 32, NX_DTYPE_BF16, 1);
    tw_make(&ws[2], NX_DTYPE_F16, 5, 129, 0, 0, NX_DTYPE_F32, 0);
    const int64_t Ts[3] = {1, 3, NX_SHARE_MAX_T + 4};
    for (int nt = 2; nt <= 3; nt++) {
        nx_pool *pool = nx_pool_new(nt);
        assert_non_null(pool);
        for (int k = 0; k < 3; k++) {
            const int64_t T = Ts[k];
            float *x0 = rnd_vec(T * 129), *x1 = rnd_vec(T * 256);
            const float *xs[3] = {x0, x1, x0};
            nx_matmul_task t[3];
            float *sep[3], *many[3];
            for (int i = 0; i < 3; i++) {
                const nx_linear *W = &ws[i].L;
                sep[i] = calloc((size_t)(T * W->out), sizeof(float));
                many[i] = calloc((size_t)(T * W->out), sizeof(float));
                nx_matmul(W, xs[i], W->in, T, sep[i], W->out, NULL);
                t[i] = (nx_matmul_task){W, xs[i], W->in, T, many[i], W->out};
            }
            nx_matmul_many(t, 3, pool);
            for (int i = 0; i < 3; i++) {
                assert_memory_equal(sep[i], many[i], sizeof(float) * (size_t)(T * ws[i].L.out));
                free(sep[i]);
                free(many[i]);
            }
            free(x0);
            free(x1);
        }
        nx_pool_free(pool);
    }
    for (int i = 0; i < 3; i++) tw_free(&ws[i]);
}

/* nx_matmul_shares_*: matmuls shared inside a job the caller runs, around other work: the
 * three first matmuls, a barrier, one thread setting the shares of a fourth that reads the
 * second's output, a barrier, the fourth. Exactly what separate calls give, shared or split. */
typedef struct shares_job {
    nx_pool *pool;
    const nx_matmul_task *first, *second;
    int reset2; /* what thread 0's reset of the second returned */
} shares_job;

static void shares_worker(void *arg, int ith, int nth) {
    shares_job *j = arg;
    /* side spans on the first tasks (hints only: the same bits) */
    const nx_span side[2] = {{j->first[0].x, 4096}, {j->first[1].x, 100}};
    nx_matmul_shares_work(j->first, 3, j->pool, ith, nth, side, 2);
    nx_pool_barrier(j->pool, nth);
    if (ith == 0) j->reset2 = nx_matmul_shares_reset(j->second, 1, j->pool, nth);
    nx_pool_barrier(j->pool, nth);
    nx_matmul_shares_work(j->second, 1, j->pool, ith, nth, NULL, 0);
}

static void test_matmul_shares(void **state) {
    (void)state;
    tw ws[4];
    tw_make(&ws[0], NX_DTYPE_BF16, 37, 129, 0, 0, NX_DTYPE_F32, 0);
    tw_make(&ws[1], NX_DTYPE_U32, 300, 256, 4, 64, NX_DTYPE_BF16, 1);
    tw_make(&ws[2], NX_DTYPE_U32, 64, 256, 3, 32, NX_DTYPE_BF16, 1);
    tw_make(&ws[3], NX_DTYPE_BF16, 41, 300, 0, 0, NX_DTYPE_F32, 0);
    const int64_t Ts[3] = {1, 2, NX_SHARE_MAX_T + 3};
    for (int nt = 1; nt <= 3; nt++) {
        nx_pool *pool = nx_pool_new(nt);
        assert_non_null(pool);
        for (int k = 0; k < 3; k++) {
            const int64_t T = Ts[k];
            float *x0 = rnd_vec(T * 129), *x1 = rnd_vec(T * 256);
            const float *xs[3] = {x0, x1, x1};
            nx_matmul_task t[4];
            float *sep[4], *job[4];
            for (int i = 0; i < 4; i++) {
                const nx_linear *W = &ws[i].L;
                sep[i] = calloc((size_t)(T * W->out), sizeof(float));
                job[i] = calloc((size_t)(T * W->out), sizeof(float));
                /* the fourth reads the second's output */
                nx_matmul(W, i == 3 ? sep[1] : xs[i], W->in, T, sep[i], W->out, NULL);
                t[i] = (nx_matmul_task){W, i == 3 ? job[1] : xs[i], W->in, T, job[i], W->out};
            }
            const int shared = nt > 1 && T <= NX_SHARE_MAX_T;
            assert_int_equal(nx_matmul_shares_reset(t, 3, pool, nt), shared);
            shares_job j = {pool, t, t + 3, -1};
            nx_pool_run(pool, shares_worker, &j);
            assert_int_equal(j.reset2, shared);
            for (int i = 0; i < 4; i++) {
                assert_memory_equal(sep[i], job[i], sizeof(float) * (size_t)(T * ws[i].L.out));
                free(sep[i]);
                free(job[i]);
            }
            free(x0);
            free(x1);
        }
        nx_pool_free(pool);
    }
    for (int i = 0; i < 4; i++) tw_free(&ws[i]);
}

static void test_unaligned(void **state) {
    (void)state;
    tw base[4];
    tw_make(&base[0], NX_DTYPE_F32, 21, 77, 0, 0, NX_DTYPE_F32, 0);
    tw_make(&base[1], NX_DTYPE_F16, 21, 77, 0, 0, NX_DTYPE_F32, 0);
    tw_make(&base[2], NX_DTYPE_BF16, 21, 77, 0, 0, NX_DTYPE_F32, 0);
    tw_make(&base[3], NX_DTYPE_U32, 21, 192, 5, 64, NX_DTYPE_F16, 0);
    for (int w = 0; w < 4; w++) {
        const int64_t T = 3, ldx = base[w].L.in, ldy = base[w].L.out;
        float *x = rnd_vec(T * ldx);
        for (int k = 0; k < n_isas; k++) {
            float *y0 = run_matmul(isas[k], &base[w].L, x, ldx, T, ldy, NULL);
            for (int mis = 1; mis <= 3; mis++) {
                tw c;
                tw_copy(&c, &base[w], mis);
                float *y1 = run_matmul(isas[k], &c.L, x, ldx, T, ldy, NULL);
                assert_memory_equal(y0, y1, (size_t)(T * ldy) * 4);
                free(y1);
                tw_free(&c);
            }
            free(y0);
        }
        free(x);
        tw_free(&base[w]);
    }
    use_isa(default_isa);
}

static void test_get_row(void **state) {
    (void)state;
    const nx_dtype dts[3] = {NX_DTYPE_F32, NX_DTYPE_F16, NX_DTYPE_BF16};
    for (int d = 0; d < 3; d++) {
        tw t;
        tw_make(&t, dts[d], 4, 37, 0, 0, NX_DTYPE_F32, 1);
        for (int k = 0; k < n_isas; k++) {
            assert_int_equal(use_isa(isas[k]), 0);
            float row[37], want[37];
            nx_linear_get_row(&t.L, 2, row);
            nx_to_f32(dts[d], (const uint8_t *)t.L.w + 2 * 37 * es(dts[d]), want, 37);
            assert_memory_equal(row, want, sizeof row);
        }
        tw_free(&t);
    }
    use_isa(default_isa);
}

static void test_force(void **state) {
    (void)state;
    assert_int_equal(nx_kernels_force("ref"), 0);
    assert_string_equal(nx_kernels_isa(), "ref");
    assert_int_equal(nx_kernels_force("sse9"), -1);
    assert_int_equal(nx_kernels_force(NULL), -1);
    assert_string_equal(nx_kernels_isa(), "ref");
    nx_kernels_force(default_isa);
}

/* The activation precision is a setting that takes effect: int8 activations give other
 * (coarser) results than int16 on the 2- and 4-bit shapes they cover (and 3/5/6-bit with VBMI)
 * and leave 8-bit weights exactly as they were; bad values are refused without changing the
 * setting. */
/* nx_exp_weights on every ISA against libm's exp: each weight within 2 ulp (denormal results
 * within 2^-1070), -inf and far-below values 0, the sum within 1e-15 of the weights' own sum;
 * every length from 0 to 40 (the vector tails) and temperatures from 0.05 to 100. */
static void test_exp_weights(void **state) {
    (void)state;
    float x[40];
    double w[40];
    const double temps[] = {0.05, 0.7, 1.0, 100.0};
    for (int k = 0; k < n_isas; k++) {
        assert_int_equal(use_isa(isas[k]), 0);
        for (int n = 0; n <= 40; n++)
            for (int ti = 0; ti < 4; ti++) {
                const float m = 3.5f;
                for (int i = 0; i < n; i++) x[i] = i % 7 == 3 ? -INFINITY : m - (float)(rnd_unit() + 1.0) * 30.0f * (float)(i % 5);
                const double inv_t = 1.0 / temps[ti];
                for (int i = 0; i < n; i++) w[i] = -1.0;
                const double z = nx_exp_weights(x, n, m, inv_t, w);
                double zs = 0.0;
                for (int i = 0; i < n; i++) {
                    const double e = exp(((double)x[i] - (double)m) * inv_t);
                    if (!(fabs(w[i] - e) <= 4.5e-16 * e || fabs(w[i] - e) <= 0x1p-1070))
                        fail_msg("%s n %d T %g: w[%d] = %.17g, exp %.17g", isas[k], n, temps[ti], i, w[i], e);
                    zs += w[i];
                }
                if (!(fabs(z - zs) <= 1e-15 * zs)) fail_msg("%s n %d: sum %.17g, of the weights %.17g", isas[k], n, z, zs);
            }
    }
    use_isa(default_isa);
}

/* The activation precision is the weight's (x16): an act8 variant differs from its int16 twin
 * exactly where the integer kernels take int8. */
static void test_act_bits(void **state) {
    (void)state;
    for (int k = 0; k < n_isas; k++) {
        if (!strstr(isas[k], "+act8")) continue;
        const int bits[] = {2, 3, 4, 5, 6, 8};
        for (int b = 0; b < 6; b++) {
            tw t;
            tw_make(&t, NX_DTYPE_U32, 16, 256, bits[b], 64, NX_DTYPE_BF16, 0);
            float *x = rnd_vec(2 * 256);
            float *y8 = run_matmul(isas[k], &t.L, x, 256, 2, 16, NULL);
            char base[32];
            snprintf(base, sizeof base, "%.*s", (int)(strchr(isas[k], '+') - isas[k]), isas[k]);
            float *y16 = run_matmul(base, &t.L, x, 256, 2, 16, NULL);
            int differ = 0;
            for (int i = 0; i < 32; i++) differ += y8[i] != y16[i];
            const int takes = x_half_step(isas[k], &t.L) > 1.0 / 1000;
            if (takes && differ < 8)
                fail_msg("%s: int8 activations changed only %d of 32 %d-bit outputs", isas[k], differ, bits[b]);
            if (!takes && differ != 0)
                fail_msg("%s: int8 activations changed %d of 32 %d-bit outputs", isas[k], differ, bits[b]);
            if (bits[b] == 8 && takes) fail_msg("%s: 8-bit weights took int8 activations", isas[k]);
            if (bits[b] != 8 && strncmp(isas[k], "avx512vbmi", 10) == 0 && !takes)
                fail_msg("%s: %d-bit weights kept int16 under act8", isas[k], bits[b]);
            free(y8);
            free(y16);
            free(x);
            tw_free(&t);
        }
    }
    use_isa(default_isa);
}

/* Says which variants ran (a TAP diagnostic) and fails unless the best ISA this CPU has (the
 * dispatcher's CPUID choice) was among them, with its int8 variant where it has one: a test
 * list that falls behind the dispatcher must not pass on the ISAs it still knows. */
static void test_isas_covered(void **state) {
    (void)state;
    char line[256] = "";
    for (int k = 0; k < n_isas; k++)
        snprintf(line + strlen(line), sizeof line - strlen(line), "%s%s", k ? " " : "", isas[k]);
    printf("# kernel variants tested: %s (best on this CPU: %s)\n", line, nx_kernels_best_isa());
    const char *best = nx_kernels_best_isa();
    char best8[40], buf[40];
    snprintf(best8, sizeof best8, "%s+act8", best);
    const char *kern = kernels_of(best, buf);
    const int integer = strcmp(kern, "avx512vnni") == 0 || strcmp(kern, "avx512vbmi") == 0 ||
                        strcmp(kern, "neondot") == 0 || strcmp(kern, "neoni8mm") == 0;
    int found = 0, found8 = 0;
    for (int k = 0; k < n_isas; k++) {
        found += strcmp(isas[k], best) == 0;
        found8 += strcmp(isas[k], best8) == 0;
    }
    if (!found) fail_msg("the CPU's best ISA %s was not tested (tested: %s)", best, line);
    if (integer && !found8) fail_msg("%s on int8 activations was not tested (tested: %s)", best, line);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isas_covered),
        cmocka_unit_test(test_pack_reference_words),
        cmocka_unit_test(test_to_f32),
        cmocka_unit_test(test_dot_axpy),
        cmocka_unit_test(test_delta_rule),
        cmocka_unit_test(test_attn_helpers),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_matmul_float_vs_ref),
        cmocka_unit_test(test_matmul_quant_vs_ref),
        cmocka_unit_test(test_side_prefetch),
        cmocka_unit_test(test_matmul_quant_activations),
        cmocka_unit_test(test_matmul_quant_nonfinite),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_prefetch_twins),
        cmocka_unit_test(test_thread_invariance),
        cmocka_unit_test(test_matmul_many),
        cmocka_unit_test(test_matmul_blocks),
        cmocka_unit_test(test_matmul_shares),
        cmocka_unit_test(test_unaligned),
        cmocka_unit_test(test_get_row),
        cmocka_unit_test(test_force),
        cmocka_unit_test(test_act_bits),
        cmocka_unit_test(test_exp_weights),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
