/* Router statistics (docs/design.md §14): how often each routed expert was chosen, per MoE layer
 * (trunk layers, the MTP layer at n_layers). Counted on every forward, read from and saved to a
 * JSON file, and used by the residency plan to keep the most often routed experts resident. */
#ifndef NX_MODEL_ROUTE_STATS_H
#define NX_MODEL_ROUTE_STATS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "io/weights.h"

typedef struct nx_route_stats {
    int32_t n_slots;     /* trunk layers + the MTP layer */
    int32_t *n_experts;  /* [slot] routed experts (0: dense, or no MTP layer) */
    uint64_t **prior;    /* [slot][expert] counts read from the file; NULL rows without one */
    uint64_t **live;     /* [slot][expert] choices counted since load (relaxed atomic adds) */
    bool has_prior;
} nx_route_stats;

/* Counters for w's MoE layers; with path, the file's counts as the prior (a missing file is no
 * prior; a file that is not router statistics of this model's shape is an error naming the file
 * and the field at fault). */
nx_status nx_route_stats_init(nx_route_stats *rs, const nx_weights *w, const char *model_type, const char *path,
                              nx_error *err);
void nx_route_stats_free(nx_route_stats *rs);

/* Counts the n expert ids of layer slot (thread-safe). */
void nx_route_tally(nx_route_stats *rs, int32_t slot, const int32_t *ids, int64_t n);

/* Writes prior + live counts to path (a temporary file renamed into place). */
nx_status nx_route_stats_save(const nx_route_stats *rs, const char *model_type, const char *path, nx_error *err);

#endif
