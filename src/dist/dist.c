/* The MPI transport (dist.h). Every operation is non-blocking and completed by polling with a
 * deadline: MPI's blocking calls wait forever for a rank that died, and on an oversubscribed host
 * a rank spinning in MPI_Wait takes the core the rank it waits for needs, so the poll backs off
 * to short sleeps after a brief spin. Errors return (MPI_ERRORS_RETURN) instead of aborting. */
#include <mpi.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"
#include "dist/dist.h"

struct nx_dist {
    MPI_Comm comm;
    int rank, size;
    double timeout_s;
    nx_net net;
    void (*at_finish)(void *);
    void *at_finish_user;
    char failure[256];
    atomic_bool failed; /* set once failure is written: other threads may read it then */
};

static int inited_here;

nx_status nx_dist_init(int *argc, char ***argv, double timeout_s, nx_dist **out, nx_error *err) {
    *out = NULL;
    int have = 0;
    MPI_Initialized(&have);
    if (!have) {
        int provided = 0;
        /* the compute threads never call MPI: only the thread that forwards does */
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return nx_fail(err, NX_E_IO, "--split: MPI_Init failed (start the ranks with mpirun)");
        inited_here = 1;
    }
    nx_dist *d = calloc(1, sizeof *d);
    if (!d) return nx_fail(err, NX_E_NOMEM, "out of memory");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_dup(MPI_COMM_WORLD, &d->comm);
    MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(d->comm, &d->rank);
    MPI_Comm_size(d->comm, &d->size);
    d->timeout_s = timeout_s > 0 ? timeout_s : 300;
    *out = d;
    return NX_OK;
}

int nx_dist_rank(const nx_dist *d) { return d ? d->rank : 0; }
int nx_dist_size(const nx_dist *d) { return d ? d->size : 1; }
void nx_dist_net(const nx_dist *d, nx_net *out) { *out = d->net; }
const char *nx_dist_failure(const nx_dist *d) { return d->failure; }
bool nx_dist_has_failed(const nx_dist *d) { return d && atomic_load_explicit(&d->failed, memory_order_acquire); }

void nx_dist_at_finish(nx_dist *d, void (*fn)(void *), void *user) {
    d->at_finish = fn;
    d->at_finish_user = user;
}

/* After a failure the job cannot finalize (a rank is gone or hangs): it is aborted, which ends
 * every rank still running, instead of leaving them waiting. */
void nx_dist_finish(nx_dist *d, bool abort) {
    if (!d) return;
    if (d->at_finish && !abort) d->at_finish(d->at_finish_user);
    if (d->failure[0] || abort) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Comm_free(&d->comm);
    free(d);
    if (inited_here) MPI_Finalize();
    inited_here = 0;
}

/* Records the first failure (MPI's error code, or code MPI_SUCCESS: the deadline passed) and
 * returns it as err. */
static nx_status failed(nx_dist *d, nx_error *err, const char *what, int peer, int code) {
    if (!d->failure[0]) {
        char msg[MPI_MAX_ERROR_STRING] = "";
        int len = 0;
        char who[32] = "the other ranks";
        if (peer >= 0) snprintf(who, sizeof who, "rank %d", peer);
        if (code != MPI_SUCCESS) {
            MPI_Error_string(code, msg, &len);
            snprintf(d->failure, sizeof d->failure, "rank %d: %s %s failed: %.160s", d->rank, what, who, msg);
        } else {
            snprintf(d->failure, sizeof d->failure, "rank %d: %s %s: no answer within %.0f s (a rank died or hangs)",
                     d->rank, what, who, d->timeout_s);
        }
        atomic_store_explicit(&d->failed, true, memory_order_release);
    }
    return nx_fail(err, NX_E_RANK, "%s", d->failure);
}

/* Completes r, polling: spins 100 us, then sleeps 10 us doubling to 200 us between tests (a rank
 * idle between commands sleeps up to 1 ms). */
