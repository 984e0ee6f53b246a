/* Jinja builtins: filters, tests, str/dict/list/loop methods and globals, with the tables
 * the parser and evaluator look them up in. */
#include "text/jinja_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <utf8proc.h>

#define BUILTIN(name)                                                                              \
    static int name(rt *R, const node *at, jv self, jv *p, const bool *has, const args *a,         \
                    int mode __attribute__((unused)), jv *out)
#define UNUSED_ARGS (void)R, (void)at, (void)self, (void)p, (void)has, (void)a

static int need_str(rt *R, const node *at, jv v, const char *what, jstr *out) {
    *out = (jstr){"", 0};
    if (v.t != JT_STR) return jj_rt_fail(R, at, NX_E_FORMAT, "%s must be a string, not '%s'", what, jj_tname(v));
    *out = v.u.s;
    return 0;
}

static int need_int(rt *R, const node *at, jv v, const char *what, int64_t *out) {
    *out = 0;
    if (v.t != JT_INT && v.t != JT_BOOL)
        return jj_rt_fail(R, at, NX_E_FORMAT, "%s must be an integer, not '%s'", what, jj_tname(v));
    *out = num_i(v);
    return 0;
}

static int len_of(rt *R, const node *at, jv v, int64_t *n) {
    *n = 0;
    switch ((jt)v.t) {
    case JT_STR: *n = (int64_t)jj_utf8_count(v.u.s.p, v.u.s.n); return 0;
    case JT_LIST: *n = (int64_t)v.u.l->n; return 0;
    case JT_DICT:
    case JT_NS: *n = (int64_t)v.u.d->n; return 0;
    case JT_UNDEF: *n = 0; return 0;
    default: return jj_rt_fail(R, at, NX_E_FORMAT, "object of type '%s' has no len()", jj_tname(v));
    }
}

/* ------------------------------------------------------------------ string methods */

/* str.upper/lower/title/capitalize: one function, the case mode comes from the table row. */
BUILTIN(m_case) {
    UNUSED_ARGS;
    jstr s;
    if (jj_str_case(R, at, self.u.s, mode, &s)) return -1;
    *out = jv_str(s);
    return 0;
}

static int strip_common(rt *R, const node *at, jv self, jv *p, const bool *has, bool l, bool r, jv *out) {
    jstr chars;
    bool use = has[0] && p[0].t != JT_NONE;
    if (use && need_str(R, at, p[0], "strip() argument", &chars)) return -1;
    if (jj_step(R, at, self.u.s.n / 64)) return -1;
    *out = jv_str(jj_str_strip(self.u.s, use ? &chars : NULL, l, r));
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
    return jj_str_split(R, at, self.u.s, use ? &sep : NULL, maxsplit, right, out);
}
BUILTIN(m_split) { (void)a; return split_common(R, at, self, p, has, false, out); }
BUILTIN(m_rsplit) { (void)a; return split_common(R, at, self, p, has, true, out); }

BUILTIN(m_splitlines) {
    UNUSED_ARGS;
    jlist *l;
    if (jj_str_splitlines(R, self.u.s, has[0] && jj_truthy(p[0]), &l)) return -1;
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
    return jj_rt_fail(R, at, NX_E_FORMAT, "%s() argument must be str or a tuple of str, not '%s'",
                   suffix ? "endswith" : "startswith", jj_tname(arg));
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
    if (jj_str_replace(R, at, self.u.s, old, rep, count, &res)) return -1;
    *out = jv_str(res);
    return 0;
}

static int find_common(rt *R, const node *at, jv self, jv arg, int mode, jv *out) {
    jstr sub, s = self.u.s;
    if (need_str(R, at, arg, "substring", &sub) || jj_step(R, at, s.n / 64)) return -1;
    if (mode == 2) { /* count: non-overlapping occurrences */
        int64_t c = 0;
        if (!sub.n) c = (int64_t)jj_utf8_count(s.p, s.n) + 1;
        else
            for (const char *f = jj_find_sub(s, 0, sub); f; f = jj_find_sub(s, (size_t)(f - s.p) + sub.n, sub)) c++;
        *out = jv_int(c);
        return 0;
    }
    const char *f = mode == 0 ? jj_find_sub(s, 0, sub) : jj_rfind_sub(s, sub);
    *out = jv_int(f ? jj_cp_index(s, f) : -1);
    return 0;
}
BUILTIN(m_find) { UNUSED_ARGS; return find_common(R, at, self, p[0], 0, out); }
BUILTIN(m_rfind) { UNUSED_ARGS; return find_common(R, at, self, p[0], 1, out); }
BUILTIN(m_count) { UNUSED_ARGS; return find_common(R, at, self, p[0], 2, out); }
BUILTIN(m_index) {
    UNUSED_ARGS;
    if (find_common(R, at, self, p[0], 0, out)) return -1;
    if (out->u.i < 0) return jj_rt_fail(R, at, NX_E_FORMAT, "substring not found");
    return 0;
}

/* Python str.isX() character classes. */
enum { CLS_DIGIT, CLS_ALPHA, CLS_ALNUM, CLS_SPACE, CLS_LOWER, CLS_UPPER };

static int str_class(jstr s, int kind) {
    if (!s.n) return 0;
    bool any_cased = false;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        int32_t c = jj_utf8_next(s.p + i, s.n - i, &adv);
        utf8proc_category_t k = utf8proc_category(c);
        bool letter = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        bool digit = k == UTF8PROC_CATEGORY_ND;
        switch (kind) {
        case CLS_DIGIT: if (!digit) return 0; break;
        case CLS_ALPHA: if (!letter) return 0; break;
        case CLS_ALNUM: if (!letter && !digit && k != UTF8PROC_CATEGORY_NL && k != UTF8PROC_CATEGORY_NO) return 0; break;
        case CLS_SPACE: if (!jj_py_isspace(c)) return 0; break;
        case CLS_LOWER: if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) return 0; any_cased |= k == UTF8PROC_CATEGORY_LL; break;
        case CLS_UPPER: if (k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT) return 0; any_cased |= k == UTF8PROC_CATEGORY_LU; break;
        }
        i += adv;
    }
    return kind >= CLS_LOWER ? any_cased : 1;
}
/* str.isdigit/isalpha/... : the character class comes from the table row (see str_class). */
BUILTIN(m_isclass) { UNUSED_ARGS; *out = jv_bool(str_class(self.u.s, mode)); return 0; }

