/* Text helpers of the chat-output parsers (output_text.h). */
#include "serve/output_text.h"

#include <ctype.h>
#include <jansson.h>
#include <string.h>

#include "constrain/tool_grammar.h"

size_t nx_out_find(const char *s, size_t n, size_t from, const char *needle) {
    const size_t k = strlen(needle);
    for (size_t i = from; i + k <= n; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, k) == 0) return i;
    return n;
}

void nx_out_trim(const char *s, size_t *b, size_t *e) {
    while (*b < *e && isspace((unsigned char)s[*b])) (*b)++;
    while (*e > *b && isspace((unsigned char)s[*e - 1])) (*e)--;
}

size_t nx_out_partial_tail(const char *s, size_t n, size_t from, const char *needle) {
    const size_t k = strlen(needle);
    for (size_t l = k - 1 < n - from ? k - 1 : n - from; l > 0; l--)
        if (memcmp(s + n - l, needle, l) == 0) return l;
    return 0;
}

bool nx_out_call_name(const char *s, size_t nb, size_t ne, char name[256]) {
    nx_out_trim(s, &nb, &ne);
    if (ne == nb || ne - nb > 255 || memchr(s + nb, '\0', ne - nb)) return false;
    memcpy(name, s + nb, ne - nb);
    name[ne - nb] = '\0';
    json_t *valid = json_string(name); /* NULL: not UTF-8 */
    json_decref(valid);
    return valid != NULL;
}

/* Whether x is a value of one of the types in bits (NX_ARG_*). */
static bool fits(const json_t *x, int bits) {
    if (json_is_integer(x)) return bits & (NX_ARG_INT | NX_ARG_NUM);
    if (json_is_real(x)) return bits & NX_ARG_NUM;
    if (json_is_boolean(x)) return bits & NX_ARG_BOOL;
    return (json_is_object(x) || json_is_array(x)) && (bits & NX_ARG_OTHER);
}

void nx_out_type_args(json_t *args, const json_t *tools, const char *name) {
    const char *key;
    json_t *v;
    json_object_foreach(args, key, v) {
        const int bits = nx_tool_arg_types(nx_tool_arg_schema(tools, name, key));
        if (!json_is_string(v) || !bits || (bits & NX_ARG_STRING)) continue;
        json_t *x = json_loadb(json_string_value(v), json_string_length(v), JSON_DECODE_ANY, NULL);
        if (x && fits(x, bits)) json_object_set(args, key, x); /* replaces v in place */
        json_decref(x);
    }
}
