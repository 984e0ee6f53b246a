/* The model's configuration and weight table: what the loader (src/io/) produces from any
 * supported checkpoint layout and what the forward pass (src/model/) consumes. Matrices are
 * views into mapped files (nx_linear); small vectors (norms, expert bias) are owned f32
 * copies so the hot path never converts them. */
#ifndef NX_IO_WEIGHTS_H
#define NX_IO_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "family/family.h"

#define NX_MAX_EOS 8

/* YaRN RoPE scaling (transformers' _compute_yarn_parameters): the inverse frequencies blend
 * interpolation (/ factor) and extrapolation over a ramp between the dims that make beta_fast and
 * beta_slow rotations in orig_max_pos positions; cos and sin are multiplied by attn_factor. */
typedef struct nx_yarn {
    double factor, orig_max_pos, beta_fast, beta_slow, attn_factor;
    double mscale_all_dim; /* MLA's softmax scale takes yarn_get_mscale(factor, this)^2 (0: none) */
    bool truncate; /* the ramp's ends rounded to whole dims */
} nx_yarn;

/* Multi-head latent attention's shapes (DeepSeek-V2/V3 names). */
typedef struct nx_mla {
    int32_t q_lora_rank; /* 0: a plain q_proj */
    int32_t kv_lora_rank, qk_nope, qk_rope, v_head_dim;
    float scale;         /* softmax scale: (qk_nope + qk_rope)^-1/2, x mscale^2 under YaRN */
} nx_mla;

/* Gated DeltaNet's shapes (Qwen3.5 / Qwen3-Next names: linear_num_key_heads, ...). */
typedef struct nx_deltanet {
    int32_t n_k_heads, n_v_heads; /* value head h reads key head h / (n_v_heads / n_k_heads) */
    int32_t k_dim, v_dim;         /* per head */
    int32_t conv_k;               /* causal depthwise conv kernel over the q | k | v channels */
} nx_deltanet;

/* Channels of the DeltaNet's convolution: q, k (n_k_heads x k_dim each) and v. */
static inline int32_t nx_deltanet_channels(const nx_deltanet *d) {
    return 2 * d->n_k_heads * d->k_dim + d->n_v_heads * d->v_dim;
}

/* f32 values of one DeltaNet layer's recurrent state (its state per value head is k_dim x v_dim)
 * and of its convolution window (the conv_k - 1 inputs before the next token). */
static inline int64_t nx_deltanet_state_floats(const nx_deltanet *d) {
    return (int64_t)d->n_v_heads * d->k_dim * d->v_dim;
}
static inline int64_t nx_deltanet_conv_floats(const nx_deltanet *d) {
    return (int64_t)(d->conv_k - 1) * nx_deltanet_channels(d);
}

/* One per-module quantization override from config.json "quantization". */
typedef struct nx_quant_override {
    char *path;  /* module path, e.g. "model.layers.1.mlp.router.gate" */
    int bits;    /* 0 = not quantized (override was `false`) */
    int group;
} nx_quant_override;

