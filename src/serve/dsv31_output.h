/* DeepSeek-V3.1 (deepseek_v3) chat output, split as vLLM's deepseek_v3 reasoning parser and
 * deepseekv31 tool parser split it:
 *   [<think>]reasoning</think>content<｜tool▁calls▁begin｜>
 *   <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"k": v, …}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>
 * The template's generation prompt ends in "<think>" when the request asks for thinking
 * (chat_template_kwargs thinking or enable_thinking), so the reasoning is opened by the prompt,
 * else in "</think>" and everything is content up to the calls. The markers are special tokens
 * with one spelling. The chat_format.h entry "deepseek_v31" wraps these. */
#ifndef NX_SERVE_DSV31_OUTPUT_H
#define NX_SERVE_DSV31_OUTPUT_H

#include <jansson.h>
#include <stddef.h>

#define NX_DSV31_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define NX_DSV31_CALLS_END "<｜tool▁calls▁end｜>"
#define NX_DSV31_CALL_BEGIN "<｜tool▁call▁begin｜>"
#define NX_DSV31_CALL_END "<｜tool▁call▁end｜>"
#define NX_DSV31_SEP "<｜tool▁sep｜>"

/* The tool calls in text (what followed <｜tool▁calls▁begin｜>, markers spelled out), as a JSON
 * array of {"type": "function", "function": {"name", "arguments"}} (arguments a compact JSON
 * object serialized as a string), without ids. A call is <｜tool▁call▁begin｜>NAME
 * <｜tool▁sep｜>ARGS<｜tool▁call▁end｜>; a last call cut short (max_tokens) counts once its
 * ARGS, less the first bytes of <｜tool▁call▁end｜> after them, are already one whole object. NAME is trimmed; a call whose name is empty, longer than
 * 255 bytes or not UTF-8 is skipped, and so is one whose ARGS (trimmed) do not begin with one
 * JSON object of valid UTF-8 (what follows the object is ignored; empty ARGS are {}), as is one
 * without its separator. The model writes typed
 * JSON, kept as it is (vLLM passes it through), except that a string value of a top-level
 * argument whose schema in tools has no string type (nx_tool_arg_types) becomes the value it
 * spells when that fits the type (the integer 3 for "3" under "integer"). Returns a new
 * reference, an empty array when nothing parses, NULL when out of memory. */
json_t *nx_dsv31_parse_tool_calls(const char *text, size_t len, const json_t *tools);

#endif
