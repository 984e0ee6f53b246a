/* JSON Schema `pattern`: parser (ECMA-262 subset, see pattern.h) -> Thompson NFA over UTF-8 bytes
 * -> subset construction, with the string's code-point count as part of each state -> trimmed
 * DFA on byte classes. */
#include "constrain/pattern.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/unicode.h"

#define CP_MAX 0x10FFFFu
#define NFA_MAX 20000 /* NFA states; past this the pattern is refused as too large */
#define REP_MAX 1000  /* the largest count a {n,m} may give */
#define NEST_MAX 64   /* groups and classes nested */
/* Steps (NFA states visited, set words hashed) the subset construction may take: a hostile
 * pattern is refused in well under a second rather than holding up a request. */
#define WORK_MAX 200000000ll

/* ---------------------------------------------------------------- code point sets */

typedef struct cprange {
    uint32_t lo, hi;
} cprange;

typedef struct cpset {
    cprange *r;
    int n, cap;
} cpset;

static bool set_add(cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        const int c = s->cap ? 2 * s->cap : 8;
        cprange *r = realloc(s->r, (size_t)c * sizeof *r);
        if (!r) return false;
        s->r = r, s->cap = c;
    }
    s->r[s->n++] = (cprange){lo, hi};
    return true;
}

static int range_cmp(const void *a, const void *b) {
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorted, merged, surrogates (never characters) removed. */
static bool set_normalize(cpset *s) {
    if (s->n == 0) return true;
    qsort(s->r, (size_t)s->n, sizeof *s->r, range_cmp);
    int w = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[w].hi + 1) {
            if (s->r[i].hi > s->r[w].hi) s->r[w].hi = s->r[i].hi;
        } else {
            s->r[++w] = s->r[i];
        }
    }
    s->n = w + 1;
    cpset o = {0};
    for (int i = 0; i < s->n; i++) {
        const cprange r = s->r[i];
        bool ok = true;
        if (r.hi < 0xD800 || r.lo > 0xDFFF) ok = set_add(&o, r.lo, r.hi);
        else {
            if (r.lo < 0xD800) ok = set_add(&o, r.lo, 0xD7FF);
            if (ok && r.hi > 0xDFFF) ok = set_add(&o, 0xE000, r.hi);
        }
        if (!ok) {
            free(o.r);
            return false;
        }
    }
    free(s->r);
    *s = o;
    return true;
}

