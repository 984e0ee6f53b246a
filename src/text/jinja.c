/* Jinja interpreter for chat templates: lexer (with transformers' trim_blocks/lstrip_blocks),
 * recursive-descent parser into an immutable tree, and a tree-walking renderer whose values,
 * frames and output live in a per-render arena so a failed render frees everything at once.
 * Hostile templates are bounded by a nesting cap (parse), a step budget and a byte budget. */
#include "text/jinja.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "base/error.h"

#define DEFAULT_MAX_STEPS 20000000ull
#define DEFAULT_MAX_BYTES ((size_t)256 << 20)
#define MAX_VALUE_DEPTH 512 /* recursion cap for printing/comparing/converting nested values */

/* ================================================================== arena */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    max_align_t data[];
} arena_chunk;

typedef struct arena {
    arena_chunk *head;
    size_t total; /* bytes obtained from malloc so far */
    size_t cap;   /* 0 = unlimited */
    bool over;    /* the last failure was the cap, not malloc */
} arena;

#define ARENA_CHUNK ((size_t)64 << 10)

static void *arena_alloc(arena *a, size_t n) {
    if (n > SIZE_MAX / 2) {
        a->over = true;
        return NULL;
    }
    n = (n + 15) & ~(size_t)15;
    if (a->head && a->head->cap - a->head->used >= n) {
        void *p = (unsigned char *)a->head->data + a->head->used;
        a->head->used += n;
        return p;
    }
    bool big = n > ARENA_CHUNK / 4;
    size_t cap = big ? n : ARENA_CHUNK;
    if (a->cap && (a->total > a->cap || cap > a->cap - a->total)) {
        a->over = true;
        return NULL;
    }
    arena_chunk *c = malloc(sizeof *c + cap);
    if (!c) {
        a->over = false;
        return NULL;
    }
    c->used = n;
    c->cap = cap;
    a->total += cap;
    if (big && a->head) {
        /* A big block gets its own chunk behind the head so the head keeps serving small ones. */
        c->next = a->head->next;
        a->head->next = c;
    } else {
        c->next = a->head;
        a->head = c;
    }
    return c->data;
}

static void arena_free(arena *a) {
    arena_chunk *c = a->head;
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

/* ================================================================== UTF-8 helpers */

typedef struct jstr {
    const char *p;
    size_t n;
} jstr;

#define JSTR(lit) ((jstr){lit, sizeof(lit) - 1})

static bool jstr_eq(jstr a, jstr b) { return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0); }
static bool jstr_is(jstr a, const char *z) { return a.n == strlen(z) && memcmp(a.p, z, a.n) == 0; }

/* Decodes one code point at s[0..n); invalid or truncated sequences yield U+FFFD over 1 byte. */
static int32_t utf8_next(const char *s, size_t n, size_t *adv) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &cp);
    if (k <= 0) {
        *adv = 1;
        return 0xFFFD;
    }
    *adv = (size_t)k;
    return cp;
}

/* Start of the code point that ends just before s[end] (never before `lo`). */
static size_t utf8_prev(const char *s, size_t lo, size_t end) {
    size_t i = end - 1;
    for (int k = 0; k < 3 && i > lo && ((unsigned char)s[i] & 0xC0) == 0x80; k++) i--;
    return i;
}

static size_t utf8_put(int32_t cp, char *buf) {
    utf8proc_ssize_t k = utf8proc_encode_char(cp, (utf8proc_uint8_t *)buf);
    return k > 0 ? (size_t)k : 0;
}

