/* The forward pass over T rows (docs/design.md §2, §12): embedding, decoder layers (q/k/v
 * biases and q/k-norm where the config has them, neox or interleaved RoPE over the rotary dims,
 * with YaRN where configured, GQA or multi-head latent attention, dense SwiGLU or
 * sigmoid-routed, group-limited MoE + shared expert), final norm and an f32 lm_head; the
 * variants are the config's fields, never the family's name. The same code serves prefill,
 * decode and the k+1 rows of a speculative verify; every row's result is independent of the
 * rows it shares a call with (batch invariance). */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "io/quantize.h"
#include "model/validate.h"
#include "model/deltanet.h"
#include "model/forward.h"
#include "model/model_internal.h"
#include "model/split.h"

/* ---------------------------------------------------------------- primitives */

/* YaRN's inverse frequency of rotated pair i of rot (transformers' _compute_yarn_parameters):
 * extrapolated (theta^(-2i/rot)) below the ramp's low dim, interpolated (/ factor) above its
 * high dim, blended linearly between. */
static double yarn_inv_freq(const nx_yarn *y, int32_t i, int32_t rot, double theta) {
    const double extra = pow(theta, -2.0 * i / rot), inter = extra / y->factor;
    const double lb = log(theta), two_pi = 6.283185307179586;
    double lo = rot * log(y->orig_max_pos / (y->beta_fast * two_pi)) / (2 * lb);
    double hi = rot * log(y->orig_max_pos / (y->beta_slow * two_pi)) / (2 * lb);
    if (y->truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    if (lo < 0) lo = 0;
    if (hi > rot - 1) hi = rot - 1;
    if (lo == hi) hi += 0.001;
    double ramp = (i - lo) / (hi - lo);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    return inter * ramp + extra * (1 - ramp);
}

/* cos and sin of the RoPE angles of every row of the segments (row r0 + t at position pos0 + t)
 * into c->rope (per row of stride hd: rot/2 cosines, then rot/2 sines), for rot rotated dims
 * (partial rotary: the frequencies run over the rotated dims, theta^(-2i/rot), as transformers
 * and mlx-lm take them; under YaRN its blend, and cos and sin times its attention factor); kept
 * for the forward call (c->serial), so its layers compute them once. A row's values depend on
 * its position alone, whatever else shares the call. */
static const float *rope_table(nx_ctx *c, const nx_seg *seg, int n_seg, int32_t hd, int32_t rot, double theta) {
    const int32_t half = rot / 2;
    const nx_yarn *y = &c->m->cfg.yarn;
    if (c->rope_serial == c->serial && c->rope_hd == rot && c->rope_theta == theta) return c->rope;
    for (int32_t i = 0; i < half; i++) {
        const double inv = y->factor > 0 ? yarn_inv_freq(y, i, rot, theta) : pow(theta, -2.0 * i / rot);
        const double mag = y->factor > 0 ? y->attn_factor : 1.0;
        for (int si = 0; si < n_seg; si++)
            for (int32_t t = 0; t < seg[si].T; t++) {
                const double a = (double)(seg[si].pos0 + t) * inv;
                const size_t r = (size_t)(seg[si].r0 + t);
                c->rope[r * hd + i] = (float)(cos(a) * mag);
                c->rope[r * hd + half + i] = (float)(sin(a) * mag);
            }
    }
    c->rope_serial = c->serial;
    c->rope_hd = rot;
    c->rope_theta = theta;
    return c->rope;
}

/* RoPE on the first rot dims of one head vector (the rest pass through), with the row's cos/sin
 * from rope_table: neox pairs (i, i + rot/2), or interleaved pairs (2i, 2i + 1). */
static void rope_apply(float *x, int32_t rot, const float *cs_sn, nx_rope_pairs pairs) {
    const int32_t half = rot / 2;
    const float *cs = cs_sn, *sn = cs_sn + half;
    const int32_t step = pairs == NX_ROPE_INTERLEAVED ? 2 : 1, off = pairs == NX_ROPE_INTERLEAVED ? 1 : half;
    for (int32_t i = 0; i < half; i++) {
        float *a = x + i * step, *b = a + off;
        const float x0 = *a, x1 = *b;
        *a = x0 * cs[i] - x1 * sn[i];
        *b = x1 * cs[i] + x0 * sn[i];
    }
}

/* x[i] += b[i]: a projection's bias (the matmul kernels have none). */
static void add_bias(float *x, const float *b, int32_t n) {
    for (int32_t i = 0; i < n; i++) x[i] += b[i];
}


/* Output rows a thread takes at a time in this file's parallel jobs (the output projection, the
 * MoE units): whole register blocks of the kernels, and no two threads writing one cache line of
 * the result. */
#define ROW_CHUNK 16

/* ---------------------------------------------------------------- attention */

typedef struct attn_job {
    nx_ctx *c;          /* the scratch: every row's q, k, v and results */
    const nx_layer *L;
    const nx_seg *seg;  /* whose rows: each segment's keys and values go to its own caches */
    int n_seg;
    bool mtp;           /* the MTP layer's caches (else the trunk layer layer_slot's) */
    int32_t layer_slot;
    const float *rope; /* rope_table of the rows */
    int32_t T, n_heads, n_kv, hd;
    int32_t window; /* 0 = full */
    nx_matmul_task qkv[3], wo; /* the projections (attn_heads_worker) */
} attn_job;

/* The cache of segment s's context that this layer writes and attends over. */
static nx_kv *seg_kv(const nx_seg *s, bool mtp, int32_t layer_slot) {
    return mtp ? &s->kc->mtp_kv : &s->kc->kv[layer_slot];
}

/* Positions below this are not attended (an MTP cache fed from there on). */
static int32_t seg_lo_min(const nx_seg *s, bool mtp) { return mtp ? s->kc->mtp_lo : 0; }

/* The segment row t (of the whole call) belongs to. */
static const nx_seg *seg_of(const nx_seg *seg, int n_seg, int32_t t) {
    int i = 0;
    while (i + 1 < n_seg && t >= seg[i + 1].r0) i++;
    return &seg[i];
}

/* hd elements of a key or value row into a cache row of dtype dt. */
static void cache_put(nx_dtype dt, void *row, const float *src, int32_t hd) {
    if (dt == NX_DTYPE_F16) {
        uint16_t *dst = row;
        for (int32_t i = 0; i < hd; i++) dst[i] = nx_f32_to_f16(src[i]);
    } else {
        memcpy(row, src, sizeof(float) * (size_t)hd);
    }
}

/* Biases, q/k-norm and RoPE on row t's query and key heads of kv head h (each query head with
 * the kv head it shares), then its key and value into its segment's cache at its position. */
static void qk_post(const attn_job *j, const nx_seg *sg, int32_t t, int64_t h) {
    nx_ctx *c = j->c;
    const nx_layer *L = j->L;
    const float eps = c->m->cfg.rms_eps;
    const int32_t hd = j->hd, group = j->n_heads / j->n_kv, qw = j->n_heads * hd, kvw = j->n_kv * hd;
    const int32_t rot = c->m->cfg.rotary_dim;
    const float *cs_sn = j->rope + (size_t)t * hd;
    for (int64_t qh = h * group; qh < (h + 1) * group; qh++) {
        float *q = c->q + (size_t)t * qw + (size_t)qh * hd;
        if (c->m->cfg.attn_gate) memcpy(q, c->qg + (size_t)t * 2 * qw + (size_t)qh * 2 * hd, sizeof(float) * (size_t)hd);
        if (L->bq) add_bias(q, L->bq + (size_t)qh * hd, hd);
        if (L->q_norm) nx_rmsnorm_f32(q, L->q_norm, eps, hd, q);
        rope_apply(q, rot, cs_sn, c->m->cfg.rope_pairs);
    }
    float *k = c->k + (size_t)t * kvw + (size_t)h * hd, *v = c->v + (size_t)t * kvw + (size_t)h * hd;
    if (L->bk) add_bias(k, L->bk + (size_t)h * hd, hd);
    if (L->bv) add_bias(v, L->bv + (size_t)h * hd, hd);
    if (L->k_norm) nx_rmsnorm_f32(k, L->k_norm, eps, hd, k);
    rope_apply(k, rot, cs_sn, c->m->cfg.rope_pairs);
    const nx_kv *kv = seg_kv(sg, j->mtp, j->layer_slot);
    const int32_t pos = sg->pos0 + (t - sg->r0);
    cache_put(c->m->kv_dtype, nx_kv_row(sg->kc, kv->k, h, pos), k, hd);
    cache_put(c->m->kv_dtype, nx_kv_row(sg->kc, kv->v, h, pos), v, hd);
}

/* The first cached position the row at pos attends to (sliding window, MTP cache start). */
static int32_t attn_lo_of(int32_t window, int32_t lo_min, int32_t pos) {
    const int32_t lo = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    return lo < lo_min ? lo_min : lo;
}

/* Thread ith's score rows in context kc ((rows, kc->n_ctx): a row attends to at most n_ctx
 * positions of that context's cache). */
static float *thread_scores(const nx_ctx *kc, int32_t rows, int ith) {
    return kc->scores + (size_t)ith * (size_t)rows * (size_t)kc->n_ctx;
}

/* Row t's attention for the query heads of kv head kvh (computed together, so each cached key
 * and value is read once for all of them), over its segment's cache, with thread ith's score
 * scratch in that segment's context. */
static void attend(const attn_job *j, const nx_seg *sg, int ith, int32_t t, int32_t kvh) {
    nx_ctx *c = j->c, *kc = sg->kc;
    const int32_t qw = j->n_heads * j->hd, group = j->n_heads / j->n_kv;
    const int32_t pos = sg->pos0 + (t - sg->r0), lo = attn_lo_of(j->window, seg_lo_min(sg, j->mtp), pos);
    const int32_t n = pos + 1 - lo;
    const nx_dtype kt = c->m->kv_dtype;
    const nx_kv *kv = seg_kv(sg, j->mtp, j->layer_slot);
    float *sc = thread_scores(kc, group, ith);
    const float *qv = c->q + (size_t)t * qw + (size_t)kvh * group * j->hd;
    nx_attn_scores(qv, group, nx_kv_row(kc, kv->k, kvh, lo), kt, j->hd, n, j->hd, 1.0f / sqrtf((float)j->hd), sc,
                   kc->n_ctx);
    for (int32_t h = 0; h < group; h++) nx_softmax_f32(sc + (size_t)h * kc->n_ctx, n);
    float *o = c->att + (size_t)t * qw + (size_t)kvh * group * j->hd;
    memset(o, 0, sizeof(float) * (size_t)group * (size_t)j->hd);
    nx_attn_accum(sc, kc->n_ctx, group, nx_kv_row(kc, kv->v, kvh, lo), kt, j->hd, n, j->hd, o);
    if (c->m->cfg.attn_gate) /* o x σ(gate), the gate being each head's second half of q_proj */
        for (int32_t h = 0; h < group; h++) {
            const float *gt = c->qg + (size_t)t * 2 * qw + ((size_t)kvh * group + h) * 2 * j->hd + j->hd;
            for (int32_t i = 0; i < j->hd; i++) o[h * j->hd + i] *= 1.0f / (1.0f + expf(-gt[i]));
        }
}

/* The cached keys and values the attention over kv heads [h0, h1) reads first (up to KV_PF_BYTES
 * per head and cache: the rows the attention kernels' own prefetch, running that far ahead of
 * its reads, does not cover), handed to the thread's next matmul calls (the layer's
 * projections) to hint along their weights (side spans), so they arrive meanwhile. */
#define KV_PF_BYTES 8192
static int kv_prefetch(const attn_job *j, int64_t h0, int64_t h1, nx_span sp[NX_SIDE_SPANS]) {
    int n = 0;
    for (int si = 0; si < j->n_seg; si++) {
        const nx_seg *sg = &j->seg[si];
        const nx_kv *kv = seg_kv(sg, j->mtp, j->layer_slot);
        const int32_t lo = attn_lo_of(j->window, seg_lo_min(sg, j->mtp), sg->pos0);
        if (sg->pos0 <= lo) continue;
        const size_t hb = (size_t)j->hd * nx_dtype_size(j->c->m->kv_dtype);
        size_t bytes = (size_t)(sg->pos0 - lo) * hb;
        if (bytes > KV_PF_BYTES) bytes = KV_PF_BYTES;
        for (int64_t h = h0; h < h1 && n + 2 <= NX_SIDE_SPANS; h++) {
            sp[n++] = (nx_span){nx_kv_row(sg->kc, kv->k, h, lo), bytes};
            sp[n++] = (nx_span){nx_kv_row(sg->kc, kv->v, h, lo), bytes};
        }
    }
    return n;
}

/* The layer's attention as one pool job: the q/k/v projections (their rows shared between the
 * threads as pool shares, nx_matmul_shares_work: split by head, the threads' projection times
 * differed enough that each waited ~45 us per layer at the next barrier, Hy3-shaped 4-bit model,
 * ~800 us per layer on the Zen 5 VM; shared, ~6 us), the norms, RoPE, cache writes and attention,
 * then the output projection, shared the same way. One job instead of a projection job, serial
 * post-processing, an attention job and an output job: 4-bit model decode 1.00-1.01x. When the
 * threads can share the kv heads evenly each takes whole kv heads, so a thread's cache rows are
 * its own and it attends right after writing them; otherwise the (row, kv head) items are split
 * evenly, with a barrier between the cache writes and the attention that reads them (a row
 * attends to the rows before it, of the same head, written by any thread). */
static void attn_heads_worker(void *arg, int ith, int nth) {
    const attn_job *j = arg;
    nx_pool *pool = j->c->m->pool;
    const int by_heads = j->n_kv % nth == 0;
    long long b, e;
    nx_pool_split(by_heads ? j->n_kv : (long long)j->T * j->n_kv, ith, nth, &b, &e);
    nx_span sp[NX_SIDE_SPANS];
    nx_matmul_shares_work(j->qkv, 3, pool, ith, nth, sp, by_heads ? kv_prefetch(j, b, e, sp) : 0);
    nx_pool_barrier(pool, nth); /* every head's q, k and v */
    if (by_heads) {
        for (int si = 0; si < j->n_seg; si++) {
            const nx_seg *sg = &j->seg[si];
            for (int32_t t = sg->r0; t < sg->r0 + sg->T; t++)
                for (long long h = b; h < e; h++) qk_post(j, sg, t, h);
            for (int32_t t = sg->r0; t < sg->r0 + sg->T; t++)
                for (long long h = b; h < e; h++) attend(j, sg, ith, t, (int32_t)h);
        }
    } else {
        for (long long it = b; it < e; it++) {
            const int32_t t = (int32_t)(it / j->n_kv);
            qk_post(j, seg_of(j->seg, j->n_seg, t), t, it % j->n_kv);
        }
        nx_pool_barrier(pool, nth); /* every row's keys and values cached */
        for (long long it = b; it < e; it++) {
            const int32_t t = (int32_t)(it / j->n_kv);
            attend(j, seg_of(j->seg, j->n_seg, t), ith, t, (int32_t)(it % j->n_kv));
        }
    }
    if (ith == 0) nx_matmul_shares_reset(&j->wo, 1, pool, nth);
    nx_pool_barrier(pool, nth); /* every head's result, and the output projection's shares */
    nx_matmul_shares_work(&j->wo, 1, pool, ith, nth, NULL, 0);
}

/* xn (T, H) → c->y (T, H). Appends each segment's keys/values at its positions to its caches. */
static void attention(nx_ctx *c, const nx_layer *L, const nx_seg *seg, int n_seg, bool mtp, int32_t layer_slot,
                      int32_t T, int32_t window, double theta) {
    const nx_config *cfg = &c->m->cfg;
    const int32_t H = cfg->hidden_size, hd = cfg->head_dim, nh = cfg->n_heads, nkv = cfg->n_kv_heads;
    const int32_t qw = nh * hd, kvw = nkv * hd;
    nx_pool *pool = c->m->pool;
    const attn_job j = {c, L, seg, n_seg, mtp, layer_slot, rope_table(c, seg, n_seg, hd, cfg->rotary_dim, theta), T,
                        nh, nkv, hd, window,
                        .qkv = {{&L->wq, c->xn, H, T, cfg->attn_gate ? c->qg : c->q, cfg->attn_gate ? 2 * qw : qw},
                                {&L->wk, c->xn, H, T, c->k, kvw},
                                {&L->wv, c->xn, H, T, c->v, kvw}},
                        .wo = {&L->wo, c->att, qw, T, c->y, H}};
    nx_matmul_shares_reset(j.qkv, 3, pool, nx_pool_size(pool));
    nx_pool_run(pool, attn_heads_worker, (void *)&j);
}

/* ---------------------------------------------------------------- latent attention */

/* Multi-head latent attention (docs/design.md §12.3) in the absorbed form, for every row count:
 * the cache holds per position only [kv_a_norm(latent) | roped k_pe] (cache_k values); each
 * head's query is taken into that space, q_lat = [wk_b_h · q_nope | rope(q_pe)], so a score is
 * one dot product with a cache row, and the weighted sum of the cached latents leaves it through
 * wv_b_h. Scratch: c->q (T, heads·(nope + rope)) the query, c->k (T, q_lora) its LoRA, c->v
 * (T, cache_k) the new cache rows, c->lat_q (T, heads·cache_k), c->lat_part the position blocks'
 * partial results, c->lat_o (T, heads·kv_lora), c->att (T, heads·v) the heads' outputs. */
typedef struct mla_job {
    nx_ctx *c;
    const nx_layer *L;
    const nx_seg *seg;
    int n_seg;
    bool mtp;
    int32_t layer_slot;
    const float *rope;
    int32_t T, window;
    nx_matmul_task in[2], qb, wo;
} mla_job;

/* Row t's new cache row: the latent's norm and the shared key's RoPE (and the q LoRA's norm). */
static void mla_rows(const mla_job *j, int32_t t) {
    nx_ctx *c = j->c;
    const nx_config *cfg = &c->m->cfg;
    const nx_mla *m = &cfg->mla;
    const nx_mla_layer *a = &j->L->mla;
    float *kv = c->v + (size_t)t * cfg->cache_k;
    if (m->q_lora_rank) {
        float *qa = c->k + (size_t)t * m->q_lora_rank;
        nx_rmsnorm_f32(qa, a->q_a_norm, cfg->rms_eps, m->q_lora_rank, qa);
    }
    nx_rmsnorm_f32(kv, a->kv_a_norm, cfg->rms_eps, m->kv_lora_rank, kv);
    rope_apply(kv + m->kv_lora_rank, m->qk_rope, j->rope + (size_t)t * cfg->head_dim, cfg->rope_pairs);
    const nx_seg *sg = seg_of(j->seg, j->n_seg, t);
    cache_put(c->m->kv_dtype, nx_kv_row(sg->kc, seg_kv(sg, j->mtp, j->layer_slot)->k, 0, sg->pos0 + (t - sg->r0)), kv,
              cfg->cache_k);
}

/* Heads [h0, h1) of every row: the queries into the latent space, with thread scratch s. Each
 * head's rows of wk_b (wv_b) multiply that head's own input: block-diagonal products, one call
 * over the thread's heads each (nx_matmul_blocks: the same bits as a call per head). */
static void mla_queries(const mla_job *j, int64_t h0, int64_t h1, nx_kscratch *s) {
    nx_ctx *c = j->c;
    const nx_config *cfg = &c->m->cfg;
    const nx_mla *m = &cfg->mla;
    const int64_t nh = cfg->n_heads, qk = cfg->head_dim, ck = cfg->cache_k, r = m->kv_lora_rank;
    const nx_blocks kb = {&j->L->mla.wk_b, r, r, c->q, qk, nh * qk, j->T, c->lat_q, ck, nh * ck};
    nx_matmul_blocks(&kb, h0, h1, NULL, s);
    for (int64_t h = h0; h < h1; h++)
        for (int32_t t = 0; t < j->T; t++) {
            float *pe = c->lat_q + (size_t)t * nh * ck + h * ck + r;
            memcpy(pe, c->q + (size_t)t * nh * qk + h * qk + m->qk_nope, sizeof(float) * (size_t)m->qk_rope);
            rope_apply(pe, m->qk_rope, j->rope + (size_t)t * qk, cfg->rope_pairs);
        }
}

/* The heads' results out of the latent space (heads [h0, h1) of every row). */
static void mla_values(const mla_job *j, int64_t h0, int64_t h1, nx_kscratch *s) {
    nx_ctx *c = j->c;
    const nx_config *cfg = &c->m->cfg;
    const nx_mla_layer *a = &j->L->mla;
    const int64_t nh = cfg->n_heads, r = cfg->mla.kv_lora_rank, vd = cfg->mla.v_head_dim;
    const nx_linear wv = nx_linear_rows(&a->wv_b, a->wv_b_off, a->wv_b.out - a->wv_b_off);
    const nx_blocks vb = {&wv, a->wv_b_stride, vd, c->lat_o, r, nh * r, j->T, c->att, vd, nh * vd};
    nx_matmul_blocks(&vb, h0, h1, NULL, s);
}

/* Position blocks. Every head of a row attends to the same cached rows, so a row's positions are
 * split into blocks, each read once for all the heads (one thread's share of a long context is
 * a part of it, not all of it once per thread); a block's scores give its max m, sum z of
 * e^(s - m) and partial result o = Σ e^(s - m)·row, and the blocks are folded in order. A row
 * attending to n positions has blocks of mla_block_len(n): NX_MLA_BLOCK, or a multiple so there
 * are at most NX_MLA_MAX_BLOCKS. Only n decides them, and each head's partial is the same
 * whichever heads share the call (nx_attn_scores/accum), so a row gets the same bits in any
 * batch and on any number of threads. */
static int32_t mla_block_len(int32_t n) {
    const int32_t span = NX_MLA_BLOCK * NX_MLA_MAX_BLOCKS;
    return NX_MLA_BLOCK * ((n + span - 1) / span);
}

/* Row t's attended positions: the first cached row, their count, and its segment's context. */
static const void *mla_span(const mla_job *j, int32_t t, int32_t *n, nx_ctx **kc) {
    const nx_seg *sg = seg_of(j->seg, j->n_seg, t);
    const int32_t pos = sg->pos0 + (t - sg->r0), lo = attn_lo_of(j->window, seg_lo_min(sg, j->mtp), pos);
    *n = pos + 1 - lo;
    *kc = sg->kc;
    return nx_kv_row(sg->kc, seg_kv(sg, j->mtp, j->layer_slot)->k, 0, lo);
}

/* How many positions row t attends to, and in how many blocks. */
static int32_t mla_n(const mla_job *j, int32_t t) {
    int32_t n;
    nx_ctx *kc;
    (void)mla_span(j, t, &n, &kc);
    return n;
}

static int32_t mla_blocks_of(int32_t n) {
    const int32_t len = mla_block_len(n);
    return (n + len - 1) / len;
}

/* Block b of row t for heads [h0, h1): its partials into pass slot `slot` of c->lat_part. */
static void mla_block(const mla_job *j, int32_t t, int32_t slot, int32_t b, int64_t h0, int64_t h1, int ith) {
    nx_ctx *c = j->c, *kc;
    const nx_config *cfg = &c->m->cfg;
    const int64_t nh = cfg->n_heads, ck = cfg->cache_k, r = cfg->mla.kv_lora_rank, g = h1 - h0;
    int32_t n;
    const void *rows = mla_span(j, t, &n, &kc);
    const int32_t len = mla_block_len(n), p0 = b * len, np = n - p0 < len ? n - p0 : len;
    const nx_dtype kt = c->m->kv_dtype;
    rows = (const char *)rows + (size_t)p0 * (size_t)ck * nx_dtype_size(kt);
    float *part = c->lat_part + (size_t)slot * NX_MLA_MAX_BLOCKS * nh * (r + 2);
    float *o = part + ((size_t)b * nh + h0) * r, *mz = part + (size_t)NX_MLA_MAX_BLOCKS * nh * r;
    float *sc = thread_scores(kc, (int32_t)nh, ith);
    nx_attn_scores(c->lat_q + ((size_t)t * nh + h0) * ck, g, rows, kt, ck, np, ck, cfg->mla.scale, sc, kc->n_ctx);
    for (int64_t h = 0; h < g; h++) {
        float *st = mz + ((size_t)b * nh + h0 + h) * 2;
        st[1] = nx_exp_shift_f32(sc + h * kc->n_ctx, np, &st[0]);
    }
    memset(o, 0, sizeof(float) * (size_t)(g * r));
    nx_attn_accum(sc, kc->n_ctx, g, rows, kt, ck, np, r, o);
}

/* Thread ith's share of the blocks of rows [t0, t1) (slots 0..): the (block, row, head group)
 * items in that order (the rows of a prefill pass take each block in turn while it is in L2),
 * weighted by positions x heads, each to the thread whose share of the total weight holds the
 * item's middle; the blocks are split into head groups when there are fewer than 8 a thread (a
 * short context's one block), so that the shares come out even. A thread's items are
 * consecutive: its groups of a block make one call. */
static void mla_pass_blocks(const mla_job *j, int32_t t0, int32_t t1, int ith, int nth) {
    const int64_t nh = j->c->m->cfg.n_heads;
    int64_t items = 0, total = 0;
    int32_t most = 0;
    for (int32_t t = t0; t < t1; t++) {
        const int32_t n = mla_n(j, t), nb = mla_blocks_of(n);
        items += nb;
        most = nb > most ? nb : most;
        total += (int64_t)n * nh;
    }
    const int64_t want = (8 * (int64_t)nth + items - 1) / items, groups = want < nh ? want : nh;
    int64_t at = 0; /* weight before the current item */
    for (int32_t b = 0; b < most; b++)
        for (int32_t t = t0; t < t1; t++) {
            const int32_t n = mla_n(j, t), len = mla_block_len(n);
            if ((int64_t)b * len >= n) continue;
            const int64_t np = n - b * len < len ? n - b * len : len;
            int64_t g0 = -1, g1 = -1;
            for (int64_t g = 0; g < groups; g++) {
                const int64_t w = np * ((g + 1) * nh / groups - g * nh / groups);
                if ((2 * at + w) * nth / (2 * total) == ith) {
                    if (g0 < 0) g0 = g;
                    g1 = g + 1;
                }
                at += w;
            }
            if (g0 >= 0) mla_block(j, t, t - t0, b, g0 * nh / groups, g1 * nh / groups, ith);
        }
}

/* Row t's heads [h0, h1) from its blocks' partials (pass slot `slot`), folded in block order:
 * each block weighted by e^(m_b - max m), the sum divided by the weighted sums z_b. */
static void mla_fold(const mla_job *j, int32_t t, int32_t slot, int64_t h0, int64_t h1) {
    nx_ctx *c = j->c;
    const int64_t nh = c->m->cfg.n_heads, r = c->m->cfg.mla.kv_lora_rank;
    const int32_t nb = mla_blocks_of(mla_n(j, t));
    const float *part = c->lat_part + (size_t)slot * NX_MLA_MAX_BLOCKS * nh * (r + 2);
    const float *mz = part + (size_t)NX_MLA_MAX_BLOCKS * nh * r;
    for (int64_t h = h0; h < h1; h++) {
        float mx = -INFINITY, z = 0.0f, *o = c->lat_o + ((size_t)t * nh + h) * r;
        for (int32_t b = 0; b < nb; b++)
            if (mz[((size_t)b * nh + h) * 2] > mx) mx = mz[((size_t)b * nh + h) * 2];
        memset(o, 0, sizeof(float) * (size_t)r);
        for (int32_t b = 0; b < nb; b++) {
            const float *st = mz + ((size_t)b * nh + h) * 2, w = expf(st[0] - mx);
            nx_axpy_f32(w, part + ((size_t)b * nh + h) * r, o, r);
            z += w * st[1];
        }
        const float inv = 1.0f / z;
        for (int64_t i = 0; i < r; i++) o[i] *= inv;
    }
}

/* The layer's latent attention as one pool job: the q (or q LoRA) and latent projections as
 * shares; the new cache rows split by row; q_b_proj as shares; the queries into the latent space
 * split by head; the position blocks of as many rows as c->lat_part holds, then their folds by
 * head, pass after pass; the values out of it by head (the same heads: each thread folded its
 * own); the output projection as shares. */
static void mla_worker(void *arg, int ith, int nth) {
    const mla_job *j = arg;
    nx_ctx *c = j->c;
    nx_pool *pool = c->m->pool;
    const bool lora = c->m->cfg.mla.q_lora_rank > 0;
    long long b, e;
    nx_matmul_shares_work(j->in, 2, pool, ith, nth, NULL, 0);
    nx_pool_barrier(pool, nth); /* every row's projections */
    nx_pool_split(j->T, ith, nth, &b, &e);
    for (long long t = b; t < e; t++) mla_rows(j, (int32_t)t);
    if (ith == 0 && lora) nx_matmul_shares_reset(&j->qb, 1, pool, nth);
    nx_pool_barrier(pool, nth); /* the cache rows, the normed q LoRA */
    if (lora) {
        nx_matmul_shares_work(&j->qb, 1, pool, ith, nth, NULL, 0);
        nx_pool_barrier(pool, nth);
    }
    nx_kscratch *s = nx_kscratch_of(pool, ith);
    nx_pool_split(c->m->cfg.n_heads, ith, nth, &b, &e);
    if (b < e) mla_queries(j, b, e, s);
    nx_pool_barrier(pool, nth); /* every head's query */
    for (int32_t t0 = 0; t0 < j->T; t0 += c->lat_part_rows) {
        const int32_t t1 = j->T - t0 < c->lat_part_rows ? j->T : t0 + c->lat_part_rows;
        mla_pass_blocks(j, t0, t1, ith, nth);
        nx_pool_barrier(pool, nth); /* every block's partials */
        for (int32_t t = t0; t < t1 && b < e; t++) mla_fold(j, t, t - t0, b, e);
        if (t1 < j->T) nx_pool_barrier(pool, nth); /* folded before the next pass's blocks */
    }
    if (b < e) mla_values(j, b, e, s);
    if (ith == 0) nx_matmul_shares_reset(&j->wo, 1, pool, nth);
    nx_pool_barrier(pool, nth); /* every head's result, and the output projection's shares */
    nx_matmul_shares_work(&j->wo, 1, pool, ith, nth, NULL, 0);
}

/* xn (T, H) → c->y (T, H). Appends each segment's latent cache rows at its positions to its caches. */
static void mla_attention(nx_ctx *c, const nx_layer *L, const nx_seg *seg, int n_seg, bool mtp, int32_t layer_slot,
                          int32_t T, int32_t window, double theta) {
    const nx_config *cfg = &c->m->cfg;
    const nx_mla *m = &cfg->mla;
    const int32_t H = cfg->hidden_size, nh = cfg->n_heads, qw = nh * cfg->head_dim;
    nx_pool *pool = c->m->pool;
    const bool lora = m->q_lora_rank > 0;
    const mla_job j = {c, L, seg, n_seg, mtp, layer_slot, rope_table(c, seg, n_seg, cfg->head_dim, m->qk_rope, theta),
                       T, window,
                       .in = {lora ? (nx_matmul_task){&L->mla.wq_a, c->xn, H, T, c->k, m->q_lora_rank}
                                   : (nx_matmul_task){&L->wq, c->xn, H, T, c->q, qw},
                              {&L->mla.wkv_a, c->xn, H, T, c->v, cfg->cache_k}},
                       .qb = {&L->mla.wq_b, c->k, m->q_lora_rank, T, c->q, qw},
                       .wo = {&L->wo, c->att, (int64_t)nh * m->v_head_dim, T, c->y, H}};
    nx_matmul_shares_reset(j.in, 2, pool, nx_pool_size(pool));
    nx_pool_run(pool, mla_worker, (void *)&j);
}

/* ---------------------------------------------------------------- feed-forward */

/* How ffn_many folds its outputs into y (MoE): routed rows r < n_routed add w[r]·out[r] to
 * y[row[r]] in ascending r, then, if shared is set, y[t] += shared[t] for t < T. */
typedef struct ffn_combine {
    float *y;
    const int32_t *row;
    const float *w;
    int32_t n_routed;
    const float *shared;
    int32_t T;
    const float *shared_w; /* per row t, the shared expert's weight (NULL: 1) */
} ffn_combine;

typedef struct ffn_job {
    nx_ctx *c;
    const nx_ffn *const *f;
    const float *const *x;
    const int32_t *n;
    float *const *out;
    float *gs[NX_MAX_EXPERTS_TOUCHED + 1];
    int items;
    long long units; /* gate/up: 16-row chunks of every item's F, concatenated */
    int shared;      /* the running job's units are pool shares (else a static split) */
    const ffn_combine *comb;
} ffn_job;

/* Multiply-adds below which the feed-forward runs on the calling thread: a pool wake-up costs
 * a few microseconds, not worth it for tiny experts. */
#define FFN_POOL_MIN_MACS 98304

/* Units a thread claims at least per piece of a shared job (nx_pool_share_next): about 32 KB of
 * weights, so a piece's call stays long against its fixed cost (~0.3 µs: quantizing the input
 * row, streaming start-up). */
static long long share_min_units(size_t unit_bytes) {
    const long long u = unit_bytes ? (long long)(32768 / unit_bytes) : 1;
    return u > 0 ? u : 1;
}

/* The rows of gate (down: down) of the item that unit nb falls in, units [nb, ne): where the
 * thread's next piece most likely begins, for the last call of a piece to prefetch into. */
static int ffn_next_rows(const ffn_job *j, int down, long long nb, long long ne, nx_rows *r) {
    const int32_t H = j->c->m->cfg.hidden_size;
    long long base = 0;
    for (int i = 0; i < j->items && nb < ne; i++) {
        const nx_linear *W = down ? &j->f[i]->down : &j->f[i]->gate;
        const long long nc = ((down ? H : W->out) + ROW_CHUNK - 1) / ROW_CHUNK;
        if (nb < base + nc) return nx_rows_of_units(W, ROW_CHUNK, base, nb, ne, r);
        base += nc;
    }
    return 0;
}

/* Gate, up and SwiGLU of units [b, e) (16-row chunks of every item's F, concatenated); units
 * [nb, ne) are where the thread likely goes next. */
static void ffn_gate_up_units(ffn_job *j, long long b, long long e, long long nb, long long ne, nx_kscratch *s) {
    const int32_t H = j->c->m->cfg.hidden_size;
    long long base = 0;
    for (int i = 0; i < j->items && base < e; i++) {
        const int64_t F = j->f[i]->gate.out;
        const long long nc = (F + ROW_CHUNK - 1) / ROW_CHUNK;
        nx_rows gr, ur, ng;
        if (nx_rows_of_units(&j->f[i]->gate, ROW_CHUNK, base, b, e, &gr)) {
            const int64_t r0 = gr.r0, r1 = gr.r1;
            const int has_next =
                (i + 1 < j->items && nx_rows_of_units(&j->f[i + 1]->gate, ROW_CHUNK, base + nc, b, e, &ng)) ||
                (base + nc >= e && ffn_next_rows(j, 0, nb, ne, &ng));
            ur = (nx_rows){&j->f[i]->up, r0, r1};
            float *g = j->gs[i], *u = j->c->u + (g - j->c->g);
            nx_matmul_rows_then(&j->f[i]->gate, j->x[i], H, j->n[i], g, F, r0, r1, &ur, s);
            nx_matmul_rows_then(&j->f[i]->up, j->x[i], H, j->n[i], u, F, r0, r1, has_next ? &ng : NULL, s);
            for (int32_t t = 0; t < j->n[i]; t++) nx_swiglu_f32(g + t * F + r0, u + t * F + r0, r1 - r0);
        }
        base += nc;
    }
}

/* Runs thread ith's part of the job's n units through units(): pool shares (set up by
 * ffn_many), so a thread that is ahead takes over the end of another's work, since an idle
 * core leaves its share of the machine's memory bandwidth unused; else a static split. */
static void ffn_run_units(ffn_job *j, int ith, int nth, long long n,
                          void (*units)(ffn_job *, long long, long long, long long, long long, nx_kscratch *)) {
    long long b, e, nb, ne;
    nx_pool *pool = j->c->m->pool;
    nx_kscratch *s = nx_kscratch_of(pool, ith);
    if (nth <= 1 || !j->shared) {
        nx_pool_split(n, ith, nth, &b, &e);
        units(j, b, e, 0, 0, s);
        return;
    }
    while (nx_pool_share_next(pool, ith, &b, &e)) {
        nx_pool_share_peek(pool, ith, &nb, &ne);
        units(j, b, e, nb, ne, s);
    }
}

/* Gate and up rows of the same chunks on the same thread, so SwiGLU follows at once. Each
 * matmul names the next one, so the kernels' prefetch runs on from gate to up to the next
 * item's gate. */
static void ffn_gate_up_worker(void *arg, int ith, int nth) {
    ffn_job *j = arg;
    ffn_run_units(j, ith, nth, j->units, ffn_gate_up_units);
}

/* Down projections of units [b, e) (16-row chunks of each item's output in turn). */
static void ffn_down_units(ffn_job *j, long long b, long long e, long long nb, long long ne, nx_kscratch *s) {
    const int32_t H = j->c->m->cfg.hidden_size;
    const long long nc = (H + ROW_CHUNK - 1) / ROW_CHUNK;
    for (int i = (int)(b / nc); i < j->items && (long long)i * nc < e; i++) {
        nx_rows dr, nd;
        nx_rows_of_units(&j->f[i]->down, ROW_CHUNK, i * nc, b, e, &dr);
        const int has_next =
            (i + 1 < j->items && nx_rows_of_units(&j->f[i + 1]->down, ROW_CHUNK, (i + 1) * nc, b, e, &nd)) ||
            ((long long)(i + 1) * nc >= e && ffn_next_rows(j, 1, nb, ne, &nd));
        nx_matmul_rows_then(&j->f[i]->down, j->gs[i], j->f[i]->gate.out, j->n[i], j->out[i], H, dr.r0, dr.r1,
                            has_next ? &nd : NULL, s);
    }
}

/* Down projections, then the combine. The down rows of all items, as 16-row chunks of each item
 * in turn, are shared across the threads as the gate/up units are, so a thread makes a few
 * calls over whole matrices rather than one over a slice of every matrix (a call costs a fixed
 * ~1 µs of streaming start-up). After a barrier, each thread folds one slice of the hidden
 * dimension of every item's output into y, in the fixed order of ffn_combine. */
static void ffn_down_worker(void *arg, int ith, int nth) {
    ffn_job *j = arg;
    const int32_t H = j->c->m->cfg.hidden_size;
    const long long nc = (H + ROW_CHUNK - 1) / ROW_CHUNK;
    ffn_run_units(j, ith, nth, nc * j->items, ffn_down_units);
    const ffn_combine *cb_ = j->comb;
    if (!cb_) return;
    nx_pool_barrier(j->c->m->pool, nth);
    long long cb, ce;
    nx_pool_split(nc, ith, nth, &cb, &ce);
    const int64_t a = cb * ROW_CHUNK, z = ce * ROW_CHUNK < H ? ce * ROW_CHUNK : H;
    if (a >= z) return;
    for (int32_t r = 0; r < cb_->n_routed; r++)
        nx_axpy_f32(cb_->w[r], j->out[0] + (size_t)r * H + a, cb_->y + (size_t)cb_->row[r] * H + a, z - a);
    if (cb_->shared && cb_->shared_w)
        for (int32_t t = 0; t < cb_->T; t++)
            nx_axpy_f32(cb_->shared_w[t], cb_->shared + (size_t)t * H + a, cb_->y + (size_t)t * H + a, z - a);
    else if (cb_->shared)
        for (int32_t t = 0; t < cb_->T; t++)
            for (int64_t k = a; k < z; k++) cb_->y[(size_t)t * H + k] += cb_->shared[(size_t)t * H + k];
}

/* SwiGLU over groups of rows: item i applies ffn f[i] to n[i] rows of x[i] (row stride H),
 * writing out[i] (n[i], H); with comb, the outputs are also folded into comb->y (the routed
 * items' outputs must then be consecutive rows from out[0]). Gate, up and SwiGLU of every item
 * run as one parallel job, down and the combine as another. Scratch: c->g / c->u hold
 * (Σ n[i], F). */
/* Items [0, n) of j: their gate outputs' scratch rows, consecutive from c->g, and their gate/up
 * units (j->units). Returns their multiply-adds. */
static double ffn_layout(ffn_job *j, int n) {
    size_t off = 0;
    double work = 0;
    j->units = 0;
    for (int i = 0; i < n; i++) {
        const int64_t F = j->f[i]->gate.out;
        j->gs[i] = j->c->g + off;
        off += (size_t)j->n[i] * (size_t)F;
        j->units += (F + ROW_CHUNK - 1) / ROW_CHUNK;
        work += 3.0 * (double)F * (double)j->f[i]->gate.in * (double)j->n[i];
    }
    return work;
}

/* j's gate/up units, then every item's down rows, as pool shares for nth threads (whole items
 * at a time while enough is left). */
static void ffn_share_gate_up(ffn_job *j, int nth) {
    const nx_ffn *f0 = j->f[0];
    const size_t unit = ROW_CHUNK * (nx_linear_row_bytes(&f0->gate) + nx_linear_row_bytes(&f0->up));
    j->shared = nx_pool_share_reset(j->c->m->pool, nth, j->units, share_min_units(unit),
                                    (f0->gate.out + ROW_CHUNK - 1) / ROW_CHUNK) == 0;
}

static void ffn_share_down(ffn_job *j, int nth) {
    const long long nc = (j->c->m->cfg.hidden_size + ROW_CHUNK - 1) / ROW_CHUNK;
    j->shared = nx_pool_share_reset(j->c->m->pool, nth, nc * j->items,
                                    share_min_units(ROW_CHUNK * nx_linear_row_bytes(&j->f[0]->down)), nc) == 0;
}

static void ffn_many(nx_ctx *c, const nx_ffn *const *f, const float *const *x, const int32_t *n,
                     float *const *out, int items, const ffn_combine *comb) {
    ffn_job j = {.c = c, .f = f, .x = x, .n = n, .out = out, .items = items, .comb = comb};
    const double work = ffn_layout(&j, items);
    nx_pool *pool = c->m->pool;
    if (nx_pool_size(pool) <= 1 || work < FFN_POOL_MIN_MACS) {
        ffn_gate_up_worker(&j, 0, 1);
        ffn_down_worker(&j, 0, 1);
    } else {
        ffn_share_gate_up(&j, nx_pool_size(pool));
        nx_pool_run(pool, ffn_gate_up_worker, &j);
        ffn_share_down(&j, nx_pool_size(pool));
        nx_pool_run(pool, ffn_down_worker, &j);
    }
}

static void ffn(nx_ctx *c, const nx_ffn *f, const float *in, int32_t n, float *out) {
    ffn_many(c, &f, &in, &n, &out, 1, NULL);
}


/* The groups the DeepSeek group limit keeps (docs/design.md §12): each of n_group equal groups is
 * scored by the sum of its two best biased scores (its only one, for groups of one), and the
 * topk_group best groups (ties: lower group) are marked in keep. */
static void route_groups(const float *logits, const float *bias, int32_t E, int32_t n_group, int32_t topk_group,
                         bool *keep) {
    float gs[NX_MAX_GROUPS];
    const int32_t gsize = E / n_group;
    for (int32_t g = 0; g < n_group; g++) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int32_t e = g * gsize; e < (g + 1) * gsize; e++) {
            float ce = 1.0f / (1.0f + expf(-logits[e])) + (bias ? bias[e] : 0.0f);
            if (ce > b1) {
                b2 = b1;
                b1 = ce;
            } else if (ce > b2) {
                b2 = ce;
            }
        }
        gs[g] = gsize > 1 ? b1 + b2 : b1;
        keep[g] = false;
    }
    for (int32_t n = 0; n < topk_group; n++) {
        int32_t best = -1;
        for (int32_t g = 0; g < n_group; g++)
            if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
        keep[best] = true;
    }
}