typedef struct nx_config {
    char model_type[32];
    const nx_family *family;     /* the descriptor model_type / architectures named */
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t n_layers;            /* trunk layers; the MTP layer is index n_layers */
    int32_t n_heads, n_kv_heads, head_dim; /* MLA: head_dim = qk_nope + qk_rope (a query head) */
    int32_t intermediate_size;   /* dense FFN width */
    int32_t expert_dim;          /* expert_hidden_dim / moe_intermediate_size */
    int32_t n_experts, top_k, n_shared_experts;
    int32_t shared_dim;          /* the shared expert's width (expert_dim x n_shared by default) */
    int32_t first_k_dense;       /* layers < this are dense */
    bool route_norm;
    float router_scaling;
    float rms_eps;
    double rope_theta;
    int64_t max_positions;
    bool qk_norm;
    /* variants of the shared building blocks, from the family and its config keys */
    int32_t rotary_dim;          /* leading dims of each head RoPE rotates (even, <= head_dim) */
    nx_rope_pairs rope_pairs;
    nx_yarn yarn;                /* factor 0: no RoPE scaling */
    bool attn_bias;              /* q/k/v projections carry biases */
    nx_attn_kind attention;
    nx_mla mla;                  /* when attention is NX_ATTN_MLA */
    bool attn_gate;              /* q_proj gives per head [query | gate]; output x σ(gate) */
    /* Hybrid stacks: layer l is a Gated DeltaNet when linear[l] (NULL: none is) */
    bool *linear;
    int32_t n_linear;
    nx_deltanet dn;
    /* One layer's cache per position: cache_heads blocks of cache_k key elements, then, when
     * cache_v > 0, as many blocks of cache_v value elements (GQA: n_kv_heads x head_dim each;
     * MLA: one block of kv_lora_rank + qk_rope_head_dim, its values being the latent part). */
    int32_t cache_heads, cache_k, cache_v;
    nx_router_kind router;
    int32_t n_group, topk_group; /* group-limited expert choice (1, 1: none) */
    nx_family_mtp mtp;           /* the MTP head's wiring defaults */
    bool tie_embeddings;
    int32_t n_nextn_layers;
    int32_t bos_id, pad_id;
    int32_t eos_ids[NX_MAX_EOS];
    int32_t n_eos;
    /* quantization block (bits == 0: none) */
    int quant_bits, quant_group;
    nx_quant_override *quant_overrides;
    int32_t n_quant_overrides;
} nx_config;

/* SwiGLU feed-forward: down(silu(gate(x)) * up(x)). */
typedef struct nx_ffn {
    nx_linear gate, up, down;
} nx_ffn;

/* Stored bytes of an FFN's three projections (what one pass over it reads). */
static inline uint64_t nx_ffn_bytes(const nx_ffn *f) {
    return (uint64_t)(nx_linear_bytes(&f->gate) + nx_linear_bytes(&f->up) + nx_linear_bytes(&f->down));
}

typedef struct nx_moe {
    int32_t n_experts;   /* may differ from the config for the MTP layer (read from tensors) */
    nx_linear router;    /* [n_experts, hidden]; computed in f32 */
    float *expert_bias;  /* [n_experts] owned; selection only; NULL if absent (zeros) */
    nx_ffn *experts;     /* [n_experts] owned array of views (per-expert or stacked slices) */
    bool has_shared;
    nx_ffn shared;       /* width shared_dim */
    nx_linear shared_gate; /* [1, hidden]: the shared expert's output x σ(this · x) (.w NULL: x 1) */
} nx_moe;

/* A layer's multi-head latent attention: q = wq_b(q_a_norm(wq_a x)) (or wq x without q LoRA, in
 * nx_layer.wq), [latent | k_pe] = wkv_a x. Absorbed form: per head h the query's nope part is
 * taken into the latent space by the rows [h*kv_lora_rank, +kv_lora_rank) of wk_b
 * ([n_heads*kv_lora_rank, qk_nope], mlx-lm's embed_q), and the latent attention output out of it
 * by the rows [h*wv_b_stride + wv_b_off, +v_head_dim) of wv_b ([*, kv_lora_rank]: mlx-lm's
 * unembed_out, or the value rows of HF's kv_b_proj read in place). */
typedef struct nx_mla_layer {
    nx_linear wq_a, wq_b, wkv_a, wk_b, wv_b;
    float *q_a_norm, *kv_a_norm; /* [q_lora_rank], [kv_lora_rank] owned */
    int32_t wv_b_stride, wv_b_off;
    int64_t wv_b_rows; /* value rows in wv_b (n_heads x v_head_dim): what a pass reads of it */
    void *wk_b_owned; /* wk_b's data when made at load from HF's kv_b_proj (transposed), else NULL */
} nx_mla_layer;

/* A Gated DeltaNet layer (Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; Qwen3-Next:
 * in_proj_qkvz and in_proj_ba, fused per key head, in qkvz / ba with the split ones unused). */
typedef struct nx_dn_layer {
    nx_linear qkv, z, b, a, qkvz, ba, out;
    float *conv;     /* [channels][conv_k] owned */
    float *neg_A;    /* [n_v_heads] -exp(A_log), owned */
    float *dt_bias;  /* [n_v_heads] owned */
    float *norm;     /* [v_dim] owned: the gated RMSNorm's plain weight */
    int32_t slot;    /* this layer's index among the DeltaNet layers (its state in a context) */
} nx_dn_layer;

