/* config.json tests: the real Hy3 config, every alias exporters use, defaults, the MLX
 * quantization block with overrides, and rejection of wrong types, missing fields and
 * impossible values with a message naming the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_builder.h"
#include "io/config.h"

/* The published Hy3 config.json (docs/design.md §2.1). */
static const char *hy3_config =
    "{\"architectures\":[\"HYV3ForCausalLM\"],\"model_type\":\"hy_v3\",\"vocab_size\":120832,"
    "\"hidden_size\":4096,\"num_hidden_layers\":80,\"num_attention_heads\":64,"
    "\"num_key_value_heads\":8,\"head_dim\":128,\"hidden_act\":\"silu\",\"intermediate_size\":13312,"
    "\"expert_hidden_dim\":1536,\"moe_intermediate_size\":1536,\"num_experts\":192,"
    "\"num_experts_per_tok\":8,\"num_shared_experts\":1,\"first_k_dense_replace\":1,"
    "\"moe_router_use_sigmoid\":true,\"moe_router_enable_expert_bias\":true,\"route_norm\":true,"
    "\"router_scaling_factor\":2.826,\"rms_norm_eps\":1e-05,"
    "\"rope_parameters\":{\"rope_theta\":11158840.0,\"rope_type\":\"default\"},"
    "\"max_position_embeddings\":262144,\"qk_norm\":true,\"tie_word_embeddings\":false,"
    "\"num_nextn_predict_layers\":1,\"enable_lm_head_fp32\":true,\"enable_moe_fp32_combine\":false,"
    "\"bos_token_id\":120000,\"pad_token_id\":120002,\"sep_token_id\":120007,\"eos_token_id\":120025,"
    "\"eod_token_id\":120026,\"torch_dtype\":\"bfloat16\"}";

static nx_status parse(const char *json, nx_config *c, nx_error *e) {
    memset(e, 0, sizeof *e);
    return nx_config_parse(json, strlen(json), "config.json", c, e);
}

/* The Hy3 config with top-level key remove_key dropped and the pairs `add` inserted first.
 * Duplicate keys are rejected, so replacing a value means removing the key and adding it. */
static char *with(const char *remove_key, const char *add) {
    char *s = malloc(strlen(hy3_config) + (add ? strlen(add) : 0) + 8);
    const char *src = hy3_config;
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", remove_key ? remove_key : "\x01");
    const char *k = remove_key ? strstr(src, pat) : NULL;
    size_t o = 0;
    s[o++] = '{';
    if (add && *add) {
        strcpy(s + o, add);
        o += strlen(add);
        s[o++] = ',';
    }
    const char *body = src + 1;
    if (k) {
        /* skip the value: up to the next ',' or '}' at nesting depth 0 */
        const char *v = k + strlen(pat);
        int depth = 0;
        while (*v && !(depth == 0 && (*v == ',' || *v == '}'))) {
            if (*v == '{' || *v == '[') depth++;
            if (*v == '}' || *v == ']') depth--;
            v++;
        }
        if (*v == ',') v++;
        memcpy(s + o, body, (size_t)(k - body));
        o += (size_t)(k - body);
        strcpy(s + o, v);
        o += strlen(v);
    } else {
        strcpy(s + o, body);
        o += strlen(body);
    }
    s[o] = 0;
    /* a removal at the end leaves ",}" */
    char *bad = strstr(s, ",}");
    if (bad) memmove(bad, bad + 1, strlen(bad + 1) + 1);
    return s;
}

static void expect_err(const char *remove_key, const char *add, nx_status want, const char *field) {
    char *j = with(remove_key, add);
    nx_config c;
    nx_error e;
    nx_status st = parse(j, &c, &e);
    if (st != want || (field && !strstr(e.msg, field))) {
        print_error("config (-%s +%s): status %d (want %d), message \"%s\" (want \"%s\")\n",
                    remove_key ? remove_key : "", add ? add : "", st, want, e.msg, field ? field : "");
        fail();
    }
    assert_int_equal(c.n_quant_overrides, 0); /* zeroed on failure */
    assert_null(c.quant_overrides);
    free(j);
}

/* GLM-4.5's config.json (docs/design.md §12; zai-org/GLM-4.5), with groups made non-trivial. */
static const char *glm_config =
    "{\"architectures\":[\"Glm4MoeForCausalLM\"],\"model_type\":\"glm4_moe\",\"attention_bias\":true,"
    "\"head_dim\":128,\"hidden_act\":\"silu\",\"hidden_size\":5120,\"partial_rotary_factor\":0.5,"
    "\"intermediate_size\":12288,\"max_position_embeddings\":131072,\"moe_intermediate_size\":1536,"
    "\"norm_topk_prob\":true,\"num_attention_heads\":96,\"n_group\":8,\"topk_group\":4,"
    "\"n_routed_experts\":160,\"n_shared_experts\":1,\"routed_scaling_factor\":2.5,"
    "\"num_experts_per_tok\":8,\"first_k_dense_replace\":3,\"num_hidden_layers\":92,"
    "\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,\"rope_scaling\":null,\"rope_theta\":1000000,"
    "\"num_nextn_predict_layers\":1,\"tie_word_embeddings\":false,\"use_qk_norm\":true,"
    "\"vocab_size\":151552,\"eos_token_id\":[151329,151336,151338]}";

