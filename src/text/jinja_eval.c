/* Jinja evaluator: a tree walk over expressions and statements, calls of macros and builtins,
 * and the public render entry points. Hostile templates are bounded by the step budget and the
 * arena's byte budget. */
#include "text/jinja_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int eval(rt *R, frame *F, const node *n, jv *out);
static int render(rt *R, frame *F, const nlist *body);
/* The code points of s as a list of one-character strings. */
int jj_str_chars(rt *R, jstr s, jlist **out) {
    jlist *l = jj_list_new(R, jj_utf8_count(s.p, s.n));
    if (!l) return -1;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        jj_utf8_next(s.p + i, s.n - i, &adv);
        if (jj_list_push(R, l, jv_str((jstr){s.p + i, adv}))) return -1;
        i += adv;
    }
    *out = l;
    return 0;
}

/* What `for x in v` walks: list items, dict keys, string characters; undefined is empty. */
int jj_iter_items(rt *R, const node *at, jv v, jlist **out) {
    switch ((jt)v.t) {
    case JT_LIST: *out = v.u.l; return 0;
    case JT_DICT: {
        jlist *l = jj_list_new(R, v.u.d->n);
        if (!l) return -1;
        for (size_t i = 0; i < v.u.d->n; i++) l->v[i] = jv_str(v.u.d->k[i]);
        l->n = v.u.d->n;
        *out = l;
        return 0;
    }
    case JT_STR: return jj_step(R, at, v.u.s.n / 16) ? -1 : jj_str_chars(R, v.u.s, out);
    case JT_UNDEF: return (*out = jj_list_new(R, 0)) ? 0 : -1;
    default: return jj_rt_fail(R, at, NX_E_FORMAT, "'%s' object is not iterable", jj_tname(v));
    }
}

