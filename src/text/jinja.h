/* Jinja template interpreter for Hugging Face chat templates: a template is parsed once into an
 * immutable tree and rendered any number of times (concurrently, too) against a JSON context.
 * Semantics follow Jinja2 as transformers configures it: trim_blocks, lstrip_blocks, no
 * autoescape, loop controls ({% break %}/{% continue %}), and transformers' tojson. */
#ifndef NX_TEXT_JINJA_H
#define NX_TEXT_JINJA_H

#include <jansson.h>

#include "nextn.h"

/* Parse-time nesting cap (blocks inside blocks, parentheses, unary chains): bounds the C stack
 * used by both the parser and the renderer, whatever the template. */
#define NX_JINJA_MAX_DEPTH 64
/* Macro recursion cap at render time. */
#define NX_JINJA_MAX_CALL_DEPTH 64

typedef struct nx_jinja nx_jinja;

/* Budgets a single render may spend; a template that exceeds either fails with NX_E_FORMAT
 * instead of hanging or exhausting memory (loop bombs, string doubling). */
typedef struct nx_jinja_limits {
    uint64_t max_steps; /* evaluated nodes + loop iterations + charged work; default 20M */
    size_t max_bytes;   /* total bytes a render may allocate; default 256 MiB */
} nx_jinja_limits;

/* Parses len bytes of template source. On failure the message carries "line L, column C".
 * Unknown filters and tests are parse errors (as in Jinja2). *out is owned by the caller. */
nx_status nx_jinja_parse(const char *src, size_t len, nx_jinja **out, nx_error *err);

/* Replaces the default render budgets (zero fields keep the default). */
void nx_jinja_set_limits(nx_jinja *t, const nx_jinja_limits *lim);

/* Renders with ctx (a JSON object, or NULL for an empty context) as the template's variables.
 * *out is malloc'd, NUL-terminated and owned by the caller; *out_len (optional) excludes the NUL.
 * A template calling raise_exception(msg) fails with NX_E_ARG and msg in the error; other
 * runtime errors (type errors, limits) fail with NX_E_FORMAT. */
nx_status nx_jinja_render(const nx_jinja *t, const json_t *ctx, char **out, size_t *out_len,
                          nx_error *err);

void nx_jinja_free(nx_jinja *t);

#endif
