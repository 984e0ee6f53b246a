/* State files: a context's rows on disk (llama.cpp's --prompt-cache, its server's slot
 * save/restore). The rows are the prompt cache's (prompt_cache.c): tokens, every trunk layer's
 * key and value rows, the hidden states the MTP head is fed, the head's own cache rows.
 * Little-endian throughout:
 *
 *   0  "NXSTATE\n"                 8 bytes
 *   8  u32 version (2; 1 is read)  12 u32 header bytes (96)
 *   16 u32 KV element (1 f32, 2 f16)
 *   20 u32 model fingerprint       CRC-32 of the shape, the weight dtype and samples of the
 *                                  embedding, lm_head and final norm (another checkpoint of
 *                                  the same shape differs there)
 *   24 i32 layers, cached heads, cached row width, hidden, vocab
 *   44 i32 rows n
 *   48 u64 payload bytes           56 u32 payload CRC-32
 *   60 u32 header CRC-32 (bytes 0..59)
 *   64 char[28] the kernels' ISA that computed the rows (informational)
 *   92 u32 the MTP head's cache rows m (m < n; version 1: none, 0)
 *   96 payload: tokens i32[n]; per layer with a cache, keys then values (none for latent
 *      attention), per cached head n rows of the row width in KV elements; hidden f32[n][hidden];
 *      the MTP head's cache as a layer's, m rows; per Gated DeltaNet layer, its recurrent state
 *      and convolution window after row n (f32)
 *
 * A load checks everything (header, sizes, checksum, token range) on a read-only mapping before
 * it touches the context, so a bad file leaves the context as it was. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/error.h"
#include "base/file.h"
#include "model/deltanet.h"
#include "model/model_internal.h"

#define STATE_MAGIC "NXSTATE\n"
#define STATE_VERSION 2u
#define STATE_HEADER 96u
#define SAMPLE_BYTES 65536u

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* CRC-32 of n bytes, continuing crc (zlib's crc32 takes at most UINT_MAX bytes a call). */
static uint32_t crc_of(uint32_t crc, const void *p, size_t n) {
    const Bytef *b = p;
    while (n) {
        const uInt k = n > 0x40000000u ? 0x40000000u : (uInt)n;
        crc = (uint32_t)crc32(crc, b, k);
        b += k;
        n -= k;
    }
    return crc;
}

/* The model's fingerprint (see the file comment). */
static uint32_t model_fingerprint(const nx_model *m) {
    const nx_model_info *in = &m->info;
    uint8_t shape[48];
    const int32_t f[] = {in->vocab_size, in->hidden_size, in->n_layers, in->n_heads,  in->n_kv_heads,
                         in->head_dim,   in->n_experts,   in->top_k,    in->mtp_n_experts};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) put_u32(shape + 4 * i, (uint32_t)f[i]);
    put_u64(shape + 36, in->n_params);
    put_u32(shape + 44, (uint32_t)sizeof f);
    uint32_t crc = crc_of((uint32_t)crc32(0, Z_NULL, 0), shape, sizeof shape);
    crc = crc_of(crc, m->weight_dtype, strlen(m->weight_dtype));
    const nx_linear *heads[2] = {&m->w.embed, &m->w.lm_head};
    for (int i = 0; i < 2; i++) {
        const size_t total = nx_linear_weight_row_bytes(heads[i]) * (size_t)heads[i]->out, n = total < SAMPLE_BYTES ? total : SAMPLE_BYTES;
        if (!heads[i]->w || !n) continue;
        crc = crc_of(crc, heads[i]->w, n);                                    /* first rows */
        crc = crc_of(crc, (const uint8_t *)heads[i]->w + (total - n), n); /* last rows */
    }
    if (m->w.final_norm) crc = crc_of(crc, m->w.final_norm, sizeof(float) * (size_t)m->cfg.hidden_size);
    return crc;
}

static size_t kv_head_bytes(const nx_model *m) {
    return (size_t)m->cfg.cache_k * nx_dtype_size(m->kv_dtype);
}

/* Payload bytes of n rows and mh rows of the head's cache. */
static uint64_t payload_bytes(const nx_model *m, int32_t n, int32_t mh) {
    const uint64_t per_row = sizeof(int32_t) + (uint64_t)nx_kv_layers(m) * nx_kv_pos_bytes(m) +
                             sizeof(float) * (uint64_t)m->cfg.hidden_size;
    return per_row * (uint64_t)n + nx_kv_pos_bytes(m) * (uint64_t)mh + sizeof(float) * (uint64_t)nx_dn_saved_floats(m);
}

