/* Speculative verification rules: simulated draft-then-verify trials show that the emitted token
 * is distributed exactly as the target p (chi-square) and that acceptance matches its closed form
 * (sum min(p, q) for the residual rule, sum p*q for match; binomial z-test), plus the edge cases
 * the loop relies on. Fixed seeds keep every statistical check deterministic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chisq.h"
#include "decode/spec_rules.h"
#include "nextn.h"

enum { V = 6, TRIALS = 50000 };

static nx_sampler *new_sampler(int32_t vocab, uint64_t seed) {
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.seed = seed;
    nx_sampler *s = NULL;
    assert_int_equal(nx_sampler_new(&p, vocab, &s, NULL), NX_OK);
    return s;
}

/* A random distribution over V tokens; each entry is zero with probability p_zero (but never
 * all of them). */
static void random_dist(uint64_t *r, float *d, int n, double p_zero) {
    double w[64], sum = 0.0;
    do {
        sum = 0.0;
        for (int i = 0; i < n; i++) {
            w[i] = trng_uniform(r) < p_zero ? 0.0 : trng_uniform(r) + 0.02;
            sum += w[i];
        }
    } while (sum == 0.0);
    for (int i = 0; i < n; i++) d[i] = (float)(w[i] / sum);
}

static void to_double(const float *f, double *d, int n) {
    for (int i = 0; i < n; i++) d[i] = f[i];
}

/* |z| of k successes in n trials against success probability a; exact when a is 0 or 1. */
static double binomial_z(int64_t k, int64_t n, double a) {
    double var = (double)n * a * (1.0 - a);
    if (var < 1e-9) return fabs((double)k - (double)n * a) < 0.5 ? 0.0 : INFINITY;
    return fabs((double)k - (double)n * a) / sqrt(var);
}

/* MATCH: d ~ q independently; COUPLED: d drawn with the uniform the target's draw uses (the
 * generation loop's match mode) */
typedef enum { RULE_RESIDUAL, RULE_MATCH, RULE_COUPLED } rule;

/* Runs TRIALS cycles of: d ~ q, verify against p. Asserts the output law is p and the
 * acceptance rate is the rule's closed form. */
static void check_rule(rule which, const float *p, const float *q, uint64_t seed) {
    nx_sampler *s = new_sampler(V, seed);
    int64_t obs[V] = {0}, acc = 0;
    for (int t = 0; t < TRIALS; t++) {
        int32_t d = which == RULE_COUPLED ? nx_sampler_draw_at(s, q, (uint64_t)t) : nx_sampler_draw(s, q);
        assert_true(q[d] > 0.0f); /* a drafted token always has q(d) > 0 */
        bool ok = false;
        int32_t y = which == RULE_RESIDUAL
                        ? nx_spec_residual(p, q, d, nx_sampler_uniform(s), s, &ok)
                        : nx_spec_match(p, d, s, (uint64_t)t, &ok);
        assert_true(y >= 0 && y < V);
        if (ok) assert_int_equal(y, d);
        acc += ok;
        obs[y]++;
    }
    double pd[V];
    to_double(p, pd, V);
    double pv = chisq_gof(obs, pd, V, TRIALS);
    double a = which == RULE_RESIDUAL ? nx_spec_overlap(p, q, V)
               : which == RULE_MATCH  ? nx_spec_match_rate(p, q, V)
                                      : nx_spec_coupled_rate(p, q, V);
    double z = binomial_z(acc, TRIALS, a);
    if (pv <= 1e-4 || z >= 5.0)
        fprintf(stderr, "%s: p-value %.3g, acceptance %.4f expected %.4f (z %.2f)\n",
                which == RULE_RESIDUAL ? "residual" : which == RULE_MATCH ? "match" : "coupled", pv, (double)acc / TRIALS, a, z);
    assert_true(pv > 1e-4);
    assert_true(z < 5.0);
    nx_sampler_free(s);
}

static void test_residual_exact(void **state) {
    (void)state;
    uint64_t r = 0xace;
    float p[V], q[V];
    for (int c = 0; c < 8; c++) {
        random_dist(&r, p, V, c < 4 ? 0.0 : 0.3); /* later cases have zeros in p and q */
        random_dist(&r, q, V, c < 4 ? 0.0 : 0.3);
        check_rule(RULE_RESIDUAL, p, q, 1000 + (uint64_t)c);
    }
}

