/* Forward-pass invariants on a tiny random hy_v3 checkpoint written by the test: the router
 * against brute force, batch invariance (one call over T rows == T single-row calls, bit for
 * bit), several contexts in one forward == each alone (also on random Gated DeltaNet hybrids of
 * tests/ref/make_random_qwen35.py), thread-count invariance, KV truncation ==
 * never appended, batched MTP == row by row,
 * and greedy speculative decoding == greedy plain decoding for k = 1, 2, 3, auto. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "io/safetensors.h"
#include "model/deltanet.h"
#include "model/dense_timing.h"
#include "model/forward.h"
#include "model/model_internal.h"
#include "decode/draft_auto.h"
#include "constrain/json_grammar.h"

enum { V = 97, HID = 32, NL = 3, NH = 6, NKV = 2, HD = 8, FF = 40, E = 5, TOPK = 3, ED = 16 };

static char g_dir[256];
/* setup_checkpoint's variant: g_out scales the layers' output projections (attention's o_proj,
 * the FFNs' down_proj), and g_draftable makes the head lean on its token (draftable_eh_proj) */
static float g_out = 1.0f;
static bool g_draftable = false;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

typedef struct tbuf {
    nx_tensor t[256];
    char names[256][96];
    size_t n;
} tbuf;

static void add(tbuf *b, const char *name, int n_dims, const int64_t *shape, float scale, float offset) {
    nx_tensor *t = &b->t[b->n];
    snprintf(b->names[b->n], sizeof b->names[b->n], "%s", name);
    t->name = b->names[b->n];
    t->dtype = NX_DTYPE_BF16;
    t->n_dims = n_dims;
    size_t cnt = 1;
    for (int i = 0; i < n_dims; i++) {
        t->shape[i] = shape[i];
        cnt *= (size_t)shape[i];
    }
    uint16_t *d = malloc(cnt * 2);
    for (size_t i = 0; i < cnt; i++) {
        float f = offset + scale * frand();
        uint32_t u;
        memcpy(&u, &f, 4);
        d[i] = (uint16_t)(u >> 16);
    }
    t->data = (const uint8_t *)d;
    t->nbytes = cnt * 2;
    b->n++;
}

static void add2(tbuf *b, const char *name, int64_t r, int64_t c, float scale) {
    int64_t s[2] = {r, c};
    add(b, name, 2, s, scale, 0.0f);
}
static void add1(tbuf *b, const char *name, int64_t n, float offset) {
    int64_t s[1] = {n};
    add(b, name, 1, s, 0.1f, offset);
}

static void add_layer(tbuf *b, const char *p, bool moe) {
    char n[96];
#define NM(fmt) (snprintf(n, sizeof n, "%s." fmt, p), n)
    add1(b, NM("input_layernorm.weight"), HID, 1.0f);
    add1(b, NM("post_attention_layernorm.weight"), HID, 1.0f);
    add2(b, NM("self_attn.q_proj.weight"), NH * HD, HID, 0.3f);
    add2(b, NM("self_attn.k_proj.weight"), NKV * HD, HID, 0.3f);
    add2(b, NM("self_attn.v_proj.weight"), NKV * HD, HID, 0.3f);
    add2(b, NM("self_attn.o_proj.weight"), HID, NH * HD, 0.3f * g_out);
    add1(b, NM("self_attn.q_norm.weight"), HD, 1.0f);
    add1(b, NM("self_attn.k_norm.weight"), HD, 1.0f);
    if (!moe) {
        add2(b, NM("mlp.gate_proj.weight"), FF, HID, 0.3f);
        add2(b, NM("mlp.up_proj.weight"), FF, HID, 0.3f);
        add2(b, NM("mlp.down_proj.weight"), HID, FF, 0.3f * g_out);
        return;
    }
    add2(b, NM("mlp.router.gate.weight"), E, HID, 0.5f);
    add1(b, NM("mlp.expert_bias"), E, 0.0f);
    for (int e = 0; e < E; e++) {
        char q[96];
        snprintf(q, sizeof q, "%s.mlp.experts.%d.gate_proj.weight", p, e);
        add2(b, q, ED, HID, 0.3f);
        snprintf(q, sizeof q, "%s.mlp.experts.%d.up_proj.weight", p, e);
        add2(b, q, ED, HID, 0.3f);
        snprintf(q, sizeof q, "%s.mlp.experts.%d.down_proj.weight", p, e);
        add2(b, q, HID, ED, 0.3f * g_out);
    }
    add2(b, NM("mlp.shared_mlp.gate_proj.weight"), ED, HID, 0.3f);
    add2(b, NM("mlp.shared_mlp.up_proj.weight"), ED, HID, 0.3f);
    add2(b, NM("mlp.shared_mlp.down_proj.weight"), HID, ED, 0.3f * g_out);
#undef NM
}

/* eh_proj's embedding half plus the identity: with small layer outputs (g_out) the head's input
 * leans on the embedding of the token it is given, as the trunk's residual stream does on its
 * own token's, so greedy drafts agree with the trunk often enough to be accepted (a head of
 * random weights agrees about once in V and would leave the multi-row commit of a verify
 * untested). */
static void draftable_eh_proj(nx_tensor *t) {
    uint16_t *d = (uint16_t *)(uintptr_t)t->data;
    for (int r = 0; r < HID; r++) {
        uint32_t u = (uint32_t)d[(size_t)r * 2 * HID + (size_t)r] << 16;
        float f;
        memcpy(&f, &u, 4);
        f += 1.0f;
        memcpy(&u, &f, 4);
        d[(size_t)r * 2 * HID + (size_t)r] = (uint16_t)(u >> 16);
    }
}

