/* Tool-call arguments under tool_choice "required" or a named function: the recogniser that
 * masks every token that cannot continue Hy3's call syntax (or GLM's or DeepSeek-V3.1's, below) (docs/design.md §11) into calls whose
 * arguments match the tools' parameter schemas, as vLLM constrains a forced call to the
 * function's schema. The prompt has opened the call (serve/server.c): `<tool_call>` (required),
 * or `<tool_call>NAME<tool_sep>` (named); from there the language is
 *
 *   [NAME <tool_sep>]  (required: one of the tools' names)
 *   ( ws <arg_key> KEY </arg_key> ws <arg_value> VALUE </arg_value> )*  ws </tool_call>
 *   (required only: ws <tool_call> NAME <tool_sep> ... </tool_call>)*  ws </tool_calls>  end
 *
 * where every marker is its special token, ws is at most 4 bytes of whitespace, and a function
 * whose parameters list properties takes those keys in their listed order, each at most once
 * (an optional one may be skipped, a required one may not, and </tool_call> waits for the
 * required ones), as JSON mode takes an object's keys. A value is raw text where the
 * parser reads the argument as a string (nx_tool_arg_types has a string among its types: what
 * vLLM's hy_v3 tool parser does; one of the literals, whole, under an enum or const of strings;
 * under a pattern, format, minLength or maxLength, text those allow, through pattern.h's
 * automaton; at most NX_TOOL_MAX_PATTERNS patterns and formats in all, each compiled once),
 * otherwise one JSON value of the property's schema
 * (json_grammar.h: the same subset as response_format json_schema). Parameters the JSON-mode
 * compiler refuses keep their keys' order and names but take any text as values; parameters
 * without properties take any keys (up to 128 bytes) and text. Text (raw values, free keys) is
 * whole UTF-8 characters without NUL, as the parser needs it to keep a pair. */
#ifndef NX_CONSTRAIN_TOOL_GRAMMAR_H
#define NX_CONSTRAIN_TOOL_GRAMMAR_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "constrain/json_grammar.h"
#include "nextn.h"

/* The types an argument's value may take, as vLLM's hy_v3 tool parser reads a property schema:
 * from "type" (a name or a list; aliases str/text/varchar/char/enum, bool/binary,
 * int/uint/long/short/unsigned…, num…/float…/double; "null" adds nothing; any other name,
 * array and object included, is NX_ARG_OTHER), else from the options of "anyOf" / "oneOf"; a
 * missing schema, or one without either, means a string. */
enum { NX_ARG_STRING = 1, NX_ARG_BOOL = 2, NX_ARG_INT = 4, NX_ARG_NUM = 8, NX_ARG_OTHER = 16 };
int nx_tool_arg_types(const json_t *schema);
/* The property schema of argument key of function name in an OpenAI tools array, or NULL. */
const json_t *nx_tool_arg_schema(const json_t *tools, const char *name, const char *key);

/* The call syntax's special tokens by NX_TM_* (-1: the tokenizer lacks it; then no grammar is
 * made, except for the two a format may do without). GLM-4.5's form (the chat_format.h entry
 * "glm45") has neither <tool_sep> nor </tool_calls>: with newline_sep the name ends at a newline
 * byte (id[NX_TM_SEP] unused) and with open_end the calls end at the end of the output (an end
 * id may follow any </tool_call>; id[NX_TM_CALLS_CLOSE] unused); with string_exact a value is raw
 * text only where the property's "type" is exactly "string", as vLLM's glm4_moe parser keeps
 * the text of those alone. GLM-4.7's form ("glm47") writes no newline after the name: with
 * bare_name the name ends at the first <arg_key> or </tool_call> (id[NX_TM_SEP] unused).
 * DeepSeek-V3.1's ("deepseek_v31") writes the arguments as one JSON object:
 *   NAME <tool_sep> {…} <tool_call_end>
 * with json_args the object directly follows the separator and matches the function's whole
 * parameters schema (json_grammar.h; any object where it has no properties or does not
 * compile), and the key / value markers are unused. */
enum { NX_TM_CALL_OPEN, NX_TM_CALL_CLOSE, NX_TM_CALLS_CLOSE, NX_TM_SEP, NX_TM_KEY_OPEN, NX_TM_KEY_CLOSE,
       NX_TM_VALUE_OPEN, NX_TM_VALUE_CLOSE, NX_TM_N };
typedef struct nx_tool_markers {
    int32_t id[NX_TM_N];
    bool newline_sep, open_end, string_exact, bare_name, json_args;
} nx_tool_markers;

/* Whether the form mk's flags describe writes marker i (NX_TM_*): the separator, </tool_calls>
 * and the key / value markers are not every form's. */
bool nx_tool_marker_used(const nx_tool_markers *mk, int i);

#define NX_TOOL_MAX 64 /* tools a grammar tells apart by name */
#define NX_TOOL_MAX_PATTERNS 64 /* "pattern" and "format" keys in all the tools' parameters */

/* Where the output is in the language above. Unused fields are zero, so states compare whole
 * (the sampler's mask cache). */
typedef struct nx_tool_state {
    uint8_t mode;  /* tool_grammar.c */
    uint8_t ws;    /* whitespace bytes in the current run */
    int16_t tool;  /* the call's tool (-1 while its name is read) */
    int16_t next;  /* keyed parameters: the first property still allowed */
    int16_t prop;  /* the property whose value is read (-1: a free key's) */
    uint16_t cpos; /* name or key: bytes so far */
    uint8_t u8left, u8lo, u8hi; /* text: UTF-8 continuation bytes owed, and the next one's range */
    uint16_t pst;  /* text under a pattern: the pattern automaton's state */
    uint16_t chars; /* text: code points so far (counted where a property limits them) */
    uint64_t cand; /* name or key: the candidates still matching */
    nx_json_state js; /* a JSON value's reading (zero otherwise) */
} nx_tool_state;

/* From the request's tools array (OpenAI's [{"type": "function", "function": {"name",
 * "parameters"}}]), only: the named function, or NULL for any (tool_choice "required", then one
 * or more calls); vocab gives each token's bytes and the end ids. */
nx_status nx_tool_grammar_new(const json_t *tools, const char *only, const nx_tool_markers *mk,
                              const nx_json_vocab *vocab, nx_tool_grammar **out, nx_error *err);
void nx_tool_grammar_free(nx_tool_grammar *g);

/* The state at the start of the answer (the call opened by the prompt). */
void nx_tool_init(const nx_tool_grammar *g, nx_tool_state *st);
/* One more token; false (and the state is dead) if the output can no longer be valid. */
bool nx_tool_step(const nx_tool_grammar *g, nx_tool_state *st, int32_t id);
/* The calls are closed: only an end id may follow. */
bool nx_tool_done(const nx_tool_state *st);
/* An end id may come now: the calls are closed, or (open_end) a call has just closed. */
bool nx_tool_can_end(const nx_tool_grammar *g, const nx_tool_state *st);
/* allow[i] = 1 for the tokens that may follow st (the end ids once done; if nothing else is
 * possible, the end ids anyway); ids past the vocabulary get 0. */
void nx_tool_allowed(const nx_tool_grammar *g, const nx_tool_state *st, int32_t n_tokens, uint8_t *allow);

#endif
