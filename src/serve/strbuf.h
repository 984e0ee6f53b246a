/* A growable byte buffer for building response bodies and SSE streams. Always NUL-terminated
 * after a successful append, so its contents can be handed to C string APIs. */
#ifndef NX_SERVE_STRBUF_H
#define NX_SERVE_STRBUF_H

#include <stddef.h>

#include "nextn.h"

typedef struct nx_strbuf {
    char *data; /* NULL until the first append */
    size_t len, cap;
} nx_strbuf;

/* Appends n bytes; NX_E_NOMEM (buffer unchanged) when it cannot grow. */
nx_status nx_strbuf_append(nx_strbuf *b, const char *s, size_t n);
nx_status nx_strbuf_puts(nx_strbuf *b, const char *s);
nx_status nx_strbuf_printf(nx_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes (consumed by a reader). */
void nx_strbuf_consume(nx_strbuf *b, size_t n);
/* Hands the contents to the caller (malloc'd, "" when empty) and resets the buffer. */
char *nx_strbuf_take(nx_strbuf *b);
void nx_strbuf_free(nx_strbuf *b);

#endif