static int setup_checkpoint(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/nextn-test-model-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    FILE *f = fopen(path, "w");
    fprintf(f,
            "{\"model_type\":\"hy_v3\",\"architectures\":[\"HYV3ForCausalLM\"],\"vocab_size\":%d,\"hidden_size\":%d,"
            "\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":%d,"
            "\"hidden_act\":\"silu\",\"intermediate_size\":%d,\"expert_hidden_dim\":%d,\"num_experts\":%d,"
            "\"num_experts_per_tok\":%d,\"num_shared_experts\":1,\"first_k_dense_replace\":1,\"route_norm\":true,"
            "\"router_scaling_factor\":2.5,\"rms_norm_eps\":1e-5,\"rope_parameters\":{\"rope_theta\":10000.0,"
            "\"rope_type\":\"default\"},\"max_position_embeddings\":256,\"qk_norm\":true,\"tie_word_embeddings\":false,"
            "\"num_nextn_predict_layers\":1,\"bos_token_id\":1,\"eos_token_id\":2}",
            V, HID, NL, NH, NKV, HD, FF, ED, E, TOPK);
    fclose(f);
    tbuf *b = calloc(1, sizeof *b);
    add2(b, "model.embed_tokens.weight", V, HID, 1.0f);
    add2(b, "lm_head.weight", V, HID, 0.5f);
    add1(b, "model.norm.weight", HID, 1.0f);
    char p[64];
    for (int l = 0; l < NL; l++) {
        snprintf(p, sizeof p, "model.layers.%d", l);
        add_layer(b, p, l >= 1);
    }
    snprintf(p, sizeof p, "model.layers.%d", NL);
    add_layer(b, p, true);
    char n[96];
    snprintf(n, sizeof n, "%s.enorm.weight", p);
    add1(b, n, HID, 1.0f);
    snprintf(n, sizeof n, "%s.hnorm.weight", p);
    add1(b, n, HID, 1.0f);
    snprintf(n, sizeof n, "%s.final_layernorm.weight", p);
    add1(b, n, HID, 1.0f);
    snprintf(n, sizeof n, "%s.eh_proj.weight", p);
    add2(b, n, HID, 2 * HID, 0.3f);
    if (g_draftable) draftable_eh_proj(&b->t[b->n - 1]);
    snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
    nx_error err = {0};
    nx_status st = nx_safetensors_write(path, b->t, b->n, 8, NULL, &err);
    for (size_t i = 0; i < b->n; i++) free((void *)b->t[i].data);
    free(b);
    if (st != NX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown_checkpoint(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static nx_model *load_kv(int threads, nx_kv_type kv) {
    nx_load_params p;
    nx_load_params_default(&p);
    p.n_threads = threads;
    p.kv_type = kv;
    nx_model *m = NULL;
    nx_error err = {0};
    if (nx_model_load(g_dir, &p, &m, &err) != NX_OK) fprintf(stderr, "load: %s\n", err.msg);
    assert_non_null(m);
    return m;
}

static nx_model *load(int threads) { return load_kv(threads, NX_KV_F32); }

static const int32_t seq[12] = {5, 17, 3, 88, 42, 42, 7, 60, 1, 95, 33, 12};

static void test_router_brute_force(void **state) {
    (void)state;
    for (int trial = 0; trial < 200; trial++) {
        const int32_t n_e = 3 + trial % 9, k = 1 + trial % 3;
        float logits[12], bias[12], w[3];
        int32_t idx[3];
        for (int e = 0; e < n_e; e++) {
            logits[e] = 3.0f * frand();
            bias[e] = trial % 2 ? 0.2f * frand() : 0.0f;
        }
        if (trial % 5 == 0) logits[1] = logits[0]; /* a tie: the lower id wins */
        nx_moe_route(logits, bias, n_e, k, true, 2.5f, idx, w);
        /* brute force: repeatedly take the best remaining (lowest id on ties) */
        bool used[12] = {0};
        double sum = 0;
        float ws[3];
        for (int i = 0; i < k; i++) {
            int best = -1;
            float bc = 0;
            for (int e = 0; e < n_e; e++) {
                float c = 1.0f / (1.0f + expf(-logits[e])) + bias[e];
                if (!used[e] && (best < 0 || c > bc)) best = e, bc = c;
            }
            used[best] = true;
            assert_int_equal(idx[i], best);
            ws[i] = 1.0f / (1.0f + expf(-logits[best]));
            sum += ws[i];
        }
        for (int i = 0; i < k; i++) {
            double want = (k > 1 ? ws[i] / (sum + 1e-20) : ws[i]) * 2.5;
            assert_true(fabs(w[i] - want) < 1e-6);
        }
    }
}

/* The DeepSeek group limit against brute force: groups scored by their two best biased scores,
 * the topk_group best kept (lower group on ties), top-k among their experts only. */
static void test_router_groups(void **state) {
    (void)state;
    for (int trial = 0; trial < 300; trial++) {
        const int32_t ng = 2 + trial % 4, gsize = 1 + trial % 3, ne = ng * gsize, tg = 1 + trial % ng;
        int32_t k = 1 + trial % 3;
        if (k > tg * gsize) k = tg * gsize;
        float logits[18], bias[18], w[3], s[18];
        int32_t idx[3];
        for (int e = 0; e < ne; e++) {
            logits[e] = 3.0f * frand();
            bias[e] = 0.3f * frand();
            s[e] = 1.0f / (1.0f + expf(-logits[e])) + bias[e];
        }
        nx_moe_route_grouped(logits, bias, ne, k, ng, tg, true, 1.5f, idx, w);
        float gs[6];
        bool keep[6] = {0};
        for (int g = 0; g < ng; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * gsize; e < (g + 1) * gsize; e++) {
                if (s[e] > b1) b2 = b1, b1 = s[e];
                else if (s[e] > b2) b2 = s[e];
            }
            gs[g] = gsize > 1 ? b1 + b2 : b1;
        }
        for (int n = 0; n < tg; n++) {
            int best = -1;
            for (int g = 0; g < ng; g++)
                if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
            keep[best] = true;
        }
        bool used[18] = {0};
        for (int i = 0; i < k; i++) {
            int best = -1;
            for (int e = 0; e < ne; e++)
                if (keep[e / gsize] && !used[e] && (best < 0 || s[e] > s[best])) best = e;
            used[best] = true;
            assert_int_equal(idx[i], best);
        }
    }
    /* n_group = 1 is the plain rule */
    float lg[5] = {0.1f, -2, 3, 0.5f, 1}, b[5] = {0, 0.2f, 0, 0.1f, 0}, w1[2], w2[2];
    int32_t i1[2], i2[2];
    nx_moe_route(lg, b, 5, 2, true, 2.0f, i1, w1);
    nx_moe_route_grouped(lg, b, 5, 2, 1, 1, true, 2.0f, i2, w2);
    assert_memory_equal(i1, i2, sizeof i1);
    assert_memory_equal(w1, w2, sizeof w1);
}

static void test_batch_invariance(void **state) {
    (void)state;
    nx_model *m = load(2);
    nx_ctx *a = NULL, *b = NULL;
    assert_int_equal(nx_ctx_new(m, 64, &a, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m, 64, &b, NULL), NX_OK);
    float *la = malloc(sizeof(float) * V * 12), *lb = malloc(sizeof(float) * V * 12);
    assert_int_equal(nx_ctx_eval(a, seq, 12, 0, la, NULL), NX_OK);
    for (int i = 0; i < 12; i++) assert_int_equal(nx_ctx_eval(b, seq + i, 1, i, lb + (size_t)i * V, NULL), NX_OK);
    assert_memory_equal(la, lb, sizeof(float) * V * 12);
    /* logits are not degenerate */
    float mn = la[0], mx = la[0];
    for (int i = 0; i < V * 12; i++) mn = fminf(mn, la[i]), mx = fmaxf(mx, la[i]);
    assert_true(mx - mn > 1.0f);
    /* MTP: one batched teacher-forced pass == row-by-row catch-up */
    float *ma = malloc(sizeof(float) * V * 11), *mb = malloc(sizeof(float) * V * 11);
    assert_int_equal(nx_ctx_eval_mtp(a, seq, 12, ma, NULL), NX_OK);
    for (int p = 0; p < 11; p++) assert_int_equal(nx_mtp_catch_up(b, seq + p + 1, p + 1, mb + (size_t)p * V, true, NULL), NX_OK);
    assert_memory_equal(ma, mb, sizeof(float) * V * 11);
    /* the hidden states the head is fed (what `nextn forge` trains on): the same bits either way,
     * and only rows the trunk cache holds */
    const size_t H = (size_t)nx_model_get_info(m)->hidden_size;
    float *ha = malloc(sizeof(float) * H * 12), *hb = malloc(sizeof(float) * H * 12);
    assert_int_equal(nx_ctx_mtp_hidden(a, 0, 12, ha, NULL), NX_OK);
    assert_int_equal(nx_ctx_mtp_hidden(b, 5, 7, hb + 5 * H, NULL), NX_OK);
    assert_int_equal(nx_ctx_mtp_hidden(b, 0, 5, hb, NULL), NX_OK);
    assert_memory_equal(ha, hb, sizeof(float) * H * 12);
    float hn = 0;
    for (size_t i = 0; i < H; i++) hn += fabsf(ha[11 * H + i]);
    assert_true(hn > 0);
    assert_int_equal(nx_ctx_mtp_hidden(a, 10, 3, ha, NULL), NX_E_ARG);
    assert_int_equal(nx_ctx_mtp_hidden(a, -1, 2, ha, NULL), NX_E_ARG);
    free(la), free(lb), free(ma), free(mb), free(ha), free(hb);
    nx_ctx_free(a);
    nx_ctx_free(b);
    nx_model_free(m);
}

/* Contexts with different histories forwarded together (nx_forward_run on a batch scratch: rows
 * of several sequences in one call, each attending over its own caches) get the bits each gets
 * alone, logits and MTP logits alike, and their caches hold the same rows afterwards (the next
 * step alone matches); a refused request fails alone. */
static void assert_same_states(const nx_ctx *a, const nx_ctx *b);

/* The MTP head over every row of n pairs of contexts holding the same rows (toks[i] and one more
 * token each): solo[i] alone, the bat contexts in one forward of scratch; each pair's last-row
 * logits and output hidden are the same bits. Then the next trunk step (a hybrid's states too)
 * and a chained draft, each context alone, still agree: what the batch left is the solo caches. */
static void mtp_together_then_alone(nx_ctx *scratch, nx_ctx **solo, nx_ctx **bat, const int32_t *const *toks, int n,
                                    bool hybrid) {
    const nx_model_info *in = nx_model_get_info(solo[0]->m);
    const size_t Vn = (size_t)in->vocab_size, H = (size_t)in->hidden_size;
    float *ls[8], *lb[8];
    nx_error errs[8];
    nx_fwd_req rq[8];
    assert_true(n <= 8);
    for (int i = 0; i < n; i++) {
        const int32_t T = solo[i]->n_past - 1;
        ls[i] = calloc(Vn, sizeof(float));
        lb[i] = calloc(Vn, sizeof(float));
        assert_int_equal(nx_mtp_catch_up(solo[i], toks[i] + 1, T, ls[i], false, NULL), NX_OK);
        rq[i] = (nx_fwd_req){.c = bat[i], .mtp = true, .tokens = toks[i] + 1, .hidden = bat[i]->hidden, .T = T,
                             .logits = lb[i], .logits_from = T - 1, .err = &errs[i]};
    }
    nx_forward_run(scratch, rq, n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(rq[i].st, NX_OK);
        assert_memory_equal(ls[i], lb[i], sizeof(float) * Vn);
        assert_memory_equal(solo[i]->mtp_out, bat[i]->mtp_out, sizeof(float) * H);
        const int32_t at = solo[i]->n_past;
        assert_int_equal(nx_forward_trunk(solo[i], toks[i] + at, 1, ls[i], 0, NULL), NX_OK);
        assert_int_equal(nx_forward_trunk(bat[i], toks[i] + at, 1, lb[i], 0, NULL), NX_OK);
        assert_memory_equal(ls[i], lb[i], sizeof(float) * Vn);
        if (hybrid) assert_same_states(solo[i], bat[i]);
        assert_int_equal(nx_mtp_draft_next(solo[i], 1, ls[i], NULL), NX_OK);
        assert_int_equal(nx_mtp_draft_next(bat[i], 1, lb[i], NULL), NX_OK);
        assert_memory_equal(ls[i], lb[i], sizeof(float) * Vn);
        free(ls[i]), free(lb[i]);
    }
}

static void test_multi_context_forward(void **state) {
    (void)state;
    enum { N = 3 };
    nx_model *m = load(2);
    nx_ctx *solo[N + 1], *bat[N + 1], *scratch = NULL;
    const int32_t hist[N + 1] = {5, 2, 9, 2}, rows[N + 1] = {3, 1, 4, 2}, from[N + 1] = {0, 0, 2, 0};
    int32_t toks[N + 1][16];
    float *ls[N + 1], *lb[N + 1];
    nx_error errs[N + 1];
    nx_fwd_req rq[N + 1];
    assert_int_equal(nx_ctx_new_scratch(m, 32, 4, 8, &scratch, NULL), NX_OK);
    for (int i = 0; i <= N; i++) {
        for (int t = 0; t < 16; t++) toks[i][t] = (t * 7 + i * 13 + 3) % V;
        assert_int_equal(nx_ctx_new(m, 64, &solo[i], NULL), NX_OK);
        assert_int_equal(nx_ctx_new(m, 64, &bat[i], NULL), NX_OK);
        if (hist[i]) {
            assert_int_equal(nx_ctx_eval(solo[i], toks[i], hist[i], 0, NULL, NULL), NX_OK);
            assert_int_equal(nx_ctx_eval(bat[i], toks[i], hist[i], 0, NULL, NULL), NX_OK);
        }
        ls[i] = calloc((size_t)V * 4, sizeof(float));
        lb[i] = calloc((size_t)V * 4, sizeof(float));
        if (i < N)
            assert_int_equal(nx_forward_trunk(solo[i], toks[i] + hist[i], rows[i], ls[i], from[i], NULL), NX_OK);
        rq[i] = (nx_fwd_req){.c = bat[i], .tokens = toks[i] + hist[i], .T = rows[i], .logits = lb[i],
                             .logits_from = from[i], .err = &errs[i]};
    }
    toks[N][hist[N] + 1] = V; /* out of range: the last request is refused, alone */
    nx_forward_run(scratch, rq, N + 1);
    for (int i = 0; i < N; i++) {
        assert_int_equal(rq[i].st, NX_OK);
        assert_memory_equal(ls[i], lb[i], sizeof(float) * (size_t)V * (size_t)(rows[i] - from[i]));
        assert_int_equal(nx_ctx_n_past(bat[i]), hist[i] + rows[i]);
    }
    assert_int_equal(rq[N].st, NX_E_ARG);
    assert_non_null(strstr(errs[N].msg, "out of range"));
    assert_int_equal(nx_ctx_n_past(bat[N]), hist[N]);
    /* the MTP head over every row so far, three contexts in one call */
    const int32_t *tk[N] = {toks[0], toks[1], toks[2]};
    mtp_together_then_alone(scratch, solo, bat, tk, N, false);
    for (int i = 0; i <= N; i++) {
        free(ls[i]), free(lb[i]);
        nx_ctx_free(solo[i]);
        nx_ctx_free(bat[i]);
    }
    nx_ctx_free(scratch);
    nx_model_free(m);
}

/* The recurrent states of every DeltaNet layer after the context's last row (nx_dn_save). */
static float *dn_states(const nx_ctx *c) {
    const int64_t n = nx_dn_saved_floats(c->m);
    assert_true(n > 0);
    float *f = malloc(sizeof(float) * (size_t)n);
    nx_dn_save(c, c->n_past, f);
    return f;
}

static void assert_same_states(const nx_ctx *a, const nx_ctx *b) {
    float *sa = dn_states(a), *sb = dn_states(b);
    assert_int_equal(a->n_past, b->n_past);
    assert_memory_equal(sa, sb, sizeof(float) * (size_t)nx_dn_saved_floats(a->m));
    free(sa), free(sb);
}

/* A random checkpoint of the hybrid family (tests/ref/make_random_qwen35.py) written into a new
 * directory made from the template dir, loaded on 2 threads. */
static nx_model *load_hybrid(const char *family, char *dir) {
    char cmd[512];
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/ref/make_random_qwen35.py --family %s --out %s >/dev/null 2>&1",
             NX_SOURCE_ROOT, family, dir);
    assert_int_equal(system(cmd), 0);
    nx_load_params p;
    nx_load_params_default(&p);
    p.n_threads = 2;
    nx_model *m = NULL;
    assert_int_equal(nx_model_load(dir, &p, &m, NULL), NX_OK);
    return m;
}

static void remove_dir(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* test_multi_context_forward on a hybrid model (Gated DeltaNet layers, tests/ref/
 * make_random_qwen35.py): contexts with different histories (one rolled back in the middle of a
 * verify pass) forwarded together get each its solo bits — trunk logits, recurrent states after
 * the forward, after a batched verify pass rolled back to different rows, MTP logits and the head's
 * hidden — and the next step alone matches. */
static void multi_context_hybrid(const char *family) {
    enum { N = 3, HV = 419 };
    char dir[] = "/tmp/nx_hybrid_XXXXXX";
    nx_model *m = load_hybrid(family, dir);
    assert_int_equal(nx_model_get_info(m)->vocab_size, HV);
    nx_ctx *solo[N], *bat[N], *scratch = NULL;
    const int32_t hist[N] = {5, 9, 2}, rows[N] = {3, 1, 4}, from[N] = {0, 0, 2}, keep[N] = {1, 2, 3};
    int32_t toks[N][40];
    float *ls[N], *lb[N];
    nx_error errs[N];
    nx_fwd_req rq[N];
    assert_int_equal(nx_ctx_new_scratch(m, 32, N, 8, &scratch, NULL), NX_OK);
    for (int i = 0; i < N; i++) {
        for (int t = 0; t < 40; t++) toks[i][t] = (t * 7 + i * 13 + 3) % HV;
        ls[i] = calloc((size_t)HV * 4, sizeof(float));
        lb[i] = calloc((size_t)HV * 4, sizeof(float));
        nx_ctx **pair[2] = {&solo[i], &bat[i]};
        for (int k = 0; k < 2; k++) {
            assert_int_equal(nx_ctx_new(m, 64, pair[k], NULL), NX_OK);
            nx_ctx *c = *pair[k];
            if (i == 1) { /* a verify pass of 4 rows rolled back to its second */
                assert_int_equal(nx_ctx_eval(c, toks[i], 7, 0, NULL, NULL), NX_OK);
                assert_int_equal(nx_forward_trunk(c, toks[i] + 7, 4, NULL, 0, NULL), NX_OK);
                nx_ctx_truncate(c, hist[i]);
            } else {
                assert_int_equal(nx_ctx_eval(c, toks[i], hist[i], 0, NULL, NULL), NX_OK);
            }
        }
        assert_int_equal(nx_forward_trunk(solo[i], toks[i] + hist[i], rows[i], ls[i], from[i], NULL), NX_OK);
        rq[i] = (nx_fwd_req){.c = bat[i], .tokens = toks[i] + hist[i], .T = rows[i], .logits = lb[i],
                             .logits_from = from[i], .err = &errs[i]};
    }
    nx_forward_run(scratch, rq, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(rq[i].st, NX_OK);
        assert_memory_equal(ls[i], lb[i], sizeof(float) * HV * (size_t)(rows[i] - from[i]));
        assert_same_states(solo[i], bat[i]);
    }
    /* a verify pass of 3 rows each, together, rolled back to different rows */
    for (int i = 0; i < N; i++) {
        const int32_t at = hist[i] + rows[i];
        assert_int_equal(nx_forward_trunk(solo[i], toks[i] + at, 3, ls[i], 0, NULL), NX_OK);
        rq[i] = (nx_fwd_req){.c = bat[i], .tokens = toks[i] + at, .T = 3, .logits = lb[i], .err = &errs[i]};
    }
    nx_forward_run(scratch, rq, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(rq[i].st, NX_OK);
        assert_memory_equal(ls[i], lb[i], sizeof(float) * HV * 3);
        nx_ctx_truncate(solo[i], hist[i] + rows[i] + keep[i]);
        nx_ctx_truncate(bat[i], hist[i] + rows[i] + keep[i]);
        assert_same_states(solo[i], bat[i]);
    }
    /* the MTP head over every row so far, in one call */
    const int32_t *tk[N] = {toks[0], toks[1], toks[2]};
    mtp_together_then_alone(scratch, solo, bat, tk, N, true);
    /* the contexts' histories differ, so their states do */
    float *s0 = dn_states(bat[0]), *s1 = dn_states(bat[1]);
    assert_memory_not_equal(s0, s1, sizeof(float) * (size_t)nx_dn_saved_floats(m));
    free(s0), free(s1);
    for (int i = 0; i < N; i++) {
        free(ls[i]), free(lb[i]);
        nx_ctx_free(solo[i]);
        nx_ctx_free(bat[i]);
    }
    nx_ctx_free(scratch);
    nx_model_free(m);
    remove_dir(dir);
}

static void test_multi_context_qwen35(void **state) {
    (void)state;
    multi_context_hybrid("qwen3_5_moe");
}

static void test_multi_context_qwen3_next(void **state) {
    (void)state;
    multi_context_hybrid("qwen3_next");
}

static void test_thread_invariance(void **state) {
    (void)state;
    float *l[3];
    for (int t = 1; t <= 3; t++) {
        nx_model *m = load(t);
        nx_ctx *c = NULL;
        assert_int_equal(nx_ctx_new(m, 64, &c, NULL), NX_OK);
        l[t - 1] = malloc(sizeof(float) * V * 12);
        assert_int_equal(nx_ctx_eval(c, seq, 12, 0, l[t - 1], NULL), NX_OK);
        nx_ctx_free(c);
        nx_model_free(m);
    }
    assert_memory_equal(l[0], l[1], sizeof(float) * V * 12);
    assert_memory_equal(l[0], l[2], sizeof(float) * V * 12);
    for (int t = 0; t < 3; t++) free(l[t]);
}

static void test_truncate_equals_never_appended(void **state) {
    (void)state;
    nx_model *m = load(2);
    nx_ctx *a = NULL, *b = NULL;
    assert_int_equal(nx_ctx_new(m, 64, &a, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m, 64, &b, NULL), NX_OK);
    float *la = malloc(sizeof(float) * V * 4), *lb = malloc(sizeof(float) * V * 4);
    const int32_t other[4] = {9, 8, 7, 6};
    assert_int_equal(nx_ctx_eval(a, seq, 10, 0, NULL, NULL), NX_OK);
    nx_ctx_truncate(a, 5);
    assert_int_equal(nx_ctx_eval(a, other, 4, 5, la, NULL), NX_OK);
    assert_int_equal(nx_ctx_eval(b, seq, 5, 0, NULL, NULL), NX_OK);
    assert_int_equal(nx_ctx_eval(b, other, 4, 5, lb, NULL), NX_OK);
    assert_memory_equal(la, lb, sizeof(float) * V * 4);
    /* a wrong position is refused, not silently accepted */
    nx_error err = {0};
    assert_int_equal(nx_ctx_eval(b, other, 1, 3, lb, &err), NX_E_STATE);
    assert_non_null(strstr(err.msg, "cache"));
    free(la), free(lb);
    nx_ctx_free(a);
    nx_ctx_free(b);
    nx_model_free(m);
}

typedef struct collect {
    int32_t ids[64];
    float p[64]; /* each token's probability under the processed distribution */
    int n;
} collect;

static int on_tok(void *user, int32_t id, const float *probs) {
    collect *c = user;
    if (c->n < 64) {
        c->p[c->n] = probs[id];
        c->ids[c->n++] = id;
    }
    return 0;
}

/* 40 greedy tokens after seq[0..6) on c, plain (into *ref) and with each of the n draft settings:
 * every setting gives the plain tokens, and a fixed draft length does draft; with want_accepts
 * some of its drafts are accepted and some rejected (so the multi-row commit of a verify runs,
 * not only the reject path). gp is left set up for greedy runs. */
static void greedy_drafts_equal_ar(nx_ctx *c, const int32_t *drafts, size_t n, nx_gen_params *gp, collect *ref,
                                   bool want_accepts) {
    nx_gen_params_default(gp);
    gp->max_tokens = 40;
    gp->ignore_eos = true;
    gp->draft = 0;
    memset(ref, 0, sizeof *ref);
    assert_int_equal(nx_generate(c, seq, 6, gp, on_tok, ref, NULL, NULL), NX_OK);
    assert_int_equal(ref->n, 40);
    for (size_t i = 0; i < n; i++) {
        collect got = {0};
        nx_gen_stats st;
        gp->draft = drafts[i];
        assert_int_equal(nx_generate(c, seq, 6, gp, on_tok, &got, &st, NULL), NX_OK);
        assert_int_equal(got.n, 40);
        assert_memory_equal(got.ids, ref->ids, sizeof(int32_t) * 40);
        if (drafts[i] > 0) assert_true(st.n_drafted > 0);
        /* some verifies commit several rows, and some reject (both paths run) */
        if (drafts[i] > 0 && want_accepts) assert_true(st.n_accepted > 0 && st.n_accepted < st.n_drafted);
        assert_true(st.n_accepted <= st.n_drafted);
    }
}

static void test_greedy_mtp_equals_ar(void **state) {
    (void)state;
    nx_model *m = load(2);
    nx_ctx *c = NULL;
    assert_int_equal(nx_ctx_new(m, 128, &c, NULL), NX_OK);
    nx_gen_params gp;
    collect ref;
    const int32_t drafts[] = {1, 2, 3, NX_DRAFT_AUTO};
    greedy_drafts_equal_ar(c, drafts, 4, &gp, &ref, false);
    /* --draft auto keeps its measurements on the context: a second generation starts from them
     * (and still gives the AR tokens); nx_ctx_reset_auto forgets them */
    const nx_auto_state *a = nx_auto_of(c);
    assert_non_null(a);
    assert_true(a->hist_n[1] > 0 && a->probe_every > 0);
    collect again = {0};
    gp.draft = NX_DRAFT_AUTO;
    assert_int_equal(nx_generate(c, seq, 6, &gp, on_tok, &again, NULL, NULL), NX_OK);
    assert_memory_equal(again.ids, ref.ids, sizeof(int32_t) * 40);
    assert_ptr_equal(nx_auto_of(c), a); /* the same block, kept with the context */
    assert_true(a->hist_n[1] < 2 * NX_AUTO_COST_WINDOW); /* a ring position, not a count */
    nx_ctx_reset_auto(c);
    assert_int_equal(a->hist_n[1], 0);
    assert_int_equal(a->probe_every, 0);
    nx_ctx_free(c);
    nx_model_free(m);
    /* a head that often agrees with the trunk: drafts are accepted, so verifies commit several
     * rows at once, and the tokens are still the plain ones */
    char dir[256], draftable[256];
    memcpy(dir, g_dir, sizeof dir);
    g_out = 0.05f, g_draftable = true;
    assert_int_equal(setup_checkpoint(NULL), 0);
    g_out = 1.0f, g_draftable = false;
    memcpy(draftable, g_dir, sizeof draftable);
    m = load(2);
    memcpy(g_dir, dir, sizeof g_dir);
    assert_int_equal(nx_ctx_new(m, 128, &c, NULL), NX_OK);
    greedy_drafts_equal_ar(c, drafts, 4, &gp, &ref, true);
    nx_ctx_free(c);
    nx_model_free(m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", draftable);
    assert_int_equal(system(cmd), 0);
}

/* Generates from seq[0..6) with drafts 1, 2, 3 and auto under gp otherwise: each gives ref's
 * tokens with the same probabilities, and the fixed lengths draft. Returns the drafts accepted. */
static int64_t drafts_give_ref(nx_ctx *c, nx_gen_params *gp, const collect *ref) {
    const int32_t drafts[] = {1, 2, 3, NX_DRAFT_AUTO};
    int64_t accepted = 0;
    for (int i = 0; i < 4; i++) {
        collect got = {0};
        nx_gen_stats st;
        gp->draft = drafts[i];
        assert_int_equal(nx_generate(c, seq, 6, gp, on_tok, &got, &st, NULL), NX_OK);
        assert_int_equal(got.n, ref->n);
        assert_memory_equal(got.ids, ref->ids, sizeof(int32_t) * (size_t)ref->n);
        assert_memory_equal(got.p, ref->p, sizeof(float) * (size_t)ref->n);
        if (drafts[i] > 0 && ref->n > 1) assert_true(st.n_drafted > 0);
        accepted += st.n_accepted;
    }
    return accepted;
}

/* Recurrent-state checkpoints (nx_ctx_set_checkpoints) on a hybrid model: a prefill makes them
 * every `every` prompt rows and at the prompt's last row but one, the context keeps the highest
 * `max`; a later prompt sharing a prefix with the context, or with a prompt cache entry, keeps
 * the rows up to the last checkpoint within the shared prefix (none without checkpoints), and
 * its greedy tokens and their probabilities are a fresh context's, with MTP drafting on. */
static collect ckpt_turn(nx_ctx *c, const int32_t *p, int32_t n, int32_t want_cached) {
    nx_gen_params gp;
    nx_gen_params_default(&gp);
    gp.max_tokens = 8;
    gp.ignore_eos = true;
    gp.draft = 2;
    collect got = {0};
    nx_gen_stats st;
    nx_error err = {0};
    const bool head_held = nx_mtp_n_past(c) > 0; /* the head's cache followed the context */
    assert_int_equal(nx_generate(c, p, (size_t)n, &gp, on_tok, &got, &st, &err), NX_OK);
    assert_int_equal(st.n_cached, want_cached);
    /* the head is fed only the prompt rows past the kept ones (less the last, whose next token
     * changed) */
    assert_int_equal(st.n_mtp_prompt, head_held && want_cached > 0 ? n - want_cached : n - 1);
    assert_true(st.n_drafted > 0);
    return got;
}

static void ckpt_rows_are(const nx_ctx *c, const int32_t *rows, int n) {
    assert_int_equal(c->dn_n_ckpts, n);
    for (int i = 0; i < n; i++) assert_int_equal(c->dn_ckpts[i].row, rows[i]);
}

static void test_checkpoints_qwen35(void **state) {
    (void)state;
    char dir[] = "/tmp/nx_ckpt_XXXXXX";
    nx_model *m = load_hybrid("qwen3_5_moe", dir);
    const int32_t HV = nx_model_get_info(m)->vocab_size;
    nx_ctx *c = NULL, *fresh = NULL, *none = NULL;
    nx_error err = {0};
    assert_int_equal(nx_ctx_new(m, 256, &c, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m, 256, &fresh, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m, 256, &none, NULL), NX_OK);
    assert_int_equal(nx_ctx_set_checkpoints(c, -1, 16, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "checkpoints -1"));
    assert_int_equal(nx_ctx_set_checkpoints(c, NX_CTX_CHECKPOINTS_MAX + 1, 16, &err), NX_E_ARG);
    assert_int_equal(nx_ctx_set_checkpoints(c, 4, -1, &err), NX_E_ARG);
    assert_int_equal(nx_ctx_set_checkpoints(c, 4, 16, NULL), NX_OK);
    assert_int_equal(nx_ctx_set_checkpoints(none, 0, 16, NULL), NX_OK);
    int32_t p[200], q[200];
    for (int i = 0; i < 200; i++) p[i] = (31 * i + 7) % HV, q[i] = (17 * i + 3) % HV;
    /* a 70-token prompt: checkpoints at 16, 32, 48, 64 while prefilling and 69 at its end; the
     * highest four stay */
    ckpt_turn(c, p, 70, 0);
    ckpt_rows_are(c, (const int32_t[]){32, 48, 64, 69}, 4);
    /* another question after the first 50 tokens: kept up to the checkpoint at 48 */
    int32_t r[200];
    memcpy(r, p, sizeof(int32_t) * 50);
    memcpy(r + 50, q, sizeof(int32_t) * 20);
    collect a = ckpt_turn(c, r, 70, 48);
    nx_ctx_truncate(fresh, 0);
    collect b = ckpt_turn(fresh, r, 70, 0);
    assert_memory_equal(a.ids, b.ids, sizeof(int32_t) * 8);
    assert_memory_equal(a.p, b.p, sizeof(float) * 8);
    ckpt_rows_are(c, (const int32_t[]){32, 48, 64, 69}, 4);
    /* a context without checkpoints starts over */
    ckpt_turn(none, p, 70, 0);
    assert_int_equal(none->dn_n_ckpts, 0);
    ckpt_turn(none, r, 70, 0);
    /* a chat's next turn that re-renders the answer: the prompt, two tokens of it, new ones —
     * kept up to the prompt's last row but one */
    int32_t t2[200];
    memcpy(t2, r, sizeof(int32_t) * 70);
    memcpy(t2 + 70, a.ids, sizeof(int32_t) * 2);
    memcpy(t2 + 72, q + 40, sizeof(int32_t) * 30);
    t2[72] = (a.ids[2] + 1) % HV;
    a = ckpt_turn(c, t2, 102, 69);
    nx_ctx_truncate(fresh, 0);
    b = ckpt_turn(fresh, t2, 102, 0);
    assert_memory_equal(a.ids, b.ids, sizeof(int32_t) * 8);
    assert_memory_equal(a.p, b.p, sizeof(float) * 8);
    /* the prompt cache keeps the checkpoints with the rows: an unrelated prompt takes the context,
     * then the first prompt's neighbour comes back from the entry's checkpoint at 96 */
    nx_prompt_cache *pc = NULL;
    assert_int_equal(nx_prompt_cache_new((size_t)256 << 20, &pc, NULL), NX_OK);
    assert_int_equal(nx_prompt_cache_prepare(pc, c, q, 40), 0);
    ckpt_turn(c, q, 40, 0);
    int32_t t3[200];
    memcpy(t3, t2, sizeof(int32_t) * 100);
    memcpy(t3 + 100, p + 100, sizeof(int32_t) * 20);
    assert_int_equal(nx_prompt_cache_prepare(pc, c, t3, 120), 96);
    a = ckpt_turn(c, t3, 120, 96);
    nx_ctx_truncate(fresh, 0);
    b = ckpt_turn(fresh, t3, 120, 0);
    assert_memory_equal(a.ids, b.ids, sizeof(int32_t) * 8);
    assert_memory_equal(a.p, b.p, sizeof(float) * 8);
    nx_prompt_cache_stats pst;
    nx_prompt_cache_get_stats(pc, &pst);
    assert_int_equal(pst.restores, 1);
    assert_int_equal(pst.restored_tokens, 96);
    nx_prompt_cache_free(pc);
    nx_ctx_free(c);
    nx_ctx_free(fresh);
    nx_ctx_free(none);
    nx_model_free(m);
    remove_dir(dir);
}

/* Match verification draws every token, drafts included, with the noise the seed assigns to its
 * output position: seeded sampling then gives plain decoding's tokens, with the same
 * probabilities, whatever the draft length (auto included), under plain and filtered,
 * penalised sampling; drafts do get accepted (the draft's race often picks the target's token). */
static void test_match_seeded_reproducible(void **state) {
    (void)state;
    nx_model *m = load(2);
    nx_ctx *c = NULL;
    assert_int_equal(nx_ctx_new(m, 128, &c, NULL), NX_OK);
    int64_t accepted = 0;
    for (int setting = 0; setting < 2; setting++) {
        nx_gen_params gp;
        nx_gen_params_default(&gp);
        gp.max_tokens = 40;
        gp.ignore_eos = true;
        gp.verify = NX_VERIFY_MATCH;
        gp.sampling.temperature = setting ? 1.0f : 0.7f;
        gp.sampling.seed = 7 + (uint64_t)setting;
        if (setting) gp.sampling.top_k = 20, gp.sampling.repetition_penalty = 1.2f;
        gp.draft = 0;
        collect ref = {0};
        assert_int_equal(nx_generate(c, seq, 6, &gp, on_tok, &ref, NULL, NULL), NX_OK);
        assert_int_equal(ref.n, 40);
        accepted += drafts_give_ref(c, &gp, &ref);
        /* another seed samples something else */
        collect other = {0};
        gp.sampling.seed += 100;
        assert_int_equal(nx_generate(c, seq, 6, &gp, on_tok, &other, NULL, NULL), NX_OK);
        assert_true(memcmp(other.ids, ref.ids, sizeof(int32_t) * 40) != 0);
    }
    assert_true(accepted > 0);
    nx_ctx_free(c);
    nx_model_free(m);
}

/* JSON mode through the decoding loop: with every token a JSON fragment, greedy MTP gives plain
 * decoding's tokens for every draft length, seeded match sampling is reproducible across draft
 * lengths too, and every output is a live JSON prefix (complete when it ended). */
static void test_json_mode(void **state) {
    (void)state;
    static const char *const frag[] = {"{", "}", "[", "]", ",", ":", "\"", "\"k\"", "a", "b", "1", "0", "-",
                                       ".", "e", " ", "true", "false", "null", "\"x\":", "{\"", "\"}", "2,", "]}"};
    const size_t nf = sizeof frag / sizeof *frag;
    const char *toks[V];
    size_t lens[V];
    for (int i = 0; i < V; i++) toks[i] = frag[i % nf], lens[i] = strlen(toks[i]);
    const int32_t end = V - 1;
    toks[end] = NULL;
    nx_json_vocab *jv = NULL;
    assert_int_equal(nx_json_vocab_from_bytes(toks, lens, V, &end, 1, &jv, NULL), NX_OK);
    nx_model *m = load(2);
    nx_ctx *c = NULL;
    assert_int_equal(nx_ctx_new(m, 128, &c, NULL), NX_OK);
    for (int sampled = 0; sampled < 2; sampled++) {
        nx_gen_params gp;
        nx_gen_params_default(&gp);
        gp.max_tokens = 40;
        gp.ignore_eos = true;
        gp.stop_ids = &end;
        gp.n_stop_ids = 1;
        gp.sampling.json = jv;
        if (sampled) gp.verify = NX_VERIFY_MATCH, gp.sampling.temperature = 0.9f, gp.sampling.seed = 3;
        collect ref = {0};
        gp.draft = 0;
        assert_int_equal(nx_generate(c, seq, 6, &gp, on_tok, &ref, NULL, NULL), NX_OK);
        nx_json_state js;
        nx_json_init(&js);
        for (int i = 0; i < ref.n; i++) {
            if (ref.ids[i] == end) {
                assert_true(nx_json_complete(&js));
                assert_int_equal(i, ref.n - 1);
                break;
            }
            assert_true(nx_json_feed(&js, (const uint8_t *)toks[ref.ids[i]], lens[ref.ids[i]]));
        }
        drafts_give_ref(c, &gp, &ref);
    }
    nx_ctx_free(c);
    nx_model_free(m);
    nx_json_vocab_free(jv);
}

/* min_tokens: a stop token that logit_bias all but forces comes exactly after min_tokens others,
 * greedy and sampled, plain and with drafts (the mask is the sampler's, so drafts see it too). */
static void test_min_tokens(void **state) {
    (void)state;
    nx_model *m = load(2);
    nx_ctx *c = NULL;
    assert_int_equal(nx_ctx_new(m, 128, &c, NULL), NX_OK);
    const int32_t stop = 11;
    const nx_logit_bias force = {stop, 30.0f};
    for (int sampled = 0; sampled < 2; sampled++)
        for (int draft = 0; draft < 3; draft++) {
            nx_gen_params gp;
            nx_gen_params_default(&gp);
            gp.max_tokens = 30;
            gp.ignore_eos = true;
            gp.stop_ids = &stop;
            gp.n_stop_ids = 1;
            gp.min_tokens = 6;
            gp.draft = draft == 2 ? NX_DRAFT_AUTO : draft * 2;
            gp.sampling.logit_bias = &force;
            gp.sampling.n_logit_bias = 1;
            if (sampled) gp.sampling.temperature = 1.0f, gp.sampling.seed = 9;
            collect got = {0};
            nx_gen_stats st;
            assert_int_equal(nx_generate(c, seq, 6, &gp, on_tok, &got, &st, NULL), NX_OK);
            assert_int_equal(got.n, 7);
            for (int i = 0; i < 6; i++) assert_true(got.ids[i] != stop);
            assert_int_equal(got.ids[6], stop);
            assert_true(st.stopped_by_eos);
        }
    nx_ctx_free(c);
    nx_model_free(m);
}

/* Prefix reuse: a generation on a context that holds part of its prompt (a chat's next turn, a
 * shorter prompt, another sample of the same one) keeps those rows and gives the same tokens,
 * with the same probabilities, as the same generation on an emptied context: greedy with drafts,
 * and seeded sampling with a fixed draft length. */
static void test_prefix_reuse(void **state) {
    (void)state;
    nx_model *m = load(2);
    nx_ctx *warm = NULL, *cold = NULL;
    assert_int_equal(nx_ctx_new(m, 128, &warm, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m, 128, &cold, NULL), NX_OK);
    nx_gen_params gp;
    nx_gen_params_default(&gp);
    gp.max_tokens = 16;
    gp.ignore_eos = true;
    collect first = {0};
    nx_gen_stats st;
    assert_int_equal(nx_generate(warm, seq, 12, &gp, on_tok, &first, &st, NULL), NX_OK);
    assert_int_equal(st.n_cached, 0);
    /* the next turn: the first prompt, its answer and three new tokens */
    int32_t turn[40];
    memcpy(turn, seq, sizeof(int32_t) * 12);
    memcpy(turn + 12, first.ids, sizeof(int32_t) * 16);
    turn[28] = 9, turn[29] = 10, turn[30] = 11;
    const size_t lens[] = {31, 31, 8, 8, 8};
    for (int pass = 0; pass < 5; pass++) {
        if (pass == 4) turn[5] = 3; /* a prompt that leaves the cached tokens after 5 */
        nx_gen_params_default(&gp);
        gp.max_tokens = 20;
        gp.ignore_eos = true;
        gp.draft = pass % 2 ? 2 : NX_DRAFT_AUTO;
        if (pass % 2) gp.sampling.temperature = 0.8f, gp.sampling.seed = 7;
        collect a = {0}, b = {0};
        nx_gen_stats sa, sb;
        nx_ctx_truncate(cold, 0);
        assert_int_equal(nx_generate(cold, turn, lens[pass], &gp, on_tok, &a, &sa, NULL), NX_OK);
        assert_int_equal(nx_generate(warm, turn, lens[pass], &gp, on_tok, &b, &sb, NULL), NX_OK);
        assert_int_equal(sa.n_cached, 0);
        /* the turn after the first answer keeps the 27 rows the cache holds (the prompt and the
         * answer but its last token, never fed); the same prompt again, or a shorter one, all
         * but its last token */
        assert_int_equal(sb.n_cached, pass == 0 ? 27 : pass == 1 ? 30 : pass < 4 ? 7 : 5);
        assert_int_equal(a.n, 20);
        assert_int_equal(b.n, 20);
        assert_memory_equal(a.ids, b.ids, sizeof(int32_t) * 20);
        assert_memory_equal(a.p, b.p, sizeof(float) * 20);
        if (pass % 2) assert_true(sb.n_drafted > 0);
    }
    nx_ctx_free(warm);
    nx_ctx_free(cold);
    nx_model_free(m);
}

/* The prompt cache: two conversations alternating on one context. Each one's next turn gets
 * its rows back from the cache (the count is exact) and gives the same tokens, with the same
 * probabilities, as on an emptied context; a budget that holds one entry evicts the least
 * recently used; entries are never used with another model's context; budget 0 keeps nothing. */
static void prompt_turn(nx_ctx *c, nx_prompt_cache *pc, const int32_t *prompt, size_t n, bool sampled,
                        int32_t want_shared, collect *out) {
    nx_gen_params gp;
    nx_gen_params_default(&gp);
    gp.max_tokens = 16;
    gp.ignore_eos = true;
    if (sampled) gp.draft = 2, gp.sampling.temperature = 0.8f, gp.sampling.seed = 11;
    if (pc) assert_int_equal(nx_prompt_cache_prepare(pc, c, prompt, n), want_shared);
    nx_gen_stats st;
    memset(out, 0, sizeof *out);
    assert_int_equal(nx_generate(c, prompt, n, &gp, on_tok, out, &st, NULL), NX_OK);
    assert_int_equal(st.n_cached, want_shared);
    assert_int_equal(out->n, 16);
}

static void test_prompt_cache(void **state) {
    (void)state;
    nx_model *m = load(2), *m1 = load(1);
    nx_ctx *warm = NULL, *cold = NULL, *other = NULL;
    assert_int_equal(nx_ctx_new(m, 128, &warm, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m, 128, &cold, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m1, 128, &other, NULL), NX_OK);
    for (int budget_case = 0; budget_case < 3; budget_case++) {
        /* 0: room for everything; 1: for one entry of 35 or 54 rows (about 21 or 32 KB with the
         * head's rows), never two; 2: none */
        const size_t budget = budget_case == 0 ? (size_t)64 << 20 : budget_case == 1 ? 36000 : 0;
        nx_prompt_cache *pc = NULL;
        assert_int_equal(nx_prompt_cache_new(budget, &pc, NULL), NX_OK);
        nx_ctx_truncate(warm, 0);
        int32_t a[48], b[48];
        for (int i = 0; i < 20; i++) a[i] = (7 * i + 3) % V, b[i] = (11 * i + 50) % V;
        collect ga, gb, x, y;
        prompt_turn(warm, pc, a, 20, false, 0, &ga);
        prompt_turn(warm, pc, b, 20, false, 0, &gb); /* A's 35 rows (20 + 16 - 1) are saved */
        /* each conversation's next turn: its prompt, the answer and three new tokens */
        memcpy(a + 20, ga.ids, sizeof(int32_t) * 16);
        memcpy(b + 20, gb.ids, sizeof(int32_t) * 16);
        for (int i = 36; i < 39; i++) a[i] = i, b[i] = i + 1;
        nx_prompt_cache_stats st;
        for (int turn = 0; turn < 2; turn++) {
            const int32_t *p = turn ? b : a;
            /* full budget: A comes back after B; then B after A, from the entry saved as the
             * context moved to A. One-entry budget: the same, each save evicting the other.
             * Budget 0: nothing comes back. */
            prompt_turn(warm, pc, p, 39, true, budget_case == 2 ? 0 : 35, &x);
            nx_ctx_truncate(cold, 0);
            prompt_turn(cold, NULL, p, 39, true, 0, &y);
            assert_memory_equal(x.ids, y.ids, sizeof(int32_t) * 16);
            assert_memory_equal(x.p, y.p, sizeof(float) * 16);
        }
        nx_prompt_cache_get_stats(pc, &st);
        assert_int_equal(st.budget_bytes, (int64_t)budget);
        assert_true(st.bytes <= (int64_t)budget);
        assert_int_equal(st.restores, budget_case == 2 ? 0 : 2);
        assert_int_equal(st.restored_tokens, budget_case == 2 ? 0 : 70);
        assert_int_equal(st.saves, budget_case == 2 ? 0 : 3); /* A, then B, then A's next turn (replacing A) */
        assert_int_equal(st.entries, budget_case == 0 ? 2 : budget_case == 1 ? 1 : 0);
        assert_int_equal(st.evictions, budget_case == 1 ? 2 : 0);
        if (budget_case == 0) {
            /* another model's context sees none of these entries */
            nx_ctx_truncate(other, 0);
            assert_int_equal(nx_prompt_cache_prepare(pc, other, a, 39), 0);
            nx_prompt_cache_get_stats(pc, &st);
            assert_int_equal(st.restores, 2);
        }
        nx_prompt_cache_free(pc);
    }
    nx_ctx_free(warm);
    nx_ctx_free(cold);
    nx_ctx_free(other);
    nx_model_free(m);
    nx_model_free(m1);
}

/* ---------------------------------------------------------------- state files */

static void state_path(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", g_dir, name);
}

static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fclose(f);
    return n;
}

static uint8_t *read_all(const char *path, long *n) {
    *n = file_size(path);
    FILE *f = fopen(path, "rb");
    uint8_t *b = malloc((size_t)*n + 1);
    assert_int_equal(fread(b, 1, (size_t)*n, f), (size_t)*n);
    fclose(f);
    return b;
}

static void write_all(const char *path, const uint8_t *b, long n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
}

/* Saved on one context and loaded into another (of the same model, or of a copy loaded with
 * another thread count), a conversation's next turn keeps every loaded row and gives the same
 * tokens with the same probabilities as on an emptied context; a context smaller than the file
 * takes its longest prefix; a save of n rows holds n. */
static void test_state_file(void **state) {
    (void)state;
    nx_model *m = load(2), *m1 = load(1);
    nx_ctx *a = NULL, *b = NULL, *cold = NULL, *small = NULL;
    assert_int_equal(nx_ctx_new(m, 128, &a, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m1, 128, &b, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m, 128, &cold, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m, 24, &small, NULL), NX_OK);
    int32_t p[48];
    for (int i = 0; i < 20; i++) p[i] = (13 * i + 5) % V;
    collect first, x, y;
    prompt_turn(a, NULL, p, 20, true, 0, &first);
    assert_int_equal(nx_ctx_n_past(a), 35); /* 20 + 16 - 1: the last token is not fed yet */
    char path[600];
    state_path(path, sizeof path, "conv.state");
    int32_t n_saved = -1, n_loaded = -1;
    int64_t bytes = -1, read_bytes = -1;
    nx_error err = {0};
    assert_int_equal(nx_state_save(a, path, -1, &n_saved, &bytes, &err), NX_OK);
    assert_int_equal(n_saved, 35);
    assert_int_equal(bytes, file_size(path));
    assert_int_equal(nx_state_load(b, path, &n_loaded, &read_bytes, &err), NX_OK);
    assert_int_equal(n_loaded, 35);
    assert_int_equal(read_bytes, bytes);
    assert_int_equal(nx_ctx_n_past(b), 35);
    /* the head's cache rows came along (the next turn's sampled MTP output below shows their bits) */
    assert_true(nx_mtp_n_past(b) > 0);
    assert_int_equal(nx_mtp_n_past(b), nx_mtp_rows_for(a, 35));
    /* the next turn: the prompt, the answer, three new tokens */
    memcpy(p + 20, first.ids, sizeof(int32_t) * 16);
    for (int i = 36; i < 39; i++) p[i] = (5 * i) % V;
    prompt_turn(b, NULL, p, 39, true, 35, &x);
    nx_ctx_truncate(cold, 0);
    prompt_turn(cold, NULL, p, 39, true, 0, &y);
    assert_memory_equal(x.ids, y.ids, sizeof(int32_t) * 16);
    assert_memory_equal(x.p, y.p, sizeof(float) * 16);
    /* a context of 24 positions takes the first 24 rows */
    assert_int_equal(nx_state_load(small, path, &n_loaded, NULL, &err), NX_OK);
    assert_int_equal(n_loaded, 24);
    nx_gen_params gp;
    nx_gen_params_default(&gp);
    gp.max_tokens = 1;
    nx_gen_stats st;
    if (nx_generate(small, p, 20, &gp, NULL, NULL, &st, &err) != NX_OK) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(st.n_cached, 19); /* all but the prompt's last token, as for any prefix */
    /* the first 10 rows alone */
    assert_int_equal(nx_state_save(a, path, 10, &n_saved, &bytes, &err), NX_OK);
    assert_int_equal(n_saved, 10);
    assert_int_equal(nx_state_load(b, path, &n_loaded, NULL, &err), NX_OK);
    assert_int_equal(n_loaded, 10);
    prompt_turn(b, NULL, p, 20, false, 10, &x);
    nx_ctx_truncate(cold, 0);
    prompt_turn(cold, NULL, p, 20, false, 0, &y);
    assert_memory_equal(x.ids, y.ids, sizeof(int32_t) * 16);
    /* rows a load is about to replace can go into the prompt cache first, and come back from it */
    nx_prompt_cache *pc = NULL;
    nx_prompt_cache_stats pst;
    assert_int_equal(nx_prompt_cache_new((size_t)64 << 20, &pc, NULL), NX_OK);
    nx_ctx_truncate(b, 0);
    prompt_turn(b, NULL, p, 39, false, 0, &x);
    nx_prompt_cache_keep(pc, b);
    nx_prompt_cache_get_stats(pc, &pst);
    assert_int_equal(pst.saves, 1);
    assert_int_equal(nx_state_load(b, path, &n_loaded, NULL, &err), NX_OK);
    assert_int_equal(nx_prompt_cache_prepare(pc, b, p, 39), 38);
    nx_ctx_truncate(small, 15);
    nx_prompt_cache_keep(pc, small); /* fewer than 16 rows are not kept */
    nx_prompt_cache_get_stats(pc, &pst);
    assert_int_equal(pst.restores, 1);
    assert_int_equal(pst.entries, 1);
    nx_prompt_cache_free(pc);
    assert_int_equal(unlink(path), 0);
    nx_ctx_free(a);
    nx_ctx_free(b);
    nx_ctx_free(cold);
    nx_ctx_free(small);
    nx_model_free(m);
    nx_model_free(m1);
}

/* Rewrites the header's CRC (bytes 60..63 over 0..59) after a test edits the header. */
static void fix_header_crc(uint8_t *b) {
    const uint32_t c = (uint32_t)crc32(crc32(0, Z_NULL, 0), b, 60);
    for (int i = 0; i < 4; i++) b[60 + i] = (uint8_t)(c >> (8 * i));
}

/* Each bad file is an error naming its problem, and the context keeps the rows it held. */
static void expect_load_error(nx_ctx *c, const char *path, nx_status code, const char *what) {
    const int32_t before = nx_ctx_n_past(c);
    nx_error err = {0};
    int32_t n = -7;
    assert_int_equal(nx_state_load(c, path, &n, NULL, &err), code);
    if (!strstr(err.msg, what)) fprintf(stderr, "expected '%s' in: %s\n", what, err.msg);
    assert_non_null(strstr(err.msg, what));
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(n, -7);
    assert_int_equal(nx_ctx_n_past(c), before);
}

static void test_state_file_errors(void **state) {
    (void)state;
    nx_model *m = load(2), *m16 = load_kv(2, NX_KV_F16);
    nx_ctx *c = NULL, *c16 = NULL;
    assert_int_equal(nx_ctx_new(m, 64, &c, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m16, 64, &c16, NULL), NX_OK);
    assert_int_equal(nx_forward_trunk(c, seq, 12, NULL, 12, NULL), NX_OK);
    char good[600], bad[600];
    state_path(good, sizeof good, "good.state");
    state_path(bad, sizeof bad, "bad.state");
    nx_error err = {0};
    assert_int_equal(nx_state_save(c, good, -1, NULL, NULL, &err), NX_OK);
    long n = 0;
    uint8_t *g = read_all(good, &n);
    assert_true(n > 96);
    /* the context under test holds 5 rows, so a failed load that touched it would show */
    nx_ctx_truncate(c, 5);

    char missing[600];
    state_path(missing, sizeof missing, "missing.state");
    expect_load_error(c, missing, NX_E_IO, "No such file");
    write_all(bad, (const uint8_t *)"hello, world", 12);
    expect_load_error(c, bad, NX_E_FORMAT, "not a nextn state file");
    write_all(bad, g, n - 100);
    expect_load_error(c, bad, NX_E_FORMAT, "truncated");
    uint8_t *t = malloc((size_t)n + 8);
    memcpy(t, g, (size_t)n);
    memset(t + n, 0, 8);
    write_all(bad, t, n + 8);
    expect_load_error(c, bad, NX_E_FORMAT, "trailing bytes");
    memcpy(t, g, (size_t)n);
    t[n - 3] ^= 0x40; /* a bit of the last hidden state */
    write_all(bad, t, n);
    expect_load_error(c, bad, NX_E_FORMAT, "checksum mismatch");
    memcpy(t, g, (size_t)n);
    t[24] ^= 1; /* the layer count, header CRC left stale */
    write_all(bad, t, n);
    expect_load_error(c, bad, NX_E_FORMAT, "corrupt header");
    t[24] ^= 1;
    t[8] = 3; /* version 3, consistently */
    fix_header_crc(t);
    write_all(bad, t, n);
    expect_load_error(c, bad, NX_E_FORMAT, "version 3");
    memcpy(t, g, (size_t)n);
    t[92] = 12; /* as many of the head's rows as rows (at most one fewer) */
    write_all(bad, t, n);
    expect_load_error(c, bad, NX_E_FORMAT, "12 rows of the MTP head's cache for 12 rows");
    t[92] = 1; /* one, where the payload holds none */
    write_all(bad, t, n);
    expect_load_error(c, bad, NX_E_FORMAT, "corrupt header");
    /* version 1 (no head rows) is still read */
    memcpy(t, g, (size_t)n);
    assert_int_equal(t[92], 0); /* this context's head holds no rows */
    t[8] = 1;
    fix_header_crc(t);
    write_all(bad, t, n);
    int32_t n1 = -1;
    assert_int_equal(nx_state_load(c, bad, &n1, NULL, &err), NX_OK);
    assert_int_equal(n1, 12);
    nx_ctx_truncate(c, 5);
    memcpy(t, g, (size_t)n);
    t[36] ^= 1; /* hidden size 33 */
    fix_header_crc(t);
    write_all(bad, t, n);
    expect_load_error(c, bad, NX_E_FORMAT, "hidden size 33");
    /* a token outside the vocabulary, with both checksums made consistent */
    memcpy(t, g, (size_t)n);
    const int32_t big = V + 3;
    memcpy(t + 96 + 4 * 2, &big, 4);
    const uint32_t pc = (uint32_t)crc32(crc32(0, Z_NULL, 0), t + 96, (uInt)(n - 96));
    for (int i = 0; i < 4; i++) t[56 + i] = (uint8_t)(pc >> (8 * i));
    fix_header_crc(t);
    write_all(bad, t, n);
    expect_load_error(c, bad, NX_E_FORMAT, "outside the vocabulary");
    /* the same file, read by a context with an f16 cache */
    expect_load_error(c16, good, NX_E_FORMAT, "f32 KV cache");
    /* another checkpoint of the same shape */
    char dir[256], other[256];
    memcpy(dir, g_dir, sizeof dir);
    const uint64_t seed = rng_state;
    rng_state = 0x1234567ull;
    assert_int_equal(setup_checkpoint(NULL), 0);
    memcpy(other, g_dir, sizeof other);
    nx_model *mo = load(2);
    memcpy(g_dir, dir, sizeof g_dir);
    rng_state = seed;
    nx_ctx *co = NULL;
    assert_int_equal(nx_ctx_new(mo, 64, &co, NULL), NX_OK);
    expect_load_error(co, good, NX_E_FORMAT, "another model");
    /* a directory, and a save where no file can be made */
    expect_load_error(c, g_dir, NX_E_IO, "not a regular file");
    char nowhere[600];
    snprintf(nowhere, sizeof nowhere, "%s/no/such/dir/x.state", g_dir);
    assert_int_equal(nx_state_save(c, nowhere, -1, NULL, NULL, &err), NX_E_IO);
    assert_non_null(strstr(err.msg, "cannot create"));
    /* after all that, the good file still loads */
    int32_t rows = 0;
    assert_int_equal(nx_state_load(c, good, &rows, NULL, &err), NX_OK);
    assert_int_equal(rows, 12);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", other);
    assert_int_equal(system(cmd), 0);
    unlink(good);
    unlink(bad);
    free(g);
    free(t);
    nx_ctx_free(co);
    nx_ctx_free(c);
    nx_ctx_free(c16);
    nx_model_free(mo);
    nx_model_free(m);
    nx_model_free(m16);
}

/* On an f16 KV cache too (half-size cache rows written and read by every path: plain steps,
 * verify rows, the head's cache, truncation after rejections), greedy MTP gives the AR tokens,
 * and the cache really is f16: the logits differ from the f32 cache's. */
static void test_f16_cache(void **state) {
    (void)state;
    nx_model *m16 = load_kv(2, NX_KV_F16), *m32 = load(2);
    assert_string_equal(nx_model_get_info(m16)->kv_type, "f16");
    assert_int_equal(nx_model_get_info(m16)->kv_bytes_per_token * 2, nx_model_get_info(m32)->kv_bytes_per_token);
    nx_ctx *c = NULL, *c32 = NULL;
    assert_int_equal(nx_ctx_new(m16, 128, &c, NULL), NX_OK);
    assert_int_equal(nx_ctx_new(m32, 128, &c32, NULL), NX_OK);
    float *l16 = malloc(sizeof(float) * 12 * V), *l32 = malloc(sizeof(float) * 12 * V);
    assert_int_equal(nx_forward_trunk(c, seq, 12, l16, 0, NULL), NX_OK);
    assert_int_equal(nx_forward_trunk(c32, seq, 12, l32, 0, NULL), NX_OK);
    double diff = 0, range = 0;
    for (int64_t i = 0; i < 12 * V; i++) {
        diff = fmax(diff, fabs((double)l16[i] - l32[i]));
        range = fmax(range, fabs((double)l32[i]));
    }
    assert_true(diff > 0 && diff < 1e-2 * range);
    nx_gen_params gp;
    collect ref;
    const int32_t drafts[] = {1, 3, NX_DRAFT_AUTO};
    greedy_drafts_equal_ar(c, drafts, 3, &gp, &ref, false);
    free(l16);
    free(l32);
    nx_ctx_free(c);
    nx_ctx_free(c32);
    nx_model_free(m16);
    nx_model_free(m32);
}

static void test_bad_requests(void **state) {
    (void)state;
    nx_model *m = load(1);
    nx_ctx *c = NULL;
    nx_error err = {0};
    assert_int_equal(nx_ctx_new(m, 100000, &c, &err), NX_E_ARG); /* beyond max_position_embeddings */
    assert_non_null(strstr(err.msg, "max_position"));
    assert_int_equal(nx_ctx_new(m, 16, &c, NULL), NX_OK);
    nx_gen_params gp;
    nx_gen_params_default(&gp);
    const int32_t bad[2] = {3, V + 5};
    assert_int_equal(nx_generate(c, bad, 2, &gp, NULL, NULL, NULL, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "out of range"));
    int32_t longp[20] = {0};
    assert_int_equal(nx_generate(c, longp, 20, &gp, NULL, NULL, NULL, &err), NX_E_ARG);
    gp.sampling.top_p = 1.5f;
    assert_int_equal(nx_generate(c, seq, 3, &gp, NULL, NULL, NULL, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "top_p"));
    /* the dense-part timer of `nextn bench` */
    double sec = -1, bytes = -1;
    assert_int_equal(nx_model_time_dense(m, 0, 1, &sec, &bytes, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "T must be"));
    assert_int_equal(nx_model_time_dense(m, 2, 1, &sec, &bytes, &err), NX_OK);
    assert_true(sec > 0 && bytes > 0);
    nx_ctx_free(c);
    nx_model_free(m);
    /* a KV cache type that does not exist */
    nx_load_params p;
    nx_load_params_default(&p);
    p.kv_type = (nx_kv_type)7;
    nx_model *m2 = NULL;
    assert_int_equal(nx_model_load(g_dir, &p, &m2, &err), NX_E_ARG);
    assert_null(m2);
    assert_non_null(strstr(err.msg, "kv_type 7"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router_brute_force),
        cmocka_unit_test(test_router_groups),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_multi_context_forward),
        cmocka_unit_test(test_multi_context_qwen35),
        cmocka_unit_test(test_checkpoints_qwen35),
        cmocka_unit_test(test_multi_context_qwen3_next),
        cmocka_unit_test(test_thread_invariance),
        cmocka_unit_test(test_truncate_equals_never_appended),
        cmocka_unit_test(test_greedy_mtp_equals_ar),
        cmocka_unit_test(test_f16_cache),
        cmocka_unit_test(test_match_seeded_reproducible),
        cmocka_unit_test(test_json_mode),
        cmocka_unit_test(test_min_tokens),
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_prompt_cache),
        cmocka_unit_test(test_state_file),
        cmocka_unit_test(test_state_file_errors),
        cmocka_unit_test(test_bad_requests),
    };
    return cmocka_run_group_tests(tests, setup_checkpoint, teardown_checkpoint);
}
