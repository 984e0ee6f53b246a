/* GLM-4.5 and GLM-4.7 chat output (serve/glm_output.h) and the per-family chat formats
 * (serve/chat_format.h): tool calls typed as vLLM's glm4_moe / glm47 tool parsers type them, the
 * reasoning / content / tool split of whole outputs, and the same split when the output arrives
 * cut at every byte boundary and byte by byte. */
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
#include "serve/glm_output.h"

/* get_weather(city: string, days: integer, code: string, opts: object), now() */
static json_t *tools(void) {
    json_t *t = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
                           "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                           "\"days\":{\"type\":\"integer\"},\"code\":{\"type\":\"string\"},"
                           "\"opts\":{\"type\":\"object\"}}}}},"
                           "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]",
                           0, NULL);
    assert_non_null(t);
    return t;
}

/* Call i's name must be want; returns its arguments parsed back from OpenAI's string. */
static json_t *args_of(const json_t *calls, size_t i, const char *want) {
    const json_t *c = json_array_get(calls, i);
    assert_non_null(c);
    assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
    const json_t *f = json_object_get(c, "function");
    assert_string_equal(json_string_value(json_object_get(f, "name")), want);
    json_t *a = json_loads(json_string_value(json_object_get(f, "arguments")), 0, NULL);
    assert_non_null(a);
    return a;
}

/* The arguments of call i serialized compactly, for exact comparisons. */
static void assert_args(const json_t *calls, size_t i, const char *name, const char *want) {
    json_t *a = args_of(calls, i, name);
    char *s = json_dumps(a, JSON_COMPACT);
    assert_string_equal(s, want);
    free(s);
    json_decref(a);
}

static json_t *parse(const char *text, const json_t *t) {
    json_t *calls = nx_glm_parse_tool_calls(text, strlen(text), t);
    assert_non_null(calls);
    return calls;
}

static void test_lookup(void **state) {
    (void)state;
    const nx_chat_format *g = nx_chat_format_by_name("glm45"), *h = nx_chat_format_by_name("hy3");
    assert_non_null(g);
    assert_non_null(h);
    assert_ptr_equal(nx_chat_format_for_family("glm4_moe"), g);
    assert_ptr_equal(nx_chat_format_for_family("hy_v3"), h);
    assert_ptr_equal(nx_chat_format_for_family("glm4_moe_lite"), nx_chat_format_by_name("glm47"));
    assert_ptr_equal(nx_chat_format_for_family("deepseek_v3"), nx_chat_format_by_name("deepseek_v31"));
    assert_non_null(nx_chat_format_by_name("glm47"));
    assert_non_null(nx_chat_format_by_name("deepseek_v31"));
    assert_null(nx_chat_format_by_name("glm4_moe"));
    assert_null(nx_chat_format_for_family("llama"));
    assert_null(nx_chat_format_by_name(NULL));
}

/* Schema "string" keeps the text; everything else decodes as JSON when it can. */
static void test_typing(void **state) {
    (void)state;
    json_t *t = tools();
    json_t *c = parse("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n"
                      "<arg_key>days</arg_key>\n<arg_value> 3 </arg_value>\n"
                      "<arg_key>code</arg_key>\n<arg_value>007</arg_value>\n"
                      "<arg_key>opts</arg_key>\n<arg_value>{\"wind\": true, \"h\": [1, 2.5]}</arg_value>\n"
                      "<arg_key>free</arg_key>\n<arg_value>null</arg_value>\n</tool_call>",
                      t);
    assert_int_equal(json_array_size(c), 1);
    assert_args(c, 0, "get_weather",
                "{\"city\":\"Zürich\",\"days\":3,\"code\":\"007\",\"opts\":{\"wind\":true,\"h\":[1,2.5]},\"free\":null}");
    json_decref(c);
    /* without tools every value decodes; a string-typed "007" is invalid JSON anyway */
    c = parse("<tool_call>get_weather\n<arg_key>days</arg_key><arg_value>007</arg_value>"
              "<arg_key>n</arg_key><arg_value>-1.5e3</arg_value><arg_key>s</arg_key><arg_value>\"q\"</arg_value>"
              "<arg_key>b</arg_key><arg_value>True</arg_value><arg_key>z</arg_key><arg_value>None</arg_value>"
              "<arg_key>f</arg_key><arg_value>False</arg_value><arg_key>w</arg_key><arg_value>two words</arg_value>"
              "</tool_call>",
              NULL);
    assert_args(c, 0, "get_weather",
                "{\"days\":\"007\",\"n\":-1500.0,\"s\":\"q\",\"b\":true,\"z\":null,\"f\":false,\"w\":\"two words\"}");
    json_decref(c);
    /* escaped JSON (a JSON string's body) decodes once its escapes are undone */
    c = parse("<tool_call>get_weather\n<arg_key>opts</arg_key><arg_value>{\\\"a\\\": [1]}</arg_value></tool_call>", t);
    assert_args(c, 0, "get_weather", "{\"opts\":{\"a\":[1]}}");
    json_decref(c);
    /* a string-typed key keeps JSON-looking text as text */
    c = parse("<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>{\"a\": 1}</arg_value></tool_call>", t);
    assert_args(c, 0, "get_weather", "{\"city\":\"{\\\"a\\\": 1}\"}");
    json_decref(c);
    json_decref(t);
}

