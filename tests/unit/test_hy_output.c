/* Hy3 output split and tool-call parser (serve/hy_output.h): the markers found in the shipped
 * tokenizer, the reasoning / content / tool-call routing of token ids, and tool calls parsed
 * from the grammar of docs/design.md §11 with each argument typed by its JSON schema. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "serve/hy_output.h"

#define TOKENIZER "models/nextn-hy3-tiny/tokenizer.json"

static nx_hy_markers M; /* ":opensource" spellings, no tokenizer */

/* The tools of the parser tests: get_weather(city: string, days: integer, metric: boolean,
 * ratio: number, opts: object, tags: array, limit: integer|null, note: string|object) */
static json_t *tools(void) {
    json_error_t err;
    json_t *t = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
        "\"metric\":{\"type\":\"boolean\"},\"ratio\":{\"type\":\"number\"},\"opts\":{\"type\":\"object\"},"
        "\"tags\":{\"type\":\"array\"},\"limit\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"null\"}]},"
        "\"note\":{\"type\":[\"string\",\"object\"]},\"count\":{\"type\":\"uint32\"}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"noargs\"}}]",
        0, &err);
    assert_non_null(t);
    return t;
}

/* "<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n" with M's spellings. */
static void arg(char *buf, size_t cap, const char *k, const char *v) {
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, "%s%s%s\n%s%s%s\n", M.text[NX_HY_KEY_OPEN], k, M.text[NX_HY_KEY_CLOSE],
             M.text[NX_HY_VALUE_OPEN], v, M.text[NX_HY_VALUE_CLOSE]);
}

static void call_open(char *buf, size_t cap, const char *name) {
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, "\n%s%s%s\n", M.text[NX_HY_CALL_OPEN], name, M.text[NX_HY_SEP]);
}

static void append(char *buf, size_t cap, const char *s) {
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, "%s", s);
}

/* The arguments of call i as a JSON object (parsed back from the string OpenAI sends). */
static json_t *args_of(const json_t *calls, size_t i, const char *want_name) {
    const json_t *c = json_array_get(calls, i);
    assert_non_null(c);
    assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
    const json_t *f = json_object_get(c, "function");
    assert_string_equal(json_string_value(json_object_get(f, "name")), want_name);
    const char *a = json_string_value(json_object_get(f, "arguments"));
    assert_non_null(a);
    json_t *o = json_loads(a, 0, NULL);
    assert_true(json_is_object(o));
    return o;
}

static void assert_json(const json_t *got, const char *want) {
    json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
    assert_non_null(w);
    if (!json_equal(got, w)) {
        char *g = json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY);
        fail_msg("got %s, want %s", g ? g : "?", want);
    }
    json_decref(w);
}

/* Call i of calls is function name with exactly the arguments want (JSON). */
static void assert_call(const json_t *calls, size_t i, const char *name, const char *want) {
    json_t *a = args_of(calls, i, name);
    assert_json(a, want);
    json_decref(a);
}

static void test_markers(void **state) {
    (void)state;
    nx_tokenizer *tok = NULL;
    nx_error err = {0};
    assert_int_equal(nx_tokenizer_load(TOKENIZER, &tok, &err), NX_OK);
    nx_hy_markers m;
    nx_hy_markers_init(&m, ":opensource", tok);
    assert_string_equal(m.text[NX_HY_CALLS_OPEN], "<tool_calls:opensource>");
    assert_string_equal(m.text[NX_HY_VALUE_CLOSE], "</arg_value:opensource>");
    assert_string_equal(m.text[NX_HY_THINK_CLOSE], "</think:opensource>");
    for (int i = 0; i < NX_HY_N_MARKERS; i++) {
        assert_true(m.id[i] >= 0);
        assert_true(nx_tokenizer_is_special(tok, m.id[i]));
        assert_string_equal(nx_tokenizer_token_str(tok, m.id[i]), m.text[i]);
    }
    assert_true(nx_hy_markers_tools(&m));
    assert_true(nx_hy_markers_reasoning(&m));
    /* the bare spellings are not tokens of this tokenizer: nothing to split */
    nx_hy_markers_init(&m, NULL, tok);
    assert_string_equal(m.text[NX_HY_SEP], "<tool_sep>");
    assert_int_equal(m.id[NX_HY_SEP], -1);
    assert_false(nx_hy_markers_tools(&m));
    assert_false(nx_hy_markers_reasoning(&m));
    nx_tokenizer_free(tok);
}

