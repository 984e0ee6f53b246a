/* Memory read-bandwidth passes (membw.h). 16-byte loads only (SSE2 on x86-64, NEON on AArch64,
 * through the compiler's generic vectors): the probe measures the memory system, not the vector
 * width. */
#include "base/membw.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/clock.h"

/* Bytes ahead of the read position that the prefetching pattern asks for. */
#define PREFETCH_AHEAD 8192

/* Interleaved streams per thread in the streams patterns, 64 bytes per stream per step, into
 * independent accumulators. */
#define STREAMS 4

/* Bytes ahead of each stream's read position that the prefetching streams pattern asks for,
 * as non-temporal lines (8 KB ahead in all, as the single prefetched stream). */
#define STREAM_AHEAD 2048

/* Two 64-bit lanes: one 16-byte load, one vector add. */
typedef uint64_t w128 __attribute__((vector_size(16)));

/* Prefetch hints: to every cache level, and non-temporal. */
#define PF_T0(p) __builtin_prefetch((p), 0, 3)
#define PF_NTA(p) __builtin_prefetch((p), 0, 0)

struct nx_membw {
    uint8_t *buf;
    size_t n;
    uint64_t sink[NX_MEMBW_MAX_THREADS]; /* per thread: the sum of the words it read */
};

/* The four 16-byte words of the line at q, added as 64-bit lanes. */
static inline w128 line_sum(const w128 *q) { return (q[0] + q[1]) + (q[2] + q[3]); }

/* STREAMS streams over the thread's share, each prefetched STREAM_AHEAD ahead when pf is set. */
static void read_streams_at(nx_membw *j, int ith, int nth, int pf) {
    long long b, e;
    nx_pool_split((long long)(j->n / 64), ith, nth, &b, &e);
    const long long len = (e - b) / STREAMS; /* 64-byte lines per stream */
    const w128 *p[STREAMS];
    w128 acc[STREAMS];
    for (int s = 0; s < STREAMS; s++) {
        p[s] = (const w128 *)(j->buf + (size_t)(b + s * len) * 64);
        acc[s] = (w128){0, 0};
    }
    for (long long i = 0; i < len; i++)
        for (int s = 0; s < STREAMS; s++) {
            if (pf) PF_NTA((const char *)(p[s] + 4 * i) + STREAM_AHEAD);
            acc[s] += line_sum(p[s] + 4 * i);
        }
    w128 t = {0, 0};
    for (int s = 0; s < STREAMS; s++) t += acc[s];
    for (long long i = b + STREAMS * len; i < e; i++) /* the lines past the last whole stride */
        t += line_sum((const w128 *)(j->buf + (size_t)i * 64));
    j->sink[ith] = t[0] + t[1];
}

static void read_streams(void *arg, int ith, int nth) { read_streams_at(arg, ith, nth, 0); }
static void read_streams_prefetch(void *arg, int ith, int nth) { read_streams_at(arg, ith, nth, 1); }

static void read_prefetch(void *arg, int ith, int nth) {
    nx_membw *j = arg;
    long long b, e;
    nx_pool_split((long long)(j->n / 64), ith, nth, &b, &e);
    const w128 *p = (const w128 *)(j->buf + (size_t)b * 64);
    w128 acc0 = {0, 0}, acc1 = {0, 0};
    for (long long i = 0; i < e - b; i++) {
        const w128 *q = p + 4 * i;
        PF_T0((const char *)q + PREFETCH_AHEAD);
        acc0 += q[0] + q[1];
        acc1 += q[2] + q[3];
    }
    const w128 t = acc0 + acc1;
    j->sink[ith] = t[0] + t[1];
}

nx_membw *nx_membw_new(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (bytes == 0 || bytes > SIZE_MAX - huge) return NULL;
    nx_membw *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->n = (bytes + huge - 1) / huge * huge; /* aligned_alloc: a multiple of the alignment */
    b->buf = aligned_alloc(huge, b->n);
    if (!b->buf) {
        free(b);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(b->buf, b->n, MADV_HUGEPAGE);
#endif
    memset(b->buf, 1, b->n); /* fault every page in before any pass */
    return b;
}

void nx_membw_free(nx_membw *b) {
    if (!b) return;
    free(b->buf);
    free(b);
}

size_t nx_membw_bytes(const nx_membw *b) { return b->n; }

uint64_t nx_membw_checksum(const nx_membw *b) {
    uint64_t s = 0;
    for (int i = 0; i < NX_MEMBW_MAX_THREADS; i++) s += b->sink[i];
    return s;
}

double nx_membw_pass(nx_membw *b, nx_pool *pool, nx_membw_pattern pattern) {
    if (nx_pool_size(pool) > NX_MEMBW_MAX_THREADS) return 0.0;
    memset(b->sink, 0, sizeof b->sink);
    const double t0 = nx_now_s();
    nx_pool_run(pool,
                pattern == NX_MEMBW_PREFETCH           ? read_prefetch
                : pattern == NX_MEMBW_STREAMS_PREFETCH ? read_streams_prefetch
                                                       : read_streams,
                b);
    const double dt = nx_now_s() - t0;
    return dt > 0 ? (double)b->n / dt / 1e9 : 0.0;
}
