/* safetensors reader/writer and the checkpoint-directory tensor store (mmap'd, read-only).
 * Headers come from files we did not write, so every count, offset and size is range- and
 * overflow-checked before a tensor pointer into the mapping is created. */
#include "io/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"

/* ================================================================ header parsing */

static uint64_t read_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

void nx_safetensors_free_parsed(nx_tensor *tensors, size_t n) {
    if (!tensors) return;
    for (size_t i = 0; i < n; i++) free((char *)tensors[i].name);
    free(tensors);
}

typedef struct span {
    uint64_t begin, end;
    size_t idx;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Reads one non-negative JSON integer (shape dims and offsets). */
static bool json_get_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t i = json_integer_value(v);
    if (i < 0) return false;
    *out = (uint64_t)i;
    return true;
}

static nx_status parse_entry(const char *fname, const char *key, json_t *val, const uint8_t *data,
                             uint64_t dlen, nx_tensor *t, span *sp, nx_error *err) {
    if (!json_is_object(val))
        return nx_fail(err, NX_E_FORMAT, "%s: tensor %s: header entry is not an object", fname, key);
    json_t *jd = json_object_get(val, "dtype");
    json_t *js = json_object_get(val, "shape");
    json_t *jo = json_object_get(val, "data_offsets");
    if (!json_is_string(jd))
        return nx_fail(err, NX_E_FORMAT, "%s: tensor %s: missing or non-string \"dtype\"", fname, key);
    int dt = nx_dtype_from_name(json_string_value(jd));
    if (dt < 0) {
        /* valid in other writers (MLX's mxfp scales, complex), but not something we compute with */
        static const char *const foreign[] = {"F8_E8M0", "C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4",
                                              "F6_E2M3", "F6_E3M2"};
        for (size_t i = 0; i < sizeof foreign / sizeof *foreign; i++)
            if (strcmp(json_string_value(jd), foreign[i]) == 0)
                return nx_fail(err, NX_E_UNSUPPORTED, "%s: tensor %s: dtype %s is not supported", fname,
                               key, foreign[i]);
        return nx_fail(err, NX_E_FORMAT, "%s: tensor %s: unknown dtype \"%.32s\"", fname, key,
                       json_string_value(jd));
    }
    if (!json_is_array(js))
        return nx_fail(err, NX_E_FORMAT, "%s: tensor %s: missing or non-array \"shape\"", fname, key);
    size_t nd = json_array_size(js);
    if (nd > NX_ST_MAX_DIMS)
        return nx_fail(err, NX_E_FORMAT, "%s: tensor %s: %zu dimensions (at most %d supported)",
                       fname, key, nd, NX_ST_MAX_DIMS);
    memset(t, 0, sizeof *t);
    t->dtype = (nx_dtype)dt;
    t->n_dims = (int)nd;
    uint64_t count = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!json_get_u64(json_array_get(js, i), &d) || d > (uint64_t)INT64_MAX)
            return nx_fail(err, NX_E_FORMAT, "%s: tensor %s: shape[%zu] is not a non-negative integer",
                           fname, key, i);
        t->shape[i] = (int64_t)d;
        if (__builtin_mul_overflow(count, d, &count))
            return nx_fail(err, NX_E_FORMAT, "%s: tensor %s: element count overflows", fname, key);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(count, (uint64_t)nx_dtype_size(t->dtype), &nbytes) ||
        nbytes > (uint64_t)SIZE_MAX)
        return nx_fail(err, NX_E_FORMAT, "%s: tensor %s: byte size overflows", fname, key);
    uint64_t b, e;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_get_u64(json_array_get(jo, 0), &b) ||
        !json_get_u64(json_array_get(jo, 1), &e))
        return nx_fail(err, NX_E_FORMAT,
                       "%s: tensor %s: \"data_offsets\" must be [begin, end] non-negative integers",
                       fname, key);
    if (b > e || e > dlen)
        return nx_fail(err, NX_E_FORMAT,
                       "%s: tensor %s: data_offsets [%llu, %llu] outside the %llu-byte data buffer",
                       fname, key, (unsigned long long)b, (unsigned long long)e,
                       (unsigned long long)dlen);
    if (e - b != nbytes)
        return nx_fail(err, NX_E_FORMAT,
                       "%s: tensor %s: data_offsets span %llu bytes but shape x %s needs %llu", fname,
                       key, (unsigned long long)(e - b), nx_dtype_name(t->dtype),
                       (unsigned long long)nbytes);
    t->data = data + b;
    t->nbytes = (size_t)nbytes;
    sp->begin = b;
    sp->end = e;
    return NX_OK;
}

static nx_status check_metadata(const char *fname, json_t *val, nx_error *err) {
    if (!json_is_object(val))
        return nx_fail(err, NX_E_FORMAT, "%s: __metadata__ is not an object", fname);
    const char *k;
    json_t *v;
    json_object_foreach(val, k, v) {
        if (!json_is_string(v))
            return nx_fail(err, NX_E_FORMAT, "%s: __metadata__ value of \"%.64s\" is not a string",
                           fname, k);
    }
    return NX_OK;
}