static void test_split(void **state) {
    (void)state;
    nx_hy_markers m;
    nx_hy_markers_init(&m, ":opensource", NULL);
    for (int i = 0; i < NX_HY_N_MARKERS; i++) m.id[i] = 100 + i; /* ids of our own */
    const char *mk;
    nx_hy_split s;
    /* a prompt ending in <think> opens the reasoning */
    nx_hy_split_init(&s, &m, true, true, m.id[NX_HY_THINK_OPEN]);
    assert_int_equal(nx_hy_split_token(&s, 5, &mk), NX_HY_REASONING);
    assert_null(mk);
    assert_int_equal(nx_hy_split_token(&s, m.id[NX_HY_THINK_CLOSE], &mk), -1);
    assert_int_equal(nx_hy_split_token(&s, 6, &mk), NX_HY_CONTENT);
    assert_int_equal(nx_hy_split_token(&s, m.id[NX_HY_CALLS_OPEN], &mk), -1);
    assert_int_equal(nx_hy_split_token(&s, m.id[NX_HY_CALL_OPEN], &mk), NX_HY_TOOLS);
    assert_string_equal(mk, "<tool_call:opensource>");
    assert_int_equal(nx_hy_split_token(&s, 7, &mk), NX_HY_TOOLS);
    assert_null(mk);
    /* once in the tool calls, even </think> is their text */
    assert_int_equal(nx_hy_split_token(&s, m.id[NX_HY_THINK_CLOSE], &mk), NX_HY_TOOLS);
    assert_string_equal(mk, "</think:opensource>");
    assert_int_equal(nx_hy_split_token(&s, m.id[NX_HY_CALLS_CLOSE], &mk), NX_HY_TOOLS);
    assert_string_equal(mk, "</tool_calls:opensource>");
    /* no reasoning split asked: the prompt's <think> changes nothing, <think> in the output
     * opens nothing; a <think> inside the output opens reasoning when asked */
    nx_hy_split_init(&s, &m, true, false, m.id[NX_HY_THINK_OPEN]);
    assert_int_equal(nx_hy_split_token(&s, 5, &mk), NX_HY_CONTENT);
    assert_int_equal(nx_hy_split_token(&s, m.id[NX_HY_THINK_OPEN], &mk), NX_HY_CONTENT);
    nx_hy_split_init(&s, &m, false, true, 3);
    assert_int_equal(nx_hy_split_token(&s, 5, &mk), NX_HY_CONTENT);
    assert_int_equal(nx_hy_split_token(&s, m.id[NX_HY_THINK_OPEN], &mk), -1);
    assert_int_equal(nx_hy_split_token(&s, 5, &mk), NX_HY_REASONING);
    /* no tools offered: <tool_calls> is content like any token */
    assert_int_equal(nx_hy_split_token(&s, m.id[NX_HY_CALLS_OPEN], &mk), NX_HY_REASONING);
    /* a tokenizer without the tool markers: no tool split even when asked */
    m.id[NX_HY_SEP] = -1;
    nx_hy_split_init(&s, &m, true, true, 3);
    assert_int_equal(nx_hy_split_token(&s, m.id[NX_HY_CALLS_OPEN], &mk), NX_HY_CONTENT);
}

static void test_parse_calls(void **state) {
    (void)state;
    json_t *t = tools();
    char buf[4096] = "";
    call_open(buf, sizeof buf, " get_weather ");
    arg(buf, sizeof buf, "city", "Paris");
    arg(buf, sizeof buf, "days", " 3 ");
    arg(buf, sizeof buf, "metric", "True");
    arg(buf, sizeof buf, "ratio", "2.5e-1");
    arg(buf, sizeof buf, "opts", "{\"units\": [\"c\", 1]}");
    arg(buf, sizeof buf, "tags", "[1, \"two\"]");
    arg(buf, sizeof buf, "limit", "12");
    arg(buf, sizeof buf, "note", "{\"x\": 1}");
    arg(buf, sizeof buf, "count", "7");
    append(buf, sizeof buf, M.text[NX_HY_CALL_CLOSE]);
    call_open(buf, sizeof buf, "noargs");
    append(buf, sizeof buf, M.text[NX_HY_CALL_CLOSE]);
    append(buf, sizeof buf, "\n");
    append(buf, sizeof buf, M.text[NX_HY_CALLS_CLOSE]);
    json_t *calls = nx_hy_parse_tool_calls(buf, strlen(buf), &M, t);
    assert_non_null(calls);
    assert_int_equal(json_array_size(calls), 2);
    assert_call(calls, 0, "get_weather",
                "{\"city\":\"Paris\",\"days\":3,\"metric\":true,\"ratio\":0.25,\"opts\":{\"units\":[\"c\",1]},"
                "\"tags\":[1,\"two\"],\"limit\":12,\"note\":{\"x\":1},\"count\":7}");
    assert_call(calls, 1, "noargs", "{}");
    json_decref(calls);
    json_decref(t);
}

