/* xoshiro256** with splitmix64 seeding (see rng.h). The constants are the published ones; any
 * change would silently change every seeded sample sequence. */
#include "decode/rng.h"

static uint64_t rng_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rng_rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

void nx_rng_seed(nx_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = rng_splitmix64(&x);
    /* splitmix64 is a bijection of a counter, so four consecutive outputs are never all zero
     * (the one state xoshiro cannot leave); nothing to patch up. */
}

uint64_t nx_rng_next(nx_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rng_rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rng_rotl(s[3], 45);
    return result;
}

static uint64_t rng_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t nx_rng_key(uint64_t seed, uint64_t index) {
    return rng_mix(rng_mix(seed + 0x9e3779b97f4a7c15ull) ^ (index * 0xd1b54a32d192ed03ull + 1));
}

double nx_rng_open_at(uint64_t key, uint64_t i) {
    return ((double)(rng_mix(key + 0x9e3779b97f4a7c15ull * (i + 1)) >> 11) + 0.5) * 0x1.0p-53;
}

double nx_rng_uniform(nx_rng *r) {
    return (double)(nx_rng_next(r) >> 11) * 0x1.0p-53;
}
