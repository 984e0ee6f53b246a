/* libFuzzer target for the tokenizer. An input starting with '{' is a tokenizer.json: it must
 * load or fail cleanly, and a loaded one must encode/decode a sample without faults. Any other
 * input is text (and, reinterpreted, token ids) for a fixed small byte-level tokenizer, where
 * decode(encode(x)) == x must hold for valid UTF-8 and streaming must equal decode(). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nextn.h"
#include "text/tokenizer_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A GPT-2 style byte-level BPE (bytes are ids 0..255 in byte order), Qwen-like split regex,
 * a few merges and added tokens with every flag. */
static char *fixed_json(void) {
    static const char *const merges[] = {"Ġ t", "h e", "Ġt he", "i n", "ä ¸", "ð Ł", "Ġ Ġ"};
    size_t cap = 16384, n = 0;
    char *s = malloc(cap);
    if (!s) abort();
    n += (size_t)snprintf(s + n, cap - n, "{\"added_tokens\": ["
        "{\"id\": 300, \"content\": \"<|im_start|>\", \"special\": true},"
        "{\"id\": 301, \"content\": \"<|im_end|>\", \"special\": true},"
        "{\"id\": 302, \"content\": \"<think>\", \"special\": false},"
        "{\"id\": 303, \"content\": \"<s>\", \"special\": true, \"lstrip\": true, \"rstrip\": true},"
        "{\"id\": 304, \"content\": \"word\", \"special\": false, \"single_word\": true}],"
        "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
        "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
        " \"behavior\": \"Isolated\", \"invert\": false},"
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
        "\"decoder\": {\"type\": \"ByteLevel\"},"
        "\"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (unsigned b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        unsigned cp = b, k = 0;
        if (!keep) {
            for (unsigned x = 0; x < b; x++)
                if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) k++;
            cp = 256 + k;
        }
        n += (size_t)snprintf(s + n, cap - n, "%s\"\\u%04x\": %u", b ? ", " : "", cp, b);
    }
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
        const char *sp = strchr(merges[i], ' ');
        n += (size_t)snprintf(s + n, cap - n, ", \"%.*s%s\": %zu", (int)(sp - merges[i]),
                              merges[i], sp + 1, 256 + i);
    }
    n += (size_t)snprintf(s + n, cap - n, "}, \"merges\": [");
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++)
        n += (size_t)snprintf(s + n, cap - n, "%s\"%s\"", i ? ", " : "", merges[i]);
    snprintf(s + n, cap - n, "]}}");
    return s;
}

static const nx_tokenizer *fixed_tokenizer(void) {
    static nx_tokenizer *tok;
    if (!tok) {
        char *json = fixed_json();
        nx_error err = {0};
        if (nx_tokenizer_load_json(json, strlen(json), &tok, &err) != NX_OK) {
            fprintf(stderr, "fixed tokenizer: %s\n", err.msg);
            abort();
        }
        free(json);
    }
    return tok;
}

/* Decodes ids in one call and through the streaming detokenizer; both must agree (decode()
 * returns a C string, so the comparison stops at the first NUL a token may produce). */
static void check_decode(const nx_tokenizer *t, const int32_t *ids, size_t n, bool skip) {
    char *whole = NULL;
    if (nx_tokenizer_decode(t, ids, n, skip, &whole, NULL) != NX_OK) return;
    nx_detok *d = NULL;
    if (nx_detok_new(t, skip, &d, NULL) != NX_OK) abort();
    char *acc = NULL;
    size_t got = 0;
    for (size_t i = 0; i <= n; i++) {
        char *out = NULL;
        size_t on = 0;
        nx_status st = i < n ? nx_detok_push(d, ids[i], &out, &on, NULL)
                             : nx_detok_flush(d, &out, &on, NULL);
        if (st != NX_OK) abort();
        char *grown = realloc(acc, got + on + 1);
        if (!grown) abort();
        acc = grown;
        memcpy(acc + got, out, on);
        got += on;
        acc[got] = '\0';
        free(out);
    }
    if (!acc || strcmp(acc, whole) != 0) abort();
    free(acc);
    nx_detok_free(d);
    free(whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == '{') {
        nx_tokenizer *t = NULL;
        nx_error err = {0};
        if (nx_tokenizer_load_json((const char *)data, size, &t, &err) != NX_OK) {
            if (t || !err.msg[0]) abort(); /* a failure must explain itself */
            return 0;
        }
        static const char sample[] = "Hello, world! 123 <|im_start|>中文 😀\r\n\t x'll";
        int32_t *ids = NULL;
        size_t n = 0;
        if (nx_tokenizer_encode(t, sample, sizeof sample - 1, true, &ids, &n, NULL) == NX_OK) {
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= nx_tokenizer_vocab_size(t)) abort();
            check_decode(t, ids, n, false);
            free(ids);
        }
        int32_t probe[4] = {0, 1, nx_tokenizer_vocab_size(t) - 1, 2};
        check_decode(t, probe, 4, true);
        (void)nx_tokenizer_token_str(t, 0);
        (void)nx_tokenizer_token_id(t, "a");
        nx_tokenizer_free(t);
        return 0;
    }

    const nx_tokenizer *t = fixed_tokenizer();
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        nx_status st = nx_tokenizer_encode(t, (const char *)data, size, special, &ids, &n, NULL);
        if (st != NX_OK) continue; /* invalid UTF-8 */
        char *back = NULL;
        if (nx_tokenizer_decode(t, ids, n, false, &back, NULL) != NX_OK) abort();
        /* lstrip/rstrip tokens drop whitespace; without them the text comes back exactly. */
        bool stripped = special && memmem(data, size, "<s>", 3);
        if (!stripped && memchr(data, 0, size) == NULL &&
            (strlen(back) != size || memcmp(back, data, size) != 0))
            abort();
        free(back);
        check_decode(t, ids, n, special);
        free(ids);
    }
    /* The bytes as token ids (in and out of range). */
    size_t n = size / 2;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    if (!ids) return 0;
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(data[2 * i] | (data[2 * i + 1] << 8)) % 320;
    check_decode(t, ids, n, size & 1);
    free(ids);
    return 0;
}
