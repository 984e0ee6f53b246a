/* One rank's share of a checkpoint: what each rank reads, cutting the shares (`nextn shard`), and
 * loading one (share.h, docs/multinode.md). */
#include "model/share.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "dist/dist.h"
#include "io/safetensors.h"
#include "model/model_internal.h"
#include "model/split.h"

#define SHARE_FILE "nextn-share.json"

/* ---------------------------------------------------------------- what each rank reads */

/* The trunk layer a tensor belongs to ("layers.N." in its name), n_layers for the MTP head's
 * ("mtp." names, or a layer past the trunk), -1 for the rest (embedding, final norm, lm_head). */
static int32_t layer_of(const nx_model *m, const char *name) {
    const int32_t N = m->cfg.n_layers;
    if (!strncmp(name, "mtp.", 4)) return N;
    for (const char *p = strstr(name, "layers."); p; p = strstr(p + 1, "layers.")) {
        if (p != name && p[-1] != '.') continue;
        if (!isdigit((unsigned char)p[7])) continue;
        char *end;
        const long v = strtol(p + 7, &end, 10);
        if (*end == '.') return v >= N ? N : (int32_t)v;
    }
    return -1;
}

/* A routed expert's tensor: its id (per-expert tensors), -2 (stacked over the experts), else -1. */
static int64_t routed_of(const char *name) {
    const char *p = strstr(name, ".mlp.experts.");
    if (p) return isdigit((unsigned char)p[13]) ? strtoll(p + 13, NULL, 10) : -2;
    return strstr(name, ".mlp.switch_mlp.") ? -2 : -1;
}

/* Routed experts of layer l (n_layers: the MTP head's), 0 for a dense layer. */
static int32_t experts_of(const nx_model *m, int32_t l) {
    const nx_layer *L = l < m->cfg.n_layers ? &m->w.layers[l] : m->w.has_mtp ? &m->w.mtp.layer : NULL;
    return L && L->is_moe ? L->moe.n_experts : 0;
}

enum { OWN_NONE, OWN_ALL, OWN_ROWS };

/* What rank r of R reads of tensor t: none, all of it, or rows [*r0, *r1) of a stacked expert
 * tensor (the range nx_split_experts_of gives the rank). lo: the pipeline's layer ranges. */
static int owns(const nx_model *m, const nx_tensor *t, nx_split split, int R, int r, const int32_t *lo, int64_t *r0,
                int64_t *r1) {
    const int32_t l = layer_of(m, t->name), N = m->cfg.n_layers;
    if (split == NX_SPLIT_PIPELINE) {
        if (l >= 0 && l < N) return lo[r] <= l && l < lo[r + 1] ? OWN_ALL : OWN_NONE;
        if (l < 0 && strstr(t->name, "embed_tokens.")) return r == 0 || r == R - 1 ? OWN_ALL : OWN_NONE;
        return r == R - 1 ? OWN_ALL : OWN_NONE; /* the head's: final norm, lm_head, MTP */
    }
    const int64_t e = routed_of(t->name), E = l >= 0 ? experts_of(m, l) : 0;
    if (e == -1 || E <= 0) return OWN_ALL;
    const int64_t e0 = E * r / R, e1 = E * (r + 1) / R;
    if (e >= 0) return e >= e0 && e < e1 ? OWN_ALL : OWN_NONE;
    if (t->n_dims < 2 || t->shape[0] != E) return OWN_ALL; /* not one row block per expert */
    *r0 = e0;
    *r1 = e1;
    return e0 < e1 ? OWN_ROWS : OWN_NONE;
}

/* ---------------------------------------------------------------- cutting the shares */

/* dir/name into buf[PATH_MAX]; false when it does not fit. */
static bool path_in(char *buf, const char *dir, const char *name) {
    const int n = snprintf(buf, PATH_MAX, "%s/%s", dir, name);
    return n > 0 && n < PATH_MAX;
}

static json_t *shape_json(const nx_tensor *t) {
    json_t *a = json_array();
    for (int i = 0; i < t->n_dims; i++) json_array_append_new(a, json_integer(t->shape[i]));
    return a;
}

