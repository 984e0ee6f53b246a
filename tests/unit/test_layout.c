/* Layout tests: tiny random checkpoints in the Tencent layout, the MLX layout (float and
 * affine-quantized, stacked experts) and the MTP namings of docs/design.md §4.2 are written to a
 * temp dir and loaded; the weight table's shapes and pointers are checked against the files
 * (stacked expert e must view base + e·out·row_bytes), as are headless checkpoints, an MTP
 * with its own expert count, quantization cross-checks and error messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_builder.h"
#include "io/config.h"
#include "io/layout.h"

/* tiny hy_v3: 3 layers (layer 0 dense), 4 experts of width 32, GQA 4/2 heads of 16 */
enum { V = 16, H = 64, NH = 4, NKV = 2, HD = 16, I = 64, ED = 32, NE = 4, TOPK = 2, NL = 3 };

typedef enum mtp_naming {
    MTP_TENCENT = 0, /* model.layers.N.X */
    MTP_MLX,         /* mtp.X + mtp.layer.X */
    MTP_JANG,        /* mtp.0.X + mtp.0.block.X, mlp.gate, experts.{proj} stacked */
} mtp_naming;

typedef struct spec {
    bool mlx;          /* stacked switch_mlp experts, router.expert_bias */
    int bits, group;   /* 0: BF16 weights */
    int mtp;           /* 0 none, 1 inline (file 0), 2 in file 1 */
    mtp_naming naming;
    int mtp_experts;
    bool tie;
    int nextn;         /* num_nextn_predict_layers in the config */
} spec;

typedef struct fixture {
    char *dir;
    ck *c;
    nx_config cfg;
    nx_store *st;
    nx_weights w;
    nx_error err;
} fixture;

/* One decoder layer under `pre`. stacked: "mlp.switch_mlp." or "mlp.experts." or NULL. */
static void add_layer(ck *c, int f, const char *pre, bool moe, int E, const char *stacked,
                      const char *router, const char *bias, int bits, int group) {
    char p[256];
#define N(s) (snprintf(p, sizeof p, "%s%s", pre, s), p)
    ck_add(c, f, N("input_layernorm.weight"), NX_DTYPE_BF16, 1, (int64_t)H);
    ck_add(c, f, N("post_attention_layernorm.weight"), NX_DTYPE_F32, 1, (int64_t)H);
    ck_linear(c, f, N("self_attn.q_proj"), 0, NH * HD, H, bits, group);
    ck_linear(c, f, N("self_attn.k_proj"), 0, NKV * HD, H, bits, group);
    ck_linear(c, f, N("self_attn.v_proj"), 0, NKV * HD, H, bits, group);
    ck_linear(c, f, N("self_attn.o_proj"), 0, H, NH * HD, bits, group);
    ck_add(c, f, N("self_attn.q_norm.weight"), NX_DTYPE_BF16, 1, (int64_t)HD);
    ck_add(c, f, N("self_attn.k_norm.weight"), NX_DTYPE_BF16, 1, (int64_t)HD);
    if (!moe) {
        ck_linear(c, f, N("mlp.gate_proj"), 0, I, H, bits, group);
        ck_linear(c, f, N("mlp.up_proj"), 0, I, H, bits, group);
        ck_linear(c, f, N("mlp.down_proj"), 0, H, I, bits, group);
        return;
    }
    /* routers are 8-bit group 64 in mlx-lm's default recipe */
    ck_linear(c, f, N(router), 0, E, H, bits ? 8 : 0, 64);
    ck_add(c, f, N(bias), NX_DTYPE_F32, 1, (int64_t)E);
    if (stacked) {
        char q[300];
        snprintf(q, sizeof q, "%s%sgate_proj", pre, stacked);
        ck_linear(c, f, q, E, ED, H, bits, group);
        snprintf(q, sizeof q, "%s%sup_proj", pre, stacked);
        ck_linear(c, f, q, E, ED, H, bits, group);
        snprintf(q, sizeof q, "%s%sdown_proj", pre, stacked);
        ck_linear(c, f, q, E, H, ED, bits, group);
    } else {
        for (int e = 0; e < E; e++) {
            char q[300];
            snprintf(q, sizeof q, "%smlp.experts.%d.gate_proj", pre, e);
            ck_linear(c, f, q, 0, ED, H, bits, group);
            snprintf(q, sizeof q, "%smlp.experts.%d.up_proj", pre, e);
            ck_linear(c, f, q, 0, ED, H, bits, group);
            snprintf(q, sizeof q, "%smlp.experts.%d.down_proj", pre, e);
            ck_linear(c, f, q, 0, H, ED, bits, group);
        }
    }
    ck_linear(c, f, N("mlp.shared_mlp.gate_proj"), 0, ED, H, bits, group);
    ck_linear(c, f, N("mlp.shared_mlp.up_proj"), 0, ED, H, bits, group);
    ck_linear(c, f, N("mlp.shared_mlp.down_proj"), 0, H, ED, bits, group);
#undef N
}

