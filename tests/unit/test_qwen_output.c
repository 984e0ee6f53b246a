/* Qwen chat output (serve/qwen_output.h) through its chat formats (serve/chat_format.h entries
 * "qwen35" for qwen3_5_moe and "qwen3_next"): Qwen3-Coder XML calls converted by the request's
 * schemas as vLLM's qwen3_coder parser converts them, hermes JSON calls; malformed, cut-short and
 * hostile calls; the reasoning / content / tool split of whole outputs and of the same outputs
 * cut at every byte boundary and fed byte by byte; the calls of every prefix of an output being
 * the first calls of the whole (what a stream sends); and the token-by-token split. */
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
#include "serve/qwen_output.h"

/* get_weather(city: string, days: integer, ratio: number, wind: boolean, opts: object,
 * tags: array, maybe: integer or null, note: string or null, any: [string, integer]), now() */
static json_t *tools(void) {
    json_t *t = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
                           "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                           "\"days\":{\"type\":\"integer\"},\"ratio\":{\"type\":\"number\"},"
                           "\"wind\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},"
                           "\"tags\":{\"type\":\"array\"},"
                           "\"maybe\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"integer\"}]},"
                           "\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]},"
                           "\"any\":{\"type\":[\"string\",\"integer\"]}}}}},"
                           "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]",
                           0, NULL);
    assert_non_null(t);
    return t;
}

static json_t *xml(const char *text, size_t len, const json_t *t) {
    json_t *calls = nx_qwen_xml_parse_tool_calls(text, len, t);
    assert_non_null(calls);
    return calls;
}

static json_t *hermes(const char *text, size_t len, const json_t *t) {
    json_t *calls = nx_qwen_json_parse_tool_calls(text, len, t);
    assert_non_null(calls);
    return calls;
}


#define P(k, v) "<parameter=" k ">\n" v "\n</parameter>\n"
#define CALL(name, params) "<tool_call>\n<function=" name ">\n" params "</function>\n</tool_call>"

/* Parameter text converted by its schema, as vLLM's qwen3_coder parser converts it. */
static void test_xml_typing(void **state) {
    (void)state;
    json_t *t = tools();
    const char text[] = CALL("get_weather", P("city", "Zürich") P("days", "3") P("ratio", "2.50") P("wind", "True")
                                                P("opts", "{\"a\": [1]}") P("tags", "[\"x\", 2]") P("maybe", "None")
                                                P("note", "null") P("any", "7") P("free", "8"));
    json_t *c = xml(text, sizeof text - 1, t);
    assert_int_equal(json_array_size(c), 1);
    chat_assert_call(c, 0, "get_weather",
                "{\"city\":\"Zürich\",\"days\":3,\"ratio\":2.5,\"wind\":true,\"opts\":{\"a\":[1]},\"tags\":[\"x\",2],"
                "\"maybe\":null,\"note\":null,\"any\":7,\"free\":\"8\"}");
    json_decref(c);
    /* text that does not fit its type: integer and number stay text, a boolean is false; a whole
     * number is an integer; a string keeps "null", its inner newlines and all but one newline at
     * each end; "none" under a non-string type is null; Python literals under object */
    const char text2[] = CALL("get_weather", P("days", "three") P("ratio", "4.0") P("wind", "yes")
                                                 P("city", "\nnull\nline 2\n") P("maybe", "x") P("opts", "none")
                                                 P("tags", "True") P("any", "'quoted'"));
    c = xml(text2, sizeof text2 - 1, t);
    chat_assert_call(c, 0, "get_weather",
                "{\"days\":\"three\",\"ratio\":4,\"wind\":false,\"city\":\"\\nnull\\nline 2\\n\",\"maybe\":\"x\","
                "\"opts\":null,\"tags\":true,\"any\":\"'quoted'\"}");
    json_decref(c);
    /* numbers as Python reads them: surrounding spaces, signs, exponents; no hex, inf or nan; an
     * integer past 64 bits stays text */
    const char text3[] = CALL("get_weather", P("days", " -12 ") P("ratio", "1e3") P("any", "inf")
                                                 P("maybe", "99999999999999999999"));
    c = xml(text3, sizeof text3 - 1, t);
    chat_assert_call(c, 0, "get_weather", "{\"days\":-12,\"ratio\":1000,\"any\":\"inf\",\"maybe\":\"99999999999999999999\"}");
    json_decref(c);
    const char text4[] = CALL("get_weather", P("ratio", "0x10") P("days", "1.5"));
    c = xml(text4, sizeof text4 - 1, t);
    chat_assert_call(c, 0, "get_weather", "{\"ratio\":\"0x10\",\"days\":\"1.5\"}");
    json_decref(c);
    /* without tools, or for a function the tools do not name, every value is text */
    c = xml(text, sizeof text - 1, NULL);
    chat_assert_call(c, 0, "get_weather",
                "{\"city\":\"Zürich\",\"days\":\"3\",\"ratio\":\"2.50\",\"wind\":\"True\",\"opts\":\"{\\\"a\\\": [1]}\","
                "\"tags\":\"[\\\"x\\\", 2]\",\"maybe\":\"None\",\"note\":\"null\",\"any\":\"7\",\"free\":\"8\"}");
    json_decref(c);
    json_decref(t);
}

