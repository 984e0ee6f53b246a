/* Tool-call arguments: the recogniser (see tool_grammar.h) and the argument types the server's
 * call parser reads values by. */
#include "constrain/tool_grammar.h"

#include <ctype.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "constrain/pattern.h"

/* ---------------------------------------------------------------- argument types */

static int type_bit(const char *t) {
    static const struct {
        const char *name;
        int bit;
    } alias[] = {{"string", NX_ARG_STRING}, {"str", NX_ARG_STRING},  {"text", NX_ARG_STRING},
                 {"varchar", NX_ARG_STRING}, {"char", NX_ARG_STRING}, {"enum", NX_ARG_STRING},
                 {"boolean", NX_ARG_BOOL},   {"bool", NX_ARG_BOOL},   {"binary", NX_ARG_BOOL},
                 {"integer", NX_ARG_INT},    {"int", NX_ARG_INT},     {"number", NX_ARG_NUM},
                 {"float", NX_ARG_NUM},      {"double", NX_ARG_NUM},  {"null", 0}};
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (strcmp(t, alias[i].name) == 0) return alias[i].bit;
    static const char *const int_prefix[] = {"int", "uint", "long", "short", "unsigned"};
    char low[32];
    size_t n = 0;
    for (; t[n] && n + 1 < sizeof low; n++) low[n] = (char)tolower((unsigned char)t[n]);
    low[n] = '\0';
    for (size_t i = 0; i < sizeof int_prefix / sizeof int_prefix[0]; i++)
        if (strncmp(low, int_prefix[i], strlen(int_prefix[i])) == 0) return NX_ARG_INT;
    if (strncmp(low, "num", 3) == 0 || strncmp(low, "float", 5) == 0) return NX_ARG_NUM;
    return NX_ARG_OTHER; /* array, object, list, dict, map, or a type of the tool's own */
}

const json_t *nx_tool_arg_schema(const json_t *tools, const char *name, const char *key) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const char *fname = json_string_value(json_object_get(f, "name"));
        if (!fname || strcmp(fname, name) != 0) continue;
        return json_object_get(json_object_get(json_object_get(f, "parameters"), "properties"), key);
    }
    return NULL;
}

int nx_tool_arg_types(const json_t *schema) {
    if (!json_is_object(schema)) return NX_ARG_STRING;
    const json_t *type = json_object_get(schema, "type");
    int bits = 0;
    if (json_is_string(type)) return type_bit(json_string_value(type));
    if (json_is_array(type)) {
        size_t i;
        const json_t *x;
        json_array_foreach(type, i, x) if (json_is_string(x)) bits |= type_bit(json_string_value(x));
        return bits;
    }
    const json_t *opts = json_object_get(schema, "anyOf");
    if (!json_is_array(opts)) opts = json_object_get(schema, "oneOf");
    if (!json_is_array(opts)) return NX_ARG_STRING;
    size_t i;
    const json_t *o;
    json_array_foreach(opts, i, o) {
        const json_t *ot = json_object_get(o, "type");
        bits |= json_is_string(ot) ? type_bit(json_string_value(ot)) : NX_ARG_STRING;
    }
    return bits;
}

/* ---------------------------------------------------------------- grammars */

#define MAX_WS 4        /* whitespace bytes between two markers */
#define MAX_FREE_KEY 128 /* bytes of a key where any key goes */

typedef struct tg_prop {
    char *name;
    size_t len;
    bool required;
    int node; /* the value's schema node, or -1: raw text */
    char **lits; /* raw text under an enum (or const) of strings: one of these, whole */
    size_t *lit_len;
    int n_lits;
    const nx_pattern *pat; /* raw text under a pattern or format (else NULL): */
    nx_pattern *own;       /* compiled here, or (NULL) the compiled schema's */
    int32_t min_len, max_len; /* raw text: code points at least and at most (-1: no limit) */
} tg_prop;