static size_t utf8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Python's str.isspace(). */
static bool py_isspace(int32_t c) {
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static size_t skip_space_fwd(const char *s, size_t i, size_t end) {
    while (i < end) {
        size_t adv;
        int32_t c = utf8_next(s + i, end - i, &adv);
        if (!py_isspace(c)) break;
        i += adv;
    }
    return i;
}

static size_t skip_space_back(const char *s, size_t lo, size_t end) {
    while (end > lo) {
        size_t st = utf8_prev(s, lo, end), adv;
        int32_t c = utf8_next(s + st, end - st, &adv);
        if (!py_isspace(c) || st + adv != end) break;
        end = st;
    }
    return end;
}

/* ================================================================== values */

typedef enum jt {
    JT_UNDEF,
    JT_NONE,
    JT_BOOL,
    JT_INT,
    JT_FLOAT,
    JT_STR,
    JT_LIST,
    JT_DICT,
    JT_NS,
    JT_MACRO,
    JT_METHOD,
    JT_FUNC,
    JT_LOOP,
} jt;

struct jlist;
struct jdict;
struct jmacro;
struct jmethod;
struct jloop;

typedef struct jv {
    uint8_t t;
    uint8_t tuple; /* JT_LIST: behaves and prints as a tuple */
    uint16_t id;   /* JT_FUNC: index into the globals table */
    union {
        bool b;
        int64_t i;
        double f;
        jstr s; /* JT_STR; JT_UNDEF keeps the name it came from for error messages */
        struct jlist *l;
        struct jdict *d;
        struct jmacro *m;
        struct jmethod *bm;
        struct jloop *lp;
    } u;
} jv;

typedef struct jlist {
    size_t n, cap;
    jv *v;
} jlist;

typedef struct jdict {
    size_t n, cap;
    jstr *k;
    jv *v;
} jdict;

static jv jv_undef(jstr hint) { return (jv){.t = JT_UNDEF, .u.s = hint}; }
static jv jv_none(void) { return (jv){.t = JT_NONE}; }
static jv jv_bool(bool b) { return (jv){.t = JT_BOOL, .u.b = b}; }
static jv jv_int(int64_t i) { return (jv){.t = JT_INT, .u.i = i}; }
static jv jv_float(double f) { return (jv){.t = JT_FLOAT, .u.f = f}; }
static jv jv_str(jstr s) { return (jv){.t = JT_STR, .u.s = s}; }

/* ================================================================== tree */

typedef enum nk {
    /* statements */
    N_TEXT,
    N_OUTPUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETBLOCK,
    N_MACRO,
    N_CALLBLOCK,
    N_FILTERBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_BLOCK, /* {% generation %}, {% with %}: a body in its own (with) or the same frame */
    N_DO,
    /* expressions */
    E_CONST,
    E_NAME,
    E_LIST,
    E_DICT,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NOT,
    E_NEG,
    E_POS,
    E_BIN,
    E_AND,
    E_OR,
    E_CMP,
    E_COND,
    E_KWARG,
    E_BLOCKVAL, /* the captured body of a filter block / set block */
} node_kind;

typedef enum binop { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT } binop_t;
typedef enum cmpop { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN } cmpop;

struct node;
typedef struct nlist {
    struct node **v;
    size_t n, cap;
} nlist;

typedef struct node {
    uint8_t kind;
    uint8_t op;   /* binop / E_CONST tuple flag / N_BLOCK: new frame */
    bool neg;     /* E_TEST: `is not` */
    int16_t fn;   /* E_FILTER / E_TEST: builtin index */
    size_t off;   /* source offset, for error positions */
    jstr name;    /* E_NAME, E_ATTR, E_KWARG key, E_FILTER/E_TEST name, N_MACRO name, N_TEXT text */
    jv val;       /* E_CONST */
    struct node *a, *b, *c;
    nlist args;   /* items / call args / params / compare operands */
    nlist body, orelse;
    uint8_t *ops; /* E_CMP */
} node;

struct nx_jinja {
    char *src;
    size_t len;
    arena ar;
    nlist body;
    nx_jinja_limits lim;
};

static void line_col(const char *src, size_t len, size_t off, int *line, int *col) {
    int l = 1, c = 1;
    if (off > len) off = len;
    for (size_t i = 0; i < off; i++) {
        if (src[i] == '\n') {
            l++;
            c = 1;
        } else if (((unsigned char)src[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

/* ================================================================== builtin tables (forward) */

struct rt;
struct args;
typedef int (*builtin_fn)(struct rt *R, const node *at, jv self, jv *p, const bool *has,
                          const struct args *a, jv *out);

/* A builtin's signature: parameter names in order; "*" as the last name collects the remaining
 * positional arguments into a list. nreq leading parameters are required. A `raw` builtin
 * binds nothing and reads the call's arguments itself (namespace(), dict(), str.format()). */
typedef struct bdef {
    const char *name;
    builtin_fn fn;
    int nreq;
    const char *params[6];
    bool raw;
} bdef;

typedef int (*test_fn)(struct rt *R, const node *at, jv v, const jv *args, bool *res);
typedef struct tdef {
    const char *name;
    test_fn fn;
    int nargs; /* 0 or 1 */
} tdef;

static int find_filter(jstr name);
static const bdef *filter_def(int fn);
static int find_test(jstr name);
static int test_nargs(int fn);

/* ================================================================== lexer */

typedef enum tt {
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF,
} tt;

typedef struct tok {
    uint8_t t;
    size_t off;
    jstr s; /* text, name, operator, or decoded string literal */
    int64_t i;
    double f;
} tok;

typedef struct parser {
    nx_jinja *T;
    const char *s;
    size_t n; /* source length after dropping the final newline */
    tok *toks;
    size_t nt, cap, i;
    int depth;
    int loops;
    nx_error *err;
} parser;

static int perr(parser *P, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(parser *P, size_t off, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    line_col(P->T->src, P->T->len, off, &line, &col);
    nx_fail(P->err, NX_E_FORMAT, "template line %d, column %d: %s", line, col, msg);
    return -1;
}

static void *palloc(parser *P, size_t n) {
    void *p = arena_alloc(&P->T->ar, n);
    if (!p) nx_fail(P->err, NX_E_NOMEM, "template: out of memory");
    return p;
}

static int tok_push(parser *P, tok t) {
    if (P->nt == P->cap) {
        size_t cap = P->cap ? P->cap * 2 : 256;
        tok *v = realloc(P->toks, cap * sizeof *v);
        if (!v) return nx_fail(P->err, NX_E_NOMEM, "template: out of memory"), -1;
        P->toks = v;
        P->cap = cap;
    }
    P->toks[P->nt++] = t;
    return 0;
}

static bool at_lit(const char *s, size_t n, size_t p, const char *lit) {
    size_t k = strlen(lit);
    return p <= n && n - p >= k && memcmp(s + p, lit, k) == 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
static bool is_ascii_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal at s[*pos] (the quote). Escapes follow Python's: unknown ones stay verbatim. */
static int lex_string(parser *P, size_t *pos, tok *t) {
    const char *s = P->s;
    size_t n = P->n, start = *pos, p = start + 1;
    char q = s[start];
    bool esc = false;
    while (p < n && s[p] != q) {
        if (s[p] == '\\') {
            esc = true;
            p++;
        }
        p++;
    }
    if (p >= n) return perr(P, start, "unterminated string literal");
    size_t end = p;
    *pos = p + 1;
    t->t = T_STRING;
    t->off = start;
    if (!esc) {
        t->s = (jstr){s + start + 1, end - start - 1};
        return 0;
    }
    char *buf = palloc(P, end - start + 1);
    if (!buf) return -1;
    size_t o = 0;
    for (size_t i = start + 1; i < end; i++) {
        if (s[i] != '\\') {
            buf[o++] = s[i];
            continue;
        }
        char c = s[++i];
        switch (c) {
        case '\n': break;
        case '\\': buf[o++] = '\\'; break;
        case '\'': buf[o++] = '\''; break;
        case '"': buf[o++] = '"'; break;
        case 'a': buf[o++] = '\a'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'n': buf[o++] = '\n'; break;
        case 'r': buf[o++] = '\r'; break;
        case 't': buf[o++] = '\t'; break;
        case 'v': buf[o++] = '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
            int want = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            uint32_t cp = 0; /* \U takes 8 digits: up to 0xFFFFFFFF */
            for (int k = 0; k < want; k++) {
                int h = i + 1 + (size_t)k < end ? hexval(s[i + 1 + k]) : -1;
                if (h < 0) return perr(P, i - 1, "truncated \\%c escape in string literal", c);
                cp = cp * 16 + (uint32_t)h;
            }
            i += (size_t)want;
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
            o += utf8_put((int32_t)cp, buf + o);
            break;
        }
        default:
            if (c >= '0' && c <= '7') {
                int v = c - '0', k = 1;
                while (k < 3 && i + 1 < end && s[i + 1] >= '0' && s[i + 1] <= '7') v = v * 8 + (s[++i] - '0'), k++;
                o += utf8_put(v, buf + o);
            } else {
                buf[o++] = '\\';
                buf[o++] = c;
            }
        }
    }
    t->s = (jstr){buf, o};
    return 0;
}

static int lex_number(parser *P, size_t *pos) {
    const char *s = P->s;
    size_t n = P->n, p = *pos, start = p;
    bool after_dot = P->nt && P->toks[P->nt - 1].t == T_OP && jstr_is(P->toks[P->nt - 1].s, ".");
    bool flt = false;
    while (p < n && (is_digit(s[p]) || (s[p] == '_' && p + 1 < n && is_digit(s[p + 1])))) p++;
    if (!after_dot && p + 1 < n && s[p] == '.' && is_digit(s[p + 1])) {
        flt = true;
        p++;
        while (p < n && (is_digit(s[p]) || (s[p] == '_' && p + 1 < n && is_digit(s[p + 1])))) p++;
    }
    if (!after_dot && p + 1 < n && (s[p] == 'e' || s[p] == 'E') &&
        (is_digit(s[p + 1]) || (p + 2 < n && (s[p + 1] == '+' || s[p + 1] == '-') && is_digit(s[p + 2])))) {
        flt = true;
        p += 2;
        while (p < n && is_digit(s[p])) p++;
    }
    char buf[72];
    size_t o = 0;
    for (size_t i = start; i < p; i++) {
        if (s[i] == '_') continue;
        if (o + 1 >= sizeof buf) return perr(P, start, "number literal too long");
        buf[o++] = s[i];
    }
    buf[o] = 0;
    tok t = {.t = flt ? T_FLOAT : T_INT, .off = start, .s = {s + start, p - start}};
    errno = 0;
    if (flt) {
        t.f = strtod(buf, NULL);
    } else {
        t.i = strtoll(buf, NULL, 10);
        if (errno == ERANGE) return perr(P, start, "integer literal out of range");
    }
    *pos = p;
    return tok_push(P, t);
}

/* After a tag: `-` strips all following whitespace; otherwise trim_blocks drops one newline
 * after block and comment tags. Records whether the next text starts a line (lstrip_blocks). */
static void after_tag(parser *P, size_t *pos, bool *line_start, bool strip, bool trim) {
    size_t p = *pos;
    if (strip) {
        size_t e = skip_space_fwd(P->s, p, P->n);
        *line_start = e > p && P->s[e - 1] == '\n';
        p = e;
    } else if (trim && p < P->n && P->s[p] == '\n') {
        p++;
        *line_start = true;
    } else {
        *line_start = false;
    }
    *pos = p;
}

/* {% raw %} at q (already known to be a block start); *pos is just past its `%}`. */
static int lex_raw(parser *P, size_t q, size_t body, bool strip_open, size_t *pos, bool *line_start) {
    const char *s = P->s;
    size_t n = P->n;
    if (strip_open) body = skip_space_fwd(s, body, n);
    for (size_t k = body; k + 1 < n; k++) {
        if (s[k] != '{' || s[k + 1] != '%') continue;
        size_t p = k + 2;
        bool strip_close = p < n && s[p] == '-';
        if (p < n && (s[p] == '-' || s[p] == '+')) p++;
        while (p < n && is_ascii_ws(s[p])) p++;
        if (!at_lit(s, n, p, "endraw") || (p + 6 < n && is_name_char(s[p + 6]))) continue;
        p += 6;
        while (p < n && is_ascii_ws(s[p])) p++;
        bool strip_after = false, plus = false;
        if (at_lit(s, n, p, "-%}")) strip_after = true, p += 3;
        else if (at_lit(s, n, p, "+%}")) plus = true, p += 3;
        else if (at_lit(s, n, p, "%}")) p += 2;
        else continue;
        size_t te = strip_close ? skip_space_back(s, body, k) : k;
        if (te > body && tok_push(P, (tok){.t = T_TEXT, .off = body, .s = {s + body, te - body}})) return -1;
        *pos = p;
        after_tag(P, pos, line_start, strip_after, !plus);
        return 0;
    }
    return perr(P, q, "unclosed {%% raw %%} block (missing {%% endraw %%})");
}

static int lex(parser *P) {
    const char *s = P->s;
    size_t n = P->n, pos = 0;
    bool line_start = true;
    while (pos < n) {
        size_t q = pos;
        for (;;) {
            const char *f = memchr(s + q, '{', n - q);
            if (!f) {
                q = n;
                break;
            }
            q = (size_t)(f - s);
            if (q + 1 < n && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')) break;
            q++;
        }
        size_t te = q;
        if (q < n) {
            char kind = s[q + 1], mod = q + 2 < n ? s[q + 2] : 0;
            if (mod == '-') {
                te = skip_space_back(s, pos, te);
            } else if (kind != '{' && mod != '+') { /* lstrip_blocks */
                size_t k = te;
                while (k > pos && (s[k - 1] == ' ' || s[k - 1] == '\t')) k--;
                if (k > pos ? s[k - 1] == '\n' : line_start) te = k;
            }
        }
        if (te > pos && tok_push(P, (tok){.t = T_TEXT, .off = pos, .s = {s + pos, te - pos}})) return -1;
        if (q >= n) break;

        char kind = s[q + 1];
        size_t p = q + 2;
        if (kind == '#') {
            size_t e = p;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) return perr(P, q, "unclosed comment (missing '#}')");
            pos = e + 2;
            after_tag(P, &pos, &line_start, e > p && s[e - 1] == '-', true);
            continue;
        }
        bool block = kind == '%';
        if (p < n && (s[p] == '-' || (block && s[p] == '+'))) p++;
        if (block) { /* {% raw %} switches the lexer off until {% endraw %} */
            size_t r = p;
            while (r < n && is_ascii_ws(s[r])) r++;
            if (at_lit(s, n, r, "raw") && !(r + 3 < n && is_name_char(s[r + 3]))) {
                r += 3;
                while (r < n && is_ascii_ws(s[r])) r++;
                bool strip = false;
                if (r < n && s[r] == '-') strip = true, r++;
                if (at_lit(s, n, r, "%}")) {
                    if (lex_raw(P, q, r + 2, strip, &pos, &line_start)) return -1;
                    continue;
                }
            }
        }
        if (tok_push(P, (tok){.t = block ? T_BLOCK_BEGIN : T_VAR_BEGIN, .off = q})) return -1;
        int depth = 0;
        for (;;) {
            while (p < n && is_ascii_ws(s[p])) p++;
            if (p >= n)
                return perr(P, q, block ? "unclosed tag (missing '%%}')" : "unclosed expression (missing '}}')");
            bool strip = false, plus = false, end = false;
            size_t end_off = p;
            if (block) {
                if (at_lit(s, n, p, "-%}")) end = strip = true, p += 3;
                else if (at_lit(s, n, p, "+%}")) end = plus = true, p += 3;
                else if (at_lit(s, n, p, "%}")) end = true, p += 2;
            } else if (depth <= 0) {
                if (at_lit(s, n, p, "-}}")) end = strip = true, p += 3;
                else if (at_lit(s, n, p, "}}")) end = true, p += 2;
            }
            if (end) {
                if (tok_push(P, (tok){.t = block ? T_BLOCK_END : T_VAR_END, .off = end_off})) return -1;
                pos = p;
                after_tag(P, &pos, &line_start, strip, block && !plus);
                break;
            }
            char c = s[p];
            if (c == '\'' || c == '"') {
                tok t;
                if (lex_string(P, &p, &t) || tok_push(P, t)) return -1;
            } else if (is_digit(c)) {
                if (lex_number(P, &p)) return -1;
            } else if (is_name_start(c)) {
                size_t st = p;
                while (p < n && is_name_char(s[p])) p++;
                if (tok_push(P, (tok){.t = T_NAME, .off = st, .s = {s + st, p - st}})) return -1;
            } else {
                static const char *const two[] = {"**", "//", "==", "!=", "<=", ">="};
                size_t len = 0;
                for (size_t k = 0; k < sizeof two / sizeof two[0]; k++)
                    if (at_lit(s, n, p, two[k])) len = 2;
                if (!len && strchr("+-*/%~<>=()[]{},.:|", c) && c) len = 1;
                if (!len) {
                    if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7F)
                        return perr(P, p, "unexpected byte 0x%02x in tag", (unsigned char)c);
                    return perr(P, p, "unexpected character '%c' in tag", c);
                }
                if (c == '(' || c == '[' || c == '{') depth++;
                if (c == ')' || c == ']' || c == '}') depth--;
                if (tok_push(P, (tok){.t = T_OP, .off = p, .s = {s + p, len}})) return -1;
                p += len;
            }
        }
    }
    return tok_push(P, (tok){.t = T_EOF, .off = n});
}

/* ================================================================== parser */

static tok *cur(parser *P) { return &P->toks[P->i]; }
static tok *peek(parser *P, size_t k) { return P->i + k < P->nt ? &P->toks[P->i + k] : &P->toks[P->nt - 1]; }
static bool tok_op(const tok *t, const char *op) { return t->t == T_OP && jstr_is(t->s, op); }
static bool tok_name(const tok *t, const char *nm) { return t->t == T_NAME && jstr_is(t->s, nm); }
static bool is_op(parser *P, const char *op) { return tok_op(cur(P), op); }
static bool is_name(parser *P, const char *nm) { return tok_name(cur(P), nm); }

static const char *tok_desc(const tok *t, char *buf, size_t cap) {
    switch (t->t) {
    case T_TEXT: return "template text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "end of expression '}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "end of tag '%}'";
    case T_STRING: return "string literal";
    case T_INT:
    case T_FLOAT: return "number";
    case T_EOF: return "end of template";
    default: break;
    }
    snprintf(buf, cap, "'%.*s'", (int)(t->s.n > 40 ? 40 : t->s.n), t->s.p);
    return buf;
}

static int unexpected(parser *P, const char *what) {
    char b[64];
    return perr(P, cur(P)->off, "expected %s, got %s", what, tok_desc(cur(P), b, sizeof b));
}

static int expect_op(parser *P, const char *op) {
    if (!is_op(P, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        return unexpected(P, w);
    }
    P->i++;
    return 0;
}

static int expect_type(parser *P, tt type, const char *what) {
    if (cur(P)->t != type) return unexpected(P, what);
    P->i++;
    return 0;
}

static node *mk(parser *P, node_kind kind, size_t off) {
    node *x = palloc(P, sizeof *x);
    if (!x) return NULL;
    memset(x, 0, sizeof *x);
    x->kind = (uint8_t)kind;
    x->off = off;
    return x;
}

static int nl_push(parser *P, nlist *l, node *x) {
    if (!x) return -1;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        node **v = palloc(P, cap * sizeof *v);
        if (!v) return -1;
        if (l->n) memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return 0;
}

static int enter(parser *P, size_t off) {
    if (++P->depth > NX_JINJA_MAX_DEPTH)
        return perr(P, off, "template nesting deeper than %d levels", NX_JINJA_MAX_DEPTH);
    return 0;
}

static node *p_cond(parser *P, bool with_cond);
static node *p_unary(parser *P, bool with_filter);
static node *p_tuple(parser *P, bool with_cond);

/* Call arguments after '(' up to and including ')': positional first, then name=value. */
static int p_call_args(parser *P, nlist *args) {
    bool kw = false;
    while (!is_op(P, ")")) {
        if (args->n) {
            if (expect_op(P, ",")) return -1;
            if (is_op(P, ")")) break;
        }
        if (is_op(P, "*") || is_op(P, "**"))
            return perr(P, cur(P)->off, "argument unpacking (* / **) is not supported");
        if (cur(P)->t == T_NAME && tok_op(peek(P, 1), "=")) {
            node *k = mk(P, E_KWARG, cur(P)->off);
            if (!k) return -1;
            k->name = cur(P)->s;
            P->i += 2;
            if (!(k->a = p_cond(P, true)) || nl_push(P, args, k)) return -1;
            kw = true;
        } else {
            if (kw) return perr(P, cur(P)->off, "positional argument follows keyword argument");
            if (nl_push(P, args, p_cond(P, true))) return -1;
        }
    }
    P->i++;
    return 0;
}

static node *p_filter_one(parser *P, node *x) {
    tok *t = cur(P);
    if (t->t != T_NAME) return unexpected(P, "a filter name"), NULL;
    int fn = find_filter(t->s);
    if (fn < 0) return perr(P, t->off, "unknown filter '%.*s'", (int)t->s.n, t->s.p), NULL;
    node *f = mk(P, E_FILTER, t->off);
    if (!f) return NULL;
    f->a = x;
    f->name = t->s;
    f->fn = (int16_t)fn;
    P->i++;
    if (is_op(P, "(")) {
        P->i++;
        if (p_call_args(P, &f->args)) return NULL;
    }
    return f;
}

static bool starts_primary(const tok *t) {
    if (t->t == T_NAME) return !tok_name(t, "else") && !tok_name(t, "or") && !tok_name(t, "and") &&
                               !tok_name(t, "if") && !tok_name(t, "in") && !tok_name(t, "is") &&
                               !tok_name(t, "not");
    return t->t == T_STRING || t->t == T_INT || t->t == T_FLOAT || tok_op(t, "[") || tok_op(t, "{");
}

static node *p_primary(parser *P);
static node *p_postfix(parser *P, node *x);

static node *p_test(parser *P, node *x) {
    size_t off = cur(P)->off;
    P->i++; /* is */
    bool neg = false;
    if (is_name(P, "not")) neg = true, P->i++;
    tok *t = cur(P);
    if (t->t != T_NAME) return unexpected(P, "a test name"), NULL;
    int fn = find_test(t->s);
    if (fn < 0) return perr(P, t->off, "unknown test '%.*s'", (int)t->s.n, t->s.p), NULL;
    node *e = mk(P, E_TEST, off);
    if (!e) return NULL;
    e->a = x;
    e->neg = neg;
    e->name = t->s;
    e->fn = (int16_t)fn;
    P->i++;
    if (is_op(P, "(")) {
        P->i++;
        if (p_call_args(P, &e->args)) return NULL;
    } else if (test_nargs(fn) > 0 && starts_primary(cur(P))) {
        node *arg = p_primary(P);
        if (!arg || !(arg = p_postfix(P, arg)) || nl_push(P, &e->args, arg)) return NULL;
    }
    return e;
}

static node *p_subscript(parser *P, node *x) {
    size_t off = cur(P)->off;
    P->i++; /* [ */
    node *part[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (is_op(P, "]")) break;
        if (is_op(P, ":")) {
            if (++k > 2) return perr(P, cur(P)->off, "too many ':' in slice"), NULL;
            slice = true;
            P->i++;
            continue;
        }
        if (part[k]) return unexpected(P, "']'"), NULL;
        if (!(part[k] = p_cond(P, true))) return NULL;
    }
    P->i++;
    if (!slice && !part[0]) return perr(P, off, "empty subscript"), NULL;
    node *e = mk(P, slice ? E_SLICE : E_ITEM, off);
    if (!e) return NULL;
    e->a = x;
    if (slice) {
        for (int j = 0; j < 3; j++) {
            node *p = part[j];
            if (!p && !(p = mk(P, E_CONST, off))) return NULL;
            if (!part[j]) p->val = jv_none();
            if (nl_push(P, &e->args, p)) return NULL;
        }
    } else {
        e->b = part[0];
    }
    return e;
}

static node *p_postfix(parser *P, node *x) {
    while (x) {
        if (is_op(P, ".")) {
            tok *t = peek(P, 1);
            if (t->t == T_NAME) {
                node *e = mk(P, E_ATTR, t->off);
                if (!e) return NULL;
                e->a = x;
                e->name = t->s;
                x = e;
            } else if (t->t == T_INT) {
                node *e = mk(P, E_ITEM, t->off), *k = mk(P, E_CONST, t->off);
                if (!e || !k) return NULL;
                k->val = jv_int(t->i);
                e->a = x;
                e->b = k;
                x = e;
            } else {
                P->i++;
                return unexpected(P, "an attribute name after '.'"), NULL;
            }
            P->i += 2;
        } else if (is_op(P, "[")) {
            x = p_subscript(P, x);
        } else if (is_op(P, "(")) {
            node *e = mk(P, E_CALL, cur(P)->off);
            if (!e) return NULL;
            e->a = x;
            P->i++;
            if (p_call_args(P, &e->args)) return NULL;
            x = e;
        } else {
            break;
        }
    }
    return x;
}

static node *p_primary(parser *P) {
    tok *t = cur(P);
    node *x = NULL;
    switch (t->t) {
    case T_NAME:
        if (!(x = mk(P, E_CONST, t->off))) return NULL;
        if (jstr_is(t->s, "true") || jstr_is(t->s, "True")) x->val = jv_bool(true);
        else if (jstr_is(t->s, "false") || jstr_is(t->s, "False")) x->val = jv_bool(false);
        else if (jstr_is(t->s, "none") || jstr_is(t->s, "None")) x->val = jv_none();
        else x->kind = E_NAME, x->name = t->s;
        P->i++;
        return x;
    case T_STRING: {
        if (!(x = mk(P, E_CONST, t->off))) return NULL;
        size_t total = 0, k = 0;
        while (peek(P, k)->t == T_STRING) total += peek(P, k)->s.n, k++;
        if (k == 1) {
            x->val = jv_str(t->s);
        } else { /* adjacent literals concatenate, as in Python */
            char *buf = palloc(P, total + 1);
            if (!buf) return NULL;
            size_t o = 0;
            for (size_t j = 0; j < k; j++) {
                jstr s = peek(P, j)->s;
                if (s.n) memcpy(buf + o, s.p, s.n);
                o += s.n;
            }
            x->val = jv_str((jstr){buf, o});
        }
        P->i += k;
        return x;
    }
    case T_INT:
    case T_FLOAT:
        if (!(x = mk(P, E_CONST, t->off))) return NULL;
        x->val = t->t == T_INT ? jv_int(t->i) : jv_float(t->f);
        P->i++;
        return x;
    default: break;
    }
    if (tok_op(t, "(")) {
        P->i++;
        if (is_op(P, ")")) {
            P->i++;
            if (!(x = mk(P, E_LIST, t->off))) return NULL;
            x->op = 1;
            return x;
        }
        if (!(x = p_tuple(P, true)) || expect_op(P, ")")) return NULL;
        return x;
    }
    if (tok_op(t, "[")) {
        if (!(x = mk(P, E_LIST, t->off))) return NULL;
        P->i++;
        while (!is_op(P, "]")) {
            if (x->args.n) {
                if (expect_op(P, ",")) return NULL;
                if (is_op(P, "]")) break;
            }
            if (nl_push(P, &x->args, p_cond(P, true))) return NULL;
        }
        P->i++;
        return x;
    }
    if (tok_op(t, "{")) {
        if (!(x = mk(P, E_DICT, t->off))) return NULL;
        P->i++;
        while (!is_op(P, "}")) {
            if (x->args.n) {
                if (expect_op(P, ",")) return NULL;
                if (is_op(P, "}")) break;
            }
            if (nl_push(P, &x->args, p_cond(P, true)) || expect_op(P, ":") ||
                nl_push(P, &x->args, p_cond(P, true)))
                return NULL;
        }
        P->i++;
        return x;
    }
    return unexpected(P, "an expression"), NULL;
}

static node *p_filter_expr(parser *P, node *x) {
    while (x) {
        if (is_op(P, "|")) {
            P->i++;
            x = p_filter_one(P, x);
        } else if (is_name(P, "is")) {
            x = p_test(P, x);
        } else if (is_op(P, "(")) {
            x = p_postfix(P, x);
        } else {
            break;
        }
    }
    return x;
}

static node *p_unary(parser *P, bool with_filter) {
    node *x;
    if (is_op(P, "-") || is_op(P, "+")) {
        size_t off = cur(P)->off;
        bool neg = is_op(P, "-");
        if (enter(P, off)) return NULL;
        P->i++;
        node *a = p_unary(P, false);
        P->depth--;
        if (!a || !(x = mk(P, neg ? E_NEG : E_POS, off))) return NULL;
        x->a = a;
    } else {
        x = p_primary(P);
    }
    x = p_postfix(P, x);
    if (with_filter) x = p_filter_expr(P, x);
    return x;
}

static node *mk_bin(parser *P, node_kind kind, int op, size_t off, node *a, node *b) {
    if (!a || !b) return NULL;
    node *x = mk(P, kind, off);
    if (!x) return NULL;
    x->op = (uint8_t)op;
    x->a = a;
    x->b = b;
    return x;
}

static node *p_pow(parser *P) {
    node *x = p_unary(P, true);
    while (x && is_op(P, "**")) {
        size_t off = cur(P)->off;
        P->i++;
        x = mk_bin(P, E_BIN, OP_POW, off, x, p_unary(P, true));
    }
    return x;
}

static node *p_math2(parser *P) {
    node *x = p_pow(P);
    for (;;) {
        int op = is_op(P, "*") ? OP_MUL : is_op(P, "/") ? OP_DIV : is_op(P, "//") ? OP_FLOORDIV
               : is_op(P, "%") ? OP_MOD : -1;
        if (!x || op < 0) return x;
        size_t off = cur(P)->off;
        P->i++;
        x = mk_bin(P, E_BIN, op, off, x, p_pow(P));
    }
}

static node *p_concat(parser *P) {
    node *x = p_math2(P);
    while (x && is_op(P, "~")) {
        size_t off = cur(P)->off;
        P->i++;
        x = mk_bin(P, E_BIN, OP_CONCAT, off, x, p_math2(P));
    }
    return x;
}

static node *p_math1(parser *P) {
    node *x = p_concat(P);
    while (x && (is_op(P, "+") || is_op(P, "-"))) {
        int op = is_op(P, "+") ? OP_ADD : OP_SUB;
        size_t off = cur(P)->off;
        P->i++;
        x = mk_bin(P, E_BIN, op, off, x, p_concat(P));
    }
    return x;
}

static node *p_compare(parser *P) {
    node *x = p_math1(P);
    if (!x) return NULL;
    node *cmp = NULL;
    for (;;) {
        int op;
        size_t off = cur(P)->off;
        if (is_op(P, "==")) op = CMP_EQ;
        else if (is_op(P, "!=")) op = CMP_NE;
        else if (is_op(P, "<")) op = CMP_LT;
        else if (is_op(P, "<=")) op = CMP_LE;
        else if (is_op(P, ">")) op = CMP_GT;
        else if (is_op(P, ">=")) op = CMP_GE;
        else if (is_name(P, "in")) op = CMP_IN;
        else if (is_name(P, "not") && tok_name(peek(P, 1), "in")) op = CMP_NOTIN, P->i++;
        else break;
        P->i++;
        if (!cmp) {
            if (!(cmp = mk(P, E_CMP, off))) return NULL;
            cmp->a = x;
        }
        size_t k = cmp->args.n;
        if (nl_push(P, &cmp->args, p_math1(P))) return NULL;
        uint8_t *ops = palloc(P, k + 1);
        if (!ops) return NULL;
        if (k) memcpy(ops, cmp->ops, k);
        ops[k] = (uint8_t)op;
        cmp->ops = ops;
    }
    return cmp ? cmp : x;
}

static node *p_not(parser *P) {
    if (is_name(P, "not")) {
        size_t off = cur(P)->off;
        if (enter(P, off)) return NULL;
        P->i++;
        node *a = p_not(P);
        P->depth--;
        node *x = a ? mk(P, E_NOT, off) : NULL;
        if (x) x->a = a;
        return x;
    }
    return p_compare(P);
}

static node *p_and(parser *P) {
    node *x = p_not(P);
    while (x && is_name(P, "and")) {
        size_t off = cur(P)->off;
        P->i++;
        x = mk_bin(P, E_AND, 0, off, x, p_not(P));
    }
    return x;
}

static node *p_or(parser *P) {
    node *x = p_and(P);
    while (x && is_name(P, "or")) {
        size_t off = cur(P)->off;
        P->i++;
        x = mk_bin(P, E_OR, 0, off, x, p_and(P));
    }
    return x;
}

static node *p_cond(parser *P, bool with_cond) {
    if (enter(P, cur(P)->off)) return NULL;
    node *x = p_or(P);
    while (x && with_cond && is_name(P, "if")) {
        size_t off = cur(P)->off;
        P->i++;
        node *test = p_or(P), *other = NULL;
        if (!test) return NULL;
        if (is_name(P, "else")) {
            P->i++;
            if (!(other = p_cond(P, true))) return NULL;
        }
        node *c = mk(P, E_COND, off);
        if (!c) return NULL;
        c->a = test;
        c->b = x;
        c->c = other;
        x = c;
    }
    P->depth--;
    return x;
}

static bool tuple_end(parser *P) {
    tok *t = cur(P);
    return t->t == T_VAR_END || t->t == T_BLOCK_END || tok_op(t, ")") || tok_name(t, "recursive") ||
           tok_op(t, "=");
}

/* An expression, or a tuple when commas follow (`{{ a, b }}`, `(a,)`). */
static node *p_tuple(parser *P, bool with_cond) {
    size_t off = cur(P)->off;
    node *x = p_cond(P, with_cond);
    if (!x || !is_op(P, ",")) return x;
    node *t = mk(P, E_LIST, off);
    if (!t || nl_push(P, &t->args, x)) return NULL;
    t->op = 1;
    while (is_op(P, ",")) {
        P->i++;
        if (tuple_end(P)) break;
        if (nl_push(P, &t->args, p_cond(P, with_cond))) return NULL;
    }
    return t;
}

/* Assignment target: name, name.attr (namespaces, when allowed) or a tuple of names. */
static node *p_target(parser *P, bool allow_attr) {
    bool paren = is_op(P, "(");
    if (paren) P->i++;
    node *tup = NULL, *x = NULL;
    for (;;) {
        tok *t = cur(P);
        if (t->t != T_NAME) return unexpected(P, "a variable name"), NULL;
        if (!(x = mk(P, E_NAME, t->off))) return NULL;
        x->name = t->s;
        P->i++;
        if (allow_attr && !tup && is_op(P, ".") && peek(P, 1)->t == T_NAME) {
            node *a = mk(P, E_ATTR, peek(P, 1)->off);
            if (!a) return NULL;
            a->a = x;
            a->name = peek(P, 1)->s;
            P->i += 2;
            x = a;
        }
        if (!is_op(P, ",") && !tup) break;
        if (x->kind != E_NAME) return perr(P, x->off, "cannot unpack into an attribute"), NULL;
        if (!tup) {
            if (!(tup = mk(P, E_LIST, x->off))) return NULL;
            tup->op = 1;
        }
        if (nl_push(P, &tup->args, x)) return NULL;
        if (!is_op(P, ",")) break;
        P->i++;
        if (cur(P)->t != T_NAME) break;
    }
    if (paren && expect_op(P, ")")) return NULL;
    return tup ? tup : x;
}

/* ------------------------------------------------------------------ statements */

static int p_body(parser *P, nlist *out, const char *const *ends, int *which, size_t open_off,
                  const char *open_name, const char *closer);

static int end_tag(parser *P) { return expect_type(P, T_BLOCK_END, "end of tag '%}'"); }

static int p_params(parser *P, nlist *params) {
    if (expect_op(P, "(")) return -1;
    bool dflt = false;
    while (!is_op(P, ")")) {
        if (params->n && expect_op(P, ",")) return -1;
        if (is_op(P, ")")) break;
        tok *t = cur(P);
        if (t->t != T_NAME) return unexpected(P, "a parameter name");
        node *x = mk(P, E_NAME, t->off);
        if (!x) return -1;
        x->name = t->s;
        P->i++;
        if (is_op(P, "=")) {
            P->i++;
            x->kind = E_KWARG;
            if (!(x->a = p_cond(P, true))) return -1;
            dflt = true;
        } else if (dflt) {
            return perr(P, t->off, "non-default parameter follows default parameter");
        }
        if (nl_push(P, params, x)) return -1;
    }
    P->i++;
    return 0;
}

static node *p_filter_chain(parser *P, size_t off) {
    node *x = mk(P, E_BLOCKVAL, off);
    if (!x || !(x = p_filter_one(P, x))) return NULL;
    while (x && is_op(P, "|")) {
        P->i++;
        x = p_filter_one(P, x);
    }
    return x;
}

static node *p_statement(parser *P) {
    size_t off = cur(P)->off;
    P->i++; /* {% */
    tok *t = cur(P);
    if (t->t != T_NAME) return unexpected(P, "a tag name"), NULL;
    jstr name = t->s;
    P->i++;
    node *x = NULL;
    int w;
    if (jstr_is(name, "if")) {
        if (!(x = mk(P, N_IF, off)) || !(x->a = p_tuple(P, true)) || end_tag(P)) return NULL;
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        if (p_body(P, &x->body, ends, &w, off, "if", "endif")) return NULL;
        node *c = x;
        while (w == 0) {
            node *e = mk(P, N_IF, cur(P)->off);
            if (!e || !(e->a = p_tuple(P, true)) || end_tag(P)) return NULL;
            if (p_body(P, &e->body, ends, &w, off, "if", "endif") || nl_push(P, &c->orelse, e)) return NULL;
            c = e;
        }
        if (w == 1) {
            static const char *const ends2[] = {"endif", NULL};
            if (end_tag(P) || p_body(P, &c->orelse, ends2, &w, off, "if", "endif")) return NULL;
        }
    } else if (jstr_is(name, "for")) {
        if (!(x = mk(P, N_FOR, off)) || !(x->a = p_target(P, false))) return NULL;
        if (!is_name(P, "in")) return unexpected(P, "'in'"), NULL;
        P->i++;
        if (!(x->b = p_tuple(P, false))) return NULL;
        if (is_name(P, "if")) {
            P->i++;
            if (!(x->c = p_cond(P, true))) return NULL;
        }
        if (is_name(P, "recursive")) return perr(P, cur(P)->off, "recursive loops are not supported"), NULL;
        if (end_tag(P)) return NULL;
        static const char *const ends[] = {"else", "endfor", NULL};
        P->loops++;
        int r = p_body(P, &x->body, ends, &w, off, "for", "endfor");
        P->loops--;
        if (r) return NULL;
        if (w == 0) {
            static const char *const ends2[] = {"endfor", NULL};
            if (end_tag(P) || p_body(P, &x->orelse, ends2, &w, off, "for", "endfor")) return NULL;
        }
    } else if (jstr_is(name, "set")) {
        if (!(x = mk(P, N_SET, off)) || !(x->a = p_target(P, true))) return NULL;
        if (is_op(P, "=")) {
            P->i++;
            if (!(x->b = p_tuple(P, true))) return NULL;
        } else {
            x->kind = N_SETBLOCK;
            if (x->a->kind == E_LIST) return perr(P, x->a->off, "a block set assigns a single name"), NULL;
            if (is_op(P, "|")) {
                P->i++;
                if (!(x->b = p_filter_chain(P, cur(P)->off))) return NULL;
            }
            static const char *const ends[] = {"endset", NULL};
            if (end_tag(P) || p_body(P, &x->body, ends, &w, off, "set", "endset")) return NULL;
        }
    } else if (jstr_is(name, "macro")) {
        if (cur(P)->t != T_NAME) return unexpected(P, "a macro name"), NULL;
        if (!(x = mk(P, N_MACRO, off))) return NULL;
        x->name = cur(P)->s;
        P->i++;
        if (p_params(P, &x->args) || end_tag(P)) return NULL;
        static const char *const ends[] = {"endmacro", NULL};
        int loops = P->loops;
        P->loops = 0;
        int r = p_body(P, &x->body, ends, &w, off, "macro", "endmacro");
        P->loops = loops;
        if (r) return NULL;
        if (cur(P)->t == T_NAME) P->i++; /* {% endmacro name %} */
    } else if (jstr_is(name, "call")) {
        if (!(x = mk(P, N_CALLBLOCK, off))) return NULL;
        if (is_op(P, "(") && p_params(P, &x->args)) return NULL;
        if (!(x->a = p_cond(P, true))) return NULL;
        if (x->a->kind != E_CALL) return perr(P, x->a->off, "{%% call %%} needs a macro call"), NULL;
        static const char *const ends[] = {"endcall", NULL};
        int loops = P->loops;
        P->loops = 0;
        int r = end_tag(P) || p_body(P, &x->body, ends, &w, off, "call", "endcall");
        P->loops = loops;
        if (r) return NULL;
    } else if (jstr_is(name, "filter")) {
        if (!(x = mk(P, N_FILTERBLOCK, off)) || !(x->b = p_filter_chain(P, cur(P)->off))) return NULL;
        static const char *const ends[] = {"endfilter", NULL};
        if (end_tag(P) || p_body(P, &x->body, ends, &w, off, "filter", "endfilter")) return NULL;
    } else if (jstr_is(name, "break") || jstr_is(name, "continue")) {
        if (!P->loops) return perr(P, t->off, "'%.*s' outside of a loop", (int)name.n, name.p), NULL;
        if (!(x = mk(P, jstr_is(name, "break") ? N_BREAK : N_CONTINUE, off))) return NULL;
    } else if (jstr_is(name, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        if (!(x = mk(P, N_BLOCK, off)) || end_tag(P) ||
            p_body(P, &x->body, ends, &w, off, "generation", "endgeneration"))
            return NULL;
    } else if (jstr_is(name, "with")) {
        if (!(x = mk(P, N_BLOCK, off))) return NULL;
        x->op = 1;
        while (cur(P)->t == T_NAME) {
            node *k = mk(P, E_KWARG, cur(P)->off);
            if (!k) return NULL;
            k->name = cur(P)->s;
            P->i++;
            if (expect_op(P, "=") || !(k->a = p_cond(P, true)) || nl_push(P, &x->args, k)) return NULL;
            if (!is_op(P, ",")) break;
            P->i++;
        }
        static const char *const ends[] = {"endwith", NULL};
        if (end_tag(P) || p_body(P, &x->body, ends, &w, off, "with", "endwith")) return NULL;
    } else if (jstr_is(name, "do")) {
        if (!(x = mk(P, N_DO, off)) || !(x->a = p_tuple(P, true))) return NULL;
    } else if (jstr_is(name, "include") || jstr_is(name, "extends") || jstr_is(name, "import") ||
               jstr_is(name, "from") || jstr_is(name, "block") || jstr_is(name, "autoescape")) {
        return perr(P, t->off, "unsupported tag '%.*s'", (int)name.n, name.p), NULL;
    } else if (jstr_is(name, "elif") || jstr_is(name, "else") || (name.n > 3 && !memcmp(name.p, "end", 3))) {
        return perr(P, t->off, "unexpected '{%% %.*s %%}'", (int)name.n, name.p), NULL;
    } else {
        return perr(P, t->off, "unknown tag '%.*s'", (int)name.n, name.p), NULL;
    }
    if (end_tag(P)) return NULL;
    return x;
}

static int p_body(parser *P, nlist *out, const char *const *ends, int *which, size_t open_off,
                  const char *open_name, const char *closer) {
    if (enter(P, cur(P)->off)) return -1;
    for (;;) {
        tok *t = cur(P);
        if (t->t == T_EOF) {
            if (ends) return perr(P, open_off, "'{%% %s %%}' is never closed (missing {%% %s %%})", open_name, closer);
            break;
        }
        if (t->t == T_TEXT) {
            node *x = mk(P, N_TEXT, t->off);
            if (!x) return -1;
            x->name = t->s;
            P->i++;
            if (nl_push(P, out, x)) return -1;
        } else if (t->t == T_VAR_BEGIN) {
            node *x = mk(P, N_OUTPUT, t->off);
            P->i++;
            if (!x || !(x->a = p_tuple(P, true)) || expect_type(P, T_VAR_END, "end of expression '}}'") ||
                nl_push(P, out, x))
                return -1;
        } else if (t->t == T_BLOCK_BEGIN) {
            tok *nm = peek(P, 1);
            int hit = -1;
            for (int k = 0; ends && ends[k]; k++)
                if (tok_name(nm, ends[k])) hit = k;
            if (hit >= 0) {
                P->i += 2;
                *which = hit;
                break;
            }
            if (nl_push(P, out, p_statement(P))) return -1;
        } else {
            return unexpected(P, "template text or a tag");
        }
    }
    P->depth--;
    return 0;
}

/* ================================================================== runtime core */

typedef struct frame {
    struct frame *parent;
    jdict vars; /* the names this scope assigned */
} frame;

typedef struct jbuf {
    char *p;
    size_t n, cap;
} jbuf;

typedef struct jmacro {
    const node *def; /* N_MACRO, or N_CALLBLOCK for `caller` */
    frame *closure;
} jmacro;

typedef struct jmethod {
    jv self;
    const bdef *def;
} jmethod;

typedef struct jloop {
    int64_t index0, length;
    const jlist *items;
} jloop;

typedef struct args {
    jv *pos;
    size_t npos;
    jstr *kn;
    jv *kv;
    size_t nkw;
} args;

typedef struct rt {
    arena ar;
    const nx_jinja *T;
    nx_error *err;
    bool failed;
    uint64_t steps, max_steps;
    int call_depth;
    jbuf *out;
    jv blockval;
} rt;

enum { R_OK = 0, R_BREAK = 1, R_CONTINUE = 2 };

static int rt_fail(rt *R, const node *at, nx_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int rt_fail(rt *R, const node *at, nx_status st, const char *fmt, ...) {
    if (R->failed) return -1;
    R->failed = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) {
        int line, col;
        line_col(R->T->src, R->T->len, at->off, &line, &col);
        nx_fail(R->err, st, "template line %d, column %d: %s", line, col, msg);
    } else {
        nx_fail(R->err, st, "template: %s", msg);
    }
    return -1;
}

static void *ralloc(rt *R, size_t n) {
    void *p = arena_alloc(&R->ar, n ? n : 1);
    if (!p) {
        if (R->ar.over)
            rt_fail(R, NULL, NX_E_FORMAT, "render exceeded its memory budget of %zu bytes", R->ar.cap);
        else
            rt_fail(R, NULL, NX_E_NOMEM, "out of memory");
    }
    return p;
}

/* Charges k units against the step budget (nodes, iterations, bytes scanned / 64). */
static int step(rt *R, const node *at, uint64_t k) {
    R->steps += k;
    if (R->steps > R->max_steps)
        return rt_fail(R, at, NX_E_FORMAT, "render exceeded its step budget of %" PRIu64 " steps",
                       R->max_steps);
    return 0;
}

static int jb_reserve(rt *R, jbuf *b, size_t extra) {
    if (extra > SIZE_MAX / 4 - b->n) return rt_fail(R, NULL, NX_E_FORMAT, "string too large");
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 32;
    while (cap < b->n + extra) cap *= 2;
    char *p = ralloc(R, cap);
    if (!p) return -1;
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
    return 0;
}

static int jb_put(rt *R, jbuf *b, const char *s, size_t n) {
    if (!n) return 0;
    if (jb_reserve(R, b, n)) return -1;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static int jb_puts(rt *R, jbuf *b, const char *z) { return jb_put(R, b, z, strlen(z)); }
static int jb_putc(rt *R, jbuf *b, char c) { return jb_put(R, b, &c, 1); }
static int jb_cp(rt *R, jbuf *b, int32_t cp) {
    char u[4];
    return jb_put(R, b, u, utf8_put(cp, u));
}
static jstr jb_str(const jbuf *b) { return (jstr){b->p ? b->p : "", b->n}; }

static jstr str_dup(rt *R, const char *s, size_t n, bool *ok) {
    char *p = ralloc(R, n + 1);
    *ok = p != NULL;
    if (!p) return (jstr){"", 0};
    if (n) memcpy(p, s, n);
    return (jstr){p, n};
}

/* ------------------------------------------------------------------ containers */

static jlist *list_new(rt *R, size_t cap) {
    jlist *l = ralloc(R, sizeof *l);
    if (!l) return NULL;
    l->n = 0;
    l->cap = cap;
    l->v = NULL;
    if (cap && cap > SIZE_MAX / sizeof(jv)) return rt_fail(R, NULL, NX_E_FORMAT, "list too large"), NULL;
    if (cap && !(l->v = ralloc(R, cap * sizeof(jv)))) return NULL;
    return l;
}

static int list_push(rt *R, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        if (cap > SIZE_MAX / sizeof(jv)) return rt_fail(R, NULL, NX_E_FORMAT, "list too large");
        jv *nv = ralloc(R, cap * sizeof(jv));
        if (!nv) return -1;
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

static jv jv_list(jlist *l, bool tuple) { return (jv){.t = JT_LIST, .tuple = tuple, .u.l = l}; }

static jdict *dict_new(rt *R) {
    jdict *d = ralloc(R, sizeof *d);
    if (d) memset(d, 0, sizeof *d);
    return d;
}

static bool dict_get(const jdict *d, jstr k, jv *out) {
    for (size_t i = 0; i < d->n; i++)
        if (jstr_eq(d->k[i], k)) {
            *out = d->v[i];
            return true;
        }
    return false;
}

static int dict_set(rt *R, jdict *d, jstr k, jv v) {
    for (size_t i = 0; i < d->n; i++)
        if (jstr_eq(d->k[i], k)) {
            d->v[i] = v;
            return 0;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jstr *nk = ralloc(R, cap * sizeof *nk);
        jv *nv = nk ? ralloc(R, cap * sizeof *nv) : NULL;
        if (!nv) return -1;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return 0;
}

static frame *frame_new(rt *R, frame *parent) {
    frame *f = ralloc(R, sizeof *f);
    if (f) {
        memset(f, 0, sizeof *f);
        f->parent = parent;
    }
    return f;
}

static int frame_set(rt *R, frame *F, jstr k, jv v) { return dict_set(R, &F->vars, k, v); }

static bool frame_get(const frame *F, jstr k, jv *out) {
    for (; F; F = F->parent)
        if (dict_get(&F->vars, k, out)) return true;
    return false;
}

/* ------------------------------------------------------------------ JSON context -> values */

static int from_json(rt *R, const json_t *j, jv *out, int depth) {
    if (depth > MAX_VALUE_DEPTH) return rt_fail(R, NULL, NX_E_FORMAT, "context nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jdict *d = dict_new(R);
        if (!d) return -1;
        const char *key;
        json_t *val;
        void *it;
        for (it = json_object_iter((json_t *)j); it; it = json_object_iter_next((json_t *)j, it)) {
            key = json_object_iter_key(it);
            val = json_object_iter_value(it);
            jv v;
            if (from_json(R, val, &v, depth + 1)) return -1;
            /* JSON keys are unique, so append without the linear duplicate scan of dict_set. */
            if (d->n == d->cap) {
                size_t cap = d->cap ? d->cap * 2 : json_object_size(j);
                jstr *nk = ralloc(R, cap * sizeof *nk);
                jv *nv = nk ? ralloc(R, cap * sizeof *nv) : NULL;
                if (!nv) return -1;
                if (d->n) {
                    memcpy(nk, d->k, d->n * sizeof *nk);
                    memcpy(nv, d->v, d->n * sizeof *nv);
                }
                d->k = nk;
                d->v = nv;
                d->cap = cap;
            }
            d->k[d->n] = (jstr){key, json_object_iter_key_len(it)};
            d->v[d->n++] = v;
        }
        *out = (jv){.t = JT_DICT, .u.d = d};
        return 0;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jlist *l = list_new(R, n);
        if (!l) return -1;
        for (size_t i = 0; i < n; i++)
            if (from_json(R, json_array_get(j, i), &l->v[i], depth + 1)) return -1;
        l->n = n;
        *out = jv_list(l, false);
        return 0;
    }
    case JSON_STRING: *out = jv_str((jstr){json_string_value(j), json_string_length(j)}); return 0;
    case JSON_INTEGER: *out = jv_int((int64_t)json_integer_value(j)); return 0;
    case JSON_REAL: *out = jv_float(json_real_value(j)); return 0;
    case JSON_TRUE: *out = jv_bool(true); return 0;
    case JSON_FALSE: *out = jv_bool(false); return 0;
    case JSON_NULL: *out = jv_none(); return 0;
    }
    return rt_fail(R, NULL, NX_E_ARG, "unknown JSON value type");
}

/* ------------------------------------------------------------------ printing */

static const char *tname(jv v) {
    switch ((jt)v.t) {
    case JT_UNDEF: return "Undefined";
    case JT_NONE: return "NoneType";
    case JT_BOOL: return "bool";
    case JT_INT: return "int";
    case JT_FLOAT: return "float";
    case JT_STR: return "str";
    case JT_LIST: return v.tuple ? "tuple" : "list";
    case JT_DICT: return "dict";
    case JT_NS: return "Namespace";
    case JT_MACRO: return "Macro";
    case JT_METHOD:
    case JT_FUNC: return "builtin_function_or_method";
    case JT_LOOP: return "LoopContext";
    }
    return "object";
}

/* Python's repr(float): the shortest digits that round-trip, fixed notation for exponents in
 * [-4, 16), scientific otherwise. */
static void fmt_float(double d, char *out, size_t cap) {
    if (isnan(d)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(out, cap, d > 0 ? "inf" : "-inf");
        return;
    }
    char tmp[48];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    /* tmp: [-]D[.DDD]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.' && nd < sizeof digits - 1) digits[nd++] = *p;
    digits[nd] = 0;
    int exp = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    char *o = out;
    size_t left = cap;
#define EMIT(...)                                                                                  \
    do {                                                                                           \
        int k_ = snprintf(o, left, __VA_ARGS__);                                                   \
        if (k_ < 0 || (size_t)k_ >= left) return;                                                  \
        o += k_;                                                                                   \
        left -= (size_t)k_;                                                                        \
    } while (0)
    if (neg) EMIT("-");
    if (exp < -4 || exp >= 16) {
        EMIT("%c", digits[0]);
        if (nd > 1) EMIT(".%s", digits + 1);
        EMIT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp >= 0) {
        for (int i = 0; i <= exp; i++) EMIT("%c", (size_t)i < nd ? digits[i] : '0');
        EMIT(".");
        if ((size_t)exp + 1 < nd) EMIT("%s", digits + exp + 1);
        else EMIT("0");
    } else {
        EMIT("0.");
        for (int i = 0; i < -exp - 1; i++) EMIT("0");
        EMIT("%s", digits);
    }
#undef EMIT
}

static int put_int(rt *R, jbuf *b, int64_t i) {
    char t[32];
    snprintf(t, sizeof t, "%" PRId64, i);
    return jb_puts(R, b, t);
}

static int put_float(rt *R, jbuf *b, double f) {
    char t[48];
    fmt_float(f, t, sizeof t);
    return jb_puts(R, b, t);
}

static int repr_str(rt *R, jbuf *b, jstr s) {
    bool sq = memchr(s.p, '\'', s.n) != NULL, dq = memchr(s.p, '"', s.n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    if (jb_putc(R, b, q)) return -1;
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        char e[8];
        const char *rep = NULL;
        if (c == '\\') rep = "\\\\";
        else if (c == (unsigned char)q) rep = q == '\'' ? "\\'" : "\\\"";
        else if (c == '\n') rep = "\\n";
        else if (c == '\r') rep = "\\r";
        else if (c == '\t') rep = "\\t";
        else if (c < 0x20 || c == 0x7F) {
            snprintf(e, sizeof e, "\\x%02x", c);
            rep = e;
        }
        if (rep ? jb_puts(R, b, rep) : jb_putc(R, b, (char)c)) return -1;
    }
    return jb_putc(R, b, q);
}

static int to_repr(rt *R, jv v, jbuf *b, int depth);

/* Python's str(): what {{ value }} prints. */
static int to_str(rt *R, jv v, jbuf *b, int depth) {
    if (depth > MAX_VALUE_DEPTH) return rt_fail(R, NULL, NX_E_FORMAT, "value nested too deeply to print");
    switch ((jt)v.t) {
    case JT_UNDEF: return 0;
    case JT_NONE: return jb_puts(R, b, "None");
    case JT_BOOL: return jb_puts(R, b, v.u.b ? "True" : "False");
    case JT_INT: return put_int(R, b, v.u.i);
    case JT_FLOAT: return put_float(R, b, v.u.f);
    case JT_STR: return jb_put(R, b, v.u.s.p, v.u.s.n);
    case JT_LIST: {
        if (jb_putc(R, b, v.tuple ? '(' : '[')) return -1;
        for (size_t i = 0; i < v.u.l->n; i++)
            if ((i && jb_puts(R, b, ", ")) || to_repr(R, v.u.l->v[i], b, depth + 1)) return -1;
        if (v.tuple && v.u.l->n == 1 && jb_putc(R, b, ',')) return -1;
        return jb_putc(R, b, v.tuple ? ')' : ']');
    }
    case JT_DICT:
    case JT_NS: {
        if (v.t == JT_NS && jb_puts(R, b, "<Namespace ")) return -1;
        if (jb_putc(R, b, '{')) return -1;
        for (size_t i = 0; i < v.u.d->n; i++)
            if ((i && jb_puts(R, b, ", ")) || repr_str(R, b, v.u.d->k[i]) || jb_puts(R, b, ": ") ||
                to_repr(R, v.u.d->v[i], b, depth + 1))
                return -1;
        if (jb_putc(R, b, '}')) return -1;
        return v.t == JT_NS ? jb_putc(R, b, '>') : 0;
    }
    case JT_MACRO: return jb_puts(R, b, "<Macro>");
    case JT_METHOD:
    case JT_FUNC: return jb_puts(R, b, "<built-in function>");
    case JT_LOOP: return jb_puts(R, b, "<LoopContext>");
    }
    return 0;
}

static int to_repr(rt *R, jv v, jbuf *b, int depth) {
    if (v.t == JT_STR) return repr_str(R, b, v.u.s);
    return to_str(R, v, b, depth);
}

/* The string form of v without copying when v already is a string. */
static int as_str(rt *R, jv v, jstr *out) {
    if (v.t == JT_STR) {
        *out = v.u.s;
        return 0;
    }
    jbuf b = {0};
    if (to_str(R, v, &b, 0)) return -1;
    *out = jb_str(&b);
    return 0;
}

/* ------------------------------------------------------------------ JSON output (tojson) */

typedef struct jopts {
    int64_t indent; /* < 0: single line */
    bool ascii, sort;
    jstr item_sep, key_sep;
} jopts;

static int json_str(rt *R, jbuf *b, jstr s, bool ascii) {
    if (jb_reserve(R, b, s.n + 2) || jb_putc(R, b, '"')) return -1;
    for (size_t i = 0; i < s.n;) {
        unsigned char c = (unsigned char)s.p[i];
        char e[16];
        if (c == '"' || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            e[2] = 0;
        } else if (c == '\n') strcpy(e, "\\n");
        else if (c == '\r') strcpy(e, "\\r");
        else if (c == '\t') strcpy(e, "\\t");
        else if (c == '\b') strcpy(e, "\\b");
        else if (c == '\f') strcpy(e, "\\f");
        else if (c < 0x20 || (ascii && c == 0x7F)) snprintf(e, sizeof e, "\\u%04x", c);
        else if (ascii && c >= 0x80) {
            size_t adv;
            int32_t cp = utf8_next(s.p + i, s.n - i, &adv);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(e, sizeof e, "\\u%04x", (unsigned)cp);
            }
            if (jb_puts(R, b, e)) return -1;
            i += adv;
            continue;
        } else {
            size_t j = i + 1;
            while (j < s.n) {
                unsigned char d = (unsigned char)s.p[j];
                if (d == '"' || d == '\\' || d < 0x20 || (ascii && d >= 0x7F)) break;
                j++;
            }
            if (jb_put(R, b, s.p + i, j - i)) return -1;
            i = j;
            continue;
        }
        if (jb_puts(R, b, e)) return -1;
        i++;
    }
    return jb_putc(R, b, '"');
}

static int json_nl(rt *R, jbuf *b, const jopts *o, int level) {
    if (o->indent < 0) return 0;
    if (jb_putc(R, b, '\n')) return -1;
    for (int64_t i = 0; i < o->indent * level; i++)
        if (jb_putc(R, b, ' ')) return -1;
    return 0;
}

static int jstr_cmp(jstr a, jstr b) {
    size_t m = a.n < b.n ? a.n : b.n;
    int c = m ? memcmp(a.p, b.p, m) : 0;
    return c ? c : (a.n < b.n ? -1 : a.n > b.n);
}

static int tojson(rt *R, const node *at, jv v, jbuf *b, const jopts *o, int level) {
    if (level > MAX_VALUE_DEPTH) return rt_fail(R, at, NX_E_FORMAT, "value nested too deeply for tojson");
    switch ((jt)v.t) {
    case JT_UNDEF:
    case JT_NONE: return jb_puts(R, b, "null");
    case JT_BOOL: return jb_puts(R, b, v.u.b ? "true" : "false");
    case JT_INT: return put_int(R, b, v.u.i);
    case JT_FLOAT:
        if (isnan(v.u.f)) return jb_puts(R, b, "NaN");
        if (isinf(v.u.f)) return jb_puts(R, b, v.u.f > 0 ? "Infinity" : "-Infinity");
        return put_float(R, b, v.u.f);
    case JT_STR: return json_str(R, b, v.u.s, o->ascii);
    case JT_LIST: {
        const jlist *l = v.u.l;
        if (!l->n) return jb_puts(R, b, "[]");
        if (jb_putc(R, b, '[')) return -1;
        for (size_t i = 0; i < l->n; i++) {
            if (i && jb_put(R, b, o->item_sep.p, o->item_sep.n)) return -1;
            if (json_nl(R, b, o, level + 1) || tojson(R, at, l->v[i], b, o, level + 1)) return -1;
        }
        if (json_nl(R, b, o, level)) return -1;
        return jb_putc(R, b, ']');
    }
    case JT_DICT:
    case JT_NS: {
        const jdict *d = v.u.d;
        if (!d->n) return jb_puts(R, b, "{}");
        size_t *ord = ralloc(R, d->n * sizeof *ord);
        if (!ord) return -1;
        for (size_t i = 0; i < d->n; i++) ord[i] = i;
        if (o->sort) /* insertion sort keeps equal keys stable; dicts here are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && jstr_cmp(d->k[ord[j - 1]], d->k[ord[j]]) > 0; j--) {
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        if (jb_putc(R, b, '{')) return -1;
        for (size_t i = 0; i < d->n; i++) {
            if (i && jb_put(R, b, o->item_sep.p, o->item_sep.n)) return -1;
            if (json_nl(R, b, o, level + 1) || json_str(R, b, d->k[ord[i]], o->ascii) ||
                jb_put(R, b, o->key_sep.p, o->key_sep.n) || tojson(R, at, d->v[ord[i]], b, o, level + 1))
                return -1;
        }
        if (json_nl(R, b, o, level)) return -1;
        return jb_putc(R, b, '}');
    }
    default: return rt_fail(R, at, NX_E_FORMAT, "object of type '%s' is not JSON serializable", tname(v));
    }
}

/* ------------------------------------------------------------------ truth, equality, order */

static bool truthy(jv v) {
    switch ((jt)v.t) {
    case JT_UNDEF:
    case JT_NONE: return false;
    case JT_BOOL: return v.u.b;
    case JT_INT: return v.u.i != 0;
    case JT_FLOAT: return v.u.f != 0;
    case JT_STR: return v.u.s.n != 0;
    case JT_LIST: return v.u.l->n != 0;
    case JT_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static bool is_num(jv v) { return v.t == JT_BOOL || v.t == JT_INT || v.t == JT_FLOAT; }
static int64_t num_i(jv v) { return v.t == JT_BOOL ? v.u.b : v.u.i; }
static double num_f(jv v) { return v.t == JT_FLOAT ? v.u.f : (double)num_i(v); }

static bool jv_equal(jv a, jv b, int depth) {
    if (depth > MAX_VALUE_DEPTH) return false;
    if (is_num(a) && is_num(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) return num_i(a) == num_i(b);
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t) return false;
    switch ((jt)a.t) {
    case JT_UNDEF:
    case JT_NONE: return true;
    case JT_STR: return jstr_eq(a.u.s, b.u.s);
    case JT_LIST:
        if (a.tuple != b.tuple || a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    case JT_DICT:
    case JT_NS:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv o;
            if (!dict_get(b.u.d, a.u.d->k[i], &o) || !jv_equal(a.u.d->v[i], o, depth + 1)) return false;
        }
        return true;
    case JT_MACRO: return a.u.m == b.u.m;
    case JT_FUNC: return a.id == b.id;
    case JT_METHOD: return a.u.bm == b.u.bm;
    case JT_LOOP: return a.u.lp == b.u.lp;
    default: return false;
    }
}

/* Python ordering (<): numbers with numbers, strings by code point, lists lexicographically. */
static int jv_order(rt *R, const node *at, jv a, jv b, int *res, int depth) {
    if (depth > MAX_VALUE_DEPTH) return rt_fail(R, at, NX_E_FORMAT, "value nested too deeply to compare");
    if (is_num(a) && is_num(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) *res = (num_i(a) > num_i(b)) - (num_i(a) < num_i(b));
        else *res = (num_f(a) > num_f(b)) - (num_f(a) < num_f(b));
        return 0;
    }
    if (a.t == JT_STR && b.t == JT_STR) {
        int c = jstr_cmp(a.u.s, b.u.s);
        *res = (c > 0) - (c < 0);
        return 0;
    }
    if (a.t == JT_LIST && b.t == JT_LIST) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a.u.l->v[i], b.u.l->v[i], depth + 1)) continue;
            return jv_order(R, at, a.u.l->v[i], b.u.l->v[i], res, depth + 1);
        }
        *res = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return 0;
    }
    if (a.t == JT_UNDEF || b.t == JT_UNDEF) {
        jstr h = a.t == JT_UNDEF ? a.u.s : b.u.s;
        return rt_fail(R, at, NX_E_FORMAT, "'%.*s' is undefined", (int)h.n, h.p);
    }
    return rt_fail(R, at, NX_E_FORMAT, "'<' not supported between instances of '%s' and '%s'", tname(a),
                   tname(b));
}

static int undefined_error(rt *R, const node *at, jv v) {
    jstr h = v.u.s;
    if (!h.n) return rt_fail(R, at, NX_E_FORMAT, "use of an undefined value");
    return rt_fail(R, at, NX_E_FORMAT, "'%.*s' is undefined", (int)(h.n > 80 ? 80 : h.n), h.p);
}

/* ================================================================== evaluation */

static int eval(rt *R, frame *F, const node *n, jv *out);
static int render(rt *R, frame *F, const nlist *body);
static const bdef *find_method(jv self, jstr name);
static const bdef *find_global(jstr name, uint16_t *id);
static const bdef *global_def(uint16_t id);

/* The code points of s as a list of one-character strings. */
static int str_chars(rt *R, jstr s, jlist **out) {
    jlist *l = list_new(R, utf8_count(s.p, s.n));
    if (!l) return -1;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        utf8_next(s.p + i, s.n - i, &adv);
        if (list_push(R, l, jv_str((jstr){s.p + i, adv}))) return -1;
        i += adv;
    }
    *out = l;
    return 0;
}

/* What `for x in v` walks: list items, dict keys, string characters; undefined is empty. */
static int iter_items(rt *R, const node *at, jv v, jlist **out) {
    switch ((jt)v.t) {
    case JT_LIST: *out = v.u.l; return 0;
    case JT_DICT: {
        jlist *l = list_new(R, v.u.d->n);
        if (!l) return -1;
        for (size_t i = 0; i < v.u.d->n; i++) l->v[i] = jv_str(v.u.d->k[i]);
        l->n = v.u.d->n;
        *out = l;
        return 0;
    }
    case JT_STR: return step(R, at, v.u.s.n / 16) ? -1 : str_chars(R, v.u.s, out);
    case JT_UNDEF: return (*out = list_new(R, 0)) ? 0 : -1;
    default: return rt_fail(R, at, NX_E_FORMAT, "'%s' object is not iterable", tname(v));
    }
}

static jv method_value(rt *R, jv self, const bdef *d) {
    jmethod *m = ralloc(R, sizeof *m);
    if (!m) return jv_undef((jstr){"", 0});
    m->self = self;
    m->def = d;
    return (jv){.t = JT_METHOD, .u.bm = m};
}

static int loop_attr(rt *R, const jloop *lp, jstr name, jv *out) {
    int64_t i = lp->index0, n = lp->length;
    if (jstr_is(name, "index")) *out = jv_int(i + 1);
    else if (jstr_is(name, "index0")) *out = jv_int(i);
    else if (jstr_is(name, "revindex")) *out = jv_int(n - i);
    else if (jstr_is(name, "revindex0")) *out = jv_int(n - i - 1);
    else if (jstr_is(name, "first")) *out = jv_bool(i == 0);
    else if (jstr_is(name, "last")) *out = jv_bool(i == n - 1);
    else if (jstr_is(name, "length")) *out = jv_int(n);
    else if (jstr_is(name, "depth")) *out = jv_int(1);
    else if (jstr_is(name, "depth0")) *out = jv_int(0);
    else if (jstr_is(name, "previtem")) *out = i > 0 ? lp->items->v[i - 1] : jv_undef(name);
    else if (jstr_is(name, "nextitem")) *out = i + 1 < n ? lp->items->v[i + 1] : jv_undef(name);
    else {
        (void)R;
        *out = jv_undef(name);
    }
    return 0;
}

/* obj.name: methods first (Python getattr), then mapping keys, as Jinja2's getattr does. */
static int get_attr(rt *R, jv obj, jstr name, jv *out) {
    const bdef *m = find_method(obj, name);
    if (m) {
        *out = method_value(R, obj, m);
        return out->t == JT_UNDEF ? -1 : 0;
    }
    if ((obj.t == JT_DICT || obj.t == JT_NS) && dict_get(obj.u.d, name, out)) return 0;
    if (obj.t == JT_LOOP) {
        if (jstr_is(name, "cycle")) {
            *out = method_value(R, obj, find_method(obj, name));
            return 0;
        }
        return loop_attr(R, obj.u.lp, name, out);
    }
    *out = jv_undef(name);
    return 0;
}

static bool cp_offsets(const char *s, size_t n, int64_t idx, size_t *start, size_t *len) {
    size_t count = utf8_count(s, n);
    if (idx < 0) idx += (int64_t)count;
    if (idx < 0 || (uint64_t)idx >= count) return false;
    size_t i = 0;
    for (int64_t k = 0; k < idx && i < n; k++) {
        size_t adv;
        utf8_next(s + i, n - i, &adv);
        i += adv;
    }
    if (i >= n) return false;
    size_t adv;
    utf8_next(s + i, n - i, &adv);
    *start = i;
    *len = adv;
    return true;
}

/* obj[key]: mapping keys / sequence indexes first, then attributes (Jinja2's getitem). */
static int get_item(rt *R, const node *at, jv obj, jv key, jv *out) {
    if ((obj.t == JT_DICT || obj.t == JT_NS) && key.t == JT_STR) {
        if (dict_get(obj.u.d, key.u.s, out)) return 0;
        return get_attr(R, obj, key.u.s, out);
    }
    if ((obj.t == JT_LIST || obj.t == JT_STR) && (key.t == JT_INT || key.t == JT_BOOL)) {
        int64_t i = num_i(key);
        if (obj.t == JT_LIST) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            *out = i >= 0 && i < n ? obj.u.l->v[i] : jv_undef((jstr){"[index]", 7});
            return 0;
        }
        size_t st, len;
        if (step(R, at, obj.u.s.n / 64)) return -1;
        *out = cp_offsets(obj.u.s.p, obj.u.s.n, i, &st, &len) ? jv_str((jstr){obj.u.s.p + st, len})
                                                                : jv_undef((jstr){"[index]", 7});
        return 0;
    }
    if (key.t == JT_STR) return get_attr(R, obj, key.u.s, out);
    *out = jv_undef((jstr){"[item]", 6});
    return 0;
}

/* Python slice index normalisation; returns the number of selected elements. */
static int64_t slice_indices(int64_t len, jv jstart, jv jstop, int64_t stepv, int64_t *start) {
    int64_t st, sp;
    if (stepv > 0) {
        st = jstart.t == JT_NONE ? 0 : num_i(jstart);
        sp = jstop.t == JT_NONE ? len : num_i(jstop);
        if (st < 0) st = st + len < 0 ? 0 : st + len;
        if (st > len) st = len;
        if (sp < 0) sp = sp + len < 0 ? 0 : sp + len;
        if (sp > len) sp = len;
        *start = st;
        return sp > st ? (sp - st - 1) / stepv + 1 : 0;
    }
    st = jstart.t == JT_NONE ? len - 1 : num_i(jstart);
    sp = jstop.t == JT_NONE ? -1 : num_i(jstop);
    if (jstart.t != JT_NONE) {
        if (st < 0) st = st + len < 0 ? -1 : st + len;
        if (st >= len) st = len - 1;
    }
    if (jstop.t != JT_NONE) {
        if (sp < 0) sp = sp + len < 0 ? -1 : sp + len;
        if (sp >= len) sp = len - 1;
    }
    *start = st;
    return st > sp ? (st - sp - 1) / (-stepv) + 1 : 0;
}

static int do_slice(rt *R, const node *at, jv obj, jv a, jv b, jv c, jv *out) {
    jv parts[3] = {a, b, c};
    for (int k = 0; k < 3; k++)
        if (parts[k].t != JT_NONE && parts[k].t != JT_INT && parts[k].t != JT_BOOL)
            return rt_fail(R, at, NX_E_FORMAT, "slice indices must be integers or None");
    int64_t stp = c.t == JT_NONE ? 1 : num_i(c);
    if (stp == 0) return rt_fail(R, at, NX_E_FORMAT, "slice step cannot be zero");
    if (stp == INT64_MIN) stp = -INT64_MAX;
    jlist *src;
    if (obj.t == JT_STR && stp == 1) { /* contiguous: a view into the string, no copy */
        jstr s = obj.u.s;
        if (step(R, at, s.n / 64)) return -1;
        int64_t start, cnt = slice_indices((int64_t)utf8_count(s.p, s.n), a, b, 1, &start);
        size_t i = 0, adv;
        for (int64_t k = 0; k < start && i < s.n; k++, i += adv) utf8_next(s.p + i, s.n - i, &adv);
        size_t j = i;
        for (int64_t k = 0; k < cnt && j < s.n; k++, j += adv) utf8_next(s.p + j, s.n - j, &adv);
        *out = jv_str((jstr){s.p + i, j - i});
        return 0;
    }
    if (obj.t == JT_LIST) {
        src = obj.u.l;
    } else if (obj.t == JT_STR) {
        if (step(R, at, obj.u.s.n / 16) || str_chars(R, obj.u.s, &src)) return -1;
    } else if (obj.t == JT_UNDEF) {
        *out = obj;
        return 0;
    } else {
        return rt_fail(R, at, NX_E_FORMAT, "'%s' object is not subscriptable", tname(obj));
    }
    int64_t start, cnt = slice_indices((int64_t)src->n, a, b, stp, &start);
    if (step(R, at, (uint64_t)cnt / 16)) return -1;
    jlist *l = list_new(R, (size_t)cnt);
    if (!l) return -1;
    for (int64_t k = 0; k < cnt; k++) l->v[k] = src->v[start + k * stp];
    l->n = (size_t)cnt;
    if (obj.t == JT_LIST) {
        *out = jv_list(l, obj.tuple);
        return 0;
    }
    jbuf buf = {0};
    for (size_t k = 0; k < l->n; k++)
        if (jb_put(R, &buf, l->v[k].u.s.p, l->v[k].u.s.n)) return -1;
    *out = jv_str(jb_str(&buf));
    return 0;
}

/* ------------------------------------------------------------------ operators */

static int arith_int(rt *R, const node *at, int op, int64_t a, int64_t b, jv *out) {
    int64_t r;
    switch (op) {
    case OP_ADD:
        if (__builtin_add_overflow(a, b, &r)) goto overflow;
        break;
    case OP_SUB:
        if (__builtin_sub_overflow(a, b, &r)) goto overflow;
        break;
    case OP_MUL:
        if (__builtin_mul_overflow(a, b, &r)) goto overflow;
        break;
    case OP_DIV:
        if (b == 0) return rt_fail(R, at, NX_E_FORMAT, "division by zero");
        *out = jv_float((double)a / (double)b);
        return 0;
    case OP_FLOORDIV:
    case OP_MOD:
        if (b == 0) return rt_fail(R, at, NX_E_FORMAT, "integer division or modulo by zero");
        if (a == INT64_MIN && b == -1) {
            if (op == OP_MOD) r = 0;
            else goto overflow;
            break;
        }
        r = op == OP_FLOORDIV ? a / b : a % b;
        if (op == OP_FLOORDIV && (a % b != 0) && ((a < 0) != (b < 0))) r--;
        if (op == OP_MOD && r != 0 && ((r < 0) != (b < 0))) r += b;
        break;
    case OP_POW:
        if (b < 0) {
            if (a == 0) return rt_fail(R, at, NX_E_FORMAT, "0.0 cannot be raised to a negative power");
            *out = jv_float(pow((double)a, (double)b));
            return 0;
        }
        r = 1;
        for (int64_t base = a, e = b; e; e >>= 1) {
            if ((e & 1) && __builtin_mul_overflow(r, base, &r)) goto overflow;
            if (e > 1 && __builtin_mul_overflow(base, base, &base)) goto overflow;
        }
        break;
    default: return -1;
    }
    *out = jv_int(r);
    return 0;
overflow:
    return rt_fail(R, at, NX_E_FORMAT, "integer overflow");
}

static int arith_float(rt *R, const node *at, int op, double a, double b, jv *out) {
    double r;
    switch (op) {
    case OP_ADD: r = a + b; break;
    case OP_SUB: r = a - b; break;
    case OP_MUL: r = a * b; break;
    case OP_DIV:
        if (b == 0) return rt_fail(R, at, NX_E_FORMAT, "float division by zero");
        r = a / b;
        break;
    case OP_FLOORDIV:
        if (b == 0) return rt_fail(R, at, NX_E_FORMAT, "float divmod by zero");
        r = floor(a / b);
        break;
    case OP_MOD:
        if (b == 0) return rt_fail(R, at, NX_E_FORMAT, "float modulo by zero");
        r = fmod(a, b);
        if (r != 0 && ((r < 0) != (b < 0))) r += b;
        break;
    case OP_POW:
        if (a == 0 && b < 0) return rt_fail(R, at, NX_E_FORMAT, "0.0 cannot be raised to a negative power");
        r = pow(a, b);
        break;
    default: return -1;
    }
    *out = jv_float(r);
    return 0;
}

static int repeat(rt *R, const node *at, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    size_t unit = seq.t == JT_STR ? seq.u.s.n : seq.u.l->n;
    if (unit && (uint64_t)times > (SIZE_MAX / 4) / unit)
        return rt_fail(R, at, NX_E_FORMAT, "repetition result too large");
    size_t total = unit * (size_t)times;
    if (step(R, at, total / 64)) return -1;
    if (seq.t == JT_STR) {
        jbuf b = {0};
        if (jb_reserve(R, &b, total)) return -1;
        for (int64_t k = 0; k < times; k++) jb_put(R, &b, seq.u.s.p, unit);
        *out = jv_str(jb_str(&b));
        return 0;
    }
    jlist *l = list_new(R, total);
    if (!l) return -1;
    for (int64_t k = 0; k < times; k++)
        for (size_t i = 0; i < unit; i++) l->v[l->n++] = seq.u.l->v[i];
    *out = jv_list(l, seq.tuple);
    return 0;
}

static int f_format(struct rt *R, const node *at, jv self, jv *p, const bool *has, const struct args *a, jv *out);

static const char *const OPNAMES[] = {"+", "-", "*", "/", "//", "%", "**", "~"};

static int binop(rt *R, const node *at, int op, jv a, jv b, jv *out) {
    if (op == OP_CONCAT) {
        jbuf buf = {0};
        if (to_str(R, a, &buf, 0) || to_str(R, b, &buf, 0)) return -1;
        *out = jv_str(jb_str(&buf));
        return 0;
    }
    if (a.t == JT_UNDEF) return undefined_error(R, at, a);
    if (b.t == JT_UNDEF) return undefined_error(R, at, b);
    if (is_num(a) && is_num(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) return arith_int(R, at, op, num_i(a), num_i(b), out);
        return arith_float(R, at, op, num_f(a), num_f(b), out);
    }
    if (op == OP_ADD && a.t == JT_STR && b.t == JT_STR) {
        jbuf buf = {0};
        if (jb_reserve(R, &buf, a.u.s.n + b.u.s.n) || jb_put(R, &buf, a.u.s.p, a.u.s.n) ||
            jb_put(R, &buf, b.u.s.p, b.u.s.n))
            return -1;
        *out = jv_str(jb_str(&buf));
        return 0;
    }
    if (op == OP_ADD && a.t == JT_LIST && b.t == JT_LIST) {
        jlist *l = list_new(R, a.u.l->n + b.u.l->n);
        if (!l) return -1;
        for (size_t i = 0; i < a.u.l->n; i++) l->v[l->n++] = a.u.l->v[i];
        for (size_t i = 0; i < b.u.l->n; i++) l->v[l->n++] = b.u.l->v[i];
        *out = jv_list(l, a.tuple && b.tuple);
        return 0;
    }
    if (op == OP_MUL && (a.t == JT_STR || a.t == JT_LIST) && (b.t == JT_INT || b.t == JT_BOOL))
        return repeat(R, at, a, num_i(b), out);
    if (op == OP_MUL && (b.t == JT_STR || b.t == JT_LIST) && (a.t == JT_INT || a.t == JT_BOOL))
        return repeat(R, at, b, num_i(a), out);
    if (op == OP_MOD && a.t == JT_STR) { /* printf-style "%s, %d" % (x, y) */
        bool is_tuple = b.t == JT_LIST && b.tuple;
        jlist *fa = is_tuple ? b.u.l : list_new(R, 1);
        if (!fa || (!is_tuple && list_push(R, fa, b))) return -1;
        jv p[1] = {jv_list(fa, true)};
        bool has[1] = {true};
        return f_format(R, at, a, p, has, NULL, out);
    }
    if (op == OP_ADD && (a.t == JT_STR || b.t == JT_STR) && a.t != JT_NONE && b.t != JT_NONE) {
        /* Python raises here; like the reference JS implementation we concatenate instead. */
        return binop(R, at, OP_CONCAT, a, b, out);
    }
    return rt_fail(R, at, NX_E_FORMAT, "unsupported operand type(s) for %s: '%s' and '%s'", OPNAMES[op],
                   tname(a), tname(b));
}

static bool str_contains(jstr hay, jstr needle) {
    if (!needle.n) return true;
    return needle.n <= hay.n && memmem(hay.p, hay.n, needle.p, needle.n) != NULL;
}

static int contains(rt *R, const node *at, jv item, jv seq, bool *res) {
    switch ((jt)seq.t) {
    case JT_STR:
        if (item.t != JT_STR)
            return rt_fail(R, at, NX_E_FORMAT, "'in <string>' requires string as left operand, not %s", tname(item));
        if (step(R, at, seq.u.s.n / 64)) return -1;
        *res = str_contains(seq.u.s, item.u.s);
        return 0;
    case JT_LIST:
        if (step(R, at, seq.u.l->n / 8)) return -1;
        *res = false;
        for (size_t i = 0; i < seq.u.l->n && !*res; i++) *res = jv_equal(item, seq.u.l->v[i], 0);
        return 0;
    case JT_DICT:
    case JT_NS: {
        jv dummy;
        *res = item.t == JT_STR && dict_get(seq.u.d, item.u.s, &dummy);
        return 0;
    }
    case JT_UNDEF: *res = false; return 0;
    default: return rt_fail(R, at, NX_E_FORMAT, "argument of type '%s' is not iterable", tname(seq));
    }
}

static int compare(rt *R, const node *at, int op, jv a, jv b, bool *res) {
    int o;
    switch (op) {
    case CMP_EQ: *res = jv_equal(a, b, 0); return 0;
    case CMP_NE: *res = !jv_equal(a, b, 0); return 0;
    case CMP_IN: return contains(R, at, a, b, res);
    case CMP_NOTIN:
        if (contains(R, at, a, b, res)) return -1;
        *res = !*res;
        return 0;
    default: break;
    }
    if (jv_order(R, at, a, b, &o, 0)) return -1;
    *res = op == CMP_LT ? o < 0 : op == CMP_LE ? o <= 0 : op == CMP_GT ? o > 0 : o >= 0;
    return 0;
}

/* ------------------------------------------------------------------ calls */

static int eval_args(rt *R, frame *F, const nlist *l, args *a) {
    memset(a, 0, sizeof *a);
    if (!l->n) return 0;
    a->pos = ralloc(R, l->n * sizeof(jv));
    a->kv = ralloc(R, l->n * sizeof(jv));
    a->kn = ralloc(R, l->n * sizeof(jstr));
    if (!a->pos || !a->kv || !a->kn) return -1;
    for (size_t i = 0; i < l->n; i++) {
        const node *x = l->v[i];
        if (x->kind == E_KWARG) {
            for (size_t k = 0; k < a->nkw; k++)
                if (jstr_eq(a->kn[k], x->name))
                    return rt_fail(R, x, NX_E_FORMAT, "keyword argument '%.*s' repeated", (int)x->name.n, x->name.p);
            a->kn[a->nkw] = x->name;
            if (eval(R, F, x->a, &a->kv[a->nkw])) return -1;
            a->nkw++;
        } else if (eval(R, F, x, &a->pos[a->npos++])) {
            return -1;
        }
    }
    return 0;
}

/* Binds a call's arguments to a builtin's declared parameters. */
static int bind(rt *R, const node *at, const bdef *d, const args *a, jv *p, bool *has) {
    int np = 0;
    while (np < 6 && d->params[np]) np++;
    bool star = np > 0 && !strcmp(d->params[np - 1], "*");
    int fixed = star ? np - 1 : np;
    for (int i = 0; i < np; i++) has[i] = false;
    jlist *rest = NULL;
    if (star && !(rest = list_new(R, 0))) return -1;
    for (size_t i = 0; i < a->npos; i++) {
        if ((int)i < fixed) {
            p[i] = a->pos[i];
            has[i] = true;
        } else if (star) {
            if (list_push(R, rest, a->pos[i])) return -1;
        } else {
            return rt_fail(R, at, NX_E_FORMAT, "%s() takes at most %d argument%s (%zu given)", d->name, fixed,
                           fixed == 1 ? "" : "s", a->npos);
        }
    }
    for (size_t k = 0; k < a->nkw; k++) {
        int hit = -1;
        for (int i = 0; i < fixed; i++)
            if (jstr_is(a->kn[k], d->params[i])) hit = i;
        if (hit < 0)
            return rt_fail(R, at, NX_E_FORMAT, "%s() got an unexpected keyword argument '%.*s'", d->name,
                           (int)a->kn[k].n, a->kn[k].p);
        if (has[hit]) return rt_fail(R, at, NX_E_FORMAT, "%s() got multiple values for '%s'", d->name, d->params[hit]);
        p[hit] = a->kv[k];
        has[hit] = true;
    }
    for (int i = 0; i < d->nreq && i < fixed; i++)
        if (!has[i]) return rt_fail(R, at, NX_E_FORMAT, "%s() missing required argument '%s'", d->name, d->params[i]);
    if (star) {
        p[fixed] = jv_list(rest, true);
        has[fixed] = true;
    }
    return 0;
}

static int call_builtin(rt *R, const node *at, const bdef *d, jv self, const args *a, jv *out) {
    jv p[6];
    bool has[6];
    if (!d->raw && bind(R, at, d, a, p, has)) return -1;
    return d->fn(R, at, self, p, has, a, out);
}

static int call_macro(rt *R, const node *at, const jmacro *m, const args *a, jv caller, jv *out) {
    if (R->call_depth >= NX_JINJA_MAX_CALL_DEPTH)
        return rt_fail(R, at, NX_E_FORMAT, "macro calls nested deeper than %d", NX_JINJA_MAX_CALL_DEPTH);
    const node *def = m->def;
    const nlist *params = &def->args;
    frame *F = frame_new(R, m->closure);
    bool *set = ralloc(R, params->n + 1);
    jlist *varargs = list_new(R, 0);
    jdict *kwargs = dict_new(R);
    if (!F || !set || !varargs || !kwargs) return -1;
    memset(set, 0, params->n + 1);
    for (size_t i = 0; i < a->npos; i++) {
        if (i < params->n) {
            if (frame_set(R, F, params->v[i]->name, a->pos[i])) return -1;
            set[i] = true;
        } else if (list_push(R, varargs, a->pos[i])) {
            return -1;
        }
    }
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < params->n && !jstr_eq(params->v[i]->name, a->kn[k])) i++;
        if (i == params->n) {
            if (dict_set(R, kwargs, a->kn[k], a->kv[k])) return -1;
            continue;
        }
        if (set[i])
            return rt_fail(R, at, NX_E_FORMAT, "macro got multiple values for argument '%.*s'", (int)a->kn[k].n,
                           a->kn[k].p);
        if (frame_set(R, F, params->v[i]->name, a->kv[k])) return -1;
        set[i] = true;
    }
    if (frame_set(R, F, JSTR("varargs"), jv_list(varargs, true)) ||
        frame_set(R, F, JSTR("kwargs"), (jv){.t = JT_DICT, .u.d = kwargs}))
        return -1;
    if (caller.t != JT_UNDEF && frame_set(R, F, JSTR("caller"), caller)) return -1;
    for (size_t i = 0; i < params->n; i++) {
        if (set[i]) continue;
        jv v = jv_undef(params->v[i]->name);
        if (params->v[i]->kind == E_KWARG && eval(R, F, params->v[i]->a, &v)) return -1;
        if (frame_set(R, F, params->v[i]->name, v)) return -1;
    }
    jbuf b = {0}, *saved = R->out;
    R->out = &b;
    R->call_depth++;
    int r = render(R, F, &def->body);
    R->call_depth--;
    R->out = saved;
    if (r < 0) return -1;
    *out = jv_str(jb_str(&b));
    return 0;
}

static int call_value(rt *R, const node *at, jv fn, const args *a, jv caller, jv *out) {
    switch ((jt)fn.t) {
    case JT_FUNC: return call_builtin(R, at, global_def(fn.id), jv_none(), a, out);
    case JT_METHOD: return call_builtin(R, at, fn.u.bm->def, fn.u.bm->self, a, out);
    case JT_MACRO: return call_macro(R, at, fn.u.m, a, caller, out);
    case JT_UNDEF: return undefined_error(R, at, fn);
    default: return rt_fail(R, at, NX_E_FORMAT, "'%s' object is not callable", tname(fn));
    }
}

static int apply_filter(rt *R, const node *at, const bdef *d, jv v, const args *a, jv *out) {
    return call_builtin(R, at, d, v, a, out);
}

static int run_test(rt *R, const node *at, int fn, jv v, const args *a, bool *res);

static int eval(rt *R, frame *F, const node *n, jv *out) {
    if (step(R, n, 1)) return -1;
    switch ((node_kind)n->kind) {
    case E_CONST: *out = n->val; return 0;
    case E_NAME: {
        if (frame_get(F, n->name, out)) return 0;
        uint16_t id;
        if (find_global(n->name, &id)) {
            *out = (jv){.t = JT_FUNC, .id = id};
            return 0;
        }
        *out = jv_undef(n->name);
        return 0;
    }
    case E_LIST: {
        jlist *l = list_new(R, n->args.n);
        if (!l) return -1;
        for (size_t i = 0; i < n->args.n; i++)
            if (eval(R, F, n->args.v[i], &l->v[i])) return -1;
        l->n = n->args.n;
        *out = jv_list(l, n->op);
        return 0;
    }
    case E_DICT: {
        jdict *d = dict_new(R);
        if (!d) return -1;
        for (size_t i = 0; i + 1 < n->args.n; i += 2) {
            jv k, v;
            if (eval(R, F, n->args.v[i], &k) || eval(R, F, n->args.v[i + 1], &v)) return -1;
            if (k.t != JT_STR) return rt_fail(R, n->args.v[i], NX_E_FORMAT, "dict keys must be strings here");
            if (dict_set(R, d, k.u.s, v)) return -1;
        }
        *out = (jv){.t = JT_DICT, .u.d = d};
        return 0;
    }
    case E_ATTR: {
        jv o;
        if (eval(R, F, n->a, &o)) return -1;
        return get_attr(R, o, n->name, out);
    }
    case E_ITEM: {
        jv o, k;
        if (eval(R, F, n->a, &o) || eval(R, F, n->b, &k)) return -1;
        return get_item(R, n, o, k, out);
    }
    case E_SLICE: {
        jv o, a, b, c;
        if (eval(R, F, n->a, &o) || eval(R, F, n->args.v[0], &a) || eval(R, F, n->args.v[1], &b) ||
            eval(R, F, n->args.v[2], &c))
            return -1;
        return do_slice(R, n, o, a, b, c, out);
    }
    case E_CALL: {
        jv fn;
        args a;
        if (eval(R, F, n->a, &fn) || eval_args(R, F, &n->args, &a)) return -1;
        return call_value(R, n, fn, &a, jv_undef((jstr){"", 0}), out);
    }
    case E_FILTER: {
        jv v;
        args a;
        if (eval(R, F, n->a, &v) || eval_args(R, F, &n->args, &a)) return -1;
        return apply_filter(R, n, filter_def(n->fn), v, &a, out);
    }
    case E_TEST: {
        jv v;
        args a;
        bool res;
        if (eval(R, F, n->a, &v) || eval_args(R, F, &n->args, &a) || run_test(R, n, n->fn, v, &a, &res)) return -1;
        *out = jv_bool(res != n->neg);
        return 0;
    }
    case E_NOT: {
        jv v;
        if (eval(R, F, n->a, &v)) return -1;
        *out = jv_bool(!truthy(v));
        return 0;
    }
    case E_NEG:
    case E_POS: {
        jv v;
        if (eval(R, F, n->a, &v)) return -1;
        if (v.t == JT_FLOAT) *out = jv_float(n->kind == E_NEG ? -v.u.f : v.u.f);
        else if (v.t == JT_INT || v.t == JT_BOOL) {
            int64_t i = num_i(v);
            if (n->kind == E_NEG && i == INT64_MIN) return rt_fail(R, n, NX_E_FORMAT, "integer overflow");
            *out = jv_int(n->kind == E_NEG ? -i : i);
        } else if (v.t == JT_UNDEF) {
            return undefined_error(R, n, v);
        } else {
            return rt_fail(R, n, NX_E_FORMAT, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+',
                           tname(v));
        }
        return 0;
    }
    case E_BIN: {
        jv a, b;
        if (eval(R, F, n->a, &a) || eval(R, F, n->b, &b)) return -1;
        return binop(R, n, n->op, a, b, out);
    }
    case E_AND:
    case E_OR: {
        if (eval(R, F, n->a, out)) return -1;
        if (truthy(*out) == (n->kind == E_OR)) return 0;
        return eval(R, F, n->b, out);
    }
    case E_CMP: {
        jv left;
        if (eval(R, F, n->a, &left)) return -1;
        bool res = true;
        for (size_t i = 0; i < n->args.n && res; i++) {
            jv right;
            if (eval(R, F, n->args.v[i], &right) || compare(R, n, n->ops[i], left, right, &res)) return -1;
            left = right;
        }
        *out = jv_bool(res);
        return 0;
    }
    case E_COND: {
        jv c;
        if (eval(R, F, n->a, &c)) return -1;
        if (truthy(c)) return eval(R, F, n->b, out);
        if (n->c) return eval(R, F, n->c, out);
        *out = jv_undef((jstr){"", 0});
        return 0;
    }
    case E_BLOCKVAL: *out = R->blockval; return 0;
    default: return rt_fail(R, n, NX_E_FORMAT, "internal error: node %d is not an expression", n->kind);
    }
}

/* ================================================================== string helpers */

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE };

static bool cp_cased(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static int str_case(rt *R, const node *at, jstr s, int mode, jstr *out) {
    if (step(R, at, s.n / 32)) return -1;
    jbuf b = {0};
    if (jb_reserve(R, &b, s.n)) return -1;
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        int32_t c = utf8_next(s.p + i, s.n - i, &adv), m = c;
        switch (mode) {
        case CASE_UPPER: m = utf8proc_toupper(c); break;
        case CASE_LOWER: m = utf8proc_tolower(c); break;
        case CASE_TITLE:
            m = prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c);
            prev_cased = cp_cased(c);
            break;
        case CASE_CAPITALIZE: m = first ? utf8proc_totitle(c) : utf8proc_tolower(c); break;
        }
        first = false;
        if (c == 0xFFFD && adv == 1 && (unsigned char)s.p[i] >= 0x80) { /* keep invalid bytes as they are */
            if (jb_put(R, &b, s.p + i, 1)) return -1;
        } else if (jb_cp(R, &b, m)) {
            return -1;
        }
        i += adv;
    }
    *out = jb_str(&b);
    return 0;
}

static bool cp_in(int32_t c, jstr set) {
    for (size_t i = 0; i < set.n;) {
        size_t adv;
        if (utf8_next(set.p + i, set.n - i, &adv) == c) return true;
        i += adv;
    }
    return false;
}

/* Python's strip family: chars == NULL strips whitespace. */
static jstr str_strip(jstr s, const jstr *chars, bool left, bool right) {
    size_t a = 0, b = s.n;
    while (left && a < b) {
        size_t adv;
        int32_t c = utf8_next(s.p + a, b - a, &adv);
        if (chars ? !cp_in(c, *chars) : !py_isspace(c)) break;
        a += adv;
    }
    while (right && b > a) {
        size_t st = utf8_prev(s.p, a, b), adv;
        int32_t c = utf8_next(s.p + st, b - st, &adv);
        if (chars ? !cp_in(c, *chars) : !py_isspace(c)) break;
        b = st;
    }
    return (jstr){s.p + a, b - a};
}

static const char *find_sub(jstr hay, size_t from, jstr needle) {
    if (from > hay.n) return NULL;
    if (!needle.n) return hay.p + from;
    return memmem(hay.p + from, hay.n - from, needle.p, needle.n);
}

static const char *rfind_sub(jstr hay, jstr needle) {
    if (needle.n > hay.n) return NULL;
    for (size_t i = hay.n - needle.n + 1; i-- > 0;)
        if (!memcmp(hay.p + i, needle.p, needle.n)) return hay.p + i;
    return NULL;
}

static int str_replace(rt *R, const node *at, jstr s, jstr old, jstr rep, int64_t count, jstr *out) {
    if (step(R, at, s.n / 64)) return -1;
    jbuf b = {0};
    if (count < 0) count = INT64_MAX;
    if (!old.n) { /* Python inserts `rep` before every character and at the end */
        int64_t k = 0;
        for (size_t i = 0; i <= s.n;) {
            if (k < count) {
                if (jb_put(R, &b, rep.p, rep.n)) return -1;
                k++;
            }
            if (i == s.n) break;
            size_t adv;
            utf8_next(s.p + i, s.n - i, &adv);
            if (jb_put(R, &b, s.p + i, adv)) return -1;
            i += adv;
        }
        *out = jb_str(&b);
        return 0;
    }
    size_t i = 0;
    for (int64_t k = 0; k < count; k++) {
        const char *f = find_sub(s, i, old);
        if (!f) break;
        size_t at_i = (size_t)(f - s.p);
        if (jb_put(R, &b, s.p + i, at_i - i) || jb_put(R, &b, rep.p, rep.n)) return -1;
        i = at_i + old.n;
    }
    if (jb_put(R, &b, s.p + i, s.n - i)) return -1;
    *out = jb_str(&b);
    return 0;
}

static int push_str(rt *R, jlist *l, const char *p, size_t n) { return list_push(R, l, jv_str((jstr){p, n})); }

static int str_split(rt *R, const node *at, jstr s, const jstr *sep, int64_t maxsplit, bool from_right, jv *out) {
    if (step(R, at, s.n / 32)) return -1;
    jlist *l = list_new(R, 0);
    if (!l) return -1;
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (sep && !sep->n) return rt_fail(R, at, NX_E_FORMAT, "empty separator");
    if (!from_right) {
        if (!sep) {
            size_t i = skip_space_fwd(s.p, 0, s.n);
            int64_t k = 0;
            while (i < s.n) {
                if (k++ >= maxsplit) {
                    if (push_str(R, l, s.p + i, s.n - i)) return -1;
                    break;
                }
                size_t j = i;
                while (j < s.n) {
                    size_t adv;
                    if (py_isspace(utf8_next(s.p + j, s.n - j, &adv))) break;
                    j += adv;
                }
                if (push_str(R, l, s.p + i, j - i)) return -1;
                i = skip_space_fwd(s.p, j, s.n);
            }
        } else {
            size_t i = 0;
            for (int64_t k = 0; k < maxsplit; k++) {
                const char *f = find_sub(s, i, *sep);
                if (!f) break;
                if (push_str(R, l, s.p + i, (size_t)(f - s.p) - i)) return -1;
                i = (size_t)(f - s.p) + sep->n;
            }
            if (push_str(R, l, s.p + i, s.n - i)) return -1;
        }
    } else { /* rsplit: collect from the right, then reverse */
        size_t end = s.n;
        int64_t k = 0;
        if (!sep) {
            end = skip_space_back(s.p, 0, end);
            while (end > 0) {
                if (k++ >= maxsplit) {
                    if (push_str(R, l, s.p, end)) return -1;
                    break;
                }
                size_t j = end;
                while (j > 0) {
                    size_t st = utf8_prev(s.p, 0, j), adv;
                    if (py_isspace(utf8_next(s.p + st, j - st, &adv))) break;
                    j = st;
                }
                if (push_str(R, l, s.p + j, end - j)) return -1;
                end = skip_space_back(s.p, 0, j);
            }
        } else {
            for (; k < maxsplit; k++) {
                const char *f = rfind_sub((jstr){s.p, end}, *sep);
                if (!f) break;
                size_t fi = (size_t)(f - s.p);
                if (push_str(R, l, s.p + fi + sep->n, end - fi - sep->n)) return -1;
                end = fi;
            }
            if (push_str(R, l, s.p, end)) return -1;
        }
        for (size_t i = 0, j = l->n ? l->n - 1 : 0; i < j; i++, j--) {
            jv t = l->v[i];
            l->v[i] = l->v[j];
            l->v[j] = t;
        }
    }
    *out = jv_list(l, false);
    return 0;
}

/* Python's str.splitlines() line boundaries. */
static size_t line_break_len(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\r') return i + 1 < n && s[i + 1] == '\n' ? 2 : 1;
    if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1E)) return 1;
    if (c >= 0x80) {
        size_t adv;
        int32_t cp = utf8_next(s + i, n - i, &adv);
        if (cp == 0x85 || cp == 0x2028 || cp == 0x2029) return adv;
    }
    return 0;
}

static int str_splitlines(rt *R, jstr s, bool keepends, jlist **out) {
    jlist *l = list_new(R, 0);
    if (!l) return -1;
    size_t st = 0;
    for (size_t i = 0; i < s.n;) {
        size_t k = line_break_len(s.p, s.n, i);
        if (!k) {
            i++;
            continue;
        }
        if (push_str(R, l, s.p + st, (keepends ? i + k : i) - st)) return -1;
        i += k;
        st = i;
    }
    if (st < s.n && push_str(R, l, s.p + st, s.n - st)) return -1;
    *out = l;
    return 0;
}

static int64_t cp_index(jstr s, const char *at) { return (int64_t)utf8_count(s.p, (size_t)(at - s.p)); }

/* Looks up a dotted attribute path ("a.b", "items.0") as filters' attribute= does. */
static int get_path(rt *R, const node *at, jv item, jstr path, jv *out) {
    size_t i = 0;
    *out = item;
    while (i <= path.n) {
        size_t j = i;
        while (j < path.n && path.p[j] != '.') j++;
        jstr part = {path.p + i, j - i};
        bool digits = part.n > 0 && part.n < 18;
        for (size_t k = 0; k < part.n; k++) digits = digits && is_digit(part.p[k]);
        jv key = jv_str(part);
        if (digits && out->t == JT_LIST) key = jv_int(strtoll(part.p, NULL, 10));
        if (get_item(R, at, *out, key, out)) return -1;
        i = j + 1;
    }
    return 0;
}

/* ================================================================== builtins */

#define BUILTIN(name)                                                                              \
    static int name(rt *R, const node *at, jv self, jv *p, const bool *has, const args *a, jv *out)
#define UNUSED_ARGS (void)R, (void)at, (void)self, (void)p, (void)has, (void)a

static int need_str(rt *R, const node *at, jv v, const char *what, jstr *out) {
    *out = (jstr){"", 0};
    if (v.t != JT_STR) return rt_fail(R, at, NX_E_FORMAT, "%s must be a string, not '%s'", what, tname(v));
    *out = v.u.s;
    return 0;
}

static int need_int(rt *R, const node *at, jv v, const char *what, int64_t *out) {
    *out = 0;
    if (v.t != JT_INT && v.t != JT_BOOL)
        return rt_fail(R, at, NX_E_FORMAT, "%s must be an integer, not '%s'", what, tname(v));
    *out = num_i(v);
    return 0;
}

static int len_of(rt *R, const node *at, jv v, int64_t *n) {
    *n = 0;
    switch ((jt)v.t) {
    case JT_STR: *n = (int64_t)utf8_count(v.u.s.p, v.u.s.n); return 0;
    case JT_LIST: *n = (int64_t)v.u.l->n; return 0;
    case JT_DICT:
    case JT_NS: *n = (int64_t)v.u.d->n; return 0;
    case JT_UNDEF: *n = 0; return 0;
    default: return rt_fail(R, at, NX_E_FORMAT, "object of type '%s' has no len()", tname(v));
    }
}

/* ------------------------------------------------------------------ string methods */

BUILTIN(m_upper) {
    UNUSED_ARGS;
    jstr s;
    if (str_case(R, at, self.u.s, CASE_UPPER, &s)) return -1;
    *out = jv_str(s);
    return 0;
}
BUILTIN(m_lower) {
    UNUSED_ARGS;
    jstr s;
    if (str_case(R, at, self.u.s, CASE_LOWER, &s)) return -1;
    *out = jv_str(s);
    return 0;
}
BUILTIN(m_title) {
    UNUSED_ARGS;
    jstr s;
    if (str_case(R, at, self.u.s, CASE_TITLE, &s)) return -1;
    *out = jv_str(s);
    return 0;
}
BUILTIN(m_capitalize) {
    UNUSED_ARGS;
    jstr s;
    if (str_case(R, at, self.u.s, CASE_CAPITALIZE, &s)) return -1;
    *out = jv_str(s);
    return 0;
}

static int strip_common(rt *R, const node *at, jv self, jv *p, const bool *has, bool l, bool r, jv *out) {
    jstr chars;
    bool use = has[0] && p[0].t != JT_NONE;
    if (use && need_str(R, at, p[0], "strip() argument", &chars)) return -1;
    if (step(R, at, self.u.s.n / 64)) return -1;
    *out = jv_str(str_strip(self.u.s, use ? &chars : NULL, l, r));
    return 0;
}
BUILTIN(m_strip) { (void)a; return strip_common(R, at, self, p, has, true, true, out); }
BUILTIN(m_lstrip) { (void)a; return strip_common(R, at, self, p, has, true, false, out); }
BUILTIN(m_rstrip) { (void)a; return strip_common(R, at, self, p, has, false, true, out); }

static int split_common(rt *R, const node *at, jv self, jv *p, const bool *has, bool right, jv *out) {
    jstr sep;
    bool use = has[0] && p[0].t != JT_NONE;
    int64_t maxsplit = -1;
    if (use && need_str(R, at, p[0], "separator", &sep)) return -1;
    if (has[1] && need_int(R, at, p[1], "maxsplit", &maxsplit)) return -1;
    return str_split(R, at, self.u.s, use ? &sep : NULL, maxsplit, right, out);
}
BUILTIN(m_split) { (void)a; return split_common(R, at, self, p, has, false, out); }
BUILTIN(m_rsplit) { (void)a; return split_common(R, at, self, p, has, true, out); }

BUILTIN(m_splitlines) {
    UNUSED_ARGS;
    jlist *l;
    if (str_splitlines(R, self.u.s, has[0] && truthy(p[0]), &l)) return -1;
    *out = jv_list(l, false);
    return 0;
}

static int affix_common(rt *R, const node *at, jv self, jv arg, bool suffix, jv *out) {
    jstr s = self.u.s;
    if (arg.t == JT_STR) {
        jstr x = arg.u.s;
        *out = jv_bool(x.n <= s.n && !memcmp(suffix ? s.p + s.n - x.n : s.p, x.p, x.n));
        return 0;
    }
    if (arg.t == JT_LIST) {
        for (size_t i = 0; i < arg.u.l->n; i++) {
            if (arg.u.l->v[i].t != JT_STR) break;
            if (affix_common(R, at, self, arg.u.l->v[i], suffix, out)) return -1;
            if (out->u.b) return 0;
        }
        if (arg.u.l->n == 0 || arg.u.l->v[arg.u.l->n - 1].t == JT_STR) {
            *out = jv_bool(false);
            return 0;
        }
    }
    return rt_fail(R, at, NX_E_FORMAT, "%s() argument must be str or a tuple of str, not '%s'",
                   suffix ? "endswith" : "startswith", tname(arg));
}
BUILTIN(m_startswith) { UNUSED_ARGS; return affix_common(R, at, self, p[0], false, out); }
BUILTIN(m_endswith) { UNUSED_ARGS; return affix_common(R, at, self, p[0], true, out); }

BUILTIN(m_removeprefix) {
    UNUSED_ARGS;
    jstr x, s = self.u.s;
    if (need_str(R, at, p[0], "prefix", &x)) return -1;
    *out = x.n <= s.n && !memcmp(s.p, x.p, x.n) ? jv_str((jstr){s.p + x.n, s.n - x.n}) : self;
    return 0;
}
BUILTIN(m_removesuffix) {
    UNUSED_ARGS;
    jstr x, s = self.u.s;
    if (need_str(R, at, p[0], "suffix", &x)) return -1;
    *out = x.n && x.n <= s.n && !memcmp(s.p + s.n - x.n, x.p, x.n) ? jv_str((jstr){s.p, s.n - x.n}) : self;
    return 0;
}

BUILTIN(m_replace) {
    UNUSED_ARGS;
    jstr old, rep, res;
    int64_t count = -1;
    if (need_str(R, at, p[0], "replace() old", &old) || need_str(R, at, p[1], "replace() new", &rep)) return -1;
    if (has[2] && p[2].t != JT_NONE && need_int(R, at, p[2], "count", &count)) return -1;
    if (str_replace(R, at, self.u.s, old, rep, count, &res)) return -1;
    *out = jv_str(res);
    return 0;
}

static int find_common(rt *R, const node *at, jv self, jv arg, int mode, jv *out) {
    jstr sub, s = self.u.s;
    if (need_str(R, at, arg, "substring", &sub) || step(R, at, s.n / 64)) return -1;
    if (mode == 2) { /* count: non-overlapping occurrences */
        int64_t c = 0;
        if (!sub.n) c = (int64_t)utf8_count(s.p, s.n) + 1;
        else
            for (const char *f = find_sub(s, 0, sub); f; f = find_sub(s, (size_t)(f - s.p) + sub.n, sub)) c++;
        *out = jv_int(c);
        return 0;
    }
    const char *f = mode == 0 ? find_sub(s, 0, sub) : rfind_sub(s, sub);
    *out = jv_int(f ? cp_index(s, f) : -1);
    return 0;
}
BUILTIN(m_find) { UNUSED_ARGS; return find_common(R, at, self, p[0], 0, out); }
BUILTIN(m_rfind) { UNUSED_ARGS; return find_common(R, at, self, p[0], 1, out); }
BUILTIN(m_count) { UNUSED_ARGS; return find_common(R, at, self, p[0], 2, out); }
BUILTIN(m_index) {
    UNUSED_ARGS;
    if (find_common(R, at, self, p[0], 0, out)) return -1;
    if (out->u.i < 0) return rt_fail(R, at, NX_E_FORMAT, "substring not found");
    return 0;
}

static int str_class(jstr s, int kind) {
    if (!s.n) return 0;
    bool any_cased = false;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        int32_t c = utf8_next(s.p + i, s.n - i, &adv);
        utf8proc_category_t k = utf8proc_category(c);
        bool letter = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        bool digit = k == UTF8PROC_CATEGORY_ND;
        switch (kind) {
        case 0: if (!digit) return 0; break;
        case 1: if (!letter) return 0; break;
        case 2: if (!letter && !digit && k != UTF8PROC_CATEGORY_NL && k != UTF8PROC_CATEGORY_NO) return 0; break;
        case 3: if (!py_isspace(c)) return 0; break;
        case 4: if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) return 0; any_cased |= k == UTF8PROC_CATEGORY_LL; break;
        case 5: if (k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT) return 0; any_cased |= k == UTF8PROC_CATEGORY_LU; break;
        }
        i += adv;
    }
    return kind >= 4 ? any_cased : 1;
}
BUILTIN(m_isdigit) { UNUSED_ARGS; *out = jv_bool(str_class(self.u.s, 0)); return 0; }
BUILTIN(m_isalpha) { UNUSED_ARGS; *out = jv_bool(str_class(self.u.s, 1)); return 0; }
BUILTIN(m_isalnum) { UNUSED_ARGS; *out = jv_bool(str_class(self.u.s, 2)); return 0; }
BUILTIN(m_isspace) { UNUSED_ARGS; *out = jv_bool(str_class(self.u.s, 3)); return 0; }
BUILTIN(m_islower) { UNUSED_ARGS; *out = jv_bool(str_class(self.u.s, 4)); return 0; }
BUILTIN(m_isupper) { UNUSED_ARGS; *out = jv_bool(str_class(self.u.s, 5)); return 0; }