nx_status nx_safetensors_parse(const uint8_t *buf, size_t len, const char *filename,
                               nx_tensor **out, size_t *n_out, nx_error *err) {
    const char *fname = filename ? filename : "<buffer>";
    *out = NULL;
    *n_out = 0;
    if (!buf || len < 8)
        return nx_fail(err, NX_E_FORMAT, "%s: %zu bytes, too short for a safetensors header", fname,
                       buf ? len : 0);
    uint64_t hlen = read_le64(buf);
    if (hlen > NX_ST_MAX_HEADER)
        return nx_fail(err, NX_E_FORMAT, "%s: header length %llu exceeds the 100 MB limit", fname,
                       (unsigned long long)hlen);
    if (hlen > (uint64_t)len - 8)
        return nx_fail(err, NX_E_FORMAT, "%s: header length %llu exceeds the file size %zu (truncated?)",
                       fname, (unsigned long long)hlen, len);
    const uint8_t *data = buf + 8 + hlen;
    uint64_t dlen = (uint64_t)len - 8 - hlen;

    nx_status st = NX_OK;
    nx_tensor *ts = NULL;
    span *spans = NULL;
    size_t n = 0;
    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        st = nx_fail(err, NX_E_FORMAT, "%s: header is not valid JSON (%s at byte %d)", fname, je.text,
                     je.position);
        goto fail;
    }
    if (!json_is_object(root)) {
        st = nx_fail(err, NX_E_FORMAT, "%s: header is not a JSON object", fname);
        goto fail;
    }
    size_t cap = json_object_size(root);
    ts = calloc(cap ? cap : 1, sizeof *ts);
    spans = calloc(cap ? cap : 1, sizeof *spans);
    if (!ts || !spans) {
        st = nx_fail(err, NX_E_NOMEM, "%s: out of memory for %zu tensors", fname, cap);
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((st = check_metadata(fname, val, err)) != NX_OK) goto fail;
            continue;
        }
        if ((st = parse_entry(fname, key, val, data, dlen, &ts[n], &spans[n], err)) != NX_OK)
            goto fail;
        spans[n].idx = n;
        ts[n].name = strdup(key);
        if (!ts[n].name) {
            st = nx_fail(err, NX_E_NOMEM, "%s: out of memory", fname);
            goto fail;
        }
        n++;
    }
    /* Overlap check on non-empty tensors sorted by offset: aliasing tensors would let one
     * "weight" silently be another, which no valid writer produces. */
    qsort(spans, n, sizeof *spans, span_cmp);
    uint64_t prev_end = 0;
    size_t prev = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (spans[i].begin == spans[i].end) continue;
        if (prev != SIZE_MAX && spans[i].begin < prev_end) {
            st = nx_fail(err, NX_E_FORMAT, "%s: tensors %s and %s overlap in the data buffer", fname,
                         ts[prev].name, ts[spans[i].idx].name);
            goto fail;
        }
        prev_end = spans[i].end;
        prev = spans[i].idx;
    }
    free(spans);
    json_decref(root);
    *out = ts;
    *n_out = n;
    return NX_OK;
fail:
    nx_safetensors_free_parsed(ts, n);
    free(spans);
    json_decref(root);
    return st;
}

/* ================================================================ writer */

nx_status nx_safetensors_write(const char *path, const nx_tensor *t, size_t n, int align,
                               const char *metadata_json, nx_error *err) {
    nx_status st = NX_OK;
    json_t *root = json_object();
    char *hdr = NULL;
    FILE *f = NULL;
    if (!root) return nx_fail(err, NX_E_NOMEM, "%s: out of memory", path);
    if (metadata_json) {
        json_error_t je;
        json_t *md = json_loads(metadata_json, 0, &je);
        if (!md || !json_is_object(md)) {
            json_decref(md);
            st = nx_fail(err, NX_E_ARG, "%s: metadata is not a JSON object", path);
            goto fail;
        }
        json_object_set_new(root, "__metadata__", md);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i].n_dims < 0 || t[i].n_dims > NX_ST_MAX_DIMS || (unsigned)t[i].dtype >= NX_DTYPE_COUNT) {
            st = nx_fail(err, NX_E_ARG, "%s: tensor %s: bad dtype or rank", path, t[i].name);
            goto fail;
        }
        uint64_t count = 1;
        json_t *shape = json_array();
        for (int d = 0; d < t[i].n_dims; d++) {
            if (t[i].shape[d] < 0 || __builtin_mul_overflow(count, (uint64_t)t[i].shape[d], &count)) {
                json_decref(shape);
                st = nx_fail(err, NX_E_ARG, "%s: tensor %s: bad shape", path, t[i].name);
                goto fail;
            }
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        }
        if (count * nx_dtype_size(t[i].dtype) != t[i].nbytes) {
            json_decref(shape);
            st = nx_fail(err, NX_E_ARG, "%s: tensor %s: nbytes %zu does not match its shape", path,
                         t[i].name, t[i].nbytes);
            goto fail;
        }
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(nx_dtype_name(t[i].dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets",
                            json_pack("[II]", (json_int_t)off, (json_int_t)(off + t[i].nbytes)));
        if (json_object_set_new(root, t[i].name, e) != 0) {
            st = nx_fail(err, NX_E_ARG, "%s: tensor %s: cannot add to header", path, t[i].name);
            goto fail;
        }
        off += t[i].nbytes;
    }
    hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!hdr) {
        st = nx_fail(err, NX_E_NOMEM, "%s: cannot serialize header", path);
        goto fail;
    }
    size_t hlen = strlen(hdr);
    size_t pad = 0;
    if (align > 1) pad = (size_t)(align - (int)((8 + hlen) % (size_t)align)) % (size_t)align;
    f = fopen(path, "wb");
    if (!f) {
        st = nx_fail(err, NX_E_IO, "%s: cannot create: %s", path, strerror(errno));
        goto fail;
    }
    uint8_t lenb[8];
    uint64_t total = hlen + pad;
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(total >> (8 * i));
    bool ok = fwrite(lenb, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    for (size_t i = 0; ok && i < n; i++)
        ok = t[i].nbytes == 0 || fwrite(t[i].data, 1, t[i].nbytes, f) == t[i].nbytes;
    if (fclose(f) != 0) ok = false;
    f = NULL;
    if (!ok) st = nx_fail(err, NX_E_IO, "%s: write failed: %s", path, strerror(errno));
fail:
    if (f) fclose(f);
    free(hdr);
    json_decref(root);
    return st;
}

