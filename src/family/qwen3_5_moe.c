/* Qwen3.5 / Qwen3.6 MoE (qwen3_5_moe, Qwen3_5MoeForConditionalGeneration; docs/design.md §12.4,
 * checked against transformers' qwen3_5_moe, vLLM's qwen3_next.py + qwen3_5_mtp.py and mlx-lm's
 * qwen3_5_moe.py): a hybrid stack of Gated DeltaNet layers with a full-attention layer every
 * fourth (layer_types decides), gated attention with partial NeoX RoPE and qk-norm, zero-centred
 * (1 + w) RMSNorms, a softmax router whose top-k is always renormalised, and a shared expert
 * scaled by σ(shared_expert_gate·x). The released checkpoints are vision-language wrappers: the
 * LM's keys sit in text_config. MTP under mtp.*: fc over [embedding | hidden], fed back after
 * mtp.norm, the trunk's embedding and lm_head. */
#include "family/family.h"

#define K(...) ((const char *const[]){__VA_ARGS__, NULL})

const nx_family nx_family_qwen3_5_moe = {
    .model_type = "qwen3_5_moe",
    .architectures = K("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
    .summary = "Qwen3.5/3.6 MoE",
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
        .route_norm = K(NULL), /* Qwen3_5MoeTopKRouter renormalises without a switch */
        .n_group = K(NULL),
        .topk_group = K(NULL),
        .shared_dim = K("shared_expert_intermediate_size"),
        .attn_gate = K("attn_output_gate"),
        .n_nextn = K("mtp_num_hidden_layers"),
    },
    /* transformers' Qwen3_5MoeTextConfig defaults */
    .def = {.rope_theta = 10000000.0, .n_shared = 1, .first_k_dense = 0, .qk_norm = true, .attn_bias = false,
            .rotary_factor = 0.25, .attn_gate = true},
    .rope_pairs = NX_ROPE_NEOX,
    .attention = NX_ATTN_GQA,
    .router = NX_ROUTER_SOFTMAX,
    /* vLLM's qwen3_next_mtp: the embedding is kept at position 0, the normed output fed back */
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
        .router_bits = 8, /* mlx-lm's quant_predicate: the routers at 8 bits, group 64 */
    },
    .hybrid = {.on = true, .full_interval = 4, .norm_plus1 = true},
    .text_config = "text_config",
};
