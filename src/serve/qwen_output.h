/* Qwen3.5 / Qwen3.6 (qwen3_5_moe) and Qwen3-Next (qwen3_next) chat output, split as vLLM's
 * qwen3 reasoning parser and its qwen3_coder and hermes tool parsers split it (the parsers the
 * model cards give: qwen3 + qwen3_coder for Qwen3.5 / 3.6; hermes, and deepseek_r1 reasoning for
 * the Thinking model, for Qwen3-Next):
 *   [<think>]reasoning</think>content<tool_call>
 *   <function=NAME>
 *   <parameter=K>
 *   V
 *   </parameter>
 *   </function>
 *   </tool_call>                                                     (Qwen3.5 / 3.6: Qwen3-Coder XML)
 *   …<tool_call>
 *   {"name": "NAME", "arguments": {…}}
 *   </tool_call>                                                     (Qwen3-Next: hermes JSON)
 * The templates end the generation prompt in "<think>\n" when thinking (Qwen3.5 / 3.6 by
 * default, Qwen3-Next-Thinking always), so the reasoning is opened by the prompt; with
 * enable_thinking false Qwen3.5's ends in "<think>\n\n</think>\n\n" and all is content. Only
 * <tool_call> and </tool_call> are special tokens; <function=…> and <parameter=…> are text. The
 * chat_format.h entries "qwen35" and "qwen3_next" wrap these. */
#ifndef NX_SERVE_QWEN_OUTPUT_H
#define NX_SERVE_QWEN_OUTPUT_H

#include <jansson.h>
#include <stddef.h>

/* The Qwen3-Coder calls in text (from the first <tool_call> on, markers spelled out), as a JSON
 * array of {"type": "function", "function": {"name", "arguments"}} (arguments a compact JSON
 * object serialized as a string), without ids. Each <tool_call>…</tool_call> counts, and a last
 * call cut short once its name is complete; a call without <function=NAME> is skipped, as is one
 * whose NAME (up to the first '>', trimmed) is empty, longer than 255 bytes or not UTF-8. The
 * function body runs to </function> (or the call's end). A parameter is <parameter=K>V and ends
 * at </parameter>, the next <parameter=, or the end of a closed body, as vLLM's regex ends it; a
 * value cut short by the end of the output is left out (it may still grow). V loses one leading
 * and one trailing newline. Values are text, converted by the schema of K in tools as vLLM's
 * qwen3_coder parser converts them: K without a schema stays text; the type is the schema's
 * "type" (lower-cased) or the first non-null type of its "anyOf" (else "string"); where the
 * schema admits null, "null" / "none" (any case) are null; string types (string, str, text,
 * varchar, char, enum) keep the text; otherwise "null" / "none" are null, int… / uint… / long… /
 * short… / unsigned… parse as an integer, num… / float… as a number (an integer when whole),
 * boolean / bool / binary are true exactly when the text is "true" in any case, object / array /
 * arr / dict… / list… and other types parse as JSON (then the literals True, False, None), and
 * text that does not parse stays text. A key or value that is not UTF-8 drops the parameter; a
 * repeated key keeps its first place and takes the last value. Returns a new reference, an empty
 * array when nothing parses, NULL when out of memory. */
json_t *nx_qwen_xml_parse_tool_calls(const char *text, size_t len, const json_t *tools);

/* The hermes calls in text: each <tool_call> BODY </tool_call>, BODY (trimmed) beginning with one
 * JSON object {"name": NAME, "arguments": {…}} (what follows it is ignored, where vLLM's hermes
 * parser refuses it, so that a call counts for good once its object is whole: a last call cut
 * short counts from then on). A call whose object does not parse, whose name is not a string of
 * 1 to 255 bytes (trimmed) without NUL, or whose arguments are not an object is skipped (vLLM's
 * hermes parser then gives up on all the calls). The arguments are the
 * model's JSON, except that a string value of a top-level argument whose schema has no string
 * type becomes the value it spells when that fits the type (as deepseek_v31's). Returns as
 * nx_qwen_xml_parse_tool_calls. */
json_t *nx_qwen_json_parse_tool_calls(const char *text, size_t len, const json_t *tools);

#endif
