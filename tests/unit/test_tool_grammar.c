/* Tool-call arguments (constrain/tool_grammar.h): calls the recogniser accepts and refuses, written
 * token by token on a small vocabulary; random walks it drives itself, each read back by the
 * server's own call parser (serve/hy_output.h) and checked against the tools' schemas by hand;
 * the mask agreeing with the step function on every token; and the sampler under the grammar. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/tool_grammar.h"
#include "nextn.h"
#include "serve/dsv31_output.h"
#include "serve/glm_output.h"
#include "serve/hy_output.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)((rng >> 33) % n);
}

/* The vocabulary: ids 0..255 single bytes, then words, then the eight markers, an end id and a
 * special token that is none of them. */
static const char *const words[] = {"days", "city", "unit", "flags", "code", "tag", "\xc3\xa9", "true", "false", "12", "1", " Paris",
                                    "\n",   "get_weather", "other", "ci", "[", "]", ",", "\"c\"", "\"f\"",
                                    "get", "_weather", "null", "-3", "140", "7"};
#define N_WORDS (int)(sizeof words / sizeof words[0])
enum { W0 = 256, MK0 = W0 + N_WORDS, END = MK0 + 8, OTHER_SPECIAL, NV };
enum { CALL_OPEN = MK0, CALL_CLOSE, CALLS_CLOSE, SEP, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE };
static const nx_tool_markers MK = {{CALL_OPEN, CALL_CLOSE, CALLS_CLOSE, SEP, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE},
                                   false, false, false, false, false};

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]},\"flags\":{\"type\":\"array\",\"items\":{\"type\":"
    "\"boolean\"},\"maxItems\":3},\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}$\"},"
    "\"tag\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":2},\"note\":{\"type\":\"string\",\"minLength\":2}},\"required\":[\"city\",\"days\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"other\"}}]";

static nx_json_vocab *vocab;
static json_t *tools;
static char tok_bytes[W0][2];

static int setup(void **state) {
    (void)state;
    const char *toks[NV];
    size_t lens[NV];
    for (int i = 0; i < W0; i++) {
        tok_bytes[i][0] = (char)i;
        toks[i] = tok_bytes[i];
        lens[i] = 1;
    }
    for (int i = 0; i < N_WORDS; i++) toks[W0 + i] = words[i], lens[W0 + i] = strlen(words[i]);
    for (int i = MK0; i < NV; i++) toks[i] = NULL, lens[i] = 0;
    const int32_t end = END;
    if (nx_json_vocab_from_bytes(toks, lens, NV, &end, 1, &vocab, NULL) != NX_OK) return -1;
    tools = json_loads(TOOLS, 0, NULL);
    return tools ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    nx_json_vocab_free(vocab);
    json_decref(tools);
    return 0;
}

static int word(const char *w) {
    for (int i = 0; i < N_WORDS; i++)
        if (strcmp(words[i], w) == 0) return W0 + i;
    fail_msg("no word %s", w);
    return -1;
}

/* Steps ids through g from its start; the index of the first refused id, or n (all taken). */
static int run(const nx_tool_grammar *g, const int *ids, int n, nx_tool_state *st) {
    nx_tool_init(g, st);
    for (int i = 0; i < n; i++)
        if (!nx_tool_step(g, st, ids[i])) return i;
    return n;
}

static nx_tool_grammar *grammar(const char *only) {
    nx_tool_grammar *g = NULL;
    nx_error err = {0};
    assert_int_equal(nx_tool_grammar_new(tools, only, &MK, vocab, &g, &err), NX_OK);
    return g;
}

#define K(w) KEY_OPEN, word(w), KEY_CLOSE
#define V(...) VALUE_OPEN, __VA_ARGS__, VALUE_CLOSE

