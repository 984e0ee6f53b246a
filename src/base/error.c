/* nx_error helpers: formatting failure messages for callers to print. */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

nx_status nx_fail(nx_error *err, nx_status st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = st;
    }
    return st;
}

void nx_error_prefix(nx_error *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* shift the old message right and put the prefix in front, truncating at the end */
    size_t pl = strlen(prefix), cap = sizeof err->msg;
    if (pl + 2 >= cap) pl = cap - 3;
    size_t ol = strnlen(err->msg, cap - 1);
    if (pl + 2 + ol >= cap) ol = cap - 1 - pl - 2;
    memmove(err->msg + pl + 2, err->msg, ol);
    memcpy(err->msg, prefix, pl);
    err->msg[pl] = ':';
    err->msg[pl + 1] = ' ';
    err->msg[pl + 2 + ol] = 0;
}

const char *nx_status_str(nx_status st) {
    switch (st) {
    case NX_OK: return "ok";
    case NX_E_IO: return "i/o error";
    case NX_E_FORMAT: return "malformed input";
    case NX_E_CONFIG: return "bad configuration";
    case NX_E_NOMEM: return "out of memory";
    case NX_E_ARG: return "invalid argument";
    case NX_E_UNSUPPORTED: return "unsupported";
    case NX_E_STATE: return "invalid state";
    case NX_E_RANK: return "rank failed";
    }
    return "unknown error";
}