/* Names, separators, several calls, repeated keys, calls cut short or without a name; a last
 * call cut short counts once its name is complete, with its complete pairs. */
static void test_structure(void **state) {
    (void)state;
    json_t *t = tools();
    json_t *c = parse("text before is not parsed<tool_call>now\n</tool_call> between "
                      "<tool_call> get_weather \\n<arg_key>city</arg_key>\\n \\n<arg_value>Rome</arg_value>"
                      "<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>2</arg_value>"
                      "</tool_call><tool_call>now</tool_call><tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value>"
                      "</tool_call><tool_call>now<arg_key>k</arg_key>x<arg_value>1</arg_value>"
                      "<arg_key>k2</arg_key><arg_value>2</arg_value></tool_call>"
                      "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Oslo",
                      t);
    assert_int_equal(json_array_size(c), 5);
    assert_args(c, 0, "now", "{}");
    assert_args(c, 1, "get_weather", "{\"city\":\"Paris\",\"days\":2}");
    assert_args(c, 2, "now", "{}");
    assert_args(c, 3, "now", "{\"k2\":2}");
    assert_args(c, 4, "get_weather", "{}"); /* cut inside its first value */
    json_decref(c);
    c = parse("no calls at all <tool_call", t);
    assert_int_equal(json_array_size(c), 0);
    json_decref(c);
    /* cut short: the name must have ended (a newline or <arg_key>), pairs must be whole */
    static const struct {
        const char *text, *want;
    } cut[] = {
        {"<tool_call>get_wea", NULL},
        {"<tool_call>get_weather", NULL},
        {"<tool_call>get_weather\\", NULL},
        {"<tool_call>get_weather\n", "{}"},
        {"<tool_call>get_weather<arg_key>city</arg_key><arg_value>Ro", "{}"},
        {"<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value><arg_key>da", "{\"city\":\"Rome\"}"},
        {"<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_", "{\"city\":\"Rome\"}"},
    };
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        c = parse(cut[i].text, t);
        assert_int_equal(json_array_size(c), cut[i].want ? 1 : 0);
        if (cut[i].want) assert_args(c, 0, "get_weather", cut[i].want);
        json_decref(c);
    }
    /* GLM-4.7's form: no newline after the name, so a newline inside a value is no name's end */
    c = parse("<tool_call>get_weather<arg_key>city</arg_key><arg_value>two\nlines</arg_value>"
              "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>now</tool_call>",
              t);
    assert_int_equal(json_array_size(c), 2);
    assert_args(c, 0, "get_weather", "{\"city\":\"two\\nlines\",\"days\":3}");
    assert_args(c, 1, "now", "{}");
    json_decref(c);
    json_decref(t);
}

/* Bytes that are not UTF-8 drop the pair (or the call, in its name); NUL bytes stay inside. */
static void test_bad_bytes(void **state) {
    (void)state;
    const char text[] = "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>\xff\xfe</arg_value>"
                        "<arg_key>k\xc3</arg_key><arg_value>1</arg_value><arg_key>ok</arg_key><arg_value>1</arg_value>"
                        "</tool_call><tool_call>bad\xff\n</tool_call>";
    json_t *t = tools();
    json_t *c = nx_glm_parse_tool_calls(text, sizeof text - 1, t);
    assert_int_equal(json_array_size(c), 1);
    assert_args(c, 0, "get_weather", "{\"ok\":1}");
    json_decref(c);
    json_decref(t);
}

/* The split of an output with the given options (the request's tools: tools()). */
static void check_split(const nx_chat_format *f, const char *suffix, bool tools_on, bool reasoning_on,
                        bool in_reasoning, const char *text, const char *want_content, const char *want_reasoning,
                        const char *want_calls) {
    const chat_case c = {f, suffix, tools_on, reasoning_on, in_reasoning, tools};
    chat_check_split(&c, text, want_content, want_reasoning, want_calls);
}

