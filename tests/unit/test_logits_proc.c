/* The sampler's logits-processor list (nextn.h nx_logits_proc, src/constrain/): processors mask
 * in list order; the sampler advances them by accepted tokens, and a verify row's drafts are
 * advanced, masked and rewound so the state after is the state before, byte for byte; a rewind
 * (a rejected draft, nx_sampler_rewind) gives the state the remaining tokens give, inside the
 * kept ring of states and past it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/proc_util.h"
#include "constrain/procs.h"
#include "nextn.h"

enum { V = 8 };

/* A test processor: bans one token, or keeps only the largest finite logit (so its outcome
 * depends on what ran before it); counts the tokens advanced and logs its mask calls. */
typedef struct tproc {
    int kind; /* 0: ban `tok`; 1: keep the argmax */
    int32_t tok;
    size_t n;  /* tokens advanced */
    char *log; /* each mask call appends its name */
    char name;
} tproc;

static bool t_mask(void *self, float *x, int32_t n) {
    tproc *t = self;
    size_t l = strlen(t->log);
    t->log[l] = t->name, t->log[l + 1] = 0;
    if (t->kind == 0) {
        x[t->tok] = -INFINITY;
        return true;
    }
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++)
        if (x[i] > -INFINITY && (best < 0 || x[i] > x[best])) best = i;
    for (int32_t i = 0; i < n; i++)
        if (i != best) x[i] = -INFINITY;
    return true;
}
static void t_advance(void *self, int32_t id) {
    (void)id;
    ((tproc *)self)->n++;
}
static void t_rewind(void *self, size_t n) {
    tproc *t = self;
    if (n < t->n) t->n = n;
}
static const nx_logits_proc_ops T_OPS = {t_mask, t_advance, t_rewind, NULL};

static nx_sampler *sampler_with(const nx_logits_proc *procs, size_t n) {
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.procs = procs;
    p.n_procs = n;
    nx_sampler *s = NULL;
    assert_int_equal(nx_sampler_new(&p, V, &s, NULL), NX_OK);
    return s;
}

static void test_mask_order(void **state) {
    (void)state;
    char log[64] = "";
    tproc ban = {0, 5, 0, log, 'b'}, keep = {1, 0, 0, log, 'k'};
    float logits[V] = {0.1f, 0.9f, 0.3f, 0.2f, 0.0f, 2.0f, -1.0f, 0.5f}, probs[V];
    /* ban 5, then keep the best left: token 1 */
    nx_logits_proc ab[2] = {{&T_OPS, &ban}, {&T_OPS, &keep}};
    nx_sampler *s = sampler_with(ab, 2);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    assert_string_equal(log, "bk");
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == 1 ? 1.0f : 0.0f));
    nx_sampler_free(s);
    /* keep the best (5), then ban it: nothing is left, the one-hot at 0 of an all-masked row */
    log[0] = 0;
    nx_logits_proc ba[2] = {{&T_OPS, &keep}, {&T_OPS, &ban}};
    s = sampler_with(ba, 2);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    assert_string_equal(log, "kb");
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == 0 ? 1.0f : 0.0f));
    nx_sampler_free(s);
}

/* The sampler drives the list: accepted tokens advance it, a verify row's extra tokens leave it
 * where it was, nx_sampler_rewind rewinds it, and a new sampler starts it from 0. */
static void test_list_follows_history(void **state) {
    (void)state;
    char log[256] = "";
    tproc a = {0, 7, 0, log, 'a'}, b = {0, 6, 0, log, 'b'};
    nx_logits_proc list[2] = {{&T_OPS, &a}, {&T_OPS, &b}};
    a.n = 9; /* a processor left advanced by an earlier sampler */
    nx_sampler *s = sampler_with(list, 2);
    assert_int_equal(a.n, 0);
    float logits[V] = {0}, probs[V];
    for (int32_t id = 0; id < 3; id++) nx_sampler_accept(s, id);
    assert_int_equal(a.n, 3);
    assert_int_equal(b.n, 3);
    const int32_t drafts[2] = {1, 2};
    nx_sampler_probs(s, logits, drafts, 2, probs);
    assert_int_equal(a.n, 3);
    assert_int_equal(b.n, 3);
    assert_true(probs[6] == 0.0f && probs[7] == 0.0f && probs[0] > 0.0f);
    nx_sampler_rewind(s, 1);
    assert_int_equal(a.n, 1);
    assert_int_equal(b.n, 1);
    nx_sampler_free(s);
    /* a processor without its three required operations is refused by name */
    static const nx_logits_proc_ops half = {t_mask, NULL, t_rewind, NULL};
    nx_logits_proc bad = {&half, &a};
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.procs = &bad;
    p.n_procs = 1;
    nx_error err = {0};
    assert_int_equal(nx_sampler_new(&p, V, &s, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "procs[0]"));
}