static nx_status wait_req(nx_dist *d, MPI_Request *r, const char *what, int peer, bool forever, nx_error *err) {
    const double t0 = nx_now_s();
    long sleep_ns = 10000;
    const long cap_ns = forever ? 1000000 : 200000;
    for (;;) {
        int done = 0;
        const int rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return failed(d, err, what, peer, rc);
        if (done) break;
        const double now = nx_now_s();
        if (now - t0 < 100e-6) continue;
        /* past the deadline the request is left pending: the job is aborted (a collective's
         * request cannot be cancelled) */
        if (!forever && now - t0 > d->timeout_s) return failed(d, err, what, peer, MPI_SUCCESS);
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < cap_ns) sleep_ns *= 2;
    }
    d->net.seconds += forever ? 0 : nx_now_s() - t0;
    return NX_OK;
}

static nx_status check(nx_dist *d, nx_error *err) {
    return d->failure[0] ? nx_fail(err, NX_E_RANK, "%s", d->failure) : NX_OK;
}

nx_status nx_dist_bcast(nx_dist *d, void *buf, size_t bytes, bool forever, nx_error *err) {
    if (check(d, err) != NX_OK) return NX_E_RANK;
    if (d->size == 1) return NX_OK;
    MPI_Request r;
    const int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, d->comm, &r);
    if (rc != MPI_SUCCESS) return failed(d, err, "command from", 0, rc);
    if (d->rank == 0) {
        d->net.bytes += (double)bytes * (d->size - 1);
        d->net.messages += d->size - 1;
    } else {
        d->net.recv += (double)bytes;
    }
    return wait_req(d, &r, d->rank == 0 ? "command to" : "command from", d->rank == 0 ? -1 : 0,
                    forever && d->rank != 0, err);
}

nx_status nx_dist_send(nx_dist *d, int to, const void *buf, size_t bytes, nx_error *err) {
    if (check(d, err) != NX_OK) return NX_E_RANK;
    MPI_Request r;
    const int rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, to, 1, d->comm, &r);
    if (rc != MPI_SUCCESS) return failed(d, err, "send to", to, rc);
    d->net.bytes += (double)bytes;
    d->net.messages++;
    return wait_req(d, &r, "send to", to, false, err);
}

nx_status nx_dist_recv(nx_dist *d, int from, void *buf, size_t bytes, nx_error *err) {
    if (check(d, err) != NX_OK) return NX_E_RANK;
    MPI_Request r;
    const int rc = MPI_Irecv(buf, (int)bytes, MPI_BYTE, from, 1, d->comm, &r);
    if (rc != MPI_SUCCESS)
        return failed(d, err, "receive from", from, rc);
    d->net.recv += (double)bytes;
    return wait_req(d, &r, "receive from", from, false, err);
}

nx_status nx_dist_allgather(nx_dist *d, void *buf, const int64_t *bytes, nx_error *err) {
    if (check(d, err) != NX_OK) return NX_E_RANK;
    if (d->size == 1) return NX_OK;
    int counts[64], displs[64];
    if (d->size > 64) return nx_fail(err, NX_E_UNSUPPORTED, "--split: at most 64 ranks");
    int64_t off = 0;
    for (int q = 0; q < d->size; q++) {
        counts[q] = (int)bytes[q];
        displs[q] = (int)off;
        off += bytes[q];
    }
    MPI_Request r;
    const int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_BYTE, d->comm, &r);
    if (rc != MPI_SUCCESS)
        return failed(d, err, "expert exchange with", -1, rc);
    d->net.bytes += (double)bytes[d->rank] * (d->size - 1);
    d->net.recv += (double)(off - bytes[d->rank]);
    d->net.messages += d->size - 1;
    return wait_req(d, &r, "expert exchange with", -1, false, err);
}

nx_status nx_dist_job_net(nx_dist *d, nx_net *sum, nx_error *err) {
    double mine[3] = {d->net.bytes, d->net.seconds, (double)d->net.messages}, all[3] = {0};
    if (check(d, err) != NX_OK) return NX_E_RANK;
    MPI_Request r;
    const int rc = MPI_Ireduce(mine, all, 3, MPI_DOUBLE, MPI_SUM, 0, d->comm, &r);
    if (rc != MPI_SUCCESS) return failed(d, err, "counters to", 0, rc);
    nx_status st = wait_req(d, &r, "counters from", -1, false, err);
    *sum = (nx_net){.bytes = all[0], .seconds = all[1], .messages = (int64_t)all[2]};
    return st;
}