#define GLM_OUT                                                                                                \
    "<think>Plan: call <tool_call> later, </thi no.</think>\nChecking < the weather.<tool_call>get_weather\n" \
    "<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n" \
    "</tool_call>\n<tool_call>now\n</tool_call><think>x</think>"

static void test_glm_stream(void **state) {
    (void)state;
    const nx_chat_format *g = nx_chat_format_by_name("glm45");
    const char *calls = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                        "\"arguments\":\"{\\\"city\\\":\\\"Zürich\\\",\\\"days\\\":2}\"}},"
                        "{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]";
    check_split(g, NULL, true, true, false, GLM_OUT, "\nChecking < the weather.",
                "Plan: call <tool_call> later, </thi no.", calls);
    /* no tools offered: the calls are content; no reasoning split: the think block too */
    check_split(g, NULL, false, true, false, "<think>r</think>a<tool_call>now\n</tool_call>",
                "a<tool_call>now\n</tool_call>", "r", "[]");
    check_split(g, NULL, false, false, false, "<think>r</think>a", "<think>r</think>a", "", "[]");
    /* an output that ends inside a marker or the reasoning keeps its bytes */
    check_split(g, NULL, true, true, false, "answer <think", "answer <think", "", "[]");
    check_split(g, NULL, true, true, false, "<think>cut short </thi", "", "cut short </thi", "[]");
    /* a stray </think> is content; a call cut short counts once its name is complete */
    check_split(g, NULL, true, true, false, "a</think>b<tool_call>now\n<arg_key>", "a</think>b", "",
                "[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]");
    check_split(g, NULL, true, true, false, "a<tool_call>no", "a", "", "[]");
    /* GLM writes "\n<think>" after its prompt: whitespace before the output's first text or
     * marker is dropped (not the newline after </think>), and only where reasoning is split */
    check_split(g, NULL, true, true, false, "\n<think>r</think>\nA", "\nA", "r", "[]");
    check_split(g, NULL, true, true, false, " \n\t Hello \n", "Hello \n", "", "[]");
    check_split(g, NULL, true, true, false, "\n", "", "", "[]");
    check_split(g, NULL, true, true, false, "\n<tool_call>now</tool_call>", "", "",
                "[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]");
    check_split(g, NULL, true, false, false, "\n<think>r</think>a", "\n<think>r</think>a", "", "[]");
    check_split(nx_chat_format_by_name("hy3"), NULL, true, true, false, "\n<think>r</think>a", "\na", "r", "[]");
}

/* GLM-4.7: the prompt opens the reasoning (its generation prompt ends in <think>); the calls
 * have no newline after the name. */
static void test_glm47_stream(void **state) {
    (void)state;
    const nx_chat_format *g = nx_chat_format_by_name("glm47");
    const char *calls = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                        "\"arguments\":\"{\\\"city\\\":\\\"Zürich\\\",\\\"days\\\":2}\"}},"
                        "{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]";
    check_split(g, NULL, true, true, true,
                "Plan <tool_call> here.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key>"
                "<arg_value>Zürich</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
                "<tool_call>now</tool_call>",
                "Checking.", "Plan <tool_call> here.", calls);
    /* thinking off (the prompt ended in </think>): all content up to the calls */
    check_split(g, NULL, true, true, false, "Answer.<tool_call>now</tool_call>", "Answer.", "",
                "[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]");
    nx_chat_tokens t;
    nx_chat_tokens_init(&t, g, NULL, NULL);
    enum { THINK = 100, UNTHINK, CALL, UNCALL, KEY, UNKEY, VAL, UNVAL };
    t.think_open = THINK, t.think_close = UNTHINK, t.tools_open = CALL;
    const int32_t tm[NX_TM_N] = {CALL, UNCALL, -1, -1, KEY, UNKEY, VAL, UNVAL};
    memcpy(t.tool, tm, sizeof tm);
    assert_true(nx_chat_tokens_tools(&t));
    nx_tool_markers mk;
    nx_chat_tokens_grammar(&t, &mk);
    assert_true(mk.bare_name && mk.open_end && mk.string_exact && !mk.newline_sep && !mk.json_args);
    assert_string_equal(t.m.name_end, "");
    assert_string_equal(t.m.preamble, "</think>");
    assert_true(t.m.tools_open_kept);
    nx_chat_split sp;
    const char *mkr;
    nx_chat_split_init(&sp, &t, true, true, THINK); /* the prompt ended in <think> */
    assert_int_equal(nx_chat_split_token(&sp, 5, &mkr), NX_CHAT_REASONING);
}

