/* Checkpoint layouts → the engine's weight table. Maps the tensor names of the original
 * Tencent release (per-expert tensors, MTP at model.layers.N) and of MLX conversions (stacked
 * switch_mlp experts, affine-quantized modules, mtp.* names, model-mtp sidecars) onto one
 * nx_weights, checking every shape against the config on the way. */
#ifndef NX_IO_LAYOUT_H
#define NX_IO_LAYOUT_H

#include <stdbool.h>

#include "base/error.h"
#include "io/safetensors.h"
#include "io/weights.h"

/* Fills *w from the store. Matrices are views into the store's mappings (the store must
 * outlive *w); norms and expert biases become owned f32 arrays. With want_mtp, the MTP layer
 * is looked up under every known naming (docs/design.md §4.2); if the checkpoint has no MTP tensors
 * at all the load still succeeds with w->has_mtp = false (a headless checkpoint — the caller
 * may tell the user), whereas a partial MTP is an error. The MTP layer's expert count comes
 * from its own router tensor. Quantized modules (P.scales present) are cross-checked against
 * the config's bits/group_size; act16 marks every quantized weight x16 (kernels.h). Errors name the tensor and the expected vs actual shape. On
 * failure *w is left zeroed. */
nx_status nx_weights_load(const nx_store *st, const nx_config *cfg, bool want_mtp, bool act16, nx_weights *w,
                          nx_error *err);

/* Frees the owned arrays (not the mapped data); NULL-safe; leaves *w zeroed. */
void nx_weights_free(nx_weights *w);

#endif