static jv method_value(rt *R, jv self, const bdef *d) {
    jmethod *m = jj_ralloc(R, sizeof *m);
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
int jj_get_attr(rt *R, jv obj, jstr name, jv *out) {
    const bdef *m = jj_find_method(obj, name);
    if (m) {
        *out = method_value(R, obj, m);
        return out->t == JT_UNDEF ? -1 : 0;
    }
    if ((obj.t == JT_DICT || obj.t == JT_NS) && jj_dict_get(obj.u.d, name, out)) return 0;
    if (obj.t == JT_LOOP) {
        if (jstr_is(name, "cycle")) {
            *out = method_value(R, obj, jj_find_method(obj, name));
            return 0;
        }
        return loop_attr(R, obj.u.lp, name, out);
    }
    *out = jv_undef(name);
    return 0;
}

static bool cp_offsets(const char *s, size_t n, int64_t idx, size_t *start, size_t *len) {
    size_t count = jj_utf8_count(s, n);
    if (idx < 0) idx += (int64_t)count;
    if (idx < 0 || (uint64_t)idx >= count) return false;
    size_t i = 0;
    for (int64_t k = 0; k < idx && i < n; k++) {
        size_t adv;
        jj_utf8_next(s + i, n - i, &adv);
        i += adv;
    }
    if (i >= n) return false;
    size_t adv;
    jj_utf8_next(s + i, n - i, &adv);
    *start = i;
    *len = adv;
    return true;
}

/* obj[key]: mapping keys / sequence indexes first, then attributes (Jinja2's getitem). */
int jj_get_item(rt *R, const node *at, jv obj, jv key, jv *out) {
    if ((obj.t == JT_DICT || obj.t == JT_NS) && key.t == JT_STR) {
        if (jj_dict_get(obj.u.d, key.u.s, out)) return 0;
        return jj_get_attr(R, obj, key.u.s, out);
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
        if (jj_step(R, at, obj.u.s.n / 64)) return -1;
        *out = cp_offsets(obj.u.s.p, obj.u.s.n, i, &st, &len) ? jv_str((jstr){obj.u.s.p + st, len})
                                                                : jv_undef((jstr){"[index]", 7});
        return 0;
    }
    if (key.t == JT_STR) return jj_get_attr(R, obj, key.u.s, out);
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
            return jj_rt_fail(R, at, NX_E_FORMAT, "slice indices must be integers or None");
    int64_t stp = c.t == JT_NONE ? 1 : num_i(c);
    if (stp == 0) return jj_rt_fail(R, at, NX_E_FORMAT, "slice step cannot be zero");
    if (stp == INT64_MIN) stp = -INT64_MAX;
    jlist *src;
    if (obj.t == JT_STR && stp == 1) { /* contiguous: a view into the string, no copy */
        jstr s = obj.u.s;
        if (jj_step(R, at, s.n / 64)) return -1;
        int64_t start, cnt = slice_indices((int64_t)jj_utf8_count(s.p, s.n), a, b, 1, &start);
        size_t i = 0, adv;
        for (int64_t k = 0; k < start && i < s.n; k++, i += adv) jj_utf8_next(s.p + i, s.n - i, &adv);
        size_t j = i;
        for (int64_t k = 0; k < cnt && j < s.n; k++, j += adv) jj_utf8_next(s.p + j, s.n - j, &adv);
        *out = jv_str((jstr){s.p + i, j - i});
        return 0;
    }
    if (obj.t == JT_LIST) {
        src = obj.u.l;
    } else if (obj.t == JT_STR) {
        if (jj_step(R, at, obj.u.s.n / 16) || jj_str_chars(R, obj.u.s, &src)) return -1;
    } else if (obj.t == JT_UNDEF) {
        *out = obj;
        return 0;
    } else {
        return jj_rt_fail(R, at, NX_E_FORMAT, "'%s' object is not subscriptable", jj_tname(obj));
    }
    int64_t start, cnt = slice_indices((int64_t)src->n, a, b, stp, &start);
    if (jj_step(R, at, (uint64_t)cnt / 16)) return -1;
    jlist *l = jj_list_new(R, (size_t)cnt);
    if (!l) return -1;
    for (int64_t k = 0; k < cnt; k++) l->v[k] = src->v[start + k * stp];
    l->n = (size_t)cnt;
    if (obj.t == JT_LIST) {
        *out = jv_list(l, obj.tuple);
        return 0;
    }
    jbuf buf = {0};
    for (size_t k = 0; k < l->n; k++)
        if (jj_jb_put(R, &buf, l->v[k].u.s.p, l->v[k].u.s.n)) return -1;
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
        if (b == 0) return jj_rt_fail(R, at, NX_E_FORMAT, "division by zero");
        *out = jv_float((double)a / (double)b);
        return 0;
    case OP_FLOORDIV:
    case OP_MOD:
        if (b == 0) return jj_rt_fail(R, at, NX_E_FORMAT, "integer division or modulo by zero");
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
            if (a == 0) return jj_rt_fail(R, at, NX_E_FORMAT, "0.0 cannot be raised to a negative power");
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
    return jj_rt_fail(R, at, NX_E_FORMAT, "integer overflow");
}

static int arith_float(rt *R, const node *at, int op, double a, double b, jv *out) {
    double r;
    switch (op) {
    case OP_ADD: r = a + b; break;
    case OP_SUB: r = a - b; break;
    case OP_MUL: r = a * b; break;
    case OP_DIV:
        if (b == 0) return jj_rt_fail(R, at, NX_E_FORMAT, "float division by zero");
        r = a / b;
        break;
    case OP_FLOORDIV:
        if (b == 0) return jj_rt_fail(R, at, NX_E_FORMAT, "float divmod by zero");
        r = floor(a / b);
        break;
    case OP_MOD:
        if (b == 0) return jj_rt_fail(R, at, NX_E_FORMAT, "float modulo by zero");
        r = fmod(a, b);
        if (r != 0 && ((r < 0) != (b < 0))) r += b;
        break;
    case OP_POW:
        if (a == 0 && b < 0) return jj_rt_fail(R, at, NX_E_FORMAT, "0.0 cannot be raised to a negative power");
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
        return jj_rt_fail(R, at, NX_E_FORMAT, "repetition result too large");
    size_t total = unit * (size_t)times;
    if (jj_step(R, at, total / 64)) return -1;
    if (seq.t == JT_STR) {
        jbuf b = {0};
        if (jj_jb_reserve(R, &b, total)) return -1;
        for (int64_t k = 0; k < times; k++) jj_jb_put(R, &b, seq.u.s.p, unit);
        *out = jv_str(jb_str(&b));
        return 0;
    }
    jlist *l = jj_list_new(R, total);
    if (!l) return -1;
    for (int64_t k = 0; k < times; k++)
        for (size_t i = 0; i < unit; i++) l->v[l->n++] = seq.u.l->v[i];
    *out = jv_list(l, seq.tuple);
    return 0;
}


static const char *const OPNAMES[] = {"+", "-", "*", "/", "//", "%", "**", "~"};

int jj_binop(rt *R, const node *at, int op, jv a, jv b, jv *out) {
    if (op == OP_CONCAT) {
        jbuf buf = {0};
        if (jj_to_str(R, a, &buf, 0) || jj_to_str(R, b, &buf, 0)) return -1;
        *out = jv_str(jb_str(&buf));
        return 0;
    }
    if (a.t == JT_UNDEF) return jj_undefined_error(R, at, a);
    if (b.t == JT_UNDEF) return jj_undefined_error(R, at, b);
    if (is_num(a) && is_num(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) return arith_int(R, at, op, num_i(a), num_i(b), out);
        return arith_float(R, at, op, num_f(a), num_f(b), out);
    }
    if (op == OP_ADD && a.t == JT_STR && b.t == JT_STR) {
        jbuf buf = {0};
        if (jj_jb_reserve(R, &buf, a.u.s.n + b.u.s.n) || jj_jb_put(R, &buf, a.u.s.p, a.u.s.n) ||
            jj_jb_put(R, &buf, b.u.s.p, b.u.s.n))
            return -1;
        *out = jv_str(jb_str(&buf));
        return 0;
    }
    if (op == OP_ADD && a.t == JT_LIST && b.t == JT_LIST) {
        jlist *l = jj_list_new(R, a.u.l->n + b.u.l->n);
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
        jlist *fa = is_tuple ? b.u.l : jj_list_new(R, 1);
        if (!fa || (!is_tuple && jj_list_push(R, fa, b))) return -1;
        jv p[1] = {jv_list(fa, true)};
        bool has[1] = {true};
        return jj_f_format(R, at, a, p, has, NULL, 1, out);
    }
    if (op == OP_ADD && (a.t == JT_STR || b.t == JT_STR) && a.t != JT_NONE && b.t != JT_NONE) {
        /* Python raises here; like the reference JS implementation we concatenate instead. */
        return jj_binop(R, at, OP_CONCAT, a, b, out);
    }
    return jj_rt_fail(R, at, NX_E_FORMAT, "unsupported operand type(s) for %s: '%s' and '%s'", OPNAMES[op],
                   jj_tname(a), jj_tname(b));
}

static bool str_contains(jstr hay, jstr needle) {
    if (!needle.n) return true;
    return needle.n <= hay.n && memmem(hay.p, hay.n, needle.p, needle.n) != NULL;
}

int jj_contains(rt *R, const node *at, jv item, jv seq, bool *res) {
    switch ((jt)seq.t) {
    case JT_STR:
        if (item.t != JT_STR)
            return jj_rt_fail(R, at, NX_E_FORMAT, "'in <string>' requires string as left operand, not %s", jj_tname(item));
        if (jj_step(R, at, seq.u.s.n / 64)) return -1;
        *res = str_contains(seq.u.s, item.u.s);
        return 0;
    case JT_LIST:
        if (jj_step(R, at, seq.u.l->n / 8)) return -1;
        *res = false;
        for (size_t i = 0; i < seq.u.l->n && !*res; i++) *res = jj_jv_equal(item, seq.u.l->v[i], 0);
        return 0;
    case JT_DICT:
    case JT_NS: {
        jv dummy;
        *res = item.t == JT_STR && jj_dict_get(seq.u.d, item.u.s, &dummy);
        return 0;
    }
    case JT_UNDEF: *res = false; return 0;
    default: return jj_rt_fail(R, at, NX_E_FORMAT, "argument of type '%s' is not iterable", jj_tname(seq));
    }
}

int jj_compare(rt *R, const node *at, int op, jv a, jv b, bool *res) {
    int o;
    switch (op) {
    case CMP_EQ: *res = jj_jv_equal(a, b, 0); return 0;
    case CMP_NE: *res = !jj_jv_equal(a, b, 0); return 0;
    case CMP_IN: return jj_contains(R, at, a, b, res);
    case CMP_NOTIN:
        if (jj_contains(R, at, a, b, res)) return -1;
        *res = !*res;
        return 0;
    default: break;
    }
    if (jj_jv_order(R, at, a, b, &o, 0)) return -1;
    *res = op == CMP_LT ? o < 0 : op == CMP_LE ? o <= 0 : op == CMP_GT ? o > 0 : o >= 0;
    return 0;
}

/* ------------------------------------------------------------------ calls */

static int eval_args(rt *R, frame *F, const nlist *l, args *a) {
    memset(a, 0, sizeof *a);
    if (!l->n) return 0;
    a->pos = jj_ralloc(R, l->n * sizeof(jv));
    a->kv = jj_ralloc(R, l->n * sizeof(jv));
    a->kn = jj_ralloc(R, l->n * sizeof(jstr));
    if (!a->pos || !a->kv || !a->kn) return -1;
    for (size_t i = 0; i < l->n; i++) {
        const node *x = l->v[i];
        if (x->kind == E_KWARG) {
            for (size_t k = 0; k < a->nkw; k++)
                if (jstr_eq(a->kn[k], x->name))
                    return jj_rt_fail(R, x, NX_E_FORMAT, "keyword argument '%.*s' repeated", (int)x->name.n, x->name.p);
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
    if (star && !(rest = jj_list_new(R, 0))) return -1;
    for (size_t i = 0; i < a->npos; i++) {
        if ((int)i < fixed) {
            p[i] = a->pos[i];
            has[i] = true;
        } else if (star) {
            if (jj_list_push(R, rest, a->pos[i])) return -1;
        } else {
            return jj_rt_fail(R, at, NX_E_FORMAT, "%s() takes at most %d argument%s (%zu given)", d->name, fixed,
                           fixed == 1 ? "" : "s", a->npos);
        }
    }
    for (size_t k = 0; k < a->nkw; k++) {
        int hit = -1;
        for (int i = 0; i < fixed; i++)
            if (jstr_is(a->kn[k], d->params[i])) hit = i;
        if (hit < 0)
            return jj_rt_fail(R, at, NX_E_FORMAT, "%s() got an unexpected keyword argument '%.*s'", d->name,
                           (int)a->kn[k].n, a->kn[k].p);
        if (has[hit]) return jj_rt_fail(R, at, NX_E_FORMAT, "%s() got multiple values for '%s'", d->name, d->params[hit]);
        p[hit] = a->kv[k];
        has[hit] = true;
    }
    for (int i = 0; i < d->nreq && i < fixed; i++)
        if (!has[i]) return jj_rt_fail(R, at, NX_E_FORMAT, "%s() missing required argument '%s'", d->name, d->params[i]);
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
    return d->fn(R, at, self, p, has, a, d->mode, out);
}

static int call_macro(rt *R, const node *at, const jmacro *m, const args *a, jv caller, jv *out) {
    if (R->call_depth >= NX_JINJA_MAX_CALL_DEPTH)
        return jj_rt_fail(R, at, NX_E_FORMAT, "macro calls nested deeper than %d", NX_JINJA_MAX_CALL_DEPTH);
    const node *def = m->def;
    const nlist *params = &def->args;
    frame *F = jj_frame_new(R, m->closure);
    bool *set = jj_ralloc(R, params->n + 1);
    jlist *varargs = jj_list_new(R, 0);
    jdict *kwargs = jj_dict_new(R);
    if (!F || !set || !varargs || !kwargs) return -1;
    memset(set, 0, params->n + 1);
    for (size_t i = 0; i < a->npos; i++) {
        if (i < params->n) {
            if (jj_frame_set(R, F, params->v[i]->name, a->pos[i])) return -1;
            set[i] = true;
        } else if (jj_list_push(R, varargs, a->pos[i])) {
            return -1;
        }
    }
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < params->n && !jstr_eq(params->v[i]->name, a->kn[k])) i++;
        if (i == params->n) {
            if (jj_dict_set(R, kwargs, a->kn[k], a->kv[k])) return -1;
            continue;
        }
        if (set[i])
            return jj_rt_fail(R, at, NX_E_FORMAT, "macro got multiple values for argument '%.*s'", (int)a->kn[k].n,
                           a->kn[k].p);
        if (jj_frame_set(R, F, params->v[i]->name, a->kv[k])) return -1;
        set[i] = true;
    }
    if (jj_frame_set(R, F, JSTR("varargs"), jv_list(varargs, true)) ||
        jj_frame_set(R, F, JSTR("kwargs"), (jv){.t = JT_DICT, .u.d = kwargs}))
        return -1;
    if (caller.t != JT_UNDEF && jj_frame_set(R, F, JSTR("caller"), caller)) return -1;
    for (size_t i = 0; i < params->n; i++) {
        if (set[i]) continue;
        jv v = jv_undef(params->v[i]->name);
        if (params->v[i]->kind == E_KWARG && eval(R, F, params->v[i]->a, &v)) return -1;
        if (jj_frame_set(R, F, params->v[i]->name, v)) return -1;
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
    case JT_FUNC: return call_builtin(R, at, jj_global_def(fn.id), jv_none(), a, out);
    case JT_METHOD: return call_builtin(R, at, fn.u.bm->def, fn.u.bm->self, a, out);
    case JT_MACRO: return call_macro(R, at, fn.u.m, a, caller, out);
    case JT_UNDEF: return jj_undefined_error(R, at, fn);
    default: return jj_rt_fail(R, at, NX_E_FORMAT, "'%s' object is not callable", jj_tname(fn));
    }
}

int jj_apply_filter(rt *R, const node *at, const bdef *d, jv v, const args *a, jv *out) {
    return call_builtin(R, at, d, v, a, out);
}


static int eval(rt *R, frame *F, const node *n, jv *out) {
    if (jj_step(R, n, 1)) return -1;
    switch ((node_kind)n->kind) {
    case E_CONST: *out = n->val; return 0;
    case E_NAME: {
        if (jj_frame_get(F, n->name, out)) return 0;
        uint16_t id;
        if (jj_find_global(n->name, &id)) {
            *out = (jv){.t = JT_FUNC, .id = id};
            return 0;
        }
        *out = jv_undef(n->name);
        return 0;
    }
    case E_LIST: {
        jlist *l = jj_list_new(R, n->args.n);
        if (!l) return -1;
        for (size_t i = 0; i < n->args.n; i++)
            if (eval(R, F, n->args.v[i], &l->v[i])) return -1;
        l->n = n->args.n;
        *out = jv_list(l, n->op);
        return 0;
    }
    case E_DICT: {
        jdict *d = jj_dict_new(R);
        if (!d) return -1;
        for (size_t i = 0; i + 1 < n->args.n; i += 2) {
            jv k, v;
            if (eval(R, F, n->args.v[i], &k) || eval(R, F, n->args.v[i + 1], &v)) return -1;
            if (k.t != JT_STR) return jj_rt_fail(R, n->args.v[i], NX_E_FORMAT, "dict keys must be strings here");
            if (jj_dict_set(R, d, k.u.s, v)) return -1;
        }
        *out = (jv){.t = JT_DICT, .u.d = d};
        return 0;
    }
    case E_ATTR: {
        jv o;
        if (eval(R, F, n->a, &o)) return -1;
        return jj_get_attr(R, o, n->name, out);
    }
    case E_ITEM: {
        jv o, k;
        if (eval(R, F, n->a, &o) || eval(R, F, n->b, &k)) return -1;
        return jj_get_item(R, n, o, k, out);
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
        return jj_apply_filter(R, n, jj_filter_def(n->fn), v, &a, out);
    }
    case E_TEST: {
        jv v;
        args a;
        bool res;
        if (eval(R, F, n->a, &v) || eval_args(R, F, &n->args, &a) || jj_run_test(R, n, n->fn, v, &a, &res)) return -1;
        *out = jv_bool(res != n->neg);
        return 0;
    }
    case E_NOT: {
        jv v;
        if (eval(R, F, n->a, &v)) return -1;
        *out = jv_bool(!jj_truthy(v));
        return 0;
    }
    case E_NEG:
    case E_POS: {
        jv v;
        if (eval(R, F, n->a, &v)) return -1;
        if (v.t == JT_FLOAT) *out = jv_float(n->kind == E_NEG ? -v.u.f : v.u.f);
        else if (v.t == JT_INT || v.t == JT_BOOL) {
            int64_t i = num_i(v);
            if (n->kind == E_NEG && i == INT64_MIN) return jj_rt_fail(R, n, NX_E_FORMAT, "integer overflow");
            *out = jv_int(n->kind == E_NEG ? -i : i);
        } else if (v.t == JT_UNDEF) {
            return jj_undefined_error(R, n, v);
        } else {
            return jj_rt_fail(R, n, NX_E_FORMAT, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+',
                           jj_tname(v));
        }
        return 0;
    }
    case E_BIN: {
        jv a, b;
        if (eval(R, F, n->a, &a) || eval(R, F, n->b, &b)) return -1;
        return jj_binop(R, n, n->op, a, b, out);
    }
    case E_AND:
    case E_OR: {
        if (eval(R, F, n->a, out)) return -1;
        if (jj_truthy(*out) == (n->kind == E_OR)) return 0;
        return eval(R, F, n->b, out);
    }
    case E_CMP: {
        jv left;
        if (eval(R, F, n->a, &left)) return -1;
        bool res = true;
        for (size_t i = 0; i < n->args.n && res; i++) {
            jv right;
            if (eval(R, F, n->args.v[i], &right) || jj_compare(R, n, n->ops[i], left, right, &res)) return -1;
            left = right;
        }
        *out = jv_bool(res);
        return 0;
    }
    case E_COND: {
        jv c;
        if (eval(R, F, n->a, &c)) return -1;
        if (jj_truthy(c)) return eval(R, F, n->b, out);
        if (n->c) return eval(R, F, n->c, out);
        *out = jv_undef((jstr){"", 0});
        return 0;
    }
    case E_BLOCKVAL: *out = R->blockval; return 0;
    default: return jj_rt_fail(R, n, NX_E_FORMAT, "internal error: node %d is not an expression", n->kind);
    }
}

/* ================================================================== statements */

static int assign(rt *R, frame *F, const node *target, jv v) {
    if (target->kind == E_NAME) return jj_frame_set(R, F, target->name, v);
    if (target->kind == E_ATTR) {
        jv obj;
        if (eval(R, F, target->a, &obj)) return -1;
        if (obj.t != JT_NS) return jj_rt_fail(R, target, NX_E_FORMAT, "can only assign attributes of a namespace(), not '%s'", jj_tname(obj));
        return jj_dict_set(R, obj.u.d, target->name, v);
    }
    /* tuple unpacking */
    jlist *items;
    if (jj_iter_items(R, target, v, &items)) return -1;
    if (items->n != target->args.n)
        return jj_rt_fail(R, target, NX_E_FORMAT, "cannot unpack %zu value%s into %zu name%s", items->n,
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
    if (eval(R, F, s->b, &it) || jj_iter_items(R, s->b, it, &items)) return -1;
    if (s->c) { /* `for x in xs if cond`: loop.* counts only the kept items */
        jlist *kept = jj_list_new(R, 0);
        frame *tf = jj_frame_new(R, F);
        if (!kept || !tf) return -1;
        for (size_t i = 0; i < items->n; i++) {
            jv c;
            tf->vars.n = 0;
            if (jj_step(R, s, 1) || assign(R, tf, s->a, items->v[i]) || eval(R, tf, s->c, &c)) return -1;
            if (jj_truthy(c) && jj_list_push(R, kept, items->v[i])) return -1;
        }
        items = kept;
    }
    if (!items->n) return render(R, F, &s->orelse);
    jloop *lp = jj_ralloc(R, sizeof *lp);
    frame *IF = jj_frame_new(R, F);
    if (!lp || !IF) return -1;
    lp->items = items;
    lp->length = (int64_t)items->n;
    for (size_t i = 0; i < items->n; i++) {
        if (jj_step(R, s, 1)) return -1;
        IF->vars.n = 0; /* Jinja2 scopes assignments to one iteration */
        lp->index0 = (int64_t)i;
        if (jj_frame_set(R, IF, JSTR("loop"), (jv){.t = JT_LOOP, .u.lp = lp}) || assign(R, IF, s->a, items->v[i]))
            return -1;
        int r = render(R, IF, &s->body);
        if (r < 0) return -1;
        if (r == R_BREAK) break;
    }
    return R_OK;
}

static int exec_stmt(rt *R, frame *F, const node *s) {
    if (jj_step(R, s, 1)) return -1;
    switch ((node_kind)s->kind) {
    case N_TEXT: return jj_jb_put(R, R->out, s->name.p, s->name.n);
    case N_OUTPUT: {
        jv v;
        if (eval(R, F, s->a, &v)) return -1;
        return jj_to_str(R, v, R->out, 0);
    }
    case N_IF: {
        jv c;
        if (eval(R, F, s->a, &c)) return -1;
        return render(R, F, jj_truthy(c) ? &s->body : &s->orelse);
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
        jmacro *m = jj_ralloc(R, sizeof *m);
        if (!m) return -1;
        m->def = s;
        m->closure = F;
        return jj_frame_set(R, F, s->name, (jv){.t = JT_MACRO, .u.m = m});
    }
    case N_CALLBLOCK: {
        jmacro *m = jj_ralloc(R, sizeof *m);
        jv fn, res;
        args a;
        if (!m) return -1;
        m->def = s;
        m->closure = F;
        if (eval(R, F, s->a->a, &fn) || eval_args(R, F, &s->a->args, &a) ||
            call_value(R, s, fn, &a, (jv){.t = JT_MACRO, .u.m = m}, &res))
            return -1;
        return jj_to_str(R, res, R->out, 0);
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
        return r ? -1 : jj_to_str(R, v, R->out, 0);
    }
    case N_BREAK: return R_BREAK;
    case N_CONTINUE: return R_CONTINUE;
    case N_BLOCK: {
        frame *W = F;
        if (s->op) {
            if (!(W = jj_frame_new(R, F))) return -1;
            for (size_t i = 0; i < s->args.n; i++) {
                jv v;
                if (eval(R, F, s->args.v[i]->a, &v) || jj_frame_set(R, W, s->args.v[i]->name, v)) return -1;
            }
        }
        return render(R, W, &s->body);
    }
    case N_DO: {
        jv v;
        return eval(R, F, s->a, &v);
    }
    default: return jj_rt_fail(R, s, NX_E_FORMAT, "internal error: node %d is not a statement", s->kind);
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
    frame *root = jj_frame_new(&R, NULL);
    if (!root) goto fail;
    if (ctx) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)ctx, key, val) {
            jv v;
            if (jj_from_json(&R, val, &v, 0) || jj_frame_set(&R, root, (jstr){key, strlen(key)}, v)) goto fail;
        }
    }
    if (render(&R, root, &t->body) < 0) goto fail;
    char *res = malloc(b.n + 1);
    if (!res) {
        jj_arena_free(&R.ar);
        return nx_fail(err, NX_E_NOMEM, "template: out of memory");
    }
    if (b.n) memcpy(res, b.p, b.n);
    res[b.n] = 0;
    if (out_len) *out_len = b.n;
    *out = res;
    jj_arena_free(&R.ar);
    return NX_OK;
fail:
    jj_arena_free(&R.ar);
    return err->status != NX_OK ? err->status : NX_E_FORMAT;
}

void nx_jinja_free(nx_jinja *t) {
    if (!t) return;
    jj_arena_free(&t->ar);
    free(t->src);
    free(t);
}
