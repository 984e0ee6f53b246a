/* JSON Schema `pattern` automata (constrain/pattern.c) against PCRE2, an independent regex engine:
 * hand-checked examples, refused syntax, and random patterns over a small alphabet on which
 * PCRE2's semantics (UTF, ECMA-262's \u and \x escapes, `$` only at the end, `.` stopping at \r and
 * \n) equal ECMA-262's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/pattern.h"
#include "regex_oracle.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)((rng >> 33) % n);
}

static nx_pattern *compile(const char *re, int32_t min_len, int32_t max_len) {
    char err[200] = "";
    nx_pattern *p = nx_pattern_compile(re, strlen(re), min_len, max_len, err, sizeof err);
    if (!p) fprintf(stderr, "refused /%s/: %s\n", re, err);
    return p;
}

/* The automaton takes all of s and may end there. */
static bool dfa_matches(const nx_pattern *p, const char *s, size_t n) {
    uint16_t st = p->start;
    for (size_t i = 0; i < n && st; i++) st = nx_pattern_step(p, st, (uint8_t)s[i]);
    return st && p->accept[st];
}

static size_t code_points(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((uint8_t)s[i] & 0xC0) != 0x80;
    return c;
}

typedef struct example {
    const char *re;
    int32_t min, max;
    const char *s;
    bool match;
} example;

static void test_examples(void **state) {
    (void)state;
    static const example ex[] = {
        {"^[a-z]+$", 0, -1, "abc", true},
        {"^[a-z]+$", 0, -1, "", false},
        {"^[a-z]+$", 0, -1, "abC", false},
        {"b", 0, -1, "abc", true}, /* unanchored: anywhere */
        {"b", 0, -1, "ac", false},
        {"^\\d{3}-\\d{4}$", 0, -1, "555-1234", true},
        {"^\\d{3}-\\d{4}$", 0, -1, "555-123", false},
        {"^(ab|cd)*e?$", 0, -1, "abcdab", true},
        {"^(ab|cd)*e?$", 0, -1, "abce", false},
        {"^(?:x|y){2,3}$", 0, -1, "xyx", true},
        {"^(?:x|y){2,3}$", 0, -1, "xyxy", false},
        {"^.$", 0, -1, "\xe2\x82\xac", true},  /* one character, three bytes */
        {"^.$", 0, -1, "\n", false},
        {"^.$", 0, -1, "\xe2\x80\xa8", false}, /* U+2028 is a line terminator */
        {"^[^a]$", 0, -1, "\xf0\x9f\x98\x80", true},
        {"^[\\u00e0-\\u00ff]+$", 0, -1, "\xc3\xa9\xc3\xa0", true},
        {"^[\\u00e0-\\u00ff]+$", 0, -1, "\xc3\x9f", false},
        {"^\\u{1F600}$", 0, -1, "\xf0\x9f\x98\x80", true},
        {"^\\s\\S$", 0, -1, "\xe3\x80\x80x", true}, /* U+3000 is white space in ECMA-262 */
        {"^[\\w.-]+@[\\w-]+\\.[a-z]{2,}$", 0, -1, "a.b-c@d-e.org", true},
        {"^[\\w.-]+@[\\w-]+\\.[a-z]{2,}$", 0, -1, "a@b.c", false},
        {"^a|b$", 0, -1, "ax", true}, /* (^a)|(b$) */
        {"^a|b$", 0, -1, "xb", true},
        {"^a|b$", 0, -1, "xa", false},
        {"^x*$", 2, 3, "xx", true}, /* lengths from minLength / maxLength */
        {"^x*$", 2, 3, "x", false},
        {"^x*$", 2, 3, "xxxx", false},
        {"a", 0, 2, "\xc3\xa9" "a", true},
        {"a", 0, 2, "\xc3\xa9\xc3\xa9" "a", false},
        {"^a+?b??$", 0, -1, "aab", true},
    };
    for (size_t i = 0; i < sizeof ex / sizeof *ex; i++) {
        nx_pattern *p = compile(ex[i].re, ex[i].min, ex[i].max);
        assert_non_null(p);
        const bool got = dfa_matches(p, ex[i].s, strlen(ex[i].s));
        if (got != ex[i].match) fprintf(stderr, "/%s/ on \"%s\": %d\n", ex[i].re, ex[i].s, got);
        assert_int_equal(got, ex[i].match);
        nx_pattern_free(p);
    }
}

