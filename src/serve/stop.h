/* Stop strings matched on detokenized text across token boundaries. Text that could still be
 * the start of a stop string is held back until the next token decides it, so a stop string is
 * never emitted, not even in part, and a stream never has to take text back. */
#ifndef NX_SERVE_STOP_H
#define NX_SERVE_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "base/strbuf.h"

typedef struct nx_stop_matcher {
    char *const *stops; /* borrowed; non-empty strings */
    size_t n_stop;
    nx_strbuf pending; /* received but not yet released */
    bool matched;
} nx_stop_matcher;

void nx_stop_init(nx_stop_matcher *m, char *const *stops, size_t n_stop);
void nx_stop_free(nx_stop_matcher *m);

/* Feeds len bytes of text and appends what can safely be released to out. When a stop string
 * completes, the text before it is released, *stopped becomes true and later pushes are
 * ignored. */
nx_status nx_stop_push(nx_stop_matcher *m, const char *text, size_t len, nx_strbuf *out,
                       bool *stopped);
/* End of generation: releases the held-back text (it turned out not to be a stop string). */
nx_status nx_stop_flush(nx_stop_matcher *m, nx_strbuf *out);

#endif
