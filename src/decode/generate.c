/* Generation with MTP self-speculative decoding (docs/design.md §6).
 *
 * One cycle: the MTP head catches up on every committed row it has not seen (trunk hidden at p,
 * token p+1 — so its cache never has a hole), drafts d1..dk (chained on its own output hidden),
 * ONE trunk forward verifies [t_L, d1..dk], drafts are accepted by the residual (default) or
 * match rule against the target's processed distribution, and the caches are cut back to the
 * committed length. With --draft auto, k is chosen each cycle from the measured cost of verify
 * forwards and MTP rows and the running acceptance per chain position; k = 0 (plain decoding)
 * when drafting does not pay. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "decode/draft_auto.h"
#include "decode/spec_rules.h"
#include "model/step.h"

#define AUTO_MAX_DRAFT 4
#define AUTO_PROBE_FIRST 16   /* AR steps before the first probe once drafting is off ... */
#define AUTO_PROBE_MAX 1024   /* ... doubling after every probe that keeps it off */
#define AUTO_REFEED_MAX 16    /* a probe re-feeds the head at most this many skipped rows */
#define AUTO_REMEASURE 64     /* cycles between plain steps that keep C(1) current */
#define COST_WINDOW NX_AUTO_COST_WINDOW

void nx_gen_params_default(nx_gen_params *p) {
    memset(p, 0, sizeof *p);
    nx_sampler_params_default(&p->sampling);
    p->max_tokens = 128;
    p->draft = NX_DRAFT_AUTO;
    p->verify = NX_VERIFY_RESIDUAL;
    p->synthetic_accept = -1.0;
}

typedef struct gen {
    nx_ctx *c;
    const nx_gen_params *p;
    nx_sampler *s;
    nx_gen_stats *st;
    nx_token_fn on_token;
    void *user;
    int32_t V;
    int32_t *toks;   /* committed tokens t[0..L] */
    int32_t L;       /* index of the newest committed token (not yet in the trunk cache) */
    float *logits;   /* (NX_MAX_DRAFT + 1, V) */
    float *probs;    /* (NX_MAX_DRAFT + 1, V) target distributions p0..pk */
    float *qprobs;   /* (NX_MAX_DRAFT, V) draft distributions q1..qk */
    float *mlogits;  /* (1, V) MTP logits */
    bool stop;
    int32_t ar_since_probe;
    int32_t since_ar; /* speculative cycles since the last plain step */
    nx_auto_state *a; /* the context's --draft auto measurements */
    nx_traffic trunk_tr, mtp_tr; /* of the last trunk and MTP forwards (the context's sink) */
} gen;

nx_auto_state *nx_auto_of(nx_ctx *c) { return nx_ctx_decoder_slot(c, sizeof(nx_auto_state)); }

static void on_forward(void *user, bool mtp, int32_t rows, const nx_traffic *t) {
    gen *g = user;
    (void)rows;
    if (mtp) g->mtp_tr = *t;
    else g->trunk_tr = *t;
    if (mtp) { /* trunk forwards: record_trunk_cost */
        g->st->net_bytes[2] += t->net_bytes;
        g->st->net_s[2] += t->net_s;
        g->st->net_msgs[2] += t->net_msgs;
    }
}

static void hist_add(gen *g, int32_t slot, double dt) {
    int32_t *n = &g->a->hist_n[slot];
    g->a->hist[slot][*n % COST_WINDOW] = dt;
    /* a ring: past one full window, the count only keeps the write position (a context lives
     * for many generations) */
    if (++*n >= 2 * COST_WINDOW) *n -= COST_WINDOW;
}