/* ================================================================ the store */

typedef struct st_file {
    char *name; /* base name */
    uint8_t *map;
    size_t size;
    int fd;             /* kept open while mapped: its inode is the one mapped (nx_store_check) */
    struct stat loaded; /* its fstat at load */
    nx_tensor *tensors;
    size_t n;
} st_file;

struct nx_store {
    char *dir;
    st_file *files;
    int n_files;
    const nx_tensor **all; /* iteration order */
    size_t n_all;
    const nx_tensor **table; /* open addressing, cap is a power of two */
    size_t cap;
    uint64_t mapped, tensor_bytes;
    /* declared tensors (nx_store_declare): the absent ones, and the reservation they all live in */
    nx_tensor *absent;
    size_t n_absent;
    uint8_t *virt;
    size_t virt_len;
    char *decl_label;
};

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

void nx_store_free(nx_store *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) {
        st_file *f = &st->files[i];
        nx_safetensors_free_parsed(f->tensors, f->n);
        if (f->map) {
            munmap(f->map, f->size);
            close(f->fd);
        }
        free(f->name);
    }
    free(st->files);
    free(st->all);
    free(st->table);
    free(st->dir);
    nx_safetensors_free_parsed(st->absent, st->n_absent);
    if (st->virt) munmap(st->virt, st->virt_len);
    free(st->decl_label);
    free(st);
}

static bool name_is_model_st(const char *s) {
    static const char suf[] = ".safetensors";
    size_t n = strlen(s), ns = sizeof suf - 1;
    return strncmp(s, "model", 5) == 0 && n > ns && strcmp(s + n - ns, suf) == 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A growable list of file base names. */
typedef struct name_list {
    char **v;
    size_t n, cap;
} name_list;

static bool name_list_add(name_list *l, const char *s) {
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->v[i], s) == 0) return true;
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 16;
        char **nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) return false;
        l->v = nv;
        l->cap = nc;
    }
    if (!(l->v[l->n] = strdup(s))) return false;
    l->n++;
    return true;
}

static void name_list_free(name_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
}

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static nx_status map_file(const char *path, bool lazy, st_file *f, nx_error *err) {
    int fd;
    struct stat sb;
    nx_status s = nx_file_open_regular(path, 0, &fd, &sb, err);
    if (s != NX_OK) return s;
    if (sb.st_size < 8) {
        close(fd);
        return nx_fail(err, NX_E_FORMAT, "%s: %lld bytes, too short for a safetensors header", path,
                       (long long)sb.st_size);
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        const int e = errno;
        close(fd);
        return nx_fail(err, NX_E_IO, "%s: mmap failed: %s", path, strerror(e));
    }
    /* lazy: no readahead until the loader says how the weights will be used (nx_store_use):
     * the headers and the few small tensors read while loading must not pull in their
     * neighbours. Otherwise the whole file is read as it is used (readahead, huge pages). */
#ifdef MADV_HUGEPAGE /* Linux */
    (void)madvise(m, (size_t)sb.st_size, lazy ? MADV_RANDOM : MADV_HUGEPAGE);
#else
    (void)madvise(m, (size_t)sb.st_size, lazy ? MADV_RANDOM : MADV_NORMAL);
#endif
    f->map = m;
    f->size = (size_t)sb.st_size;
    f->fd = fd;
    f->loaded = sb;
    return NX_OK;
}

/* Loads the index (kept for check_index) and adds every file its weight_map names. */
static nx_status read_index(const char *path, json_t **root_out, name_list *files, nx_error *err) {
    json_t *root;
    nx_status s = nx_file_load_json(path, JSON_REJECT_DUPLICATES, &root, err);
    if (s != NX_OK) return s;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        json_decref(root);
        return nx_fail(err, NX_E_FORMAT, "%s: missing \"weight_map\" object", path);
    }
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
        const char *fn = json_string_value(v);
        if (!fn || !*fn || strchr(fn, '/') || strcmp(fn, ".") == 0 || strcmp(fn, "..") == 0) {
            /* k belongs to root: format the message before releasing it */
            nx_status st = nx_fail(err, NX_E_FORMAT,
                                   "%s: weight_map[\"%.200s\"] is not a file name in the directory", path, k);
            json_decref(root);
            return st;
        }
        if (!name_list_add(files, fn)) {
            json_decref(root);
            return nx_fail(err, NX_E_NOMEM, "out of memory");
        }
    }
    *root_out = root;
    return NX_OK;
}