BUILTIN(m_join) {
    UNUSED_ARGS;
    jlist *items;
    if (jj_iter_items(R, at, p[0], &items)) return -1;
    jbuf b = {0};
    for (size_t i = 0; i < items->n; i++)
        if (jj_step(R, at, 1) || (i && jj_jb_put(R, &b, self.u.s.p, self.u.s.n)) || jj_to_str(R, items->v[i], &b, 0))
            return -1;
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
            else return jj_rt_fail(R, at, NX_E_FORMAT, "single '}' encountered in format string");
            if (jj_jb_putc(R, &b, '}')) return -1;
            continue;
        }
        if (c != '{') {
            if (jj_jb_putc(R, &b, c)) return -1;
            continue;
        }
        if (i + 1 < s.n && s.p[i + 1] == '{') {
            i++;
            if (jj_jb_putc(R, &b, '{')) return -1;
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
        if (j < s.n && s.p[j] == ':') return jj_rt_fail(R, at, NX_E_FORMAT, "format specs are not supported");
        if (j >= s.n || s.p[j] != '}') return jj_rt_fail(R, at, NX_E_FORMAT, "unterminated field in format string");
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
        if (!found) return jj_rt_fail(R, at, NX_E_FORMAT, "format field '%.*s' has no argument", (int)field.n, field.p);
        if (repr ? jj_to_repr(R, v, &b, 0) : jj_to_str(R, v, &b, 0)) return -1;
        i = j;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

/* ------------------------------------------------------------------ dict / list / loop methods */

BUILTIN(m_get) {
    UNUSED_ARGS;
    if (p[0].t != JT_STR || !jj_dict_get(self.u.d, p[0].u.s, out)) *out = has[1] ? p[1] : jv_none();
    return 0;
}

static int dict_items(rt *R, const jdict *d, int what, jv *out) {
    jlist *l = jj_list_new(R, d->n);
    if (!l) return -1;
    for (size_t i = 0; i < d->n; i++) {
        if (what == 0) l->v[i] = jv_str(d->k[i]);
        else if (what == 1) l->v[i] = d->v[i];
        else {
            jlist *pair = jj_list_new(R, 2);
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
    if (self.tuple) return jj_rt_fail(R, at, NX_E_FORMAT, "'tuple' object has no attribute 'append'");
    *out = jv_none();
    return jj_list_push(R, self.u.l, p[0]);
}

BUILTIN(m_list_index) {
    UNUSED_ARGS;
    for (size_t i = 0; i < self.u.l->n; i++)
        if (jj_jv_equal(self.u.l->v[i], p[0], 0)) {
            *out = jv_int((int64_t)i);
            return 0;
        }
    return jj_rt_fail(R, at, NX_E_FORMAT, "value is not in list");
}

BUILTIN(m_list_count) {
    UNUSED_ARGS;
    int64_t c = 0;
    for (size_t i = 0; i < self.u.l->n; i++) c += jj_jv_equal(self.u.l->v[i], p[0], 0);
    *out = jv_int(c);
    return 0;
}

BUILTIN(m_cycle) {
    UNUSED_ARGS;
    if (!a->npos) return jj_rt_fail(R, at, NX_E_FORMAT, "no items for cycling given");
    *out = a->pos[(size_t)self.u.lp->index0 % a->npos];
    return 0;
}

/* ------------------------------------------------------------------ globals */

BUILTIN(g_range) {
    UNUSED_ARGS;
    if (a->nkw) return jj_rt_fail(R, at, NX_E_FORMAT, "range() takes no keyword arguments");
    if (a->npos < 1 || a->npos > 3) return jj_rt_fail(R, at, NX_E_FORMAT, "range expected 1 to 3 arguments");
    int64_t v[3] = {0, 0, 1};
    for (size_t i = 0; i < a->npos; i++)
        if (need_int(R, at, a->pos[i], "range() argument", &v[a->npos == 1 ? 1 : i])) return -1;
    if (v[2] == 0) return jj_rt_fail(R, at, NX_E_FORMAT, "range() arg 3 must not be zero");
    double cnt = v[2] > 0 ? ceil(((double)v[1] - (double)v[0]) / (double)v[2])
                          : ceil(((double)v[0] - (double)v[1]) / (double)-v[2]);
    if (cnt < 0) cnt = 0;
    if (cnt > (double)R->max_steps) return jj_rt_fail(R, at, NX_E_FORMAT, "range() too large for the step budget");
    if (jj_step(R, at, (uint64_t)cnt)) return -1;
    jlist *l = jj_list_new(R, (size_t)cnt);
    if (!l) return -1;
    for (int64_t x = v[0]; v[2] > 0 ? x < v[1] : x > v[1]; x += v[2]) {
        l->v[l->n++] = jv_int(x);
        if (l->n == l->cap) break;
    }
    *out = jv_list(l, false);
    return 0;
}

static int mapping_from(rt *R, const node *at, const args *a, const char *fname, jdict *d) {
    if (a->npos > 1) return jj_rt_fail(R, at, NX_E_FORMAT, "%s() expected at most 1 positional argument", fname);
    if (a->npos == 1) {
        jv src = a->pos[0];
        if (src.t == JT_DICT || src.t == JT_NS) {
            for (size_t i = 0; i < src.u.d->n; i++)
                if (jj_dict_set(R, d, src.u.d->k[i], src.u.d->v[i])) return -1;
        } else if (src.t == JT_LIST) {
            for (size_t i = 0; i < src.u.l->n; i++) {
                jv pr = src.u.l->v[i];
                if (pr.t != JT_LIST || pr.u.l->n != 2 || pr.u.l->v[0].t != JT_STR)
                    return jj_rt_fail(R, at, NX_E_FORMAT, "%s() needs (key, value) pairs with string keys", fname);
                if (jj_dict_set(R, d, pr.u.l->v[0].u.s, pr.u.l->v[1])) return -1;
            }
        } else {
            return jj_rt_fail(R, at, NX_E_FORMAT, "'%s' object is not iterable", jj_tname(src));
        }
    }
    for (size_t k = 0; k < a->nkw; k++)
        if (jj_dict_set(R, d, a->kn[k], a->kv[k])) return -1;
    return 0;
}

BUILTIN(g_namespace) {
    UNUSED_ARGS;
    jdict *d = jj_dict_new(R);
    if (!d || mapping_from(R, at, a, "namespace", d)) return -1;
    *out = (jv){.t = JT_NS, .u.d = d};
    return 0;
}

BUILTIN(g_dict) {
    UNUSED_ARGS;
    jdict *d = jj_dict_new(R);
    if (!d || mapping_from(R, at, a, "dict", d)) return -1;
    *out = (jv){.t = JT_DICT, .u.d = d};
    return 0;
}

BUILTIN(g_raise_exception) {
    UNUSED_ARGS;
    (void)out;
    jstr msg = JSTR("raise_exception() called");
    if (a->npos && jj_as_str(R, a->pos[0], &msg)) return -1;
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
    if (fmt.n >= sizeof zfmt) return jj_rt_fail(R, at, NX_E_FORMAT, "strftime format too long");
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
    *out = jv_str(jj_str_dup(R, buf, n, &ok));
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------ filters */

BUILTIN(f_abs) {
    UNUSED_ARGS;
    if (self.t == JT_FLOAT) *out = jv_float(fabs(self.u.f));
    else if (self.t == JT_INT || self.t == JT_BOOL) {
        int64_t i = num_i(self);
        if (i == INT64_MIN) return jj_rt_fail(R, at, NX_E_FORMAT, "integer overflow");
        *out = jv_int(i < 0 ? -i : i);
    } else return jj_rt_fail(R, at, NX_E_FORMAT, "bad operand type for abs(): '%s'", jj_tname(self));
    return 0;
}

BUILTIN(f_attr) {
    UNUSED_ARGS;
    jstr name;
    if (need_str(R, at, p[0], "attribute name", &name)) return -1;
    return jj_get_attr(R, self, name, out);
}

BUILTIN(f_batch) {
    UNUSED_ARGS;
    int64_t size;
    jlist *items;
    if (need_int(R, at, p[0], "linecount", &size) || jj_iter_items(R, at, self, &items)) return -1;
    if (size <= 0) return jj_rt_fail(R, at, NX_E_FORMAT, "batch size must be positive");
    jlist *res = jj_list_new(R, 0), *cur = NULL;
    if (!res) return -1;
    for (size_t i = 0; i < items->n; i++) {
        if (!cur || (int64_t)cur->n == size) {
            if (!(cur = jj_list_new(R, 0)) || jj_list_push(R, res, jv_list(cur, false))) return -1;
        }
        if (jj_list_push(R, cur, items->v[i])) return -1;
    }
    if (cur && has[1] && p[1].t != JT_NONE)
        while ((int64_t)cur->n < size)
            if (jj_list_push(R, cur, p[1])) return -1;
    *out = jv_list(res, false);
    return 0;
}

static int str_of(rt *R, jv v, jstr *s) { return jj_as_str(R, v, s); }

/* upper/lower/capitalize filters: the value's string form, case mode from the table row. */
BUILTIN(f_case) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s) || jj_str_case(R, at, s, mode, &s)) return -1;
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
        int32_t c = jj_utf8_next(s.p + i, s.n - i, &adv);
        bool sep = jj_py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        int32_t m = sep ? c : word_start ? utf8proc_toupper(c) : utf8proc_tolower(c);
        if (jj_jb_cp(R, &b, m)) return -1;
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
    int64_t len = (int64_t)jj_utf8_count(s.p, s.n);
    if (width <= len) {
        *out = jv_str(s);
        return 0;
    }
    /* the padding is charged to the step and byte budgets before it is written */
    int64_t total = width - len, left = total / 2 + (total & width & 1);
    jbuf b = {0};
    if (jj_step(R, at, (uint64_t)total / 64) || jj_jb_reserve(R, &b, (size_t)total + s.n)) return -1;
    memset(b.p, ' ', (size_t)left);
    memcpy(b.p + left, s.p, s.n);
    memset(b.p + left + s.n, ' ', (size_t)(total - left));
    b.n = (size_t)total + s.n;
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
    bool use = self.t == JT_UNDEF || (has[1] && jj_truthy(p[1]) && !jj_truthy(self));
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
    if (c->failed || jj_jv_order(c->R, c->at, c->keys[x], c->keys[y], &o, 0)) {
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
            if (jj_get_item(R, at, item, *attr, key)) return -1;
        } else {
            jstr path;
            if (need_str(R, at, *attr, "attribute", &path) || jj_get_path(R, at, item, path, key)) return -1;
        }
    }
    if (!case_sensitive && key->t == JT_STR) {
        jstr low;
        if (jj_str_case(R, at, key->u.s, CASE_LOWER, &low)) return -1;
        *key = jv_str(low);
    }
    return 0;
}

