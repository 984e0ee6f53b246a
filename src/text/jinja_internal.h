/* Private interface of the Jinja interpreter (src/text/jinja.h is the public one): the value,
 * tree and token types its files share. jinja_lexer.c tokenizes, jinja_parser.c builds the tree,
 * jinja_eval.c walks it, jinja_builtins.c holds filters/tests/methods/globals, jinja_strings.c the
 * Python str algorithms, jinja_value.c the arena, buffers, containers, printing and ordering.
 * Values, frames and output live in a per-render arena so a failed render frees everything at
 * once. Functions shared between these files carry the jj_ prefix. */
#ifndef NX_TEXT_JINJA_INTERNAL_H
#define NX_TEXT_JINJA_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "text/jinja.h"

#define DEFAULT_MAX_STEPS 20000000ull
#define DEFAULT_MAX_BYTES ((size_t)256 << 20)
#define MAX_VALUE_DEPTH 512 /* recursion cap for printing/comparing/converting nested values */

/* ------------------------------------------------------------------ arena */

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
/* ------------------------------------------------------------------ UTF-8 helpers */

typedef struct jstr {
    const char *p;
    size_t n;
} jstr;

#define JSTR(lit) ((jstr){lit, sizeof(lit) - 1})

static inline bool jstr_eq(jstr a, jstr b) { return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0); }
static inline bool jstr_is(jstr a, const char *z) { return a.n == strlen(z) && memcmp(a.p, z, a.n) == 0; }
/* ------------------------------------------------------------------ values */

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

static inline jv jv_undef(jstr hint) { return (jv){.t = JT_UNDEF, .u.s = hint}; }
static inline jv jv_none(void) { return (jv){.t = JT_NONE}; }
static inline jv jv_bool(bool b) { return (jv){.t = JT_BOOL, .u.b = b}; }
static inline jv jv_int(int64_t i) { return (jv){.t = JT_INT, .u.i = i}; }
static inline jv jv_float(double f) { return (jv){.t = JT_FLOAT, .u.f = f}; }
static inline jv jv_str(jstr s) { return (jv){.t = JT_STR, .u.s = s}; }

/* ------------------------------------------------------------------ tree */

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

typedef enum jj_binop { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT } binop_t;
typedef enum cmpop { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN } cmpop;

struct node;
typedef struct nlist {
    struct node **v;
    size_t n, cap;
} nlist;

typedef struct node {
    uint8_t kind;
    uint8_t op;   /* jj_binop / E_CONST tuple flag / N_BLOCK: new frame */
    bool neg;     /* E_TEST: `is not` */
    int16_t fn;   /* E_FILTER / E_TEST: builtin index */
    size_t off;   /* source offset, for error positions */
    jstr name;    /* E_NAME, E_ATTR, E_KWARG key, E_FILTER/E_TEST name, N_MACRO name, N_TEXT text */
    jv val;       /* E_CONST */
    struct node *a, *b, *c;
    nlist args;   /* items / call args / params / jj_compare operands */
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
/* ------------------------------------------------------------------ builtin tables (forward) */

struct rt;
struct args;
typedef int (*builtin_fn)(struct rt *R, const node *at, jv self, jv *p, const bool *has,
                          const struct args *a, int mode, jv *out);

/* A builtin's signature: parameter names in order; "*" as the last name collects the remaining
 * positional arguments into a list. nreq leading parameters are required. A `raw` builtin
 * binds nothing and reads the call's arguments itself (namespace(), dict(), str.format()). */
typedef struct bdef {
    const char *name;
    builtin_fn fn;
    int nreq;
    const char *params[6];
    bool raw;
    int mode; /* passed to fn: rows that share one function differ only here */
} bdef;

typedef int (*test_fn)(struct rt *R, const node *at, jv v, const jv *args, bool *res);
typedef struct tdef {
    const char *name;
    test_fn fn;
    int nargs; /* 0 or 1 */
} tdef;

/* ------------------------------------------------------------------ lexer */

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
/* ------------------------------------------------------------------ runtime core */

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

typedef struct jopts {
    int64_t indent; /* < 0: single line */
    bool ascii, sort;
    jstr item_sep, key_sep;
} jopts;

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE };


static inline jstr jb_str(const jbuf *b) { return (jstr){b->p ? b->p : "", b->n}; }
static inline jv jv_list(jlist *l, bool tuple) { return (jv){.t = JT_LIST, .tuple = tuple, .u.l = l}; }
static inline bool is_num(jv v) { return v.t == JT_BOOL || v.t == JT_INT || v.t == JT_FLOAT; }
static inline int64_t num_i(jv v) { return v.t == JT_BOOL ? v.u.b : v.u.i; }
static inline double num_f(jv v) { return v.t == JT_FLOAT ? v.u.f : (double)num_i(v); }
static inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
static inline bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static inline bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
static inline bool is_ascii_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* jinja_value.c: arena, UTF-8, runtime errors and budgets, buffers, containers, printing, order */
void *jj_arena_alloc(arena *a, size_t n);
void jj_arena_free(arena *a);
int32_t jj_utf8_next(const char *s, size_t n, size_t *adv);
size_t jj_utf8_prev(const char *s, size_t lo, size_t end);
size_t jj_utf8_put(int32_t cp, char *buf);
size_t jj_utf8_count(const char *s, size_t n);
bool jj_py_isspace(int32_t c);
size_t jj_skip_space_fwd(const char *s, size_t i, size_t end);
size_t jj_skip_space_back(const char *s, size_t lo, size_t end);
void jj_line_col(const char *src, size_t len, size_t off, int *line, int *col);
int jj_rt_fail(rt *R, const node *at, nx_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void *jj_ralloc(rt *R, size_t n);
int jj_step(rt *R, const node *at, uint64_t k);
int jj_jb_reserve(rt *R, jbuf *b, size_t extra);
int jj_jb_put(rt *R, jbuf *b, const char *s, size_t n);
int jj_jb_puts(rt *R, jbuf *b, const char *z);
int jj_jb_putc(rt *R, jbuf *b, char c);
int jj_jb_cp(rt *R, jbuf *b, int32_t cp);
jstr jj_str_dup(rt *R, const char *s, size_t n, bool *ok);
jlist *jj_list_new(rt *R, size_t cap);
int jj_list_push(rt *R, jlist *l, jv v);
jdict *jj_dict_new(rt *R);
bool jj_dict_get(const jdict *d, jstr k, jv *out);
int jj_dict_set(rt *R, jdict *d, jstr k, jv v);
frame *jj_frame_new(rt *R, frame *parent);
int jj_frame_set(rt *R, frame *F, jstr k, jv v);
bool jj_frame_get(const frame *F, jstr k, jv *out);
int jj_from_json(rt *R, const json_t *j, jv *out, int depth);
const char *jj_tname(jv v);
int jj_to_str(rt *R, jv v, jbuf *b, int depth);
int jj_to_repr(rt *R, jv v, jbuf *b, int depth);
int jj_as_str(rt *R, jv v, jstr *out);
int jj_tojson(rt *R, const node *at, jv v, jbuf *b, const jopts *o, int level);
bool jj_truthy(jv v);
bool jj_jv_equal(jv a, jv b, int depth);
int jj_jv_order(rt *R, const node *at, jv a, jv b, int *res, int depth);
int jj_undefined_error(rt *R, const node *at, jv v);
/* jinja_lexer.c */
int jj_perr(parser *P, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void *jj_palloc(parser *P, size_t n);
int jj_lex(parser *P);
/* jinja_eval.c: expression evaluation and the operators builtins reuse */
int jj_str_chars(rt *R, jstr s, jlist **out);
int jj_iter_items(rt *R, const node *at, jv v, jlist **out);
int jj_get_attr(rt *R, jv obj, jstr name, jv *out);
int jj_get_item(rt *R, const node *at, jv obj, jv key, jv *out);
int jj_binop(rt *R, const node *at, int op, jv a, jv b, jv *out);
int jj_contains(rt *R, const node *at, jv item, jv seq, bool *res);
int jj_compare(rt *R, const node *at, int op, jv a, jv b, bool *res);
int jj_apply_filter(rt *R, const node *at, const bdef *d, jv v, const args *a, jv *out);
/* jinja_strings.c: Python str algorithms */
int jj_str_case(rt *R, const node *at, jstr s, int mode, jstr *out);
jstr jj_str_strip(jstr s, const jstr *chars, bool left, bool right);
const char *jj_find_sub(jstr hay, size_t from, jstr needle);
const char *jj_rfind_sub(jstr hay, jstr needle);
int jj_str_replace(rt *R, const node *at, jstr s, jstr old, jstr rep, int64_t count, jstr *out);
int jj_str_split(rt *R, const node *at, jstr s, const jstr *sep, int64_t maxsplit, bool from_right, jv *out);
int jj_str_splitlines(rt *R, jstr s, bool keepends, jlist **out);
int64_t jj_cp_index(jstr s, const char *at);
int jj_get_path(rt *R, const node *at, jv item, jstr path, jv *out);
/* jinja_builtins.c: filters, tests, methods, globals and their tables */
int jj_f_format(rt *R, const node *at, jv self, jv *p, const bool *has, const args *a, int mode, jv *out);
int jj_find_filter(jstr name);
const bdef *jj_filter_def(int fn);
int jj_find_test(jstr name);
int jj_test_nargs(int fn);
const bdef *jj_find_method(jv self, jstr name);
const bdef *jj_find_global(jstr name, uint16_t *id);
const bdef *jj_global_def(uint16_t id);
int jj_run_test(rt *R, const node *at, int fn, jv v, const args *a, bool *res);

#endif
