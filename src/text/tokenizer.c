/* The Hugging Face tokenizer.json byte-level BPE tokenizer (Hy3, Qwen3, DeepSeek-V3 style).
 * Loading treats the file as untrusted; encoding runs added-token split -> normalizer ->
 * pre-tokenizer (PCRE2 regexes) -> BPE merges; decoding and the streaming detokenizer map the
 * byte-level alphabet back to bytes and only ever hand out well-formed UTF-8. */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "nextn.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/error.h"
#include "base/file.h"
#include "base/strbuf.h"
#include "text/tokenizer_internal.h"
#include "text/unicode.h"

/* Ids above this are refused: real vocabularies stay below 300k, and a hostile file must not make
 * us allocate gigabytes for a single token id. */
#define TOK_MAX_ID (1 << 22)
#define TOK_MAX_FILE ((size_t)1 << 30)
#define TOK_MAX_NEST 16 /* Sequence inside Sequence ... */
/* PCRE2 per-match budgets: bounded work for hostile patterns from the file. */
#define TOK_MATCH_LIMIT 10000000u
#define TOK_HEAP_LIMIT_KB 65536u

/* ================================================================ small containers */

/* Grows a malloc'd array of elem-sized items so that it holds at least need items. */
static bool array_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2) return false;
        c *= 2;
    }
    if (c > SIZE_MAX / elem) return false;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

typedef struct ivec {
    int32_t *p;
    size_t n, cap;
} ivec;

static bool ivec_push(ivec *v, int32_t x) {
    if (!array_grow((void **)&v->p, &v->cap, v->n + 1, sizeof *v->p)) return false;
    v->p[v->n++] = x;
    return true;
}

/* A chunked arena holding every token string for the tokenizer's lifetime (one free). */
typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    char data[];
} arena_chunk;

static char *arena_copy(arena_chunk **head, const char *s, size_t n) {
    if (n > SIZE_MAX / 2) return NULL;
    arena_chunk *c = *head;
    if (!c || c->cap - c->used < n + 1) {
        size_t cap = n + 1 > (1u << 20) ? n + 1 : (1u << 20);
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = *head;
        c->used = 0;
        c->cap = cap;
        *head = c;
    }
    char *d = c->data + c->used;
    if (n) memcpy(d, s, n);
    d[n] = '\0';
    c->used += n + 1;
    return d;
}

static void arena_free(arena_chunk *c) {
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
}

/* ================================================================ hash tables */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* String -> int32 map, open addressing; sized once for a known number of keys. */
typedef struct smap_slot {
    const char *key; /* NULL = empty */
    uint32_t len;
    int32_t val;
} smap_slot;

typedef struct smap {
    smap_slot *slots;
    size_t mask;
} smap;

static bool smap_init(smap *m, size_t n_keys) {
    size_t cap = 16;
    while (cap < n_keys * 2 + 1) {
        if (cap > SIZE_MAX / 4) return false;
        cap *= 2;
    }
    m->slots = calloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    return m->slots != NULL;
}

static int32_t smap_get(const smap *m, const char *k, size_t n) {
    if (!m->slots || n > UINT32_MAX) return -1;
    for (size_t i = hash_bytes(k, n) & m->mask;; i = (i + 1) & m->mask) {
        const smap_slot *s = &m->slots[i];
        if (!s->key) return -1;
        if (s->len == n && memcmp(s->key, k, n) == 0) return s->val;
    }
}

/* Inserts or overwrites; the key must outlive the map. The caller never exceeds n_keys. */
static void smap_set(smap *m, const char *k, size_t n, int32_t v) {
    for (size_t i = hash_bytes(k, n) & m->mask;; i = (i + 1) & m->mask) {
        smap_slot *s = &m->slots[i];
        if (!s->key) {
            s->key = k;
            s->len = (uint32_t)n;
            s->val = v;
            return;
        }
        if (s->len == n && memcmp(s->key, k, n) == 0) {
            s->val = v;
            return;
        }
    }
}

/* (left id, right id) -> (rank, merged id). */
typedef struct mmap_slot {
    uint64_t key; /* UINT64_MAX = empty; ids are < 2^22 so no real key collides with it */
    int32_t rank, id;
} mmap_slot;

typedef struct mmap {
    mmap_slot *slots;
    size_t mask;
} mmap;

static bool mmap_init(mmap *m, size_t n_keys) {
    size_t cap = 16;
    while (cap < n_keys * 2 + 1) {
        if (cap > SIZE_MAX / 4) return false;
        cap *= 2;
    }
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return false;
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    return true;
}

static const mmap_slot *mmap_get(const mmap *m, int32_t a, int32_t b) {
    if (!m->slots) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = hash_u64(key) & m->mask;; i = (i + 1) & m->mask) {
        const mmap_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}

static void mmap_set(mmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = hash_u64(key) & m->mask;; i = (i + 1) & m->mask) {
        mmap_slot *s = &m->slots[i];
        if (s->key == key || s->key == UINT64_MAX) {
            s->key = key;
            s->rank = rank;
            s->id = id;
            return;
        }
    }
}

/* ================================================================ regex patterns */

/* A Split/Replace pattern: a PCRE2 regex translated from the Oniguruma syntax HF uses, or a
 * literal string. */
typedef struct tok_pattern {
    pcre2_code *re;
    char *lit;
    size_t lit_len;
} tok_pattern;

/* Oniguruma's Unicode \w (Alphabetic, marks, decimal digits, connector punctuation and a few
 * Latin-1 quirks), spelled for PCRE2. */
#define ONIG_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"

/* Rewrites the constructs whose meaning differs between Oniguruma and PCRE2: \s is exactly
 * White_Space in Oniguruma (PCRE2 adds U+180E), \h is a hex digit, \w follows Oniguruma's word
 * set. Nested character classes have no PCRE2 form and are refused. */
static nx_status regex_translate(const char *src, size_t n, nx_strbuf *out, const char *where,
                                 nx_error *err) {
    bool in_class = false;
    size_t class_start = 0;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        bool ok = true;
        if (c == '\\' && i + 1 < n) {
            char e = src[++i];
            const char *rep = NULL;
            switch (e) {
            case 's': rep = "\\p{White_Space}"; break;
            case 'S': rep = "\\P{White_Space}"; break;
            case 'h': rep = in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]"; break;
            case 'H': rep = in_class ? NULL : "[^0-9A-Fa-f]"; break;
            case 'w': rep = in_class ? ONIG_WORD : "[" ONIG_WORD "]"; break;
            case 'W': rep = in_class ? NULL : "[^" ONIG_WORD "]"; break;
            default: break;
            }
            if (rep) ok = nx_strbuf_append(out, rep, strlen(rep)) == NX_OK;
            else ok = nx_strbuf_append(out, "\\", 1) == NX_OK &&
                      nx_strbuf_append(out, &e, 1) == NX_OK;
        } else if (c == '[' && !in_class) {
            in_class = true;
            ok = nx_strbuf_append(out, &c, 1) == NX_OK;
            class_start = i + 1;
            if (class_start < n && src[class_start] == '^') {
                ok = ok && nx_strbuf_append(out, "^", 1) == NX_OK;
                i++;
                class_start++;
            }
            /* A ']' right after '[' or '[^' is a literal. */
            if (class_start < n && src[class_start] == ']') {
                ok = ok && nx_strbuf_append(out, "\\]", 2) == NX_OK;
                i++;
            }
        } else if (c == '[' && in_class) {
            if (i + 1 < n && src[i + 1] == ':') { /* POSIX bracket: copy through to ":]" */
                const char *end = NULL;
                for (size_t j = i + 2; j + 1 < n; j++)
                    if (src[j] == ':' && src[j + 1] == ']') {
                        end = src + j + 2;
                        break;
                    }
                if (!end)
                    return nx_fail(err, NX_E_FORMAT, "%s: unterminated POSIX class in regex",
                                   where);
                size_t len = (size_t)(end - (src + i));
                ok = nx_strbuf_append(out, src + i, len) == NX_OK;
                i += len - 1;
            } else {
                return nx_fail(err, NX_E_UNSUPPORTED,
                               "%s: nested character classes are not supported in regex", where);
            }
        } else if (c == '&' && in_class && i + 1 < n && src[i + 1] == '&') {
            return nx_fail(err, NX_E_UNSUPPORTED,
                           "%s: character class intersection (&&) is not supported in regex",
                           where);
        } else {
            if (c == ']' && in_class) in_class = false;
            ok = nx_strbuf_append(out, &c, 1) == NX_OK;
        }
        if (!ok) return nx_fail(err, NX_E_NOMEM, "%s: out of memory", where);
    }
    if (!out->data && nx_strbuf_append(out, "", 0) != NX_OK)
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    return NX_OK;
}