/* The complement of a normalized set within [0, CP_MAX]. */
static bool set_negate(cpset *s) {
    cpset o = {0};
    uint32_t next = 0;
    bool ok = true;
    for (int i = 0; i < s->n && ok; i++) {
        if (s->r[i].lo > next) ok = set_add(&o, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (ok && next <= CP_MAX) ok = set_add(&o, next, CP_MAX);
    free(s->r);
    *s = o;
    return ok && set_normalize(s);
}

static bool set_add_list(cpset *s, const uint32_t *pairs, int n) {
    for (int i = 0; i < n; i++)
        if (!set_add(s, pairs[2 * i], pairs[2 * i + 1])) return false;
    return true;
}

static const uint32_t DIGIT[] = {'0', '9'};
static const uint32_t WORD[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'};
/* ECMA-262 WhiteSpace and LineTerminator */
static const uint32_t SPACE[] = {0x09, 0x0D, 0x20, 0x20, 0xA0, 0xA0, 0x1680, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029,
                                 0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};
static const uint32_t NOT_DOT[] = {0x0A, 0x0A, 0x0D, 0x0D, 0x2028, 0x2029};

/* ---------------------------------------------------------------- syntax tree */

enum { RX_SET, RX_CAT, RX_ALT, RX_REP };

typedef struct rx {
    int kind;
    cpset set;
    struct rx **kid;
    int n_kid, cap_kid;
    int min, max; /* RX_REP; max < 0: no limit */
} rx;

static void rx_free(rx *x) {
    if (!x) return;
    for (int i = 0; i < x->n_kid; i++) rx_free(x->kid[i]);
    free(x->kid);
    free(x->set.r);
    free(x);
}

static rx *rx_new(int kind) {
    rx *x = calloc(1, sizeof *x);
    if (x) x->kind = kind;
    return x;
}

static bool rx_push(rx *x, rx *k) {
    if (x->n_kid == x->cap_kid) {
        const int c = x->cap_kid ? 2 * x->cap_kid : 4;
        rx **p = realloc(x->kid, (size_t)c * sizeof *p);
        if (!p) return false;
        x->kid = p, x->cap_kid = c;
    }
    x->kid[x->n_kid++] = k;
    return true;
}

typedef struct parser {
    const char *p, *end;
    char *err;
    size_t errcap;
    bool failed;
    int depth;
} parser;

static rx *fail(parser *P, const char *fmt, ...) {
    if (!P->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(P->err, P->errcap, fmt, ap);
        va_end(ap);
    }
    P->failed = true;
    return NULL;
}

/* One character of the pattern (checked well-formed before parsing). */
static uint32_t next_cp(parser *P) {
    uint32_t c = 0;
    const size_t n = nx_utf8_next(P->p, (size_t)(P->end - P->p), &c);
    P->p += n ? n : 1;
    return c;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool hex_digits(parser *P, int n, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < n; i++) {
        const int h = P->p < P->end ? hexval(*P->p) : -1;
        if (h < 0) return false;
        *v = *v << 4 | (uint32_t)h;
        P->p++;
    }
    return true;
}

/* After a backslash: the escape's characters into set. in_class: inside [...] (where \b is a
 * backspace and \- a hyphen). Returns 1 for a single character (*cp set, also added to set),
 * 2 for a class escape (\d ...), 0 on error. */
static int escape(parser *P, cpset *set, bool in_class, uint32_t *cp) {
    if (P->p >= P->end) return fail(P, "pattern ends with a backslash"), 0;
    const char c = *P->p++;
    uint32_t v = 0;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': {
        cpset t = {0};
        const bool ok = c == 'd' || c == 'D' ? set_add_list(&t, DIGIT, 1)
                        : c == 'w' || c == 'W' ? set_add_list(&t, WORD, 4)
                                               : set_add_list(&t, SPACE, 10);
        if (!ok || !set_normalize(&t) || ((c == 'D' || c == 'W' || c == 'S') && !set_negate(&t))) {
            free(t.r);
            return fail(P, "out of memory"), 0;
        }
        bool ok2 = true;
        for (int i = 0; i < t.n && ok2; i++) ok2 = set_add(set, t.r[i].lo, t.r[i].hi);
        free(t.r);
        return ok2 ? 2 : (fail(P, "out of memory"), 0);
    }
    case 't': v = '\t'; break;
    case 'n': v = '\n'; break;
    case 'v': v = '\v'; break;
    case 'f': v = '\f'; break;
    case 'r': v = '\r'; break;
    case '0':
        if (P->p < P->end && *P->p >= '0' && *P->p <= '9') return fail(P, "octal escapes are not supported"), 0;
        v = 0;
        break;
    case 'x':
        if (!hex_digits(P, 2, &v)) return fail(P, "\\x needs two hex digits"), 0;
        break;
    case 'u':
        if (P->p < P->end && *P->p == '{') {
            P->p++;
            int n = 0;
            while (P->p < P->end && hexval(*P->p) >= 0 && n < 8) v = v << 4 | (uint32_t)hexval(*P->p++), n++;
            if (n == 0 || P->p >= P->end || *P->p != '}' || v > CP_MAX) return fail(P, "bad \\u{...} escape"), 0;
            P->p++;
        } else if (!hex_digits(P, 4, &v)) {
            return fail(P, "\\u needs four hex digits"), 0;
        }
        if (v >= 0xD800 && v <= 0xDFFF) return fail(P, "surrogate escapes are not supported"), 0;
        break;
    case 'b':
        if (!in_class) return fail(P, "word boundaries (\\b) are not supported"), 0;
        v = 0x08;
        break;
    case 'B': return fail(P, "word boundaries (\\B) are not supported"), 0;
    case 'p': case 'P': return fail(P, "Unicode property escapes (\\p) are not supported"), 0;
    case 'k': return fail(P, "named backreferences are not supported"), 0;
    case 'c': return fail(P, "control escapes (\\c) are not supported"), 0;
    default:
        if (c >= '1' && c <= '9') return fail(P, "backreferences are not supported"), 0;
        if (strchr("^$\\.*+?()[]{}|/", c) || (in_class && c == '-')) {
            v = (uint8_t)c;
            break;
        }
        return fail(P, "unknown escape \\%c", c), 0;
    }
    *cp = v;
    return set_add(set, v, v) ? 1 : (fail(P, "out of memory"), 0);
}

static rx *parse_class(parser *P) {
    rx *x = rx_new(RX_SET);
    if (!x) return fail(P, "out of memory");
    bool neg = false;
    if (P->p < P->end && *P->p == '^') neg = true, P->p++;
    for (;;) {
        if (P->p >= P->end) {
            rx_free(x);
            return fail(P, "unterminated character class");
        }
        if (*P->p == ']') {
            P->p++;
            break;
        }
        uint32_t lo;
        int k;
        if (*P->p == '\\') {
            P->p++;
            k = escape(P, &x->set, true, &lo);
        } else {
            lo = next_cp(P);
            k = set_add(&x->set, lo, lo) ? 1 : 0;
        }
        if (k == 0) {
            rx_free(x);
            return fail(P, "out of memory");
        }
        if (P->p + 1 < P->end && *P->p == '-' && P->p[1] != ']') { /* a range */
            P->p++;
            uint32_t hi;
            cpset t = {0};
            int k2;
            if (*P->p == '\\') {
                P->p++;
                k2 = escape(P, &t, true, &hi);
            } else {
                hi = next_cp(P);
                k2 = 1;
            }
            free(t.r);
            if (k2 == 0) {
                rx_free(x);
                return NULL;
            }
            if (k != 1 || k2 != 1) {
                rx_free(x);
                return fail(P, "a class escape cannot bound a range");
            }
            if (hi < lo) {
                rx_free(x);
                return fail(P, "range out of order in character class");
            }
            x->set.r[x->set.n - 1].hi = hi;
        }
    }
    if (!set_normalize(&x->set) || (neg && !set_negate(&x->set))) {
        rx_free(x);
        return fail(P, "out of memory");
    }
    return x;
}

static rx *parse_alt(parser *P, bool top);

/* {n}, {n,}, {n,m} after an atom, into min and max. Returns false (with a message) when malformed. */
static bool parse_braces(parser *P, int *min, int *max) {
    P->p++;
    long n = 0, m;
    int digits = 0;
    while (P->p < P->end && *P->p >= '0' && *P->p <= '9' && n <= REP_MAX) n = n * 10 + (*P->p++ - '0'), digits++;
    if (!digits) return fail(P, "lone '{' (escape it as \\{)"), false;
    m = n;
    if (P->p < P->end && *P->p == ',') {
        P->p++;
        m = -1;
        if (P->p < P->end && *P->p >= '0' && *P->p <= '9') {
            m = 0;
            while (P->p < P->end && *P->p >= '0' && *P->p <= '9' && m <= REP_MAX) m = m * 10 + (*P->p++ - '0');
        }
    }
    if (P->p >= P->end || *P->p != '}') return fail(P, "malformed {n,m} quantifier"), false;
    P->p++;
    if (n > REP_MAX || m > REP_MAX) return fail(P, "a {n,m} count above %d", REP_MAX), false;
    if (m >= 0 && m < n) return fail(P, "numbers out of order in {n,m} quantifier"), false;
    *min = (int)n, *max = (int)m;
    return true;
}

/* A sequence of quantified atoms, up to '|', ')' or the end. At the top level a leading '^' and
 * a trailing '$' anchor the alternative; otherwise it may match anywhere in the string. */
static rx *parse_cat(parser *P, bool top) {
    rx *cat = rx_new(RX_CAT);
    if (!cat) return fail(P, "out of memory");
    bool anchored_start = false, anchored_end = false;
    if (top && P->p < P->end && *P->p == '^') anchored_start = true, P->p++;
    while (P->p < P->end && *P->p != '|' && *P->p != ')') {
        const char c = *P->p;
        rx *atom = NULL;
        if (c == '$') {
            P->p++;
            if (!top || (P->p < P->end && *P->p != '|')) {
                rx_free(cat);
                return fail(P, "'$' is supported only at the end of the pattern or of a top-level alternative");
            }
            anchored_end = true;
            break;
        }
        if (c == '^') {
            rx_free(cat);
            return fail(P, "'^' is supported only at the start of the pattern or of a top-level alternative");
        }
        if (c == '*' || c == '+' || c == '?' || c == '{' || c == '}' || c == ']') {
            rx_free(cat);
            return c == '{' || c == '*' || c == '+' || c == '?' ? fail(P, "quantifier '%c' with nothing to repeat", c)
                                                                 : fail(P, "lone '%c' (escape it)", c);
        }
        if (c == '(') {
            P->p++;
            if (P->p < P->end && *P->p == '?') {
                if (P->p + 1 < P->end && P->p[1] == ':') {
                    P->p += 2;
                } else {
                    rx_free(cat);
                    return fail(P, "lookarounds and named groups are not supported");
                }
            }
            if (++P->depth > NEST_MAX) {
                rx_free(cat);
                return fail(P, "groups nested deeper than %d", NEST_MAX);
            }
            atom = parse_alt(P, false);
            P->depth--;
            if (!atom) {
                rx_free(cat);
                return NULL;
            }
            if (P->p >= P->end || *P->p != ')') {
                rx_free(atom);
                rx_free(cat);
                return fail(P, "missing ')'");
            }
            P->p++;
        } else if (c == '[') {
            P->p++;
            atom = parse_class(P);
        } else {
            atom = rx_new(RX_SET);
            if (!atom) {
                rx_free(cat);
                return fail(P, "out of memory");
            }
            bool ok;
            if (c == '.') {
                P->p++;
                ok = set_add_list(&atom->set, NOT_DOT, 3) && set_normalize(&atom->set) && set_negate(&atom->set);
                if (!ok) fail(P, "out of memory");
            } else if (c == '\\') {
                P->p++;
                uint32_t cp;
                ok = escape(P, &atom->set, false, &cp) != 0 && set_normalize(&atom->set);
            } else {
                const uint32_t cp = next_cp(P);
                ok = set_add(&atom->set, cp, cp);
                if (!ok) fail(P, "out of memory");
            }
            if (!ok) {
                rx_free(atom);
                rx_free(cat);
                return NULL;
            }
        }
        if (!atom) {
            rx_free(cat);
            return NULL;
        }
        /* quantifier */
        if (P->p < P->end && (*P->p == '*' || *P->p == '+' || *P->p == '?' || *P->p == '{')) {
            int min = 0, max = -1;
            const char q = *P->p;
            if (q == '{') {
                if (!parse_braces(P, &min, &max)) {
                    rx_free(atom);
                    rx_free(cat);
                    return NULL;
                }
            } else {
                P->p++;
                min = q == '+', max = q == '?' ? 1 : -1;
            }
            if (P->p < P->end && *P->p == '?') P->p++; /* lazy: the same strings */
            if (P->p < P->end && (*P->p == '*' || *P->p == '+' || *P->p == '?' || *P->p == '{')) {
                rx_free(atom);
                rx_free(cat);
                return fail(P, "quantifier '%c' with nothing to repeat", *P->p);
            }
            rx *rep = rx_new(RX_REP);
            if (!rep || !rx_push(rep, atom)) {
                rx_free(rep);
                rx_free(atom);
                rx_free(cat);
                return fail(P, "out of memory");
            }
            rep->min = min, rep->max = max;
            atom = rep;
        }
        if (!rx_push(cat, atom)) {
            rx_free(atom);
            rx_free(cat);
            return fail(P, "out of memory");
        }
    }
    if (!top) return cat;
    /* unanchored ends: any characters before / after */
    for (int side = 0; side < 2; side++) {
        if (side == 0 ? anchored_start : anchored_end) continue;
        rx *any = rx_new(RX_SET), *rep = rx_new(RX_REP);
        if (!any || !rep || !set_add(&any->set, 0, CP_MAX) || !set_normalize(&any->set) || !rx_push(rep, any) ||
            !rx_push(cat, NULL)) {
            if (!rep || rep->n_kid == 0) rx_free(any);
            rx_free(rep);
            rx_free(cat);
            return fail(P, "out of memory");
        }
        rep->min = 0, rep->max = -1;
        if (side == 0) {
            memmove(cat->kid + 1, cat->kid, (size_t)(cat->n_kid - 1) * sizeof *cat->kid);
            cat->kid[0] = rep;
        } else {
            cat->kid[cat->n_kid - 1] = rep;
        }
    }
    return cat;
}

static rx *parse_alt(parser *P, bool top) {
    rx *alt = rx_new(RX_ALT);
    if (!alt) return fail(P, "out of memory");
    for (;;) {
        rx *c = parse_cat(P, top);
        if (!c) {
            rx_free(alt);
            return NULL;
        }
        if (!rx_push(alt, c)) {
            rx_free(c);
            rx_free(alt);
            return fail(P, "out of memory");
        }
        if (P->p < P->end && *P->p == '|') {
            P->p++;
            continue;
        }
        return alt;
    }
}

/* ---------------------------------------------------------------- NFA */

enum { N_EPS, N_BYTE };

typedef struct nstate {
    uint8_t kind, lo, hi;
    int32_t out, out2; /* -1: none */
} nstate;

typedef struct nfa {
    nstate *s;
    int32_t n, cap;
    bool full;
} nfa;

static int32_t nfa_add(nfa *N, uint8_t kind, uint8_t lo, uint8_t hi) {
    if (N->n >= NFA_MAX) {
        N->full = true;
        return -1;
    }
    if (N->n == N->cap) {
        const int32_t c = N->cap ? 2 * N->cap : 256;
        nstate *s = realloc(N->s, (size_t)c * sizeof *s);
        if (!s) {
            N->full = true;
            return -1;
        }
        N->s = s, N->cap = c;
    }
    N->s[N->n] = (nstate){kind, lo, hi, -1, -1};
    return N->n++;
}

/* A fragment: entered at start, left through end (an N_EPS state whose out is still free). */
typedef struct frag {
    int32_t start, end;
} frag;

/* The byte sequences of code points [lo, hi] as paths from `from` to `to` (split so that each
 * path is one byte range per position, as RE2 and Rust's regex do). */
static void emit_range(nfa *N, uint32_t lo, uint32_t hi, int32_t from, int32_t to) {
    static const uint32_t bound[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bound[i] && hi > bound[i]) {
            emit_range(N, lo, bound[i], from, to);
            emit_range(N, bound[i] + 1, hi, from, to);
            return;
        }
    char a[4], b[4];
    const int n = (int)nx_utf8_put(lo, a); /* lo and hi now have the same length */
    nx_utf8_put(hi, b);
    for (int i = 1; i < n; i++) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                emit_range(N, lo, lo | m, from, to);
                emit_range(N, (lo | m) + 1, hi, from, to);
                return;
            }
            if ((hi & m) != m) {
                emit_range(N, lo, (hi & ~m) - 1, from, to);
                emit_range(N, hi & ~m, hi, from, to);
                return;
            }
        }
    }
    /* from --eps/split--> b0 --> b1 ... --> to */
    const int32_t split = nfa_add(N, N_EPS, 0, 0);
    if (split < 0) return;
    N->s[split].out = N->s[from].out;
    N->s[from].out = split; /* prepend to from's chain of alternatives */
    int32_t prev = split;
    for (int k = 0; k < n; k++) {
        const int32_t st = nfa_add(N, N_BYTE, (uint8_t)a[k], (uint8_t)b[k]);
        if (st < 0) return;
        if (k == 0) N->s[prev].out2 = st;
        else N->s[prev].out = st;
        prev = st;
    }
    N->s[prev].out = to;
}

