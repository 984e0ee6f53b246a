/* Internal state of a loaded model and of a decoding context, shared by the forward pass
 * and the MTP head (forward.c), contexts (ctx.c), loading (model.c), prompt caches and state
 * files. Decoding (src/decode/) sees only model/step.h. */
#ifndef NX_MODEL_INTERNAL_H
#define NX_MODEL_INTERNAL_H

#include "base/pool.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "model/experts.h"
#include "model/route_stats.h"
#include "model/step.h"
#include "nextn.h"

/* Experts whose matmuls one parallel job holds (more are processed in several jobs). */
#define NX_MAX_EXPERTS_TOUCHED 64

struct nx_model {
    nx_store *store;
    nx_config cfg;
    nx_weights w;
    nx_tokenizer *tok;
    char *chat_template;
    char *tmpl_bos, *tmpl_eos, *token_suffix; /* tokenizer_config.json's strings (NULL: absent) */
    nx_pool *pool;
    nx_mtp_wiring wiring; /* resolved: no DEFAULT values left */
    int32_t draft_vocab;  /* rows of lm_head the MTP head computes (vocab_size = all) */
    nx_dtype kv_dtype;    /* NX_DTYPE_F32 or NX_DTYPE_F16: the contexts' KV caches */
    nx_xplan plan;   /* residency (nx_load_params.max_memory) */
    nx_xcache *xc;   /* the routed experts' cache when they stream, else NULL */
    nx_route_stats routes; /* router statistics: the loaded file's counts, and this run's */
    nx_model_info info;
    /* several ranks (split.h): NULL / NX_SPLIT_NONE for one process */
    nx_dist *dist;
    nx_split split;
    int rank, ranks;
    int32_t *layer_lo;          /* [ranks + 1] pipeline: rank r runs trunk layers [lo[r], lo[r+1]) */
    struct nx_split_root *root; /* rank 0: the queued operations, the contexts' ids */
    struct {                    /* loaded from one rank's share (share.h) */
        bool on, head;
        uint64_t digest;        /* the source checkpoint's (nx_store_digest) */
        int32_t lo, hi;         /* pipeline: the trunk layers it was cut for */
    } share;
    char weight_dtype[96];
    char mtp_status[64];
};

/* One attention layer's cache: k and v are [cache_heads, n_ctx, cache_k] elements of the
 * model's kv_dtype, f32 or f16 (head-major, so attention streams each head's keys and values
 * contiguously; position-major strided reads ran twice as long at a few hundred positions).
 * Keys are stored after q/k-norm and RoPE, values raw. Latent attention caches one row per
 * position, [normed latent | roped key], in k; v is NULL. */
typedef struct nx_kv {
    void *k, *v;
} nx_kv;

/* Rows of a forward call whose DeltaNet states stay recoverable: a verify pass's k + 1 rows
 * (nx_ctx_truncate can go back to any of them). */
#define NX_DN_REWIND (NX_MAX_DRAFT + 1)

/* One Gated DeltaNet layer's recurrent state in a context (docs/design.md §12.4). The state after
 * the context's last row is S[c->dn_cur]; the state at row c->dn_ck is S[c->dn_ckb] (the same
 * buffer when nothing was computed since), and per row since then the inputs the delta rule
 * needs to compute the state again (rk, rv, rd, rb) — so a truncation to any row in between
 * replays those rows instead of keeping a snapshot per row. */
typedef struct nx_dn_state {
    float *S[2]; /* [n_v_heads][k_dim][v_dim] each */
    float *conv; /* [conv_k - 1][channels]: the convolution's inputs before the next row */
    float *hist; /* [conv_k - 1 + NX_DN_REWIND][channels]: its inputs from row dn_ck - (conv_k - 1) */
    float *rk;   /* [NX_DN_REWIND][n_k_heads * k_dim] normalised keys of the rows since dn_ck */
    float *rv;   /* [NX_DN_REWIND][n_v_heads * v_dim] values */
    float *rd;   /* [NX_DN_REWIND][n_v_heads] decays exp(g) */
    float *rb;   /* [NX_DN_REWIND][n_v_heads] betas */
} nx_dn_state;