/* A toy grammar for the state history: the state is a running hash of the tokens. */
typedef struct hstate {
    uint64_t h;
    uint32_t n;
    uint8_t pad[20];
} hstate;
static void h_init(const void *g, void *st) {
    (void)g;
    memset(st, 0, sizeof(hstate));
    ((hstate *)st)->h = 1469598103934665603ull;
}
static void h_step(const void *g, void *st, int32_t id) {
    (void)g;
    hstate *s = st;
    s->h = (s->h ^ (uint64_t)(uint32_t)id) * 1099511628211ull;
    s->pad[s->n++ % 20] ^= (uint8_t)id;
}

/* Rewinds inside the ring and past it give the bytes a fresh history of the same tokens gives. */
static void test_hist_rewind_exact(void **state) {
    (void)state;
    nx_state_hist h, f;
    assert_true(nx_hist_init(&h, NULL, sizeof(hstate), h_init, h_step));
    int32_t toks[300];
    for (int i = 0; i < 300; i++) toks[i] = (i * 37 + 11) % 101;
    const size_t to[] = {290, 283, 200, 3, 0, 150};
    size_t at = 0;
    for (size_t r = 0; r < sizeof to / sizeof *to; r++) {
        while (at < 300) nx_hist_advance(&h, toks[at++]);
        nx_hist_rewind(&h, to[r]);
        at = to[r];
        assert_int_equal(h.n, to[r]);
        assert_true(nx_hist_init(&f, NULL, sizeof(hstate), h_init, h_step));
        for (size_t i = 0; i < to[r]; i++) nx_hist_advance(&f, toks[i]);
        assert_memory_equal(nx_hist_state(&h), nx_hist_state(&f), sizeof(hstate));
        nx_hist_free(&f);
    }
    /* drafts tried past the end take ring slots: a rewind to before them still gives the bytes */
    nx_hist_rewind(&h, 0);
    for (int i = 0; i < 100; i++) nx_hist_advance(&h, toks[i]);
    for (int i = 0; i < 10; i++) nx_hist_advance(&h, 7);
    nx_hist_rewind(&h, 100);
    nx_hist_rewind(&h, 90);
    assert_true(nx_hist_init(&f, NULL, sizeof(hstate), h_init, h_step));
    for (int i = 0; i < 90; i++) nx_hist_advance(&f, toks[i]);
    assert_memory_equal(nx_hist_state(&h), nx_hist_state(&f), sizeof(hstate));
    nx_hist_free(&f);
    nx_hist_free(&h);
}

/* JSON mode as a processor: drafts advanced and rewound leave the masks as they were, and a
 * rejected draft (rewind) masks as if it had never been accepted. */
static void test_json_proc_rewind(void **state) {
    (void)state;
    static const char *const frag[] = {"{", "}", "\"a\"", ":", "1", " ", "x", NULL};
    size_t lens[V];
    for (int i = 0; i < V; i++) lens[i] = frag[i] ? strlen(frag[i]) : 0;
    const int32_t end = 7;
    nx_json_vocab *v = NULL;
    assert_int_equal(nx_json_vocab_from_bytes(frag, lens, V, &end, 1, &v, NULL), NX_OK);
    nx_logits_proc jp;
    assert_int_equal(nx_json_proc_new(v, NULL, false, 0, V, &jp, NULL), NX_OK);
    float x[V], y[V];
    const int32_t seq[] = {0, 5, 2, 3, 4, 1};
    for (int k = 0; k < 6; k++) {
        /* state after seq[0..k): mask, then advance by drafts and rewind, then mask again */
        for (int i = 0; i < V; i++) x[i] = y[i] = 0.0f;
        jp.ops->mask(jp.self, x, V);
        for (int d = k; d < 6; d++) jp.ops->advance(jp.self, seq[d]);
        jp.ops->advance(jp.self, 6); /* a draft that kills the object */
        jp.ops->rewind(jp.self, (size_t)k);
        jp.ops->mask(jp.self, y, V);
        assert_memory_equal(x, y, sizeof x);
        jp.ops->advance(jp.self, seq[k]);
    }
    /* complete: only the end token */
    for (int i = 0; i < V; i++) x[i] = 0.0f;
    jp.ops->mask(jp.self, x, V);
    for (int i = 0; i < V; i++) assert_true((x[i] == 0.0f) == (i == end));
    jp.ops->free(jp.self);
    nx_json_vocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mask_order),
        cmocka_unit_test(test_list_follows_history),
        cmocka_unit_test(test_hist_rewind_exact),
        cmocka_unit_test(test_json_proc_rewind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