static void test_named_calls(void **state) {
    (void)state;
    nx_tool_grammar *g = grammar("get_weather");
    nx_tool_state st;
    const int nl = word("\n");
    /* accepted: the required keys in order, optional ones skipped or given */
    const int good1[] = {nl, K("city"), nl, V(word(" Paris")), nl, K("days"), V(word("12")), nl, CALL_CLOSE, nl, CALLS_CLOSE, END};
    const int n1 = (int)(sizeof good1 / sizeof *good1);
    assert_int_equal(run(g, good1, n1, &st), n1);
    assert_true(nx_tool_done(&st));
    const int good2[] = {K("city"), V('P'), K("days"), V(word("7")), K("unit"), V('c'), K("flags"),
                         V(word("["), word("true"), word(","), word("false"), word("]")), K("code"), V('X', 'Y', 'Z'),
                         K("tag"), V(word("\xc3\xa9"), 'x'), KEY_OPEN, 'n', 'o', 't', 'e', KEY_CLOSE,
                         V(word("\xc3\xa9"), word("\xc3\xa9"), 'x'), CALL_CLOSE, CALLS_CLOSE};
    const int n2 = (int)(sizeof good2 / sizeof *good2);
    assert_int_equal(run(g, good2, n2, &st), n2);
    /* an empty text value is a string */
    const int good3[] = {K("city"), VALUE_OPEN, VALUE_CLOSE, K("days"), V(word("1")), CALL_CLOSE, CALLS_CLOSE};
    const int n3 = (int)(sizeof good3 / sizeof *good3);
    assert_int_equal(run(g, good3, n3, &st), n3);
    /* refused, at the id given */
    struct {
        int ids[24], n, at;
        const char *why;
    } bad[] = {
        {{K("days")}, 3, 1, "days before the required city"},
        {{KEY_OPEN, word("ci"), 'x', KEY_CLOSE}, 4, 2, "no key 'cix'"},
        {{KEY_OPEN, word("ci"), KEY_CLOSE}, 3, 2, "key cut short"},
        {{K("city"), V('x'), CALL_CLOSE}, 7, 6, "call closed without days"},
        {{K("city"), V('x'), K("days"), V(word("140"))}, 11, 10, "days above maximum 14"},
        {{K("city"), V('x'), K("days"), V(word("-3"))}, 11, 10, "days below minimum 1"},
        {{K("city"), V('x'), K("days"), VALUE_OPEN, 'x'}, 11, 10, "days not a number"},
        {{K("city"), V('x'), K("days"), VALUE_OPEN, VALUE_CLOSE}, 11, 10, "days empty"},
        {{K("city"), V('x'), K("days"), V(word("7")), K("city")}, 15, 13, "city twice"},
        {{K("city"), V('x'), K("days"), V(word("7")), K("flags"), V(word("["), word("12"))}, 19, 17, "a flag not a boolean"},
        {{K("city"), V('x'), K("days"), V(word("7")), CALL_CLOSE, CALL_OPEN}, 14, 13, "a second call when one is named"},
        {{K("city"), V('x'), K("days"), V(word("7")), CALL_CLOSE, 'x'}, 14, 13, "text after the call"},
        {{K("city"), V('x'), K("days"), V(word("7")), CALL_CLOSE, CALLS_CLOSE, 'x'}, 15, 14, "text after the calls"},
        {{K("city"), V('x'), K("days"), V(word("7")), END}, 13, 12, "the end inside the calls"},
        {{K("city"), OTHER_SPECIAL}, 4, 3, "another special token"},
        {{K("city"), V('x'), K("days"), V(word("7")), K("unit"), VALUE_OPEN, 'x'}, 17, 16, "a unit not in the enum"},
        {{K("city"), V('x'), K("days"), V(word("7")), K("unit"), VALUE_OPEN, 'c', 'f'}, 18, 17, "a unit past its literal"},
        {{K("city"), V('x'), K("days"), V(word("7")), K("unit"), VALUE_OPEN, VALUE_CLOSE}, 17, 16, "an empty unit"},
        {{K("city"), V('x'), K("days"), V(word("7")), K("code"), VALUE_OPEN, 'A', 'b'}, 18, 17, "a code off its pattern"},
        {{K("city"), V('x'), K("days"), V(word("7")), K("code"), VALUE_OPEN, 'A', 'B', VALUE_CLOSE}, 19, 18, "a code cut short"},
        {{K("city"), V('x'), K("days"), V(word("7")), K("code"), VALUE_OPEN, 'A', 'B', 'C', 'D'}, 20, 19, "a code too long"},
        {{K("city"), V('x'), K("days"), V(word("7")), K("tag"), VALUE_OPEN, VALUE_CLOSE}, 17, 16, "a tag under minLength"},
        {{K("city"), V('x'), K("days"), V(word("7")), KEY_OPEN, 'n', 'o', 't', 'e', KEY_CLOSE, VALUE_OPEN, word("\xc3\xa9"), VALUE_CLOSE}, 21, 20, "a note under minLength"},
        {{K("city"), V('x'), K("days"), V(word("7")), K("tag"), VALUE_OPEN, word("\xc3\xa9"), 'x', 'y'}, 19, 18, "a tag over maxLength"},
        {{' ', ' ', ' ', ' ', ' '}, 5, 4, "a run of whitespace"},
        {{SEP}, 1, 0, "a separator in a named call"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int at = run(g, bad[i].ids, bad[i].n, &st);
        if (at != bad[i].at) fail_msg("%s: refused at %d, expected %d", bad[i].why, at, bad[i].at);
    }
    nx_tool_grammar_free(g);
    /* a tool without parameters takes any keys and text values */
    g = grammar("other");
    const int free_ids[] = {KEY_OPEN, 'q', word("unit"), KEY_CLOSE, V(word("12"), 'x'), CALL_CLOSE, CALLS_CLOSE};
    assert_int_equal(run(g, free_ids, 10, &st), 10);
    const int no_key[] = {KEY_OPEN, KEY_CLOSE};
    assert_int_equal(run(g, no_key, 2, &st), 1);
    nx_tool_grammar_free(g);
}

static void test_required_calls(void **state) {
    (void)state;
    nx_tool_grammar *g = grammar(NULL);
    nx_tool_state st;
    /* the name first, then its body; more calls may follow */
    const int ids[] = {word("get"), word("_weather"), SEP, K("city"), V('a'), K("days"), V(word("7")), CALL_CLOSE,
                       word("\n"), CALL_OPEN, word("other"), SEP, CALL_CLOSE, CALLS_CLOSE, END};
    const int n = (int)(sizeof ids / sizeof *ids);
    assert_int_equal(run(g, ids, n, &st), n);
    const int unknown[] = {'o', 'x'};
    assert_int_equal(run(g, unknown, 2, &st), 1);
    const int cut[] = {word("get"), SEP};
    assert_int_equal(run(g, cut, 2, &st), 1);
    nx_tool_grammar_free(g);
    nx_tool_grammar *none = NULL;
    nx_error err = {0};
    assert_int_equal(nx_tool_grammar_new(tools, "missing", &MK, vocab, &none, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "missing"));
    nx_tool_markers lacking = MK;
    lacking.id[NX_TM_SEP] = -1;
    assert_int_equal(nx_tool_grammar_new(tools, NULL, &lacking, vocab, &none, &err), NX_E_ARG);
    /* more patterns than the budget, counted before anything is compiled */
    json_t *heavy = json_array();
    for (int i = 0; i < 2; i++) {
        json_t *props = json_object();
        for (int k = 0; k < 33; k++) {
            char key[16];
            snprintf(key, sizeof key, "p%d", k);
            json_object_set_new(props, key, json_pack("{s:s, s:s}", "type", "string", "pattern", "^[a-z]{1,9}$"));
        }
        json_array_append_new(heavy, json_pack("{s:s, s:{s:s, s:{s:s, s:o}}}", "type", "function", "function", "name",
                                               i ? "b" : "a", "parameters", "type", "object", "properties", props));
    }
    assert_int_equal(nx_tool_grammar_new(heavy, NULL, &MK, vocab, &none, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "patterns"));
    assert_int_equal(nx_tool_grammar_new(heavy, "a", &MK, vocab, &none, &err), NX_OK); /* one tool's 33 */
    nx_tool_grammar_free(none);
    none = NULL;
    json_decref(heavy);
    json_t *empty = json_array();
    assert_int_equal(nx_tool_grammar_new(empty, NULL, &MK, vocab, &none, &err), NX_E_ARG);
    json_decref(empty);
    assert_null(none);
}

/* GLM-4.5's form: no separator token (the name ends at a newline), no </tool_calls> (an end id
 * follows the last call), raw text only under a "type" of exactly "string". */
static const nx_tool_markers GLM = {{CALL_OPEN, CALL_CLOSE, -1, -1, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE},
                                    true, true, true, false, false};

static nx_tool_grammar *glm_grammar(const json_t *t, const char *only) {
    nx_tool_grammar *g = NULL;
    nx_error err = {0};
    assert_int_equal(nx_tool_grammar_new(t, only, &GLM, vocab, &g, &err), NX_OK);
    return g;
}

/* The text of ids, markers spelled as GLM-4.5 spells them. */
static void glm_spell(const int *ids, int n, char *out, size_t cap) {
    static const char *const mk[8] = {"<tool_call>", "</tool_call>", "", "", "<arg_key>", "</arg_key>",
                                      "<arg_value>", "</arg_value>"};
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        const char *t = ids[i] >= MK0 && ids[i] < MK0 + 8 ? mk[ids[i] - MK0]
                        : ids[i] < W0                     ? tok_bytes[ids[i]]
                        : ids[i] < MK0                    ? words[ids[i] - W0]
                                                          : "";
        const size_t k = ids[i] < W0 ? 1 : strlen(t);
        assert_true(len + k < cap);
        memcpy(out + len, t, k);
        len += k;
    }
    out[len] = '\0';
}