BUILTIN(m_join) {
    UNUSED_ARGS;
    jlist *items;
    if (iter_items(R, at, p[0], &items)) return -1;
    jbuf b = {0};
    for (size_t i = 0; i < items->n; i++)
        if ((i && jb_put(R, &b, self.u.s.p, self.u.s.n)) || to_str(R, items->v[i], &b, 0)) return -1;
    *out = jv_str(jb_str(&b));
    return 0;
}

/* str.format(): {} {0} {name} fields with optional !r/!s; format specs are not supported. */
BUILTIN(m_format) {
    UNUSED_ARGS;
    jstr s = self.u.s;
    jbuf b = {0};
    size_t auto_idx = 0;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.p[i];
        if (c == '}' ) {
            if (i + 1 < s.n && s.p[i + 1] == '}') i++;
            else return rt_fail(R, at, NX_E_FORMAT, "single '}' encountered in format string");
            if (jb_putc(R, &b, '}')) return -1;
            continue;
        }
        if (c != '{') {
            if (jb_putc(R, &b, c)) return -1;
            continue;
        }
        if (i + 1 < s.n && s.p[i + 1] == '{') {
            i++;
            if (jb_putc(R, &b, '{')) return -1;
            continue;
        }
        size_t j = i + 1;
        while (j < s.n && s.p[j] != '}' && s.p[j] != '!' && s.p[j] != ':') j++;
        jstr field = {s.p + i + 1, j - i - 1};
        bool repr = false;
        if (j < s.n && s.p[j] == '!') {
            repr = j + 1 < s.n && s.p[j + 1] == 'r';
            j += 2;
        }
        if (j < s.n && s.p[j] == ':') return rt_fail(R, at, NX_E_FORMAT, "format specs are not supported");
        if (j >= s.n || s.p[j] != '}') return rt_fail(R, at, NX_E_FORMAT, "unterminated field in format string");
        jv v;
        bool found = false;
        if (!field.n) {
            if (auto_idx < a->npos) v = a->pos[auto_idx], found = true;
            auto_idx++;
        } else if (is_digit(field.p[0])) {
            size_t k = (size_t)strtoull(field.p, NULL, 10);
            if (k < a->npos) v = a->pos[k], found = true;
        } else {
            for (size_t k = 0; k < a->nkw; k++)
                if (jstr_eq(a->kn[k], field)) v = a->kv[k], found = true;
        }
        if (!found) return rt_fail(R, at, NX_E_FORMAT, "format field '%.*s' has no argument", (int)field.n, field.p);
        if (repr ? to_repr(R, v, &b, 0) : to_str(R, v, &b, 0)) return -1;
        i = j;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

/* ------------------------------------------------------------------ dict / list / loop methods */

BUILTIN(m_get) {
    UNUSED_ARGS;
    if (p[0].t != JT_STR || !dict_get(self.u.d, p[0].u.s, out)) *out = has[1] ? p[1] : jv_none();
    return 0;
}

static int dict_items(rt *R, const jdict *d, int what, jv *out) {
    jlist *l = list_new(R, d->n);
    if (!l) return -1;
    for (size_t i = 0; i < d->n; i++) {
        if (what == 0) l->v[i] = jv_str(d->k[i]);
        else if (what == 1) l->v[i] = d->v[i];
        else {
            jlist *pair = list_new(R, 2);
            if (!pair) return -1;
            pair->v[0] = jv_str(d->k[i]);
            pair->v[1] = d->v[i];
            pair->n = 2;
            l->v[i] = jv_list(pair, true);
        }
    }
    l->n = d->n;
    *out = jv_list(l, false);
    return 0;
}
BUILTIN(m_keys) { UNUSED_ARGS; return dict_items(R, self.u.d, 0, out); }
BUILTIN(m_values) { UNUSED_ARGS; return dict_items(R, self.u.d, 1, out); }
BUILTIN(m_items) { UNUSED_ARGS; return dict_items(R, self.u.d, 2, out); }

BUILTIN(m_append) {
    UNUSED_ARGS;
    if (self.tuple) return rt_fail(R, at, NX_E_FORMAT, "'tuple' object has no attribute 'append'");
    *out = jv_none();
    return list_push(R, self.u.l, p[0]);
}

BUILTIN(m_list_index) {
    UNUSED_ARGS;
    for (size_t i = 0; i < self.u.l->n; i++)
        if (jv_equal(self.u.l->v[i], p[0], 0)) {
            *out = jv_int((int64_t)i);
            return 0;
        }
    return rt_fail(R, at, NX_E_FORMAT, "value is not in list");
}

BUILTIN(m_list_count) {
    UNUSED_ARGS;
    int64_t c = 0;
    for (size_t i = 0; i < self.u.l->n; i++) c += jv_equal(self.u.l->v[i], p[0], 0);
    *out = jv_int(c);
    return 0;
}

BUILTIN(m_cycle) {
    UNUSED_ARGS;
    if (!a->npos) return rt_fail(R, at, NX_E_FORMAT, "no items for cycling given");
    *out = a->pos[(size_t)self.u.lp->index0 % a->npos];
    return 0;
}

/* ------------------------------------------------------------------ globals */

BUILTIN(g_range) {
    UNUSED_ARGS;
    if (a->nkw) return rt_fail(R, at, NX_E_FORMAT, "range() takes no keyword arguments");
    if (a->npos < 1 || a->npos > 3) return rt_fail(R, at, NX_E_FORMAT, "range expected 1 to 3 arguments");
    int64_t v[3] = {0, 0, 1};
    for (size_t i = 0; i < a->npos; i++)
        if (need_int(R, at, a->pos[i], "range() argument", &v[a->npos == 1 ? 1 : i])) return -1;
    if (v[2] == 0) return rt_fail(R, at, NX_E_FORMAT, "range() arg 3 must not be zero");
    double cnt = v[2] > 0 ? ceil(((double)v[1] - (double)v[0]) / (double)v[2])
                          : ceil(((double)v[0] - (double)v[1]) / (double)-v[2]);
    if (cnt < 0) cnt = 0;
    if (cnt > (double)R->max_steps) return rt_fail(R, at, NX_E_FORMAT, "range() too large for the step budget");
    if (step(R, at, (uint64_t)cnt)) return -1;
    jlist *l = list_new(R, (size_t)cnt);
    if (!l) return -1;
    for (int64_t x = v[0]; v[2] > 0 ? x < v[1] : x > v[1]; x += v[2]) {
        l->v[l->n++] = jv_int(x);
        if (l->n == l->cap) break;
    }
    *out = jv_list(l, false);
    return 0;
}

static int mapping_from(rt *R, const node *at, const args *a, const char *fname, jdict *d) {
    if (a->npos > 1) return rt_fail(R, at, NX_E_FORMAT, "%s() expected at most 1 positional argument", fname);
    if (a->npos == 1) {
        jv src = a->pos[0];
        if (src.t == JT_DICT || src.t == JT_NS) {
            for (size_t i = 0; i < src.u.d->n; i++)
                if (dict_set(R, d, src.u.d->k[i], src.u.d->v[i])) return -1;
        } else if (src.t == JT_LIST) {
            for (size_t i = 0; i < src.u.l->n; i++) {
                jv pr = src.u.l->v[i];
                if (pr.t != JT_LIST || pr.u.l->n != 2 || pr.u.l->v[0].t != JT_STR)
                    return rt_fail(R, at, NX_E_FORMAT, "%s() needs (key, value) pairs with string keys", fname);
                if (dict_set(R, d, pr.u.l->v[0].u.s, pr.u.l->v[1])) return -1;
            }
        } else {
            return rt_fail(R, at, NX_E_FORMAT, "'%s' object is not iterable", tname(src));
        }
    }
    for (size_t k = 0; k < a->nkw; k++)
        if (dict_set(R, d, a->kn[k], a->kv[k])) return -1;
    return 0;
}

BUILTIN(g_namespace) {
    UNUSED_ARGS;
    jdict *d = dict_new(R);
    if (!d || mapping_from(R, at, a, "namespace", d)) return -1;
    *out = (jv){.t = JT_NS, .u.d = d};
    return 0;
}

BUILTIN(g_dict) {
    UNUSED_ARGS;
    jdict *d = dict_new(R);
    if (!d || mapping_from(R, at, a, "dict", d)) return -1;
    *out = (jv){.t = JT_DICT, .u.d = d};
    return 0;
}

BUILTIN(g_raise_exception) {
    UNUSED_ARGS;
    (void)out;
    jstr msg = JSTR("raise_exception() called");
    if (a->npos && as_str(R, a->pos[0], &msg)) return -1;
    if (R->failed) return -1;
    R->failed = true;
    nx_fail(R->err, NX_E_ARG, "%.*s", (int)(msg.n > 500 ? 500 : msg.n), msg.p);
    return -1;
}

BUILTIN(g_strftime_now) {
    UNUSED_ARGS;
    jstr fmt;
    if (need_str(R, at, p[0], "format", &fmt)) return -1;
    char zfmt[128], buf[256];
    if (fmt.n >= sizeof zfmt) return rt_fail(R, at, NX_E_FORMAT, "strftime format too long");
    memcpy(zfmt, fmt.p, fmt.n);
    zfmt[fmt.n] = 0;
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    size_t n = strftime(buf, sizeof buf, zfmt, &tm);
#pragma GCC diagnostic pop
    bool ok;
    *out = jv_str(str_dup(R, buf, n, &ok));
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------ filters */

BUILTIN(f_abs) {
    UNUSED_ARGS;
    if (self.t == JT_FLOAT) *out = jv_float(fabs(self.u.f));
    else if (self.t == JT_INT || self.t == JT_BOOL) {
        int64_t i = num_i(self);
        if (i == INT64_MIN) return rt_fail(R, at, NX_E_FORMAT, "integer overflow");
        *out = jv_int(i < 0 ? -i : i);
    } else return rt_fail(R, at, NX_E_FORMAT, "bad operand type for abs(): '%s'", tname(self));
    return 0;
}

BUILTIN(f_attr) {
    UNUSED_ARGS;
    jstr name;
    if (need_str(R, at, p[0], "attribute name", &name)) return -1;
    return get_attr(R, self, name, out);
}

BUILTIN(f_batch) {
    UNUSED_ARGS;
    int64_t size;
    jlist *items;
    if (need_int(R, at, p[0], "linecount", &size) || iter_items(R, at, self, &items)) return -1;
    if (size <= 0) return rt_fail(R, at, NX_E_FORMAT, "batch size must be positive");
    jlist *res = list_new(R, 0), *cur = NULL;
    if (!res) return -1;
    for (size_t i = 0; i < items->n; i++) {
        if (!cur || (int64_t)cur->n == size) {
            if (!(cur = list_new(R, 0)) || list_push(R, res, jv_list(cur, false))) return -1;
        }
        if (list_push(R, cur, items->v[i])) return -1;
    }
    if (cur && has[1] && p[1].t != JT_NONE)
        while ((int64_t)cur->n < size)
            if (list_push(R, cur, p[1])) return -1;
    *out = jv_list(res, false);
    return 0;
}

static int str_of(rt *R, jv v, jstr *s) { return as_str(R, v, s); }

BUILTIN(f_capitalize) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s) || str_case(R, at, s, CASE_CAPITALIZE, &s)) return -1;
    *out = jv_str(s);
    return 0;
}
BUILTIN(f_upper) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s) || str_case(R, at, s, CASE_UPPER, &s)) return -1;
    *out = jv_str(s);
    return 0;
}
BUILTIN(f_lower) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s) || str_case(R, at, s, CASE_LOWER, &s)) return -1;
    *out = jv_str(s);
    return 0;
}

