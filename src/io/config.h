/* config.json of a checkpoint of any supported family → nx_config: every field the engine
 * uses, with the aliases different exporters write (Tencent, HF transformers, mlx-lm), the
 * variants the family's descriptor selects, and the MLX affine quantization block. Values are
 * validated here so the model code can trust them. */
#ifndef NX_IO_CONFIG_H
#define NX_IO_CONFIG_H

#include <stddef.h>

#include "base/error.h"
#include "io/weights.h"

/* Loads and validates `path`. On failure *cfg is left zeroed (nothing to free). An unknown
 * model_type or architectures entry (the message lists the supported families), hidden_act or
 * quantization mode is NX_E_UNSUPPORTED; a missing field, a wrong
 * JSON type or an impossible value is NX_E_CONFIG; both messages name the field. */
nx_status nx_config_load(const char *path, nx_config *cfg, nx_error *err);

/* Same, from a JSON text of len bytes (`name` labels messages; NULL = "config.json"). */
nx_status nx_config_parse(const char *json, size_t len, const char *name, nx_config *cfg,
                          nx_error *err);

/* Frees the quantization overrides; NULL-safe; leaves *cfg zeroed. */
void nx_config_free(nx_config *cfg);

/* Quantization parameters configured for module `path` (no ".weight" suffix): the per-path
 * override if there is one, else the global block. Returns false when the config has no
 * quantization block at all; *bits == 0 means "configured unquantized" (override `false`). */
bool nx_config_quant_for(const nx_config *cfg, const char *path, int *bits, int *group);

#endif
