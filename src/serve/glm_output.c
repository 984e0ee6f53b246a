/* GLM-4.5 tool-call parser (glm_output.h). */
#include "serve/glm_output.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "constrain/tool_grammar.h"
#include "serve/output_text.h"

#define CALL_OPEN "<tool_call>"
#define CALL_CLOSE "</tool_call>"
#define KEY_OPEN "<arg_key>"
#define KEY_CLOSE "</arg_key>"
#define VALUE_OPEN "<arg_value>"
#define VALUE_CLOSE "</arg_value>"

/* The end of a run of whitespace and literal backslash-n sequences starting at i (vLLM's
 * (?:\\n|\s)* between </arg_key> and <arg_value>). */
static size_t skip_gap(const char *s, size_t n, size_t i) {
    for (;;) {
        if (i < n && isspace((unsigned char)s[i])) i++;
        else if (i + 1 < n && s[i] == '\\' && s[i + 1] == 'n') i += 2;
        else return i;
    }
}

/* Whether argument key of function name has the schema type "string" exactly: vLLM keeps such
 * values as text and decodes every other one. */
static bool string_typed(const json_t *tools, const char *name, const char *key) {
    const char *type = json_string_value(json_object_get(nx_tool_arg_schema(tools, name, key), "type"));
    return type && strcmp(type, "string") == 0;
}

/* v[0..n) as a JSON string's body with its escapes undone, then parsed as JSON; NULL when
 * either step fails (vLLM's json.loads('{"tmp": "' + value + '"}') fallback). */
static json_t *unescaped_json(const char *v, size_t n) {
    if (!memchr(v, '\\', n)) return NULL;
    char *q = malloc(n + 3);
    if (!q) return NULL;
    q[0] = '"';
    memcpy(q + 1, v, n);
    q[n + 1] = '"';
    q[n + 2] = '\0';
    json_t *s = json_loadb(q, n + 2, JSON_DECODE_ANY, NULL);
    free(q);
    json_t *x = json_is_string(s) ? json_loadb(json_string_value(s), json_string_length(s), JSON_DECODE_ANY, NULL) : NULL;
    json_decref(s);
    return x;
}

/* The value of argument text v[0..n): see glm_output.h. NULL when the text is not UTF-8. */
static json_t *typed_value(const char *v, size_t n, bool keep_text) {
    json_t *x;
    if (keep_text) return json_stringn(v, n);
    if ((x = json_loadb(v, n, JSON_DECODE_ANY, NULL))) return x;
    if ((x = unescaped_json(v, n))) return x;
    if (n == 4 && memcmp(v, "True", 4) == 0) return json_true();
    if (n == 5 && memcmp(v, "False", 5) == 0) return json_false();
    if (n == 4 && memcmp(v, "None", 4) == 0) return json_null();
    return json_stringn(v, n);
}

/* Adds the pair K, V to args (a repeated key takes the last value in its first place, as a
 * Python dict built pair by pair does); a key or value that is not UTF-8 drops the pair.
 * false when out of memory. */
static bool add_pair(json_t *args, const char *k, size_t kn, const char *v, size_t vn, const json_t *tools,
                     const char *name) {
    char *key = strndup(k, kn);
    if (!key) return false;
    json_t *kj = json_stringn(k, kn); /* NULL: not UTF-8 (or an embedded NUL) */
    bool ok = true;
    if (kj && strlen(key) == kn) {
        json_t *val = typed_value(v, vn, string_typed(tools, name, key));
        if (val) ok = json_object_set_new(args, key, val) == 0;
    }
    json_decref(kj);
    free(key);
    return ok;
}

/* The arguments in a call's body s[0..n) as a compact JSON object text (malloc'd), NULL when
 * out of memory. */
static char *parse_args(const char *s, size_t n, const json_t *tools, const char *name) {
    json_t *args = json_object();
    bool ok = args != NULL;
    size_t pos = 0;
    while (ok) {
        const size_t k0 = nx_out_find(s, n, pos, KEY_OPEN);
        if (k0 == n) break;
        size_t kb = k0 + strlen(KEY_OPEN), ke = nx_out_find(s, n, kb, KEY_CLOSE);
        if (ke == n) break;
        const size_t v0 = skip_gap(s, n, ke + strlen(KEY_CLOSE));
        if (v0 + strlen(VALUE_OPEN) > n || memcmp(s + v0, VALUE_OPEN, strlen(VALUE_OPEN)) != 0) {
            pos = v0;
            continue;
        }
        size_t vb = v0 + strlen(VALUE_OPEN), ve = nx_out_find(s, n, vb, VALUE_CLOSE);
        if (ve == n) break;
        pos = ve + strlen(VALUE_CLOSE);
        nx_out_trim(s, &kb, &ke);
        nx_out_trim(s, &vb, &ve);
        ok = add_pair(args, s + kb, ke - kb, s + vb, ve - vb, tools, name);
    }
    char *out = ok ? json_dumps(args, JSON_COMPACT) : NULL;
    json_decref(args);
    return out;
}

/* Where the name of a call whose body is s[0..n) ends, and where its arguments begin: at the
 * first newline, backslash-n or <arg_key>, whichever comes first (GLM-4.5 writes a newline,
 * GLM-4.7 the key); at the end when there is none and the call is whole, else nowhere (false:
 * the name may still grow). */
static bool name_end(const char *s, size_t n, bool whole, size_t *ne, size_t *ab) {
    const size_t nl = nx_out_find(s, n, 0, "\n"), esc = nx_out_find(s, n, 0, "\\n"), key = nx_out_find(s, n, 0, KEY_OPEN);
    *ne = nl < esc ? nl : esc;
    *ab = *ne + (nl < esc ? 1 : 2);
    if (key <= *ne) *ne = *ab = key;
    if (*ne < n) return true;
    *ne = *ab = n;
    return whole;
}

/* Appends the call with body s[0..n) (whole: closed by </tool_call>) to calls; a call without a
 * valid name is skipped. false when out of memory. */
static bool add_call(json_t *calls, const char *s, size_t n, bool whole, const json_t *tools) {
    size_t ne, ab, nb = 0;
    if (!name_end(s, n, whole, &ne, &ab)) return true;
    char name[256];
    if (!nx_out_call_name(s, nb, ne, name)) return true;
    char *args = parse_args(s + ab, n - ab, tools, name);
    json_t *call = args ? json_pack("{s:s, s:{s:s, s:s}}", "type", "function", "function", "name", name,
                                    "arguments", args)
                        : NULL;
    free(args);
    return call && json_array_append_new(calls, call) == 0;
}

json_t *nx_glm_parse_tool_calls(const char *text, size_t len, const json_t *tools) {
    json_t *calls = json_array();
    size_t pos = 0;
    while (calls && pos < len) {
        const size_t c0 = nx_out_find(text, len, pos, CALL_OPEN);
        if (c0 == len) break;
        const size_t b = c0 + strlen(CALL_OPEN), e = nx_out_find(text, len, b, CALL_CLOSE);
        pos = e == len ? len : e + strlen(CALL_CLOSE); /* e == len: the last call, cut short */
        if (!add_call(calls, text + b, e - b, e < len, tools)) {
            json_decref(calls);
            return NULL;
        }
    }
    return calls;
}