static void test_glm_calls(void **state) {
    (void)state;
    const int nl = word("\n");
    nx_tool_state st;
    uint8_t allow[NV];
    /* named: the prompt opened "<tool_call>get_weather\n"; pairs, </tool_call>, the end */
    nx_tool_grammar *g = glm_grammar(tools, "get_weather");
    const int good[] = {K("city"), nl, V(word(" Paris")), nl, K("days"), nl, V(word("12")), nl, CALL_CLOSE, END};
    const int n = (int)(sizeof good / sizeof *good);
    assert_int_equal(run(g, good, n - 1, &st), n - 1);
    assert_true(nx_tool_can_end(g, &st));
    nx_tool_allowed(g, &st, NV, allow);
    assert_true(allow[END]);
    assert_false(allow[CALL_OPEN]); /* a named call is one call */
    assert_false(allow[CALLS_CLOSE]);
    assert_int_equal(run(g, good, n, &st), n);
    assert_true(nx_tool_done(&st));
    /* read back by the GLM parser as the server reads it */
    char text[512];
    const int head[] = {CALL_OPEN, word("get_weather"), nl};
    glm_spell(head, 3, text, sizeof text);
    glm_spell(good, n - 1, text + strlen(text), sizeof text - strlen(text));
    json_t *calls = nx_glm_parse_tool_calls(text, strlen(text), tools);
    assert_int_equal(json_array_size(calls), 1);
    const json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"city\":\"Paris\",\"days\":12}");
    json_decref(calls);
    struct {
        int ids[16], n, at;
        const char *why;
    } bad[] = {
        {{K("city"), V('x'), K("days"), V(word("7")), END}, 13, 12, "the end inside the call"},
        {{K("city"), V('x'), K("days"), V(word("7")), CALL_CLOSE, CALLS_CLOSE}, 14, 13, "a </tool_calls> wrapper"},
        {{K("city"), V('x'), K("days"), V(word("7")), CALL_CLOSE, CALL_OPEN}, 14, 13, "a second named call"},
        {{K("city"), V('x'), K("days"), V(word("7")), CALL_CLOSE, 'x'}, 14, 13, "text after the call"},
        {{K("city"), V('x'), K("days"), VALUE_OPEN, 'x'}, 11, 10, "days not a number"},
        {{SEP}, 1, 0, "a separator token"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int at = run(g, bad[i].ids, bad[i].n, &st);
        if (at != bad[i].at) fail_msg("%s: refused at %d, expected %d", bad[i].why, at, bad[i].at);
    }
    nx_tool_grammar_free(g);
    /* required: the name up to its newline, then more calls, then the end */
    g = glm_grammar(tools, NULL);
    const int req[] = {word("get"), word("_weather"), nl, K("city"), V('a'), K("days"), V(word("7")), CALL_CLOSE,
                       nl, CALL_OPEN, word("other"), nl, CALL_CLOSE, END};
    const int nr = (int)(sizeof req / sizeof *req);
    assert_int_equal(run(g, req, nr, &st), nr);
    const int cut[] = {word("get"), nl};
    assert_int_equal(run(g, cut, 2, &st), 1);
    const int sep[] = {word("other"), SEP};
    assert_int_equal(run(g, sep, 2, &st), 1);
    nx_tool_grammar_free(g);
    /* a value whose types include a string but whose "type" is not exactly "string" is JSON */
    json_t *mixed = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"m\",\"parameters\":{\"type\":"
                               "\"object\",\"properties\":{\"v\":{\"type\":[\"string\",\"integer\"]}}}}}]", 0, NULL);
    assert_non_null(mixed);
    g = glm_grammar(mixed, "m");
    const int json_v[] = {KEY_OPEN, 'v', KEY_CLOSE, V(word("12")), CALL_CLOSE, END};
    assert_int_equal(run(g, json_v, 8, &st), 8);
    const int quoted[] = {KEY_OPEN, 'v', KEY_CLOSE, V(word("\"c\"")), CALL_CLOSE, END};
    assert_int_equal(run(g, quoted, 8, &st), 8);
    const int raw[] = {KEY_OPEN, 'v', KEY_CLOSE, VALUE_OPEN, 'x'};
    assert_int_equal(run(g, raw, 5, &st), 4);
    nx_tool_grammar_free(g);
    nx_tool_grammar *hy = NULL;
    nx_error err = {0};
    assert_int_equal(nx_tool_grammar_new(mixed, "m", &MK, vocab, &hy, &err), NX_OK); /* Hy3: raw text */
    assert_int_equal(run(hy, raw, 5, &st), 5);
    nx_tool_grammar_free(hy);
    json_decref(mixed);
    /* the markers GLM has must be tokens */
    nx_tool_markers lacking = GLM;
    lacking.id[NX_TM_KEY_OPEN] = -1;
    assert_int_equal(nx_tool_grammar_new(tools, NULL, &lacking, vocab, &hy, &err), NX_E_ARG);
}