static frag build(nfa *N, const rx *x);

static frag frag_empty(nfa *N) {
    const int32_t s = nfa_add(N, N_EPS, 0, 0);
    return (frag){s, s};
}

static frag build_cat(nfa *N, rx *const *kid, int n) {
    frag f = frag_empty(N);
    for (int i = 0; i < n && !N->full; i++) {
        const frag k = build(N, kid[i]);
        if (N->full) break;
        N->s[f.end].out = k.start;
        f.end = k.end;
    }
    return f;
}

static frag build(nfa *N, const rx *x) {
    frag f = {-1, -1};
    if (N->full) return f;
    switch (x->kind) {
    case RX_SET: {
        /* start's chain of splits (out) each lead (out2) to one byte path; start.out ends at -1 */
        f.start = nfa_add(N, N_EPS, 0, 0);
        f.end = nfa_add(N, N_EPS, 0, 0);
        if (N->full) return f;
        for (int i = x->set.n - 1; i >= 0 && !N->full; i--) emit_range(N, x->set.r[i].lo, x->set.r[i].hi, f.start, f.end);
        return f;
    }
    case RX_CAT: return build_cat(N, x->kid, x->n_kid);
    case RX_ALT: { /* a chain of splits: split i enters alternative i (out) or goes on (out2) */
        f.end = nfa_add(N, N_EPS, 0, 0);
        int32_t prev = -1;
        for (int i = 0; i < x->n_kid && !N->full; i++) {
            const frag k = build(N, x->kid[i]);
            if (N->full) break;
            N->s[k.end].out = f.end;
            int32_t entry = k.start;
            if (i < x->n_kid - 1) {
                entry = nfa_add(N, N_EPS, 0, 0);
                if (entry < 0) break;
                N->s[entry].out = k.start;
            }
            if (prev < 0) f.start = entry;
            else N->s[prev].out2 = entry;
            prev = entry;
        }
        return f;
    }
    default: { /* RX_REP */
        f = frag_empty(N);
        for (int i = 0; i < x->min && !N->full; i++) {
            const frag k = build(N, x->kid[0]);
            if (N->full) return f;
            N->s[f.end].out = k.start;
            f.end = k.end;
        }
        if (x->max < 0) { /* end: loop (out) or leave (out2 -> new end) */
            const frag k = build(N, x->kid[0]);
            const int32_t e = nfa_add(N, N_EPS, 0, 0);
            if (N->full) return f;
            N->s[f.end].out = k.start;
            N->s[f.end].out2 = e;
            N->s[k.end].out = f.end;
            f.end = e;
            return f;
        }
        const int32_t e = nfa_add(N, N_EPS, 0, 0);
        for (int i = x->min; i < x->max && !N->full; i++) { /* each optional copy may be skipped to e */
            const frag k = build(N, x->kid[0]);
            if (N->full) return f;
            N->s[f.end].out = k.start;
            N->s[f.end].out2 = e;
            f.end = k.end;
        }
        if (N->full) return f;
        N->s[f.end].out = e;
        f.end = e;
        return f;
    }
    }
}

