/* Tokenizer tests. With no arguments: unit tests on tiny tokenizer.json fixtures written to a
 * temp directory (merge order, added tokens, byte fallback, split behaviours, errors, streaming
 * detokenization). With `--parity <tokenizer.json> <expected.json>`: compares encode/decode with
 * ids produced by the reference implementation (tests/e2e/tokenizer_parity.t drives this). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "nextn.h"
#include "text/tokenizer_internal.h"

/* ---------------------------------------------------------------- fixture helpers */

static char tmpdir[256];

static int setup_dir(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nx_tok_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes text to <tmpdir>/name and returns the path (static buffer). */
static const char *write_fixture(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
    return path;
}

static nx_tokenizer *load_text(const char *json) {
    nx_tokenizer *t = NULL;
    nx_error err = {0};
    nx_status st = nx_tokenizer_load(write_fixture("tokenizer.json", json), &t, &err);
    if (st != NX_OK) fprintf(stderr, "load failed: %s\n", err.msg);
    assert_int_equal(st, NX_OK);
    return t;
}

/* Encodes s and checks the ids. */
static void expect_ids(const nx_tokenizer *t, const char *s, bool special, const int32_t *want,
                       size_t n_want) {
    int32_t *ids = NULL;
    size_t n = 0;
    nx_error err = {0};
    nx_status st = nx_tokenizer_encode(t, s, strlen(s), special, &ids, &n, &err);
    if (st != NX_OK) fprintf(stderr, "encode failed: %s\n", err.msg);
    assert_int_equal(st, NX_OK);
    if (n != n_want || memcmp(ids, want, n * sizeof *ids) != 0) {
        fprintf(stderr, "encode(\"%s\"): got", s);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    assert_int_equal(n, n_want);
    assert_memory_equal(ids, want, n * sizeof *ids);
    free(ids);
}

#define EXPECT(t, s, special, ...)                                                                 \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        expect_ids(t, s, special, want_, sizeof want_ / sizeof want_[0]);                          \
    } while (0)

/* GPT-2 byte -> alphabet character (an independent spelling of the table). */
static unsigned bytelevel_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) n++;
    return 256 + n;
}

static void put_utf8(char **p, unsigned cp) {
    if (cp < 0x80) *(*p)++ = (char)cp;
    else {
        *(*p)++ = (char)(0xC0 | (cp >> 6));
        *(*p)++ = (char)(0x80 | (cp & 0x3F));
    }
}

/* A byte-level tokenizer: ids 0..255 are the bytes (in byte order), then the given merges
 * (as "a b" byte-level strings) with their results at 256.., then added tokens. */