/* GLM-4.7's form: GLM-4.5's without the newline, the name ends at the marker after it. */
static const nx_tool_markers GLM47 = {{CALL_OPEN, CALL_CLOSE, -1, -1, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE},
                                      false, true, true, true, false};

static void test_glm47_calls(void **state) {
    (void)state;
    nx_tool_state st;
    nx_tool_grammar *g = NULL;
    nx_error err = {0};
    /* required: "<tool_call>" opened; the name runs into <arg_key> or </tool_call> */
    assert_int_equal(nx_tool_grammar_new(tools, NULL, &GLM47, vocab, &g, &err), NX_OK);
    const int req[] = {word("get"), word("_weather"), K("city"), V('a'), K("days"), V(word("7")), CALL_CLOSE,
                       CALL_OPEN, word("other"), CALL_CLOSE, END};
    const int nr = (int)(sizeof req / sizeof *req);
    assert_int_equal(run(g, req, nr, &st), nr);
    assert_true(nx_tool_done(&st));
    const int nl_name[] = {word("other"), word("\n")};
    assert_int_equal(run(g, nl_name, 2, &st), 1); /* a newline is no part of a name */
    const int part[] = {word("get"), KEY_OPEN};
    assert_int_equal(run(g, part, 2, &st), 1); /* "get" is no tool */
    const int early[] = {word("get_weather"), CALL_CLOSE};
    assert_int_equal(run(g, early, 2, &st), 1); /* city and days are required */
    nx_tool_grammar_free(g);
    /* named: the prompt opened "<tool_call>get_weather"; read back by the GLM parser */
    assert_int_equal(nx_tool_grammar_new(tools, "get_weather", &GLM47, vocab, &g, &err), NX_OK);
    const int good[] = {K("city"), V(word(" Paris")), K("days"), V(word("12")), CALL_CLOSE, END};
    const int n = (int)(sizeof good / sizeof *good);
    assert_int_equal(run(g, good, n, &st), n);
    char text[256];
    const int head[] = {CALL_OPEN, word("get_weather")};
    glm_spell(head, 2, text, sizeof text);
    glm_spell(good, n - 1, text + strlen(text), sizeof text - strlen(text));
    assert_string_equal(text, "<tool_call>get_weather<arg_key>city</arg_key><arg_value> Paris</arg_value>"
                              "<arg_key>days</arg_key><arg_value>12</arg_value></tool_call>");
    json_t *calls = nx_glm_parse_tool_calls(text, strlen(text), tools);
    assert_int_equal(json_array_size(calls), 1);
    const json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"city\":\"Paris\",\"days\":12}");
    json_decref(calls);
    nx_tool_grammar_free(g);
}

