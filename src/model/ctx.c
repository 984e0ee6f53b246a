/* Decoding contexts: KV caches for the trunk and the MTP layer and every scratch buffer a
 * forward needs, allocated once at creation (nothing is allocated inside the forward pass);
 * teacher-forced evaluation and rollback. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/error.h"
#include "model/deltanet.h"
#include "model/model_internal.h"
#include "model/split.h"

#define NX_DEFAULT_BATCH 128

static int64_t ffn_width(const nx_layer *L) {
    if (!L->is_moe) return L->dense.gate.out;
    int64_t f = L->moe.has_shared ? L->moe.shared.gate.out : 0;
    for (int32_t e = 0; e < L->moe.n_experts; e++)
        if (L->moe.experts[e].gate.out > f) f = L->moe.experts[e].gate.out;
    return f;
}

/* Zeroed memory for the KV caches and the per-position hidden states, 2 MB-aligned and advised
 * for huge pages (attention at long context walks the whole cache every step, 4 KB pages at a
 * time otherwise), and committed now, as llama.cpp clears its KV buffer at creation: a context
 * that does not fit fails here with a clear error, not mid-generation, and decoding does not
 * pay for first touches (each step writes fresh KV rows and a hidden row; on a VM first-touch
 * faults cost ~70 us a step of a Hy3-shaped model's 4.5 ms-per-GB decode). Returns the aligned
 * start (NULL, errno set, on failure); *base / *mapped are what to unmap. */
static void *kv_arena_new(size_t bytes, void **base, size_t *mapped) {
    const size_t huge = (size_t)2 << 20, len = (bytes + huge - 1) / huge * huge + huge;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1));
    const size_t used = len - (size_t)(a - (uint8_t *)m);
#ifdef MADV_HUGEPAGE /* Linux */
    (void)madvise(a, used, MADV_HUGEPAGE);
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
    if (madvise(a, used, MADV_POPULATE_WRITE) != 0) {
        if (errno != EINVAL) { /* ENOMEM, EFAULT, EHWPOISON: the memory is not there */
            const int e = errno;
            munmap(m, len);
            errno = e;
            return NULL;
        }
        /* kernels before 5.14: one write per page (the memory is zero already) */
        const long pg = sysconf(_SC_PAGESIZE);
        volatile uint8_t *b = a;
        for (size_t o = 0; o < used; o += (size_t)(pg > 0 ? pg : 4096)) b[o] = 0;
    }
    *base = m;
    *mapped = len;
    return a;
}

static void *zalloc(size_t n, size_t size, bool *ok) {
    void *p = calloc(n ? n : 1, size);
    if (!p) *ok = false;
    return p;
}

/* Bytes of one DeltaNet layer's state block in the arena (nx_dn_state's arrays, in order). */
static size_t dn_block_floats(const nx_deltanet *g, size_t f[8]) {
    const size_t C = (size_t)nx_deltanet_channels(g), K1 = (size_t)g->conv_k - 1, R = NX_DN_REWIND;
    f[0] = f[1] = (size_t)nx_deltanet_state_floats(g);
    f[2] = K1 * C;
    f[3] = (K1 + R) * C;
    f[4] = R * (size_t)g->n_k_heads * (size_t)g->k_dim;
    f[5] = R * (size_t)g->n_v_heads * (size_t)g->v_dim;
    f[6] = f[7] = R * (size_t)g->n_v_heads;
    size_t n = 0;
    for (int i = 0; i < 8; i++) n += (f[i] + 15) / 16 * 16; /* 64-byte aligned arrays */
    return n;
}

/* The DeltaNet layers' states at base (n_linear blocks of dn_block_floats). */
static void dn_states_at(nx_ctx *c, float *base) {
    size_t f[8];
    const size_t per = dn_block_floats(&c->m->cfg.dn, f);
    for (int32_t l = 0; l < c->m->cfg.n_linear; l++) {
        float *p = base + (size_t)l * per;
        float **arr[8] = {&c->dn[l].S[0], &c->dn[l].S[1], &c->dn[l].conv, &c->dn[l].hist,
                          &c->dn[l].rk,   &c->dn[l].rv,   &c->dn[l].rd,   &c->dn[l].rb};
        for (int i = 0; i < 8; i++) {
            *arr[i] = p;
            p += (f[i] + 15) / 16 * 16;
        }
    }
}

