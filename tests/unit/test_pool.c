/* Thread pool tests: every index runs exactly once per job, thousands of back-to-back jobs
 * (the decode pattern), a pool of one, the NULL pool, nx_pool_split's coverage, the in-job
 * barrier and work shares, the adaptive spin budget and the waits that end asleep, the
 * per-thread scratch; the bandwidth probe's passes read every byte of their buffer once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "base/membw.h"
#include "base/pool.h"

typedef struct job {
    _Atomic int hits[64];
    _Atomic int calls;
    int nth_seen[64];
} job;

static void count_fn(void *arg, int ith, int nth) {
    job *j = arg;
    atomic_fetch_add(&j->hits[ith], 1);
    atomic_fetch_add(&j->calls, 1);
    j->nth_seen[ith] = nth;
}

static void check_job(nx_pool *p, int n) {
    job j;
    memset(&j, 0, sizeof j);
    nx_pool_run(p, count_fn, &j);
    assert_int_equal(atomic_load(&j.calls), n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(atomic_load(&j.hits[i]), 1);
        assert_int_equal(j.nth_seen[i], n);
    }
}

static void test_each_index_once(void **state) {
    (void)state;
    for (int n = 1; n <= 5; n++) {
        nx_pool *p = nx_pool_new(n);
        assert_non_null(p);
        assert_int_equal(nx_pool_size(p), n);
        for (int rep = 0; rep < 20; rep++) check_job(p, n);
        nx_pool_free(p);
    }
}

/* Sums a range split over the threads: catches a worker that runs a stale job or is not
 * waited for (the caller reads the partial sums right after nx_pool_run returns). */
typedef struct sum_job {
    const int *v;
    long long n;
    long long partial[64];
} sum_job;

static void sum_fn(void *arg, int ith, int nth) {
    sum_job *j = arg;
    long long b, e, s = 0;
    nx_pool_split(j->n, ith, nth, &b, &e);
    for (long long i = b; i < e; i++) s += j->v[i];
    j->partial[ith] = s;
}