static void build(ck *c, const spec *s) {
    c->rng = 12345;
    ck_linear(c, 0, "model.embed_tokens", 0, V, H, s->bits, s->group);
    if (!s->tie) ck_linear(c, 0, "lm_head", 0, V, H, s->bits, s->group);
    ck_add(c, 0, "model.norm.weight", NX_DTYPE_BF16, 1, (int64_t)H);
    for (int l = 0; l < NL; l++) {
        char pre[64];
        snprintf(pre, sizeof pre, "model.layers.%d.", l);
        add_layer(c, 0, pre, l >= 1, NE, s->mlx ? "mlp.switch_mlp." : NULL, "mlp.router.gate",
                  s->mlx ? "mlp.router.expert_bias" : "mlp.expert_bias", s->bits, s->group);
    }
    if (!s->mtp) return;
    int f = s->mtp == 2 ? 1 : 0;
    const char *head = s->naming == MTP_TENCENT ? "model.layers.3." : s->naming == MTP_MLX ? "mtp." : "mtp.0.";
    const char *block = s->naming == MTP_TENCENT ? "model.layers.3." : s->naming == MTP_MLX ? "mtp.layer." : "mtp.0.block.";
    char p[128];
    snprintf(p, sizeof p, "%senorm.weight", head);
    ck_add(c, f, p, NX_DTYPE_BF16, 1, (int64_t)H);
    snprintf(p, sizeof p, "%shnorm.weight", head);
    ck_add(c, f, p, NX_DTYPE_BF16, 1, (int64_t)H);
    snprintf(p, sizeof p, "%sfinal_layernorm.weight", head);
    ck_add(c, f, p, NX_DTYPE_BF16, 1, (int64_t)H);
    snprintf(p, sizeof p, "%seh_proj", head);
    ck_linear(c, f, p, 0, H, 2 * H, s->bits, s->group);
    int E = s->mtp_experts ? s->mtp_experts : NE;
    if (s->naming == MTP_JANG)
        add_layer(c, f, block, true, E, "mlp.experts.", "mlp.gate", "mlp.gate.e_score_correction_bias", s->bits,
                  s->group);
    else
        add_layer(c, f, block, true, E, s->mlx ? "mlp.switch_mlp." : NULL, "mlp.router.gate",
                  s->mlx ? "mlp.router.expert_bias" : "mlp.expert_bias", s->bits, s->group);
    if (s->naming == MTP_TENCENT) /* unused copies some checkpoints carry */
        ck_add(c, f, "model.layers.3.shared_head.norm.weight", NX_DTYPE_BF16, 1, (int64_t)H);
}

