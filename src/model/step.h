/* What a decoder needs from a context, and no more: trunk forwards, the MTP head's cache (catch
 * up, chain a draft, commit, skip), telemetry through a sink the caller installs, and one opaque
 * block the decoder keeps with the context. src/decode/ includes this, never model_internal.h,
 * so the layout of nx_ctx can change without touching the decoder. */
#ifndef NX_MODEL_STEP_H
#define NX_MODEL_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nextn.h"

/* Traffic and time of one forward call (trunk or MTP), summed over its layers. */
typedef struct nx_traffic {
    double expert_bytes;     /* routed + shared expert weight bytes read */
    int64_t experts_touched; /* distinct routed experts, summed over layers */
    int64_t overlap;         /* shared top-k experts between consecutive rows, summed */
    int64_t overlap_pairs;
    /* streamed experts (nx_load_params.max_memory): lookups found in the expert cache (or
     * already being read ahead), lookups read on demand, bytes read from disk (on demand and
     * ahead), seconds the forward waited for reads */
    int64_t cache_hits, cache_misses;
    int64_t ahead_reads, ahead_used; /* experts read ahead by pre-gating, and those used */
    double disk_bytes, io_wait_s;
    /* wall seconds and weight bytes of each part of the forward (NX_PHASE_*) */
    double phase_s[NX_PHASES], phase_bytes[NX_PHASES];
    /* a split model (several ranks), on rank 0: bytes it sent and received, its messages, and the
     * seconds it waited on the other ranks (their compute and the network) */
    double net_bytes, net_s;
    int64_t net_msgs;
} nx_traffic;

/* Telemetry: called once at the end of every successful forward on the context (mtp: an MTP
 * forward, else a trunk one) with that forward's rows and traffic, valid during the call. */
typedef struct nx_fwd_sink {
    void (*forward)(void *user, bool mtp, int32_t rows, const nx_traffic *t);
    void *user;
} nx_fwd_sink;

/* Installs sink (copied; NULL removes it). */
void nx_ctx_set_sink(nx_ctx *c, const nx_fwd_sink *sink);

nx_model *nx_ctx_model(const nx_ctx *c);
/* Rows one forward call takes at most. */
int32_t nx_ctx_n_batch(const nx_ctx *c);
/* A hybrid model's recurrent states can go back only to the rows of the last forward call and to
 * its checkpoints; this asks the context to make a checkpoint of row n when a forward passes it
 * (the prompt's last row but one: what a later request with the same prompt, or a chat's next
 * turn, keeps), so a truncation to n, a shared prefix of n and a state file of n rows stay
 * possible. No-op for other models and for contexts that keep no checkpoints. */
void nx_ctx_keep_state_at(nx_ctx *c, int32_t n);
/* Prompt rows between the checkpoints a prefill makes (0: none but the caller's); -1 when the
 * context makes none at all (models without recurrent states, split models, no checkpoints). */
int32_t nx_ctx_checkpoint_every(const nx_ctx *c);
/* A checkpoint of the recurrent states at row n_past (no-op for other models). */
void nx_ctx_checkpoint(nx_ctx *c);

/* What taking recurrent states back (truncations replaying rows) has cost this context so far:
 * count, wall seconds, state bytes read and written (all 0 for other models). */
void nx_ctx_rewind_cost(const nx_ctx *c, int64_t *count, double *seconds, double *bytes);

/* How many of the first n tokens the trunk cache holds already (equal tokens from row 0; for a
 * hybrid model, at most as many as its recurrent states can go back to). */
int32_t nx_ctx_shared_prefix(const nx_ctx *c, const int32_t *tokens, int32_t n);
bool nx_model_has_mtp(const nx_model *m);

/* rows = T: runs the trunk over tokens at positions n_past..n_past+T-1 (T ≤ n_batch), appends
 * to the caches, stores the MTP-fed hidden by position, and computes logits for rows
 * [logits_from, T) into logits (row-major, (T - logits_from, V)); logits may be NULL. */
nx_status nx_forward_trunk(nx_ctx *c, const int32_t *tokens, int32_t T, float *logits,
                           int32_t logits_from, nx_error *err);

/* ---------------------------------------------------------------- the MTP head's cache */

/* Rows in the MTP cache. Row p pairs the trunk hidden at p with token p+1. */
int32_t nx_mtp_n_past(const nx_ctx *c);

/* Brings the MTP cache up to the trunk: rows p = mtp_past .. upto-1 pair the stored trunk
 * hidden at p with next_tokens[p - mtp_past] (= t[p+1]), at position p, in batches. With
 * all_logits, logits of every row go to logits[(p - first) * V]; otherwise only the last
 * row's logits go to logits[0]. logits may be NULL. */
nx_status nx_mtp_catch_up(nx_ctx *c, const int32_t *next_tokens, int32_t upto, float *logits,
                          bool all_logits, nx_error *err);

/* Chains one draft: a provisional row at the end of the cache that pairs the head's own output
 * hidden of its last row with token (the draft just drawn); its logits go to logits (V floats).
 * The head must have run since the cache last changed (a catch-up or a draft). */
nx_status nx_mtp_draft_next(nx_ctx *c, int32_t token, float *logits, nx_error *err);

/* Keeps rows [0, n) of the MTP cache and drops the rest (the provisional chain rows). */
void nx_mtp_commit(nx_ctx *c, int32_t n);

/* Skips rows: the cache is taken to hold `first` rows and attention starts at row `first`, so
 * a catch-up feeds only the rows from there (after a long stretch without drafting, re-feeding
 * every row would cost more than drafts win back). Rows already held past `first` are dropped. */
void nx_mtp_skip_to(nx_ctx *c, int32_t first);

/* Empties the MTP cache (attention from row 0 again). */
void nx_mtp_reset(nx_ctx *c);

/* The row the head's attention starts at (0 unless nx_mtp_skip_to moved it). */
int32_t nx_mtp_first(const nx_ctx *c);

/* ---------------------------------------------------------------- the decoder's slot */

/* A zeroed block of `size` bytes kept with the context across generations for the decoder's
 * own state (--draft auto's measurements), allocated on first use (or when size changes) and
 * zeroed again by nx_ctx_reset_auto; NULL when out of memory. The model never reads it. */
void *nx_ctx_decoder_slot(nx_ctx *c, size_t size);

#endif
