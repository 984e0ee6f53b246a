/* JSON mode: the recogniser (see json_grammar.h) and the vocabulary tables it masks with. */
#include "constrain/json_grammar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <stdio.h>

#include "base/error.h"
#include "constrain/pattern.h"

/* ---------------------------------------------------------------- compiled schemas */

enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_NUMBER = 8, T_INTEGER = 16, T_BOOLEAN = 32, T_NULL = 64, T_ANY = 127 };

typedef struct js_prop {
    char *name;
    uint32_t len;
    int16_t node;
    bool required;
} js_prop;

typedef struct js_node {
    int16_t ref;         /* >= 0: this node is that node ($ref, a one-schema allOf); the rest unused */
    uint8_t types;       /* T_* the value may have */
    bool keyed;          /* object with "properties": only those keys, in order */
    int16_t items;       /* array: the items' node (-1: any value) */
    int16_t addl;        /* object without properties: every value's node (additionalProperties
                          * as a schema: a dict; -1: any keys and values) */
    int16_t names;       /* object without properties: every key's node (propertyNames; -1: any) */
    int16_t max_props;   /* object without properties: keys at most (maxProperties; -1: no limit) */
    bool min_one;        /* object without properties: at least one key (minProperties 1) */
    int32_t prop0, n_props;
    int32_t lit0, n_lits; /* enum / const: the values, serialised (then only those) */
    uint8_t min_items, max_items; /* max 0: no limit */
    bool unique;                  /* uniqueItems (items are enum / const values: no literal twice) */
    uint16_t min_len;             /* string values: code points at least, */
    int32_t max_len;              /* and at most (-1: no limit) */
    bool has_min, has_max;        /* integer values: bounds (within ±10^15) */
    int64_t imin, imax;
    bool has_nmin, has_nmax;      /* number values: bounds in units of 10^-9 (within ±10^9) */
    int64_t nmin, nmax;
    int32_t pattern;              /* string values: patterns[pattern] (-1: none), lengths included */
    int32_t alt0, n_alts; /* anyOf / oneOf: the branches (alts[alt0..]), each a value's first
                           * byte can start followed as its own path; then only those */
} js_node;

struct nx_json_schema {
    js_node *nodes;
    int32_t n_nodes;
    js_prop *props;
    int32_t n_props;
    char **lits;
    uint32_t *lit_len;
    int32_t n_lits;
    int16_t *alts;    /* anyOf branches' nodes */
    uint8_t *alt_cls; /* and the C_* first bytes each can start with */
    int32_t n_alts;
    nx_pattern **patterns;
    int32_t n_patterns;
};

enum {
    M_KEY,       /* a key of a schema object, matched against its properties */
    M_ENUM,      /* an enum value, matched against its literals */
    M_START,     /* before the top-level object: '{' */
    M_VALUE,     /* a value */
    M_OBJ_FIRST, /* after '{': a key or '}' */
    M_OBJ_KEY,   /* after ',' in an object: a key */
    M_COLON,     /* after a key */
    M_ARR_FIRST, /* after '[': a value or ']' */
    M_AFTER,     /* after a value: ',' or the container's close */
    M_STRING,
    M_NUMBER,
    M_LITERAL,
    M_DONE, /* the top-level object is closed */
    M_DEAD,
};

enum { S_PLAIN, S_ESC, S_HEX, S_UTF8 };                                    /* strings */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };       /* numbers */

static const char *const literals[3] = {"true", "false", "null"};

void nx_json_init_schema(nx_json_state *st, const nx_json_schema *schema) {
    memset(st, 0, sizeof *st);
    st->n = 1;
    nx_json_path *s = &st->path[0];
    s->mode = M_START;
    s->schema = schema;
    s->vnode = schema ? 0 : -1;
}

void nx_json_init(nx_json_state *s) { nx_json_init_schema(s, NULL); }

void nx_json_init_value(nx_json_state *st, const nx_json_schema *schema, int node) {
    nx_json_init_schema(st, schema);
    st->path[0].mode = M_VALUE;
    st->path[0].vnode = (int16_t)node;
}

/* Node n, through its references (the compiler refuses reference cycles). */
static const js_node *schema_node(const nx_json_schema *S, int n) {
    while (S->nodes[n].ref >= 0) n = S->nodes[n].ref;
    return &S->nodes[n];
}

static const js_node *node_of(const nx_json_path *s, int n) {
    return s->schema && n >= 0 ? schema_node(s->schema, n) : NULL;
}

/* The schema node of the innermost open container, or NULL when it is unconstrained. */
static const js_node *frame_node(const nx_json_path *s) {
    return s->depth ? node_of(s, s->node[s->depth - 1]) : NULL;
}

bool nx_json_complete(const nx_json_state *s) {
    for (int i = 0; i < s->n; i++)
        if (s->path[i].mode == M_DONE) return true;
    return false;
}

/* ---------------------------------------------------------------- the root's properties */

/* The root object's properties with their names (NUL-terminated), whether required, and the
 * node a value of each must match (for nx_json_init_value). */
int nx_json_schema_n_props(const nx_json_schema *S) {
    const js_node *top = schema_node(S, 0);
    return top->keyed ? top->n_props : 0;
}

const char *nx_json_schema_prop(const nx_json_schema *S, int i, size_t *len, bool *required, int *node) {
    const js_prop *pr = &S->props[schema_node(S, 0)->prop0 + i];
    *len = pr->len;
    *required = pr->required;
    *node = pr->node;
    return pr->name;
}

const nx_pattern *nx_json_schema_pattern(const nx_json_schema *S, int node) {
    const js_node *nd = schema_node(S, node);
    return nd->pattern >= 0 ? S->patterns[nd->pattern] : NULL;
}

/* An object node without properties that still constrains its keys, values or their count. */
static bool is_dict(const js_node *nd) { return nd->addl >= 0 || nd->names >= 0 || nd->max_props >= 0 || nd->min_one; }

/* Every literal of enum node nd, as a mask. */
static uint64_t all_lits(const js_node *nd) { return nd->n_lits >= 64 ? ~0ull : (1ull << nd->n_lits) - 1; }

/* The innermost open container is an array whose items must differ (uniqueItems): its items
 * are literals, so it is the innermost container for as long as it is open, and s->uniq holds
 * the literals it has. */
static bool in_unique_array(const nx_json_path *s) {
    const js_node *fr = frame_node(s);
    return fr && fr->unique && s->stack[s->depth - 1] == 'a';
}

static bool dead(nx_json_path *s) {
    s->mode = M_DEAD;
    return false;
}

static bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static int hex_value(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool push(nx_json_path *s, uint8_t kind, int node) {
    if (s->depth == NX_JSON_MAX_DEPTH) return dead(s);
    const js_node *nd = node_of(s, node);
    if (kind == 'o' && nd && !nd->keyed && !is_dict(nd)) node = -1; /* no properties: any keys */
    s->stack[s->depth] = kind;
    s->node[s->depth] = (int16_t)node;
    s->next[s->depth] = 0;
    s->depth++;
    s->mode = kind == 'o' ? M_OBJ_FIRST : M_ARR_FIRST;
    s->vnode = kind == 'a' && nd ? nd->items : -1;
    if (kind == 'a' && nd && nd->unique) s->uniq = 0;
    return true;
}

/* A value ends: back to its container (an array counts it), or done at the top. */
static void value_done(nx_json_path *s) {
    s->cand = 0, s->cpos = 0, s->integer = false;
    if (s->depth == 0) {
        s->mode = M_DONE;
        return;
    }
    if (s->stack[s->depth - 1] == 'a' && s->next[s->depth - 1] < 255) s->next[s->depth - 1]++;
    s->mode = M_AFTER;
}

/* A key ends: its value follows (a dict's values under its additionalProperties), and a dict
 * counts its keys (for maxProperties / minProperties). */
static void key_done(nx_json_path *s) {
    const js_node *fr = frame_node(s);
    s->mode = M_COLON;
    s->key = false;
    s->cand = 0, s->cpos = 0;
    s->vnode = fr ? fr->addl : -1;
    if (fr && !fr->keyed && s->next[s->depth - 1] < 255) s->next[s->depth - 1]++;
}

static bool close_container(nx_json_path *s, uint8_t kind) {
    if (s->depth == 0 || s->stack[s->depth - 1] != kind) return dead(s);
    const js_node *nd = frame_node(s);
    const uint8_t n = s->next[s->depth - 1];
    if (nd && kind == 'o')
        for (int32_t i = n; i < nd->n_props; i++)
            if (s->schema->props[nd->prop0 + i].required) return dead(s); /* a required key is missing */
    if (nd && kind == 'a' && n < nd->min_items) return dead(s);
    if (nd && kind == 'o' && !nd->keyed && nd->min_one && n == 0) return dead(s); /* minProperties */
    s->depth--;
    s->node[s->depth] = 0, s->next[s->depth] = 0, s->stack[s->depth] = 0;
    value_done(s);
    return true;
}

static bool enum_byte(nx_json_path *s, uint8_t c);

/* A key starts in a schema object: the candidates are the properties from the first one still
 * allowed up to the first required one (which cannot be skipped). */
static bool key_start(nx_json_path *s) {
    const js_node *nd = frame_node(s);
    s->key = true;
    if (!nd || !nd->keyed) { /* any key, or a dict's key under its propertyNames */
        if (nd && nd->max_props == 0) return dead(s); /* maxProperties 0: none (later keys: at the comma) */
        const js_node *kn = nd && nd->names >= 0 ? schema_node(s->schema, nd->names) : NULL;
        if (kn && kn->n_lits) { /* one of the enum's strings, whose quote this byte is */
            s->vnode = nd->names;
            s->cand = all_lits(kn), s->cpos = 0;
            s->mode = M_ENUM;
            return enum_byte(s, '"');
        }
        s->mode = M_STRING, s->sub = S_PLAIN, s->chars = 0;
        s->pst = kn && kn->pattern >= 0 ? s->schema->patterns[kn->pattern]->start : 0;
        return true;
    }
    s->cand = 0, s->cpos = 0;
    for (int32_t i = s->next[s->depth - 1]; i < nd->n_props; i++) {
        s->cand |= 1ull << i;
        if (s->schema->props[nd->prop0 + i].required) break;
    }
    if (!s->cand) return dead(s);
    s->mode = M_KEY;
    return true;
}

static bool key_byte(nx_json_path *s, uint8_t c) {
    const js_node *nd = frame_node(s);
    const js_prop *pr = s->schema->props + nd->prop0;
    uint64_t keep = 0;
    for (int32_t i = 0; i < nd->n_props; i++) {
        if (!(s->cand >> i & 1)) continue;
        if (c == '"' && pr[i].len == s->cpos) { /* names are distinct: this one is the key */
            s->next[s->depth - 1] = (uint8_t)(i + 1);
            s->vnode = pr[i].node;
            s->cand = 0, s->cpos = 0, s->key = false;
            s->mode = M_COLON;
            return true;
        }
        if (s->cpos < pr[i].len && (uint8_t)pr[i].name[s->cpos] == c) keep |= 1ull << i;
    }
    if (!keep) return dead(s);
    s->cand = keep;
    s->cpos++;
    return true;
}

/* An enum value's next byte: literals are self-delimiting (strings end with their quote, the
 * others are true, false and null), so the one that completes is the value. */
static bool enum_byte(nx_json_path *s, uint8_t c) {
    const js_node *nd = node_of(s, s->vnode);
    uint64_t keep = 0;
    for (int32_t i = 0; i < nd->n_lits; i++) {
        const uint32_t len = s->schema->lit_len[nd->lit0 + i];
        if ((s->cand >> i & 1) && s->cpos < len && (uint8_t)s->schema->lits[nd->lit0 + i][s->cpos] == c)
            keep |= 1ull << i;
    }
    if (!keep) return dead(s);
    s->cand = keep;
    s->cpos++;
    for (int32_t i = 0; i < nd->n_lits; i++)
        if ((keep >> i & 1) && s->schema->lit_len[nd->lit0 + i] == s->cpos) {
            if (s->key) {
                key_done(s);
                break;
            }
            if (in_unique_array(s)) s->uniq |= 1ull << i;
            value_done(s);
            break;
        }
    return true;
}

/* Integer bounds. An integer's digits so far spell magnitude v; with j more digits it becomes
 * one of [v·10^j, (v+1)·10^j − 1], so a prefix can still end within the bounds when one of those
 * ranges meets the magnitudes the bounds allow on its sign's side. */
#define NUM_SAT 100000000000000000ull /* magnitudes saturate here, past every bound (10^15) */

static bool int_bounded(const js_node *nd) { return nd && (nd->has_min || nd->has_max); }

static bool int_in_range(const js_node *nd, uint64_t v, bool neg) {
    const int64_t x = neg ? -(int64_t)v : (int64_t)v;
    return (!nd->has_min || x >= nd->imin) && (!nd->has_max || x <= nd->imax);
}

static bool int_feasible(const js_node *nd, uint64_t v, bool neg) {
    /* the magnitudes allowed on this side: [lo, hi], hi unbounded when that bound is absent */
    const bool bounded = neg ? nd->has_min : nd->has_max;
    const int64_t far = neg ? -nd->imin : nd->imax, near = neg ? (nd->has_max ? -nd->imax : 0)
                                                                  : (nd->has_min ? nd->imin : 0);
    const uint64_t lo = near > 0 ? (uint64_t)near : 0;
    if (!bounded) return true; /* enough digits pass any bound on the near side */
    if (far < 1) return false;
    const uint64_t hi = (uint64_t)far;
    for (uint64_t a = v, b = v; a <= hi; a *= 10, b = b * 10 + 9)
        if (b >= lo) return true;
    return false;
}

/* Number bounds. Under minimum / maximum a number is written without an exponent and with at
 * most NUM_FRAC digits after the point, so every value it can take is a multiple of 10^-9 and
 * the bounds are exact on that grid (the compiler puts each on the grid value a validator
 * compares alike). The digits so far leave an interval of magnitudes, in units of 10^-9: with
 * integer digits m, [m·10^j, (m+1)·10^j) for each count j of integer digits still to come (just
 * j = 0 after "0"); with k fraction digits f, [m + f/10^k, m + (f+1)/10^k). */
#define NUM_FRAC 9
#define NUM_UNIT 1000000000ll   /* 10^NUM_FRAC */
#define NUM_MAG 2000000000000000000ll /* magnitudes saturate here, past every bound (10^18) */

static bool num_bounded(const js_node *nd) { return nd && (nd->has_nmin || nd->has_nmax); }

static int64_t sat_mul(int64_t a, int64_t b) { return a > NUM_MAG / b ? NUM_MAG : a * b; }

/* Whether magnitudes [a, b] (units, signed by neg) meet the node's bounds. */
static bool num_meets(const js_node *nd, int64_t a, int64_t b, bool neg) {
    const int64_t lo = neg ? -b : a, hi = neg ? -a : b;
    return (!nd->has_nmin || hi >= nd->nmin) && (!nd->has_nmax || lo <= nd->nmax);
}

/* The magnitude the digits so far spell (units), and *step the units one more fraction digit
 * can add (all of them a unit of the last integer digit before the point). */
static int64_t num_at(const nx_json_path *s, int64_t *step) {
    int64_t st = NUM_UNIT;
    for (int i = 0; i < s->fk; i++) st /= 10;
    *step = st;
    return sat_mul((int64_t)s->num, NUM_UNIT) + (int64_t)s->frac * st;
}

static bool num_feasible(const js_node *nd, const nx_json_path *s) {
    if (s->sub == N_MINUS) return num_meets(nd, 0, NUM_MAG, true);
    if (s->sub == N_DOT || s->sub == N_FRAC) {
        int64_t step;
        const int64_t at = num_at(s, &step);
        return num_meets(nd, at, at + step - 1, s->neg);
    }
    if (s->sub == N_ZERO) return num_meets(nd, 0, NUM_UNIT - 1, s->neg);
    for (int64_t a = (int64_t)s->num, b = (int64_t)s->num + 1; a < NUM_MAG / NUM_UNIT; a *= 10, b *= 10)
        if (num_meets(nd, a * NUM_UNIT, sat_mul(b, NUM_UNIT) - 1, s->neg)) return true;
    return false;
}

/* The next byte of a number under bounds (no exponent, at most NUM_FRAC fraction digits): taken
 * only if the digits can still end within the bounds; the state is untouched otherwise. */
static bool num_continues(const js_node *nd, nx_json_path *s, uint8_t c) {
    nx_json_path t = *s;
    switch (s->sub) {
    case N_MINUS:
        if (!is_digit(c)) return false;
        t.sub = c == '0' ? N_ZERO : N_INT, t.num = (uint64_t)(c - '0');
        break;
    case N_ZERO:
    case N_INT:
        if (c == '.') t.sub = N_DOT;
        else if (s->sub == N_INT && is_digit(c))
            t.num = s->num >= (uint64_t)(NUM_MAG / NUM_UNIT) ? s->num : s->num * 10 + (uint64_t)(c - '0');
        else return false;
        break;
    default: /* N_DOT, N_FRAC */
        if (!is_digit(c) || s->fk == NUM_FRAC) return false;
        t.sub = N_FRAC, t.frac = s->frac * 10 + (uint32_t)(c - '0'), t.fk++;
        break;
    }
    if (!num_feasible(nd, &t)) return false;
    *s = t;
    return true;
}

/* The bounded number read so far is a value within its bounds. */
static bool num_in_range(const js_node *nd, const nx_json_path *s) {
    if (s->sub != N_ZERO && s->sub != N_INT && s->sub != N_FRAC) return false;
    int64_t step;
    const int64_t at = num_at(s, &step);
    return num_meets(nd, at, at, s->neg);
}

/* The kinds of value a first byte starts (one C_* bit; 0 for none). */
enum { C_OBJECT = 1, C_ARRAY = 2, C_STRING = 4, C_NUMBER = 8, C_TRUE = 16, C_FALSE = 32, C_NULL = 64 };
static int first_class(uint8_t c) {
    switch (c) {
    case '{': return C_OBJECT;
    case '[': return C_ARRAY;
    case '"': return C_STRING;
    case 't': return C_TRUE;
    case 'f': return C_FALSE;
    case 'n': return C_NULL;
    default: return c == '-' || is_digit(c) ? C_NUMBER : 0;
    }
}

static bool value_start_at(nx_json_path *s, uint8_t c);

/* The non-anyOf nodes that anyOf node n hands a value starting with a byte of class cls to,
 * through nested anyOfs (the compiler bounds their depth), appended to leaf[*n_leaf] (up to
 * NX_JSON_MAX_PATHS). */
static void alt_leaves(const nx_json_schema *S, int n, int cls, int16_t *leaf, int *n_leaf) {
    const js_node *nd = schema_node(S, n);
    if (!nd->n_alts) {
        if (*n_leaf < NX_JSON_MAX_PATHS) leaf[(*n_leaf)++] = (int16_t)n;
        return;
    }
    for (int32_t i = nd->alt0; i < nd->alt0 + nd->n_alts; i++)
        if (S->alt_cls[i] & cls) alt_leaves(S, S->alts[i], cls, leaf, n_leaf);
}

/* The first byte of a value; an anyOf node hands it to every branch that byte can start: the
 * first in s itself, each other in a copy of s appended to fork[*n_fork] (a path that refuses
 * the byte is not kept). */
static bool value_start(nx_json_path *s, uint8_t c, nx_json_path *fork, int *n_fork) {
    const js_node *nd = node_of(s, s->vnode);
    if (!nd || !nd->n_alts) return value_start_at(s, c);
    int16_t leaf[NX_JSON_MAX_PATHS];
    int n_leaf = 0;
    alt_leaves(s->schema, s->vnode, first_class(c), leaf, &n_leaf);
    if (n_leaf == 0) return dead(s);
    for (int i = 1; i < n_leaf; i++) {
        nx_json_path *f = &fork[*n_fork];
        *f = *s;
        f->vnode = leaf[i];
        if (value_start_at(f, c)) (*n_fork)++;
    }
    s->vnode = leaf[0];
    return value_start_at(s, c);
}

/* The first byte of a value (whitespace already skipped) whose node is not an anyOf: it must
 * start one of the types the node allows (or one of its enum literals). */
static bool value_start_at(nx_json_path *s, uint8_t c) {
    const js_node *nd = node_of(s, s->vnode);
    if (nd && nd->n_lits) {
        s->cand = 0, s->cpos = 0;
        for (int32_t i = 0; i < nd->n_lits; i++) s->cand |= 1ull << i;
        if (in_unique_array(s) && !(s->cand &= ~s->uniq)) return dead(s); /* each literal once */
        s->mode = M_ENUM;
        return enum_byte(s, c);
    }
    const uint8_t t = nd ? nd->types : T_ANY;
    switch (c) {
    case '{': return t & T_OBJECT ? push(s, 'o', s->vnode) : dead(s);
    case '[': return t & T_ARRAY ? push(s, 'a', s->vnode) : dead(s);
    case '"':
        if (!(t & T_STRING)) return dead(s);
        s->mode = M_STRING, s->sub = S_PLAIN, s->key = false, s->chars = 0;
        s->pst = nd && nd->pattern >= 0 ? s->schema->patterns[nd->pattern]->start : 0;
        return true;
    case 't': case 'f': case 'n':
        if (!(t & (c == 'n' ? T_NULL : T_BOOLEAN))) return dead(s);
        s->mode = M_LITERAL, s->aux = c == 't' ? 0 : c == 'f' ? 1 : 2, s->sub = 1;
        return true;
    default:
        if (!(c == '-' || is_digit(c)) || !(t & (T_NUMBER | T_INTEGER))) return dead(s);
        s->integer = !(t & T_NUMBER);
        s->mode = M_NUMBER, s->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        s->neg = c == '-', s->num = c == '-' ? 0 : (uint64_t)(c - '0');
        s->frac = 0, s->fk = 0;
        if (!s->integer && num_bounded(nd)) return num_feasible(nd, s) ? true : dead(s);
        if (int_bounded(nd)) { /* -: a negative integer or -0 must fit; 0 is whole */
            if (c == '-') return !nd->has_min || nd->imin <= 0 ? true : dead(s);
            if (c == '0') return int_in_range(nd, 0, false) ? true : dead(s);
            return int_feasible(nd, s->num, false) ? true : dead(s);
        }
        return true;
    }
}

/* The schema node the string being read must match: a value's, or a dict key's propertyNames
 * (NULL: none). */
static const js_node *string_node(const nx_json_path *s) {
    if (!s->key) return node_of(s, s->vnode);
    const js_node *fr = frame_node(s);
    return fr && !fr->keyed && fr->names >= 0 ? schema_node(s->schema, fr->names) : NULL;
}

/* The pattern automaton of the string being read (NULL: none). */
static const nx_pattern *string_pattern(const nx_json_path *s) {
    const js_node *nd = string_node(s);
    return nd && nd->pattern >= 0 ? s->schema->patterns[nd->pattern] : NULL;
}

/* Feeds one byte of the string's text (escapes decoded) to its pattern automaton, if any. */
static bool pattern_byte(nx_json_path *s, uint8_t b) {
    const nx_pattern *p = string_pattern(s);
    if (!p) return true;
    s->pst = nx_pattern_step(p, s->pst, b);
    return s->pst ? true : dead(s);
}

/* The one-letter escapes of JSON strings and the characters they stand for. */
static const char ESC_LETTERS[] = "\"\\/bfnrt", ESC_VALUES[] = "\"\\/\b\f\n\r\t";

/* Whether a string under pattern p, in state st, may go on with one of the one-letter escapes
 * (else a backslash would lead nowhere). */
static bool pattern_escapes(const nx_pattern *p, uint16_t st) {
    for (const char *v = ESC_VALUES; *v; v++)
        if (nx_pattern_step(p, st, (uint8_t)*v)) return true;
    return false;
}

static bool string_byte(nx_json_path *s, uint8_t c) {
    switch (s->sub) {
    case S_ESC: {
        /* under a pattern, no \u: a character must be decided as it starts (every character a
         * pattern can need is raw UTF-8 or one of the one-letter escapes) */
        if (c == 'u') {
            if (string_pattern(s)) return dead(s);
            s->sub = S_HEX, s->aux = 4, s->u = 0;
            return true;
        }
        const char *e = c ? strchr(ESC_LETTERS, c) : NULL;
        if (!e) return dead(s);
        s->sub = S_PLAIN;
        return pattern_byte(s, (uint8_t)ESC_VALUES[e - ESC_LETTERS]);
    }
    case S_HEX: {
        const int h = hex_value(c);
        if (h < 0) return dead(s);
        s->u = (uint16_t)(s->u << 4 | (unsigned)h);
        /* no surrogates (D800-DFFF): decided by the first two digits */
        if (s->aux == 3 && (s->u & 0xF8u) == 0xD8u) return dead(s);
        if (--s->aux == 0) {
            if (s->u == 0) return dead(s);
            s->sub = S_PLAIN;
        }
        return true;
    }
    case S_UTF8:
        if (c < s->lo || c > s->hi) return dead(s);
        s->lo = 0x80, s->hi = 0xBF;
        if (--s->aux == 0) s->sub = S_PLAIN;
        return pattern_byte(s, c);
    default: {
        /* a value string's length bounds, in code points (an escape is one; surrogate escapes
         * are refused, so \uXXXX is always one) */
        const js_node *nd = string_node(s);
        if (c == '"') {
            if (nd && s->chars < nd->min_len) return dead(s);
            if (nd && nd->pattern >= 0 && !s->schema->patterns[nd->pattern]->accept[s->pst]) return dead(s);
            if (s->key) key_done(s);
            else value_done(s);
            return true;
        }
        if (nd && nd->max_len >= 0 && s->chars >= nd->max_len) return dead(s);
        if (s->chars < UINT16_MAX) s->chars++;
        if (c == '\\') {
            const nx_pattern *p = string_pattern(s);
            if (p && !pattern_escapes(p, s->pst)) return dead(s);
            s->sub = S_ESC;
            return true;
        }
        if (c < 0x20) return dead(s);
        if (!pattern_byte(s, c)) return false;
        if (c < 0x80) return true;
        /* UTF-8 lead bytes and the range of the byte after them (RFC 3629) */
        s->lo = 0x80, s->hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) s->aux = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            s->aux = 2;
            if (c == 0xE0) s->lo = 0xA0;
            if (c == 0xED) s->hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            s->aux = 3;
            if (c == 0xF0) s->lo = 0x90;
            if (c == 0xF4) s->hi = 0x8F;
        } else {
            return dead(s);
        }
        s->sub = S_UTF8;
        return true;
    }
    }
}

