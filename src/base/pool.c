/* The persistent thread pool behind every parallel kernel. A job start is one atomic
 * increment of a generation counter; workers spin on it briefly (decode issues hundreds of
 * jobs per token, microseconds apart) and then sleep on a futex, so an idle pool costs nothing.
 * The spin budget adapts to competition for the cores (pool.h, Waiting). */
#include "base/pool.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

struct nx_pool {
    int n;                 /* threads including the caller */
    pthread_t *threads;    /* n - 1 workers */
    nx_pool_fn fn;         /* current job, published by the release increment of gen */
    void *arg;
    _Atomic unsigned gen;  /* futex word: bumped once per job */
    _Atomic int pending;   /* futex word: workers still running the current job */
    _Atomic int sleepers;  /* workers blocked (or about to block) on gen */
    _Atomic int waiter;    /* 1 while the caller is blocked (or about to block) on pending */
    _Atomic int stop;
    struct share *shares;  /* n: the current job's claimable chunks (nx_pool_share_*) */
    int share_n;           /* chunks in use */
    long long share_min, share_align;
    _Atomic int bar_count;      /* threads arrived at the current in-job barrier */
    _Atomic unsigned bar_phase; /* futex word: bumped by the last arrival */
    _Atomic int bar_sleepers;   /* threads blocked (or about to block) on bar_phase */
    /* Long enough to bridge the gaps of decoding, including the one between two tokens (~100 µs
     * on a 32k vocabulary: at 50 µs the workers slept between tokens and the next token's first
     * job waited ~75 µs for their wake-up); timed, since `pause` costs 10 to 150 cycles. */
    _Atomic long long spin_ns;
    _Atomic unsigned long long n_wait[3], n_sleep;
    void **scratch;             /* n_scratch: each thread's NX_POOL_SCRATCH_BYTES (raw allocations) */
    int n_scratch;
};

/* One thread's chunk [lo, hi) as hi << 32 | lo, on its own cache line. */
struct share {
    _Alignas(64) _Atomic unsigned long long r;
};

typedef struct worker_arg {
    nx_pool *p;
    int ith;
} worker_arg;

/* Sleep while the 32-bit word at addr holds val, and wake sleepers: Linux futexes; on macOS the
 * ulock calls the C++ runtime's atomic wait uses; elsewhere a short sleep per check. Every caller
 * re-checks its condition after waking, so a spurious wake-up only costs a loop. */
