/* libFuzzer target for the Hy3 tool-call parser (model output is untrusted text): whatever the
 * bytes, the result is an array of calls, each with a non-empty name and arguments that are a
 * serialized JSON object; the calls of the first half of the bytes are the first calls of the
 * whole, with the same names and arguments that, less their closing brace, are a prefix of the
 * whole's (what the server streams as deltas). The same bytes, read as token ids, drive the
 * output split. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/hy_output.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *tools;
    static nx_hy_markers m;
    if (!tools) {
        tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":"
                           "{\"i\":{\"type\":\"integer\"},\"n\":{\"type\":\"number\"},\"b\":{\"type\":\"boolean\"},"
                           "\"o\":{\"type\":\"object\"},\"u\":{\"anyOf\":[{\"type\":\"int64\"},{\"type\":\"null\"}]},"
                           "\"t\":{\"type\":[\"string\",\"array\"]}}}}}]",
                           0, NULL);
        nx_hy_markers_init(&m, ":opensource", NULL);
        for (int i = 0; i < NX_HY_N_MARKERS; i++) m.id[i] = 200 + i;
    }
    json_t *calls = nx_hy_parse_tool_calls((const char *)data, size, &m, tools);
    if (!calls || !json_is_array(calls)) abort();
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        const json_t *f = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        const char *args = json_string_value(json_object_get(f, "arguments"));
        if (!name || !*name || !args) abort();
        json_t *a = json_loads(args, JSON_ALLOW_NUL, NULL); /* values may hold NUL bytes */
        if (!json_is_object(a)) abort();
        json_decref(a);
    }
    json_t *part = nx_hy_parse_tool_calls((const char *)data, size / 2, &m, tools);
    if (!part || json_array_size(part) > json_array_size(calls)) abort();
    json_array_foreach(part, i, c) {
        const json_t *f = json_object_get(c, "function"), *g = json_object_get(json_array_get(calls, i), "function");
        const char *pa = json_string_value(json_object_get(f, "arguments"));
        const char *fa = json_string_value(json_object_get(g, "arguments"));
        if (!pa || !fa || !json_equal(json_object_get(f, "name"), json_object_get(g, "name"))) abort();
        const size_t pl = strlen(pa);
        if (pl < 2 || pl > strlen(fa) || memcmp(pa, fa, pl - 1) != 0) abort();
    }
    json_decref(part);
    json_decref(calls);
    nx_hy_split s;
    nx_hy_split_init(&s, &m, true, true, size ? 200 + data[0] % 16 : -1);
    for (size_t k = 0; k < size; k++) {
        const char *mk;
        int part = nx_hy_split_token(&s, 195 + data[k] % 20, &mk);
        if (part < -1 || part > NX_HY_TOOLS || (mk && part != NX_HY_TOOLS)) abort();
    }
    return 0;
}