/* A number's next byte; false with the state untouched when the byte ends the number instead
 * (the caller then checks that the number could end and hands the byte to its container). */
static bool number_continues(nx_json_path *s, uint8_t c) {
    if (s->integer && (c == '.' || c == 'e' || c == 'E')) return false;
    const js_node *nd = node_of(s, s->vnode);
    if (!s->integer && num_bounded(nd)) return num_continues(nd, s, c);
    const bool bounded = s->integer && int_bounded(nd);
    if (is_digit(c) && (s->sub == N_MINUS || s->sub == N_INT)) {
        const uint64_t v = s->num >= NUM_SAT / 10 ? NUM_SAT : s->num * 10 + (uint64_t)(c - '0');
        if (bounded && (v == 0 ? !int_in_range(nd, 0, true) : !int_feasible(nd, v, s->neg))) return false;
        s->num = v;
    }
    switch (s->sub) {
    case N_MINUS:
        if (!is_digit(c)) return false;
        s->sub = c == '0' ? N_ZERO : N_INT;
        return true;
    case N_ZERO:
    case N_INT:
        if (s->sub == N_INT && is_digit(c)) return true;
        if (c == '.') s->sub = N_DOT;
        else if (c == 'e' || c == 'E') s->sub = N_E;
        else return false;
        return true;
    case N_DOT:
        if (!is_digit(c)) return false;
        s->sub = N_FRAC;
        return true;
    case N_FRAC:
        if (is_digit(c)) return true;
        if (c != 'e' && c != 'E') return false;
        s->sub = N_E;
        return true;
    case N_E:
        if (c == '+' || c == '-') s->sub = N_ESIGN;
        else if (is_digit(c)) s->sub = N_EXP;
        else return false;
        return true;
    case N_ESIGN:
        if (!is_digit(c)) return false;
        s->sub = N_EXP;
        return true;
    default: /* N_EXP */
        return is_digit(c);
    }
}

