/* Error reporting for library code: every fallible function returns an nx_status and, when it
 * fails, leaves a human-readable message in the caller's nx_error (which may be NULL). Library
 * code never exits or prints; the CLI decides what to do with the message. */
#ifndef NX_BASE_ERROR_H
#define NX_BASE_ERROR_H

#include "nextn.h"

/* Formats the message into err (if non-NULL) and returns st, so callers can write
 * `return nx_fail(err, NX_E_FORMAT, "%s: tensor %s: ...", path, name);`. */
nx_status nx_fail(nx_error *err, nx_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an existing message (adds context as an error travels up). */
void nx_error_prefix(nx_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