static nx_status build_table(nx_store *st, nx_error *err) {
    size_t total = 0;
    for (int i = 0; i < st->n_files; i++) total += st->files[i].n;
    size_t cap = 16;
    while (cap < 2 * total) cap *= 2;
    st->table = calloc(cap, sizeof *st->table);
    st->all = calloc(total ? total : 1, sizeof *st->all);
    if (!st->table || !st->all) return nx_fail(err, NX_E_NOMEM, "out of memory for %zu tensors", total);
    st->cap = cap;
    for (int i = 0; i < st->n_files; i++) {
        st_file *f = &st->files[i];
        for (size_t j = 0; j < f->n; j++) {
            nx_tensor *t = &f->tensors[j];
            t->file = i;
            size_t h = (size_t)hash_str(t->name) & (cap - 1);
            while (st->table[h]) {
                if (strcmp(st->table[h]->name, t->name) == 0)
                    return nx_fail(err, NX_E_FORMAT, "tensor %s is present in both %s and %s", t->name,
                                   st->files[st->table[h]->file].name, f->name);
                h = (h + 1) & (cap - 1);
            }
            st->table[h] = t;
            st->all[st->n_all++] = t;
            st->tensor_bytes += t->nbytes;
        }
    }
    return NX_OK;
}

static bool store_has_file(const nx_store *st, const char *name) {
    for (int i = 0; i < st->n_files; i++)
        if (strcmp(st->files[i].name, name) == 0) return true;
    return false;
}

/* partial: entries whose file was left out (not downloaded) are not checked. */
static nx_status check_index(const nx_store *st, const char *ipath, json_t *index, bool partial, nx_error *err) {
    json_t *wm = json_object_get(index, "weight_map");
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
        const nx_tensor *t = nx_store_find(st, k);
        const char *fn = json_string_value(v);
        if (!t && partial && !store_has_file(st, fn)) continue;
        if (!t)
            return nx_fail(err, NX_E_FORMAT, "%s: tensor %s is mapped to %s but that file does not hold it",
                           ipath, k, fn);
        if (strcmp(st->files[t->file].name, fn) != 0)
            return nx_fail(err, NX_E_FORMAT, "%s: tensor %s is mapped to %s but is stored in %s", ipath,
                           k, fn, st->files[t->file].name);
    }
    return NX_OK;
}

/* A file the index names that is absent from the directory (ENOENT), in partial mode. */
static bool left_out(const char *path, bool partial) {
    struct stat sb;
    return partial && lstat(path, &sb) != 0 && errno == ENOENT;
}

static nx_status store_open(const char *dir, bool partial, bool lazy, nx_store **out, nx_error *err) {
    *out = NULL;
    nx_status st = NX_OK;
    name_list files = {0};
    json_t *index = NULL;
    char *ipath = NULL;
    nx_store *s = calloc(1, sizeof *s);
    if (!s || !(s->dir = strdup(dir))) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto fail;
    }
    DIR *d = opendir(dir);
    if (!d) {
        st = nx_fail(err, NX_E_IO, "%s: cannot open directory: %s", dir, strerror(errno));
        goto fail;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (name_is_model_st(de->d_name) && !name_list_add(&files, de->d_name)) {
            closedir(d);
            st = nx_fail(err, NX_E_NOMEM, "out of memory");
            goto fail;
        }
    }
    closedir(d);
    if (!(ipath = path_join(dir, "model.safetensors.index.json"))) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto fail;
    }
    if (access(ipath, F_OK) == 0 && (st = read_index(ipath, &index, &files, err)) != NX_OK) goto fail;
    if (files.n == 0) {
        st = nx_fail(err, NX_E_IO, "%s: no model*.safetensors files", dir);
        goto fail;
    }
    if (files.n > (size_t)INT32_MAX) {
        st = nx_fail(err, NX_E_FORMAT, "%s: too many files", dir);
        goto fail;
    }
    qsort(files.v, files.n, sizeof *files.v, cmp_str);
    if (!(s->files = calloc(files.n, sizeof *s->files))) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < files.n; i++) {
        char *p = path_join(dir, files.v[i]);
        if (!p) {
            st = nx_fail(err, NX_E_NOMEM, "out of memory");
            goto fail;
        }
        if (left_out(p, partial)) {
            free(p);
            continue;
        }
        st_file *f = &s->files[s->n_files++];
        f->name = files.v[i];
        files.v[i] = NULL;
        st = map_file(p, lazy, f, err);
        if (st == NX_OK) st = nx_safetensors_parse(f->map, f->size, p, &f->tensors, &f->n, err);
        free(p);
        if (st != NX_OK) goto fail;
        s->mapped += f->size;
    }
    if (s->n_files == 0) {
        st = nx_fail(err, NX_E_IO, "%s: none of the model*.safetensors files its index names is present", dir);
        goto fail;
    }
    if ((st = build_table(s, err)) != NX_OK) goto fail;
    if (index && (st = check_index(s, ipath, index, partial, err)) != NX_OK) goto fail;
    name_list_free(&files);
    json_decref(index);
    free(ipath);
    *out = s;
    return NX_OK;
