/* Memory read-bandwidth passes: every thread of a pool streams its share of a buffer far larger
 * than the last-level cache, in one of three patterns, and the pass's rate is the machine's read
 * bandwidth at that moment. The ceiling decode is measured against (build/bench/membw, and
 * `nextn bench --membw`, which interleaves passes with decode steps so a shift of the machine's
 * speed lands on both sides of the ratio). */
#ifndef NX_BASE_MEMBW_H
#define NX_BASE_MEMBW_H

#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"

typedef struct nx_membw nx_membw;

/* The patterns: several interleaved sequential streams per thread left to the hardware
 * prefetchers (as a matmul reads several weight rows at once), one stream per thread with
 * software prefetch ahead, and the several streams each with its own software prefetch. On
 * some machines only one of them reaches the ceiling: on a Zen 5 VM (2 threads) the last read
 * 75-80 GB/s where the others read 68-73 in the machine's fast phases, and alike in its slow
 * ones; one thread alone, 38 GB/s against 25 and 30. */
typedef enum { NX_MEMBW_STREAMS, NX_MEMBW_PREFETCH, NX_MEMBW_STREAMS_PREFETCH } nx_membw_pattern;
#define NX_MEMBW_PATTERNS 3

/* A buffer of `bytes` (rounded up to whole 2 MB pages, mapped with them where the kernel gives
 * them, as model files are), every page written once so no pass takes a page fault. NULL when
 * out of memory or bytes is 0. */
nx_membw *nx_membw_new(size_t bytes);
void nx_membw_free(nx_membw *b);
size_t nx_membw_bytes(const nx_membw *b);

/* Threads a pass runs on at most. */
#define NX_MEMBW_MAX_THREADS 256

/* One pass over the buffer in `pattern` on the pool's threads (a NULL pool: the caller alone);
 * returns GB/s (10^9 bytes per second), 0 for a pool of more than NX_MEMBW_MAX_THREADS. */
double nx_membw_pass(nx_membw *b, nx_pool *pool, nx_membw_pattern pattern);

/* The sum of the 64-bit words the last pass read, wrapping (every byte of the buffer is 1, so a
 * pass that reads each word once gives bytes/8 · 0x0101010101010101). */
uint64_t nx_membw_checksum(const nx_membw *b);

#endif
