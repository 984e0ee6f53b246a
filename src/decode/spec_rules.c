/* The accept/reject rules of speculative verification (see spec_rules.h). They are what makes the
 * MTP loop lossless: whatever the draft proposes, each emitted token is distributed as the
 * target's processed distribution p. */
#include "decode/spec_rules.h"

static double spec_residual_mass(float p, float q) {
    double r = (double)p - (double)q;
    return r > 0.0 ? r : 0.0;
}

int32_t nx_spec_residual(const float *p, const float *q, int32_t d, double u_accept, nx_sampler *s,
                         bool *accepted) {
    const int32_t V = nx_sampler_vocab_size(s);
    bool ok = false;
    if (d >= 0 && d < V) {
        /* u < p/q without the division; q[d] == 0 cannot come from a draw of q, but if it does,
         * the ratio is +inf (accept) when p[d] > 0 and 0/0 (reject) otherwise. */
        if (q[d] > 0.0f) ok = u_accept * (double)q[d] < (double)p[d];
        else ok = p[d] > 0.0f;
    }
    if (accepted) *accepted = ok;
    if (ok) return d;

    /* Inverse CDF of max(0, p - q) without materialising it: one pass for the mass, one to walk.
     * One uniform is consumed whichever branch is taken, so the RNG stream does not depend on
     * whether the residual was empty. */
    double total = 0.0;
    for (int32_t i = 0; i < V; i++) total += spec_residual_mass(p[i], q[i]);
    double u = nx_sampler_uniform(s);
    if (!(total > 0.0)) {
        /* p <= q everywhere yet d was rejected: only possible when p == q up to rounding, where
         * the residual is undefined and p itself is the right law. */
        double tp = 0.0;
        for (int32_t i = 0; i < V; i++)
            if (p[i] > 0.0f) tp += p[i];
        double target = u * tp, cum = 0.0;
        int32_t last = 0;
        for (int32_t i = 0; i < V; i++) {
            if (p[i] > 0.0f) {
                cum += p[i];
                last = i;
                if (cum > target) return i;
            }
        }
        return last;
    }
    double target = u * total, cum = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < V; i++) {
        double r = spec_residual_mass(p[i], q[i]);
        if (r > 0.0) {
            cum += r;
            last = i;
            if (cum > target) return i;
        }
    }
    return last;
}

int32_t nx_spec_match(const float *p, int32_t d, nx_sampler *s, uint64_t index, bool *accepted) {
    int32_t y = nx_sampler_draw_at(s, p, index);
    if (accepted) *accepted = y == d;
    return y;
}

double nx_spec_overlap(const float *p, const float *q, int32_t V) {
    double acc = 0.0;
    for (int32_t i = 0; i < V; i++) acc += p[i] < q[i] ? (double)p[i] : (double)q[i];
    return acc;
}

double nx_spec_match_rate(const float *p, const float *q, int32_t V) {
    double acc = 0.0;
    for (int32_t i = 0; i < V; i++) acc += (double)p[i] * (double)q[i];
    return acc;
}

double nx_spec_coupled_rate(const float *p, const float *q, int32_t V) {
    /* token v wins both races iff every other w finishes later in both: given E_v = x, with
     * probability exp(-x·Σ_{w≠v} max(p_w/p_v, q_w/q_v)); integrating over x ~ Exp(1) gives
     * 1 / Σ_w max(p_w/p_v, q_w/q_v) */
    double acc = 0.0;
    for (int32_t v = 0; v < V; v++) {
        if (!(p[v] > 0.0f) || !(q[v] > 0.0f)) continue;
        double sum = 0.0;
        for (int32_t w = 0; w < V; w++) {
            const double a = p[w] > 0.0f ? (double)p[w] / p[v] : 0.0, b = q[w] > 0.0f ? (double)q[w] / q[v] : 0.0;
            sum += a > b ? a : b;
        }
        acc += 1.0 / sum;
    }
    return acc;
}