static void test_refused(void **state) {
    (void)state;
    static const char *const bad[][2] = {
        {"(a", "missing ')'"},
        {"a)", "unmatched ')'"},
        {"[a", "unterminated"},
        {"a{2", "malformed"},
        {"{2}", "nothing to repeat"},
        {"a**", "nothing to repeat"},
        {"a{3,1}", "out of order"},
        {"[z-a]", "out of order"},
        {"a{1001}", "above 1000"},
        {"(?=a)", "lookarounds"},
        {"(?<n>a)", "named groups"},
        {"(a)\\1", "backreferences"},
        {"\\bx", "word boundaries"},
        {"\\p{L}", "property escapes"},
        {"a^b", "'^'"},
        {"(a$)", "'$'"},
        {"\\q", "unknown escape"},
        {"a\\", "ends with a backslash"},
        {"[\\d-z]", "cannot bound a range"},
        {"\\x4", "two hex digits"},
        {"\\ud800", "surrogate"},
        {"]", "lone ']'"},
        {"\\-", "unknown escape"}, /* a hyphen is escaped only inside a class (u flag) */
        {"a[]", "matches no string"},
        {"^[\\x00-\\x07]$", "matches no string"}, /* only \u-escaped characters */
        {"^(a|b|c|d){1000}(a|b|c|d){1000}$", "too large"},
        {"(a|b)*a(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)", "too complex"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[200] = "";
        nx_pattern *p = nx_pattern_compile(bad[i][0], strlen(bad[i][0]), 0, -1, err, sizeof err);
        if (p || !strstr(err, bad[i][1])) fprintf(stderr, "/%s/: \"%s\"\n", bad[i][0], err);
        assert_null(p);
        assert_non_null(strstr(err, bad[i][1]));
    }
    char err[200] = "";
    assert_null(nx_pattern_compile("^abc$", 5, 4, 10, err, sizeof err)); /* "abc" is 3 long */
    assert_non_null(strstr(err, "length limits"));
}

/* The test alphabet: characters whose handling PCRE2 (as set up above) and ECMA-262 share. */
static const char *const ALPHA[] = {"a", "b", "c", "0", "1", "_", " ", "-", "\n", "\xc3\xa9", "\xe2\x82\xac",
                                    "\xf0\x9f\x98\x80"};
#define N_ALPHA (sizeof ALPHA / sizeof *ALPHA)

static void gen(char *re, size_t cap, int depth) {
    static const char *const atoms[] = {"a", "b", "c", "0", "-", "\\.", ".", "\\d", "\\w", "\\s", "\\D", "\\W",
                                        "[ab]", "[^a0]", "[a-c_]", "[0-9\\s]", "\xc3\xa9", "[\\u00e0-\\u20ac]",
                                        "[^\\n]", "\\n", " "};
    const uint32_t k = depth > 3 ? 0 : rnd(10);
    char a[600] = "", b[600] = "";
    switch (k) {
    case 0: case 1: case 2: case 3:
        snprintf(re + strlen(re), cap - strlen(re), "%s", atoms[rnd(sizeof atoms / sizeof *atoms)]);
        break;
    case 4: case 5:
        gen(a, sizeof a, depth + 1), gen(b, sizeof b, depth + 1);
        snprintf(re + strlen(re), cap - strlen(re), "%s%s", a, b);
        break;
    case 6:
        gen(a, sizeof a, depth + 1), gen(b, sizeof b, depth + 1);
        snprintf(re + strlen(re), cap - strlen(re), "(?:%s|%s)", a, b);
        break;
    default: {
        static const char *const quant[] = {"*", "+", "?", "{2}", "{0,2}", "{1,}", "*?", "{1,3}"};
        gen(a, sizeof a, depth + 1);
        snprintf(re + strlen(re), cap - strlen(re), "(%s)%s", a, quant[rnd(sizeof quant / sizeof *quant)]);
        break;
    }
    }
}

/* A random string of up to max_chars characters of the alphabet. */
static size_t rand_string(char *s, int max_chars) {
    size_t n = 0;
    const int len = (int)rnd((uint32_t)max_chars + 1);
    for (int i = 0; i < len; i++) {
        const char *c = ALPHA[rnd(N_ALPHA)];
        memcpy(s + n, c, strlen(c));
        n += strlen(c);
    }
    return n;
}

/* A walk through the automaton from its start, each byte drawn among those it allows, until it
 * stops at an accepting state: the automaton must never strand it (trimmed), and PCRE2 must
 * match what it accepts. Returns the length, or 0 when it had to give up. */
static size_t dfa_walk(const nx_pattern *p, char *s, size_t cap) {
    uint16_t st = p->start;
    size_t n = 0;
    for (;;) {
        if (p->accept[st] && (rnd(4) == 0 || n + 8 > cap)) return n;
        int allowed[256], na = 0;
        for (int b = 0; b < 256; b++)
            if (nx_pattern_step(p, st, (uint8_t)b)) allowed[na++] = b;
        assert_true(na > 0 || p->accept[st]); /* never stranded */
        if (na == 0) return n;
        if (n + 8 > cap) return 0;
        const int b = allowed[rnd((uint32_t)na)];
        s[n++] = (char)b;
        st = nx_pattern_step(p, st, (uint8_t)b);
    }
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const uint8_t c = (uint8_t)s[i];
        int k = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
        if (k < 0 || i + (size_t)k >= n + (k == 0)) return false;
        for (int j = 1; j <= k; j++)
            if (((uint8_t)s[i + (size_t)j] & 0xC0) != 0x80) return false;
        i += (size_t)k + 1;
    }
    return true;
}

