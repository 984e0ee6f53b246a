/* Sampler tests: the processed distribution against a literal reference written here (sort the
 * whole vocabulary, apply each rule as stated), the edge rules (greedy ties, top-p never empty,
 * min-p, penalties with extra tokens, exact rewind), parameter checks, and the draw's fit to its
 * distribution (chi-square p-value). Fixed seeds keep every statistical check deterministic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chisq.h"
#include "nextn.h"

/* ---------------------------------------------------------------- the reference */

typedef struct ref_item {
    double x;
    int32_t id;
} ref_item;

static int ref_cmp(const void *pa, const void *pb) {
    const ref_item *a = pa, *b = pb;
    if (a->x != b->x) return a->x > b->x ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

typedef struct history {
    const int32_t *prompt, *gen, *extra;
    size_t n_prompt, n_gen, n_extra;
} history;

/* The documented pipeline, step by step, in the most direct form: every token is penalised,
 * the whole vocabulary is sorted, and each filter is applied to the sorted list. */
static void ref_probs(const nx_sampler_params *p, const float *logits, int32_t V,
                      const history *h, double *out) {
    int32_t *count = calloc((size_t)V, sizeof *count);
    char *in_prompt = calloc((size_t)V, 1);
    ref_item *it = malloc((size_t)V * sizeof *it);
    double *pr = malloc((size_t)V * sizeof *pr);
    assert_non_null(count);
    assert_non_null(in_prompt);
    assert_non_null(it);
    assert_non_null(pr);
    for (size_t i = 0; i < h->n_prompt; i++) in_prompt[h->prompt[i]] = 1;
    for (size_t i = 0; i < h->n_gen; i++) count[h->gen[i]]++;
    for (size_t i = 0; i < h->n_extra; i++) count[h->extra[i]]++;

    /* Logit bias, then penalties (the penalised logit is a float, as the logits are). */
    float *bias = calloc((size_t)V, sizeof *bias);
    assert_non_null(bias);
    for (size_t i = 0; i < p->n_logit_bias; i++) bias[p->logit_bias[i].id] += p->logit_bias[i].bias;
    for (int32_t i = 0; i < V; i++) {
        float v = logits[i] + bias[i];
        if ((count[i] > 0 || in_prompt[i]) && p->repetition_penalty != 1.0f)
            v = v > 0.0f ? v / p->repetition_penalty : v * p->repetition_penalty;
        v -= p->frequency_penalty * (float)count[i];
        if (count[i] > 0) v -= p->presence_penalty;
        it[i] = (ref_item){v, i};
    }
    for (int32_t i = 0; i < V; i++) out[i] = 0.0;
    qsort(it, (size_t)V, sizeof *it, ref_cmp);

    if (p->temperature == 0.0f) {
        out[it[0].id] = 1.0; /* sorted by (logit desc, id asc): the lowest id among the maxima */
        goto done;
    }
    int32_t keep = V;
    if (p->top_k > 0 && p->top_k < V) keep = p->top_k;
    double z = 0.0;
    for (int32_t j = 0; j < keep; j++) {
        pr[j] = exp((it[j].x - it[0].x) / (double)p->temperature);
        z += pr[j];
    }
    for (int32_t j = 0; j < keep; j++) pr[j] /= z;
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        for (int32_t j = 0; j < keep; j++) {
            cum += pr[j];
            if (cum >= (double)p->top_p) {
                keep = j + 1;
                break;
            }
        }
    }
    double z2 = 0.0;
    for (int32_t j = 0; j < keep; j++) {
        if (pr[j] < (double)p->min_p * pr[0]) pr[j] = 0.0;
        z2 += pr[j];
    }
    for (int32_t j = 0; j < keep; j++) out[it[j].id] = pr[j] / z2;
done:
    free(bias);
    free(count);
    free(in_prompt);
    free(it);
    free(pr);
}

/* ---------------------------------------------------------------- helpers */

static nx_sampler *new_sampler(const nx_sampler_params *p, int32_t V) {
    nx_sampler *s = NULL;
    nx_error err = {0};
    nx_status st = nx_sampler_new(p, V, &s, &err);
    if (st != NX_OK) fprintf(stderr, "nx_sampler_new: %s\n", err.msg);
    assert_int_equal(st, NX_OK);
    assert_non_null(s);
    return s;
}