static char *config_json(const spec *s) {
    char *j = malloc(4096);
    int o = snprintf(j, 4096,
                     "{\"model_type\":\"hy_v3\",\"vocab_size\":%d,\"hidden_size\":%d,\"num_hidden_layers\":%d,"
                     "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":%d,"
                     "\"intermediate_size\":%d,\"expert_hidden_dim\":%d,\"num_experts\":%d,"
                     "\"num_experts_per_tok\":%d,\"num_shared_experts\":1,\"first_k_dense_replace\":1,"
                     "\"tie_word_embeddings\":%s,\"num_nextn_predict_layers\":%d",
                     V, H, NL, NH, NKV, HD, I, ED, NE, TOPK, s->tie ? "true" : "false", s->nextn);
    if (s->bits) {
        o += snprintf(j + o, (size_t)(4096 - o), ",\"quantization\":{\"group_size\":%d,\"bits\":%d,\"mode\":\"affine\"",
                      s->group, s->bits);
        for (int l = 1; l < NL; l++)
            o += snprintf(j + o, (size_t)(4096 - o),
                          ",\"model.layers.%d.mlp.router.gate\":{\"group_size\":64,\"bits\":8}", l);
        o += snprintf(j + o, (size_t)(4096 - o), ",\"mtp.layer.mlp.router.gate\":{\"group_size\":64,\"bits\":8}");
        o += snprintf(j + o, (size_t)(4096 - o), ",\"mtp.0.block.mlp.gate\":{\"group_size\":64,\"bits\":8}}");
    }
    snprintf(j + o, (size_t)(4096 - o), "}");
    return j;
}

/* Writes the built checkpoint (files: model.safetensors [+ second]) and loads it. */
static nx_status load_into(fixture *fx, const spec *s, const char *second_name, bool want_mtp) {
    const char *names[2] = {"model.safetensors", second_name ? second_name : "model-mtp.safetensors"};
    assert_int_equal(ck_write(fx->c, fx->dir, names, s->mtp == 2 ? 2 : 1, 1, NULL), NX_OK);
    char *j = config_json(s);
    write_text(fx->dir, "config.json", j);
    free(j);
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", fx->dir);
    assert_int_equal(nx_config_load(p, &fx->cfg, &fx->err), NX_OK);
    assert_int_equal(nx_store_open(fx->dir, &fx->st, &fx->err), NX_OK);
    return nx_weights_load(fx->st, &fx->cfg, want_mtp, false, &fx->w, &fx->err);
}

static int setup(void **state) {
    fixture *fx = calloc(1, sizeof *fx);
    fx->dir = tmpdir_new();
    fx->c = calloc(1, sizeof *fx->c);
    *state = fx;
    return fx->dir && fx->c ? 0 : -1;
}

static int teardown(void **state) {
    fixture *fx = *state;
    nx_weights_free(&fx->w);
    nx_store_free(fx->st);
    nx_config_free(&fx->cfg);
    ck_free(fx->c);
    free(fx->c);
    tmpdir_free(fx->dir);
    free(fx);
    return 0;
}

static const uint8_t *data_of(const fixture *fx, const char *name) {
    const nx_tensor *t = nx_store_find(fx->st, name);
    if (!t) {
        print_error("no tensor %s\n", name);
        fail();
    }
    return t->data;
}