fail:
    name_list_free(&files);
    json_decref(index);
    free(ipath);
    nx_store_free(s);
    return st;
}

nx_status nx_store_open(const char *dir, nx_store **out, nx_error *err) {
    return store_open(dir, false, false, out, err);
}

nx_status nx_store_open_lazy(const char *dir, nx_store **out, nx_error *err) {
    return store_open(dir, false, true, out, err);
}

nx_status nx_store_open_partial(const char *dir, nx_store **out, nx_error *err) {
    return store_open(dir, true, false, out, err);
}

const nx_tensor *nx_store_find(const nx_store *st, const char *name) {
    if (!st || !name || !st->cap) return NULL;
    size_t h = (size_t)hash_str(name) & (st->cap - 1);
    while (st->table[h]) {
        if (strcmp(st->table[h]->name, name) == 0) return st->table[h];
        h = (h + 1) & (st->cap - 1);
    }
    return NULL;
}

size_t nx_store_count(const nx_store *st) { return st ? st->n_all : 0; }

const nx_tensor *nx_store_tensor(const nx_store *st, size_t i) {
    return st && i < st->n_all ? st->all[i] : NULL;
}

int nx_store_n_files(const nx_store *st) { return st ? st->n_files : 0; }

const char *nx_store_file_name(const nx_store *st, int file) {
    return st && file >= 0 && file < st->n_files ? st->files[file].name : NULL;
}

const char *nx_store_file_of(const nx_store *st, const nx_tensor *t) {
    if (t && t->file < 0) return st->decl_label; /* declared absent */
    return t ? nx_store_file_name(st, t->file) : NULL;
}

const char *nx_store_dir(const nx_store *st) { return st ? st->dir : NULL; }

uint64_t nx_store_mapped_bytes(const nx_store *st) { return st ? st->mapped : 0; }

uint64_t nx_store_tensor_bytes(const nx_store *st) { return st ? st->tensor_bytes : 0; }

nx_status nx_store_check(const nx_store *st, nx_error *err) {
    for (int i = 0; i < st->n_files; i++) {
        const st_file *f = &st->files[i];
        struct stat now = {0};
        if (!f->map) continue;
        const bool same = fstat(f->fd, &now) == 0 && now.st_size == f->loaded.st_size &&
                          now.st_mtim.tv_sec == f->loaded.st_mtim.tv_sec &&
                          now.st_mtim.tv_nsec == f->loaded.st_mtim.tv_nsec;
        if (!same)
            return nx_fail(err, NX_E_IO,
                           "model file %s/%s changed on disk since load (%lld bytes then, %lld now); the mapped "
                           "weights are no longer what was loaded: restart, and replace checkpoints by rename",
                           st->dir, f->name, (long long)f->loaded.st_size, (long long)now.st_size);
    }
    return NX_OK;
}

/* ================================================================ residency */

/* The file whose mapping holds [p, p + n), or NULL. */
static const st_file *file_of_ptr(const nx_store *st, const void *p, size_t n) {
    const uint8_t *b = p;
    for (int i = 0; st && i < st->n_files; i++) {
        const st_file *f = &st->files[i];
        if (f->map && b >= f->map && n <= f->size && (size_t)(b - f->map) <= f->size - n) return f;
    }
    return NULL;
}

/* [p, p + n) widened to whole pages. */
static void page_span(const void *p, size_t n, uint8_t **a, size_t *len) {
    const long pg = sysconf(_SC_PAGESIZE);
    const uintptr_t ps = (uintptr_t)(pg > 0 ? pg : 4096), lo = (uintptr_t)p & ~(ps - 1);
    const uintptr_t hi = ((uintptr_t)p + n + ps - 1) & ~(ps - 1);
    *a = (uint8_t *)lo;
    *len = hi - lo;
}

void nx_store_use(const nx_store *st, const void *p, size_t n) {
    if (!n || !file_of_ptr(st, p, n)) return;
    uint8_t *a;
    size_t len;
    page_span(p, n, &a, &len);
    (void)madvise(a, len, MADV_NORMAL);
    /* Huge pages where the kernel can: a file system that caches files in large folios then
     * reads the file in 2 MB folios, and the kernel maps them with 2 MB page-table entries (the
     * TLB then covers the whole model; 4-bit decode streams ~3% faster). Only a hint. */
#ifdef MADV_HUGEPAGE /* Linux */
    (void)madvise(a, len, MADV_HUGEPAGE);
#endif
}

/* Reads the pages of [a, a + len) (whole pages) in and maps them. Kernels without
 * MADV_POPULATE_READ (before 5.14) get the same by one read per page, as do other systems. */
static void populate(uint8_t *a, size_t len) {
#if defined(__linux__) && !defined(MADV_POPULATE_READ)
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif
#ifdef MADV_POPULATE_READ
    if (madvise(a, len, MADV_POPULATE_READ) == 0) return;
#endif
    const long pg = sysconf(_SC_PAGESIZE);
    const volatile uint8_t *b = a;
    for (size_t o = 0; o < len; o += (size_t)(pg > 0 ? pg : 4096)) (void)b[o];
}