static void test_many_quick_jobs(void **state) {
    (void)state;
    nx_pool *p = nx_pool_new(2);
    assert_non_null(p);
    int v[1000];
    for (int i = 0; i < 1000; i++) v[i] = i;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int jobs = 5000;
    for (int r = 0; r < jobs; r++) {
        sum_job j = {.v = v, .n = 1 + r % 1000};
        nx_pool_run(p, sum_fn, &j);
        long long s = 0;
        for (int i = 0; i < nx_pool_size(p); i++) s += j.partial[i];
        assert_true(s == j.n * (j.n - 1) / 2);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / jobs;
    print_message("# %.2f us per job (2 threads)\n", us);
    nx_pool_free(p);
}

/* Jobs separated by pauses long enough for the workers to fall asleep on the futex. */
static void test_sleep_and_wake(void **state) {
    (void)state;
    nx_pool *p = nx_pool_new(3);
    assert_non_null(p);
    for (int r = 0; r < 5; r++) {
        struct timespec ts = {0, 3 * 1000 * 1000};
        nanosleep(&ts, NULL);
        check_job(p, 3);
    }
    nx_pool_free(p);
}

static void test_pool_of_one_and_null(void **state) {
    (void)state;
    nx_pool *p = nx_pool_new(1);
    assert_non_null(p);
    assert_int_equal(nx_pool_size(p), 1);
    check_job(p, 1);
    nx_pool_free(p);
    assert_int_equal(nx_pool_size(NULL), 1);
    check_job(NULL, 1);
    nx_pool_free(NULL);
    p = nx_pool_new(0); /* all online CPUs */
    assert_non_null(p);
    assert_true(nx_pool_size(p) >= 1);
    check_job(p, nx_pool_size(p));
    nx_pool_free(p);
}

static void test_split(void **state) {
    (void)state;
    for (long long n = 0; n < 50; n++)
        for (int nth = 1; nth <= 7; nth++) {
            long long prev = 0, minlen = n, maxlen = 0;
            for (int i = 0; i < nth; i++) {
                long long b, e;
                nx_pool_split(n, i, nth, &b, &e);
                assert_true(b == prev && e >= b);
                prev = e;
                if (e - b < minlen) minlen = e - b;
                if (e - b > maxlen) maxlen = e - b;
            }
            assert_true(prev == n);
            assert_true(maxlen - minlen <= 1);
        }
}

/* In-job barrier: in each of several phases every thread writes its slot, waits, then reads
 * every other thread's slot of that phase. A barrier that let a thread through early would show
 * a stale slot; one that miscounted would hang (ctest's timeout) or let a phase mix. */
typedef struct bar_job {
    nx_pool *p;
    _Atomic int slot[64];
    _Atomic int bad;
} bar_job;

static void barrier_fn(void *arg, int ith, int nth) {
    bar_job *j = arg;
    for (int phase = 1; phase <= 200; phase++) {
        atomic_store(&j->slot[ith], phase);
        nx_pool_barrier(j->p, nth);
        for (int i = 0; i < nth; i++)
            if (atomic_load(&j->slot[i]) < phase) atomic_fetch_add(&j->bad, 1);
        nx_pool_barrier(j->p, nth); /* nobody starts the next phase before all have read */
    }
}

static void test_barrier(void **state) {
    (void)state;
    for (int n = 1; n <= 4; n++) {
        nx_pool *p = nx_pool_new(n);
        assert_non_null(p);
        for (int rep = 0; rep < 5; rep++) {
            bar_job j = {.p = p};
            nx_pool_run(p, barrier_fn, &j);
            assert_int_equal(atomic_load(&j.bad), 0);
            for (int i = 0; i < n; i++) assert_int_equal(atomic_load(&j.slot[i]), 200);
        }
        nx_pool_free(p);
    }
    /* alone (nth 1) and on no pool it returns at once */
    nx_pool_barrier(NULL, 4);
    bar_job j = {.p = NULL};
    barrier_fn(&j, 0, 1);
    assert_int_equal(atomic_load(&j.bad), 0);
}

/* Shares: every unit of [0, n) is handed out exactly once whatever the timing, pieces stay
 * within [0, n), and a thread that is held up loses the end of its chunk to the others. */
#define SHARE_MAX 4096
typedef struct share_job {
    nx_pool *p;
    long long n;
    _Atomic int seen[SHARE_MAX];
    _Atomic long long done[64];  /* units each thread processed */
    _Atomic int pieces[64];
    _Atomic int bad;
    int slow; /* thread that sleeps before each piece (-1: none) */
} share_job;

static void share_fn(void *arg, int ith, int nth) {
    share_job *j = arg;
    (void)nth;
    long long b, e;
    while (nx_pool_share_next(j->p, ith, &b, &e)) {
        if (b < 0 || e > j->n || b >= e) atomic_fetch_add(&j->bad, 1);
        if (ith == j->slow) {
            struct timespec ts = {0, 5000000}; /* 5 ms */
            nanosleep(&ts, NULL);
        }
        for (long long u = b; u < e && u < j->n && u >= 0; u++) atomic_fetch_add(&j->seen[u], 1);
        atomic_fetch_add(&j->done[ith], e - b);
        atomic_fetch_add(&j->pieces[ith], 1);
    }
}

static void test_shares(void **state) {
    (void)state;
    static share_job j;
    const long long ns[] = {0, 1, 2, 7, 64, 288, 1000, SHARE_MAX};
    const long long params[][2] = {{1, 1}, {2, 32}, {8, 64}, {3, 5}};
    for (int n_threads = 1; n_threads <= 4; n_threads++) {
        nx_pool *p = nx_pool_new(n_threads);
        assert_non_null(p);
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t q = 0; q < sizeof params / sizeof params[0]; q++)
                for (int rep = 0; rep < 3; rep++) {
                    memset(&j, 0, sizeof j);
                    j.p = p;
                    j.n = ns[a];
                    j.slow = -1;
                    assert_int_equal(nx_pool_share_reset(p, n_threads, j.n, params[q][0], params[q][1]), 0);
                    nx_pool_run(p, share_fn, &j);
                    assert_int_equal(atomic_load(&j.bad), 0);
                    for (long long u = 0; u < j.n; u++) assert_int_equal(atomic_load(&j.seen[u]), 1);
                }
        nx_pool_free(p);
    }
    /* the calling thread sleeps 5 ms per piece: the worker takes most of its chunk (its static
     * share is 512 units of 1024; it claims pieces of 16 while more than 32 are left) */
    nx_pool *p = nx_pool_new(2);
    assert_non_null(p);
    memset(&j, 0, sizeof j);
    j.p = p;
    j.n = 1024;
    j.slow = 0;
    assert_int_equal(nx_pool_share_reset(p, 2, j.n, 4, 16), 0);
    nx_pool_run(p, share_fn, &j);
    assert_int_equal(atomic_load(&j.bad), 0);
    for (long long u = 0; u < j.n; u++) assert_int_equal(atomic_load(&j.seen[u]), 1);
    assert_true(atomic_load(&j.done[0]) < 256);
    assert_true(atomic_load(&j.done[1]) > 768);
    assert_true(atomic_load(&j.pieces[1]) > 2);
    /* what is left of a chunk, before and after the job */
    long long b, e;
    assert_int_equal(nx_pool_share_reset(p, 2, 100, 1, 1), 0);
    nx_pool_share_peek(p, 1, &b, &e);
    assert_true(b == 50 && e == 100);
    nx_pool_share_peek(p, 2, &b, &e); /* not a thread of the job */
    assert_true(b == 0 && e == 0);
    /* out of range: more threads than the pool has, 2^32 units, no pool */
    assert_int_equal(nx_pool_share_reset(p, 3, 10, 1, 1), -1);
    assert_int_equal(nx_pool_share_reset(p, 0, 10, 1, 1), -1);
    assert_int_equal(nx_pool_share_reset(p, 2, 1LL << 32, 1, 1), -1);
    assert_int_equal(nx_pool_share_reset(NULL, 1, 10, 1, 1), -1);
    assert_int_equal(nx_pool_share_next(NULL, 0, &b, &e), 0);
    nx_pool_free(p);
}