static nx_sampler *new_sampler_with(const nx_sampler_params *p, int32_t V, const history *h) {
    nx_sampler *s = new_sampler(p, V);
    nx_sampler_set_prompt(s, h->prompt, h->n_prompt);
    for (size_t i = 0; i < h->n_gen; i++) nx_sampler_accept(s, h->gen[i]);
    return s;
}

static double max_abs_diff(const float *a, const double *b, int32_t V) {
    double m = 0.0;
    for (int32_t i = 0; i < V; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static double sum_f(const float *a, int32_t V) {
    double s = 0.0;
    for (int32_t i = 0; i < V; i++) s += a[i];
    return s;
}

static void random_logits(uint64_t *r, float *l, int32_t V, double scale, bool coarse) {
    for (int32_t i = 0; i < V; i++) {
        double v = trng_normal(r) * scale;
        if (coarse) v = round(v * 2.0) / 2.0; /* many exact ties */
        l[i] = (float)v;
    }
}

static void random_ids(uint64_t *r, int32_t *ids, size_t n, int32_t V) {
    for (size_t i = 0; i < n; i++) ids[i] = trng_int(r, V);
}

static void random_params(uint64_t *r, int32_t V, nx_sampler_params *p) {
    nx_sampler_params_default(p);
    p->temperature = trng_uniform(r) < 0.1 ? 0.0f : (float)(0.2 + 1.8 * trng_uniform(r));
    switch (trng_int(r, 6)) {
    case 0: p->top_k = 0; break;
    case 1: p->top_k = 1; break;
    case 2: p->top_k = 2; break;
    case 3: p->top_k = V; break;
    case 4: p->top_k = V + 5; break;
    default: p->top_k = 1 + trng_int(r, V); break;
    }
    p->top_p = trng_uniform(r) < 0.4 ? 1.0f : (float)(0.02 + 0.97 * trng_uniform(r));
    switch (trng_int(r, 4)) {
    case 0: p->min_p = 0.0f; break;
    case 1: p->min_p = 1.0f; break;
    default: p->min_p = (float)(0.5 * trng_uniform(r)); break;
    }
    if (trng_uniform(r) < 0.5) p->repetition_penalty = (float)(0.5 + 1.5 * trng_uniform(r));
    if (trng_uniform(r) < 0.5) p->presence_penalty = (float)(-2.0 + 4.0 * trng_uniform(r));
    if (trng_uniform(r) < 0.5) p->frequency_penalty = (float)(-2.0 + 4.0 * trng_uniform(r));
    static nx_logit_bias lb[6]; /* the tests run one case at a time */
    if (trng_uniform(r) < 0.5) {
        p->n_logit_bias = 1 + (size_t)trng_int(r, 6);
        for (size_t i = 0; i < p->n_logit_bias; i++) /* small biases that reorder, and ±100 */
            lb[i] = (nx_logit_bias){trng_int(r, V), trng_uniform(r) < 0.2 ? (trng_uniform(r) < 0.5 ? -100.0f : 100.0f)
                                                                           : (float)(-4.0 + 8.0 * trng_uniform(r))};
        p->logit_bias = lb;
    }
    p->seed = trng_next(r);
}

/* Compares one random case against the reference; returns the max |dp|. */
static double check_case(uint64_t *r, int32_t V, const nx_sampler_params *p, double scale,
                         bool coarse) {
    float *logits = malloc((size_t)V * sizeof *logits);
    float *probs = malloc((size_t)V * sizeof *probs);
    double *ref = malloc((size_t)V * sizeof *ref);
    int32_t ids[64 * 3];
    assert_non_null(logits);
    assert_non_null(probs);
    assert_non_null(ref);
    random_logits(r, logits, V, scale, coarse);
    history h = {ids, ids + 64, ids + 128, (size_t)trng_int(r, 64), (size_t)trng_int(r, 64),
                 (size_t)trng_int(r, 9)};
    random_ids(r, ids, 64 * 3, V);

    nx_sampler *s = new_sampler_with(p, V, &h);
    nx_sampler_probs(s, logits, h.extra, h.n_extra, probs);
    ref_probs(p, logits, V, &h, ref);
    double d = max_abs_diff(probs, ref, V);
    /* The kept set must match exactly, not just within tolerance: a wrong token at the top-k or
     * nucleus boundary can carry a tiny mass. (A float output underflows to 0 below ~1e-45.) */
    for (int32_t i = 0; i < V; i++) {
        if (ref[i] == 0.0 && probs[i] != 0.0) d = fmax(d, 1.0);
        if (ref[i] > 1e-37 && probs[i] == 0.0f) d = fmax(d, 1.0);
    }
    if (d >= 1e-6)
        fprintf(stderr,
                "mismatch %.3g: V=%d T=%g k=%d top_p=%.9g min_p=%g rep=%g pres=%g freq=%g\n", d,
                (int)V, (double)p->temperature, (int)p->top_k, (double)p->top_p,
                (double)p->min_p, (double)p->repetition_penalty, (double)p->presence_penalty,
                (double)p->frequency_penalty);
    assert_true(fabs(sum_f(probs, V) - 1.0) < 1e-5);
    nx_sampler_free(s);
    free(logits);
    free(probs);
    free(ref);
    return d;
}

/* ---------------------------------------------------------------- tests */

static void test_probs_match_reference(void **state) {
    (void)state;
    uint64_t r = 0x5a3e11;
    static const int32_t vocabs[] = {1, 2, 3, 7, 50, 333, 2000};
    static const double scales[] = {0.05, 0.5, 3.0, 10.0};
    double worst = 0.0;
    for (int t = 0; t < 600; t++) {
        int32_t V = vocabs[trng_int(&r, 7)];
        nx_sampler_params p;
        random_params(&r, V, &p);
        worst = fmax(worst, check_case(&r, V, &p, scales[trng_int(&r, 4)], t % 3 == 0));
    }
    assert_true(worst < 1e-6);
}

static void test_probs_full_vocab(void **state) {
    (void)state;
    uint64_t r = 0xb16b00;
    const int32_t V = 120832;
    double worst = 0.0;
    for (int t = 0; t < 6; t++) {
        nx_sampler_params p;
        random_params(&r, V, &p);
        if (t == 0) p.top_k = 0, p.top_p = 0.95f, p.min_p = 0.0f, p.temperature = 1.0f;
        if (t == 1) p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f, p.temperature = 0.7f;
        if (t == 2) p.top_k = 40, p.top_p = 0.9f, p.min_p = 0.05f, p.temperature = 0.8f;
        worst = fmax(worst, check_case(&r, V, &p, 3.0, false));
    }
    assert_true(worst < 1e-6);
}

static void test_greedy_ties_lowest_id(void **state) {
    (void)state;
    const int32_t V = 10;
    float logits[10], probs[10];
    for (int i = 0; i < V; i++) logits[i] = (float)(i % 3);
    /* maxima (2.0) at ids 2, 5, 8 */
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    nx_sampler *s = new_sampler(&p, V);
    assert_true(nx_sampler_is_greedy(s));
    nx_sampler_probs(s, logits, NULL, 0, probs);
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == 2 ? 1.0f : 0.0f));
    for (int n = 0; n < 100; n++) assert_int_equal(nx_sampler_draw(s, probs), 2);

    /* A penalty that pushes id 2 down leaves 5 as the lowest id of the remaining maxima. */
    nx_sampler_free(s);
    p.presence_penalty = 0.5f;
    s = new_sampler(&p, V);
    nx_sampler_accept(s, 2);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    assert_true(probs[5] == 1.0f);
    /* The same through `extra` instead of history. */
    nx_sampler_rewind(s, 0);
    int32_t ex = 5;
    nx_sampler_probs(s, logits, &ex, 1, probs);
    assert_true(probs[2] == 1.0f);
    nx_sampler_free(s);

    /* Top-k = 1 at a positive temperature breaks the same tie the same way. */
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.top_k = 1;
    s = new_sampler(&p, V);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    assert_true(probs[2] == 1.0f);
    assert_false(nx_sampler_is_greedy(s));
    nx_sampler_free(s);
}

