/* What the grammar processors share: a state history that rewinds exactly, and a cache of the
 * masks of recent states. */
#ifndef NX_CONSTRAIN_PROC_UTIL_H
#define NX_CONSTRAIN_PROC_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* States after each of the last NX_HIST_RING - 1 tokens kept whole, so the sampler's
 * advance-by-drafts, mask, rewind of every verify row costs a few state copies; a rewind further
 * back replays the tokens from the initial state. Either way the state is the one the tokens
 * give: the same bytes (states compare whole in the mask cache). */
#define NX_HIST_RING 18 /* 2 * (NX_MAX_DRAFT + 1) */

typedef void (*nx_hist_init_fn)(const void *g, void *state);
typedef void (*nx_hist_step_fn)(const void *g, void *state, int32_t id);

typedef struct nx_state_hist {
    const void *g; /* the grammar, passed to init and step */
    nx_hist_init_fn init;
    nx_hist_step_fn step;
    size_t size;   /* bytes of one state */
    uint8_t *ring; /* [NX_HIST_RING] the state after k tokens at slot k % NX_HIST_RING */
    size_t n;      /* tokens advanced */
    size_t lo;     /* the fewest tokens whose state the ring still holds (advancing past
                      n + NX_HIST_RING - 1 overwrites states, also while drafts are tried) */
    int32_t *toks; /* [cap] every token advanced, for a replay */
    size_t cap;
} nx_state_hist;

/* false when out of memory. The history starts at the initial state. */
bool nx_hist_init(nx_state_hist *h, const void *g, size_t size, nx_hist_init_fn init, nx_hist_step_fn step);
void nx_hist_free(nx_state_hist *h);
/* The state after the tokens advanced. */
void *nx_hist_state(const nx_state_hist *h);
/* One more token (dropped when the history cannot grow, as the sampler drops it). */
void nx_hist_advance(nx_state_hist *h, int32_t id);
/* Back to the state after the first n tokens (no-op for n >= the tokens advanced). */
void nx_hist_rewind(nx_state_hist *h, size_t n);

/* Masks of recent states: inside a string, or at the same place in a structure, the state
 * repeats from token to token. Keys are whole states (key_size bytes). */
#define NX_MASK_CACHE 8
typedef void (*nx_mask_fill_fn)(const void *g, const void *state, int32_t vocab, uint8_t *allow);
typedef struct nx_mask_cache {
    size_t key_size;
    int32_t vocab;
    struct {
        void *key;
        uint8_t *allow; /* [vocab], NULL while unused */
        uint64_t used;
    } e[NX_MASK_CACHE];
    uint64_t clock;
    uint8_t *spare; /* [vocab] the mask when no slot can be allocated */
} nx_mask_cache;

bool nx_mask_cache_init(nx_mask_cache *mc, size_t key_size, int32_t vocab);
void nx_mask_cache_free(nx_mask_cache *mc);
/* allow[i] = 1 for the tokens that may follow state: a cached mask, or one fill computes into
 * the least recently used slot. */
const uint8_t *nx_mask_cache_get(nx_mask_cache *mc, const void *g, const void *state, nx_mask_fill_fn fill);
/* logits[i] = -inf where allow[i] is 0. */
void nx_mask_apply(const uint8_t *allow, float *logits, int32_t n_vocab);

#endif