/* Calls piece(user, p, len) on rows [0, n) of one layer's cache kv, in file order. */
static int kv_pieces(const nx_ctx *c, nx_kv kv, int32_t n, int (*piece)(void *, const void *, size_t), void *user) {
    const nx_model *m = c->m;
    for (int kind = 0; kind < (m->cfg.cache_v ? 2 : 1); kind++)
        for (int32_t h = 0; h < m->cfg.cache_heads; h++)
            if (piece(user, nx_kv_row(c, kind ? kv.v : kv.k, h, 0), kv_head_bytes(m) * (size_t)n)) return -1;
    return 0;
}

/* Calls piece(user, p, len) on the payload of rows [0, n) of c and mh rows of its head's cache, in
 * file order. */
static int each_piece(const nx_ctx *c, int32_t n, int32_t mh, const float *dn,
                      int (*piece)(void *, const void *, size_t), void *user) {
    const nx_model *m = c->m;
    if (piece(user, c->tokens, sizeof(int32_t) * (size_t)n)) return -1;
    for (int32_t l = 0; l < m->cfg.n_layers; l++)
        if (c->kv[l].k && kv_pieces(c, c->kv[l], n, piece, user)) return -1;
    if (piece(user, c->hidden, sizeof(float) * (size_t)m->cfg.hidden_size * (size_t)n)) return -1;
    if (mh && kv_pieces(c, c->mtp_kv, mh, piece, user)) return -1;
    return dn ? piece(user, dn, sizeof(float) * (size_t)nx_dn_saved_floats(m)) : 0;
}

static int crc_piece(void *user, const void *p, size_t len) {
    uint32_t *crc = user;
    *crc = crc_of(*crc, p, len);
    return 0;
}

static int write_piece(void *user, const void *p, size_t len) {
    return len && fwrite(p, 1, len, (FILE *)user) != len ? -1 : 0;
}

static const char *kv_name(uint32_t code) {
    return code == 1 ? "f32" : code == 2 ? "f16" : "unknown";
}

static uint32_t kv_code(const nx_model *m) {
    return m->kv_dtype == NX_DTYPE_F16 ? 2u : 1u;
}

static nx_status save_rows(const nx_ctx *c, const char *path, int32_t n, int32_t mh, const float *dn,
                           int32_t *n_saved, int64_t *bytes, nx_error *err);

nx_status nx_state_save(const nx_ctx *c, const char *path, int32_t n, int32_t *n_saved, int64_t *bytes,
                        nx_error *err) {
    if (!path || !*path) return nx_fail(err, NX_E_ARG, "state file: empty path");
    const nx_model *m = c->m;
    if (m->dist) return nx_fail(err, NX_E_UNSUPPORTED, "state file %s: the rows of a split model are on several ranks", path);
    if (n < 0 || n > c->n_past) n = c->n_past;
    n = nx_dn_savable(c, n); /* recurrent states exist after some rows only */
    float *dn = NULL;
    if (nx_dn_saved_floats(m) && !(dn = malloc(sizeof(float) * (size_t)nx_dn_saved_floats(m))))
        return nx_fail(err, NX_E_NOMEM, "state file %s: out of memory", path);
    if (dn) nx_dn_save(c, n, dn);
    const nx_status s = save_rows(c, path, n, nx_mtp_rows_for(c, n), dn, n_saved, bytes, err);
    free(dn);
    return s;
}

