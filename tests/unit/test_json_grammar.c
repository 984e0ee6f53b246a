/* JSON mode: the recogniser against jansson (an independent, strict JSON parser) on a corpus, on
 * invalid documents, on mutations of the corpus and on random walks the recogniser itself
 * drives; the token mask on a small vocabulary; and the sampler's masked distribution. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/json_grammar.h"
#include "nextn.h"
#include "regex_oracle.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)((rng >> 33) % n);
}

static const char *const corpus[] = {
    "{}",
    "{\"a\":1}",
    "{\n  \"key\" : \"value\" ,\"n\":-0.5e+10, \"z\":0, \"e\":1E5 }",
    "{\"arr\":[1,2,[3,[]],{\"x\":null}],\"t\":true,\"f\":false}",
    "{\"esc\":\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t \\u00e9 \\u4e2d\"}",
    "{\"utf8\":\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\xed\x9f\xbf\xef\xbf\xbd\"}",
    "{\"deep\":[[[[[[[[[[{\"a\":[{}]}]]]]]]]]]]}",
    "{\"nums\":[0,-0,0.0,12.5e-3,-7E+2,100]}",
    "{\"\":\"\",\"k\":[\"\",[],{}]}",
};

/* Whether the recogniser takes all of doc and ends complete; *died_at = the refused byte's index
 * (or len when all were taken). */
static bool accepts(const char *doc, size_t len, size_t *died_at) {
    nx_json_state s;
    nx_json_init(&s);
    for (size_t i = 0; i < len; i++)
        if (!nx_json_step(&s, (uint8_t)doc[i])) {
            if (died_at) *died_at = i;
            return false;
        }
    if (died_at) *died_at = len;
    return nx_json_complete(&s);
}

/* jansson's verdict: one object, the whole text. Numbers beyond a double's range are a limit of
 * jansson's (it refuses them), not of JSON: *overflow reports them. */
static bool jansson_object(const char *doc, size_t len, bool *overflow) {
    json_error_t e;
    json_t *v = json_loadb(doc, len, JSON_DECODE_INT_AS_REAL, &e);
    if (overflow) *overflow = !v && strstr(e.text, "overflow");
    bool ok = v && json_is_object(v);
    json_decref(v);
    return ok;
}

/* What the recogniser refuses on purpose although JSON allows it (json_grammar.h). */
static bool outside_profile(const char *doc, size_t len) {
    int ws = 0, depth = 0, maxdepth = 0;
    for (size_t i = 0; i < len; i++) {
        const char c = doc[i];
        ws = (c == ' ' || c == '\t' || c == '\n' || c == '\r') ? ws + 1 : 0;
        if (ws > NX_JSON_MAX_WS) return true;
        if (c == '\\' && i + 1 < len && doc[i + 1] == 'u') return true;
        if (c == '{' || c == '[') depth++;
        if (c == '}' || c == ']') depth--;
        if (depth > maxdepth) maxdepth = depth;
    }
    /* nothing before the opening brace or after the closing one, whitespace included */
    const char first = len ? doc[0] : 0, last = len ? doc[len - 1] : 0;
    return maxdepth > NX_JSON_MAX_DEPTH || last == ' ' || last == '\t' || last == '\n' || last == '\r' ||
           first == ' ' || first == '\t' || first == '\n' || first == '\r';
}

static void test_corpus(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof corpus / sizeof *corpus; i++) {
        const size_t len = strlen(corpus[i]);
        assert_true(jansson_object(corpus[i], len, NULL));
        size_t at = 0;
        if (!accepts(corpus[i], len, &at)) fprintf(stderr, "refused: %s (at %zu)\n", corpus[i], at);
        assert_true(accepts(corpus[i], len, NULL));
        /* every proper prefix is alive and not complete */
        for (size_t k = 0; k < len; k++) {
            nx_json_state s;
            nx_json_init(&s);
            assert_true(nx_json_feed(&s, (const uint8_t *)corpus[i], k));
            if (k > 0 && corpus[i][k - 1] != '}') assert_false(nx_json_complete(&s));
        }
    }
}

static void test_invalid(void **state) {
    (void)state;
    static const char *const bad[] = {
        "", "{", "[1]", "\"s\"", "1", "{\"a\"}", "{\"a\":}", "{\"a\":01}", "{\"a\":-}", "{\"a\":1.}", "{\"a\":1e}",
        "{\"a\":.5}", "{\"a\":+1}", "{\"a\":tru}", "{\"a\":nul}", "{\"a\":True}", "{\"a\":\"\\x\"}", "{\"a\":\"\x01\"}",
        "{} ", " {}", "\n{}", "{}{}", "{\"a\":1,}", "{,}", "{\"a\":[1,]}", "{\"a\":[,1]}", "{\"a\" 1}", "{'a':1}", "{a:1}",
        "{\"a\":\"\\ud800\"}", "{\"a\":\"\\u0000\"}", "{\"a\":\"\\u12\"}", "{\"a\":\"\xc0\x80\"}",
        "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xf5\x80\x80\x80\"}", "{\"a\":\"\xe4\xb8\"}", "{\"a\":\"\x80\"}",
        "{\"a\":[}", "{\"a\":{]}", "{\"a\":1]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const size_t len = strlen(bad[i]);
        assert_false(accepts(bad[i], len, NULL));
    }
    /* nesting and whitespace stop at their limits */
    char deep[200] = "{\"a\":", ws[64] = "{";
    size_t n = strlen(deep);
    for (int d = 1; d < NX_JSON_MAX_DEPTH; d++) deep[n++] = '[';
    nx_json_state s;
    nx_json_init(&s);
    assert_true(nx_json_feed(&s, (const uint8_t *)deep, n));
    assert_false(nx_json_step(&s, '['));
    memset(ws + 1, ' ', NX_JSON_MAX_WS); /* inside the object */
    nx_json_init(&s);
    assert_true(nx_json_feed(&s, (const uint8_t *)ws, 1 + NX_JSON_MAX_WS));
    assert_false(nx_json_step(&s, ' '));
    /* a dead state stays dead */
    nx_json_init(&s);
    assert_false(nx_json_step(&s, 'x'));
    assert_false(nx_json_step(&s, '{'));
}

/* Mutations of the corpus: the recogniser's verdict is jansson's, inside the profile. */
static void test_mutations(void **state) {
    (void)state;
    static const char alphabet[] = "{}[]:,\"\\ 0123456789.eE+-tfnulrsa\xc3\xa9\x01";
    int agree_yes = 0, agree_no = 0;
    for (int trial = 0; trial < 40000; trial++) {
        const char *src = corpus[rnd(sizeof corpus / sizeof *corpus)];
        char doc[256];
        size_t len = strlen(src);
        memcpy(doc, src, len);
        for (int m = 0, nm = 1 + (int)rnd(3); m < nm; m++) {
            const uint32_t op = rnd(3), at = rnd((uint32_t)len + 1);
            const char c = alphabet[rnd(sizeof alphabet - 1)];
            if (op == 0 && at < len) doc[at] = c;
            else if (op == 1 && len < sizeof doc - 1) memmove(doc + at + 1, doc + at, len - at), doc[at] = c, len++;
            else if (op == 2 && at < len) memmove(doc + at, doc + at + 1, len - at - 1), len--;
        }
        bool overflow = false;
        const bool ours = accepts(doc, len, NULL), theirs = jansson_object(doc, len, &overflow);
        if (ours && !theirs && overflow) continue;
        if (!ours && theirs && outside_profile(doc, len)) continue;
        if (ours != theirs) fprintf(stderr, "disagree (ours %d): %.*s\n", ours, (int)len, doc);
        assert_int_equal(ours, theirs);
        ours ? agree_yes++ : agree_no++;
    }
    assert_true(agree_yes > 1000 && agree_no > 1000); /* both verdicts were exercised */
}

/* Feeds s random bytes it allows (a live state always allows one) until it completes or cap
 * bytes are written to doc; past `after` bytes, odds-1 times in odds it takes the first allowed
 * byte of `prefer` (the bytes that end things) instead. Returns the bytes written. */
static size_t random_walk(nx_json_state *s, char *doc, size_t cap, size_t after, uint32_t odds, const char *prefer) {
    size_t len = 0;
    while (!nx_json_complete(s) && len < cap) {
        uint8_t ok[256];
        int n_ok = 0;
        for (int c = 0; c < 256; c++) {
            nx_json_state t;
            nx_json_copy(&t, s);
            if (nx_json_step(&t, (uint8_t)c)) ok[n_ok++] = (uint8_t)c;
        }
        assert_true(n_ok > 0);
        uint8_t c = ok[rnd((uint32_t)n_ok)];
        if (len > after && rnd(odds))
            for (int i = 0; i < n_ok; i++)
                if (strchr(prefer, ok[i]) && ok[i]) {
                    c = ok[i];
                    break;
                }
        assert_true(nx_json_step(s, c));
        doc[len++] = (char)c;
    }
    return len;
}

/* Random walks driven by the recogniser (any byte it allows, closing more often as the text
 * grows): every document it completes is a JSON object for jansson. */
static void test_random_walks(void **state) {
    (void)state;
    int completed = 0;
    for (int walk = 0; walk < 3000; walk++) {
        char doc[600];
        nx_json_state s;
        nx_json_init(&s);
        const size_t len = random_walk(&s, doc, sizeof doc, 40, 2, "\"}]1");
        if (!nx_json_complete(&s)) continue;
        completed++;
        bool overflow = false;
        const bool theirs = jansson_object(doc, len, &overflow);
        if (!theirs && !overflow) fprintf(stderr, "jansson refuses: %.*s\n", (int)len, doc);
        assert_true(theirs || overflow);
    }
    assert_true(completed > 1000);
}

/* The mask over a small vocabulary, and through the sampler. */
enum { TV = 10, T_END = 9 };
static const char *const toks[TV] = {"{", "}", "\"a\"", ":", "1", " ", "{\"", "x", NULL, NULL};

static nx_json_vocab *small_vocab(void) {
    size_t lens[TV];
    for (int i = 0; i < TV; i++) lens[i] = toks[i] ? strlen(toks[i]) : 0;
    const int32_t end = T_END;
    nx_json_vocab *v = NULL;
    assert_int_equal(nx_json_vocab_from_bytes(toks, lens, TV, &end, 1, &v, NULL), NX_OK);
    return v;
}