static nx_status pattern_compile_regex(tok_pattern *p, const char *src, size_t n,
                                       const char *where, nx_error *err) {
    nx_strbuf tr = {0};
    nx_status st = regex_translate(src, n, &tr, where, err);
    if (st != NX_OK) {
        nx_strbuf_free(&tr);
        return st;
    }
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        nx_strbuf_free(&tr);
        return nx_fail(err, NX_E_NOMEM, "%s: out of memory", where);
    }
    /* Oniguruma's Ruby syntax: ^ and $ are line anchors, and only "\n" ends a line. */
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    pcre2_set_parens_nest_limit(cc, 250);
    int code = 0;
    PCRE2_SIZE off = 0;
    p->re = pcre2_compile((PCRE2_SPTR)tr.data, tr.len,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NEVER_BACKSLASH_C, &code,
                          &off, cc);
    pcre2_compile_context_free(cc);
    nx_strbuf_free(&tr);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return nx_fail(err, NX_E_FORMAT, "%s: bad regex at offset %zu: %s", where, (size_t)off,
                       (const char *)msg);
    }
    /* JIT is an optimisation only; the interpreter is used when it is unavailable. */
    (void)pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE);
    return NX_OK;
}

/* Parses {"Regex": "..."} or {"String": "..."}. */
static nx_status pattern_from_json(const json_t *j, const char *where, tok_pattern *p,
                                   nx_error *err) {
    if (!json_is_object(j))
        return nx_fail(err, NX_E_FORMAT, "%s: expected an object with \"Regex\" or \"String\"",
                       where);
    const json_t *re = json_object_get(j, "Regex");
    const json_t *lit = json_object_get(j, "String");
    if (json_is_string(re))
        return pattern_compile_regex(p, json_string_value(re), json_string_length(re), where, err);
    if (json_is_string(lit)) {
        size_t n = json_string_length(lit);
        if (n == 0) return nx_fail(err, NX_E_FORMAT, "%s.String: empty pattern", where);
        p->lit = malloc(n);
        if (!p->lit) return nx_fail(err, NX_E_NOMEM, "%s: out of memory", where);
        memcpy(p->lit, json_string_value(lit), n);
        p->lit_len = n;
        return NX_OK;
    }
    return nx_fail(err, NX_E_FORMAT, "%s: expected a string \"Regex\" or \"String\"", where);
}

static void pattern_free(tok_pattern *p) {
    pcre2_code_free(p->re);
    free(p->lit);
    memset(p, 0, sizeof *p);
}

/* Per-call regex state: encode may run on many threads over one const tokenizer. */
typedef struct match_state {
    pcre2_match_data *md;
    pcre2_match_context *mc;
} match_state;

/* Finds the next non-empty match in s[0..n) at or after `from` (lookbehind sees s[0..from)).
 * Returns 1 and the match bounds, 0 when there is none, or -1 when PCRE2 gives up. Empty
 * matches are stepped over one character at a time, as Oniguruma and JS iterate. */
static int pattern_find(const tok_pattern *p, match_state *ms, const char *s, size_t n,
                        size_t from, size_t *ms_out, size_t *me_out) {
    if (p->lit) {
        if (from > n || n - from < p->lit_len) return 0;
        const char *hit = memmem(s + from, n - from, p->lit, p->lit_len);
        if (!hit) return 0;
        *ms_out = (size_t)(hit - s);
        *me_out = *ms_out + p->lit_len;
        return 1;
    }
    while (from <= n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, ms->md, ms->mc);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                             ms->md, ms->mc);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc < 0) return -1;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ms->md);
        if (ov[1] > ov[0] && ov[1] <= n) {
            *ms_out = ov[0];
            *me_out = ov[1];
            return 1;
        }
        if (ov[0] >= n) return 0;
        /* Empty match: resume after the character at the match position. */
        size_t k = ov[0] + 1;
        while (k < n && ((unsigned char)s[k] & 0xC0) == 0x80) k++;
        from = k;
    }
    return 0;
}

/* ================================================================ tokenizer data */

enum norm_kind { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWER, NORM_PREPEND, NORM_REPLACE,
                 NORM_STRIP };

typedef struct norm_step {
    enum norm_kind kind;
    char *str; /* Prepend text / Replace content */
    size_t str_len;
    tok_pattern pat;
    bool left, right; /* Strip */
} norm_step;

enum pre_kind { PRE_SPLIT, PRE_BYTELEVEL };

enum split_behavior { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT,
                      SPLIT_CONTIGUOUS };

typedef struct pre_step {
    enum pre_kind kind;
    tok_pattern pat; /* Split pattern, or the GPT-2 regex of ByteLevel(use_regex) */
    enum split_behavior behavior;
    bool invert;
    bool add_prefix_space;
    bool use_regex;
} pre_step;

enum { TOKF_PRESENT = 1, TOKF_SPECIAL = 2, TOKF_ADDED = 4 };

typedef struct tok_entry {
    const char *str; /* arena */
    uint32_t len;
    uint8_t flags;
} tok_entry;

typedef struct added_token {
    const char *content; /* arena; normalized form for normalized tokens */
    size_t len;
    int32_t id;
    bool special, single_word, lstrip, rstrip, normalized;
} added_token;

typedef struct trie_node {
    int32_t child, sibling, added; /* added: index into added[], -1 if no token ends here */
    unsigned char byte;
} trie_node;

typedef struct trie {
    trie_node *nodes;
    size_t n, cap;
    uint8_t first[32]; /* bitmap of first bytes, to skip most positions quickly */
} trie;

enum dec_kind { DEC_NONE, DEC_BYTELEVEL };

struct nx_tokenizer {
    arena_chunk *arena;
    tok_entry *tokens; /* by id; holes have flags 0 */
    int32_t n_tokens;  /* max id + 1 */
    smap vocab;        /* model vocabulary */
    smap added_map;    /* added token content (as written) -> id */
    added_token *added;
    size_t n_added;
    trie trie_raw, trie_norm; /* matched before / after normalization */
    mmap merges;
    int32_t unk_id;
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_ids[256]; /* "<0xXX>" token ids for byte_fallback, -1 if absent */
    norm_step *norm;
    size_t n_norm, norm_cap;
    bool has_normalizer;
    pre_step *pre;
    size_t n_pre, pre_cap;
    enum dec_kind decoder;
    int16_t byte_of_cp[324]; /* byte-level alphabet: code point -> byte, -1 if not in it */
    unsigned char cp_utf8[256][2]; /* byte -> its alphabet character, UTF-8 (1 or 2 bytes) */
    uint8_t cp_utf8_len[256];
    pcre2_match_context *mctx;
};

/* The GPT-2 bytes_to_unicode table: printable Latin-1 bytes map to themselves, the other 68
 * bytes to U+0100.. in byte order, so every byte has a visible one-character stand-in. */
static void bytelevel_init(nx_tokenizer *t) {
    for (size_t i = 0; i < 324; i++) t->byte_of_cp[i] = -1;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = keep ? (uint32_t)b : next++;
        t->byte_of_cp[cp] = (int16_t)b;
        char u[4];
        size_t k = nx_utf8_put(cp, u);
        memcpy(t->cp_utf8[b], u, k);
        t->cp_utf8_len[b] = (uint8_t)k;
    }
}

/* ================================================================ loading helpers */

static nx_status read_file(const char *path, char **out, size_t *n, nx_error *err) {
    return nx_file_read_all(path, TOK_MAX_FILE, out, n, err);
}

static bool json_opt_bool(const json_t *obj, const char *key, bool def, bool *ok) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return def;
    if (!json_is_boolean(v)) {
        *ok = false;
        return def;
    }
    return json_is_true(v);
}