static bool number_can_end(const nx_json_path *s) {
    const js_node *nd = node_of(s, s->vnode);
    if (!s->integer && num_bounded(nd)) return num_in_range(nd, s);
    if (s->integer && int_bounded(nd) && !int_in_range(nd, s->num, s->neg)) return false;
    return s->sub == N_ZERO || s->sub == N_INT || s->sub == N_FRAC || s->sub == N_EXP;
}

bool nx_json_can_end(const nx_json_state *s) {
    for (int i = 0; i < s->n; i++) {
        const nx_json_path *p = &s->path[i];
        if (p->mode == M_DONE || (p->mode == M_NUMBER && p->depth == 0 && number_can_end(p))) return true;
    }
    return false;
}

/* One path's next byte; a value that starts at an anyOf may fork it (value_start). */
static bool path_step(nx_json_path *s, uint8_t c, nx_json_path *fork, int *n_fork) {
    switch (s->mode) {
    case M_KEY: return key_byte(s, c);
    case M_ENUM: return enum_byte(s, c);
    case M_STRING: return string_byte(s, c);
    case M_NUMBER:
        if (number_continues(s, c)) return true;
        if (!number_can_end(s)) return dead(s);
        value_done(s); /* an array counts it; the byte belongs to the container: fall through to it */
        if (s->mode == M_DONE) return dead(s); /* a value alone (nx_json_init_value): nothing follows */
        break;
    case M_LITERAL: {
        const char *lit = literals[s->aux];
        if ((uint8_t)lit[s->sub] != c) return dead(s);
        if (lit[++s->sub] == 0) value_done(s);
        return true;
    }
    case M_START: return c == '{' ? push(s, 'o', s->schema ? 0 : -1) : dead(s);
    case M_DONE:
    case M_DEAD: return dead(s);
    default: break;
    }
    if (is_ws(c)) {
        if (++s->ws > NX_JSON_MAX_WS) return dead(s);
        return true;
    }
    s->ws = 0;
    switch (s->mode) {
    case M_VALUE: return value_start(s, c, fork, n_fork);
    case M_OBJ_FIRST:
        if (c == '}') return close_container(s, 'o');
        /* fall through */
    case M_OBJ_KEY: return c == '"' ? key_start(s) : dead(s);
    case M_COLON:
        if (c != ':') return dead(s);
        s->mode = M_VALUE;
        return true;
    case M_ARR_FIRST:
        if (c == ']') return close_container(s, 'a');
        return value_start(s, c, fork, n_fork);
    default: { /* M_AFTER */
        const bool obj = s->stack[s->depth - 1] == 'o';
        const js_node *nd = frame_node(s);
        if (c == ',') {
            const uint8_t n = s->next[s->depth - 1];
            if (nd && obj && nd->keyed && n >= nd->n_props) return dead(s);      /* no key is left */
            if (nd && obj && !nd->keyed && nd->max_props >= 0 && n >= nd->max_props) return dead(s); /* maxProperties */
            if (nd && !obj && nd->max_items && n >= nd->max_items) return dead(s); /* the array is full */
            if (!obj && in_unique_array(s) && s->uniq == all_lits(schema_node(s->schema, nd->items)))
                return dead(s); /* every literal is in it */
            s->mode = obj ? M_OBJ_KEY : M_VALUE;
            if (!obj) s->vnode = nd ? nd->items : -1;
            return true;
        }
        if (c == '}') return close_container(s, 'o');
        if (c == ']') return close_container(s, 'a');
        return dead(s);
    }
    }
}

/* Appends path p to out[*n] unless an equal one is there (readings that met again) or
 * NX_JSON_MAX_PATHS are (json_grammar.h). */
static void keep_path(nx_json_path *out, int *n, const nx_json_path *p) {
    for (int i = 0; i < *n; i++)
        if (memcmp(&out[i], p, sizeof *p) == 0) return;
    if (*n < NX_JSON_MAX_PATHS) out[(*n)++] = *p;
}

bool nx_json_step(nx_json_state *st, uint8_t c) {
    nx_json_path fork[NX_JSON_MAX_PATHS];
    int nf = 0;
    bool ok = false;
    if (st->n == 1) { /* the common case: one reading, stepped in place */
        ok = path_step(&st->path[0], c, fork, &nf);
        if (nf == 0) {
            if (!ok) st->n = 0;
            return ok;
        }
    }
    nx_json_path out[NX_JSON_MAX_PATHS];
    int n = 0;
    if (st->n == 1) { /* forked: the stepped path (if it lives) and its forks */
        if (ok) keep_path(out, &n, &st->path[0]);
        for (int i = 0; i < nf; i++) keep_path(out, &n, &fork[i]);
    } else {
        for (int i = 0; i < st->n; i++) {
            nf = 0;
            if (path_step(&st->path[i], c, fork, &nf)) keep_path(out, &n, &st->path[i]);
            for (int k = 0; k < nf; k++) keep_path(out, &n, &fork[k]);
        }
    }
    const int old = st->n;
    memcpy(st->path, out, sizeof *out * (size_t)n);
    if (n < old) memset(&st->path[n], 0, sizeof *out * (size_t)(old - n)); /* unused paths stay zero */
    st->n = (uint8_t)n;
    return n > 0;
}

bool nx_json_feed(nx_json_state *s, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!nx_json_step(s, b[i])) return false;
    return true;
}


void nx_json_allowed(const nx_json_vocab *v, const nx_json_state *s, int32_t n_tokens, uint8_t *allow) {
    memset(allow, 0, (size_t)n_tokens);
    const int32_t n = v->n < n_tokens ? v->n : n_tokens;
    bool any = false;
    if (nx_json_complete(s)) {
        for (int32_t i = 0; i < n; i++) allow[i] = v->end[i];
        return;
    }
    /* which first bytes can follow at all: most tokens are refused on their first byte */
    uint8_t first[256];
    nx_json_state t;
    for (int c = 0; c < 256; c++) {
        nx_json_copy(&t, s);
        first[c] = nx_json_step(&t, (uint8_t)c);
    }
    for (int32_t i = 0; i < n; i++) {
        if (!v->bytes[i] || v->len[i] == 0 || !first[v->bytes[i][0]]) continue;
        nx_json_copy(&t, s);
        if (nx_json_feed(&t, v->bytes[i], v->len[i])) allow[i] = 1, any = true;
    }
    if (!any) /* a vocabulary without the bytes needed: let the generation end */
        for (int32_t i = 0; i < n; i++) allow[i] = v->end[i];
}

/* ---------------------------------------------------------------- vocabularies */

void nx_json_vocab_free(nx_json_vocab *v) {
    if (!v) return;
    for (int32_t i = 0; v->bytes && i < v->n; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->len);
    free(v->end);
    free(v);
}

