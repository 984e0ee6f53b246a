/* A growable byte buffer, shared by the tokenizer (normalized text, pre-tokenizer pieces,
 * decoded bytes) and the server (response bodies, SSE streams). Always NUL-terminated after a
 * successful append, so its contents can be handed to C string APIs. */
#ifndef NX_BASE_STRBUF_H
#define NX_BASE_STRBUF_H

#include <stdarg.h>
#include <stddef.h>

#include "nextn.h"

typedef struct nx_strbuf {
    char *data; /* NULL until the first append or reserve */
    size_t len, cap;
} nx_strbuf;

/* Makes room for extra more bytes (and the NUL) without changing the contents, so a caller can
 * write up to extra bytes at data + len itself, then advance len and terminate. data is non-NULL
 * and NUL-terminated afterwards. NX_E_NOMEM (buffer unchanged) when it cannot grow. */
nx_status nx_strbuf_reserve(nx_strbuf *b, size_t extra);
/* Appends n bytes; NX_E_NOMEM (buffer unchanged) when it cannot grow. */
nx_status nx_strbuf_append(nx_strbuf *b, const char *s, size_t n);
nx_status nx_strbuf_puts(nx_strbuf *b, const char *s);
nx_status nx_strbuf_printf(nx_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* nx_strbuf_printf for functions that are variadic themselves; ap as for vprintf. */
nx_status nx_strbuf_vprintf(nx_strbuf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Drops the first n bytes (consumed by a reader). */
void nx_strbuf_consume(nx_strbuf *b, size_t n);
/* Hands the contents to the caller (malloc'd, "" when empty) and resets the buffer. */
char *nx_strbuf_take(nx_strbuf *b);
void nx_strbuf_free(nx_strbuf *b);

#endif