typedef struct tg_tool {
    char *name;
    size_t len;
    nx_json_schema *schema; /* NULL: the parameters did not compile (values are text) */
    tg_prop *props;
    int n_props;
    bool free_keys; /* no properties listed: any keys */
} tg_tool;

struct nx_tool_grammar {
    nx_tool_markers mk;
    const nx_json_vocab *v;
    tg_tool *tools;
    int n_tools;
    int only; /* the named tool, or -1 */
};

/* TS_ARGS: json_args' arguments object (TS_JSON: one property's value) */
enum { TS_NAME, TS_BODY, TS_KEY, TS_AFTER_KEY, TS_TEXT, TS_JSON, TS_ARGS, TS_AFTER_CALL, TS_END, TS_DEAD };

void nx_tool_grammar_free(nx_tool_grammar *g) {
    if (!g) return;
    for (int i = 0; i < g->n_tools; i++) {
        tg_tool *t = &g->tools[i];
        free(t->name);
        for (int k = 0; k < t->n_props; k++) {
            tg_prop *p = &t->props[k];
            for (int l = 0; l < p->n_lits; l++) free(p->lits[l]);
            free(p->lits);
            free(p->lit_len);
            nx_pattern_free(p->own);
            free(p->name);
        }
        free(t->props);
        nx_json_schema_free(t->schema);
    }
    free(g->tools);
    free(g);
}

/* A raw-text property's literals: its schema's "enum" (or "const") when every one is a string
 * (at most 64, UTF-8 without NUL); none otherwise. */
static nx_status text_lits(tg_prop *p, const json_t *schema, nx_error *err) {
    json_t *one = NULL;
    const json_t *e = json_object_get(schema, "enum");
    if (!json_is_array(e) && json_is_string(json_object_get(schema, "const")))
        e = one = json_pack("[O]", json_object_get(schema, "const"));
    size_t n = json_array_size(e), i;
    const json_t *v;
    bool all = n > 0 && n <= 64;
    json_array_foreach(e, i, v) all = all && json_is_string(v);
    if (all && (!(p->lits = calloc(n, sizeof *p->lits)) || !(p->lit_len = calloc(n, sizeof *p->lit_len)))) {
        json_decref(one);
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    }
    for (i = 0; all && i < n; i++) {
        p->lit_len[i] = json_string_length(json_array_get(e, i));
        if (!(p->lits[i] = strdup(json_string_value(json_array_get(e, i))))) {
            json_decref(one);
            return nx_fail(err, NX_E_NOMEM, "out of memory");
        }
        p->n_lits = (int)i + 1;
    }
    json_decref(one);
    return NX_OK;
}

/* A raw-text property's lengths (minLength / maxLength, counted as the text goes) and pattern:
 * the automaton the JSON-mode compiler made for its node (pattern or format, lengths included),
 * else its pattern compiled here (one that pattern.h refuses leaves the text free, as parameters
 * the JSON-mode compiler refuses do). */
static void text_rules(tg_prop *p, const json_t *schema, const nx_pattern *compiled) {
    const json_t *re = json_object_get(schema, "pattern"), *lo = json_object_get(schema, "minLength"),
                 *hi = json_object_get(schema, "maxLength");
    p->min_len = 0, p->max_len = -1;
    if (p->n_lits) return;
    const json_int_t min = json_is_integer(lo) ? json_integer_value(lo) : 0, max = json_is_integer(hi) ? json_integer_value(hi) : -1;
    if (min >= 0 && min <= 65535 && max <= 65535 && (max < 0 || max >= min)) p->min_len = (int32_t)min, p->max_len = (int32_t)max;
    if ((p->pat = compiled) || !json_is_string(re)) return;
    char err[128];
    p->pat = p->own = nx_pattern_compile(json_string_value(re), json_string_length(re), 0, -1, err, sizeof err);
}

/* How many "pattern" and "format" keys schema holds at any depth: each can cost a pattern
 * automaton of up to NX_PATTERN_MAX_STATES states. */
