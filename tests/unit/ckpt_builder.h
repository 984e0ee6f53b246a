/* Test fixtures for the loader: temporary directories, raw file writes, and a small builder
 * that collects tensors (float, quantized, stacked) and writes them as safetensors files,
 * optionally sharded with an index, so tests can make any checkpoint layout in C. */
#ifndef NX_TESTS_CKPT_BUILDER_H
#define NX_TESTS_CKPT_BUILDER_H

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"

static inline char *tmpdir_new(void) {
    char tmpl[] = "/tmp/nx_test_XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

/* Removes the files of a flat directory, then the directory. */
static inline void tmpdir_free(char *dir) {
    if (!dir) return;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        char p[1024];
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

static inline int write_bytes(const char *dir, const char *name, const void *a, size_t na) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return -1;
    size_t w = na ? fwrite(a, 1, na, f) : 0;
    fclose(f);
    return w == na ? 0 : -1;
}

static inline int write_text(const char *dir, const char *name, const char *text) {
    return write_bytes(dir, name, text, strlen(text));
}

/* A safetensors image from a literal header (length field = strlen(header), or hlen_override
 * when non-zero) followed by dlen bytes of data (0x11 filler). Returns malloc'd bytes. */
static inline uint8_t *st_image(const char *header, size_t dlen, uint64_t hlen_override, size_t *len) {
    size_t hl = strlen(header);
    *len = 8 + hl + dlen;
    uint8_t *b = malloc(*len ? *len : 1);
    uint64_t v = hlen_override ? hlen_override : hl;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, 0x11, dlen);
    return b;
}

/* ---------------------------------------------------------------- checkpoint builder */

#define CK_MAX 2048

typedef struct ck {
    nx_tensor t[CK_MAX];
    int file[CK_MAX]; /* which output file */
    size_t n;
    uint32_t rng;
} ck;

static inline uint32_t ck_rand(ck *c) {
    c->rng = c->rng * 1664525u + 1013904223u;
    return c->rng >> 8;
}

/* Adds a tensor with deterministic pseudo-random contents. */
static inline nx_tensor *ck_add(ck *c, int file, const char *name, nx_dtype dt, int nd, ...) {
    if (c->n >= CK_MAX) abort();
    nx_tensor *t = &c->t[c->n];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, nd);
    size_t count = 1;
    for (int i = 0; i < nd; i++) {
        t->shape[i] = va_arg(ap, int64_t);
        count *= (size_t)t->shape[i];
    }
    va_end(ap);
    t->name = strdup(name);
    t->dtype = dt;
    t->n_dims = nd;
    t->nbytes = count * nx_dtype_size(dt);
    uint8_t *d = malloc(t->nbytes ? t->nbytes : 1);
    for (size_t i = 0; i < t->nbytes; i++) d[i] = (uint8_t)ck_rand(c);
    if (dt == NX_DTYPE_BF16 || dt == NX_DTYPE_F32) { /* keep floats finite and small */
        size_t es = nx_dtype_size(dt);
        for (size_t i = 0; i < count; i++) {
            float f = (float)(ck_rand(c) % 2001) / 1000.0f - 1.0f;
            uint32_t bits;
            memcpy(&bits, &f, 4);
            if (es == 4) memcpy(d + 4 * i, &bits, 4);
            else {
                uint16_t h = (uint16_t)(bits >> 16);
                memcpy(d + 2 * i, &h, 2);
            }
        }
    }
    t->data = d;
    c->file[c->n] = file;
    c->n++;
    return t;
}

static inline nx_tensor *ck_addf(ck *c, int file, nx_dtype dt, int nd, int64_t d0, int64_t d1,
                                 int64_t d2, const char *fmt, ...) __attribute__((format(printf, 8, 9)));
static inline nx_tensor *ck_addf(ck *c, int file, nx_dtype dt, int nd, int64_t d0, int64_t d1,
                                 int64_t d2, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return ck_add(c, file, name, dt, nd, d0, d1, d2);
}

/* A linear module `path` [E?, out, in]: BF16 when bits == 0, else MLX affine (U32 weight,
 * BF16 scales/biases). E == 0: not stacked. */
static inline void ck_linear(ck *c, int file, const char *path, int64_t E, int64_t out, int64_t in,
                             int bits, int group) {
    char n[512];
    int nd = E ? 3 : 2;
    int64_t a = E ? E : out, b = E ? out : in, cc = E ? in : 0;
    snprintf(n, sizeof n, "%s.weight", path);
    if (!bits) {
        ck_add(c, file, n, NX_DTYPE_BF16, nd, a, b, cc);
        return;
    }
    int64_t packed = in * bits / 32, sc = in / group;
    ck_add(c, file, n, NX_DTYPE_U32, nd, a, E ? out : packed, E ? packed : 0);
    snprintf(n, sizeof n, "%s.scales", path);
    ck_add(c, file, n, NX_DTYPE_BF16, nd, a, E ? out : sc, E ? sc : 0);
    snprintf(n, sizeof n, "%s.biases", path);
    ck_add(c, file, n, NX_DTYPE_BF16, nd, a, E ? out : sc, E ? sc : 0);
}

static inline const nx_tensor *ck_get(const ck *c, const char *name) {
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->t[i].name, name) == 0) return &c->t[i];
    return NULL;
}

/* Drops a tensor (to make "missing tensor" cases). Returns 0 if it existed. */
static inline int ck_remove(ck *c, const char *name) {
    for (size_t i = 0; i < c->n; i++) {
        if (strcmp(c->t[i].name, name) != 0) continue;
        free((char *)c->t[i].name);
        free((void *)c->t[i].data);
        memmove(&c->t[i], &c->t[i + 1], (c->n - i - 1) * sizeof c->t[0]);
        memmove(&c->file[i], &c->file[i + 1], (c->n - i - 1) * sizeof c->file[0]);
        c->n--;
        return 0;
    }
    return -1;
}

static inline void ck_free(ck *c) {
    for (size_t i = 0; i < c->n; i++) {
        free((char *)c->t[i].name);
        free((void *)c->t[i].data);
    }
    c->n = 0;
}

/* Writes file k of the builder as dir/names[k] (align 1 = MLX-style unpadded). If index is
 * non-NULL, also writes model.safetensors.index.json mapping the tensors of the files whose
 * flag index[k] is set. Returns NX_OK or the writer's status. */
static inline nx_status ck_write(const ck *c, const char *dir, const char *const *names, int n_files,
                                 int align, const int *index) {
    nx_tensor *sel = malloc(CK_MAX * sizeof *sel);
    nx_status st = NX_OK;
    for (int k = 0; k < n_files && st == NX_OK; k++) {
        size_t m = 0;
        for (size_t i = 0; i < c->n; i++)
            if (c->file[i] == k) sel[m++] = c->t[i];
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, names[k]);
        st = nx_safetensors_write(p, sel, m, align, "{\"format\":\"test\"}", NULL);
    }
    free(sel);
    if (st != NX_OK || !index) return st;
    size_t cap = 64 + c->n * 160, o = 0;
    char *j = malloc(cap);
    o += (size_t)snprintf(j + o, cap - o, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
    int first = 1;
    for (size_t i = 0; i < c->n; i++) {
        if (!index[c->file[i]]) continue;
        o += (size_t)snprintf(j + o, cap - o, "%s\"%s\":\"%s\"", first ? "" : ",", c->t[i].name,
                              names[c->file[i]]);
        first = 0;
    }
    snprintf(j + o, cap - o, "}}");
    int r = write_text(dir, "model.safetensors.index.json", j);
    free(j);
    return r == 0 ? NX_OK : NX_E_IO;
}

#endif
