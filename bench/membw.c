/* Memory read-bandwidth probe: every thread of the pool streams its share of a large buffer
 * (far beyond the last-level cache) in three patterns (src/base/membw.h) and the best pass of
 * any is reported in GB/s. This is the ceiling the decode matmuls are measured against
 * (bench/kernels.c, `make bench`); on some machines only one of the patterns reaches it.
 *   membw [--mb 1024] [--threads N] [--runs 5] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/membw.h"
#include "base/pool.h"

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
    nx_membw *b = nx_membw_new((size_t)mb << 20);
    nx_pool *pool = nx_pool_new(threads);
    if (!b || !pool) {
        fprintf(stderr, "membw: out of memory\n");
        return 1;
    }
    double best[NX_MEMBW_PATTERNS] = {0}, bw = 0;
    for (long r = 0; r < runs; r++)
        for (int pat = 0; pat < NX_MEMBW_PATTERNS; pat++) {
            const double gbs = nx_membw_pass(b, pool, (nx_membw_pattern)pat);
            if (gbs > best[pat]) best[pat] = gbs;
            if (gbs > bw) bw = gbs;
        }
    printf("memory read bandwidth: %.2f GB/s (%d threads, %ld MB, best of %ld; 4 streams %.2f, "
           "1 stream + prefetch %.2f, 4 prefetched streams %.2f)\n",
           bw, nx_pool_size(pool), mb, runs, best[NX_MEMBW_STREAMS], best[NX_MEMBW_PREFETCH],
           best[NX_MEMBW_STREAMS_PREFETCH]);
    printf("membw_gbs=%.3f streams_gbs=%.3f prefetch_gbs=%.3f streams_prefetch_gbs=%.3f threads=%d mb=%ld runs=%ld\n",
           bw, best[NX_MEMBW_STREAMS], best[NX_MEMBW_PREFETCH], best[NX_MEMBW_STREAMS_PREFETCH], nx_pool_size(pool), mb,
           runs);
    nx_pool_free(pool);
    nx_membw_free(b);
    return 0;
}