static json_t *decl_json(const nx_tensor *t) {
    return json_pack("{s:s, s:s, s:o}", "name", t->name, "dtype", nx_dtype_name(t->dtype), "shape", shape_json(t));
}

/* The files a share copies from the source as they are: config, tokenizer, chat template. */
static bool copied_file(const char *name) {
    static const char *const suffixes[] = {".json", ".jinja", ".txt", ".model", ".tiktoken"};
    if (!strcmp(name, "model.safetensors.index.json") || !strcmp(name, SHARE_FILE)) return false;
    const size_t n = strlen(name);
    for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
        const size_t k = strlen(suffixes[i]);
        if (n > k && !strcmp(name + n - k, suffixes[i])) return true;
    }
    return false;
}

static nx_status copy_file(const char *from, const char *to, nx_error *err) {
    char *buf;
    size_t len;
    nx_status st = nx_file_read_all(from, (size_t)1 << 30, &buf, &len, err);
    if (st != NX_OK) return st;
    FILE *f = fopen(to, "wb");
    const bool ok = f && fwrite(buf, 1, len, f) == len;
    const bool closed = f && fclose(f) == 0;
    free(buf);
    return ok && closed ? NX_OK : nx_fail(err, NX_E_IO, "%s: cannot write: %s", to, strerror(errno));
}

static nx_status copy_small_files(const char *src, const char *dst, nx_error *err) {
    DIR *d = opendir(src);
    if (!d) return nx_fail(err, NX_E_IO, "%s: cannot open directory: %s", src, strerror(errno));
    nx_status st = NX_OK;
    char from[PATH_MAX], to[PATH_MAX];
    for (struct dirent *de; st == NX_OK && (de = readdir(d));) {
        struct stat sb;
        if (!copied_file(de->d_name) || !path_in(from, src, de->d_name) || stat(from, &sb) != 0 ||
            !S_ISREG(sb.st_mode))
            continue;
        st = path_in(to, dst, de->d_name) ? copy_file(from, to, err)
                                          : nx_fail(err, NX_E_ARG, "%s: path too long", dst);
    }
    closedir(d);
    return st;
}

typedef struct cut {
    const nx_model *m;
    nx_split split;
    int R, r;
    const int32_t *lo;
    json_t *absent, *rows, *weight_map;
    uint64_t bytes;
} cut;

/* The tensors of source file f that rank c->r reads, written to dir under the file's name. */
static nx_status cut_file(cut *c, int f, const char *dir, nx_error *err) {
    const nx_store *st = c->m->store;
    const size_t n = nx_store_count(st);
    nx_tensor *out = calloc(n + 1, sizeof *out);
    if (!out) return nx_fail(err, NX_E_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const nx_tensor *t = nx_store_tensor(st, i);
        int64_t r0 = 0, r1 = 0;
        if (t->file != f) continue;
        const int own = owns(c->m, t, c->split, c->R, c->r, c->lo, &r0, &r1);
        if (own == OWN_NONE) {
            json_array_append_new(c->absent, decl_json(t));
            continue;
        }
        out[k] = *t;
        if (own == OWN_ROWS) {
            const size_t stride = t->nbytes / (size_t)t->shape[0];
            out[k].shape[0] = r1 - r0;
            out[k].data = t->data + (size_t)r0 * stride;
            out[k].nbytes = (size_t)(r1 - r0) * stride;
            json_t *d = decl_json(t);
            json_object_set_new(d, "rows", json_pack("[I, I]", (json_int_t)r0, (json_int_t)r1));
            json_array_append_new(c->rows, d);
        }
        nx_store_use(st, out[k].data, out[k].nbytes); /* read ahead: the copy streams it */
        json_object_set_new(c->weight_map, t->name, json_string(nx_store_file_name(st, f)));
        c->bytes += out[k++].nbytes;
    }
    nx_status s = NX_OK;
    if (k) {
        char path[PATH_MAX];
        s = path_in(path, dir, nx_store_file_name(st, f)) ? nx_safetensors_write(path, out, k, 8, NULL, err)
                                                          : nx_fail(err, NX_E_ARG, "%s: path too long", dir);
    }
    free(out);
    return s;
}

