/* JSON mode: the recogniser (see json_grammar.h) and the vocabulary tables it masks with. */
#include "decode/json_grammar.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

enum {
    M_START,     /* before the top-level object: '{' */
    M_VALUE,     /* a value */
    M_OBJ_FIRST, /* after '{': a key or '}' */
    M_OBJ_KEY,   /* after ',' in an object: a key */
    M_COLON,     /* after a key */
    M_ARR_FIRST, /* after '[': a value or ']' */
    M_AFTER,     /* after a value: ',' or the container's close */
    M_STRING,
    M_NUMBER,
    M_LITERAL,
    M_DONE, /* the top-level object is closed */
    M_DEAD,
};

enum { S_PLAIN, S_ESC, S_HEX, S_UTF8 };                                    /* strings */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };       /* numbers */

static const char *const literals[3] = {"true", "false", "null"};

void nx_json_init(nx_json_state *s) {
    memset(s, 0, sizeof *s);
    s->mode = M_START;
}

bool nx_json_complete(const nx_json_state *s) { return s->mode == M_DONE; }

static bool dead(nx_json_state *s) {
    s->mode = M_DEAD;
    return false;
}

static bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static int hex_value(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool push(nx_json_state *s, uint8_t kind) {
    if (s->depth == NX_JSON_MAX_DEPTH) return dead(s);
    s->stack[s->depth++] = kind;
    s->mode = kind == 'o' ? M_OBJ_FIRST : M_ARR_FIRST;
    return true;
}

/* A value ends: back to its container, or done at the top. */
static void value_done(nx_json_state *s) { s->mode = s->depth == 0 ? M_DONE : M_AFTER; }

static bool close_container(nx_json_state *s, uint8_t kind) {
    if (s->depth == 0 || s->stack[s->depth - 1] != kind) return dead(s);
    s->depth--;
    value_done(s);
    return true;
}

/* The first byte of a value (whitespace already skipped). */
static bool value_start(nx_json_state *s, uint8_t c) {
    switch (c) {
    case '{': return push(s, 'o');
    case '[': return push(s, 'a');
    case '"':
        s->mode = M_STRING, s->sub = S_PLAIN, s->key = false;
        return true;
    case '-':
        s->mode = M_NUMBER, s->sub = N_MINUS;
        return true;
    case 't': case 'f': case 'n':
        s->mode = M_LITERAL, s->aux = c == 't' ? 0 : c == 'f' ? 1 : 2, s->sub = 1;
        return true;
    default:
        if (!is_digit(c)) return dead(s);
        s->mode = M_NUMBER, s->sub = c == '0' ? N_ZERO : N_INT;
        return true;
    }
}

static bool string_byte(nx_json_state *s, uint8_t c) {
    switch (s->sub) {
    case S_ESC:
        if (c == 'u') {
            s->sub = S_HEX, s->aux = 4, s->u = 0;
            return true;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0) return dead(s);
        s->sub = S_PLAIN;
        return true;
    case S_HEX: {
        const int h = hex_value(c);
        if (h < 0) return dead(s);
        s->u = (uint16_t)(s->u << 4 | (unsigned)h);
        /* no surrogates (D800-DFFF): decided by the first two digits */
        if (s->aux == 3 && (s->u & 0xF8u) == 0xD8u) return dead(s);
        if (--s->aux == 0) {
            if (s->u == 0) return dead(s);
            s->sub = S_PLAIN;
        }
        return true;
    }
    case S_UTF8:
        if (c < s->lo || c > s->hi) return dead(s);
        s->lo = 0x80, s->hi = 0xBF;
        if (--s->aux == 0) s->sub = S_PLAIN;
        return true;
    default:
        if (c == '"') {
            if (s->key) s->mode = M_COLON;
            else value_done(s);
            s->key = false;
            return true;
        }
        if (c == '\\') {
            s->sub = S_ESC;
            return true;
        }
        if (c < 0x20) return dead(s);
        if (c < 0x80) return true;
        /* UTF-8 lead bytes and the range of the byte after them (RFC 3629) */
        s->lo = 0x80, s->hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) s->aux = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            s->aux = 2;
            if (c == 0xE0) s->lo = 0xA0;
            if (c == 0xED) s->hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            s->aux = 3;
            if (c == 0xF0) s->lo = 0x90;
            if (c == 0xF4) s->hi = 0x8F;
        } else {
            return dead(s);
        }
        s->sub = S_UTF8;
        return true;
    }
}