/* Several calls, names trimmed, implicit parameter ends, what is skipped, and cut-short calls. */
static void test_xml_structure(void **state) {
    (void)state;
    json_t *t = tools();
    const char text[] = CALL(" now ", "") "\ntext between\n" CALL("get_weather", P("city", "Rome"))
        "<tool_call>\nno function\n</tool_call>"                         /* no <function= */
        "<tool_call>\n<function=>\n</function>\n</tool_call>"            /* empty name */
        "<tool_call>\n<function=now\n</tool_call>"                       /* the name never ends */
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n<parameter=days>\n4\n</function>\n</tool_call>"
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n5\n</tool_call>" /* no </function> */
        CALL("get_weather", P("city", "x") P("city", "y") P("days", "1"));
    json_t *c = xml(text, sizeof text - 1, t);
    assert_int_equal(json_array_size(c), 5);
    chat_assert_call(c, 0, "now", "{}");
    chat_assert_call(c, 1, "get_weather", "{\"city\":\"Rome\"}");
    chat_assert_call(c, 2, "get_weather", "{\"city\":\"A\",\"days\":4}");
    chat_assert_call(c, 3, "get_weather", "{\"days\":5}");
    chat_assert_call(c, 4, "get_weather", "{\"city\":\"y\",\"days\":1}"); /* a repeated key: first place, last value */
    json_decref(c);
    /* cut short (max_tokens): the last call counts once its name is whole, with its whole values */
    static const struct {
        const char *text, *want;
    } cut[] = {
        {"<tool_call>\n<function=get_wea", NULL},
        {"<tool_call>\n<function=get_weather>", "{}"},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nRo", "{}"},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</param", "{}"},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=da",
         "{\"city\":\"Rome\"}"},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n<parameter=days>\n2",
         "{\"city\":\"Rome\"}"},
        {"<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>", "{\"days\":2}"},
    };
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        c = xml(cut[i].text, strlen(cut[i].text), t);
        assert_int_equal(json_array_size(c), cut[i].want ? 1 : 0);
        if (cut[i].want) chat_assert_call(c, 0, "get_weather", cut[i].want);
        json_decref(c);
    }
    json_decref(t);
}

