/* Chat output formats, one per model family: how a generated text splits into reasoning,
 * content and tool calls, and how the tool calls parse into OpenAI's shape. A format is looked
 * up by its name ("hy3", "glm45") or by the config.json model_type it serves ("hy_v3",
 * "glm4_moe").
 *
 * The split works on text in which every marker is spelled out: a caller feeds a special
 * token's marker text where a detokenizer would drop it. nx_chat_stream_feed takes byte chunks
 * cut anywhere and appends content and reasoning as soon as a byte cannot begin a marker, so the
 * deltas of any cutting concatenate to the split of the whole text. Reasoning runs from
 * think_open (or the start, when the prompt opened it) to think_close; the tool calls from
 * tools_open to the end of the output, held back for the format's parser. Markers count only
 * where they act: a tool-call marker inside the reasoning is reasoning text, a think marker
 * inside the tool calls is tool text. */
#ifndef NX_SERVE_CHAT_FORMAT_H
#define NX_SERVE_CHAT_FORMAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/strbuf.h"
#include "nextn.h"

/* A format's markers as one tokenizer spells them. */
typedef struct nx_chat_markers {
    char think_open[64], think_close[64]; /* "": no reasoning markers */
    char tools_open[64];                  /* opens the tool calls */
    bool tools_open_kept;                 /* tools_open is the first call's own opening (GLM) */
    char suffix[48];                      /* the spelling suffix (Hy3's ":opensource"), for the parser */
} nx_chat_markers;

typedef struct nx_chat_format {
    const char *name;   /* "hy3", "glm45" */
    const char *family; /* the model_type it is the default for */
    /* Spells the markers with suffix (NULL or "": the bare forms; formats without suffixed
     * spellings ignore it). */
    void (*spell)(nx_chat_markers *m, const char *suffix);
    /* The tool calls in text (the held-back tool text, from tools_open on when it is kept, after
     * it otherwise): a JSON array of {"type": "function", "function": {"name", "arguments"}},
     * arguments serialized as OpenAI sends them, typed with the request's tools. A new
     * reference; NULL only when out of memory. */
    json_t *(*parse_tool_calls)(const char *text, size_t len, const nx_chat_markers *m, const json_t *tools);
} nx_chat_format;

/* The format named name, or NULL. */
const nx_chat_format *nx_chat_format_by_name(const char *name);
/* The format of model_type, or NULL when the family has none. */
const nx_chat_format *nx_chat_format_for_family(const char *model_type);

typedef enum nx_chat_part { NX_CHAT_CONTENT, NX_CHAT_REASONING, NX_CHAT_TOOLS } nx_chat_part;

typedef struct nx_chat_stream {
    const nx_chat_format *f;
    nx_chat_markers m;
    bool tools, reasoning; /* split tool calls / reasoning out (the request wants them) */
    nx_chat_part part;     /* where text goes now */
    nx_strbuf held;        /* bytes that may begin a marker */
    nx_strbuf tool_text;   /* the tool calls so far */
} nx_chat_stream;

/* Starts a split for one generation. in_reasoning: the prompt opened the reasoning (Hy3's
 * template ends in <think> for reasoning_effort low/high); ignored without reasoning. */
void nx_chat_stream_init(nx_chat_stream *s, const nx_chat_format *f, const char *suffix, bool tools, bool reasoning,
                         bool in_reasoning);
/* Feeds n bytes of output; appends what is now known to be content or reasoning to content and
 * reasoning (either may be NULL to drop that part). NX_E_NOMEM when a buffer cannot grow. */
nx_status nx_chat_stream_feed(nx_chat_stream *s, const char *text, size_t n, nx_strbuf *content, nx_strbuf *reasoning);
/* The output ended: bytes held back as a possible marker start are text after all. */
nx_status nx_chat_stream_finish(nx_chat_stream *s, nx_strbuf *content, nx_strbuf *reasoning);
/* The tool calls in the tool text so far (see parse_tool_calls); callable mid-stream. */
json_t *nx_chat_stream_tool_calls(const nx_chat_stream *s, const json_t *tools);
void nx_chat_stream_free(nx_chat_stream *s);

#endif
