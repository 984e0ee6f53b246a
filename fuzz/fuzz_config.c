/* libFuzzer target for config.json parsing (fields, aliases, quantization overrides). An
 * accepted config must satisfy the invariants the model code relies on. */
#include <stdint.h>
#include <stdlib.h>

#include "io/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nx_config cfg;
    nx_error err;
    if (nx_config_parse((const char *)data, size, "fuzz.json", &cfg, &err) != NX_OK) return 0;
    if (cfg.hidden_size <= 0 || cfg.n_heads <= 0 || cfg.n_kv_heads <= 0 || cfg.head_dim <= 0 ||
        cfg.n_heads % cfg.n_kv_heads != 0 || cfg.top_k > cfg.n_experts ||
        cfg.first_k_dense > cfg.n_layers || cfg.n_eos > NX_MAX_EOS || !(cfg.rms_eps > 0))
        abort();
    int bits, group;
    static const char *paths[] = {"lm_head", "model.embed_tokens", "model.layers.1.mlp.router.gate",
                                  "mtp.layer.mlp.router.gate"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++)
        if (nx_config_quant_for(&cfg, paths[i], &bits, &group) && bits != 0 &&
            !(bits >= 2 && bits <= 8 && (group == 32 || group == 64 || group == 128)))
            abort();
    nx_config_free(&cfg);
    return 0;
}
