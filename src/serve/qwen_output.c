/* Qwen3-Coder XML and hermes JSON tool-call parsers (qwen_output.h). */
#include "serve/qwen_output.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "constrain/tool_grammar.h"
#include "serve/output_text.h"

#define CALL_OPEN "<tool_call>"
#define CALL_CLOSE "</tool_call>"
#define FUNC_OPEN "<function="
#define FUNC_CLOSE "</function>"
#define PARAM_OPEN "<parameter="
#define PARAM_CLOSE "</parameter>"

/* ---------------------------------------------------------------- Qwen3-Coder values */

/* The schema's type as vLLM's qwen3_coder parser reads it (lower-cased into type, cap bytes),
 * and whether it admits null. A "type" that is not a string (a list) reads as no known type. */
static bool schema_type(const json_t *schema, char *type, size_t cap) {
    const char *t = "string";
    bool null_ok = false;
    const json_t *ty = json_object_get(schema, "type"), *any = json_object_get(schema, "anyOf");
    if (ty) {
        t = json_is_string(ty) ? json_string_value(ty) : "?";
    } else if (json_is_array(any)) {
        bool picked = false;
        size_t i;
        const json_t *o;
        json_array_foreach(any, i, o) {
            const char *ot = json_string_value(json_object_get(o, "type"));
            if (ot && strcasecmp(ot, "null") == 0) null_ok = true;
            else if (ot && !picked) t = ot, picked = true;
        }
    }
    size_t b = 0, e = strlen(t), n = 0;
    nx_out_trim(t, &b, &e);
    for (; b < e && n + 1 < cap; b++) type[n++] = (char)tolower((unsigned char)t[b]);
    type[n] = '\0';
    return null_ok || strcmp(type, "null") == 0;
}

static bool starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static bool is_null_word(const char *v, size_t n) {
    return (n == 4 && strncasecmp(v, "null", 4) == 0) || (n == 4 && strncasecmp(v, "none", 4) == 0);
}

/* Python's int(v): optional sign and digits, surrounding whitespace allowed; NULL otherwise or
 * past 64 bits. */
static json_t *as_int(const char *v, size_t n) {
    size_t b = 0, e = n;
    nx_out_trim(v, &b, &e);
    char buf[32];
    if (e - b == 0 || e - b >= sizeof buf) return NULL;
    memcpy(buf, v + b, e - b);
    buf[e - b] = '\0';
    const char *p = buf + (buf[0] == '-' || buf[0] == '+');
    if (!*p) return NULL;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return NULL;
    errno = 0;
    const long long x = strtoll(buf, NULL, 10);
    return errno ? NULL : json_integer(x);
}

/* Python's float(v), then an integer when whole (vLLM's rule); finite decimal numbers only. */
static json_t *as_number(const char *v, size_t n) {
    size_t b = 0, e = n;
    nx_out_trim(v, &b, &e);
    char buf[64];
    if (e - b == 0 || e - b >= sizeof buf) return NULL;
    memcpy(buf, v + b, e - b);
    buf[e - b] = '\0';
    if (strspn(buf, "0123456789+-.eE") != e - b) return NULL; /* no hex, inf or nan */
    char *end;
    errno = 0;
    const double x = strtod(buf, &end);
    if (*end || errno || !isfinite(x)) return NULL;
    if (x == floor(x) && fabs(x) < 9.2e18) return json_integer((json_int_t)x);
    return json_real(x);
}

/* JSON text, then Python's True / False / None (vLLM's json.loads and ast.literal_eval). */
static json_t *as_literal(const char *v, size_t n) {
    json_t *x = json_loadb(v, n, JSON_DECODE_ANY, NULL);
    if (x) return x;
    size_t b = 0, e = n;
    nx_out_trim(v, &b, &e);
    if (e - b == 4 && memcmp(v + b, "True", 4) == 0) return json_true();
    if (e - b == 5 && memcmp(v + b, "False", 5) == 0) return json_false();
    if (e - b == 4 && memcmp(v + b, "None", 4) == 0) return json_null();
    return NULL;
}

/* The value of parameter text v[0..n) under schema (NULL: the key has none): see qwen_output.h.
 * NULL when the text is not UTF-8. */
static json_t *coder_value(const char *v, size_t n, const json_t *schema) {
    if (!schema) return json_stringn(v, n);
    char type[32];
    const bool null_ok = schema_type(schema, type, sizeof type);
    if (null_ok && is_null_word(v, n)) return json_null();
    static const char *const text_types[] = {"string", "str", "text", "varchar", "char", "enum"};
    for (size_t i = 0; i < sizeof text_types / sizeof text_types[0]; i++)
        if (strcmp(type, text_types[i]) == 0) return json_stringn(v, n);
    if (is_null_word(v, n)) return json_null();
    json_t *x = NULL;
    if (starts(type, "int") || starts(type, "uint") || starts(type, "long") || starts(type, "short") ||
        starts(type, "unsigned"))
        x = as_int(v, n);
    else if (starts(type, "num") || starts(type, "float"))
        x = as_number(v, n);
    else if (!strcmp(type, "boolean") || !strcmp(type, "bool") || !strcmp(type, "binary"))
        return json_boolean(n == 4 && strncasecmp(v, "true", 4) == 0);
    else
        x = as_literal(v, n);
    return x ? x : json_stringn(v, n);
}

/* ---------------------------------------------------------------- Qwen3-Coder calls */

/* Adds parameter K = V (s[kb, ke), s[vb, ve)) to args; a key or value that is not UTF-8 drops
 * it. false when out of memory. */
