/* Picks the kernel table once from CPUID (or NX_ISA=ref|avx2|avx2vnni|avx512|avx512vnni|avx512vbmi; on
 * AArch64 from the feature registers as the OS reports them, NX_ISA=ref|neon|neondot|neoni8mm) and
 * fronts it with the public kernel API; no arithmetic of its own (a NULL table entry is the
 * reference's). nx_matmul splits output rows over the pool in 16-row chunks; since every
 * kernel computes each output element in a fixed order, the split never changes a result. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#define NX_X86 1
#include <cpuid.h>
#elif defined(__aarch64__)
#define NX_ARM64 1
#if defined(__linux__)
#include <sys/auxv.h>
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#endif

static _Atomic(const nx_kernel_table *) g_table;

#if NX_X86
/* F16C straight from CPUID leaf 1 (ECX bit 29): not every compiler's
 * __builtin_cpu_supports knows the name. */
static int cpu_has_f16c(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
#else
    return 0;
#endif
}

static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}

/* AVX-VNNI (the VEX-encoded vpdpbusd on ymm): CPUID leaf 7 subleaf 1, EAX bit 4. */
static int cpu_has_avxvnni(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    return cpu_has_avx2() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
#else
    return 0;
#endif
}

static int cpu_has_avx512(void) {
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
}

static int cpu_has_avx512vnni(void) {
    __builtin_cpu_init();
    return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
}

static int cpu_has_avx512vbmi(void) {
    __builtin_cpu_init();
    return cpu_has_avx512vnni() && __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni");
}
#endif

#if NX_ARM64
/* Linux: the kernel's hwcaps (HWCAP_ASIMDDP, HWCAP2_I8MM); macOS: the hw.optional.arm sysctls.
 * Elsewhere plain NEON only (Advanced SIMD is part of the AArch64 base). */
#if defined(__APPLE__)
static int arm_sysctl(const char *name) {
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname(name, &v, &len, NULL, 0) == 0 && v != 0;
}
#endif

static int cpu_has_neondot(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & (1ul << 20)) != 0; /* HWCAP_ASIMDDP */
#elif defined(__APPLE__)
    return arm_sysctl("hw.optional.arm.FEAT_DotProd");
#else
    return 0;
#endif
}

static int cpu_has_neoni8mm(void) {
#if defined(__linux__)
    return cpu_has_neondot() && (getauxval(AT_HWCAP2) & (1ul << 13)) != 0; /* HWCAP2_I8MM */
#elif defined(__APPLE__)
    return cpu_has_neondot() && arm_sysctl("hw.optional.arm.FEAT_I8MM");
#else
    return 0;
#endif
}
#endif

/* The table for `isa`, or NULL if unknown or not runnable here. */
static const nx_kernel_table *table_by_name(const char *isa) {
    if (strcmp(isa, "ref") == 0) return &nx_kernels_ref;
#if NX_ARM64
    if (strcmp(isa, "neon") == 0) return &nx_kernels_neon;
    if (strcmp(isa, "neondot") == 0) return cpu_has_neondot() ? &nx_kernels_neondot : NULL;
    if (strcmp(isa, "neoni8mm") == 0) return cpu_has_neoni8mm() ? &nx_kernels_neoni8mm : NULL;
#endif
#if NX_X86
    if (strcmp(isa, "avx2") == 0) return cpu_has_avx2() ? &nx_kernels_avx2 : NULL;
    if (strcmp(isa, "avx2vnni") == 0) return cpu_has_avxvnni() ? &nx_kernels_avx2vnni : NULL;
    if (strcmp(isa, "avx512") == 0) return cpu_has_avx512() ? &nx_kernels_avx512 : NULL;
    if (strcmp(isa, "avx512vnni") == 0) return cpu_has_avx512vnni() ? &nx_kernels_avx512vnni : NULL;
    if (strcmp(isa, "avx512vbmi") == 0) return cpu_has_avx512vbmi() ? &nx_kernels_avx512vbmi : NULL;
    if (strcmp(isa, "avx512-t0") == 0) return cpu_has_avx512() ? &nx_kernels_avx512_t0 : NULL;
    if (strcmp(isa, "avx512vnni-t0") == 0) return cpu_has_avx512vnni() ? &nx_kernels_avx512vnni_t0 : NULL;
    if (strcmp(isa, "avx512vbmi-t0") == 0) return cpu_has_avx512vbmi() ? &nx_kernels_avx512vbmi_t0 : NULL;
#endif
    return NULL;
}