static void test_mask(void **state) {
    (void)state;
    nx_json_vocab *v = small_vocab();
    uint8_t allow[TV + 2];
    nx_json_state s;
    nx_json_init(&s);
    nx_json_allowed(v, &s, TV + 2, allow);
    const uint8_t start[TV + 2] = {1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0}; /* "{", "{\"" */
    assert_memory_equal(allow, start, sizeof start);
    assert_true(nx_json_feed(&s, (const uint8_t *)"{\"a\":1", 6));
    nx_json_allowed(v, &s, TV, allow);
    const uint8_t mid[TV] = {0, 1, 0, 0, 1, 1, 0, 0, 0, 0}; /* "}", "1", " " */
    assert_memory_equal(allow, mid, sizeof mid);
    assert_true(nx_json_step(&s, '}'));
    nx_json_allowed(v, &s, TV, allow);
    const uint8_t done[TV] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1}; /* only the end token */
    assert_memory_equal(allow, done, sizeof done);
    /* bad arguments */
    nx_json_vocab *w = NULL;
    const int32_t bad_end = TV;
    size_t lens[TV] = {0};
    nx_error err = {0};
    assert_int_equal(nx_json_vocab_from_bytes(toks, lens, TV, &bad_end, 1, &w, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "end token"));
    nx_json_vocab_free(v);
}

/* The sampler's distribution under the mask: the allowed tokens keep their relative weights
 * (softmax over them alone), the others get 0; the history and the extra tokens move the state;
 * rewind restores it; json_wait starts the mask after its token. */
static void test_sampler_mask(void **state) {
    (void)state;
    nx_json_vocab *v = small_vocab();
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.json = v;
    nx_sampler *s = NULL;
    assert_int_equal(nx_sampler_new(&p, TV + 2, &s, NULL), NX_OK);
    float logits[TV + 2], probs[TV + 2];
    for (int i = 0; i < TV + 2; i++) logits[i] = 0.3f * (float)i - 1.0f;
    nx_sampler_probs(s, logits, NULL, 0, probs);
    double z = exp(logits[0]) + exp(logits[6]);
    for (int i = 0; i < TV + 2; i++) {
        const double want = (i == 0 || i == 6) ? exp(logits[i]) / z : 0.0;
        assert_true(fabs(probs[i] - want) < 1e-6);
    }
    nx_sampler_accept(s, 0); /* "{" */
    nx_sampler_accept(s, 2); /* "\"a\"" */
    const int32_t extra[2] = {3, 4}; /* ":" "1" */
    nx_sampler_probs(s, logits, extra, 2, probs);
    for (int i = 0; i < TV + 2; i++) assert_true((probs[i] > 0) == (i == 1 || i == 4 || i == 5));
    nx_sampler_accept(s, 3);
    nx_sampler_accept(s, 4);
    nx_sampler_accept(s, 1); /* "}": complete */
    nx_sampler_probs(s, logits, NULL, 0, probs);
    for (int i = 0; i < TV + 2; i++) assert_true((probs[i] > 0) == (i == T_END));
    nx_sampler_rewind(s, 1); /* back to "{" */
    nx_sampler_probs(s, logits, NULL, 0, probs);
    for (int i = 0; i < TV + 2; i++) assert_true((probs[i] > 0) == (i == 1 || i == 2 || i == 5));
    nx_sampler_free(s);
    /* json_wait: free sampling until token 7 ("x"), then the mask from the start */
    p.json_wait = true;
    p.json_after = 7;
    assert_int_equal(nx_sampler_new(&p, TV + 2, &s, NULL), NX_OK);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    for (int i = 0; i < TV + 2; i++) assert_true(probs[i] > 0);
    nx_sampler_accept(s, 4);
    nx_sampler_accept(s, 7);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    for (int i = 0; i < TV + 2; i++) assert_true((probs[i] > 0) == (i == 0 || i == 6));
    nx_sampler_free(s);
    nx_json_vocab_free(v);
}

/* A long-lived sampler (whose masks come from its cache of recent states) and a fresh one fed
 * the same history give the same distribution at every step of random walks through a
 * vocabulary of fragments, with extra tokens and rewinds. */
static void test_mask_cache(void **state) {
    (void)state;
    static const char *const frag[] = {"{", "}", "[", "]", ",", ":", "\"", "\"k\"", "ab", "1", "0.", "e5", "-", " ",
                                       "true", "null", "\"x\":", "{\"", "\"}", "2,", "]}", "\\n", "\xc3", "\xa9", NULL};
    enum { NV = sizeof frag / sizeof *frag };
    size_t lens[NV];
    for (int i = 0; i < NV; i++) lens[i] = frag[i] ? strlen(frag[i]) : 0;
    const int32_t end = NV - 1;
    nx_json_vocab *v = NULL;
    assert_int_equal(nx_json_vocab_from_bytes(frag, lens, NV, &end, 1, &v, NULL), NX_OK);
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.json = v;
    float logits[NV], a[NV], b[NV];
    for (int walk = 0; walk < 200; walk++) {
        nx_sampler *s = NULL;
        assert_int_equal(nx_sampler_new(&p, NV, &s, NULL), NX_OK);
        int32_t hist[80];
        size_t n = 0;
        for (int step = 0; step < 80; step++) {
            for (int i = 0; i < NV; i++) logits[i] = (float)rnd(1000) / 300.0f;
            const int32_t extra[1] = {(int32_t)rnd(NV)};
            const size_t n_extra = rnd(3) == 0;
            nx_sampler_probs(s, logits, extra, n_extra, a);
            nx_sampler *f = NULL;
            assert_int_equal(nx_sampler_new(&p, NV, &f, NULL), NX_OK);
            for (size_t i = 0; i < n; i++) nx_sampler_accept(f, hist[i]);
            nx_sampler_probs(f, logits, extra, n_extra, b);
            nx_sampler_free(f);
            assert_memory_equal(a, b, sizeof a);
            if (n > 0 && rnd(10) == 0) { /* back a few tokens */
                n -= 1 + rnd((uint32_t)n);
                nx_sampler_rewind(s, n);
                continue;
            }
            nx_sampler_probs(s, logits, NULL, 0, a);
            const int32_t id = nx_sampler_draw(s, a);
            if (id == end) break;
            nx_sampler_accept(s, id);
            hist[n++] = id;
        }
        nx_sampler_free(s);
    }
    nx_json_vocab_free(v);
}

/* ---------------------------------------------------------------- schemas */

static const char *const SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"contentMediaType\":\"text/plain\"},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":3},"
    "\"kind\":{\"enum\":[\"a\",\"bc\",null,true]},\"extra\":{\"type\":\"object\"},"
    "\"score\":{\"type\":[\"number\",\"null\"],\"description\":\"ignored\"},"
    "\"pts\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},"
    "\"y\":{\"type\":\"boolean\"}},\"required\":[\"y\"]},\"minItems\":1}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

/* Definitions and references (a recursive one too), anyOf / oneOf with branches of different
 * kinds, a one-schema allOf: the shapes Pydantic's model_json_schema() writes. */
static const char *const SCHEMA_DEFS =
    "{\"$defs\":{"
    "\"Node\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/Node\"},\"maxItems\":2}},"
    "\"required\":[\"name\"],\"additionalProperties\":false},"
    "\"Color\":{\"enum\":[\"red\",\"green\"],\"title\":\"Color\",\"readOnly\":true,\"writeOnly\":false},"
    "\"Unused\":{\"pattern\":\"never compiled\"}},"
    "\"type\":\"object\",\"properties\":{"
    "\"root\":{\"$ref\":\"#/$defs/Node\"},"
    "\"color\":{\"anyOf\":[{\"$ref\":\"#/$defs/Color\"},{\"type\":\"null\"}],\"default\":null},"
    "\"n\":{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"boolean\"}}},"
    "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"boolean\"},{\"type\":\"string\"}]},\"maxItems\":3}]},"
    "\"w\":{\"allOf\":[{\"$ref\":\"#/definitions/Flag\"}],\"description\":\"d\",\"deprecated\":true},"
    "\"self\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}},"
    "\"definitions\":{\"Flag\":{\"type\":\"boolean\"}},"
    "\"required\":[\"root\"],\"additionalProperties\":false}";

static nx_json_schema *schema_of(const char *text) {
    nx_json_schema *sc = NULL;
    nx_error err = {0};
    if (nx_json_schema_new(text, strlen(text), &sc, &err) != NX_OK) fprintf(stderr, "schema: %s\n", err.msg);
    assert_non_null(sc);
    return sc;
}

/* The automaton takes every byte of doc (a prefix of a document). */
static bool prefix_ok(const nx_json_schema *sc, const char *doc) {
    nx_json_state s;
    nx_json_init_schema(&s, sc);
    return nx_json_feed(&s, (const uint8_t *)doc, strlen(doc));
}

static bool schema_accepts(const nx_json_schema *sc, const char *doc) {
    nx_json_state s;
    nx_json_init_schema(&s, sc);
    return nx_json_feed(&s, (const uint8_t *)doc, strlen(doc)) && nx_json_complete(&s);
}

/* Whether PCRE2 (regex_oracle.h) finds re in the string s. */
static bool pcre2_finds(const char *re, const char *s, size_t n) {
    oracle o = oracle_new(re);
    const int m = oracle_matches(&o, s, n);
    oracle_free(&o);
    assert_true(m >= 0);
    return m == 1;
}

/* Formats, checked by hand (calendar arithmetic, inet_pton), not by the patterns the automaton
 * uses for them. */
static bool digits_at(const char *s, int n) {
    for (int i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i])) return false;
    return true;
}

static bool date_ok(const char *s) {
    if (strlen(s) != 10 || !digits_at(s, 4) || s[4] != '-' || !digits_at(s + 5, 2) || s[7] != '-' || !digits_at(s + 8, 2))
        return false;
    const int y = atoi(s), m = atoi(s + 5), d = atoi(s + 8);
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    const bool leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    return m >= 1 && m <= 12 && d >= 1 && d <= days[m - 1] + (m == 2 && leap);
}

static bool time_ok(const char *s) {
    if (strlen(s) < 9 || !digits_at(s, 2) || s[2] != ':' || !digits_at(s + 3, 2) || s[5] != ':' || !digits_at(s + 6, 2))
        return false;
    if (atoi(s) > 23 || atoi(s + 3) > 59 || atoi(s + 6) > 59) return false;
    const char *p = s + 8;
    if (*p == '.') {
        const char *q = ++p;
        while (isdigit((unsigned char)*p)) p++;
        if (p == q) return false;
    }
    if (!strcmp(p, "Z") || !strcmp(p, "z")) return true;
    return (p[0] == '+' || p[0] == '-') && strlen(p) == 6 && digits_at(p + 1, 2) && p[3] == ':' && digits_at(p + 4, 2) &&
           atoi(p + 1) <= 23 && atoi(p + 4) <= 59;
}