static char *bytelevel_json(const char *const *merges, size_t n_merges, const char *added) {
    json_t *vocab = json_object();
    for (unsigned b = 0; b < 256; b++) {
        char s[4] = {0}, *p = s;
        put_utf8(&p, bytelevel_cp(b));
        json_object_set_new(vocab, s, json_integer(b));
    }
    json_t *jm = json_array();
    for (size_t i = 0; i < n_merges; i++) {
        char cat[64];
        const char *sp = strchr(merges[i], ' ');
        snprintf(cat, sizeof cat, "%.*s%s", (int)(sp - merges[i]), merges[i], sp + 1);
        json_object_set_new(vocab, cat, json_integer(256 + (json_int_t)i));
        json_array_append_new(jm, json_string(merges[i]));
    }
    json_t *root = json_pack(
        "{s:s, s:n, s:o, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]},"
        " s:{s:s, s:o, s:o}, s:{s:s}}",
        "version", "1.0", "normalizer", "added_tokens", json_loads(added, 0, NULL),
        "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
        "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
        "trim_offsets", 0, "use_regex", 0, "model", "type", "BPE", "vocab", vocab, "merges", jm,
        "decoder", "type", "ByteLevel");
    assert_non_null(root);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

static nx_tokenizer *load_bytelevel(const char *const *merges, size_t n, const char *added) {
    char *json = bytelevel_json(merges, n, added);
    nx_tokenizer *t = load_text(json);
    free(json);
    return t;
}

static char *decode_ids(const nx_tokenizer *t, const int32_t *ids, size_t n, bool skip) {
    char *s = NULL;
    nx_error err = {0};
    assert_int_equal(nx_tokenizer_decode(t, ids, n, skip, &s, &err), NX_OK);
    return s;
}

/* ---------------------------------------------------------------- unit tests */

/* The lowest-ranked pair merges first, wherever it is in the word. */
static void test_merge_order(void **state) {
    (void)state;
    /* "abc": with (b c) ranked before (a b), the result is a + bc. */
    const char *m1[] = {"b c", "a b"};
    nx_tokenizer *t = load_bytelevel(m1, 2, "[]");
    EXPECT(t, "abc", true, 'a', 256);
    EXPECT(t, "ab", true, 257);
    nx_tokenizer_free(t);
    /* Reversed ranks, plus a merge of the merged pair. */
    const char *m2[] = {"a b", "b c", "ab c"};
    t = load_bytelevel(m2, 3, "[]");
    EXPECT(t, "abc", true, 258);
    EXPECT(t, "bcab", true, 257, 256);
    /* Ties on rank go left to right: "aaa" with (a a) -> aa + a. */
    nx_tokenizer_free(t);
    const char *m3[] = {"a a"};
    t = load_bytelevel(m3, 1, "[]");
    EXPECT(t, "aaa", true, 256, 'a');
    EXPECT(t, "aaaa", true, 256, 256);
    nx_tokenizer_free(t);
}

/* The pre-tokenizer keeps merges inside words; spaces become the Ġ byte character. */
static void test_bytelevel_words(void **state) {
    (void)state;
    const char *m[] = {"Ġ t", "h e", "Ġt he"};
    nx_tokenizer *t = load_bytelevel(m, 3, "[]");
    EXPECT(t, "the the", true, 't', 257, 258);
    EXPECT(t, " \t", true, ' ', '\t');
    assert_int_equal(nx_tokenizer_vocab_size(t), 259);
    assert_string_equal(nx_tokenizer_token_str(t, 258), "Ġthe");
    assert_int_equal(nx_tokenizer_token_id(t, "Ġthe"), 258);
    assert_int_equal(nx_tokenizer_token_id(t, "nope"), -1);
    assert_null(nx_tokenizer_token_str(t, 259));
    assert_null(nx_tokenizer_token_str(t, -1));
    nx_tokenizer_free(t);
}

static const char ADDED[] =
    "[{\"id\": 300, \"content\": \"<|im_start|>\", \"special\": true, \"normalized\": false},"
    " {\"id\": 301, \"content\": \"<|im_end|>\", \"special\": true},"
    " {\"id\": 302, \"content\": \"<think>\", \"special\": false},"
    " {\"id\": 303, \"content\": \"<|im_start|>x\", \"special\": true},"
    " {\"id\": 304, \"content\": \"<s>\", \"special\": true, \"lstrip\": true, \"rstrip\": true}]";

static void test_added_tokens(void **state) {
    (void)state;
    nx_tokenizer *t = load_bytelevel(NULL, 0, ADDED);
    assert_int_equal(nx_tokenizer_vocab_size(t), 305);
    EXPECT(t, "<|im_start|>a<|im_end|>", true, 300, 'a', 301);
    /* Longest match at the leftmost position wins. */
    EXPECT(t, "<|im_start|>xy", true, 303, 'y');
    /* Special tokens are plain text unless parse_special; non-special ones always split. */
    EXPECT(t, "<|im_end|>", false, '<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>');
    EXPECT(t, "a<think>b", false, 'a', 302, 'b');
    EXPECT(t, "a<think>b", true, 'a', 302, 'b');
    /* lstrip / rstrip swallow the neighbouring whitespace. */
    EXPECT(t, "a \t<s>  b", true, 'a', 304, 'b');
    assert_true(nx_tokenizer_is_special(t, 300));
    assert_false(nx_tokenizer_is_special(t, 302));
    assert_false(nx_tokenizer_is_special(t, 'a'));
    assert_false(nx_tokenizer_is_special(t, 100000));
    assert_int_equal(nx_tokenizer_token_id(t, "<|im_end|>"), 301);
    assert_string_equal(nx_tokenizer_token_str(t, 302), "<think>");

    const int32_t ids[] = {300, 'h', 'i', 302, 301};
    char *s = decode_ids(t, ids, 5, false);
    assert_string_equal(s, "<|im_start|>hi<think><|im_end|>");
    free(s);
    s = decode_ids(t, ids, 5, true);
    assert_string_equal(s, "hi<think>");
    free(s);
    nx_tokenizer_free(t);
}

/* Without a byte-level alphabet, unknown characters fall back to <0xXX> tokens, then to unk. */
static void test_byte_fallback(void **state) {
    (void)state;
    nx_tokenizer *t = load_text(
        "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\","
        " \"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, \"ab\": 3, \"<0xC3>\": 4, \"<0xA9>\": 5},"
        " \"merges\": [[\"a\", \"b\"]]}}");
    EXPECT(t, "abé", true, 3, 4, 5);
    EXPECT(t, "aü", true, 1, 0); /* 0xBC has no byte token: unk */
    nx_tokenizer_free(t);
    /* fuse_unk joins consecutive unknowns into one unk. */
    t = load_text("{\"model\": {\"type\": \"BPE\", \"fuse_unk\": true, \"unk_token\": \"?\","
                  " \"vocab\": {\"?\": 0, \"a\": 1}, \"merges\": []}}");
    EXPECT(t, "xyza", true, 0, 1);
    nx_tokenizer_free(t);
}

/* ignore_merges makes every whole piece that is in the vocabulary one token, which also shows
 * the piece boundaries of each Split behaviour. */
static void test_split_behaviors(void **state) {
    (void)state;
    static const struct {
        const char *behavior;
        bool invert;
        int32_t want[4];
        size_t n;
    } cases[] = {
        {"Isolated", false, {0, 1, 2}, 3},  {"Removed", false, {0, 2}, 2},
        {"MergedWithPrevious", false, {3, 2}, 2}, {"MergedWithNext", false, {0, 4}, 2},
        {"Contiguous", false, {0, 1, 2}, 3}, {"Removed", true, {1}, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"},"
                 " \"behavior\": \"%s\", \"invert\": %s},"
                 " \"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\":"
                 " {\"a\": 0, \" \": 1, \"b\": 2, \"a \": 3, \" b\": 4, \"a b\": 5}, \"merges\": []}}",
                 cases[i].behavior, cases[i].invert ? "true" : "false");
        nx_tokenizer *t = load_text(json);
        expect_ids(t, "a b", true, cases[i].want, cases[i].n);
        nx_tokenizer_free(t);
    }
}

static void test_normalizer_nfc(void **state) {
    (void)state;
    nx_tokenizer *t = load_text(
        "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]},"
        " \"model\": {\"type\": \"BPE\", \"vocab\": {\"\xC3\xA9\": 0, \"e\": 1, \"\xCC\x81\": 2},"
        " \"merges\": []}}");
    EXPECT(t, "e\xCC\x81", true, 0); /* e + combining acute composes to é */
    nx_tokenizer_free(t);
    t = load_text("{\"normalizer\": {\"type\": \"NFD\"}, \"model\": {\"type\": \"BPE\", \"vocab\":"
                  " {\"\xC3\xA9\": 0, \"e\": 1, \"\xCC\x81\": 2}, \"merges\": []}}");
    EXPECT(t, "\xC3\xA9", true, 1, 2);
    nx_tokenizer_free(t);
}

static void test_invalid_utf8(void **state) {
    (void)state;
    nx_tokenizer *t = load_bytelevel(NULL, 0, "[]");
    static const char *const bad[] = {"\xC3", "a\xFF", "\xE0\x80\x80", "\xED\xA0\x80",
                                      "\xF4\x90\x80\x80", "\xC0\xAF", "ok\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 7;
        nx_error err = {0};
        assert_int_equal(nx_tokenizer_encode(t, bad[i], strlen(bad[i]), true, &ids, &n, &err),
                         NX_E_ARG);
        assert_null(ids);
        assert_non_null(strstr(err.msg, "UTF-8"));
    }
    /* Embedded NULs are valid text. */
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(nx_tokenizer_encode(t, "a\0b", 3, true, &ids, &n, NULL), NX_OK);
    assert_int_equal(n, 3);
    free(ids);
    nx_tokenizer_free(t);
}

/* Each malformed file fails with NX_E_FORMAT (or UNSUPPORTED) and a message naming the field. */
static void test_load_errors(void **state) {
    (void)state;
    static const struct {
        const char *json, *needle;
        nx_status st;
    } cases[] = {
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [", "invalid JSON", NX_E_FORMAT},
        {"", "invalid JSON", NX_E_FORMAT},
        {"[1, 2]", "top level", NX_E_FORMAT},
        {"{}", "model", NX_E_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"merges\": []}}", "model.vocab", NX_E_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", "model.merges", NX_E_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", "model.vocab", NX_E_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999999}, \"merges\": []}}", "out of range", NX_E_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", "model.vocab", NX_E_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}", "model.merges[0]", NX_E_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}", "model.merges[0]", NX_E_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]}}", "model.merges[0]", NX_E_FORMAT},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}, \"merges\": []}}", "model.type", NX_E_UNSUPPORTED},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": [], \"unk_token\": \"u\"}}", "model.unk_token", NX_E_FORMAT},
        {"{\"added_tokens\": [{\"content\": \"x\"}], \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "added_tokens[0].id", NX_E_FORMAT},
        {"{\"added_tokens\": [{\"id\": 1, \"content\": \"\"}], \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "added_tokens[0].content", NX_E_FORMAT},
        {"{\"added_tokens\": 5, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "added_tokens", NX_E_FORMAT},
        {"{\"normalizer\": {\"type\": \"Bogus\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "normalizer.type", NX_E_UNSUPPORTED},
        {"{\"normalizer\": {\"type\": \"Sequence\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "normalizer.normalizers", NX_E_FORMAT},
        {"{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}]}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "pre_tokenizer.pretokenizers[0].pattern", NX_E_FORMAT},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "pre_tokenizer.behavior", NX_E_FORMAT},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {}, \"behavior\": \"Isolated\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "pre_tokenizer.pattern", NX_E_FORMAT},
        {"{\"decoder\": {\"type\": \"WordPiece\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "decoder.type", NX_E_UNSUPPORTED},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": [], \"byte_fallback\": 3}}", "byte_fallback", NX_E_FORMAT},
        /* an empty or inconsistent vocabulary: tokenizing with it would lose text */
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "model.vocab: empty", NX_E_FORMAT},
        {"{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\"}], \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
         "model.vocab: empty", NX_E_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 1}, \"merges\": []}}", "share id 1", NX_E_FORMAT},
        {"{\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\"}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}}",
         "added_tokens[0]: id 1 is already \"b\" in model.vocab", NX_E_FORMAT},
        {"{\"added_tokens\": [{\"id\": 2, \"content\": \"<s>\"}, {\"id\": 2, \"content\": \"</s>\"}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
         "added_tokens[1]: id 2 is already \"<s>\" (another added token)", NX_E_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nx_tokenizer *t = (nx_tokenizer *)1;
        nx_error err = {0};
        nx_status st = nx_tokenizer_load(write_fixture("bad.json", cases[i].json), &t, &err);
        if (st != cases[i].st || !strstr(err.msg, cases[i].needle))
            fprintf(stderr, "case %zu: status %d, message: %s\n", i, st, err.msg);
        assert_int_equal(st, cases[i].st);
        assert_null(t);
        assert_non_null(strstr(err.msg, cases[i].needle));
        assert_non_null(strstr(err.msg, "bad.json")); /* the file is named too */
    }
    nx_tokenizer *t = NULL;
    nx_error err = {0};
    assert_int_equal(nx_tokenizer_load("/nonexistent/tokenizer.json", &t, &err), NX_E_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/tokenizer.json"));
    nx_tokenizer_free(NULL);
}

static void test_decode_errors(void **state) {
    (void)state;
    nx_tokenizer *t = load_bytelevel(NULL, 0, "[]");
    const int32_t bad[] = {'a', 256};
    char *s = (char *)1;
    nx_error err = {0};
    assert_int_equal(nx_tokenizer_decode(t, bad, 2, false, &s, &err), NX_E_ARG);
    assert_null(s);
    assert_non_null(strstr(err.msg, "256"));
    const int32_t neg[] = {-1};
    assert_int_equal(nx_tokenizer_decode(t, neg, 1, false, &s, &err), NX_E_ARG);
    /* Empty input decodes to "". */
    s = decode_ids(t, NULL, 0, false);
    assert_string_equal(s, "");
    free(s);
    /* A lone continuation byte decodes to U+FFFD; a cut emoji too. */
    const int32_t cut[] = {0xF0, 0x9F, 0x98, 'x', 0x80};
    s = decode_ids(t, cut, 5, false);
    assert_string_equal(s, "\xEF\xBF\xBDx\xEF\xBF\xBD");
    free(s);

    nx_detok *d = NULL;
    assert_int_equal(nx_detok_new(t, false, &d, &err), NX_OK);
    char *out = NULL;
    size_t n = 0;
    assert_int_equal(nx_detok_push(d, 1000, &out, &n, &err), NX_E_ARG);
    assert_null(out);
    assert_int_equal(nx_detok_push(d, -5, &out, &n, &err), NX_E_ARG);
    nx_detok_free(d);
    nx_detok_free(NULL);
    nx_tokenizer_free(t);
}

/* Streaming: bytes of an emoji split over several tokens come out only once complete, the
 * concatenation equals decode(), and an unfinished character is flushed as U+FFFD. */
static void test_detok_stream(void **state) {
    (void)state;
    const char *m[] = {"ð Ł", "ĺ ĺ"}; /* F0 9F and 98 98 are merged tokens */
    nx_tokenizer *t = load_bytelevel(m, 2, ADDED);
    const char *text = "a😀😘<|im_end|>é👨‍👩‍👧";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    assert_int_equal(nx_tokenizer_encode(t, text, strlen(text), true, &ids, &n_ids, NULL), NX_OK);
    char *whole = decode_ids(t, ids, n_ids, false);
    assert_string_equal(whole, text);

    nx_detok *d = NULL;
    assert_int_equal(nx_detok_new(t, false, &d, NULL), NX_OK);
    char acc[256] = {0};
    size_t acc_n = 0;
    for (size_t i = 0; i < n_ids; i++) {
        char *out = NULL;
        size_t n = 0;
        assert_int_equal(nx_detok_push(d, ids[i], &out, &n, NULL), NX_OK);
        assert_non_null(out);
        assert_int_equal(strlen(out), n);
        /* Every chunk is whole UTF-8 on its own. */
        int32_t *tmp = NULL;
        size_t tn = 0;
        assert_int_equal(nx_tokenizer_encode(t, out, n, false, &tmp, &tn, NULL), NX_OK);
        free(tmp);
        if (i == 1) assert_int_equal(n, 0); /* "a" then F0 9F: nothing yet */
        memcpy(acc + acc_n, out, n);
        acc_n += n;
        free(out);
    }
    char *out = NULL;
    size_t n = 0;
    assert_int_equal(nx_detok_flush(d, &out, &n, NULL), NX_OK);
    assert_int_equal(n, 0);
    free(out);
    assert_string_equal(acc, text);
    nx_detok_free(d);

    /* Cut after the first two bytes of an emoji: flush gives one U+FFFD. */
    assert_int_equal(nx_detok_new(t, true, &d, NULL), NX_OK);
    assert_int_equal(nx_detok_push(d, 'x', &out, &n, NULL), NX_OK);
    assert_string_equal(out, "x");
    free(out);
    assert_int_equal(nx_detok_push(d, 256, &out, &n, NULL), NX_OK);
    assert_int_equal(n, 0);
    free(out);
    assert_int_equal(nx_detok_push(d, 301, &out, &n, NULL), NX_OK); /* special: skipped */
    assert_int_equal(n, 0);
    free(out);
    assert_int_equal(nx_detok_flush(d, &out, &n, NULL), NX_OK);
    assert_string_equal(out, "\xEF\xBF\xBD");
    free(out);
    nx_detok_free(d);
    free(whole);
    free(ids);
    nx_tokenizer_free(t);
}

/* decode(encode(x)) == x over random well-formed UTF-8 (controls, CJK, astral planes). */
static void test_roundtrip_random(void **state) {
    (void)state;
    const char *m[] = {"Ġ t", "h e", "Ġt he", "ä ¸", "ð Ł"};
    nx_tokenizer *t = load_bytelevel(m, 5, ADDED);
    uint64_t rng = 12345;
    for (int iter = 0; iter < 300; iter++) {
        char text[512];
        size_t n = 0;
        int len = (int)(rng % 60);
        for (int i = 0; i < len; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(rng >> 33), cp;
            switch (r % 6) {
            case 0: cp = 1 + r % 127; break; /* decode output is NUL-terminated */
            case 1: cp = " \t\n\r'"[r % 5]; break;
            case 2: cp = 0x80 + r % 0x780; break;
            case 3: cp = 0x4E00 + r % 0x5000; break;
            case 4: cp = 0x1F300 + r % 0x300; break;
            default: cp = 0x10000 + r % 0xFFFF0; break;
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 'z';
            if (cp < 0x80) text[n++] = (char)cp;
            else if (cp < 0x800) {
                text[n++] = (char)(0xC0 | (cp >> 6));
                text[n++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                text[n++] = (char)(0xE0 | (cp >> 12));
                text[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                text[n++] = (char)(0x80 | (cp & 0x3F));
            } else {
                text[n++] = (char)(0xF0 | (cp >> 18));
                text[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                text[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                text[n++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        int32_t *ids = NULL;
        size_t n_ids = 0;
        assert_int_equal(nx_tokenizer_encode(t, text, n, iter % 2, &ids, &n_ids, NULL), NX_OK);
        char *back = NULL;
        assert_int_equal(nx_tokenizer_decode(t, ids, n_ids, false, &back, NULL), NX_OK);
        assert_int_equal(strlen(back), n);
        assert_memory_equal(back, text, n);
        free(back);
        free(ids);
    }
    nx_tokenizer_free(t);
}

/* ---------------------------------------------------------------- parity mode */

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "#   %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 64 ? " ...\n" : "\n");
}

/* Compares one case; returns the number of failed checks. */
static int parity_case(const nx_tokenizer *t, const json_t *c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const json_t *jt = json_object_get(c, "text");
    const char *text = json_string_value(jt);
    size_t len = json_string_length(jt);
    const json_t *jids = json_object_get(c, "ids");
    size_t n_want = json_array_size(jids);
    int fails = 0;

    int32_t *ids = NULL;
    size_t n = 0;
    nx_error err = {0};
    if (nx_tokenizer_encode(t, text, len, true, &ids, &n, &err) != NX_OK) {
        fprintf(stderr, "# %s: encode failed: %s\n", name, err.msg);
        return 1;
    }
    int32_t *want = calloc(n_want + 1, sizeof *want);
    for (size_t i = 0; i < n_want; i++)
        want[i] = (int32_t)json_integer_value(json_array_get(jids, i));
    if (n != n_want || memcmp(ids, want, n * sizeof *ids) != 0) {
        size_t k = 0;
        while (k < n && k < n_want && ids[k] == want[k]) k++;
        fprintf(stderr, "# %s: ids differ from the reference (first at index %zu)\n", name, k);
        print_ids("expected", want, n_want);
        print_ids("got", ids, n);
        fails++;
    }
    static const char *const keys[] = {"decoded", "decoded_skip"};
    char *dec[2] = {NULL, NULL};
    for (int skip = 0; skip < 2; skip++) {
        if (nx_tokenizer_decode(t, want, n_want, skip, &dec[skip], &err) != NX_OK) {
            fprintf(stderr, "# %s: decode failed: %s\n", name, err.msg);
            fails++;
            continue;
        }
        const char *exp = json_string_value(json_object_get(c, keys[skip]));
        if (!exp || strcmp(exp, dec[skip]) != 0) {
            fprintf(stderr, "# %s: %s differs:\n#   expected \"%s\"\n#   got      \"%s\"\n", name,
                    keys[skip], exp ? exp : "(null)", dec[skip]);
            fails++;
        }
    }
    /* Streaming gives exactly decode() */
    nx_detok *d = NULL;
    if (dec[0] && nx_detok_new(t, false, &d, &err) == NX_OK) {
        size_t dl = strlen(dec[0]), got = 0;
        char *acc = malloc(dl + 16);
        bool ok = true;
        for (size_t i = 0; i <= n_want && ok; i++) {
            char *out = NULL;
            size_t on = 0;
            nx_status st = i < n_want ? nx_detok_push(d, want[i], &out, &on, &err)
                                      : nx_detok_flush(d, &out, &on, &err);
            ok = st == NX_OK && got + on <= dl;
            if (ok) memcpy(acc + got, out, on);
            got += on;
            free(out);
        }
        if (!ok || got != dl || memcmp(acc, dec[0], dl) != 0) {
            fprintf(stderr, "# %s: streaming detokenizer differs from decode()\n", name);
            fails++;
        }
        free(acc);
        nx_detok_free(d);
    }
    free(dec[0]);
    free(dec[1]);
    free(ids);
    free(want);
    return fails;
}

static int run_parity(const char *tok_path, const char *expected_path) {
    nx_tokenizer *t = NULL;
    nx_error err = {0};
    double t0 = now_sec();
    if (nx_tokenizer_load(tok_path, &t, &err) != NX_OK) {
        fprintf(stderr, "# load failed: %s\n", err.msg);
        return 1;
    }
    double t_load = now_sec() - t0;
    json_error_t jerr;
    json_t *root = json_load_file(expected_path, JSON_ALLOW_NUL, &jerr);
    const json_t *cases = root ? json_object_get(root, "cases") : NULL;
    if (!json_is_array(cases)) {
        fprintf(stderr, "# %s: unreadable: %s\n", expected_path, jerr.text);
        nx_tokenizer_free(t);
        json_decref(root);
        return 1;
    }
    int failed = 0;
    size_t i;
    const json_t *c;
    json_array_foreach(cases, i, c) failed += parity_case(t, c) ? 1 : 0;

    /* One long input: all case texts repeated to >= 64 KiB must encode in one call (the
     * pre-tokenizer's match limit is per call, so a quadratic regex path fails here). Its speed
     * is measured by bench/tokenize, not asserted here. */
    char *big = NULL;
    size_t big_n = 0;
    while (big_n < 65536) {
        json_array_foreach(cases, i, c) {
            const json_t *jt = json_object_get(c, "text");
            size_t l = json_string_length(jt);
            big = realloc(big, big_n + l + 1);
            memcpy(big + big_n, json_string_value(jt), l);
            big_n += l;
        }
    }
    int32_t *ids = NULL;
    size_t n = 0;
    nx_status st = nx_tokenizer_encode(t, big, big_n, true, &ids, &n, &err);
    if (st != NX_OK || n == 0 || n > big_n) {
        fprintf(stderr, "# big encode of %zu bytes failed (%zu ids): %s\n", big_n, n, st != NX_OK ? err.msg : "");
        failed++;
    }
    printf("cases %zu failed %d load_s %.3f encode_bytes %zu encode_tokens %zu\n", json_array_size(cases), failed,
           t_load, big_n, n);
    free(ids);
    free(big);
    json_decref(root);
    nx_tokenizer_free(t);
    return failed ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--parity") == 0) return run_parity(argv[2], argv[3]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--parity tokenizer.json expected.json]\n", argv[0]);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_order),      cmocka_unit_test(test_bytelevel_words),
        cmocka_unit_test(test_added_tokens),     cmocka_unit_test(test_byte_fallback),
        cmocka_unit_test(test_split_behaviors),  cmocka_unit_test(test_normalizer_nfc),
        cmocka_unit_test(test_invalid_utf8),     cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_decode_errors),    cmocka_unit_test(test_detok_stream),
        cmocka_unit_test(test_roundtrip_random),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
