/* libFuzzer target for tool-call arguments (constrain/tool_grammar.h): the input is a tools array
 * (OpenAI's JSON), a NUL byte, then one byte per generated token over a small vocabulary (JSON
 * and name fragments, the eight call markers, an end id, another special token); its last byte
 * also picks the call syntax (Hy3, GLM-4.5, GLM-4.7, DeepSeek-V3.1). Building the
 * grammar either succeeds or names the problem; then, named after the first tool and for any
 * tool, before each token the mask agrees with stepping every token, and a dead state stays
 * dead. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/tool_grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const frag[] = {"{", "}", "\"", ":", ",", "1", "[", "]", " ", "\n", "true", "null", "-2.5",
                                   "a", "b", "x", "days", "city", "get_weather", "\xc3", "\xa9", "\xe2\x82\xac", "0"};
enum { NF = sizeof frag / sizeof *frag, MK0 = NF, END = NF + 8, SPECIAL, NV };

static void walk(const nx_tool_grammar *g, const nx_json_vocab *v, const uint8_t *ids, size_t n) {
    nx_tool_state st;
    nx_tool_init(g, &st);
    bool alive = true;
    for (size_t i = 0; i < n && i < 256; i++) {
        uint8_t allow[NV];
        nx_tool_allowed(g, &st, NV, allow);
        bool any = false;
        for (int k = 0; alive && k < NV; k++) {
            nx_tool_state t = st;
            const bool fits = nx_tool_step(g, &t, k);
            any = any || fits;
            if (allow[k] != fits && !(k == END && allow[k])) abort(); /* the end may be let through when stuck */
        }
        (void)v;
        const bool ok = nx_tool_step(g, &st, ids[i] % NV);
        if (!alive && ok) abort(); /* dead stays dead */
        alive = alive && ok;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const size_t tlen = nul ? (size_t)(nul - data) : size;
    json_t *tools = json_loadb((const char *)data, tlen, 0, NULL);
    if (!tools) return 0;
    const char *toks[NV];
    size_t lens[NV];
    for (int i = 0; i < NF; i++) toks[i] = frag[i], lens[i] = strlen(frag[i]);
    for (int i = NF; i < NV; i++) toks[i] = NULL, lens[i] = 0;
    const int32_t end = END;
    nx_json_vocab *v = NULL;
    if (nx_json_vocab_from_bytes(toks, lens, NV, &end, 1, &v, NULL) != NX_OK) abort();
    /* the call syntax by the last byte: Hy3's, GLM-4.5's, GLM-4.7's or DeepSeek-V3.1's */
    static const nx_tool_markers forms[4] = {
        {{MK0, MK0 + 1, MK0 + 2, MK0 + 3, MK0 + 4, MK0 + 5, MK0 + 6, MK0 + 7}, false, false, false, false, false},
        {{MK0, MK0 + 1, -1, -1, MK0 + 4, MK0 + 5, MK0 + 6, MK0 + 7}, true, true, true, false, false},
        {{MK0, MK0 + 1, -1, -1, MK0 + 4, MK0 + 5, MK0 + 6, MK0 + 7}, false, true, true, true, false},
        {{MK0, MK0 + 1, MK0 + 2, MK0 + 3, -1, -1, -1, -1}, false, false, false, false, true}};
    const nx_tool_markers mk = forms[size ? data[size - 1] % 4 : 0];
    const char *first = json_string_value(json_object_get(json_object_get(json_array_get(tools, 0), "function"), "name"));
    for (int named = 0; named < 2; named++) {
        nx_tool_grammar *g = NULL;
        nx_error err = {0};
        if (nx_tool_grammar_new(tools, named ? first : NULL, &mk, v, &g, &err) != NX_OK) {
            if (g || !err.msg[0]) abort();
            continue;
        }
        const size_t from = tlen + (nul ? 1 : 0);
        walk(g, v, data + from, size - from);
        nx_tool_grammar_free(g);
    }
    nx_json_vocab_free(v);
    json_decref(tools);
    return 0;
}
