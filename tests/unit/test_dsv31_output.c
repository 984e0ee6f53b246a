/* DeepSeek-V3.1 chat output (serve/dsv31_output.h) through its chat format (serve/chat_format.h
 * entry "deepseek_v31"): tool calls as vLLM's deepseekv31 parser reads them, typed by the
 * request's tools; malformed, cut-short and hostile calls; the reasoning / content / tool split
 * of whole outputs and of the same outputs cut at every byte boundary and fed byte by byte; the
 * calls of every prefix of an output being the first calls of the whole (what a stream sends);
 * and the token-by-token split and grammar markers of the format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chat_split.h"
#include "serve/chat_format.h"
#include "serve/dsv31_output.h"

#define BEGIN NX_DSV31_CALL_BEGIN
#define SEP NX_DSV31_SEP
#define END NX_DSV31_CALL_END
#define CALLS NX_DSV31_CALLS_BEGIN
#define CALLS_END NX_DSV31_CALLS_END

/* get_weather(city: string, days: integer, ratio: number, wind: boolean, opts: object,
 * any: [string, integer]), now() */
static json_t *tools(void) {
    json_t *t = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
                           "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                           "\"days\":{\"type\":\"integer\"},\"ratio\":{\"type\":\"number\"},"
                           "\"wind\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},"
                           "\"any\":{\"type\":[\"string\",\"integer\"]}}}}},"
                           "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]",
                           0, NULL);
    assert_non_null(t);
    return t;
}

static json_t *parse(const char *text, size_t len, const json_t *t) {
    json_t *calls = nx_dsv31_parse_tool_calls(text, len, t);
    assert_non_null(calls);
    return calls;
}


/* A string written for a non-string parameter becomes the value it spells when it fits. */
static void test_typing(void **state) {
    (void)state;
    json_t *t = tools();
    const char text[] = BEGIN "get_weather" SEP " {\"city\": 42, \"days\": \"3\", \"ratio\": \"2.5\", \"wind\": \"true\","
                              " \"opts\": \"{\\\"a\\\": [1]}\", \"any\": \"7\", \"free\": \"8\", \"nested\": {\"k\": \"9\"}} " END;
    json_t *c = parse(text, sizeof text - 1, t);
    assert_int_equal(json_array_size(c), 1);
    chat_assert_call(c, 0, "get_weather",
                "{\"city\":42,\"days\":3,\"ratio\":2.5,\"wind\":true,\"opts\":{\"a\":[1]},\"any\":\"7\",\"free\":\"8\","
                "\"nested\":{\"k\":\"9\"}}");
    json_decref(c);
    /* a string that does not spell its type stays a string; an integer fits "number" */
    const char text2[] = BEGIN "get_weather" SEP "{\"days\": \"three\", \"ratio\": \"4\", \"wind\": \"1\"}" END;
    c = parse(text2, sizeof text2 - 1, t);
    chat_assert_call(c, 0, "get_weather", "{\"days\":\"three\",\"ratio\":4,\"wind\":\"1\"}");
    json_decref(c);
    /* without tools the model's JSON is kept as written (compact, in its order) */
    const char text3[] = BEGIN "get_weather" SEP "{\"days\": \"3\", \"city\": \"Zürich\"}" END;
    c = parse(text3, sizeof text3 - 1, NULL);
    chat_assert_call(c, 0, "get_weather", "{\"days\":\"3\",\"city\":\"Zürich\"}");
    json_decref(c);
    json_decref(t);
}

/* Several calls, names trimmed, empty arguments, what is skipped, and a last call cut short. */
static void test_structure(void **state) {
    (void)state;
    json_t *t = tools();
    const char text[] = BEGIN " now " SEP END BEGIN "get_weather" SEP "{\"city\":\"Rome\"}" END
                        BEGIN SEP "{}" END                              /* no name */
                        BEGIN "now" SEP "[1]" END                       /* not an object */
                        BEGIN "now" SEP "{\"a\":" END                   /* not JSON */
                        BEGIN "now" SEP "x{}" END                       /* text before the object */
                        BEGIN "now" BEGIN "now" SEP "{\"b\":1}" END     /* the first has no separator */
                        BEGIN "get_weather" SEP "{\"city\":\"Oslo\"} and text after it" END CALLS_END "trailing text";
    json_t *c = parse(text, sizeof text - 1, t);
    assert_int_equal(json_array_size(c), 4);
    chat_assert_call(c, 0, "now", "{}");
    chat_assert_call(c, 1, "get_weather", "{\"city\":\"Rome\"}");
    chat_assert_call(c, 2, "now", "{\"b\":1}");
    chat_assert_call(c, 3, "get_weather", "{\"city\":\"Oslo\"}");
    json_decref(c);
    /* cut short (max_tokens): the last call counts once its arguments are one whole object */
    static const struct {
        const char *text, *want;
    } cut[] = {
        {BEGIN "get_wea", NULL},
        {BEGIN "get_weather" SEP, NULL},
        {BEGIN "get_weather" SEP "{\"city\":\"Ro", NULL},
        {BEGIN "get_weather" SEP "{\"city\":\"Rome\"}", "{\"city\":\"Rome\"}"},
        {BEGIN "get_weather" SEP "{\"city\":\"Rome\"}<｜tool▁call", "{\"city\":\"Rome\"}"},
    };
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        c = parse(cut[i].text, strlen(cut[i].text), t);
        assert_int_equal(json_array_size(c), cut[i].want ? 1 : 0);
        if (cut[i].want) chat_assert_call(c, 0, "get_weather", cut[i].want);
        json_decref(c);
    }
    c = parse("no calls <｜tool▁call▁beg", strlen("no calls <｜tool▁call▁beg"), t);
    assert_int_equal(json_array_size(c), 0);
    json_decref(c);
    json_decref(t);
}