#if defined(__linux__)
static void futex_wait(void *addr, int val) {
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(void *addr, int n) {
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}
#elif defined(__APPLE__)
int __ulock_wait(uint32_t op, void *addr, uint64_t value, uint32_t timeout_us);
int __ulock_wake(uint32_t op, void *addr, uint64_t wake_value);
#define NX_UL_COMPARE_AND_WAIT 1u
#define NX_ULF_WAKE_ALL 0x100u
#define NX_ULF_NO_ERRNO 0x1000000u

static void futex_wait(void *addr, int val) {
    (void)__ulock_wait(NX_UL_COMPARE_AND_WAIT | NX_ULF_NO_ERRNO, addr, (uint64_t)(uint32_t)val, 0);
}

static void futex_wake(void *addr, int n) {
    (void)__ulock_wake(NX_UL_COMPARE_AND_WAIT | NX_ULF_NO_ERRNO | (n > 1 ? NX_ULF_WAKE_ALL : 0u), addr, 0);
}
#else
static void futex_wait(void *addr, int val) {
    (void)addr;
    (void)val;
    nanosleep(&(struct timespec){0, 50000}, NULL);
}

static void futex_wake(void *addr, int n) {
    (void)addr;
    (void)n;
}
#endif

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One wait's spinning: when it began, the clock's last reading, the steps so far. */
typedef struct spin {
    int64_t t0, last;
    int steps;
    nx_pool_wait how;
} spin;

/* A spin step of wait w: pauses and returns 1 while the budget lasts; 0 once it is spent or the
 * thread was descheduled since the last look at the clock (w->how says which). */
static int spin_more(nx_pool *p, spin *w) {
    if ((++w->steps & 31) == 1) {
        const int64_t t = now_ns();
        if (w->t0 == 0) {
            w->t0 = w->last = t;
        } else {
            const int64_t gap = t - w->last;
            w->last = t;
            if (gap > NX_POOL_PREEMPT_NS) {
                w->how = NX_WAIT_PREEMPTED;
                return 0;
            }
            if (t - w->t0 > atomic_load_explicit(&p->spin_ns, memory_order_relaxed)) {
                w->how = NX_WAIT_IDLE;
                return 0;
            }
        }
    }
    nx_cpu_relax();
    return 1;
}

void nx_pool_note_wait(nx_pool *p, nx_pool_wait how) {
    if (!p || how < NX_WAIT_FAST || how > NX_WAIT_PREEMPTED) return;
    /* fast waits are the common case: not counted, so they write no shared line */
    if (how != NX_WAIT_FAST) atomic_fetch_add_explicit(&p->n_wait[how], 1, memory_order_relaxed);
    long long b = atomic_load_explicit(&p->spin_ns, memory_order_relaxed), nb = b;
    if (how == NX_WAIT_PREEMPTED) nb = b / 4 > NX_POOL_SPIN_MIN_NS ? b / 4 : NX_POOL_SPIN_MIN_NS;
    else if (how == NX_WAIT_FAST && b < NX_POOL_SPIN_MAX_NS)
        nb = b + NX_POOL_SPIN_MAX_NS / 4096 < NX_POOL_SPIN_MAX_NS ? b + NX_POOL_SPIN_MAX_NS / 4096 : NX_POOL_SPIN_MAX_NS;
    /* racing updates may drop one: the budget is a heuristic */
    if (nb != b) atomic_store_explicit(&p->spin_ns, nb, memory_order_relaxed);
}

/* The end of a wait: its outcome, and whether it slept. */
static void spin_end(nx_pool *p, const spin *w, int slept) {
    nx_pool_note_wait(p, slept ? w->how : NX_WAIT_FAST);
    if (slept) atomic_fetch_add_explicit(&p->n_sleep, 1, memory_order_relaxed);
}

void nx_pool_get_stats(const nx_pool *p, nx_pool_stats *s) {
    *s = (nx_pool_stats){0};
    if (!p) return;
    s->spin_ns = atomic_load_explicit(&p->spin_ns, memory_order_relaxed);
    s->idle = atomic_load_explicit(&p->n_wait[NX_WAIT_IDLE], memory_order_relaxed);
    s->preempted = atomic_load_explicit(&p->n_wait[NX_WAIT_PREEMPTED], memory_order_relaxed);
    s->sleeps = atomic_load_explicit(&p->n_sleep, memory_order_relaxed);
}

static void *worker_main(void *vp) {
    worker_arg *wa = vp;
    nx_pool *p = wa->p;
    int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        spin w = {0};
        int slept = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (!slept && spin_more(p, &w)) continue;
            /* Announce the sleep before re-checking: the caller bumps gen and then reads
             * sleepers (both seq_cst), so either it sees us and wakes us, or FUTEX_WAIT sees
             * the new gen and returns at once. */
            slept = 1;
            atomic_fetch_add(&p->sleepers, 1);
            futex_wait(&p->gen, (int)seen);
            atomic_fetch_sub(&p->sleepers, 1);
        }
        spin_end(p, &w, slept);
        seen = g;
        if (atomic_load(&p->stop)) break;
        p->fn(p->arg, ith, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->waiter))
            futex_wake(&p->pending, 1);
    }
    return NULL;
}

nx_pool *nx_pool_new(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)(n < 1024 ? n : 1024) : 1;
    }
    nx_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = 1;
    atomic_store(&p->spin_ns, NX_POOL_SPIN_MAX_NS);
    p->shares = aligned_alloc(64, (size_t)n_threads * sizeof *p->shares);
    p->scratch = calloc((size_t)n_threads, sizeof *p->scratch);
    if (!p->shares || !p->scratch) goto fail;
    p->n_scratch = n_threads;
    /* calloc: the pages are mapped on first use, by the thread that uses them */
    for (int i = 0; i < n_threads; i++)
        if (!(p->scratch[i] = calloc(1, NX_POOL_SCRATCH_BYTES + 64))) goto fail;
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) goto fail;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) goto fail;
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            goto fail;
        }
        p->n++;
    }
    return p;
fail:
    nx_pool_free(p); /* stops the workers started so far */
    return NULL;
}

void nx_pool_free(nx_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake(&p->gen, INT_MAX);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p->shares);
    for (int i = 0; p->scratch && i < p->n_scratch; i++) free(p->scratch[i]);
    free(p->scratch);
    free(p);
}

int nx_pool_size(const nx_pool *p) { return p ? p->n : 1; }

void *nx_pool_scratch(nx_pool *p, int ith) {
    if (!p || ith < 0 || ith >= p->n || !p->scratch[ith]) return NULL;
    return (void *)(((uintptr_t)p->scratch[ith] + 63) & ~(uintptr_t)63);
}

void nx_pool_run(nx_pool *p, nx_pool_fn fn, void *arg) {
    if (!p || p->n <= 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->gen, 1); /* publishes fn/arg/pending */
    if (atomic_load(&p->sleepers) > 0) futex_wake(&p->gen, INT_MAX);

    fn(arg, 0, p->n);

    int left, slept = 0;
    spin w = {0};
    while ((left = atomic_load_explicit(&p->pending, memory_order_acquire)) != 0) {
        if (!slept && spin_more(p, &w)) continue;
        slept = 1;
        atomic_store(&p->waiter, 1);
        left = atomic_load(&p->pending);
        if (left != 0) futex_wait(&p->pending, left);
        atomic_store(&p->waiter, 0);
    }
    spin_end(p, &w, slept);
}