/* ---------------------------------------------------------------- DFA */

typedef struct dfa_build {
    const nfa *N;
    int32_t words;     /* 64-bit words per state set */
    uint64_t *sets;    /* [cap][words] */
    int32_t *count;    /* [cap]: code points so far (capped) */
    int32_t n, cap;
    int32_t *hash;     /* open addressing: DFA state + 1, 0 empty */
    int32_t hcap;
    int32_t *stack;
} dfa_build;

static void closure(dfa_build *B, uint64_t *set) {
    int32_t top = 0;
    for (int32_t w = 0; w < B->words; w++)
        for (uint64_t m = set[w]; m; m &= m - 1) B->stack[top++] = w * 64 + __builtin_ctzll(m);
    while (top) {
        const nstate *s = &B->N->s[B->stack[--top]];
        if (s->kind != N_EPS) continue;
        const int32_t o[2] = {s->out, s->out2};
        for (int k = 0; k < 2; k++)
            if (o[k] >= 0 && !(set[o[k] / 64] >> (o[k] % 64) & 1)) {
                set[o[k] / 64] |= 1ull << (o[k] % 64);
                B->stack[top++] = o[k];
            }
    }
}

static uint64_t set_hash(const uint64_t *set, int32_t words, int32_t count) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)count;
    for (int32_t w = 0; w < words; w++) h = (h ^ set[w]) * 1099511628211ull;
    return h;
}

