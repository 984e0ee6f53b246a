/* Jinja runtime values: the render arena, UTF-8 helpers, error and budget accounting, string
 * buffers, lists/dicts/frames, JSON in and out, Python str()/repr(), truth, equality and order. */
#include "text/jinja_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <utf8proc.h>

/* ================================================================== arena */
void *jj_arena_alloc(arena *a, size_t n) {
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

void jj_arena_free(arena *a) {
    arena_chunk *c = a->head;
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}
/* Decodes one code point at s[0..n); invalid or truncated sequences yield U+FFFD over 1 byte. */
int32_t jj_utf8_next(const char *s, size_t n, size_t *adv) {
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
size_t jj_utf8_prev(const char *s, size_t lo, size_t end) {
    size_t i = end - 1;
    for (int k = 0; k < 3 && i > lo && ((unsigned char)s[i] & 0xC0) == 0x80; k++) i--;
    return i;
}

size_t jj_utf8_put(int32_t cp, char *buf) {
    utf8proc_ssize_t k = utf8proc_encode_char(cp, (utf8proc_uint8_t *)buf);
    return k > 0 ? (size_t)k : 0;
}

size_t jj_utf8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Python's str.isspace(). */
bool jj_py_isspace(int32_t c) {
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

size_t jj_skip_space_fwd(const char *s, size_t i, size_t end) {
    while (i < end) {
        size_t adv;
        int32_t c = jj_utf8_next(s + i, end - i, &adv);
        if (!jj_py_isspace(c)) break;
        i += adv;
    }
    return i;
}

size_t jj_skip_space_back(const char *s, size_t lo, size_t end) {
    while (end > lo) {
        size_t st = jj_utf8_prev(s, lo, end), adv;
        int32_t c = jj_utf8_next(s + st, end - st, &adv);
        if (!jj_py_isspace(c) || st + adv != end) break;
        end = st;
    }
    return end;
}
void jj_line_col(const char *src, size_t len, size_t off, int *line, int *col) {
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
int jj_rt_fail(rt *R, const node *at, nx_status st, const char *fmt, ...) {
    if (R->failed) return -1;
    R->failed = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) {
        int line, col;
        jj_line_col(R->T->src, R->T->len, at->off, &line, &col);
        nx_fail(R->err, st, "template line %d, column %d: %s", line, col, msg);
    } else {
        nx_fail(R->err, st, "template: %s", msg);
    }
    return -1;
}

void *jj_ralloc(rt *R, size_t n) {
    void *p = jj_arena_alloc(&R->ar, n ? n : 1);
    if (!p) {
        if (R->ar.over)
            jj_rt_fail(R, NULL, NX_E_FORMAT, "render exceeded its memory budget of %zu bytes", R->ar.cap);
        else
            jj_rt_fail(R, NULL, NX_E_NOMEM, "out of memory");
    }
    return p;
}

/* Charges k units against the jj_step budget (nodes, iterations, bytes scanned / 64). */
int jj_step(rt *R, const node *at, uint64_t k) {
    R->steps += k;
    if (R->steps > R->max_steps)
        return jj_rt_fail(R, at, NX_E_FORMAT, "render exceeded its step budget of %" PRIu64 " steps",
                       R->max_steps);
    return 0;
}

int jj_jb_reserve(rt *R, jbuf *b, size_t extra) {
    if (extra > SIZE_MAX / 4 - b->n) return jj_rt_fail(R, NULL, NX_E_FORMAT, "string too large");
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 32;
    while (cap < b->n + extra) cap *= 2;
    char *p = jj_ralloc(R, cap);
    if (!p) return -1;
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
    return 0;
}

int jj_jb_put(rt *R, jbuf *b, const char *s, size_t n) {
    if (!n) return 0;
    if (jj_jb_reserve(R, b, n)) return -1;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

int jj_jb_puts(rt *R, jbuf *b, const char *z) { return jj_jb_put(R, b, z, strlen(z)); }
int jj_jb_putc(rt *R, jbuf *b, char c) { return jj_jb_put(R, b, &c, 1); }
int jj_jb_cp(rt *R, jbuf *b, int32_t cp) {
    char u[4];
    return jj_jb_put(R, b, u, jj_utf8_put(cp, u));
}

jstr jj_str_dup(rt *R, const char *s, size_t n, bool *ok) {
    char *p = jj_ralloc(R, n + 1);
    *ok = p != NULL;
    if (!p) return (jstr){"", 0};
    if (n) memcpy(p, s, n);
    return (jstr){p, n};
}

/* ------------------------------------------------------------------ containers */

jlist *jj_list_new(rt *R, size_t cap) {
    jlist *l = jj_ralloc(R, sizeof *l);
    if (!l) return NULL;
    l->n = 0;
    l->cap = cap;
    l->v = NULL;
    if (cap && cap > SIZE_MAX / sizeof(jv)) return jj_rt_fail(R, NULL, NX_E_FORMAT, "list too large"), NULL;
    if (cap && !(l->v = jj_ralloc(R, cap * sizeof(jv)))) return NULL;
    return l;
}

int jj_list_push(rt *R, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        if (cap > SIZE_MAX / sizeof(jv)) return jj_rt_fail(R, NULL, NX_E_FORMAT, "list too large");
        jv *nv = jj_ralloc(R, cap * sizeof(jv));
        if (!nv) return -1;
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}


jdict *jj_dict_new(rt *R) {
    jdict *d = jj_ralloc(R, sizeof *d);
    if (d) memset(d, 0, sizeof *d);
    return d;
}

bool jj_dict_get(const jdict *d, jstr k, jv *out) {
    for (size_t i = 0; i < d->n; i++)
        if (jstr_eq(d->k[i], k)) {
            *out = d->v[i];
            return true;
        }
    return false;
}

/* Grows d's key and value arrays to cap entries (arena memory: the old ones are not freed). */
static int dict_grow(rt *R, jdict *d, size_t cap) {
    jstr *nk = jj_ralloc(R, cap * sizeof *nk);
    jv *nv = nk ? jj_ralloc(R, cap * sizeof *nv) : NULL;
    if (!nv) return -1;
    if (d->n) {
        memcpy(nk, d->k, d->n * sizeof *nk);
        memcpy(nv, d->v, d->n * sizeof *nv);
    }
    d->k = nk;
    d->v = nv;
    d->cap = cap;
    return 0;
}

int jj_dict_set(rt *R, jdict *d, jstr k, jv v) {
    for (size_t i = 0; i < d->n; i++)
        if (jstr_eq(d->k[i], k)) {
            d->v[i] = v;
            return 0;
        }
    if (d->n == d->cap && dict_grow(R, d, d->cap ? d->cap * 2 : 8)) return -1;
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return 0;
}

frame *jj_frame_new(rt *R, frame *parent) {
    frame *f = jj_ralloc(R, sizeof *f);
    if (f) {
        memset(f, 0, sizeof *f);
        f->parent = parent;
    }
    return f;
}

int jj_frame_set(rt *R, frame *F, jstr k, jv v) { return jj_dict_set(R, &F->vars, k, v); }

bool jj_frame_get(const frame *F, jstr k, jv *out) {
    for (; F; F = F->parent)
        if (jj_dict_get(&F->vars, k, out)) return true;
    return false;
}

/* ------------------------------------------------------------------ JSON context -> values */

int jj_from_json(rt *R, const json_t *j, jv *out, int depth) {
    if (depth > MAX_VALUE_DEPTH) return jj_rt_fail(R, NULL, NX_E_FORMAT, "context nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jdict *d = jj_dict_new(R);
        if (!d) return -1;
        const char *key;
        json_t *val;
        void *it;
        for (it = json_object_iter((json_t *)j); it; it = json_object_iter_next((json_t *)j, it)) {
            key = json_object_iter_key(it);
            val = json_object_iter_value(it);
            jv v;
            if (jj_from_json(R, val, &v, depth + 1)) return -1;
            /* JSON keys are unique, so append without the linear duplicate scan of jj_dict_set. */
            if (d->n == d->cap && dict_grow(R, d, d->cap ? d->cap * 2 : json_object_size(j))) return -1;
            d->k[d->n] = (jstr){key, json_object_iter_key_len(it)};
            d->v[d->n++] = v;
        }
        *out = (jv){.t = JT_DICT, .u.d = d};
        return 0;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jlist *l = jj_list_new(R, n);
        if (!l) return -1;
        for (size_t i = 0; i < n; i++)
            if (jj_from_json(R, json_array_get(j, i), &l->v[i], depth + 1)) return -1;
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
    return jj_rt_fail(R, NULL, NX_E_ARG, "unknown JSON value type");
}

/* ------------------------------------------------------------------ printing */

const char *jj_tname(jv v) {
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
    return jj_jb_puts(R, b, t);
}

static int put_float(rt *R, jbuf *b, double f) {
    char t[48];
    fmt_float(f, t, sizeof t);
    return jj_jb_puts(R, b, t);
}

static int repr_str(rt *R, jbuf *b, jstr s) {
    bool sq = memchr(s.p, '\'', s.n) != NULL, dq = memchr(s.p, '"', s.n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    if (jj_jb_putc(R, b, q)) return -1;
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
        if (rep ? jj_jb_puts(R, b, rep) : jj_jb_putc(R, b, (char)c)) return -1;
    }
    return jj_jb_putc(R, b, q);
}


/* Python's str(): what {{ value }} prints. */
int jj_to_str(rt *R, jv v, jbuf *b, int depth) {
    if (depth > MAX_VALUE_DEPTH) return jj_rt_fail(R, NULL, NX_E_FORMAT, "value nested too deeply to print");
    switch ((jt)v.t) {
    case JT_UNDEF: return 0;
    case JT_NONE: return jj_jb_puts(R, b, "None");
    case JT_BOOL: return jj_jb_puts(R, b, v.u.b ? "True" : "False");
    case JT_INT: return put_int(R, b, v.u.i);
    case JT_FLOAT: return put_float(R, b, v.u.f);
    case JT_STR: return jj_jb_put(R, b, v.u.s.p, v.u.s.n);
    case JT_LIST: {
        if (jj_jb_putc(R, b, v.tuple ? '(' : '[')) return -1;
        for (size_t i = 0; i < v.u.l->n; i++)
            if ((i && jj_jb_puts(R, b, ", ")) || jj_to_repr(R, v.u.l->v[i], b, depth + 1)) return -1;
        if (v.tuple && v.u.l->n == 1 && jj_jb_putc(R, b, ',')) return -1;
        return jj_jb_putc(R, b, v.tuple ? ')' : ']');
    }
    case JT_DICT:
    case JT_NS: {
        if (v.t == JT_NS && jj_jb_puts(R, b, "<Namespace ")) return -1;
        if (jj_jb_putc(R, b, '{')) return -1;
        for (size_t i = 0; i < v.u.d->n; i++)
            if ((i && jj_jb_puts(R, b, ", ")) || repr_str(R, b, v.u.d->k[i]) || jj_jb_puts(R, b, ": ") ||
                jj_to_repr(R, v.u.d->v[i], b, depth + 1))
                return -1;
        if (jj_jb_putc(R, b, '}')) return -1;
        return v.t == JT_NS ? jj_jb_putc(R, b, '>') : 0;
    }
    case JT_MACRO: return jj_jb_puts(R, b, "<Macro>");
    case JT_METHOD:
    case JT_FUNC: return jj_jb_puts(R, b, "<built-in function>");
    case JT_LOOP: return jj_jb_puts(R, b, "<LoopContext>");
    }
    return 0;
}

int jj_to_repr(rt *R, jv v, jbuf *b, int depth) {
    if (v.t == JT_STR) return repr_str(R, b, v.u.s);
    return jj_to_str(R, v, b, depth);
}

/* The string form of v without copying when v already is a string. */
int jj_as_str(rt *R, jv v, jstr *out) {
    if (v.t == JT_STR) {
        *out = v.u.s;
        return 0;
    }
    jbuf b = {0};
    if (jj_to_str(R, v, &b, 0)) return -1;
    *out = jb_str(&b);
    return 0;
}

/* ------------------------------------------------------------------ JSON output (jj_tojson) */

static int json_str(rt *R, jbuf *b, jstr s, bool ascii) {
    if (jj_jb_reserve(R, b, s.n + 2) || jj_jb_putc(R, b, '"')) return -1;
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
            int32_t cp = jj_utf8_next(s.p + i, s.n - i, &adv);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(e, sizeof e, "\\u%04x", (unsigned)cp);
            }
            if (jj_jb_puts(R, b, e)) return -1;
            i += adv;
            continue;
        } else {
            size_t j = i + 1;
            while (j < s.n) {
                unsigned char d = (unsigned char)s.p[j];
                if (d == '"' || d == '\\' || d < 0x20 || (ascii && d >= 0x7F)) break;
                j++;
            }
            if (jj_jb_put(R, b, s.p + i, j - i)) return -1;
            i = j;
            continue;
        }
        if (jj_jb_puts(R, b, e)) return -1;
        i++;
    }
    return jj_jb_putc(R, b, '"');
}

static int json_nl(rt *R, jbuf *b, const jopts *o, int level) {
    if (o->indent < 0) return 0;
    if (jj_jb_putc(R, b, '\n')) return -1;
    for (int64_t i = 0; i < o->indent * level; i++)
        if (jj_jb_putc(R, b, ' ')) return -1;
    return 0;
}

static int jstr_cmp(jstr a, jstr b) {
    size_t m = a.n < b.n ? a.n : b.n;
    int c = m ? memcmp(a.p, b.p, m) : 0;
    return c ? c : (a.n < b.n ? -1 : a.n > b.n);
}

int jj_tojson(rt *R, const node *at, jv v, jbuf *b, const jopts *o, int level) {
    if (level > MAX_VALUE_DEPTH) return jj_rt_fail(R, at, NX_E_FORMAT, "value nested too deeply for tojson");
    switch ((jt)v.t) {
    case JT_UNDEF:
    case JT_NONE: return jj_jb_puts(R, b, "null");
    case JT_BOOL: return jj_jb_puts(R, b, v.u.b ? "true" : "false");
    case JT_INT: return put_int(R, b, v.u.i);
    case JT_FLOAT:
        if (isnan(v.u.f)) return jj_jb_puts(R, b, "NaN");
        if (isinf(v.u.f)) return jj_jb_puts(R, b, v.u.f > 0 ? "Infinity" : "-Infinity");
        return put_float(R, b, v.u.f);
    case JT_STR: return json_str(R, b, v.u.s, o->ascii);
    case JT_LIST: {
        const jlist *l = v.u.l;
        if (!l->n) return jj_jb_puts(R, b, "[]");
        if (jj_jb_putc(R, b, '[')) return -1;
        for (size_t i = 0; i < l->n; i++) {
            if (i && jj_jb_put(R, b, o->item_sep.p, o->item_sep.n)) return -1;
            if (json_nl(R, b, o, level + 1) || jj_tojson(R, at, l->v[i], b, o, level + 1)) return -1;
        }
        if (json_nl(R, b, o, level)) return -1;
        return jj_jb_putc(R, b, ']');
    }
    case JT_DICT:
    case JT_NS: {
        const jdict *d = v.u.d;
        if (!d->n) return jj_jb_puts(R, b, "{}");
        size_t *ord = jj_ralloc(R, d->n * sizeof *ord);
        if (!ord) return -1;
        for (size_t i = 0; i < d->n; i++) ord[i] = i;
        if (o->sort) /* insertion sort keeps equal keys stable; dicts here are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && jstr_cmp(d->k[ord[j - 1]], d->k[ord[j]]) > 0; j--) {
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        if (jj_jb_putc(R, b, '{')) return -1;
        for (size_t i = 0; i < d->n; i++) {
            if (i && jj_jb_put(R, b, o->item_sep.p, o->item_sep.n)) return -1;
            if (json_nl(R, b, o, level + 1) || json_str(R, b, d->k[ord[i]], o->ascii) ||
                jj_jb_put(R, b, o->key_sep.p, o->key_sep.n) || jj_tojson(R, at, d->v[ord[i]], b, o, level + 1))
                return -1;
        }
        if (json_nl(R, b, o, level)) return -1;
        return jj_jb_putc(R, b, '}');
    }
    default: return jj_rt_fail(R, at, NX_E_FORMAT, "object of type '%s' is not JSON serializable", jj_tname(v));
    }
}

/* ------------------------------------------------------------------ truth, equality, order */

bool jj_truthy(jv v) {
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


bool jj_jv_equal(jv a, jv b, int depth) {
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
            if (!jj_jv_equal(a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    case JT_DICT:
    case JT_NS:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv o;
            if (!jj_dict_get(b.u.d, a.u.d->k[i], &o) || !jj_jv_equal(a.u.d->v[i], o, depth + 1)) return false;
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
int jj_jv_order(rt *R, const node *at, jv a, jv b, int *res, int depth) {
    if (depth > MAX_VALUE_DEPTH) return jj_rt_fail(R, at, NX_E_FORMAT, "value nested too deeply to compare");
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
            if (jj_jv_equal(a.u.l->v[i], b.u.l->v[i], depth + 1)) continue;
            return jj_jv_order(R, at, a.u.l->v[i], b.u.l->v[i], res, depth + 1);
        }
        *res = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return 0;
    }
    if (a.t == JT_UNDEF || b.t == JT_UNDEF) {
        jstr h = a.t == JT_UNDEF ? a.u.s : b.u.s;
        return jj_rt_fail(R, at, NX_E_FORMAT, "'%.*s' is undefined", (int)h.n, h.p);
    }
    return jj_rt_fail(R, at, NX_E_FORMAT, "'<' not supported between instances of '%s' and '%s'", jj_tname(a),
                   jj_tname(b));
}

int jj_undefined_error(rt *R, const node *at, jv v) {
    jstr h = v.u.s;
    if (!h.n) return jj_rt_fail(R, at, NX_E_FORMAT, "use of an undefined value");
    return jj_rt_fail(R, at, NX_E_FORMAT, "'%.*s' is undefined", (int)(h.n > 80 ? 80 : h.n), h.p);
}