static bool add_param(json_t *args, const char *s, size_t kb, size_t ke, size_t vb, size_t ve, const json_t *tools,
                      const char *name) {
    if (vb < ve && s[vb] == '\n') vb++;
    if (ve > vb && s[ve - 1] == '\n') ve--;
    char *key = strndup(s + kb, ke - kb);
    if (!key) return false;
    json_t *kj = json_stringn(s + kb, ke - kb); /* NULL: not UTF-8 (or an embedded NUL) */
    bool ok = true;
    if (kj && strlen(key) == ke - kb) {
        json_t *val = coder_value(s + vb, ve - vb, nx_tool_arg_schema(tools, name, key));
        if (val) ok = json_object_set_new(args, key, val) == 0;
    }
    json_decref(kj);
    free(key);
    return ok;
}

/* The parameters of a function body s[0..n) (closed: its end is the body's real end) as a
 * compact JSON object text (malloc'd), NULL when out of memory. */
static char *coder_args(const char *s, size_t n, bool closed, const json_t *tools, const char *name) {
    json_t *args = json_object();
    bool ok = args != NULL;
    /* the next </parameter> and <parameter= are searched again only once behind: a body of
     * many parameters without closings costs one pass, not one per parameter */
    size_t pos = 0, pc = 0, next = 0;
    while (ok) {
        const size_t p0 = nx_out_find(s, n, pos, PARAM_OPEN);
        if (p0 == n) break;
        const size_t kb = p0 + strlen(PARAM_OPEN), ke = nx_out_find(s, n, kb, ">");
        if (ke == n) break;
        const size_t vb = ke + 1;
        if (pc < vb) pc = nx_out_find(s, n, vb, PARAM_CLOSE);
        if (next < vb) next = nx_out_find(s, n, vb, PARAM_OPEN);
        const size_t ve = pc < next ? pc : next;
        if (ve == n && !closed) break; /* cut short: the value may still grow */
        ok = add_param(args, s, kb, ke, vb, ve, tools, name);
        pos = ve == pc && pc < n ? pc + strlen(PARAM_CLOSE) : ve;
    }
    char *out = ok ? json_dumps(args, JSON_COMPACT) : NULL;
    json_decref(args);
    return out;
}

/* Appends the call whose body (after <tool_call>) is s[0..n) to calls (whole: closed by
 * </tool_call>); see qwen_output.h for what is skipped. false when out of memory. */
static bool add_coder_call(json_t *calls, const char *s, size_t n, bool whole, const json_t *tools) {
    const size_t f0 = nx_out_find(s, n, 0, FUNC_OPEN);
    if (f0 == n) return true;
    const size_t nb = f0 + strlen(FUNC_OPEN), ne = nx_out_find(s, n, nb, ">");
    char name[256];
    if (ne == n || !nx_out_call_name(s, nb, ne, name)) return true;
    const size_t fe = nx_out_find(s, n, ne + 1, FUNC_CLOSE);
    char *args = coder_args(s + ne + 1, fe - (ne + 1), whole || fe < n, tools, name);
    json_t *call = args ? json_pack("{s:s, s:{s:s, s:s}}", "type", "function", "function", "name", name,
                                    "arguments", args)
                        : NULL;
    free(args);
    return call && json_array_append_new(calls, call) == 0;
}

/* Runs add(calls, body, n, whole, tools) on each <tool_call> body of text; NULL when out of
 * memory. */
static json_t *each_call(const char *text, size_t len, const json_t *tools,
                         bool (*add)(json_t *, const char *, size_t, bool, const json_t *)) {
    json_t *calls = json_array();
    size_t pos = 0;
    while (calls && pos < len) {
        const size_t c0 = nx_out_find(text, len, pos, CALL_OPEN);
        if (c0 == len) break;
        const size_t b = c0 + strlen(CALL_OPEN), e = nx_out_find(text, len, b, CALL_CLOSE);
        pos = e == len ? len : e + strlen(CALL_CLOSE); /* e == len: the last call, cut short */
        if (!add(calls, text + b, e - b, e < len, tools)) {
            json_decref(calls);
            return NULL;
        }
    }
    return calls;
}

json_t *nx_qwen_xml_parse_tool_calls(const char *text, size_t len, const json_t *tools) {
    return each_call(text, len, tools, add_coder_call);
}

/* ---------------------------------------------------------------- hermes calls */

/* Appends the call whose body is s[0..n) to calls; see qwen_output.h. false when out of memory. */
static bool add_json_call(json_t *calls, const char *s, size_t n, bool whole, const json_t *tools) {
    (void)whole;
    size_t b = 0, e = n;
    nx_out_trim(s, &b, &e);
    /* what follows the object is ignored: a call counts as soon as its object is whole, and
     * stays so however the output goes on (what lets a stream send it once) */
    json_t *obj = json_loadb(s + b, e - b, JSON_DISABLE_EOF_CHECK, NULL);
    const json_t *nj = json_object_get(obj, "name");
    json_t *args = json_object_get(obj, "arguments");
    char name[256];
    bool ok = true;
    if (json_is_string(nj) && json_is_object(args) &&
        nx_out_call_name(json_string_value(nj), 0, json_string_length(nj), name)) {
        nx_out_type_args(args, tools, name);
        char *a = json_dumps(args, JSON_COMPACT);
        json_t *call = a ? json_pack("{s:s, s:{s:s, s:s}}", "type", "function", "function", "name", name,
                                     "arguments", a)
                         : NULL;
        free(a);
        ok = call && json_array_append_new(calls, call) == 0;
    }
    json_decref(obj);
    return ok;
}

json_t *nx_qwen_json_parse_tool_calls(const char *text, size_t len, const json_t *tools) {
    return each_call(text, len, tools, add_json_call);
}
