/* Hy3 (hy_v3) chat output, split the way vLLM's hy_v3 reasoning and tool parsers and mlx-lm's
 * hy_v3 tool parser split it (docs/design.md §11):
 *   [<think>]reasoning</think>content<tool_calls>
 *   <tool_call>NAME<tool_sep>
 *   <arg_key>K</arg_key>
 *   <arg_value>V</arg_value>
 *   …</tool_call>
 *   </tool_calls>
 * Every marker is a special token, spelled with the tokenizer's token_suffix (":opensource" in
 * the final release: "<tool_calls:opensource>"). The split works on token ids as they are
 * generated (nx_hy_split_token), so a server can stream content and reasoning and hold the tool
 * calls back until they are complete; nx_hy_parse_tool_calls then turns the held-back text into
 * OpenAI tool calls, typing each argument by the request's JSON schema for it. */
#ifndef NX_SERVE_HY_OUTPUT_H
#define NX_SERVE_HY_OUTPUT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nextn.h"

typedef enum nx_hy_marker {
    NX_HY_THINK_OPEN,
    NX_HY_THINK_CLOSE,
    NX_HY_CALLS_OPEN,
    NX_HY_CALLS_CLOSE,
    NX_HY_CALL_OPEN,
    NX_HY_CALL_CLOSE,
    NX_HY_SEP,
    NX_HY_KEY_OPEN,
    NX_HY_KEY_CLOSE,
    NX_HY_VALUE_OPEN,
    NX_HY_VALUE_CLOSE,
    NX_HY_N_MARKERS
} nx_hy_marker;

/* The markers' spellings and, once looked up in a tokenizer, their ids (-1: not a token). */
typedef struct nx_hy_markers {
    char text[NX_HY_N_MARKERS][64];
    int32_t id[NX_HY_N_MARKERS];
} nx_hy_markers;

/* Spells the markers with suffix (NULL or "" for the bare forms; longer than 40 bytes: bare)
 * and looks their ids up in tok (NULL: all -1). */
void nx_hy_markers_init(nx_hy_markers *m, const char *suffix, const nx_tokenizer *tok);
/* Whether tok has the tool-call markers (then tool calls can be split out). */
bool nx_hy_markers_tools(const nx_hy_markers *m);
/* Whether tok has the reasoning markers. */
bool nx_hy_markers_reasoning(const nx_hy_markers *m);

/* Where a generated token's text belongs. */
typedef enum nx_hy_part {
    NX_HY_CONTENT,   /* the answer */
    NX_HY_REASONING, /* between <think> (or the prompt's trailing <think>) and </think> */
    NX_HY_TOOLS,     /* after <tool_calls>: held back for nx_hy_parse_tool_calls */
} nx_hy_part;

typedef struct nx_hy_split {
    const nx_hy_markers *m;
    bool tools;       /* split tool calls out (the request offered tools) */
    bool reasoning;   /* split reasoning out */
    nx_hy_part part;  /* where text goes now */
} nx_hy_split;

/* Starts a split for one generation. prompt_last: the prompt's last token id (a prompt that
 * ends in <think> opens the reasoning: Hy3's template does so for reasoning_effort low/high). */
void nx_hy_split_init(nx_hy_split *s, const nx_hy_markers *m, bool tools, bool reasoning, int32_t prompt_last);
/* Routes token id. Returns the part its text belongs to, or -1 when the token is a marker that
 * only switches parts (<think>, </think>, <tool_calls>: no text of its own). Inside the tool
 * calls every token (markers included) is NX_HY_TOOLS: the caller appends the marker's text,
 * *marker (non-NULL then), instead of the detokenizer's (which drops special tokens). Once the
 * tool calls have begun, they last to the end of the output. */
int nx_hy_split_token(nx_hy_split *s, int32_t id, const char **marker);

/* The tool calls in text (what followed <tool_calls>, markers spelled out): a JSON array of
 * {"type": "function", "function": {"name", "arguments"}} (arguments a JSON object serialized
 * as a string, as OpenAI sends it), without ids. Each <tool_call>…</tool_call> counts; a last
 * call cut short counts when it has its name and separator. A call whose name is empty, longer
 * than 255 bytes (OpenAI allows 64) or not UTF-8 is skipped, as is an argument whose key or text
 * is not UTF-8. Argument values are typed by the
 * tools' schema for them: "integer", "number" and "boolean" parse as such, "object", "array"
 * and other types as JSON, "string" stays the raw text; a value that does not parse as its type
 * falls back to the next possibility, a key without a schema is a string. Returns a new
 * reference, an empty array when nothing parses, NULL when out of memory. */
json_t *nx_hy_parse_tool_calls(const char *text, size_t len, const nx_hy_markers *m, const json_t *tools);

#endif
