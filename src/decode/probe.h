/* The teacher-forced acceptance ceiling (docs/design.md §9): run the trunk over real text once, feed
 * the MTP every (hidden h_p, token t[p+1]) pair with its full context, as the live loop's
 * persistent cache would, and measure how often its prediction would be accepted. */
#ifndef NX_DECODE_PROBE_H
#define NX_DECODE_PROBE_H

#include "nextn.h"

typedef struct nx_probe_result {
    int32_t k;                        /* chain depth probed */
    int64_t n_tokens;
    int64_t n[NX_MAX_DRAFT];          /* predictions scored per chain position */
    int64_t hit_text[NX_MAX_DRAFT];   /* draft argmax == the text's token */
    int64_t hit_trunk[NX_MAX_DRAFT];  /* draft argmax == the trunk's argmax (greedy acceptance) */
    double overlap[NX_MAX_DRAFT];     /* Σ_positions Σ_x min(p, q) under the sampler settings */
    bool sampled;                     /* overlap computed (temperature > 0) */
} nx_probe_result;

/* Probes ids in windows of at most `window` tokens (each window a fresh context), chaining up to
 * k drafts per position with the true text tokens (teacher forcing). Results accumulate into
 * *res (zero it first). sp gives the temperature/top-k/top-p/min-p for Σ min(p, q); NULL or a
 * greedy sampler skips it. */
nx_status nx_probe_tokens(nx_model *m, const int32_t *ids, size_t n, int32_t k, int32_t window,
                          const nx_sampler_params *sp, nx_probe_result *res, nx_error *err);

/* Per-position greedy outcomes at chain position 1: hits[p] = 1 when the head's argmax at row
 * p (trunk hidden p, token p+1) equals the trunk's argmax at row p + 1; hits has n entries
 * (the last two are 0). Same windows as nx_probe_tokens. */
nx_status nx_probe_hits(nx_model *m, const int32_t *ids, size_t n, int32_t window, uint8_t *hits,
                        nx_error *err);

#endif