static void test_against_pcre2(void **state) {
    (void)state;
    int patterns = 0, matched = 0, walked = 0;
    for (int t = 0; t < 1500; t++) {
        char body[1400] = "", re[1500];
        gen(body, sizeof body, 0);
        const uint32_t anchor = rnd(4);
        snprintf(re, sizeof re, "%s%s%s", anchor & 1 ? "^" : "", body, anchor & 2 ? "$" : "");
        const int32_t min = rnd(3) == 0 ? (int32_t)rnd(3) : 0, max = rnd(3) == 0 ? min + (int32_t)rnd(5) : -1;
        char err[200];
        nx_pattern *p = nx_pattern_compile(re, strlen(re), min, max, err, sizeof err);
        if (!p) { /* only when nothing within the lengths can match, or the automaton is too big */
            if (!strstr(err, "length limits") && !strstr(err, "too complex")) fprintf(stderr, "/%s/: %s\n", re, err);
            assert_true(strstr(err, "length limits") || strstr(err, "too complex"));
            continue;
        }
        patterns++;
        oracle o = oracle_new(re);
        for (int i = 0; i < 60; i++) {
            char s[64];
            const size_t n = rand_string(s, 8);
            const size_t cp = code_points(s, n);
            const int m = oracle_matches(&o, s, n);
            if (m < 0) continue;
            const bool want = m && (int32_t)cp >= min && (max < 0 || (int32_t)cp <= max);
            const bool got = dfa_matches(p, s, n);
            if (got != want) fprintf(stderr, "/%s/ [%d,%d] on \"%.*s\": automaton %d, PCRE2 %d\n", re, min, max, (int)n, s, got, want);
            assert_int_equal(got, want);
            matched += got;
        }
        for (int i = 0; i < 10; i++) {
            char s[256];
            const size_t n = dfa_walk(p, s, sizeof s);
            if (n == 0 && !p->accept[p->start]) continue;
            const size_t cp = code_points(s, n);
            const int m = oracle_matches(&o, s, n);
            if (m < 0) continue;
            const bool ok = valid_utf8(s, n) && m && (int32_t)cp >= min &&
                            (max < 0 || (int32_t)cp <= max);
            if (!ok) fprintf(stderr, "/%s/ [%d,%d]: the automaton accepts \"%.*s\"\n", re, min, max, (int)n, s);
            assert_true(ok);
            walked++;
        }
        oracle_free(&o);
        nx_pattern_free(p);
    }
    if (!(patterns > 1000 && matched > 5000 && walked > 8000))
        fprintf(stderr, "patterns %d matched %d walked %d\n", patterns, matched, walked);
    assert_true(patterns > 1000 && matched > 5000 && walked > 8000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_against_pcre2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