static const nx_kernel_table *table_best(void) {
#if NX_ARM64
    return cpu_has_neoni8mm() ? &nx_kernels_neoni8mm : cpu_has_neondot() ? &nx_kernels_neondot : &nx_kernels_neon;
#elif NX_X86
    /* the weight prefetches Intel's cores stream faster (avx512_common.h, QPF_HINT) */
    __builtin_cpu_init();
    const int t0 = __builtin_cpu_is("intel");
    return cpu_has_avx512vbmi()   ? (t0 ? &nx_kernels_avx512vbmi_t0 : &nx_kernels_avx512vbmi)
           : cpu_has_avx512vnni() ? (t0 ? &nx_kernels_avx512vnni_t0 : &nx_kernels_avx512vnni)
           : cpu_has_avx512()     ? (t0 ? &nx_kernels_avx512_t0 : &nx_kernels_avx512)
           : cpu_has_avxvnni()    ? &nx_kernels_avx2vnni
           : cpu_has_avx2()       ? &nx_kernels_avx2
                                  : &nx_kernels_ref;
#else
    return &nx_kernels_ref;
#endif
}

static const nx_kernel_table *table_get(void) {
    const nx_kernel_table *t = atomic_load_explicit(&g_table, memory_order_acquire);
    if (t) return t;
    /* Racing first calls all compute the same answer, so a plain store is enough. */
    const char *env = getenv("NX_ISA");
    if (env && *env) t = table_by_name(env);
    if (!t) t = table_best();
    atomic_store_explicit(&g_table, t, memory_order_release);
    return t;
}

/* The table that has entry f: the chosen one, else the reference. */
#define KT(f) (table_get()->f ? table_get() : &nx_kernels_ref)

const char *nx_kernels_isa(void) { return table_get()->name; }
const char *nx_kernels_best_isa(void) { return table_best()->name; }

int nx_kernels_force(const char *isa) {
    const nx_kernel_table *t = isa ? table_by_name(isa) : NULL;
    if (!t) return -1;
    atomic_store_explicit(&g_table, t, memory_order_release);
    return 0;
}

nx_kscratch *nx_kscratch_of(nx_pool *pool, int ith) { return nx_pool_scratch(pool, ith); }

nx_kscratch *nx_kscratch_new(void) {
    nx_kscratch *s = aligned_alloc(64, sizeof *s);
    if (s) memset(s, 0, sizeof *s);
    return s;
}

void nx_kscratch_free(nx_kscratch *s) { free(s); }

/* Rows [o0, o1) on the calling thread with scratch s (non-NULL). */
static void matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy,
                        int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s) {
    if (o0 < 0) o0 = 0;
    if (o1 > W->out) o1 = W->out;
    if (T <= 0 || o1 <= o0) return;
    if (W->dtype == NX_DTYPE_U32 && !nx_quant_shape_ok(W)) return; /* the loader rejects these */
    /* the kernels may trust the hint's rows to be inside its weight */
    nx_rows nx = {0};
    if (next && next->W && !(next->W->dtype == NX_DTYPE_U32 && !nx_quant_shape_ok(next->W))) {
        nx = *next;
        if (nx.r0 < 0) nx.r0 = 0;
        if (nx.r1 > nx.W->out) nx.r1 = nx.W->out;
    }
    const nx_rows *hint = nx.W && nx.r1 > nx.r0 ? &nx : NULL;
    const nx_kernel_table *k = table_get();
    if (!k->matmul_rows(W, x, ldx, T, y, ldy, o0, o1, hint, s))
        nx_kernels_ref.matmul_rows(W, x, ldx, T, y, ldy, o0, o1, NULL, s);
}

