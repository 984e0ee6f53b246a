/* int8_avx2.c built again for CPUs with AVX-VNNI (Alder Lake and later, Zen 5): the avx2vnni
 * table's integer kernels, one vpdpbusd where AVX2 needs vpmaddubsw, vpmaddwd and an add. */
#define NX_I8_VNNI 1
#include "int8_avx2.c"
