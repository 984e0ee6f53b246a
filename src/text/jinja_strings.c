/* Python str algorithms the builtins share: case mapping, strip, find, replace, split,
 * splitlines, attribute paths. */
#include "text/jinja_internal.h"

#include <stdlib.h>
#include <utf8proc.h>

static bool cp_cased(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

int jj_str_case(rt *R, const node *at, jstr s, int mode, jstr *out) {
    if (jj_step(R, at, s.n / 32)) return -1;
    jbuf b = {0};
    if (jj_jb_reserve(R, &b, s.n)) return -1;
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        int32_t c = jj_utf8_next(s.p + i, s.n - i, &adv), m = c;
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
            if (jj_jb_put(R, &b, s.p + i, 1)) return -1;
        } else if (jj_jb_cp(R, &b, m)) {
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
        if (jj_utf8_next(set.p + i, set.n - i, &adv) == c) return true;
        i += adv;
    }
    return false;
}

/* Python's strip family: chars == NULL strips whitespace. */
jstr jj_str_strip(jstr s, const jstr *chars, bool left, bool right) {
    size_t a = 0, b = s.n;
    while (left && a < b) {
        size_t adv;
        int32_t c = jj_utf8_next(s.p + a, b - a, &adv);
        if (chars ? !cp_in(c, *chars) : !jj_py_isspace(c)) break;
        a += adv;
    }
    while (right && b > a) {
        size_t st = jj_utf8_prev(s.p, a, b), adv;
        int32_t c = jj_utf8_next(s.p + st, b - st, &adv);
        if (chars ? !cp_in(c, *chars) : !jj_py_isspace(c)) break;
        b = st;
    }
    return (jstr){s.p + a, b - a};
}

const char *jj_find_sub(jstr hay, size_t from, jstr needle) {
    if (from > hay.n) return NULL;
    if (!needle.n) return hay.p + from;
    return memmem(hay.p + from, hay.n - from, needle.p, needle.n);
}

const char *jj_rfind_sub(jstr hay, jstr needle) {
    if (needle.n > hay.n) return NULL;
    for (size_t i = hay.n - needle.n + 1; i-- > 0;)
        if (!memcmp(hay.p + i, needle.p, needle.n)) return hay.p + i;
    return NULL;
}

int jj_str_replace(rt *R, const node *at, jstr s, jstr old, jstr rep, int64_t count, jstr *out) {
    if (jj_step(R, at, s.n / 64)) return -1;
    jbuf b = {0};
    if (count < 0) count = INT64_MAX;
    if (!old.n) { /* Python inserts `rep` before every character and at the end */
        int64_t k = 0;
        /* the whole result is charged before it is built: (characters + 1) copies of rep */
        size_t cps = jj_utf8_count(s.p, s.n) + 1;
        if ((uint64_t)count < cps) cps = (size_t)count;
        if (rep.n && cps > (SIZE_MAX / 4) / rep.n) return jj_rt_fail(R, at, NX_E_FORMAT, "replace() result too large");
        if (jj_step(R, at, cps * rep.n / 64) || jj_jb_reserve(R, &b, s.n + cps * rep.n)) return -1;
        for (size_t i = 0; i <= s.n;) {
            if (k < count) {
                if (jj_jb_put(R, &b, rep.p, rep.n)) return -1;
                k++;
            }
            if (i == s.n) break;
            size_t adv;
            jj_utf8_next(s.p + i, s.n - i, &adv);
            if (jj_jb_put(R, &b, s.p + i, adv)) return -1;
            i += adv;
        }
        *out = jb_str(&b);
        return 0;
    }
    size_t i = 0;
    for (int64_t k = 0; k < count; k++) {
        const char *f = jj_find_sub(s, i, old);
        if (!f) break;
        size_t at_i = (size_t)(f - s.p);
        if (jj_step(R, at, 1 + rep.n / 64) || jj_jb_put(R, &b, s.p + i, at_i - i) || jj_jb_put(R, &b, rep.p, rep.n))
            return -1;
        i = at_i + old.n;
    }
    if (jj_jb_put(R, &b, s.p + i, s.n - i)) return -1;
    *out = jb_str(&b);
    return 0;
}

static int push_str(rt *R, jlist *l, const char *p, size_t n) { return jj_list_push(R, l, jv_str((jstr){p, n})); }

int jj_str_split(rt *R, const node *at, jstr s, const jstr *sep, int64_t maxsplit, bool from_right, jv *out) {
    if (jj_step(R, at, s.n / 32)) return -1;
    jlist *l = jj_list_new(R, 0);
    if (!l) return -1;
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (sep && !sep->n) return jj_rt_fail(R, at, NX_E_FORMAT, "empty separator");
    if (!from_right) {
        if (!sep) {
            size_t i = jj_skip_space_fwd(s.p, 0, s.n);
            int64_t k = 0;
            while (i < s.n) {
                if (k++ >= maxsplit) {
                    if (push_str(R, l, s.p + i, s.n - i)) return -1;
                    break;
                }
                size_t j = i;
                while (j < s.n) {
                    size_t adv;
                    if (jj_py_isspace(jj_utf8_next(s.p + j, s.n - j, &adv))) break;
                    j += adv;
                }
                if (push_str(R, l, s.p + i, j - i)) return -1;
                i = jj_skip_space_fwd(s.p, j, s.n);
            }
        } else {
            size_t i = 0;
            for (int64_t k = 0; k < maxsplit; k++) {
                const char *f = jj_find_sub(s, i, *sep);
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
            end = jj_skip_space_back(s.p, 0, end);
            while (end > 0) {
                if (k++ >= maxsplit) {
                    if (push_str(R, l, s.p, end)) return -1;
                    break;
                }
                size_t j = end;
                while (j > 0) {
                    size_t st = jj_utf8_prev(s.p, 0, j), adv;
                    if (jj_py_isspace(jj_utf8_next(s.p + st, j - st, &adv))) break;
                    j = st;
                }
                if (push_str(R, l, s.p + j, end - j)) return -1;
                end = jj_skip_space_back(s.p, 0, j);
            }
        } else {
            for (; k < maxsplit; k++) {
                const char *f = jj_rfind_sub((jstr){s.p, end}, *sep);
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
        int32_t cp = jj_utf8_next(s + i, n - i, &adv);
        if (cp == 0x85 || cp == 0x2028 || cp == 0x2029) return adv;
    }
    return 0;
}

int jj_str_splitlines(rt *R, jstr s, bool keepends, jlist **out) {
    jlist *l = jj_list_new(R, 0);
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

int64_t jj_cp_index(jstr s, const char *at) { return (int64_t)jj_utf8_count(s.p, (size_t)(at - s.p)); }

/* Looks up a dotted attribute path ("a.b", "items.0") as filters' attribute= does. */
int jj_get_path(rt *R, const node *at, jv item, jstr path, jv *out) {
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
        if (jj_get_item(R, at, *out, key, out)) return -1;
        i = j + 1;
    }
    return 0;
}
