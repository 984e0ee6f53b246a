/* libFuzzer target for JSON mode's recogniser (src/decode/json_grammar.c) against jansson: text
 * the recogniser completes is one JSON object for jansson (numbers beyond a double aside, which
 * jansson refuses), and a JSON object jansson reads is completed by the recogniser unless it is
 * outside the recogniser's profile (json_grammar.h: depth, whitespace runs, \u escapes, bytes
 * around the object) or holds a NUL byte (which jansson skips between tokens). The token mask of a small vocabulary agrees with feeding each token. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "decode/json_grammar.h"

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

    /* the mask over tokens cut from the input itself */
    static const char *const frag[] = {"{", "}", "\"", ":", ",", "1", "[", "]", " ", "\"a\":", "true"};
    enum { NF = sizeof frag / sizeof *frag };
    const char *toks[NF + 1];
    size_t lens[NF + 1];
    for (int i = 0; i < NF; i++) toks[i] = frag[i], lens[i] = strlen(frag[i]);
    toks[NF] = NULL, lens[NF] = 0;
    const int32_t end = NF;
    nx_json_vocab *jv = NULL;
    if (nx_json_vocab_from_bytes(toks, lens, NF + 1, &end, 1, &jv, NULL) != NX_OK) abort();
    nx_json_init(&s);
    for (size_t i = 0; i < size && i < 64; i++) {
        uint8_t allow[NF + 1];
        nx_json_allowed(jv, &s, NF + 1, allow);
        for (int k = 0; k < NF; k++) {
            nx_json_state t = s;
            const bool fits = nx_json_feed(&t, (const uint8_t *)toks[k], lens[k]);
            if (!nx_json_complete(&s) && allow[k] != fits) abort();
        }
        if (!nx_json_step(&s, data[i])) break;
    }
    nx_json_vocab_free(jv);
    return 0;
}