/* Jinja2's title filter capitalises words split at whitespace, dashes and opening brackets. */
BUILTIN(f_title) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s)) return -1;
    jbuf b = {0};
    bool word_start = true;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        int32_t c = utf8_next(s.p + i, s.n - i, &adv);
        bool sep = py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        int32_t m = sep ? c : word_start ? utf8proc_toupper(c) : utf8proc_tolower(c);
        if (jb_cp(R, &b, m)) return -1;
        word_start = sep;
        i += adv;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

BUILTIN(f_center) {
    UNUSED_ARGS;
    jstr s;
    int64_t width = 80;
    if (str_of(R, self, &s) || (has[0] && need_int(R, at, p[0], "width", &width))) return -1;
    int64_t len = (int64_t)utf8_count(s.p, s.n);
    if (width > 1 << 20) width = 1 << 20;
    if (width <= len) {
        *out = jv_str(s);
        return 0;
    }
    int64_t total = width - len, left = total / 2 + (total & width & 1);
    jbuf b = {0};
    for (int64_t i = 0; i < left; i++) jb_putc(R, &b, ' ');
    jb_put(R, &b, s.p, s.n);
    for (int64_t i = 0; i < total - left; i++)
        if (jb_putc(R, &b, ' ')) return -1;
    *out = jv_str(jb_str(&b));
    return 0;
}