/* glm4_moe: its own key names and defaults reach the generic fields; hy_v3 keeps its own. */
static void test_families(void **state) {
    (void)state;
    nx_config c;
    nx_error e;
    assert_int_equal(parse(glm_config, &c, &e), NX_OK);
    assert_string_equal(c.model_type, "glm4_moe");
    assert_ptr_equal(c.family, &nx_family_glm4_moe);
    assert_int_equal(c.n_experts, 160);
    assert_int_equal(c.expert_dim, 1536);
    assert_int_equal(c.first_k_dense, 3);
    assert_int_equal(c.rotary_dim, 64);
    assert_true(c.attn_bias && c.qk_norm && c.route_norm);
    assert_int_equal(c.n_group, 8);
    assert_int_equal(c.topk_group, 4);
    assert_true(fabsf(c.router_scaling - 2.5f) < 1e-6f);
    assert_true(c.rope_theta == 1e6);
    assert_true(c.mtp.recycle_prenorm && c.mtp.own_embed_head && !c.mtp.hidden_first);
    nx_config_free(&c);
    /* GLM defaults (transformers' Glm4MoeConfig): no qk-norm, half the head rotated, theta 1e4 */
    static const char *air =
        "{\"model_type\":\"glm4_moe\",\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4,\"head_dim\":16,\"intermediate_size\":96,\"moe_intermediate_size\":32,"
        "\"n_routed_experts\":8,\"num_experts_per_tok\":2}";
    assert_int_equal(parse(air, &c, &e), NX_OK);
    assert_true(!c.qk_norm && !c.attn_bias);
    assert_int_equal(c.rotary_dim, 8);
    assert_int_equal(c.n_group, 1);
    assert_int_equal(c.first_k_dense, 1);
    assert_true(c.rope_theta == 1e4);
    nx_config_free(&c);
    /* hy_v3: full rotary, no biases, qk-norm on by default, post-norm feedback */
    assert_int_equal(parse(hy3_config, &c, &e), NX_OK);
    assert_ptr_equal(c.family, &nx_family_hy_v3);
    assert_int_equal(c.rotary_dim, c.head_dim);
    assert_true(!c.attn_bias && c.qk_norm && !c.mtp.recycle_prenorm && !c.mtp.own_embed_head);
    nx_config_free(&c);
}

/* An unknown model_type or architectures entry names the supported families. */
static void test_unknown_family(void **state) {
    (void)state;
    nx_config c;
    nx_error e;
    char *j = with("model_type", "\"model_type\":\"qwen3_moe\"");
    assert_int_equal(parse(j, &c, &e), NX_E_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "qwen3_moe"));
    assert_non_null(strstr(e.msg, "hy_v3 (HYV3ForCausalLM)"));
    assert_non_null(strstr(e.msg, "glm4_moe (Glm4MoeForCausalLM)"));
    free(j);
    j = with("architectures", "\"architectures\":[\"LlamaForCausalLM\"]");
    assert_int_equal(parse(j, &c, &e), NX_E_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "LlamaForCausalLM"));
    assert_non_null(strstr(e.msg, "glm4_moe (Glm4MoeForCausalLM)"));
    free(j);
    j = with("architectures", "\"architectures\":[\"Glm4MoeForCausalLM\"]");
    assert_int_equal(parse(j, &c, &e), NX_E_CONFIG);
    assert_non_null(strstr(e.msg, "Glm4MoeForCausalLM"));
    free(j);
    /* impossible groups and rotary factors */
    expect_err("num_experts", "\"num_experts\":192,\"n_group\":5", NX_E_CONFIG, "n_group");
    expect_err(NULL, "\"n_group\":8,\"topk_group\":9", NX_E_CONFIG, "topk_group");
    expect_err(NULL, "\"n_group\":64,\"topk_group\":2", NX_E_CONFIG, "num_experts_per_tok");
    expect_err(NULL, "\"partial_rotary_factor\":0", NX_E_CONFIG, "partial_rotary_factor");
    expect_err(NULL, "\"partial_rotary_factor\":0.01", NX_E_CONFIG, "partial_rotary_factor");
}

static void test_hy3(void **state) {
    (void)state;
    nx_config c;
    nx_error e;
    assert_int_equal(parse(hy3_config, &c, &e), NX_OK);
    assert_string_equal(c.model_type, "hy_v3");
    assert_int_equal(c.vocab_size, 120832);
    assert_int_equal(c.hidden_size, 4096);
    assert_int_equal(c.n_layers, 80);
    assert_int_equal(c.n_heads, 64);
    assert_int_equal(c.n_kv_heads, 8);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.intermediate_size, 13312);
    assert_int_equal(c.expert_dim, 1536);
    assert_int_equal(c.n_experts, 192);
    assert_int_equal(c.top_k, 8);
    assert_int_equal(c.n_shared_experts, 1);
    assert_int_equal(c.first_k_dense, 1);
    assert_true(c.route_norm);
    assert_float_equal(c.router_scaling, 2.826f, 1e-6);
    assert_float_equal(c.rms_eps, 1e-5f, 1e-12);
    assert_float_equal(c.rope_theta, 11158840.0, 0);
    assert_int_equal(c.max_positions, 262144);
    assert_true(c.qk_norm);
    assert_false(c.tie_embeddings);
    assert_int_equal(c.n_nextn_layers, 1);
    assert_int_equal(c.bos_id, 120000);
    assert_int_equal(c.pad_id, 120002);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_ids[0], 120025);
    assert_int_equal(c.quant_bits, 0);
    int b, g;
    assert_false(nx_config_quant_for(&c, "lm_head", &b, &g));
    nx_config_free(&c);
    nx_config_free(&c); /* idempotent */
    nx_config_free(NULL);
}