/* The DFA state of (set, count), added if new; -1 when the automaton is full or memory runs out. */
static int32_t dfa_state(dfa_build *B, const uint64_t *set, int32_t count) {
    int32_t h = (int32_t)(set_hash(set, B->words, count) & (uint64_t)(B->hcap - 1));
    while (B->hash[h]) {
        const int32_t d = B->hash[h] - 1;
        if (B->count[d] == count && memcmp(B->sets + (size_t)d * B->words, set, (size_t)B->words * 8) == 0) return d;
        h = (h + 1) & (B->hcap - 1);
    }
    if (B->n >= NX_PATTERN_MAX_STATES) return -1;
    if (B->n == B->cap) {
        const int32_t c = B->cap * 2;
        uint64_t *s = realloc(B->sets, (size_t)c * (size_t)B->words * 8);
        if (!s) return -1;
        B->sets = s;
        int32_t *n = realloc(B->count, (size_t)c * sizeof *n);
        if (!n) return -1;
        B->count = n, B->cap = c;
    }
    memcpy(B->sets + (size_t)B->n * B->words, set, (size_t)B->words * 8);
    B->count[B->n] = count;
    B->hash[h] = B->n + 1;
    return B->n++;
}

/* Bytes a JSON string value can carry without a \u escape (the automaton refuses \u inside a
 * pattern-checked string): every byte but the control characters other than \b \t \n \f \r. */