/* A type string of a component object, or NULL. */
static const char *component_type(const json_t *obj) {
    const json_t *t = json_object_get(obj, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

static nx_status parse_normalizer(nx_tokenizer *t, const json_t *j, const char *where, int depth,
                                  nx_error *err) {
    if (depth > TOK_MAX_NEST) return nx_fail(err, NX_E_FORMAT, "%s: nested too deeply", where);
    if (!json_is_object(j)) return nx_fail(err, NX_E_FORMAT, "%s: expected an object", where);
    const char *type = component_type(j);
    if (!type) return nx_fail(err, NX_E_FORMAT, "%s.type: missing or not a string", where);
    if (strcmp(type, "Sequence") == 0) {
        const json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr))
            return nx_fail(err, NX_E_FORMAT, "%s.normalizers: expected an array", where);
        size_t i;
        const json_t *v;
        json_array_foreach(arr, i, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
            if (json_is_null(v)) continue;
            nx_status st = parse_normalizer(t, v, sub, depth + 1, err);
            if (st != NX_OK) return st;
        }
        return NX_OK;
    }
    if (!array_grow((void **)&t->norm, &t->norm_cap, t->n_norm + 1, sizeof *t->norm))
        return nx_fail(err, NX_E_NOMEM, "%s: out of memory", where);
    norm_step *s = &t->norm[t->n_norm];
    memset(s, 0, sizeof *s);
    bool ok = true;
    if (strcmp(type, "NFC") == 0) s->kind = NORM_NFC;
    else if (strcmp(type, "NFD") == 0) s->kind = NORM_NFD;
    else if (strcmp(type, "NFKC") == 0) s->kind = NORM_NFKC;
    else if (strcmp(type, "NFKD") == 0) s->kind = NORM_NFKD;
    else if (strcmp(type, "Lowercase") == 0) s->kind = NORM_LOWER;
    else if (strcmp(type, "Strip") == 0) {
        s->kind = NORM_STRIP;
        s->left = json_opt_bool(j, "strip_left", true, &ok);
        s->right = json_opt_bool(j, "strip_right", true, &ok);
        if (!ok) return nx_fail(err, NX_E_FORMAT, "%s: strip_left/strip_right: not a bool", where);
    } else if (strcmp(type, "Prepend") == 0 || strcmp(type, "Replace") == 0) {
        bool prepend = type[0] == 'P';
        const char *key = prepend ? "prepend" : "content";
        const json_t *v = json_object_get(j, key);
        if (!json_is_string(v))
            return nx_fail(err, NX_E_FORMAT, "%s.%s: missing or not a string", where, key);
        s->kind = prepend ? NORM_PREPEND : NORM_REPLACE;
        s->str_len = json_string_length(v);
        s->str = malloc(s->str_len + 1);
        if (!s->str) return nx_fail(err, NX_E_NOMEM, "%s: out of memory", where);
        memcpy(s->str, json_string_value(v), s->str_len + 1);
        t->n_norm++; /* owned from here on, so tokenizer_free releases it on failure */
        if (!prepend) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.pattern", where);
            return pattern_from_json(json_object_get(j, "pattern"), sub, &s->pat, err);
        }
        return NX_OK;
    } else {
        return nx_fail(err, NX_E_UNSUPPORTED, "%s.type: normalizer \"%s\" is not supported", where,
                       type);
    }
    t->n_norm++;
    return NX_OK;
}

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static nx_status parse_pre_tokenizer(nx_tokenizer *t, const json_t *j, const char *where,
                                     int depth, nx_error *err) {
    if (depth > TOK_MAX_NEST) return nx_fail(err, NX_E_FORMAT, "%s: nested too deeply", where);
    if (!json_is_object(j)) return nx_fail(err, NX_E_FORMAT, "%s: expected an object", where);
    const char *type = component_type(j);
    if (!type) return nx_fail(err, NX_E_FORMAT, "%s.type: missing or not a string", where);
    if (strcmp(type, "Sequence") == 0) {
        const json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr))
            return nx_fail(err, NX_E_FORMAT, "%s.pretokenizers: expected an array", where);
        size_t i;
        const json_t *v;
        json_array_foreach(arr, i, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", where, i);
            if (json_is_null(v)) continue;
            nx_status st = parse_pre_tokenizer(t, v, sub, depth + 1, err);
            if (st != NX_OK) return st;
        }
        return NX_OK;
    }
    if (!array_grow((void **)&t->pre, &t->pre_cap, t->n_pre + 1, sizeof *t->pre))
        return nx_fail(err, NX_E_NOMEM, "%s: out of memory", where);
    pre_step *s = &t->pre[t->n_pre];
    memset(s, 0, sizeof *s);
    bool ok = true;
    char sub[256];
    if (strcmp(type, "Split") == 0) {
        const json_t *b = json_object_get(j, "behavior");
        const char *bs = json_is_string(b) ? json_string_value(b) : NULL;
        if (!bs) return nx_fail(err, NX_E_FORMAT, "%s.behavior: missing or not a string", where);
        if (strcmp(bs, "Removed") == 0) s->behavior = SPLIT_REMOVED;
        else if (strcmp(bs, "Isolated") == 0) s->behavior = SPLIT_ISOLATED;
        else if (strcmp(bs, "MergedWithPrevious") == 0) s->behavior = SPLIT_MERGED_PREV;
        else if (strcmp(bs, "MergedWithNext") == 0) s->behavior = SPLIT_MERGED_NEXT;
        else if (strcmp(bs, "Contiguous") == 0) s->behavior = SPLIT_CONTIGUOUS;
        else return nx_fail(err, NX_E_FORMAT, "%s.behavior: unknown value \"%s\"", where, bs);
        s->invert = json_opt_bool(j, "invert", false, &ok);
        if (!ok) return nx_fail(err, NX_E_FORMAT, "%s.invert: not a bool", where);
        s->kind = PRE_SPLIT;
        t->n_pre++;
        snprintf(sub, sizeof sub, "%s.pattern", where);
        return pattern_from_json(json_object_get(j, "pattern"), sub, &s->pat, err);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        s->kind = PRE_BYTELEVEL;
        s->add_prefix_space = json_opt_bool(j, "add_prefix_space", true, &ok);
        s->use_regex = json_opt_bool(j, "use_regex", true, &ok);
        if (!ok)
            return nx_fail(err, NX_E_FORMAT, "%s: add_prefix_space/use_regex: not a bool", where);
        t->n_pre++;
        if (!s->use_regex) return NX_OK;
        s->behavior = SPLIT_ISOLATED;
        snprintf(sub, sizeof sub, "%s (GPT-2 regex)", where);
        return pattern_compile_regex(&s->pat, GPT2_REGEX, sizeof GPT2_REGEX - 1, sub, err);
    }
    if (strcmp(type, "Digits") == 0) {
        /* HF splits on char::is_numeric: each digit alone, or runs merged (Contiguous). */
        bool individual = json_opt_bool(j, "individual_digits", false, &ok);
        if (!ok) return nx_fail(err, NX_E_FORMAT, "%s.individual_digits: not a bool", where);
        s->kind = PRE_SPLIT;
        s->behavior = SPLIT_ISOLATED;
        t->n_pre++;
        const char *re = individual ? "\\p{N}" : "\\p{N}+";
        return pattern_compile_regex(&s->pat, re, strlen(re), where, err);
    }
    return nx_fail(err, NX_E_UNSUPPORTED, "%s.type: pre-tokenizer \"%s\" is not supported", where,
                   type);
}

static nx_status parse_decoder(nx_tokenizer *t, const json_t *j, const char *where, int depth,
                               nx_error *err) {
    if (depth > TOK_MAX_NEST) return nx_fail(err, NX_E_FORMAT, "%s: nested too deeply", where);
    if (!json_is_object(j)) return nx_fail(err, NX_E_FORMAT, "%s: expected an object", where);
    const char *type = component_type(j);
    if (!type) return nx_fail(err, NX_E_FORMAT, "%s.type: missing or not a string", where);
    if (strcmp(type, "ByteLevel") == 0) {
        t->decoder = DEC_BYTELEVEL;
        return NX_OK;
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr))
            return nx_fail(err, NX_E_FORMAT, "%s.decoders: expected an array", where);
        size_t i;
        const json_t *v;
        json_array_foreach(arr, i, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", where, i);
            if (json_is_null(v)) continue;
            nx_status st = parse_decoder(t, v, sub, depth + 1, err);
            if (st != NX_OK) return st;
        }
        return NX_OK;
    }
    return nx_fail(err, NX_E_UNSUPPORTED, "%s.type: decoder \"%s\" is not supported", where, type);
}

static bool trie_add(trie *tr, const char *s, size_t n, int32_t added) {
    if (tr->n == 0) {
        if (!array_grow((void **)&tr->nodes, &tr->cap, 1, sizeof *tr->nodes)) return false;
        tr->nodes[0] = (trie_node){-1, -1, -1, 0};
        tr->n = 1;
    }
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t c = tr->nodes[node].child;
        while (c >= 0 && tr->nodes[c].byte != b) c = tr->nodes[c].sibling;
        if (c < 0) {
            if (tr->n >= INT32_MAX ||
                !array_grow((void **)&tr->nodes, &tr->cap, tr->n + 1, sizeof *tr->nodes))
                return false;
            c = (int32_t)tr->n++;
            tr->nodes[c] = (trie_node){-1, tr->nodes[node].child, -1, b};
            tr->nodes[node].child = c;
        }
        node = c;
    }
    tr->nodes[node].added = added;
    tr->first[(unsigned char)s[0] >> 3] |= (uint8_t)(1u << ((unsigned char)s[0] & 7));
    return true;
}

/* Applies the normalizer chain; the result is always well-formed UTF-8. */
static nx_status normalize_text(const nx_tokenizer *t, match_state *ms, const char *s, size_t n,
                                nx_strbuf *out, nx_error *err);

