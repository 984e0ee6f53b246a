/* Jinja parser: recursive descent from tokens into an immutable tree; nesting is capped
 * (NX_JINJA_MAX_DEPTH) so neither the parser nor the renderer can exhaust the C stack. */
#include "text/jinja_internal.h"

#include <stdio.h>
#include <stdlib.h>

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
    return jj_perr(P, cur(P)->off, "expected %s, got %s", what, tok_desc(cur(P), b, sizeof b));
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
    node *x = jj_palloc(P, sizeof *x);
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
        node **v = jj_palloc(P, cap * sizeof *v);
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
        return jj_perr(P, off, "template nesting deeper than %d levels", NX_JINJA_MAX_DEPTH);
    return 0;
}

static node *p_cond(parser *P, bool with_cond);
static node *p_unary(parser *P, bool with_filter);
static node *p_tuple(parser *P, bool with_cond);

/* Call arguments after '(' up to and including ')': positional first, then name=value. */
static int p_call_args(parser *P, nlist *out) {
    bool kw = false;
    while (!is_op(P, ")")) {
        if (out->n) {
            if (expect_op(P, ",")) return -1;
            if (is_op(P, ")")) break;
        }
        if (is_op(P, "*") || is_op(P, "**"))
            return jj_perr(P, cur(P)->off, "argument unpacking (* / **) is not supported");
        if (cur(P)->t == T_NAME && tok_op(peek(P, 1), "=")) {
            node *k = mk(P, E_KWARG, cur(P)->off);
            if (!k) return -1;
            k->name = cur(P)->s;
            P->i += 2;
            if (!(k->a = p_cond(P, true)) || nl_push(P, out, k)) return -1;
            kw = true;
        } else {
            if (kw) return jj_perr(P, cur(P)->off, "positional argument follows keyword argument");
            if (nl_push(P, out, p_cond(P, true))) return -1;
        }
    }
    P->i++;
    return 0;
}

static node *p_filter_one(parser *P, node *x) {
    tok *t = cur(P);
    if (t->t != T_NAME) return unexpected(P, "a filter name"), NULL;
    int fn = jj_find_filter(t->s);
    if (fn < 0) return jj_perr(P, t->off, "unknown filter '%.*s'", (int)t->s.n, t->s.p), NULL;
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
    int fn = jj_find_test(t->s);
    if (fn < 0) return jj_perr(P, t->off, "unknown test '%.*s'", (int)t->s.n, t->s.p), NULL;
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
    } else if (jj_test_nargs(fn) > 0 && starts_primary(cur(P))) {
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
            if (++k > 2) return jj_perr(P, cur(P)->off, "too many ':' in slice"), NULL;
            slice = true;
            P->i++;
            continue;
        }
        if (part[k]) return unexpected(P, "']'"), NULL;
        if (!(part[k] = p_cond(P, true))) return NULL;
    }
    P->i++;
    if (!slice && !part[0]) return jj_perr(P, off, "empty subscript"), NULL;
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
            char *buf = jj_palloc(P, total + 1);
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
        uint8_t *ops = jj_palloc(P, k + 1);
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
        if (x->kind != E_NAME) return jj_perr(P, x->off, "cannot unpack into an attribute"), NULL;
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
            return jj_perr(P, t->off, "non-default parameter follows default parameter");
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
        if (is_name(P, "recursive")) return jj_perr(P, cur(P)->off, "recursive loops are not supported"), NULL;
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
            if (x->a->kind == E_LIST) return jj_perr(P, x->a->off, "a block set assigns a single name"), NULL;
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
        if (x->a->kind != E_CALL) return jj_perr(P, x->a->off, "{%% call %%} needs a macro call"), NULL;
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
        if (!P->loops) return jj_perr(P, t->off, "'%.*s' outside of a loop", (int)name.n, name.p), NULL;
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
        return jj_perr(P, t->off, "unsupported tag '%.*s'", (int)name.n, name.p), NULL;
    } else if (jstr_is(name, "elif") || jstr_is(name, "else") || (name.n > 3 && !memcmp(name.p, "end", 3))) {
        return jj_perr(P, t->off, "unexpected '{%% %.*s %%}'", (int)name.n, name.p), NULL;
    } else {
        return jj_perr(P, t->off, "unknown tag '%.*s'", (int)name.n, name.p), NULL;
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
            if (ends) return jj_perr(P, open_off, "'{%% %s %%}' is never closed (missing {%% %s %%})", open_name, closer);
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
    if (jj_lex(&P)) goto fail;
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