static void test_aliases_and_defaults(void **state) {
    (void)state;
    static const char *minimal =
        "{\"model_type\":\"hy_v3\",\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":3,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":96,"
        "\"moe_intermediate_size\":32,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
        "\"rope_theta\":10000.0,\"eos_token_id\":[5,6,7],\"pad_token_id\":null,"
        "\"routed_scaling_factor\":2.5,\"norm_topk_prob\":false}";
    nx_config c;
    nx_error e;
    assert_int_equal(parse(minimal, &c, &e), NX_OK);
    assert_int_equal(c.expert_dim, 32);
    assert_int_equal(c.n_experts, 4);
    assert_int_equal(c.head_dim, 16); /* hidden / heads */
    assert_float_equal(c.rope_theta, 10000.0, 0);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_ids[2], 7);
    assert_int_equal(c.pad_id, -1);
    assert_int_equal(c.bos_id, -1);
    assert_float_equal(c.router_scaling, 2.5f, 0);
    assert_false(c.route_norm);
    /* defaults */
    assert_int_equal(c.first_k_dense, 1);
    assert_int_equal(c.n_shared_experts, 1);
    assert_true(c.qk_norm);
    assert_false(c.tie_embeddings);
    assert_int_equal(c.n_nextn_layers, 0);
    assert_float_equal(c.rms_eps, 1e-5f, 0);
    assert_int_equal(c.max_positions, 131072);
    nx_config_free(&c);

    /* router_scaling_factor absent: 1.0 (vLLM/SGLang); route_norm absent: true */
    char *j = with("router_scaling_factor", NULL);
    char *j2 = NULL;
    assert_int_equal(parse(j, &c, &e), NX_OK);
    assert_float_equal(c.router_scaling, 1.0f, 0);
    nx_config_free(&c);
    free(j);
    j = with("route_norm", NULL);
    assert_int_equal(parse(j, &c, &e), NX_OK);
    assert_true(c.route_norm);
    nx_config_free(&c);
    free(j);
    j = with("tie_word_embeddings", "\"tie_word_embeddings\":true");
    assert_int_equal(parse(j, &c, &e), NX_OK);
    assert_true(c.tie_embeddings);
    nx_config_free(&c);
    free(j);
    /* top-level rope_theta when rope_parameters lacks it */
    j = with("rope_parameters", "\"rope_theta\":500000.0,\"rope_parameters\":{\"rope_type\":\"default\"}");
    assert_int_equal(parse(j, &c, &e), NX_OK);
    assert_float_equal(c.rope_theta, 500000.0, 0);
    nx_config_free(&c);
    free(j);
    /* only one of the expert-width names */
    j = with("expert_hidden_dim", NULL);
    assert_int_equal(parse(j, &c, &e), NX_OK);
    assert_int_equal(c.expert_dim, 1536);
    nx_config_free(&c);
    j2 = with("moe_intermediate_size", NULL);
    assert_int_equal(parse(j2, &c, &e), NX_OK);
    assert_int_equal(c.expert_dim, 1536);
    nx_config_free(&c);
    free(j);
    free(j2);
    /* eos as a list, mlp_layer_types agreeing with first_k_dense_replace */
    j = with("eos_token_id", "\"eos_token_id\":[120025,120026]");
    assert_int_equal(parse(j, &c, &e), NX_OK);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_ids[1], 120026);
    nx_config_free(&c);
    free(j);
    /* head_dim null means "derive" */
    j = with("head_dim", "\"head_dim\":null");
    assert_int_equal(parse(j, &c, &e), NX_OK);
    assert_int_equal(c.head_dim, 64);
    nx_config_free(&c);
    free(j);
}