/* One layer's cache at base: kper bytes of keys, then its values (none for latent attention). */
static nx_kv layer_cache(char *base, size_t kper, const nx_config *cfg) {
    return (nx_kv){base, cfg->cache_v ? base + kper : NULL};
}

static nx_status ctx_new(nx_model *m, int32_t n_ctx, int32_t n_batch, int32_t seqs, int32_t logit_rows,
                         nx_ctx **out, nx_error *err);

nx_status nx_ctx_new(nx_model *m, int32_t n_ctx, nx_ctx **out, nx_error *err) {
    *out = NULL;
    const nx_config *cfg = &m->cfg;
    if (n_ctx <= 0) return nx_fail(err, NX_E_ARG, "context size %d: must be positive", n_ctx);
    if (cfg->max_positions > 0 && n_ctx > cfg->max_positions)
        return nx_fail(err, NX_E_ARG, "context size %d exceeds the model's max_position_embeddings %lld",
                       n_ctx, (long long)cfg->max_positions);
    return ctx_new(m, n_ctx, n_ctx < NX_DEFAULT_BATCH ? n_ctx : NX_DEFAULT_BATCH, 1, 0, out, err);
}

nx_status nx_ctx_new_scratch(nx_model *m, int32_t rows, int32_t seqs, int32_t logit_rows, nx_ctx **out,
                             nx_error *err) {
    *out = NULL;
    return ctx_new(m, 1, rows, seqs, logit_rows, out, err);
}

