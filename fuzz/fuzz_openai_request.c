/* libFuzzer target for the OpenAI request parser (the server's untrusted input): every body
 * must parse or fail with a 400 naming its field, never crash; parsed requests then drive the
 * response builders and the stop-string matcher with the request's own strings. The same bytes
 * go to the slot actions' checks (POST /slots/ID): a file name they accept never leaves the
 * slot directory. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/openai.h"
#include "serve/slots.h"
#include "serve/stop.h"

#define FUZZ_SLOTS 4 /* a server of several slots: ids 0..3 are accepted */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t token_text(void *user, int32_t id, char *buf, size_t cap) {
    const nx_oai_request *r = user;
    /* tokens spell pieces of the stop strings, so matches and partial UTF-8 both occur */
    const char *s = r->n_stop ? r->stop[(size_t)id % r->n_stop] : "tok";
    size_t n = strlen(s) > 3 ? 3 : strlen(s);
    if (n <= cap) memcpy(buf, s, n);
    return n;
}

/* An accepted slot file name stays inside the slot directory: one path component, not "." or
 * "..", and not hidden. */
static void check_filename(const char *name, size_t len) {
    if (nx_slot_filename_problem(name, len)) return;
    if (len == 0 || len > NX_SLOT_NAME_MAX || memchr(name, '/', len) || memchr(name, '\\', len) ||
        memchr(name, '\0', len) || name[0] == '.')
        abort();
}

static void exercise_slots(const uint8_t *data, size_t size) {
    check_filename((const char *)data, size);
    static const char *const actions[] = {"save", "restore", "erase"};
    for (int a = 0; a < 3; a++) {
        nx_slot_request r;
        nx_oai_error e;
        if (nx_slot_request_parse("0", actions[a], (const char *)data, size, FUZZ_SLOTS, &r, &e) != NX_OK) {
            if (e.http_status != 400) abort();
            free(nx_oai_error_json(&e));
            continue;
        }
        if (r.action != NX_SLOT_ERASE) check_filename(r.filename, strlen(r.filename));
        nx_slot_result res = {.n = 1, .bytes = 2, .ms = 0.5};
        free(nx_slot_response_json(&r, &res));
    }
    /* the bytes as the URL's slot id and as the action */
    char *text = malloc(size + 1);
    if (!text) return;
    memcpy(text, data, size);
    text[size] = '\0';
    nx_slot_request r;
    nx_oai_error e;
    if (nx_slot_request_parse(text, "erase", "", 0, FUZZ_SLOTS, &r, &e) != NX_OK) free(nx_oai_error_json(&e));
    else if (r.id < 0 || r.id >= FUZZ_SLOTS) abort(); /* an accepted id names a slot */
    static const char body[] = "{\"filename\": \"a\"}";
    if (nx_slot_request_parse("0", text, body, sizeof body - 1, FUZZ_SLOTS, &r, &e) != NX_OK) free(nx_oai_error_json(&e));
    free(text);
}

static void exercise(nx_oai_request *r, const uint8_t *data, size_t size) {
    /* Stop matching over the raw input cut into uneven pieces. */
    nx_stop_matcher m;
    nx_stop_init(&m, r->stop, r->n_stop);
    nx_strbuf out = {0};
    bool stopped = false;
    for (size_t i = 0, step = 1; i < size && !stopped; i += step, step = step % 7 + 1) {
        size_t n = i + step <= size ? step : size - i;
        nx_stop_push(&m, (const char *)data + i, n, &out, &stopped);
    }
    nx_stop_flush(&m, &out);
    nx_stop_free(&m);

    nx_oai_logprob lp[3];
    memset(lp, 0, sizeof lp);
    for (int i = 0; i < 3; i++) {
        lp[i].id = i;
        lp[i].logprob = -(float)i;
        lp[i].n_top = r->top_logprobs < 3 ? r->top_logprobs : 3;
        for (int k = 0; k < lp[i].n_top; k++) lp[i].top_id[k] = k, lp[i].top_logprob[k] = -(float)k;
    }
    nx_oai_meta meta = {.kind = r->kind, .id = "x", .created = 1, .model = r->model ? r->model : "m",
                        .logprobs = r->logprobs, .token_text = token_text, .token_user = r};
    nx_oai_choice c = {.index = 0, .text = out.data ? out.data : "", .text_len = out.len,
                       .finish_reason = stopped ? "stop" : NULL, .lp = lp, .n_lp = 3};
    nx_oai_usage u = {.prompt_tokens = 1, .completion_tokens = 2, .drafted = 2, .accepted = 1,
                      .draft = r->draft};
    free(nx_oai_response_json(&meta, &c, 1, &u));
    free(nx_oai_stream_chunk(&meta, &c, true, r->include_usage));
    free(nx_oai_stream_chunk(&meta, &c, false, false));
    free(nx_oai_stream_usage(&meta, &u));
    nx_strbuf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const nx_oai_limits lim = {.model_id = "nextn-hy3-tiny", .vocab_size = 4096};
    for (int k = 0; k < 2; k++) {
        nx_oai_request r;
        nx_oai_error e;
        nx_status st = nx_oai_request_parse(k ? NX_OAI_COMPLETION : NX_OAI_CHAT, (const char *)data,
                                            size, &lim, &r, &e);
        if (st == NX_OK) {
            exercise(&r, data, size);
        } else {
            if (e.http_status != 400 && e.http_status != 500) abort();
            free(nx_oai_error_json(&e));
        }
        nx_oai_request_free(&r);
    }
    size_t n = 0;
    free(nx_oai_utf8_sanitize((const char *)data, size, &n));
    exercise_slots(data, size);
    return 0;
}
