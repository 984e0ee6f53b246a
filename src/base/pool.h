/* A persistent thread pool. Work is a function called as fn(arg, ith, nth) on every thread
 * (the caller is thread 0) — the ggml convention — so kernels split work by (ith, nth) and a
 * result never depends on scheduling. Threads sleep between jobs. */
#ifndef NX_BASE_POOL_H
#define NX_BASE_POOL_H

typedef struct nx_pool nx_pool;
typedef void (*nx_pool_fn)(void *arg, int ith, int nth);

#include <stddef.h>

/* n_threads <= 0 means the number of online CPUs. Returns NULL on failure. */
nx_pool *nx_pool_new(int n_threads);
void nx_pool_free(nx_pool *p);
int nx_pool_size(const nx_pool *p); /* 1 for a NULL pool */

/* Runs fn(arg, i, n) for i in 0..n-1 across the pool and waits for all. A NULL pool runs
 * fn(arg, 0, 1) on the caller. Not reentrant: fn must not call nx_pool_run on the same pool. */
void nx_pool_run(nx_pool *p, nx_pool_fn fn, void *arg);

/* Inside a job: waits until all nth threads of the job have reached it (spinning, then sleeping:
 * see the waits below). nth <= 1, or a NULL pool, returns at once, so a job
 * function also runs unchanged as fn(arg, 0, 1) on the caller alone. Every thread of the job
 * must call it the same number of times. */
void nx_pool_barrier(nx_pool *p, int nth);

/* Thread ith's working memory: NX_POOL_SCRATCH_BYTES, 64-byte aligned, zeroed at creation and
 * kept between jobs (the kernels keep their staging buffers there; kernels.h, nx_kscratch_of).
 * Only thread ith of a running job uses it, or the caller as thread 0 outside jobs. Owned by the
 * pool rather than thread-local, so no other thread of the process reserves it. NULL for a NULL
 * pool or ith out of range. */
#define NX_POOL_SCRATCH_BYTES (480u * 1024u)
void *nx_pool_scratch(nx_pool *p, int ith);

/* Waiting. Every wait (a worker for the next job, the caller for the workers, a barrier, a
 * flag) spins at most the pool's spin budget, then sleeps. Spinning pays while each thread has
 * a core; when other processes compete for the cores it burns the time slice that the thread
 * being waited for needs. A spinning thread that finds itself descheduled (a gap of more than
 * NX_POOL_PREEMPT_NS between two looks at the clock) ends the wait by sleeping and cuts the
 * budget to a quarter (at least NX_POOL_SPIN_MIN_NS); each wait that ends while spinning gives
 * back NX_POOL_SPIN_MAX_NS / 4096, up to NX_POOL_SPIN_MAX_NS. A wait that outlasts the budget
 * without being descheduled (an idle pool) leaves it. */
#define NX_POOL_SPIN_MAX_NS 250000
#define NX_POOL_SPIN_MIN_NS 2000
#define NX_POOL_PREEMPT_NS 50000

typedef enum nx_pool_wait {
    NX_WAIT_FAST,      /* ended while spinning */
    NX_WAIT_IDLE,      /* outlasted the budget, never descheduled */
    NX_WAIT_PREEMPTED, /* descheduled while spinning */
} nx_pool_wait;

typedef struct nx_pool_stats {
    long long spin_ns;                     /* the current budget */
    unsigned long long idle, preempted;    /* waits by outcome (fast ones are not counted) */
    unsigned long long sleeps;             /* waits that ended asleep */
} nx_pool_stats;
void nx_pool_get_stats(const nx_pool *p, nx_pool_stats *s);
/* Records the outcome of one wait and adapts the budget (the pool's own waits call it; tests
 * drive the policy through it). */
void nx_pool_note_wait(nx_pool *p, nx_pool_wait outcome);

/* Inside a job: waits until *flag is non-zero (acquire), as the pool's own waits do, sleeping
 * in short naps once the budget is spent (the thread that sets the flag does not wake anyone). */
void nx_pool_await(nx_pool *p, const _Atomic int *flag);

/* Splits [0, n) into nth near-equal chunks; chunk ith is [*b, *e). */
void nx_pool_split(long long n, int ith, int nth, long long *b, long long *e);

/* Shares: [0, n) units split as nx_pool_split does, but claimed piece by piece, so a thread
 * that finishes early takes work another thread has not reached yet. The caller sets them up
 * before nx_pool_run (nth: the threads the job will run on, at most nx_pool_size; n < 2^32), or
 * one thread of a running job does while no thread of it claims, and then publishes them (a
 * barrier, or a release store the others acquire); then each thread calls nx_pool_share_next
 * until it returns 0.
 * - A thread claims its own chunk from the front: up to the next multiple of `align` units
 *   while more than 2·align are left, then half of what is left (at least min_piece units).
 * - Once its own chunk is gone, it takes the back half of the largest chunk left, if that holds
 *   at least 2·min_piece units; it returns 0 when none does.
 * Every unit is handed out exactly once. Which thread gets which unit depends on timing, so a
 * job's results must not depend on it (the kernels' numerics contract). Returns -1 (and sets
 * nothing up) when nth or n is out of range. */
int nx_pool_share_reset(nx_pool *p, int nth, long long n, long long min_piece, long long align);
int nx_pool_share_next(nx_pool *p, int ith, long long *b, long long *e);
/* What is left of thread ith's own chunk, [*b, *e) (empty once claimed or taken): where its
 * next piece most likely starts, for prefetching. */
void nx_pool_share_peek(const nx_pool *p, int ith, long long *b, long long *e);

/* One step of a spin-wait (pause where the CPU has it): the pool's own waits, and a job's wait
 * for a flag another thread of the job sets. */
static inline void nx_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
