/* Picks the kernel table once from CPUID (or NX_ISA=ref|avx2|avx512|avx512vnni|avx512vbmi) and fronts it with the
 * public kernel API. nx_matmul splits output rows over the pool in 16-row chunks; since every
 * kernel computes each output element in a fixed order, the split never changes a result. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static _Atomic(const nx_kernel_table *) g_table;

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

/* The table for `isa`, or NULL if unknown or not runnable here. */
static const nx_kernel_table *table_by_name(const char *isa) {
    if (strcmp(isa, "ref") == 0) return &nx_kernels_ref;
    if (strcmp(isa, "avx2") == 0) return cpu_has_avx2() ? &nx_kernels_avx2 : NULL;
    if (strcmp(isa, "avx512") == 0) return cpu_has_avx512() ? &nx_kernels_avx512 : NULL;
    if (strcmp(isa, "avx512vnni") == 0) return cpu_has_avx512vnni() ? &nx_kernels_avx512vnni : NULL;
    if (strcmp(isa, "avx512vbmi") == 0) return cpu_has_avx512vbmi() ? &nx_kernels_avx512vbmi : NULL;
    return NULL;
}

static const nx_kernel_table *table_get(void) {
    const nx_kernel_table *t = atomic_load_explicit(&g_table, memory_order_acquire);
    if (t) return t;
    /* Racing first calls all compute the same answer, so a plain store is enough. */
    const char *env = getenv("NX_ISA");
    if (env && *env) t = table_by_name(env);
    if (!t) t = cpu_has_avx512vbmi()   ? &nx_kernels_avx512vbmi
                : cpu_has_avx512vnni() ? &nx_kernels_avx512vnni
                : cpu_has_avx512() ? &nx_kernels_avx512
                : cpu_has_avx2() ? &nx_kernels_avx2
                                 : &nx_kernels_ref;
    atomic_store_explicit(&g_table, t, memory_order_release);
    return t;
}

/* 0 until first asked: then NX_ACT_BITS (8 or 16), else 8 */
static _Atomic int g_act_bits;

int nx_kernels_set_act_bits(int bits) {
    if (bits != 8 && bits != 16) return -1;
    atomic_store_explicit(&g_act_bits, bits, memory_order_relaxed);
    return 0;
}

int nx_kernels_act_bits(void) {
    int b = atomic_load_explicit(&g_act_bits, memory_order_relaxed);
    if (b) return b;
    const char *env = getenv("NX_ACT_BITS");
    b = env && strcmp(env, "16") == 0 ? 16 : 8;
    atomic_store_explicit(&g_act_bits, b, memory_order_relaxed);
    return b;
}

const char *nx_kernels_isa(void) { return table_get()->name; }

int nx_kernels_force(const char *isa) {
    const nx_kernel_table *t = isa ? table_by_name(isa) : NULL;
    if (!t) return -1;
    atomic_store_explicit(&g_table, t, memory_order_release);
    return 0;
}

void nx_matmul_rows_then(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y,
                         int64_t ldy, int64_t o0, int64_t o1, const nx_rows *next) {
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
    if (!k->matmul_rows(W, x, ldx, T, y, ldy, o0, o1, hint))
        nx_kernels_ref.matmul_rows(W, x, ldx, T, y, ldy, o0, o1, NULL);
}

static _Thread_local nx_side_pf nx_side;

nx_side_pf *nx_side_state(void) {
    return &nx_side;
}

void nx_prefetch_side(const nx_span *spans, int n) {
    nx_side_pf *s = &nx_side;
    s->n = s->i = 0;
    for (int k = 0; k < n && s->n < NX_SIDE_SPANS; k++) {
        if (!spans[k].p || !spans[k].len) continue;
        const uintptr_t a = (uintptr_t)spans[k].p;
        s->p[s->n] = a & ~(uintptr_t)63;
        s->end[s->n++] = a + spans[k].len;
    }
    if (s->n) s->at = s->p[0];
}