static nx_status vocab_alloc(int32_t n, const int32_t *end_ids, size_t n_end, nx_json_vocab **out, nx_error *err) {
    *out = NULL;
    if (n <= 0) return nx_fail(err, NX_E_ARG, "JSON mode: an empty vocabulary");
    nx_json_vocab *v = calloc(1, sizeof *v);
    if (!v) return nx_fail(err, NX_E_NOMEM, "out of memory");
    v->n = n;
    v->bytes = calloc((size_t)n, sizeof *v->bytes);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->end = calloc((size_t)n, 1);
    if (!v->bytes || !v->len || !v->end) {
        nx_json_vocab_free(v);
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n_end; i++) {
        if (end_ids[i] < 0 || end_ids[i] >= n) {
            nx_json_vocab_free(v);
            return nx_fail(err, NX_E_ARG, "JSON mode: end token %d is out of range [0, %d)", (int)end_ids[i], (int)n);
        }
        v->end[end_ids[i]] = 1;
    }
    *out = v;
    return NX_OK;
}

nx_status nx_json_vocab_from_bytes(const char *const *tokens, const size_t *lens, int32_t n, const int32_t *end_ids,
                                   size_t n_end, nx_json_vocab **out, nx_error *err) {
    nx_json_vocab *v;
    nx_status st = vocab_alloc(n, end_ids, n_end, &v, err);
    if (st != NX_OK) return st;
    for (int32_t i = 0; i < n; i++) {
        if (!tokens[i] || v->end[i]) continue;
        if (!(v->bytes[i] = malloc(lens[i] ? lens[i] : 1))) {
            nx_json_vocab_free(v);
            return nx_fail(err, NX_E_NOMEM, "out of memory");
        }
        memcpy(v->bytes[i], tokens[i], lens[i]);
        v->len[i] = (uint32_t)lens[i];
    }
    *out = v;
    return NX_OK;
}

nx_status nx_json_vocab_for_model(const nx_model *m, nx_json_vocab **out, nx_error *err) {
    *out = NULL;
    const nx_tokenizer *tok = nx_model_tokenizer(m);
    if (!tok) return nx_fail(err, NX_E_ARG, "JSON mode needs the model's tokenizer.json");
    const int32_t *eos;
    const size_t n_eos = nx_model_eos_ids(m, &eos);
    int32_t *ends = malloc(sizeof(int32_t) * (n_eos + 1));
    if (!ends) return nx_fail(err, NX_E_NOMEM, "out of memory");
    size_t n_end = 0;
    for (size_t i = 0; i < n_eos; i++) /* the tokenizer's ids only (the model's vocabulary may be padded) */
        if (eos[i] >= 0 && eos[i] < nx_tokenizer_vocab_size(tok)) ends[n_end++] = eos[i];
    nx_status st = nx_json_vocab_new(tok, ends, n_end, out, err);
    free(ends);
    return st;
}

nx_status nx_json_vocab_new(const nx_tokenizer *tok, const int32_t *end_ids, size_t n_end, nx_json_vocab **out,
                            nx_error *err) {
    nx_json_vocab *v;
    nx_status st = vocab_alloc(nx_tokenizer_vocab_size(tok), end_ids, n_end, &v, err);
    if (st != NX_OK) return st;
    for (int32_t i = 0; i < v->n; i++) {
        if (v->end[i] || nx_tokenizer_is_special(tok, i)) continue;
        size_t len = 0;
        if ((st = nx_tokenizer_token_bytes(tok, i, &v->bytes[i], &len, err)) != NX_OK) {
            nx_json_vocab_free(v);
            return st;
        }
        v->len[i] = (uint32_t)len;
    }
    *out = v;
    return NX_OK;
}

/* ---------------------------------------------------------------- schema compilation */

void nx_json_schema_free(nx_json_schema *S) {
    if (!S) return;
    for (int32_t i = 0; i < S->n_props; i++) free(S->props[i].name);
    for (int32_t i = 0; i < S->n_lits; i++) free(S->lits[i]);
    free(S->nodes);
    free(S->props);
    free(S->lits);
    free(S->lit_len);
    free(S->alts);
    free(S->alt_cls);
    for (int32_t i = 0; i < S->n_patterns; i++) nx_pattern_free(S->patterns[i]);
    free(S->patterns);
    free(S);
}

typedef struct compiler {
    nx_json_schema *S;
    int32_t cap_nodes, cap_props, cap_lits, cap_alts;
    char path[256]; /* where in the schema, for messages: #/properties/a/items */
    nx_error *err;
    json_t *root;   /* for $ref */
    char **refs;    /* the references met so far, and the node each compiled to */
    int16_t *ref_node;
    int32_t n_refs, cap_refs;
    int16_t *any;   /* the anyOf nodes, and where each is, checked once all is compiled */
    char **any_path;
    int32_t n_any, cap_any;
    int32_t cap_patterns;
} compiler;

static bool grow(void **p, int32_t *cap, int32_t need, size_t size) {
    if (need <= *cap) return true;
    int32_t c = *cap ? *cap * 2 : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static int bad_schema(compiler *C, const char *what) {
    nx_fail(C->err, NX_E_ARG, "JSON schema at %s: %s", C->path, what);
    return -1;
}

static int type_bit(const char *t) {
    static const char *const names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
    for (int i = 0; i < 7; i++)
        if (strcmp(t, names[i]) == 0) return 1 << i;
    return 0;
}

/* A literal of an enum or const: a string, boolean or null, serialised compactly. */
static bool add_literal(compiler *C, json_t *v) {
    nx_json_schema *S = C->S;
    if (!(json_is_string(v) || json_is_boolean(v) || json_is_null(v))) return false;
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!text || !grow((void **)&S->lits, &C->cap_lits, S->n_lits + 1, sizeof *S->lits) ||
        !(S->lit_len = realloc(S->lit_len, sizeof *S->lit_len * (size_t)C->cap_lits))) {
        free(text);
        return false;
    }
    S->lits[S->n_lits] = text;
    S->lit_len[S->n_lits++] = (uint32_t)strlen(text);
    return true;
}

static int compile_node(compiler *C, json_t *v, int depth);

/* The node a local reference names: "#" (the root), "#/$defs/NAME" or "#/definitions/NAME".
 * Each definition compiles once, when first referenced (so unused ones are not looked at), and
 * its node is known before its body compiles, so a definition may refer to itself. */
static int compile_ref(compiler *C, json_t *ref, int depth) {
    if (!json_is_string(ref)) return bad_schema(C, "$ref must be a string");
    const char *r = json_string_value(ref);
    if (strcmp(r, "#") == 0) return 0;
    const char *name = NULL;
    json_t *defs = NULL;
    if (strncmp(r, "#/$defs/", 8) == 0) name = r + 8, defs = json_object_get(C->root, "$defs");
    else if (strncmp(r, "#/definitions/", 14) == 0) name = r + 14, defs = json_object_get(C->root, "definitions");
    if (!name || !*name || strchr(name, '/') || strchr(name, '~'))
        return bad_schema(C, "only local references are supported: \"#\", \"#/$defs/NAME\" or \"#/definitions/NAME\"");
    for (int32_t i = 0; i < C->n_refs; i++)
        if (strcmp(C->refs[i], r) == 0) return C->ref_node[i];
    json_t *target = json_object_get(defs, name);
    if (!target) {
        char msg[200];
        snprintf(msg, sizeof msg, "$ref %.120s names no definition", r);
        return bad_schema(C, msg);
    }
    if (!grow((void **)&C->refs, &C->cap_refs, C->n_refs + 1, sizeof *C->refs) ||
        !(C->ref_node = realloc(C->ref_node, sizeof *C->ref_node * (size_t)C->cap_refs)) ||
        !(C->refs[C->n_refs] = strdup(r)))
        return bad_schema(C, "out of memory");
    C->ref_node[C->n_refs++] = (int16_t)C->S->n_nodes; /* the node compile_node reserves first */
    char saved[sizeof C->path];
    memcpy(saved, C->path, sizeof saved);
    snprintf(C->path, sizeof C->path, "%s", r);
    const int n = compile_node(C, target, depth + 1);
    if (n < 0) return -1; /* the message names the definition's path */
    memcpy(C->path, saved, sizeof saved);
    return n;
}

/* The C_* kinds of value node n can start with (through references and nested anyOfs), or -1
 * when anyOfs nest through references deeper than the automaton could follow. */
static int node_classes(const nx_json_schema *S, int n, int depth) {
    if (depth > NX_JSON_MAX_DEPTH) return -1;
    const js_node *nd = schema_node(S, n);
    int cls = 0;
    if (nd->n_alts) {
        for (int32_t i = 0; i < nd->n_alts; i++) {
            const int c = node_classes(S, S->alts[nd->alt0 + i], depth + 1);
            if (c < 0) return -1;
            cls |= c;
        }
        return cls;
    }
    if (nd->n_lits) {
        for (int32_t i = 0; i < nd->n_lits; i++) cls |= first_class((uint8_t)S->lits[nd->lit0 + i][0]);
        return cls;
    }
    if (nd->types & T_OBJECT) cls |= C_OBJECT;
    if (nd->types & T_ARRAY) cls |= C_ARRAY;
    if (nd->types & T_STRING) cls |= C_STRING;
    if (nd->types & (T_NUMBER | T_INTEGER)) cls |= C_NUMBER;
    if (nd->types & T_BOOLEAN) cls |= C_TRUE | C_FALSE;
    if (nd->types & T_NULL) cls |= C_NULL;
    return cls;
}

