/* The "avx512vnni-t0" table: avx512_vnni.c with ordinary weight prefetches (prefetcht0), which Intel's
 * server cores stream faster than non-temporal ones (avx512_common.h, QPF_HINT). */
#define NX_QPF_T0 1
#include "avx512_vnni.c"