/* Values that do not parse as their type, and keys or functions without a schema. */
static void test_parse_fallbacks(void **state) {
    (void)state;
    json_t *t = tools();
    char buf[4096] = "";
    call_open(buf, sizeof buf, "get_weather");
    arg(buf, sizeof buf, "city", "{\"looks\": \"like json\"}"); /* a string stays the raw text */
    arg(buf, sizeof buf, "days", "three");                     /* not an integer, not JSON: text */
    arg(buf, sizeof buf, "metric", "[true]");                  /* not a boolean, but JSON */
    arg(buf, sizeof buf, "ratio", "7");                        /* a number without '.' or e: 7 */
    arg(buf, sizeof buf, "limit", "null");                     /* integer|null: JSON null */
    arg(buf, sizeof buf, "unknown", "42");                     /* no schema: a string */
    arg(buf, sizeof buf, "ratio", "inf");                      /* a repeated key: the last wins */
    append(buf, sizeof buf, M.text[NX_HY_CALL_CLOSE]);
    call_open(buf, sizeof buf, "not_offered");
    arg(buf, sizeof buf, "n", "5");
    append(buf, sizeof buf, M.text[NX_HY_CALL_CLOSE]);
    json_t *calls = nx_hy_parse_tool_calls(buf, strlen(buf), &M, t);
    assert_int_equal(json_array_size(calls), 2);
    assert_call(calls, 0, "get_weather",
                "{\"city\":\"{\\\"looks\\\": \\\"like json\\\"}\",\"days\":\"three\",\"metric\":[true],"
                "\"ratio\":\"inf\",\"limit\":null,\"unknown\":\"42\"}");
    assert_call(calls, 1, "not_offered", "{\"n\":\"5\"}");
    json_decref(calls);
    /* no tools at all: the same, untyped */
    calls = nx_hy_parse_tool_calls(buf, strlen(buf), &M, NULL);
    assert_int_equal(json_array_size(calls), 2);
    json_t *a = args_of(calls, 0, "get_weather");
    assert_json(json_object_get(a, "days"), "\"three\"");
    json_decref(a);
    json_decref(calls);
    json_decref(t);
}

/* Cut-short and malformed output. */
static void test_parse_broken(void **state) {
    (void)state;
    json_t *t = tools();
    char buf[4096] = "";
    /* the output ends inside a call (max_tokens): the call counts, its last, unclosed argument
     * does not */
    call_open(buf, sizeof buf, "get_weather");
    arg(buf, sizeof buf, "city", "Oslo");
    append(buf, sizeof buf, M.text[NX_HY_KEY_OPEN]);
    append(buf, sizeof buf, "days");
    append(buf, sizeof buf, M.text[NX_HY_KEY_CLOSE]);
    append(buf, sizeof buf, M.text[NX_HY_VALUE_OPEN]);
    append(buf, sizeof buf, "4");
    json_t *calls = nx_hy_parse_tool_calls(buf, strlen(buf), &M, t);
    assert_int_equal(json_array_size(calls), 1);
    assert_call(calls, 0, "get_weather", "{\"city\":\"Oslo\"}");
    json_decref(calls);
    /* a call whose name is not followed by the separator, an empty name, a key without a
     * value: skipped; text that is no call at all gives an empty array */
    buf[0] = '\0';
    append(buf, sizeof buf, M.text[NX_HY_CALL_OPEN]);
    append(buf, sizeof buf, "  ");
    append(buf, sizeof buf, M.text[NX_HY_SEP]);
    append(buf, sizeof buf, M.text[NX_HY_CALL_CLOSE]);
    call_open(buf, sizeof buf, "noargs");
    append(buf, sizeof buf, M.text[NX_HY_KEY_OPEN]);
    append(buf, sizeof buf, "lonely");
    append(buf, sizeof buf, M.text[NX_HY_KEY_CLOSE]);
    append(buf, sizeof buf, "no value marker");
    arg(buf, sizeof buf, "k", "v");
    append(buf, sizeof buf, M.text[NX_HY_CALL_CLOSE]);
    calls = nx_hy_parse_tool_calls(buf, strlen(buf), &M, t);
    assert_int_equal(json_array_size(calls), 1);
    assert_call(calls, 0, "noargs", "{\"k\":\"v\"}");
    json_decref(calls);
    buf[0] = '\0';
    append(buf, sizeof buf, M.text[NX_HY_CALL_OPEN]);
    append(buf, sizeof buf, "name but no separator");
    calls = nx_hy_parse_tool_calls(buf, strlen(buf), &M, t);
    assert_int_equal(json_array_size(calls), 0);
    json_decref(calls);
    /* bytes that are not UTF-8 (the parser does not rely on its caller's clean-up): a call with
     * such a name is skipped, an argument with such a key or text dropped */
    buf[0] = '\0';
    call_open(buf, sizeof buf, "bad\xc3");
    append(buf, sizeof buf, M.text[NX_HY_CALL_CLOSE]);
    call_open(buf, sizeof buf, "noargs");
    arg(buf, sizeof buf, "k\xff", "v");
    arg(buf, sizeof buf, "w", "\xc3(");
    arg(buf, sizeof buf, "ok", "yes");
    append(buf, sizeof buf, M.text[NX_HY_CALL_CLOSE]);
    calls = nx_hy_parse_tool_calls(buf, strlen(buf), &M, t);
    assert_int_equal(json_array_size(calls), 1);
    assert_call(calls, 0, "noargs", "{\"ok\":\"yes\"}");
    json_decref(calls);
    calls = nx_hy_parse_tool_calls("plain text", 10, &M, t);
    assert_int_equal(json_array_size(calls), 0);
    json_decref(calls);
    calls = nx_hy_parse_tool_calls("", 0, &M, t);
    assert_int_equal(json_array_size(calls), 0);
    json_decref(calls);
    json_decref(t);
}

