/* DeepSeek-V3 / V3.1 (deepseek_v3, DeepseekV3ForCausalLM; docs/design.md §12.3, checked against
 * transformers' deepseek_v3, vLLM's deepseek_v2.py + deepseek_mtp.py and mlx-lm's deepseek_v3.py):
 * multi-head latent attention with YaRN (its mscale² in the softmax scale), the sigmoid router
 * with a selection bias limited to topk_group of n_group groups, a shared expert, leading dense
 * layers. The MTP layer model.layers.N carries its own embed_tokens and shared_head.head and is
 * fed back before shared_head.norm. */
#include "family/family.h"

#define K(...) ((const char *const[]){__VA_ARGS__, NULL})

const nx_family nx_family_deepseek_v3 = {
    .model_type = "deepseek_v3",
    .architectures = K("DeepseekV3ForCausalLM"),
    .summary = "DeepSeek-V3/V3.1",
    .hf_layout = "hf",
    .keys = {
        .n_experts = K("n_routed_experts"),
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
    /* transformers' DeepseekV3Config defaults */
    .def = {.rope_theta = 10000.0, .n_shared = 1, .first_k_dense = 3, .qk_norm = false, .attn_bias = false,
            .rotary_factor = 1.0, .q_lora_rank = 1536},
    .rope_pairs = NX_ROPE_INTERLEAVED,
    .attention = NX_ATTN_MLA,
    .router = NX_ROUTER_SIGMOID_BIAS,
    .mtp = {.hidden_first = false, .recycle_prenorm = true, .zero_pos0 = true, .own_embed_head = true},
    .names = {
        .router = K("mlp.gate"),
        .expert_bias = K("mlp.gate.e_score_correction_bias", "mlp.e_score_correction_bias"),
        .shared = K("mlp.shared_experts."),
        .mtp_norm = K("shared_head.norm"),
        .mlx_renames = K(NULL),
        .mlx_router = "mlp.gate",
        .mtp_out_head = NULL,
        .mtp_out_block = NULL,
        .router_bits = 0,
    },
};
