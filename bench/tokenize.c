/* Tokenizer encode speed: the bench texts repeated to 64 KiB, encoded in one call, best of 5.
 *   tokenize <tokenizer.json> [text files...]   prints bench=tokenize bytes= tokens= ms= mbs= */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nextn.h"

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int append_file(const char *path, char **buf, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) {
        char *nb = realloc(*buf, *n + k);
        if (!nb) break;
        memcpy(nb + *n, chunk, k);
        *buf = nb;
        *n += k;
    }
    fclose(f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <tokenizer.json> [text files...]\n", argv[0]);
        return 2;
    }
    char *text = NULL;
    size_t n = 0;
    const char *defaults[] = {"bench/texts/prose.txt", "bench/texts/code.c"};
    int nfiles = argc > 2 ? argc - 2 : 2;
    for (int i = 0; i < nfiles; i++) {
        const char *p = argc > 2 ? argv[i + 2] : defaults[i];
        if (append_file(p, &text, &n)) {
            fprintf(stderr, "cannot read %s\n", p);
            return 1;
        }
    }
    if (!n) return 1;
    size_t unit = n;
    while (n < 65536) {
        char *nb = realloc(text, n + unit);
        if (!nb) return 1;
        text = nb;
        memcpy(text + n, text, unit);
        n += unit;
    }
    nx_error err = {0};
    nx_tokenizer *t = NULL;
    if (nx_tokenizer_load(argv[1], &t, &err) != NX_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double best = 1e30;
    size_t ntok = 0;
    for (int r = 0; r < 5; r++) {
        int32_t *ids = NULL;
        double t0 = now_sec();
        if (nx_tokenizer_encode(t, text, n, true, &ids, &ntok, &err) != NX_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double dt = now_sec() - t0;
        if (dt < best) best = dt;
        free(ids);
    }
    printf("bench=tokenize bytes=%zu tokens=%zu ms=%.2f mbs=%.1f\n", n, ntok, best * 1e3, (double)n / best / 1e6);
    nx_tokenizer_free(t);
    free(text);
    return 0;
}