BUILTIN(f_length) {
    UNUSED_ARGS;
    int64_t n;
    if (len_of(R, at, self, &n)) return -1;
    *out = jv_int(n);
    return 0;
}

BUILTIN(f_default) {
    UNUSED_ARGS;
    bool use = self.t == JT_UNDEF || (has[1] && truthy(p[1]) && !truthy(self));
    *out = use ? (has[0] ? p[0] : jv_str((jstr){"", 0})) : self;
    return 0;
}

/* Sort keys computed once; merge sort keeps Python's stability. */
typedef struct sortctx {
    rt *R;
    const node *at;
    const jv *keys;
    bool reverse;
    bool failed;
} sortctx;

static int sort_cmp(sortctx *c, size_t x, size_t y) {
    int o = 0;
    if (c->failed || jv_order(c->R, c->at, c->keys[x], c->keys[y], &o, 0)) {
        c->failed = true;
        return 0;
    }
    return c->reverse ? -o : o;
}

static void merge_sort(sortctx *c, size_t *idx, size_t *tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(c, idx, tmp, h);
    merge_sort(c, idx + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = sort_cmp(c, idx[j], idx[i]) < 0 ? idx[j++] : idx[i++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

/* Key of an item for sort/unique/min/max: attribute path, case-folded unless case_sensitive. */
static int sort_key(rt *R, const node *at, jv item, const jv *attr, bool case_sensitive, jv *key) {
    *key = item;
    if (attr && attr->t != JT_NONE) {
        if (attr->t == JT_INT) {
            if (get_item(R, at, item, *attr, key)) return -1;
        } else {
            jstr path;
            if (need_str(R, at, *attr, "attribute", &path) || get_path(R, at, item, path, key)) return -1;
        }
    }
    if (!case_sensitive && key->t == JT_STR) {
        jstr low;
        if (str_case(R, at, key->u.s, CASE_LOWER, &low)) return -1;
        *key = jv_str(low);
    }
    return 0;
}

static int sorted_list(rt *R, const node *at, const jlist *items, const jv *keys, bool reverse, jlist **out) {
    size_t n = items->n;
    size_t *idx = ralloc(R, (n + 1) * sizeof *idx), *tmp = ralloc(R, (n + 1) * sizeof *tmp);
    jlist *l = list_new(R, n);
    if (!idx || !tmp || !l) return -1;
    for (size_t i = 0; i < n; i++) idx[i] = i;
    sortctx c = {R, at, keys, reverse, false};
    if (step(R, at, n)) return -1;
    merge_sort(&c, idx, tmp, n);
    if (c.failed) return -1;
    for (size_t i = 0; i < n; i++) l->v[i] = items->v[idx[i]];
    l->n = n;
    *out = l;
    return 0;
}

BUILTIN(f_sort) {
    UNUSED_ARGS;
    jlist *items, *res;
    if (iter_items(R, at, self, &items)) return -1;
    jv *keys = ralloc(R, (items->n + 1) * sizeof *keys);
    if (!keys) return -1;
    for (size_t i = 0; i < items->n; i++)
        if (sort_key(R, at, items->v[i], has[2] ? &p[2] : NULL, has[1] && truthy(p[1]), &keys[i])) return -1;
    if (sorted_list(R, at, items, keys, has[0] && truthy(p[0]), &res)) return -1;
    *out = jv_list(res, false);
    return 0;
}

BUILTIN(f_dictsort) {
    UNUSED_ARGS;
    if (self.t != JT_DICT && self.t != JT_NS)
        return rt_fail(R, at, NX_E_FORMAT, "dictsort needs a mapping, not '%s'", tname(self));
    jv pairs;
    if (dict_items(R, self.u.d, 2, &pairs)) return -1;
    bool by_value = false;
    if (has[1]) {
        jstr by;
        if (need_str(R, at, p[1], "by", &by)) return -1;
        if (jstr_is(by, "value")) by_value = true;
        else if (!jstr_is(by, "key")) return rt_fail(R, at, NX_E_FORMAT, "You can only sort by either \"key\" or \"value\"");
    }
    jlist *items = pairs.u.l, *res;
    jv *keys = ralloc(R, (items->n + 1) * sizeof *keys);
    if (!keys) return -1;
    for (size_t i = 0; i < items->n; i++)
        if (sort_key(R, at, items->v[i].u.l->v[by_value], NULL, has[0] && truthy(p[0]), &keys[i])) return -1;
    if (sorted_list(R, at, items, keys, has[2] && truthy(p[2]), &res)) return -1;
    *out = jv_list(res, false);
    return 0;
}

BUILTIN(f_unique) {
    UNUSED_ARGS;
    jlist *items, *res;
    if (iter_items(R, at, self, &items) || !(res = list_new(R, 0))) return -1;
    jlist *seen = list_new(R, 0);
    if (!seen || step(R, at, items->n * items->n / 64)) return -1;
    for (size_t i = 0; i < items->n; i++) {
        jv k;
        if (sort_key(R, at, items->v[i], has[1] ? &p[1] : NULL, has[0] && truthy(p[0]), &k)) return -1;
        bool dup = false;
        for (size_t j = 0; j < seen->n && !dup; j++) dup = jv_equal(seen->v[j], k, 0);
        if (!dup && (list_push(R, seen, k) || list_push(R, res, items->v[i]))) return -1;
    }
    *out = jv_list(res, false);
    return 0;
}

static int minmax(rt *R, const node *at, jv self, jv *p, const bool *has, bool want_max, jv *out) {
    jlist *items;
    if (iter_items(R, at, self, &items)) return -1;
    if (!items->n) {
        *out = jv_undef((jstr){"", 0});
        return 0;
    }
    jv best = items->v[0], bk;
    if (sort_key(R, at, best, has[1] ? &p[1] : NULL, has[0] && truthy(p[0]), &bk)) return -1;
    for (size_t i = 1; i < items->n; i++) {
        jv k;
        int o;
        if (sort_key(R, at, items->v[i], has[1] ? &p[1] : NULL, has[0] && truthy(p[0]), &k) ||
            jv_order(R, at, k, bk, &o, 0))
            return -1;
        if (want_max ? o > 0 : o < 0) best = items->v[i], bk = k;
    }
    *out = best;
    return 0;
}
BUILTIN(f_max) { (void)a; return minmax(R, at, self, p, has, true, out); }
BUILTIN(f_min) { (void)a; return minmax(R, at, self, p, has, false, out); }

BUILTIN(f_escape) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s)) return -1;
    jbuf b = {0};
    for (size_t i = 0; i < s.n; i++) {
        const char *rep = NULL;
        switch (s.p[i]) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&#34;"; break;
        case '\'': rep = "&#39;"; break;
        }
        if (rep ? jb_puts(R, &b, rep) : jb_putc(R, &b, s.p[i])) return -1;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

static int first_last(rt *R, const node *at, jv self, bool last, jv *out) {
    if (self.t == JT_STR) {
        jstr s = self.u.s;
        if (!s.n) {
            *out = jv_undef((jstr){"", 0});
            return 0;
        }
        size_t st = last ? utf8_prev(s.p, 0, s.n) : 0, adv;
        utf8_next(s.p + st, s.n - st, &adv);
        *out = jv_str((jstr){s.p + st, adv});
        return 0;
    }
    jlist *items;
    if (iter_items(R, at, self, &items)) return -1;
    *out = items->n ? items->v[last ? items->n - 1 : 0] : jv_undef((jstr){"", 0});
    return 0;
}
BUILTIN(f_first) { UNUSED_ARGS; return first_last(R, at, self, false, out); }
BUILTIN(f_last) { UNUSED_ARGS; return first_last(R, at, self, true, out); }

/* Python float(str): surrounding whitespace, underscores between digits, inf/nan words. */
static bool parse_py_float(jstr s, double *out) {
    s = str_strip(s, NULL, true, true);
    char buf[128];
    size_t o = 0;
    if (!s.n || s.n >= sizeof buf) return false;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.p[i];
        if (c == '_') {
            if (!i || i + 1 >= s.n || !is_digit(s.p[i - 1]) || !is_digit(s.p[i + 1])) return false;
            continue;
        }
        if (c == 'x' || c == 'X' || c == '(' || !c) return false;
        buf[o++] = c;
    }
    buf[o] = 0;
    char *end;
    errno = 0;
    double d = strtod(buf, &end);
    if (end == buf || *end) return false;
    *out = d;
    return true;
}

