/* Speculative verification primitives (docs/design.md §6.2): pure functions over dense distributions of the
 * sampler's vocabulary size. p is the target's processed distribution at a row, q the draft's,
 * both from nx_sampler_probs under the same settings and token history. Random draws come from
 * the sampler's RNG so a seeded run replays exactly. */
#ifndef NX_DECODE_SPEC_RULES_H
#define NX_DECODE_SPEC_RULES_H

#include "nextn.h"

/* The vocabulary size the sampler was created with (0 for NULL); defined in sampler.c. */
int32_t nx_sampler_vocab_size(const nx_sampler *s);

/* Residual rule (Leviathan et al. / Chen et al.). Accepts draft d (drawn from q) with probability
 * min(1, p[d] / q[d]), decided by u_accept in [0, 1) — passed in so that a caller can draw the k
 * accept tests of a cycle up front. Returns d when accepted; otherwise a token drawn with s's RNG
 * from normalize(max(0, p - q)), or from p if that residual has no mass (p == q). The output is
 * distributed exactly as p. An out-of-range d is rejected. */
int32_t nx_spec_residual(const float *p, const float *q, int32_t d, double u_accept, nx_sampler *s,
                         bool *accepted);

/* Match rule: draws y ~ p with the noise the seed assigns to output position `index`
 * (nx_sampler_draw_at); accepted iff y == d. Returns y. Exact for any q, and y is the token plain
 * decoding draws at that position: with the same seed the output does not depend on the drafts. */
int32_t nx_spec_match(const float *p, int32_t d, nx_sampler *s, uint64_t index, bool *accepted);

/* Expected acceptance of the residual rule, sum_i min(p_i, q_i). */
double nx_spec_overlap(const float *p, const float *q, int32_t V);
/* Expected acceptance of the match rule, sum_i p_i q_i. */
double nx_spec_match_rate(const float *p, const float *q, int32_t V);
/* Expected acceptance of the match rule when draft and target are drawn at the same index with
 * nx_sampler_draw_at (the same exponential race): sum_v 1 / sum_w max(p_w/p_v, q_w/q_v).
 * O(V^2): for tests and analysis. */
double nx_spec_coupled_rate(const float *p, const float *q, int32_t V);

#endif
