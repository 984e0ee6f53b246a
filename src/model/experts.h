/* Routed experts streamed from disk (docs/design.md, "Bigger than memory"): the residency plan
 * that decides how many experts fit in a memory cap, and the expert cache that holds them. A
 * cache slot holds one expert's stored bytes (weights, scales, biases of gate, up and down), read
 * with pread by a few I/O threads from the files the store maps; its nx_ffn points into the slot.
 * The kernels then read the same bytes they would read from the mapping, so results are the same
 * bits whether an expert streams or not. Slots are replaced by CLOCK (second chance, an
 * approximation of least recently used); an expert in use by a forward is pinned. */
#ifndef NX_MODEL_EXPERTS_H
#define NX_MODEL_EXPERTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "io/safetensors.h"
#include "io/weights.h"

/* Routed experts per layer the cache handles at most (the largest released models have 512). */
#define NX_XCACHE_MAX_EXPERTS 1024

/* Experts of different stored sizes (a 4-bit trunk, an 8-bit MTP layer) get slots of their own
 * size: one pool of slots per size. */
#define NX_XCACHE_POOLS 4

typedef struct nx_xplan {
    uint64_t resident;   /* bytes of every tensor but the routed experts */
    uint64_t routed;     /* bytes of the routed experts, trunk and MTP layers */
    int64_t n_routed;    /* routed experts, trunk and MTP layers */
    int n_pools;
    size_t slot_bytes[NX_XCACHE_POOLS]; /* a pool's slot: its experts' regions, each in whole 4 KB blocks */
    int64_t pool_experts[NX_XCACHE_POOLS];
    int64_t pool_slots[NX_XCACHE_POOLS];
    int64_t slots;       /* all pools'; 0: no cap or everything fits, nothing streams */
    bool from_stats;     /* the expectations below use router statistics */
    uint64_t cache_bytes;
    /* Expected share of a trunk token's expert lookups found in memory: without statistics,
     * routing taken as uniform (slots / n_routed); with them, per MoE layer the share of its
     * choices its most often routed experts take, as many as its part of the pool's slots,
     * averaged over the layers (tokens taken as independent: consecutive tokens sharing experts
     * and pre-gated reads raise the hit rate measured). */
    double hit_rate;
    double disk_per_token; /* expected bytes a trunk token reads from disk */
} nx_xplan;

/* Router statistics for the plan: counts[slot][expert] of layer slot (trunk layers, the MTP
 * layer at n_layers); NULL, or a NULL row, when there are none. */
typedef const uint64_t *const *nx_xcounts;

/* The plan for a cap of max_memory bytes (0: none) on a model whose tensors take tensor_bytes.
 * NX_E_ARG naming the figures when the resident part and one layer's top-k experts do not fit,
 * NX_E_UNSUPPORTED for a layer of more than NX_XCACHE_MAX_EXPERTS experts that would stream. */
nx_status nx_xplan_make(const nx_weights *w, const nx_config *cfg, uint64_t tensor_bytes, uint64_t max_memory,
                        nx_xcounts counts, nx_xplan *plan, nx_error *err);

typedef struct nx_xcache nx_xcache;

/* What the cache did for one forward: lookups found in memory (or already being read ahead),
 * lookups that read on demand, reads ahead issued and used, bytes read (on demand and ahead),
 * seconds waiting for reads. */
typedef struct nx_xstats {
    int64_t hits, misses;
    int64_t ahead, ahead_used; /* experts read ahead (pre-gating), and those a forward then used */
    double bytes, wait_s;
} nx_xstats;

/* A cache of plan->pool_slots slots for the routed experts of w (layers 0..n_layers-1, the MTP layer
 * as n_layers), read from st's files. Memory and I/O threads are set up at first use. NULL when
 * out of memory. */
nx_xcache *nx_xcache_new(const nx_store *st, const nx_weights *w, const nx_xplan *plan);
void nx_xcache_free(nx_xcache *xc);

/* Whether mapped bytes [p, p + n) overlap a routed expert's (what is not prefaulted when
 * experts stream); false for a NULL cache. */
bool nx_xcache_covers(const nx_xcache *xc, const void *p, size_t n);

/* Pins experts ids[0..n) (ascending, distinct) of layer `layer`, issuing reads for those not in
 * the cache, and returns how many of the first ones it pinned (fewer when the other slots are
 * pinned; at least 1 unless n is 0, waiting for a release if it must). out[i] is the expert to
 * compute with once nx_xcache_wait returns. */
int32_t nx_xcache_pin(nx_xcache *xc, int32_t layer, const int32_t *ids, int32_t n, const nx_ffn **out,
                      nx_xstats *s);
/* Waits until the pinned experts ids[0..n) are read (a failed read leaves out[i] on the mapping). */
void nx_xcache_wait(nx_xcache *xc, int32_t layer, const int32_t *ids, int32_t n, const nx_ffn **out, nx_xstats *s);
void nx_xcache_unpin(nx_xcache *xc, int32_t layer, const int32_t *ids, int32_t n);
/* Reads ahead experts ids[0..n) of layer `layer` that are not in the cache, into slots nobody
 * pinned (the least recently used first); no wait. */
void nx_xcache_prefetch(nx_xcache *xc, int32_t layer, const int32_t *ids, int32_t n, nx_xstats *s);

#endif