static nx_status parse_model(nx_tokenizer *t, const json_t *model, nx_error *err) {
    if (!json_is_object(model)) return nx_fail(err, NX_E_FORMAT, "model: missing or not an object");
    const char *type = component_type(model);
    if (type && strcmp(type, "BPE") != 0)
        return nx_fail(err, NX_E_UNSUPPORTED, "model.type: \"%s\" is not supported (only BPE)", type);
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab)) return nx_fail(err, NX_E_FORMAT, "model.vocab: missing or not an object");
    if (!json_is_array(merges)) return nx_fail(err, NX_E_FORMAT, "model.merges: missing or not an array");
    const json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) &&
        !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return nx_fail(err, NX_E_UNSUPPORTED, "model.dropout: BPE dropout is not supported");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *v = json_object_get(model, affixes[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return nx_fail(err, NX_E_UNSUPPORTED, "model.%s: only null or \"\" is supported",
                           affixes[i]);
    }
    bool ok = true;
    t->byte_fallback = json_opt_bool(model, "byte_fallback", false, &ok);
    t->fuse_unk = json_opt_bool(model, "fuse_unk", false, &ok);
    t->ignore_merges = json_opt_bool(model, "ignore_merges", false, &ok);
    if (!ok)
        return nx_fail(err, NX_E_FORMAT,
                       "model: byte_fallback/fuse_unk/ignore_merges: expected a bool");

    /* vocab: ids first, so that added tokens may extend the table */
    size_t nv = json_object_size(vocab);
    if (nv > TOK_MAX_ID) return nx_fail(err, NX_E_FORMAT, "model.vocab: too many tokens (%zu)", nv);
    if (!smap_init(&t->vocab, nv)) return nx_fail(err, NX_E_NOMEM, "model.vocab: out of memory");
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= TOK_MAX_ID)
            return nx_fail(err, NX_E_FORMAT,
                           "model.vocab: token \"%.64s\": id missing or out of range [0, %d)", key,
                           TOK_MAX_ID);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    t->n_tokens = (int32_t)(max_id + 1);
    return NX_OK;
}

/* Second pass over the vocabulary once the id table has its final size. */
static nx_status fill_vocab(nx_tokenizer *t, const json_t *vocab, nx_error *err) {
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, val) {
        if (key_len > UINT32_MAX) return nx_fail(err, NX_E_FORMAT, "model.vocab: token too long");
        int32_t id = (int32_t)json_integer_value(val);
        if (t->tokens[id].flags & TOKF_PRESENT) /* two strings, one id: decoding could not tell them apart */
            return nx_fail(err, NX_E_FORMAT, "model.vocab: tokens \"%.64s\" and \"%.64s\" share id %d",
                           t->tokens[id].str, key, id);
        const char *s = arena_copy(&t->arena, key, key_len);
        if (!s) return nx_fail(err, NX_E_NOMEM, "model.vocab: out of memory");
        smap_set(&t->vocab, s, key_len, id);
        t->tokens[id] = (tok_entry){s, (uint32_t)key_len, TOKF_PRESENT};
    }
    return NX_OK;
}

static nx_status parse_merges(nx_tokenizer *t, const json_t *merges, nx_error *err) {
    size_t nm = json_array_size(merges);
    if (nm >= INT32_MAX) return nx_fail(err, NX_E_FORMAT, "model.merges: too many merges");
    if (!mmap_init(&t->merges, nm)) return nx_fail(err, NX_E_NOMEM, "model.merges: out of memory");
    nx_strbuf cat = {0};
    nx_status st = NX_OK;
    size_t i;
    const json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t na, nb;
        if (json_is_string(m)) {
            /* "a b": exactly one space, as HF requires */
            const char *s = json_string_value(m);
            size_t n = json_string_length(m);
            const char *sp = memchr(s, ' ', n);
            if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1)) {
                st = nx_fail(err, NX_E_FORMAT, "model.merges[%zu]: expected \"left right\"", i);
                goto done;
            }
            a = s, na = (size_t)(sp - s);
            b = sp + 1, nb = n - na - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            na = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            nb = json_string_length(json_array_get(m, 1));
        } else {
            st = nx_fail(err, NX_E_FORMAT,
                         "model.merges[%zu]: expected a string or a pair of strings", i);
            goto done;
        }
        int32_t ia = smap_get(&t->vocab, a, na), ib = smap_get(&t->vocab, b, nb);
        cat.len = 0;
        if (nx_strbuf_append(&cat, a, na) != NX_OK || nx_strbuf_append(&cat, b, nb) != NX_OK) {
            st = nx_fail(err, NX_E_NOMEM, "model.merges: out of memory");
            goto done;
        }
        int32_t ic = smap_get(&t->vocab, cat.data, cat.len);
        if (ia < 0 || ib < 0 || ic < 0) {
            st = nx_fail(err, NX_E_FORMAT, "model.merges[%zu]: token \"%.64s\" not in model.vocab",
                         i, ia < 0 ? a : ib < 0 ? b : cat.data);
            goto done;
        }
        mmap_set(&t->merges, ia, ib, (int32_t)i, ic);
    }
done:
    nx_strbuf_free(&cat);
    return st;
}

static nx_status parse_added(nx_tokenizer *t, const json_t *arr, bool pass2, nx_error *err) {
    size_t i;
    const json_t *a;
    json_array_foreach(arr, i, a) {
        const json_t *jid = json_object_get(a, "id");
        const json_t *jc = json_object_get(a, "content");
        if (!json_is_object(a))
            return nx_fail(err, NX_E_FORMAT, "added_tokens[%zu]: expected an object", i);
        if (!json_is_integer(jid) || json_integer_value(jid) < 0 ||
            json_integer_value(jid) >= TOK_MAX_ID)
            return nx_fail(err, NX_E_FORMAT, "added_tokens[%zu].id: missing or out of range", i);
        if (!json_is_string(jc) || json_string_length(jc) == 0 ||
            json_string_length(jc) > UINT32_MAX)
            return nx_fail(err, NX_E_FORMAT, "added_tokens[%zu].content: missing or empty", i);
        int32_t id = (int32_t)json_integer_value(jid);
        if (!pass2) {
            if (id >= t->n_tokens) t->n_tokens = id + 1;
            continue;
        }
        const tok_entry *had = &t->tokens[id];
        if ((had->flags & TOKF_ADDED) ||
            ((had->flags & TOKF_PRESENT) &&
             (had->len != json_string_length(jc) || memcmp(had->str, json_string_value(jc), had->len) != 0)))
            return nx_fail(err, NX_E_FORMAT, "added_tokens[%zu]: id %d is already \"%.64s\"%s", i, id, had->str,
                           had->flags & TOKF_ADDED ? " (another added token)" : " in model.vocab");
        added_token *tk = &t->added[t->n_added];
        bool ok = true;
        tk->id = id;
        tk->special = json_opt_bool(a, "special", false, &ok);
        tk->single_word = json_opt_bool(a, "single_word", false, &ok);
        tk->lstrip = json_opt_bool(a, "lstrip", false, &ok);
        tk->rstrip = json_opt_bool(a, "rstrip", false, &ok);
        tk->normalized = json_opt_bool(a, "normalized", !tk->special, &ok);
        if (!ok)
            return nx_fail(err, NX_E_FORMAT, "added_tokens[%zu]: a flag is not a bool", i);
        size_t n = json_string_length(jc);
        const char *s = arena_copy(&t->arena, json_string_value(jc), n);
        if (!s) return nx_fail(err, NX_E_NOMEM, "added_tokens: out of memory");
        tk->content = s;
        tk->len = n;
        t->tokens[id] = (tok_entry){s, (uint32_t)n,
                                    (uint8_t)(TOKF_PRESENT | TOKF_ADDED |
                                              (tk->special ? TOKF_SPECIAL : 0))};
        smap_set(&t->added_map, s, n, id);
        t->n_added++;
    }
    return NX_OK;
}

/* Builds the two added-token matchers. Normalized tokens are matched on normalized text, so
 * their content is normalized the same way first. */
