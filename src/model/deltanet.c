/* Gated DeltaNet (docs/design.md §12.4; transformers' Qwen3NextGatedDeltaNet with
 * torch_recurrent_gated_delta_rule, vLLM's qwen3_next.py): per row, the input projections, a causal
 * depthwise convolution over the q | k | v channels and SiLU, L2-normalised q and k (q times
 * k_dim^-1/2), decay exp(g) with g = -exp(A_log)·softplus(a + dt_bias) and β = σ(b), the delta
 * rule on each value head's state S [k_dim][v_dim]
 *     S ← exp(g)·S;  δ = β(v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀq
 * then RMSNorm(o)·w·silu(z) and out_proj. The rule runs row by row for every row count (prefill,
 * decode, verify): a row's result never depends on how the rows were batched, so greedy MTP equals
 * greedy AR bit for bit; a head's state stays in the core's cache while its rows go through.
 *
 * Rollback: a trunk forward writes its last NX_DN_REWIND rows' states to the other buffer of the
 * pair, so the state before them survives as a checkpoint, and keeps what the rule needs to redo
 * them (normalised k, v, decay, β; the convolution's inputs). A truncation to one of those rows
 * replays the rule from the checkpoint over the rows kept — the same arithmetic in the same order,
 * so the state is the one a forward over exactly those rows leaves. A one-row forward (plain
 * decoding, never taken back) updates the state in place instead; further back a context goes to
 * its checkpoints (nx_dn_ckpt). */
#include "model/deltanet.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "kernels/kernels.h"

/* ---------------------------------------------------------------- the delta rule */