static int count_patterns(const json_t *schema) {
    int n = 0;
    const char *key;
    json_t *v;
    size_t i;
    if (json_is_array(schema)) json_array_foreach(schema, i, v) n += count_patterns(v);
    if (json_is_object(schema))
        json_object_foreach((json_t *)schema, key, v) n += (!strcmp(key, "pattern") || !strcmp(key, "format")) + count_patterns(v);
    return n;
}

/* Whether a property's value is raw text: Hy3 reads it as a string when its types have one;
 * GLM (string_exact) only when its "type" is exactly "string". */
static bool is_text(const json_t *schema, bool string_exact) {
    if (!string_exact) return (nx_tool_arg_types(schema) & NX_ARG_STRING) != 0;
    const char *type = json_string_value(json_object_get(schema, "type"));
    return type && strcmp(type, "string") == 0;
}

/* Tool t's properties from its parameters: names, order and required from the compiled schema
 * when it compiles (values of non-string properties then read as JSON of their node), else from
 * the JSON itself (every value text). */
static nx_status tool_props(tg_tool *t, const json_t *params, bool string_exact, nx_error *err) {
    const json_t *props = json_object_get(params, "properties");
    if (!json_is_object(props) || json_object_size(props) == 0) {
        t->free_keys = true;
        return NX_OK;
    }
    char *text = json_dumps(params, JSON_COMPACT);
    nx_error ignored = {0};
    if (!text || nx_json_schema_new(text, strlen(text), &t->schema, &ignored) != NX_OK) t->schema = NULL;
    free(text);
    const size_t n = t->schema ? (size_t)nx_json_schema_n_props(t->schema) : json_object_size(props);
    if (n > 64) return nx_fail(err, NX_E_ARG, "tool '%s': more than 64 properties", t->name);
    if (!(t->props = calloc(n ? n : 1, sizeof *t->props))) return nx_fail(err, NX_E_NOMEM, "out of memory");
    const json_t *req = json_object_get(params, "required");
    const char *key;
    const json_t *val;
    size_t i = 0;
    json_object_foreach((json_t *)props, key, val) {
        if (i == n) break;
        tg_prop *p = &t->props[i];
        const char *name = key;
        const nx_pattern *compiled = NULL;
        p->node = -1;
        if (t->schema) {
            name = nx_json_schema_prop(t->schema, (int)i, &p->len, &p->required, &p->node);
            if (is_text(json_object_get(props, name), string_exact)) {
                compiled = nx_json_schema_pattern(t->schema, p->node);
                p->node = -1;
            }
        } else {
            p->len = strlen(key);
            size_t k;
            const json_t *r;
            json_array_foreach(req, k, r) if (json_is_string(r) && strcmp(json_string_value(r), key) == 0) p->required = true;
        }
        if (!(p->name = strdup(name))) return nx_fail(err, NX_E_NOMEM, "out of memory");
        t->n_props = (int)++i;
        nx_status st;
        if (p->node < 0 && (st = text_lits(p, json_object_get(props, name), err)) != NX_OK) return st;
        if (p->node < 0) text_rules(p, json_object_get(props, name), compiled);
    }
    return NX_OK;
}

bool nx_tool_marker_used(const nx_tool_markers *mk, int i) {
    switch (i) {
    case NX_TM_SEP: return !mk->newline_sep && !mk->bare_name;
    case NX_TM_CALLS_CLOSE: return !mk->open_end;
    case NX_TM_KEY_OPEN:
    case NX_TM_KEY_CLOSE:
    case NX_TM_VALUE_OPEN:
    case NX_TM_VALUE_CLOSE: return !mk->json_args;
    default: return true;
    }
}