static bool parse_py_int(jstr s, int64_t base, int64_t *out) {
    s = str_strip(s, NULL, true, true);
    size_t i = 0;
    bool neg = false;
    if (i < s.n && (s.p[i] == '+' || s.p[i] == '-')) neg = s.p[i++] == '-';
    if (i + 1 < s.n && s.p[i] == '0') {
        char x = (char)(s.p[i + 1] | 0x20);
        int64_t pb = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
        if (pb && (base == pb || base == 0)) base = pb, i += 2;
    }
    if (base == 0) base = 10;
    if (base < 2 || base > 36 || i >= s.n) return false;
    uint64_t v = 0;
    bool any = false;
    for (; i < s.n; i++) {
        char c = s.p[i];
        if (c == '_' && any && i + 1 < s.n && s.p[i + 1] != '_') continue;
        int d = is_digit(c) ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
        any = true;
    }
    if (!any || v > (uint64_t)INT64_MAX + neg) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

BUILTIN(f_int) {
    UNUSED_ARGS;
    jv dflt = has[0] ? p[0] : jv_int(0);
    int64_t base = 10;
    if (has[1] && need_int(R, at, p[1], "base", &base)) return -1;
    if (self.t == JT_INT || self.t == JT_BOOL) *out = jv_int(num_i(self));
    else if (self.t == JT_FLOAT) {
        if (!isfinite(self.u.f) || fabs(self.u.f) >= 9.2e18) *out = dflt;
        else *out = jv_int((int64_t)self.u.f);
    } else if (self.t == JT_STR) {
        int64_t i;
        double d;
        if (parse_py_int(self.u.s, base, &i)) *out = jv_int(i);
        else if (base == 10 && parse_py_float(self.u.s, &d) && isfinite(d) && fabs(d) < 9.2e18) *out = jv_int((int64_t)d);
        else *out = dflt;
    } else {
        *out = dflt;
    }
    return 0;
}

BUILTIN(f_float) {
    UNUSED_ARGS;
    jv dflt = has[0] ? p[0] : jv_float(0.0);
    double d;
    if (is_num(self)) *out = jv_float(num_f(self));
    else if (self.t == JT_STR && parse_py_float(self.u.s, &d)) *out = jv_float(d);
    else *out = dflt;
    return 0;
}

/* Jinja2's indent: lines after the first (and blank ones only with blank=True) get the prefix. */
BUILTIN(f_indent) {
    UNUSED_ARGS;
    jstr s, ind;
    if (str_of(R, self, &s)) return -1;
    jbuf ib = {0};
    if (has[0] && p[0].t == JT_STR) {
        ind = p[0].u.s;
    } else {
        int64_t w = 4;
        if (has[0] && need_int(R, at, p[0], "width", &w)) return -1;
        if (w > 1 << 16) w = 1 << 16;
        for (int64_t i = 0; i < w; i++)
            if (jb_putc(R, &ib, ' ')) return -1;
        ind = jb_str(&ib);
    }
    bool first = has[1] && truthy(p[1]), blank = has[2] && truthy(p[2]);
    jbuf sb = {0};
    if (jb_put(R, &sb, s.p, s.n) || jb_putc(R, &sb, '\n')) return -1; /* as Jinja2 does before splitlines */
    jlist *lines;
    if (str_splitlines(R, jb_str(&sb), false, &lines)) return -1;
    jbuf b = {0};
    if (first && jb_put(R, &b, ind.p, ind.n)) return -1;
    for (size_t i = 0; i < lines->n; i++) {
        jstr ln = lines->v[i].u.s;
        if (i && jb_putc(R, &b, '\n')) return -1;
        if (i && (blank || ln.n) && jb_put(R, &b, ind.p, ind.n)) return -1;
        if (jb_put(R, &b, ln.p, ln.n)) return -1;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

BUILTIN(f_items) {
    UNUSED_ARGS;
    if (self.t == JT_UNDEF) {
        jlist *l = list_new(R, 0);
        if (!l) return -1;
        *out = jv_list(l, false);
        return 0;
    }
    if (self.t != JT_DICT && self.t != JT_NS)
        return rt_fail(R, at, NX_E_FORMAT, "can only get item pairs from a mapping, not '%s'", tname(self));
    return dict_items(R, self.u.d, 2, out);
}

BUILTIN(f_join) {
    UNUSED_ARGS;
    jlist *items;
    jstr sep = {"", 0};
    if (iter_items(R, at, self, &items)) return -1;
    if (has[0] && as_str(R, p[0], &sep)) return -1;
    jbuf b = {0};
    for (size_t i = 0; i < items->n; i++) {
        jv v = items->v[i];
        if (has[1] && p[1].t != JT_NONE && sort_key(R, at, v, &p[1], true, &v)) return -1;
        if ((i && jb_put(R, &b, sep.p, sep.n)) || to_str(R, v, &b, 0)) return -1;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

BUILTIN(f_list) {
    UNUSED_ARGS;
    jlist *items, *l;
    if (iter_items(R, at, self, &items) || !(l = list_new(R, items->n))) return -1;
    if (items->n) memcpy(l->v, items->v, items->n * sizeof(jv));
    l->n = items->n;
    *out = jv_list(l, false);
    return 0;
}

BUILTIN(f_replace) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s)) return -1;
    return m_replace(R, at, jv_str(s), p, has, a, out);
}

BUILTIN(f_reverse) {
    UNUSED_ARGS;
    if (self.t == JT_STR) {
        jlist *chars;
        if (str_chars(R, self.u.s, &chars)) return -1;
        jbuf b = {0};
        for (size_t i = chars->n; i-- > 0;)
            if (jb_put(R, &b, chars->v[i].u.s.p, chars->v[i].u.s.n)) return -1;
        *out = jv_str(jb_str(&b));
        return 0;
    }
    jlist *items, *l;
    if (iter_items(R, at, self, &items) || !(l = list_new(R, items->n))) return -1;
    for (size_t i = 0; i < items->n; i++) l->v[i] = items->v[items->n - 1 - i];
    l->n = items->n;
    *out = jv_list(l, false);
    return 0;
}

BUILTIN(f_round) {
    UNUSED_ARGS;
    int64_t prec = 0;
    jstr method = JSTR("common");
    if ((has[0] && need_int(R, at, p[0], "precision", &prec)) || (has[1] && need_str(R, at, p[1], "method", &method)))
        return -1;
    if (!is_num(self)) return rt_fail(R, at, NX_E_FORMAT, "round() needs a number, not '%s'", tname(self));
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    double x = num_f(self), m = pow(10.0, (double)prec), r;
    if (jstr_is(method, "common")) r = nearbyint(x * m) / m; /* Python round(): half to even */
    else if (jstr_is(method, "ceil")) r = ceil(x * m) / m;
    else if (jstr_is(method, "floor")) r = floor(x * m) / m;
    else return rt_fail(R, at, NX_E_FORMAT, "method must be common, ceil or floor");
    if (self.t != JT_FLOAT && jstr_is(method, "common") && prec >= 0) *out = jv_int(num_i(self));
    else *out = jv_float(r);
    return 0;
}

BUILTIN(f_safe) { UNUSED_ARGS; *out = self; return 0; }

BUILTIN(f_string) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s)) return -1;
    *out = jv_str(s);
    return 0;
}