/* DeepSeek-V3.1's form: NAME <tool_sep> {JSON} <tool_call_end>, no key / value markers. */
static const nx_tool_markers DSV31 = {{CALL_OPEN, CALL_CLOSE, CALLS_CLOSE, SEP, -1, -1, -1, -1},
                                      false, false, false, false, true};

/* Appends the bytes of text to ids (one id per byte), from *n on. */
static void bytes_of(const char *text, int *ids, int *n) {
    for (const char *p = text; *p; p++) ids[(*n)++] = (unsigned char)*p;
}

static void test_dsv31_calls(void **state) {
    (void)state;
    nx_tool_state st;
    nx_tool_grammar *g = NULL;
    nx_error err = {0};
    /* the key / value markers are not needed; the separator and </tool_calls> are */
    nx_tool_markers lacking = DSV31;
    lacking.id[NX_TM_SEP] = -1;
    assert_int_equal(nx_tool_grammar_new(tools, NULL, &lacking, vocab, &g, &err), NX_E_ARG);
    /* required: names, the arguments object under the function's schema, more calls, the end */
    assert_int_equal(nx_tool_grammar_new(tools, NULL, &DSV31, vocab, &g, &err), NX_OK);
    int ids[128], n = 0;
    ids[n++] = word("get_weather");
    ids[n++] = SEP;
    bytes_of("{\"city\":\"P\",\"days\":7,\"unit\":\"c\"}", ids, &n);
    ids[n++] = CALL_CLOSE;
    ids[n++] = CALL_OPEN;
    ids[n++] = word("other");
    ids[n++] = SEP;
    bytes_of("{\"any\":[1]}", ids, &n);
    ids[n++] = CALL_CLOSE;
    ids[n++] = CALLS_CLOSE;
    ids[n++] = END;
    assert_int_equal(run(g, ids, n, &st), n);
    assert_true(nx_tool_done(&st));
    struct {
        const char *args;
        int at; /* bytes taken before the refusal; -1: the object is taken, </tool_call_end> refused */
        const char *why;
    } bad[] = {
        {"{\"days\":7}", 2, "days before the required city"},
        {"{\"city\":\"P\"}", 11, "the object closed without the required days"},
        {"{\"city\":\"P\",\"days\":1", -1, "the object not closed"},
        {"{\"city\":\"P\",\"days\":15}", 20, "days above maximum 14"},
        {"{\"city\":1", 8, "city not a string"},
        {" {", 0, "text before the object"},
        {"[1]", 0, "not an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        n = 0;
        ids[n++] = word("get_weather");
        ids[n++] = SEP;
        bytes_of(bad[i].args, ids, &n);
        const int want = bad[i].at < 0 ? n : 2 + bad[i].at;
        ids[n++] = CALL_CLOSE;
        const int at = run(g, ids, n, &st);
        if (at != want) fail_msg("%s: refused at %d, expected %d", bad[i].why, at, want);
    }
    const int no_sep[] = {word("other"), '{'};
    assert_int_equal(run(g, no_sep, 2, &st), 1);
    const int end_early[] = {word("other"), SEP, '{', '}', CALL_CLOSE, END};
    assert_int_equal(run(g, end_early, 6, &st), 5); /* </tool_calls> comes first */
    nx_tool_grammar_free(g);
    /* named: the prompt opened the call up to its separator; the mask agrees with the steps */
    assert_int_equal(nx_tool_grammar_new(tools, "get_weather", &DSV31, vocab, &g, &err), NX_OK);
    n = 0;
    bytes_of("{\"city\":\"P\",\"days\":12}", ids, &n);
    ids[n++] = CALL_CLOSE;
    ids[n++] = CALLS_CLOSE;
    ids[n++] = END;
    nx_tool_init(g, &st);
    uint8_t allow[NV];
    for (int i = 0; i < n; i++) {
        nx_tool_allowed(g, &st, NV, allow);
        for (int id = 0; id < NV; id++) {
            nx_tool_state t = st;
            if (allow[id] != nx_tool_step(g, &t, id)) fail_msg("step %d: id %d mask %d", i, id, allow[id]);
        }
        assert_true(allow[ids[i]]);
        assert_true(nx_tool_step(g, &st, ids[i]));
    }
    assert_true(nx_tool_done(&st));
    const int second[] = {'{', '"', 'c', 'i', 't', 'y', '"', ':', '"', 'x', '"', ',', '"', 'd', 'a', 'y', 's', '"',
                          ':', '1', '}', CALL_CLOSE, CALL_OPEN};
    assert_int_equal(run(g, second, 23, &st), 22); /* a named call is one call */
    nx_tool_grammar_free(g);
    /* read back by the DeepSeek-V3.1 parser as the server reads it */
    const char text[] = NX_DSV31_CALL_BEGIN "get_weather" NX_DSV31_SEP "{\"city\":\"P\",\"days\":12}" NX_DSV31_CALL_END
                        NX_DSV31_CALLS_END;
    json_t *calls = nx_dsv31_parse_tool_calls(text, sizeof text - 1, tools);
    assert_int_equal(json_array_size(calls), 1);
    const json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"city\":\"P\",\"days\":12}");
    json_decref(calls);
}