/* A number's next byte; false with the state untouched when the byte ends the number instead
 * (the caller then checks that the number could end and hands the byte to its container). */
static bool number_continues(nx_json_state *s, uint8_t c) {
    switch (s->sub) {
    case N_MINUS:
        if (!is_digit(c)) return false;
        s->sub = c == '0' ? N_ZERO : N_INT;
        return true;
    case N_ZERO:
    case N_INT:
        if (s->sub == N_INT && is_digit(c)) return true;
        if (c == '.') s->sub = N_DOT;
        else if (c == 'e' || c == 'E') s->sub = N_E;
        else return false;
        return true;
    case N_DOT:
        if (!is_digit(c)) return false;
        s->sub = N_FRAC;
        return true;
    case N_FRAC:
        if (is_digit(c)) return true;
        if (c != 'e' && c != 'E') return false;
        s->sub = N_E;
        return true;
    case N_E:
        if (c == '+' || c == '-') s->sub = N_ESIGN;
        else if (is_digit(c)) s->sub = N_EXP;
        else return false;
        return true;
    case N_ESIGN:
        if (!is_digit(c)) return false;
        s->sub = N_EXP;
        return true;
    default: /* N_EXP */
        return is_digit(c);
    }
}

static bool number_can_end(const nx_json_state *s) {
    return s->sub == N_ZERO || s->sub == N_INT || s->sub == N_FRAC || s->sub == N_EXP;
}

bool nx_json_step(nx_json_state *s, uint8_t c) {
    switch (s->mode) {
    case M_STRING: return string_byte(s, c);
    case M_NUMBER:
        if (number_continues(s, c)) return true;
        if (!number_can_end(s)) return dead(s);
        s->mode = M_AFTER; /* the byte belongs to the container: fall through to it */
        break;
    case M_LITERAL: {
        const char *lit = literals[s->aux];
        if ((uint8_t)lit[s->sub] != c) return dead(s);
        if (lit[++s->sub] == 0) value_done(s);
        return true;
    }
    case M_START: return c == '{' ? push(s, 'o') : dead(s);
    case M_DONE:
    case M_DEAD: return dead(s);
    default: break;
    }
    if (is_ws(c)) {
        if (++s->ws > NX_JSON_MAX_WS) return dead(s);
        return true;
    }
    s->ws = 0;
    switch (s->mode) {
    case M_VALUE: return value_start(s, c);
    case M_OBJ_FIRST:
        if (c == '}') return close_container(s, 'o');
        /* fall through */
    case M_OBJ_KEY:
        if (c != '"') return dead(s);
        s->mode = M_STRING, s->sub = S_PLAIN, s->key = true;
        return true;
    case M_COLON:
        if (c != ':') return dead(s);
        s->mode = M_VALUE;
        return true;
    case M_ARR_FIRST:
        if (c == ']') return close_container(s, 'a');
        return value_start(s, c);
    default: /* M_AFTER */
        if (c == ',') {
            s->mode = s->stack[s->depth - 1] == 'o' ? M_OBJ_KEY : M_VALUE;
            return true;
        }
        if (c == '}') return close_container(s, 'o');
        if (c == ']') return close_container(s, 'a');
        return dead(s);
    }
}

bool nx_json_feed(nx_json_state *s, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!nx_json_step(s, b[i])) return false;
    return true;
}

void nx_json_allowed(const nx_json_vocab *v, const nx_json_state *s, int32_t n_tokens, uint8_t *allow) {
    memset(allow, 0, (size_t)n_tokens);
    const int32_t n = v->n < n_tokens ? v->n : n_tokens;
    bool any = false;
    if (nx_json_complete(s)) {
        for (int32_t i = 0; i < n; i++) allow[i] = v->end[i];
        return;
    }
    /* which first bytes can follow at all: most tokens are refused on their first byte */
    uint8_t first[256];
    for (int c = 0; c < 256; c++) {
        nx_json_state t = *s;
        first[c] = nx_json_step(&t, (uint8_t)c);
    }
    for (int32_t i = 0; i < n; i++) {
        if (!v->bytes[i] || v->len[i] == 0 || !first[v->bytes[i][0]]) continue;
        nx_json_state t = *s;
        if (nx_json_feed(&t, v->bytes[i], v->len[i])) allow[i] = 1, any = true;
    }
    if (!any) /* a vocabulary without the bytes needed: let the generation end */
        for (int32_t i = 0; i < n; i++) allow[i] = v->end[i];
}