/* The branches (non-anyOf nodes, through nested anyOfs) node n hands a value of first-byte class
 * cls to, counted up to `cap` + 1. */
static int count_leaves(const nx_json_schema *S, int n, int cls, int cap, int depth) {
    const js_node *nd = schema_node(S, n);
    if (!nd->n_alts) return 1;
    if (depth > NX_JSON_MAX_DEPTH) return cap + 1;
    int k = 0;
    for (int32_t i = nd->alt0; i < nd->alt0 + nd->n_alts && k <= cap; i++)
        if (S->alt_cls[i] & cls) k += count_leaves(S, S->alts[i], cls, cap, depth + 1);
    return k;
}

/* Once every node is compiled: no reference chain may loop without reaching a schema; each
 * anyOf branch's first-byte kinds are recorded, and at most NX_JSON_MAX_PATHS branches of one
 * anyOf may start alike (each is followed as its own path until the bytes tell them apart). */
static int check_compiled(compiler *C) {
    nx_json_schema *S = C->S;
    for (int32_t i = 0; i < S->n_nodes; i++) {
        int n = i, hops = 0;
        while (S->nodes[n].ref >= 0 && hops++ <= S->n_nodes) n = S->nodes[n].ref;
        if (S->nodes[n].ref >= 0) {
            snprintf(C->path, sizeof C->path, "#");
            return bad_schema(C, "a $ref cycle that never reaches a schema");
        }
    }
    if (!(S->alt_cls = malloc((size_t)(S->n_alts > 0 ? S->n_alts : 1)))) return bad_schema(C, "out of memory");
    for (int32_t a = 0; a < C->n_any; a++) {
        const js_node *nd = &S->nodes[C->any[a]];
        snprintf(C->path, sizeof C->path, "%s", C->any_path[a]);
        for (int32_t i = nd->alt0; i < nd->alt0 + nd->n_alts; i++) {
            const int cls = node_classes(S, S->alts[i], 0);
            if (cls < 0) return bad_schema(C, "anyOf nested deeper than 32 levels");
            S->alt_cls[i] = (uint8_t)cls;
        }
    }
    for (int32_t a = 0; a < C->n_any; a++) {
        snprintf(C->path, sizeof C->path, "%s", C->any_path[a]);
        for (int cls = 1; cls <= C_NULL; cls <<= 1)
            if (count_leaves(S, C->any[a], cls, NX_JSON_MAX_PATHS, 0) > NX_JSON_MAX_PATHS)
                return bad_schema(C, "more than 8 anyOf / oneOf branches can start with the same kind of value");
    }
    return 0;
}

/* The integer keywords mn and mx of v (a count's lower and upper limit), each in [0, cap]:
 * out[0] and out[1], -1 where absent. False (the error set) when one is not such an integer. */
static bool count_limits(compiler *C, json_t *v, const char *mn, const char *mx, json_int_t cap, json_int_t out[2]) {
    for (int k = 0; k < 2; k++) {
        json_t *m = json_object_get(v, k ? mx : mn);
        out[k] = -1;
        if (!m) continue;
        if (!json_is_integer(m) || json_integer_value(m) < 0 || json_integer_value(m) > cap) {
            char msg[120];
            snprintf(msg, sizeof msg, "%s and %s must be integers in [0, %lld]", mn, mx, (long long)cap);
            bad_schema(C, msg);
            return false;
        }
        out[k] = json_integer_value(m);
    }
    return true;
}

/* The grid value (units of 10^-9, NUM_FRAC) a bound x puts at the end of the numbers it allows:
 * the first written value that a validator, reading it as a double, finds >= x (k = 0,
 * minimum), > x (1, exclusiveMinimum), or the last that is <= x (2, maximum), < x (3,
 * exclusiveMaximum). The grid value nearest x is within a unit of it; the decimal text decides. */
static bool grid_ok(int64_t g, double x, int k) {
    char buf[40];
    const int64_t a = g < 0 ? -g : g;
    snprintf(buf, sizeof buf, "%s%lld.%09lld", g < 0 ? "-" : "", (long long)(a / NUM_UNIT), (long long)(a % NUM_UNIT));
    const double v = strtod(buf, NULL);
    return k == 0 ? v >= x : k == 1 ? v > x : k == 2 ? v <= x : v < x;
}

static int64_t grid_bound(double x, int k) {
    const int64_t near = llround(x * (double)NUM_UNIT);
    if (k < 2) {
        int64_t g = near - 2;
        while (!grid_ok(g, x, k)) g++;
        return g;
    }
    int64_t g = near + 2;
    while (!grid_ok(g, x, k)) g--;
    return g;
}

/* Compiles child schema `v` under path segment `seg` (restoring the path after). */
static int compile_child(compiler *C, json_t *v, const char *seg, int depth) {
    const size_t len = strlen(C->path);
    snprintf(C->path + len, sizeof C->path - len, "/%s", seg);
    const int n = compile_node(C, v, depth + 1);
    if (n >= 0) C->path[len] = 0;
    return n;
}

/* The strings a format takes, as a pattern: each a strict subset of what RFC 3339 (date, time,
 * date-time: real calendar days, leap years included; hours to 23, a time zone always),
 * RFC 4122 (uuid, lower case), dotted-quad ipv4 and email (dot-separated letters and digits,
 * a top-level domain of letters) validators such as ajv-formats accept. NULL: not supported. */