/* The text of ids, markers spelled bare (nx_hy_markers_init with no suffix). */
static void spell(const nx_hy_markers *m, const int *ids, int n, char *out, size_t cap) {
    static const nx_hy_marker of[8] = {NX_HY_CALL_OPEN, NX_HY_CALL_CLOSE, NX_HY_CALLS_CLOSE, NX_HY_SEP,
                                       NX_HY_KEY_OPEN,  NX_HY_KEY_CLOSE,  NX_HY_VALUE_OPEN,  NX_HY_VALUE_CLOSE};
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        const char *t = NULL;
        size_t k = 0;
        if (ids[i] >= MK0 && ids[i] < MK0 + 8) t = m->text[of[ids[i] - MK0]], k = strlen(t);
        else if (ids[i] < W0) t = tok_bytes[ids[i]], k = 1;
        else if (ids[i] < MK0) t = words[ids[i] - W0], k = strlen(t);
        assert_true(len + k < cap);
        if (t) memcpy(out + len, t, k);
        len += k;
    }
    out[len] = '\0';
}

/* get_weather's arguments, checked by hand against its schema. */
static void check_weather(const char *args) {
    json_error_t e;
    json_t *a = json_loads(args, 0, &e);
    if (!json_is_object(a)) fail_msg("arguments not an object: %s", args);
    const char *key;
    json_t *val;
    json_object_foreach(a, key, val) {
        if (!strcmp(key, "city")) assert_true(json_is_string(val));
        else if (!strcmp(key, "days")) {
            if (!(json_is_integer(val) && json_integer_value(val) >= 1 && json_integer_value(val) <= 14))
                fail_msg("days out of its schema: %s", args);
        }
        else if (!strcmp(key, "unit")) {
            if (!json_is_string(val) || (strcmp(json_string_value(val), "c") && strcmp(json_string_value(val), "f")))
                fail_msg("unit out of its enum: %s", args);
        }
        else if (!strcmp(key, "flags")) {
            assert_true(json_is_array(val) && json_array_size(val) <= 3);
            size_t i;
            json_t *x;
            json_array_foreach(val, i, x) assert_true(json_is_boolean(x));
        } else if (!strcmp(key, "code")) {
            const char *v = json_string_value(val);
            if (!v || strlen(v) != 3 || strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != 3) fail_msg("code off its pattern: %s", args);
        } else if (!strcmp(key, "tag")) {
            const char *v = json_string_value(val);
            size_t cps = 0; /* code points: bytes that do not continue a character */
            for (const char *c = v; c && *c; c++) cps += ((unsigned char)*c & 0xc0) != 0x80;
            if (!v || cps < 1 || cps > 2) fail_msg("tag off its lengths: %s", args);
        } else if (!strcmp(key, "note")) {
            const char *v = json_string_value(val);
            size_t cps = 0;
            for (const char *c = v; c && *c; c++) cps += ((unsigned char)*c & 0xc0) != 0x80;
            if (!v || cps < 2) fail_msg("note under its minLength: %s", args);
        } else fail_msg("unknown key %s in %s", key, args);
    }
    if (!json_object_get(a, "city") || !json_object_get(a, "days")) fail_msg("a required key is missing: %s", args);
    json_decref(a);
}

