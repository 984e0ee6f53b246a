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
    int32_t n_heads, n_kv_heads, head_dim;
    int32_t intermediate_size;   /* dense FFN width */
    int32_t expert_dim;          /* expert_hidden_dim / moe_intermediate_size */
    int32_t n_experts, top_k, n_shared_experts;
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
    bool attn_bias;              /* q/k/v projections carry biases */
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
    nx_ffn shared;       /* width expert_dim * n_shared_experts */
} nx_moe;

typedef struct nx_layer {
    float *attn_norm;    /* [hidden] input_layernorm, owned */
    float *ffn_norm;     /* [hidden] post_attention_layernorm, owned */
    nx_linear wq, wk, wv, wo;
    float *q_norm, *k_norm; /* [head_dim] owned; NULL when qk_norm is false */
    float *bq, *bk, *bv;    /* [n_heads*head_dim], [n_kv*head_dim] x2 owned; NULL without biases */
    bool is_moe;
    nx_ffn dense;        /* when !is_moe */
    nx_moe moe;          /* when is_moe */
} nx_layer;

typedef struct nx_mtp_weights {
    float *enorm, *hnorm, *final_norm; /* [hidden] owned; hnorm may be NULL (no hnorm) */
    nx_linear eh_proj;                 /* [hidden, 2*hidden] */
    nx_layer layer;
    /* the head's own embedding and output head (GLM-4.5), else the trunk's: .w NULL */
    nx_linear embed, head;
} nx_mtp_weights;

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
} nx_weights;

#endif