/* Routing for one row (docs/design.md §2.4, §12): sigmoid scores in f32, expert_bias
 * only to choose, among the experts of the groups route_groups keeps (an expert of a dropped
 * group is never chosen, whatever its score: transformers and mlx-lm fill them with 0, which
 * only differs when a kept score is negative); weights from the unbiased scores, renormalised,
 * scaled. Ties go to the lower expert id. */
void nx_moe_route_softmax(const float *logits, int32_t E, int32_t k, bool renorm, int32_t *idx, float *w) {
    float mx = logits[0], sum = 0.0f, tsum = 0.0f;
    for (int32_t e = 1; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    for (int32_t e = 0; e < E; e++) sum += expf(logits[e] - mx);
    for (int32_t i = 0; i < k; i++) { /* k passes: the largest logit not taken yet, ties to the lower id */
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++) {
            bool taken = false;
            for (int32_t j = 0; j < i && !taken; j++) taken = idx[j] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        idx[i] = best;
        w[i] = expf(logits[best] - mx) / sum;
        tsum += w[i];
    }
    if (renorm)
        for (int32_t i = 0; i < k; i++) w[i] /= tsum;
}

void nx_moe_route_grouped(const float *logits, const float *bias, int32_t E, int32_t k, int32_t n_group,
                          int32_t topk_group, bool renorm, float scaling, int32_t *idx, float *w) {
    bool keep[NX_MAX_GROUPS];
    const bool limit = n_group > 1 && topk_group < n_group;
    if (limit) route_groups(logits, bias, E, n_group, topk_group, keep);
    const int32_t gsize = limit ? E / n_group : E;
    for (int32_t i = 0; i < k; i++) idx[i] = -1;
    for (int32_t e = 0; e < E; e++) {
        if (limit && !keep[e / gsize]) continue;
        float ce = 1.0f / (1.0f + expf(-logits[e])) + (bias ? bias[e] : 0.0f);
        /* insertion into a descending top-k list */
        int32_t pos = k; /* w[i] holds the choice score of idx[i] while choosing */
        while (pos > 0 && !(idx[pos - 1] >= 0 && w[pos - 1] >= ce)) pos--;
        if (pos >= k) continue;
        for (int32_t i = k - 1; i > pos; i--) {
            idx[i] = idx[i - 1];
            w[i] = w[i - 1];
        }
        idx[pos] = e;
        w[pos] = ce;
    }
    double sum = 0.0;
    for (int32_t i = 0; i < k; i++) {
        w[i] = 1.0f / (1.0f + expf(-logits[idx[i]]));
        sum += w[i];
    }
    for (int32_t i = 0; i < k; i++) {
        if (renorm && k > 1) w[i] = (float)(w[i] / (sum + 1e-20));
        w[i] *= scaling;
    }
}

void nx_moe_route(const float *logits, const float *bias, int32_t E, int32_t k, bool renorm,
                  float scaling, int32_t *idx, float *w) {
    nx_moe_route_grouped(logits, bias, E, k, 1, 1, renorm, scaling, idx, w);
}

/* The router's choices for T rows (c->sel, c->selw) and the statistics of their overlap with
 * the previous rows' choices. The router runs on the calling thread with scratch `alone` when
 * that is set, else on the pool. */
static void moe_select(nx_ctx *c, const nx_moe *M, int32_t T, int32_t layer_slot, nx_kscratch *alone) {
    const nx_config *cfg = &c->m->cfg;
    const int32_t H = cfg->hidden_size, E = M->n_experts, k = cfg->top_k;
    if (alone) nx_matmul_rows(&M->router, c->xn, H, T, c->router, E, 0, E, alone);
    else nx_matmul(&M->router, c->xn, H, T, c->router, E, c->m->pool);
    for (int32_t t = 0; t < T; t++)
        if (cfg->router == NX_ROUTER_SOFTMAX)
            nx_moe_route_softmax(c->router + (size_t)t * E, E, k, cfg->route_norm, c->sel + (size_t)t * k,
                                 c->selw + (size_t)t * k);
        else
            nx_moe_route_grouped(c->router + (size_t)t * E, M->expert_bias, E, k, cfg->n_group, cfg->topk_group,
                                 cfg->route_norm, cfg->router_scaling, c->sel + (size_t)t * k, c->selw + (size_t)t * k);
    nx_route_tally(&c->m->routes, layer_slot, c->sel, (int64_t)T * k);
    if (M->shared_gate.w) { /* σ(shared_expert_gate · x) per row */
        if (alone) nx_matmul_rows(&M->shared_gate, c->xn, H, T, c->sgate, 1, 0, 1, alone);
        else nx_matmul(&M->shared_gate, c->xn, H, T, c->sgate, 1, c->m->pool);
        for (int32_t t = 0; t < T; t++) c->sgate[t] = 1.0f / (1.0f + expf(-c->sgate[t]));
    }

    /* overlap of consecutive rows' choices (across calls for single-row steps) */
    int32_t *prev = c->prev_sel + (size_t)layer_slot * k;
    for (int32_t t = 0; t < T; t++) {
        const int32_t *cur = c->sel + (size_t)t * k;
        const int32_t *ref = t > 0 ? cur - k : prev;
        if (ref[0] >= 0) {
            int32_t shared = 0;
            for (int32_t a = 0; a < k; a++)
                for (int32_t b = 0; b < k; b++) shared += cur[a] == ref[b];
            c->traffic.overlap += shared;
            c->traffic.overlap_pairs++;
        }
    }
    memcpy(prev, c->sel + (size_t)(T - 1) * k, sizeof(int32_t) * (size_t)k);
}

/* The shared expert's per-row weights moe_select left in c->sgate, or NULL (weight 1). */
static const float *shared_weights(const nx_ctx *c, const nx_moe *M) {
    return M->has_shared && M->shared_gate.w ? c->sgate : NULL;
}

/* The items of ffn_many for a MoE layer: the routed experts in ascending id, then the shared
 * expert (when the layer has one). */
typedef struct moe_items {
    const nx_ffn *f[NX_MAX_EXPERTS_TOUCHED + 1];
    const float *xs[NX_MAX_EXPERTS_TOUCHED + 1];
    float *outs[NX_MAX_EXPERTS_TOUCHED + 1];
    int32_t ns[NX_MAX_EXPERTS_TOUCHED + 1];
    int items, total; /* total: routed rows so far */
} moe_items;

/* Appends item f: n rows at x, its outputs to out. */
static void moe_items_push(moe_items *it, const nx_ffn *f, const float *x, float *out, int32_t n) {
    it->f[it->items] = f;
    it->xs[it->items] = x;
    it->outs[it->items] = out;
    it->ns[it->items++] = n;
}

/* Appends the routed experts of c->sel to it, in ascending id. Rows of expert e are packed into
 * c->xe (c->rows / c->rows_w say whose); consecutive rows (always, for a single row) are read
 * where they are instead. When the list fills up and flush is set, the experts so far run at
 * once (ffn_many) and the list starts again; without flush the caller guarantees room (T·k
 * rows at most NX_MAX_EXPERTS_TOUCHED). */
static void moe_gather(nx_ctx *c, const nx_moe *M, int32_t T, moe_items *it, int flush) {
    const int32_t H = c->m->cfg.hidden_size, E = M->n_experts, k = c->m->cfg.top_k;
    for (int32_t e = 0; e < E; e++) {
        int32_t n = 0;
        for (int32_t t = 0; t < T; t++)
            for (int32_t i = 0; i < k; i++)
                if (c->sel[(size_t)t * k + i] == e) {
                    c->rows[it->total + n] = t;
                    c->rows_w[it->total + n] = c->selw[(size_t)t * k + i];
                    n++;
                }
        if (n == 0) continue;
        c->traffic.experts_touched++;
        c->traffic.expert_bytes += (double)nx_ffn_bytes(&M->experts[e]);
        const int32_t *rw = c->rows + it->total;
        const float *x = c->xn + (size_t)rw[0] * H;
        if (rw[n - 1] - rw[0] != n - 1) {
            for (int32_t r = 0; r < n; r++)
                memcpy(c->xe + (size_t)(it->total + r) * H, c->xn + (size_t)rw[r] * H, sizeof(float) * (size_t)H);
            x = c->xe + (size_t)it->total * H;
        }
        moe_items_push(it, &M->experts[e], x, c->ye + (size_t)it->total * H, n);
        it->total += n;
        if (flush && it->items == NX_MAX_EXPERTS_TOUCHED) { /* more experts than one job holds */
            const ffn_combine cb = {c->y, c->rows, c->rows_w, it->total, NULL, T, NULL};
            ffn_many(c, it->f, it->xs, it->ns, it->outs, it->items, &cb);
            it->items = it->total = 0;
        }
    }
}

/* A MoE layer as one pool job, for rows whose routed experts fit one job: thread 0 runs the
 * router and the routing while the other threads compute the shared expert's gate and up
 * (which do not depend on the routing); then every thread takes the routed experts' gate/up
 * units as shares (thread 0 sets them up as soon as it has routed, and the others wait for
 * that only if they finish the shared expert first), then every expert's down and the combine.
 * Before, the other threads waited out the routing with the memory stream idle (~9 µs per
 * layer on the 4-bit bench model: the router's rows, the routing and the gather, all cache
 * misses), then the shared expert was one more item of the gate/up job. */
typedef struct moe_job {
    nx_ctx *c;
    const nx_moe *M;
    int32_t T, layer_slot;
    moe_items it;       /* thread 0 fills it: the routed experts, then the shared one */
    const nx_ffn *sf;   /* the shared expert as an item of its own */
    const float *sx;
    float *so;
    int32_t sn;
    ffn_job shared_gu;  /* gate/up of the shared expert alone */
    ffn_job all;        /* every item: the routed ones' gate/up (items - 1), then all the downs */
    ffn_combine cb;
    _Atomic int routed_ready; /* thread 0 has set up all.* and the routed gate/up shares */
} moe_job;

/* Thread 0, once it has routed: the routed experts' gate/up as shares (their scratch rows
 * from the start of c->g, the shared expert's behind all T·k routed rows, as shared_gu has
 * them), then released to the other threads. */
static void moe_job_routed(moe_job *mj) {
    ffn_job *a = &mj->all;
    ffn_layout(a, a->items - 1);
    a->gs[a->items - 1] = mj->shared_gu.gs[0];
    ffn_share_gate_up(a, nx_pool_size(mj->c->m->pool));
    atomic_store_explicit(&mj->routed_ready, 1, memory_order_release);
}

static void moe_worker(void *arg, int ith, int nth) {
    moe_job *mj = arg;
    nx_ctx *c = mj->c;
    nx_pool *pool = c->m->pool;
    if (ith == 0) {
        moe_select(c, mj->M, mj->T, mj->layer_slot, nx_kscratch_of(pool, 0));
        moe_items *it = &mj->it;
        moe_gather(c, mj->M, mj->T, it, 0);
        mj->cb = (ffn_combine){c->y, c->rows, c->rows_w, it->total, mj->so, mj->T, shared_weights(c, mj->M)};
        moe_items_push(it, mj->sf, mj->sx, mj->so, mj->sn);
        mj->all.items = it->items;
        moe_job_routed(mj);
    } else {
        long long b, e;
        nx_pool_split(mj->shared_gu.units, ith - 1, nth - 1, &b, &e);
        ffn_gate_up_units(&mj->shared_gu, b, e, 0, 0, nx_kscratch_of(pool, ith));
        nx_pool_await(pool, &mj->routed_ready);
    }
    ffn_run_units(&mj->all, ith, nth, mj->all.units, ffn_gate_up_units);
    nx_pool_barrier(pool, nth);
    if (ith == 0) ffn_share_down(&mj->all, nth);
    nx_pool_barrier(pool, nth);
    ffn_down_worker(&mj->all, ith, nth);
}

/* MoE over xn (T, H) → c->y. Rows are grouped by expert so each touched expert's weights are
 * read once per call: a few rows (decode, verify) as moe_worker's one job, more as ffn_many's
 * gate/up and down jobs over all touched experts and the shared one. Contributions are added
 * in ascending expert id, then the shared expert, so every row sums the same terms in the
 * same order however the rows are batched. */
/* ---------------------------------------------------------------- streamed experts */

/* The distinct experts of c->sel's T rows, ascending, into ids; returns their count. */
static int32_t moe_union(const int32_t *sel, int32_t T, int32_t k, int32_t E, int32_t *ids) {
    bool used[NX_XCACHE_MAX_EXPERTS] = {false};
    for (int32_t i = 0; i < T * k; i++)
        if (sel[i] >= 0 && sel[i] < E) used[sel[i]] = true;
    int32_t n = 0;
    for (int32_t e = 0; e < E; e++)
        if (used[e]) ids[n++] = e;
    return n;
}

static void add_xstats(nx_ctx *c, const nx_xstats *s) {
    c->traffic.cache_hits += s->hits;
    c->traffic.cache_misses += s->misses;
    c->traffic.ahead_reads += s->ahead;
    c->traffic.ahead_used += s->ahead_used;
    c->traffic.disk_bytes += s->bytes;
    c->traffic.io_wait_s += s->wait_s;
}

/* Pre-gating: the next layer's router applied to this layer's normed input picks most of the
 * experts the next layer will choose, so their reads start now and overlap this layer's
 * experts and the next layer's attention. Only for a few rows (a decode step, a verify): a
 * prompt's rows touch most experts anyway. c->router is free again once this layer routed. */
static void moe_pregate(nx_ctx *c, int32_t layer_slot, int32_t T, nx_xstats *xs) {
    const nx_model *m = c->m;
    const nx_config *cfg = &m->cfg;
    const int32_t next = layer_slot + 1, k = cfg->top_k, H = cfg->hidden_size;
    if (next >= cfg->n_layers || !m->w.layers[next].is_moe || T > NX_MAX_DRAFT + 1) return;
    const nx_moe *N = &m->w.layers[next].moe;
    const int32_t E = N->n_experts;
    int32_t sel[(NX_MAX_DRAFT + 1) * NX_MAX_EXPERTS_TOUCHED], ids[NX_XCACHE_MAX_EXPERTS];
    float w[(NX_MAX_DRAFT + 1) * NX_MAX_EXPERTS_TOUCHED];
    if (k > NX_MAX_EXPERTS_TOUCHED) return;
    nx_matmul(&N->router, c->xn, H, T, c->router, E, m->pool);
    for (int32_t t = 0; t < T; t++)
        if (cfg->router == NX_ROUTER_SOFTMAX)
            nx_moe_route_softmax(c->router + (size_t)t * E, E, k, cfg->route_norm, sel + t * k, w + t * k);
        else
            nx_moe_route_grouped(c->router + (size_t)t * E, N->expert_bias, E, k, cfg->n_group, cfg->topk_group,
                                 cfg->route_norm, cfg->router_scaling, sel + t * k, w + t * k);
    nx_xcache_prefetch(m->xc, next, ids, moe_union(sel, T, k, E, ids), xs);
}

/* MoE with the routed experts in the expert cache: the union of the rows' experts is pinned
 * (reads issued for the missing ones, all at once), the next layer's likely experts are read
 * ahead, and the experts run from their slots once read: in groups as the slots allow, each
 * group's contributions added in ascending expert id and the shared expert's last, the order of
 * the mapped path, so the result is the same bits. */
static void moe_streamed(nx_ctx *c, const nx_moe *M, int32_t T, int32_t layer_slot) {
    const int32_t H = c->m->cfg.hidden_size, k = c->m->cfg.top_k, E = M->n_experts;
    nx_xcache *xc = c->m->xc;
    nx_xstats xs = {0};
    moe_select(c, M, T, layer_slot, NULL);
    int32_t ids[NX_XCACHE_MAX_EXPERTS];
    const int32_t nu = moe_union(c->sel, T, k, E, ids);
    const nx_ffn *fx[NX_MAX_EXPERTS_TOUCHED];
    bool pregated = false;
    for (int32_t done = 0; done < nu;) {
        const int32_t want = nu - done < NX_MAX_EXPERTS_TOUCHED ? nu - done : NX_MAX_EXPERTS_TOUCHED;
        const int32_t got = nx_xcache_pin(xc, layer_slot, ids + done, want, fx, &xs);
        if (!pregated) moe_pregate(c, layer_slot, T, &xs);
        pregated = true;
        nx_xcache_wait(xc, layer_slot, ids + done, got, fx, &xs);
        moe_items it = {.items = 0};
        for (int32_t j = 0; j < got; j++) { /* moe_gather's packing, for these experts */
            const int32_t e = ids[done + j];
            int32_t n = 0;
            for (int32_t t = 0; t < T; t++)
                for (int32_t i = 0; i < k; i++)
                    if (c->sel[(size_t)t * k + i] == e) {
                        c->rows[it.total + n] = t;
                        c->rows_w[it.total + n] = c->selw[(size_t)t * k + i];
                        n++;
                    }
            c->traffic.experts_touched++;
            c->traffic.expert_bytes += (double)nx_ffn_bytes(&M->experts[e]);
            const int32_t *rw = c->rows + it.total;
            const float *x = c->xn + (size_t)rw[0] * H;
            if (rw[n - 1] - rw[0] != n - 1) {
                for (int32_t r = 0; r < n; r++)
                    memcpy(c->xe + (size_t)(it.total + r) * H, c->xn + (size_t)rw[r] * H, sizeof(float) * (size_t)H);
                x = c->xe + (size_t)it.total * H;
            }
            moe_items_push(&it, fx[j], x, c->ye + (size_t)it.total * H, n);
            it.total += n;
        }
        done += got;
        const bool last = done == nu;
        const int32_t routed = it.total;
        if (last && M->has_shared) {
            c->traffic.expert_bytes += (double)nx_ffn_bytes(&M->shared);
            moe_items_push(&it, &M->shared, c->xn, c->ye + (size_t)it.total * H, T);
        }
        const bool sh = last && M->has_shared;
        const ffn_combine cb = {c->y, c->rows, c->rows_w, routed, sh ? c->ye + (size_t)routed * H : NULL, T,
                                sh ? shared_weights(c, M) : NULL};
        ffn_many(c, it.f, it.xs, it.ns, it.outs, it.items, &cb);
        nx_xcache_unpin(xc, layer_slot, ids + done - got, got);
    }
    add_xstats(c, &xs);
}

/* MoE with the routed experts divided among ranks (split.h): every rank routes all rows and packs
 * them by expert as moe_gather does, runs its own experts' rows, and one exchange gives every rank
 * all outputs; then the combine of ffn_many (ascending expert, then the shared expert), so the sum
 * is the single process's bits. */
static void moe_split(nx_ctx *c, const nx_moe *M, int32_t T, int32_t layer_slot) {
    const nx_model *m = c->m;
    const int32_t H = m->cfg.hidden_size, k = m->cfg.top_k, E = M->n_experts;
    int32_t rows[64] = {0}, e0, e1, owner = 0, oe0, oe1;
    moe_select(c, M, T, layer_slot, NULL);
    nx_split_experts_of(m, m->rank, E, &e0, &e1);
    nx_split_experts_of(m, 0, E, &oe0, &oe1);
    moe_items it = {.items = 0};
    int32_t total = 0;
    for (int32_t e = 0; e < E; e++) {
        while (e >= oe1) nx_split_experts_of(m, ++owner, E, &oe0, &oe1);
        int32_t n = 0;
        for (int32_t t = 0; t < T; t++)
            for (int32_t i = 0; i < k; i++)
                if (c->sel[(size_t)t * k + i] == e) {
                    c->rows[total + n] = t;
                    c->rows_w[total + n] = c->selw[(size_t)t * k + i];
                    n++;
                }
        rows[owner] += n;
        if (n > 0 && e >= e0 && e < e1) {
            c->traffic.experts_touched++;
            c->traffic.expert_bytes += (double)nx_ffn_bytes(&M->experts[e]);
            float *xe = c->xe + (size_t)total * H;
            for (int32_t r = 0; r < n; r++)
                memcpy(xe + (size_t)r * H, c->xn + (size_t)c->rows[total + r] * H, sizeof(float) * (size_t)H);
            moe_items_push(&it, &M->experts[e], xe, c->ye + (size_t)total * H, n);
            if (it.items == NX_MAX_EXPERTS_TOUCHED) {
                ffn_many(c, it.f, it.xs, it.ns, it.outs, it.items, NULL);
                it.items = 0;
            }
        }
        total += n;
    }
    if (it.items) ffn_many(c, it.f, it.xs, it.ns, it.outs, it.items, NULL);
    nx_split_exchange(c, c->ye, rows);
    float *shared = c->ye + (size_t)total * H;
    if (M->has_shared) {
        c->traffic.expert_bytes += (double)nx_ffn_bytes(&M->shared);
        ffn(c, &M->shared, c->xn, T, shared);
    }
    const float *sw = shared_weights(c, M);
    for (int32_t r = 0; r < total; r++) nx_axpy_f32(c->rows_w[r], c->ye + (size_t)r * H, c->y + (size_t)c->rows[r] * H, H);
    for (int32_t t = 0; M->has_shared && t < T; t++) {
        if (sw) nx_axpy_f32(sw[t], shared + (size_t)t * H, c->y + (size_t)t * H, H);
        else
            for (int32_t i = 0; i < H; i++) c->y[(size_t)t * H + i] += shared[(size_t)t * H + i];
    }
}

static void moe(nx_ctx *c, const nx_moe *M, int32_t T, int32_t layer_slot) {
    const nx_config *cfg = &c->m->cfg;
    const int32_t H = cfg->hidden_size, k = cfg->top_k;
    nx_pool *pool = c->m->pool;
    memset(c->y, 0, sizeof(float) * (size_t)T * H);
    if (c->m->dist && c->m->split == NX_SPLIT_EXPERTS) {
        moe_split(c, M, T, layer_slot);
        return;
    }
    if (c->m->xc) {
        moe_streamed(c, M, T, layer_slot);
        return;
    }
    const int64_t sF = M->shared.gate.out;
    if (M->has_shared && nx_pool_size(pool) > 1 && (int64_t)T * k <= NX_MAX_EXPERTS_TOUCHED &&
        3.0 * (double)sF * H * T >= FFN_POOL_MIN_MACS) {
        /* the shared expert's rows sit behind the routed ones' T·k rows in every scratch buffer */
        const int32_t routed = T * k;
        moe_job mj = {.c = c, .M = M, .T = T, .layer_slot = layer_slot, .sf = &M->shared, .sx = c->xn,
                      .so = c->ye + (size_t)routed * H, .sn = T};
        moe_items *it = &mj.it;
        c->traffic.expert_bytes += (double)nx_ffn_bytes(&M->shared);
        mj.shared_gu = (ffn_job){.c = c, .f = &mj.sf, .x = &mj.sx, .n = &mj.sn, .out = &mj.so, .items = 1};
        mj.shared_gu.gs[0] = c->g + (size_t)routed * (size_t)M->experts[0].gate.out;
        mj.shared_gu.units = (sF + ROW_CHUNK - 1) / ROW_CHUNK;
        mj.all = (ffn_job){.c = c, .f = it->f, .x = it->xs, .n = it->ns, .out = it->outs, .comb = &mj.cb};
        nx_pool_run(pool, moe_worker, &mj);
        return;
    }
    moe_select(c, M, T, layer_slot, NULL);
    moe_items it = {.items = 0};
    moe_gather(c, M, T, &it, 1);
    const int32_t routed = it.total;
    if (M->has_shared) {
        c->traffic.expert_bytes += (double)nx_ffn_bytes(&M->shared);
        moe_items_push(&it, &M->shared, c->xn, c->ye + (size_t)it.total * H, T);
    }
    const ffn_combine cb = {c->y, c->rows, c->rows_w, routed,
                            M->has_shared ? c->ye + (size_t)routed * H : NULL, T, shared_weights(c, M)};
    if (it.items) ffn_many(c, it.f, it.xs, it.ns, it.outs, it.items, &cb);
}

/* ---------------------------------------------------------------- decoder layer */

void nx_layer_forward(nx_ctx *c, const nx_layer *L, const nx_seg *seg, int n_seg, int32_t window, double theta,
                      int32_t layer_slot) {
    const nx_config *cfg = &c->m->cfg;
    const int32_t H = cfg->hidden_size, T = seg[n_seg - 1].r0 + seg[n_seg - 1].T;
    const bool mtp = layer_slot == cfg->n_layers;
    nx_traffic *tr = &c->traffic;
    for (int32_t t = 0; t < T; t++)
        nx_rmsnorm_f32(c->x + (size_t)t * H, L->attn_norm, cfg->rms_eps, H, c->xn + (size_t)t * H);
    const double t0 = nx_now_s();
    if (L->linear) nx_dn_forward(c, L, seg, n_seg);
    else if (cfg->attention == NX_ATTN_MLA) mla_attention(c, L, seg, n_seg, mtp, layer_slot, T, window, theta);
    else attention(c, L, seg, n_seg, mtp, layer_slot, T, window, theta);
    const double t1 = nx_now_s();
    tr->phase_s[NX_PHASE_ATTN] += t1 - t0;
    tr->phase_bytes[NX_PHASE_ATTN] += (double)nx_attn_bytes(L);
    nx_axpy_f32(1.0f, c->y, c->x, (int64_t)T * H); /* x += y, the same bits */
    for (int32_t t = 0; t < T; t++)
        nx_rmsnorm_f32(c->x + (size_t)t * H, L->ffn_norm, cfg->rms_eps, H, c->xn + (size_t)t * H);
    const double t2 = nx_now_s(), experts0 = tr->expert_bytes;
    if (L->is_moe)
        moe(c, &L->moe, T, layer_slot);
    else
        ffn(c, &L->dense, c->xn, T, c->y);
    tr->phase_s[NX_PHASE_FFN] += nx_now_s() - t2;
    tr->phase_bytes[NX_PHASE_FFN] += L->is_moe ? (double)nx_linear_bytes(&L->moe.router) + tr->expert_bytes - experts0
                                               : (double)nx_ffn_bytes(&L->dense);
    nx_axpy_f32(1.0f, c->y, c->x, (int64_t)T * H); /* x += y, the same bits */
}

/* ---------------------------------------------------------------- trunk and MTP forwards */

static bool req_fail(nx_fwd_req *r, nx_status st) {
    r->st = st;
    return false;
}

/* Whether request r can run: its row count, its context's room, its tokens (else r->st and
 * r->err say why, and nothing has changed). */
static bool req_check(nx_fwd_req *r) {
    const nx_ctx *c = r->c;
    const nx_model *m = c->m;
    const int32_t V = m->cfg.vocab_size;
    if (r->mtp) {
        if (!m->w.has_mtp) return req_fail(r, nx_fail(r->err, NX_E_STATE, "this model has no MTP head"));
        if (r->T <= 0 || r->T > c->n_batch)
            return req_fail(r, nx_fail(r->err, NX_E_ARG, "MTP forward: %d rows (1..%d allowed)", r->T, c->n_batch));
        if (r->pos0 != c->mtp_past || r->pos0 + r->T > c->n_ctx)
            return req_fail(r, nx_fail(r->err, NX_E_STATE, "MTP rows at %d..%d do not follow its cache of %d rows",
                                       r->pos0, r->pos0 + r->T - 1, c->mtp_past));
    } else {
        if (r->T <= 0 || r->T > c->n_batch)
            return req_fail(r, nx_fail(r->err, NX_E_ARG, "forward: %d rows (1..%d allowed)", r->T, c->n_batch));
        if (c->n_past + r->T > c->n_ctx)
            return req_fail(r, nx_fail(r->err, NX_E_ARG, "context full: %d + %d tokens exceed the context of %d",
                                       c->n_past, r->T, c->n_ctx));
    }
    for (int32_t t = 0; t < r->T; t++)
        if (r->tokens[t] < 0 || r->tokens[t] >= V)
            return req_fail(r, nx_fail(r->err, NX_E_ARG, "token id %d out of range (vocabulary %d)", r->tokens[t], V));
    r->st = NX_OK;
    return true;
}

/* Logits through head W (its first W->out rows; row stride V) of each request's rows
 * [logits_from, T) of s->hpost: one matmul over the rows of every request that wants some, so
 * the head's weights are read once, when they fit s->blogits; else one per request. */
static void head_logits(nx_ctx *s, const nx_seg *seg, nx_fwd_req *const *live, int ns, const nx_linear *W) {
    const int32_t H = s->m->cfg.hidden_size, V = s->m->cfg.vocab_size;
    int32_t nr = 0;
    int want = 0;
    for (int i = 0; i < ns; i++)
        if (live[i]->logits && live[i]->logits_from < seg[i].T) nr += seg[i].T - live[i]->logits_from, want++;
    if (want == 0) return;
    if (want == 1 || nr > s->blogits_rows) {
        for (int i = 0; i < ns; i++) {
            const int32_t from = live[i]->logits_from;
            if (live[i]->logits && from < seg[i].T)
                nx_matmul(W, s->hpost + (size_t)(seg[i].r0 + from) * H, H, seg[i].T - from, live[i]->logits, V,
                          s->m->pool);
        }
        return;
    }
    int32_t at = 0;
    for (int i = 0; i < ns; i++) { /* gathered into xn, free once the layers are done */
        const int32_t from = live[i]->logits_from, n = seg[i].T - from;
        if (!live[i]->logits || n <= 0) continue;
        memcpy(s->xn + (size_t)at * H, s->hpost + (size_t)(seg[i].r0 + from) * H, sizeof(float) * (size_t)n * H);
        at += n;
    }
    nx_matmul(W, s->xn, H, nr, s->blogits, V, s->m->pool);
    at = 0;
    for (int i = 0; i < ns; i++) {
        const int32_t n = seg[i].T - live[i]->logits_from;
        if (!live[i]->logits || n <= 0) continue;
        memcpy(live[i]->logits, s->blogits + (size_t)at * V, sizeof(float) * (size_t)n * V);
        at += n;
    }
}

/* A split model (m->dist, split.h) forwards each context alone (its contexts join no batch):
 * the hooks below then act for live[0], the only request. */
static void trunk_run(nx_ctx *s, const nx_seg *seg, nx_fwd_req *const *live, int ns) {
    const nx_model *m = s->m;
    const nx_config *cfg = &m->cfg;
    const int32_t H = cfg->hidden_size, V = cfg->vocab_size, T = seg[ns - 1].r0 + seg[ns - 1].T;
    nx_fwd_req *r0 = live[0];
    s->serial++;
    for (int i = 0; i < ns; i++) {
        for (int32_t t = 0; t < seg[i].T; t++)
            nx_linear_get_row(&m->w.embed, live[i]->tokens[t], s->x + (size_t)(seg[i].r0 + t) * H);
        memcpy(seg[i].kc->tokens + seg[i].pos0, live[i]->tokens, sizeof(int32_t) * (size_t)seg[i].T);
    }
    memset(&s->traffic, 0, sizeof s->traffic);
    if (cfg->n_linear)
        for (int i = 0; i < ns; i++) nx_dn_begin(seg[i].kc, seg[i].T);
    int32_t l0 = 0, l1 = cfg->n_layers; /* a split model's rank runs its own layers */
    if (m->dist && (r0->st = nx_split_trunk_in(s, r0->tokens, T, r0->logits ? r0->logits_from : T, &l0, &l1,
                                               r0->err)) != NX_OK)
        return;
    for (int32_t l = l0; l < l1; l++) nx_layer_forward(s, &m->w.layers[l], seg, ns, 0, cfg->rope_theta, l);
    if (m->dist && (r0->st = nx_split_trunk_pass(s, T, r0->err)) != NX_OK) return;
    if (cfg->n_linear)
        for (int i = 0; i < ns; i++) nx_dn_end(seg[i].kc, seg[i].pos0, seg[i].T);
    for (int i = 0; i < ns; i++) seg[i].kc->n_past += seg[i].T;

    const double t0 = nx_now_s();
    if (nx_split_has_head(m)) {
        memcpy(s->hpre, s->x, sizeof(float) * (size_t)T * H);
        for (int32_t t = 0; t < T; t++)
            nx_rmsnorm_f32(s->x + (size_t)t * H, m->w.final_norm, cfg->rms_eps, H, s->hpost + (size_t)t * H);
        const float *fed = m->wiring.hidden == NX_MTP_HIDDEN_PRE_NORM ? s->hpre : s->hpost;
        for (int i = 0; i < ns; i++)
            memcpy(seg[i].kc->hidden + (size_t)seg[i].pos0 * H, fed + (size_t)seg[i].r0 * H,
                   sizeof(float) * (size_t)seg[i].T * H);
        head_logits(s, seg, live, ns, &m->w.lm_head);
    }
    if (m->dist && r0->logits && r0->logits_from < T &&
        (r0->st = nx_split_logits(s, r0->logits, T - r0->logits_from, r0->err)) != NX_OK)
        return;
    bool any = false;
    for (int i = 0; i < ns; i++) {
        nx_fwd_req *r = live[i];
        if (!r->logits || r->logits_from >= seg[i].T) continue;
        any = true;
        r->st = nx_logits_check(r->logits, seg[i].T - r->logits_from, V, V, "trunk", r->err);
        if (r->st != NX_OK) nx_ctx_truncate(r->c, seg[i].pos0); /* the rows behind them are no better */
    }
    if (any && nx_split_has_head(m)) s->traffic.phase_bytes[NX_PHASE_HEAD] += (double)nx_linear_bytes(&m->w.lm_head);
    s->traffic.phase_s[NX_PHASE_HEAD] += nx_now_s() - t0;
    if (m->dist) nx_split_traffic(s);
    for (int i = 0; i < ns; i++)
        if (live[i]->st == NX_OK && live[i]->c->sink.forward)
            live[i]->c->sink.forward(live[i]->c->sink.user, false, seg[i].T, &s->traffic);
}

/* ---------------------------------------------------------------- MTP head */

/* Row r of an MTP request into mtp_in: [enorm(embed(token)) ; hnorm(hidden)] (or hidden first). */
static void mtp_input(nx_ctx *s, const nx_fwd_req *q, int32_t r, float *row) {
    const nx_model *m = s->m;
    const nx_config *cfg = &m->cfg;
    const nx_mtp_weights *mw = &m->w.mtp;
    const int32_t H = cfg->hidden_size;
    const bool embed_first = m->wiring.concat != NX_MTP_CONCAT_HIDDEN_FIRST;
    const nx_linear *embed = mw->embed.w ? &mw->embed : &m->w.embed;
    float *e = row + (embed_first ? 0 : H), *h = row + (embed_first ? H : 0);
    if (cfg->mtp.zero_pos0 && q->pos0 + r == 0)
        memset(e, 0, sizeof(float) * (size_t)H);
    else
        nx_linear_get_row(embed, q->tokens[r], e);
    nx_rmsnorm_f32(e, mw->enorm, cfg->rms_eps, H, e);
    if (m->wiring.hnorm)
        nx_rmsnorm_f32(q->hidden + (size_t)r * H, mw->hnorm, cfg->rms_eps, H, h);
    else
        memcpy(h, q->hidden + (size_t)r * H, sizeof(float) * (size_t)H);
}

static void mtp_run(nx_ctx *s, const nx_seg *seg, nx_fwd_req *const *live, int ns) {
    const nx_model *m = s->m;
    const nx_config *cfg = &m->cfg;
    const nx_mtp_weights *mw = &m->w.mtp;
    const int32_t H = cfg->hidden_size, V = cfg->vocab_size, R = seg[ns - 1].r0 + seg[ns - 1].T;
    nx_fwd_req *r0 = live[0]; /* a split model's only request (trunk_run) */
    s->serial++;
    for (int i = 0; i < ns; i++)
        for (int32_t r = 0; r < seg[i].T; r++) mtp_input(s, live[i], r, s->mtp_in + (size_t)(seg[i].r0 + r) * 2 * H);
    memset(&s->traffic, 0, sizeof s->traffic);
    if (m->dist) { /* the head runs on one rank */
        bool here = true;
        r0->st = nx_split_mtp_in(s, r0->hidden, r0->tokens, R, r0->pos0, r0->logits ? r0->logits_from : R, &here,
                                 r0->err);
        if (r0->st == NX_OK && !here) r0->st = nx_split_mtp_elsewhere(s, R, r0->logits, r0->logits_from, r0->err);
        if (r0->st != NX_OK || !here) return;
    }
    nx_matmul(&mw->eh_proj, s->mtp_in, 2 * H, R, s->x, H, m->pool);
    const double theta = m->wiring.rope_theta > 0 ? m->wiring.rope_theta : cfg->rope_theta;
    nx_layer_forward(s, &mw->layer, seg, ns, m->wiring.sliding_window, theta, cfg->n_layers);
    if (m->dist && (r0->st = nx_split_failed(s, r0->err)) != NX_OK) return;
    for (int32_t r = 0; r < R; r++)
        nx_rmsnorm_f32(s->x + (size_t)r * H, mw->final_norm, cfg->rms_eps, H, s->hpost + (size_t)r * H);
    const float *back = m->wiring.recycle == NX_MTP_RECYCLE_RAW ? s->x : s->hpost;
    for (int i = 0; i < ns; i++) {
        nx_ctx *kc = seg[i].kc;
        kc->mtp_past += seg[i].T;
        memmove(kc->mtp_out, back + (size_t)seg[i].r0 * H, sizeof(float) * (size_t)seg[i].T * H);
        kc->mtp_rows = seg[i].T;
    }
    /* The head may draft over a prefix of the vocabulary: the rows of lm_head are contiguous, so
     * the slice is the same view with fewer rows. */
    nx_linear head = mw->head.w ? mw->head : m->w.lm_head;
    head.out = m->draft_vocab;
    head_logits(s, seg, live, ns, &head);
    for (int i = 0; i < ns; i++) {
        nx_fwd_req *q = live[i];
        const int32_t n = seg[i].T - q->logits_from;
        if (!q->logits || n <= 0) continue;
        for (int32_t r = 0; r < n; r++)
            for (int32_t v = m->draft_vocab; v < V; v++) q->logits[(size_t)r * V + v] = -INFINITY;
        if (m->dist && (q->st = nx_split_logits(s, q->logits, n, q->err)) != NX_OK) continue;
        q->st = nx_logits_check(q->logits, n, V, m->draft_vocab, "MTP", q->err);
    }
    if (m->dist) nx_split_traffic(s);
    for (int i = 0; i < ns; i++)
        if (live[i]->st == NX_OK && live[i]->c->sink.forward)
            live[i]->c->sink.forward(live[i]->c->sink.user, true, seg[i].T, &s->traffic);
}

void nx_forward_run(nx_ctx *s, nx_fwd_req *rq, int n) {
    nx_seg seg[NX_BATCH_MAX_SEQS];
    nx_fwd_req *live[NX_BATCH_MAX_SEQS];
    int ns = 0;
    int32_t rows = 0;
    for (int i = 0; i < n; i++) {
        nx_fwd_req *r = &rq[i];
        if (!req_check(r)) continue;
        if (ns == NX_BATCH_MAX_SEQS || rows + r->T > s->n_batch) {
            r->st = nx_fail(r->err, NX_E_STATE, "forward of %d rows does not fit the batch's %d", r->T, s->n_batch);
            continue;
        }
        seg[ns] = (nx_seg){r->c, rows, r->T, r->mtp ? r->pos0 : r->c->n_past};
        live[ns++] = r;
        rows += r->T;
    }
    if (ns == 0) return;
    if (live[0]->mtp) mtp_run(s, seg, live, ns);
    else trunk_run(s, seg, live, ns);
}

/* A context's forward: on its own scratch, or handed to its batch. */
static nx_status forward_one(nx_fwd_req *r) {
    if (r->c->batch) return nx_batch_submit(r->c->batch, r);
    nx_forward_run(r->c, r, 1);
    return r->st;
}

nx_status nx_forward_trunk(nx_ctx *c, const int32_t *tokens, int32_t T, float *logits,
                           int32_t logits_from, nx_error *err) {
    nx_fwd_req r = {.c = c, .tokens = tokens, .T = T, .logits = logits, .logits_from = logits_from, .err = err};
    return forward_one(&r);
}

nx_status nx_forward_mtp(nx_ctx *c, const float *hidden, const int32_t *tokens, int32_t R,
                         int32_t pos0, float *logits, int32_t logits_from, nx_error *err) {
    nx_fwd_req r = {.c = c, .mtp = true, .tokens = tokens, .hidden = hidden, .T = R, .pos0 = pos0,
                    .logits = logits, .logits_from = logits_from, .err = err};
    return forward_one(&r);
}