void nx_matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y,
                    int64_t ldy, int64_t o0, int64_t o1) {
    nx_matmul_rows_then(W, x, ldx, T, y, ldy, o0, o1, NULL);
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
    nx_pool *pool; /* non-NULL: the chunks are its shares (matmul_share_reset) */
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
static void tasks_run(const nx_matmul_task *t, int n, long long b, long long e, const nx_rows *after) {
    long long base = 0;
    for (int i = 0; i < n && base < e; i++) {
        const nx_matmul_task *ti = &t[i];
        const long long nc = task_chunks(ti);
        nx_rows r, nr;
        if (nc && nx_rows_of_units(ti->W, MATMUL_CHUNK, base, b, e, &r)) {
            const nx_rows *next = tasks_rows_at(t + i + 1, n - i - 1, base + nc, b, e, &nr) ? &nr
                                  : base + nc >= e                                          ? after
                                                                                           : NULL;
            nx_matmul_rows_then(ti->W, ti->x, ti->ldx, ti->T, ti->y, ti->ldy, r.r0, r.r1, next);
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
    long long b, e, nb, ne;
    if (!j->pool) {
        nx_pool_split(j->chunks, ith, nth, &b, &e);
        tasks_run(j->t, j->n, b, e, NULL);
        return;
    }
    while (nx_pool_share_next(j->pool, ith, &b, &e)) {
        nx_pool_share_peek(j->pool, ith, &nb, &ne);
        nx_rows nr;
        tasks_run(j->t, j->n, b, e, nb < ne && tasks_rows_at(j->t, j->n, 0, nb, ne, &nr) ? &nr : NULL);
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

int nx_matmul_shares_reset(const nx_matmul_task *t, int n, nx_pool *pool, int nth) {
    long long chunks;
    if (!can_share(t, n, pool, nth, &chunks)) return 0;
    const matmul_job j = {t, n, chunks, pool};
    return matmul_share_reset(&j, nth) == 0;
}

void nx_matmul_shares_work(const nx_matmul_task *t, int n, nx_pool *pool, int ith, int nth) {
    matmul_job j = {t, n, 0, NULL};
    if (can_share(t, n, pool, nth, &j.chunks)) j.pool = pool;
    if (j.chunks) matmul_worker(&j, ith, nth);
}

void nx_matmul_many(const nx_matmul_task *t, int n, nx_pool *pool) {
    matmul_job j = {t, n, 0, NULL};
    double work = 0;
    for (int i = 0; i < n; i++)
        if (task_counts(&t[i])) work += (double)t[i].W->out * (double)t[i].W->in * (double)t[i].T;
    const int share = can_share(t, n, pool, nx_pool_size(pool), &j.chunks);
    if (j.chunks == 0) return;
    /* A pool job costs a few microseconds (the wake-up, and each thread's first weight lines
     * arriving unprefetched): not worth it below 256K multiply-adds per call, such as a MoE
     * router (64x1024: 3.8 µs as a two-thread job, 4-bit model decode 1.03x with it on one). */
    if (nx_pool_size(pool) <= 1 || work < 262144 || j.chunks < 2) {
        matmul_worker(&j, 0, 1);
        return;
    }
    /* Shared rather than split (decode and verify): a thread that is ahead (the other started
     * late, or streams slower: a static split left one core idle for up to a fifth of the
     * lm_head's time on the Zen 5 VM) takes over the end of the other's rows. lm_head per step
     * 1.018-1.042x on the Hy3-shaped 4-bit model (bench/ab_steps.py, 5 runs). */
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
    table_get()->to_f32(W->dtype, (const uint8_t *)W->w + (size_t)r * (size_t)W->in * es, out,
                        W->in);
}

void nx_to_f32(nx_dtype t, const void *src, float *dst, int64_t n) {
    if (n <= 0) return;
    table_get()->to_f32(t, src, dst, n);
}

float nx_dot_f32(const float *a, const float *b, int64_t n) {
    return table_get()->dot_f32(a, b, n);
}

void nx_axpy_f32(float a, const float *x, float *y, int64_t n) {
    table_get()->axpy_f32(a, x, y, n);
}

/* Cached row p of an attention call as f32: the row itself, or (f16) widened into buf. */
static const float *kv_row(const nx_kernel_table *t, const void *base, nx_dtype kvt, int64_t stride, int64_t p,
                           int64_t hd, float *buf) {
    if (kvt != NX_DTYPE_F16) return (const float *)base + p * stride;
    t->to_f32(NX_DTYPE_F16, (const uint16_t *)base + p * stride, buf, hd);
    return buf;
}

void nx_attn_scores(const float *q, int64_t g, const void *K, nx_dtype kvt, int64_t stride, int64_t n, int64_t hd,
                    float scale, float *out, int64_t ldo) {
    const nx_kernel_table *t = table_get();
    if (t->attn_scores) {
        t->attn_scores(q, g, K, kvt, stride, n, hd, scale, out, ldo);
        return;
    }
    float buf[NX_ATTN_MAX_HD];
    for (int64_t p = 0; p < n; p++) {
        const float *k = kv_row(t, K, kvt, stride, p, hd, buf);
        for (int64_t h = 0; h < g; h++) out[h * ldo + p] = t->dot_f32(q + h * hd, k, hd) * scale;
    }
}

void nx_attn_accum(const float *w, int64_t ldw, int64_t g, const void *V, nx_dtype kvt, int64_t stride, int64_t n,
                   int64_t hd, float *o) {
    const nx_kernel_table *t = table_get();
    if (t->attn_accum) {
        t->attn_accum(w, ldw, g, V, kvt, stride, n, hd, o);
        return;
    }
    float buf[NX_ATTN_MAX_HD];
    for (int64_t p = 0; p < n; p++) {
        const float *v = kv_row(t, V, kvt, stride, p, hd, buf);
        for (int64_t h = 0; h < g; h++) t->axpy_f32(w[h * ldw + p], v, o + h * hd, hd);
    }
}

/* The scalar softmax: the reference, and the path of ISAs without their own. */
static void softmax_scalar(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void nx_softmax_f32(float *x, int64_t n) {
    if (n <= 0) return;
    const nx_kernel_table *t = table_get();
    if (t->softmax_f32) t->softmax_f32(x, n);
    else softmax_scalar(x, n);
}

/* The scalar RMSNorm: the reference, and the path of ISAs without their own. */
static void rmsnorm_scalar(const float *x, const float *w, float eps, int64_t n, float *out) {
    double part[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) part[l] += (double)x[i + l] * x[i + l];
    const float r = nx_rmsnorm_scale(part, x, i, n, eps);
    for (i = 0; i < n; i++) out[i] = x[i] * r * (w ? w[i] : 1.0f);
}

double nx_exp_weights(const float *x, int64_t n, float m, double inv_t, double *w) {
    const nx_kernel_table *t = table_get();
    if (t->exp_weights && n > 0) return t->exp_weights(x, n, m, inv_t, w);
    double z = 0.0;
    for (int64_t i = 0; i < n; i++) z += w[i] = exp(((double)x[i] - (double)m) * inv_t);
    return z;
}

int64_t nx_argmax_f32(float *x, int64_t n, float *max) {
    const nx_kernel_table *t = table_get();
    if (t->argmax_f32 && n > 0 && n <= INT32_MAX) return t->argmax_f32(x, n, max);
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

void nx_rmsnorm_f32(const float *x, const float *w, float eps, int64_t n, float *out) {
    if (n <= 0) return;
    const nx_kernel_table *t = table_get();
    if (t->rmsnorm_f32) t->rmsnorm_f32(x, w, eps, n, out);
    else rmsnorm_scalar(x, w, eps, n, out);
}

void nx_swiglu_f32(float *g, const float *u, int64_t n) {
    if (n <= 0) return;
    const nx_kernel_table *t = table_get();
    if (t->swiglu_f32) {
        t->swiglu_f32(g, u, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
