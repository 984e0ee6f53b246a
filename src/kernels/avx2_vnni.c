/* avx2_int8.c built again for CPUs with AVX-VNNI (Alder Lake and later, Zen 5): the avx2vnni
 * table's integer kernels, one vpdpbusd where AVX2 needs vpmaddubsw, vpmaddwd and an add. */
#define NX_I8_VNNI 1
#include "avx2_int8.c"
