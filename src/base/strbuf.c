/* nx_strbuf: append-only byte buffer with geometric growth and overflow-checked sizes. */
#include "base/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

nx_status nx_strbuf_reserve(nx_strbuf *b, size_t extra) {
    if (extra > SIZE_MAX - b->len - 1) return NX_E_NOMEM;
    size_t need = b->len + extra + 1;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        char *d = realloc(b->data, cap);
        if (!d) return NX_E_NOMEM;
        b->data = d;
        b->cap = cap;
    }
    /* Even a reservation alone leaves a C string ("" at first), so take() and readers of data
     * never see an unterminated buffer. */
    b->data[b->len] = '\0';
    return NX_OK;
}

nx_status nx_strbuf_append(nx_strbuf *b, const char *s, size_t n) {
    nx_status st = nx_strbuf_reserve(b, n);
    if (st != NX_OK) return st;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return NX_OK;
}

nx_status nx_strbuf_puts(nx_strbuf *b, const char *s) { return nx_strbuf_append(b, s, strlen(s)); }

nx_status nx_strbuf_vprintf(nx_strbuf *b, const char *fmt, va_list ap) {
    va_list ap2; /* formatted twice: once to measure, once into the buffer */
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    nx_status st = n < 0 ? NX_E_ARG : nx_strbuf_reserve(b, (size_t)n);
    if (st == NX_OK) {
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
    return st;
}

nx_status nx_strbuf_printf(nx_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nx_status st = nx_strbuf_vprintf(b, fmt, ap);
    va_end(ap);
    return st;
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
