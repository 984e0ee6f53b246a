/* The "avx512-t0" table: avx512.c with ordinary weight prefetches (prefetcht0), which Intel's
 * server cores stream faster than non-temporal ones (avx512_common.h, QPF_HINT). */
#define NX_QPF_T0 1
#include "avx512.c"