BUILTIN(f_sum) {
    UNUSED_ARGS;
    jlist *items;
    jv acc = has[1] ? p[1] : jv_int(0);
    if (iter_items(R, at, self, &items)) return -1;
    for (size_t i = 0; i < items->n; i++) {
        jv v = items->v[i];
        if (has[0] && p[0].t != JT_NONE && sort_key(R, at, v, &p[0], true, &v)) return -1;
        if (binop(R, at, OP_ADD, acc, v, &acc)) return -1;
    }
    *out = acc;
    return 0;
}

BUILTIN(f_trim) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s)) return -1;
    return m_strip(R, at, jv_str(s), p, has, a, out);
}

/* transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
 * sort_keys=False); no HTML escaping. */
BUILTIN(f_tojson) {
    UNUSED_ARGS;
    jopts o = {.indent = -1, .ascii = has[0] && truthy(p[0]), .sort = has[3] && truthy(p[3])};
    if (has[1] && p[1].t != JT_NONE) {
        if (p[1].t == JT_STR) return rt_fail(R, at, NX_E_FORMAT, "string indent is not supported");
        if (need_int(R, at, p[1], "indent", &o.indent)) return -1;
        if (o.indent < 0) o.indent = 0;
        if (o.indent > 64) o.indent = 64;
    }
    o.item_sep = o.indent >= 0 ? JSTR(",") : JSTR(", ");
    o.key_sep = JSTR(": ");
    if (has[2] && p[2].t != JT_NONE) {
        jv sp = p[2];
        if (sp.t != JT_LIST || sp.u.l->n != 2 || sp.u.l->v[0].t != JT_STR || sp.u.l->v[1].t != JT_STR)
            return rt_fail(R, at, NX_E_FORMAT, "separators must be a pair of strings");
        o.item_sep = sp.u.l->v[0].u.s;
        o.key_sep = sp.u.l->v[1].u.s;
    }
    jbuf b = {0};
    if (tojson(R, at, self, &b, &o, 0)) return -1;
    *out = jv_str(jb_str(&b));
    return 0;
}

BUILTIN(f_wordcount) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s)) return -1;
    int64_t n = 0;
    bool in = false;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        int32_t c = utf8_next(s.p + i, s.n - i, &adv);
        utf8proc_category_t k = utf8proc_category(c);
        bool w = c == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
                 (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
        n += w && !in;
        in = w;
        i += adv;
    }
    *out = jv_int(n);
    return 0;
}