static void test_match_exact(void **state) {
    (void)state;
    uint64_t r = 0xbee;
    float p[V], q[V];
    for (int c = 0; c < 6; c++) {
        random_dist(&r, p, V, c < 3 ? 0.0 : 0.3);
        random_dist(&r, q, V, c < 3 ? 0.0 : 0.3);
        check_rule(RULE_MATCH, p, q, 2000 + (uint64_t)c);
        check_rule(RULE_COUPLED, p, q, 3000 + (uint64_t)c);
        /* no coupling accepts more often than the residual rule (1 - total variation) */
        assert_true(nx_spec_coupled_rate(p, q, V) <= nx_spec_overlap(p, q, V) + 1e-9);
    }
}

/* The loop's real use: p and q are processed distributions from nx_sampler_probs with filters
 * (top-k / top-p zero out parts of each, differently), over a larger vocabulary. */
static void test_residual_processed(void **state) {
    (void)state;
    enum { W = 30 };
    uint64_t r = 0xfeed;
    float lp[W], lq[W], p[W], q[W];
    for (int i = 0; i < W; i++) {
        lp[i] = (float)(1.5 * trng_normal(&r));
        lq[i] = lp[i] + (float)(0.8 * trng_normal(&r)); /* a draft that roughly agrees */
    }
    nx_sampler_params sp;
    nx_sampler_params_default(&sp);
    sp.temperature = 0.8f;
    sp.top_k = 12;
    sp.top_p = 0.9f;
    sp.min_p = 0.02f;
    sp.seed = 5;
    nx_sampler *s = NULL;
    assert_int_equal(nx_sampler_new(&sp, W, &s, NULL), NX_OK);
    nx_sampler_probs(s, lp, NULL, 0, p);
    nx_sampler_probs(s, lq, NULL, 0, q);

    int64_t obs[W] = {0}, acc = 0;
    for (int t = 0; t < TRIALS; t++) {
        int32_t d = nx_sampler_draw(s, q);
        bool ok;
        obs[nx_spec_residual(p, q, d, nx_sampler_uniform(s), s, &ok)]++;
        acc += ok;
    }
    double pd[W];
    to_double(p, pd, W);
    assert_true(chisq_gof(obs, pd, W, TRIALS) > 1e-4);
    assert_true(binomial_z(acc, TRIALS, nx_spec_overlap(p, q, W)) < 5.0);
    nx_sampler_free(s);
}

static void test_edge_cases(void **state) {
    (void)state;
    uint64_t r = 0xed9e;
    float p[V], q[V];
    nx_sampler *s = new_sampler(V, 77);
    bool ok;

    /* Drafts never have q(d) == 0, even when q has many zeros. */
    random_dist(&r, q, V, 0.5);
    for (int t = 0; t < 20000; t++) assert_true(q[nx_sampler_draw(s, q)] > 0.0f);

    /* p(d) == 0: always rejected, and the correction is a token p can produce, never d. */
    random_dist(&r, p, V, 0.0);
    random_dist(&r, q, V, 0.0);
    p[2] = 0.0f;
    for (int t = 0; t < 5000; t++) {
        int32_t y = nx_spec_residual(p, q, 2, nx_sampler_uniform(s), s, &ok);
        assert_false(ok);
        assert_true(y != 2 && p[y] > 0.0f);
    }
    /* ... including the largest uniform below 1. */
    assert_int_not_equal(nx_spec_residual(p, q, 2, nextafter(1.0, 0.0), s, &ok), 2);
    assert_false(ok);

    /* p == q: always accepted, whatever the uniform. */
    random_dist(&r, p, V, 0.3);
    memcpy(q, p, sizeof q);
    for (int t = 0; t < 5000; t++) {
        int32_t d = nx_sampler_draw(s, q);
        assert_int_equal(nx_spec_residual(p, q, d, nx_sampler_uniform(s), s, &ok), d);
        assert_true(ok);
    }
    for (int32_t d = 0; d < V; d++) {
        if (q[d] == 0.0f) continue;
        assert_int_equal(nx_spec_residual(p, q, d, nextafter(1.0, 0.0), s, &ok), d);
        assert_true(ok);
    }
    assert_true(fabs(nx_spec_overlap(p, q, V) - 1.0) < 1e-6);

    /* One-hot p (greedy target): the draft survives iff it is the argmax; otherwise the
     * correction is the argmax. */
    memset(p, 0, sizeof p);
    p[4] = 1.0f;
    random_dist(&r, q, V, 0.0);
    for (int t = 0; t < 5000; t++) {
        int32_t d = nx_sampler_draw(s, q);
        int32_t y = nx_spec_residual(p, q, d, nx_sampler_uniform(s), s, &ok);
        assert_int_equal(y, 4);
        assert_true(ok == (d == 4));
        y = nx_spec_match(p, d, s, (uint64_t)t, &ok);
        assert_int_equal(y, 4);
        assert_true(ok == (d == 4));
    }
    /* ... also against a one-hot draft (greedy draft vs greedy target). */
    memset(q, 0, sizeof q);
    q[1] = 1.0f;
    assert_int_equal(nx_spec_residual(p, q, 1, 0.0, s, &ok), 4);
    assert_false(ok);
    q[1] = 0.0f;
    q[4] = 1.0f;
    assert_int_equal(nx_spec_residual(p, q, 4, nextafter(1.0, 0.0), s, &ok), 4);
    assert_true(ok);

    /* An out-of-range draft is rejected and the output still comes from p. */
    random_dist(&r, p, V, 0.0);
    random_dist(&r, q, V, 0.0);
    int32_t y = nx_spec_residual(p, q, V, 0.0, s, &ok);
    assert_false(ok);
    assert_true(y >= 0 && y < V);
    nx_sampler_free(s);
}