/* The reference computes calls that cannot get a scratch of their own (out of memory). */
void nx_matmul_rows_then(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y,
                         int64_t ldy, int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s) {
    nx_kscratch *own = s ? NULL : nx_kscratch_new();
    if (s || own) matmul_rows(W, x, ldx, T, y, ldy, o0, o1, next, s ? s : own);
    else if (W->dtype != NX_DTYPE_U32 || nx_quant_shape_ok(W))
        nx_kernels_ref.matmul_rows(W, x, ldx, T, y, ldy, o0 < 0 ? 0 : o0, o1 > W->out ? W->out : o1, NULL, NULL);
    nx_kscratch_free(own);
}

void nx_side_set(nx_side_pf *s, const nx_span *spans, int n) {
    s->n = s->i = 0;
    for (int k = 0; k < n && s->n < NX_SIDE_SPANS; k++) {
        if (!spans[k].p || !spans[k].len) continue;
        const uintptr_t a = (uintptr_t)spans[k].p;
        s->p[s->n] = a & ~(uintptr_t)63;
        s->end[s->n++] = a + spans[k].len;
    }
    if (s->n) s->at = s->p[0];
}

/* Blocks [k0, k1) as calls of their own, each naming the next block's rows (the last, next). */
static void blocks_by_rows(const nx_blocks *B, int64_t k0, int64_t k1, const nx_rows *next, nx_kscratch *s) {
    for (int64_t k = k0; k < k1; k++) {
        const nx_linear Wk = nx_linear_rows(B->W, k * B->rstride, B->rows),
                        Wn = nx_linear_rows(B->W, (k + 1 < k1 ? k + 1 : k) * B->rstride, B->rows);
        const nx_rows nr = {&Wn, 0, B->rows};
        nx_matmul_rows_then(&Wk, B->x + k * B->xstep, B->ldx, B->T, B->y + k * B->ystep, B->ldy, 0, B->rows,
                            k + 1 < k1 ? &nr : next, s);
    }
}

void nx_matmul_blocks(const nx_blocks *B, int64_t k0, int64_t k1, const nx_rows *next, nx_kscratch *s) {
    const nx_linear *W = B->W;
    if (k0 < 0) k0 = 0;
    if (B->rows <= 0 || B->T <= 0 || k1 <= k0 || (k1 - 1) * B->rstride + B->rows > W->out) return;
    if (W->dtype == NX_DTYPE_U32 && !nx_quant_shape_ok(W)) return; /* the loader rejects these */
    const nx_kernel_table *k = table_get();
    nx_kscratch *own = s ? NULL : nx_kscratch_new();
    const int valid_next = !next || (next->W && !(next->W->dtype == NX_DTYPE_U32 && !nx_quant_shape_ok(next->W)) &&
                                     next->r0 >= 0 && next->r1 <= next->W->out && next->r1 > next->r0);
    if ((s || own) && k->matmul_blocks && k->matmul_blocks(B, k0, k1, valid_next ? next : NULL, s ? s : own)) {
        nx_kscratch_free(own);
        return;
    }
    nx_kscratch_free(own);
    blocks_by_rows(B, k0, k1, next, s);
}

void nx_matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y,
                    int64_t ldy, int64_t o0, int64_t o1, nx_kscratch *s) {
    nx_matmul_rows_then(W, x, ldx, T, y, ldy, o0, o1, NULL, s);
}

/* Rows are handed out in chunks of this many so each thread's kernel works on whole register
 * blocks and no two threads write the same cache line of y. */
