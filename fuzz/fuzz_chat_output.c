/* libFuzzer target for the GLM-4.5, GLM-4.7, DeepSeek-V3.1, Qwen3.5 (Qwen3-Coder XML) and
 * Qwen3-Next (hermes JSON) chat outputs (model output is untrusted text); the first byte picks
 * the format, the rest is the output. Whatever the bytes: the tool calls are an array of calls,
 * each with a non-empty name and arguments that are a serialized JSON object; the calls of the
 * first half of the text are the first calls of the whole with the same names (DeepSeek-V3.1
 * and Qwen3-Next: the same arguments too, as their calls count once their arguments are whole); the text split fed whole and fed in two pieces cut at the middle
 * gives the same content, reasoning and calls; and the same bytes, read as token ids, drive the
 * token-by-token split and its leading-whitespace rule. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/chat_format.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const names[] = {"glm45", "glm47", "deepseek_v31", "qwen35", "qwen3_next"};
#define N_NAMES (sizeof names / sizeof names[0])

static void check_calls(const json_t *calls) {
    if (!calls || !json_is_array(calls)) abort();
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c) {
        const json_t *f = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        const char *args = json_string_value(json_object_get(f, "arguments"));
        if (!name || !*name || !args) abort();
        json_t *a = json_loads(args, JSON_ALLOW_NUL, NULL); /* values may hold NUL bytes */
        if (!json_is_object(a)) abort();
        json_decref(a);
    }
}

/* The split of text fed in two pieces cut at cut: content, reasoning and calls in out (their
 * bytes as they are: the output need not be UTF-8). */
static void split(const nx_chat_format *f, bool in_reasoning, const char *text, size_t n, size_t cut,
                  const json_t *tools, nx_strbuf *out) {
    nx_chat_stream s;
    nx_strbuf content = {0}, reasoning = {0};
    nx_chat_stream_init(&s, f, NULL, true, true, in_reasoning);
    if (nx_chat_stream_feed(&s, text, cut, &content, &reasoning) != NX_OK ||
        nx_chat_stream_feed(&s, text + cut, n - cut, &content, &reasoning) != NX_OK ||
        nx_chat_stream_finish(&s, &content, &reasoning) != NX_OK)
        abort();
    json_t *calls = nx_chat_stream_tool_calls(&s, tools);
    check_calls(calls);
    char *t = json_dumps(calls, JSON_COMPACT);
    if (!t || nx_strbuf_append(out, content.data ? content.data : "", content.len) != NX_OK ||
        nx_strbuf_append(out, "\0", 1) != NX_OK ||
        nx_strbuf_append(out, reasoning.data ? reasoning.data : "", reasoning.len) != NX_OK ||
        nx_strbuf_append(out, "\0", 1) != NX_OK || nx_strbuf_append(out, t, strlen(t)) != NX_OK)
        abort();
    free(t);
    json_decref(calls);
    nx_strbuf_free(&content);
    nx_strbuf_free(&reasoning);
    nx_chat_stream_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *tools;
    if (!tools)
        tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":"
                           "{\"i\":{\"type\":\"integer\"},\"n\":{\"type\":\"number\"},\"b\":{\"type\":\"boolean\"},"
                           "\"s\":{\"type\":\"string\"},\"o\":{\"type\":\"object\"}}}}}]",
                           0, NULL);
    if (size == 0) return 0;
    const nx_chat_format *f = nx_chat_format_by_name(names[data[0] % N_NAMES]);
    const char *text = (const char *)data + 1;
    const size_t n = size - 1;
    nx_chat_markers m;
    memset(&m, 0, sizeof m);
    f->spell(&m, NULL);
    json_t *calls = f->parse_tool_calls(text, n, &m, tools);
    check_calls(calls);
    json_t *part = f->parse_tool_calls(text, n / 2, &m, tools);
    check_calls(part);
    if (json_array_size(part) > json_array_size(calls)) abort();
    size_t i;
    const json_t *c;
    json_array_foreach(part, i, c) {
        const json_t *pf = json_object_get(c, "function"), *wf = json_object_get(json_array_get(calls, i), "function");
        if (!json_equal(json_object_get(pf, "name"), json_object_get(wf, "name"))) abort();
        if ((m.json_args || f->parse_tool_calls == nx_chat_format_by_name("qwen3_next")->parse_tool_calls) &&
            !json_equal(pf, wf))
            abort();
    }
    json_decref(part);
    json_decref(calls);
    const bool in_reasoning = data[0] & 4;
    nx_strbuf whole = {0}, two = {0};
    split(f, in_reasoning, text, n, n, tools, &whole);
    split(f, in_reasoning, text, n, n / 2, tools, &two);
    if (whole.len != two.len || memcmp(whole.data, two.data, whole.len) != 0) abort();
    nx_strbuf_free(&whole);
    nx_strbuf_free(&two);
    nx_chat_tokens t;
    nx_chat_tokens_init(&t, f, NULL, NULL);
    t.think_open = 200, t.think_close = 201, t.tools_open = 202;
    for (int k = 0; k < NX_TM_N; k++) t.tool[k] = 203 + k;
    nx_chat_split s;
    nx_chat_split_init(&s, &t, true, true, 195 + data[0] % 16);
    for (size_t k = 0; k < n; k++) {
        const char *mk;
        const int p = nx_chat_split_token(&s, 190 + data[k + 1] % 24, &mk);
        if (p < -1 || p > NX_CHAT_TOOLS || (mk && p != NX_CHAT_TOOLS)) abort();
        if (p == NX_CHAT_CONTENT && nx_chat_split_lead(&s, text + k, 1) > 1) abort();
    }
    return 0;
}