/* Every pattern on 1-3 threads and the caller alone reads each word of the buffer exactly once:
 * the buffer is all ones, so the sum of its words is known (a pass that skips the lines past a
 * thread's last whole stride of streams, or reads one twice, misses it). Sizes round up to
 * 2 MB pages; 0 bytes is refused. */
static void test_membw(void **state) {
    (void)state;
    assert_null(nx_membw_new(0));
    nx_membw *b = nx_membw_new(3 << 20);
    assert_non_null(b);
    assert_int_equal(nx_membw_bytes(b), 4 << 20);
    const uint64_t want = (uint64_t)(nx_membw_bytes(b) / 8) * 0x0101010101010101ull;
    for (int threads = 0; threads <= 3; threads++) {
        nx_pool *p = threads ? nx_pool_new(threads) : NULL;
        if (threads) assert_non_null(p);
        for (int pat = 0; pat < NX_MEMBW_PATTERNS; pat++) {
            const double gbs = nx_membw_pass(b, p, (nx_membw_pattern)pat);
            assert_true(gbs > 0);
            assert_true(nx_membw_checksum(b) == want);
        }
        nx_pool_free(p);
    }
    nx_membw_free(b);
    nx_membw_free(NULL);
}

/* The spin budget: a wait that found its thread descheduled cuts it to a quarter, down to the
 * floor; a wait that ended while spinning gives back MAX/4096 up to MAX; an idle wait (budget
 * spent, never descheduled) leaves it. A pool of one thread: no worker waits besides these. */
static void test_spin_budget(void **state) {
    (void)state;
    nx_pool *p = nx_pool_new(1);
    assert_non_null(p);
    nx_pool_stats st;
    nx_pool_get_stats(p, &st);
    assert_int_equal(st.spin_ns, NX_POOL_SPIN_MAX_NS);
    long long want = NX_POOL_SPIN_MAX_NS;
    for (int i = 0; i < 10; i++) {
        nx_pool_note_wait(p, NX_WAIT_PREEMPTED);
        want = want / 4 > NX_POOL_SPIN_MIN_NS ? want / 4 : NX_POOL_SPIN_MIN_NS;
        nx_pool_get_stats(p, &st);
        assert_int_equal(st.spin_ns, want);
    }
    assert_int_equal(st.spin_ns, NX_POOL_SPIN_MIN_NS);
    assert_int_equal(st.preempted, 10);
    nx_pool_note_wait(p, NX_WAIT_IDLE);
    nx_pool_get_stats(p, &st);
    assert_int_equal(st.spin_ns, NX_POOL_SPIN_MIN_NS);
    assert_int_equal(st.idle, 1);
    nx_pool_note_wait(p, NX_WAIT_FAST);
    nx_pool_get_stats(p, &st);
    assert_int_equal(st.spin_ns, NX_POOL_SPIN_MIN_NS + NX_POOL_SPIN_MAX_NS / 4096);
    for (int i = 0; i < 5000; i++) nx_pool_note_wait(p, NX_WAIT_FAST);
    nx_pool_get_stats(p, &st);
    assert_int_equal(st.spin_ns, NX_POOL_SPIN_MAX_NS);
    assert_int_equal(st.preempted, 10);
    assert_int_equal(st.idle, 1);
    nx_pool_free(p);
}

