/* PCRE2 as the independent engine the JSON Schema `pattern` tests check against, set up to read
 * patterns as ECMA-262 (with the u flag) does: UTF, \uHHHH / \u{H...} / \xHH escapes, `$` only at
 * the very end, `.` stopping at \r and \n (the tests keep U+2028 / U+2029 out of `.`'s way), and
 * \s / \S spelled out as ECMA-262's white space. Header-only; each test binary includes it once,
 * after cmocka. */
#ifndef NX_TESTS_REGEX_ORACLE_H
#define NX_TESTS_REGEX_ORACLE_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stdio.h>

typedef struct oracle {
    pcre2_code *re;
    pcre2_match_data *md;
} oracle;

/* re for PCRE2: \s and \S spelled out as ECMA-262's white space (PCRE2 10.42 without UCP knows only
 * the ASCII ones; with UCP its \d and \w would grow too). */
static void ecma_spaces(const char *re, char *out, size_t cap) {
    static const char SP[] = "\\t-\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff";
    size_t n = 0;
    bool in_class = false;
    for (const char *p = re; *p && n + sizeof SP + 8 < cap; p++) {
        if (p[0] == '\\' && (p[1] == 's' || p[1] == 'S') && !(in_class && p[1] == 'S')) {
            n += (size_t)snprintf(out + n, cap - n, in_class ? "%s" : p[1] == 's' ? "[%s]" : "[^%s]", SP);
            p++;
            continue;
        }
        if (p[0] == '\\' && p[1]) {
            out[n++] = *p++;
        } else if (*p == '[') {
            in_class = true;
        } else if (*p == ']') {
            in_class = false;
        }
        out[n++] = *p;
    }
    out[n] = 0;
}

static oracle oracle_new(const char *ecma_re) {
    char re[8192];
    ecma_spaces(ecma_re, re, sizeof re);
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    pcre2_set_newline(cc, PCRE2_NEWLINE_ANYCRLF);
    pcre2_set_compile_extra_options(cc, PCRE2_EXTRA_ALT_BSUX); /* \uHHHH, \u{H...}, \xHH as in ECMA-262 */
    int ec;
    PCRE2_SIZE off;
    oracle o = {pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX, &ec, &off, cc),
                NULL};
    pcre2_compile_context_free(cc);
    if (!o.re) fprintf(stderr, "PCRE2 refused /%s/\n", re);
    assert_non_null(o.re);
    o.md = pcre2_match_data_create_from_pattern(o.re, NULL);
    return o;
}

/* 1 match, 0 none, -1 PCRE2 gave up (its backtracking limit, on nested quantifiers). */
static int oracle_matches(const oracle *o, const char *s, size_t n) {
    const int rc = pcre2_match(o->re, (PCRE2_SPTR)s, n, 0, 0, o->md, NULL);
    return rc >= 0 ? 1 : rc == PCRE2_ERROR_NOMATCH ? 0 : -1;
}

static void oracle_free(oracle *o) {
    pcre2_match_data_free(o->md);
    pcre2_code_free(o->re);
}

#endif
