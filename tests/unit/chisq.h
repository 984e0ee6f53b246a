/* Statistics for the sampler tests: a test-local random source (independent of the library's
 * RNG) and the chi-square survival function via the regularized incomplete gamma function, so a
 * goodness-of-fit test yields a p-value without any tabulated constants. Header-only; each test
 * binary includes it once. */
#ifndef NX_TESTS_CHISQ_H
#define NX_TESTS_CHISQ_H

#include <math.h>
#include <stdint.h>

/* splitmix64: generates test inputs; deliberately not the library's generator. */
static inline uint64_t trng_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double trng_uniform(uint64_t *x) {
    return (double)(trng_next(x) >> 11) * 0x1.0p-53;
}

static inline int32_t trng_int(uint64_t *x, int32_t n) {
    return (int32_t)(trng_next(x) % (uint64_t)n);
}

static inline double trng_normal(uint64_t *x) {
    double u1 = trng_uniform(x), u2 = trng_uniform(x);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Regularized lower gamma P(a, x) by its power series (converges fast for x < a + 1). */
static inline double gamma_p_series(double a, double x) {
    double ap = a, sum = 1.0 / a, del = sum;
    for (int n = 0; n < 10000; n++) {
        ap += 1.0;
        del *= x / ap;
        sum += del;
        if (fabs(del) < fabs(sum) * 1e-16) break;
    }
    return sum * exp(-x + a * log(x) - lgamma(a));
}

/* Regularized upper gamma Q(a, x) by its continued fraction (modified Lentz), for x >= a + 1. */
static inline double gamma_q_cf(double a, double x) {
    const double tiny = 1e-300;
    double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
    for (int i = 1; i < 10000; i++) {
        double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        if (fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1.0 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1.0) < 1e-16) break;
    }
    return exp(-x + a * log(x) - lgamma(a)) * h;
}

static inline double gamma_q(double a, double x) {
    if (x <= 0.0) return 1.0;
    return x < a + 1.0 ? 1.0 - gamma_p_series(a, x) : gamma_q_cf(a, x);
}

/* P(X >= chi2) for X ~ chi-square with df degrees of freedom. */
static inline double chisq_sf(double chi2, int df) {
    return gamma_q(0.5 * df, 0.5 * chi2);
}

/* Pearson goodness of fit of observed counts against probabilities p over n bins (n_total
 * samples). Bins with p == 0 must be empty (returns 0, a certain failure, otherwise); they carry
 * no degree of freedom. Returns the p-value. */
static inline double chisq_gof(const int64_t *obs, const double *p, int n, int64_t n_total) {
    double chi2 = 0.0;
    int df = -1;
    for (int i = 0; i < n; i++) {
        if (p[i] <= 0.0) {
            if (obs[i] != 0) return 0.0;
            continue;
        }
        double e = p[i] * (double)n_total;
        chi2 += ((double)obs[i] - e) * ((double)obs[i] - e) / e;
        df++;
    }
    if (df <= 0) return 1.0;
    return chisq_sf(chi2, df);
}

#endif