/* A checkpoint: every DeltaNet layer's state and window after row `row` (nx_dn_save's layout), so
 * that a context can go back to that row later without computing the rows before it again. */
typedef struct nx_dn_ckpt {
    int32_t row;
    float *st; /* nx_dn_saved_floats */
} nx_dn_ckpt;


/* Latent attention splits a row's positions into at most NX_MLA_MAX_BLOCKS blocks of
 * NX_MLA_BLOCK positions (or a multiple; forward.c); the partial results of a pass's rows take at
 * most NX_MLA_PART_BYTES, or one row's. */
#define NX_MLA_BLOCK 256
#define NX_MLA_MAX_BLOCKS 32
#define NX_MLA_PART_BYTES (16u << 20)

struct nx_ctx {
    nx_model *m;
    int32_t n_ctx;   /* positions the caches hold */
    int32_t n_batch; /* rows one forward call handles at most */

    nx_kv *kv;       /* [n_layers] */
    int32_t n_past;  /* rows in the trunk cache */
    int32_t *tokens; /* [n_ctx] the token of each trunk cache row (valid below n_past) */
    nx_kv mtp_kv;
    void *kv_arena;  /* every k and v above and the hidden states below, in one mapping on 2 MB
                        pages where the kernel gives them */
    size_t kv_arena_bytes;
    int32_t mtp_past; /* rows in the MTP cache */
    int32_t mtp_lo;   /* first MTP row attended: > 0 after a long stretch of plain decoding was
                         skipped rather than re-fed (nx_mtp_skip_to) */
    void *slot;       /* the decoder's block (nx_ctx_decoder_slot), slot_size bytes */
    size_t slot_size;
    nx_fwd_sink sink; /* telemetry (sink.forward NULL: none) */

    /* Trunk hidden per position, the one the MTP is fed (post- or pre-final-norm): [n_ctx, H];
       in kv_arena */
    float *hidden;

    /* Scratch sized for n_batch rows (shape comments give the row width). */
    float *x;     /* (n_batch, H) residual stream */
    float *xn;    /* (n_batch, H) normed input of a sub-block */
    float *q;     /* (n_batch, n_heads*head_dim) */
    float *k;     /* (n_batch, n_kv*head_dim); MLA: (n_batch, q_lora_rank) */
    float *v;     /* (n_batch, n_kv*head_dim); MLA: (n_batch, cache_k) the new cache rows */
    float *att;   /* (n_batch, n_heads*head_dim), MLA: (n_batch, n_heads*v_head_dim) */
    float *lat_q; /* MLA: (n_batch, n_heads*cache_k) queries in the latent space */
    float *lat_o; /* MLA: (n_batch, n_heads*kv_lora_rank) attention results in it */
    float *lat_part;      /* MLA: (lat_part_rows, NX_MLA_MAX_BLOCKS, n_heads, kv_lora_rank + 2) each position
                             block's partial result, max and sum (forward.c) */
    int32_t lat_part_rows; /* rows whose blocks it holds at once */
    float *y;     /* (n_batch, H) sub-block output */
    float *g;     /* (n_batch * (top_k + 1), F) FFN gate of every expert row, F = max width */
    float *u;     /* (n_batch * (top_k + 1), F) FFN up */
    float *hpre;  /* (n_batch, H) pre-final-norm hidden of the last forward */
    float *hpost; /* (n_batch, H) post-final-norm hidden of the last forward */
    float *scores; /* (n_threads, heads per kv head (MLA: all heads), n_ctx) attention scores */
    float *rope;   /* (n_batch, head_dim) RoPE cos/sin of the rows of the current call, for */
    int64_t rope_serial; /* this forward call (serial), */
    int32_t rope_hd;     /* rotated dims */
    double rope_theta;   /* and theta */
    int64_t serial;      /* forward calls run on this context's scratch */
    float *blogits;      /* (blogits_rows, V): logits of the rows of several contexts' forward */
    int32_t blogits_rows;
    struct nx_batch *batch; /* the batch whose scratch runs this context's forwards (NULL: its own) */
    bool batch_busy;        /* generating: the batch waits for its forwards (under the batch's lock) */
    /* MoE */
    float *router;     /* (n_batch, E_max) router logits */
    int32_t *sel;      /* (n_batch, top_k) chosen experts */
    float *selw;       /* (n_batch, top_k) their weights */
    int32_t *prev_sel; /* (n_layers + 1, top_k) last row's choice per layer, for overlap */
    int32_t *rows;     /* (n_batch * top_k) source row of each gathered expert row */
    float *rows_w;     /* (n_batch * top_k) its routing weight */
    float *xe;         /* (n_batch * top_k, H) rows gathered by expert */
    float *ye;         /* (n_batch * (top_k + 1), H) expert outputs (+ shared expert) */
    /* MTP */
    float *mtp_in;  /* (n_batch, 2H) concat input */
    float *mtp_out; /* (n_batch, H) output hidden fed back when chaining */
    int32_t mtp_rows; /* rows in mtp_out from the last MTP forward */