/* Random walks the mask drives (markers and short words favoured so calls end), each checked:
 * every token the mask allows steps, a sample of those it refuses does not, and the finished
 * text read by the server's parser is calls of known tools with valid arguments. */
static void test_random_walks(void **state) {
    (void)state;
    nx_hy_markers m;
    nx_hy_markers_init(&m, NULL, NULL);
    uint8_t allow[NV];
    for (int mode = 0; mode < 2; mode++) {
        nx_tool_grammar *g = grammar(mode ? NULL : "get_weather");
        int finished = 0;
        for (int walk = 0; walk < 400; walk++) {
            int ids[400], n = 0;
            nx_tool_state st;
            nx_tool_init(g, &st);
            while (n < 400 && !nx_tool_done(&st)) {
                nx_tool_allowed(g, &st, NV, allow);
                int pick[NV], np = 0, marks[8], nm = 0;
                for (int i = 0; i < NV; i++) {
                    nx_tool_state t = st;
                    const bool ok = nx_tool_step(g, &t, i);
                    if (allow[i] != ok && (i >= W0 || rnd(8) == 0))
                        fail_msg("token %d: mask %d, step %d", i, allow[i], ok);
                    if (!allow[i]) continue;
                    pick[np++] = i;
                    if (i >= MK0 && i < MK0 + 8) marks[nm++] = i;
                }
                assert_true(np > 0);
                const int id = nm && rnd(3) == 0 ? marks[rnd((uint32_t)nm)] : pick[rnd((uint32_t)np)];
                assert_true(nx_tool_step(g, &st, id));
                ids[n++] = id;
            }
            if (!nx_tool_done(&st)) continue;
            finished++;
            /* the prompt's opening, then the walk */
            char text[8192] = "<tool_calls><tool_call>";
            if (mode == 0) strcat(text, "get_weather<tool_sep>");
            spell(&m, ids, n, text + strlen(text), sizeof text - strlen(text));
            json_t *calls = nx_hy_parse_tool_calls(text, strlen(text), &m, tools);
            assert_true(json_is_array(calls) && json_array_size(calls) >= 1);
            if (mode == 0) assert_int_equal(json_array_size(calls), 1);
            size_t i;
            json_t *c;
            json_array_foreach(calls, i, c) {
                const char *name = json_string_value(json_object_get(json_object_get(c, "function"), "name"));
                const char *args = json_string_value(json_object_get(json_object_get(c, "function"), "arguments"));
                assert_non_null(name);
                assert_non_null(args);
                if (!strcmp(name, "get_weather")) check_weather(args);
                else if (strcmp(name, "other") != 0) fail_msg("unknown tool %s", name);
            }
            json_decref(calls);
        }
        if (finished < 100) fail_msg("only %d of 400 walks finished", finished);
        nx_tool_grammar_free(g);
    }
}