/* A context of n_ctx positions forwarding n_batch rows of up to seqs sequences at a time. */
static nx_status ctx_new(nx_model *m, int32_t n_ctx, int32_t n_batch, int32_t seqs, int32_t logit_rows,
                         nx_ctx **out, nx_error *err) {
    const nx_config *cfg = &m->cfg;
    nx_ctx *c = calloc(1, sizeof *c);
    if (!c) return nx_fail(err, NX_E_NOMEM, "out of memory");
    c->m = m;
    c->n_ctx = n_ctx;
    c->dn_max_ckpts = NX_CTX_CHECKPOINTS_DEFAULT;
    c->dn_every = NX_CHECKPOINT_EVERY_DEFAULT;
    c->n_batch = n_batch;

    const size_t H = (size_t)cfg->hidden_size, B = (size_t)c->n_batch, N = (size_t)n_ctx;
    const bool mla = cfg->attention == NX_ATTN_MLA;
    const size_t nh = (size_t)cfg->n_heads, qw = nh * (size_t)cfg->head_dim;
    const size_t kw = mla ? (size_t)cfg->mla.q_lora_rank : (size_t)cfg->n_kv_heads * cfg->head_dim;
    const size_t vw = mla ? (size_t)cfg->cache_k : (size_t)cfg->n_kv_heads * cfg->head_dim;
    const size_t aw = mla ? nh * (size_t)cfg->mla.v_head_dim : qw;
    int64_t F = 1;
    int32_t E = cfg->n_experts > 0 ? cfg->n_experts : 1;
    for (int32_t l = 0; l < cfg->n_layers; l++)
        if (ffn_width(&m->w.layers[l]) > F) F = ffn_width(&m->w.layers[l]);
    if (m->w.has_mtp) {
        if (ffn_width(&m->w.mtp.layer) > F) F = ffn_width(&m->w.mtp.layer);
        if (m->w.mtp.layer.is_moe && m->w.mtp.layer.moe.n_experts > E) E = m->w.mtp.layer.moe.n_experts;
    }
    const size_t K = cfg->top_k > 0 ? (size_t)cfg->top_k : 1;

    bool ok = true;
    c->kv = zalloc((size_t)cfg->n_layers, sizeof *c->kv, &ok);
    if (cfg->n_linear) c->dn = zalloc((size_t)cfg->n_linear, sizeof *c->dn, &ok);
    /* bytes of one layer's keys (and, after them, of its values); DeltaNet layers have none */
    const size_t kper = N * (size_t)cfg->cache_heads * (size_t)cfg->cache_k * nx_dtype_size(m->kv_dtype);
    const size_t per = N * nx_kv_pos_bytes(m);
    const size_t n_caches = (size_t)(cfg->n_layers - cfg->n_linear) + (m->w.has_mtp ? 1 : 0);
    size_t dnf[8];
    const size_t dn_bytes = cfg->n_linear ? (size_t)cfg->n_linear * dn_block_floats(&cfg->dn, dnf) * sizeof(float) : 0;
    const size_t hidden_at = (n_caches * per + 63) / 64 * 64, dn_at = hidden_at + (N * H * sizeof(float) + 63) / 64 * 64;
    const size_t arena_bytes = dn_at + dn_bytes;
    char *arena = ok ? kv_arena_new(arena_bytes, &c->kv_arena, &c->kv_arena_bytes) : NULL;
    if (!arena) {
        const bool mem = ok;
        nx_ctx_free(c);
        if (!mem) return nx_fail(err, NX_E_NOMEM, "out of memory allocating a context of %d positions", n_ctx);
        return nx_fail(err, NX_E_NOMEM,
                       "a context of %d positions needs %.1f MB for its KV caches, hidden and recurrent states: %s "
                       "(a smaller --ctx or --kv-type f16 needs less)",
                       n_ctx, (double)arena_bytes / (1 << 20), strerror(errno));
    }
    c->hidden = (float *)(void *)(arena + hidden_at);
    if (c->dn) dn_states_at(c, (float *)(void *)(arena + dn_at));
    for (int32_t l = 0, i = 0; ok && l < cfg->n_layers; l++)
        if (!m->w.layers[l].linear) c->kv[l] = layer_cache(arena + (size_t)i++ * per, kper, cfg);
    if (m->w.has_mtp) {
        if (ok) c->mtp_kv = layer_cache(arena + (n_caches - 1) * per, kper, cfg);
        c->mtp_in = zalloc(B * 2 * H, sizeof(float), &ok);
        c->mtp_out = zalloc(B * H, sizeof(float), &ok);
    }
    if (cfg->n_linear) {
        const nx_deltanet *g = &cfg->dn;
        const size_t C = (size_t)nx_deltanet_channels(g), vd = (size_t)g->n_v_heads * g->v_dim, nv = (size_t)g->n_v_heads;
        c->dn_x = zalloc(((size_t)g->conv_k - 1) * (size_t)seqs * C + B * C, sizeof(float), &ok);
        c->dn_qkv = zalloc(B * C, sizeof(float), &ok);
        c->dn_z = zalloc(B * vd, sizeof(float), &ok);
        c->dn_b = zalloc(B * nv, sizeof(float), &ok);
        c->dn_a = zalloc(B * nv, sizeof(float), &ok);
        c->dn_f = zalloc(B * (C + vd + 2 * nv), sizeof(float), &ok);
        c->dn_o = zalloc(B * vd, sizeof(float), &ok);
    }
    if (cfg->attn_gate) c->qg = zalloc(B * 2 * qw, sizeof(float), &ok);
    c->sgate = zalloc(B, sizeof(float), &ok);
    c->tokens = zalloc(N, sizeof(int32_t), &ok);
    c->x = zalloc(B * H, sizeof(float), &ok);
    c->xn = zalloc(B * H, sizeof(float), &ok);
    c->q = zalloc(B * qw, sizeof(float), &ok);
    c->k = zalloc(B * (kw ? kw : 1), sizeof(float), &ok);
    c->v = zalloc(B * vw, sizeof(float), &ok);
    c->att = zalloc(B * aw, sizeof(float), &ok);
    if (mla) {
        c->lat_q = zalloc(B * nh * (size_t)cfg->cache_k, sizeof(float), &ok);
        c->lat_o = zalloc(B * nh * (size_t)cfg->mla.kv_lora_rank, sizeof(float), &ok);
        const size_t row = (size_t)NX_MLA_MAX_BLOCKS * nh * ((size_t)cfg->mla.kv_lora_rank + 2);
        const size_t rows = NX_MLA_PART_BYTES / (row * sizeof(float));
        c->lat_part_rows = (int32_t)(rows < 1 ? 1 : rows > B ? B : rows);
        c->lat_part = zalloc((size_t)c->lat_part_rows * row, sizeof(float), &ok);
    }
    c->y = zalloc(B * H, sizeof(float), &ok);
    c->g = zalloc(B * (K + 1) * (size_t)F, sizeof(float), &ok);
    c->u = zalloc(B * (K + 1) * (size_t)F, sizeof(float), &ok);
    c->hpre = zalloc(B * H, sizeof(float), &ok);
    c->hpost = zalloc(B * H, sizeof(float), &ok);
    const size_t group = mla ? nh : cfg->n_kv_heads > 0 ? (size_t)(cfg->n_heads / cfg->n_kv_heads) : 1;
    c->scores = zalloc((size_t)nx_pool_size(m->pool) * group * N, sizeof(float), &ok);
    c->rope = zalloc(B * (size_t)cfg->head_dim, sizeof(float), &ok);
    c->router = zalloc(B * (size_t)E, sizeof(float), &ok);
    c->sel = zalloc(B * K, sizeof(int32_t), &ok);
    c->selw = zalloc(B * K, sizeof(float), &ok);
    c->prev_sel = zalloc(((size_t)cfg->n_layers + 1) * K, sizeof(int32_t), &ok);
    c->rows = zalloc(B * K, sizeof(int32_t), &ok);
    c->rows_w = zalloc(B * K, sizeof(float), &ok);
    c->xe = zalloc(B * K * H, sizeof(float), &ok);
    c->ye = zalloc(B * (K + 1) * H, sizeof(float), &ok);
    if (logit_rows > 0) {
        c->blogits = zalloc((size_t)logit_rows * (size_t)cfg->vocab_size, sizeof(float), &ok);
        c->blogits_rows = logit_rows;
    }
    if (!ok) {
        nx_ctx_free(c);
        return nx_fail(err, NX_E_NOMEM, "out of memory allocating a context of %d positions", n_ctx);
    }
    if (m->dist) nx_split_ctx_new(c); /* the other ranks make its twin (split.h) */
    nx_ctx_truncate(c, 0);
    *out = c;
    return NX_OK;
}