    /* Gated DeltaNet layers (hybrid models; dn NULL otherwise) */
    nx_dn_state *dn;    /* [n_linear] */
    int dn_cur, dn_ckb; /* which S holds the current state, which the one at dn_ck */
    int32_t dn_ck;      /* the oldest row a truncation can go back to */
    int32_t dn_split;   /* the running forward's first recoverable row (relative) */
    int32_t dn_mark;    /* a row whose states to keep when a forward passes it (-1: none) */
    nx_dn_ckpt *dn_ckpts; /* [dn_max_ckpts]; the first dn_n_ckpts in use, rows ascending */
    int dn_n_ckpts, dn_max_ckpts;
    int32_t dn_every;   /* prompt rows between checkpoints taken while prefilling (0: none) */
    int64_t dn_rewinds; /* truncations that took the states back, their seconds and state bytes */
    double dn_rewind_s, dn_rewind_bytes;
    float *dn_x;        /* (seqs (conv_k - 1) + n_batch, channels) the convolution's inputs, each
                         * sequence's window before its rows */
    float *dn_qkv;      /* (n_batch, channels) its outputs after SiLU */
    float *dn_z;        /* (n_batch, n_v_heads * v_dim) the output gate */
    float *dn_b, *dn_a; /* (n_batch, n_v_heads) */
    float *dn_f;        /* (n_batch, channels + v width + 2 n_v_heads) fused projections (Qwen3-Next) */
    float *dn_o;        /* (n_batch, n_v_heads * v_dim) the heads' outputs */
    float *qg;          /* (n_batch, 2 n_heads head_dim) gated attention's q_proj rows */
    float *sgate;       /* (n_batch) the shared expert's gate */

    nx_traffic traffic; /* of the last forward */
    int32_t split_id;   /* the context's id among the ranks (split.h) */
    float *split_logits; /* a worker's logits of the operation it follows */
    double net0_bytes, net0_s; /* the rank's network counters when the forward began */
    int64_t net0_msgs;
};

/* Row pos of kv head h in one layer's k or v cache (nx_kv's layout, in one place; value rows,
 * where there are any, are as wide as key rows). */
static inline void *nx_kv_row(const nx_ctx *c, void *cache, int64_t h, int64_t pos) {
    const size_t hb = (size_t)c->m->cfg.cache_k * nx_dtype_size(c->m->kv_dtype);
    return (char *)cache + ((size_t)h * (size_t)c->n_ctx + (size_t)pos) * hb;
}

/* Layers with a key/value cache (Gated DeltaNet layers have none). */
static inline int32_t nx_kv_layers(const nx_model *m) { return m->cfg.n_layers - m->cfg.n_linear; }

