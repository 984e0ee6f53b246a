/* State histories and mask caches of the grammar processors; see proc_util.h. */
#include "constrain/proc_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *slot(const nx_state_hist *h, size_t k) { return h->ring + (k % NX_HIST_RING) * h->size; }

bool nx_hist_init(nx_state_hist *h, const void *g, size_t size, nx_hist_init_fn init, nx_hist_step_fn step) {
    memset(h, 0, sizeof *h);
    h->g = g, h->size = size, h->init = init, h->step = step;
    h->cap = 256;
    h->ring = calloc(NX_HIST_RING, size);
    h->toks = malloc(h->cap * sizeof *h->toks);
    if (!h->ring || !h->toks) return false;
    init(g, h->ring);
    return true;
}

void nx_hist_free(nx_state_hist *h) {
    free(h->ring);
    free(h->toks);
    memset(h, 0, sizeof *h);
}

void *nx_hist_state(const nx_state_hist *h) { return slot(h, h->n); }

void nx_hist_advance(nx_state_hist *h, int32_t id) {
    if (h->n == h->cap) {
        if (h->cap > SIZE_MAX / 2 / sizeof *h->toks) return;
        int32_t *t = realloc(h->toks, 2 * h->cap * sizeof *t);
        if (!t) return;
        h->toks = t, h->cap *= 2;
    }
    memcpy(slot(h, h->n + 1), slot(h, h->n), h->size);
    h->step(h->g, slot(h, h->n + 1), id);
    h->toks[h->n++] = id;
    if (h->n >= NX_HIST_RING && h->lo < h->n - (NX_HIST_RING - 1)) h->lo = h->n - (NX_HIST_RING - 1);
}

void nx_hist_rewind(nx_state_hist *h, size_t n) {
    if (n >= h->n) return;
    if (n >= h->lo) {
        h->n = n;
        return;
    }
    /* past the ring: replay from the start (the tokens stay in toks) */
    const size_t keep = n;
    h->n = h->lo = 0;
    memset(slot(h, 0), 0, h->size);
    h->init(h->g, slot(h, 0));
    for (size_t i = 0; i < keep; i++) {
        memcpy(slot(h, i + 1), slot(h, i), h->size);
        h->step(h->g, slot(h, i + 1), h->toks[i]);
    }
    h->n = keep;
    h->lo = keep >= NX_HIST_RING ? keep - (NX_HIST_RING - 1) : 0;
}

bool nx_mask_cache_init(nx_mask_cache *mc, size_t key_size, int32_t vocab) {
    memset(mc, 0, sizeof *mc);
    mc->key_size = key_size, mc->vocab = vocab;
    return (mc->spare = malloc((size_t)vocab)) != NULL;
}

void nx_mask_cache_free(nx_mask_cache *mc) {
    for (int i = 0; i < NX_MASK_CACHE; i++) free(mc->e[i].key), free(mc->e[i].allow);
    free(mc->spare);
    memset(mc, 0, sizeof *mc);
}

const uint8_t *nx_mask_cache_get(nx_mask_cache *mc, const void *g, const void *state, nx_mask_fill_fn fill) {
    int lru = 0;
    for (int i = 0; i < NX_MASK_CACHE; i++) {
        if (mc->e[i].allow && memcmp(mc->e[i].key, state, mc->key_size) == 0) {
            mc->e[i].used = ++mc->clock;
            return mc->e[i].allow;
        }
        if (mc->e[i].used < mc->e[lru].used) lru = i;
    }
    if (!mc->e[lru].key) mc->e[lru].key = malloc(mc->key_size);
    if (mc->e[lru].key && !mc->e[lru].allow) mc->e[lru].allow = malloc((size_t)mc->vocab);
    if (!mc->e[lru].key || !mc->e[lru].allow) {
        fill(g, state, mc->vocab, mc->spare);
        return mc->spare;
    }
    fill(g, state, mc->vocab, mc->e[lru].allow);
    memcpy(mc->e[lru].key, state, mc->key_size);
    mc->e[lru].used = ++mc->clock;
    return mc->e[lru].allow;
}

void nx_mask_apply(const uint8_t *allow, float *logits, int32_t n_vocab) {
    for (int32_t i = 0; i < n_vocab; i++)
        if (!allow[i]) logits[i] = -INFINITY;
}