static nx_status build_tries(nx_tokenizer *t, nx_error *err) {
    match_state ms = {pcre2_match_data_create(1, NULL), t->mctx};
    if (!ms.md) return nx_fail(err, NX_E_NOMEM, "out of memory");
    nx_status st = NX_OK;
    nx_strbuf nb = {0};
    for (size_t i = 0; i < t->n_added; i++) {
        added_token *tk = &t->added[i];
        if (tk->normalized && t->has_normalizer) {
            nb.len = 0;
            st = normalize_text(t, &ms, tk->content, tk->len, &nb, err);
            if (st != NX_OK) goto done;
            if (nb.len == 0) continue; /* normalizes to nothing: can never match */
            const char *s = arena_copy(&t->arena, nb.data, nb.len);
            if (!s || !trie_add(&t->trie_norm, s, nb.len, (int32_t)i)) {
                st = nx_fail(err, NX_E_NOMEM, "added_tokens: out of memory");
                goto done;
            }
            tk->content = s;
            tk->len = nb.len;
        } else if (!trie_add(&t->trie_raw, tk->content, tk->len, (int32_t)i)) {
            st = nx_fail(err, NX_E_NOMEM, "added_tokens: out of memory");
            goto done;
        }
    }
done:
    nx_strbuf_free(&nb);
    pcre2_match_data_free(ms.md);
    return st;
}

void nx_tokenizer_free(nx_tokenizer *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_norm; i++) {
        free(t->norm[i].str);
        pattern_free(&t->norm[i].pat);
    }
    for (size_t i = 0; i < t->n_pre; i++) pattern_free(&t->pre[i].pat);
    free(t->norm);
    free(t->pre);
    free(t->tokens);
    free(t->vocab.slots);
    free(t->added_map.slots);
    free(t->added);
    free(t->trie_raw.nodes);
    free(t->trie_norm.nodes);
    free(t->merges.slots);
    pcre2_match_context_free(t->mctx);
    arena_free(t->arena);
    free(t);
}

nx_status nx_tokenizer_load_json(const char *buf, size_t len, nx_tokenizer **out, nx_error *err) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_ALLOW_NUL, &jerr);
    if (!root)
        return nx_fail(err, NX_E_FORMAT, "invalid JSON at line %d column %d: %s", jerr.line,
                       jerr.column, jerr.text);
    nx_status st = NX_OK;
    nx_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    }
    t->unk_id = -1;
    bytelevel_init(t);
    t->mctx = pcre2_match_context_create(NULL);
    if (!t->mctx) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto fail;
    }
    pcre2_set_match_limit(t->mctx, TOK_MATCH_LIMIT);
    pcre2_set_heap_limit(t->mctx, TOK_HEAP_LIMIT_KB);
    if (!json_is_object(root)) {
        st = nx_fail(err, NX_E_FORMAT, "top level: expected an object");
        goto fail;
    }

    const json_t *model = json_object_get(root, "model");
    if ((st = parse_model(t, model, err)) != NX_OK) goto fail;
    const json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added)) {
        st = nx_fail(err, NX_E_FORMAT, "added_tokens: expected an array");
        goto fail;
    }
    size_t n_added = json_is_array(added) ? json_array_size(added) : 0;
    if (n_added && (st = parse_added(t, added, false, err)) != NX_OK) goto fail;
    t->tokens = calloc((size_t)t->n_tokens + 1, sizeof *t->tokens);
    t->added = calloc(n_added + 1, sizeof *t->added);
    if (!t->tokens || !t->added || !smap_init(&t->added_map, n_added)) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = fill_vocab(t, json_object_get(model, "vocab"), err)) != NX_OK) goto fail;
    if ((st = parse_merges(t, json_object_get(model, "merges"), err)) != NX_OK) goto fail;
    if (n_added && (st = parse_added(t, added, true, err)) != NX_OK) goto fail;

    const json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) {
            st = nx_fail(err, NX_E_FORMAT, "model.unk_token: expected a string or null");
            goto fail;
        }
        t->unk_id = smap_get(&t->vocab, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0) t->unk_id = smap_get(&t->added_map, json_string_value(unk),
                                                 json_string_length(unk));
        if (t->unk_id < 0) {
            st = nx_fail(err, NX_E_FORMAT, "model.unk_token: \"%.64s\" is not in the vocabulary",
                         json_string_value(unk));
            goto fail;
        }
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = smap_get(&t->vocab, name, 6);
    }

    const json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        t->has_normalizer = true;
        if ((st = parse_normalizer(t, norm, "normalizer", 0, err)) != NX_OK) goto fail;
    }
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    if (pre && !json_is_null(pre) &&
        (st = parse_pre_tokenizer(t, pre, "pre_tokenizer", 0, err)) != NX_OK)
        goto fail;
    const json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec) && (st = parse_decoder(t, dec, "decoder", 0, err)) != NX_OK)
        goto fail;
    if ((st = build_tries(t, err)) != NX_OK) goto fail;
    if (json_object_size(json_object_get(model, "vocab")) == 0) { /* checked last: the other errors name more */
        st = nx_fail(err, NX_E_FORMAT, "model.vocab: empty (text would tokenize to nothing)");
        goto fail;
    }

    json_decref(root);
    *out = t;
    return NX_OK;
fail:
    json_decref(root);
    nx_tokenizer_free(t);
    return st;
}

nx_status nx_tokenizer_load(const char *path, nx_tokenizer **out, nx_error *err) {
    if (!out || !path) return nx_fail(err, NX_E_ARG, "nx_tokenizer_load: NULL argument");
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    nx_status st = read_file(path, &buf, &len, err);
    if (st != NX_OK) return st;
    st = nx_tokenizer_load_json(buf, len, out, err);
    free(buf);
    if (st != NX_OK) nx_error_prefix(err, "%s", path);
    return st;
}

/* ================================================================ queries */

int32_t nx_tokenizer_vocab_size(const nx_tokenizer *t) { return t ? t->n_tokens : 0; }

int32_t nx_tokenizer_token_id(const nx_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t n = strlen(token);
    int32_t id = smap_get(&t->added_map, token, n);
    return id >= 0 ? id : smap_get(&t->vocab, token, n);
}

const char *nx_tokenizer_token_str(const nx_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_tokens || !(t->tokens[id].flags & TOKF_PRESENT)) return NULL;
    return t->tokens[id].str;
}

bool nx_tokenizer_is_special(const nx_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_tokens) return false;
    return (t->tokens[id].flags & TOKF_SPECIAL) != 0;
}

/* ================================================================ normalization */

static nx_status utf8proc_form(const char *s, size_t n, int options, nx_strbuf *out, nx_error *err) {
    if (n > (size_t)PTRDIFF_MAX / 8) return nx_fail(err, NX_E_ARG, "text too long");
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | options));
    if (r < 0) {
        free(dst);
        return r == UTF8PROC_ERROR_NOMEM ? nx_fail(err, NX_E_NOMEM, "normalizer: out of memory")
                                         : nx_fail(err, NX_E_ARG, "normalizer: %s",
                                                   utf8proc_errmsg(r));
    }
    out->len = 0;
    bool ok = nx_strbuf_append(out, (const char *)dst, (size_t)r) == NX_OK;
    free(dst);
    return ok ? NX_OK : nx_fail(err, NX_E_NOMEM, "normalizer: out of memory");
}

static nx_status normalize_step(const norm_step *s, match_state *ms, const char *in, size_t n,
                                nx_strbuf *out, nx_error *err) {
    out->len = 0;
    switch (s->kind) {
    case NORM_NFC: return utf8proc_form(in, n, UTF8PROC_COMPOSE, out, err);
    case NORM_NFD: return utf8proc_form(in, n, UTF8PROC_DECOMPOSE, out, err);
    case NORM_NFKC: return utf8proc_form(in, n, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out, err);
    case NORM_NFKD: return utf8proc_form(in, n, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out, err);
    case NORM_LOWER:
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = nx_utf8_next(in + i, n - i, &cp);
            if (k == 0) return nx_fail(err, NX_E_ARG, "normalizer: invalid UTF-8");
            i += k;
            char u[8];
            size_t m;
            if (cp == 0x130) { /* the one full (multi-character) lowercase mapping */
                memcpy(u, "i\xCC\x87", 3);
                m = 3;
            } else {
                m = nx_utf8_put((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), u);
            }
            if (nx_strbuf_append(out, u, m) != NX_OK) return nx_fail(err, NX_E_NOMEM, "out of memory");
        }
        break;
    case NORM_PREPEND:
        if (n && nx_strbuf_append(out, s->str, s->str_len) != NX_OK)
            return nx_fail(err, NX_E_NOMEM, "out of memory");
        if (nx_strbuf_append(out, in, n) != NX_OK) return nx_fail(err, NX_E_NOMEM, "out of memory");
        break;
    case NORM_STRIP: {
        size_t a = 0, b = n;
        uint32_t cp;
        size_t k;
        while (s->left && a < b && (k = nx_utf8_next(in + a, b - a, &cp)) && nx_unicode_is_space(cp))
            a += k;
        while (s->right && b > a) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)in[j] & 0xC0) == 0x80) j--;
            if (!nx_utf8_next(in + j, b - j, &cp) || !nx_unicode_is_space(cp)) break;
            b = j;
        }
        if (nx_strbuf_append(out, in + a, b - a) != NX_OK)
            return nx_fail(err, NX_E_NOMEM, "out of memory");
        break;
    }
    case NORM_REPLACE: {
        size_t pos = 0, ms_, me_;
        for (;;) {
            int r = pattern_find(&s->pat, ms, in, n, pos, &ms_, &me_);
            if (r < 0) return nx_fail(err, NX_E_UNSUPPORTED, "normalizer: regex match failed");
            if (r == 0) break;
            if (nx_strbuf_append(out, in + pos, ms_ - pos) != NX_OK ||
                nx_strbuf_append(out, s->str, s->str_len) != NX_OK)
                return nx_fail(err, NX_E_NOMEM, "out of memory");
            pos = me_;
        }
        if (nx_strbuf_append(out, in + pos, n - pos) != NX_OK)
            return nx_fail(err, NX_E_NOMEM, "out of memory");
        break;
    }
    }
    return NX_OK;
}