static bool format_ok(const char *fmt, const char *s) {
    if (!strcmp(fmt, "date")) return date_ok(s);
    if (!strcmp(fmt, "time")) return time_ok(s);
    if (!strcmp(fmt, "date-time")) {
        char d[11];
        if (strlen(s) < 11 || (s[10] != 'T' && s[10] != 't')) return false;
        memcpy(d, s, 10), d[10] = 0;
        return date_ok(d) && time_ok(s + 11);
    }
    if (!strcmp(fmt, "uuid")) {
        if (strlen(s) != 36) return false;
        for (int i = 0; i < 36; i++)
            if ((i == 8 || i == 13 || i == 18 || i == 23) ? s[i] != '-' : !isxdigit((unsigned char)s[i])) return false;
        return true;
    }
    if (!strcmp(fmt, "ipv4")) {
        struct in_addr a;
        return inet_pton(AF_INET, s, &a) == 1;
    }
    if (!strcmp(fmt, "ipv6")) {
        struct in6_addr a;
        return inet_pton(AF_INET6, s, &a) == 1;
    }
    if (!strcmp(fmt, "hostname")) { /* RFC 1123: dot-separated labels of 1-63, 253 in all */
        const size_t n = strlen(s);
        if (n == 0 || n > 253) return false;
        for (const char *l = s;;) {
            const char *e = strchr(l, '.');
            const size_t len = e ? (size_t)(e - l) : strlen(l);
            if (len == 0 || len > 63 || l[0] == '-' || l[len - 1] == '-') return false;
            for (size_t i = 0; i < len; i++)
                if (!isalnum((unsigned char)l[i]) && l[i] != '-') return false;
            if (!e) return true;
            l = e + 1;
        }
    }
    if (!strcmp(fmt, "duration")) { /* P[nY][nM][nD][T[nH][nM][nS]] with a part, or PnW */
        if (s[0] != 'P' || !s[1]) return false;
        const char *p = s + 1, *units = "YMD";
        int parts = 0;
        if (p[strspn(p, "0123456789")] == 'W') return p[0] != 'W' && !p[strspn(p, "0123456789") + 1];
        for (bool time = false;;) {
            if (*p == 'T' && !time) {
                time = true, units = "HMS", p++;
                if (!*p) return false; /* a T with nothing after it */
                continue;
            }
            if (!*p) return parts > 0;
            const size_t d = strspn(p, "0123456789");
            const char *u = d ? strchr(units, p[d]) : NULL;
            if (!u || !p[d]) return false;
            units = u + 1, p += d + 1, parts++;
        }
    }
    if (!strcmp(fmt, "email")) {
        const char *at = strchr(s, '@'), *dot = at ? strrchr(at, '.') : NULL;
        if (!at || at == s || strchr(at + 1, '@') || !dot || dot == at + 1 || strlen(dot + 1) < 2) return false;
        for (const char *p = dot + 1; *p; p++)
            if (!isalpha((unsigned char)*p)) return false;
        return s[0] != '.' && at[-1] != '.' && !strstr(s, "..");
    }
    return false;
}

/* An independent check of a parsed value against the schema's JSON (the subset's meaning, per
 * value, as a validator reads it; nothing shared with the automaton). root: for $ref. */
static bool valid_in(json_t *root, json_t *sc, json_t *v) {
    if (json_is_true(sc)) return true;
    json_t *ref = json_object_get(sc, "$ref");
    if (ref) {
        const char *r = json_string_value(ref);
        if (!strcmp(r, "#")) return valid_in(root, root, v);
        const bool defs = !strncmp(r, "#/$defs/", 8);
        return valid_in(root, json_object_get(json_object_get(root, defs ? "$defs" : "definitions"), r + (defs ? 8 : 14)), v);
    }
    json_t *anyof = json_object_get(sc, "anyOf"), *one = json_object_get(sc, "oneOf"), *all = json_object_get(sc, "allOf");
    if (anyof || one) {
        int hits = 0;
        for (size_t i = 0; i < json_array_size(anyof ? anyof : one); i++) hits += valid_in(root, json_array_get(anyof ? anyof : one, i), v);
        return anyof ? hits > 0 : hits == 1;
    }
    for (size_t i = 0; i < json_array_size(all); i++)
        if (!valid_in(root, json_array_get(all, i), v)) return false;
    json_t *en = json_object_get(sc, "enum"), *cn = json_object_get(sc, "const");
    if (cn && !json_equal(cn, v)) return false;
    if (en) {
        bool any = false;
        for (size_t i = 0; i < json_array_size(en); i++) any |= json_equal(json_array_get(en, i), v);
        if (!any) return false;
    }
    json_t *type = json_object_get(sc, "type");
    if (type) {
        bool ok = false;
        for (size_t i = 0; i < (json_is_array(type) ? json_array_size(type) : 1); i++) {
            const char *t = json_string_value(json_is_array(type) ? json_array_get(type, i) : type);
            ok |= (!strcmp(t, "object") && json_is_object(v)) || (!strcmp(t, "array") && json_is_array(v)) ||
                  (!strcmp(t, "string") && json_is_string(v)) || (!strcmp(t, "integer") && json_is_integer(v)) ||
                  (!strcmp(t, "number") && json_is_number(v)) || (!strcmp(t, "boolean") && json_is_boolean(v)) ||
                  (!strcmp(t, "null") && json_is_null(v));
        }
        if (!ok) return false;
    }
    json_t *props = json_object_get(sc, "properties"), *addl = json_object_get(sc, "additionalProperties");
    json_t *pnames = json_object_get(sc, "propertyNames"), *minp = json_object_get(sc, "minProperties"),
           *maxp = json_object_get(sc, "maxProperties");
    if (json_is_object(v)) {
        if (minp && json_object_size(v) < (size_t)json_integer_value(minp)) return false;
        if (maxp && json_object_size(v) > (size_t)json_integer_value(maxp)) return false;
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            json_t *ks = json_string(k);
            const bool ok = !pnames || valid_in(root, pnames, ks);
            json_decref(ks);
            if (!ok) return false;
        }
    }
    json_t *pprops = json_object_get(sc, "patternProperties");
    if (json_is_object(v) && pprops) {
        const char *pk, *k;
        json_t *ps, *x;
        json_object_foreach(pprops, pk, ps) json_object_foreach(v, k, x) if (pcre2_finds(pk, k, strlen(k)) && !valid_in(root, ps, x)) return false;
    }
    if (json_is_object(v) && json_is_object(addl)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) if (!valid_in(root, addl, x)) return false;
    }
    if (json_is_object(v) && props) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            json_t *ps = json_object_get(props, k);
            if (!ps || !valid_in(root, ps, x)) return false;
        }
        json_t *req = json_object_get(sc, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i)))) return false;
    }
    if (json_is_number(v)) {
        const double x = json_number_value(v);
        json_t *b;
        if ((b = json_object_get(sc, "minimum")) && x < json_number_value(b)) return false;
        if ((b = json_object_get(sc, "maximum")) && x > json_number_value(b)) return false;
        if ((b = json_object_get(sc, "exclusiveMinimum")) && x <= json_number_value(b)) return false;
        if ((b = json_object_get(sc, "exclusiveMaximum")) && x >= json_number_value(b)) return false;
    }
    if (json_is_string(v)) { /* lengths in code points: the bytes that do not continue a UTF-8 sequence */
        json_t *mn = json_object_get(sc, "minLength"), *mx = json_object_get(sc, "maxLength");
        const char *str = json_string_value(v);
        json_int_t n = 0;
        for (size_t i = 0; i < json_string_length(v); i++) n += ((uint8_t)str[i] & 0xC0) != 0x80;
        if ((mn && n < json_integer_value(mn)) || (mx && n > json_integer_value(mx))) return false;
        json_t *pat = json_object_get(sc, "pattern");
        if (pat && !pcre2_finds(json_string_value(pat), str, json_string_length(v))) return false;
        json_t *fmt = json_object_get(sc, "format");
        if (fmt && !format_ok(json_string_value(fmt), str)) return false;
    }
    if (json_is_array(v)) {
        json_t *items = json_object_get(sc, "items"), *mn = json_object_get(sc, "minItems"),
               *mx = json_object_get(sc, "maxItems");
        if (mn && json_array_size(v) < (size_t)json_integer_value(mn)) return false;
        if (mx && json_array_size(v) > (size_t)json_integer_value(mx)) return false;
        if (json_is_true(json_object_get(sc, "uniqueItems")))
            for (size_t i = 0; i < json_array_size(v); i++)
                for (size_t k = i + 1; k < json_array_size(v); k++)
                    if (json_equal(json_array_get(v, i), json_array_get(v, k))) return false;
        for (size_t i = 0; items && i < json_array_size(v); i++)
            if (!valid_in(root, items, json_array_get(v, i))) return false;
    }
    return true;
}

static bool valid(json_t *sc, json_t *v) { return valid_in(sc, sc, v); }

/* `walks` random walks under sc, closing more often past `after` bytes: every completed document
 * must parse (an integer too large for jansson aside) and satisfy the independent check against
 * the schema's text; visit counts what each reached. Returns how many completed. */
static int schema_walks(nx_json_schema *sc, const char *schema, int walks, size_t after,
                        void (*visit)(json_t *, int *), int *counts) {
    json_t *sj = json_loads(schema, 0, NULL);
    assert_non_null(sj);
    int completed = 0;
    for (int walk = 0; walk < walks; walk++) {
        char doc[1200];
        nx_json_state s;
        nx_json_init_schema(&s, sc);
        const size_t len = random_walk(&s, doc, sizeof doc, after, 3, "\"}]nt");
        if (!nx_json_complete(&s)) continue;
        completed++;
        json_error_t e;
        json_t *v = json_loadb(doc, len, 0, &e);
        if (!v && strstr(e.text, "overflow")) continue;
        if (!v || !valid(sj, v)) fprintf(stderr, "invalid: %.*s\n", (int)len, doc);
        assert_non_null(v);
        assert_true(valid(sj, v));
        visit(v, counts);
        json_decref(v);
    }
    json_decref(sj);
    return completed;
}

/* At least min_completed walks completed and each of the k things counted was reached more than
 * 3 times (printed otherwise). */
static void assert_walks_reached(int completed, int min_completed, const int *n, int k) {
    bool reached = completed >= min_completed;
    for (int i = 0; i < k; i++) reached = reached && n[i] > 3;
    if (!reached) {
        fprintf(stderr, "completed %d (at least %d wanted), reached", completed, min_completed);
        for (int i = 0; i < k; i++) fprintf(stderr, " %d", n[i]);
        fprintf(stderr, "\n");
    }
    assert_true(reached);
}

