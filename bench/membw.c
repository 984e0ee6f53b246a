/* Memory read-bandwidth probe: every thread of the pool streams its share of a large buffer
 * (far beyond the last-level cache) in two patterns — several interleaved streams left to the
 * hardware prefetchers, and one stream with software prefetch ahead — and the best pass of
 * either is reported in GB/s. This is the ceiling the decode matmuls are measured against
 * (bench/kernels.c, `make bench`); on some machines only one of the patterns reaches it.
 *   membw [--mb 1024] [--threads N] [--runs 5] */
#include <emmintrin.h>
#include <xmmintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "base/clock.h"
#include "base/pool.h"

typedef struct read_job {
    const uint8_t *buf;
    size_t n;
    uint64_t sink[64];
} read_job;

/* Bytes ahead of the read position that the prefetching pattern asks for. */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 8192
#endif

/* Each thread reads its share as STREAMS interleaved sequential streams (as a matmul reads
 * several weight rows at once: the prefetchers sustain more bandwidth on several streams than
 * on one), 64 bytes per stream per step, into independent accumulators. */
#define STREAMS 4

static void read_fn(void *arg, int ith, int nth) {
    read_job *j = arg;
    long long b, e;
    nx_pool_split((long long)(j->n / 64), ith, nth, &b, &e);
    long long len = (e - b) / STREAMS; /* 64-byte lines per stream */
    const __m128i *p[STREAMS];
    for (int s = 0; s < STREAMS; s++) p[s] = (const __m128i *)(j->buf + (size_t)(b + s * len) * 64);
    __m128i acc[STREAMS];
    for (int s = 0; s < STREAMS; s++) acc[s] = _mm_setzero_si128();
    for (long long i = 0; i < len; i++) {
        for (int s = 0; s < STREAMS; s++) {
            const __m128i *q = p[s] + 4 * i;
            __m128i v = _mm_add_epi64(_mm_add_epi64(_mm_load_si128(q), _mm_load_si128(q + 1)),
                                      _mm_add_epi64(_mm_load_si128(q + 2), _mm_load_si128(q + 3)));
            acc[s] = _mm_add_epi64(acc[s], v);
        }
    }
    __m128i t = _mm_setzero_si128();
    for (int s = 0; s < STREAMS; s++) t = _mm_add_epi64(t, acc[s]);
    uint64_t out[2];
    _mm_storeu_si128((__m128i *)out, t);
    j->sink[ith] = out[0] + out[1];
}

/* One sequential stream per thread, software-prefetched PREFETCH_AHEAD bytes ahead. */
static void read_prefetch_fn(void *arg, int ith, int nth) {
    read_job *j = arg;
    long long b, e;
    nx_pool_split((long long)(j->n / 64), ith, nth, &b, &e);
    const __m128i *p = (const __m128i *)(j->buf + (size_t)b * 64);
    __m128i acc0 = _mm_setzero_si128(), acc1 = _mm_setzero_si128();
    for (long long i = 0; i < e - b; i++) {
        const __m128i *q = p + 4 * i;
        _mm_prefetch((const char *)q + PREFETCH_AHEAD, _MM_HINT_T0);
        acc0 = _mm_add_epi64(acc0, _mm_add_epi64(_mm_load_si128(q), _mm_load_si128(q + 1)));
        acc1 = _mm_add_epi64(acc1, _mm_add_epi64(_mm_load_si128(q + 2), _mm_load_si128(q + 3)));
    }
    uint64_t out[2];
    _mm_storeu_si128((__m128i *)out, _mm_add_epi64(acc0, acc1));
    j->sink[ith] = out[0] + out[1];
}

int main(int argc, char **argv) {
    long mb = 1024, runs = 5;
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atol(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--mb MB] [--threads N] [--runs N]\n", argv[0]);
            return 2;
        }
    }
    if (mb < 1 || runs < 1) return 2;
    size_t n = (size_t)mb << 20;
    /* 2 MB pages where the kernel gives them, as the engine maps model files (README) */
    const size_t huge = (size_t)2 << 20, nalloc = (n + huge - 1) / huge * huge; /* aligned_alloc: a multiple */
    uint8_t *buf = aligned_alloc(huge, nalloc);
    if (buf) (void)madvise(buf, nalloc, MADV_HUGEPAGE);
    nx_pool *pool = nx_pool_new(threads);
    if (!buf || !pool) {
        fprintf(stderr, "membw: out of memory\n");
        return 1;
    }
    memset(buf, 1, n); /* fault every page in before timing */
    read_job j = {.buf = buf, .n = n};
    double best[2] = {0, 0};
    uint64_t sink = 0;
    for (long r = 0; r < runs; r++)
        for (int pat = 0; pat < 2; pat++) {
            double t0 = nx_now_s();
            nx_pool_run(pool, pat ? read_prefetch_fn : read_fn, &j);
            double gbs = (double)n / (nx_now_s() - t0) / 1e9;
            if (gbs > best[pat]) best[pat] = gbs;
            for (int i = 0; i < 64; i++) sink += j.sink[i];
        }
    const double bw = best[0] > best[1] ? best[0] : best[1];
    printf("memory read bandwidth: %.2f GB/s (%d threads, %ld MB, best of %ld; %d streams %.2f, "
           "1 stream + prefetch %.2f)\n", bw, nx_pool_size(pool), mb, runs, STREAMS, best[0], best[1]);
    printf("membw_gbs=%.3f streams_gbs=%.3f prefetch_gbs=%.3f threads=%d mb=%ld runs=%ld check=%llu\n",
           bw, best[0], best[1], nx_pool_size(pool), mb, runs, (unsigned long long)(sink & 0xff));
    nx_pool_free(pool);
    free(buf);
    return 0;
}