void nx_ctx_free(nx_ctx *c) {
    if (!c) return;
    if (c->m->dist) nx_split_ctx_free(c);
    if (c->kv_arena) munmap(c->kv_arena, c->kv_arena_bytes);
    free(c->kv);
    free(c->dn);
    nx_dn_ckpts_free(c);
    float *bufs[] = {c->mtp_in, c->mtp_out, c->x,      c->xn,     c->q,     c->k,     c->v,    c->att,
                     c->y,      c->g,       c->u,      c->hpre,   c->hpost, c->scores, c->router, c->selw,
                     c->rows_w, c->xe,      c->ye,     c->rope,   c->lat_q, c->lat_o, c->lat_part, c->dn_x, c->dn_qkv,
                     c->dn_z,   c->dn_b,    c->dn_a,   c->dn_f,   c->dn_o,  c->qg,    c->sgate, c->blogits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(c->tokens);
    free(c->slot);
    free(c->sel);
    free(c->prev_sel);
    free(c->rows);
    free(c);
}

int32_t nx_ctx_n_ctx(const nx_ctx *c) { return c->n_ctx; }
int32_t nx_ctx_n_past(const nx_ctx *c) { return c->n_past; }

void nx_kv_copy_rows(const nx_ctx *c, nx_kv kv, void *saved, int32_t stride, int32_t n, bool to_saved) {
    const nx_model *m = c->m;
    const size_t hb = (size_t)m->cfg.cache_k * nx_dtype_size(m->kv_dtype), nh = (size_t)m->cfg.cache_heads;
    for (int kind = 0; kind < (kv.v ? 2 : 1); kind++) {
        void *cache = kind ? kv.v : kv.k;
        for (size_t h = 0; h < nh; h++) {
            uint8_t *at = nx_kv_row(c, cache, (int64_t)h, 0);
            uint8_t *sv = (uint8_t *)saved + (kind * nh + h) * (size_t)stride * hb;
            if (to_saved) memcpy(sv, at, (size_t)n * hb);
            else memcpy(at, sv, (size_t)n * hb);
        }
    }
}

void nx_ctx_reset_auto(nx_ctx *c) {
    if (c->slot) memset(c->slot, 0, c->slot_size);
}

void *nx_ctx_decoder_slot(nx_ctx *c, size_t size) {
    if (c->slot && c->slot_size == size) return c->slot;
    free(c->slot);
    c->slot = calloc(1, size ? size : 1);
    c->slot_size = c->slot ? size : 0;
    return c->slot;
}

void nx_ctx_set_sink(nx_ctx *c, const nx_fwd_sink *sink) {
    if (sink) c->sink = *sink;
    else memset(&c->sink, 0, sizeof c->sink);
}

nx_model *nx_ctx_model(const nx_ctx *c) { return c->m; }
int32_t nx_ctx_n_batch_rows(const nx_ctx *c) { return c->n_batch; }

size_t nx_ctx_bytes(const nx_ctx *c) {
    const nx_config *cfg = &c->m->cfg;
    const size_t H = (size_t)cfg->hidden_size, K = cfg->top_k > 0 ? (size_t)cfg->top_k : 1;
    const size_t F = (size_t)(cfg->intermediate_size > cfg->expert_dim ? cfg->intermediate_size : cfg->expert_dim);
    /* per row: the residual stream and its norms, hiddens, q/k/v/att, the experts' rows */
    const size_t per_row = 9 * H + (size_t)cfg->n_heads * (size_t)cfg->head_dim * 3 + 2 * (K + 1) * F + (2 * K + 1) * H;
    return c->kv_arena_bytes + (size_t)c->n_batch * per_row * sizeof(float) +
           (size_t)c->dn_max_ckpts * (size_t)nx_dn_saved_floats(c->m) * sizeof(float);
}
int32_t nx_ctx_n_batch(const nx_ctx *c) { return c->n_batch; }
bool nx_model_has_mtp(const nx_model *m) { return m->w.has_mtp; }

void nx_ctx_rewind_cost(const nx_ctx *c, int64_t *count, double *seconds, double *bytes) {
    *count = c->dn_rewinds;
    *seconds = c->dn_rewind_s;
    *bytes = c->dn_rewind_bytes;
}

void nx_ctx_keep_state_at(nx_ctx *c, int32_t n) {
    if (c->m->dist) nx_split_op(c, NX_SPLIT_KEEP_STATE, n);
    c->dn_mark = c->dn && c->dn_max_ckpts > 0 ? n : -1;
}

nx_status nx_ctx_set_checkpoints(nx_ctx *c, int32_t max, int32_t every, nx_error *err) {
    if (max < 0 || max > NX_CTX_CHECKPOINTS_MAX)
        return nx_fail(err, NX_E_ARG, "checkpoints %d: must be 0..%d", max, NX_CTX_CHECKPOINTS_MAX);
    if (every < 0) return nx_fail(err, NX_E_ARG, "checkpoint spacing %d: must be >= 0 (0: none while prefilling)", every);
    nx_dn_ckpts_limit(c, max);
    c->dn_every = every;
    return NX_OK;
}

void nx_ctx_checkpoint(nx_ctx *c) {
    if (!c->m->dist) nx_dn_checkpoint(c);
}

int32_t nx_ctx_checkpoint_every(const nx_ctx *c) {
    return c->dn && c->dn_max_ckpts > 0 && !c->m->dist ? c->dn_every : -1;
}

int32_t nx_ctx_shared_prefix(const nx_ctx *c, const int32_t *tokens, int32_t n) {
    int32_t k = 0;
    while (k < c->n_past && k < n && c->tokens[k] == tokens[k]) k++;
    return nx_dn_rewind_floor(c, k); /* recurrent states go back only to some rows */
}

/* ---------------------------------------------------------------- the MTP head's cache */

int32_t nx_mtp_n_past(const nx_ctx *c) { return c->mtp_past; }
int32_t nx_mtp_first(const nx_ctx *c) { return c->mtp_lo; }

int32_t nx_mtp_rows_for(const nx_ctx *c, int32_t n) {
    if (!c->m->w.has_mtp || c->mtp_lo > 0 || n < 2) return 0;
    return c->mtp_past < n - 1 ? c->mtp_past : n - 1;
}

nx_status nx_mtp_draft_next(nx_ctx *c, int32_t token, float *logits, nx_error *err) {
    if (c->mtp_rows <= 0) return nx_fail(err, NX_E_STATE, "MTP draft: the head has no output row to chain on");
    const float *h = c->mtp_out + (size_t)(c->mtp_rows - 1) * (size_t)c->m->cfg.hidden_size;
    return nx_forward_mtp(c, h, &token, 1, c->mtp_past, logits, 0, err);
}

void nx_mtp_commit(nx_ctx *c, int32_t n) {
    if (c->m->dist) nx_split_op(c, NX_SPLIT_MTP_COMMIT, n);
    if (n < 0) n = 0;
    if (c->mtp_past > n) c->mtp_past = n;
    if (c->mtp_lo > c->mtp_past) c->mtp_lo = c->mtp_past;
}

void nx_mtp_skip_to(nx_ctx *c, int32_t first) {
    if (c->m->dist) nx_split_op(c, NX_SPLIT_MTP_SKIP, first);
    if (first < 0) first = 0;
    c->mtp_past = c->mtp_lo = first;
}

void nx_mtp_reset(nx_ctx *c) {
    if (c->m->dist) nx_split_op(c, NX_SPLIT_MTP_RESET, 0);
    c->mtp_past = c->mtp_lo = 0;
}

void nx_ctx_truncate(nx_ctx *c, int32_t n) {
    if (c->m->dist) nx_split_op(c, NX_SPLIT_TRUNCATE, n);
    if (n < 0 || !nx_dn_can_rewind(c, n)) n = 0; /* a state that cannot go back starts over */
    if (c->n_past > n) {
        if (n > 0 && c->dn) { /* replays on the pool, which a batch's round may be using */
            const bool held = c->batch && nx_batch_hold(c->batch);
            nx_dn_rewind(c, n);
            if (held) nx_batch_release(c->batch);
        }
        c->n_past = n;
    }
    nx_mtp_commit(c, n);
    if (n == 0) {
        /* forget routing memory so overlap statistics restart with the sequence */
        size_t k = c->m->cfg.top_k > 0 ? (size_t)c->m->cfg.top_k : 1;
        for (size_t i = 0; i < ((size_t)c->m->cfg.n_layers + 1) * k; i++) c->prev_sel[i] = -1;
        nx_dn_reset(c);
    }
}

nx_status nx_ctx_eval(nx_ctx *c, const int32_t *tokens, int32_t n, int32_t n_past, float *logits,
                      nx_error *err) {
    if (n_past != c->n_past)
        return nx_fail(err, NX_E_STATE, "eval at position %d, but the cache holds %d rows", n_past, c->n_past);
    if (n <= 0) return nx_fail(err, NX_E_ARG, "eval of %d tokens", n);
    if (n_past + n > c->n_ctx)
        return nx_fail(err, NX_E_ARG, "%d tokens exceed the context of %d", n_past + n, c->n_ctx);
    const size_t V = (size_t)c->m->cfg.vocab_size;
    for (int32_t done = 0; done < n;) {
        int32_t T = n - done < c->n_batch ? n - done : c->n_batch;
        nx_status st = nx_forward_trunk(c, tokens + done, T, logits ? logits + (size_t)done * V : NULL, 0, err);
        if (st != NX_OK) return st;
        done += T;
    }
    return NX_OK;
}

nx_status nx_mtp_catch_up(nx_ctx *c, const int32_t *next_tokens, int32_t upto, float *logits,
                          bool all_logits, nx_error *err) {
    const size_t H = (size_t)c->m->cfg.hidden_size, V = (size_t)c->m->cfg.vocab_size;
    const int32_t first = c->mtp_past;
    while (c->mtp_past < upto) {
        int32_t p = c->mtp_past;
        int32_t R = upto - p < c->n_batch ? upto - p : c->n_batch;
        bool last = p + R == upto;
        float *lg = !logits ? NULL : all_logits ? logits + (size_t)(p - first) * V : last ? logits : NULL;
        nx_status st = nx_forward_mtp(c, c->hidden + (size_t)p * H, next_tokens + (p - first), R, p, lg,
                                      all_logits ? 0 : R - 1, err);
        if (st != NX_OK) return st;
    }
    return NX_OK;
}

nx_status nx_ctx_eval_mtp(nx_ctx *c, const int32_t *tokens, int32_t n, float *logits, nx_error *err) {
    if (!c->m->w.has_mtp) return nx_fail(err, NX_E_STATE, "this model has no MTP head");
    if (n != c->n_past)
        return nx_fail(err, NX_E_STATE, "MTP evaluation needs the %d tokens in the cache, got %d",
                       c->n_past, n);
    if (c->mtp_past != 0) return nx_fail(err, NX_E_STATE, "MTP evaluation needs a fresh MTP cache");
    if (n < 2) return NX_OK;
    return nx_mtp_catch_up(c, tokens + 1, n - 1, logits, true, err);
}