/* nx_state_save of n rows, mh rows of the head's cache and the DeltaNet states dn (NULL: none). */
static nx_status save_rows(const nx_ctx *c, const char *path, int32_t n, int32_t mh, const float *dn,
                           int32_t *n_saved, int64_t *bytes, nx_error *err) {
    const nx_model *m = c->m;
    uint8_t h[STATE_HEADER] = {0};
    memcpy(h, STATE_MAGIC, 8);
    put_u32(h + 8, STATE_VERSION);
    put_u32(h + 12, STATE_HEADER);
    put_u32(h + 16, kv_code(m));
    put_u32(h + 20, model_fingerprint(m));
    const int32_t dims[] = {m->cfg.n_layers, m->cfg.cache_heads, m->cfg.cache_k, m->cfg.hidden_size,
                            m->cfg.vocab_size, n};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) put_u32(h + 24 + 4 * i, (uint32_t)dims[i]);
    const uint64_t pb = payload_bytes(m, n, mh);
    put_u64(h + 48, pb);
    uint32_t crc = (uint32_t)crc32(0, Z_NULL, 0);
    each_piece(c, n, mh, dn, crc_piece, &crc);
    put_u32(h + 56, crc);
    put_u32(h + 60, crc_of((uint32_t)crc32(0, Z_NULL, 0), h, 60));
    snprintf((char *)h + 64, 28, "%s", nx_kernels_isa());
    put_u32(h + 92, (uint32_t)mh);

    const size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp) return nx_fail(err, NX_E_NOMEM, "out of memory");
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        const nx_status s = nx_fail(err, NX_E_IO, "state file %s: cannot create %s: %s", path, tmp, strerror(errno));
        free(tmp);
        return s;
    }
    int bad = fwrite(h, 1, sizeof h, f) != sizeof h || each_piece(c, n, mh, dn, write_piece, f) || fflush(f) != 0 ||
              fsync(fileno(f)) != 0;
    const int saved_errno = errno;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        const nx_status s =
            nx_fail(err, NX_E_IO, "state file %s: write failed: %s", path, strerror(bad ? saved_errno : errno));
        unlink(tmp);
        free(tmp);
        return s;
    }
    free(tmp);
    if (n_saved) *n_saved = n;
    if (bytes) *bytes = (int64_t)(STATE_HEADER + pb);
    return NX_OK;
}

int64_t nx_state_file_bytes(const nx_ctx *c, int32_t n) {
    if (n < 0 || n > c->n_past) n = c->n_past;
    n = nx_dn_savable(c, n);
    return (int64_t)(STATE_HEADER + payload_bytes(c->m, n, nx_mtp_rows_for(c, n)));
}

/* The head's cache rows a file holds (version 1: none). */
static int32_t head_rows_of(const uint8_t *p) { return get_u32(p + 8) == 1u ? 0 : (int32_t)get_u32(p + 92); }

/* Checks a mapped file of size len against c's model; NX_OK or the problem. */
static nx_status check(const nx_ctx *c, const char *path, const uint8_t *p, size_t len, nx_error *err) {
    const nx_model *m = c->m;
    if (len < STATE_HEADER || memcmp(p, STATE_MAGIC, 8) != 0)
        return nx_fail(err, NX_E_FORMAT, "state file %s: not a nextn state file", path);
    if (get_u32(p + 8) != 1u && get_u32(p + 8) != STATE_VERSION)
        return nx_fail(err, NX_E_FORMAT, "state file %s: version %u (this build reads versions 1 and %u)", path,
                       get_u32(p + 8), STATE_VERSION);
    if (get_u32(p + 12) != STATE_HEADER || get_u32(p + 60) != crc_of((uint32_t)crc32(0, Z_NULL, 0), p, 60))
        return nx_fail(err, NX_E_FORMAT, "state file %s: corrupt header", path);
    static const char *names[] = {"layers", "cached kv heads", "cached row width", "hidden size",
                                  "vocabulary size"};
    const int32_t want[] = {m->cfg.n_layers, m->cfg.cache_heads, m->cfg.cache_k, m->cfg.hidden_size,
                            m->cfg.vocab_size};
    for (int i = 0; i < 5; i++) {
        const int32_t got = (int32_t)get_u32(p + 24 + 4 * i);
        if (got != want[i])
            return nx_fail(err, NX_E_FORMAT, "state file %s: saved from a model with %s %d (this model has %d)", path,
                           names[i], got, want[i]);
    }
    const uint32_t fp = get_u32(p + 20), mine = model_fingerprint(m);
    if (fp != mine)
        return nx_fail(err, NX_E_FORMAT,
                       "state file %s: saved from another model of the same shape (weights fingerprint %08x, "
                       "this model %08x)",
                       path, fp, mine);
    if (get_u32(p + 16) != kv_code(m))
        return nx_fail(err, NX_E_FORMAT, "state file %s: saved with an %s KV cache (this context's is %s)", path,
                       kv_name(get_u32(p + 16)), kv_name(kv_code(m)));
    const int32_t n = (int32_t)get_u32(p + 44);
    if (n < 0) return nx_fail(err, NX_E_FORMAT, "state file %s: corrupt header (%d rows)", path, n);
    if (nx_dn_saved_floats(m) && n > c->n_ctx)
        return nx_fail(err, NX_E_ARG, "state file %s: %d rows do not fit the context of %d (a hybrid model's "
                       "recurrent states are those after its last row)", path, n, c->n_ctx);
    const int32_t mh = head_rows_of(p);
    if (mh < 0 || (mh > 0 && mh >= n))
        return nx_fail(err, NX_E_FORMAT, "state file %s: corrupt header (%d rows of the MTP head's cache for %d rows)",
                       path, mh, n);
    const uint64_t pb = get_u64(p + 48);
    if (pb != payload_bytes(m, n, mh))
        return nx_fail(err, NX_E_FORMAT, "state file %s: corrupt header (%llu payload bytes for %d rows)", path,
                       (unsigned long long)pb, n);
    if ((uint64_t)len != STATE_HEADER + pb)
        return nx_fail(err, NX_E_FORMAT, "state file %s: %s: %zu bytes, the header promises %llu", path,
                       (uint64_t)len < STATE_HEADER + pb ? "truncated" : "trailing bytes", len,
                       (unsigned long long)(STATE_HEADER + pb));
    if (crc_of((uint32_t)crc32(0, Z_NULL, 0), p + STATE_HEADER, (size_t)pb) != get_u32(p + 56))
        return nx_fail(err, NX_E_FORMAT, "state file %s: corrupt rows (checksum mismatch)", path);
    for (int32_t t = 0; t < n; t++) {
        const int32_t id = (int32_t)get_u32(p + STATE_HEADER + 4 * (size_t)t);
        if (id < 0 || id >= m->cfg.vocab_size)
            return nx_fail(err, NX_E_FORMAT, "state file %s: token %d at row %d is outside the vocabulary (%d)", path,
                           id, t, m->cfg.vocab_size);
    }
    return NX_OK;
}