/* Hy3's format through the same stream: reasoning opened by the prompt, suffixed markers. */
static void test_hy_stream(void **state) {
    (void)state;
    const nx_chat_format *h = nx_chat_format_by_name("hy3");
    check_split(h, ":opensource", true, true, true,
                "still thinking</think:opensource>The answer.<tool_calls:opensource>"
                "<tool_call:opensource>now<tool_sep:opensource>\n</tool_call:opensource></tool_calls:opensource>",
                "The answer.", "still thinking", "[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]");
    check_split(h, NULL, true, true, false, "<think>r</think>c<tool_call>x", "c<tool_call>x", "r", "[]");
}

/* The server's token-by-token split with GLM's markers: ids given by hand for a tokenizer that
 * has them; the tool-call opener is kept as the call's own text, markers spelled out inside the
 * calls, and the grammar's markers and variant flags as GLM's form needs them. */
static void test_glm_token_split(void **state) {
    (void)state;
    nx_chat_tokens t;
    nx_chat_tokens_init(&t, nx_chat_format_for_family("glm4_moe"), NULL, NULL);
    assert_false(nx_chat_tokens_tools(&t)); /* no tokenizer: no ids */
    enum { THINK = 100, UNTHINK, CALL, UNCALL, KEY, UNKEY, VAL, UNVAL, TEXT = 5 };
    t.think_open = THINK, t.think_close = UNTHINK, t.tools_open = CALL;
    const int32_t tm[NX_TM_N] = {CALL, UNCALL, -1, -1, KEY, UNKEY, VAL, UNVAL};
    memcpy(t.tool, tm, sizeof tm);
    assert_true(nx_chat_tokens_tools(&t) && nx_chat_tokens_reasoning(&t));
    nx_tool_markers mk;
    nx_chat_tokens_grammar(&t, &mk);
    assert_true(mk.newline_sep && mk.open_end && mk.string_exact);
    assert_int_equal(mk.id[NX_TM_CALL_OPEN], CALL);
    assert_string_equal(t.m.name_end, "\n");
    nx_chat_split sp;
    nx_chat_split_init(&sp, &t, true, true, TEXT);
    const char *mkr;
    assert_int_equal(nx_chat_split_token(&sp, TEXT, &mkr), NX_CHAT_CONTENT);
    assert_int_equal(nx_chat_split_lead(&sp, "\n ", 2), 2); /* GLM's "\n" before <think> */
    assert_int_equal(nx_chat_split_lead(&sp, " a ", 3), 1);
    assert_int_equal(nx_chat_split_lead(&sp, " b", 2), 0); /* only before the first text */
    assert_int_equal(nx_chat_split_token(&sp, THINK, &mkr), -1);
    assert_int_equal(nx_chat_split_token(&sp, TEXT, &mkr), NX_CHAT_REASONING);
    assert_int_equal(nx_chat_split_token(&sp, UNTHINK, &mkr), -1);
    assert_int_equal(nx_chat_split_token(&sp, TEXT, &mkr), NX_CHAT_CONTENT);
    assert_int_equal(nx_chat_split_token(&sp, CALL, &mkr), NX_CHAT_TOOLS);
    assert_string_equal(mkr, "<tool_call>"); /* kept: the call's own opening */
    assert_int_equal(nx_chat_split_token(&sp, KEY, &mkr), NX_CHAT_TOOLS);
    assert_string_equal(mkr, "<arg_key>");
    assert_int_equal(nx_chat_split_token(&sp, THINK, &mkr), NX_CHAT_TOOLS); /* a think marker in the calls */
    assert_string_equal(mkr, "<think>");
    assert_int_equal(nx_chat_split_token(&sp, TEXT, &mkr), NX_CHAT_TOOLS);
    assert_null(mkr);
    /* no tools offered: the opener is content (its text dropped as a special token's) */
    nx_chat_split_init(&sp, &t, false, true, TEXT);
    assert_int_equal(nx_chat_split_token(&sp, CALL, &mkr), NX_CHAT_CONTENT);
    assert_null(mkr);
    /* Hy3's entry keeps its wrapper out of the call text, and needs the separator */
    nx_chat_tokens h;
    nx_chat_tokens_init(&h, nx_chat_format_for_family("hy_v3"), ":opensource", NULL);
    assert_false(h.m.tools_open_kept);
    assert_string_equal(h.m.tools_open, "<tool_calls:opensource>");
    assert_string_equal(h.m.name_end, "<tool_sep:opensource>");
    assert_string_equal(h.m.preamble, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup),    cmocka_unit_test(test_typing),     cmocka_unit_test(test_structure),
        cmocka_unit_test(test_bad_bytes), cmocka_unit_test(test_glm_stream), cmocka_unit_test(test_hy_stream),
        cmocka_unit_test(test_glm_token_split), cmocka_unit_test(test_glm47_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