/* Bytes that are not UTF-8 drop the call; a NUL ends nothing early; a long name is skipped. */
static void test_bad_bytes(void **state) {
    (void)state;
    const char text[] = BEGIN "bad\xff" SEP "{}" END BEGIN "now" SEP "{\"k\":\"\xc3\"}" END
                        BEGIN "now" SEP "{\"k\":\"a\\u0000b\"}" END BEGIN "n\0w" SEP "{}" END
                        BEGIN "now" SEP "{\"ok\":1}" END;
    json_t *c = parse(text, sizeof text - 1, NULL);
    assert_int_equal(json_array_size(c), 1);
    chat_assert_call(c, 0, "now", "{\"ok\":1}");
    json_decref(c);
    char name[300], buf[400];
    memset(name, 'x', 256);
    name[256] = '\0';
    snprintf(buf, sizeof buf, BEGIN "%s" SEP "{}" END, name);
    c = parse(buf, strlen(buf), NULL);
    assert_int_equal(json_array_size(c), 0);
    json_decref(c);
    name[255] = '\0';
    snprintf(buf, sizeof buf, BEGIN "%s" SEP "{}" END, name);
    c = parse(buf, strlen(buf), NULL);
    assert_int_equal(json_array_size(c), 1);
    json_decref(c);
}

/* Hostile outputs parse to a bounded answer: many openings without a separator, arguments
 * nested past any parser's depth, and one huge value. */
static void test_hostile(void **state) {
    (void)state;
    const size_t reps = 20000, kb = strlen(BEGIN);
    char *text = malloc(reps * kb + 64);
    assert_non_null(text);
    for (size_t i = 0; i < reps; i++) memcpy(text + i * kb, BEGIN, kb);
    json_t *c = parse(text, reps * kb, NULL);
    assert_int_equal(json_array_size(c), 0);
    json_decref(c);
    free(text);
    const size_t depth = 100000;
    text = malloc(2 * depth + 128);
    assert_non_null(text);
    size_t n = (size_t)sprintf(text, BEGIN "now" SEP "{\"a\":");
    memset(text + n, '[', depth);
    n += depth;
    memset(text + n, ']', depth);
    n += depth;
    n += (size_t)sprintf(text + n, "}" END);
    c = parse(text, n, NULL);
    assert_int_equal(json_array_size(c), 0); /* refused by the JSON parser's depth limit */
    json_decref(c);
    free(text);
    const size_t big = 1 << 20;
    text = malloc(big + 128);
    assert_non_null(text);
    n = (size_t)sprintf(text, BEGIN "now" SEP "{\"a\":\"");
    memset(text + n, 'v', big);
    n += big;
    n += (size_t)sprintf(text + n, "\"}" END);
    c = parse(text, n, NULL);
    assert_int_equal(json_array_size(c), 1);
    json_decref(c);
    free(text);
}

/* ---------------------------------------------------------------- the split */

/* The split of a DeepSeek-V3.1 output (thinking when the prompt opened it). */
static void check_split(bool in_reasoning, const char *text, const char *content, const char *reasoning,
                        const char *calls) {
    const chat_case c = {nx_chat_format_by_name("deepseek_v31"), NULL, true, true, in_reasoning, tools};
    chat_check_split(&c, text, content, reasoning, calls);
}

#define DS_OUT                                                                                             \
    "Plan: <｜tool▁calls▁begin｜> later.</think>Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather" \
    "<｜tool▁sep｜>{\"city\": \"Zürich\", \"days\": \"2\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}"  \
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
#define DS_CALLS                                                                                                \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Zürich\\\"," \
    "\\\"days\\\":2}\"}},{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]"