static void test_top_p_keeps_one(void **state) {
    (void)state;
    const int32_t V = 64;
    float logits[64], probs[64];
    uint64_t r = 77;
    random_logits(&r, logits, V, 1.0, false);
    int32_t arg = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[arg]) arg = i;
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.top_p = 1e-6f; /* smaller than any single token's mass: the nucleus is the top token */
    nx_sampler *s = new_sampler(&p, V);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == arg ? 1.0f : 0.0f));

    /* A flat row: every token ties, the nucleus of one is the lowest id. */
    for (int i = 0; i < V; i++) logits[i] = 0.25f;
    nx_sampler_probs(s, logits, NULL, 0, probs);
    assert_true(probs[0] == 1.0f);

    /* top_p = 1/V + a bit on a flat row keeps exactly the two lowest ids. */
    nx_sampler_free(s);
    p.top_p = 1.5f / (float)V;
    s = new_sampler(&p, V);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i < 2 ? 0.5f : 0.0f));
    nx_sampler_free(s);
}

static void test_min_p(void **state) {
    (void)state;
    const int32_t V = 200;
    float logits[200], probs[200], full[200];
    uint64_t r = 99;
    random_logits(&r, logits, V, 2.0, false);
    logits[17] = logits[150] = 9.0f; /* two tied maxima */
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 0.9f;
    nx_sampler *s = new_sampler(&p, V);
    nx_sampler_probs(s, logits, NULL, 0, full);
    nx_sampler_free(s);

    static const float min_ps[] = {1e-3f, 0.01f, 0.1f, 0.5f, 1.0f};
    for (int t = 0; t < 5; t++) {
        p.min_p = min_ps[t];
        s = new_sampler(&p, V);
        nx_sampler_probs(s, logits, NULL, 0, probs);
        double pmax = full[17], kept = 0.0;
        for (int i = 0; i < V; i++) {
            bool keep = (double)full[i] >= (double)p.min_p * pmax;
            assert_true(keep == (probs[i] > 0.0f));
            if (keep) kept += full[i];
        }
        /* Survivors keep their relative odds: renormalised by the kept mass. */
        for (int i = 0; i < V; i++)
            if (probs[i] > 0.0f) assert_true(fabs(probs[i] - full[i] / kept) < 1e-6);
        nx_sampler_free(s);
    }
    /* min_p = 1 keeps exactly the tied maxima, half each. */
    p.min_p = 1.0f;
    s = new_sampler(&p, V);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == 17 || i == 150 ? 0.5f : 0.0f));
    nx_sampler_free(s);
}

