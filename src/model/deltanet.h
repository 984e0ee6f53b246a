/* Gated DeltaNet layers (Qwen3.5 / Qwen3-Next; docs/design.md §12.4): the forward over T rows and
 * the recurrent state's bookkeeping in a context — begin / end of a trunk forward, truncation
 * back to a row of the last forward, reset. */
#ifndef NX_MODEL_DELTANET_H
#define NX_MODEL_DELTANET_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model_internal.h"

/* Before a trunk forward of T rows of context c: which of them stay recoverable (the last
 * NX_DN_REWIND; none of a single row, which plain decoding never takes back: its states are
 * updated in place, read and written once — unless a checkpoint of the state before it is
 * asked for, nx_ctx_keep_state_at). */
void nx_dn_begin(nx_ctx *c, int32_t T);

/* The layer over the rows of the segments (docs/design.md §15) in the scratch context s, s->xn
 * (T, H) → s->y (T, H): the projections over all rows at once, the convolution and the rule of
 * each segment over its own context's state, advancing it by the segment's rows (nx_dn_begin on
 * each segment's context first). */
void nx_dn_forward(nx_ctx *s, const nx_layer *L, const nx_seg *seg, int n_seg);

/* After a trunk forward of T rows at pos0: the new state becomes current. */
void nx_dn_end(nx_ctx *c, int32_t pos0, int32_t T);

/* Whether the states can be taken back to row n: n ≥ the oldest row of the last forward that
 * stays recoverable, or a checkpoint's row. */
bool nx_dn_can_rewind(const nx_ctx *c, int32_t n);

/* The largest row ≤ n the states can be taken back to (0 when none). */
int32_t nx_dn_rewind_floor(const nx_ctx *c, int32_t n);

/* Takes the states back from row n_past to row n (nx_dn_can_rewind must hold). */
void nx_dn_rewind(nx_ctx *c, int32_t n);

/* Floats of every DeltaNet layer's state and convolution window (what a saved context carries). */
int64_t nx_dn_saved_floats(const nx_model *m);

/* The rows a saved context of (at most) n rows can hold: n_past when n ≥ n_past, else the row of
 * the last checkpoint at or below n, else n_past (all rows: the states exist only there). */
int32_t nx_dn_savable(const nx_ctx *c, int32_t n);

/* The states after row n (nx_dn_savable's) into dst (nx_dn_saved_floats), layer by layer: state,
 * then window. */
void nx_dn_save(const nx_ctx *c, int32_t n, float *dst);

/* States saved by nx_dn_save become the current ones, at row n (the context's n_past). */
void nx_dn_load(nx_ctx *c, const float *src, int32_t n);

/* Zero states (an empty sequence), no checkpoints. */
void nx_dn_reset(nx_ctx *c);

/* Checkpoints (model_internal.h, nx_dn_ckpt): a context keeps up to dn_max_ckpts, made when a
 * forward passes the row nx_ctx_keep_state_at names, by nx_dn_checkpoint and by nx_dn_ckpt_put;
 * when all are in use a new one takes the lowest row's place. A truncation forgets those above
 * its row. Their memory is allocated at first use. */
/* A checkpoint of the current states, at row n_past. */
void nx_dn_checkpoint(nx_ctx *c);
/* A checkpoint at row n (0 < n ≤ n_past) from states saved by nx_dn_save. */
void nx_dn_ckpt_put(nx_ctx *c, int32_t n, const float *src);
/* Keeps at most max checkpoints from now on (dropping the ones it has). */
void nx_dn_ckpts_limit(nx_ctx *c, int max);
void nx_dn_ckpts_free(nx_ctx *c);

#endif
