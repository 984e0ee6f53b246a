/* Internal state of a loaded model and of a decoding context, shared by the forward pass
 * and the MTP head (forward.c), loading (model.c) and decoding (src/decode/). */
#ifndef NX_MODEL_INTERNAL_H
#define NX_MODEL_INTERNAL_H

#include "base/pool.h"
#include "io/safetensors.h"
#include "io/weights.h"
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
    nx_model_info info;
    char weight_dtype[96];
    char mtp_status[64];
};

/* One attention layer's cache: k and v are [n_kv_heads, n_ctx, head_dim] elements of the
 * model's kv_dtype, f32 or f16 (head-major, so attention streams each head's keys and values
 * contiguously; position-major strided reads ran twice as long at a few hundred positions).
 * Keys are stored after q/k-norm and RoPE, values raw. */
typedef struct nx_kv {
    void *k, *v;
} nx_kv;

/* Per-forward traffic and time, accumulated over the layers of one forward call. */
typedef struct nx_traffic {
    double expert_bytes;   /* routed + shared expert weight bytes read */
    int64_t experts_touched; /* distinct routed experts, summed over layers */
    int64_t overlap;       /* shared top-k experts between consecutive rows, summed */
    int64_t overlap_pairs;
    /* wall seconds and weight bytes of each part of the forward (NX_PHASE_*) */
    double phase_s[NX_PHASES], phase_bytes[NX_PHASES];
} nx_traffic;

/* What --draft auto has measured on a context (decode/generate.c), kept across generations:
 * costs belong to the model and the machine, not to a request, so later requests start from
 * them instead of paying for the exploration again (nx_ctx_reset_auto forgets them). */
#define NX_AUTO_COST_WINDOW 15 /* samples per median */
typedef struct nx_auto_state {
    /* recent costs (seconds) of r-row trunk forwards (slot r = 1..NX_MAX_DRAFT+1) and of MTP
     * forwards (slot 0): the choice works on their medians, robust to page faults, warm-up and
     * other processes' bursts */
    double hist[NX_MAX_DRAFT + 2][NX_AUTO_COST_WINDOW];
    int32_t hist_n[NX_MAX_DRAFT + 2];
    double acc_n[NX_MAX_DRAFT], acc_d[NX_MAX_DRAFT]; /* acceptance per chain position (decayed counts) */
    int32_t probe_every; /* plain steps between probes while drafting does not pay (0: not set yet) */
} nx_auto_state;

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
                         skipped rather than re-fed (see generate.c) */
    nx_auto_state autos; /* --draft auto's measurements */

    /* Trunk hidden per position, the one the MTP is fed (post- or pre-final-norm): [n_ctx, H];
       in kv_arena */
    float *hidden;

    /* Scratch sized for n_batch rows (shape comments give the row width). */
    float *x;     /* (n_batch, H) residual stream */
    float *xn;    /* (n_batch, H) normed input of a sub-block */
    float *q;     /* (n_batch, n_heads*head_dim) */
    float *k;     /* (n_batch, n_kv*head_dim) */
    float *v;     /* (n_batch, n_kv*head_dim) */
    float *att;   /* (n_batch, n_heads*head_dim) */
    float *y;     /* (n_batch, H) sub-block output */
    float *g;     /* (n_batch * (top_k + 1), F) FFN gate of every expert row, F = max width */
    float *u;     /* (n_batch * (top_k + 1), F) FFN up */
    float *hpre;  /* (n_batch, H) pre-final-norm hidden of the last forward */
    float *hpost; /* (n_batch, H) post-final-norm hidden of the last forward */
    float *scores; /* (n_threads, heads per kv head, n_ctx) attention scores */
    float *rope;   /* (n_batch, head_dim) RoPE cos/sin of the rows of the current call, for */
    int32_t rope_T, rope_pos0, rope_hd; /* this key (rope_T = 0: none) */
    double rope_theta;
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

    nx_traffic traffic; /* of the last forward */
};

/* Row pos of kv head h in one layer's k or v cache (nx_kv's layout, in one place). */
static inline void *nx_kv_row(const nx_ctx *c, void *cache, int64_t h, int64_t pos) {
    const size_t hb = (size_t)c->m->cfg.head_dim * nx_dtype_size(c->m->kv_dtype);
    return (char *)cache + ((size_t)h * (size_t)c->n_ctx + (size_t)pos) * hb;
}

/* Rows [0, n) of one layer's cache to (to_saved) or from a block laid out [k, v][kv head][stride
 * rows][head_dim] (the prompt cache's entries, state files). */
void nx_kv_copy_rows(const nx_ctx *c, nx_kv kv, void *saved, int32_t stride, int32_t n, bool to_saved);

/* rows = T: runs the trunk over tokens at positions n_past..n_past+T-1 (T ≤ n_batch), appends
 * to the caches, stores the MTP-fed hidden by position, and computes logits for rows
 * [logits_from, T) into logits (row-major, (T - logits_from, V)); logits may be NULL. */
nx_status nx_forward_trunk(nx_ctx *c, const int32_t *tokens, int32_t T, float *logits,
                           int32_t logits_from, nx_error *err);

/* MTP rows: row r = (hidden[r], token[r], position pos0 + r); writes the MTP cache at those
 * positions (the cache must hold exactly pos0 rows), logits of rows [logits_from, R) into
 * logits if non-NULL, and the hidden to feed back when chaining into c->mtp_out (R, H).
 * R ≤ n_batch. */
nx_status nx_forward_mtp(nx_ctx *c, const float *hidden, const int32_t *tokens, int32_t R,
                         int32_t pos0, float *logits, int32_t logits_from, nx_error *err);

/* Brings the MTP cache up to the trunk: rows p = mtp_past .. upto-1 pair the stored trunk
 * hidden at p with next_tokens[p - mtp_past] (= t[p+1]), at position p, in batches. With
 * all_logits, logits of every row go to logits[(p - first) * V]; otherwise only the last
 * row's logits go to logits[0]. logits may be NULL. */
nx_status nx_mtp_catch_up(nx_ctx *c, const int32_t *next_tokens, int32_t upto, float *logits,
                          bool all_logits, nx_error *err);

#endif
