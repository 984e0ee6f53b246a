/* GLM-4.5 / 4.6 / 4.7 / 4.5-Air (glm4_moe, Glm4MoeForCausalLM; docs/design.md §12, checked against
 * transformers' glm4_moe, vLLM's glm4_moe(_mtp).py and mlx-lm's glm4_moe.py): NeoX RoPE on the
 * first head_dim * partial_rotary_factor dims, q/k/v biases, optional qk-norm, the DeepSeek
 * sigmoid router (selection bias, group limit, norm_topk_prob, routed_scaling_factor), shared
 * experts and leading dense layers. MTP at model.layers.N: the block output is fed back before
 * shared_head.norm (vLLM returns residual + h and applies the norm in compute_logits); GLM-4.5
 * ships its own embed_tokens / shared_head.head there, GLM-4.6 does not (the trunk's then). */
#include "family/family.h"

#define K(...) ((const char *const[]){__VA_ARGS__, NULL})

const nx_family nx_family_glm4_moe = {
    .model_type = "glm4_moe",
    .architectures = K("Glm4MoeForCausalLM"),
    .summary = "GLM-4.5/4.6/4.7/Air",
    .hf_layout = "hf",
    .keys = {
        .n_experts = K("n_routed_experts", "num_experts"),
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
    },
    /* transformers' Glm4MoeConfig defaults */
    .def = {.rope_theta = 10000.0, .n_shared = 1, .first_k_dense = 1, .qk_norm = false,
            .attn_bias = false, .rotary_factor = 0.5},
    .rope_pairs = NX_ROPE_NEOX,
    .router = NX_ROUTER_SIGMOID_BIAS,
    /* vLLM zeroes the embedding of the row at position 0 ("masking inputs at position 0, as not
     * needed by MTP"); that row's keys feed every later MTP row, so drafts follow vLLM's only
     * when the head sees the same zeros. */
    .mtp = {.hidden_first = false, .recycle_prenorm = true, .zero_pos0 = true, .own_embed_head = true},
    .names = {
        .router = K("mlp.gate", "mlp.router.gate"),
        .expert_bias = K("mlp.gate.e_score_correction_bias", "mlp.e_score_correction_bias",
                         "mlp.router.expert_bias", "mlp.expert_bias"),
        .shared = K("mlp.shared_experts.", "mlp.shared_mlp."),
        .mtp_norm = K("shared_head.norm", "final_layernorm"),
        .mlx_renames = K(NULL), /* mlx-lm keeps the HF names (experts stacked as switch_mlp) */
        .mlx_router = "mlp.gate",
        .mtp_out_head = NULL, /* mlx-lm drops the layer: it keeps HF's place and names */
        .mtp_out_block = NULL,
        .router_bits = 0, /* mlx-lm's MoEGate is not a Linear: it stays float */
    },
};