/* Bytes of one position of one layer's cache (keys and values of every cached head). */
static inline size_t nx_kv_pos_bytes(const nx_model *m) {
    return (size_t)m->cfg.cache_heads * (size_t)(m->cfg.cache_k + m->cfg.cache_v) * nx_dtype_size(m->kv_dtype);
}

/* Rows [0, n) of one layer's cache to (to_saved) or from a block laid out [k, v][kv head][stride
 * rows][cache_k] (the prompt cache's entries, state files; no v part without value rows). */
void nx_kv_copy_rows(const nx_ctx *c, nx_kv kv, void *saved, int32_t stride, int32_t n, bool to_saved);
/* The MTP head's cache rows that a copy of the context's first n rows keeps: those it holds whose
 * next token is among the n (row p pairs hidden p with token p + 1), when its attention starts at
 * row 0 (nx_generate keeps such rows of a reused prefix); else none. */
int32_t nx_mtp_rows_for(const nx_ctx *c, int32_t n);

/* Contexts one forward runs together at most. */
#define NX_BATCH_MAX_SEQS 64

/* One sequence's rows in a forward over several contexts (docs/design.md §15): rows [r0, r0 + T)
 * of the scratch context's buffers, at positions pos0.., attending over kc's own caches. A
 * forward of one context has one segment whose kc is the scratch context itself. */
typedef struct nx_seg {
    nx_ctx *kc;
    int32_t r0, T, pos0;
} nx_seg;

/* One forward call of one context: a trunk forward (tokens, T rows at the context's n_past) or
 * an MTP one (hidden and tokens, T rows at pos0), logits of rows [logits_from, T) into logits
 * (NULL: none). st / err receive its outcome. */
typedef struct nx_fwd_req {
    nx_ctx *c;
    bool mtp;
    const int32_t *tokens;
    const float *hidden;
    int32_t T, pos0;
    float *logits;
    int32_t logits_from;
    nx_status st;
    nx_error *err;
    bool queued; /* waiting in a batch */
} nx_fwd_req;

/* Runs n requests, all trunk or all MTP, of distinct contexts as ONE forward on the scratch
 * context s (its n_batch must hold their rows): every matmul and the MoE over all rows, the
 * attention of each over its own caches. Each request's rows get the bits a forward of that
 * context alone gives them (batch invariance). A request that is refused (bad tokens, a full
 * context) fails alone. */
void nx_forward_run(nx_ctx *s, nx_fwd_req *rq, int n);

/* A context that only lends its scratch to batches (batch.c): rows rows of up to seqs sequences
 * per forward, logits of logit_rows rows gathered at once, caches of a single position (never
 * attended). */
nx_status nx_ctx_new_scratch(nx_model *m, int32_t rows, int32_t seqs, int32_t logit_rows, nx_ctx **out,
                             nx_error *err);

/* Hands a request of a context in a batch to the batch (batch.c): it runs with the requests of
 * the batch's other contexts. Returns its status. */
nx_status nx_batch_submit(struct nx_batch *b, nx_fwd_req *rq);

/* Waits until the batch runs no round and keeps the next one from starting until
 * nx_batch_release: a context's own work on the model's thread pool (taking recurrent states back)
 * needs it, as the pool runs one job at a time and a round's forward runs on it. Returns false,
 * holding nothing, on the thread running the round (its forward's own truncation). */
bool nx_batch_hold(struct nx_batch *b);
void nx_batch_release(struct nx_batch *b);

/* MTP rows: row r = (hidden[r], token[r], position pos0 + r); writes the MTP cache at those
 * positions (the cache must hold exactly pos0 rows), logits of rows [logits_from, R) into
 * logits if non-NULL, and the hidden to feed back when chaining into c->mtp_out (R, H).
 * R ≤ n_batch. */
nx_status nx_forward_mtp(nx_ctx *c, const float *hidden, const int32_t *tokens, int32_t R,
                         int32_t pos0, float *logits, int32_t logits_from, nx_error *err);

#endif