static int sorted_list(rt *R, const node *at, const jlist *items, const jv *keys, bool reverse, jlist **out) {
    size_t n = items->n;
    size_t *idx = jj_ralloc(R, (n + 1) * sizeof *idx), *tmp = jj_ralloc(R, (n + 1) * sizeof *tmp);
    jlist *l = jj_list_new(R, n);
    if (!idx || !tmp || !l) return -1;
    for (size_t i = 0; i < n; i++) idx[i] = i;
    sortctx c = {R, at, keys, reverse, false};
    if (jj_step(R, at, n)) return -1;
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
    if (jj_iter_items(R, at, self, &items)) return -1;
    jv *keys = jj_ralloc(R, (items->n + 1) * sizeof *keys);
    if (!keys) return -1;
    for (size_t i = 0; i < items->n; i++)
        if (sort_key(R, at, items->v[i], has[2] ? &p[2] : NULL, has[1] && jj_truthy(p[1]), &keys[i])) return -1;
    if (sorted_list(R, at, items, keys, has[0] && jj_truthy(p[0]), &res)) return -1;
    *out = jv_list(res, false);
    return 0;
}

BUILTIN(f_dictsort) {
    UNUSED_ARGS;
    if (self.t != JT_DICT && self.t != JT_NS)
        return jj_rt_fail(R, at, NX_E_FORMAT, "dictsort needs a mapping, not '%s'", jj_tname(self));
    jv pairs;
    if (dict_items(R, self.u.d, 2, &pairs)) return -1;
    bool by_value = false;
    if (has[1]) {
        jstr by;
        if (need_str(R, at, p[1], "by", &by)) return -1;
        if (jstr_is(by, "value")) by_value = true;
        else if (!jstr_is(by, "key")) return jj_rt_fail(R, at, NX_E_FORMAT, "You can only sort by either \"key\" or \"value\"");
    }
    jlist *items = pairs.u.l, *res;
    jv *keys = jj_ralloc(R, (items->n + 1) * sizeof *keys);
    if (!keys) return -1;
    for (size_t i = 0; i < items->n; i++)
        if (sort_key(R, at, items->v[i].u.l->v[by_value], NULL, has[0] && jj_truthy(p[0]), &keys[i])) return -1;
    if (sorted_list(R, at, items, keys, has[2] && jj_truthy(p[2]), &res)) return -1;
    *out = jv_list(res, false);
    return 0;
}