/* Penalties with prompt, history and extra tokens against the reference, and the promise that
 * `extra` is history for that call only and is the same as having accepted those tokens. */
static void test_penalties_history_extra(void **state) {
    (void)state;
    const int32_t V = 40;
    float logits[40], a[40], b[40], c[40];
    double ref[40];
    uint64_t r = 4242;
    for (int t = 0; t < 50; t++) {
        random_logits(&r, logits, V, 4.0, false);
        int32_t prompt[12], gen[20], extra[5];
        random_ids(&r, prompt, 12, V);
        random_ids(&r, gen, 20, V);
        random_ids(&r, extra, 5, V);
        nx_sampler_params p;
        nx_sampler_params_default(&p);
        p.temperature = 0.8f;
        p.repetition_penalty = (float)(0.5 + 2.0 * trng_uniform(&r));
        p.presence_penalty = (float)(-2.0 + 4.0 * trng_uniform(&r));
        p.frequency_penalty = (float)(-2.0 + 4.0 * trng_uniform(&r));
        history h = {prompt, gen, extra, 12, 20, 5};
        nx_sampler *s = new_sampler_with(&p, V, &h);

        nx_sampler_probs(s, logits, NULL, 0, a);
        nx_sampler_probs(s, logits, extra, 5, b);
        ref_probs(&p, logits, V, &h, ref);
        assert_true(max_abs_diff(b, ref, V) < 1e-6);
        nx_sampler_probs(s, logits, NULL, 0, c);
        assert_memory_equal(a, c, sizeof a); /* the extra tokens left no trace */

        for (int i = 0; i < 5; i++) nx_sampler_accept(s, extra[i]);
        nx_sampler_probs(s, logits, NULL, 0, c);
        assert_memory_equal(b, c, sizeof b); /* extra == accepted, bit for bit */
        nx_sampler_free(s);
    }

    /* The sign rule of the repetition penalty: whatever its logit's sign, a seen token loses odds
     * against an unseen one. */
    float l2[4] = {2.0f, -1.0f, 0.5f, -3.0f};
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    nx_sampler *s0 = new_sampler(&p, 4);
    nx_sampler_probs(s0, l2, NULL, 0, a);
    p.repetition_penalty = 1.5f;
    nx_sampler *s1 = new_sampler(&p, 4);
    int32_t seen[2] = {0, 1}; /* one positive and one negative logit */
    nx_sampler_set_prompt(s1, seen, 2);
    nx_sampler_probs(s1, l2, NULL, 0, b);
    for (int seen_id = 0; seen_id < 2; seen_id++)
        for (int unseen = 2; unseen < 4; unseen++)
            assert_true(b[seen_id] / b[unseen] < a[seen_id] / a[unseen]);
    assert_true(fabs(b[2] / b[3] - a[2] / a[3]) < 1e-5 * (a[2] / a[3]));
    nx_sampler_free(s0);
    nx_sampler_free(s1);
}