void nx_store_prefault(const nx_store *st, const void *p, size_t n) {
    if (!n || !file_of_ptr(st, p, n)) return;
    uint8_t *a;
    size_t len;
    nx_store_use(st, p, n);
    page_span(p, n, &a, &len);
    populate(a, len);
}

nx_status nx_store_lock(const nx_store *st, const void *p, size_t n, nx_error *err) {
    if (!n || !file_of_ptr(st, p, n)) return NX_OK;
    uint8_t *a;
    size_t len;
    page_span(p, n, &a, &len);
    if (mlock(a, len) != 0)
        return nx_fail(err, NX_E_NOMEM, "cannot lock %zu bytes of weights in memory: %s (see ulimit -l)", len,
                       strerror(errno));
    return NX_OK;
}

#define HUGE_2MB ((size_t)2 << 20)

#ifdef __linux__
/* Resident and 2 MB-mapped kilobytes of this process's mappings that overlap each of n ranges
 * [a[i], a[i] + len[i]) (a mapping counted whole in every range it overlaps; in: n flags of
 * scratch), from one pass over /proc/self/smaps (reading it walks the page tables of every
 * mapping); false where it cannot be read or no mapping overlaps any range. */
static bool smaps_kb(int n, uint8_t *const *a, const size_t *len, bool *in, uint64_t *rss, uint64_t *pmd) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return false;
    char line[4352]; /* a mapping's line ends with its path (PATH_MAX) */
    bool seen = false;
    unsigned long long lo, hi, v;
    for (int i = 0; i < n; i++) rss[i] = pmd[i] = 0, in[i] = false;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            for (int i = 0; i < n; i++) {
                in[i] = (uintptr_t)lo < (uintptr_t)(a[i] + len[i]) && (uintptr_t)hi > (uintptr_t)a[i];
                seen |= in[i];
            }
        } else if (sscanf(line, "Rss: %llu kB", &v) == 1) {
            for (int i = 0; i < n; i++) rss[i] += in[i] ? v : 0;
        } else if (sscanf(line, "FilePmdMapped: %llu kB", &v) == 1) {
            for (int i = 0; i < n; i++) pmd[i] += in[i] ? v : 0;
        }
    }
    fclose(f);
    return seen;
}

/* Every file's resident and 2 MB-mapped kilobytes (arrays of st->n_files); false where unknown. */
static bool store_kb(const nx_store *st, uint64_t **rss, uint64_t **pmd) {
    const int n = st ? st->n_files : 0;
    uint8_t **a = malloc(sizeof *a * (size_t)(n + 1));
    size_t *len = malloc(sizeof *len * (size_t)(n + 1));
    bool *in = malloc(sizeof *in * (size_t)(n + 1));
    *rss = malloc(sizeof **rss * (size_t)(n + 1));
    *pmd = malloc(sizeof **pmd * (size_t)(n + 1));
    bool ok = n > 0 && a && len && in && *rss && *pmd;
    for (int i = 0; ok && i < n; i++) a[i] = st->files[i].map, len[i] = st->files[i].map ? st->files[i].size : 0;
    ok = ok && smaps_kb(n, a, len, in, *rss, *pmd);
    free(a), free(len), free(in);
    if (!ok) free(*rss), free(*pmd), *rss = *pmd = NULL;
    return ok;
}
#endif

double nx_store_huge_share(const nx_store *st, double *share) {
#ifdef __linux__
    uint64_t *rss, *pmd, r = 0, p = 0;
    if (!store_kb(st, &rss, &pmd)) return -1;
    for (int i = 0; i < st->n_files; i++) {
        r += rss[i], p += pmd[i];
        if (share) share[i] = rss[i] ? (double)pmd[i] / (double)rss[i] : -1;
    }
    free(rss), free(pmd);
    return r ? (double)p / (double)r : -1;
#else
    (void)st, (void)share;
    return -1;
#endif
}

/* The first 2 MB boundary of file f's mapping at or past its header, whose pages the loader
 * maps apart (their length was checked when the file was opened). */
static uint8_t *past_header(const st_file *f) {
    return (uint8_t *)(((uintptr_t)f->map + 8 + (uintptr_t)read_le64(f->map) + HUGE_2MB - 1) &
                       ~(uintptr_t)(HUGE_2MB - 1));
}

void nx_store_read_in(const nx_store *st, int file) {
    if (!st || file < 0 || file >= st->n_files || !st->files[file].map) return;
    const st_file *f = &st->files[file];
    uint8_t *lo = past_header(f);
    if (lo > f->map + f->size) lo = f->map + f->size;
    populate(lo, (size_t)(f->map + f->size - lo));
    populate(f->map, (size_t)(lo - f->map));
}

#ifdef __linux__
/* Drops [w, w + n) of file f from this mapping and from the page cache (its dirty pages written
 * first: a dirty page is not dropped). */