nx_status nx_tool_grammar_new(const json_t *tools, const char *only, const nx_tool_markers *mk,
                              const nx_json_vocab *vocab, nx_tool_grammar **out, nx_error *err) {
    *out = NULL;
    for (int i = 0; i < NX_TM_N; i++)
        if (mk->id[i] < 0 && nx_tool_marker_used(mk, i))
            return nx_fail(err, NX_E_ARG, "tool grammar: the tokenizer lacks a tool-call marker");
    if (!json_is_array(tools) || json_array_size(tools) == 0 || json_array_size(tools) > NX_TOOL_MAX)
        return nx_fail(err, NX_E_ARG, "tool grammar: 1 to %d tools are needed", NX_TOOL_MAX);
    nx_tool_grammar *g = calloc(1, sizeof *g);
    if (!g || !(g->tools = calloc(json_array_size(tools), sizeof *g->tools))) {
        free(g);
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    }
    g->mk = *mk;
    for (int k = 0; k < NX_TM_N; k++)
        if (!nx_tool_marker_used(mk, k)) g->mk.id[k] = -1;
    g->v = vocab;
    g->only = -1;
    size_t i;
    const json_t *tool;
    int patterns = 0;
    json_array_foreach(tools, i, tool) {
        const json_t *f = json_object_get(tool, "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        if (only && name && strcmp(only, name) != 0) continue; /* a named call needs that tool alone */
        tg_tool *t = &g->tools[g->n_tools];
        if (!name || !*name || !(t->name = strdup(name))) {
            nx_tool_grammar_free(g);
            return name && *name ? nx_fail(err, NX_E_NOMEM, "out of memory")
                                 : nx_fail(err, NX_E_ARG, "tool grammar: tool %zu has no name", i);
        }
        t->len = strlen(name);
        g->n_tools++;
        const json_t *params = json_object_get(f, "parameters");
        /* counted before compiling: pattern automata are the costly part (up to ~0.1 s each) */
        nx_status st = (patterns += count_patterns(params)) > NX_TOOL_MAX_PATTERNS
                           ? nx_fail(err, NX_E_ARG, "tool grammar: the tools' parameters hold more than %d patterns "
                                     "and formats in all", NX_TOOL_MAX_PATTERNS)
                           : tool_props(t, params, mk->string_exact, err);
        if (st != NX_OK) {
            nx_tool_grammar_free(g);
            return st;
        }
        if (only) g->only = g->n_tools - 1;
    }
    if (only && g->only < 0) {
        nx_tool_grammar_free(g);
        return nx_fail(err, NX_E_ARG, "tool grammar: no tool is named '%.60s'", only);
    }
    *out = g;
    return NX_OK;
}

/* ---------------------------------------------------------------- the recogniser */

/* json_args: the call's arguments object begins. */
static void open_args(const nx_tool_grammar *g, nx_tool_state *st) {
    st->mode = TS_ARGS;
    nx_json_init_schema(&st->js, g->tools[st->tool].schema);
}

void nx_tool_init(const nx_tool_grammar *g, nx_tool_state *st) {
    memset(st, 0, sizeof *st);
    st->prop = -1;
    if (g->only >= 0) {
        st->mode = TS_BODY;
        st->tool = (int16_t)g->only;
        if (g->mk.json_args) open_args(g, st);
    } else {
        st->mode = TS_NAME;
        st->tool = -1;
        st->cand = g->n_tools >= 64 ? ~0ull : (1ull << g->n_tools) - 1;
    }
}

bool nx_tool_done(const nx_tool_state *st) { return st->mode == TS_END; }

bool nx_tool_can_end(const nx_tool_grammar *g, const nx_tool_state *st) {
    return st->mode == TS_END || (st->mode == TS_AFTER_CALL && g->mk.open_end);
}

static bool dead(nx_tool_state *st) {
    st->mode = TS_DEAD;
    return false;
}

static bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Candidate i of the name being read: a tool's (TS_NAME), a property of the tool called
 * (TS_KEY), or a literal of the property whose text is read (TS_TEXT). */
static const char *cand_name(const nx_tool_grammar *g, const nx_tool_state *st, int i, size_t *len) {
    if (st->mode == TS_NAME) {
        *len = g->tools[i].len;
        return g->tools[i].name;
    }
    if (st->mode == TS_TEXT) {
        const tg_prop *v = &g->tools[st->tool].props[st->prop];
        *len = v->lit_len[i];
        return v->lits[i];
    }
    const tg_prop *p = &g->tools[st->tool].props[i];
    *len = p->len;
    return p->name;
}

/* Keeps the candidates whose byte at cpos is c. */
static bool match_byte(const nx_tool_grammar *g, nx_tool_state *st, uint8_t c) {
    uint64_t keep = 0;
    for (int i = 0; i < 64 && st->cand >> i; i++) {
        size_t len;
        const char *s = (st->cand >> i & 1) ? cand_name(g, st, i, &len) : NULL;
        if (s && st->cpos < len && (uint8_t)s[st->cpos] == c) keep |= 1ull << i;
    }
    st->cand = keep;
    st->cpos++;
    return keep ? true : dead(st);
}

/* The candidate whose whole name the cpos bytes are, or -1 (names are distinct). */
static int exact(const nx_tool_grammar *g, const nx_tool_state *st) {
    for (int i = 0; i < 64 && st->cand >> i; i++) {
        size_t len;
        if ((st->cand >> i & 1) && (cand_name(g, st, i, &len), len == st->cpos)) return i;
    }
    return -1;
}

/* The name read so far is a whole tool's name: the call's body follows. */
static bool name_ends(const nx_tool_grammar *g, nx_tool_state *st) {
    const int i = exact(g, st);
    if (i < 0) return dead(st);
    st->mode = TS_BODY, st->tool = (int16_t)i, st->next = 0, st->cand = 0, st->cpos = 0;
    if (g->mk.json_args) open_args(g, st);
    return true;
}

/* Text: one more byte of well-formed UTF-8 (RFC 3629: no overlongs, surrogates or values past
 * U+10FFFF), not NUL. */
static bool utf8_byte(nx_tool_state *st, uint8_t c) {
    if (st->u8left) {
        if (c < st->u8lo || c > st->u8hi) return dead(st);
        st->u8left--, st->u8lo = 0x80, st->u8hi = 0xbf;
        return true;
    }
    if (c >= 0x01 && c < 0x80) return true;
    st->u8lo = 0x80, st->u8hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) st->u8left = 1;
    else if (c >= 0xe0 && c <= 0xef) st->u8left = 2, st->u8lo = c == 0xe0 ? 0xa0 : 0x80, st->u8hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4) st->u8left = 3, st->u8lo = c == 0xf0 ? 0x90 : 0x80, st->u8hi = c == 0xf4 ? 0x8f : 0xbf;
    else return dead(st);
    return true;
}