/* printf-style "%s"|format(x): conversions s r d i f with optional width / precision. */
BUILTIN(f_format) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s)) return -1;
    const jlist *fargs = p[0].u.l;
    size_t ai = 0;
    jbuf b = {0};
    for (size_t i = 0; i < s.n; i++) {
        if (s.p[i] != '%') {
            if (jb_putc(R, &b, s.p[i])) return -1;
            continue;
        }
        size_t j = i + 1;
        char spec[32] = "%";
        size_t k = 1;
        while (j < s.n && k < 20 && strchr("-+ 0#.123456789", s.p[j])) spec[k++] = s.p[j++];
        if (j >= s.n) return rt_fail(R, at, NX_E_FORMAT, "incomplete format");
        char conv = s.p[j];
        if (conv == '%') {
            if (jb_putc(R, &b, '%')) return -1;
            i = j;
            continue;
        }
        if (ai >= fargs->n) return rt_fail(R, at, NX_E_FORMAT, "not enough arguments for format string");
        jv v = fargs->v[ai++];
        char tmp[128];
        if (conv == 's' || conv == 'r') {
            jbuf vb = {0};
            if (conv == 's' ? to_str(R, v, &vb, 0) : to_repr(R, v, &vb, 0)) return -1;
            if (jb_put(R, &b, vb.p, vb.n)) return -1;
        } else if (conv == 'd' || conv == 'i') {
            if (!is_num(v)) return rt_fail(R, at, NX_E_FORMAT, "%%d format: a number is required");
            memcpy(spec + k, PRId64, sizeof PRId64);
            int64_t iv = v.t == JT_FLOAT ? (int64_t)v.u.f : num_i(v);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
            snprintf(tmp, sizeof tmp, spec, iv);
            if (jb_puts(R, &b, tmp)) return -1;
        } else if (conv == 'f' || conv == 'e' || conv == 'g') {
            if (!is_num(v)) return rt_fail(R, at, NX_E_FORMAT, "%%f format: a number is required");
            spec[k++] = conv;
            spec[k] = 0;
            snprintf(tmp, sizeof tmp, spec, num_f(v));
#pragma GCC diagnostic pop
            if (jb_puts(R, &b, tmp)) return -1;
        } else {
            return rt_fail(R, at, NX_E_FORMAT, "unsupported format character '%c'", conv);
        }
        i = j;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

static int find_test_checked(rt *R, const node *at, jv name, int *fn) {
    jstr s;
    if (need_str(R, at, name, "test name", &s)) return -1;
    *fn = find_test(s);
    if (*fn < 0) return rt_fail(R, at, NX_E_FORMAT, "no test named '%.*s'", (int)s.n, s.p);
    return 0;
}

/* select / reject / selectattr / rejectattr share one walk. */
static int select_common(rt *R, const node *at, jv self, const jlist *rest, bool by_attr, bool keep, jv *out) {
    jlist *items, *res;
    if (iter_items(R, at, self, &items) || !(res = list_new(R, 0))) return -1;
    size_t k = 0;
    jstr attr = {"", 0};
    if (by_attr) {
        if (!rest->n) return rt_fail(R, at, NX_E_FORMAT, "missing attribute name");
        if (need_str(R, at, rest->v[k++], "attribute", &attr)) return -1;
    }
    int fn = -1;
    if (k < rest->n && find_test_checked(R, at, rest->v[k++], &fn)) return -1;
    args ta = {.pos = k < rest->n ? rest->v + k : NULL, .npos = rest->n - k};
    for (size_t i = 0; i < items->n; i++) {
        jv v = items->v[i];
        if (by_attr && get_path(R, at, v, attr, &v)) return -1;
        bool ok;
        if (fn < 0) ok = truthy(v);
        else if (run_test(R, at, fn, v, &ta, &ok)) return -1;
        if (ok == keep && list_push(R, res, items->v[i])) return -1;
    }
    *out = jv_list(res, false);
    return 0;
}
BUILTIN(f_select) { UNUSED_ARGS; return select_common(R, at, self, p[0].u.l, false, true, out); }
BUILTIN(f_reject) { UNUSED_ARGS; return select_common(R, at, self, p[0].u.l, false, false, out); }
BUILTIN(f_selectattr) { UNUSED_ARGS; return select_common(R, at, self, p[0].u.l, true, true, out); }
BUILTIN(f_rejectattr) { UNUSED_ARGS; return select_common(R, at, self, p[0].u.l, true, false, out); }

/* map(attribute='x', default=d) or map('filter', args...). */
BUILTIN(f_map) {
    UNUSED_ARGS;
    jlist *items, *res;
    if (iter_items(R, at, self, &items) || !(res = list_new(R, items->n))) return -1;
    jv attr = jv_undef((jstr){"", 0}), dflt = jv_undef((jstr){"", 0});
    args fa = {0};
    for (size_t k = 0; k < a->nkw; k++) {
        if (jstr_is(a->kn[k], "attribute")) attr = a->kv[k];
        else if (jstr_is(a->kn[k], "default")) dflt = a->kv[k];
    }
    const bdef *fd = NULL;
    if (attr.t == JT_UNDEF) {
        jstr name;
        if (!a->npos) return rt_fail(R, at, NX_E_FORMAT, "map() needs a filter name or attribute=");
        if (need_str(R, at, a->pos[0], "filter name", &name)) return -1;
        int fi = find_filter(name);
        if (fi < 0) return rt_fail(R, at, NX_E_FORMAT, "no filter named '%.*s'", (int)name.n, name.p);
        fd = filter_def(fi);
        fa = (args){.pos = a->pos + 1, .npos = a->npos - 1, .kn = a->kn, .kv = a->kv, .nkw = a->nkw};
    } else if (a->npos) {
        return rt_fail(R, at, NX_E_FORMAT, "map() with attribute= takes no positional arguments");
    }
    for (size_t i = 0; i < items->n; i++) {
        jv v = items->v[i];
        if (fd) {
            if (apply_filter(R, at, fd, v, &fa, &v)) return -1;
        } else {
            if (sort_key(R, at, v, &attr, true, &v)) return -1;
            if (v.t == JT_UNDEF && dflt.t != JT_UNDEF) v = dflt;
        }
        res->v[res->n++] = v;
    }
    *out = jv_list(res, false);
    return 0;
}

/* ------------------------------------------------------------------ tests */

#define TEST(name) static int name(rt *R, const node *at, jv v, const jv *x, bool *res)
#define UNUSED_T (void)R, (void)at, (void)v, (void)x

TEST(t_defined) { UNUSED_T; *res = v.t != JT_UNDEF; return 0; }
TEST(t_undefined) { UNUSED_T; *res = v.t == JT_UNDEF; return 0; }
TEST(t_none) { UNUSED_T; *res = v.t == JT_NONE; return 0; }
TEST(t_boolean) { UNUSED_T; *res = v.t == JT_BOOL; return 0; }
TEST(t_true) { UNUSED_T; *res = v.t == JT_BOOL && v.u.b; return 0; }
TEST(t_false) { UNUSED_T; *res = v.t == JT_BOOL && !v.u.b; return 0; }
TEST(t_string) { UNUSED_T; *res = v.t == JT_STR; return 0; }
TEST(t_number) { UNUSED_T; *res = is_num(v); return 0; }
TEST(t_integer) { UNUSED_T; *res = v.t == JT_INT; return 0; }
TEST(t_float) { UNUSED_T; *res = v.t == JT_FLOAT; return 0; }
TEST(t_mapping) { UNUSED_T; *res = v.t == JT_DICT; return 0; }
TEST(t_iterable) { UNUSED_T; *res = v.t == JT_LIST || v.t == JT_DICT || v.t == JT_STR || v.t == JT_UNDEF; return 0; }
TEST(t_sequence) { UNUSED_T; *res = v.t == JT_LIST || v.t == JT_DICT || v.t == JT_STR; return 0; }
TEST(t_callable) { UNUSED_T; *res = v.t == JT_MACRO || v.t == JT_FUNC || v.t == JT_METHOD; return 0; }
TEST(t_escaped) { UNUSED_T; *res = false; return 0; }
TEST(t_lower) { UNUSED_T; *res = v.t == JT_STR && str_class(v.u.s, 4); return 0; }
TEST(t_upper) { UNUSED_T; *res = v.t == JT_STR && str_class(v.u.s, 5); return 0; }

static int parity(rt *R, const node *at, jv v, int64_t *i) {
    *i = 0;
    if (v.t != JT_INT && v.t != JT_BOOL) {
        if (v.t == JT_FLOAT && v.u.f == floor(v.u.f) && fabs(v.u.f) < 9e18) {
            *i = (int64_t)v.u.f;
            return 0;
        }
        return rt_fail(R, at, NX_E_FORMAT, "odd/even/divisibleby need an integer, not '%s'", tname(v));
    }
    *i = num_i(v);
    return 0;
}
TEST(t_odd) { UNUSED_T; int64_t i; if (parity(R, at, v, &i)) return -1; *res = i % 2 != 0; return 0; }
TEST(t_even) { UNUSED_T; int64_t i; if (parity(R, at, v, &i)) return -1; *res = i % 2 == 0; return 0; }
TEST(t_divisibleby) {
    UNUSED_T;
    int64_t i, d;
    if (parity(R, at, v, &i) || parity(R, at, x[0], &d)) return -1;
    if (d == 0) return rt_fail(R, at, NX_E_FORMAT, "integer modulo by zero");
    *res = d == -1 || i % d == 0;
    return 0;
}
TEST(t_eq) { UNUSED_T; *res = jv_equal(v, x[0], 0); return 0; }
TEST(t_ne) { UNUSED_T; *res = !jv_equal(v, x[0], 0); return 0; }
TEST(t_lt) { return compare(R, at, CMP_LT, v, x[0], res); }
TEST(t_le) { return compare(R, at, CMP_LE, v, x[0], res); }
TEST(t_gt) { return compare(R, at, CMP_GT, v, x[0], res); }
TEST(t_ge) { return compare(R, at, CMP_GE, v, x[0], res); }
TEST(t_in) { return contains(R, at, v, x[0], res); }
TEST(t_sameas) {
    UNUSED_T;
    jv y = x[0];
    if (v.t != y.t) *res = false;
    else if (v.t == JT_BOOL) *res = v.u.b == y.u.b;
    else if (v.t == JT_NONE || v.t == JT_UNDEF) *res = true;
    else if (v.t == JT_INT) *res = v.u.i == y.u.i;
    else if (v.t == JT_STR) *res = v.u.s.p == y.u.s.p && v.u.s.n == y.u.s.n;
    else *res = jv_equal(v, y, 0) && v.u.l == y.u.l;
    return 0;
}
TEST(t_filter) { UNUSED_T; *res = v.t == JT_STR && find_filter(v.u.s) >= 0; return 0; }
TEST(t_test) { UNUSED_T; *res = v.t == JT_STR && find_test(v.u.s) >= 0; return 0; }

/* ------------------------------------------------------------------ tables */

static const bdef FILTER_TABLE[] = {
    {"abs", f_abs, 0, {NULL}, false},
    {"attr", f_attr, 1, {"name", NULL}, false},
    {"batch", f_batch, 1, {"linecount", "fill_with", NULL}, false},
    {"capitalize", f_capitalize, 0, {NULL}, false},
    {"center", f_center, 0, {"width", NULL}, false},
    {"count", f_length, 0, {NULL}, false},
    {"d", f_default, 0, {"default_value", "boolean", NULL}, false},
    {"default", f_default, 0, {"default_value", "boolean", NULL}, false},
    {"dictsort", f_dictsort, 0, {"case_sensitive", "by", "reverse", NULL}, false},
    {"e", f_escape, 0, {NULL}, false},
    {"escape", f_escape, 0, {NULL}, false},
    {"first", f_first, 0, {NULL}, false},
    {"float", f_float, 0, {"default", NULL}, false},
    {"forceescape", f_escape, 0, {NULL}, false},
    {"format", f_format, 0, {"*", NULL}, false},
    {"indent", f_indent, 0, {"width", "first", "blank", NULL}, false},
    {"int", f_int, 0, {"default", "base", NULL}, false},
    {"items", f_items, 0, {NULL}, false},
    {"join", f_join, 0, {"d", "attribute", NULL}, false},
    {"last", f_last, 0, {NULL}, false},
    {"length", f_length, 0, {NULL}, false},
    {"list", f_list, 0, {NULL}, false},
    {"lower", f_lower, 0, {NULL}, false},
    {"map", f_map, 0, {NULL}, true},
    {"max", f_max, 0, {"case_sensitive", "attribute", NULL}, false},
    {"min", f_min, 0, {"case_sensitive", "attribute", NULL}, false},
    {"reject", f_reject, 0, {"*", NULL}, false},
    {"rejectattr", f_rejectattr, 0, {"*", NULL}, false},
    {"replace", f_replace, 2, {"old", "new", "count", NULL}, false},
    {"reverse", f_reverse, 0, {NULL}, false},
    {"round", f_round, 0, {"precision", "method", NULL}, false},
    {"safe", f_safe, 0, {NULL}, false},
    {"select", f_select, 0, {"*", NULL}, false},
    {"selectattr", f_selectattr, 0, {"*", NULL}, false},
    {"sort", f_sort, 0, {"reverse", "case_sensitive", "attribute", NULL}, false},
    {"string", f_string, 0, {NULL}, false},
    {"sum", f_sum, 0, {"attribute", "start", NULL}, false},
    {"title", f_title, 0, {NULL}, false},
    {"tojson", f_tojson, 0, {"ensure_ascii", "indent", "separators", "sort_keys", NULL}, false},
    {"trim", f_trim, 0, {"chars", NULL}, false},
    {"unique", f_unique, 0, {"case_sensitive", "attribute", NULL}, false},
    {"upper", f_upper, 0, {NULL}, false},
    {"wordcount", f_wordcount, 0, {NULL}, false},
};

static const tdef TEST_TABLE[] = {
    {"boolean", t_boolean, 0}, {"callable", t_callable, 0}, {"defined", t_defined, 0},
    {"divisibleby", t_divisibleby, 1}, {"eq", t_eq, 1}, {"equalto", t_eq, 1},
    {"escaped", t_escaped, 0}, {"even", t_even, 0}, {"false", t_false, 0},
    {"filter", t_filter, 0}, {"float", t_float, 0}, {"ge", t_ge, 1},
    {"greaterthan", t_gt, 1}, {"gt", t_gt, 1}, {"in", t_in, 1},
    {"integer", t_integer, 0}, {"iterable", t_iterable, 0}, {"le", t_le, 1},
    {"lessthan", t_lt, 1}, {"lower", t_lower, 0}, {"lt", t_lt, 1},
    {"mapping", t_mapping, 0}, {"ne", t_ne, 1}, {"none", t_none, 0},
    {"number", t_number, 0}, {"odd", t_odd, 0}, {"sameas", t_sameas, 1},
    {"sequence", t_sequence, 0}, {"string", t_string, 0}, {"test", t_test, 0},
    {"true", t_true, 0}, {"undefined", t_undefined, 0}, {"upper", t_upper, 0},
};

static const bdef STR_METHODS[] = {
    {"capitalize", m_capitalize, 0, {NULL}, false},
    {"count", m_count, 1, {"sub", NULL}, false},
    {"endswith", m_endswith, 1, {"suffix", NULL}, false},
    {"find", m_find, 1, {"sub", NULL}, false},
    {"format", m_format, 0, {NULL}, true},
    {"index", m_index, 1, {"sub", NULL}, false},
    {"isalnum", m_isalnum, 0, {NULL}, false},
    {"isalpha", m_isalpha, 0, {NULL}, false},
    {"isdigit", m_isdigit, 0, {NULL}, false},
    {"islower", m_islower, 0, {NULL}, false},
    {"isspace", m_isspace, 0, {NULL}, false},
    {"isupper", m_isupper, 0, {NULL}, false},
    {"join", m_join, 1, {"iterable", NULL}, false},
    {"lower", m_lower, 0, {NULL}, false},
    {"lstrip", m_lstrip, 0, {"chars", NULL}, false},
    {"removeprefix", m_removeprefix, 1, {"prefix", NULL}, false},
    {"removesuffix", m_removesuffix, 1, {"suffix", NULL}, false},
    {"replace", m_replace, 2, {"old", "new", "count", NULL}, false},
    {"rfind", m_rfind, 1, {"sub", NULL}, false},
    {"rsplit", m_rsplit, 0, {"sep", "maxsplit", NULL}, false},
    {"rstrip", m_rstrip, 0, {"chars", NULL}, false},
    {"split", m_split, 0, {"sep", "maxsplit", NULL}, false},
    {"splitlines", m_splitlines, 0, {"keepends", NULL}, false},
    {"startswith", m_startswith, 1, {"prefix", NULL}, false},
    {"strip", m_strip, 0, {"chars", NULL}, false},
    {"title", m_title, 0, {NULL}, false},
    {"upper", m_upper, 0, {NULL}, false},
};

static const bdef DICT_METHODS[] = {
    {"get", m_get, 1, {"key", "default", NULL}, false},
    {"items", m_items, 0, {NULL}, false},
    {"keys", m_keys, 0, {NULL}, false},
    {"values", m_values, 0, {NULL}, false},
};

static const bdef LIST_METHODS[] = {
    {"append", m_append, 1, {"object", NULL}, false},
    {"count", m_list_count, 1, {"value", NULL}, false},
    {"index", m_list_index, 1, {"value", NULL}, false},
};

static const bdef LOOP_METHODS[] = {
    {"cycle", m_cycle, 0, {NULL}, true},
};

static const bdef GLOBALS[] = {
    {"dict", g_dict, 0, {NULL}, true},
    {"namespace", g_namespace, 0, {NULL}, true},
    {"raise_exception", g_raise_exception, 0, {NULL}, true},
    {"range", g_range, 0, {NULL}, true},
    {"strftime_now", g_strftime_now, 1, {"format", NULL}, false},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static int find_filter(jstr name) {
    for (size_t i = 0; i < COUNT(FILTER_TABLE); i++)
        if (jstr_is(name, FILTER_TABLE[i].name)) return (int)i;
    return -1;
}

static const bdef *filter_def(int fn) { return &FILTER_TABLE[fn]; }

static int find_test(jstr name) {
    for (size_t i = 0; i < COUNT(TEST_TABLE); i++)
        if (jstr_is(name, TEST_TABLE[i].name)) return (int)i;
    return -1;
}

static int test_nargs(int fn) { return TEST_TABLE[fn].nargs; }

static const bdef *lookup(const bdef *t, size_t n, jstr name) {
    for (size_t i = 0; i < n; i++)
        if (jstr_is(name, t[i].name)) return &t[i];
    return NULL;
}

static const bdef *find_method(jv self, jstr name) {
    switch ((jt)self.t) {
    case JT_STR: return lookup(STR_METHODS, COUNT(STR_METHODS), name);
    case JT_DICT: return lookup(DICT_METHODS, COUNT(DICT_METHODS), name);
    case JT_LIST: return lookup(LIST_METHODS, COUNT(LIST_METHODS), name);
    case JT_LOOP: return lookup(LOOP_METHODS, COUNT(LOOP_METHODS), name);
    default: return NULL;
    }
}

static const bdef *find_global(jstr name, uint16_t *id) {
    for (size_t i = 0; i < COUNT(GLOBALS); i++)
        if (jstr_is(name, GLOBALS[i].name)) {
            *id = (uint16_t)i;
            return &GLOBALS[i];
        }
    return NULL;
}

static const bdef *global_def(uint16_t id) { return &GLOBALS[id]; }

static int run_test(rt *R, const node *at, int fn, jv v, const args *a, bool *res) {
    const tdef *t = &TEST_TABLE[fn];
    if (a->nkw) return rt_fail(R, at, NX_E_FORMAT, "test '%s' takes no keyword arguments", t->name);
    if ((int)a->npos != t->nargs)
        return rt_fail(R, at, NX_E_FORMAT, "test '%s' takes %d argument%s (%zu given)", t->name, t->nargs,
                       t->nargs == 1 ? "" : "s", a->npos);
    return t->fn(R, at, v, a->pos, res);
}

/* ================================================================== statements */

static int assign(rt *R, frame *F, const node *target, jv v) {
    if (target->kind == E_NAME) return frame_set(R, F, target->name, v);
    if (target->kind == E_ATTR) {
        jv obj;
        if (eval(R, F, target->a, &obj)) return -1;
        if (obj.t != JT_NS) return rt_fail(R, target, NX_E_FORMAT, "can only assign attributes of a namespace(), not '%s'", tname(obj));
        return dict_set(R, obj.u.d, target->name, v);
    }
    /* tuple unpacking */
    jlist *items;
    if (iter_items(R, target, v, &items)) return -1;
    if (items->n != target->args.n)
        return rt_fail(R, target, NX_E_FORMAT, "cannot unpack %zu value%s into %zu name%s", items->n,
                       items->n == 1 ? "" : "s", target->args.n, target->args.n == 1 ? "" : "s");
    for (size_t i = 0; i < items->n; i++)
        if (assign(R, F, target->args.v[i], items->v[i])) return -1;
    return 0;
}

static int capture(rt *R, frame *F, const nlist *body, jstr *out) {
    jbuf b = {0}, *saved = R->out;
    R->out = &b;
    int r = render(R, F, body);
    R->out = saved;
    *out = jb_str(&b);
    return r;
}

static int exec_for(rt *R, frame *F, const node *s) {
    jv it;
    jlist *items;
    if (eval(R, F, s->b, &it) || iter_items(R, s->b, it, &items)) return -1;
    if (s->c) { /* `for x in xs if cond`: loop.* counts only the kept items */
        jlist *kept = list_new(R, 0);
        frame *tf = frame_new(R, F);
        if (!kept || !tf) return -1;
        for (size_t i = 0; i < items->n; i++) {
            jv c;
            tf->vars.n = 0;
            if (step(R, s, 1) || assign(R, tf, s->a, items->v[i]) || eval(R, tf, s->c, &c)) return -1;
            if (truthy(c) && list_push(R, kept, items->v[i])) return -1;
        }
        items = kept;
    }
    if (!items->n) return render(R, F, &s->orelse);
    jloop *lp = ralloc(R, sizeof *lp);
    frame *IF = frame_new(R, F);
    if (!lp || !IF) return -1;
    lp->items = items;
    lp->length = (int64_t)items->n;
    for (size_t i = 0; i < items->n; i++) {
        if (step(R, s, 1)) return -1;
        IF->vars.n = 0; /* Jinja2 scopes assignments to one iteration */
        lp->index0 = (int64_t)i;
        if (frame_set(R, IF, JSTR("loop"), (jv){.t = JT_LOOP, .u.lp = lp}) || assign(R, IF, s->a, items->v[i]))
            return -1;
        int r = render(R, IF, &s->body);
        if (r < 0) return -1;
        if (r == R_BREAK) break;
    }
    return R_OK;
}

static int exec_stmt(rt *R, frame *F, const node *s) {
    if (step(R, s, 1)) return -1;
    switch ((node_kind)s->kind) {
    case N_TEXT: return jb_put(R, R->out, s->name.p, s->name.n);
    case N_OUTPUT: {
        jv v;
        if (eval(R, F, s->a, &v)) return -1;
        return to_str(R, v, R->out, 0);
    }
    case N_IF: {
        jv c;
        if (eval(R, F, s->a, &c)) return -1;
        return render(R, F, truthy(c) ? &s->body : &s->orelse);
    }
    case N_FOR: return exec_for(R, F, s);
    case N_SET: {
        jv v;
        if (eval(R, F, s->b, &v)) return -1;
        return assign(R, F, s->a, v);
    }
    case N_SETBLOCK: {
        jstr text;
        int r = capture(R, F, &s->body, &text);
        if (r) return r;
        jv v = jv_str(text);
        if (s->b) {
            jv saved = R->blockval;
            R->blockval = v;
            r = eval(R, F, s->b, &v);
            R->blockval = saved;
            if (r) return -1;
        }
        return assign(R, F, s->a, v);
    }
    case N_MACRO: {
        jmacro *m = ralloc(R, sizeof *m);
        if (!m) return -1;
        m->def = s;
        m->closure = F;
        return frame_set(R, F, s->name, (jv){.t = JT_MACRO, .u.m = m});
    }
    case N_CALLBLOCK: {
        jmacro *m = ralloc(R, sizeof *m);
        jv fn, res;
        args a;
        if (!m) return -1;
        m->def = s;
        m->closure = F;
        if (eval(R, F, s->a->a, &fn) || eval_args(R, F, &s->a->args, &a) ||
            call_value(R, s, fn, &a, (jv){.t = JT_MACRO, .u.m = m}, &res))
            return -1;
        return to_str(R, res, R->out, 0);
    }
    case N_FILTERBLOCK: {
        jstr text;
        jv v;
        int r = capture(R, F, &s->body, &text);
        if (r) return r;
        jv saved = R->blockval;
        R->blockval = jv_str(text);
        r = eval(R, F, s->b, &v);
        R->blockval = saved;
        return r ? -1 : to_str(R, v, R->out, 0);
    }
    case N_BREAK: return R_BREAK;
    case N_CONTINUE: return R_CONTINUE;
    case N_BLOCK: {
        frame *W = F;
        if (s->op) {
            if (!(W = frame_new(R, F))) return -1;
            for (size_t i = 0; i < s->args.n; i++) {
                jv v;
                if (eval(R, F, s->args.v[i]->a, &v) || frame_set(R, W, s->args.v[i]->name, v)) return -1;
            }
        }
        return render(R, W, &s->body);
    }
    case N_DO: {
        jv v;
        return eval(R, F, s->a, &v);
    }
    default: return rt_fail(R, s, NX_E_FORMAT, "internal error: node %d is not a statement", s->kind);
    }
}

/* Renders a body into R->out; returns R_OK, R_BREAK / R_CONTINUE (propagating to the loop), or -1. */
static int render(rt *R, frame *F, const nlist *body) {
    for (size_t i = 0; i < body->n; i++) {
        int r = exec_stmt(R, F, body->v[i]);
        if (r) return r;
    }
    return R_OK;
}

/* ================================================================== public API */

nx_status nx_jinja_parse(const char *src, size_t len, nx_jinja **out, nx_error *err) {
    *out = NULL;
    if (!src && len) return nx_fail(err, NX_E_ARG, "template: NULL source");
    nx_jinja *T = calloc(1, sizeof *T);
    if (!T) return nx_fail(err, NX_E_NOMEM, "template: out of memory");
    T->lim.max_steps = DEFAULT_MAX_STEPS;
    T->lim.max_bytes = DEFAULT_MAX_BYTES;
    T->src = malloc(len + 1);
    if (!T->src) {
        free(T);
        return nx_fail(err, NX_E_NOMEM, "template: out of memory");
    }
    if (len) memcpy(T->src, src, len);
    T->src[len] = 0;
    T->len = len;
    parser P = {.T = T, .s = T->src, .n = len, .err = err};
    if (P.n && P.s[P.n - 1] == '\n') P.n--; /* keep_trailing_newline=False */
    nx_status st = NX_OK;
    if (lex(&P)) goto fail;
    int which;
    if (p_body(&P, &T->body, NULL, &which, 0, "", "")) goto fail;
    free(P.toks);
    *out = T;
    return NX_OK;
fail:
    st = err ? err->status : NX_E_FORMAT;
    if (st == NX_OK) st = NX_E_FORMAT;
    free(P.toks);
    nx_jinja_free(T);
    return st;
}

void nx_jinja_set_limits(nx_jinja *t, const nx_jinja_limits *lim) {
    if (!t || !lim) return;
    if (lim->max_steps) t->lim.max_steps = lim->max_steps;
    if (lim->max_bytes) t->lim.max_bytes = lim->max_bytes;
}

nx_status nx_jinja_render(const nx_jinja *t, const json_t *ctx, char **out, size_t *out_len, nx_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t) return nx_fail(err, NX_E_ARG, "template: NULL template");
    if (ctx && !json_is_object(ctx)) return nx_fail(err, NX_E_ARG, "template: context must be a JSON object");
    nx_error local;
    if (!err) err = &local;
    rt R = {.T = t, .err = err, .max_steps = t->lim.max_steps};
    R.ar.cap = t->lim.max_bytes;
    jbuf b = {0};
    R.out = &b;
    frame *root = frame_new(&R, NULL);
    if (!root) goto fail;
    if (ctx) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)ctx, key, val) {
            jv v;
            if (from_json(&R, val, &v, 0) || frame_set(&R, root, (jstr){key, strlen(key)}, v)) goto fail;
        }
    }
    if (render(&R, root, &t->body) < 0) goto fail;
    char *res = malloc(b.n + 1);
    if (!res) {
        arena_free(&R.ar);
        return nx_fail(err, NX_E_NOMEM, "template: out of memory");
    }
    if (b.n) memcpy(res, b.p, b.n);
    res[b.n] = 0;
    if (out_len) *out_len = b.n;
    *out = res;
    arena_free(&R.ar);
    return NX_OK;
fail:
    arena_free(&R.ar);
    return err->status != NX_OK ? err->status : NX_E_FORMAT;
}

void nx_jinja_free(nx_jinja *t) {
    if (!t) return;
    arena_free(&t->ar);
    free(t->src);
    free(t);
}
