/* The chat-output split checks the format tests share: an output fed to nx_chat_stream whole,
 * cut at every byte boundary and fed byte by byte must split into the same content, reasoning
 * and tool calls; and one call's name and argument string as OpenAI receives them. Header-only;
 * each test binary includes it once, after cmocka. */
#ifndef NX_TESTS_CHAT_SPLIT_H
#define NX_TESTS_CHAT_SPLIT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "serve/chat_format.h"

/* How a generation is split: the format, its spelling suffix, which parts are split out, whether
 * the prompt opened the reasoning, and the request's tools (a new reference per call). */
typedef struct chat_case {
    const nx_chat_format *f;
    const char *suffix;
    bool tools_on, reasoning_on, in_reasoning;
    json_t *(*tools)(void);
} chat_case;

typedef struct chat_split {
    nx_strbuf content, reasoning;
    char *calls; /* the tool calls, compact JSON */
} chat_split;

/* Splits text fed in the pieces ending at cuts[0..ncuts) (ascending, the last is its length). */
static inline void chat_split_run(chat_split *out, const chat_case *c, const char *text, const size_t *cuts,
                                  size_t ncuts) {
    nx_chat_stream s;
    memset(out, 0, sizeof *out);
    nx_chat_stream_init(&s, c->f, c->suffix, c->tools_on, c->reasoning_on, c->in_reasoning);
    size_t at = 0;
    for (size_t i = 0; i < ncuts; i++) {
        assert_int_equal(nx_chat_stream_feed(&s, text + at, cuts[i] - at, &out->content, &out->reasoning), NX_OK);
        at = cuts[i];
    }
    assert_int_equal(nx_chat_stream_finish(&s, &out->content, &out->reasoning), NX_OK);
    json_t *t = c->tools();
    json_t *calls = nx_chat_stream_tool_calls(&s, t);
    assert_non_null(calls);
    out->calls = json_dumps(calls, JSON_COMPACT);
    json_decref(calls);
    json_decref(t);
    nx_chat_stream_free(&s);
}

static inline const char *chat_split_str(const nx_strbuf *b) { return b->data ? b->data : ""; }

/* Checks one split against the wanted parts and frees it. */
static inline void chat_split_expect(chat_split *s, const char *content, const char *reasoning, const char *calls) {
    assert_string_equal(chat_split_str(&s->content), content);
    assert_string_equal(chat_split_str(&s->reasoning), reasoning);
    assert_string_equal(s->calls, calls);
    nx_strbuf_free(&s->content);
    nx_strbuf_free(&s->reasoning);
    free(s->calls);
}

/* The output split whole must be content / reasoning / calls; cut at every byte boundary and fed
 * byte by byte, the same. */
static inline void chat_check_split(const chat_case *c, const char *text, const char *content, const char *reasoning,
                                    const char *calls) {
    const size_t len = strlen(text);
    chat_split s;
    chat_split_run(&s, c, text, &len, 1);
    chat_split_expect(&s, content, reasoning, calls);
    for (size_t cut = 0; cut <= len; cut++) {
        const size_t cuts[2] = {cut, len};
        chat_split_run(&s, c, text, cuts, 2);
        chat_split_expect(&s, content, reasoning, calls);
    }
    size_t *bytes = malloc((len + 1) * sizeof *bytes);
    assert_non_null(bytes);
    for (size_t i = 0; i < len; i++) bytes[i] = i + 1;
    chat_split_run(&s, c, text, bytes, len);
    chat_split_expect(&s, content, reasoning, calls);
    free(bytes);
}

/* Call i must be name(args), args compared as the exact string OpenAI receives. */
static inline void chat_assert_call(const json_t *calls, size_t i, const char *name, const char *args) {
    const json_t *c = json_array_get(calls, i);
    assert_non_null(c);
    assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
    const json_t *f = json_object_get(c, "function");
    assert_string_equal(json_string_value(json_object_get(f, "name")), name);
    assert_string_equal(json_string_value(json_object_get(f, "arguments")), args);
}

#endif
