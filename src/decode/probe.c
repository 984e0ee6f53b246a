/* Teacher-forced MTP acceptance probe; see probe.h. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "decode/probe.h"
#include "decode/spec_rules.h"
#include "model/step.h"

static int32_t argmax(const float *x, int64_t n) {
    int32_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = (int32_t)i;
    return b;
}

/* Scores the draft logits `q_logits` that predict token index `target` of the window. */
static void score(nx_probe_result *res, int32_t j, const float *q_logits, const float *t_logits,
                  int32_t text_tok, nx_sampler *s, float *pbuf, float *qbuf, int32_t V, uint8_t *hit) {
    int32_t d = argmax(q_logits, V);
    res->n[j]++;
    res->hit_text[j] += d == text_tok;
    res->hit_trunk[j] += d == argmax(t_logits, V);
    if (hit) *hit = d == argmax(t_logits, V);
    if (s) {
        nx_sampler_probs(s, t_logits, NULL, 0, pbuf);
        nx_sampler_probs(s, q_logits, NULL, 0, qbuf);
        res->overlap[j] += nx_spec_overlap(pbuf, qbuf, V);
    }
}

static nx_status probe(nx_model *m, const int32_t *ids, size_t n, int32_t k, int32_t window,
                       const nx_sampler_params *sp, nx_probe_result *res, uint8_t *hits, nx_error *err) {
    if (!nx_model_has_mtp(m)) return nx_fail(err, NX_E_STATE, "the model has no MTP head to probe");
    if (k < 1 || k > NX_MAX_DRAFT) return nx_fail(err, NX_E_ARG, "probe depth %d: must be 1..%d", k, NX_MAX_DRAFT);
    if (window < k + 2) return nx_fail(err, NX_E_ARG, "probe window %d too small", window);
    const int32_t V = nx_model_get_info(m)->vocab_size;
    res->k = k;
    nx_status st = NX_OK;
    nx_ctx *c = NULL;
    nx_sampler *s = NULL;
    float *tl = NULL, *ml = NULL, *pbuf = NULL, *qbuf = NULL;
    if ((st = nx_ctx_new(m, window + k + 1, &c, err)) != NX_OK) return st;
    if (sp && sp->temperature > 0.0f) {
        nx_sampler_params q = *sp;
        q.repetition_penalty = 1.0f;
        q.presence_penalty = q.frequency_penalty = 0.0f;
        if ((st = nx_sampler_new(&q, V, &s, err)) != NX_OK) goto done;
        res->sampled = true;
    }
    tl = malloc(sizeof(float) * (size_t)V * (size_t)window);
    ml = malloc(sizeof(float) * (size_t)V * (size_t)window);
    pbuf = malloc(sizeof(float) * (size_t)V);
    qbuf = malloc(sizeof(float) * (size_t)V);
    if (!tl || !ml || !pbuf || !qbuf) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto done;
    }
    for (size_t off = 0; off + 3 <= n; off += (size_t)window) {
        const int32_t W = (int32_t)(n - off < (size_t)window ? n - off : (size_t)window);
        const int32_t *t = ids + off;
        nx_ctx_truncate(c, 0);
        if ((st = nx_ctx_eval(c, t, W, 0, tl, err)) != NX_OK) goto done;
        res->n_tokens += W;
        if (k == 1) {
            /* all rows at once: row p predicts t[p+2], which the trunk predicts at row p+1 */
            if ((st = nx_mtp_catch_up(c, t + 1, W - 1, ml, true, err)) != NX_OK) goto done;
            for (int32_t p = 0; p + 2 < W; p++)
                score(res, 0, ml + (size_t)p * V, tl + (size_t)(p + 1) * V, t[p + 2], s, pbuf, qbuf, V,
                      hits ? hits + off + (size_t)p : NULL);
            continue;
        }
        for (int32_t p = 0; p + 2 < W; p++) {
            if ((st = nx_mtp_catch_up(c, t + nx_mtp_n_past(c) + 1, p + 1, ml, false, err)) != NX_OK) goto done;
            score(res, 0, ml, tl + (size_t)(p + 1) * V, t[p + 2], s, pbuf, qbuf, V,
                  hits ? hits + off + (size_t)p : NULL);
            for (int32_t j = 1; j < k && p + j + 2 < W; j++) {
                if ((st = nx_mtp_draft_next(c, t[p + j + 1], ml, err)) != NX_OK) goto done;
                score(res, j, ml, tl + (size_t)(p + j + 1) * V, t[p + j + 2], s, pbuf, qbuf, V, NULL);
            }
            nx_mtp_commit(c, p + 1);
        }
    }
done:
    free(tl);
    free(ml);
    free(pbuf);
    free(qbuf);
    nx_sampler_free(s);
    nx_ctx_free(c);
    return st;
}

nx_status nx_probe_tokens(nx_model *m, const int32_t *ids, size_t n, int32_t k, int32_t window,
                          const nx_sampler_params *sp, nx_probe_result *res, nx_error *err) {
    return probe(m, ids, n, k, window, sp, res, NULL, err);
}

nx_status nx_probe_hits(nx_model *m, const int32_t *ids, size_t n, int32_t window, uint8_t *hits,
                        nx_error *err) {
    nx_probe_result res = {0};
    memset(hits, 0, n);
    return probe(m, ids, n, 1, window, NULL, &res, hits, err);
}
