/* Building blocks of the forward pass, exposed for the MTP head and for unit tests
 * (router vs brute force). RMSNorm is a kernel (nx_rmsnorm_f32). */
#ifndef NX_MODEL_FORWARD_H
#define NX_MODEL_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model_internal.h"

/* Groups the router's group limit handles at most (config.c checks n_group against it). */
#define NX_MAX_GROUPS 64

/* Sigmoid routing of one row: top-k of sigmoid(logits) + bias (ties → lower id) among the
 * experts of the topk_group groups (of n_group equal ones) whose two best biased scores sum
 * highest, weights from the unbiased sigmoid, renormalised when renorm (and k > 1), times
 * scaling. idx/w are [k], ordered by descending biased score. */
void nx_moe_route_grouped(const float *logits, const float *bias, int32_t E, int32_t k, int32_t n_group,
                          int32_t topk_group, bool renorm, float scaling, int32_t *idx, float *w);
/* The same without a group limit (n_group = 1). */
void nx_moe_route(const float *logits, const float *bias, int32_t E, int32_t k, bool renorm,
                  float scaling, int32_t *idx, float *w);

/* Softmax routing of one row (Qwen): softmax over the E logits in f32, the top-k (ties → lower
 * id) with their probabilities, renormalised to sum 1 when renorm. idx/w are [k], by descending
 * logit. */
void nx_moe_route_softmax(const float *logits, int32_t E, int32_t k, bool renorm, int32_t *idx, float *w);

/* One pre-norm decoder layer over c->x (T, H) in place, T the segments' rows: each segment's
 * rows at its positions, appending to its context's cache of the layer (layer_slot: trunk
 * layers 0..n-1, the MTP layer n, which also indexes the routing memory). window > 0 limits
 * attention to the last `window` positions. */
void nx_layer_forward(nx_ctx *c, const nx_layer *L, const nx_seg *seg, int n_seg, int32_t window, double theta,
                      int32_t layer_slot);

#endif
