/* The sampler's random source: xoshiro256** (Blackman & Vigna), seeded by expanding a 64-bit
 * seed through splitmix64 so that nearby seeds (0, 1, 2, ...) give unrelated streams. Small,
 * fast, and bit-identical on every platform, which seeded reproducibility depends on. */
#ifndef NX_DECODE_RNG_H
#define NX_DECODE_RNG_H

#include <stdint.h>

typedef struct nx_rng {
    uint64_t s[4];
} nx_rng;

void nx_rng_seed(nx_rng *r, uint64_t seed);
uint64_t nx_rng_next(nx_rng *r);
/* A uniform double in [0, 1) with 53 random bits. */
double nx_rng_uniform(nx_rng *r);
/* Counter-based draws, for randomness tied to an output position rather than to how many draws
 * came before: nx_rng_key(seed, index) names a stream, nx_rng_open_at(key, i) is its i-th
 * uniform in the open interval (0, 1), a function of (seed, index, i) alone (splitmix64's
 * finaliser over a counter). */
uint64_t nx_rng_key(uint64_t seed, uint64_t index);
double nx_rng_open_at(uint64_t key, uint64_t i);

#endif