static void drop(const st_file *f, uint8_t *w, size_t n) {
    const off_t off = (off_t)(w - f->map);
    (void)sync_file_range(f->fd, off, (off_t)n,
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    (void)madvise(w, n, MADV_DONTNEED);
    (void)posix_fadvise(f->fd, off, (off_t)n, POSIX_FADV_DONTNEED);
}
#endif

#if defined(__linux__) && defined(MADV_HUGEPAGE)
/* The probe of window [w, w + 2 MB) of file f, made a mapping of its own for the time (another
 * read-ahead advice splits it off; its borders are 2 MB-aligned, so no 2 MB page straddles them)
 * so smaps counts it alone: 1 when it was on 4 KB pages and comes back on one 2 MB page once
 * dropped and read again, 0 when it does not, -1 when it already was on a 2 MB page. */
static int probe_window(const st_file *f, uint8_t *w) {
    const size_t wl = HUGE_2MB;
    uint64_t rss, before, after;
    bool in;
    int r = 0;
    if (madvise(w, HUGE_2MB, MADV_SEQUENTIAL) == 0 && smaps_kb(1, &w, &wl, &in, &rss, &before)) {
        if (before >= HUGE_2MB / 1024) {
            r = -1;
        } else {
            drop(f, w, HUGE_2MB);
            populate(w, HUGE_2MB);
            r = smaps_kb(1, &w, &wl, &in, &rss, &after) && after >= HUGE_2MB / 1024;
        }
    }
    (void)madvise(w, HUGE_2MB, MADV_NORMAL);
    return r;
}
#endif

bool nx_store_recache(const nx_store *st, int file) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (!st || file < 0 || file >= st->n_files || !st->files[file].map) return false;
    const st_file *f = &st->files[file];
    /* windows at 1/2, 1/4, 3/4, 1/8, ... of the file until one on 4 KB pages is found (a file
     * partly evicted and read back holds its 4 KB pages in places), past the header, whose pages
     * the loader maps apart (map_file checked its length fits the file) */
    const uint8_t *lo = past_header(f);
    int r = -1;
    for (int d = 2; d <= 16 && r < 0; d *= 2)
        for (int j = 1; j < d && r < 0; j += 2) {
            uint8_t *w = (uint8_t *)(((uintptr_t)f->map + f->size / (size_t)d * (size_t)j) & ~(uintptr_t)(HUGE_2MB - 1));
            if (w >= lo && w + HUGE_2MB <= f->map + f->size) r = probe_window(f, w);
        }
    if (r == 1) {
        drop(f, f->map, f->size);
        nx_store_read_in(st, file);
    }
    return r == 1;
#else
    (void)st, (void)file;
    return false;
#endif
}

bool nx_store_locate(const nx_store *st, const void *p, size_t n, int *file, int *fd, uint64_t *off) {
    const st_file *f = file_of_ptr(st, p, n);
    if (!f) return false;
    *file = (int)(f - st->files);
    *fd = f->fd;
    *off = (uint64_t)((const uint8_t *)p - f->map);
    return true;
}

/* ================================================================ declared tensors */

/* Full size of a declared tensor, or false on a bad shape or overflow. */
static bool decl_bytes(const nx_tensor_decl *d, uint64_t *out) {
    if (d->n_dims < 1 || d->n_dims > NX_ST_MAX_DIMS || (int)d->dtype < 0 || (int)d->dtype >= NX_DTYPE_COUNT) return false;
    uint64_t n = nx_dtype_size(d->dtype);
    for (int i = 0; i < d->n_dims; i++) {
        if (d->shape[i] < 0 || (d->shape[i] && n > UINT64_MAX / (uint64_t)d->shape[i] / 2)) return false;
        n *= (uint64_t)d->shape[i];
    }
    *out = n;
    return true;
}

/* Rows [lo, hi) of d held by the store as tensor t of hi - lo rows: t becomes the whole tensor at
 * base, its rows mapped from the file where a whole tensor's would be (the mapping starts at the
 * page holding the rows' first byte, so base is placed in its region with the rows' file offset
 * modulo the page size). */
static nx_status declare_rows(nx_store *st, nx_tensor *t, const nx_tensor_decl *d, uint64_t full, uint8_t *region,
                              size_t ps, nx_error *err) {
    const int64_t rows = d->rows_hi - d->rows_lo;
    bool same = t->dtype == d->dtype && t->n_dims == d->n_dims && t->shape[0] == rows;
    for (int i = 1; same && i < d->n_dims; i++) same = t->shape[i] == d->shape[i];
    if (!same || d->rows_lo < 0 || d->rows_hi > d->shape[0] || rows <= 0 || t->nbytes == 0)
        return nx_fail(err, NX_E_FORMAT, "tensor %s (%s): not rows %lld-%lld of the %s [%lld, ...] that %s declares",
                       t->name, nx_store_file_of(st, t), (long long)d->rows_lo, (long long)d->rows_hi,
                       nx_dtype_name(d->dtype), (long long)d->shape[0], st->decl_label);
    const st_file *f = &st->files[t->file];
    const size_t stride = t->nbytes / (size_t)rows, off = (size_t)(t->data - f->map), head = off % ps;
    const size_t at = (size_t)d->rows_lo * stride, delta = (head + ps - at % ps) % ps;
    uint8_t *base = region + delta, *page = base + at - head;
    if (mmap(page, t->nbytes + head, PROT_READ, MAP_PRIVATE | MAP_FIXED, f->fd, (off_t)(off - head)) == MAP_FAILED)
        return nx_fail(err, NX_E_IO, "%s/%s: mapping rows of %s failed: %s", st->dir, f->name, t->name, strerror(errno));
    st->tensor_bytes += full - t->nbytes;
    t->shape[0] = d->shape[0];
    t->data = base;
    t->nbytes = (size_t)full;
    return NX_OK;
}

