/* .npy reader/writer (NumPy format spec, versions 1.0-3.0). Whole float32 arrays are written and
 * read back; the reader accepts what numpy.save writes for float32 C-order arrays and rejects
 * anything else with a message saying why. Headers of other dtypes can be written for arrays the
 * caller streams in. Data is little-endian like the x86-64 hosts the engine targets. */
#include "io/npy.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

nx_status nx_npy_begin(const char *path, const char *descr, int n_dims, const int64_t *shape, FILE **out,
                       nx_error *err) {
    *out = NULL;
    if (n_dims < 0 || n_dims > NX_NPY_MAX_DIMS)
        return nx_fail(err, NX_E_ARG, "%s: %d dimensions (0..%d supported)", path, n_dims, NX_NPY_MAX_DIMS);
    char dict[512];
    size_t o = (size_t)snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    uint64_t count = 1;
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(count, (uint64_t)shape[i], &count))
            return nx_fail(err, NX_E_ARG, "%s: bad shape[%d] = %lld", path, i, (long long)shape[i]);
        o += (size_t)snprintf(dict + o, sizeof dict - o, "%lld%s", (long long)shape[i],
                              n_dims == 1 ? "," : i + 1 < n_dims ? ", " : "");
    }
    o += (size_t)snprintf(dict + o, sizeof dict - o, "), }");
    /* numpy pads the header with spaces so the data starts on a 64-byte boundary */
    size_t total = 10 + o + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = o + pad + 1;
    FILE *f = fopen(path, "wb");
    if (!f) return nx_fail(err, NX_E_IO, "%s: cannot create: %s", path, strerror(errno));
    uint8_t pre[10];
    memcpy(pre, npy_magic, 6);
    pre[6] = 1;
    pre[7] = 0;
    pre[8] = (uint8_t)(hlen & 0xff);
    pre[9] = (uint8_t)(hlen >> 8);
    bool ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, o, f) == o;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    if (!ok) {
        fclose(f);
        return nx_fail(err, NX_E_IO, "%s: write failed: %s", path, strerror(errno));
    }
    *out = f;
    return NX_OK;
}

nx_status nx_npy_write_f32(const char *path, const float *data, int n_dims, const int64_t *shape,
                           nx_error *err) {
    uint64_t count = 1;
    for (int i = 0; i < n_dims && i < NX_NPY_MAX_DIMS; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(count, (uint64_t)shape[i], &count))
            return nx_fail(err, NX_E_ARG, "%s: bad shape[%d] = %lld", path, i, (long long)shape[i]);
    if (count > SIZE_MAX / sizeof(float)) return nx_fail(err, NX_E_ARG, "%s: array too large", path);
    FILE *f = NULL;
    nx_status st = nx_npy_begin(path, "<f4", n_dims, shape, &f, err);
    if (st != NX_OK) return st;
    bool ok = !count || fwrite(data, sizeof(float), (size_t)count, f) == (size_t)count;
    if (fclose(f) != 0) ok = false;
    if (!ok) return nx_fail(err, NX_E_IO, "%s: write failed: %s", path, strerror(errno));
    return NX_OK;
}

/* ---------------------------------------------------------------- header dict parsing */

typedef struct cursor {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static bool eat(cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

/* A quoted Python string literal (no escapes needed for the keys and values numpy writes). */
static bool read_str(cursor *c, char *buf, size_t cap) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return false;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= cap) return false;
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end) return false;
    c->p++;
    buf[n] = 0;
    return true;
}

static bool read_word(cursor *c, const char *w) {
    skip_ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return false;
    c->p += n;
    return true;
}

static bool read_shape(cursor *c, int *n_dims, int64_t *shape) {
    if (!eat(c, '(')) return false;
    *n_dims = 0;
    for (;;) {
        if (eat(c, ')')) return true;
        skip_ws(c);
        if (c->p >= c->end || *c->p < '0' || *c->p > '9' || *n_dims >= NX_NPY_MAX_DIMS) return false;
        int64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (v > (INT64_MAX - 9) / 10) return false;
            v = v * 10 + (*c->p++ - '0');
        }
        skip_ws(c);
        if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 longs */
        shape[(*n_dims)++] = v;
        if (!eat(c, ',')) {
            if (!eat(c, ')')) return false;
            return true;
        }
    }
}