static nx_status normalize_text(const nx_tokenizer *t, match_state *ms, const char *s, size_t n,
                                nx_strbuf *out, nx_error *err) {
    out->len = 0;
    if (nx_strbuf_append(out, s, n) != NX_OK) return nx_fail(err, NX_E_NOMEM, "out of memory");
    nx_strbuf tmp = {0};
    for (size_t i = 0; i < t->n_norm; i++) {
        nx_status st = normalize_step(&t->norm[i], ms, out->data, out->len, &tmp, err);
        if (st != NX_OK) {
            nx_strbuf_free(&tmp);
            return st;
        }
        nx_strbuf sw = *out;
        *out = tmp;
        tmp = sw;
    }
    nx_strbuf_free(&tmp);
    /* Replace/Prepend contents come from the file and may be anything; keep the invariant that
     * the pre-tokenizer only ever sees well-formed UTF-8. */
    if (!nx_utf8_valid(out->data, out->len, NULL))
        return nx_fail(err, NX_E_FORMAT, "normalizer produced invalid UTF-8");
    return NX_OK;
}

/* ================================================================ added-token split */

typedef struct seg {
    size_t off, len;
    int32_t added; /* index into added[], -1 for text */
} seg;

typedef struct segvec {
    seg *p;
    size_t n, cap;
} segvec;

static bool segvec_push(segvec *v, size_t off, size_t len, int32_t added) {
    if (!array_grow((void **)&v->p, &v->cap, v->n + 1, sizeof *v->p)) return false;
    v->p[v->n++] = (seg){off, len, added};
    return true;
}

static bool is_word_cp(uint32_t cp) {
    if (cp == '_') return true;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

/* A single_word token only matches when it is not glued to word characters on either side. */
static bool single_word_ok(const char *s, size_t n, size_t a, size_t b) {
    uint32_t cp;
    if (a > 0) {
        size_t j = a - 1;
        while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        if (nx_utf8_next(s + j, a - j, &cp) && is_word_cp(cp)) return false;
    }
    if (b < n && nx_utf8_next(s + b, n - b, &cp) && is_word_cp(cp)) return false;
    return true;
}

/* Splits s[0..n) into text and added-token segments: at each position the longest token that
 * starts there wins, the leftmost position first (HF's leftmost-longest matching). Special
 * tokens take part only when parse_special. lstrip/rstrip eat the neighbouring whitespace. */
static bool split_added(const nx_tokenizer *t, const trie *tr, const char *s, size_t n,
                        bool parse_special, segvec *out) {
    out->n = 0;
    size_t start = 0, i = 0;
    while (tr->n && i < n) {
        unsigned char b0 = (unsigned char)s[i];
        if (!(tr->first[b0 >> 3] & (1u << (b0 & 7)))) {
            i++;
            continue;
        }
        int32_t node = 0, best = -1;
        size_t best_len = 0;
        for (size_t j = i; j < n; j++) {
            int32_t c = tr->nodes[node].child;
            while (c >= 0 && tr->nodes[c].byte != (unsigned char)s[j]) c = tr->nodes[c].sibling;
            if (c < 0) break;
            node = c;
            int32_t a = tr->nodes[node].added;
            if (a >= 0 && (parse_special || !t->added[a].special) &&
                (!t->added[a].single_word || single_word_ok(s, n, i, j + 1))) {
                best = a;
                best_len = j + 1 - i;
            }
        }
        if (best < 0) {
            i++;
            continue;
        }
        if (i > start && !segvec_push(out, start, i - start, -1)) return false;
        if (!segvec_push(out, i, best_len, best)) return false;
        i += best_len;
        start = i;
    }
    if (start < n && !segvec_push(out, start, n - start, -1)) return false;

    for (size_t k = 0; k < out->n; k++) {
        if (out->p[k].added < 0) continue;
        const added_token *tk = &t->added[out->p[k].added];
        if (tk->lstrip && k > 0 && out->p[k - 1].added < 0) {
            seg *g = &out->p[k - 1];
            while (g->len > 0) {
                size_t j = g->off + g->len - 1;
                while (j > g->off && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
                uint32_t cp;
                if (!nx_utf8_next(s + j, g->off + g->len - j, &cp) || !nx_unicode_is_space(cp))
                    break;
                g->len = j - g->off;
            }
        }
        if (tk->rstrip && k + 1 < out->n && out->p[k + 1].added < 0) {
            seg *g = &out->p[k + 1];
            uint32_t cp;
            size_t m;
            while (g->len > 0 && (m = nx_utf8_next(s + g->off, g->len, &cp)) &&
                   nx_unicode_is_space(cp)) {
                g->off += m;
                g->len -= m;
            }
        }
    }
    return true;
}

/* ================================================================ pre-tokenization */

typedef struct span {
    size_t off, len;
} span;

typedef struct pieces {
    nx_strbuf text;
    span *sp;
    size_t n, cap;
} pieces;

static bool pieces_push(pieces *p, size_t off, size_t len) {
    if (len == 0) return true;
    if (!array_grow((void **)&p->sp, &p->cap, p->n + 1, sizeof *p->sp)) return false;
    p->sp[p->n++] = (span){off, len};
    return true;
}

typedef struct mark {
    size_t a, b;
    bool match;
} mark;

typedef struct encode_scratch {
    match_state ms;
    pieces cur, next;
    mark *marks;
    size_t marks_cap;
    nx_strbuf tmp;
    /* BPE */
    struct bsym *syms;
    size_t syms_cap;
    struct bmerge *heap;
    size_t heap_cap;
} encode_scratch;

/* Splits one piece s[0..n) (offsets relative to base) by pattern p with HF's delimiter
 * behaviours, appending the resulting spans to out. */
static int split_piece(encode_scratch *sc, const tok_pattern *p, enum split_behavior beh,
                       bool invert, const char *s, size_t n, size_t base, pieces *out) {
    size_t nm = 0, pos = 0, a, b;
    for (;;) {
        int r = pattern_find(p, &sc->ms, s, n, pos, &a, &b);
        if (r < 0) return -1;
        if (r == 0) break;
        if (!array_grow((void **)&sc->marks, &sc->marks_cap, nm + 2, sizeof *sc->marks)) return -2;
        if (a > pos) sc->marks[nm++] = (mark){pos, a, false};
        sc->marks[nm++] = (mark){a, b, true};
        pos = b;
    }
    if (!array_grow((void **)&sc->marks, &sc->marks_cap, nm + 1, sizeof *sc->marks)) return -2;
    if (pos < n) sc->marks[nm++] = (mark){pos, n, false};
    mark *m = sc->marks;
    if (invert)
        for (size_t i = 0; i < nm; i++) m[i].match = !m[i].match;

    /* Rewrite m[] into the final pieces, following tokenizers' SplitDelimiterBehavior. */
    size_t k = 0;
    bool prev_match = false;
    switch (beh) {
    case SPLIT_ISOLATED:
        k = nm;
        break;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < nm; i++)
            if (!m[i].match) m[k++] = m[i];
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < nm; i++) {
            if (m[i].match && !prev_match && k > 0) m[k - 1].b = m[i].b;
            else m[k++] = m[i];
            prev_match = m[i].match;
        }
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < nm; i++) {
            bool mt = m[i].match;
            if (i > 0 && mt == prev_match && k > 0) m[k - 1].b = m[i].b;
            else m[k++] = m[i];
            prev_match = mt;
        }
        break;
    case SPLIT_MERGED_NEXT: {
        /* Walk backwards: a match joins the piece that follows it. */
        size_t w = nm;
        for (size_t ii = nm; ii-- > 0;) {
            bool mt = m[ii].match;
            if (mt && !prev_match && w < nm) m[w].a = m[ii].a;
            else m[--w] = m[ii];
            prev_match = mt;
        }
        for (size_t i = w; i < nm; i++) m[k++] = m[i];
        break;
    }
    }
    for (size_t i = 0; i < k; i++)
        if (!pieces_push(out, base + m[i].a, m[i].b - m[i].a)) return -2;
    return 0;
}

