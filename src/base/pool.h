/* A persistent thread pool. Work is a function called as fn(arg, ith, nth) on every thread
 * (the caller is thread 0) — the ggml convention — so kernels split work by (ith, nth) and a
 * result never depends on scheduling. Threads sleep between jobs. */
#ifndef NX_BASE_POOL_H
#define NX_BASE_POOL_H

typedef struct nx_pool nx_pool;
typedef void (*nx_pool_fn)(void *arg, int ith, int nth);

/* n_threads <= 0 means the number of online CPUs. Returns NULL on failure. */
nx_pool *nx_pool_new(int n_threads);
void nx_pool_free(nx_pool *p);
int nx_pool_size(const nx_pool *p); /* 1 for a NULL pool */

/* Runs fn(arg, i, n) for i in 0..n-1 across the pool and waits for all. A NULL pool runs
 * fn(arg, 0, 1) on the caller. Not reentrant: fn must not call nx_pool_run on the same pool. */
void nx_pool_run(nx_pool *p, nx_pool_fn fn, void *arg);

/* Inside a job: waits until all nth threads of the job have reached it (spinning: for the short
 * waits between the phases of one job). nth <= 1, or a NULL pool, returns at once, so a job
 * function also runs unchanged as fn(arg, 0, 1) on the caller alone. Every thread of the job
 * must call it the same number of times. */
void nx_pool_barrier(nx_pool *p, int nth);

/* Splits [0, n) into nth near-equal chunks; chunk ith is [*b, *e). */
void nx_pool_split(long long n, int ith, int nth, long long *b, long long *e);

#endif
