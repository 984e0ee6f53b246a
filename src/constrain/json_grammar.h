/* JSON mode's recogniser: a byte-level pushdown automaton for RFC 8259 text whose top-level value
 * is an object, used to mask the tokens that cannot continue the output into valid JSON
 * (OpenAI's response_format {"type": "json_object"}). Stricter than the RFC in four places, all
 * still valid JSON: nesting stops at NX_JSON_MAX_DEPTH, whitespace runs at NX_JSON_MAX_WS bytes
 * (so a model cannot pad forever), \u escapes of surrogates and of U+0000 are refused (raw UTF-8
 * carries every character; strict parsers such as jansson reject lone surrogates and NUL), and
 * nothing precedes the opening brace or follows the closing one.
 *
 * With a schema (nx_json_schema_new: a subset of JSON Schema, the one OpenAI's structured outputs
 * take) the automaton also tracks, per open container, the schema node it must match: a value's
 * first byte must start one of its types, an enum is matched literal by literal, keys are
 * matched against the properties in their listed order (an optional one may be skipped, a
 * required one may not), '}' waits for the required properties, and arrays keep their item
 * schema and their minItems / maxItems; a string value counts its code points against its
 * minLength / maxLength (an escape is one) and, with a pattern or a format, walks the pattern's
 * automaton (pattern.h) over the characters' bytes, and an integer its magnitude against its minimum /
 * maximum (a digit only where the number can still end within them); a number under minimum /
 * maximum is written without an exponent and with at most 9 digits after the point, so its value
 * is exact on a grid of 10^-9 and checked the same way. References ($ref to #/$defs/NAME, #/definitions/NAME or
 * #) are nodes that stand for another node, so recursive schemas are finite graphs; an anyOf /
 * oneOf node hands a value to every branch its first byte can start, each followed as its own
 * path (nx_json_state), so the automaton never needs to backtrack. oneOf is taken as anyOf (as
 * llama.cpp's grammars take it): a value two of its branches accept is allowed. */
#ifndef NX_CONSTRAIN_JSON_GRAMMAR_H
#define NX_CONSTRAIN_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nextn.h"

#define NX_JSON_MAX_DEPTH 32
#define NX_JSON_MAX_PROPS 64 /* properties of one object schema, and literals of one enum */
#define NX_JSON_MAX_WS 16
#define NX_JSON_MAX_PATTERNS 64 /* pattern automata (patterns and formats) of one schema */

typedef struct nx_json_path {
    const nx_json_schema *schema;     /* NULL: any object */
    uint8_t stack[NX_JSON_MAX_DEPTH]; /* open containers: 'o' object, 'a' array */
    int16_t node[NX_JSON_MAX_DEPTH];  /* each container's schema node (-1: unconstrained) */
    uint8_t next[NX_JSON_MAX_DEPTH];  /* object: the first property still allowed; array: items */
    int16_t vnode;                    /* the schema node of the value that starts next */
    bool integer;                     /* the number being read must be an integer */
    uint16_t cpos;                    /* key or enum literal: bytes matched so far */
    uint64_t cand;                    /* key: candidate properties; enum: candidate literals */
    uint8_t depth;
    uint8_t mode;   /* what the next byte may be (json_grammar.c) */
    uint8_t sub;    /* the step inside a string, number or literal */
    uint8_t aux;    /* literal: which; \u: hex digits left; UTF-8: continuation bytes left */
    uint8_t lo, hi; /* UTF-8: the range of the next continuation byte */
    uint8_t ws;     /* whitespace bytes in the current run */
    bool key;       /* the string being read is an object key */
    uint16_t u;     /* \u escape: the value so far */
    uint16_t chars; /* value string: code points so far (for minLength / maxLength) */
    uint16_t pst;   /* value string with a pattern: its automaton's state */
    bool neg;       /* integer: it has a minus sign */
    uint64_t num;   /* integer: its magnitude so far (saturating; for minimum / maximum); a bounded
                     * number: its integer part */
    uint32_t frac;  /* bounded number: the digits after the point, */
    uint8_t fk;     /* and how many */
    uint64_t uniq;  /* the innermost array under uniqueItems: the enum literals it holds */
} nx_json_path;

/* The readings of the output so far that can still become valid: one, except where a value
 * began that several anyOf / oneOf branches can start (two object branches, say); then each
 * branch is followed on its own path until the bytes rule it out, and a byte is allowed when
 * some path takes it (equal paths merge). At most NX_JSON_MAX_PATHS at once: past that the
 * later branches are not followed (what is generated still matches the schema). n == 0: dead.
 * Unused paths are zero, so states compare whole (the sampler's mask cache). */
#define NX_JSON_MAX_PATHS 8
typedef struct nx_json_state {
    uint8_t n;
    nx_json_path path[NX_JSON_MAX_PATHS];
} nx_json_state;

/* dst ← src, copying only the live paths (for the copies made per candidate byte or token; a
 * copy made this way is not zero past its paths, so it is not for comparing whole). */
static inline void nx_json_copy(nx_json_state *dst, const nx_json_state *src) {
    dst->n = src->n;
    if (src->n) dst->path[0] = src->path[0]; /* a fixed-size copy (inlined) for the usual one path */
    for (int i = 1; i < src->n; i++) dst->path[i] = src->path[i];
}

/* The state before any output (schema NULL: any JSON object). */
void nx_json_init(nx_json_state *s);
void nx_json_init_schema(nx_json_state *s, const nx_json_schema *schema);
/* The state before one value of schema node `node` alone (a property's value, read apart from
 * its object: tool-call arguments): whitespace, then the value; complete once it ends. */
void nx_json_init_value(nx_json_state *s, const nx_json_schema *schema, int node);
/* The root object's properties, in their listed order: how many, and property i's name (len
 * bytes, NUL-terminated), whether it is required and its value's node. */
int nx_json_schema_n_props(const nx_json_schema *S);
const char *nx_json_schema_prop(const nx_json_schema *S, int i, size_t *len, bool *required, int *node);
/* The pattern automaton (pattern or format, with the string's lengths) the schema compiled for
 * node (NULL: none). */
const struct nx_pattern *nx_json_schema_pattern(const nx_json_schema *S, int node);
/* Feeds one byte; false (and the state is dead) if no valid JSON object starts with the bytes fed. */
bool nx_json_step(nx_json_state *s, uint8_t c);
/* Feeds n bytes; false as soon as one is refused. */
bool nx_json_feed(nx_json_state *s, const uint8_t *b, size_t n);
/* The bytes fed so far are one complete JSON object. */
bool nx_json_complete(const nx_json_state *s);
/* The bytes fed so far are complete, or (nx_json_init_value) a number that may end here. */
bool nx_json_can_end(const nx_json_state *s);

/* A vocabulary's token bytes, for masking (nx_json_vocab in nextn.h). */
struct nx_json_vocab {
    int32_t n;           /* tokens */
    uint8_t **bytes;     /* [n] the token's bytes, or NULL when it is not text (special) */
    uint32_t *len;       /* [n] */
    uint8_t *end;        /* [n] 1 for the ids that end a generation */
};

/* allow[i] = 1 for the tokens of v that may follow state s (end tokens once it is complete;
 * if nothing else is possible, end tokens anyway); tokens past v->n get 0. */
void nx_json_allowed(const nx_json_vocab *v, const nx_json_state *s, int32_t n_tokens, uint8_t *allow);

#endif