/* Hermes calls: the model's JSON, string values typed where the schema has no string type. */
static void test_hermes(void **state) {
    (void)state;
    json_t *t = tools();
    const char text[] =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": \"2\", \"ratio\": 1.5}}\n"
        "</tool_call>\n<tool_call>\n{\"name\": \" now \", \"arguments\": {}}\n</tool_call>"
        "<tool_call>\n{\"name\": \"now\"}\n</tool_call>"                             /* no arguments */
        "<tool_call>\n{\"name\": \"now\", \"arguments\": \"{}\"}\n</tool_call>"      /* not an object */
        "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>"                /* no name */
        "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"t\": 1}} trailing\n</tool_call>" /* text after it */
        "<tool_call>\nx {\"name\": \"now\", \"arguments\": {}}\n</tool_call>"                /* text before */
        "<tool_call>\n[1]\n</tool_call>"
        "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"wind\":\"true\",\"opts\":{\"k\":\"1\"}}}</tool_call>";
    json_t *c = hermes(text, sizeof text - 1, t);
    assert_int_equal(json_array_size(c), 4);
    chat_assert_call(c, 0, "get_weather", "{\"city\":\"Zürich\",\"days\":2,\"ratio\":1.5}");
    chat_assert_call(c, 1, "now", "{}");
    chat_assert_call(c, 2, "now", "{\"t\":1}");
    chat_assert_call(c, 3, "get_weather", "{\"wind\":true,\"opts\":{\"k\":\"1\"}}");
    json_decref(c);
    static const struct {
        const char *text;
        bool counts;
    } cut[] = {
        {"<tool_call>\n{\"name\": \"now\", \"argum", false},
        {"<tool_call>\n{\"name\": \"now\", \"arguments\": {}", false},
        {"<tool_call>\n{\"name\": \"now\", \"arguments\": {}}", true},
        {"<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_", true},
    };
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        c = hermes(cut[i].text, strlen(cut[i].text), t);
        assert_int_equal(json_array_size(c), cut[i].counts ? 1 : 0);
        if (cut[i].counts) chat_assert_call(c, 0, "now", "{}");
        json_decref(c);
    }
    json_decref(t);
}

/* Bytes that are not UTF-8 drop the call or the parameter; a NUL in a name drops the call; a
 * name of 256 bytes is skipped, one of 255 kept. */
static void test_bad_bytes(void **state) {
    (void)state;
    const char text[] = CALL("bad\xff", "") CALL("now", P("k\xc3", "1") P("v", "\xc3") P("ok", "1")) CALL("n\0w", "");
    json_t *c = xml(text, sizeof text - 1, NULL);
    assert_int_equal(json_array_size(c), 1);
    chat_assert_call(c, 0, "now", "{\"ok\":\"1\"}");
    json_decref(c);
    const char htext[] = "<tool_call>{\"name\":\"n\\u0000w\",\"arguments\":{}}</tool_call>"
                         "<tool_call>{\"name\":\"now\",\"arguments\":{\"k\":\"\xc3\"}}</tool_call>"
                         "<tool_call>{\"name\":\"now\",\"arguments\":{\"ok\":1}}</tool_call>";
    c = hermes(htext, sizeof htext - 1, NULL);
    assert_int_equal(json_array_size(c), 1);
    chat_assert_call(c, 0, "now", "{\"ok\":1}");
    json_decref(c);
    char name[300], buf[400];
    memset(name, 'x', 256);
    name[256] = '\0';
    snprintf(buf, sizeof buf, "<tool_call><function=%s></function></tool_call>", name);
    c = xml(buf, strlen(buf), NULL);
    assert_int_equal(json_array_size(c), 0);
    json_decref(c);
    name[255] = '\0';
    snprintf(buf, sizeof buf, "<tool_call><function=%s></function></tool_call>", name);
    c = xml(buf, strlen(buf), NULL);
    assert_int_equal(json_array_size(c), 1);
    json_decref(c);
}

/* Repeats piece reps times after head (malloc'd, *n bytes). */
static char *repeat(const char *head, const char *piece, size_t reps, const char *tail, size_t *n) {
    const size_t h = strlen(head), k = strlen(piece), tl = strlen(tail);
    char *s = malloc(h + reps * k + tl + 1);
    assert_non_null(s);
    memcpy(s, head, h);
    for (size_t i = 0; i < reps; i++) memcpy(s + h + i * k, piece, k);
    memcpy(s + h + reps * k, tail, tl + 1);
    *n = h + reps * k + tl;
    return s;
}

/* Hostile outputs parse to a bounded answer in one pass: many openings without closings, many
 * parameters without closings, JSON nested past any parser's depth, one huge value. */
