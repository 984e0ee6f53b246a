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
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
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
    }
    return "unknown error";
}