static void test_layer_types(void **state) {
    (void)state;
#define BASE                                                                                   \
    "{\"model_type\":\"hy_v3\",\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":3,"         \
    "\"num_attention_heads\":4,\"intermediate_size\":96,\"expert_hidden_dim\":32,\"num_experts\":4,"    \
    "\"num_experts_per_tok\":2,%s}"
    char j[1024];
    nx_config c;
    nx_error e;
    snprintf(j, sizeof j, BASE, "\"mlp_layer_types\":[\"dense\",\"dense\",\"sparse\"]");
    assert_int_equal(parse(j, &c, &e), NX_OK);
    assert_int_equal(c.first_k_dense, 2);
    nx_config_free(&c);
    snprintf(j, sizeof j, BASE, "\"mlp_layer_types\":[\"dense\",\"sparse\",\"sparse\"],\"first_k_dense_replace\":2");
    assert_int_equal(parse(j, &c, &e), NX_E_CONFIG);
    assert_non_null(strstr(e.msg, "mlp_layer_types"));
    snprintf(j, sizeof j, BASE, "\"mlp_layer_types\":[\"sparse\",\"dense\",\"sparse\"]");
    assert_int_equal(parse(j, &c, &e), NX_E_UNSUPPORTED);
    snprintf(j, sizeof j, BASE, "\"mlp_layer_types\":[\"dense\"]");
    assert_int_equal(parse(j, &c, &e), NX_E_CONFIG);
    /* all dense: no expert fields needed */
    snprintf(j, sizeof j,
             "{\"model_type\":\"hy_v3\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":2,"
             "\"num_attention_heads\":2,\"intermediate_size\":16,\"first_k_dense_replace\":2}");
    assert_int_equal(parse(j, &c, &e), NX_OK);
    assert_int_equal(c.n_experts, 0);
    nx_config_free(&c);
#undef BASE
}

static void test_wrong_types(void **state) {
    (void)state;
    expect_err("hidden_size", "\"hidden_size\":\"4096\"", NX_E_CONFIG, "hidden_size");
    expect_err("hidden_size", "\"hidden_size\":4096.0", NX_E_CONFIG, "hidden_size");
    expect_err("head_dim", "\"head_dim\":2048", NX_E_CONFIG, "head_dim 2048");
    expect_err("qk_norm", "\"qk_norm\":1", NX_E_CONFIG, "qk_norm");
    expect_err("route_norm", "\"route_norm\":\"yes\"", NX_E_CONFIG, "route_norm");
    expect_err("tie_word_embeddings", "\"tie_word_embeddings\":0", NX_E_CONFIG, "tie_word_embeddings");
    expect_err("eos_token_id", "\"eos_token_id\":\"</s>\"", NX_E_CONFIG, "eos_token_id");
    expect_err("eos_token_id", "\"eos_token_id\":[1,\"x\"]", NX_E_CONFIG, "eos_token_id");
    expect_err("eos_token_id", "\"eos_token_id\":[1,2,3,4,5,6,7,8,9]", NX_E_CONFIG, "eos_token_id");
    expect_err("bos_token_id", "\"bos_token_id\":[1]", NX_E_CONFIG, "bos_token_id");
    expect_err("rms_norm_eps", "\"rms_norm_eps\":\"1e-5\"", NX_E_CONFIG, "rms_norm_eps");
    expect_err("router_scaling_factor", "\"router_scaling_factor\":true", NX_E_CONFIG, "router_scaling_factor");
    expect_err("rope_parameters", "\"rope_parameters\":{\"rope_theta\":\"big\"}", NX_E_CONFIG,
               "rope_parameters.rope_theta");
    expect_err("rope_parameters", "\"rope_parameters\":5", NX_E_CONFIG, "rope_parameters");
    expect_err("model_type", "\"model_type\":3", NX_E_CONFIG, "model_type");
    expect_err("hidden_act", "\"hidden_act\":[\"silu\"]", NX_E_CONFIG, "hidden_act");
    expect_err("num_experts", "\"num_experts\":{}", NX_E_CONFIG, "num_experts");
    expect_err(NULL, "\"quantization\":[4]", NX_E_CONFIG, "quantization");
    expect_err(NULL, "\"quantization\":{\"bits\":\"4\",\"group_size\":64}", NX_E_CONFIG, "quantization.bits");
    expect_err(NULL, "\"quantization\":{\"bits\":4,\"group_size\":64,\"model.layers.1.mlp.router.gate\":"
                     "{\"bits\":\"8\"}}", NX_E_CONFIG, "model.layers.1.mlp.router.gate.bits");
    nx_config c;
    nx_error e;
    assert_int_equal(parse("[1,2]", &c, &e), NX_E_CONFIG);
    assert_int_equal(parse("{\"model_type\":", &c, &e), NX_E_CONFIG);
    assert_non_null(strstr(e.msg, "config.json"));
}

static void test_missing_fields(void **state) {
    (void)state;
    static const char *required[] = {"model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                                     "num_attention_heads", "intermediate_size", "num_experts",
                                     "num_experts_per_tok"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++)
        expect_err(required[i], NULL, NX_E_CONFIG, required[i]);
    /* both expert-width aliases gone */
    char *j = with("expert_hidden_dim", NULL);
    char *k = strstr(j, "\"moe_intermediate_size\":1536,");
    memmove(k, k + strlen("\"moe_intermediate_size\":1536,"), strlen(k) - strlen("\"moe_intermediate_size\":1536,") + 1);
    nx_config c;
    nx_error e;
    assert_int_equal(parse(j, &c, &e), NX_E_CONFIG);
    assert_non_null(strstr(e.msg, "expert_hidden_dim"));
    free(j);
}