BUILTIN(f_unique) {
    UNUSED_ARGS;
    jlist *items, *res;
    if (jj_iter_items(R, at, self, &items) || !(res = jj_list_new(R, 0))) return -1;
    jlist *seen = jj_list_new(R, 0);
    if (!seen || jj_step(R, at, items->n * items->n / 64)) return -1;
    for (size_t i = 0; i < items->n; i++) {
        jv k;
        if (sort_key(R, at, items->v[i], has[1] ? &p[1] : NULL, has[0] && jj_truthy(p[0]), &k)) return -1;
        bool dup = false;
        for (size_t j = 0; j < seen->n && !dup; j++) dup = jj_jv_equal(seen->v[j], k, 0);
        if (!dup && (jj_list_push(R, seen, k) || jj_list_push(R, res, items->v[i]))) return -1;
    }
    *out = jv_list(res, false);
    return 0;
}

static int minmax(rt *R, const node *at, jv self, jv *p, const bool *has, bool want_max, jv *out) {
    jlist *items;
    if (jj_iter_items(R, at, self, &items)) return -1;
    if (!items->n) {
        *out = jv_undef((jstr){"", 0});
        return 0;
    }
    jv best = items->v[0], bk;
    if (sort_key(R, at, best, has[1] ? &p[1] : NULL, has[0] && jj_truthy(p[0]), &bk)) return -1;
    for (size_t i = 1; i < items->n; i++) {
        jv k;
        int o;
        if (sort_key(R, at, items->v[i], has[1] ? &p[1] : NULL, has[0] && jj_truthy(p[0]), &k) ||
            jj_jv_order(R, at, k, bk, &o, 0))
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
        if (rep ? jj_jb_puts(R, &b, rep) : jj_jb_putc(R, &b, s.p[i])) return -1;
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
        size_t st = last ? jj_utf8_prev(s.p, 0, s.n) : 0, adv;
        jj_utf8_next(s.p + st, s.n - st, &adv);
        *out = jv_str((jstr){s.p + st, adv});
        return 0;
    }
    jlist *items;
    if (jj_iter_items(R, at, self, &items)) return -1;
    *out = items->n ? items->v[last ? items->n - 1 : 0] : jv_undef((jstr){"", 0});
    return 0;
}
BUILTIN(f_first) { UNUSED_ARGS; return first_last(R, at, self, false, out); }
BUILTIN(f_last) { UNUSED_ARGS; return first_last(R, at, self, true, out); }

/* Python float(str): surrounding whitespace, underscores between digits, inf/nan words. */
static bool parse_py_float(jstr s, double *out) {
    s = jj_str_strip(s, NULL, true, true);
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
    s = jj_str_strip(s, NULL, true, true);
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
        if (w > 0) { /* charged to the budgets like any other output */
            if (jj_step(R, at, (uint64_t)w / 64) || jj_jb_reserve(R, &ib, (size_t)w)) return -1;
            memset(ib.p, ' ', (size_t)w);
            ib.n = (size_t)w;
        }
        ind = jb_str(&ib);
    }
    bool first = has[1] && jj_truthy(p[1]), blank = has[2] && jj_truthy(p[2]);
    jbuf sb = {0};
    if (jj_jb_put(R, &sb, s.p, s.n) || jj_jb_putc(R, &sb, '\n')) return -1; /* as Jinja2 does before splitlines */
    jlist *lines;
    if (jj_str_splitlines(R, jb_str(&sb), false, &lines)) return -1;
    jbuf b = {0};
    if (first && jj_jb_put(R, &b, ind.p, ind.n)) return -1;
    for (size_t i = 0; i < lines->n; i++) {
        jstr ln = lines->v[i].u.s;
        if (jj_step(R, at, 1 + ind.n / 64)) return -1;
        if (i && jj_jb_putc(R, &b, '\n')) return -1;
        if (i && (blank || ln.n) && jj_jb_put(R, &b, ind.p, ind.n)) return -1;
        if (jj_jb_put(R, &b, ln.p, ln.n)) return -1;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

BUILTIN(f_items) {
    UNUSED_ARGS;
    if (self.t == JT_UNDEF) {
        jlist *l = jj_list_new(R, 0);
        if (!l) return -1;
        *out = jv_list(l, false);
        return 0;
    }
    if (self.t != JT_DICT && self.t != JT_NS)
        return jj_rt_fail(R, at, NX_E_FORMAT, "can only get item pairs from a mapping, not '%s'", jj_tname(self));
    return dict_items(R, self.u.d, 2, out);
}

BUILTIN(f_join) {
    UNUSED_ARGS;
    jlist *items;
    jstr sep = {"", 0};
    if (jj_iter_items(R, at, self, &items)) return -1;
    if (has[0] && jj_as_str(R, p[0], &sep)) return -1;
    jbuf b = {0};
    for (size_t i = 0; i < items->n; i++) {
        jv v = items->v[i];
        if (has[1] && p[1].t != JT_NONE && sort_key(R, at, v, &p[1], true, &v)) return -1;
        if (jj_step(R, at, 1) || (i && jj_jb_put(R, &b, sep.p, sep.n)) || jj_to_str(R, v, &b, 0)) return -1;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

BUILTIN(f_list) {
    UNUSED_ARGS;
    jlist *items, *l;
    if (jj_iter_items(R, at, self, &items) || !(l = jj_list_new(R, items->n))) return -1;
    if (items->n) memcpy(l->v, items->v, items->n * sizeof(jv));
    l->n = items->n;
    *out = jv_list(l, false);
    return 0;
}

BUILTIN(f_replace) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s)) return -1;
    return m_replace(R, at, jv_str(s), p, has, a, 0, out);
}

