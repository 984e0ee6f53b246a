/* JSON Schema `pattern` for JSON mode: a regular expression (the ECMA-262 subset below, with the
 * `u` flag's meaning, as JSON Schema validators run it) compiled to a deterministic automaton over
 * the UTF-8 bytes of a string's characters, so the JSON automaton can refuse, byte by byte, any
 * string value that could no longer match.
 *
 * Subset: literal characters; `.` (any character but \n, \r, U+2028, U+2029); classes `[...]`,
 * `[^...]` with ranges; escapes \d \D \w \W \s \S \t \n \v \f \r \0 \xHH \uHHHH \u{H...} and the
 * escaped syntax characters; groups `(...)`, `(?:...)`; alternation `|`; quantifiers `*`, `+`,
 * `?`, `{n}`, `{n,}`, `{n,m}` (lazy forms too: they match the same strings). As in JSON Schema the
 * pattern is not anchored: it may match anywhere in the string unless a top-level alternative
 * starts with `^` / ends with `$`. Refused by name: anchors elsewhere, lookarounds, backreferences,
 * word boundaries, named groups, Unicode property escapes.
 *
 * The automaton also carries the string's minLength / maxLength (in code points, as JSON Schema
 * counts), and it is trimmed: every state it can be in still has a way to an accepted end using
 * only characters a JSON string can hold without a \u escape, so masking never leads into a dead
 * end. */
#ifndef NX_CONSTRAIN_PATTERN_H
#define NX_CONSTRAIN_PATTERN_H

#include <stddef.h>
#include <stdint.h>

#define NX_PATTERN_MAX_STATES 4096 /* automaton states; a larger pattern is refused */

typedef struct nx_pattern {
    int32_t n_states; /* state 0 is dead: no string through it can match */
    int32_t n_cls;
    uint16_t start;
    uint8_t cls[256];  /* byte -> class */
    uint16_t *next;    /* [n_states][n_cls] */
    uint8_t *accept;   /* [n_states]: the string may end here */
} nx_pattern;

/* Compiles re (len bytes, UTF-8) for strings of min_len..max_len code points (max_len < 0: no
 * limit). NULL on failure, with the reason in err (errcap bytes). */
nx_pattern *nx_pattern_compile(const char *re, size_t len, int32_t min_len, int32_t max_len, char *err,
                               size_t errcap);
void nx_pattern_free(nx_pattern *p);

static inline uint16_t nx_pattern_step(const nx_pattern *p, uint16_t state, uint8_t byte) {
    return p->next[(size_t)state * (size_t)p->n_cls + p->cls[byte]];
}

#endif