static void visit_defs(json_t *v, int *n) {
    json_t *kids = json_object_get(json_object_get(v, "root"), "kids"), *x = json_object_get(v, "n");
    n[0] += json_array_size(kids) > 0 && json_object_get(json_array_get(kids, 0), "kids") != NULL;
    n[1] += json_is_object(x), n[2] += json_is_array(x), n[3] += json_is_integer(x);
    n[4] += json_is_string(json_object_get(v, "color"));
    n[5] += json_is_object(json_object_get(v, "self"));
}

/* The schema takes every document of good and none of bad. */
static void accepts_exactly(const nx_json_schema *sc, const char *const *good, size_t n_good, const char *const *bad,
                            size_t n_bad) {
    for (size_t i = 0; i < n_good; i++) {
        if (!schema_accepts(sc, good[i])) fprintf(stderr, "refused: %s\n", good[i]);
        assert_true(schema_accepts(sc, good[i]));
    }
    for (size_t i = 0; i < n_bad; i++) {
        if (schema_accepts(sc, bad[i])) fprintf(stderr, "accepted: %s\n", bad[i]);
        assert_false(schema_accepts(sc, bad[i]));
    }
}

static void test_schema_examples(void **state) {
    (void)state;
    nx_json_schema *sc = schema_of(SCHEMA);
    static const char *const good[] = {
        "{\"name\":\"x\",\"age\":3}",
        "{\"name\":\"\", \"age\":-0, \"score\":1.5e3}",
        "{\"name\":\"x\",\"age\":-3,\"tags\":[],\"kind\":\"bc\",\"extra\":{\"q\":[1,{}]},\"score\":null}",
        "{\"name\":\"x\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\"],\"kind\":null,\"pts\":[{\"y\":true},{\"x\":2,\"y\":false}]}",
        "{\"name\":\"x\",\"age\":1,\"kind\":true}",
    };
    static const char *const bad[] = {
        "{\"age\":3,\"name\":\"x\"}",                      /* out of the listed order */
        "{\"name\":\"x\"}",                                 /* a required key missing */
        "{}",
        "{\"name\":\"x\",\"age\":3.5}",                     /* not an integer */
        "{\"name\":\"x\",\"age\":1e3}",
        "{\"name\":\"x\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\",\"d\"]}", /* maxItems */
        "{\"name\":\"x\",\"age\":1,\"tags\":[1]}",
        "{\"name\":\"x\",\"age\":1,\"kind\":\"b\"}",        /* not in the enum */
        "{\"name\":\"x\",\"age\":1,\"kind\":false}",
        "{\"name\":\"x\",\"age\":1,\"other\":1}",           /* an unlisted key */
        "{\"name\":1,\"age\":1}",
        "{\"name\":\"x\",\"age\":1,\"score\":\"1\"}",
        "{\"name\":\"x\",\"age\":1,\"pts\":[]}",            /* minItems */
        "{\"name\":\"x\",\"age\":1,\"pts\":[{\"x\":1}]}",   /* y required */
        "{\"name\":\"x\",\"age\":1,\"name\":\"y\"}",        /* a key twice */
    };
    accepts_exactly(sc, good, sizeof good / sizeof *good, bad, sizeof bad / sizeof *bad);
    nx_json_schema_free(sc);
    /* empty properties: only {} (found by fuzz_json_schema: the empty list was UB to clear) */
    sc = schema_of("{\"properties\":{}}");
    assert_true(schema_accepts(sc, "{}"));
    assert_false(schema_accepts(sc, "{\"a\":1}"));
    nx_json_schema_free(sc);
}

static void test_schema_defs(void **state) {
    (void)state;
    nx_json_schema *sc = schema_of(SCHEMA_DEFS);
    static const char *const good[] = {
        "{\"root\":{\"name\":\"a\"}}",
        "{\"root\":{\"name\":\"a\",\"kids\":[{\"name\":\"b\",\"kids\":[{\"name\":\"c\"}]},{\"name\":\"d\"}]}}",
        "{\"root\":{\"name\":\"a\"},\"color\":\"green\",\"n\":-7,\"w\":false}",
        "{\"root\":{\"name\":\"a\"},\"color\":null,\"n\":{\"k\":true}}",
        "{\"root\":{\"name\":\"a\"},\"n\":[true,\"x\",false]}",
        "{\"root\":{\"name\":\"a\"},\"self\":{\"root\":{\"name\":\"b\"},\"self\":null}}",
    };
    static const char *const bad[] = {
        "{\"root\":{}}",                                          /* Node requires name */
        "{\"root\":{\"name\":\"a\",\"kids\":[{\"name\":\"b\"},{\"name\":\"c\"},{\"name\":\"d\"}]}}", /* maxItems */
        "{\"root\":{\"name\":\"a\",\"kids\":[{\"nom\":\"b\"}]}}",
        "{\"root\":{\"name\":\"a\"},\"color\":\"blue\"}",     /* not in the enum */
        "{\"root\":{\"name\":\"a\"},\"color\":true}",           /* neither branch */
        "{\"root\":{\"name\":\"a\"},\"n\":1.5}",                /* integer */
        "{\"root\":{\"name\":\"a\"},\"n\":\"x\"}",
        "{\"root\":{\"name\":\"a\"},\"n\":[1]}",
        "{\"root\":{\"name\":\"a\"},\"w\":1}",
        "{\"root\":{\"name\":\"a\"},\"self\":{}}",              /* the root requires root */
        "{\"root\":{\"name\":\"a\"},\"x\":1}",
    };
    accepts_exactly(sc, good, sizeof good / sizeof *good, bad, sizeof bad / sizeof *bad);
    /* random walks: every completed document is valid for the independent check, and they reach
     * the recursion and each branch */
    int n[6] = {0}; /* nested, n: object, array, integer; colors, selfs */
    const int completed = schema_walks(sc, SCHEMA_DEFS, 3000, 100, visit_defs, n);
    if (!(completed > 300 && n[0] > 3 && n[1] > 3 && n[2] > 3 && n[3] > 3 && n[4] > 3 && n[5] > 3))
        fprintf(stderr, "completed %d nested %d n: obj %d arr %d int %d, colors %d, selfs %d\n", completed, n[0],
                n[1], n[2], n[3], n[4], n[5]);
    assert_true(completed > 300 && n[0] > 3 && n[1] > 3 && n[2] > 3 && n[3] > 3 && n[4] > 3 && n[5] > 3);
    nx_json_schema_free(sc);
}

/* Bounds on numbers: minimum / maximum and the exclusive ones, fractional and negative, on typed
 * and untyped values; such numbers are written without an exponent and with at most 9 digits
 * after the point, exact against the bounds as a validator reads them (0.1 >= 0.1). */
static const char *const SCHEMA_NUMBERS =
    "{\"type\":\"object\",\"properties\":{"
    "\"p\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1},"
    "\"t\":{\"type\":\"number\",\"exclusiveMinimum\":-0.5,\"maximum\":2.25},"
    "\"lat\":{\"type\":[\"number\",\"null\"],\"minimum\":-90,\"maximum\":90},"
    "\"big\":{\"type\":\"number\",\"minimum\":100.5,\"exclusiveMaximum\":1000},"
    "\"neg\":{\"type\":\"number\",\"maximum\":-0.1},"
    "\"tenth\":{\"minimum\":0.1,\"exclusiveMaximum\":0.3}},"
    "\"additionalProperties\":false}";

static void visit_numbers(json_t *v, int *n) {
    const char *const keys[] = {"p", "t", "lat", "big", "neg", "tenth"};
    for (int i = 0; i < 6; i++) {
        json_t *x = json_object_get(v, keys[i]);
        n[i] += json_is_number(x);
    }
    n[6] += json_is_real(json_object_get(v, "p")) && json_real_value(json_object_get(v, "p")) > 0.5;
    n[7] += json_is_number(json_object_get(v, "lat")) && json_number_value(json_object_get(v, "lat")) < 0;
}

static void test_schema_numbers(void **state) {
    (void)state;
    nx_json_schema *sc = schema_of(SCHEMA_NUMBERS);
    static const char *const good[] = {
        "{\"p\":0}", "{\"p\":1}", "{\"p\":0.5}", "{\"p\":1.000000000}", "{\"p\":-0}", "{\"p\":0.999999999}",
        "{\"t\":-0.499999999}", "{\"t\":2.25}", "{\"t\":2.2}", "{\"t\":-0.4}",
        "{\"lat\":-90}", "{\"lat\":45.5}", "{\"lat\":null}", "{\"lat\":90.0}",
        "{\"big\":100.5}", "{\"big\":999.999999999}", "{\"big\":500}",
        "{\"neg\":-0.1}", "{\"neg\":-12345.678}",
        "{\"tenth\":0.1}", "{\"tenth\":0.299999999}", "{\"tenth\":\"any string\"}",
    };
    static const char *const bad[] = {
        "{\"p\":1.000000001}", "{\"p\":-0.1}", "{\"p\":2}", "{\"p\":10}", "{\"p\":0.1234567891}", /* 10 digits */
        "{\"p\":1e-1}",                                                                             /* no exponent */
        "{\"t\":-0.5}", "{\"t\":2.250000001}", "{\"t\":-1}",
        "{\"lat\":-90.5}", "{\"lat\":91}", "{\"lat\":100}",
        "{\"big\":100.4}", "{\"big\":1000}", "{\"big\":99}", "{\"big\":-500}",
        "{\"neg\":-0.09}", "{\"neg\":0}", "{\"neg\":-0}",
        "{\"tenth\":0.3}", "{\"tenth\":0.09999}",
    };
    accepts_exactly(sc, good, sizeof good / sizeof *good, bad, sizeof bad / sizeof *bad);
    /* random walks: every completed document is valid for the independent check (doubles
     * compared as a validator does), and they reach each property, p above a half and a
     * negative latitude */
    int n[8] = {0};
    const int completed = schema_walks(sc, SCHEMA_NUMBERS, 3000, 80, visit_numbers, n);
    assert_walks_reached(completed, 300, n, 8);
    nx_json_schema_free(sc);
}

/* Dicts: an object without properties whose additionalProperties is a schema takes any keys,
 * each value under that schema (Pydantic's dict[str, X]); true, any keys and values. */