#define MATMUL_CHUNK 16

/* The output rows of all tasks are cut into chunks (the tasks' chunks numbered one after the
 * other) and shared across the threads, so several small matmuls cost one pool wake-up instead
 * of one each. */
typedef struct matmul_job {
    const nx_matmul_task *t;
    int n;
    long long chunks;
    nx_pool *pool;     /* non-NULL: the chunks are its shares (matmul_share_reset) */
    nx_pool *sp;       /* whose threads' scratch the calls use */
    nx_kscratch *own;  /* else this one (a call outside a pool) */
} matmul_job;

static int task_counts(const nx_matmul_task *t) { return t->T > 0 && t->W->out > 0; }
static long long task_chunks(const nx_matmul_task *t) {
    return task_counts(t) ? (t->W->out + MATMUL_CHUNK - 1) / MATMUL_CHUNK : 0;
}

int nx_rows_of_units(const nx_linear *W, int64_t unit, long long base, long long b, long long e, nx_rows *r) {
    const long long nc = (W->out + unit - 1) / unit;
    const long long lo = b > base ? b : base, hi = e < base + nc ? e : base + nc;
    const int64_t r1 = (hi - base) * unit;
    *r = (nx_rows){W, (lo - base) * unit, r1 < W->out ? r1 : W->out};
    return lo < hi;
}

/* The rows of the first of tasks t[0..n) (their chunks numbered from base) with chunks in
 * [b, e): 0 if none. */
static int tasks_rows_at(const nx_matmul_task *t, int n, long long base, long long b, long long e, nx_rows *r) {
    for (int i = 0; i < n && base < e; i++) {
        if (task_counts(&t[i]) && nx_rows_of_units(t[i].W, MATMUL_CHUNK, base, b, e, r)) return 1;
        base += task_chunks(&t[i]);
    }
    return 0;
}

/* Chunks [b, e) of the tasks, each call naming the rows read next: the next task's chunks in
 * range, or after (NULL: none) past the range's end. */
static void tasks_run(const nx_matmul_task *t, int n, long long b, long long e, const nx_rows *after,
                      nx_kscratch *s) {
    long long base = 0;
    for (int i = 0; i < n && base < e; i++) {
        const nx_matmul_task *ti = &t[i];
        const long long nc = task_chunks(ti);
        nx_rows r, nr;
        if (nc && nx_rows_of_units(ti->W, MATMUL_CHUNK, base, b, e, &r)) {
            const nx_rows *next = tasks_rows_at(t + i + 1, n - i - 1, base + nc, b, e, &nr) ? &nr
                                  : base + nc >= e                                          ? after
                                                                                           : NULL;
            matmul_rows(ti->W, ti->x, ti->ldx, ti->T, ti->y, ti->ldy, r.r0, r.r1, next, s);
        }
        base += nc;
    }
}

/* j's chunks as pool shares for nth threads (nx_pool_share_reset's result). */
static int matmul_share_reset(const matmul_job *j, int nth) {
    size_t unit = 0;
    for (int i = 0; i < j->n && !unit; i++)
        if (task_chunks(&j->t[i])) unit = MATMUL_CHUNK * nx_linear_row_bytes(j->t[i].W);
    /* pieces of at least ~32 KB of weights (a call's fixed cost is ~0.3-1 µs), halving as a
     * thread's own chunk runs out */
    long long min_piece = unit ? (long long)(32768 / unit) : 1;
    if (min_piece < 1) min_piece = 1;
    return nx_pool_share_reset(j->pool, nth, j->chunks, min_piece, j->chunks);
}

/* Shares claimed and run until none is left, each piece's last call naming where the thread's
 * next piece most likely begins; or the thread's one chunk of a split. */
