/* A model run by several ranks (docs/multinode.md): the hooks the forward pass and the context
 * operations call when the model has a dist (m->dist), and the worker ranks' command loop.
 *
 * Rank 0 makes every context operation as a single process does; each is sent to the other ranks
 * (small ones — truncations, MTP commits — queued and sent with the next forward), which make the
 * same call on their copy of the context, so every rank's caches, positions and counters stay
 * those of rank 0. What a rank computes of a forward is its share:
 *  - pipeline: trunk layers [layer_lo[r], layer_lo[r+1]); the rows' hidden states go from rank to
 *    rank; the last rank computes the final norm, lm_head and the MTP head and sends the logits
 *    to rank 0; the other ranks only count the MTP rows;
 *  - experts: the whole forward but, in each MoE layer, only the routed experts of its range; one
 *    all-gather then gives every rank every expert output, summed in the single process's order.
 * So every logit is the same bits as one process's. */
#ifndef NX_MODEL_SPLIT_H
#define NX_MODEL_SPLIT_H

#include "model/model_internal.h"

/* Computes the share of this rank (layer and expert ranges) and checks that every rank loaded
 * the same model; at the end of loading, on every rank (a collective). */
nx_status nx_split_setup(nx_model *m, nx_error *err);
/* Pipeline: rank r of R runs trunk layers [lo[r], lo[r + 1]) (lo has R + 1 entries): contiguous
 * ranges balanced by weight bytes, as every rank and `nextn shard` compute them. */
nx_status nx_split_plan(const nx_model *m, int R, int32_t *lo, nx_error *err);
/* Rank 0: tells the other ranks to return from nx_model_follow; frees the split state. */
void nx_split_end(nx_model *m);
/* Whether this rank computes the final norm, lm_head and MTP head. */
bool nx_split_has_head(const nx_model *m);
/* Routed experts [*e0, *e1) of E are this rank's (experts split; else all). */
void nx_split_experts_of(const nx_model *m, int rank, int32_t E, int32_t *e0, int32_t *e1);

/* ---------------------------------------------------------------- context hooks */

void nx_split_ctx_new(nx_ctx *c);
void nx_split_ctx_free(nx_ctx *c);
/* The small context operations, queued on rank 0 for the next message (a no-op elsewhere). */
enum { NX_SPLIT_TRUNCATE = 1, NX_SPLIT_MTP_COMMIT, NX_SPLIT_MTP_SKIP, NX_SPLIT_MTP_RESET, NX_SPLIT_KEEP_STATE };
void nx_split_op(nx_ctx *c, int op, int32_t n);

/* ---------------------------------------------------------------- forward hooks */

/* Trunk forward of T rows with logits of rows [logits_from, T) (logits_from = T: none): rank 0
 * sends the operation; sets the trunk layers this rank runs; a later pipeline stage receives the
 * rows' hidden states (c->x). */
nx_status nx_split_trunk_in(nx_ctx *c, const int32_t *tokens, int32_t T, int32_t logits_from, int32_t *l0,
                            int32_t *l1, nx_error *err);
/* After this rank's layers: a pipeline stage before the last sends c->x on. */
nx_status nx_split_trunk_pass(nx_ctx *c, int32_t T, nx_error *err);
/* rows rows of logits: the last pipeline stage sends them to rank 0, which receives them. */
nx_status nx_split_logits(nx_ctx *c, float *logits, int32_t rows, nx_error *err);
/* MTP forward of R rows at pos0 from hidden: rank 0 sends the operation. *here: this rank runs
 * it; else nx_split_mtp_elsewhere stands for it. */
nx_status nx_split_mtp_in(nx_ctx *c, const float *hidden, const int32_t *tokens, int32_t R, int32_t pos0,
                          int32_t logits_from, bool *here, nx_error *err);
/* A rank without the head: counts the rows; rank 0 receives the logits (if any) and checks them. */
nx_status nx_split_mtp_elsewhere(nx_ctx *c, int32_t R, float *logits, int32_t logits_from, nx_error *err);
/* The network counters of the forward that just ended into c->traffic (rank 0's sink reads them). */
void nx_split_traffic(nx_ctx *c);
/* Experts split: every rank's block of routed expert outputs (rows[q] rows of H floats at ye,
 * rank by rank) to every rank. Failures are kept: the forward's end reports them. */
void nx_split_exchange(nx_ctx *c, float *ye, const int32_t *rows);
/* The first failure of the run (NX_OK while none). */
nx_status nx_split_failed(const nx_ctx *c, nx_error *err);

#endif
