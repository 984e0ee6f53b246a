/* Hy3 chat output: reasoning / content / tool-call split and the tool-call parser (hy_output.h). */
#include "serve/hy_output.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/strbuf.h"
#include "constrain/tool_grammar.h"

/* Each marker as its opening ("<" or "</") and name: "<" name suffix ">". */
static const char *const marker_open[NX_HY_N_MARKERS] = {
    [NX_HY_THINK_OPEN] = "<",  [NX_HY_THINK_CLOSE] = "</", [NX_HY_CALLS_OPEN] = "<", [NX_HY_CALLS_CLOSE] = "</",
    [NX_HY_CALL_OPEN] = "<",   [NX_HY_CALL_CLOSE] = "</",  [NX_HY_SEP] = "<",        [NX_HY_KEY_OPEN] = "<",
    [NX_HY_KEY_CLOSE] = "</",  [NX_HY_VALUE_OPEN] = "<",   [NX_HY_VALUE_CLOSE] = "</",
};
static const char *const marker_name[NX_HY_N_MARKERS] = {
    [NX_HY_THINK_OPEN] = "think",      [NX_HY_THINK_CLOSE] = "think",    [NX_HY_CALLS_OPEN] = "tool_calls",
    [NX_HY_CALLS_CLOSE] = "tool_calls", [NX_HY_CALL_OPEN] = "tool_call", [NX_HY_CALL_CLOSE] = "tool_call",
    [NX_HY_SEP] = "tool_sep",          [NX_HY_KEY_OPEN] = "arg_key",     [NX_HY_KEY_CLOSE] = "arg_key",
    [NX_HY_VALUE_OPEN] = "arg_value",  [NX_HY_VALUE_CLOSE] = "arg_value",
};

void nx_hy_markers_init(nx_hy_markers *m, const char *suffix, const nx_tokenizer *tok) {
    if (!suffix || strlen(suffix) > 40) suffix = "";
    for (int i = 0; i < NX_HY_N_MARKERS; i++) {
        snprintf(m->text[i], sizeof m->text[i], "%s%s%s>", marker_open[i], marker_name[i], suffix);
        m->id[i] = tok ? nx_tokenizer_token_id(tok, m->text[i]) : -1;
    }
}

bool nx_hy_markers_tools(const nx_hy_markers *m) {
    for (int i = NX_HY_CALLS_OPEN; i <= NX_HY_VALUE_CLOSE; i++)
        if (m->id[i] < 0) return false;
    return true;
}

bool nx_hy_markers_reasoning(const nx_hy_markers *m) {
    return m->id[NX_HY_THINK_OPEN] >= 0 && m->id[NX_HY_THINK_CLOSE] >= 0;
}

void nx_hy_split_init(nx_hy_split *s, const nx_hy_markers *m, bool tools, bool reasoning, int32_t prompt_last) {
    s->m = m;
    s->tools = tools && nx_hy_markers_tools(m);
    s->reasoning = reasoning && nx_hy_markers_reasoning(m);
    s->part = s->reasoning && prompt_last == m->id[NX_HY_THINK_OPEN] ? NX_HY_REASONING : NX_HY_CONTENT;
}

int nx_hy_split_token(nx_hy_split *s, int32_t id, const char **marker) {
    *marker = NULL;
    if (id < 0) return (int)s->part;
    if (s->part == NX_HY_TOOLS) {
        for (int i = 0; i < NX_HY_N_MARKERS; i++)
            if (id == s->m->id[i]) *marker = s->m->text[i];
        return NX_HY_TOOLS;
    }
    if (s->tools && id == s->m->id[NX_HY_CALLS_OPEN]) {
        s->part = NX_HY_TOOLS;
        return -1;
    }
    if (s->reasoning && id == s->m->id[NX_HY_THINK_OPEN]) {
        s->part = NX_HY_REASONING;
        return -1;
    }
    if (s->reasoning && id == s->m->id[NX_HY_THINK_CLOSE]) {
        s->part = NX_HY_CONTENT;
        return -1;
    }
    return (int)s->part;
}

/* ---------------------------------------------------------------- argument types */

enum { T_STRING = NX_ARG_STRING, T_BOOL = NX_ARG_BOOL, T_INT = NX_ARG_INT, T_NUM = NX_ARG_NUM, T_OTHER = NX_ARG_OTHER };

/* s[0..n) without leading and trailing ASCII whitespace, NUL-terminated in buf (cap bytes);
 * NULL when it does not fit. */
static const char *trimmed(const char *s, size_t n, char *buf, size_t cap) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (n + 1 > cap) return NULL;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return buf;
}

static json_t *as_bool(const char *t) {
    if (strcasecmp(t, "true") == 0) return json_true();
    if (strcasecmp(t, "false") == 0) return json_false();
    return NULL;
}

static json_t *as_int(const char *t) {
    const char *p = t + (*t == '-' || *t == '+');
    if (!isdigit((unsigned char)*p)) return NULL;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return NULL;
    errno = 0;
    long long v = strtoll(t, NULL, 10);
    return errno ? NULL : json_integer(v);
}

/* A number: a float when it has '.', 'e' or 'E', an integer otherwise; finite only. */
static json_t *as_number(const char *t) {
    if (!strpbrk(t, ".eE")) return as_int(t);
    if (!*t) return NULL;
    char *end;
    errno = 0;
    double v = strtod(t, &end);
    if (*end || errno || !isfinite(v)) return NULL;
    return json_real(v);
}