void nx_pool_barrier(nx_pool *p, int nth) {
    if (!p || nth <= 1) return;
    const unsigned phase = atomic_load_explicit(&p->bar_phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&p->bar_count, 1, memory_order_acq_rel) == nth - 1) {
        /* the last arrival resets the count before releasing the others, so none can arrive
         * at the next barrier early */
        atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add(&p->bar_phase, 1);
        if (atomic_load(&p->bar_sleepers) > 0) futex_wake(&p->bar_phase, INT_MAX);
        return;
    }
    spin w = {0};
    int slept = 0;
    while (atomic_load_explicit(&p->bar_phase, memory_order_acquire) == phase) {
        if (!slept && spin_more(p, &w)) continue;
        /* as the workers' sleep on gen: announced before the re-check (both seq_cst) */
        slept = 1;
        atomic_fetch_add(&p->bar_sleepers, 1);
        futex_wait(&p->bar_phase, (int)phase);
        atomic_fetch_sub(&p->bar_sleepers, 1);
    }
    spin_end(p, &w, slept);
}

void nx_pool_await(nx_pool *p, const _Atomic int *flag) {
    spin w = {0};
    int slept = 0;
    while (!atomic_load_explicit(flag, memory_order_acquire)) {
        if (p && !slept && spin_more(p, &w)) continue;
        slept = 1;
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
    if (p) spin_end(p, &w, slept);
}

void nx_pool_split(long long n, int ith, int nth, long long *b, long long *e) {
    if (n < 0) n = 0;
    if (nth < 1) nth = 1;
    if (ith < 0) ith = 0;
    if (ith > nth) ith = nth;
    /* The first n % nth chunks get one extra element. */
    long long q = n / nth, r = n % nth;
    *b = ith * q + (ith < r ? ith : r);
    *e = *b + q + (ith < r ? 1 : 0);
    if (ith == nth) *e = *b;
}

/* Chunks are packed hi << 32 | lo so that a claim from either end is one compare-and-swap. */
static unsigned long long share_pack(long long lo, long long hi) {
    return (unsigned long long)hi << 32 | (unsigned long long)lo;
}

int nx_pool_share_reset(nx_pool *p, int nth, long long n, long long min_piece, long long align) {
    if (!p || nth < 1 || nth > p->n || n < 0 || n > (long long)UINT32_MAX) return -1;
    for (int t = 0; t < nth; t++) {
        long long b, e;
        nx_pool_split(n, t, nth, &b, &e);
        atomic_store_explicit(&p->shares[t].r, share_pack(b, e), memory_order_relaxed);
    }
    p->share_n = nth;
    p->share_min = min_piece > 0 ? min_piece : 1;
    p->share_align = align > 0 ? align : 1;
    return 0; /* published to the workers by nx_pool_run's release increment */
}

int nx_pool_share_next(nx_pool *p, int ith, long long *b, long long *e) {
    if (!p || ith < 0 || ith >= p->share_n) return 0;
    const long long mp = p->share_min, al = p->share_align;
    _Atomic unsigned long long *own = &p->shares[ith].r;
    unsigned long long v = atomic_load_explicit(own, memory_order_acquire);
    for (;;) {
        const long long lo = (long long)(v & 0xffffffffu), hi = (long long)(v >> 32);
        if (lo >= hi) break;
        long long take;
        if (hi - lo > 2 * al) {
            take = al - lo % al; /* to the next aligned unit */
        } else {
            take = (hi - lo + 1) / 2;
            if (take < mp) take = hi - lo < mp ? hi - lo : mp;
        }
        if (atomic_compare_exchange_weak_explicit(own, &v, share_pack(lo + take, hi), memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *b = lo;
            *e = lo + take;
            return 1;
        }
    }
    /* the back half of the largest chunk left */
    for (;;) {
        int best = -1;
        long long most = 0;
        unsigned long long bv = 0;
        for (int t = 0; t < p->share_n; t++) {
            const unsigned long long tv = atomic_load_explicit(&p->shares[t].r, memory_order_acquire);
            const long long left = (long long)(tv >> 32) - (long long)(tv & 0xffffffffu);
            if (left > most) {
                most = left;
                best = t;
                bv = tv;
            }
        }
        if (best < 0 || most < 2 * mp) return 0;
        const long long lo = (long long)(bv & 0xffffffffu), hi = (long long)(bv >> 32), take = most / 2;
        if (atomic_compare_exchange_strong_explicit(&p->shares[best].r, &bv, share_pack(lo, hi - take),
                                                    memory_order_acq_rel, memory_order_acquire)) {
            *b = hi - take;
            *e = hi;
            return 1;
        }
    }
}

void nx_pool_share_peek(const nx_pool *p, int ith, long long *b, long long *e) {
    *b = *e = 0;
    if (!p || ith < 0 || ith >= p->share_n) return;
    const unsigned long long v = atomic_load_explicit(&p->shares[ith].r, memory_order_relaxed);
    *b = (long long)(v & 0xffffffffu);
    *e = (long long)(v >> 32);
    if (*e < *b) *e = *b;
}