static nx_status pre_tokenize(const nx_tokenizer *t, encode_scratch *sc, const char *s, size_t n,
                              nx_error *err) {
    pieces *cur = &sc->cur, *nxt = &sc->next;
    cur->n = 0;
    cur->text.len = 0;
    if (nx_strbuf_append(&cur->text, s, n) != NX_OK || !pieces_push(cur, 0, n))
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    for (size_t si = 0; si < t->n_pre; si++) {
        const pre_step *st = &t->pre[si];
        nxt->n = 0;
        nxt->text.len = 0;
        int r = 0;
        if (st->kind == PRE_SPLIT) {
            /* Same text, finer spans: swap the text buffers so nxt owns it. */
            nx_strbuf sw = nxt->text;
            nxt->text = cur->text;
            cur->text = sw;
            for (size_t i = 0; i < cur->n && r == 0; i++)
                r = split_piece(sc, &st->pat, st->behavior, st->invert,
                                nxt->text.data + cur->sp[i].off, cur->sp[i].len, cur->sp[i].off, nxt);
        } else { /* ByteLevel: optional prefix space, optional GPT-2 split, byte -> alphabet */
            for (size_t i = 0; i < cur->n && r == 0; i++) {
                const char *p = cur->text.data + cur->sp[i].off;
                size_t len = cur->sp[i].len;
                sc->tmp.len = 0;
                if (st->add_prefix_space && p[0] != ' ' && nx_strbuf_append(&sc->tmp, " ", 1) != NX_OK)
                    r = -2;
                if (r == 0 && nx_strbuf_append(&sc->tmp, p, len) != NX_OK) r = -2;
                if (r) break;
                /* Spans of the GPT-2 split, collected at the end of nxt, then mapped in place. */
                size_t first = nxt->n;
                if (st->use_regex) {
                    pieces local = {0};
                    r = split_piece(sc, &st->pat, SPLIT_ISOLATED, false, sc->tmp.data, sc->tmp.len, 0,
                                    &local);
                    for (size_t k = 0; r == 0 && k < local.n; k++)
                        if (!pieces_push(nxt, local.sp[k].off, local.sp[k].len)) r = -2;
                    free(local.sp);
                } else if (!pieces_push(nxt, 0, sc->tmp.len)) {
                    r = -2;
                }
                for (size_t k = first; r == 0 && k < nxt->n; k++) {
                    size_t off = nxt->text.len;
                    for (size_t q = 0; q < nxt->sp[k].len; q++) {
                        unsigned char b = (unsigned char)sc->tmp.data[nxt->sp[k].off + q];
                        const char *u = (const char *)t->cp_utf8[b];
                        if (nx_strbuf_append(&nxt->text, u, t->cp_utf8_len[b]) != NX_OK) {
                            r = -2;
                            break;
                        }
                    }
                    nxt->sp[k] = (span){off, nxt->text.len - off};
                }
            }
        }
        if (r == -1) return nx_fail(err, NX_E_UNSUPPORTED, "pre_tokenizer: regex match limit exceeded");
        if (r) return nx_fail(err, NX_E_NOMEM, "out of memory");
        pieces sw = *cur;
        *cur = *nxt;
        *nxt = sw;
    }
    return NX_OK;
}

/* ================================================================ BPE */

typedef struct bsym {
    int32_t id, prev, next;
    uint32_t len; /* bytes covered; 0 once merged into its left neighbour */
} bsym;

typedef struct bmerge {
    int32_t rank, pos, id;
} bmerge;