static void test_bad_values(void **state) {
    (void)state;
    expect_err("model_type", "\"model_type\":\"llama\"", NX_E_UNSUPPORTED, "llama");
    expect_err("hidden_act", "\"hidden_act\":\"gelu\"", NX_E_UNSUPPORTED, "gelu");
    expect_err("hidden_size", "\"hidden_size\":0", NX_E_CONFIG, "hidden_size");
    expect_err("hidden_size", "\"hidden_size\":-4096", NX_E_CONFIG, "hidden_size");
    expect_err("vocab_size", "\"vocab_size\":4294967296", NX_E_CONFIG, "vocab_size");
    expect_err("num_key_value_heads", "\"num_key_value_heads\":7", NX_E_CONFIG, "num_key_value_heads");
    expect_err("num_experts_per_tok", "\"num_experts_per_tok\":193", NX_E_CONFIG, "num_experts_per_tok");
    expect_err("first_k_dense_replace", "\"first_k_dense_replace\":81", NX_E_CONFIG, "first_k_dense_replace");
    expect_err("first_k_dense_replace", "\"first_k_dense_replace\":-1", NX_E_CONFIG, "first_k_dense_replace");
    expect_err("expert_hidden_dim", "\"expert_hidden_dim\":2048", NX_E_CONFIG, "moe_intermediate_size");
    expect_err("rms_norm_eps", "\"rms_norm_eps\":0", NX_E_CONFIG, "rms_norm_eps");
    expect_err("rms_norm_eps", "\"rms_norm_eps\":1e-85", NX_E_CONFIG, "rms_norm_eps"); /* 0 as a float */
    expect_err("router_scaling_factor", "\"router_scaling_factor\":-1", NX_E_CONFIG, "router_scaling_factor");
    expect_err("rope_parameters", "\"rope_parameters\":{\"rope_theta\":-5.0}", NX_E_CONFIG, "rope_theta");
    expect_err("rope_parameters", "\"rope_parameters\":{\"rope_theta\":1e6,\"rope_type\":\"yarn\"}",
               NX_E_CONFIG, "rope_parameters.factor");
    expect_err("rope_parameters", "\"rope_parameters\":{\"rope_theta\":1e6,\"rope_type\":\"longrope\"}",
               NX_E_UNSUPPORTED, "longrope");
    expect_err(NULL, "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":0.5}", NX_E_CONFIG, "rope_scaling.factor");
    expect_err(NULL, "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4,\"beta_fast\":\"x\"}", NX_E_CONFIG,
               "rope_scaling.beta_fast");
    expect_err(NULL, "\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}", NX_E_UNSUPPORTED, "linear");
    expect_err("head_dim", "\"head_dim\":0", NX_E_CONFIG, "head_dim");
    expect_err("head_dim", "\"head_dim\":2147483647", NX_E_CONFIG, "head_dim 2147483647");
    expect_err("num_attention_heads", "\"num_attention_heads\":16777216", NX_E_CONFIG, "overflow");
}

/* DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3; docs/design.md §12.3), cut to its attention,
 * routing and RoPE keys. */
static const char *dsv3_config =
    "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"model_type\":\"deepseek_v3\",\"vocab_size\":129280,"
    "\"hidden_size\":7168,\"intermediate_size\":18432,\"moe_intermediate_size\":2048,\"num_hidden_layers\":61,"
    "\"num_nextn_predict_layers\":1,\"num_attention_heads\":128,\"num_key_value_heads\":128,"
    "\"n_shared_experts\":1,\"n_routed_experts\":256,\"routed_scaling_factor\":2.5,\"kv_lora_rank\":512,"
    "\"q_lora_rank\":1536,\"qk_rope_head_dim\":64,\"v_head_dim\":128,\"qk_nope_head_dim\":128,"
    "\"topk_method\":\"noaux_tc\",\"n_group\":8,\"topk_group\":4,\"num_experts_per_tok\":8,"
    "\"moe_layer_freq\":1,\"first_k_dense_replace\":3,\"norm_topk_prob\":true,\"scoring_func\":\"sigmoid\","
    "\"hidden_act\":\"silu\",\"max_position_embeddings\":163840,\"rms_norm_eps\":1e-06,\"rope_theta\":10000,"
    "\"rope_scaling\":{\"beta_fast\":32,\"beta_slow\":1,\"factor\":40,\"mscale\":1.0,\"mscale_all_dim\":1.0,"
    "\"original_max_position_embeddings\":4096,\"type\":\"yarn\"},\"attention_bias\":false,"
    "\"tie_word_embeddings\":false}";

/* The DeepSeek config with key k's value replaced by v (v NULL: k removed). */
static nx_status parse_dsv3(const char *k, const char *v, nx_config *c, nx_error *e) {
    char pat[64], *j = malloc(strlen(dsv3_config) + 64);
    snprintf(pat, sizeof pat, "\"%s\":", k);
    const char *at = strstr(dsv3_config, pat), *end = at + strlen(pat);
    for (int depth = 0; depth > 0 || (*end != ',' && *end != '}'); end++) depth += (*end == '{') - (*end == '}');
    if (*end == ',' && !v) end++;
    sprintf(j, "%.*s%s%s%s", (int)(at - dsv3_config), dsv3_config, v ? pat : "", v ? v : "", end);
    nx_status st = parse(j, c, e);
    free(j);
    return st;
}


