/* libFuzzer target for state files (nx_state_load): the input is a file image whose header and
 * payload checksums the harness makes consistent first, so the fuzzer reaches the checks behind
 * them (dimensions, fingerprint, KV type, sizes, token range) instead of stopping at a CRC.
 * Beyond "no crash": a rejected file leaves the context's rows as they were, an accepted one
 * gives a context of at most its size whose tokens are in the vocabulary. The context belongs
 * to the shipped default model, loaded once. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "model/model_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static nx_model *g_model;
static nx_ctx *g_ctx;
static char g_path[64];

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void remove_file(void) {
    unlink(g_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_model) {
        nx_load_params p;
        nx_load_params_default(&p);
        p.n_threads = 1;
        nx_error err;
        if (nx_model_load("models/nextn-hy3-tiny", &p, &g_model, &err) != NX_OK ||
            nx_ctx_new(g_model, 64, &g_ctx, &err) != NX_OK) {
            fprintf(stderr, "fuzz_state: %s\n", err.msg);
            abort();
        }
        snprintf(g_path, sizeof g_path, "/tmp/nextn-fuzz-state-%ld", (long)getpid());
        atexit(remove_file);
    }
    uint8_t *b = malloc(size ? size : 1);
    memcpy(b, data, size);
    if (size >= 96) {
        put_u32(b + 56, (uint32_t)crc32(crc32(0, Z_NULL, 0), b + 96, (uInt)(size - 96)));
        put_u32(b + 60, (uint32_t)crc32(crc32(0, Z_NULL, 0), b, 60));
    }
    FILE *f = fopen(g_path, "wb");
    if (!f || fwrite(b, 1, size, f) != size || fclose(f) != 0) abort();
    free(b);
    /* the context holds 3 known rows before each load */
    const int32_t seed[3] = {1, 2, 3};
    nx_ctx_truncate(g_ctx, 0);
    if (nx_ctx_eval(g_ctx, seed, 3, 0, NULL, NULL) != NX_OK) abort();
    int32_t n = -1;
    nx_error err;
    if (nx_state_load(g_ctx, g_path, &n, NULL, &err) != NX_OK) {
        if (nx_ctx_n_past(g_ctx) != 3 || memcmp(g_ctx->tokens, seed, sizeof seed) != 0) abort();
        return 0;
    }
    if (n < 0 || n > nx_ctx_n_ctx(g_ctx) || nx_ctx_n_past(g_ctx) != n) abort();
    for (int32_t i = 0; i < n; i++)
        if (g_ctx->tokens[i] < 0 || g_ctx->tokens[i] >= g_model->cfg.vocab_size) abort();
    return 0;
}