static bool step_byte(const nx_tool_grammar *g, nx_tool_state *st, uint8_t c) {
    const tg_tool *t = st->tool >= 0 ? &g->tools[st->tool] : NULL;
    switch (st->mode) {
    case TS_NAME:
        if (c == '\n' && g->mk.newline_sep) return name_ends(g, st) ? (st->ws = 1, true) : false;
        return match_byte(g, st, c);
    case TS_KEY:
        if (t->free_keys) return ++st->cpos <= MAX_FREE_KEY ? utf8_byte(st, c) : dead(st);
        return match_byte(g, st, c);
    case TS_TEXT: {
        if (st->cand) return match_byte(g, st, c);
        const tg_prop *p = st->prop >= 0 ? &t->props[st->prop] : NULL;
        if (p && p->pat && !(st->pst = nx_pattern_step(p->pat, st->pst, c))) return dead(st);
        /* a new character, counted where the property limits them (elsewhere the state stays put,
         * so a free text's mask is computed once) */
        if (!st->u8left && p && (p->min_len > 0 || p->max_len >= 0) && st->chars < UINT16_MAX &&
            ++st->chars > p->max_len && p->max_len >= 0)
            return dead(st);
        return utf8_byte(st, c);
    }
    case TS_JSON:
    case TS_ARGS: return nx_json_step(&st->js, c) ? true : dead(st);
    case TS_BODY:
    case TS_AFTER_KEY:
    case TS_AFTER_CALL: return is_ws(c) && ++st->ws <= MAX_WS ? true : dead(st);
    default: return dead(st);
    }
}