typedef struct nx_layer {
    bool linear;         /* a Gated DeltaNet layer (dn) instead of attention */
    nx_dn_layer dn;
    float *attn_norm;    /* [hidden] input_layernorm, owned */
    float *ffn_norm;     /* [hidden] post_attention_layernorm, owned */
    nx_linear wq, wk, wv, wo; /* MLA: wq only without q LoRA; wk, wv unused */
    nx_mla_layer mla;
    float *q_norm, *k_norm; /* [head_dim] owned; NULL when qk_norm is false */
    float *bq, *bk, *bv;    /* [n_heads*head_dim], [n_kv*head_dim] x2 owned; NULL without biases */
    bool is_moe;
    nx_ffn dense;        /* when !is_moe */
    nx_moe moe;          /* when is_moe */
} nx_layer;

/* The attention weights of a layer a pass reads, into out (at most NX_ATTN_LINEARS); wv_b as
 * its first wv_b_rows rows (as many bytes as a pass reads of it, not always those rows). */
#define NX_ATTN_LINEARS 9
static inline int nx_attn_linears(const nx_layer *L, nx_linear out[NX_ATTN_LINEARS]) {
    int n = 0;
    if (L->linear) {
        const nx_dn_layer *d = &L->dn;
        const nx_linear dn[7] = {d->qkv, d->z, d->b, d->a, d->qkvz, d->ba, d->out};
        for (int i = 0; i < 7; i++)
            if (dn[i].w) out[n++] = dn[i];
        return n;
    }
    const nx_linear all[NX_ATTN_LINEARS - 1] = {L->wq,         L->wk,          L->wv,          L->mla.wq_a,
                                                L->mla.wq_b,   L->mla.wkv_a,   L->mla.wk_b,    L->wo};
    for (int i = 0; i < NX_ATTN_LINEARS - 1; i++)
        if (all[i].w) out[n++] = all[i];
    if (L->mla.wv_b.w) out[n++] = nx_linear_rows(&L->mla.wv_b, 0, L->mla.wv_b_rows);
    return n;
}

/* Stored bytes of a layer's attention weights (what one pass over it reads). */
static inline uint64_t nx_attn_bytes(const nx_layer *L) {
    nx_linear w[NX_ATTN_LINEARS];
    uint64_t b = 0;
    for (int i = 0, n = nx_attn_linears(L, w); i < n; i++) b += nx_linear_bytes(&w[i]);
    return b;
}

typedef struct nx_mtp_weights {
    float *enorm, *hnorm, *final_norm; /* [hidden] owned; hnorm may be NULL (no hnorm) */
    nx_linear eh_proj;                 /* [hidden, 2*hidden] */
    nx_layer layer;
    /* the head's own embedding and output head (GLM-4.5), else the trunk's: .w NULL */
    nx_linear embed, head;
} nx_mtp_weights;

/* The stored tensors a loaded vector or matrix came from (names owned by the store), so a
 * problem found after loading names the tensor as the file spells it, whatever the layout. */
typedef struct nx_weight_name {
    const void *at;                     /* the vector, or the matrix's data (nx_linear.w) */
    const char *weight, *scales, *biases; /* scales, biases: NULL unless quantized */
} nx_weight_name;

typedef struct nx_weights {
    nx_linear embed;     /* [vocab, hidden] (row lookup) */
    nx_linear lm_head;   /* [vocab, hidden]; = embed when tied */
    float *final_norm;   /* [hidden] owned */
    nx_layer *layers;    /* [n_layers] owned */
    int32_t n_layers;
    bool has_mtp;
    nx_mtp_weights mtp;
    /* provenance, for `nextn inspect` */
    char layout[16];     /* "tencent" | "mlx" */
    char mtp_where[32];  /* "inline", "sidecar", "none" */
    nx_weight_name *names; /* owned: every vector and unstacked matrix loaded */
    size_t n_names, cap_names;
} nx_weights;

/* The stored names of the vector or matrix data at (NULL when it was not loaded by name). */
const nx_weight_name *nx_weights_name_of(const nx_weights *w, const void *at);

#endif
