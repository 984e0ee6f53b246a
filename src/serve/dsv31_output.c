/* DeepSeek-V3.1 tool-call parser (dsv31_output.h). */
#include "serve/dsv31_output.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/tool_grammar.h"
#include "serve/output_text.h"

/* The arguments text s[0..n) as a compact JSON object text (malloc'd), or NULL when it does not
 * begin with one object (whole: the call is closed, so empty text is {}); *oom when out of
 * memory. Text after the object is ignored, so a call cut short that already has its object
 * reads as it will once closed. */
static char *args_text(const char *s, size_t n, bool whole, const json_t *tools, const char *name, bool *oom) {
    size_t b = 0, e = n;
    nx_out_trim(s, &b, &e);
    char *out = NULL;
    if (b == e) {
        if (whole) *oom = !(out = strdup("{}"));
        return out;
    }
    json_t *args = json_loadb(s + b, e - b, JSON_DISABLE_EOF_CHECK, NULL);
    if (json_is_object(args)) {
        nx_out_type_args(args, tools, name);
        *oom = !(out = json_dumps(args, JSON_COMPACT));
    }
    json_decref(args);
    return out;
}

/* Appends the call named s[nb, ne) with arguments s[ab, ae) to calls (see dsv31_output.h for
 * what is skipped). false when out of memory. */
static bool add_call(json_t *calls, const char *s, size_t nb, size_t ne, size_t ab, size_t ae, bool whole,
                     const json_t *tools) {
    char name[256];
    if (!nx_out_call_name(s, nb, ne, name)) return true;
    bool oom = false;
    char *args = args_text(s + ab, ae - ab, whole, tools, name, &oom);
    if (!args) return !oom;
    json_t *call = json_pack("{s:s, s:{s:s, s:s}}", "type", "function", "function", "name", name, "arguments", args);
    free(args);
    return call && json_array_append_new(calls, call) == 0;
}

json_t *nx_dsv31_parse_tool_calls(const char *text, size_t len, const json_t *tools) {
    json_t *calls = json_array();
    const size_t kb = strlen(NX_DSV31_CALL_BEGIN), ks = strlen(NX_DSV31_SEP), ke = strlen(NX_DSV31_CALL_END);
    size_t pos = 0;
    while (calls && pos < len) {
        const size_t c0 = nx_out_find(text, len, pos, NX_DSV31_CALL_BEGIN);
        if (c0 == len) break;
        const size_t nb = c0 + kb, next = nx_out_find(text, len, nb, NX_DSV31_CALL_BEGIN);
        /* the separator is looked for up to the next call only: text without separators costs
         * one pass, however many calls it opens */
        const size_t sep = nx_out_find(text, next, nb, NX_DSV31_SEP);
        if (sep == next) {
            pos = next;
            continue;
        }
        const size_t e = nx_out_find(text, len, sep + ks, NX_DSV31_CALL_END);
        pos = e == len ? len : e + ke;
        /* cut short: the arguments end before a marker's first bytes */
        const size_t ae = e < len ? e : len - nx_out_partial_tail(text, len, sep + ks, NX_DSV31_CALL_END);
        if (!add_call(calls, text, nb, sep, sep + ks, ae, e < len, tools)) {
            json_decref(calls);
            return NULL;
        }
    }
    return calls;
}