/* A repeated key stays in the arguments' text (JSON readers take its last value), so the
 * arguments of every prefix of a call's text are a prefix of the final arguments less its closing
 * brace (what the server streams as deltas). */
static void test_parse_repeated_key(void **state) {
    (void)state;
    json_t *t = tools();
    char buf[4096] = "";
    call_open(buf, sizeof buf, "get_weather");
    arg(buf, sizeof buf, "city", "Oslo");
    arg(buf, sizeof buf, "days", "3");
    arg(buf, sizeof buf, "city", "Bergen");
    arg(buf, sizeof buf, "units", "metric");
    append(buf, sizeof buf, M.text[NX_HY_CALL_CLOSE]);
    json_t *calls = nx_hy_parse_tool_calls(buf, strlen(buf), &M, t);
    assert_int_equal(json_array_size(calls), 1);
    assert_call(calls, 0, "get_weather", "{\"city\":\"Bergen\",\"days\":3,\"units\":\"metric\"}");
    const char *final = json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"),
                                                          "arguments"));
    assert_non_null(final);
    assert_string_equal(final, "{\"city\":\"Oslo\",\"days\":3,\"city\":\"Bergen\",\"units\":\"metric\"}");
    const size_t flen = strlen(final);
    for (size_t n = 1; n <= strlen(buf); n++) {
        json_t *part = nx_hy_parse_tool_calls(buf, n, &M, t);
        assert_non_null(part);
        const json_t *c = json_array_get(part, 0);
        const char *a = c ? json_string_value(json_object_get(json_object_get(c, "function"), "arguments")) : NULL;
        if (a) {
            const size_t alen = strlen(a);
            assert_true(alen >= 1 && alen <= flen);
            if (memcmp(a, final, alen - 1) != 0) fail_msg("prefix %zu: %s is not a prefix of %s", n, a, final);
        }
        json_decref(part);
    }
    json_decref(calls);
    json_decref(t);
}

/* The bare spellings (Hy3-preview tokenizers) parse the same way. */
static void test_parse_bare(void **state) {
    (void)state;
    nx_hy_markers bare;
    nx_hy_markers_init(&bare, "", NULL);
    const char *text = "<tool_call>noargs<tool_sep>\n<arg_key>a</arg_key>\n<arg_value>b</arg_value>\n"
                       "</tool_call>\n</tool_calls>";
    json_t *calls = nx_hy_parse_tool_calls(text, strlen(text), &bare, NULL);
    assert_int_equal(json_array_size(calls), 1);
    assert_call(calls, 0, "noargs", "{\"a\":\"b\"}");
    json_decref(calls);
}

int main(void) {
    nx_hy_markers_init(&M, ":opensource", NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_markers),       cmocka_unit_test(test_split),         cmocka_unit_test(test_parse_calls),
        cmocka_unit_test(test_parse_fallbacks), cmocka_unit_test(test_parse_broken), cmocka_unit_test(test_parse_bare),
        cmocka_unit_test(test_parse_repeated_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