static void matmul_worker(void *arg, int ith, int nth) {
    const matmul_job *j = arg;
    nx_kscratch *s = j->own ? j->own : nx_kscratch_of(j->sp, ith);
    long long b, e, nb, ne;
    if (!j->pool) {
        nx_pool_split(j->chunks, ith, nth, &b, &e);
        tasks_run(j->t, j->n, b, e, NULL, s);
        return;
    }
    while (nx_pool_share_next(j->pool, ith, &b, &e)) {
        nx_pool_share_peek(j->pool, ith, &nb, &ne);
        nx_rows nr;
        tasks_run(j->t, j->n, b, e, nb < ne && tasks_rows_at(j->t, j->n, 0, nb, ne, &nr) ? &nr : NULL, s);
    }
}

/* Whether nth threads of pool can share the output rows of tasks t[0..n) (T at most
 * NX_SHARE_MAX_T; the conditions under which matmul_share_reset succeeds), counting their
 * chunks into *chunks. */
static int can_share(const nx_matmul_task *t, int n, nx_pool *pool, int nth, long long *chunks) {
    int few = 1;
    *chunks = 0;
    for (int i = 0; i < n; i++) {
        *chunks += task_chunks(&t[i]);
        few = few && t[i].T <= NX_SHARE_MAX_T;
    }
    return few && pool && nth > 1 && nth <= nx_pool_size(pool) && *chunks <= (long long)UINT32_MAX;
}

/* Thread ith's split of the tasks by the reference kernel (no scratch to be had). */
static void tasks_ref(const nx_matmul_task *t, int n, int ith, int nth) {
    for (int i = 0; i < n; i++) {
        long long b, e;
        if (!task_counts(&t[i]) || (t[i].W->dtype == NX_DTYPE_U32 && !nx_quant_shape_ok(t[i].W))) continue;
        nx_pool_split(t[i].W->out, ith, nth, &b, &e);
        nx_kernels_ref.matmul_rows(t[i].W, t[i].x, t[i].ldx, t[i].T, t[i].y, t[i].ldy, b, e, NULL, NULL);
    }
}

int nx_matmul_shares_reset(const nx_matmul_task *t, int n, nx_pool *pool, int nth) {
    long long chunks;
    if (!can_share(t, n, pool, nth, &chunks)) return 0;
    const matmul_job j = {t, n, chunks, pool, pool, NULL};
    return matmul_share_reset(&j, nth) == 0;
}

void nx_matmul_shares_work(const nx_matmul_task *t, int n, nx_pool *pool, int ith, int nth, const nx_span *side,
                           int nside) {
    matmul_job j = {t, n, 0, NULL, pool, NULL};
    if (can_share(t, n, pool, nth, &j.chunks)) j.pool = pool;
    if (!j.chunks) return;
    nx_kscratch *s = nx_kscratch_of(pool, ith);
    if (!s) j.own = s = nx_kscratch_new();
    if (!s) { /* out of memory outside a pool */
        tasks_ref(t, n, ith, nth);
        return;
    }
    nx_side_set(&s->side, side, nside);
    matmul_worker(&j, ith, nth);
    nx_side_set(&s->side, NULL, 0);
    nx_kscratch_free(j.own);
}

void nx_matmul_many(const nx_matmul_task *t, int n, nx_pool *pool) {
    matmul_job j = {t, n, 0, NULL, pool, NULL};
    double work = 0;
    for (int i = 0; i < n; i++)
        if (task_counts(&t[i])) work += (double)t[i].W->out * (double)t[i].W->in * (double)t[i].T;
    const int share = can_share(t, n, pool, nx_pool_size(pool), &j.chunks);
    if (j.chunks == 0) return;
    /* A pool job costs a few microseconds (the wake-up, and each thread's first weight lines
     * arriving unprefetched): not worth it below 256K multiply-adds per call (a MoE router). */
    if (nx_pool_size(pool) <= 1 || work < 262144 || j.chunks < 2) {
        if (!pool && !(j.own = nx_kscratch_new())) {
            tasks_ref(t, n, 0, 1);
            return;
        }
        matmul_worker(&j, 0, 1);
        nx_kscratch_free(j.own);
        return;
    }
    /* Shared rather than split (decode and verify): a thread that is ahead (the other started
     * late, or streams slower) takes over the end of the other's rows instead of idling. */
    if (share) {
        j.pool = pool;
        if (matmul_share_reset(&j, nx_pool_size(pool)) != 0) j.pool = NULL;
    }
    nx_pool_run(pool, matmul_worker, &j);
}