static const char *const SCHEMA_DICT =
    "{\"type\":\"object\",\"properties\":{"
    "\"counts\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\",\"minimum\":0}},"
    "\"nested\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"object\","
    "\"properties\":{\"ok\":{\"type\":\"boolean\"}},\"required\":[\"ok\"]}},"
    "\"lists\":{\"additionalProperties\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":2}},"
    "\"free\":{\"type\":\"object\",\"additionalProperties\":true},"
    "\"named\":{\"type\":\"object\",\"propertyNames\":{\"pattern\":\"^[a-z]{1,3}$\"},"
    "\"additionalProperties\":{\"type\":\"integer\"},\"maxProperties\":2},"
    "\"choice\":{\"type\":\"object\",\"propertyNames\":{\"enum\":[\"x\",\"yz\"]},"
    "\"additionalProperties\":{\"type\":\"boolean\"},\"minProperties\":1},"
    "\"none\":{\"type\":\"object\",\"maxProperties\":0},"
    "\"ids\":{\"type\":\"object\",\"patternProperties\":{\"^id_[0-9]$\":{\"type\":\"boolean\"}},\"maxProperties\":3}},"
    "\"additionalProperties\":false}";

static void visit_dict(json_t *v, int *n) {
    n[0] += json_object_size(json_object_get(v, "counts")) > 0;
    n[1] += json_object_size(json_object_get(v, "nested")) > 0;
    n[2] += json_object_size(json_object_get(v, "lists")) > 0;
    n[3] += json_object_size(json_object_get(v, "free")) > 0;
    n[4] += json_object_size(json_object_get(v, "counts")) > 1;
    n[5] += json_object_size(json_object_get(v, "named")) == 2;
    n[6] += json_object_get(json_object_get(v, "choice"), "yz") != NULL;
    n[7] += json_object_get(v, "none") != NULL;
    n[8] += json_object_size(json_object_get(v, "ids")) > 1;
}

static void test_schema_dict(void **state) {
    (void)state;
    nx_json_schema *sc = schema_of(SCHEMA_DICT);
    static const char *const good[] = {
        "{\"counts\":{}}",
        "{\"counts\":{\"apples\":3,\"pears\":0}}",
        "{\"counts\":{\"\":1,\"a\\\"b\":2}}",
        "{\"nested\":{\"x\":{\"ok\":true},\"y\":{\"ok\":false}}}",
        "{\"lists\":{\"k\":[\"a\",\"b\"],\"j\":[]}}",
        "{\"free\":{\"a\":[1,{\"b\":null}],\"c\":\"d\"}}",
        "{\"counts\":{\"a\":1},\"nested\":{},\"lists\":{},\"free\":{}}",
        "{\"named\":{\"ab\":1,\"xyz\":-2}}",
        "{\"named\":{}}",
        "{\"choice\":{\"yz\":true}}",
        "{\"choice\":{\"x\":false,\"yz\":true}}",
        "{\"none\":{}}",
        "{\"ids\":{\"id_1\":true,\"id_7\":false}}",
    };
    static const char *const bad[] = {
        "{\"counts\":{\"apples\":-1}}",
        "{\"counts\":{\"apples\":\"3\"}}",
        "{\"counts\":{\"apples\":1.5}}",
        "{\"nested\":{\"x\":{}}}",
        "{\"nested\":{\"x\":{\"ok\":true,\"no\":1}}}",
        "{\"lists\":{\"k\":[\"c\"]}}",
        "{\"lists\":{\"k\":[\"a\",\"a\",\"a\"]}}",
        "{\"other\":{}}",
        "{\"counts\":{\"a\":1,}}",
        "{\"named\":{\"abcd\":1}}",          /* the key's pattern */
        "{\"named\":{\"A\":1}}",
        "{\"named\":{\"\":1}}",
        "{\"named\":{\"a\":1,\"b\":2,\"c\":3}}", /* maxProperties */
        "{\"named\":{\"a\":true}}",
        "{\"choice\":{}}",                     /* minProperties */
        "{\"choice\":{\"y\":true}}",
        "{\"choice\":{\"xyz\":true}}",
        "{\"none\":{\"a\":1}}",
        "{\"ids\":{\"id_12\":true}}", /* the key's pattern */
        "{\"ids\":{\"x\":true}}",
        "{\"ids\":{\"id_1\":1}}",
    };
    accepts_exactly(sc, good, sizeof good / sizeof *good, bad, sizeof bad / sizeof *bad);
    int n[9] = {0};
    const int completed = schema_walks(sc, SCHEMA_DICT, 3000, 80, visit_dict, n);
    assert_walks_reached(completed, 300, n, 9);
    nx_json_schema_free(sc);
}

/* uniqueItems on arrays of enum values (Pydantic's set[Literal[...]] and sets of Enums): each
 * literal at most once, so an array of them ends once all are in it; prefixes of each other
 * ("a", "ab") are told apart by their closing quote. */
static const char *const SCHEMA_UNIQUE =
    "{\"$defs\":{\"Color\":{\"enum\":[\"red\",\"green\",\"blue\"]}},"
    "\"type\":\"object\",\"properties\":{"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"ab\",\"b\",null,true]},\"uniqueItems\":true},"
    "\"colors\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/Color\"},\"uniqueItems\":true,\"minItems\":2},"
    "\"rows\":{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"const\":\"x\"},\"uniqueItems\":true},"
    "\"maxItems\":3},"
    "\"any\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"uniqueItems\":false}},"
    "\"additionalProperties\":false}";

static void visit_unique(json_t *v, int *n) {
    json_t *tags = json_object_get(v, "tags"), *colors = json_object_get(v, "colors"), *rows = json_object_get(v, "rows");
    n[0] += json_array_size(tags) >= 3, n[1] += json_array_size(tags) == 5;
    n[2] += json_array_size(colors) == 3;
    n[3] += json_array_size(json_array_get(rows, 0)) == 1 && json_array_size(rows) > 1;
    json_t *any = json_object_get(v, "any");
    n[4] += json_array_size(any) == 2 && json_equal(json_array_get(any, 0), json_array_get(any, 1));
}

static void test_schema_unique(void **state) {
    (void)state;
    nx_json_schema *sc = schema_of(SCHEMA_UNIQUE);
    static const char *const good[] = {
        "{\"tags\":[]}",
        "{\"tags\":[\"a\",\"ab\",\"b\",null,true]}",
        "{\"tags\":[true,\"ab\",\"a\"]}",
        "{\"colors\":[\"blue\",\"red\"]}",
        "{\"colors\":[\"green\",\"red\",\"blue\"]}",
        "{\"rows\":[[\"x\"],[\"x\"],[]]}", /* each inner array unique, the outer one need not be */
        "{\"any\":[\"a\",\"a\",\"b\"]}",
    };
    static const char *const bad[] = {
        "{\"tags\":[\"a\",\"a\"]}",
        "{\"tags\":[\"ab\",\"b\",\"ab\"]}",
        "{\"tags\":[null,null]}",
        "{\"colors\":[\"red\"]}",                     /* minItems */
        "{\"colors\":[\"red\",\"green\",\"red\"]}",
        "{\"rows\":[[\"x\",\"x\"]]}",
    };
    accepts_exactly(sc, good, sizeof good / sizeof *good, bad, sizeof bad / sizeof *bad);
    /* once every literal is in, a comma would lead nowhere: refused as it comes; a repeated
     * literal is refused at its first byte that no unused one shares */
    assert_true(prefix_ok(sc, "{\"tags\":[\"a\",\"ab\",\"b\",null,true"));
    assert_false(prefix_ok(sc, "{\"tags\":[\"a\",\"ab\",\"b\",null,true,"));
    assert_true(prefix_ok(sc, "{\"tags\":[\"a\",\"a"));  /* still "ab" */
    assert_false(prefix_ok(sc, "{\"tags\":[\"a\",\"a\""));
    assert_false(prefix_ok(sc, "{\"tags\":[null,n"));
    int n[5] = {0};
    const int completed = schema_walks(sc, SCHEMA_UNIQUE, 3000, 60, visit_unique, n);
    assert_walks_reached(completed, 1000, n, 5);
    nx_json_schema_free(sc);
}

/* anyOf / oneOf branches that start alike (Pydantic's unions: Union[Cat, Dog], Union[int, float],
 * a Literal beside a str, lists of unions), each followed as its own path until the bytes tell
 * them apart, and nested: the Shape union inside a list inside the object. */
static const char *const SCHEMA_UNION =
    "{\"$defs\":{"
    "\"Cat\":{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"cat\"},"
    "\"lives\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}},\"required\":[\"kind\"]},"
    "\"Dog\":{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"dog\"},"
    "\"good\":{\"type\":\"boolean\"}},\"required\":[\"kind\",\"good\"]},"
    "\"Rect\":{\"type\":\"object\",\"properties\":{\"w\":{\"type\":\"integer\"},\"h\":{\"type\":\"integer\"}},"
    "\"required\":[\"w\",\"h\"]},"
    "\"Square\":{\"type\":\"object\",\"properties\":{\"w\":{\"type\":\"integer\"}},\"required\":[\"w\"]},"
    "\"Circle\":{\"type\":\"object\",\"properties\":{\"r\":{\"type\":\"number\"}},\"required\":[\"r\"]}},"
    "\"type\":\"object\",\"properties\":{"
    "\"shapes\":{\"type\":\"array\",\"items\":{\"anyOf\":[{\"$ref\":\"#/$defs/Rect\"},"
    "{\"$ref\":\"#/$defs/Square\"},{\"$ref\":\"#/$defs/Circle\"}]},\"maxItems\":3},"
    "\"tag\":{\"anyOf\":[{\"enum\":[\"ab\",\"abc\"]},{\"type\":\"string\",\"pattern\":\"^[ab]*$\",\"maxLength\":2}]},"
    "\"num\":{\"anyOf\":[{\"type\":\"integer\",\"minimum\":100,\"maximum\":200},{\"type\":\"number\"},"
    "{\"type\":\"null\"}]},"
    "\"pet\":{\"oneOf\":[{\"$ref\":\"#/$defs/Cat\"},{\"$ref\":\"#/$defs/Dog\"}]}},"
    "\"required\":[\"pet\"],\"additionalProperties\":false}";

static void visit_union(json_t *v, int *n) {
    json_t *pet = json_object_get(v, "pet"), *num = json_object_get(v, "num"), *tag = json_object_get(v, "tag");
    const char *kind = json_string_value(json_object_get(pet, "kind"));
    n[0] += kind && !strcmp(kind, "cat"), n[1] += kind && !strcmp(kind, "dog");
    n[2] += json_is_integer(num), n[3] += json_is_real(num);
    const char *t = json_string_value(tag);
    n[4] += t && !strcmp(t, "abc"), n[5] += t && strcmp(t, "abc");
    json_t *sh = json_object_get(v, "shapes");
    for (size_t i = 0; i < json_array_size(sh); i++) {
        json_t *x = json_array_get(sh, i);
        n[6] += json_object_get(x, "h") != NULL;                                      /* a Rect */
        n[7] += json_object_get(x, "w") != NULL && json_object_get(x, "h") == NULL; /* a Square */
        n[8] += json_object_get(x, "r") != NULL;                                      /* a Circle */
    }
}