static float bf16_at(const uint8_t *p, int i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static void expect_failure(fixture *fx, nx_status got, const char *a, const char *b) {
    if (got == NX_OK) {
        print_error("load succeeded, expected an error about %s\n", a);
        fail();
    }
    if ((a && !strstr(fx->err.msg, a)) || (b && !strstr(fx->err.msg, b))) {
        print_error("message \"%s\" lacks \"%s\" / \"%s\"\n", fx->err.msg, a, b ? b : "");
        fail();
    }
    assert_null(fx->w.layers); /* zeroed on failure */
}

/* ---------------------------------------------------------------- tests */

static void test_tencent_inline(void **state) {
    fixture *fx = *state;
    spec s = {.mtp = 1, .naming = MTP_TENCENT, .nextn = 1};
    build(fx->c, &s);
    assert_int_equal(load_into(fx, &s, NULL, true), NX_OK);
    nx_weights *w = &fx->w;
    assert_string_equal(w->layout, "tencent");
    assert_string_equal(w->mtp_where, "inline");
    assert_true(w->has_mtp);
    assert_ptr_equal(w->embed.w, data_of(fx, "model.embed_tokens.weight"));
    assert_int_equal(w->embed.out, V);
    assert_int_equal(w->embed.in, H);
    assert_int_equal(w->embed.dtype, NX_DTYPE_BF16);
    assert_ptr_equal(w->lm_head.w, data_of(fx, "lm_head.weight"));
    const uint8_t *fn = data_of(fx, "model.norm.weight");
    for (int i = 0; i < H; i++) assert_true(w->final_norm[i] == bf16_at(fn, i));

    nx_layer *l0 = &w->layers[0];
    assert_false(l0->is_moe);
    assert_int_equal(l0->dense.gate.out, I);
    assert_int_equal(l0->dense.down.out, H);
    assert_int_equal(l0->dense.down.in, I);
    assert_int_equal(l0->wq.out, NH * HD);
    assert_int_equal(l0->wk.out, NKV * HD);
    assert_int_equal(l0->wo.in, NH * HD);
    assert_non_null(l0->q_norm);
    const uint8_t *pn = data_of(fx, "model.layers.0.post_attention_layernorm.weight");
    for (int i = 0; i < H; i++) {
        float f;
        memcpy(&f, pn + 4 * i, 4);
        assert_true(l0->ffn_norm[i] == f);
    }
    for (int l = 1; l < NL; l++) {
        nx_layer *ly = &w->layers[l];
        assert_true(ly->is_moe);
        assert_int_equal(ly->moe.n_experts, NE);
        assert_int_equal(ly->moe.router.out, NE);
        assert_true(ly->moe.has_shared);
        assert_int_equal(ly->moe.shared.gate.out, ED);
        char n[128];
        for (int e = 0; e < NE; e++) {
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            assert_ptr_equal(ly->moe.experts[e].gate.w, data_of(fx, n));
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            assert_ptr_equal(ly->moe.experts[e].down.w, data_of(fx, n));
            assert_int_equal(ly->moe.experts[e].down.out, H);
            assert_int_equal(ly->moe.experts[e].down.in, ED);
        }
        snprintf(n, sizeof n, "model.layers.%d.mlp.expert_bias", l);
        const uint8_t *b = data_of(fx, n);
        for (int e = 0; e < NE; e++) {
            float f;
            memcpy(&f, b + 4 * e, 4);
            assert_true(ly->moe.expert_bias[e] == f);
        }
    }
    nx_mtp_weights *m = &w->mtp;
    assert_non_null(m->enorm);
    assert_non_null(m->hnorm);
    assert_non_null(m->final_norm);
    assert_int_equal(m->eh_proj.out, H);
    assert_int_equal(m->eh_proj.in, 2 * H);
    assert_ptr_equal(m->eh_proj.w, data_of(fx, "model.layers.3.eh_proj.weight"));
    assert_true(m->layer.is_moe);
    assert_int_equal(m->layer.moe.n_experts, NE);
    assert_ptr_equal(m->layer.moe.experts[2].up.w, data_of(fx, "model.layers.3.mlp.experts.2.up_proj.weight"));
}

static void test_mlx_stacked(void **state) {
    fixture *fx = *state;
    spec s = {.mlx = true, .mtp = 1, .naming = MTP_MLX, .nextn = 1};
    build(fx->c, &s);
    assert_int_equal(load_into(fx, &s, NULL, true), NX_OK);
    nx_weights *w = &fx->w;
    assert_string_equal(w->layout, "mlx");
    assert_string_equal(w->mtp_where, "inline");
    for (int l = 1; l < NL; l++) {
        char n[128];
        snprintf(n, sizeof n, "model.layers.%d.mlp.switch_mlp.gate_proj.weight", l);
        const uint8_t *g = data_of(fx, n);
        snprintf(n, sizeof n, "model.layers.%d.mlp.switch_mlp.down_proj.weight", l);
        const uint8_t *d = data_of(fx, n);
        nx_moe *moe = &w->layers[l].moe;
        for (int e = 0; e < NE; e++) {
            const nx_linear *G = &moe->experts[e].gate, *D = &moe->experts[e].down;
            assert_int_equal(nx_linear_row_bytes(G), H * 2);
            assert_ptr_equal(G->w, g + (size_t)e * ED * nx_linear_row_bytes(G));
            assert_ptr_equal(D->w, d + (size_t)e * H * nx_linear_row_bytes(D));
            assert_int_equal(G->out, ED);
            assert_int_equal(G->in, H);
        }
        snprintf(n, sizeof n, "model.layers.%d.mlp.router.expert_bias", l);
        assert_non_null(moe->expert_bias);
        float f;
        memcpy(&f, data_of(fx, n) + 4 * 3, 4);
        assert_true(moe->expert_bias[3] == f);
    }
    assert_true(w->has_mtp);
    assert_ptr_equal(w->mtp.eh_proj.w, data_of(fx, "mtp.eh_proj.weight"));
    assert_ptr_equal(w->mtp.layer.wq.w, data_of(fx, "mtp.layer.self_attn.q_proj.weight"));
    assert_ptr_equal(w->mtp.layer.moe.experts[1].gate.w,
                     data_of(fx, "mtp.layer.mlp.switch_mlp.gate_proj.weight") + (size_t)ED * H * 2);
}

static void test_mlx_quantized(void **state) {
    fixture *fx = *state;
    spec s = {.mlx = true, .bits = 4, .group = 32, .mtp = 1, .naming = MTP_MLX, .nextn = 1};
    build(fx->c, &s);
    assert_int_equal(load_into(fx, &s, NULL, true), NX_OK);
    nx_weights *w = &fx->w;
    assert_string_equal(w->layout, "mlx");
    assert_int_equal(w->embed.dtype, NX_DTYPE_U32);
    assert_int_equal(w->embed.bits, 4);
    assert_int_equal(w->embed.group, 32);
    assert_int_equal(w->embed.sdtype, NX_DTYPE_BF16);
    assert_ptr_equal(w->embed.scales, data_of(fx, "model.embed_tokens.scales"));
    assert_ptr_equal(w->embed.biases, data_of(fx, "model.embed_tokens.biases"));
    assert_int_equal(w->lm_head.bits, 4);
    nx_moe *moe = &w->layers[2].moe;
    assert_int_equal(moe->router.bits, 8);
    assert_int_equal(moe->router.group, 64);
    const uint8_t *g = data_of(fx, "model.layers.2.mlp.switch_mlp.gate_proj.weight");
    const uint8_t *gs = data_of(fx, "model.layers.2.mlp.switch_mlp.gate_proj.scales");
    const uint8_t *gb = data_of(fx, "model.layers.2.mlp.switch_mlp.gate_proj.biases");
    const uint8_t *d = data_of(fx, "model.layers.2.mlp.switch_mlp.down_proj.weight");
    const uint8_t *ds = data_of(fx, "model.layers.2.mlp.switch_mlp.down_proj.scales");
    for (int e = 0; e < NE; e++) {
        const nx_linear *G = &moe->experts[e].gate, *D = &moe->experts[e].down;
        assert_int_equal(G->bits, 4);
        assert_int_equal(G->group, 32);
        assert_int_equal(G->in, H);
        size_t wrow = H * 4 / 8, srow = (H / 32) * 2;
        assert_int_equal(nx_linear_row_bytes(G), wrow + 2 * srow);
        assert_ptr_equal(G->w, g + (size_t)e * ED * wrow);
        assert_ptr_equal(G->scales, gs + (size_t)e * ED * srow);
        assert_ptr_equal(G->biases, gb + (size_t)e * ED * srow);
        /* down: in = ED = 32, one group per row */
        assert_int_equal(D->in, ED);
        assert_ptr_equal(D->w, d + (size_t)e * H * (ED * 4 / 8));
        assert_ptr_equal(D->scales, ds + (size_t)e * H * 2);
    }
    assert_int_equal(w->mtp.layer.moe.router.bits, 8);
    assert_int_equal(w->mtp.eh_proj.bits, 4);
    assert_int_equal(w->mtp.eh_proj.in, 2 * H);
    assert_int_equal(w->layers[0].dense.down.bits, 4);
}

static void test_quant_cross_checks(void **state) {
    fixture *fx = *state;
    spec s = {.mlx = true, .bits = 4, .group = 32, .nextn = 0};
    build(fx->c, &s);
    /* one module written at 8 bits while the config says 4 */
    ck_remove(fx->c, "model.layers.2.self_attn.q_proj.weight");
    ck_remove(fx->c, "model.layers.2.self_attn.q_proj.scales");
    ck_remove(fx->c, "model.layers.2.self_attn.q_proj.biases");
    ck_linear(fx->c, 0, "model.layers.2.self_attn.q_proj", 0, NH * HD, H, 8, 32);
    expect_failure(fx, load_into(fx, &s, NULL, true), "model.layers.2.self_attn.q_proj.weight", "8-bit");
}

static void test_quant_bad_shapes(void **state) {
    fixture *fx = *state;
    spec s = {.mlx = true, .bits = 4, .group = 32};
    build(fx->c, &s);
    /* packed width that encodes no valid bit count: 7 words for 64 inputs */
    ck_remove(fx->c, "model.layers.1.self_attn.k_proj.weight");
    ck_add(fx->c, 0, "model.layers.1.self_attn.k_proj.weight", NX_DTYPE_U32, 2, (int64_t)NKV * HD, (int64_t)7);
    expect_failure(fx, load_into(fx, &s, NULL, true), "model.layers.1.self_attn.k_proj.weight", "packed");
}

static void test_quant_missing_biases(void **state) {
    fixture *fx = *state;
    spec s = {.mlx = true, .bits = 4, .group = 32};
    build(fx->c, &s);
    ck_remove(fx->c, "model.layers.1.mlp.switch_mlp.up_proj.biases");
    expect_failure(fx, load_into(fx, &s, NULL, true), "model.layers.1.mlp.switch_mlp.up_proj.biases", NULL);
}

static void test_quant_override_mismatch(void **state) {
    fixture *fx = *state;
    spec s = {.mlx = true, .bits = 4, .group = 32};
    build(fx->c, &s);
    /* the config says routers are 8-bit/64; write layer 1's at 4-bit/32 */
    ck_remove(fx->c, "model.layers.1.mlp.router.gate.weight");
    ck_remove(fx->c, "model.layers.1.mlp.router.gate.scales");
    ck_remove(fx->c, "model.layers.1.mlp.router.gate.biases");
    ck_linear(fx->c, 0, "model.layers.1.mlp.router.gate", 0, NE, H, 4, 32);
    expect_failure(fx, load_into(fx, &s, NULL, true), "model.layers.1.mlp.router.gate", "config says 8-bit");
}

static void test_sidecar(void **state) {
    fixture *fx = *state;
    /* MLX trunk + Tencent-named MTP in model-mtp.safetensors (the mtplx convention) */
    spec s = {.mlx = true, .bits = 4, .group = 32, .mtp = 2, .naming = MTP_TENCENT, .nextn = 1};
    build(fx->c, &s);
    assert_int_equal(load_into(fx, &s, NULL, true), NX_OK);
    assert_string_equal(fx->w.layout, "mlx");
    assert_true(fx->w.has_mtp);
    assert_string_equal(fx->w.mtp_where, "sidecar");
    /* the config's override for mtp.layer.mlp.router.gate applies to model.layers.3.mlp.router.gate */
    assert_int_equal(fx->w.mtp.layer.moe.router.bits, 8);
    assert_string_equal(nx_store_file_of(fx->st, nx_store_find(fx->st, "model.layers.3.eh_proj.weight")),
                        "model-mtp.safetensors");
}

static void test_sidecar_by_content(void **state) {
    fixture *fx = *state;
    /* a second shard holding nothing but MTP tensors also counts as a sidecar */
    spec s = {.mlx = true, .mtp = 2, .naming = MTP_MLX, .nextn = 1};
    build(fx->c, &s);
    assert_int_equal(load_into(fx, &s, "model-extra.safetensors", true), NX_OK);
    assert_string_equal(fx->w.mtp_where, "sidecar");
}

static void test_headless(void **state) {
    fixture *fx = *state;
    spec s = {.mlx = true, .mtp = 0, .nextn = 1};
    build(fx->c, &s);
    assert_int_equal(load_into(fx, &s, NULL, true), NX_OK);
    assert_false(fx->w.has_mtp);
    assert_string_equal(fx->w.mtp_where, "none");
    assert_int_equal(fx->cfg.n_nextn_layers, 1);
    assert_null(fx->w.mtp.enorm);
}

static void test_mtp_not_wanted(void **state) {
    fixture *fx = *state;
    spec s = {.mtp = 1, .naming = MTP_TENCENT, .nextn = 1};
    build(fx->c, &s);
    assert_int_equal(load_into(fx, &s, NULL, false), NX_OK);
    assert_false(fx->w.has_mtp);
    assert_string_equal(fx->w.mtp_where, "none");
}

static void test_mtp_expert_count(void **state) {
    fixture *fx = *state;
    spec s = {.mlx = true, .mtp = 1, .naming = MTP_MLX, .mtp_experts = 3, .nextn = 1};
    build(fx->c, &s);
    assert_int_equal(load_into(fx, &s, NULL, true), NX_OK);
    assert_int_equal(fx->w.layers[1].moe.n_experts, NE);
    assert_int_equal(fx->w.mtp.layer.moe.n_experts, 3);
    assert_int_equal(fx->w.mtp.layer.moe.router.out, 3);
    assert_ptr_equal(fx->w.mtp.layer.moe.experts[2].down.w,
                     data_of(fx, "mtp.layer.mlp.switch_mlp.down_proj.weight") + (size_t)2 * H * ED * 2);
}

static void test_mtp_fewer_experts_than_topk(void **state) {
    fixture *fx = *state;
    spec s = {.mlx = true, .mtp = 1, .naming = MTP_MLX, .mtp_experts = 1, .nextn = 1};
    build(fx->c, &s);
    expect_failure(fx, load_into(fx, &s, NULL, true), "mtp.layer.mlp.router.gate.weight", "num_experts_per_tok");
}

static void test_jang_naming(void **state) {
    fixture *fx = *state;
    spec s = {.mlx = true, .bits = 4, .group = 32, .mtp = 1, .naming = MTP_JANG, .nextn = 1};
    build(fx->c, &s);
    assert_int_equal(load_into(fx, &s, NULL, true), NX_OK);
    assert_true(fx->w.has_mtp);
    nx_moe *m = &fx->w.mtp.layer.moe;
    assert_non_null(m->expert_bias);
    assert_int_equal(m->router.bits, 8);
    assert_ptr_equal(m->router.w, data_of(fx, "mtp.0.block.mlp.gate.weight"));
    assert_ptr_equal(m->experts[0].gate.w, data_of(fx, "mtp.0.block.mlp.experts.gate_proj.weight"));
    float f;
    memcpy(&f, data_of(fx, "mtp.0.block.mlp.gate.e_score_correction_bias") + 4, 4);
    assert_true(m->expert_bias[1] == f);
}

static void test_partial_mtp(void **state) {
    fixture *fx = *state;
    spec s = {.mtp = 1, .naming = MTP_TENCENT, .nextn = 1};
    build(fx->c, &s);
    ck_remove(fx->c, "model.layers.3.eh_proj.weight");
    expect_failure(fx, load_into(fx, &s, NULL, true), "eh_proj.weight", NULL);
}

static void test_missing_mtp_expert(void **state) {
    fixture *fx = *state;
    spec s = {.mtp = 2, .naming = MTP_TENCENT, .nextn = 1};
    build(fx->c, &s);
    ck_remove(fx->c, "model.layers.3.mlp.experts.3.down_proj.weight");
    expect_failure(fx, load_into(fx, &s, NULL, true), "missing tensor model.layers.3.mlp.experts.3.down_proj.weight",
                   NULL);
}

static void test_missing_tensor(void **state) {
    fixture *fx = *state;
    spec s = {.mlx = true};
    build(fx->c, &s);
    ck_remove(fx->c, "model.layers.2.self_attn.k_proj.weight");
    expect_failure(fx, load_into(fx, &s, NULL, true), "model.layers.2.self_attn.k_proj.weight", NULL);
}

static void test_missing_lm_head(void **state) {
    fixture *fx = *state;
    spec s = {0};
    build(fx->c, &s);
    ck_remove(fx->c, "lm_head.weight");
    expect_failure(fx, load_into(fx, &s, NULL, true), "lm_head.weight", NULL);
}

static void test_wrong_shape(void **state) {
    fixture *fx = *state;
    spec s = {0};
    build(fx->c, &s);
    ck_remove(fx->c, "model.layers.1.self_attn.q_proj.weight");
    ck_add(fx->c, 0, "model.layers.1.self_attn.q_proj.weight", NX_DTYPE_BF16, 2, (int64_t)63, (int64_t)H);
    expect_failure(fx, load_into(fx, &s, NULL, true), "model.layers.1.self_attn.q_proj.weight",
                   "expected shape [64, 64], got [63, 64]");
}

static void test_wrong_norm_shape(void **state) {
    fixture *fx = *state;
    spec s = {0};
    build(fx->c, &s);
    ck_remove(fx->c, "model.layers.0.self_attn.k_norm.weight");
    ck_add(fx->c, 0, "model.layers.0.self_attn.k_norm.weight", NX_DTYPE_BF16, 2, (int64_t)1, (int64_t)HD);
    expect_failure(fx, load_into(fx, &s, NULL, true), "model.layers.0.self_attn.k_norm.weight", "[16]");
}

static void test_wrong_expert_count(void **state) {
    fixture *fx = *state;
    spec s = {0};
    build(fx->c, &s);
    ck_remove(fx->c, "model.layers.2.mlp.router.gate.weight");
    ck_add(fx->c, 0, "model.layers.2.mlp.router.gate.weight", NX_DTYPE_BF16, 2, (int64_t)5, (int64_t)H);
    expect_failure(fx, load_into(fx, &s, NULL, true), "model.layers.2.mlp.router.gate.weight", "[4, 64]");
}

static void test_bad_weight_dtype(void **state) {
    fixture *fx = *state;
    spec s = {0};
    build(fx->c, &s);
    ck_remove(fx->c, "model.layers.1.self_attn.v_proj.weight");
    ck_add(fx->c, 0, "model.layers.1.self_attn.v_proj.weight", NX_DTYPE_I32, 2, (int64_t)NKV * HD, (int64_t)H);
    expect_failure(fx, load_into(fx, &s, NULL, true), "model.layers.1.self_attn.v_proj.weight", "I32");
}

static void test_tied_and_f16_norm(void **state) {
    fixture *fx = *state;
    spec s = {.tie = true};
    build(fx->c, &s);
    ck_remove(fx->c, "model.norm.weight");
    nx_tensor *t = ck_add(fx->c, 0, "model.norm.weight", NX_DTYPE_F16, 1, (int64_t)H);
    uint16_t *h = (uint16_t *)t->data;
    static const uint16_t vals[] = {0x3c00, 0xc100, 0x3800, 0x0001, 0x7bff, 0x8000};
    static const float want[] = {1.0f, -2.5f, 0.5f, 5.9604645e-8f, 65504.0f, -0.0f};
    for (int i = 0; i < H; i++) h[i] = vals[i % 6];
    assert_int_equal(load_into(fx, &s, NULL, true), NX_OK);
    assert_ptr_equal(fx->w.lm_head.w, fx->w.embed.w);
    assert_null(nx_store_find(fx->st, "lm_head.weight"));
    for (int i = 0; i < H; i++) assert_true(fx->w.final_norm[i] == want[i % 6]);
    assert_false(fx->w.has_mtp);
}

static void test_free_safe(void **state) {
    (void)state;
    nx_weights_free(NULL);
    nx_weights w;
    memset(&w, 0, sizeof w);
    nx_weights_free(&w);
    nx_weights_free(&w);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_tencent_inline),     T(test_mlx_stacked),
        T(test_mlx_quantized),      T(test_quant_cross_checks),
        T(test_quant_bad_shapes),   T(test_quant_missing_biases),
        T(test_quant_override_mismatch), T(test_sidecar),
        T(test_sidecar_by_content), T(test_headless),
        T(test_mtp_not_wanted),     T(test_mtp_expert_count),
        T(test_mtp_fewer_experts_than_topk), T(test_jang_naming),
        T(test_partial_mtp),        T(test_missing_mtp_expert),
        T(test_missing_tensor),     T(test_missing_lm_head),
        T(test_wrong_shape),        T(test_wrong_norm_shape),
        T(test_wrong_expert_count), T(test_bad_weight_dtype),
        T(test_tied_and_f16_norm),  T(test_free_safe),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