/* A wait longer than the budget ends asleep, not spinning: thread 0 waits (at a barrier, then on
 * a flag) for thread 1, which arrives only once the pool has counted thread 0's wait as asleep
 * (or, if it never is, after ~10 s, and the test fails). */
typedef struct sleep_job {
    nx_pool *p;
    _Atomic int flag;
    unsigned long long before[2], after[2];
} sleep_job;

static unsigned long long pool_sleeps(nx_pool *p) {
    nx_pool_stats st;
    nx_pool_get_stats(p, &st);
    return st.sleeps;
}

/* Thread 1: until thread 0's wait has gone to sleep (at most ~10 s). */
static void until_asleep(nx_pool *p, unsigned long long before) {
    for (int i = 0; i < 10000 && pool_sleeps(p) == before; i++) nanosleep(&(struct timespec){0, 1000000}, NULL);
}

static void sleep_fn(void *arg, int ith, int nth) {
    sleep_job *j = arg;
    if (ith == 1) { /* its own wait for the job has been counted before the job runs */
        j->before[0] = pool_sleeps(j->p);
        until_asleep(j->p, j->before[0]);
    }
    nx_pool_barrier(j->p, nth);
    if (ith == 0) {
        j->after[0] = pool_sleeps(j->p);
        nx_pool_await(j->p, &j->flag);
        j->after[1] = pool_sleeps(j->p);
    } else {
        j->before[1] = pool_sleeps(j->p);
        until_asleep(j->p, j->before[1]);
        atomic_store(&j->flag, 1);
    }
}

static void test_long_waits_sleep(void **state) {
    (void)state;
    nx_pool *p = nx_pool_new(2);
    assert_non_null(p);
    sleep_job j = {.p = p};
    nx_pool_run(p, sleep_fn, &j);
    assert_true(j.after[0] > j.before[0]); /* the barrier wait slept */
    assert_true(j.after[1] > j.before[1]); /* the flag wait slept */
    nx_pool_free(p);
}

/* Each thread's scratch: its own, aligned, zeroed at creation, kept between jobs. */
static void scratch_fn(void *arg, int ith, int nth) {
    (void)nth;
    nx_pool *p = arg;
    unsigned char *s = nx_pool_scratch(p, ith);
    s[NX_POOL_SCRATCH_BYTES - 1] = (unsigned char)(s[NX_POOL_SCRATCH_BYTES - 1] + ith + 1);
}

static void test_scratch(void **state) {
    (void)state;
    nx_pool *p = nx_pool_new(3);
    assert_non_null(p);
    for (int i = 0; i < 3; i++) {
        unsigned char *s = nx_pool_scratch(p, i);
        assert_non_null(s);
        assert_int_equal((uintptr_t)s % 64, 0);
        for (size_t k = 0; k < NX_POOL_SCRATCH_BYTES; k += 4093) assert_int_equal(s[k], 0);
        for (int o = 0; o < i; o++) assert_true(s != nx_pool_scratch(p, o));
    }
    assert_null(nx_pool_scratch(p, 3));
    assert_null(nx_pool_scratch(p, -1));
    assert_null(nx_pool_scratch(NULL, 0));
    nx_pool_run(p, scratch_fn, p);
    nx_pool_run(p, scratch_fn, p);
    for (int i = 0; i < 3; i++)
        assert_int_equal(((unsigned char *)nx_pool_scratch(p, i))[NX_POOL_SCRATCH_BYTES - 1], 2 * (i + 1));
    nx_pool_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_index_once),
        cmocka_unit_test(test_many_quick_jobs),
        cmocka_unit_test(test_sleep_and_wake),
        cmocka_unit_test(test_pool_of_one_and_null),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_shares),
        cmocka_unit_test(test_membw),
        cmocka_unit_test(test_spin_budget),
        cmocka_unit_test(test_long_waits_sleep),
        cmocka_unit_test(test_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