static void test_rewind_restores(void **state) {
    (void)state;
    const int32_t V = 300;
    float logits[300], a[300], b[300];
    uint64_t r = 1234;
    random_logits(&r, logits, V, 3.0, false);
    int32_t prompt[30], gen[40];
    random_ids(&r, prompt, 30, V);
    random_ids(&r, gen, 40, V);
    gen[20] = gen[21] = gen[22] = gen[5]; /* repeats, so counts go above 1 and back */
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.1f;
    p.top_k = 100;
    p.top_p = 0.9f;
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 0.7f;
    p.frequency_penalty = 0.4f;

    history full = {prompt, gen, NULL, 30, 40, 0};
    nx_sampler *s = new_sampler_with(&p, V, &full);
    assert_int_equal(nx_sampler_n_generated(s), 40);
    nx_sampler_rewind(s, 50); /* beyond the history: nothing to forget */
    assert_int_equal(nx_sampler_n_generated(s), 40);

    static const size_t cuts[] = {39, 25, 21, 6, 0};
    for (int t = 0; t < 5; t++) {
        nx_sampler_rewind(s, cuts[t]);
        assert_int_equal(nx_sampler_n_generated(s), cuts[t]);
        history part = {prompt, gen, NULL, 30, cuts[t], 0};
        nx_sampler *fresh = new_sampler_with(&p, V, &part);
        nx_sampler_probs(s, logits, NULL, 0, a);
        nx_sampler_probs(fresh, logits, NULL, 0, b);
        assert_memory_equal(a, b, sizeof a);
        nx_sampler_free(fresh);
    }
    /* Grow again after a rewind to zero: same as never having rewound. */
    for (int i = 0; i < 40; i++) nx_sampler_accept(s, gen[i]);
    nx_sampler *fresh = new_sampler_with(&p, V, &full);
    nx_sampler_probs(s, logits, NULL, 0, a);
    nx_sampler_probs(fresh, logits, NULL, 0, b);
    assert_memory_equal(a, b, sizeof a);
    nx_sampler_free(fresh);

    /* set_prompt replaces the previous prompt. */
    int32_t other[3] = {1, 2, 3};
    nx_sampler_set_prompt(s, other, 3);
    history h2 = {other, gen, NULL, 3, 40, 0};
    fresh = new_sampler_with(&p, V, &h2);
    nx_sampler_probs(s, logits, NULL, 0, a);
    nx_sampler_probs(fresh, logits, NULL, 0, b);
    assert_memory_equal(a, b, sizeof a);
    nx_sampler_free(fresh);
    nx_sampler_free(s);
}

/* Logit bias: +100 forces a token even greedily, -100 all but bans it, the bias comes before
 * the repetition penalty (llama.cpp's order), and bad entries are refused by name. */
