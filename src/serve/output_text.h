/* Text helpers the chat-output parsers share (glm_output.c, dsv31_output.c, qwen_output.c):
 * marker search on byte ranges that need not be NUL-terminated, trimming, and the checks every
 * parser applies to a call's name. */
#ifndef NX_SERVE_OUTPUT_TEXT_H
#define NX_SERVE_OUTPUT_TEXT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* First occurrence of the NUL-terminated needle in s[from, n), or n. */
size_t nx_out_find(const char *s, size_t n, size_t from, const char *needle);
/* s[*b, *e) without leading and trailing ASCII whitespace. */
void nx_out_trim(const char *s, size_t *b, size_t *e);
/* The length of the longest tail of s[from, n) that is a proper prefix of needle: the bytes a
 * marker cut short by the end of the output may have begun. */
size_t nx_out_partial_tail(const char *s, size_t n, size_t from, const char *needle);
/* Copies the call name s[nb, ne), trimmed, into name (256 bytes). false when it is empty,
 * longer than 255 bytes (OpenAI allows 64), holds a NUL or is not UTF-8: such a call is skipped. */
bool nx_out_call_name(const char *s, size_t nb, size_t ne, char name[256]);
/* Types a JSON arguments object the model wrote: a string value of a top-level argument whose
 * schema in tools has no string type (nx_tool_arg_types) becomes the value it spells when that
 * fits the type (the integer 3 for "3" under "integer"); anything else stays as written. */
void nx_out_type_args(json_t *args, const json_t *tools, const char *name);

#endif
