/* Loading and running hardening on copies of the default model (models/nextn-hy3-tiny, run from
 * the repository root as `make test` does): FIFOs where files are expected (an error, not a
 * hang), NaN weights found at load and naming the tensor, non-finite logits failing a generation
 * instead of emitting token 0, a checkpoint overwritten in place refused before the forward pass
 * (one replaced by rename is fine), malformed tokenizer files at load, and a cleared prompt
 * cache. Every test runs under alarm(): a blocking open() kills it instead of hanging. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nextn.h"

#define MODEL "models/nextn-hy3-tiny"
static const char *const files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                    "tokenizer_config.json"};
enum { N_FILES = sizeof files / sizeof files[0] };

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    assert_non_null(a);
    assert_non_null(b);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) assert_int_equal(fwrite(buf, 1, n, b), n);
    fclose(a);
    assert_int_equal(fclose(b), 0);
}

/* A fresh copy of the default model in a new temporary directory (into dir). */
static void copy_model(char *dir, size_t n) {
    snprintf(dir, n, "/tmp/nextn-validate-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char a[512], b[512];
    for (int i = 0; i < N_FILES; i++) {
        snprintf(a, sizeof a, "%s/%s", MODEL, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        copy_file(a, b);
    }
}

static void remove_dir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void path_in(char *out, size_t n, const char *dir, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static nx_status load(const char *dir, nx_model **m, nx_error *err) {
    nx_load_params p;
    nx_load_params_default(&p);
    p.n_threads = 2;
    return nx_model_load(dir, &p, m, err);
}

static void expect_load_error(const char *dir, nx_status code, const char *what) {
    nx_model *m = (nx_model *)1;
    nx_error err = {0};
    const nx_status st = load(dir, &m, &err);
    if (st != code || !strstr(err.msg, what)) fprintf(stderr, "want %d '%s', got %d: %s\n", code, what, st, err.msg);
    assert_int_equal(st, code);
    assert_null(m);
    assert_non_null(strstr(err.msg, what));
}

/* ---------------------------------------------------------------- FIFOs */

static void test_fifos(void **state) {
    (void)state;
    alarm(120);
    char dir[64], p[512];
    copy_model(dir, sizeof dir);
    for (int i = 0; i < N_FILES; i++) {
        path_in(p, sizeof p, dir, files[i]);
        char keep[520];
        snprintf(keep, sizeof keep, "%s.keep", p);
        assert_int_equal(rename(p, keep), 0);
        assert_int_equal(mkfifo(p, 0600), 0);
        if (strcmp(files[i], "generation_config.json") == 0) { /* optional: skipped, without waiting */
            nx_model *m = NULL;
            nx_error err = {0};
            assert_int_equal(load(dir, &m, &err), NX_OK);
            nx_model_free(m);
        } else {
            char want[600];
            snprintf(want, sizeof want, "%s: not a regular file (a FIFO)", p);
            expect_load_error(dir, NX_E_IO, want);
        }
        assert_int_equal(unlink(p), 0);
        assert_int_equal(rename(keep, p), 0);
    }
    /* a state file (--prompt-cache, slot restore) */
    nx_model *m = NULL;
    assert_int_equal(load(dir, &m, NULL), NX_OK);
    nx_ctx *c = NULL;
    assert_int_equal(nx_ctx_new(m, 64, &c, NULL), NX_OK);
    path_in(p, sizeof p, dir, "slot.state");
    assert_int_equal(mkfifo(p, 0600), 0);
    nx_error err = {0};
    assert_int_equal(nx_state_load(c, p, NULL, NULL, &err), NX_E_IO);
    assert_non_null(strstr(err.msg, "not a regular file (a FIFO)"));
    nx_ctx_free(c);
    nx_model_free(m);
    remove_dir(dir);
    alarm(0);
}

/* ---------------------------------------------------------------- NaN weights */

/* Writes a NaN over element i of tensor name in dir's model.safetensors (in place). */
static void poison(const char *dir, const char *name, size_t i) {
    char p[512];
    path_in(p, sizeof p, dir, "model.safetensors");
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    uint8_t len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    uint64_t hlen = 0;
    for (int k = 0; k < 8; k++) hlen |= (uint64_t)len8[k] << (8 * k);
    char *h = malloc(hlen);
    assert_int_equal(fread(h, 1, hlen, f), hlen);
    json_t *root = json_loadb(h, hlen, 0, NULL), *t = json_object_get(root, name);
    assert_non_null(t);
    const char *dt = json_string_value(json_object_get(t, "dtype"));
    const long long begin = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
    const bool f32 = strcmp(dt, "F32") == 0;
    static const uint8_t nan32[4] = {0x00, 0x00, 0xc0, 0x7f}, nan16[2] = {0xc0, 0x7f}; /* little-endian */
    assert_int_equal(fseek(f, (long)(8 + hlen + (uint64_t)begin + i * (f32 ? 4 : 2)), SEEK_SET), 0);
    assert_int_equal(fwrite(f32 ? nan32 : nan16, 1, f32 ? 4 : 2, f), f32 ? 4 : 2);
    assert_int_equal(fclose(f), 0);
    json_decref(root);
    free(h);
}

static void test_nan_weights(void **state) {
    (void)state;
    alarm(120);
    static const struct {
        const char *tensor;
        size_t at;
    } cases[] = {
        {"model.norm.weight", 3},
        {"model.layers.0.input_layernorm.weight", 0},
        {"model.layers.2.post_attention_layernorm.weight", 255},
        {"model.layers.1.self_attn.q_norm.weight", 5},
        {"model.layers.1.mlp.router.gate.weight", 8 * 256 - 1},
        {"model.layers.3.mlp.expert_bias", 7},
        {"model.layers.4.enorm.weight", 1},
        {"model.layers.4.mlp.router.gate.weight", 100},
        {"model.embed_tokens.weight", 4095 * 256 + 17}, /* the last row: inside the full scan */
        {"lm_head.weight", 256 * 9},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char dir[64];
        copy_model(dir, sizeof dir);
        poison(dir, cases[k].tensor, cases[k].at);
        char want[200];
        snprintf(want, sizeof want, "tensor %s: non-finite value", cases[k].tensor);
        expect_load_error(dir, NX_E_FORMAT, want);
        remove_dir(dir);
    }
    alarm(0);
}

/* ---------------------------------------------------------------- non-finite logits */

typedef struct {
    int calls;
} counter;

static int count_token(void *user, int32_t id, const float *probs) {
    (void)id, (void)probs;
    ((counter *)user)->calls++;
    return 0;
}

static nx_status generate(nx_model *m, int draft, counter *n, nx_error *err) {
    nx_ctx *c = NULL;
    assert_int_equal(nx_ctx_new(m, 128, &c, NULL), NX_OK);
    const int32_t prompt[] = {4072, 10, 20, 30, 40, 50};
    nx_gen_params p;
    nx_gen_params_default(&p);
    p.sampling.temperature = 0.0f;
    p.max_tokens = 8;
    p.draft = draft;
    const nx_status s = nx_generate(c, prompt, 6, &p, count_token, n, NULL, err);
    nx_ctx_free(c);
    return s;
}

static void test_nonfinite_logits(void **state) {
    (void)state;
    alarm(120);
    char dir[64];
    copy_model(dir, sizeof dir);
    /* an attention output row is not scanned at load: its NaN reaches every logit */
    poison(dir, "model.layers.0.self_attn.o_proj.weight", 3 * 256 + 4);
    nx_model *m = NULL;
    nx_error err = {0};
    assert_int_equal(load(dir, &m, &err), NX_OK);
    for (int draft = 0; draft <= 2; draft += 2) {
        counter n = {0};
        assert_int_equal(generate(m, draft, &n, &err), NX_E_STATE);
        assert_non_null(strstr(err.msg, "trunk logits: NaN"));
        assert_int_equal(n.calls, 0); /* no token came out of them */
    }
    nx_model_free(m);
    remove_dir(dir);
    alarm(0);
}

/* ---------------------------------------------------------------- model files changed */

static void test_file_changed(void **state) {
    (void)state;
    alarm(120);
    char dir[64], p[512], fresh[520];
    copy_model(dir, sizeof dir);
    path_in(p, sizeof p, dir, "model.safetensors");
    snprintf(fresh, sizeof fresh, "%s.new", p);
    nx_model *m = NULL;
    nx_error err = {0};
    assert_int_equal(load(dir, &m, &err), NX_OK);
    counter n = {0};
    assert_int_equal(generate(m, 0, &n, &err), NX_OK);
    assert_int_equal(n.calls, 8);

    /* replaced by rename: the mapping keeps the old inode, generation goes on */
    copy_file(MODEL "/model.safetensors", fresh);
    assert_int_equal(rename(fresh, p), 0);
    assert_int_equal(nx_model_check_files(m, &err), NX_OK);
    n.calls = 0;
    assert_int_equal(generate(m, 0, &n, &err), NX_OK);
    nx_model_free(m);

    /* truncated in place: refused before the forward pass touches the lost pages (SIGBUS) */
    assert_int_equal(load(dir, &m, &err), NX_OK);
    assert_int_equal(truncate(p, 4096), 0);
    n.calls = 0;
    assert_int_equal(generate(m, 0, &n, &err), NX_E_IO);
    assert_int_equal(n.calls, 0);
    assert_non_null(strstr(err.msg, "model.safetensors changed on disk since load"));
    assert_non_null(strstr(err.msg, "replace checkpoints by rename"));
    nx_model_free(m);

    /* overwritten in place with the same size: refused too (the mapping now shows other bytes) */
    copy_file(MODEL "/model.safetensors", p);
    assert_int_equal(load(dir, &m, &err), NX_OK);
    sleep(1); /* a file system with coarse timestamps still sees a new modification time */
    copy_file(MODEL "/model.safetensors", p);
    assert_int_equal(generate(m, 0, &n, &err), NX_E_IO);
    assert_non_null(strstr(err.msg, "changed on disk"));
    nx_model_free(m);
    remove_dir(dir);
    alarm(0);
}

/* ---------------------------------------------------------------- tokenizer files */

static void write_text(const char *dir, const char *name, const char *text) {
    char p[512];
    path_in(p, sizeof p, dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void test_tokenizer_files(void **state) {
    (void)state;
    alarm(120);
    char dir[64], p[512];
    copy_model(dir, sizeof dir);
    path_in(p, sizeof p, dir, "tokenizer_config.json");
    json_t *cfg = json_load_file(p, 0, NULL);
    assert_non_null(cfg);

    write_text(dir, "tokenizer_config.json", "{not json");
    expect_load_error(dir, NX_E_FORMAT, "tokenizer_config.json");
    write_text(dir, "tokenizer_config.json", "{\"chat_template\": 7}");
    expect_load_error(dir, NX_E_CONFIG, "chat_template must be a string or a list");
    write_text(dir, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}]}");
    expect_load_error(dir, NX_E_CONFIG, "no \"default\" entry");
    /* a list with "default" is accepted (Hugging Face's named templates) */
    write_text(dir, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", "
               "\"template\": \"D\"}]}");
    nx_model *m = NULL;
    nx_error err = {0};
    assert_int_equal(load(dir, &m, &err), NX_OK);
    assert_string_equal(nx_model_chat_template(m), "D");
    nx_model_free(m);
    json_dump_file(cfg, p, 0);
    json_decref(cfg);

    /* a tokenizer whose ids pass the embedding's rows */
    path_in(p, sizeof p, dir, "tokenizer.json");
    json_t *tok = json_load_file(p, 0, NULL);
    assert_non_null(tok);
    json_array_append_new(json_object_get(tok, "added_tokens"),
                          json_pack("{s:i, s:s, s:b}", "id", 5000, "content", "<extra>", "special", 1));
    assert_int_equal(json_dump_file(tok, p, 0), 0);
    expect_load_error(dir, NX_E_FORMAT, "token ids up to 5000, but config.json's vocab_size is 4096");
    /* an empty vocabulary */
    json_object_set_new(json_object_get(tok, "model"), "vocab", json_object());
    json_object_set_new(json_object_get(tok, "model"), "merges", json_array());
    assert_int_equal(json_dump_file(tok, p, 0), 0);
    expect_load_error(dir, NX_E_FORMAT, "model.vocab: empty");
    json_decref(tok);
    remove_dir(dir);
    alarm(0);
}

/* ---------------------------------------------------------------- prompt cache */

static void test_prompt_cache_clear(void **state) {
    (void)state;
    alarm(120);
    nx_model *m = NULL;
    assert_int_equal(load(MODEL, &m, NULL), NX_OK);
    nx_ctx *c = NULL;
    assert_int_equal(nx_ctx_new(m, 256, &c, NULL), NX_OK);
    nx_prompt_cache *pc = NULL;
    assert_int_equal(nx_prompt_cache_new((size_t)64 << 20, &pc, NULL), NX_OK);
    nx_prompt_cache_stats st;
    int32_t a[40], b[40];
    for (int i = 0; i < 40; i++) a[i] = 100 + i, b[i] = 900 + i;
    assert_int_equal(nx_ctx_eval(c, a, 40, 0, NULL, NULL), NX_OK);
    /* b replaces a in the context; a goes into the cache and would come back for a */
    assert_int_equal(nx_prompt_cache_prepare(pc, c, b, 40), 0);
    nx_ctx_truncate(c, 0);
    assert_int_equal(nx_ctx_eval(c, b, 40, 0, NULL, NULL), NX_OK);
    nx_prompt_cache_get_stats(pc, &st);
    assert_int_equal(st.entries, 1);
    nx_ctx_truncate(c, 0);
    assert_int_equal(nx_prompt_cache_prepare(pc, c, a, 40), 39); /* without a clear, a comes back */
    nx_ctx_truncate(c, 0);
    nx_prompt_cache_clear(pc);
    nx_prompt_cache_get_stats(pc, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.bytes, 0);
    nx_ctx_truncate(c, 0);
    assert_int_equal(nx_prompt_cache_prepare(pc, c, a, 40), 0); /* gone */
    nx_prompt_cache_free(pc);
    nx_ctx_free(c);
    nx_model_free(m);
    alarm(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifos),           cmocka_unit_test(test_nan_weights),
        cmocka_unit_test(test_nonfinite_logits), cmocka_unit_test(test_file_changed),
        cmocka_unit_test(test_tokenizer_files), cmocka_unit_test(test_prompt_cache_clear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