static nx_status write_json(json_t *j, const char *dir, const char *name, nx_error *err) {
    char path[PATH_MAX];
    if (!path_in(path, dir, name)) return nx_fail(err, NX_E_ARG, "%s: path too long", dir);
    return json_dump_file(j, path, JSON_INDENT(1) | JSON_SORT_KEYS) == 0
               ? NX_OK
               : nx_fail(err, NX_E_IO, "%s: cannot write: %s", path, strerror(errno));
}

static nx_status cut_rank(cut *c, const char *src, const char *out, uint64_t digest, nx_error *err) {
    const nx_model *m = c->m;
    char dir[PATH_MAX], hex[17];
    snprintf(dir, sizeof dir, "%s/rank-%d", out, c->r);
    if (mkdir(dir, 0755) != 0)
        return nx_fail(err, NX_E_IO, "%s: %s", dir,
                       errno == EEXIST ? "exists (remove it, or shard into another directory)" : strerror(errno));
    nx_status st = copy_small_files(src, dir, err);
    c->absent = json_array();
    c->rows = json_array();
    c->weight_map = json_object();
    for (int f = 0; st == NX_OK && f < nx_store_n_files(m->store); f++) st = cut_file(c, f, dir, err);
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)digest);
    json_t *info = json_pack("{s:s, s:i, s:s, s:i, s:i, s:s, s:s, s:o, s:o}", "format", "nextn-share", "version", 1,
                             "split", c->split == NX_SPLIT_PIPELINE ? "pipeline" : "experts", "ranks", c->R, "rank",
                             c->r, "source", src, "source_digest", hex, "absent", c->absent, "rows", c->rows);
    if (c->split == NX_SPLIT_PIPELINE) {
        json_object_set_new(info, "layers", json_pack("[i, i]", c->lo[c->r], c->lo[c->r + 1]));
        json_object_set_new(info, "head", json_boolean(c->r == c->R - 1));
    } else {
        const int64_t E = m->cfg.n_experts;
        json_object_set_new(info, "experts", json_pack("[I, I, I]", (json_int_t)(E * c->r / c->R),
                                                       (json_int_t)(E * (c->r + 1) / c->R), (json_int_t)E));
    }
    json_t *index = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)c->bytes, "weight_map",
                              c->weight_map);
    if (st == NX_OK) st = write_json(index, dir, "model.safetensors.index.json", err);
    if (st == NX_OK) st = write_json(info, dir, SHARE_FILE, err);
    json_decref(index);
    json_decref(info);
    return st;
}

nx_status nx_model_shard(const char *src, const char *out, nx_split split, int ranks, uint64_t *bytes,
                         uint64_t *src_bytes, nx_error *err) {
    char path[PATH_MAX], real[PATH_MAX];
    if (split != NX_SPLIT_PIPELINE && split != NX_SPLIT_EXPERTS)
        return nx_fail(err, NX_E_ARG, "shard: the split is pipeline or experts");
    if (ranks < 2 || ranks > 64) return nx_fail(err, NX_E_ARG, "shard: %d ranks (2 to 64)", ranks);
    snprintf(path, sizeof path, "%s/" SHARE_FILE, src);
    if (access(path, F_OK) == 0) return nx_fail(err, NX_E_ARG, "%s: a share is not cut again (shard the source)", path);
    if (!realpath(src, real)) return nx_fail(err, NX_E_IO, "%s: %s", src, strerror(errno));
    if (mkdir(out, 0755) != 0 && errno != EEXIST) return nx_fail(err, NX_E_IO, "%s: %s", out, strerror(errno));
    nx_load_params p;
    nx_load_params_default(&p);
    p.prefault = NX_PREFAULT_NEVER;
    p.n_threads = 1;
    nx_model *m;
    nx_status st = nx_model_load(src, &p, &m, err);
    if (st != NX_OK) return st;
    int32_t lo[65];
    if (split == NX_SPLIT_PIPELINE) st = nx_split_plan(m, ranks, lo, err);
    const uint64_t digest = nx_store_digest(m->store);
    if (src_bytes) *src_bytes = nx_store_tensor_bytes(m->store);
    for (int r = 0; st == NX_OK && r < ranks; r++) {
        cut c = {.m = m, .split = split, .R = ranks, .r = r, .lo = lo};
        st = cut_rank(&c, real, out, digest, err);
        if (bytes) bytes[r] = c.bytes;
    }
    nx_model_free(m);
    return st;
}

