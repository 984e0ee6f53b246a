/* The int8 dot-product instruction rate of one core: how many 512-bit vpdpbusd (64 multiply-adds
 * each) it retires per second over 16 independent chains (12 read ~20% lower on the Zen 5 VM, its
 * latency showing), the ceiling of every int8 quantized kernel (avx512_vnni.c). A 4-bit weight
 * row of groups of 64 needs one vpdpbusd per 64 elements and input row, for 36 bytes (32 packed,
 * a bf16 scale and bias), so one core cannot consume more
 * than rate x 36 / T bytes per second at T input rows, cache or no cache: a 2-row verify call
 * needs twice the instructions of a 1-row step, which is what bounds its cost once a step
 * reads near that rate. Prints `vnni_rate` key=value lines (`make bench`).
 *   vnni_rate [--ms 300] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"

#define CHAINS 16

#if defined(__x86_64__)
#include <immintrin.h>

/* Rounds of CHAINS independent vpdpbusd; returns the seconds taken. */
__attribute__((target("avx512f,avx512vnni"), noinline)) static double dpbusd_rounds(long rounds, int *sink) {
    __m512i a[CHAINS];
    const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_epi32(i);
    const double t0 = nx_now_s();
    for (long r = 0; r < rounds; r++) {
#pragma GCC unroll 16
        for (int k = 0; k < CHAINS; k++) {
            a[k] = _mm512_dpbusd_epi32(a[k], w, x);
            __asm__("" : "+v"(a[k])); /* each chain stays a chain */
        }
    }
    const double dt = nx_now_s() - t0;
    __m512i s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_epi32(s, a[i]);
    *sink = _mm512_reduce_add_epi32(s);
    return dt;
}

static int has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
}
#else
static double dpbusd_rounds(long rounds, int *sink) {
    (void)rounds;
    *sink = 0;
    return 0;
}
static int has_vnni(void) { return 0; }
#endif

int main(int argc, char **argv) {
    double budget_ms = 300;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ms") && i + 1 < argc) {
            budget_ms = atof(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--ms budget]\n", argv[0]);
            return 2;
        }
    }
    if (budget_ms <= 0) budget_ms = 300;
    if (!has_vnni()) {
        printf("vnni_rate: this CPU has no AVX-512 VNNI (the int8 kernels are not used here)\n");
        return 0;
    }
    int sink = 0;
    long rounds = 1 << 20;
    while (dpbusd_rounds(rounds, &sink) < 0.02) rounds *= 2; /* a timed run of >= 20 ms */
    double best = 0, start = nx_now_s();
    while ((nx_now_s() - start) * 1e3 < budget_ms) {
        const double dt = dpbusd_rounds(rounds, &sink);
        const double g = (double)rounds * CHAINS / dt / 1e9;
        if (g > best) best = g;
    }
    printf("one core: %.2f G vpdpbusd/s (%.0f G int8 multiply-adds/s); 4-bit g64 weights at most "
           "%.1f GB/s per core at 1 input row, %.1f at 2, %.1f at 4\n",
           best, best * 64, best * 36, best * 18, best * 9);
    printf("vnni_rate dpbusd_g_s=%.3f q4_gbs_t1=%.2f q4_gbs_t2=%.2f q4_gbs_t4=%.2f sink=%d\n", best,
           best * 36, best * 18, best * 9, sink & 1);
    return 0;
}
