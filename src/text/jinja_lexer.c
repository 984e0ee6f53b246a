/* Jinja lexer: template text and tags into tokens, with transformers' trim_blocks and
 * lstrip_blocks, whitespace control (`-`/`+`), comments and {% raw %}. */
#include "text/jinja_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ================================================================== lexer */
int jj_perr(parser *P, size_t off, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    jj_line_col(P->T->src, P->T->len, off, &line, &col);
    nx_fail(P->err, NX_E_FORMAT, "template line %d, column %d: %s", line, col, msg);
    return -1;
}

void *jj_palloc(parser *P, size_t n) {
    void *p = jj_arena_alloc(&P->T->ar, n);
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
    if (p >= n) return jj_perr(P, start, "unterminated string literal");
    size_t end = p;
    *pos = p + 1;
    t->t = T_STRING;
    t->off = start;
    if (!esc) {
        t->s = (jstr){s + start + 1, end - start - 1};
        return 0;
    }
    char *buf = jj_palloc(P, end - start + 1);
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
                if (h < 0) return jj_perr(P, i - 1, "truncated \\%c escape in string literal", c);
                cp = cp * 16 + (uint32_t)h;
            }
            i += (size_t)want;
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
            o += jj_utf8_put((int32_t)cp, buf + o);
            break;
        }
        default:
            if (c >= '0' && c <= '7') {
                int v = c - '0', k = 1;
                while (k < 3 && i + 1 < end && s[i + 1] >= '0' && s[i + 1] <= '7') v = v * 8 + (s[++i] - '0'), k++;
                o += jj_utf8_put(v, buf + o);
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
        if (o + 1 >= sizeof buf) return jj_perr(P, start, "number literal too long");
        buf[o++] = s[i];
    }
    buf[o] = 0;
    tok t = {.t = flt ? T_FLOAT : T_INT, .off = start, .s = {s + start, p - start}};
    errno = 0;
    if (flt) {
        t.f = strtod(buf, NULL);
    } else {
        t.i = strtoll(buf, NULL, 10);
        if (errno == ERANGE) return jj_perr(P, start, "integer literal out of range");
    }
    *pos = p;
    return tok_push(P, t);
}

/* After a tag: `-` strips all following whitespace; otherwise trim_blocks drops one newline
 * after block and comment tags. Records whether the next text starts a line (lstrip_blocks). */
static void after_tag(parser *P, size_t *pos, bool *line_start, bool strip, bool trim) {
    size_t p = *pos;
    if (strip) {
        size_t e = jj_skip_space_fwd(P->s, p, P->n);
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
    if (strip_open) body = jj_skip_space_fwd(s, body, n);
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
        size_t te = strip_close ? jj_skip_space_back(s, body, k) : k;
        if (te > body && tok_push(P, (tok){.t = T_TEXT, .off = body, .s = {s + body, te - body}})) return -1;
        *pos = p;
        after_tag(P, pos, line_start, strip_after, !plus);
        return 0;
    }
    return jj_perr(P, q, "unclosed {%% raw %%} block (missing {%% endraw %%})");
}

int jj_lex(parser *P) {
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
                te = jj_skip_space_back(s, pos, te);
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
            if (e + 1 >= n) return jj_perr(P, q, "unclosed comment (missing '#}')");
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
                return jj_perr(P, q, block ? "unclosed tag (missing '%%}')" : "unclosed expression (missing '}}')");
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
                        return jj_perr(P, p, "unexpected byte 0x%02x in tag", (unsigned char)c);
                    return jj_perr(P, p, "unexpected character '%c' in tag", c);
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