static void test_logit_bias(void **state) {
    (void)state;
    const int32_t V = 8;
    const float logits[8] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 3.0f, 0.25f, 1.5f};
    float probs[8];
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    nx_logit_bias lb[3] = {{6, 100.0f}, {5, -100.0f}, {0, 1.0f}};
    p.logit_bias = lb;
    p.n_logit_bias = 2;
    nx_sampler *s = new_sampler(&p, V);
    lb[0].id = 1; /* the sampler kept its own copy */
    nx_sampler_probs(s, logits, NULL, 0, probs);
    assert_true(probs[6] == 1.0f);
    nx_sampler_free(s);
    lb[0].id = 6;
    p.temperature = 1.0f;
    s = new_sampler(&p, V);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    assert_true(probs[6] > 0.999f && probs[5] < 1e-40f);
    nx_sampler_free(s);
    /* token 0: logit 2 + bias 1 = 3, in the prompt, repetition penalty 2: 1.5; against token 7
     * (1.5, no penalty) the two weigh the same */
    p.logit_bias = lb + 2;
    p.n_logit_bias = 1;
    p.repetition_penalty = 2.0f;
    s = new_sampler(&p, V);
    const int32_t prompt[1] = {0};
    nx_sampler_set_prompt(s, prompt, 1);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    assert_true(fabsf(probs[0] - probs[7]) < 1e-7f && probs[0] > 0.05f);
    nx_sampler_free(s);
    /* refused: an id past the vocabulary (nx_sampler_new knows it), a bias out of range, a
     * count without an array */
    nx_sampler_params_default(&p);
    nx_logit_bias bad = {V, 1.0f};
    p.logit_bias = &bad;
    p.n_logit_bias = 1;
    nx_error err = {0};
    assert_int_equal(nx_sampler_params_check(&p, &err), NX_OK);
    nx_sampler *none = NULL;
    assert_int_equal(nx_sampler_new(&p, V, &none, &err), NX_E_ARG);
    assert_null(none);
    assert_non_null(strstr(err.msg, "logit_bias: token id 8 is out of range [0, 8)"));
    bad = (nx_logit_bias){1, 100.5f};
    assert_int_equal(nx_sampler_params_check(&p, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "logit_bias"));
    bad = (nx_logit_bias){1, NAN};
    assert_int_equal(nx_sampler_params_check(&p, &err), NX_E_ARG);
    bad = (nx_logit_bias){-1, 0.0f};
    assert_int_equal(nx_sampler_params_check(&p, &err), NX_E_ARG);
    p.logit_bias = NULL;
    assert_int_equal(nx_sampler_params_check(&p, &err), NX_E_ARG);
}

static void expect_reject(const nx_sampler_params *p, const char *name) {
    nx_error err = {0};
    assert_int_equal(nx_sampler_params_check(p, &err), NX_E_ARG);
    assert_int_equal(err.status, NX_E_ARG);
    if (!strstr(err.msg, name)) fprintf(stderr, "message lacks '%s': %s\n", name, err.msg);
    assert_non_null(strstr(err.msg, name));
    assert_non_null(strchr(err.msg, '[') ? strchr(err.msg, '[') : strchr(err.msg, '('));
    nx_sampler *s = NULL;
    assert_int_equal(nx_sampler_new(p, 10, &s, NULL), NX_E_ARG);
    assert_null(s);
}