static void test_hostile(void **state) {
    (void)state;
    size_t n;
    char *text = repeat("", "<tool_call>", 50000, "", &n);
    json_t *c = xml(text, n, NULL);
    assert_int_equal(json_array_size(c), 0);
    json_decref(c);
    c = hermes(text, n, NULL);
    assert_int_equal(json_array_size(c), 0);
    json_decref(c);
    free(text);
    text = repeat("<tool_call>\n<function=now>\n", "<parameter=a>\nv\n", 50000, "</function>\n</tool_call>", &n);
    c = xml(text, n, NULL);
    assert_int_equal(json_array_size(c), 1);
    chat_assert_call(c, 0, "now", "{\"a\":\"v\"}");
    json_decref(c);
    free(text);
    text = repeat("<tool_call>\n<function=now>\n", "<parameter=", 50000, "", &n);
    c = xml(text, n, NULL);
    assert_int_equal(json_array_size(c), 1);
    json_decref(c);
    free(text);
    text = repeat("<tool_call>{\"name\":\"now\",\"arguments\":{\"a\":", "[", 100000, "", &n);
    c = hermes(text, n, NULL);
    assert_int_equal(json_array_size(c), 0);
    json_decref(c);
    free(text);
    json_t *t = tools();
    text = repeat("<tool_call>\n<function=get_weather>\n<parameter=opts>\n", "[", 100000, "\n</parameter>\n</function>", &n);
    c = xml(text, n, t);
    assert_int_equal(json_array_size(c), 1); /* refused by the JSON parser's depth limit: text */
    json_decref(c);
    free(text);
    json_decref(t);
    text = repeat("<tool_call>\n<function=now>\n<parameter=a>\n", "v", 1 << 20, "\n</parameter>\n</function>", &n);
    c = xml(text, n, NULL);
    assert_int_equal(json_array_size(c), 1);
    json_decref(c);
    free(text);
}

/* ---------------------------------------------------------------- the split */

/* The split of an output in format f (thinking when the prompt opened it). */
static void check_split(const char *f, bool in_reasoning, const char *text, const char *content, const char *reasoning,
                        const char *calls) {
    const chat_case c = {nx_chat_format_by_name(f), NULL, true, true, in_reasoning, tools};
    chat_check_split(&c, text, content, reasoning, calls);
}

#define XML_OUT                                                                                        \
    "Plan: <tool_call> later.\n</think>\n\nChecking.\n\n" CALL("get_weather", P("city", "Zürich") P("days", "2")) \
    "\n" CALL("now", "")
#define HERMES_OUT                                                                                       \
    "Plan.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", " \
    "\"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"
#define CALLS                                                                                                   \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Zürich\\\"," \
    "\\\"days\\\":2}\"}},{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]"

static void test_stream(void **state) {
    (void)state;
    /* thinking: the prompt ended in "<think>\n"; a call marker inside the reasoning is reasoning */
    check_split("qwen35", true, XML_OUT, "\n\nChecking.\n\n", "Plan: <tool_call> later.\n", CALLS);
    check_split("qwen3_next", true, HERMES_OUT, "\n\nChecking.\n", "Plan.\n", CALLS);
    /* Qwen3-Next-Instruct and the 2507 templates: the output may open its own reasoning */
    check_split("qwen3_next", false, "<think>\nR\n</think>\n\nA", "\n\nA", "\nR\n", "[]");
    /* not thinking: the prompt closed an empty reasoning, all is content up to the calls */
    check_split("qwen35", false, "Sure." CALL("now", ""), "Sure.", "",
                "[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]");
    /* cut inside a call's name: no call yet (the server returns the text as content) */
    check_split("qwen35", false, "A<tool_call>\n<function=no", "A", "", "[]");
    check_split("qwen3_next", false, "A<tool_call>\n{\"name\": \"now\"", "A", "", "[]");
}

/* Every prefix of an output parses to the first calls of the whole, each a prefix of the whole's
 * (its arguments, less the closing brace, a prefix of the whole's: what a stream sends). */
static void check_prefixes(json_t *(*parse)(const char *, size_t, const json_t *), const char *out) {
    json_t *t = tools();
    const char *text = strstr(out, "<tool_call>\n<");
    if (!text) text = strstr(out, "<tool_call>\n{");
    const size_t len = strlen(text);
    json_t *whole = parse(text, len, t);
    assert_int_equal(json_array_size(whole), 2);
    for (size_t n = 0; n <= len; n++) {
        json_t *c = parse(text, n, t);
        assert_true(json_array_size(c) <= 2);
        for (size_t i = 0; i < json_array_size(c); i++) {
            const json_t *pf = json_object_get(json_array_get(c, i), "function");
            const json_t *wf = json_object_get(json_array_get(whole, i), "function");
            assert_true(json_equal(json_object_get(pf, "name"), json_object_get(wf, "name")));
            const char *pa = json_string_value(json_object_get(pf, "arguments"));
            const char *wa = json_string_value(json_object_get(wf, "arguments"));
            assert_true(strncmp(pa, wa, strlen(pa) - 1) == 0);
        }
        json_decref(c);
    }
    json_decref(whole);
    json_decref(t);
}