static void test_schema_union(void **state) {
    (void)state;
    nx_json_schema *sc = schema_of(SCHEMA_UNION);
    static const char *const good[] = {
        "{\"pet\":{\"kind\":\"cat\"}}",
        "{\"pet\":{\"kind\":\"cat\",\"lives\":9}}",
        "{\"pet\":{\"kind\":\"dog\",\"good\":true}}",
        "{\"num\":150,\"pet\":{\"kind\":\"cat\"}}",
        "{\"num\":99,\"pet\":{\"kind\":\"cat\"}}", /* the number branch */
        "{\"num\":-2.5e3,\"pet\":{\"kind\":\"cat\"}}",
        "{\"num\":null,\"pet\":{\"kind\":\"cat\"}}",
        "{\"tag\":\"abc\",\"pet\":{\"kind\":\"cat\"}}", /* the enum, longer than maxLength */
        "{\"tag\":\"ba\",\"pet\":{\"kind\":\"cat\"}}",  /* the string branch */
        "{\"tag\":\"ab\",\"pet\":{\"kind\":\"cat\"}}",  /* both */
        "{\"shapes\":[{\"w\":1,\"h\":2},{\"w\":3},{\"r\":0.5}],\"pet\":{\"kind\":\"cat\"}}",
        "{\"shapes\":[],\"tag\":\"\",\"num\":1,\"pet\":{\"kind\":\"dog\",\"good\":false}}",
    };
    static const char *const bad[] = {
        "{\"pet\":{}}", /* neither: kind is required */
        "{\"pet\":{\"kind\":\"cow\"}}",
        "{\"pet\":{\"kind\":\"dog\"}}",                  /* Dog requires good */
        "{\"pet\":{\"kind\":\"cat\",\"good\":true}}", /* good is Dog's */
        "{\"pet\":{\"kind\":\"cat\",\"lives\":10}}",
        "{\"num\":\"1\",\"pet\":{\"kind\":\"cat\"}}",
        "{\"tag\":\"abb\",\"pet\":{\"kind\":\"cat\"}}", /* not in the enum, longer than 2 */
        "{\"tag\":\"c\",\"pet\":{\"kind\":\"cat\"}}",
        "{\"shapes\":[{\"w\":1,\"r\":2}],\"pet\":{\"kind\":\"cat\"}}",
        "{\"shapes\":[{\"h\":2}],\"pet\":{\"kind\":\"cat\"}}",
        "{\"shapes\":[{}],\"pet\":{\"kind\":\"cat\"}}",
        "{\"shapes\":[{\"w\":1},{\"w\":1},{\"w\":1},{\"w\":1}],\"pet\":{\"kind\":\"cat\"}}",
    };
    accepts_exactly(sc, good, sizeof good / sizeof *good, bad, sizeof bad / sizeof *bad);
    /* while the branches are alike, both are followed; once told apart, one is left */
    nx_json_state s;
    nx_json_init_schema(&s, sc);
    const char *prefix = "{\"pet\":{\"kind\":\"";
    assert_true(nx_json_feed(&s, (const uint8_t *)prefix, strlen(prefix)));
    assert_int_equal(s.n, 2);
    assert_true(nx_json_feed(&s, (const uint8_t *)"d", 1));
    assert_int_equal(s.n, 1);
    /* random walks: every completed document is valid for the independent check (which takes
     * oneOf strictly: the pets' kinds keep its branches apart), and they reach every branch */
    int n[9] = {0};
    const int completed = schema_walks(sc, SCHEMA_UNION, 3000, 150, visit_union, n);
    assert_walks_reached(completed, 300, n, 9);
    nx_json_schema_free(sc);
}

static void test_schema_errors(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[]}}}", "#/properties/a: anyOf must be a list of 1 to 64"},
        {"{\"properties\":{\"a\":{\"anyOf\":[{},{},{},{},{},{\"type\":\"object\"},{},{},{}]}}}",
         "#/properties/a: more than 8 anyOf / oneOf branches can start with the same kind of value"},
        {"{\"properties\":{\"a\":{\"oneOf\":[{\"anyOf\":[{},{},{},{},{}]},{\"anyOf\":[{},{},{},{\"type\":\"null\"}]}]}}}",
         "more than 8 anyOf / oneOf"},
        {"{\"properties\":{\"a\":{\"$ref\":\"#/$defs/B\"}}}", "#/properties/a: $ref #/$defs/B names no definition"},
        {"{\"properties\":{\"a\":{\"$ref\":\"http://x/s.json\"}}}", "only local references"},
        {"{\"properties\":{\"a\":{\"$ref\":\"#/$defs/B\",\"type\":\"object\"}},\"$defs\":{\"B\":{}}}", "standing alone"},
        {"{\"properties\":{\"a\":{\"$ref\":\"#/$defs/A\"}},\"$defs\":{\"A\":{\"$ref\":\"#/$defs/A\"}}}", "$ref cycle"},
        {"{\"properties\":{\"a\":{\"$ref\":\"#/$defs/A\"}},\"$defs\":{\"A\":{\"format\":\"uri\"}}}",
         "#/$defs/A: format 'uri' is not supported"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"1\"}}}", "pattern beside format"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"date\",\"maxLength\":9}}}", "format: the pattern matches no"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"format\":7}}}", "format must be a string"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"patternProperties\":{}}}}", "#/properties/a: patternProperties is supported with one pattern"},
        {"{\"properties\":{\"a\":{\"patternProperties\":{\"^x\":{},\"^y\":{}}}}}", "with one pattern"},
        {"{\"properties\":{\"a\":{\"patternProperties\":{\"^x\":{}},\"additionalProperties\":{}}}}",
         "patternProperties is supported on objects without properties, additionalProperties or propertyNames"},
        {"{\"properties\":{\"a\":{\"patternProperties\":{\"(x\":{}}}}}", "#/properties/a/patternProperties: pattern: missing ')'"},
        {"{\"properties\":{\"a\":{\"multipleOf\":2}}}", "the keyword 'multipleOf'"},
        {"{\"properties\":{\"a\":{\"allOf\":[{},{}]}}}", "allOf must be a list of one schema"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":-1}}}", "#/properties/a: minLength and maxLength must be integers in [0, 65535]"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":65536}}}", "[0, 65535]"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":\"3\"}}}", "[0, 65535]"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}}}", "maxLength is below minLength"},
        {"{\"properties\":{\"a\":{\"enum\":[\"x\"],\"maxLength\":2}}}", "beside enum or const"},
        {"{\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":-2e9}}}", "#/properties/a: bounds on numbers (type number) must be within ±10^9"},
        {"{\"properties\":{\"a\":{\"maximum\":1e10}}}", "within ±10^9"},
        {"{\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":0.5,\"exclusiveMaximum\":0.5}}}", "no number lies within the bounds"},
        {"{\"properties\":{\"a\":{\"type\":\"integer\",\"maximum\":1e16}}}", "within ±10^15"},
        {"{\"properties\":{\"a\":{\"type\":\"integer\",\"exclusiveMinimum\":true}}}", "within ±10^15"},
        {"{\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":1.9}}}", "no integer lies within the bounds"},
        {"{\"properties\":{\"a\":{\"type\":\"integer\",\"exclusiveMinimum\":3,\"exclusiveMaximum\":4}}}", "no integer lies"},
        {"{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"null\"}]}", "the root must be an object"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":true}",
         "additionalProperties beside properties must be false"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":{\"type\":\"string\"}}", "beside properties"},
        {"{\"type\":\"object\",\"additionalProperties\":3}", "additionalProperties must be false, true or a schema"},
        {"{\"properties\":{\"d\":{\"propertyNames\":{\"type\":\"integer\"}}}}", "#/properties/d: propertyNames must be a string schema"},
        {"{\"properties\":{\"d\":{\"propertyNames\":{\"enum\":[\"a\",true]}}}}", "propertyNames must be a string schema"},
        {"{\"properties\":{\"d\":{\"minProperties\":2}}}", "minProperties above 1 is not supported"},
        {"{\"properties\":{\"d\":{\"maxProperties\":-1}}}", "[0, 255]"},
        {"{\"properties\":{\"d\":{\"minProperties\":1,\"maxProperties\":0}}}", "maxProperties is below minProperties"},
        {"{\"properties\":{\"d\":{\"properties\":{\"a\":{}},\"maxProperties\":1}}}", "supported on objects without properties"},
        {"{\"properties\":{\"d\":{\"additionalProperties\":{\"type\":\"strin\"}}}}", "#/properties/d/additionalProperties: type must be"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "required names a property"},
        {"{\"type\":\"array\"}", "the root must be an object"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1,2]}}}", "#/properties/a: enum and const values"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"items\":[{}]}}}", "tuples are not supported"},
        {"{\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}}}",
         "#/properties/a: uniqueItems is supported on arrays whose items are enum or const values"},
        {"{\"properties\":{\"a\":{\"type\":\"array\",\"uniqueItems\":true}}}", "uniqueItems is supported on arrays"},
        {"{\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"y\"]},\"minItems\":3,\"uniqueItems\":true}}}",
         "minItems is more than the enum's values"},
        {"{\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\"]},\"uniqueItems\":1}}}",
         "uniqueItems must be true or false"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"minItems\":300}}}", "[0, 255]"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(x\"}}}",
         "#/properties/a: pattern: missing ')'"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}", "pattern: lookarounds"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":3}}}", "pattern must be a string"},
        {"{\"properties\":{\"a\":{\"enum\":[\"x\"],\"pattern\":\"x\"}}}", "pattern or format beside enum"},
        {"{\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^a+$\",\"maxLength\":0}}}", "matches no string"},
        {"{\"type\":\"object\",\"properties\":{\"a\\\"b\":{}}}", "quotes"},
        {"{\"type\":\"text\"}", "type must be"},
        {"[1]", "must be an object"},
        {"{not json", "not JSON"},
    };
    /* 65 patterns (two objects of 33 and 32 properties): more automata than one schema may build;
     * 64 compile */
    for (int extra = 1; extra >= 0; extra--) {
        static char many[8192];
        int len = snprintf(many, sizeof many, "{\"properties\":{");
        for (int o = 0; o < 2; o++) {
            len += snprintf(many + len, sizeof many - (size_t)len, "%s\"%c\":{\"type\":\"object\",\"properties\":{",
                            o ? "," : "", 'a' + o);
            for (int k = 0; k < 32 + (o == 0 && extra); k++)
                len += snprintf(many + len, sizeof many - (size_t)len, "%s\"p%d\":{\"type\":\"string\",\"pattern\":\"^x\"}",
                                k ? "," : "", k);
            len += snprintf(many + len, sizeof many - (size_t)len, "}}");
        }
        snprintf(many + len, sizeof many - (size_t)len, "}}");
        nx_json_schema *msc = NULL;
        nx_error merr = {0};
        assert_int_equal(nx_json_schema_new(many, strlen(many), &msc, &merr), extra ? NX_E_ARG : NX_OK);
        if (extra) assert_non_null(strstr(merr.msg, "#/properties/b/properties/p31: a schema may hold at most 64 patterns"));
        nx_json_schema_free(msc);
    }
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        nx_json_schema *sc = NULL;
        nx_error err = {0};
        assert_int_equal(nx_json_schema_new(cases[i][0], strlen(cases[i][0]), &sc, &err), NX_E_ARG);
        if (!strstr(err.msg, cases[i][1])) fprintf(stderr, "%s -> %s\n", cases[i][0], err.msg);
        assert_non_null(strstr(err.msg, cases[i][1]));
        assert_null(sc);
    }
}

