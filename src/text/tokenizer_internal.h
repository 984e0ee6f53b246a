/* Tokenizer entry points that are not part of the public API: loading from a buffer already in
 * memory, used by the fuzz target and the unit tests to skip the file system. */
#ifndef NX_TEXT_TOKENIZER_INTERNAL_H
#define NX_TEXT_TOKENIZER_INTERNAL_H

#include "nextn.h"

/* Parses len bytes of tokenizer.json. Errors name the offending field, without a file name. */
nx_status nx_tokenizer_load_json(const char *buf, size_t len, nx_tokenizer **out, nx_error *err);

#endif