void nx_matmul(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y,
               int64_t ldy, nx_pool *pool) {
    const nx_matmul_task t = {W, x, ldx, T, y, ldy};
    nx_matmul_many(&t, 1, pool);
}

void nx_linear_get_row(const nx_linear *W, int64_t r, float *out) {
    if (r < 0 || r >= W->out) return;
    if (W->dtype == NX_DTYPE_U32) {
        if (nx_quant_shape_ok(W)) nx_ref_quant_row(W, r, out);
        return;
    }
    size_t es = nx_dtype_size(W->dtype);
    KT(to_f32)->to_f32(W->dtype, (const uint8_t *)W->w + (size_t)r * (size_t)W->in * es, out, W->in);
}

void nx_to_f32(nx_dtype t, const void *src, float *dst, int64_t n) {
    if (n <= 0) return;
    KT(to_f32)->to_f32(t, src, dst, n);
}

float nx_dot_f32(const float *a, const float *b, int64_t n) { return KT(dot_f32)->dot_f32(a, b, n); }

void nx_axpy_f32(float a, const float *x, float *y, int64_t n) { KT(axpy_f32)->axpy_f32(a, x, y, n); }

void nx_attn_scores(const float *q, int64_t g, const void *K, nx_dtype kvt, int64_t stride, int64_t n, int64_t hd,
                    float scale, float *out, int64_t ldo) {
    KT(attn_scores)->attn_scores(q, g, K, kvt, stride, n, hd, scale, out, ldo);
}

void nx_attn_accum(const float *w, int64_t ldw, int64_t g, const void *V, nx_dtype kvt, int64_t stride, int64_t n,
                   int64_t hd, float *o) {
    KT(attn_accum)->attn_accum(w, ldw, g, V, kvt, stride, n, hd, o);
}

float nx_exp_shift_f32(float *x, int64_t n, float *mx) {
    return KT(exp_shift_f32)->exp_shift_f32(x, n, mx);
}

void nx_softmax_f32(float *x, int64_t n) {
    if (n <= 0) return;
    float mx;
    const float inv = 1.0f / nx_exp_shift_f32(x, n, &mx);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

double nx_exp_weights(const float *x, int64_t n, float m, double inv_t, double *w) {
    return n > 0 ? KT(exp_weights)->exp_weights(x, n, m, inv_t, w) : 0.0;
}

/* The SIMD argmax indexes in int32 lanes: longer vectors go to the reference. */
int64_t nx_argmax_f32(float *x, int64_t n, float *max) {
    const nx_kernel_table *t = n > 0 && n <= INT32_MAX ? KT(argmax_f32) : &nx_kernels_ref;
    return t->argmax_f32(x, n, max);
}

void nx_rmsnorm_f32(const float *x, const float *w, float eps, int64_t n, float *out) {
    if (n > 0) KT(rmsnorm_f32)->rmsnorm_f32(x, w, eps, n, out);
}

void nx_delta_rule_f32(const float *src, float *dst, int64_t dk, int64_t dv, const float *k, const float *v,
                       float decay, float beta, const float *q, float *o) {
    KT(delta_rule_f32)->delta_rule_f32(src, dst, dk, dv, k, v, decay, beta, q, o);
}

void nx_swiglu_f32(float *g, const float *u, int64_t n) {
    if (n > 0) KT(swiglu_f32)->swiglu_f32(g, u, n);
}