static const char *format_pattern(const char *f) {
#define DATE_RE                                                                                                   \
    "(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-"     \
    "(?:0[1-9]|1[0-9]|2[0-8]))|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
#define TIME_RE "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
#define OCTET_RE "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define LABEL_RE "[a-z0-9](?:[a-z0-9-]{0,60}[a-z0-9])?"
#define H_RE "[0-9a-f]{1,4}"
#define DUR_T_RE "(?:[0-9]+H(?:[0-9]+M)?(?:[0-9]+S)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
    static const char *const formats[][2] = {
        {"date", "^" DATE_RE "$"},
        {"time", "^" TIME_RE "$"},
        {"date-time", "^" DATE_RE "T" TIME_RE "$"},
        {"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
        {"ipv4", "^(?:" OCTET_RE "\\.){3}" OCTET_RE "$"},
        {"email", "^[a-z0-9]+(?:[._+-][a-z0-9]+)*@[a-z0-9]+(?:-[a-z0-9]+)*(?:\\.[a-z0-9]+(?:-[a-z0-9]+)*)*\\.[a-z]{2,24}$"},
        /* RFC 1123 host names (labels of letters, digits and inner hyphens, 253 characters in
         * all) kept to 1-4 labels of 1-62 characters, which always fit */
        {"hostname", "^" LABEL_RE "(?:\\." LABEL_RE "){0,3}$"},
        /* eight groups, or fewer around one "::" (RFC 4291 text, lowercase; no embedded IPv4 or
         * zone) */
        {"ipv6", "^(?:(?:" H_RE ":){7}" H_RE "|(?:" H_RE ":){1,7}:|(?:" H_RE ":){1,6}:" H_RE "|(?:" H_RE
                 ":){1,5}(?::" H_RE "){1,2}|(?:" H_RE ":){1,4}(?::" H_RE "){1,3}|(?:" H_RE ":){1,3}(?::" H_RE
                 "){1,4}|(?:" H_RE ":){1,2}(?::" H_RE "){1,5}|" H_RE ":(?::" H_RE "){1,6}|:(?:(?::" H_RE
                 "){1,7}|:))$"},
        /* ISO 8601 durations as JSON Schema has them: years, months, days and a time part of
         * hours, minutes, seconds (whole numbers), each present part in order, at least one; or
         * weeks alone */
        {"duration", "^P(?:(?:[0-9]+Y(?:[0-9]+M)?(?:[0-9]+D)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D)(?:T" DUR_T_RE ")?|T" DUR_T_RE
                     "|[0-9]+W)$"},
    };
#undef DATE_RE
#undef TIME_RE
#undef OCTET_RE
#undef LABEL_RE
#undef H_RE
#undef DUR_T_RE
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
        if (strcmp(f, formats[i][0]) == 0) return formats[i][1];
    return NULL;
}

static int compile_node(compiler *C, json_t *v, int depth) {
    nx_json_schema *S = C->S;
    if (depth > NX_JSON_MAX_DEPTH) return bad_schema(C, "nested deeper than 32 levels");
    if (json_is_true(v)) v = NULL; /* true: any value */
    else if (!json_is_object(v)) return bad_schema(C, "a schema must be an object (or true)");
    if (!grow((void **)&S->nodes, &C->cap_nodes, S->n_nodes + 1, sizeof *S->nodes) || S->n_nodes >= INT16_MAX)
        return bad_schema(C, "too many schema nodes");
    const int me = S->n_nodes++;
    js_node nd = {.ref = -1, .types = T_ANY, .items = -1, .addl = -1, .names = -1, .max_props = -1, .max_len = -1,
                  .pattern = -1};
    S->nodes[me] = nd;
    if (!v) return me;
    /* annotations (JSON Schema's meta-data and content vocabularies), which never constrain a value */
    static const char *const ignored[] = {"description", "title", "default", "examples", "$schema", "$id", "strict",
                                          "$comment", "$defs", "definitions", "deprecated", "readOnly", "writeOnly",
                                          "contentEncoding", "contentMediaType"};
    static const char *const known[] = {"type", "properties", "required", "additionalProperties", "items",
                                        "enum", "const", "minItems", "maxItems", "minLength", "maxLength",
                                        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "$ref",
                                        "anyOf", "oneOf", "allOf", "pattern", "format", "uniqueItems",
                                        "propertyNames", "minProperties", "maxProperties", "patternProperties"};
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof *known && !ok; i++) ok = strcmp(key, known[i]) == 0;
        for (size_t i = 0; i < sizeof ignored / sizeof *ignored && !ok; i++) ok = strcmp(key, ignored[i]) == 0;
        if (!ok) {
            char msg[160];
            snprintf(msg, sizeof msg, "the keyword '%.60s' is not supported", key);
            return bad_schema(C, msg);
        }
    }
    /* $ref, anyOf / oneOf and allOf stand alone (beside annotations) */
    static const char *const combinators[] = {"$ref", "anyOf", "oneOf", "allOf"};
    int n_comb = 0, n_other = 0;
    const char *comb = NULL;
    json_object_foreach(v, key, val) {
        bool is_comb = false, is_ignored = false;
        for (size_t i = 0; i < 4; i++)
            if (strcmp(key, combinators[i]) == 0) is_comb = true, comb = combinators[i];
        for (size_t i = 0; i < sizeof ignored / sizeof *ignored; i++) is_ignored |= strcmp(key, ignored[i]) == 0;
        n_comb += is_comb;
        n_other += !is_comb && !is_ignored;
    }
    if (n_comb && (n_comb > 1 || n_other))
        return bad_schema(C, "$ref, anyOf, oneOf and allOf are supported standing alone (beside annotations "
                             "such as description), not combined with other keywords");
    if (comb && comb[0] == '$') {
        const int target = compile_ref(C, json_object_get(v, "$ref"), depth);
        if (target < 0) return -1;
        nd.ref = (int16_t)target;
        S->nodes[me] = nd;
        return me;
    }
    if (comb) {
        json_t *list = json_object_get(v, comb);
        const bool all = comb[1] == 'l';
        if (!json_is_array(list) || json_array_size(list) == 0 || json_array_size(list) > (all ? 1 : NX_JSON_MAX_PROPS)) {
            char msg[120];
            snprintf(msg, sizeof msg, all ? "allOf must be a list of one schema" : "%s must be a list of 1 to 64 schemas",
                     comb);
            return bad_schema(C, msg);
        }
        const int32_t n = (int32_t)json_array_size(list);
        int32_t alt0 = 0;
        if (!all) {
            alt0 = S->n_alts;
            if (!grow((void **)&S->alts, &C->cap_alts, S->n_alts + n, sizeof *S->alts) ||
                !grow((void **)&C->any, &C->cap_any, C->n_any + 1, sizeof *C->any) ||
                !(C->any_path = realloc(C->any_path, sizeof *C->any_path * (size_t)C->cap_any)) ||
                !(C->any_path[C->n_any] = strdup(C->path)))
                return bad_schema(C, "out of memory");
            C->any[C->n_any++] = (int16_t)me;
            S->n_alts += n;
        }
        for (int32_t i = 0; i < n; i++) {
            char seg[32];
            snprintf(seg, sizeof seg, "%s/%d", comb, (int)i);
            const int child = compile_child(C, json_array_get(list, (size_t)i), seg, depth);
            if (child < 0) return -1;
            if (all) nd.ref = (int16_t)child;
            else S->alts[alt0 + i] = (int16_t)child;
        }
        if (!all) nd.alt0 = alt0, nd.n_alts = n;
        S->nodes[me] = nd;
        return me;
    }
    json_t *type = json_object_get(v, "type"), *props = json_object_get(v, "properties"),
           *items = json_object_get(v, "items"), *en = json_object_get(v, "enum"), *cn = json_object_get(v, "const");
    if (type) {
        nd.types = 0;
        if (json_is_string(type)) nd.types = (uint8_t)type_bit(json_string_value(type));
        else if (json_is_array(type))
            for (size_t i = 0; i < json_array_size(type); i++) {
                json_t *t = json_array_get(type, i);
                const int b = json_is_string(t) ? type_bit(json_string_value(t)) : 0;
                if (!b) return bad_schema(C, "type lists must name object, array, string, number, integer, boolean or null");
                nd.types |= (uint8_t)b;
            }
        if (!nd.types) return bad_schema(C, "type must be object, array, string, number, integer, boolean or null");
    } else if (props) {
        nd.types = T_OBJECT;
    } else if (items) {
        nd.types = T_ARRAY;
    }
    if (en || cn) {
        if (en && (!json_is_array(en) || json_array_size(en) == 0 || json_array_size(en) > NX_JSON_MAX_PROPS))
            return bad_schema(C, "enum must be a list of 1 to 64 values");
        nd.lit0 = S->n_lits;
        const size_t n = en ? json_array_size(en) : 1;
        for (size_t i = 0; i < n; i++)
            if (!add_literal(C, en ? json_array_get(en, i) : cn))
                return bad_schema(C, "enum and const values must be strings, booleans or null");
        nd.n_lits = (int32_t)n;
    }
    json_t *ap = json_object_get(v, "additionalProperties");
    if (ap && !json_is_false(ap)) {
        if (json_object_size(props) > 0)
            return bad_schema(C, "additionalProperties beside properties must be false (only the listed keys)");
        if (!json_is_true(ap)) { /* a dict: any keys, each value under this schema */
            if (!json_is_object(ap)) return bad_schema(C, "additionalProperties must be false, true or a schema");
            const int child = compile_child(C, ap, "additionalProperties", depth);
            if (child < 0) return -1;
            nd.addl = (int16_t)child;
        }
    }
    json_t *pn = json_object_get(v, "propertyNames"), *minp = json_object_get(v, "minProperties"),
           *maxp = json_object_get(v, "maxProperties");
    if ((pn || minp || maxp) && json_object_size(props) > 0)
        return bad_schema(C, "propertyNames, minProperties and maxProperties are supported on objects without "
                             "properties (dicts)");
    if (pn) { /* the keys: strings under this schema */
        const int child = compile_child(C, pn, "propertyNames", depth);
        if (child < 0) return -1;
        const js_node *kn = schema_node(S, child);
        bool strings = !kn->n_alts && (kn->types & T_STRING);
        for (int32_t i = 0; i < kn->n_lits && strings; i++) strings = S->lits[kn->lit0 + i][0] == '"';
        if (!strings) return bad_schema(C, "propertyNames must be a string schema (type, enum of strings, pattern, "
                                           "format, lengths)");
        nd.names = (int16_t)child;
    }
    json_t *pp = json_object_get(v, "patternProperties");
    if (pp) { /* one pattern: a dict whose keys match it, each value under its schema */
        if (!json_is_object(pp) || json_object_size(pp) != 1)
            return bad_schema(C, "patternProperties is supported with one pattern");
        if (json_object_size(props) > 0 || (ap && !json_is_false(ap)) || pn)
            return bad_schema(C, "patternProperties is supported on objects without properties, "
                                 "additionalProperties or propertyNames");
        void *it = json_object_iter(pp);
        const char *pat = json_object_iter_key(it);
        json_t *keys = json_pack("{s:s, s:s}", "type", "string", "pattern", pat);
        if (!keys) return bad_schema(C, "out of memory");
        const int kn = compile_child(C, keys, "patternProperties", depth);
        json_decref(keys);
        if (kn < 0) return -1;
        char seg[112];
        snprintf(seg, sizeof seg, "patternProperties/%.80s", pat);
        const int vn = compile_child(C, json_object_iter_value(it), seg, depth);
        if (vn < 0) return -1;
        nd.names = (int16_t)kn, nd.addl = (int16_t)vn;
    }
    json_int_t lim[2];
    if (!count_limits(C, v, "minProperties", "maxProperties", 255, lim)) return -1;
    if (lim[0] > 1)
        return bad_schema(C, "minProperties above 1 is not supported (a dict's key may repeat, and repeats "
                             "count once)");
    nd.min_one = lim[0] == 1;
    nd.max_props = (int16_t)lim[1];
    if (nd.max_props == 0 && nd.min_one) return bad_schema(C, "maxProperties is below minProperties");
    if (props) {
        if (!json_is_object(props) || json_object_size(props) > NX_JSON_MAX_PROPS)
            return bad_schema(C, "properties must be an object of at most 64 schemas");
        nd.keyed = true;
        nd.prop0 = S->n_props;
        nd.n_props = (int32_t)json_object_size(props);
        if (!grow((void **)&S->props, &C->cap_props, S->n_props + nd.n_props, sizeof *S->props))
            return bad_schema(C, "out of memory");
        if (nd.n_props) memset(S->props + nd.prop0, 0, sizeof *S->props * (size_t)nd.n_props);
        S->n_props += nd.n_props;
        int32_t i = 0;
        json_object_foreach(props, key, val) {
            for (const char *k = key; *k; k++)
                if (*k == '"' || *k == '\\' || (unsigned char)*k < 0x20)
                    return bad_schema(C, "property names with quotes, backslashes or control characters are not supported");
            js_prop pr = {.name = strdup(key), .len = (uint32_t)strlen(key)};
            S->props[nd.prop0 + i] = pr; /* owned from here (freed with the schema) */
            if (!pr.name) return bad_schema(C, "out of memory");
            char seg[96];
            snprintf(seg, sizeof seg, "properties/%.80s", key);
            const int child = compile_child(C, val, seg, depth);
            if (child < 0) return -1;
            S->props[nd.prop0 + i].node = (int16_t)child;
            i++;
        }
    }
    json_t *req = json_object_get(v, "required");
    if (req) {
        if (!json_is_array(req)) return bad_schema(C, "required must be a list of property names");
        for (size_t r = 0; r < json_array_size(req); r++) {
            json_t *name = json_array_get(req, r);
            int32_t hit = -1;
            for (int32_t i = 0; json_is_string(name) && i < nd.n_props; i++)
                if (strcmp(S->props[nd.prop0 + i].name, json_string_value(name)) == 0) hit = i;
            if (hit < 0) return bad_schema(C, "required names a property the schema does not list");
            S->props[nd.prop0 + hit].required = true;
        }
    }
    if (items) {
        if (json_is_array(items)) return bad_schema(C, "items must be one schema (tuples are not supported)");
        const int child = compile_child(C, items, "items", depth);
        if (child < 0) return -1;
        nd.items = (int16_t)child;
    }
    if (!count_limits(C, v, "minItems", "maxItems", 255, lim)) return -1;
    if (lim[0] >= 0) nd.min_items = (uint8_t)lim[0];
    if (lim[1] >= 0) nd.max_items = (uint8_t)lim[1];
    if (lim[1] >= 0 && nd.max_items < nd.min_items) return bad_schema(C, "maxItems is below minItems");
    if (lim[1] == 0) nd.types &= (uint8_t)~T_ARRAY; /* no array fits */
    json_t *uq = json_object_get(v, "uniqueItems");
    if (uq && !json_is_boolean(uq)) return bad_schema(C, "uniqueItems must be true or false");
    if (json_is_true(uq) && (nd.types & T_ARRAY)) {
        /* the items must be literals (an item node still being compiled is a container that
         * holds this array, so not one) */
        const js_node *it = nd.items >= 0 ? schema_node(S, nd.items) : NULL;
        if (!it || !it->n_lits || it->n_alts)
            return bad_schema(C, "uniqueItems is supported on arrays whose items are enum or const values");
        if (nd.min_items > it->n_lits) return bad_schema(C, "uniqueItems: minItems is more than the enum's values");
        nd.unique = true;
    }
    if (!count_limits(C, v, "minLength", "maxLength", UINT16_MAX, lim)) return -1;
    if ((lim[0] >= 0 || lim[1] >= 0) && nd.n_lits)
        return bad_schema(C, "minLength and maxLength beside enum or const are not supported");
    if (lim[0] >= 0) nd.min_len = (uint16_t)lim[0];
    if (lim[1] >= 0) nd.max_len = (int32_t)lim[1];
    if (nd.max_len >= 0 && nd.max_len < nd.min_len) return bad_schema(C, "maxLength is below minLength");
    static const char *const bound_kw[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        json_t *b = json_object_get(v, bound_kw[k]);
        if (!b) continue;
        if (!json_is_number(b) || !(fabs(json_number_value(b)) <= 1e15))
            return bad_schema(C, "minimum, maximum, exclusiveMinimum and exclusiveMaximum must be numbers within "
                                 "±10^15");
        if (nd.n_lits) return bad_schema(C, "minimum and maximum beside enum or const are not supported");
        const double x = json_number_value(b);
        if (nd.types & T_NUMBER || !(nd.types & T_INTEGER)) { /* numbers (or no type: any number) */
            if (!(fabs(x) <= 1e9)) return bad_schema(C, "bounds on numbers (type number) must be within ±10^9");
            const int64_t at = grid_bound(x, k);
            if (k < 2) nd.nmin = nd.has_nmin && nd.nmin > at ? nd.nmin : at, nd.has_nmin = true;
            else nd.nmax = nd.has_nmax && nd.nmax < at ? nd.nmax : at, nd.has_nmax = true;
            if (nd.types & T_NUMBER) continue;
        }
        /* the integers the bound allows start (end) at */
        const int64_t at = (int64_t)(k == 0 ? ceil(x) : k == 1 ? floor(x) + 1 : k == 2 ? floor(x) : ceil(x) - 1);
        if (k < 2) nd.imin = nd.has_min && nd.imin > at ? nd.imin : at, nd.has_min = true;
        else nd.imax = nd.has_max && nd.imax < at ? nd.imax : at, nd.has_max = true;
    }
    if (nd.has_min && nd.has_max && nd.imin > nd.imax) return bad_schema(C, "no integer lies within the bounds");
    if (nd.has_nmin && nd.has_nmax && nd.nmin > nd.nmax) return bad_schema(C, "no number lies within the bounds");
    json_t *pat = json_object_get(v, "pattern"), *fmt = json_object_get(v, "format");
    const char *ptext = NULL;
    size_t plen = 0;
    if (pat) {
        if (!json_is_string(pat)) return bad_schema(C, "pattern must be a string");
        ptext = json_string_value(pat), plen = json_string_length(pat);
    }
    if (fmt) {
        if (!json_is_string(fmt)) return bad_schema(C, "format must be a string");
        if (pat) return bad_schema(C, "pattern beside format is not supported");
        ptext = format_pattern(json_string_value(fmt));
        if (!ptext) {
            char msg[200];
            snprintf(msg, sizeof msg, "format '%.40s' is not supported (date, time, date-time, duration, uuid, ipv4, "
                     "ipv6, hostname and email are)", json_string_value(fmt));
            return bad_schema(C, msg);
        }
        plen = strlen(ptext);
    }
    if (ptext) {
        if (nd.n_lits) return bad_schema(C, "pattern or format beside enum or const is not supported");
        /* each automaton can take ~0.1 s to build: a schema's work stays bounded */
        if (S->n_patterns == NX_JSON_MAX_PATTERNS)
            return bad_schema(C, "a schema may hold at most 64 patterns and formats");
        if (!grow((void **)&S->patterns, &C->cap_patterns, S->n_patterns + 1, sizeof *S->patterns))
            return bad_schema(C, "out of memory");
        char why[200];
        nx_pattern *p = nx_pattern_compile(ptext, plen, nd.min_len, nd.max_len, why, sizeof why);
        if (!p) {
            char msg[300];
            snprintf(msg, sizeof msg, "%s: %s", pat ? "pattern" : "format", why);
            return bad_schema(C, msg);
        }
        nd.pattern = S->n_patterns;
        S->patterns[S->n_patterns++] = p;
    }
    S->nodes[me] = nd;
    return me;
}