/* ---------------------------------------------------------------- loading a share */

const char *nx_share_dir(const char *dir, int rank, char *buf, size_t cap) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, F_OK) == 0) return dir;
    snprintf(path, sizeof path, "%s/rank-%d/config.json", dir, rank);
    if (access(path, F_OK) != 0) return dir;
    snprintf(buf, cap, "%s/rank-%d", dir, rank);
    return buf;
}

/* One entry of "absent" or "rows" as a declaration (its name stays the JSON's). */
static bool decl_of(json_t *e, bool rows, nx_tensor_decl *d) {
    json_t *shape = json_object_get(e, "shape"), *rr = json_object_get(e, "rows");
    const char *dt = json_string_value(json_object_get(e, "dtype"));
    memset(d, 0, sizeof *d);
    d->name = json_string_value(json_object_get(e, "name"));
    const int dtype = dt ? nx_dtype_from_name(dt) : -1;
    if (!d->name || dtype < 0 || !json_is_array(shape) || json_array_size(shape) < 1 ||
        json_array_size(shape) > NX_ST_MAX_DIMS)
        return false;
    d->dtype = (nx_dtype)dtype;
    d->n_dims = (int)json_array_size(shape);
    for (int i = 0; i < d->n_dims; i++) {
        json_t *v = json_array_get(shape, (size_t)i);
        if (!json_is_integer(v)) return false;
        d->shape[i] = json_integer_value(v);
    }
    if (!rows) return true;
    if (!json_is_array(rr) || json_array_size(rr) != 2 || !json_is_integer(json_array_get(rr, 0)) ||
        !json_is_integer(json_array_get(rr, 1)))
        return false;
    d->rows_lo = json_integer_value(json_array_get(rr, 0));
    d->rows_hi = json_integer_value(json_array_get(rr, 1));
    return d->rows_hi > d->rows_lo;
}

static nx_status declare(nx_model *m, json_t *j, const char *path, nx_error *err) {
    json_t *absent = json_object_get(j, "absent"), *rows = json_object_get(j, "rows");
    if (!json_is_array(absent) || !json_is_array(rows))
        return nx_fail(err, NX_E_FORMAT, "%s: \"absent\" and \"rows\" must be arrays", path);
    const size_t na = json_array_size(absent), n = na + json_array_size(rows);
    nx_tensor_decl *d = calloc(n + 1, sizeof *d);
    if (!d) return nx_fail(err, NX_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const bool r = i >= na;
        if (!decl_of(json_array_get(r ? rows : absent, r ? i - na : i), r, &d[i])) {
            free(d);
            return nx_fail(err, NX_E_FORMAT, "%s: entry %zu of \"%s\" is not {\"name\", \"dtype\", \"shape\"%s}", path,
                           r ? i - na : i, r ? "rows" : "absent", r ? ", \"rows\": [lo, hi]" : "");
        }
    }
    const nx_status st = nx_store_declare(m->store, d, n, SHARE_FILE, err);
    free(d);
    return st;
}