/* A marker: where it may stand, and where it leads. */
static bool step_marker(const nx_tool_grammar *g, nx_tool_state *st, int32_t id) {
    const int32_t *m = g->mk.id;
    const tg_tool *t = st->tool >= 0 ? &g->tools[st->tool] : NULL;
    st->ws = 0;
    if (id == m[NX_TM_SEP] && st->mode == TS_NAME) return name_ends(g, st);
    /* bare_name: the marker after the name ends it, then acts in the body */
    if (st->mode == TS_NAME && g->mk.bare_name && (id == m[NX_TM_KEY_OPEN] || id == m[NX_TM_CALL_CLOSE])) {
        if (!name_ends(g, st)) return false;
        t = &g->tools[st->tool];
    }
    if (id == m[NX_TM_KEY_OPEN] && st->mode == TS_BODY) {
        st->cand = 0, st->cpos = 0;
        if (!t->free_keys) /* from the first key still allowed up to the first required one */
            for (int i = st->next; i < t->n_props; i++) {
                st->cand |= 1ull << i;
                if (t->props[i].required) break;
            }
        if (!t->free_keys && !st->cand) return dead(st);
        st->mode = TS_KEY;
        return true;
    }
    if (id == m[NX_TM_KEY_CLOSE] && st->mode == TS_KEY) {
        int i = -1;
        if (!t->free_keys) {
            if ((i = exact(g, st)) < 0) return dead(st);
            st->next = (int16_t)(i + 1);
        } else if (st->cpos == 0 || st->u8left) {
            return dead(st);
        }
        st->mode = TS_AFTER_KEY, st->prop = (int16_t)i, st->cand = 0, st->cpos = 0, st->u8lo = st->u8hi = 0;
        return true;
    }
    if (id == m[NX_TM_VALUE_OPEN] && st->mode == TS_AFTER_KEY) {
        const int node = st->prop >= 0 ? t->props[st->prop].node : -1;
        if (node >= 0) {
            nx_json_init_value(&st->js, t->schema, node);
            st->mode = TS_JSON;
        } else {
            const tg_prop *p = st->prop >= 0 ? &t->props[st->prop] : NULL;
            const int nl = p ? p->n_lits : 0;
            st->mode = TS_TEXT;
            st->cand = nl >= 64 ? ~0ull : (1ull << nl) - 1; /* 0: any text */
            st->pst = p && p->pat ? p->pat->start : 0;
        }
        return true;
    }
    const tg_prop *tp = st->mode == TS_TEXT && st->prop >= 0 ? &t->props[st->prop] : NULL;
    const bool text_ends = st->mode == TS_TEXT && !st->u8left && (!st->cand || exact(g, st) >= 0) &&
                           (!tp || ((!tp->pat || tp->pat->accept[st->pst]) && st->chars >= tp->min_len));
    if (id == m[NX_TM_VALUE_CLOSE] && (text_ends || (st->mode == TS_JSON && nx_json_can_end(&st->js)))) {
        memset(&st->js, 0, sizeof st->js);
        st->mode = TS_BODY, st->prop = -1, st->u8lo = st->u8hi = 0, st->cand = 0, st->cpos = 0, st->pst = 0, st->chars = 0;
        return true;
    }
    if (id == m[NX_TM_CALL_CLOSE] && st->mode == TS_ARGS && nx_json_complete(&st->js)) {
        memset(&st->js, 0, sizeof st->js);
        st->mode = TS_AFTER_CALL;
        return true;
    }
    if (id == m[NX_TM_CALL_CLOSE] && st->mode == TS_BODY) {
        for (int i = st->next; i < t->n_props; i++)
            if (t->props[i].required) return dead(st);
        st->mode = TS_AFTER_CALL;
        return true;
    }
    if (id == m[NX_TM_CALL_OPEN] && st->mode == TS_AFTER_CALL && g->only < 0) {
        nx_tool_init(g, st);
        return true;
    }
    if (id == m[NX_TM_CALLS_CLOSE] && st->mode == TS_AFTER_CALL) {
        st->mode = TS_END, st->tool = -1, st->next = 0;
        return true;
    }
    return dead(st);
}