nx_status nx_json_schema_new(const char *json, size_t len, nx_json_schema **out, nx_error *err) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_DECODE_ANY, &jerr);
    if (!root) return nx_fail(err, NX_E_ARG, "JSON schema: not JSON (%s)", jerr.text);
    compiler C = {.err = err, .path = "#", .root = root};
    nx_status st = NX_OK;
    if (!(C.S = calloc(1, sizeof *C.S))) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
    } else if (compile_node(&C, root, 0) < 0 || check_compiled(&C) < 0) {
        st = NX_E_ARG;
    } else {
        const js_node *top = schema_node(C.S, 0);
        if (!(top->types & T_OBJECT) || top->n_lits || top->n_alts) {
            snprintf(C.path, sizeof C.path, "#");
            bad_schema(&C, "the root must be an object schema");
            st = NX_E_ARG;
        }
    }
    for (int32_t i = 0; i < C.n_refs; i++) free(C.refs[i]);
    for (int32_t i = 0; i < C.n_any; i++) free(C.any_path[i]);
    free(C.refs);
    free(C.ref_node);
    free(C.any);
    free(C.any_path);
    json_decref(root);
    if (st != NX_OK) {
        nx_json_schema_free(C.S);
        return st;
    }
    *out = C.S;
    return NX_OK;
}