static void test_stream(void **state) {
    (void)state;
    /* thinking: the prompt ended in <think> */
    check_split(true, DS_OUT, "Checking.", "Plan: <｜tool▁calls▁begin｜> later.", DS_CALLS);
    /* not thinking (the default; the prompt ended in </think>): content, then the calls */
    check_split(false, "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>", "Sure.",
                "", "[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]");
    /* not thinking, the reasoning markers are text: only the prompt opens the reasoning */
    check_split(false, "a</think>b<think>c", "a</think>b<think>c", "", "[]");
    /* cut inside a call's arguments: no call yet (the server returns the text as content) */
    check_split(false, "A<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{\"a", "A", "", "[]");
}

/* Every prefix of an output parses to the first calls of the whole, each as the whole has it
 * (what lets a stream send a call once). */
static void test_prefixes(void **state) {
    (void)state;
    json_t *t = tools();
    const char *text = strstr(DS_OUT, "Checking.") + strlen("Checking.<｜tool▁calls▁begin｜>");
    const size_t len = strlen(text);
    json_t *whole = parse(text, len, t);
    assert_int_equal(json_array_size(whole), 2);
    for (size_t n = 0; n <= len; n++) {
        json_t *c = parse(text, n, t);
        assert_true(json_array_size(c) <= 2);
        for (size_t i = 0; i < json_array_size(c); i++) assert_true(json_equal(json_array_get(c, i), json_array_get(whole, i)));
        json_decref(c);
    }
    json_decref(whole);
    json_decref(t);
}

/* The format's markers for the token-by-token split and the forced-call grammar. */
static void test_tokens(void **state) {
    (void)state;
    nx_chat_tokens t;
    nx_chat_tokens_init(&t, nx_chat_format_for_family("deepseek_v3"), NULL, NULL);
    assert_false(nx_chat_tokens_tools(&t));
    assert_string_equal(t.m.tools_open, CALLS);
    assert_false(t.m.tools_open_kept);
    assert_string_equal(t.m.name_end, SEP);
    assert_string_equal(t.m.preamble, "</think>");
    assert_true(t.m.preamble_after_open && t.m.json_args);
    enum { THINK = 100, UNTHINK, CALLS_ID, CALL, UNCALL, UNCALLS, SEP_ID, TEXT = 5 };
    t.think_open = THINK, t.think_close = UNTHINK, t.tools_open = CALLS_ID;
    const int32_t tm[NX_TM_N] = {CALL, UNCALL, UNCALLS, -1, -1, -1, -1, -1};
    memcpy(t.tool, tm, sizeof tm);
    assert_false(nx_chat_tokens_tools(&t)); /* the separator is needed */
    t.tool[NX_TM_SEP] = SEP_ID;
    assert_true(nx_chat_tokens_tools(&t) && nx_chat_tokens_reasoning(&t)); /* key / value markers are not */
    nx_tool_markers mk;
    nx_chat_tokens_grammar(&t, &mk);
    assert_true(mk.json_args && !mk.newline_sep && !mk.open_end && !mk.bare_name && !mk.string_exact);
    nx_chat_split sp;
    const char *mkr;
    nx_chat_split_init(&sp, &t, true, true, UNTHINK); /* not thinking: think markers are content */
    assert_int_equal(nx_chat_split_token(&sp, THINK, &mkr), NX_CHAT_CONTENT);
    assert_int_equal(nx_chat_split_token(&sp, TEXT, &mkr), NX_CHAT_CONTENT);
    nx_chat_split_init(&sp, &t, true, true, THINK);
    assert_int_equal(nx_chat_split_token(&sp, TEXT, &mkr), NX_CHAT_REASONING);
    assert_int_equal(nx_chat_split_token(&sp, UNTHINK, &mkr), -1);
    assert_int_equal(nx_chat_split_token(&sp, TEXT, &mkr), NX_CHAT_CONTENT);
    assert_int_equal(nx_chat_split_token(&sp, CALLS_ID, &mkr), -1); /* the wrapper is no call's text */
    assert_int_equal(nx_chat_split_token(&sp, CALL, &mkr), NX_CHAT_TOOLS);
    assert_string_equal(mkr, BEGIN);
    assert_int_equal(nx_chat_split_token(&sp, SEP_ID, &mkr), NX_CHAT_TOOLS);
    assert_string_equal(mkr, SEP);
    assert_int_equal(nx_chat_split_token(&sp, UNCALLS, &mkr), NX_CHAT_TOOLS);
    assert_string_equal(mkr, CALLS_END);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_typing),  cmocka_unit_test(test_structure), cmocka_unit_test(test_bad_bytes),
        cmocka_unit_test(test_hostile), cmocka_unit_test(test_stream),    cmocka_unit_test(test_prefixes),
        cmocka_unit_test(test_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