/* Closed forms checked through independent identities rather than constants:
 * sum min(p, q) = 1 - TV(p, q) = 1 - sum |p - q| / 2, and sum p * e_j = p_j. */
static void test_overlap_identities(void **state) {
    (void)state;
    uint64_t r = 0x0dd;
    float p[V], q[V], e[V];
    for (int c = 0; c < 20; c++) {
        random_dist(&r, p, V, 0.2);
        random_dist(&r, q, V, 0.2);
        double tv = 0.0;
        for (int i = 0; i < V; i++) tv += fabs((double)p[i] - (double)q[i]);
        double sp = 0.0, sq = 0.0;
        for (int i = 0; i < V; i++) sp += p[i], sq += q[i];
        /* the identity assumes both sum to 1; allow for their float rounding */
        assert_true(fabs(nx_spec_overlap(p, q, V) - (0.5 * (sp + sq) - 0.5 * tv)) < 1e-12);
        assert_true(fabs(nx_spec_overlap(p, q, V) - nx_spec_overlap(q, p, V)) < 1e-15);
        assert_true(nx_spec_match_rate(p, q, V) <= nx_spec_overlap(p, q, V) + 1e-12);
        for (int j = 0; j < V; j++) {
            memset(e, 0, sizeof e);
            e[j] = 1.0f;
            assert_true(nx_spec_match_rate(p, e, V) == (double)p[j]);
            assert_true(nx_spec_overlap(p, e, V) == (double)p[j]);
        }
    }
}

static void test_seeded_determinism(void **state) {
    (void)state;
    uint64_t r = 0x5eed;
    float p[V], q[V];
    random_dist(&r, p, V, 0.0);
    random_dist(&r, q, V, 0.0);
    nx_sampler *a = new_sampler(V, 99), *b = new_sampler(V, 99);
    for (int t = 0; t < 2000; t++) {
        bool oa, ob;
        int32_t da = nx_sampler_draw(a, q), db = nx_sampler_draw(b, q);
        assert_int_equal(da, db);
        int32_t ya = nx_spec_residual(p, q, da, nx_sampler_uniform(a), a, &oa);
        int32_t yb = nx_spec_residual(p, q, db, nx_sampler_uniform(b), b, &ob);
        assert_int_equal(ya, yb);
        assert_true(oa == ob);
        assert_int_equal(nx_spec_match(p, da, a, (uint64_t)t, &oa), nx_spec_match(p, db, b, (uint64_t)t, &ob));
    }
    nx_sampler_free(a);
    nx_sampler_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_residual_exact),
        cmocka_unit_test(test_match_exact),
        cmocka_unit_test(test_residual_processed),
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_overlap_identities),
        cmocka_unit_test(test_seeded_determinism),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