/* Random walks under the schema (any byte the automaton allows, closing more often as the text
 * grows): every completed document is valid for the independent check, and they cover the
 * optional keys, the enum and the arrays. */
static void visit_plain(json_t *v, int *n) {
    n[0] += json_object_get(v, "pts") != NULL;
    n[1] += json_object_get(v, "kind") != NULL;
}

static void test_schema_walks(void **state) {
    (void)state;
    nx_json_schema *sc = schema_of(SCHEMA);
    int n[2] = {0}; /* with pts, with kind */
    const int completed = schema_walks(sc, SCHEMA, 3000, 30, visit_plain, n);
    if (!(completed > 500 && n[0] > 5 && n[1] > 5))
        fprintf(stderr, "completed %d, with pts %d, with kind %d\n", completed, n[0], n[1]);
    assert_true(completed > 500 && n[0] > 5 && n[1] > 5);
    nx_json_schema_free(sc);
}

/* Bounds. String lengths: minLength / maxLength count code points (an escape, a UTF-8 sequence
 * and an ASCII byte are one each), in properties, array items and anyOf branches; integers:
 * minimum / maximum and the exclusive ones (fractional bounds round inwards); arrays of numbers
 * count their items for minItems / maxItems like any others. */
static const char *const SCHEMA_BOUNDS =
    "{\"type\":\"object\",\"properties\":{"
    "\"id\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":3},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":1},\"maxItems\":3},"
    "\"note\":{\"anyOf\":[{\"type\":\"string\",\"minLength\":1},{\"type\":\"null\"}]},"
    "\"any\":{\"type\":\"string\"},"
    "\"nums\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2,\"maxItems\":3},"
    "\"score\":{\"type\":\"integer\",\"minimum\":-5,\"exclusiveMaximum\":120},"
    "\"pct\":{\"anyOf\":[{\"type\":\"integer\",\"exclusiveMinimum\":0.5,\"maximum\":100.7},{\"type\":\"null\"}]},"
    "\"neg\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"maximum\":-10,\"minimum\":-2000}}},"
    "\"required\":[\"id\"],\"additionalProperties\":false}";

static void visit_bounds(json_t *v, int *n) {
    const json_t *id = json_object_get(v, "id");
    const char *s = json_string_value(id);
    size_t cps = 0;
    for (size_t i = 0; s && i < json_string_length(id); i++) cps += ((uint8_t)s[i] & 0xC0) != 0x80;
    n[0] += cps == 2, n[1] += cps == 3;
    n[2] += json_array_size(json_object_get(v, "tags")) > 0;
    n[3] += json_is_string(json_object_get(v, "note"));
    n[4] += json_array_size(json_object_get(v, "nums")) == 3;
    const json_int_t sc = json_integer_value(json_object_get(v, "score")), pc = json_integer_value(json_object_get(v, "pct"));
    n[5] += sc == -5 || sc == 119, n[6] += sc < 0, n[7] += pc >= 10;
    n[8] += json_array_size(json_object_get(v, "neg")) > 0;
}

static void test_schema_bounds(void **state) {
    (void)state;
    nx_json_schema *sc = schema_of(SCHEMA_BOUNDS);
    static const char *const good[] = {
        "{\"id\":\"ab\"}",
        "{\"id\":\"abc\"}",
        "{\"id\":\"\\n\\u00e9\"}",                /* two escapes: two code points */
        "{\"id\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}", /* é € 😀: three code points, 9 bytes */
        "{\"id\":\"ab\",\"tags\":[\"\",\"x\",\"\\t\"]}",
        "{\"id\":\"ab\",\"note\":\"n\"}",
        "{\"id\":\"ab\",\"note\":null,\"any\":\"\"}",
        "{\"id\":\"ab\",\"any\":\"a string longer than every bound here\"}",
        "{\"id\":\"ab\",\"nums\":[1,-2.5e3]}",
        "{\"id\":\"ab\",\"nums\":[0 , 1 ,2]}",
        "{\"id\":\"ab\",\"score\":-5,\"pct\":1}",
        "{\"id\":\"ab\",\"score\":119,\"pct\":100}",
        "{\"id\":\"ab\",\"score\":-0,\"pct\":null,\"neg\":[-10,-2000,-999]}",
        "{\"id\":\"ab\",\"score\":0 ,\"neg\":[]}",
    };
    static const char *const bad[] = {
        "{\"id\":\"a\"}",
        "{\"id\":\"\"}",
        "{\"id\":\"abcd\"}",
        "{\"id\":\"\\u00e9\"}",
        "{\"id\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80!\"}",
        "{\"id\":\"ab\",\"tags\":[\"xy\"]}",
        "{\"id\":\"ab\",\"tags\":[\"\\u0041\\u0042\"]}",
        "{\"id\":\"ab\",\"note\":\"\"}",
        "{\"id\":\"ab\",\"nums\":[1]}",
        "{\"id\":\"ab\",\"nums\":[1,2,3,4]}",
        "{\"id\":\"ab\",\"score\":-6}",
        "{\"id\":\"ab\",\"score\":120}",
        "{\"id\":\"ab\",\"score\":1200}",
        "{\"id\":\"ab\",\"score\":1.5}",
        "{\"id\":\"ab\",\"score\":-00}",
        "{\"id\":\"ab\",\"pct\":0}",
        "{\"id\":\"ab\",\"pct\":101}",
        "{\"id\":\"ab\",\"pct\":-1}",
        "{\"id\":\"ab\",\"neg\":[-9]}",
        "{\"id\":\"ab\",\"neg\":[-2001]}",
        "{\"id\":\"ab\",\"neg\":[0]}",
        "{\"id\":\"ab\",\"neg\":[5]}",
    };
    accepts_exactly(sc, good, sizeof good / sizeof *good, bad, sizeof bad / sizeof *bad);
    /* id of 2 and of 3 code points, tags, a note, 3 numbers, a score at a bound, a negative score,
     * a pct of 2 digits or more, negatives */
    int n[9] = {0};
    const int completed = schema_walks(sc, SCHEMA_BOUNDS, 20000, 30, visit_bounds, n);
    /* every walk completes: no byte the automaton allows leads where no bound can be met */
    assert_walks_reached(completed, 20000, n, 9);
    nx_json_schema_free(sc);
}

/* Patterns: each string value matches its pattern (checked by PCRE2), unanchored ones anywhere,
 * with minLength / maxLength on top; escapes count as the characters they stand for, and \u
 * escapes are refused under a pattern (the character must be known as it starts). */
static const char *const SCHEMA_PATTERN =
    "{\"type\":\"object\",\"properties\":{"
    "\"id\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3,4}$\"},"
    "\"tag\":{\"type\":\"string\",\"pattern\":\"^(x|yz)*$\",\"maxLength\":5},"
    "\"note\":{\"type\":\"string\",\"pattern\":\"[0-9]\",\"minLength\":2},"
    "\"mark\":{\"type\":\"string\",\"pattern\":\"^(\\u00e9|\\\\n|a)+$\"},"
    "\"codes\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[a-c\\u20ac]$\"},\"maxItems\":3},"
    "\"v\":{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"^v[0-9]+(\\\\.[0-9]+)?$\"},{\"type\":\"integer\"}]}},"
    "\"required\":[\"id\",\"note\"],\"additionalProperties\":false}";

static void visit_pattern(json_t *v, int *n) {
    const char *id = json_string_value(json_object_get(v, "id"));
    n[0] += id && strlen(id) == 7, n[1] += id && strlen(id) == 6;
    n[2] += json_string_length(json_object_get(v, "tag")) > 1;
    const char *mark = json_string_value(json_object_get(v, "mark"));
    n[3] += mark && strchr(mark, '\n') != NULL, n[4] += mark && strstr(mark, "\xc3\xa9") != NULL;
    n[5] += json_array_size(json_object_get(v, "codes")) > 0;
    n[6] += json_is_string(json_object_get(v, "v")), n[7] += json_is_integer(json_object_get(v, "v"));
    n[8] += json_string_length(json_object_get(v, "note")) > 3;
}

static void test_schema_pattern(void **state) {
    (void)state;
    nx_json_schema *sc = schema_of(SCHEMA_PATTERN);
    static const char *const good[] = {
        "{\"id\":\"AB-123\",\"note\":\"t1\"}",
        "{\"id\":\"ZZ-0000\",\"tag\":\"xyzx\",\"note\":\"a 9 b\",\"mark\":\"a\\na\"}", /* \n escape: a newline */
        "{\"id\":\"AB-123\",\"tag\":\"\",\"note\":\"\xc3\xa9" "5\",\"mark\":\"\xc3\xa9\",\"codes\":[\"a\",\"\xe2\x82\xac\"]}",
        "{\"id\":\"AB-123\",\"note\":\"0\\t\",\"v\":\"v1.25\"}",
        "{\"id\":\"AB-123\",\"note\":\"\\\"7\",\"v\":7}",
    };
    static const char *const bad[] = {
        "{\"id\":\"AB-12\",\"note\":\"t1\"}",
        "{\"id\":\"ab-123\",\"note\":\"t1\"}",
        "{\"id\":\"AB-123 \",\"note\":\"t1\"}",
        "{\"id\":\"AB-123\",\"note\":\"1\"}",                 /* one code point, minLength 2 */
        "{\"id\":\"AB-123\",\"note\":\"ab\"}",                /* no digit */
        "{\"id\":\"AB-123\",\"note\":\"a\\u0031\"}",          /* \u under a pattern */
        "{\"id\":\"AB-123\",\"tag\":\"xyzxyz\",\"note\":\"t1\"}", /* 6 > maxLength */
        "{\"id\":\"AB-123\",\"tag\":\"y\",\"note\":\"t1\"}",
        "{\"id\":\"AB-123\",\"note\":\"t1\",\"mark\":\"\"}",
        "{\"id\":\"AB-123\",\"note\":\"t1\",\"mark\":\"a\\t\"}",
        "{\"id\":\"AB-123\",\"note\":\"t1\",\"codes\":[\"d\"]}",
        "{\"id\":\"AB-123\",\"note\":\"t1\",\"v\":\"v1.\"}",
    };
    accepts_exactly(sc, good, sizeof good / sizeof *good, bad, sizeof bad / sizeof *bad);
    int n[9] = {0};
    const int completed = schema_walks(sc, SCHEMA_PATTERN, 3000, 30, visit_pattern, n);
    assert_walks_reached(completed, 2901, n, 9); /* a walk stops unfinished only at 1200 bytes */
    nx_json_schema_free(sc);
}

