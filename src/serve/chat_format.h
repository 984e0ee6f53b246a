/* Chat output formats, one per model family: how a generated text splits into reasoning,
 * content and tool calls, and how the tool calls parse into OpenAI's shape. A format is looked
 * up by its name ("hy3", "glm45", "glm47", "deepseek_v31", "qwen35", "qwen3_next") or by the
 * config.json model_type it serves ("hy_v3", "glm4_moe", "glm4_moe_lite", "deepseek_v3",
 * "qwen3_5_moe", "qwen3_next").
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
#include "constrain/tool_grammar.h"
#include "nextn.h"

/* A format's markers as one tokenizer spells them. */
typedef struct nx_chat_markers {
    char think_open[64], think_close[64]; /* "": no reasoning markers */
    bool think_prompt_only; /* reasoning only when the prompt opened it (DeepSeek-V3.1: without
                             * `thinking` all is content, as vLLM's deepseek_v3 parser leaves it) */
    bool trim_lead;         /* whitespace before the output's first text or marker is dropped (GLM
                             * writes "\n<think>" after its prompt; vLLM's glm45 parser keeps
                             * nothing before <think>, and GLM's template strips an answer's content) */
    char tools_open[64];                  /* opens the tool calls */
    bool tools_open_kept;                 /* tools_open is the first call's own opening (GLM) */
    char suffix[48];                      /* the spelling suffix (Hy3's ":opensource"), for the parser */
    /* The call syntax, for a forced call's grammar and opening (tool_grammar.h): the markers by
     * NX_TM_* ("" where the format has none), the grammar's variant flags, the text a forced
     * call's name is followed by (the separator's spelling, a newline, or nothing), and what a
     * forced answer opens with before tools_open (an empty or closed reasoning, left out when the
     * prompt already ends with it; with preamble_after_open, written only after a prompt that
     * ends in think_open: DeepSeek-V3.1's template adds no generation prompt after a tool
     * result). json_args: the arguments are JSON text, which the template also takes as text
     * (a request's arguments strings stay strings). */
    char tool[NX_TM_N][64];
    bool newline_sep, open_end, string_exact, bare_name, json_args;
    char name_end[64];
    char preamble[32];
    bool preamble_after_open;
    /* text_calls: only the call markers (tool[NX_TM_CALL_OPEN], tool[NX_TM_CALL_CLOSE]) are
     * tokens and the call between them is text (Qwen's XML and JSON calls); the other tool[]
     * entries are "" and a forced call has no grammar (nx_chat_tokens_forced). */
    bool text_calls;
} nx_chat_markers;

typedef struct nx_chat_format {
    const char *name;   /* "hy3", "glm45", "glm47", "deepseek_v31", "qwen35", "qwen3_next" */
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
    bool lead;             /* trim_lead: nothing but whitespace has come yet */
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

/* ---- token by token: the server's split, on marker tokens as a tokenizer numbers them */

typedef struct nx_chat_tokens {
    const nx_chat_format *f;
    nx_chat_markers m;
    int32_t think_open, think_close, tools_open; /* ids, -1: not a token */
    int32_t tool[NX_TM_N];
} nx_chat_tokens;

/* Spells f's markers with suffix and looks their ids up in tok. */
void nx_chat_tokens_init(nx_chat_tokens *t, const nx_chat_format *f, const char *suffix, const nx_tokenizer *tok);
/* Whether tok has the tool-call markers (then tool calls can be split out). */
bool nx_chat_tokens_tools(const nx_chat_tokens *t);
/* Whether a call can also be forced (tool_choice required or named): the markers are there and
 * the call syntax has a grammar (not text_calls). */
bool nx_chat_tokens_forced(const nx_chat_tokens *t);
/* Whether tok has the reasoning markers. */
bool nx_chat_tokens_reasoning(const nx_chat_tokens *t);
/* The forced-call grammar's markers. */
void nx_chat_tokens_grammar(const nx_chat_tokens *t, nx_tool_markers *mk);

typedef struct nx_chat_split {
    const nx_chat_tokens *t;
    bool tools, reasoning;
    nx_chat_part part;
    bool lead; /* trim_lead (with reasoning split out): nothing but whitespace has come yet */
} nx_chat_split;

/* Starts a split for one generation; prompt_last: the prompt's last token that is not
 * whitespace (one that is think_open opens the reasoning: Hy3's template ends so for
 * reasoning_effort low/high, Qwen's in "<think>\n" when thinking). */
void nx_chat_split_init(nx_chat_split *s, const nx_chat_tokens *t, bool tools, bool reasoning, int32_t prompt_last);
/* Routes token id: the part its text belongs to, or -1 for a marker that only switches parts.
 * Inside the tool calls every token is NX_CHAT_TOOLS, and a marker's text comes as *marker (the
 * detokenizer drops special tokens); so does tools_open's when the format keeps it. Once the
 * tool calls have begun they last to the end of the output. */
int nx_chat_split_token(nx_chat_split *s, int32_t id, const char **marker);
/* How many leading bytes of a content token's text (n bytes) to drop: the whitespace that
 * precedes the output's first text under trim_lead, else 0. */
size_t nx_chat_split_lead(nx_chat_split *s, const char *text, size_t n);

#endif