BUILTIN(f_reverse) {
    UNUSED_ARGS;
    if (self.t == JT_STR) {
        jlist *chars;
        if (jj_str_chars(R, self.u.s, &chars)) return -1;
        jbuf b = {0};
        for (size_t i = chars->n; i-- > 0;)
            if (jj_jb_put(R, &b, chars->v[i].u.s.p, chars->v[i].u.s.n)) return -1;
        *out = jv_str(jb_str(&b));
        return 0;
    }
    jlist *items, *l;
    if (jj_iter_items(R, at, self, &items) || !(l = jj_list_new(R, items->n))) return -1;
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
    if (!is_num(self)) return jj_rt_fail(R, at, NX_E_FORMAT, "round() needs a number, not '%s'", jj_tname(self));
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    double x = num_f(self), m = pow(10.0, (double)prec), r;
    if (jstr_is(method, "common")) r = nearbyint(x * m) / m; /* Python round(): half to even */
    else if (jstr_is(method, "ceil")) r = ceil(x * m) / m;
    else if (jstr_is(method, "floor")) r = floor(x * m) / m;
    else return jj_rt_fail(R, at, NX_E_FORMAT, "method must be common, ceil or floor");
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
    if (jj_iter_items(R, at, self, &items)) return -1;
    for (size_t i = 0; i < items->n; i++) {
        jv v = items->v[i];
        if (has[0] && p[0].t != JT_NONE && sort_key(R, at, v, &p[0], true, &v)) return -1;
        if (jj_binop(R, at, OP_ADD, acc, v, &acc)) return -1;
    }
    *out = acc;
    return 0;
}

BUILTIN(f_trim) {
    UNUSED_ARGS;
    jstr s;
    if (str_of(R, self, &s)) return -1;
    return m_strip(R, at, jv_str(s), p, has, a, 0, out);
}

/* transformers' jj_tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
 * sort_keys=False); no HTML escaping. */