/* Formats: each value is a real date / time / date-time (checked with calendar arithmetic), a
 * uuid, an ipv4 address (inet_pton) or an email address. */
static const char *const SCHEMA_FORMAT =
    "{\"type\":\"object\",\"properties\":{"
    "\"d\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"t\":{\"type\":\"string\",\"format\":\"time\"},"
    "\"dt\":{\"type\":\"string\",\"format\":\"date-time\"},"
    "\"u\":{\"type\":\"string\",\"format\":\"uuid\"},"
    "\"ip\":{\"type\":\"string\",\"format\":\"ipv4\"},"
    "\"e\":{\"type\":\"string\",\"format\":\"email\",\"maxLength\":12}},"
    "\"required\":[\"d\",\"t\",\"dt\",\"u\",\"ip\",\"e\"]}";

static void visit_format(json_t *v, int *n) {
    const char *d = json_string_value(json_object_get(v, "d"));
    n[0] += d && !strcmp(d + 4, "-02-28"), n[1] += d && d[8] == '3';
    const char *t = json_string_value(json_object_get(v, "t"));
    n[2] += t && strchr(t, '.') != NULL, n[3] += t && t[strlen(t) - 1] != 'Z';
    const char *ip = json_string_value(json_object_get(v, "ip"));
    n[4] += ip && strstr(ip, "25") != NULL;
}

static void test_schema_format(void **state) {
    (void)state;
    nx_json_schema *sc = schema_of(SCHEMA_FORMAT);
    static const char *const good[] = {
        "{\"d\":\"2024-02-29\",\"t\":\"23:59:59Z\",\"dt\":\"2000-02-29T00:00:00.5+05:30\","
        "\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"ip\":\"255.0.10.199\",\"e\":\"a.b@c-d.io\"}",
        "{\"d\":\"1999-12-31\",\"t\":\"00:00:00-12:00\",\"dt\":\"2023-04-30T12:30:00Z\","
        "\"u\":\"00000000-0000-0000-0000-000000000000\",\"ip\":\"0.0.0.0\",\"e\":\"x@y.zz\"}",
    };
    static const char *const bad[] = {
        "{\"d\":\"2023-02-29\",\"t\":\"23:59:59Z\",\"dt\":\"2000-02-29T00:00:00Z\","
        "\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"ip\":\"1.2.3.4\",\"e\":\"a@b.io\"}",
        "{\"d\":\"1900-02-29\"", /* not a leap year */
        "{\"d\":\"2023-04-31\"",
        "{\"d\":\"2023-13-01\"",
        "{\"d\":\"2023-01-01\",\"t\":\"24:00:00Z\"",
        "{\"d\":\"2023-01-01\",\"t\":\"12:00:00\"", /* a time zone is required */
        "{\"d\":\"2023-01-01\",\"t\":\"12:00:00Z\",\"dt\":\"2023-01-01 12:00:00Z\"",
        "{\"d\":\"2023-01-01\",\"t\":\"12:00:00Z\",\"dt\":\"2023-01-01T12:00:00Z\",\"u\":\"123E4567",
        "{\"d\":\"2023-01-01\",\"t\":\"12:00:00Z\",\"dt\":\"2023-01-01T12:00:00Z\","
        "\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"ip\":\"256.1.1.1\"",
        "{\"d\":\"2023-01-01\",\"t\":\"12:00:00Z\",\"dt\":\"2023-01-01T12:00:00Z\","
        "\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"ip\":\"01.1.1.1\"",
        "{\"d\":\"2023-01-01\",\"t\":\"12:00:00Z\",\"dt\":\"2023-01-01T12:00:00Z\","
        "\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"ip\":\"1.1.1.1\",\"e\":\"a@b\"}",
        "{\"d\":\"2023-01-01\",\"t\":\"12:00:00Z\",\"dt\":\"2023-01-01T12:00:00Z\","
        "\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"ip\":\"1.1.1.1\",\"e\":\"abcdefgh@ij.kl\"}",
    };
    accepts_exactly(sc, good, sizeof good / sizeof *good, bad, sizeof bad / sizeof *bad);
    int n[5] = {0};
    const int completed = schema_walks(sc, SCHEMA_FORMAT, 3000, 30, visit_format, n);
    assert_walks_reached(completed, 2901, n, 5);
    nx_json_schema_free(sc);
}

/* The other formats: hostname (RFC 1123, kept to 4 labels of up to 62 characters), ipv6 (eight groups or fewer
 * around one "::") and duration (ISO 8601 as JSON Schema has it), each a strict subset of what
 * validators accept; checked by hand, inet_pton and a hand-written duration reader. */
static const char *const SCHEMA_FORMAT2 =
    "{\"type\":\"object\",\"properties\":{"
    "\"h\":{\"type\":\"string\",\"format\":\"hostname\"},"
    "\"ip\":{\"type\":\"string\",\"format\":\"ipv6\"},"
    "\"p\":{\"type\":\"string\",\"format\":\"duration\"}},"
    "\"required\":[\"h\",\"ip\",\"p\"]}";

static void visit_format2(json_t *v, int *n) {
    const char *h = json_string_value(json_object_get(v, "h")), *ip = json_string_value(json_object_get(v, "ip")),
               *p = json_string_value(json_object_get(v, "p"));
    n[0] += h && strchr(h, '.') != NULL, n[1] += h && strchr(h, '-') != NULL;
    n[2] += ip && strstr(ip, "::") != NULL, n[3] += ip && !strstr(ip, "::");
    n[4] += p && strchr(p, 'T') != NULL, n[5] += p && strchr(p, 'W') != NULL, n[6] += p && strchr(p, 'Y') != NULL;
}

static void test_schema_format2(void **state) {
    (void)state;
    nx_json_schema *sc = schema_of(SCHEMA_FORMAT2);
    static const char *const good[] = {
        "{\"h\":\"example.com\",\"ip\":\"2001:db8:0:0:0:0:2:1\",\"p\":\"P1Y2M3DT4H5M6S\"}",
        "{\"h\":\"a\",\"ip\":\"::1\",\"p\":\"PT0S\"}",
        "{\"h\":\"x-1.y2\",\"ip\":\"::\",\"p\":\"P3W\"}",
        "{\"h\":\"localhost\",\"ip\":\"fe80::\",\"p\":\"P1D\"}",
        "{\"h\":\"a.b.c\",\"ip\":\"1:2:3:4:5:6:7::\",\"p\":\"P2MT1M\"}",
        "{\"h\":\"a.b.c\",\"ip\":\"1::2:3\",\"p\":\"PT1H\"}",
    };
    static const char *const bad[] = {
        "{\"h\":\"-a\"",
        "{\"h\":\"a-\"",
        "{\"h\":\"a..b\"",
        "{\"h\":\"\"",
        "{\"h\":\"a_b\"",
        "{\"h\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"", /* a 64-letter label */
        "{\"h\":\"a\",\"ip\":\"1:2:3:4:5:6:7\"",
        "{\"h\":\"a\",\"ip\":\"1::2::3\"",
        "{\"h\":\"a\",\"ip\":\"12345::\"",
        "{\"h\":\"a\",\"ip\":\"1:2:3:4:5:6:7:8:9\"",
        "{\"h\":\"a\",\"ip\":\"::1\",\"p\":\"P\"}",
        "{\"h\":\"a\",\"ip\":\"::1\",\"p\":\"PT\"}",
        "{\"h\":\"a\",\"ip\":\"::1\",\"p\":\"P1DT\"}",
        "{\"h\":\"a\",\"ip\":\"::1\",\"p\":\"P1M1Y\"}",
        "{\"h\":\"a\",\"ip\":\"::1\",\"p\":\"P1W1D\"}",
        "{\"h\":\"a\",\"ip\":\"::1\",\"p\":\"1D\"}",
    };
    accepts_exactly(sc, good, sizeof good / sizeof *good, bad, sizeof bad / sizeof *bad);
    /* 4 labels of 62 characters (251 in all, within RFC 1123's 253) are taken; a fifth label
     * or a 63rd character is not (the subset that always fits) */
    char doc[400], label[64];
    memset(label, 'a', 62), label[62] = 0;
    snprintf(doc, sizeof doc, "{\"h\":\"%s.%s.%s.%s\"", label, label, label, label);
    assert_true(prefix_ok(sc, doc));
    snprintf(doc, sizeof doc, "{\"h\":\"%s.%s.%s.%s.a", label, label, label, label);
    assert_false(prefix_ok(sc, doc));
    snprintf(doc, sizeof doc, "{\"h\":\"%sa", label);
    assert_false(prefix_ok(sc, doc));
    int n[7] = {0};
    const int completed = schema_walks(sc, SCHEMA_FORMAT2, 3000, 30, visit_format2, n);
    assert_walks_reached(completed, 2000, n, 7);
    nx_json_schema_free(sc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus),       cmocka_unit_test(test_invalid),     cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_random_walks), cmocka_unit_test(test_mask),        cmocka_unit_test(test_sampler_mask),
        cmocka_unit_test(test_mask_cache),
        cmocka_unit_test(test_schema_examples),
        cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_schema_walks),
        cmocka_unit_test(test_schema_bounds),
        cmocka_unit_test(test_schema_pattern),
        cmocka_unit_test(test_schema_format),
        cmocka_unit_test(test_schema_defs),
        cmocka_unit_test(test_schema_union),
        cmocka_unit_test(test_schema_numbers),
        cmocka_unit_test(test_schema_dict),
        cmocka_unit_test(test_schema_format2),
        cmocka_unit_test(test_schema_unique),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