/* Qwen3.6-35B-A3B's config.json (a vision-language wrapper; docs/design.md §12.4), its text_config
 * cut to the keys the engine reads. */
static const char *q36_config =
    "{\"architectures\":[\"Qwen3_5MoeForConditionalGeneration\"],\"model_type\":\"qwen3_5_moe\","
    "\"tie_word_embeddings\":false,\"vision_config\":{\"depth\":27,\"hidden_size\":1152},"
    "\"text_config\":{\"model_type\":\"qwen3_5_moe_text\",\"attn_output_gate\":true,\"eos_token_id\":248046,"
    "\"full_attention_interval\":4,\"head_dim\":256,\"hidden_act\":\"silu\",\"hidden_size\":2048,"
    "\"linear_conv_kernel_dim\":4,\"linear_key_head_dim\":128,\"linear_num_key_heads\":16,"
    "\"linear_num_value_heads\":32,\"linear_value_head_dim\":128,\"max_position_embeddings\":262144,"
    "\"moe_intermediate_size\":512,\"mtp_num_hidden_layers\":1,\"mtp_use_dedicated_embeddings\":false,"
    "\"num_attention_heads\":16,\"num_experts\":256,\"num_experts_per_tok\":8,\"num_hidden_layers\":40,"
    "\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,\"shared_expert_intermediate_size\":512,"
    "\"vocab_size\":248320,\"rope_parameters\":{\"mrope_interleaved\":true,\"mrope_section\":[11,11,10],"
    "\"rope_type\":\"default\",\"rope_theta\":10000000,\"partial_rotary_factor\":0.25}}}";

/* The Qwen3.6 config with the pairs of the JSON object `text` set in text_config and those of
 * `top` in the wrapper (null values remove the key). */
static nx_status parse_q36(const char *text, const char *top, nx_config *c, nx_error *e) {
    json_t *root = json_loads(q36_config, 0, NULL);
    const char *srcs[2] = {text, top};
    json_t *dsts[2] = {json_object_get(root, "text_config"), root};
    for (int i = 0; i < 2; i++) {
        json_t *o = srcs[i] ? json_loads(srcs[i], 0, NULL) : NULL;
        const char *k;
        json_t *v;
        json_object_foreach(o, k, v) {
            if (json_is_null(v)) json_object_del(dsts[i], k);
            else json_object_set(dsts[i], k, v);
        }
        json_decref(o);
    }
    char *j = json_dumps(root, 0);
    const nx_status st = parse(j, c, e);
    free(j);
    json_decref(root);
    return st;
}

/* Gated-DeltaNet hybrids: the wrapper's text_config read with the wrapper's keys on top, the layer
 * kinds, DeltaNet shapes, rotary dims from rope_parameters, gated attention, the shared expert and
 * softmax router; Qwen3-Next's flat keys; what the engine does not implement is named. */
static void test_hybrid(void **state) {
    (void)state;
    nx_config c;
    nx_error e;
    assert_int_equal(parse_q36(NULL, "{\"quantization\":{\"group_size\":64,\"bits\":4}}", &c, &e), NX_OK);
    assert_ptr_equal(c.family, &nx_family_qwen3_5_moe);
    assert_int_equal(c.n_layers, 40);
    assert_int_equal(c.n_linear, 30);
    for (int l = 0; l < 40; l++) assert_int_equal(c.linear[l], (l + 1) % 4 != 0);
    assert_true(c.dn.n_k_heads == 16 && c.dn.n_v_heads == 32 && c.dn.k_dim == 128 && c.dn.v_dim == 128);
    assert_int_equal(c.dn.conv_k, 4);
    assert_int_equal(c.rotary_dim, 64);
    assert_true(c.attn_gate && c.qk_norm && c.route_norm);
    assert_int_equal(c.router, NX_ROUTER_SOFTMAX);
    assert_int_equal(c.shared_dim, 512);
    assert_int_equal(c.first_k_dense, 0);
    assert_int_equal(c.n_nextn_layers, 1);
    assert_int_equal(c.quant_bits, 4); /* the wrapper's block */
    assert_true(c.rope_theta == 1e7 && c.n_eos == 1 && c.eos_ids[0] == 248046);
    nx_config_free(&c);
    /* layer_types decides over the interval; the wrapper's keys win */
    assert_int_equal(parse_q36("{\"num_hidden_layers\":3,\"layer_types\":[\"full_attention\",\"linear_attention\","
                               "\"full_attention\"],\"partial_rotary_factor\":0.5}", "{\"eos_token_id\":7}", &c, &e),
                     NX_OK);
    assert_true(c.n_linear == 1 && !c.linear[0] && c.linear[1] && !c.linear[2]);
    assert_true(c.rotary_dim == 128 && c.eos_ids[0] == 7);
    nx_config_free(&c);
    static const struct {
        const char *text, *msg;
        nx_status st;
    } bad[] = {
        {"{\"layer_types\":[\"linear_attention\"]}", "layer_types", NX_E_CONFIG},
        {"{\"layer_types\":[\"sliding_attention\",\"x\",\"x\",\"x\"],\"num_hidden_layers\":4}", "layer_types", NX_E_CONFIG},
        {"{\"linear_num_value_heads\":24,\"linear_num_key_heads\":7}", "linear_num_value_heads", NX_E_CONFIG},
        {"{\"linear_key_head_dim\":null}", "linear_key_head_dim", NX_E_CONFIG},
        {"{\"linear_value_head_dim\":4096}", "linear_value_head_dim", NX_E_CONFIG},
        {"{\"linear_conv_kernel_dim\":1}", "linear_conv_kernel_dim", NX_E_CONFIG},
        {"{\"mtp_use_dedicated_embeddings\":true}", "mtp_use_dedicated_embeddings", NX_E_UNSUPPORTED},
        {"{\"mlp_only_layers\":[0]}", "mlp_only_layers", NX_E_UNSUPPORTED},
        {"{\"shared_expert_intermediate_size\":0}", "shared_expert_intermediate_size", NX_E_CONFIG},
        {"{\"rope_parameters\":{\"rope_type\":\"default\",\"partial_rotary_factor\":0.005}}", "rotated dims",
         NX_E_CONFIG},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const nx_status st = parse_q36(bad[i].text, NULL, &c, &e);
        if (st != bad[i].st || !strstr(e.msg, bad[i].msg))
            fail_msg("hybrid config %s: status %d, message \"%s\" (want %d, \"%s\")", bad[i].text, st, e.msg,
                     bad[i].st, bad[i].msg);
        assert_null(c.linear); /* zeroed on failure */
    }
    assert_int_equal(parse_q36(NULL, "{\"text_config\":7}", &c, &e), NX_E_CONFIG);
    assert_non_null(strstr(e.msg, "text_config"));
}