/* x ← x / sqrt(Σx² + 1e-6) · scale (transformers' l2norm, eps 1e-6). */
static void l2norm(const float *x, float *out, int32_t n, float scale) {
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = scale / sqrtf(ss + 1e-6f);
    for (int32_t i = 0; i < n; i++) out[i] = x[i] * r;
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---------------------------------------------------------------- one layer */

typedef struct dn_job {
    nx_ctx *c;          /* the scratch: every row's projections, convolution and head outputs */
    const nx_dn_layer *d;
    const nx_seg *seg;  /* whose rows: each segment's rule runs over its own context's state */
    int n_seg;
    int32_t T;          /* rows of all segments */
    bool place;         /* the input rows go through dn_f (fused, or several segments) */
    nx_matmul_task in[4], out;
    int n_in;
} dn_job;

/* Segment si's convolution inputs in c->dn_x: its context's window (conv_k - 1 rows), then its
 * rows; the segments one after another. */
static float *seg_x(const dn_job *j, int si) {
    const nx_deltanet *g = &j->c->m->cfg.dn;
    const size_t C = (size_t)nx_deltanet_channels(g), K1 = (size_t)g->conv_k - 1;
    return j->c->dn_x + ((size_t)j->seg[si].r0 + (size_t)si * K1) * C;
}

/* The segment row t (of the whole call) belongs to. */
static int seg_index(const dn_job *j, int32_t t) {
    int i = 0;
    while (i + 1 < j->n_seg && t >= j->seg[i + 1].r0) i++;
    return i;
}

/* Row t's input projections from c->dn_f into its segment's convolution inputs: Qwen3-Next's
 * fused rows into the split layout (per key head, in_proj_qkvz rows hold q | k | v | z of its
 * value heads, in_proj_ba rows b | a), or Qwen3.5's q | k | v row as it is. */
static void dn_place(const dn_job *j, int32_t t) {
    nx_ctx *c = j->c;
    const nx_deltanet *g = &c->m->cfg.dn;
    const int32_t nk = g->n_k_heads, dk = g->k_dim, r = g->n_v_heads / nk, rv = r * g->v_dim, kd = nk * dk;
    const int32_t C = nx_deltanet_channels(g), vd = g->n_v_heads * g->v_dim, K1 = g->conv_k - 1;
    const int si = seg_index(j, t);
    float *x = seg_x(j, si) + (size_t)(K1 + t - j->seg[si].r0) * C, *z = c->dn_z + (size_t)t * vd;
    if (!j->d->qkvz.w) {
        memcpy(x, c->dn_f + (size_t)t * C, sizeof(float) * (size_t)C);
        return;
    }
    const float *f = c->dn_f + (size_t)t * (size_t)(C + vd + 2 * g->n_v_heads);
    const float *ba = f + C + vd;
    for (int32_t h = 0; h < nk; h++, f += 2 * dk + 2 * rv, ba += 2 * r) {
        memcpy(x + h * dk, f, sizeof(float) * (size_t)dk);
        memcpy(x + kd + h * dk, f + dk, sizeof(float) * (size_t)dk);
        memcpy(x + 2 * kd + h * rv, f + 2 * dk, sizeof(float) * (size_t)rv);
        memcpy(z + h * rv, f + 2 * dk + rv, sizeof(float) * (size_t)rv);
        memcpy(c->dn_b + (size_t)t * g->n_v_heads + h * r, ba, sizeof(float) * (size_t)r);
        memcpy(c->dn_a + (size_t)t * g->n_v_heads + h * r, ba + r, sizeof(float) * (size_t)r);
    }
}

/* The causal convolution and SiLU over channels [c0, c1) of every row, each segment's rows after
 * its own window. */
static void dn_conv(const dn_job *j, int64_t c0, int64_t c1) {
    const nx_ctx *c = j->c;
    const nx_deltanet *g = &c->m->cfg.dn;
    const int32_t C = nx_deltanet_channels(g), K = g->conv_k;
    for (int si = 0; si < j->n_seg; si++)
        for (int32_t t = 0; t < j->seg[si].T; t++) {
            const float *x = seg_x(j, si) + (size_t)t * C;
            float *y = c->dn_qkv + (size_t)(j->seg[si].r0 + t) * C;
            for (int64_t ch = c0; ch < c1; ch++) {
                const float *w = j->d->conv + ch * K;
                float acc = 0.0f;
                for (int32_t i = 0; i < K; i++) acc += w[i] * x[(size_t)i * C + ch];
                y[ch] = acc;
            }
            nx_swiglu_f32(y + c0, NULL, c1 - c0); /* SiLU */
        }
}

/* Value head h over every row of segment si: the rule on its context's states (per the split,
 * see nx_dn_begin), the rows the rollback keeps, and the gated norm into c->dn_o. */
static void dn_head(const dn_job *j, int si, int32_t h) {
    nx_ctx *c = j->c, *kc = j->seg[si].kc;
    const nx_deltanet *g = &c->m->cfg.dn;
    const nx_dn_layer *d = j->d;
    nx_dn_state *s = &kc->dn[d->slot];
    const int32_t dk = g->k_dim, dv = g->v_dim, nv = g->n_v_heads, r = nv / g->n_k_heads, kh = h / r;
    const int32_t C = nx_deltanet_channels(g), kd = g->n_k_heads * dk, vd = nv * dv;
    const int32_t r0 = j->seg[si].r0, split = kc->dn_split;
    const size_t hs = (size_t)dk * dv;
    float *cur = s->S[kc->dn_cur] + (size_t)h * hs, *nxt = s->S[1 - kc->dn_cur] + (size_t)h * hs;
    float q[NX_ATTN_MAX_HD], k[NX_ATTN_MAX_HD];
    for (int32_t t = 0; t < j->seg[si].T; t++) {
        const size_t row = (size_t)(r0 + t);
        const float *x = c->dn_qkv + row * C;
        l2norm(x + kh * dk, q, dk, 1.0f / sqrtf((float)dk));
        l2norm(x + kd + kh * dk, k, dk, 1.0f);
        const float *v = x + 2 * kd + h * dv;
        const float decay = expf(d->neg_A[h] * softplus(c->dn_a[row * nv + h] + d->dt_bias[h]));
        const float beta = sigmoid(c->dn_b[row * nv + h]);
        float *o = c->dn_o + row * vd + h * dv;
        nx_delta_rule_f32(t <= split ? cur : nxt, t < split ? cur : nxt, dk, dv, k, v, decay, beta, q, o);
        if (t >= split) { /* what a replay of this row needs */
            const int32_t rr = t - split;
            if (h % r == 0) memcpy(s->rk + (size_t)rr * kd + kh * dk, k, sizeof(float) * (size_t)dk);
            memcpy(s->rv + (size_t)rr * vd + h * dv, v, sizeof(float) * (size_t)dv);
            s->rd[(size_t)rr * nv + h] = decay;
            s->rb[(size_t)rr * nv + h] = beta;
        }
        nx_rmsnorm_f32(o, d->norm, c->m->cfg.rms_eps, dv, o);
        float *z = c->dn_z + row * vd + h * dv; /* read by this head only */
        nx_swiglu_f32(z, o, dv);
        memcpy(o, z, sizeof(float) * (size_t)dv);
    }
}

/* The layer as one pool job: the input projections as shares; the rows placed (fused, or several
 * segments) split by row; the convolution split by channel; the (value head, segment) items split
 * evenly, head-major so each thread gets its share of every segment's rows; out_proj as shares. */
static void dn_worker(void *arg, int ith, int nth) {
    const dn_job *j = arg;
    nx_pool *pool = j->c->m->pool;
    const nx_deltanet *g = &j->c->m->cfg.dn;
    long long b, e;
    nx_matmul_shares_work(j->in, j->n_in, pool, ith, nth, NULL, 0);
    nx_pool_barrier(pool, nth);
    if (j->place) {
        nx_pool_split(j->T, ith, nth, &b, &e);
        for (long long t = b; t < e; t++) dn_place(j, (int32_t)t);
        nx_pool_barrier(pool, nth);
    }
    nx_pool_split(nx_deltanet_channels(g), ith, nth, &b, &e);
    dn_conv(j, b, e);
    nx_pool_barrier(pool, nth);
    nx_pool_split((long long)g->n_v_heads * j->n_seg, ith, nth, &b, &e);
    for (long long it = b; it < e; it++) dn_head(j, (int)(it % j->n_seg), (int32_t)(it / j->n_seg));
    if (ith == 0) nx_matmul_shares_reset(&j->out, 1, pool, nth);
    nx_pool_barrier(pool, nth);
    nx_matmul_shares_work(&j->out, 1, pool, ith, nth, NULL, 0);
}

void nx_dn_forward(nx_ctx *c, const nx_layer *L, const nx_seg *seg, int n_seg) {
    const nx_config *cfg = &c->m->cfg;
    const nx_deltanet *g = &cfg->dn;
    const nx_dn_layer *d = &L->dn;
    const int32_t T = seg[n_seg - 1].r0 + seg[n_seg - 1].T;
    const int64_t H = cfg->hidden_size, C = nx_deltanet_channels(g), vd = (int64_t)g->n_v_heads * g->v_dim;
    const int64_t nv = g->n_v_heads, K1 = g->conv_k - 1;
    nx_pool *pool = c->m->pool;
    dn_job j = {.c = c, .d = d, .seg = seg, .n_seg = n_seg, .T = T, .place = d->qkvz.w || n_seg > 1,
                .out = {&d->out, c->dn_o, vd, T, c->y, H}};
    for (int si = 0; si < n_seg; si++)
        memcpy(seg_x(&j, si), seg[si].kc->dn[d->slot].conv, sizeof(float) * (size_t)(K1 * C));
    if (d->qkvz.w) {
        const int64_t fw = C + vd + 2 * nv;
        j.in[0] = (nx_matmul_task){&d->qkvz, c->xn, H, T, c->dn_f, fw};
        j.in[1] = (nx_matmul_task){&d->ba, c->xn, H, T, c->dn_f + C + vd, fw};
        j.n_in = 2;
    } else {
        /* one segment's rows go straight after its window; several segments' through dn_f */
        j.in[0] = (nx_matmul_task){&d->qkv, c->xn, H, T, j.place ? c->dn_f : seg_x(&j, 0) + K1 * C, C};
        j.in[1] = (nx_matmul_task){&d->z, c->xn, H, T, c->dn_z, vd};
        j.in[2] = (nx_matmul_task){&d->b, c->xn, H, T, c->dn_b, nv};
        j.in[3] = (nx_matmul_task){&d->a, c->xn, H, T, c->dn_a, nv};
        j.n_in = 4;
    }
    nx_matmul_shares_reset(j.in, j.n_in, pool, nx_pool_size(pool));
    nx_pool_run(pool, dn_worker, &j);
    /* each context's window for its next row, and its inputs from the first recoverable row's
     * window on */
    for (int si = 0; si < n_seg; si++) {
        nx_dn_state *s = &seg[si].kc->dn[d->slot];
        const float *x = seg_x(&j, si);
        const int32_t Ts = seg[si].T, split = seg[si].kc->dn_split;
        memcpy(s->conv, x + (size_t)Ts * C, sizeof(float) * (size_t)(K1 * C));
        memcpy(s->hist, x + (size_t)split * C, sizeof(float) * (size_t)((Ts - split + K1) * C));
    }
}

/* ---------------------------------------------------------------- state bookkeeping */

static void dn_rewind_to(nx_ctx *c, int32_t n);

void nx_dn_begin(nx_ctx *c, int32_t T) {
    const bool in_place = T == 1 && c->dn_mark != c->n_past; /* unless the state before it is wanted */
    c->dn_split = in_place ? 1 : T > NX_DN_REWIND ? T - NX_DN_REWIND : 0;
}

typedef struct replay_job {
    nx_ctx *c;
    int32_t keep; /* rows after the checkpoint */
    float *to;    /* a checkpoint's states (nx_dn_save's layout), or NULL: S[1 - dn_ckb] and conv */
} replay_job;

/* Floats of one layer's state, and of its window. */
static size_t state_floats(const nx_ctx *c) { return (size_t)nx_deltanet_state_floats(&c->m->cfg.dn); }
static size_t conv_floats(const nx_ctx *c) { return (size_t)nx_deltanet_conv_floats(&c->m->cfg.dn); }

/* Value head it % n_v_heads of DeltaNet layer it / n_v_heads, for every item of the thread's
 * share: the rule replayed from the checkpoint over the rows kept (with none, the kept copy is
 * the checkpoint's). Heads are independent, so the split does not change a bit. */
static void replay_worker(void *arg, int ith, int nth) {
    const replay_job *j = arg;
    nx_ctx *c = j->c;
    const nx_deltanet *g = &c->m->cfg.dn;
    const int32_t dk = g->k_dim, dv = g->v_dim, nv = g->n_v_heads, r = nv / g->n_k_heads;
    const int32_t kd = g->n_k_heads * dk, vd = nv * dv;
    const size_t hs = (size_t)dk * dv, per = state_floats(c) + conv_floats(c);
    long long b, e;
    nx_pool_split((long long)c->m->cfg.n_linear * nv, ith, nth, &b, &e);
    for (long long it = b; it < e; it++) {
        const nx_dn_state *s = &c->dn[it / nv];
        const int32_t h = (int32_t)(it % nv);
        const float *ck = s->S[c->dn_ckb] + (size_t)h * hs;
        float *to = (j->to ? j->to + (size_t)(it / nv) * per : s->S[1 - c->dn_ckb]) + (size_t)h * hs;
        if (j->keep == 0 && j->to) memcpy(to, ck, sizeof(float) * hs);
        for (int32_t t = 0; t < j->keep; t++)
            nx_delta_rule_f32(t ? to : ck, to, dk, dv, s->rk + (size_t)t * kd + (h / r) * dk, s->rv + (size_t)t * vd + h * dv,
                              s->rd[(size_t)t * nv + h], s->rb[(size_t)t * nv + h], NULL, NULL);
    }
}

/* The states after row n (dn_ck <= n <= the last row) of every layer, into the checkpoint
 * states `to` when given, else into S[1 - dn_ckb] and conv (replay_worker on the pool). */
static void dn_replay(nx_ctx *c, int32_t n, float *to) {
    const nx_deltanet *g = &c->m->cfg.dn;
    const replay_job j = {c, n - c->dn_ck, to};
    nx_pool_run(c->m->pool, replay_worker, (void *)&j);
    const size_t C = (size_t)nx_deltanet_channels(g), K1 = (size_t)g->conv_k - 1, per = state_floats(c) + conv_floats(c);
    for (int32_t l = 0; l < c->m->cfg.n_linear; l++) {
        nx_dn_state *s = &c->dn[l];
        memcpy(to ? to + (size_t)l * per + state_floats(c) : s->conv, s->hist + (size_t)j.keep * C, sizeof(float) * K1 * C);
    }
}

/* ---------------------------------------------------------------- checkpoints */

/* The checkpoint at row n, or NULL. */
static nx_dn_ckpt *ckpt_at(const nx_ctx *c, int32_t n) {
    for (int i = 0; i < c->dn_n_ckpts; i++)
        if (c->dn_ckpts[i].row == n) return &c->dn_ckpts[i];
    return NULL;
}

/* Room for a checkpoint of row n (its states to be written): the one already at n, a new one, or
 * when all are in use the one of the lowest row, taken over; kept in ascending rows. NULL when
 * the context keeps none or memory is short (a checkpoint only saves work). */
static nx_dn_ckpt *ckpt_room(nx_ctx *c, int32_t n) {
    nx_dn_ckpt *k = ckpt_at(c, n);
    if (k || c->dn_max_ckpts == 0) return k;
    if (!c->dn_ckpts && !(c->dn_ckpts = calloc((size_t)c->dn_max_ckpts, sizeof *c->dn_ckpts))) return NULL;
    if (c->dn_n_ckpts == c->dn_max_ckpts) { /* the oldest row's goes to the back */
        const nx_dn_ckpt first = c->dn_ckpts[0];
        memmove(c->dn_ckpts, c->dn_ckpts + 1, sizeof *c->dn_ckpts * (size_t)(c->dn_n_ckpts - 1));
        c->dn_ckpts[--c->dn_n_ckpts] = first;
    }
    nx_dn_ckpt *slot = &c->dn_ckpts[c->dn_n_ckpts];
    if (!slot->st && !(slot->st = malloc(sizeof(float) * (size_t)nx_dn_saved_floats(c->m)))) return NULL;
    int i = c->dn_n_ckpts++;
    const nx_dn_ckpt fresh = {n, slot->st};
    for (; i > 0 && c->dn_ckpts[i - 1].row > n; i--) c->dn_ckpts[i] = c->dn_ckpts[i - 1];
    c->dn_ckpts[i] = fresh;
    return &c->dn_ckpts[i];
}

/* Forgets the checkpoints of rows above n (their memory stays for the next ones). */
static void ckpts_drop_above(nx_ctx *c, int32_t n) {
    int keep = 0;
    while (keep < c->dn_n_ckpts && c->dn_ckpts[keep].row <= n) keep++;
    c->dn_n_ckpts = keep;
}

void nx_dn_ckpts_limit(nx_ctx *c, int max) {
    if (max == c->dn_max_ckpts) return;
    nx_dn_ckpts_free(c);
    c->dn_max_ckpts = max;
    if (max == 0) c->dn_mark = -1;
}

void nx_dn_ckpts_free(nx_ctx *c) {
    for (int i = 0; c->dn_ckpts && i < c->dn_max_ckpts; i++) free(c->dn_ckpts[i].st);
    free(c->dn_ckpts);
    c->dn_ckpts = NULL;
    c->dn_n_ckpts = 0;
}

void nx_dn_checkpoint(nx_ctx *c) {
    if (!c->dn || c->n_past <= 0) return;
    nx_dn_ckpt *k = ckpt_room(c, c->n_past);
    if (k) nx_dn_save(c, c->n_past, k->st);
}

void nx_dn_ckpt_put(nx_ctx *c, int32_t n, const float *src) {
    if (!c->dn || n <= 0 || n > c->n_past) return;
    nx_dn_ckpt *k = ckpt_room(c, n);
    if (k) memcpy(k->st, src, sizeof(float) * (size_t)nx_dn_saved_floats(c->m));
}

void nx_dn_end(nx_ctx *c, int32_t pos0, int32_t T) {
    if (!c->dn) return;
    c->dn_ckb = c->dn_cur;
    if (c->dn_split < T) c->dn_cur = 1 - c->dn_cur; /* the recoverable rows' states went to the other buffer */
    c->dn_ck = pos0 + c->dn_split;
    if (c->dn_mark >= c->dn_ck && c->dn_mark <= pos0 + T) { /* the row to keep states of was passed */
        if (c->dn_mark > 0) {
            nx_dn_ckpt *k = ckpt_room(c, c->dn_mark);
            if (k) dn_replay(c, c->dn_mark, k->st);
        }
        c->dn_mark = -1;
    } else if (c->dn_mark >= 0 && c->dn_mark < c->dn_ck) {
        c->dn_mark = -1; /* passed, but not among the rows kept */
    }
}

bool nx_dn_can_rewind(const nx_ctx *c, int32_t n) {
    return !c->dn || n >= c->n_past || n >= c->dn_ck || (n > 0 && ckpt_at(c, n));
}

/* The row of the last checkpoint at or below n (0: none). */
static int32_t ckpt_floor(const nx_ctx *c, int32_t n) {
    for (int i = c->dn_n_ckpts - 1; i >= 0; i--)
        if (c->dn_ckpts[i].row <= n) return c->dn_ckpts[i].row;
    return 0;
}

int32_t nx_dn_rewind_floor(const nx_ctx *c, int32_t n) { return nx_dn_can_rewind(c, n) ? n : ckpt_floor(c, n); }

void nx_dn_rewind(nx_ctx *c, int32_t n) {
    if (!c->dn || n >= c->n_past) return;
    const double t0 = nx_now_s();
    const nx_deltanet *gd = &c->m->cfg.dn;
    const int32_t rows = n >= c->dn_ck ? n - c->dn_ck : 0;
    c->dn_rewinds++;
    c->dn_rewind_bytes += (double)c->m->cfg.n_linear * sizeof(float) *
                          (double)((rows ? 2 * rows : 1) * nx_deltanet_state_floats(gd) + nx_deltanet_conv_floats(gd));
    dn_rewind_to(c, n);
    c->dn_rewind_s += nx_now_s() - t0;
}

/* nx_dn_rewind's work. */
static void dn_rewind_to(nx_ctx *c, int32_t n) {
    ckpts_drop_above(c, n);
    if (n < c->dn_ck) { /* a checkpoint's (nx_dn_can_rewind) */
        const nx_dn_ckpt *k = ckpt_at(c, n);
        const size_t sf = state_floats(c), cf = conv_floats(c);
        for (int32_t l = 0; k && l < c->m->cfg.n_linear; l++) {
            memcpy(c->dn[l].S[c->dn_cur], k->st + (size_t)l * (sf + cf), sizeof(float) * sf);
            memcpy(c->dn[l].conv, k->st + (size_t)l * (sf + cf) + sf, sizeof(float) * cf);
        }
        c->dn_ck = n;
        c->dn_ckb = c->dn_cur;
        return;
    }
    if (n == c->dn_ck) {
        for (int32_t l = 0; l < c->m->cfg.n_linear; l++)
            memcpy(c->dn[l].conv, c->dn[l].hist, sizeof(float) * conv_floats(c));
        c->dn_cur = c->dn_ckb;
        return;
    }
    dn_replay(c, n, NULL);
    c->dn_cur = 1 - c->dn_ckb;
}

void nx_dn_reset(nx_ctx *c) {
    if (!c->dn) return;
    const nx_deltanet *g = &c->m->cfg.dn;
    for (int32_t l = 0; l < c->m->cfg.n_linear; l++) {
        memset(c->dn[l].S[0], 0, sizeof(float) * (size_t)nx_deltanet_state_floats(g));
        memset(c->dn[l].conv, 0, sizeof(float) * (size_t)nx_deltanet_conv_floats(g));
    }
    c->dn_cur = c->dn_ckb = 0;
    c->dn_ck = 0;
    c->dn_mark = -1;
    c->dn_n_ckpts = 0;
}

int64_t nx_dn_saved_floats(const nx_model *m) {
    const nx_deltanet *g = &m->cfg.dn;
    return m->cfg.n_linear ? (int64_t)m->cfg.n_linear * (nx_deltanet_state_floats(g) + nx_deltanet_conv_floats(g)) : 0;
}

int32_t nx_dn_savable(const nx_ctx *c, int32_t n) {
    if (!c->dn || n >= c->n_past) return n < c->n_past ? n : c->n_past;
    const int32_t k = ckpt_floor(c, n);
    return k > 0 ? k : c->n_past;
}

void nx_dn_save(const nx_ctx *c, int32_t n, float *dst) {
    const size_t sf = state_floats(c), cf = conv_floats(c);
    const nx_dn_ckpt *k = n < c->n_past ? ckpt_at(c, n) : NULL;
    if (k) {
        memcpy(dst, k->st, sizeof(float) * (size_t)c->m->cfg.n_linear * (sf + cf));
        return;
    }
    for (int32_t l = 0; l < c->m->cfg.n_linear; l++, dst += sf + cf) {
        memcpy(dst, c->dn[l].S[c->dn_cur], sizeof(float) * sf);
        memcpy(dst + sf, c->dn[l].conv, sizeof(float) * cf);
    }
}

void nx_dn_load(nx_ctx *c, const float *src, int32_t n) {
    const size_t sf = state_floats(c), cf = conv_floats(c);
    for (int32_t l = 0; l < c->m->cfg.n_linear; l++, src += sf + cf) {
        memcpy(c->dn[l].S[0], src, sizeof(float) * sf);
        memcpy(c->dn[l].conv, src + sf, sizeof(float) * cf);
    }
    c->dn_cur = c->dn_ckb = 0;
    c->dn_ck = n;
    c->dn_n_ckpts = 0;
}
