/* Batches of contexts (docs/design.md §15): each context generates on its own thread, and its
 * forward calls meet the other contexts' here. A call waits until every busy context has one
 * waiting; then one of the waiting threads (the leader) runs them — trunk requests as one
 * forward, MTP requests as another, each split only where the scratch's rows run out — on the
 * batch's scratch, and wakes the others. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "model/model_internal.h"

struct nx_batch {
    nx_model *m;
    nx_ctx *scratch;
    int32_t max_seqs, n_members;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_busy;                            /* busy contexts (every one forwards or goes idle) */
    nx_fwd_req *pend[NX_BATCH_MAX_SEQS];   /* waiting requests, in arrival order */
    int n_pend;
    bool running;
    pthread_t leader;                      /* the thread running the round (running) */
    nx_batch_stats stats;
};

nx_status nx_batch_new(nx_model *m, int32_t max_seqs, int32_t max_rows, nx_batch **out, nx_error *err) {
    *out = NULL;
    if (max_seqs < 1 || max_seqs > NX_BATCH_MAX_SEQS)
        return nx_fail(err, NX_E_ARG, "batch of %d contexts (1..%d allowed)", max_seqs, NX_BATCH_MAX_SEQS);
    if (max_rows < 1) return nx_fail(err, NX_E_ARG, "batch of %d rows: must be positive", max_rows);
    if (m->dist) /* its forwards are collectives of the ranks, one context at a time */
        return nx_fail(err, NX_E_UNSUPPORTED, "a model split across ranks forwards one context at a time");
    nx_batch *b = calloc(1, sizeof *b);
    if (!b) return nx_fail(err, NX_E_NOMEM, "out of memory");
    b->m = m;
    b->max_seqs = max_seqs;
    nx_status st = nx_ctx_new_scratch(m, max_rows, max_seqs, max_seqs * (NX_MAX_DRAFT + 1), &b->scratch, err);
    if (st != NX_OK) {
        free(b);
        return st;
    }
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    *out = b;
    return NX_OK;
}

void nx_batch_free(nx_batch *b) {
    if (!b) return;
    nx_ctx_free(b->scratch);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
}

bool nx_batch_add(nx_batch *b, nx_ctx *c) {
    pthread_mutex_lock(&b->mu);
    const bool ok = b->n_members < b->max_seqs && !c->batch;
    if (ok) {
        b->n_members++;
        c->batch = b;
    }
    pthread_mutex_unlock(&b->mu);
    return ok;
}

void nx_batch_busy(nx_ctx *c, bool busy) {
    nx_batch *b = c->batch;
    if (!b) return;
    pthread_mutex_lock(&b->mu);
    if (busy != c->batch_busy) {
        c->batch_busy = busy;
        b->n_busy += busy ? 1 : -1;
        pthread_cond_broadcast(&b->cv); /* one fewer to wait for */
    }
    pthread_mutex_unlock(&b->mu);
}

void nx_batch_get_stats(nx_batch *b, nx_batch_stats *out) {
    pthread_mutex_lock(&b->mu);
    *out = b->stats;
    pthread_mutex_unlock(&b->mu);
}

/* Runs n requests of one kind (trunk or MTP): as few forwards as the scratch's rows allow, in
 * arrival order. Returns the forwards run. */
static int run_kind(nx_batch *b, nx_fwd_req **rq, int n, nx_batch_stats *st) {
    nx_ctx *s = b->scratch;
    nx_fwd_req grp[NX_BATCH_MAX_SEQS];
    int runs = 0;
    for (int i = 0; i < n;) {
        int g = 0;
        int32_t rows = 0;
        while (i < n && (g == 0 || rows + rq[i]->T <= s->n_batch)) {
            grp[g++] = *rq[i];
            rows += rq[i++]->T;
        }
        const double t0 = nx_now_s();
        if (g == 1 && grp[0].T > s->n_batch)
            for (int k = 0; k < g; k++) nx_forward_run(grp[k].c, &grp[k], 1); /* on its own scratch */
        else
            nx_forward_run(s, grp, g);
        st->seconds += nx_now_s() - t0;
        st->n_by_seqs[g < NX_BATCH_STAT_SEQS ? g : NX_BATCH_STAT_SEQS]++;
        st->forwards++;
        st->rows += rows;
        for (int k = 0; k < g; k++) rq[i - g + k]->st = grp[k].st;
        runs++;
    }
    return runs;
}

/* The leader's round: every waiting request, trunk ones first; each kind's threads are released
 * as soon as their forward is done (they sample while the other kind runs). */
static void run_round(nx_batch *b, nx_fwd_req **rq, int n) {
    nx_fwd_req *kind[2][NX_BATCH_MAX_SEQS];
    int nk[2] = {0, 0};
    for (int i = 0; i < n; i++) kind[rq[i]->mtp ? 1 : 0][nk[rq[i]->mtp ? 1 : 0]++] = rq[i];
    for (int k = 0; k < 2; k++) {
        if (!nk[k]) continue;
        nx_batch_stats st;
        memset(&st, 0, sizeof st);
        run_kind(b, kind[k], nk[k], &st);
        pthread_mutex_lock(&b->mu);
        for (int i = 0; i <= NX_BATCH_STAT_SEQS; i++) b->stats.n_by_seqs[i] += st.n_by_seqs[i];
        b->stats.forwards += st.forwards;
        b->stats.rows += st.rows;
        b->stats.seconds += st.seconds;
        for (int i = 0; i < nk[k]; i++) kind[k][i]->queued = false;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
    }
}

bool nx_batch_hold(nx_batch *b) {
    pthread_mutex_lock(&b->mu);
    if (b->running && pthread_equal(b->leader, pthread_self())) { /* within the round's own forward */
        pthread_mutex_unlock(&b->mu);
        return false;
    }
    while (b->running) pthread_cond_wait(&b->cv, &b->mu);
    b->running = true;
    b->leader = pthread_self();
    pthread_mutex_unlock(&b->mu);
    return true;
}

void nx_batch_release(nx_batch *b) {
    pthread_mutex_lock(&b->mu);
    b->running = false;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

nx_status nx_batch_submit(nx_batch *b, nx_fwd_req *rq) {
    nx_ctx *c = rq->c;
    pthread_mutex_lock(&b->mu);
    const bool was_busy = c->batch_busy; /* a call outside a generation counts while it waits */
    if (!was_busy) {
        c->batch_busy = true;
        b->n_busy++;
    }
    rq->queued = true;
    b->pend[b->n_pend++] = rq;
    while (rq->queued) {
        if (!b->running && b->n_pend > 0 && b->n_pend >= b->n_busy) {
            nx_fwd_req *mine[NX_BATCH_MAX_SEQS];
            const int n = b->n_pend;
            memcpy(mine, b->pend, sizeof(nx_fwd_req *) * (size_t)n);
            b->n_pend = 0;
            b->running = true;
            b->leader = pthread_self();
            pthread_mutex_unlock(&b->mu);
            run_round(b, mine, n);
            pthread_mutex_lock(&b->mu);
            b->running = false;
            pthread_cond_broadcast(&b->cv);
        } else {
            pthread_cond_wait(&b->cv, &b->mu);
        }
    }
    if (!was_busy) {
        c->batch_busy = false;
        b->n_busy--;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return rq->st;
}
