/* Qwen3-Next (qwen3_next, Qwen3NextForCausalLM; docs/design.md §12.4, checked against
 * transformers' qwen3_next, vLLM's qwen3_next.py + qwen3_next_mtp.py and mlx-lm's qwen3_next.py):
 * Qwen3.5's hybrid stack with the DeltaNet input projections fused per key head (in_proj_qkvz:
 * q | k | v | z of the key head's value heads; in_proj_ba: b | a), a flat config, a full-attention
 * layer every full_attention_interval, and norm_topk_prob choosing the renormalisation. */
#include "family/family.h"

#define K(...) ((const char *const[]){__VA_ARGS__, NULL})

const nx_family nx_family_qwen3_next = {
    .model_type = "qwen3_next",
    .architectures = K("Qwen3NextForCausalLM"),
    .summary = "Qwen3-Next",
    .hf_layout = "hf",
    .keys = {
        .n_experts = K("num_experts"),
        .expert_dim = K("moe_intermediate_size"),
        .n_shared = K(NULL),
        .first_k_dense = K(NULL),
        .qk_norm = K(NULL),
        .attn_bias = K("attention_bias"),
        .rotary_factor = K("partial_rotary_factor"),
        .scaling = K(NULL),
        .route_norm = K("norm_topk_prob"),
        .n_group = K(NULL),
        .topk_group = K(NULL),
        .shared_dim = K("shared_expert_intermediate_size"),
        .attn_gate = K("attn_output_gate"),
        .n_nextn = K("num_nextn_predict_layers"),
    },
    /* transformers' Qwen3NextConfig defaults */
    .def = {.rope_theta = 10000.0, .n_shared = 1, .first_k_dense = 0, .qk_norm = true, .attn_bias = false,
            .rotary_factor = 0.25, .attn_gate = true},
    .rope_pairs = NX_ROPE_NEOX,
    .attention = NX_ATTN_GQA,
    .router = NX_ROUTER_SOFTMAX,
    .mtp = {.hidden_first = false, .recycle_prenorm = false, .zero_pos0 = false, .own_embed_head = false},
    .names = {
        .router = K("mlp.gate"),
        .expert_bias = K(NULL),
        .shared = K("mlp.shared_expert."),
        .mtp_norm = K("norm"),
        .mtp_fc = "fc",
        .mtp_enorm = "pre_fc_norm_embedding",
        .mtp_hnorm = "pre_fc_norm_hidden",
        .shared_gate = "mlp.shared_expert_gate",
        .mlx_renames = K(NULL),
        .mlx_router = "mlp.gate",
        .mtp_out_head = "mtp.", /* transformers' names (mlx-lm drops the head) */
        .mtp_out_block = "mtp.layers.0.",
        .router_bits = 8,
    },
    .hybrid = {.on = true, .full_interval = 4, .norm_plus1 = true},
    .text_config = NULL,
};