/* The share's header fields against the job; *split_name: the split it was cut for. */
static nx_status check_job(json_t *j, const char *path, const nx_load_params *p, nx_error *err) {
    const char *split = json_string_value(json_object_get(j, "split"));
    json_t *jr = json_object_get(j, "ranks"), *jk = json_object_get(j, "rank");
    const char *fmt = json_string_value(json_object_get(j, "format"));
    if (!fmt || strcmp(fmt, "nextn-share") || json_integer_value(json_object_get(j, "version")) != 1)
        return nx_fail(err, NX_E_FORMAT, "%s: not a nextn-share file of version 1", path);
    if (!split || (strcmp(split, "pipeline") && strcmp(split, "experts")) || !json_is_integer(jr) ||
        !json_is_integer(jk))
        return nx_fail(err, NX_E_FORMAT, "%s: \"split\" (pipeline or experts), \"ranks\" and \"rank\" are required", path);
    const long long R = json_integer_value(jr), r = json_integer_value(jk);
    if (!p->dist)
        return nx_fail(err, NX_E_ARG, "%s: rank %lld's share of a checkpoint cut for --split %s over %lld ranks: "
                       "run it with mpirun -n %lld ... --split %s", path, r, split, R, R, split);
    const char *job = p->split == NX_SPLIT_PIPELINE ? "pipeline" : "experts";
    if (strcmp(split, job))
        return nx_fail(err, NX_E_ARG, "%s: \"split\" is %s: the share was cut for --split %s, the job runs --split %s",
                       path, split, split, job);
    const int ranks = nx_dist_size(p->dist), rank = nx_dist_rank(p->dist);
    if (R != ranks)
        return nx_fail(err, NX_E_ARG, "%s: \"ranks\" is %lld: the share was cut for %lld ranks, the job has %d", path, R,
                       R, ranks);
    if (r != rank)
        return nx_fail(err, NX_E_ARG, "%s: \"rank\" is %lld: rank %lld's share given to rank %d (give -m the directory "
                       "holding rank-0 .. rank-%d: each rank loads its own)", path, r, r, rank, ranks - 1);
    if (p->max_memory)
        return nx_fail(err, NX_E_UNSUPPORTED, "%s: --max-memory with a share: each rank holds only its own", path);
    return NX_OK;
}

nx_status nx_share_open(nx_model *m, const char *dir, const nx_load_params *p, nx_error *err) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/" SHARE_FILE, dir);
    if (access(path, F_OK) != 0) return NX_OK;
    json_t *j;
    nx_status st = nx_file_load_json(path, JSON_REJECT_DUPLICATES, &j, err);
    if (st != NX_OK) return st;
    if ((st = check_job(j, path, p, err)) == NX_OK) {
        const char *hex = json_string_value(json_object_get(j, "source_digest"));
        json_t *layers = json_object_get(j, "layers");
        char *end = NULL;
        m->share.digest = hex ? strtoull(hex, &end, 16) : 0;
        if (!hex || strlen(hex) != 16 || *end)
            st = nx_fail(err, NX_E_FORMAT, "%s: \"source_digest\" must be 16 hex digits", path);
        else if (p->split == NX_SPLIT_PIPELINE &&
                 (json_array_size(layers) != 2 || !json_is_integer(json_array_get(layers, 0)) ||
                  !json_is_integer(json_array_get(layers, 1))))
            st = nx_fail(err, NX_E_FORMAT, "%s: \"layers\": [lo, hi] is required for --split pipeline", path);
        else {
            m->share.on = true;
            m->share.lo = (int32_t)json_integer_value(json_array_get(layers, 0));
            m->share.hi = (int32_t)json_integer_value(json_array_get(layers, 1));
            st = declare(m, j, path, err);
        }
    }
    json_decref(j);
    return st;
}

nx_status nx_share_check(const nx_model *m, const char *dir, nx_error *err) {
    if (!m->share.on) return NX_OK;
    const uint64_t d = nx_store_digest(m->store);
    if (d != m->share.digest)
        return nx_fail(err, NX_E_FORMAT, "%s/" SHARE_FILE ": the share's tensors (names, dtypes, shapes) are not the "
                       "checkpoint's it was cut from (digest %016llx, \"source_digest\" %016llx): a file was replaced or edited",
                       dir, (unsigned long long)d, (unsigned long long)m->share.digest);
    return NX_OK;
}