/* Latent attention: its shapes, the one-row cache, YaRN's parameters and the softmax scale with
 * mscale²; q_lora_rank null means a plain q_proj; what the engine does not implement is named. */
static void test_mla(void **state) {
    (void)state;
    nx_config c;
    nx_error e;
    assert_int_equal(parse(dsv3_config, &c, &e), NX_OK);
    assert_ptr_equal(c.family, &nx_family_deepseek_v3);
    assert_int_equal(c.attention, NX_ATTN_MLA);
    assert_int_equal(c.mla.q_lora_rank, 1536);
    assert_int_equal(c.mla.kv_lora_rank, 512);
    assert_int_equal(c.head_dim, 192);
    assert_int_equal(c.rotary_dim, 64);
    assert_int_equal(c.rope_pairs, NX_ROPE_INTERLEAVED);
    assert_int_equal(c.cache_heads, 1);
    assert_int_equal(c.cache_k, 576);
    assert_int_equal(c.cache_v, 0);
    assert_int_equal(c.n_group, 8);
    assert_int_equal(c.topk_group, 4);
    assert_true(c.yarn.factor == 40 && c.yarn.orig_max_pos == 4096 && c.yarn.truncate);
    assert_true(fabs(c.yarn.attn_factor - 1.0) < 1e-12); /* mscale = mscale_all_dim */
    const double m = 0.1 * log(40.0) + 1.0;
    assert_true(fabsf(c.mla.scale - (float)(m * m / sqrt(192.0))) < 1e-7f);
    nx_config_free(&c);
    assert_int_equal(parse_dsv3("q_lora_rank", "null", &c, &e), NX_OK);
    assert_int_equal(c.mla.q_lora_rank, 0);
    nx_config_free(&c);
    assert_int_equal(parse_dsv3("q_lora_rank", NULL, &c, &e), NX_OK); /* transformers' default */
    assert_int_equal(c.mla.q_lora_rank, 1536);
    nx_config_free(&c);
    assert_int_equal(parse_dsv3("rope_scaling", "null", &c, &e), NX_OK);
    assert_true(c.yarn.factor == 0);
    assert_true(fabsf(c.mla.scale - (float)(1.0 / sqrt(192.0))) < 1e-7f);
    nx_config_free(&c);
    /* no mscale keys: YaRN's attention factor is 0.1 ln(factor) + 1 */
    assert_int_equal(parse_dsv3("rope_scaling", "{\"type\":\"yarn\",\"factor\":4}", &c, &e), NX_OK);
    assert_true(fabs(c.yarn.attn_factor - (0.1 * log(4.0) + 1.0)) < 1e-12 && c.yarn.orig_max_pos == 163840);
    nx_config_free(&c);
    static const struct {
        const char *key, *value, *msg;
        nx_status st;
    } bad[] = {
        {"kv_lora_rank", NULL, "kv_lora_rank", NX_E_CONFIG},
        {"qk_rope_head_dim", "63", "qk_rope_head_dim", NX_E_CONFIG},
        {"kv_lora_rank", "1000", "kv_lora_rank", NX_E_CONFIG},
        {"scoring_func", "\"softmax\"", "scoring_func", NX_E_UNSUPPORTED},
        {"topk_method", "\"greedy\"", "topk_method", NX_E_UNSUPPORTED},
        {"moe_layer_freq", "2", "moe_layer_freq", NX_E_UNSUPPORTED},
        {"attention_bias", "true", "attention_bias", NX_E_UNSUPPORTED},
        {"rope_scaling", "{\"type\":\"yarn\",\"factor\":40,\"truncate\":3}", "rope_scaling.truncate", NX_E_CONFIG},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const nx_status st = parse_dsv3(bad[i].key, bad[i].value, &c, &e);
        if (st != bad[i].st || !strstr(e.msg, bad[i].msg)) {
            print_error("%s=%s: status %d (want %d), \"%s\"\n", bad[i].key, bad[i].value ? bad[i].value : "(none)", st,
                        bad[i].st, e.msg);
            fail();
        }
    }
}

