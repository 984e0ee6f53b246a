/* DeepSeek-V3.1 tool-call parser (dsv31_output.h). */
#include "serve/dsv31_output.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/tool_grammar.h"

/* First occurrence of the NUL-terminated needle in s[from, n), or n. */
static size_t find(const char *s, size_t n, size_t from, const char *needle) {
    const size_t k = strlen(needle);
    for (size_t i = from; i + k <= n; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, k) == 0) return i;
    return n;
}

/* s[*b, *e) without leading and trailing ASCII whitespace. */
static void trim(const char *s, size_t *b, size_t *e) {
    while (*b < *e && isspace((unsigned char)s[*b])) (*b)++;
    while (*e > *b && isspace((unsigned char)s[*e - 1])) (*e)--;
}

/* Whether x is a value of one of the types in bits (NX_ARG_*). */
static bool fits(const json_t *x, int bits) {
    if (json_is_integer(x)) return bits & (NX_ARG_INT | NX_ARG_NUM);
    if (json_is_real(x)) return bits & NX_ARG_NUM;
    if (json_is_boolean(x)) return bits & NX_ARG_BOOL;
    return (json_is_object(x) || json_is_array(x)) && (bits & NX_ARG_OTHER);
}

/* Types args' top-level string values by the tools' schemas (see dsv31_output.h). */
static void type_args(json_t *args, const json_t *tools, const char *name) {
    const char *key;
    json_t *v;
    json_object_foreach(args, key, v) {
        const int bits = nx_tool_arg_types(nx_tool_arg_schema(tools, name, key));
        if (!json_is_string(v) || !bits || (bits & NX_ARG_STRING)) continue;
        json_t *x = json_loadb(json_string_value(v), json_string_length(v), JSON_DECODE_ANY, NULL);
        if (x && fits(x, bits)) json_object_set(args, key, x); /* replaces v in place */
        json_decref(x);
    }
}

/* The arguments text s[0..n) as a compact JSON object text (malloc'd), or NULL when it does not
 * begin with one object (whole: the call is closed, so empty text is {}); *oom when out of
 * memory. Text after the object is ignored, so a call cut short that already has its object
 * reads as it will once closed. */
static char *args_text(const char *s, size_t n, bool whole, const json_t *tools, const char *name, bool *oom) {
    size_t b = 0, e = n;
    trim(s, &b, &e);
    char *out = NULL;
    if (b == e) {
        if (whole) *oom = !(out = strdup("{}"));
        return out;
    }
    json_t *args = json_loadb(s + b, e - b, JSON_DISABLE_EOF_CHECK, NULL);
    if (json_is_object(args)) {
        type_args(args, tools, name);
        *oom = !(out = json_dumps(args, JSON_COMPACT));
    }
    json_decref(args);
    return out;
}

/* Appends the call named s[nb, ne) with arguments s[ab, ae) to calls (see dsv31_output.h for
 * what is skipped). false when out of memory. */
static bool add_call(json_t *calls, const char *s, size_t nb, size_t ne, size_t ab, size_t ae, bool whole,
                     const json_t *tools) {
    trim(s, &nb, &ne);
    if (ne == nb || ne - nb > 255 || memchr(s + nb, '\0', ne - nb)) return true;
    char name[256];
    memcpy(name, s + nb, ne - nb);
    name[ne - nb] = '\0';
    json_t *valid = json_string(name); /* NULL: not UTF-8 */
    if (!valid) return true;
    json_decref(valid);
    bool oom = false;
    char *args = args_text(s + ab, ae - ab, whole, tools, name, &oom);
    if (!args) return !oom;
    json_t *call = json_pack("{s:s, s:{s:s, s:s}}", "type", "function", "function", "name", name, "arguments", args);
    free(args);
    return call && json_array_append_new(calls, call) == 0;
}

/* The length of the longest tail of s[from, n) that is a proper prefix of needle. */
static size_t partial_tail(const char *s, size_t n, size_t from, const char *needle) {
    const size_t k = strlen(needle);
    for (size_t l = k - 1 < n - from ? k - 1 : n - from; l > 0; l--)
        if (memcmp(s + n - l, needle, l) == 0) return l;
    return 0;
}

json_t *nx_dsv31_parse_tool_calls(const char *text, size_t len, const json_t *tools) {
    json_t *calls = json_array();
    const size_t kb = strlen(NX_DSV31_CALL_BEGIN), ks = strlen(NX_DSV31_SEP), ke = strlen(NX_DSV31_CALL_END);
    size_t pos = 0;
    while (calls && pos < len) {
        const size_t c0 = find(text, len, pos, NX_DSV31_CALL_BEGIN);
        if (c0 == len) break;
        const size_t nb = c0 + kb, next = find(text, len, nb, NX_DSV31_CALL_BEGIN);
        /* the separator is looked for up to the next call only: text without separators costs
         * one pass, however many calls it opens */
        const size_t sep = find(text, next, nb, NX_DSV31_SEP);
        if (sep == next) {
            pos = next;
            continue;
        }
        const size_t e = find(text, len, sep + ks, NX_DSV31_CALL_END);
        pos = e == len ? len : e + ke;
        /* cut short: the arguments end before a marker's first bytes */
        const size_t ae = e < len ? e : len - partial_tail(text, len, sep + ks, NX_DSV31_CALL_END);
        if (!add_call(calls, text, nb, sep, sep + ks, ae, e < len, tools)) {
            json_decref(calls);
            return NULL;
        }
    }
    return calls;
}