BUILTIN(f_tojson) {
    UNUSED_ARGS;
    jopts o = {.indent = -1, .ascii = has[0] && jj_truthy(p[0]), .sort = has[3] && jj_truthy(p[3])};
    if (has[1] && p[1].t != JT_NONE) {
        if (p[1].t == JT_STR) return jj_rt_fail(R, at, NX_E_FORMAT, "string indent is not supported");
        if (need_int(R, at, p[1], "indent", &o.indent)) return -1;
        if (o.indent < 0) o.indent = 0;
        if (o.indent > 64) o.indent = 64;
    }
    o.item_sep = o.indent >= 0 ? JSTR(",") : JSTR(", ");
    o.key_sep = JSTR(": ");
    if (has[2] && p[2].t != JT_NONE) {
        jv sp = p[2];
        if (sp.t != JT_LIST || sp.u.l->n != 2 || sp.u.l->v[0].t != JT_STR || sp.u.l->v[1].t != JT_STR)
            return jj_rt_fail(R, at, NX_E_FORMAT, "separators must be a pair of strings");
        o.item_sep = sp.u.l->v[0].u.s;
        o.key_sep = sp.u.l->v[1].u.s;
    }
    jbuf b = {0};
    if (jj_tojson(R, at, self, &b, &o, 0)) return -1;
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
        int32_t c = jj_utf8_next(s.p + i, s.n - i, &adv);
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

/* Width and precision of a printf-style conversion come from the template, which comes from the
 * checkpoint: bounded so one conversion cannot ask the C library for gigabytes (glibc builds
 * '%.999999999f' in full before truncating) and its output is charged to the render budgets. */
#define FORMAT_MAX_WIDTH 4096

/* A number in a conversion spec at s.p[*j]; -1 when there are no digits, -2 when over the cap. */
static int64_t spec_number(jstr s, size_t *j) {
    int64_t v = -1;
    while (*j < s.n && is_digit(s.p[*j])) {
        v = (v < 0 ? 0 : v) * 10 + (s.p[(*j)++] - '0');
        if (v > FORMAT_MAX_WIDTH) {
            while (*j < s.n && is_digit(s.p[*j])) (*j)++;
            return -2;
        }
    }
    return v;
}

/* One d/i/f/e/g conversion with its flags, width and precision, written into b. */
static int put_conversion(rt *R, const node *at, jbuf *b, const char *flags, int width, int prec, char conv, jv v) {
    char spec[16];
    size_t k = (size_t)snprintf(spec, sizeof spec, "%%%s*.*", flags);
    bool integer = conv == 'd' || conv == 'i';
    if (integer) memcpy(spec + k, PRId64, sizeof PRId64);
    else spec[k] = conv, spec[k + 1] = 0;
    int64_t iv = v.t == JT_FLOAT ? (int64_t)v.u.f : num_i(v);
    double fv = num_f(v);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    int n = integer ? snprintf(NULL, 0, spec, width, prec, iv) : snprintf(NULL, 0, spec, width, prec, fv);
    if (n < 0) return jj_rt_fail(R, at, NX_E_FORMAT, "format: conversion failed");
    if (jj_step(R, at, (uint64_t)n / 64) || jj_jb_reserve(R, b, (size_t)n + 1)) return -1;
    if (integer) snprintf(b->p + b->n, (size_t)n + 1, spec, width, prec, iv);
    else snprintf(b->p + b->n, (size_t)n + 1, spec, width, prec, fv);
#pragma GCC diagnostic pop
    b->n += (size_t)n;
    return 0;
}

/* printf-style "%s"|format(x) and "%s" % x (mode 1): conversions s r d i f e g with optional
 * flags, width (at most FORMAT_MAX_WIDTH) and precision (same cap). */
int jj_f_format(rt *R, const node *at, jv self, jv *p, const bool *has, const args *a, int mode, jv *out) {
    UNUSED_ARGS;
    const char *what = mode ? "'%' formatting" : "format filter";
    jstr s;
    if (str_of(R, self, &s)) return -1;
    const jlist *fargs = p[0].u.l;
    size_t ai = 0;
    jbuf b = {0};
    for (size_t i = 0; i < s.n; i++) {
        if (s.p[i] != '%') {
            if (jj_jb_putc(R, &b, s.p[i])) return -1;
            continue;
        }
        size_t j = i + 1;
        char flags[8];
        size_t nf = 0;
        while (j < s.n && strchr("-+ 0#", s.p[j]) && s.p[j]) {
            if (nf < sizeof flags - 1) flags[nf++] = s.p[j];
            j++;
        }
        flags[nf] = 0;
        int64_t width = spec_number(s, &j), prec = -1;
        if (j < s.n && s.p[j] == '.') {
            j++;
            prec = spec_number(s, &j);
            if (prec == -1) prec = 0;
        }
        if (width == -2 || prec == -2)
            return jj_rt_fail(R, at, NX_E_FORMAT, "%s: %s over the limit of %d", what,
                              width == -2 ? "width" : "precision", FORMAT_MAX_WIDTH);
        if (j >= s.n) return jj_rt_fail(R, at, NX_E_FORMAT, "incomplete format");
        char conv = s.p[j];
        if (conv == '%') {
            if (jj_jb_putc(R, &b, '%')) return -1;
            i = j;
            continue;
        }
        if (ai >= fargs->n) return jj_rt_fail(R, at, NX_E_FORMAT, "not enough arguments for format string");
        jv v = fargs->v[ai++];
        if (conv == 's' || conv == 'r') {
            if (conv == 's' ? jj_to_str(R, v, &b, 0) : jj_to_repr(R, v, &b, 0)) return -1;
        } else if (conv == 'd' || conv == 'i' || conv == 'f' || conv == 'e' || conv == 'g') {
            if (!is_num(v))
                return jj_rt_fail(R, at, NX_E_FORMAT, "%%%c format: a number is required", conv == 'i' ? 'd' : conv);
            if (put_conversion(R, at, &b, flags, width < 0 ? 0 : (int)width, (int)prec, conv, v)) return -1;
        } else {
            return jj_rt_fail(R, at, NX_E_FORMAT, "unsupported format character '%c'", conv);
        }
        i = j;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

static int find_test_checked(rt *R, const node *at, jv name, int *fn) {
    jstr s;
    if (need_str(R, at, name, "test name", &s)) return -1;
    *fn = jj_find_test(s);
    if (*fn < 0) return jj_rt_fail(R, at, NX_E_FORMAT, "no test named '%.*s'", (int)s.n, s.p);
    return 0;
}

/* select / reject / selectattr / rejectattr share one walk. */
static int select_common(rt *R, const node *at, jv self, const jlist *rest, bool by_attr, bool keep, jv *out) {
    jlist *items, *res;
    if (jj_iter_items(R, at, self, &items) || !(res = jj_list_new(R, 0))) return -1;
    size_t k = 0;
    jstr attr = {"", 0};
    if (by_attr) {
        if (!rest->n) return jj_rt_fail(R, at, NX_E_FORMAT, "missing attribute name");
        if (need_str(R, at, rest->v[k++], "attribute", &attr)) return -1;
    }
    int fn = -1;
    if (k < rest->n && find_test_checked(R, at, rest->v[k++], &fn)) return -1;
    args ta = {.pos = k < rest->n ? rest->v + k : NULL, .npos = rest->n - k};
    for (size_t i = 0; i < items->n; i++) {
        jv v = items->v[i];
        if (by_attr && jj_get_path(R, at, v, attr, &v)) return -1;
        bool ok;
        if (fn < 0) ok = jj_truthy(v);
        else if (jj_run_test(R, at, fn, v, &ta, &ok)) return -1;
        if (ok == keep && jj_list_push(R, res, items->v[i])) return -1;
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
    if (jj_iter_items(R, at, self, &items) || !(res = jj_list_new(R, items->n))) return -1;
    jv attr = jv_undef((jstr){"", 0}), dflt = jv_undef((jstr){"", 0});
    args fa = {0};
    for (size_t k = 0; k < a->nkw; k++) {
        if (jstr_is(a->kn[k], "attribute")) attr = a->kv[k];
        else if (jstr_is(a->kn[k], "default")) dflt = a->kv[k];
    }
    const bdef *fd = NULL;
    if (attr.t == JT_UNDEF) {
        jstr name;
        if (!a->npos) return jj_rt_fail(R, at, NX_E_FORMAT, "map() needs a filter name or attribute=");
        if (need_str(R, at, a->pos[0], "filter name", &name)) return -1;
        int fi = jj_find_filter(name);
        if (fi < 0) return jj_rt_fail(R, at, NX_E_FORMAT, "no filter named '%.*s'", (int)name.n, name.p);
        fd = jj_filter_def(fi);
        fa = (args){.pos = a->pos + 1, .npos = a->npos - 1, .kn = a->kn, .kv = a->kv, .nkw = a->nkw};
    } else if (a->npos) {
        return jj_rt_fail(R, at, NX_E_FORMAT, "map() with attribute= takes no positional arguments");
    }
    for (size_t i = 0; i < items->n; i++) {
        jv v = items->v[i];
        if (fd) {
            if (jj_apply_filter(R, at, fd, v, &fa, &v)) return -1;
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
TEST(t_lower) { UNUSED_T; *res = v.t == JT_STR && str_class(v.u.s, CLS_LOWER); return 0; }
TEST(t_upper) { UNUSED_T; *res = v.t == JT_STR && str_class(v.u.s, CLS_UPPER); return 0; }

static int parity(rt *R, const node *at, jv v, int64_t *i) {
    *i = 0;
    if (v.t != JT_INT && v.t != JT_BOOL) {
        if (v.t == JT_FLOAT && v.u.f == floor(v.u.f) && fabs(v.u.f) < 9e18) {
            *i = (int64_t)v.u.f;
            return 0;
        }
        return jj_rt_fail(R, at, NX_E_FORMAT, "odd/even/divisibleby need an integer, not '%s'", jj_tname(v));
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
    if (d == 0) return jj_rt_fail(R, at, NX_E_FORMAT, "integer modulo by zero");
    *res = d == -1 || i % d == 0;
    return 0;
}
TEST(t_eq) { UNUSED_T; *res = jj_jv_equal(v, x[0], 0); return 0; }
TEST(t_ne) { UNUSED_T; *res = !jj_jv_equal(v, x[0], 0); return 0; }
TEST(t_lt) { return jj_compare(R, at, CMP_LT, v, x[0], res); }
TEST(t_le) { return jj_compare(R, at, CMP_LE, v, x[0], res); }
TEST(t_gt) { return jj_compare(R, at, CMP_GT, v, x[0], res); }
TEST(t_ge) { return jj_compare(R, at, CMP_GE, v, x[0], res); }
TEST(t_in) { return jj_contains(R, at, v, x[0], res); }
TEST(t_sameas) {
    UNUSED_T;
    jv y = x[0];
    if (v.t != y.t) *res = false;
    else if (v.t == JT_BOOL) *res = v.u.b == y.u.b;
    else if (v.t == JT_NONE || v.t == JT_UNDEF) *res = true;
    else if (v.t == JT_INT) *res = v.u.i == y.u.i;
    else if (v.t == JT_STR) *res = v.u.s.p == y.u.s.p && v.u.s.n == y.u.s.n;
    else *res = jj_jv_equal(v, y, 0) && v.u.l == y.u.l;
    return 0;
}
TEST(t_filter) { UNUSED_T; *res = v.t == JT_STR && jj_find_filter(v.u.s) >= 0; return 0; }
TEST(t_test) { UNUSED_T; *res = v.t == JT_STR && jj_find_test(v.u.s) >= 0; return 0; }

/* ------------------------------------------------------------------ tables */

static const bdef FILTER_TABLE[] = {
    {"abs", f_abs, 0, {NULL}, false, 0},
    {"attr", f_attr, 1, {"name", NULL}, false, 0},
    {"batch", f_batch, 1, {"linecount", "fill_with", NULL}, false, 0},
    {"capitalize", f_case, 0, {NULL}, false, CASE_CAPITALIZE},
    {"center", f_center, 0, {"width", NULL}, false, 0},
    {"count", f_length, 0, {NULL}, false, 0},
    {"d", f_default, 0, {"default_value", "boolean", NULL}, false, 0},
    {"default", f_default, 0, {"default_value", "boolean", NULL}, false, 0},
    {"dictsort", f_dictsort, 0, {"case_sensitive", "by", "reverse", NULL}, false, 0},
    {"e", f_escape, 0, {NULL}, false, 0},
    {"escape", f_escape, 0, {NULL}, false, 0},
    {"first", f_first, 0, {NULL}, false, 0},
    {"float", f_float, 0, {"default", NULL}, false, 0},
    {"forceescape", f_escape, 0, {NULL}, false, 0},
    {"format", jj_f_format, 0, {"*", NULL}, false, 0},
    {"indent", f_indent, 0, {"width", "first", "blank", NULL}, false, 0},
    {"int", f_int, 0, {"default", "base", NULL}, false, 0},
    {"items", f_items, 0, {NULL}, false, 0},
    {"join", f_join, 0, {"d", "attribute", NULL}, false, 0},
    {"last", f_last, 0, {NULL}, false, 0},
    {"length", f_length, 0, {NULL}, false, 0},
    {"list", f_list, 0, {NULL}, false, 0},
    {"lower", f_case, 0, {NULL}, false, CASE_LOWER},
    {"map", f_map, 0, {NULL}, true, 0},
    {"max", f_max, 0, {"case_sensitive", "attribute", NULL}, false, 0},
    {"min", f_min, 0, {"case_sensitive", "attribute", NULL}, false, 0},
    {"reject", f_reject, 0, {"*", NULL}, false, 0},
    {"rejectattr", f_rejectattr, 0, {"*", NULL}, false, 0},
    {"replace", f_replace, 2, {"old", "new", "count", NULL}, false, 0},
    {"reverse", f_reverse, 0, {NULL}, false, 0},
    {"round", f_round, 0, {"precision", "method", NULL}, false, 0},
    {"safe", f_safe, 0, {NULL}, false, 0},
    {"select", f_select, 0, {"*", NULL}, false, 0},
    {"selectattr", f_selectattr, 0, {"*", NULL}, false, 0},
    {"sort", f_sort, 0, {"reverse", "case_sensitive", "attribute", NULL}, false, 0},
    {"string", f_string, 0, {NULL}, false, 0},
    {"sum", f_sum, 0, {"attribute", "start", NULL}, false, 0},
    {"title", f_title, 0, {NULL}, false, 0},
    {"tojson", f_tojson, 0, {"ensure_ascii", "indent", "separators", "sort_keys", NULL}, false, 0},
    {"trim", f_trim, 0, {"chars", NULL}, false, 0},
    {"unique", f_unique, 0, {"case_sensitive", "attribute", NULL}, false, 0},
    {"upper", f_case, 0, {NULL}, false, CASE_UPPER},
    {"wordcount", f_wordcount, 0, {NULL}, false, 0},
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
    {"capitalize", m_case, 0, {NULL}, false, CASE_CAPITALIZE},
    {"count", m_count, 1, {"sub", NULL}, false, 0},
    {"endswith", m_endswith, 1, {"suffix", NULL}, false, 0},
    {"find", m_find, 1, {"sub", NULL}, false, 0},
    {"format", m_format, 0, {NULL}, true, 0},
    {"index", m_index, 1, {"sub", NULL}, false, 0},
    {"isalnum", m_isclass, 0, {NULL}, false, CLS_ALNUM},
    {"isalpha", m_isclass, 0, {NULL}, false, CLS_ALPHA},
    {"isdigit", m_isclass, 0, {NULL}, false, CLS_DIGIT},
    {"islower", m_isclass, 0, {NULL}, false, CLS_LOWER},
    {"isspace", m_isclass, 0, {NULL}, false, CLS_SPACE},
    {"isupper", m_isclass, 0, {NULL}, false, CLS_UPPER},
    {"join", m_join, 1, {"iterable", NULL}, false, 0},
    {"lower", m_case, 0, {NULL}, false, CASE_LOWER},
    {"lstrip", m_lstrip, 0, {"chars", NULL}, false, 0},
    {"removeprefix", m_removeprefix, 1, {"prefix", NULL}, false, 0},
    {"removesuffix", m_removesuffix, 1, {"suffix", NULL}, false, 0},
    {"replace", m_replace, 2, {"old", "new", "count", NULL}, false, 0},
    {"rfind", m_rfind, 1, {"sub", NULL}, false, 0},
    {"rsplit", m_rsplit, 0, {"sep", "maxsplit", NULL}, false, 0},
    {"rstrip", m_rstrip, 0, {"chars", NULL}, false, 0},
    {"split", m_split, 0, {"sep", "maxsplit", NULL}, false, 0},
    {"splitlines", m_splitlines, 0, {"keepends", NULL}, false, 0},
    {"startswith", m_startswith, 1, {"prefix", NULL}, false, 0},
    {"strip", m_strip, 0, {"chars", NULL}, false, 0},
    {"title", m_case, 0, {NULL}, false, CASE_TITLE},
    {"upper", m_case, 0, {NULL}, false, CASE_UPPER},
};

static const bdef DICT_METHODS[] = {
    {"get", m_get, 1, {"key", "default", NULL}, false, 0},
    {"items", m_items, 0, {NULL}, false, 0},
    {"keys", m_keys, 0, {NULL}, false, 0},
    {"values", m_values, 0, {NULL}, false, 0},
};

static const bdef LIST_METHODS[] = {
    {"append", m_append, 1, {"object", NULL}, false, 0},
    {"count", m_list_count, 1, {"value", NULL}, false, 0},
    {"index", m_list_index, 1, {"value", NULL}, false, 0},
};

static const bdef LOOP_METHODS[] = {
    {"cycle", m_cycle, 0, {NULL}, true, 0},
};

static const bdef GLOBALS[] = {
    {"dict", g_dict, 0, {NULL}, true, 0},
    {"namespace", g_namespace, 0, {NULL}, true, 0},
    {"raise_exception", g_raise_exception, 0, {NULL}, true, 0},
    {"range", g_range, 0, {NULL}, true, 0},
    {"strftime_now", g_strftime_now, 1, {"format", NULL}, false, 0},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

int jj_find_filter(jstr name) {
    for (size_t i = 0; i < COUNT(FILTER_TABLE); i++)
        if (jstr_is(name, FILTER_TABLE[i].name)) return (int)i;
    return -1;
}

const bdef *jj_filter_def(int fn) { return &FILTER_TABLE[fn]; }

int jj_find_test(jstr name) {
    for (size_t i = 0; i < COUNT(TEST_TABLE); i++)
        if (jstr_is(name, TEST_TABLE[i].name)) return (int)i;
    return -1;
}

int jj_test_nargs(int fn) { return TEST_TABLE[fn].nargs; }

static const bdef *lookup(const bdef *t, size_t n, jstr name) {
    for (size_t i = 0; i < n; i++)
        if (jstr_is(name, t[i].name)) return &t[i];
    return NULL;
}

const bdef *jj_find_method(jv self, jstr name) {
    switch ((jt)self.t) {
    case JT_STR: return lookup(STR_METHODS, COUNT(STR_METHODS), name);
    case JT_DICT: return lookup(DICT_METHODS, COUNT(DICT_METHODS), name);
    case JT_LIST: return lookup(LIST_METHODS, COUNT(LIST_METHODS), name);
    case JT_LOOP: return lookup(LOOP_METHODS, COUNT(LOOP_METHODS), name);
    default: return NULL;
    }
}

const bdef *jj_find_global(jstr name, uint16_t *id) {
    for (size_t i = 0; i < COUNT(GLOBALS); i++)
        if (jstr_is(name, GLOBALS[i].name)) {
            *id = (uint16_t)i;
            return &GLOBALS[i];
        }
    return NULL;
}

const bdef *jj_global_def(uint16_t id) { return &GLOBALS[id]; }

int jj_run_test(rt *R, const node *at, int fn, jv v, const args *a, bool *res) {
    const tdef *t = &TEST_TABLE[fn];
    if (a->nkw) return jj_rt_fail(R, at, NX_E_FORMAT, "test '%s' takes no keyword arguments", t->name);
    if ((int)a->npos != t->nargs)
        return jj_rt_fail(R, at, NX_E_FORMAT, "test '%s' takes %d argument%s (%zu given)", t->name, t->nargs,
                       t->nargs == 1 ? "" : "s", a->npos);
    return t->fn(R, at, v, a->pos, res);
}