static void test_params_check(void **state) {
    (void)state;
    nx_sampler_params d, p;
    nx_sampler_params_default(&d);
    assert_int_equal(nx_sampler_params_check(&d, NULL), NX_OK);
    assert_true(d.temperature == 0.0f && d.top_k == 0 && d.top_p == 1.0f && d.min_p == 0.0f &&
                d.repetition_penalty == 1.0f && d.presence_penalty == 0.0f &&
                d.frequency_penalty == 0.0f && d.seed == 0);
    const float nan = NAN;

#define REJECT(field, value)                                                                       \
    do {                                                                                           \
        p = d;                                                                                     \
        p.field = (value);                                                                         \
        expect_reject(&p, #field);                                                                 \
    } while (0)
#define ACCEPT(field, value)                                                                       \
    do {                                                                                           \
        p = d;                                                                                     \
        p.field = (value);                                                                         \
        assert_int_equal(nx_sampler_params_check(&p, NULL), NX_OK);                                \
    } while (0)

    REJECT(temperature, -1e-3f);
    REJECT(temperature, nextafterf(100.0f, 200.0f));
    REJECT(temperature, nan);
    REJECT(temperature, INFINITY);
    ACCEPT(temperature, 100.0f);
    REJECT(top_k, -1);
    ACCEPT(top_k, 1 << 30);
    REJECT(top_p, 0.0f);
    REJECT(top_p, nextafterf(1.0f, 2.0f));
    REJECT(top_p, nan);
    ACCEPT(top_p, 1e-30f);
    REJECT(min_p, -1e-9f);
    REJECT(min_p, nextafterf(1.0f, 2.0f));
    REJECT(min_p, nan);
    ACCEPT(min_p, 1.0f);
    REJECT(repetition_penalty, 0.0f);
    REJECT(repetition_penalty, -1.0f);
    REJECT(repetition_penalty, nextafterf(10.0f, 20.0f));
    REJECT(repetition_penalty, nan);
    ACCEPT(repetition_penalty, 10.0f);
    ACCEPT(repetition_penalty, 1e-3f);
    REJECT(presence_penalty, nextafterf(-2.0f, -3.0f));
    REJECT(presence_penalty, nextafterf(2.0f, 3.0f));
    REJECT(presence_penalty, nan);
    ACCEPT(presence_penalty, -2.0f);
    ACCEPT(presence_penalty, 2.0f);
    REJECT(frequency_penalty, nextafterf(-2.0f, -3.0f));
    REJECT(frequency_penalty, nextafterf(2.0f, 3.0f));
    REJECT(frequency_penalty, nan);
    ACCEPT(frequency_penalty, -2.0f);
#undef REJECT
#undef ACCEPT

    nx_error err = {0};
    nx_sampler *s = NULL;
    assert_int_equal(nx_sampler_params_check(NULL, &err), NX_E_ARG);
    assert_int_equal(nx_sampler_new(&d, 0, &s, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "vocab_size"));
    assert_null(s);
    nx_sampler_free(NULL);
}

static void test_draw_chi_square(void **state) {
    (void)state;
    const int32_t V = 10;
    float probs[10];
    double pd[10];
    uint64_t r = 31337;
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += (pd[i] = i == 4 ? 0.0 : 0.05 + trng_uniform(&r));
    for (int i = 0; i < V; i++) probs[i] = (float)(pd[i] / sum);
    for (int i = 0; i < V; i++) pd[i] = probs[i]; /* test the floats actually sampled */

    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.seed = 2024;
    nx_sampler *s = new_sampler(&p, V);
    int64_t obs[10] = {0};
    const int64_t n = 20000;
    for (int64_t t = 0; t < n; t++) {
        int32_t y = nx_sampler_draw(s, probs);
        assert_true(y >= 0 && y < V);
        obs[y]++;
    }
    assert_int_equal(obs[4], 0); /* a zero-probability token is never drawn */
    double pv = chisq_gof(obs, pd, V, n);
    assert_true(pv > 1e-4);

    /* The distribution from nx_sampler_probs itself, with filters, drawn 20 000 times. */
    float logits[10];
    random_logits(&r, logits, V, 1.0, false);
    p.top_k = 8;
    p.top_p = 0.97f;
    nx_sampler *s2 = new_sampler(&p, V);
    nx_sampler_probs(s2, logits, NULL, 0, probs);
    for (int i = 0; i < V; i++) pd[i] = probs[i], obs[i] = 0;
    for (int64_t t = 0; t < n; t++) obs[nx_sampler_draw(s2, probs)]++;
    assert_true(chisq_gof(obs, pd, V, n) > 1e-4);

    /* Uniforms lie in [0, 1) and have the right mean and variance. */
    double m1 = 0.0, m2 = 0.0;
    for (int64_t t = 0; t < n; t++) {
        double u = nx_sampler_uniform(s);
        assert_true(u >= 0.0 && u < 1.0);
        m1 += u;
        m2 += u * u;
    }
    m1 /= (double)n;
    m2 = m2 / (double)n - m1 * m1;
    assert_true(fabs(m1 - 0.5) < 5.0 * sqrt(1.0 / 12.0 / (double)n));
    assert_true(fabs(m2 - 1.0 / 12.0) < 0.005);
    nx_sampler_free(s);
    nx_sampler_free(s2);
}

/* The chi-square helper itself, against closed forms: df = 2 gives exp(-x/2); df = 1 gives
 * erfc(sqrt(x/2)). */
static void test_chisq_helper(void **state) {
    (void)state;
    for (double x = 0.01; x < 60.0; x *= 1.7) {
        assert_true(fabs(chisq_sf(x, 2) - exp(-x / 2.0)) < 1e-12);
        assert_true(fabs(chisq_sf(x, 1) - erfc(sqrt(x / 2.0))) < 1e-12);
    }
}

static void test_seeded_determinism(void **state) {
    (void)state;
    const int32_t V = 50;
    float logits[50], probs[50];
    uint64_t r = 8;
    random_logits(&r, logits, V, 2.0, false);
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.seed = 12345;
    nx_sampler *a = new_sampler(&p, V), *b = new_sampler(&p, V);
    p.seed = 12346;
    nx_sampler *c = new_sampler(&p, V);
    nx_sampler_probs(a, logits, NULL, 0, probs);
    int differ = 0;
    for (int t = 0; t < 1000; t++) {
        double ua = nx_sampler_uniform(a), ub = nx_sampler_uniform(b), uc = nx_sampler_uniform(c);
        assert_true(ua == ub);
        differ += ua != uc;
        int32_t ya = nx_sampler_draw(a, probs), yb = nx_sampler_draw(b, probs);
        assert_int_equal(ya, yb);
        (void)nx_sampler_draw(c, probs);
    }
    assert_true(differ > 990);
    /* Computing a distribution does not consume randomness. */
    nx_sampler_probs(a, logits, NULL, 0, probs);
    assert_true(nx_sampler_uniform(a) == nx_sampler_uniform(b));
    nx_sampler_free(a);
    nx_sampler_free(b);
    nx_sampler_free(c);
}

static void test_nonfinite_logits(void **state) {
    (void)state;
    const int32_t V = 6;
    float probs[6];
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    nx_sampler *s = new_sampler(&p, V);

    float l1[6] = {1.0f, NAN, 1.0f, -INFINITY, 1.0f, 1.0f};
    nx_sampler_probs(s, l1, NULL, 0, probs);
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == 1 || i == 3 ? 0.0f : 0.25f));

    float l2[6] = {1.0f, INFINITY, 3.0f, INFINITY, NAN, -INFINITY};
    nx_sampler_probs(s, l2, NULL, 0, probs);
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == 1 || i == 3 ? 0.5f : 0.0f));

    float l3[6] = {-INFINITY, -INFINITY, NAN, -INFINITY, -INFINITY, -INFINITY};
    nx_sampler_probs(s, l3, NULL, 0, probs);
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == 0 ? 1.0f : 0.0f));
    nx_sampler_free(s);

    p.top_k = 2;
    p.top_p = 0.5f;
    s = new_sampler(&p, V);
    nx_sampler_probs(s, l1, NULL, 0, probs);
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == 0 ? 1.0f : 0.0f));
    nx_sampler_probs(s, l3, NULL, 0, probs);
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == 0 ? 1.0f : 0.0f));
    nx_sampler_free(s);
}