static json_t *as_json(const char *s, size_t n) {
    return json_loadb(s, n, JSON_DECODE_ANY, NULL);
}

/* The typed value of raw argument text v[0..n). */
static json_t *typed_value(const char *v, size_t n, int types) {
    char buf[128];
    const char *t = trimmed(v, n, buf, sizeof buf);
    json_t *x = NULL;
    if ((types & T_BOOL) && t && (x = as_bool(t))) return x;
    if ((types & T_INT) && t && (x = as_int(t))) return x;
    if ((types & T_NUM) && t && (x = as_number(t))) return x;
    if ((types & T_OTHER) && (x = as_json(v, n))) return x;
    if (types & T_STRING) return json_stringn(v, n);
    if ((x = as_json(v, n))) return x;
    return json_stringn(v, n);
}

/* ---------------------------------------------------------------- the parser */

/* First occurrence of the NUL-terminated needle in s[from, n), or n. */
static size_t find(const char *s, size_t n, size_t from, const char *needle) {
    const size_t k = strlen(needle);
    for (size_t i = from; i + k <= n; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, k) == 0) return i;
    return n;
}

/* The arguments of one call's body s[0..n): <arg_key>K</arg_key> ws <arg_value>V</arg_value>,
 * repeated; pairs missing a part are skipped. Returned as the compact JSON text OpenAI sends
 * (malloc'd; NULL when memory is short), pairs in the order written. A repeated key stays
 * repeated, so JSON readers take its last value (as a dict built pair by pair does), and the
 * arguments of a growing text only ever gain pairs at the end: a stream of them (the server's
 * tool-call deltas) never has to take back what it sent. */
static char *parse_args(const char *s, size_t n, const nx_hy_markers *m, const json_t *tools, const char *name) {
    nx_strbuf out = {0};
    bool ok = nx_strbuf_puts(&out, "{") == NX_OK;
    const char *ko = m->text[NX_HY_KEY_OPEN], *kc = m->text[NX_HY_KEY_CLOSE];
    const char *vo = m->text[NX_HY_VALUE_OPEN], *vc = m->text[NX_HY_VALUE_CLOSE];
    size_t pos = 0;
    while (ok) {
        const size_t k0 = find(s, n, pos, ko);
        if (k0 == n) break;
        const size_t kb = k0 + strlen(ko), ke = find(s, n, kb, kc);
        if (ke == n) break;
        size_t v0 = ke + strlen(kc);
        while (v0 < n && isspace((unsigned char)s[v0])) v0++;
        if (v0 + strlen(vo) > n || memcmp(s + v0, vo, strlen(vo)) != 0) {
            pos = v0;
            continue;
        }
        const size_t vb = v0 + strlen(vo), vend = find(s, n, vb, vc);
        if (vend == n) break;
        pos = vend + strlen(vc);
        char *key = strndup(s + kb, ke - kb);
        json_t *k = key ? json_string(key) : NULL; /* NULL also for a key that is not UTF-8 */
        json_t *val = k ? typed_value(s + vb, vend - vb, nx_tool_arg_types(nx_tool_arg_schema(tools, name, key))) : NULL;
        char *ks = val ? json_dumps(k, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        char *vs = ks ? json_dumps(val, JSON_COMPACT | JSON_ENCODE_ANY) : NULL; /* NULL: text not UTF-8 */
        if (vs)
            ok = nx_strbuf_printf(&out, "%s%s:%s", out.len > 1 ? "," : "", ks, vs) == NX_OK;
        free(vs);
        free(ks);
        json_decref(val);
        json_decref(k);
        free(key);
    }
    if (ok) ok = nx_strbuf_puts(&out, "}") == NX_OK;
    if (!ok) {
        nx_strbuf_free(&out);
        return NULL;
    }
    return nx_strbuf_take(&out);
}

json_t *nx_hy_parse_tool_calls(const char *text, size_t len, const nx_hy_markers *m, const json_t *tools) {
    json_t *calls = json_array();
    if (!calls) return NULL;
    const char *co = m->text[NX_HY_CALL_OPEN], *cc = m->text[NX_HY_CALL_CLOSE], *sep = m->text[NX_HY_SEP];
    size_t pos = 0;
    while (pos < len) {
        const size_t c0 = find(text, len, pos, co);
        if (c0 == len) break;
        const size_t nb = c0 + strlen(co), s0 = find(text, len, nb, sep);
        if (s0 == len) break;
        const size_t bb = s0 + strlen(sep);
        size_t be = find(text, len, bb, cc);
        pos = be == len ? len : be + strlen(cc);
        if (be == len) { /* cut short: up to the end, less a closing </tool_calls> */
            const size_t z = find(text, len, bb, m->text[NX_HY_CALLS_CLOSE]);
            be = z;
        }
        char buf[256];
        const char *name = trimmed(text + nb, s0 - nb, buf, sizeof buf);
        json_t *valid = name && *name ? json_string(name) : NULL; /* NULL: empty, or not UTF-8 */
        if (!valid) continue;
        json_decref(valid);
        char *args_s = parse_args(text + bb, be - bb, m, tools, name);
        json_t *call = args_s ? json_pack("{s:s, s:{s:s, s:s}}", "type", "function", "function", "name", name,
                                          "arguments", args_s)
                              : NULL;
        free(args_s);
        if (!call || json_array_append_new(calls, call) != 0) {
            json_decref(calls);
            return NULL;
        }
    }
    return calls;
}