static bool is_marker(const nx_tool_grammar *g, int32_t id) {
    for (int i = 0; i < NX_TM_N; i++)
        if (g->mk.id[i] == id) return true;
    return false;
}

bool nx_tool_step(const nx_tool_grammar *g, nx_tool_state *st, int32_t id) {
    if (st->mode == TS_DEAD) return false;
    if (is_marker(g, id)) return step_marker(g, st, id);
    const nx_json_vocab *v = g->v;
    if (id < 0 || id >= v->n) return dead(st);
    if (v->end[id]) return nx_tool_can_end(g, st) ? (st->mode = TS_END, true) : dead(st);
    if (!v->bytes[id] || v->len[id] == 0) return dead(st);
    for (uint32_t k = 0; k < v->len[id]; k++)
        if (!step_byte(g, st, v->bytes[id][k])) return false;
    return true;
}

/* The state without its JSON reading (the part a byte outside a JSON value steps). */
#define TS_HEAD offsetof(nx_tool_state, js)

void nx_tool_allowed(const nx_tool_grammar *g, const nx_tool_state *st, int32_t n_tokens, uint8_t *allow) {
    memset(allow, 0, (size_t)n_tokens);
    const nx_json_vocab *v = g->v;
    const int32_t n = v->n < n_tokens ? v->n : n_tokens;
    bool any = false;
    if (st->mode == TS_END) {
        for (int32_t i = 0; i < n; i++) allow[i] = v->end[i];
        return;
    }
    if (nx_tool_can_end(g, st)) /* open_end: the output may end after any call */
        for (int32_t i = 0; i < n; i++)
            if (v->end[i]) allow[i] = 1, any = true;
    nx_tool_state t;
    /* text: most tokens are refused on their first byte */
    if (st->mode == TS_JSON || st->mode == TS_ARGS) {
        nx_json_state js;
        uint8_t first[256];
        for (int c = 0; c < 256; c++) {
            nx_json_copy(&js, &st->js);
            first[c] = nx_json_step(&js, (uint8_t)c);
        }
        for (int32_t i = 0; i < n; i++) {
            if (!v->bytes[i] || v->len[i] == 0 || !first[v->bytes[i][0]]) continue;
            nx_json_copy(&js, &st->js);
            if (nx_json_feed(&js, v->bytes[i], v->len[i])) allow[i] = 1, any = true;
        }
    } else {
        uint8_t first[256];
        for (int c = 0; c < 256; c++) {
            memcpy(&t, st, TS_HEAD);
            first[c] = step_byte(g, &t, (uint8_t)c);
        }
        for (int32_t i = 0; i < n; i++) {
            if (!v->bytes[i] || v->len[i] == 0 || !first[v->bytes[i][0]]) continue;
            memcpy(&t, st, TS_HEAD);
            bool ok = true;
            for (uint32_t k = 0; ok && k < v->len[i]; k++) ok = step_byte(g, &t, v->bytes[i][k]);
            if (ok) allow[i] = 1, any = true;
        }
    }
    for (int k = 0; k < NX_TM_N; k++) {
        const int32_t mid = g->mk.id[k];
        if (mid < 0 || mid >= n_tokens) continue;
        t = *st;
        if (step_marker(g, &t, mid)) allow[mid] = 1, any = true;
    }
    if (!any) /* a vocabulary without the bytes needed: let the generation end */
        for (int32_t i = 0; i < n; i++) allow[i] = v->end[i];
}