/* The ban list (min_tokens): its ids get no probability while the history plus the extra tokens
 * are shorter than ban_until, and their own weight afterwards; bad ids are refused. */
static void test_ban(void **state) {
    (void)state;
    enum { BV = 8 };
    const int32_t ban[2] = {2, 5};
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.ban = ban;
    p.n_ban = 2;
    p.ban_until = 3;
    nx_sampler *s = new_sampler(&p, BV);
    float logits[BV], probs[BV];
    for (int i = 0; i < BV; i++) logits[i] = 0.1f * (float)i;
    const int32_t extra[2] = {1, 1};
    for (size_t hist = 0; hist < 5; hist++) {
        for (size_t n_extra = 0; n_extra <= 2; n_extra++) {
            nx_sampler_probs(s, logits, extra, n_extra, probs);
            const bool banned = hist + n_extra < 3;
            assert_true((probs[2] == 0.0f) == banned);
            assert_true((probs[5] == 0.0f) == banned);
            assert_true(probs[3] > 0.0f);
        }
        nx_sampler_accept(s, 0);
    }
    nx_sampler_free(s);
    const int32_t bad = BV;
    p.ban = &bad;
    p.n_ban = 1;
    nx_sampler *t = NULL;
    nx_error err = {0};
    assert_int_equal(nx_sampler_new(&p, BV, &t, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "ban: token id 8"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_check),
        cmocka_unit_test(test_probs_match_reference),
        cmocka_unit_test(test_probs_full_vocab),
        cmocka_unit_test(test_greedy_ties_lowest_id),
        cmocka_unit_test(test_top_p_keeps_one),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_penalties_history_extra),
        cmocka_unit_test(test_rewind_restores),
        cmocka_unit_test(test_chisq_helper),
        cmocka_unit_test(test_draw_chi_square),
        cmocka_unit_test(test_seeded_determinism),
        cmocka_unit_test(test_nonfinite_logits),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_ban),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
