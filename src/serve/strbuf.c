/* nx_strbuf: append-only byte buffer with geometric growth and overflow-checked sizes. */
#include "serve/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static nx_status reserve(nx_strbuf *b, size_t extra) {
    if (extra > SIZE_MAX - b->len - 1) return NX_E_NOMEM;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return NX_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *d = realloc(b->data, cap);
    if (!d) return NX_E_NOMEM;
    b->data = d;
    b->cap = cap;
    return NX_OK;
}

nx_status nx_strbuf_append(nx_strbuf *b, const char *s, size_t n) {
    nx_status st = reserve(b, n);
    if (st != NX_OK) return st;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return NX_OK;
}

nx_status nx_strbuf_puts(nx_strbuf *b, const char *s) { return nx_strbuf_append(b, s, strlen(s)); }

nx_status nx_strbuf_printf(nx_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NX_E_ARG;
    nx_status st = reserve(b, (size_t)n);
    if (st != NX_OK) return st;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return NX_OK;
}

void nx_strbuf_consume(nx_strbuf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data) b->data[b->len] = '\0';
}

char *nx_strbuf_take(nx_strbuf *b) {
    char *d = b->data ? b->data : calloc(1, 1);
    b->data = NULL;
    b->len = b->cap = 0;
    return d;
}

void nx_strbuf_free(nx_strbuf *b) {
    if (!b) return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
