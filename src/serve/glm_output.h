/* GLM-4.5 (glm4_moe) and GLM-4.7 (glm4_moe_lite) chat output, split as vLLM's glm45 reasoning
 * parser and glm4_moe / glm47 tool parsers split it:
 *   <think>reasoning</think>content<tool_call>NAME
 *   <arg_key>K</arg_key>
 *   <arg_value>V</arg_value>
 *   …</tool_call><tool_call>…</tool_call>
 * GLM-4.7 writes no newline after the name nor between pairs ("<tool_call>NAME<arg_key>…"),
 * and its prompt opens the reasoning (it ends in "<think>"). Reasoning only when the output or
 * the prompt opens it with <think>; content is what precedes the first <tool_call>. The
 * chat_format.h entries "glm45" and "glm47" wrap these. */
#ifndef NX_SERVE_GLM_OUTPUT_H
#define NX_SERVE_GLM_OUTPUT_H

#include <jansson.h>
#include <stddef.h>

/* The tool calls in text, as a JSON array of {"type": "function", "function": {"name",
 * "arguments"}} (arguments a compact JSON object serialized as a string), without ids.
 * Each <tool_call>…</tool_call> counts, and a last call cut short (max_tokens) once its name is
 * complete, with its complete pairs. The name runs to the first newline (a real one or the two
 * characters backslash-n, as vLLM's glm4_moe parser accepts) or the first <arg_key> (vLLM's
 * glm47), whichever comes first, else to the call's end; it is trimmed, and a call whose name is
 * empty, longer than 255 bytes or not UTF-8 is skipped. Pairs are <arg_key>K</arg_key>, spaces
 * or backslash-n, <arg_value>V</arg_value>; K and V are trimmed; a pair missing a part or not
 * UTF-8 is skipped; a repeated key keeps its first place and takes the last value. Values are
 * typed as vLLM types them: a key whose schema type in tools is exactly "string" keeps its text;
 * any other value is JSON when it parses as JSON, else JSON once its backslash escapes are
 * undone (a JSON string's body), else the Python literals True, False, None as true, false,
 * null, else its text. Returns a new reference, NULL when out of memory. */
json_t *nx_glm_parse_tool_calls(const char *text, size_t len, const json_t *tools);

#endif
