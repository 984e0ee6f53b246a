/* Matmul throughput per weight dtype and batch size: ms per call, GB/s of weight reads and
 * its fraction of the machine's read bandwidth, GFLOP/s. Several copies of the weight are
 * cycled so every call streams from DRAM, as decode does with a model far beyond L3.
 *   kernels [--out 4096] [--in 14336] [--threads N] [--membw GBs] [--ms 400]
 *           [--dtypes f32,f16,bf16,q2,q3,q4,q5,q6,q8] [--T 1,2,4,8,64] [--group 64] [--hot]
 * --hot keeps one copy, so a weight that fits the caches measures the kernel's compute rate
 * (GB/s then means weight bytes consumed per second, not DRAM traffic). NX_ACT_BITS=16 in the
 * environment runs quantized weights on int16 activations (x16), as `--act-bits 16` does. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "base/clock.h"
#include "base/pool.h"
#include "kernels/kernels.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Random but finite contents: bf16/f16 values with small exponents, any packed bits. */
static void fill(uint8_t *p, size_t n, nx_dtype dt) {
    if (dt == NX_DTYPE_F32) {
        for (size_t i = 0; i + 4 <= n; i += 4) {
            float f = (float)(rnd() % 2001) / 1000.0f - 1.0f;
            memcpy(p + i, &f, 4);
        }
    } else if (dt == NX_DTYPE_F16 || dt == NX_DTYPE_BF16) {
        for (size_t i = 0; i + 2 <= n; i += 2) {
            uint16_t h = dt == NX_DTYPE_F16 ? (uint16_t)(0x3000 | (rnd() & 0x83ff))
                                            : (uint16_t)(0x3c00 | (rnd() & 0x807f));
            memcpy(p + i, &h, 2);
        }
    } else {
        for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
    }
}

/* The in-process bandwidth probe used when --membw is not given (same method as membw). */
typedef struct bw_job {
    const uint64_t *buf;
    size_t n;
    uint64_t sink[64];
} bw_job;

static void bw_fn(void *arg, int ith, int nth) {
    bw_job *j = arg;
    long long b, e;
    nx_pool_split((long long)j->n, ith, nth, &b, &e);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (long long i = b; i + 4 <= e; i += 4) {
        s0 += j->buf[i];
        s1 += j->buf[i + 1];
        s2 += j->buf[i + 2];
        s3 += j->buf[i + 3];
    }
    j->sink[ith] = s0 + s1 + s2 + s3;
}