/* The sampler under the grammar: at temperature 1 on random logits, through drafts it verifies
 * (extra tokens) and rewinds, every generation is a call the grammar accepts, then an end. */
static void test_sampler(void **state) {
    (void)state;
    nx_tool_grammar *g = grammar("get_weather");
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.tools = g;
    p.seed = 7;
    nx_sampler *s = NULL;
    assert_int_equal(nx_sampler_new(&p, NV, &s, NULL), NX_OK);
    float logits[NV], probs[NV];
    int done = 0;
    for (int run_i = 0; run_i < 30; run_i++) {
        nx_sampler_rewind(s, 0);
        int ids[300], n = 0;
        while (n < 300) {
            for (int i = 0; i < NV; i++) logits[i] = (float)rnd(1000) / 250.0f + (i >= MK0 ? 2.0f : 0.0f);
            nx_sampler_probs(s, logits, NULL, 0, probs);
            const int32_t a = nx_sampler_draw(s, probs);
            assert_true(probs[a] > 0.0f);
            ids[n++] = a;
            if (a == END) break;
            /* the position after a as a verify pass sees it (a as an extra token): whatever it
             * draws continues a valid call */
            nx_sampler_probs(s, logits, &a, 1, probs);
            ids[n] = nx_sampler_draw(s, probs);
            nx_tool_state t;
            if (run(g, ids, n + 1, &t) != n + 1) fail_msg("run %d: after an extra token, token %d is refused", run_i, ids[n]);
            nx_sampler_accept(s, a);
        }
        nx_tool_state st;
        const int at = run(g, ids, n, &st);
        if (at != n) fail_msg("run %d: the grammar refuses token %d of %d", run_i, at, n);
        done += ids[n - 1] == END;
    }
    assert_true(done >= 10);
    nx_sampler_free(s);
    nx_tool_grammar_free(g);
}

/* min_tokens' ban of the end ids yields where the grammar allows nothing else (the calls are
 * closed), and holds where it does (whitespace may still follow a call). */
static void test_ban_yields(void **state) {
    (void)state;
    nx_tool_grammar *g = grammar("other");
    nx_sampler_params p;
    nx_sampler_params_default(&p);
    p.tools = g;
    const int32_t ban = END;
    p.ban = &ban, p.n_ban = 1, p.ban_until = 1000;
    nx_sampler *s = NULL;
    assert_int_equal(nx_sampler_new(&p, NV, &s, NULL), NX_OK);
    float logits[NV], probs[NV];
    for (int i = 0; i < NV; i++) logits[i] = i == END ? 5.0f : 0.0f;
    nx_sampler_accept(s, CALL_CLOSE);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    assert_true(probs[END] == 0.0f);
    nx_sampler_accept(s, CALLS_CLOSE);
    nx_sampler_probs(s, logits, NULL, 0, probs);
    assert_true(probs[END] == 1.0f);
    const int32_t close = CALLS_CLOSE; /* the same through a draft */
    nx_sampler_rewind(s, 1);
    nx_sampler_probs(s, logits, &close, 1, probs);
    assert_true(probs[END] == 1.0f);
    nx_sampler_free(s);
    nx_tool_grammar_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_named_calls),
        cmocka_unit_test(test_required_calls),
        cmocka_unit_test(test_glm_calls),
        cmocka_unit_test(test_glm47_calls),
        cmocka_unit_test(test_dsv31_calls),
        cmocka_unit_test(test_random_walks),
        cmocka_unit_test(test_sampler),
        cmocka_unit_test(test_ban_yields),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
