/* Hunyuan 3 (hy_v3, HYV3ForCausalLM; docs/design.md): q/k-norm, full NeoX RoPE, no attention biases,
 * sigmoid router with a selection bias, one shared expert, the first layer dense; its MTP head
 * feeds back the output after final_layernorm and uses the trunk's embedding and lm_head.
 * Exporters disagree on key names (Tencent, HF transformers, mlx-lm): every alias is listed. */
#include "family/family.h"

#define K(...) ((const char *const[]){__VA_ARGS__, NULL})

const nx_family nx_family_hy_v3 = {
    .model_type = "hy_v3",
    .architectures = K("HYV3ForCausalLM"),
    .summary = "Hunyuan 3",
    .hf_layout = "tencent",
    .keys = {
        .n_experts = K("num_experts", "num_local_experts"),
        .expert_dim = K("expert_hidden_dim", "moe_intermediate_size"),
        .n_shared = K("num_shared_experts"),
        .first_k_dense = K("first_k_dense_replace"),
        .qk_norm = K("qk_norm"),
        .attn_bias = K("attention_bias"),
        .rotary_factor = K("partial_rotary_factor"),
        .scaling = K("router_scaling_factor", "routed_scaling_factor"),
        .route_norm = K("route_norm", "norm_topk_prob"),
        .n_group = K("n_group"),
        .topk_group = K("topk_group"),
    },
    .def = {.rope_theta = 11158840.0, /* the Hy3 default of HF and vLLM */
            .n_shared = 1, .first_k_dense = 1, .qk_norm = true, .attn_bias = false,
            .rotary_factor = 1.0},
    .rope_pairs = NX_ROPE_NEOX,
    .router = NX_ROUTER_SIGMOID_BIAS,
    .mtp = {.hidden_first = false, .recycle_prenorm = false, .zero_pos0 = false, .own_embed_head = false},
    .names = {
        .router = K("mlp.router.gate", "mlp.gate"),
        .expert_bias = K("mlp.expert_bias", "mlp.router.expert_bias", "mlp.gate.e_score_correction_bias",
                         "mlp.e_score_correction_bias"),
        .shared = K("mlp.shared_experts.", "mlp.shared_mlp."),
        .mtp_norm = K("final_layernorm"),
        /* mlx-lm's hy_v3 sanitize: router under mlp.router, shared expert as shared_mlp */
        .mlx_renames = K("mlp.expert_bias", "mlp.router.expert_bias",
                         "mlp.gate.e_score_correction_bias", "mlp.router.expert_bias",
                         "mlp.e_score_correction_bias", "mlp.router.expert_bias",
                         "mlp.gate.", "mlp.router.gate.",
                         "mlp.shared_experts.", "mlp.shared_mlp."),
        .mlx_router = "mlp.router.gate",
        .mtp_out_head = "mtp.", /* as mlx-lm's hy_v3 names the head */
        .mtp_out_block = "mtp.layer.",
        .router_bits = 8, /* mlx-lm's hy_v3 recipe: small, and it decides which experts run */
    },
};