static bool bmerge_less(const bmerge *a, const bmerge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static bool heap_push(encode_scratch *sc, size_t *n, bmerge m) {
    if (!array_grow((void **)&sc->heap, &sc->heap_cap, *n + 1, sizeof *sc->heap)) return false;
    bmerge *h = sc->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bmerge_less(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
    return true;
}

static bmerge heap_pop(encode_scratch *sc, size_t *n) {
    bmerge *h = sc->heap, top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && bmerge_less(&h[c + 1], &h[c])) c++;
        if (!bmerge_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static bool bpe_queue_pair(const nx_tokenizer *t, encode_scratch *sc, size_t *nh, int32_t pos) {
    int32_t nx = sc->syms[pos].next;
    if (nx < 0) return true;
    const mmap_slot *m = mmap_get(&t->merges, sc->syms[pos].id, sc->syms[nx].id);
    if (!m) return true;
    return heap_push(sc, nh, (bmerge){m->rank, pos, m->id});
}

/* Encodes one pre-token with the merge table: always merge the lowest-ranked adjacent pair,
 * leftmost first (the order HF's BPE uses). */
static nx_status bpe_word(const nx_tokenizer *t, encode_scratch *sc, const char *s, size_t n,
                          ivec *out, nx_error *err) {
    if (t->ignore_merges) {
        int32_t id = smap_get(&t->vocab, s, n);
        if (id >= 0) return ivec_push(out, id) ? NX_OK : nx_fail(err, NX_E_NOMEM, "out of memory");
    }
    size_t ns = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = nx_utf8_next(s + i, n - i, &cp);
        if (k == 0) k = 1; /* cannot happen on validated text; stay safe */
        if (!array_grow((void **)&sc->syms, &sc->syms_cap, ns + k, sizeof *sc->syms) ||
            ns + k > INT32_MAX)
            return nx_fail(err, NX_E_NOMEM, "out of memory");
        int32_t id = smap_get(&t->vocab, s + i, k);
        if (id >= 0) {
            sc->syms[ns++] = (bsym){id, 0, 0, (uint32_t)k};
        } else {
            bool done = false;
            if (t->byte_fallback) {
                done = true;
                for (size_t q = 0; q < k; q++)
                    if (t->byte_ids[(unsigned char)s[i + q]] < 0) done = false;
                for (size_t q = 0; done && q < k; q++)
                    sc->syms[ns++] = (bsym){t->byte_ids[(unsigned char)s[i + q]], 0, 0, 1};
            }
            if (!done && t->unk_id >= 0) {
                if (t->fuse_unk && ns > 0 && sc->syms[ns - 1].id == t->unk_id)
                    sc->syms[ns - 1].len += (uint32_t)k;
                else
                    sc->syms[ns++] = (bsym){t->unk_id, 0, 0, (uint32_t)k};
            }
            /* Without byte tokens or an unk token the character is dropped, as in HF. */
        }
        i += k;
    }
    for (size_t i = 0; i < ns; i++) {
        sc->syms[i].prev = (int32_t)i - 1;
        sc->syms[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        if (!bpe_queue_pair(t, sc, &nh, (int32_t)i)) return nx_fail(err, NX_E_NOMEM, "out of memory");
    while (nh > 0) {
        bmerge top = heap_pop(sc, &nh);
        bsym *l = &sc->syms[top.pos];
        if (l->len == 0 || l->next < 0) continue;
        bsym *r = &sc->syms[l->next];
        const mmap_slot *m = mmap_get(&t->merges, l->id, r->id);
        if (!m || m->id != top.id) continue; /* stale entry */
        l->id = top.id;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (l->next >= 0) sc->syms[l->next].prev = top.pos;
        if ((l->prev >= 0 && !bpe_queue_pair(t, sc, &nh, l->prev)) ||
            !bpe_queue_pair(t, sc, &nh, top.pos))
            return nx_fail(err, NX_E_NOMEM, "out of memory");
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = sc->syms[i].next)
        if (!ivec_push(out, sc->syms[i].id)) return nx_fail(err, NX_E_NOMEM, "out of memory");
    return NX_OK;
}

/* ================================================================ encode */

static nx_status encode_text(const nx_tokenizer *t, encode_scratch *sc, const char *s, size_t n,
                             ivec *out, nx_error *err) {
    nx_status st = pre_tokenize(t, sc, s, n, err);
    for (size_t i = 0; st == NX_OK && i < sc->cur.n; i++)
        st = bpe_word(t, sc, sc->cur.text.data + sc->cur.sp[i].off, sc->cur.sp[i].len, out, err);
    return st;
}

nx_status nx_tokenizer_encode(const nx_tokenizer *t, const char *text, size_t len,
                              bool parse_special, int32_t **ids, size_t *n_ids, nx_error *err) {
    if (!t || (!text && len) || !ids || !n_ids)
        return nx_fail(err, NX_E_ARG, "nx_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    size_t bad = 0;
    if (!nx_utf8_valid(text, len, &bad))
        return nx_fail(err, NX_E_ARG, "encode: invalid UTF-8 at byte %zu", bad);
    nx_status st = NX_OK;
    ivec out = {0};
    segvec outer = {0}, inner = {0};
    nx_strbuf norm = {0};
    encode_scratch sc = {0};
    sc.ms.mc = t->mctx;
    sc.ms.md = pcre2_match_data_create(1, NULL);
    if (!sc.ms.md) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto done;
    }
    if (!split_added(t, &t->trie_raw, text, len, parse_special, &outer)) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < outer.n && st == NX_OK; i++) {
        const seg *g = &outer.p[i];
        if (g->added >= 0) {
            if (!ivec_push(&out, t->added[g->added].id)) st = nx_fail(err, NX_E_NOMEM, "out of memory");
            continue;
        }
        if (g->len == 0) continue;
        const char *p = text + g->off;
        size_t n = g->len;
        if (t->n_norm) {
            if ((st = normalize_text(t, &sc.ms, p, n, &norm, err)) != NX_OK) break;
            p = norm.data;
            n = norm.len;
        }
        if (!split_added(t, &t->trie_norm, p, n, parse_special, &inner)) {
            st = nx_fail(err, NX_E_NOMEM, "out of memory");
            break;
        }
        for (size_t k = 0; k < inner.n && st == NX_OK; k++) {
            const seg *h = &inner.p[k];
            if (h->added >= 0) {
                if (!ivec_push(&out, t->added[h->added].id))
                    st = nx_fail(err, NX_E_NOMEM, "out of memory");
            } else if (h->len) {
                st = encode_text(t, &sc, p + h->off, h->len, &out, err);
            }
        }
    }
done:
    pcre2_match_data_free(sc.ms.md);
    nx_strbuf_free(&sc.cur.text);
    free(sc.cur.sp);
    nx_strbuf_free(&sc.next.text);
    free(sc.next.sp);
    free(sc.marks);
    nx_strbuf_free(&sc.tmp);
    free(sc.syms);
    free(sc.heap);
    free(outer.p);
    free(inner.p);
    nx_strbuf_free(&norm);
    if (st != NX_OK) {
        free(out.p);
        return st;
    }
    if (!out.p && !(out.p = malloc(sizeof *out.p))) return nx_fail(err, NX_E_NOMEM, "out of memory");
    *ids = out.p;
    *n_ids = out.n;
    return NX_OK;
}

/* ================================================================ decode */

/* Appends the raw bytes of one token (before UTF-8 repair). Added tokens read as written; the
 * byte-level decoder maps the alphabet back to bytes (a token with characters outside it is
 * taken as is, as HF does); with no decoder tokens are joined by spaces. */
static bool token_bytes(const nx_tokenizer *t, int32_t id, bool *first, nx_strbuf *out) {
    const tok_entry *e = &t->tokens[id];
    if (!(e->flags & TOKF_PRESENT)) return true;
    bool raw = (e->flags & TOKF_ADDED) || t->decoder == DEC_NONE;
    if (!raw) {
        for (size_t i = 0; i < e->len;) {
            uint32_t cp;
            size_t k = nx_utf8_next(e->str + i, e->len - i, &cp);
            if (k == 0 || cp >= 324 || t->byte_of_cp[cp] < 0) {
                raw = true;
                break;
            }
            i += k;
        }
    }
    if (t->decoder == DEC_NONE && !*first && nx_strbuf_append(out, " ", 1) != NX_OK) return false;
    *first = false;
    if (raw) return nx_strbuf_append(out, e->str, e->len) == NX_OK;
    if (nx_strbuf_reserve(out, e->len) != NX_OK) return false;
    for (size_t i = 0; i < e->len;) {
        uint32_t cp = 0;
        i += nx_utf8_next(e->str + i, e->len - i, &cp);
        out->data[out->len++] = (char)t->byte_of_cp[cp];
    }
    out->data[out->len] = '\0';
    return true;
}

nx_status nx_tokenizer_token_bytes(const nx_tokenizer *t, int32_t id, uint8_t **bytes, size_t *len, nx_error *err) {
    *bytes = NULL;
    *len = 0;
    if (!t || id < 0 || id >= t->n_tokens)
        return nx_fail(err, NX_E_ARG, "token id %" PRId32 " is out of range", id);
    nx_strbuf raw = {0};
    bool first = false;
    if (!token_bytes(t, id, &first, &raw) || nx_strbuf_reserve(&raw, 1) != NX_OK) {
        nx_strbuf_free(&raw);
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    }
    *bytes = (uint8_t *)raw.data;
    *len = raw.len;
    return NX_OK;
}

/* Repairs raw[0..n) into a fresh malloc'd NUL-terminated string. */
static nx_status repair_alloc(const char *raw, size_t n, bool final, size_t *consumed, char **out,
                              size_t *out_len, nx_error *err) {
    if (n > (SIZE_MAX - 1) / 3) return nx_fail(err, NX_E_NOMEM, "decode: text too long");
    char *buf = malloc(3 * n + 1);
    if (!buf) return nx_fail(err, NX_E_NOMEM, "decode: out of memory");
    size_t len = 0;
    size_t c = nx_utf8_repair(raw, n, final, buf, &len);
    if (consumed) *consumed = c;
    buf[len] = '\0';
    *out = buf;
    if (out_len) *out_len = len;
    return NX_OK;
}

nx_status nx_tokenizer_decode(const nx_tokenizer *t, const int32_t *ids, size_t n_ids,
                              bool skip_special, char **text, nx_error *err) {
    if (!t || (!ids && n_ids) || !text)
        return nx_fail(err, NX_E_ARG, "nx_tokenizer_decode: NULL argument");
    *text = NULL;
    nx_strbuf raw = {0};
    bool first = true;
    for (size_t i = 0; i < n_ids; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_tokens) {
            nx_strbuf_free(&raw);
            return nx_fail(err, NX_E_ARG, "decode: token id %" PRId32 " at position %zu is out of range [0, %" PRId32 ")",
                           id, i, t->n_tokens);
        }
        if (skip_special && (t->tokens[id].flags & TOKF_SPECIAL)) continue;
        if (!token_bytes(t, id, &first, &raw)) {
            nx_strbuf_free(&raw);
            return nx_fail(err, NX_E_NOMEM, "decode: out of memory");
        }
    }
    nx_status st = repair_alloc(raw.data ? raw.data : "", raw.len, true, NULL, text, NULL, err);
    nx_strbuf_free(&raw);
    return st;
}

/* ================================================================ streaming detokenizer */

struct nx_detok {
    const nx_tokenizer *tok;
    bool skip_special, first;
    nx_strbuf pend; /* raw bytes not yet handed out: at most an incomplete character */
};

nx_status nx_detok_new(const nx_tokenizer *tok, bool skip_special, nx_detok **out, nx_error *err) {
    if (!tok || !out) return nx_fail(err, NX_E_ARG, "nx_detok_new: NULL argument");
    nx_detok *d = calloc(1, sizeof *d);
    if (!d) return nx_fail(err, NX_E_NOMEM, "out of memory");
    d->tok = tok;
    d->skip_special = skip_special;
    d->first = true;
    *out = d;
    return NX_OK;
}

void nx_detok_free(nx_detok *d) {
    if (!d) return;
    nx_strbuf_free(&d->pend);
    free(d);
}

static nx_status detok_emit(nx_detok *d, bool final, char **out, size_t *out_len, nx_error *err) {
    size_t used = 0;
    nx_status st = repair_alloc(d->pend.data ? d->pend.data : "", d->pend.len, final, &used, out,
                                out_len, err);
    if (st != NX_OK) return st;
    nx_strbuf_consume(&d->pend, used);
    return NX_OK;
}

nx_status nx_detok_push(nx_detok *d, int32_t id, char **out, size_t *out_len, nx_error *err) {
    if (!d || !out || !out_len) return nx_fail(err, NX_E_ARG, "nx_detok_push: NULL argument");
    *out = NULL;
    *out_len = 0;
    const nx_tokenizer *t = d->tok;
    if (id < 0 || id >= t->n_tokens)
        return nx_fail(err, NX_E_ARG, "detok: token id %" PRId32 " is out of range [0, %" PRId32 ")", id,
                       t->n_tokens);
    if (!(d->skip_special && (t->tokens[id].flags & TOKF_SPECIAL)) &&
        !token_bytes(t, id, &d->first, &d->pend))
        return nx_fail(err, NX_E_NOMEM, "detok: out of memory");
    if (!d->pend.data && nx_strbuf_reserve(&d->pend, 0) != NX_OK)
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    return detok_emit(d, false, out, out_len, err);
}

nx_status nx_detok_flush(nx_detok *d, char **out, size_t *out_len, nx_error *err) {
    if (!d || !out || !out_len) return nx_fail(err, NX_E_ARG, "nx_detok_flush: NULL argument");
    if (!d->pend.data && nx_strbuf_reserve(&d->pend, 0) != NX_OK)
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    return detok_emit(d, true, out, out_len, err);
}