/* Median of the recent samples of a slot, or -1 when there are none. */
static double hist_median(const gen *g, int32_t slot) {
    int32_t n = g->a->hist_n[slot] < COST_WINDOW ? g->a->hist_n[slot] : COST_WINDOW;
    if (n == 0) return -1.0;
    double v[COST_WINDOW];
    memcpy(v, g->a->hist[slot], sizeof(double) * (size_t)n);
    for (int32_t i = 1; i < n; i++)
        for (int32_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

/* One sample of slot's cost: its compute (dt less the I/O wait) to the medians, its I/O wait
 * to the moving average. */
static void cost_add(gen *g, int32_t slot, double dt, double io) {
    hist_add(g, slot, dt - io);
    g->a->io[slot] = g->a->io_n[slot]++ > 0 ? 0.9 * g->a->io[slot] + 0.1 * io : io;
}

/* Typical I/O wait of an r-row forward (streamed experts; 0 otherwise). An unmeasured size is
 * extrapolated from the largest measured one below it at half its wait per extra row: the rows
 * of a verify share most of their experts, and each distinct expert is read once. */
static double io_rows(const gen *g, int32_t r) {
    for (int32_t q = r; q >= 1; q--)
        if (g->a->io_n[q] > 0) return g->a->io[q] * (1.0 + 0.5 * (double)(r - q) / (double)q);
    return 0.0;
}

static void record_trunk_cost(gen *g, int32_t rows, double dt) {
    nx_gen_stats *st = g->st;
    /* the first forward of each size runs on cold caches: it would skew the medians */
    if (rows <= NX_MAX_DRAFT + 1 && st->cost_rows_n[rows] > 0) cost_add(g, rows, dt, g->trunk_tr.io_wait_s);
    if (rows <= NX_MAX_DRAFT + 1) {
        st->cost_rows[rows] += dt;
        st->cost_rows_n[rows]++;
    }
    const nx_traffic *tr = &g->trunk_tr;
    if (rows == 1) {
        st->n_ar_steps++;
        st->expert_bytes_ar += tr->expert_bytes;
        st->experts_touched_ar += (double)tr->experts_touched;
        for (int p = 0; p < NX_PHASES; p++) {
            st->ar_phase_s[p] += tr->phase_s[p];
            st->ar_phase_bytes[p] += tr->phase_bytes[p];
        }
    } else {
        st->n_verify_steps++;
        st->expert_bytes_verify += tr->expert_bytes;
        st->experts_touched_verify += (double)tr->experts_touched;
    }
    const int kind = rows == 1 ? 0 : 1;
    st->cache_hits[kind] += tr->cache_hits;
    st->cache_misses[kind] += tr->cache_misses;
    st->ahead_reads[kind] += tr->ahead_reads;
    st->ahead_used[kind] += tr->ahead_used;
    st->disk_bytes[kind] += tr->disk_bytes;
    st->io_wait_s[kind] += tr->io_wait_s;
    st->net_bytes[kind] += tr->net_bytes;
    st->net_s[kind] += tr->net_s;
    st->net_msgs[kind] += tr->net_msgs;
    st->topk_overlap_sum += (double)tr->overlap;
    st->topk_overlap_n += tr->overlap_pairs;
}

/* Emits one token; returns false when generation must stop. */
static bool emit(gen *g, int32_t id, const float *probs) {
    g->toks[++g->L] = id;
    nx_sampler_accept(g->s, id);
    g->st->n_generated++;
    bool eos = !g->p->ignore_eos && nx_model_is_eos(nx_ctx_model(g->c), id);
    for (size_t i = 0; i < g->p->n_stop_ids; i++) eos |= g->p->stop_ids[i] == id;
    if (g->on_token && g->on_token(g->user, id, probs)) g->stop = true;
    if (eos) {
        g->st->stopped_by_eos = true;
        g->stop = true;
    }
    if (g->st->n_generated >= g->p->max_tokens) g->stop = true;
    return !g->stop;
}

/* Typical compute seconds of an r-row trunk forward. An unmeasured size is extrapolated linearly from
 * the largest measured one below it, at the measured cost per extra row (a quarter of a plain
 * step until a multi-row forward has been timed). */
static double compute_rows(const gen *g, int32_t r) {
    double c1 = hist_median(g, 1);
    for (int32_t q = r; q >= 1; q--) {
        double cq = hist_median(g, q);
        if (cq <= 0) continue;
        if (q == r) return cq;
        double per_row = q >= 2 && c1 > 0 ? (cq - c1) / (double)(q - 1) : 0.25 * (c1 > 0 ? c1 : cq);
        if (per_row < 0) per_row = 0;
        return cq + (double)(r - q) * per_row;
    }
    return 1.0 + 0.25 * (r - 1); /* nothing measured: relative units */
}

/* Typical seconds of an r-row trunk forward: its compute and its waits on streamed experts. */
static double cost_rows(const gen *g, int32_t r) { return compute_rows(g, r) + io_rows(g, r); }

/* --draft auto: the k maximising expected tokens per second, E(k) / cost(k). */
static int32_t choose_k(gen *g) {
    /* The cost model compares against a plain step: measure it first, and now and then
     * again so that warm-up or a change in machine load does not skew the choice. */
    if (g->a->hist_n[1] < 3) return 0;
    if (g->since_ar >= (g->a->hist_n[1] < COST_WINDOW ? AUTO_REMEASURE / 8 : AUTO_REMEASURE)) return 0;
    double c_mtp = hist_median(g, 0);
    if (c_mtp < 0) c_mtp = 0.1 * cost_rows(g, 1);
    else c_mtp += g->a->io[0];
    const double ar_speed = 1.0 / cost_rows(g, 1);
    double best = ar_speed, best_ceiling = 0.0;
    int32_t best_k = 0;
    double e = 1.0, run = 1.0;
    for (int32_t k = 1; k <= AUTO_MAX_DRAFT; k++) {
        /* chain positions are explored one at a time: a draft k deep is only weighed once
         * position k-1 has been seen, so a head that never hits costs one 2-row verify to
         * learn that, not a (k+1)-row one */
        if (k > 1 && g->a->acc_d[k - 2] <= 0.0) break;
        /* optimistic prior for unexplored positions so they get tried */
        double a = (g->a->acc_n[k - 1] + 1.6) / (g->a->acc_d[k - 1] + 2.0);
        run *= a;
        e += run;
        double cost = cost_rows(g, k + 1) + (double)k * c_mtp;
        double speed = e / cost;
        /* what k drafts would give if every one were accepted */
        if ((double)(k + 1) / cost > best_ceiling) best_ceiling = (double)(k + 1) / cost;
        if (speed > best * 1.01) {
            best = speed;
            best_k = k;
        }
    }
    if (best_k > 0) {
        g->a->probe_every = AUTO_PROBE_FIRST;
        g->ar_since_probe = 0;
        return best_k;
    }
    /* Measured costs say no acceptance could pay for a verify: probing is pure loss, so it
     * happens only at the longest interval (in case the load on the machine changes). */
    if (g->a->hist_n[2] > 0 && best_ceiling < ar_speed) g->a->probe_every = AUTO_PROBE_MAX;
    if (++g->ar_since_probe >= g->a->probe_every) {
        /* Probe with one draft to keep the acceptance estimate current; back off while
         * drafting keeps not paying, so probes cost a vanishing share of the time. */
        g->ar_since_probe = 0;
        if (g->a->probe_every < AUTO_PROBE_MAX) g->a->probe_every *= 2;
        return 1;
    }
    return 0;
}

static void note_acceptance(gen *g, int32_t drafted, int32_t accepted) {
    for (int32_t i = 0; i < drafted; i++) {
        g->a->acc_n[i] = 0.97 * g->a->acc_n[i] + (i < accepted ? 1.0 : 0.0);
        g->a->acc_d[i] = 0.97 * g->a->acc_d[i] + 1.0;
    }
}

/* Match verification draws every token, drafts included, with the noise the seed assigns to its
 * output position (nx_sampler_draw_at): each emitted token is then the one plain decoding with
 * match draws there, so a seeded run's output does not depend on the draft lengths (--draft
 * auto's follow timings), and a draft agrees with the target whenever both races pick it. */
static bool keyed_draws(const gen *g) { return g->p->verify == NX_VERIFY_MATCH && g->p->synthetic_accept < 0.0; }

/* The target's own draw of the next output token. */
static int32_t target_draw(gen *g, const float *probs) {
    return keyed_draws(g) ? nx_sampler_draw_at(g->s, probs, (uint64_t)g->st->n_generated) : nx_sampler_draw(g->s, probs);
}

static nx_status ar_step(gen *g, nx_error *err) {
    g->since_ar = 0;
    double t0 = nx_now_s();
    nx_status st = nx_forward_trunk(g->c, &g->toks[g->L], 1, g->logits, 0, err);
    if (st != NX_OK) return st;
    double t1 = nx_now_s();
    record_trunk_cost(g, 1, t1 - t0);
    g->st->t_verify += t1 - t0;
    g->st->n_steps++;
    nx_sampler_probs(g->s, g->logits, NULL, 0, g->probs);
    int32_t y = target_draw(g, g->probs);
    g->st->t_sample += nx_now_s() - t1;
    emit(g, y, g->probs);
    return NX_OK;
}

static nx_status spec_cycle(gen *g, int32_t k, nx_error *err) {
    nx_ctx *c = g->c;
    nx_gen_stats *st = g->st;
    const size_t V = (size_t)g->V;
    const int32_t L = g->L;
    int32_t drafts[NX_MAX_DRAFT];
    nx_status s;
    g->since_ar++;

    /* Draft: catch the MTP cache up to row L-1 = (h[L-1], t[L]); its logits give q1. */
    double t0 = nx_now_s();
    const int32_t held = nx_mtp_n_past(c);
    if (g->p->draft == NX_DRAFT_AUTO && held > 0 && L - held > AUTO_REFEED_MAX)
        /* After a long stretch of plain decoding, re-feeding every skipped row would cost more
         * than the drafts can win back: feed only the recent rows and attend from there. */
        nx_mtp_skip_to(c, L - AUTO_REFEED_MAX);
    int32_t before = nx_mtp_n_past(c);
    if (before >= L) return nx_fail(err, NX_E_STATE, "MTP cache (%d rows) ahead of the sequence (%d)", before, L);
    if ((s = nx_mtp_catch_up(c, &g->toks[before + 1], L, g->mlogits, false, err)) != NX_OK) return s;
    const double t_catch = nx_now_s() - t0;
    st->cost_mtp_row += t_catch;
    st->cost_mtp_n++;
    /* the steady-state head cost: a catch-up of one or two rows (longer ones follow plain
     * stretches and would overstate what drafting costs per cycle) */
    if (L - before <= 2) cost_add(g, 0, t_catch, g->mtp_tr.io_wait_s);
    const double mtp_dense = (double)nx_model_get_info(nx_ctx_model(c))->mtp_bytes_dense;
    st->mtp_bytes += mtp_dense + g->mtp_tr.expert_bytes; /* the last catch-up batch */
    int32_t n = 0;
    for (;;) {
        float *q = g->qprobs + (size_t)n * V;
        nx_sampler_probs(g->s, g->mlogits, drafts, (size_t)n, q);
        /* The cutoff looks at q's confidence, never at the drawn token: a draft kept or dropped
         * depending on its own value would bias the verified distribution. */
        float qmax = 0.0f;
        for (size_t i = 0; i < V; i++) qmax = q[i] > qmax ? q[i] : qmax;
        if (qmax < g->p->draft_p_min) break;
        /* match: raced with the noise of the output position the draft would take */
        drafts[n] = keyed_draws(g) ? nx_sampler_draw_at(g->s, q, (uint64_t)(st->n_generated + n))
                                   : nx_sampler_draw(g->s, q);
        n++;
        if (n == k) break;
        double tm = nx_now_s();
        if ((s = nx_mtp_draft_next(c, drafts[n - 1], g->mlogits, err)) != NX_OK) return s;
        const double t_row = nx_now_s() - tm;
        st->cost_mtp_row += t_row;
        st->cost_mtp_n++;
        cost_add(g, 0, t_row, g->mtp_tr.io_wait_s);
        st->mtp_bytes += mtp_dense + g->mtp_tr.expert_bytes;
    }
    double t1 = nx_now_s();
    st->t_draft += t1 - t0;
    nx_mtp_commit(c, L); /* drop the provisional chain rows; committed rows stay */
    if (n == 0) return ar_step(g, err);

    /* Verify: one trunk forward over [t_L, d1..dn]. */
    int32_t rows[NX_MAX_DRAFT + 1];
    rows[0] = g->toks[L];
    memcpy(rows + 1, drafts, sizeof(int32_t) * (size_t)n);
    if ((s = nx_forward_trunk(c, rows, n + 1, g->logits, 0, err)) != NX_OK) return s;
    double t2 = nx_now_s();
    record_trunk_cost(g, n + 1, t2 - t1);
    st->t_verify += t2 - t1;
    st->n_steps++;
    st->n_drafts++;
    st->n_drafted += n;

    for (int32_t i = 0; i <= n; i++)
        nx_sampler_probs(g->s, g->logits + (size_t)i * V, drafts, (size_t)i, g->probs + (size_t)i * V);
    int32_t acc = 0;
    bool cont = true;
    for (int32_t i = 0; i < n && cont; i++) {
        const float *p = g->probs + (size_t)i * V, *q = g->qprobs + (size_t)i * V;
        bool ok;
        int32_t y;
        if (g->p->synthetic_accept >= 0.0) {
            ok = nx_sampler_uniform(g->s) < g->p->synthetic_accept;
            y = ok ? drafts[i] : nx_sampler_draw(g->s, p);
        } else if (g->p->verify == NX_VERIFY_MATCH) {
            y = nx_spec_match(p, drafts[i], g->s, (uint64_t)st->n_generated, &ok);
        } else {
            y = nx_spec_residual(p, q, drafts[i], nx_sampler_uniform(g->s), g->s, &ok);
        }
        st->drafted_at[i]++;
        if (ok) {
            st->accepted_at[i]++;
            acc++;
            cont = emit(g, y, p);
        } else {
            cont = false;
            emit(g, y, p);
        }
    }
    if (cont && acc == n)
        emit(g, target_draw(g, g->probs + (size_t)n * V), g->probs + (size_t)n * V);
    st->n_accepted += acc;
    note_acceptance(g, n, acc);
    /* Commit: the trunk keeps t_L and the accepted drafts. */
    nx_ctx_truncate(c, L + acc + 1);
    st->t_sample += nx_now_s() - t2;
    return NX_OK;
}

/* The next prompt row after `done` to make a checkpoint at (n: none before the prompt's end): a
 * multiple of the context's spacing, or the caller's row. */
static int32_t next_checkpoint(const gen *g, int32_t done, int32_t n) {
    const int32_t every = nx_ctx_checkpoint_every(g->c), own = g->p->checkpoint_at;
    if (every < 0) return n;
    int32_t at = every > 0 ? (done / every + 1) * every : n;
    if (own > done && own < at) at = own;
    return at < n ? at : n;
}

/* The prompt's rows [from, n_prompt) through the trunk (the rows before are in the cache) in chunks
 * of the context's batch; a hybrid model's chunks also end at the rows checkpoints are made at
 * (next_checkpoint). */
static nx_status prefill(gen *g, int32_t from, size_t n_prompt, nx_error *err) {
    nx_ctx *c = g->c;
    int32_t done = from, n = (int32_t)n_prompt;
    while (done < n) {
        const int32_t B = nx_ctx_n_batch(c), at = next_checkpoint(g, done, n);
        const int32_t T = at - done < B ? at - done : B;
        bool last = done + T == n;
        nx_status s = nx_forward_trunk(c, g->toks + done, T, last ? g->logits : NULL, T - 1, err);
        if (s != NX_OK) return s;
        done += T;
        if (done == at && !last) nx_ctx_checkpoint(c);
    }
    return NX_OK;
}

nx_status nx_generate(nx_ctx *c, const int32_t *prompt, size_t n_prompt, const nx_gen_params *p,
                      nx_token_fn on_token, void *user, nx_gen_stats *stats, nx_error *err) {
    nx_gen_stats local;
    nx_gen_stats *st = stats ? stats : &local;
    memset(st, 0, sizeof *st);
    nx_status s = nx_sampler_params_check(&p->sampling, err);
    if (s != NX_OK) return s;
    const nx_model *m = nx_ctx_model(c);
    const int32_t V = nx_model_get_info(m)->vocab_size, n_ctx = nx_ctx_n_ctx(c);
    if (n_prompt == 0) return nx_fail(err, NX_E_ARG, "empty prompt");
    if (p->max_tokens < 0) return nx_fail(err, NX_E_ARG, "max_tokens %d: must be >= 0", p->max_tokens);
    if (p->draft < NX_DRAFT_AUTO || p->draft > NX_MAX_DRAFT)
        return nx_fail(err, NX_E_ARG, "draft %d: must be auto, 0 or 1..%d", p->draft, NX_MAX_DRAFT);
    if (!(p->draft_p_min >= 0.0f && p->draft_p_min <= 1.0f))
        return nx_fail(err, NX_E_ARG, "draft_p_min %g: must be in [0, 1]", (double)p->draft_p_min);
    if ((int64_t)n_prompt + 1 > n_ctx)
        return nx_fail(err, NX_E_ARG, "prompt of %zu tokens does not fit the context of %d", n_prompt, n_ctx);
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return nx_fail(err, NX_E_ARG, "prompt token %zu: id %d out of range (vocabulary %d)", i, prompt[i], V);
    if ((s = nx_model_check_files(m, err)) != NX_OK) return s;

    gen g = {0};
    int64_t rw_n0 = 0; /* rewind costs before this generation */
    double rw_s0 = 0.0, rw_b0 = 0.0;
    bool rw_read = false;
    double t1 = 0.0;
    g.c = c;
    g.p = p;
    g.st = st;
    g.on_token = on_token;
    g.user = user;
    g.V = V;
    g.a = nx_auto_of(c);
    g.toks = malloc(sizeof(int32_t) * ((size_t)n_ctx + NX_MAX_DRAFT + 2));
    g.logits = malloc(sizeof(float) * (size_t)V * (NX_MAX_DRAFT + 1));
    g.probs = malloc(sizeof(float) * (size_t)V * (NX_MAX_DRAFT + 1));
    g.qprobs = malloc(sizeof(float) * (size_t)V * NX_MAX_DRAFT);
    g.mlogits = malloc(sizeof(float) * (size_t)V);
    if (!g.a || !g.toks || !g.logits || !g.probs || !g.qprobs || !g.mlogits) {
        s = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto done;
    }
    /* min_tokens: the end tokens (the model's, then the caller's stop ids) are masked in the
     * sampler, so drafts and verification see the same distributions */
    nx_sampler_params sp = p->sampling;
    int32_t *ban = NULL;
    if (p->min_tokens > 0 && !(p->ignore_eos && p->n_stop_ids == 0)) {
        const int32_t *eos;
        const size_t n_eos = p->ignore_eos ? 0 : nx_model_eos_ids(m, &eos);
        if (!(ban = malloc(sizeof(int32_t) * (n_eos + p->n_stop_ids + 1)))) {
            s = nx_fail(err, NX_E_NOMEM, "out of memory");
            goto done;
        }
        size_t nb = 0;
        for (size_t i = 0; i < n_eos; i++)
            if (eos[i] >= 0 && eos[i] < V) ban[nb++] = eos[i];
        for (size_t i = 0; i < p->n_stop_ids; i++)
            if (p->stop_ids[i] >= 0 && p->stop_ids[i] < V) ban[nb++] = p->stop_ids[i];
        sp.ban = ban, sp.n_ban = nb, sp.ban_until = p->min_tokens;
    }
    if (g.a->probe_every == 0) g.a->probe_every = AUTO_PROBE_FIRST;
    s = nx_sampler_new(&sp, V, &g.s, err);
    free(ban);
    if (s != NX_OK) goto done;
    nx_sampler_set_prompt(g.s, prompt, n_prompt);
    memcpy(g.toks, prompt, sizeof(int32_t) * n_prompt);
    /* keep the cached rows of the longest common prefix, less the prompt's last token */
    int32_t keep = nx_ctx_shared_prefix(c, prompt, (int32_t)n_prompt - 1);
    nx_ctx_truncate(c, keep);
    /* The head's rows that pair a kept hidden state with a kept next token are the ones its prefill
     * below would compute again (the numerics contract), so they stay; the rest is rebuilt. A
     * head that attends from a later row (nx_mtp_skip_to) starts over, as a fresh prefill does. */
    if (nx_mtp_first(c) > 0) nx_mtp_reset(c);
    else nx_mtp_commit(c, keep > 0 ? keep - 1 : 0);
    nx_ctx_keep_state_at(c, (int32_t)n_prompt - 1); /* what the same prompt keeps next time */
    const nx_fwd_sink sink = {on_forward, &g};
    nx_ctx_set_sink(c, &sink);
    st->n_prompt = (int64_t)n_prompt;
    st->n_cached = keep;
    nx_ctx_rewind_cost(c, &rw_n0, &rw_s0, &rw_b0);
    rw_read = true;

    double t0 = nx_now_s();
    const bool can_draft = nx_model_has_mtp(m) && p->draft != 0;
    if ((s = prefill(&g, keep, n_prompt, err)) != NX_OK) goto done;
    g.L = (int32_t)n_prompt - 1;
    t1 = nx_now_s();
    st->t_prefill = t1 - t0;
    if (p->max_tokens == 0) goto done;
    nx_sampler_probs(g.s, g.logits, NULL, 0, g.probs);
    emit(&g, target_draw(&g, g.probs), g.probs);
    /* The head's prefill: teacher-forced rows (h_p, t[p+1]) over the prompt rows its cache does not
     * hold, so it holds the full context before the first draft (row n-1 waits for the sampled
     * token). The first token needs only the trunk's logits, so it goes out before these rows run
     * (they take neither the sampler's draws nor the trunk's rows); their time counts as prefill. */
    if (can_draft && p->max_tokens > 1 && !g.stop) {
        const double tm = nx_now_s();
        st->n_mtp_prompt = (int32_t)n_prompt - 1 - nx_mtp_n_past(c);
        if ((s = nx_mtp_catch_up(c, g.toks + nx_mtp_n_past(c) + 1, (int32_t)n_prompt - 1, NULL, false, err)) != NX_OK)
            goto done;
        t1 = nx_now_s();
        st->t_prefill += t1 - tm;
    }

    while (!g.stop) {
        int32_t room = n_ctx - g.L - 1; /* trunk rows still free after t_L */
        if (room < 0) break;
        int32_t k = can_draft ? (p->draft == NX_DRAFT_AUTO ? choose_k(&g) : p->draft) : 0;
        int32_t left = p->max_tokens - (int32_t)st->n_generated;
        if (k > left - 1) k = left - 1;
        if (k > room) k = room;
        if (k < 0) k = 0;
        s = k == 0 ? ar_step(&g, err) : spec_cycle(&g, k, err);
        if (s != NX_OK) goto done;
    }
done:
    if (rw_read) {
        int64_t rw_n;
        double rw_s, rw_b;
        nx_ctx_rewind_cost(c, &rw_n, &rw_s, &rw_b);
        st->n_rewinds = rw_n - rw_n0, st->t_rewind = rw_s - rw_s0, st->rewind_bytes = rw_b - rw_b0;
    }
    nx_ctx_set_sink(c, NULL);
    if (s == NX_OK && t1 > 0.0) st->t_decode = nx_now_s() - t1;
    nx_sampler_free(g.s);
    free(g.toks);
    free(g.logits);
    free(g.probs);
    free(g.qprobs);
    free(g.mlogits);
    return s;
}