/* Every tensor (read and declared) into a fresh hash table. */
static nx_status rebuild_table(nx_store *st, nx_error *err) {
    size_t cap = 16;
    while (cap < 2 * st->n_all) cap *= 2;
    const nx_tensor **table = calloc(cap, sizeof *table);
    if (!table) return nx_fail(err, NX_E_NOMEM, "out of memory for %zu tensors", st->n_all);
    for (size_t i = 0; i < st->n_all; i++) {
        size_t h = (size_t)hash_str(st->all[i]->name) & (cap - 1);
        while (table[h]) h = (h + 1) & (cap - 1);
        table[h] = st->all[i];
    }
    free(st->table);
    st->table = table;
    st->cap = cap;
    return NX_OK;
}

nx_status nx_store_declare(nx_store *st, const nx_tensor_decl *d, size_t n, const char *label, nx_error *err) {
    if (st->virt) return nx_fail(err, NX_E_STATE, "%s: the store's tensors were declared already", label);
    if (!(st->decl_label = strdup(label))) return nx_fail(err, NX_E_NOMEM, "out of memory");
    const long pl = sysconf(_SC_PAGESIZE);
    const size_t ps = (size_t)(pl > 0 ? pl : 4096);
    uint64_t total = 0, b;
    for (size_t i = 0; i < n; i++) {
        if (!d[i].name || !decl_bytes(&d[i], &b) || b > UINT64_MAX / 4 - total)
            return nx_fail(err, NX_E_FORMAT, "%s: tensor %s: a bad dtype or shape", label, d[i].name ? d[i].name : "?");
        total += (b + 2 * ps - 1) / ps * ps;
    }
    if (!total) return NX_OK;
    /* absent bytes read as zeros: untouched private anonymous pages cost no memory */
    void *v = mmap(NULL, (size_t)total, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (v == MAP_FAILED) return nx_fail(err, NX_E_NOMEM, "%s: reserving %llu bytes of address space failed: %s",
                                        label, (unsigned long long)total, strerror(errno));
    st->virt = v;
    st->virt_len = (size_t)total;
    const nx_tensor **all = realloc(st->all, (st->n_all + n + 1) * sizeof *all);
    if (!all || !(st->absent = calloc(n + 1, sizeof *st->absent))) {
        if (all) st->all = all;
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    }
    st->all = all;
    uint8_t *region = st->virt;
    nx_status s = NX_OK;
    for (size_t i = 0; i < n && s == NX_OK; i++) {
        decl_bytes(&d[i], &b);
        nx_tensor *t = (nx_tensor *)nx_store_find(st, d[i].name);
        if (d[i].rows_hi > d[i].rows_lo) {
            s = t ? declare_rows(st, t, &d[i], b, region, ps, err)
                  : nx_fail(err, NX_E_FORMAT, "missing tensor %s (rows %lld-%lld of it, declared by %s)", d[i].name,
                            (long long)d[i].rows_lo, (long long)d[i].rows_hi, label);
        } else if (t) {
            s = nx_fail(err, NX_E_FORMAT, "%s: declares tensor %s absent, but %s holds it", label, d[i].name,
                        nx_store_file_of(st, t));
        } else {
            nx_tensor *a = &st->absent[st->n_absent];
            if (!(a->name = strdup(d[i].name))) return nx_fail(err, NX_E_NOMEM, "out of memory");
            st->n_absent++;
            a->dtype = d[i].dtype;
            a->n_dims = d[i].n_dims;
            memcpy(a->shape, d[i].shape, sizeof a->shape);
            a->data = region;
            a->nbytes = (size_t)b;
            a->file = -1;
            st->all[st->n_all++] = a;
            st->tensor_bytes += b;
        }
        region += (b + 2 * ps - 1) / ps * ps;
    }
    return s == NX_OK ? rebuild_table(st, err) : s;
}

bool nx_store_holds(const nx_store *st, const nx_tensor *t) {
    (void)st;
    return t && t->file >= 0;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp((*(const nx_tensor *const *)a)->name, (*(const nx_tensor *const *)b)->name);
}

uint64_t nx_store_digest(const nx_store *st) {
    const nx_tensor **v = malloc((st->n_all + 1) * sizeof *v);
    if (!v) return 0;
    memcpy(v, st->all, st->n_all * sizeof *v);
    qsort(v, st->n_all, sizeof *v, cmp_tensor_name);
    uint64_t h = 1469598103934665603ull;
#define MIX(x) (h = (h ^ (uint64_t)(x)) * 1099511628211ull)
    for (size_t i = 0; i < st->n_all; i++) {
        for (const char *c = v[i]->name; *c; c++) MIX((uint8_t)*c);
        MIX(0x100 + v[i]->dtype);
        for (int k = 0; k < v[i]->n_dims; k++) MIX(v[i]->shape[k]);
        MIX(0x200 + v[i]->n_dims);
    }
#undef MIX
    free(v);
    return h;
}
