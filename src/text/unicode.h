/* UTF-8 helpers shared by the tokenizer and the streaming detokenizer: validation, code point
 * decoding, and the lossy "maximal subpart" repair (each invalid stretch becomes one U+FFFD),
 * which is what WHATWG TextDecoder and Rust's from_utf8_lossy do. */
#ifndef NX_TEXT_UNICODE_H
#define NX_TEXT_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
 * On failure *bad_off (if non-NULL) receives the offset of the first offending byte. */
bool nx_utf8_valid(const char *s, size_t n, size_t *bad_off);

/* Length of the well-formed sequence starting at s[0] (1..4), or 0 when s[0..n) does not start
 * with one. Writes the code point to *cp on success. */
size_t nx_utf8_next(const char *s, size_t n, uint32_t *cp);

/* Writes the UTF-8 encoding of cp (<= U+10FFFF, not a surrogate) to out; returns 1..4. */
size_t nx_utf8_put(uint32_t cp, char out[4]);

/* Copies s[0..n) to out, replacing each maximal ill-formed subpart with U+FFFD. When final is
 * false, a trailing sequence that is a valid but incomplete prefix is not consumed (a stream may
 * complete it later). out needs room for 3 * n bytes. Returns the number of input bytes consumed
 * and stores the number of bytes written in *out_len. */
size_t nx_utf8_repair(const char *s, size_t n, bool final, char *out, size_t *out_len);

/* Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s test). */
bool nx_unicode_is_space(uint32_t cp);

#endif