/* ---------------------------------------------------------------- vocabularies */

void nx_json_vocab_free(nx_json_vocab *v) {
    if (!v) return;
    for (int32_t i = 0; v->bytes && i < v->n; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->len);
    free(v->end);
    free(v);
}

static nx_status vocab_alloc(int32_t n, const int32_t *end_ids, size_t n_end, nx_json_vocab **out, nx_error *err) {
    *out = NULL;
    if (n <= 0) return nx_fail(err, NX_E_ARG, "JSON mode: an empty vocabulary");
    nx_json_vocab *v = calloc(1, sizeof *v);
    if (!v) return nx_fail(err, NX_E_NOMEM, "out of memory");
    v->n = n;
    v->bytes = calloc((size_t)n, sizeof *v->bytes);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->end = calloc((size_t)n, 1);
    if (!v->bytes || !v->len || !v->end) {
        nx_json_vocab_free(v);
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n_end; i++) {
        if (end_ids[i] < 0 || end_ids[i] >= n) {
            nx_json_vocab_free(v);
            return nx_fail(err, NX_E_ARG, "JSON mode: end token %d is out of range [0, %d)", (int)end_ids[i], (int)n);
        }
        v->end[end_ids[i]] = 1;
    }
    *out = v;
    return NX_OK;
}

nx_status nx_json_vocab_from_bytes(const char *const *tokens, const size_t *lens, int32_t n, const int32_t *end_ids,
                                   size_t n_end, nx_json_vocab **out, nx_error *err) {
    nx_json_vocab *v;
    nx_status st = vocab_alloc(n, end_ids, n_end, &v, err);
    if (st != NX_OK) return st;
    for (int32_t i = 0; i < n; i++) {
        if (!tokens[i] || v->end[i]) continue;
        if (!(v->bytes[i] = malloc(lens[i] ? lens[i] : 1))) {
            nx_json_vocab_free(v);
            return nx_fail(err, NX_E_NOMEM, "out of memory");
        }
        memcpy(v->bytes[i], tokens[i], lens[i]);
        v->len[i] = (uint32_t)lens[i];
    }
    *out = v;
    return NX_OK;
}

nx_status nx_json_vocab_for_model(const nx_model *m, nx_json_vocab **out, nx_error *err) {
    *out = NULL;
    const nx_tokenizer *tok = nx_model_tokenizer(m);
    if (!tok) return nx_fail(err, NX_E_ARG, "JSON mode needs the model's tokenizer.json");
    const int32_t nv = nx_tokenizer_vocab_size(tok);
    int32_t *ends = malloc(sizeof(int32_t) * (size_t)(nv > 0 ? nv : 1));
    if (!ends) return nx_fail(err, NX_E_NOMEM, "out of memory");
    size_t n_end = 0;
    for (int32_t id = 0; id < nv; id++)
        if (nx_model_is_eos(m, id)) ends[n_end++] = id;
    nx_status st = nx_json_vocab_new(tok, ends, n_end, out, err);
    free(ends);
    return st;
}

nx_status nx_json_vocab_new(const nx_tokenizer *tok, const int32_t *end_ids, size_t n_end, nx_json_vocab **out,
                            nx_error *err) {
    nx_json_vocab *v;
    nx_status st = vocab_alloc(nx_tokenizer_vocab_size(tok), end_ids, n_end, &v, err);
    if (st != NX_OK) return st;
    for (int32_t i = 0; i < v->n; i++) {
        if (v->end[i] || nx_tokenizer_is_special(tok, i)) continue;
        size_t len = 0;
        if ((st = nx_tokenizer_token_bytes(tok, i, &v->bytes[i], &len, err)) != NX_OK) {
            nx_json_vocab_free(v);
            return st;
        }
        v->len[i] = (uint32_t)len;
    }
    *out = v;
    return NX_OK;
}