static double measure_membw(nx_pool *pool) {
    size_t n = (size_t)512 << 17; /* 512 MB of u64 */
    uint64_t *buf = malloc(n * 8);
    if (!buf) return 0;
    memset(buf, 1, n * 8);
    bw_job j = {.buf = buf, .n = n};
    double best = 0;
    for (int r = 0; r < 4; r++) {
        double t0 = nx_now_s();
        nx_pool_run(pool, bw_fn, &j);
        double g = (double)n * 8 / (nx_now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(buf);
    return best;
}

typedef struct wspec {
    const char *name;
    nx_dtype dtype;
    int bits;
} wspec;

static const wspec specs[] = {
    {"f32", NX_DTYPE_F32, 0}, {"f16", NX_DTYPE_F16, 0}, {"bf16", NX_DTYPE_BF16, 0},
    {"q2", NX_DTYPE_U32, 2},  {"q3", NX_DTYPE_U32, 3},  {"q4", NX_DTYPE_U32, 4},
    {"q5", NX_DTYPE_U32, 5},  {"q6", NX_DTYPE_U32, 6},  {"q8", NX_DTYPE_U32, 8},
};

int main(int argc, char **argv) {
    int64_t out = 4096, in = 14336;
    int threads = 0, group = 64, hot = 0;
    const char *act_env = getenv("NX_ACT_BITS");
    const bool act16 = act_env && strcmp(act_env, "16") == 0;
    double membw = 0, budget_ms = 400;
    const char *dtypes = "f32,f16,bf16,q2,q3,q4,q5,q6,q8", *Ts = "1,2,4,8,64";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--hot")) {
            hot = 1;
            continue;
        }
        if (!v) goto usage;
        if (!strcmp(a, "--out")) out = atoll(v);
        else if (!strcmp(a, "--in")) in = atoll(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--membw")) membw = atof(v);
        else if (!strcmp(a, "--ms")) budget_ms = atof(v);
        else if (!strcmp(a, "--dtypes")) dtypes = v;
        else if (!strcmp(a, "--T")) Ts = v;
        else if (!strcmp(a, "--group")) group = atoi(v);
        else goto usage;
        i++;
    }
    if (out < 1 || in < 1 || group < 32 || group % 32 || budget_ms <= 0) goto usage;
    nx_pool *pool = nx_pool_new(threads);
    if (!pool) return 1;
    if (membw <= 0) membw = measure_membw(pool);
    printf("# isa=%s threads=%d membw=%.2f GB/s out=%lld in=%lld group=%d%s\n", nx_kernels_isa(),
           nx_pool_size(pool), membw, (long long)out, (long long)in, group,
           hot ? " hot (one cache-resident copy)" : "");

    int64_t maxT = 1;
    for (const char *p = Ts; *p;) {
        int64_t t = atoll(p);
        if (t > maxT) maxT = t;
        p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
    }
    float *x = malloc((size_t)(maxT * in) * sizeof *x), *y = malloc((size_t)(maxT * out) * sizeof *y);
    if (!x || !y) return 1;
    for (int64_t i = 0; i < maxT * in; i++) x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;

    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        const wspec *sp = &specs[s];
        /* whole-word match in the comma list */
        size_t nl = strlen(sp->name);
        const char *hit = dtypes;
        int found = 0;
        while ((hit = strstr(hit, sp->name))) {
            if ((hit == dtypes || hit[-1] == ',') && (hit[nl] == ',' || hit[nl] == 0)) found = 1;
            hit += nl;
        }
        if (!found) continue;
        if (sp->dtype == NX_DTYPE_U32 && in % group) continue;

        nx_linear W = {.dtype = sp->dtype, .out = out, .in = in, .bits = sp->bits,
                       .group = group, .sdtype = NX_DTYPE_BF16, .x16 = act16};
        size_t wbytes = sp->dtype == NX_DTYPE_U32 ? (size_t)out * (size_t)in * sp->bits / 8
                                                  : (size_t)out * (size_t)in * nx_dtype_size(sp->dtype);
        size_t sbytes = sp->dtype == NX_DTYPE_U32 ? (size_t)out * (size_t)(in / group) * 2 : 0;
        W.w = (void *)1; /* for nx_linear_bytes */
        W.scales = W.biases = sbytes ? (void *)1 : NULL;
        size_t total = nx_linear_bytes(&W);
        /* enough copies that a pass over all of them is >= 256 MB: no call is served by L3 */
        int ncopies = (int)((256u << 20) / total) + 1;
        if (hot) ncopies = 1;
        /* the copies in one arena on 2 MB pages where the kernel gives them, as the engine maps
         * a model file (docs/kernels.md); each copy 4 KB-aligned */
        const size_t cstride = (wbytes + 2 * sbytes + 4095) & ~(size_t)4095, huge = (size_t)2 << 20;
        const size_t abytes = ((size_t)ncopies * cstride + huge - 1) & ~(huge - 1);
        nx_linear *Ws = calloc((size_t)ncopies, sizeof *Ws);
        uint8_t **bufs = calloc((size_t)ncopies, sizeof *bufs), *arena = aligned_alloc(huge, abytes);
        if (!Ws || !bufs || !arena) return 1;
        (void)madvise(arena, abytes, MADV_HUGEPAGE);
        for (int c = 0; c < ncopies; c++) {
            bufs[c] = arena + (size_t)c * cstride;
            fill(bufs[c], wbytes, sp->dtype);
            fill(bufs[c] + wbytes, 2 * sbytes, NX_DTYPE_BF16);
            Ws[c] = W;
            Ws[c].w = bufs[c];
            Ws[c].scales = sbytes ? bufs[c] + wbytes : NULL;
            Ws[c].biases = sbytes ? bufs[c] + wbytes + sbytes : NULL;
        }
        for (const char *p = Ts; *p;) {
            int64_t T = atoll(p);
            p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
            if (T < 1) continue;
            nx_matmul(&Ws[0], x, in, T, y, out, pool); /* warm-up */
            double best = 1e30, sum = 0;
            int calls = 0;
            double start = nx_now_s();
            while ((nx_now_s() - start) * 1e3 < budget_ms || calls < 3) {
                double t0 = nx_now_s();
                nx_matmul(&Ws[calls % ncopies], x, in, T, y, out, pool);
                double dt = nx_now_s() - t0;
                if (dt < best) best = dt;
                sum += dt;
                calls++;
            }
            double mean = sum / calls;
            double gbs = (double)total / mean / 1e9;
            double gflops = 2.0 * (double)out * (double)in * (double)T / mean / 1e9;
            printf("%-5s T=%-3lld %9.3f ms/call (best %8.3f)  %7.2f GB/s  %5.1f%% of membw  %8.2f GFLOP/s\n",
                   sp->name, (long long)T, mean * 1e3, best * 1e3, gbs, 100 * gbs / membw, gflops);
            printf("bench=matmul isa=%s dtype=%s bits=%d group=%d out=%lld in=%lld T=%lld threads=%d "
                   "ms=%.4f best_ms=%.4f weight_bytes=%zu gbs=%.3f membw_frac=%.4f gflops=%.3f\n",
                   nx_kernels_isa(), sp->name, sp->bits, sp->dtype == NX_DTYPE_U32 ? group : 0,
                   (long long)out, (long long)in, (long long)T, nx_pool_size(pool), mean * 1e3,
                   best * 1e3, total, gbs, gbs / membw, gflops);
            fflush(stdout);
        }
        free(arena);
        free(bufs);
        free(Ws);
    }
    free(x);
    free(y);
    nx_pool_free(pool);
    return 0;
usage:
    fprintf(stderr,
            "usage: %s [--out N] [--in N] [--threads N] [--membw GB/s] [--ms budget] "
            "[--dtypes f32,f16,bf16,q2,q3,q4,q5,q6,q8] [--T 1,2,4,8,64] [--group 64] [--hot]\n",
            argv[0]);
    return 2;
}
