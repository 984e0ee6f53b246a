/* libFuzzer target for the Jinja interpreter: parses the input as a template and renders it
 * with small budgets. Bytes after the first NUL, when they are a JSON object, replace the
 * default chat context. Any crash, sanitizer report or hang is a bug; errors are fine. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"

static const char DEFAULT_CTX[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"h\\u00e9llo <think>x</think>\"},"
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\","
    "\"arguments\": {\"a\": [1, 2.5, true, null]}}}]}, {\"role\": \"tool\", \"content\": \"ok\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *dflt;
    if (!dflt) dflt = json_loads(DEFAULT_CTX, 0, NULL);
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    char *src = malloc(tlen ? tlen : 1); /* exact size, so ASan sees any over-read */
    if (!src) return 0;
    memcpy(src, data, tlen);
    json_t *ctx = NULL;
    if (nul) ctx = json_loadb((const char *)nul + 1, size - tlen - 1, 0, NULL);
    if (ctx && !json_is_object(ctx)) {
        json_decref(ctx);
        ctx = NULL;
    }
    nx_error err;
    nx_jinja *t = NULL;
    if (nx_jinja_parse(src, tlen, &t, &err) == NX_OK) {
        nx_jinja_limits lim = {.max_steps = 200000, .max_bytes = 16u << 20};
        nx_jinja_set_limits(t, &lim);
        char *out = NULL;
        size_t out_len = 0;
        if (nx_jinja_render(t, ctx ? ctx : dflt, &out, &out_len, &err) == NX_OK && out_len != strlen(out)) {
            /* the output may legitimately contain NULs only if the template produced them */
        }
        free(out);
    }
    nx_jinja_free(t);
    json_decref(ctx);
    free(src);
    return 0;
}