static nx_status parse_dict(const char *path, const char *h, size_t len, int *n_dims, int64_t *shape,
                            nx_error *err) {
    cursor c = {h, h + len};
    bool have_descr = false, have_order = false, have_shape = false;
    if (!eat(&c, '{')) return nx_fail(err, NX_E_FORMAT, "%s: header is not a dict", path);
    for (;;) {
        if (eat(&c, '}')) break;
        char key[32], val[32];
        if (!read_str(&c, key, sizeof key) || !eat(&c, ':'))
            return nx_fail(err, NX_E_FORMAT, "%s: malformed header dict", path);
        if (strcmp(key, "descr") == 0) {
            if (!read_str(&c, val, sizeof val))
                return nx_fail(err, NX_E_FORMAT, "%s: malformed 'descr'", path);
            if (strcmp(val, "<f4") != 0)
                return nx_fail(err, NX_E_UNSUPPORTED, "%s: dtype '%s' (only '<f4' is supported)", path, val);
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (read_word(&c, "True"))
                return nx_fail(err, NX_E_UNSUPPORTED, "%s: Fortran-order arrays are not supported", path);
            if (!read_word(&c, "False"))
                return nx_fail(err, NX_E_FORMAT, "%s: malformed 'fortran_order'", path);
            have_order = true;
        } else if (strcmp(key, "shape") == 0) {
            if (!read_shape(&c, n_dims, shape))
                return nx_fail(err, NX_E_FORMAT, "%s: malformed 'shape' (at most %d dims)", path,
                               NX_NPY_MAX_DIMS);
            have_shape = true;
        } else {
            return nx_fail(err, NX_E_FORMAT, "%s: unexpected header key '%s'", path, key);
        }
        if (!eat(&c, ',')) {
            if (!eat(&c, '}')) return nx_fail(err, NX_E_FORMAT, "%s: malformed header dict", path);
            break;
        }
    }
    skip_ws(&c);
    if (c.p != c.end) return nx_fail(err, NX_E_FORMAT, "%s: trailing bytes after the header dict", path);
    if (!have_descr || !have_order || !have_shape)
        return nx_fail(err, NX_E_FORMAT, "%s: header lacks descr, fortran_order or shape", path);
    return NX_OK;
}

nx_status nx_npy_read_f32(const char *path, float **data, int *n_dims,
                          int64_t shape[NX_NPY_MAX_DIMS], nx_error *err) {
    *data = NULL;
    *n_dims = 0;
    nx_status st = NX_OK;
    char *hdr = NULL;
    float *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return nx_fail(err, NX_E_IO, "%s: cannot open: %s", path, strerror(errno));
    uint8_t pre[12];
    if (fread(pre, 1, 8, f) != 8 || memcmp(pre, npy_magic, 6) != 0) {
        st = nx_fail(err, NX_E_FORMAT, "%s: not a .npy file (bad magic)", path);
        goto fail;
    }
    size_t hlen, hoff;
    if (pre[6] == 1) {
        if (fread(pre + 8, 1, 2, f) != 2) goto truncated;
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
        hoff = 10;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 8, 1, 4, f) != 4) goto truncated;
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
        hoff = 12;
    } else {
        st = nx_fail(err, NX_E_UNSUPPORTED, "%s: .npy version %d.%d", path, pre[6], pre[7]);
        goto fail;
    }
    if (hlen > (1u << 20)) {
        st = nx_fail(err, NX_E_FORMAT, "%s: header length %zu is implausible", path, hlen);
        goto fail;
    }
    if (!(hdr = malloc(hlen + 1))) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto fail;
    }
    if (fread(hdr, 1, hlen, f) != hlen) goto truncated;
    hdr[hlen] = 0;
    if ((st = parse_dict(path, hdr, hlen, n_dims, shape, err))) goto fail;
    uint64_t count = 1;
    for (int i = 0; i < *n_dims; i++)
        if (__builtin_mul_overflow(count, (uint64_t)shape[i], &count) || count > SIZE_MAX / 4) {
            st = nx_fail(err, NX_E_FORMAT, "%s: shape overflows", path);
            goto fail;
        }
    if (fseek(f, 0, SEEK_END) != 0) {
        st = nx_fail(err, NX_E_IO, "%s: cannot seek", path);
        goto fail;
    }
    long fsize = ftell(f);
    if (fsize < 0 || (uint64_t)fsize < hoff + hlen || (uint64_t)fsize - hoff - hlen != count * 4) {
        st = nx_fail(err, NX_E_FORMAT, "%s: data is %lld bytes, shape needs %llu", path,
                     (long long)fsize - (long long)(hoff + hlen), (unsigned long long)(count * 4));
        goto fail;
    }
    if (fseek(f, (long)(hoff + hlen), SEEK_SET) != 0) goto truncated;
    if (!(buf = malloc(count ? (size_t)count * 4 : 1))) {
        st = nx_fail(err, NX_E_NOMEM, "%s: out of memory for %llu floats", path, (unsigned long long)count);
        goto fail;
    }
    if (count && fread(buf, 4, (size_t)count, f) != (size_t)count) goto truncated;
    fclose(f);
    free(hdr);
    *data = buf;
    return NX_OK;
truncated:
    st = nx_fail(err, NX_E_FORMAT, "%s: truncated", path);
fail:
    if (f) fclose(f);
    free(hdr);
    free(buf);
    *n_dims = 0;
    return st;
}
