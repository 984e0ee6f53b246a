/* libFuzzer target for JSON mode's recogniser (src/constrain/json_grammar.c) against jansson: text
 * the recogniser completes is one JSON object for jansson (numbers beyond a double aside, which
 * jansson refuses), and a JSON object jansson reads is completed by the recogniser unless it is
 * outside the recogniser's profile (json_grammar.h: depth, whitespace runs, \u escapes, bytes
 * around the object) or holds a NUL byte (which jansson skips between tokens). The token mask of
 * a small vocabulary agrees with feeding each token (json_mask_check.h). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/json_grammar.h"
#include "json_mask_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool outside_profile(const uint8_t *d, size_t n) {
    int ws = 0, depth = 0;
    if (n == 0 || d[0] != '{' || d[n - 1] != '}') return true;
    if (memchr(d, 0, n)) return true; /* jansson reads a NUL byte between tokens as nothing; JSON has none */
    for (size_t i = 0; i < n; i++) {
        const uint8_t c = d[i];
        ws = (c == ' ' || c == '\t' || c == '\n' || c == '\r') ? ws + 1 : 0;
        if (ws > NX_JSON_MAX_WS || (c == '\\' && i + 1 < n && d[i + 1] == 'u')) return true;
        depth += (c == '{' || c == '[') - (c == '}' || c == ']');
        if (depth > NX_JSON_MAX_DEPTH) return true;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nx_json_state s;
    nx_json_init(&s);
    const bool ours = nx_json_feed(&s, data, size) && nx_json_complete(&s);
    json_error_t e;
    json_t *v = json_loadb((const char *)data, size, JSON_DECODE_INT_AS_REAL, &e);
    const bool theirs = v && json_is_object(v);
    json_decref(v);
    if (ours && !theirs && !strstr(e.text, "overflow")) abort();
    if (theirs && !ours && !outside_profile(data, size)) abort();

    /* the mask over a small vocabulary agrees with feeding each token, along the input */
    nx_json_init(&s);
    check_mask(&s, data, size, 64);
    return 0;
}
