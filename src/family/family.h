/* Where a model family plugs in: one descriptor per family (src/family/<name>.c), found by the
 * config's model_type or architectures entry. A descriptor is data only — its config.json keys
 * and defaults, the variant it uses of each shared building block, its MTP wiring and its
 * tensor names per layout; config, layout, convert and the forward pass read these and never
 * test which family they run. */
#ifndef NX_FAMILY_FAMILY_H
#define NX_FAMILY_FAMILY_H

#include <stdbool.h>
#include <stddef.h>

/* Which pairs of a head vector RoPE rotates. */
typedef enum nx_rope_pairs {
    NX_ROPE_NEOX = 0,    /* (i, i + rot/2): "rotate half" over the first rotary dims */
    NX_ROPE_INTERLEAVED, /* (2i, 2i + 1): GPT-J pairs (DeepSeek's rope_interleave) */
} nx_rope_pairs;

/* How a layer attends. */
typedef enum nx_attn_kind {
    NX_ATTN_GQA = 0, /* q/k/v projections, grouped kv heads, full keys and values cached */
    NX_ATTN_MLA,     /* multi-head latent attention (DeepSeek-V2/V3): low-rank q, one compressed
                        latent + one roped key per position cached, kv_b_proj absorbed */
} nx_attn_kind;

/* How the router turns logits into a choice and weights. */
typedef enum nx_router_kind {
    NX_ROUTER_SIGMOID_BIAS = 0, /* sigmoid scores; a correction bias added for choosing only;
                                   DeepSeek group limit; weights from the unbiased scores */
    NX_ROUTER_SOFTMAX,          /* softmax over all experts, top-k of it (Qwen) */
} nx_router_kind;

/* NULL-terminated alias lists of config.json keys: the first present one is read, and two
 * present ones must agree. */
typedef const char *const *nx_keys;

typedef struct nx_family_keys {
    nx_keys n_experts, expert_dim, n_shared, first_k_dense, qk_norm, attn_bias, rotary_factor,
        scaling, route_norm, n_group, topk_group, rope_interleave;
    nx_keys shared_dim;   /* the shared expert's width, when not n_shared x expert_dim */
    nx_keys attn_gate;    /* q_proj carries a per-head output gate */
    nx_keys n_nextn;      /* MTP layers the config declares */
} nx_family_keys;

typedef struct nx_family_defaults {
    double rope_theta;    /* when config.json names none */
    int n_shared;         /* shared experts */
    int first_k_dense;    /* leading dense layers (mlp_layer_types, if present, decides) */
    bool qk_norm;
    bool attn_bias;       /* q/k/v projections carry biases (the output projection never) */
    double rotary_factor; /* rotated share of head_dim */
    int q_lora_rank;      /* MLA: when config.json has no q_lora_rank (null there: a plain q_proj) */
    bool attn_gate;       /* output gate σ(q_proj's gate half) on every attention head */
} nx_family_defaults;

/* The MTP head's wiring: cat[enorm(embed(t+1)), hnorm(h)] → eh_proj → decoder layer → final
 * norm → head, with these per-family choices. */
typedef struct nx_family_mtp {
    bool hidden_first;     /* concat order [hnorm(h), enorm(e)] instead of embedding first */
    bool recycle_prenorm;  /* chained drafts feed back the block output before the final norm */
    bool zero_pos0;        /* the embedding of the row at position 0 is zeroed (vLLM's rule) */
    bool own_embed_head;   /* the layer's own embed_tokens / shared_head.head, when present,
                              replace the trunk's (else such copies are ignored) */
} nx_family_mtp;

/* Tensor names inside a decoder layer (relative to "model.layers.L."), tried in order. */
typedef struct nx_family_names {
    nx_keys router;       /* router gate module, e.g. "mlp.gate" */
    nx_keys expert_bias;  /* the selection bias vector */
    nx_keys shared;       /* shared expert prefix, e.g. "mlp.shared_experts." */
    nx_keys mtp_norm;     /* the MTP head's final norm, relative to the head prefix */
    const char *mtp_fc, *mtp_enorm, *mtp_hnorm; /* its input projection and norms (NULL: eh_proj,
                                                   enorm, hnorm) */
    const char *shared_gate; /* the shared expert's scalar gate σ(w·x) (NULL: none) */
    /* convert: source → output renames inside a layer for the MLX layout this family's mlx-lm
     * file writes (pairs, NULL-terminated; prefix match) */
    const char *const *mlx_renames;
    const char *mlx_router;  /* the router's module name in that layout */
    /* the prefixes convert writes the MTP head and its decoder layer under (NULL: the HF place,
     * model.layers.N.; the loader finds either naming) */
    const char *mtp_out_head, *mtp_out_block;
    int router_bits;         /* convert quantizes the router to this width (0: stays float) */
} nx_family_names;

/* Hybrid stacks (Qwen3.5 / Qwen3-Next): Gated DeltaNet layers between full-attention ones. */
typedef struct nx_family_hybrid {
    bool on;
    int full_interval;    /* layer L is full attention when (L + 1) % this == 0, unless the
                             config's layer_types or full_attention_interval say otherwise */
    bool norm_plus1;      /* the RMSNorms but the DeltaNet's own scale x by (1 + w) in the HF
                             layout (mlx-lm stores 1 + w) */
} nx_family_hybrid;

typedef struct nx_family {
    const char *model_type;
    nx_keys architectures; /* HF class names, e.g. "Glm4MoeForCausalLM" */
    const char *summary;   /* one line for `nextn inspect` */
    const char *hf_layout; /* what inspect calls the per-expert original layout */
    nx_family_keys keys;
    nx_family_defaults def;
    nx_rope_pairs rope_pairs; /* rope_interleave, when the family reads it, chooses instead */
    nx_attn_kind attention;
    nx_router_kind router;
    nx_family_mtp mtp;
    nx_family_names names;
    nx_family_hybrid hybrid;
    const char *text_config; /* a wrapper config (vision-language) nests the LM's keys here */
} nx_family;

/* The family of model_type (exact match) or NULL. */
const nx_family *nx_family_by_type(const char *model_type);
/* The family whose architectures list holds arch, or NULL. */
const nx_family *nx_family_by_arch(const char *arch);
/* Families in registration order: i < nx_family_count(). */
size_t nx_family_count(void);
const nx_family *nx_family_at(size_t i);
/* "hy_v3 (HYV3ForCausalLM), glm4_moe (Glm4MoeForCausalLM)" into buf, for error messages. */
const char *nx_family_list(char *buf, size_t cap);

/* The descriptors (one file each). */
extern const nx_family nx_family_hy_v3;
extern const nx_family nx_family_glm4_moe;
extern const nx_family nx_family_glm4_moe_lite;
extern const nx_family nx_family_deepseek_v3;
extern const nx_family nx_family_qwen3_5_moe;
extern const nx_family nx_family_qwen3_next;

#endif