static void test_quantization(void **state) {
    (void)state;
    char *j = with(NULL,
                   "\"quantization\":{\"group_size\":64,\"bits\":4,\"mode\":\"affine\","
                   "\"model.layers.1.mlp.router.gate\":{\"group_size\":64,\"bits\":8},"
                   "\"lm_head\":false,\"mtp.layer.mlp.router.gate\":{\"bits\":6},\"model.embed_tokens\":true},"
                   "\"quantization_config\":{\"group_size\":64,\"bits\":4}");
    nx_config c;
    nx_error e;
    assert_int_equal(parse(j, &c, &e), NX_OK);
    assert_int_equal(c.quant_bits, 4);
    assert_int_equal(c.quant_group, 64);
    assert_int_equal(c.n_quant_overrides, 4);
    int b, g;
    assert_true(nx_config_quant_for(&c, "model.layers.1.mlp.router.gate", &b, &g));
    assert_int_equal(b, 8);
    assert_int_equal(g, 64);
    assert_true(nx_config_quant_for(&c, "lm_head", &b, &g));
    assert_int_equal(b, 0);
    assert_true(nx_config_quant_for(&c, "mtp.layer.mlp.router.gate", &b, &g));
    assert_int_equal(b, 6);
    assert_int_equal(g, 64); /* inherits the global group */
    assert_true(nx_config_quant_for(&c, "model.embed_tokens", &b, &g));
    assert_int_equal(b, 4);
    assert_true(nx_config_quant_for(&c, "model.layers.9.self_attn.q_proj", &b, &g));
    assert_int_equal(b, 4);
    assert_int_equal(g, 64);
    nx_config_free(&c);
    assert_null(c.quant_overrides);
    free(j);

    /* quantization_config alone; mode absent means affine */
    j = with(NULL, "\"quantization_config\":{\"group_size\":32,\"bits\":3}");
    assert_int_equal(parse(j, &c, &e), NX_OK);
    assert_int_equal(c.quant_bits, 3);
    assert_int_equal(c.quant_group, 32);
    nx_config_free(&c);
    free(j);

    expect_err(NULL, "\"quantization\":{\"group_size\":32,\"bits\":4,\"mode\":\"mxfp4\"}", NX_E_UNSUPPORTED,
               "mxfp4");
    expect_err(NULL, "\"quantization\":{\"group_size\":64,\"bits\":7}", NX_E_CONFIG, "bits");
    expect_err(NULL, "\"quantization\":{\"group_size\":16,\"bits\":4}", NX_E_CONFIG, "group_size");
    expect_err(NULL, "\"quantization\":{\"group_size\":64}", NX_E_CONFIG, "bits");
    expect_err(NULL, "\"quantization\":{\"bits\":4}", NX_E_CONFIG, "group_size");
    expect_err(NULL, "\"quantization\":{\"group_size\":64,\"bits\":4,\"a.b\":{\"bits\":1}}", NX_E_CONFIG, "a.b");
    expect_err(NULL, "\"quantization\":{\"group_size\":64,\"bits\":4,\"a.b\":{\"mode\":\"nvfp4\"}}",
               NX_E_UNSUPPORTED, "nvfp4");
    expect_err(NULL, "\"quantization_config\":{\"quant_method\":\"fp8\",\"activation_scheme\":\"static\"}",
               NX_E_UNSUPPORTED, "fp8");
}

static void test_load_file(void **state) {
    (void)state;
    char *dir = tmpdir_new();
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", dir);
    nx_config c;
    nx_error e;
    assert_int_equal(nx_config_load(p, &c, &e), NX_E_IO);
    assert_non_null(strstr(e.msg, "config.json"));
    write_text(dir, "config.json", hy3_config);
    assert_int_equal(nx_config_load(p, &c, &e), NX_OK);
    assert_int_equal(c.n_experts, 192);
    nx_config_free(&c);
    write_text(dir, "config.json", "{\"model_type\": \"hy_v3\",}");
    assert_int_equal(nx_config_load(p, &c, &e), NX_E_CONFIG);
    assert_non_null(strstr(e.msg, "config.json"));
    tmpdir_free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hy3),           cmocka_unit_test(test_aliases_and_defaults),
        cmocka_unit_test(test_families),      cmocka_unit_test(test_unknown_family),
        cmocka_unit_test(test_layer_types),   cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_missing_fields), cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_quantization),  cmocka_unit_test(test_load_file), cmocka_unit_test(test_mla),
        cmocka_unit_test(test_hybrid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
