/* GLM-4.7-Flash (glm4_moe_lite, Glm4MoeLiteForCausalLM; docs/design.md §12.3, checked against
 * transformers' glm4_moe_lite, vLLM's deepseek_v2.py + glm4_moe_lite_mtp.py and mlx-lm's
 * glm4_moe_lite.py): DeepSeek's multi-head latent attention (q LoRA, compressed latent KV,
 * interleaved RoPE on the roped key part) with GLM's MoE (sigmoid router, selection bias, shared
 * expert, a leading dense layer). MTP at model.layers.N in DeepSeek's layout, fed back before
 * shared_head.norm as vLLM's MTP layers return it. */
#include "family/family.h"

#define K(...) ((const char *const[]){__VA_ARGS__, NULL})

const nx_family nx_family_glm4_moe_lite = {
    .model_type = "glm4_moe_lite",
    .architectures = K("Glm4MoeLiteForCausalLM"),
    .summary = "GLM-4.7-Flash",
    .hf_layout = "hf",
    .keys = {
        .n_experts = K("n_routed_experts", "num_local_experts"),
        .expert_dim = K("moe_intermediate_size"),
        .n_shared = K("n_shared_experts"),
        .first_k_dense = K("first_k_dense_replace"),
        .qk_norm = K("use_qk_norm"),
        .attn_bias = K("attention_bias"),
        .rotary_factor = K("partial_rotary_factor"),
        .scaling = K("routed_scaling_factor"),
        .route_norm = K("norm_topk_prob"),
        .n_group = K("n_group"),
        .topk_group = K("topk_group"),
        .rope_interleave = K("rope_interleave"),
    },
    /* transformers' Glm4MoeLiteConfig defaults */
    .def = {.rope_theta = 10000.0, .n_shared = 1, .first_k_dense = 1, .qk_norm = false, .attn_bias = false,
            .rotary_factor = 1.0, .q_lora_rank = 768},
    .rope_pairs = NX_ROPE_INTERLEAVED,
    .attention = NX_ATTN_MLA,
    .router = NX_ROUTER_SIGMOID_BIAS,
    /* vLLM's DeepSeek-style MTP: embedding zeroed at position 0, pre-norm output fed back */
    .mtp = {.hidden_first = false, .recycle_prenorm = true, .zero_pos0 = true, .own_embed_head = true},
    .names = {
        .router = K("mlp.gate"),
        .expert_bias = K("mlp.gate.e_score_correction_bias", "mlp.e_score_correction_bias"),
        .shared = K("mlp.shared_experts."),
        .mtp_norm = K("shared_head.norm"),
        .mlx_renames = K(NULL), /* mlx-lm keeps the HF names (experts stacked, kv_b_proj split) */
        .mlx_router = "mlp.gate",
        .mtp_out_head = NULL,
        .mtp_out_block = NULL,
        .router_bits = 0, /* mlx-lm's MoEGate is not a Linear: it stays float */
    },
};