static bool feedable(int b) { return b >= 0x20 || b == 0x08 || b == 0x09 || b == 0x0A || b == 0x0C || b == 0x0D; }

static bool is_lead(int b) { return b < 0x80 || b >= 0xC0; }

nx_pattern *nx_pattern_compile(const char *re, size_t len, int32_t min_len, int32_t max_len, char *err,
                               size_t errcap) {
    if (!nx_utf8_valid(re, len, NULL)) {
        snprintf(err, errcap, "the pattern is not valid UTF-8");
        return NULL;
    }
    if (min_len < 0 || (max_len >= 0 && max_len < min_len)) {
        snprintf(err, errcap, "bad length limits %d..%d", min_len, max_len);
        return NULL;
    }
    parser P = {re, re + len, err, errcap, false, 0};
    rx *tree = parse_alt(&P, true);
    if (tree && P.p < P.end) { /* a ')' with no '(' */
        rx_free(tree);
        tree = fail(&P, "unmatched ')'");
    }
    if (!tree) return NULL;
    nfa N = {0};
    const frag f = build(&N, tree);
    rx_free(tree);
    const int32_t match = N.full ? -1 : nfa_add(&N, N_EPS, 0, 0);
    if (N.full || match < 0) {
        free(N.s);
        snprintf(err, errcap, "the pattern is too large (over %d automaton states)", NFA_MAX);
        return NULL;
    }
    N.s[f.end].out = match;

    /* byte classes: bytes no NFA range, no lead/continuation split and no feedable boundary tells apart */
    nx_pattern *p = calloc(1, sizeof *p);
    bool cut[257] = {false};
    cut[0] = cut[0x80] = cut[0xC0] = true;
    for (int b = 1; b < 256; b++) cut[b] |= feedable(b) != feedable(b - 1);
    for (int32_t i = 0; i < N.n; i++)
        if (N.s[i].kind == N_BYTE) cut[N.s[i].lo] = cut[N.s[i].hi + 1] = true;
    int rep[256];
    int32_t nc = -1;
    for (int b = 0; b < 256; b++) {
        if (cut[b]) rep[++nc] = b;
        if (p) p->cls[b] = (uint8_t)nc;
    }
    nc++;

    const int32_t cap_count = max_len >= 0 ? max_len : min_len;
    dfa_build B = {.N = &N, .words = (N.n + 63) / 64, .cap = 64, .hcap = 2 * NX_PATTERN_MAX_STATES};
    B.sets = malloc((size_t)B.cap * (size_t)B.words * 8);
    B.count = malloc((size_t)B.cap * sizeof *B.count);
    B.hash = calloc((size_t)B.hcap, sizeof *B.hash);
    B.stack = malloc((size_t)N.n * sizeof *B.stack * 2);
    uint64_t *tmp = calloc((size_t)B.words, 8);
    uint16_t *next = NULL;
    int32_t next_cap = 0;
    const char *why = NULL;
    if (!p || !B.sets || !B.count || !B.hash || !B.stack || !tmp) why = "out of memory";
    /* state 0: dead (the empty set) */
    if (!why && dfa_state(&B, tmp, -1) != 0) why = "out of memory";
    if (!why) {
        tmp[f.start / 64] |= 1ull << (f.start % 64);
        closure(&B, tmp);
        const int32_t s0 = dfa_state(&B, tmp, 0);
        if (s0 < 0) why = "out of memory";
        else p->start = (uint16_t)s0;
    }
    long long work = 0;
    for (int32_t d = 0; !why && d < B.n; d++) {
        if ((d + 1) * nc > next_cap) {
            next_cap = 2 * (d + 1) * nc;
            uint16_t *nn = realloc(next, (size_t)next_cap * sizeof *nn);
            if (!nn) {
                why = "out of memory";
                break;
            }
            next = nn;
        }
        for (int32_t c = 0; c < nc; c++) {
            int32_t t = 0;
            const int b = rep[c];
            const int32_t cnt = B.count[d];
            const bool counts = is_lead(b);
            if (d != 0 && !(counts && max_len >= 0 && cnt >= max_len)) {
                memset(tmp, 0, (size_t)B.words * 8);
                work += 2 * B.words;
                if (work > WORK_MAX) {
                    why = "the pattern is too complex (its automaton takes too long to build)";
                    break;
                }
                bool any = false;
                const uint64_t *set = B.sets + (size_t)d * B.words;
                for (int32_t w = 0; w < B.words; w++)
                    for (uint64_t m = set[w]; m; m &= m - 1) {
                        const nstate *s = &N.s[w * 64 + __builtin_ctzll(m)];
                        work++;
                        if (s->kind == N_BYTE && b >= s->lo && b <= s->hi) {
                            tmp[s->out / 64] |= 1ull << (s->out % 64);
                            any = true;
                        }
                    }
                if (any) {
                    closure(&B, tmp);
                    const int32_t nc2 = counts && cnt < cap_count ? cnt + 1 : cnt;
                    t = dfa_state(&B, tmp, nc2);
                    if (t < 0) {
                        why = "the pattern is too complex (over 4096 automaton states)";
                        break;
                    }
                }
            }
            next[(size_t)d * nc + c] = (uint16_t)t;
        }
    }
    uint8_t *accept = why ? NULL : calloc((size_t)B.n, 1);
    uint8_t *live = why ? NULL : calloc((size_t)B.n, 1);
    if (!why && (!accept || !live)) why = "out of memory";
    if (!why) {
        for (int32_t d = 1; d < B.n; d++)
            accept[d] = live[d] = (B.sets[(size_t)d * B.words + match / 64] >> (match % 64) & 1) && B.count[d] >= min_len;
        /* trim: live = can still reach an accepting state through bytes a string can carry */
        for (bool changed = true; changed;) {
            changed = false;
            for (int32_t d = 1; d < B.n; d++) {
                if (live[d]) continue;
                for (int32_t c = 0; c < nc && !live[d]; c++)
                    if (feedable(rep[c]) && live[next[(size_t)d * nc + c]]) live[d] = 1, changed = true;
            }
        }
        for (int32_t d = 0; d < B.n; d++)
            for (int32_t c = 0; c < nc; c++) {
                uint16_t *t = &next[(size_t)d * nc + c];
                if (!feedable(rep[c]) || !live[*t]) *t = 0;
            }
        if (!live[p->start]) why = "the pattern matches no string within the length limits (without \\u escapes)";
    }
    free(live);
    free(B.sets);
    free(B.count);
    free(B.hash);
    free(B.stack);
    free(tmp);
    free(N.s);
    if (why) {
        snprintf(err, errcap, "%s", why);
        free(next);
        free(accept);
        free(p);
        return NULL;
    }
    p->n_states = B.n;
    p->n_cls = nc;
    p->next = next;
    p->accept = accept;
    return p;
}

void nx_pattern_free(nx_pattern *p) {
    if (!p) return;
    free(p->next);
    free(p->accept);
    free(p);
}