static void test_prefixes(void **state) {
    (void)state;
    check_prefixes(xml, XML_OUT);
    check_prefixes(hermes, HERMES_OUT);
}

/* The formats by family, their markers, and the token-by-token split. */
static void test_tokens(void **state) {
    (void)state;
    assert_ptr_equal(nx_chat_format_for_family("qwen3_5_moe"), nx_chat_format_by_name("qwen35"));
    assert_ptr_equal(nx_chat_format_for_family("qwen3_next"), nx_chat_format_by_name("qwen3_next"));
    nx_chat_tokens t;
    nx_chat_tokens_init(&t, nx_chat_format_for_family("qwen3_5_moe"), ":suffix", NULL);
    assert_false(nx_chat_tokens_tools(&t));
    assert_string_equal(t.m.tools_open, "<tool_call>");
    assert_string_equal(t.m.think_open, "<think>");
    assert_true(t.m.tools_open_kept && t.m.text_calls);
    enum { THINK = 100, UNTHINK, CALL_ID, UNCALL, TEXT = 5 };
    t.think_open = THINK, t.think_close = UNTHINK, t.tools_open = CALL_ID;
    t.tool[NX_TM_CALL_OPEN] = CALL_ID;
    assert_false(nx_chat_tokens_tools(&t)); /* </tool_call> is needed */
    t.tool[NX_TM_CALL_CLOSE] = UNCALL;
    assert_true(nx_chat_tokens_tools(&t) && nx_chat_tokens_reasoning(&t));
    assert_false(nx_chat_tokens_forced(&t)); /* the calls are text: no grammar */
    nx_chat_split sp;
    const char *mkr;
    nx_chat_split_init(&sp, &t, true, true, UNTHINK); /* enable_thinking false: "</think>\n\n" */
    assert_int_equal(nx_chat_split_token(&sp, TEXT, &mkr), NX_CHAT_CONTENT);
    /* Qwen3.5 may open a call without closing its reasoning: the <tool_call> token ends it (vLLM's
     * qwen3 reasoning parser does the same once <function= follows) */
    nx_chat_split_init(&sp, &t, true, true, THINK); /* "<think>\n": the worker looks past the newline */
    assert_int_equal(nx_chat_split_token(&sp, TEXT, &mkr), NX_CHAT_REASONING);
    assert_int_equal(nx_chat_split_token(&sp, CALL_ID, &mkr), NX_CHAT_TOOLS);
    assert_string_equal(mkr, "<tool_call>");
    nx_chat_split_init(&sp, &t, true, true, THINK);
    assert_int_equal(nx_chat_split_token(&sp, UNTHINK, &mkr), -1);
    assert_int_equal(nx_chat_split_token(&sp, TEXT, &mkr), NX_CHAT_CONTENT);
    assert_int_equal(nx_chat_split_token(&sp, CALL_ID, &mkr), NX_CHAT_TOOLS); /* kept: the call's own opening */
    assert_string_equal(mkr, "<tool_call>");
    assert_int_equal(nx_chat_split_token(&sp, TEXT, &mkr), NX_CHAT_TOOLS);
    assert_null(mkr);
    assert_int_equal(nx_chat_split_token(&sp, UNCALL, &mkr), NX_CHAT_TOOLS);
    assert_string_equal(mkr, "</tool_call>");
    assert_int_equal(nx_chat_split_token(&sp, THINK, &mkr), NX_CHAT_TOOLS); /* think markers are tool text there */
    assert_string_equal(mkr, "<think>");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xml_typing), cmocka_unit_test(test_xml_structure), cmocka_unit_test(test_hermes),
        cmocka_unit_test(test_bad_bytes),  cmocka_unit_test(test_hostile),       cmocka_unit_test(test_stream),
        cmocka_unit_test(test_prefixes),   cmocka_unit_test(test_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