/* Rows [0, k) of a checked file's n rows into c (the layers' blocks are the prompt cache's), and
 * the head's rows whose next token is among them (a context of a model with its head). */
static void apply(nx_ctx *c, const uint8_t *p, int32_t n, int32_t k) {
    const int32_t mh = head_rows_of(p), hk = mh < k - 1 ? mh : k - 1;
    const nx_model *m = c->m;
    const size_t layer = nx_kv_pos_bytes(m) * (size_t)n;
    nx_ctx_truncate(c, 0);
    const uint8_t *at = p + STATE_HEADER;
    for (int32_t t = 0; t < k; t++) c->tokens[t] = (int32_t)get_u32(at + 4 * (size_t)t);
    at += sizeof(int32_t) * (size_t)n;
    for (int32_t l = 0; l < m->cfg.n_layers; l++)
        if (c->kv[l].k) {
            nx_kv_copy_rows(c, c->kv[l], (void *)at, n, k, false);
            at += layer;
        }
    memcpy(c->hidden, at, sizeof(float) * (size_t)m->cfg.hidden_size * (size_t)k);
    at += sizeof(float) * (size_t)m->cfg.hidden_size * (size_t)n;
    if (hk > 0 && m->w.has_mtp) nx_kv_copy_rows(c, c->mtp_kv, (void *)at, mh, hk, false);
    at += nx_kv_pos_bytes(m) * (size_t)mh;
    if (nx_dn_saved_floats(m)) nx_dn_load(c, (const float *)(const void *)at, k); /* k = n (check) */
    c->n_past = k;
    if (hk > 0 && m->w.has_mtp) c->mtp_past = hk;
}

nx_status nx_state_load(nx_ctx *c, const char *path, int32_t *n_loaded, int64_t *bytes, nx_error *err) {
    if (!path || !*path) return nx_fail(err, NX_E_ARG, "state file: empty path");
    if (c->m->dist) return nx_fail(err, NX_E_UNSUPPORTED, "state file %s: the rows of a split model are on several ranks", path);
    int fd;
    struct stat st;
    nx_status s = nx_file_open_regular(path, 0, &fd, &st, err);
    if (s != NX_OK) {
        nx_error_prefix(err, "state file");
        return s;
    }
    const size_t len = (size_t)st.st_size;
    if (len < STATE_HEADER) {
        close(fd);
        return nx_fail(err, NX_E_FORMAT, "state file %s: not a nextn state file (%zu bytes)", path, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return nx_fail(err, NX_E_IO, "state file %s: cannot map: %s", path, strerror(errno));
    s = check(c, path, map, len, err);
    if (s == NX_OK) {
        const int32_t n = (int32_t)get_u32((const uint8_t *)map + 44), k = n < c->n_ctx ? n : c->n_ctx;
        apply(c, map, n, k);
        if (n_loaded) *n_loaded = k;
        if (bytes) *bytes = (int64_t)len;
    }
    munmap(map, len);
    return s;
}
