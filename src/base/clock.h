/* The monotonic clock in seconds (timing of steps, requests and benchmarks). */
#ifndef NX_BASE_CLOCK_H
#define NX_BASE_CLOCK_H

#include <time.h>

static inline double nx_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
